package topology

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// hgxWithNVMe is hgxHost with an NVMe drive on a third downstream port of
// GPU0's switch (upstream port 0000:16:00.0), one NVMe namespace on it and
// a partition, a virtio disk on a root bus of node 1 without a switch, a
// multipath namespace over two controllers, and a loop device.
func hgxWithNVMe(t *testing.T) (*Host, string) {
	fx := hgxHost()
	gen4 := "16.0 GT/s PCIe"
	fx.Funcs = append(fx.Funcs,
		fxFunc{BDF: "0000:17:02.0", Parent: "0000:16:00.0", Class: "0x060400", Vendor: "0x1000", Device: "0xc030", NUMA: "0"},
		fxFunc{BDF: "0000:1a:00.0", Parent: "0000:17:02.0", Class: "0x010802", Vendor: "0x144d", Device: "0xa80a", NUMA: "0",
			Cur: gen4, Max: gen4, CurW: "4", MaxW: "4"},
		fxFunc{BDF: "0000:a0:01.0", HB: "pci0000:a0", Class: "0x060400", Vendor: "0x8086", Device: "0x352a", NUMA: "1"},
		fxFunc{BDF: "0000:a1:00.0", Parent: "0000:a0:01.0", Class: "0x018000", Vendor: "0x1af4", Device: "0x1042", NUMA: "1"},
		fxFunc{BDF: "0000:b0:00.0", HB: "pci0000:b0", Class: "0x010802", Vendor: "0x144d", Device: "0xa80a"},
		fxFunc{BDF: "0000:b1:00.0", HB: "pci0000:b1", Class: "0x010802", Vendor: "0x144d", Device: "0xa80a"},
	)
	root := build(t, fx)
	dev := func(bdf string) string {
		d, err := filepath.EvalSymlinks(filepath.Join(root, "bus", "pci", "devices", bdf))
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	block := func(dir, name string) {
		mkdir(t, dir)
		symlinkRel(t, dir, filepath.Join(root, "class", "block", name))
	}
	ns := filepath.Join(dev("0000:1a:00.0"), "nvme", "nvme0", "nvme0n1")
	block(ns, "nvme0n1")
	block(filepath.Join(ns, "nvme0n1p1"), "nvme0n1p1")
	block(filepath.Join(dev("0000:a1:00.0"), "virtio1", "block", "vda"), "vda")
	block(filepath.Join(root, "devices", "virtual", "block", "loop0"), "loop0")
	subsys := filepath.Join(root, "devices", "virtual", "nvme-subsystem", "nvme-subsys1")
	block(filepath.Join(subsys, "nvme1n1"), "nvme1n1")
	for i, bdf := range []string{"0000:b0:00.0", "0000:b1:00.0"} {
		c := filepath.Join(dev(bdf), "nvme", "nvme"+string(rune('1'+i)))
		mkdir(t, c)
		symlinkRel(t, dev(bdf), filepath.Join(c, "device"))
		symlinkRel(t, c, filepath.Join(subsys, "nvme"+string(rune('1'+i))))
	}
	h, err := Read(root)
	if err != nil {
		t.Fatal(err)
	}
	return h, root
}

func TestPlaceBlock(t *testing.T) {
	h, root := hgxWithNVMe(t)
	nvme := BlockPlacement{Name: "nvme0n1", BDF: "0000:1a:00.0", NUMANode: 0, RootPort: "0000:15:01.0", Switch: "0000:16:00.0"}
	part := nvme
	part.Name = "nvme0n1p1"
	for _, want := range []BlockPlacement{
		nvme, part,
		{Name: "vda", BDF: "0000:a1:00.0", NUMANode: 1, RootPort: "0000:a0:01.0"},
		{Name: "loop0", NUMANode: -1, Unknown: "not on PCI (/devices/virtual/block/loop0)"},
		{Name: "nvme1n1", NUMANode: -1, Unknown: "NVMe multipath namespace over 2 PCI controllers"},
	} {
		got := h.PlaceBlock(root, want.Name)
		if got.Unknown != "" && want.Unknown == "" || !reflect.DeepEqual(got, want) {
			t.Errorf("%s: got %+v\nwant %+v", want.Name, got, want)
		}
	}
	if got := h.PlaceBlock(root, "sdz"); got.Unknown == "" || got.BDF != "" || got.NUMANode != -1 {
		t.Errorf("absent device placed: %+v", got)
	}
	if got := h.SharesSwitch(nvme); !reflect.DeepEqual(got, []string{"0000:19:00.0"}) {
		t.Errorf("GPUs sharing nvme0n1's switch: %v, want GPU0 0000:19:00.0", got)
	}
	if got := h.SharesSwitch(h.PlaceBlock(root, "vda")); got != nil {
		t.Errorf("vda has no switch but shares with %v", got)
	}
}

// TestPlaceBlockSingleControllerSubsystem: a native-multipath namespace
// with one controller is placed on that controller.
func TestPlaceBlockSingleControllerSubsystem(t *testing.T) {
	h, root := hgxWithNVMe(t)
	if err := os.Remove(filepath.Join(root, "devices", "virtual", "nvme-subsystem", "nvme-subsys1", "nvme2")); err != nil {
		t.Fatal(err)
	}
	got := h.PlaceBlock(root, "nvme1n1")
	if got.BDF != "0000:b0:00.0" || got.Unknown != "" || got.RootPort != "" {
		t.Fatalf("got %+v", got)
	}
}

// TestPlaceBlockRealSysfs places this machine's block devices from /sys:
// whatever they are, a device on PCI must name a function the tree has,
// and one that is not must say why.
func TestPlaceBlockRealSysfs(t *testing.T) {
	h, err := Read("/sys")
	if err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir("/sys/class/block")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		p := h.PlaceBlock("/sys", e.Name())
		t.Logf("%+v", p)
		if (p.BDF == "") == (p.Unknown == "") {
			t.Errorf("%s: want exactly one of BDF and a reason: %+v", e.Name(), p)
		}
		if p.BDF != "" && h.Functions[p.BDF].NUMANode != p.NUMANode {
			t.Errorf("%s: node %d, function says %d", e.Name(), p.NUMANode, h.Functions[p.BDF].NUMANode)
		}
	}
}
