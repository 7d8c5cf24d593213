package otlpbridge

import (
	"fmt"
	"math"
	"runtime"
	"slices"
	"strconv"
	"testing"
	"time"

	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/lanewatch/lanewatch/otlpbridge/shapes"
)

// fakeProcs is a host's processes: machine ids as each process sees them
// and parents.
type fakeProcs struct {
	hosts   map[uint32]string
	parents map[uint32]uint32
}

func (f fakeProcs) HostID(pid uint32) (string, bool) { h, ok := f.hosts[pid]; return h, ok }
func (f fakeProcs) Parent(pid uint32) (uint32, bool) { p, ok := f.parents[pid]; return p, ok }

func sref(r shapes.Ref) SpanRef { return SpanRef{TraceID: r.TraceID, SpanID: r.SpanID} }

const (
	hostA = "8f3c1e0b9a7d4c2e91f0a6b5c4d3e2f1" // this host's /etc/machine-id
	hostB = "17d2e3f4a5b6c7d8e9f0a1b2c3d4e5f6" // the decode host's
)

// base is the fixtures' time origin; the index is told arrival times
// explicitly, so nothing depends on the clock.
var base = time.Unix(1_760_000_000, 0)

func at(ms int64) int64 { return base.UnixNano() + ms*int64(time.Millisecond) }

// add indexes spans of one process, arriving at ms.
func add(x *Index, ms int64, res *tracepb.ResourceSpans) {
	x.AddAt([]*tracepb.ResourceSpans{res}, time.Unix(0, at(ms)))
}

func sg(spans ...*tracepb.Span) *tracepb.ResourceSpans {
	return shapes.Batch(shapes.SGLangResource(), shapes.SGLangScope, spans...)
}

// want is what one transfer must be attributed to.
type want struct {
	rule, scope, request, room string
	parent                     shapes.Ref // zero: not checked
	batch                      []string   // batch request ids in order
	open                       bool
	reason                     string
}

func check(t *testing.T, name string, a Attribution, w want) {
	t.Helper()
	var errs []string
	if a.Rule != w.rule || a.Scope != w.scope || a.Request != w.request || a.Room != w.room || a.Open != w.open || a.Reason != w.reason {
		errs = append(errs, fmt.Sprintf("rule/scope/request/room/open/reason %q/%q/%q/%q/%v/%q, want %q/%q/%q/%q/%v/%q",
			a.Rule, a.Scope, a.Request, a.Room, a.Open, a.Reason, w.rule, w.scope, w.request, w.room, w.open, w.reason))
	}
	if w.parent != (shapes.Ref{}) && a.Parent != sref(w.parent) {
		errs = append(errs, fmt.Sprintf("parent %x/%x, want %x/%x", a.Parent.TraceID, a.Parent.SpanID, w.parent.TraceID, w.parent.SpanID))
	}
	if !slices.Equal(a.Requests, w.batch) || a.Batch != len(w.batch) {
		errs = append(errs, fmt.Sprintf("batch %d %q, want %q", a.Batch, a.Requests, w.batch))
	}
	for _, e := range errs {
		t.Errorf("%s: %s", name, e)
	}
}

// TestSGLangCurrentUnified: a unified server of the current release. The
// request span is in the tokenizer process and ends last; the scheduler's
// thread spans (pid = the scheduler thread, the process's main thread) span
// arrival to completion, queueing included; prefill_forward and
// decode_forward (decode_loop inside) narrow them. Two requests: A is in
// its prefill while B waits, then both decode in one batch.
func TestSGLangCurrentUnified(t *testing.T) {
	ids := shapes.NewIDs(1)
	s := shapes.SGLang{Version: shapes.SGLangCurrent, IDs: ids}
	sched := shapes.SGLangThread{Label: "Scheduler", TID: 4242, HostID: hostA, TP: shapes.Rank(0), PP: shapes.Rank(0)}
	tok := shapes.SGLangThread{Label: "Tokenizer", TID: 4100, HostID: hostA}
	x := NewIndex(IndexConfig{Procs: fakeProcs{hosts: map[uint32]string{4242: hostA, 4100: hostA}}})

	type req struct {
		rid                  string
		root, thread, pf, df shapes.Ref
		loops                []shapes.Ref
		spans                []*tracepb.Span
	}
	mk := func(rid string, arrive, fwd, prefilled, done int64) *req {
		r := &req{rid: rid}
		var rs []*tracepb.Span
		r.root, rs = s.Request("unified", rid, 0, nil, at(arrive), at(done+2))
		tokRef, tokSpan := s.Thread(r.root, tok, at(arrive), at(arrive+1))
		_, tokenize := s.Slice(tokRef, "tokenize", at(arrive), at(arrive+1))
		var th, rp, wt, pf, df *tracepb.Span
		r.thread, th = s.Thread(r.root, sched, at(arrive+1), at(done))
		_, rp = s.Slice(r.thread, "request_process", at(arrive+1), at(arrive+1))
		_, wt = s.Slice(r.thread, "prefill_waiting", at(arrive+1), at(fwd))
		r.pf, pf = s.Slice(r.thread, "prefill_forward", at(fwd), at(prefilled))
		r.df, df = s.Slice(r.thread, "decode_forward", at(prefilled), at(done))
		r.spans = append(rs, tokSpan, tokenize, th, rp, wt, pf, df)
		for i := prefilled; i+10 <= done; i += 10 {
			ref, loop := s.Slice(r.df, "decode_loop", at(i), at(i+10), shapes.Int("decode_ct", (i-prefilled)/10))
			r.loops = append(r.loops, ref)
			r.spans = append(r.spans, loop)
		}
		return r
	}
	a := mk("1a2b3c4d5e6f47a8b9c0d1e2f3a4b5c6", 0, 10, 100, 200)
	b := mk("9f8e7d6c5b4a49382716f5e4d3c2b1a0", 5, 100, 150, 230)
	for _, r := range []*req{a, b} {
		add(x, 300, sg(r.spans...))
	}
	// A's prefill: B waits on the same thread and does not join.
	check(t, "A prefill", x.Attribute(4242, 4242, at(50)), want{rule: "sglang-thread", scope: ScopeOfThread, request: a.rid, parent: a.pf})
	// Both decode: a batch of two, linked to each one's decode_loop.
	check(t, "batch decode", x.Attribute(4242, 4242, at(165)), want{rule: "sglang-thread", scope: ScopeOfThread,
		batch: []string{a.rid, b.rid}})
	if at := x.Attribute(4242, 4242, at(165)); !slices.Equal(at.Links, []SpanRef{sref(a.loops[6]), sref(b.loops[1])}) {
		t.Errorf("batch links %x, want A's and B's decode_loop", at.Links)
	}
	// Only B decodes: A's thread span ended.
	check(t, "B alone", x.Attribute(4242, 4242, at(215)), want{rule: "sglang-thread", scope: ScopeOfThread, request: b.rid, parent: b.loops[6]})
	// A tokenizer transfer belongs to its thread's request.
	check(t, "tokenizer", x.Attribute(4100, 4100, at(0)), want{rule: "sglang-thread", scope: ScopeOfThread, request: a.rid})
	// Another thread of the process, no span of its own (older releases'
	// forward thread): the scheduler's spans, process scope.
	check(t, "other thread", x.Attribute(4242, 4250, at(50)), want{rule: "sglang-thread", scope: ScopeOfProcess, request: a.rid, parent: a.pf})
	check(t, "after", x.Attribute(4242, 4242, at(400)), want{reason: ReasonNotCovered})
}

