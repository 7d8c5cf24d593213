//go:build cgo

package agent_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lanewatch/lanewatch/agent"
	"github.com/lanewatch/lanewatch/collectors"
	"github.com/lanewatch/lanewatch/internal/testenv"
)

const (
	gpuChildEnv    = "LW_AGENT_NVML_CHILD" // the NVML library the child process opens
	gpuChildPrefix = "agent-nvml-child: "
)

type gpuChildResult struct {
	Source string `json:"source"`
	Error  string `json:"error"`
	NoGPU  bool   `json:"no_gpu"`
}

// TestOpenGPUChildProcess is no test of its own: it is the child process of
// TestOpenGPUNVMLNoDriver. One process can open one NVML library only (its C
// symbols bind process-wide), so each library gets a process of its own.
func TestOpenGPUChildProcess(t *testing.T) {
	lib := os.Getenv(gpuChildEnv)
	if lib == "" {
		return
	}
	var out []gpuChildResult
	for _, src := range []string{"nvml", "auto"} {
		r := gpuChildResult{Source: src}
		c, err := agent.OpenGPU(agent.GPUConfig{Source: src, NVMLLibrary: lib})
		if err == nil {
			c.Close()
		} else {
			r.Error, r.NoGPU = err.Error(), agent.IsNoGPU(err)
		}
		out = append(out, r)
	}
	b, err := json.Marshal(out)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("%s%s\n", gpuChildPrefix, b)
}

// On a host without an NVIDIA driver, `--gpu-counters nvml` (and auto) with
// NVIDIA's real libnvidia-ml 535 or 550 gives one line that says why once:
// the library's path and NVML's "Driver Not Loaded", with the "no GPU
// counters" sentinel once, and the agent carries on (IsNoGPU).
func TestOpenGPUNVMLNoDriver(t *testing.T) {
	if _, err := os.Stat("/proc/driver/nvidia"); err == nil {
		t.Skip("this host has the NVIDIA driver: nvmlInit would not fail")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for ver, key := range map[string]string{"535": "BOOKWORM_NVML", "550": "TRIXIE_NVML"} {
		lib := filepath.Join(testenv.NVIDIA(t, key), "libnvidia-ml.so.1")
		t.Run(ver, func(t *testing.T) {
			testenv.GuardNvidiactl(t)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, exe, "-test.run=^TestOpenGPUChildProcess$", "-test.count=1")
			cmd.Env = append(os.Environ(), gpuChildEnv+"="+lib)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Run(); err != nil {
				t.Fatalf("the child process that opened %s failed: %v\nstderr:\n%s", lib, err, stderr.String())
			}
			var res []gpuChildResult
			for line := range strings.SplitSeq(stdout.String(), "\n") {
				if j, ok := strings.CutPrefix(line, gpuChildPrefix); ok {
					if err := json.Unmarshal([]byte(j), &res); err != nil {
						t.Fatal(err)
					}
				}
			}
			if len(res) != 2 {
				t.Fatalf("child said %q", stdout.String())
			}
			for _, r := range res {
				t.Logf("--gpu-counters %s: %s", r.Source, r.Error)
				if !r.NoGPU {
					t.Errorf("--gpu-counters %s: %q is not a no-GPU error", r.Source, r.Error)
				}
				for _, want := range []string{"Driver Not Loaded", lib, collectors.ErrNoGPUCounters.Error()} {
					if n := strings.Count(r.Error, want); n != 1 {
						t.Errorf("--gpu-counters %s: %q says %q %d times, want once", r.Source, r.Error, want, n)
					}
				}
				if strings.ContainsAny(r.Error, "\n\r") || strings.Contains(r.Error, "()") || strings.Contains(r.Error, ": :") {
					t.Errorf("--gpu-counters %s: %q is not one clean line", r.Source, r.Error)
				}
			}
		})
	}
}
