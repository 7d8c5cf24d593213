package otlpbridge

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	collectorpb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/lanewatch/lanewatch/otlpbridge/shapes"
)

// fixtureRequests are the servers' real span shapes (shapes), as requests:
// SGLang's three releases (request, thread, HiCache spans) and vLLM's two.
func fixtureRequests() []*collectorpb.ExportTraceServiceRequest {
	now := time.Now().UnixNano()
	ids := shapes.NewIDs(7)
	th := shapes.SGLangThread{Label: "Scheduler", TID: 42, HostID: "0f1e2d3c4b5a69788796a5b4c3d2e1f0", TP: shapes.Rank(0)}
	var reqs []*collectorpb.ExportTraceServiceRequest
	for _, v := range []shapes.SGLangVersion{shapes.SGLangSept2025, shapes.SGLangOct2025, shapes.SGLangCurrent} {
		s := shapes.SGLang{Version: v, IDs: ids}
		client := shapes.Ref{TraceID: ids.Trace(), SpanID: ids.Span()}
		req, spans := s.Request("prefill", "rid-0123456789", 77, &client, now, now+1e6)
		_, thread := s.Thread(req, th, now+10, now+1e5)
		_, hc := s.HiCache(shapes.HiCacheOp{Stage: "hicache_l3_prefetch_transfer", Thread: th, ID: 1, RequestID: "rid-0123456789", Hashes: []string{"ab"}}, &client, now+20, now+30)
		spans = append(spans, thread, hc)
		reqs = append(reqs, &collectorpb.ExportTraceServiceRequest{ResourceSpans: []*tracepb.ResourceSpans{
			shapes.Batch(shapes.SGLangResource(), shapes.SGLangScope, spans...)}})
	}
	for _, v := range []shapes.VLLMVersion{shapes.VLLMCurrent, shapes.VLLMOlder} {
		client := shapes.Ref{TraceID: ids.Trace(), SpanID: ids.Span()}
		_, sp := shapes.VLLMSpan(v, ids, shapes.VLLMRequest{ID: "cmpl-1", Arrival: now, Finish: now + 1e6, TTFT: 0.1, Client: &client, MaxTokens: 16})
		reqs = append(reqs, &collectorpb.ExportTraceServiceRequest{ResourceSpans: []*tracepb.ResourceSpans{
			shapes.Batch(shapes.VLLMResource(v, 4242), shapes.VLLMScope(v), sp)}})
	}
	return reqs
}

func fuzzBridge(f *testing.F) *Bridge {
	b, err := New(Config{Logger: slog.New(slog.DiscardHandler), Limits: Limits{MaxBody: 1 << 20, MaxConcurrent: 4}})
	if err != nil {
		f.Fatal(err)
	}
	return b
}

// FuzzHTTPReceiver feeds OTLP/HTTP bodies (protobuf or JSON, plain or
// gzip) through the receiver into the index: never a panic, only OTLP's
// statuses, the budget whole again after each, and a JSON request taken is
// the one its re-encoding gives back.
func FuzzHTTPReceiver(f *testing.F) {
	for _, r := range fixtureRequests() {
		pb, _ := proto.Marshal(r)
		js, err := marshalJSON(r)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(pb, false, false)
		f.Add(gzipped(pb), false, true)
		f.Add(js, true, false)
		f.Add(gzipped(js), true, true)
	}
	f.Add([]byte(badID), true, false)
	f.Add([]byte(`{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"0102030405060708090A0B0C0D0E0F10","links":[{"spanId":"1112131415161718"}]}]}]}]}`), true, false)
	b := fuzzBridge(f)
	f.Fuzz(func(t *testing.T, body []byte, isJSON, gz bool) {
		req := httptest.NewRequest(http.MethodPost, "/v1/traces", bytes.NewReader(body))
		req.Header.Set("Content-Type", contentProto)
		if isJSON {
			req.Header.Set("Content-Type", contentJSON)
		}
		if gz {
			req.Header.Set("Content-Encoding", "gzip")
		}
		w := httptest.NewRecorder()
		b.serveHTTP(w, req)
		switch w.Code {
		case http.StatusOK, http.StatusBadRequest, http.StatusRequestEntityTooLarge:
		default:
			t.Fatalf("status %d: %s", w.Code, w.Body)
		}
		if used, _, n := b.budget.state(); used != 0 || n != 0 {
			t.Fatalf("after the request: %d bytes, %d requests held", used, n)
		}
		if w.Code != http.StatusOK || !isJSON || gz {
			return
		}
		var m collectorpb.ExportTraceServiceRequest
		if err := unmarshalJSON(body, &m); err != nil {
			t.Fatalf("answered 200 but does not decode: %v", err)
		}
		again, err := marshalJSON(&m)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		var m2 collectorpb.ExportTraceServiceRequest
		if err := unmarshalJSON(again, &m2); err != nil || !proto.Equal(&m, &m2) {
			t.Fatalf("JSON round trip: %v\n%s\n%s", err, body, again)
		}
	})
}

