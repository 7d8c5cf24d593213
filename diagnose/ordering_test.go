package diagnose

import (
	"context"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lanewatch/lanewatch/checks"
	"github.com/lanewatch/lanewatch/internal/testenv"
	"github.com/lanewatch/lanewatch/judge"
	"github.com/lanewatch/lanewatch/selftest"
	"github.com/lanewatch/lanewatch/selftest/refenv"
)

// `agent diagnose --sample` judges RDMA ordering per process: the prefill
// role of kv-notify-early FAILs cross-qp-notify, kv-notify-polled's and
// kv-notify-concurrent's (notices beside other requests' WRITEs) PASS.
// The window closes when the scenario has exited (the probes' ring is
// drained then), and the roles post only once the agent probed both
// providers (--settle-file), so no load on the machine changes a verdict.
func TestDiagnoseSampleRDMAOrdering(t *testing.T) {
	testenv.RequireRoot(t)
	ref := testenv.RefDir(t)
	for _, c := range []struct {
		scenario string
		status   checks.Status
		notices  string // the check's count of notifications
	}{
		{"kv-notify-early", checks.Fail, "1 notifications"},
		{"kv-notify-polled", checks.Pass, "1 notifications"},
		{"kv-notify-concurrent", checks.Pass, "8 notifications"},
	} {
		t.Run(c.scenario, func(t *testing.T) {
			dir := t.TempDir()
			settled := filepath.Join(dir, "settled")
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var mu sync.Mutex
			var launcher int
			resolved := map[uint32]bool{}
			ran := make(chan error, 1)
			cfg := Config{
				Sample: 2 * time.Minute, // an upper bound: the window closes when the scenario exits
				Libs: []string{filepath.Join(ref, "rdma", "libibverbs.so.1"), filepath.Join(ref, "plain", "libcudart.so.12"),
					filepath.Join(ref, "lib", "libcuda.so.1")},
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
				OnSampleStart: func() {
					cmd := exec.Command(filepath.Join(ref, "bin", "rdmapath"), "--scenario", c.scenario, "--truth-dir", dir,
						"--pages", "8", "--settle-file", settled)
					cmd.Env = append(os.Environ(), refenv.RDMAWire("diag"+strconv.Itoa(os.Getpid())))
					cmd.Stderr = os.Stderr
					if err := cmd.Start(); err != nil {
						ran <- err
						cancel()
						return
					}
					mu.Lock()
					launcher = cmd.Process.Pid
					mu.Unlock()
					go func() { ran <- cmd.Wait(); cancel() }()
				},
				OnProvider: func(pid uint32) {
					mu.Lock()
					defer mu.Unlock()
					if launcher != 0 && parentOf(pid) == launcher {
						resolved[pid] = true
					}
					if len(resolved) == 2 {
						os.WriteFile(settled, nil, 0o644)
					}
				},
			}
			r, err := Run(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if err := <-ran; err != nil {
				t.Fatalf("%s: %v", c.scenario, err)
			}
			truth, err := selftest.ReadTruthFile(filepath.Join(dir, c.scenario+"-prefill.jsonl"))
			if err != nil {
				t.Fatal(err)
			}
			pid := strconv.Itoa(int(truth[0].PID))
			var got *checks.Check
			for i, ch := range r.Checks {
				if (ch.Scope == "pid "+pid || strings.HasPrefix(ch.Scope, "pid "+pid+" ")) && ch.Name == judge.CheckOrdering {
					got = &r.Checks[i]
				}
			}
			if got == nil || got.Status != c.status || !strings.Contains(got.Detail, c.notices) ||
				(c.status == checks.Fail) != (len(got.Findings) == 1 && got.Findings[0].Rule == "cross-qp-notify") {
				t.Fatalf("prefill pid %s: %+v\n%s", pid, got, reportText(r))
			}
		})
	}
}

// parentOf is a process's parent pid from /proc, 0 when unreadable.
func parentOf(pid uint32) int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(int(pid)) + "/stat")
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}
