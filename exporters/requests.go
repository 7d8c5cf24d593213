package exporters

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/otlpbridge"
)

// KVKind is what a request's KV bytes did: the lanewatch.kv.bytes.* keys
// and the kind label of lanewatch_request_kv_seconds.
type KVKind int

// KV kinds. H2D loads (prefix-cache hits, CPU-offloaded pools), D2H
// backups, RDMA into and out of this node (PD transfers), storage reads
// into the host pool (L3).
const (
	KVH2D KVKind = iota
	KVD2H
	KVRDMAIn
	KVRDMAOut
	KVStorage
	NumKVKinds
)

// KVKindNames are the kinds as attribute suffixes and label values.
var KVKindNames = [NumKVKinds]string{"h2d", "d2h", "rdma_in", "rdma_out", "storage"}

// RequestKV is one request's KV movement as its lanewatch.kv span says it:
// what moved on its behalf, how long the request waited on it, and how
// much of its time to first token that was.
type RequestKV struct {
	Request    string   // the request id ("" when the server names none: its trace is its identity)
	Trace      [16]byte // the trace of the request's span
	Span       [8]byte  // the request's span: the summary's parent
	Start, End int64    // the request span, Unix ns

	Bytes [NumKVKinds]uint64 // by kind, of the transfers attributed to this request alone
	// Wait is, by kind, the union of its transfers' intervals inside
	// [Start, End], shared ones included (the request waited on them
	// too); WaitAll the union over every kind.
	Wait      [NumKVKinds]time.Duration
	WaitAll   time.Duration
	Transfers int // transfers attributed to this request alone
	// Shared counts transfers that served a batch this request was in:
	// their bytes cannot be split between its requests and are in no
	// Bytes (SharedBytes holds them).
	Shared      int
	SharedBytes uint64
	// Incomplete: some of its transfers were attributed while a request
	// that may have covered them was still open (held past MaxHold, out of
	// memory, at exit), or its intervals were past their bound: the
	// figures may miss some.
	Incomplete bool
	// Unattributed counts transfers of its processes inside its span that
	// named no request (ambiguous, not covered): its figures may miss them.
	Unattributed int
	// NoRequestSpan: the request's own span never reached the index; the
	// summary hangs under its first transfer's parent, spanning its
	// transfers, and says no TTFT.
	NoRequestSpan bool

	// TTFT is the request's time to first token, TTFTSource where it comes
	// from (TTFT* constants); "" unknown. TTFTWait is the part of WaitAll
	// inside [Start, Start+TTFT].
	TTFT       time.Duration
	TTFTSource string
	TTFTWait   time.Duration

	RateBps     float64 // bytes (shared ones included) over WaitAll; 0 when unknown
	Bottleneck  string  // the path segment its largest transfer ran against, "" unknown
	CapacityBps float64 // that segment's capacity, bytes/s
	Findings    []string
}

// Where a request's TTFT comes from (lanewatch.kv.ttft_source).
const (
	// vLLM's llm_request attribute, the engine's own measurement.
	TTFTVLLM = "gen_ai.latency.time_to_first_token"
	// SGLang: from the request span's start to the end of its first
	// prefill_forward (the forward pass that samples the first token).
	TTFTSGLangPrefill = "prefill_forward_end"
	// SGLang with no prefill on this server (a PD decode server): to the
	// end of its first decode_forward.
	TTFTSGLangDecode = "decode_forward_end"
)

// KVBytes is every kind's bytes together (lanewatch.kv.bytes).
func (r *RequestKV) KVBytes() uint64 {
	var n uint64
	for _, b := range r.Bytes {
		n += b
	}
	return n
}

// TTFTShare is the share of the time to first token the request waited on
// KV movement; false when its TTFT is unknown.
func (r *RequestKV) TTFTShare() (float64, bool) {
	if r.TTFTSource == "" || r.TTFT <= 0 {
		return 0, false
	}
	return min(float64(r.TTFTWait)/float64(r.TTFT), 1), true
}

// RequestSink receives each request's summary once, from the span
// exporter's goroutine; it must not keep r past the call.
type RequestSink interface {
	RequestKV(r *RequestKV)
}

