package judge

import (
	"cmp"
	"slices"
	"strconv"

	"github.com/lanewatch/lanewatch/checks"
	"github.com/lanewatch/lanewatch/exporters"
	"github.com/prometheus/client_golang/prometheus"
)

// In-flight sufficiency (too-little-in-flight, docs/design.md): every flow
// on its GPU lane, judged against the lane's bandwidth × turnaround
// (checks.Window.InFlights), and the averages in flight as metrics.

var _ = register(inflightRule{})

type inflightRule struct{}

func (inflightRule) Check() string    { return checks.CheckInFlight }
func (inflightRule) Raises() []string { return []string{"too-little-in-flight"} }
func (inflightRule) Unsampled() string {
	return "needs a live window (--sample): operations in flight are measured over time"
}

func (inflightRule) Judge(w *Window, env *Env) Judgement {
	r := w.InFlights(env.Place, env.Capacity, env.Span)
	return Judgement{Checks: r.Checks(), Series: inflightSeries(r, env.Span.Nanoseconds())}
}

// MaxInFlightQPs bounds the per-queue-pair series: the top ones by bytes
// moved in the window, the rest summed under qp="other".
const MaxInFlightQPs = 16

var (
	descInflightBytes = exporters.NewDesc("lanewatch_inflight_bytes",
		"Bytes in flight on one direction of a GPU's link, time-weighted average over the last window: every probed copy from its call to its proven completion, every RDMA work request from its post to the poll that returned it.",
		prometheus.GaugeValue, "gpu", "direction")
	descInflightOps = exporters.NewDesc("lanewatch_inflight_ops",
		"Operations (copies, work requests) in flight on one direction of a GPU's link, time-weighted average over the last window.",
		prometheus.GaugeValue, "gpu", "direction")
	descQPInflightBytes = exporters.NewDesc("lanewatch_qp_inflight_bytes",
		"Bytes in flight on one RDMA queue pair, per opcode, time-weighted average over the last window; the top 16 queue pairs by bytes moved, the rest summed under qp=\"other\".",
		prometheus.GaugeValue, "pid", "qp", "kind")
	descQPInflightOps = exporters.NewDesc("lanewatch_qp_inflight_ops",
		"Work requests in flight on one RDMA queue pair, per opcode, time-weighted average over the last window (the series of lanewatch_qp_inflight_bytes).",
		prometheus.GaugeValue, "pid", "qp", "kind")
)

func (inflightRule) Descs() []exporters.Desc {
	return []exporters.Desc{descInflightBytes, descInflightOps, descQPInflightBytes, descQPInflightOps}
}

// inflightSeries turns a window's in-flight report into its metric series:
// one per GPU lane, and one per queue pair and opcode for the top
// MaxInFlightQPs by bytes moved, the rest summed under "other" (a server
// may open thousands of queue pairs). A request that crossed two GPU links
// is one queue pair's, counted once. spanNs is the window's length.
func inflightSeries(r checks.InFlightReport, spanNs int64) []exporters.Sample {
	var out []exporters.Sample
	for _, l := range r.Lanes {
		out = append(out, exporters.Sample{Desc: descInflightBytes, Value: l.AvgBytes, Labels: []string{l.GPU, l.Direction}},
			exporters.Sample{Desc: descInflightOps, Value: l.AvgOps, Labels: []string{l.GPU, l.Direction}})
	}
	if spanNs <= 0 {
		return out
	}
	type qp struct {
		pid, qp          uint32
		kind             string
		bytes            uint64
		avgBytes, avgOps float64
	}
	seen := map[qp]bool{}
	var qps []qp
	for _, f := range r.Flows {
		k := qp{pid: f.PID, qp: uint32(f.ID), kind: f.Kind}
		if !f.RDMA || seen[k] {
			continue
		}
		seen[k] = true
		m := f.InFlight
		k.bytes, k.avgBytes, k.avgOps = m.Bytes, m.ByteNs/float64(spanNs), m.OpNs/float64(spanNs)
		qps = append(qps, k)
	}
	slices.SortStableFunc(qps, func(a, b qp) int {
		return cmp.Or(cmp.Compare(b.bytes, a.bytes), cmp.Compare(a.pid, b.pid), cmp.Compare(a.qp, b.qp), cmp.Compare(a.kind, b.kind))
	})
	if len(qps) > MaxInFlightQPs {
		rest := qp{kind: "other"}
		for _, q := range qps[MaxInFlightQPs:] {
			rest.avgBytes += q.avgBytes
			rest.avgOps += q.avgOps
		}
		qps = append(qps[:MaxInFlightQPs:MaxInFlightQPs], rest)
	}
	for _, q := range qps {
		labels := []string{strconv.FormatUint(uint64(q.pid), 10), strconv.FormatUint(uint64(q.qp), 10), q.kind}
		if q.kind == "other" {
			labels = []string{"other", "other", "other"}
		}
		out = append(out, exporters.Sample{Desc: descQPInflightBytes, Value: q.avgBytes, Labels: labels},
			exporters.Sample{Desc: descQPInflightOps, Value: q.avgOps, Labels: labels})
	}
	return out
}
