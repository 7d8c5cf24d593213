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
			truth = append(truth, TruthCall{Seq: seq, PID: pid, API: "cudaMemcpyAsync", Op: TruthCopy, Bytes: 8 << 20, Direction: "H2D",
				Stream: stream, TCallNs: at, TReturnNs: at + us, EngineEndNs: (i + 1) * 4 * ms})
			got = append(got, correlate.Transfer{PID: pid, Stream: stream, API: "cudaMemcpyAsync", Op: event.OpCopy, Direction: correlate.DirH2D,
				Bytes: 8 << 20, HostMem: event.MemPinned, SubmitNs: at + us/2, CompleteNs: syncNs - us/2})
		}
	}
	for _, stream := range []uint64{0xa, 0xb} {
		seq++
		truth = append(truth, TruthCall{Seq: seq, PID: pid, API: "cudaStreamSynchronize", Op: TruthStreamSync, Stream: stream,
			TCallNs: 100 * us, TReturnNs: syncNs})
	}
	return truth, got
}

// checkOverlap fails a row on the agent's facts (a stamp outside the
// truth's brackets) and marks its OVERLAP "~" where the truth's views
// differ; the verdict fails the row in checkDesigned, once, whatever the
// truth measured on this run.
func TestCheckOverlap(t *testing.T) {
	const ms = uint64(1e6)
	cases := []struct {
		name     string
		scenario string
		syncNs   uint64
		edit     func(got []correlate.Transfer)
		overlap  string // the row's OVERLAP
		facts    int    // OtherErrs of checkOverlap
		ok       bool   // the row's result, its verdict judged
		text     string // in the problems
	}{
		{"agent and truth agree", "h2d-overlap", 33 * ms, nil, "flagged", 0, true, "overlap as the truth measured it"},
		// The agent's window must group the transfers into the truth's
		// flows: one stream reported for both makes one flow, no overlap.
		{"agent merges two streams", "h2d-overlap", 33 * ms, func(got []correlate.Transfer) {
			for i := range got {
				got[i].Stream = 0xa
			}
		}, "none~", 0, false, "h2d-overlap is designed to raise [same-direction-overlap/warn], the agent's window raised []"},
		// the verdict is the design's: an overlap in a scenario designed
		// without one fails the row whatever the truth shows
		{"a shape the scenario was not designed to make", "no-overlap", 33 * ms, nil, "flagged", 0, false,
			"no-overlap is designed to raise [], the agent's window raised [same-direction-overlap/warn]"},
		{"a stamp outside the truth's brackets", "h2d-overlap", 33 * ms, func(got []correlate.Transfer) {
			got[3].CompleteNs = 40 * ms // after the synchronisation that proved it done returned
		}, "flagged", 1, false, "stamped"},
		// Completions proven 170 ms after the lanes finished: the agent's
		// evidence shows no saturated lane, the lanes do. The agent is
		// right by its evidence, but the row is not the design: it fails
		// (a shape that needs timely completions is no shape to test with).
		{"completions proven late", "h2d-overlap", 200 * ms, nil, "none~", 0, false, "the lanes [private GPU of pid 7 inbound]"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			truth, got := twoStreams(c.syncNs)
			if c.edit != nil {
				c.edit(got)
			}
			res := Result{Scenario: c.scenario}
			procs := []scenarioProc{{pid: 7, gpu: privateGPU(7), truth: truth}}
			checkOverlap(&res, c.scenario, procs, got)
			facts := res.OtherErrs
			checkDesigned(&res, c.scenario, procs, got, nil)
			text := strings.Join(res.Problems, " | ")
			if res.Overlap != c.overlap || facts != c.facts || res.OK() != c.ok || !strings.Contains(text, c.text) {
				t.Errorf("overlap %q facts %d ok %v, want %q %d %v with %q: %s", res.Overlap, facts, res.OK(),
					c.overlap, c.facts, c.ok, c.text, text)
			}
		})
	}
}
