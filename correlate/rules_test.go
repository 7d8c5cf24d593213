package correlate

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/lanewatch/lanewatch/topology"
)

// Hosts the placement rules are judged on, their packages as the
// topology package reads them from sysfs (topology/testdata/numa): a
// 2-socket EPYC 9374F (NPS1: node N on package N, distance 32) and a
// 2-socket EPYC 7742 in NPS4 (nodes 0-3 on package 0, 4-7 on package 1).
var (
	twoSockets = &topology.Host{Nodes: []topology.Node{{ID: 0, Package: 0, Distances: []int{10, 32}},
		{ID: 1, Package: 1, Distances: []int{32, 10}}}}
	nps4 = &topology.Host{Nodes: []topology.Node{{ID: 0, Package: 0}, {ID: 1, Package: 0}, {ID: 2, Package: 0}, {ID: 3, Package: 0},
		{ID: 4, Package: 1}, {ID: 5, Package: 1}, {ID: 6, Package: 1}, {ID: 7, Package: 1}}}
)

func TestRemoteNUMAPool(t *testing.T) {
	cases := []struct {
		name  string
		p     PoolPlacement
		sides NodeSides
		want  Severity // "" none
		says  string
	}{
		{"all remote", PoolPlacement{GPUNode: 1, PagesByNode: map[int]uint64{0: 16384}}, twoSockets.NodeSide, SevFail, "100% of the pool's pages are on another socket"},
		{"mostly remote", PoolPlacement{GPUNode: 1, PagesByNode: map[int]uint64{0: 600, 1: 400}}, twoSockets.NodeSide, SevFail, "60%"},
		{"half remote is not most", PoolPlacement{GPUNode: 1, PagesByNode: map[int]uint64{0: 500, 1: 500}}, twoSockets.NodeSide, "", ""},
		{"local", PoolPlacement{GPUNode: 0, PagesByNode: map[int]uint64{0: 16384}}, twoSockets.NodeSide, "", ""},
		{"GPU node unknown", PoolPlacement{GPUNode: -1, PagesByNode: map[int]uint64{0: 16384}}, twoSockets.NodeSide, "", ""},
		{"no pages resident", PoolPlacement{GPUNode: 1, PagesByNode: map[int]uint64{}}, twoSockets.NodeSide, "", ""},
		// weighted interleave 1:5, from samples/numa_maps/lkml_2024_weighted_interleave_v5_eatmem_weights_1t5.txt (second line)
		{"interleaved 1:5, GPU on node 0", PoolPlacement{GPUNode: 0, PagesByNode: map[int]uint64{0: 10923, 1: 54614}}, twoSockets.NodeSide, SevFail, ""},
		{"interleaved 1:5, GPU on node 1", PoolPlacement{GPUNode: 1, PagesByNode: map[int]uint64{0: 10923, 1: 54614}}, twoSockets.NodeSide, "", ""},
		// NPS4: a sibling node of the GPU's socket is not across it.
		{"NPS4 sibling node", PoolPlacement{GPUNode: 0, PagesByNode: map[int]uint64{1: 16384}}, nps4.NodeSide, SevInfo,
			"on sibling nodes of node 0's socket (SNC/NPS): no socket interconnect crossed"},
		{"NPS4 other socket", PoolPlacement{GPUNode: 0, PagesByNode: map[int]uint64{4: 16384}}, nps4.NodeSide, SevFail, "on another socket"},
		{"NPS4 split: not mostly across", PoolPlacement{GPUNode: 0, PagesByNode: map[int]uint64{2: 600, 5: 400}}, nps4.NodeSide, SevInfo,
			"partly on another socket (40%)"},
		{"layout unknown", PoolPlacement{GPUNode: 1, PagesByNode: map[int]uint64{0: 16384}}, nil, SevInfo,
			"whether it crossed the socket interconnect cannot be told"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.p.PID, c.p.Start, c.p.Size, c.p.GPU, c.p.Source, c.p.Sides = 42, 0x7f0000000000, 64<<20, "0000:17:00.0", "move_pages", c.sides
			f := RemoteNUMAPool(c.p)
			if (f != nil) != (c.want != "") || f != nil && f.Severity != c.want {
				t.Fatalf("finding %+v, want severity %q", f, c.want)
			}
			if f != nil && (f.Rule != "remote-numa-pool" || !strings.Contains(f.Summary, c.says) ||
				c.want == SevFail && !strings.Contains(f.Remediation, "--membind=") || !strings.Contains(strings.Join(f.Evidence, "|"), "where the nodes sit: ")) {
				t.Errorf("finding %+v", f)
			}
		})
	}
}

