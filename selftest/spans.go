package selftest

import (
	"context"
	"crypto/rand"
	"fmt"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	collectorpb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	"github.com/lanewatch/lanewatch/exporters"
	"github.com/lanewatch/lanewatch/otlpbridge"
)

// SpanRequest is one request of the server-shaped spans made from a truth
// file, with the span a transfer of it must hang under.
type SpanRequest struct {
	ID     string
	Parent otlpbridge.SpanRef // the thread span (SGLang) or the request span (vLLM)
}

func strAttr(k, v string) *commonpb.KeyValue {
	return &commonpb.KeyValue{Key: k, Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: v}}}
}

func intAttr(k string, v int64) *commonpb.KeyValue {
	return &commonpb.KeyValue{Key: k, Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_IntValue{IntValue: v}}}
}

func newRef() (r otlpbridge.SpanRef) {
	rand.Read(r.TraceID[:])
	rand.Read(r.SpanID[:])
	return r
}

func spanOf(ref otlpbridge.SpanRef, parent []byte, name string, start, end int64, attrs ...*commonpb.KeyValue) *tracepb.Span {
	return &tracepb.Span{TraceId: ref.TraceID[:], SpanId: ref.SpanID[:], ParentSpanId: parent, Name: name,
		Kind: tracepb.Span_SPAN_KIND_INTERNAL, StartTimeUnixNano: uint64(start), EndTimeUnixNano: uint64(end), Attributes: attrs}
}

// copies returns the truth's copies in order.
func copies(truth []TruthCall) []TruthCall {
	var out []TruthCall
	for _, t := range truth {
		if t.IsCopy() {
			out = append(out, t)
		}
	}
	return out
}

// SGLangSpans makes what SGLang --enable-trace exports for a scenario run
// in two requests: the copies of the first half of the layers serve request
// 0, the rest request 1. Each request has a root span `Req <rid>` (rid,
// bootstrap_room) and a scheduler-thread child span whose `pid` attribute
// is the copying thread's id, covering its copies. offset converts the
// truth's CLOCK_MONOTONIC ns to Unix ns. It returns the spans and, per copy
// of the truth in order, the request it serves.
func SGLangSpans(truth []TruthCall, offset int64) (*collectorpb.ExportTraceServiceRequest, []SpanRequest) {
	cs := copies(truth)
	if len(cs) == 0 {
		return &collectorpb.ExportTraceServiceRequest{}, nil
	}
	maxLayer := 0
	for _, c := range cs {
		maxLayer = max(maxLayer, c.Layer)
	}
	split := maxLayer/2 + 1
	var groups [2][]int
	for i, c := range cs {
		g := 0
		if c.Layer >= split {
			g = 1
		}
		groups[g] = append(groups[g], i)
	}
	// The two thread spans meet halfway between the groups' copies.
	var mid int64
	if len(groups[0]) > 0 && len(groups[1]) > 0 {
		mid = (int64(cs[groups[0][len(groups[0])-1]].TReturnNs) + int64(cs[groups[1][0]].TCallNs)) / 2
	}
	per := make([]SpanRequest, len(cs))
	var spans []*tracepb.Span
	for g, idx := range groups {
		if len(idx) == 0 {
			continue
		}
		start, end := int64(cs[idx[0]].TCallNs)-1000, int64(cs[idx[len(idx)-1]].TReturnNs)+1000
		if mid != 0 {
			if g == 0 {
				end = mid
			} else {
				start = mid + 1
			}
		}
		rid := fmt.Sprintf("selftest-%d-%d", cs[0].PID, g)
		root := newRef()
		thread := otlpbridge.SpanRef{TraceID: root.TraceID}
		rand.Read(thread.SpanID[:])
		spans = append(spans,
			spanOf(thread, root.SpanID[:], "Scheduler", start+offset, end+offset, intAttr("pid", int64(cs[0].TID)), strAttr("thread_label", "scheduler")),
			spanOf(root, nil, "Req "+rid[len(rid)-8:], start+offset-5000, end+offset+5000, strAttr("rid", rid), intAttr("bootstrap_room", int64(1000+g))))
		for _, i := range idx {
			per[i] = SpanRequest{ID: rid, Parent: thread}
		}
	}
	return &collectorpb.ExportTraceServiceRequest{ResourceSpans: []*tracepb.ResourceSpans{{
		Resource:   &resourcepb.Resource{Attributes: []*commonpb.KeyValue{strAttr("service.name", "sglang")}},
		ScopeSpans: []*tracepb.ScopeSpans{{Scope: &commonpb.InstrumentationScope{Name: "sglang"}, Spans: spans}},
	}}}, per
}

