package correlate

import (
	"testing"

	"github.com/lanewatch/lanewatch/event"
)

// Addresses of the allocator tests, apart from the shared ones.
const (
	vmmVA   = 0x7d00_0000_0000 // a VMM reservation
	vmmLen  = 64 * mib
	managed = 0x7c00_0000_0000
	poolMem = 0x7b00_0000_0000 // stream-ordered allocations
	iova    = 0x10_0000        // how a dma-buf region's work requests address it
)

// allocCall is a call of sym at ts that returns at ts+1, with what an
// allocator call carries.
func allocCall(t *testing.T, sym string, ts, ptr, size, handle uint64, loc event.Location) *event.Call {
	t.Helper()
	c := mem(t, sym, 1, ts, ts+1, ptr, size)
	c.Handle, c.Location = handle, loc
	return c
}

var (
	onDevice = event.Location{Type: event.LocDevice, ID: 1}
	onHost   = event.Location{Type: event.LocHostNUMA, ID: 0}
)

// copyOne runs one copy of sym (Default for the unified entry points) on e
// and returns its transfer.
func copyOne(t *testing.T, e *Engine, s *collect, sym string, kind event.CopyKind, dst, src uint64) Transfer {
	t.Helper()
	s.got = s.got[:0]
	e.Handle(cp(t, sym, 1, 10_000, dst, src, 4096, kind, 0))
	e.Flush()
	if len(s.got) != 1 || s.got[0].Failed() {
		t.Fatalf("%s %#x→%#x: %+v", sym, src, dst, s.got)
	}
	return s.got[0]
}

type want struct {
	dir            string
	src, dst, host event.MemKind
}

func (w want) check(t *testing.T, what string, g Transfer) {
	t.Helper()
	if g.Direction != w.dir || g.Src.Mem != w.src || g.Dst.Mem != w.dst || g.HostMem != w.host {
		t.Errorf("%s: got %s src=%s dst=%s host=%q, want %s src=%s dst=%s host=%q", what,
			g.Direction, g.Src.Mem, g.Dst.Mem, g.HostMem, w.dir, w.src, w.dst, w.host)
	}
}

