package judge_test

import (
	"testing"
	"time"

	"github.com/lanewatch/lanewatch/checks"
	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/judge"
)

// Transfers moved by SMs (docs/design.md, "Kernel movers") add no demand:
// their bytes are unknown. Each GPU's count goes on both of its lanes, made
// at the link's capacity when no copy or placement made them; one with no
// GPU on none.
func TestEvaluatorSMTransfers(t *testing.T) {
	e := judge.NewEvaluator(judge.EvaluatorConfig{Interval: time.Second,
		Place:        func(uint32) checks.Placement { return checks.Placement{Why: "unknown"} },
		LinkCapacity: func(string) float64 { return 8 }})
	start := time.Now()
	for i := range 5 {
		e.Transfer(&correlate.Transfer{PID: 20, TID: 20, Stream: 0x10, API: "cudaLaunchKernel", Op: event.OpKernelCopy,
			Mover: correlate.MoverSM, Kernel: "transfer_kernel_impl", Direction: correlate.DirUnknown, BytesUnknown: true,
			GPU: "0000:3b:00.0", SubmitNs: uint64(i+1) * 1e6, CompleteNs: uint64(i+1)*1e6 + 5e5, BatchIndex: -1, Layer: i})
	}
	e.Transfer(&correlate.Transfer{PID: 20, Op: event.OpKernelCopy, Mover: correlate.MoverSM, Direction: correlate.DirUnknown, BytesUnknown: true})
	v := e.Evaluate(start.Add(time.Second))
	if len(v.Lanes) != 2 {
		t.Fatalf("lanes %+v", v.Lanes)
	}
	for _, l := range v.Lanes {
		if l.GPU != "0000:3b:00.0" || l.SMTransfers != 5 || l.Demand != 0 || l.Capacity != 8e9 {
			t.Errorf("lane %+v", l)
		}
	}
	for _, f := range v.Findings {
		t.Errorf("finding on kernel launches alone: %+v", f)
	}
}
