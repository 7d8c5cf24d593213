package checks

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/lanewatch/lanewatch/collectors"
	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/topology"
)

// HostScope is the scope of the host-wide checks.
const HostScope = "host"

// Host is what the host and process checks read: the procfs and sysfs
// roots, the PATH searched for numactl, and the topology under the sysfs
// root with its GPUs in PCI order.
type Host struct {
	ProcRoot, SysRoot, PathEnv string
	Topo                       *topology.Host
	GPUs                       []string
	// Loads are link states read under load, by device (PCI address, sysfs
	// form), for the link check; nil: none (GPU links are then not judged).
	Loads map[string]LinkLoad
}

// ReadHost reads the topology under sysRoot. An empty pathEnv is this
// process's PATH.
func ReadHost(procRoot, sysRoot, pathEnv string) (*Host, error) {
	topo, err := topology.Read(sysRoot)
	if err != nil {
		return nil, fmt.Errorf("read topology: %w", err)
	}
	if pathEnv == "" {
		pathEnv = os.Getenv("PATH")
	}
	return &Host{ProcRoot: procRoot, SysRoot: sysRoot, PathEnv: pathEnv, Topo: topo, GPUs: topo.BDFs(topology.KindGPU)}, nil
}

// HostChecks runs the host-wide checks in the checklist's order: PCI
// topology, the H2D path per GPU, the RDMA NIC per GPU (far-nic against
// ibDevices, the GPU index → RDMA device map the server was given; nil:
// not checked), PCIe link training, IOMMU, numactl, huge pages.
func (h *Host) HostChecks(ibDevices map[string]string) []Check {
	t := h.Topo
	nics, nvme := t.BDFs(topology.KindNIC), t.BDFs(topology.KindNVMe)
	detail := fmt.Sprintf("%d PCI functions, %d GPU, %d NIC, %d NVMe, %d NUMA node(s)", len(t.Functions), len(h.GPUs), len(nics), len(nvme), len(t.Nodes))
	topo := Check{Scope: HostScope, Name: "PCI topology", Status: Pass, Detail: detail + ": GPUs " + joinLimited(h.GPUs, 8)}
	if len(h.GPUs) == 0 {
		topo = Check{Scope: HostScope, Name: "PCI topology", Status: Skip,
			Detail: detail + ": no GPU on this host (no PCI function of class 0x0300/0x0302); GPU checks are skipped"}
	}
	return []Check{topo, h.pathCheck(), h.nicCheck(ibDevices), h.linkCheck(), h.iommuCheck(), h.numactlCheck(), h.hugepagesCheck()}
}

// pathCheck lists, per GPU, the H2D path from its own node's memory and the
// segment that bounds it: the ceiling a prefix-cache load can reach.
func (h *Host) pathCheck() Check {
	const name = "H2D path per GPU"
	if len(h.GPUs) == 0 {
		return Skipped(HostScope, name, "no GPU")
	}
	var lines []string
	for i, gpu := range h.GPUs {
		node := max(h.Topo.Functions[gpu].NUMANode, 0)
		p, err := h.Topo.HostToDevice(node, gpu)
		if err != nil {
			lines = append(lines, fmt.Sprintf("GPU%d: %v", i, err))
			continue
		}
		lines = append(lines, fmt.Sprintf("GPU%d from node %d: %s", i, node, PathText(p)))
	}
	return Check{Scope: HostScope, Name: name, Status: Pass, Detail: joinLimited(lines, 8)}
}

// PathText prints a path's segments and names its bottleneck.
func PathText(p topology.Path) string {
	names := make([]string, len(p.Segments))
	for i, s := range p.Segments {
		names[i] = s.Name + "(" + s.Dir + ")"
	}
	out := strings.Join(names, " → ")
	if p.Bottleneck >= 0 {
		b := p.Segments[p.Bottleneck]
		out += fmt.Sprintf("; bottleneck %s %.2f GB/s", b.Name, b.CapacityGBs)
	}
	return out
}

func (h *Host) nicCheck(ibDevices map[string]string) Check {
	const name = "RDMA NIC per GPU"
	t := h.Topo
	if len(t.RDMA) == 0 {
		return Skipped(HostScope, name, "no RDMA device (%s/class/infiniband is empty): GPUDirect RDMA checks are skipped", h.SysRoot)
	}
	if len(h.GPUs) == 0 {
		return Skipped(HostScope, name, "%d RDMA device(s) but no GPU", len(t.RDMA))
	}
	js, _ := json.Marshal(t.NearestRDMA())
	c := Check{Scope: HostScope, Name: name, Status: Pass, Detail: "nearest RDMA device per GPU (SGLang --disaggregation-ib-device): " + string(js)}
	for idx, used := range ibDevices {
		i, err := strconv.Atoi(idx)
		if err != nil || i < 0 || i >= len(h.GPUs) {
			c.Status, c.Detail = Warn, fmt.Sprintf("--ib-devices names GPU %q, this host has GPUs 0..%d", idx, len(h.GPUs)-1)
			continue
		}
		rel := map[string]topology.Relation{}
		for dev, bdf := range t.RDMA {
			if bdf != "" {
				rel[dev] = t.Relation(h.GPUs[i], bdf)
			}
		}
		if f := correlate.FarNIC(correlate.NICChoice{GPU: h.GPUs[i], Used: used, Relations: rel}); f != nil {
			c.Findings = append(c.Findings, *f)
		}
	}
	return c
}

