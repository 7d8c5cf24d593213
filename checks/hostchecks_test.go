package checks

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/lanewatch/lanewatch/internal/sysfstest"
)

// switchedGPU is a GPU behind a PCIe switch (Broadcom PEX89000 IDs) under a
// root port: rootW is the root port's maximum width, the link above the
// switch; the GPU's own link is Gen5 x16 and idles at Gen1 (what GPUs do).
func switchedGPU(rootW string) sysfstest.Host {
	const gen5, gen1 = "32.0 GT/s PCIe", "2.5 GT/s PCIe"
	return sysfstest.Host{Funcs: []sysfstest.Func{
		{BDF: "0000:80:01.0", HB: "pci0000:80", Class: "0x060400", Vendor: "0x1022", Device: "0x14ab", NUMA: "0",
			Cur: gen5, Max: gen5, CurW: rootW, MaxW: rootW},
		{BDF: "0000:81:00.0", Parent: "0000:80:01.0", Class: "0x060400", Vendor: "0x1000", Device: "0xc030", NUMA: "0",
			Cur: gen5, Max: gen5, CurW: rootW, MaxW: "16"},
		{BDF: "0000:82:00.0", Parent: "0000:81:00.0", Class: "0x060400", Vendor: "0x1000", Device: "0xc030", NUMA: "0",
			Cur: gen1, Max: gen5, CurW: "16", MaxW: "16"},
		{BDF: "0000:83:00.0", Parent: "0000:82:00.0", Class: "0x030200", Vendor: "0x10de", Device: "0x2330", NUMA: "0",
			Cur: gen1, Max: gen5, CurW: "16", MaxW: "16"},
	}}
}

func hostOf(t *testing.T, fx sysfstest.Host) *Host {
	t.Helper()
	h, err := ReadHost(t.TempDir(), sysfstest.Build(t, fx), "/nonexistent")
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// The H2D path check warns when a link above the GPU is narrower than the
// GPU's own (seed 000: the path's narrowest segment is its ceiling; a switch
// uplink can be it), and passes when the GPU's link is the narrowest, idle
// training or not.
func TestPathCheckUpstreamBottleneck(t *testing.T) {
	for _, tc := range []struct {
		name   string
		rootW  string
		status Status
		detail string
	}{
		{"switch uplink x8 under a x16 GPU", "8", Warn, "H2D capped at 31.51 GB/s by link:0000:81:00.0, below its own link's 63.02 GB/s"},
		{"x16 all the way, GPU idling at Gen1: a tie is no cap", "16", Pass, "bottleneck link:0000:81:00.0 63.02 GB/s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := hostOf(t, switchedGPU(tc.rootW)).pathCheck()
			if c.Status != tc.status || !strings.Contains(c.Detail, tc.detail) {
				t.Errorf("%s %q, want %s with %q", c.Status, c.Detail, tc.status, tc.detail)
			}
			if (c.Fix != "") != (tc.status == Warn) {
				t.Errorf("fix %q for %s", c.Fix, c.Status)
			}
		})
	}
}

// Listings no host shape can fail are INFO, counted apart in the summary
// line and in the JSON.
func TestInfoChecks(t *testing.T) {
	h := hostOf(t, switchedGPU("16"))
	h.ProcRoot = procWithMeminfo(t, "lanewatch-dev.meminfo")
	var r Report
	for _, c := range h.HostChecks(IBDevices{}) {
		r.Add(c)
	}
	status := map[string]Status{}
	for _, c := range r.Checks {
		status[c.Name] = c.Status
	}
	for name, want := range map[string]Status{"PCI topology": Info, "H2D path per GPU": Pass, "RDMA NIC per GPU": Skip, "hugepages": Info} {
		if status[name] != want {
			t.Errorf("%s: %s, want %s", name, status[name], want)
		}
	}
	var text bytes.Buffer
	if err := r.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	s := r.Summary()
	if s.Info < 2 || !strings.Contains(text.String(), "[INFO] PCI topology") ||
		!strings.HasSuffix(text.String(), "\n"+strings.Join([]string{itoa(s.Pass) + " pass", itoa(s.Info) + " info", itoa(s.Warn) + " warn",
			itoa(s.Fail) + " fail", itoa(s.Skip) + " skip"}, ", ")+"\n") {
		t.Errorf("summary %+v, text:\n%s", s, text.String())
	}
	var js bytes.Buffer
	if err := r.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Checks  []Check `json:"checks"`
		Summary Summary `json:"summary"`
	}
	if err := json.Unmarshal(js.Bytes(), &got); err != nil || got.Summary != s || len(got.Checks) != len(r.Checks) || got.Checks[0].Status != Info {
		t.Errorf("JSON %s: %v", js.String(), err)
	}
}

// hugepages is a listing: INFO whatever the counts — the development
// machine's meminfo (none reserved) and a host with 20480 pages of 2 MiB
// reserved, 12292 free (the published grep, with this machine's MemTotal
// and MemAvailable lines added so the reader accepts it).
func TestHugepagesIsInfo(t *testing.T) {
	dev := readTestdata(t, "lanewatch-dev.meminfo")
	var memLines []string
	for _, l := range strings.Split(dev, "\n") {
		if strings.HasPrefix(l, "MemTotal:") || strings.HasPrefix(l, "MemAvailable:") {
			memLines = append(memLines, l)
		}
	}
	for name, body := range map[string]string{
		"development machine": dev,
		"20480 reserved":      strings.Join(memLines, "\n") + "\n" + readTestdata(t, "public_oracle_grep_Huge.meminfo"),
	} {
		proc := t.TempDir()
		sysfstest.Write(t, filepath.Join(proc, "meminfo"), body)
		c := (&Host{ProcRoot: proc}).hugepagesCheck()
		if c.Status != Info || !strings.Contains(c.Detail, "huge pages of") {
			t.Errorf("%s: %+v", name, c)
		}
	}
}

func readTestdata(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "collectors", "testdata", "meminfo", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func procWithMeminfo(t *testing.T, name string) string {
	t.Helper()
	proc := t.TempDir()
	sysfstest.Write(t, filepath.Join(proc, "meminfo"), readTestdata(t, name))
	return proc
}

func itoa(n int) string { return strconv.Itoa(n) }
