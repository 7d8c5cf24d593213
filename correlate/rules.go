package correlate

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	"github.com/lanewatch/lanewatch/topology"
)

// The rules turn facts about the host, a process and its transfers into
// findings. Each rule is a pure function of its inputs (the agent gathers
// them), and each cites the seed's troubleshooting checklist
// (../shared/seeds/000_*.txt, "排查清单") or the section it comes from.

// Severity of a finding, in the checklist's terms.
type Severity string

const (
	SevInfo Severity = "info" // worth knowing, nothing to fix
	SevWarn Severity = "warn" // likely costs bandwidth; check it
	SevFail Severity = "fail" // costs bandwidth for sure; fix it
)

// Finding is one rule's verdict on one subject.
type Finding struct {
	Rule        string   `json:"rule"`
	Severity    Severity `json:"severity"`
	Subject     string   `json:"subject"` // what it is about: "pid 42 pool 0x7f00…+64 MiB", "GPU 0000:17:00.0"
	Summary     string   `json:"summary"`
	Evidence    []string `json:"evidence"`
	Remediation string   `json:"remediation"`
	Checklist   string   `json:"checklist"` // the seed checklist item or section it applies
}

// Checklist items of seed 000, quoted by the findings that apply them.
const (
	ChecklistPinned     = "L2→L1: is the source memory pinned (pageable adds a CPU copy and makes non_blocking synchronous)"
	ChecklistPoolNode   = "L2→L1: which NUMA node holds the host pool (topo -m NUMA affinity vs /proc/PID/numa_maps); was NUMA binding silently skipped"
	ChecklistFragments  = "L2→L1: is the transfer cut into too many small pieces (many small cudaMemcpyAsync)"
	ChecklistOverlap    = "L2→L1: is an RDMA receive or another inbound transfer using the GPU's inbound lane at the same time"
	ChecklistNIC        = "Topology: GPUDirect RDMA should use a PIX/PXB NIC"
	ChecklistLink       = "Link bandwidth: compute the path's ceiling from each link's generation and width"
	ChecklistIOMMU      = "IOMMU: devices may see IOVAs; translation and ACS can lengthen P2P paths"
	ChecklistPinnedMem  = "Host pool: pinned memory is taken out of what the kernel can reclaim"
	ChecklistCongestion = "RDMA (seed 002 §5, §6.2): posted is not completed; CNP/ECN/PFC and retransmissions explain a completion that comes late"
	// Seed 002 §5 "已提交 已完成 已可用是三件事" and §4.1.
	ChecklistNotifyOrder = "RDMA (seed 002 §5.3): QPs are not ordered with each other; data must complete, or travel on the same QP, before the notice that publishes it"
	ChecklistDeregOrder  = "RDMA (seed 002 §4.1): an MR must not be deregistered, nor its buffer freed or reused, while operations still use it"
)

// PoolPlacement is where the pages of one pinned host range live.
type PoolPlacement struct {
	PID         uint32
	Start, Size uint64
	GPU         string // PCI address of the GPU the range feeds
	GPUNode     int    // that GPU's NUMA node, -1 unknown
	PagesByNode map[int]uint64
	Source      string // how the pages were located: "move_pages", "numa_maps"
	// Sides: where each node sits from the GPU's (nil: unknown).
	Sides NodeSides
}

