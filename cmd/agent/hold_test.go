package main

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lanewatch/lanewatch/internal/testenv"
	"github.com/lanewatch/lanewatch/probes"
)

// An agent that stops answering while a process waits at its loader
// notification, then is killed (SIGKILL: no cleanup), keeps no one
// waiting: the hold ends once the agent's beat is stale, and the process
// runs to its end (docs/design.md, "Attach and discovery"). SIGSTOP from
// BPF would have left it stopped; this hold leaves nothing behind.
func TestAgentKilledWhileHolding(t *testing.T) {
	testenv.RequireRoot(t)
	ref := testenv.RefDir(t)
	dir := t.TempDir()
	for from, to := range map[string]string{"plain/libcudart.so.12": "sdk/libcudart.so.12", "lib/libcuda.so.1": "driver/libcuda.so.1"} {
		b, err := os.ReadFile(filepath.Join(ref, from))
		if err != nil {
			t.Fatal(err)
		}
		os.MkdirAll(filepath.Dir(filepath.Join(dir, to)), 0o755)
		if err := os.WriteFile(filepath.Join(dir, to), b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	agentCmd := exec.Command(os.Args[0], "run", "--output", os.DevNull, "--web.listen-address", "", "--otlp.grpc-listen", "", "--otlp.http-listen", "",
		"--path.rootfs", "-")
	agentCmd.Env = append(os.Environ(), "LW_AGENT_MAIN=1")
	stderr, err := agentCmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := agentCmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer agentCmd.Process.Kill()
	logs := bufio.NewScanner(stderr)
	for logs.Scan() && !strings.Contains(logs.Text(), "lanewatch running") {
		if strings.Contains(logs.Text(), "cannot hold a process") {
			t.Fatalf("this kernel refused the hold program: %s", logs.Text())
		}
	}
	go func() {
		for logs.Scan() {
		}
	}()
	agentCmd.Process.Signal(syscall.SIGSTOP) // it reads nothing, probes nothing, beats no more

	scen := exec.Command(filepath.Join(ref, "bin/kvpath"), "--scenario", "hicache-load", "--layers", "4", "--truth", filepath.Join(dir, "truth.jsonl"))
	scen.Env = append(os.Environ(), "LD_LIBRARY_PATH="+filepath.Join(dir, "sdk")+":"+filepath.Join(dir, "driver"))
	start := time.Now()
	if err := scen.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // at its notification by now, held or going on
	agentCmd.Process.Kill()
	agentCmd.Wait()
	done := make(chan error, 1)
	go func() { done <- scen.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the process held when the agent died: %v", err)
		}
		// Held it was: nothing could release it before the beat went stale.
		if took := time.Since(start); took < probes.BeatStale/2 {
			t.Errorf("done %s after it started: it was never held", took.Round(time.Millisecond))
		}
	case <-time.After(probes.BeatStale + 20*time.Second):
		scen.Process.Kill()
		t.Fatalf("the process held when the agent died is still not done after %s", time.Since(start).Round(time.Millisecond))
	}
	t.Logf("the process went on and finished %s after it started (beat stale after %s)", time.Since(start).Round(time.Millisecond), probes.BeatStale)
}
