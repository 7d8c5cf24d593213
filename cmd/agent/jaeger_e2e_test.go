//go:build jaeger

package main

// TestJaegerE2E is the traces section's check against a real Jaeger v2,
// run by `make jaeger-e2e` (scripts/jaeger-e2e.sh starts Jaeger and sets
// LANEWATCH_JAEGER_OTLP and LANEWATCH_JAEGER_QUERY). Behind a build tag: it
// needs a Jaeger build that takes minutes, so `make test` never compiles it.

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	collectorpb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/lanewatch/lanewatch/internal/testenv"
	"github.com/lanewatch/lanewatch/otlpbridge"
	"github.com/lanewatch/lanewatch/selftest"
)

// jaegerTrace is the part of Jaeger's query API answer
// (GET /api/traces/{id}) the check reads.
type jaegerTrace struct {
	TraceID string `json:"traceID"`
	Spans   []struct {
		SpanID        string      `json:"spanID"`
		OperationName string      `json:"operationName"`
		ProcessID     string      `json:"processID"`
		References    []jaegerRef `json:"references"`
		Tags          []jaegerTag `json:"tags"`
	} `json:"spans"`
	Processes map[string]struct {
		ServiceName string `json:"serviceName"`
	} `json:"processes"`
}

type jaegerRef struct {
	RefType string `json:"refType"`
	SpanID  string `json:"spanID"`
}

type jaegerTag struct {
	Key   string `json:"key"`
	Type  string `json:"type"`
	Value any    `json:"value"`
}

func TestJaegerE2E(t *testing.T) {
	testenv.RequireRoot(t)
	otlp, query := os.Getenv("LANEWATCH_JAEGER_OTLP"), os.Getenv("LANEWATCH_JAEGER_QUERY")
	if otlp == "" || query == "" {
		t.Fatal("LANEWATCH_JAEGER_OTLP and LANEWATCH_JAEGER_QUERY must name a running Jaeger: run `make jaeger-e2e`")
	}
	refDir := testenv.RefDir(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlp)
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
	t.Setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
	grpcAddr, httpAddr := freePort(t), freePort(t)
	tmp := t.TempDir()

	a := startAgent(t, 60*time.Second, "--output", filepath.Join(tmp, "out.jsonl"),
		"--lib", filepath.Join(refDir, "lib", "libcuda.so.1"), "--lib", filepath.Join(refDir, "plain", "libcudart.so.12"),
		"--otlp.grpc-listen", grpcAddr, "--otlp.http-listen", httpAddr, "--spans.hold", "1h",
		"--web.listen-address", freePort(t))
	truth := runScenario(t, refDir, "hicache-load", filepath.Join(tmp, "truth.jsonl"))
	sg, per := selftest.SGLangSpans(truth, otlpbridge.NewClock().Offset())
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := collectorpb.NewTraceServiceClient(conn).Export(context.Background(), sg); err != nil {
		t.Fatalf("send SGLang spans over gRPC: %v", err)
	}
	// The engine emits the scenario's transfers at its exit: give the reader
	// a moment, then stop; the held transfers are exported on the way out.
	time.Sleep(time.Second)
	a.stop(t, time.Minute)
	t.Log(grepLines(a.stderr.String(), "transfer spans", "OTLP bridge", "OTLP forwarding"))

	sent := map[string]string{} // span id (hex) → trace id (hex) of every server span sent
	for _, rs := range sg.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				sent[hex.EncodeToString(sp.GetSpanId())] = hex.EncodeToString(sp.GetTraceId())
			}
		}
	}
	traces := map[string]bool{}
	for _, tr := range sent {
		traces[tr] = true
	}
	// Jaeger writes what it received within a moment of the agent's exit;
	// ask until every sent span and one transfer span per copy are there.
	var problems []string
	var matched, serverSpans int
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(time.Second) {
		var transfers []*tracepb.Span
		got := map[string]bool{}
		for tr := range traces {
			jt, err := fetchTrace(query, tr)
			if err != nil {
				problems = []string{err.Error()}
				continue
			}
			for _, sp := range jt.Spans {
				got[padID(sp.SpanID, 8)] = true
				if jt.Processes[sp.ProcessID].ServiceName == "lanewatch" {
					transfers = append(transfers, toSpan(t, jt.TraceID, sp.SpanID, sp.References, sp.Tags))
				}
			}
		}
		serverSpans = 0
		for id := range sent {
			if got[id] {
				serverSpans++
			}
		}
		problems, matched = selftest.CheckSGLangSpans(transfers, truth, per)
		if serverSpans == len(sent) && len(problems) == 0 || time.Now().After(deadline) {
			break
		}
	}
	t.Logf("Jaeger holds %d of %d server spans in %d traces; %d transfer spans matched the truth's request, layer, trace and parent",
		serverSpans, len(sent), len(traces), matched)
	if serverSpans != len(sent) {
		t.Errorf("Jaeger holds %d of the %d server spans sent", serverSpans, len(sent))
	}
	for _, p := range problems {
		t.Error("SGLang:", p)
	}
}

func fetchTrace(query, traceID string) (*jaegerTrace, error) {
	resp, err := http.Get(query + "/api/traces/" + traceID)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("trace %s: %s", traceID, resp.Status)
	}
	var body struct {
		Data []jaegerTrace `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return nil, fmt.Errorf("trace %s: %w", traceID, err)
	}
	if len(body.Data) != 1 {
		return nil, fmt.Errorf("trace %s: %d traces in the answer", traceID, len(body.Data))
	}
	return &body.Data[0], nil
}

// toSpan turns a Jaeger span back into OTLP's form for selftest's check:
// ids, the CHILD_OF parent and the tags as string or integer attributes.
func toSpan(t *testing.T, traceID, spanID string, refs []jaegerRef, tags []jaegerTag) *tracepb.Span {
	t.Helper()
	unhex := func(s string, size int) []byte {
		b, err := hex.DecodeString(padID(s, size))
		if err != nil {
			t.Fatalf("Jaeger id %q: %v", s, err)
		}
		return b
	}
	sp := &tracepb.Span{TraceId: unhex(traceID, 16), SpanId: unhex(spanID, 8)}
	for _, r := range refs {
		if r.RefType == "CHILD_OF" {
			sp.ParentSpanId = unhex(r.SpanID, 8)
		}
	}
	for _, tag := range tags {
		v := &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: fmt.Sprint(tag.Value)}}
		if f, ok := tag.Value.(float64); ok && tag.Type == "int64" {
			v = &commonpb.AnyValue{Value: &commonpb.AnyValue_IntValue{IntValue: int64(f)}}
		}
		sp.Attributes = append(sp.Attributes, &commonpb.KeyValue{Key: tag.Key, Value: v})
	}
	return sp
}

// padID pads an id from Jaeger's JSON, which drops leading zeros (a 64-bit
// trace id's high half), to size bytes in hex: OTLP's 16-byte trace and
// 8-byte span ids.
func padID(s string, size int) string {
	return strings.Repeat("0", max(0, 2*size-len(s))) + s
}
