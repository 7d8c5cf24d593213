package topology

import (
	"bufio"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
)

// Legend explains the relation names, worded as nvidia-smi topo -m does.
const Legend = `  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
`

// Matrix is the topo -m view of a host. Its JSON form is stable:
//
//	{"devices":[{"name":"GPU0","kind":"gpu","bdf":"0000:18:00.0",
//	             "numa_node":0,"cpu_affinity":"0-47,96-143"}, ...
//	            {"name":"NIC0","kind":"nic","bdf":"0000:17:00.0","rdma":"mlx5_0","net_devs":["ibp23s0"]}, ...],
//	 "relations":[["X","PIX",...],...]}
//
// Devices are GPUs (by BDF), then NICs (by RDMA name in natural order, then
// NIC functions without an RDMA device by BDF), then NVMe (by BDF);
// relations[i][j] is the relation of devices[i] to devices[j]. numa_node is
// -1 when unknown; cpu_affinity is "" when unknown or not a GPU.
type Matrix struct {
	Devices   []MatrixDevice `json:"devices"`
	Relations [][]Relation   `json:"relations"`
}

// MatrixDevice is one row/column of a Matrix.
type MatrixDevice struct {
	Name        string   `json:"name"` // GPU0, NIC0, NVME0
	Kind        string   `json:"kind"`
	BDF         string   `json:"bdf"`
	RDMA        string   `json:"rdma,omitempty"`
	NetDevs     []string `json:"net_devs,omitempty"`
	NUMANode    int      `json:"numa_node"`
	CPUAffinity string   `json:"cpu_affinity,omitempty"`
}

// Matrix builds the relation matrix over every GPU, NIC (one column per
// RDMA device; per NIC function when it has none) and NVMe controller.
func (h *Host) Matrix() Matrix {
	var m Matrix
	for i, bdf := range h.BDFs(KindGPU) {
		f := h.Functions[bdf]
		d := MatrixDevice{Name: "GPU" + strconv.Itoa(i), Kind: KindGPU, BDF: bdf, NUMANode: f.NUMANode}
		if n, ok := h.Node(f.NUMANode); ok {
			d.CPUAffinity = n.CPUs.Text
		}
		m.Devices = append(m.Devices, d)
	}
	nic := 0
	for _, name := range h.rdmaNames() {
		bdf := h.RDMA[name]
		f := h.Functions[bdf]
		m.Devices = append(m.Devices, MatrixDevice{Name: "NIC" + strconv.Itoa(nic), Kind: KindNIC, BDF: bdf,
			RDMA: name, NetDevs: f.NetDevs, NUMANode: f.NUMANode})
		nic++
	}
	for _, bdf := range h.BDFs(KindNIC) {
		f := h.Functions[bdf]
		if len(f.RDMADevs) > 0 {
			continue
		}
		m.Devices = append(m.Devices, MatrixDevice{Name: "NIC" + strconv.Itoa(nic), Kind: KindNIC, BDF: bdf,
			NetDevs: f.NetDevs, NUMANode: f.NUMANode})
		nic++
	}
	for i, bdf := range h.BDFs(KindNVMe) {
		m.Devices = append(m.Devices, MatrixDevice{Name: "NVME" + strconv.Itoa(i), Kind: KindNVMe, BDF: bdf,
			NUMANode: h.Functions[bdf].NUMANode})
	}
	m.Relations = make([][]Relation, len(m.Devices))
	for i, a := range m.Devices {
		m.Relations[i] = make([]Relation, len(m.Devices))
		for j, b := range m.Devices {
			m.Relations[i][j] = h.Relation(a.BDF, b.BDF)
			if i != j && a.BDF == b.BDF {
				// Two RDMA devices on one function (rare): same place,
				// but distinct columns, so not "X".
				m.Relations[i][j] = RelPIX
			}
		}
	}
	return m
}

// rdmaNames lists RDMA devices that sit on a PCI function, natural order.
func (h *Host) rdmaNames() []string {
	var out []string
	for name, bdf := range h.RDMA {
		if bdf != "" {
			out = append(out, name)
		}
	}
	sort.Slice(out, func(i, j int) bool { return naturalLess(out[i], out[j]) })
	return out
}

