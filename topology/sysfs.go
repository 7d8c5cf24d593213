package topology

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/lanewatch/lanewatch/internal/ktext"
)

// Host is the PCI tree and NUMA layout of one machine, as read from sysfs.
type Host struct {
	// Functions holds every PCI function by its BDF ("0000:17:00.0").
	Functions map[string]*Function `json:"functions"`
	// Nodes are the NUMA nodes, ordered by ID; empty when the kernel has no
	// NUMA support (no devices/system/node directory).
	Nodes []Node `json:"nodes"`
	// RDMA maps each RDMA device (ibdev name, "mlx5_0") to its PCI function's
	// BDF; "" for a device with no PCI function (rxe, siw soft devices).
	RDMA map[string]string `json:"rdma"`
}

// Function is one PCI function.
type Function struct {
	BDF    string `json:"bdf"`
	Class  uint32 `json:"class"` // 24-bit class code, e.g. 0x030200
	Vendor uint16 `json:"vendor"`
	Device uint16 `json:"device"`
	// NUMANode is the node the firmware assigned; -1 means unknown (kept as
	// is: guessing from bus numbers would hide a firmware problem).
	NUMANode int `json:"numa_node"`
	// Parent is the upstream bridge's BDF; "" when the function hangs
	// directly off the host bridge (root ports, root-complex integrated
	// endpoints).
	Parent string `json:"parent"`
	// HostBridge is the sysfs host bridge node, "pci0000:17".
	HostBridge string `json:"host_bridge"`
	// Chain lists the BDFs from the root port down to this function,
	// inclusive; Chain[0] hangs off HostBridge.
	Chain      []string `json:"chain"`
	Link       Link     `json:"link"`
	IOMMUGroup int      `json:"iommu_group"` // -1: no IOMMU group
	IOMMUType  string   `json:"iommu_type"`  // DMA, DMA-FQ, identity, blocked, unmanaged; "" unknown
	NetDevs    []string `json:"net_devs"`
	RDMADevs   []string `json:"rdma_devs"`
	// Missing names the attribute files that were absent: those fields hold
	// their zero value (or -1) and mean "unknown", not "zero".
	Missing []string `json:"missing,omitempty"`

	dir string // resolved device directory
}

// Link is a function's PCIe link state as sysfs reports it. For an endpoint
// or a switch upstream port it is the link above the function; for a root
// port or switch downstream port it is the link below.
type Link struct {
	CurSpeedGTs float64 `json:"cur_speed_gts"` // 0: unknown
	MaxSpeedGTs float64 `json:"max_speed_gts"` // 0: unknown
	CurWidth    int     `json:"cur_width"`     // 0: unknown
	MaxWidth    int     `json:"max_width"`     // 0: unknown
	// Known is true when the current speed and width are both known, i.e.
	// when CurGBs is meaningful.
	Known bool `json:"known"`
}

// Node is one NUMA node.
type Node struct {
	ID        int     `json:"id"`
	CPUs      CPUList `json:"cpus"`
	Distances []int   `json:"distances"` // SLIT row, indexed by node order in the file
	// Package is the CPU package (socket) the node belongs to, -1 unknown;
	// PackageFrom says how it was found, or why it is unknown (numa.go).
	Package     int    `json:"package"`
	PackageFrom string `json:"package_from,omitempty"`
}

// Device kinds returned by Function.Kind.
const (
	KindGPU    = "gpu"
	KindNIC    = "nic"
	KindNVMe   = "nvme"
	KindBridge = "bridge"
	KindOther  = "other"
)

// BMC display controllers: class 0x0300 (VGA) like a GPU, but nothing a
// transfer targets; counting them would shift every CUDA GPU index.
const (
	vendorASPEED = 0x1a03
	vendorMatrox = 0x102b
)

// Kind classifies the function by its class code. Every network controller
// (base class 0x02) is a NIC: ConnectX-3 VPI reports 0x0280 ("other"), not
// 0x0200/0x0207.
func (f *Function) Kind() string {
	switch cls := f.Class >> 8; {
	case cls == 0x0300 || cls == 0x0302:
		if cls == 0x0300 && (f.Vendor == vendorASPEED || f.Vendor == vendorMatrox) {
			return KindOther
		}
		return KindGPU
	case cls>>8 == 0x02:
		return KindNIC
	case cls == 0x0108:
		return KindNVMe
	case cls == 0x0604:
		return KindBridge
	}
	return KindOther
}

