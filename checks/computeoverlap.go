package checks

import (
	"fmt"
	"slices"
	"strings"

	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
)

// CheckComputeOverlap is seed 000's L2→L1 item 3: H2D vs compute overlap
// and syncs (correlate.ComputeOverlap).
const CheckComputeOverlap = "H2D vs compute overlap and syncs"

// maxComputeItems bounds the copies and activities a window keeps for the
// compute-overlap judgement (about 100 bytes each); past it they are
// counted, not kept, and the window's compute overlap is not judged.
const maxComputeItems = 1 << 17

// computeWindow is what the compute-overlap rules need of a window: the
// H2D copies and element reads, and the engine's activities, per process.
type computeWindow struct {
	procs   map[uint32]*computeProc
	kept    int
	dropped uint64
	end     uint64 // the latest timestamp seen
}

type computeProc struct {
	copies []correlate.CopySpan
	acts   []correlate.Activity
	// runs are the open runs of compute launches, per thread and stream: a
	// server launches thousands of kernels per wait, and every launch of a
	// run is bounded by the same wait (correlate.Activity.Launches).
	runs map[runKey]*correlate.Activity
}

type runKey struct {
	tid    uint32
	gpu    string
	stream uint64
	graph  bool // graph launches run apart from kernel launches: the report counts them
}

// launch adds a compute launch to its thread's run on its stream.
func (c *computeWindow) launch(a *correlate.Activity) {
	p := c.proc(a.PID)
	k := runKey{a.TID, a.GPU, a.Stream, a.Op == event.OpGraphLaunch}
	if r := p.runs[k]; r != nil {
		r.ReturnNs = max(r.ReturnNs, a.ReturnNs)
		r.Launches++
		return
	}
	if !c.room() {
		return
	}
	if p.runs == nil {
		p.runs = map[runKey]*correlate.Activity{}
	}
	r := *a
	r.Launches = 1
	p.runs[k] = &r
}

// closeRuns ends a process's runs: a wait or record may bound the launches
// before it apart from those after it.
func (p *computeProc) closeRuns() {
	for k, r := range p.runs {
		p.acts = append(p.acts, *r)
		delete(p.runs, k)
	}
}

func (c *computeWindow) proc(pid uint32) *computeProc {
	if c.procs == nil {
		c.procs = map[uint32]*computeProc{}
	}
	p := c.procs[pid]
	if p == nil {
		p = &computeProc{}
		c.procs[pid] = p
	}
	return p
}

// room reports whether one more item may be kept.
func (c *computeWindow) room() bool {
	if c.kept >= maxComputeItems {
		c.dropped++
		return false
	}
	c.kept++
	return true
}

// copy keeps what the rules take of a transfer: H2D copies on their
// streams and the `.item()` shape; called with w.mu held.
func (c *computeWindow) copy(t *correlate.Transfer) {
	s := correlate.CopySpan{TID: t.TID, Stream: t.Stream, GPU: t.GPU, API: t.API, Direction: t.Direction,
		Bytes: t.Bytes, SubmitNs: t.SubmitNs, Complete: t.CompleteNs, CallNs: t.CallNs}
	if t.Mover != correlate.MoverCopyEngine || t.Direction != correlate.DirH2D && !s.ElementRead() {
		return
	}
	c.end = max(c.end, t.SubmitNs+t.CallNs, t.CompleteNs)
	if c.room() {
		p := c.proc(t.PID)
		p.copies = append(p.copies, s)
	}
}

// Activity adds a launch, graph launch, host wait or event record of the
// engine (correlate.ActivitySink).
func (w *Window) Activity(a *correlate.Activity) {
	switch a.Op {
	case event.OpLaunch, event.OpGraphLaunch, event.OpEventRecord, event.OpStreamSync, event.OpEventSync, event.OpCtxSync, event.OpStreamWaitEvent:
	default:
		return
	}
	if a.Op == event.OpLaunch && a.KV {
		return // a load moved by SMs: not compute
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	c := &w.compute
	c.end = max(c.end, a.CallNs, a.ReturnNs)
	if a.IsCompute() {
		c.launch(a)
		return
	}
	p := c.proc(a.PID)
	p.closeRuns()
	if c.room() {
		p.acts = append(p.acts, *a)
	}
}

// SetKernelsProbed says whether kernel launches are probed (agent
// --kernels): without them compute overlap is unknown. Rotate keeps it.
func (w *Window) SetKernelsProbed(on bool) {
	w.mu.Lock()
	w.kernels = on
	w.mu.Unlock()
}

// Compute judges one process's compute overlap (correlate.ComputeOverlap).
func (w *Window) Compute(pid uint32) correlate.ComputeReport {
	w.mu.Lock()
	defer w.mu.Unlock()
	in := correlate.ComputeInput{PID: pid, KernelsProbed: w.kernels, End: w.compute.end, Dropped: w.compute.dropped}
	if p := w.compute.procs[pid]; p != nil {
		p.closeRuns()
		in.Copies, in.Acts = p.copies, p.acts
	}
	return correlate.ComputeOverlap(in)
}

// ComputePIDs lists the processes with copies or activities for the
// compute-overlap judgement.
func (w *Window) ComputePIDs() []uint32 {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []uint32
	for pid := range w.compute.procs {
		out = append(out, pid)
	}
	slices.Sort(out)
	return out
}

// ComputeDropped counts the copies and activities not kept at the cap.
func (w *Window) ComputeDropped() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.compute.dropped
}

// ComputeCheck is the checklist row of item 3 for one process's report.
func ComputeCheck(scope string, r correlate.ComputeReport) Check {
	c := Check{Scope: scope, Name: CheckComputeOverlap, Findings: r.Findings}
	var parts []string
	for _, s := range r.Streams {
		text := fmt.Sprintf("load stream %#x: %d copies over %d layers", s.Stream, s.Copies, s.Layers)
		switch {
		case r.Unknown != "":
		case s.Ratio() < 0:
			text += ", no completion proven: overlap unknown"
		default:
			text += fmt.Sprintf(", compute could overlap at most %.0f%% of its copy time", 100*s.Ratio())
		}
		parts = append(parts, text)
	}
	var waits []string
	for _, h := range r.Waits {
		waits = append(waits, fmt.Sprintf("tid %d %s x%d %.3f ms (%.3f ms while loads were in flight)", h.TID, h.API, h.Count,
			float64(h.Ns)/1e6, float64(h.LoadingNs)/1e6))
	}
	if len(waits) > 0 {
		parts = append(parts, "host waits: "+joinLimited(waits, 6))
	}
	if r.GraphLaunches > 0 {
		parts = append(parts, fmt.Sprintf("CUDA graph launches: %d, each counted as compute on its stream; the copies inside a graph have no call of their own and are not seen", r.GraphLaunches))
	}
	if r.Unknown != "" {
		parts = append(parts, r.Unknown)
	}
	c.Detail = strings.Join(parts, "; ")
	// A SKIP's detail is its reason alone: the same from window to window.
	switch {
	case len(r.Findings) > 0:
		c.Status = Warn
	case len(r.Streams) == 0 && r.GraphLaunches > 0:
		c.Status, c.Detail = Skip, "no H2D copy with a call of its own in the window: CUDA graphs were launched, the copies inside them are not seen"
	case len(r.Streams) == 0:
		c.Status, c.Detail = Skip, "no H2D copy in the window"
	case r.Unknown != "":
		c.Status, c.Detail = Skip, r.Unknown
	default:
		c.Status = Pass
	}
	return c
}
