package correlate

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// Same-direction overlap (seed 000, 核心抽象 rule 2 and L2→L1 #5;
// docs/design.md 1.1 "Paths, directions, movers"): transfers contend for a
// link's bandwidth only on the same segment in the same direction, and only
// while they are in flight together. The rule is judged per direction of
// one GPU link, over every flow that crossed it — every process's copies and
// the RDMA requests into or out of that GPU's memory — with each transfer's
// real in-flight interval, from its submission to the completion that
// proved it done (docs/design.md 4, "Completion and layers").

// Span is one transfer's in-flight interval on a link, CLOCK_MONOTONIC ns:
// submitted at Start, proven complete at End (an upper bound), and the
// bytes it moved. Nothing says how the bytes spread inside the interval, so
// the rule spreads them evenly: a rate measured this way is a lower bound.
type Span struct {
	Start, End, Bytes uint64
	// Far: the completion was proven, but not close to the operation (a
	// copy whose synchronisation came after other calls of its thread,
	// CompleteNear false): End bounds it, yet End−Start is no latency of
	// its own. In flight for the lane's rate, never a turnaround.
	Far bool
}

// Flow is one submitter's traffic in one direction of one link: one CUDA
// stream of one process (its copies run one after another) or one RDMA
// queue pair's work requests. Only different flows can overlap.
type Flow struct {
	Name  string // "pid 42 stream 0x55 H2D", "pid 43 QP 7 WRITE_IMM"
	Spans []Span
	// Untimed are the flow's transfers without a proven completion: their
	// time in flight is unknown, so they take no part in the judgement in
	// time; they are counted and said.
	Untimed      int
	UntimedBytes uint64
}

// Add adds a transfer to the flow. One that overlaps the flow's last span
// in time joins it (one interval, the bytes summed): a stream or a queue
// runs its transfers one after another, so copies queued together and
// proven done together are one stretch of the flow at one rate, and the
// flow keeps one span per stretch, not one per transfer. A transfer
// without a proven completion (end 0) is counted as untimed.
func (f *Flow) Add(start, end, bytes uint64) {
	if end == 0 {
		f.Untimed++
		f.UntimedBytes += bytes
		return
	}
	if n := len(f.Spans); n > 0 && start <= f.Spans[n-1].End && end >= f.Spans[n-1].Start {
		last := &f.Spans[n-1]
		last.Start, last.End, last.Bytes = min(last.Start, start), max(last.End, end), last.Bytes+bytes
		return
	}
	f.Spans = append(f.Spans, Span{Start: start, End: end, Bytes: bytes})
}

// CounterSample is what a GPU's PCIe counters measured on one lane over
// [Start, End] (CLOCK_MONOTONIC ns): the average rate in bytes per second,
// every mover included, probed or not.
type CounterSample struct {
	Start, End uint64
	Bps        float64
}

// LinkTraffic is one direction of one GPU link over a window: the input of
// the same-direction-overlap rule.
type LinkTraffic struct {
	Segment, Direction string
	CapacityGBs        float64 // the link's trained per-direction capacity; 0 unknown
	WindowNs           uint64  // the judged window's length; 0: the flows' own span
	Flows              []Flow
	Counters           []CounterSample // in time order; none without GPU counters
	// Dropped counts transfers the window could not keep (its bound): they
	// are not judged, and the finding says so.
	Dropped int
}

