package correlate

import (
	"testing"
	"time"

	"github.com/lanewatch/lanewatch/event"
)

// TestClassify covers memory kinds and directions, one copy per case.
func TestClassify(t *testing.T) {
	type setup func(t *testing.T, e *Engine)
	fromStart := func(t *testing.T, e *Engine) { e.ObservedFromStart(testPID) }
	lateAttach := func(t *testing.T, e *Engine) {
		e.ObservedSince(testPID, []Range{{pool, pool + poolLen}, {dev, dev + 2*devLen}})
	}
	register := func(s setup, ret uint64) setup {
		return func(t *testing.T, e *Engine) {
			s(t, e)
			c := mem(t, "cudaHostRegister", 1, 10, 20, pool, poolLen)
			c.Ret = ret
			e.Handle(c)
			e.Handle(mem(t, "cudaMalloc", 1, 30, 40, dev, devLen))
		}
	}
	hostAlloc := func(t *testing.T, e *Engine) {
		e.ObservedFromStart(testPID)
		e.Handle(mem(t, "cudaHostAlloc", 1, 10, 20, pool, poolLen))
		e.Handle(mem(t, "cudaMalloc", 1, 30, 40, dev, devLen))
	}
	unregistered := func(t *testing.T, e *Engine) {
		register(fromStart, 0)(t, e)
		e.Handle(mem(t, "cudaHostUnregister", 1, 50, 0, pool, 0))
	}
	for _, tc := range []struct {
		name     string
		setup    setup
		sym      string
		kind     event.CopyKind
		dst, src uint64
		dir      string
		srcMem   event.MemKind
		dstMem   event.MemKind
		hostMem  event.MemKind
	}{
		{"pinned H2D (register)", register(fromStart, 0), "cudaMemcpyAsync", event.CopyHostToDevice, dev, pool + mib, DirH2D, event.MemPinned, event.MemDevice, event.MemPinned},
		{"pinned H2D (host alloc)", hostAlloc, "cudaMemcpyAsync", event.CopyHostToDevice, dev, pool, DirH2D, event.MemPinned, event.MemDevice, event.MemPinned},
		{"pinned D2H", register(fromStart, 0), "cudaMemcpyAsync", event.CopyDeviceToHost, pool + poolLen - 8, dev, DirD2H, event.MemDevice, event.MemPinned, event.MemPinned},
		{"pageable H2D", register(fromStart, 0), "cudaMemcpyAsync", event.CopyHostToDevice, dev, heap, DirH2D, event.MemPageable, event.MemDevice, event.MemPageable},
		{"just past the pool is pageable", register(fromStart, 0), "cudaMemcpy", event.CopyHostToDevice, dev, pool + poolLen, DirH2D, event.MemPageable, event.MemDevice, event.MemPageable},
		{"never told: unknown", func(*testing.T, *Engine) {}, "cudaMemcpyAsync", event.CopyHostToDevice, dev, heap, DirH2D, event.MemUnknown, event.MemDevice, event.MemUnknown},
		{"late attach, pool in snapshot: unknown", lateAttach, "cudaMemcpyAsync", event.CopyHostToDevice, dev, pool, DirH2D, event.MemUnknown, event.MemDevice, event.MemUnknown},
		{"late attach, fresh range: pageable", lateAttach, "cudaMemcpyAsync", event.CopyHostToDevice, dev, heap, DirH2D, event.MemPageable, event.MemDevice, event.MemPageable},
		{"late attach, registered after: pinned", register(lateAttach, 0), "cudaMemcpyAsync", event.CopyHostToDevice, dev, pool, DirH2D, event.MemPinned, event.MemDevice, event.MemPinned},
		{"failed registration stays pageable", register(fromStart, 1), "cudaMemcpyAsync", event.CopyHostToDevice, dev, pool, DirH2D, event.MemPageable, event.MemDevice, event.MemPageable},
		{"unregister makes pageable again", unregistered, "cudaMemcpyAsync", event.CopyHostToDevice, dev, pool, DirH2D, event.MemPageable, event.MemDevice, event.MemPageable},
		{"D2D", register(fromStart, 0), "cudaMemcpyAsync", event.CopyDeviceToDevice, dev + 64, dev, DirD2D, event.MemDevice, event.MemDevice, ""},
		{"peer", register(fromStart, 0), "cudaMemcpyPeerAsync", 0, dev + 64, dev, DirD2D, event.MemDevice, event.MemDevice, ""},
		{"H2H", register(fromStart, 0), "cudaMemcpyAsync", event.CopyHostToHost, heap, pool, DirH2H, event.MemPinned, event.MemPageable, ""},
		{"default H2D", register(fromStart, 0), "cudaMemcpyAsync", event.CopyDefault, dev, pool, DirH2D, event.MemPinned, event.MemDevice, event.MemPinned},
		{"default D2H pageable", register(fromStart, 0), "cudaMemcpyAsync", event.CopyDefault, heap, dev, DirD2H, event.MemDevice, event.MemPageable, event.MemPageable},
		{"default D2D", register(fromStart, 0), "cudaMemcpyAsync", event.CopyDefault, dev, dev + 4096, DirD2D, event.MemDevice, event.MemDevice, ""},
		{"default H2H", register(fromStart, 0), "cudaMemcpyAsync", event.CopyDefault, heap, pool, DirH2H, event.MemPinned, event.MemPageable, ""},
		{"default, driver API", register(fromStart, 0), "cuMemcpyAsync", 0, pool, dev, DirD2H, event.MemDevice, event.MemPinned, event.MemPinned},
		{"default, late attach: direction unknown", lateAttach, "cudaMemcpyAsync", event.CopyDefault, dev, pool, DirUnknown, event.MemUnknown, event.MemUnknown, ""},
		{"default, one side unplaced", register(lateAttach, 0), "cudaMemcpyAsync", event.CopyDefault, dev, dev + devLen, DirUnknown, event.MemUnknown, event.MemDevice, ""},
		{"driver fixed direction", register(fromStart, 0), "cuMemcpyDtoHAsync_v2", 0, heap, dev, DirD2H, event.MemDevice, event.MemPageable, event.MemPageable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, s := newTest(t, Config{})
			tc.setup(t, e)
			e.Handle(cp(t, tc.sym, 1, 1000, tc.dst, tc.src, 4096, tc.kind, 0))
			e.Flush()
			var copies, failed []Transfer
			for _, g := range s.got {
				if g.Failed() {
					failed = append(failed, g)
				} else {
					copies = append(copies, g)
				}
			}
			if len(copies) != 1 {
				t.Fatalf("got %d transfers, want 1", len(copies))
			}
			if tc.name == "failed registration stays pageable" {
				// The registration is reported with its error, and had no effect.
				if len(failed) != 1 || failed[0].API != "cudaHostRegister" || *failed[0].Error != (CallError{1, "cudaErrorInvalidValue"}) ||
					failed[0].Bytes != poolLen {
					t.Errorf("failed registration reported as %+v", failed)
				}
			} else if len(failed) != 0 {
				t.Errorf("failed calls %+v", failed)
			}
			g := copies[0]
			if g.Direction != tc.dir || g.Src.Mem != tc.srcMem || g.Dst.Mem != tc.dstMem || g.HostMem != tc.hostMem {
				t.Errorf("got %s src=%s dst=%s host=%q, want %s src=%s dst=%s host=%q",
					g.Direction, g.Src.Mem, g.Dst.Mem, g.HostMem, tc.dir, tc.srcMem, tc.dstMem, tc.hostMem)
			}
			if g.Src.Addr != tc.src || g.Dst.Addr != tc.dst || g.Bytes != 4096 || g.API != tc.sym || g.BatchIndex != -1 {
				t.Errorf("fields: %+v", g)
			}
		})
	}
}

