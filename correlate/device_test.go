package correlate

import (
	"fmt"
	"testing"

	"github.com/lanewatch/lanewatch/event"
)

// devWorld drives one process through the driver calls a runtime makes and
// keeps every transfer it emits, with a DeviceMap that names ordinal N
// "0000:N0:00.0" and counts how often it was asked.
type devWorld struct {
	t     *testing.T
	e     *Engine
	s     *collect
	ts    uint64
	asked map[int]int
}

func newDevWorld(t *testing.T, withMap bool) *devWorld {
	w := &devWorld{t: t, asked: map[int]int{}}
	cfg := Config{}
	if withMap {
		cfg.Devices = func(pid uint32, ordinal int) string {
			if pid != testPID {
				t.Errorf("DeviceMap asked for pid %d", pid)
			}
			w.asked[ordinal]++
			return fmt.Sprintf("0000:%x0:00.0", ordinal)
		}
	}
	w.e, w.s = newTest(t, cfg)
	w.e.ObservedFromStart(testPID)
	return w
}

func (w *devWorld) call(sym string, tid uint32, set func(c *event.Call)) {
	w.t.Helper()
	w.ts += 100
	c := mk(w.t, sym, tid, w.ts, w.ts+50)
	set(c)
	w.e.Handle(c)
}

// ctx handles of the tests: ctxOf(d) is device d's primary context.
func ctxOf(d int32) uint64 { return 0xc0de_0000 + uint64(d)<<8 }

func (w *devWorld) retain(tid uint32, d int32) {
	w.call("cuDevicePrimaryCtxRetain", tid, func(c *event.Call) { c.Ptr, c.Device = ctxOf(d), d })
}

func (w *devWorld) setCurrent(tid uint32, ctx uint64) {
	w.call("cuCtxSetCurrent", tid, func(c *event.Call) { c.Ptr = ctx })
}

// setDevice is cudaSetDevice(d) as the runtime carries it out in the driver.
func (w *devWorld) setDevice(tid uint32, d int32) {
	w.retain(tid, d)
	w.setCurrent(tid, ctxOf(d))
}

func (w *devWorld) alloc(tid uint32, ptr, size uint64) {
	w.call("cuMemAlloc_v2", tid, func(c *event.Call) { c.Ptr, c.Size = ptr, size })
}

func (w *devWorld) copy(sym string, tid uint32, dst, src uint64) {
	w.call(sym, tid, func(c *event.Call) { c.Dst, c.Src, c.Bytes = dst, src, mib })
}

func (w *devWorld) h2d(tid uint32, dst uint64) { w.copy("cuMemcpyHtoDAsync_v2", tid, dst, heap) }

// gpus flushes the engine and returns the GPU of every copy, in order.
func (w *devWorld) gpus() []string {
	w.e.Flush()
	var out []string
	for _, tr := range w.s.got {
		if tr.Op.IsCopy() {
			out = append(out, tr.GPU)
		}
	}
	w.s.got = nil
	return out
}

func (w *devWorld) want(what string, want ...string) {
	w.t.Helper()
	got := w.gpus()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		w.t.Errorf("%s: GPUs %q, want %q", what, got, want)
	}
}

const (
	dev0 = dev          // allocated on device 0
	dev1 = dev + devLen // allocated on device 1
)

func TestDeviceSetThenAllocAndCopy(t *testing.T) {
	w := newDevWorld(t, true)
	w.setDevice(1, 2)
	w.alloc(1, dev0, mib)
	w.h2d(1, dev0+4096)                                  // owner: device 2
	w.copy("cuMemcpyDtoHAsync_v2", 1, heap, dev0)        // owner of the source
	w.copy("cuMemcpyHtoDAsync_v2", 1, 0x1234_0000, heap) // no owner known: the thread's device
	w.copy("cuMemcpyAsync", 1, heap+mib, heap)           // H2H: no GPU link known
	w.want("device 2", "0000:20:00.0", "0000:20:00.0", "0000:20:00.0", "")
	if got, ok := w.e.ThreadDevice(testPID, 1); !ok || got != 2 {
		t.Errorf("ThreadDevice = %d, %v", got, ok)
	}
	if w.asked[2] != 1 || len(w.asked) != 1 {
		t.Errorf("DeviceMap asked %v: once for ordinal 2 expected", w.asked)
	}
}