// RemoteNUMAPool fires when most pages of a pinned range sit on another
// socket than its GPU's node: every H2D from it crosses the socket
// interconnect. Most off the GPU's node but not surely on another socket
// (a sibling node of its socket, or a socket unknown) is INFO, saying
// which.
func RemoteNUMAPool(p PoolPlacement) *Finding {
	if p.GPUNode < 0 {
		return nil
	}
	o := splitOffHome(p.PagesByNode, p.GPUNode, p.Sides)
	sev := o.verdict(SevFail, 0)
	if sev == "" {
		return nil
	}
	nodes := slices.Sorted(maps.Keys(p.PagesByNode))
	var dist []string
	for _, n := range nodes {
		dist = append(dist, fmt.Sprintf("N%d=%d", n, p.PagesByNode[n]))
	}
	subject := fmt.Sprintf("pid %d pool %#x+%s", p.PID, p.Start, bytesText(p.Size))
	ev := []string{
		fmt.Sprintf("pages by node (%s): %s", p.Source, strings.Join(dist, " ")),
		fmt.Sprintf("GPU %s NUMA node %d", p.GPU, p.GPUNode),
		"where the nodes sit: " + strings.Join(o.why, "; "),
	}
	if sev == SevInfo {
		return newFinding("remote-numa-pool", SevInfo, subject,
			fmt.Sprintf("%.0f%% of the pool's pages are off GPU %s's NUMA node %d, %s",
				100*float64(o.off)/float64(o.located), p.GPU, p.GPUNode, o.where(p.GPUNode)), ev, "")
	}
	return newFinding("remote-numa-pool", SevFail, subject,
		fmt.Sprintf("%.0f%% of the pool's pages are on another socket than GPU %s's NUMA node %d: every H2D from it crosses the socket interconnect",
			100*float64(o.otherSocket)/float64(o.located), p.GPU, p.GPUNode),
		ev,
		fmt.Sprintf("allocate the pool on node %d: start the process under `numactl --cpunodebind=%d --membind=%d` "+
			"(SGLang does this itself unless it silently skips it; check its numa-bind log line)", p.GPUNode, p.GPUNode, p.GPUNode))
}

// BindFacts is what numa-bind-skipped looks at for one process.
type BindFacts struct {
	PID           uint32
	MemsAllowed   []int    // /proc/PID/status Mems_allowed_list
	OnlineNodes   []int    // /sys/devices/system/node/online
	Policies      []string // numa_maps policies of the process's pinned ranges (or all anonymous mappings)
	GPUNodes      []int    // NUMA nodes of the GPUs the process uses
	NumactlOnPath bool
	NumactlPath   string // PATH searched, for the evidence
	CapSysNice    bool
	Cpuset        string // /proc/PID/cpuset
}

var _ = register(Rule{Name: "numa-bind-skipped", Severities: []Severity{SevWarn}, Checklist: ChecklistPoolNode, Where: InHostCheck | InDiagnose,
	Remediation: "install numactl and grant CAP_SYS_NICE, or bind explicitly with numactl"})

// NUMABindSkipped fires when a process may allocate on every node while its
// GPUs sit on one: a binding that should have happened did not.
func NUMABindSkipped(f BindFacts) *Finding {
	if len(f.OnlineNodes) < 2 || len(f.GPUNodes) != 1 || f.GPUNodes[0] < 0 {
		return nil // nothing to bind to, or a process spanning GPUs on several nodes
	}
	if !slices.Equal(f.MemsAllowed, f.OnlineNodes) {
		return nil // memory is restricted: bound (cpuset or --membind)
	}
	for _, p := range f.Policies {
		if strings.HasPrefix(p, "bind") || strings.HasPrefix(p, "prefer") {
			return nil // bound by policy
		}
	}
	ev := []string{
		fmt.Sprintf("Mems_allowed_list %s = every online node", intsText(f.MemsAllowed)),
		fmt.Sprintf("memory policies of its pools: %s", strings.Join(uniq(f.Policies), ", ")),
		fmt.Sprintf("its GPU is on node %d", f.GPUNodes[0]),
	}
	var reasons []string
	if !f.NumactlOnPath {
		reasons = append(reasons, "numactl is not installed (not found in PATH="+f.NumactlPath+"): SGLang skips the binding with only a debug log")
	}
	if !f.CapSysNice {
		reasons = append(reasons, "the process lacks CAP_SYS_NICE (containers drop it): setting a memory policy fails")
	}
	if f.Cpuset != "" && f.Cpuset != "/" {
		reasons = append(reasons, "the process runs in cpuset "+f.Cpuset+", which may refuse the policy")
	}
	if len(reasons) == 0 {
		reasons = append(reasons, "no reason visible on the host: the launcher did not ask for a binding")
	}
	ev = append(ev, "likely reason: "+strings.Join(reasons, "; "))
	return newFinding("numa-bind-skipped", SevWarn, fmt.Sprintf("pid %d", f.PID),
		fmt.Sprintf("the process may allocate on every node while its GPU is on node %d: NUMA binding was skipped", f.GPUNodes[0]),
		ev,
		fmt.Sprintf("install numactl and grant CAP_SYS_NICE (docker --cap-add SYS_NICE), or bind explicitly: numactl --cpunodebind=%d --membind=%d", f.GPUNodes[0], f.GPUNodes[0]))
}

