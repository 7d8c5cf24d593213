package judge_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/lanewatch/lanewatch/checks"
	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/judge"
)

func rules(v judge.Verdict) map[string]int {
	out := map[string]int{}
	for _, f := range v.Findings {
		out[f.Rule]++
	}
	return out
}

// A window with pageable copies fires pageable-copy; the next, clean
// window fires nothing: findings are per window.
func TestEvaluatorWindows(t *testing.T) {
	place := func(uint32) checks.Placement {
		return checks.Placement{GPU: "0000:17:00.0", InboundGBs: 4, OutboundGBs: 4}
	}
	e := judge.NewEvaluator(judge.EvaluatorConfig{Interval: time.Second, Place: place})
	start := time.Now()
	for i := range 3 {
		e.Transfer(&correlate.Transfer{PID: 10, API: "cudaMemcpy", Op: event.OpCopy, Direction: correlate.DirH2D, Bytes: 1 << 20,
			HostMem: event.MemPageable, SubmitNs: uint64(i) * 1e6, CompleteNs: uint64(i)*1e6 + 5e5})
	}
	e.Transfer(&correlate.Transfer{PID: 11, API: "cudaMemcpyAsync", Op: event.OpCopy, Direction: correlate.DirD2H, Bytes: 1 << 20,
		HostMem: event.MemPinned, SubmitNs: 1, CompleteNs: 1e6})
	v := e.Evaluate(start.Add(2 * time.Second))
	if got := rules(v); got["pageable-copy"] != 1 || len(got) != 1 {
		t.Errorf("first window findings %v, want pageable-copy once", got)
	}
	if len(v.Lanes) != 2 {
		t.Fatalf("lanes %+v, want inbound and outbound of 0000:17:00.0", v.Lanes)
	}
	for _, l := range v.Lanes {
		want := float64(3<<20) / v.Window.Seconds()
		if l.Direction == "outbound" {
			want = float64(1<<20) / v.Window.Seconds()
		}
		if l.GPU != "0000:17:00.0" || l.Capacity != 4e9 || l.Demand != want {
			t.Errorf("lane %+v, want demand %v capacity 4e9", l, want)
		}
	}
	v = e.Evaluate(start.Add(3 * time.Second))
	if len(v.Findings) != 0 || len(v.Lanes) != 0 {
		t.Errorf("clean window: findings %v lanes %v", rules(v), v.Lanes)
	}
	if v.Window != time.Second {
		t.Errorf("second window lasted %v, want 1s", v.Window)
	}
}

// Many small copies make fragmented-copies; two streams saturating the
// inbound lane together make same-direction-overlap, which needs a known
// capacity.
func TestEvaluatorFragmentationAndOverlap(t *testing.T) {
	for _, tc := range []struct {
		name     string
		capacity float64
		want     map[string]int
	}{
		{"known capacity", 4, map[string]int{"fragmented-copies": 1, "same-direction-overlap": 1}},
		{"unknown capacity", 0, map[string]int{"fragmented-copies": 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			place := func(uint32) checks.Placement { return checks.Placement{GPU: "0000:17:00.0", InboundGBs: tc.capacity} }
			e := judge.NewEvaluator(judge.EvaluatorConfig{Place: place})
			for i := range 300 {
				for _, stream := range []uint64{1, 2} { // 2 × 4 KiB per µs = 8 GB/s on the inbound lane
					e.Transfer(&correlate.Transfer{PID: 7, Stream: stream, Op: event.OpCopy, Direction: correlate.DirH2D, Bytes: 4096,
						HostMem: event.MemPinned, SubmitNs: uint64(i) * 1000, CompleteNs: uint64(i+1) * 1000})
				}
			}
			got := rules(e.Evaluate(time.Now()))
			if len(got) != len(tc.want) {
				t.Errorf("findings %v, want %v", got, tc.want)
			}
			for r, n := range tc.want {
				if got[r] != n {
					t.Errorf("findings %v, want %v", got, tc.want)
				}
			}
		})
	}
}

// A process whose GPU the host does not show gets no lane and no overlap
// judgement: the check is a SKIP that says why, never a default capacity.
func TestEvaluatorUnknownGPU(t *testing.T) {
	place := func(pid uint32) checks.Placement {
		return checks.Placement{Why: fmt.Sprintf("GPU of pid %d unknown: no GPU in /fixture/sys", pid)}
	}
	e := judge.NewEvaluator(judge.EvaluatorConfig{Place: place})
	for i := range 300 {
		for _, stream := range []uint64{1, 2} { // would saturate any lane
			e.Transfer(&correlate.Transfer{PID: 7, Stream: stream, Op: event.OpCopy, Direction: correlate.DirH2D, Bytes: 1 << 20,
				HostMem: event.MemPinned, SubmitNs: uint64(i) * 1000, CompleteNs: uint64(i+1) * 1000})
		}
	}
	v := e.Evaluate(time.Now())
	if len(v.Lanes) != 0 {
		t.Errorf("lanes %+v for a GPU the host did not show", v.Lanes)
	}
	var overlap *checks.Check
	for i, c := range v.Checks {
		if c.Name == checks.CheckOverlap {
			overlap = &v.Checks[i]
		}
	}
	if overlap == nil || overlap.Status != checks.Skip || overlap.Detail != "GPU of pid 7 unknown: no GPU in /fixture/sys" {
		t.Errorf("overlap check %+v, want a SKIP with the reason", overlap)
	}
	if rules(v)["same-direction-overlap"] != 0 {
		t.Errorf("findings %v", rules(v))
	}
}
