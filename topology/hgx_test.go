package topology

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// hgxHost is the HGX H100 8-GPU/8-NIC machine of
// topo_m/sglang-issue-30401_*: two sockets (CPUs 0-47,96-143 and
// 48-95,144-191); per GPU one PCIe switch (root port → upstream port →
// two downstream ports) holding the GPU and its ConnectX-7. The sample
// shows every GPU/NIC pair within a socket as NODE, never PHB, so each
// switch sits under its own host bridge: four per socket, as on Sapphire
// Rapids, where every IIO stack is a host bridge. Bus numbers are
// illustrative. GPU3's link trained at Gen4 under its Gen5 switch.
func hgxHost() fxHost {
	fx := fxHost{
		Nodes:     []fxNode{{CPUs: "0-47,96-143", Distance: "10 21"}, {CPUs: "48-95,144-191", Distance: "21 10"}},
		IOMMUType: map[int]string{},
	}
	gen5 := "32.0 GT/s PCIe"
	for i, bus := range []int{0x15, 0x37, 0x48, 0x59, 0x97, 0xb7, 0xc8, 0xd9} {
		node := fmt.Sprint(i / 4)
		b := func(off, dev int) string { return fmt.Sprintf("0000:%02x:%02x.0", bus+off, dev) }
		rp, usp, dsp1, dsp2 := b(0, 1), b(1, 0), b(2, 0), b(2, 1)
		nic, gpu := b(3, 0), b(4, 0)
		bridge := func(bdf, parent string) fxFunc {
			return fxFunc{BDF: bdf, Parent: parent, Class: "0x060400", Vendor: "0x1000", Device: "0xc030",
				NUMA: node, Cur: gen5, Max: gen5, CurW: "16", MaxW: "16"}
		}
		r := bridge(rp, "")
		r.HB, r.Vendor, r.Device = fmt.Sprintf("pci0000:%02x", bus), "0x8086", "0x352a"
		gpuCur := gen5
		if i == 3 {
			gpuCur = "16.0 GT/s PCIe"
		}
		d2 := bridge(dsp2, usp)
		d2.Cur = gpuCur // a port reports the same link as the device below it
		fx.Funcs = append(fx.Funcs, r, bridge(usp, rp), bridge(dsp1, usp), d2,
			fxFunc{BDF: nic, Parent: dsp1, Class: "0x020700", Vendor: "0x15b3", Device: "0x1021", NUMA: node,
				Cur: gen5, Max: gen5, CurW: "16", MaxW: "16", IOMMU: 2*i + 1,
				Net: []string{fmt.Sprintf("ibp%ds0", bus+3)}, RDMA: []string{fmt.Sprintf("mlx5_%d", i)}},
			fxFunc{BDF: gpu, Parent: dsp2, Class: "0x030200", Vendor: "0x10de", Device: "0x2330", NUMA: node,
				Cur: gpuCur, Max: gen5, CurW: "16", MaxW: "16", IOMMU: 2*i + 2},
		)
		fx.IOMMUType[2*i+1], fx.IOMMUType[2*i+2] = "identity", "DMA-FQ"
	}
	return fx
}

func readFixture(t *testing.T, fx fxHost) *Host {
	t.Helper()
	h, err := Read(build(t, fx))
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// sampleMatrix reads the relation cells of a topo -m sample: row name →
// column name → cell. Kept minimal on purpose: the real parser lives in
// nvsmi*.go; this only needs the one sample's layout.
// isDevName matches topo -m device columns: GPU0, NIC0, mlx5_0.
func isDevName(s string) bool {
	for _, p := range []string{"GPU", "NIC", "mlx5_"} {
		if n, ok := strings.CutPrefix(s, p); ok && n != "" && strings.Trim(n, "0123456789") == "" {
			return true
		}
	}
	return false
}

func sampleMatrix(t *testing.T, name string) map[string]map[string]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(samples, "topo_m", name))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	cols := strings.Fields(lines[0])
	var names []string
	for _, c := range cols {
		if isDevName(c) {
			names = append(names, c)
		}
	}
	out := map[string]map[string]string{}
	for _, l := range lines[1:] {
		f := strings.Fields(l)
		if len(f) < len(names)+1 || !isDevName(f[0]) {
			continue
		}
		out[f[0]] = map[string]string{}
		for j, n := range names {
			out[f[0]][n] = f[j+1]
		}
	}
	if len(out) != len(names) {
		t.Fatalf("%s: %d rows for %d columns", name, len(out), len(names))
	}
	return out
}

