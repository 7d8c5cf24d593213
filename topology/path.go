package topology

import (
	"fmt"
	"math"
	"strconv"
)

// Segment kinds.
const (
	SegDRAM       = "dram"       // a node's memory
	SegSocket     = "socket"     // the socket interconnect (UPI, xGMI) between two nodes
	SegHostBridge = "hostbridge" // a PCIe root complex / host bridge
	SegLink       = "link"       // one physical PCIe link
)

// Segment directions. PCIe links and host bridges carry "up" (toward the
// CPU) and "down" independently; "peer" is a peer-to-peer turn inside one
// host bridge. DRAM is "read" (the data leaves memory) or "write". A socket
// segment's direction is the flow, "node0->node1"; its Name is the
// unordered pair, so both flows are the same segment in two directions.
const (
	DirUp    = "up"
	DirDown  = "down"
	DirPeer  = "peer"
	DirRead  = "read"
	DirWrite = "write"
)

// Segment is one hop of a transfer's path in one direction.
type Segment struct {
	// Name identifies the hop: "dram:node0", "socket:node0-node1",
	// "hostbridge:pci0000:17", "link:0000:18:00.0" (the link above that
	// function).
	Name string `json:"name"`
	Kind string `json:"kind"`
	Dir  string `json:"dir"`
	// CapacityGBs is the per-direction payload rate the hop can carry, GB/s;
	// 0 = unknown. For a link it is the trained maximum (LinkCapacity: the
	// best state both ends support), never the current training, which an
	// idle GPU lowers to save power. CurrentGBs is the link's rate at its
	// current training as read (0 unknown): below CapacityGBs at idle is
	// normal; under load it is link-degraded's business.
	CapacityGBs float64 `json:"capacity_gbs"`
	CurrentGBs  float64 `json:"current_gbs"`
}

// Path is the ordered list of segments a transfer crosses, source first.
type Path struct {
	Segments []Segment `json:"segments"`
	// Bottleneck is the index of the narrowest segment with a known
	// capacity (the first on ties); -1 when none is known.
	Bottleneck int `json:"bottleneck"`
	// Unknown says what the path could not decide (e.g. a device on an
	// unknown NUMA node on a multi-node host: no socket segment added).
	Unknown []string `json:"unknown,omitempty"`
}

// PathOptions supplies capacities sysfs does not know.
type PathOptions struct {
	DRAMGBs   map[int]float64 // per node, per direction; absent = unknown
	SocketGBs float64         // per direction of the socket interconnect; 0 = unknown
}

// HostToDevice is H2D: a GPU copy engine reading node's memory. Every PCIe
// segment is "down".
func (h *Host) HostToDevice(node int, gpuBDF string, opts ...PathOptions) (Path, error) {
	return h.hostPath(node, gpuBDF, KindGPU, true, opts)
}

// DeviceToHost is D2H: the GPU writing node's memory; every PCIe segment
// is "up".
func (h *Host) DeviceToHost(gpuBDF string, node int, opts ...PathOptions) (Path, error) {
	return h.hostPath(node, gpuBDF, KindGPU, false, opts)
}

// HostToNIC is an RDMA send (or NIC read) from node's memory.
func (h *Host) HostToNIC(node int, nicBDF string, opts ...PathOptions) (Path, error) {
	return h.hostPath(node, nicBDF, KindNIC, true, opts)
}

// NICToHost is an RDMA receive into node's memory.
func (h *Host) NICToHost(nicBDF string, node int, opts ...PathOptions) (Path, error) {
	return h.hostPath(node, nicBDF, KindNIC, false, opts)
}

// NVMeToHost is a storage read DMA'd into node's memory.
func (h *Host) NVMeToHost(nvmeBDF string, node int, opts ...PathOptions) (Path, error) {
	return h.hostPath(node, nvmeBDF, KindNVMe, false, opts)
}

