package topology

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"strconv"
)

// A NUMA node's CPU package (socket) says whether memory on it is reached
// through the socket interconnect (UPI, Infinity Fabric/xGMI) or through
// the same socket's mesh: a sibling node of one socket (Intel SNC, AMD
// NPS2/NPS4) is another node id but not another socket. Node ids alone
// cannot tell the two apart; the kernel says it in
// devices/system/cpu/cpuN/topology/physical_package_id of the node's CPUs,
// and in the SLIT distances (nodeN/distance: 10 local, ~11-12 a sibling,
// 20-32 another socket on the machines of ../shared/samples/numactl_hardware).

// ParsePackageID parses cpuN/topology/physical_package_id.
func ParsePackageID(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil {
		return 0, fmt.Errorf("physical_package_id %q: %w", s, err)
	}
	if n < 0 || n >= 1<<16 {
		return 0, fmt.Errorf("physical_package_id %d: outside 0..65535", n)
	}
	return n, nil
}

// readPackages sets each node's package from its CPUs'
// physical_package_id under cpuDir; a node whose CPUs name two packages,
// or whose files are absent, keeps -1 with the reason in PackageFrom.
// Memory-only nodes (no CPUs: HBM, CXL) then take the package of the CPU
// nodes nearest to them by SLIT distance, when those all share one.
func readPackages(cpuDir string, nodes []Node) error {
	for i := range nodes {
		n := &nodes[i]
		var err error
		if n.Package, n.PackageFrom, err = cpuPackage(cpuDir, n.CPUs); err != nil {
			return err
		}
	}
	for i := range nodes {
		n := &nodes[i]
		if len(n.CPUs.Ranges) > 0 {
			continue
		}
		near, d := nearestCPUNodes(nodes, i)
		if len(near) == 0 {
			n.PackageFrom = "a node without CPUs whose distances to the CPU nodes are unknown"
			continue
		}
		pkg := nodes[near[0]].Package
		for _, j := range near {
			if nodes[j].Package != pkg || pkg < 0 {
				n.PackageFrom = fmt.Sprintf("a node without CPUs, nearest (distance %d) to nodes %s of different or unknown packages", d, nodeIDs(nodes, near))
				pkg = -1
				break
			}
		}
		if pkg >= 0 {
			n.Package = pkg
			n.PackageFrom = fmt.Sprintf("a node without CPUs, nearest (distance %d) to node %s of package %d", d, nodeIDs(nodes, near), pkg)
		}
	}
	return nil
}

// cpuPackage is the one package of cpus, from their physical_package_id;
// -1 with the reason when a file is absent or two differ; -1 and "" for no
// CPUs.
func cpuPackage(cpuDir string, cpus CPUList) (int, string, error) {
	pkg, first := -1, ""
	for _, r := range cpus.Ranges {
		for cpu := r[0]; cpu <= r[1]; cpu++ {
			p := filepath.Join(cpuDir, "cpu"+strconv.Itoa(cpu), "topology", "physical_package_id")
			id, err := readOptional(p, ParsePackageID)
			switch {
			case errors.Is(err, fs.ErrNotExist):
				return -1, "no " + p, nil
			case err != nil:
				return -1, "", err
			case pkg >= 0 && id != pkg:
				return -1, fmt.Sprintf("its CPUs name packages %d (%s) and %d (%s)", pkg, first, id, p), nil
			case pkg < 0:
				pkg, first = id, p
			}
		}
	}
	if pkg < 0 {
		return -1, "", nil
	}
	return pkg, fmt.Sprintf("physical_package_id of its CPUs %s (%s, ...)", cpus.Text, first), nil
}

// nearestCPUNodes are the indexes of the nodes with CPUs at the least
// distance from nodes[i], and that distance; none when its distances are
// unknown.
func nearestCPUNodes(nodes []Node, i int) ([]int, int) {
	best := -1
	var near []int
	for j := range nodes {
		if j == i || len(nodes[j].CPUs.Ranges) == 0 {
			continue
		}
		d, ok := distanceAt(nodes, i, j)
		switch {
		case !ok:
			continue
		case best < 0 || d < best:
			best, near = d, []int{j}
		case d == best:
			near = append(near, j)
		}
	}
	return near, best
}

func nodeIDs(nodes []Node, idx []int) string {
	ids := make([]int, len(idx))
	for k, j := range idx {
		ids[k] = nodes[j].ID
	}
	return fmt.Sprint(ids)
}

// distanceAt is the SLIT distance from nodes[i] to nodes[j]. A node's
// distance row lists every node in the order of the node directories
// (the online nodes, ascending); a row of another length is not trusted.
func distanceAt(nodes []Node, i, j int) (int, bool) {
	row := nodes[i].Distances
	if len(row) != len(nodes) {
		return 0, false
	}
	return row[j], true
}

// NodeSide is where a node's memory is from a home node's point of view.
type NodeSide uint8

const (
	// SocketUnknown: the package of one of the two nodes is unknown.
	SocketUnknown NodeSide = iota
	// SameNode: the home node itself.
	SameNode
	// SameSocket: another node of the home node's package (SNC, NPS2/NPS4,
	// or a memory-only node of that socket).
	SameSocket
	// OtherSocket: a node of another package: its memory crosses the
	// socket interconnect.
	OtherSocket
)

// NodeSide says where node n is seen from node home, and why: by the two
// nodes' packages, with their SLIT distance when known. A nil host, or a
// node not on it, is SocketUnknown.
func (h *Host) NodeSide(home, n int) (NodeSide, string) {
	if home == n {
		return SameNode, fmt.Sprintf("node %d itself", n)
	}
	if h == nil {
		return SocketUnknown, "the host's NUMA layout is unknown"
	}
	hi := slices.IndexFunc(h.Nodes, func(x Node) bool { return x.ID == home })
	ni := slices.IndexFunc(h.Nodes, func(x Node) bool { return x.ID == n })
	if hi < 0 || ni < 0 {
		missing := home
		if hi >= 0 {
			missing = n
		}
		return SocketUnknown, fmt.Sprintf("node %d is not in this host's devices/system/node", missing)
	}
	dist := ""
	if d, ok := distanceAt(h.Nodes, hi, ni); ok {
		dist = fmt.Sprintf(", distance %d", d)
	}
	hp, np := h.Nodes[hi], h.Nodes[ni]
	switch {
	case hp.Package < 0:
		return SocketUnknown, fmt.Sprintf("the package of node %d is unknown (%s)%s", home, hp.PackageFrom, dist)
	case np.Package < 0:
		return SocketUnknown, fmt.Sprintf("the package of node %d is unknown (%s)%s", n, np.PackageFrom, dist)
	case hp.Package == np.Package:
		return SameSocket, fmt.Sprintf("nodes %d and %d are both on package %d%s", home, n, hp.Package, dist)
	}
	return OtherSocket, fmt.Sprintf("node %d is on package %d, node %d on package %d%s", n, np.Package, home, hp.Package, dist)
}
