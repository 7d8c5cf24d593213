package collectors

import (
	"bufio"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// smiQueryReadings reads the GPUs of `nvidia-smi -q` text: identity, the PCI
// section's link generation/width (current and max), replays and the
// Tx/Rx throughput (KB/s, a rate only: ×1024 to bytes/s as
// nvmlDeviceGetPcieThroughput's value, which is what nvidia-smi prints).
// Sections nest by indentation; keys are joined into a path such as
// "PCI/GPU Link Info/Link Width/Current".
func smiQueryReadings(t *testing.T, path string) []GPUReading {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	type level struct {
		indent int
		name   string
	}
	var (
		gpus  []GPUReading
		stack []level
		tx    bool
		rx    bool
	)
	num := func(v string) int {
		n, err := strconv.Atoi(strings.TrimSuffix(v, "x"))
		if err != nil {
			return 0 // "N/A": unknown
		}
		return n
	}
	kbps := func(v string) (float64, bool) {
		n, err := strconv.ParseFloat(strings.TrimSuffix(v, " KB/s"), 64)
		return n * 1024, err == nil && strings.HasSuffix(v, " KB/s")
	}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		text := strings.TrimLeft(line, " ")
		indent := len(line) - len(text)
		if text == "" || strings.HasPrefix(text, "==") {
			continue
		}
		if indent == 0 {
			if rest, ok := strings.CutPrefix(text, "GPU "); ok {
				if len(gpus) > 0 {
					gpus[len(gpus)-1].HasPCIeRate = tx && rx
				}
				gpus = append(gpus, GPUReading{Index: len(gpus), BusID: rest})
				tx, rx = false, false
			}
			stack = stack[:0]
			continue
		}
		for len(stack) > 0 && stack[len(stack)-1].indent >= indent {
			stack = stack[:len(stack)-1]
		}
		k, v, isKV := strings.Cut(text, ":")
		k = strings.TrimSpace(k)
		if !isKV {
			stack = append(stack, level{indent, k})
			continue
		}
		if len(gpus) == 0 {
			continue
		}
		v = strings.TrimSpace(v)
		names := make([]string, 0, len(stack)+1)
		for _, l := range stack {
			names = append(names, l.name)
		}
		key := strings.Join(append(names, k), "/")
		g := &gpus[len(gpus)-1]
		switch key {
		case "Product Name":
			g.Name = v
		case "GPU UUID":
			g.UUID = v
		case "PCI/Bus Id":
			g.BusID = v
		case "PCI/GPU Link Info/PCIe Generation/Current":
			g.LinkGen = num(v)
		case "PCI/GPU Link Info/PCIe Generation/Max":
			g.MaxLinkGen = num(v)
		case "PCI/GPU Link Info/Link Width/Current":
			g.LinkWidth = num(v)
		case "PCI/GPU Link Info/Link Width/Max":
			g.MaxLinkWidth = num(v)
		case "PCI/Replays Since Reset":
			if n, err := strconv.ParseUint(v, 10, 64); err == nil {
				g.Replay, g.HasReplay = n, true
			}
		case "PCI/Tx Throughput":
			g.PCIeTxBps, tx = kbps(v)
		case "PCI/Rx Throughput":
			g.PCIeRxBps, rx = kbps(v)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(gpus) > 0 {
		gpus[len(gpus)-1].HasPCIeRate = tx && rx
	}
	return gpus
}

// dmonRateReadings reads the GPU rows of `dcgmi dmon -e 1009,1010` ("GPU <id>
// <PCITX> <PCIRX>"). DCGM_FI_PROF_PCIE_TX_BYTES/RX_BYTES are bytes per second
// over the sample interval (DCGM's profiling fields are rates), so each row
// is a rate-only reading. "." rows (elided in the source) are skipped.
// DCGM entities have no bus id in this output: BusID is "dcgm-gpu-<id>".
func dmonRateReadings(t *testing.T, path string) []GPUReading {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []GPUReading
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) != 4 || f[0] != "GPU" {
			continue
		}
		id, err1 := strconv.Atoi(f[1])
		tx, err2 := strconv.ParseFloat(f[2], 64)
		rx, err3 := strconv.ParseFloat(f[3], 64)
		if err1 != nil || err2 != nil || err3 != nil {
			t.Fatalf("%s: bad row %q", path, line)
		}
		out = append(out, GPUReading{Index: id, BusID: fmt.Sprintf("dcgm-gpu-%d", id),
			PCIeTxBps: tx, PCIeRxBps: rx, HasPCIeRate: true})
	}
	return out
}

