package exporters

import (
	"math"
	"strconv"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/otlpbridge"
	"github.com/lanewatch/lanewatch/otlpbridge/shapes"
)

// moved is one transfer of the summary tests: submitted at from, completed
// at to (seconds after t0).
func moved(pid uint32, dir string, bytes uint64, from, to float64) *correlate.Transfer {
	t := &correlate.Transfer{PID: pid, TID: pid, Stream: 0x10, API: "cudaMemcpyAsync", Op: event.OpCopy, Direction: dir, Bytes: bytes,
		HostMem: event.MemPinned, SubmitNs: uint64(sec(from)), CompleteNs: uint64(sec(to)), BatchIndex: -1, Layer: -1}
	if dir == correlate.DirRDMAWrite || dir == correlate.DirRDMARead {
		t.API, t.Op, t.Mover, t.HostMem = "ibv_post_send", event.OpPostSend, correlate.MoverNIC, ""
	}
	return t
}

// kvRecorder is a RequestSink keeping what it was given.
type kvRecorder struct{ got []RequestKV }

func (r *kvRecorder) RequestKV(kv *RequestKV) { r.got = append(r.got, *kv) }

func summaries(mem *tracetest.InMemoryExporter) map[string]tracetest.SpanStub {
	out := map[string]tracetest.SpanStub{}
	for _, sp := range mem.GetSpans() {
		if sp.Name == "lanewatch.kv" {
			out[attrs(sp)[AttrRequest]] = sp
		}
	}
	return out
}

func near(got string, want float64) bool {
	v, err := strconv.ParseFloat(got, 64)
	return err == nil && math.Abs(v-want) <= 1e-9*math.Max(1, math.Abs(want))
}

