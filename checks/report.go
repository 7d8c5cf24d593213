// Package checks holds the checklist of seed 000 ("排查清单") as plain
// functions: the host checks (topology, paths, NICs, link training, IOMMU,
// numactl, huge pages), the per-process checks (NUMA binding, where the
// pinned pools live), the judgement of a window of transfers (pageable
// copies, fragmentation, same-direction overlap) and of RDMA congestion
// counters. `agent diagnose` runs them once; `agent run` runs the host and
// process checks every --host-check-interval and the window checks every
// --evaluate-interval. Each check is PASS, WARN, FAIL, SKIP with its reason,
// or INFO: a listing that no shape of the host can fail (the PCI topology,
// huge pages), shown for what it tells, never counted as a pass.
package checks

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/lanewatch/lanewatch/correlate"
)

// Status of one checklist item.
type Status string

const (
	Pass Status = "PASS"
	Warn Status = "WARN"
	Fail Status = "FAIL"
	Skip Status = "SKIP" // could not be checked here; Detail says why
	// Info is a check that reports what it found and judges nothing: no
	// state of the host makes it WARN or FAIL (the PCI topology, huge pages,
	// the nearest NIC per GPU when the server's map was not given).
	Info Status = "INFO"
)

// Check is one item of the diagnose checklist.
type Check struct {
	Scope    string              `json:"scope"` // "host" or "pid 1234 (kvpath)"
	Name     string              `json:"name"`
	Status   Status              `json:"status"`
	Detail   string              `json:"detail"`
	Fix      string              `json:"fix,omitempty"`
	Findings []correlate.Finding `json:"findings,omitempty"`
	// Incomplete says why a window's check rests on part of the window's
	// events (events were lost: Partial); "" when it rests on all of them.
	Incomplete string `json:"incomplete,omitempty"`
}

// Report is the whole checklist, in the seed's order: path, direction, mover.
type Report struct {
	Checks []Check `json:"checks"`
}

// Add appends a check; with findings, its status is the worst of theirs.
func (r *Report) Add(c Check) {
	for _, f := range c.Findings {
		switch {
		case f.Severity == correlate.SevFail:
			c.Status = Fail
		case f.Severity == correlate.SevWarn && c.Status != Fail:
			c.Status = Warn
		}
	}
	r.Checks = append(r.Checks, c)
}

// Failed reports whether any check failed.
func (r *Report) Failed() bool {
	for _, c := range r.Checks {
		if c.Status == Fail {
			return true
		}
	}
	return false
}

// Summary counts the checks by status, every status present (0 for none).
type Summary struct {
	Pass int `json:"pass"`
	Info int `json:"info"`
	Warn int `json:"warn"`
	Fail int `json:"fail"`
	Skip int `json:"skip"`
}

// Summary counts the report's checks by status.
func (r *Report) Summary() Summary {
	var s Summary
	for _, c := range r.Checks {
		switch c.Status {
		case Pass:
			s.Pass++
		case Info:
			s.Info++
		case Warn:
			s.Warn++
		case Fail:
			s.Fail++
		case Skip:
			s.Skip++
		}
	}
	return s
}

// WriteText prints the checklist for a person, each scope's checks under
// one heading (scopes in the order they first appear: a live window's
// checks come after the host's and processes' own), then the summary line.
func (r *Report) WriteText(w io.Writer) error {
	var scopes []string
	byScope := map[string][]Check{}
	heading := map[string]string{}
	width := 24
	for _, c := range r.Checks {
		// "pid 7 (python)", "pid 7 (exited during the window)" and the
		// window's "pid 7" are one process: one heading, the annotated name
		key, _, annotated := strings.Cut(c.Scope, " (")
		if _, ok := byScope[key]; !ok {
			scopes = append(scopes, key)
			heading[key] = key
		}
		if annotated && heading[key] == key {
			heading[key] = c.Scope
		}
		byScope[key] = append(byScope[key], c)
		width = max(width, utf8.RuneCountInString(c.Name))
	}
	for _, key := range scopes {
		if _, err := fmt.Fprintf(w, "\n== %s\n", heading[key]); err != nil {
			return err
		}
		for _, c := range byScope[key] {
			writeCheck(w, c, width)
		}
	}
	s := r.Summary()
	_, err := fmt.Fprintf(w, "\n%d pass, %d info, %d warn, %d fail, %d skip\n", s.Pass, s.Info, s.Warn, s.Fail, s.Skip)
	return err
}

// writeCheck prints one check, its findings with their evidence and fix.
func writeCheck(w io.Writer, c Check, width int) {
	fmt.Fprintf(w, "[%-4s] %-*s %s\n", c.Status, width, c.Name, c.Detail)
	for _, f := range c.Findings {
		fmt.Fprintf(w, "       %s (%s) %s: %s\n", f.Rule, f.Severity, f.Subject, f.Summary)
		for _, e := range f.Evidence {
			fmt.Fprintf(w, "         - %s\n", e)
		}
		fmt.Fprintf(w, "         fix: %s\n         checklist: %s\n", f.Remediation, f.Checklist)
	}
	if c.Fix != "" && len(c.Findings) == 0 {
		fmt.Fprintf(w, "         fix: %s\n", c.Fix)
	}
}

// WriteJSON prints the checklist for machines: {"checks": [...],
// "summary": {"pass": n, "info": n, "warn": n, "fail": n, "skip": n}}.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(struct {
		Checks  []Check `json:"checks"`
		Summary Summary `json:"summary"`
	}{r.Checks, r.Summary()})
}

// Skipped builds a SKIP with its reason.
func Skipped(scope, name, format string, args ...any) Check {
	return Check{Scope: scope, Name: name, Status: Skip, Detail: fmt.Sprintf(format, args...)}
}

// Partial is c judged on part of its window's events, why saying what
// was lost: a PASS cannot be claimed on part of a window and becomes a
// SKIP that says why and what the part showed; a WARN or FAIL stands on
// what was seen (a lower bound), each finding carrying why as evidence;
// an INFO listing says why after what it lists. A SKIP was not judged:
// left alone.
func (c Check) Partial(why string) Check {
	switch c.Status {
	case Skip:
		return c
	case Pass:
		c.Status, c.Detail = Skip, why+"; on the events seen: "+c.Detail
	case Info:
		c.Detail += "; " + why
	}
	c.Incomplete = why
	if c.Findings != nil {
		fs := make([]correlate.Finding, len(c.Findings))
		for i, f := range c.Findings {
			f.Evidence = append(slices.Clip(f.Evidence), why) // the caller's evidence stays as it was
			fs[i] = f
		}
		c.Findings = fs
	}
	return c
}

// JoinLimited joins at most n items and says how many more there were.
func JoinLimited(items []string, n int) string {
	if len(items) <= n {
		return strings.Join(items, ", ")
	}
	return strings.Join(items[:n], ", ") + fmt.Sprintf(" and %d more", len(items)-n)
}
