package exporters

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/otlpbridge"
	"github.com/lanewatch/lanewatch/otlpbridge/shapes"
)

// hostProcs: every process sees machine id host; parents as given.
type hostProcs struct {
	host    string
	parents map[uint32]uint32
}

func (h hostProcs) HostID(uint32) (string, bool)   { return h.host, h.host != "" }
func (h hostProcs) Parent(p uint32) (uint32, bool) { pp, ok := h.parents[p]; return pp, ok }

const machineID = "8f3c1e0b9a7d4c2e91f0a6b5c4d3e2f1"

// t0 is the fixtures' origin: transfers' clock is the spans' (Wall nil).
var t0 = time.Unix(1_760_000_000, 0)

func sec(s float64) int64 { return t0.UnixNano() + int64(s*float64(time.Second)) }

func copyAt(pid, tid uint32, s float64, layer int) *correlate.Transfer {
	return &correlate.Transfer{PID: pid, TID: tid, Stream: 0x10, API: "cudaMemcpyAsync", Op: event.OpCopy, Direction: correlate.DirH2D,
		Bytes: 1 << 20, Src: correlate.Side{Mem: event.MemPinned}, Dst: correlate.Side{Mem: event.MemDevice}, HostMem: event.MemPinned,
		SubmitNs: uint64(sec(s)), CompleteNs: uint64(sec(s) + 1000), BatchIndex: -1, Layer: layer}
}

// transferSpans are the spans of transfers (and findings) recorded: not the
// requests' summaries.
func transferSpans(mem *tracetest.InMemoryExporter) tracetest.SpanStubs {
	var out tracetest.SpanStubs
	for _, sp := range mem.GetSpans() {
		if sp.Name != "lanewatch.kv" {
			out = append(out, sp)
		}
	}
	return out
}

func attrs(sp tracetest.SpanStub) map[attribute.Key]string {
	m := map[attribute.Key]string{}
	for _, a := range sp.Attributes {
		m[a.Key] = a.Value.String()
	}
	return m
}

func addSpans(x *otlpbridge.Index, at float64, spans ...*tracepb.Span) {
	x.AddAt([]*tracepb.ResourceSpans{shapes.Batch(shapes.SGLangResource(), shapes.SGLangScope, spans...)}, time.Unix(0, sec(at)))
}

// TestLateRequestSpans: SGLang's scheduler spans arrive at completion, the
// request span (tokenizer) later, both after the transfers' Hold: the
// transfers wait for the request while it is open, then go out in its
// trace, under its forward slice, with its id and their layers.
func TestLateRequestSpans(t *testing.T) {
	ids := shapes.NewIDs(1)
	sg := shapes.SGLang{Version: shapes.SGLangCurrent, IDs: ids}
	sched := shapes.SGLangThread{Label: "Scheduler", TID: 4242, HostID: machineID, TP: shapes.Rank(0)}
	x := otlpbridge.NewIndex(otlpbridge.IndexConfig{Procs: hostProcs{host: machineID}})
	mem := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(mem))
	s := NewSpans(SpansConfig{Tracer: tp.Tracer("t"), Mode: SpansBatched, Attributor: x, Hold: 15 * time.Second, MaxHold: time.Minute})

	const rid = "1a2b3c4d5e6f47a8b9c0d1e2f3a4b5c6"
	tok := shapes.SGLangThread{Label: "Tokenizer", TID: 4100, HostID: machineID}
	req, reqSpans := sg.Request("unified", rid, 0, nil, sec(0), sec(40))
	tokTh, tokSpan := sg.Thread(req, tok, sec(0), sec(0.05))
	_, tokenize := sg.Slice(tokTh, "tokenize", sec(0), sec(0.04))
	th, ts := sg.Thread(req, sched, sec(0.1), sec(39))
	fw, fs := sg.Slice(th, "prefill_forward", sec(0.5), sec(5))
	for l := range 3 {
		s.Transfer(copyAt(4242, 4242, 1+float64(l)*0.1, l))
	}
	// The tokenizer's thread span ends at dispatch: the request is open.
	addSpans(x, 0.6, tokSpan, tokenize)
	if n := s.Release(time.Unix(0, sec(17))); n != 0 {
		t.Fatalf("%d spans while the request was open", n)
	}
	if st := s.Stats(); st.Waiting != 3 || st.Held != 3 || st.Late != 3 {
		t.Fatalf("waiting for the open request: %+v", st)
	}
	addSpans(x, 39.5, ts, fs) // the scheduler's, at completion
	if n := s.Release(time.Unix(0, sec(39.6))); n != 0 {
		t.Fatalf("%d spans made before the request span came", n)
	}
	if st := s.Stats(); st.Waiting != 3 {
		t.Fatalf("waiting for the request span: %+v", st)
	}
	addSpans(x, 40.5, reqSpans...)
	if n := s.Release(time.Unix(0, sec(40.6))); n != 3 {
		t.Fatalf("%d spans once the request came, want one per layer", n)
	}
	for i, sp := range mem.GetSpans() {
		a := attrs(sp)
		if sp.Parent.SpanID() != fw.SpanID || sp.Parent.TraceID() != req.TraceID || a[AttrRequest] != rid ||
			a[AttrLayer] != fmt.Sprint(i) || a[AttrAttrScope] != otlpbridge.ScopeOfThread || a[AttrAttribution] != "sglang-thread" {
			t.Errorf("span %d: parent %s, %v", i, sp.Parent.SpanID(), a)
		}
		if _, ok := a[AttrIncomplete]; ok {
			t.Errorf("span %d: incomplete though every span came", i)
		}
	}
	if st := s.Stats(); st.Attributed != 3 || st.Waiting != 0 || st.Held != 0 || len(nonzero(st.Unattributed)) != 0 {
		t.Errorf("stats %+v", st)
	}
}

