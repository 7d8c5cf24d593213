package otlpbridge

import (
	"bytes"
	"cmp"
	"slices"
	"strconv"
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

// Attribution is the answer for one transfer.
type Attribution struct {
	Rule      string  // the rule of the span(s) that matched; "" none
	Request   string  // the request id; "" when unknown or a batch
	Parent    SpanRef // the span the transfer becomes a child of (thread span, or the request span)
	Requests  []string
	Links     []SpanRef // batch: one span per request, capped like Requests
	Batch     int       // number of distinct requests whose spans cover the transfer, when > 1
	Truncated bool      // Requests/Links were capped
}

// IndexConfig bounds the index.
type IndexConfig struct {
	Rules    []Rule        // default DefaultRules()
	Window   time.Duration // spans that ended longer ago are evicted (default 2 min)
	MaxSpans int           // past it the oldest are evicted (default 100 000)
	MaxBatch int           // request ids listed for a batch (default 8)
}

// IndexStats are the index's counters.
type IndexStats struct {
	Spans     uint64 // spans seen
	Indexed   uint64 // ... that matched a rule
	Evicted   uint64 // indexed spans dropped by age
	CapEvicts uint64 // indexed spans dropped because MaxSpans was hit
	Live      int    // indexed spans now
}

type entry struct {
	ref        SpanRef
	start, end int64 // Unix ns
	pid, tid   uint32
	request    string
	rule       string
	dead       bool
}

// Index keeps recent spans, bounded in time and count. Safe for concurrent use.
type Index struct {
	cfg IndexConfig

	mu      sync.Mutex
	order   []*entry             // arrival order, for eviction
	threads map[uint32][]*entry  // ScopeThread, by tid
	procs   map[uint32][]*entry  // ScopeProcess, by pid (0: any)
	traces  map[[16]byte]traceRq // request named by a ScopeTrace span
	stats   IndexStats
}

type traceRq struct {
	id   string
	span SpanRef
	end  int64
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
	return &Index{cfg: cfg, threads: map[uint32][]*entry{}, procs: map[uint32][]*entry{}, traces: map[[16]byte]traceRq{}}
}

// Stats returns the counters.
func (x *Index) Stats() IndexStats {
	x.mu.Lock()
	defer x.mu.Unlock()
	s := x.stats
	s.Live = len(x.order)
	return s
}

// Add indexes the spans of one export request's resource spans.
func (x *Index) Add(rss []*tracepb.ResourceSpans) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, rs := range rss {
		var res []*commonpb.KeyValue
		if rs.GetResource() != nil {
			res = rs.GetResource().GetAttributes()
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				x.stats.Spans++
				x.add(sp, res)
			}
		}
	}
	x.evict(time.Now().UnixNano())
}

func (x *Index) add(sp *tracepb.Span, res []*commonpb.KeyValue) {
	var ref SpanRef
	if len(sp.GetTraceId()) != 16 || len(sp.GetSpanId()) != 8 {
		return
	}
	copy(ref.TraceID[:], sp.GetTraceId())
	copy(ref.SpanID[:], sp.GetSpanId())
	for i := range x.cfg.Rules {
		r := &x.cfg.Rules[i]
		if !r.Span.MatchString(sp.GetName()) {
			continue
		}
		var req string
		if r.Request != "" {
			v, ok := attr(sp.GetAttributes(), r.Request)
			if !ok {
				continue
			}
			req = v
		}
		e := &entry{ref: ref, start: int64(sp.GetStartTimeUnixNano()), end: int64(sp.GetEndTimeUnixNano()), request: req, rule: r.Name}
		if e.end < e.start {
			e.end = e.start
		}
		switch r.Scope {
		case ScopeTrace:
			x.traces[ref.TraceID] = traceRq{id: req, span: ref, end: e.end}
			x.stats.Indexed++
			return
		case ScopeThread:
			v, ok := attr(sp.GetAttributes(), r.Thread)
			if !ok {
				continue
			}
			tid, err := strconv.ParseUint(v, 10, 32)
			if err != nil || tid == 0 {
				continue
			}
			e.tid = uint32(tid)
			x.threads[e.tid] = append(x.threads[e.tid], e)
		case ScopeProcess:
			if r.Process != "" {
				v, ok := attr(sp.GetAttributes(), r.Process)
				if !ok {
					v, ok = attr(res, r.Process)
				}
				if ok {
					if pid, err := strconv.ParseUint(v, 10, 32); err == nil {
						e.pid = uint32(pid)
					}
				}
			}
			x.procs[e.pid] = append(x.procs[e.pid], e)
		}
		x.order = append(x.order, e)
		x.stats.Indexed++
		return
	}
}

