package judge

import (
	"cmp"
	"slices"
	"time"

	"github.com/lanewatch/lanewatch/checks"
	"github.com/lanewatch/lanewatch/exporters"
)

// InFlightSeries turns a window's in-flight report into its metric series:
// one per GPU lane, and one per queue pair and opcode for the top
// exporters.MaxInFlightQPs by bytes moved, the rest summed under "other"
// (a server may open thousands of queue pairs). A request that crossed
// two GPU links is one queue pair's, counted once.
func InFlightSeries(r checks.InFlightReport, span time.Duration) (lanes []exporters.InFlightLane, qps []exporters.InFlightQP) {
	for _, l := range r.Lanes {
		lanes = append(lanes, exporters.InFlightLane{GPU: l.GPU, Direction: l.Direction, AvgBytes: l.AvgBytes, AvgOps: l.AvgOps})
	}
	if span <= 0 {
		return lanes, nil
	}
	type key struct {
		pid, qp uint32
		kind    string
	}
	seen := map[key]bool{}
	for _, f := range r.Flows {
		k := key{f.PID, uint32(f.ID), f.Kind}
		if !f.RDMA || seen[k] {
			continue
		}
		seen[k] = true
		m := f.InFlight
		qps = append(qps, exporters.InFlightQP{PID: f.PID, QP: uint32(f.ID), Kind: f.Kind, Bytes: m.Bytes,
			AvgBytes: m.ByteNs / float64(span.Nanoseconds()), AvgOps: m.OpNs / float64(span.Nanoseconds())})
	}
	slices.SortStableFunc(qps, func(a, b exporters.InFlightQP) int {
		return cmp.Or(cmp.Compare(b.Bytes, a.Bytes), cmp.Compare(a.PID, b.PID), cmp.Compare(a.QP, b.QP), cmp.Compare(a.Kind, b.Kind))
	})
	if len(qps) <= exporters.MaxInFlightQPs {
		return lanes, qps
	}
	rest := exporters.InFlightQP{Kind: "other"}
	for _, q := range qps[exporters.MaxInFlightQPs:] {
		rest.Bytes += q.Bytes
		rest.AvgBytes += q.AvgBytes
		rest.AvgOps += q.AvgOps
	}
	return lanes, append(qps[:exporters.MaxInFlightQPs:exporters.MaxInFlightQPs], rest)
}
