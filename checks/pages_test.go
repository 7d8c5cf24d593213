package checks

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/lanewatch/lanewatch/collectors"
	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/topology"
)

const mib = 1 << 20

// pagesCopy is an H2D (or D2H) copy whose host pages the agent located on
// the given nodes (none: not located).
func pagesCopy(dir string, mem event.MemKind, gpu string, bytes uint64, nodes ...int) *correlate.Transfer {
	t := &correlate.Transfer{PID: 42, API: "cudaMemcpyAsync", Op: event.OpCopy, Direction: dir, Bytes: bytes, HostMem: mem, GPU: gpu,
		SubmitNs: 1000, BatchIndex: -1, Layer: -1}
	t.SetPages(correlate.PagesOn(nodes...))
	return t
}

// Hosts as the topology package reads them (topology/testdata/numa): a
// 2-socket EPYC 9374F (node N on package N) and a 2-socket EPYC 7742 in
// NPS4 (nodes 0-3 on package 0, 4-7 on package 1).
var (
	twoSockets = &topology.Host{Nodes: []topology.Node{{ID: 0, Package: 0}, {ID: 1, Package: 1}}}
	nps4       = &topology.Host{Nodes: []topology.Node{{ID: 0, Package: 0}, {ID: 1, Package: 0}, {ID: 2, Package: 0}, {ID: 3, Package: 0},
		{ID: 4, Package: 1}, {ID: 5, Package: 1}, {ID: 6, Package: 1}, {ID: 7, Package: 1}}}
)

// numaOf is a NUMAPlace: GPUs' nodes (absent: -1) on a host's layout.
type numaOf struct {
	gpus map[string]int
	host *topology.Host
}

func (n numaOf) GPUNode(bdf string) int {
	if v, ok := n.gpus[bdf]; ok {
		return v
	}
	return -1
}

func (n numaOf) NodeSide(home, x int) (topology.NodeSide, string) { return n.host.NodeSide(home, x) }

func gpuNodes(m map[string]int) NUMAPlace { return numaOf{m, twoSockets} }