// TestRequestSummary: two SGLang requests on one scheduler thread, each
// with transfers whose intervals overlap; one summary each, under its
// request span, with its own bytes by kind, the union of its waits (not
// their sum), the time to first token from its first prefill pass and the
// share of it spent waiting. The designed figures are worked out by hand
// below, not by the code under test.
func TestRequestSummary(t *testing.T) {
	const pid = 4242
	s0 := shapes.SGLang{Version: shapes.SGLangCurrent, IDs: shapes.NewIDs(24)}
	sched := shapes.SGLangThread{Label: "Scheduler", TID: pid, HostID: machineID, TP: shapes.Rank(0)}
	reqA, rsA := s0.Request("unified", "aaaa", 0, nil, sec(0), sec(10))
	thA, tsA := s0.Thread(reqA, sched, sec(0.1), sec(9.9))
	_, pfA := s0.Slice(thA, "prefill_forward", sec(0.5), sec(3))
	reqB, rsB := s0.Request("unified", "bbbb", 0, nil, sec(20), sec(30))
	thB, tsB := s0.Thread(reqB, sched, sec(20.1), sec(29.9))
	_, pfB := s0.Slice(thB, "prefill_forward", sec(20.5), sec(21))
	reqC, rsC := s0.Request("unified", "cccc", 0, nil, sec(40), sec(41)) // no transfers
	_, tsC := s0.Thread(reqC, sched, sec(40.1), sec(40.9))

	x := otlpbridge.NewIndex(otlpbridge.IndexConfig{Procs: hostProcs{host: machineID}, Window: time.Hour})
	spans := append(append(append([]*tracepb.Span{pfA, tsA}, rsA...), pfB, tsB), rsB...)
	addSpans(x, 42, append(append(spans, tsC), rsC...)...)

	mem := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(mem))
	rec := &kvRecorder{}
	s := NewSpans(SpansConfig{Tracer: tp.Tracer("t"), Attributor: x, Hold: time.Second, Requests: rec})
	// A: H2D [1, 1.5] and [1.2, 1.7] overlap, [2, 2.1]: union 0.8 s (sum
	// 1.1 s), all before its first token at 3 s; D2H [5, 5.5] after it.
	for _, tr := range []*correlate.Transfer{
		moved(pid, correlate.DirH2D, 4<<20, 1, 1.5), moved(pid, correlate.DirH2D, 4<<20, 1.2, 1.7), moved(pid, correlate.DirH2D, 1<<20, 2, 2.1),
		moved(pid, correlate.DirD2H, 2<<20, 5, 5.5),
		// B: an RDMA write [22, 23] and a read [22.5, 24]: union 2 s; its
		// first token came at 21 s, before both.
		moved(pid, correlate.DirRDMAWrite, 8<<20, 22, 23), moved(pid, correlate.DirRDMARead, 3<<20, 22.5, 24),
	} {
		s.Transfer(tr)
	}
	// Before B's span has ended plus the hold, only A is summed up.
	s.Release(time.Unix(0, sec(25)))
	if got := summaries(mem); len(got) != 1 || got["aaaa"].Name == "" {
		t.Fatalf("at 25 s: summaries %v, want A's only", len(got))
	}
	s.Release(time.Unix(0, sec(60)))
	got := summaries(mem)
	if len(got) != 2 {
		t.Fatalf("%d summaries, want A and B (C moved nothing: none)", len(got))
	}
	for _, c := range []struct {
		id        string
		req       shapes.Ref
		start     int64
		want      map[string]float64
		ttftShare float64
	}{
		{"aaaa", reqA, sec(0), map[string]float64{"lanewatch.kv.bytes": 11 << 20, "lanewatch.kv.bytes.h2d": 9 << 20, "lanewatch.kv.bytes.d2h": 2 << 20,
			"lanewatch.kv.bytes.rdma_in": 0, "lanewatch.kv.bytes.rdma_out": 0, "lanewatch.kv.transfers": 4,
			"lanewatch.kv.wait_seconds": 1.3, "lanewatch.kv.wait_seconds.h2d": 0.8, "lanewatch.kv.wait_seconds.d2h": 0.5,
			"lanewatch.kv.ttft_seconds": 3, "lanewatch.kv.ttft_wait_seconds": 0.8}, 0.8 / 3},
		{"bbbb", reqB, sec(20), map[string]float64{"lanewatch.kv.bytes": 11 << 20, "lanewatch.kv.bytes.rdma_out": 8 << 20, "lanewatch.kv.bytes.rdma_in": 3 << 20,
			"lanewatch.kv.bytes.h2d": 0, "lanewatch.kv.transfers": 2, "lanewatch.kv.wait_seconds": 2, "lanewatch.kv.wait_seconds.rdma_out": 1,
			"lanewatch.kv.wait_seconds.rdma_in": 1.5, "lanewatch.kv.ttft_seconds": 1, "lanewatch.kv.ttft_wait_seconds": 0}, 0},
	} {
		sp := got[c.id]
		a := attrs(sp)
		if sp.Parent.SpanID() != c.req.SpanID || sp.Parent.TraceID() != c.req.TraceID {
			t.Errorf("%s: parent %s, want its request span %x", c.id, sp.Parent.SpanID(), c.req.SpanID)
		}
		if sp.StartTime.UnixNano() != c.start {
			t.Errorf("%s: starts at %v, want the request span's start", c.id, sp.StartTime)
		}
		for k, v := range c.want {
			if !near(a[attrKey(k)], v) {
				t.Errorf("%s: %s = %q, want %v", c.id, k, a[attrKey(k)], v)
			}
		}
		if !near(a[AttrKVTTFTShare], c.ttftShare) || a[AttrKVTTFTSource] != TTFTSGLangPrefill {
			t.Errorf("%s: ttft share %q from %q, want %v from %s", c.id, a[AttrKVTTFTShare], a[AttrKVTTFTSource], c.ttftShare, TTFTSGLangPrefill)
		}
		if a[AttrKVIncomplete] != "" || a[AttrKVShared] != "" || a[AttrKVNoReqSpan] != "" {
			t.Errorf("%s: says incomplete, shared or no request span: %v", c.id, a)
		}
	}
	if len(rec.got) != 2 || rec.got[0].Request != "aaaa" || rec.got[0].WaitAll != 1300*time.Millisecond ||
		rec.got[0].Trace != reqA.TraceID || rec.got[0].Span != reqA.SpanID {
		t.Errorf("the request sink got %+v", rec.got)
	}
	if st := s.Stats(); st.Summaries != 2 || st.Gathering != 0 {
		t.Errorf("stats %+v: want 2 summaries, none gathering", st)
	}
}

func attrKey(k string) attribute.Key { return attribute.Key(k) }

