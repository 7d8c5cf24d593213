package judge

import (
	"fmt"

	"github.com/lanewatch/lanewatch/checks"
	"github.com/lanewatch/lanewatch/correlate"
)

// link-underused: what the GPU counters measured on a lane against what
// the probes saw queued on it (correlate.LinkUnderused).

var _ = register(underusedRule{})

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
