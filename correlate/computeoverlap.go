package correlate

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/lanewatch/lanewatch/event"
)

// Compute overlap (docs/design.md, "Compute overlap"; seed 000 L2→L1 #3:
// do H2D and compute really overlap on different streams, and is there an
// accidental synchronize or .item()). The engine reports the calls that
// order GPU work without moving bytes — kernel launches, host waits, event
// records — as Activities; the window judges them with the copies.
//
// Kernel execution is not observed: a kernel launched on a stream may be
// in flight from its launch's entry until a host wait proves its stream's
// work done (a synchronisation of that stream, of an event recorded on it
// after the launch, or of the context); with no such proof in the window
// it may be in flight to the window's end. Copies likewise: from submission
// to the completion a synchronisation proved. The overlap measured is
// therefore an upper bound: a ratio near 0 proves the copies did not run
// beside compute; a high one says they could have.

// Activity is one successful call that orders GPU work without moving
// bytes. Stream is the handle the call named (as Transfer.Stream); for an
// event synchronisation it is the stream the event was last recorded on,
// and RecordNs when. A stream's wait for an event (OpStreamWaitEvent)
// names the waiting stream, and the event's record in RecordNs and
// RecordStream: a layer of a load consumed by compute.
type Activity struct {
	PID, TID         uint32
	Op               event.Op // OpLaunch, OpGraphLaunch, OpStreamSync, OpEventSync, OpCtxSync, OpEventRecord, OpStreamWaitEvent
	API              string   // the call the application made ("cudaStreamSynchronize")
	Stream           uint64
	GPU              string // the thread's current device (PCI address), "" unknown
	CallNs, ReturnNs uint64
	RecordNs         uint64 // OpEventSync, OpStreamWaitEvent: when the event waited for was recorded; 0 unknown
	RecordStream     uint64 // OpStreamWaitEvent: the stream that record named
	// KV: a launch of a KV-transfer kernel (a load moved by SMs, not
	// compute).
	KV bool
	// Launches > 1: a run of launches of one thread on one stream with no
	// wait or record of its process between them, merged (judge, compute.go):
	// CallNs the first's entry, ReturnNs the last's return. Its bound is
	// the last launch's, which is never earlier than the others'.
	Launches int
}

// ActivitySink receives the engine's activities, on its goroutine; the
// pointer is only valid during the call.
type ActivitySink interface {
	Activity(*Activity)
}

// note reports an activity of c: a (the stream and what only the caller
// knows) completed with the call's process, thread, API, GPU and times.
func (e *Engine) note(p *proc, c *event.Call, a Activity) {
	if e.cfg.Activity == nil {
		return
	}
	a.PID, a.TID, a.Op, a.CallNs, a.ReturnNs = c.PID, c.TID, c.Op, c.Time, c.ReturnTime
	a.API = c.Symbol
	if c.ViaRuntime && c.RuntimeAPI != "" {
		a.API = c.RuntimeAPI
	}
	a.GPU = e.pciOf(p, p.dev.current(c.TID))
	e.act = a // handed by pointer from the engine: a would escape, allocating per call
	e.cfg.Activity.Activity(&e.act)
}

// IsCompute reports whether the activity launched compute on its stream:
// a kernel launch (not a KV-transfer kernel's) or a CUDA graph launch,
// whose kernels have no call of their own (docs/design.md, "CUDA graphs").
func (a *Activity) IsCompute() bool {
	return a.Op == event.OpLaunch && !a.KV || a.Op == event.OpGraphLaunch
}

// IsWait reports whether the activity is a host wait.
func (a *Activity) IsWait() bool {
	return a.Op == event.OpStreamSync || a.Op == event.OpEventSync || a.Op == event.OpCtxSync
}

// waitNs is how long a host wait held its thread.
func (a *Activity) waitNs() uint64 {
	if a.ReturnNs > a.CallNs {
		return a.ReturnNs - a.CallNs
	}
	return 0
}

// CopySpan is what the compute-overlap rules need of one copy.
type CopySpan struct {
	TID                uint32
	Stream             uint64
	GPU                string
	API                string
	Direction          string
	Bytes              uint64
	SubmitNs, Complete uint64 // Complete 0: not proven
	CallNs             uint64
}

// BlockingCopy reports whether a copy API returns only once its bytes
// moved (the synchronous cudaMemcpy family, not an *Async form).
func BlockingCopy(api string) bool { return api != "" && !strings.Contains(api, "Async") }

