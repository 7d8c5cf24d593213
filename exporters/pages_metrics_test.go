package exporters

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// Every result of locating copies' host pages is a series from the first
// scrape, so that rate() sees the first copy that could not be located.
func TestPageLookupsMetric(t *testing.T) {
	m := NewMetrics(func() Health {
		return Health{PageLookups: map[string]uint64{"located": 30, "cached": 900, "behind": 2}}
	})
	reg := NewRegistry(m, nil, nil)
	want := `# HELP lanewatch_page_lookups_total Host<->device copies by what became of locating the NUMA node of their host pages: located (move_pages), cached, no_node (not resident, not mapped, process gone), failed, over_budget, behind (the locator could not keep up).
# TYPE lanewatch_page_lookups_total counter
lanewatch_page_lookups_total{result="behind"} 2
lanewatch_page_lookups_total{result="cached"} 900
lanewatch_page_lookups_total{result="failed"} 0
lanewatch_page_lookups_total{result="located"} 30
lanewatch_page_lookups_total{result="no_node"} 0
lanewatch_page_lookups_total{result="over_budget"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "lanewatch_page_lookups_total"); err != nil {
		t.Error(err)
	}
	// No locator: no series.
	reg = NewRegistry(NewMetrics(func() Health { return Health{} }), nil, nil)
	if n, err := testutil.GatherAndCount(reg, "lanewatch_page_lookups_total"); err != nil || n != 0 {
		t.Errorf("%d series without a locator: %v", n, err)
	}
}