func nonzero(m map[string]uint64) map[string]uint64 {
	out := map[string]uint64{}
	for k, v := range m {
		if v != 0 {
			out[k] = v
		}
	}
	return out
}

// TestOpenRequestLimits: waiting ends at MaxHold, within MaxPending and
// when the agent stops; what left while a request was still open says so,
// and every unattributed transfer is counted by reason.
func TestOpenRequestLimits(t *testing.T) {
	ids := shapes.NewIDs(2)
	sg := shapes.SGLang{Version: shapes.SGLangCurrent, IDs: ids}
	sched := shapes.SGLangThread{Label: "Scheduler", TID: 500, HostID: machineID, TP: shapes.Rank(0)}
	x := otlpbridge.NewIndex(otlpbridge.IndexConfig{Procs: hostProcs{host: machineID}, Window: time.Hour})
	mem := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(mem))
	s := NewSpans(SpansConfig{Tracer: tp.Tracer("t"), Mode: SpansPerTransfer, Attributor: x, Hold: 10 * time.Second, MaxHold: time.Minute, MaxPending: 4,
		ExportUnattributed: true})

	// Request A is complete; request B's first stage arrived (its thread
	// span is running): B stays open.
	reqA, rsA := sg.Request("unified", "aaaa", 0, nil, sec(0), sec(8))
	_, tsA := sg.Thread(reqA, sched, sec(0), sec(8))
	reqB, _ := sg.Request("unified", "bbbb", 0, nil, sec(2), sec(900))
	thB, _ := sg.Thread(reqB, sched, sec(2), sec(890))
	_, waitB := sg.Slice(thB, "prefill_waiting", sec(2), sec(3))
	addSpans(x, 9, append(rsA, tsA, waitB)...)

	s.Transfer(copyAt(500, 500, 1, -1))   // before B: attributed to A at once
	s.Transfer(copyAt(500, 500, 4, -1))   // A's, but B may cover it: waits
	s.Transfer(copyAt(600, 600, 4.5, -1)) // another process, nothing covers, B may: waits
	s.Release(time.Unix(0, sec(15)))
	if st := s.Stats(); st.Waiting != 2 || st.Attributed != 1 {
		t.Fatalf("after Hold: %+v", st)
	}
	// MaxHold passes: both leave, marked.
	s.Release(time.Unix(0, sec(65)))
	st := s.Stats()
	if st.Waiting != 0 || st.Attributed != 2 || st.Incomplete != 1 || st.Unattributed[ReasonOpenTimeout] != 1 {
		t.Fatalf("after MaxHold: %+v", st)
	}
	got := transferSpans(mem)
	if a := attrs(got[1]); a[AttrRequest] != "aaaa" || a[AttrIncomplete] != "true" || a[AttrAttrReason] != ReasonOpenTimeout {
		t.Errorf("attributed while B open: %v", a)
	}
	if a := attrs(got[2]); a[AttrAttribution] != "none" || a[AttrAttrReason] != ReasonOpenTimeout {
		t.Errorf("unattributed at MaxHold: %v", a)
	}

	// Memory: more than MaxPending waiting, the oldest leave.
	for i := range 6 {
		s.Transfer(copyAt(600, 600, 70+float64(i), -1))
	}
	s.Release(time.Unix(0, sec(90)))
	if st := s.Stats(); st.Held > 4 || st.Unattributed[ReasonMemory] != 2 {
		t.Errorf("over MaxPending: %+v", st)
	}
	// The agent stops: the rest go out.
	s.Release(time.Time{})
	if st := s.Stats(); st.Held != 0 || st.Unattributed[ReasonOpenAtExit] != 4 {
		t.Errorf("at exit: %+v", st)
	}
	// No attributor at all.
	s2 := NewSpans(SpansConfig{Tracer: tp.Tracer("t"), Hold: time.Second})
	s2.Transfer(copyAt(1, 1, 0, -1))
	s2.Release(time.Unix(0, sec(5)))
	if st := s2.Stats(); st.Unattributed[ReasonNoAttributor] != 1 {
		t.Errorf("no attributor: %+v", st)
	}
}

