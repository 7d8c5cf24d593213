package checks

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/lanewatch/lanewatch/correlate"
)

// In-flight sufficiency (docs/design.md 7, "In flight"): every flow's
// operations one by one — a process's CUDA stream on one lane of a GPU
// link, an RDMA queue pair's requests of one kind on each GPU link they
// cross (or on none, between host memory) — each in flight from its
// submission to its proven completion (correlate.MeasureInFlight).

// CheckInFlight is the name of the in-flight sufficiency check.
const CheckInFlight = "in-flight sufficiency"

// maxInflightOps bounds the operations a window keeps for in-flight
// sufficiency over all its flows (24 bytes each); past it, operations are
// counted as dropped and the check says so.
const maxInflightOps = 1 << 18

// inflightWindow is what a window keeps for in-flight sufficiency.
type inflightWindow struct {
	flows   map[linkFlowKey]*[]correlate.Span
	ops     int
	dropped int
	// sizes are the operations each flow had in the previous window: a
	// flow's buffer is made that large at once, not grown op by op.
	sizes map[linkFlowKey]int
}

func (f *inflightWindow) sizeFrom(prev *inflightWindow) {
	f.sizes = make(map[linkFlowKey]int, len(prev.flows))
	for k, ops := range prev.flows {
		f.sizes[k] = len(*ops)
	}
}

// addInflight keeps one operation of a flow; end 0 is one without a
// proven completion, far one proven far from it. Called with w.mu held.
func (w *Window) addInflight(k linkFlowKey, start, end, bytes uint64, far bool) {
	if w.inflight.ops >= maxInflightOps {
		w.inflight.dropped++
		return
	}
	w.addInflightTo(w.inflightOps(k), start, end, bytes, far)
}

// inflightOps is flow k's operations, created empty. Called with w.mu held.
func (w *Window) inflightOps(k linkFlowKey) *[]correlate.Span {
	f := &w.inflight
	if f.flows == nil {
		f.flows = map[linkFlowKey]*[]correlate.Span{}
	}
	ops := f.flows[k]
	if ops == nil {
		ops = new([]correlate.Span)
		if n := f.sizes[k]; n > 0 {
			*ops = make([]correlate.Span, 0, n)
		}
		f.flows[k] = ops
	}
	return ops
}

// addInflightTo keeps one operation in ops, one of the window's flows.
func (w *Window) addInflightTo(ops *[]correlate.Span, start, end, bytes uint64, far bool) {
	f := &w.inflight
	if f.ops >= maxInflightOps {
		f.dropped++
		return
	}
	*ops = append(*ops, correlate.Span{Start: start, End: end, Bytes: bytes, Far: far && end > start})
	f.ops++
}

// FlowInFlight is one flow's in-flight measurement and judgement.
type FlowInFlight struct {
	// GPU and Direction are the lane (Inbound, Outbound); GPU "" when the
	// flow's GPU is unknown, Direction "" for RDMA on no GPU link.
	GPU, Direction string
	PID            uint32
	RDMA           bool
	ID             uint64 // the stream handle, the QP number, or the endpoint (InFlight.Xfer)
	Kind           string // H2D, D2H, RDMA_WRITE, …
	InFlight       correlate.InFlight
	Finding        *correlate.Finding
	// Skip says why the flow was not judged (its path's capacity unknown).
	Skip string
}

// LaneInFlight is one lane's window averages in flight, every flow on it.
type LaneInFlight struct {
	GPU, Direction   string
	AvgBytes, AvgOps float64 // time-weighted over the window
	Flows            int
}

// InFlightReport is the window's in-flight sufficiency.
type InFlightReport struct {
	Flows   []FlowInFlight
	Lanes   []LaneInFlight
	Dropped int // operations past the window's bound, not measured
}