func TestHGXMatrixMatchesSample(t *testing.T) {
	h := readFixture(t, hgxHost())
	m := h.Matrix()
	want := sampleMatrix(t, "sglang-issue-30401_8xH100_8xmlx5_2numa_spaces.txt")
	if len(m.Devices) != 16 {
		t.Fatalf("devices = %d, want 16: %+v", len(m.Devices), m.Devices)
	}
	for i, a := range m.Devices {
		for j, b := range m.Devices {
			got, w := m.Relations[i][j], want[a.Name][b.Name]
			if strings.HasPrefix(w, "NV") {
				// NVLink is not in sysfs: the PCIe relation between GPUs
				// is NODE within a socket, SYS across.
				w = "SYS"
				if a.NUMANode == b.NUMANode {
					w = "NODE"
				}
			}
			if string(got) != w {
				t.Errorf("%s-%s = %s, want %s", a.Name, b.Name, got, w)
			}
		}
	}
	for i, d := range m.Devices[:8] {
		wantCPU := []string{"0-47,96-143", "48-95,144-191"}[i/4]
		if d.CPUAffinity != wantCPU || d.NUMANode != i/4 {
			t.Errorf("%s affinity %q node %d, want %q node %d", d.Name, d.CPUAffinity, d.NUMANode, wantCPU, i/4)
		}
	}
	for i, d := range m.Devices[8:] {
		if d.RDMA != fmt.Sprintf("mlx5_%d", i) || d.Name != fmt.Sprintf("NIC%d", i) {
			t.Errorf("NIC column %d = %+v", i, d)
		}
	}
}

func TestHGXNearestRDMA(t *testing.T) {
	h := readFixture(t, hgxHost())
	got, err := json.Marshal(h.NearestRDMA())
	if err != nil {
		t.Fatal(err)
	}
	want := `{"0":"mlx5_0","1":"mlx5_1","2":"mlx5_2","3":"mlx5_3","4":"mlx5_4","5":"mlx5_5","6":"mlx5_6","7":"mlx5_7"}`
	if string(got) != want {
		t.Errorf("NearestRDMA = %s, want %s", got, want)
	}
}

// Every GPU's row of RDMA relations is the sample's; a device not in the
// tree has every relation unknown, and a host without RDMA none.
func TestHGXRDMARelations(t *testing.T) {
	h := readFixture(t, hgxHost())
	want := sampleMatrix(t, "sglang-issue-30401_8xH100_8xmlx5_2numa_spaces.txt")
	for i, gpu := range h.BDFs(KindGPU) {
		got := h.RDMARelations(gpu)
		if len(got) != 8 {
			t.Fatalf("GPU%d: %d RDMA devices, want 8: %v", i, len(got), got)
		}
		for n := range 8 {
			if w := want[fmt.Sprintf("GPU%d", i)][fmt.Sprintf("NIC%d", n)]; string(got[fmt.Sprintf("mlx5_%d", n)]) != w {
				t.Errorf("GPU%d-mlx5_%d = %s, want %s", i, n, got[fmt.Sprintf("mlx5_%d", n)], w)
			}
		}
	}
	for name, rel := range h.RDMARelations("0000:ee:00.0") {
		if rel != "" {
			t.Errorf("a device not in the tree is %s to %s", rel, name)
		}
	}
	if got := (&Host{Functions: h.Functions, RDMA: map[string]string{"rxe0": ""}}).RDMARelations(h.BDFs(KindGPU)[0]); len(got) != 0 {
		t.Errorf("a soft device (no PCI function) listed: %v", got)
	}
}