func (h *Host) hostPath(node int, bdf, kind string, toDevice bool, opts []PathOptions) (Path, error) {
	var opt PathOptions
	if len(opts) > 0 {
		opt = opts[0]
	}
	f, err := h.function(bdf, kind)
	if err != nil {
		return Path{}, err
	}
	if err := h.checkNode(node); err != nil {
		return Path{}, err
	}
	var p Path
	dram := Segment{Name: "dram:node" + strconv.Itoa(node), Kind: SegDRAM, Dir: DirRead, CapacityGBs: opt.DRAMGBs[node]}
	dram.CurrentGBs = dram.CapacityGBs
	dir := DirDown
	if !toDevice {
		dram.Dir, dir = DirWrite, DirUp
	}
	// Built host→device, reversed at the end for device→host.
	p.Segments = append(p.Segments, dram)
	from, to := node, f.NUMANode
	if !toDevice {
		from, to = to, from
	}
	if s, ok := h.socketSegment(from, to, opt, &p); ok {
		p.Segments = append(p.Segments, s)
	}
	p.Segments = append(p.Segments, Segment{Name: "hostbridge:" + f.HostBridge, Kind: SegHostBridge, Dir: dir})
	p.Segments = append(p.Segments, h.links(f.Chain, 0, dir)...)
	if !toDevice {
		reverse(p.Segments)
	}
	p.Bottleneck = bottleneck(p.Segments)
	return p, nil
}

// DeviceToDevice is a peer-to-peer transfer, e.g. NIC→GPU GPUDirect RDMA
// receive: up from src to the lowest common bridge, down to dst. Without a
// common bridge it turns in the host bridge ("peer"); across host bridges
// it goes up one, over the socket interconnect if the nodes differ, and
// down the other.
func (h *Host) DeviceToDevice(srcBDF, dstBDF string, opts ...PathOptions) (Path, error) {
	var opt PathOptions
	if len(opts) > 0 {
		opt = opts[0]
	}
	src, err := h.function(srcBDF, "")
	if err != nil {
		return Path{}, err
	}
	dst, err := h.function(dstBDF, "")
	if err != nil {
		return Path{}, err
	}
	if srcBDF == dstBDF {
		return Path{}, fmt.Errorf("topology: %s: a transfer within one function has no PCIe path", srcBDF)
	}
	var p Path
	k := 0
	if src.HostBridge == dst.HostBridge {
		k = commonPrefix(src.Chain, dst.Chain)
	}
	up := h.links(src.Chain, k, DirUp)
	reverse(up)
	p.Segments = append(p.Segments, up...)
	switch {
	case src.HostBridge == dst.HostBridge && k == 0:
		p.Segments = append(p.Segments, Segment{Name: "hostbridge:" + src.HostBridge, Kind: SegHostBridge, Dir: DirPeer})
	case src.HostBridge != dst.HostBridge:
		p.Segments = append(p.Segments, Segment{Name: "hostbridge:" + src.HostBridge, Kind: SegHostBridge, Dir: DirUp})
		if s, ok := h.socketSegment(src.NUMANode, dst.NUMANode, opt, &p); ok {
			p.Segments = append(p.Segments, s)
		}
		p.Segments = append(p.Segments, Segment{Name: "hostbridge:" + dst.HostBridge, Kind: SegHostBridge, Dir: DirDown})
	}
	p.Segments = append(p.Segments, h.links(dst.Chain, k, DirDown)...)
	p.Bottleneck = bottleneck(p.Segments)
	return p, nil
}

// Conflict returns the segments a and b both use in the same direction,
// in a's order: where they must share bandwidth. PCIe is full duplex, so
// H2D and D2H share none.
func Conflict(a, b Path) []Segment {
	var out []Segment
	for _, s := range a.Segments {
		for _, t := range b.Segments {
			if s.Name == t.Name && s.Dir == t.Dir {
				out = append(out, s)
				break
			}
		}
	}
	return out
}