func TestEventsLost(t *testing.T) {
	e, s := newTest(t, Config{})
	e.ObservedFromStart(testPID)
	e.EventsLost()
	e.Handle(cp(t, "cudaMemcpyAsync", 1, 10, dev, heap, 64, event.CopyHostToDevice, 0))
	e.Flush()
	if s.got[0].HostMem != event.MemUnknown {
		t.Errorf("after lost events: %s, want unknown", s.got[0].HostMem)
	}
}

func TestMergeCopyRuntimeFirst(t *testing.T) {
	e, s := newTest(t, Config{})
	e.ObservedFromStart(testPID)
	const st = 0xabc000
	e.Handle(cp(t, "cudaMemcpyAsync_ptsz", 7, 100, dev, heap, 4096, event.CopyHostToDevice, st))
	e.Handle(cp(t, "cuMemcpyHtoDAsync_v2_ptsz", 7, 101, dev, heap, 4096, 0, st))
	// The same copy again, but the runtime did not reach a probed driver call.
	e.Handle(cp(t, "cudaMemcpyAsync_ptsz", 7, 200, dev, heap, 4096, event.CopyHostToDevice, st))
	// A driver call on another thread is not a twin.
	e.Handle(cp(t, "cuMemcpyHtoDAsync_v2", 8, 201, dev, heap, 4096, 0, st))
	// A driver call with other operands is not a twin either.
	e.Handle(cp(t, "cudaMemcpyAsync", 9, 300, dev, heap, 4096, event.CopyHostToDevice, st))
	e.Handle(cp(t, "cuMemcpyHtoDAsync_v2", 9, 301, dev, heap, 8192, 0, st))
	e.Flush()
	s.unique()
	if len(s.got) != 5 {
		t.Fatalf("got %d transfers, want 5: %+v", len(s.got), s.got)
	}
	if g := s.got[0]; g.API != "cudaMemcpyAsync_ptsz" || g.DriverAPI != "cuMemcpyHtoDAsync_v2_ptsz" || g.SubmitNs != 100 {
		t.Errorf("merged: %+v", g)
	}
	for _, g := range s.got[1:] {
		if g.DriverAPI != "" {
			t.Errorf("not merged expected: %+v", g)
		}
	}
	if m := e.Stats().Merged; m != 1 {
		t.Errorf("merged = %d, want 1", m)
	}
}

