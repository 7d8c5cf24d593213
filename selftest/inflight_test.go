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

func TestCheckInflight(t *testing.T) {
	for _, c := range []struct {
		name, scenario string
		serial         bool
		edit           func(got []correlate.Transfer)
		ok             bool
		text           string
	}{
		{"serial fires", "inflight-serial", true, nil, true, "keeps too little in flight"},
		{"queued does not", "inflight-queued", false, nil, true, ""},
		{"any other scenario must not fire", "hicache-load", false, nil, true, ""},
		// the agent proving no completion judges nothing: the designed
		// verdict is not met, whatever the truth shows
		{"agent without completions", "inflight-serial", true, func(got []correlate.Transfer) {
			for i := range got {
				got[i].CompleteNs = 0
			}
		}, false, "its brackets [pid 7 stream 0xa H2D"},
		// the verdict is the design's, not the run's: a serial flow in a
		// scenario designed silent fails the row, and so does a queued one
		// where a serial one was designed
		{"a serial flow where none was designed", "hicache-load", true, nil, false, "designed to stay silent"},
		{"a queued flow where a serial one was designed", "inflight-serial", false, nil, false, "designed to raise it"},
	} {
		t.Run(c.name, func(t *testing.T) {
			truth, got := pageLoad(c.serial)
			if c.edit != nil {
				c.edit(got)
			}
			res := Result{Scenario: c.scenario}
			checkInflight(&res, c.scenario, []scenarioProc{{pid: 7, gpu: privateGPU(7), truth: truth}}, got)
			text := strings.Join(res.Problems, " | ")
			if res.OK() != c.ok || !strings.Contains(text, c.text) {
				t.Errorf("ok %v, want ok %v with %q: %s", res.OK(), c.ok, c.text, text)
			}
		})
	}
}
