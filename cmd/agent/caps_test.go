package main

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lanewatch/lanewatch/internal/testenv"
)

// asNobody makes a command that runs this test binary as the agent
// (LW_AGENT_MAIN) under user nobody with only caps (setpriv from
// util-linux: inheritable and ambient, so the exec keeps them). The binary
// is copied where nobody may run it.
func asNobody(t *testing.T, bin string, caps []string, args ...string) *exec.Cmd {
	t.Helper()
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Fatalf("setpriv (util-linux) is needed to drop capabilities: %v", err)
	}
	pargs := []string{"--reuid", "nobody", "--regid", "nogroup", "--clear-groups"}
	if len(caps) == 0 {
		pargs = append(pargs, "--inh-caps", "-all")
	} else {
		c := "+" + strings.Join(caps, ",+")
		pargs = append(pargs, "--inh-caps", c, "--ambient-caps", c)
	}
	cmd := exec.Command(setpriv, append(append(pargs, "--", bin), args...)...)
	cmd.Env = append(os.Environ(), "LW_AGENT_MAIN=1")
	return cmd
}

// nobodyDir is a directory user nobody can read, run and write in.
func nobodyDir(t *testing.T) string {
	t.Helper()
	d := t.TempDir()
	for p := d; p != os.TempDir() && p != "/"; p = filepath.Dir(p) {
		os.Chmod(p, 0o777)
	}
	return d
}