// TestSGLangCurrentDisaggregated: prefill on this host, decode on another,
// both exporting here; their scheduler threads happen to have the same id.
// The decode host's spans never name a local thread. mooncake's Sender
// trace (its rid the bootstrap room) joins the prefill request by the room;
// its worker thread registered no label.
func TestSGLangCurrentDisaggregated(t *testing.T) {
	ids := shapes.NewIDs(2)
	s := shapes.SGLang{Version: shapes.SGLangCurrent, IDs: ids}
	const room = 0x5a3c9e1f77d2b4
	pre := shapes.SGLangThread{Label: "Prefill Scheduler", TID: 7000, HostID: hostA, TP: shapes.Rank(0), PP: shapes.Rank(0), DP: shapes.Rank(0)}
	dec := shapes.SGLangThread{Label: "Decode Scheduler", TID: 7000, HostID: hostB, TP: shapes.Rank(0), PP: shapes.Rank(0)}
	worker := shapes.SGLangThread{Label: "unknown", TID: 7011, HostID: hostA}
	client := shapes.Ref{TraceID: ids.Trace(), SpanID: ids.Span()}
	procs := fakeProcs{hosts: map[uint32]string{7000: hostA, 7011: hostA}}
	x := NewIndex(IndexConfig{Procs: procs})

	const rid = "c0ffee00112233445566778899aabbcc"
	preReq, preSpans := s.Request("prefill", rid, room, &client, at(0), at(120))
	preTh, th := s.Thread(preReq, pre, at(1), at(110))
	prefill, pf := s.Slice(preTh, "prefill_forward", at(20), at(60))
	_, kv := s.Slice(preTh, "prefill_transfer_kv_cache", at(60), at(110))
	decReq, decSpans := s.Request("decode", rid, room, &client, at(2), at(400))
	decTh, dth := s.Thread(decReq, dec, at(3), at(390))
	_, df := s.Slice(decTh, "decode_forward", at(115), at(390))

	mc, mcSpans := s.MooncakeSender(room, at(55), at(105))
	mcTh, mth := s.Thread(mc, pre, at(55), at(105))
	wTh, wth := s.Thread(mc, worker, at(61), at(100))
	send, ws := s.Slice(wTh, "mooncake_worker_send", at(61), at(100))
	_ = mcTh

	// mooncake's spans end first: its worker copies wait for the request.
	add(x, 106, sg(append(mcSpans, mth, wth, ws)...))
	check(t, "mooncake before the request", x.Attribute(7000, 7011, at(70)),
		want{rule: "sglang-thread", scope: ScopeOfThread, room: "0x5a3c9e1f77d2b4", parent: send, open: true})
	add(x, 121, sg(append(preSpans, th, pf, kv)...))
	add(x, 401, sg(append(decSpans, dth, df)...))
	check(t, "mooncake worker", x.Attribute(7000, 7011, at(70)),
		want{rule: "sglang-thread", scope: ScopeOfThread, request: rid, room: "0x5a3c9e1f77d2b4", parent: send})
	check(t, "prefill forward", x.Attribute(7000, 7000, at(30)),
		want{rule: "sglang-thread", scope: ScopeOfThread, request: rid, room: "0x5a3c9e1f77d2b4", parent: prefill})
	// The decode host's thread 7000 is not this host's: not used.
	check(t, "decode host's thread", x.Attribute(7000, 7000, at(200)), want{reason: ReasonOtherHost})
	// With the process's host unknown (no machine-id in its root), every
	// host's thread spans are used, and said so in the log.
	y := NewIndex(IndexConfig{Procs: fakeProcs{}})
	add(y, 401, sg(append(decSpans, dth, df)...))
	check(t, "host unknown", y.Attribute(7000, 7000, at(200)), want{rule: "sglang-thread", scope: ScopeOfThread, request: rid, room: "0x5a3c9e1f77d2b4"})
}

