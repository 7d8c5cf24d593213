//go:build cgo

package collectors

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/lanewatch/lanewatch/internal/testenv"
	"github.com/lanewatch/lanewatch/selftest/refenv"
)

func TestOpenNVMLMissingLibrary(t *testing.T) {
	c, err := OpenNVML("/nonexistent/libnvidia-ml.so.1")
	if err == nil {
		c.Close()
		t.Fatal("OpenNVML of a missing library succeeded")
	}
	if !errors.Is(err, ErrNoGPUCounters) {
		t.Errorf("error %q does not wrap ErrNoGPUCounters", err)
	}
	if msg := err.Error(); !strings.Contains(msg, "/nonexistent/libnvidia-ml.so.1 cannot be loaded") ||
		strings.Count(msg, "\n") != 0 {
		t.Errorf("message %q: want one sentence naming the library", msg)
	}
}

// A library that loads but is no NVML (here libm) is refused before go-nvml
// calls into it, which would kill the process ("symbol lookup error"), and
// never serves the process's NVML bindings.
func TestOpenNVMLNotNVML(t *testing.T) {
	c, err := OpenNVML("libm.so.6")
	if err == nil {
		c.Close()
		t.Fatal("OpenNVML of libm succeeded")
	}
	if !errors.Is(err, ErrNoGPUCounters) {
		t.Errorf("error %q does not wrap ErrNoGPUCounters", err)
	}
	want := fmt.Sprintf("library libm.so.6 is not a usable NVML: it lacks nvmlInit_v2, nvmlErrorString, nvmlShutdown and %d more", len(nvmlSymbols)-3)
	if msg := err.Error(); !strings.Contains(msg, want) || strings.Contains(msg, "\n") {
		t.Errorf("message %q: want one line with %q", msg, want)
	}
}

// kernelCopyEnd is the end line of the kernel-copy scenario's truth.
type kernelCopyEnd struct {
	GPU       string `json:"gpu"`
	LaneBytes struct {
		H2D uint64 `json:"h2d"`
		D2H uint64 `json:"d2h"`
	} `json:"lane_bytes"`
	KernelBytes struct {
		H2D uint64 `json:"h2d"`
		D2H uint64 `json:"d2h"`
	} `json:"kernel_bytes"`
}

func readKernelCopyEnd(t *testing.T, path string) kernelCopyEnd {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := bytes.Split(bytes.TrimSpace(b), []byte("\n"))
	var end kernelCopyEnd
	if err := json.Unmarshal(lines[len(lines)-1], &end); err != nil {
		t.Fatalf("%s: end line: %v", path, err)
	}
	return end
}

func findGPU(t *testing.T, s GPUSnapshot, name string) GPUReading {
	t.Helper()
	for _, g := range s.GPUs {
		if g.Name == name {
			return g
		}
	}
	t.Fatalf("no GPU %q in %+v", name, s.GPUs)
	return GPUReading{}
}

func within2pct(got, want uint64) bool {
	return want > 0 && math.Abs(float64(got)-float64(want)) <= 0.02*float64(want)
}