func TestNUMABindSkipped(t *testing.T) {
	base := BindFacts{PID: 7, MemsAllowed: []int{0, 1}, OnlineNodes: []int{0, 1}, Policies: []string{"default"},
		GPUNodes: []int{1}, NumactlOnPath: true, CapSysNice: true, Cpuset: "/"}
	cases := []struct {
		name   string
		edit   func(*BindFacts)
		fire   bool
		reason string
	}{
		{"unbound with numactl and CAP_SYS_NICE", func(*BindFacts) {}, true, "launcher did not ask"},
		{"no numactl", func(f *BindFacts) { f.NumactlOnPath, f.NumactlPath = false, "/usr/bin:/bin" }, true, "numactl is not installed"},
		{"no CAP_SYS_NICE", func(f *BindFacts) { f.CapSysNice = false }, true, "CAP_SYS_NICE"},
		{"membind by cpuset", func(f *BindFacts) { f.MemsAllowed = []int{1} }, false, ""},
		{"bind policy", func(f *BindFacts) { f.Policies = []string{"bind:1"} }, false, ""},
		{"preferred policy", func(f *BindFacts) { f.Policies = []string{"default", "prefer (many):1"} }, false, ""},
		{"weighted interleave is not a binding", func(f *BindFacts) { f.Policies = []string{"weighted interleave:0-1"} }, true, ""},
		{"single node host", func(f *BindFacts) { f.OnlineNodes, f.MemsAllowed = []int{0}, []int{0} }, false, ""},
		{"GPUs on two nodes", func(f *BindFacts) { f.GPUNodes = []int{0, 1} }, false, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := base
			c.edit(&f)
			got := NUMABindSkipped(f)
			if (got != nil) != c.fire {
				t.Fatalf("fired %v, want %v: %+v", got != nil, c.fire, got)
			}
			if got != nil && c.reason != "" && !strings.Contains(strings.Join(got.Evidence, "\n"), c.reason) {
				t.Errorf("evidence %q lacks %q", got.Evidence, c.reason)
			}
		})
	}
}

