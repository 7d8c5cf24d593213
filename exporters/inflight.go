package exporters

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// InFlightLane is one GPU lane's averages in flight over the last window,
// every flow on it (checks.LaneInFlight).
type InFlightLane struct {
	GPU, Direction   string
	AvgBytes, AvgOps float64
}

// InFlightQP is one queue pair's averages in flight over the last window;
// QP 0 with Kind "other" is every queue pair past the top MaxInFlightQPs
// by bytes, summed, so the series stay bounded.
type InFlightQP struct {
	PID              uint32
	QP               uint32
	Kind             string // RDMA_WRITE, WRITE_IMM, RDMA_READ, SEND, RECV; "other" for the rest
	Bytes            uint64 // moved in the window: the ranking
	AvgBytes, AvgOps float64
}

// MaxInFlightQPs bounds the per-queue-pair series: the top ones by bytes
// moved in the window, the rest summed under qp="other".
const MaxInFlightQPs = 16

var (
	descInflightBytes = prometheus.NewDesc("lanewatch_inflight_bytes",
		"Bytes in flight on one direction of a GPU's link, time-weighted average over the last window: every probed copy from its call to its proven completion, every RDMA work request from its post to the poll that returned it.",
		[]string{"gpu", "direction"}, nil)
	descInflightOps = prometheus.NewDesc("lanewatch_inflight_ops",
		"Operations (copies, work requests) in flight on one direction of a GPU's link, time-weighted average over the last window.",
		[]string{"gpu", "direction"}, nil)
	descQPInflightBytes = prometheus.NewDesc("lanewatch_qp_inflight_bytes",
		"Bytes in flight on one RDMA queue pair, per opcode, time-weighted average over the last window; the top 16 queue pairs by bytes moved, the rest summed under qp=\"other\".",
		[]string{"pid", "qp", "kind"}, nil)
	descQPInflightOps = prometheus.NewDesc("lanewatch_qp_inflight_ops",
		"Work requests in flight on one RDMA queue pair, per opcode, time-weighted average over the last window (the series of lanewatch_qp_inflight_bytes).",
		[]string{"pid", "qp", "kind"}, nil)
)

func collectInFlight(ch chan<- prometheus.Metric, w Window) {
	for _, l := range w.InFlightLanes {
		ch <- prometheus.MustNewConstMetric(descInflightBytes, prometheus.GaugeValue, l.AvgBytes, l.GPU, l.Direction)
		ch <- prometheus.MustNewConstMetric(descInflightOps, prometheus.GaugeValue, l.AvgOps, l.GPU, l.Direction)
	}
	for _, q := range w.InFlightQPs {
		pid, qp := strconv.FormatUint(uint64(q.PID), 10), strconv.FormatUint(uint64(q.QP), 10)
		if q.Kind == overflow {
			pid, qp = overflow, overflow
		}
		ch <- prometheus.MustNewConstMetric(descQPInflightBytes, prometheus.GaugeValue, q.AvgBytes, pid, qp, q.Kind)
		ch <- prometheus.MustNewConstMetric(descQPInflightOps, prometheus.GaugeValue, q.AvgOps, pid, qp, q.Kind)
	}
}
