package selftest

import (
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/lanewatch/lanewatch/checks"
	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/selftest/refenv"
)

// ComputeScenarios are the shapes of compute overlap
// (refpath/kvpath/computeoverlap.c), run with Scenarios.
var ComputeScenarios = []string{"layer-compute", "layer-compute-sync", "layer-compute-item"}

// GraphScenarios are the healthy shapes under CUDA graphs
// (refpath/kvpath/graphs.c), run with Scenarios: no record for a copy
// captured into a graph, one launch activity per graph launch, and
// nothing above INFO in the window (checkHealthy).
var GraphScenarios = []string{"decode-graphs"}

// computeExpected is each scenario's designed compute-overlap verdict (the
// rules that fire, comma-separated); every other scenario must fire none.
var computeExpected = map[string]string{"layer-compute-sync": "serialized-load", "layer-compute-item": "host-sync-in-loop"}

// activityLog keeps the engine's activities per process (agent.Config.Activity).
type activityLog struct {
	mu    sync.Mutex
	byPID map[uint32][]correlate.Activity
}

// maxActivities bounds what one process keeps (a scenario makes far fewer).
const maxActivities = 1 << 16

// Activity implements correlate.ActivitySink.
func (c *Collector) Activity(a *correlate.Activity) {
	l := &c.acts
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.byPID == nil {
		l.byPID = map[uint32][]correlate.Activity{}
	}
	if len(l.byPID[a.PID]) < maxActivities {
		l.byPID[a.PID] = append(l.byPID[a.PID], *a)
	}
}

// TakeActivities hands over and forgets the activities of pid.
func (c *Collector) TakeActivities(pid uint32) []correlate.Activity {
	l := &c.acts
	l.mu.Lock()
	defer l.mu.Unlock()
	a := l.byPID[pid]
	delete(l.byPID, pid)
	return a
}

// checkCompute checks a scenario's compute-overlap verdict (docs/design.md,
// "Compute overlap"): the rules the agent's records and activities fire,
// judged as `agent run` judges a window, must be the designed ones. For
// the compute shapes also: every launch, host wait and event record the
// truth made was reported, exactly; the agent's overlap bound is at least
// what the truth's engine intervals show ran together (a bound, never
// below); and the overlapped shapes did overlap on this run (the truth's
// engines), else the run does not test them (rerunUnshaped).
func checkCompute(res *Result, scenario string, pid uint32, truth []TruthCall, got []correlate.Transfer, acts []correlate.Activity) {
	w := checks.NewWindow()
	w.SetKernelsProbed(true)
	for i := range got {
		w.Transfer(&got[i])
	}
	for i := range acts {
		w.Activity(&acts[i])
	}
	r := w.Compute(pid)
	var fired []string
	for _, f := range r.Findings {
		fired = append(fired, f.Rule)
	}
	slices.Sort(fired)
	note := func(format string, args ...any) { res.Problems = append(res.Problems, fmt.Sprintf(format, args...)) }
	if want := computeExpected[scenario]; strings.Join(fired, ",") != want {
		res.OtherErrs++
		note("compute overlap: the agent fired [%s], the scenario is designed to fire [%s]", strings.Join(fired, ","), want)
	}
	for _, f := range r.Findings {
		note("finding: %s; %s", f.Summary, strings.Join(f.Evidence, "; "))
	}
	if !slices.Contains(ComputeScenarios, scenario) && !slices.Contains(GraphScenarios, scenario) {
		return
	}
	if g, t := activityCounts(acts), truthActivityCounts(truth); g != t {
		res.OtherErrs++
		note("compute overlap: the agent reported %s, the truth made %s", g, t)
	}
	if !slices.Contains(ComputeScenarios, scenario) {
		return
	}
	engine := truthComputeOverlap(truth)
	var bound uint64
	for _, s := range r.Streams {
		bound += s.OverlapNs
	}
	switch {
	case bound < engine:
		res.OtherErrs++
		note("compute overlap: the agent's bound %d ns is below the %d ns the truth's engines ran loads beside compute", bound, engine)
	case scenario != "layer-compute-sync" && engine == 0:
		res.ShapeMissed = "compute overlap: the loads ran beside no compute on this run (truth's engines)"
		note("%s", res.ShapeMissed)
	default:
		note("finding: loads beside compute: truth's engines %.3f ms, the agent's bound %.3f ms", float64(engine)/1e6, float64(bound)/1e6)
	}
}