func TestHGXRead(t *testing.T) {
	h := readFixture(t, hgxHost())
	if n := len(h.Functions); n != 48 {
		t.Errorf("functions = %d, want 48", n)
	}
	g := h.Functions["0000:5d:00.0"] // GPU3
	want := &Function{BDF: "0000:5d:00.0", Class: 0x030200, Vendor: 0x10de, Device: 0x2330, NUMANode: 0,
		Parent: "0000:5b:01.0", HostBridge: "pci0000:59",
		Chain:      []string{"0000:59:01.0", "0000:5a:00.0", "0000:5b:01.0", "0000:5d:00.0"},
		Link:       Link{CurSpeedGTs: 16, MaxSpeedGTs: 32, CurWidth: 16, MaxWidth: 16, Known: true},
		IOMMUGroup: 8, IOMMUType: "DMA-FQ", dir: g.dir}
	if !reflect.DeepEqual(g, want) {
		t.Errorf("GPU3 =\n%+v\nwant\n%+v", g, want)
	}
	nic := h.Functions["0000:18:00.0"]
	if nic.Kind() != KindNIC || !reflect.DeepEqual(nic.RDMADevs, []string{"mlx5_0"}) ||
		!reflect.DeepEqual(nic.NetDevs, []string{"ibp24s0"}) || nic.IOMMUType != "identity" {
		t.Errorf("NIC0 = %+v", nic)
	}
	if h.RDMA["mlx5_7"] != "0000:dc:00.0" {
		t.Errorf("RDMA[mlx5_7] = %q", h.RDMA["mlx5_7"])
	}
	n1, ok := h.Node(1)
	if !ok || n1.CPUs.Count() != 96 || !n1.CPUs.Contains(150) || n1.CPUs.Contains(100) ||
		!reflect.DeepEqual(n1.Distances, []int{21, 10}) {
		t.Errorf("node1 = %+v", n1)
	}
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-3 }

func segNames(p Path) []string {
	var out []string
	for _, s := range p.Segments {
		out = append(out, s.Name+"/"+s.Dir)
	}
	return out
}

