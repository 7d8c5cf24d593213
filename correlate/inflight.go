package correlate

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"time"
)

// Pending is the number of copies waiting for a synchronisation to prove
// their completion (emitted later, or at PendingTimeout without one).
func (e *Engine) Pending() int {
	n := 0
	for _, p := range e.procs {
		n += p.live
	}
	return n
}

// In-flight sufficiency (seed 002 §8.3, Little's law; docs/design.md 7,
// "In flight"): to keep a path of bandwidth B busy, the bytes in flight
// must cover B × L, L the turnaround of the window that limits it. A flow
// is one CUDA stream's copies on one lane of a GPU link, or one RDMA queue
// pair's work requests of one kind; each operation is in flight from its
// submission (the copy call's entry, the post) to the proof of its
// completion (the synchronisation's return, the poll that returned it).

// ChecklistInFlight is the seed item too-little-in-flight applies.
const ChecklistInFlight = "Concurrency (seed 002 §8.3): to keep bandwidth B busy, the bytes in flight must cover B × L; one copy or work request at a time leaves the path idle between turnarounds"

// Thresholds of too-little-in-flight, with their reasons (docs/design.md 7).
const (
	// inflightMinOps: fewer operations say nothing of a turnaround; a
	// lone copy or a handful of requests is no sustained flow.
	inflightMinOps = 32
	// inflightBusyShare is the least share of the flow's active span (its
	// first submission to its last completion) with at least one operation
	// in flight: a flow idle most of the time has no demand the path
	// fails, so a rarely used flow never fires. "Most" is a majority;
	// the rate judged is the rate while busy, so the host's own gaps do
	// not count against the path either way.
	inflightBusyShare = 0.5
	// inflightUnderRate is the share of the path's capacity the flow's
	// rate while busy must stay under: measured H2D reaches 80–90% of the
	// link's rate (seed 000), so a flow under half is not the link's
	// overhead but something the flow itself does.
	inflightUnderRate = 0.5
	// inflightBDPCover: the flow's average bytes in flight must stay under
	// the bandwidth-delay product (B × L) for the rule to fire; at or
	// above it, more in flight would only queue (seed 002 §8.3).
	inflightBDPCover = 1.0
	// inflightMaxOps: the flow must keep under two operations in flight on
	// average while busy — the seed's case, each request waiting for the
	// previous one to finish. With more, its latencies include queueing
	// behind its own operations that the agent cannot tell from a
	// turnaround (a CUDA copy's completion is proven only by a
	// synchronisation, so every copy queued before it "ends" there), and a
	// deep queue that is still slow is limited by something else, which
	// other rules name (pageable, fragmented, same-direction overlap).
	inflightMaxOps = 2.0
	// inflightTurnaroundPct is the latency percentile taken as the
	// turnaround L: the low end, an operation that did not queue behind
	// its own flow's earlier ones. A deep queue's median latency is mostly
	// waiting and would inflate B × L; a serial flow's low and median
	// latencies are the same.
	inflightTurnaroundPct = 10
	// inflightMinBytes: a flow that moved under 1 MiB in the window (a
	// decode step's sampled tokens read back, a few hundred bytes a step)
	// held its lane under 1 MiB / 25 GB/s = 42 µs in all: more in flight
	// would gain nothing worth a finding, whatever its latency.
	inflightMinBytes = 1 << 20
	// inflightLaneShare: a flow in flight under a tenth of the time its
	// lane was busy (any flow's operation in flight) is not what keeps the
	// lane from its rate; the flows that fill the lane are judged instead.
	inflightLaneShare = 0.1
)

// InFlight is what one flow's operations show over a window.
type InFlight struct {
	Name string // "pid 42 stream 0x55 H2D", "pid 43 QP 7 RDMA_WRITE"
	RDMA bool   // work requests, not copies (for the evidence's words)
	Xfer bool   // a transfer library's transfers on one endpoint (the same)
	// Ops and Bytes are the operations with a proven completion.
	Ops   int
	Bytes uint64
	// FirstNs..LastNs is the active span (first submission, last
	// completion); BusyNs the part of it with at least one in flight.
	FirstNs, LastNs, BusyNs uint64
	// ByteNs and OpNs integrate bytes and operations in flight over time:
	// divided by a span they are its time-weighted averages.
	ByteNs, OpNs float64
	// Latencies, submission to proven completion.
	TurnaroundNs, P50Ns, MeanNs uint64 // MeanNs weighted by bytes
	TypicalBytes                uint64 // the median operation's size
	// Untimed counts operations without a proven completion, or (CUDA
	// copies) with one proven far from them (Span.Far): not judged.
	Untimed int
	// LaneBusyNs is the time the flow's lane had any flow's operation in
	// flight over the window, LaneByteNs those operations' bytes
	// integrated over their time in flight (every flow's, near or far):
	// B × L is judged per lane, so a flow fires only when the whole lane
	// keeps too little in flight. Zero: not measured (the flow alone).
	LaneBusyNs uint64
	LaneByteNs float64
	// CapacityGBs is the path's capacity (0 unknown); LaneGBs what every
	// flow on the lane moved during this flow's active span (the
	// saturation test), LaneMeasured when that came from the GPU's
	// counters.
	CapacityGBs  float64
	LaneGBs      float64
	LaneMeasured bool
}

