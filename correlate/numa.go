package correlate

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/lanewatch/lanewatch/topology"
)

// Where a copy's host pages live (docs/design.md, "Pages, not
// registrations"). The engine makes no system calls, so it never fills
// these: the agent locates the pages of each host↔device copy with
// move_pages(2) after the engine emitted it and before the sinks see it.

// Node is a NUMA node number, or unknown. The zero value is unknown, so a
// Transfer nobody located says nothing about its pages.
type Node struct {
	node  int16
	known bool
}

// NodeOf returns node n; a negative n is unknown.
func NodeOf(n int) Node {
	if n < 0 || n > maxNode {
		return Node{}
	}
	return Node{node: int16(n), known: true}
}

// maxNode bounds node numbers: the kernel's MAX_NUMNODES is at most 1024
// (CONFIG_NODES_SHIFT ≤ 10).
const maxNode = 1023

// Get returns the node and whether it is known.
func (n Node) Get() (int, bool) { return int(n.node), n.known }

// IsZero reports whether the node is unknown (encoding/json's omitzero).
func (n Node) IsZero() bool { return !n.known }

func (n Node) String() string {
	if !n.known {
		return "unknown"
	}
	return "N" + strconv.Itoa(int(n.node))
}

// MarshalJSON writes the node number; an unknown node is omitted by its
// field's omitzero and written as null when it is not.
func (n Node) MarshalJSON() ([]byte, error) {
	if !n.known {
		return []byte("null"), nil
	}
	return strconv.AppendInt(nil, int64(n.node), 10), nil
}

// UnmarshalJSON reads a node number, or null for unknown.
func (n *Node) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*n = Node{}
		return nil
	}
	v, err := strconv.Atoi(string(b))
	if err != nil || v < 0 || v > maxNode {
		return fmt.Errorf("numa node %s: want 0..%d", b, maxNode)
	}
	*n = NodeOf(v)
	return nil
}

// MaxPageSamples is how many host pages are located per copy at most: one
// in each third of the copied range.
const MaxPageSamples = 3

// PageNodes is the NUMA node of each host page sampled from one copy, in
// address order: one page in each of up to MaxPageSamples equal parts of
// the range, so each sample stands for that part's bytes. Pages that had
// no node (not resident, not mapped) are not in it. The zero value is
// unknown: nothing was sampled, or no sampled page had a node.
type PageNodes struct {
	n     uint8
	nodes [MaxPageSamples]int16
}

// PagesOn builds the samples from node numbers (tests, decoding); negative
// numbers and those past MaxPageSamples are dropped.
func PagesOn(nodes ...int) PageNodes {
	var p PageNodes
	for _, n := range nodes {
		p.Add(n)
	}
	return p
}

// Add appends a sampled page's node; it reports false when the node is
// negative or the samples are full.
func (p *PageNodes) Add(node int) bool {
	if node < 0 || node > maxNode || int(p.n) >= MaxPageSamples {
		return false
	}
	p.nodes[p.n] = int16(node)
	p.n++
	return true
}

// Len is the number of located sampled pages.
func (p PageNodes) Len() int { return int(p.n) }

// At is the node of the i-th located sampled page.
func (p PageNodes) At(i int) int { return int(p.nodes[i]) }

// IsZero reports whether no page was located (encoding/json's omitzero).
func (p PageNodes) IsZero() bool { return p.n == 0 }

// Majority is the node holding most sampled pages, the lowest on a tie;
// unknown when none was located.
func (p PageNodes) Majority() Node {
	best, bestN := -1, 0
	for i := 0; i < int(p.n); i++ {
		node, c := int(p.nodes[i]), 0
		for j := 0; j < int(p.n); j++ {
			if int(p.nodes[j]) == node {
				c++
			}
		}
		if c > bestN || c == bestN && node < best {
			best, bestN = node, c
		}
	}
	return NodeOf(best)
}

// Split divides bytes among the nodes of the sampled pages, each sample
// standing for an equal part; the remainder of the division goes to the
// first sample so that the parts add up to bytes. Unknown samples: nil.
func (p PageNodes) Split(bytes uint64, add func(node int, bytes uint64)) {
	if p.n == 0 {
		return
	}
	part := bytes / uint64(p.n)
	for i := 0; i < int(p.n); i++ {
		b := part
		if i == 0 {
			b += bytes - part*uint64(p.n)
		}
		add(int(p.nodes[i]), b)
	}
}

// MarshalJSON writes the nodes as an array.
func (p PageNodes) MarshalJSON() ([]byte, error) { return p.AppendJSON(nil), nil }

