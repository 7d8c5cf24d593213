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

// IndexConfig bounds the index.
type IndexConfig struct {
	Rules    []Rule        // default DefaultRules()
	Window   time.Duration // spans that ended longer ago are evicted, open requests idle that long forgotten (default 2 min)
	MaxSpans int           // past it the oldest are evicted (default 100 000)
	MaxBatch int           // request ids listed for a batch (default 8)
	MaxOpen  int           // open requests tracked (default 16 384)
	Procs    ProcInfo      // host ids and parents of processes (default NewProcFS("/proc"))
	Logger   *slog.Logger
}

// IndexStats are the index's counters.
type IndexStats struct {
	Spans       uint64 // spans seen
	Indexed     uint64 // ... that matched a rule
	Evicted     uint64 // indexed spans dropped by age
	CapEvicts   uint64 // indexed spans dropped because MaxSpans was hit
	Live        int    // indexed spans now
	Open        int    // requests seen starting whose spans are still to come
	OpenExpired uint64 // open requests forgotten after Window without a span
	OpenDropped uint64 // open requests not tracked because MaxOpen was hit
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
	dead       bool
}

// traceInfo is what the trace-scope spans of one trace say.
type traceInfo struct {
	request string
	ref     SpanRef // the request span
	room    string
	end     int64
}

// roomReq is a request span holding a bootstrap room.
type roomReq struct {
	request string
	end     int64
}

// openTrace is a trace whose thread spans or slices referred to parents
// not yet received: spans still to come.
type openTrace struct {
	missing map[[8]byte]bool
	start   int64 // earliest start seen in it
	seen    int64 // wall time of its last span
}

const maxMissing = 64

// Index keeps recent spans, bounded in time and count. Safe for concurrent use.
type Index struct {
	cfg IndexConfig
	log *slog.Logger

	mu       sync.Mutex
	order    []*entry // arrival order, for eviction
	byRef    map[SpanRef]*entry
	threads  map[uint32][]*entry  // ScopeThread, by tid
	procs    map[uint32][]*entry  // ScopeProcess, by root pid (0: any)
	children map[SpanRef][]*entry // ScopeSlice, by parent
	traces   map[[16]byte]*traceInfo
	rooms    map[string][]roomReq
	open     map[[16]byte]*openTrace
	minOpen  int64 // earliest start among open traces; valid unless openDirty
	dirty    bool
	unknown  map[uint32]bool // pids whose host id was logged unknown
	forgot   int64           // when the process cache was last dropped
	stats    IndexStats
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
		cfg.MaxSpans = 100_000
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
	return &Index{cfg: cfg, log: log, byRef: map[SpanRef]*entry{}, threads: map[uint32][]*entry{}, procs: map[uint32][]*entry{},
		children: map[SpanRef][]*entry{}, traces: map[[16]byte]*traceInfo{}, rooms: map[string][]roomReq{},
		open: map[[16]byte]*openTrace{}, unknown: map[uint32]bool{}, minOpen: math.MaxInt64}
}

