package agent

import (
	"log/slog"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/lanewatch/lanewatch/collectors"
	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/topology"
)

// maxPoolsJudged bounds the pinned ranges located per process per round
// (move_pages on each is cheap, but a process may register thousands).
const maxPoolsJudged = 16

// HostJudge runs, at most once per every, the checks `agent diagnose` makes
// of the host (link training, IOMMU mode) and of every process the agent
// knows to hold pinned memory (where its pools' pages live, whether its
// NUMA binding was skipped, pinned memory against what the host has left),
// so that `agent run` keeps these findings current too. Between rounds it
// returns the last round's findings.
func (a *Agent) HostJudge(procRoot, sysRoot string, every time.Duration, log *slog.Logger) func() []correlate.Finding {
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
		host, err := topology.Read(sysRoot)
		if err != nil {
			log.Warn("host checks: read topology", "err", err)
			return cached
		}
		d := &diagnosis{cfg: DiagnoseConfig{ProcRoot: procRoot, SysRoot: sysRoot, PathEnv: os.Getenv("PATH")},
			host: host, gpus: host.BDFs(topology.KindGPU)}
		r := &Report{}
		d.hostChecks(r)
		pinned := map[uint32]uint64{}
		a.engineMu.Lock()
		pids := a.engine.PinnedPIDs()
		ranges := map[uint32][]correlate.Range{}
		for _, pid := range pids {
			ranges[pid] = a.engine.Pinned(pid)
		}
		a.engineMu.Unlock()
		sort.Slice(pids, func(i, j int) bool { return pids[i] < pids[j] })
		for _, pid := range pids {
			win := &window{pools: map[int][]placement{}}
			for i, rg := range ranges[pid] {
				pinned[pid] += rg.End - rg.Start
				if i >= maxPoolsJudged {
					continue
				}
				pn, err := collectors.RangeNodes(int(pid), rg.Start, rg.End, 0)
				win.pools[int(pid)] = append(win.pools[int(pid)], placement{start: rg.Start, size: rg.End - rg.Start,
					pages: pn.ByNode, source: "move_pages", err: err})
			}
			d.processChecksStatic(r, int(pid), win)
		}
		if m, err := collectors.ReadMeminfo(procRoot); err == nil {
			facts := correlate.PinnedFacts{MemTotal: m.MemTotalBytes, MemAvailable: m.MemAvailableBytes, ByProcess: pinned}
			for _, b := range pinned {
				facts.PinnedBytes += b
			}
			if f := correlate.PinnedPressure(facts); f != nil {
				r.Checks = append(r.Checks, Check{Findings: []correlate.Finding{*f}})
			}
		}
		cached = cached[:0]
		for _, c := range r.Checks {
			cached = append(cached, c.Findings...)
		}
		return cached
	}
}
