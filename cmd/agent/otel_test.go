package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	collectorpb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/lanewatch/lanewatch/internal/testenv"
	"github.com/lanewatch/lanewatch/otlpbridge"
	"github.com/lanewatch/lanewatch/otlpbridge/shapes"
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

// upstream is an OTLP collector that records what it receives, set as the
// upstream of the agents the test starts (OTEL_EXPORTER_OTLP_*).
func upstream(t *testing.T) *otlpbridge.Recorder {
	t.Helper()
	rec, err := otlpbridge.NewRecorder()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rec.Close)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+rec.Addr())
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
	t.Setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
	return rec
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
	return readTruth(t, truth)
}

func readTruth(t *testing.T, path string) []selftest.TruthCall {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	calls, err := selftest.ReadTruth(f, path)
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
	rec := upstream(t)
	t.Setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=e2e")
	grpcAddr, httpAddr := freePort(t), freePort(t)
	tmp := t.TempDir()

	a := startAgent(t, 30*time.Second, "--output", filepath.Join(tmp, "out.jsonl"),
		"--lib", filepath.Join(refDir, "lib", "libcuda.so.1"), "--lib", filepath.Join(refDir, "plain", "libcudart.so.12"),
		"--otlp.grpc-listen", grpcAddr, "--otlp.http-listen", httpAddr, "--spans.hold", "1h",
		"--web.listen-address", freePort(t))

	sgTruth := runScenario(t, refDir, "hicache-load", filepath.Join(tmp, "sglang.jsonl"))
	vlTruth := runScenario(t, refDir, "hicache-load", filepath.Join(tmp, "vllm.jsonl"))
	v1Truth := runScenario(t, refDir, "hicache-load", filepath.Join(tmp, "vllm1.jsonl"))
	offset := otlpbridge.NewClock().Offset()
	sg, per := selftest.SGLangSpans(sgTruth, offset)
	vl, vreqs := selftest.VLLMSpans(vlTruth, offset, 2)
	v1, v1reqs := selftest.VLLMSpans(v1Truth, offset, 1) // one request: no batch
	vl.ResourceSpans = append(vl.ResourceSpans, v1.ResourceSpans...)

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

	// One lanewatch.kv summary per request: the SGLang requests' and the
	// lone vLLM request's bytes are the truth's, their waits between their
	// longest copy and their span.
	kvProblems, kvMatched := selftest.CheckKVSummaries(spans, sgTruth, per)
	v1per := slices.Repeat(v1reqs, len(selftest.Copies(v1Truth)))
	vp, vm := selftest.CheckKVSummaries(spans, v1Truth, v1per)
	for _, p := range append(kvProblems, vp...) {
		t.Error("lanewatch.kv:", p)
	}
	if kvMatched != 2 || vm != 1 {
		t.Errorf("lanewatch.kv: %d SGLang and %d vLLM summaries matched the truth, want 2 and 1", kvMatched, vm)
	}
	t.Logf("lanewatch.kv: %d SGLang and %d vLLM summaries matched the truth's bytes, parent and wait bounds", kvMatched, vm)
	for _, sp := range spans {
		if sp.GetName() == "lanewatch.kv" {
			if id, _ := findAttr(sp.GetAttributes(), "lanewatch.request.id"); id == per[0].ID {
				var kvs []string
				for _, kv := range sp.GetAttributes() {
					kvs = append(kvs, kv.GetKey()+"="+attrString(kv.GetValue()))
				}
				t.Logf("request %s: %s", id, strings.Join(kvs, " "))
			}
		}
	}
	// The batch's requests each say they shared its transfers.
	for _, r := range vreqs {
		n := 0
		for _, sp := range spans {
			at := map[string]string{}
			for _, kv := range sp.GetAttributes() {
				at[kv.GetKey()] = attrString(kv.GetValue())
			}
			if sp.GetName() == "lanewatch.kv" && at["lanewatch.request.id"] == r.ID {
				n++
				if at["lanewatch.kv.bytes"] != "0" || at["lanewatch.kv.shared_transfers"] == "" || at["lanewatch.kv.ttft_source"] != "gen_ai.latency.time_to_first_token" {
					t.Errorf("vLLM batch request %s: summary %v, want no bytes of its own, shared transfers and vLLM's TTFT", r.ID, at)
				}
			}
		}
		if n != 1 {
			t.Errorf("vLLM batch request %s: %d summaries, want 1", r.ID, n)
		}
	}

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

// TestRunTracesSampled: a server sampling half its requests sends spans
// for those only. By default the unsampled half's transfers make no span
// and are counted (withheld); the sampled half's are attributed and summed
// up, their bytes the truth's. With --spans summary the only spans per
// request are the sampled requests' lanewatch.kv.
func TestRunTracesSampled(t *testing.T) {
	testenv.RequireRoot(t)
	refDir := testenv.RefDir(t)
	const requests = 8
	sampled := func(g int) bool { return g%2 == 0 }
	for _, mode := range []string{"batched", "summary"} {
		t.Run(mode, func(t *testing.T) {
			rec := upstream(t)
			grpcAddr, tmp := freePort(t), t.TempDir()
			// Only the scenario's process: the counts are of its transfers
			// alone, whatever else runs on the host.
			held := holdScenario(t, refDir, "hicache-load", tmp)
			pid := held.cmd.Process.Pid
			a := startAgent(t, 30*time.Second, "--output", "off", "--spans", mode, "--pid", strconv.Itoa(pid),
				"--lib", filepath.Join(refDir, "lib", "libcuda.so.1"), "--lib", filepath.Join(refDir, "plain", "libcudart.so.12"),
				"--otlp.grpc-listen", grpcAddr, "--otlp.http-listen", "", "--spans.hold", "1h", "--web.listen-address", freePort(t))
			held.run(t)
			truth := readTruth(t, held.truth)
			sent, per := selftest.SGLangSpansSampled(truth, otlpbridge.NewClock().Offset(), requests, sampled)
			conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if _, err := collectorpb.NewTraceServiceClient(conn).Export(context.Background(), sent); err != nil {
				t.Fatalf("send SGLang spans: %v", err)
			}
			time.Sleep(time.Second)
			a.stop(t, time.Minute)
			line := grepLines(a.stderr.String(), "transfer spans")
			t.Log(line)

			cs := selftest.Copies(truth)
			unsampled := 0
			for i := range cs {
				if per[i].ID == "" {
					unsampled++
				}
			}
			if int(cs[0].PID) != pid {
				t.Fatalf("the truth's pid %d is not the paused shell's %d", cs[0].PID, pid)
			}
			spans := selftest.TransferSpans(rec.Requests())
			transfers, summaries := 0, 0
			for _, sp := range spans {
				switch at, _ := findAttr(sp.GetAttributes(), "lanewatch.pid"); {
				case sp.GetName() == "lanewatch.kv":
					summaries++
				case at == strconv.Itoa(pid):
					transfers++
					if id, _ := findAttr(sp.GetAttributes(), "lanewatch.request.id"); id == "" {
						t.Errorf("transfer span %s %x names no request: an unsampled request's transfer was exported", sp.GetName(), sp.GetSpanId())
					}
				}
			}
			wantTransfers := len(cs) - unsampled // one span per layer: each layer is its own run
			if mode == "summary" {
				wantTransfers = 0
			}
			if transfers != wantTransfers || summaries != requests/2 {
				t.Errorf("%d transfer spans and %d summaries, want %d and %d", transfers, summaries, wantTransfers, requests/2)
			}
			if !strings.Contains(line, fmt.Sprintf("withheld=%d ", unsampled)) {
				t.Errorf("the unsampled requests' %d transfers were not counted as withheld: %s", unsampled, line)
			}
			problems, matched := selftest.CheckKVSummaries(spans, truth, per)
			for _, p := range problems {
				t.Error("lanewatch.kv:", p)
			}
			if matched != requests/2 {
				t.Errorf("%d summaries matched the truth, want %d", matched, requests/2)
			}
		})
	}
}

// TestRunRequestMetrics: the request histograms of a running agent, scraped
// as OpenMetrics, count each summed-up request and carry exemplars naming
// the requests' traces. A request of the server that started before the
// scenario and is still open (its prefill_waiting slice came, its thread and
// request spans not yet) holds every transfer until the scenario's spans
// are in, so the order does not depend on timing.
func TestRunRequestMetrics(t *testing.T) {
	testenv.RequireRoot(t)
	refDir := testenv.RefDir(t)
	upstream(t)
	grpcAddr, web, tmp := freePort(t), freePort(t), t.TempDir()
	held := holdScenario(t, refDir, "hicache-load", tmp)
	pid := held.cmd.Process.Pid
	startAgent(t, 30*time.Second, "--output", "off", "--pid", strconv.Itoa(pid),
		"--lib", filepath.Join(refDir, "lib", "libcuda.so.1"), "--lib", filepath.Join(refDir, "plain", "libcudart.so.12"),
		"--otlp.grpc-listen", grpcAddr, "--otlp.http-listen", "", "--spans.hold", "1s", "--spans.max-hold", "10m", "--web.listen-address", web)
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	send := func(req *collectorpb.ExportTraceServiceRequest) {
		t.Helper()
		if _, err := collectorpb.NewTraceServiceClient(conn).Export(context.Background(), req); err != nil {
			t.Fatalf("send spans: %v", err)
		}
	}
	// The open request: another thread's, from before the scenario to
	// after it.
	now := time.Now().UnixNano()
	sg := shapes.SGLang{Version: shapes.SGLangCurrent, IDs: shapes.NewIDs(uint32(pid) ^ 0x0be1)}
	openReq, openRS := sg.Request("unified", "0be1open", 0, nil, now-int64(time.Second), now+int64(time.Minute))
	openTh, openTS := sg.Thread(openReq, shapes.SGLangThread{Label: "Scheduler", TID: uint32(pid) + 1_000_000, HostID: selftest.HostID(), TP: shapes.Rank(0)},
		now-int64(time.Second), now+int64(time.Minute))
	_, waiting := sg.Slice(openTh, "prefill_waiting", now-int64(time.Second), now)
	batch := func(spans ...*tracepb.Span) *collectorpb.ExportTraceServiceRequest {
		return &collectorpb.ExportTraceServiceRequest{ResourceSpans: []*tracepb.ResourceSpans{shapes.Batch(shapes.SGLangResource(), shapes.SGLangScope, spans...)}}
	}
	send(batch(waiting))

	held.run(t)
	truth := readTruth(t, held.truth)
	const requests = 4
	sent, per := selftest.SGLangSpansSampled(truth, otlpbridge.NewClock().Offset(), requests, func(int) bool { return true })
	send(sent)
	send(batch(append([]*tracepb.Span{openTS}, openRS...)...)) // the open request ends: the transfers are attributed

	traces := map[string]bool{}
	for _, p := range per {
		traces[hex.EncodeToString(p.Span.TraceID[:])] = true
	}
	var body string
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
		req, _ := http.NewRequest("GET", "http://"+web+"/metrics", nil)
		req.Header.Set("Accept", "application/openmetrics-text; version=1.0.0")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		body = string(b)
		if strings.Contains(body, fmt.Sprintf(`lanewatch_request_kv_summaries_total{ttft="known"} %d`, requests)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %d requests summed up in /metrics:\n%s", requests, grepLines(body, "lanewatch_request_kv", "lanewatch_span"))
		}
	}
	// Every exemplar names one of the requests' traces.
	exemplars := 0
	for _, l := range strings.Split(body, "\n") {
		if !strings.HasPrefix(l, "lanewatch_request_kv_seconds_bucket") && !strings.HasPrefix(l, "lanewatch_request_kv_ttft_share_bucket") {
			continue
		}
		_, ex, ok := strings.Cut(l, ` # {`)
		if !ok {
			continue
		}
		id, _, _ := strings.Cut(strings.TrimPrefix(ex[strings.Index(ex, `trace_id="`):], `trace_id="`), `"`)
		if !traces[id] {
			t.Errorf("exemplar of trace %s, not one of the requests': %s", id, l)
		}
		exemplars++
	}
	if exemplars == 0 {
		t.Errorf("no exemplars on the request histograms:\n%s", grepLines(body, "lanewatch_request_kv"))
	}
	if !strings.Contains(body, fmt.Sprintf(`lanewatch_request_kv_seconds_count{kind="h2d"} %d`, requests)) {
		t.Errorf("want %d requests' H2D waits:\n%s", requests, grepLines(body, "lanewatch_request_kv_seconds_count"))
	}
	// agent top reads the same series from the text format.
	resp, err := http.Get("http://" + web + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	text, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var s topSample
	if err := parseTopMetrics(text, "/metrics", &s); err != nil {
		t.Fatal(err)
	}
	// The open request moved nothing: it gets no summary (none, not a zero).
	if !strings.Contains(body, `lanewatch_request_kv_summaries_total{ttft="unknown"} 0`) {
		t.Errorf("a request without transfers was summed up:\n%s", grepLines(body, "lanewatch_request_kv_summaries_total"))
	}
	t.Logf("%d requests summed up, %d exemplars on the request histograms naming their traces", requests, exemplars)
	if !s.requests || s.summaries != requests || s.shareCount != requests {
		t.Errorf("agent top read requests %v, %v summarised, %v with a TTFT share; want %d and %d", s.requests, s.summaries, s.shareCount, requests, requests)
	}
}
