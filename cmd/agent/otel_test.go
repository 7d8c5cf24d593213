package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	collectorpb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/lanewatch/lanewatch/internal/testenv"
	"github.com/lanewatch/lanewatch/otlpbridge"
	"github.com/lanewatch/lanewatch/selftest"
)

// syncBuf is a goroutine-safe log sink.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// inProcessAgent is `agent run` started by realMain in this test process
// (its SIGTERM is this process's).
type inProcessAgent struct {
	stderr  syncBuf
	code    chan int
	stopped bool
}

// startAgent runs `agent run args...` here and waits up to ready for it to
// say it is running; the agent is stopped when the test ends, if the test
// did not stop it.
func startAgent(t *testing.T, ready time.Duration, args ...string) *inProcessAgent {
	t.Helper()
	a := &inProcessAgent{code: make(chan int, 1)}
	go func() { a.code <- realMain(append([]string{"run"}, args...), &bytes.Buffer{}, &a.stderr) }()
	for deadline := time.Now().Add(ready); !strings.Contains(a.stderr.String(), "lanewatch running"); time.Sleep(50 * time.Millisecond) {
		select {
		case c := <-a.code:
			t.Fatalf("agent exited %d:\n%s", c, a.stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent not ready:\n%s", a.stderr.String())
		}
	}
	t.Cleanup(func() {
		if !a.stopped {
			syscall.Kill(os.Getpid(), syscall.SIGTERM)
			<-a.code
		}
	})
	return a
}

// stop sends SIGTERM and waits up to limit for a clean exit.
func (a *inProcessAgent) stop(t *testing.T, limit time.Duration) {
	t.Helper()
	a.stopped = true
	syscall.Kill(os.Getpid(), syscall.SIGTERM)
	select {
	case c := <-a.code:
		if c != 0 {
			t.Fatalf("agent run exited %d:\n%s", c, a.stderr.String())
		}
	case <-time.After(limit):
		t.Fatalf("agent run still running %v after SIGTERM", limit)
	}
}

func freePort(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func runScenario(t *testing.T, refDir, scenario, truth string) []selftest.TruthCall {
	cmd := exec.Command(filepath.Join(refDir, "bin", "kvpath"), "--scenario", scenario, "--truth", truth)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", scenario, err, out)
	}
	f, err := os.Open(truth)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	calls, err := selftest.ReadTruth(f, truth)
	if err != nil {
		t.Fatal(err)
	}
	return calls
}

// TestRunTraces is the traces acceptance test: `agent run` with its OTLP
// bridge on loopback, a fake upstream collector, the reference path's
// hicache-load twice while SGLang-shaped (gRPC) and vLLM-shaped (HTTP JSON)
// spans are sent to the agent; then the upstream must hold the server's
// spans unchanged and transfer spans in the right traces, under the right
// parents, with the truth's request and layer.
func TestRunTraces(t *testing.T) {
	testenv.RequireRoot(t)
	refDir := testenv.RefDir(t)
	rec, err := otlpbridge.NewRecorder()
	if err != nil {
		t.Fatal(err)
	}
	defer rec.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+rec.Addr())
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
	t.Setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
	t.Setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=e2e")
	grpcAddr, httpAddr := freePort(t), freePort(t)
	tmp := t.TempDir()

	a := startAgent(t, 30*time.Second, "--output", filepath.Join(tmp, "out.jsonl"),
		"--lib", filepath.Join(refDir, "lib", "libcuda.so.1"), "--lib", filepath.Join(refDir, "plain", "libcudart.so.12"),
		"--otlp.grpc-listen", grpcAddr, "--otlp.http-listen", httpAddr, "--spans.hold", "1h",
		"--web.listen-address", freePort(t))

	sgTruth := runScenario(t, refDir, "hicache-load", filepath.Join(tmp, "sglang.jsonl"))
	vlTruth := runScenario(t, refDir, "hicache-load", filepath.Join(tmp, "vllm.jsonl"))
	offset := otlpbridge.NewClock().Offset()
	sg, per := selftest.SGLangSpans(sgTruth, offset)
	vl, vreqs := selftest.VLLMSpans(vlTruth, offset, 2)

	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := collectorpb.NewTraceServiceClient(conn).Export(context.Background(), sg); err != nil {
		t.Fatalf("send SGLang spans over gRPC: %v", err)
	}
	body, err := protojson.Marshal(vl)
	if err != nil {
		t.Fatal(err)
	}
	// OTLP/JSON writes ids as hex; protojson wrote base64.
	body = hexIDs(t, body)
	resp, err := http.Post("http://"+httpAddr+"/v1/traces", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("send vLLM spans over HTTP/JSON: %s", resp.Status)
	}

	// The engine emits the scenario's transfers at its exit; give the
	// reader a moment, then stop: the held transfers are exported.
	time.Sleep(time.Second)
	a.stop(t, time.Minute)
	t.Log(grepLines(a.stderr.String(), "transfer spans", "OTLP bridge", "OTLP forwarding"))

	reqs := rec.Requests()
	for name, sent := range map[string]*collectorpb.ExportTraceServiceRequest{"SGLang (gRPC)": sg, "vLLM (HTTP/JSON)": vl} {
		want, _ := proto.MarshalOptions{Deterministic: true}.Marshal(sent)
		found := false
		for _, r := range reqs {
			got, _ := proto.MarshalOptions{Deterministic: true}.Marshal(r)
			found = found || bytes.Equal(got, want)
		}
		if !found {
			t.Errorf("%s spans did not arrive upstream unchanged", name)
		}
	}
	spans := selftest.TransferSpans(reqs)
	problems, matched := selftest.CheckSGLangSpans(spans, sgTruth, per)
	for _, p := range problems {
		t.Error("SGLang:", p)
	}
	t.Logf("SGLang: %d transfer spans matched the truth's request, layer, trace and parent", matched)

	// vLLM: no thread; both overlapping requests cover every copy → batch.
	vpid := strconv.FormatUint(uint64(vlTruth[0].PID), 10)
	n := 0
	for _, sp := range spans {
		at := map[string]string{}
		for _, kv := range sp.GetAttributes() {
			at[kv.GetKey()] = attrString(kv.GetValue())
		}
		if at["lanewatch.pid"] != vpid {
			continue
		}
		n++
		ids := vreqs[1].ID + "," + vreqs[0].ID // by span start: the second starts first
		if at["lanewatch.attribution"] != "batch" || at["lanewatch.batch.count"] != "2" || at["lanewatch.batch.request_ids"] != ids || len(sp.GetLinks()) != 2 {
			t.Fatalf("vLLM transfer span %x: want a batch of %s with 2 links, got %v, %d links", sp.GetSpanId(), ids, at, len(sp.GetLinks()))
		}
		if at["lanewatch.layer"] == "" {
			t.Errorf("vLLM transfer span %x: no layer", sp.GetSpanId())
		}
	}
	if n == 0 {
		t.Errorf("no transfer spans of the vLLM-attributed process %s", vpid)
	}
	for _, rs := range reqs {
		for _, r := range rs.GetResourceSpans() {
			if s, _ := findAttr(r.GetResource().GetAttributes(), "service.name"); s == "lanewatch" {
				if env, _ := findAttr(r.GetResource().GetAttributes(), "deployment.environment"); env != "e2e" {
					t.Errorf("resource without OTEL_RESOURCE_ATTRIBUTES: %v", r.GetResource())
				}
				return
			}
		}
	}
	t.Error("no lanewatch resource upstream")
}

