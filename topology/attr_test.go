package topology

import (
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestLinkGBs(t *testing.T) {
	// Literal expectations, worked by hand: rate × efficiency × lanes / 8.
	want := map[float64][4]float64{ // widths 1, 4, 8, 16
		2.5: {0.25, 1, 2, 4},                             // 8b/10b
		5:   {0.5, 2, 4, 8},                              // 8b/10b
		8:   {0.984615, 3.938462, 7.876923, 15.753846},   // 128b/130b
		16:  {1.969231, 7.876923, 15.753846, 31.507692},  // 128b/130b
		32:  {3.938462, 15.753846, 31.507692, 63.015385}, // 128b/130b
		64:  {7.5625, 30.25, 60.5, 121},                  // FLIT 242/256
	}
	for gts, row := range want {
		for i, w := range []int{1, 4, 8, 16} {
			if got := LinkGBs(gts, w); math.Abs(got-row[i]) > 1e-6 {
				t.Errorf("LinkGBs(%v, x%d) = %.6f, want %.6f", gts, w, got, row[i])
			}
		}
	}
	if got := LinkGBs(32, 16); math.Abs(got-32*128.0/130*16/8) > 1e-12 {
		t.Errorf("Gen5 x16 = %v", got)
	}
	for _, c := range []struct {
		gts float64
		w   int
	}{{0, 16}, {32, 0}, {7, 16}, {32, -1}} {
		if got := LinkGBs(c.gts, c.w); got != 0 {
			t.Errorf("LinkGBs(%v, %d) = %v, want 0 (unknown)", c.gts, c.w, got)
		}
	}
	if g := Generation(64); g != 6 {
		t.Errorf("Generation(64) = %d", g)
	}
}

func TestParseLinkSpeed(t *testing.T) {
	tests := []struct {
		in    string
		gts   float64
		known bool
		err   bool
	}{
		{"32.0 GT/s PCIe", 32, true, false},
		{"16.0 GT/s PCIe", 16, true, false},
		{"8.0 GT/s PCIe", 8, true, false}, // prometheus node_exporter/procfs fixtures
		{"5.0 GT/s PCIe", 5, true, false},
		{"2.5 GT/s PCIe", 2.5, true, false},
		{"64.0 GT/s PCIe", 64, true, false},
		{"8 GT/s", 8, true, false}, // kernels before 4.17
		{"Unknown", 0, false, false},
		{"Unknown speed", 0, false, false},
		{"66 MHz PCI-X", 0, false, false},
		{"33 MHz PCI", 0, false, false},
		{"", 0, false, true},
		{"fast", 0, false, true},
		{"7.0 GT/s PCIe", 0, false, true},
		{"NaN GT/s PCIe", 0, false, true},
		{"32.0 GB/s", 0, false, true},
	}
	for _, tt := range tests {
		gts, known, err := ParseLinkSpeed(tt.in)
		if (err != nil) != tt.err || gts != tt.gts || known != tt.known {
			t.Errorf("ParseLinkSpeed(%q) = %v, %v, %v; want %v, %v, err %v", tt.in, gts, known, err, tt.gts, tt.known, tt.err)
		}
	}
}

func TestParseSmallAttrs(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want int
		err  bool
	}{{"16", 16, false}, {"4", 4, false}, {"0", 0, false}, {"33", 0, true}, {"-1", 0, true}, {"x16", 0, true}, {"", 0, true}} {
		got, err := ParseLinkWidth(tt.in)
		if (err != nil) != tt.err || got != tt.want {
			t.Errorf("ParseLinkWidth(%q) = %d, %v", tt.in, got, err)
		}
	}
	for _, tt := range []struct {
		in   string
		want int
		err  bool
	}{{"-1", -1, false}, {"0", 0, false}, {"1", 1, false}, {"-2", 0, true}, {"", 0, true}, {"one", 0, true}, {"65536", 0, true}} {
		got, err := ParseNUMANode(tt.in)
		if (err != nil) != tt.err || got != tt.want {
			t.Errorf("ParseNUMANode(%q) = %d, %v", tt.in, got, err)
		}
	}
	for _, tt := range []struct {
		in   string
		bits int
		want uint64
		err  bool
	}{
		{"0x030200", 24, 0x030200, false}, {"0x010802", 24, 0x010802, false}, {"0x060400", 24, 0x060400, false},
		{"0xffff00", 24, 0xffff00, false}, // virtio on this machine
		{"0x15b3", 16, 0x15b3, false}, {"0x10de", 16, 0x10de, false},
		{"0x1000000", 24, 0, true}, {"0x10000", 16, 0, true}, {"030200", 24, 0, true}, {"0x", 16, 0, true}, {"0xzz", 16, 0, true},
	} {
		got, err := parseHex(tt.in, tt.bits)
		if (err != nil) != tt.err || got != tt.want {
			t.Errorf("parseHex(%q, %d) = %#x, %v", tt.in, tt.bits, got, err)
		}
	}
	for _, s := range []string{"DMA", "DMA-FQ", "identity", "blocked", "unmanaged"} {
		if got, err := ParseIOMMUType(s); err != nil || got != s {
			t.Errorf("ParseIOMMUType(%q) = %q, %v", s, got, err)
		}
	}
	// A type a later kernel adds is kept; an empty or multi-word value is not a type.
	if got, err := ParseIOMMUType("DMA-NEW"); err != nil || got != "DMA-NEW" {
		t.Errorf("ParseIOMMUType(DMA-NEW) = %q, %v", got, err)
	}
	for _, bad := range []string{"", "DMA translated"} {
		if _, err := ParseIOMMUType(bad); err == nil {
			t.Errorf("ParseIOMMUType(%q): no error", bad)
		}
	}
	if d, err := ParseDistances("10 32"); err != nil || !reflect.DeepEqual(d, []int{10, 32}) {
		t.Errorf("ParseDistances = %v, %v", d, err)
	}
	for _, s := range []string{"", "10 x", "10 -1", "10 256"} {
		if _, err := ParseDistances(s); err == nil {
			t.Errorf("ParseDistances(%q): no error", s)
		}
	}
}

