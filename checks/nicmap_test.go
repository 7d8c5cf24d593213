package checks

import (
	"io/fs"
	"reflect"
	"strings"
	"testing"

	"github.com/lanewatch/lanewatch/internal/sysfstest"
)

func noFile(string) ([]byte, error) { return nil, fs.ErrNotExist }

// The forms of SGLang's --disaggregation-ib-device as servers are started
// with them: seed 000 (PD 分离) names the four forms and gives the JSON
// example; the lists are from public launch scripts (SGLang PD recipes on
// ionic and rdma NICs, a DeepSeek-R1 PD script with mlx5_0).
func TestParseIBDevicesForms(t *testing.T) {
	files := map[string]string{
		"/etc/sglang/ib.json": `{"0": "mlx5_0", "1": "mlx5_1,mlx5_2"}`,
		"ib.json":             "{\n  \"0\": [\"mlx5_3\"]\n}\n",
	}
	read := func(p string) ([]byte, error) {
		if s, ok := files[p]; ok {
			return []byte(s), nil
		}
		return nil, fs.ErrNotExist
	}
	for _, tc := range []struct {
		values []string
		want   IBDevices
	}{
		{[]string{"mlx5_0"}, IBDevices{Shared: []string{"mlx5_0"}}},
		{[]string{"mlx5_0,mlx5_1"}, IBDevices{Shared: []string{"mlx5_0", "mlx5_1"}}},
		{[]string{"mlx5_0", "mlx5_1"}, IBDevices{Shared: []string{"mlx5_0", "mlx5_1"}}}, // repeated flags
		{[]string{"mlx5_0,mlx5_1", "mlx5_1"}, IBDevices{Shared: []string{"mlx5_0", "mlx5_1"}}},
		{[]string{"ionic_0,ionic_1,ionic_2,ionic_3,ionic_4,ionic_5,ionic_6,ionic_7"},
			IBDevices{Shared: []string{"ionic_0", "ionic_1", "ionic_2", "ionic_3", "ionic_4", "ionic_5", "ionic_6", "ionic_7"}}},
		{[]string{"rdma0,rdma1,rdma2,rdma3,rdma4,rdma5,rdma6,rdma7"},
			IBDevices{Shared: []string{"rdma0", "rdma1", "rdma2", "rdma3", "rdma4", "rdma5", "rdma6", "rdma7"}}},
		{[]string{" mlx5_0 , mlx5_1 "}, IBDevices{Shared: []string{"mlx5_0", "mlx5_1"}}},
		{[]string{`{"0": "mlx5_0,mlx5_1", "1": "mlx5_2"}`}, IBDevices{PerGPU: map[int][]string{0: {"mlx5_0", "mlx5_1"}, 1: {"mlx5_2"}}}},
		{[]string{`{"0":"mlx5_0"}`, `{"1":"mlx5_1","0":"mlx5_2"}`}, IBDevices{PerGPU: map[int][]string{0: {"mlx5_0", "mlx5_2"}, 1: {"mlx5_1"}}}},
		{[]string{"/etc/sglang/ib.json"}, IBDevices{PerGPU: map[int][]string{0: {"mlx5_0"}, 1: {"mlx5_1", "mlx5_2"}}}},
		{[]string{"ib.json"}, IBDevices{PerGPU: map[int][]string{0: {"mlx5_3"}}}},
		{[]string{"mlx5_4", `{"0":"mlx5_0"}`}, IBDevices{Shared: []string{"mlx5_4"}, PerGPU: map[int][]string{0: {"mlx5_0"}}}},
		{nil, IBDevices{}},
	} {
		got, err := ParseIBDevices(tc.values, read)
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%q: %+v, %v; want %+v", tc.values, got, err, tc.want)
		}
	}
	m, _ := ParseIBDevices([]string{"mlx5_4", `{"1":"mlx5_0"}`}, read)
	if got := m.For(0); !reflect.DeepEqual(got, []string{"mlx5_4"}) {
		t.Errorf("GPU 0 gets %v, want the shared list", got)
	}
	if got := m.For(1); !reflect.DeepEqual(got, []string{"mlx5_0"}) {
		t.Errorf("GPU 1 gets %v, want its own entry", got)
	}
	if got := m.GPUs(3); !reflect.DeepEqual(got, []int{0, 1, 2}) {
		t.Errorf("GPUs %v", got)
	}
	if got := m.Devices(); !reflect.DeepEqual(got, []string{"mlx5_0", "mlx5_4"}) {
		t.Errorf("devices %v", got)
	}
}

func TestParseIBDevicesErrors(t *testing.T) {
	for _, tc := range []struct{ value, err string }{
		{"{0:", "not a GPU → device JSON object"},
		{`{"gpu0": "mlx5_0"}`, `key "gpu0" is not a GPU index`},
		{`{"-1": "mlx5_0"}`, `key "-1" is not a GPU index`},
		{`{"0": 5}`, "neither a device string nor a list"},
		{`{"0": ""}`, "empty device name"},
		{"mlx5_0,,mlx5_1", "empty device name"},
		{"mlx5_0 mlx5_1", `has ' '`},
		{"/nonexistent/map.json", "file does not exist"},
		{strings.Repeat("m", 64), "longer than 63 bytes"},
	} {
		_, err := ParseIBDevices([]string{tc.value}, noFile)
		if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.HasPrefix(err.Error(), "--ib-devices") && !strings.HasPrefix(err.Error(), "/") {
			t.Errorf("%q: error %v, want one with %q", tc.value, err, tc.err)
		}
	}
}