// evict drops spans that ended before the window, and the oldest past the cap.
func (x *Index) evict(now int64) {
	cut := now - int64(x.cfg.Window)
	n := 0
	for n < len(x.order) && (x.order[n].end < cut || len(x.order)-n > x.cfg.MaxSpans) {
		if x.order[n].end < cut {
			x.stats.Evicted++
		} else {
			x.stats.CapEvicts++
		}
		x.order[n].dead = true
		n++
	}
	if n == 0 {
		return
	}
	x.order = slices.Delete(x.order, 0, n)
	for k, es := range x.threads {
		if es = slices.DeleteFunc(es, func(e *entry) bool { return e.dead }); len(es) == 0 {
			delete(x.threads, k)
		} else {
			x.threads[k] = es
		}
	}
	for k, es := range x.procs {
		if es = slices.DeleteFunc(es, func(e *entry) bool { return e.dead }); len(es) == 0 {
			delete(x.procs, k)
		} else {
			x.procs[k] = es
		}
	}
	for k, t := range x.traces {
		if t.end < cut {
			delete(x.traces, k)
		}
	}
}

// Attribute answers for a transfer submitted at Unix ns t on thread tid of
// process pid. Thread spans are asked first; process-wide spans only when no
// thread span covers t.
func (x *Index) Attribute(pid, tid uint32, t int64) Attribution {
	x.mu.Lock()
	defer x.mu.Unlock()
	var hits []*entry
	for _, e := range x.threads[tid] {
		if e.start <= t && t <= e.end {
			hits = append(hits, e)
		}
	}
	if len(hits) == 0 {
		for _, key := range []uint32{pid, 0} {
			for _, e := range x.procs[key] {
				if e.start <= t && t <= e.end {
					hits = append(hits, e)
				}
			}
		}
	}
	if len(hits) == 0 {
		return Attribution{}
	}
	// One answer per request: its innermost span (the latest start).
	type rq struct {
		id string
		e  *entry
	}
	var rqs []rq
	for _, e := range hits {
		id := e.request
		if id == "" {
			id = x.traces[e.ref.TraceID].id
		}
		key := id
		if key == "" { // unnamed request: its trace is its identity
			key = "trace:" + string(e.ref.TraceID[:])
		}
		i := slices.IndexFunc(rqs, func(r rq) bool { return r.id == key })
		if i < 0 {
			rqs = append(rqs, rq{id: key, e: e})
		} else if e.start > rqs[i].e.start {
			rqs[i].e = e
		}
	}
	if len(rqs) == 1 {
		e := rqs[0].e
		a := Attribution{Rule: e.rule, Request: e.request, Parent: e.ref}
		if a.Request == "" {
			a.Request = x.traces[e.ref.TraceID].id
		}
		return a
	}
	slices.SortFunc(rqs, func(a, b rq) int {
		if c := cmp.Compare(a.e.start, b.e.start); c != 0 {
			return c
		}
		return bytes.Compare(a.e.ref.SpanID[:], b.e.ref.SpanID[:])
	})
	a := Attribution{Rule: rqs[0].e.rule, Batch: len(rqs)}
	for _, r := range rqs {
		if len(a.Requests) == x.cfg.MaxBatch {
			a.Truncated = true
			break
		}
		id := r.id
		if len(id) > 6 && id[:6] == "trace:" {
			id = ""
		}
		a.Requests = append(a.Requests, id)
		a.Links = append(a.Links, r.e.ref)
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