// ElementRead reports whether a copy is the `.item()` shape: a blocking
// D2H read of one element (at most elementCopy bytes).
func (c *CopySpan) ElementRead() bool {
	return c.Direction == DirD2H && ElementSized(c.Bytes) && BlockingCopy(c.API)
}

// ElementSized reports whether a copy moves one element (at most
// elementCopy bytes: a scalar read or write), never a piece of a KV
// transfer.
func ElementSized(bytes uint64) bool { return bytes <= elementCopy }

// ComputeInput is one process's window for the compute-overlap rules.
type ComputeInput struct {
	PID    uint32
	Copies []CopySpan
	Acts   []Activity
	// KernelsProbed: launches are probed (agent --kernels). Without them
	// compute overlap is unknown, never "none".
	KernelsProbed bool
	End           uint64 // the window's last timestamp: the bound of a kernel whose end nothing proved
	// Dropped counts copies and activities the window did not keep (its
	// cap): with some missing, neither rule is judged — a missing launch
	// would lower the bound, a missing record the layers.
	Dropped uint64
}

// LoadStream is one stream's H2D copies in a window and how much of their
// busy time compute on other streams of its GPU may have overlapped.
type LoadStream struct {
	GPU               string
	Stream            uint64
	Copies, Unproven  int    // copies with and without a proven completion
	Layers            int    // event records on the stream (one per layer on a HiCache load stream)
	BusyNs, OverlapNs uint64 // OverlapNs: an upper bound
}

// Ratio is the share of the stream's copy time that compute may have
// overlapped, -1 unknown (no copy with a proven completion).
func (l LoadStream) Ratio() float64 {
	if l.BusyNs == 0 {
		return -1
	}
	return float64(l.OverlapNs) / float64(l.BusyNs)
}

// HostWait totals one thread's host waits through one API.
type HostWait struct {
	TID   uint32
	API   string
	Count int
	Ns    uint64
	// LoadingNs is the part of Ns while the window's H2D loads were in
	// flight (submission to proven completion): waits between layer loads.
	LoadingNs uint64
	Bytes     uint64 // element reads: the bytes they read
}

// ComputeReport is the compute-overlap judgement of one process's window.
type ComputeReport struct {
	PID      uint32
	Launches int // compute launches (KV-transfer kernels not counted), graph launches included
	// GraphLaunches: the CUDA graph launches among them. Each is compute on
	// its stream from its call to the wait that proves its stream done; the
	// copies inside a graph have no call of their own and are not seen.
	GraphLaunches int
	Streams       []LoadStream
	Waits         []HostWait
	// Unknown says why compute overlap is unknown ("" known): launches are
	// not probed, or none was seen.
	Unknown  string
	Findings []Finding
}

// Thresholds of the compute-overlap rules: a load stream is serialized
// when at most serialOverlapMax of its copy time could overlap compute
// while the host waited on it before compute, at least minLoopLayers
// times; a thread syncs in the loop when it blocked at least once per
// layer over at least minLoopLayers layers.
const (
	serialOverlapMax = 0.05
	minLoopLayers    = 3
)

// ComputeOverlap measures a process's window and judges serialized-load
// and host-sync-in-loop.
func ComputeOverlap(in ComputeInput) ComputeReport {
	r := ComputeReport{PID: in.PID}
	var launches, waits, marks []*Activity
	records := map[uint64]int{}
	for i := range in.Acts {
		a := &in.Acts[i]
		switch {
		case a.IsCompute():
			launches = append(launches, a)
		case a.IsWait():
			waits = append(waits, a)
		case a.Op == event.OpEventRecord:
			records[a.Stream]++
			marks = append(marks, a)
		case a.Op == event.OpStreamWaitEvent:
			marks = append(marks, a)
		}
	}
	for _, l := range launches {
		r.Launches += max(l.Launches, 1)
		if l.Op == event.OpGraphLaunch {
			r.GraphLaunches += max(l.Launches, 1)
		}
	}
	switch {
	case in.Dropped > 0:
		r.Unknown = fmt.Sprintf("%d copies, launches or waits past the window's cap were not kept: compute overlap not judged", in.Dropped)
	case !in.KernelsProbed:
		r.Unknown = "kernel launches are not probed (agent run --kernels): compute overlap unknown"
	case len(launches) == 0:
		r.Unknown = "no compute kernel launched in the window: compute overlap unknown"
	}
	kernels := kernelSpans(launches, waits, in.End)
	r.Streams = loadStreams(in.Copies, kernels, records)
	serialWaits := map[*Activity]bool{}
	if r.Unknown == "" {
		after := launchesAfter(launches)
		for _, s := range r.Streams {
			if f, used := serializedLoad(in.PID, s, waits, after); f != nil {
				r.Findings = append(r.Findings, *f)
				for _, w := range used {
					serialWaits[w] = true
				}
			}
		}
	}
	r.Waits = hostWaits(in.Copies, waits, loading(in.Copies))
	if in.Dropped == 0 {
		r.Findings = append(r.Findings, hostSyncInLoop(in, loadEpisodes(in.Copies, marks), waits, launches, serialWaits)...)
	}
	return r
}

