package agent

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/internal/testenv"
	"github.com/lanewatch/lanewatch/probes"
)

// A real process that dlopens an object importing mlx5dv_init_obj is
// named by the scan that reads its maps, with the object and the reason,
// through the same verdict the attach reads (one read per file); once it
// exits, the next full scan forgets it.
func TestScanNamesUntracedProcess(t *testing.T) {
	testenv.RequireRoot(t)
	lib := testenv.DirectVerbsLib(t, t.TempDir())
	pid, stop := testenv.LoadingProcess(t, lib)

	a, err := New(Config{Sink: correlate.SinkFunc(func(*correlate.Transfer) {}), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer a.close()

	gen := a.beginFullScan()
	if _, _, _, err := a.scanProcess(pid); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := a.scanProcess(os.Getpid()); err != nil { // maps none
		t.Fatal(err)
	}
	a.endFullScan(gen)
	got := a.Untraced()
	if len(got) != 1 || got[0].PID != pid || len(got[0].Objects) != 1 {
		t.Fatalf("untraced %+v, want pid %d with %s", got, pid, lib)
	}
	u := got[0].Objects[0]
	if u.Path != lib || u.Kind != probes.UntracedMLX5DV || u.Sign != "imports mlx5dv_init_obj" {
		t.Errorf("object %+v", u)
	}
	if text := got[0].Text(); !strings.Contains(text, "pid ") || !strings.Contains(text, lib+" (imports mlx5dv_init_obj): mlx5 direct verbs") {
		t.Errorf("text %q", text)
	}

	stop()
	gen = a.beginFullScan()
	a.scanProcess(pid) // gone: no such process
	a.endFullScan(gen)
	if got := a.Untraced(); len(got) != 0 {
		t.Errorf("after it exited: %+v", got)
	}
}

// A process that maps libfabric and was running when the agent started
// has built its endpoints before the agent could see them: it is named
// (libfabric-before-attach) until the agent sees it build one; a process
// started after the agent, mapping the same library, is not.
func TestScanNamesFabricBeforeAttach(t *testing.T) {
	testenv.RequireRoot(t)
	libs, _ := filepath.Glob("/usr/lib/*/libfabric.so.1")
	if len(libs) != 1 {
		if os.Getenv("CI") == "true" {
			t.Fatalf("libfabric.so.1: %v (libfabric1; .ci/run installs libfabric-bin)", libs)
		}
		t.Skip("no libfabric.so.1")
	}
	lib, err := filepath.EvalSymlinks(libs[0])
	if err != nil {
		t.Fatal(err)
	}
	early, stopEarly := testenv.LoadingProcess(t, lib)
	defer stopEarly()
	late, stopLate := testenv.LoadingProcess(t, lib)
	defer stopLate()

	a, err := New(Config{Sink: correlate.SinkFunc(func(*correlate.Transfer) {}), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer a.close()
	a.preexisting[early] = true // as the initial scan found it; late came after
	scan := func() []UntracedProcess {
		gen := a.beginFullScan()
		for _, pid := range []int{early, late} {
			if _, _, _, err := a.scanProcess(pid); err != nil {
				t.Fatal(err)
			}
		}
		a.endFullScan(gen)
		return a.Untraced()
	}
	got := scan()
	if len(got) != 1 || got[0].PID != early || len(got[0].Objects) != 1 {
		t.Fatalf("untraced %+v, want pid %d with %s", got, early, lib)
	}
	if u := got[0].Objects[0]; u.Kind != probes.UntracedFabricBeforeAttach || u.Path != lib || !u.Certain() ||
		!strings.Contains(u.String(), "libfabric endpoints built before the agent attached") {
		t.Errorf("object %+v: %s", u, u)
	}
	// It builds an endpoint the agent sees: traced from there.
	a.fabric.mu.Lock()
	a.fabric.built[early] = true
	a.fabric.mu.Unlock()
	if got := scan(); len(got) != 0 {
		t.Errorf("after an endpoint was seen: %+v", got)
	}
}
