package judge

import (
	"fmt"

	"github.com/lanewatch/lanewatch/checks"
)

// addOrdering judges the RDMA ordering of every process whose
// notifications or ordering facts the window saw (cross-qp-notify,
// mr-dereg-in-flight; checks.Window.OrderingCheck).
func (v *Verdict) addOrdering(win *checks.Window) {
	for _, pid := range win.OrderingPIDs() {
		c := win.OrderingCheck(fmt.Sprintf("pid %d", pid), pid)
		v.Checks = append(v.Checks, c)
		v.Findings = append(v.Findings, c.Findings...)
	}
}