func TestHGXPaths(t *testing.T) {
	h := readFixture(t, hgxHost())
	const gpu0, nic0, gpu3, nic1, gpu4 = "0000:19:00.0", "0000:18:00.0", "0000:5d:00.0", "0000:3a:00.0", "0000:9b:00.0"
	opt := PathOptions{DRAMGBs: map[int]float64{0: 300, 1: 300}, SocketGBs: 40}
	tests := []struct {
		name    string
		build   func() (Path, error)
		segs    []string
		neck    int
		neckGBs float64
	}{
		{"H2D local", func() (Path, error) { return h.HostToDevice(0, gpu0, opt) },
			[]string{"dram:node0/read", "hostbridge:pci0000:15/down", "link:0000:16:00.0/down", "link:0000:19:00.0/down"},
			2, 63.015},
		{"H2D remote node", func() (Path, error) { return h.HostToDevice(1, gpu0, opt) },
			[]string{"dram:node1/read", "socket:node0-node1/node1->node0", "hostbridge:pci0000:15/down", "link:0000:16:00.0/down", "link:0000:19:00.0/down"},
			1, 40},
		{"D2H local", func() (Path, error) { return h.DeviceToHost(gpu0, 0, opt) },
			[]string{"link:0000:19:00.0/up", "link:0000:16:00.0/up", "hostbridge:pci0000:15/up", "dram:node0/write"},
			0, 63.015},
		// GPU3 reads Gen4 now; its capacity is what it trains to, Gen5.
		{"H2D to GPU3 (Gen4 now)", func() (Path, error) { return h.HostToDevice(0, gpu3) },
			[]string{"dram:node0/read", "hostbridge:pci0000:59/down", "link:0000:5a:00.0/down", "link:0000:5d:00.0/down"},
			2, 63.015},
		{"GPUDirect NIC0->GPU0 same switch", func() (Path, error) { return h.DeviceToDevice(nic0, gpu0) },
			[]string{"link:0000:18:00.0/up", "link:0000:19:00.0/down"}, 0, 63.015},
		{"GPUDirect NIC1->GPU0 other host bridge", func() (Path, error) { return h.DeviceToDevice(nic1, gpu0) },
			[]string{"link:0000:3a:00.0/up", "link:0000:38:00.0/up", "hostbridge:pci0000:37/up",
				"hostbridge:pci0000:15/down", "link:0000:16:00.0/down", "link:0000:19:00.0/down"}, 0, 63.015},
		{"GPUDirect GPU0->GPU4 across sockets", func() (Path, error) { return h.DeviceToDevice(gpu0, gpu4, opt) },
			[]string{"link:0000:19:00.0/up", "link:0000:16:00.0/up", "hostbridge:pci0000:15/up",
				"socket:node0-node1/node0->node1", "hostbridge:pci0000:97/down", "link:0000:98:00.0/down", "link:0000:9b:00.0/down"},
			3, 40},
		{"RDMA receive into host", func() (Path, error) { return h.NICToHost(nic0, 0) },
			[]string{"link:0000:18:00.0/up", "link:0000:16:00.0/up", "hostbridge:pci0000:15/up", "dram:node0/write"}, 0, 63.015},
		{"RDMA send from host", func() (Path, error) { return h.HostToNIC(1, nic0) },
			[]string{"dram:node1/read", "socket:node0-node1/node1->node0", "hostbridge:pci0000:15/down", "link:0000:16:00.0/down", "link:0000:18:00.0/down"}, 3, 63.015},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := tt.build()
			if err != nil {
				t.Fatal(err)
			}
			if got := segNames(p); !reflect.DeepEqual(got, tt.segs) {
				t.Errorf("segments\n got %q\nwant %q", got, tt.segs)
			}
			if p.Bottleneck != tt.neck || !near(p.Segments[p.Bottleneck].CapacityGBs, tt.neckGBs) {
				t.Errorf("bottleneck %d (%+v), want %d at %.3f GB/s", p.Bottleneck, p.Segments[max(p.Bottleneck, 0)], tt.neck, tt.neckGBs)
			}
		})
	}
	p, _ := h.HostToDevice(0, gpu3)
	if l := p.Segments[3]; !near(l.CapacityGBs, 63.015) || !near(l.CurrentGBs, 31.508) {
		t.Errorf("GPU3 link capacity/current = %.3f/%.3f, want 63.015/31.508", l.CapacityGBs, l.CurrentGBs)
	}
	if p.Segments[0].CapacityGBs != 0 || p.Segments[1].CapacityGBs != 0 {
		t.Errorf("DRAM and host bridge capacities without options must be unknown (0): %+v", p.Segments[:2])
	}
}

