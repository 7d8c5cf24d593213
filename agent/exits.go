package agent

import (
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"github.com/lanewatch/lanewatch/event"
)

// reapEvery is how often the reading goroutine looks for processes whose
// exit event was lost; busyReapAfter how long a process must have been
// missing before it is finished while the ring was never found empty (the
// reader may lag that far behind at most).
const (
	reapEvery     = time.Second
	busyReapAfter = 10 * time.Second
)

// reaper finishes processes whose exit event was lost (a full ring: the
// exit tracepoint's event goes through the ring like any other). The engine
// would otherwise hold their state, the page stage their copies and OnExit
// never run. Touched by the reading goroutine only, but lost.
type reaper struct {
	next    time.Time
	missing map[uint32]time.Time // processes the engine holds that /proc did not show, since
	lost    atomic.Uint64
}

// livePIDs lists the processes procfs shows; ok false when it cannot
// prove one gone: unreadable, or not showing this pid namespace.
func livePIDs(procRoot string) (live map[uint32]bool, ok bool) {
	listed, err := listPIDs(procRoot)
	live = make(map[uint32]bool, len(listed))
	for _, pid := range listed {
		live[uint32(pid)] = true
	}
	return live, err == nil && live[uint32(os.Getpid())]
}

// between runs on the reading goroutine between events (probes.Options.Between).
// A process the engine holds that /proc has not shown at two looks at
// least reapEvery apart is finished as its exit event would have: when the
// ring was just found empty every event it sent was handled; else only
// once it has been missing for busyReapAfter.
func (a *Agent) between(idle bool) {
	now := time.Now()
	a.readerRound.Store(now.UnixNano())
	if now.Before(a.reap.next) {
		return
	}
	a.reap.next = now.Add(reapEvery)
	a.sweepLanes()
	live, ok := livePIDs(a.cfg.ProcRoot)
	if !ok {
		return
	}
	a.engineMu.Lock()
	pids := a.engine.Processes()
	a.engineMu.Unlock()
	missing := make(map[uint32]time.Time, len(a.reap.missing))
	for _, pid := range pids {
		if live[pid] {
			continue
		}
		since, seen := a.reap.missing[pid]
		if !seen {
			missing[pid] = now
			continue
		}
		if wait := now.Sub(since); wait < reapEvery || !idle && wait < busyReapAfter {
			missing[pid] = since
			continue
		}
		a.reap.lost.Add(1)
		a.limited.Log(slog.LevelWarn, "lost exit", "process gone without its exit event (lost in the ring, or not seen by the exit probe): finished now that /proc no longer shows it",
			"pid", pid, "missing_for", now.Sub(since).Round(time.Millisecond).String())
		a.handle(&event.Call{Kind: event.KindExit, PID: pid, TID: pid, Time: event.Now()})
	}
	a.reap.missing = missing
}
