package judge

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/lanewatch/lanewatch/checks"
	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/exporters"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestInflightSeriesBounded: past the top queue pairs by bytes, the rest
// are summed under one "other" series; a request on two GPU links (two
// flows) is its queue pair's once; CUDA streams have no per-flow series.
// Published, they are the lanewatch_inflight_* and lanewatch_qp_inflight_*
// gauges.
func TestInflightSeriesBounded(t *testing.T) {
	var r checks.InFlightReport
	for i := range 40 {
		f := checks.FlowInFlight{PID: 7, RDMA: true, ID: uint64(100 + i), Kind: correlate.DirRDMAWrite, Direction: checks.Inbound,
			InFlight: correlate.InFlight{Bytes: uint64(i+1) << 20, ByteNs: float64(i+1) * 1e9, OpNs: 1e9}}
		r.Flows = append(r.Flows, f)
		if i == 39 {
			f.Direction = checks.Outbound // the same requests on the peer's link
			r.Flows = append(r.Flows, f)
		}
	}
	r.Flows = append(r.Flows, checks.FlowInFlight{PID: 7, ID: 0x10, Kind: correlate.DirH2D, InFlight: correlate.InFlight{Bytes: 1 << 30}})
	r.Lanes = []checks.LaneInFlight{{GPU: "0000:3b:00.0", Direction: checks.Inbound, AvgBytes: 5, AvgOps: 1}}
	series := inflightSeries(r, (10 * time.Second).Nanoseconds())
	var lanes, qps []exporters.Sample
	for _, s := range series {
		switch s.Desc.Name {
		case descInflightBytes.Name:
			lanes = append(lanes, s)
		case descQPInflightBytes.Name:
			qps = append(qps, s)
		}
	}
	if len(lanes) != 1 || lanes[0].Value != 5 {
		t.Fatalf("lanes %+v", lanes)
	}
	if len(qps) != MaxInFlightQPs+1 || len(series) != 2*(len(qps)+len(lanes)) {
		t.Fatalf("%d queue pair series of %d: %+v", len(qps), len(series), qps)
	}
	if q := qps[0]; q.Labels[1] != "139" || q.Value != 4 {
		t.Errorf("top %+v", q)
	}
	rest := qps[len(qps)-1]
	// the 24 smallest: 1..24 × 1e9 byte-ns over 10 s
	if strings.Join(rest.Labels, ",") != "other,other,other" || fmt.Sprintf("%.1f", rest.Value) != "30.0" {
		t.Errorf("rest %+v", rest)
	}
	m := exporters.NewMetrics(nil, inflightRule{}.Descs()...)
	m.SetRuleSeries(series)
	want := `
# HELP lanewatch_inflight_bytes Bytes in flight on one direction of a GPU's link, time-weighted average over the last window: every probed copy from its call to its proven completion, every RDMA work request from its post to the poll that returned it.
# TYPE lanewatch_inflight_bytes gauge
lanewatch_inflight_bytes{direction="inbound",gpu="0000:3b:00.0"} 5
# HELP lanewatch_qp_inflight_ops Work requests in flight on one RDMA queue pair, per opcode, time-weighted average over the last window (the series of lanewatch_qp_inflight_bytes).
# TYPE lanewatch_qp_inflight_ops gauge
`
	for _, s := range series {
		if s.Desc.Name == descQPInflightOps.Name {
			want += fmt.Sprintf("lanewatch_qp_inflight_ops{kind=%q,pid=%q,qp=%q} %g\n", s.Labels[2], s.Labels[0], s.Labels[1], s.Value)
		}
	}
	if err := testutil.GatherAndCompare(exporters.NewRegistry(m, nil, nil), strings.NewReader(want), "lanewatch_inflight_bytes", "lanewatch_qp_inflight_ops"); err != nil {
		t.Error(err)
	}
}
