package agent_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"

	"github.com/lanewatch/lanewatch/agent"
	"github.com/lanewatch/lanewatch/internal/sysfstest"
	"github.com/lanewatch/lanewatch/internal/testenv"
)

// environOpens counts, in the kernel, this process's openat(2) calls of one
// path, "/proc/PID/environ" of the PID last watched: every read of that
// process's environment the in-process agent makes, whatever code path
// made it. A raw sys_enter tracepoint (this host's kernel has no kprobes,
// and fentry programs are refused), filtered on this tgid.
type environOpens struct {
	count, want *ebpf.Map
}

func countEnvironOpens(t *testing.T) *environOpens {
	t.Helper()
	newMap := func(spec *ebpf.MapSpec) *ebpf.Map {
		m, err := ebpf.NewMap(spec)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		return m
	}
	c := &environOpens{
		count: newMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: 1}),
		want:  newMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 32, MaxEntries: 1}),
	}
	buf := newMap(&ebpf.MapSpec{Type: ebpf.PerCPUArray, KeySize: 4, ValueSize: 32, MaxEntries: 1})
	const sysOpenat = 257                                             // x86-64
	const regsSI = 13 * 8                                             // struct pt_regs: r15 r14 r13 r12 bp bx r11 r10 r9 r8 ax cx dx si
	lookup := func(m *ebpf.Map, into asm.Register) asm.Instructions { // into = &m[0], or out
		return asm.Instructions{
			asm.StoreImm(asm.RFP, -12, 0, asm.Word),
			asm.LoadMapPtr(asm.R1, m.FD()),
			asm.Mov.Reg(asm.R2, asm.RFP),
			asm.Add.Imm(asm.R2, -12),
			asm.FnMapLookupElem.Call(),
			asm.JEq.Imm(asm.R0, 0, "out"),
			asm.Mov.Reg(into, asm.R0),
		}
	}
	insns := asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1), // u64 args[]: the task's pt_regs, the syscall number
		asm.LoadMem(asm.R7, asm.R6, 8, asm.DWord),
		asm.JNE.Imm(asm.R7, sysOpenat, "out"),
		asm.FnGetCurrentPidTgid.Call(),
		asm.RSh.Imm(asm.R0, 32),
		asm.JNE.Imm(asm.R0, int32(os.Getpid()), "out"),
		asm.LoadMem(asm.R3, asm.R6, 0, asm.DWord), // &regs->si: openat's path
		asm.Add.Imm(asm.R3, regsSI),
		asm.Mov.Reg(asm.R1, asm.RFP),
		asm.Add.Imm(asm.R1, -8),
		asm.Mov.Imm(asm.R2, 8),
		asm.FnProbeReadKernel.Call(),
		asm.JNE.Imm(asm.R0, 0, "out"),
	}
	insns = append(insns, lookup(buf, asm.R9)...)
	insns = append(insns, asm.Mov.Imm(asm.R1, 0))
	for off := int16(0); off < 32; off += 8 {
		insns = append(insns, asm.StoreMem(asm.R9, off, asm.R1, asm.DWord))
	}
	insns = append(insns,
		asm.LoadMem(asm.R3, asm.RFP, -8, asm.DWord),
		asm.Mov.Reg(asm.R1, asm.R9),
		asm.Mov.Imm(asm.R2, 32),
		asm.FnProbeReadUserStr.Call(),
	)
	insns = append(insns, lookup(c.want, asm.R8)...)
	for off := int16(0); off < 32; off += 8 { // the path, zero-padded, against the one watched
		insns = append(insns,
			asm.LoadMem(asm.R1, asm.R9, off, asm.DWord),
			asm.LoadMem(asm.R2, asm.R8, off, asm.DWord),
			asm.JNE.Reg(asm.R1, asm.R2, "out"),
		)
	}
	insns = append(insns, lookup(c.count, asm.R7)...)
	insns = append(insns,
		asm.Mov.Imm(asm.R1, 1),
		asm.StoreXAdd(asm.R7, asm.R1, asm.DWord),
		asm.Mov.Imm(asm.R0, 0).WithSymbol("out"),
		asm.Return(),
	)
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.RawTracepoint, License: "GPL", Instructions: insns})
	if err != nil {
		t.Fatalf("%+v", err)
	}
	t.Cleanup(func() { prog.Close() })
	l, err := link.AttachRawTracepoint(link.RawTracepointOptions{Name: "sys_enter", Program: prog})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	// The counter counts: this test's own reads of its environment.
	c.watch(t, os.Getpid())
	for _, p := range []string{"/proc/self/environ", fmt.Sprintf("/proc/%d/environ", os.Getpid()), fmt.Sprintf("/proc/%d/status", os.Getpid())} {
		if _, err := os.ReadFile(p); err != nil {
			t.Fatal(err)
		}
	}
	if n := c.opens(t); n != 1 {
		t.Fatalf("counted %d reads of this process's environ file, want 1", n)
	}
	return c
}

