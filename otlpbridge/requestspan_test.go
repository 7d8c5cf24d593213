package otlpbridge_test

import (
	"testing"
	"time"

	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/lanewatch/lanewatch/otlpbridge"
	"github.com/lanewatch/lanewatch/otlpbridge/shapes"
)

func sref(r shapes.Ref) otlpbridge.SpanRef {
	return otlpbridge.SpanRef{TraceID: r.TraceID, SpanID: r.SpanID}
}

// TestRequestSpan: a transfer's parent leads to its request's own span and
// time to first token, as each server states it: vLLM's attribute, SGLang's
// first prefill (or, on a decode server, decode) pass; unknown stays unknown.
func TestRequestSpan(t *testing.T) {
	const t0 = int64(1_700_000_000_000_000_000)
	ms := func(n int64) int64 { return t0 + n*int64(time.Millisecond) }
	s := shapes.SGLang{Version: shapes.SGLangCurrent, IDs: shapes.NewIDs(7)}
	sched := shapes.SGLangThread{Label: "Scheduler", TID: 4242, HostID: "abc", TP: shapes.Rank(0)}

	// A unified server: queued, two prefill chunks' worth of forward, decode.
	req, rs := s.Request("unified", "r-prefill", 0, nil, ms(0), ms(900))
	th, tsp := s.Thread(req, sched, ms(10), ms(890))
	_, wait := s.Slice(th, "prefill_waiting", ms(10), ms(100))
	pf, pre := s.Slice(th, "prefill_forward", ms(100), ms(250))
	_, dec := s.Slice(th, "decode_forward", ms(260), ms(880))
	// A decode server: no prefill pass.
	dreq, drs := s.Request("decode", "r-decode", 0x42, nil, ms(0), ms(500))
	dth, dtsp := s.Thread(dreq, sched, ms(5), ms(490))
	df, ddec := s.Slice(dth, "decode_forward", ms(300), ms(480))
	_, ddec2 := s.Slice(dth, "decode_forward", ms(120), ms(200)) // arrives later, ended first
	// Neither pass seen: TTFT unknown.
	nreq, nrs := s.Request("unified", "r-none", 0, nil, ms(0), ms(100))
	nth, ntsp := s.Thread(nreq, sched, ms(1), ms(99))
	// A thread span whose request span never came.
	lost, _ := s.Request("unified", "r-lost", 0, nil, ms(0), ms(100))
	lth, ltsp := s.Thread(lost, sched, ms(1), ms(99))

	ids := shapes.NewIDs(9)
	vr, vsp := shapes.VLLMSpan(shapes.VLLMCurrent, ids, shapes.VLLMRequest{ID: "cmpl-1", Arrival: ms(0), Finish: ms(700), TTFT: 0.125, E2E: 0.7})

	var spans []*tracepb.Span
	// Children first, as servers export them: a span leaves when it ends.
	spans = append(spans, wait, pre, dec, tsp)
	spans = append(spans, rs...)
	spans = append(spans, ddec, ddec2, dtsp)
	spans = append(spans, drs...)
	spans = append(spans, ntsp)
	spans = append(spans, nrs...)
	spans = append(spans, ltsp)
	x := otlpbridge.NewIndex(otlpbridge.IndexConfig{})
	x.AddAt([]*tracepb.ResourceSpans{shapes.Batch(shapes.SGLangResource(), shapes.SGLangScope, spans...),
		shapes.Batch(shapes.VLLMResource(shapes.VLLMCurrent, 1), shapes.VLLMScope(shapes.VLLMCurrent), vsp)}, time.Unix(0, ms(1000)))

	for _, c := range []struct {
		name     string
		parent   shapes.Ref
		want     shapes.Ref
		ok       bool
		start    int64
		end      int64
		ttft     time.Duration
		ttftFrom string
	}{
		{"SGLang prefill", pf, req, true, ms(0), ms(900), 250 * time.Millisecond, otlpbridge.SlicePrefill},
		{"SGLang thread span", th, req, true, ms(0), ms(900), 250 * time.Millisecond, otlpbridge.SlicePrefill},
		{"SGLang decode server", df, dreq, true, ms(0), ms(500), 200 * time.Millisecond, otlpbridge.SliceDecode},
		{"SGLang no pass", nth, nreq, true, ms(0), ms(100), 0, ""},
		{"SGLang request span not here", lth, shapes.Ref{}, false, 0, 0, 0, ""},
		{"vLLM", vr, vr, true, ms(0), ms(700), 125 * time.Millisecond, otlpbridge.TTFTAttr},
	} {
		got, ok := x.RequestSpan(sref(c.parent))
		if ok != c.ok {
			t.Errorf("%s: found %v, want %v", c.name, ok, c.ok)
			continue
		}
		if !ok {
			continue
		}
		if got.Ref != sref(c.want) || got.Start != c.start || got.End != c.end || time.Duration(got.TTFT) != c.ttft || got.TTFTFrom != c.ttftFrom {
			t.Errorf("%s: got %+v, want span %x %d..%d ttft %v from %q", c.name, got, c.want.SpanID, c.start, c.end, c.ttft, c.ttftFrom)
		}
	}
}