// A retained device is named at once, before any copy needs it: the
// process may be gone by then.
func TestDeviceNamedAtRetain(t *testing.T) {
	w := newDevWorld(t, true)
	w.retain(1, 3)
	if w.asked[3] != 1 {
		t.Errorf("DeviceMap asked %v at the retain of device 3", w.asked)
	}
	w.setCurrent(1, ctxOf(3))
	w.h2d(1, 0x1234_0000)
	w.want("named at retain", "0000:30:00.0")
	if w.asked[3] != 1 {
		t.Errorf("DeviceMap asked again: %v", w.asked)
	}
}

// Two threads of one process on two devices (TP workers in one process, or
// a loader thread beside the scheduler), and a copy whose device pointer
// was allocated on the other thread's device.
func TestDeviceTwoThreads(t *testing.T) {
	w := newDevWorld(t, true)
	w.setDevice(1, 0)
	w.setDevice(2, 1)
	w.alloc(1, dev0, devLen)
	w.alloc(2, dev1, devLen)
	w.h2d(1, dev0)
	w.h2d(2, dev1)
	w.h2d(2, dev0+mib)                                    // thread 2 (device 1) into device 0's memory
	w.copy("cuMemcpyDtoDAsync_v2", 1, dev1+mib, dev0+mib) // across devices: the destination
	w.copy("cuMemcpyDtoDAsync_v2", 2, dev1+2*mib, dev1)   // within device 1
	w.e.Flush()
	var peers []string
	for _, tr := range w.s.got {
		if tr.Direction == DirD2D {
			peers = append(peers, tr.SrcGPU+"→"+tr.GPU)
		}
	}
	// The copy across devices read device 0's memory: a peer copy; the one
	// within device 1 has no source GPU apart from its own.
	if fmt.Sprint(peers) != "[0000:00:00.0→0000:10:00.0 →0000:10:00.0]" {
		t.Errorf("D2D copies' source→destination GPUs: %q", peers)
	}
	w.want("two threads", "0000:00:00.0", "0000:10:00.0", "0000:00:00.0", "0000:10:00.0", "0000:10:00.0")
}

func TestDevicePushPop(t *testing.T) {
	w := newDevWorld(t, true)
	w.setDevice(1, 0)
	w.retain(1, 3)
	w.call("cuCtxPushCurrent_v2", 1, func(c *event.Call) { c.Ptr = ctxOf(3) })
	w.alloc(1, dev1, mib)
	w.h2d(1, 0x1234_0000) // unknown pointer: current is device 3
	w.call("cuCtxPopCurrent_v2", 1, func(c *event.Call) { c.Ptr = ctxOf(3) })
	w.h2d(1, 0x1234_0000) // back on device 0
	w.h2d(1, dev1)        // allocated under the pushed context: device 3
	w.want("push/pop", "0000:30:00.0", "0000:00:00.0", "0000:30:00.0")

	// cuCtxSetCurrent(NULL) pops; destroying the current context pops it.
	w.setCurrent(1, 0)
	w.h2d(1, 0x1234_0000)
	w.want("set current NULL on a one-deep stack: no context", "")
	w.call("cuCtxCreate_v2", 1, func(c *event.Call) { c.Ptr, c.Device = 0xabc000, 5 })
	w.h2d(1, 0x1234_0000)
	w.call("cuCtxDestroy_v2", 1, func(c *event.Call) { c.Ptr = 0xabc000 })
	w.h2d(1, 0x1234_0000)
	w.want("create pushes, destroy pops", "0000:50:00.0", "")
}

// The runtime's "device 0 when the thread never chose" is not assumed: a
// thread the probes saw make no context call has no device, even in a
// process whose other thread uses device 0; once the runtime makes device
// 0's context current on it (its first runtime call does), it has.
func TestDeviceImplicitZeroNeedsEvidence(t *testing.T) {
	w := newDevWorld(t, true)
	w.setDevice(1, 0)
	w.h2d(2, 0x1234_0000) // thread 2 never set a context
	w.want("no evidence", "")
	w.setCurrent(2, ctxOf(0)) // the runtime's implicit device 0, through the driver
	w.h2d(2, 0x1234_0000)
	w.want("implicit device 0 seen", "0000:00:00.0")
}