// TestSGLangHiCache: --trace-modules hicache adds separate traces on
// background threads, pid the native thread id; the prefetch transfer names
// its request, a backup none.
func TestSGLangHiCache(t *testing.T) {
	ids := shapes.NewIDs(3)
	s := shapes.SGLang{Version: shapes.SGLangCurrent, IDs: ids}
	sched := shapes.SGLangThread{Label: "Scheduler", TID: 5100, HostID: hostA, TP: shapes.Rank(0)}
	prefetch := shapes.SGLangThread{TID: 5133, HostID: hostA, TP: shapes.Rank(0)} // no label: hicache_scheduler
	io := shapes.SGLangThread{TID: 5134, HostID: hostA, TP: shapes.Rank(0)}
	backup := shapes.SGLangThread{TID: 5135, HostID: hostA, TP: shapes.Rank(0)}
	x := NewIndex(IndexConfig{Procs: fakeProcs{hosts: map[uint32]string{5100: hostA}}})
	const rid = "0b1c2d3e4f5a46b7c8d9e0f1a2b3c4d5"
	hashes := []string{"a1b2", "c3d4", "e5f6"}
	_, q := s.HiCache(shapes.HiCacheOp{Stage: "hicache_l3_prefetch_query", Thread: prefetch, ID: 17}, nil, at(0), at(3))
	tr, xfer := s.HiCache(shapes.HiCacheOp{Stage: "hicache_l3_prefetch_transfer", Thread: io, ID: 17, RequestID: rid, Hashes: hashes}, nil, at(3), at(40))
	bk, back := s.HiCache(shapes.HiCacheOp{Stage: "hicache_l3_backup", Thread: backup, ID: 18, Hashes: hashes}, nil, at(50), at(90))
	add(x, 100, sg(q, xfer, back))
	check(t, "prefetch transfer", x.Attribute(5100, 5134, at(10)), want{rule: "sglang-hicache", scope: ScopeOfThread, request: rid, parent: tr})
	check(t, "backup", x.Attribute(5100, 5135, at(60)), want{rule: "sglang-hicache", scope: ScopeOfThread, parent: bk})
	check(t, "query thread, later", x.Attribute(5100, 5133, at(10)), want{reason: ReasonNotCovered})
	_ = sched
}

// TestSGLangOct2025: a Bootstrap Room span under the client's traceparent,
// the request span under it with the full rid, role "" for a unified
// server (rooms 0 when none).
func TestSGLangOct2025(t *testing.T) {
	ids := shapes.NewIDs(4)
	s := shapes.SGLang{Version: shapes.SGLangOct2025, IDs: ids}
	sched := shapes.SGLangThread{Label: "Scheduler", TID: 6200, HostID: hostA, TP: shapes.Rank(1)}
	x := NewIndex(IndexConfig{Procs: fakeProcs{hosts: map[uint32]string{6200: hostA}}})
	const rid = "2_77aa88bb99cc4dd0ae1bf2c3d4e5f607" // multi-tokenizer worker 2
	req, rs := s.Request("null", rid, 0, nil, at(0), at(100))
	if rs[1].GetName() != " Req 77aa88bb" || rs[0].GetName() != "Bootstrap Room 0x0" {
		t.Fatalf("names %q %q", rs[0].GetName(), rs[1].GetName())
	}
	th, ts := s.Thread(req, sched, at(1), at(90))
	fw, fs := s.Slice(th, "prefill_forward", at(10), at(40))
	add(x, 101, sg(append(rs, ts, fs)...))
	check(t, "forward", x.Attribute(6200, 6200, at(20)), want{rule: "sglang-thread", scope: ScopeOfThread, request: rid, parent: fw})
	// PD: the room on the Bootstrap Room span joins prefill and decode.
	y := NewIndex(IndexConfig{Procs: fakeProcs{hosts: map[uint32]string{6200: hostA}}})
	req, rs = s.Request("prefill", "5566", 0x1f, nil, at(0), at(100))
	if rs[1].GetName() != "prefill Req 5566" {
		t.Fatalf("name %q", rs[1].GetName())
	}
	_, ts = s.Thread(req, shapes.SGLangThread{Label: "Prefill Scheduler", TID: 6200, HostID: hostA, TP: shapes.Rank(0)}, at(1), at(90))
	add(y, 101, sg(append(rs, ts)...))
	check(t, "prefill room", y.Attribute(6200, 6200, at(20)), want{rule: "sglang-thread", scope: ScopeOfThread, request: "5566", room: "0x1f"})
}