// NICChoice is the RDMA devices a server may use for one GPU's traffic and
// the relations it could have had.
type NICChoice struct {
	GPU string
	// Listed are the devices the server was given for this GPU: one, or a
	// list (SGLang's --disaggregation-ib-device "mlx5_0,mlx5_1", seed 000),
	// of which the transfer engine uses the nearest (Mooncake prefers the
	// listed devices closest to the GPU and falls back to the others).
	Listed    []string
	Relations map[string]topology.Relation // every RDMA device → relation to the GPU (PIX, PXB, PHB, NODE, SYS)
}

var _ = register(Rule{Name: "far-nic", Severities: []Severity{SevWarn}, Checklist: ChecklistNIC, Where: InDiagnose,
	Remediation: "map each GPU to its nearest NIC (SGLang --disaggregation-ib-device, NCCL_IB_HCA, Mooncake/NIXL device lists); `agent topo` prints the map"})

// FarNIC fires when the nearest device a GPU's RDMA traffic may use is at
// PHB/NODE/SYS while a PIX/PXB NIC exists: GPUDirect RDMA then crosses the
// host bridge or socket. Other relations (X, NV#, unknown) and listed
// devices the host does not have never fire it nor count as near.
func FarNIC(c NICChoice) *Finding {
	used, best := "", 0
	for _, nic := range c.Listed {
		if r := c.Relations[nic].Rank(); r > 0 && (best == 0 || r < best) {
			used, best = nic, r
		}
	}
	if best == 0 || best <= topology.RelPXB.Rank() {
		return nil // a near device is listed, or none with a known relation
	}
	var near []string
	for nic, rel := range c.Relations {
		if r := rel.Rank(); r >= topology.RelPIX.Rank() && r <= topology.RelPXB.Rank() {
			near = append(near, nic+" ("+string(rel)+")")
		}
	}
	if len(near) == 0 {
		return nil
	}
	sort.Strings(near)
	ev := []string{fmt.Sprintf("%s is %s to the GPU", used, c.Relations[used])}
	if len(c.Listed) > 1 {
		var listed []string
		for _, nic := range c.Listed {
			rel := string(c.Relations[nic])
			if rel == "" {
				rel = "not on this host"
			}
			listed = append(listed, nic+" ("+rel+")")
		}
		ev = append(ev, "listed for this GPU: "+strings.Join(listed, ", ")+"; the transfer engine prefers the nearest")
	}
	ev = append(ev, "closer: "+strings.Join(near, ", "))
	return newFinding("far-nic", SevWarn, "GPU "+c.GPU,
		fmt.Sprintf("RDMA for GPU %s uses %s (%s) while %s is closer", c.GPU, used, c.Relations[used], strings.Join(near, ", ")),
		ev, "")
}

// LinkFacts is one PCIe link: what each end can train to, the state it was
// read in, and the traffic it carried when read.
type LinkFacts struct {
	Device string // "gpu 0000:17:00.0"
	// DeviceGTs and DeviceWidth are the device's maximum (max_link_*, or
	// NVML/DCGM's max generation and width); SlotGTs and SlotWidth the
	// slot's, the upstream port's max_link_* (0: unknown, or none). The link
	// trains to the lower of both (topology.LinkCapacity).
	DeviceGTs   float64
	DeviceWidth int
	SlotGTs     float64
	SlotWidth   int
	// CurGTs and CurWidth are the training as read; 0 unknown. Source says
	// where: "sysfs", "nvml", "dcgm".
	CurGTs   float64
	CurWidth int
	Source   string
	// BusyBytesPerSec is the traffic the link carried while its state was
	// read (GPU counters on both sides of the read); 0 = idle or unknown.
	BusyBytesPerSec float64
	// IdleTrainsDown is true for devices that lower their link's speed and
	// width when idle — GPUs: "These may be reduced when the GPU is not in
	// use" (nvidia-smi, pcie.link.gen.current/width.current; samples
	// lspci_vv/asus_* at 2.5GT/s (downgraded)). Their training is judged
	// under load only; other devices' width at any time.
	IdleTrainsDown bool
}

