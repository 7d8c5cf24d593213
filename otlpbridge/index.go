package otlpbridge

import (
	"bytes"
	"cmp"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
)

// SpanRef names one span.
type SpanRef struct {
	TraceID [16]byte
	SpanID  [8]byte
}

// Valid reports whether r names a span.
func (r SpanRef) Valid() bool { return r.TraceID != [16]byte{} && r.SpanID != [8]byte{} }

// Attribution scopes: how the spans that matched relate to the transfer.
const (
	ScopeOfThread  = "thread"  // a span of the submitting thread
	ScopeOfProcess = "process" // a span of the process: its main thread's, or a process tree's
	ScopeOfAny     = "any"     // a span of no known process: any process
)

// Reasons a transfer has no request (Attribution.Reason).
const (
	ReasonNoSpans    = "no_spans"    // the index holds no thread or process span at all
	ReasonNotCovered = "not_covered" // spans are indexed, none covers the transfer
	ReasonOtherHost  = "other_host"  // only spans of thread ids on another host covered it
	// More than IndexConfig.MaxCover spans of one thread or process cover
	// the transfer (every queued request's span covers its copies): which
	// of them it served cannot be told, and listing a few would be a guess.
	ReasonAmbiguous = "ambiguous"
)

// Attribution is the answer for one transfer.
type Attribution struct {
	Rule      string  // the rule of the span(s) that matched; "" none
	Scope     string  // ScopeOfThread, ScopeOfProcess or ScopeOfAny; "" none
	Request   string  // the request id; "" when unknown or a batch
	Room      string  // the bootstrap room joining the request's traces (0x…), "" none
	Parent    SpanRef // the span the transfer becomes a child of: the innermost covering span of its request
	Requests  []string
	Links     []SpanRef // batch: one span per request, capped like Requests
	Batch     int       // number of distinct requests whose spans cover the transfer, when > 1
	Truncated bool      // Requests/Links were capped
	// Open: spans that may change this answer have not arrived yet — a
	// request that started before the transfer is still running (its spans
	// are exported only when they end), or the request of the covering
	// span is still to come. A caller that can wait should ask again later.
	Open   bool
	Reason string // no request: why (Reason*)
}

// IndexConfig bounds the index. Everything it stores — indexed spans,
// request names and rooms, open requests — counts against one budget,
// MaxBytes (estimated) and MaxSpans (things stored); past either the
// oldest go first.
type IndexConfig struct {
	Rules    []Rule        // default DefaultRules()
	Window   time.Duration // spans that ended longer ago are evicted, open requests idle that long forgotten; span ends are clamped to arrival + Window (default 2 min)
	MaxSpans int           // things stored at most: spans, request names, rooms, open requests (default: no count, MaxBytes alone)
	MaxBytes int64         // estimated bytes stored at most (default DefaultIndexBytes)
	MaxBatch int           // request ids listed for a batch (default 8)
	MaxOpen  int           // open requests tracked (default 16 384)
	MaxCover int           // spans of one thread or process covering a transfer past which it is ambiguous (default 1024)
	Procs    ProcInfo      // host ids and parents of processes (default NewProcFS("/proc"))
	Logger   *slog.Logger
}

// DefaultIndexBytes is the index's budget when neither MaxBytes nor a
// memory limit sizes it.
const DefaultIndexBytes = 64 << 20

// IndexBytesFor is the index's share of a memory limit: an eighth (the
// rest holds the engine, the held transfers, the receivers' requests).
func IndexBytesFor(memoryLimit int64) int64 {
	if memoryLimit <= 0 || memoryLimit == math.MaxInt64 {
		return DefaultIndexBytes
	}
	return max(memoryLimit/8, 1<<20)
}

// IndexStats are the index's counters.
type IndexStats struct {
	Spans       uint64 // spans seen
	Indexed     uint64 // ... that matched a rule
	Evicted     uint64 // indexed spans dropped by age
	CapEvicts   uint64 // indexed spans dropped because the budget (MaxBytes, MaxSpans) was full
	InfoEvicts  uint64 // request names and rooms dropped because the budget was full
	Clamped     uint64 // spans whose end lay past arrival + Window: clamped to it
	Live        int    // indexed spans now
	Stored      int    // everything stored now: spans, request names, rooms, open requests
	Bytes       int64  // their estimated size
	Open        int    // requests seen starting whose spans are still to come
	OpenExpired uint64 // open requests forgotten after Window without a span
	OpenDropped uint64 // open requests not tracked, or forgotten, because MaxOpen or the budget was full
	Generation  uint64 // changes whenever spans arrive: answers may have changed
}

type entry struct {
	ref        SpanRef
	parent     [8]byte
	start, end int64 // Unix ns
	rule       *Rule
	tid        uint32 // ScopeThread
	host       string // ScopeThread: host id of tid, "" any
	root       uint32 // ScopeProcess: the tree's root pid, 0 any
	request    string
	room       string
	seq        uint64  // arrival order
	cost       int64   // bytes charged to the budget
	top        SpanRef // ScopeSlice: the thread span it descends from, once known (adopted)
	topTid     uint32  // ... and its thread
	adopted    bool
	dead       bool
	ttft       int64 // ns: the span's own time-to-first-token attribute (TTFTAttr), 0 none
}

