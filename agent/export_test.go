package agent

import (
	"slices"

	"github.com/lanewatch/lanewatch/probes"
)

// SetAfterMaps makes every scan call f once it read a process's maps, before
// it opens the files they name. Set it before Run.
func SetAfterMaps(a *Agent, f func(pid int, maps []probes.Mapping)) { a.afterMaps = f }

// Holds says whether the engine holds state of pid.
func Holds(a *Agent, pid int) bool {
	a.engineMu.Lock()
	defer a.engineMu.Unlock()
	return slices.Contains(a.engine.Processes(), uint32(pid))
}