// TestSGLangSept2025: the first release: a root `Req …` (rid, an int or
// "None" bootstrap_room) in the tokenizer process; the scheduler is the
// process's main thread and the forward ran in an overlap thread that no
// span names: process scope through the scheduler's pid.
func TestSGLangSept2025(t *testing.T) {
	ids := shapes.NewIDs(5)
	s := shapes.SGLang{Version: shapes.SGLangSept2025, IDs: ids}
	sched := shapes.SGLangThread{Label: "Scheduler", TID: 3300, HostID: hostA, TP: shapes.Rank(0)}
	x := NewIndex(IndexConfig{Procs: fakeProcs{hosts: map[uint32]string{3300: hostA}}})
	const rid = "4e5f6a7b8c9d40e1f2a3b4c5d6e7f809"
	req, rs := s.Request("", rid, 0, nil, at(0), at(100))
	if rs[0].GetName() != "Req 4e5f6a7b" || len(rs[0].GetParentSpanId()) != 0 {
		t.Fatalf("root %q parent %x", rs[0].GetName(), rs[0].GetParentSpanId())
	}
	th, ts := s.Thread(req, sched, at(2), at(95))
	add(x, 101, sg(append(rs, ts)...))
	check(t, "overlap thread", x.Attribute(3300, 3317, at(50)), want{rule: "sglang-thread", scope: ScopeOfProcess, request: rid, parent: th})
	check(t, "scheduler", x.Attribute(3300, 3300, at(50)), want{rule: "sglang-thread", scope: ScopeOfThread, request: rid, parent: th})
	// Another process's thread 3317 with the same timing: not this request.
	check(t, "other process", x.Attribute(3400, 3317, at(50)), want{reason: ReasonNotCovered})
	// A room as an int.
	y := NewIndex(IndexConfig{Procs: fakeProcs{hosts: map[uint32]string{3300: hostA}}})
	req, rs = s.Request("", rid, 0x2a, nil, at(0), at(100))
	_, ts = s.Thread(req, sched, at(2), at(95))
	add(y, 101, sg(append(rs, ts)...))
	check(t, "int room", y.Attribute(3300, 3300, at(50)), want{rule: "sglang-thread", scope: ScopeOfThread, request: rid, room: "0x2a"})
}

// TestLateRequest: spans are exported when they end. A thread span that
// arrives before its request span leaves the request open; so does a
// request whose slices arrived before its thread span: transfers made
// after it started wait for it (Open), whoever covers them so far.
func TestLateRequest(t *testing.T) {
	ids := shapes.NewIDs(6)
	s := shapes.SGLang{Version: shapes.SGLangCurrent, IDs: ids}
	sched := shapes.SGLangThread{Label: "Scheduler", TID: 800, HostID: hostA, TP: shapes.Rank(0)}
	x := NewIndex(IndexConfig{Procs: fakeProcs{hosts: map[uint32]string{800: hostA}}})
	reqA, rsA := s.Request("unified", "aaaa0001", 0, nil, at(0), at(100))
	thA, tsA := s.Thread(reqA, sched, at(1), at(90))
	reqB, rsB := s.Request("unified", "bbbb0002", 0, nil, at(30), at(500))
	thB, tsB := s.Thread(reqB, sched, at(31), at(490))
	_, waitB := s.Slice(thB, "prefill_waiting", at(31), at(40))

	add(x, 91, sg(tsA)) // the scheduler's span first
	check(t, "thread before request", x.Attribute(800, 800, at(20)), want{rule: "sglang-thread", scope: ScopeOfThread, parent: thA, open: true})
	add(x, 101, sg(rsA...))
	check(t, "request arrived", x.Attribute(800, 800, at(20)), want{rule: "sglang-thread", scope: ScopeOfThread, request: "aaaa0001", parent: thA})
	add(x, 41, sg(waitB)) // B's first stage, its thread span still running
	check(t, "B open, before B", x.Attribute(800, 800, at(20)), want{rule: "sglang-thread", scope: ScopeOfThread, request: "aaaa0001", parent: thA})
	check(t, "B open, after B started", x.Attribute(800, 800, at(35)), want{rule: "sglang-thread", scope: ScopeOfThread, request: "aaaa0001", parent: thA, open: true})
	if st := x.Stats(); st.Open != 1 {
		t.Errorf("open requests %d, want 1", st.Open)
	}
	add(x, 491, sg(tsB))
	add(x, 501, sg(rsB...))
	check(t, "B arrived", x.Attribute(800, 800, at(35)), want{rule: "sglang-thread", scope: ScopeOfThread, batch: []string{"aaaa0001", "bbbb0002"}})
	if st := x.Stats(); st.Open != 0 {
		t.Errorf("open requests %d, want 0", st.Open)
	}
}

