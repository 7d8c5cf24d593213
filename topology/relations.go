package topology

// Relation returns how PCI functions a and b are connected, with the
// meaning nvidia-smi topo -m gives it, worked out from the PCIe tree:
//
//   - X: a == b.
//   - Same host bridge: take the lowest common ancestor L of their chains
//     (root port ... function). No common ancestor (they sit under
//     different root ports) → PHB: the path turns around in the root
//     complex. Otherwise count, on each side, the bridges strictly between
//     L and the function. At most one on both sides → PIX: the path stays
//     inside one switch (up to its downstream port, across its upstream
//     port L, down the other downstream port), or both hang off the same
//     port (functions of one device, a root port with one device). More on
//     either side → PXB: it crosses a further switch level.
//     This makes an HGX GPU and the NIC on the same PCIe switch PIX, as in
//     ../shared/samples/topo_m/sglang-issue-30401_*.
//   - Different host bridges: NODE when both are on the same NUMA node,
//     SYS when on different ones. When a node is unknown (-1) it is NODE
//     only on a host with at most one NUMA node, else SYS: the farther
//     answer, so an unknown never hides a socket crossing.
//
// Unknown BDFs give "" (Rank -1).
func (h *Host) Relation(a, b string) Relation {
	fa, fb := h.Functions[a], h.Functions[b]
	if fa == nil || fb == nil {
		return ""
	}
	if a == b {
		return RelSelf
	}
	if fa.HostBridge != fb.HostBridge {
		if h.sameNode(fa.NUMANode, fb.NUMANode) {
			return RelNODE
		}
		return RelSYS
	}
	k := commonPrefix(fa.Chain, fb.Chain)
	if k == 0 {
		return RelPHB
	}
	if bridgesBelow(fa.Chain, k) <= 1 && bridgesBelow(fb.Chain, k) <= 1 {
		return RelPIX
	}
	return RelPXB
}

func (h *Host) sameNode(a, b int) bool {
	if a < 0 || b < 0 {
		return len(h.Nodes) <= 1
	}
	return a == b
}

// commonPrefix is the length of the shared leading part of two chains; the
// lowest common ancestor is chain[k-1].
func commonPrefix(a, b []string) int {
	k := 0
	for k < len(a) && k < len(b) && a[k] == b[k] {
		k++
	}
	return k
}

// bridgesBelow counts the chain entries strictly between the ancestor at
// index k-1 and the function itself (the last entry).
func bridgesBelow(chain []string, k int) int {
	if n := len(chain) - k - 1; n > 0 {
		return n
	}
	return 0
}
