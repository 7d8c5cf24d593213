package diagnose

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/lanewatch/lanewatch/correlate"
)

// TestREADMEChecklist keeps the README's table "What is checked, item by
// item" and the rule registry in step: every registered rule stands in one
// row, the row's `agent run` column names exactly where its rules are
// judged (window, host, or "—"), and every diagnose row it names is a check
// name the checks or diagnose code emits.
func TestREADMEChecklist(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := checklistRows(t, string(readme))
	source := checkSources(t)

	seen := map[string]bool{}
	for _, r := range rows {
		where := map[string]bool{}
		for _, name := range r.rules {
			rule, ok := correlate.RuleNamed(name)
			if !ok {
				t.Errorf("README row %q names rule %q, which is not registered", r.item, name)
				continue
			}
			if seen[name] {
				t.Errorf("README names rule %q in more than one row", name)
			}
			seen[name] = true
			if rule.Where&correlate.InWindow != 0 {
				where["window"] = true
			}
			if rule.Where&correlate.InHostCheck != 0 {
				where["host"] = true
			}
		}
		var want []string
		for w := range where {
			want = append(want, w)
		}
		slices.Sort(want)
		if got := runColumn(r.run); !slices.Equal(got, want) {
			t.Errorf("README row %q: agent run column %q says %v, the registry %v", r.item, r.run, got, want)
		}
		for _, check := range r.checks {
			if !strings.Contains(source, `"`+check+`"`) {
				t.Errorf("README row %q names diagnose row %q, which no check emits", r.item, check)
			}
		}
	}
	for _, rule := range correlate.Rules {
		if !seen[rule.Name] {
			t.Errorf("rule %q has no row in the README's checklist table", rule.Name)
		}
	}
	if len(rows) < len(correlate.Rules)/2 {
		t.Errorf("only %d rows read from the README's checklist table", len(rows))
	}
}

type checklistRow struct {
	item   string
	checks []string // diagnose row names
	rules  []string
	run    string
}

var backticked = regexp.MustCompile("`([a-z][a-z0-9-]*)`")

// checklistRows reads the table under "### What is checked, item by item".
func checklistRows(t *testing.T, readme string) []checklistRow {
	t.Helper()
	_, after, ok := strings.Cut(readme, "### What is checked, item by item\n")
	if !ok {
		t.Fatal("README has no section \"What is checked, item by item\"")
	}
	var rows []checklistRow
	for _, line := range strings.Split(after, "\n") {
		if strings.HasPrefix(line, "#") {
			break
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if !strings.HasPrefix(line, "|") || len(cells) != 4 || strings.HasPrefix(cells[0], "---") || strings.TrimSpace(cells[0]) == "seed item" {
			continue
		}
		r := checklistRow{item: strings.TrimSpace(cells[0]), run: strings.TrimSpace(cells[3])}
		for _, m := range backticked.FindAllStringSubmatch(cells[2], -1) {
			r.rules = append(r.rules, m[1])
		}
		// "row a, row b (note)": the names before any parenthesis; "—" none
		names, _, _ := strings.Cut(cells[1], "(")
		for _, n := range strings.Split(names, ",") {
			if n = strings.TrimSpace(n); n != "" && n != "—" {
				r.checks = append(r.checks, n)
			}
		}
		rows = append(rows, r)
	}
	return rows
}

// runColumn is where a row says agent run judges it: "window", "host", or
// nothing for "—"; a parenthesised condition is left out.
func runColumn(s string) []string {
	s, _, _ = strings.Cut(s, "(")
	var out []string
	for _, w := range strings.Split(s, ",") {
		if w = strings.TrimSpace(w); w != "" && w != "—" {
			out = append(out, w)
		}
	}
	slices.Sort(out)
	return out
}

// checkSources is the text of the code that names diagnose's rows.
func checkSources(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	for _, dir := range []string{"../checks", "."} {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			text, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			b.Write(text)
		}
	}
	return b.String()
}