// TestVLLMInstances: current vLLM: llm_request in the API server
// (vllm.process_id), the copies in EngineCore and its workers. Two
// instances on one host, requests overlapping in time: each transfer gets
// its own instance's requests only. Older vLLM (no process attribute)
// covers any process.
func TestVLLMInstances(t *testing.T) {
	ids := shapes.NewIDs(7)
	procs := fakeProcs{parents: map[uint32]uint32{
		1000: 1, 1001: 1000, 1002: 1001, 1003: 1001, // instance 1: API server, EngineCore, two workers
		2000: 1, 2001: 2000, 2002: 2001, // instance 2
		3000: 1, // something else
	}}
	x := NewIndex(IndexConfig{Procs: procs})
	r1, s1 := shapes.VLLMSpan(shapes.VLLMCurrent, ids, shapes.VLLMRequest{ID: "cmpl-5f1c2a7e9b3d4c8e-0", Arrival: at(0), Finish: at(300),
		PromptTokens: 512, Gen: 64, TTFT: 0.05, E2E: 0.3, Prefill: 0.04, Decode: 0.25, Inference: 0.29, MaxTokens: 64})
	r2, s2 := shapes.VLLMSpan(shapes.VLLMCurrent, ids, shapes.VLLMRequest{ID: "chatcmpl-0d9e8f7a6b5c4d3e", Arrival: at(50), Finish: at(250),
		PromptTokens: 128, Gen: 32, Temperature: 0.7, TopP: 0.9, N: 1})
	x.AddAt([]*tracepb.ResourceSpans{
		shapes.Batch(shapes.VLLMResource(shapes.VLLMCurrent, 1000), shapes.VLLMScope(shapes.VLLMCurrent), s1),
		shapes.Batch(shapes.VLLMResource(shapes.VLLMCurrent, 2000), shapes.VLLMScope(shapes.VLLMCurrent), s2),
	}, time.Unix(0, at(301)))
	check(t, "instance 1 worker", x.Attribute(1002, 1002, at(100)), want{rule: "vllm-request", scope: ScopeOfProcess, request: "cmpl-5f1c2a7e9b3d4c8e-0", parent: r1})
	check(t, "instance 1 EngineCore", x.Attribute(1001, 1001, at(100)), want{rule: "vllm-request", scope: ScopeOfProcess, request: "cmpl-5f1c2a7e9b3d4c8e-0", parent: r1})
	check(t, "instance 2 worker", x.Attribute(2002, 2002, at(100)), want{rule: "vllm-request", scope: ScopeOfProcess, request: "chatcmpl-0d9e8f7a6b5c4d3e", parent: r2})
	// Instance 1 between requests: one may be running still (llm_request
	// comes at its end).
	check(t, "instance 1 idle", x.Attribute(1003, 1003, at(400)), want{reason: ReasonNotCovered, open: true})
	// Outside both trees: neither instance's requests.
	check(t, "other process", x.Attribute(3000, 3000, at(100)), want{reason: ReasonNotCovered})

	y := NewIndex(IndexConfig{Procs: procs})
	o1, os1 := shapes.VLLMSpan(shapes.VLLMOlder, ids, shapes.VLLMRequest{ID: "cmpl-aa-0", Arrival: at(0), Finish: at(300)})
	o2, os2 := shapes.VLLMSpan(shapes.VLLMOlder, ids, shapes.VLLMRequest{ID: "cmpl-bb-0", Arrival: at(50), Finish: at(250)})
	y.AddAt([]*tracepb.ResourceSpans{shapes.Batch(shapes.VLLMResource(shapes.VLLMOlder, 0), shapes.VLLMScope(shapes.VLLMOlder), os1, os2)},
		time.Unix(0, at(301)))
	check(t, "older, one", y.Attribute(1002, 1002, at(20)), want{rule: "vllm-request", scope: ScopeOfAny, request: "cmpl-aa-0", parent: o1})
	check(t, "older, batch", y.Attribute(3000, 3000, at(100)), want{rule: "vllm-request", scope: ScopeOfAny, batch: []string{"cmpl-aa-0", "cmpl-bb-0"}})
	_ = o2
}

func TestNoSpans(t *testing.T) {
	x := NewIndex(IndexConfig{Procs: fakeProcs{}})
	check(t, "empty", x.Attribute(1, 1, at(0)), want{reason: ReasonNoSpans})
}

func TestIndexEviction(t *testing.T) {
	ids := shapes.NewIDs(8)
	s := shapes.SGLang{Version: shapes.SGLangCurrent, IDs: ids}
	th := shapes.SGLangThread{Label: "Scheduler", TID: 5, HostID: hostA}
	x := NewIndex(IndexConfig{MaxSpans: 2, Window: time.Minute, Procs: fakeProcs{}})
	req, rs := s.Request("unified", "old", 0, nil, at(0), at(1))
	_, old := s.Thread(req, th, at(0), at(1))
	add(x, 2, sg(append(rs, old)...))
	var spans []*tracepb.Span
	for range 3 {
		_, sp := s.Thread(req, th, at(120_000), at(120_001))
		spans = append(spans, sp)
	}
	add(x, 120_002, sg(spans...))
	st := x.Stats()
	if st.Evicted != 2 || st.CapEvicts != 1 || st.Live != 2 {
		t.Errorf("stats %+v: want the old request and thread span evicted by age, one by the cap, 2 live", st)
	}
	if a := x.Attribute(5, 5, at(0)); a.Rule != "" {
		t.Errorf("evicted span still answers: %+v", a)
	}
}

// TestOpenExpires: a request whose parent never arrives stops holding
// transfers after the window.
func TestOpenExpires(t *testing.T) {
	ids := shapes.NewIDs(9)
	s := shapes.SGLang{Version: shapes.SGLangCurrent, IDs: ids}
	x := NewIndex(IndexConfig{Window: time.Minute, Procs: fakeProcs{}})
	req, _ := s.Request("unified", "lost", 0, nil, at(0), at(10))
	th, _ := s.Thread(req, shapes.SGLangThread{Label: "Scheduler", TID: 9, HostID: hostA}, at(0), at(10))
	_, sl := s.Slice(th, "request_process", at(0), at(1))
	add(x, 2, sg(sl))
	if a := x.Attribute(9, 9, at(5)); !a.Open {
		t.Errorf("open request not said: %+v", a)
	}
	add(x, 70_000, sg())
	if a, st := x.Attribute(9, 9, at(5)), x.Stats(); a.Open || st.OpenExpired != 1 {
		t.Errorf("after the window: %+v, %+v", a, st)
	}
}