func TestMergeDefaultKindTakesDriverDirection(t *testing.T) {
	e, s := newTest(t, Config{})
	e.ObservedSince(testPID, []Range{{pool, pool + poolLen}, {dev, dev + devLen}}) // late: registry cannot place either side
	e.Handle(cp(t, "cudaMemcpyAsync", 7, 100, dev, pool, 4096, event.CopyDefault, 0))
	e.Handle(cp(t, "cuMemcpyHtoDAsync_v2", 7, 101, dev, pool, 4096, 0, 0))
	e.Flush()
	if g := s.got[0]; g.Direction != DirH2D || g.Dst.Mem != event.MemDevice || g.HostMem != event.MemUnknown || g.DriverAPI == "" {
		t.Errorf("got %+v", g)
	}
}

func TestMergeRegisterDriverFirst(t *testing.T) {
	e, s := newTest(t, Config{})
	e.ObservedFromStart(testPID)
	// Entry+return probes: the nested driver call returns (and is reported) first.
	e.Handle(mem(t, "cuMemHostRegister_v2", 7, 110, 190, pool, poolLen))
	e.Handle(mem(t, "cudaHostRegister", 7, 100, 200, pool, poolLen))
	e.Handle(syncCall(t, "cuStreamSynchronize", 7, 310, 390, 0x55, 0))
	e.Handle(syncCall(t, "cudaStreamSynchronize", 7, 300, 400, 0x55, 0))
	// A runtime call that does not enclose the driver call is not its twin.
	e.Handle(mem(t, "cuMemHostRegister_v2", 7, 500, 510, pool+poolLen, 4096))
	e.Handle(mem(t, "cudaHostRegister", 7, 520, 530, pool+poolLen, 4096))
	e.Handle(cp(t, "cudaMemcpyAsync", 7, 600, dev, pool, 4096, event.CopyHostToDevice, 0))
	e.Flush()
	if m := e.Stats().Merged; m != 2 {
		t.Errorf("merged = %d, want 2", m)
	}
	if len(s.got) != 1 || s.got[0].HostMem != event.MemPinned {
		t.Fatalf("got %+v", s.got)
	}
}

