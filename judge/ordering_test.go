package judge_test

import (
	"testing"
	"time"

	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/judge"
)

// agent run's evaluator judges RDMA ordering in the window the facts
// arrive in, and not in the next.
func TestEvaluatorJudgesOrdering(t *testing.T) {
	e := judge.NewEvaluator(judge.EvaluatorConfig{Interval: time.Second})
	e.Transfer(&correlate.Transfer{PID: 4, Op: event.OpPostSend, Direction: correlate.DirSend, QPNum: 9, WRID: 1, SubmitNs: 10, CompleteNs: 20,
		Status: "success", Order: &correlate.OrderFacts{NotifyAhead: &correlate.NotifyAhead{Peer: "lid 3", DataQPs: []uint32{8}, Writes: 2, OldestNs: 5}}})
	v := e.Evaluate(time.Now())
	found := false
	for _, f := range v.Findings {
		found = found || f.Rule == "cross-qp-notify" && f.Subject == "pid 4"
	}
	ordering := 0
	for _, c := range v.Checks {
		if c.Name == judge.CheckOrdering {
			ordering++
		}
	}
	if !found || ordering != 1 {
		t.Fatalf("findings %+v, %d ordering checks", v.Findings, ordering)
	}
	if v := e.Evaluate(time.Now()); len(v.Findings) != 0 {
		t.Errorf("next window: %+v", v.Findings)
	}
}
