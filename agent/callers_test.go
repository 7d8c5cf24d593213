package agent

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lanewatch/lanewatch/internal/testenv"
	"github.com/lanewatch/lanewatch/probes"
)

// The fallback for calls the probe could not classify reads the real maps
// of a real process: a held reference scenario, whose runtime and driver
// are mapped.
func TestCallerRangesOnARealProcess(t *testing.T) {
	ref := testenv.RefDir(t)
	cmd := exec.Command(filepath.Join(ref, "bin", "kvpath"), "--scenario", "hicache-load", "--hold", "--truth", filepath.Join(t.TempDir(), "t.jsonl"))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { stdin.Close(); cmd.Process.Kill(); cmd.Wait() }()
	if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || !strings.HasPrefix(line, "ready") {
		t.Fatalf("kvpath not held: %q %v", line, err)
	}
	pid := cmd.Process.Pid
	maps, err := probes.ReadMaps("/proc", pid)
	if err != nil {
		t.Fatal(err)
	}
	var runtime, driver uint64
	for _, m := range maps {
		if !m.Executable() {
			continue
		}
		switch filepath.Base(m.Path) {
		case "libcudart.so.12":
			runtime = m.Start + (m.End-m.Start)/2
		case "libcuda.so.1":
			driver = m.Start + 16
		}
	}
	if runtime == 0 || driver == 0 {
		t.Fatalf("no runtime or driver code mapped in pid %d: %+v", pid, maps)
	}
	c := newCallerRanges("/proc")
	for _, tc := range []struct {
		name string
		addr uint64
		want bool
	}{{"runtime code", runtime, true}, {"driver code", driver, false}, {"nothing mapped", 0x10, false}} {
		got, err := c.viaRuntime(uint32(pid), tc.addr)
		if err != nil || got != tc.want {
			t.Errorf("%s %#x: %v %v, want %v", tc.name, tc.addr, got, err, tc.want)
		}
	}
	c.forget(uint32(pid))
	if len(c.byPID) != 0 {
		t.Errorf("ranges kept after forget: %v", c.byPID)
	}
	if _, err := c.viaRuntime(1<<30, runtime); err == nil {
		t.Error("a process that does not exist gave no error")
	}
}