func TestMergeMemoryAndOrderingRuntimeFirst(t *testing.T) {
	e, _ := newTest(t, Config{})
	e.ObservedFromStart(testPID)
	e.Handle(mem(t, "cudaFreeHost", 7, 100, 0, pool, 0))
	e.Handle(mem(t, "cuMemFreeHost", 7, 101, 0, pool, 0))
	e.Handle(syncCall(t, "cudaEventRecord", 7, 200, 0, 0, 0xe1))
	e.Handle(syncCall(t, "cuEventRecord", 7, 201, 0, 1, 0xe1)) // CU_STREAM_LEGACY is stream 0
	e.Handle(syncCall(t, "cudaStreamWaitEvent_ptsz", 7, 300, 0, 0, 0xe1))
	e.Handle(syncCall(t, "cuStreamWaitEvent", 7, 301, 0, 2, 0xe1)) // CU_STREAM_PER_THREAD
	if m := e.Stats().Merged; m != 3 {
		t.Errorf("merged = %d, want 3", m)
	}
}

func TestDriverOnlyCopy(t *testing.T) {
	e, s := newTest(t, Config{})
	e.ObservedFromStart(testPID)
	e.Handle(mem(t, "cuMemAlloc_v2", 7, 10, 20, dev, devLen))
	e.Handle(cp(t, "cuMemcpyDtoHAsync_v2", 7, 100, heap, dev, 4096, 0, 0x77))
	e.Handle(cp(t, "cuMemcpyDtoHAsync_v2", 7, 200, heap, dev, 4096, 0, 0x77))
	e.Handle(syncCall(t, "cuStreamSynchronize", 7, 300, 400, 0x77, 0))
	if len(s.got) != 2 {
		t.Fatalf("got %d, want 2", len(s.got))
	}
	for _, g := range s.got {
		if g.API != "cuMemcpyDtoHAsync_v2" || g.DriverAPI != "" || g.Direction != DirD2H || g.HostMem != event.MemPageable || g.CompleteNs != 400 {
			t.Errorf("got %+v", g)
		}
	}
}

func TestStreamSync(t *testing.T) {
	e, s := newTest(t, Config{})
	e.ObservedFromStart(testPID)
	const s1, s2 = 0x1000, 0x2000
	e.Handle(cp(t, "cudaMemcpyAsync", 7, 100, dev, heap, 1, event.CopyHostToDevice, s1))
	e.Handle(cp(t, "cudaMemcpyAsync", 7, 200, dev, heap, 2, event.CopyHostToDevice, s1))
	e.Handle(cp(t, "cudaMemcpyAsync", 7, 210, dev, heap, 3, event.CopyHostToDevice, s2))
	// Another thread queues on s1 after the sync below began: not covered.
	e.Handle(cp(t, "cudaMemcpyAsync", 8, 305, dev, heap, 4, event.CopyHostToDevice, s1))
	e.Handle(syncCall(t, "cudaStreamSynchronize", 7, 300, 400, s1, 0))
	if len(s.got) != 2 {
		t.Fatalf("after sync: %d emitted, want 2", len(s.got))
	}
	for i, g := range s.got {
		if g.Bytes != uint64(i+1) || g.CompleteNs != 400 {
			t.Errorf("got %+v", g)
		}
	}
	e.Flush()
	s.unique()
	if len(s.got) != 4 || s.got[2].CompleteNs != 0 || s.got[3].CompleteNs != 0 {
		t.Fatalf("after flush: %+v", s.got)
	}
	if st := e.Stats(); st.Transfers != 4 || st.Completed != 2 {
		t.Errorf("stats %+v", st)
	}
}

func TestDefaultStreams(t *testing.T) {
	e, s := newTest(t, Config{})
	e.ObservedFromStart(testPID)
	e.Handle(cp(t, "cudaMemcpyAsync_ptsz", 7, 100, dev, heap, 1, event.CopyHostToDevice, 0)) // thread 7's own stream
	e.Handle(cp(t, "cudaMemcpyAsync", 8, 110, dev, heap, 2, event.CopyHostToDevice, 0))      // legacy stream
	e.Handle(syncCall(t, "cudaStreamSynchronize", 9, 200, 300, 0, 0))                        // legacy
	// Completed by another thread, the copy waits for its own thread's next
	// call (which could be its nested driver call) before it is emitted.
	e.Handle(syncCall(t, "cudaStreamSynchronize_ptsz", 8, 400, 500, 0, 0)) // thread 8's own: empty
	if len(s.got) != 1 || s.got[0].Bytes != 2 || s.got[0].CompleteNs != 300 {
		t.Fatalf("legacy sync: %+v", s.got)
	}
	e.Handle(syncCall(t, "cuStreamSynchronize", 7, 600, 700, 2, 0)) // CU_STREAM_PER_THREAD of thread 7
	if len(s.got) != 2 || s.got[1].Bytes != 1 || s.got[1].CompleteNs != 700 {
		t.Fatalf("per-thread sync: %+v", s.got)
	}
}

