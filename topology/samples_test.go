package topology

import (
	"bytes"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// Dell DCS8000Z (hwloc test capture): 2 sockets; I350 dual port under root
// port 00:01.1, Intel NVMe 00:02.0 integrated on the root bus with
// numa_node -1, ASPEED BMC VGA behind two bridges, ConnectX-3 VPI (class
// 0x0280) with mlx4_0 on node 1.
func TestDellFromHwloc(t *testing.T) {
	h := readFixture(t, dellHost(t))
	if n := len(h.Functions); n != 137 {
		t.Errorf("functions = %d, want 137", n)
	}
	cx3 := h.Functions["0000:82:00.0"]
	if cx3.Kind() != KindNIC || cx3.NUMANode != 1 || cx3.Parent != "0000:80:02.2" || cx3.HostBridge != "pci0000:80" ||
		!reflect.DeepEqual(cx3.RDMADevs, []string{"mlx4_0"}) || !reflect.DeepEqual(cx3.NetDevs, []string{"ib0"}) {
		t.Errorf("ConnectX-3 = %+v", cx3)
	}
	nvme := h.Functions["0000:00:02.0"]
	if nvme.Kind() != KindNVMe || nvme.NUMANode != -1 || nvme.Parent != "" || nvme.HostBridge != "pci0000:00" {
		t.Errorf("NVMe = %+v", nvme)
	}
	vga := h.Functions["0000:05:00.0"]
	if vga.Kind() != KindOther || !reflect.DeepEqual(vga.Chain, []string{"0000:00:1c.0", "0000:04:00.0", "0000:05:00.0"}) {
		t.Errorf("ASPEED VGA = %+v (kind %s), want other behind two bridges", vga, vga.Kind())
	}
	if len(h.BDFs(KindGPU)) != 0 {
		t.Errorf("GPUs = %v, want none (BMC VGA is not a GPU)", h.BDFs(KindGPU))
	}
	rel := []struct {
		a, b string
		want Relation
	}{
		{"0000:02:00.0", "0000:02:00.3", RelPIX}, // two ports of one I350 under one root port
		{"0000:02:00.0", "0000:00:02.0", RelPHB}, // root port vs root-bus NVMe
		{"0000:02:00.0", "0000:05:00.0", RelPHB},
		{"0000:04:00.0", "0000:05:00.0", RelPIX}, // bridge and the device under it
		{"0000:82:00.0", "0000:83:00.0", RelPHB}, // CX-3 vs Xeon Phi, different root ports
		{"0000:82:00.0", "0000:02:00.0", RelSYS}, // node 1 vs node 0
		{"0000:82:00.0", "0000:00:02.0", RelSYS}, // NVMe node unknown on a 2-node host: farther answer
		{"0000:00:02.0", "0000:7f:08.0", RelSYS},
		{"0000:82:00.0", "0000:82:00.0", RelSelf},
		{"0000:82:00.0", "0000:99:00.0", ""},
	}
	for _, r := range rel {
		if got := h.Relation(r.a, r.b); got != r.want {
			t.Errorf("Relation(%s, %s) = %q, want %q", r.a, r.b, got, r.want)
		}
		if got := h.Relation(r.b, r.a); got != r.want {
			t.Errorf("Relation(%s, %s) = %q, want %q (symmetry)", r.b, r.a, got, r.want)
		}
	}
	m := h.Matrix()
	var names []string
	for _, d := range m.Devices {
		names = append(names, d.Name+"="+nicLabel(d))
	}
	want := []string{"NIC0=mlx4_0", "NIC1=eth0", "NIC2=eth1", "NVME0=0000:00:02.0"}
	if !reflect.DeepEqual(names, want) {
		t.Errorf("matrix devices = %v, want %v", names, want)
	}
	var buf bytes.Buffer
	if err := m.WriteText(&buf); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"\tNIC0\tNIC1\tNIC2\tNVME0\n", "NIC1\tSYS\t X \tPIX\tPHB\n", "  NIC1: eth0\n", "NVMe Legend:\n\n  NVME0: 0000:00:02.0\n"} {
		if !strings.Contains(buf.String(), w) {
			t.Errorf("text lacks %q:\n%s", w, buf.String())
		}
	}
	// The NVMe's node is unknown: a read into node 1's memory cannot tell
	// whether it crosses the socket, and says so.
	p, err := h.NVMeToHost("0000:00:02.0", 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Unknown) != 1 || p.Bottleneck != -1 || !reflect.DeepEqual(segNames(p),
		[]string{"link:0000:00:02.0/up", "hostbridge:pci0000:00/up", "dram:node1/write"}) {
		t.Errorf("NVMe path = %+v", p)
	}
}