// Nothing known: no context call and no map. A context whose device was
// retained before the agent looked names no device either.
func TestDeviceUnknown(t *testing.T) {
	w := newDevWorld(t, false)
	w.h2d(1, 0x1234_0000)
	w.setCurrent(1, 0xfeed00) // retained before attach: its device is unknown
	w.alloc(1, dev0, mib)
	w.h2d(1, dev0)
	w.setDevice(1, 1) // known device, but no map and no bus-id answer
	w.h2d(1, 0x1234_0000)
	w.want("unknown", "", "", "")
	if _, ok := w.e.ThreadDevice(testPID, 9); ok {
		t.Error("a thread never seen has a device")
	}
}

// The process's own cuDeviceGetPCIBusId answer names its ordinals, over the
// agent's map, also for a copy made before it asked (a later one uses it).
func TestDeviceBusIDAnswer(t *testing.T) {
	w := newDevWorld(t, true)
	w.setDevice(1, 1)
	w.h2d(1, 0x1234_0000)
	busID := func(d int32, s string) {
		w.call("cuDeviceGetPCIBusId", 1, func(c *event.Call) { c.Device = d; copy(c.BusID[:], s) })
	}
	busID(1, "0000:3B:00.0")
	busID(2, "garbage")
	w.h2d(1, 0x1234_0000)
	w.setDevice(1, 2)
	w.h2d(1, 0x1234_0000)
	w.want("bus id", "0000:10:00.0", "0000:3b:00.0", "0000:20:00.0")
	// A failed call says nothing.
	w.call("cuDeviceGetPCIBusId", 1, func(c *event.Call) { c.Device, c.Ret = 2, 3; copy(c.BusID[:], "0000:99:00.0") })
	w.h2d(1, 0x1234_0000)
	if got := w.gpus(); len(got) != 1 || got[0] != "0000:20:00.0" {
		t.Errorf("after a failed bus-id call: %q", got)
	}
}

// A failed context call is a record with its error and changes nothing.
func TestDeviceFailedCall(t *testing.T) {
	w := newDevWorld(t, true)
	w.setDevice(1, 0)
	w.retain(1, 1)
	w.call("cuCtxSetCurrent", 1, func(c *event.Call) { c.Ptr, c.Ret = ctxOf(1), 201 })
	w.h2d(1, 0x1234_0000)
	w.e.Flush()
	var failed, gpu string
	for _, tr := range w.s.got {
		if tr.Failed() {
			failed = tr.Op.String() + " " + tr.Error.Name
		} else if tr.Op == event.OpCopy {
			gpu = tr.GPU
		}
	}
	if failed != "ctx_set_current CUDA_ERROR_INVALID_CONTEXT" || gpu != "0000:00:00.0" {
		t.Errorf("failed record %q, copy GPU %q", failed, gpu)
	}
}

// A peer copy names its destination's context; without it and without an
// owner the thread's device.
func TestDevicePeerCopy(t *testing.T) {
	w := newDevWorld(t, true)
	w.setDevice(1, 0)
	w.retain(1, 1)
	w.call("cuMemcpyPeerAsync", 1, func(c *event.Call) {
		c.Dst, c.Src, c.Bytes, c.Ptr = 0x1234_0000, 0x2234_0000, mib, ctxOf(1)
	})
	w.call("cuMemcpyPeerAsync", 1, func(c *event.Call) { c.Dst, c.Src, c.Bytes, c.Ptr = 0x1234_0000, 0x2234_0000, mib, 0 })
	w.want("peer", "0000:10:00.0", "0000:00:00.0")
}

// Freed memory has no owner; memory allocated again at the same address on
// another device has the new one.
func TestDeviceOwnerFollowsFree(t *testing.T) {
	w := newDevWorld(t, true)
	w.setDevice(1, 0)
	w.alloc(1, dev0, mib)
	w.call("cuMemFree_v2", 1, func(c *event.Call) { c.Ptr = dev0 })
	w.setDevice(1, 1)
	w.setDevice(2, 2)
	w.h2d(2, dev0) // not device memory any more: thread 2's device
	w.alloc(1, dev0, mib)
	w.h2d(2, dev0) // reallocated on device 1
	w.want("free", "0000:20:00.0", "0000:10:00.0")
}

