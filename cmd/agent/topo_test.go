package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/lanewatch/lanewatch/internal/sysfstest"
)

// The shared samples, as committed beside the parser (README.md there).
const topoSamples = "../../topology/testdata/topo_m/"

// Both shared topo -m samples give the GPU → nearest RDMA device map.
func TestTopoNvidiaSMISamples(t *testing.T) {
	cases := map[string]map[string]string{
		"sglang-issue-30401_8xH100_8xmlx5_2numa_spaces.txt": {"0": "mlx5_0", "1": "mlx5_1", "2": "mlx5_2", "3": "mlx5_3",
			"4": "mlx5_4", "5": "mlx5_5", "6": "mlx5_6", "7": "mlx5_7"},
		// old format: each GPU is NODE to one NIC and SYS to the other
		"princeton_della-i14g20_2xA100_2xmlx5_oldformat.txt": {"0": "mlx5_0", "1": "mlx5_1"},
	}
	for file, want := range cases {
		t.Run(file, func(t *testing.T) {
			var out, errb bytes.Buffer
			if code := realMain([]string{"topo", "--json", "--path.sysfs", "/sys", "--nvidia-smi", topoSamples + file}, &out, &errb); code != 0 {
				t.Fatalf("exit %d: %s", code, errb.String())
			}
			var got topoOutput
			if err := json.Unmarshal(out.Bytes(), &got); err != nil {
				t.Fatal(err)
			}
			if len(got.IBDeviceMap) != len(want) {
				t.Fatalf("map %v, want %v", got.IBDeviceMap, want)
			}
			for k, v := range want {
				if got.IBDeviceMap[k] != v {
					t.Errorf("GPU %s → %s, want %s", k, got.IBDeviceMap[k], v)
				}
			}
		})
	}
}

// topo -m as people paste it (topology/testdata/topo_m/README.md): what
// reads is printed with the parser's notes, what does not is refused with
// the parser's message.
func TestTopoNvidiaSMIPastedForms(t *testing.T) {
	const dir = "../../topology/testdata/topo_m/"
	for _, c := range []struct {
		file       string
		ibMap      map[string]string
		nearestNIC map[string]string
		note       string
	}{
		{"nccl-tests-issue-321_8xH20_vm_8nic_nolegend_spaces.txt", map[string]string{},
			map[string]string{"0": "NIC7", "1": "NIC6", "2": "NIC5", "3": "NIC4", "4": "NIC3", "5": "NIC2", "6": "NIC1", "7": "NIC0"},
			"no NIC Legend block: NIC0, NIC1, NIC2, NIC3, NIC4, NIC5, NIC6, NIC7 keep their column names"},
		{"gdr114-notes_2xV100_4nic_rocep_glued_header.txt", map[string]string{"0": "rocep4s0f0", "1": "rocep137s0f0"}, nil,
			`header field "GPU0GPU1NIC0NIC1NIC2NIC3" read as GPU0 GPU1 NIC0 NIC1 NIC2 NIC3`},
		{"sglang-issue-30401_8xH100_8xmlx5_collapsed_oneline_derived.txt", map[string]string{"0": "mlx5_0", "1": "mlx5_1", "2": "mlx5_2",
			"3": "mlx5_3", "4": "mlx5_4", "5": "mlx5_5", "6": "mlx5_6", "7": "mlx5_7"}, nil, "line breaks lost"},
	} {
		t.Run(c.file, func(t *testing.T) {
			var out, errb bytes.Buffer
			if code := realMain([]string{"topo", "--json", "--nvidia-smi", dir + c.file}, &out, &errb); code != 0 {
				t.Fatalf("exit %d: %s", code, errb.String())
			}
			var got topoOutput
			if err := json.Unmarshal(out.Bytes(), &got); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got.IBDeviceMap, c.ibMap) || !reflect.DeepEqual(got.NearestNIC, c.nearestNIC) {
				t.Errorf("ib_device_map %v, nearest_nic %v; want %v, %v", got.IBDeviceMap, got.NearestNIC, c.ibMap, c.nearestNIC)
			}
			if !slices.ContainsFunc(got.Notes, func(n string) bool { return strings.Contains(n, c.note) }) {
				t.Errorf("no note %q in %q", c.note, got.Notes)
			}
		})
	}
	var out, errb bytes.Buffer
	const nolegend = dir + "nccl-tests-issue-321_8xH20_vm_8nic_nolegend_spaces.txt"
	if code := realMain([]string{"topo", "--nvidia-smi", nolegend}, &out, &errb); code != 0 ||
		!strings.Contains(out.String(), `GPU → nearest NIC column (the file names no RDMA device): {"0":"NIC7",`) ||
		!strings.Contains(out.String(), "GPU → nearest RDMA device (SGLang --disaggregation-ib-device): {}") {
		t.Errorf("text output, exit %d:\n%s", code, out.String())
	}
	out.Reset()
	const cut = "vllm-issue-13855_8xH100_12nic_glued_cells_truncated.txt"
	if code := realMain([]string{"topo", "--nvidia-smi", dir + cut}, &out, &errb); code != exitCannotRun ||
		!strings.Contains(errb.String(), "topo: "+dir+cut+":10: row NIC0 has 14 cells, want 20 or 23 (20 devices, 3 affinity columns)") {
		t.Errorf("truncated paste: exit %d, stderr %q", code, errb.String())
	}
}