// VMM memory (cuMemCreate, cuMemAddressReserve, cuMemMap) is classified by
// where its allocation lives: device memory, pinned host memory, or unknown
// for a handle the agent did not see made. None of it is pageable.
func TestVMMMappings(t *testing.T) {
	e, s := newTest(t, Config{})
	e.ObservedFromStart(testPID)
	e.Handle(mem(t, "cudaHostAlloc", 1, 1, 2, pool, poolLen))
	e.Handle(allocCall(t, "cuMemAddressReserve", 10, vmmVA, vmmLen, 0, event.Location{}))
	e.Handle(allocCall(t, "cuMemCreate", 20, 0, 16*mib, 0xd1, onDevice))
	e.Handle(allocCall(t, "cuMemCreate", 30, 0, 16*mib, 0xd2, onHost))
	mapAt := func(ts, ptr, handle uint64) {
		c := allocCall(t, "cuMemMap", ts, ptr, 16*mib, handle, event.Location{})
		e.Handle(c)
	}
	mapAt(40, vmmVA, 0xd1)
	mapAt(50, vmmVA+16*mib, 0xd2)
	mapAt(60, vmmVA+32*mib, 0xbad)                                           // imported, or made before the agent looked
	e.Handle(allocCall(t, "cuMemRelease", 70, 0, 0, 0xd1, event.Location{})) // mapped memory lives on

	devVA, hostVA, opaqueVA, unmappedVA := uint64(vmmVA+mib), uint64(vmmVA+17*mib), uint64(vmmVA+33*mib), uint64(vmmVA+49*mib)
	// The shape: a Default copy from VMM device memory was taken for H2H.
	want{DirD2H, event.MemDevice, event.MemPinned, event.MemPinned}.check(t, "default from VMM device memory",
		copyOne(t, e, s, "cuMemcpyAsync", 0, pool, devVA))
	want{DirH2D, event.MemPinned, event.MemDevice, event.MemPinned}.check(t, "H2D from a host-located VMM allocation",
		copyOne(t, e, s, "cuMemcpyHtoDAsync_v2", 0, devVA, hostVA))
	want{DirH2D, event.MemUnknown, event.MemDevice, event.MemUnknown}.check(t, "H2D from an unknown handle's mapping",
		copyOne(t, e, s, "cuMemcpyHtoDAsync_v2", 0, devVA, opaqueVA))
	want{DirUnknown, event.MemUnknown, event.MemPinned, ""}.check(t, "default from reserved, unmapped space",
		copyOne(t, e, s, "cuMemcpyAsync", 0, pool, unmappedVA))
	if g := copyOne(t, e, s, "cuMemcpyHtoDAsync_v2", 0, devVA, unmappedVA); g.HostMem != event.MemUnknown {
		t.Errorf("H2D from reserved space: host memory %s, want unknown", g.HostMem)
	}

	// Unmapped, the range is reserved space again; freed, it is nobody's.
	e.Handle(allocCall(t, "cuMemUnmap", 80, vmmVA, 16*mib, 0, event.Location{}))
	want{DirUnknown, event.MemUnknown, event.MemPinned, ""}.check(t, "default from an unmapped range",
		copyOne(t, e, s, "cuMemcpyAsync", 0, pool, devVA))
	e.Handle(allocCall(t, "cuMemUnmap", 90, vmmVA+16*mib, 32*mib, 0, event.Location{}))
	e.Handle(allocCall(t, "cuMemAddressFree", 100, vmmVA, vmmLen, 0, event.Location{}))
	want{DirH2D, event.MemPageable, event.MemDevice, event.MemPageable}.check(t, "H2D from a freed reservation",
		copyOne(t, e, s, "cuMemcpyHtoDAsync_v2", 0, dev, hostVA))

	// A handle released, then mapped: the agent no longer knows its kind.
	e.Handle(allocCall(t, "cuMemAddressReserve", 110, vmmVA, vmmLen, 0, event.Location{}))
	mapAt(120, vmmVA, 0xd1)
	want{DirUnknown, event.MemUnknown, event.MemPinned, ""}.check(t, "a released handle mapped again",
		copyOne(t, e, s, "cuMemcpyAsync", 0, pool, vmmVA))
}

// A failed cuMemCreate or cuMemMap has no effect.
func TestVMMFailedCalls(t *testing.T) {
	e, s := newTest(t, Config{})
	e.ObservedFromStart(testPID)
	c := allocCall(t, "cuMemCreate", 20, 0, 16*mib, 0xd1, onDevice)
	c.Ret = 2 // CUDA_ERROR_OUT_OF_MEMORY
	e.Handle(c)
	e.Handle(allocCall(t, "cuMemMap", 30, vmmVA, 16*mib, 0xd1, event.Location{}))
	bad := allocCall(t, "cuMemMap", 40, vmmVA+16*mib, 16*mib, 0xd1, event.Location{})
	bad.Ret = 1
	e.Handle(bad)
	e.Flush()
	if len(s.got) != 2 || !s.got[0].Failed() || !s.got[1].Failed() || s.got[0].API != "cuMemCreate" || s.got[1].API != "cuMemMap" {
		t.Fatalf("the two failed calls are records with their errors: %+v", s.got)
	}
	g := copyOne(t, e, s, "cuMemcpyHtoDAsync_v2", 0, dev, vmmVA)
	if g.HostMem != event.MemUnknown {
		t.Errorf("mapping of a handle whose creation failed: %s, want unknown", g.HostMem)
	}
	if g := copyOne(t, e, s, "cuMemcpyHtoDAsync_v2", 0, dev, vmmVA+16*mib); g.HostMem != event.MemPageable {
		t.Errorf("a failed mapping placed memory: %s", g.HostMem)
	}
}

