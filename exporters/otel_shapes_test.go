package exporters

import (
	"fmt"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/lanewatch/lanewatch/otlpbridge"
	"github.com/lanewatch/lanewatch/otlpbridge/shapes"
)

// TestEveryShape: one copy per server span shape, through the index and
// the span exporter: the span names the right request, scope and room,
// hangs under the right span, and keeps the copy's layer.
func TestEveryShape(t *testing.T) {
	const otherMachine = "17d2e3f4a5b6c7d8e9f0a1b2c3d4e5f6"
	type shape struct {
		name           string
		spans          []*tracepb.ResourceSpans
		pid, tid       uint32
		request, scope string
		room           string
		parent         shapes.Ref // zero: a root (not attributed)
		reason         string
		parents        map[uint32]uint32
	}
	ids := shapes.NewIDs(40)
	sgb := func(sp ...*tracepb.Span) []*tracepb.ResourceSpans {
		return []*tracepb.ResourceSpans{shapes.Batch(shapes.SGLangResource(), shapes.SGLangScope, sp...)}
	}
	th := func(label string, tid uint32, host string) shapes.SGLangThread {
		return shapes.SGLangThread{Label: label, TID: tid, HostID: host, TP: shapes.Rank(0), PP: shapes.Rank(0)}
	}
	var cases []shape
	// SGLang current: unified, prefill, decode on another host, hicache, mooncake.
	{
		s := shapes.SGLang{Version: shapes.SGLangCurrent, IDs: ids}
		req, rs := s.Request("unified", "c0a1", 0, nil, sec(0), sec(10))
		thr, ts := s.Thread(req, th("Scheduler", 100, machineID), sec(0), sec(9))
		fw, fs := s.Slice(thr, "decode_forward", sec(1), sec(9))
		cases = append(cases, shape{name: "current unified", spans: sgb(append(rs, ts, fs)...), pid: 100, tid: 100, request: "c0a1",
			scope: otlpbridge.ScopeOfThread, parent: fw})
		req, rs = s.Request("prefill", "c0a2", 0xbeef, nil, sec(0), sec(10))
		thr, ts = s.Thread(req, th("Prefill Scheduler", 100, machineID), sec(0), sec(9))
		cases = append(cases, shape{name: "current prefill", spans: sgb(append(rs, ts)...), pid: 100, tid: 100, request: "c0a2",
			scope: otlpbridge.ScopeOfThread, room: "0xbeef", parent: thr})
		req, rs = s.Request("decode", "c0a2", 0xbeef, nil, sec(0), sec(10))
		_, ts = s.Thread(req, th("Decode Scheduler", 100, otherMachine), sec(0), sec(9))
		cases = append(cases, shape{name: "current decode, another host", spans: sgb(append(rs, ts)...), pid: 100, tid: 100,
			reason: otlpbridge.ReasonOtherHost})
		h, hs := s.HiCache(shapes.HiCacheOp{Stage: "hicache_l3_prefetch_transfer", Thread: shapes.SGLangThread{TID: 131, HostID: machineID},
			ID: 9, RequestID: "c0a3", Hashes: []string{"ab"}}, nil, sec(0), sec(9))
		cases = append(cases, shape{name: "current hicache", spans: sgb(hs), pid: 100, tid: 131, request: "c0a3", scope: otlpbridge.ScopeOfThread, parent: h})
		_, rs = s.Request("prefill", "c0a4", 0xcafe, nil, sec(0), sec(10))
		mc, ms := s.MooncakeSender(0xcafe, sec(1), sec(9))
		w, ws := s.Thread(mc, shapes.SGLangThread{Label: "unknown", TID: 140, HostID: machineID}, sec(1), sec(9))
		send, ss := s.Slice(w, "mooncake_worker_send", sec(2), sec(8))
		cases = append(cases, shape{name: "current mooncake", spans: sgb(append(append(rs, ms...), ws, ss)...), pid: 100, tid: 140,
			request: "c0a4", room: "0xcafe", scope: otlpbridge.ScopeOfThread, parent: send})
	}
	// SGLang October 2025 and September 2025 (overlap thread).
	{
		s := shapes.SGLang{Version: shapes.SGLangOct2025, IDs: ids}
		req, rs := s.Request("null", "3_0b01", 0, nil, sec(0), sec(10))
		thr, ts := s.Thread(req, shapes.SGLangThread{Label: "Scheduler", TID: 100, HostID: machineID, TP: shapes.Rank(0)}, sec(0), sec(9))
		cases = append(cases, shape{name: "October 2025", spans: sgb(append(rs, ts)...), pid: 100, tid: 100, request: "3_0b01",
			scope: otlpbridge.ScopeOfThread, parent: thr})
		s.Version = shapes.SGLangSept2025
		req, rs = s.Request("", "0a01", 0, nil, sec(0), sec(10))
		thr, ts = s.Thread(req, shapes.SGLangThread{Label: "Scheduler", TID: 100, HostID: machineID, TP: shapes.Rank(0)}, sec(0), sec(9))
		cases = append(cases, shape{name: "September 2025, overlap thread", spans: sgb(append(rs, ts)...), pid: 100, tid: 117, request: "0a01",
			scope: otlpbridge.ScopeOfProcess, parent: thr})
	}
	// vLLM: two current instances; older.
	{
		r1, s1 := shapes.VLLMSpan(shapes.VLLMCurrent, ids, shapes.VLLMRequest{ID: "cmpl-1-0", Arrival: sec(0), Finish: sec(10)})
		r2, s2 := shapes.VLLMSpan(shapes.VLLMCurrent, ids, shapes.VLLMRequest{ID: "cmpl-2-0", Arrival: sec(0), Finish: sec(10)})
		two := []*tracepb.ResourceSpans{
			shapes.Batch(shapes.VLLMResource(shapes.VLLMCurrent, 300), shapes.VLLMScope(shapes.VLLMCurrent), s1),
			shapes.Batch(shapes.VLLMResource(shapes.VLLMCurrent, 400), shapes.VLLMScope(shapes.VLLMCurrent), s2),
		}
		parents := map[uint32]uint32{301: 300, 302: 301, 401: 400, 402: 401}
		cases = append(cases,
			shape{name: "vLLM instance 1 worker", spans: two, pid: 302, tid: 302, request: "cmpl-1-0", scope: otlpbridge.ScopeOfProcess, parent: r1, parents: parents},
			shape{name: "vLLM instance 2 worker", spans: two, pid: 402, tid: 402, request: "cmpl-2-0", scope: otlpbridge.ScopeOfProcess, parent: r2, parents: parents})
		o, os := shapes.VLLMSpan(shapes.VLLMOlder, ids, shapes.VLLMRequest{ID: "cmpl-o-0", Arrival: sec(0), Finish: sec(10)})
		cases = append(cases, shape{name: "vLLM older", pid: 302, tid: 302, request: "cmpl-o-0", scope: otlpbridge.ScopeOfAny, parent: o,
			spans: []*tracepb.ResourceSpans{shapes.Batch(shapes.VLLMResource(shapes.VLLMOlder, 0), shapes.VLLMScope(shapes.VLLMOlder), os)}})
	}
	for i, c := range cases {
		x := otlpbridge.NewIndex(otlpbridge.IndexConfig{Procs: hostProcs{host: machineID, parents: c.parents}})
		x.AddAt(c.spans, time.Unix(0, sec(11)))
		mem := tracetest.NewInMemoryExporter()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(mem))
		s := NewSpans(SpansConfig{Tracer: tp.Tracer("t"), Attributor: x, Hold: time.Second, ExportUnattributed: true})
		s.Transfer(copyAt(c.pid, c.tid, 5, i))
		s.Release(time.Unix(0, sec(12)))
		got := transferSpans(mem)
		if len(got) != 1 {
			t.Errorf("%s: %d spans", c.name, len(got))
			continue
		}
		a := attrs(got[0])
		want := map[string]string{"request": c.request, "scope": c.scope, "room": c.room, "layer": fmt.Sprint(i), "reason": c.reason}
		have := map[string]string{"request": a[AttrRequest], "scope": a[AttrAttrScope], "room": a[AttrRoom], "layer": a[AttrLayer], "reason": a[AttrAttrReason]}
		if fmt.Sprint(have) != fmt.Sprint(want) {
			t.Errorf("%s: %v, want %v", c.name, have, want)
		}
		if c.parent != (shapes.Ref{}) && (got[0].Parent.SpanID() != c.parent.SpanID || got[0].Parent.TraceID() != c.parent.TraceID) {
			t.Errorf("%s: parent %s, want %x", c.name, got[0].Parent.SpanID(), c.parent.SpanID)
		}
		if c.parent == (shapes.Ref{}) && got[0].Parent.IsValid() {
			t.Errorf("%s: parent %s, want a root", c.name, got[0].Parent.SpanID())
		}
	}
}