// VLLMSpans makes n overlapping vLLM `llm_request` spans of the scenario's
// process (resource process.pid), each covering every copy: a batch.
func VLLMSpans(truth []TruthCall, offset int64, n int) (*collectorpb.ExportTraceServiceRequest, []SpanRequest) {
	cs := copies(truth)
	if len(cs) == 0 {
		return &collectorpb.ExportTraceServiceRequest{}, nil
	}
	start, end := int64(cs[0].TCallNs)-10_000, int64(cs[len(cs)-1].TReturnNs)+10_000
	var spans []*tracepb.Span
	var reqs []SpanRequest
	for i := range n {
		id := fmt.Sprintf("cmpl-selftest-%d-%d", cs[0].PID, i)
		ref := newRef()
		spans = append(spans, spanOf(ref, nil, "llm_request", start+offset-int64(i)*1000, end+offset+int64(i)*1000,
			strAttr("gen_ai.request.id", id), intAttr("gen_ai.usage.prompt_tokens", 128),
			&commonpb.KeyValue{Key: "gen_ai.latency.time_to_first_token", Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_DoubleValue{DoubleValue: 0.05}}}))
		reqs = append(reqs, SpanRequest{ID: id, Parent: ref})
	}
	return &collectorpb.ExportTraceServiceRequest{ResourceSpans: []*tracepb.ResourceSpans{{
		Resource: &resourcepb.Resource{Attributes: []*commonpb.KeyValue{strAttr("service.name", "vllm"),
			intAttr("process.pid", int64(cs[0].PID))}},
		ScopeSpans: []*tracepb.ScopeSpans{{Scope: &commonpb.InstrumentationScope{Name: "vllm.tracing"}, Spans: spans}},
	}}}, reqs
}

// TransferSpans returns the spans lanewatch exported (resource
// service.name=lanewatch) among recorded requests.
func TransferSpans(reqs []*collectorpb.ExportTraceServiceRequest) []*tracepb.Span {
	var out []*tracepb.Span
	for _, r := range reqs {
		for _, rs := range r.GetResourceSpans() {
			if v, _ := attrText(rs.GetResource().GetAttributes(), "service.name"); v != exporters.ServiceName {
				continue
			}
			for _, ss := range rs.GetScopeSpans() {
				out = append(out, ss.GetSpans()...)
			}
		}
	}
	return out
}

func attrText(kvs []*commonpb.KeyValue, key string) (string, bool) {
	for _, kv := range kvs {
		if kv.GetKey() == key {
			switch v := kv.GetValue().GetValue().(type) {
			case *commonpb.AnyValue_StringValue:
				return v.StringValue, true
			case *commonpb.AnyValue_IntValue:
				return strconv.FormatInt(v.IntValue, 10), true
			case *commonpb.AnyValue_ArrayValue:
				s := ""
				for i, e := range v.ArrayValue.GetValues() {
					if i > 0 {
						s += ","
					}
					s += e.GetStringValue()
				}
				return s, true
			}
			return kv.GetValue().String(), true
		}
	}
	return "", false
}

// CheckSGLangSpans checks lanewatch's transfer spans of process pid against
// the truth: one transfer per span (each layer is its own run), in the
// request's trace under its thread span, with the truth's request and layer.
// It returns the problems found (none: passed) and how many copies it matched.
func CheckSGLangSpans(spans []*tracepb.Span, truth []TruthCall, per []SpanRequest) (problems []string, matched int) {
	cs := copies(truth)
	if len(cs) == 0 {
		return []string{"truth has no copies"}, 0
	}
	pid := strconv.FormatUint(uint64(cs[0].PID), 10)
	byLayer := map[int]int{} // layer → index of its copy (one copy per layer in hicache-load)
	for i, c := range cs {
		byLayer[c.Layer] = i
	}
	seen := map[int]bool{}
	for _, sp := range spans {
		if v, _ := attrText(sp.GetAttributes(), "lanewatch.pid"); v != pid {
			continue
		}
		lv, ok := attrText(sp.GetAttributes(), "lanewatch.layer")
		layer, err := strconv.Atoi(lv)
		if !ok || err != nil {
			problems = append(problems, fmt.Sprintf("span %x: no lanewatch.layer", sp.GetSpanId()))
			continue
		}
		i, ok := byLayer[layer]
		if !ok {
			problems = append(problems, fmt.Sprintf("span %x: layer %d not in the truth", sp.GetSpanId(), layer))
			continue
		}
		seen[i] = true
		want := per[i]
		rid, _ := attrText(sp.GetAttributes(), "lanewatch.request.id")
		switch {
		case string(sp.GetTraceId()) != string(want.Parent.TraceID[:]):
			problems = append(problems, fmt.Sprintf("layer %d: trace %x, want the request's %x", layer, sp.GetTraceId(), want.Parent.TraceID))
		case string(sp.GetParentSpanId()) != string(want.Parent.SpanID[:]):
			problems = append(problems, fmt.Sprintf("layer %d: parent %x, want the thread span %x", layer, sp.GetParentSpanId(), want.Parent.SpanID))
		case rid != want.ID:
			problems = append(problems, fmt.Sprintf("layer %d: request %q, want %q", layer, rid, want.ID))
		default:
			matched++
		}
	}
	if len(seen) != len(cs) {
		problems = append(problems, fmt.Sprintf("%d of %d copies have a span", len(seen), len(cs)))
	}
	return problems, matched
}

