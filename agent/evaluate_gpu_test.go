package agent_test

import (
	"testing"
	"time"

	"github.com/lanewatch/lanewatch/agent"
	"github.com/lanewatch/lanewatch/checks"
	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
)

// Lane demand follows each copy's GPU (docs/design.md, "Which GPU"): a TP
// worker placed on one GPU whose copies name another puts them on that
// GPU's lane, at that link's capacity; a copy that names none goes to its
// process's placement; a process with neither adds to no lane.
func TestEvaluatorLanesByCopyGPU(t *testing.T) {
	place := func(pid uint32) checks.Placement {
		if pid == 30 {
			return checks.Placement{Why: "unknown"}
		}
		return checks.Placement{GPU: "0000:17:00.0", InboundGBs: 4, OutboundGBs: 4}
	}
	capacity := func(gpu string) float64 {
		if gpu == "0000:3b:00.0" {
			return 8
		}
		return 0
	}
	e := agent.NewEvaluator(agent.EvaluatorConfig{Interval: time.Second, Place: place, LinkCapacity: capacity})
	start := time.Now()
	h2d := func(pid uint32, gpu string, at uint64) {
		e.Transfer(&correlate.Transfer{PID: pid, TID: pid, Stream: 0x10, API: "cudaMemcpyAsync", Op: "copy", Direction: correlate.DirH2D,
			Bytes: 1 << 20, HostMem: event.MemPinned, GPU: gpu, SubmitNs: at, CompleteNs: at + 5e5, BatchIndex: -1, Layer: -1})
	}
	h2d(20, "0000:3b:00.0", 1e6)
	h2d(20, "0000:3b:00.0", 2e6)
	h2d(20, "", 3e6)
	h2d(30, "", 4e6) // no GPU anywhere
	h2d(30, "0000:3b:00.0", 5e6)
	v := e.Evaluate(start.Add(time.Second))
	got := map[string]agent.LaneRate{}
	for _, l := range v.Lanes {
		got[l.GPU+" "+l.Direction] = l
	}
	perSec := func(n int) float64 { return float64(n<<20) / v.Window.Seconds() }
	if l := got["0000:3b:00.0 inbound"]; l.Demand != perSec(3) || l.Capacity != 8e9 {
		t.Errorf("lane of the copies' own GPU: %+v, want demand %v at 8e9", l, perSec(3))
	}
	if l := got["0000:17:00.0 inbound"]; l.Demand != perSec(1) || l.Capacity != 4e9 {
		t.Errorf("the placement's lane: %+v, want demand %v at 4e9", l, perSec(1))
	}
	if len(v.Lanes) != 3 { // 17 in and out (placed), 3b in
		t.Errorf("lanes %+v", v.Lanes)
	}
}
