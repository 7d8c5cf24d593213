package judge_test

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/lanewatch/lanewatch/checks"
	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/judge"
	"github.com/lanewatch/lanewatch/topology"
)

// Lane demand follows each copy's GPU (docs/design.md, "Which GPU"): a TP
// worker placed on one GPU whose copies name another puts them on that
// GPU's lane, at that link's capacity; a copy that names none goes to its
// process's placement; a process with neither adds to no lane.
func TestEvaluatorLanesByCopyGPU(t *testing.T) {
	place := func(pid uint32) checks.Placement {
		if pid == 30 {
			return checks.Placement{Why: "unknown"}
		}
		return checks.Placement{GPU: "0000:17:00.0", InboundGBs: 4, OutboundGBs: 4}
	}
	capacity := func(gpu string) float64 {
		if gpu == "0000:3b:00.0" {
			return 8
		}
		return 0
	}
	e := judge.NewEvaluator(judge.EvaluatorConfig{Interval: time.Second, Place: place, LinkCapacity: capacity})
	start := time.Now()
	h2d := func(pid uint32, gpu string, at uint64) {
		e.Transfer(&correlate.Transfer{PID: pid, TID: pid, Stream: 0x10, API: "cudaMemcpyAsync", Op: event.OpCopy, Direction: correlate.DirH2D,
			Bytes: 1 << 20, HostMem: event.MemPinned, GPU: gpu, SubmitNs: at, CompleteNs: at + 5e5, BatchIndex: -1, Layer: -1})
	}
	h2d(20, "0000:3b:00.0", 1e6)
	h2d(20, "0000:3b:00.0", 2e6)
	h2d(20, "", 3e6)
	h2d(30, "", 4e6) // no GPU anywhere
	h2d(30, "0000:3b:00.0", 5e6)
	v := e.Evaluate(start.Add(time.Second))
	got := map[string]judge.LaneRate{}
	for _, l := range v.Lanes {
		got[l.GPU+" "+l.Direction] = l
	}
	perSec := func(n int) float64 { return float64(n<<20) / v.Window.Seconds() }
	if l := got["0000:3b:00.0 inbound"]; l.Demand != perSec(3) || l.Capacity != 8e9 {
		t.Errorf("lane of the copies' own GPU: %+v, want demand %v at 8e9", l, perSec(3))
	}
	if l := got["0000:17:00.0 inbound"]; l.Demand != perSec(1) || l.Capacity != 4e9 {
		t.Errorf("the placement's lane: %+v, want demand %v at 4e9", l, perSec(1))
	}
	if len(v.Lanes) != 3 { // 17 in and out (placed), 3b in
		t.Errorf("lanes %+v", v.Lanes)
	}
}

// Peer copies (D2D between two GPUs) are PCIe lane demand only where the
// topology says the pair has no NVLink: out of the source's link and into
// the destination's. Over NVLink they are on no PCIe lane; with the
// topology unknown they are on none either and say so (path unknown). The
// topology is DGX-1's hybrid cube mesh (msccl-tools' `topo -m`): GPU0–GPU3
// NV2, GPU0–GPU5 SYS.
func TestEvaluatorPeerCopyLanes(t *testing.T) {
	smi := dgx1Topology(t)
	gpu := func(i int) string { return fmt.Sprintf("0000:%02x:00.0", 0x10+i) }
	var all []string
	for i := range 8 {
		all = append(all, gpu(i))
	}
	for _, c := range []struct {
		name     string
		path     func(src, dst string) (string, bool)
		dst      string
		wantPath string
		onLanes  bool
	}{
		{"NVLink peer", smi.PeerPaths(all), gpu(3), checks.PathNVLink, false},
		{"PCIe peer", smi.PeerPaths(all), gpu(5), checks.PathPCIe, true},
		{"topology unknown", nil, gpu(5), checks.PathUnknown, false},
		{"GPU count differs", smi.PeerPaths(all[:4]), gpu(3), checks.PathUnknown, false},
	} {
		e := judge.NewEvaluator(judge.EvaluatorConfig{Interval: time.Second, GPUPath: c.path})
		start := time.Now()
		e.Transfer(&correlate.Transfer{PID: 20, TID: 20, Stream: 0x10, API: "cudaMemcpyPeerAsync", Op: event.OpCopyPeer, Direction: correlate.DirD2D,
			Bytes: 256 << 20, Src: correlate.Side{Mem: event.MemDevice}, Dst: correlate.Side{Mem: event.MemDevice},
			GPU: c.dst, SrcGPU: gpu(0), SubmitNs: 1e6, CompleteNs: 2e6, BatchIndex: -1, Layer: -1})
		v := e.Evaluate(start.Add(time.Second))
		bps := float64(256<<20) / v.Window.Seconds()
		if len(v.Peers) != 1 || v.Peers[0] != (judge.PeerRate{Src: gpu(0), Dst: c.dst, Path: c.wantPath, Bps: bps}) {
			t.Errorf("%s: peers %+v, want %s→%s %s at %v", c.name, v.Peers, gpu(0), c.dst, c.wantPath, bps)
		}
		demand := map[string]float64{}
		for _, l := range v.Lanes {
			demand[l.GPU+" "+l.Direction] = l.Demand
		}
		want := map[string]float64{}
		if c.onLanes {
			want = map[string]float64{gpu(0) + " outbound": bps, c.dst + " inbound": bps}
		}
		if fmt.Sprint(demand) != fmt.Sprint(want) {
			t.Errorf("%s: lane demand %v, want %v", c.name, demand, want)
		}
		t.Logf("%s: path %s, lanes %v", c.name, v.Peers[0].Path, demand)
	}
}

func dgx1Topology(t *testing.T) *topology.SMIMatrix {
	t.Helper()
	const file = "../topology/testdata/topo_m/msccl-tools_dgx1_8xV100_4xmlx5_unsorted_nolastnewline.txt"
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m, err := topology.ParseNvidiaSMI(f, file)
	if err != nil {
		t.Fatal(err)
	}
	return m
}
