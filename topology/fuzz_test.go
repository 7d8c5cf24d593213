package topology

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Each fuzz target checks the parser never panics, and that a value it
// accepts is within the documented range.

func FuzzParseLinkSpeed(f *testing.F) {
	for _, s := range []string{"32.0 GT/s PCIe", "16.0 GT/s PCIe", "8.0 GT/s PCIe", "5.0 GT/s PCIe", "2.5 GT/s PCIe",
		"Unknown", "8 GT/s", "66 MHz PCI-X", " PCI", "PCI-X", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		gts, known, err := ParseLinkSpeed(s)
		if err != nil && (known || gts != 0) {
			t.Fatalf("%q: error with a value", s)
		}
		if known && encodingEfficiency(gts) == 0 {
			t.Fatalf("%q: accepted rate %v has no encoding", s, gts)
		}
		if c := LinkGBs(gts, 16); math.IsNaN(c) || c < 0 || c > 250 {
			t.Fatalf("%q: capacity %v", s, c)
		}
	})
}

func FuzzParseLinkWidth(f *testing.F) {
	for _, s := range []string{"16", "8", "4", "1", "0", "255", "-1", "x16"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		w, err := ParseLinkWidth(s)
		if err == nil && (w < 0 || w > 32) {
			t.Fatalf("%q: width %d accepted", s, w)
		}
	})
}

func FuzzParseHex(f *testing.F) {
	for _, s := range []string{"0x030200", "0x020700", "0x010802", "0x060400", "0xffff00", "0x10de", "0x15b3", "0x", "0x-1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, bits := range []int{16, 24} {
			v, err := parseHex(s, bits)
			if err == nil && v >= 1<<bits {
				t.Fatalf("%q: %#x does not fit %d bits", s, v, bits)
			}
		}
	})
}

func FuzzParseNUMANode(f *testing.F) {
	for _, s := range []string{"-1", "0", "1", "7", "-2", "1e3"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseNUMANode(s)
		if err == nil && (n < -1 || n >= 1<<16) {
			t.Fatalf("%q: node %d accepted", s, n)
		}
	})
}

func FuzzParseCPUList(f *testing.F) {
	for _, s := range []string{"0-47,96-143", "48-95,144-191", "0-63,128-191", "70-99,102-107", "0-1", "", "5", "3-1", "0,,1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		l, err := ParseCPUList(s)
		if err != nil {
			return
		}
		if l.Text != s {
			t.Fatalf("%q: text %q not kept", s, l.Text)
		}
		for i, r := range l.Ranges {
			if r[0] < 0 || r[1] < r[0] || r[1] >= maxCPU {
				t.Fatalf("%q: bad range %v", s, r)
			}
			if i > 0 && r[0] <= l.Ranges[i-1][1]+1 {
				t.Fatalf("%q: ranges %v not sorted, disjoint and apart", s, l.Ranges)
			}
		}
	})
}

func FuzzParseDistances(f *testing.F) {
	for _, s := range []string{"10 21", "10 32", "10", "21 10", "", "10 -1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := ParseDistances(s)
		if err == nil && len(d) == 0 {
			t.Fatalf("%q: accepted with no distances", s)
		}
	})
}

// FuzzReadAttrFile writes arbitrary bytes into each attribute file of a
// one-function tree: Read must not panic, and any error must name the file
// it came from.
func FuzzReadAttrFile(f *testing.F) {
	attrs := []string{"class", "vendor", "device", "numa_node", "current_link_speed", "max_link_speed",
		"current_link_width", "max_link_width"}
	for i, s := range []string{"0x030200\n", "0x10de\n", "0x2330\n", "-1\n", "Unknown\n", "32.0 GT/s PCIe\n", "16\n", "0\n"} {
		f.Add(uint8(i), []byte(s))
	}
	f.Add(uint8(0), []byte("0x030200\n0x030200\n"))
	f.Add(uint8(4), []byte{0xff, 0})
	root := f.TempDir()
	dir := filepath.Join(root, "devices", "pci0000:00", "0000:00:01.0")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		f.Fatal(err)
	}
	link := filepath.Join(root, "bus", "pci", "devices", "0000:00:01.0")
	if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
		f.Fatal(err)
	}
	if err := os.Symlink("../../../devices/pci0000:00/0000:00:01.0", link); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, which uint8, content []byte) {
		name := attrs[int(which)%len(attrs)]
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, content, 0o644); err != nil {
			t.Fatal(err)
		}
		defer os.Remove(p)
		h, err := Read(root)
		if err != nil {
			if !strings.Contains(err.Error(), p) {
				t.Fatalf("error %q does not name %s", err, p)
			}
			return
		}
		if len(h.Functions) != 1 {
			t.Fatalf("functions = %d", len(h.Functions))
		}
	})
}

func FuzzParsePackageID(f *testing.F) {
	for _, s := range []string{"0", "1", "-1", "65536", "0x1", " 1", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if p, err := ParsePackageID(s); err == nil && (p < 0 || p >= 1<<16) {
			t.Fatalf("%q: accepted as %d", s, p)
		} else if err != nil && !strings.Contains(err.Error(), "physical_package_id") {
			t.Fatalf("%q: error %q does not name the attribute", s, err)
		}
	})
}

// FuzzReadNodeFiles writes arbitrary bytes into a node's cpulist, its
// distance row or its CPU's physical_package_id: Read must not panic, an
// error must name the file, and a package it reports is one it read.
func FuzzReadNodeFiles(f *testing.F) {
	f.Add(uint8(0), []byte("0-1\n"))
	f.Add(uint8(1), []byte("10 21\n"))
	f.Add(uint8(2), []byte("1\n"))
	f.Add(uint8(2), []byte("-1\n"))
	f.Add(uint8(0), []byte("\n"))
	f.Add(uint8(1), []byte{0xff, '\n', '1'})
	root := f.TempDir()
	node := filepath.Join(root, "devices", "system", "node", "node0")
	pkg := filepath.Join(root, "devices", "system", "cpu", "cpu0", "topology", "physical_package_id")
	files := []string{filepath.Join(node, "cpulist"), filepath.Join(node, "distance"), pkg}
	for i, s := range []string{"0\n", "10\n", "0\n"} {
		if err := os.MkdirAll(filepath.Dir(files[i]), 0o755); err != nil {
			f.Fatal(err)
		}
		if err := os.WriteFile(files[i], []byte(s), 0o644); err != nil {
			f.Fatal(err)
		}
	}
	f.Fuzz(func(t *testing.T, which uint8, content []byte) {
		p := files[int(which)%len(files)]
		old, _ := os.ReadFile(p)
		if err := os.WriteFile(p, content, 0o644); err != nil {
			t.Fatal(err)
		}
		defer os.WriteFile(p, old, 0o644)
		h, err := Read(root)
		if err != nil {
			if !strings.Contains(err.Error(), p) {
				t.Fatalf("error %q does not name %s", err, p)
			}
			return
		}
		if len(h.Nodes) != 1 || h.Nodes[0].Package < -1 {
			t.Fatalf("nodes %+v", h.Nodes)
		}
	})
}
