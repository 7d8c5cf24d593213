package agent_test

import (
	"bufio"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/lanewatch/lanewatch/agent"
	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/internal/testenv"
)

// realCall is one line internal/testenv/testdata/realcuda.c prints per call it made.
type realCall struct {
	API    string `json:"api"`
	Result uint32 `json:"result"`
	Bytes  uint64 `json:"bytes"`
	TID    uint32 `json:"tid"`
}

// NVIDIA's real runtimes and drivers on this host, which has no GPU: every
// call fails, and the agent reports each one with its error and moves no
// bytes. The driver is probed at the implementations its exported dispatch
// thunks jump to, never single-stepped; when the runtime's cuInit fails the
// runtime layer is attached for that process, because the runtime then
// answers every call itself without reaching the driver.
func TestRealCUDAWithoutAGPU(t *testing.T) {
	testenv.RequireRoot(t)
	if _, err := os.Stat("/proc/driver/nvidia"); err == nil {
		t.Fatal("this host has the NVIDIA driver: the calls would not fail")
	}
	prog := testenv.RealCUDA(t)
	for _, stack := range []struct{ name, runtime, runtimeKey, driverKey string }{
		{"cuda-11.8-driver-535", "libcudart.so.11.0", "BOOKWORM_CUDART", "BOOKWORM_CUDA"},
		{"cuda-12.4-driver-550", "libcudart.so.12", "TRIXIE_CUDART", "TRIXIE_CUDA"},
	} {
		t.Run(stack.name, func(t *testing.T) {
			driverDir := testenv.NVIDIA(t, stack.driverKey)
			driver := filepath.Join(driverDir, "libcuda.so.1")
			runtime := filepath.Join(testenv.NVIDIA(t, stack.runtimeKey), stack.runtime)
			restore := testenv.GuardNvidiactl(t) // cuInit makes /dev/nvidiactl as root
			r := startAgent(t, agent.Config{Libs: []string{driver}})
			checkDriverSites(t, r.logs.String(), driver)

			// Through the runtime: cudaGetDeviceCount's cuInit fails, the
			// runtime layer is attached, then every runtime call fails in
			// the runtime.
			cmd := exec.Command(prog, "runtime", runtime)
			cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+driverDir)
			stdin, _ := cmd.StdinPipe()
			stdout, _ := cmd.StdoutPipe()
			cmd.Stderr = os.Stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			out := bufio.NewReader(stdout)
			want := readCalls(t, out, "ready")
			select {
			case n := <-r.col.RuntimeLayerChan(uint32(cmd.Process.Pid)):
				if n == 0 {
					t.Fatalf("no runtime probe attached to %s", runtime)
				}
				t.Logf("runtime layer: %d probes on %s", n, runtime)
			case <-time.After(20 * time.Second):
				cmd.Process.Kill()
				t.Fatalf("the agent did not attach the runtime layer after cuInit failed:\n%s", r.logs.String())
			}
			io.WriteString(stdin, "go\n")
			want = append(want, readCalls(t, out, "")...)
			if err := cmd.Wait(); err != nil {
				t.Fatal(err)
			}
			waitExit(t, r.col, cmd.Process.Pid)
			compareFailedCalls(t, want, r.col.Take(uint32(cmd.Process.Pid)))

			// The driver called directly: cuInit fails with 100 and every
			// later call with 3 (not initialised).
			cmd = exec.Command(prog, "driver", driver)
			cmd.Stderr = os.Stderr
			stdout, _ = cmd.StdoutPipe()
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			want = readCalls(t, bufio.NewReader(stdout), "")
			if err := cmd.Wait(); err != nil {
				t.Fatal(err)
			}
			waitExit(t, r.col, cmd.Process.Pid)
			compareFailedCalls(t, want, r.col.Take(uint32(cmd.Process.Pid)))
			restore()
		})
	}
}

// checkDriverSites: the agent's attach line for the driver names no
// single-stepped site, and every probe went through a thunk.
func checkDriverSites(t *testing.T, logs, driver string) {
	t.Helper()
	m := regexp.MustCompile(`msg=attached path=` + regexp.QuoteMeta(driver) + ` probes=(\d+) sites="([^"]*)"`).FindStringSubmatch(logs)
	if m == nil {
		t.Fatalf("no attach line for %s:\n%s", driver, logs)
	}
	t.Logf("%s: %s probes, sites %s", filepath.Base(driver), m[1], m[2])
	if strings.Contains(m[2], "single-step") || !strings.Contains(m[2], "through-thunk="+m[1]) {
		t.Errorf("driver sites %q: want all %s through thunks, none single-stepped", m[2], m[1])
	}
}

// readCalls reads realcuda's JSON lines until stop (or EOF when stop is "").
func readCalls(t *testing.T, r *bufio.Reader, stop string) []realCall {
	t.Helper()
	var calls []realCall
	for {
		line, err := r.ReadString('\n')
		if err == io.EOF && stop == "" {
			return calls
		}
		if err != nil {
			t.Fatalf("realcuda output: %v", err)
		}
		line = strings.TrimSpace(line)
		if line == stop {
			return calls
		}
		var c realCall
		if err := json.Unmarshal([]byte(line), &c); err != nil {
			t.Fatalf("realcuda line %q: %v", line, err)
		}
		calls = append(calls, c)
	}
}

// compareFailedCalls: one record per call, in order, with the call's error,
// and no transfer.
func compareFailedCalls(t *testing.T, want []realCall, got []correlate.Transfer) {
	t.Helper()
	for i, g := range got {
		if i >= len(want) {
			t.Errorf("record %d not called: %s %+v", i, g.API, g.Error)
			continue
		}
		w := want[i]
		if w.API == "cudaGetDeviceCount" {
			w.API = "cuInit" // the runtime's lazy cuInit is what the driver layer sees
		}
		if !g.Failed() || g.Error.Code != w.Result || g.API != w.API || g.TID != w.TID || g.Bytes != w.Bytes {
			t.Errorf("record %d: got %s tid %d %d B error %+v, want %s tid %d %d B result %d", i, g.API, g.TID, g.Bytes, g.Error, w.API, w.TID, w.Bytes, w.Result)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d records for %d calls", len(got), len(want))
	}
	for _, g := range got {
		t.Logf("  %-24s tid %d %8d B  %s (%d)", g.API, g.TID, g.Bytes, g.Error.Name, g.Error.Code)
	}
}
