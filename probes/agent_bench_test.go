package probes

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/lanewatch/lanewatch/internal/testenv"
	"github.com/lanewatch/lanewatch/selftest/refenv"
)

// BenchmarkAgentEndToEnd: the whole agent, the real `agent run` binary with
// the DaemonSet's flags, beside the reference copier (kvpath callbench: one
// pinned cudaMemcpyAsync after another, one probe event each), side by side
// in one run (docs/measurements.md, "The whole agent"). Rows:
//
//   - none: the copier alone; probes: every driver row attached with a
//     counting reader (the harness of BenchmarkWholeStack);
//   - 1copier, 2copiers (two processes at once), burst (one process of
//     twice the calls): the agent's events absorbed per second, its drops
//     and the copies BPF shed, its CPU per event read, the copier's added
//     ns per call; 1copier-ordinary-engine and burst-ordinary-engine the
//     same with the reference copy engine an ordinary thread
//     (refenv.OrdinaryMovers);
//   - out-off (metrics only, the DaemonSet's --output off), out-jsonl
//     (--output /dev/null) and out-spans (--output off, batched transfer
//     spans to a local OTLP/HTTP sink): runs of calls the default ring holds
//     whole even if the reader never ran, so every row reads the same
//     events and its CPU per event is the cost of what it outputs.
//
// The agent's CPU is its threads' run time (/proc/PID/task/*/schedstat)
// from just before the copiers start until it has read their events and
// gone idle, less the scrapes of /metrics that check it (each costs the
// agent ~4 ms). The agent is ./cmd/agent built from this tree into a
// temporary directory (never a stale bin/agent), or $LANEWATCH_AGENT_BIN; with
// $LANEWATCH_AGENT_BIN_BEFORE too, that build's rows come first, prefixed
// "before-", for before and after figures in one run (it must know
// --output off). No timing is asserted: it reports.
func BenchmarkAgentEndToEnd(b *testing.B) {
	testenv.RequireRoot(b)
	ref := testenv.RefDir(b)
	driver := filepath.Join(ref, "lib", "libcuda.so.1")
	sz := e2eSizes()
	root := filepath.Join(ref, "..", "..")
	bins := agentBinaries(b, root)
	limit := chartMemoryLimit(b, root)

	type row struct {
		name string
		r    e2eResult
		off  *e2eResult // metrics only, for an output's own cost
	}
	var rows []row
	none, probed := math.Inf(1), math.Inf(1)
	alone := e2eResult{others: otherAgents(0)} // who else probed the harness rows
	for range sz.rounds {
		none = min(none, callbench(b, ref, "plain", sz.calls))
		probed = min(probed, withLanewatch(b, driver, func() float64 { return callbench(b, ref, "plain", sz.calls) }).ns)
	}
	alone.add(e2eResult{others: otherAgents(0)})
	for _, bin := range bins {
		a := startE2EAgent(b, bin.path, driver, limit, nil, "--output", "off")
		var one, two, burst, oneOrd, burstOrd e2eResult
		for range sz.rounds {
			one.add(a.copy(b, ref, 1, sz.calls, nil))
			two.add(a.copy(b, ref, 2, sz.calls, nil))
			burst.add(a.copy(b, ref, 1, sz.burst, nil))
			oneOrd.add(a.copy(b, ref, 1, sz.calls, nil, refenv.OrdinaryMovers))
			burstOrd.add(a.copy(b, ref, 1, sz.burst, nil, refenv.OrdinaryMovers))
		}
		a.stop(b)
		rows = append(rows, row{name: bin.name + "-1copier", r: one}, row{name: bin.name + "-2copiers", r: two}, row{name: bin.name + "-burst", r: burst},
			row{name: bin.name + "-1copier-ordinary-engine", r: oneOrd}, row{name: bin.name + "-burst-ordinary-engine", r: burstOrd})

		// The outputs' agents take turns, a few runs each per round, so
		// that the machine's load weighs on each alike.
		var off, jsonl, spans e2eResult
		sink := startOTLPSink(b)
		spanned := func(d e2eCounters) bool { return d.spanTransfers >= d.transfers }
		// No server sends spans here: every transfer is unsampled, which
		// makes no span by default; the row measures making them.
		spanArgs := []string{"--output", "off", "--spans.hold", "1ms"}
		if out, _ := exec.Command(bin.path, "run", "-h").CombinedOutput(); bytes.Contains(out, []byte("spans.export-unattributed")) {
			spanArgs = append(spanArgs, "--spans.export-unattributed")
		}
		for range sz.rounds {
			off.add(heldRuns(b, sz, ref, startE2EAgent(b, bin.path, driver, limit, nil, "--output", "off"), nil))
			jsonl.add(heldRuns(b, sz, ref, startE2EAgent(b, bin.path, driver, limit, nil, "--output", "/dev/null"), nil))
			// Spans are released at once (--spans.hold 1ms: 0 is the
			// default, 15 s, the DaemonSet's, a wait for the server's
			// spans), so making them falls in the run.
			spans.add(heldRuns(b, sz, ref, startE2EAgent(b, bin.path, driver, limit, []string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://" + sink.addr},
				spanArgs...), spanned))
		}
		sink.close()
		if spans.counters.spanTransfers == 0 || sink.requests.Load() == 0 {
			b.Errorf("%s: %.0f transfers made into spans, %d OTLP requests at the sink: the spans row measured no spans", bin.name, spans.counters.spanTransfers, sink.requests.Load())
		}
		rows = append(rows, row{name: bin.name + "-out-off", r: off}, row{name: bin.name + "-out-jsonl", r: jsonl, off: &off},
			row{name: bin.name + "-out-spans", r: spans, off: &off})
	}
	for range sz.rounds { // after the agents too: the best of every round without a probe
		none = min(none, callbench(b, ref, "plain", sz.calls))
	}
	alone.add(e2eResult{others: otherAgents(0)})

	// The parent's log is not printed beside sub-benchmarks: each row logs.
	b.Run("none", func(b *testing.B) {
		b.ReportMetric(none, "ns/call")
		b.Logf("%d calls: %.0f ns per call (best of %d)%s", sz.calls, none, 2*sz.rounds, alone.notAlone())
	})
	b.Run("probes", func(b *testing.B) {
		b.ReportMetric(probed, "ns/call")
		b.ReportMetric(probed-none, "added-ns/call")
		b.Logf("%d calls: every driver row with a counting reader +%.0f ns per call (best of %d)%s", sz.calls, probed-none, sz.rounds, alone.notAlone())
	})
	for _, r := range rows {
		b.Run(r.name, func(b *testing.B) {
			r.r.report(b, none)
			if r.off == nil {
				b.Log(r.r.describe(none))
				return
			}
			over := r.r.cpuPerEvent() - r.off.cpuPerEvent()
			b.ReportMetric(over, "over-off-cpu-ns/event")
			b.Logf("%s; %+.0f ns per event over metrics only", r.r.describe(none), over)
		})
	}
}

