package docgen

import (
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/diagnose"
)

// Rules writes docs/rules.md: diagnose's checklist as a table, then every
// rule of correlate.Rules in the checklist's order.
func Rules(w io.Writer) error {
	var b strings.Builder
	b.WriteString("# Finding rules\n\n" + generated + "\n")
	b.WriteString("Every finding lanewatch reports comes from one of these rules, registered once in\n" +
		"`correlate.Rules` (correlate/ruleset.go). `agent run` judges a rule every `--evaluate-interval`\n" +
		"(window: from the interval's transfers) or every `--host-check-interval` (host: from sysfs and\n" +
		"procfs); `agent diagnose` judges the rules marked so once, the window rules over its\n" +
		"`--sample` window. Every rule has an alert in `dashboards/lanewatch.rules.yml`, and its\n" +
		"findings are the series `lanewatch_findings{rule,severity}` and\n" +
		"`lanewatch_finding_windows_total{rule,severity}` (docs/metrics.md). A window in which the probes\n" +
		"lost events judges what arrived, and its checks that rest on the lost part say so (`incomplete`:\n" +
		"a pass is a SKIP, a finding carries the loss in its evidence; `lanewatch_window_incomplete_checks`,\n" +
		"docs/design.md 3.3).\n\n")

	b.WriteString("## What is checked, item by item\n\n")
	b.WriteString("Seed 000's checklist (\"排查清单\", items 1–8 in its order) and the path, link and RDMA items\n" +
		"of seeds 000 and 002 (`diagnose.Checklist`), each with the `agent diagnose` rows that answer\n" +
		"it, the rules it can report and where `agent run` judges them.\n\n")
	b.WriteString("| seed item | `agent diagnose` row | rule(s) | `agent run` | note |\n|---|---|---|---|---|\n")
	var order []string
	for _, it := range diagnose.Checklist {
		var rules []string
		var where correlate.Where
		for _, name := range it.Rules() {
			r, ok := correlate.RuleNamed(name)
			if !ok {
				return fmt.Errorf("checklist item %q: rule %q is not registered", it.Item, name)
			}
			rules = append(rules, "`"+name+"`")
			where |= r.Where
			order = append(order, name)
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", cell(it.Item), orNone(strings.Join(it.Rows(), ", ")), orNone(strings.Join(rules, ", ")),
			orNone(runColumn(where)), cell(it.Note))
	}
	for _, r := range correlate.Rules { // a rule in no item (TestChecklist fails on it) is still listed
		if !slices.Contains(order, r.Name) {
			order = append(order, r.Name)
		}
	}

	b.WriteString("\n## The rules\n\n")
	b.WriteString("| rule | severities | window | host check | diagnose |\n|---|---|---|---|---|\n")
	for _, name := range order {
		r, _ := correlate.RuleNamed(name)
		fmt.Fprintf(&b, "| [`%s`](#%s) | %s | %s | %s | %s |\n", r.Name, r.Name, severities(r), mark(r.Where&correlate.InWindow), mark(r.Where&correlate.InHostCheck), mark(r.Where&correlate.InDiagnose))
	}
	for _, name := range order {
		r, _ := correlate.RuleNamed(name)
		fmt.Fprintf(&b, "\n### %s\n\n", r.Name)
		fmt.Fprintf(&b, "- severities: %s\n", severities(r))
		fmt.Fprintf(&b, "- judged: %s\n", judged(r.Where))
		fmt.Fprintf(&b, "- checklist: %s\n", r.Checklist)
		fmt.Fprintf(&b, "- remediation: %s\n", r.Remediation)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func severities(r correlate.Rule) string {
	s := make([]string, len(r.Severities))
	for i, sev := range r.Severities {
		s[i] = string(sev)
	}
	return strings.Join(s, ", ")
}

// wheres says, for each place a rule is judged, its word in the checklist
// table's `agent run` column ("" for none) and its words in a rule's
// section.
var wheres = []struct {
	bit            correlate.Where
	column, judged string
}{
	{correlate.InWindow, "window", "every window of `agent run` (`--evaluate-interval`) and `agent diagnose --sample`"},
	{correlate.InHostCheck, "host", "`agent run`'s host checks (`--host-check-interval`)"},
	{correlate.InDiagnose, "", "`agent diagnose`"},
}

// runColumn is where `agent run` judges a checklist item's rules.
func runColumn(w correlate.Where) string {
	return whereWords(w, func(x string, _ string) string { return x }, ", ")
}

func judged(w correlate.Where) string {
	return whereWords(w, func(_ string, x string) string { return x }, "; ")
}

// whereWords joins pick's word for each place in w.
func whereWords(w correlate.Where, pick func(column, judged string) string, sep string) string {
	var s []string
	for _, p := range wheres {
		if word := pick(p.column, p.judged); w&p.bit != 0 && word != "" {
			s = append(s, word)
		}
	}
	return strings.Join(s, sep)
}

func mark(w correlate.Where) string {
	if w != 0 {
		return "yes"
	}
	return "—"
}

func orNone(s string) string {
	if s == "" {
		return "—"
	}
	return cell(s)
}