// MeasureInFlight measures a flow from its operations (each Span one
// operation; End 0 or not after Start: no proven completion).
func MeasureInFlight(name string, rdma bool, ops []Span) InFlight {
	m := InFlight{Name: name, RDMA: rdma}
	var lat, sizes []uint64
	var iv [][2]uint64
	for _, o := range ops {
		if o.End <= o.Start || o.Far {
			m.Untimed++
			continue
		}
		d := o.End - o.Start
		m.Ops++
		m.Bytes += o.Bytes
		m.ByteNs += float64(o.Bytes) * float64(d)
		m.OpNs += float64(d)
		lat, sizes = append(lat, d), append(sizes, o.Bytes)
		iv = append(iv, [2]uint64{o.Start, o.End})
	}
	if m.Ops == 0 {
		return m
	}
	slices.SortFunc(iv, func(a, b [2]uint64) int { return cmp.Compare(a[0], b[0]) })
	m.FirstNs = iv[0][0]
	curS, curE := iv[0][0], iv[0][1]
	for _, x := range iv[1:] {
		if x[0] > curE {
			m.BusyNs += curE - curS
			curS, curE = x[0], x[1]
			continue
		}
		curE = max(curE, x[1])
	}
	m.BusyNs += curE - curS
	for _, x := range iv {
		m.LastNs = max(m.LastNs, x[1])
	}
	slices.Sort(lat)
	slices.Sort(sizes)
	m.TurnaroundNs = percentile(lat, inflightTurnaroundPct)
	m.P50Ns = percentile(lat, 50)
	m.TypicalBytes = percentile(sizes, 50)
	if m.Bytes > 0 {
		m.MeanNs = uint64(m.ByteNs / float64(m.Bytes))
	}
	return m
}