// Interval is [Lo, Hi) in ns (CLOCK_MONOTONIC here; the request summaries' Unix ns).
type Interval struct{ Lo, Hi uint64 }

// CoveredNs is how much of [lo, hi) the union of spans covers.
func CoveredNs(spans []Interval, lo, hi uint64) uint64 {
	return measure(intersect(union(spans), []Interval{{lo, hi}}))
}

// kernelKey is a stream of a GPU.
type kernelKey struct {
	gpu    string
	stream uint64
}

// proof is a host wait that proved a stream's work submitted before `after`
// done by `at`.
type proof struct{ after, at uint64 }

// kernelSpans bounds each compute launch's execution: from its entry to the
// earliest proof of its stream's work done (docs/design.md, "Compute
// overlap"), else to end.
func kernelSpans(launches, waits []*Activity, end uint64) map[kernelKey][]Interval {
	proofs := map[kernelKey][]proof{}
	var ctx []*Activity
	for _, w := range waits {
		switch w.Op {
		case event.OpStreamSync:
			k := kernelKey{w.GPU, w.Stream}
			proofs[k] = append(proofs[k], proof{w.CallNs, w.ReturnNs})
		case event.OpEventSync:
			if w.RecordNs != 0 {
				k := kernelKey{w.GPU, w.Stream}
				proofs[k] = append(proofs[k], proof{w.RecordNs, w.ReturnNs})
			}
		case event.OpCtxSync:
			ctx = append(ctx, w)
		}
	}
	out := map[kernelKey][]Interval{}
	enq := map[kernelKey][]uint64{} // each launch's return: work queued by then
	for _, l := range launches {
		k := kernelKey{l.GPU, l.Stream}
		if _, ok := proofs[k]; !ok {
			proofs[k] = nil
		}
		out[k] = append(out[k], Interval{l.CallNs, 0})
		enq[k] = append(enq[k], max(l.ReturnNs, l.CallNs))
	}
	for k, ps := range proofs {
		for _, w := range ctx {
			if w.GPU == k.gpu {
				ps = append(ps, proof{w.CallNs, w.ReturnNs})
			}
		}
		slices.SortFunc(ps, func(a, b proof) int { return cmp.Compare(a.after, b.after) })
		// soonest[i]: the earliest completion any proof from i on gives.
		soonest := make([]uint64, len(ps)+1)
		soonest[len(ps)] = end
		for i := len(ps) - 1; i >= 0; i-- {
			soonest[i] = min(soonest[i+1], ps[i].at)
		}
		spans := out[k]
		for i := range spans {
			// the first proof whose wait began after the launch returned
			j, _ := slices.BinarySearchFunc(ps, enq[k][i]+1, func(p proof, t uint64) int { return cmp.Compare(p.after, t) })
			spans[i].Hi = max(soonest[j], spans[i].Lo)
		}
	}
	return out
}

// loadStreams measures each stream that carried H2D copies: its busy time
// and the part of it compute on the GPU's other streams may have overlapped.
func loadStreams(copies []CopySpan, kernels map[kernelKey][]Interval, records map[uint64]int) []LoadStream {
	busy := map[kernelKey][]Interval{}
	var out []LoadStream
	idx := map[kernelKey]int{}
	for _, c := range copies {
		if c.Direction != DirH2D {
			continue
		}
		k := kernelKey{c.GPU, c.Stream}
		i, ok := idx[k]
		if !ok {
			i = len(out)
			idx[k] = i
			out = append(out, LoadStream{GPU: c.GPU, Stream: c.Stream, Layers: records[c.Stream]})
		}
		if c.Complete <= c.SubmitNs {
			out[i].Unproven++
			continue
		}
		out[i].Copies++
		busy[k] = append(busy[k], Interval{c.SubmitNs, c.Complete})
	}
	for i := range out {
		k := kernelKey{out[i].GPU, out[i].Stream}
		b := union(busy[k])
		var compute []Interval
		for kk, ss := range kernels {
			if kk.gpu == k.gpu && kk.stream != k.stream {
				compute = append(compute, ss...)
			}
		}
		out[i].BusyNs = measure(b)
		out[i].OverlapNs = measure(intersect(b, union(compute)))
	}
	slices.SortFunc(out, func(a, b LoadStream) int {
		return cmp.Or(cmp.Compare(a.GPU, b.GPU), cmp.Compare(a.Stream, b.Stream))
	})
	return out
}