// node_exporter fixture: NVMe max 16 GT/s x4 under an AMD root port whose
// max is 8 GT/s (x8 wide, x4 trained): the link runs at 8 GT/s x4 and that
// is its max too, not a fault. I350 on a root port with no link files.
func TestNodeExporterFixture(t *testing.T) {
	root := materialise(t, filepath.Join(samples, "sysfs_pci", "prometheus-node_exporter_fixture_pci_nvme_rootport_i350.txt"))
	h, err := Read(filepath.Join(root, "sys"))
	if err != nil {
		t.Fatal(err)
	}
	nvme := h.Functions["0000:01:00.0"]
	wantLink := Link{CurSpeedGTs: 8, MaxSpeedGTs: 16, CurWidth: 4, MaxWidth: 4, Known: true}
	if nvme.Kind() != KindNVMe || nvme.Link != wantLink || nvme.NUMANode != -1 || nvme.IOMMUGroup != 11 ||
		nvme.IOMMUType != "" || nvme.Vendor != 0xc0a9 || nvme.Parent != "0000:00:02.1" {
		t.Errorf("NVMe = %+v", nvme)
	}
	if !contains(nvme.Missing, "iommu_groups/11/type") {
		t.Errorf("missing iommu type not flagged: %v", nvme.Missing)
	}
	p, err := h.NVMeToHost("0000:01:00.0", 0)
	if err != nil {
		t.Fatal(err)
	}
	s := p.Segments[0]
	if s.Name != "link:0000:01:00.0" || !near(s.CapacityGBs, 3.938) || !near(s.CurrentGBs, 3.938) || p.Bottleneck != 0 {
		t.Errorf("NVMe link = %+v (bottleneck %d), want 3.938 GB/s now and at best (root port caps it)", s, p.Bottleneck)
	}
	nic := h.Functions["0000:45:00.0"]
	if nic.Kind() != KindNIC || nic.NUMANode != 0 || !near(nic.Link.CurGBs(), 2) || nic.HostBridge != "pci0000:40" {
		t.Errorf("I350 = %+v", nic)
	}
	rp := h.Functions["0000:40:01.3"]
	if rp.Link.Known || rp.NUMANode != -1 || !contains(rp.Missing, "current_link_speed") {
		t.Errorf("root port without link files = %+v", rp)
	}
	// NVMe numa -1, no node directory in the fixture: unknown, one node at
	// most, so NODE rather than a guessed SYS.
	if r := h.Relation("0000:01:00.0", "0000:45:00.0"); r != RelNODE {
		t.Errorf("NVMe-I350 = %s, want NODE", r)
	}
}

// procfs fixture: same NVMe (here max 8 GT/s itself), E810 directly on host
// bridge pci0000:a2 on node 1 without an iommu_group.
func TestProcfsFixture(t *testing.T) {
	root := materialise(t, filepath.Join(samples, "sysfs_pci", "prometheus-procfs_fixture_pci_nvme_rootport_e810.txt"))
	h, err := Read(filepath.Join(root, "sys"))
	if err != nil {
		t.Fatal(err)
	}
	e810 := h.Functions["0000:a2:00.0"]
	if e810.Kind() != KindNIC || e810.NUMANode != 1 || e810.IOMMUGroup != -1 || e810.Parent != "" ||
		e810.Link != (Link{16, 16, 8, 8, true}) || !near(e810.Link.CurGBs(), 15.754) {
		t.Errorf("E810 = %+v", e810)
	}
	if r := h.Relation("0000:01:00.0", "0000:00:02.1"); r != RelPIX {
		t.Errorf("NVMe-root port = %s, want PIX", r)
	}
	p, err := h.DeviceToDevice("0000:01:00.0", "0000:a2:00.0")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"link:0000:01:00.0/up", "hostbridge:pci0000:00/up", "hostbridge:pci0000:a2/down", "link:0000:a2:00.0/down"}
	if !reflect.DeepEqual(segNames(p), want) || p.Bottleneck != 0 || len(p.Unknown) != 0 {
		t.Errorf("NVMe→E810 = %q bottleneck %d unknown %v", segNames(p), p.Bottleneck, p.Unknown)
	}
}