// traceInfo is what the trace-scope spans of one trace say.
type traceInfo struct {
	id      [16]byte
	request string
	ref     SpanRef // the request span
	room    string
	end     int64
	cost    int64
	dead    bool
	// The request span's own times, and the end of the trace's first
	// forward slices of each kind (SGLang's time to first token), Unix ns;
	// 0 not seen.
	reqStart, reqEnd, reqTTFT int64
	prefillEnd, decodeEnd     int64
}

// roomReq is a request span holding a bootstrap room.
type roomReq struct {
	room    string
	request string
	end     int64
	cost    int64
	dead    bool
}

// openTrace is a trace whose thread spans or slices referred to parents
// not yet received: spans still to come.
type openTrace struct {
	id      [16]byte
	missing map[[8]byte]bool
	start   int64 // earliest start seen in it
	seen    int64 // wall time of its last span
	cost    int64
	dead    bool
}

// stored is one thing the index holds, in arrival order for eviction:
// exactly one field is set.
type stored struct {
	e  *entry
	ti *traceInfo
	rr *roomReq
	ot *openTrace
}

// Estimated bytes of what the index stores (the budget): the structs, a
// map slot, the arrival queue's slot, an interval tree node, and each
// string with its allocation header.
var (
	entryBytes = int64(unsafe.Sizeof(entry{})) + fifoSlotBytes + ivNodeBytes + mapSlotBytes
	traceBytes = int64(unsafe.Sizeof(traceInfo{})) + fifoSlotBytes + mapSlotBytes
	roomBytes  = int64(unsafe.Sizeof(roomReq{})) + fifoSlotBytes + 8 + mapSlotBytes
	openBytes  = int64(unsafe.Sizeof(openTrace{})) + fifoSlotBytes + 2*mapSlotBytes
	// The arrival queue's slot, with the slack of a queue compacted when
	// half of it is gone and grown by doubling.
	fifoSlotBytes = int64(unsafe.Sizeof(stored{})) * 5 / 2
)

const (
	mapSlotBytes    = 64 // a map entry with its share of the buckets
	missingSlotByte = 24 // one parent an open trace waits for
)

func strBytes(s string) int64 {
	if s == "" {
		return 0
	}
	return int64(len(s)+15) &^ 7
}

const maxMissing = 64

// Index keeps recent spans, bounded in time and memory. Safe for
// concurrent use. Spans are held in interval trees by thread, process and
// parent, so a transfer's answer costs O(log n) in the spans held.
type Index struct {
	cfg IndexConfig
	log *slog.Logger

	mu       sync.Mutex
	fifo     []stored // arrival order, for eviction; fifo[head:] may hold dead ones
	head     int
	seq      uint64
	live     int   // live entries
	nstored  int   // live things in fifo
	bytes    int64 // their estimated size
	swept    int64 // when every stored thing was last checked for age
	byRef    map[SpanRef]*entry
	threads  map[uint32]*ivTree  // ScopeThread, by tid
	procs    map[uint32]*ivTree  // ScopeProcess, by root pid (0: any)
	children map[SpanRef]*ivTree // ScopeSlice, by parent
	narrow   map[uint32]*ivTree  // Narrow slices whose thread span is known, by its tid
	traces   map[[16]byte]*traceInfo
	rooms    map[string][]*roomReq
	open     map[[16]byte]*openTrace
	minOpen  int64 // earliest start among open traces; valid unless openDirty
	dirty    bool
	unknown  map[uint32]bool // pids whose host id was logged unknown
	forgot   int64           // when the process cache was last dropped
	stats    IndexStats
	scratch  []*entry // covering spans of one query
	visits   uint64   // tree nodes looked at by queries (tests: the cost)
}

// NewIndex returns an empty index.
func NewIndex(cfg IndexConfig) *Index {
	if cfg.Rules == nil {
		cfg.Rules = DefaultRules()
	}
	if cfg.Window <= 0 {
		cfg.Window = 2 * time.Minute
	}
	if cfg.MaxSpans <= 0 {
		cfg.MaxSpans = math.MaxInt
	}
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = DefaultIndexBytes
	}
	if cfg.MaxCover <= 0 {
		cfg.MaxCover = 1024
	}
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = 8
	}
	if cfg.MaxOpen <= 0 {
		cfg.MaxOpen = 16_384
	}
	if cfg.Procs == nil {
		cfg.Procs = NewProcFS("")
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Index{cfg: cfg, log: log, byRef: map[SpanRef]*entry{}, threads: map[uint32]*ivTree{}, procs: map[uint32]*ivTree{},
		children: map[SpanRef]*ivTree{}, narrow: map[uint32]*ivTree{}, traces: map[[16]byte]*traceInfo{}, rooms: map[string][]*roomReq{},
		open: map[[16]byte]*openTrace{}, unknown: map[uint32]bool{}, minOpen: math.MaxInt64, swept: math.MinInt64}
}

