package otlpbridge

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/lanewatch/lanewatch/otlpbridge/shapes"
)

func TestParseRule(t *testing.T) {
	for _, tc := range []struct {
		in    string
		check func(Rule) bool
		err   string // "" ok, else a part of the error
	}{
		{in: `name=trt,span=^request$,scope=process,request=request.id,process=process.pid`,
			check: func(r Rule) bool {
				return r.Scope == ScopeProcess && r.Request == "request.id" && r.Process == "process.pid"
			}},
		{in: `name=t,span=a\,b,scope=thread,thread=tid`, check: func(r Rule) bool { return r.Span.MatchString("a,b") }},
		{in: `name=sg,span=(^|\s)Req \S,scope=trace,request=rid,room=bootstrap_room,attr=module=^sglang::request$,attr=rid`,
			check: func(r Rule) bool {
				return r.Room == "bootstrap_room" && len(r.Attrs) == 2 && r.Attrs[0].Key == "module" && r.Attrs[0].Value.MatchString("sglang::request") &&
					r.Attrs[1].Key == "rid" && r.Attrs[1].Value == nil && r.Span.MatchString("prefill Req 1a2b3c4d") && !r.Span.MatchString("Request")
			}},
		{in: `name=mc,span=^Sender Req ,scope=trace,room=bootstrap_room`, check: func(r Rule) bool { return r.Request == "" && r.Room == "bootstrap_room" }},
		{in: `name=fw,span=^prefill_forward$,scope=slice,narrow=true`, check: func(r Rule) bool { return r.Scope == ScopeSlice && r.Narrow }},
		{in: `name=th,span=\(host:\S* \| pid:[0-9]+\)$,scope=thread,thread=pid,host=host_id,attr=thread_label=Scheduler$`,
			check: func(r Rule) bool {
				return r.Host == "host_id" && r.Span.MatchString("Scheduler [TP 0] (host:8f3c1e0b | pid:42)")
			}},
		{in: `name=t,span=x,scope=thread`, err: "scope thread needs thread=ATTR"},
		{in: `name=t,span=(,scope=trace,request=r`, err: "span pattern"},
		{in: `span=x,scope=trace,request=r`, err: "name and span are required"},
		{in: `name=t,span=x,scope=galaxy,request=r`, err: `scope "galaxy"`},
		{in: `name=t,span=x,scope=trace,request=r,colour=blue`, err: `unknown key "colour"`},
		{in: `name=t,span=x,scope=trace`, err: "request=ATTR or room=ATTR"},
		{in: `name=t,span=x,scope=process`, err: "scope process needs request=ATTR"},
		{in: `name=t,span=x,scope=trace,request=r,narrow=true`, err: "narrow is for scope slice"},
		{in: `name=t,span=x,scope=slice,narrow=yes`, err: `narrow="yes"`},
		{in: `name=t,span=x,scope=slice,attr==v`, err: "empty attribute key"},
		{in: `name=t,span=x,scope=slice,attr=k=(`, err: "attr k pattern"},
		{in: `name=t,span=x,scope=trace,request=r,host=h`, err: "host= is for scope thread"},
		{in: `name=t,span=x,scope=trace,request=r,process=p`, err: "process= is for scope process"},
		{in: `name=t,name=u,span=x,scope=slice`, err: "name given twice"},
		{in: `name=t,span=x,scope=slice,oops`, err: `item 4 "oops" is not key=value`},
	} {
		r, err := ParseRule(tc.in)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%q: %v", tc.in, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%q: error %v, want one saying %q", tc.in, err, tc.err)
		case tc.err == "" && !tc.check(r):
			t.Errorf("%q: parsed %+v", tc.in, r)
		case err != nil && !strings.Contains(err.Error(), tc.in):
			t.Errorf("%q: error %q does not name the rule", tc.in, err)
		}
	}
}

func FuzzParseRule(f *testing.F) {
	f.Add(`name=t,span=(^|\s)Req \S,scope=trace,request=rid,room=bootstrap_room`)
	f.Add(`name=t,span=a\,b,scope=thread,thread=pid,host=host_id,attr=thread_label`)
	f.Add(`name=f,span=^decode_forward$,scope=slice,narrow=true,attr=k=^v$`)
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseRule(s)
		if err == nil && (r.Name == "" || r.Span == nil) {
			t.Errorf("%q: accepted without name or span: %+v", s, r)
		}
	})
}

