package correlate

import (
	"cmp"
	"slices"
	"testing"

	"github.com/lanewatch/lanewatch/event"
)

// Events lost by a process, said in ring order by the event after them
// (docs/design.md, "Ring buffer, wakeups, drops"): from that event on,
// memory whose registration or free may have been lost is unknown with
// reason events_lost, until a registration seen later proves it again;
// device memory stays device; another process is untouched; an exec's or
// an exit's flag is the old image's.
func TestLossesInRingOrder(t *testing.T) {
	e, s := newTest(t, Config{})
	const other = testPID + 1
	e.ObservedFromStart(testPID)
	e.ObservedFromStart(other)
	pool2 := uint64(pool + 2*poolLen)
	e.Handle(mem(t, "cuMemHostRegister_v2", 1, 10, 20, pool, poolLen))
	e.Handle(mem(t, "cuMemAlloc_v2", 1, 21, 22, dev, devLen))
	h2d := func(ts, src uint64, lost bool) {
		c := cp(t, "cuMemcpyHtoD_v2", 1, ts, dev, src, 4096, 0, 0)
		c.LostBefore = lost
		e.Handle(c)
	}
	h2d(30, pool, false) // pinned
	h2d(40, heap, false) // pageable
	ex := cp(t, "cuMemcpyHtoD_v2", 1, 45, dev, heap, 4096, 0, 0)
	ex.PID = other
	e.Handle(ex)        // another process: pageable
	h2d(50, pool, true) // the first event after a loss
	h2d(60, heap, false)
	e.Handle(mem(t, "cuMemHostRegister_v2", 1, 70, 80, pool2, poolLen)) // seen after the loss
	h2d(90, pool2, false)
	d2d := cp(t, "cuMemcpyDtoD_v2", 1, 95, dev+64, dev, 4096, 0, 0)
	e.Handle(d2d)
	ex = cp(t, "cuMemcpyHtoD_v2", 1, 99, dev, heap, 4096, 0, 0)
	ex.PID = other
	e.Handle(ex) // still pageable: the loss was not its
	e.Flush()

	if got := len(e.Pinned(testPID)); got != 2 {
		t.Errorf("pinned ranges for the host checks: %d, want the pool registered before the loss and the one after", got)
	}
	e.Handle(mem(t, "cuMemHostUnregister", 1, 100, 101, pool, 0))
	if got := e.Pinned(testPID); len(got) != 1 || got[0].Start != pool2 {
		t.Errorf("after unregistering the stale pool: %v", got)
	}
	if st := e.Stats(); st.UnmatchedFrees != 0 || st.LostBefore != 1 {
		t.Errorf("stats %+v: want no unmatched free, one loss", st)
	}

	want := []struct {
		pid    uint32
		src    uint64
		host   event.MemKind
		reason string
	}{
		{testPID, pool, event.MemPinned, ""},
		{testPID, heap, event.MemPageable, ""},
		{other, heap, event.MemPageable, ""},
		{testPID, pool, event.MemUnknown, ReasonEventsLost}, // its unregistration may have been lost
		{testPID, heap, event.MemUnknown, ReasonEventsLost}, // its registration may have been lost
		{testPID, pool2, event.MemPinned, ""},
		{testPID, dev, "", ""},
		{other, heap, event.MemPageable, ""},
	}
	if len(s.got) != len(want) {
		t.Fatalf("%d transfers, want %d", len(s.got), len(want))
	}
	slices.SortFunc(s.got, func(a, b Transfer) int { return cmp.Compare(a.SubmitNs, b.SubmitNs) })
	for i, w := range want {
		g := s.got[i]
		if g.PID != w.pid || g.Src.Addr != w.src || g.HostMem != w.host || g.HostMemReason != w.reason || g.Src.Reason != w.reason {
			t.Errorf("transfer %d: pid %d src %#x host %q reason %q/%q, want pid %d src %#x host %q reason %q",
				i, g.PID, g.Src.Addr, g.HostMem, g.HostMemReason, g.Src.Reason, w.pid, w.src, w.host, w.reason)
		}
	}
	if g := s.got[6]; g.Src.Mem != event.MemDevice || g.Dst.Mem != event.MemDevice {
		t.Errorf("device memory after the loss: %+v", g)
	}

	// An exec's loss flag is the old image's; LostAny marks every process.
	e.Handle(&event.Call{Kind: event.KindExec, PID: other, Time: 200, LostBefore: true})
	e.ObservedFromStart(other)
	ex = cp(t, "cuMemcpyHtoD_v2", 1, 210, dev, heap, 4096, 0, 0)
	ex.PID = other
	e.Handle(ex)
	ex = cp(t, "cuMemcpyHtoD_v2", 1, 220, dev, heap, 4096, 0, 0)
	ex.PID, ex.LostAny = other, true
	e.Handle(ex)
	e.Flush()
	if g := s.got[len(s.got)-2]; g.HostMem != event.MemPageable {
		t.Errorf("after an exec flagged with the old image's losses: %q, want pageable", g.HostMem)
	}
	if g := s.got[len(s.got)-1]; g.HostMem != event.MemUnknown || g.HostMemReason != ReasonEventsLost {
		t.Errorf("after LostAny: %q %q, want unknown events_lost", g.HostMem, g.HostMemReason)
	}
}

// Every unknown host side says why.
func TestUnknownReasons(t *testing.T) {
	for _, tc := range []struct {
		name   string
		setup  func(e *Engine)
		src    uint64
		reason string
	}{
		{"late attach", func(e *Engine) { e.ObservedSince(testPID, []Range{{heap, heap + mib}}) }, heap, ReasonLateAttach},
		{"never told", func(e *Engine) {}, heap, ReasonNotObserved},
		{"range cap", func(e *Engine) {
			e.ObservedFromStart(testPID)
			e.Handle(mem(t, "cuMemHostRegister_v2", 1, 1, 2, pool, 4096))
			e.Handle(mem(t, "cuMemHostRegister_v2", 1, 3, 4, pool+8192, 4096)) // past MaxRanges 1
		}, heap, ReasonRangeCap},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, s := newTest(t, Config{MaxRanges: 1})
			tc.setup(e)
			e.Handle(cp(t, "cuMemcpyHtoD_v2", 1, 10, dev, tc.src, 4096, 0, 0))
			e.Flush()
			if g := s.got[len(s.got)-1]; g.HostMem != event.MemUnknown || g.HostMemReason != tc.reason {
				t.Errorf("host %q reason %q, want unknown %q", g.HostMem, g.HostMemReason, tc.reason)
			}
		})
	}
}
