package judge

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/lanewatch/lanewatch/checks"
	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/topology"
)

// The lanes transfer libraries chose (kv-transfer-tcp-fallback,
// kv-transfer-far-device; correlate.TransportFallback, FarDevice): per
// process, the KV transfers of UCX and libfabric by GPU, transport and
// device, against where the host's RDMA devices sit from that GPU.

var _ = register(xferLaneRule{})

// CheckXferLanes names the check of a process's transfer-library lanes.
const CheckXferLanes = "KV transfer lanes"

// NICPlace is where the host's RDMA devices sit from a GPU
// (topology.Host.RDMARelations); *topology.Host is one.
type NICPlace interface {
	RDMARelations(gpu string) map[string]topology.Relation
}

type xferLaneRule struct{}

func (xferLaneRule) Check() string { return CheckXferLanes }
func (xferLaneRule) Raises() []string {
	return []string{"kv-transfer-tcp-fallback", "kv-transfer-far-device"}
}
func (xferLaneRule) Unsampled() string {
	return "needs a live window (--sample): the transport and device each UCX or libfabric transfer went on"
}

// maxXferLanes bounds the lanes a window keeps per process (GPU,
// transport, device); transfers on more are counted.
const maxXferLanes = 64

type xferLaneKey struct{ gpu, transport, device string }

// xferTally is one process's transfer-library transfers over a window.
type xferTally struct {
	lanes map[xferLaneKey]*correlate.XferLane
	over  int            // transfers on lanes past maxXferLanes
	why   map[string]int // transfers whose transport is unknown, by the record's reason
}

type xferFacts map[uint32]*xferTally

func (xferLaneRule) NewFacts() Facts { return xferFacts{} }

// Transfer counts a transfer library's record on its lane: KV data
// (correlate.XferData) or a control message.
func (facts xferFacts) Transfer(t *correlate.Transfer) {
	if !t.Op.IsXfer() {
		return
	}
	x := facts[t.PID]
	if x == nil {
		x = &xferTally{lanes: map[xferLaneKey]*correlate.XferLane{}, why: map[string]int{}}
		facts[t.PID] = x
	}
	transport := cmp.Or(t.Transport, "unknown")
	if correlate.ClassOf(transport) == correlate.TransportUnknown && len(x.why) < maxXferLanes {
		x.why[cmp.Or(t.TransportReason, "no reason recorded")]++
	}
	k := xferLaneKey{t.GPU, transport, t.NetDevice}
	ln := x.lanes[k]
	if ln == nil {
		if len(x.lanes) >= maxXferLanes {
			x.over++
			return
		}
		ln = &correlate.XferLane{Transport: transport, Device: t.NetDevice}
		x.lanes[k] = ln
	}
	if correlate.XferData(t) {
		ln.Transfers++
		ln.Bytes += t.Bytes
	} else {
		ln.Messages++
	}
}

func (xferFacts) Activity(*correlate.Activity) {}

func (r xferLaneRule) Judge(w *Window, env *Env) (j Judgement) {
	facts := factsOf[xferFacts](w, r)
	for _, pid := range slices.Sorted(maps.Keys(facts)) {
		j.Checks = append(j.Checks, xferLaneCheck(facts[pid], pid, env))
	}
	return j
}

