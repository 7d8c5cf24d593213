package judge

import (
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/lanewatch/lanewatch/checks"
	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
)

// loadWindow is 4 layers loaded on stream 0x10 up front (each proven done
// at done), then a kernel per layer on stream 0x20, each after a wait on
// the load stream when sync; a final synchronisation of the compute
// stream at 1000.
func loadWindow(w *Window, sync bool, done uint64) {
	for i := uint64(0); i < 4; i++ {
		w.Transfer(&correlate.Transfer{PID: 9, TID: 9, Stream: 0x10, API: "cudaMemcpyAsync", Op: event.OpCopy, Mover: correlate.MoverCopyEngine,
			Direction: correlate.DirH2D, Bytes: 1 << 20, SubmitNs: 10 + i, CompleteNs: done})
		w.Activity(&correlate.Activity{PID: 9, TID: 9, Op: event.OpEventRecord, API: "cudaEventRecord", Stream: 0x10, CallNs: 10 + i, ReturnNs: 11 + i})
	}
	// a D2D copy and an RDMA request are not the rules' input
	w.Transfer(&correlate.Transfer{PID: 9, Stream: 0x10, Op: event.OpCopy, Mover: correlate.MoverCopyEngine, Direction: correlate.DirD2D, Bytes: 1, SubmitNs: 1, CompleteNs: 2})
	at := done + 1 // serialized: compute after the loads were proven done
	if !sync {
		at = 50 // overlapped: compute launched while the loads may run
	}
	for i := uint64(0); i < 4; i++ {
		if sync {
			w.Activity(&correlate.Activity{PID: 9, TID: 9, Op: event.OpStreamSync, API: "cudaStreamSynchronize", Stream: 0x10, CallNs: at, ReturnNs: at + 1})
			at += 2
		}
		w.Activity(&correlate.Activity{PID: 9, TID: 9, Op: event.OpStreamWaitEvent, API: "cudaStreamWaitEvent", Stream: 0x20, CallNs: at, ReturnNs: at,
			RecordNs: 10 + i, RecordStream: 0x10}) // the layer's event, consumed by compute
		w.Activity(&correlate.Activity{PID: 9, TID: 9, Op: event.OpLaunch, API: "cudaLaunchKernel", Stream: 0x20, CallNs: at, ReturnNs: at + 1})
		at += 2
	}
	w.Activity(&correlate.Activity{PID: 9, TID: 9, Op: event.OpStreamSync, API: "cudaStreamSynchronize", Stream: 0x20, CallNs: at, ReturnNs: 1000})
}

// The checklist row of item 3: WARN with serialized-load, PASS with the
// ratio when loads could overlap compute, SKIP with the reason when
// launches are not probed or nothing was loaded; Rotate keeps the
// probing and hands the data over.
func TestComputeCheck(t *testing.T) {
	for _, c := range []struct {
		name    string
		kernels bool
		sync    bool
		done    uint64
		status  checks.Status
		detail  string
	}{
		{"serialized", true, true, 100, checks.Warn, "compute could overlap at most 0% of its copy time"},
		{"overlapped", true, false, 1000, checks.Pass, "compute could overlap at most"},
		{"not probed", false, false, 1000, checks.Skip, "kernel launches are not probed"},
		// the per-layer waits still make host-sync-in-loop: it needs no launch
		{"not probed, synced", false, true, 100, checks.Warn, "kernel launches are not probed"},
	} {
		w := NewWindow(c.kernels)
		loadWindow(w, c.sync, c.done)
		old := w.Rotate()
		if pids := computePIDs(w); len(pids) != 0 {
			t.Fatalf("%s: the new window holds %v", c.name, pids)
		}
		if pids := computePIDs(old); len(pids) != 1 || pids[0] != 9 {
			t.Fatalf("%s: pids %v", c.name, pids)
		}
		chk := computeCheck("pid 9", Compute(old, 9))
		if chk.Status != c.status || !strings.Contains(chk.Detail, c.detail) {
			t.Errorf("%s: %s %q", c.name, chk.Status, chk.Detail)
		}
		want := "serialized-load"
		if !c.kernels {
			want = "host-sync-in-loop"
		}
		if c.status == checks.Warn && (len(chk.Findings) != 1 || chk.Findings[0].Rule != want) {
			t.Errorf("%s: findings %+v", c.name, chk.Findings)
		}
		t.Logf("%s: %s %s", c.name, chk.Status, chk.Detail)
	}
	if chk := computeCheck("pid 1", Compute(NewWindow(false), 1)); chk.Status != checks.Skip || chk.Detail != "no H2D copy in the window" {
		t.Errorf("empty: %s %q", chk.Status, chk.Detail)
	}
}

