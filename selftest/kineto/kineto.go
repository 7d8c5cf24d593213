// Package kineto reads PyTorch profiler (Kineto) traces, .json or .json.gz,
// into the CUDA call stream each host thread made: its runtime calls in
// order with their start times, joined by correlation id to the GPU work
// CUPTI recorded for them (a copy's bytes, direction and host memory, a
// kernel's or graph's GPU time, the stream), and the synchronisation CUPTI
// saw (cuda_sync: which stream a wait or sync was on, which record an event
// wait waited for). The selftest replays the stream through the reference
// runtime (refpath/kvpath/replay.c, Script).
//
// Both of Kineto's category spellings are read: the current one
// (cuda_runtime, kernel, gpu_memcpy, gpu_memset, cuda_sync) and the one of
// 2021 (Runtime, Kernel, Memcpy, Memset).
package kineto

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Op is what a replayed call does.
type Op uint8

const (
	OpCopy Op = iota + 1
	OpKernel
	OpGraph // cudaGraphLaunch / cuGraphLaunch
	OpMemset
	OpEventRecord
	OpEventQuery
	OpEventSync
	OpStreamWait
	OpStreamSync
	OpDeviceSync
)

var opNames = [...]string{
	OpCopy: "copy", OpKernel: "kernel", OpGraph: "graph", OpMemset: "memset", OpEventRecord: "event_record",
	OpEventQuery: "event_query", OpEventSync: "event_sync", OpStreamWait: "stream_wait", OpStreamSync: "stream_sync",
	OpDeviceSync: "device_sync",
}

// String is the op's name, as the replay script writes it (event_query).
func (o Op) String() string {
	if int(o) < len(opNames) && opNames[o] != "" {
		return opNames[o]
	}
	return "unknown"
}

// NoStream is a stream the trace does not say.
const NoStream int64 = -1

// Copy is one copy CUPTI recorded.
type Copy struct {
	Bytes uint64
	Dir   string // H2D, D2H, D2D, H2H
	// Host is the host side's memory as CUPTI named it: pinned, pageable,
	// device (D2D), unknown (anything else CUPTI said, or nothing).
	Host  string
	GPUNs int64 // how long the copy ran on the GPU
}

// Key is the copy's direction/host memory, as the replay table names it.
func (c Copy) Key() string { return c.Dir + "/" + c.Host }

// Call is one CUDA runtime or driver call of a host thread.
type Call struct {
	Op          Op
	API         string
	StartNs     int64 // since the trace's first replayed call (every thread)
	DurNs       int64 // on the host
	Correlation int64
	// Stream is the CUPTI stream of its GPU work, or the stream it waited
	// on or synchronised (stream_wait: the waiting stream), NoStream where
	// the trace does not say.
	Stream int64
	// Event is the CUPTI event id a record, wait, query or sync names, -1
	// where the trace does not say; RecordCorr the correlation of the record
	// a wait or sync waited for, -1 unknown.
	Event, RecordCorr int64
	// RecordStream is the stream that record was made on, NoStream unknown.
	RecordStream int64
	GPUNs        int64 // kernel, graph, memset: GPU time (a graph: its span on the stream)
	Copy         *Copy // OpCopy
	MemsetBytes  uint64
	// GraphCopies are the copies CUPTI ran inside this graph launch: no
	// call of their own.
	GraphCopies []Copy
}

// Thread is one host thread's calls, in call order.
type Thread struct {
	ID    string // the trace's pid/tid
	Calls []Call
}

// Trace is a parsed trace.
type Trace struct {
	Name    string
	Threads []Thread
	Streams []int64 // every CUPTI stream with GPU work or a sync, ascending
	// Copies are the copies that have a call in the trace; InGraphs those
	// CUPTI ran inside graph launches; NoCall those whose call is not in the
	// trace (it began before the trace's host window).
	Copies, InGraphs, NoCall []Copy
	// Skipped counts the runtime calls not replayed, by API (attribute
	// queries, allocations, capture checks...), and the replayable ones
	// whose GPU record is missing ("cudaMemcpyAsync without a GPU record").
	Skipped map[string]int
}

type num struct {
	v  int64
	ok bool
}

