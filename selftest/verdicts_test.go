package selftest

import (
	"slices"
	"strings"
	"testing"

	"github.com/lanewatch/lanewatch/correlate"
)

// Every window rule has a scenario designed to raise it, and every
// scenario the table names is one the selftest runs: a typo would leave a
// firing shape judged silent.
func TestDesignedCoversWindowRules(t *testing.T) {
	// judged apart, not by a designed row of this table: remote-numa-pool
	// by late-pool-pages' page placement (checkPages), link-underused and
	// rdma-congestion need a GPU's or a NIC's counters over a window
	// (kernel-copy and link-trains-up read the reference NVML, and must
	// raise neither).
	apart := []string{"remote-numa-pool", "link-underused", "rdma-congestion"}
	have := designedRules()
	for _, r := range correlate.Rules {
		if r.Where&correlate.InWindow == 0 || slices.Contains(apart, r.Name) {
			continue
		}
		if !slices.Contains(have, r.Name) {
			t.Errorf("window rule %s: no scenario is designed to raise it", r.Name)
		}
	}
	runs := slices.Concat(Scenarios, RDMAScenarios, PairScenarios, XferScenarios, []string{"storage-near-pool", "storage-far-pool"})
	for _, u := range uplinkRuns {
		runs = append(runs, u.name)
	}
	for sc, rules := range designed {
		if !slices.Contains(runs, sc) {
			t.Errorf("designed names %s, which the selftest does not run", sc)
		}
		for _, v := range rules {
			r, ok := correlate.RuleNamed(ruleOf(v))
			_, sev, _ := strings.Cut(v, "/")
			if !ok || !slices.Contains(r.Severities, correlate.Severity(sev)) || sev == string(correlate.SevInfo) {
				t.Errorf("%s is designed to raise %s: no such rule at WARN or FAIL", sc, v)
			}
		}
	}
}

func TestJudgeDesigned(t *testing.T) {
	warn := correlate.Finding{Rule: "serialized-load", Severity: correlate.SevWarn, Subject: "s", Summary: "serial"}
	info := correlate.Finding{Rule: "pageable-copy", Severity: correlate.SevInfo}
	fail := correlate.Finding{Rule: "pageable-copy", Severity: correlate.SevFail, Subject: "pid 1", Summary: "pageable"}
	for _, c := range []struct {
		name, scenario string
		fs             []correlate.Finding
		notJudged      []string
		ok             bool
		text           string
	}{
		{"designed finding", "layer-compute-sync", []correlate.Finding{warn}, nil, true, ""},
		{"designed finding missing", "layer-compute-sync", nil, nil, false, "designed to raise [serialized-load/warn], the agent's window raised []"},
		{"INFO is silent", "hicache-load", []correlate.Finding{info}, nil, true, ""},
		{"a finding on a healthy row", "hicache-load", []correlate.Finding{info, fail}, nil, false, "fail pageable-copy pid 1: pageable"},
		{"one more than designed", "layer-compute-sync", []correlate.Finding{warn, fail}, nil, false, "raised [pageable-copy/fail, serialized-load/warn]"},
		{"a rule the window does not judge", "uplink-shared", nil, []string{"storage-shared-uplink"}, true, ""},
	} {
		res := Result{}
		judgeDesigned(&res, c.scenario, c.fs, c.notJudged...)
		text := strings.Join(res.Problems, " | ")
		if res.OK() != c.ok || !strings.Contains(text, c.text) {
			t.Errorf("%s: ok %v %q, want ok %v with %q", c.name, res.OK(), text, c.ok, c.text)
		}
		// Raised (the live view's findings) is what the window raised at
		// WARN or FAIL, designed or not.
		var want []string
		for _, f := range c.fs {
			if f.Severity != correlate.SevInfo {
				want = append(want, verdictOf(f))
			}
		}
		slices.Sort(want)
		if !slices.Equal(res.Raised, want) {
			t.Errorf("%s: raised %q, want %q", c.name, res.Raised, want)
		}
	}
}