// Stats returns the counters.
func (x *Index) Stats() IndexStats {
	x.mu.Lock()
	defer x.mu.Unlock()
	s := x.stats
	s.Live = len(x.order)
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
	e := &entry{ref: ref, start: int64(sp.GetStartTimeUnixNano()), end: int64(sp.GetEndTimeUnixNano()), rule: r}
	if len(sp.GetParentSpanId()) == 8 {
		copy(e.parent[:], sp.GetParentSpanId())
	}
	if e.end < e.start {
		e.end = e.start
	}
	attrs := sp.GetAttributes()
	if r.Request != "" {
		e.request, _ = attr(attrs, r.Request)
	}
	if r.Room != "" {
		v, _ := attr(attrs, r.Room)
		e.room = normRoom(v)
	}
	switch r.Scope {
	case ScopeTrace:
		if e.request == "" && e.room == "" {
			return // the rule names neither: not a request span after all
		}
		ti := x.traces[ref.TraceID]
		if ti == nil {
			if len(x.traces) >= x.cfg.MaxSpans {
				x.stats.CapEvicts++ // bounded like the spans: this request stays unnamed
				return
			}
			ti = &traceInfo{}
			x.traces[ref.TraceID] = ti
		}
		if e.request != "" {
			ti.request, ti.ref = e.request, ref
		}
		if e.room != "" {
			ti.room = e.room
		}
		ti.end = max(ti.end, e.end)
		if ti.request != "" && ti.room != "" { // on one span (current) or two (October 2025)
			x.addRoom(ti.room, roomReq{request: ti.request, end: ti.end})
		}
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
		x.threads[e.tid] = append(x.threads[e.tid], e)
		x.waitFor(e, wall)
	case ScopeSlice:
		if e.parent == [8]byte{} {
			return // a root slice belongs to no thread
		}
		p := SpanRef{TraceID: ref.TraceID, SpanID: e.parent}
		x.children[p] = append(x.children[p], e)
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
		x.procs[e.root] = append(x.procs[e.root], e)
	}
	x.byRef[ref] = e
	x.order = append(x.order, e)
	x.stats.Indexed++
}

// arrived settles a span some open trace was waiting for.
func (x *Index) arrived(ref SpanRef) {
	ot := x.open[ref.TraceID]
	if ot == nil || !ot.missing[ref.SpanID] {
		return
	}
	delete(ot.missing, ref.SpanID)
	if len(ot.missing) == 0 {
		delete(x.open, ref.TraceID)
		x.dirty = true
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
		ot = &openTrace{missing: map[[8]byte]bool{}, start: e.start}
		x.open[e.ref.TraceID] = ot
	}
	if len(ot.missing) < maxMissing {
		ot.missing[e.parent] = true
	}
	if e.start < ot.start {
		ot.start = e.start
	}
	ot.seen = wall
	x.dirty = true
}