func TestFarNIC(t *testing.T) {
	// GPU0's row of the 8xH100 topo -m sample: mlx5_0 PIX, mlx5_1..3 NODE, mlx5_4..7 SYS.
	rel := map[string]topology.Relation{"mlx5_0": "PIX", "mlx5_1": "NODE", "mlx5_2": "NODE", "mlx5_3": "NODE",
		"mlx5_4": "SYS", "mlx5_5": "SYS", "mlx5_6": "SYS", "mlx5_7": "SYS"}
	for _, tc := range []struct {
		listed []string
		fire   bool
		used   string
	}{
		{[]string{"mlx5_0"}, false, ""},
		{[]string{"mlx5_1"}, true, "mlx5_1 (NODE)"},
		{[]string{"mlx5_5"}, true, "mlx5_5 (SYS)"},
		{[]string{"mlx5_9"}, false, ""}, // not on this host: no relation, never a guess
		// A list (the comma form servers print): the engine takes the nearest listed.
		{[]string{"mlx5_0", "mlx5_1"}, false, ""},
		{[]string{"mlx5_4", "mlx5_0"}, false, ""},
		{[]string{"mlx5_5", "mlx5_1"}, true, "mlx5_1 (NODE)"},
		{[]string{"mlx5_9", "mlx5_6"}, true, "mlx5_6 (SYS)"},
		{[]string{"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7"}, false, ""},
	} {
		f := FarNIC(NICChoice{GPU: "0000:18:00.0", Listed: tc.listed, Relations: rel})
		if (f != nil) != tc.fire {
			t.Errorf("listed %v: fired %v, want %v", tc.listed, f != nil, tc.fire)
			continue
		}
		if f != nil && (!strings.Contains(f.Summary, "uses "+tc.used+" while mlx5_0 (PIX) is closer")) {
			t.Errorf("listed %v: summary %q", tc.listed, f.Summary)
		}
		if f != nil && len(tc.listed) > 1 && !strings.Contains(strings.Join(f.Evidence, " "), "the transfer engine prefers the nearest") {
			t.Errorf("listed %v: evidence %q", tc.listed, f.Evidence)
		}
	}
	// Old-format Della sample: each GPU is NODE to one NIC, SYS to the other; no PIX/PXB NIC exists.
	if f := FarNIC(NICChoice{GPU: "GPU0", Listed: []string{"mlx5_1"}, Relations: map[string]topology.Relation{"mlx5_0": "NODE", "mlx5_1": "SYS"}}); f != nil {
		t.Errorf("fired with no PIX/PXB NIC available: %+v", f)
	}
	// Only PIX and PXB count as near; the device itself (X), NVLink (NV#)
	// and unknown strings rank neither near nor far.
	odd := map[string]topology.Relation{"mlx5_0": topology.RelSelf, "mlx5_1": "NV12", "mlx5_2": "??", "mlx5_3": topology.RelSYS, "mlx5_4": topology.RelPXB}
	for used, fire := range map[string]bool{"mlx5_0": false, "mlx5_1": false, "mlx5_2": false, "mlx5_3": true, "mlx5_4": false} {
		f := FarNIC(NICChoice{GPU: "GPU0", Listed: []string{used}, Relations: odd})
		if (f != nil) != fire {
			t.Errorf("used %s (%s): fired %v, want %v", used, odd[used], f != nil, fire)
		}
		if f != nil && (!strings.HasSuffix(f.Summary, "while mlx5_4 (PXB) is closer") || !strings.Contains(f.Summary, "mlx5_3 (SYS)")) {
			t.Errorf("summary %q", f.Summary)
		}
	}
	delete(odd, "mlx5_4")
	if f := FarNIC(NICChoice{GPU: "GPU0", Listed: []string{"mlx5_3"}, Relations: odd}); f != nil {
		t.Errorf("X, NV# or unknown taken as a closer NIC: %+v", f)
	}
}

