package agent

import (
	"cmp"
	"context"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/lanewatch/lanewatch/probes"
)

// fileState is what the agent knows of one mapped file (by device and
// inode): its verdict once it stands, or why a library to probe has no
// probes yet (docs/design.md, "Attach and discovery": a library that could
// not be probed is retried and reported until it is).
type fileState struct {
	v     fileVerdict
	final bool // v stands: read, and attached where it has rows to attach

	// A library to probe (it exports table rows, or is named like CUDA's)
	// that has no probes: mapped but not probed.
	unprobed bool
	name     string    // the path a process maps it by
	pid      int       // a process that maps it, the latest seen
	reason   string    // why it has no probes (the latest failure)
	failures uint64    // failed tries
	since    time.Time // the first failure
	retryAt  time.Time // no new try before (zero: at the next sighting)
	seenGen  uint64    // the full scan that last saw it mapped
	lastSeen time.Time // when a scan last saw it mapped
	pinned   bool      // named on the command line: probed whoever maps it
}

// UnprobedLibrary is a library a process maps that the agent could not
// probe: a blind spot, reported until its probes are in or no process maps
// it any more.
type UnprobedLibrary struct {
	Path     string        // as the process maps it
	File     probes.FileID // device and inode
	PID      int           // a process that maps it (the latest seen)
	Reason   string        // why it has no probes (the latest failure)
	Failures uint64        // failed tries so far
	Since    time.Time     // the first failure
}

// Unprobed lists the mapped libraries without probes, by path: readiness
// is an empty list.
func (a *Agent) Unprobed() []UnprobedLibrary {
	a.filesMu.Lock()
	defer a.filesMu.Unlock()
	var out []UnprobedLibrary
	for id, st := range a.files {
		if st.unprobed {
			out = append(out, UnprobedLibrary{Path: st.name, File: id, PID: st.pid, Reason: st.reason, Failures: st.failures, Since: st.since})
		}
	}
	slices.SortFunc(out, func(x, y UnprobedLibrary) int {
		return cmp.Or(cmp.Compare(x.Path, y.Path), cmp.Compare(x.File.Dev, y.File.Dev), cmp.Compare(x.File.Inode, y.File.Inode))
	})
	return out
}

// UnprobedByLibrary counts the mapped libraries without probes by file
// name (lanewatch_unprobed_libraries).
func (a *Agent) UnprobedByLibrary() map[string]int {
	out := map[string]int{}
	for _, u := range a.Unprobed() {
		lib := filepath.Base(u.Path)
		if _, ok := out[lib]; !ok && len(out) >= maxLibraryLabels {
			lib = "other"
		}
		out[lib]++
	}
	return out
}

// AttachFailures counts failed tries to probe a library, by file name
// (lanewatch_attach_failures_total); at most maxLibraryLabels names, the
// rest under "other".
func (a *Agent) AttachFailures() map[string]uint64 {
	a.filesMu.Lock()
	defer a.filesMu.Unlock()
	out := make(map[string]uint64, len(a.attachFails))
	for lib, n := range a.attachFails {
		out[lib] = n
	}
	return out
}

// maxLibraryLabels bounds the library names counted apart (docs/design.md,
// "Metrics": past 512 label sets a family counts under other).
const maxLibraryLabels = 512

// countAttachFailure counts one failed try on a library; filesMu held.
func (a *Agent) countAttachFailure(path string) {
	a.attachErr.Add(1)
	lib := filepath.Base(path)
	if _, ok := a.attachFails[lib]; !ok && len(a.attachFails) >= maxLibraryLabels {
		lib = "other"
	}
	a.attachFails[lib]++
}

// beginFullScan starts a scan of every process: the files it does not see
// mapped are no longer blind spots (endFullScan).
func (a *Agent) beginFullScan() uint64 {
	a.filesMu.Lock()
	defer a.filesMu.Unlock()
	a.scanGen++
	return a.scanGen
}

// endFullScan forgets the unprobed libraries the full scan gen did not see
// mapped, and the untraced processes it did not see: no process can call
// into them. Seen again, they are new.
func (a *Agent) endFullScan(gen uint64) {
	a.filesMu.Lock()
	var gone []*fileState
	for id, st := range a.files {
		if st.unprobed && st.seenGen < gen {
			gone = append(gone, st)
			delete(a.files, id)
		}
	}
	a.forgetUntraced(gen)
	a.filesMu.Unlock()
	for _, st := range gone {
		a.log.Info("library no longer mapped by any process: no longer a blind spot", "path", st.name, "failures", st.failures, "reason", st.reason)
	}
}

// limitedLog writes at most one line per cause per interval: a cause that
// repeats (a library failing at every rescan) says how often it did since
// its last line.
type limitedLog struct {
	log   *slog.Logger
	every time.Duration
	now   func() time.Time

	mu     sync.Mutex
	causes map[string]*logCause
}

type logCause struct {
	last       time.Time
	suppressed uint64
}

// maxLogCauses bounds the causes remembered; past it, the oldest half is
// forgotten (they may log again at once).
const maxLogCauses = 4096

func newLimitedLog(log *slog.Logger, every time.Duration) *limitedLog {
	return &limitedLog{log: log, every: every, now: time.Now, causes: map[string]*logCause{}}
}

// Log writes msg with args unless the cause was logged within the interval,
// and says whether it did; the line says how many were held back since the
// previous one.
func (l *limitedLog) Log(level slog.Level, cause, msg string, args ...any) bool {
	l.mu.Lock()
	now := l.now()
	c := l.causes[cause]
	if c != nil && now.Sub(c.last) < l.every {
		c.suppressed++
		l.mu.Unlock()
		return false
	}
	if c == nil {
		if len(l.causes) >= maxLogCauses {
			l.forgetOldest()
		}
		c = &logCause{}
		l.causes[cause] = c
	}
	held := c.suppressed
	c.last, c.suppressed = now, 0
	l.mu.Unlock()
	if held > 0 {
		args = append(args, "repeated", held, "over", l.every.String())
	}
	l.log.Log(context.Background(), level, msg, args...)
	return true
}

// forgetOldest drops the older half of the causes; mu held.
func (l *limitedLog) forgetOldest() {
	times := make([]time.Time, 0, len(l.causes))
	for _, c := range l.causes {
		times = append(times, c.last)
	}
	slices.SortFunc(times, time.Time.Compare)
	cut := times[len(times)/2]
	for k, c := range l.causes {
		if !c.last.After(cut) {
			delete(l.causes, k)
		}
	}
}