// The true minimum, found by test (issue 13): `agent run` as user nobody
// with only CAP_BPF, CAP_PERFMON, CAP_SYS_PTRACE, CAP_DAC_READ_SEARCH and
// CAP_CHECKPOINT_RESTORE traces a root process on the reference data path
// completely and reads its environment, and probes its libraries after an
// in-place upgrade replaced them on disk; without CAP_DAC_READ_SEARCH it
// still traces it but cannot read its environment (/proc/PID/environ is
// 0400); without CAP_SYS_PTRACE it cannot read its maps, so does not trace
// it; without CAP_CHECKPOINT_RESTORE it cannot open the replaced libraries
// (/proc/PID/map_files), so does not trace it — each time saying which
// capability is missing; with CAP_BPF or CAP_PERFMON missing it names each one
// missing and what needs it, and exits 1 before loading anything (it said
// "remove memlock limit" or "MEMLOCK may be too low" on this 6.18 kernel,
// where RLIMIT_MEMLOCK does not apply).
func TestRunCapabilities(t *testing.T) {
	testenv.RequireRoot(t)
	ref := testenv.RefDir(t)
	dir := nobodyDir(t)
	bin := filepath.Join(dir, "agent")
	b, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	off := []string{"--web.listen-address", "", "--otlp.grpc-listen", "", "--otlp.http-listen", ""}

	for _, tc := range []struct {
		caps          []string
		missing, some []string
	}{
		{nil, []string{"CAP_BPF", "CAP_PERFMON"}, nil},
		{[]string{"bpf", "sys_ptrace"}, []string{"CAP_PERFMON"}, []string{"CAP_BPF"}},
		{[]string{"perfmon", "sys_ptrace"}, []string{"CAP_BPF"}, []string{"CAP_PERFMON"}},
	} {
		cmd := asNobody(t, bin, tc.caps, append([]string{"run", "--output", filepath.Join(dir, "none.jsonl")}, off...)...)
		out, err := cmd.CombinedOutput()
		code := -1
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		}
		text := string(out)
		if code != 1 {
			t.Errorf("caps %v: exit %d (%v), want 1:\n%s", tc.caps, code, err, text)
		}
		for _, c := range tc.missing {
			if !strings.Contains(text, "agent run: missing "+c+" to ") {
				t.Errorf("caps %v: %s not named:\n%s", tc.caps, c, text)
			}
		}
		for _, c := range tc.some {
			if strings.Contains(text, "missing "+c) {
				t.Errorf("caps %v: %s named, it is there:\n%s", tc.caps, c, text)
			}
		}
		if strings.Contains(strings.ToLower(text), "memlock") {
			t.Errorf("caps %v: blames the memlock limit:\n%s", tc.caps, text)
		}
	}

	// traced runs hicache-load as root under an agent with caps, held
	// after it loaded its libraries until the agent attached them or said
	// it could not, and returns its records and the agent's log.
	traced := func(caps []string, mode string) (records int, log string) {
		t.Helper()
		// A private copy of the reference path: its libraries are attached
		// (or refused) for this process, not found attached for another.
		own := filepath.Join(dir, "libs-"+strings.Join(caps, "-"))
		for _, f := range []string{"bin/kvpath", "lib/libcuda.so.1", "plain/libcudart.so.12"} {
			b, err := os.ReadFile(filepath.Join(ref, f))
			if err != nil {
				t.Fatal(err)
			}
			os.MkdirAll(filepath.Dir(filepath.Join(own, f)), 0o755)
			if err := os.WriteFile(filepath.Join(own, f), b, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		out := filepath.Join(dir, "transfers-"+strings.Join(caps, "-")+".jsonl")
		args := append([]string{"run", "--output", out}, off...)
		if mode == "lib" { // attached at start: the process's first calls are seen
			args = append(args, "--lib", filepath.Join(own, "lib", "libcuda.so.1"))
		}
		var l *agentLog
		cmd := asNobody(t, bin, caps, args...)
		startAgent := func() {
			stderr, err := cmd.StderrPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			l = newAgentLog(stderr)
			l.waitFor(t, regexp.MustCompile(`lanewatch running`), 30*time.Second)
		}
		defer func() {
			if cmd.Process != nil {
				cmd.Process.Kill()
			}
		}()
		if mode != "replaced" {
			startAgent()
		}

		kv := exec.Command(filepath.Join(own, "bin", "kvpath"), "--scenario", "hicache-load", "--hold",
			"--truth", filepath.Join(dir, "truth-"+strings.Join(caps, "-")+".jsonl"))
		stdin, _ := kv.StdinPipe()
		kvOut, _ := kv.StdoutPipe()
		if err := kv.Start(); err != nil {
			t.Fatal(err)
		}
		defer kv.Process.Kill()
		ready := make([]byte, 64)
		n, _ := io.ReadAtLeast(kvOut, ready, len("ready 1\n"))
		if !strings.HasPrefix(string(ready[:n]), "ready ") {
			t.Fatalf("kvpath did not stop at its hold point: %q", ready[:n])
		}
		pid := strconv.Itoa(kv.Process.Pid)
		if mode == "replaced" {
			// An in-place upgrade while the process runs: its libraries'
			// paths now name new files, the mapped ones are deleted.
			for _, f := range []string{"lib/libcuda.so.1", "plain/libcudart.so.12"} {
				p := filepath.Join(own, f)
				b, _ := os.ReadFile(p)
				if err := os.WriteFile(p+".new", b, 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.Rename(p+".new", p); err != nil {
					t.Fatal(err)
				}
			}
			startAgent() // its first scan finds the process
		}
		lib := regexp.QuoteMeta(filepath.Join(own, "lib", "libcuda.so.1"))
		path := `path="?` + lib + `( \(deleted\)")? ` // a deleted file's mapping says so
		if tried := regexp.MustCompile(`msg=attached ` + path + `|msg="[^"]*CUDA library[^"]*" ` + path); !tried.MatchString(l.String()) {
			l.waitFor(t, tried, 30*time.Second)
		}
		stdin.Close()
		io.Copy(io.Discard, kvOut)
		if err := kv.Wait(); err != nil {
			t.Fatalf("kvpath: %v", err)
		}
		cmd.Process.Signal(syscall.SIGINT)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("caps %v: agent: %v\n%s", caps, err, l.String())
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("caps %v: agent did not stop", caps)
		}
		b, _ := os.ReadFile(out)
		return strings.Count(string(b), `"pid":`+pid+`,`), strings.NewReplacer("/proc/"+pid+"/", "/proc/KVPATH/", "pid="+pid+" ", "pid=KVPATH ").Replace(l.String())
	}
	denied := "/proc/KVPATH/environ: permission denied"
	placed := regexp.MustCompile(`msg="CUDA device placed" pid=KVPATH `)
	all := []string{"bpf", "perfmon", "sys_ptrace", "dac_read_search", "checkpoint_restore"}
	n, log := traced(all, "lib")
	if n != 32 || strings.Contains(log, "missing CAP_") || !placed.MatchString(log) || strings.Contains(log, denied) {
		t.Errorf("the minimum: %d records of hicache-load's 32 copies, a capability named missing, or its environment unread:\n%s", n, log)
	}
	n, log = traced([]string{"bpf", "perfmon", "sys_ptrace", "checkpoint_restore"}, "lib")
	if n != 32 || !strings.Contains(log, `msg="missing CAP_DAC_READ_SEARCH"`) || !strings.Contains(log, denied) {
		t.Errorf("without CAP_DAC_READ_SEARCH: %d records (want 32), not named, or its environment read:\n%s", n, log)
	}
	n, log = traced([]string{"bpf", "perfmon", "dac_read_search", "checkpoint_restore"}, "discover")
	if n != 0 || !strings.Contains(log, `msg="missing CAP_SYS_PTRACE"`) {
		t.Errorf("without CAP_SYS_PTRACE: %d records of a root process (want 0), or not named:\n%s", n, log)
	}
	n, log = traced(all, "replaced")
	if n != 32 || !regexp.MustCompile(`msg=attached path="\S+/libs-\S+/lib/libcuda\.so\.1 \(deleted\)" .* via=map_files`).MatchString(log) {
		t.Errorf("a library replaced on disk: %d records (want 32), or not opened through map_files:\n%s", n, log)
	}
	n, log = traced([]string{"bpf", "perfmon", "sys_ptrace", "dac_read_search"}, "replaced")
	if n != 0 || !strings.Contains(log, `msg="missing CAP_CHECKPOINT_RESTORE"`) {
		t.Errorf("a library replaced on disk without CAP_CHECKPOINT_RESTORE: %d records (want 0), or not named:\n%s", n, log)
	}
}