func TestLinkDegraded(t *testing.T) {
	// rtx6000 is an RTX 6000 Ada in a Gen5 x16 root port
	// (lspci_vv/asus_esc8000a_e12_01_00.0: LnkCap 16GT/s x16, LnkSta
	// 2.5GT/s (downgraded) x16 at idle).
	rtx6000 := LinkFacts{DeviceGTs: 16, DeviceWidth: 16, SlotGTs: 32, SlotWidth: 16, IdleTrainsDown: true, Source: "sysfs"}
	with := func(l LinkFacts, f func(*LinkFacts)) LinkFacts { f(&l); return l }
	cases := []struct {
		name string
		l    LinkFacts
		want Severity // "" no finding
		text string   // in the summary
	}{
		{"idle GPU downclocked to Gen1", with(rtx6000, func(l *LinkFacts) { l.CurGTs, l.CurWidth = 2.5, 16 }), "", ""},
		{"idle GPU at Gen1 x8: idle width is not judged either",
			with(rtx6000, func(l *LinkFacts) { l.CurGTs, l.CurWidth = 2.5, 8 }), "", ""},
		{"GPU under load at its maximum", with(rtx6000, func(l *LinkFacts) { l.CurGTs, l.CurWidth, l.BusyBytesPerSec = 16, 16, 20e9 }), "", ""},
		{"GPU under load still at Gen1", with(rtx6000, func(l *LinkFacts) { l.CurGTs, l.CurWidth, l.BusyBytesPerSec = 2.5, 16, 3e9 }),
			SevFail, "2.5 GT/s of 16.0 while carrying 3.00 GB/s"},
		{"x16 card in an x16 slot trained x8 under load",
			with(rtx6000, func(l *LinkFacts) { l.SlotGTs, l.CurGTs, l.CurWidth, l.BusyBytesPerSec = 16, 16, 8, 12e9 }), SevFail, "x8 of x16"},
		{"traffic below the busy threshold is idle",
			with(rtx6000, func(l *LinkFacts) { l.CurGTs, l.CurWidth, l.BusyBytesPerSec = 2.5, 16, 50e6 }), "", ""},
		// The L4 of nvidia_smi_q/thamada_L4 (Max 16x, Current 8x, Gen4), here
		// in an x8 slot: the slot sets x8, nothing to reseat, idle or loaded.
		{"x16 card in an x8 slot, under load at x8",
			LinkFacts{DeviceGTs: 16, DeviceWidth: 16, SlotGTs: 16, SlotWidth: 8, CurGTs: 16, CurWidth: 8, BusyBytesPerSec: 10e9, IdleTrainsDown: true},
			SevInfo, "slot-limited: a Gen4 x16 device in a Gen4 x8 slot trains to Gen4 x8, 15.75 GB/s of the device's 31.51"},
		{"x16 card in an x8 slot, idle at Gen1 x8",
			LinkFacts{DeviceGTs: 16, DeviceWidth: 16, SlotGTs: 16, SlotWidth: 8, CurGTs: 2.5, CurWidth: 8, IdleTrainsDown: true}, SevInfo, "slot-limited"},
		{"x16 card in an x8 slot, x4 under load",
			LinkFacts{DeviceGTs: 16, DeviceWidth: 16, SlotGTs: 16, SlotWidth: 8, CurGTs: 16, CurWidth: 4, BusyBytesPerSec: 5e9, IdleTrainsDown: true},
			SevFail, "x4 of x8"},
		// sysfs_pci/prometheus-node_exporter_fixture: an NVMe capable of
		// 16 GT/s x4 under an 8 GT/s x8 root port runs at 8 GT/s x4.
		{"NVMe faster than its root port", LinkFacts{DeviceGTs: 16, DeviceWidth: 4, SlotGTs: 8, SlotWidth: 8, CurGTs: 8, CurWidth: 4},
			SevInfo, "slot-limited: a Gen4 x4 device in a Gen3 x8 slot"},
		// lspci_vv/asus_esc8000a_e12_71_00.0: LnkCap 5GT/s x2, LnkSta 5GT/s
		// x1 (downgraded): not a GPU, so its width is judged at any time.
		{"SSD controller x2 trained x1", LinkFacts{DeviceGTs: 5, DeviceWidth: 2, CurGTs: 5, CurWidth: 1}, SevFail, "x1 of x2"},
		// lspci_vv/asus_esc8000a_e12_21_00.0: ConnectX-7 32GT/s x16 both.
		{"healthy Gen5 x16 NIC", LinkFacts{DeviceGTs: 32, DeviceWidth: 16, SlotGTs: 32, SlotWidth: 16, CurGTs: 32, CurWidth: 16, BusyBytesPerSec: 40e9}, "", ""},
		// NVML alone (a GPU not in sysfs): its max is device and system.
		{"NVML's max, Gen3 under load", LinkFacts{DeviceGTs: 32, DeviceWidth: 16, CurGTs: 8, CurWidth: 16, BusyBytesPerSec: 4e9, IdleTrainsDown: true, Source: "nvml"},
			SevFail, "8.0 GT/s of 32.0"},
		{"virtual device, unknown link", LinkFacts{CurGTs: 2.5, CurWidth: 1}, "", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.l.Device = "gpu 0000:01:00.0"
			f := LinkDegraded(c.l)
			switch {
			case c.want == "" && f != nil:
				t.Fatalf("fired: %+v", f)
			case c.want == "":
			case f == nil:
				t.Fatalf("did not fire, want %s", c.want)
			case f.Severity != c.want || !strings.Contains(f.Summary, c.text) || f.Subject != c.l.Device || len(f.Evidence) != 2:
				t.Errorf("= %s %q (evidence %q), want %s containing %q", f.Severity, f.Summary, f.Evidence, c.want, c.text)
			}
		})
	}
}

