package selftest

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	collectorpb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/exporters"
	"github.com/lanewatch/lanewatch/otlpbridge"
	"github.com/lanewatch/lanewatch/otlpbridge/shapes"
)

// SpanRequest is one request of the server-shaped spans made from a truth
// file, with the span a transfer of it must hang under.
type SpanRequest struct {
	ID     string
	Parent otlpbridge.SpanRef // the innermost span of the request covering the copy: a forward slice, a thread span (SGLang) or the request span (vLLM)
	// Span is the request's own span (SGLang's ` Req …`, vLLM's
	// llm_request), Start and End its times (Unix ns): its lanewatch.kv
	// summary hangs under it.
	Span       otlpbridge.SpanRef
	Start, End int64
}

func ref(r shapes.Ref) otlpbridge.SpanRef {
	return otlpbridge.SpanRef{TraceID: r.TraceID, SpanID: r.SpanID}
}

// Copies returns the truth's copies in order.
func Copies(truth []TruthCall) []TruthCall { return copies(truth) }

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

// HostID is this host's id as SGLang computes it (trace.py _get_host_id:
// /etc/machine-id), "unknown" when there is none (SGLang would then use a
// MAC address the agent cannot read).
func HostID() string {
	b, err := os.ReadFile("/etc/machine-id")
	if id := strings.TrimSpace(string(b)); err == nil && id != "" {
		return id
	}
	return "unknown"
}

// twoRequests splits the truth's copies between two requests: the first
// half of the layers serves request 0, the rest request 1. It returns the
// copies, the groups (indexes into them) and the instant between the groups.
func twoRequests(truth []TruthCall) (cs []TruthCall, groups [2][]int, mid int64) {
	cs, split := inTurn(truth, 2)
	groups = [2][]int(split)
	if len(groups[0]) > 0 && len(groups[1]) > 0 {
		mid = (int64(cs[groups[0][len(groups[0])-1]].TReturnNs) + int64(cs[groups[1][0]].TCallNs)) / 2
	}
	return cs, groups, mid
}

// SGLangSpans makes what the current SGLang (--enable-trace, the
// observability/trace.py form: otlpbridge/shapes) exports for a scenario
// run as two requests on one unified server: the copies of the first half
// of the layers serve request 0, the rest request 1. Both requests are in
// the scheduler for the whole run (thread spans `Scheduler [TP 0]
// (host:… | pid:TID)`, pid the copying thread, arrival to completion);
// request 0's prefill_forward covers its copies while request 1 waits
// (prefill_waiting), then request 1's prefill_forward covers the rest. The
// request spans ` Req …` come from the tokenizer (another thread). offset
// converts the truth's CLOCK_MONOTONIC ns to Unix ns. It returns the spans
// and, per copy of the truth in order, the request it serves and the
// forward slice it must hang under.
func SGLangSpans(truth []TruthCall, offset int64) (*collectorpb.ExportTraceServiceRequest, []SpanRequest) {
	return sglangSpans(truth, offset, shapes.SGLangCurrent)
}

// SGLangSpansSept2025 is SGLangSpans in the first release's form: a root
// `Req …` per request and thread spans that meet halfway between the
// groups, the copies hanging under the thread span.
func SGLangSpansSept2025(truth []TruthCall, offset int64) (*collectorpb.ExportTraceServiceRequest, []SpanRequest) {
	return sglangSpans(truth, offset, shapes.SGLangSept2025)
}