// TestVLLMWaits: vLLM makes llm_request when the request finishes; a copy
// of the instance's EngineCore waits for it, and one of another instance
// gets that instance's request only.
func TestVLLMWaits(t *testing.T) {
	ids := shapes.NewIDs(3)
	procs := hostProcs{parents: map[uint32]uint32{101: 100, 201: 200}}
	x := otlpbridge.NewIndex(otlpbridge.IndexConfig{Procs: procs})
	mem := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(mem))
	s := NewSpans(SpansConfig{Tracer: tp.Tracer("t"), Mode: SpansPerTransfer, Attributor: x, Hold: 15 * time.Second})
	_, early := shapes.VLLMSpan(shapes.VLLMCurrent, ids, shapes.VLLMRequest{ID: "cmpl-early-0", Arrival: sec(0), Finish: sec(0.5)})
	x.AddAt([]*tracepb.ResourceSpans{shapes.Batch(shapes.VLLMResource(shapes.VLLMCurrent, 100), shapes.VLLMScope(shapes.VLLMCurrent), early)},
		time.Unix(0, sec(1)))
	s.Transfer(copyAt(101, 101, 2, 0))
	s.Release(time.Unix(0, sec(18)))
	if st := s.Stats(); st.Waiting != 1 {
		t.Fatalf("the EngineCore copy did not wait: %+v", st)
	}
	r1, s1 := shapes.VLLMSpan(shapes.VLLMCurrent, ids, shapes.VLLMRequest{ID: "cmpl-1-0", Arrival: sec(1.5), Finish: sec(30)})
	_, s2 := shapes.VLLMSpan(shapes.VLLMCurrent, ids, shapes.VLLMRequest{ID: "cmpl-2-0", Arrival: sec(1.5), Finish: sec(30)})
	x.AddAt([]*tracepb.ResourceSpans{
		shapes.Batch(shapes.VLLMResource(shapes.VLLMCurrent, 100), shapes.VLLMScope(shapes.VLLMCurrent), s1),
		shapes.Batch(shapes.VLLMResource(shapes.VLLMCurrent, 200), shapes.VLLMScope(shapes.VLLMCurrent), s2),
	}, time.Unix(0, sec(31)))
	s.Release(time.Unix(0, sec(31)))
	got := mem.GetSpans()
	if len(got) != 1 {
		t.Fatalf("%d spans", len(got))
	}
	if a := attrs(got[0]); a[AttrRequest] != "cmpl-1-0" || a[AttrAttrScope] != otlpbridge.ScopeOfProcess || got[0].Parent.SpanID() != r1.SpanID {
		t.Errorf("EngineCore copy: %v under %s", a, got[0].Parent.SpanID())
	}
}

