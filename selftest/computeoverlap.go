package selftest

import (
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/judge"
)

// ComputeScenarios are the shapes of compute overlap
// (refpath/kvpath/computeoverlap.c), run with Scenarios.
var ComputeScenarios = []string{"layer-compute", "layer-compute-sync", "layer-compute-item"}

// GraphScenarios are the healthy shapes under CUDA graphs
// (refpath/kvpath/graphs.c), run with Scenarios: no record for a copy
// captured into a graph, one launch activity per graph launch, and
// nothing above INFO in the window (designed).
var GraphScenarios = []string{"decode-graphs"}

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

// checkCompute compares the agent's compute-overlap facts with the
// truth's (docs/design.md, "Compute overlap"); the rules they fire are
// judged with the row's others, once (checkDesigned). For the compute and
// graph shapes: every launch, host wait and event record the truth made was
// reported, exactly; for the compute shapes also the agent's overlap bound
// is at least what the truth's engine intervals show ran together (a
// bound, never below).
func checkCompute(res *Result, scenario string, pid uint32, truth []TruthCall, got []correlate.Transfer, acts []correlate.Activity) {
	if !slices.Contains(ComputeScenarios, scenario) && !slices.Contains(GraphScenarios, scenario) {
		return
	}
	note := func(format string, args ...any) { res.Problems = append(res.Problems, fmt.Sprintf(format, args...)) }
	if g, t := activityCounts(acts), truthActivityCounts(truth); g != t {
		res.OtherErrs++
		note("compute overlap: the agent reported %s, the truth made %s", g, t)
	}
	if !slices.Contains(ComputeScenarios, scenario) {
		return
	}
	// The bound is a fact of the rule's report, not of its verdict: read
	// from a window of the row's records alone.
	w := judge.NewWindow(true)
	for i := range got {
		w.Transfer(&got[i])
	}
	for i := range acts {
		w.Activity(&acts[i])
	}
	engine := truthComputeOverlap(truth)
	var bound uint64
	for _, s := range judge.Compute(w, pid).Streams {
		bound += s.OverlapNs
	}
	switch {
	case bound < engine:
		res.OtherErrs++
		note("compute overlap: the agent's bound %d ns is below the %d ns the truth's engines ran loads beside compute", bound, engine)
	default:
		note("finding: loads beside compute: truth's engines %.3f ms, the agent's bound %.3f ms", float64(engine)/1e6, float64(bound)/1e6)
	}
}

// activityCounts says how many launches, host waits by op and event
// records the agent reported.
func activityCounts(acts []correlate.Activity) string {
	n := map[event.Op]int{}
	for _, a := range acts {
		n[a.Op]++
	}
	return countText(n)
}

// truthActivityCounts is the same of the truth's successful calls.
func truthActivityCounts(truth []TruthCall) string {
	n := map[event.Op]int{}
	for _, t := range truth {
		if t.End || t.Result != 0 {
			continue
		}
		switch t.Op {
		case TruthLaunch, TruthKernelCopy:
			n[event.OpLaunch]++
		case TruthStreamSync, TruthEventSync, TruthEventRecord, TruthCtxSync, TruthGraphLaunch:
			n[t.Op.Agent()]++
		}
		// captured_launch, captured_copy: recorded into a graph, no activity
	}
	return countText(n)
}

// activityOps are the activities the counts name, in their order.
var activityOps = []event.Op{event.OpLaunch, event.OpGraphLaunch, event.OpStreamSync, event.OpEventSync, event.OpCtxSync, event.OpEventRecord}

func countText(n map[event.Op]int) string {
	var parts []string
	for _, k := range activityOps {
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
		if x.Op != TruthCopy || x.Direction != correlate.DirH2D || x.EngineEndNs == 0 {
			continue
		}
		for _, k := range truth {
			if k.Op != TruthLaunch || k.EngineEndNs == 0 {
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