// TestBounded: request spans, rooms and open requests stay within one
// budget however many arrive within the window, and every open request is
// tracked or counted.
func TestBounded(t *testing.T) {
	ids := shapes.NewIDs(10)
	s := shapes.SGLang{Version: shapes.SGLangCurrent, IDs: ids}
	x := NewIndex(IndexConfig{MaxSpans: 3, MaxOpen: 2, Procs: fakeProcs{}})
	for i := range 10 {
		req, rs := s.Request("prefill", fmt.Sprintf("r%d", i), uint64(100+i), nil, at(0), at(10))
		th, _ := s.Thread(req, shapes.SGLangThread{Label: "Scheduler", TID: 9, HostID: hostA}, at(0), at(10))
		_, sl := s.Slice(th, "request_process", at(0), at(1))
		add(x, 11, sg(append(rs, sl)...))
	}
	st := x.Stats()
	if st.Stored > 3 || len(x.traces)+len(x.rooms)+st.Open+st.Live != st.Stored || st.Open > 2 || st.Open+int(st.OpenDropped) != 10 {
		t.Errorf("traces %d rooms %d, stats %+v", len(x.traces), len(x.rooms), st)
	}
}

// vllmInstance is one vLLM instance: API server 1000, EngineCore 1001,
// worker 1002.
var vllmInstance = fakeProcs{parents: map[uint32]uint32{1000: 1, 1001: 1000, 1002: 1001}}

// vllmRequests indexes n llm_request spans of vllmInstance: request i
// arrives at i ms and lasts span ms; they arrive in batches, as the
// server exports them.
func vllmRequests(x *Index, ids *shapes.IDs, n int, span int64) []shapes.Ref {
	refs := make([]shapes.Ref, 0, n)
	var batch []*tracepb.Span
	flush := func() {
		x.AddAt([]*tracepb.ResourceSpans{shapes.Batch(shapes.VLLMResource(shapes.VLLMCurrent, 1000), shapes.VLLMScope(shapes.VLLMCurrent), batch...)},
			time.Unix(0, at(int64(n)+span)))
		batch = batch[:0]
	}
	for i := range n {
		ref, sp := shapes.VLLMSpan(shapes.VLLMCurrent, ids, shapes.VLLMRequest{ID: fmt.Sprintf("cmpl-%d-0", i), Arrival: at(int64(i)), Finish: at(int64(i) + span)})
		refs = append(refs, ref)
		if batch = append(batch, sp); len(batch) == 1000 {
			flush()
		}
	}
	if len(batch) > 0 {
		flush()
	}
	return refs
}

// BenchmarkAttribute: the cost of one transfer's attribution with 1k, 10k
// and 100k llm_request spans indexed, 8 of them covering each transfer.
// It must not grow with the spans held (compare ns/op across n).
func BenchmarkAttribute(b *testing.B) {
	for _, n := range []int{1_000, 10_000, 100_000} {
		b.Run(fmt.Sprintf("spans=%d", n), func(b *testing.B) {
			x := NewIndex(IndexConfig{Procs: vllmInstance, Window: time.Hour, MaxSpans: 1 << 20})
			vllmRequests(x, shapes.NewIDs(20), n, 8)
			b.ResetTimer()
			for i := range b.N {
				t := at(int64(8+i%(n-8))) + int64(time.Millisecond)/2
				if a := x.Attribute(1002, 1002, t); a.Batch != 8 {
					b.Fatalf("t %d: batch %d, want 8", t, a.Batch)
				}
			}
		})
	}
}

// BenchmarkAttributeCovered: the worst case per transfer, every span
// held covering it: 1024 (MaxCover: a batch of 1024 is worked out) and
// 100 000 (ambiguous once 1025 are found).
func BenchmarkAttributeCovered(b *testing.B) {
	for _, n := range []int{1024, 100_000} {
		b.Run(fmt.Sprintf("cover=%d", n), func(b *testing.B) {
			x := NewIndex(IndexConfig{Procs: vllmInstance, Window: time.Hour, MaxSpans: 1 << 20})
			vllmRequests(x, shapes.NewIDs(26), n, int64(n)+10)
			b.ResetTimer()
			for range b.N {
				if a := x.Attribute(1002, 1002, at(int64(n))); a.Batch != n && a.Reason != ReasonAmbiguous {
					b.Fatalf("batch %d reason %q", a.Batch, a.Reason)
				}
			}
		})
	}
}

