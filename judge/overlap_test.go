package judge_test

import (
	"strings"
	"testing"
	"time"

	"github.com/lanewatch/lanewatch/checks"
	"github.com/lanewatch/lanewatch/collectors"
	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/judge"
)

// fakeCounters is a GPU counter source on a clock the test moves: each
// Sample reads one GPU's PCIe totals at the clock's time.
type fakeCounters struct {
	now     *uint64 // CLOCK_MONOTONIC ns, the evaluator's Now too
	rxBytes func(ns uint64) uint64
}

func (f *fakeCounters) Sample() (collectors.GPUSnapshot, error) {
	return collectors.GPUSnapshot{Time: time.Unix(0, int64(*f.now)), Source: "fake", GPUs: []collectors.GPUReading{{
		BusID: "0000:17:00.0", PCIeRxBytes: f.rxBytes(*f.now), HasPCIeBytes: true}}}, nil
}
func (f *fakeCounters) Source() string { return "fake" }
func (f *fakeCounters) Close() error   { return nil }

// The evaluator reads the counters between windows (SampleCounters) and
// the overlap rule takes the link's rate while two processes' flows
// contended from them: here the flows' completions were proven late, so the
// probes alone see 1.68 GB/s on a 4 GB/s lane, and the window's average
// (both loads in a 100 ms window) is lower still; the counters saw the lane
// full while they overlapped.
func TestEvaluatorOverlapFromCounters(t *testing.T) {
	const ms = uint64(1e6)
	place := func(uint32) checks.Placement {
		return checks.Placement{GPU: "0000:17:00.0", InboundGBs: 4, OutboundGBs: 4}
	}
	flows := func(e *judge.Evaluator) {
		for _, pid := range []uint32{7, 8} { // 32 MiB each, in flight 10..50 ms
			e.Transfer(&correlate.Transfer{PID: pid, Stream: 0x10, Op: event.OpCopy, Direction: correlate.DirH2D, Bytes: 32 << 20,
				HostMem: event.MemPinned, SubmitNs: 10 * ms, CompleteNs: 50 * ms})
		}
	}
	overlap := func(v judge.Verdict) *correlate.Finding {
		for i, f := range v.Findings {
			if f.Rule == "same-direction-overlap" {
				return &v.Findings[i]
			}
		}
		return nil
	}

	now := uint64(1)
	// the counters: the lane full (3.9 GB/s) from 12 to 48 ms, idle otherwise
	counters := &fakeCounters{now: &now, rxBytes: func(ns uint64) uint64 {
		if ns <= 12*ms {
			return 0
		}
		return uint64(3.9 * float64(min(ns, 48*ms)-12*ms))
	}}
	e := judge.NewEvaluator(judge.EvaluatorConfig{Interval: time.Second, Place: place, GPU: counters,
		Now: func() uint64 { return now }})
	e.Evaluate(time.Now()) // opens the window with the first reading
	flows(e)
	for now = 10 * ms; now <= 100*ms; now += 10 * ms {
		e.SampleCounters()
	}
	v := e.Evaluate(time.Now())
	f := overlap(v)
	if f == nil || !strings.Contains(strings.Join(f.Evidence, " "), "from the GPU's PCIe counters") {
		t.Fatalf("counters during the overlap: %+v", v.Findings)
	}
	averaged := false
	for _, l := range v.Lanes {
		if l.Direction == checks.Inbound && l.HasMeasured {
			averaged = true
			if l.Measured > 0.75*4e9 { // 3.9 GB/s for 36 of the window's 100 ms
				t.Errorf("the window's average %v would have fired by itself", l.Measured)
			}
		}
	}
	if !averaged {
		t.Errorf("no measured inbound lane: %+v", v.Lanes)
	}

	// The same flows without counters: the probes' lower bound is all
	// there is, and it does not reach the lane's capacity.
	e = judge.NewEvaluator(judge.EvaluatorConfig{Interval: time.Second, Place: place})
	flows(e)
	if f := overlap(e.Evaluate(time.Now())); f != nil {
		t.Errorf("probes alone fired: %+v", f)
	}
}