// Stats returns the counters.
func (x *Index) Stats() IndexStats {
	x.mu.Lock()
	defer x.mu.Unlock()
	s := x.stats
	s.Live, s.Stored, s.Bytes = x.live, x.nstored, x.bytes
	s.Open = len(x.open)
	return s
}

// Generation changes whenever spans arrive: an answer given before may
// differ now.
func (x *Index) Generation() uint64 {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.stats.Generation
}

// Add indexes the spans of one export request's resource spans.
func (x *Index) Add(rss []*tracepb.ResourceSpans) {
	x.AddAt(rss, time.Now())
}

// AddAt is Add with the arrival time given (tests).
func (x *Index) AddAt(rss []*tracepb.ResourceSpans, now time.Time) {
	x.mu.Lock()
	defer x.mu.Unlock()
	wall := now.UnixNano()
	x.stats.Generation++ // open requests may have closed even if nothing was indexed
	for _, rs := range rss {
		var res []*commonpb.KeyValue
		if rs.GetResource() != nil {
			res = rs.GetResource().GetAttributes()
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				x.stats.Spans++
				x.add(sp, res, wall)
				x.fit(wall) // within the budget at every span, not only after the request
			}
		}
	}
	x.evict(wall)
}

func (x *Index) match(sp *tracepb.Span) *Rule {
	for i := range x.cfg.Rules {
		r := &x.cfg.Rules[i]
		if !r.Span.MatchString(sp.GetName()) {
			continue
		}
		ok := true
		for _, m := range r.Attrs {
			v, has := attr(sp.GetAttributes(), m.Key)
			if !has || m.Value != nil && !m.Value.MatchString(v) {
				ok = false
				break
			}
		}
		if ok {
			return r
		}
	}
	return nil
}

func (x *Index) add(sp *tracepb.Span, res []*commonpb.KeyValue, wall int64) {
	var ref SpanRef
	if len(sp.GetTraceId()) != 16 || len(sp.GetSpanId()) != 8 {
		return
	}
	copy(ref.TraceID[:], sp.GetTraceId())
	copy(ref.SpanID[:], sp.GetSpanId())
	x.arrived(ref)
	r := x.match(sp)
	if r == nil {
		return
	}
	old := x.byRef[ref]
	if old != nil {
		x.drop(stored{e: old}, "") // sent again: the last copy counts
	}
	x.seq++
	e := &entry{ref: ref, start: int64(min(sp.GetStartTimeUnixNano(), math.MaxInt64)), end: int64(min(sp.GetEndTimeUnixNano(), math.MaxInt64)),
		rule: r, seq: x.seq}
	if len(sp.GetParentSpanId()) == 8 {
		copy(e.parent[:], sp.GetParentSpanId())
	}
	if e.end < e.start {
		e.end = e.start
	}
	// Servers export spans when they end: one ending past the window
	// after its arrival is a skewed clock or a lie, and would be held
	// that long.
	if horizon := wall + int64(x.cfg.Window); e.end > horizon {
		e.end = horizon
		e.start = min(e.start, horizon)
		x.stats.Clamped++
	}
	attrs := sp.GetAttributes()
	if r.Request != "" {
		e.request, _ = attr(attrs, r.Request)
	}
	if r.Room != "" {
		v, _ := attr(attrs, r.Room)
		e.room = normRoom(v)
	}
	if r.Request != "" {
		if v, ok := attr(attrs, TTFTAttr); ok {
			if sec, err := strconv.ParseFloat(v, 64); err == nil && sec > 0 && sec < 1e6 {
				e.ttft = int64(sec * 1e9)
			}
		}
	}
	if r.Scope == ScopeSlice {
		x.firstForward(sp.GetName(), e)
	}
	switch r.Scope {
	case ScopeTrace:
		if e.request == "" && e.room == "" {
			return // the rule names neither: not a request span after all
		}
		x.addTrace(e)
	case ScopeThread:
		v, ok := attr(attrs, r.Thread)
		if !ok {
			return
		}
		tid, err := strconv.ParseUint(v, 10, 32)
		if err != nil || tid == 0 {
			return
		}
		e.tid = uint32(tid)
		if r.Host != "" {
			e.host, _ = attr(attrs, r.Host)
		}
		treeOf(x.threads, e.tid).insert(e)
		x.waitFor(e, wall)
	case ScopeSlice:
		if e.parent == [8]byte{} {
			return // a root slice belongs to no thread
		}
		treeOf(x.children, SpanRef{TraceID: ref.TraceID, SpanID: e.parent}).insert(e)
		x.waitFor(e, wall)
	case ScopeProcess:
		if r.Process != "" {
			v, ok := attr(attrs, r.Process)
			if !ok {
				v, ok = attr(res, r.Process)
			}
			if ok {
				if pid, err := strconv.ParseUint(strings.TrimSpace(v), 10, 32); err == nil {
					e.root = uint32(pid)
				}
			}
		}
		treeOf(x.procs, e.root).insert(e)
	}
	x.byRef[ref] = e
	e.cost = entryBytes + strBytes(e.host) + strBytes(e.request) + strBytes(e.room)
	x.live++
	x.keep(stored{e: e}, e.cost)
	x.stats.Indexed++
	budget := maxAdopt
	switch r.Scope {
	case ScopeThread:
		if old == nil || old.rule.Scope != ScopeThread || old.tid != e.tid { // else its slices know it already
			x.children[ref].each(func(c *entry) { x.adopt(c, ref, e.tid, 1, true, &budget) })
		}
	case ScopeSlice:
		p := x.byRef[SpanRef{TraceID: ref.TraceID, SpanID: e.parent}]
		switch {
		case p == nil:
		case p.rule.Scope == ScopeThread:
			x.adopt(e, p.ref, p.tid, 1, !old.adoptedBy(p.ref, p.tid), &budget)
		case p.adopted:
			x.adopt(e, p.top, p.topTid, 1, !old.adoptedBy(p.top, p.topTid), &budget)
		}
	}
}

