package agent_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lanewatch/lanewatch/agent"
	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/internal/sysfstest"
)

func TestPathsOnAGPUHost(t *testing.T) {
	sys := sysfstest.Build(t, sysfstest.Host{
		Nodes: []sysfstest.Node{{CPUs: "0-3", Distance: "10"}},
		Funcs: []sysfstest.Func{
			{BDF: "0000:17:00.0", HB: "pci0000:17", Class: "0x060400", Vendor: "0x1000", Device: "0xc030", NUMA: "0",
				Cur: "32.0 GT/s PCIe", Max: "32.0 GT/s PCIe", CurW: "16", MaxW: "16"},
			{BDF: "0000:18:00.0", Parent: "0000:17:00.0", Class: "0x030200", Vendor: "0x10de", Device: "0x2330", NUMA: "0",
				Cur: "16.0 GT/s PCIe", Max: "32.0 GT/s PCIe", CurW: "16", MaxW: "16"}, // trained at Gen4 under a Gen5 switch
			{BDF: "0000:19:00.0", Parent: "0000:17:00.0", Class: "0x030200", Vendor: "0x10de", Device: "0x2330", NUMA: "0",
				Cur: "32.0 GT/s PCIe", Max: "32.0 GT/s PCIe", CurW: "8", MaxW: "8"}, // a second GPU, x8
		},
	})
	place, err := agent.HostPlacement("/proc", sys, nil)
	if err != nil {
		t.Fatal(err)
	}
	p, err := agent.NewPaths(sys, place)
	if err != nil {
		t.Fatal(err)
	}
	// The link reads Gen4 now; its capacity is what it trains to, Gen5 x16.
	got, ok := p.Path(&correlate.Transfer{PID: uint32(os.Getpid()), Direction: correlate.DirH2D})
	if !ok || got.GPU != "0000:18:00.0" || got.NUMANode != -1 || !strings.HasPrefix(got.Bottleneck, "link:0000:18:00.0") ||
		got.CapacityBps < 63.0e9 || got.CapacityBps > 63.1e9 {
		t.Fatalf("H2D path: %+v", got)
	}
	for _, s := range got.Segments {
		if strings.HasPrefix(s, "dram:") || strings.HasPrefix(s, "socket:") {
			t.Errorf("segment %s depends on the page's node, which is not known per transfer", s)
		}
	}
	if _, ok := p.Path(&correlate.Transfer{PID: 1, Direction: correlate.DirD2D}); ok {
		t.Error("a D2D copy has no host path")
	}
	// A copy that names its GPU is placed on it, not on its process's.
	if got, ok := p.Path(&correlate.Transfer{PID: uint32(os.Getpid()), Direction: correlate.DirD2H, GPU: "0000:19:00.0"}); !ok ||
		got.GPU != "0000:19:00.0" || !strings.HasPrefix(got.Bottleneck, "link:0000:19:00.0") {
		t.Errorf("D2H path of a copy on 0000:19:00.0: %+v, %v", got, ok)
	}
	if got, ok := p.Path(&correlate.Transfer{PID: uint32(os.Getpid()), Direction: correlate.DirH2D, GPU: "0000:99:00.0"}); ok {
		t.Errorf("a path to a GPU this host does not have: %+v", got)
	}
}

// A copy whose host pages were located on the far node crosses the socket
// link: its path says so, and names the node.
func TestPathsFromLocatedPages(t *testing.T) {
	sys := sysfstest.Build(t, sysfstest.Host{
		Nodes: []sysfstest.Node{{CPUs: "0", Distance: "10 21"}, {CPUs: "1", Distance: "21 10"}},
		Funcs: []sysfstest.Func{
			{BDF: "0000:17:00.0", HB: "pci0000:17", Class: "0x060400", Vendor: "0x1000", Device: "0xc030", NUMA: "0",
				Cur: "32.0 GT/s PCIe", Max: "32.0 GT/s PCIe", CurW: "16", MaxW: "16"},
			{BDF: "0000:18:00.0", Parent: "0000:17:00.0", Class: "0x030200", Vendor: "0x10de", Device: "0x2330", NUMA: "0",
				Cur: "32.0 GT/s PCIe", Max: "32.0 GT/s PCIe", CurW: "16", MaxW: "16"},
		},
	})
	place, err := agent.HostPlacement("/proc", sys, nil)
	if err != nil {
		t.Fatal(err)
	}
	p, err := agent.NewPaths(sys, place)
	if err != nil {
		t.Fatal(err)
	}
	near := correlate.Transfer{PID: 1, Direction: correlate.DirH2D, GPU: "0000:18:00.0", NUMANode: correlate.NodeOf(0)}
	far := near
	far.NUMANode = correlate.NodeOf(1)
	for _, c := range []struct {
		t      correlate.Transfer
		node   int
		socket bool
	}{{near, 0, false}, {far, 1, true}} {
		got, ok := p.Path(&c.t)
		if !ok || got.NUMANode != c.node || strings.Contains(strings.Join(got.Segments, " "), "socket") != c.socket {
			t.Errorf("pages on node %d: %+v %v", c.node, got, ok)
		}
	}
}