// TestRequestSummaryBatchAndSampling: vLLM requests that overlap share
// their transfers (each summary says so, with no bytes of its own); a
// transfer no sampled request covers (vLLM: open until MaxHold) makes no
// span by default and is counted; with ExportUnattributed it does; the summary mode makes only
// summaries.
func TestRequestSummaryBatchAndSampling(t *testing.T) {
	ids := shapes.NewIDs(25)
	r1, s1 := shapes.VLLMSpan(shapes.VLLMCurrent, ids, shapes.VLLMRequest{ID: "cmpl-1", Arrival: sec(0), Finish: sec(10), TTFT: 2})
	r2, s2 := shapes.VLLMSpan(shapes.VLLMCurrent, ids, shapes.VLLMRequest{ID: "cmpl-2", Arrival: sec(1), Finish: sec(9), TTFT: 0.5})
	r3, s3 := shapes.VLLMSpan(shapes.VLLMCurrent, ids, shapes.VLLMRequest{ID: "cmpl-3", Arrival: sec(20), Finish: sec(30), TTFT: 2})
	for _, c := range []struct {
		name            string
		mode            SpanMode
		exportUnsampled bool
		transferSpans   int
	}{
		{"batched, unsampled withheld", SpansBatched, false, 2},
		{"batched, unsampled exported", SpansBatched, true, 3},
		{"summary", SpansSummary, false, 0},
	} {
		x := otlpbridge.NewIndex(otlpbridge.IndexConfig{Procs: hostProcs{host: machineID}, Window: time.Hour})
		x.AddAt([]*tracepb.ResourceSpans{shapes.Batch(shapes.VLLMResource(shapes.VLLMCurrent, 300), shapes.VLLMScope(shapes.VLLMCurrent), s1, s2, s3)},
			time.Unix(0, sec(31)))
		mem := tracetest.NewInMemoryExporter()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(mem))
		s := NewSpans(SpansConfig{Tracer: tp.Tracer("t"), Mode: c.mode, Attributor: x, Hold: time.Second, MaxHold: time.Second,
			ExportUnattributed: c.exportUnsampled})
		// Both 1 and 2: a batch. Each waited on it: 1 for 0.9 s of its
		// first 2 s, 2 for 0.4 s of its first 0.5 s.
		s.Transfer(moved(300, correlate.DirH2D, 1<<20, 1.1, 3))
		s.Transfer(moved(300, correlate.DirH2D, 1<<20, 21, 23)) // 3 alone: 1 s of its first 2 s
		s.Transfer(moved(300, correlate.DirH2D, 1<<20, 40, 41)) // an unsampled request's: nothing covers it
		s.Release(time.Unix(0, sec(60)))
		got := summaries(mem)
		if n := len(mem.GetSpans()) - len(got); n != c.transferSpans {
			t.Errorf("%s: %d transfer spans, want %d", c.name, n, c.transferSpans)
		}
		if len(got) != 3 {
			t.Errorf("%s: %d summaries, want 3 (one per sampled request)", c.name, len(got))
		}
		for id, want := range map[string]struct {
			ref           shapes.Ref
			bytes, shared string
			share         float64
		}{"cmpl-1": {r1, "0", "1", 0.9 / 2}, "cmpl-2": {r2, "0", "1", 0.4 / 0.5}, "cmpl-3": {r3, "1048576", "", 1.0 / 2}} {
			a := attrs(got[id])
			if a[AttrKVBytes] != want.bytes || a[AttrKVShared] != want.shared || got[id].Parent.SpanID() != want.ref.SpanID ||
				a[AttrKVTTFTSource] != TTFTVLLM || !near(a[AttrKVTTFTShare], want.share) {
				t.Errorf("%s: %s: %v under %s; want bytes %s, shared %q, share %v, under %x", c.name, id, a, got[id].Parent.SpanID(),
					want.bytes, want.shared, want.share, want.ref.SpanID)
			}
		}
		st := s.Stats()
		withheld := uint64(1)
		if c.exportUnsampled {
			withheld = 0
		}
		// vLLM exports llm_request when a request ends: one still running
		// may cover the transfer, so it waits until MaxHold.
		if st.Withheld[ReasonOpenTimeout] != withheld || st.Unattributed[ReasonOpenTimeout] != 1 {
			t.Errorf("%s: stats %+v: want 1 open at MaxHold, %d withheld", c.name, st, withheld)
		}
	}
}

