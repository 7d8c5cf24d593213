package checks

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"slices"
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
	// Pinned is the pinned memory the caller saw registered, for
	// pinned-pressure; nil: not seen (no live window), a SKIP.
	Pinned *PinnedPools
	// Env reads the variables of processes' environments that decide
	// their GPU, once per process image (ReadHost makes one; a caller that
	// reads hosts repeatedly shares one). nil: read at each question.
	Env *collectors.EnvCache
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
	return &Host{ProcRoot: procRoot, SysRoot: sysRoot, PathEnv: pathEnv, Topo: topo, GPUs: topo.BDFs(topology.KindGPU),
		Env: collectors.NewEnvCache(procRoot)}, nil
}

// HostChecks runs the host-wide checks in the checklist's order: PCI
// topology, the H2D path per GPU, the RDMA NIC per GPU (far-nic against
// ibDevices, the RDMA devices the server was given; empty: not checked),
// PCIe link training, IOMMU, numactl, huge pages.
func (h *Host) HostChecks(ibDevices IBDevices) []Check {
	t := h.Topo
	nics, nvme := t.BDFs(topology.KindNIC), t.BDFs(topology.KindNVMe)
	detail := fmt.Sprintf("%d PCI functions, %d GPU, %d NIC, %d NVMe, %d NUMA node(s)", len(t.Functions), len(h.GPUs), len(nics), len(nvme), len(t.Nodes))
	// A listing: no topology is wrong in itself, the checks after it judge it.
	topo := Check{Scope: HostScope, Name: "PCI topology", Status: Info, Detail: detail + ": GPUs " + JoinLimited(h.GPUs, 8)}
	if len(h.GPUs) == 0 {
		topo = Check{Scope: HostScope, Name: "PCI topology", Status: Skip,
			Detail: detail + ": no GPU on this host (no PCI function of class 0x0300/0x0302); GPU checks are skipped"}
	}
	pinned := Skipped(HostScope, "pinned memory", "pinned pools are seen as they are registered: needs a live window (agent run, or diagnose --sample)")
	if h.Pinned != nil {
		pinned = h.PinnedPressure(h.Pinned.ByProcess, h.Pinned.Seen)
	}
	return []Check{topo, h.pathCheck(), h.nicCheck(ibDevices), h.linkCheck(), h.iommuCheck(), h.numactlCheck(), h.hugepagesCheck(), pinned}
}

// PinnedPools is the pinned memory of the processes the caller watched,
// bytes by process, and which processes those are, for pinned-pressure.
type PinnedPools struct {
	ByProcess map[uint32]uint64
	Seen      string
}

// pathCheck lists, per GPU, the H2D path from its own node's memory and the
// segment that bounds it: the ceiling a prefix-cache load can reach. It
// warns when that segment is upstream of the GPU's own link and narrower
// than it — a switch uplink or root port that caps every H2D below what
// the GPU's link can carry (seed 000, 链路带宽: the ceiling is the path's
// narrowest segment, and "Switch 上行口可能是瓶颈"). Capacities are each
// link's trained maximum, so an idle GPU's power-saving training neither
// hides nor makes this shape.
func (h *Host) pathCheck() Check {
	const name = "H2D path per GPU"
	if len(h.GPUs) == 0 {
		return Skipped(HostScope, name, "no GPU")
	}
	c := Check{Scope: HostScope, Name: name, Status: Pass}
	var lines, capped []string
	for i, gpu := range h.GPUs {
		node := max(h.Topo.Functions[gpu].NUMANode, 0)
		p, err := h.Topo.HostToDevice(node, gpu)
		if err != nil {
			lines = append(lines, fmt.Sprintf("GPU%d: %v", i, err))
			continue
		}
		lines = append(lines, fmt.Sprintf("GPU%d from node %d: %s", i, node, PathText(p)))
		if up, own, ok := upstreamBottleneck(p, gpu); ok {
			capped = append(capped, fmt.Sprintf("GPU%d %s: H2D capped at %.2f GB/s by %s, below its own link's %.2f GB/s",
				i, gpu, up.CapacityGBs, up.Name, own.CapacityGBs))
		}
	}
	c.Detail = JoinLimited(lines, 8)
	if len(capped) > 0 {
		c.Status = Warn
		c.Detail = JoinLimited(capped, 4) + "; " + c.Detail
		c.Fix = "a link above the GPU is narrower than the GPU's own: check that switch uplink or root port's width and speed " +
			"(bifurcation setting, riser, BIOS PCIe speed), or move the GPU to a slot whose path is as wide as its link"
	}
	return c
}

// upstreamBottleneck reports the path's bottleneck when it is a link above
// the GPU's own (link:<gpu>) and narrower than it; ties are not a cap.
func upstreamBottleneck(p topology.Path, gpu string) (up, own topology.Segment, ok bool) {
	if p.Bottleneck < 0 {
		return up, own, false
	}
	for _, s := range p.Segments {
		if s.Name == "link:"+gpu {
			own = s
		}
	}
	up = p.Segments[p.Bottleneck]
	return up, own, up.Kind == topology.SegLink && up.Name != own.Name && own.CapacityGBs > 0 && up.CapacityGBs < own.CapacityGBs
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

// nicCheck lists the nearest RDMA device of every GPU and, given the
// devices the server uses (ibDevices), judges each GPU's with far-nic: the
// nearest device it may use must be PIX/PXB when one exists. A GPU index
// or device the host does not have makes it WARN with what was not found.
func (h *Host) nicCheck(ibDevices IBDevices) Check {
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
	if ibDevices.Empty() {
		// Without the server's map there is nothing to judge: a listing.
		c.Status = Info
		c.Detail += "; give --ib-devices (the server's map) to check it for far NICs"
		return c
	}
	var notFound []string
	for _, dev := range ibDevices.Devices() {
		if _, ok := t.RDMA[dev]; !ok {
			notFound = append(notFound, dev)
		}
	}
	if len(notFound) > 0 {
		c.Status = Warn
		c.Detail = fmt.Sprintf("--ib-devices names %s, not an RDMA device of this host (%s); ", strings.Join(notFound, ", "),
			strings.Join(slices.Sorted(maps.Keys(t.RDMA)), ", ")) + c.Detail
	}
	for _, i := range ibDevices.GPUs(len(h.GPUs)) {
		if i >= len(h.GPUs) {
			c.Status = Warn
			c.Detail = fmt.Sprintf("--ib-devices names GPU %d, this host has GPUs 0..%d; ", i, len(h.GPUs)-1) + c.Detail
			continue
		}
		rel := t.RDMARelations(h.GPUs[i])
		if f := correlate.FarNIC(correlate.NICChoice{GPU: h.GPUs[i], Listed: ibDevices.For(i), Relations: rel}); f != nil {
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
	c.Detail = JoinLimited(modes, 6)
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
	// A listing: reserved huge pages are used only by servers asking for them
	// (SGLANG_HUGEPAGE_SIZE, seed 000) and no count is wrong in itself;
	// pinned pressure is judged by "pinned memory".
	return Check{Scope: HostScope, Name: "hugepages", Status: Info,
		Detail: fmt.Sprintf("%d of %d huge pages of %d KiB free; MemAvailable %d MiB of %d MiB",
			m.HugePagesFree, m.HugePagesTotal, m.HugepagesizeBytes>>10, m.MemAvailableBytes>>20, m.MemTotalBytes>>20)}
}

// PinnedPressure judges the pinned memory of the processes in byProcess
// (bytes) against what the host has left; what says where they were seen.
// HostChecks runs it over h.Pinned.
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