// LinkBusyBps is the traffic (bytes/s, both directions) from which a link
// counts as loaded: below it a low speed is power saving, not a fault (seen
// on idle GPUs in the samples).
const LinkBusyBps = 100e6

var _ = register(Rule{Name: "link-degraded", Severities: []Severity{SevFail, SevInfo}, Checklist: ChecklistLink, Where: InHostCheck | InDiagnose,
	Remediation: "fail: reseat the card or riser, check the slot's bifurcation and the BIOS PCIe speed setting, then retrain (reboot); " +
		"info (slot-limited): the slot sets the ceiling, move the card to a slot as wide and fast as it is if the bandwidth matters"})

// LinkDegraded judges a link's training against what it can train to, the
// lower of the device's and the slot's maximum (seed 000 链路带宽: the path's
// ceiling is each link's generation × width). It fails when the link runs
// narrower or slower than that while carrying traffic (narrower at any time
// for devices that do not train down when idle); idle downtraining is never
// a finding. A slot that caps the card (an x16 card in an x8 slot) is worth
// knowing and nothing to reseat: info, "slot-limited".
func LinkDegraded(l LinkFacts) *Finding {
	capGTs := minKnown(l.DeviceGTs, l.SlotGTs)
	capW := int(minKnown(float64(l.DeviceWidth), float64(l.SlotWidth)))
	capGBs := topology.LinkGBs(capGTs, capW)
	if capGBs == 0 {
		return nil // what the link trains to is unknown (virtual device)
	}
	curGBs := topology.LinkGBs(l.CurGTs, l.CurWidth)
	loaded := l.BusyBytesPerSec >= LinkBusyBps
	state := "idle or load unknown"
	if loaded {
		state = fmt.Sprintf("while carrying %.2f GB/s", l.BusyBytesPerSec/1e9)
	}
	slot := "no slot above (host bridge)"
	if l.SlotGTs > 0 || l.SlotWidth > 0 {
		slot = "slot " + genWidth(l.SlotGTs, l.SlotWidth)
	}
	ev := []string{
		fmt.Sprintf("trained %s (%.2f GB/s per direction) %s, read from %s", genWidth(l.CurGTs, l.CurWidth), curGBs, state, l.Source),
		fmt.Sprintf("trains to %s (%.2f GB/s): device %s, %s", genWidth(capGTs, capW), capGBs, genWidth(l.DeviceGTs, l.DeviceWidth), slot),
	}
	slotLimited := (l.SlotGTs > 0 && l.DeviceGTs > l.SlotGTs) || (l.SlotWidth > 0 && l.DeviceWidth > l.SlotWidth)
	switch {
	case (loaded || !l.IdleTrainsDown) && l.CurWidth > 0 && l.CurWidth < capW:
		return newFinding("link-degraded", SevFail, l.Device,
			fmt.Sprintf("link trained at x%d of x%d %s: its ceiling is %.2f GB/s instead of %.2f", l.CurWidth, capW, state, curGBs, capGBs),
			ev, "the card and its slot both support x"+fmt.Sprint(capW)+": reseat the card or riser, check the slot's bifurcation setting and the BIOS, then retrain (reboot)")
	case loaded && l.CurGTs > 0 && l.CurGTs < capGTs:
		return newFinding("link-degraded", SevFail, l.Device,
			fmt.Sprintf("link runs at %.1f GT/s of %.1f %s", l.CurGTs, capGTs, state),
			ev, "a link that stays slow under load is trained down: check the slot, riser and BIOS PCIe speed setting")
	case slotLimited:
		return newFinding("link-degraded", SevInfo, l.Device,
			fmt.Sprintf("slot-limited: a %s device in a %s slot trains to %s, %.2f GB/s of the device's %.2f", genWidth(l.DeviceGTs, l.DeviceWidth),
				genWidth(l.SlotGTs, l.SlotWidth), genWidth(capGTs, capW), capGBs, topology.LinkGBs(l.DeviceGTs, l.DeviceWidth)),
			ev, "nothing to reseat: the slot sets this ceiling; move the card to a slot as wide and fast as it is if the bandwidth matters")
	}
	return nil
}