func sglangSpans(truth []TruthCall, offset int64, v shapes.SGLangVersion) (*collectorpb.ExportTraceServiceRequest, []SpanRequest) {
	cs, groups, mid := twoRequests(truth)
	if len(cs) == 0 {
		return &collectorpb.ExportTraceServiceRequest{}, nil
	}
	s := shapes.SGLang{Version: v, IDs: shapes.NewIDs(uint32(cs[0].PID))}
	sched := shapes.SGLangThread{Label: "Scheduler", TID: cs[0].TID, HostID: HostID(), TP: shapes.Rank(0)}
	tok := shapes.SGLangThread{Label: "Tokenizer", TID: cs[0].PID + 1_000_000, HostID: sched.HostID} // another process's thread
	first, last := int64(cs[0].TCallNs)-1000+offset, int64(cs[len(cs)-1].TReturnNs)+1000+offset
	// The request ends after its loads did: the copy engine may still run
	// the last copy after its call returned.
	done := last
	for _, c := range cs {
		done = max(done, int64(c.EngineEndNs)+1000+offset)
	}
	per := make([]SpanRequest, len(cs))
	var spans []*tracepb.Span
	for g, idx := range groups {
		if len(idx) == 0 {
			continue
		}
		start, end := int64(cs[idx[0]].TCallNs)-1000+offset, int64(cs[idx[len(idx)-1]].TReturnNs)+1000+offset
		if mid != 0 {
			if g == 0 {
				end = mid + offset
			} else {
				start = mid + 1 + offset
			}
		}
		rid := fmt.Sprintf("5e1f7e57%08x%016x", cs[0].PID, g)
		req, rs := s.Request("unified", rid, 0, nil, first-5000, done+5000)
		_, tsp := s.Thread(req, tok, first-5000, first-4000)
		spans = append(append(spans, rs...), tsp)
		var parent shapes.Ref
		if v == shapes.SGLangSept2025 {
			th, sp := s.Thread(req, sched, start, end)
			spans = append(spans, sp)
			parent = th
		} else {
			th, sp := s.Thread(req, sched, first-2000, last+2000)
			spans = append(spans, sp)
			if g == 1 && start > first {
				_, w := s.Slice(th, "prefill_waiting", first-2000, start)
				spans = append(spans, w)
			}
			fw, f := s.Slice(th, "prefill_forward", start, end)
			spans = append(spans, f)
			parent = fw
		}
		for _, i := range idx {
			per[i] = SpanRequest{ID: rid, Parent: ref(parent), Span: ref(req), Start: first - 5000, End: done + 5000}
		}
	}
	return &collectorpb.ExportTraceServiceRequest{ResourceSpans: []*tracepb.ResourceSpans{
		shapes.Batch(shapes.SGLangResource(), shapes.SGLangScope, spans...)}}, per
}

// VLLMSpans makes n overlapping `llm_request` spans of the current vLLM
// (otlpbridge/shapes), each covering every copy: a batch when n > 1. The scenario's
// process stands for the API server (resource vllm.process_id), so its
// copies are in the instance's process tree.
func VLLMSpans(truth []TruthCall, offset int64, n int) (*collectorpb.ExportTraceServiceRequest, []SpanRequest) {
	cs := copies(truth)
	if len(cs) == 0 {
		return &collectorpb.ExportTraceServiceRequest{}, nil
	}
	ids := shapes.NewIDs(uint32(cs[0].PID) ^ 0x5a5a)
	// A request ends after its loads ran: the copy engine may still run
	// them after their calls returned.
	start, end := int64(cs[0].TCallNs)-10_000, int64(cs[len(cs)-1].TReturnNs)+10_000
	for _, c := range cs {
		end = max(end, int64(c.EngineEndNs)+10_000)
	}
	var spans []*tracepb.Span
	var reqs []SpanRequest
	for i := range n {
		id := fmt.Sprintf("cmpl-5e1f7e57%08x%08x-0", cs[0].PID, i)
		r, sp := shapes.VLLMSpan(shapes.VLLMCurrent, ids, shapes.VLLMRequest{ID: id, Arrival: start + offset - int64(i)*1000,
			Finish: end + offset + int64(i)*1000, PromptTokens: 128, Gen: 16, TTFT: 0.05, E2E: 0.1, Prefill: 0.04, Decode: 0.05, Inference: 0.09})
		spans = append(spans, sp)
		reqs = append(reqs, SpanRequest{ID: id, Parent: ref(r), Span: ref(r), Start: start + offset - int64(i)*1000, End: end + offset + int64(i)*1000})
	}
	return &collectorpb.ExportTraceServiceRequest{ResourceSpans: []*tracepb.ResourceSpans{
		shapes.Batch(shapes.VLLMResource(shapes.VLLMCurrent, cs[0].PID), shapes.VLLMScope(shapes.VLLMCurrent), spans...)}}, reqs
}