// A thread's launches on a stream with no wait or record of its process
// between them are kept as one run: 1500 launches around one
// synchronisation are two items, counted as 1500, and a KV-transfer
// kernel's launch is no compute.
func TestComputeLaunchRuns(t *testing.T) {
	w := NewWindow(true)
	launch := func(at uint64) {
		w.Activity(&correlate.Activity{PID: 9, TID: 9, Op: event.OpLaunch, Stream: 0x20, CallNs: at, ReturnNs: at + 1})
	}
	for i := uint64(0); i < 1000; i++ {
		launch(10 + 2*i)
	}
	w.Activity(&correlate.Activity{PID: 9, TID: 9, Op: event.OpStreamSync, Stream: 0x20, CallNs: 3000, ReturnNs: 3100})
	for i := uint64(0); i < 500; i++ {
		launch(4000 + 2*i)
	}
	w.Activity(&correlate.Activity{PID: 9, TID: 9, Op: event.OpLaunch, KV: true, Stream: 0x10, CallNs: 5000, ReturnNs: 5001})
	r := Compute(w, 9)
	c := factsOf[*computeFacts](w, computeRule{})
	if r.Launches != 1500 || len(c.procs[9].acts) != 3 || c.kept != 3 {
		t.Fatalf("launches %d, kept %d items: %+v", r.Launches, c.kept, c.procs[9].acts)
	}
	first := c.procs[9].acts[0]
	if first.CallNs != 10 || first.ReturnNs != 2009 || first.Launches != 1000 {
		t.Errorf("first run %+v", first)
	}
	if r2 := Compute(w, 9); r2.Launches != 1500 {
		t.Errorf("judged again: %d launches", r2.Launches)
	}
}

// A window's cost per compute launch (a run extended: no allocation).
func BenchmarkWindowLaunch(b *testing.B) {
	w := NewWindow(true)
	a := correlate.Activity{PID: 9, TID: 9, Op: event.OpLaunch, Stream: 0x20, GPU: "0000:3b:00.0"}
	b.ReportAllocs()
	for i := range b.N {
		a.CallNs, a.ReturnNs = uint64(i)*10, uint64(i)*10+1
		w.Activity(&a)
	}
}

// Graph launches are compute on their stream, kept in runs of their own
// beside kernel launches on the same stream, and the row says they were
// in the window: with no H2D copy of its own the decode loop under graphs
// is a SKIP that names them (the copies inside a graph are not seen).
func TestComputeGraphLaunches(t *testing.T) {
	w := NewWindow(true)
	for i := uint64(0); i < 8; i++ {
		at := 10 + 20*i
		w.Activity(&correlate.Activity{PID: 9, TID: 9, Op: event.OpGraphLaunch, API: "cudaGraphLaunch", Stream: 0x20, CallNs: at, ReturnNs: at + 1})
		w.Activity(&correlate.Activity{PID: 9, TID: 9, Op: event.OpLaunch, API: "cudaLaunchKernel", Stream: 0x20, CallNs: at + 2, ReturnNs: at + 3})
		w.Transfer(&correlate.Transfer{PID: 9, TID: 9, Stream: 0x20, API: "cudaMemcpyAsync", Op: event.OpCopy, Mover: correlate.MoverCopyEngine,
			Direction: correlate.DirD2H, Bytes: 128, SubmitNs: at + 4, CompleteNs: at + 10})
		w.Activity(&correlate.Activity{PID: 9, TID: 9, Op: event.OpStreamSync, API: "cudaStreamSynchronize", Stream: 0x20, CallNs: at + 5, ReturnNs: at + 10})
	}
	r := Compute(w, 9)
	if r.Launches != 16 || r.GraphLaunches != 8 || len(r.Findings) != 0 || r.Unknown != "" {
		t.Errorf("report %+v", r)
	}
	chk := computeCheck("pid 9", r)
	if chk.Status != checks.Skip || !strings.Contains(chk.Detail, "CUDA graphs were launched, the copies inside them are not seen") {
		t.Errorf("%s %q", chk.Status, chk.Detail)
	}
	loaded := NewWindow(true)
	loadWindow(loaded, false, 1000)
	loaded.Activity(&correlate.Activity{PID: 9, TID: 9, Op: event.OpGraphLaunch, API: "cudaGraphLaunch", Stream: 0x20, CallNs: 60, ReturnNs: 61})
	chk = computeCheck("pid 9", Compute(loaded, 9))
	if chk.Status != checks.Pass || !strings.Contains(chk.Detail, "CUDA graph launches: 1, each counted as compute on its stream") {
		t.Errorf("with loads: %s %q", chk.Status, chk.Detail)
	}
}

// computePIDs are the processes the compute-overlap rule gathered facts of.
func computePIDs(w *Window) []uint32 {
	return slices.Sorted(maps.Keys(factsOf[*computeFacts](w, computeRule{}).procs))
}