// asusHost is the ASUS ESC8000A-E12 (2× EPYC 9374F, numactl: nodes 0-31 /
// 32-63, distance 32) from its lspci -vvv captures: RTX 6000 Ada at 01, 41
// (node 0) and c1, e1 (node 1), idle at 2.5 GT/s under a 16 GT/s cap;
// ConnectX-7 at 21 (node 0) and 81 (node 1), Gen5 x16; HighPoint SSD7540
// at 71 and b1 trained x1 of x2 at 5 GT/s. EPYC gives every quadrant its
// own host bridge (bus ranges of 0x20): the root port BDFs and IDs not in
// the capture (10de:26b1, 15b3:1021, 1103:7540) are filled in.
func asusHost() fxHost {
	fx := fxHost{Nodes: []fxNode{{CPUs: "0-31", Distance: "10 32"}, {CPUs: "32-63", Distance: "32 10"}}}
	type ep struct {
		bus, class, vendor, device, node, cur, max, curW, maxW string
		rdma                                                   []string
	}
	for _, e := range []ep{
		{"01", "0x030000", "0x10de", "0x26b1", "0", "2.5 GT/s PCIe", "16.0 GT/s PCIe", "16", "16", nil},
		{"21", "0x020000", "0x15b3", "0x1021", "0", "32.0 GT/s PCIe", "32.0 GT/s PCIe", "16", "16", []string{"mlx5_0"}},
		{"41", "0x030000", "0x10de", "0x26b1", "0", "2.5 GT/s PCIe", "16.0 GT/s PCIe", "16", "16", nil},
		{"71", "0x010400", "0x1103", "0x7540", "0", "5.0 GT/s PCIe", "5.0 GT/s PCIe", "1", "2", nil},
		{"81", "0x020000", "0x15b3", "0x1021", "1", "32.0 GT/s PCIe", "32.0 GT/s PCIe", "16", "16", []string{"mlx5_1"}},
		{"b1", "0x010400", "0x1103", "0x7540", "1", "5.0 GT/s PCIe", "5.0 GT/s PCIe", "1", "2", nil},
		{"c1", "0x030000", "0x10de", "0x26b1", "1", "2.5 GT/s PCIe", "16.0 GT/s PCIe", "16", "16", nil},
		{"e1", "0x030000", "0x10de", "0x26b1", "1", "2.5 GT/s PCIe", "16.0 GT/s PCIe", "16", "16", nil},
	} {
		hbBus := e.bus[:1] + "0"
		rp := "0000:" + hbBus + ":01.1"
		fx.Funcs = append(fx.Funcs,
			fxFunc{BDF: rp, HB: "pci0000:" + hbBus, Class: "0x060400", Vendor: "0x1022", Device: "0x14ab", NUMA: e.node,
				Cur: e.cur, Max: "32.0 GT/s PCIe", CurW: e.curW, MaxW: "16"},
			fxFunc{BDF: "0000:" + e.bus + ":00.0", Parent: rp, Class: e.class, Vendor: e.vendor, Device: e.device, NUMA: e.node,
				Cur: e.cur, Max: e.max, CurW: e.curW, MaxW: e.maxW, RDMA: e.rdma})
	}
	return fx
}

func TestASUS(t *testing.T) {
	h := readFixture(t, asusHost())
	if got := h.BDFs(KindGPU); !reflect.DeepEqual(got, []string{"0000:01:00.0", "0000:41:00.0", "0000:c1:00.0", "0000:e1:00.0"}) {
		t.Errorf("GPUs = %v", got)
	}
	if got := h.NearestRDMA(); !reflect.DeepEqual(got, map[string]string{"0": "mlx5_0", "1": "mlx5_0", "2": "mlx5_1", "3": "mlx5_1"}) {
		t.Errorf("NearestRDMA = %v", got)
	}
	for _, r := range []struct {
		a, b string
		want Relation
	}{
		{"0000:01:00.0", "0000:21:00.0", RelNODE},
		{"0000:01:00.0", "0000:81:00.0", RelSYS},
		{"0000:c1:00.0", "0000:e1:00.0", RelNODE},
		{"0000:01:00.0", "0000:00:01.1", RelPIX},
	} {
		if got := h.Relation(r.a, r.b); got != r.want {
			t.Errorf("Relation(%s, %s) = %s, want %s", r.a, r.b, got, r.want)
		}
	}
	// Idle GPU (LnkSta 2.5GT/s (downgraded)): it reads Gen1 x16 (4 GB/s)
	// now, and its capacity is what it trains to, Gen4 x16; the root port
	// above (Gen5 x16) does not bound it.
	p, err := h.HostToDevice(0, "0000:01:00.0")
	if err != nil {
		t.Fatal(err)
	}
	l := p.Segments[p.Bottleneck]
	if l.Name != "link:0000:01:00.0" || !near(l.CapacityGBs, 31.508) || !near(l.CurrentGBs, 4) {
		t.Errorf("idle GPU bottleneck = %+v", l)
	}
	// Remote GPU DMA over xGMI: the socket segment, flowing node 0 → 1.
	p, err = h.HostToDevice(0, "0000:c1:00.0", PathOptions{SocketGBs: 64})
	if err != nil {
		t.Fatal(err)
	}
	if p.Segments[1].Name != "socket:node0-node1" || p.Segments[1].Dir != "node0->node1" || p.Segments[1].CapacityGBs != 64 {
		t.Errorf("remote H2D = %+v", p.Segments)
	}
	// The SSD7540 trained x1: 0.5 GB/s now, 1 GB/s at its x2 max.
	ssd := h.Functions["0000:71:00.0"]
	if ssd.Kind() != KindOther || !near(ssd.Link.CurGBs(), 0.5) || !near(ssd.Link.MaxGBs(), 1) {
		t.Errorf("SSD7540 = %+v kind %s", ssd.Link, ssd.Kind())
	}
	// H2D into GPU0 and RDMA receive into it from the NIC on another host
	// bridge both come down GPU0's link.
	h2d, _ := h.HostToDevice(0, "0000:01:00.0")
	recv, err := h.DeviceToDevice("0000:21:00.0", "0000:01:00.0")
	if err != nil {
		t.Fatal(err)
	}
	got := Conflict(h2d, recv)
	if len(got) != 2 || got[0].Name != "hostbridge:pci0000:00" || got[1].Name != "link:0000:01:00.0" {
		t.Errorf("Conflict = %+v", got)
	}
}

func contains(s []string, x string) bool {
	for _, v := range s {
		if v == x {
			return true
		}
	}
	return false
}