// Bounds of the per-request summaries: requests gathered at once (past it
// the oldest is summarised early, counted) and disjoint intervals kept per
// kind and in all (past either the last one grows to cover the next: the
// wait is then an upper bound, and said so; 16 MiB at most).
const (
	maxRequests       = 16_384
	maxIntervals      = 4096
	maxIntervalsTotal = 1 << 20
	maxNoRequest      = 8192 // recent transfers that named no request, to say a summary is partial
)

// reqKey names one request's summary: its trace, and its id (a request
// whose traces are joined by a bootstrap room has one summary per trace:
// each trace has its own request span).
type reqKey struct {
	trace   [16]byte
	request string
}

// intervals is a union of intervals (Unix ns) as transfers add them,
// mostly in order: one that starts inside the last grows it.
type intervals struct {
	iv     []correlate.Interval
	capped bool
}

// add adds [from, to); left is how many more intervals every request
// together may keep.
func (u *intervals) add(from, to int64, left *int) {
	v := correlate.Interval{Lo: uint64(from), Hi: uint64(max(from, to))}
	n := len(u.iv)
	switch {
	case n > 0 && v.Lo >= u.iv[n-1].Lo && v.Lo <= u.iv[n-1].Hi:
		u.iv[n-1].Hi = max(u.iv[n-1].Hi, v.Hi)
	case n > 0 && (n >= maxIntervals || *left <= 0):
		last := &u.iv[n-1]
		last.Lo, last.Hi = min(last.Lo, v.Lo), max(last.Hi, v.Hi)
		u.capped = true
	default:
		u.iv = append(u.iv, v)
		*left--
	}
}

// covered is how much of [lo, hi) (Unix ns) the union of iv covers.
func covered(iv []correlate.Interval, lo, hi int64) time.Duration {
	if hi <= lo {
		return 0
	}
	return time.Duration(correlate.CoveredNs(iv, uint64(max(lo, 0)), uint64(hi)))
}

// request gathers one request's transfers until its summary is made.
type request struct {
	kv      RequestKV
	known   bool               // kv's request span was found
	parent  otlpbridge.SpanRef // its first transfer's parent: the summary's when the request span never comes
	first   int64              // wall ns of its first transfer's start, and its last one's end
	last    int64
	iv      [NumKVKinds]intervals
	pids    []uint32 // the processes of its transfers (a few)
	largest correlate.Transfer
	// the pageable-copy and fragmentation facts of its host copies
	page  correlate.PageableFacts
	sizes [2]correlate.SizeHistogram // H2D, D2H
}

// DirStorageRead is the direction of a storage read queued by
// Spans.StorageRead: it only counts in its request's summary.
const DirStorageRead = "storage_read"

// StorageRead queues a read of bytes from a block device into process
// pid's pinned pool, returned at CLOCK_MONOTONIC ns at, for the summary of
// the request it served (lanewatch.kv.bytes.storage). It makes no span; the
// read's duration is not known, so it adds no wait.
func (s *Spans) StorageRead(pid, tid uint32, at, bytes uint64) {
	if s.cfg.Mode == SpansOff {
		return
	}
	s.mu.Lock()
	s.stats.StorageReads++
	s.pending = append(s.pending, correlate.Transfer{PID: pid, TID: tid, Direction: DirStorageRead, Bytes: bytes, SubmitNs: at,
		CompleteNs: at, BatchIndex: -1, Layer: -1})
	s.mu.Unlock()
}

// kvKind is what a transfer did for its request; false: it is no KV path
// movement (a copy within a GPU or within host memory, or of unknown
// direction).
func kvKind(t *correlate.Transfer) (KVKind, bool) {
	switch t.Direction {
	case correlate.DirH2D:
		return KVH2D, true
	case correlate.DirD2H:
		return KVD2H, true
	case correlate.DirRDMAWrite, correlate.DirWriteImm, correlate.DirSend:
		return KVRDMAOut, true
	case correlate.DirRDMARead, correlate.DirRecv:
		return KVRDMAIn, true
	case DirStorageRead:
		return KVStorage, true
	}
	return 0, false
}