// InFlights measures every flow of the window and judges
// too-little-in-flight on each whose path's capacity is known. place and
// capacity are LinkOverlaps'; span is the window's length, for the lanes'
// averages (0: each lane's own active span).
func (w *Window) InFlights(place func(uint32) Placement, capacity func(gpu string) float64, span time.Duration) InFlightReport {
	w.mu.Lock()
	defer w.mu.Unlock()
	placeOf := PlaceOnce(place)
	rep := InFlightReport{Dropped: w.inflight.dropped}
	type lane struct{ gpu, dir string }
	byLane := map[lane][]int{}
	capacities := map[lane]float64{}
	for _, k := range slices.SortedFunc(maps.Keys(w.inflight.flows), func(a, b linkFlowKey) int {
		return cmp.Or(cmp.Compare(a.dir, b.dir), cmp.Compare(a.gpu, b.gpu), cmp.Compare(a.name(), b.name()))
	}) {
		f := FlowInFlight{GPU: k.gpu, Direction: k.dir, PID: k.pid, RDMA: k.rdma, ID: k.id, Kind: k.kind,
			InFlight: correlate.MeasureInFlight(k.name(), k.rdma, *w.inflight.flows[k])}
		f.InFlight.Xfer = k.xfer
		if k.dir == "" {
			f.Skip = "on no GPU link (neither side is GPU memory): the NIC port's rate is not known here, so the path's capacity is unknown"
			rep.Flows = append(rep.Flows, f)
			continue
		}
		if pl := placeOf(k.owner); pl.GPU != "" && (f.GPU == "" || f.GPU == pl.GPU) {
			f.GPU = pl.GPU
			gbs := pl.InboundGBs
			if k.dir == Outbound {
				gbs = pl.OutboundGBs
			}
			if gbs > 0 && capacities[lane{f.GPU, k.dir}] == 0 {
				capacities[lane{f.GPU, k.dir}] = gbs
			}
		} else if f.GPU == "" {
			f.Skip = "GPU unknown: " + pl.Why
		}
		rep.Flows = append(rep.Flows, f)
		if f.GPU != "" {
			byLane[lane{f.GPU, k.dir}] = append(byLane[lane{f.GPU, k.dir}], len(rep.Flows)-1)
		}
	}
	for _, l := range slices.SortedFunc(maps.Keys(byLane), func(a, b lane) int { return cmp.Or(cmp.Compare(a.gpu, b.gpu), cmp.Compare(a.dir, b.dir)) }) {
		idx := byLane[l]
		gbs := capacities[l]
		if gbs == 0 && capacity != nil {
			gbs = capacity(l.gpu)
		}
		// The lane's averages count every proven operation, its
		// completion near or far: what was in flight, not its latency.
		li := LaneInFlight{GPU: l.gpu, Direction: l.dir, Flows: len(idx)}
		lo := w.laneInFlight(l.gpu, l.dir, placeOf)
		den := float64(span.Nanoseconds())
		if den <= 0 {
			den = float64(lo.last - lo.first)
		}
		if den > 0 {
			li.AvgBytes, li.AvgOps = lo.byteNs/den, lo.opNs/den
		}
		rep.Lanes = append(rep.Lanes, li)
		for _, i := range idx {
			f := &rep.Flows[i]
			f.InFlight.CapacityGBs = gbs
			f.InFlight.LaneBusyNs, f.InFlight.LaneByteNs = lo.busyNs, lo.byteNs
			if gbs == 0 {
				f.Skip = fmt.Sprintf("capacity of GPU %s's %s lane unknown", l.gpu, l.dir)
				continue
			}
			if !f.InFlight.LatencyBound() { // cheap tests first: the lane's rate only for a candidate
				continue
			}
			f.InFlight.LaneGBs, f.InFlight.LaneMeasured = w.laneRate(l.gpu, l.dir, f.InFlight.FirstNs, f.InFlight.LastNs, placeOf)
			f.Finding = correlate.TooLittleInFlight(f.InFlight, fmt.Sprintf("PCIe link of GPU %s (%s)", l.gpu, l.dir))
		}
	}
	return rep
}

// laneOps is what one lane had in flight over the window, every flow's
// proven operations (near or far): how long any was (busyNs), their bytes
// and count integrated over their time in flight, from the first
// submission to the last completion.
type laneOps struct {
	busyNs       uint64
	byteNs, opNs float64
	first, last  uint64
}

// laneInFlight measures one lane's operations. Called with w.mu held.
func (w *Window) laneInFlight(gpu, dir string, placeOf func(uint32) Placement) (lo laneOps) {
	var iv [][2]uint64
	for k, ops := range w.inflight.flows {
		g := k.gpu
		if pl := placeOf(k.owner); pl.GPU != "" && (g == "" || g == pl.GPU) {
			g = pl.GPU
		}
		if g != gpu || k.dir != dir {
			continue
		}
		for _, o := range *ops {
			if o.End > o.Start {
				iv = append(iv, [2]uint64{o.Start, o.End})
				lo.byteNs += float64(o.Bytes) * float64(o.End-o.Start)
				lo.opNs += float64(o.End - o.Start)
			}
		}
	}
	slices.SortFunc(iv, func(a, b [2]uint64) int { return cmp.Compare(a[0], b[0]) })
	var curS, curE uint64
	for i, x := range iv {
		switch {
		case i == 0:
			curS, curE, lo.first = x[0], x[1], x[0]
		case x[0] > curE:
			lo.busyNs += curE - curS
			curS, curE = x[0], x[1]
		default:
			curE = max(curE, x[1])
		}
		lo.last = max(lo.last, x[1])
	}
	if len(iv) > 0 {
		lo.busyNs += curE - curS
	}
	return lo
}