// AppendJSON appends the nodes as a JSON array.
func (p PageNodes) AppendJSON(b []byte) []byte {
	b = append(b, '[')
	for i := 0; i < int(p.n); i++ {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(p.nodes[i]), 10)
	}
	return append(b, ']')
}

// UnmarshalJSON reads an array of at most MaxPageSamples node numbers.
func (p *PageNodes) UnmarshalJSON(b []byte) error {
	s := strings.TrimSpace(string(b))
	if s == "null" {
		*p = PageNodes{}
		return nil
	}
	if len(s) < 2 || s[0] != '[' || s[len(s)-1] != ']' {
		return errors.New("numa_pages: want an array of node numbers")
	}
	var out PageNodes
	if body := strings.TrimSpace(s[1 : len(s)-1]); body != "" {
		for f := range strings.SplitSeq(body, ",") {
			v, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || !out.Add(v) {
				return fmt.Errorf("numa_pages %s: want at most %d node numbers 0..%d", s, MaxPageSamples, maxNode)
			}
		}
	}
	*p = out
	return nil
}

// SetPages records where the copy's host pages were: the samples and the
// node holding most of them.
func (t *Transfer) SetPages(p PageNodes) {
	t.NUMAPages, t.NUMANode = p, p.Majority()
}

// PageTraffic is what one process's host↔device copies moved over one
// GPU's link during a window, by the NUMA node of the host pages they read
// (H2D) or wrote (D2H): the bytes judged by remote-numa-pool, whatever the
// memory (registered, allocated pinned or pageable) and whenever it was
// registered.
type PageTraffic struct {
	PID     uint32
	GPU     string // PCI address of the GPU whose link the copies crossed
	GPUNode int    // its NUMA node (sysfs numa_node); -1 unknown
	// GPUWhy says how the GPU was chosen (the copy's own device, or the
	// process's placement), for the evidence.
	GPUWhy string
	// ByNode is bytes moved per node of the host pages, H2D and D2H, each
	// copy split among its sampled pages (PageNodes.Split).
	ByNode map[int]uint64
	// Unknown is bytes of copies none of whose pages could be located (the
	// memory was gone, the process exited, the lookup was over budget).
	Unknown uint64
	Copies  int // copies counted, located or not
	// Sides: where each node sits from the GPU's (nil: unknown).
	Sides NodeSides
}

// Thresholds of remote-numa-pool on bytes moved. More than half of the
// located bytes must come from (or go to) nodes of another socket, as for
// a pool's pages: then most of the traffic crosses the socket
// interconnect. Below minRemoteBytes in a window the interconnect time is
// negligible (8 MiB at a ~20 GB/s UPI link is 0.4 ms), so a few stray
// copies of far memory do not fire a fail.
const minRemoteBytes = 8 << 20

// NodeSides says where node n sits from node home and why
// (topology.Host.NodeSide); nil: the host's layout is unknown.
type NodeSides func(home, n int) (topology.NodeSide, string)

// offHome is an amount (bytes or pages) by node, split by where each node
// sits from the home node (the GPU's, the storage device's): only another
// socket's is across the socket interconnect; a sibling node of the home
// socket (SNC, NPS2/NPS4) is not, and a node whose socket is unknown is
// said so, never taken for either.
type offHome struct {
	located, off                 uint64 // everything located; off the home node
	otherSocket, sibling, unsure uint64 // off is their sum
	why                          []string
}

func splitOffHome(byNode map[int]uint64, home int, sides NodeSides) offHome {
	var o offHome
	for _, n := range slices.Sorted(maps.Keys(byNode)) {
		b := byNode[n]
		o.located += b
		if n == home || b == 0 {
			continue
		}
		o.off += b
		side, why := topology.SocketUnknown, "the host's NUMA layout is unknown"
		if sides != nil {
			side, why = sides(home, n)
		}
		switch side {
		case topology.OtherSocket:
			o.otherSocket += b
		case topology.SameSocket:
			o.sibling += b
		default:
			o.unsure += b
		}
		o.why = append(o.why, why)
	}
	return o
}

// mostly: more than half of located is in part, and part is at least min.
func mostly(part, located, min uint64) bool {
	return located > 0 && part*2 > located && part >= min
}

// verdict is the severity of a placement rule on o with its thresholds
// (the share and min): sev when most is on another socket (crossed the
// socket interconnect), SevInfo when most is off the home node but not
// surely across a socket, "" when most is home.
func (o offHome) verdict(sev Severity, min uint64) Severity {
	switch {
	case mostly(o.otherSocket, o.located, min):
		return sev
	case mostly(o.off, o.located, min):
		return SevInfo
	}
	return ""
}