func TestParseCPUList(t *testing.T) {
	tests := []struct {
		in     string
		ranges [][2]int
		count  int
		err    bool
	}{
		{"0-47,96-143", [][2]int{{0, 47}, {96, 143}}, 96, false}, // HGX sample node 0
		{"0-63,128-191", [][2]int{{0, 63}, {128, 191}}, 128, false},
		{"70-99,102-107", [][2]int{{70, 99}, {102, 107}}, 36, false},
		{"0-1", [][2]int{{0, 1}}, 2, false}, // this machine
		{"5", [][2]int{{5, 5}}, 1, false},
		{"0,2,4", [][2]int{{0, 0}, {2, 2}, {4, 4}}, 3, false},
		{"", nil, 0, false}, // memory-only node
		{"3-1", nil, 0, true},
		{"0-", nil, 0, true},
		{"-3", nil, 0, true},
		{"0,,1", nil, 0, true},
		{"+1", nil, 0, true},
		{"0-99999999", nil, 0, true},
		{"a-b", nil, 0, true},
		// one parser (ktext.ParseList): out-of-order, overlapping and
		// adjacent ranges, which the kernel never writes, are normalised
		{"5,1-3,2", [][2]int{{1, 3}, {5, 5}}, 4, false},
		{"4-7,0-3", [][2]int{{0, 7}}, 8, false},
		{"65535", [][2]int{{65535, 65535}}, 1, false},
		{"65536", nil, 0, true}, // above ktext.ParseList's bound, below maxCPU
		{" 0-1", nil, 0, true},
		{"0-1\n", nil, 0, true},
		{"0 1", nil, 0, true},
	}
	for _, tt := range tests {
		got, err := ParseCPUList(tt.in)
		if (err != nil) != tt.err {
			t.Errorf("ParseCPUList(%q) err = %v, want err %v", tt.in, err, tt.err)
			continue
		}
		if err == nil && (!reflect.DeepEqual(got.Ranges, tt.ranges) || got.Count() != tt.count || got.Text != tt.in) {
			t.Errorf("ParseCPUList(%q) = %+v (count %d)", tt.in, got, got.Count())
		}
	}
}

func TestNaturalLess(t *testing.T) {
	if !naturalLess("mlx5_2", "mlx5_10") || naturalLess("mlx5_10", "mlx5_2") || !naturalLess("mlx4_0", "mlx5_0") || naturalLess("a", "a") {
		t.Error("naturalLess order wrong")
	}
}

