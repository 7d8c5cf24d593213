package selftest

import (
	"fmt"
	"strings"

	"github.com/lanewatch/lanewatch/checks"
	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/selftest/refenv"
)

// HealthyScenarios are healthy serving shapes (refpath/kvpath/decode.c),
// run with Scenarios: each is designed to raise no WARN nor FAIL (INFO
// allowed) — decode-loop-loads and decode-item raise pageable-copy INFO
// for their metadata-sized copies, decode-loop the same.
var HealthyScenarios = []string{"decode-loop", "decode-loop-loads", "decode-item"}

// checkHealthy fails a healthy row on any WARN or FAIL the agent's window
// over it raises: its records and activities judged as `agent run` judges
// a window (checks.Window, launches probed), on a private GPU whose link
// runs at the reference lane rate — pageable copies and fragmentation,
// compute overlap, in-flight sufficiency, same-direction overlap. The
// verdict is the design's, never the rule's on the truth.
func checkHealthy(res *Result, scenario string, pid uint32, got []correlate.Transfer, acts []correlate.Activity) {
	lane := refenv.LaneGBs()
	place := func(p uint32) checks.Placement {
		if p != pid {
			return checks.Placement{Why: fmt.Sprintf("pid %d is not a process of %s", p, scenario)}
		}
		return checks.Placement{GPU: privateGPU(pid), InboundGBs: lane, OutboundGBs: lane}
	}
	w := checks.NewWindow()
	w.SetKernelsProbed(true)
	for i := range got {
		w.Transfer(&got[i])
	}
	for i := range acts {
		w.Activity(&acts[i])
	}
	var found []correlate.Finding
	for _, c := range w.Checks(fmt.Sprintf("pid %d", pid), pid) {
		found = append(found, c.Findings...)
	}
	found = append(found, w.Compute(pid).Findings...)
	for _, c := range w.InFlightChecks(place, nil, 0) {
		found = append(found, c.Findings...)
	}
	for _, c := range w.OverlapChecks(place, nil, 0) {
		found = append(found, c.Findings...)
	}
	for _, f := range found {
		line := fmt.Sprintf("%s (%s) %s: %s; %s", f.Rule, f.Severity, f.Subject, f.Summary, strings.Join(f.Evidence, "; "))
		if f.Severity == correlate.SevInfo {
			res.Problems = append(res.Problems, "finding: "+line)
			continue
		}
		res.OtherErrs++
		res.Problems = append(res.Problems, "healthy shape raised "+line)
	}
}