// maxAdopt bounds the slices one arriving span makes known by thread.
const maxAdopt = 4096

func (e *entry) adoptedBy(top SpanRef, tid uint32) bool {
	return e != nil && e.adopted && e.top == top && e.topTid == tid
}

// adopt notes that slice e, and (walk) the slices below it, descend from
// thread span top of thread tid: its forward slices are then found by
// thread too, so that the requests in their forward pass are found among
// thousands queued. At most *budget slices are visited.
func (x *Index) adopt(e *entry, top SpanRef, tid uint32, depth int, walk bool, budget *int) {
	if depth > 16 || *budget <= 0 || e.adoptedBy(top, tid) {
		return
	}
	*budget--
	if e.rule.Narrow {
		if e.adopted {
			untree(x.narrow, e.topTid, e)
		} else {
			x.recharge(&e.cost, e.cost+ivNodeBytes)
		}
		treeOf(x.narrow, tid).insert(e)
	}
	e.adopted, e.top, e.topTid = true, top, tid
	if walk {
		x.children[e.ref].each(func(c *entry) { x.adopt(c, top, tid, depth+1, true, budget) })
	}
}

func treeOf[K comparable](m map[K]*ivTree, k K) *ivTree {
	t := m[k]
	if t == nil {
		t = &ivTree{}
		m[k] = t
	}
	return t
}

// traceOf is what the index knows of a trace, made when first needed.
func (x *Index) traceOf(id [16]byte) *traceInfo {
	ti := x.traces[id]
	if ti == nil {
		ti = &traceInfo{id: id, cost: traceBytes}
		x.traces[ti.id] = ti
		x.keep(stored{ti: ti}, ti.cost)
	}
	return ti
}

// addTrace notes the request and room a trace-scope span names.
func (x *Index) addTrace(e *entry) {
	ti := x.traceOf(e.ref.TraceID)
	if e.request != "" {
		ti.request, ti.ref = e.request, e.ref
		ti.reqStart, ti.reqEnd, ti.reqTTFT = e.start, e.end, e.ttft
	}
	if e.room != "" {
		ti.room = e.room
	}
	x.recharge(&ti.cost, traceBytes+strBytes(ti.request)+strBytes(ti.room))
	ti.end = max(ti.end, e.end)
	if ti.request != "" && ti.room != "" { // on one span (current) or two (October 2025)
		x.addRoom(ti.room, ti.request, ti.end)
	}
}

// Slices whose end is a request's first token on SGLang: the forward pass
// that ran its prefill samples it; a PD decode server, which runs no
// prefill, has it at the end of its first decode pass.
const (
	SlicePrefill = "prefill_forward"
	SliceDecode  = "decode_forward"
)

// TTFTAttr is the attribute a request span states its time to first token
// in, seconds (vLLM's llm_request).
const TTFTAttr = "gen_ai.latency.time_to_first_token"

// firstForward notes the end of a trace's first prefill or decode pass.
func (x *Index) firstForward(name string, e *entry) {
	var at *int64
	switch name {
	case SlicePrefill:
		at = &x.traceOf(e.ref.TraceID).prefillEnd
	case SliceDecode:
		at = &x.traceOf(e.ref.TraceID).decodeEnd
	default:
		return
	}
	if *at == 0 || e.end < *at {
		*at = e.end
	}
	ti := x.traces[e.ref.TraceID]
	ti.end = max(ti.end, e.end)
}

// RequestSpan is a request's own span as the server exported it.
type RequestSpan struct {
	Ref        SpanRef
	Start, End int64 // Unix ns
	// TTFT is its time to first token, ns, and TTFTFrom where it comes
	// from: TTFTAttr (the span says it), SlicePrefill or SliceDecode (from
	// the span's start to that slice's first end); 0 and "" unknown.
	TTFT     int64
	TTFTFrom string
}