func (x *Index) addRoom(room string, r roomReq) {
	rs := x.rooms[room]
	for i := range rs {
		if rs[i].request == r.request {
			rs[i].end = max(rs[i].end, r.end)
			return
		}
	}
	if len(rs) < 4 && (len(rs) > 0 || len(x.rooms) < x.cfg.MaxSpans) {
		x.rooms[room] = append(rs, r)
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

// evict drops spans that ended before the window, the oldest past the cap,
// and open requests idle for the window.
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
	for k, ot := range x.open {
		if ot.seen < cut {
			delete(x.open, k)
			x.stats.OpenExpired++
			x.dirty = true
		}
	}
	for k, t := range x.traces {
		if t.end < cut {
			delete(x.traces, k)
		}
	}
	for k, rs := range x.rooms {
		if rs = slices.DeleteFunc(rs, func(r roomReq) bool { return r.end < cut }); len(rs) == 0 {
			delete(x.rooms, k)
		} else {
			x.rooms[k] = rs
		}
	}
	n := 0
	for n < len(x.order) && (x.order[n].end < cut || len(x.order)-n > x.cfg.MaxSpans) {
		if x.order[n].end < cut {
			x.stats.Evicted++
		} else {
			x.stats.CapEvicts++
		}
		x.order[n].dead = true
		delete(x.byRef, x.order[n].ref)
		n++
	}
	if n == 0 {
		return
	}
	x.order = slices.Delete(x.order, 0, n)
	dead := func(e *entry) bool { return e.dead }
	for k, es := range x.threads {
		if es = slices.DeleteFunc(es, dead); len(es) == 0 {
			delete(x.threads, k)
		} else {
			x.threads[k] = es
		}
	}
	for k, es := range x.procs {
		if es = slices.DeleteFunc(es, dead); len(es) == 0 {
			delete(x.procs, k)
		} else {
			x.procs[k] = es
		}
	}
	for k, es := range x.children {
		if es = slices.DeleteFunc(es, dead); len(es) == 0 {
			delete(x.children, k)
		} else {
			x.children[k] = es
		}
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

// threadHits are tid's thread spans covering t on pid's host.
func (x *Index) threadHits(tid, pid uint32, t int64) (hits []hit, otherHost bool) {
	es := x.threads[tid]
	if len(es) == 0 {
		return nil, false
	}
	host, known := x.cfg.Procs.HostID(pid)
	for _, e := range es {
		if e.start > t || t > e.end {
			continue
		}
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
		leaf, narrowed := x.innermost(e, t)
		hits = append(hits, hit{top: e, leaf: leaf, narrowed: narrowed})
	}
	return hits, otherHost
}

// innermost descends from e through the slices covering t; narrowed says a
// forward slice covered it.
func (x *Index) innermost(e *entry, t int64) (*entry, bool) {
	cur, narrowed := e, false
	for range 16 {
		var next *entry
		for _, c := range x.children[cur.ref] {
			if c.start <= t && t <= c.end && (next == nil || c.start > next.start) {
				next = c
			}
		}
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
// a known tree.
func (x *Index) procHits(pid uint32, t int64) (hits []hit, inInstance bool) {
	if len(x.procs) == 0 {
		return nil, false
	}
	cover := func(es []*entry) {
		for _, e := range es {
			if e.start <= t && t <= e.end {
				hits = append(hits, hit{top: e, leaf: e})
			}
		}
	}
	p := pid
	for range 64 {
		if es, ok := x.procs[p]; ok && p != 0 {
			cover(es)
			return hits, true
		}
		pp, ok := x.cfg.Procs.Parent(p)
		if !ok || pp == p {
			break
		}
		p = pp
	}
	cover(x.procs[0])
	return hits, false
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
// thread no span names), then process spans.
func (x *Index) Attribute(pid, tid uint32, t int64) Attribution {
	x.mu.Lock()
	defer x.mu.Unlock()
	open := x.openBefore(t)
	hits, other := x.threadHits(tid, pid, t)
	scope := ScopeOfThread
	if len(hits) == 0 && tid != pid {
		var o bool
		hits, o = x.threadHits(pid, pid, t)
		other = other || o
		scope = ScopeOfProcess
	}
	if len(hits) == 0 {
		var in bool
		hits, in = x.procHits(pid, t)
		scope = ScopeOfProcess
		if !in {
			scope = ScopeOfAny
		}
		if len(hits) == 0 && (in || len(x.procs[0]) > 0) {
			// vLLM exports llm_request when the request finishes: one
			// running now may cover the transfer.
			open = true
		}
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
	// One answer per request: its innermost covering span.
	type rq struct {
		key, id, room string
		h             hit
	}
	var rqs []rq
	for _, h := range hits {
		id, room, pending := x.request(h)
		open = open || pending
		key := id
		switch {
		case key != "":
		case room != "":
			key = "room:" + room
		default: // unnamed request: its trace is its identity
			key = "trace:" + string(h.top.ref.TraceID[:])
		}
		i := slices.IndexFunc(rqs, func(r rq) bool { return r.key == key })
		if i < 0 {
			rqs = append(rqs, rq{key: key, id: id, room: room, h: h})
		} else if h.leaf.start > rqs[i].h.leaf.start {
			rqs[i].h = h
		}
	}
	if len(rqs) == 1 {
		r := rqs[0]
		return Attribution{Rule: r.h.top.rule.Name, Scope: scope, Request: r.id, Room: r.room, Parent: r.h.leaf.ref, Open: open}
	}
	slices.SortFunc(rqs, func(a, b rq) int {
		if c := cmp.Compare(a.h.leaf.start, b.h.leaf.start); c != 0 {
			return c
		}
		return bytes.Compare(a.h.leaf.ref.SpanID[:], b.h.leaf.ref.SpanID[:])
	})
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
