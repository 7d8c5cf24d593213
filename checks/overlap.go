package checks

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
)

// Same-direction overlap is judged per GPU link, not per process
// (docs/design.md 1.1 "Paths, directions, movers"): every flow that crossed
// one direction of a GPU's link during the window — every process's copies
// and the RDMA requests into or out of that GPU's memory — with each
// transfer's real in-flight interval (correlate.SameDirectionOverlap).

// maxLinkSpans bounds the in-flight intervals a window keeps over all its
// links; past it, transfers are counted as dropped and the finding says so.
// Queued transfers that overlap in time share one interval
// (correlate.Flow.Add), so this counts stretches of flows, not copies.
const maxLinkSpans = 1 << 18

// linkFlowKey is one flow on one direction of one GPU link: a process's
// CUDA stream, an RDMA queue pair, or a transfer library's endpoint.
type linkFlowKey struct {
	gpu   string // the GPU the transfer names (Transfer.GPU); "" → the owner's placement
	owner uint32 // the process whose GPU memory it crossed into or out of
	dir   string // Inbound or Outbound
	pid   uint32 // the submitter
	id    uint64 // stream handle, QP number, or a transfer library's endpoint
	rdma  bool
	xfer  bool   // a transfer library's transfers (UCX, libfabric) on one endpoint
	kind  string // H2D, D2H, WRITE_IMM, RECV, …
}

func (k linkFlowKey) name() string {
	if k.xfer {
		return fmt.Sprintf("pid %d endpoint %#x %s", k.pid, k.id, k.kind)
	}
	if k.rdma {
		return fmt.Sprintf("pid %d QP %d %s", k.pid, k.id, k.kind)
	}
	return fmt.Sprintf("pid %d stream %#x %s", k.pid, k.id, k.kind)
}

// linkFlow is what a window keeps of one flow.
type linkFlow struct {
	correlate.Flow
	dropped int
}

// addLink adds one transfer to its flow on a GPU link; end 0 is a
// transfer without a proven completion, far one whose completion was
// proven far from it (correlate.Span.Far). Called with w.mu held.
func (w *Window) addLink(k linkFlowKey, start, end, bytes uint64, far bool) {
	w.addInflight(k, start, end, bytes, far)
	w.addLinkTo(w.linkFlow(k), start, end, bytes)
}

// linkFlow is flow k on its GPU link, created empty. Called with w.mu held.
func (w *Window) linkFlow(k linkFlowKey) *linkFlow {
	if w.links == nil {
		w.links = map[linkFlowKey]*linkFlow{}
	}
	f := w.links[k]
	if f == nil {
		f = &linkFlow{Flow: correlate.Flow{Name: k.name()}}
		w.links[k] = f
	}
	return f
}

// addLinkTo adds an interval to f, within the window's bound on intervals.
func (w *Window) addLinkTo(f *linkFlow, start, end, bytes uint64) {
	n := len(f.Spans)
	if end != 0 && w.linkSpans >= maxLinkSpans && (n == 0 || start > f.Spans[n-1].End) {
		f.dropped++ // would take a new interval past the bound
		return
	}
	f.Add(start, end, bytes)
	w.linkSpans += len(f.Spans) - n
}

// linkRDMA places an RDMA request on every GPU link it crosses (rdmaLanes);
// a request whose transfer names its GPU is placed there. Called with w.mu
// held.
func (w *Window) linkRDMA(t *correlate.Transfer) {
	if len(rdmaLanes(t)) == 0 { // on no GPU link: its in-flight is still measured (inflight.go)
		w.addInflight(linkFlowKey{owner: t.PID, pid: t.PID, id: uint64(t.QPNum), rdma: true, kind: t.Direction}, t.SubmitNs, t.CompleteNs, t.Bytes, false)
	}
	for i, l := range rdmaLanes(t) {
		gpu := ""
		if i == 0 && l.owner == t.PID {
			gpu = t.GPU // the poster's own GPU, when the record names it
		}
		w.addLink(linkFlowKey{gpu: gpu, owner: l.owner, dir: l.dir, pid: t.PID, id: uint64(t.QPNum), rdma: true, kind: t.Direction},
			t.SubmitNs, t.CompleteNs, t.Bytes, false) // a poll returns its own request's completion
	}
}

// rdmaLanes are the GPU links an RDMA request crosses, as the processes
// whose GPU memory it touches and the direction on each (seed 002 §3): its
// local side's GPU when the local memory is GPU memory (inbound when data
// arrives there: READ, RECV; else outbound), and the peer's when the remote
// memory is GPU memory of a process on this host (inbound for a WRITE,
// outbound for a READ). A GPU-to-GPU request crosses both.
func rdmaLanes(t *correlate.Transfer) (lanes []rdmaLane) {
	local, remote, into := t.Src, t.Dst, false
	switch t.Direction {
	case correlate.DirRDMARead:
		local, remote, into = t.Dst, t.Src, true
	case correlate.DirRecv:
		local, remote, into = t.Dst, correlate.Side{}, true
	case correlate.DirSend:
		remote = correlate.Side{} // the peer's receive buffer is not known here
	}
	if local.Mem == event.MemDevice {
		lanes = append(lanes, rdmaLane{t.PID, laneOf(into)})
	}
	if remote.Mem == event.MemDevice && t.PeerPID != 0 {
		lanes = append(lanes, rdmaLane{t.PeerPID, laneOf(!into)})
	}
	return lanes
}