// xferLaneCheck judges one process's lanes, GPU by GPU: a record's own
// GPU, else its process's (the placement). Lanes whose GPU is unknown, or
// whose GPU's place among the RDMA devices is, are listed and not judged.
func xferLaneCheck(x *xferTally, pid uint32, env *Env) checks.Check {
	c := checks.Check{Scope: env.scope(pid), Name: CheckXferLanes}
	byGPU := map[string][]correlate.XferLane{}
	var unplaced []correlate.XferLane
	unplacedWhy := ""
	for _, k := range slices.SortedFunc(maps.Keys(x.lanes), func(a, b xferLaneKey) int {
		return cmp.Or(cmp.Compare(a.gpu, b.gpu), cmp.Compare(a.transport, b.transport), cmp.Compare(a.device, b.device))
	}) {
		gpu := k.gpu
		if gpu == "" {
			pl := env.Place(pid)
			gpu, unplacedWhy = pl.GPU, pl.Why
		}
		if gpu == "" {
			unplaced = mergeLane(unplaced, *x.lanes[k])
			continue
		}
		byGPU[gpu] = mergeLane(byGPU[gpu], *x.lanes[k])
	}
	var parts []string
	judged, info := 0, false
	for _, gpu := range slices.Sorted(maps.Keys(byGPU)) {
		lanes := byGPU[gpu]
		if env.NICs == nil {
			parts = append(parts, fmt.Sprintf("GPU %s: %s; the host's RDMA devices are unknown (no PCI topology): not judged", gpu, correlate.XferLanesText(lanes, nil)))
			continue
		}
		rel := env.NICs.RDMARelations(gpu)
		text := fmt.Sprintf("GPU %s: %s", gpu, correlate.XferLanesText(lanes, rel))
		nearest, nearRel := correlate.NearestRDMA(rel)
		switch {
		case len(rel) == 0:
			judged++
			text += "; no RDMA device on this host"
			if slices.ContainsFunc(lanes, func(l correlate.XferLane) bool { return correlate.ClassOf(l.Transport) == correlate.TransportNetwork }) {
				text += ": the network stack is the best lane it has"
				info = true
			}
		case nearest == "":
			text += "; where the GPU sits from the RDMA devices is unknown (not in the PCI tree): not judged"
		default:
			judged++
			text += fmt.Sprintf("; nearest RDMA device %s (%s)", nearest, nearRel)
			if !correlate.NearGPU(nearRel) && slices.ContainsFunc(lanes, func(l correlate.XferLane) bool {
				return correlate.ClassOf(l.Transport) == correlate.TransportNetwork
			}) {
				text += ": none near the GPU (PIX/PXB), so the network stack is not judged a fallback"
				info = true
			}
			l := correlate.XferLanes{PID: pid, GPU: gpu, Lanes: lanes, RDMA: rel}
			for _, f := range []*correlate.Finding{correlate.TransportFallback(l), correlate.FarDevice(l)} {
				if f != nil {
					c.Findings = append(c.Findings, *f)
				}
			}
		}
		parts = append(parts, text)
	}
	if len(unplaced) > 0 {
		parts = append(parts, fmt.Sprintf("GPU unknown (%s): %s: not judged", cmp.Or(unplacedWhy, "no placement"), correlate.XferLanesText(unplaced, nil)))
	}
	if len(x.why) > 0 {
		var why []string
		for _, r := range slices.Sorted(maps.Keys(x.why)) {
			why = append(why, fmt.Sprintf("%d %s", x.why[r], r))
		}
		parts = append(parts, "transport unknown: "+strings.Join(why, ", "))
	}
	if x.over > 0 {
		parts = append(parts, fmt.Sprintf("%d transfers on lanes past the first %d: not judged", x.over, maxXferLanes))
	}
	c.Detail = strings.Join(parts, " | ")
	switch {
	case len(c.Findings) > 0:
		c.Status = checks.Warn
	case judged == 0:
		c.Status = checks.Skip
	case info:
		c.Status = checks.Info
	default:
		c.Status = checks.Pass
	}
	return c
}

// mergeLane adds a lane's counts to the same transport and device in
// lanes, or appends it.
func mergeLane(lanes []correlate.XferLane, l correlate.XferLane) []correlate.XferLane {
	for i := range lanes {
		if lanes[i].Transport == l.Transport && lanes[i].Device == l.Device {
			lanes[i].Transfers += l.Transfers
			lanes[i].Messages += l.Messages
			lanes[i].Bytes += l.Bytes
			return lanes
		}
	}
	return append(lanes, l)
}