// Stream-ordered allocations: cuMemAllocAsync is device memory, a pool's
// allocations live where the pool does, and a pool the agent did not see
// made is a device's own pool only in a process watched from its start.
func TestPoolAllocations(t *testing.T) {
	for _, tc := range []struct {
		name    string
		late    bool
		sym     string
		pool    uint64
		created *event.Location
		want    want // of an H2D copy from the allocation
	}{
		{"cuMemAllocAsync", false, "cuMemAllocAsync", 0, nil, want{DirD2D, event.MemDevice, event.MemDevice, ""}},
		{"cudaMallocAsync via the runtime layer", false, "cudaMallocAsync_ptsz", 0, nil, want{DirD2D, event.MemDevice, event.MemDevice, ""}},
		{"device pool", false, "cuMemAllocFromPoolAsync", 0xa1, &onDevice, want{DirD2D, event.MemDevice, event.MemDevice, ""}},
		{"host pool", false, "cuMemAllocFromPoolAsync_ptsz", 0xa2, &onHost, want{DirH2D, event.MemPinned, event.MemDevice, event.MemPinned}},
		{"a pool not seen made: a device's", false, "cuMemAllocFromPoolAsync", 0xa3, nil, want{DirD2D, event.MemDevice, event.MemDevice, ""}},
		{"late attach, a pool not seen made: unknown", true, "cuMemAllocFromPoolAsync", 0xa3, nil, want{DirUnknown, event.MemUnknown, event.MemDevice, ""}},
		{"late attach, a pool made after", true, "cuMemAllocFromPoolAsync", 0xa2, &onHost, want{DirH2D, event.MemPinned, event.MemDevice, event.MemPinned}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, s := newTest(t, Config{})
			if tc.late {
				e.ObservedSince(testPID, []Range{{heap, heap + mib}})
			} else {
				e.ObservedFromStart(testPID)
			}
			e.Handle(mem(t, "cuMemAlloc_v2", 1, 1, 2, dev, devLen))
			if tc.created != nil {
				e.Handle(allocCall(t, "cuMemPoolCreate", 10, 0, 0, tc.pool, *tc.created))
			}
			a := allocCall(t, tc.sym, 20, poolMem, 8*mib, tc.pool, event.Location{})
			e.Handle(a)
			// A Default copy from the allocation into device memory.
			tc.want.check(t, "default copy from it", copyOne(t, e, s, "cuMemcpyAsync", 0, dev, poolMem+mib))
			free := "cuMemFreeAsync"
			if tc.sym[0:4] == "cuda" {
				free = "cudaFreeAsync_ptsz"
			}
			e.Handle(mem(t, free, 1, 30, 31, poolMem, 0))
			want{DirH2D, event.MemPageable, event.MemDevice, event.MemPageable}.check(t, "after the free",
				copyOne(t, e, s, "cuMemcpyHtoDAsync_v2", 0, dev, poolMem+mib))
			if st := e.Stats(); st.UnmatchedFrees != 0 {
				t.Errorf("unmatched frees %d", st.UnmatchedFrees)
			}
		})
	}
	// A destroyed pool is forgotten.
	e, s := newTest(t, Config{})
	e.ObservedFromStart(testPID)
	e.Handle(mem(t, "cuMemAlloc_v2", 1, 1, 2, dev, devLen))
	e.Handle(allocCall(t, "cuMemPoolCreate", 10, 0, 0, 0xa2, onHost))
	e.Handle(allocCall(t, "cuMemPoolDestroy", 11, 0, 0, 0xa2, event.Location{}))
	e.Handle(allocCall(t, "cuMemAllocFromPoolAsync", 20, poolMem, 8*mib, 0xa2, event.Location{}))
	want{DirD2D, event.MemDevice, event.MemDevice, ""}.check(t, "a destroyed pool's handle", copyOne(t, e, s, "cuMemcpyAsync", 0, dev, poolMem))
}

