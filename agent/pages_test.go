package agent

import (
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/lanewatch/lanewatch/collectors"
	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/exporters"
	"github.com/lanewatch/lanewatch/topology"
)

// pageSink keeps what the page stage hands on, exits as records with API "exit".
type pageSink struct {
	mu  sync.Mutex
	got []correlate.Transfer
}

func (p *pageSink) Transfer(t *correlate.Transfer) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.got = append(p.got, *t)
}

func (p *pageSink) exit(pid uint32) func() {
	return func() { p.Transfer(&correlate.Transfer{PID: pid, API: "exit"}) }
}

func uintptrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(&b[0])) }

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func h2d(pid uint32, src, bytes uint64, at uint64) *correlate.Transfer {
	return &correlate.Transfer{PID: pid, API: "cudaMemcpyAsync", Op: event.OpCopy, Direction: correlate.DirH2D, Bytes: bytes,
		Src: correlate.Side{Addr: src, Mem: event.MemUnknown}, Dst: correlate.Side{Addr: 0x7e0000000000, Mem: event.MemDevice},
		HostMem: event.MemUnknown, SubmitNs: at, BatchIndex: -1, Layer: -1}
}

func d2h(pid uint32, dst, bytes uint64, at uint64) *correlate.Transfer {
	return &correlate.Transfer{PID: pid, API: "cudaMemcpyAsync", Op: event.OpCopy, Direction: correlate.DirD2H, Bytes: bytes,
		Src: correlate.Side{Addr: 0x7e0000000000, Mem: event.MemDevice}, Dst: correlate.Side{Addr: dst, Mem: event.MemPageable},
		HostMem: event.MemPageable, SubmitNs: at, BatchIndex: -1, Layer: -1}
}