// add counts one transfer attributed to this request alone.
func (r *request) add(t *correlate.Transfer, from, to int64, incomplete bool, left *int) {
	r.kv.Transfers++
	r.kv.Incomplete = r.kv.Incomplete || incomplete
	r.span(t.PID, from, to)
	k, ok := kvKind(t)
	if !ok {
		return
	}
	r.kv.Bytes[k] += t.Bytes
	r.iv[k].add(from, to, left)
	if t.Bytes > r.largest.Bytes {
		r.largest = *t
	}
	if k != KVH2D && k != KVD2H {
		return
	}
	r.page.HostBytes += t.Bytes
	switch {
	case t.HostMem != event.MemPageable || correlate.ElementSized(t.Bytes):
	case correlate.MetadataSized(t.Bytes):
		r.page.Metadata++
		r.page.MetadataBytes += t.Bytes
	default:
		r.page.Bulk++
		r.page.BulkBytes += t.Bytes
		if !slices.Contains(r.page.APIs, t.API) && len(r.page.APIs) < 4 {
			r.page.APIs = append(r.page.APIs, t.API)
		}
	}
	if !t.BytesUnknown {
		r.sizes[k].Add(t.Bytes)
	}
}

// read counts a storage read into its pool for this request.
func (r *request) read(t *correlate.Transfer, at int64) {
	r.kv.Bytes[KVStorage] += t.Bytes
	r.span(t.PID, at, at)
}

// share counts a transfer that served a batch this request was in.
func (r *request) share(t *correlate.Transfer, from, to int64, left *int) {
	r.kv.Shared++
	r.kv.SharedBytes += t.Bytes
	r.span(t.PID, from, to)
	if k, ok := kvKind(t); ok {
		r.iv[k].add(from, to, left)
	}
}

func (r *request) span(pid uint32, from, to int64) {
	if r.first == 0 || from < r.first {
		r.first = from
	}
	r.last = max(r.last, to)
	if !slices.Contains(r.pids, pid) && len(r.pids) < 8 {
		r.pids = append(r.pids, pid)
	}
}

func (r *request) setSpan(rs otlpbridge.RequestSpan) {
	r.known = true
	r.kv.Span, r.kv.Start, r.kv.End = rs.Ref.SpanID, rs.Start, rs.End
	if rs.TTFTFrom != "" {
		r.kv.TTFT, r.kv.TTFTSource = time.Duration(rs.TTFT), ttftSource(rs.TTFTFrom)
	}
}

func ttftSource(from string) string {
	switch from {
	case otlpbridge.SlicePrefill:
		return TTFTSGLangPrefill
	case otlpbridge.SliceDecode:
		return TTFTSGLangDecode
	}
	return TTFTVLLM
}

// finish computes the waits (inside the request span, or the transfers'
// own extent when it never came) and what applied to the transfers.
func (r *request) finish(paths PathResolver, active []correlate.Finding) {
	kv := &r.kv
	if !r.known {
		kv.Start, kv.End = r.first, r.last
	}
	var all []correlate.Interval
	capped := false
	for k := range r.iv {
		kv.Wait[k] = covered(r.iv[k].iv, kv.Start, kv.End)
		all = append(all, r.iv[k].iv...)
		capped = capped || r.iv[k].capped
	}
	kv.WaitAll = covered(all, kv.Start, kv.End)
	if kv.TTFTSource != "" {
		kv.TTFTWait = covered(all, kv.Start, kv.Start+int64(kv.TTFT))
	}
	if kv.WaitAll > 0 {
		kv.RateBps = float64(kv.KVBytes()+kv.SharedBytes) / kv.WaitAll.Seconds()
	}
	if paths != nil && r.largest.Bytes > 0 {
		if p, ok := paths.Path(&r.largest); ok && p.Bottleneck != "" {
			kv.Bottleneck, kv.CapacityBps = p.Bottleneck, p.CapacityBps
		}
	}
	var fs []string
	if len(r.pids) > 0 {
		r.page.PID = r.pids[0]
		if f := correlate.PageableCopies(r.page); f != nil && f.Severity != correlate.SevInfo {
			fs = append(fs, f.Rule+":"+string(f.Severity))
		}
		for i, dir := range []string{correlate.DirH2D, correlate.DirD2H} {
			if w := kv.Wait[i]; w > 0 {
				if f := correlate.Fragmentation(r.pids[0], dir, r.sizes[i], float64(kv.Bytes[i])/float64(w)); f != nil && f.Severity != correlate.SevInfo {
					fs = append(fs, f.Rule+":"+string(f.Severity))
				}
			}
		}
	}
	for _, f := range active {
		if f.Severity != correlate.SevInfo && slices.ContainsFunc(r.pids, func(pid uint32) bool { return namesPID(f.Subject, pid) }) {
			fs = append(fs, f.Rule+":"+string(f.Severity))
		}
	}
	slices.Sort(fs)
	kv.Findings = slices.Compact(fs)
	kv.Incomplete = kv.Incomplete || capped
}