// spansCheck runs hicache-load under the running agent, then replays what
// SGLang would export for it through a real OTLP bridge (gRPC, loopback)
// forwarding to an in-process collector, feeds the agent's transfers to the
// span exporter, and checks the collector's view: the server's spans
// unchanged, every transfer span in its request's trace under the thread
// span, with the truth's request and layer.
func spansCheck(ctx context.Context, kvpath, truthPath string, col *Collector, cfg Config) Result {
	res := Result{Scenario: "hicache-spans", Runtime: "plain", Overlap: "-"}
	fail := func(err error) Result {
		res.Problems = append(res.Problems, err.Error())
		res.OtherErrs++
		return res
	}
	p, err := start(ctx, kvpath, "hicache-load", truthPath, nil)
	if err != nil {
		return fail(err)
	}
	res.PID = p.pid
	if err := p.wait(col, cfg.Timeout); err != nil {
		return fail(err)
	}
	got := col.Take(p.pid)
	truth, err := ReadTruthFile(truthPath)
	if err != nil {
		return fail(err)
	}
	rec, err := otlpbridge.NewRecorder()
	if err != nil {
		return fail(err)
	}
	defer rec.Close()
	br, err := otlpbridge.New(otlpbridge.Config{GRPCListen: "127.0.0.1:0", Logger: cfg.Logger,
		Upstream: otlpbridge.Upstream{Endpoint: "http://" + rec.Addr(), Protocol: "grpc", Insecure: true, Timeout: 5 * time.Second}})
	if err != nil {
		return fail(err)
	}
	br.Serve()
	defer br.Close()
	exp, err := otlptracegrpc.New(ctx, otlptracegrpc.WithEndpoint(rec.Addr()), otlptracegrpc.WithInsecure())
	if err != nil {
		return fail(err)
	}
	resource, _ := exporters.NewResource(ctx)
	tp := exporters.NewTracerProvider(resource, exp)
	defer tp.Shutdown(context.Background())
	clock := otlpbridge.NewClock()
	spans := exporters.NewSpans(exporters.SpansConfig{Tracer: tp.Tracer("lanewatch-selftest"), Mode: exporters.SpansBatched,
		Attributor: br.Index(), Wall: clock.Wall, Logger: cfg.Logger})
	for i := range got {
		spans.Transfer(&got[i])
	}
	sent, per := SGLangSpans(truth, clock.Offset())
	conn, err := grpc.NewClient(br.GRPCAddr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fail(err)
	}
	defer conn.Close()
	if _, err := collectorpb.NewTraceServiceClient(conn).Export(ctx, sent); err != nil {
		return fail(fmt.Errorf("send SGLang spans to the bridge: %w", err))
	}
	spans.Release(time.Time{})
	if err := tp.ForceFlush(ctx); err != nil {
		return fail(err)
	}
	reqs := rec.Requests()
	forwarded := false
	want, _ := proto.MarshalOptions{Deterministic: true}.Marshal(sent)
	for _, r := range reqs {
		b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(r)
		forwarded = forwarded || string(b) == string(want)
	}
	if !forwarded {
		res.OtherErrs++
		res.Problems = append(res.Problems, "the server's spans did not arrive upstream unchanged")
	}
	problems, matched := CheckSGLangSpans(TransferSpans(reqs), truth, per)
	res.WantRecords, res.Got = len(copies(truth)), matched
	res.OtherErrs += len(problems)
	if len(problems) > 5 {
		problems = problems[:5]
	}
	res.Problems = append(res.Problems, problems...)
	return res
}