func TestParseSMIQuerySamples(t *testing.T) {
	h100 := smiQueryReadings(t, filepath.Join("testdata", "nvidia_smi_q", "thamada_H100SXMx8.nvidia-smi-q.txt"))
	if len(h100) != 8 {
		t.Fatalf("H100 sample: %d GPUs, want 8", len(h100))
	}
	g := h100[0]
	want := GPUReading{Index: 0, UUID: "GPU-b42dd28e-ffdd-8720-1df0-98bd8cdc05b1", BusID: "00000000:18:00.0",
		Name: "NVIDIA H100 80GB HBM3", PCIeTxBps: 567 * 1024, PCIeRxBps: 559 * 1024, HasPCIeRate: true,
		Replay: 7, HasReplay: true, LinkGen: 5, MaxLinkGen: 5, LinkWidth: 16, MaxLinkWidth: 16}
	if !reflect.DeepEqual(g, want) {
		t.Errorf("H100 GPU 0:\n got %+v\nwant %+v", g, want)
	}
	var replays []uint64
	for _, g := range h100 {
		replays = append(replays, g.Replay)
	}
	if !reflect.DeepEqual(replays, []uint64{7, 0, 0, 0, 0, 4, 15, 0}) {
		t.Errorf("H100 replays %v", replays)
	}

	l4 := smiQueryReadings(t, filepath.Join("testdata", "nvidia_smi_q", "thamada_L4.nvidia-smi-q.txt"))
	if len(l4) != 1 || l4[0].LinkGen != 1 || l4[0].MaxLinkGen != 4 || l4[0].LinkWidth != 8 || l4[0].MaxLinkWidth != 16 {
		t.Errorf("L4: %+v, want gen 1 of 4, width 8 of 16", l4)
	}
	rtx := smiQueryReadings(t, filepath.Join("testdata", "nvidia_smi_q", "thamada_RTX4060Ti.nvidia-smi-q.txt"))
	if len(rtx) != 2 || rtx[0].LinkWidth != 4 || rtx[0].MaxLinkWidth != 8 || rtx[1].LinkWidth != 8 {
		t.Errorf("RTX 4060 Ti: %+v, want GPU 0 4x of 8x, GPU 1 8x", rtx)
	}
	a40 := smiQueryReadings(t, filepath.Join("testdata", "nvidia_smi_q", "thamada_A40x10.nvidia-smi-q.txt"))
	if len(a40) != 10 {
		t.Fatalf("A40 sample: %d GPUs, want 10", len(a40))
	}
	for _, g := range a40 {
		if g.UUID == "" || g.LinkGen != 1 || g.MaxLinkGen != 4 || !g.HasPCIeRate {
			t.Errorf("A40 %s: %+v", g.BusID, g)
		}
	}
}

func nearRate(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(1, math.Abs(b)) }

func gpuRateOf(t *testing.T, rs []GPURate, key string) GPURate {
	t.Helper()
	for _, r := range rs {
		if r.UUID == key || (r.UUID == "" && r.BusID == key) {
			return r
		}
	}
	t.Fatalf("no rate for %s in %+v", key, rs)
	return GPURate{}
}

