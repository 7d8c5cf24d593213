package selftest

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/lanewatch/lanewatch/checks"
	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/judge"
	"github.com/lanewatch/lanewatch/selftest/refenv"
)

// designed is every scenario's designed verdict: the rules it was built to
// raise, each with its severity (WARN or FAIL), "rule/severity". A scenario
// not named here, and every rule a scenario does not name, must raise
// nothing above INFO: the healthy shapes are as much a part of the design
// as the faulty ones. The verdict is the scenario's construction (its call
// order, sizes, memory kinds, placement), written down here by hand, never
// computed by the rule under test.
var designed = map[string][]string{
	"pageable-load":   {"pageable-copy/fail"},
	"fragmented-load": {"fragmented-copies/warn"},
	"h2d-overlap":     {"same-direction-overlap/warn"},
	"pd-overlap":      {"same-direction-overlap/warn"},
	"two-proc-lane":   {"same-direction-overlap/warn"},
	// 256 copies of 16 KiB each: small copies by construction
	"inflight-serial":    {"too-little-in-flight/warn", "fragmented-copies/warn"},
	"inflight-queued":    {"fragmented-copies/warn"},
	"rdma-write-serial":  {"too-little-in-flight/warn"},
	"layer-compute-sync": {"serialized-load/warn"},
	"layer-compute-item": {"host-sync-in-loop/warn"},
	"kv-notify-early":    {"cross-qp-notify/fail"},
	"mr-dereg-early":     {"mr-dereg-in-flight/fail"},
	"storage-far-pool":   {"storage-far-pool/warn"},
	"uplink-shared":      {"storage-shared-uplink/warn"},
	// transfer-library lanes on an injected host (xferlane.go)
	"xfer-tcp-fallback": {"kv-transfer-tcp-fallback/warn"},
	"xfer-far-device":   {"kv-transfer-far-device/warn"},
}

// ruleOf is the rule of a designed "rule/severity".
func ruleOf(v string) string { r, _, _ := strings.Cut(v, "/"); return r }

// verdictOf is a finding as a designed entry, "rule/severity".
func verdictOf(f correlate.Finding) string { return f.Rule + "/" + string(f.Severity) }

// raisedBy is the findings raised at WARN or FAIL as designed entries,
// each once, sorted.
func raisedBy(fs []correlate.Finding) []string {
	var raised []string
	for _, f := range fs {
		if f.Severity == correlate.SevWarn || f.Severity == correlate.SevFail {
			raised = append(raised, verdictOf(f))
		}
	}
	return slices.Compact(slices.Sorted(slices.Values(raised)))
}

// fires says whether scenario was designed to raise rule.
func fires(scenario, rule string) bool {
	return slices.ContainsFunc(designed[scenario], func(v string) bool { return ruleOf(v) == rule })
}

// designedAmong is the designed "rule/severity" entries of scenario for
// the given rules (sorted), in their order.
func designedAmong(scenario string, rules ...string) []string {
	var out []string
	for _, r := range rules {
		for _, v := range designed[scenario] {
			if ruleOf(v) == r {
				out = append(out, v)
			}
		}
	}
	return out
}

// checkDesigned judges a scenario's processes over the scenario's run as
// `agent run` judges a window (judge.Evaluator, every window rule, with
// kernel launches probed), from the agent's own records and activities,
// and compares the rules raised at WARN or FAIL with the design. procs
// place each process on its reference GPU (the lane rate as capacity). The
// storage rules need the storage tracer and the disks' placement, which
// this window has not: their rows judge them apart (storage.go, uplink.go).
//
// It is the one place a row's window verdict is judged: the per-rule
// checks (overlap.go, inflight.go, ordering.go, computeoverlap.go) compare
// only the agent's facts with the truth's.
func checkDesigned(res *Result, scenario string, procs []scenarioProc, transfers []correlate.Transfer, acts []correlate.Activity) {
	fs := windowFindings(procs, transfers, acts)
	noteFindings(res, fs)
	judgeDesigned(res, scenario, fs, "storage-far-pool", "storage-shared-uplink")
}