func TestPinnedPressure(t *testing.T) {
	const gib = 1 << 30
	cases := []struct {
		name string
		p    PinnedFacts
		want Severity
	}{
		{"small pool", PinnedFacts{PinnedBytes: 8 * gib, MemTotal: 512 * gib, MemAvailable: 400 * gib}, ""},
		{"pool over half of RAM", PinnedFacts{PinnedBytes: 300 * gib, MemTotal: 512 * gib, MemAvailable: 150 * gib}, SevWarn},
		{"host nearly out", PinnedFacts{PinnedBytes: 200 * gib, MemTotal: 512 * gib, MemAvailable: 20 * gib}, SevFail},
		{"nothing pinned", PinnedFacts{MemTotal: 512 * gib, MemAvailable: 1 * gib}, ""},
	}
	for _, c := range cases {
		f := PinnedPressure(c.p)
		got := Severity("")
		if f != nil {
			got = f.Severity
		}
		if got != c.want {
			t.Errorf("%s: severity %q, want %q", c.name, got, c.want)
		}
	}
}

func TestIOMMUTranslated(t *testing.T) {
	cases := []struct {
		typ  string
		peer bool
		fire bool
	}{
		{"DMA", true, true}, {"DMA-FQ", true, true}, {"identity", true, false}, {"DMA", false, false}, {"", true, false},
	}
	for _, c := range cases {
		f := IOMMUTranslated(IOMMUFacts{Device: "GPU 0000:17:00.0", Group: 12, Type: c.typ, PeerExpected: c.peer})
		if (f != nil) != c.fire {
			t.Errorf("type %q peer %v: fired %v", c.typ, c.peer, f != nil)
		}
		if f != nil && !strings.Contains(f.Remediation, "Do not turn the IOMMU off blindly") {
			t.Errorf("remediation must warn against disabling the IOMMU: %q", f.Remediation)
		}
	}
}

func TestFragmentationAndHistogram(t *testing.T) {
	var h SizeHistogram
	for i := 0; i < 2048; i++ {
		h.Add(4096)
	}
	h.Add(5000)
	if h.Count() != 2049 || h.CountBelow(64<<10) != 2049 || h.Bytes() != 2048*4096+5000 || h.BytesBelow(4096) != 0 ||
		h.BytesBelow(8192) != 2048*4096+5000 || !strings.Contains(h.String(), "[4 KiB,8 KiB):2049") {
		t.Fatalf("histogram %v", h.String())
	}
	// hist adds n copies of each size, in turn.
	hist := func(n int, sizes ...uint64) SizeHistogram {
		var h SizeHistogram
		for range n {
			for _, s := range sizes {
				h.Add(s)
			}
		}
		return h
	}
	for _, tc := range []struct {
		name  string
		dir   string
		sizes SizeHistogram
		gbs   float64
		fire  bool
	}{
		{"many page-sized H2D copies", DirH2D, hist(2048, 4096), 0.4, true},
		{"many page-sized D2H copies (a write-back in pieces)", DirD2H, hist(2048, 4096), 0.4, true},
		{"1 MiB H2D copies", DirH2D, hist(2048, 1<<20), 0.4, false},
		{"one small copy", DirH2D, hist(1, 4096), 0.4, false},
		{"255 small copies: below the count", DirH2D, hist(255, 4096), 0.4, false},
		// by bytes, not by count: the copies that carry the bulk are judged
		{"many small copies beside large ones carrying the bytes", DirH2D, plusHist(hist(2048, 4096), hist(16, 4<<20)), 0.4, false},
		{"small copies carrying exactly half the bytes", DirH2D, plusHist(hist(512, 4096), hist(2, 1<<20)), 0.4, true},
		{"small copies carrying just under half", DirH2D, plusHist(hist(511, 4096), hist(2, 1<<20)), 0.4, false},
		// issue 20: a decode loop with a prefix-cache hit every 20 steps
		{"decode metadata beside layered loads", DirH2D, plusHist(hist(60, 64, 192, 384, 512), hist(48, 4<<20)), 1.0, false},
		// a decode loop alone: its inputs carry all the bytes, at a trickle
		{"decode metadata alone, 3000 steps", DirH2D, hist(3000, 64, 192, 384, 512), 0.0001, false},
		{"the same small copies moving 20 MB/s", DirH2D, hist(3000, 64, 192, 384, 512), 0.02, true},
		// .item() reads: 8-byte D2H copies are element reads, not pieces.
		{"element reads only", DirD2H, hist(4096, 8), 0.4, false},
		{"element reads do not fill a direction's count", DirD2H, plusHist(hist(4096, 8), hist(200, 4096)), 0.4, false},
		{"element reads beside pieces", DirD2H, plusHist(hist(4096, 8), hist(300, 4096)), 0.4, true},
		{"32-byte copies are pieces, not elements", DirH2D, hist(300, 32), 0.4, true},
		{"D2D copies stay in GPU memory", DirD2D, hist(2048, 4096), 0.4, false},
		{"unknown direction is not judged", DirUnknown, hist(2048, 4096), 0.4, false},
	} {
		f := Fragmentation(1, tc.dir, tc.sizes, tc.gbs)
		if (f != nil) != tc.fire {
			t.Errorf("%s: fired %v, want %v (%+v)", tc.name, f != nil, tc.fire, f)
			continue
		}
		if f != nil && (f.Rule != "fragmented-copies" || f.Subject != "pid 1 "+tc.dir || !strings.Contains(f.Summary, tc.dir+" copies")) {
			t.Errorf("%s: %+v", tc.name, f)
		}
	}
	f := Fragmentation(1, DirD2H, plusHist(hist(4096, 8), hist(300, 4096)), 0.1)
	if f == nil || !strings.Contains(f.Summary, "300 of 300 D2H copies") || !strings.Contains(strings.Join(f.Evidence, " "), "4096 element-sized copies") {
		t.Errorf("element reads must be counted apart: %+v", f)
	}
}

