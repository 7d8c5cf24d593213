package correlate

import (
	"fmt"
	"testing"

	"github.com/lanewatch/lanewatch/event"
)

const (
	gCompute = 0x30 // the capturing stream
	gSide    = 0x40 // a stream that never captures
	gFork    = 0x50 // joins the capture by waiting on an event recorded in it
	gExec    = 0x5555_a000
)

type graphWorld struct {
	t    *testing.T
	e    *Engine
	s    *collect
	acts activities
	ts   uint64
}

func newGraphWorld(t *testing.T) *graphWorld {
	w := &graphWorld{t: t, s: &collect{t: t}}
	w.e = NewEngine(Config{Sink: w.s, Activity: &w.acts})
	w.e.ObservedFromStart(testPID)
	return w
}

// do feeds a call of sym on stream (event ev), returning ret.
func (w *graphWorld) do(sym string, stream, ev, ret uint64) {
	w.ts += 10
	c := syncCall(w.t, sym, 1, w.ts, w.ts+5, stream, ev)
	c.Ret = ret
	if c.Op == event.OpGraphLaunch || c.Op == event.OpLaunch {
		c.Handle = gExec
	}
	w.e.Handle(c)
}

func (w *graphWorld) copy(sym string, stream, bytes uint64) {
	w.ts += 10
	c := cp(w.t, sym, 1, w.ts, 0x7000_0000+w.ts, 0x1000_0000+w.ts, bytes, 0, stream)
	c.ReturnTime = w.ts + 2
	w.e.Handle(c)
}

func (w *graphWorld) transfers() []Transfer {
	w.e.Flush()
	got := w.s.got
	w.s.got = nil
	return got
}

func (w *graphWorld) ops() map[event.Op]int {
	n := map[event.Op]int{}
	for _, a := range w.acts {
		n[a.Op]++
	}
	return n
}

// A decode step captured into a graph (vLLM, SGLang): the copies issued
// on the capturing stream, and on the stream that joined the capture, are
// recorded into the graph, not run: no transfer, counted. Its launch,
// record and wait are no activities. The copies of a stream outside the
// capture are transfers, and after the capture every stream's are again.
// A graph launch is one activity on its stream.
func TestCapturedCopiesAreNotTransfers(t *testing.T) {
	w := newGraphWorld(t)
	w.do("cuStreamBeginCapture_v2", gCompute, 0, 0)
	w.copy("cuMemcpyHtoDAsync_v2", gCompute, 512)
	w.do("cuLaunchKernel", gCompute, 0, 0)
	w.do("cuEventRecord", gCompute, 0xe1, 0)
	w.do("cuStreamWaitEvent", gFork, 0xe1, 0) // the fork: gFork joins
	w.copy("cuMemcpyHtoDAsync_v2", gFork, 4096)
	w.copy("cuMemcpyDtoHAsync_v2", gCompute, 128)
	w.copy("cuMemcpyHtoDAsync_v2", gSide, 1<<20) // not in the capture
	w.do("cuStreamEndCapture", gCompute, 0, 0)
	if got := w.transfers(); len(got) != 1 || got[0].Stream != gSide || got[0].Bytes != 1<<20 {
		t.Fatalf("during the capture: %+v, want only the side stream's copy", got)
	}
	if n := w.ops(); len(n) != 0 {
		t.Errorf("captured calls made activities: %v", n)
	}

	for range 3 {
		w.do("cuGraphLaunch", gCompute, 0, 0)
		w.copy("cuMemcpyDtoHAsync_v2", gCompute, 128) // the tokens, outside the graph
		w.do("cuStreamSynchronize", gCompute, 0, 0)
	}
	w.copy("cuMemcpyHtoDAsync_v2", gFork, 4096) // left the capture with its origin
	got := w.transfers()
	if len(got) != 4 {
		t.Fatalf("after the capture: %d transfers, want 4: %+v", len(got), got)
	}
	for _, tr := range got[:3] {
		if tr.Stream != gCompute || tr.Direction != DirD2H || tr.CompleteNs <= tr.SubmitNs {
			t.Errorf("token read-back: %+v", tr)
		}
	}
	if n := w.ops(); n[event.OpGraphLaunch] != 3 || n[event.OpStreamSync] != 3 || len(n) != 2 {
		t.Errorf("activities %v, want 3 graph launches and 3 syncs", n)
	}
	for _, a := range w.acts {
		if a.Op == event.OpGraphLaunch && (a.Stream != gCompute || a.API != "cuGraphLaunch" || !a.IsCompute()) {
			t.Errorf("graph launch activity %+v", a)
		}
	}
	want := GraphStats{Launches: 3, Captures: 1, CapturedCopies: 3, CapturedBytes: 512 + 4096 + 128, CapturedOther: 3}
	if g := w.e.Stats().Graphs; g != want {
		t.Errorf("stats %+v, want %+v", g, want)
	}
}