// RDMA into GPU memory: the device that owns the registered region.
func TestDeviceRDMA(t *testing.T) {
	w := newDevWorld(t, true)
	w.setDevice(1, 3)
	w.alloc(1, dev0, mib)
	w.ts += 100
	w.e.Handle(&event.Call{Kind: event.KindCall, PID: testPID, TID: 1, Time: w.ts, ReturnTime: w.ts + 10, Returns: true,
		Layer: event.LayerVerbs, Op: event.OpMRRegister, Ptr: dev0, Size: mib, RDMA: event.RDMA{MR: 0x900, LKey: 7, RKey: 8}})
	w.ts += 100
	w.e.Handle(&event.Call{Kind: event.KindWR, PID: testPID, TID: 1, Time: w.ts, Layer: event.LayerProvider, Op: event.OpPostRecv,
		Bytes: 4096, RDMA: event.RDMA{QPNum: 5, WRID: 1, Local: dev0 + 64, LKey: 7, NumSGE: 1}})
	w.e.Flush()
	var gpu string
	for _, tr := range w.s.got {
		if tr.Op == event.OpPostRecv {
			gpu = tr.GPU
		}
	}
	if gpu != "0000:30:00.0" {
		t.Errorf("receive into device 3's memory: GPU %q", gpu)
	}
}

func TestParseBusID(t *testing.T) {
	for in, want := range map[string]string{
		"0000:3B:00.0":       "0000:3b:00.0", // cuDeviceGetPCIBusId
		"00000000:3B:00.0":   "0000:3b:00.0", // NVML's 8-digit domain
		"0000:3b:00.0\x00xy": "0000:3b:00.0",
		"10000:01:00.0":      "10000:01:00.0", // Intel VMD domain
		"0001:c1:1f.7":       "0001:c1:1f.7",
		"F123:45:00.0":       "f123:45:00.0",
		"":                   "",
		"0000:3b:00":         "",
		"0000:3b:20.0":       "", // device is 5 bits
		"0000:3b:00.8":       "", // function is 3 bits
		"0000:3g:00.0":       "",
		"000000000:3b:00.0":  "",
		"0000:+3:00.0":       "",
		"0000:3b:00.0.0":     "",
	} {
		if got := ParseBusID([]byte(in)); got != want {
			t.Errorf("ParseBusID(%q) = %q, want %q", in, got, want)
		}
	}
}

func FuzzParseBusID(f *testing.F) {
	for _, s := range []string{"0000:3B:00.0", "00000000:3b:00.0\x00", "10000:01:00.0", "::.", "0:0:0.0"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got := ParseBusID(b)
		if got == "" {
			return
		}
		// A result is canonical: it parses to itself.
		if again := ParseBusID([]byte(got)); again != got {
			t.Errorf("ParseBusID(%q) = %q, which parses to %q", b, got, again)
		}
	})
}

// StreamGPUs places each stream on the GPU of its last placed copy, and
// the default streams on theirs only while they all agree.
func TestStreamGPUs(t *testing.T) {
	w := newDevWorld(t, true)
	const d0, d1 = 0xd000_0000, 0xd100_0000
	w.setDevice(1, 0)
	w.alloc(1, d0, mib)
	w.setDevice(2, 1)
	w.alloc(2, d1, mib)
	on := func(tid uint32, dst, stream uint64) {
		w.call("cuMemcpyHtoDAsync_v2", tid, func(c *event.Call) { c.Dst, c.Src, c.Bytes, c.Stream = dst, heap, mib, stream })
	}
	on(1, d0, 0x5a)
	on(2, d1, 0x5b)
	on(1, d0, 0)        // legacy default stream
	on(2, d0+64, 2)     // thread 2's per-thread default stream, on GPU 0's memory
	on(1, 0x1234, 0x5c) // not device memory: where thread 1's current device is
	got := w.e.StreamGPUs(testPID)
	want := map[uint64]string{0x5a: "0000:00:00.0", 0x5b: "0000:10:00.0", 0x5c: "0000:00:00.0", 0: "0000:00:00.0"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("StreamGPUs %v, want %v", got, want)
	}
	on(2, d1, 0) // the default streams now went to two GPUs: unknown
	if g, ok := w.e.StreamGPUs(testPID)[0]; ok {
		t.Errorf("default streams on two GPUs placed on %s", g)
	}
	if w.e.StreamGPUs(testPID+1) != nil {
		t.Error("an unknown process has streams")
	}
}
