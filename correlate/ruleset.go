package correlate

import (
	"fmt"
	"slices"
)

// Where says where a rule is judged.
type Where uint8

const (
	// InWindow: every evaluation window of `agent run` (--evaluate-interval)
	// and the live window of `agent diagnose --sample`, from transfers.
	InWindow Where = 1 << iota
	// InHostCheck: `agent run`'s host and process checks
	// (--host-check-interval) and `agent diagnose`, from sysfs and procfs.
	InHostCheck
	// InDiagnose: `agent diagnose` only, which has input `agent run` lacks
	// (the server's NIC map, a counter window of its own).
	InDiagnose
)

// Rule is one finding rule as every consumer sees it: the exporters (the
// lanewatch_findings series it may have), the alert rules and their test,
// and the documentation.
type Rule struct {
	Name        string
	Severities  []Severity // every severity it can report
	Checklist   string     // the seed checklist item it applies
	Remediation string     // the general fix; a finding may be more precise
	Where       Where
}

// Rules is every finding rule, once, in the order their files register
// them: each rule's entry sits beside its function (register). The
// exporters, the alerts' test and the generated docs/rules.md read it.
// Adding a rule: CONTRIBUTING.md, "Adding a window rule".
var Rules []Rule

// register adds a rule's entry to Rules; each rule's file calls it once.
func register(r Rule) bool {
	if _, dup := RuleNamed(r.Name); dup {
		panic(fmt.Sprintf("correlate: rule %q registered twice", r.Name))
	}
	Rules = append(Rules, r)
	return true
}

// ChecklistComputeOverlap is seed 000's L2→L1 item 3.
const ChecklistComputeOverlap = "L2→L1: do H2D and compute really overlap on different streams; look for an accidental synchronize or .item()"

// RuleNamed returns the registry entry of a rule.
func RuleNamed(name string) (Rule, bool) {
	for _, r := range Rules {
		if r.Name == name {
			return r, true
		}
	}
	return Rule{}, false
}

// newFinding makes a finding of a registered rule: its name and checklist
// item come from the registry, the remediation too unless the finding has
// a more precise one. An unregistered rule is a programming error.
func newFinding(rule string, sev Severity, subject, summary string, evidence []string, remediation string) *Finding {
	r, ok := RuleNamed(rule)
	if !ok {
		panic(fmt.Sprintf("correlate: finding of unregistered rule %q", rule))
	}
	if !slices.Contains(r.Severities, sev) {
		panic(fmt.Sprintf("correlate: rule %q has no severity %q in the registry", rule, sev))
	}
	if remediation == "" {
		remediation = r.Remediation
	}
	return &Finding{Rule: r.Name, Severity: sev, Subject: subject, Summary: summary, Evidence: evidence,
		Remediation: remediation, Checklist: r.Checklist}
}
