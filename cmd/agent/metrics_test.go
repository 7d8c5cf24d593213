package main

import (
	"bufio"
	"fmt"
	"io"
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

	"github.com/lanewatch/lanewatch/internal/promtest"
	"github.com/lanewatch/lanewatch/internal/testenv"
)

// agentLog collects the agent's stderr and waits for lines in it.
type agentLog struct {
	mu    sync.Mutex
	text  strings.Builder
	lines chan string
}

// agentProcess starts `agent run args...` as a process of its own (this
// test binary as the agent), stopped with SIGINT when the test ends, and
// returns its metrics address once its probes are attached, and its log.
func agentProcess(t *testing.T, args ...string) (addr string, logs *agentLog) {
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{"run"}, args...)...)
	cmd.Env = append(os.Environ(), "LW_AGENT_MAIN=1")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGINT)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	logs = newAgentLog(stderr)
	addr = logs.waitFor(t, regexp.MustCompile(`msg="serving metrics" address=(127\.0\.0\.1:\d+)`), 30*time.Second)[1]
	logs.waitFor(t, regexp.MustCompile(`lanewatch running`), 30*time.Second)
	return addr, logs
}

func newAgentLog(r io.Reader) *agentLog {
	l := &agentLog{lines: make(chan string, 1024)}
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			l.mu.Lock()
			l.text.WriteString(sc.Text() + "\n")
			l.mu.Unlock()
			select {
			case l.lines <- sc.Text():
			default:
			}
		}
		close(l.lines)
	}()
	return l
}

func (l *agentLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.text.String()
}

// waitFor returns the first line matching re, within d.
func (l *agentLog) waitFor(t *testing.T, re *regexp.Regexp, d time.Duration) []string {
	t.Helper()
	deadline := time.After(d)
	for {
		select {
		case line, ok := <-l.lines:
			if !ok {
				t.Fatalf("agent exited before logging %q:\n%s", re, l.String())
			}
			if m := re.FindStringSubmatch(line); m != nil {
				return m
			}
		case <-deadline:
			t.Fatalf("agent did not log %q within %s:\n%s", re, d, l.String())
		}
	}
}

// heldScenario is a kvpath run whose pid exists before it starts: a shell
// waits on stdin, then execs kvpath in the same process. The agent is told
// these pids with --pid, so reference-path processes of tests running
// concurrently in other packages cannot reach its metrics.
type heldScenario struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *strings.Builder
	truth string // its truth file
}

func holdScenario(t *testing.T, ref, scenario, dir string) *heldScenario {
	t.Helper()
	truth := filepath.Join(dir, fmt.Sprintf("truth-%s-%d.jsonl", scenario, time.Now().UnixNano()))
	cmd := exec.Command("sh", "-c", `read _ && exec "$@"`, "sh",
		filepath.Join(ref, "bin", "kvpath"), "--scenario", scenario, "--truth", truth)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	h := &heldScenario{cmd: cmd, stdin: stdin, out: &strings.Builder{}, truth: truth}
	cmd.Stdout, cmd.Stderr = h.out, h.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return h
}

// run releases the scenario and waits (bounded) for it to finish.
func (h *heldScenario) run(t *testing.T) {
	t.Helper()
	io.WriteString(h.stdin, "go\n")
	h.stdin.Close()
	done := make(chan error, 1)
	go func() { done <- h.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("kvpath %v: %v\n%s", h.cmd.Args, err, h.out.String())
		}
	case <-time.After(60 * time.Second):
		h.cmd.Process.Kill()
		t.Fatalf("kvpath %v did not finish in 60s", h.cmd.Args)
	}
}

