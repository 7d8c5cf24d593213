package correlate

import (
	"testing"

	"github.com/lanewatch/lanewatch/event"
)

// A copy's completion is proven close to it (Transfer.CompleteNear) only
// when the wait is the next call its thread made, or follows only an event
// record on the copy's stream: by call order, never by time. Runtime calls
// and their nested driver calls are one call.
func TestCompleteNear(t *testing.T) {
	const s1, s2, ev = 0x1000, 0x2000, 0xe1
	h2d := func(ts, bytes uint64) *event.Call {
		return cp(t, "cudaMemcpyAsync", 7, ts, dev, heap, bytes, event.CopyHostToDevice, s1)
	}
	launch := func(tid uint32, ts uint64) *event.Call {
		c := mk(t, "cudaLaunchKernel", tid, ts, ts+1)
		c.Stream = s1
		return c
	}
	for _, tc := range []struct {
		name  string
		calls []*event.Call
		near  map[uint64]bool // by bytes
	}{
		{"sync right after the copy", []*event.Call{h2d(100, 1), syncCall(t, "cudaStreamSynchronize", 7, 200, 300, s1, 0)},
			map[uint64]bool{1: true}},
		{"only the last of queued copies", []*event.Call{h2d(100, 1), h2d(110, 2), syncCall(t, "cudaStreamSynchronize", 7, 200, 300, s1, 0)},
			map[uint64]bool{1: false, 2: true}},
		{"a launch between: the wait includes the kernel", []*event.Call{h2d(100, 1), launch(7, 150), syncCall(t, "cudaStreamSynchronize", 7, 200, 300, s1, 0)},
			map[uint64]bool{1: false}},
		{"another thread's launch is not between", []*event.Call{h2d(100, 1), launch(8, 150), syncCall(t, "cudaStreamSynchronize", 7, 200, 300, s1, 0)},
			map[uint64]bool{1: true}},
		{"an event record on its stream, then its sync", []*event.Call{h2d(100, 1), syncCall(t, "cudaEventRecord", 7, 150, 0, s1, ev),
			syncCall(t, "cudaEventSynchronize", 7, 200, 300, 0, ev)}, map[uint64]bool{1: true}},
		{"an event record on another stream between", []*event.Call{h2d(100, 1), syncCall(t, "cudaEventRecord", 7, 150, 0, s2, ev),
			syncCall(t, "cudaStreamSynchronize", 7, 200, 300, s1, 0)}, map[uint64]bool{1: false}},
		{"another thread's wait", []*event.Call{h2d(100, 1), syncCall(t, "cudaStreamSynchronize", 8, 200, 300, s1, 0)},
			map[uint64]bool{1: false}},
		{"runtime and driver halves of both calls", []*event.Call{
			cp(t, "cuMemcpyHtoDAsync_v2", 7, 101, dev, heap, 1, 0, s1), h2d(100, 1),
			syncCall(t, "cuStreamSynchronize", 7, 210, 290, s1, 0), syncCall(t, "cudaStreamSynchronize", 7, 200, 300, s1, 0)},
			map[uint64]bool{1: true}},
	} {
		e, s := newTest(t, Config{})
		e.ObservedFromStart(testPID)
		for _, c := range tc.calls {
			e.Handle(c)
		}
		e.Flush()
		got := map[uint64]bool{}
		for _, tr := range s.got {
			if tr.CompleteNs == 0 {
				t.Errorf("%s: %d bytes not completed", tc.name, tr.Bytes)
			}
			got[tr.Bytes] = tr.CompleteNear
		}
		for b, want := range tc.near {
			if g, ok := got[b]; !ok || g != want {
				t.Errorf("%s: copy of %d bytes near %v (reported %v), want %v", tc.name, b, g, ok, want)
			}
		}
	}
}