func TestEventSync(t *testing.T) {
	e, s := newTest(t, Config{})
	e.ObservedFromStart(testPID)
	const st, ev = 0x1000, 0xe1
	e.Handle(cp(t, "cudaMemcpyAsync", 7, 100, dev, heap, 1, event.CopyHostToDevice, st))
	e.Handle(syncCall(t, "cudaEventRecord", 7, 150, 0, st, ev))
	e.Handle(cp(t, "cudaMemcpyAsync", 7, 200, dev, heap, 2, event.CopyHostToDevice, st))
	e.Handle(syncCall(t, "cudaEventSynchronize", 8, 300, 400, 0, ev))
	if len(s.got) != 1 || s.got[0].Bytes != 1 || s.got[0].CompleteNs != 400 {
		t.Fatalf("event sync: %+v", s.got)
	}
	// A sync that began before the event's latest record proves nothing.
	e.Handle(syncCall(t, "cudaEventRecord", 7, 520, 0, st, ev))
	e.Handle(syncCall(t, "cudaEventSynchronize", 8, 500, 600, 0, ev))
	if len(s.got) != 1 {
		t.Fatalf("stale event sync completed %+v", s.got[1:])
	}
	e.Handle(syncCall(t, "cudaEventSynchronize", 8, 700, 800, 0, ev))
	if len(s.got) != 2 || s.got[1].CompleteNs != 800 {
		t.Fatalf("second event sync: %+v", s.got)
	}
}

// TestHiCacheLayers: per-layer copies on a load stream, an event recorded
// after each layer, the compute stream waiting on each event, and one
// synchronisation of the compute stream proving every layer loaded.
func TestHiCacheLayers(t *testing.T) {
	e, s := newTest(t, Config{})
	e.ObservedFromStart(testPID)
	const load, compute, loader, sched = 0x1000, 0x2000, 11, 12
	e.Handle(mem(t, "cuMemHostRegister_v2", loader, 2, 8, pool, poolLen))
	e.Handle(mem(t, "cudaHostRegister", loader, 1, 9, pool, poolLen))
	ts := uint64(100)
	const layers, pages = 4, 3
	for l := range uint64(layers) {
		for p := range uint64(pages) {
			dst, src := dev+(l*pages+p)*mib, pool+(l*pages+p)*mib
			e.Handle(cp(t, "cudaMemcpyAsync", loader, ts, dst, src, mib, event.CopyHostToDevice, load))
			e.Handle(cp(t, "cuMemcpyHtoDAsync_v2", loader, ts+1, dst, src, mib, 0, load))
			ts += 10
		}
		ev := 0xe000 + l
		e.Handle(syncCall(t, "cudaEventRecord", loader, ts, 0, load, ev))
		e.Handle(syncCall(t, "cuEventRecord", loader, ts+1, 0, load, ev))
		e.Handle(syncCall(t, "cudaStreamWaitEvent", sched, ts+2, 0, compute, ev))
		e.Handle(syncCall(t, "cuStreamWaitEvent", sched, ts+3, 0, compute, ev))
		ts += 10
	}
	// Copies for the next batch, after the last record: not covered.
	e.Handle(cp(t, "cudaMemcpyAsync", loader, ts, dev, pool, mib, event.CopyHostToDevice, load))
	if len(s.got) != 0 {
		t.Fatalf("emitted before any sync: %+v", s.got)
	}
	e.Handle(syncCall(t, "cuStreamSynchronize", sched, ts+6, ts+90, compute, 0))
	e.Handle(syncCall(t, "cudaStreamSynchronize", sched, ts+5, ts+100, compute, 0))
	if len(s.got) != layers*pages {
		t.Fatalf("compute sync completed %d, want %d", len(s.got), layers*pages)
	}
	for _, g := range s.got {
		if g.CompleteNs != ts+90 || g.HostMem != event.MemPinned || g.DriverAPI != "cuMemcpyHtoDAsync_v2" {
			t.Errorf("got %+v", g)
		}
	}
	e.Flush()
	s.unique()
	if st := e.Stats(); st.Transfers != layers*pages+1 || st.Completed != layers*pages || st.Merged != 2*layers+layers*pages+2 {
		t.Errorf("stats %+v", st)
	}
}