func plusHist(a, b SizeHistogram) SizeHistogram {
	for i := range a.n {
		a.n[i] += b.n[i]
		a.b[i] += b.b[i]
	}
	return a
}

// pageable-copy by bytes (issue 20), calibrated on real call streams:
// metadata-sized copies are INFO with their count; the share of the
// host↔GPU bytes larger pageable copies carried, above 16 MiB, decides.
func TestPageableCopies(t *testing.T) {
	for _, tc := range []struct {
		name string
		f    PageableFacts
		want Severity // "" none
	}{
		{"no pageable copy", PageableFacts{HostBytes: 1 << 30}, ""},
		// a real trace: 45 pageable H2D of 64-384 B beside 253 MB of pinned loads
		{"metadata beside pinned loads", PageableFacts{Metadata: 45, MetadataBytes: 45 * 224, HostBytes: 253e6 + 45*224}, SevInfo},
		// a decode loop alone: every host byte is pageable, all metadata-sized
		{"metadata alone", PageableFacts{Metadata: 12000, MetadataBytes: 12000 * 288, HostBytes: 12000 * 288}, SevInfo},
		// a real trace: 16 pageable H2D copies carrying 244 MB
		{"the bulk pageable", PageableFacts{Bulk: 16, BulkBytes: 244e6, Metadata: 40, MetadataBytes: 8000, HostBytes: 244e6 + 8000}, SevFail},
		{"pageable-load: 32 x 1 MiB", PageableFacts{Bulk: 32, BulkBytes: 32 << 20, HostBytes: 32 << 20}, SevFail},
		{"half the bytes", PageableFacts{Bulk: 32, BulkBytes: 32 << 20, HostBytes: 64 << 20}, SevFail},
		{"a fifth of the bytes", PageableFacts{Bulk: 32, BulkBytes: 32 << 20, HostBytes: 160 << 20}, SevWarn},
		{"a twentieth of the bytes", PageableFacts{Bulk: 32, BulkBytes: 32 << 20, HostBytes: 640 << 20}, SevInfo},
		{"all of it, under the floor", PageableFacts{Bulk: 3, BulkBytes: 3 * 256 << 10, HostBytes: 3 * 256 << 10}, SevInfo},
		// default-kind: two pageable copies, 2 MiB, half of its bytes
		{"half of a few MiB", PageableFacts{Bulk: 2, BulkBytes: 2 << 20, HostBytes: 4 << 20}, SevInfo},
		{"exactly the floor", PageableFacts{Bulk: 16, BulkBytes: 16 << 20, HostBytes: 16 << 20}, SevFail},
	} {
		tc.f.PID, tc.f.APIs = 1, []string{"cudaMemcpyAsync", "cudaMemcpyAsync"}
		f := PageableCopies(tc.f)
		switch {
		case tc.want == "" && f != nil, tc.want != "" && (f == nil || f.Severity != tc.want):
			t.Errorf("%s: %+v, want %q", tc.name, f, tc.want)
		case f != nil && (f.Rule != "pageable-copy" || !strings.Contains(strings.Join(f.Evidence, "; "), "APIs: cudaMemcpyAsync")):
			t.Errorf("%s: %+v", tc.name, f)
		}
	}
	f := PageableCopies(PageableFacts{PID: 1, Bulk: 32, BulkBytes: 32 << 20, HostBytes: 32 << 20})
	if f == nil || !strings.Contains(f.Summary, "32 copies (32 MiB, 100% of the host↔GPU bytes)") {
		t.Errorf("%+v", f)
	}
}

