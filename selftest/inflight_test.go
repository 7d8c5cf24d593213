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
		truth = append(truth, TruthCall{Seq: seq, PID: pid, API: "cudaStreamSynchronize", Op: "stream_sync", Stream: 0xa, TCallNs: at, TReturnNs: end})
		for _, i := range batch {
			got[i].CompleteNs = end - us
		}
		got[batch[len(batch)-1]].CompleteNear = true // the sync follows the batch's last copy
		batch, at = nil, end+us
	}
	for i := range 64 {
		seq++
		truth = append(truth, TruthCall{Seq: seq, PID: pid, API: "cudaMemcpyAsync", Op: "copy", Bytes: 16 << 10, Direction: "H2D",
			Stream: 0xa, TCallNs: at, TReturnNs: at + us, EngineEndNs: at + 4*us})
		got = append(got, correlate.Transfer{PID: pid, Stream: 0xa, API: "cudaMemcpyAsync", Op: "copy", Direction: correlate.DirH2D,
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
		ok, shape      bool
		text           string
	}{
		{"serial fires", "inflight-serial", true, nil, true, false, "keeps too little in flight"},
		{"queued does not", "inflight-queued", false, nil, true, false, "in-flight as the truth's brackets measured it: []"},
		{"any other scenario must not fire", "hicache-load", false, nil, true, false, ""},
		// the agent proving no completion: it judges nothing, the truth at
		// its stamps neither, but the brackets show the designed flow
		{"agent without completions", "inflight-serial", true, func(got []correlate.Transfer) {
			for i := range got {
				got[i].CompleteNs = 0
			}
		}, false, false, "where the truth's brackets [pid 7 stream 0xa H2D"},
		{"a serial flow where none was designed", "hicache-load", true, nil, false, true, "made a latency-bound flow it was not designed to"},
		{"a queued flow where a serial one was designed", "inflight-serial", false, nil, false, true, "did not make its designed latency-bound flow"},
	} {
		t.Run(c.name, func(t *testing.T) {
			truth, got := pageLoad(c.serial)
			if c.edit != nil {
				c.edit(got)
			}
			res := Result{Scenario: c.scenario}
			checkInflight(&res, c.scenario, []scenarioProc{{pid: 7, gpu: privateGPU(7), truth: truth}}, got)
			text := strings.Join(res.Problems, " | ")
			if res.OK() != c.ok || (res.ShapeMissed != "") != c.shape || !strings.Contains(text, c.text) {
				t.Errorf("ok %v shape missed %q, want ok %v missed %v with %q: %s", res.OK(), res.ShapeMissed, c.ok, c.shape, c.text, text)
			}
		})
	}
}