// TestDefaultRulesMatchShapes: every span each server shape makes is read
// as what it is.
func TestDefaultRulesMatchShapes(t *testing.T) {
	x := NewIndex(IndexConfig{Procs: fakeProcs{}})
	ids := shapes.NewIDs(20)
	th := shapes.SGLangThread{Label: "Decode Scheduler", TID: 11, HostID: hostA, TP: shapes.Rank(3), PP: shapes.Rank(0), DP: shapes.Rank(1)}
	type c struct {
		span *tracepb.Span
		rule string
	}
	var cases []c
	for _, v := range []shapes.SGLangVersion{shapes.SGLangSept2025, shapes.SGLangOct2025, shapes.SGLangCurrent} {
		s := shapes.SGLang{Version: v, IDs: ids}
		for _, role := range []string{"unified", "prefill", "decode"} {
			req, rs := s.Request(role, "3_0123456789abcdef", 0x77, nil, 1, 2)
			for _, sp := range rs {
				rule := "sglang-request"
				if strings.HasPrefix(sp.GetName(), "Bootstrap Room") {
					rule = "sglang-bootstrap"
				}
				cases = append(cases, c{sp, rule})
			}
			_, tsp := s.Thread(req, th, 1, 2)
			cases = append(cases, c{tsp, "sglang-thread"})
			_, fw := s.Slice(req, "decode_forward", 1, 2)
			_, wt := s.Slice(req, "prefill_waiting", 1, 2)
			cases = append(cases, c{fw, "sglang-forward"}, c{wt, "sglang-slice"})
		}
	}
	s := shapes.SGLang{Version: shapes.SGLangCurrent, IDs: ids}
	_, mc := s.MooncakeSender(0x77, 1, 2)
	cases = append(cases, c{mc[0], "sglang-mooncake"})
	for _, st := range []string{"hicache_l3_backup", "hicache_l3_prefetch_query", "hicache_l3_prefetch_transfer"} {
		_, h := s.HiCache(shapes.HiCacheOp{Stage: st, Thread: th, ID: 1, RequestID: "r"}, nil, 1, 2)
		cases = append(cases, c{h, "sglang-hicache"})
	}
	for _, v := range []shapes.VLLMVersion{shapes.VLLMCurrent, shapes.VLLMOlder} {
		_, sp := shapes.VLLMSpan(v, ids, shapes.VLLMRequest{ID: "cmpl-1", Arrival: 1, Finish: 2})
		cases = append(cases, c{sp, "vllm-request"})
	}
	for _, tc := range cases {
		got := ""
		if r := x.match(tc.span); r != nil {
			got = r.Name
		}
		if got != tc.rule {
			t.Errorf("span %q %v: rule %q, want %q", tc.span.GetName(), tc.span.GetAttributes(), got, tc.rule)
		}
	}
	// Names the patterns must not take.
	for _, name := range []string{"Request", "Req", "Scheduler", "Load model", "Worker init"} {
		if r := x.match(&tracepb.Span{Name: name, Attributes: []*commonpb.KeyValue{shapes.Str("rid", "x")}}); r != nil {
			t.Errorf("%q read as %s", name, r.Name)
		}
	}
}

func TestNormRoom(t *testing.T) {
	for in, want := range map[string]string{
		"0x5a3c9e": "0x5a3c9e", "0X5A3C9E": "0x5a3c9e", "5909406": "0x5a2b9e", "None": "", "": "", "0": "", "0x0": "",
		" 42 ": "0x2a", "room-7": "room-7", "0xzz": "0xzz", "18446744073709551615": "0xffffffffffffffff",
	} {
		if got := normRoom(in); got != want {
			t.Errorf("normRoom(%q) = %q, want %q", in, got, want)
		}
	}
}

func FuzzNormRoom(f *testing.F) {
	for _, s := range []string{"0x1f", "31", "None", "0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n := normRoom(s)
		if n != "" && normRoom(n) != n {
			t.Errorf("normRoom(%q) = %q is not stable: %q", s, n, normRoom(n))
		}
	})
}