// Managed memory is its own kind, never pageable: an explicit copy keeps
// its stated direction, a Default copy's direction is unknown (its pages
// may be on either side when it runs). cuMemFree frees it.
func TestManagedMemory(t *testing.T) {
	e, s := newTest(t, Config{})
	e.ObservedFromStart(testPID)
	e.Handle(mem(t, "cuMemAlloc_v2", 1, 1, 2, dev, devLen))
	e.Handle(mem(t, "cudaHostAlloc", 1, 3, 4, pool, poolLen))
	e.Handle(mem(t, "cuMemAllocManaged", 1, 10, 11, managed, 32*mib))
	want{DirH2D, event.MemManaged, event.MemDevice, event.MemManaged}.check(t, "explicit H2D",
		copyOne(t, e, s, "cuMemcpyHtoDAsync_v2", 0, dev, managed+mib))
	want{DirD2H, event.MemDevice, event.MemManaged, event.MemManaged}.check(t, "explicit D2H",
		copyOne(t, e, s, "cuMemcpyDtoH_v2", 0, managed, dev))
	want{DirUnknown, event.MemManaged, event.MemDevice, ""}.check(t, "default to device",
		copyOne(t, e, s, "cuMemcpyAsync", 0, dev, managed))
	want{DirUnknown, event.MemPinned, event.MemManaged, ""}.check(t, "default from pinned",
		copyOne(t, e, s, "cuMemcpy", 0, managed, pool))
	e.Handle(mem(t, "cuMemFree_v2", 1, 20, 21, managed, 0))
	want{DirH2D, event.MemPageable, event.MemDevice, event.MemPageable}.check(t, "after cuMemFree",
		copyOne(t, e, s, "cuMemcpyHtoDAsync_v2", 0, dev, managed+mib))
	if st := e.Stats(); st.UnmatchedFrees != 0 {
		t.Errorf("unmatched frees %d", st.UnmatchedFrees)
	}
}

// A Default copy (cudaMemcpyDefault, cuMemcpy*, 2D copies with a unified
// side, batch entries) is placed by its pointers: one the registry cannot
// place gives an unknown direction, never H2H.
func TestDefaultCopyUnknownPointer(t *testing.T) {
	late := func(e *Engine) { e.ObservedSince(testPID, []Range{{heap, heap + mib}, {dev + devLen, dev + 2*devLen}}) }
	for _, tc := range []struct {
		name  string
		watch func(e *Engine)
	}{
		{"late attach", late},
		{"never told", func(*Engine) {}},
		{"lossy", func(e *Engine) { e.ObservedFromStart(testPID); e.EventsLost() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, s := newTest(t, Config{})
			tc.watch(e)
			e.Handle(mem(t, "cudaHostAlloc", 1, 1, 2, pool, poolLen))
			for _, sym := range []string{"cudaMemcpyAsync", "cuMemcpyAsync", "cuMemcpy_ptds"} {
				for _, pair := range [][2]uint64{{pool, heap}, {heap, pool}, {heap, heap + 4096}, {pool, dev + devLen}} {
					g := copyOne(t, e, s, sym, event.CopyDefault, pair[0], pair[1])
					if g.Direction != DirUnknown || g.HostMem != "" {
						t.Errorf("%s %#x→%#x: %s host %q, want unknown", sym, pair[1], pair[0], g.Direction, g.HostMem)
					}
				}
			}
			// A 2D copy with a unified side decodes to Default.
			c := cp(t, "cuMemcpy2DAsync_v2", 1, 20_000, pool, heap, 4096, 0, 0)
			c.CopyKind = event.CopyDefault
			s.got = s.got[:0]
			e.Handle(c)
			// Batch entries are Default.
			b := cp(t, "cuMemcpyBatchAsync", 1, 30_000, heap, pool, 4096, 0, 0)
			b.Kind = event.KindBatchEntry
			e.Handle(b)
			e.Flush()
			if len(s.got) != 2 {
				t.Fatalf("2D and batch: %+v", s.got)
			}
			for _, g := range s.got {
				if g.Direction != DirUnknown {
					t.Errorf("%s: %s, want unknown", g.API, g.Direction)
				}
			}
		})
	}
}

