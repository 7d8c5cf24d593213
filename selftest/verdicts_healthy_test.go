package selftest

import (
	"strings"
	"testing"

	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
)

// A healthy row passes with INFO findings and fails on a WARN or FAIL of
// the agent's window: the decode loop's metadata copies are INFO; the same
// step copying 4 MiB of pageable memory is a FAIL the design did not have.
func TestCheckDesignedHealthy(t *testing.T) {
	step := func(bulk bool) []correlate.Transfer {
		var ts []correlate.Transfer
		at := uint64(1e6)
		for range 60 {
			for _, b := range []uint64{64, 192, 384, 512} {
				ts = append(ts, correlate.Transfer{PID: 5, TID: 5, API: "cudaMemcpyAsync", Op: event.OpCopy, Mover: correlate.MoverCopyEngine,
					Direction: correlate.DirH2D, Bytes: b, HostMem: event.MemPageable, SubmitNs: at, CompleteNs: at + 1e6})
				at += 1000
			}
			if bulk {
				ts = append(ts, correlate.Transfer{PID: 5, TID: 5, API: "cudaMemcpyAsync", Op: event.OpCopy, Mover: correlate.MoverCopyEngine,
					Direction: correlate.DirH2D, Bytes: 4 << 20, HostMem: event.MemPageable, SubmitNs: at, CompleteNs: at + 1e6})
			}
			at += 1e6
		}
		return ts
	}
	for _, c := range []struct {
		name string
		bulk bool
		ok   bool
		note string
	}{
		{"metadata copies", false, true, ""},
		{"bulk pageable copies", true, false, "the agent's window raised [pageable-copy/fail]: fail pageable-copy pid 5"},
	} {
		res := Result{}
		checkDesigned(&res, "decode-loop", []scenarioProc{{pid: 5, gpu: privateGPU(5)}}, step(c.bulk), nil)
		text := strings.Join(res.Problems, "\n")
		if res.OK() != c.ok || !strings.Contains(text, c.note) {
			t.Errorf("%s: ok %v errs %d:\n%s", c.name, res.OK(), res.OtherErrs, text)
		}
	}
}
