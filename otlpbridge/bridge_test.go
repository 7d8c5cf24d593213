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

func span(trace, id byte, name string, start, end int64, attrs ...*commonpb.KeyValue) *tracepb.Span {
	return &tracepb.Span{TraceId: bytes.Repeat([]byte{trace}, 16), SpanId: bytes.Repeat([]byte{id}, 8), Name: name,
		StartTimeUnixNano: uint64(start), EndTimeUnixNano: uint64(end), Attributes: attrs}
}

func rs(res []*commonpb.KeyValue, spans ...*tracepb.Span) []*tracepb.ResourceSpans {
	return []*tracepb.ResourceSpans{{ScopeSpans: []*tracepb.ScopeSpans{{Spans: spans}}}}
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
	b, err := New(Config{HTTPListen: "127.0.0.1:0", Upstream: Upstream{Endpoint: up.URL + "/v1/traces", Protocol: "http/json", Timeout: time.Second},
		Index: IndexConfig{Procs: fakeProcs{hosts: map[uint32]string{1: "0f1e2d3c4b5a69788796a5b4c3d2e1f0"}}}})
	if err != nil {
		t.Fatal(err)
	}
	b.Serve()
	defer b.Close()
	now := time.Now().UnixNano()
	body := fmt.Appendf(nil, `{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"0102030405060708090a0b0c0d0e0f10","spanId":"1112131415161718",`+
		`"name":"Scheduler [TP 0] (host:0f1e2d3c | pid:42)","startTimeUnixNano":"%d","endTimeUnixNano":%d,"attributes":[{"key":"tp_rank","value":{"intValue":"0"}},`+
		`{"key":"host_id","value":{"stringValue":"0f1e2d3c4b5a69788796a5b4c3d2e1f0"}},{"key":"pid","value":{"intValue":"42"}},{"key":"thread_label","value":{"stringValue":"Scheduler"}}]}]}]}]}`, now, now+1000)
	resp, err := http.Post("http://"+b.HTTPAddr().String()+"/v1/traces", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || !bytes.Equal(got, body) {
		t.Fatalf("status %s, upstream got %q", resp.Status, got)
	}
	a := b.Index().Attribute(1, 42, now+500)
	if a.Rule != "sglang-thread" || a.Scope != ScopeOfThread || a.Parent.SpanID != [8]byte{0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18} || a.Parent.TraceID[15] != 0x10 {
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