func (h *Host) iommuCheck() Check {
	const name = "IOMMU"
	rdmaNICs := map[string]bool{}
	for _, bdf := range h.Topo.RDMA {
		rdmaNICs[bdf] = true
	}
	peer := len(h.GPUs) > 1 || (len(h.GPUs) > 0 && len(rdmaNICs) > 0)
	devs := append(slices.Clone(h.GPUs), slices.Sorted(maps.Keys(rdmaNICs))...)
	if len(devs) == 0 {
		return Skipped(HostScope, name, "no GPU or RDMA NIC to check")
	}
	c := Check{Scope: HostScope, Name: name, Status: Pass}
	var modes []string
	for _, bdf := range devs {
		f := h.Topo.Functions[bdf]
		if f == nil {
			continue
		}
		if f.IOMMUGroup < 0 {
			modes = append(modes, bdf+": no IOMMU group (not translated)")
			continue
		}
		modes = append(modes, fmt.Sprintf("%s: group %d %s", bdf, f.IOMMUGroup, f.IOMMUType))
		if fd := correlate.IOMMUTranslated(correlate.IOMMUFacts{Device: bdf, Group: f.IOMMUGroup, Type: f.IOMMUType, PeerExpected: peer}); fd != nil {
			c.Findings = append(c.Findings, *fd)
		}
	}
	c.Detail = joinLimited(modes, 6)
	return c
}

func (h *Host) numactlCheck() Check {
	const name = "numactl"
	path, err := collectors.FindNumactl(h.PathEnv)
	if len(h.Topo.Nodes) < 2 {
		if err != nil {
			return Check{Scope: HostScope, Name: name, Status: Pass, Detail: "one NUMA node: binding has nothing to choose (numactl is not installed either)"}
		}
		return Check{Scope: HostScope, Name: name, Status: Pass, Detail: "one NUMA node: binding has nothing to choose; numactl at " + path}
	}
	if err != nil {
		return Check{Scope: HostScope, Name: name, Status: Warn,
			Detail: fmt.Sprintf("%d NUMA nodes and no numactl in PATH=%s: SGLang skips its per-GPU NUMA binding silently", len(h.Topo.Nodes), h.PathEnv),
			Fix:    "install numactl (apt-get install numactl) in the server's image"}
	}
	return Check{Scope: HostScope, Name: name, Status: Pass, Detail: "numactl at " + path}
}

func (h *Host) hugepagesCheck() Check {
	m, err := collectors.ReadMeminfo(h.ProcRoot)
	if err != nil {
		return Skipped(HostScope, "hugepages", "cannot read meminfo: %v", err)
	}
	return Check{Scope: HostScope, Name: "hugepages", Status: Pass,
		Detail: fmt.Sprintf("%d of %d huge pages of %d KiB free; MemAvailable %d MiB of %d MiB",
			m.HugePagesFree, m.HugePagesTotal, m.HugepagesizeBytes>>10, m.MemAvailableBytes>>20, m.MemTotalBytes>>20)}
}

// PinnedPressure judges the pinned memory of the processes in byProcess
// (bytes) against what the host has left; what says where they were seen.
func (h *Host) PinnedPressure(byProcess map[uint32]uint64, what string) Check {
	m, err := collectors.ReadMeminfo(h.ProcRoot)
	if err != nil {
		return Skipped(HostScope, "pinned memory", "cannot read meminfo: %v", err)
	}
	facts := correlate.PinnedFacts{MemTotal: m.MemTotalBytes, MemAvailable: m.MemAvailableBytes, ByProcess: byProcess}
	for _, b := range byProcess {
		facts.PinnedBytes += b
	}
	c := Check{Scope: HostScope, Name: "pinned memory", Status: Pass,
		Detail: fmt.Sprintf("%d MiB pinned by %s, %d MiB of %d MiB available", facts.PinnedBytes>>20, what, m.MemAvailableBytes>>20, m.MemTotalBytes>>20)}
	if f := correlate.PinnedPressure(facts); f != nil {
		c.Findings = []correlate.Finding{*f}
	}
	return c
}