// The NVML collector's real code path (go-nvml, dlopen at run time) against
// the reference NVML stand-in, around one run of the kernel-copy scenario:
// the GPU's counters grow by the bytes the scenario moved on its lanes, RX
// (host to device) by the inbound bytes and TX by the outbound ones.
func TestNVMLStandInKernelCopy(t *testing.T) {
	ref := testenv.RefDir(t)
	lib := filepath.Join(ref, "nvml", "libnvidia-ml.so.1")
	if _, err := os.Stat(lib); err != nil {
		t.Fatalf("NVML stand-in not built (make -C refpath): %v", err)
	}
	gpu := fmt.Sprintf("gotest-nvml-%d", os.Getpid())
	truth := filepath.Join(t.TempDir(), "kernel-copy.jsonl")

	held := holdKernelCopy(t, ref, gpu, truth)

	// The GPU file exists now: NVML sees it from Init on.
	c, err := OpenNVML(lib)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Source() != "nvml" {
		t.Errorf("source %q", c.Source())
	}
	before, err := c.Sample()
	if err != nil {
		t.Fatal(err)
	}
	g0 := findGPU(t, before, refenv.NVMLName(gpu))
	if !g0.HasPCIeBytes || g0.HasPCIeRate {
		t.Fatalf("stand-in GPU has no PCIe byte counters: %+v", g0)
	}
	if !regexp.MustCompile(`^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`).MatchString(g0.UUID) {
		t.Errorf("UUID %q", g0.UUID)
	}
	if !regexp.MustCompile(`^f[0-9a-f]{3}:[0-9a-f]{2}:00\.0$`).MatchString(g0.BusID) { // NVML's "0000F123:45:00.0" in sysfs form
		t.Errorf("bus id %q", g0.BusID)
	}
	if g0.HasNVLink { // the stand-in answers NOT_SUPPORTED for fields 138/139, as a GPU without NVLink
		t.Errorf("stand-in GPU without NVLink has NVLink counters: %+v", g0)
	}
	if g0.LinkGen != 5 || g0.MaxLinkGen != 5 || g0.LinkWidth != 16 || g0.MaxLinkWidth != 16 || !g0.HasReplay {
		t.Errorf("link: %+v, want gen 5 ×16 and a replay counter", g0)
	}

	held.finish(t)
	after, err := c.Sample()
	if err != nil {
		t.Fatal(err)
	}
	g1 := findGPU(t, after, refenv.NVMLName(gpu))
	if g1.UUID != g0.UUID || g1.BusID != g0.BusID {
		t.Errorf("identity changed: %s %s → %s %s", g0.UUID, g0.BusID, g1.UUID, g1.BusID)
	}
	end := readKernelCopyEnd(t, truth)
	rx, tx := g1.PCIeRxBytes-g0.PCIeRxBytes, g1.PCIeTxBytes-g0.PCIeTxBytes
	t.Logf("counters: RX +%d TX +%d; lanes H2D %d D2H %d (kernel copies %d / %d)",
		rx, tx, end.LaneBytes.H2D, end.LaneBytes.D2H, end.KernelBytes.H2D, end.KernelBytes.D2H)
	if end.GPU != gpu || end.KernelBytes.H2D != 64<<20 || end.KernelBytes.D2H != 32<<20 {
		t.Errorf("truth end line: %+v", end)
	}
	if !within2pct(rx, end.LaneBytes.H2D) || !within2pct(tx, end.LaneBytes.D2H) {
		t.Errorf("counters grew RX %d TX %d, the lanes moved H2D %d D2H %d: not within 2%%",
			rx, tx, end.LaneBytes.H2D, end.LaneBytes.D2H)
	}
	rates, gone := GPURates(before, after)
	if gone != nil {
		t.Errorf("gone: %v", gone)
	}
	for _, r := range rates {
		if r.UUID == g0.UUID && (r.RxBps <= 0 || r.TxBps <= 0 || r.RxBps < r.TxBps) {
			t.Errorf("rates %+v: want RX > TX > 0", r)
		}
	}
	if err := c.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
	if _, err := c.Sample(); err == nil {
		t.Error("Sample after Close succeeded")
	}

	// Without the PCIe byte fields (pre-Hopper), the collector falls back to
	// nvmlDeviceGetPcieThroughput: a rate only. NVML is initialised afresh,
	// so the stand-in reads the variable again.
	t.Setenv(refenv.NVMLNoPCIeFields())
	t.Setenv(refenv.NVMLLink(4, 8))
	// NVLink totals as a 276.07 GB/s peer copy (nvbandwidth's, see
	// TestNVLinkBytes) leaves them after one second: read through go-nvml's
	// C call with scopeId UINT_MAX, KiB to bytes.
	t.Setenv(refenv.NVMLNVLinkKiB(269599609, 1))
	c2, err := OpenNVML(lib)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	s, err := c2.Sample()
	if err != nil {
		t.Fatal(err)
	}
	g2 := findGPU(t, s, refenv.NVMLName(gpu))
	if g2.HasPCIeBytes || !g2.HasPCIeRate || g2.PCIeRxBps != 0 || g2.PCIeTxBps != 0 {
		t.Errorf("fallback reading %+v: want an idle rate-only reading", g2)
	}
	if !g2.HasNVLink || g2.NVLinkTxBytes != 269599609*1024 || g2.NVLinkRxBytes != 1024 {
		t.Errorf("NVLink totals %+v: want TX 269599609 KiB, RX 1 KiB in bytes", g2)
	}
	if g2.LinkGen != 4 || g2.LinkWidth != 8 || g2.MaxLinkGen != 5 || g2.MaxLinkWidth != 16 {
		t.Errorf("degraded link %+v: want gen 4 ×8 of 5 ×16", g2)
	}
}

// heldKernelCopy is the reference kernel-copy scenario held before its
// copies on a shared reference GPU, which the NVML stand-in then shows.
type heldKernelCopy struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stderr bytes.Buffer
}

