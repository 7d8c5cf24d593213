package topology

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/lanewatch/lanewatch/internal/ktext"
)

// Parsers for single sysfs attribute values (already trimmed of the final
// newline). Callers wrap their errors with the file name and line.

// maxCPU bounds cpulist numbers so a corrupt file cannot make callers
// allocate per-CPU tables of absurd size. (ktext.ParseList, which parses
// the lists, stops at 65535 already.)
const maxCPU = 1 << 20

// ParseLinkSpeed parses current_link_speed / max_link_speed. Kernels since
// 4.17 write "16.0 GT/s PCIe", older ones "8 GT/s"; "Unknown" (link down, or
// a device without a PCIe capability) and the PCI/PCI-X forms ("66 MHz
// PCI-X") are valid but carry no PCIe rate: known is false, no error.
func ParseLinkSpeed(s string) (gts float64, known bool, err error) {
	switch s {
	case "Unknown", "Unknown speed":
		return 0, false, nil
	}
	if strings.HasSuffix(s, " PCI") || strings.Contains(s, "PCI-X") {
		if _, err := strconv.Atoi(strings.Fields(s)[0]); err == nil && strings.Contains(s, "MHz") {
			return 0, false, nil
		}
	}
	num, ok := strings.CutSuffix(s, " GT/s PCIe")
	if !ok {
		num, ok = strings.CutSuffix(s, " GT/s")
	}
	if !ok {
		return 0, false, fmt.Errorf("link speed %q: want \"N GT/s PCIe\" or \"Unknown\"", s)
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil {
		return 0, false, fmt.Errorf("link speed %q: %w", s, err)
	}
	if encodingEfficiency(v) == 0 {
		return 0, false, fmt.Errorf("link speed %q: not a PCIe signalling rate", s)
	}
	return v, true, nil
}

// ParseLinkWidth parses current_link_width / max_link_width; 0 (link down)
// means unknown. PCIe defines x1..x32.
func ParseLinkWidth(s string) (int, error) {
	w, err := strconv.Atoi(s)
	if err != nil {
		return 0, fmt.Errorf("link width %q: %w", s, err)
	}
	if w < 0 || w > 32 {
		return 0, fmt.Errorf("link width %d: outside 0..32", w)
	}
	return w, nil
}

// parseHex parses "0x030200"-style class and id files, at most bits wide.
func parseHex(s string, bits int) (uint64, error) {
	h, ok := strings.CutPrefix(s, "0x")
	if !ok || h == "" {
		return 0, fmt.Errorf("%q: want 0x-prefixed hex", s)
	}
	v, err := strconv.ParseUint(h, 16, bits)
	if err != nil {
		return 0, fmt.Errorf("%q: want at most %d-bit hex: %w", s, bits, err)
	}
	return v, nil
}

// ParseNUMANode parses numa_node: a node number or -1 (unknown).
func ParseNUMANode(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil {
		return 0, fmt.Errorf("numa_node %q: %w", s, err)
	}
	if n < -1 || n >= 1<<16 {
		return 0, fmt.Errorf("numa_node %d: outside -1..65535", n)
	}
	return n, nil
}

// ParseIOMMUType parses kernel/iommu_groups/N/type.
//
// The kernel's values are DMA, DMA-FQ, identity, blocked and unmanaged; a
// future kernel may add one, so any single word is kept as it is rather
// than failing the whole read. Empty text or several words is an error.
func ParseIOMMUType(s string) (string, error) {
	if s == "" || strings.ContainsAny(s, " \t") {
		return "", fmt.Errorf("iommu group type %q: want one word such as DMA, DMA-FQ or identity", s)
	}
	return s, nil
}

// ParseDistances parses a node's distance file ("10 21").
func ParseDistances(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Fields(s) {
		d, err := strconv.Atoi(f)
		if err != nil || d < 0 || d > 255 {
			return nil, fmt.Errorf("distance %q: want 0..255", f)
		}
		out = append(out, d)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("distance: empty")
	}
	return out, nil
}

// CPUList is a kernel CPU list ("0-47,96-143"): the ranges, and the
// original text, which is what nvidia-smi prints as CPU Affinity.
type CPUList struct {
	Text   string   `json:"text"`
	Ranges [][2]int `json:"ranges"` // inclusive [first, last], ascending, disjoint, not adjacent
}

// ParseCPUList parses a cpulist; "" is a node without CPUs (memory-only,
// CXL). The ids are parsed by ktext.ParseList and grouped back into runs of
// consecutive CPUs, so ranges out of order or overlapping (the kernel writes
// neither) come back sorted and merged; Text keeps what the file said.
func ParseCPUList(s string) (CPUList, error) {
	l := CPUList{Text: s}
	if s == "" {
		return l, nil
	}
	// ParseList ignores surrounding white space; a cpulist value comes
	// trimmed, so any left is not the kernel's.
	if strings.TrimSpace(s) != s {
		return CPUList{}, fmt.Errorf("cpulist %q: white space around the list", s)
	}
	ids, err := ktext.ParseList(s)
	if err != nil {
		return CPUList{}, fmt.Errorf("cpulist: %w", err)
	}
	for i := 0; i < len(ids); {
		j := i
		for j+1 < len(ids) && ids[j+1] == ids[j]+1 {
			j++
		}
		if ids[j] >= maxCPU {
			return CPUList{}, fmt.Errorf("cpulist %q: CPU %d is not below %d", s, ids[j], maxCPU)
		}
		l.Ranges = append(l.Ranges, [2]int{ids[i], ids[j]})
		i = j + 1
	}
	return l, nil
}

// Count is the number of CPUs in the list.
func (l CPUList) Count() int {
	n := 0
	for _, r := range l.Ranges {
		n += r[1] - r[0] + 1
	}
	return n
}

// Contains reports whether cpu is in the list.
func (l CPUList) Contains(cpu int) bool {
	for _, r := range l.Ranges {
		if cpu >= r[0] && cpu <= r[1] {
			return true
		}
	}
	return false
}

func (l CPUList) String() string { return l.Text }
