package selftest

import (
	"strings"
	"testing"

	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
)

// twoStreams is an h2d-overlap-shaped truth and the agent's records of it:
// streams 0xa and 0xb each queue 8 copies of 8 MiB at once on a 4 GB/s lane,
// the engine finishing one of each every 4 ms (2 GB/s each, 32 ms), and each
// stream synchronised once its copies are done, at syncNs. The agent stamps
// a microsecond inside each call.
func twoStreams(syncNs uint64) ([]TruthCall, []correlate.Transfer) {
	const us, ms, pid = uint64(1e3), uint64(1e6), 7
	var truth []TruthCall
	var got []correlate.Transfer
	seq := 0
	for i := range uint64(8) {
		for _, stream := range []uint64{0xa, 0xb} {
			seq++
			at := uint64(seq) * 2 * us
			truth = append(truth, TruthCall{Seq: seq, PID: pid, API: "cudaMemcpyAsync", Op: "copy", Bytes: 8 << 20, Direction: "H2D",
				Stream: stream, TCallNs: at, TReturnNs: at + us, EngineEndNs: (i + 1) * 4 * ms})
			got = append(got, correlate.Transfer{PID: pid, Stream: stream, API: "cudaMemcpyAsync", Op: "copy", Direction: correlate.DirH2D,
				Bytes: 8 << 20, HostMem: event.MemPinned, SubmitNs: at + us/2, CompleteNs: syncNs - us/2})
		}
	}
	for _, stream := range []uint64{0xa, 0xb} {
		seq++
		truth = append(truth, TruthCall{Seq: seq, PID: pid, API: "cudaStreamSynchronize", Op: "stream_sync", Stream: stream,
			TCallNs: 100 * us, TReturnNs: syncNs})
	}
	return truth, got
}

func TestCheckOverlap(t *testing.T) {
	const ms = uint64(1e6)
	cases := []struct {
		name     string
		scenario string
		syncNs   uint64
		edit     func(got []correlate.Transfer)
		overlap  string // the row's verdict
		err      bool   // OverlapErr
		other    int    // OtherErrs
		text     string // in the problems
	}{
		{"agent and truth agree", "h2d-overlap", 33 * ms, nil, "flagged", false, 0, "overlap as the truth measured it"},
		// The agent's window must group the transfers into the truth's
		// flows: one stream reported for both makes one flow, no overlap.
		{"agent merges two streams", "h2d-overlap", 33 * ms, func(got []correlate.Transfer) {
			for i := range got {
				got[i].Stream = 0xa
			}
		}, "none", true, 0, "the agent flagged [], the rule on the truth's flows at the agent's stamps [private GPU of pid 7 inbound]"},
		{"a shape the scenario was not designed to make", "no-overlap", 33 * ms, nil, "flagged", true, 0,
			"the scenario produced an overlap it was not designed to"},
		{"a stamp outside the truth's brackets", "h2d-overlap", 33 * ms, func(got []correlate.Transfer) {
			got[3].CompleteNs = 40 * ms // after the synchronisation that proved it done returned
		}, "flagged", false, 1, "stamped"},
		// Completions proven 170 ms after the lanes finished: the agent's
		// evidence shows no saturated lane, the lanes do; the agent is
		// right by its evidence and the row says so.
		{"completions proven late", "h2d-overlap", 200 * ms, nil, "none~", false, 0, "completions proven late on this run"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			truth, got := twoStreams(c.syncNs)
			if c.edit != nil {
				c.edit(got)
			}
			res := Result{Scenario: c.scenario}
			checkOverlap(&res, c.scenario, []scenarioProc{{pid: 7, gpu: privateGPU(7), truth: truth}}, got)
			text := strings.Join(res.Problems, " | ")
			wrong := res.OverlapErr || res.ShapeMissed != "" // the agent's verdict, or the scenario's shape
			if res.Overlap != c.overlap || wrong != c.err || res.OtherErrs != c.other || !strings.Contains(text, c.text) || (c.err && res.OK()) {
				t.Errorf("overlap %q err %v other %d, want %q %v %d with %q: %s", res.Overlap, wrong, res.OtherErrs,
					c.overlap, c.err, c.other, c.text, text)
			}
		})
	}
}

// A scenario whose truth missed its designed shape is run again, at most
// shapeRuns times, only while its rows are otherwise exact; each row says
// why it was run again.
func TestRerunUnshaped(t *testing.T) {
	missed := "overlap: the scenario did not produce its designed overlap on this run: lanes x"
	unshaped := Result{Scenario: "s", ShapeMissed: missed, Problems: []string{missed}}
	wrong := unshaped
	wrong.DirectionErrs = 1
	for _, tc := range []struct {
		name  string
		runs  []Result
		calls int
		ok    bool
	}{
		{"shaped at once", []Result{{Scenario: "s"}}, 1, true},
		{"shaped on the second run", []Result{unshaped, {Scenario: "s"}}, 2, true},
		{"never shaped", []Result{unshaped, unshaped, unshaped, {Scenario: "s"}}, shapeRuns, false},
		{"wrong otherwise: not run again", []Result{wrong, {Scenario: "s"}}, 1, false},
	} {
		calls := 0
		rs := rerunUnshaped("s", func() []Result { calls++; return []Result{tc.runs[calls-1]} })
		if calls != tc.calls || rs[0].OK() != tc.ok {
			t.Errorf("%s: %d runs, OK %v; want %d, %v: %q", tc.name, calls, rs[0].OK(), tc.calls, tc.ok, rs[0].Problems)
		}
		if notes := len(rs[0].Problems) - len(tc.runs[calls-1].Problems); notes != calls-1 {
			t.Errorf("%s: %d notes of earlier runs, want %d: %q", tc.name, notes, calls-1, rs[0].Problems)
		}
	}
}