// where says where the off-home share is, for a summary: "on another
// socket", or why it is not surely there.
func (o offHome) where(home int) string {
	switch {
	case o.unsure == 0 && o.otherSocket == 0:
		return fmt.Sprintf("on sibling nodes of node %d's socket (SNC/NPS): no socket interconnect crossed, though node %d is nearer", home, home)
	case o.unsure == 0:
		return fmt.Sprintf("partly on another socket (%.0f%%), the rest on sibling nodes of node %d's socket: not mostly across the socket interconnect",
			100*float64(o.otherSocket)/float64(o.located), home)
	}
	return fmt.Sprintf("on nodes whose socket relative to node %d is unknown for %.0f%% of it: whether it crossed the socket interconnect cannot be told",
		home, 100*float64(o.unsure)/float64(o.located))
}

// farBytes judges bytes by node against the home node with
// remote-numa-pool's thresholds, which storage-far-pool shares: sev when
// most crossed to another socket, SevInfo when most is off the home node
// otherwise (a sibling node, or a socket unknown), "" when most is home.
func farBytes(byNode map[int]uint64, home int, sides NodeSides, sev Severity) (offHome, Severity) {
	o := splitOffHome(byNode, home, sides)
	return o, o.verdict(sev, minRemoteBytes)
}

var _ = register(Rule{Name: "remote-numa-pool", Severities: []Severity{SevFail, SevInfo}, Checklist: ChecklistPoolNode, Where: InWindow | InHostCheck | InDiagnose,
	Remediation: "allocate the pool on its GPU's NUMA node (numactl --cpunodebind=N --membind=N, or the server's own NUMA binding)"})

// RemoteNUMAPages fires when most bytes a process's copies moved over a
// GPU's link were read from, or written to, host pages on another socket
// than the GPU's node (seed 000 L2→L1 #2): remote-numa-pool judged on the
// pages actually used, registered before the agent attached or never
// registered. Most off the GPU's node but not surely on another socket (a
// sibling node of its socket, or a node whose socket is unknown) is INFO,
// saying which. A GPU whose node is unknown is never judged.
func RemoteNUMAPages(p PageTraffic) *Finding {
	if p.GPUNode < 0 || p.GPU == "" {
		return nil
	}
	o, sev := farBytes(p.ByNode, p.GPUNode, p.Sides, SevFail)
	if sev == "" {
		return nil
	}
	nodes := slices.Sorted(maps.Keys(p.ByNode))
	var dist []string
	for _, n := range nodes {
		dist = append(dist, fmt.Sprintf("N%d=%s", n, bytesText(p.ByNode[n])))
	}
	ev := []string{
		fmt.Sprintf("bytes moved by node of the host pages (move_pages on sampled pages of each copy): %s", strings.Join(dist, " ")),
		fmt.Sprintf("GPU %s NUMA node %d (%s)", p.GPU, p.GPUNode, p.GPUWhy),
		"where the nodes sit: " + strings.Join(o.why, "; "),
		fmt.Sprintf("%d copies, %s of them not located", p.Copies, bytesText(p.Unknown)),
	}
	subject := fmt.Sprintf("pid %d host pages of copies over GPU %s", p.PID, p.GPU)
	if sev == SevInfo {
		return newFinding("remote-numa-pool", SevInfo, subject,
			fmt.Sprintf("%.0f%% of the bytes pid %d moved over GPU %s's link (%s of %s located) were on host pages off its NUMA node %d, %s",
				100*float64(o.off)/float64(o.located), p.PID, p.GPU, bytesText(o.off), bytesText(o.located), p.GPUNode, o.where(p.GPUNode)),
			ev, "")
	}
	return newFinding("remote-numa-pool", SevFail, subject,
		fmt.Sprintf("%.0f%% of the bytes pid %d moved over GPU %s's link (%s of %s located) were on host pages of another socket than its NUMA node %d: "+
			"they crossed the socket interconnect", 100*float64(o.otherSocket)/float64(o.located), p.PID, p.GPU, bytesText(o.otherSocket), bytesText(o.located), p.GPUNode),
		ev,
		fmt.Sprintf("allocate the host buffers on node %d: start the process under `numactl --cpunodebind=%d --membind=%d` "+
			"(SGLang does this itself unless it silently skips it; check its numa-bind log line)", p.GPUNode, p.GPUNode, p.GPUNode))
}