// Thresholds of the rule, with their reasons (docs/design.md 1.2).
const (
	// takesPart is the share of the bytes in flight at some moment a flow
	// must carry to count as contending then: a flow taking under 10% of
	// the link slows the others by under 10%, within what the link's own
	// overhead hides (H2D measures 80–90% of capacity, seed 000). With more
	// than five flows in flight, half of an even split is enough, so that
	// many equal streams (each under 10%) still count.
	takesPart = 0.10
	// overlapShare is the share of the link's in-flight time at least two
	// flows must contend for: less is the edge where one phase starts as
	// another drains, or a completion proven late. The link's in-flight
	// time, not the window's length, is the measure: an idle link is no
	// evidence either way (the lane gauges show it), and bursty loads that
	// contend whenever they run are what seed 000 L2→L1 #5 describes.
	overlapShare = 0.25
	// windowShare is the least share of the window the contention must
	// last, so a few microseconds of overlap in an otherwise idle window
	// are not a finding.
	windowShare = 0.01
	// saturated is the share of the capacity the contending flows must
	// reach together. Under contention their rates add up to the capacity
	// (what each alone would have wanted is not observable), so a lane
	// near its capacity while shared is the evidence that demand exceeded
	// it; measured H2D lands at 80–90% of the link's rate (seed 000).
	saturated = 0.75
	// counterInside is the share of a counter sample that must fall inside
	// the contended time for its rate to speak for it; counterCover the
	// share of the contended time such samples must cover for the
	// counters to be the demand instead of the probes' own sum.
	counterInside = 0.5
	counterCover  = 0.5
)

// FlowShare is one contending flow's part of the overlap.
type FlowShare struct {
	Name  string
	Bytes float64 // bytes it moved while the link was contended
	GBs   float64 // Bytes over the contended time
}

// Overlap is what the rule measured on one direction of one link.
type Overlap struct {
	Segment, Direction string
	// Flows names the flows that took part in the contention, with their
	// bytes and rate while contended ("pid 42 stream 0x55 H2D: 64.0 MiB,
	// 2.00 GB/s"), largest first; Transfers counts them.
	Flows     []string
	Transfers int
	// DemandGBs is the link's rate while contended: the GPU counters'
	// where they resolve the contended time (DemandMeasured), else the
	// contending flows' bytes over that time, a lower bound.
	DemandGBs      float64
	DemandMeasured bool
	CapacityGBs    float64 // 0 unknown
	// BusyNs is how long at least one flow was in flight, ContendedNs how
	// long at least two took part at once, WindowNs the window judged.
	BusyNs, ContendedNs, WindowNs uint64
	ContendedBytes                float64
	Shares                        []FlowShare
	TimedFlows                    int
	Untimed                       int
	UntimedBytes                  uint64
	Dropped                       int
	CounterNote                   string // why the counters were not used, "" when they were or were absent
}

