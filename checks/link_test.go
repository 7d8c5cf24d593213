package checks

import (
	"os"
	"strings"
	"testing"

	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/internal/sysfstest"
	"github.com/lanewatch/lanewatch/topology"
)

// linkHost is one GPU under a root port, with the link files given:
// gpuCur/gpuMax and slotMax as sysfs writes them ("16.0 GT/s PCIe"), widths
// as numbers.
func linkHost(t *testing.T, gpuCur, gpuCurW, gpuMax, gpuMaxW, slotMax, slotMaxW string) *Host {
	t.Helper()
	sys := sysfstest.Build(t, sysfstest.Host{
		Nodes: []sysfstest.Node{{CPUs: "0-3", Distance: "10"}},
		Funcs: []sysfstest.Func{
			{BDF: "0000:00:01.1", HB: "pci0000:00", Class: "0x060400", Vendor: "0x1022", Device: "0x14ab", NUMA: "0",
				Cur: gpuCur, Max: slotMax, CurW: gpuCurW, MaxW: slotMaxW},
			{BDF: "0000:01:00.0", Parent: "0000:00:01.1", Class: "0x030000", Vendor: "0x10de", Device: "0x26b1", NUMA: "0",
				Cur: gpuCur, Max: gpuMax, CurW: gpuCurW, MaxW: gpuMaxW},
		},
	})
	h, err := ReadHost("/proc", sys, "/nonexistent")
	if err != nil {
		t.Fatal(err)
	}
	return h
}

const (
	gen1 = "2.5 GT/s PCIe"
	gen4 = "16.0 GT/s PCIe"
	gen5 = "32.0 GT/s PCIe"
)

func TestLinkCheck(t *testing.T) {
	const gpu = "0000:01:00.0"
	for _, tt := range []struct {
		name  string
		host  func(*testing.T) *Host
		loads map[string]LinkLoad
		want  correlate.Severity // "" no finding
		text  string             // in the finding's summary, else in the check's detail
	}{
		// lspci_vv/asus_esc8000a_e12_01_00.0: an RTX 6000 Ada (LnkCap 16GT/s
		// x16) idling at 2.5GT/s (downgraded) x16 in a Gen5 x16 root port.
		{"idle at Gen1, no traffic", func(t *testing.T) *Host { return linkHost(t, gen1, "16", gen4, "16", gen5, "16") }, nil,
			"", "gpu 0000:01:00.0 trains to Gen4 x16 31.51 GB/s (device Gen4 x16, slot 0000:00:01.1 Gen5 x16), reads Gen1 x16 (idle or load unknown: not judged)"},
		{"under load at full speed", func(t *testing.T) *Host { return linkHost(t, gen1, "16", gen4, "16", gen5, "16") },
			map[string]LinkLoad{gpu: {GTs: 16, Width: 16, Bps: 20e9, Source: "nvml", MaxGTs: 16, MaxWidth: 16}},
			"", "Gen4 x16 under load (20.00 GB/s, nvml)"},
		{"under load, trained down", func(t *testing.T) *Host { return linkHost(t, gen1, "16", gen4, "16", gen5, "16") },
			map[string]LinkLoad{gpu: {GTs: 2.5, Width: 16, Bps: 3e9, Source: "nvml"}},
			correlate.SevFail, "link runs at 2.5 GT/s of 16.0 while carrying 3.00 GB/s"},
		// nvidia_smi_q/thamada_L4 reads Max 16x, Current 8x; here its slot is
		// x8: slot-limited, not a reseat, idle or loaded.
		{"card wider than its slot, idle", func(t *testing.T) *Host { return linkHost(t, gen1, "8", gen4, "16", gen4, "8") }, nil,
			correlate.SevInfo, "slot-limited: a Gen4 x16 device in a Gen4 x8 slot trains to Gen4 x8, 15.75 GB/s of the device's 31.51"},
		{"card wider than its slot, under load at x8", func(t *testing.T) *Host { return linkHost(t, gen1, "8", gen4, "16", gen4, "8") },
			map[string]LinkLoad{gpu: {GTs: 16, Width: 8, Bps: 12e9, Source: "sysfs"}},
			correlate.SevInfo, "slot-limited"},
		{"x16 card in an x16 slot at x8 under load", func(t *testing.T) *Host { return linkHost(t, gen1, "8", gen4, "16", gen4, "16") },
			map[string]LinkLoad{gpu: {GTs: 16, Width: 8, Bps: 12e9, Source: "dcgm"}},
			correlate.SevFail, "link trained at x8 of x16 while carrying 12.00 GB/s"},
		{"x16 card in an x16 slot at x8, idle", func(t *testing.T) *Host { return linkHost(t, gen1, "8", gen4, "16", gen4, "16") }, nil,
			"", "not judged"},
		// A GPU only the counters show (NVML's reference GPUs, a GPU sysfs
		// hides): judged against the counters' own maximum.
		{"GPU outside sysfs, under load at its max", func(t *testing.T) *Host { return linkHost(t, gen1, "16", gen4, "16", gen5, "16") },
			map[string]LinkLoad{"f123:45:00.0": {GTs: 32, Width: 16, Bps: 5e9, Source: "nvml", MaxGTs: 32, MaxWidth: 16}},
			"", "gpu f123:45:00.0 (nvml only) trains to Gen5 x16, Gen5 x16 under load (5.00 GB/s)"},
		{"GPU outside sysfs, under load at Gen3", func(t *testing.T) *Host { return linkHost(t, gen1, "16", gen4, "16", gen5, "16") },
			map[string]LinkLoad{"f123:45:00.0": {GTs: 8, Width: 16, Bps: 5e9, Source: "nvml", MaxGTs: 32, MaxWidth: 16}},
			correlate.SevFail, "link runs at 8.0 GT/s of 32.0"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := tt.host(t)
			h.Loads = tt.loads
			c := h.linkCheck()
			var r Report
			r.Add(c)
			switch {
			case tt.want == "" && len(c.Findings) > 0:
				t.Fatalf("findings %+v", c.Findings)
			case tt.want == "" && (!strings.Contains(c.Detail, tt.text) || r.Checks[0].Status != Pass):
				t.Fatalf("%s %q, want PASS with %q", r.Checks[0].Status, c.Detail, tt.text)
			case tt.want == "":
			case len(c.Findings) != 1:
				t.Fatalf("findings %+v, want one %s", c.Findings, tt.want)
			case c.Findings[0].Severity != tt.want || c.Findings[0].Rule != "link-degraded" || !strings.Contains(c.Findings[0].Summary, tt.text):
				t.Fatalf("finding %+v, want %s with %q", c.Findings[0], tt.want, tt.text)
			}
			if tt.want == correlate.SevInfo && r.Checks[0].Status != Pass {
				t.Errorf("a slot-limited link makes the check %s, want PASS", r.Checks[0].Status)
			}
		})
	}
}

