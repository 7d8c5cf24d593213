package agent

import (
	"cmp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/lanewatch/lanewatch/probes"
)

// UntracedProcess is a process that maps objects moving data past every
// probe (probes.Untraced): its transfers through them are not seen, so
// readiness and the checks name it rather than pass it in silence
// (docs/design.md, "Transfer libraries").
type UntracedProcess struct {
	PID     int
	Objects []probes.Untraced // in the order of its mappings
	Since   time.Time         // when a scan first saw one of them mapped
}

// Text is "pid N: path (sign): reason; …".
func (p UntracedProcess) Text() string {
	parts := make([]string, len(p.Objects))
	for i, u := range p.Objects {
		parts[i] = u.String()
	}
	return "pid " + strconv.Itoa(p.PID) + ": " + strings.Join(parts, "; ")
}

// untracedState is one process's entry, with the full scan that last saw
// it (a process no full scan sees any more is gone).
type untracedState struct {
	UntracedProcess
	seenGen uint64
}

// noteUntraced records what one scan of a process found (none: the entry
// goes). A process newly found is logged once.
func (a *Agent) noteUntraced(pid int, objs []probes.Untraced) {
	a.filesMu.Lock()
	st := a.untraced[pid]
	if len(objs) == 0 {
		delete(a.untraced, pid)
		a.filesMu.Unlock()
		return
	}
	changed := st == nil || !slices.Equal(st.Objects, objs)
	if st == nil {
		st = &untracedState{UntracedProcess: UntracedProcess{PID: pid, Since: time.Now()}}
		a.untraced[pid] = st
	}
	st.Objects, st.seenGen = objs, a.scanGen
	text := st.Text()
	a.filesMu.Unlock()
	if changed {
		a.log.Warn("process moves data past the probes: its transfers through these objects are not seen", "pid", pid, "objects", text)
	}
}

// forgetUntraced drops the processes the full scan gen did not see
// (called with filesMu held, from endFullScan).
func (a *Agent) forgetUntraced(gen uint64) {
	for pid, st := range a.untraced {
		if st.seenGen < gen {
			delete(a.untraced, pid)
		}
	}
}

// Untraced lists the processes with objects whose transfers the agent
// cannot see, by pid.
func (a *Agent) Untraced() []UntracedProcess {
	a.filesMu.Lock()
	defer a.filesMu.Unlock()
	out := make([]UntracedProcess, 0, len(a.untraced))
	for _, st := range a.untraced {
		p := st.UntracedProcess
		p.Objects = slices.Clone(p.Objects)
		out = append(out, p)
	}
	slices.SortFunc(out, func(x, y UntracedProcess) int { return cmp.Compare(x.PID, y.PID) })
	return out
}
