package selftest

import (
	"strings"
	"testing"

	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
)

// The comparison itself must fail on each kind of wrong record, or the
// selftest proves nothing.

func rdmaTruth() []TruthCall {
	return []TruthCall{
		{Seq: 1, Op: TruthConnect, QPNum: 7, PeerPID: 200},
		{Seq: 2, Op: TruthPostSend, QPNum: 7, WRID: 1, Opcode: "RDMA_WRITE", Bytes: 4096, LocalMem: "device", RemoteMem: "device"},
		{Seq: 3, Op: TruthPostSend, QPNum: 7, WRID: 2, Opcode: "RDMA_WRITE", Bytes: 4096, LocalMem: "device", RemoteMem: "unknown"},
	}
}

func rdmaGot() []correlate.Transfer {
	wr := func(id uint64, remote event.MemKind, peer uint32) correlate.Transfer {
		return correlate.Transfer{PID: 100, Op: event.OpPostSend, QPNum: 7, WRID: id, Bytes: 4096, Direction: correlate.DirRDMAWrite,
			Src: correlate.Side{Mem: event.MemDevice}, Dst: correlate.Side{Mem: remote}, PeerPID: peer, Layer: -1, BatchIndex: -1}
	}
	return []correlate.Transfer{wr(1, event.MemDevice, 200), wr(2, event.MemUnknown, 0)}
}

func TestCompareRDMA(t *testing.T) {
	var ok Result
	compareRDMA(&ok, rdmaTruth(), rdmaGot())
	if !ok.OK() || ok.Got != 2 {
		t.Fatalf("exact records judged wrong: %+v", ok)
	}
	for _, c := range []struct {
		name string
		edit func([]correlate.Transfer) []correlate.Transfer
		want string
	}{
		{"duplicate", func(g []correlate.Transfer) []correlate.Transfer { return append(g, g[0]) }, "reported twice"},
		{"stray", func(g []correlate.Transfer) []correlate.Transfer {
			x := g[0]
			x.WRID = 9
			return append(g, x)
		}, "not posted by the scenario"},
		{"remote kind", func(g []correlate.Transfer) []correlate.Transfer { g[0].Dst.Mem = event.MemPinned; return g }, "remote memory pinned"},
		{"peer", func(g []correlate.Transfer) []correlate.Transfer { g[1].PeerPID = 200; return g }, "peer 200, want unknown peer 0"},
	} {
		var r Result
		compareRDMA(&r, rdmaTruth(), c.edit(rdmaGot()))
		if r.OK() || !strings.Contains(strings.Join(r.Problems, "\n"), c.want) {
			t.Errorf("%s: judged %+v", c.name, r)
		}
	}
}

func TestCompareCompletionAndLayer(t *testing.T) {
	const stream = 0x5000
	truth := []TruthCall{
		{Seq: 1, Op: TruthCopy, API: "cudaMemcpyAsync", Bytes: 64, Direction: "H2D", Stream: stream, ExpectHostMem: "pinned", Layer: 0, EngineEndNs: 500},
		{Seq: 2, Op: TruthEventRecord, Stream: stream, Layer: 0},
		{Seq: 3, Op: TruthStreamSync, Stream: stream, TReturnNs: 1000},
	}
	good := correlate.Transfer{API: "cudaMemcpyAsync", Bytes: 64, Direction: "H2D", Stream: stream, HostMem: event.MemPinned, CompleteNs: 900, Layer: 0}
	var r Result
	Compare(&r, truth, []correlate.Transfer{good})
	if !r.OK() {
		t.Fatalf("exact record judged wrong: %+v", r)
	}
	for _, c := range []struct {
		name string
		edit func(*correlate.Transfer)
		want string
	}{
		{"before the engine", func(g *correlate.Transfer) { g.CompleteNs = 400 }, "before the engine finished"},
		{"after the sync", func(g *correlate.Transfer) { g.CompleteNs = 1100 }, "after stream_sync seq 3"},
		{"never completed", func(g *correlate.Transfer) { g.CompleteNs = 0 }, "no complete_ns"},
		{"layer", func(g *correlate.Transfer) { g.Layer = 1 }, "layer 1, truth 0"},
	} {
		g := good
		c.edit(&g)
		var r Result
		Compare(&r, truth, []correlate.Transfer{g})
		if r.OK() || !strings.Contains(strings.Join(r.Problems, "\n"), c.want) {
			t.Errorf("%s: judged %+v", c.name, r)
		}
	}
}

// Transfers of a process no scenario claims are forgotten a while after it
// exits, so a busy host does not grow the selftest's memory.
func TestCollectorForgetsUnclaimed(t *testing.T) {
	c := NewCollector(nil)
	c.Transfer(&correlate.Transfer{PID: 1})
	c.OnExit(1)
	c.exitedAt[1] = c.exitedAt[1].Add(-2 * unclaimedFor)
	c.Transfer(&correlate.Transfer{PID: 2})
	c.OnExit(2) // sweeps pid 1
	if len(c.byPID[1]) != 0 || len(c.byPID[2]) != 1 {
		t.Fatalf("kept %v", c.byPID)
	}
	if got := c.Take(2); len(got) != 1 {
		t.Errorf("claimed in time: %v", got)
	}
}

// A row's drops are its own processes' losses: another process's (firing
// the same probes) are not counted against it.
func TestCollectorCountsLossesByProcess(t *testing.T) {
	c := NewCollector(nil)
	for _, e := range []event.Call{{PID: 7, LostBefore: true}, {PID: 7}, {PID: 8, LostBefore: true}, {PID: 7, LostBefore: true}} {
		c.OnCall(&e)
	}
	if got := c.Lost(7); got != 2 {
		t.Errorf("pid 7 lost %d, want 2", got)
	}
	if got := c.Lost(9); got != 0 {
		t.Errorf("pid 9 lost %d, want 0", got)
	}
	if got := c.Lost(7, 8); got != 3 {
		t.Errorf("pids 7, 8 lost %d, want 3", got)
	}
}