// heldRuns copies sz.runs runs of sz.held calls beside a, one after
// another, then stops a.
func heldRuns(tb testing.TB, sz e2eSize, ref string, a *e2eAgent, done func(e2eCounters) bool) e2eResult {
	tb.Helper()
	var r e2eResult
	for range sz.runs {
		r.add(a.copy(tb, ref, 1, sz.held, done))
	}
	a.stop(tb)
	return r
}

// e2eSize are a run's sizes: rounds, calls per copier, the burst's, and
// the held runs' calls and runs per round (the output rows).
type e2eSize struct{ rounds, calls, burst, held, runs int }

// With -short (make test) one small round of each row proves they run.
// Held runs of 20 000 calls are 20 000 events of EventSize and an 8-byte
// ring header, 2.7 MB: the default 4 MiB ring holds them whole (no drop by
// construction from the copier alone); 3 rounds of 4 are 0.4 s of the
// agent's CPU at ~1.5 µs an event.
func e2eSizes() e2eSize {
	if testing.Short() {
		return e2eSize{rounds: 1, calls: 20000, burst: 40000, held: 20000, runs: 1}
	}
	return e2eSize{rounds: 3, calls: 500000, burst: 1000000, held: 20000, runs: 4}
}

// e2eCounters are the agent's counters from /metrics.
// shed counts the copies whose events BPF shed (lanewatch_lane_shed_copies_total):
// neither read nor dropped; a build before shedding reports none.
type e2eCounters struct{ events, drops, shed, transfers, spanTransfers float64 }