// union merges spans into sorted disjoint ones.
func union(ss []Interval) []Interval {
	ss = slices.Clone(ss)
	slices.SortFunc(ss, func(a, b Interval) int { return cmp.Compare(a.Lo, b.Lo) })
	var out []Interval
	for _, s := range ss {
		if s.Hi <= s.Lo {
			continue
		}
		if n := len(out); n > 0 && s.Lo <= out[n-1].Hi {
			out[n-1].Hi = max(out[n-1].Hi, s.Hi)
			continue
		}
		out = append(out, s)
	}
	return out
}

// intersect is the intersection of two sorted disjoint Interval lists.
func intersect(a, b []Interval) []Interval {
	var out []Interval
	for i, j := 0, 0; i < len(a) && j < len(b); {
		lo, hi := max(a[i].Lo, b[j].Lo), min(a[i].Hi, b[j].Hi)
		if lo < hi {
			out = append(out, Interval{lo, hi})
		}
		if a[i].Hi < b[j].Hi {
			i++
		} else {
			j++
		}
	}
	return out
}

func measure(ss []Interval) uint64 {
	var n uint64
	for _, s := range ss {
		n += s.Hi - s.Lo
	}
	return n
}

// waitsOn reports whether a host wait covers a stream of a GPU: a
// synchronisation of it, of an event recorded on it, or of the GPU's
// context.
func waitsOn(w *Activity, gpu string, stream uint64) bool {
	if w.Op == event.OpCtxSync {
		return w.GPU == gpu
	}
	if w.Op == event.OpEventSync && w.RecordNs == 0 {
		return false // the event's stream is unknown
	}
	return w.Stream == stream && w.GPU == gpu
}

// compute overlap (computeoverlap.go)
var _ = register(Rule{Name: "serialized-load", Severities: []Severity{SevWarn}, Checklist: ChecklistComputeOverlap, Where: InWindow | InDiagnose,
	Remediation: "wait on the GPU, not the host: record an event on the load stream after each layer and make the compute stream wait for it (cudaStreamWaitEvent); never synchronize the load stream inside the layer loop"})

// serializedLoad judges one load stream: its copies (almost) never could
// overlap compute, and the host waited on it before launching compute on
// another stream, layer after layer. used are those waits.
func serializedLoad(pid uint32, s LoadStream, waits []*Activity, after computeAfter) (*Finding, []*Activity) {
	ratio := s.Ratio()
	if ratio < 0 || ratio > serialOverlapMax || s.Layers < minLoopLayers {
		return nil, nil
	}
	var used []*Activity
	apis := map[string]int{}
	var waited uint64
	for _, w := range waits {
		if !waitsOn(w, s.GPU, s.Stream) || !after(w, s) {
			continue
		}
		used = append(used, w)
		apis[w.API]++
		waited += w.waitNs()
	}
	if len(used) < minLoopLayers {
		return nil, nil
	}
	f := newFinding("serialized-load", SevWarn, fmt.Sprintf("pid %d stream %#x%s", pid, s.Stream, gpuText(s.GPU)),
		fmt.Sprintf("the load stream's copies could overlap compute for at most %.1f%% of their time: the host waited for the loads before launching compute %d times",
			100*ratio, len(used)),
		[]string{
			fmt.Sprintf("%d layers (event records on the stream), %d copies with a proven completion, %d without", s.Layers, s.Copies, s.Unproven),
			fmt.Sprintf("copy time %s, of which compute on other streams could overlap at most %s (%.1f%%; kernels bounded from launch to the completion a wait proved)",
				msText(s.BusyNs), msText(s.OverlapNs), 100*ratio),
			"waits before compute: " + countsText(apis),
			"host wait time " + msText(waited),
		}, "")
	return f, used
}

