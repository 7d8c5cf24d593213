package correlate

import (
	"testing"

	"github.com/lanewatch/lanewatch/event"
)

// ret is a call of sym returning code at rts, as the return probe reports it.
func ret(t *testing.T, c *event.Call, rts, code uint64) *event.Call {
	t.Helper()
	c.ReturnTime, c.Ret = rts, code
	return c
}

// A copy the driver refused is reported with its CUresult, moves nothing,
// and leaves the stream as it was: the next sync completes the good copy only.
func TestFailedDriverCopy(t *testing.T) {
	e, s := newTest(t, Config{})
	e.ObservedFromStart(testPID)
	e.Handle(ret(t, mem(t, "cuMemAlloc_v2", 1, 10, 0, dev, devLen), 20, 0))
	e.Handle(ret(t, mem(t, "cuMemHostAlloc", 1, 30, 0, pool, poolLen), 40, 0))
	good := ret(t, cp(t, "cuMemcpyHtoDAsync_v2", 1, 100, dev, pool, mib, 0, 0x5), 110, 0)
	bad := ret(t, cp(t, "cuMemcpyHtoDAsync_v2", 1, 200, 0x10, pool, mib, 0, 0x5), 210, 1) // CUDA_ERROR_INVALID_VALUE
	bad.Ret |= 0xdead_0000_0000_0000                                                      // upper half of rax: not the result
	e.Handle(good)
	e.Handle(bad)
	e.Handle(ret(t, syncCall(t, "cuStreamSynchronize", 1, 300, 0, 0x5, 0), 400, 0))
	e.Flush()
	s.unique()
	if len(s.got) != 2 {
		t.Fatalf("records %+v", s.got)
	}
	g, f := s.got[0], s.got[1]
	if g.Failed() { // emitted first: it waits for no completion
		g, f = f, g
	}
	if g.Failed() || g.CompleteNs != 400 || g.API != "cuMemcpyHtoDAsync_v2" || g.CallNs != 10 {
		t.Errorf("good copy %+v", g)
	}
	if !f.Failed() || *f.Error != (CallError{1, "CUDA_ERROR_INVALID_VALUE"}) || f.CompleteNs != 0 || f.Bytes != mib || f.Direction != DirH2D {
		t.Errorf("failed copy %+v error %+v", f, f.Error)
	}
	if st := e.Stats(); st.FailedCalls != 1 {
		t.Errorf("stats %+v", st)
	}
}

// A driver call made by a CUDA runtime is reported under the runtime call
// the application made; one made by the application itself keeps the
// driver's name.
func TestRuntimeViewFromTheDriver(t *testing.T) {
	e, s := newTest(t, Config{})
	e.ObservedFromStart(testPID)
	via := ret(t, cp(t, "cuMemcpyHtoDAsync_v2_ptsz", 1, 100, dev, heap, 4096, 0, 0), 110, 0)
	via.ViaRuntime = true
	direct := ret(t, cp(t, "cuMemcpyDtoH_v2", 2, 200, heap, dev, 4096, 0, 0), 210, 0)
	e.Handle(via)
	e.Handle(direct)
	e.Flush()
	if len(s.got) != 2 {
		t.Fatalf("records %+v", s.got)
	}
	if g := s.got[0]; g.API != "cudaMemcpyAsync_ptsz" || g.DriverAPI != "cuMemcpyHtoDAsync_v2_ptsz" || g.Direction != DirH2D || g.Stream != 0 {
		t.Errorf("through the runtime: %+v", g)
	}
	if g := s.got[1]; g.API != "cuMemcpyDtoH_v2" || g.DriverAPI != "" {
		t.Errorf("driver API: %+v", g)
	}
}

// A batch copy reports its entries at entry and its result at return: a
// failed batch turns every entry into a failed call.
func TestBatchResult(t *testing.T) {
	for _, code := range []uint64{0, 1} {
		e, s := newTest(t, Config{})
		e.ObservedFromStart(testPID)
		for i := range 3 {
			e.Handle(call(t, "cuMemcpyBatchAsync", event.Call{Kind: event.KindBatchEntry, PID: testPID, TID: 1, Time: 100,
				Dst: dev + uint64(i)*mib, Src: heap, Bytes: 4096, BatchIndex: uint32(i), BatchCount: 3, Stream: 0x5}))
		}
		e.Handle(call(t, "cuMemcpyBatchAsync", event.Call{Kind: event.KindCall, PID: testPID, TID: 1, Time: 100, ReturnTime: 150,
			Ret: code, Stream: 0x5}))
		e.Handle(ret(t, syncCall(t, "cuStreamSynchronize", 1, 300, 0, 0x5, 0), 400, 0))
		e.Flush()
		s.unique()
		if len(s.got) != 3 {
			t.Fatalf("result %d: records %+v", code, s.got)
		}
		for i, g := range s.got {
			if g.BatchIndex != i || g.Failed() != (code != 0) || (code == 0) != (g.CompleteNs == 400) {
				t.Errorf("result %d entry %d: %+v", code, i, g)
			}
		}
	}
}

// With the runtime layer probed too (a process whose driver failed), a
// runtime call and the driver call it made are one record, with the
// runtime's result: what the application saw.
func TestFailedRuntimeAndDriverFold(t *testing.T) {
	e, s := newTest(t, Config{})
	e.ObservedFromStart(testPID)
	drv := ret(t, cp(t, "cuMemcpyHtoD_v2", 1, 110, dev, heap, 4096, 0, 0), 120, 3) // the driver returns first
	drv.ViaRuntime = true
	e.Handle(drv)
	e.Handle(ret(t, cp(t, "cudaMemcpy", 1, 100, dev, heap, 4096, event.CopyHostToDevice, 0), 130, 3))
	// A runtime call that never reached the driver.
	e.Handle(ret(t, cp(t, "cudaMemcpyAsync", 1, 200, dev, heap, 4096, event.CopyHostToDevice, 0x5), 210, 100))
	e.Handle(ret(t, mem(t, "cudaMallocHost", 1, 300, 0, 0, mib), 310, 100))
	e.Flush()
	s.unique()
	want := []struct {
		api, driver string
		err         CallError
	}{
		{"cudaMemcpy", "cuMemcpyHtoD_v2", CallError{3, "cudaErrorInitializationError"}},
		{"cudaMemcpyAsync", "", CallError{100, "cudaErrorNoDevice"}},
		{"cudaMallocHost", "", CallError{100, "cudaErrorNoDevice"}},
	}
	if len(s.got) != len(want) {
		t.Fatalf("records %+v", s.got)
	}
	for i, w := range want {
		g := s.got[i]
		if g.API != w.api || g.DriverAPI != w.driver || g.Error == nil || *g.Error != w.err {
			t.Errorf("record %d: %s/%s %+v, want %+v", i, g.API, g.DriverAPI, g.Error, w)
		}
	}
}

// A failed cuInit is a record too: the process's CUDA is unusable.
func TestFailedInit(t *testing.T) {
	e, s := newTest(t, Config{})
	e.ObservedFromStart(testPID)
	e.Handle(ret(t, mk(t, "cuInit", 1, 10, 20), 20, 100))
	e.Handle(ret(t, mk(t, "cuInit", 1, 30, 40), 40, 0))
	e.Flush()
	if len(s.got) != 1 || s.got[0].Op != event.OpInit || *s.got[0].Error != (CallError{100, "CUDA_ERROR_NO_DEVICE"}) {
		t.Fatalf("records %+v", s.got)
	}
}
