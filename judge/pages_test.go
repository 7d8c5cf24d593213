package judge_test

import (
	"strings"
	"testing"
	"time"

	"github.com/lanewatch/lanewatch/checks"
	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/judge"
	"github.com/lanewatch/lanewatch/topology"
)

// gpuOnNode is a checks.NUMAPlace: one GPU on a node of a host layout.
type gpuOnNode struct {
	gpu  string
	node int
	host *topology.Host
}

func (g gpuOnNode) GPUNode(bdf string) int {
	if bdf == g.gpu {
		return g.node
	}
	return -1
}

func (g gpuOnNode) NodeSide(home, n int) (topology.NodeSide, string) { return g.host.NodeSide(home, n) }

// agent run judges remote-numa-pool on the pages each window's copies
// read: a window whose loads came from the far node fires it, the next,
// whose loads came from the GPU's node, does not; without GPU nodes the
// check says why it did not judge.
func TestEvaluatorRemotePages(t *testing.T) {
	const gpu = "0000:81:00.0"
	place := func(uint32) checks.Placement { return checks.Placement{GPU: gpu, Why: "test placement"} }
	// The GPU on node 1 of a 2-socket host (node N on package N).
	node := gpuOnNode{gpu: gpu, node: 1, host: &topology.Host{Nodes: []topology.Node{{ID: 0, Package: 0}, {ID: 1, Package: 1}}}}
	load := func(e *judge.Evaluator, pages ...int) {
		for i := range 16 {
			tr := &correlate.Transfer{PID: 30, API: "cudaMemcpyAsync", Op: event.OpCopy, Direction: correlate.DirH2D, Bytes: 4 << 20,
				HostMem: event.MemUnknown, SubmitNs: uint64(i) * 1e6, CompleteNs: uint64(i)*1e6 + 5e5, BatchIndex: -1, Layer: -1}
			tr.SetPages(correlate.PagesOn(pages...))
			e.Transfer(tr)
		}
	}
	e := judge.NewEvaluator(judge.EvaluatorConfig{Interval: time.Second, Place: place, NUMA: node})
	start := time.Now()
	load(e, 0, 0, 0)
	v := e.Evaluate(start.Add(time.Second))
	if got := rules(v); got["remote-numa-pool"] != 1 {
		t.Errorf("loads from node 0 to a GPU on node 1: findings %v", got)
	}
	load(e, 1, 1, 1)
	v = e.Evaluate(start.Add(2 * time.Second))
	if got := rules(v); got["remote-numa-pool"] != 0 {
		t.Errorf("loads from the GPU's node: findings %v", got)
	}
	e = judge.NewEvaluator(judge.EvaluatorConfig{Interval: time.Second, Place: place})
	load(e, 0, 0, 0)
	v = e.Evaluate(start.Add(time.Second))
	var pages *checks.Check
	for i, c := range v.Checks {
		if c.Name == checks.CheckPages {
			pages = &v.Checks[i]
		}
	}
	if rules(v)["remote-numa-pool"] != 0 || pages == nil || pages.Status != checks.Skip ||
		!strings.Contains(pages.Detail, "the GPU's NUMA node is unknown") {
		t.Errorf("no GPU nodes: findings %v, check %+v", rules(v), pages)
	}
}