// A process running before the agent attached: non-pinned host memory
// mapped before it looked is unknown, memory mapped after is pageable
// (docs/design.md, "Late attach").
func TestLateAttachPageable(t *testing.T) {
	e, s := newTest(t, Config{})
	e.ObservedSince(testPID, []Range{{heap, heap + 64*mib}})
	e.Handle(mem(t, "cuMemAlloc_v2", 1, 1, 2, dev, devLen))
	want{DirH2D, event.MemUnknown, event.MemDevice, event.MemUnknown}.check(t, "mapped before",
		copyOne(t, e, s, "cuMemcpyHtoDAsync_v2", 0, dev, heap+mib))
	want{DirD2H, event.MemDevice, event.MemUnknown, event.MemUnknown}.check(t, "mapped before, D2H",
		copyOne(t, e, s, "cuMemcpyDtoHAsync_v2", 0, heap, dev))
	want{DirH2D, event.MemPageable, event.MemDevice, event.MemPageable}.check(t, "mapped after",
		copyOne(t, e, s, "cuMemcpyHtoDAsync_v2", 0, dev, heap+64*mib))
}

// An RDMA memory region is what the registry placed it as: pinned host
// memory, device memory (GPUDirect), managed memory; over memory it did
// not place the region is unknown — registering pins host memory, but the
// region may be device memory (nvidia-peermem) the agent never saw made.
func TestRDMARegionKinds(t *testing.T) {
	for _, tc := range []struct {
		name  string
		watch func(e *Engine)
		addr  uint64
		want  event.MemKind
	}{
		{"pinned", func(e *Engine) { e.ObservedFromStart(testPID) }, pool + mib, event.MemPinned},
		{"device", func(e *Engine) { e.ObservedFromStart(testPID) }, dev, event.MemDevice},
		{"managed", func(e *Engine) { e.ObservedFromStart(testPID) }, managed, event.MemManaged},
		{"unplaced, watched from the start", func(e *Engine) { e.ObservedFromStart(testPID) }, heap, event.MemUnknown},
		{"unplaced, late attach", func(e *Engine) { e.ObservedSince(testPID, []Range{{heap, heap + mib}}) }, heap, event.MemUnknown},
		{"VMM host allocation", func(e *Engine) { e.ObservedFromStart(testPID) }, vmmVA, event.MemPinned},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, s := newTest(t, Config{})
			tc.watch(e)
			e.Handle(mem(t, "cudaHostAlloc", 1, 1, 2, pool, poolLen))
			e.Handle(mem(t, "cuMemAlloc_v2", 1, 3, 4, dev, devLen))
			e.Handle(mem(t, "cuMemAllocManaged", 1, 5, 6, managed, 32*mib))
			e.Handle(allocCall(t, "cuMemCreate", 7, 0, 16*mib, 0xd2, onHost))
			e.Handle(allocCall(t, "cuMemMap", 8, vmmVA, 16*mib, 0xd2, event.Location{}))
			g := postOne(t, e, s, regMR(t, tc.addr, 0), tc.addr)
			if g.Src.Mem != tc.want || (tc.want != event.MemDevice && g.HostMem != tc.want) {
				t.Errorf("region %s, host %q, want %s", g.Src.Mem, g.HostMem, tc.want)
			}
		})
	}
}

// regMR is an ibv_reg_mr_iova2 of 1 MiB at addr of testPID, lkey 0x11.
func regMR(t *testing.T, addr, _ uint64) *event.Call {
	return call(t, "ibv_reg_mr_iova2", event.Call{Kind: event.KindCall, PID: testPID, TID: 1, Time: 50, ReturnTime: 51,
		Ptr: addr, Size: mib, RDMA: event.RDMA{MR: 0xe1, LKey: 0x11, RKey: 0x12}})
}

