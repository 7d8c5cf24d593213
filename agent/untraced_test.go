package agent

import (
	"io"
	"log/slog"
	"os"
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
