// Package sysfstest builds sysfs trees with the real layout (devices under
// their host bridge, relative symlinks for bus/pci/devices, iommu_group and
// class/infiniband) for tests of code that reads a sysfs root.
package sysfstest

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/lanewatch/lanewatch/internal/ktext"
)

// Func describes one PCI function of a fixture tree. String fields are
// the raw attribute file contents; "" leaves the file out, as sysfs does
// for attributes a device lacks.
type Func struct {
	BDF    string
	Parent string // upstream bridge BDF; "" = directly on HB
	HB     string // host bridge ("pci0000:17"), only when Parent == ""

	Class, Vendor, Device string
	NUMA                  string
	Cur, Max              string // link speeds, "32.0 GT/s PCIe"
	CurW, MaxW            string
	IOMMU                 int // group number; 0 = no iommu_group link
	Net                   []string
	RDMA                  []string
}

// Node is one NUMA node: its cpulist and distance file contents, and the
// physical_package_id of its CPUs ("" none written).
type Node struct{ CPUs, Distance, Package string }

// Host is a whole fixture tree.
type Host struct {
	Nodes     []Node         // node i is nodeI
	Funcs     []Func         // parents before children
	IOMMUType map[int]string // group → type file contents
}

// Build writes fx as a sysfs tree with the real layout and relative
// symlinks (bus/pci/devices, iommu_group, class/infiniband) and returns its
// root.
func Build(t testing.TB, fx Host) string {
	t.Helper()
	root := t.TempDir()
	dirs := map[string]string{}
	for _, f := range fx.Funcs {
		var dir string
		if f.Parent == "" {
			dir = filepath.Join(root, "devices", f.HB, f.BDF)
		} else {
			pd, ok := dirs[f.Parent]
			if !ok {
				t.Fatalf("fixture: %s: parent %s not built yet", f.BDF, f.Parent)
			}
			dir = filepath.Join(pd, f.BDF)
		}
		dirs[f.BDF] = dir
		Mkdir(t, dir)
		for name, v := range map[string]string{
			"class": f.Class, "vendor": f.Vendor, "device": f.Device, "numa_node": f.NUMA,
			"current_link_speed": f.Cur, "max_link_speed": f.Max,
			"current_link_width": f.CurW, "max_link_width": f.MaxW,
		} {
			if v != "" {
				Write(t, filepath.Join(dir, name), v+"\n")
			}
		}
		SymlinkRel(t, dir, filepath.Join(root, "bus", "pci", "devices", f.BDF))
		if f.IOMMU != 0 {
			g := filepath.Join(root, "kernel", "iommu_groups", strconv.Itoa(f.IOMMU))
			Mkdir(t, filepath.Join(g, "devices"))
			SymlinkRel(t, g, filepath.Join(dir, "iommu_group"))
			if tp, ok := fx.IOMMUType[f.IOMMU]; ok {
				Write(t, filepath.Join(g, "type"), tp+"\n")
			}
		}
		for _, n := range f.Net {
			Mkdir(t, filepath.Join(dir, "net", n))
		}
		for _, ib := range f.RDMA {
			d := filepath.Join(dir, "infiniband", ib)
			Mkdir(t, d)
			SymlinkRel(t, dir, filepath.Join(d, "device"))
			SymlinkRel(t, d, filepath.Join(root, "class", "infiniband", ib))
		}
	}
	for i, n := range fx.Nodes {
		d := filepath.Join(root, "devices", "system", "node", "node"+strconv.Itoa(i))
		Mkdir(t, d)
		Write(t, filepath.Join(d, "cpulist"), n.CPUs+"\n")
		if n.Distance != "" {
			Write(t, filepath.Join(d, "distance"), n.Distance+"\n")
		}
		if n.Package != "" {
			cpus, err := ktext.ParseList(n.CPUs)
			if err != nil {
				t.Fatalf("node %d cpus %q: %v", i, n.CPUs, err)
			}
			for _, c := range cpus {
				Write(t, filepath.Join(root, "devices", "system", "cpu", "cpu"+strconv.Itoa(c), "topology", "physical_package_id"), n.Package+"\n")
			}
		}
	}
	Mkdir(t, filepath.Join(root, "bus", "pci", "devices"))
	return root
}

// Mkdir creates a directory and its parents.
func Mkdir(t testing.TB, d string) {
	t.Helper()
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
}

// Write writes a file, creating its directory.
func Write(t testing.TB, p, s string) {
	t.Helper()
	Mkdir(t, filepath.Dir(p))
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

// SymlinkRel makes link point at target with a relative path, as sysfs does.
func SymlinkRel(t testing.TB, target, link string) {
	t.Helper()
	Mkdir(t, filepath.Dir(link))
	rel, err := filepath.Rel(filepath.Dir(link), target)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(rel, link); err != nil {
		t.Fatal(err)
	}
}

// Plain builds a host with nothing for the GPU checks to judge, the shape
// of the development VM: one NUMA node, a virtio disk on the root bus, no
// GPU, no RDMA NIC, and a module directory without nvidia_fs. A test that
// reads it expects the same on any machine; one that read the real /sys
// would expect the machine it was written on.
func Plain(t testing.TB) string {
	t.Helper()
	root := Build(t, Host{
		Nodes: []Node{{CPUs: "0-1", Distance: "10", Package: "0"}},
		Funcs: []Func{{BDF: "0000:00:04.0", HB: "pci0000:00", Class: "0x010000", Vendor: "0x1af4", Device: "0x1001", NUMA: "-1"}},
	})
	Write(t, filepath.Join(root, "devices", "system", "node", "online"), "0\n")
	Mkdir(t, filepath.Join(root, "module", "virtio_blk"))
	return root
}
