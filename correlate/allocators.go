package correlate

import (
	"slices"

	"github.com/lanewatch/lanewatch/event"
)

// Allocators beyond cuMemAlloc and cuMemHostAlloc (docs/design.md, "Late
// attach"): managed memory, stream-ordered allocations from memory pools,
// virtual memory management (VMM: physical allocations mapped into
// reserved address ranges) and the dma-buf fds device memory is exported
// as. Each places memory the registry must know: a copy from memory no
// probe placed is taken for pageable in a process observed from its start.

// rangeHandleDmabufFD is CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD (cuda.h 12.4),
// the handle type of cuMemGetHandleForAddressRange that gives a dma-buf fd.
const rangeHandleDmabufFD = 1

// memory gives a successful allocator call its effect on process p.
func (e *Engine) memory(p *proc, c *event.Call) {
	r, m := e.reg, p.mem
	switch c.Op {
	case event.OpManagedAlloc:
		r.add(m, &m.managed, c.Ptr, c.Size)
	case event.OpPoolAlloc:
		loc, known := m.pools[c.Handle]
		switch {
		case known:
		case m.obs == obsFromStart && !m.lossy:
			// A pool the process did not create while watched is a device's
			// default or current pool (cuDeviceGetDefaultMemPool,
			// cuDeviceGetMemPool: local to that device, cuda.h) — an
			// imported pool cannot allocate. Which device is not known.
			loc = event.Location{Type: event.LocDevice, ID: noDevice}
		default: // created before the agent looked: it may be a host pool
			loc = event.Location{}
		}
		e.place(p, c.Ptr, c.Size, loc)
	case event.OpPoolCreate:
		r.keep(m, &m.pools, c.Handle, c.Location)
	case event.OpPoolDestroy:
		delete(m.pools, c.Handle)
	case event.OpMemCreate:
		r.keep(m, &m.handles, c.Handle, c.Location)
	case event.OpMemRelease:
		delete(m.handles, c.Handle) // the memory lives on in its mappings
	case event.OpAddressReserve:
		if c.Ptr != 0 && c.Size != 0 {
			nr := span(c.Ptr, c.Size)
			i, j := m.reserved.overlapping(nr)
			if j == i && len(m.reserved) >= r.maxRanges {
				r.stats.RangeCapHits++
				m.markLossy(ReasonRangeCap)
				return
			}
			m.reserved = slices.Replace(m.reserved, i, j, nr)
		}
	case event.OpAddressFree:
		i, j := m.reserved.overlapping(span(c.Ptr, c.Size))
		m.reserved = slices.Delete(m.reserved, i, j)
	case event.OpMemMap:
		// A handle the agent did not see made was imported from another
		// process (cuMemImportFromShareableHandle) or made before it
		// looked: its memory may be a device's or the host's.
		loc := m.handles[c.Handle]
		e.place(p, c.Ptr, c.Size, loc)
	case event.OpMemUnmap:
		nr := span(c.Ptr, c.Size)
		for _, set := range [...]*rangeSet{&m.pinned, &m.device, &m.opaque, &m.stale} {
			if i, j := set.overlapping(nr); j > i {
				*set = slices.Delete(*set, i, j)
			}
		}
	case event.OpDmabufExport:
		if c.Flags != rangeHandleDmabufFD {
			return
		}
		kind, _ := m.lookup(c.Ptr)
		if kind != event.MemDevice && kind != event.MemPinned {
			kind = event.MemUnknown
		}
		if m.dmabufs == nil {
			m.dmabufs = map[uint32]dmabuf{}
		}
		if _, ok := m.dmabufs[uint32(c.Handle)]; !ok && len(m.dmabufs) >= r.maxRanges {
			r.stats.RangeCapHits++
			return // that fd's regions stay unknown
		}
		// An fd number is reused once closed (the agent does not see
		// close): the newest export under it wins.
		m.dmabufs[uint32(c.Handle)] = dmabuf{span(c.Ptr, c.Size), kind}
	}
}

// place records memory at [ptr, ptr+size) whose location is loc: device
// memory (with the device, when known, for the GPU of its copies), pinned
// host memory, or memory of a kind nobody can tell (an invalid location).
func (e *Engine) place(p *proc, ptr, size uint64, loc event.Location) {
	m := p.mem
	switch loc.Kind() {
	case event.MemDevice:
		e.reg.add(m, &m.device, ptr, size)
		dev := noDevice
		if loc.ID >= 0 {
			dev = loc.ID
		}
		p.dev.own(m, ptr, dev)
	case event.MemPinned:
		e.reg.add(m, &m.pinned, ptr, size)
	default:
		e.reg.add(m, &m.opaque, ptr, size)
	}
}

// keep remembers where the memory of a new handle or pool lives. Past the
// range cap nothing more is kept and the process is lossy: what a handle
// it did not keep maps is unknown, never pageable.
func (r *Registry) keep(m *procMem, tab *map[uint64]event.Location, h uint64, loc event.Location) {
	if *tab == nil {
		*tab = map[uint64]event.Location{}
	}
	if _, ok := (*tab)[h]; !ok && len(*tab) >= r.maxRanges {
		r.stats.RangeCapHits++
		m.markLossy(ReasonRangeCap)
		return
	}
	(*tab)[h] = loc
}

// free drops the allocation that starts at start, whatever kind it is:
// cuMemFree and cuMemFreeAsync free device, managed and pool memory (a
// host pool's is pinned).
func (r *Registry) free(m *procMem, start uint64) {
	for _, set := range m.sets() {
		if i := set.indexOfStart(start); i >= 0 {
			*set = slices.Delete(*set, i, i+1)
			return
		}
	}
	if i := m.stale.indexOfStart(start); i >= 0 { // registered before events were lost
		m.stale = slices.Delete(m.stale, i, i+1)
		return
	}
	r.stats.UnmatchedFrees++
}

// dmabufRegion classifies an RDMA memory region over the dma-buf fd of
// process pid from offset: the exported memory's kind when the fd is one
// the process exported and the region lies inside it, with the address
// its first byte has in the process; unknown otherwise.
func (r *Registry) dmabufRegion(pid uint32, fd uint32, offset, length uint64) (event.MemKind, uint64) {
	m := r.procs[pid]
	if m == nil {
		return event.MemUnknown, 0
	}
	d, ok := m.dmabufs[fd]
	if !ok || offset > d.End-d.Start || length > d.End-d.Start-offset {
		return event.MemUnknown, 0
	}
	return d.mem, d.Start + offset
}
