package diagnose

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lanewatch/lanewatch/agent"
	"github.com/lanewatch/lanewatch/checks"
	"github.com/lanewatch/lanewatch/internal/testenv"
	"github.com/lanewatch/lanewatch/selftest/refenv"
)

// diagnose --sample reads the GPU counters through the window and judges a
// GPU's link as read under load. The reference GPU's link (the NVML
// stand-in's) idles at Gen1 x8 and trains, under the copies of
// link-trains-up, to Gen3 x8, its maximum (no finding), or only to Gen2 x8
// (link-degraded fails).
func TestDiagnoseLinkUnderLoad(t *testing.T) {
	testenv.RequireRoot(t)
	ref := testenv.RefDir(t)
	for _, tt := range []struct {
		name     string
		loaded   [2]int
		degraded bool
	}{
		{"trains up to its maximum", [2]int{3, 8}, false},
		{"stays at Gen2 under load", [2]int{2, 8}, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv(refenv.NVMLMaxLink(3, 8))
			t.Setenv(refenv.NVMLLink(tt.loaded[0], tt.loaded[1]))
			t.Setenv(refenv.NVMLIdleLink(1, 8))
			t.Setenv(refenv.NVMLIdleMS(300))
			gpu := fmt.Sprintf("gotest-diaglink-%d", os.Getpid())
			// Held before diagnose starts, so its GPU exists when NVML is
			// initialised; released when the window opens.
			cmd := exec.Command(filepath.Join(ref, "bin", "kvpath"), "--scenario", "link-trains-up", "--hold",
				"--truth", filepath.Join(t.TempDir(), "truth.jsonl"))
			cmd.Env = append(os.Environ(), refenv.SharedGPU(gpu))
			cmd.Stderr = os.Stderr
			stdin, _ := cmd.StdinPipe()
			stdout, _ := cmd.StdoutPipe()
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait(); os.Remove(refenv.LaneFile(gpu)) })
			if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || !strings.HasPrefix(line, "ready") {
				t.Fatalf("no ready line: %q %v", line, err)
			}
			go io.Copy(io.Discard, stdout)
			r, err := Run(context.Background(), Config{
				PIDs: []int{cmd.Process.Pid}, Sample: 3 * time.Second,
				Libs:   []string{filepath.Join(ref, "plain", "libcudart.so.12"), filepath.Join(ref, "lib", "libcuda.so.1")},
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
				GPU:    agent.GPUConfig{Source: "nvml", NVMLLibrary: filepath.Join(ref, "nvml", "libnvidia-ml.so.1")},
				OnSampleStart: func() {
					io.WriteString(stdin, "go\n")
					stdin.Close()
				},
			})
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Wait(); err != nil {
				t.Fatalf("link-trains-up: %v", err)
			}
			c := findCheck(r, "host", "PCIe links")
			if c == nil {
				t.Fatalf("no PCIe links check:\n%s", reportText(r))
			}
			want := fmt.Sprintf("(nvml only) trains to Gen3 x8, Gen%d x%d under load", tt.loaded[0], tt.loaded[1])
			if !strings.Contains(c.Detail, want) {
				t.Fatalf("PCIe links %q, want %q", c.Detail, want)
			}
			var degraded []string
			for _, f := range c.Findings {
				if f.Rule == "link-degraded" && strings.HasSuffix(f.Subject, gpuBus(c.Detail)) {
					degraded = append(degraded, f.Summary)
				}
			}
			if (len(degraded) == 1) != tt.degraded || len(degraded) > 1 {
				t.Fatalf("link-degraded %q, want %v\n%s", degraded, tt.degraded, reportText(r))
			}
			if tt.degraded && (c.Status != checks.Fail || !strings.Contains(degraded[0], "link runs at 5.0 GT/s of 8.0 while carrying")) {
				t.Errorf("%s: %q", c.Status, degraded)
			}
		})
	}
}

// gpuBus is the bus id of the GPU only the counters show, from the check's
// detail ("gpu BUS (nvml only) …").
func gpuBus(detail string) string {
	i := strings.Index(detail, " (nvml only)")
	j := strings.LastIndex(detail[:max(i, 0)], "gpu ")
	if i < 0 || j < 0 {
		return "?"
	}
	return detail[j+len("gpu ") : i]
}
