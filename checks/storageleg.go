package checks

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/lanewatch/lanewatch/collectors"
	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/topology"
)

// Checks of the storage leg (seed 000 checklist L3 → L2 → L1, items 6 and 7;
// item 8 is CheckGDS).
const (
	CheckStorageDirect = "storage into the pool"
	CheckStorageUplink = "storage vs H2D"
)

// StorageFlow is what one process read from one block device over a
// window (agent's storage tracer): where the bytes landed. Direct reads
// (O_DIRECT) are DMA into the buffer; page-cache reads are DMA into the
// page cache and a CPU copy into the buffer (a staging hop done by the
// kernel).
type StorageFlow struct {
	PID    uint32
	Device string
	Place  topology.BlockPlacement
	// DirectPool is direct bytes into memory the process registered or
	// allocated pinned, by the node of the buffer's page (-1 unknown).
	DirectPool  map[int]uint64
	DirectOther uint64 // direct bytes into other memory
	CachedPool  uint64 // page-cache reads into pinned memory
	CachedOther uint64 // page-cache reads into other memory
	Reads       int
}

func (f StorageFlow) directPool() uint64 {
	var n uint64
	for _, b := range f.DirectPool {
		n += b
	}
	return n
}

// Landing is the flow's direct reads into the pool as storage-far-pool
// judges them; sides says where the pool's nodes sit from the device's
// (nil: unknown).
func (f StorageFlow) Landing(sides correlate.NodeSides) correlate.StorageLanding {
	l := correlate.StorageLanding{PID: f.PID, Device: f.Device, DeviceBDF: f.Place.BDF, DeviceNode: f.Place.NUMANode,
		Pool: "registered pool", ByNode: map[int]uint64{}, Reads: f.Reads, Sides: sides}
	for n, b := range f.DirectPool {
		if n < 0 {
			l.Unknown += b
		} else {
			l.ByNode[n] += b
		}
	}
	return l
}

// StorageDirectCheck is checklist item 6 for one process: do its storage
// reads land straight in its registered pool (no T_stage), and on the
// device's node. h2d is what the process copied host→device in the same
// window. PASS: every byte direct into the pool, none far; WARN: a
// staging hop (page-cache reads, or reads into memory it never registered
// while it copies H2D) or storage-far-pool; INFO: reads into other memory
// and no H2D to tie them to, or a pool off the device's node but not
// surely on another socket (storage-far-pool INFO). sides says where
// nodes sit from each other (nil: unknown).
func StorageDirectCheck(scope string, flows []StorageFlow, h2d uint64, sides correlate.NodeSides) Check {
	c := Check{Scope: scope, Name: CheckStorageDirect}
	var direct, directOther, cachedPool, cachedOther uint64
	var lines []string
	for _, f := range flows {
		d := f.directPool()
		direct, directOther, cachedPool, cachedOther = direct+d, directOther+f.DirectOther, cachedPool+f.CachedPool, cachedOther+f.CachedOther
		where := "placement unknown: " + f.Place.Unknown
		if f.Place.BDF != "" {
			where = fmt.Sprintf("%s node %d", f.Place.BDF, f.Place.NUMANode)
		}
		lines = append(lines, fmt.Sprintf("%s (%s): %d reads, direct into the pool %s%s, direct elsewhere %s, page cache into the pool %s, page cache elsewhere %s",
			f.Device, where, f.Reads, mibText(d), poolNodesText(f.DirectPool), mibText(f.DirectOther), mibText(f.CachedPool), mibText(f.CachedOther)))
		if fd := correlate.StorageFarPool(f.Landing(sides)); fd != nil {
			c.Findings = append(c.Findings, *fd)
		}
	}
	c.Detail = strings.Join(lines, "; ")
	staged := cachedPool + cachedOther + directOther
	far := slices.ContainsFunc(c.Findings, func(f correlate.Finding) bool { return f.Severity == correlate.SevWarn })
	switch {
	case far:
		c.Status = Warn
		c.Fix = "read into a pool on the storage device's node"
	case cachedPool > 0:
		c.Status = Warn
		c.Detail += "; page-cache reads into the pool: the storage DMA lands in the page cache and the kernel copies it into the pool (T_stage)"
		c.Fix = "open the files O_DIRECT (or register the pool with the storage engine) so the device writes into the pool"
	case cachedOther+directOther > 0 && h2d > 0:
		c.Status = Warn
		c.Detail += fmt.Sprintf("; %s read into memory the process never registered while it copied %s host→device: a staging hop (T_stage) before H2D",
			mibText(staged), mibText(h2d))
		c.Fix = "read straight into the registered host pool (O_DIRECT into the pool, or a backend that registers it: Mooncake, NIXL page_first)"
	case direct > 0 && staged == 0:
		c.Status = Pass
		c.Detail += "; every byte read straight into the pool (no T_stage)"
		if unplaced := unplacedDevices(flows); unplaced != "" {
			c.Detail += "; the node of " + unplaced + " is unknown: storage-far-pool not judged"
		}
	default:
		c.Status = Info
		c.Detail += "; no copy from the pool followed in the window: not judged"
	}
	if c.Status == Pass && len(c.Findings) > 0 {
		c.Status = Info // off the device's node, not surely across the socket interconnect (the finding says which)
	}
	return c
}