func TestHGXPathErrors(t *testing.T) {
	h := readFixture(t, hgxHost())
	for name, f := range map[string]func() (Path, error){
		"unknown BDF":      func() (Path, error) { return h.HostToDevice(0, "0000:ee:00.0") },
		"NIC as GPU":       func() (Path, error) { return h.HostToDevice(0, "0000:18:00.0") },
		"GPU as NVMe":      func() (Path, error) { return h.NVMeToHost("0000:19:00.0", 0) },
		"no such node":     func() (Path, error) { return h.HostToDevice(2, "0000:19:00.0") },
		"negative node":    func() (Path, error) { return h.DeviceToHost("0000:19:00.0", -1) },
		"self P2P":         func() (Path, error) { return h.DeviceToDevice("0000:19:00.0", "0000:19:00.0") },
		"unknown P2P peer": func() (Path, error) { return h.DeviceToDevice("0000:19:00.0", "0000:ee:00.0") },
	} {
		if _, err := f(); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestHGXConflict(t *testing.T) {
	h := readFixture(t, hgxHost())
	const gpu0, nic0, gpu1 = "0000:19:00.0", "0000:18:00.0", "0000:3b:00.0"
	must := func(p Path, err error) Path {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	h2d := must(h.HostToDevice(0, gpu0))
	d2h := must(h.DeviceToHost(gpu0, 0))
	rdmaRecv := must(h.DeviceToDevice(nic0, gpu0))
	rdmaSend := must(h.DeviceToDevice(gpu0, nic0))
	nicToHost := must(h.NICToHost(nic0, 0))
	h2dOther := must(h.HostToDevice(0, gpu1))
	names := func(s []Segment) []string {
		var out []string
		for _, x := range s {
			out = append(out, x.Name+"/"+x.Dir)
		}
		return out
	}
	tests := []struct {
		name string
		a, b Path
		want []string
	}{
		{"H2D vs D2H: full duplex", h2d, d2h, nil},
		{"H2D vs RDMA receive into the GPU: GPU link, both down", h2d, rdmaRecv, []string{"link:0000:19:00.0/down"}},
		{"H2D vs RDMA send from the GPU", h2d, rdmaSend, nil},
		{"D2H vs NIC->host: DRAM writes, host bridge and switch uplink, all up", d2h, nicToHost,
			[]string{"link:0000:16:00.0/up", "hostbridge:pci0000:15/up", "dram:node0/write"}},
		{"H2D to two GPUs on different host bridges share only DRAM", h2d, h2dOther, []string{"dram:node0/read"}},
	}
	for _, tt := range tests {
		if got := names(Conflict(tt.a, tt.b)); !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%s: Conflict = %q, want %q", tt.name, got, tt.want)
		}
		if got, back := Conflict(tt.a, tt.b), Conflict(tt.b, tt.a); len(got) != len(back) {
			t.Errorf("%s: Conflict not symmetric: %d vs %d", tt.name, len(got), len(back))
		}
	}
}

func TestHGXWriteText(t *testing.T) {
	h := readFixture(t, hgxHost())
	var buf bytes.Buffer
	if err := h.Matrix().WriteText(&buf); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	lines := strings.Split(out, "\n")
	wantHead := "\tGPU0\tGPU1\tGPU2\tGPU3\tGPU4\tGPU5\tGPU6\tGPU7\tNIC0\tNIC1\tNIC2\tNIC3\tNIC4\tNIC5\tNIC6\tNIC7\tCPU Affinity\tNUMA Affinity"
	if lines[0] != wantHead {
		t.Errorf("header\n got %q\nwant %q", lines[0], wantHead)
	}
	wantGPU4 := "GPU4\tSYS\tSYS\tSYS\tSYS\t X \tNODE\tNODE\tNODE\tSYS\tSYS\tSYS\tSYS\tPIX\tNODE\tNODE\tNODE\t48-95,144-191\t1"
	if lines[5] != wantGPU4 {
		t.Errorf("GPU4 row\n got %q\nwant %q", lines[5], wantGPU4)
	}
	wantNIC7 := "NIC7\tSYS\tSYS\tSYS\tSYS\tNODE\tNODE\tNODE\tPIX\tSYS\tSYS\tSYS\tSYS\tNODE\tNODE\tNODE\t X "
	if lines[16] != wantNIC7 {
		t.Errorf("NIC7 row\n got %q\nwant %q", lines[16], wantNIC7)
	}
	for _, w := range []string{"\nLegend:\n\n  X    = Self\n", "\nNIC Legend:\n\n  NIC0: mlx5_0\n", "  NIC7: mlx5_7\n"} {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
	if strings.Contains(out, "NVMe Legend") {
		t.Errorf("NVMe legend without NVMe devices")
	}
}

func TestMatrixJSON(t *testing.T) {
	h := readFixture(t, hgxHost())
	a, err := json.Marshal(h.Matrix())
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(h.Matrix())
	if !bytes.Equal(a, b) {
		t.Fatal("Matrix JSON differs between two calls")
	}
	for _, w := range []string{
		`{"devices":[{"name":"GPU0","kind":"gpu","bdf":"0000:19:00.0","numa_node":0,"cpu_affinity":"0-47,96-143"},`,
		`{"name":"NIC0","kind":"nic","bdf":"0000:18:00.0","rdma":"mlx5_0","net_devs":["ibp24s0"],"numa_node":0},`,
		`"relations":[["X","NODE","NODE","NODE","SYS","SYS","SYS","SYS","PIX",`,
	} {
		if !strings.Contains(string(a), w) {
			t.Errorf("JSON lacks %s:\n%s", w, a)
		}
	}
}
