package agent

import "github.com/lanewatch/lanewatch/probes"

// SetAfterMaps makes every scan call f once it read a process's maps, before
// it opens the files they name. Set it before Run.
func SetAfterMaps(a *Agent, f func(pid int, maps []probes.Mapping)) { a.afterMaps = f }