func (c e2eCounters) sub(d e2eCounters) e2eCounters {
	return e2eCounters{c.events - d.events, c.drops - d.drops, c.shed - d.shed, c.transfers - d.transfers, c.spanTransfers - d.spanTransfers}
}

// e2eResult sums one row's runs.
type e2eResult struct {
	runs, copiers, calls int
	nsPerCall            float64 // the best run's mean over its copiers
	wall                 time.Duration
	cpu                  time.Duration
	counters             e2eCounters
	scrapes              int
	others               []string // pids of other agents seen running
}

func (r *e2eResult) add(x e2eResult) {
	if r.runs == 0 || x.nsPerCall < r.nsPerCall {
		r.nsPerCall = x.nsPerCall
	}
	r.runs += x.runs
	r.copiers, r.calls = x.copiers, r.calls+x.calls
	r.wall += x.wall
	r.cpu += x.cpu
	r.counters.events += x.counters.events
	r.counters.drops += x.counters.drops
	r.counters.shed += x.counters.shed
	r.counters.transfers += x.counters.transfers
	r.counters.spanTransfers += x.counters.spanTransfers
	r.scrapes += x.scrapes
	for _, p := range x.others {
		if !slices.Contains(r.others, p) {
			r.others = append(r.others, p)
		}
	}
}

func (r e2eResult) dropPercent() float64 {
	return 100 * r.counters.drops / max(1, r.counters.events+r.counters.drops+r.counters.shed)
}
func (r e2eResult) shedPercent() float64 {
	return 100 * r.counters.shed / max(1, r.counters.events+r.counters.drops+r.counters.shed)
}
func (r e2eResult) eventsPerSec() float64 { return r.counters.events / r.wall.Seconds() }
func (r e2eResult) cpuPerEvent() float64 {
	return float64(r.cpu.Nanoseconds()) / max(1, r.counters.events)
}

func (r e2eResult) report(b *testing.B, none float64) {
	b.ReportMetric(r.nsPerCall, "ns/call")
	b.ReportMetric(r.nsPerCall-none, "added-ns/call")
	b.ReportMetric(r.eventsPerSec(), "events/s")
	b.ReportMetric(r.counters.drops, "drops")
	b.ReportMetric(r.dropPercent(), "drop-%")
	b.ReportMetric(r.shedPercent(), "shed-%")
	b.ReportMetric(r.cpuPerEvent(), "agent-cpu-ns/event")
}

// notAlone warns of the other agents seen running.
func (r e2eResult) notAlone() string {
	if len(r.others) == 0 {
		return ""
	}
	return "; NOT ALONE: other agents ran (pids " + strings.Join(r.others, ", ") + "), their probes and reading are in these figures"
}

func (r e2eResult) describe(none float64) string {
	return fmt.Sprintf("%d run(s) of %d copier(s), %d calls in all: %.0f ns per call (+%.0f, best run); the agent read %.0f events, %.0f/s from the copiers' start until it went idle, dropped %.0f (%.1f%%), shed %.0f (%.1f%%), used %v of CPU: %.0f ns per event read (%d transfers, %d into spans; %d scrapes checked it)",
		r.runs, r.copiers, r.calls, r.nsPerCall, r.nsPerCall-none, r.counters.events, r.eventsPerSec(), r.counters.drops, r.dropPercent(), r.counters.shed, r.shedPercent(),
		r.cpu.Round(time.Millisecond), r.cpuPerEvent(), int64(r.counters.transfers), int64(r.counters.spanTransfers), r.scrapes) + r.notAlone()
}