// genWidth prints "Gen4 x16" ("Gen? x16" for an unknown rate).
func genWidth(gts float64, width int) string {
	g, w := "Gen?", "x?"
	if n := topology.Generation(gts); n > 0 {
		g = fmt.Sprintf("Gen%d", n)
	}
	if width > 0 {
		w = fmt.Sprintf("x%d", width)
	}
	return g + " " + w
}

// minKnown is the smaller of two values where 0 means unknown.
func minKnown(a, b float64) float64 {
	switch {
	case a == 0:
		return b
	case b == 0:
		return a
	}
	return min(a, b)
}

// PinnedFacts is pinned host memory against what the kernel has left.
type PinnedFacts struct {
	PinnedBytes  uint64 // registered + pinned allocations seen, all processes
	MemTotal     uint64
	MemAvailable uint64
	ByProcess    map[uint32]uint64
}

var _ = register(Rule{Name: "pinned-pressure", Severities: []Severity{SevWarn, SevFail}, Checklist: ChecklistPinnedMem, Where: InHostCheck | InDiagnose,
	Remediation: "size the host KV pool (e.g. SGLang --hicache-ratio/--hicache-size) to leave headroom; pinned pages cannot be swapped or reclaimed"})

// PinnedPressure fires when pinned memory takes a large share of RAM:
// pinned pages cannot be reclaimed, so the rest of the host runs short.
func PinnedPressure(p PinnedFacts) *Finding {
	if p.MemTotal == 0 || p.PinnedBytes == 0 {
		return nil
	}
	share := float64(p.PinnedBytes) / float64(p.MemTotal)
	avail := float64(p.MemAvailable) / float64(p.MemTotal)
	sev := Severity("")
	switch {
	case avail < 0.05 && share > 0.25:
		sev = SevFail
	case share > 0.5 || avail < 0.10:
		sev = SevWarn
	default:
		return nil
	}
	var procs []string
	for pid, b := range p.ByProcess {
		procs = append(procs, fmt.Sprintf("pid %d: %s", pid, bytesText(b)))
	}
	sort.Strings(procs)
	return newFinding("pinned-pressure", sev, "host memory",
		fmt.Sprintf("%s pinned (%.0f%% of RAM), %s available (%.0f%%)",
			bytesText(p.PinnedBytes), 100*share, bytesText(p.MemAvailable), 100*avail),
		append([]string{fmt.Sprintf("MemTotal %s, MemAvailable %s", bytesText(p.MemTotal), bytesText(p.MemAvailable))}, procs...),
		"")
}

// IOMMUFacts is the DMA translation mode of the devices that do P2P.
type IOMMUFacts struct {
	Device       string // "GPU 0000:17:00.0"
	Group        int
	Type         string // iommu_groups/N/type: DMA, DMA-FQ, identity, …
	PeerExpected bool   // a GPU with an RDMA NIC (GPUDirect RDMA) or another GPU over PCIe
}

var _ = register(Rule{Name: "iommu-translated", Severities: []Severity{SevWarn}, Checklist: ChecklistIOMMU, Where: InHostCheck | InDiagnose,
	Remediation: "translation costs IOTLB misses on every DMA, and with ACS on, switch-local P2P is sent up to the root complex and back. " +
		"Do not turn the IOMMU off blindly: first confirm the mapping mode your GPU/NIC drivers require and measure a translation bottleneck; " +
		"then consider passthrough for these devices (iommu=pt) and ACS settings per the platform's GPUDirect guide"})

