package agent

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/lanewatch/lanewatch/collectors"
	"github.com/lanewatch/lanewatch/internal/sysfstest"
)

// A host with an ASPEED BMC display (class 0x0300, not a CUDA device), an
// AMD GPU (not CUDA's) and three NVIDIA GPUs of two models, in sysfs.
func mixedGPUHost() sysfstest.Host {
	gpu := func(bdf, class, vendor, device string) sysfstest.Func {
		return sysfstest.Func{BDF: bdf, HB: "pci0000:" + bdf[5:7], Class: class, Vendor: vendor, Device: device, NUMA: "0"}
	}
	return sysfstest.Host{Funcs: []sysfstest.Func{
		gpu("0000:02:00.0", "0x030000", "0x1a03", "0x2000"), // ASPEED
		gpu("0000:17:00.0", "0x030200", "0x10de", "0x2330"), // H100 SXM
		gpu("0000:3b:00.0", "0x030200", "0x10de", "0x2330"),
		gpu("0000:5e:00.0", "0x030000", "0x1002", "0x740f"), // AMD MI210
		gpu("0000:86:00.0", "0x030200", "0x10de", "0x26b9"), // L40S
	}}
}

func TestHostCUDAGPUs(t *testing.T) {
	sys := sysfstest.Build(t, mixedGPUHost())
	got, err := HostCUDAGPUs(sys, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []collectors.CUDAGPU{{BusID: "0000:17:00.0", Model: "10de:2330"}, {BusID: "0000:3b:00.0", Model: "10de:2330"},
		{BusID: "0000:86:00.0", Model: "10de:26b9"}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("from sysfs: %+v, want %+v", got, want)
	}
	// NVML's view wins: only the GPUs its driver manages, with UUIDs.
	readings := []collectors.GPUReading{{BusID: "00000000:3B:00.0", UUID: "GPU-b", Name: "NVIDIA H100 80GB HBM3"},
		{BusID: "00000000:17:00.0", UUID: "GPU-a", Name: "NVIDIA H100 80GB HBM3"}}
	got, err = HostCUDAGPUs(sys, readings)
	want = []collectors.CUDAGPU{{BusID: "0000:3b:00.0", UUID: "GPU-b", Model: "NVIDIA H100 80GB HBM3"},
		{BusID: "0000:17:00.0", UUID: "GPU-a", Model: "NVIDIA H100 80GB HBM3"}}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("from NVML: %+v, %v", got, err)
	}
}

// writeEnviron makes procRoot/pid/environ, NUL-separated as the kernel has it.
func writeEnviron(t *testing.T, procRoot string, pid int, vars ...string) {
	t.Helper()
	dir := filepath.Join(procRoot, strconv.Itoa(pid))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	block := strings.Join(append([]string{"PATH=/usr/bin", "HOME=/root"}, vars...), "\x00") + "\x00"
	if err := os.WriteFile(filepath.Join(dir, "environ"), []byte(block), 0o644); err != nil {
		t.Fatal(err)
	}
}

// The environment of each process decides its ordinals; every answer is
// logged with what it assumed, or why it is unknown.
func TestDeviceMap(t *testing.T) {
	gpus, err := HostCUDAGPUs(sysfstest.Build(t, mixedGPUHost()), nil)
	if err != nil {
		t.Fatal(err)
	}
	proc := t.TempDir()
	writeEnviron(t, proc, 100)                                                             // a TP worker seeing every GPU
	writeEnviron(t, proc, 101, "CUDA_VISIBLE_DEVICES=2,0", "CUDA_DEVICE_ORDER=PCI_BUS_ID") // a worker given two
	writeEnviron(t, proc, 102, "CUDA_VISIBLE_DEVICES=1")                                   // FASTEST_FIRST over two models
	writeEnviron(t, proc, 103, "CUDA_VISIBLE_DEVICES=GPU-b42dd28e")                        // a UUID, no NVML here
	var logs bytes.Buffer
	m := DeviceMap(collectors.NewEnvCache(proc), gpus, slog.New(slog.NewTextHandler(&logs, nil)))
	for _, tc := range []struct {
		pid     uint32
		ordinal int
		want    string
		logHas  string
	}{
		{100, 1, "", "different models"},
		{101, 0, "0000:86:00.0", "CUDA_VISIBLE_DEVICES=2,0"},
		{101, 1, "0000:17:00.0", ""},
		{101, 2, "", "the process sees 2 CUDA devices"},
		{102, 0, "", "speed ranking is not known"},
		{103, 0, "", "UUIDs are not known"},
		{104, 0, "", "no such file"}, // gone
	} {
		logs.Reset()
		if got := m(tc.pid, tc.ordinal); got != tc.want {
			t.Errorf("pid %d device %d: %q, want %q (log %s)", tc.pid, tc.ordinal, got, tc.want, logs.String())
		}
		if !strings.Contains(logs.String(), "CUDA device placed") || !strings.Contains(logs.String(), tc.logHas) {
			t.Errorf("pid %d device %d: log %q lacks %q", tc.pid, tc.ordinal, logs.String(), tc.logHas)
		}
	}
	// One model only: the PCI order is assumed, and said.
	logs.Reset()
	if got := m(100, 0); got != "" {
		t.Errorf("mixed host, no order: %q", got)
	}
	same := gpus[:2]
	logs.Reset()
	if got := DeviceMap(collectors.NewEnvCache(proc), same, slog.New(slog.NewTextHandler(&logs, nil)))(100, 1); got != "0000:3b:00.0" || !strings.Contains(logs.String(), "PCI bus order assumed") {
		t.Errorf("one model: %q, log %s", got, logs.String())
	}
}
