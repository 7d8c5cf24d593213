package correlate

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/lanewatch/lanewatch/event"
)

func TestNodeZeroIsUnknown(t *testing.T) {
	var n Node
	if _, ok := n.Get(); ok || !n.IsZero() || n.String() != "unknown" {
		t.Errorf("zero Node: %v", n)
	}
	if got, ok := NodeOf(0).Get(); !ok || got != 0 || NodeOf(0).IsZero() {
		t.Errorf("NodeOf(0) = %d %v: node 0 must be a node", got, ok)
	}
	if !NodeOf(-1).IsZero() || !NodeOf(maxNode+1).IsZero() {
		t.Error("a negative or impossible node must be unknown")
	}
	// A transfer nobody located carries no node, so nothing judges it.
	var tr Transfer
	if _, ok := tr.NUMANode.Get(); ok || !tr.NUMAPages.IsZero() {
		t.Error("a zero Transfer claims to know its pages' node")
	}
}

func TestPageNodes(t *testing.T) {
	for _, tc := range []struct {
		nodes    []int
		majority string
		json     string
		split    map[int]uint64 // of 1000 bytes
	}{
		{nil, "unknown", "[]", map[int]uint64{}},
		{[]int{1}, "N1", "[1]", map[int]uint64{1: 1000}},
		{[]int{0, 1, 1}, "N1", "[0,1,1]", map[int]uint64{0: 334, 1: 666}},
		{[]int{1, 0}, "N0", "[1,0]", map[int]uint64{0: 500, 1: 500}}, // tie: lowest node
		{[]int{3, 2, 0}, "N0", "[3,2,0]", map[int]uint64{3: 334, 2: 333, 0: 333}},
		{[]int{-14, 2}, "N2", "[2]", map[int]uint64{2: 1000}},         // a page without a node (-ENOENT) is not a sample
		{[]int{1, 1, 1, 0}, "N1", "[1,1,1]", map[int]uint64{1: 1000}}, // past MaxPageSamples: dropped
	} {
		p := PagesOn(tc.nodes...)
		if got := p.Majority().String(); got != tc.majority {
			t.Errorf("%v: majority %s, want %s", tc.nodes, got, tc.majority)
		}
		if got := string(p.AppendJSON(nil)); got != tc.json {
			t.Errorf("%v: json %s, want %s", tc.nodes, got, tc.json)
		}
		got := map[int]uint64{}
		p.Split(1000, func(n int, b uint64) { got[n] += b })
		if len(got) != len(tc.split) {
			t.Errorf("%v: split %v, want %v", tc.nodes, got, tc.split)
		}
		for n, b := range tc.split {
			if got[n] != b {
				t.Errorf("%v: split %v, want %v", tc.nodes, got, tc.split)
			}
		}
	}
}

