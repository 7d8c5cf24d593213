package correlate

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// The storage leg of seed 000 (L3 → L2 → L1): storage reads into the host
// pool (T_read), a staging copy (T_stage), then H2D (T_H2D).

const (
	ChecklistStorageDirect = "L3→L2→L1: can the storage backend read straight into the registered host pool (saving T_stage), " +
		"and does its DMA land on the storage device's NUMA node"
	ChecklistStorageUplink = "L3→L2→L1: do storage I/O and H2D contend for host memory bandwidth, and do the NVMe and the GPU share a switch uplink"
)

// StorageLanding is what one process's storage reads put into its memory
// during a window from one block device: only reads whose DMA lands in the
// process's buffer (O_DIRECT), by the NUMA node of that buffer's pages. A
// page-cache read's DMA lands in the page cache, not in the buffer, so it
// is not here.
type StorageLanding struct {
	PID        uint32
	Device     string // block device name (nvme0n1)
	DeviceBDF  string // its PCI function; "" unknown
	DeviceNode int    // that function's NUMA node; -1 unknown
	// Pool says which buffers: "registered pool" when every read landed in
	// a range the process registered (cudaHostRegister), else what they
	// were.
	Pool string
	// ByNode is bytes read by node of the buffer's pages; Unknown is bytes
	// whose buffer could not be located.
	ByNode  map[int]uint64
	Unknown uint64
	Reads   int
	// Sides: where each node sits from the device's (nil: unknown).
	Sides NodeSides
}

var _ = register(Rule{Name: "storage-far-pool", Severities: []Severity{SevWarn, SevInfo}, Checklist: ChecklistStorageDirect, Where: InWindow | InDiagnose,
	Remediation: "put the storage device and the pool it fills on one node: read into a pool bound to the device's node, or serve the GPU from storage on its own socket"})

// StorageFarPool fires when most bytes a process read straight from a
// storage device into its memory landed on pages of another socket than
// the device's node: the storage DMA crossed the socket interconnect (seed
// 000's "路径里多了一段 UPI"). Most off the device's node but not surely
// on another socket (a sibling node of its socket, or a socket unknown) is
// INFO, saying which. The thresholds are remote-numa-pool's. A device
// whose node is unknown is not judged.
func StorageFarPool(s StorageLanding) *Finding {
	if s.DeviceNode < 0 || s.DeviceBDF == "" {
		return nil
	}
	o, sev := farBytes(s.ByNode, s.DeviceNode, s.Sides, SevWarn)
	if sev == "" {
		return nil
	}
	var dist []string
	for _, n := range slices.Sorted(maps.Keys(s.ByNode)) {
		dist = append(dist, fmt.Sprintf("N%d=%s", n, bytesText(s.ByNode[n])))
	}
	ev := []string{
		fmt.Sprintf("direct (O_DIRECT) read bytes by node of the buffer's pages: %s", strings.Join(dist, " ")),
		fmt.Sprintf("device %s at %s NUMA node %d", s.Device, s.DeviceBDF, s.DeviceNode),
		"where the nodes sit: " + strings.Join(o.why, "; "),
		fmt.Sprintf("%d reads into %s, %s of them not located", s.Reads, s.Pool, bytesText(s.Unknown)),
	}
	subject := fmt.Sprintf("pid %d storage reads from %s", s.PID, s.Device)
	if sev == SevInfo {
		return newFinding("storage-far-pool", SevInfo, subject,
			fmt.Sprintf("%.0f%% of the bytes pid %d read from %s (node %d) straight into its %s (%s of %s located) landed off the device's node, %s",
				100*float64(o.off)/float64(o.located), s.PID, s.Device, s.DeviceNode, s.Pool, bytesText(o.off), bytesText(o.located),
				o.where(s.DeviceNode)),
			ev, "")
	}
	return newFinding("storage-far-pool", SevWarn, subject,
		fmt.Sprintf("%.0f%% of the bytes pid %d read from %s (node %d) straight into its %s (%s of %s located) landed on another socket: "+
			"the storage DMA crossed the socket interconnect", 100*float64(o.otherSocket)/float64(o.located), s.PID, s.Device, s.DeviceNode,
			s.Pool, bytesText(o.otherSocket), bytesText(o.located)),
		ev, "")
}

// Uplink is one switch uplink's traffic in one direction over a window:
// the storage devices and the GPUs below the switch. Up (toward the host)
// carries storage reads and D2H; down carries storage writes and H2D. The
// two directions of a PCIe link do not contend (seed 000: "竞争只发生在同一段
// 链路的同一方向上"), so storage reads and H2D never share a direction here.
type Uplink struct {
	Switch      string  // the switch's upstream port
	Direction   string  // "up" (to the host) or "down" (from the host)
	CapacityBps float64 // the uplink's trained maximum in bytes/s; 0 unknown
	Capacity    string  // how it was found
	Storage     map[string]float64
	GPUs        map[string]float64
}

// Thresholds of storage-shared-uplink: the sum must reach 80% of the
// uplink, and each side must carry at least 5% of it, so a link filled by
// the GPU alone with an idle disk (or the reverse) is not called shared.
const (
	uplinkNearFull  = 0.8
	uplinkMinShared = 0.05
)

var _ = register(Rule{Name: "storage-shared-uplink", Severities: []Severity{SevWarn}, Checklist: ChecklistStorageUplink, Where: InWindow | InDiagnose,
	Remediation: "stagger storage I/O and the GPU's copies in that direction, or move the NVMe (or the KV cache files) behind another switch"})

// StorageSharedUplink fires when storage traffic and GPU traffic in the
// same direction through one switch uplink together near its capacity in
// one window. An unknown capacity is not judged.
func StorageSharedUplink(u Uplink) *Finding {
	if u.CapacityBps <= 0 {
		return nil
	}
	var st, gpu float64
	for _, b := range u.Storage {
		st += b
	}
	for _, b := range u.GPUs {
		gpu += b
	}
	c := u.CapacityBps
	if st < uplinkMinShared*c || gpu < uplinkMinShared*c || st+gpu < uplinkNearFull*c {
		return nil
	}
	what := map[string][2]string{"up": {"reads", "D2H"}, "down": {"writes", "H2D"}}[u.Direction]
	ev := []string{
		fmt.Sprintf("storage %s %s: %s", what[0], GBsText(st), ratesText(u.Storage)),
		fmt.Sprintf("GPU %s %s: %s", what[1], GBsText(gpu), ratesText(u.GPUs)),
		fmt.Sprintf("switch %s uplink %s: %s (%s)", u.Switch, u.Direction, GBsText(c), u.Capacity),
	}
	return newFinding("storage-shared-uplink", SevWarn, fmt.Sprintf("switch %s uplink %s", u.Switch, u.Direction),
		fmt.Sprintf("storage %s and GPU %s through switch %s's uplink reached %.0f%% of its %s %s (%s + %s)",
			what[0], what[1], u.Switch, 100*(st+gpu)/c, GBsText(c), u.Direction, GBsText(st), GBsText(gpu)),
		ev, "")
}

// GBsText writes a rate in bytes per second as GB/s, two decimals.
func GBsText(bps float64) string { return fmt.Sprintf("%.2f GB/s", bps/1e9) }

func ratesText(m map[string]float64) string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, k+"="+GBsText(m[k]))
	}
	return strings.Join(out, " ")
}
