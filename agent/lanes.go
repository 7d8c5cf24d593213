package agent

import (
	"cmp"
	"log/slog"
	"maps"
	"slices"
	"sync"

	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/exporters"
	"github.com/lanewatch/lanewatch/probes"
)

// Lane byte totals (docs/design.md, "Lane byte totals"): the copy
// counters kept in BPF (probes.Flows), exact however many events the ring
// dropped, placed on GPU lanes with what the engine learned from the copy
// records that did arrive (correlate.Engine.StreamGPUs). A lane's
// direction is the one the copies stated (correlate.DirH2D, ...;
// DirUnknown for cudaMemcpyDefault), its GPU "" when no record placed the
// flow's stream.

type laneKey struct{ gpu, direction string }

// maxExitedStreams bounds the processes whose streams' GPUs are kept from
// their exit to the sweep that folds their flows; past it, a process's
// flows fold onto an unknown GPU.
const maxExitedStreams = 4096

// lanes keeps the totals of flows whose process is gone: folded in here,
// then deleted from the BPF map, so that the map keeps room for the living.
type lanes struct {
	mu     sync.Mutex
	folded map[laneKey]*exporters.LaneCopies
	// exited: the streams' GPUs of processes that exited (or exec'd),
	// as the engine knew them before forgetting them, until a sweep.
	exited map[uint32]map[uint64]string
	final  *laneTotals // after Run: the last totals, the BPF map closed
	// shed: the copies each swept process had shed, kept for
	// ShedByProcess (a window that closes after the sweep still learns of
	// them); at maxSweptShed processes it starts over.
	shed map[uint32]uint64
}

// maxSweptShed bounds the swept processes whose shed copies are kept.
const maxSweptShed = 4096

type laneTotals struct {
	lanes     []exporters.LaneCopies
	uncounted uint64
}

func newLanes() *lanes {
	return &lanes{folded: map[laneKey]*exporters.LaneCopies{}, exited: map[uint32]map[uint64]string{}}
}

// exit keeps what the engine knew of a process's streams, about to be
// forgotten (an exit, an exec), for the flows the process left.
func (l *lanes) exit(pid uint32, gpus map[uint64]string) {
	if len(gpus) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if old := l.exited[pid]; old != nil {
		for s, g := range gpus {
			old[s] = g // an exec's streams, then the new image's
		}
		return
	}
	if len(l.exited) < maxExitedStreams {
		l.exited[pid] = gpus
	}
}

// flowDirection is the direction of a copy that stated kind.
func flowDirection(k event.CopyKind) string {
	switch k {
	case event.CopyHostToDevice:
		return correlate.DirH2D
	case event.CopyDeviceToHost:
		return correlate.DirD2H
	case event.CopyDeviceToDevice:
		return correlate.DirD2D
	case event.CopyHostToHost:
		return correlate.DirH2H
	}
	return correlate.DirUnknown // cudaMemcpyDefault: where its pointers live decides, per copy
}

// flowGPU is the GPU of a flow's stream: what the engine knows now (a
// live process), else what it knew when the process exited.
func flowGPU(now, exited map[uint64]string, stream uint64) string {
	if stream <= 2 {
		stream = 0 // the default streams (correlate.Engine.StreamGPUs)
	}
	if g := now[stream]; g != "" {
		return g
	}
	return exited[stream]
}

// place adds each flow of a traced process to totals, on the lane of its
// stream: now is what the engine knows of each process, exited what it
// knew when the process exited (lanes.exited).
func place(totals map[laneKey]*exporters.LaneCopies, flows []probes.Flow, now, exited map[uint32]map[uint64]string, traced func(pid uint32) bool) {
	for _, f := range flows {
		if !traced(f.PID) {
			continue
		}
		k := laneKey{flowGPU(now[f.PID], exited[f.PID], f.Stream), flowDirection(f.Kind)}
		t := totals[k]
		if t == nil {
			t = &exporters.LaneCopies{GPU: k.gpu, Direction: k.direction}
			totals[k] = t
		}
		t.Copies += f.Calls
		t.Bytes += f.Bytes
		t.Shed += f.Shed
	}
}

// traced says whether the copies of pid count (agent run --pid).
func (a *Agent) traced(pid uint32) bool { return a.targets == nil || a.targets[int(pid)] }

// streamGPUs asks the engine about each process of flows.
func (a *Agent) streamGPUs(flows []probes.Flow) map[uint32]map[uint64]string {
	out := map[uint32]map[uint64]string{}
	a.engineMu.Lock()
	defer a.engineMu.Unlock()
	for _, f := range flows {
		if _, done := out[f.PID]; !done {
			out[f.PID] = a.engine.StreamGPUs(f.PID)
		}
	}
	return out
}