// inTurn splits the truth's copies into n requests by layer, one after the
// other: it returns the copies and, per request, the indexes of its copies.
func inTurn(truth []TruthCall, n int) (cs []TruthCall, groups [][]int) {
	cs = copies(truth)
	maxLayer := 0
	for _, c := range cs {
		maxLayer = max(maxLayer, c.Layer)
	}
	groups = make([][]int, n)
	for i, c := range cs {
		g := min(max(c.Layer, 0)*n/(maxLayer+1), n-1) // a copy of no layer (-1) serves the first
		groups[g] = append(groups[g], i)
	}
	return cs, groups
}

// SGLangSpansSampled makes what the current SGLang exports when it samples
// its traces, for the scenario run as n requests one after the other on one
// unified server (the copies split by layer): each request's scheduler
// thread span runs from its first copy to its last, its prefill_forward
// covers them, its ` Req …` comes from the tokenizer; only the requests
// sampled says yes to are exported. Per copy of the truth in order, its
// request, with no ID for an unsampled one's.
func SGLangSpansSampled(truth []TruthCall, offset int64, n int, sampled func(int) bool) (*collectorpb.ExportTraceServiceRequest, []SpanRequest) {
	cs, groups := inTurn(truth, n)
	if len(cs) == 0 {
		return &collectorpb.ExportTraceServiceRequest{}, nil
	}
	s := shapes.SGLang{Version: shapes.SGLangCurrent, IDs: shapes.NewIDs(uint32(cs[0].PID) ^ 0x5a3e)}
	sched := shapes.SGLangThread{Label: "Scheduler", TID: cs[0].TID, HostID: HostID(), TP: shapes.Rank(0)}
	tok := shapes.SGLangThread{Label: "Tokenizer", TID: cs[0].PID + 1_000_000, HostID: sched.HostID}
	per := make([]SpanRequest, len(cs))
	var spans []*tracepb.Span
	for g, idx := range groups {
		if len(idx) == 0 || !sampled(g) {
			continue
		}
		// Copies of one request run back to back; the next request's
		// first copy starts after this one's last returned.
		// Its scheduler's spans cover its calls exactly (the next
		// request's first call starts after this one's last returned); the
		// request ends once its loads did.
		start, end := int64(cs[idx[0]].TCallNs)+offset, int64(cs[idx[len(idx)-1]].TReturnNs)+offset
		done := end
		for _, i := range idx {
			done = max(done, int64(cs[i].EngineEndNs)+offset)
		}
		rid := fmt.Sprintf("5a3e1ed0%08x%016x", cs[0].PID, g)
		req, rs := s.Request("unified", rid, 0, nil, start-2000, done+1000)
		_, tsp := s.Thread(req, tok, start-2000, start-1000)
		th, sp := s.Thread(req, sched, start, end)
		fw, f := s.Slice(th, "prefill_forward", start, end)
		spans = append(append(spans, rs...), tsp, sp, f)
		for _, i := range idx {
			per[i] = SpanRequest{ID: rid, Parent: ref(fw), Span: ref(req), Start: start - 2000, End: done + 1000}
		}
	}
	return &collectorpb.ExportTraceServiceRequest{ResourceSpans: []*tracepb.ResourceSpans{
		shapes.Batch(shapes.SGLangResource(), shapes.SGLangScope, spans...)}}, per
}