// IOMMUTranslated fires where DMA translation is on for a device that is
// expected to do GPUDirect P2P.
func IOMMUTranslated(f IOMMUFacts) *Finding {
	if !f.PeerExpected || (f.Type != "DMA" && f.Type != "DMA-FQ") {
		return nil
	}
	return newFinding("iommu-translated", SevWarn, f.Device,
		fmt.Sprintf("DMA translation is on (IOMMU group %d, type %s) for a device expected to do GPUDirect P2P", f.Group, f.Type),
		[]string{fmt.Sprintf("/sys/kernel/iommu_groups/%d/type = %s", f.Group, f.Type)},
		"")
}

// Pageable-copy thresholds (seed 000 L2→L1 #1: pageable memory adds a CPU
// staging copy and makes non_blocking synchronous), calibrated on real
// call streams (PyTorch profiler traces, issue 20): 45 pageable H2D copies
// of 64–384 B beside 253 MB of pinned loads are no problem; 16 pageable
// H2D copies carrying 244 MB are the problem.
const (
	// metadataCopy: a pageable copy under 64 KiB is a step's inputs or
	// outputs (positions, lengths, token ids: torch.tensor(list).to(dev,
	// non_blocking=True), .tolist()), latency-bound whatever its memory:
	// its staging memcpy (under 13 µs at 5 GB/s) costs no more than the
	// copy's own fixed cost. Reported (INFO, with their count), not judged.
	metadataCopy = smallCopy
	// pageableMinBytes: under 16 MiB of larger pageable copies in a window,
	// staging costs a CPU under ~3 ms (memcpy at ~5 GB/s), a third of a
	// percent of the default 10 s window: nothing worth a page. A pageable
	// KV pool clears it with one request's load (a prefix of tens to
	// hundreds of MiB; 16 layers x 4 MiB in decode-loop-loads), while a
	// test that copies a buffer or two from the stack does not
	// (default-kind: 2 MiB, half of its bytes).
	pageableMinBytes = 16 << 20
	// pageableFailShare: when half or more of the bytes the process moved
	// between host memory and its GPU went through a staging copy, its
	// host↔GPU rate is bounded by one CPU's memcpy: FAIL.
	pageableFailShare = 0.5
	// pageableWarnShare: a tenth or more costs a measurable part of the
	// transfers' time: WARN. Less is worth knowing: INFO.
	pageableWarnShare = 0.1
)

// MetadataSized reports whether a copy is metadata-sized (under
// metadataCopy bytes): a pageable one is reported, not judged.
func MetadataSized(bytes uint64) bool { return bytes < metadataCopy }

// PageableFacts is one process's pageable copies over a window (element
// reads, .item()-style, are not among them: a synchronisation, judged by
// host-sync-in-loop), against every byte it moved between host memory and
// its GPU (H2D and D2H, whatever the host memory).
type PageableFacts struct {
	PID uint32
	// Bulk and BulkBytes are the pageable copies of at least metadataCopy
	// bytes; Metadata and MetadataBytes the smaller ones.
	Bulk, Metadata           int
	BulkBytes, MetadataBytes uint64
	HostBytes                uint64 // every H2D and D2H copy's bytes
	APIs                     []string
}

// pageable-copy: fail/warn by the share of host↔GPU bytes pageable copies
// carried, info for metadata-sized ones and small shares (rules.go).
var _ = register(Rule{Name: "pageable-copy", Severities: []Severity{SevFail, SevWarn, SevInfo}, Checklist: ChecklistPinned, Where: InWindow | InDiagnose,
	Remediation: "register the host buffer (cudaHostRegister, or torch pin_memory()) once at start-up, or allocate it pinned (cudaHostAlloc)"})

