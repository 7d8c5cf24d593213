package exporters

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestInFlightMetrics(t *testing.T) {
	m := NewMetrics(nil)
	m.SetWindow(Window{
		InFlightLanes: []InFlightLane{{GPU: "0000:3b:00.0", Direction: "inbound", AvgBytes: 16384, AvgOps: 0.9}},
		InFlightQPs:   []InFlightQP{{PID: 42, QP: 7, Kind: "RDMA_WRITE", AvgBytes: 2048, AvgOps: 0.5}, {Kind: "other", AvgBytes: 10, AvgOps: 0.1}},
	})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	want := `
# HELP lanewatch_inflight_bytes Bytes in flight on one direction of a GPU's link, time-weighted average over the last window: every probed copy from its call to its proven completion, every RDMA work request from its post to the poll that returned it.
# TYPE lanewatch_inflight_bytes gauge
lanewatch_inflight_bytes{direction="inbound",gpu="0000:3b:00.0"} 16384
# HELP lanewatch_qp_inflight_ops Work requests in flight on one RDMA queue pair, per opcode, time-weighted average over the last window (the series of lanewatch_qp_inflight_bytes).
# TYPE lanewatch_qp_inflight_ops gauge
lanewatch_qp_inflight_ops{kind="RDMA_WRITE",pid="42",qp="7"} 0.5
lanewatch_qp_inflight_ops{kind="other",pid="other",qp="other"} 0.1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "lanewatch_inflight_bytes", "lanewatch_qp_inflight_ops"); err != nil {
		t.Error(err)
	}
}