// TestReadBadFiles: garbage in any attribute file is an error that names
// the file and line; missing files are not errors.
func TestReadBadFiles(t *testing.T) {
	base := func() fxHost {
		return fxHost{
			Nodes: []fxNode{{CPUs: "0-3", Distance: "10"}},
			Funcs: []fxFunc{
				{BDF: "0000:00:01.0", HB: "pci0000:00", Class: "0x060400", Vendor: "0x8086", Device: "0x1234", NUMA: "0",
					Cur: "16.0 GT/s PCIe", Max: "16.0 GT/s PCIe", CurW: "16", MaxW: "16"},
				{BDF: "0000:01:00.0", Parent: "0000:00:01.0", Class: "0x030200", Vendor: "0x10de", Device: "0x2330", NUMA: "0",
					Cur: "16.0 GT/s PCIe", Max: "16.0 GT/s PCIe", CurW: "16", MaxW: "16", IOMMU: 3},
			},
			IOMMUType: map[int]string{3: "DMA"},
		}
	}
	if _, err := Read(build(t, base())); err != nil {
		t.Fatalf("clean tree: %v", err)
	}
	tests := []struct {
		name, file string
		mutate     func(*fxHost)
	}{
		{"class", "0000:01:00.0/class", func(f *fxHost) { f.Funcs[1].Class = "VGA" }},
		{"vendor", "0000:01:00.0/vendor", func(f *fxHost) { f.Funcs[1].Vendor = "0x10de0" }},
		{"device", "0000:01:00.0/device", func(f *fxHost) { f.Funcs[1].Device = "nvidia" }},
		{"numa_node", "0000:01:00.0/numa_node", func(f *fxHost) { f.Funcs[1].NUMA = "zero" }},
		{"current_link_speed", "0000:01:00.0/current_link_speed", func(f *fxHost) { f.Funcs[1].Cur = "16 Gb/s" }},
		{"max_link_speed", "0000:00:01.0/max_link_speed", func(f *fxHost) { f.Funcs[0].Max = "fast" }},
		{"current_link_width", "0000:01:00.0/current_link_width", func(f *fxHost) { f.Funcs[1].CurW = "x16" }},
		{"max_link_width", "0000:01:00.0/max_link_width", func(f *fxHost) { f.Funcs[1].MaxW = "64" }},
		{"two lines", "0000:01:00.0/class", func(f *fxHost) { f.Funcs[1].Class = "0x030200\n0x030200" }},
		{"iommu type", "iommu_groups/3/type", func(f *fxHost) { f.IOMMUType[3] = "DMA translated" }},
		{"cpulist", "node0/cpulist", func(f *fxHost) { f.Nodes[0].CPUs = "3-0" }},
		{"distance", "node0/distance", func(f *fxHost) { f.Nodes[0].Distance = "ten" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fx := base()
			tt.mutate(&fx)
			_, err := Read(build(t, fx))
			if err == nil {
				t.Fatal("no error")
			}
			if !strings.Contains(err.Error(), tt.file) || !strings.Contains(err.Error(), "line 1") {
				t.Errorf("error %q does not name %s and line 1", err, tt.file)
			}
		})
	}
}

func TestReadMissingFilesAreUnknown(t *testing.T) {
	root := build(t, fxHost{Funcs: []fxFunc{{BDF: "0000:00:03.0", HB: "pci0000:00", Class: "0x020000", Cur: "Unknown", Max: "Unknown"}}})
	h, err := Read(root)
	if err != nil {
		t.Fatal(err)
	}
	f := h.Functions["0000:00:03.0"]
	wantMissing := []string{"vendor", "device", "numa_node", "current_link_width", "max_link_width"}
	if f.NUMANode != -1 || f.Link.Known || f.IOMMUGroup != -1 || f.Vendor != 0 || !reflect.DeepEqual(f.Missing, wantMissing) {
		t.Errorf("function = %+v, want unknowns and Missing %v", f, wantMissing)
	}
	if len(h.Nodes) != 0 {
		t.Errorf("nodes = %+v, want none (no node directory)", h.Nodes)
	}
}