// remote-numa-pool on bytes moved, fire and no fire, for memory of every
// kind: registered before the agent attached (unknown), pinned, pageable.
func TestPagesCheck(t *testing.T) {
	const gpu, other = "0000:81:00.0", "0000:01:00.0"
	place := Placement{GPU: gpu, Why: "CUDA_VISIBLE_DEVICES=0"}
	nodes := gpuNodes(map[string]int{gpu: 1, other: 0})
	for _, tc := range []struct {
		name     string
		copies   []*correlate.Transfer
		pl       Placement
		gpuNode  NUMAPlace
		status   Status
		fire     bool
		contains []string
	}{
		{name: "pool on the GPU's node", copies: []*correlate.Transfer{
			pagesCopy(correlate.DirH2D, event.MemPinned, "", 64*mib, 1, 1, 1),
			pagesCopy(correlate.DirD2H, event.MemPinned, "", 16*mib, 1),
		}, pl: place, gpuNode: nodes, status: Pass, contains: []string{"GPU 0000:81:00.0: 2 copies, host pages N1=80.0 MiB; GPU on node 1"}},
		{name: "pool on the far node, most bytes (late attach: unknown kind)", copies: []*correlate.Transfer{
			pagesCopy(correlate.DirH2D, event.MemUnknown, "", 64*mib, 0, 0, 0),
			pagesCopy(correlate.DirH2D, event.MemUnknown, "", 8*mib, 1, 1, 1),
		}, pl: place, gpuNode: nodes, status: Pass, fire: true, contains: []string{"N0=64.0 MiB N1=8.0 MiB"}},
		{name: "unregistered pageable memory on the far node", copies: []*correlate.Transfer{
			pagesCopy(correlate.DirH2D, event.MemPageable, "", 32*mib, 0, 0, 0),
		}, pl: place, gpuNode: nodes, status: Pass, fire: true},
		// A mostly local pool with some pages elsewhere: under the half
		// that makes most of the traffic cross the interconnect.
		{name: "mixed pages, small remote share", copies: []*correlate.Transfer{
			pagesCopy(correlate.DirH2D, event.MemPinned, "", 96*mib, 1, 1, 0), // a third of these bytes remote
			pagesCopy(correlate.DirH2D, event.MemPinned, "", 96*mib, 1, 1, 1),
		}, pl: place, gpuNode: nodes, status: Pass, contains: []string{"N0=32.0 MiB N1=160.0 MiB"}},
		{name: "far, but too few bytes to matter", copies: []*correlate.Transfer{
			pagesCopy(correlate.DirH2D, event.MemPageable, "", 4*mib, 0),
		}, pl: place, gpuNode: nodes, status: Pass},
		{name: "copies name their own GPU", copies: []*correlate.Transfer{
			// On the placement's GPU (node 1) these would be remote; they
			// crossed the GPU on node 0.
			pagesCopy(correlate.DirH2D, event.MemPinned, other, 64*mib, 0, 0, 0),
		}, pl: place, gpuNode: nodes, status: Pass, contains: []string{"GPU 0000:01:00.0: 1 copies", "GPU on node 0"}},
		// NPS4: pages on a sibling node of the GPU's socket: INFO, no FAIL.
		{name: "sibling node of the GPU's socket", copies: []*correlate.Transfer{
			pagesCopy(correlate.DirH2D, event.MemPinned, "", 64*mib, 4, 4, 4),
		}, pl: place, gpuNode: numaOf{map[string]int{gpu: 5}, nps4}, status: Info, fire: true,
			contains: []string{"GPU on node 5"}},
		// The layout unknown: off the GPU's node is said, not judged a FAIL.
		{name: "layout unknown", copies: []*correlate.Transfer{
			pagesCopy(correlate.DirH2D, event.MemPinned, "", 64*mib, 0, 0, 0),
		}, pl: place, gpuNode: numaOf{map[string]int{gpu: 1}, nil}, status: Info, fire: true},
		{name: "GPU's node unknown", copies: []*correlate.Transfer{
			pagesCopy(correlate.DirH2D, event.MemPinned, "", 64*mib, 0),
		}, pl: place, gpuNode: gpuNodes(map[string]int{gpu: -1}), status: Skip,
			contains: []string{"the GPU's NUMA node is unknown (sysfs numa_node): not judged"}},
		{name: "GPU unknown", copies: []*correlate.Transfer{
			pagesCopy(correlate.DirH2D, event.MemPinned, "", 64*mib, 0),
		}, pl: Placement{Why: "GPU of pid 42 unknown: no GPU in /sys"}, gpuNode: nodes, status: Skip,
			contains: []string{"1 copies: GPU unknown (GPU of pid 42 unknown: no GPU in /sys): not judged"}},
		{name: "no page located", copies: []*correlate.Transfer{
			pagesCopy(correlate.DirH2D, event.MemPinned, "", 64*mib),
		}, pl: place, gpuNode: nodes, status: Skip, contains: []string{"64.0 MiB not located", "no page located: not judged"}},
		{name: "D2D and failed copies only", copies: []*correlate.Transfer{
			pagesCopy(correlate.DirD2D, event.MemDevice, "", 64*mib, 0),
		}, pl: place, gpuNode: nodes, status: Skip, contains: []string{"no H2D or D2H copy"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := NewWindow()
			for _, c := range tc.copies {
				w.Transfer(c)
			}
			c := w.PagesCheck("pid 42", 42, tc.pl, tc.gpuNode)
			if c.Status != tc.status || (len(c.Findings) > 0) != tc.fire {
				t.Fatalf("%s, %d findings, want %s fire=%v: %s", c.Status, len(c.Findings), tc.status, tc.fire, c.Detail)
			}
			for _, s := range tc.contains {
				if !strings.Contains(c.Detail, s) {
					t.Errorf("detail lacks %q: %s", s, c.Detail)
				}
			}
			if tc.fire && (c.Findings[0].Rule != "remote-numa-pool" || (c.Findings[0].Severity == correlate.SevInfo) != (tc.status == Info)) {
				t.Errorf("finding %+v", c.Findings[0])
			}
		})
	}
}

