package selftest

import (
	"strings"
	"testing"

	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
)

// checkCompute fails a row whose activities differ from the truth's calls
// or whose overlap bound lies below what the truth's engines ran together;
// an overlapped shape that did not overlap on the engines is a missed
// shape, not an agent error. The row's verdict is checkDesigned's: a rule
// fired where the design has none fails the row there, once.
func TestCheckCompute(t *testing.T) {
	truth := []TruthCall{
		{Op: TruthCopy, Direction: "H2D", Stream: 0x10, EngineStartNs: 100, EngineEndNs: 200},
		{Op: TruthLaunch, Stream: 0, EngineStartNs: 150, EngineEndNs: 300},
		{Op: TruthStreamSync, Stream: 0},
		{Op: TruthStreamSync, Result: 709}, // failed: no activity
		{End: true},
	}
	got := []correlate.Transfer{{PID: 1, Stream: 0x10, Op: event.OpCopy, Mover: correlate.MoverCopyEngine, Direction: correlate.DirH2D,
		Bytes: 1, SubmitNs: 90, CompleteNs: 400}}
	launch := correlate.Activity{PID: 1, Op: event.OpLaunch, CallNs: 95, ReturnNs: 96}
	syncAct := correlate.Activity{PID: 1, Op: event.OpStreamSync, CallNs: 97, ReturnNs: 400}
	for _, c := range []struct {
		name     string
		acts     []correlate.Activity
		engine   uint64 // the kernel's engine end
		errs     int
		problems string
	}{
		{"exact", []correlate.Activity{launch, syncAct}, 300, 0, "truth's engines 0.000 ms"},
		{"a wait not reported", []correlate.Activity{launch}, 300, 1, "the agent reported 1 launch, 0 graph_launch, 0 stream_sync"},
		{"bound below the engines", []correlate.Activity{launch, syncAct}, 500, 1, "is below"},
		// no overlap on the engines is no failure: the bound is only a bound
		{"no overlap on the engines", []correlate.Activity{launch, syncAct}, 100, 0, "truth's engines 0.000 ms"},
	} {
		tr := append([]TruthCall(nil), truth...)
		tr[1].EngineStartNs, tr[1].EngineEndNs = 150, c.engine
		if c.engine == 100 {
			tr[1].EngineStartNs = 50
		}
		if c.engine == 500 { // the agent's copy ends at 400: the engines say the kernel and copy overlapped more
			tr[0].EngineStartNs, tr[0].EngineEndNs, tr[1].EngineStartNs = 0, 500, 0
		}
		res := Result{}
		checkCompute(&res, "layer-compute", 1, tr, got, c.acts)
		checkDesigned(&res, "layer-compute", []scenarioProc{{pid: 1, gpu: privateGPU(1)}}, got, c.acts)
		text := strings.Join(res.Problems, "\n")
		if res.OtherErrs != c.errs || !strings.Contains(text, c.problems) {
			t.Errorf("%s: errs %d problems:\n%s", c.name, res.OtherErrs, text)
		}
	}
	// every other scenario must fire nothing: the row's verdict fails it,
	// and the facts alone do not (hicache-load has no compute truth)
	res := Result{}
	acts := []correlate.Activity{launch}
	for i := uint64(0); i < 4; i++ { // a wait per layer while the load (90-400) was under way
		acts = append(acts, correlate.Activity{PID: 1, Op: event.OpEventRecord, Stream: 0x10, CallNs: 91 + i, ReturnNs: 91 + i},
			correlate.Activity{PID: 1, Op: event.OpStreamSync, API: "cudaStreamSynchronize", Stream: 0x20, CallNs: 100 + 10*i, ReturnNs: 105 + 10*i})
	}
	checkCompute(&res, "hicache-load", 1, nil, got, acts)
	if res.OtherErrs != 0 {
		t.Errorf("hicache-load's facts: %+v", res)
	}
	checkDesigned(&res, "hicache-load", []scenarioProc{{pid: 1, gpu: privateGPU(1)}}, got, acts)
	if res.OtherErrs != 1 || !strings.Contains(strings.Join(res.Problems, "\n"), "hicache-load is designed to raise [], the agent's window raised [host-sync-in-loop/warn]") {
		t.Errorf("undesigned finding: %+v", res)
	}
	// the same records where the design has the finding: the row passes
	res = Result{}
	checkDesigned(&res, "layer-compute-item", []scenarioProc{{pid: 1, gpu: privateGPU(1)}}, got, acts)
	if res.OtherErrs != 0 {
		t.Errorf("designed finding: %+v", res)
	}
}
