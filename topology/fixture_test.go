package topology

import (
	"bufio"
	"encoding/xml"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lanewatch/lanewatch/internal/sysfstest"
)

// samples is the shared folder of real captures (see its PROVENANCE.md).
const samples = "../../shared/samples"

type (
	fxFunc = sysfstest.Func
	fxNode = sysfstest.Node
	fxHost = sysfstest.Host
)

func build(t testing.TB, fx fxHost) string { return sysfstest.Build(t, fx) }
func mkdir(t testing.TB, d string)         { sysfstest.Mkdir(t, d) }
func write(t testing.TB, p, s string)      { sysfstest.Write(t, p, s) }
func symlinkRel(t testing.TB, target, link string) {
	sysfstest.SymlinkRel(t, target, link)
}

// materialise writes a flattened sysfs listing (the sysfs_pci/prometheus-*
// samples: "sys/path: value", "sys/path: -> target" for symlinks, and
// indented continuation lines for multi-line files) under a temp root and
// returns the root (the directory holding "sys").
func materialise(t testing.TB, listing string) string {
	t.Helper()
	fh, err := os.Open(listing)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	root := t.TempDir()
	var cur string // file being continued by indented lines
	sc := bufio.NewScanner(fh)
	for line := 1; sc.Scan(); line++ {
		l := sc.Text()
		if strings.HasPrefix(l, "    ") {
			if cur == "" {
				t.Fatalf("%s:%d: continuation without a file", listing, line)
			}
			appendFile(t, cur, strings.TrimPrefix(l, "    ")+"\n")
			continue
		}
		path, val, ok := strings.Cut(l, ": ")
		if !ok {
			if p, ok2 := strings.CutSuffix(l, ":"); ok2 {
				path, val = p, ""
			} else {
				t.Fatalf("%s:%d: want \"path: value\": %q", listing, line, l)
			}
		}
		full := filepath.Join(root, path)
		mkdir(t, filepath.Dir(full))
		if target, isLink := strings.CutPrefix(val, "-> "); isLink {
			if err := os.Symlink(target, full); err != nil {
				t.Fatal(err)
			}
			cur = ""
			continue
		}
		write(t, full, val)
		if val != "" {
			appendFile(t, full, "\n")
		}
		cur = full
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return root
}

func appendFile(t testing.TB, p, s string) {
	t.Helper()
	fh, err := os.OpenFile(p, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	if _, err := fh.WriteString(s); err != nil {
		t.Fatal(err)
	}
}

// hwlocObj is the part of hwloc's XML this test needs: the I/O tree.
type hwlocObj struct {
	Type      string     `xml:"type,attr"`
	BusID     string     `xml:"pci_busid,attr"`
	BridgePCI string     `xml:"bridge_pci,attr"`
	Name      string     `xml:"name,attr"`
	OSDevType string     `xml:"osdev_type,attr"`
	Children  []hwlocObj `xml:"object"`
}

// dellHost reconstructs the Dell DCS8000Z: the tree (host bridges,
// bridges, net and OpenFabrics OS devices) from hwloc's XML export of the
// machine, the attribute values from the sysfs listing captured from the
// same hwloc test tarball.
func dellHost(t testing.TB) fxHost {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(samples, "hwloc_xml", "hwloc_32em64t-2n8c+dax+nvme+mic+dimms.xml"))
	if err != nil {
		t.Fatal(err)
	}
	var top struct {
		Objects []hwlocObj `xml:"object"`
	}
	if err := xml.Unmarshal(b, &top); err != nil {
		t.Fatal(err)
	}
	attrs := dellAttrs(t)
	var fx fxHost
	var walk func(o hwlocObj, hb, parent string)
	walk = func(o hwlocObj, hb, parent string) {
		switch {
		case o.Type == "Bridge" && o.BusID == "":
			// Host bridge: bridge_pci "0000:[80-83]" → sysfs "pci0000:80".
			dom, rng, _ := strings.Cut(o.BridgePCI, ":[")
			hb, parent = "pci"+dom+":"+rng[:2], ""
		case o.Type == "Bridge" || o.Type == "PCIDev":
			a, ok := attrs[o.BusID]
			if !ok {
				t.Fatalf("hwloc XML has %s, the sysfs listing does not", o.BusID)
			}
			f := fxFunc{BDF: o.BusID, Parent: parent, Class: a["class"], Vendor: a["vendor"], Device: a["device"], NUMA: a["numa_node"]}
			if parent == "" {
				f.HB = hb
			}
			for _, c := range o.Children {
				switch {
				case c.Type == "OSDev" && c.OSDevType == "16":
					f.Net = append(f.Net, c.Name)
				case c.Type == "OSDev" && c.OSDevType == "48":
					f.RDMA = append(f.RDMA, c.Name)
				}
			}
			fx.Funcs = append(fx.Funcs, f)
			delete(attrs, o.BusID)
			parent = o.BusID
		}
		for _, c := range o.Children {
			walk(c, hb, parent)
		}
	}
	for _, o := range top.Objects {
		walk(o, "", "")
	}
	// hwloc drops bridges with nothing below them; the one such root port
	// sits on bus 00, so directly on host bridge pci0000:00.
	if a, ok := attrs["0000:00:11.0"]; ok {
		fx.Funcs = append(fx.Funcs, fxFunc{BDF: "0000:00:11.0", HB: "pci0000:00", Class: a["class"], Vendor: a["vendor"], Device: a["device"], NUMA: a["numa_node"]})
		delete(attrs, "0000:00:11.0")
	}
	for bdf := range attrs {
		t.Errorf("sysfs listing has %s, hwloc XML does not place it", bdf)
	}
	// numactl-style node layout from the listing's local_cpulist values.
	fx.Nodes = []fxNode{{CPUs: "0-7", Distance: "10 21"}, {CPUs: "8-15", Distance: "21 10"}}
	return fx
}

// dellAttrs reads "<bdf> <attr>=<value>" lines.
func dellAttrs(t testing.TB) map[string]map[string]string {
	t.Helper()
	p := filepath.Join(samples, "sysfs_pci", "hwloc_testdata_32em64t-2n8c_DellDCS8000Z_pci_devices_numa_node.txt")
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]string{}
	for i, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if strings.HasPrefix(l, "#") {
			continue
		}
		bdf, kv, ok1 := strings.Cut(l, " ")
		k, v, ok2 := strings.Cut(kv, "=")
		if !ok1 || !ok2 {
			t.Fatalf("%s:%d: %q", p, i+1, l)
		}
		if out[bdf] == nil {
			out[bdf] = map[string]string{}
		}
		out[bdf][k] = v
	}
	return out
}