// A process's resident memory by node, from real numa_maps captures
// (collectors/testdata/numa_maps, provenance in its README); the expected
// sums were added up from each file's N<node>= and kernelpagesize_kB=.
func TestNodeMemoryOfSamples(t *testing.T) {
	for _, tc := range []struct {
		file      string
		all, anon map[int]uint64
		largest   string
	}{
		// kernel documentation: libraries split N0/N3, anonymous memory
		// and an anonymous huge page (2 MiB) on N3.
		{"linux_kernel_doc_proc_rst_example_N0_N3_anon_hugepage.txt",
			map[int]uint64{0: 65 * 4096, 3: 40*4096 + 2*mib}, map[int]uint64{3: 13*4096 + 2*mib},
			"0x7f4dc1200000: N3=2.0 MiB (default)"},
		// systemd on a one-node machine.
		{"jc_fixture_pid_numa_maps_systemd_single_node.txt",
			map[int]uint64{0: 13565952}, map[int]uint64{0: 3710976}, ""},
		// weighted interleave 1:5 over two nodes: heap and a 256 MiB mapping.
		{"lkml_2024_weighted_interleave_v5_eatmem_weights_1t5.txt",
			map[int]uint64{0: 21889 * 4096, 1: 109441 * 4096}, map[int]uint64{0: 21889 * 4096, 1: 109441 * 4096},
			"0x1f07000: N0=42.8 MiB N1=214.2 MiB (weighted interleave:0-1)"},
	} {
		f, err := os.Open(filepath.Join("..", "collectors", "testdata", "numa_maps", tc.file))
		if err != nil {
			t.Fatal(err)
		}
		ms, err := collectors.ParseNumaMaps(f, tc.file)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		nm := NodeMemoryOf(ms)
		if !reflect.DeepEqual(nm.All, tc.all) || !reflect.DeepEqual(nm.Anon, tc.anon) {
			t.Errorf("%s: all %v anon %v, want %v %v", tc.file, nm.All, nm.Anon, tc.all, tc.anon)
		}
		if tc.largest != "" && (len(nm.Largest) == 0 || nm.Largest[0] != tc.largest) {
			t.Errorf("%s: largest %q, want %q first", tc.file, nm.Largest, tc.largest)
		}
	}
}

// The diagnose check reads /proc/PID/numa_maps: a process whose anonymous
// memory sits on the far node says so, INFO; a gone process SKIPs.
func TestMemoryCheck(t *testing.T) {
	proc := t.TempDir()
	src, err := os.ReadFile(filepath.Join("..", "collectors", "testdata", "numa_maps", "lkml_2024_weighted_interleave_v5_eatmem_weights_1t5.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(proc, "77"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(proc, "77", "numa_maps"), src, 0o644); err != nil {
		t.Fatal(err)
	}
	h := &Host{ProcRoot: proc}
	c := h.MemoryCheck("pid 77", 77, 0, "CUDA_VISIBLE_DEVICES=0")
	if c.Status != Info || !strings.Contains(c.Detail, "resident N0=85.5 MiB N1=427.5 MiB") ||
		!strings.Contains(c.Detail, "83% of the anonymous memory is off GPU node 0") {
		t.Errorf("%+v", c)
	}
	c = h.MemoryCheck("pid 77", 77, -1, "no GPU in /sys")
	if c.Status != Info || !strings.Contains(c.Detail, "GPU's node unknown (no GPU in /sys)") {
		t.Errorf("%+v", c)
	}
	if c := h.MemoryCheck("pid 78", 78, 0, ""); c.Status != Skip || !strings.Contains(c.Detail, "no "+proc+"/78/numa_maps") {
		t.Errorf("%+v", c)
	}
}
