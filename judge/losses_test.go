package judge_test

import (
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lanewatch/lanewatch/checks"
	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/judge"
)

// lossyTransfers are a window's copies: pid 10's pageable ones fire
// pageable-copy, pid 11's pinned ones pass; both on one GPU's lanes.
func lossyTransfers(w *judge.Window) {
	for i := range 3 {
		w.Transfer(&correlate.Transfer{PID: 10, API: "cudaMemcpy", Op: event.OpCopy, Direction: correlate.DirH2D, Bytes: 1 << 20,
			HostMem: event.MemPageable, SubmitNs: uint64(i) * 1e6, CompleteNs: uint64(i)*1e6 + 5e5})
		w.Transfer(&correlate.Transfer{PID: 11, API: "cudaMemcpyAsync", Op: event.OpCopy, Direction: correlate.DirD2H, Bytes: 1 << 20,
			HostMem: event.MemPinned, Stream: 1, SubmitNs: uint64(i) * 1e6, CompleteNs: uint64(i)*1e6 + 5e5})
	}
}

func lossyPlace(uint32) checks.Placement {
	return checks.Placement{GPU: "0000:17:00.0", InboundGBs: 4, OutboundGBs: 4}
}

// judgeLossy judges lossyTransfers in a fresh window after lose told it
// of its losses.
func judgeLossy(lose func(w *judge.Window)) []checks.Check {
	w := judge.NewWindow(false)
	lossyTransfers(w)
	lose(w)
	env := &judge.Env{Span: time.Second, Place: lossyPlace, Capacity: func(string) float64 { return 4 }}
	env.Lanes, _ = judge.LaneRates(w, env, nil, nil)
	return judge.Judge(w, env).Checks
}

// A window that lost events judges the rest as before, and the checks
// resting on the lost part say so: a PASS becomes a SKIP saying why, a
// WARN or FAIL keeps its status and each finding says why in its
// evidence, a SKIP stays as it was; the checks of a process that lost
// nothing are as in a whole window, the GPU's (every process's events)
// are not. The whole window's verdict is the baseline.
func TestLossyWindowChecks(t *testing.T) {
	whole := judgeLossy(func(*judge.Window) {})
	if !slices.ContainsFunc(whole, func(c checks.Check) bool { return c.Scope == "pid 11" && c.Status == checks.Pass }) ||
		!slices.ContainsFunc(whole, func(c checks.Check) bool { return c.Scope == "pid 10" && len(c.Findings) > 0 }) ||
		!slices.ContainsFunc(whole, func(c checks.Check) bool { return strings.HasPrefix(c.Scope, "GPU ") && c.Status == checks.Pass }) {
		t.Fatalf("the whole window lacks a PASS of pid 11, a finding of pid 10 or a GPU's PASS: the test proves nothing\n%+v", whole)
	}
	for _, tc := range []struct {
		name     string
		lose     func(w *judge.Window)
		affected func(scope string) bool
		why      string
	}{
		{"pid 11 lost events", func(w *judge.Window) { w.Lost(11, false) },
			func(s string) bool { return s != "pid 10" }, "events of pid 11 were lost"},
		{"any process lost events", func(w *judge.Window) { w.Lost(11, false); w.Lost(0, true) },
			func(string) bool { return true }, "events of any process may have been lost"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lossy := judgeLossy(tc.lose)
			if len(lossy) != len(whole) {
				t.Fatalf("%d checks, the whole window %d", len(lossy), len(whole))
			}
			for i, c := range lossy {
				b := whole[i]
				if !tc.affected(b.Scope) || b.Status == checks.Skip {
					if !reflect.DeepEqual(c, b) {
						t.Errorf("%s %s changed though its events are whole:\n got %+v\nwant %+v", b.Scope, b.Name, c, b)
					}
					continue
				}
				if !strings.Contains(c.Incomplete, tc.why) {
					t.Errorf("%s %s: incomplete %q, want it to say %q", b.Scope, b.Name, c.Incomplete, tc.why)
				}
				switch b.Status {
				case checks.Pass:
					if c.Status != checks.Skip || c.Detail != c.Incomplete+"; on the events seen: "+b.Detail {
						t.Errorf("%s %s: a PASS on part of the window is %s %q", b.Scope, b.Name, c.Status, c.Detail)
					}
				case checks.Warn, checks.Fail:
					if c.Status != b.Status || len(c.Findings) != len(b.Findings) {
						t.Fatalf("%s %s: %s with %d findings, the whole window %s with %d", b.Scope, b.Name, c.Status, len(c.Findings), b.Status, len(b.Findings))
					}
					for k, f := range c.Findings {
						if want := append(slices.Clone(b.Findings[k].Evidence), c.Incomplete); !slices.Equal(f.Evidence, want) {
							t.Errorf("%s: evidence %q, want %q", f.Rule, f.Evidence, want)
						}
					}
				}
			}
		})
	}
}

