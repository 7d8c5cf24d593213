package diagnose

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lanewatch/lanewatch/correlate"
)

// TestChecklist keeps Checklist, which docs/rules.md is generated from, in
// step with the rule registry and the checks: every registered rule stands
// in one item, every rule an item names is registered, every row an item
// names is a check name the checks or diagnose code emits, and an item has
// rows exactly when `agent diagnose` judges one of its rules (or it has no
// rule).
func TestChecklist(t *testing.T) {
	source := checkSources(t)
	seen := map[string]bool{}
	for _, it := range Checklist {
		diagnosed := len(it.Rules()) == 0
		for _, name := range it.Rules() {
			rule, ok := correlate.RuleNamed(name)
			if !ok {
				t.Errorf("checklist item %q names rule %q, which is not registered", it.Item, name)
				continue
			}
			if seen[name] {
				t.Errorf("rule %q stands in more than one checklist item", name)
			}
			seen[name] = true
			diagnosed = diagnosed || rule.Where&correlate.InDiagnose != 0
		}
		if diagnosed != (len(it.Rows()) > 0) {
			t.Errorf("checklist item %q: rows %q, but agent diagnose judges its rules: %v", it.Item, it.Rows(), diagnosed)
		}
		for _, row := range it.Rows() {
			if !strings.Contains(source, `"`+row+`"`) {
				t.Errorf("checklist item %q names row %q, which no check emits", it.Item, row)
			}
		}
	}
	for _, it := range Checklist {
		if len(it.Seeds) > 0 && len(it.Rules()) == 0 {
			t.Errorf("checklist item %q: no registered rule quotes its seed texts", it.Item)
		}
	}
	for _, rule := range correlate.Rules {
		if !seen[rule.Name] {
			t.Errorf("rule %q stands in no checklist item", rule.Name)
		}
	}
}

// checkSources is the text of the code that names diagnose's rows.
func checkSources(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	for _, dir := range []string{"../checks", "../judge", "."} {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		if len(files) == 0 {
			t.Fatalf("no Go files in %s", dir)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") || f == "checklist.go" {
				continue // the checklist itself names every row
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