// TestRequestSummaryNoRequestSpan: the thread span came, the request's own
// span never did: the transfers wait for it until MaxHold, then the summary
// hangs under the thread span, spans the transfers, and says what it lacks.
func TestRequestSummaryNoRequestSpan(t *testing.T) {
	s0 := shapes.SGLang{Version: shapes.SGLangCurrent, IDs: shapes.NewIDs(26)}
	req, _ := s0.Request("unified", "dddd", 0, nil, sec(0), sec(10))
	th, ts := s0.Thread(req, shapes.SGLangThread{Label: "Scheduler", TID: 77, HostID: machineID, TP: shapes.Rank(0)}, sec(0.1), sec(9.9))
	x := otlpbridge.NewIndex(otlpbridge.IndexConfig{Procs: hostProcs{host: machineID}, Window: time.Hour})
	addSpans(x, 11, ts)
	mem := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(mem))
	s := NewSpans(SpansConfig{Tracer: tp.Tracer("t"), Mode: SpansSummary, Attributor: x, Hold: time.Second, MaxHold: 10 * time.Second})
	s.Transfer(moved(77, correlate.DirH2D, 1<<20, 1, 2))
	s.Transfer(moved(77, correlate.DirH2D, 1<<20, 3, 4))
	s.Release(time.Unix(0, sec(5)))
	if len(mem.GetSpans()) != 0 || s.Stats().Waiting != 2 {
		t.Fatalf("summed up while its request was open: %d spans", len(mem.GetSpans()))
	}
	s.Release(time.Unix(0, sec(30)))
	got := mem.GetSpans()
	if len(got) != 1 {
		t.Fatalf("%d spans, want one summary", len(got))
	}
	a := attrs(got[0])
	if got[0].Parent.SpanID() != th.SpanID || a[AttrKVNoReqSpan] != "true" || a[AttrKVIncomplete] != "true" || a[AttrKVBytes] != "2097152" ||
		a[AttrKVTTFTShare] != "" || got[0].StartTime.UnixNano() != sec(1) || got[0].EndTime.UnixNano() != sec(4) {
		t.Errorf("summary %v under %s from %v to %v; want 2 MiB under the thread span %x, from 1 s to 4 s, incomplete, no request span, no TTFT",
			a, got[0].Parent.SpanID(), got[0].StartTime, got[0].EndTime, th.SpanID)
	}
}

// TestRequestSummaryStorage: storage reads into the pool count in the
// summary of the request they served (bytes, no wait: their duration is not
// known) and make no span; without the storage tracer the kind is absent,
// not zero.
func TestRequestSummaryStorage(t *testing.T) {
	for _, traced := range []bool{true, false} {
		s0 := shapes.SGLang{Version: shapes.SGLangCurrent, IDs: shapes.NewIDs(27)}
		req, rs := s0.Request("unified", "eeee", 0, nil, sec(0), sec(10))
		_, ts := s0.Thread(req, shapes.SGLangThread{Label: "Scheduler", TID: 88, HostID: machineID, TP: shapes.Rank(0)}, sec(0.1), sec(9.9))
		x := otlpbridge.NewIndex(otlpbridge.IndexConfig{Procs: hostProcs{host: machineID}, Window: time.Hour})
		addSpans(x, 11, append(rs, ts)...)
		mem := tracetest.NewInMemoryExporter()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(mem))
		s := NewSpans(SpansConfig{Tracer: tp.Tracer("t"), Attributor: x, Hold: time.Second, StorageReads: traced})
		reads := uint64(0)
		if traced {
			s.StorageRead(88, 88, uint64(sec(1)), 64<<20)
			s.StorageRead(99, 99, uint64(sec(1)), 1<<20) // another process: no request
			reads = 2
		}
		s.Transfer(moved(88, correlate.DirH2D, 1<<20, 2, 3))
		s.Release(time.Unix(0, sec(30)))
		got := mem.GetSpans()
		if len(got) != 2 {
			t.Fatalf("traced %v: %d spans, want the transfer's and the summary", traced, len(got))
		}
		a := attrs(summaries(mem)["eeee"])
		want := map[attribute.Key]string{"lanewatch.kv.bytes.storage": "67108864", AttrKVBytes: "68157440", AttrKVTransfers: "1", AttrKVWait: "1"}
		if !traced {
			want = map[attribute.Key]string{"lanewatch.kv.bytes.storage": "", AttrKVBytes: "1048576", AttrKVTransfers: "1", AttrKVWait: "1"}
		}
		for k, v := range want {
			if a[k] != v {
				t.Errorf("traced %v: %s = %q, want %q", traced, k, a[k], v)
			}
		}
		if st := s.Stats(); st.Unattributed[otlpbridge.ReasonNotCovered] != 0 || st.StorageReads != reads {
			t.Errorf("traced %v: stats %+v: a storage read is no transfer", traced, st)
		}
	}
}