// A sysfs with no GPU: a transfer has no path, rather than one on a GPU
// the host does not have.
func TestPathsWithoutAGPU(t *testing.T) {
	sys := sysfstest.Plain(t)
	place, err := agent.HostPlacement("/proc", sys, nil)
	if err != nil {
		t.Fatal(err)
	}
	if pl := place(uint32(os.Getpid())); pl.GPU != "" || !strings.Contains(pl.Why, "no GPU in "+sys) {
		t.Fatalf("placement on a host without GPU: %+v", pl)
	}
	p, err := agent.NewPaths(sys, place)
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := p.Path(&correlate.Transfer{PID: uint32(os.Getpid()), Direction: correlate.DirD2H}); ok {
		t.Fatalf("a path on a host without GPU: %+v", got)
	}
}

// --topo-m is read once at start: a file that cannot be read or parsed, or
// whose GPUs are not this host's, is an error naming it, never a guess.
func TestPeerPathsFileErrors(t *testing.T) {
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage.txt")
	if err := os.WriteFile(garbage, []byte("GPU0 GPU1\nnot a matrix\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	const dgx1 = "../topology/testdata/topo_m/msccl-tools_dgx1_8xV100_4xmlx5_unsorted_nolastnewline.txt"
	sys := filepath.Join(dir, "sys")
	if err := os.MkdirAll(filepath.Join(sys, "bus", "pci", "devices"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ file, want string }{
		{filepath.Join(dir, "missing.txt"), "--topo-m: open " + filepath.Join(dir, "missing.txt")},
		{garbage, "--topo-m: " + garbage + ":"},
		{dgx1, "--topo-m " + dgx1 + ": 8 GPUs, sysfs " + sys + " has 0"},
	} {
		f, err := agent.PeerPaths(c.file, sys)
		if err == nil || f != nil || !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("%s: %v; want an error starting %q", c.file, err, c.want)
		}
	}
}

// A host's two GPUs matched by index to princeton della's 2×A100 `topo -m`
// (GPU0–GPU1 SYS, the legend lists NV#): their peer copies are PCIe.
func TestPeerPathsHost(t *testing.T) {
	gpu := func(bdf, hb string) sysfstest.Func {
		return sysfstest.Func{BDF: bdf, HB: hb, Class: "0x030200", Vendor: "0x10de", Device: "0x20b5", NUMA: "0",
			Cur: "16.0 GT/s PCIe", Max: "16.0 GT/s PCIe", CurW: "16", MaxW: "16"}
	}
	sys := sysfstest.Build(t, sysfstest.Host{
		Nodes: []sysfstest.Node{{CPUs: "0-3", Distance: "10"}},
		Funcs: []sysfstest.Func{gpu("0000:81:00.0", "pci0000:80"), gpu("0000:21:00.0", "pci0000:20")},
	})
	path, err := agent.PeerPaths("../topology/testdata/topo_m/princeton_della-i14g20_2xA100_2xmlx5_oldformat.txt", sys)
	if err != nil {
		t.Fatal(err)
	}
	if p, ok := path("0000:21:00.0", "0000:81:00.0"); p != "pcie" || !ok {
		t.Errorf("GPU0→GPU1: %q %v, want pcie", p, ok)
	}
	if p, ok := path("0000:21:00.0", "0000:3b:00.0"); ok {
		t.Errorf("to a GPU not on the host: %q", p)
	}
}
