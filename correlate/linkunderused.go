package correlate

import "fmt"

// link-underused (docs/rules.md): a link carrying far less than it can
// while transfers queued on it the whole window is not the bottleneck
// (seed 000: a path's rate is its narrowest segment's).

// ChecklistUnderused is the seed checklist item link-underused applies.
const ChecklistUnderused = "Link bandwidth: the path's rate is its narrowest segment's; the link is not it here"

// LaneFacts is one direction of one GPU link over a window, as the
// counters measured it and as the probes saw it queue.
type LaneFacts struct {
	GPU, Direction string
	MeasuredBps    float64 // what crossed the link (DCGM/NVML)
	CapacityBps    float64 // at its trained speed and width
	// RunningBps is the rate at the speed and width the link was read at
	// (the counters' last reading of the window); 0 unknown.
	RunningBps       float64
	BusyFraction     float64 // share of the window with a probed transfer in flight on this lane
	PageableCopies   int     // probed copies from pageable memory in the window
	SmallCopies, All uint64  // copies under 64 KiB, and all copies
}

var _ = register(Rule{Name: "link-underused", Severities: []Severity{SevWarn}, Checklist: ChecklistUnderused, Where: InWindow,
	Remediation: "fix the likelier bottleneck the finding names before tuning the link; `agent diagnose --sample` checks pools, NUMA and pinning"})

// LinkUnderused fires when a link carries far less than it can while
// transfers were queued on it the whole time: the link is not the
// bottleneck, so it names the likelier one (seed 000: a path's rate is its
// narrowest segment's, and copy engines, the host memory controller and
// staging copies can be narrower than the link).
func LinkUnderused(f LaneFacts) *Finding {
	if f.CapacityBps <= 0 || f.BusyFraction < 0.8 || f.MeasuredBps >= 0.5*f.CapacityBps {
		return nil
	}
	// A link read below its maximum that carried at least half of what it
	// can at that speed is itself the narrow segment (trained down:
	// link-degraded names it), not a sign that the bottleneck is elsewhere.
	if f.RunningBps > 0 && f.RunningBps < f.CapacityBps && f.MeasuredBps >= 0.5*f.RunningBps {
		return nil
	}
	likely := "the host side: the copy engine, or host memory (DRAM or the socket interconnect if the pool is on the far node — see remote-numa-pool)"
	switch {
	case f.PageableCopies > 0:
		likely = "the CPU staging copy: pageable source memory is copied into a pinned buffer first"
	case f.All > 0 && f.SmallCopies*2 >= f.All:
		likely = "per-copy overhead: most copies are under 64 KiB (latency-bound, not bandwidth-bound)"
	}
	return newFinding("link-underused", SevWarn, "GPU "+f.GPU,
		fmt.Sprintf("the %s link carried %.2f GB/s of %.2f GB/s while transfers were queued %.0f%% of the time: the bottleneck is elsewhere",
			f.Direction, f.MeasuredBps/1e9, f.CapacityBps/1e9, 100*f.BusyFraction),
		[]string{
			fmt.Sprintf("measured by the GPU's counters: %.2f GB/s (%.0f%% of capacity)", f.MeasuredBps/1e9, 100*f.MeasuredBps/f.CapacityBps),
			fmt.Sprintf("probed transfers in flight %.0f%% of the window; %d pageable copies; %d of %d copies under 64 KiB",
				100*f.BusyFraction, f.PageableCopies, f.SmallCopies, f.All),
			"likelier bottleneck: " + likely,
		},
		"")
}
