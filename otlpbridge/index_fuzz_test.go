package otlpbridge

import (
	"fmt"
	"testing"
	"time"

	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/lanewatch/lanewatch/otlpbridge/shapes"
)

// consistent checks the index's books against what it holds: every stored
// thing once in the queue, its cost summed into the budget, the trees
// holding exactly the live spans.
func (x *Index) consistent() error {
	var bytes int64
	n, live := 0, 0
	for _, s := range x.fifo[x.head:] {
		if x.dead(s) {
			continue
		}
		n++
		switch {
		case s.e != nil:
			live++
			bytes += s.e.cost
			if x.byRef[s.e.ref] != s.e {
				return fmt.Errorf("span %x in the queue, not by its ref", s.e.ref.SpanID)
			}
		case s.ti != nil:
			bytes += s.ti.cost
		case s.rr != nil:
			bytes += s.rr.cost
		default:
			bytes += s.ot.cost
		}
	}
	rooms := 0
	for _, rs := range x.rooms {
		rooms += len(rs)
	}
	trees := 0
	for _, m := range []map[uint32]*ivTree{x.threads, x.procs} {
		for _, tr := range m {
			trees += tr.n
		}
	}
	for _, tr := range x.children {
		trees += tr.n
	}
	traceScope, adopted := 0, 0
	for _, e := range x.byRef {
		if e.rule.Scope == ScopeTrace {
			traceScope++
		}
		if e.rule.Narrow && e.adopted {
			adopted++
		}
	}
	narrow := 0
	for _, tr := range x.narrow {
		narrow += tr.n
	}
	switch {
	case n != x.nstored || live != x.live || bytes != x.bytes:
		return fmt.Errorf("books say %d stored, %d spans, %d bytes; the queue holds %d, %d, %d", x.nstored, x.live, x.bytes, n, live, bytes)
	case len(x.byRef) != live || trees+traceScope != live:
		return fmt.Errorf("%d live spans, %d by ref, %d in trees + %d trace-scope", live, len(x.byRef), trees, traceScope)
	case narrow != adopted:
		return fmt.Errorf("%d forward slices under a known thread span, %d in the thread trees", adopted, narrow)
	case n != live+len(x.traces)+rooms+len(x.open):
		return fmt.Errorf("%d stored, %d spans + %d traces + %d rooms + %d open", n, live, len(x.traces), rooms, len(x.open))
	case x.bytes > x.cfg.MaxBytes || x.nstored > x.cfg.MaxSpans:
		return fmt.Errorf("%d bytes, %d stored: past the budget (%d, %d)", x.bytes, x.nstored, x.cfg.MaxBytes, x.cfg.MaxSpans)
	}
	return nil
}

// FuzzIndex: any export request, arriving at any time, leaves the index
// within its budget with its books right, and every transfer gets an
// answer.
func FuzzIndex(f *testing.F) {
	ids := shapes.NewIDs(40)
	s := shapes.SGLang{Version: shapes.SGLangCurrent, IDs: ids}
	req, rs := s.Request("prefill", "fuzz", 0x2a, nil, at(0), at(100))
	th, ts := s.Thread(req, shapes.SGLangThread{Label: "Scheduler", TID: 9, HostID: hostA}, at(1), at(90))
	_, fs := s.Slice(th, "prefill_forward", at(10), at(40))
	_, vs := shapes.VLLMSpan(shapes.VLLMCurrent, ids, shapes.VLLMRequest{ID: "cmpl-fuzz-0", Arrival: at(0), Finish: at(50)})
	for _, batch := range []*tracepb.ResourceSpans{sg(append(rs, ts, fs)...), sg(ts, fs), sg(fs),
		shapes.Batch(shapes.VLLMResource(shapes.VLLMCurrent, 9), shapes.VLLMScope(shapes.VLLMCurrent), vs)} {
		b, err := proto.Marshal(&tracepb.TracesData{ResourceSpans: []*tracepb.ResourceSpans{batch}})
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, int64(50), int64(200))
	}
	f.Fuzz(func(t *testing.T, b []byte, askMs, arriveMs int64) {
		var td tracepb.TracesData
		if proto.Unmarshal(b, &td) != nil {
			return
		}
		x := NewIndex(IndexConfig{Window: time.Minute, MaxBytes: 4096, MaxSpans: 12, MaxOpen: 3, MaxCover: 4, Procs: fakeProcs{parents: map[uint32]uint32{9: 1}}})
		for i := range 3 { // the same request again, later: replaced, aged
			x.AddAt(td.ResourceSpans, time.Unix(0, at(arriveMs+int64(i)*40_000)))
			if err := x.consistent(); err != nil {
				t.Fatalf("after request %d: %v", i, err)
			}
			for _, tid := range []uint32{9, 10} {
				if a := x.Attribute(9, tid, at(askMs)); a.Batch > 0 && len(a.Requests) == 0 {
					t.Fatalf("batch %d with no requests listed", a.Batch)
				}
			}
		}
	})
}