// agentBinary is an `agent` build under test, by the name its rows carry.
type agentBinary struct{ name, path string }

// agentBinaries are the builds the environment names, a relative path from
// the repository's root (where make runs), else this tree's.
func agentBinaries(b *testing.B, root string) []agentBinary {
	fromRoot := func(p string) string {
		if filepath.IsAbs(p) {
			return p
		}
		return filepath.Join(root, p)
	}
	var bins []agentBinary
	if p := os.Getenv("LANEWATCH_AGENT_BIN_BEFORE"); p != "" {
		bins = append(bins, agentBinary{"before", fromRoot(p)})
	}
	if p := os.Getenv("LANEWATCH_AGENT_BIN"); p != "" {
		return append(bins, agentBinary{"agent", fromRoot(p)})
	}
	gobin, err := exec.LookPath("go")
	if err != nil {
		gobin = filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	}
	out := filepath.Join(b.TempDir(), "agent")
	cmd := exec.Command(gobin, "build", "-o", out, "./cmd/agent")
	cmd.Dir = root
	if msg, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("building the agent (or set LANEWATCH_AGENT_BIN): %v\n%s", err, msg)
	}
	return append(bins, agentBinary{"agent", out})
}

// otherAgents are the pids of every `agent run` on the host but self (any
// build named agent*): their probes, and their reading of the copiers'
// events, would be in the figures.
func otherAgents(self int) []string {
	var pids []string
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		pid := filepath.Base(filepath.Dir(p))
		if len(args) > 1 && strings.HasPrefix(filepath.Base(args[0]), "agent") && args[1] == "run" && pid != strconv.Itoa(self) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// e2eAgent is `agent run` started by the benchmark.
type e2eAgent struct {
	cmd     *exec.Cmd
	log     string
	metrics string
	done    chan error
}

// startE2EAgent starts bin with the DaemonSet's flags (deploy/helm: the
// chart's memory limit, the host's sysfs and root; free loopback ports)
// and args, the reference driver probed from the start, and waits until
// its probes are attached.
func startE2EAgent(tb testing.TB, bin, driver, memoryLimit string, env []string, args ...string) *e2eAgent {
	tb.Helper()
	port := testenv.FreePort(tb)
	dir := tb.TempDir()
	a := &e2eAgent{log: filepath.Join(dir, "agent.log"), metrics: fmt.Sprintf("http://127.0.0.1:%d/metrics", port), done: make(chan error, 1)}
	logf, err := os.Create(a.log)
	if err != nil {
		tb.Fatal(err)
	}
	defer logf.Close()
	a.cmd = exec.Command(bin, append([]string{"run", "--memory-limit", memoryLimit,
		"--web.listen-address", fmt.Sprintf("127.0.0.1:%d", port), "--path.sysfs", "/sys", "--path.rootfs", "/",
		"--otlp.grpc-listen", fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(tb)), "--otlp.http-listen", fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(tb)),
		"--lib", driver}, args...)...)
	for _, e := range os.Environ() {
		if k, _, _ := strings.Cut(e, "="); k != "GOMEMLIMIT" && k != "GOGC" && !strings.HasPrefix(k, "OTEL_EXPORTER_OTLP_") {
			a.cmd.Env = append(a.cmd.Env, e)
		}
	}
	a.cmd.Env = append(a.cmd.Env, env...)
	a.cmd.Stderr = logf
	if err := a.cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	go func() { a.done <- a.cmd.Wait() }()
	tb.Cleanup(func() {
		if a.cmd.ProcessState == nil {
			a.cmd.Process.Kill()
			<-a.done
		}
	})
	for deadline := time.Now().Add(2 * time.Minute); !strings.Contains(a.logText(), "lanewatch running"); time.Sleep(100 * time.Millisecond) {
		select {
		case err := <-a.done:
			tb.Fatalf("%s exited (%v) before attaching:\n%s", bin, err, a.logText())
		default:
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%s not attached after 2 minutes:\n%s", bin, a.logText())
		}
	}
	a.idle(tb, agentCPU(tb, a.cmd.Process.Pid)) // done with its start: its first scans and checks
	return a
}

