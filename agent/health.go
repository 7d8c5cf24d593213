package agent

import (
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/lanewatch/lanewatch/event"
)

// DefaultReadyMaxDropRatio is the share of probe events dropped since the
// previous readiness check above which the agent is not ready.
const DefaultReadyMaxDropRatio = 0.01

// readerStale is how long the ring reader may go without a round before
// readiness says it stopped: it drains every 20 ms when idle and calls back
// every probes.BetweenEvents events when busy.
const readerStale = 10 * time.Second

// readiness judges /readyz. Drops are judged over the interval since the
// previous check that was at least a second ago (a probe every few seconds,
// as Kubernetes sends them), so an old burst does not keep it unready.
type readiness struct {
	maxDropRatio float64
	now          func() time.Time

	mu       sync.Mutex
	at       time.Time
	events   uint64
	drops    uint64
	dropWhy  string // the last interval's verdict on drops, "" when under the threshold
	bound    uint64 // loader holds ended by their bound, at the last check
	boundWhy string // the last interval's verdict on them, "" when none
}

// healthSource is what readiness reads from the agent (an interface so
// tests can judge made-up states).
type healthSource interface {
	Attached() bool             // every probe of the first scan attached
	ReaderLastRound() time.Time // zero before the first
	Unprobed() []UnprobedLibrary
	EventsAndDrops() (uint64, event.Drops)
	HoldBoundHits() uint64 // loader holds ended by their bound (probes.HoldStats.Bound)
	Untraced() []UntracedProcess
}

// notReady lists why the agent is not ready, empty when it is.
func (r *readiness) notReady(src healthSource) []string {
	if src == nil {
		return []string{"starting: the tracer is not loaded yet"}
	}
	if !src.Attached() {
		return []string{"starting: the first scan of every process is still attaching probes"}
	}
	var why []string
	now := r.now()
	if last := src.ReaderLastRound(); last.IsZero() || now.Sub(last) > readerStale {
		why = append(why, fmt.Sprintf("ring reader stopped: no round since %s (more than %s)", fmtTime(last), readerStale))
	}
	for _, u := range src.Unprobed() {
		why = append(why, fmt.Sprintf("library without probes: %s (pid %d, %d failed tries since %s): %s",
			u.Path, u.PID, u.Failures, fmtTime(u.Since), u.Reason))
	}
	for _, w := range r.judgeDrops(now, src) {
		if w != "" {
			why = append(why, w)
		}
	}
	return why
}

// judgeDrops says whether more than maxDropRatio of the events since the
// previous check were dropped, and whether a loader hold ended by its
// bound since then (a process went on before its new CUDA library was
// probed: late attach); "" for each that did not happen.
func (r *readiness) judgeDrops(now time.Time, src healthSource) [2]string {
	events, d := src.EventsAndDrops()
	drops, bound := d.Total(), src.HoldBoundHits()
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.at.IsZero() && now.Sub(r.at) < time.Second {
		return [2]string{r.dropWhy, r.boundWhy}
	}
	first := r.at.IsZero()
	de, dd, db := events-r.events, drops-r.drops, bound-r.bound
	r.at, r.events, r.drops, r.bound = now, events, drops, bound
	r.dropWhy, r.boundWhy = "", ""
	if first {
		de, dd, db = events, drops, bound // since the start
	}
	if db > 0 {
		r.boundWhy = fmt.Sprintf("processes held at their loader notification went on before their new CUDA library was probed (the hold's bound): %d since the last check, %d since the start; their earlier registrations are unknown (late_attach)", db, bound)
	}
	if dd > 0 && float64(dd) > r.maxDropRatio*float64(de+dd) {
		var reasons []string
		for _, x := range d.Reasons() {
			if x.Count == 0 {
				continue
			}
			reasons = append(reasons, fmt.Sprintf("%s=%d", x.Name, x.Count))
		}
		r.dropWhy = fmt.Sprintf("probe events dropped or damaged: %d of %d since the last check (more than %.3g%%; totals since the start: %s)",
			dd, de+dd, 100*r.maxDropRatio, strings.Join(reasons, " "))
	}
	return [2]string{r.dropWhy, r.boundWhy}
}

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "the start"
	}
	return t.UTC().Format(time.RFC3339)
}

// serveReady answers /readyz: 200 "ready", else 503 with one reason a
// line; then, either way, the processes the agent cannot see into, each
// with its objects and why. Those do not make the agent unready: nothing
// the agent can retry would trace them, and a DaemonSet pod never ready on
// such a host would hold every rollout; they are said instead, in every
// answer, so a ready agent never vouches for them in silence.
func (r *readiness) serveReady(w http.ResponseWriter, src healthSource) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	why := r.notReady(src)
	if len(why) == 0 {
		fmt.Fprintln(w, "ready")
	} else {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintln(w, "not ready:")
		for _, s := range why {
			fmt.Fprintln(w, "- "+s)
		}
	}
	if src == nil {
		return
	}
	if ps := src.Untraced(); len(ps) > 0 {
		fmt.Fprintln(w, "not traced (their transfers through these objects are not seen, and no check passes them; docs/design.md, \"Transfer libraries\"):")
		for _, p := range ps {
			fmt.Fprintln(w, "- "+p.Text())
		}
	}
}

// serveAlive answers /healthz: the process serves, so it is alive.
func serveAlive(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprintln(w, "ok")
}

// Attached says whether every probe of the first scan is attached (Run
// then calls OnReady).
func (a *Agent) Attached() bool { return a.attached.Load() }

// ReaderLastRound is when the ring reader last came round between events.
func (a *Agent) ReaderLastRound() time.Time {
	ns := a.readerRound.Load()
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

// HoldBoundHits counts the loader holds that ended by their bound.
func (a *Agent) HoldBoundHits() uint64 {
	s, err := a.probes.HoldStats()
	if err != nil {
		a.limited.Log(slog.LevelWarn, "holds\x00read", "read hold counters", "err", err)
	}
	return s.Bound
}

// EventsAndDrops reads the events handled and the BPF drop counters.
func (a *Agent) EventsAndDrops() (uint64, event.Drops) {
	d, err := a.probes.Drops()
	if err != nil {
		a.limited.Log(slog.LevelWarn, "drops\x00read", "read drop counters", "err", err)
	}
	return a.events.Load(), d
}
