package agent

import (
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/lanewatch/lanewatch/checks"
	"github.com/lanewatch/lanewatch/collectors"
	"github.com/lanewatch/lanewatch/correlate"
)

// maxPoolsJudged bounds the pinned ranges located per process per round
// (move_pages on each is cheap, but a process may register thousands).
const maxPoolsJudged = 16

// HostJudge runs, at most once per every, the checks `agent diagnose` makes
// of the host (link training, IOMMU mode) and of every process the agent
// knows to hold pinned memory (where its pools' pages live, whether its
// NUMA binding was skipped, pinned memory against what the host has left),
// so that `agent run` keeps these findings current too. Between rounds it
// returns the last round's findings. loads (nil: none) gives each round the
// GPU link states read under load since the previous (LinkWatch.Take), by
// which link-degraded judges GPUs. Processes' environments are read through
// env (nil: each round reads them again).
func (a *Agent) HostJudge(procRoot, sysRoot string, env *collectors.EnvCache, every time.Duration, log *slog.Logger, loads func() map[string]checks.LinkLoad) func() []correlate.Finding {
	var mu sync.Mutex
	var last time.Time
	var cached []correlate.Finding
	return func() []correlate.Finding {
		mu.Lock()
		defer mu.Unlock()
		if !last.IsZero() && time.Since(last) < every {
			return cached
		}
		last = time.Now()
		host, err := checks.ReadHost(procRoot, sysRoot, "")
		if err != nil {
			log.Warn("host checks", "err", err)
			return cached
		}
		if loads != nil {
			host.Loads = loads()
		}
		if env != nil {
			host.Env = env
		}
		a.engineMu.Lock()
		pids := a.engine.PinnedPIDs()
		ranges := map[uint32][]correlate.Range{}
		for _, pid := range pids {
			ranges[pid] = a.engine.Pinned(pid)
		}
		a.engineMu.Unlock()
		slices.Sort(pids)
		pinned := map[uint32]uint64{}
		var all []checks.Check
		for _, pid := range pids {
			var pools []checks.Pool
			for i, rg := range ranges[pid] {
				pinned[pid] += rg.End - rg.Start
				if i >= maxPoolsJudged {
					continue
				}
				pn, err := collectors.RangeNodes(int(pid), rg.Start, rg.End, 0)
				pools = append(pools, checks.Pool{Start: rg.Start, Size: rg.End - rg.Start, PagesByNode: pn.ByNode, Source: "move_pages", Err: err})
			}
			all = append(all, host.ProcessChecks(int(pid), pools, false)...)
		}
		host.Pinned = &checks.PinnedPools{ByProcess: pinned, Seen: "the processes the agent watches"}
		all = append(all, host.HostChecks(checks.IBDevices{})...)
		cached = cached[:0]
		for _, c := range all {
			cached = append(cached, c.Findings...)
		}
		return cached
	}
}
