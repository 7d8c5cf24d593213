package topology

import (
	"path/filepath"
	"testing"
)

// l4Slot is an L4 as nvidia_smi_q/thamada_L4 shows it at idle (device max
// Gen4 x16, now Gen1 x8) in an x8 slot: a root port whose LnkCap is Gen4 x8.
// The sample does not say why the L4 runs x8; this fixture makes the slot
// the reason, so the capacity is x8 and not a fault.
func l4Slot() fxHost {
	return fxHost{Nodes: []fxNode{{CPUs: "0-15", Distance: "10"}}, Funcs: []fxFunc{
		{BDF: "0000:00:01.1", HB: "pci0000:00", Class: "0x060400", Vendor: "0x1022", Device: "0x14ab", NUMA: "0",
			Cur: "2.5 GT/s PCIe", Max: "16.0 GT/s PCIe", CurW: "8", MaxW: "8"},
		{BDF: "0000:01:00.0", Parent: "0000:00:01.1", Class: "0x030200", Vendor: "0x10de", Device: "0x27b8", NUMA: "0",
			Cur: "2.5 GT/s PCIe", Max: "16.0 GT/s PCIe", CurW: "8", MaxW: "16"},
	}}
}

func TestLinkCapacity(t *testing.T) {
	nodeExporter := func(t *testing.T) *Host {
		root := materialise(t, filepath.Join(samples, "sysfs_pci", "prometheus-node_exporter_fixture_pci_nvme_rootport_i350.txt"))
		h, err := Read(filepath.Join(root, "sys"))
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	procfs := func(t *testing.T) *Host {
		root := materialise(t, filepath.Join(samples, "sysfs_pci", "prometheus-procfs_fixture_pci_nvme_rootport_e810.txt"))
		h, err := Read(filepath.Join(root, "sys"))
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	for _, tt := range []struct {
		name        string
		host        func(*testing.T) *Host
		bdf         string
		want        LinkCapacity
		gbs         float64
		slotLimited bool
		text        string
	}{
		// NVMe capable of 16 GT/s x4 under a root port of 8 GT/s x8: the slot
		// sets the speed, the device the width.
		{"NVMe faster than its root port", nodeExporter, "0000:01:00.0",
			LinkCapacity{Device: "0000:01:00.0", DeviceGTs: 16, DeviceWidth: 4, Slot: "0000:00:02.1", SlotGTs: 8, SlotWidth: 8, GTs: 8, Width: 4},
			3.938, true, "Gen3 x4 3.94 GB/s (device Gen4 x4, slot 0000:00:02.1 Gen3 x8)"},
		{"NVMe narrower than its root port", procfs, "0000:01:00.0",
			LinkCapacity{Device: "0000:01:00.0", DeviceGTs: 8, DeviceWidth: 4, Slot: "0000:00:02.1", SlotGTs: 8, SlotWidth: 8, GTs: 8, Width: 4},
			3.938, false, "Gen3 x4 3.94 GB/s (device Gen3 x4, slot 0000:00:02.1 Gen3 x8)"},
		{"E810 on the host bridge: no slot above", procfs, "0000:a2:00.0",
			LinkCapacity{Device: "0000:a2:00.0", DeviceGTs: 16, DeviceWidth: 8, GTs: 16, Width: 8},
			15.754, false, "Gen4 x8 15.75 GB/s (device Gen4 x8, slot none: on the host bridge)"},
		// The I350's root port has no link files: the device's own max.
		{"I350 under a root port without link files", nodeExporter, "0000:45:00.0",
			LinkCapacity{Device: "0000:45:00.0", DeviceGTs: 5, DeviceWidth: 4, Slot: "0000:40:01.3", GTs: 5, Width: 4},
			2, false, "Gen2 x4 2.00 GB/s (device Gen2 x4, slot 0000:40:01.3 Gen? x?)"},
		// Idle at Gen1 (LnkSta 2.5GT/s (downgraded)): the capacity is Gen4.
		{"idle RTX 6000 Ada", func(t *testing.T) *Host { return readFixture(t, asusHost()) }, "0000:01:00.0",
			LinkCapacity{Device: "0000:01:00.0", DeviceGTs: 16, DeviceWidth: 16, Slot: "0000:00:01.1", SlotGTs: 32, SlotWidth: 16, GTs: 16, Width: 16},
			31.508, false, "Gen4 x16 31.51 GB/s (device Gen4 x16, slot 0000:00:01.1 Gen5 x16)"},
		{"HGX GPU3 reading Gen4 under a Gen5 switch port", func(t *testing.T) *Host { return readFixture(t, hgxHost()) }, "0000:5d:00.0",
			LinkCapacity{Device: "0000:5d:00.0", DeviceGTs: 32, DeviceWidth: 16, Slot: "0000:5b:01.0", SlotGTs: 32, SlotWidth: 16, GTs: 32, Width: 16},
			63.015, false, "Gen5 x16 63.02 GB/s (device Gen5 x16, slot 0000:5b:01.0 Gen5 x16)"},
		{"x16 card in an x8 slot", func(t *testing.T) *Host { return readFixture(t, l4Slot()) }, "0000:01:00.0",
			LinkCapacity{Device: "0000:01:00.0", DeviceGTs: 16, DeviceWidth: 16, Slot: "0000:00:01.1", SlotGTs: 16, SlotWidth: 8, GTs: 16, Width: 8},
			15.754, true, "Gen4 x8 15.75 GB/s (device Gen4 x16, slot 0000:00:01.1 Gen4 x8)"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := tt.host(t).LinkCapacity(tt.bdf)
			if !ok || got != tt.want {
				t.Fatalf("LinkCapacity(%s) = %+v, %v\nwant %+v", tt.bdf, got, ok, tt.want)
			}
			if !near(got.GBs(), tt.gbs) || !got.Known() || got.SlotLimited() != tt.slotLimited || got.String() != tt.text {
				t.Errorf("GBs %.3f known %v slot-limited %v %q, want %.3f true %v %q", got.GBs(), got.Known(), got.SlotLimited(), got.String(),
					tt.gbs, tt.slotLimited, tt.text)
			}
		})
	}
	h := readFixture(t, l4Slot())
	if _, ok := h.LinkCapacity("0000:02:00.0"); ok {
		t.Error("LinkCapacity of a function the host lacks: want false")
	}
	// The capacity of the x8 slot's link is what paths use too.
	p, err := h.HostToDevice(0, "0000:01:00.0")
	if err != nil {
		t.Fatal(err)
	}
	if l := p.Segments[p.Bottleneck]; l.Name != "link:0000:01:00.0" || !near(l.CapacityGBs, 15.754) || !near(l.CurrentGBs, 2) {
		t.Errorf("bottleneck = %+v, want the GPU link at 15.754 GB/s (2 GB/s now)", l)
	}
}

// A device without link files (a virtual function) has no capacity: unknown,
// never a default.
func TestLinkCapacityUnknown(t *testing.T) {
	h := readFixture(t, fxHost{Nodes: []fxNode{{CPUs: "0", Distance: "10"}}, Funcs: []fxFunc{
		{BDF: "0000:00:03.0", HB: "pci0000:00", Class: "0x030200", Vendor: "0x10de", Device: "0x2330", NUMA: "0"},
	}})
	c, ok := h.LinkCapacity("0000:00:03.0")
	if !ok || c.Known() || c.GBs() != 0 || c.SlotLimited() || c.String() != "unknown (device Gen? x?, slot none: on the host bridge)" {
		t.Errorf("= %+v %q", c, c.String())
	}
}

func TestGenGTs(t *testing.T) {
	for g := 0; g <= 8; g++ {
		if got := Generation(GenGTs(g)); (g >= 1 && g <= 7 && got != g) || ((g < 1 || g > 7) && GenGTs(g) != 0) {
			t.Errorf("GenGTs(%d) = %v (generation %d)", g, GenGTs(g), got)
		}
	}
}
