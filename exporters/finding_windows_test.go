package exporters

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/lanewatch/lanewatch/correlate"
)

// A finding that lasts one evaluation window is kept in a counter: a
// scrape every 30 s of a 10 s window would see the gauge only one time in
// three, increase() sees it always. Each window counts once per rule and
// severity, however many subjects it names; every rule starts at 0.
func TestFindingWindowsCounted(t *testing.T) {
	m := NewMetrics(func() Health { return Health{} })
	reg := NewRegistry(m, nil, nil)
	series := func() int {
		n, err := testutil.GatherAndCount(reg, "lanewatch_finding_windows_total")
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := series()
	pageable := func(subjects ...string) []correlate.Finding {
		var fs []correlate.Finding
		for _, s := range subjects {
			fs = append(fs, correlate.Finding{Rule: "pageable-copy", Severity: correlate.SevFail, Subject: s})
		}
		return fs
	}
	for i, fs := range [][]correlate.Finding{
		pageable("pid 1", "pid 2"), // a window naming two processes: one window
		nil,                        // a quiet window
		pageable("pid 3"),
		append(pageable("pid 4"), correlate.Finding{Rule: "fragmented-copies", Severity: correlate.SevWarn, Subject: "pid 4"}),
	} {
		m.SetWindow(Window{At: time.Unix(1700000000+int64(10*i), 0), Findings: fs})
	}
	for name, want := range map[string]float64{
		`lanewatch_finding_windows_total{rule="pageable-copy",severity="fail"}`:     3,
		`lanewatch_finding_windows_total{rule="fragmented-copies",severity="warn"}`: 1,
		`lanewatch_finding_windows_total{rule="remote-numa-pool",severity="fail"}`:  0,
		`lanewatch_findings{rule="pageable-copy",severity="fail"}`:                  1, // the last window only
	} {
		if got := gatherValue(t, reg, name); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	if before == 0 || series() != before {
		t.Errorf("%d series before any window, %d after: want every rule and severity from the first scrape", before, series())
	}
}
