package agent_test

import (
	"bufio"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lanewatch/lanewatch/agent"
	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/internal/sysfstest"
	"github.com/lanewatch/lanewatch/internal/testenv"
)

// agent run keeps diagnose's host findings current: a process whose
// registered pool sits on node 0 while its GPU is on node 1 is reported
// remote-numa-pool while it runs.
func TestHostJudgeRemotePool(t *testing.T) {
	testenv.RequireRoot(t)
	ref := testenv.RefDir(t)
	sys := sysfstest.Build(t, sysfstest.Host{
		Nodes: []sysfstest.Node{{CPUs: "0", Distance: "10 21", Package: "0"}, {CPUs: "1", Distance: "21 10", Package: "1"}},
		Funcs: []sysfstest.Func{
			{BDF: "0000:80:01.0", HB: "pci0000:80", Class: "0x060400", Vendor: "0x1022", Device: "0x14ab", NUMA: "1"},
			{BDF: "0000:81:00.0", Parent: "0000:80:01.0", Class: "0x030200", Vendor: "0x10de", Device: "0x2335", NUMA: "1"},
		},
	})
	sysfstest.Write(t, filepath.Join(sys, "devices", "system", "node", "online"), "0-1\n")
	r := startAgent(t, agent.Config{Libs: []string{filepath.Join(ref, "plain", "libcudart.so.12"), filepath.Join(ref, "lib", "libcuda.so.1")}})

	cmd := exec.Command(filepath.Join(ref, "bin", "kvpath"), "--scenario", "hicache-load", "--hold",
		"--truth", filepath.Join(t.TempDir(), "truth.jsonl"))
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { stdin.Close(); cmd.Wait() }()
	if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || !strings.HasPrefix(line, "ready") {
		t.Fatalf("kvpath: %q %v", line, err)
	}
	go io.Copy(io.Discard, stdout)

	var found string
	// The registration reaches the engine within a drain interval; a fresh
	// judge each try, since one judges at most once a minute.
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline) && found == ""; time.Sleep(100 * time.Millisecond) {
		judge := r.agent.HostJudge("/proc", sys, nil, time.Minute, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
		for _, f := range judge() {
			if f.Rule == "remote-numa-pool" && f.Severity == correlate.SevFail && strings.Contains(f.Subject, "pid "+strconv.Itoa(cmd.Process.Pid)) {
				found = f.Summary
			}
		}
	}
	if found == "" {
		t.Fatal("no remote-numa-pool finding for the held process")
	}
	t.Log(found)
}
