package judge

import (
	"fmt"

	"github.com/lanewatch/lanewatch/checks"
	"github.com/lanewatch/lanewatch/correlate"
)

// The rules over each GPU link's lanes: same-direction overlap (every
// process's flows on a lane, docs/design.md 1.1) and link-underused (what
// the counters measured against what the probes saw queued).

var (
	_ = register(overlapRule{})
	_ = register(underusedRule{})
)

type overlapRule struct{}

func (overlapRule) Check() string    { return checks.CheckOverlap }
func (overlapRule) Raises() []string { return []string{"same-direction-overlap"} }
func (overlapRule) Unsampled() string {
	return "needs a live window (--sample): flows are judged by when they were in flight"
}

func (overlapRule) Judge(w *Window, env *Env) Judgement {
	return Judgement{Checks: w.OverlapChecks(env.Place, env.Capacity, env.Span)}
}

// CheckLinkUse names the link-underused check of a lane.
const CheckLinkUse = "link use"

type underusedRule struct{}

func (underusedRule) Check() string    { return CheckLinkUse }
func (underusedRule) Raises() []string { return []string{"link-underused"} }
func (underusedRule) Unsampled() string {
	return "needs the GPU counters over a window (agent run with DCGM or NVML): the link's measured rate against the transfers queued on it"
}

// Judge judges each lane the GPU counters measured: no check without them.
func (underusedRule) Judge(w *Window, env *Env) (j Judgement) {
	if env.Span <= 0 {
		return j
	}
	gpuOf := func(pid uint32) string { return env.Place(pid).GPU }
	for _, l := range env.Lanes {
		if !l.HasMeasured {
			continue
		}
		f := w.LaneFacts(l.GPU, l.Direction, gpuOf, env.Span)
		f.MeasuredBps, f.CapacityBps, f.RunningBps = l.Measured, l.Capacity, l.Running
		c := checks.Check{Scope: "GPU " + l.GPU, Name: CheckLinkUse, Status: checks.Pass,
			Detail: fmt.Sprintf("%s: %.2f GB/s measured of %.2f, transfers in flight %.0f%% of the window", l.Direction,
				l.Measured/1e9, l.Capacity/1e9, 100*f.BusyFraction)}
		if l.Capacity <= 0 {
			c.Detail += " (capacity unknown: not judged)"
		}
		if fd := correlate.LinkUnderused(f); fd != nil {
			c.Status, c.Findings = checks.Warn, []correlate.Finding{*fd}
		}
		j.Checks = append(j.Checks, c)
	}
	return j
}
