// Package shapes builds OTLP spans shaped exactly like what the inference
// servers export, for the attribution tests, the selftest and the
// acceptance test. Every name, attribute and parent here is read in the
// servers' sources; PROVENANCE.md says which file at which commit. Nothing
// is added that the servers do not write: where a value is the server's
// run-time data (ids, times, thread ids, the host's machine id), the caller
// gives it.
package shapes

import (
	"encoding/binary"
	"fmt"
	"strconv"

	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
)

// Ref names one span.
type Ref struct {
	TraceID [16]byte
	SpanID  [8]byte
}

// IDs hands out trace and span ids, distinct per seed; deterministic, so
// fixtures repeat run to run. SGLang's own id generator draws 64-bit trace
// ids (TraceCustomIdGenerator.generate_trace_id: getrandbits(64)): the
// upper half of its 128-bit trace ids is zero, and so is it here.
type IDs struct {
	seed uint32
	n    uint32
}

// NewIDs returns ids for one fixture.
func NewIDs(seed uint32) *IDs { return &IDs{seed: seed} }

// Trace returns a new trace id.
func (g *IDs) Trace() (t [16]byte) {
	g.n++
	binary.BigEndian.PutUint32(t[8:], g.seed|0x80000000)
	binary.BigEndian.PutUint32(t[12:], g.n)
	return t
}

// Span returns a new span id.
func (g *IDs) Span() (s [8]byte) {
	g.n++
	binary.BigEndian.PutUint32(s[:], g.seed|0x40000000)
	binary.BigEndian.PutUint32(s[4:], g.n)
	return s
}

// Str, Int, Float and Bool are attributes as the Python SDK encodes them.
func Str(k, v string) *commonpb.KeyValue {
	return &commonpb.KeyValue{Key: k, Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: v}}}
}

// Int is an integer attribute.
func Int(k string, v int64) *commonpb.KeyValue {
	return &commonpb.KeyValue{Key: k, Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_IntValue{IntValue: v}}}
}

// Float is a float attribute.
func Float(k string, v float64) *commonpb.KeyValue {
	return &commonpb.KeyValue{Key: k, Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_DoubleValue{DoubleValue: v}}}
}

func span(ref Ref, parent *Ref, name string, kind tracepb.Span_SpanKind, start, end int64, attrs []*commonpb.KeyValue) *tracepb.Span {
	sp := &tracepb.Span{TraceId: append([]byte(nil), ref.TraceID[:]...), SpanId: append([]byte(nil), ref.SpanID[:]...), Name: name,
		Kind: kind, StartTimeUnixNano: uint64(start), EndTimeUnixNano: uint64(end), Attributes: attrs}
	if parent != nil {
		sp.ParentSpanId = append([]byte(nil), parent.SpanID[:]...)
	}
	return sp
}

// pythonSDK is what opentelemetry-sdk's Resource.create adds to every
// resource (the TelemetrySdk detector; service.name unknown_service unless
// set). The version is the installed SDK's; 1.38.0 stands for it here.
func pythonSDK(attrs ...*commonpb.KeyValue) []*commonpb.KeyValue {
	base := []*commonpb.KeyValue{Str("telemetry.sdk.language", "python"), Str("telemetry.sdk.name", "opentelemetry"),
		Str("telemetry.sdk.version", "1.38.0")}
	return append(base, attrs...)
}

// Batch wraps spans of one process as its exporter sends them: one
// resource, one instrumentation scope.
func Batch(resource []*commonpb.KeyValue, scope string, spans ...*tracepb.Span) *tracepb.ResourceSpans {
	return &tracepb.ResourceSpans{Resource: &resourcepb.Resource{Attributes: resource},
		ScopeSpans: []*tracepb.ScopeSpans{{Scope: &commonpb.InstrumentationScope{Name: scope}, Spans: spans}}}
}

// SGLangVersion is a release line of SGLang's request tracing.
type SGLangVersion int

const (
	// SGLangSept2025: the first request tracing (sgl-project/sglang#9962,
	// python/sglang/srt/tracing/trace.py): a root `Req {rid[:8]}` per
	// request in the tokenizer process (rid the full rid, bootstrap_room the
	// int or "None"), per-thread spans under it.
	SGLangSept2025 SGLangVersion = iota
	// SGLangOct2025: PD disaggregation tracing (same file): a `Bootstrap
	// Room 0x…` span under the client's traceparent, `{role} Req
	// {rid[:8]}` under it (role "" for unified servers), rid the full rid.
	SGLangOct2025
	// SGLangCurrent: the class-based rework (sgl-project/sglang#13152,
	// python/sglang/srt/observability/trace.py): `{role} Req {rid[:8]}`
	// under the client's traceparent, rid without the multi-tokenizer
	// prefix, module sglang::…, bootstrap_room in hex when set; thread
	// spans with tp_rank, pp_rank, dp_rank when set.
	SGLangCurrent
)