// IsBridge reports whether the function is a PCI bridge (a switch port or
// a root port).
func (f *Function) IsBridge() bool { return f.Kind() == KindBridge }

// Node returns the node with this ID.
func (h *Host) Node(id int) (Node, bool) {
	for _, n := range h.Nodes {
		if n.ID == id {
			return n, true
		}
	}
	return Node{}, false
}

// BDFs returns every function's BDF of the given kind ("" for all), sorted.
func (h *Host) BDFs(kind string) []string {
	var out []string
	for bdf, f := range h.Functions {
		if kind == "" || f.Kind() == kind {
			out = append(out, bdf)
		}
	}
	sort.Strings(out)
	return out
}

// isBDF matches "dddd:bb:dd.f" (domain of 4+ hex digits, lowercase, as
// sysfs writes it).
func isBDF(s string) bool {
	dom, rest, ok := strings.Cut(s, ":")
	if !ok || len(dom) < 4 || !isLowerHex(dom) || len(rest) != 7 || rest[2] != ':' || rest[5] != '.' {
		return false
	}
	return isLowerHex(rest[:2]) && isLowerHex(rest[3:5]) && rest[6] >= '0' && rest[6] <= '7'
}

// isHostBridge matches sysfs host bridge nodes, "pci0000:17".
func isHostBridge(s string) bool {
	rest, ok := strings.CutPrefix(s, "pci")
	dom, bus, ok2 := strings.Cut(rest, ":")
	return ok && ok2 && len(dom) >= 4 && isLowerHex(dom) && len(bus) == 2 && isLowerHex(bus)
}

// isLowerHex is ktext.IsHex without the capitals: sysfs writes PCI
// addresses in lowercase, and "0000:1A:00.0" names no device there.
func isLowerHex(s string) bool {
	return ktext.IsHex(s) && !strings.ContainsAny(s, "ABCDEF")
}

// Read reads the PCI tree, NUMA nodes and RDMA devices under sysRoot
// ("/sys", or a captured tree). Missing attribute files leave fields
// unknown; a present file that does not parse is an error naming it.
func Read(sysRoot string) (*Host, error) {
	// A host without PCI (a microVM) has no bus/pci: that is an empty tree.
	// A root that is not there at all is a wrong --path.sysfs.
	if st, err := os.Stat(sysRoot); err != nil {
		return nil, fmt.Errorf("topology: sysfs root: %w", err)
	} else if !st.IsDir() {
		return nil, fmt.Errorf("topology: sysfs root %s is not a directory", sysRoot)
	}
	h := &Host{Functions: map[string]*Function{}, RDMA: map[string]string{}}
	devDir := filepath.Join(sysRoot, "bus", "pci", "devices")
	ents, err := os.ReadDir(devDir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("topology: %w", err)
	}
	for _, e := range ents {
		f, err := readFunction(sysRoot, filepath.Join(devDir, e.Name()))
		if err != nil {
			return nil, err
		}
		h.Functions[f.BDF] = f
	}
	// Real sysfs lists every bridge in bus/pci/devices, but partial
	// captures (the node_exporter fixture) leave some out: read those from
	// their directory on the chain rather than drop the hop.
	for _, f := range h.Functions {
		for i, b := range f.Chain {
			if _, ok := h.Functions[b]; ok {
				continue
			}
			dir := f.dir
			for range len(f.Chain) - 1 - i {
				dir = filepath.Dir(dir)
			}
			up, err := readFunctionAt(sysRoot, dir, dir)
			if err != nil {
				return nil, err
			}
			h.Functions[b] = up
		}
	}
	if h.Nodes, err = readNodes(filepath.Join(sysRoot, "devices", "system", "node")); err != nil {
		return nil, err
	}
	if err := readPackages(filepath.Join(sysRoot, "devices", "system", "cpu"), h.Nodes); err != nil {
		return nil, err
	}
	if err := readRDMA(sysRoot, h); err != nil {
		return nil, err
	}
	return h, nil
}

func readFunction(sysRoot, link string) (*Function, error) {
	bdf := filepath.Base(link)
	if !isBDF(bdf) {
		return nil, fmt.Errorf("topology: %s: not a PCI address", link)
	}
	target, err := os.Readlink(link)
	if err != nil {
		return nil, fmt.Errorf("topology: %s: want a symlink into devices/: %w", link, err)
	}
	if !filepath.IsAbs(target) {
		target = filepath.Join(filepath.Dir(link), target)
	}
	return readFunctionAt(sysRoot, link, filepath.Clean(target))
}

