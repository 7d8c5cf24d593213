package selftest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/lanewatch/lanewatch/checks"
	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/topology"
)

// PagesScenario (refpath/kvpath/late_pool_pages.c) registers a pool before
// the agent attaches, then loads from it, writes back into it and copies
// fresh pageable memory in: the agent must find where the host pages are
// from the copies alone (docs/design.md, "Pages, not registrations"). It
// runs held like late-attach, and holds again after its copies so that
// its memory is still mapped while the agent looks the pages up.
const PagesScenario = "late-pool-pages"

// count is how many records of pid the collector holds.
func (c *Collector) count(pid uint32) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.byPID[pid])
}

// releaseCopies lets a held late-pool-pages make its copies, reads its
// "copied N" line, waits until the agent handed on N records of it (the
// agent hands a copy on once its pages were looked up), then lets it free
// its memory and exit.
func (p *proc) releaseCopies(col *Collector, timeout time.Duration) error {
	if _, err := io.WriteString(p.stdin, "go\n"); err != nil {
		return err
	}
	line, err := p.out.ReadString('\n')
	var n int
	if err != nil || !strings.HasPrefix(line, "copied ") {
		return fmt.Errorf("%s: expected a copied line, got %q: %v", PagesScenario, line, err)
	}
	if _, err := fmt.Sscanf(line, "copied %d", &n); err != nil {
		return fmt.Errorf("%s: %q: %w", PagesScenario, line, err)
	}
	deadline := time.Now().Add(timeout)
	for col.count(p.pid) < n {
		if time.Now().After(deadline) {
			p.release()
			return fmt.Errorf("%s: the agent handed on %d of %d copies within %s", PagesScenario, col.count(p.pid), n, timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return p.release()
}

// pageTruth is what the scenario's end line says of its host pages.
type pageTruth struct {
	Node   *int `json:"host_page_node"` // the node of every page of every copied host range; -1 several or unreadable
	Copies int  `json:"copies"`
}

func readPageTruth(path string) (pageTruth, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return pageTruth{}, err
	}
	var last []byte
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		if len(bytes.TrimSpace(sc.Bytes())) > 0 {
			last = append(last[:0], sc.Bytes()...)
		}
	}
	var pt pageTruth
	if err := json.Unmarshal(last, &pt); err != nil {
		return pageTruth{}, fmt.Errorf("%s: end line: %w", path, err)
	}
	if pt.Node == nil {
		return pageTruth{}, fmt.Errorf("%s: end line has no host_page_node", path)
	}
	return pt, nil
}

// designedNUMA places the reference GPU on a node of a host layout the
// selftest designs (this machine's sysfs has neither the GPU nor, mostly,
// a second node): the rule's verdict follows from the design, not from the
// rule.
type designedNUMA struct {
	gpuNode int
	host    *topology.Host
}

func (d designedNUMA) GPUNode(string) int { return d.gpuNode }

func (d designedNUMA) NodeSide(home, n int) (topology.NodeSide, string) {
	return d.host.NodeSide(home, n)
}

// nodesOn is a host layout: node i on package pkgs[i] of the listed nodes.
func nodesOn(nodes []int, pkgs []int) *topology.Host {
	h := &topology.Host{}
	for i, n := range nodes {
		h.Nodes = append(h.Nodes, topology.Node{ID: n, Package: pkgs[i], PackageFrom: "designed by the selftest"})
	}
	return h
}

// checkPages compares, for late-pool-pages, where the agent found each
// copy's host pages with where the scenario itself found them, byte for
// byte, and judges remote-numa-pool three times on the agent's records:
// with the reference GPU placed on a node of another socket than the pages
// (it must FAIL, every byte remote), on a sibling node of their socket
// (INFO, no socket crossed: SNC/NPS) and on theirs (nothing).
func checkPages(res *Result, scenario string, pid uint32, truthPath string, got []correlate.Transfer) {
	if scenario != PagesScenario {
		return
	}
	problem := func(format string, args ...any) {
		res.OtherErrs++
		if len(res.Problems) < 8 {
			res.Problems = append(res.Problems, fmt.Sprintf(format, args...))
		}
	}
	pt, err := readPageTruth(truthPath)
	if err != nil {
		problem("pages: %v", err)
		return
	}
	node := *pt.Node
	if node < 0 {
		problem("pages: the scenario's host pages are not all on one node (host_page_node -1): nothing exact to compare")
		return
	}
	var want uint64
	got2 := map[int]uint64{}
	copies := 0
	for _, t := range got {
		if t.Failed() || (t.Direction != correlate.DirH2D && t.Direction != correlate.DirD2H) {
			continue
		}
		copies++
		want += t.Bytes
		if n, ok := t.NUMANode.Get(); !ok || n != node || t.NUMAPages.Len() == 0 {
			problem("pages: %s %d B at submit %d: numa_node %s, numa_pages %s; the scenario's pages are on node %d",
				t.Direction, t.Bytes, t.SubmitNs, t.NUMANode, t.NUMAPages.AppendJSON(nil), node)
			continue
		}
		for i := 0; i < t.NUMAPages.Len(); i++ {
			if t.NUMAPages.At(i) != node {
				problem("pages: %s at submit %d: sampled pages %s, all are on node %d", t.Direction, t.SubmitNs, t.NUMAPages.AppendJSON(nil), node)
				break
			}
		}
		t.NUMAPages.Split(t.Bytes, func(n int, b uint64) { got2[n] += b })
	}
	if copies != pt.Copies {
		problem("pages: %d host↔device copies reported, the scenario made %d", copies, pt.Copies)
	}
	if len(got2) != 1 || got2[node] != want {
		problem("pages: bytes by node %v, want all %d on node %d", got2, want, node)
	}

	w := checks.NewWindow()
	for i := range got {
		w.Transfer(&got[i])
	}
	scope := fmt.Sprintf("pid %d", pid)
	pl := checks.Placement{GPU: fmt.Sprintf("reference GPU of pid %d", pid), Why: "placed by the selftest"}
	twoSockets := nodesOn([]int{node, node + 1}, []int{0, 1})
	far := w.PagesCheck(scope, pid, pl, designedNUMA{node + 1, twoSockets})
	if len(far.Findings) != 1 || far.Findings[0].Rule != "remote-numa-pool" || far.Findings[0].Severity != correlate.SevFail ||
		!strings.Contains(far.Findings[0].Summary, "100% of the bytes") {
		problem("pages: GPU on node %d of another socket, pages on %d: want remote-numa-pool FAIL on every byte, got %s: %s %+v",
			node+1, node, far.Status, far.Detail, far.Findings)
	} else {
		res.Problems = append(res.Problems[:len(res.Problems):len(res.Problems)], "finding: "+far.Findings[0].Summary)
	}
	sibling := w.PagesCheck(scope, pid, pl, designedNUMA{node + 1, nodesOn([]int{node, node + 1}, []int{0, 0})})
	if sibling.Status != checks.Info || len(sibling.Findings) != 1 || sibling.Findings[0].Severity != correlate.SevInfo {
		problem("pages: GPU on node %d, a sibling of the pages' node %d on one socket: want remote-numa-pool INFO, got %s: %s %+v",
			node+1, node, sibling.Status, sibling.Detail, sibling.Findings)
	}
	near := w.PagesCheck(scope, pid, pl, designedNUMA{node, twoSockets})
	if near.Status != checks.Pass || len(near.Findings) != 0 {
		problem("pages: GPU on the pages' node %d: want PASS without finding, got %s: %s", node, near.Status, near.Detail)
	}
}