// RequestSpan returns the span of the request whose span ref (an
// Attribution's Parent or Links) is: a process-scope request span itself
// (vLLM's llm_request), else the request span of ref's trace (SGLang's
// `Req …`). False while that span is not in the index.
func (x *Index) RequestSpan(ref SpanRef) (RequestSpan, bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if e := x.byRef[ref]; e != nil && e.rule.Scope == ScopeProcess {
		r := RequestSpan{Ref: e.ref, Start: e.start, End: e.end, TTFT: e.ttft}
		if r.TTFT > 0 {
			r.TTFTFrom = TTFTAttr
		}
		return r, true
	}
	ti := x.traces[ref.TraceID]
	if ti == nil || !ti.ref.Valid() {
		return RequestSpan{}, false
	}
	r := RequestSpan{Ref: ti.ref, Start: ti.reqStart, End: ti.reqEnd}
	switch {
	case ti.reqTTFT > 0:
		r.TTFT, r.TTFTFrom = ti.reqTTFT, TTFTAttr
	case ti.prefillEnd > ti.reqStart:
		r.TTFT, r.TTFTFrom = ti.prefillEnd-ti.reqStart, SlicePrefill
	case ti.decodeEnd > ti.reqStart:
		r.TTFT, r.TTFTFrom = ti.decodeEnd-ti.reqStart, SliceDecode
	}
	return r, true
}

// keep charges a new stored thing to the budget.
func (x *Index) keep(s stored, cost int64) {
	x.fifo = append(x.fifo, s)
	x.nstored++
	x.bytes += cost
}

// recharge changes a stored thing's cost.
func (x *Index) recharge(cost *int64, now int64) {
	x.bytes += now - *cost
	*cost = now
}

// arrived settles a span some open trace was waiting for.
func (x *Index) arrived(ref SpanRef) {
	ot := x.open[ref.TraceID]
	if ot == nil || !ot.missing[ref.SpanID] {
		return
	}
	delete(ot.missing, ref.SpanID)
	x.recharge(&ot.cost, ot.cost-missingSlotByte)
	if len(ot.missing) == 0 {
		x.drop(stored{ot: ot}, "")
	}
}

// waitFor notes that e's parent is still to come: its request is open.
// A thread span's parent is the request span; a slice's, its thread span or
// an outer slice. Both are exported when they end, after their children.
func (x *Index) waitFor(e *entry, wall int64) {
	if e.parent == [8]byte{} {
		return
	}
	if _, ok := x.byRef[SpanRef{TraceID: e.ref.TraceID, SpanID: e.parent}]; ok {
		return
	}
	ot := x.open[e.ref.TraceID]
	if ot == nil {
		if len(x.open) >= x.cfg.MaxOpen {
			x.stats.OpenDropped++
			return
		}
		ot = &openTrace{id: e.ref.TraceID, missing: map[[8]byte]bool{}, start: e.start, cost: openBytes}
		x.open[ot.id] = ot
		x.keep(stored{ot: ot}, ot.cost)
	}
	if len(ot.missing) < maxMissing && !ot.missing[e.parent] {
		ot.missing[e.parent] = true
		x.recharge(&ot.cost, ot.cost+missingSlotByte)
	}
	if e.start < ot.start {
		ot.start = e.start
	}
	ot.seen = wall
	x.dirty = true
}

func (x *Index) addRoom(room, request string, end int64) {
	rs := x.rooms[room]
	for _, r := range rs {
		if r.request == request {
			r.end = max(r.end, end)
			return
		}
	}
	if len(rs) < 4 {
		r := &roomReq{room: room, request: request, end: end, cost: roomBytes + strBytes(room) + strBytes(request)}
		x.rooms[room] = append(rs, r)
		x.keep(stored{rr: r}, r.cost)
	}
}

// normRoom writes a bootstrap room as SGLang's current spans do (hex,
// 0x…): October 2025 and later write str(hex(room)), September 2025 the int
// itself or "None"; 0 is no room.
func normRoom(v string) string {
	v = strings.TrimSpace(v)
	if v == "" || v == "None" {
		return ""
	}
	var n uint64
	var err error
	if rest, ok := strings.CutPrefix(strings.ToLower(v), "0x"); ok {
		n, err = strconv.ParseUint(rest, 16, 64)
	} else {
		n, err = strconv.ParseUint(v, 10, 64)
	}
	if err != nil {
		return v // not a number: keep as given
	}
	if n == 0 {
		return ""
	}
	return "0x" + strconv.FormatUint(n, 16)
}

// evict drops what the window left behind: spans that ended before it,
// request names and rooms of requests that did, open requests idle for
// it. Those at the front of the arrival queue go at once; everything is
// checked every eighth of the window.
func (x *Index) evict(now int64) {
	cut := now - int64(x.cfg.Window)
	if x.forgot < cut {
		// Pids are reused: read processes again once a window (and say
		// again which hosts are unknown).
		if p, ok := x.cfg.Procs.(interface{ Forget() }); ok {
			p.Forget()
		}
		clear(x.unknown)
		x.forgot = now
	}
	if now-x.swept >= int64(x.cfg.Window/8) {
		x.swept = now
		kept := x.fifo[:0]
		for _, s := range x.fifo[x.head:] {
			if !x.dead(s) && x.expired(s, cut) {
				x.drop(s, "age")
			}
			if !x.dead(s) {
				kept = append(kept, s)
			}
		}
		clear(x.fifo[len(kept):])
		x.fifo, x.head = kept, 0
	}
	for x.head < len(x.fifo) && (x.dead(x.fifo[x.head]) || x.expired(x.fifo[x.head], cut)) {
		if s := x.fifo[x.head]; !x.dead(s) {
			x.drop(s, "age")
		}
		x.pop()
	}
	x.fit(now)
}