func TestSameDirectionOverlapDecision(t *testing.T) {
	// The seed's example: H2D and an RDMA receive on a 55 GB/s inbound lane.
	// (overlap_test.go measures the shapes; this is the decision alone.)
	base := Overlap{Segment: "link:0000:17:00.0", Direction: "down", Transfers: 2, DemandGBs: 55, CapacityGBs: 55,
		Flows: []string{"pid 1 stream 0x10 H2D", "pid 2 QP 7 WRITE_IMM"}, BusyNs: 10e6, ContendedNs: 8e6, WindowNs: 100e6}
	if f := SameDirectionOverlap(base); f == nil || !strings.Contains(strings.Join(f.Evidence, " "), "together 55.00 GB/s against 55.00 GB/s") ||
		!strings.Contains(strings.Join(f.Evidence, " "), "pid 2 QP 7 WRITE_IMM") {
		t.Errorf("saturated lane: %+v", f)
	}
	for name, o := range map[string]Overlap{
		"single flow":        {Transfers: 1, DemandGBs: 55, CapacityGBs: 55, BusyNs: 10e6, ContendedNs: 8e6},
		"lane not saturated": {Transfers: 2, DemandGBs: 5, CapacityGBs: 55, BusyNs: 10e6, ContendedNs: 8e6},
		"capacity unknown":   {Transfers: 2, DemandGBs: 55, BusyNs: 10e6, ContendedNs: 8e6},
		"brief overlap":      {Transfers: 2, DemandGBs: 55, CapacityGBs: 55, BusyNs: 10e6, ContendedNs: 2e6},
		"sliver of a window": {Transfers: 2, DemandGBs: 55, CapacityGBs: 55, BusyNs: 10e6, ContendedNs: 8e6, WindowNs: 10e9},
		"nothing in flight":  {Transfers: 2, DemandGBs: 55, CapacityGBs: 55},
	} {
		if f := SameDirectionOverlap(o); f != nil {
			t.Errorf("%s fired: %+v", name, f)
		}
	}
}

// The registry is complete and every rule function reports a registered
// rule: each name once, with severities, a checklist item, a remediation and
// where it is judged; the package makes findings of registry rules only
// (rules.go and the files of the larger rules: congestion.go, overlap.go).
func TestRuleRegistry(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	used := map[string]bool{}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range regexp.MustCompile(`newFinding\("([a-z-]+)"`).FindAllSubmatch(src, -1) {
			used[string(m[1])] = true
		}
	}
	seen := map[string]bool{}
	for _, r := range Rules {
		if seen[r.Name] || r.Name == "" || len(r.Severities) == 0 || r.Checklist == "" || r.Remediation == "" || r.Where == 0 {
			t.Errorf("registry entry %+v: duplicate or incomplete", r)
		}
		seen[r.Name] = true
		if !used[r.Name] {
			t.Errorf("rule %q is registered but rules.go never reports it", r.Name)
		}
	}
	for name := range used {
		if !seen[name] {
			t.Errorf("rules.go reports %q, which is not in Rules", name)
		}
	}
}
