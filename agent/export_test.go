package agent

import (
	"slices"

	"github.com/lanewatch/lanewatch/probes"
)

// SetAfterMaps makes every scan call f once it read a process's maps, before
// it opens the files they name. Set it before Run.
func SetAfterMaps(a *Agent, f func(pid int, maps []probes.Mapping)) { a.afterMaps = f }

// SetBeforeVerdict makes every rescan that attached a process's files
// call f before deciding whether they were attached late. Set it before Run.
func SetBeforeVerdict(a *Agent, f func(pid int)) { a.beforeVerdict = f }

// Holds says whether the engine holds state of pid.
func Holds(a *Agent, pid int) bool {
	a.engineMu.Lock()
	defer a.engineMu.Unlock()
	return slices.Contains(a.engine.Processes(), uint32(pid))
}

// LinksIn counts the links attached in the files attached under path.
func LinksIn(a *Agent, path string) int {
	n := 0
	for id, af := range a.probes.Files() {
		if af.Path == path {
			n += a.probes.FileLinks(id)
		}
	}
	return n
}

// ProbedFiles lists the files with probes.
func ProbedFiles(a *Agent) map[probes.FileID]bool {
	out := map[probes.FileID]bool{}
	for id := range a.probes.Files() {
		out[id] = true
	}
	return out
}

// FlowsOf counts the BPF copy counters of pid not yet folded by a sweep.
func FlowsOf(a *Agent, pid int) (int, error) {
	flows, err := a.probes.Flows()
	n := 0
	for _, f := range flows {
		if f.PID == uint32(pid) {
			n++
		}
	}
	return n, err
}