// fit drops the oldest things until the rest are within the budget
// (counted as aged when they are past the window anyway).
func (x *Index) fit(now int64) {
	cut := now - int64(x.cfg.Window)
	for x.head < len(x.fifo) && (x.nstored > x.cfg.MaxSpans || x.bytes > x.cfg.MaxBytes) {
		switch s := x.fifo[x.head]; {
		case x.dead(s):
		case x.expired(s, cut):
			x.drop(s, "age")
		default:
			x.drop(s, "budget")
		}
		x.pop()
	}
	x.compact()
}

func (x *Index) pop() {
	x.fifo[x.head] = stored{}
	x.head++
}

func (x *Index) compact() {
	if x.head > 1024 && x.head > len(x.fifo)/2 {
		n := copy(x.fifo, x.fifo[x.head:])
		clear(x.fifo[n:])
		x.fifo, x.head = x.fifo[:n], 0
	}
}

func (x *Index) dead(s stored) bool {
	switch {
	case s.e != nil:
		return s.e.dead
	case s.ti != nil:
		return s.ti.dead
	case s.rr != nil:
		return s.rr.dead
	default:
		return s.ot.dead
	}
}

func (x *Index) expired(s stored, cut int64) bool {
	switch {
	case s.e != nil:
		return s.e.end < cut
	case s.ti != nil:
		return s.ti.end < cut
	case s.rr != nil:
		return s.rr.end < cut
	default:
		return s.ot.seen < cut
	}
}

// drop removes a stored thing and counts why: "age", "budget", or ""
// (replaced or settled, not counted).
func (x *Index) drop(s stored, why string) {
	var cost int64
	switch {
	case s.e != nil:
		e := s.e
		e.dead, cost = true, e.cost
		delete(x.byRef, e.ref)
		x.live--
		switch e.rule.Scope {
		case ScopeThread:
			untree(x.threads, e.tid, e)
		case ScopeProcess:
			untree(x.procs, e.root, e)
		case ScopeSlice:
			untree(x.children, SpanRef{TraceID: e.ref.TraceID, SpanID: e.parent}, e)
			if e.adopted && e.rule.Narrow {
				untree(x.narrow, e.topTid, e)
			}
		}
		switch why {
		case "age":
			x.stats.Evicted++
		case "budget":
			x.stats.CapEvicts++
		}
	case s.ti != nil:
		s.ti.dead, cost = true, s.ti.cost
		delete(x.traces, s.ti.id)
		if why == "budget" {
			x.stats.InfoEvicts++
		}
	case s.rr != nil:
		r := s.rr
		r.dead, cost = true, r.cost
		if rs := slices.DeleteFunc(x.rooms[r.room], func(o *roomReq) bool { return o == r }); len(rs) == 0 {
			delete(x.rooms, r.room)
		} else {
			x.rooms[r.room] = rs
		}
		if why == "budget" {
			x.stats.InfoEvicts++
		}
	default:
		s.ot.dead, cost = true, s.ot.cost
		delete(x.open, s.ot.id)
		x.dirty = true
		switch why {
		case "age":
			x.stats.OpenExpired++
		case "budget":
			x.stats.OpenDropped++
		}
	}
	x.nstored--
	x.bytes -= cost
}

func untree[K comparable](m map[K]*ivTree, k K, e *entry) {
	if t := m[k]; t != nil && t.remove(e) && t.n == 0 {
		delete(m, k)
	}
}

// OpenBefore reports whether a request that started at or before Unix ns t
// is still open: then Attribute(…, t) says Open, whatever else it says.
func (x *Index) OpenBefore(t int64) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.openBefore(t)
}

// openBefore reports whether a request that started at or before t is
// still open.
func (x *Index) openBefore(t int64) bool {
	if x.dirty {
		x.minOpen = math.MaxInt64
		for _, ot := range x.open {
			x.minOpen = min(x.minOpen, ot.start)
		}
		x.dirty = false
	}
	return x.minOpen <= t
}

// hit is one span covering the transfer: a thread or process span and the
// innermost slice of it that covers the transfer.
type hit struct {
	top, leaf *entry
	narrowed  bool
}

// covering are the spans of tr covering t; over says more than MaxCover
// do (then only MaxCover+1 were looked for). The slice is reused.
func (x *Index) covering(tr *ivTree, t int64) (es []*entry, over bool) {
	x.scratch = x.scratch[:0]
	complete := tr.stab(t, &x.visits, func(e *entry) bool {
		x.scratch = append(x.scratch, e)
		return len(x.scratch) <= x.cfg.MaxCover
	})
	return x.scratch, !complete
}