func TestGPURates(t *testing.T) {
	t0 := time.Unix(1700000000, 0)
	byBytes := func(uuid, bus string, tx, rx uint64) GPUReading {
		return GPUReading{UUID: uuid, BusID: bus, PCIeTxBytes: tx, PCIeRxBytes: rx, HasPCIeBytes: true}
	}
	type check struct {
		key              string
		tx, rx           float64
		nvTx, nvRx, repl float64
		resets           []string
	}
	tests := []struct {
		name     string
		prev     GPUSnapshot
		cur      GPUSnapshot
		want     []check
		wantGone []string
	}{
		{
			name: "normal",
			prev: GPUSnapshot{Time: t0, GPUs: []GPUReading{
				{UUID: "GPU-a", BusID: "00000000:18:00.0", PCIeTxBytes: 1000, PCIeRxBytes: 5000, HasPCIeBytes: true,
					NVLinkTxBytes: 10, NVLinkRxBytes: 20, HasNVLink: true, Replay: 7, HasReplay: true}}},
			cur: GPUSnapshot{Time: t0.Add(2 * time.Second), GPUs: []GPUReading{
				{UUID: "GPU-a", BusID: "00000000:18:00.0", PCIeTxBytes: 3000, PCIeRxBytes: 25000, HasPCIeBytes: true,
					NVLinkTxBytes: 410, NVLinkRxBytes: 820, HasNVLink: true, Replay: 9, HasReplay: true}}},
			want: []check{{key: "GPU-a", tx: 1000, rx: 10000, nvTx: 200, nvRx: 400, repl: 1}},
		},
		{
			// A 64-bit counter that wraps past 2^64 cannot be told from a
			// reset (NVML says the PCIe byte fields "can be wrapped"): no rate.
			name: "wrap of a 64-bit counter",
			prev: GPUSnapshot{Time: t0, GPUs: []GPUReading{byBytes("GPU-a", "b", math.MaxUint64-100, 50)}},
			cur:  GPUSnapshot{Time: t0.Add(time.Second), GPUs: []GPUReading{byBytes("GPU-a", "b", 400, 1074)}},
			want: []check{{key: "GPU-a", rx: 1024, resets: []string{"pcie_tx_bytes"}}},
		},
		{
			name: "reset (driver reload): every counter back near zero",
			prev: GPUSnapshot{Time: t0, GPUs: []GPUReading{
				{UUID: "GPU-a", PCIeTxBytes: 1 << 40, PCIeRxBytes: 1 << 41, HasPCIeBytes: true, Replay: 15, HasReplay: true}}},
			cur: GPUSnapshot{Time: t0.Add(time.Second), GPUs: []GPUReading{
				{UUID: "GPU-a", PCIeTxBytes: 10, PCIeRxBytes: 20, HasPCIeBytes: true, Replay: 0, HasReplay: true}}},
			want: []check{{key: "GPU-a", resets: []string{"pcie_rx_bytes", "pcie_tx_bytes", "replay"}}},
		},
		{
			name: "missing fields give no rate",
			prev: GPUSnapshot{Time: t0, GPUs: []GPUReading{
				{UUID: "GPU-a", PCIeTxBytes: 100, HasPCIeBytes: false, NVLinkTxBytes: 5, HasNVLink: true},
				{UUID: "GPU-b", Replay: 3, HasReplay: true}}},
			cur: GPUSnapshot{Time: t0.Add(time.Second), GPUs: []GPUReading{
				byBytes("GPU-a", "", 900, 900),
				{UUID: "GPU-b", Replay: 4, HasReplay: false, NVLinkTxBytes: 100, HasNVLink: true}}},
			want: []check{{key: "GPU-a"}, {key: "GPU-b"}},
		},
		{
			name: "a GPU disappears, one appears, pairing by bus id without UUID",
			prev: GPUSnapshot{Time: t0, GPUs: []GPUReading{
				byBytes("", "00000000:18:00.0", 0, 0), byBytes("GPU-gone", "00000000:2A:00.0", 0, 0)}},
			cur: GPUSnapshot{Time: t0.Add(time.Second), GPUs: []GPUReading{
				byBytes("", "00000000:18:00.0", 2048, 4096), byBytes("GPU-new", "00000000:3A:00.0", 1, 1)}},
			want:     []check{{key: "00000000:18:00.0", tx: 2048, rx: 4096}},
			wantGone: []string{"GPU-gone"},
		},
		{
			name: "rate-only readings pass through",
			prev: GPUSnapshot{Time: t0, GPUs: []GPUReading{{UUID: "GPU-a", PCIeTxBps: 1, PCIeRxBps: 2, HasPCIeRate: true}}},
			cur: GPUSnapshot{Time: t0.Add(time.Second), GPUs: []GPUReading{
				{UUID: "GPU-a", PCIeTxBps: 567 * 1024, PCIeRxBps: 559 * 1024, HasPCIeRate: true}}},
			want: []check{{key: "GPU-a", tx: 567 * 1024, rx: 559 * 1024}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rs, gone := GPURates(tc.prev, tc.cur)
			if len(rs) != len(tc.want) {
				t.Fatalf("%d rates, want %d: %+v", len(rs), len(tc.want), rs)
			}
			for _, w := range tc.want {
				r := gpuRateOf(t, rs, w.key)
				if !nearRate(r.TxBps, w.tx) || !nearRate(r.RxBps, w.rx) || !nearRate(r.NVLinkTxBps, w.nvTx) ||
					!nearRate(r.NVLinkRxBps, w.nvRx) || !nearRate(r.ReplayPerSec, w.repl) {
					t.Errorf("%s: got %+v, want %+v", w.key, r, w)
				}
				if !reflect.DeepEqual(r.Resets, w.resets) {
					t.Errorf("%s: resets %v, want %v", w.key, r.Resets, w.resets)
				}
			}
			if !reflect.DeepEqual(gone, tc.wantGone) {
				t.Errorf("gone %v, want %v", gone, tc.wantGone)
			}
		})
	}
}

