package agent

import (
	"fmt"
	"sort"
	"sync"

	"github.com/lanewatch/lanewatch/correlate"
)

// sample collects the transfers of a diagnose window and judges them per
// process: pageable copies, fragmentation, same-direction overlap.
type sample struct {
	mu    sync.Mutex
	procs map[uint32]*procSample
}

type procSample struct {
	transfers     int
	bytes         uint64
	pageable      int
	pageableBytes uint64
	pageableAPIs  []string
	unknown       int
	sizes         correlate.SizeHistogram
	first, last   uint64 // earliest submission, latest completion (ns)
	streams       map[streamDir]*busy
}

// streamDir is one stream's traffic in one direction: copies on one stream
// run one after another, so only different streams can overlap.
type streamDir struct {
	stream uint64
	dir    string
}

// busy is the interval a stream was moving bytes in one direction.
type busy struct {
	start, end uint64
	bytes      uint64
}

func newSample() *sample { return &sample{procs: map[uint32]*procSample{}} }

// Transfer implements correlate.Sink.
func (s *sample) Transfer(t *correlate.Transfer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.procs[t.PID]
	if p == nil {
		p = &procSample{streams: map[streamDir]*busy{}}
		s.procs[t.PID] = p
	}
	p.transfers++
	p.bytes += t.Bytes
	p.sizes.Add(t.Bytes)
	switch t.HostMem {
	case correlate.MemPageable:
		p.pageable++
		p.pageableBytes += t.Bytes
		if len(p.pageableAPIs) < 16 {
			p.pageableAPIs = append(p.pageableAPIs, t.API)
		}
	case correlate.MemUnknown:
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
	if t.Direction != correlate.DirH2D && t.Direction != correlate.DirD2H {
		return
	}
	k := streamDir{t.Stream, t.Direction}
	b := p.streams[k]
	if b == nil {
		p.streams[k] = &busy{start: t.SubmitNs, end: end, bytes: t.Bytes}
		return
	}
	b.start, b.end, b.bytes = min(b.start, t.SubmitNs), max(b.end, end), b.bytes+t.Bytes
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

	c = Check{Scope: scope, Name: "same-direction overlap", Status: Pass, Detail: "no two streams moved bytes in the same direction at the same time"}
	for _, dir := range []string{correlate.DirH2D, correlate.DirD2H} {
		o := overlap(p.streams, dir)
		if o.Transfers < 2 {
			continue
		}
		segDir := "inbound"
		if dir == correlate.DirD2H {
			segDir = "outbound"
		}
		o.Segment, o.Direction = "link of GPU "+gpu, segDir+" ("+dir+")"
		if dir == correlate.DirH2D {
			o.CapacityGBs = inboundGBs
		}
		if f := correlate.SameDirectionOverlap(o); f != nil {
			c.Findings = append(c.Findings, *f)
			c.Detail = fmt.Sprintf("%d streams overlapped in %s", o.Transfers, dir)
		}
	}
	return append(out, c)
}

// overlap finds the largest set of streams busy at once in one direction
// and their combined achieved rate.
func overlap(streams map[streamDir]*busy, dir string) correlate.Overlap {
	type edge struct {
		at    uint64
		delta int
		rate  float64
	}
	var edges []edge
	for k, b := range streams {
		if k.dir != dir || b.end <= b.start {
			continue
		}
		r := float64(b.bytes) / float64(b.end-b.start)
		edges = append(edges, edge{b.start, 1, r}, edge{b.end, -1, -r})
	}
	sort.Slice(edges, func(i, j int) bool {
		if edges[i].at != edges[j].at {
			return edges[i].at < edges[j].at
		}
		return edges[i].delta < edges[j].delta // an end before a start at the same instant
	})
	var o correlate.Overlap
	n, rate := 0, 0.0
	for _, e := range edges {
		n += e.delta
		rate += e.rate
		if n > o.Transfers {
			o.Transfers, o.DemandGBs = n, rate
		}
	}
	return o
}
