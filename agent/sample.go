package agent

import (
	"fmt"
	"sort"
	"sync"

	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
)

// sample collects the transfers of a diagnose window and judges them per
// process: pageable copies, fragmentation, same-direction overlap.
type sample struct {
	mu    sync.Mutex
	procs map[uint32]*procSample
	rdmas []correlate.Transfer // completed work requests, for latency trends (bounded)
	// measured is what GPU counters say crossed each lane ("gpu\x00dir" →
	// bytes/s); the overlap rule prefers it to the probes' own sum.
	measured map[string]float64
}

// maxRDMAKept bounds the work requests a window keeps for latency.
const maxRDMAKept = 1 << 16

type procSample struct {
	transfers     int
	bytes         uint64
	pageable      int
	pageableBytes uint64
	pageableAPIs  []string
	unknown       int
	sizes         correlate.SizeHistogram
	first, last   uint64            // earliest submission, latest completion (ns)
	flows         map[flowKey]*busy // flows on this process's GPU link, its own and its peers'
}

// flowKey is one flow on one lane of a GPU's link: a CUDA stream's copies
// (one after another, so only different flows can overlap) or an RDMA queue
// pair's requests.
type flowKey struct {
	pid    uint32
	stream uint64 // CUDA stream handle, or the QP number for RDMA
	rdma   bool
	kind   string // H2D, D2H, RDMA_WRITE, …
	dir    string // the GPU link's lane: "inbound" or "outbound"
}

// busy is the interval a flow was moving bytes.
type busy struct {
	start, end uint64
	bytes      uint64
}

const (
	laneIn  = "inbound"
	laneOut = "outbound"
)

func newSample() *sample { return &sample{procs: map[uint32]*procSample{}} }

func (s *sample) proc(pid uint32) *procSample {
	p := s.procs[pid]
	if p == nil {
		p = &procSample{flows: map[flowKey]*busy{}}
		s.procs[pid] = p
	}
	return p
}

// Transfer implements correlate.Sink.
func (s *sample) Transfer(t *correlate.Transfer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t.QPNum != 0 || t.Op == "post_send" || t.Op == "post_recv" {
		s.rdma(t)
		return
	}
	p := s.proc(t.PID)
	p.transfers++
	p.bytes += t.Bytes
	p.sizes.Add(t.Bytes)
	switch t.HostMem {
	case event.MemPageable:
		p.pageable++
		p.pageableBytes += t.Bytes
		if len(p.pageableAPIs) < 16 {
			p.pageableAPIs = append(p.pageableAPIs, t.API)
		}
	case event.MemUnknown:
		p.unknown++
	}
	end := t.CompleteNs
	if end == 0 {
		end = t.SubmitNs
	}
	if p.first == 0 || t.SubmitNs < p.first {
		p.first = t.SubmitNs
	}
	p.last = max(p.last, end)
	switch t.Direction {
	case correlate.DirH2D:
		p.addFlow(flowKey{pid: t.PID, stream: t.Stream, kind: t.Direction, dir: laneIn}, t.SubmitNs, end, t.Bytes)
	case correlate.DirD2H:
		p.addFlow(flowKey{pid: t.PID, stream: t.Stream, kind: t.Direction, dir: laneOut}, t.SubmitNs, end, t.Bytes)
	}
}

// rdma places an RDMA request on the GPU link it crosses: data written
// into a peer's GPU memory is inbound there; read into or received by this
// process's GPU memory is inbound here; written or sent from it, outbound.
func (s *sample) rdma(t *correlate.Transfer) {
	if t.CompleteNs == 0 || t.Status != "success" {
		return
	}
	if len(s.rdmas) < maxRDMAKept {
		s.rdmas = append(s.rdmas, *t)
	}
	k := flowKey{pid: t.PID, stream: uint64(t.QPNum), rdma: true, kind: t.Direction}
	owner := uint32(0)
	switch {
	case t.Dst.Mem == event.MemDevice && (t.Direction == correlate.DirRDMAWrite || t.Direction == correlate.DirWriteImm):
		owner, k.dir = t.PeerPID, laneIn
	case t.Dst.Mem == event.MemDevice: // READ or RECV into this process's GPU
		owner, k.dir = t.PID, laneIn
	case t.Src.Mem == event.MemDevice:
		owner, k.dir = t.PID, laneOut
	}
	if owner == 0 {
		return
	}
	s.proc(owner).addFlow(k, t.SubmitNs, t.CompleteNs, t.Bytes)
}

func (p *procSample) addFlow(k flowKey, start, end, bytes uint64) {
	b := p.flows[k]
	if b == nil {
		p.flows[k] = &busy{start: start, end: end, bytes: bytes}
		return
	}
	b.start, b.end, b.bytes = min(b.start, start), max(b.end, end), b.bytes+bytes
}