// unplacedDevices names the flows' devices whose NUMA node is unknown.
func unplacedDevices(flows []StorageFlow) string {
	var out []string
	for _, f := range flows {
		if f.Place.NUMANode < 0 || f.Place.BDF == "" {
			out = append(out, f.Device)
		}
	}
	return strings.Join(out, ", ")
}

func mibText(b uint64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

func poolNodesText(m map[int]uint64) string {
	if len(m) == 0 {
		return ""
	}
	var out []string
	for _, n := range slices.Sorted(maps.Keys(m)) {
		node := "unknown"
		if n >= 0 {
			node = fmt.Sprintf("N%d", n)
		}
		out = append(out, fmt.Sprintf("%s=%s", node, mibText(m[n])))
	}
	return " (" + strings.Join(out, " ") + ")"
}

// GPURates is the window's traffic per GPU (PCI address) and direction
// (Inbound = H2D, Outbound = D2H), bytes per second.
type GPURates map[string]map[string]float64

// StorageUplinkCheck is checklist item 7: storage I/O and the GPUs' copies
// through a shared switch uplink (storage-shared-uplink, per direction:
// storage reads go up with D2H, writes down with H2D), and host memory:
// storage and H2D bytes on each node, listed (no memory bandwidth capacity
// is read, so that half judges nothing). SKIP when no storage device shares
// a switch with a GPU; INFO with why when no shared uplink's capacity is
// known.
func (h *Host) StorageUplinkCheck(rates []collectors.DiskRate, gpu GPURates) Check {
	return h.StorageHost().UplinkCheck(rates, gpu)
}

// StorageHost is what the storage checks know of a host: its PCI tree and
// where each block device sits. The selftest builds one with its own
// placements.
type StorageHost struct {
	Topo *topology.Host
	// Place places a block device (topology.Host.PlaceBlock over sysfs).
	Place func(name string) topology.BlockPlacement
	// Whole says whether a diskstats name is a whole device, not a
	// partition or a loop/ram/zram device (collectors.WholeDisk).
	Whole func(name string) bool
}

// StorageHost is h's storage placement from its sysfs.
func (h *Host) StorageHost() StorageHost {
	return StorageHost{Topo: h.Topo,
		Place: func(name string) topology.BlockPlacement { return h.Topo.PlaceBlock(h.SysRoot, name) },
		Whole: func(name string) bool { return collectors.WholeDisk(h.SysRoot, name) }}
}

// UplinkCheck is StorageUplinkCheck on s.
func (h StorageHost) UplinkCheck(rates []collectors.DiskRate, gpu GPURates) Check {
	c := Check{Scope: HostScope, Name: CheckStorageUplink}
	type side struct {
		storage, gpus map[string]float64
	}
	uplinks := map[string]map[string]*side{} // switch → direction
	var mem []string
	var placed []string
	for _, r := range rates {
		if !h.Whole(r.Name) {
			continue
		}
		if r.ReadBytesPerSec+r.WriteBytesPerSec == 0 {
			continue // idle: nothing to share an uplink with
		}
		p := h.Place(r.Name)
		if p.NUMANode >= 0 {
			mem = append(mem, fmt.Sprintf("%s on N%d read %s write %s", r.Name, p.NUMANode, correlate.GBsText(r.ReadBytesPerSec), correlate.GBsText(r.WriteBytesPerSec)))
		}
		gpus := h.Topo.SharesSwitch(p)
		if len(gpus) == 0 {
			why := "no switch"
			if p.BDF == "" {
				why = p.Unknown
			} else if p.Switch != "" {
				why = "switch " + p.Switch + " has no GPU"
			}
			placed = append(placed, r.Name+": "+why)
			continue
		}
		if uplinks[p.Switch] == nil {
			uplinks[p.Switch] = map[string]*side{"up": {map[string]float64{}, map[string]float64{}}, "down": {map[string]float64{}, map[string]float64{}}}
			for _, g := range gpus {
				uplinks[p.Switch]["up"].gpus[g] = gpu[g][Outbound]
				uplinks[p.Switch]["down"].gpus[g] = gpu[g][Inbound]
			}
		}
		uplinks[p.Switch]["up"].storage[r.Name] = r.ReadBytesPerSec
		uplinks[p.Switch]["down"].storage[r.Name] = r.WriteBytesPerSec
	}
	for g, d := range gpu {
		if b := d[Inbound]; b > 0 {
			node := "node unknown"
			if f := h.Topo.Functions[g]; f != nil && f.NUMANode >= 0 {
				node = fmt.Sprintf("N%d", f.NUMANode)
			}
			mem = append(mem, fmt.Sprintf("H2D to %s (%s) %s", g, node, correlate.GBsText(b)))
		}
	}
	slices.Sort(mem)
	memText := "host memory: " + strings.Join(mem, ", ") + " (memory bandwidth capacity not read: listed, not judged)"
	if len(mem) == 0 {
		memText = "host memory: no storage or H2D traffic on a known node"
	}
	if len(uplinks) == 0 {
		// The reason stays the same from window to window: `agent run` logs
		// each skipped judgement once per reason.
		c.Status, c.Detail = Skip, "no storage device was busy"
		if len(placed) > 0 {
			c.Detail = fmt.Sprintf("no busy storage device shares a switch with a GPU (%s)", strings.Join(placed, "; "))
		}
		return c
	}
	var lines []string
	judged := false
	for _, sw := range slices.Sorted(maps.Keys(uplinks)) {
		lc, _ := h.Topo.LinkCapacity(sw)
		for _, dir := range []string{"up", "down"} {
			s := uplinks[sw][dir]
			u := correlate.Uplink{Switch: sw, Direction: dir, CapacityBps: lc.GBs() * 1e9, Capacity: lc.String(), Storage: s.storage, GPUs: s.gpus}
			if !lc.Known() {
				lines = append(lines, fmt.Sprintf("switch %s uplink capacity unknown (%s): not judged", sw, lc.String()))
				break
			}
			judged = true
			var st, g float64
			for _, b := range s.storage {
				st += b
			}
			for _, b := range s.gpus {
				g += b
			}
			lines = append(lines, fmt.Sprintf("switch %s %s: storage %s + GPU %s of %s", sw, dir, correlate.GBsText(st), correlate.GBsText(g), correlate.GBsText(u.CapacityBps)))
			if f := correlate.StorageSharedUplink(u); f != nil {
				c.Findings = append(c.Findings, *f)
			}
		}
	}
	c.Detail = strings.Join(lines, "; ") + "; " + memText
	switch {
	case len(c.Findings) > 0:
		c.Status = Warn
	case judged:
		c.Status = Pass
	default:
		c.Status = Info
	}
	return c
}