// TestManyConcurrentRequests: transfers of a vLLM instance covered by
// thousands of llm_request spans (each covers queueing too) cannot be told
// apart: never one batch label listing the same few requests for every
// transfer, but ambiguous; where few cover a transfer, exactly those.
func TestManyConcurrentRequests(t *testing.T) {
	ids := shapes.NewIDs(21)
	x := NewIndex(IndexConfig{Procs: vllmInstance, Window: time.Hour})
	var batch []*tracepb.Span
	for i := range 5000 { // all running from 5 s to 10 s
		_, sp := shapes.VLLMSpan(shapes.VLLMCurrent, ids, shapes.VLLMRequest{ID: fmt.Sprintf("cmpl-many-%d", i), Arrival: at(int64(i)), Finish: at(10_000)})
		batch = append(batch, sp)
	}
	// Later, 3 at a time: request i from 20 000+10i to 20 000+10i+25 ms.
	const few = 100
	for i := range few {
		_, sp := shapes.VLLMSpan(shapes.VLLMCurrent, ids, shapes.VLLMRequest{ID: fmt.Sprintf("cmpl-few-%d", i), Arrival: at(20_000 + 10*int64(i)), Finish: at(20_000 + 10*int64(i) + 25)})
		batch = append(batch, sp)
	}
	x.AddAt([]*tracepb.ResourceSpans{shapes.Batch(shapes.VLLMResource(shapes.VLLMCurrent, 1000), shapes.VLLMScope(shapes.VLLMCurrent), batch...)},
		time.Unix(0, at(30_000)))
	for i := range 32 {
		a := x.Attribute(1002, 1002, at(5_000+100*int64(i)))
		if a.Batch != 0 || a.Request != "" || len(a.Requests) != 0 || a.Reason != ReasonAmbiguous {
			t.Fatalf("transfer %d among 5000 requests: batch %d %q request %q reason %q, want ambiguous", i, a.Batch, a.Requests, a.Request, a.Reason)
		}
	}
	for i := 2; i < few; i++ {
		ms := 20_000 + 10*int64(i) + 5 // requests i-2, i-1 and i run
		want := []string{fmt.Sprintf("cmpl-few-%d", i-2), fmt.Sprintf("cmpl-few-%d", i-1), fmt.Sprintf("cmpl-few-%d", i)}
		if a := x.Attribute(1002, 1002, at(ms)); !slices.Equal(a.Requests, want) || a.Batch != 3 {
			t.Fatalf("at %d ms: batch %d %q, want %q", ms, a.Batch, a.Requests, want)
		}
	}
}

// TestFarFutureEnd: a span claiming to end in a year is held no longer
// than one that ended on arrival: its end is clamped to arrival + window.
func TestFarFutureEnd(t *testing.T) {
	ids := shapes.NewIDs(22)
	s := shapes.SGLang{Version: shapes.SGLangCurrent, IDs: ids}
	x := NewIndex(IndexConfig{Window: time.Minute, Procs: fakeProcs{}})
	req, rs := s.Request("unified", "future", 0, nil, at(0), at(365*24*3600*1000))
	_, th := s.Thread(req, shapes.SGLangThread{Label: "Scheduler", TID: 77, HostID: hostA}, at(0), at(365*24*3600*1000))
	add(x, 1, sg(append(rs, th)...))
	if a := x.Attribute(77, 77, at(30_000)); a.Request != "future" {
		t.Fatalf("within the window: %+v, want request future", a)
	}
	add(x, 121_002, sg()) // two windows later
	if st := x.Stats(); st.Live != 0 {
		t.Errorf("stats %+v: the span claiming to end in a year is still held", st)
	}
	if a := x.Attribute(77, 77, at(200*24*3600*1000)); a.Rule != "" || a.Reason != ReasonNoSpans {
		t.Errorf("200 days later: %+v, want no spans", a)
	}
}

// TestReqSpansBudget: 2,000,000 SGLang request spans (each a request name,
// a room and the span) within one window stay within the index's byte
// budget; the oldest are evicted and counted, and the heap holds about
// what the index says it does.
func TestReqSpansBudget(t *testing.T) {
	const budget = 16 << 20
	ids := shapes.NewIDs(23)
	s := shapes.SGLang{Version: shapes.SGLangCurrent, IDs: ids}
	x := NewIndex(IndexConfig{MaxBytes: budget, Procs: fakeProcs{}})
	var m0, m1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m0)
	batch := make([]*tracepb.Span, 0, 1000)
	const n = 2_000_000
	for i := range n {
		_, rs := s.Request("prefill", strconv.Itoa(1e9+i), uint64(i+1), nil, at(0), at(10))
		if batch = append(batch, rs...); len(batch) >= 1000 {
			add(x, 11, sg(batch...))
			batch = batch[:0]
		}
	}
	add(x, 11, sg(batch...))
	batch = nil
	runtime.GC()
	runtime.ReadMemStats(&m1)
	st := x.Stats()
	heap := int64(m1.HeapInuse) - int64(m0.HeapInuse)
	t.Logf("%d request spans: %d stored, %d bytes estimated, heap in use +%d bytes; %+v", n, st.Stored, st.Bytes, heap, st)
	if st.Bytes > budget || st.Indexed != n || st.CapEvicts+uint64(st.Live) != n || st.InfoEvicts == 0 {
		t.Errorf("stats %+v: want within %d bytes, every span indexed and then evicted or live", st, budget)
	}
	if heap > 2*budget {
		t.Errorf("heap in use grew by %d bytes for an index estimated at %d: the estimate is off", heap, st.Bytes)
	}
	runtime.KeepAlive(x)
}

