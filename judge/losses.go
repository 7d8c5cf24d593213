package judge

import (
	"fmt"
	"maps"
	"slices"

	"github.com/lanewatch/lanewatch/checks"
)

// Windows with lost events (issue 23, docs/design.md "Lane byte totals"):
// when the probes lose events, the rules judge part of a window, and the
// checks that rest on the lost part say so (checks.Check.Partial) rather
// than pass on it.

// Losses are what a window knows of the events lost while it was open.
type Losses struct {
	// PIDs are the processes whose events said events of theirs were lost
	// before them (event.Call.LostBefore).
	PIDs map[uint32]bool
	// All: any process's events may be missing — an event said so
	// (event.Call.LostAny), or the probes' drop counters moved while the
	// window was open, or more processes lost events than are kept.
	All bool
	// Events is how many events the probes' drop counters counted lost or
	// truncated while the window was open (EvaluatorConfig.Drops; every
	// reason of lanewatch_probe_dropped_events_total); 0 none or not read.
	Events uint64
	// Shed are the copies each process had shed while the window was open
	// (probes.Options.NoShedding; EvaluatorConfig.Shed): their bytes are
	// in the lane totals, their records in no rule.
	Shed map[uint32]uint64
}

// maxLossPIDs bounds the processes a window keeps as lossy; past it the
// window says any process's events may be missing.
const maxLossPIDs = 1024

// Lossy reports whether the window lost any event.
func (l Losses) Lossy() bool { return l.All || len(l.PIDs) > 0 || l.Events > 0 || len(l.Shed) > 0 }

// Lost says events were lost before the next one the window gets: those
// of process pid, or of any process (all). The agent calls it only for
// events that say so: a window without losses pays nothing.
func (w *Window) Lost(pid uint32, all bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.lost.lose(pid, all)
}

func (l *Losses) lose(pid uint32, all bool) {
	switch {
	case all || l.All:
		l.All = true
	case len(l.PIDs) >= maxLossPIDs && !l.PIDs[pid]:
		l.All = true
	default:
		if l.PIDs == nil {
			l.PIDs = map[uint32]bool{}
		}
		l.PIDs[pid] = true
	}
}

// Losses are the window's losses so far.
func (w *Window) Losses() Losses {
	w.mu.Lock()
	defer w.mu.Unlock()
	l := w.lost
	l.PIDs, l.Shed = maps.Clone(l.PIDs), maps.Clone(l.Shed)
	return l
}

// Lost tells the current window that events were lost before the next
// one: process pid's, or any process's (all). Agent.Config.Lost.
func (e *Evaluator) Lost(pid uint32, all bool) { e.cur.Lost(pid, all) }

// dropsSince is how many events the probes counted lost or truncated
// since the previous call (EvaluatorConfig.Drops); 0 when they are not
// read, or could not be: a count not read now is in the next reading's.
func (e *Evaluator) dropsSince() uint64 {
	if e.cfg.Drops == nil {
		return 0
	}
	n, err := e.cfg.Drops()
	if err != nil || n < e.drops {
		return 0
	}
	d := n - e.drops
	e.drops = n
	return d
}

// partial marks the checks that rest on events the window lost
// (checks.Check.Partial): every check when any process's may be missing;
// else the checks of the processes that lost events, and the checks of no
// process (a GPU's lanes, the host's), which judge every process's
// events. scoped names the processes of the scopes the rules gave
// (Env.scope).
func partial(cs []checks.Check, l Losses, scoped map[string]uint32) []checks.Check {
	if !l.Lossy() {
		return cs
	}
	var lost []string
	for pid := range l.PIDs {
		lost = append(lost, fmt.Sprint(pid))
	}
	for pid := range l.Shed {
		if !l.PIDs[pid] {
			lost = append(lost, fmt.Sprint(pid))
		}
	}
	slices.Sort(lost)
	for i, c := range cs {
		pid, process := scoped[c.Scope]
		var why string
		switch {
		case process && !l.All && !l.PIDs[pid] && l.Shed[pid] > 0:
			why = fmt.Sprintf("incomplete: %d copies of pid %d were shed in the window (the probes' ring over three quarters full): in the lane totals, not in the rules", l.Shed[pid], pid)
		case l.All && l.Events > 0:
			why = fmt.Sprintf("incomplete: %d events lost or truncated in the probes while the window was open (lanewatch_window_events_lost), their processes unknown", l.Events)
		case l.All:
			why = "incomplete: events of any process may have been lost in the window"
		case process && l.PIDs[pid]:
			why = fmt.Sprintf("incomplete: events of pid %d were lost in the window", pid)
		case !process && len(l.Shed) > 0:
			why = fmt.Sprintf("incomplete: events of pid %s were lost or shed in the window", checks.JoinLimited(lost, 8))
		case !process:
			why = fmt.Sprintf("incomplete: events of pid %s were lost in the window", checks.JoinLimited(lost, 8))
		default:
			continue // another process's losses: this one's events are whole
		}
		cs[i] = c.Partial(why)
	}
	return cs
}

// Shed adds the copies each process had shed while the window was open.
func (w *Window) Shed(by map[uint32]uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for pid, n := range by {
		if n == 0 {
			continue
		}
		if w.lost.Shed == nil {
			w.lost.Shed = map[uint32]uint64{}
		}
		if _, ok := w.lost.Shed[pid]; !ok && len(w.lost.Shed) >= maxLossPIDs {
			w.lost.All = true // past the bound: whose, the window no longer says
			continue
		}
		w.lost.Shed[pid] += n
	}
}

// shedSince is the copies each process shed since the previous call
// (EvaluatorConfig.Shed); a process whose count went down (its counters
// folded away once it exited, or its pid reused) counts from its new
// reading on.
func (e *Evaluator) shedSince() map[uint32]uint64 {
	if e.cfg.Shed == nil {
		return nil
	}
	now, err := e.cfg.Shed()
	if err != nil {
		return nil // read again at the next close: the counts are cumulative
	}
	var since map[uint32]uint64
	for pid, n := range now {
		if last := e.shed[pid]; n > last {
			if since == nil {
				since = map[uint32]uint64{}
			}
			since[pid] = n - last
		}
	}
	e.shed = now
	return since
}

// Dropped adds n events the probes counted lost or truncated while the
// window was open: whose, they do not say, so any process's may be
// missing.
func (w *Window) Dropped(n uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.lost.Events += n
	w.lost.All = true
}