// noteFindings adds each finding at WARN or FAIL to the row's notes.
func noteFindings(res *Result, fs []correlate.Finding) {
	for _, f := range fs {
		if f.Severity == correlate.SevWarn || f.Severity == correlate.SevFail {
			res.Problems = append(res.Problems, fmt.Sprintf("finding: %s; %s", f.Summary, strings.Join(f.Evidence, "; ")))
		}
	}
}

// judgeDesigned compares the rules findings raised at WARN or FAIL with
// the scenario's design, leaving out the rules the window did not judge.
func judgeDesigned(res *Result, scenario string, fs []correlate.Finding, notJudged ...string) {
	res.raise(fs...)
	raised := raisedBy(fs)
	want := slices.DeleteFunc(slices.Sorted(slices.Values(designed[scenario])), func(v string) bool { return slices.Contains(notJudged, ruleOf(v)) })
	if slices.Equal(raised, want) {
		return
	}
	res.OtherErrs++
	var why []string
	for _, f := range fs {
		if f.Severity != correlate.SevInfo && !slices.Contains(want, verdictOf(f)) {
			why = append(why, fmt.Sprintf("%s %s %s: %s", f.Severity, f.Rule, f.Subject, f.Summary))
		}
	}
	res.Problems = append(res.Problems, fmt.Sprintf("verdict: %s is designed to raise [%s], the agent's window raised [%s]%s",
		scenario, strings.Join(want, ", "), strings.Join(raised, ", "), listText(why)))
}

// windowFindings is what agent run's evaluator finds in one window holding
// exactly the given records and activities.
func windowFindings(procs []scenarioProc, transfers []correlate.Transfer, acts []correlate.Activity) []correlate.Finding {
	return windowVerdict(procs, transfers, acts, nil).Findings
}

// windowVerdict is agent run's evaluator's verdict on one window holding
// exactly the given records and activities; nics places the host's RDMA
// devices (nil: unknown, as on a host whose PCI tree is unread).
func windowVerdict(procs []scenarioProc, transfers []correlate.Transfer, acts []correlate.Activity, nics judge.NICPlace) judge.Verdict {
	lane := refenv.LaneGBs()
	gpuOf := map[uint32]string{}
	gpus := map[string]bool{}
	for _, p := range procs {
		gpuOf[p.pid] = p.gpu
		gpus[p.gpu] = true
	}
	ev := judge.NewEvaluator(judge.EvaluatorConfig{
		Kernels: true,
		NICs:    nics,
		Place: func(pid uint32) checks.Placement {
			if g, ok := gpuOf[pid]; ok {
				return checks.Placement{GPU: g, InboundGBs: lane, OutboundGBs: lane}
			}
			return checks.Placement{Why: fmt.Sprintf("pid %d is not a process of the scenario", pid)}
		},
		LinkCapacity: func(gpu string) float64 {
			if gpus[gpu] {
				return lane
			}
			return 0
		},
	})
	var first, last uint64
	for i := range transfers {
		t := &transfers[i]
		ev.Transfer(t)
		if first == 0 || t.SubmitNs < first {
			first = t.SubmitNs
		}
		last = max(last, t.SubmitNs, t.CompleteNs)
	}
	for i := range acts {
		ev.Activity(&acts[i])
	}
	// The window is the scenario's own span, as if agent run's window had
	// been laid exactly over it.
	return ev.Evaluate(time.Now().Add(time.Duration(last - first)))
}

func listText(items []string) string {
	if len(items) == 0 {
		return ""
	}
	return ": " + strings.Join(items, "; ")
}

// designedRules is every rule some scenario is designed to raise.
func designedRules() []string {
	var out []string
	for vs := range maps.Values(designed) {
		for _, v := range vs {
			out = append(out, ruleOf(v))
		}
	}
	return slices.Compact(slices.Sorted(slices.Values(out)))
}
