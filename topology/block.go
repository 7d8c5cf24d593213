package topology

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// BlockPlacement is where a block device (a disk or partition, as named in
// /proc/diskstats) sits in the PCI tree.
type BlockPlacement struct {
	Name string `json:"name"`
	// BDF is the PCI function that does the device's DMA; "" when it has
	// none or it could not be found (Unknown says why).
	BDF string `json:"bdf"`
	// NUMANode is the function's node; -1 unknown (firmware gave none, or
	// no function).
	NUMANode int `json:"numa_node"`
	// RootPort is the root port above the function (Chain[0]); "" for a
	// root-complex integrated endpoint. Switch is the upstream port of the
	// first PCIe switch below the root port (Chain[1]); "" when the device
	// hangs straight off the root port.
	RootPort string `json:"root_port"`
	Switch   string `json:"switch"`
	Unknown  string `json:"unknown,omitempty"`
}

// PlaceBlock finds block device name's PCI function from
// sysRoot/class/block/NAME (which lists partitions too) and places it on
// h's tree. The function is the last PCI address in the resolved device
// path (nvme0n1 → …/0000:3d:00.0/nvme/nvme0/nvme0n1; virtio vda →
// …/0000:00:02.0/virtio1/block/vda). A native NVMe multipath namespace
// (under virtual/nvme-subsystem) is placed on its controller when it has
// exactly one. Virtual devices (loop, zram, dm) have no function: Unknown
// says so; nothing is guessed.
func (h *Host) PlaceBlock(sysRoot, name string) BlockPlacement {
	p := BlockPlacement{Name: name, NUMANode: -1}
	dir, err := filepath.EvalSymlinks(filepath.Join(sysRoot, "class", "block", name))
	if err != nil {
		p.Unknown = fmt.Sprintf("no sysfs entry: %v", err)
		return p
	}
	bdf := lastBDF(dir)
	if bdf == "" {
		bdf, p.Unknown = subsystemController(filepath.Dir(dir))
		if bdf == "" {
			if p.Unknown == "" {
				p.Unknown = "not on PCI (" + strings.TrimPrefix(dir, sysRoot) + ")"
			}
			return p
		}
	}
	f := h.Functions[bdf]
	if f == nil {
		p.Unknown = "PCI function " + bdf + " is not in the topology"
		return p
	}
	p.BDF, p.NUMANode, p.Unknown = bdf, f.NUMANode, ""
	if len(f.Chain) > 1 {
		p.RootPort = f.Chain[0]
	}
	if len(f.Chain) > 2 {
		p.Switch = f.Chain[1]
	}
	return p
}

// SharesSwitch lists the GPUs below the same switch upstream port as p
// (their traffic and p's share that switch's uplink).
func (h *Host) SharesSwitch(p BlockPlacement) []string {
	if p.Switch == "" {
		return nil
	}
	var out []string
	for _, bdf := range h.BDFs(KindGPU) {
		if f := h.Functions[bdf]; len(f.Chain) > 2 && f.Chain[1] == p.Switch {
			out = append(out, bdf)
		}
	}
	return out
}

func lastBDF(dir string) string {
	parts := strings.Split(filepath.ToSlash(dir), "/")
	for i := len(parts) - 1; i >= 0; i-- {
		if isBDF(parts[i]) {
			return parts[i]
		}
	}
	return ""
}

// subsystemController resolves an nvme-subsystem directory to its one
// controller's PCI function; with several (multipath) the namespace has no
// single place.
func subsystemController(subsys string) (bdf, why string) {
	if !strings.Contains(filepath.ToSlash(subsys), "/nvme-subsystem/") {
		return "", ""
	}
	ents, err := os.ReadDir(subsys)
	if err != nil {
		return "", err.Error()
	}
	var found []string
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), "nvme") || strings.HasPrefix(e.Name(), "nvme-") {
			continue
		}
		d, err := filepath.EvalSymlinks(filepath.Join(subsys, e.Name(), "device"))
		if err != nil {
			continue // a namespace entry, not a controller
		}
		if b := lastBDF(d); b != "" {
			found = append(found, b)
		}
	}
	if len(found) != 1 {
		return "", fmt.Sprintf("NVMe multipath namespace over %d PCI controllers", len(found))
	}
	return found[0], ""
}