// pids lists the processes that transferred during the window.
func (s *sample) pids() []uint32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []uint32
	for pid := range s.procs {
		out = append(out, pid)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// checks judges one process's window. gpu names the GPU it feeds and
// inboundGBs is that GPU's inbound link capacity (0 when unknown).
func (s *sample) checks(scope string, pid uint32, gpu string, inboundGBs float64) []Check {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.procs[pid]
	if p == nil {
		return []Check{
			skipf(scope, "pageable copies", "no transfer seen in the sample window"),
			skipf(scope, "fragmentation", "no transfer seen in the sample window"),
			skipf(scope, "same-direction overlap", "no transfer seen in the sample window"),
		}
	}
	var out []Check
	c := Check{Scope: scope, Name: "pageable copies", Status: Pass,
		Detail: fmt.Sprintf("%d transfers, none from pageable memory", p.transfers)}
	if f := correlate.PageableCopies(pid, p.pageable, p.pageableBytes, p.pageableAPIs); f != nil {
		c.Detail = fmt.Sprintf("%d of %d transfers used pageable host memory", p.pageable, p.transfers)
		c.Findings = []correlate.Finding{*f}
	} else if p.unknown > 0 {
		c.Detail += fmt.Sprintf(" (%d from memory registered before lanewatch attached: unknown)", p.unknown)
	}
	out = append(out, c)

	rate := 0.0
	if p.last > p.first {
		rate = float64(p.bytes) / float64(p.last-p.first) // bytes per ns = GB/s
	}
	c = Check{Scope: scope, Name: "fragmentation", Status: Pass,
		Detail: fmt.Sprintf("%d transfers, %.2f GB/s achieved; sizes %s", p.transfers, rate, p.sizes.String())}
	if f := correlate.Fragmentation(pid, p.sizes, rate); f != nil {
		c.Findings = []correlate.Finding{*f}
	}
	out = append(out, c)

	c = p.overlapCheck(scope, gpu, inboundGBs)
	if m, ok := s.measured[gpu+"\x00"+laneIn]; ok {
		// Counters saw what crossed the link, probed or not.
		if o := overlap(p.flows, laneIn); o.Transfers >= 2 {
			o.Segment, o.Direction, o.CapacityGBs, o.DemandGBs = "PCIe link of GPU "+gpu, laneIn, inboundGBs, m/1e9
			c = Check{Scope: scope, Name: c.Name, Status: Pass, Detail: c.Detail}
			if f := correlate.SameDirectionOverlap(o); f != nil {
				f.Evidence = append(f.Evidence, "demand measured by the GPU's PCIe counters")
				c.Findings, c.Detail = []correlate.Finding{*f}, fmt.Sprintf("%d flows overlapped inbound", o.Transfers)
			}
		}
	}
	return append(out, c)
}

// overlapCheck looks for flows that shared one lane of the process's GPU
// link at the same time (seed 000: contention only on the same segment in
// the same direction).
func (p *procSample) overlapCheck(scope, gpu string, capacityGBs float64) Check {
	c := Check{Scope: scope, Name: "same-direction overlap", Status: Pass,
		Detail: "no two flows moved bytes in the same direction of the GPU link at the same time"}
	for _, dir := range []string{laneIn, laneOut} {
		o := overlap(p.flows, dir)
		if o.Transfers < 2 {
			continue
		}
		o.Segment, o.Direction = "PCIe link of GPU "+gpu, dir
		o.CapacityGBs = capacityGBs
		if f := correlate.SameDirectionOverlap(o); f != nil {
			c.Findings = append(c.Findings, *f)
			c.Detail = fmt.Sprintf("%d flows overlapped %s", o.Transfers, dir)
		}
	}
	return c
}

// overlap finds the largest set of flows busy at once on one lane, their
// combined achieved rate, and names them.
func overlap(flows map[flowKey]*busy, dir string) correlate.Overlap {
	type edge struct {
		at    uint64
		delta int
		rate  float64
		name  string
	}
	var edges []edge
	for k, b := range flows {
		if k.dir != dir || b.end <= b.start {
			continue
		}
		r := float64(b.bytes) / float64(b.end-b.start)
		name := fmt.Sprintf("pid %d stream %#x %s", k.pid, k.stream, k.kind)
		if k.rdma {
			name = fmt.Sprintf("pid %d QP %d %s", k.pid, k.stream, k.kind)
		}
		edges = append(edges, edge{b.start, 1, r, name}, edge{b.end, -1, -r, name})
	}
	sort.Slice(edges, func(i, j int) bool {
		if edges[i].at != edges[j].at {
			return edges[i].at < edges[j].at
		}
		return edges[i].delta < edges[j].delta // an end before a start at the same instant
	})
	var o correlate.Overlap
	n, rate := 0, 0.0
	live := map[string]bool{}
	for _, e := range edges {
		n += e.delta
		rate += e.rate
		live[e.name] = e.delta > 0
		if n > o.Transfers {
			o.Transfers, o.DemandGBs = n, rate
			o.Flows = o.Flows[:0]
			for name, on := range live {
				if on {
					o.Flows = append(o.Flows, name)
				}
			}
			sort.Strings(o.Flows)
		}
	}
	return o
}