// End to end: `agent run` with metrics, a real Prometheus scraping it every
// second with the shipped alerting rules, and the reference data path.
// hicache-load (pinned pools) raises no finding and no pageable alert;
// pageable-load makes the pageable-copy finding alert go firing.
func TestPrometheusAlertsEndToEnd(t *testing.T) {
	testenv.RequireRoot(t)
	ref := testenv.RefDir(t)
	promtest.Tool(t, "prometheus")
	dir := t.TempDir()

	var hicache, pageable []*heldScenario
	var pids []string
	for range 3 {
		h := holdScenario(t, ref, "hicache-load", dir)
		hicache = append(hicache, h)
		pids = append(pids, strconv.Itoa(h.cmd.Process.Pid))
	}
	for range 4 {
		h := holdScenario(t, ref, "pageable-load", dir)
		pageable = append(pageable, h)
		pids = append(pids, strconv.Itoa(h.cmd.Process.Pid))
	}

	addr, logs := agentProcess(t, "--output", filepath.Join(dir, "transfers.jsonl"),
		"--pid", strings.Join(pids, ","),
		"--lib", filepath.Join(ref, "plain", "libcudart.so.12"), "--lib", filepath.Join(ref, "lib", "libcuda.so.1"),
		"--web.listen-address", "127.0.0.1:0", "--evaluate-interval", "3s",
		"--otlp.grpc-listen", "", "--otlp.http-listen", "") // traces are another test's subject

	rules, err := filepath.Abs(filepath.Join("..", "..", "dashboards", "lanewatch.rules.yml"))
	if err != nil {
		t.Fatal(err)
	}
	prom := promtest.Start(t, fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: [lanewatch.rules.yml]
scrape_configs:
  - job_name: lanewatch
    static_configs:
      - targets: [%q]
`, addr), rules)

	// until returns once f says done, polling every 250 ms for at most d.
	until := func(what string, d time.Duration, f func() (bool, string)) {
		t.Helper()
		deadline := time.Now().Add(d)
		last := ""
		for time.Now().Before(deadline) {
			ok, state := f()
			if ok {
				t.Logf("%s: %s", what, state)
				return
			}
			last = state
			time.Sleep(250 * time.Millisecond)
		}
		t.Fatalf("%s: not within %s; last state: %s\nagent log:\n%s", what, d, last, logs.String())
	}
	value := func(q string) (float64, string) {
		res, err := prom.Query(q)
		if err != nil {
			return 0, err.Error()
		}
		for _, v := range res {
			f, _ := strconv.ParseFloat(v, 64)
			return f, fmt.Sprint(res)
		}
		return 0, "no data"
	}
	alertStates := func(names ...string) map[string]string {
		out := map[string]string{}
		alerts, err := prom.Alerts()
		if err != nil {
			out["error"] = err.Error()
		}
		for _, a := range alerts {
			for _, n := range names {
				if a.Labels["alertname"] == n {
					out[n] = a.State
				}
			}
		}
		return out
	}
	until("Prometheus scrapes the agent", 20*time.Second, func() (bool, string) {
		v, s := value(`up{job="lanewatch"}`)
		return v == 1, s
	})

	// Phase 1: hicache-load copies from pinned pools only.
	for _, h := range hicache {
		h.run(t)
	}
	until("hicache-load transfers reach Prometheus", 30*time.Second, func() (bool, string) {
		v, s := value(`sum(lanewatch_transfers_total{job="lanewatch",host_mem="pinned"})`)
		return v >= 3*32, s
	})
	// Judged: Prometheus scraped an evaluation made after the transfers were
	// counted, and the rules ran on that scrape (no fixed sleep: a loaded
	// machine delays each step).
	counted := float64(time.Now().UnixNano()) / 1e9
	until("an evaluation after the hicache-load transfers reaches Prometheus", 30*time.Second, func() (bool, string) {
		v, s := value(`max(lanewatch_evaluation_timestamp_seconds{job="lanewatch"})`)
		return v > counted, s
	})
	time.Sleep(2 * time.Second) // two rule evaluations (every 1 s) on that scrape
	if strings.Contains(logs.String(), `msg=finding`) {
		t.Errorf("hicache-load raised findings:\n%s", logs.String())
	}
	if v, s := value(`sum(max_over_time(lanewatch_findings{job="lanewatch"}[1m]))`); v != 0 {
		t.Errorf("hicache-load raised findings: %s", s)
	}
	if v, s := value(`sum(lanewatch_transfers_total{job="lanewatch",host_mem="pageable"})`); v != 0 {
		t.Errorf("hicache-load counted pageable copies: %s", s)
	}
	if st := alertStates("LanewatchPageableCopyFinding"); len(st) > 0 {
		t.Errorf("alerts active after hicache-load: %v", st)
	}
	t.Logf("hicache-load: no finding, no pageable alert")

	// Phase 2: pageable-load, run again while waiting for the alert.
	next := 0
	lastRun := time.Time{}
	// A finding is active for one evaluation window (3 s): Prometheus scrapes
	// it every second, but a loaded machine can stall a scrape. Each
	// further pageable-load run is another window with the finding.
	until("pageable-copy finding alert firing", 40*time.Second, func() (bool, string) {
		if next < len(pageable) && time.Since(lastRun) > 4*time.Second {
			pageable[next].run(t)
			next++
			lastRun = time.Now()
		}
		st := alertStates("LanewatchPageableCopyFinding")
		return st["LanewatchPageableCopyFinding"] == "firing", fmt.Sprint(st)
	})
	if v, s := value(`max(max_over_time(lanewatch_findings{job="lanewatch",rule="pageable-copy",severity="fail"}[1m]))`); v < 1 {
		t.Errorf("lanewatch_findings{rule=pageable-copy} never 1: %s", s)
	}

	// The live scrape passes promtool's lint.
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	check := exec.Command(promtest.Tool(t, "promtool"), "check", "metrics")
	check.Stdin = resp.Body
	if out, err := check.CombinedOutput(); err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Errorf("promtool check metrics on the live scrape: %v\n%s", err, out)
	}
}