// PageableCopies judges a process's pageable copies by bytes: the share of
// its host↔GPU bytes that larger pageable copies carried, with an absolute
// floor, decides FAIL or WARN; metadata-sized copies and small shares are
// INFO with their count; nil when it made none.
func PageableCopies(f PageableFacts) *Finding {
	if f.Bulk+f.Metadata == 0 {
		return nil
	}
	share := 0.0
	if f.HostBytes > 0 {
		share = float64(f.BulkBytes) / float64(f.HostBytes)
	}
	ev := []string{
		fmt.Sprintf("%d pageable copies of 64 KiB or more (%s), %.1f%% of the %s moved between host memory and the GPU",
			f.Bulk, bytesText(f.BulkBytes), 100*share, bytesText(f.HostBytes)),
		fmt.Sprintf("%d metadata-sized pageable copies under 64 KiB (%s): a step's inputs and outputs, not judged", f.Metadata, bytesText(f.MetadataBytes)),
		"APIs: " + strings.Join(uniq(f.APIs), ", "),
	}
	sev := SevInfo
	switch {
	case f.BulkBytes >= pageableMinBytes && share >= pageableFailShare:
		sev = SevFail
	case f.BulkBytes >= pageableMinBytes && share >= pageableWarnShare:
		sev = SevWarn
	}
	if sev == SevInfo {
		return newFinding("pageable-copy", SevInfo, fmt.Sprintf("pid %d", f.PID),
			fmt.Sprintf("%d copies (%s) used pageable host memory: too few bytes to cost bandwidth (%d metadata-sized)",
				f.Bulk+f.Metadata, bytesText(f.BulkBytes+f.MetadataBytes), f.Metadata),
			ev, "nothing to fix; pin the buffers if they grow (torch pin_memory(), cudaHostRegister)")
	}
	return newFinding("pageable-copy", sev, fmt.Sprintf("pid %d", f.PID),
		fmt.Sprintf("%d copies (%s, %.0f%% of the host↔GPU bytes) used pageable host memory: each is staged through a CPU copy and blocks the caller",
			f.Bulk, bytesText(f.BulkBytes), 100*share),
		ev, "")
}

// Fragmentation thresholds (seed 000 L2→L1 #4, "传输是否被切成太多小段"):
// a copy under smallCopy bytes is latency-bound — the fixed cost of a copy
// (submission, DMA setup, a PCIe read round trip of microseconds) is
// comparable to its time on the wire (64 KiB at 25 GB/s is 2.6 µs);
// fragmentMin small copies in a direction before they mean anything.
// Copies under elementCopy bytes are element reads and writes (`.item()`,
// a scalar fill: one value of at most 16 bytes, complex128), never a
// piece of a KV transfer (one head of one token is at least 64 bytes):
// they are a synchronisation (L2→L1 #3), not fragmentation, and are
// counted apart. The direction is judged by the copies that carry the
// bulk of its bytes (half or more), never by the count of small ones: a
// decode loop's metadata copies beside large loads are no fragmented
// transfer. fragmentMinRate: small copies that move under 10 MB/s over
// the direction's active span (a decode step's few KiB of inputs, at up
// to a thousand steps a second) use under 0.04% of a Gen4 x16 lane: no
// coalescing would gain bandwidth, they are inputs, not a transfer cut
// into pieces (which moves hundreds of MB/s while it runs).
const (
	smallCopy       = 64 << 10
	elementCopy     = 32
	fragmentMin     = 256
	fragmentMinRate = 0.01 // GB/s (bytes per ns)
)

// FragmentDirections are the directions fragmentation is judged in: the
// two that cross the GPU's PCIe link. D2D copies stay in GPU memory, H2H
// and unknown ones are not on the link (or not known to be).
var FragmentDirections = []string{DirH2D, DirD2H}

var _ = register(Rule{Name: "fragmented-copies", Severities: []Severity{SevWarn}, Checklist: ChecklistFragments, Where: InWindow | InDiagnose,
	Remediation: "coalesce pages into larger copies (a page-first/layer-first layout), or use a batched copy (cudaMemcpyBatchAsync) or a copy kernel"})