// UnmarshalJSON takes a number, or a string holding one (old traces wrote
// tids and streams as strings, "stream 7"); any other string is a name,
// left unset.
func (n *num) UnmarshalJSON(b []byte) error {
	s := string(bytes.TrimSpace(b))
	if s == "null" {
		return nil
	}
	quoted := strings.HasPrefix(s, `"`)
	if quoted {
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		s = strings.TrimPrefix(s, "stream ")
	}
	if v, err := strconv.ParseInt(s, 10, 64); err == nil {
		n.v, n.ok = v, true
		return nil
	}
	if quoted {
		return nil
	}
	if f, err := strconv.ParseFloat(s, 64); err == nil && f >= math.MinInt64 && f <= math.MaxInt64 {
		n.v, n.ok = int64(f), true
		return nil
	}
	return fmt.Errorf("not a number: %.40s", s)
}

// usNs is a time in microseconds (Kineto's unit, fractions allowed) read
// exactly as nanoseconds.
type usNs struct {
	ns int64
	ok bool
}

func (t *usNs) UnmarshalJSON(b []byte) error {
	s := strings.Trim(string(bytes.TrimSpace(b)), `"`)
	if s == "null" {
		return nil
	}
	whole, frac, _ := strings.Cut(s, ".")
	us, err := strconv.ParseInt(whole, 10, 64)
	if err != nil || us < 0 || us > 1<<52 {
		return fmt.Errorf("not a time in µs: %.40s", s)
	}
	frac = (frac + "000")[:3]
	ns, err := strconv.ParseInt(frac, 10, 64)
	if err != nil {
		return fmt.Errorf("not a time in µs: %.40s", s)
	}
	t.ns, t.ok = us*1000+ns, true
	return nil
}

type rawEvent struct {
	Ph   string `json:"ph"`
	Cat  string `json:"cat"`
	Name string `json:"name"`
	PID  json.RawMessage
	TID  json.RawMessage
	Ts   usNs `json:"ts"`
	Dur  usNs `json:"dur"`
	Args struct {
		Correlation num    `json:"correlation"`
		Stream      num    `json:"stream"`
		Bytes       num    `json:"bytes"`
		SyncKind    string `json:"cuda_sync_kind"`
		WaitStream  num    `json:"wait_on_stream"`
		WaitRecord  num    `json:"wait_on_cuda_event_record_corr_id"`
		WaitEvent   num    `json:"wait_on_cuda_event_id"`
	} `json:"args"`
}

// MaxEvents and MaxBytes bound what one trace may hold (a day-long trace
// is not a replay).
const (
	MaxEvents = 4 << 20
	MaxBytes  = 1 << 30
)

