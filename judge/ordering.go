package judge

import "github.com/lanewatch/lanewatch/checks"

// RDMA ordering: completed is not consumable (cross-qp-notify,
// mr-dereg-in-flight; checks.Window.OrderingCheck), per process whose
// notifications or ordering facts the window saw.

var _ = register(orderingRule{})

type orderingRule struct{}

func (orderingRule) Check() string    { return checks.CheckOrdering }
func (orderingRule) Raises() []string { return []string{"cross-qp-notify", "mr-dereg-in-flight"} }
func (orderingRule) Unsampled() string {
	return "needs a live window (--sample): notifications are judged against the requests outstanding when they were posted"
}

func (orderingRule) Judge(w *Window, env *Env) (j Judgement) {
	for _, pid := range w.OrderingPIDs() {
		j.Checks = append(j.Checks, w.OrderingCheck(env.scope(pid), pid))
	}
	return j
}
