package agent_test

import (
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lanewatch/lanewatch/agent"
	"github.com/lanewatch/lanewatch/internal/testenv"
	"github.com/lanewatch/lanewatch/selftest/refenv"
)

// agent run --trace-storage-reads on this host: storage-load's 16 reads from
// a file on this machine's disk are reported (the process is watched from
// its first call, before it is released), its disk's counters are exported
// with its placement, and the summary counts the reads.
func TestRunTracesStorageReads(t *testing.T) {
	testenv.RequireRoot(t)
	ref := testenv.RefDir(t)
	cmd := exec.Command(filepath.Join(ref, "bin", "kvpath"), "--scenario", "storage-load", "--hold",
		"--truth", filepath.Join(t.TempDir(), "truth.jsonl"))
	cmd.Env = append(os.Environ(), refenv.StorageDir(t.TempDir()))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	// Started and held before the agent: a process named with --pid is
	// watched from the agent's start, so every read after the release is
	// seen (its pool, registered before the attach, is not known as one).
	logs := &syncBuffer{}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	stop := runAgent(t, agent.RunConfig{
		Trace:             agent.Config{PIDs: []int{cmd.Process.Pid}, Libs: []string{filepath.Join(ref, "plain", "libcudart.so.12"), filepath.Join(ref, "lib", "libcuda.so.1")}},
		Output:            io.Discard,
		SysRoot:           "/sys",
		TraceStorageReads: true,
		Logger:            slog.New(slog.NewTextHandler(io.MultiWriter(logs, testWriter{t}), &slog.HandlerOptions{Level: slog.LevelDebug})),
		Metrics: agent.MetricsConfig{Listen: "127.0.0.1:0", Path: "/metrics", EvaluateInterval: 300 * time.Millisecond,
			HostCheckInterval: time.Minute, GPU: agent.GPUConfig{Source: "off"}},
	})
	defer stop()
	buf := make([]byte, 256)
	n, _ := stdout.Read(buf) // "ready PID pool 0x…": its setup calls were made
	if !strings.HasPrefix(string(buf[:n]), "ready ") {
		t.Fatalf("storage-load: %q", buf[:n])
	}
	io.WriteString(stdin, "go\n")
	stdin.Close()
	go io.Copy(io.Discard, stdout)
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	addr := regexp.MustCompile(`msg="serving metrics" address=(\S+)`).FindStringSubmatch(logs.String())
	if addr == nil {
		t.Fatalf("no metrics address in the logs:\n%s", logs.String())
	}
	resp, err := http.Get("http://" + addr[1] + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !regexp.MustCompile(`lanewatch_disk_read_bytes_total\{device="[^"]+",numa_node="[^"]+",pci="[^"]+",switch="[^"]+"\} `).Match(body) {
		t.Errorf("no disk read counter:\n%s", grepLines(string(body), "lanewatch_disk_"))
	}
	stop()
	// Its 16 preads and the read of its release line (a pipe: no block
	// device), none lost or unresolved.
	m := regexp.MustCompile(`msg="storage reads" reads=(\d+) not_block_device=(\d+) unresolved=0 dropped=0 `).FindStringSubmatch(logs.String())
	if m == nil {
		t.Fatalf("no storage reads summary with none unresolved or dropped:\n%s", grepLines(logs.String(), "storage"))
	}
	if reads, _ := strconv.Atoi(m[1]); reads < 17 || m[2] == "0" {
		t.Errorf("storage reads summary %q: want the 16 preads and the release line's read", m[0])
	}
}