// MeasureOverlap measures one direction of one link: when flows were in
// flight, when at least two carried a real share of the bytes at once, and
// the link's rate then.
func MeasureOverlap(l LinkTraffic) Overlap {
	o := Overlap{Segment: l.Segment, Direction: l.Direction, CapacityGBs: l.CapacityGBs, Dropped: l.Dropped}
	type edge struct {
		at   uint64
		flow int
		rate float64 // bytes per ns; negative at the end
		open int     // +1 at a start, -1 at an end
	}
	var edges []edge
	var first, last uint64
	for i, f := range l.Flows {
		o.Untimed += f.Untimed
		o.UntimedBytes += f.UntimedBytes
		timed := false
		for _, s := range f.Spans {
			if s.End <= s.Start { // no duration: its time in flight is unknown too
				o.Untimed++
				o.UntimedBytes += s.Bytes
				continue
			}
			timed = true
			r := float64(s.Bytes) / float64(s.End-s.Start)
			edges = append(edges, edge{s.Start, i, r, 1}, edge{s.End, i, -r, -1})
			if first == 0 || s.Start < first {
				first = s.Start
			}
			last = max(last, s.End)
		}
		if timed {
			o.TimedFlows++
		}
	}
	o.WindowNs = l.WindowNs
	if o.WindowNs == 0 && last > first {
		o.WindowNs = last - first
	}
	slices.SortFunc(edges, func(a, b edge) int { return cmp.Compare(a.at, b.at) })

	rate := make([]float64, len(l.Flows))
	open := make([]int, len(l.Flows))
	bytes := make([]float64, len(l.Flows))
	part := make([]bool, len(l.Flows))
	var live []int // flows in flight
	var contended [][2]uint64
	for i := 0; i < len(edges); {
		at := edges[i].at
		for ; i < len(edges) && edges[i].at == at; i++ {
			e := edges[i]
			if open[e.flow] == 0 {
				live = append(live, e.flow)
			}
			open[e.flow] += e.open
			rate[e.flow] += e.rate
			if open[e.flow] == 0 {
				rate[e.flow] = 0 // no drift from adding and removing rates
				live = slices.DeleteFunc(live, func(f int) bool { return f == e.flow })
			}
		}
		if i == len(edges) || len(live) == 0 {
			continue
		}
		length := edges[i].at - at
		o.BusyNs += length
		if len(live) < 2 {
			continue
		}
		total := 0.0
		for _, f := range live {
			total += rate[f]
		}
		need := takesPart
		if even := 0.5 / float64(len(live)); even < need {
			need = even
		}
		taking := 0
		for _, f := range live {
			if rate[f] >= need*total {
				taking++
			}
		}
		if taking < 2 {
			continue
		}
		o.ContendedNs += length
		o.ContendedBytes += total * float64(length)
		for _, f := range live {
			bytes[f] += rate[f] * float64(length)
			if rate[f] >= need*total {
				part[f] = true
			}
		}
		if n := len(contended); n > 0 && contended[n-1][1] == at {
			contended[n-1][1] = at + length
		} else {
			contended = append(contended, [2]uint64{at, at + length})
		}
	}
	if o.ContendedNs == 0 {
		return o
	}
	for f := range l.Flows {
		if part[f] {
			o.Shares = append(o.Shares, FlowShare{Name: l.Flows[f].Name, Bytes: bytes[f], GBs: bytes[f] / float64(o.ContendedNs)})
		}
	}
	slices.SortStableFunc(o.Shares, func(a, b FlowShare) int { return cmp.Compare(b.Bytes, a.Bytes) })
	o.Transfers = len(o.Shares)
	for _, s := range o.Shares {
		o.Flows = append(o.Flows, fmt.Sprintf("%s: %s, %.2f GB/s", s.Name, bytesText(uint64(math.Round(s.Bytes))), s.GBs))
	}
	o.DemandGBs = o.ContendedBytes / float64(o.ContendedNs)
	if len(l.Counters) > 0 {
		if gbs, note := counterDemand(l.Counters, contended, o.ContendedNs); note == "" {
			o.DemandGBs, o.DemandMeasured = gbs, true
		} else {
			o.CounterNote = note
		}
	}
	return o
}

// counterDemand is the counters' rate over the contended time: the
// time-weighted rate of the samples that lie mostly inside it. note says
// why the counters cannot answer (too coarse), "" when they do.
func counterDemand(samples []CounterSample, contended [][2]uint64, contendedNs uint64) (gbs float64, note string) {
	var weighted, covered float64
	var shortest uint64
	for _, s := range samples {
		if s.End <= s.Start {
			continue
		}
		if shortest == 0 || s.End-s.Start < shortest {
			shortest = s.End - s.Start
		}
		var in uint64
		for _, c := range contended {
			lo, hi := max(s.Start, c[0]), min(s.End, c[1])
			if hi > lo {
				in += hi - lo
			}
		}
		if float64(in) < counterInside*float64(s.End-s.Start) {
			continue
		}
		weighted += s.Bps * float64(in)
		covered += float64(in)
	}
	if covered < counterCover*float64(contendedNs) {
		return 0, fmt.Sprintf("GPU counter samples (every %s or more) are coarser than the %s of overlap: demand from the probes",
			time.Duration(shortest), time.Duration(contendedNs))
	}
	return weighted / covered / 1e9, ""
}

var _ = register(Rule{Name: "same-direction-overlap", Severities: []Severity{SevWarn}, Checklist: ChecklistOverlap, Where: InWindow | InDiagnose,
	Remediation: "stagger the inbound transfers (e.g. HiCache loads vs PD RDMA receives) or move one to another path; opposite directions do not contend"})