func TestParseStatPPID(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want uint32
		err  string
	}{
		{in: "4242 (python3) S 4200 4242 4200 0 -1 4194560 …", want: 4200},
		{in: "77 (VllmWorker TP0 (rank)) R 76 77 1 0", want: 76},
		{in: "1 (systemd) S 0 1 1 0", want: 0},
		{in: "12 (x", err: "no ')'"},
		{in: "12 (x) S", err: "1 fields"},
		{in: "12 (x) S -3", err: `ppid "-3"`},
	} {
		got, err := parseStatPPID([]byte(tc.in))
		if tc.err == "" && (err != nil || got != tc.want) || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%q: %d, %v; want %d, error with %q", tc.in, got, err, tc.want, tc.err)
		}
	}
}

func FuzzParseStatPPID(f *testing.F) {
	f.Add([]byte("4242 (python3) S 4200 4242"))
	f.Add([]byte("1 (a) b) S 9"))
	f.Fuzz(func(t *testing.T, b []byte) { parseStatPPID(b) })
}

// TestProcFS reads machine ids and parents from a procfs-shaped tree: a
// containerised server sees its own /etc/machine-id.
func TestProcFS(t *testing.T) {
	root := t.TempDir()
	write := func(rel, body string) {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("100/root/etc/machine-id", hostA+"\n")
	write("100/stat", "100 (sglang::scheduler) S 90 100 90 0 -1")
	write("200/root/etc/machine-id", hostB+"\n")
	write("300/stat", "300 (python) S 100 300")
	p := NewProcFS(root)
	if h, ok := p.HostID(100); !ok || h != hostA {
		t.Errorf("host of 100: %q %v", h, ok)
	}
	if h, ok := p.HostID(200); !ok || h != hostB {
		t.Errorf("host of 200 (own mount namespace): %q %v", h, ok)
	}
	if _, ok := p.HostID(300); ok {
		t.Error("host of 300 (no machine-id): known")
	}
	if pp, ok := p.Parent(300); !ok || pp != 100 {
		t.Errorf("parent of 300: %d %v", pp, ok)
	}
	if _, ok := p.Parent(400); ok {
		t.Error("parent of a missing process: known")
	}
	write("400/stat", "400 (x) S 300")
	if _, ok := p.Parent(400); ok {
		t.Error("cache not used")
	}
	p.Forget()
	if pp, ok := p.Parent(400); !ok || pp != 300 {
		t.Errorf("after Forget: %d %v", pp, ok)
	}
}

// FuzzIndexSpan: spans from outside, any name, attributes, ids and times:
// indexing and answering never panic, and what is answered names only
// received spans.
func FuzzIndexSpan(f *testing.F) {
	f.Add(" Req 1a2b", "rid", "1a2b", "pid", int64(42), []byte{1, 2}, int64(0), int64(100), "0x1f")
	f.Add("Scheduler [TP 0] (host:ab | pid:7)", "thread_label", "Scheduler", "pid", int64(7), []byte{}, int64(5), int64(1), "None")
	f.Add("llm_request", "gen_ai.request.id", "cmpl-1", "vllm.process_id", int64(-1), []byte{9, 9, 9, 9, 9, 9, 9, 9}, int64(0), int64(9), "")
	f.Fuzz(func(t *testing.T, name, k1, v1, k2 string, v2 int64, parent []byte, start, end int64, room string) {
		x := NewIndex(IndexConfig{Procs: fakeProcs{}})
		sp := &tracepb.Span{TraceId: make([]byte, 16), SpanId: []byte{1, 2, 3, 4, 5, 6, 7, 8}, ParentSpanId: parent, Name: name,
			StartTimeUnixNano: uint64(start), EndTimeUnixNano: uint64(end),
			Attributes: []*commonpb.KeyValue{shapes.Str(k1, v1), shapes.Int(k2, v2), shapes.Str("bootstrap_room", room), shapes.Str("module", v1)}}
		sp.TraceId[15] = 1
		x.Add([]*tracepb.ResourceSpans{shapes.Batch([]*commonpb.KeyValue{shapes.Int("vllm.process_id", v2)}, "s", sp)})
		for _, tid := range []uint32{uint32(v2), 7, 1} {
			a := x.Attribute(1, tid, start)
			if a.Parent.Valid() && a.Parent.SpanID != [8]byte{1, 2, 3, 4, 5, 6, 7, 8} {
				t.Errorf("answer names a span never received: %+v", a)
			}
		}
	})
}