// TestWaitChain: s1 → e1 → s2 waits, e2 recorded on s2 → s3 waits; a
// sync of s3 completes s1's copies transitively.
func TestWaitChain(t *testing.T) {
	e, s := newTest(t, Config{})
	e.ObservedFromStart(testPID)
	e.Handle(cp(t, "cudaMemcpyAsync", 1, 100, dev, heap, 1, event.CopyHostToDevice, 0x1))
	e.Handle(cp(t, "cudaMemcpyAsync", 1, 110, dev, heap, 2, event.CopyHostToDevice, 0x1000))
	e.Handle(syncCall(t, "cudaEventRecord", 1, 120, 0, 0x1000, 0xe1))
	e.Handle(syncCall(t, "cudaStreamWaitEvent", 1, 130, 0, 0x2000, 0xe1))
	e.Handle(cp(t, "cudaMemcpyAsync", 1, 140, dev, heap, 3, event.CopyDeviceToDevice, 0x2000))
	e.Handle(syncCall(t, "cudaEventRecord", 1, 150, 0, 0x2000, 0xe2))
	e.Handle(syncCall(t, "cudaStreamWaitEvent", 1, 160, 0, 0x3000, 0xe2))
	e.Handle(syncCall(t, "cudaStreamSynchronize", 1, 170, 180, 0x3000, 0))
	if len(s.got) != 2 {
		t.Fatalf("chain completed %d, want 2: %+v", len(s.got), s.got)
	}
	for _, g := range s.got {
		if g.Bytes == 1 || g.CompleteNs != 180 {
			t.Errorf("got %+v", g)
		}
	}
}

func TestPendingTimeoutAndFlushOnce(t *testing.T) {
	e, s := newTest(t, Config{PendingTimeout: time.Millisecond})
	e.ObservedFromStart(testPID)
	e.Handle(cp(t, "cudaMemcpyAsync", 1, 1_000, dev, heap, 1, event.CopyHostToDevice, 0x1))
	e.Handle(cp(t, "cudaMemcpyAsync", 1, 2_000_000, dev, heap, 2, event.CopyHostToDevice, 0x1))
	// Time moves on through another process's events.
	other := mem(t, "cudaFree", 1, 3_000_000, 0, 0, 0)
	other.PID = 99
	e.Handle(other)
	if len(s.got) != 1 || s.got[0].Bytes != 1 || s.got[0].CompleteNs != 0 {
		t.Fatalf("after timeout: %+v", s.got)
	}
	e.Flush()
	e.Flush()
	e.Handle(syncCall(t, "cudaStreamSynchronize", 1, 3_000_100, 3_000_200, 0x1, 0))
	s.unique()
	if len(s.got) != 2 {
		t.Fatalf("got %d, want 2", len(s.got))
	}
	if st := e.Stats(); st.TimedOut != 1 || st.Transfers != 2 {
		t.Errorf("stats %+v", st)
	}
}

func TestCompletedHeldForDriverCall(t *testing.T) {
	e, s := newTest(t, Config{})
	e.ObservedFromStart(testPID)
	e.Handle(cp(t, "cudaMemcpyAsync", 1, 100, dev, heap, 1, event.CopyHostToDevice, 0x1))
	// Another thread's sync, begun after the copy was submitted, returns
	// before the nested driver call is reported.
	e.Handle(syncCall(t, "cudaStreamSynchronize", 2, 101, 102, 0x1, 0))
	if len(s.got) != 0 {
		t.Fatalf("emitted before its driver call: %+v", s.got)
	}
	e.Handle(cp(t, "cuMemcpyHtoDAsync_v2", 1, 103, dev, heap, 1, 0, 0x1))
	if len(s.got) != 1 || s.got[0].DriverAPI == "" || s.got[0].CompleteNs != 102 {
		t.Fatalf("got %+v", s.got)
	}
}

