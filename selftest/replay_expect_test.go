package selftest

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/lanewatch/lanewatch/correlate"
)

// Every trace of testdata/replay has its provenance and a verdict, with a
// reason, for each copy rule and compute-overlap rule.
func TestReplayExpectFiles(t *testing.T) {
	traces, err := filepath.Glob("testdata/replay/*.json.gz")
	if err != nil || len(traces) < 4 {
		t.Fatalf("want at least four traces, got %v %v", traces, err)
	}
	sources := map[string]bool{}
	for _, tr := range traces {
		e, err := ReadExpect(tr)
		if err != nil {
			t.Errorf("%s: %v", tr, err)
			continue
		}
		s := e.Source
		if s.Repository == "" || s.Path == "" || len(s.Commit) != 40 || s.License == "" || s.Ran == "" {
			t.Errorf("%s: provenance incomplete: %+v", tr, s)
		}
		sources[s.Repository] = true
		listed := map[string]bool{}
		for _, v := range e.Verdicts {
			listed[v.Rule] = true
		}
		for _, rule := range []string{"pageable-copy", "fragmented-copies", "too-little-in-flight", "host-sync-in-loop"} {
			if !listed[rule] {
				t.Errorf("%s: no verdict for %s", tr, rule)
			}
		}
	}
	if len(sources) < 2 {
		t.Errorf("traces from %d public sources, want two at least", len(sources))
	}
}

// checkVerdicts: a verdict holds or is named; INFO never breaks silence;
// a rule no verdict lists must stay silent (INFO allowed).
func TestCheckVerdicts(t *testing.T) {
	e := &ReplayExpect{Verdicts: []ReplayVerdict{
		{Rule: "pageable-copy", Fires: true, Severity: correlate.SevFail, Why: "pageable batches"},
		{Rule: "fragmented-copies", Why: "big copies"},
	}}
	for _, tc := range []struct {
		findings []ReplayFinding
		want     []string
	}{
		{[]ReplayFinding{{Rule: "pageable-copy", Severity: correlate.SevFail}}, nil},
		{[]ReplayFinding{{Rule: "pageable-copy", Severity: correlate.SevFail}, {Rule: "fragmented-copies", Severity: correlate.SevInfo},
			{Rule: "host-sync-in-loop", Severity: correlate.SevInfo}}, nil},
		{nil, []string{"pageable-copy: expected fail"}},
		{[]ReplayFinding{{Rule: "pageable-copy", Severity: correlate.SevWarn}}, []string{"pageable-copy: expected fail (pageable batches), got warn"}},
		{[]ReplayFinding{{Rule: "pageable-copy", Severity: correlate.SevFail}, {Rule: "fragmented-copies", Severity: correlate.SevWarn}},
			[]string{"fragmented-copies: expected silent"}},
		{[]ReplayFinding{{Rule: "pageable-copy", Severity: correlate.SevFail}, {Rule: "host-sync-in-loop", Severity: correlate.SevWarn}},
			[]string{"host-sync-in-loop: not expected"}},
	} {
		r := ReplayResult{Trace: "t", Expect: e, Findings: tc.findings}
		r.checkVerdicts()
		if len(r.Verdicts) != len(tc.want) {
			t.Errorf("%v: problems %q, want %q", tc.findings, r.Verdicts, tc.want)
			continue
		}
		for i, w := range tc.want {
			if !strings.HasPrefix(r.Verdicts[i], w) {
				t.Errorf("%v: problem %q, want it to start %q", tc.findings, r.Verdicts[i], w)
			}
		}
	}
}
