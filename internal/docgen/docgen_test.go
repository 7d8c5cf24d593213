package docgen

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lanewatch/lanewatch/correlate"
)

func TestParseDesc(t *testing.T) {
	m, err := parseDesc(prometheus.NewDesc("lanewatch_x_total", `say "why", {a}`, []string{"gpu", "direction"}, nil).String())
	if err != nil || m.name != "lanewatch_x_total" || m.help != `say "why", {a}` || strings.Join(m.labels, ",") != "gpu,direction" {
		t.Errorf("parsed %+v, %v", m, err)
	}
	if m, err := parseDesc(prometheus.NewDesc("lanewatch_y", "no labels", nil, nil).String()); err != nil || m.labels != nil {
		t.Errorf("parsed %+v, %v", m, err)
	}
	// A constant label would be left out of the page: refused.
	if _, err := parseDesc(prometheus.NewDesc("lanewatch_z", "h", nil, prometheus.Labels{"a": "b"}).String()); err == nil {
		t.Error("a descriptor with a constant label parsed")
	}
	for _, s := range []string{"", "Desc{fqName: lanewatch}", `Desc{fqName: "a", help: "b"}`} {
		if _, err := parseDesc(s); err == nil {
			t.Errorf("%q parsed", s)
		}
	}
}

// The types a scrape does not show come from the naming rule: every
// series a scrape shows obeys it (a histogram is never named _total).
func TestNamingRuleHolds(t *testing.T) {
	types, _, err := scrapedTypes()
	if err != nil {
		t.Fatal(err)
	}
	if len(types) < 10 || types["lanewatch_transfer_size_bytes"] != "histogram" || types["lanewatch_rdma_posted_to_completed_seconds"] != "histogram" {
		t.Fatalf("scraped types %v: the histograms are missing", types)
	}
	for name, typ := range types {
		if typ != "histogram" && typ != typeByName(name) {
			t.Errorf("%s is a %s, the naming rule says %s", name, typ, typeByName(name))
		}
	}
}

var newDesc = regexp.MustCompile(`(?:prometheus|exporters)\.NewDesc\(\s*"(lanewatch_[a-z0-9_]+)"`)

// Every lanewatch_* descriptor the module's code defines is on the page:
// a collector added without a Describe, or missing from scrapers, fails
// here.
func TestMetricsPageComplete(t *testing.T) {
	var page bytes.Buffer
	if err := Metrics(&page); err != nil {
		t.Fatal(err)
	}
	defined := 0
	err := filepath.WalkDir("../..", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", ".cache", "refpath", "deploy", "testdata", "bin":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") || strings.Contains(path, "internal/docgen") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range newDesc.FindAllSubmatch(src, -1) {
			defined++
			if !strings.Contains(page.String(), "| `"+string(m[1])+"` |") {
				t.Errorf("%s defines %s, which docs/metrics.md does not list", path, m[1])
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if defined < 40 {
		t.Fatalf("found only %d descriptors in the code", defined)
	}
}

// Every registered rule has its section on the page, in one row of the
// checklist table.
func TestRulesPage(t *testing.T) {
	var page bytes.Buffer
	if err := Rules(&page); err != nil {
		t.Fatal(err)
	}
	for _, r := range correlate.Rules {
		if strings.Count(page.String(), "\n### "+r.Name+"\n") != 1 || !strings.Contains(page.String(), r.Remediation) {
			t.Errorf("rule %s has no section, or not its remediation", r.Name)
		}
	}
}
