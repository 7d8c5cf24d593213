package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lanewatch/lanewatch/internal/testenv"
)

// The test binary doubles as the agent binary when LW_AGENT_MAIN is set, so
// the signal test exercises the real main.
func TestMain(m *testing.M) {
	if os.Getenv("LW_AGENT_MAIN") == "1" {
		os.Exit(realMain(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

func TestUsage(t *testing.T) {
	var out, errb bytes.Buffer
	if code := realMain(nil, &out, &errb); code != 2 || !strings.Contains(errb.String(), "agent run") {
		t.Errorf("no args: code %d, stderr %q", code, errb.String())
	}
	errb.Reset()
	if code := realMain([]string{"frobnicate"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), `unknown command "frobnicate"`) {
		t.Errorf("unknown command: code %d, stderr %q", code, errb.String())
	}
	errb.Reset()
	if code := realMain([]string{"run", "--pid", "abc"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), `not a process id: "abc"`) {
		t.Errorf("bad pid: code %d, stderr %q", code, errb.String())
	}
	errb.Reset()
	if code := realMain([]string{"run", "-h"}, &out, &errb); code != 0 || !strings.Contains(errb.String(), "-output") {
		t.Errorf("run -h: code %d, stderr %q", code, errb.String())
	}
	for _, args := range [][]string{{"selftest", "--replay"}, {"selftest", "trace.json.gz"}} {
		errb.Reset()
		if code := realMain(args, &out, &errb); code != 2 || !strings.Contains(errb.String(), "trace files go with --replay") {
			t.Errorf("%q: code %d, stderr %q", args, code, errb.String())
		}
	}
	errb.Reset()
	if code := realMain([]string{"selftest", "-h"}, &out, &errb); code != 0 || !strings.Contains(errb.String(), "--replay [--json] FILE...") {
		t.Errorf("selftest -h: code %d, stderr %q", code, errb.String())
	}
	out.Reset()
	if code := realMain([]string{"version"}, &out, &errb); code != 0 || !strings.HasPrefix(out.String(), "lanewatch ") {
		t.Errorf("version: %d %q", code, out.String())
	}
}

func TestPIDList(t *testing.T) {
	var p pidList
	if err := p.Set("12, 34"); err != nil || len(p) != 2 || p[0] != 12 || p[1] != 34 {
		t.Errorf("Set: %v %v", p, err)
	}
	for _, bad := range []string{"", "0", "-3", "1,x"} {
		var q pidList
		if q.Set(bad) == nil {
			t.Errorf("Set(%q) accepted", bad)
		}
	}
}

// `agent run` writes one JSON line per transfer and, on SIGINT, detaches
// every probe and exits 0.
func TestRunWritesJSONLAndStopsOnSIGINT(t *testing.T) {
	testenv.RequireRoot(t)
	ref := testenv.RefDir(t)
	dir := t.TempDir()
	out := filepath.Join(dir, "transfers.jsonl")
	a := startRun(t, nil, "--output", out, "--web.listen-address", "", "--otlp.grpc-listen", "", "--otlp.http-listen", "",
		"--lib", filepath.Join(ref, "plain", "libcudart.so.12"), "--lib", filepath.Join(ref, "lib", "libcuda.so.1"))
	cmd, waitFor := a.cmd, a.waitFor
	waitFor("lanewatch running")

	scen := exec.Command(filepath.Join(ref, "bin", "kvpath"), "--scenario", "hicache-load", "--layers", "8",
		"--truth", filepath.Join(dir, "truth.jsonl"))
	if b, err := scen.CombinedOutput(); err != nil {
		t.Fatalf("scenario: %v %s", err, b)
	}
	time.Sleep(500 * time.Millisecond) // the exit event flushes the process's transfers
	cmd.Process.Signal(syscall.SIGINT)
	waitFor("every probe detached")
	if err := cmd.Wait(); err != nil {
		t.Fatalf("agent exit: %v\n%s", err, a.logText.String())
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var rec struct {
			PID       int    `json:"pid"`
			API       string `json:"api"`
			Direction string `json:"direction"`
			HostMem   string `json:"host_mem"`
			Bytes     uint64 `json:"bytes"`
		}
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("bad line %q: %v", line, err)
		}
		if rec.PID == scen.Process.Pid {
			n++
			if rec.API != "cudaMemcpyAsync" || rec.Direction != "H2D" || rec.HostMem != "pinned" || rec.Bytes != 1<<20 {
				t.Errorf("record %+v", rec)
			}
		}
	}
	if n != 8 {
		t.Errorf("%d records for the scenario, want 8 (one per layer)", n)
	}
}

// `agent run --output off` encodes no record (stdout stays empty) while
// the engine still sees every transfer (the summary counts them), and
// --debug.pprof serves Go's profiles on the address it logs.
func TestRunOutputOffAndProfiles(t *testing.T) {
	testenv.RequireRoot(t)
	ref := testenv.RefDir(t)
	var stdout bytes.Buffer
	a := startRun(t, &stdout, "--output", "off", "--debug.pprof", "127.0.0.1:0", "--web.listen-address", "",
		"--otlp.grpc-listen", "", "--otlp.http-listen", "",
		"--lib", filepath.Join(ref, "plain", "libcudart.so.12"), "--lib", filepath.Join(ref, "lib", "libcuda.so.1"))
	cmd, waitFor := a.cmd, a.waitFor
	line := waitFor("serving Go profiles")
	_, addr, _ := strings.Cut(line, "address=")
	addr, _, _ = strings.Cut(addr, " ")
	resp, err := http.Get("http://" + addr + "/debug/pprof/cmdline")
	if err != nil {
		t.Fatalf("profiles at %q: %v", addr, err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "--debug.pprof") {
		t.Errorf("/debug/pprof/cmdline: %s %q", resp.Status, body)
	}
	waitFor("lanewatch running")
	scen := exec.Command(filepath.Join(ref, "bin", "kvpath"), "--scenario", "hicache-load", "--layers", "8",
		"--truth", filepath.Join(t.TempDir(), "truth.jsonl"))
	if b, err := scen.CombinedOutput(); err != nil {
		t.Fatalf("scenario: %v %s", err, b)
	}
	cmd.Process.Signal(syscall.SIGINT)
	summary := waitFor("msg=summary")
	waitFor("every probe detached")
	if err := cmd.Wait(); err != nil {
		t.Fatalf("agent exit: %v\n%s", err, a.logText.String())
	}
	if stdout.Len() != 0 {
		t.Errorf("--output off wrote %d bytes: %.200q", stdout.Len(), stdout.String())
	}
	// The scenario's 8 copies reached the engine: 8 transfers at least
	// (the summary counts them whether or not they were encoded).
	var n int
	if _, rest, ok := strings.Cut(summary, " transfers="); !ok {
		t.Fatalf("summary %q", summary)
	} else if _, err := fmt.Sscan(rest, &n); err != nil || n < 8 {
		t.Errorf("summary %q: %d transfers, want at least 8", summary, n)
	}
}

// runningAgent is `agent run` started by a test, with its log read line by
// line.
type runningAgent struct {
	t       *testing.T
	cmd     *exec.Cmd
	logs    *bufio.Scanner
	logText strings.Builder
}

// startRun starts `agent run args...` (this test binary as the agent),
// its stdout to stdout when not nil; it is killed when the test ends.
func startRun(t *testing.T, stdout io.Writer, args ...string) *runningAgent {
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{"run"}, args...)...)
	cmd.Env = append(os.Environ(), "LW_AGENT_MAIN=1")
	cmd.Stdout = stdout
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill() })
	return &runningAgent{t: t, cmd: cmd, logs: bufio.NewScanner(stderr)}
}

// waitFor reads the agent's log up to the first line containing s, and
// returns it; the test fails with the log read so far if none does.
func (a *runningAgent) waitFor(s string) string {
	a.t.Helper()
	for a.logs.Scan() {
		a.logText.WriteString(a.logs.Text() + "\n")
		if strings.Contains(a.logs.Text(), s) {
			return a.logs.Text()
		}
	}
	a.t.Fatalf("agent log never said %q:\n%s", s, a.logText.String())
	return ""
}
