package judge

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/lanewatch/lanewatch/checks"
	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/exporters"
	"github.com/prometheus/client_golang/prometheus"
)

// Compute overlap (docs/design.md, "Compute overlap"): the engine's
// launches, host waits and event records reach the window beside the
// transfers; each window judges every process's load streams against its
// compute (serialized-load, host-sync-in-loop; checks.ComputeCheck).

var _ = register(computeRule{})

type computeRule struct{}

func (computeRule) Check() string    { return checks.CheckComputeOverlap }
func (computeRule) Raises() []string { return []string{"serialized-load", "host-sync-in-loop"} }
func (computeRule) Unsampled() string {
	return "needs a live window (--sample): copies, launches and host waits are judged by when they ran"
}

func (computeRule) NewFacts() Facts { return &computeFacts{} }

func (r computeRule) Judge(w *Window, env *Env) (j Judgement) {
	facts := factsOf[*computeFacts](w, r)
	var reports []correlate.ComputeReport
	for _, pid := range env.pids(slices.Sorted(maps.Keys(facts.procs))) {
		r := Compute(w, pid)
		j.Checks = append(j.Checks, computeCheck(env.scope(pid), r))
		reports = append(reports, r)
	}
	j.Series = computeSeries(reports)
	return j
}

// Compute judges one process's compute overlap in a closed window
// (correlate.ComputeOverlap).
func Compute(w *Window, pid uint32) correlate.ComputeReport {
	c := factsOf[*computeFacts](w, computeRule{})
	in := correlate.ComputeInput{PID: pid, KernelsProbed: w.kernels, End: c.end, Dropped: c.dropped}
	if p := c.procs[pid]; p != nil {
		p.closeRuns()
		in.Copies, in.Acts = c.spans(p.copies), p.acts
	}
	return correlate.ComputeOverlap(in)
}

// maxComputeItems bounds the copies and activities a window keeps for the
// compute-overlap judgement (56 to about 200 bytes each); past it they are
// counted, not kept, and the window's compute overlap is not judged.
const maxComputeItems = 1 << 17

// computeFacts are what the compute-overlap rules gather of a window: the
// H2D copies and element reads, and the engine's activities, per process.
type computeFacts struct {
	procs   map[uint32]*computeProc
	kept    int
	dropped uint64
	end     uint64 // the latest timestamp seen
	// names are the GPUs, APIs and directions of the copies kept, each
	// once: a kept copy names them by index, so the window's copies hold
	// no pointer for the collector to trace.
	names   []string
	nameIdx map[string]uint16
	// sizes are the copies the previous window kept per process (sizer).
	sizes map[uint32]int
	last  [3]struct { // the latest copy's GPU, API and direction: copies come in runs
		name string
		idx  uint16
		ok   bool
	}
}

// keptCopy is a correlate.CopySpan as a window keeps it.
type keptCopy struct {
	tid                uint32
	gpu, api, dir      uint16
	stream, bytes      uint64
	submitNs, complete uint64
	callNs             uint64
}

func (c *computeFacts) sizeFrom(prev Facts) {
	p := prev.(*computeFacts)
	c.sizes = make(map[uint32]int, len(p.procs))
	for pid, pp := range p.procs {
		c.sizes[pid] = len(pp.copies)
	}
}

// name is s's index in c.names, s being a copy's GPU, API or direction
// (field 0, 1, 2): bounded sets, far fewer than 1<<16 together.
func (c *computeFacts) name(field int, s string) uint16 {
	l := &c.last[field]
	if l.ok && l.name == s {
		return l.idx
	}
	i, ok := c.nameIdx[s]
	if !ok {
		i = c.add(s)
	}
	l.name, l.idx, l.ok = s, i, true
	return i
}

func (c *computeFacts) add(s string) uint16 {
	if c.nameIdx == nil {
		c.nameIdx = map[string]uint16{}
	}
	i := uint16(len(c.names))
	c.names = append(c.names, s)
	c.nameIdx[s] = i
	return i
}

// spans are the kept copies as the judgement reads them.
func (c *computeFacts) spans(kept []keptCopy) []correlate.CopySpan {
	out := make([]correlate.CopySpan, len(kept))
	for i, k := range kept {
		out[i] = correlate.CopySpan{TID: k.tid, Stream: k.stream, GPU: c.names[k.gpu], API: c.names[k.api], Direction: c.names[k.dir],
			Bytes: k.bytes, SubmitNs: k.submitNs, Complete: k.complete, CallNs: k.callNs}
	}
	return out
}