// The evaluator's windows: the probes' drop counters moving while a
// window is open make it lossy for every process, with the count; an event
// saying its process lost events makes that process's checks incomplete;
// the next window starts whole.
func TestEvaluatorLossyWindows(t *testing.T) {
	var dropped uint64 = 7                  // counted before the evaluator started: no window's
	shed := map[uint32]uint64{10: 3, 12: 4} // likewise
	e := judge.NewEvaluator(judge.EvaluatorConfig{Place: lossyPlace, Drops: func() (uint64, error) { return dropped, nil },
		Shed: func() (map[uint32]uint64, error) { return maps.Clone(shed), nil }})
	start := time.Now()
	incomplete := func(v judge.Verdict) (n int) {
		for _, c := range v.Checks {
			if c.Incomplete != "" {
				n++
			}
			if c.Status == checks.Pass && c.Incomplete != "" {
				t.Errorf("%s %s passes on part of the window: %s", c.Scope, c.Name, c.Detail)
			}
		}
		return n
	}
	feed := func() {
		for i := range 3 {
			e.Transfer(&correlate.Transfer{PID: 10, API: "cudaMemcpy", Op: event.OpCopy, Direction: correlate.DirH2D, Bytes: 1 << 20,
				HostMem: event.MemPageable, SubmitNs: uint64(i) * 1e6, CompleteNs: uint64(i)*1e6 + 5e5})
		}
	}

	feed()
	dropped += 5
	v := e.Evaluate(start.Add(time.Second))
	if v.Losses.Events != 5 || !v.Losses.All || incomplete(v) == 0 {
		t.Errorf("5 drops in the window: losses %+v, %d incomplete checks", v.Losses, incomplete(v))
	}
	if i := slices.IndexFunc(v.Findings, func(f correlate.Finding) bool { return f.Rule == "pageable-copy" }); i < 0 ||
		!slices.Contains(v.Findings[i].Evidence, "incomplete: 5 events lost or truncated in the probes while the window was open (lanewatch_window_events_lost), their processes unknown") {
		t.Errorf("findings %+v: want pageable-copy with the loss in its evidence", v.Findings)
	}

	feed()
	e.Lost(10, false)
	v = e.Evaluate(start.Add(2 * time.Second))
	if v.Losses.Events != 0 || v.Losses.All || !v.Losses.PIDs[10] || incomplete(v) == 0 {
		t.Errorf("pid 10 lost events: losses %+v, %d incomplete checks", v.Losses, incomplete(v))
	}

	// Copies of pid 10 shed: its checks rest on part of the window; pid
	// 12's count went down (folded away once it exited), which is no shedding.
	feed()
	shed[10], shed[12] = 3+40, 0
	v = e.Evaluate(start.Add(3 * time.Second))
	if v.Losses.Events != 0 || v.Losses.All || len(v.Losses.PIDs) != 0 || v.Losses.Shed[10] != 40 || len(v.Losses.Shed) != 1 || incomplete(v) == 0 {
		t.Errorf("pid 10 shed 40 copies: losses %+v, %d incomplete checks", v.Losses, incomplete(v))
	}
	if !slices.ContainsFunc(v.Checks, func(c checks.Check) bool {
		return c.Scope == "pid 10" && strings.Contains(c.Incomplete, "40 copies of pid 10 were shed")
	}) {
		t.Errorf("no check of pid 10 says its 40 copies were shed: %+v", v.Checks)
	}

	feed()
	v = e.Evaluate(start.Add(4 * time.Second))
	if v.Losses.Lossy() || incomplete(v) != 0 || len(v.Findings) == 0 {
		t.Errorf("a whole window: losses %+v, %d incomplete checks, findings %+v", v.Losses, incomplete(v), v.Findings)
	}
}