// LaneCopies is what every successful CUDA driver copy (batch copies
// aside) of the traced processes moved since the agent started, per GPU
// lane and direction, from the BPF-side counters: exact even when events
// were dropped. uncounted: copies the BPF flow table had no room for.
func (a *Agent) LaneCopies() (lanes []exporters.LaneCopies, uncounted uint64) {
	a.lanes.mu.Lock()
	defer a.lanes.mu.Unlock()
	if f := a.lanes.final; f != nil {
		return slices.Clone(f.lanes), f.uncounted
	}
	totals := make(map[laneKey]*exporters.LaneCopies, len(a.lanes.folded))
	for k, t := range a.lanes.folded {
		c := *t
		totals[k] = &c
	}
	flows, err := a.probes.Flows()
	if err != nil {
		a.limited.Log(slog.LevelWarn, "flows\x00read", "read the copy counters", "err", err)
	}
	place(totals, flows, a.streamGPUs(flows), a.lanes.exited, a.traced)
	if uncounted, err = a.probes.FlowsFull(); err != nil {
		a.limited.Log(slog.LevelWarn, "flows\x00read", "read the copy counters", "err", err)
	}
	lanes = make([]exporters.LaneCopies, 0, len(totals)) // empty, not nil: the counters were read
	for _, t := range totals {
		lanes = append(lanes, *t)
	}
	slices.SortFunc(lanes, func(x, y exporters.LaneCopies) int {
		return cmp.Or(cmp.Compare(x.GPU, y.GPU), cmp.Compare(x.Direction, y.Direction))
	})
	return lanes, uncounted
}

// sweepLanes folds the flows of processes that are gone into the lanes'
// own totals and deletes them from the BPF map. The processes are listed
// after the flows were read: one that started meanwhile is not taken for
// gone. A process gone has no thread left to add to its flows, so nothing
// is lost between reading a flow and deleting it.
func (a *Agent) sweepLanes() {
	a.lanes.mu.Lock()
	defer a.lanes.mu.Unlock()
	flows, err := a.probes.Flows()
	if err != nil {
		a.limited.Log(slog.LevelWarn, "flows\x00read", "read the copy counters", "err", err)
		return
	}
	if len(flows) == 0 && len(a.lanes.exited) == 0 {
		return
	}
	live, ok := livePIDs(a.cfg.ProcRoot) // listed after the flows were read
	if !ok {
		return
	}
	var gone []probes.Flow
	for _, f := range flows {
		if live[f.PID] {
			continue
		}
		if err := a.probes.ForgetFlow(f); err != nil {
			a.limited.Log(slog.LevelWarn, "flows\x00forget", "forget a gone process's copy counters", "err", err)
			continue // still in the map: counted there
		}
		gone = append(gone, f)
		if f.Shed > 0 && a.traced(f.PID) {
			if a.lanes.shed == nil || len(a.lanes.shed) >= maxSweptShed {
				a.lanes.shed = map[uint32]uint64{}
			}
			a.lanes.shed[f.PID] += f.Shed
		}
	}
	place(a.lanes.folded, gone, a.streamGPUs(gone), a.lanes.exited, a.traced)
	a.lanes.forget(live)
}

// forget drops the streams of exited processes no longer live: their
// flows were folded (a process's flows and its exit are swept together).
func (l *lanes) forget(live map[uint32]bool) {
	for pid := range l.exited {
		if !live[pid] {
			delete(l.exited, pid)
		}
	}
}

// finishLanes keeps the last totals, before the BPF map is closed.
func (a *Agent) finishLanes() {
	lanes, uncounted := a.LaneCopies()
	a.lanes.mu.Lock()
	a.lanes.final = &laneTotals{lanes, uncounted}
	a.lanes.mu.Unlock()
}

// ShedByProcess is the copies each traced process had shed (probes.Flow.Shed),
// cumulative: those in the flows in the BPF map, and those of processes
// swept from it (the last maxSweptShed of them). judge.EvaluatorConfig.Shed
// reads it once per window, the selftest per row.
func (a *Agent) ShedByProcess() (map[uint32]uint64, error) {
	a.lanes.mu.Lock()
	defer a.lanes.mu.Unlock()
	flows, err := a.probes.Flows()
	if err != nil {
		return nil, err
	}
	by := maps.Clone(a.lanes.shed)
	if by == nil {
		by = map[uint32]uint64{}
	}
	for _, f := range flows {
		if f.Shed > 0 && a.traced(f.PID) {
			by[f.PID] += f.Shed
		}
	}
	return by, nil
}
