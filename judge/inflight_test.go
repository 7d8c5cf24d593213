package judge

import (
	"fmt"
	"testing"
	"time"

	"github.com/lanewatch/lanewatch/checks"
	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/exporters"
)

// TestInflightSeriesBounded: past the top queue pairs by bytes, the rest
// are summed under one "other" series; a request on two GPU links (two
// flows) is its queue pair's once; CUDA streams have no per-flow series.
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
	lanes, qps := InFlightSeries(r, 10*time.Second)
	if len(lanes) != 1 || lanes[0].AvgBytes != 5 {
		t.Fatalf("lanes %+v", lanes)
	}
	if len(qps) != exporters.MaxInFlightQPs+1 {
		t.Fatalf("%d series: %+v", len(qps), qps)
	}
	if q := qps[0]; q.QP != 139 || q.AvgBytes != 4 || q.AvgOps != 0.1 {
		t.Errorf("top %+v", q)
	}
	rest := qps[len(qps)-1]
	// the 24 smallest: 1..24 × 1e9 byte-ns over 10 s
	if rest.Kind != "other" || fmt.Sprintf("%.1f %.1f", rest.AvgBytes, rest.AvgOps) != "30.0 2.4" {
		t.Errorf("rest %+v", rest)
	}
}
