package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lanewatch/lanewatch/internal/sysfstest"
)

// `agent diagnose --ib-devices` takes every form SGLang's
// --disaggregation-ib-device takes: the comma form servers print, repeated
// flags, a JSON map inline or in a file. On a host where each GPU shares a
// PCIe switch with its own NIC, a list naming both NICs passes and a list of
// the other GPU's NIC is far-nic for GPU 0.
func TestDiagnoseIBDevicesForms(t *testing.T) {
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
	mapFile := filepath.Join(t.TempDir(), "ib.json")
	os.WriteFile(mapFile, []byte(`{"0": "mlx5_1", "1": "mlx5_1"}`), 0o644)
	for _, tc := range []struct {
		args   []string
		status string
		far    bool
	}{
		{[]string{"--ib-devices", "mlx5_0,mlx5_1"}, "PASS", false},
		{[]string{"--ib-devices", "mlx5_0", "--ib-devices", "mlx5_1"}, "PASS", false},
		{[]string{"--ib-devices", "mlx5_1"}, "WARN", true},
		{[]string{"--ib-devices", `{"0": "mlx5_0,mlx5_1", "1": "mlx5_1"}`}, "PASS", false},
		{[]string{"--ib-devices", mapFile}, "WARN", true},
		{nil, "INFO", false},
	} {
		var out, errb bytes.Buffer
		args := append([]string{"diagnose", "--json", "--path.sysfs", sys, "--path.procfs", t.TempDir()}, tc.args...)
		if code := realMain(args, &out, &errb); code != exitOK {
			t.Fatalf("%q: exit %d, stderr %q", tc.args, code, errb.String())
		}
		var r struct {
			Checks []struct {
				Name, Status string
				Findings     []struct{ Rule, Subject string }
			}
		}
		if err := json.Unmarshal(out.Bytes(), &r); err != nil {
			t.Fatal(err)
		}
		for _, c := range r.Checks {
			if c.Name != "RDMA NIC per GPU" {
				continue
			}
			far := len(c.Findings) == 1 && c.Findings[0].Rule == "far-nic" && c.Findings[0].Subject == "GPU 0000:18:00.0"
			if c.Status != tc.status || far != tc.far || (!tc.far && len(c.Findings) > 0) {
				t.Errorf("%q: %s %+v, want %s far-nic for GPU 0 %v", tc.args, c.Status, c.Findings, tc.status, tc.far)
			}
		}
	}
	var out, errb bytes.Buffer
	if code := realMain([]string{"diagnose", "--ib-devices", "mlx5_0,,mlx5_1"}, &out, &errb); code != exitCannotRun ||
		!strings.Contains(errb.String(), "empty device name") {
		t.Errorf("bad list: exit %d, stderr %q", code, errb.String())
	}
}