type computeProc struct {
	copies []keptCopy
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
func (c *computeFacts) launch(a *correlate.Activity) {
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

func (c *computeFacts) proc(pid uint32) *computeProc {
	if c.procs == nil {
		c.procs = map[uint32]*computeProc{}
	}
	p := c.procs[pid]
	if p == nil {
		p = &computeProc{}
		if n := c.sizes[pid]; n > 0 {
			p.copies = make([]keptCopy, 0, n)
		}
		c.procs[pid] = p
	}
	return p
}

// room reports whether one more item may be kept.
func (c *computeFacts) room() bool {
	if c.kept >= maxComputeItems {
		c.dropped++
		return false
	}
	c.kept++
	return true
}

// Transfer keeps what the rules take of a transfer: H2D copies on their
// streams and the `.item()` shape.
func (c *computeFacts) Transfer(t *correlate.Transfer) {
	if t.Mover != correlate.MoverCopyEngine {
		return
	}
	if t.Direction != correlate.DirH2D {
		s := correlate.CopySpan{API: t.API, Direction: t.Direction, Bytes: t.Bytes}
		if !s.ElementRead() {
			return
		}
	}
	c.end = max(c.end, t.SubmitNs+t.CallNs, t.CompleteNs)
	if c.room() {
		p := c.proc(t.PID)
		p.copies = append(p.copies, keptCopy{tid: t.TID, gpu: c.name(0, t.GPU), api: c.name(1, t.API), dir: c.name(2, t.Direction),
			stream: t.Stream, bytes: t.Bytes, submitNs: t.SubmitNs, complete: t.CompleteNs, callNs: t.CallNs})
	}
}

// Activity keeps a launch, graph launch, host wait or event record of the
// engine.
func (c *computeFacts) Activity(a *correlate.Activity) {
	switch a.Op {
	case event.OpLaunch, event.OpGraphLaunch, event.OpEventRecord, event.OpStreamSync, event.OpEventSync, event.OpCtxSync, event.OpStreamWaitEvent:
	default:
		return
	}
	if a.Op == event.OpLaunch && a.KV {
		return // a load moved by SMs: not compute
	}
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

// computeCheck is the checklist row of item 3 for one process's report.
func computeCheck(scope string, r correlate.ComputeReport) checks.Check {
	c := checks.Check{Scope: scope, Name: checks.CheckComputeOverlap, Findings: r.Findings}
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
		parts = append(parts, "host waits: "+checks.JoinLimited(waits, 6))
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
		c.Status = checks.Warn
	case len(r.Streams) == 0 && r.GraphLaunches > 0:
		c.Status, c.Detail = checks.Skip, "no H2D copy with a call of its own in the window: CUDA graphs were launched, the copies inside them are not seen"
	case len(r.Streams) == 0:
		c.Status, c.Detail = checks.Skip, "no H2D copy in the window"
	case r.Unknown != "":
		c.Status, c.Detail = checks.Skip, r.Unknown
	default:
		c.Status = checks.Pass
	}
	return c
}

var (
	descComputeOverlap = exporters.NewDesc("lanewatch_copy_compute_overlap_ratio",
		"Share of the H2D load streams' copy time during the last window that kernels on the GPU's other streams could have overlapped: an upper bound (kernels are bounded from launch to the completion a host wait proved), so near 0 proves the loads ran beside no compute. Absent when unknown (kernel launches not probed, no launch or no completed load in the window).",
		prometheus.GaugeValue, "gpu")
	descHostWait = exporters.NewDesc("lanewatch_host_wait_seconds_total",
		"Time host threads spent blocked in GPU waits, by API: stream, event and device synchronisations and element reads (blocking D2H copies of at most 32 bytes, the .item() shape).",
		prometheus.CounterValue, "api")
	descHostWaits = exporters.NewDesc("lanewatch_host_waits_total",
		"GPU waits host threads made, by API (see lanewatch_host_wait_seconds_total).",
		prometheus.CounterValue, "api")
)

func (computeRule) Descs() []exporters.Desc {
	return []exporters.Desc{descComputeOverlap, descHostWait, descHostWaits}
}

// computeSeries is each GPU's load streams' overlap ratio (those whose
// overlap is known) and the window's host waits per API.
func computeSeries(reports []correlate.ComputeReport) []exporters.Sample {
	type load struct{ busy, overlap uint64 }
	type wait struct {
		count uint64
		ns    uint64
	}
	gpus := map[string]*load{}
	waits := map[string]*wait{}
	for _, r := range reports {
		for _, s := range r.Streams {
			if r.Unknown != "" || s.BusyNs == 0 {
				continue
			}
			gpu := s.GPU
			if gpu == "" {
				gpu = "unknown"
			}
			if gpus[gpu] == nil {
				gpus[gpu] = &load{}
			}
			gpus[gpu].busy += s.BusyNs
			gpus[gpu].overlap += s.OverlapNs
		}
		for _, h := range r.Waits {
			if waits[h.API] == nil {
				waits[h.API] = &wait{}
			}
			waits[h.API].count += uint64(h.Count)
			waits[h.API].ns += h.Ns
		}
	}
	var out []exporters.Sample
	for _, gpu := range slices.Sorted(maps.Keys(gpus)) {
		g := gpus[gpu]
		out = append(out, exporters.Sample{Desc: descComputeOverlap, Value: float64(g.overlap) / float64(g.busy), Labels: []string{gpu}})
	}
	for _, api := range slices.Sorted(maps.Keys(waits)) {
		w := waits[api]
		out = append(out, exporters.Sample{Desc: descHostWait, Value: float64(w.ns) / 1e9, Labels: []string{api}},
			exporters.Sample{Desc: descHostWaits, Value: float64(w.count), Labels: []string{api}})
	}
	return out
}