func TestReadStructureErrors(t *testing.T) {
	// A copied tree with directories instead of bus/pci/devices symlinks
	// cannot be placed in the tree: say so, naming the entry.
	root := t.TempDir()
	mkdir(t, filepath.Join(root, "bus", "pci", "devices", "0000:00:01.0"))
	if _, err := Read(root); err == nil || !strings.Contains(err.Error(), "0000:00:01.0") {
		t.Errorf("directory instead of symlink: err = %v", err)
	}
	// A link whose target has no host bridge component.
	root = t.TempDir()
	mkdir(t, filepath.Join(root, "devices", "platform", "0000:00:01.0"))
	symlinkRel(t, filepath.Join(root, "devices", "platform", "0000:00:01.0"), filepath.Join(root, "bus", "pci", "devices", "0000:00:01.0"))
	if _, err := Read(root); err == nil || !strings.Contains(err.Error(), "host bridge") {
		t.Errorf("no host bridge: err = %v", err)
	}
	// An RDMA device pointing at a function that is not listed.
	root = build(t, fxHost{Funcs: []fxFunc{{BDF: "0000:00:01.0", HB: "pci0000:00", Class: "0x020000"}}})
	mkdir(t, filepath.Join(root, "class", "infiniband", "mlx5_9"))
	mkdir(t, filepath.Join(root, "devices", "pci0000:00", "0000:00:02.0"))
	symlinkRel(t, filepath.Join(root, "devices", "pci0000:00", "0000:00:02.0"), filepath.Join(root, "class", "infiniband", "mlx5_9", "device"))
	if _, err := Read(root); err == nil || !strings.Contains(err.Error(), "mlx5_9") {
		t.Errorf("dangling RDMA device: err = %v", err)
	}
	// A soft RDMA device (rxe) has no PCI function: kept with "".
	root = build(t, fxHost{Funcs: []fxFunc{{BDF: "0000:00:01.0", HB: "pci0000:00", Class: "0x020000"}}})
	mkdir(t, filepath.Join(root, "class", "infiniband", "rxe0"))
	h, err := Read(root)
	if err != nil {
		t.Fatal(err)
	}
	if bdf, ok := h.RDMA["rxe0"]; !ok || bdf != "" || len(h.NearestRDMA()) != 0 {
		t.Errorf("rxe0: RDMA = %v", h.RDMA)
	}
}

// TestReadThisMachine reads the real /sys, whatever it holds: every
// function placed, the GPUs /sys has in the matrix. Skipped only where /sys
// has no PCI.
func TestReadThisMachine(t *testing.T) {
	if _, err := os.Stat("/sys/bus/pci/devices"); err != nil {
		t.Skip("no /sys/bus/pci on this host")
	}
	h, err := Read("/sys")
	if err != nil {
		t.Fatal(err)
	}
	if len(h.Functions) == 0 {
		t.Error("no PCI functions")
	}
	if _, ok := h.Node(0); !ok {
		t.Error("node 0 missing")
	}
	for bdf, f := range h.Functions {
		if f.HostBridge == "" || len(f.Chain) == 0 || f.Chain[len(f.Chain)-1] != bdf {
			t.Errorf("%s not placed: %+v", bdf, f)
		}
	}
	// What the machine has is read here from /sys itself, not from the
	// tree: GPUs are the functions of class 0x0300/0x0302, RDMA devices
	// the entries of class/infiniband.
	classes, err := filepath.Glob("/sys/bus/pci/devices/*/class")
	if err != nil {
		t.Fatal(err)
	}
	gpus := 0
	for _, c := range classes {
		b, err := os.ReadFile(c)
		if err != nil {
			t.Fatal(err)
		}
		if s := strings.TrimSpace(string(b)); strings.HasPrefix(s, "0x0300") || strings.HasPrefix(s, "0x0302") {
			gpus++
		}
	}
	ib, err := os.ReadDir("/sys/class/infiniband")
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	m := h.Matrix()
	inMatrix := 0
	for _, d := range m.Devices {
		if d.Kind == KindGPU {
			inMatrix++
		}
	}
	if inMatrix != gpus {
		t.Errorf("%d GPUs in the matrix, /sys has %d", inMatrix, gpus)
	}
	if n := h.NearestRDMA(); n == nil || (len(ib) == 0 && len(n) != 0) {
		t.Errorf("NearestRDMA = %v with %d RDMA devices in /sys/class/infiniband", n, len(ib))
	}
	var sb strings.Builder
	if err := m.WriteText(&sb); err != nil {
		t.Fatal(err)
	}
}

func TestAddressForms(t *testing.T) {
	for s, want := range map[string]bool{"0000:17:00.0": true, "10000:e1:1f.7": true, "0000:17:00.8": false,
		"0000:17:00": false, "0000:1G:00.0": false, "000:17:00.0": false, "0000:17:00.0 ": false,
		"0000:1a:00.0": true, "0000:1A:00.0": false, "0000:17:0a.0": true, "0000:17:0A.0": false, "000a:17:00.0": true, "000A:17:00.0": false} {
		if isBDF(s) != want {
			t.Errorf("isBDF(%q) = %v", s, !want)
		}
	}
	for s, want := range map[string]bool{"pci0000:17": true, "pci10000:00": true, "pci0000:1": false, "pcix0000:17": false, "pci0000:17:00.0": false, "0000:17:00.0": false,
		"pci0000:1a": true, "pci0000:1A": false, "pci000A:17": false} {
		if isHostBridge(s) != want {
			t.Errorf("isHostBridge(%q) = %v", s, !want)
		}
	}
}