// threadHits are tid's thread spans covering t on pid's host; over says
// too many cover it to tell.
func (x *Index) threadHits(tid, pid uint32, t int64) (hits []hit, otherHost, over bool) {
	tr := x.threads[tid]
	if tr == nil {
		return nil, false, false
	}
	es, over := x.covering(tr, t)
	if over {
		es, over = x.forwarding(tid, t)
	}
	if over || len(es) == 0 {
		return nil, false, over
	}
	host, known := x.cfg.Procs.HostID(pid)
	for _, e := range es {
		local := e.host == "" || e.host == "unknown" || !known || e.host == host
		if !local {
			otherHost = true
			continue
		}
		if e.host != "" && e.host != "unknown" && !known && !x.unknown[pid] && len(x.unknown) < 1024 {
			x.unknown[pid] = true
			x.log.Info("host id of a traced process unknown (no /etc/machine-id in its root): its thread spans are matched whatever their host_id",
				"pid", pid, "span_host_id", e.host)
		}
		hits = append(hits, hit{top: e})
	}
	for i := range hits {
		hits[i].leaf, hits[i].narrowed = x.innermost(hits[i].top, t)
	}
	return hits, otherHost, false
}

// forwarding are tid's thread spans covering t whose forward slices do:
// when more than MaxCover requests cover a thread (queued ones too), those
// in their forward pass are the answer if they are few enough. over says
// they are not, or none is.
func (x *Index) forwarding(tid uint32, t int64) ([]*entry, bool) {
	fwd, over := x.covering(x.narrow[tid], t)
	if over {
		return nil, true
	}
	var tops []*entry
	for _, s := range fwd {
		top := x.byRef[s.top]
		if top != nil && top.rule.Scope == ScopeThread && top.tid == s.topTid && top.start <= t && t <= top.end {
			tops = append(tops, top)
		}
	}
	slices.SortFunc(tops, func(a, b *entry) int { return cmp.Compare(a.seq, b.seq) })
	tops = slices.Compact(tops)
	return tops, len(tops) == 0
}

// innermost descends from e through the slices covering t (at each level
// the latest to start, on a tie the first to arrive); narrowed says a
// forward slice covered it.
func (x *Index) innermost(e *entry, t int64) (*entry, bool) {
	cur, narrowed := e, false
	for range 16 {
		var next *entry
		n := 0
		x.children[cur.ref].stab(t, &x.visits, func(c *entry) bool {
			if next != nil && c.start < next.start {
				return false
			}
			if next == nil || c.seq < next.seq {
				next = c
			}
			n++
			return n <= x.cfg.MaxCover
		})
		if next == nil {
			break
		}
		narrowed = narrowed || next.rule.Narrow
		cur = next
	}
	return cur, narrowed
}

// procHits are the process spans covering t for a transfer of pid: those of
// the vLLM instance whose process tree holds pid (vllm.process_id is its API
// server, EngineCore and the workers are below it), else those naming no
// process (any process). Spans of an instance never cover a process outside
// its tree: two instances on one host stay apart. inInstance says pid is in
// a known tree; over, that too many cover it to tell.
func (x *Index) procHits(pid uint32, t int64) (hits []hit, inInstance, over bool) {
	if len(x.procs) == 0 {
		return nil, false, false
	}
	cover := func(tr *ivTree) ([]hit, bool) {
		es, over := x.covering(tr, t)
		if over {
			return nil, true
		}
		for _, e := range es {
			hits = append(hits, hit{top: e, leaf: e})
		}
		return hits, false
	}
	p := pid
	for range 64 {
		if tr, ok := x.procs[p]; ok && p != 0 {
			hits, over = cover(tr)
			return hits, true, over
		}
		pp, ok := x.cfg.Procs.Parent(p)
		if !ok || pp == p {
			break
		}
		p = pp
	}
	hits, over = cover(x.procs[0])
	return hits, false, over
}

// request names the request of a hit: its own attribute, its trace's
// request span, else the request joined to its trace's bootstrap room.
// pending says it may still come: the span's parent (SGLang's request span
// is its thread spans' parent) or the room's request span has not arrived.
func (x *Index) request(h hit) (id, room string, pending bool) {
	e := h.top
	ti := x.traces[e.ref.TraceID]
	if ti != nil {
		room = ti.room
	}
	if e.request != "" {
		return e.request, room, false
	}
	if ti != nil && ti.request != "" {
		return ti.request, room, false
	}
	_, parentSeen := x.byRef[SpanRef{TraceID: e.ref.TraceID, SpanID: e.parent}]
	parentSeen = parentSeen || e.parent == [8]byte{}
	if room != "" {
		switch rs := x.rooms[room]; len(rs) {
		case 1:
			return rs[0].request, room, false
		case 0:
			return "", room, true
		default: // several requests share the room: unknown
			return "", room, !parentSeen
		}
	}
	return "", "", !parentSeen
}