// laneRate is what one lane carried over [from, to]: every flow's bytes
// on it, each operation's spread evenly over its time in flight, or the
// GPU's counters where their samples cover most of that time (then the
// larger: the counters see movers no probe does). Called with w.mu held.
func (w *Window) laneRate(gpu, dir string, from, to uint64, placeOf func(uint32) Placement) (gbs float64, measured bool) {
	if to <= from {
		return 0, false
	}
	var bytes float64
	for k, ops := range w.inflight.flows {
		g := k.gpu
		if pl := placeOf(k.owner); pl.GPU != "" && (g == "" || g == pl.GPU) {
			g = pl.GPU
		}
		if g != gpu || k.dir != dir {
			continue
		}
		for _, o := range *ops {
			if o.End <= o.Start || o.End <= from || o.Start >= to {
				continue
			}
			in := min(o.End, to) - max(o.Start, from)
			bytes += float64(o.Bytes) * float64(in) / float64(o.End-o.Start)
		}
	}
	gbs = bytes / float64(to-from)
	var covered uint64
	var weighted float64
	for _, s := range w.counters[[2]string{gpu, dir}] {
		if s.End <= s.Start {
			continue
		}
		in := min(s.End, to) - min(max(s.Start, from), min(s.End, to))
		if float64(in) < counterInside*float64(s.End-s.Start) {
			continue
		}
		covered += in
		weighted += s.Bps / 1e9 * float64(in)
	}
	if float64(covered) >= counterCover*float64(to-from) && weighted/float64(covered) > gbs {
		return weighted / float64(covered), true
	}
	return gbs, false
}

// Shares of a counter sample and of the judged time (as the overlap rule
// takes them, correlate's counterInside and counterCover).
const (
	counterInside = 0.5
	counterCover  = 0.5
)

// InFlightChecks is the in-flight sufficiency check of every GPU lane the
// window's flows crossed (scope "GPU <address>"), and a SKIP for each
// process with flows that could not be judged, with the reasons. The
// arguments are InFlights'.
func (w *Window) InFlightChecks(place func(uint32) Placement, capacity func(gpu string) float64, span time.Duration) []Check {
	return w.InFlights(place, capacity, span).Checks()
}

// Checks turns the report into checks: one per GPU lane (its flows,
// largest first, at most 8 said), one SKIP per process and reason.
func (r InFlightReport) Checks() []Check {
	type lane struct{ gpu, dir string }
	flows := map[lane][]FlowInFlight{}
	skips := map[uint32]map[string][]string{}
	for _, f := range r.Flows {
		if f.Skip != "" {
			if skips[f.PID] == nil {
				skips[f.PID] = map[string][]string{}
			}
			skips[f.PID][f.Skip] = append(skips[f.PID][f.Skip], f.InFlight.Name)
			continue
		}
		flows[lane{f.GPU, f.Direction}] = append(flows[lane{f.GPU, f.Direction}], f)
	}
	var out []Check
	for _, l := range slices.SortedFunc(maps.Keys(flows), func(a, b lane) int { return cmp.Or(cmp.Compare(a.gpu, b.gpu), cmp.Compare(a.dir, b.dir)) }) {
		fs := flows[l]
		slices.SortStableFunc(fs, func(a, b FlowInFlight) int { return cmp.Compare(b.InFlight.Bytes, a.InFlight.Bytes) })
		c := Check{Scope: "GPU " + l.gpu, Name: CheckInFlight, Status: Pass}
		var parts []string
		for i, f := range fs {
			if i < 8 {
				parts = append(parts, f.InFlight.Text())
			}
			if f.Finding != nil {
				c.Findings = append(c.Findings, *f.Finding)
			}
		}
		if len(fs) > 8 {
			parts = append(parts, fmt.Sprintf("and %d more flows", len(fs)-8))
		}
		c.Detail = l.dir + ": " + strings.Join(parts, "; ")
		if r.Dropped > 0 {
			c.Detail += fmt.Sprintf(" (%d operations past the window's bound not measured)", r.Dropped)
		}
		out = append(out, c)
	}
	for _, pid := range slices.Sorted(maps.Keys(skips)) {
		for _, why := range slices.Sorted(maps.Keys(skips[pid])) {
			out = append(out, Skipped(fmt.Sprintf("pid %d", pid), CheckInFlight, "%s: %s", JoinLimited(skips[pid][why], 4), why))
		}
	}
	return out
}