func TestGPURatesNonPositiveInterval(t *testing.T) {
	s := GPUSnapshot{Time: time.Unix(1, 0), GPUs: []GPUReading{{UUID: "GPU-a", HasPCIeBytes: true}}}
	if rs, gone := GPURates(s, s); rs != nil || gone != nil {
		t.Errorf("same snapshot twice: %+v %v", rs, gone)
	}
}

// The recorded nvidia-smi -q sample as two snapshots one second apart: the
// throughput is a rate only and passes through, the replay counter's
// increase is a rate, and a GPU whose replay counter went back is named.
func TestGPURatesSMIQuerySeries(t *testing.T) {
	prev := smiQueryReadings(t, filepath.Join("testdata", "nvidia_smi_q", "thamada_H100SXMx8.nvidia-smi-q.txt"))
	cur := make([]GPUReading, len(prev))
	copy(cur, prev)
	cur[0].Replay += 3 // 7 → 10
	cur[6].Replay = 0  // 15 → 0: reset
	t0 := time.Unix(1700000000, 0)
	rs, gone := GPURates(GPUSnapshot{Time: t0, GPUs: prev, Source: "nvml"},
		GPUSnapshot{Time: t0.Add(time.Second), GPUs: cur, Source: "nvml"})
	if len(rs) != 8 || gone != nil {
		t.Fatalf("%d rates, gone %v", len(rs), gone)
	}
	r0 := gpuRateOf(t, rs, "GPU-b42dd28e-ffdd-8720-1df0-98bd8cdc05b1")
	if r0.ReplayPerSec != 3 || r0.TxBps != 567*1024 || r0.RxBps != 559*1024 || r0.BusID != "00000000:18:00.0" {
		t.Errorf("GPU 0: %+v", r0)
	}
	if r6 := rs[6]; !reflect.DeepEqual(r6.Resets, []string{"replay"}) || r6.ReplayPerSec != 0 {
		t.Errorf("GPU 6: %+v, want a replay reset", r6)
	}
	if r1 := rs[1]; r1.RxBps != 3874*1024 {
		t.Errorf("GPU 1 RX %v B/s, want 3874 KB/s", r1.RxBps)
	}
}

// The two recorded dcgmi dmon series (DGX-2): rate-only readings. GPUs 0 and
// 1 are in both and pass their current rates through; 9 and 10 are only in
// the first (disappeared); 11–15 only in the second (no rate yet).
func TestGPURatesDCGMDmonSeries(t *testing.T) {
	prev := dmonRateReadings(t, filepath.Join("testdata", "dcgm", "nvidia_gds_config_guide_dgx2_dcgmi_dmon_1009_1010_gpu10_randread.txt"))
	cur := dmonRateReadings(t, filepath.Join("testdata", "dcgm", "nvidia_gds_config_guide_dgx2_dcgmi_dmon_1009_1010_gpu12_seqread.txt"))
	if len(prev) != 4 || len(cur) != 7 {
		t.Fatalf("rows: %d and %d, want 4 and 7", len(prev), len(cur))
	}
	t0 := time.Unix(1700000000, 0)
	rs, gone := GPURates(GPUSnapshot{Time: t0, GPUs: prev, Source: "dcgm"},
		GPUSnapshot{Time: t0.Add(time.Second), GPUs: cur, Source: "dcgm"})
	if !reflect.DeepEqual(gone, []string{"dcgm-gpu-9", "dcgm-gpu-10"}) {
		t.Errorf("gone %v", gone)
	}
	if len(rs) != 2 {
		t.Fatalf("rates %+v, want GPUs 0 and 1", rs)
	}
	if r := gpuRateOf(t, rs, "dcgm-gpu-0"); r.TxBps != 4712070210 || r.RxBps != 5237742827 {
		t.Errorf("GPU 0: %+v", r)
	}
	if r := gpuRateOf(t, rs, "dcgm-gpu-1"); r.TxBps != 435418 || r.RxBps != 637272 {
		t.Errorf("GPU 1: %+v", r)
	}
}