// computeAfter reports whether the waiting thread launched compute on
// another stream of the load stream's GPU after the wait returned.
type computeAfter func(w *Activity, s LoadStream) bool

// launchesAfter indexes the launches by thread and GPU, in time order.
func launchesAfter(launches []*Activity) computeAfter {
	type key struct {
		tid uint32
		gpu string
	}
	by := map[key][]*Activity{}
	for _, l := range launches {
		k := key{l.TID, l.GPU}
		by[k] = append(by[k], l)
	}
	for _, ls := range by {
		slices.SortFunc(ls, func(a, b *Activity) int { return cmp.Compare(a.CallNs, b.CallNs) })
	}
	return func(w *Activity, s LoadStream) bool {
		ls := by[key{w.TID, s.GPU}]
		i, _ := slices.BinarySearchFunc(ls, w.ReturnNs, func(l *Activity, t uint64) int { return cmp.Compare(l.CallNs, t) })
		for _, l := range ls[i:] {
			if l.Stream != s.Stream {
				return true
			}
		}
		return false
	}
}

// loading is when the window's H2D copies were in flight.
func loading(copies []CopySpan) []Interval {
	var ss []Interval
	for _, c := range copies {
		if c.Direction == DirH2D && c.Complete > c.SubmitNs {
			ss = append(ss, Interval{c.SubmitNs, c.Complete})
		}
	}
	return union(ss)
}

// hostWaits totals the window's host waits per thread and API: the
// synchronisations and the element reads (`.item()`), and how much of
// them fell while loads were in flight.
func hostWaits(copies []CopySpan, waits []*Activity, loads []Interval) []HostWait {
	type key struct {
		tid uint32
		api string
	}
	m := map[key]*HostWait{}
	add := func(tid uint32, api string, from, ns, bytes uint64) {
		k := key{tid, api}
		if m[k] == nil {
			m[k] = &HostWait{TID: tid, API: api}
		}
		m[k].Count++
		m[k].Ns += ns
		m[k].LoadingNs += measure(intersect([]Interval{{from, from + ns}}, loads))
		m[k].Bytes += bytes
	}
	for _, w := range waits {
		add(w.TID, w.API, w.CallNs, w.waitNs(), 0)
	}
	for i := range copies {
		if c := &copies[i]; c.ElementRead() {
			add(c.TID, c.API, c.SubmitNs, c.CallNs, c.Bytes)
		}
	}
	out := make([]HostWait, 0, len(m))
	for _, k := range slices.SortedFunc(maps.Keys(m), func(a, b key) int { return cmp.Or(cmp.Compare(a.tid, b.tid), cmp.Compare(a.api, b.api)) }) {
		out = append(out, *m[k])
	}
	return out
}

// loadEpisode is one layered load, host-sync-in-loop's unit: a stream's
// H2D copies in flight together (each submitted before every earlier one
// of the stream was proven done) and the event records among them, its
// layers. It lasts from its first copy's submission until the later of its
// copies' proven completion and compute's last wait for one of its events
// (cudaStreamWaitEvent: the forward consuming its layers). A copy without
// a proven completion ends at its call's return: what follows it is not
// known to be part of the load.
type loadEpisode struct {
	stream   uint64
	from, to uint64
	layers   int
}

// loadEpisodes finds the window's layered loads from its H2D copies and
// its event records and stream waits (marks), in time order.
func loadEpisodes(copies []CopySpan, marks []*Activity) []loadEpisode {
	byStream := map[uint64][]*CopySpan{}
	for i := range copies {
		if c := &copies[i]; c.Direction == DirH2D {
			byStream[c.Stream] = append(byStream[c.Stream], c)
		}
	}
	var out []loadEpisode
	for _, stream := range slices.Sorted(maps.Keys(byStream)) {
		cs := byStream[stream]
		slices.SortFunc(cs, func(a, b *CopySpan) int { return cmp.Compare(a.SubmitNs, b.SubmitNs) })
		first := len(out)
		for _, c := range cs {
			end := c.Complete
			if end <= c.SubmitNs {
				end = c.SubmitNs + c.CallNs
			}
			if n := len(out); n > first && c.SubmitNs < out[n-1].to {
				out[n-1].to = max(out[n-1].to, end)
				continue
			}
			out = append(out, loadEpisode{stream: stream, from: c.SubmitNs, to: end})
		}
		for i := first; i < len(out); i++ {
			ep := &out[i]
			copiesDone := ep.to
			for _, m := range marks {
				switch {
				case m.Op == event.OpEventRecord && m.Stream == stream && m.CallNs >= ep.from && m.CallNs <= copiesDone:
					ep.layers++
				case m.Op == event.OpStreamWaitEvent && m.RecordStream == stream && m.RecordNs >= ep.from && m.RecordNs <= copiesDone:
					ep.to = max(ep.to, m.CallNs)
				}
			}
		}
	}
	slices.SortFunc(out, func(a, b loadEpisode) int { return cmp.Compare(a.from, b.from) })
	return out
}