// FuzzGRPCExport feeds raw gRPC messages through the receiver's codec and
// handler into the index: OK exactly when the message is a valid
// protobuf, InvalidArgument otherwise, the budget whole again after each.
func FuzzGRPCExport(f *testing.F) {
	for _, r := range fixtureRequests() {
		pb, _ := proto.Marshal(r)
		f.Add(pb)
	}
	f.Add([]byte{0x0a, 0x05, 1, 2})
	b := fuzzBridge(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := b.budget.admit()
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.WithValue(context.Background(), claimKey{}, c)
		_, err = exportHandler(b, ctx, func(v any) error { return serverCodec{}.Unmarshal(data, v) }, nil)
		c.release()
		valid := proto.Unmarshal(data, &collectorpb.ExportTraceServiceRequest{}) == nil
		switch code := status.Code(err); {
		case code == codes.OK && valid, code == codes.InvalidArgument && !valid:
		default:
			t.Fatalf("%s for a message that decodes: %v (%v)", code, valid, err)
		}
		if used, _, n := b.budget.state(); used != 0 || n != 0 {
			t.Fatalf("after the call: %d bytes, %d requests held", used, n)
		}
	})
}

// OTLP/JSON ids are hex wherever they are (span, parent, links), any case;
// anything else is an error naming the id. The result is what rewriting
// the ids to base64 before protojson (main's decoder) gave.
func TestUnmarshalJSONIDs(t *testing.T) {
	const trace, span = "0102030405060708090a0b0c0d0e0f10", "1112131415161718"
	for _, tc := range []struct {
		name, body, err string
	}{
		{"span", `{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"` + trace + `","spanId":"` + span + `","parentSpanId":"` + span + `"}]}]}]}`, ""},
		{"upper case", `{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"` + strings.ToUpper(trace) + `"}]}]}]}`, ""},
		{"link", `{"resourceSpans":[{"scopeSpans":[{"spans":[{"links":[{"traceId":"` + trace + `","spanId":"` + span + `"}]}]}]}]}`, ""},
		{"empty ids", `{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"","spanId":""}]}]}]}`, ""},
		{"base64", `{"resourceSpans":[{"scopeSpans":[{"spans":[{"spanId":"ERITFBUWFxg="}]}]}]}`, `id "ERITFBUWFxg=" is not hex`},
		{"not hex", `{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"zz02030405060708090a0b0c0d0e0f10"}]}]}]}`, "is not hex"},
		{"not JSON", `{"resourceSpans":`, "unexpected EOF"},
	} {
		var got collectorpb.ExportTraceServiceRequest
		err := unmarshalJSON([]byte(tc.body), &got)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: %v, want %q", tc.name, err, tc.err)
			}
			continue
		}
		var want collectorpb.ExportTraceServiceRequest
		b64, err2 := rewriteIDs([]byte(tc.body), hexToBase64)
		if err2 == nil {
			err2 = protojson.Unmarshal(b64, &want)
		}
		if err != nil || err2 != nil || !proto.Equal(&got, &want) {
			t.Errorf("%s: %v %v\ngot  %v\nwant %v", tc.name, err, err2, &got, &want)
		}
	}
}

// hexToBase64 is main's id rewrite, the reference for the decoder.
func hexToBase64(s string) (string, error) {
	raw, err := hex.DecodeString(s)
	return base64.StdEncoding.EncodeToString(raw), err
}