func TestProcessExit(t *testing.T) {
	e, s := newTest(t, Config{})
	e.ObservedFromStart(testPID)
	e.Handle(mem(t, "cudaHostAlloc", 1, 10, 20, pool, poolLen))
	e.Handle(cp(t, "cudaMemcpyAsync", 1, 100, dev, pool, 1, event.CopyHostToDevice, 0x1))
	e.Handle(&event.Call{Kind: event.KindExit, PID: testPID, TID: testPID, Time: 200})
	if len(s.got) != 1 || s.got[0].HostMem != event.MemPinned {
		t.Fatalf("exit: %+v", s.got)
	}
	if k, _ := e.Lookup(testPID, pool); k != event.MemUnknown {
		t.Errorf("after exit: %s, want unknown", k)
	}
	// Same pid, new process: nothing inherited.
	e.Handle(cp(t, "cudaMemcpyAsync", 1, 300, dev, pool, 2, event.CopyHostToDevice, 0x1))
	e.ProcessExit(testPID)
	e.ProcessExit(testPID)
	s.unique()
	if len(s.got) != 2 || s.got[1].HostMem != event.MemUnknown {
		t.Fatalf("got %+v", s.got)
	}
}

func TestCaps(t *testing.T) {
	e, s := newTest(t, Config{MaxPending: 2, MaxProcesses: 1, MaxRanges: 1})
	e.ObservedFromStart(testPID)
	for i := range uint64(3) {
		e.Handle(cp(t, "cudaMemcpyAsync", 1, 100+i, dev, heap, i, event.CopyHostToDevice, 0x1))
	}
	if len(s.got) != 1 || s.got[0].Bytes != 0 {
		t.Fatalf("eviction: %+v", s.got)
	}
	e.Handle(mem(t, "cudaHostRegister", 1, 200, 210, pool, 4096))
	e.Handle(mem(t, "cudaHostRegister", 1, 220, 230, pool+mib, 4096))
	other := cp(t, "cudaMemcpyAsync", 1, 300, dev, heap, 9, event.CopyHostToDevice, 0x1)
	other.PID = 7
	e.Handle(other) // past MaxProcesses: emitted at once, nothing known
	if len(s.got) != 2 || s.got[1].PID != 7 || s.got[1].HostMem != event.MemUnknown {
		t.Fatalf("untracked: %+v", s.got)
	}
	e.Handle(&event.Call{Kind: event.KindCall, Probe: 60000, Op: 0xff, PID: testPID, Time: 400}) // an op the engine does not know
	e.Handle(&event.Call{Kind: 77, PID: testPID, Time: 400})
	e.Flush()
	s.unique()
	st := e.Stats()
	want := Stats{Events: 8, Transfers: 4, PendingEvicted: 1, UnknownProbe: 2, RangeCapHits: 1, ProcessCapHits: 1}
	if st != want {
		t.Errorf("stats\n got %+v\nwant %+v", st, want)
	}
	if k, _ := e.Lookup(testPID, heap); k != event.MemUnknown {
		t.Errorf("after a range cap hit: %s, want unknown", k)
	}
}

func TestBatchEntries(t *testing.T) {
	e, s := newTest(t, Config{})
	e.ObservedFromStart(testPID)
	e.Handle(mem(t, "cudaMalloc", 1, 10, 20, dev, devLen))
	e.Handle(mem(t, "cudaHostAlloc", 1, 30, 40, pool, poolLen))
	id := "cudaMemcpyBatchAsync"
	pairs := [][2]uint64{{dev, pool}, {heap, dev}, {dev, dev + mib}}
	for i, p := range pairs {
		e.Handle(call(t, id, event.Call{Kind: event.KindBatchEntry, PID: testPID, TID: 1, Time: 100,
			Dst: p[0], Src: p[1], Bytes: 4096, CopyKind: event.CopyDefault, Stream: 0x5,
			BatchIndex: uint32(i), BatchCount: 3}))
	}
	e.Handle(syncCall(t, "cudaStreamSynchronize", 1, 200, 300, 0x5, 0))
	s.unique()
	if len(s.got) != 3 {
		t.Fatalf("got %d, want 3", len(s.got))
	}
	for i, want := range []string{DirH2D, DirD2H, DirD2D} {
		g := s.got[i]
		if g.BatchIndex != i || g.Direction != want || g.Op != event.OpCopyBatch || g.CompleteNs != 300 {
			t.Errorf("entry %d: %+v", i, g)
		}
	}
}