// namesPID reports whether a finding is about process pid: the rules
// name a process's findings "pid N …" (correlate's subjects).
func namesPID(subject string, pid uint32) bool {
	rest, ok := strings.CutPrefix(subject, "pid "+strconv.FormatUint(uint64(pid), 10))
	return ok && (rest == "" || rest[0] < '0' || rest[0] > '9')
}

// noRequest is a recent transfer that named no request: a summary counts
// those of its processes inside its span as unattributed.
type noRequest struct {
	pid uint32
	at  int64
}

// gather returns the summary being gathered for the request of span ref,
// starting one (and, past maxRequests, summing up the oldest early).
func (s *Spans) gather(ref otlpbridge.SpanRef, id string) *request {
	k := reqKey{ref.TraceID, id}
	if r := s.reqs[k]; r != nil {
		return r
	}
	r := &request{parent: ref}
	r.kv.Request, r.kv.Trace = id, ref.TraceID
	s.reqs[k] = r
	s.reqOrder = append(s.reqOrder, k)
	return r
}

// noRequest notes a transfer that named no request.
func (s *Spans) noRequest(pid uint32, at int64) {
	if len(s.reqs) == 0 && s.cfg.Requests == nil && s.cfg.Mode != SpansSummary {
		return // no summary to tell
	}
	if len(s.noReq) < maxNoRequest {
		s.noReq = append(s.noReq, noRequest{pid, at})
		return
	}
	s.noReq[s.noReqAt] = noRequest{pid, at}
	s.noReqAt = (s.noReqAt + 1) % maxNoRequest
}

// requestSpan asks the attributor for the request's own span.
func (s *Spans) requestSpan(ref otlpbridge.SpanRef) (otlpbridge.RequestSpan, bool) {
	rs, ok := s.cfg.Attributor.(interface {
		RequestSpan(otlpbridge.SpanRef) (otlpbridge.RequestSpan, bool)
	})
	if !ok {
		return otlpbridge.RequestSpan{}, false
	}
	return rs.RequestSpan(ref)
}

// summarize sums up the requests that are settled: their span has ended
// before cut (every transfer submitted in it has left the hold) and no
// transfer waiting for an open request names them; those whose request
// span never came once their last transfer is older than maxCut; every
// one when flush. It returns the summaries made and how many of them were
// early (the bound).
func (s *Spans) summarize(cut, maxCut int64, flush bool) (made, early int) {
	if len(s.reqs) == 0 {
		return 0, 0
	}
	var busy map[reqKey]bool
	if !flush {
		for i := range s.waiting {
			a := &s.waiting[i].a
			if a.Request != "" || a.Parent.Valid() {
				if busy == nil {
					busy = map[reqKey]bool{}
				}
				busy[reqKey{a.Parent.TraceID, a.Request}] = true
			}
		}
	}
	s.mu.Lock()
	active := s.active
	s.mu.Unlock()
	over := len(s.reqs) - maxRequests
	kept := s.reqOrder[:0]
	for _, k := range s.reqOrder {
		r := s.reqs[k]
		if !r.known {
			if rs, ok := s.requestSpan(r.parent); ok {
				r.setSpan(rs)
			}
		}
		switch {
		case flush:
		case over > 0:
			over--
			early++
		case r.known && r.kv.End <= cut && !busy[k]:
		case !r.known && r.last <= maxCut:
		default:
			kept = append(kept, k)
			continue
		}
		r.finish(s.cfg.Paths, active)
		for k := range r.iv {
			s.ivLeft += len(r.iv[k].iv)
		}
		r.kv.NoRequestSpan = !r.known
		r.kv.Unattributed = s.unattributedIn(r)
		if s.cfg.Requests != nil {
			s.cfg.Requests.RequestKV(&r.kv)
		}
		s.summary(r)
		made++
		delete(s.reqs, k)
	}
	clear(s.reqOrder[len(kept):])
	s.reqOrder = kept
	return made, early
}

// unattributedIn counts the recent transfers of r's processes that named no
// request inside r's span.
func (s *Spans) unattributedIn(r *request) int {
	n := 0
	for _, u := range s.noReq {
		if u.at >= r.kv.Start && u.at <= r.kv.End && slices.Contains(r.pids, u.pid) {
			n++
		}
	}
	return n
}