func (v SGLangVersion) String() string {
	switch v {
	case SGLangSept2025:
		return "sglang-2025-09"
	case SGLangOct2025:
		return "sglang-2025-10"
	case SGLangCurrent:
		return "sglang-current"
	}
	return fmt.Sprintf("sglang-version-%d", int(v))
}

// SGLang builds one SGLang process's spans.
type SGLang struct {
	Version SGLangVersion
	IDs     *IDs
}

// SGLangResource is an SGLang process's resource (process_tracing_init:
// Resource.create({SERVICE_NAME: "sglang"})) and its tracer's scope.
func SGLangResource() []*commonpb.KeyValue { return pythonSDK(Str("service.name", "sglang")) }

// SGLangScope is the tracer's name (trace.get_tracer("sglang server")).
const SGLangScope = "sglang server"

// SGLangThread is a thread as trace_set_thread_info registered it.
type SGLangThread struct {
	Label      string // Scheduler, Prefill Scheduler, Decode Scheduler, Tokenizer, DP Controller, unknown, …
	TID        uint32 // threading.get_native_id(): the span's pid attribute
	HostID     string // _get_host_id(): /etc/machine-id as the process reads it
	TP, PP, DP *int   // ranks; nil: not given
}

// Rank returns a rank for SGLangThread.
func Rank(n int) *int { return &n }

// Request makes the spans trace_req_start makes for one request in the
// tokenizer process and trace_req_finish ends: role is "unified" (current),
// "null" (October 2025) or prefill/decode; room 0 is none; client is the
// span of the caller's traceparent (nil: none). It returns the span that
// thread spans of the request hang under (the request span) and the spans.
func (s SGLang) Request(role, rid string, room uint64, client *Ref, start, end int64) (Ref, []*tracepb.Span) {
	orig := rid
	if i := lastUnderscore(rid); i >= 0 { // "Drop the worker_id added by MultiTokenizer"
		orig = rid[i+1:]
	}
	short := orig
	if len(short) > 8 {
		short = short[:8]
	}
	trace := s.IDs.Trace()
	if client != nil && s.Version != SGLangSept2025 { // the first release took no external context
		trace = client.TraceID
	}
	req := Ref{TraceID: trace, SpanID: s.IDs.Span()}
	switch s.Version {
	case SGLangSept2025:
		roomAttr := Str("bootstrap_room", "None")
		if room != 0 {
			roomAttr = Int("bootstrap_room", int64(room))
		}
		return req, []*tracepb.Span{span(req, nil, "Req "+short, tracepb.Span_SPAN_KIND_INTERNAL, start, end,
			[]*commonpb.KeyValue{Str("rid", rid), roomAttr})}
	case SGLangOct2025:
		if role == "null" || role == "unified" {
			role = ""
		}
		boot := Ref{TraceID: trace, SpanID: s.IDs.Span()}
		hex := "0x" + strconv.FormatUint(room, 16)
		return req, []*tracepb.Span{
			span(boot, client, "Bootstrap Room "+hex, tracepb.Span_SPAN_KIND_INTERNAL, start, end, []*commonpb.KeyValue{Str("bootstrap_room", hex)}),
			// attrs {"rid": orig_rid} at start, then set_attributes({"rid": rid}): the full rid wins.
			span(req, &boot, role+" Req "+short, tracepb.Span_SPAN_KIND_INTERNAL, start, end, []*commonpb.KeyValue{Str("rid", rid)}),
		}
	default:
		return s.moduleRequest(req, client, role, orig, "request", room, start, end)
	}
}

func (s SGLang) moduleRequest(req Ref, client *Ref, role, orig, module string, room uint64, start, end int64) (Ref, []*tracepb.Span) {
	if role == "unified" {
		role = ""
	}
	short := orig
	if len(short) > 8 {
		short = short[:8]
	}
	attrs := []*commonpb.KeyValue{Str("rid", orig), Str("module", "sglang::"+module)}
	if room != 0 {
		attrs = append(attrs, Str("bootstrap_room", "0x"+strconv.FormatUint(room, 16)))
	}
	return req, []*tracepb.Span{span(req, client, role+" Req "+short, tracepb.Span_SPAN_KIND_INTERNAL, start, end, attrs)}
}

// MooncakeSender makes mooncake's per-transfer request span
// (MooncakeKVSender._init_trace_ctx: rid str(hex(room)), role Sender,
// module mooncake; --trace-modules mooncake): a new trace.
func (s SGLang) MooncakeSender(room uint64, start, end int64) (Ref, []*tracepb.Span) {
	req := Ref{TraceID: s.IDs.Trace(), SpanID: s.IDs.Span()}
	return s.moduleRequest(req, nil, "Sender", "0x"+strconv.FormatUint(room, 16), "mooncake", room, start, end)
}