// activityCounts says how many launches, host waits by op and event
// records the agent reported.
func activityCounts(acts []correlate.Activity) string {
	n := map[string]int{}
	for _, a := range acts {
		n[a.Op.String()]++
	}
	return countText(n)
}

// truthActivityCounts is the same of the truth's successful calls.
func truthActivityCounts(truth []TruthCall) string {
	n := map[string]int{}
	for _, t := range truth {
		if t.End || t.Result != 0 {
			continue
		}
		switch t.Op {
		case "launch", "kernel_copy":
			n[event.OpLaunch.String()]++
		case "stream_sync", "event_sync", "event_record", "ctx_sync", "graph_launch":
			n[t.Op]++
		}
		// captured_launch, captured_copy: recorded into a graph, no activity
	}
	return countText(n)
}

func countText(n map[string]int) string {
	var parts []string
	for _, k := range []string{"launch", "graph_launch", "stream_sync", "event_sync", "ctx_sync", "event_record"} {
		parts = append(parts, fmt.Sprintf("%d %s", n[k], k))
	}
	return strings.Join(parts, ", ")
}

// truthComputeOverlap is how long, by the engines' own times, H2D copies
// ran while compute kernels did (copies of one stream run one after
// another, and so do kernels: the pairwise sum counts no instant twice).
func truthComputeOverlap(truth []TruthCall) uint64 {
	var sum uint64
	for _, x := range truth {
		if x.Op != "copy" || x.Direction != correlate.DirH2D || x.EngineEndNs == 0 {
			continue
		}
		for _, k := range truth {
			if k.Op != "launch" || k.EngineEndNs == 0 {
				continue
			}
			lo, hi := max(x.EngineStartNs, k.EngineStartNs), min(x.EngineEndNs, k.EngineEndNs)
			if hi > lo {
				sum += hi - lo
			}
		}
	}
	return sum
}

// checkHealthy fails a healthy shape's row (GraphScenarios) when the
// agent's window, judged as `agent run` judges one (pageable copies,
// fragmentation, compute overlap, in-flight sufficiency on the process's
// own lane), raises anything above INFO: the shape is designed to raise
// nothing.
func checkHealthy(res *Result, scenario string, pid uint32, got []correlate.Transfer, acts []correlate.Activity) {
	if !slices.Contains(GraphScenarios, scenario) {
		return
	}
	w := checks.NewWindow()
	w.SetKernelsProbed(true)
	for i := range got {
		w.Transfer(&got[i])
	}
	for i := range acts {
		w.Activity(&acts[i])
	}
	lane := refenv.LaneGBs()
	place := func(p uint32) checks.Placement {
		if p != pid {
			return checks.Placement{Why: fmt.Sprintf("pid %d is not a process of %s", p, scenario)}
		}
		return checks.Placement{GPU: privateGPU(pid), InboundGBs: lane, OutboundGBs: lane}
	}
	scope := fmt.Sprintf("pid %d", pid)
	all := append(w.Checks(scope, pid), checks.ComputeCheck(scope, w.Compute(pid)))
	all = append(all, w.InFlights(place, nil, 0).Checks()...)
	for _, c := range all {
		for _, f := range c.Findings {
			if f.Severity == correlate.SevWarn || f.Severity == correlate.SevFail {
				res.OtherErrs++
				res.Problems = append(res.Problems, fmt.Sprintf("healthy shape: %s %s on %s: %s; %s", f.Severity, f.Rule, f.Subject,
					f.Summary, strings.Join(f.Evidence, "; ")))
			}
		}
	}
}