func findAttr(kvs []*commonKV, key string) (string, bool) {
	for _, kv := range kvs {
		if kv.GetKey() == key {
			return attrString(kv.GetValue()), true
		}
	}
	return "", false
}

func grepLines(s string, subs ...string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		for _, sub := range subs {
			if strings.Contains(l, sub) {
				out = append(out, l)
				break
			}
		}
	}
	return strings.Join(out, "\n")
}

type commonKV = commonpb.KeyValue

func attrString(v *commonpb.AnyValue) string {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_IntValue:
		return strconv.FormatInt(x.IntValue, 10)
	case *commonpb.AnyValue_BoolValue:
		return strconv.FormatBool(x.BoolValue)
	case *commonpb.AnyValue_DoubleValue:
		return strconv.FormatFloat(x.DoubleValue, 'g', -1, 64)
	case *commonpb.AnyValue_ArrayValue:
		var parts []string
		for _, e := range x.ArrayValue.GetValues() {
			parts = append(parts, attrString(e))
		}
		return strings.Join(parts, ",")
	}
	return fmt.Sprint(v)
}

// hexIDs rewrites protojson's base64 ids as OTLP/JSON's hex.
func hexIDs(t *testing.T, b []byte) []byte {
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	var walk func(any)
	walk = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				if s, ok := e.(string); ok && (k == "traceId" || k == "spanId" || k == "parentSpanId") {
					raw, err := base64.StdEncoding.DecodeString(s)
					if err != nil {
						t.Fatal(err)
					}
					x[k] = hex.EncodeToString(raw)
					continue
				}
				walk(e)
			}
		case []any:
			for _, e := range x {
				walk(e)
			}
		}
	}
	walk(v)
	out, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return out
}
