package agent

import (
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/internal/testenv"
	"github.com/lanewatch/lanewatch/probes"
)

// One line per cause per interval, the next one saying how often the cause
// repeated meanwhile; causes are bounded.
func TestLimitedLog(t *testing.T) {
	var buf bytes.Buffer
	l := newLimitedLog(slog.New(slog.NewTextHandler(&buf, nil)), time.Minute)
	now := time.Unix(1000, 0)
	l.now = func() time.Time { return now }
	logged := func(cause string) bool { return l.Log(slog.LevelWarn, cause, "attach failed", "path", cause) }

	if !logged("a") || logged("a") || logged("a") || !logged("b") {
		t.Fatalf("within the interval:\n%s", buf.String())
	}
	now = now.Add(time.Minute)
	if !logged("a") {
		t.Fatal("a cause past its interval was held back")
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 3 || !strings.Contains(lines[2], "path=a repeated=2 over=1m0s") || strings.Contains(lines[0], "repeated") {
		t.Errorf("lines:\n%s", buf.String())
	}

	for i := range maxLogCauses + 10 {
		now = now.Add(time.Millisecond)
		l.Log(slog.LevelDebug, strings.Repeat("x", i%50)+string(rune('a'+i%26))+time.Duration(i).String(), "m")
	}
	if n := len(l.causes); n > maxLogCauses {
		t.Errorf("%d causes remembered, want at most %d", n, maxLogCauses)
	}
}

// A library to probe whose file could not be opened is listed unprobed and
// tried again at its next sighting; a full scan that no longer sees it
// forgets it; a file named on the command line is never listed (no process
// maps it); a file not named like CUDA that could not be opened leaves no
// trace (the next sighting reads it).
func TestUnprobedRetryAndForget(t *testing.T) {
	testenv.RequireRoot(t)
	ref := testenv.RefDir(t)
	a, err := New(Config{Sink: correlate.SinkFunc(func(*correlate.Transfer) {}), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer a.close()
	driver := filepath.Join(ref, "lib/libcuda.so.1")
	mf, err := probes.OpenFile(driver)
	if err != nil {
		t.Fatal(err)
	}
	defer mf.Close()
	id := mf.ID
	gone := func() (*probes.MappedFile, error) {
		return nil, fmt.Errorf("open /proc/42/map_files/1-2: %w", fs.ErrNotExist)
	}
	opens := 0
	counting := func() (*probes.MappedFile, error) { opens++; return gone() }

	gen := a.beginFullScan()
	a.inspectFile(probes.FileID{Inode: 1}, "/opt/x/libfoo.so", 42, counting)
	a.inspectFile(id, "/opt/x/libcuda.so.1", 42, counting)
	a.inspectFile(id, "/opt/x/libcuda.so.1", 43, counting) // the next process: tried again at once
	a.inspectFile(id, driver, 0, gone)                     // as --lib: counted, not listed anew
	a.endFullScan(gen)
	if opens != 3 {
		t.Errorf("%d opens, want 3 (libfoo, then libcuda at each sighting)", opens)
	}
	u := a.Unprobed()
	if len(u) != 1 || u[0].Path != "/opt/x/libcuda.so.1" || u[0].PID != 43 || u[0].Failures != 3 || !strings.Contains(u[0].Reason, "map_files") {
		t.Errorf("unprobed: %+v", u)
	}
	if f := a.AttachFailures(); f["libcuda.so.1"] != 3 || len(f) != 1 {
		t.Errorf("attach failures %v, want libcuda.so.1: 3", f)
	}
	if _, ok := a.files[probes.FileID{Inode: 1}]; ok {
		t.Error("a file not named like CUDA that could not be opened was remembered")
	}

	// A full scan that does not see it forgets it; seen again, it is probed.
	a.endFullScan(a.beginFullScan())
	if u := a.Unprobed(); len(u) != 0 {
		t.Errorf("after a full scan without it: %+v", u)
	}
	if v := a.inspectFile(id, driver, 44, func() (*probes.MappedFile, error) { return probes.OpenFile(driver) }); !v.probed {
		t.Errorf("not probed once it could be opened: %+v", v)
	}
}

// Which probed libraries a full scan may release: unseen by it and for the
// grace; never a --lib file, the dynamic linker, a file still awaiting its
// verdict, or an overlay file while another mount of the same layer file is
// mapped (they share its probes).
func TestReleaseCandidates(t *testing.T) {
	now := time.Now()
	probed := fileVerdict{probed: true}
	layer := probes.Fingerprint{Inode: 7, Size: 100}
	overlay := fileVerdict{probed: true, overlay: true, fp: layer}
	other := fileVerdict{probed: true, overlay: true, fp: probes.Fingerprint{Inode: 8}}
	old, recent := now.Add(-time.Minute), now.Add(-time.Second)
	files := map[probes.FileID]*fileState{
		{Inode: 1}:  {v: probed, final: true, seenGen: 4, lastSeen: old},                          // released
		{Inode: 2}:  {v: probed, final: true, seenGen: 5, lastSeen: old},                          // seen by this scan
		{Inode: 3}:  {v: probed, final: true, seenGen: 4, lastSeen: recent},                       // within the grace
		{Inode: 4}:  {v: probed, final: true, seenGen: 4, lastSeen: old, pinned: true},            // --lib
		{Inode: 5}:  {v: fileVerdict{probed: true, linkerOnly: true}, final: true, lastSeen: old}, // ld.so
		{Inode: 6}:  {v: probed, seenGen: 4, lastSeen: old},                                       // no verdict yet
		{Inode: 7}:  {v: fileVerdict{}, final: true, seenGen: 4, lastSeen: old},                   // nothing probed
		{Inode: 8}:  {v: overlay, final: true, seenGen: 4, lastSeen: old},                         // a sibling mount is mapped
		{Inode: 9}:  {v: overlay, final: true, seenGen: 5, lastSeen: now},
		{Inode: 10}: {v: other, final: true, seenGen: 4, lastSeen: old}, // every mount unmapped: released
		{Inode: 11}: {v: other, final: true, seenGen: 3, lastSeen: old},
	}
	a := &Agent{cfg: Config{ReleaseAfter: 30 * time.Second}, files: files}
	got := map[uint64]bool{}
	for _, id := range a.releaseCandidates(5, now) {
		got[id.Inode] = true
	}
	want := map[uint64]bool{1: true, 10: true, 11: true}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("released %v, want %v", got, want)
	}
}

// Releasing one mount of an overlay layer file forgets every mount of it
// and its shared verdict: seen again, each is attached afresh.
func TestReleaseOverlayGroup(t *testing.T) {
	layer := probes.Fingerprint{Inode: 7, Size: 100}
	v := fileVerdict{probed: true, overlay: true, fp: layer}
	a := &Agent{
		probes:   &probes.Probes{},
		files:    map[probes.FileID]*fileState{{Inode: 1}: {v: v, final: true}, {Inode: 2}: {v: v, final: true}, {Inode: 3}: {v: fileVerdict{probed: true}, final: true}},
		sameFile: map[probes.Fingerprint]fileVerdict{layer: v},
		limited:  newLimitedLog(slog.New(slog.NewTextHandler(io.Discard, nil)), time.Minute),
		fabric:   newFabricState(),
	}
	a.release(probes.FileID{Inode: 2})
	if len(a.files) != 1 || a.files[probes.FileID{Inode: 3}] == nil || len(a.sameFile) != 0 {
		t.Errorf("after releasing one mount: files %v, shared verdicts %v; want only inode 3, none", a.files, a.sameFile)
	}
}
