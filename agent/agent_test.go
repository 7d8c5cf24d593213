package agent_test

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lanewatch/lanewatch/agent"
	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/internal/testenv"
	"github.com/lanewatch/lanewatch/selftest"
	"github.com/lanewatch/lanewatch/selftest/refenv"
)

// syncBuffer is a log destination safe for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// running is an agent started for a test, stopped by the test's cleanup.
type running struct {
	agent *agent.Agent
	col   *selftest.Collector
	logs  *syncBuffer
}

// startAgent runs an agent until the test ends; setup sees it before Run.
func startAgent(t testing.TB, cfg agent.Config, setup ...func(*agent.Agent)) *running {
	t.Helper()
	r := &running{col: selftest.NewCollector(nil), logs: &syncBuffer{}}
	if cfg.Sink == nil {
		cfg.Sink = r.col // a benchmark's sink counts what it would hold
	}
	if cfg.Kernels && cfg.Activity == nil {
		cfg.Activity = r.col // launches, waits, records: the compute-overlap rules' input
	}
	cfg.OnExit = r.col.OnExit
	cfg.OnRuntimeLayer = r.col.OnRuntimeLayer
	cfg.Logger = slog.New(slog.NewTextHandler(io.MultiWriter(r.logs, testWriter{t}), &slog.HandlerOptions{Level: slog.LevelDebug - 1}))
	ready := make(chan struct{})
	cfg.OnReady = func() { close(ready) }
	a, err := agent.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r.agent = a
	for _, f := range setup {
		f(a)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("agent Run: %v", err)
		}
	})
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("agent stopped before it was ready: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("agent not ready after 30 s")
	}
	return r
}

// testWriter sends agent logs to the test log only when -v, keeping failures readable.
type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	if testing.Verbose() {
		w.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

func runScenario(t *testing.T, ref, scenario, truth string, extra ...string) *exec.Cmd {
	t.Helper()
	args := append([]string{"--scenario", scenario, "--truth", truth}, extra...)
	cmd := exec.Command(filepath.Join(ref, "bin", "kvpath"), args...)
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s: %v", scenario, err)
	}
	return cmd
}

// startReady starts a kvpath run with --hold and returns its stdin (closing
// it releases the run) once it printed its ready line; its stdout is
// drained, and it is killed at the test's end if it still runs.
func startReady(t *testing.T, cmd *exec.Cmd) io.WriteCloser {
	t.Helper()
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill() })
	r := bufio.NewReader(out)
	if line, err := r.ReadString('\n'); err != nil || !strings.HasPrefix(line, "ready") {
		t.Fatalf("%s: %q %v", cmd.Args, line, err)
	}
	go io.Copy(io.Discard, r)
	return in
}

func waitExit(t testing.TB, col *selftest.Collector, pid int) {
	t.Helper()
	select {
	case <-col.ExitChan(uint32(pid)):
	case <-time.After(20 * time.Second):
		t.Fatalf("agent did not see pid %d exit", pid)
	}
}

// A library loaded with dlopen after the agent started, from a file no
// process mapped before (a fresh copy), in a process started after the agent,
// is found through the dynamic linker's notification and traced.
func TestDlopenAfterStart(t *testing.T) {
	testenv.RequireRoot(t)
	ref := testenv.RefDir(t)
	r := startAgent(t, agent.Config{})

	// Fresh inodes, same relative layout so RUNPATH finds the driver.
	dir := t.TempDir()
	for _, f := range []string{"plain/libcudart.so.12", "lib/libcuda.so.1"} {
		copyFile(t, filepath.Join(ref, f), filepath.Join(dir, f))
	}
	truth := filepath.Join(dir, "dlopen.jsonl")
	cmd := exec.Command(filepath.Join(ref, "bin", "kvdl"), "--lib", filepath.Join(dir, "plain/libcudart.so.12"),
		"--truth", truth, "--copies", "150", "--interval-ms", "10", "--settle-ms", "300")
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	waitExit(t, r.col, cmd.Process.Pid)
	calls, err := selftest.ReadTruthFile(truth)
	if err != nil {
		t.Fatal(err)
	}
	var want []selftest.TruthCall
	for _, c := range calls {
		if c.IsCopy() {
			want = append(want, c)
		}
	}
	got := r.col.Take(uint32(cmd.Process.Pid))
	// Attaching takes a few milliseconds after dlopen returns: the first
	// copies may be missed, the rest must all be there and be right.
	byDst := map[uint64]correlate.Transfer{}
	for _, g := range got {
		byDst[g.Src.Addr<<1^g.Dst.Addr] = g
	}
	if len(got) < len(want)*3/4 {
		t.Fatalf("traced %d of %d copies after dlopen", len(got), len(want))
	}
	for i, w := range want[len(want)/2:] {
		g, ok := byDst[w.Src<<1^w.Dst]
		if !ok {
			t.Errorf("copy %d (%s %#x→%#x) in the second half was not traced", i+len(want)/2, w.API, w.Src, w.Dst)
			continue
		}
		if g.Bytes != w.Bytes || g.Direction != w.Direction {
			t.Errorf("copy %d: got %d B %s, want %d B %s", i, g.Bytes, g.Direction, w.Bytes, w.Direction)
		}
	}
	// If the attach lost the race with the pool's registration the pool is
	// unknown; it is never called pageable.
	kinds := map[event.MemKind]int{}
	for _, g := range got {
		kinds[g.HostMem]++
	}
	if kinds[event.MemPageable] > 0 || kinds[event.MemPinned]+kinds[event.MemUnknown] != len(got) {
		t.Errorf("host memory of the registered pool: %v", kinds)
	}
	t.Logf("traced %d of %d copies; host memory %v", len(got), len(want), kinds)
	// The driver the dlopened runtime pulled in is where the probes sit.
	if !strings.Contains(r.logs.String(), filepath.Join(dir, "lib/libcuda.so.1")) {
		t.Errorf("no log line names the driver the dlopened runtime loaded")
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o755); err != nil {
		t.Fatal(err)
	}
}