// Attribute answers for a transfer submitted at Unix ns t on thread tid of
// process pid. Thread spans of tid are asked first, then those of the
// process's main thread (tid = pid: the scheduler, when the copy ran on a
// thread no span names), then process spans. It costs O(log n) in the
// spans held, and at most MaxCover covering spans are looked at.
func (x *Index) Attribute(pid, tid uint32, t int64) Attribution {
	x.mu.Lock()
	defer x.mu.Unlock()
	open := x.openBefore(t)
	hits, other, over := x.threadHits(tid, pid, t)
	scope := ScopeOfThread
	if len(hits) == 0 && !over && tid != pid {
		var o bool
		hits, o, over = x.threadHits(pid, pid, t)
		other = other || o
		scope = ScopeOfProcess
	}
	if len(hits) == 0 && !over {
		var in bool
		hits, in, over = x.procHits(pid, t)
		scope = ScopeOfProcess
		if !in {
			scope = ScopeOfAny
		}
		if len(hits) == 0 && !over && (in || x.procs[0] != nil) {
			// vLLM exports llm_request when the request finishes: one
			// running now may cover the transfer.
			open = true
		}
	}
	if over {
		return Attribution{Open: open, Reason: ReasonAmbiguous}
	}
	if len(hits) == 0 {
		a := Attribution{Open: open, Reason: ReasonNotCovered}
		switch {
		case other:
			a.Reason = ReasonOtherHost
		case len(x.threads) == 0 && len(x.procs) == 0:
			a.Reason = ReasonNoSpans
		}
		return a
	}
	// Requests whose forward pass covers t leave out those only queued.
	if slices.ContainsFunc(hits, func(h hit) bool { return h.narrowed }) {
		hits = slices.DeleteFunc(hits, func(h hit) bool { return !h.narrowed })
	}
	rqs, pending := x.requests(hits)
	open = open || pending
	if len(rqs) == 1 {
		r := rqs[0]
		return Attribution{Rule: r.h.top.rule.Name, Scope: scope, Request: r.id, Room: r.room, Parent: r.h.leaf.ref, Open: open}
	}
	a := Attribution{Rule: rqs[0].h.top.rule.Name, Scope: scope, Batch: len(rqs), Open: open}
	for _, r := range rqs {
		if len(a.Requests) == x.cfg.MaxBatch {
			a.Truncated = true
			break
		}
		a.Requests = append(a.Requests, r.id)
		a.Links = append(a.Links, r.h.leaf.ref)
	}
	return a
}

// rq is one request among a transfer's hits.
type rq struct {
	key, id, room string
	h             hit
}

// requests gives one answer per request among hits: its innermost
// covering span (the latest leaf to start; on a tie, and for the id and
// room, the first span to arrive), in the order of their leaves' starts.
// pending says a request may still come. Indices are sorted, not the
// answers: a batch may be a thousand requests.
func (x *Index) requests(hits []hit) (rqs []rq, pending bool) {
	all := make([]rq, 0, len(hits))
	for _, h := range hits {
		id, room, p := x.request(h)
		pending = pending || p
		key := id
		switch {
		case key != "":
		case room != "":
			key = "room:" + room
		default: // unnamed request: its trace is its identity
			key = "trace:" + string(h.top.ref.TraceID[:])
		}
		all = append(all, rq{key: key, id: id, room: room, h: h})
	}
	order := make([]int32, len(all))
	for i := range order {
		order[i] = int32(i)
	}
	slices.SortFunc(order, func(i, j int32) int {
		if c := strings.Compare(all[i].key, all[j].key); c != 0 {
			return c
		}
		return cmp.Compare(all[i].h.top.seq, all[j].h.top.seq)
	})
	for i := 0; i < len(order); {
		best, j := all[order[i]], i+1
		for ; j < len(order) && all[order[j]].key == best.key; j++ {
			if h := all[order[j]].h; h.leaf.start > best.h.leaf.start {
				best.h = h
			}
		}
		all[order[i]].h = best.h
		order[len(rqs)] = order[i] // the request's answer, reusing order's prefix
		rqs = append(rqs, rq{})
		i = j
	}
	order = order[:len(rqs)]
	slices.SortFunc(order, func(i, j int32) int {
		a, b := all[i].h.leaf, all[j].h.leaf
		if c := cmp.Compare(a.start, b.start); c != 0 {
			return c
		}
		return bytes.Compare(a.ref.SpanID[:], b.ref.SpanID[:])
	})
	for k, i := range order {
		rqs[k] = all[i]
	}
	return rqs, pending
}

// attr finds a key among attributes and returns its value as text.
func attr(kvs []*commonpb.KeyValue, key string) (string, bool) {
	for _, kv := range kvs {
		if kv.GetKey() != key {
			continue
		}
		v := kv.GetValue()
		switch x := v.GetValue().(type) {
		case *commonpb.AnyValue_StringValue:
			return x.StringValue, true
		case *commonpb.AnyValue_IntValue:
			return strconv.FormatInt(x.IntValue, 10), true
		case *commonpb.AnyValue_DoubleValue:
			return strconv.FormatFloat(x.DoubleValue, 'f', -1, 64), true
		case *commonpb.AnyValue_BoolValue:
			return strconv.FormatBool(x.BoolValue), true
		}
		return "", false
	}
	return "", false
}