// TestSpansMetrics: the counters of TestOpenRequestLimits' kind as scraped;
// every reason is a series from the first scrape.
func TestSpansMetrics(t *testing.T) {
	mem := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(mem))
	x := otlpbridge.NewIndex(otlpbridge.IndexConfig{Procs: hostProcs{}})
	s := NewSpans(SpansConfig{Tracer: tp.Tracer("t"), Attributor: x, Hold: 10 * time.Second})
	s.Transfer(copyAt(1, 1, 0, -1))
	s.Transfer(copyAt(1, 1, 20, -1))
	s.Release(time.Unix(0, sec(15)))
	reg := NewRegistry(NewMetrics(nil), map[string]Collector{"spans": SpansCollector{s}}, nil)
	want := `# HELP lanewatch_span_transfers_held Transfers held before becoming spans: hold (waiting --spans.hold for the server's spans), open (past it, waiting for a request still open).
# TYPE lanewatch_span_transfers_held gauge
lanewatch_span_transfers_held{state="hold"} 1
lanewatch_span_transfers_held{state="open"} 0
# HELP lanewatch_span_transfers_total Transfers made into spans, by attribution: request (one request), batch (several requests: ids and links), none (no request, by reason in lanewatch_span_unattributed_total).
# TYPE lanewatch_span_transfers_total counter
lanewatch_span_transfers_total{attribution="batch"} 0
lanewatch_span_transfers_total{attribution="none"} 1
lanewatch_span_transfers_total{attribution="request"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "lanewatch_span_transfers_total", "lanewatch_span_transfers_held"); err != nil {
		t.Error(err)
	}
	want = `# HELP lanewatch_span_unattributed_total Transfer spans naming no request, by reason: no_attributor (no OTLP bridge), no_spans (no server span indexed), not_covered (no span covered it), other_host (only another host's thread spans did), ambiguous (more spans of one thread or process covered it than a batch could be told from), open_timeout (a request that may cover it was still open after --spans.max-hold), memory (released while waiting to stay within the held budget), open_at_exit (still waiting when the agent stopped), stopping (not attributed: the agent was stopping and its grace had passed).
# TYPE lanewatch_span_unattributed_total counter
lanewatch_span_unattributed_total{reason="ambiguous"} 0
lanewatch_span_unattributed_total{reason="memory"} 0
lanewatch_span_unattributed_total{reason="no_attributor"} 0
lanewatch_span_unattributed_total{reason="no_spans"} 1
lanewatch_span_unattributed_total{reason="not_covered"} 0
lanewatch_span_unattributed_total{reason="open_at_exit"} 0
lanewatch_span_unattributed_total{reason="open_timeout"} 0
lanewatch_span_unattributed_total{reason="other_host"} 0
lanewatch_span_unattributed_total{reason="stopping"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "lanewatch_span_unattributed_total"); err != nil {
		t.Error(err)
	}
}

// stopper is an attributor that counts its calls and, at the nth, stops
// the exporter (SIGINT arriving while a Release is under way).
type stopper struct {
	s     *Spans
	calls int
	at    int
}

func (a *stopper) Attribute(pid, tid uint32, unixNs int64) otlpbridge.Attribution {
	a.calls++
	if a.calls == a.at {
		a.s.Stop(0)
	}
	return otlpbridge.Attribution{Reason: otlpbridge.ReasonNotCovered}
}

// TestStopBoundsRelease: once the agent stops and its grace has passed, the
// Release under way and the final flush ask the index nothing more: the
// work left does not depend on what the index holds, and every transfer
// still becomes a span, its reason saying why it names no request.
func TestStopBoundsRelease(t *testing.T) {
	mem := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(mem))
	a := &stopper{at: 10}
	s := NewSpans(SpansConfig{Tracer: tp.Tracer("t"), Mode: SpansPerTransfer, Attributor: a, Hold: time.Second, ExportUnattributed: true})
	a.s = s
	for i := range 1000 {
		s.Transfer(copyAt(7, 7, float64(i)*0.001, i))
	}
	s.Transfer(copyAt(7, 7, 100, 0)) // not due yet: left for the flush
	if n := s.Release(time.Unix(0, sec(10))); n != 1000 || a.calls != 10 {
		t.Errorf("release: %d spans, %d attributions; want 1000 spans and no attribution after the 10th (stopped)", n, a.calls)
	}
	if n := s.Release(time.Time{}); n != 1 || a.calls != 10 {
		t.Errorf("flush: %d spans, %d attributions; want 1 span and none asked", n, a.calls)
	}
	if st := s.Stats(); st.Unattributed[ReasonStopping] != 991 || st.Unattributed[otlpbridge.ReasonNotCovered] != 10 || st.Spans != 1001 {
		t.Errorf("stats %+v: want 991 stopping, 10 not covered, 1001 spans", st)
	}
}