func FuzzParseIBDevices(f *testing.F) {
	for _, s := range []string{"mlx5_0", "mlx5_0,mlx5_1", `{"0": "mlx5_0,mlx5_1", "1": "mlx5_2"}`, `{"0": ["mlx5_3"]}`, "{0:", "a/b.json", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		m, err := ParseIBDevices([]string{s}, noFile)
		if err != nil {
			return
		}
		for _, d := range m.Devices() {
			if validDevice(d) != nil {
				t.Fatalf("%q gave invalid device %q", s, d)
			}
		}
		for i := range m.PerGPU {
			if i < 0 {
				t.Fatalf("%q gave GPU %d", s, i)
			}
		}
	})
}

// twoGPUHost has two PCIe switches, each with a GPU and a ConnectX-7 (PIX
// to each other), on two host bridges of one node (NODE across).
func twoGPUHost(t *testing.T) *Host {
	t.Helper()
	sys := sysfstest.Build(t, sysfstest.Host{
		Nodes: []sysfstest.Node{{CPUs: "0-3", Distance: "10"}},
		Funcs: []sysfstest.Func{
			{BDF: "0000:17:00.0", HB: "pci0000:17", Class: "0x060400", Vendor: "0x1000", Device: "0xc030", NUMA: "0"},
			{BDF: "0000:18:00.0", Parent: "0000:17:00.0", Class: "0x030200", Vendor: "0x10de", Device: "0x2330", NUMA: "0"},
			{BDF: "0000:19:00.0", Parent: "0000:17:00.0", Class: "0x020700", Vendor: "0x15b3", Device: "0x1021", NUMA: "0", RDMA: []string{"mlx5_0"}},
			{BDF: "0000:37:00.0", HB: "pci0000:37", Class: "0x060400", Vendor: "0x1000", Device: "0xc030", NUMA: "0"},
			{BDF: "0000:38:00.0", Parent: "0000:37:00.0", Class: "0x030200", Vendor: "0x10de", Device: "0x2330", NUMA: "0"},
			{BDF: "0000:39:00.0", Parent: "0000:37:00.0", Class: "0x020700", Vendor: "0x15b3", Device: "0x1021", NUMA: "0", RDMA: []string{"mlx5_1"}},
		},
	})
	h, err := ReadHost(t.TempDir(), sys, "/nonexistent")
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// far-nic over every form of the server's map: the comma form and repeated
// flags give each GPU its nearest listed device, so a list holding each
// GPU's PIX NIC passes and a list of one far NIC fires for the GPU it is
// far from.
func TestNICCheckForms(t *testing.T) {
	h := twoGPUHost(t)
	for _, tc := range []struct {
		values []string
		status Status
		far    []string // subjects of far-nic findings
		detail string
	}{
		{nil, Info, nil, "give --ib-devices"},
		{[]string{"mlx5_0,mlx5_1"}, Pass, nil, ""},
		{[]string{"mlx5_0", "mlx5_1"}, Pass, nil, ""},
		{[]string{"mlx5_1"}, Warn, []string{"GPU 0000:18:00.0"}, ""},
		{[]string{"mlx5_0"}, Warn, []string{"GPU 0000:38:00.0"}, ""},
		{[]string{`{"0":"mlx5_0","1":"mlx5_1"}`}, Pass, nil, ""},
		{[]string{`{"0":"mlx5_1","1":"mlx5_0,mlx5_1"}`}, Warn, []string{"GPU 0000:18:00.0"}, ""},
		{[]string{`{"0":"mlx5_1","1":"mlx5_0"}`}, Warn, []string{"GPU 0000:18:00.0", "GPU 0000:38:00.0"}, ""},
		{[]string{"mlx5_9"}, Warn, nil, "--ib-devices names mlx5_9, not an RDMA device of this host (mlx5_0, mlx5_1)"},
		{[]string{`{"2":"mlx5_0"}`}, Warn, nil, "--ib-devices names GPU 2, this host has GPUs 0..1"},
	} {
		m, err := ParseIBDevices(tc.values, noFile)
		if err != nil {
			t.Fatal(err)
		}
		var r Report
		r.Add(h.nicCheck(m))
		c := r.Checks[0]
		var far []string
		for _, f := range c.Findings {
			if f.Rule != "far-nic" {
				t.Errorf("%q: finding %+v", tc.values, f)
			}
			far = append(far, f.Subject)
		}
		if c.Status != tc.status || strings.Join(far, ";") != strings.Join(tc.far, ";") || !strings.Contains(c.Detail, tc.detail) {
			t.Errorf("%q: %s %v %q; want %s %v %q", tc.values, c.Status, far, c.Detail, tc.status, tc.far, tc.detail)
		}
	}
}