// RDMARelations maps every RDMA device on a PCI function to its relation
// with the device at bdf (a GPU): "" for each when bdf is not in the tree.
// Empty when the host has no RDMA device on PCI (soft devices, rxe and
// siw, sit on none: they are no better a lane than the NIC they run over).
func (h *Host) RDMARelations(bdf string) map[string]Relation {
	out := map[string]Relation{}
	for name, dev := range h.RDMA {
		if dev != "" {
			out[name] = h.Relation(bdf, dev)
		}
	}
	return out
}

// NearestRDMA maps each GPU index ("0", "1", … in BDF order, as CUDA
// numbers them with CUDA_DEVICE_ORDER=PCI_BUS_ID) to its nearest RDMA
// device: lowest Rank, ties broken by natural name order. This is the JSON
// SGLang takes for --disaggregation-ib-device. Empty (not nil) when the
// host has no RDMA device on PCI.
func (h *Host) NearestRDMA() map[string]string {
	out := map[string]string{}
	names := h.rdmaNames()
	for i, gpu := range h.BDFs(KindGPU) {
		best, bestRank := "", 0
		for _, name := range names {
			r := h.Relation(gpu, h.RDMA[name]).Rank()
			if r >= 0 && (best == "" || r < bestRank) {
				best, bestRank = name, r
			}
		}
		if best != "" {
			out[strconv.Itoa(i)] = best
		}
	}
	return out
}

// WriteText writes the matrix in nvidia-smi topo -m's layout: tab-separated
// header and rows, CPU and NUMA affinity columns filled for GPUs, then the
// legend, a "NIC Legend:" block and, when there are NVMe columns (which
// nvidia-smi does not show), an "NVMe Legend:" block.
func (m Matrix) WriteText(w io.Writer) error {
	bw := bufio.NewWriter(w)
	hasGPU := false
	for _, d := range m.Devices {
		bw.WriteString("\t" + d.Name)
		hasGPU = hasGPU || d.Kind == KindGPU
	}
	if hasGPU {
		bw.WriteString("\tCPU Affinity\tNUMA Affinity")
	}
	bw.WriteString("\n")
	for i, d := range m.Devices {
		bw.WriteString(d.Name)
		for _, r := range m.Relations[i] {
			if r == RelSelf {
				bw.WriteString("\t X ")
			} else {
				bw.WriteString("\t" + string(r))
			}
		}
		if d.Kind == KindGPU {
			cpu, numa := "N/A", "N/A"
			if d.CPUAffinity != "" {
				cpu = d.CPUAffinity
			}
			if d.NUMANode >= 0 {
				numa = strconv.Itoa(d.NUMANode)
			}
			bw.WriteString("\t" + cpu + "\t" + numa)
		}
		bw.WriteString("\n")
	}
	bw.WriteString("\nLegend:\n\n" + Legend)
	var nics, nvmes []string
	for _, d := range m.Devices {
		switch d.Kind {
		case KindNIC:
			nics = append(nics, fmt.Sprintf("  %s: %s", d.Name, nicLabel(d)))
		case KindNVMe:
			nvmes = append(nvmes, fmt.Sprintf("  %s: %s", d.Name, d.BDF))
		}
	}
	if len(nics) > 0 {
		bw.WriteString("\nNIC Legend:\n\n" + strings.Join(nics, "\n") + "\n")
	}
	if len(nvmes) > 0 {
		bw.WriteString("\nNVMe Legend:\n\n" + strings.Join(nvmes, "\n") + "\n")
	}
	return bw.Flush()
}

// nicLabel names a NIC column as nvidia-smi does (its RDMA device), else
// by its net devices, else by BDF.
func nicLabel(d MatrixDevice) string {
	switch {
	case d.RDMA != "":
		return d.RDMA
	case len(d.NetDevs) > 0:
		return strings.Join(d.NetDevs, ",")
	}
	return d.BDF
}
