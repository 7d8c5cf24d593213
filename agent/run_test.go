package agent_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lanewatch/lanewatch/agent"
	"github.com/lanewatch/lanewatch/internal/sysfstest"
	"github.com/lanewatch/lanewatch/internal/testenv"
)

// agent run on a host whose sysfs shows no GPU (one NIC), with a CUDA
// process whose two streams saturate any lane: the overlap and lane
// judgements are SKIPped with the reason, and no lane metric exists for a
// GPU the host did not show. Pageable copies are still judged.
func TestRunWithoutAGPUInSysfs(t *testing.T) {
	testenv.RequireRoot(t)
	ref := testenv.RefDir(t)
	sys := sysfstest.Build(t, sysfstest.Host{
		Nodes: []sysfstest.Node{{CPUs: "0-1", Distance: "10"}},
		Funcs: []sysfstest.Func{{BDF: "0000:00:03.0", HB: "pci0000:00", Class: "0x020000", Vendor: "0x1af4", Device: "0x1000", NUMA: "0"}},
	})
	// A shell that waits for a line, then becomes kvpath: its pid is known
	// before the agent starts, so the agent counts this process's copies
	// only, not those of other processes using the same reference libraries.
	cmd := exec.Command("/bin/sh", "-c", `read _ && exec "$0" "$@"`, filepath.Join(ref, "bin", "kvpath"),
		"--scenario", "h2d-overlap", "--truth", filepath.Join(t.TempDir(), "truth.jsonl"))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	logs := &syncBuffer{}
	stop := runAgent(t, agent.RunConfig{
		Trace:   agent.Config{PIDs: []int{cmd.Process.Pid}, Libs: []string{filepath.Join(ref, "plain", "libcudart.so.12"), filepath.Join(ref, "lib", "libcuda.so.1")}},
		Output:  io.Discard,
		SysRoot: sys,
		Logger:  slog.New(slog.NewTextHandler(io.MultiWriter(logs, testWriter{t}), nil)),
		Metrics: agent.MetricsConfig{Listen: "127.0.0.1:0", Path: "/metrics", EvaluateInterval: 300 * time.Millisecond,
			HostCheckInterval: time.Minute, GPU: agent.GPUConfig{Source: "off"}},
	})
	defer stop()
	io.WriteString(stdin, "go\n")
	stdin.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	reason := "GPU of pid " + strconv.Itoa(cmd.Process.Pid) + " unknown: no GPU in " + sys
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(logs.String(), reason) && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if !strings.Contains(logs.String(), `check="same-direction overlap" reason="`+reason+`"`) {
		t.Fatalf("no SKIP of the overlap judgement saying %q; logs:\n%s", reason, logs.String())
	}
	addr := regexp.MustCompile(`msg="serving metrics" address=(\S+)`).FindStringSubmatch(logs.String())
	if addr == nil {
		t.Fatalf("no metrics address in the logs:\n%s", logs.String())
	}
	// The copies reach the counters once the agent saw the process exit.
	const counted = `lanewatch_transfers_total{direction="H2D",host_mem="pinned",op="copy"} 96`
	var body []byte
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		resp, err := http.Get("http://" + addr[1] + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(body), counted) {
			break
		}
	}
	// No lane's rate or capacity: no GPU to put them on. The copies the
	// BPF flows counted are on the lane of GPU "unknown", said so.
	rates := regexp.MustCompile(`(?m)^lanewatch_lane_(demand|capacity|measured|unattributed|sm)_`)
	if rates.Match(body) {
		t.Errorf("lane rates on a host without GPU:\n%s", grepLines(string(body), "lanewatch_lane_"))
	}
	if lane := `lanewatch_lane_copies_total{direction="H2D",gpu="unknown"} 96`; !strings.Contains(string(body), lane) {
		t.Errorf("no %s:\n%s", lane, grepLines(string(body), "lanewatch_lane_"))
	}
	if !strings.Contains(string(body), counted) {
		t.Errorf("the 96 H2D copies are not counted:\n%s", grepLines(string(body), "lanewatch_transfers_total"))
	}
	if strings.Contains(logs.String(), `rule=same-direction-overlap`) {
		t.Error("same-direction-overlap fired without a known link")
	}
	// The scrape above asked for no format and got the text format; asked
	// for OpenMetrics (as Prometheus asks), the agent sends it, the
	// format that carries the request histograms' exemplars.
	req, _ := http.NewRequest(http.MethodGet, "http://"+addr[1]+"/metrics", nil)
	req.Header.Set("Accept", "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	om, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/openmetrics-text") || !strings.HasSuffix(string(om), "# EOF\n") ||
		!strings.Contains(string(om), "# TYPE lanewatch_request_kv_seconds histogram\n") {
		t.Errorf("asked for OpenMetrics, got %q:\n%s", ct, grepLines(string(om), "lanewatch_request_kv_seconds"))
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// runAgent starts agent.Run with cfg and waits until it is ready (30 s at
// most); stop cancels it and reports Run's error, once however often it
// is called (a test stops it early and defers it too).
func runAgent(t *testing.T, cfg agent.RunConfig) (stop func()) {
	t.Helper()
	ready := make(chan struct{})
	cfg.OnReady = func() { close(ready) }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- agent.Run(ctx, cfg) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	select {
	case <-ready:
	case err := <-done:
		cancel()
		t.Fatalf("Run stopped before it was ready: %v", err)
	case <-time.After(30 * time.Second):
		stop()
		t.Fatal("not ready after 30 s")
	}
	return stop
}
