package main

import (
	"fmt"
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

	"golang.org/x/sys/unix"

	"github.com/lanewatch/lanewatch/internal/testenv"
	"github.com/lanewatch/lanewatch/selftest"
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
	off := noListen

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

	traced := func(caps []string, mode string) (int, string) {
		t.Helper()
		n, _, log := tracedRun(t, ref, dir, strings.Join(caps, "-"), mode, func(args ...string) *exec.Cmd { return asNobody(t, bin, caps, args...) })
		return n, log
	}
	denied := "/proc/KVPATH/environ: permission denied"
	placed := regexp.MustCompile(`msg="CUDA device placed" pid=KVPATH `)
	all := []string{"bpf", "perfmon", "sys_ptrace", "dac_read_search", "checkpoint_restore"}
	n, log := traced(all, "lib")
	if n != 32 || strings.Contains(log, "missing CAP_") || !placed.MatchString(log) || strings.Contains(log, denied) {
		t.Errorf("the minimum: %d records of hicache-load's 32 copies, a capability named missing, or its environment unread:\n%s", n, log)
	}
	if strings.Contains(log, "cannot hold a process") { // the loader hold needs no other capability
		t.Errorf("the minimum: the hold program was refused:\n%s", log)
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

// noListen turns the agent's listeners off.
var noListen = []string{"--web.listen-address", "", "--otlp.grpc-listen", "", "--otlp.http-listen", ""}

// tracedRun runs hicache-load as root under an agent that start makes
// from its arguments, held after it loaded its libraries until the agent
// attached them or said it could not, and returns its records, whether
// they equal its truth, and the agent's log. mode: lib (the driver
// library attached at start), discover (found by the scan) or replaced
// (replaced on disk before the agent starts). name keeps runs apart.
func tracedRun(t *testing.T, ref, dir, name, mode string, start func(args ...string) *exec.Cmd) (records int, exact bool, log string) {
	t.Helper()
	// A private copy of the reference path: its libraries are attached
	// (or refused) for this process, not found attached for another.
	own := filepath.Join(dir, "libs-"+name)
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
	out := filepath.Join(dir, "transfers-"+name+".jsonl")
	args := append([]string{"run", "--output", out}, noListen...)
	if mode == "lib" { // attached at start: the process's first calls are seen
		args = append(args, "--lib", filepath.Join(own, "lib", "libcuda.so.1"))
	}
	var l *agentLog
	cmd := start(args...)
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
		"--truth", filepath.Join(dir, "truth-"+name+".jsonl"))
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
			t.Errorf("%s: agent: %v\n%s", name, err, l.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: agent did not stop", name)
	}
	b, _ := os.ReadFile(out)
	log = strings.NewReplacer("/proc/"+pid+"/", "/proc/KVPATH/", "pid="+pid+" ", "pid=KVPATH ").Replace(l.String())
	truth, err := selftest.ReadTruthFile(filepath.Join(dir, "truth-"+name+".jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	res := selftest.Result{Scenario: "hicache-load", PID: uint32(kv.Process.Pid)}
	selftest.Compare(&res, truth, readRecords(t, out)[uint32(kv.Process.Pid)])
	return strings.Count(string(b), `"pid":`+pid+`,`), res.OK() && res.WantRecords > 0, log
}

// imageFileCaps are the file capabilities of the image's agent
// (scripts/image/build.sh): permitted only, no effective bit.
const imageFileCaps = "cap_bpf,cap_perfmon,cap_sys_ptrace,cap_dac_read_search,cap_checkpoint_restore=p"

// asPodUser makes a command that runs bin, a copy of this test binary with
// the image's file capabilities, as the agent the way Kubernetes runs the
// image's: uid and gid 65532, no groups, no inheritable and no ambient
// capabilities, a bounding set of only bounding (the container's
// capabilities.add). setpriv keeps its permitted set across the uid change
// (as a runtime's init does); with nnp the agent runs under no_new_privs
// (allowPrivilegeEscalation: false), and with bare from a second launcher
// whose permitted set is empty.
func asPodUser(t *testing.T, bin string, bounding []string, nnp, bare bool, args ...string) *exec.Cmd {
	t.Helper()
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Fatalf("setpriv (util-linux) is needed to drop capabilities: %v", err)
	}
	pargs := []string{"--reuid", "65532", "--regid", "65532", "--clear-groups", "--inh-caps", "-all",
		"--bounding-set", "-all,+" + strings.Join(bounding, ",+")}
	if bare {
		pargs = append(pargs, "--", setpriv)
	}
	if nnp {
		pargs = append(pargs, "--no-new-privs")
	}
	cmd := exec.Command(setpriv, append(append(pargs, "--", bin), args...)...)
	cmd.Env = append(os.Environ(), "LW_AGENT_MAIN=1")
	return cmd
}

// runUntilRunning runs the agent of cmd, its log in logPath, until it
// exits or says it runs; running, it reads the capability sets of each of
// its threads ("CapPrm=… CapEff=… CapAmb=…" → how many threads) and stops
// it with SIGINT. It returns the exit status, the log and those sets.
func runUntilRunning(t *testing.T, cmd *exec.Cmd, logPath string) (int, string, map[string]int) {
	t.Helper()
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd.Stderr = f
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	defer cmd.Process.Kill()
	code := func(err error) int {
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode()
		}
		if err != nil {
			t.Fatalf("agent: %v", err)
		}
		return 0
	}
	readLog := func() string { b, _ := os.ReadFile(logPath); return string(b) }
	deadline := time.After(30 * time.Second)
	for {
		select {
		case err := <-done:
			return code(err), readLog(), nil
		case <-deadline:
			t.Fatalf("agent neither ran nor exited within 30s:\n%s", readLog())
		case <-time.After(50 * time.Millisecond):
		}
		if !strings.Contains(readLog(), "lanewatch running") {
			continue
		}
		threads := threadCaps(t, cmd.Process.Pid)
		cmd.Process.Signal(syscall.SIGINT)
		select {
		case err := <-done:
			return code(err), readLog(), threads
		case <-time.After(30 * time.Second):
			t.Fatalf("agent did not stop within 30s of SIGINT:\n%s", readLog())
		}
	}
}

// threadCaps counts pid's threads by their permitted, effective and
// ambient capability sets (/proc/PID/task/TID/status).
func threadCaps(t *testing.T, pid int) map[string]int {
	t.Helper()
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	if err != nil || len(tasks) == 0 {
		t.Fatalf("threads of %d: %v", pid, err)
	}
	sets := map[string]int{}
	for _, p := range tasks {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // the thread exited
		}
		var f []string
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":\t"); ok && (k == "CapPrm" || k == "CapEff" || k == "CapAmb") {
				f = append(f, k+"="+strings.TrimLeft(v, "0"))
			}
		}
		sets[strings.Join(f, " ")]++
	}
	return sets
}

