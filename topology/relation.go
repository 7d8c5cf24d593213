// Package topology models the host's PCIe tree and NUMA layout: which
// device hangs under which bridge and host bridge, on which NUMA node, with
// which link; the relation between any two devices (as nvidia-smi topo -m
// names it); and the path a transfer takes, segment by segment, each with
// two independent directions (../shared/seeds/000_*.txt, "核心抽象").
package topology

// Relation is how two devices are connected, nearest first, with the
// meaning nvidia-smi topo -m gives it.
type Relation string

const (
	RelSelf Relation = "X"    // the device itself
	RelPIX  Relation = "PIX"  // at most one PCIe bridge between them
	RelPXB  Relation = "PXB"  // several bridges, no host bridge
	RelPHB  Relation = "PHB"  // through a PCIe host bridge (the CPU's root complex)
	RelNODE Relation = "NODE" // across host bridges within one NUMA node
	RelSYS  Relation = "SYS"  // across the socket interconnect (UPI, xGMI)
)

// Rank orders relations from nearest (0) to farthest; NV# (NVLink) and
// unknown strings rank -1.
func (r Relation) Rank() int {
	switch r {
	case RelSelf:
		return 0
	case RelPIX:
		return 1
	case RelPXB:
		return 2
	case RelPHB:
		return 3
	case RelNODE:
		return 4
	case RelSYS:
		return 5
	}
	return -1
}