// postOne registers mr and posts one RDMA_WRITE from local through it,
// then returns the work request's record.
func postOne(t *testing.T, e *Engine, s *collect, mr *event.Call, local uint64) Transfer {
	t.Helper()
	e.Handle(mr)
	s.got = s.got[:0]
	e.Handle(call(t, "provider:post_send", event.Call{Kind: event.KindWR, PID: testPID, TID: 1, Time: 100, Bytes: 4096,
		RDMA: event.RDMA{QPNum: 5, WRID: 1, Opcode: 0, SendFlags: 2, Local: local, LKey: mr.RDMA.LKey, NumSGE: 1,
			RemoteAddr: 0x9000, RKey: 0x99}}))
	e.Flush()
	if len(s.got) != 1 {
		t.Fatalf("%d records", len(s.got))
	}
	return s.got[0]
}

// ibv_reg_dmabuf_mr registers the memory of a dma-buf fd: device memory
// when the process exported it with cuMemGetHandleForAddressRange and the
// region lies inside the export; unknown for any other fd, a region past
// the export, another handle type or memory the registry cannot place.
func TestDmabufRegions(t *testing.T) {
	const fd = 7
	dmabufMR := func(fd, offset, length uint64) *event.Call {
		c := call(t, "ibv_reg_dmabuf_mr", event.Call{Kind: event.KindCall, PID: testPID, TID: 1, Time: 50, ReturnTime: 51,
			Ptr: iova, Size: length, Handle: fd, Offset: offset, RDMA: event.RDMA{MR: 0xe2, LKey: 0x21, RKey: 0x22, Dmabuf: true}})
		return c
	}
	export := func(e *Engine, fd, ptr, size, typ uint64) {
		c := mem(t, "cuMemGetHandleForAddressRange", 1, 10, 11, ptr, size)
		c.Handle, c.Flags = fd, typ
		e.Handle(c)
	}
	for _, tc := range []struct {
		name   string
		setup  func(e *Engine)
		mr     *event.Call
		want   event.MemKind
		devOff uint64
	}{
		{"exported device memory", func(e *Engine) { export(e, fd, dev, 64*mib, 1) }, dmabufMR(fd, 2*mib, 4*mib), event.MemDevice, 2 * mib},
		{"an fd the process did not export", func(e *Engine) { export(e, fd, dev, 64*mib, 1) }, dmabufMR(fd+1, 0, 4*mib), event.MemUnknown, 0},
		{"past the export", func(e *Engine) { export(e, fd, dev, 4*mib, 1) }, dmabufMR(fd, 2*mib, 4*mib), event.MemUnknown, 0},
		{"not a dma-buf handle", func(e *Engine) { export(e, fd, dev, 64*mib, 0) }, dmabufMR(fd, 0, 4*mib), event.MemUnknown, 0},
		{"memory the registry cannot place", func(e *Engine) { export(e, fd, heap, 64*mib, 1) }, dmabufMR(fd, 0, 4*mib), event.MemUnknown, 0},
		{"the newest export of a reused fd", func(e *Engine) { export(e, fd, heap, 64*mib, 1); export(e, fd, dev, 64*mib, 1) },
			dmabufMR(fd, 0, 4*mib), event.MemDevice, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, s := newTest(t, Config{})
			e.ObservedFromStart(testPID)
			e.Handle(mem(t, "cuMemAlloc_v2", 1, 3, 4, dev, devLen))
			tc.setup(e)
			g := postOne(t, e, s, tc.mr, iova+4096)
			if g.Src.Mem != tc.want || g.Src.Addr != iova+4096 {
				t.Errorf("region %s at %#x, want %s at %#x", g.Src.Mem, g.Src.Addr, tc.want, iova+4096)
			}
			if tc.want == event.MemDevice {
				mr := e.rdma.byLKey[pidPtr{testPID, 0x21}]
				if got := mr.at(iova + 4096); got != dev+tc.devOff+4096 {
					t.Errorf("the region's byte at iova+4096 is %#x in the process, want %#x", got, dev+tc.devOff+4096)
				}
			}
		})
	}
}
