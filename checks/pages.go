package checks

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"slices"
	"strings"

	"github.com/lanewatch/lanewatch/collectors"
	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/topology"
)

// Where the host memory of a process lives (docs/design.md, "Pages, not
// registrations"): the pages each copy actually read or wrote, judged on
// bytes moved per GPU link (PagesCheck), and the process-wide picture from
// numa_maps (MemoryCheck).

// Check names.
const (
	CheckPages  = "host pages of copies"
	CheckMemory = "memory by NUMA node"
)

// pageTally is what one process's H2D and D2H copies over one GPU's link
// moved, by the node of their host pages.
type pageTally struct {
	byNode  map[int]uint64
	unknown uint64
	copies  int
}

// pageTally is the tally of the copies that crossed gpu's link ("" when
// the copy does not say: the process's placement decides at judgement),
// created empty; nil past maxPageGPUs.
func (p *procWindow) pageTally(gpu string) *pageTally {
	if p.pages == nil {
		p.pages = map[string]*pageTally{}
	}
	tl := p.pages[gpu]
	if tl == nil {
		if len(p.pages) >= maxPageGPUs {
			return nil
		}
		tl = &pageTally{byNode: map[int]uint64{}}
		p.pages[gpu] = tl
	}
	return tl
}

// add counts an H2D or D2H copy's bytes by the nodes of its sampled host
// pages (correlate.PageNodes.Split); on a nil tally, nothing.
func (tl *pageTally) add(t *correlate.Transfer) {
	if tl == nil {
		return
	}
	tl.copies++
	if t.NUMAPages.IsZero() {
		tl.unknown += t.Bytes
		return
	}
	t.NUMAPages.Split(t.Bytes, func(n int, b uint64) { tl.byNode[n] += b })
}

// maxPageGPUs bounds the GPUs tallied per process (a server has at most a
// few dozen).
const maxPageGPUs = 64

// GPUNode is the NUMA node of a GPU from sysfs (numa_node), -1 when it is
// unknown: not on this host, or firmware gave no affinity.
func (h *Host) GPUNode(bdf string) int {
	if f := h.Topo.Functions[bdf]; f != nil {
		return f.NUMANode
	}
	return -1
}

// NodeSide says where NUMA node n sits from node home, by their CPU
// packages (topology.Host.NodeSide).
func (h *Host) NodeSide(home, n int) (topology.NodeSide, string) {
	return h.Topo.NodeSide(home, n)
}

// NUMAPlace is what the NUMA placement rules need of the host: each GPU's
// node and where one node sits from another. *Host is one.
type NUMAPlace interface {
	GPUNode(bdf string) int
	NodeSide(home, n int) (topology.NodeSide, string)
}

// PagesCheck judges remote-numa-pool on the bytes one process's copies
// moved over each GPU's link during the window, by the NUMA node of the
// host pages they read or wrote, whatever the memory (registered before the
// agent attached, allocated pinned, pageable). Copies that name their GPU
// are judged against it; the others against the process's placement pl.
// numa gives a GPU's node (nil or -1: unknown, and that GPU is not judged,
// with the reason) and where the pages' nodes sit from it.
func (w *Window) PagesCheck(scope string, pid uint32, pl Placement, numa NUMAPlace) Check {
	w.mu.Lock()
	defer w.mu.Unlock()
	p := w.procs[pid]
	if p == nil || len(p.pages) == 0 {
		return Skipped(scope, CheckPages, "no H2D or D2H copy seen in the window")
	}
	type link struct {
		why string
		pageTally
	}
	links := map[string]*link{}
	var unplaced []string
	for _, key := range slices.Sorted(maps.Keys(p.pages)) {
		tl := p.pages[key]
		gpu, why := key, "the GPU the copies crossed"
		if key == "" {
			gpu, why = pl.GPU, "the process's placement: "+pl.Why
		}
		if gpu == "" {
			unplaced = append(unplaced, fmt.Sprintf("%d copies: GPU unknown (%s): not judged", tl.copies, pl.Why))
			continue
		}
		l := links[gpu]
		if l == nil {
			l = &link{why: why, pageTally: pageTally{byNode: map[int]uint64{}}}
			links[gpu] = l
		} else if key == "" {
			l.why += "; some by " + why
		}
		l.copies += tl.copies
		l.unknown += tl.unknown
		for n, b := range tl.byNode {
			l.byNode[n] += b
		}
	}
	c := Check{Scope: scope, Name: CheckPages, Status: Pass}
	judged := false
	var lines []string
	for _, gpu := range slices.Sorted(maps.Keys(links)) {
		l := links[gpu]
		node := -1
		var sides correlate.NodeSides
		if numa != nil {
			node, sides = numa.GPUNode(gpu), numa.NodeSide
		}
		var located uint64
		for _, b := range l.byNode {
			located += b
		}
		text := fmt.Sprintf("GPU %s: %d copies, host pages %s", gpu, l.copies, bytesByNode(l.byNode))
		if l.unknown > 0 {
			text += fmt.Sprintf(", %s not located", bytesText(l.unknown))
		}
		switch {
		case node < 0:
			text += "; the GPU's NUMA node is unknown (sysfs numa_node): not judged"
		case located == 0:
			text += "; no page located: not judged (the memory was gone when looked up, or the lookups were over budget)"
		default:
			judged = true
			text += fmt.Sprintf("; GPU on node %d", node)
			f := correlate.RemoteNUMAPages(correlate.PageTraffic{PID: pid, GPU: gpu, GPUNode: node, GPUWhy: l.why,
				ByNode: l.byNode, Unknown: l.unknown, Copies: l.copies, Sides: sides})
			if f != nil {
				c.Findings = append(c.Findings, *f)
			}
		}
		lines = append(lines, text)
	}
	lines = append(lines, unplaced...)
	c.Detail = strings.Join(lines, "; ")
	switch {
	case !judged:
		c.Status = Skip
	case infoOnly(c.Findings):
		c.Status = Info
	}
	return c
}