// watch counts the opens of pid's environ file from now on.
func (c *environOpens) watch(t *testing.T, pid int) {
	t.Helper()
	var path [32]byte
	copy(path[:], fmt.Sprintf("/proc/%d/environ", pid))
	if err := c.want.Put(uint32(0), path); err != nil {
		t.Fatal(err)
	}
	if err := c.count.Put(uint32(0), uint64(0)); err != nil {
		t.Fatal(err)
	}
}

// opens is the count since watch.
func (c *environOpens) opens(t *testing.T) uint64 {
	t.Helper()
	var n uint64
	if err := c.count.Lookup(uint32(0), &n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A secret in a traced process's environment (docs/design.md, "Which
// GPU"): agent run places the process on a GPU through its
// CUDA_VISIBLE_DEVICES — the device map at its context calls, the host
// checks of every round while it holds pinned memory, the evaluator for its
// transfers — and reads its /proc/PID/environ once for all of them. The
// secret appears in no log line (debug level), metric or record.
func TestRunReadsEachEnvironmentOnce(t *testing.T) {
	testenv.RequireRoot(t)
	ref := testenv.RefDir(t)
	opens := countEnvironOpens(t)
	sys := sysfstest.Build(t, sysfstest.Host{
		Nodes: []sysfstest.Node{{CPUs: "0-1", Distance: "10"}},
		Funcs: []sysfstest.Func{{BDF: "0000:17:00.0", HB: "pci0000:17", Class: "0x030200", Vendor: "0x10de", Device: "0x2330", NUMA: "0"}},
	})
	logs, records := &syncBuffer{}, &syncBuffer{}
	stop := runAgent(t, agent.RunConfig{
		Trace: agent.Config{ProcRoot: "/proc", Libs: []string{filepath.Join(ref, "plain", "libcudart.so.12"),
			filepath.Join(ref, "lib", "libcuda.so.1")}},
		Output:  records,
		SysRoot: sys,
		Logger:  slog.New(slog.NewTextHandler(io.MultiWriter(logs, testWriter{t}), &slog.HandlerOptions{Level: slog.LevelDebug})),
		Metrics: agent.MetricsConfig{Listen: "127.0.0.1:0", Path: "/metrics", EvaluateInterval: 100 * time.Millisecond,
			HostCheckInterval: time.Millisecond, GPU: agent.GPUConfig{Source: "off"}},
	})
	defer stop()
	addr := regexp.MustCompile(`msg="serving metrics" address=(\S+)`).FindStringSubmatch(logs.String())
	if addr == nil {
		t.Fatalf("no metrics address in the logs:\n%s", logs.String())
	}
	scrape := func() string {
		resp, err := http.Get("http://" + addr[1] + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	evaluations := regexp.MustCompile(`(?m)^lanewatch_evaluation_timestamp_seconds (\S+)$`)
	// waitEvaluations returns once n more windows were judged.
	waitEvaluations := func(n int) {
		t.Helper()
		seen := map[string]bool{}
		for deadline := time.Now().Add(30 * time.Second); len(seen) <= n; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%d evaluations in 30 s, want %d", len(seen)-1, n)
			}
			if m := evaluations.FindStringSubmatch(scrape()); m != nil {
				seen[m[1]] = true
			}
		}
	}

	secret := fmt.Sprintf("lw-secret-%d", time.Now().UnixNano())
	// A shell that waits for a line, then becomes kvpath: the counter
	// watches the pid before the process can be read.
	cmd := exec.Command("/bin/sh", "-c", `read _ && exec "$0" "$@"`, filepath.Join(ref, "bin", "kvpath"),
		"--scenario", "hicache-load", "--hold", "--truth", filepath.Join(t.TempDir(), "truth.jsonl"))
	cmd.Env = append(os.Environ(), "SECRET_TOKEN="+secret, "CUDA_VISIBLE_DEVICES=0")
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	opens.watch(t, cmd.Process.Pid)
	io.WriteString(stdin, "go\n")
	sc := bufio.NewScanner(out)
	if !sc.Scan() || !strings.HasPrefix(sc.Text(), "ready ") {
		t.Fatalf("kvpath did not stop at its hold point: %q", sc.Text())
	}
	// Holding its registered pool: every round's host checks look at it.
	waitEvaluations(5)
	stdin.Close() // the copies: the evaluator judges them on the process's GPU
	io.Copy(io.Discard, out)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("kvpath: %v", err)
	}
	waitEvaluations(3)
	body := scrape()
	stop()

	if n := opens.opens(t); n != 1 {
		t.Errorf("the environment of pid %d was read %d times, want once", cmd.Process.Pid, n)
	}
	if !strings.Contains(logs.String(), `msg="CUDA device placed"`) {
		t.Errorf("the process was never placed: the test did not ask for its environment")
	}
	for what, text := range map[string]string{"log": logs.String(), "metrics": body, "records": records.String()} {
		if strings.Contains(text, secret) {
			t.Errorf("the secret is in the %s", what)
		}
	}
	if !bytes.Contains([]byte(records.String()), []byte(`"pid":`)) {
		t.Errorf("no record written: the test saw nothing of the process")
	}
}