var _ = register(Rule{Name: "host-sync-in-loop", Severities: []Severity{SevWarn}, Checklist: ChecklistComputeOverlap, Where: InWindow | InDiagnose,
	Remediation: "take the synchronize or the .item() out of the per-layer loop: read scalars once per step, keep them on the GPU, or copy them asynchronously into pinned memory and wait on an event later"})

// hostSyncInLoop judges each thread: a blocking wait or an element read at
// least once per layer while one layered load was under way (loadEpisode),
// over at least minLoopLayers layers, that no serialized-load finding
// already explains. Waits are counted per load, never over the window: a
// decode loop's one synchronisation per step, with a load every few steps,
// is not a wait per layer. A thread that launched no compute is not on the
// loop's path when launches are probed.
func hostSyncInLoop(in ComputeInput, episodes []loadEpisode, waits, launches []*Activity, explained map[*Activity]bool) []Finding {
	type blocking struct {
		at, ns uint64
		api    string
		bytes  uint64
	}
	byTID := map[uint32][]blocking{}
	for _, w := range waits {
		if !explained[w] {
			byTID[w.TID] = append(byTID[w.TID], blocking{w.CallNs, w.waitNs(), w.API, 0})
		}
	}
	for i := range in.Copies {
		if c := &in.Copies[i]; c.ElementRead() {
			byTID[c.TID] = append(byTID[c.TID], blocking{c.SubmitNs, c.CallNs, c.API, c.Bytes})
		}
	}
	launched := map[uint32]bool{}
	for _, l := range launches {
		launched[l.TID] = true
	}
	var out []Finding
	for _, tid := range slices.Sorted(maps.Keys(byTID)) {
		if in.KernelsProbed && len(launches) > 0 && !launched[tid] {
			continue
		}
		var worst *loadEpisode
		var worstIn []blocking
		judged, hit := 0, 0
		for i := range episodes {
			ep := &episodes[i]
			if ep.layers < minLoopLayers {
				continue
			}
			judged++
			var inside []blocking
			for _, b := range byTID[tid] {
				if b.at >= ep.from && b.at < ep.to {
					inside = append(inside, b)
				}
			}
			if len(inside) < ep.layers {
				continue
			}
			hit++
			if worst == nil || len(inside)*worst.layers > len(worstIn)*ep.layers {
				worst, worstIn = ep, inside
			}
		}
		if worst == nil {
			continue
		}
		apis := map[string]int{}
		var ns, bytes uint64
		for _, b := range worstIn {
			apis[b.api]++
			ns += b.ns
			bytes += b.bytes
		}
		n := len(worstIn)
		ev := []string{
			fmt.Sprintf("%d blocking calls while one load of %d layers on stream %#x was under way (%.1f per layer): %s", n, worst.layers,
				worst.stream, float64(n)/float64(worst.layers), countsText(apis)),
			fmt.Sprintf("%d of the window's %d layered loads had a wait per layer", hit, judged),
			"host wait time in that load " + msText(ns),
		}
		if bytes > 0 {
			ev = append(ev, fmt.Sprintf("element reads (.item() shape) of %d bytes in all", bytes))
		}
		out = append(out, *newFinding("host-sync-in-loop", SevWarn, fmt.Sprintf("pid %d tid %d", in.PID, tid),
			fmt.Sprintf("the thread blocked on the GPU %d times over one load's %d layers: a synchronisation on the critical path every layer", n, worst.layers),
			ev, ""))
	}
	return out
}

func gpuText(gpu string) string {
	if gpu == "" {
		return ""
	}
	return " on GPU " + gpu
}

func countsText(m map[string]int) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s x%d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

func msText(ns uint64) string {
	return fmt.Sprintf("%.3f ms", float64(ns)/1e6)
}