// rdmaLane is one GPU link an RDMA request crosses: the process whose GPU
// memory it touches, and the direction.
type rdmaLane struct {
	owner uint32
	dir   string
}

func laneOf(into bool) string {
	if into {
		return Inbound
	}
	return Outbound
}

// AddCounterSample gives the window what a GPU's PCIe counters measured on
// one lane (Inbound, Outbound) over [start, end] (CLOCK_MONOTONIC ns), in
// bytes per second: the overlap rule takes the link's demand from the
// samples that fall inside the contended time.
func (w *Window) AddCounterSample(gpu, dir string, start, end uint64, bps float64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.counters == nil {
		w.counters = map[[2]string][]correlate.CounterSample{}
	}
	k := [2]string{gpu, dir}
	if len(w.counters[k]) < maxCounterSamples {
		w.counters[k] = append(w.counters[k], correlate.CounterSample{Start: start, End: end, Bps: bps})
	}
}

// maxCounterSamples bounds the samples a window keeps per lane (a sample a
// millisecond over a 10 s window fits twice over).
const maxCounterSamples = 1 << 15

// LinkOverlap is the judgement of one direction of one GPU link.
type LinkOverlap struct {
	GPU, Direction string
	Overlap        correlate.Overlap
	Finding        *correlate.Finding
}

// LinkOverlaps judges same-direction overlap on every GPU link the
// window's transfers crossed, each direction once. place names the GPU of
// a process whose transfers do not name theirs, and that link's capacity;
// capacity (nil: none) gives the per-direction capacity of a link no placed
// process names, 0 unknown; span is the window's length. unknown lists, by
// pid, why a process's transfers could not be placed on a link.
func (w *Window) LinkOverlaps(place func(uint32) Placement, capacity func(gpu string) float64, span time.Duration) (out []LinkOverlap, unknown map[uint32]string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	placeOf := PlaceOnce(place)
	type lane struct{ gpu, dir string }
	flows := map[lane][]linkFlowKey{}
	capacities := map[string][2]float64{}
	unknown = map[uint32]string{}
	for k := range w.links {
		gpu := k.gpu
		if pl := placeOf(k.owner); pl.GPU != "" {
			if gpu == "" || gpu == pl.GPU {
				gpu = pl.GPU
				if c := capacities[gpu]; c[0] == 0 && c[1] == 0 {
					capacities[gpu] = [2]float64{pl.InboundGBs, pl.OutboundGBs}
				}
			}
		} else if gpu == "" {
			unknown[k.owner] = pl.Why
			continue
		}
		flows[lane{gpu, k.dir}] = append(flows[lane{gpu, k.dir}], k)
	}
	lanes := slices.SortedFunc(maps.Keys(flows), func(a, b lane) int {
		return cmp.Or(cmp.Compare(a.gpu, b.gpu), cmp.Compare(a.dir, b.dir))
	})
	for _, l := range lanes {
		keys := flows[l]
		slices.SortFunc(keys, func(a, b linkFlowKey) int { return cmp.Compare(a.name(), b.name()) })
		t := correlate.LinkTraffic{Segment: "PCIe link of GPU " + l.gpu, Direction: l.dir, WindowNs: uint64(span.Nanoseconds()),
			Counters: w.counters[[2]string{l.gpu, l.dir}]}
		t.CapacityGBs = capacities[l.gpu][0]
		if l.dir == Outbound {
			t.CapacityGBs = capacities[l.gpu][1]
		}
		if t.CapacityGBs == 0 && capacity != nil {
			t.CapacityGBs = capacity(l.gpu)
		}
		for _, k := range keys {
			f := w.links[k]
			t.Flows = append(t.Flows, f.Flow)
			t.Dropped += f.dropped
		}
		o := correlate.MeasureOverlap(t)
		out = append(out, LinkOverlap{GPU: l.gpu, Direction: l.dir, Overlap: o, Finding: correlate.SameDirectionOverlap(o)})
	}
	return out, unknown
}

// OverlapChecks is the same-direction-overlap check of every GPU link the
// window's transfers crossed, one per link (scope "GPU <address>"), and a
// SKIP for each process whose transfers could not be placed on a link,
// with the reason. The arguments are LinkOverlaps'.
func (w *Window) OverlapChecks(place func(uint32) Placement, capacity func(gpu string) float64, span time.Duration) []Check {
	links, unknown := w.LinkOverlaps(place, capacity, span)
	var out []Check
	for i := 0; i < len(links); {
		gpu := links[i].GPU
		c := Check{Scope: "GPU " + gpu, Name: CheckOverlap, Status: Pass}
		var parts []string
		for ; i < len(links) && links[i].GPU == gpu; i++ {
			parts = append(parts, links[i].Overlap.Text())
			if f := links[i].Finding; f != nil {
				c.Findings = append(c.Findings, *f)
			}
		}
		c.Detail = strings.Join(parts, "; ")
		out = append(out, c)
	}
	for _, pid := range slices.Sorted(maps.Keys(unknown)) {
		out = append(out, Skipped(fmt.Sprintf("pid %d", pid), CheckOverlap, "%s", unknown[pid]))
	}
	return out
}

// PlaceOnce asks place about each process once: placing reads the
// process's environment and the PCI tree.
func PlaceOnce(place func(uint32) Placement) func(uint32) Placement {
	placed := map[uint32]Placement{}
	return func(pid uint32) Placement {
		pl, ok := placed[pid]
		if !ok {
			pl = place(pid)
			placed[pid] = pl
		}
		return pl
	}
}