// fixedGPUs is a counter source that returns one snapshot.
type fixedGPUs struct{ snap GPUSnapshot }

func (f fixedGPUs) Sample() (GPUSnapshot, error) { return f.snap, nil }
func (f fixedGPUs) Source() string               { return "fixed" }
func (f fixedGPUs) Close() error                 { return nil }

// The L4 of the nvidia-smi -q sample (gen 1 of 4, x8 of x16, replays 0)
// exported at scrape time, with byte totals added as NVML would give them.
func TestGPUMetrics(t *testing.T) {
	l4 := smiQueryReadings(t, filepath.Join("testdata", "nvidia_smi_q", "thamada_L4.nvidia-smi-q.txt"))
	if len(l4) != 1 {
		t.Fatalf("L4 sample: %d GPUs", len(l4))
	}
	g := l4[0]
	g.BusID = PCIAddress(g.BusID)
	g.PCIeRxBytes, g.PCIeTxBytes, g.HasPCIeBytes = 5000, 3000, true
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectorFunc(NewGPUMetrics(fixedGPUs{GPUSnapshot{GPUs: []GPUReading{g}}}).Update))
	want := fmt.Sprintf(`
# HELP lanewatch_gpu_pcie_bytes_total Bytes that crossed the GPU's PCIe link per direction (inbound: host to device), as the GPU counts them (NVML, or DCGM's rates integrated).
# TYPE lanewatch_gpu_pcie_bytes_total counter
lanewatch_gpu_pcie_bytes_total{direction="inbound",gpu="%[1]s"} 5000
lanewatch_gpu_pcie_bytes_total{direction="outbound",gpu="%[1]s"} 3000
# HELP lanewatch_gpu_pcie_link_generation PCIe generation of the GPU's link, current (trained now) or max.
# TYPE lanewatch_gpu_pcie_link_generation gauge
lanewatch_gpu_pcie_link_generation{gpu="%[1]s",state="current"} 1
lanewatch_gpu_pcie_link_generation{gpu="%[1]s",state="max"} 4
# HELP lanewatch_gpu_pcie_link_width PCIe lanes of the GPU's link, current (trained now) or max.
# TYPE lanewatch_gpu_pcie_link_width gauge
lanewatch_gpu_pcie_link_width{gpu="%[1]s",state="current"} 8
lanewatch_gpu_pcie_link_width{gpu="%[1]s",state="max"} 16
`, g.BusID)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "lanewatch_gpu_pcie_bytes_total",
		"lanewatch_gpu_pcie_link_generation", "lanewatch_gpu_pcie_link_width"); err != nil {
		t.Error(err)
	}
	if n, _ := testutil.GatherAndCount(reg, "lanewatch_gpu_nvlink_bytes_total"); n != 0 {
		t.Errorf("NVLink totals exported for a GPU without them: %d series", n)
	}
	if strings.HasPrefix(g.BusID, "0000000") || strings.ToLower(g.BusID) != g.BusID {
		t.Errorf("gpu label %q is not a sysfs PCI address", g.BusID)
	}
}

// collectorFunc registers a bare Update as an unchecked collector.
type collectorFunc func(chan<- prometheus.Metric) error

func (collectorFunc) Describe(chan<- *prometheus.Desc)      {}
func (f collectorFunc) Collect(ch chan<- prometheus.Metric) { f(ch) }