// readFunctionAt reads the function whose device directory is dir; link
// is the path to name in placement errors.
func readFunctionAt(sysRoot, link, dir string) (*Function, error) {
	f := &Function{BDF: filepath.Base(dir), NUMANode: -1, IOMMUGroup: -1, dir: dir}
	var err error
	if err := placeInTree(f, link, dir); err != nil {
		return nil, err
	}
	if len(f.Chain) > 1 {
		f.Parent = f.Chain[len(f.Chain)-2]
	}

	var v uint64
	if v, err = readAttr(f, dir, "class", func(s string) (uint64, error) { return parseHex(s, 24) }); err != nil {
		return nil, err
	}
	f.Class = uint32(v)
	if v, err = readAttr(f, dir, "vendor", func(s string) (uint64, error) { return parseHex(s, 16) }); err != nil {
		return nil, err
	}
	f.Vendor = uint16(v)
	if v, err = readAttr(f, dir, "device", func(s string) (uint64, error) { return parseHex(s, 16) }); err != nil {
		return nil, err
	}
	f.Device = uint16(v)
	if f.NUMANode, err = readAttrDefault(f, dir, "numa_node", -1, ParseNUMANode); err != nil {
		return nil, err
	}
	if err := readLink(f, dir); err != nil {
		return nil, err
	}
	if err := readIOMMU(f, sysRoot, dir); err != nil {
		return nil, err
	}
	f.NetDevs, err = netDevs(dir)
	if err != nil {
		return nil, err
	}
	return f, nil
}

// placeInTree fills HostBridge and Chain from the resolved device path: the
// last "pciDDDD:BB" component is the host bridge (Hyper-V and VMD put other
// nodes above it), every BDF after it is one hop down.
func placeInTree(f *Function, link, dir string) error {
	parts := strings.Split(filepath.ToSlash(dir), "/")
	hb := -1
	for i, p := range parts {
		if isHostBridge(p) {
			hb = i
		}
	}
	if hb < 0 {
		return fmt.Errorf("topology: %s: target %s has no pciDDDD:BB host bridge component", link, dir)
	}
	f.HostBridge = parts[hb]
	for _, p := range parts[hb+1:] {
		if !isBDF(p) {
			return fmt.Errorf("topology: %s: target %s: %q below the host bridge is not a PCI address", link, dir, p)
		}
		f.Chain = append(f.Chain, p)
	}
	if len(f.Chain) == 0 || f.Chain[len(f.Chain)-1] != f.BDF {
		return fmt.Errorf("topology: %s: target %s does not end in %s", link, dir, f.BDF)
	}
	return nil
}

// readAttr reads a one-line attribute; a missing file is recorded in
// f.Missing and yields the zero value.
func readAttr[T any](f *Function, dir, name string, parse func(string) (T, error)) (T, error) {
	var zero T
	v, err := readOptional(filepath.Join(dir, name), parse)
	if errors.Is(err, fs.ErrNotExist) {
		f.Missing = append(f.Missing, name)
		return zero, nil
	}
	return v, err
}

func readAttrDefault[T any](f *Function, dir, name string, def T, parse func(string) (T, error)) (T, error) {
	v, err := readOptional(filepath.Join(dir, name), parse)
	if errors.Is(err, fs.ErrNotExist) {
		f.Missing = append(f.Missing, name)
		return def, nil
	}
	return v, err
}

// readOptional returns fs.ErrNotExist unwrapped-compatible for a missing
// file, and a "file: line 1: ..." error for content that does not parse.
func readOptional[T any](path string, parse func(string) (T, error)) (T, error) {
	var zero T
	b, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return zero, err
		}
		return zero, fmt.Errorf("topology: %w", err)
	}
	s, err := oneLine(string(b))
	if err == nil {
		var v T
		if v, err = parse(s); err == nil {
			return v, nil
		}
	}
	return zero, fmt.Errorf("topology: %s: line 1: %w", path, err)
}

// oneLine accepts sysfs's "value\n" and rejects anything with more lines.
func oneLine(s string) (string, error) {
	s = strings.TrimSuffix(s, "\n")
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return "", fmt.Errorf("want one line, found more")
	}
	return strings.TrimSpace(s), nil
}

