package judge_test

import (
	"testing"
	"time"

	"github.com/lanewatch/lanewatch/checks"
	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/exporters"
	"github.com/lanewatch/lanewatch/judge"
)

// A window of copies each synchronised before the next fires
// too-little-in-flight on its lane and reports the lane's bytes in flight
// averaged over the window; the same copies on a host whose link capacity
// is unknown are skipped with the reason, not judged.
func TestEvaluatorInFlight(t *testing.T) {
	for _, tc := range []struct {
		name  string
		gbs   float64
		fires bool
	}{{"capacity known", 4, true}, {"capacity unknown", 0, false}} {
		place := func(uint32) checks.Placement {
			return checks.Placement{GPU: "0000:17:00.0", InboundGBs: tc.gbs, OutboundGBs: tc.gbs}
		}
		e := judge.NewEvaluator(judge.EvaluatorConfig{Interval: time.Second, Place: place})
		start := time.Now()
		at := uint64(1e6)
		for range 100 { // 16 KiB each, 20 µs from the call to the return of the sync right after it
			e.Transfer(&correlate.Transfer{PID: 10, Stream: 0x10, API: "cudaMemcpyAsync", Op: event.OpCopy, Direction: correlate.DirH2D,
				Bytes: 16 << 10, HostMem: event.MemPinned, SubmitNs: at, CompleteNs: at + 20_000, CompleteNear: true})
			at += 21_000
		}
		v := e.Evaluate(start.Add(time.Second))
		if got := rules(v)["too-little-in-flight"]; (got == 1) != tc.fires {
			t.Errorf("%s: too-little-in-flight %d times: %v", tc.name, got, v.Findings)
		}
		var lanes []exporters.Sample
		for _, s := range v.Series {
			if s.Desc.Name == "lanewatch_inflight_bytes" {
				lanes = append(lanes, s)
			}
		}
		// 16 KiB in flight 2 ms of the 1 s window
		if len(lanes) != 1 || lanes[0].Labels[0] != "0000:17:00.0" || lanes[0].Value < 32 || lanes[0].Value > 34 {
			t.Errorf("%s: lanes %+v", tc.name, lanes)
		}
		skipped := false
		for _, c := range v.Checks {
			skipped = skipped || (c.Name == checks.CheckInFlight && c.Status == checks.Skip)
		}
		if skipped == tc.fires {
			t.Errorf("%s: skipped %v: %+v", tc.name, skipped, v.Checks)
		}
	}
}