// The Kubernetes shape (deploy/helm/lanewatch): the container's process
// runs as uid 65532 with no ambient capabilities, the pod's
// capabilities.add only in its bounding set, so the agent's capabilities
// are the image's file capabilities, permitted only; the agent raises them
// into its effective set before its runtime starts, in every thread. With
// all five it traces hicache-load exactly (32 of 32) and reads its
// environment; with each one dropped from the bounding set in turn the
// exec still succeeds and that one alone is named missing (CAP_BPF and
// CAP_PERFMON: exit 1). Under no_new_privs the file capabilities hold
// only within the launcher's permitted set: from a launcher without them
// all five are missing. Before the agent raised them (main before this
// test) all five were named missing with all five permitted.
func TestRunFileCapabilities(t *testing.T) {
	testenv.RequireRoot(t)
	ref := testenv.RefDir(t)
	dir := nobodyDir(t)
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil || st.Flags&unix.ST_NOSUID != 0 {
		t.Fatalf("%s: mounted nosuid (file capabilities are ignored there) or unknown: %v", dir, err)
	}
	bin := filepath.Join(dir, "agent")
	b, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("setcap", imageFileCaps, bin).CombinedOutput(); err != nil {
		t.Fatalf("setcap (libcap2-bin) %s: %v: %s", imageFileCaps, err, out)
	}
	all := []string{"bpf", "perfmon", "sys_ptrace", "dac_read_search", "checkpoint_restore"}
	const five = "1c000080004" // those five, the mask /proc/PID/status shows
	run := func(name string, bounding []string, nnp, bare bool) (int, string, map[string]int) {
		t.Helper()
		args := append([]string{"run", "--output", filepath.Join(dir, "none.jsonl")}, noListen...)
		return runUntilRunning(t, asPodUser(t, bin, bounding, nnp, bare, args...), filepath.Join(dir, name+".log"))
	}
	missing := regexp.MustCompile(`missing (CAP_\w+)`)

	code, log, threads := run("all", all, false, false)
	want := "CapPrm=" + five + " CapEff=" + five + " CapAmb="
	if code != 0 || len(threads) != 1 || threads[want] == 0 || missing.MatchString(log) {
		t.Errorf("all five in the bounding set: exit %d, threads %v (want all %q), or one named missing:\n%s", code, threads, want, log)
	}
	t.Logf("all five: threads by capability sets %v", threads)

	n, exact, log := tracedRun(t, ref, dir, "filecaps", "lib", func(args ...string) *exec.Cmd {
		return asPodUser(t, bin, all, false, false, args...)
	})
	placed := regexp.MustCompile(`msg="CUDA device placed" pid=KVPATH `)
	if n != 32 || !exact || missing.MatchString(log) || !placed.MatchString(log) || strings.Contains(log, "environ: permission denied") {
		t.Errorf("file capabilities: %d records of hicache-load's 32 (exact %v), one named missing, or its environment unread:\n%s", n, exact, log)
	}
	t.Logf("file capabilities, no ambient: %d records of 32, exact %v", n, exact)

	for i, drop := range all {
		bounding := append(append([]string(nil), all[:i]...), all[i+1:]...)
		code, log, _ := run("without-"+drop, bounding, false, false)
		capName := "CAP_" + strings.ToUpper(drop)
		var named []string
		for _, m := range missing.FindAllStringSubmatch(log, -1) {
			named = append(named, m[1])
		}
		fatal := drop == "bpf" || drop == "perfmon"
		wantCode := 0
		if fatal {
			wantCode = 1
		}
		if code != wantCode || len(named) != 1 || named[0] != capName {
			t.Errorf("without %s in the bounding set: exit %d (want %d), named missing %v (want only it):\n%s", capName, code, wantCode, named, log)
		}
		t.Logf("without %s: exit %d, named %v", capName, code, named)
	}

	code, log, threads = run("nnp", all, true, false)
	if code != 0 || threads[want] == 0 || missing.MatchString(log) {
		t.Errorf("no_new_privs, the launcher holding them: exit %d, threads %v, or one named missing:\n%s", code, threads, log)
	}
	code, log, _ = run("nnp-bare", all, true, true)
	if named := missing.FindAllStringSubmatch(log, -1); code != 1 || len(named) != 5 {
		t.Errorf("no_new_privs from a launcher without them: exit %d (want 1), named missing %v (want all five):\n%s", code, named, log)
	}
	t.Logf("no_new_privs: kept from a launcher holding them; from one without, exit %d", code)
}