// ReadFile reads a trace, gunzipping a .gz one; errors name the file.
func ReadFile(path string) (*Trace, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var r io.Reader = f
	if strings.HasSuffix(path, ".gz") {
		gz, err := gzip.NewReader(f)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		defer gz.Close()
		r = gz
	}
	data, err := io.ReadAll(io.LimitReader(r, MaxBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(data) > MaxBytes {
		return nil, fmt.Errorf("%s: more than %d bytes of JSON, more than a replay takes", path, MaxBytes)
	}
	return Parse(data, filepath.Base(path))
}

// Parse reads a trace's JSON; name is what errors and the replay call it.
func Parse(data []byte, name string) (*Trace, error) {
	var doc struct {
		TraceEvents []json.RawMessage `json:"traceEvents"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("%s: %s", name, jsonErr(data, err))
	}
	if doc.TraceEvents == nil {
		return nil, fmt.Errorf("%s: no traceEvents: not a Kineto trace", name)
	}
	if len(doc.TraceEvents) > MaxEvents {
		return nil, fmt.Errorf("%s: %d events, more than the %d a replay takes", name, len(doc.TraceEvents), MaxEvents)
	}
	b := builder{name: name, rt: map[int64]int{}, gpu: map[int64][]int{}, sync: map[int64]int{}}
	for i, raw := range doc.TraceEvents {
		var e rawEvent
		if err := json.Unmarshal(raw, &e); err != nil {
			return nil, fmt.Errorf("%s: traceEvents[%d]: %s", name, i, jsonErr(raw, err))
		}
		if err := b.add(i, &e); err != nil {
			return nil, fmt.Errorf("%s: traceEvents[%d] (%s %q): %w", name, i, e.Cat, e.Name, err)
		}
	}
	return b.build()
}

// jsonErr says where in data a decoding error is.
func jsonErr(data []byte, err error) string {
	var off int64 = -1
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		off = se.Offset
	case errors.As(err, &te):
		off = te.Offset
	}
	if off < 0 {
		return err.Error()
	}
	line := 1 + bytes.Count(data[:min(int(off), len(data))], []byte("\n"))
	return fmt.Sprintf("line %d (byte %d): %v", line, off, err)
}

type gpuEvent struct {
	kind   string // kernel, memcpy, memset
	corr   int64
	stream int64
	start  int64
	dur    int64
	copy   Copy
	bytes  uint64
}

type rtEvent struct {
	thread string
	api    string
	corr   int64
	start  int64
	dur    int64
}

type syncEvent struct {
	kind       string
	stream     int64
	waitStream int64
	waitRecord int64
	waitEvent  int64
}

type builder struct {
	name  string
	rts   []rtEvent
	gpus  []gpuEvent
	rt    map[int64]int   // correlation → rts index
	gpu   map[int64][]int // correlation → gpus indices
	syncs []syncEvent
	sync  map[int64]int   // correlation → syncs index
	owned map[int64][]int // graph launch correlation → its replayed nodes (graphOwners)
	owner []int64         // per gpus index: the graph launch it ran in, -1 none
}

func category(cat string) string {
	switch cat {
	case "cuda_runtime", "Runtime", "cuda_driver", "Driver":
		return "runtime"
	case "kernel", "Kernel":
		return "kernel"
	case "gpu_memcpy", "Memcpy":
		return "memcpy"
	case "gpu_memset", "Memset":
		return "memset"
	case "cuda_sync":
		return "sync"
	}
	return ""
}

func streamOf(n num) int64 {
	if !n.ok || n.v < 0 || n.v >= 1<<32-1 {
		return NoStream
	}
	return n.v
}

func idOf(n num) int64 {
	if !n.ok || n.v < 0 {
		return -1
	}
	return n.v
}

func (b *builder) add(i int, e *rawEvent) error {
	cat := category(e.Cat)
	if cat == "" || e.Ph != "X" {
		return nil
	}
	if !e.Ts.ok {
		return errors.New("no ts")
	}
	if !e.Args.Correlation.ok {
		if cat == "runtime" || cat == "sync" {
			return nil // a call CUPTI did not correlate: nothing to join
		}
		return errors.New("GPU event without a correlation id")
	}
	corr := e.Args.Correlation.v
	switch cat {
	case "runtime":
		if _, dup := b.rt[corr]; dup {
			return fmt.Errorf("correlation %d names two calls", corr)
		}
		b.rt[corr] = len(b.rts)
		b.rts = append(b.rts, rtEvent{thread: string(e.PID) + "/" + string(e.TID), api: e.Name, corr: corr,
			start: e.Ts.ns, dur: e.Dur.ns})
	case "sync":
		b.sync[corr] = len(b.syncs)
		b.syncs = append(b.syncs, syncEvent{kind: e.Args.SyncKind, stream: streamOf(e.Args.Stream),
			waitStream: streamOf(e.Args.WaitStream), waitRecord: idOf(e.Args.WaitRecord), waitEvent: idOf(e.Args.WaitEvent)})
	default:
		g := gpuEvent{kind: cat, corr: corr, stream: streamOf(e.Args.Stream), start: e.Ts.ns, dur: e.Dur.ns}
		if e.Args.Bytes.ok && e.Args.Bytes.v < 0 {
			return fmt.Errorf("negative bytes %d", e.Args.Bytes.v)
		}
		g.bytes = uint64(max(e.Args.Bytes.v, 0))
		if cat == "memcpy" {
			c, err := parseCopy(e.Name)
			if err != nil {
				return err
			}
			if !e.Args.Bytes.ok {
				return errors.New("copy without bytes")
			}
			c.Bytes, c.GPUNs = g.bytes, g.dur
			g.copy = c
		}
		b.gpu[corr] = append(b.gpu[corr], len(b.gpus))
		b.gpus = append(b.gpus, g)
	}
	return nil
}

var copyName = regexp.MustCompile(`^Memcpy (HtoD|DtoH|DtoD|HtoH|PtoP)(?: \((\w+) -> (\w+)\))?`)

// parseCopy reads CUPTI's copy name: "Memcpy HtoD (Pinned -> Device)".
func parseCopy(name string) (Copy, error) {
	m := copyName.FindStringSubmatch(name)
	if m == nil {
		return Copy{}, fmt.Errorf("not a CUPTI copy name")
	}
	kind := func(s string) string {
		switch s {
		case "Pinned":
			return "pinned"
		case "Pageable":
			return "pageable"
		case "Device":
			return "device"
		}
		return "unknown"
	}
	switch m[1] {
	case "HtoD":
		return Copy{Dir: "H2D", Host: kind(m[2])}, nil
	case "DtoH":
		return Copy{Dir: "D2H", Host: kind(m[3])}, nil
	case "HtoH":
		return Copy{Dir: "H2H", Host: kind(m[2])}, nil
	}
	return Copy{Dir: "D2D", Host: "device"}, nil
}

// replayed maps a runtime API to its op, for the calls whose op does not
// follow from their GPU work.
var replayed = map[string]Op{
	"cudaEventRecord": OpEventRecord, "cudaEventRecordWithFlags": OpEventRecord, "cuEventRecord": OpEventRecord,
	"cuEventRecordWithFlags": OpEventRecord,
	"cudaEventQuery":         OpEventQuery, "cuEventQuery": OpEventQuery,
	"cudaEventSynchronize": OpEventSync, "cuEventSynchronize": OpEventSync,
	"cudaStreamWaitEvent": OpStreamWait, "cuStreamWaitEvent": OpStreamWait,
	"cudaStreamSynchronize": OpStreamSync, "cuStreamSynchronize": OpStreamSync,
	"cudaDeviceSynchronize": OpDeviceSync, "cuCtxSynchronize": OpDeviceSync,
	"cudaGraphLaunch": OpGraph, "cuGraphLaunch": OpGraph,
}

func (b *builder) build() (*Trace, error) {
	t := &Trace{Name: b.name, Skipped: map[string]int{}}
	b.graphOwners()
	streams := map[int64]bool{}
	for _, g := range b.gpus {
		if g.stream != NoStream {
			streams[g.stream] = true
		}
	}
	// The calls, in start order per thread; t0 the first replayed call.
	calls := slices.Clone(b.rts) // b.rt indexes b.rts
	slices.SortStableFunc(calls, func(x, y rtEvent) int { return cmpInt(x.start, y.start) })
	byThread := map[string]int{}
	var t0 int64 = -1
	for _, r := range calls {
		c, ok := b.call(r, t)
		if !ok {
			continue
		}
		if t0 < 0 {
			t0 = r.start
		}
		c.StartNs = r.start - t0
		if c.Stream != NoStream {
			streams[c.Stream] = true
		}
		ti, seen := byThread[r.thread]
		if !seen {
			ti = len(t.Threads)
			byThread[r.thread] = ti
			t.Threads = append(t.Threads, Thread{ID: r.thread})
		}
		t.Threads[ti].Calls = append(t.Threads[ti].Calls, c)
	}
	for i, g := range b.gpus {
		if g.kind != "memcpy" {
			continue
		}
		if _, ok := b.rt[g.corr]; ok {
			continue // counted with its call (or as a graph's, below)
		}
		if b.owner[i] < 0 {
			t.NoCall = append(t.NoCall, g.copy)
		}
	}
	for th := range t.Threads {
		for _, c := range t.Threads[th].Calls {
			if c.Copy != nil {
				t.Copies = append(t.Copies, *c.Copy)
			}
			t.InGraphs = append(t.InGraphs, c.GraphCopies...)
		}
	}
	if len(t.Threads) == 0 {
		return nil, fmt.Errorf("%s: no CUDA call to replay (a CPU-only trace?)", b.name)
	}
	for s := range streams {
		t.Streams = append(t.Streams, s)
	}
	slices.Sort(t.Streams)
	return t, nil
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// call makes the replayed call of a runtime event, or counts it skipped.
func (b *builder) call(r rtEvent, t *Trace) (Call, bool) {
	c := Call{API: r.api, DurNs: r.dur, Correlation: r.corr, Stream: NoStream, Event: -1, RecordCorr: -1, RecordStream: NoStream}
	gs := b.gpu[r.corr]
	op, named := replayed[r.api]
	switch {
	case op == OpGraph:
		c.Op = OpGraph
		c.Stream, c.GPUNs, c.GraphCopies = b.graphWork(r.corr)
		return c, true
	case named:
		c.Op = op
		b.syncFacts(&c)
		return c, true
	case len(gs) == 0:
		if isCopyAPI(r.api) || isLaunchAPI(r.api) || strings.HasPrefix(r.api, "cudaMemset") {
			t.Skipped[r.api+" without a GPU record"]++
		} else {
			t.Skipped[r.api]++
		}
		return c, false
	}
	g := b.gpus[gs[0]]
	c.Stream = g.stream
	if len(gs) > 1 && g.kind != "kernel" {
		// one copy or memset per call: say what else CUPTI gave it
		t.Skipped[fmt.Sprintf("%s GPU records beyond its first", r.api)] += len(gs) - 1
	}
	switch g.kind {
	case "memcpy":
		cp := g.copy
		c.Op, c.Copy, c.GPUNs = OpCopy, &cp, g.dur
	case "memset":
		c.Op, c.MemsetBytes, c.GPUNs = OpMemset, g.bytes, g.dur
	default:
		// one launch; a launch of several kernels (cooperative forms) lasts their span
		c.Op = OpKernel
		end := g.start + g.dur
		for _, i := range gs[1:] {
			end = max(end, b.gpus[i].start+b.gpus[i].dur)
		}
		c.GPUNs = end - g.start
	}
	return c, true
}

func isCopyAPI(api string) bool {
	return strings.HasPrefix(api, "cudaMemcpy") || strings.HasPrefix(api, "cuMemcpy")
}

func isLaunchAPI(api string) bool {
	return strings.Contains(api, "LaunchKernel") || strings.Contains(api, "LaunchCooperativeKernel")
}

// syncFacts fills what CUPTI's synchronisation record says of a call.
func (b *builder) syncFacts(c *Call) {
	i, ok := b.sync[c.Correlation]
	if !ok {
		return
	}
	s := b.syncs[i]
	c.Event, c.RecordCorr, c.RecordStream = s.waitEvent, s.waitRecord, s.waitStream
	switch c.Op {
	case OpStreamWait, OpStreamSync:
		c.Stream = s.stream
	}
}

// graphOwners attributes each GPU event whose call is not in the trace to
// the graph launch whose work it continues: a graph's replayed nodes keep
// the correlation ids of their capture, so they match no call; on one
// stream work runs in order, so such an event belongs to the graph launch
// that last put work on its stream, unless a plain call's work came between.
func (b *builder) graphOwners() {
	b.owner = make([]int64, len(b.gpus))
	b.owned = map[int64][]int{}
	order := make([]int, len(b.gpus))
	for i := range order {
		order[i] = i
		b.owner[i] = -1
	}
	slices.SortStableFunc(order, func(x, y int) int { return cmpInt(b.gpus[x].start, b.gpus[y].start) })
	current := map[int64]int64{} // stream → graph launch correlation, -1 none
	for _, i := range order {
		g := b.gpus[i]
		if ri, ok := b.rt[g.corr]; ok {
			current[g.stream] = -1
			if replayed[b.rts[ri].api] == OpGraph {
				current[g.stream] = g.corr
			}
			continue
		}
		if c, ok := current[g.stream]; ok && c >= 0 {
			b.owner[i] = c
			b.owned[c] = append(b.owned[c], i)
		}
	}
}

// graphWork is a graph launch's stream, its span there and its copies.
func (b *builder) graphWork(corr int64) (stream, spanNs int64, copies []Copy) {
	stream = NoStream
	var lo, hi int64 = -1, -1
	take := func(g gpuEvent) {
		if stream == NoStream {
			stream = g.stream
		}
		if lo < 0 || g.start < lo {
			lo = g.start
		}
		hi = max(hi, g.start+g.dur)
		if g.kind == "memcpy" {
			copies = append(copies, g.copy)
		}
	}
	for _, i := range b.gpu[corr] {
		take(b.gpus[i])
	}
	for _, i := range b.owned[corr] {
		take(b.gpus[i])
	}
	if lo >= 0 {
		spanNs = hi - lo
	}
	return stream, spanNs, copies
}