// With GPUs in sysfs and a saved topo -m, disagreements are reported.
func TestTopoComparesSysfsWithFile(t *testing.T) {
	sys := sysfstest.Build(t, sysfstest.Host{
		Nodes: []sysfstest.Node{{CPUs: "0-3", Distance: "10"}},
		Funcs: []sysfstest.Func{
			{BDF: "0000:17:00.0", HB: "pci0000:17", Class: "0x060400", Vendor: "0x1000", Device: "0xc030", NUMA: "0"},
			{BDF: "0000:18:00.0", Parent: "0000:17:00.0", Class: "0x030200", Vendor: "0x10de", Device: "0x2330", NUMA: "0"},
			{BDF: "0000:19:00.0", Parent: "0000:17:00.0", Class: "0x020700", Vendor: "0x15b3", Device: "0x1021", NUMA: "0", RDMA: []string{"mlx5_0"}},
		},
	})
	smi := filepath.Join(t.TempDir(), "topo.txt")
	// The file claims the NIC is behind the host bridge (PHB); sysfs says both sit under one bridge (PIX).
	os.WriteFile(smi, []byte("\tGPU0\tNIC0\tCPU Affinity\tNUMA Affinity\nGPU0\t X \tPHB\t0-3\t0\nNIC0\tPHB\t X \t\t\n\nNIC Legend:\n\n  NIC0: mlx5_0\n"), 0o644)
	var out, errb bytes.Buffer
	if code := realMain([]string{"topo", "--path.sysfs", sys, "--nvidia-smi", smi}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if !strings.Contains(out.String(), "difference: GPU0–mlx5_0: sysfs PIX, file PHB") {
		t.Errorf("no difference reported:\n%s", out.String())
	}
	out.Reset()
	if code := realMain([]string{"topo", "--path.sysfs", sys}, &out, &errb); code != 0 || !strings.Contains(out.String(), `{"0":"mlx5_0"}`) ||
		!strings.Contains(out.String(), "NIC0: mlx5_0") {
		t.Errorf("sysfs topo: exit %d\n%s", code, out.String())
	}
}

// On a host with no GPU and no RDMA topo says so and exits 0.
func TestTopoNoDevices(t *testing.T) {
	var out, errb bytes.Buffer
	sys := sysfstest.Plain(t)
	if code := realMain([]string{"topo", "--path.sysfs", sys}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if !strings.Contains(out.String(), "no GPU in "+sys) || !strings.Contains(out.String(), "no RDMA device") {
		t.Errorf("absent devices not named:\n%s", out.String())
	}
}

func TestDiagnoseExitCodes(t *testing.T) {
	var out, errb bytes.Buffer
	if code := realMain([]string{"diagnose", "--path.sysfs", filepath.Join(t.TempDir(), "nope")}, &out, &errb); code != exitCannotRun ||
		!strings.Contains(errb.String(), "diagnose:") {
		t.Errorf("unreadable sysfs: exit %d, stderr %q", code, errb.String())
	}
	errb.Reset()
	if code := realMain([]string{"diagnose", "--ib-devices", "{0:"}, &out, &errb); code != exitCannotRun || !strings.Contains(errb.String(), "--ib-devices") {
		t.Errorf("bad --ib-devices: exit %d, stderr %q", code, errb.String())
	}
	out.Reset()
	// A host with nothing to check and no process: exit 0, no FAIL.
	if code := realMain([]string{"diagnose", "--json", "--path.procfs", t.TempDir(), "--path.sysfs", sysfstest.Plain(t)}, &out, &errb); code != exitOK {
		t.Fatalf("plain host: exit %d, stderr %q", code, errb.String())
	}
	var r struct {
		Checks []struct{ Scope, Name, Status, Detail string }
	}
	if err := json.Unmarshal(out.Bytes(), &r); err != nil || len(r.Checks) == 0 {
		t.Fatalf("--json output: %v\n%s", err, out.String())
	}
	for _, c := range r.Checks {
		if c.Status == "FAIL" {
			t.Errorf("plain host failed %s: %s", c.Name, c.Detail)
		}
	}
}