// Fragmentation fires when the copies that carry most of one direction's
// bytes are small, and there are many: that direction's transfer is
// latency-bound (per-copy overhead) instead of bandwidth-bound. Each
// direction is judged on its own, so small D2H reads next to large H2D
// loads never make an H2D finding; element-sized copies are left out.
// achievedGBs is the direction's rate over its active span (all its
// copies' bytes).
func Fragmentation(pid uint32, direction string, sizes SizeHistogram, achievedGBs float64) *Finding {
	if !slices.Contains(FragmentDirections, direction) {
		return nil
	}
	elements, elementBytes := sizes.CountBelow(elementCopy), sizes.BytesBelow(elementCopy)
	total, bytes := sizes.Count()-elements, sizes.Bytes()-elementBytes
	small, smallBytes := sizes.CountBelow(smallCopy)-elements, sizes.BytesBelow(smallCopy)-elementBytes
	if small < fragmentMin || smallBytes*2 < bytes || sizes.Bytes() == 0 {
		return nil
	}
	smallRate := achievedGBs * float64(smallBytes) / float64(sizes.Bytes())
	if smallRate < fragmentMinRate {
		return nil
	}
	ev := []string{
		direction + " size distribution: " + sizes.String(),
		fmt.Sprintf("copies under 64 KiB carried %s of %s (%.0f%%), %.2f GB/s over the direction's active span",
			bytesText(smallBytes), bytesText(bytes), 100*float64(smallBytes)/float64(max(bytes, 1)), smallRate),
	}
	if elements > 0 {
		ev = append(ev, fmt.Sprintf("%d element-sized copies (under %d B, .item()-style) not counted", elements, elementCopy))
	}
	return newFinding("fragmented-copies", SevWarn, fmt.Sprintf("pid %d %s", pid, direction),
		fmt.Sprintf("%d of %d %s copies are under 64 KiB and carry %.0f%% of its bytes; achieved %.2f GB/s", small, total, direction,
			100*float64(smallBytes)/float64(max(bytes, 1)), achievedGBs),
		ev, "")
}

// SizeHistogram counts copies and their bytes in power-of-two size
// buckets (bucket i holds sizes in [2^i, 2^(i+1))).
type SizeHistogram struct {
	n, b [48]uint64
}

// Add counts one copy of n bytes.
func (h *SizeHistogram) Add(n uint64) {
	i, v := 0, n
	for v > 1 && i < len(h.n)-1 {
		v >>= 1
		i++
	}
	h.n[i]++
	h.b[i] += n
}

// Count is the number of copies, Bytes their bytes.
func (h *SizeHistogram) Count() uint64 { return sum(h.n[:]) }
func (h *SizeHistogram) Bytes() uint64 { return sum(h.b[:]) }

// CountBelow counts copies smaller than limit (a power of two), BytesBelow
// their bytes.
func (h *SizeHistogram) CountBelow(limit uint64) uint64 { return sum(h.n[:bucketOf(limit)]) }
func (h *SizeHistogram) BytesBelow(limit uint64) uint64 { return sum(h.b[:bucketOf(limit)]) }

// bucketOf is the first bucket whose sizes are all at least limit, a power
// of two.
func bucketOf(limit uint64) int {
	i := 0
	for i < 48 && uint64(1)<<i < limit {
		i++
	}
	return i
}

func sum(v []uint64) uint64 {
	var t uint64
	for _, x := range v {
		t += x
	}
	return t
}

func (h *SizeHistogram) String() string {
	var parts []string
	for i, v := range h.n {
		if v > 0 {
			parts = append(parts, fmt.Sprintf("[%s,%s):%d", bytesText(1<<i), bytesText(1<<(i+1)), v))
		}
	}
	return strings.Join(parts, " ")
}

func bytesText(b uint64) string {
	switch {
	case b >= 1<<30 && b%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", b>>30)
	case b >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30))
	case b >= 1<<20 && b%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", b>>20)
	case b >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
	case b >= 1<<10 && b%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", b>>10)
	}
	return fmt.Sprintf("%d B", b)
}

func intsText(v []int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = fmt.Sprint(x)
	}
	return strings.Join(s, ",")
}

func uniq(v []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, s := range v {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	sort.Strings(out)
	return out
}