// percentile is the nearest-rank percentile of sorted values.
func percentile(sorted []uint64, p int) uint64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(float64(p)/100*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// ActiveNs is the flow's first submission to its last completion.
func (m InFlight) ActiveNs() uint64 { return m.LastNs - m.FirstNs }

// AvgBytes and AvgOps are the time-weighted averages in flight while the
// flow was busy (at least one operation in flight).
func (m InFlight) AvgBytes() float64 { return safeDiv(m.ByteNs, float64(m.BusyNs)) }
func (m InFlight) AvgOps() float64   { return safeDiv(m.OpNs, float64(m.BusyNs)) }

// RateGBs is the flow's rate while busy, bytes per ns (GB/s). Little's
// law: AvgBytes = RateGBs × MeanNs.
func (m InFlight) RateGBs() float64 { return safeDiv(float64(m.Bytes), float64(m.BusyNs)) }

// BDPBytes is the bandwidth-delay product of the path at the flow's
// turnaround: capacity × L; 0 when the capacity is unknown.
func (m InFlight) BDPBytes() float64 { return m.CapacityGBs * float64(m.TurnaroundNs) }

// approxBytes writes a measured (fractional) byte count in binary units.
func approxBytes(b float64) string {
	switch {
	case b >= 1<<30:
		return fmt.Sprintf("%.1f GiB", b/(1<<30))
	case b >= 1<<20:
		return fmt.Sprintf("%.1f MiB", b/(1<<20))
	case b >= 1<<10:
		return fmt.Sprintf("%.1f KiB", b/(1<<10))
	}
	return fmt.Sprintf("%.0f B", b)
}

func safeDiv(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// LaneAvgBytes is the bytes in flight on the flow's lane, every flow's,
// averaged over the time the lane was busy; the flow's own when the lane
// was not measured.
func (m InFlight) LaneAvgBytes() float64 {
	if m.LaneBusyNs == 0 {
		return m.AvgBytes()
	}
	return m.LaneByteNs / float64(m.LaneBusyNs)
}

// LatencyBound says whether the flow has sustained demand the path
// could carry faster with more in flight: enough operations and bytes,
// busy most of its active span and a fair share of its lane's busy time
// with under two in flight on average, its busy rate well under capacity,
// its lane's average bytes in flight under capacity × its turnaround.
// Saturation and unknown capacity are the caller's to check first
// (TooLittleInFlight).
func (m InFlight) LatencyBound() bool {
	return m.Ops >= inflightMinOps && m.Bytes >= inflightMinBytes && m.CapacityGBs > 0 && m.ActiveNs() > 0 &&
		float64(m.BusyNs) >= inflightBusyShare*float64(m.ActiveNs()) &&
		float64(m.BusyNs) >= inflightLaneShare*float64(m.LaneBusyNs) && m.AvgOps() < inflightMaxOps &&
		m.RateGBs() < inflightUnderRate*m.CapacityGBs &&
		m.AvgBytes() < inflightBDPCover*m.BDPBytes() && m.LaneAvgBytes() < inflightBDPCover*m.BDPBytes()
}

// Saturated says whether the flow's lane carried near its capacity during
// the flow's active span (saturated, as the overlap rule takes it): a
// full path is no evidence that more in flight would help.
func (m InFlight) Saturated() bool {
	return m.CapacityGBs > 0 && max(m.LaneGBs, m.RateGBs()) >= saturated*m.CapacityGBs
}

var _ = register(Rule{Name: "too-little-in-flight", Severities: []Severity{SevWarn}, Checklist: ChecklistInFlight, Where: InWindow | InDiagnose,
	Remediation: "keep more in flight: queue more copies before synchronising (one sync or event per layer), or more work requests outstanding per queue pair; in flight must cover the path's bandwidth × turnaround"})

// TooLittleInFlight judges one flow on its path (segment: "PCIe link of
// GPU 0000:3b:00.0 inbound"): a finding when it is latency-bound, nil
// otherwise — and always nil when the capacity is unknown or the lane
// was saturated.
func TooLittleInFlight(m InFlight, segment string) *Finding {
	if m.Saturated() || !m.LatencyBound() {
		return nil
	}
	unit, remedy := "copies", "queue more copies before synchronising (one synchronisation or event per layer, not per copy), or make each copy larger"
	switch {
	case m.RDMA:
		unit, remedy = "work requests", "keep more work requests outstanding on the queue pair (post ahead and poll in batches, signal every Nth), or spread the flow over more queue pairs"
	case m.Xfer:
		unit, remedy = "transfers", "keep more transfers outstanding on the endpoint (post several before waiting on their requests; NIXL: more descriptors per transfer request), or spread them over more endpoints"
	}
	bdp := m.BDPBytes()
	more := bdp - m.AvgBytes()
	n := 0
	if m.TypicalBytes > 0 {
		n = int(math.Ceil(more / float64(m.TypicalBytes)))
	}
	lane := "the probes"
	if m.LaneMeasured {
		lane = "the GPU's counters"
	}
	ev := []string{
		fmt.Sprintf("%d %s (%s) in %s, at least one in flight %s of it (%.0f%%)", m.Ops, unit, bytesText(m.Bytes),
			time.Duration(m.ActiveNs()), time.Duration(m.BusyNs), 100*float64(m.BusyNs)/float64(m.ActiveNs())),
		fmt.Sprintf("%.2f GB/s while in flight against %.2f GB/s capacity (%.0f%%); the lane carried %.2f GB/s in that time (%s): not saturated",
			m.RateGBs(), m.CapacityGBs, 100*m.RateGBs()/m.CapacityGBs, m.LaneGBs, lane),
		fmt.Sprintf("latency p50 %s, turnaround (p%d) %s; in flight on average %s and %.2f %s", time.Duration(m.P50Ns),
			inflightTurnaroundPct, time.Duration(m.TurnaroundNs), approxBytes(m.AvgBytes()), m.AvgOps(), unit),
		fmt.Sprintf("bandwidth-delay product %.2f GB/s × %s = %s: in flight covers %.0f%% of it, the whole lane's %.0f%%", m.CapacityGBs,
			time.Duration(m.TurnaroundNs), approxBytes(bdp), 100*m.AvgBytes()/bdp, 100*m.LaneAvgBytes()/bdp),
		fmt.Sprintf("about %s more in flight would keep the path busy: ≈ %d more %s of its typical %s", approxBytes(more), n, unit, bytesText(m.TypicalBytes)),
	}
	if m.Untimed > 0 {
		ev = append(ev, fmt.Sprintf("%d %s without a completion proven close to them are not counted", m.Untimed, unit))
	}
	return newFinding("too-little-in-flight", SevWarn, m.Name+" on "+segment,
		fmt.Sprintf("%s keeps too little in flight: %.2f GB/s of %.2f GB/s, latency-bound", m.Name, m.RateGBs(), m.CapacityGBs),
		ev, remedy)
}

// Text says what was measured, for a check's detail.
func (m InFlight) Text() string {
	if m.Ops == 0 {
		return fmt.Sprintf("%s: no operation with a proven completion (%d without)", m.Name, m.Untimed)
	}
	s := fmt.Sprintf("%s: %d ops, %.2f GB/s while in flight (%.0f%% of %s), p50 %s, in flight %s / %.1f ops on average",
		m.Name, m.Ops, m.RateGBs(), 100*safeDiv(float64(m.BusyNs), float64(m.ActiveNs())), time.Duration(m.ActiveNs()),
		time.Duration(m.P50Ns), approxBytes(m.AvgBytes()), m.AvgOps())
	if m.CapacityGBs > 0 {
		return s + fmt.Sprintf(", B×L %s at %.2f GB/s", approxBytes(m.BDPBytes()), m.CapacityGBs)
	}
	return s + ", capacity unknown"
}
