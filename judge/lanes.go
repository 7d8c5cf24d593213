package judge

import (
	"github.com/lanewatch/lanewatch/checks"
)

// Same-direction overlap: every process's flows on a lane of a GPU link
// (docs/design.md 1.1).

var _ = register(overlapRule{})

type overlapRule struct{}

func (overlapRule) Check() string    { return checks.CheckOverlap }
func (overlapRule) Raises() []string { return []string{"same-direction-overlap"} }
func (overlapRule) Unsampled() string {
	return "needs a live window (--sample): flows are judged by when they were in flight"
}

func (overlapRule) Judge(w *Window, env *Env) Judgement {
	return Judgement{Checks: w.OverlapChecks(env.Place, env.Capacity, env.Span)}
}
