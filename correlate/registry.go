package correlate

import (
	"slices"

	"github.com/lanewatch/lanewatch/event"
)

// Range is a half-open address range [Start, End).
type Range struct {
	Start, End uint64
}

// Default caps of a Registry.
const (
	DefaultMaxRanges    = 1 << 16
	DefaultMaxProcesses = 1 << 15
)

// observation says what the agent could have seen of a process.
type observation uint8

const (
	obsNone      observation = iota // never told: nothing is provably pageable
	obsFromStart                    // every registration was seen
	obsSince                        // registrations before the snapshot may be missed
)

// rangeSet is a sorted slice of non-overlapping ranges.
type rangeSet []Range

// find returns the index of the range containing addr, or -1. It does not
// allocate.
func (s rangeSet) find(addr uint64) int {
	lo, hi := 0, len(s)
	for lo < hi { // first range whose start is > addr
		m := int(uint(lo+hi) >> 1)
		if s[m].Start <= addr {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo > 0 && addr < s[lo-1].End {
		return lo - 1
	}
	return -1
}

// overlapping returns [i, j): the ranges that intersect r.
func (s rangeSet) overlapping(r Range) (int, int) {
	lo, hi := 0, len(s)
	for lo < hi { // first range whose end is > r.Start (ends are sorted too)
		m := int(uint(lo+hi) >> 1)
		if s[m].End <= r.Start {
			lo = m + 1
		} else {
			hi = m
		}
	}
	j := lo
	for j < len(s) && s[j].Start < r.End {
		j++
	}
	return lo, j
}

// indexOfStart returns the index of the range starting exactly at start, or -1.
func (s rangeSet) indexOfStart(start uint64) int {
	i := s.find(start)
	if i >= 0 && s[i].Start == start {
		return i
	}
	return -1
}

// procMem is one process's memory map as the registry knows it.
type procMem struct {
	pinned, device rangeSet
	managed        rangeSet // managed (unified) allocations
	opaque         rangeSet // mapped memory of a kind the agent cannot know (a VMM handle it did not see made)
	reserved       rangeSet // VMM virtual address ranges: CUDA's, never pageable host memory
	obs            observation
	snapshot       rangeSet // obsSince: what was mapped when watching began
	lossy          bool     // a registration may have been missed (cap, lost events)
	lossWhy        string   // why lossy: ReasonEventsLost or ReasonRangeCap
	// stale holds the pinned and managed ranges registered before events
	// of the process were lost (MarkLossy): their free may have been
	// among them, so their addresses are unknown; kept for what the host
	// checks count (Pinned) until freed or replaced.
	stale rangeSet

	handles map[uint64]event.Location // VMM allocation handle → where its memory lives
	pools   map[uint64]event.Location // memory pool → where its allocations live
	dmabufs map[uint32]dmabuf         // dma-buf fd → the memory it exports
}

// dmabuf is the memory a dma-buf fd of the process exports
// (cuMemGetHandleForAddressRange).
type dmabuf struct {
	Range
	mem event.MemKind
}

// sets are the ranges of live memory, each of one kind: an address is in at
// most one of them.
func (m *procMem) sets() [4]*rangeSet {
	return [4]*rangeSet{&m.pinned, &m.device, &m.managed, &m.opaque}
}

// Why a side's memory is unknown (Side.Reason, Transfer.HostMemReason).
const (
	// ReasonEventsLost: the process lost probe events (a full ring buffer,
	// a call that was not reported, a read fault) since or before the
	// memory's registration could be seen, or after it, when its free may
	// have been lost (docs/design.md, "Ring buffer, wakeups, drops").
	ReasonEventsLost = "events_lost"
	// ReasonLateAttach: mapped before the agent watched the process.
	ReasonLateAttach = "late_attach"
	// ReasonNotObserved: the agent never learnt what it could see of the
	// process (neither its start nor a snapshot of its memory).
	ReasonNotObserved = "not_observed"
	// ReasonRangeCap: the registry's cap of ranges, handles or pools of
	// the process was hit.
	ReasonRangeCap = "range_cap"
	// ReasonVMMUnseen: mapped from a virtual-memory handle the agent did
	// not see made, or reserved address space with nothing mapped.
	ReasonVMMUnseen = "vmm_unseen"
	// ReasonUntracked: the process is past the engine's process cap.
	ReasonUntracked = "untracked"
)

// RegistryStats counts what a Registry could not keep.
type RegistryStats struct {
	RangeCapHits   uint64 // registrations dropped because a process hit MaxRanges
	ProcessCapHits uint64 // events of a process dropped because MaxProcesses was reached
	UnmatchedFrees uint64 // unregister/free of a range the registry did not hold
}

// Registry holds, per process, the pinned host ranges and the device ranges
// that are alive, and what the agent could have observed of each process. It
// is not safe for concurrent use.
type Registry struct {
	maxRanges, maxProcs int
	procs               map[uint32]*procMem
	stats               RegistryStats
}

// NewRegistry returns an empty registry. maxRanges caps the ranges of each
// kind per process and maxProcs the number of processes; 0 picks the
// defaults. A cap that is hit is counted, never silently exceeded.
func NewRegistry(maxRanges, maxProcs int) *Registry {
	if maxRanges <= 0 {
		maxRanges = DefaultMaxRanges
	}
	if maxProcs <= 0 {
		maxProcs = DefaultMaxProcesses
	}
	return &Registry{maxRanges: maxRanges, maxProcs: maxProcs, procs: map[uint32]*procMem{}}
}

// Stats returns the registry's counters.
func (r *Registry) Stats() RegistryStats { return r.stats }

// proc returns the process's map, creating it; nil (counted) when the
// process cap is reached.
func (r *Registry) proc(pid uint32) *procMem {
	if m := r.procs[pid]; m != nil {
		return m
	}
	if len(r.procs) >= r.maxProcs {
		r.stats.ProcessCapHits++
		return nil
	}
	m := &procMem{}
	r.procs[pid] = m
	return m
}

// ObservedFromStart says the process was started after the agent: every
// registration it makes is seen, so an unregistered host address is pageable.
func (r *Registry) ObservedFromStart(pid uint32) {
	if m := r.proc(pid); m != nil {
		m.obs, m.snapshot = obsFromStart, nil
	}
}

// ObservedSince says the agent began watching a running process whose
// address space then held snapshot (from /proc/PID/maps). An unregistered
// host address inside the snapshot may have been registered before we
// looked (unknown); one outside it was mapped later (pageable).
func (r *Registry) ObservedSince(pid uint32, snapshot []Range) {
	if m := r.proc(pid); m != nil {
		m.obs, m.snapshot = obsSince, normalize(snapshot)
	}
}

// MarkLossy says events of the process were lost (the ring buffer was
// full, a call went unreported): a registration may have been among them,
// so from now on no address of it is provably pageable, and a free or an
// unregistration may have been, so its pinned and managed ranges are no
// longer proven either (device ranges stay: the driver keeps their
// addresses for device memory). Either is proven again by a registration
// seen later. docs/design.md, "Ring buffer, wakeups, drops".
func (r *Registry) MarkLossy(pid uint32) {
	m := r.proc(pid)
	if m == nil {
		return
	}
	m.markLossy(ReasonEventsLost)
	if len(m.pinned)+len(m.managed) == 0 {
		return
	}
	stale := make(rangeSet, 0, len(m.stale)+len(m.pinned)+len(m.managed))
	stale = append(append(append(stale, m.stale...), m.pinned...), m.managed...)
	slices.SortFunc(stale, cmpStart)
	if len(stale) > r.maxRanges {
		r.stats.RangeCapHits += uint64(len(stale) - r.maxRanges) // only the host checks' pinned bytes lose them
		stale = stale[:r.maxRanges]
	}
	m.stale, m.pinned, m.managed = stale, m.pinned[:0], m.managed[:0]
}

// markLossy makes the process lossy for why; lost events outrank a cap.
func (m *procMem) markLossy(why string) {
	m.lossy = true
	if m.lossWhy == "" || why == ReasonEventsLost {
		m.lossWhy = why
	}
}

func cmpStart(a, b Range) int {
	switch {
	case a.Start < b.Start:
		return -1
	case a.Start > b.Start:
		return 1
	}
	return 0
}

// Forget drops everything known about the process.
func (r *Registry) Forget(pid uint32) { delete(r.procs, pid) }

// AddPinned records a pinned host range of the process.
func (r *Registry) AddPinned(pid uint32, start, size uint64) {
	if m := r.proc(pid); m != nil {
		r.add(m, &m.pinned, start, size)
	}
}

// AddDevice records a device allocation of the process.
func (r *Registry) AddDevice(pid uint32, start, size uint64) {
	if m := r.proc(pid); m != nil {
		r.add(m, &m.device, start, size)
	}
}

// RemovePinned drops the pinned range that starts at start.
func (r *Registry) RemovePinned(pid uint32, start uint64) {
	if m := r.procs[pid]; m != nil {
		r.unpin(m, start)
	} else {
		r.stats.UnmatchedFrees++
	}
}

// unpin drops the pinned range that starts at start: a live one, else one
// registered before the process lost events.
func (r *Registry) unpin(m *procMem, start uint64) {
	if m.pinned.indexOfStart(start) < 0 {
		if i := m.stale.indexOfStart(start); i >= 0 {
			m.stale = slices.Delete(m.stale, i, i+1)
			return
		}
	}
	r.remove(&m.pinned, start)
}

// RemoveDevice drops the device range that starts at start.
func (r *Registry) RemoveDevice(pid uint32, start uint64) {
	if m := r.procs[pid]; m != nil {
		r.remove(&m.device, start)
	} else {
		r.stats.UnmatchedFrees++
	}
}

// Lookup classifies one address of a process and returns the start of the
// range that holds it (0 when it is in none). It does not allocate.
func (r *Registry) Lookup(pid uint32, addr uint64) (event.MemKind, uint64) {
	m := r.procs[pid]
	if m == nil {
		return event.MemUnknown, 0
	}
	return m.lookup(addr)
}

func (m *procMem) lookup(addr uint64) (event.MemKind, uint64) {
	if i := m.pinned.find(addr); i >= 0 {
		return event.MemPinned, m.pinned[i].Start
	}
	if i := m.device.find(addr); i >= 0 {
		return event.MemDevice, m.device[i].Start
	}
	if i := m.managed.find(addr); i >= 0 {
		return event.MemManaged, m.managed[i].Start
	}
	if i := m.opaque.find(addr); i >= 0 {
		return event.MemUnknown, m.opaque[i].Start
	}
	if m.reserved.find(addr) >= 0 {
		return event.MemUnknown, 0 // CUDA's address space, nothing mapped that we know of
	}
	return m.unregistered(addr), 0
}

// kind is lookup without the range start; nil means an untracked process.
func (m *procMem) kind(addr uint64) event.MemKind {
	if m == nil {
		return event.MemUnknown
	}
	k, _ := m.lookup(addr)
	return k
}

// unknownWhy says why addr, which lookup found unknown, is: one of the
// Reason constants ("" when it is not unknown). m nil: an untracked process.
func (m *procMem) unknownWhy(addr uint64) string {
	switch {
	case m == nil:
		return ReasonUntracked
	case m.pinned.find(addr) >= 0, m.device.find(addr) >= 0, m.managed.find(addr) >= 0:
		return ""
	case m.opaque.find(addr) >= 0, m.reserved.find(addr) >= 0:
		return ReasonVMMUnseen
	case m.lossy:
		return m.lossWhy
	case m.obs == obsSince && m.snapshot.find(addr) >= 0:
		return ReasonLateAttach
	case m.obs == obsNone:
		return ReasonNotObserved
	}
	return ""
}

// unregistered applies the observation window to an address in no range.
func (m *procMem) unregistered(addr uint64) event.MemKind {
	if m.lossy {
		return event.MemUnknown
	}
	switch m.obs {
	case obsFromStart:
		return event.MemPageable
	case obsSince:
		if m.snapshot.find(addr) >= 0 {
			return event.MemUnknown
		}
		return event.MemPageable
	}
	return event.MemUnknown
}

// add inserts [start, start+size) into set, one of m.sets(). The same range
// again is a no-op (the runtime and the driver both report one
// registration); a range that overlaps others, of any kind, replaces them:
// the address space can only hold one live mapping, so the older ones were
// freed without us seeing it.
func (r *Registry) add(m *procMem, set *rangeSet, start, size uint64) {
	if size == 0 || start == 0 {
		return
	}
	nr := span(start, size)
	i, j := set.overlapping(nr)
	if j == i+1 && (*set)[i] == nr {
		return
	}
	for _, other := range m.sets() {
		if other == set {
			continue
		}
		if oi, oj := other.overlapping(nr); oj > oi {
			*other = slices.Delete(*other, oi, oj)
		}
	}
	if si, sj := m.stale.overlapping(nr); sj > si { // freed unseen: the new mapping proves it
		m.stale = slices.Delete(m.stale, si, sj)
	}
	if j == i && len(*set) >= r.maxRanges {
		r.stats.RangeCapHits++
		m.markLossy(ReasonRangeCap) // an unseen range makes "pageable" unprovable
		return
	}
	*set = slices.Replace(*set, i, j, nr)
}

// span is [start, start+size), clipped at the top of the address space.
func span(start, size uint64) Range {
	end := start + size
	if end < start {
		end = ^uint64(0)
	}
	return Range{start, end}
}

func (r *Registry) remove(set *rangeSet, start uint64) {
	if i := set.indexOfStart(start); i >= 0 {
		*set = slices.Delete(*set, i, i+1)
		return
	}
	r.stats.UnmatchedFrees++
}

// normalize copies ranges, sorted, with overlapping and touching ones merged.
func normalize(rs []Range) rangeSet {
	out := make(rangeSet, 0, len(rs))
	for _, r := range rs {
		if r.End > r.Start {
			out = append(out, r)
		}
	}
	slices.SortFunc(out, func(a, b Range) int {
		switch {
		case a.Start < b.Start:
			return -1
		case a.Start > b.Start:
			return 1
		}
		return 0
	})
	n := 0
	for _, r := range out {
		if n > 0 && r.Start <= out[n-1].End {
			out[n-1].End = max(out[n-1].End, r.End)
			continue
		}
		out[n] = r
		n++
	}
	return out[:n]
}

// Pinned returns a copy of the process's live pinned host ranges, with
// those registered before it lost events (managed ranges among them) that
// were not seen freed since: what the host checks count as pinned.
func (r *Registry) Pinned(pid uint32) []Range {
	m := r.procs[pid]
	if m == nil {
		return nil
	}
	if len(m.stale) == 0 {
		return append([]Range(nil), m.pinned...)
	}
	out := append(append([]Range(nil), m.pinned...), m.stale...)
	slices.SortFunc(out, cmpStart)
	return out
}

// PinnedPIDs lists the processes that hold pinned host ranges.
func (r *Registry) PinnedPIDs() []uint32 {
	var out []uint32
	for pid, m := range r.procs {
		if len(m.pinned)+len(m.stale) > 0 {
			out = append(out, pid)
		}
	}
	return out
}