// A capture invalidated by a host wait on its stream: the wait fails
// (reported), the end fails and still ends the capture; a copy that
// failed inside a capture is reported as any failed call.
func TestCaptureInvalidated(t *testing.T) {
	w := newGraphWorld(t)
	w.do("cuStreamBeginCapture_v2_ptsz", 0, 0, 0) // the thread's per-thread stream
	w.copy("cuMemcpyHtoDAsync_v2_ptsz", 0, 256)
	w.do("cuStreamSynchronize_ptsz", 0, 0, 900)
	w.copy("cuMemcpyHtoDAsync_v2", gSide, 64)
	w.do("cuStreamEndCapture_ptsz", 0, 0, 901)
	w.copy("cuMemcpyHtoDAsync_v2_ptsz", 0, 256) // no capture any more
	got := w.transfers()
	if len(got) != 4 {
		t.Fatalf("%d records, want 4: %+v", len(got), got)
	}
	seen := map[string]bool{}
	for _, r := range got {
		seen[fmt.Sprintf("%s %d %v", r.API, r.Bytes, r.Error != nil)] = true
	}
	for _, want := range []string{"cuStreamSynchronize_ptsz 0 true", "cuStreamEndCapture_ptsz 0 true", "cuMemcpyHtoDAsync_v2 64 false",
		"cuMemcpyHtoDAsync_v2_ptsz 256 false"} {
		if !seen[want] {
			t.Errorf("no record %q in %v", want, seen)
		}
	}
	if g := w.e.Stats().Graphs; g.CapturedCopies != 1 || g.Captures != 1 {
		t.Errorf("stats %+v", g)
	}

	// a failed copy in a capture, and a failed graph launch: reported
	w.do("cuStreamBeginCapture", gCompute, 0, 0)
	w.ts += 10
	bad := cp(t, "cuMemcpyHtoDAsync_v2", 1, w.ts, 0x10, 0x1000, 64, 0, gCompute)
	bad.Ret = 1
	w.e.Handle(bad)
	w.do("cuStreamEndCapture", gCompute, 0, 0)
	w.do("cuGraphLaunch", gCompute, 0, 400)
	got = w.transfers()
	if len(got) != 2 || got[0].Error == nil || got[0].Bytes != 64 || got[1].Error == nil || got[1].API != "cuGraphLaunch" {
		t.Errorf("failed calls: %+v", got)
	}
	if n := w.ops(); n[event.OpGraphLaunch] != 0 {
		t.Errorf("a failed graph launch made an activity: %v", n)
	}
}

// Captures past maxCaptures are not tracked: their copies are taken as
// run (transfers), and counted.
func TestCaptureCap(t *testing.T) {
	w := newGraphWorld(t)
	for i := range maxCaptures + 1 {
		w.do("cuStreamBeginCapture_v2", 0x1000+uint64(i), 0, 0)
	}
	w.copy("cuMemcpyHtoDAsync_v2", 0x1000+maxCaptures, 64)
	w.copy("cuMemcpyHtoDAsync_v2", 0x1000, 64)
	if got := w.transfers(); len(got) != 1 || got[0].Stream != 0x1000+maxCaptures {
		t.Errorf("records %+v", got)
	}
	if g := w.e.Stats().Graphs; g.CapHits != 1 || g.Captures != maxCaptures || g.CapturedCopies != 1 {
		t.Errorf("stats %+v", g)
	}
}

// A graph launch is compute on its stream: HiCache's layer-wise load with
// each layer's compute a graph launch is judged as with kernel launches,
// and the report says graph launches were in the window.
func TestComputeOverlapGraphLaunches(t *testing.T) {
	for _, shape := range []string{"", "sync", "item"} {
		kernels := ComputeOverlap(hicacheWindow(shape))
		in := hicacheWindow(shape)
		for i := range in.Acts {
			if in.Acts[i].Op == event.OpLaunch {
				in.Acts[i].Op, in.Acts[i].API = event.OpGraphLaunch, "cudaGraphLaunch"
			}
		}
		graphs := ComputeOverlap(in)
		if rules(graphs) != rules(kernels) || graphs.Launches != coLayers || graphs.GraphLaunches != coLayers ||
			kernels.GraphLaunches != 0 || len(graphs.Streams) != 1 || graphs.Streams[0] != kernels.Streams[0] {
			t.Errorf("%q: graphs %+v, kernels %+v", shape, graphs, kernels)
		}
	}
	// The decode loop under graphs: its copies inside the graph unseen, a
	// small D2H and a sync per step: compute known, nothing to judge.
	in := ComputeInput{PID: 7, KernelsProbed: true, End: 1000 * us}
	for i := uint64(0); i < 16; i++ {
		at := 10 + i*50
		in.Acts = append(in.Acts, Activity{PID: 7, TID: 7, Op: event.OpGraphLaunch, API: "cudaGraphLaunch", Stream: coCompute,
			GPU: coGPU, CallNs: at * us, ReturnNs: (at + 1) * us})
		in.Copies = append(in.Copies, CopySpan{TID: 7, Stream: coCompute, GPU: coGPU, API: "cudaMemcpyAsync", Direction: DirD2H,
			Bytes: 128, SubmitNs: (at + 2) * us, Complete: (at + 40) * us, CallNs: us / 2})
		in.Acts = append(in.Acts, Activity{PID: 7, TID: 7, Op: event.OpStreamSync, API: "cudaStreamSynchronize", Stream: coCompute,
			GPU: coGPU, CallNs: (at + 3) * us, ReturnNs: (at + 40) * us})
	}
	r := ComputeOverlap(in)
	if r.Unknown != "" || len(r.Findings) != 0 || r.GraphLaunches != 16 || r.Launches != 16 || len(r.Streams) != 0 {
		t.Errorf("decode loop under graphs: %+v", r)
	}
}