// Bad input never stops the agent: a pid that does not exist, a library with
// no symbol table, a target killed mid-trace; the other targets are traced.
func TestBadInputKeepsRunning(t *testing.T) {
	testenv.RequireRoot(t)
	ref := testenv.RefDir(t)
	dir := t.TempDir()

	// A "libcudart" with no symbol table at all: a stripped static executable.
	src := filepath.Join(dir, "s.c")
	os.WriteFile(src, []byte("void _start(void){for(;;);}\n"), 0o644)
	stripped := filepath.Join(dir, "libcudart.so.12")
	if out, err := exec.Command("gcc", "-static", "-nostdlib", "-o", stripped, src).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v %s", err, out)
	}
	if out, err := exec.Command("strip", "--strip-all", stripped).CombinedOutput(); err != nil {
		t.Fatalf("strip: %v %s", err, out)
	}

	r := startAgent(t, agent.Config{
		Libs: []string{stripped, filepath.Join(ref, "plain/libcudart.so.12"), filepath.Join(ref, "lib/libcuda.so.1")},
		PIDs: nil,
	})
	logs := r.logs.String()
	if !strings.Contains(logs, "no symbol table") || !strings.Contains(logs, stripped) {
		t.Errorf("no clear message for the stripped library; logs:\n%s", logs)
	}

	// A target killed in the middle of its copies.
	victim := exec.Command(filepath.Join(ref, "bin", "kvpath"), "--scenario", "hicache-load",
		"--truth", filepath.Join(dir, "victim.jsonl"), "--layers", "200", "--layer-bytes", "262144")
	victim.Env = append(os.Environ(), refenv.H2DGBps(0.02)) // 13 ms a layer: still copying when killed
	if err := victim.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(700 * time.Millisecond)
	victim.Process.Kill()
	victim.Wait()
	waitExit(t, r.col, victim.Process.Pid)
	if n := len(r.col.Take(uint32(victim.Process.Pid))); n == 0 {
		t.Errorf("nothing traced from the killed target before it died")
	}

	// The agent still traces the next process exactly.
	truth := filepath.Join(dir, "after.jsonl")
	cmd := runScenario(t, ref, "hicache-load", truth)
	waitExit(t, r.col, cmd.Process.Pid)
	calls, err := selftest.ReadTruthFile(truth)
	if err != nil {
		t.Fatal(err)
	}
	res := selftest.Result{}
	selftest.Compare(&res, calls, r.col.Take(uint32(cmd.Process.Pid)))
	if !res.OK() {
		t.Errorf("after bad input: %+v", res)
	}
}

// A pid that does not exist and a process whose maps cannot be read are
// reported by number, and the agent keeps running for the valid target.
func TestBadPIDs(t *testing.T) {
	testenv.RequireRoot(t)
	// A proc root where pid 4242 is missing and pid 4343's maps is unreadable
	// (a directory: even root cannot read it as a file).
	proc := t.TempDir()
	os.MkdirAll(filepath.Join(proc, "4343", "maps"), 0o755)
	r := startAgent(t, agent.Config{ProcRoot: proc, PIDs: []int{4242, 4343}})
	logs := r.logs.String()
	for _, want := range []string{"pid 4242: no such process", "pid 4343"} {
		if !strings.Contains(logs, want) {
			t.Errorf("logs lack %q:\n%s", want, logs)
		}
	}
}