func lastUnderscore(s string) int {
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == '_' {
			return i
		}
	}
	return -1
}

// ThreadName is the thread span's name (__create_thread_context).
func (s SGLang) ThreadName(th SGLangThread) string {
	name := th.Label
	if th.TP != nil {
		name += fmt.Sprintf(" [TP %d] ", *th.TP)
	}
	if s.Version == SGLangCurrent {
		if th.PP != nil {
			name += fmt.Sprintf(" [PP %d] ", *th.PP)
		}
		if th.DP != nil {
			name += fmt.Sprintf(" [DP %d] ", *th.DP)
		}
	}
	host := th.HostID
	if len(host) > 8 {
		host = host[:8]
	}
	return name + fmt.Sprintf("(host:%s | pid:%d)", host, th.TID)
}

// Thread makes the span of one (request, thread): under the request span
// (or, in processes that got the request's context, under it as a remote
// parent), from start (the thread context's creation) to end (the thread's
// last slice with thread_finish_flag, or the request's completion).
func (s SGLang) Thread(req Ref, th SGLangThread, start, end int64) (Ref, *tracepb.Span) {
	ref := Ref{TraceID: req.TraceID, SpanID: s.IDs.Span()}
	var attrs []*commonpb.KeyValue
	if th.TP != nil {
		attrs = append(attrs, Int("tp_rank", int64(*th.TP)))
	}
	if s.Version == SGLangCurrent {
		if th.PP != nil {
			attrs = append(attrs, Int("pp_rank", int64(*th.PP)))
		}
		if th.DP != nil {
			attrs = append(attrs, Int("dp_rank", int64(*th.DP)))
		}
	}
	attrs = append(attrs, Str("host_id", th.HostID), Int("pid", int64(th.TID)), Str("thread_label", th.Label))
	return ref, span(ref, &req, s.ThreadName(th), tracepb.Span_SPAN_KIND_INTERNAL, start, end, attrs)
}

// Slice makes a request stage under a thread span or an outer slice
// (trace_slice_start/trace_slice_end, trace_slice): no pid of its own.
// Names are req_time_stats.RequestStage's (prefill_forward, decode_forward,
// decode_loop, request_process, prefill_waiting, …).
func (s SGLang) Slice(parent Ref, name string, start, end int64, attrs ...*commonpb.KeyValue) (Ref, *tracepb.Span) {
	ref := Ref{TraceID: parent.TraceID, SpanID: s.IDs.Span()}
	return ref, span(ref, &parent, name, tracepb.Span_SPAN_KIND_INTERNAL, start, end, attrs)
}

// HiCacheOp is one HiCache L2↔L3 operation on a background thread
// (hicache_trace.py, --trace-modules hicache).
type HiCacheOp struct {
	Stage     string // hicache_l3_backup, hicache_l3_prefetch_query, hicache_l3_prefetch_transfer
	Thread    SGLangThread
	ID        int64    // operation.id
	RequestID string   // operation.request_id (prefetch); "" none
	Hashes    []string // operation.hash_value
}

// HiCache makes an operation span: a new trace (no parent context on the
// background thread), linked to its enqueue span on the scheduler thread;
// the controller's attributes first (module, pid, host_id, thread_label,
// ranks), the operation's at its end.
func (s SGLang) HiCache(op HiCacheOp, enqueue *Ref, start, end int64) (Ref, *tracepb.Span) {
	ref := Ref{TraceID: s.IDs.Trace(), SpanID: s.IDs.Span()}
	label := op.Thread.Label
	if label == "" {
		label = "hicache_scheduler" // a thread that never called trace_set_thread_info
	}
	attrs := []*commonpb.KeyValue{Str("module", "sglang::hicache"), Int("pid", int64(op.Thread.TID)), Str("host_id", op.Thread.HostID),
		Str("thread_label", label)}
	if op.Thread.TP != nil {
		attrs = append(attrs, Int("tp_rank", int64(*op.Thread.TP)))
	}
	if op.Thread.DP != nil {
		attrs = append(attrs, Int("dp_rank", int64(*op.Thread.DP)))
	}
	if op.Thread.PP != nil {
		attrs = append(attrs, Int("pp_rank", int64(*op.Thread.PP)))
	}
	joined := ""
	for i, h := range op.Hashes {
		if i > 0 {
			joined += ","
		}
		joined += h
	}
	switch op.Stage {
	case "hicache_l3_backup":
		attrs = append(attrs, Int("hicache.operation_id", op.ID), Str("hicache.hash_values", joined),
			Int("hicache.num_pages", int64(len(op.Hashes))), Str("hicache.direction", "L2_to_L3"))
	case "hicache_l3_prefetch_transfer":
		attrs = append(attrs, Int("hicache.operation_id", op.ID), Str("hicache.hash_values", joined),
			Int("hicache.num_pages", int64(len(op.Hashes))), Str("hicache.direction", "L3_to_L2"))
		if op.RequestID != "" {
			attrs = append(attrs, Str("hicache.request_id", op.RequestID))
		}
	}
	sp := span(ref, nil, op.Stage, tracepb.Span_SPAN_KIND_INTERNAL, start, end, attrs)
	if enqueue != nil {
		sp.Links = []*tracepb.Span_Link{{TraceId: append([]byte(nil), enqueue.TraceID[:]...), SpanId: append([]byte(nil), enqueue.SpanID[:]...)}}
	}
	return ref, sp
}