// Summary span attributes (docs/operating.md, "Traces").
const (
	AttrKVBytes        = attribute.Key("lanewatch.kv.bytes")
	AttrKVWait         = attribute.Key("lanewatch.kv.wait_seconds")
	AttrKVTransfers    = attribute.Key("lanewatch.kv.transfers")
	AttrKVShared       = attribute.Key("lanewatch.kv.shared_transfers")
	AttrKVSharedBytes  = attribute.Key("lanewatch.kv.shared_bytes")
	AttrKVUnattributed = attribute.Key("lanewatch.kv.unattributed_transfers")
	AttrKVIncomplete   = attribute.Key("lanewatch.kv.incomplete")
	AttrKVNoReqSpan    = attribute.Key("lanewatch.kv.request_span_missing")
	AttrKVTTFT         = attribute.Key("lanewatch.kv.ttft_seconds")
	AttrKVTTFTSource   = attribute.Key("lanewatch.kv.ttft_source")
	AttrKVTTFTWait     = attribute.Key("lanewatch.kv.ttft_wait_seconds")
	AttrKVTTFTShare    = attribute.Key("lanewatch.kv.ttft_share")
	AttrKVRate         = attribute.Key("lanewatch.kv.rate_bytes_per_second")
	AttrKVFindings     = attribute.Key("lanewatch.kv.findings")
)

// summary makes r's lanewatch.kv span: a child of the request's span (or of
// its first transfer's parent when that never came), over the request.
func (s *Spans) summary(r *request) {
	kv := &r.kv
	parent := otlpbridge.SpanRef{TraceID: kv.Trace, SpanID: kv.Span}
	if !r.known {
		parent = r.parent
	}
	ctx := trace.ContextWithRemoteSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: parent.TraceID, SpanID: parent.SpanID, TraceFlags: trace.FlagsSampled, Remote: true}))
	at := []attribute.KeyValue{
		AttrKVBytes.Int64(int64(kv.KVBytes())),
		AttrKVWait.Float64(kv.WaitAll.Seconds()),
		AttrKVTransfers.Int(kv.Transfers),
	}
	if kv.Request != "" {
		at = append(at, AttrRequest.String(kv.Request))
	}
	for k, name := range KVKindNames {
		if KVKind(k) == KVStorage && !s.cfg.StorageReads {
			continue // not traced: unknown, not zero
		}
		at = append(at, attribute.Int64("lanewatch.kv.bytes."+name, int64(kv.Bytes[k])))
		if kv.Bytes[k] > 0 {
			at = append(at, attribute.Float64("lanewatch.kv.wait_seconds."+name, kv.Wait[k].Seconds()))
		}
	}
	if kv.Shared > 0 {
		at = append(at, AttrKVShared.Int(kv.Shared), AttrKVSharedBytes.Int64(int64(kv.SharedBytes)))
	}
	if kv.Unattributed > 0 {
		at = append(at, AttrKVUnattributed.Int(kv.Unattributed))
	}
	if kv.Incomplete {
		at = append(at, AttrKVIncomplete.Bool(true))
	}
	if kv.NoRequestSpan {
		at = append(at, AttrKVNoReqSpan.Bool(true))
	}
	if share, ok := kv.TTFTShare(); ok {
		at = append(at, AttrKVTTFT.Float64(kv.TTFT.Seconds()), AttrKVTTFTSource.String(kv.TTFTSource),
			AttrKVTTFTWait.Float64(kv.TTFTWait.Seconds()), AttrKVTTFTShare.Float64(share))
	}
	if kv.RateBps > 0 {
		at = append(at, AttrKVRate.Float64(kv.RateBps))
	}
	if kv.Bottleneck != "" {
		at = append(at, AttrBottleneck.String(kv.Bottleneck), AttrCapacity.Float64(kv.CapacityBps))
	}
	if len(kv.Findings) > 0 {
		at = append(at, AttrKVFindings.StringSlice(kv.Findings))
	}
	_, span := s.cfg.Tracer.Start(ctx, "lanewatch.kv", trace.WithTimestamp(time.Unix(0, kv.Start)),
		trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(at...))
	span.End(trace.WithTimestamp(time.Unix(0, kv.End)))
}