// TestIntervalsBound: the union is exact within the bounds; past the
// budget of all requests the last interval grows to cover the next (an
// upper bound), and says so.
func TestIntervalsBound(t *testing.T) {
	left := 3
	var u intervals
	for _, v := range [][2]int64{{0, 10}, {5, 12}, {20, 30}, {40, 50}, {60, 70}, {80, 90}} {
		u.add(v[0], v[1], &left)
	}
	// Kept: [0,12], [20,30], [40,50]; then the budget is spent and [40,50]
	// grows to [40,90]: 12+10+50.
	if got := covered(u.iv, 0, 100); got != 72 || !u.capped || left != 0 {
		t.Errorf("union %v, capped %v, left %d; want 72 (an upper bound of the exact 52), capped, 0 left", got, u.capped, left)
	}
	left = 10
	var exact intervals
	for _, v := range [][2]int64{{20, 30}, {0, 10}, {5, 12}, {25, 40}} { // out of order
		exact.add(v[0], v[1], &left)
	}
	if got := covered(exact.iv, 0, 35); got != 12+15 || exact.capped {
		t.Errorf("union inside [0,35) %v, capped %v; want 27, not capped", got, exact.capped)
	}
}

// TestRequestSummaryFindings: a request's summary names what applied to its
// transfers: pageable bulk copies of its own, and the last evaluation's
// WARN/FAIL findings about its process (not another's whose pid it
// begins with); a healthy request (pinned copies, no finding about its
// process) names none.
func TestRequestSummaryFindings(t *testing.T) {
	for _, c := range []struct {
		name     string
		mem      event.MemKind
		active   []correlate.Finding
		findings string
	}{
		{"healthy", event.MemPinned, []correlate.Finding{{Rule: "remote-numa-pool", Severity: correlate.SevWarn, Subject: "pid 42 pool 0x7f00+64 MiB"},
			{Rule: "link-underused", Severity: correlate.SevInfo, Subject: "pid 4242 H2D"}}, ""},
		{"pageable, far pool", event.MemPageable, []correlate.Finding{{Rule: "remote-numa-pool", Severity: correlate.SevWarn, Subject: "pid 4242 pool 0x7f00+64 MiB"}},
			`["pageable-copy:fail","remote-numa-pool:warn"]`},
	} {
		s0 := shapes.SGLang{Version: shapes.SGLangCurrent, IDs: shapes.NewIDs(28)}
		req, rs := s0.Request("unified", "ffff", 0, nil, sec(0), sec(10))
		_, ts := s0.Thread(req, shapes.SGLangThread{Label: "Scheduler", TID: 4242, HostID: machineID, TP: shapes.Rank(0)}, sec(0.1), sec(9.9))
		x := otlpbridge.NewIndex(otlpbridge.IndexConfig{Procs: hostProcs{host: machineID}, Window: time.Hour})
		addSpans(x, 11, append(rs, ts)...)
		mem := tracetest.NewInMemoryExporter()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(mem))
		s := NewSpans(SpansConfig{Tracer: tp.Tracer("t"), Mode: SpansSummary, Attributor: x, Hold: time.Second})
		for i := range 4 {
			tr := moved(4242, correlate.DirH2D, 4<<20, 1+float64(i), 1.5+float64(i))
			tr.HostMem = c.mem
			s.Transfer(tr)
		}
		s.Findings(c.active, time.Unix(0, sec(8)))
		s.Release(time.Unix(0, sec(30)))
		got := summaries(mem)["ffff"]
		var fs string
		for _, a := range got.Attributes {
			if a.Key == AttrKVFindings {
				fs = a.Value.String()
			}
		}
		if fs != c.findings {
			t.Errorf("%s: findings %q, want %q", c.name, fs, c.findings)
		}
	}
}