func TestPageNodesJSONRoundTrip(t *testing.T) {
	in := Transfer{Op: event.OpCopy, NUMANode: NodeOf(0), NUMAPages: PagesOn(0, 0, 1)} // a record without its op does not read back
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"numa_node":0,"numa_pages":[0,0,1]`) {
		t.Errorf("encoded %s", b)
	}
	var out Transfer
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	if out.NUMANode != in.NUMANode || out.NUMAPages != in.NUMAPages {
		t.Errorf("round trip: %+v %+v", out.NUMANode, out.NUMAPages)
	}
	b, _ = json.Marshal(Transfer{})
	if strings.Contains(string(b), "numa") {
		t.Errorf("unknown pages encoded: %s", b)
	}
	for _, bad := range []string{`{"numa_pages":[0,1,2,3]}`, `{"numa_pages":[-1]}`, `{"numa_pages":"0"}`, `{"numa_node":-1}`, `{"numa_node":1.5}`} {
		if err := json.Unmarshal([]byte(bad), &out); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
}

func TestRemoteNUMAPages(t *testing.T) {
	const MiB = 1 << 20
	two := NodeSides(twoSockets.NodeSide)
	for _, tc := range []struct {
		name string
		p    PageTraffic
		want Severity
	}{
		{"pages on the GPU's node", PageTraffic{GPUNode: 1, ByNode: map[int]uint64{1: 256 * MiB}, Sides: two}, ""},
		{"pages on the far node", PageTraffic{GPUNode: 1, ByNode: map[int]uint64{0: 256 * MiB}, Sides: two}, SevFail},
		{"most bytes far", PageTraffic{GPUNode: 0, ByNode: map[int]uint64{0: 40 * MiB, 1: 200 * MiB}, Sides: two}, SevFail},
		// A pool that is mostly local with some pages elsewhere (a bound
		// pool leaking pages as it swaps, the Nehalem sample): 0.5% remote.
		{"small remote share", PageTraffic{GPUNode: 0, ByNode: map[int]uint64{0: 1482914 * 4096, 1: 7379 * 4096}, Sides: two}, ""},
		// Interleaved evenly over two nodes: half the bytes cross, not most.
		{"even interleave", PageTraffic{GPUNode: 0, ByNode: map[int]uint64{0: 128 * MiB, 1: 128 * MiB}, Sides: two}, ""},
		{"far but few bytes", PageTraffic{GPUNode: 0, ByNode: map[int]uint64{1: 4 * MiB}, Sides: two}, ""},
		{"unknown GPU node", PageTraffic{GPUNode: -1, ByNode: map[int]uint64{0: 256 * MiB}, Sides: two}, ""},
		{"nothing located", PageTraffic{GPUNode: 0, Unknown: 256 * MiB, Sides: two}, ""},
		// Unlocated bytes neither dilute nor inflate the share.
		{"far, much unlocated", PageTraffic{GPUNode: 0, ByNode: map[int]uint64{1: 64 * MiB}, Unknown: 1024 * MiB, Sides: two}, SevFail},
		{"NPS4 sibling node", PageTraffic{GPUNode: 5, ByNode: map[int]uint64{6: 256 * MiB}, Sides: nps4.NodeSide}, SevInfo},
		{"NPS4 other socket", PageTraffic{GPUNode: 5, ByNode: map[int]uint64{1: 256 * MiB}, Sides: nps4.NodeSide}, SevFail},
		{"layout unknown", PageTraffic{GPUNode: 1, ByNode: map[int]uint64{0: 256 * MiB}}, SevInfo},
		{"a node not on the host", PageTraffic{GPUNode: 1, ByNode: map[int]uint64{9: 256 * MiB}, Sides: two}, SevInfo},
	} {
		tc.p.PID, tc.p.GPU, tc.p.GPUWhy, tc.p.Copies = 7, "0000:81:00.0", "test", 3
		f := RemoteNUMAPages(tc.p)
		if (f != nil) != (tc.want != "") || f != nil && f.Severity != tc.want {
			t.Errorf("%s: %+v, want severity %q", tc.name, f, tc.want)
			continue
		}
		if f != nil && (f.Rule != "remote-numa-pool" || !strings.Contains(f.Subject, "0000:81:00.0")) {
			t.Errorf("%s: %+v", tc.name, f)
		}
	}
	f := RemoteNUMAPages(PageTraffic{PID: 9, GPU: "0000:81:00.0", GPUNode: 1, GPUWhy: "the copies' device",
		ByNode: map[int]uint64{0: 30 * MiB, 1: 2 * MiB}, Unknown: 1 * MiB, Copies: 33, Sides: two})
	want := []string{"94% of the bytes pid 9 moved", "30 MiB of 32 MiB located", "N0=30 MiB N1=2 MiB", "NUMA node 1 (the copies' device)",
		"33 copies, 1 MiB of them not located", "--membind=1", "node 0 is on package 0, node 1 on package 1, distance 32"}
	text := f.Summary + " " + strings.Join(f.Evidence, " ") + " " + f.Remediation
	for _, w := range want {
		if !strings.Contains(text, w) {
			t.Errorf("finding lacks %q:\n%s", w, text)
		}
	}
	f = RemoteNUMAPages(PageTraffic{PID: 9, GPU: "0000:81:00.0", GPUNode: 0, GPUWhy: "the copies' device",
		ByNode: map[int]uint64{1: 30 * MiB}, Copies: 3, Sides: nps4.NodeSide})
	if f == nil || f.Severity != SevInfo || !strings.Contains(f.Summary, "on sibling nodes of node 0's socket") ||
		!strings.Contains(strings.Join(f.Evidence, " "), "nodes 0 and 1 are both on package 0") {
		t.Errorf("NPS4 sibling: %+v", f)
	}
}

// Decoding never panics, and what decodes encodes back to the same value.
func FuzzPageNodesJSON(f *testing.F) {
	for _, s := range []string{`[0,1,1]`, `[]`, `null`, `[3]`, `[0,1,2,3]`, `[-1]`, `[ 1 , 2 ]`, `{}`, `"1"`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var p PageNodes
		if err := p.UnmarshalJSON([]byte(s)); err != nil {
			return
		}
		var q PageNodes
		if err := q.UnmarshalJSON(p.AppendJSON(nil)); err != nil || q != p {
			t.Fatalf("%q decoded to %s, which decodes to %v (%v)", s, p.AppendJSON(nil), q, err)
		}
		var n Node
		if err := n.UnmarshalJSON([]byte(s)); err == nil {
			b, _ := n.MarshalJSON()
			var m Node
			if err := m.UnmarshalJSON(b); err != nil || m != n {
				t.Fatalf("node %q: %s → %v (%v)", s, b, m, err)
			}
		}
	})
}