func (a *e2eAgent) logText() string {
	b, _ := os.ReadFile(a.log)
	return string(b)
}

// stop sends SIGINT and waits for a clean exit.
func (a *e2eAgent) stop(tb testing.TB) {
	tb.Helper()
	a.cmd.Process.Signal(syscall.SIGINT)
	select {
	case err := <-a.done:
		if err != nil {
			tb.Errorf("agent exited: %v\n%s", err, a.logText())
		}
	case <-time.After(2 * time.Minute):
		a.cmd.Process.Kill()
		<-a.done
		tb.Errorf("agent still running 2 minutes after SIGINT:\n%s", a.logText())
	}
}

// chartMemoryLimit is the Helm chart's memory limit (resources.limits.memory
// in its values), as --memory-limit writes it.
func chartMemoryLimit(tb testing.TB, root string) string {
	tb.Helper()
	values := filepath.Join(root, "deploy", "helm", "lanewatch", "values.yaml")
	f, err := os.Open(values)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	section := ""
	for sc := bufio.NewScanner(f); sc.Scan(); {
		line := sc.Text()
		switch {
		case !strings.HasPrefix(line, " "):
			section = strings.TrimSpace(line)
		case section == "resources:" && strings.TrimSpace(line) == "limits:":
			section = "limits"
		case section == "limits" && strings.HasPrefix(strings.TrimSpace(line), "memory:"):
			return strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "memory:")) + "B" // 512Mi is 512MiB
		}
	}
	tb.Fatalf("%s: no resources.limits.memory", values)
	return ""
}

// counters scrapes the agent's /metrics.
func (a *e2eAgent) counters(tb testing.TB) e2eCounters {
	tb.Helper()
	c := http.Client{Timeout: time.Minute}
	resp, err := c.Get(a.metrics)
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	text, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatal(err)
	}
	var n e2eCounters
	for _, line := range strings.Split(string(text), "\n") {
		name, rest, _ := strings.Cut(line, " ")
		name, _, _ = strings.Cut(name, "{")
		if i := strings.LastIndexByte(line, ' '); i > 0 && rest != "" {
			v, err := strconv.ParseFloat(line[i+1:], 64)
			if err != nil {
				continue
			}
			switch name {
			case "lanewatch_probe_events_total":
				n.events += v
			case "lanewatch_probe_dropped_events_total":
				n.drops += v
			case "lanewatch_lane_shed_copies_total":
				n.shed += v
			case "lanewatch_transfers_total":
				n.transfers += v
			case "lanewatch_span_transfers_total":
				n.spanTransfers += v
			}
		}
	}
	return n
}

// copy runs n copiers of calls each at once beside the agent and waits
// until it has read their events (every call an event read, dropped or shed)
// and, when done is not nil, until done says so of the counters' change.
func (a *e2eAgent) copy(tb testing.TB, ref string, n, calls int, done func(e2eCounters) bool, env ...string) e2eResult {
	tb.Helper()
	base := a.counters(tb)
	cmds := make([]*exec.Cmd, n)
	outs := make([]bytes.Buffer, n)
	for i := range cmds {
		cmds[i] = callbenchCmd(ref, "plain", calls)
		cmds[i].Env = append(cmds[i].Env, env...)
		cmds[i].Stdout = &outs[i]
	}
	others := otherAgents(a.cmd.Process.Pid)
	start := time.Now()
	cpu0 := agentCPU(tb, a.cmd.Process.Pid)
	for _, c := range cmds {
		if err := c.Start(); err != nil {
			tb.Fatal(err)
		}
	}
	r := e2eResult{runs: 1, copiers: n, calls: n * calls}
	for i, c := range cmds {
		if err := c.Wait(); err != nil {
			tb.Fatalf("%s: %v", c, err)
		}
		r.nsPerCall += parseNsPerCall(tb, c, outs[i].Bytes()) / float64(n)
	}
	// When it is idle, check the counters; a scrape that finds it not done
	// is left out of its CPU.
	var scraped time.Duration
	last, lastBusy := a.idle(tb, cpu0)
	for deadline := time.Now().Add(5 * time.Minute); ; {
		d := a.counters(tb).sub(base)
		r.scrapes++
		if d.events+d.drops+d.shed >= float64(n*calls) && (done == nil || done(d)) {
			r.cpu, r.wall, r.counters = last.since(cpu0)-scraped, lastBusy.Sub(start), d
			r.others = append(others, otherAgents(a.cmd.Process.Pid)...)
			return r
		}
		if time.Now().After(deadline) {
			tb.Fatalf("after 5 minutes the agent has read %.0f, dropped %.0f and shed %.0f of %d calls' events (%+v):\n%s", d.events, d.drops, d.shed, n*calls, d, a.logText())
		}
		after := agentCPU(tb, a.cmd.Process.Pid)
		scraped += after.since(last)
		last, lastBusy = a.idle(tb, after)
	}
}

