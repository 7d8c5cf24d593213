package otlpbridge

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
)

func kv(k, v string) *commonpb.KeyValue {
	return &commonpb.KeyValue{Key: k, Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: v}}}
}

func span(trace, id byte, name string, start, end int64, attrs ...*commonpb.KeyValue) *tracepb.Span {
	return &tracepb.Span{TraceId: bytes.Repeat([]byte{trace}, 16), SpanId: bytes.Repeat([]byte{id}, 8), Name: name,
		StartTimeUnixNano: uint64(start), EndTimeUnixNano: uint64(end), Attributes: attrs}
}

func rs(res []*commonpb.KeyValue, spans ...*tracepb.Span) []*tracepb.ResourceSpans {
	return []*tracepb.ResourceSpans{{ScopeSpans: []*tracepb.ScopeSpans{{Spans: spans}}}}
}

func TestIndexAttribution(t *testing.T) {
	now := time.Now().UnixNano()
	x := NewIndex(IndexConfig{})
	// SGLang: the thread span arrives before its root (roots end last).
	x.Add(rs(nil, span(1, 11, "Scheduler", now, now+100, kv("pid", "77"))))
	x.Add(rs(nil, span(1, 10, "Req abc", now-10, now+110, kv("rid", "abc"), kv("bootstrap_room", "5"))))
	// vLLM: two overlapping requests of any process.
	x.Add(rs(nil, span(2, 20, "llm_request", now+1000, now+2000, kv("gen_ai.request.id", "r1")),
		span(3, 30, "llm_request", now+1500, now+2500, kv("gen_ai.request.id", "r2"))))
	a := x.Attribute(9, 77, now+50)
	if a.Request != "abc" || a.Parent.SpanID[0] != 11 || a.Parent.TraceID[0] != 1 || a.Batch != 0 {
		t.Errorf("thread span: %+v", a)
	}
	if a := x.Attribute(9, 78, now+50); a.Rule != "" {
		t.Errorf("other thread, no process span: %+v", a)
	}
	if a := x.Attribute(9, 78, now+1200); a.Request != "r1" || a.Parent.SpanID[0] != 20 {
		t.Errorf("one vLLM request: %+v", a)
	}
	a = x.Attribute(9, 78, now+1700)
	if a.Batch != 2 || len(a.Requests) != 2 || a.Requests[0] != "r1" || a.Requests[1] != "r2" || a.Request != "" {
		t.Errorf("batch: %+v", a)
	}
	st := x.Stats()
	if st.Spans != 4 || st.Indexed != 4 || st.Live != 3 {
		t.Errorf("stats %+v", st)
	}
}

func TestIndexEviction(t *testing.T) {
	now := time.Now().UnixNano()
	x := NewIndex(IndexConfig{MaxSpans: 2, Window: time.Minute})
	x.Add(rs(nil, span(1, 1, "s", now-int64(2*time.Minute), now-int64(2*time.Minute)+1, kv("pid", "5"))))
	x.Add(rs(nil, span(1, 2, "s", now, now+1, kv("pid", "5")), span(1, 3, "s", now, now+1, kv("pid", "5")), span(1, 4, "s", now, now+1, kv("pid", "5"))))
	st := x.Stats()
	if st.Evicted != 1 || st.CapEvicts != 1 || st.Live != 2 {
		t.Errorf("stats %+v", st)
	}
}

func TestParseRule(t *testing.T) {
	for _, tc := range []struct {
		in string
		ok bool
	}{
		{`name=trt,span=^request$,scope=process,request=request.id,process=process.pid`, true},
		{`name=t,span=a\,b,scope=thread,thread=tid`, true},
		{`name=t,span=x,scope=thread`, false},
		{`name=t,span=(,scope=trace,request=r`, false},
		{`span=x,scope=trace,request=r`, false},
		{`name=t,span=x,scope=galaxy,request=r`, false},
		{`name=t,span=x,scope=trace,request=r,colour=blue`, false},
	} {
		r, err := ParseRule(tc.in)
		if (err == nil) != tc.ok {
			t.Errorf("%q: err %v", tc.in, err)
		}
		if tc.ok && tc.in[7:8] == "a" && !r.Span.MatchString("a,b") {
			t.Errorf("%q: escaped comma lost: %v", tc.in, r.Span)
		}
	}
}

func FuzzParseRule(f *testing.F) {
	f.Add(`name=t,span=^Req ,scope=trace,request=rid`)
	f.Add(`name=t,span=a\,b,scope=thread,thread=pid`)
	f.Fuzz(func(t *testing.T, s string) { ParseRule(s) })
}

// TestHTTPForwardUnchanged: an OTLP/JSON body is forwarded byte for byte to an
// HTTP/JSON upstream, and its spans (hex ids) are indexed.
func TestHTTPForwardUnchanged(t *testing.T) {
	var got []byte
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b := new(bytes.Buffer)
		b.ReadFrom(r.Body)
		got = b.Bytes()
	}))
	defer up.Close()
	b, err := New(Config{HTTPListen: "127.0.0.1:0", Upstream: Upstream{Endpoint: up.URL + "/v1/traces", Protocol: "http/json", Timeout: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	b.Serve()
	defer b.Close()
	now := time.Now().UnixNano()
	body := fmt.Appendf(nil, `{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"0102030405060708090a0b0c0d0e0f10","spanId":"1112131415161718",`+
		`"name":"Scheduler","startTimeUnixNano":"%d","endTimeUnixNano":%d,"attributes":[{"key":"pid","value":{"intValue":"42"}}]}]}]}]}`, now, now+1000)
	resp, err := http.Post("http://"+b.HTTPAddr().String()+"/v1/traces", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || !bytes.Equal(got, body) {
		t.Fatalf("status %s, upstream got %q", resp.Status, got)
	}
	a := b.Index().Attribute(1, 42, now+500)
	if a.Parent.SpanID != [8]byte{0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18} || a.Parent.TraceID[15] != 0x10 {
		t.Errorf("JSON span not indexed with its hex ids: %+v", a)
	}
}

func TestUpstreamFromEnv(t *testing.T) {
	env := map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/", "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "a=b%20c,x=y"}
	u, err := UpstreamFromEnv(func(k string) string { return env[k] })
	if err != nil || u.Endpoint != "http://collector:4318/v1/traces" || u.Protocol != "http/protobuf" || u.Headers["a"] != "b c" {
		t.Errorf("%+v %v", u, err)
	}
	u, err = UpstreamFromEnv(func(string) string { return "" })
	if err != nil || u.Endpoint != "" {
		t.Errorf("unset: %+v %v", u, err)
	}
	if _, err := sameEndpointErr(); err != nil {
		t.Error(err)
	}
}

func sameEndpointErr() (bool, error) {
	_, err := New(Config{HTTPListen: "127.0.0.1:14999", Upstream: Upstream{Endpoint: "http://localhost:14999/v1/traces", Protocol: "http/protobuf"}})
	if err == nil {
		return false, errTest("upstream = own listen address accepted")
	}
	return true, nil
}

type errTest string

func (e errTest) Error() string { return string(e) }