// onlyNode is the one node a whole range of this process is on, from the
// kernel (move_pages on every page): what the stage must report.
func onlyNode(t *testing.T, pid int, start, end uint64) int {
	t.Helper()
	pn, err := collectors.RangeNodes(pid, start, end, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(pn.ByNode) != 1 || pn.Sampled() {
		t.Skipf("pages of %#x-%#x on %v: not one node, cannot test a single answer", start, end, pn.ByNode)
	}
	for n := range pn.ByNode {
		return n
	}
	return -1
}

// The real move_pages on this machine: this process's memory, another
// process's stack, memory never touched, an address unmapped, a process
// that is gone.
func TestPagesRealMovePages(t *testing.T) {
	const size = 8 << 20
	buf, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(buf)
	for i := range buf {
		buf[i] = 1
	}
	base := uint64(uintptrOf(buf))
	cold, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(cold) // never touched: no page resident
	coldBase := uint64(uintptrOf(cold))
	gone, err := unix.Mmap(-1, 0, 1<<20, unix.PROT_READ, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	unmapped := uint64(uintptrOf(gone))
	unix.Munmap(gone)

	self := uint32(os.Getpid())
	want := onlyNode(t, 0, base, base+size)

	// Another process: the page at the top of its stack, placed as its
	// numa_maps says (an independent reading of the same kernel state).
	child := exec.Command("sleep", "30")
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer child.Process.Kill()
	stackTop, stackNode := childStack(t, child.Process.Pid)

	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	// A process that exited and was not reaped yet: the kernel finds no
	// memory for it (EINVAL rather than ESRCH).
	zombie := exec.Command("true")
	if err := zombie.Start(); err != nil {
		t.Fatal(err)
	}
	defer zombie.Wait()
	waitZombie(t, zombie.Process.Pid)

	sink := &pageSink{}
	s := newPageStage(sink, defaultPageConfig(quietLog()))
	s.start()
	s.Transfer(h2d(self, base, size, 1))                               // resident: located
	s.Transfer(d2h(self, base+4096, 64<<10, 2))                        // a D2H into it: located
	s.Transfer(h2d(self, coldBase, size, 3))                           // never touched: no node
	s.Transfer(h2d(self, unmapped, 1<<20, 4))                          // not mapped: no node
	s.Transfer(h2d(uint32(child.Process.Pid), stackTop-4096, 4096, 5)) // another process
	s.Transfer(h2d(uint32(dead.Process.Pid), base, 4096, 6))           // the process is gone
	s.Transfer(h2d(uint32(zombie.Process.Pid), base, 4096, 7))         // exited, not reaped
	s.close()

	if len(sink.got) != 7 {
		t.Fatalf("%d transfers handed on, want 7", len(sink.got))
	}
	for i, wantNode := range []int{want, want, -1, -1, stackNode, -1, -1} {
		tr := sink.got[i]
		if tr.SubmitNs != uint64(i+1) {
			t.Fatalf("transfer %d handed on out of order: %+v", i, tr)
		}
		got, ok := tr.NUMANode.Get()
		if wantNode < 0 {
			if ok || !tr.NUMAPages.IsZero() {
				t.Errorf("transfer %d: node %d %v, want unknown", i, got, tr.NUMAPages)
			}
			continue
		}
		if !ok || got != wantNode || tr.NUMAPages.Len() == 0 {
			t.Errorf("transfer %d: node %v pages %v, want node %d", i, tr.NUMANode, string(tr.NUMAPages.AppendJSON(nil)), wantNode)
		}
		for j := 0; j < tr.NUMAPages.Len(); j++ {
			if tr.NUMAPages.At(j) != wantNode {
				t.Errorf("transfer %d: sampled pages %s, want all on %d", i, tr.NUMAPages.AppendJSON(nil), wantNode)
			}
		}
	}
	st := s.Stats()
	if st.Copies != 7 || st.Located != 3 || st.NoNode != 4 || st.Failed != 0 || st.OverRate != 0 || st.Behind != 0 {
		t.Errorf("stats %+v", st)
	}
}

// waitZombie waits until pid has exited and is not reaped (state Z).
func waitZombie(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		stat, err := os.ReadFile(filepath.Join("/proc", fmt.Sprint(pid), "stat"))
		if err != nil {
			t.Fatal(err)
		}
		if i := strings.LastIndexByte(string(stat), ')'); i > 0 && strings.HasPrefix(string(stat[i+1:]), " Z") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pid %d did not exit: %s", pid, stat)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// childStack reads a process's stack from /proc/PID/maps and its node from
// /proc/PID/numa_maps; it returns the stack's end and that node.
func childStack(t *testing.T, pid int) (end uint64, node int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ranges, nm := stackOf(t, pid)
		if len(ranges) == 1 && len(nm.PagesByNode) == 1 {
			for n := range nm.PagesByNode {
				return ranges[0].End, n
			}
		}
		if time.Now().After(deadline) { // the exec may not have happened yet
			t.Fatalf("pid %d: stack %v, numa_maps %+v", pid, ranges, nm)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func stackOf(t *testing.T, pid int) ([]collectors.AddrRange, collectors.NumaMapping) {
	raw, err := os.ReadFile(filepath.Join("/proc", fmt.Sprint(pid), "maps"))
	if err != nil {
		t.Fatal(err)
	}
	var ranges []collectors.AddrRange
	for _, line := range strings.Split(string(raw), "\n") {
		if strings.HasSuffix(line, "[stack]") {
			var lo, hi uint64
			fmt.Sscanf(line, "%x-%x", &lo, &hi)
			ranges = append(ranges, collectors.AddrRange{Start: lo, End: hi})
		}
	}
	maps, err := collectors.ReadNumaMaps("/proc", pid)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range maps {
		if m.Stack && len(ranges) == 1 && m.Start == ranges[0].Start {
			return ranges, m
		}
	}
	return ranges, collectors.NumaMapping{}
}

// fakeSpace answers move_pages from a numa_maps line of a real capture:
// the mapping's pages are spread over its nodes in the proportions the
// kernel printed, in the pattern its policy makes — weighted interleave
// gives each node its weight in consecutive pages in turn; other policies
// (a bound mapping leaking pages while it swaps, first touch from threads
// on both nodes) are spread evenly through the mapping.
type fakeSpace struct {
	start, pages uint64
	nodes        []int
	counts       []uint64
	mu           sync.Mutex
	asked        int
}

func spaceOf(t *testing.T, file string, line int) *fakeSpace {
	t.Helper()
	f, err := os.Open(filepath.Join("..", "collectors", "testdata", "numa_maps", file))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ms, err := collectors.ParseNumaMaps(f, file)
	if err != nil {
		t.Fatal(err)
	}
	m := ms[line]
	s := &fakeSpace{start: m.Start, pages: m.Pages()}
	for _, n := range slices.Sorted(maps.Keys(m.PagesByNode)) {
		s.nodes = append(s.nodes, n)
		s.counts = append(s.counts, m.PagesByNode[n])
	}
	return s
}

// nodeOfPage spreads page i: each node's pages are placed at the positions
// where floor(i × count / pages) steps, so every stretch of the mapping has
// the mapping's proportions.
func (s *fakeSpace) nodeOfPage(i uint64) int {
	for k := len(s.nodes) - 1; k > 0; k-- {
		c := s.counts[k]
		if (i+1)*c/s.pages != i*c/s.pages {
			return s.nodes[k]
		}
	}
	return s.nodes[0]
}

func (s *fakeSpace) lookup(pid int, addrs []uintptr) ([]int, error) {
	s.mu.Lock()
	s.asked += len(addrs)
	s.mu.Unlock()
	out := make([]int, len(addrs))
	for i, a := range addrs {
		p := (uint64(a) - s.start) / 4096
		if uint64(a) < s.start || p >= s.pages {
			out[i] = collectors.PageNotMapped
			continue
		}
		out[i] = s.nodeOfPage(p)
	}
	return out, nil
}

// share is the fraction of the mapping's pages on node.
func (s *fakeSpace) share(node int) float64 {
	for k, n := range s.nodes {
		if n == node {
			return float64(s.counts[k]) / float64(s.pages)
		}
	}
	return 0
}

// Copies from memory placed as real captures show, located by the stage
// and judged on bytes moved: pages on the GPU's node do not fire, pages
// mostly on the far node do, a small remote share does not.
func TestPagesJudgedFromNumaMapsSamples(t *testing.T) {
	for _, tc := range []struct {
		name, file string
		line       int
		fireOn     map[int]bool // GPU node → remote-numa-pool expected
	}{
		// numactl -w --interleave=0,1 with weights 1:5: N0=10923 N1=54614.
		{"weighted interleave 1:5", "lkml_2024_weighted_interleave_v5_eatmem_weights_1t5.txt", 1, map[int]bool{0: true, 1: false}},
		// weights 5:1: most pages on node 0.
		{"weighted interleave 5:1", "lkml_2024_weighted_interleave_v5_eatmem_weights_5t1.txt", 1, map[int]bool{0: false, 1: true}},
		// bind:0 leaking 0.5% to node 1 while swapping: a small remote share.
		{"bound, a few pages off", "ompi-www_hwloc-devel_2011-02_2020_nehalem_2node_grep7ffd861da000_snapshot4.txt", 0, map[int]bool{0: false, 1: true}},
		// default policy, first touch on both sockets: 63% on node 1.
		{"default, both nodes", "ompi-www_hwloc-devel_2011-02_2020_nehalem_2node_grep7ffd861da000_snapshot1.txt", 2, map[int]bool{0: true, 1: false}},
		// bind:1 entirely on node 1.
		{"bound to node 1", "ompi-www_hwloc-devel_2011-02_2020_nehalem_2node_grep7ffd861da000_snapshot1.txt", 1, map[int]bool{0: true, 1: false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			space := spaceOf(t, tc.file, tc.line)
			sink := &pageSink{}
			cfg := defaultPageConfig(quietLog())
			cfg.lookup, cfg.now = space.lookup, func() time.Time { return time.Unix(0, 0) }
			// 1 MiB loads over the first 256 MiB of the mapping, queued
			// before the worker starts so that each chunk is asked once.
			s := newPageStage(sink, cfg)
			span := min(space.pages*4096, 256<<20)
			at := uint64(0)
			for off := uint64(0); off+1<<20 <= span; off += 1 << 20 {
				at++
				s.Transfer(h2d(1234, space.start+off, 1<<20, at))
			}
			s.start()
			s.close()
			// The same loads again, and 1 MiB writebacks: from the cache.
			s2 := newPageStage(sink, cfg)
			s2.cache, s2.cached = s.cache, s.cached
			s2.start()
			for off := uint64(0); off+1<<20 <= span; off += 1 << 20 {
				at++
				s2.Transfer(h2d(1234, space.start+off, 1<<20, at))
			}
			for off := uint64(0); off+1<<20 <= span; off += 4 << 20 {
				at++
				s2.Transfer(d2h(1234, space.start+off, 1<<20, at))
			}
			s2.close()
			if len(sink.got) != int(at) {
				t.Fatalf("%d of %d transfers handed on", len(sink.got), at)
			}
			byNode := map[int]uint64{}
			var total uint64
			for _, tr := range sink.got {
				if tr.NUMAPages.IsZero() {
					t.Fatalf("transfer not located: %+v", tr)
				}
				tr.NUMAPages.Split(tr.Bytes, func(n int, b uint64) { byNode[n] += b })
				total += tr.Bytes
			}
			st, st2 := s.Stats(), s2.Stats()
			if st.Located+st2.Located != at || st.Cached != 0 || st2.Cached != st2.Copies ||
				st.OverRate+st.Behind+st.NoNode+st.Failed+st2.OverRate+st2.Behind+st2.NoNode+st2.Failed != 0 {
				t.Errorf("stats %+v then %+v", st, st2)
			}
			// One page per 2 MiB chunk the loads sample is asked, once.
			chunks := map[uint64]bool{}
			var pages [correlate.MaxPageSamples]uint64
			for i := range sink.got[:span>>20] {
				for _, pg := range pages[:samplePages(&sink.got[i], 4096, &pages)] {
					chunks[pg>>chunkShift] = true
				}
			}
			if space.asked != len(chunks) {
				t.Errorf("asked %d pages, want one per chunk sampled: %d", space.asked, len(chunks))
			}
			for _, n := range space.nodes {
				got := float64(byNode[n]) / float64(total)
				if d := got - space.share(n); d > 0.1 || d < -0.1 {
					t.Errorf("node %d: %.3f of the bytes, the capture has %.3f of the pages", n, got, space.share(n))
				}
			}
			// Judged as on two sockets (the Nehalem captures' 2-node
			// machine is; the LKML one's hardware is not stated).
			sockets := &topology.Host{Nodes: []topology.Node{{ID: 0, Package: 0}, {ID: 1, Package: 1}}}
			for gpuNode, fire := range tc.fireOn {
				f := correlate.RemoteNUMAPages(correlate.PageTraffic{PID: 1234, GPU: "0000:81:00.0", GPUNode: gpuNode, GPUWhy: "test",
					ByNode: byNode, Copies: len(sink.got), Sides: sockets.NodeSide})
				if (f != nil) != fire || f != nil && f.Severity != correlate.SevFail {
					t.Errorf("GPU on node %d: fired %v, want %v; bytes by node %v", gpuNode, f != nil, fire, byNode)
				}
			}
		})
	}
}

// blockingLookup holds every query until released.
type blockingLookup struct {
	release chan struct{}
	node    int
}

func (b *blockingLookup) lookup(pid int, addrs []uintptr) ([]int, error) {
	<-b.release
	out := make([]int, len(addrs))
	for i := range out {
		out[i] = b.node
	}
	return out, nil
}

// Transfers leave in the order they came, a process's exit after its
// transfers, whatever waits for a lookup; what needs none passes at once
// when nothing waits.
func TestPagesOrderAndExit(t *testing.T) {
	b := &blockingLookup{release: make(chan struct{}), node: 1}
	sink := &pageSink{}
	cfg := defaultPageConfig(quietLog())
	cfg.lookup = b.lookup
	s := newPageStage(sink, cfg)
	s.start()
	d2d := &correlate.Transfer{PID: 5, API: "cudaMemcpyAsync", Direction: correlate.DirD2D, Bytes: 1 << 20, SubmitNs: 0}
	s.Transfer(d2d)
	if len(sink.got) != 1 {
		t.Fatal("a D2D copy waited for nothing")
	}
	s.Transfer(h2d(5, 0x7f0000000000, 1<<20, 1))
	s.Transfer(&correlate.Transfer{PID: 5, API: "cudaMemcpyAsync", Direction: correlate.DirD2D, Bytes: 1 << 20, SubmitNs: 2})
	s.Transfer(h2d(5, 0x7f0000000000, 1<<20, 3)) // the same chunk: one query answers both
	s.Exit(5, sink.exit(5))
	sink.mu.Lock()
	if len(sink.got) != 1 {
		t.Errorf("%d handed on while the first lookup waits", len(sink.got))
	}
	sink.mu.Unlock()
	close(b.release)
	s.close()
	var order []string
	for _, tr := range sink.got {
		order = append(order, fmt.Sprintf("%s@%d:%v", tr.Direction, tr.SubmitNs, tr.NUMANode))
		if tr.API == "exit" {
			order[len(order)-1] = "exit"
		}
	}
	want := "D2D@0:unknown H2D@1:N1 D2D@2:unknown H2D@3:N1 exit"
	if got := strings.Join(order, " "); got != want {
		t.Errorf("handed on %s\nwant       %s", got, want)
	}
	if st := s.Stats(); st.Queries != 1 || st.Pages != 1 {
		t.Errorf("one chunk asked once, stats %+v", st)
	}
	// After the exit the process's chunks are forgotten: a new process
	// with the same pid is asked again.
	s2 := newPageStage(sink, cfg)
	s2.Transfer(h2d(5, 0x7f0000000000, 1<<20, 4))
	s2.start()
	s2.close()
	s2.Exit(5, nil)
	if s2.cached != 0 || len(s2.cache) != 0 {
		t.Errorf("exit left %d chunks", s2.cached)
	}
}

// Failed calls, D2D, H2H, RDMA and copies without a host address are not
// located; a copy's samples lie in its range, one in each third.
func TestPagesSamples(t *testing.T) {
	var out [correlate.MaxPageSamples]uint64
	for _, tr := range []*correlate.Transfer{
		{Direction: correlate.DirD2D, Bytes: 4096, Src: correlate.Side{Addr: 0x1000}},
		{Direction: correlate.DirH2H, Bytes: 4096, Src: correlate.Side{Addr: 0x1000}},
		{Direction: correlate.DirUnknown, Bytes: 4096, Src: correlate.Side{Addr: 0x1000}},
		{Direction: correlate.DirH2D, Bytes: 4096},
		{Direction: correlate.DirH2D, Bytes: 0, Src: correlate.Side{Addr: 0x1000}},
		{Direction: correlate.DirH2D, Bytes: 4096, Src: correlate.Side{Addr: 0x1000}, Error: &correlate.CallError{Code: 1}},
		{Direction: correlate.DirRecv, Bytes: 4096, QPNum: 3, Dst: correlate.Side{Addr: 0x1000}},
	} {
		if n := samplePages(tr, 4096, &out); n != 0 {
			t.Errorf("%+v: %d samples", tr, n)
		}
	}
	for _, c := range []struct{ addr, bytes, pages uint64 }{
		{0x10000, 1, 1}, {0x10ff0, 0x20, 2}, {0x10000, 3 * 4096, 3}, {0x10800, 1 << 20, 3}, {0x7f0000000000, 1 << 30, 3},
	} {
		for at := uint64(0); at < 50; at++ {
			n := samplePages(h2d(1, c.addr, c.bytes, at), 4096, &out)
			if uint64(n) != min(3, c.pages) {
				t.Fatalf("%#x+%d: %d samples", c.addr, c.bytes, n)
			}
			first, last := c.addr&^4095, (c.addr+c.bytes-1)&^4095
			np := (last-first)/4096 + 1
			for i := 0; i < n; i++ {
				p := out[i]
				lo, hi := first+uint64(i)*np/uint64(n)*4096, first+(uint64(i)+1)*np/uint64(n)*4096
				if p%4096 != 0 || p < lo || p >= hi {
					t.Fatalf("%#x+%d sample %d = %#x, want a page in [%#x, %#x)", c.addr, c.bytes, i, p, lo, hi)
				}
			}
		}
	}
}

// The page budget: past pageBurst pages the copies go on unknown, counted;
// the budget refills with time. A lookup older than pageTTL is asked again.
func TestPagesBudgetAndTTL(t *testing.T) {
	now := time.Unix(1000, 0)
	space := &fakeSpace{start: 0x7f0000000000, pages: 1 << 30, nodes: []int{0}, counts: []uint64{1 << 30}}
	sink := &pageSink{}
	cfg := defaultPageConfig(quietLog())
	cfg.lookup, cfg.now = space.lookup, func() time.Time { return now }
	s := newPageStage(sink, cfg)
	// Each copy in a chunk of its own: one page asked per copy.
	n := pageBurst + 100
	for i := 0; i < n; i++ {
		s.Transfer(h2d(9, space.start+uint64(i)<<chunkShift, 4096, uint64(i)))
	}
	s.start()
	s.close()
	st := s.Stats()
	if st.Located != pageBurst || st.OverRate != 100 || space.asked != pageBurst {
		t.Errorf("over budget: stats %+v, asked %d", st, space.asked)
	}
	for i, tr := range sink.got {
		if located := !tr.NUMAPages.IsZero(); located != (i < pageBurst) {
			t.Fatalf("transfer %d located %v", i, located)
		}
	}
	// A second later the budget is back; the chunks located are cached.
	now = now.Add(time.Second)
	s2 := newPageStage(sink, cfg)
	s2.cache, s2.cached = s.cache, s.cached
	for i := pageBurst; i < n; i++ {
		s2.Transfer(h2d(9, space.start+uint64(i)<<chunkShift, 4096, uint64(i)))
	}
	s2.Transfer(h2d(9, space.start, 4096, 0)) // cached
	s2.start()
	s2.close()
	if st := s2.Stats(); st.Located != 101 || st.Cached != 1 || st.OverRate != 0 {
		t.Errorf("refilled: stats %+v", st)
	}
	// Past the TTL the cached chunk is asked again.
	now = now.Add(pageTTL + time.Second)
	asked := space.asked
	s3 := newPageStage(sink, cfg)
	s3.cache, s3.cached = s2.cache, s2.cached
	s3.Transfer(h2d(9, space.start, 4096, 0))
	s3.start()
	s3.close()
	if st := s3.Stats(); space.asked != asked+1 || st.Cached != 0 || st.Located != 1 {
		t.Errorf("a chunk past its TTL was not asked again: stats %+v", st)
	}
}

// When the worker cannot keep up, the oldest waiting copies go on unknown,
// counted, and order is kept.
func TestPagesBehind(t *testing.T) {
	space := &fakeSpace{start: 0x7f0000000000, pages: 1 << 30, nodes: []int{0}, counts: []uint64{1 << 30}}
	sink := &pageSink{}
	cfg := defaultPageConfig(quietLog())
	cfg.lookup = space.lookup
	s := newPageStage(sink, cfg)
	for i := 0; i < pageMaxHeld+10; i++ { // the worker has not started: nothing is asked
		s.Transfer(h2d(9, space.start+uint64(i%64)<<chunkShift, 4096, uint64(i)))
	}
	if len(sink.got) != 10 {
		t.Fatalf("%d handed on, want the 10 oldest", len(sink.got))
	}
	s.start()
	s.close()
	st := s.Stats()
	if st.Behind != 10 || st.Located != pageMaxHeld || len(sink.got) != pageMaxHeld+10 {
		t.Errorf("stats %+v, %d handed on", st, len(sink.got))
	}
	for i, tr := range sink.got {
		if tr.SubmitNs != uint64(i) {
			t.Fatalf("transfer %d handed on as %d", i, tr.SubmitNs)
		}
		if located := !tr.NUMAPages.IsZero(); located != (i >= 10) {
			t.Fatalf("transfer %d located %v", i, located)
		}
	}
}

// Every copy looked for is counted in exactly one result of the metric.
func TestPageStatsByResult(t *testing.T) {
	st := PageStats{Copies: 100, Located: 60, Cached: 40, NoNode: 10, Failed: 5, OverRate: 20, Behind: 5}
	var sum uint64
	got := st.ByResult()
	for _, r := range exporters.PageLookupResults {
		sum += got[r]
	}
	if sum != st.Copies || len(got) != len(exporters.PageLookupResults) || got["located"] != 20 {
		t.Errorf("%v", got)
	}
}
