package main

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	collectorpb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/internal/testenv"
	"github.com/lanewatch/lanewatch/selftest"
)

// hostileAgent is `agent run` in a child process (the test binary as the
// agent), its OTLP receivers and metrics on free loopback ports.
type hostileAgent struct {
	cmd                 *exec.Cmd
	log                 *agentLog
	out                 string
	grpc, http, metrics string
	cgroup              string // memory cgroup (v1) it runs in; "" none
	done                chan error
	stopped             bool
}

// agentBin is the agent run by these tests: this test binary, or
// LW_AGENT_BIN (main's build, say, for before-and-after figures).
func agentBin() (string, []string) {
	if bin := os.Getenv("LW_AGENT_BIN"); bin != "" {
		return bin, nil
	}
	return os.Args[0], []string{"LW_AGENT_MAIN=1"}
}

func startHostileAgent(t *testing.T, cgroupBytes int64, env []string, args ...string) *hostileAgent {
	t.Helper()
	a := &hostileAgent{out: filepath.Join(t.TempDir(), "out.jsonl"), grpc: freePort(t), http: freePort(t), metrics: freePort(t)}
	bin, binEnv := agentBin()
	a.cmd = exec.Command(bin, append([]string{"run", "--output", a.out, "--otlp.grpc-listen", a.grpc, "--otlp.http-listen", a.http,
		"--web.listen-address", a.metrics}, args...)...)
	a.cmd.Env = append(os.Environ(), append(binEnv, "GOMEMLIMIT=", "OTEL_EXPORTER_OTLP_ENDPOINT=", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=")...)
	a.cmd.Env = append(a.cmd.Env, env...) // the last value of a variable wins
	stderr, err := a.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := a.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	a.done = make(chan error, 1)
	t.Cleanup(func() {
		if !a.stopped {
			a.cmd.Process.Kill()
			<-a.done
		}
		if a.cgroup != "" {
			os.Remove(a.cgroup)
		}
	})
	if cgroupBytes > 0 {
		a.cgroup = memoryCgroup(t, a.cmd.Process.Pid, cgroupBytes)
	}
	a.log = newAgentLog(stderr)
	go func() { a.done <- a.cmd.Wait() }()
	a.log.waitFor(t, regexp.MustCompile(`lanewatch running`), 60*time.Second)
	return a
}

// memoryCgroup puts pid in a new cgroup v1 memory group of limit bytes, as
// a container runtime would; "" when this host has no writable memory
// controller (the RSS check still holds).
func memoryCgroup(t *testing.T, pid int, limit int64) string {
	dir := filepath.Join("/sys/fs/cgroup/memory", fmt.Sprintf("lanewatch-test-%d", pid))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Logf("no memory cgroup (%v): VmHWM alone is checked", err)
		return ""
	}
	for file, v := range map[string]string{"memory.limit_in_bytes": strconv.FormatInt(limit, 10), "cgroup.procs": strconv.Itoa(pid)} {
		if err := os.WriteFile(filepath.Join(dir, file), []byte(v), 0o644); err != nil {
			t.Fatalf("cgroup %s: %v", file, err)
		}
	}
	return dir
}

// stop ends the agent with SIGINT: it must exit 0 (an OOM kill is
// SIGKILL) within 30 s.
func (a *hostileAgent) stop(t *testing.T) {
	t.Helper()
	a.stopped = true
	a.cmd.Process.Signal(syscall.SIGINT)
	select {
	case err := <-a.done:
		if err != nil {
			t.Fatalf("agent: %v%s\n%s", err, a.oomKills(), tail(a.log.String(), 30))
		}
	case <-time.After(30 * time.Second):
		a.cmd.Process.Kill()
		t.Fatalf("agent did not stop within 30 s\n%s", tail(a.log.String(), 30))
	}
}

// alive fails the test when the agent has died, saying how.
func (a *hostileAgent) alive(t *testing.T) {
	t.Helper()
	select {
	case err := <-a.done:
		a.stopped = true
		t.Fatalf("agent died under the load: %v%s\n%s", err, a.oomKills(), tail(a.log.String(), 10))
	default:
	}
}

// oomKills says how often the OOM killer struck in the agent's cgroup.
func (a *hostileAgent) oomKills() string {
	if a.cgroup == "" {
		return ""
	}
	b, _ := os.ReadFile(filepath.Join(a.cgroup, "memory.oom_control"))
	if m := regexp.MustCompile(`oom_kill (\d+)`).FindSubmatch(b); m != nil {
		return fmt.Sprintf(" (OOM kills in its cgroup: %s)", m[1])
	}
	return ""
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// status reads /proc/PID/status's field in kB, as bytes.
func procStatusBytes(t *testing.T, pid int, field string) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^` + field + `:\s+(\d+) kB`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("no %s in /proc/%d/status", field, pid)
	}
	kb, _ := strconv.ParseInt(string(m[1]), 10, 64)
	return kb << 10
}

// records reads the agent's output for one process.
func records(t *testing.T, path string, pid uint32) []correlate.Transfer {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var got []correlate.Transfer
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var tr correlate.Transfer
		if err := json.Unmarshal(sc.Bytes(), &tr); err != nil {
			t.Fatalf("output line %q: %v", sc.Text(), err)
		}
		if tr.PID == pid {
			got = append(got, tr)
		}
	}
	return got
}

// bigRequests are valid OTLP requests of about size bytes, protobuf and
// JSON: one batch of SGLang-named spans repeated (ResourceSpans is a
// repeated field; the JSON array is joined).
func bigRequests(t *testing.T, size int) (pb, js []byte) {
	now := time.Now().UnixNano()
	var spans []*tracepb.Span
	for i := range 500 {
		spans = append(spans, &tracepb.Span{TraceId: bytes.Repeat([]byte{byte(i), 1}, 8), SpanId: bytes.Repeat([]byte{byte(i), 2}, 4),
			Name: "Scheduler [TP 0] (host:0f1e2d3c | pid:42)", StartTimeUnixNano: uint64(now), EndTimeUnixNano: uint64(now + 1000)})
	}
	one := &collectorpb.ExportTraceServiceRequest{ResourceSpans: []*tracepb.ResourceSpans{{ScopeSpans: []*tracepb.ScopeSpans{{Spans: spans}}}}}
	unit, err := proto.Marshal(one)
	if err != nil {
		t.Fatal(err)
	}
	pb = bytes.Repeat(unit, size/len(unit)+1)
	j, err := protojson.Marshal(one.ResourceSpans[0])
	if err != nil {
		t.Fatal(err)
	}
	j = hexIDs(t, j)
	n := size/(len(j)+1) + 1
	js = append([]byte(`{"resourceSpans":[`), bytes.Repeat(append(j, ','), n)...)
	js = append(js[:len(js)-1], "]}"...)
	return pb, js
}

// post sends body to the OTLP/HTTP receiver and returns the status (0: the
// connection failed, as when the receiver answers and closes early).
func post(addr, ctype, encoding string, body io.Reader, size int64) int {
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/traces", body)
	req.ContentLength = size // -1: chunked
	req.Header.Set("Content-Type", ctype)
	if encoding != "" {
		req.Header.Set("Content-Encoding", encoding)
	}
	resp, err := (&http.Client{Timeout: 2 * time.Minute}).Do(req)
	if err != nil {
		return 0
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// TestOTLPHostileLoad is issue 13's hostile OTLP load: `agent run
// --memory-limit 1GiB` in a 1 GiB memory cgroup, 40 concurrent ~60 MB
// bodies (JSON with its length, protobuf chunked, a gzip bomb of 60 MB
// JSON) and then 16 concurrent requests just under the body limit, retried
// when refused as overloaded until taken, while
// the reference path's hicache-load runs: the agent's peak RSS stays under
// the limit, it is not OOM-killed, every refusal is counted and the
// process is traced exactly. On main the same load took 3.81 GB and a
// 1 GiB cgroup OOM-killed the agent in ~3 s.
func TestOTLPHostileLoad(t *testing.T) {
	testenv.RequireRoot(t)
	refDir := testenv.RefDir(t)
	const limit = 1 << 30
	a := startHostileAgent(t, limit, nil, "--memory-limit", "1GiB",
		"--lib", filepath.Join(refDir, "lib", "libcuda.so.1"), "--lib", filepath.Join(refDir, "plain", "libcudart.so.12"))
	pb60, js60 := bigRequests(t, 60e6)
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(js60)
	zw.Close()
	codes := map[int]int{}
	var mu sync.Mutex
	wave := func(n int, send func(i int) int) {
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c := send(i)
				mu.Lock()
				codes[c]++
				mu.Unlock()
			}()
		}
		wg.Wait()
	}
	truth := make(chan []selftest.TruthCall, 1)
	go func() {
		time.Sleep(200 * time.Millisecond) // into the load
		truth <- runScenario(t, refDir, "hicache-load", filepath.Join(t.TempDir(), "truth.jsonl"))
	}()
	wave(40, func(i int) int {
		switch i % 3 {
		case 0:
			return post(a.http, "application/json", "", bytes.NewReader(js60), int64(len(js60)))
		case 1:
			return post(a.http, "application/x-protobuf", "", io.MultiReader(bytes.NewReader(pb60)), -1)
		}
		return post(a.http, "application/json", "gzip", bytes.NewReader(gz.Bytes()), int64(gz.Len()))
	})
	before := a.scrape(t)
	// Just under the limit the agent chose (the default 8 MiB: a quarter
	// of 1 GiB decodes 25 MiB at 10x): the decode budget admits a few at
	// a time, the others are told to retry, as OTLP exporters do, until
	// each is taken.
	pb7, js7 := bigRequests(t, 7<<20)
	wave(16, func(i int) int {
		for deadline := time.Now().Add(2 * time.Minute); ; {
			var c int
			if i%2 == 0 {
				c = post(a.http, "application/x-protobuf", "", bytes.NewReader(pb7), int64(len(pb7)))
			} else {
				c = post(a.http, "application/json", "", bytes.NewReader(js7), int64(len(js7)))
			}
			if c != http.StatusTooManyRequests && c != 0 || time.Now().After(deadline) {
				return c
			}
			time.Sleep(time.Duration(50+i*10) * time.Millisecond)
		}
	})
	calls := <-truth
	a.alive(t)
	hwm := procStatusBytes(t, a.cmd.Process.Pid, "VmHWM")
	metrics := a.scrape(t)
	cgMax, oomKills := "none", a.oomKills()
	if a.cgroup != "" {
		b, _ := os.ReadFile(filepath.Join(a.cgroup, "memory.max_usage_in_bytes"))
		cgMax = strings.TrimSpace(string(b))
	}
	time.Sleep(time.Second) // the scenario's exit flushes its transfers
	a.stop(t)
	t.Logf("statuses %v; agent peak RSS (VmHWM) %d MiB; cgroup peak %s bytes%s", codes, hwm>>20, cgMax, oomKills)
	t.Log(grepLines(metrics, "lanewatch_otlp_rejected_requests_total{", "lanewatch_otlp_received_requests_total{"))
	if hwm >= limit {
		t.Errorf("peak RSS %d MiB: over the 1 GiB memory limit", hwm>>20)
	}
	if oomKills != "" && !strings.Contains(oomKills, ": 0)") {
		t.Errorf("the OOM killer struck in the agent's 1 GiB cgroup%s", oomKills)
	}
	// The receiver's counts decide: a sender refused before its body was
	// read may see the connection reset rather than the status.
	// Bodies of ~60 MB: too large, from their length or once 8 MiB are
	// read (or decompressed), unless refused as overloaded before.
	const tooLarge, overloaded = `lanewatch_otlp_rejected_requests_total{reason="too_large",transport="http"}`,
		`lanewatch_otlp_rejected_requests_total{reason="overloaded",transport="http"}`
	big, busy := metricValue(before, tooLarge), metricValue(before, overloaded)
	if big < 14 || big+busy != 40 {
		t.Errorf("of the 40 bodies of ~60 MB, %d refused as too large (want at least the 14 declared so) and %d as overloaded", big, busy)
	}
	if n := metricValue(metrics, tooLarge); n != big {
		t.Errorf("%d requests under the limit refused as too large", n-big)
	}
	ok, busy2 := codes[http.StatusOK], metricValue(metrics, overloaded)-busy
	if received := metricValue(metrics, `lanewatch_otlp_received_requests_total{transport="http"}`); ok != 16 || received != 40+16+busy2 {
		t.Errorf("requests under the limit: %d of 16 accepted, %d refused as overloaded, %d requests received; want all accepted after their retries", ok, busy2, received)
	}
	for _, other := range []string{"bad_payload", "read_error", "unsupported"} {
		if n := metricValue(metrics, `lanewatch_otlp_rejected_requests_total{reason="`+other+`",transport="http"}`); n != 0 {
			t.Errorf("%d refused as %s", n, other)
		}
	}
	for c := range codes {
		if c != 0 && c != http.StatusOK && c != http.StatusRequestEntityTooLarge && c != http.StatusTooManyRequests {
			t.Errorf("status %d: not one of OTLP's", c)
		}
	}
	var res selftest.Result
	selftest.Compare(&res, calls, records(t, a.out, calls[0].PID))
	if !res.OK() {
		t.Errorf("hicache-load under the load: %d records of %d, problems %v", res.Got, res.WantRecords, res.Problems)
	}
	t.Logf("hicache-load under the load: %d of %d records match the truth", res.Got, res.WantRecords)
}

// metricValue is a sample's value in a scrape (-1: absent).
func metricValue(scrape, sample string) int {
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(sample) + ` (\S+)$`).FindStringSubmatch(scrape)
	if m == nil {
		return -1
	}
	v, _ := strconv.ParseFloat(m[1], 64)
	return int(v)
}

// scrape reads the agent's metrics; when they do not answer, it says
// whether the agent died.
func (a *hostileAgent) scrape(t *testing.T) string {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get("http://" + a.metrics + "/metrics")
	if err != nil {
		select {
		case exit := <-a.done:
			a.stopped = true
			t.Fatalf("metrics: %v: the agent died: %v%s\n%s", err, exit, a.oomKills(), tail(a.log.String(), 10))
		case <-time.After(5 * time.Second):
		}
		t.Fatalf("metrics: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// TestOTLPIdleConnections is issue 13's connection flood: with the agent
// limited to 2048 descriptors, 3,000 idle connections to its OTLP ports
// leave the metrics port answering and a new CUDA process is found,
// probed and traced. On main each connection took a descriptor: the limit
// was hit, the metrics port stopped answering and the new process was not
// traced (0 of 6).
func TestOTLPIdleConnections(t *testing.T) {
	testenv.RequireRoot(t)
	refDir := testenv.RefDir(t)
	a := startHostileAgent(t, 0, nil)
	if err := unix.Prlimit(a.cmd.Process.Pid, unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: 2048, Max: 2048}, nil); err != nil {
		t.Fatal(err)
	}
	// 1500 a port: 256 served, the rest in the listen backlog (somaxconn;
	// a dial past it would time out).
	perPort := 1500
	if b, err := os.ReadFile("/proc/sys/net/core/somaxconn"); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			perPort = min(perPort, 256+n-64)
		}
	}
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := range 2 * perPort {
		addr := a.grpc
		if i%2 == 1 {
			addr = a.http
		}
		c, err := net.DialTimeout("tcp", addr, 10*time.Second)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		conns = append(conns, c)
	}
	start := time.Now()
	metrics := a.scrape(t)
	answered := time.Since(start)
	if !strings.Contains(metrics, "lanewatch_otlp_received_requests_total") {
		t.Errorf("metrics without the OTLP receivers' counters")
	}
	// A new process, found by discovery: its library must be opened and
	// probed while the connections are held.
	dir := t.TempDir()
	truthFile := filepath.Join(dir, "truth.jsonl")
	kv := exec.Command(filepath.Join(refDir, "bin", "kvpath"), "--scenario", "hicache-load", "--hold", "--truth", truthFile)
	stdin, _ := kv.StdinPipe()
	kvOut, _ := kv.StdoutPipe()
	if err := kv.Start(); err != nil {
		t.Fatal(err)
	}
	defer kv.Process.Kill()
	ready := make([]byte, 64)
	if n, _ := io.ReadAtLeast(kvOut, ready, len("ready 1\n")); !strings.HasPrefix(string(ready[:n]), "ready ") {
		t.Fatalf("kvpath did not stop at its hold point: %q", ready[:n])
	}
	lib := regexp.QuoteMeta(filepath.Join(refDir, "lib", "libcuda.so.1"))
	a.log.waitFor(t, regexp.MustCompile(`msg=attached path="?`+lib), 60*time.Second)
	fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", a.cmd.Process.Pid))
	stdin.Close()
	io.Copy(io.Discard, kvOut)
	if err := kv.Wait(); err != nil {
		t.Fatalf("kvpath: %v", err)
	}
	time.Sleep(time.Second)
	a.stop(t)
	calls, err := selftest.ReadTruthFile(truthFile)
	if err != nil {
		t.Fatal(err)
	}
	var res selftest.Result
	selftest.Compare(&res, calls, records(t, a.out, uint32(kv.Process.Pid)))
	t.Logf("%d idle connections: metrics answered in %s; agent descriptors %d; hicache-load %d of %d records", len(conns), answered, len(fds), res.Got, res.WantRecords)
	// Memory registered before the probes were attached may be unknown.
	if res.Got != res.WantRecords || res.OtherErrs+res.DirectionErrs+res.ErrorErrs != 0 {
		t.Errorf("the new process under the flood: %d records of %d, problems %v", res.Got, res.WantRecords, res.Problems)
	}
	for _, l := range strings.Split(strings.TrimSpace(a.log.String()), "\n") {
		if !strings.HasPrefix(l, "time=") {
			t.Errorf("a log line not through the structured logger: %q", l)
		}
	}
}

// TestRunUpstreamDown: with the trace upstream down, every failed forward
// and every span the exporter gave up on is counted, and logged once per
// cause per minute through the structured logger. On main each failed
// forward was a WARN line of its own, nothing counted the spans, and the
// OTel SDK wrote its own unstructured "traces export" lines.
func TestRunUpstreamDown(t *testing.T) {
	testenv.RequireRoot(t)
	refDir := testenv.RefDir(t)
	down := freePort(t) // nothing listens there
	a := startHostileAgent(t, 0, []string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://" + down, "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf",
		"OTEL_EXPORTER_OTLP_INSECURE=true", "OTEL_EXPORTER_OTLP_TIMEOUT=300", "OTEL_BSP_SCHEDULE_DELAY=100", "OTEL_BSP_EXPORT_TIMEOUT=500"},
		// No server span covers the transfers: they make spans only when
		// asked to, and the spans' failed export is the subject.
		"--spans.hold", "1ms", "--spans.export-unattributed",
		"--lib", filepath.Join(refDir, "lib", "libcuda.so.1"), "--lib", filepath.Join(refDir, "plain", "libcudart.so.12"))
	conn, err := grpc.NewClient(a.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for range 5 {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_, err := collectorpb.NewTraceServiceClient(conn).Export(ctx, &collectorpb.ExportTraceServiceRequest{})
		cancel()
		if status.Code(err) != codes.Unavailable {
			t.Errorf("export with the upstream down: %v, want Unavailable (retryable)", err)
		}
	}
	runScenario(t, refDir, "hicache-load", filepath.Join(t.TempDir(), "truth.jsonl"))
	const failedSpans = `lanewatch_spans_exported_total{result="failed"}`
	var metrics string
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		metrics = a.scrape(t)
		if metricValue(metrics, failedSpans) > 0 || time.Now().After(deadline) {
			break
		}
	}
	a.stop(t)
	log := a.log.String()
	t.Log(grepLines(metrics, "lanewatch_spans_exported_total{", "lanewatch_otlp_forwarded_requests_total{"))
	t.Log(grepLines(log, "upstream", "OTel SDK", "span export"))
	if n := metricValue(metrics, `lanewatch_otlp_forwarded_requests_total{result="failed"}`); n != 5 {
		t.Errorf("%d failed forwards counted, want 5", n)
	}
	if n := metricValue(metrics, failedSpans); n <= 0 {
		t.Errorf("%d spans counted as failed, want the transfer spans", n)
	}
	if n := strings.Count(log, `msg="forward OTLP traces upstream"`); n != 1 {
		t.Errorf("%d lines for 5 failed forwards, want 1 within the minute", n)
	}
	if !strings.Contains(log, `msg="OTel SDK"`) {
		t.Errorf("the SDK's export failure is not logged")
	}
	for _, l := range strings.Split(strings.TrimSpace(log), "\n") {
		if !strings.HasPrefix(l, "time=") {
			t.Errorf("a log line not through the structured logger: %q", l)
		}
	}
}