// VLLMVersion is a release line of vLLM's request span.
type VLLMVersion int

const (
	// VLLMCurrent: llm_request made by OutputProcessor.do_tracing in the
	// API-server process through instrument_manual (tracer
	// vllm.tracing.otel), resource vllm.instrumenting_module_name and
	// vllm.process_id (vllm/tracing/otel.py init_tracer).
	VLLMCurrent VLLMVersion = iota
	// VLLMOlder: vllm/tracing.py init_tracer with TracerProvider()'s
	// default resource (no process attribute), llm_request started by
	// do_tracing's tracer (vllm.llm_engine).
	VLLMOlder
)

// VLLMRequest is one finished request as do_tracing sees it.
type VLLMRequest struct {
	ID                string // req_state.external_req_id: gen_ai.request.id
	Arrival, Finish   int64  // Unix ns: the span's start (arrival_time) and end (when do_tracing ran)
	PromptTokens, Gen int64
	TTFT, Queue, E2E  float64 // seconds
	Prefill, Decode   float64
	Inference         float64
	FinishReason      string // current only: gen_ai.response.finish_reasons = json.dumps([reason])
	MaxTokens, N      int64
	Temperature, TopP float64
	Client            *Ref // the request's traceparent (nil: none)
}

// VLLMSpan makes llm_request (kind SERVER) with the attributes in
// do_tracing's order; optional parameters only when set, as there.
func VLLMSpan(v VLLMVersion, ids *IDs, r VLLMRequest) (Ref, *tracepb.Span) {
	ref := Ref{TraceID: ids.Trace(), SpanID: ids.Span()}
	if r.Client != nil {
		ref.TraceID = r.Client.TraceID
	}
	attrs := []*commonpb.KeyValue{
		Float("gen_ai.latency.time_to_first_token", r.TTFT), Float("gen_ai.latency.e2e", r.E2E),
		Float("gen_ai.latency.time_in_queue", r.Queue), Int("gen_ai.usage.prompt_tokens", r.PromptTokens),
		Int("gen_ai.usage.completion_tokens", r.Gen), Float("gen_ai.latency.time_in_model_prefill", r.Prefill),
		Float("gen_ai.latency.time_in_model_decode", r.Decode), Float("gen_ai.latency.time_in_model_inference", r.Inference),
		Str("gen_ai.request.id", r.ID),
	}
	if v == VLLMCurrent {
		reason := r.FinishReason
		if reason == "" {
			reason = "stop"
		}
		attrs = append(attrs, Str("gen_ai.response.finish_reasons", `["`+reason+`"]`))
	}
	if r.TopP != 0 {
		attrs = append(attrs, Float("gen_ai.request.top_p", r.TopP))
	}
	if r.MaxTokens != 0 {
		attrs = append(attrs, Int("gen_ai.request.max_tokens", r.MaxTokens))
	}
	if r.Temperature != 0 {
		attrs = append(attrs, Float("gen_ai.request.temperature", r.Temperature))
	}
	if r.N != 0 {
		attrs = append(attrs, Int("gen_ai.request.n", r.N))
	}
	return ref, span(ref, r.Client, "llm_request", tracepb.Span_SPAN_KIND_SERVER, r.Arrival, r.Finish, attrs)
}

// VLLMResource is the API-server process's resource: current releases add
// vllm.instrumenting_module_name ("vllm.llm_engine", AsyncLLM's
// init_tracer) and vllm.process_id (str(os.getpid()) of the API server);
// older ones only the SDK's defaults.
func VLLMResource(v VLLMVersion, apiServerPID uint32) []*commonpb.KeyValue {
	if v == VLLMOlder {
		return pythonSDK(Str("service.name", "unknown_service"))
	}
	return pythonSDK(Str("vllm.instrumenting_module_name", "vllm.llm_engine"),
		Str("vllm.process_id", strconv.FormatUint(uint64(apiServerPID), 10)), Str("service.name", "unknown_service"))
}

// VLLMScope is the instrumentation scope of llm_request.
func VLLMScope(v VLLMVersion) string {
	if v == VLLMOlder {
		return "vllm.llm_engine"
	}
	return "vllm.tracing.otel"
}