// idle polls the agent's CPU (free for it) from c until it has been idle
// for 100 ms, or for 30 s (other processes of the host may keep it busy),
// and returns its CPU then and when it last worked.
func (a *e2eAgent) idle(tb testing.TB, c cpuSample) (cpuSample, time.Time) {
	tb.Helper()
	lastBusy := time.Now()
	for idle, deadline := 0, lastBusy.Add(30*time.Second); idle < 5 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
		now := agentCPU(tb, a.cmd.Process.Pid)
		if now.since(c) >= 2*time.Millisecond { // a tenth of the poll: working
			lastBusy, idle = time.Now(), 0
		} else {
			idle++
		}
		c = now
	}
	return c, lastBusy
}

// cpuSample is a process's CPU time so far: its threads' run time in ns
// (schedstat) and, for when a thread ended in between, the whole process's
// in clock ticks (stat).
type cpuSample struct {
	threads map[string]time.Duration
	process time.Duration
}

func agentCPU(tb testing.TB, pid int) cpuSample {
	tb.Helper()
	s := cpuSample{threads: map[string]time.Duration{}}
	dir := fmt.Sprintf("/proc/%d", pid)
	stat, err := os.ReadFile(dir + "/stat")
	if err != nil {
		tb.Fatal(err)
	}
	f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+2:])) // from field 3, state
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	s.process = time.Duration(utime+stime) * time.Second / 100 // USER_HZ
	tasks, _ := os.ReadDir(dir + "/task")
	for _, t := range tasks {
		b, err := os.ReadFile(dir + "/task/" + t.Name() + "/schedstat")
		if err != nil {
			continue // ended meanwhile: since falls back on stat
		}
		if ns, err := strconv.ParseInt(strings.Fields(string(b))[0], 10, 64); err == nil {
			s.threads[t.Name()] = time.Duration(ns)
		}
	}
	return s
}

// since is the CPU time used from s0 to s: the threads' sum, exact, while
// every thread of s0 is still there.
func (s cpuSample) since(s0 cpuSample) time.Duration {
	var d time.Duration
	for tid, ns := range s.threads {
		d += ns - s0.threads[tid]
	}
	for tid := range s0.threads {
		if _, ok := s.threads[tid]; !ok {
			return s.process - s0.process
		}
	}
	return d
}

// otlpSink takes OTLP/HTTP trace exports and counts them.
type otlpSink struct {
	addr     string
	srv      *http.Server
	requests atomic.Int64
}

func startOTLPSink(tb testing.TB) *otlpSink {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	s := &otlpSink{addr: ln.Addr().String()}
	s.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if r.URL.Path == "/v1/traces" {
			s.requests.Add(1)
		}
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.WriteHeader(http.StatusOK) // an empty ExportTraceServiceResponse
	})}
	go s.srv.Serve(ln)
	return s
}

func (s *otlpSink) close() { s.srv.Close() }