func readLink(f *Function, dir string) error {
	l := &f.Link
	var err error
	var curKnown, wKnown bool
	speed := func(s string) (linkSpeed, error) { v, k, err := ParseLinkSpeed(s); return linkSpeed{v, k}, err }
	var sp linkSpeed
	if sp, err = readAttr(f, dir, "current_link_speed", speed); err != nil {
		return err
	}
	l.CurSpeedGTs, curKnown = sp.gts, sp.known
	if sp, err = readAttr(f, dir, "max_link_speed", speed); err != nil {
		return err
	}
	l.MaxSpeedGTs = sp.gts
	if l.CurWidth, err = readAttr(f, dir, "current_link_width", ParseLinkWidth); err != nil {
		return err
	}
	wKnown = l.CurWidth > 0
	if l.MaxWidth, err = readAttr(f, dir, "max_link_width", ParseLinkWidth); err != nil {
		return err
	}
	l.Known = curKnown && wKnown
	return nil
}

type linkSpeed struct {
	gts   float64
	known bool
}

func readIOMMU(f *Function, sysRoot, dir string) error {
	p := filepath.Join(dir, "iommu_group")
	target, err := os.Readlink(p)
	if errors.Is(err, fs.ErrNotExist) {
		// No IOMMU, or the IOMMU is off: not recorded as missing because
		// that is the normal state of most hosts.
		return nil
	}
	if err != nil {
		return fmt.Errorf("topology: %s: %w", p, err)
	}
	g, err := strconv.Atoi(filepath.Base(target))
	if err != nil || g < 0 {
		return fmt.Errorf("topology: %s: link target %q does not end in a group number", p, target)
	}
	f.IOMMUGroup = g
	tp := filepath.Join(sysRoot, "kernel", "iommu_groups", strconv.Itoa(g), "type")
	f.IOMMUType, err = readOptional(tp, ParseIOMMUType)
	if errors.Is(err, fs.ErrNotExist) {
		f.Missing = append(f.Missing, "iommu_groups/"+strconv.Itoa(g)+"/type")
		return nil
	}
	return err
}

// netDevs lists <dev>/net/* and, for virtio-net, <dev>/virtio*/net/*: the
// netdev hangs off the virtio child device, not the PCI function.
func netDevs(dir string) ([]string, error) {
	var out []string
	dirs := []string{filepath.Join(dir, "net")}
	vs, _ := filepath.Glob(filepath.Join(dir, "virtio*", "net"))
	dirs = append(dirs, vs...)
	for _, d := range dirs {
		ents, err := os.ReadDir(d)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("topology: %w", err)
		}
		for _, e := range ents {
			out = append(out, e.Name())
		}
	}
	sort.Strings(out)
	return out, nil
}

func readNodes(dir string) ([]Node, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("topology: %w", err)
	}
	var nodes []Node
	for _, e := range ents {
		num, ok := strings.CutPrefix(e.Name(), "node")
		id, err := strconv.Atoi(num)
		if !ok || err != nil || id < 0 || num[0] == '+' {
			continue // "possible", "online", "has_cpu", ...
		}
		n := Node{ID: id}
		n.CPUs, err = readOptional(filepath.Join(dir, e.Name(), "cpulist"), ParseCPUList)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
		n.Distances, err = readOptional(filepath.Join(dir, e.Name(), "distance"), ParseDistances)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
		nodes = append(nodes, n)
	}
	sort.Slice(nodes, func(i, j int) bool { return nodes[i].ID < nodes[j].ID })
	return nodes, nil
}

// readRDMA maps class/infiniband/<dev>/device (a symlink to the PCI
// function) to BDFs and records the reverse on each function.
func readRDMA(sysRoot string, h *Host) error {
	dir := filepath.Join(sysRoot, "class", "infiniband")
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("topology: %w", err)
	}
	for _, e := range ents {
		name := e.Name()
		p := filepath.Join(dir, name, "device")
		// EvalSymlinks because class/infiniband/<dev> is itself a link into
		// the device's directory, so the relative "device" link only
		// resolves from there.
		target, err := filepath.EvalSymlinks(p)
		if errors.Is(err, fs.ErrNotExist) {
			h.RDMA[name] = "" // soft device (rxe, siw): not on PCI
			continue
		}
		if err != nil {
			return fmt.Errorf("topology: %s: %w", p, err)
		}
		bdf := filepath.Base(target)
		f, ok := h.Functions[bdf]
		if !ok {
			return fmt.Errorf("topology: %s: points to %s, which is not a listed PCI function", p, target)
		}
		h.RDMA[name] = bdf
		f.RDMADevs = append(f.RDMADevs, name)
		sort.Slice(f.RDMADevs, func(i, j int) bool { return naturalLess(f.RDMADevs[i], f.RDMADevs[j]) })
	}
	return nil
}