func (h *Host) function(bdf, kind string) (*Function, error) {
	f, ok := h.Functions[bdf]
	if !ok {
		return nil, fmt.Errorf("topology: no PCI function %s", bdf)
	}
	if kind != "" && f.Kind() != kind {
		return nil, fmt.Errorf("topology: %s is a %s, not a %s", bdf, f.Kind(), kind)
	}
	return f, nil
}

func (h *Host) checkNode(n int) error {
	if n < 0 {
		return fmt.Errorf("topology: memory node %d: want a node number", n)
	}
	if _, ok := h.Node(n); !ok && len(h.Nodes) > 0 {
		return fmt.Errorf("topology: no NUMA node %d on this host", n)
	}
	return nil
}

// socketSegment is the interconnect hop for data flowing from node a to
// node b; none when they are the same. An unknown node on a multi-node
// host is noted in p.Unknown rather than guessed.
func (h *Host) socketSegment(a, b int, opt PathOptions, p *Path) (Segment, bool) {
	if a < 0 || b < 0 {
		if len(h.Nodes) > 1 {
			p.Unknown = append(p.Unknown, "device NUMA node unknown: socket crossing not decided")
		}
		return Segment{}, false
	}
	if a == b {
		return Segment{}, false
	}
	lo, hi := min(a, b), max(a, b)
	return Segment{
		Name:        fmt.Sprintf("socket:node%d-node%d", lo, hi),
		Kind:        SegSocket,
		Dir:         fmt.Sprintf("node%d->node%d", a, b),
		CapacityGBs: opt.SocketGBs,
		CurrentGBs:  opt.SocketGBs,
	}, true
}

// links returns the physical PCIe links of chain below chain[k-1] (all of
// them for k == 0), top-down, in direction dir.
//
// Hop i is the link between chain[i] and chain[i-1]. The link under a root
// port (i == 1) is physical; below it, a bridge whose upstream hop is
// physical is a switch upstream port, so the bridges under it are that
// switch's downstream ports, joined by the switch's internal bus rather
// than a link: skipped. Endpoints always sit on a physical link. A function
// directly on the host bridge (root-complex integrated) has only its own
// link state (usually none).
func (h *Host) links(chain []string, k int, dir string) []Segment {
	var out []Segment
	if len(chain) == 1 {
		if k == 0 {
			out = append(out, h.linkSegment(chain[0], "", dir))
		}
		return out
	}
	physical := false
	for i := 1; i < len(chain); i++ {
		f := h.Functions[chain[i]]
		physical = i == 1 || !f.IsBridge() || !physical
		if physical && i >= k {
			out = append(out, h.linkSegment(chain[i], chain[i-1], dir))
		}
	}
	return out
}

// linkSegment describes the link above function bdf, whose upstream port
// is port. Its capacity is the trained maximum, the lower of both ends' max
// speed and width (an NVMe with max 16 GT/s under an 8 GT/s root port runs
// at 8); its current rate comes from the function's own link state (the
// port's when the function does not report one).
func (h *Host) linkSegment(bdf, port, dir string) Segment {
	f := h.Functions[bdf]
	s := Segment{Name: "link:" + bdf, Kind: SegLink, Dir: dir}
	cur := f.Link
	if p := h.Functions[port]; p != nil && !cur.Known {
		cur = p.Link
	}
	if cur.Known {
		s.CurrentGBs = cur.CurGBs()
	}
	s.CapacityGBs = h.linkCapacity(f, port).GBs()
	return s
}

// minKnown is the smaller of two values where 0 means unknown.
func minKnown(a, b float64) float64 {
	switch {
	case a == 0:
		return b
	case b == 0:
		return a
	}
	return math.Min(a, b)
}

func bottleneck(segs []Segment) int {
	best := -1
	for i, s := range segs {
		if s.CapacityGBs > 0 && (best < 0 || s.CapacityGBs < segs[best].CapacityGBs) {
			best = i
		}
	}
	return best
}

func reverse(s []Segment) {
	for i, j := 0, len(s)-1; i < j; i, j = i+1, j-1 {
		s[i], s[j] = s[j], s[i]
	}
}
