package selftest

import (
	"strings"
	"testing"

	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
)

// pageLoad is an inflight-serial (serial) or inflight-queued shaped truth
// of 64 copies of 16 KiB on stream 0xa, and the agent's records of it
// stamped a microsecond inside the truth's brackets: serial waits 20 µs for
// each copy; queued submits 32 a microsecond apart and synchronises once
// per 32, the engine taking 4 µs a copy.
func pageLoad(serial bool) ([]TruthCall, []correlate.Transfer) {
	const us, pid = uint64(1e3), 7
	var truth []TruthCall
	var got []correlate.Transfer
	seq, at := 0, uint64(1e6)
	var batch []int
	sync := func() {
		seq++
		end := at + 20*us
		if !serial {
			end = at + uint64(len(batch))*4*us
		}
		truth = append(truth, TruthCall{Seq: seq, PID: pid, API: "cudaStreamSynchronize", Op: TruthStreamSync, Stream: 0xa, TCallNs: at, TReturnNs: end})
		for _, i := range batch {
			got[i].CompleteNs = end - us
		}
		got[batch[len(batch)-1]].CompleteNear = true // the sync follows the batch's last copy
		batch, at = nil, end+us
	}
	for i := range 64 {
		seq++
		truth = append(truth, TruthCall{Seq: seq, PID: pid, API: "cudaMemcpyAsync", Op: TruthCopy, Bytes: 16 << 10, Direction: "H2D",
			Stream: 0xa, TCallNs: at, TReturnNs: at + us, EngineEndNs: at + 4*us})
		got = append(got, correlate.Transfer{PID: pid, Stream: 0xa, API: "cudaMemcpyAsync", Op: event.OpCopy, Direction: correlate.DirH2D,
			Bytes: 16 << 10, HostMem: event.MemPinned, SubmitNs: at + us/2})
		batch = append(batch, i)
		at += us
		if serial || len(batch) == 32 {
			sync()
		}
	}
	return truth, got
}

// The row's too-little-in-flight verdict is checkDesigned's;
// noteInflight only says what the rule measured of the agent's flows and
// the truth's, and never fails a row.
func TestInflightRow(t *testing.T) {
	// pageLoad's 64 copies are too few for fragmented-copies, which
	// inflight-serial's and inflight-queued's 256 raise: designed here, for
	// this test only, as those two without it.
	designed["serial-64"] = []string{"too-little-in-flight/warn"}
	defer delete(designed, "serial-64")
	for _, c := range []struct {
		name, scenario string
		serial         bool
		edit           func(got []correlate.Transfer)
		ok             bool
		text           string
	}{
		{"serial fires", "serial-64", true, nil, true, "keeps too little in flight"},
		{"queued does not", "queued-64", false, nil, true, ""},
		{"any other scenario must not fire", "hicache-load", false, nil, true, ""},
		// the agent proving no completion judges nothing: the designed
		// verdict is not met, whatever the truth shows
		{"agent without completions", "serial-64", true, func(got []correlate.Transfer) {
			for i := range got {
				got[i].CompleteNs = 0
			}
		}, false, "at its brackets [pid 7 stream 0xa H2D"},
		// the verdict is the design's, not the run's: a serial flow in a
		// scenario designed silent fails the row, and so does a queued one
		// where a serial one was designed
		{"a serial flow where none was designed", "hicache-load", true, nil, false, "hicache-load is designed to raise []"},
		{"a queued flow where a serial one was designed", "serial-64", false, nil, false, "serial-64 is designed to raise [too-little-in-flight/warn], the agent's window raised []"},
	} {
		t.Run(c.name, func(t *testing.T) {
			truth, got := pageLoad(c.serial)
			if c.edit != nil {
				c.edit(got)
			}
			res := Result{Scenario: c.scenario}
			procs := []scenarioProc{{pid: 7, gpu: privateGPU(7), truth: truth}}
			noteInflight(&res, c.scenario, procs, got)
			if !res.OK() {
				t.Errorf("noteInflight failed a row: %s", strings.Join(res.Problems, " | "))
			}
			checkDesigned(&res, c.scenario, procs, got, nil)
			text := strings.Join(res.Problems, " | ")
			if res.OK() != c.ok || !strings.Contains(text, c.text) {
				t.Errorf("ok %v, want ok %v with %q: %s", res.OK(), c.ok, c.text, text)
			}
		})
	}
}
