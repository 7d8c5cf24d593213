package judge_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/lanewatch/lanewatch/checks"
	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/judge"
)

// feedSerialized gives an evaluator HiCache's layer-wise load whose forward
// synchronizes the load stream before each of 4 layers' compute.
func feedSerialized(e *judge.Evaluator) {
	for i := uint64(0); i < 4; i++ {
		e.Transfer(&correlate.Transfer{PID: 30, TID: 30, Stream: 0x10, API: "cudaMemcpyAsync", Op: event.OpCopy, Mover: correlate.MoverCopyEngine,
			Direction: correlate.DirH2D, Bytes: 1 << 20, GPU: "0000:3b:00.0", SubmitNs: 10 + i, CompleteNs: 100, BatchIndex: -1, Layer: int(i)})
		e.Activity(&correlate.Activity{PID: 30, TID: 30, Op: event.OpEventRecord, API: "cudaEventRecord", Stream: 0x10, GPU: "0000:3b:00.0", CallNs: 10 + i, ReturnNs: 11 + i})
	}
	at := uint64(50)
	for i := 0; i < 4; i++ {
		e.Activity(&correlate.Activity{PID: 30, TID: 30, Op: event.OpStreamSync, API: "cudaStreamSynchronize", Stream: 0x10, GPU: "0000:3b:00.0", CallNs: at, ReturnNs: max(at+1, 100)})
		at = max(at+1, 100) + 1
		e.Activity(&correlate.Activity{PID: 30, TID: 30, Op: event.OpStreamWaitEvent, API: "cudaStreamWaitEvent", Stream: 0, GPU: "0000:3b:00.0",
			CallNs: at, ReturnNs: at, RecordNs: 10 + uint64(i), RecordStream: 0x10})
		e.Activity(&correlate.Activity{PID: 30, TID: 30, Op: event.OpLaunch, API: "cudaLaunchKernel", Stream: 0, GPU: "0000:3b:00.0", CallNs: at, ReturnNs: at + 1})
		at += 2
	}
}

// agent run judges compute overlap every window: with launches probed the
// serialized load is a finding and the check WARNs; without, overlap is
// unknown (said in the check) and no serialized-load is made — the waits
// every layer are then host-sync-in-loop, which needs no launch. The verdict keeps
// each process's report for the metrics.
func TestEvaluatorComputeOverlap(t *testing.T) {
	for _, kernels := range []bool{true, false} {
		e := judge.NewEvaluator(judge.EvaluatorConfig{Interval: time.Second, Kernels: kernels,
			Place: func(uint32) checks.Placement { return checks.Placement{Why: "unknown"} }})
		feedSerialized(e)
		v := e.Evaluate(time.Now().Add(time.Second))
		var item *checks.Check
		for i, c := range v.Checks {
			if c.Name == checks.CheckComputeOverlap {
				item = &v.Checks[i]
			}
		}
		var rules []string
		for _, f := range v.Findings {
			rules = append(rules, f.Rule)
		}
		switch {
		case item == nil || countChecks(v, checks.CheckComputeOverlap) != 1:
			t.Fatalf("kernels %v: no item 3 check: %+v", kernels, v.Checks)
		case kernels && (item.Status != checks.Warn || len(rules) != 1 || rules[0] != "serialized-load" || overlapRatio(v) != "0"):
			t.Errorf("kernels probed: %s %q findings %v", item.Status, item.Detail, rules)
		case !kernels && (item.Status != checks.Warn || len(rules) != 1 || rules[0] != "host-sync-in-loop" || !strings.Contains(item.Detail, "not probed")):
			t.Errorf("kernels not probed: %s %q findings %v", item.Status, item.Detail, rules)
		}
		// the next window starts empty
		if v := e.Evaluate(time.Now().Add(2 * time.Second)); countChecks(v, checks.CheckComputeOverlap) != 0 || len(v.Findings) != 0 {
			t.Errorf("kernels %v: the next window judged %+v", kernels, v.Checks)
		}
	}
}

func countChecks(v judge.Verdict, name string) (n int) {
	for _, c := range v.Checks {
		if c.Name == name {
			n++
		}
	}
	return n
}

// overlapRatio is the window's lanewatch_copy_compute_overlap_ratio
// series, as "gpu=value" pairs, or "none".
func overlapRatio(v judge.Verdict) string {
	var out []string
	for _, s := range v.Series {
		if s.Desc.Name == "lanewatch_copy_compute_overlap_ratio" {
			out = append(out, fmt.Sprint(s.Value))
		}
	}
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, ",")
}