// holdKernelCopy starts it and waits for its hold point; the test's cleanup
// kills it and removes the GPU's lane file.
func holdKernelCopy(t *testing.T, ref, gpu, truth string) *heldKernelCopy {
	t.Helper()
	h := &heldKernelCopy{cmd: exec.Command(filepath.Join(ref, "bin", "kvpath"), "--scenario", "kernel-copy", "--hold", "--truth", truth)}
	h.cmd.Env = append(os.Environ(), refenv.SharedGPU(gpu))
	h.cmd.Stderr = &h.stderr
	var err error
	if h.stdin, err = h.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := h.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := h.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		h.cmd.Process.Kill()
		h.cmd.Wait()
		os.Remove(refenv.LaneFile(gpu))
	})
	if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || !strings.HasPrefix(line, "ready") {
		t.Fatalf("kvpath did not reach its hold point: %q %v; stderr: %s", line, err, h.stderr.String())
	}
	return h
}

// finish lets the scenario make its copies and waits for it to exit.
func (h *heldKernelCopy) finish(t *testing.T) {
	t.Helper()
	if _, err := io.WriteString(h.stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
	h.stdin.Close()
	if err := h.cmd.Wait(); err != nil {
		t.Fatalf("kernel-copy: %v; stderr: %s", err, h.stderr.String())
	}
}

// nvField is one nvmlFieldValue_t answer: an unsigned value of NVML's type
// typ, or a per-field error ret.
func nvField(id uint32, ret nvml.Return, typ nvml.ValueType, v uint64) nvml.FieldValue {
	f := nvml.FieldValue{FieldId: id, ScopeId: nvlinkAllLinks, NvmlReturn: uint32(ret), ValueType: uint32(typ)}
	binary.LittleEndian.PutUint64(f.Value[:], v)
	return f
}

// NVLink throughput fields 138/139 are KiB totals over all links. The
// figures: one second of nvbandwidth's device_to_device_memcpy_write_ce on
// an 8-GPU NVLink system, 276.07 GB/s (shared/samples/bandwidth/
// nvidia_nvbandwidth_README_example_8gpu_H2D_26GBps.txt), is 269599609 KiB.
func TestNVLinkBytes(t *testing.T) {
	const tx, rx = nvml.FI_DEV_NVLINK_THROUGHPUT_DATA_TX, nvml.FI_DEV_NVLINK_THROUGHPUT_DATA_RX
	ull, ui := nvml.VALUE_TYPE_UNSIGNED_LONG_LONG, nvml.VALUE_TYPE_UNSIGNED_INT
	for _, c := range []struct {
		name           string
		fv             []nvml.FieldValue
		wantTx, wantRx uint64
		ok             bool
	}{
		{"both", []nvml.FieldValue{nvField(tx, nvml.SUCCESS, ull, 269599609), nvField(rx, nvml.SUCCESS, ull, 1)}, 269599609 * 1024, 1024, true},
		{"unsigned int", []nvml.FieldValue{nvField(tx, nvml.SUCCESS, ui, 1<<32|7), nvField(rx, nvml.SUCCESS, ui, 0)}, 7 * 1024, 0, true},
		{"no NVLink", []nvml.FieldValue{nvField(tx, nvml.ERROR_NOT_SUPPORTED, 0, 0), nvField(rx, nvml.ERROR_NOT_SUPPORTED, 0, 0)}, 0, 0, false},
		{"one direction", []nvml.FieldValue{nvField(tx, nvml.SUCCESS, ull, 5), nvField(rx, nvml.ERROR_NOT_SUPPORTED, 0, 0)}, 0, 0, false},
		{"signed type", []nvml.FieldValue{nvField(tx, nvml.SUCCESS, nvml.VALUE_TYPE_SIGNED_LONG_LONG, 5), nvField(rx, nvml.SUCCESS, ull, 5)}, 0, 0, false},
		{"short", []nvml.FieldValue{nvField(tx, nvml.SUCCESS, ull, 5)}, 0, 0, false},
	} {
		gotTx, gotRx, ok := nvlinkBytes(c.fv)
		if gotTx != c.wantTx || gotRx != c.wantRx || ok != c.ok {
			t.Errorf("%s: got %d, %d, %v; want %d, %d, %v", c.name, gotTx, gotRx, ok, c.wantTx, c.wantRx, c.ok)
		}
	}
	f := nvlinkFields()
	if len(f) != 2 || f[0].FieldId != 138 || f[1].FieldId != 139 || f[0].ScopeId != math.MaxUint32 || f[1].ScopeId != math.MaxUint32 {
		t.Errorf("fields asked: %+v; want 138 and 139 over all links (scopeId UINT_MAX)", f)
	}
}