// The lane capacity of a GPU idling at Gen1 is its trained maximum: the
// placement and the overlap check use that, never the idle 4 GB/s.
func TestLaneCapacityIsTheTrainedMaximum(t *testing.T) {
	h := linkHost(t, gen1, "16", gen4, "16", gen5, "16")
	gbs, why := h.LaneCapacity("0000:01:00.0")
	want := topology.LinkGBs(16, 16)
	if gbs != want || !strings.Contains(why, "trained max Gen4 x16 31.51 GB/s") || !strings.Contains(why, "reads Gen1 x16 4.00 GB/s now") {
		t.Fatalf("LaneCapacity = %v %q, want %v", gbs, why, want)
	}
	pl := h.Place(uint32(os.Getpid()))
	if pl.GPU != "0000:01:00.0" || pl.InboundGBs != want || pl.OutboundGBs != want || !strings.Contains(pl.Why, "trained max") {
		t.Fatalf("Place = %+v", pl)
	}
	// A process whose environment cannot be read is not said to have no
	// CUDA_VISIBLE_DEVICES: the assumption names why.
	if _, _, why := h.GPUOf(1 << 30); !strings.Contains(why, "environment unread (read /proc/1073741824/environ: open") ||
		!strings.HasSuffix(why, "assumed GPU 0") {
		t.Errorf("GPUOf of no process: %q", why)
	}
	// Two 10 GB/s flows on it are 63% of the lane, not "saturating" 4 GB/s.
	// (100 ms each, in flight together: 1 GB at 10 GB/s)
	two := correlate.LinkTraffic{Segment: "link:0000:01:00.0", Direction: "down", CapacityGBs: pl.InboundGBs, Flows: []correlate.Flow{
		{Name: "stream 1", Spans: []correlate.Span{{Start: 1, End: 100e6 + 1, Bytes: 1e9}}},
		{Name: "stream 2", Spans: []correlate.Span{{Start: 1, End: 100e6 + 1, Bytes: 1e9}}}}}
	if f := correlate.SameDirectionOverlap(correlate.MeasureOverlap(two)); f != nil {
		t.Errorf("two 10 GB/s flows on a Gen4 x16 link idling at Gen1: %+v", f)
	}
	if two.CapacityGBs = 4; correlate.SameDirectionOverlap(correlate.MeasureOverlap(two)) == nil {
		t.Error("against the idle reading's 4 GB/s they would saturate it: the comparison above would then mean nothing")
	}
	if gbs, why := linkHost(t, gen1, "8", gen4, "16", gen4, "8").LaneCapacity("0000:01:00.0"); gbs != topology.LinkGBs(16, 8) ||
		!strings.Contains(why, "slot 0000:00:01.1 Gen4 x8") {
		t.Errorf("x16 card in an x8 slot: %v %q", gbs, why)
	}
	if gbs, why := h.LaneCapacity("0000:09:00.0"); gbs != 0 || !strings.Contains(why, "unknown") {
		t.Errorf("a GPU the host lacks: %v %q", gbs, why)
	}
}