// infoOnly: findings, all INFO (placement off the node but not surely
// across a socket); Report.Add raises a check to the worst of the others.
func infoOnly(fs []correlate.Finding) bool {
	return len(fs) > 0 && !slices.ContainsFunc(fs, func(f correlate.Finding) bool { return f.Severity != correlate.SevInfo })
}

// bytesByNode prints bytes per node, "N0=32 MiB N1=4 MiB", or "none located".
func bytesByNode(b map[int]uint64) string {
	if len(b) == 0 {
		return "none located"
	}
	var parts []string
	for _, n := range slices.Sorted(maps.Keys(b)) {
		parts = append(parts, fmt.Sprintf("N%d=%s", n, bytesText(b[n])))
	}
	return strings.Join(parts, " ")
}

// bytesText prints a byte count in binary units.
func bytesText(b uint64) string {
	switch {
	case b >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30))
	case b >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
	case b >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(b)/(1<<10))
	}
	return fmt.Sprintf("%d B", b)
}

// NodeMemory is a process's resident memory per NUMA node, from its
// numa_maps: every mapping, and the anonymous ones (heap, stack, anonymous
// and anonymous huge pages: where host KV pools and pinned buffers live;
// file mappings are mostly libraries and page cache).
type NodeMemory struct {
	All, Anon map[int]uint64 // bytes per node
	// Largest are the anonymous mappings holding most bytes, largest first
	// (at most 3), as "0x7f…: N1=30.0 GiB (bind:1)".
	Largest []string
	// UnknownSize counts resident pages of mappings that printed no page
	// size (kernels before 2.6.32): in no byte count.
	UnknownSize uint64
}

// NodeMemoryOf sums numa_maps mappings by node.
func NodeMemoryOf(ms []collectors.NumaMapping) NodeMemory {
	nm := NodeMemory{All: map[int]uint64{}, Anon: map[int]uint64{}}
	type big struct {
		bytes uint64
		text  string
	}
	var anon []big
	for _, m := range ms {
		if m.PageSizeKB == 0 {
			nm.UnknownSize += m.Pages()
			continue
		}
		isAnon := m.File == "" || strings.HasPrefix(m.File, "/anon_hugepage")
		var total uint64
		per := map[int]uint64{}
		for n, pages := range m.PagesByNode {
			b := pages * m.PageSizeKB << 10
			nm.All[n] += b
			per[n] = b
			total += b
			if isAnon {
				nm.Anon[n] += b
			}
		}
		if isAnon && total > 0 {
			anon = append(anon, big{total, fmt.Sprintf("%#x: %s (%s)", m.Start, bytesByNode(per), m.Policy)})
		}
	}
	slices.SortStableFunc(anon, func(a, b big) int {
		switch {
		case a.bytes > b.bytes:
			return -1
		case a.bytes < b.bytes:
			return 1
		}
		return 0
	})
	for i := 0; i < len(anon) && i < 3; i++ {
		nm.Largest = append(nm.Largest, anon[i].text)
	}
	return nm
}

// MemoryCheck is the process-wide picture diagnose adds to the pages of
// the copies (seed 000 "NUMA": cat /proc/<PID>/numa_maps): how much of the
// process's resident memory, pinned or not, is on each node, and how much
// of its anonymous memory is off its GPU's node. It is INFO: it does not
// judge, since memory the copies never touch costs the GPU link nothing
// (remote-numa-pool is judged on pools and on the copies' pages).
func (h *Host) MemoryCheck(scope string, pid, gpuNode int, why string) Check {
	ms, err := collectors.ReadNumaMaps(h.ProcRoot, pid)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return Skipped(scope, CheckMemory, "no %s/%d/numa_maps: the process is gone, or the kernel has no NUMA support", h.ProcRoot, pid)
	case err != nil:
		return Skipped(scope, CheckMemory, "%v", err)
	}
	nm := NodeMemoryOf(ms)
	detail := fmt.Sprintf("resident %s; anonymous %s", bytesByNode(nm.All), bytesByNode(nm.Anon))
	var anon, off uint64
	for n, b := range nm.Anon {
		anon += b
		if n != gpuNode {
			off += b
		}
	}
	switch {
	case gpuNode < 0:
		detail += fmt.Sprintf("; GPU's node unknown (%s)", why)
	case anon > 0:
		detail += fmt.Sprintf("; %.0f%% of the anonymous memory is off GPU node %d (%s)", 100*float64(off)/float64(anon), gpuNode, why)
	}
	if len(nm.Largest) > 0 {
		detail += "; largest anonymous: " + strings.Join(nm.Largest, ", ")
	}
	if nm.UnknownSize > 0 {
		detail += fmt.Sprintf("; %d pages of unknown size not counted", nm.UnknownSize)
	}
	return Check{Scope: scope, Name: CheckMemory, Status: Info, Detail: detail}
}