// SameDirectionOverlap fires when at least two flows were in flight on one
// direction of one segment at once, each carrying a real share of the
// bytes, for a real share of the time the link was in use, and together
// brought it near its capacity: they share that direction's bandwidth
// (seed 000, rule 2; L2→L1 #5). Opposite directions are separate lanes and
// never meet here. Without a known capacity there is no evidence of
// contention, so nothing fires.
func SameDirectionOverlap(o Overlap) *Finding {
	if o.Transfers < 2 || o.CapacityGBs <= 0 || o.BusyNs == 0 ||
		float64(o.ContendedNs) < overlapShare*float64(o.BusyNs) ||
		float64(o.ContendedNs) < windowShare*float64(o.WindowNs) ||
		o.DemandGBs < saturated*o.CapacityGBs {
		return nil
	}
	ev := []string{fmt.Sprintf("%d flows in flight together on %s (%s) for %s of the %s it was in use (%.0f%%), in a %s window",
		o.Transfers, o.Segment, o.Direction, time.Duration(o.ContendedNs), time.Duration(o.BusyNs),
		100*float64(o.ContendedNs)/float64(o.BusyNs), time.Duration(o.WindowNs))}
	if len(o.Flows) > 0 {
		names := o.Flows
		if len(names) > 8 {
			names = append(slices.Clone(names[:8]), fmt.Sprintf("and %d more", len(names)-8))
		}
		ev = append(ev, "while contended: "+strings.Join(names, "; "))
	}
	from := "the probes' bytes over that time (in-flight intervals are upper bounds: a lower bound)"
	if o.DemandMeasured {
		from = "the GPU's PCIe counters over that time"
	}
	ev = append(ev, fmt.Sprintf("together %.2f GB/s against %.2f GB/s capacity (from %s): the lane is saturated", o.DemandGBs, o.CapacityGBs, from))
	if o.CounterNote != "" {
		ev = append(ev, o.CounterNote)
	}
	if o.Untimed > 0 {
		ev = append(ev, fmt.Sprintf("%d transfers (%s) without a proven completion are not placed in time", o.Untimed, bytesText(o.UntimedBytes)))
	}
	if o.Dropped > 0 {
		ev = append(ev, fmt.Sprintf("%d transfers past the window's bound were not judged", o.Dropped))
	}
	return newFinding("same-direction-overlap", SevWarn, o.Segment,
		fmt.Sprintf("%d flows share the %s direction of %s at the same time", o.Transfers, o.Direction, o.Segment),
		ev,
		"")
}

// Text says what was measured, for a check's detail.
func (o Overlap) Text() string {
	if o.TimedFlows == 0 {
		if o.Untimed > 0 {
			return fmt.Sprintf("%s: %d transfers, none with a proven completion: time in flight unknown", o.Direction, o.Untimed)
		}
		return o.Direction + ": no transfer"
	}
	s := fmt.Sprintf("%s: %d flows in flight %s", o.Direction, o.TimedFlows, time.Duration(o.BusyNs))
	if o.ContendedNs > 0 {
		from := "probes"
		if o.DemandMeasured {
			from = "counters"
		}
		s += fmt.Sprintf(", %d contending for %s (%.0f%%) at %.2f GB/s (%s)", o.Transfers, time.Duration(o.ContendedNs),
			100*float64(o.ContendedNs)/float64(o.BusyNs), o.DemandGBs, from)
	} else {
		s += ", never two at once with a real share each"
	}
	if o.CapacityGBs > 0 {
		s += fmt.Sprintf(" of %.2f GB/s", o.CapacityGBs)
	} else {
		s += ", capacity unknown"
	}
	if o.Untimed > 0 {
		s += fmt.Sprintf("; %d transfers (%s) without a proven completion not placed in time", o.Untimed, bytesText(o.UntimedBytes))
	}
	return s
}