// CheckKVSummaries checks lanewatch's lanewatch.kv spans against the truth:
// every request of per has exactly one, under its request span, whose
// bytes are the truth's copies of that request, and whose wait lies
// between the longest of those copies (as the copy engine ran it) and the
// request span's length. Requests of per are named by copy, so a request
// with no copies is not expected (none gets a summary).
func CheckKVSummaries(spans []*tracepb.Span, truth []TruthCall, per []SpanRequest) (problems []string, matched int) {
	cs := copies(truth)
	type want struct {
		req     SpanRequest
		bytes   uint64
		longest int64
	}
	wants := map[string]*want{}
	for i, c := range cs {
		if i >= len(per) || per[i].ID == "" {
			continue
		}
		w := wants[per[i].ID]
		if w == nil {
			w = &want{req: per[i]}
			wants[per[i].ID] = w
		}
		w.bytes += c.Bytes
		if c.EngineEndNs > c.EngineStartNs {
			w.longest = max(w.longest, int64(c.EngineEndNs-c.EngineStartNs))
		}
	}
	got := map[string][]*tracepb.Span{}
	for _, sp := range spans {
		if sp.GetName() != "lanewatch.kv" {
			continue
		}
		id, _ := attrText(sp.GetAttributes(), "lanewatch.request.id")
		if _, ok := wants[id]; ok {
			got[id] = append(got[id], sp)
		}
	}
	for id, w := range wants {
		sps := got[id]
		if len(sps) != 1 {
			problems = append(problems, fmt.Sprintf("request %s: %d lanewatch.kv spans, want 1", id, len(sps)))
			continue
		}
		sp := sps[0]
		b, _ := attrText(sp.GetAttributes(), "lanewatch.kv.bytes")
		waitText, _ := attrText(sp.GetAttributes(), "lanewatch.kv.wait_seconds")
		wait, err := strconv.ParseFloat(waitText, 64)
		length := float64(w.req.End-w.req.Start) / 1e9
		switch {
		case string(sp.GetTraceId()) != string(w.req.Span.TraceID[:]) || string(sp.GetParentSpanId()) != string(w.req.Span.SpanID[:]):
			problems = append(problems, fmt.Sprintf("request %s: summary under %x/%x, want its request span %x/%x", id, sp.GetTraceId(),
				sp.GetParentSpanId(), w.req.Span.TraceID, w.req.Span.SpanID))
		case b != strconv.FormatUint(w.bytes, 10):
			problems = append(problems, fmt.Sprintf("request %s: %s bytes, the truth moved %d", id, b, w.bytes))
		case err != nil || wait < float64(w.longest)/1e9 || wait > length:
			problems = append(problems, fmt.Sprintf("request %s: waited %q s, want between its longest copy %.6f s and its span %.6f s", id, waitText,
				float64(w.longest)/1e9, length))
		default:
			matched++
		}
	}
	return problems, matched
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
			case *commonpb.AnyValue_DoubleValue:
				return strconv.FormatFloat(v.DoubleValue, 'g', -1, 64), true
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
// request's trace under the request's innermost span covering it (its
// forward slice, or its thread span), with the truth's request and layer.
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
			problems = append(problems, fmt.Sprintf("layer %d: parent %x, want the request's span %x", layer, sp.GetParentSpanId(), want.Parent.SpanID))
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

// CheckAttribution attributes the agent's transfers of the truth's process
// with index x and compares each with the request and span per names for
// its copy (one copy per layer, as in hicache-load). wall converts
// CLOCK_MONOTONIC ns to Unix ns.
func CheckAttribution(x *otlpbridge.Index, got []correlate.Transfer, truth []TruthCall, per []SpanRequest, wall func(uint64) int64) (problems []string, matched int) {
	cs := copies(truth)
	if len(cs) == 0 {
		return []string{"truth has no copies"}, 0
	}
	byLayer := map[int]int{}
	for i, c := range cs {
		byLayer[c.Layer] = i
	}
	for i := range got {
		t := &got[i]
		if t.PID != cs[0].PID || t.Failed() || !t.Op.IsCopy() {
			continue
		}
		j, ok := byLayer[t.Layer]
		if !ok {
			problems = append(problems, fmt.Sprintf("transfer at %d: layer %d not in the truth", t.SubmitNs, t.Layer))
			continue
		}
		a, want := x.Attribute(t.PID, t.TID, wall(t.SubmitNs)), per[j]
		if a.Request != want.ID || a.Parent != want.Parent {
			problems = append(problems, fmt.Sprintf("layer %d: request %q under %x, want %q under %x (%s, %s)", t.Layer, a.Request,
				a.Parent.SpanID, want.ID, want.Parent.SpanID, a.Rule, a.Scope))
			continue
		}
		matched++
	}
	if matched != len(cs) {
		problems = append(problems, fmt.Sprintf("%d of %d copies attributed", matched, len(cs)))
	}
	return problems, matched
}

// spansCheck runs hicache-load under the running agent, then replays what
// SGLang would export for it through a real OTLP bridge (gRPC, loopback)
// forwarding to an in-process collector, feeds the agent's transfers to the
// span exporter, and checks the collector's view: the server's spans
// unchanged, every transfer span in its request's trace under the thread
// span, with the truth's request and layer, and one lanewatch.kv summary
// per request with the truth's bytes.
func spansCheck(ctx context.Context, kvpath, truthPath string, col *Collector, cfg Config) Result {
	res := Result{Scenario: "hicache-spans", Runtime: "plain", Overlap: "-"}
	fail := func(err error) Result {
		res.Problems = append(res.Problems, err.Error())
		res.OtherErrs++
		return res
	}
	p, err := start(ctx, cfg, kvpath, "hicache-load", truthPath, nil)
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
	clock := otlpbridge.NewClock()
	sent, per := SGLangSpans(truth, clock.Offset())
	reqs, err := throughBridge(ctx, cfg, clock, got, sent)
	if err != nil {
		return fail(err)
	}
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
	// One lanewatch.kv per request, its bytes the truth's.
	kv, _ := CheckKVSummaries(TransferSpans(reqs), truth, per)
	problems = append(problems, kv...)
	// The first release's form (root `Req …`, no slices), on the same
	// transfers, through the rules alone.
	sept, perSept := SGLangSpansSept2025(truth, clock.Offset())
	x := otlpbridge.NewIndex(otlpbridge.IndexConfig{Logger: cfg.Logger})
	x.Add(sept.GetResourceSpans())
	older, _ := CheckAttribution(x, got, truth, perSept, clock.Wall)
	for _, p := range older {
		problems = append(problems, "September 2025 form: "+p)
	}
	res.OtherErrs += len(problems)
	if len(problems) > 5 {
		problems = problems[:5]
	}
	res.Problems = append(res.Problems, problems...)
	return res
}

// throughBridge runs the agent's span path in miniature: the transfers go
// to the span exporter, which attributes them through an OTLP bridge's
// index (spans stamped by clock); the server's spans go to the bridge,
// which forwards them, as the exporter sends its own, to a recorder. It
// returns what the recorder received.
func throughBridge(ctx context.Context, cfg Config, clock *otlpbridge.Clock, got []correlate.Transfer,
	sent *collectorpb.ExportTraceServiceRequest) ([]*collectorpb.ExportTraceServiceRequest, error) {
	rec, err := otlpbridge.NewRecorder()
	if err != nil {
		return nil, err
	}
	defer rec.Close()
	br, err := otlpbridge.New(otlpbridge.Config{GRPCListen: "127.0.0.1:0", Logger: cfg.Logger,
		Upstream: otlpbridge.Upstream{Endpoint: "http://" + rec.Addr(), Protocol: "grpc", Insecure: true, Timeout: 5 * time.Second}})
	if err != nil {
		return nil, err
	}
	br.Serve()
	defer br.Close()
	exp, err := otlptracegrpc.New(ctx, otlptracegrpc.WithEndpoint(rec.Addr()), otlptracegrpc.WithInsecure())
	if err != nil {
		return nil, err
	}
	resource, _ := exporters.NewResource(ctx)
	tp := exporters.NewTracerProvider(resource, exp)
	defer tp.Shutdown(context.Background())
	spans := exporters.NewSpans(exporters.SpansConfig{Tracer: tp.Tracer("lanewatch-selftest"), Mode: exporters.SpansBatched,
		Attributor: br.Index(), Wall: clock.Wall, Logger: cfg.Logger})
	for i := range got {
		spans.Transfer(&got[i])
	}
	conn, err := grpc.NewClient(br.GRPCAddr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	if _, err := collectorpb.NewTraceServiceClient(conn).Export(ctx, sent); err != nil {
		return nil, fmt.Errorf("send SGLang spans to the bridge: %w", err)
	}
	spans.Release(time.Time{})
	if err := tp.ForceFlush(ctx); err != nil {
		return nil, err
	}
	return rec.Requests(), nil
}