// TestAttributeCostFlat: the tree nodes one transfer's attribution looks
// at grow with the log of the spans held, not with their number (the
// index once scanned every span of the process per transfer: 100 times
// the work for 100 times the spans).
func TestAttributeCostFlat(t *testing.T) {
	visits := map[int]float64{}
	for _, n := range []int{1_000, 100_000} {
		x := NewIndex(IndexConfig{Procs: vllmInstance, Window: time.Hour})
		vllmRequests(x, shapes.NewIDs(24), n, 8)
		const asks = 1000
		for i := range asks {
			ms := int64(8 + i*(n-8)/asks)
			if a := x.Attribute(1002, 1002, at(ms)+int64(time.Millisecond)/2); a.Batch != 8 {
				t.Fatalf("%d spans, at %d ms: batch %d, want 8", n, ms, a.Batch)
			}
		}
		visits[n] = float64(x.visits) / asks
	}
	t.Logf("tree nodes looked at per transfer: %.1f with 1 000 spans, %.1f with 100 000", visits[1_000], visits[100_000])
	if visits[100_000] > 2*visits[1_000] {
		t.Errorf("100x the spans cost %.1fx the work per transfer, want at most 2x (log n)", visits[100_000]/visits[1_000])
	}
}

// TestSpanTimes: ends before starts, unset ends and times past 2262
// (negative as int64) are held as zero-length spans or clamped, never as
// spans covering everything.
func TestSpanTimes(t *testing.T) {
	ids := shapes.NewIDs(25)
	s := shapes.SGLang{Version: shapes.SGLangCurrent, IDs: ids}
	x := NewIndex(IndexConfig{Window: time.Minute, Procs: fakeProcs{}})
	th := func(tid uint32) shapes.SGLangThread {
		return shapes.SGLangThread{Label: "Scheduler", TID: tid, HostID: hostA}
	}
	req, rs := s.Request("unified", "times", 0, nil, at(0), at(10))
	_, backwards := s.Thread(req, th(1), at(5), at(2))
	_, unset := s.Thread(req, th(2), at(5), 0)
	_, huge := s.Thread(req, th(3), at(5), 0)
	huge.EndTimeUnixNano = 1 << 63
	_, future := s.Thread(req, th(4), 0, 0)
	future.StartTimeUnixNano, future.EndTimeUnixNano = math.MaxUint64, math.MaxUint64
	add(x, 10, sg(append(rs, backwards, unset, huge, future)...))
	for _, c := range []struct {
		tid     uint32
		ms      int64
		covered bool
	}{{1, 5, true}, {1, 3, false}, {2, 5, true}, {2, 6, false}, {3, 30_000, true}, {3, 60_011, false}, {4, 60_010, true}, {4, 30_000, false}} {
		if a := x.Attribute(c.tid, c.tid, at(c.ms)); (a.Request == "times") != c.covered {
			t.Errorf("thread %d at %d ms: %+v, covered %v", c.tid, c.ms, a, c.covered)
		}
	}
	if st := x.Stats(); st.Clamped != 2 {
		t.Errorf("clamped %d, want 2", st.Clamped)
	}
}

// TestManyQueued: 2000 requests queued on one SGLang scheduler thread
// (each thread span covers queueing) while two run their forward pass:
// the transfer is those two's batch, found through their forward slices,
// whether the slices arrived before their thread spans (as SGLang exports
// them) or after. With 2000 forwarding at once it is ambiguous.
func TestManyQueued(t *testing.T) {
	for _, slicesFirst := range []bool{true, false} {
		ids := shapes.NewIDs(27)
		s := shapes.SGLang{Version: shapes.SGLangCurrent, IDs: ids}
		sched := shapes.SGLangThread{Label: "Scheduler", TID: 4242, HostID: hostA}
		x := NewIndex(IndexConfig{Window: time.Hour, Procs: fakeProcs{hosts: map[uint32]string{4242: hostA}}})
		var reqs, threads, fwds []*tracepb.Span
		for i := range 2002 {
			rid := fmt.Sprintf("queued-%d", i)
			req, rs := s.Request("unified", rid, 0, nil, at(0), at(20_000))
			th, ts := s.Thread(req, sched, at(int64(i)), at(19_000))
			from, to := int64(15_000), int64(16_000) // the last two in their forward pass at 5 s, every one at 15 s
			if i >= 2000 {
				from = 4_000
			}
			_, fw := s.Slice(th, "prefill_forward", at(from), at(to))
			reqs, threads, fwds = append(reqs, rs...), append(threads, ts), append(fwds, fw)
		}
		add(x, 20_001, sg(reqs...))
		if slicesFirst {
			add(x, 20_001, sg(fwds...))
			add(x, 20_001, sg(threads...))
		} else {
			add(x, 20_001, sg(threads...))
			add(x, 20_001, sg(fwds...))
		}
		check(t, fmt.Sprintf("slices first %v: two forwarding", slicesFirst), x.Attribute(4242, 4242, at(5_000)),
			want{rule: "sglang-thread", scope: ScopeOfThread, batch: []string{"queued-2000", "queued-2001"}})
		check(t, fmt.Sprintf("slices first %v: all forwarding", slicesFirst), x.Attribute(4242, 4242, at(15_500)),
			want{reason: ReasonAmbiguous})
		check(t, fmt.Sprintf("slices first %v: none forwarding", slicesFirst), x.Attribute(4242, 4242, at(2_500)),
			want{reason: ReasonAmbiguous})
		if err := x.consistent(); err != nil {
			t.Error(err)
		}
	}
}
