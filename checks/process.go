package checks

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/lanewatch/lanewatch/collectors"
	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/internal/ktext"
)

// Pool is where the pages of one pinned host range were found.
type Pool struct {
	Start, Size uint64
	PagesByNode map[int]uint64
	Source      string // "move_pages", "move_pages, every N pages"
	Err         error  // the range could not be located
}

// GPUOf picks the GPU a process uses: the first CUDA_VISIBLE_DEVICES entry
// when it is an index, else GPU 0 (CUDA orders GPUs by PCI address when
// CUDA_DEVICE_ORDER=PCI_BUS_ID; the default "fastest first" order usually
// agrees on homogeneous servers). The reason says which applied, or why
// the GPU is unknown (bdf "").
func (h *Host) GPUOf(pid int) (bdf string, node int, why string) {
	if len(h.GPUs) == 0 {
		return "", -1, fmt.Sprintf("GPU of pid %d unknown: no GPU in %s", pid, h.SysRoot)
	}
	idx, why := 0, "CUDA_VISIBLE_DEVICES unset: assumed GPU 0"
	read := func(pid int) (map[string]string, error) { return collectors.ReadBehaviourEnv(h.ProcRoot, pid) }
	if h.Env != nil {
		read = h.Env.Get
	}
	env, err := read(pid)
	if err != nil {
		why = fmt.Sprintf("environment unread (%v): assumed GPU 0", err)
	} else if v, ok := env["CUDA_VISIBLE_DEVICES"]; ok {
		first, _, _ := strings.Cut(v, ",")
		if n, err := strconv.Atoi(first); err == nil && n >= 0 && n < len(h.GPUs) {
			idx, why = n, "CUDA_VISIBLE_DEVICES="+v
		} else {
			why = "CUDA_VISIBLE_DEVICES=" + v + " is not a GPU index here: assumed GPU 0"
		}
	}
	bdf = h.GPUs[idx]
	return bdf, h.Topo.Functions[bdf].NUMANode, why
}

// Place is the Placement of a process: its GPU and that link's lane
// capacity (LaneCapacity: the trained maximum, not the current training),
// or why the GPU is unknown.
func (h *Host) Place(pid uint32) Placement {
	bdf, _, why := h.GPUOf(int(pid))
	if bdf == "" {
		return Placement{Why: why}
	}
	gbs, capWhy := h.LaneCapacity(bdf)
	return Placement{GPU: bdf, InboundGBs: gbs, OutboundGBs: gbs, Why: why + "; " + capWhy}
}

// Scope names a process in a check's scope: its pid and command, or that
// it is gone (exited during a window: sampled).
func (h *Host) Scope(pid int, sampled bool) (scope string, gone bool) {
	st, err := collectors.ReadStatus(h.ProcRoot, pid)
	switch {
	case err == nil:
		return fmt.Sprintf("pid %d (%s)", pid, st.Name), false
	case errors.Is(err, fs.ErrNotExist) && sampled:
		return fmt.Sprintf("pid %d (exited during the window)", pid), true
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Sprintf("pid %d", pid), true
	}
	return fmt.Sprintf("pid %d", pid), false
}

// ProcessChecks checks one process: its NUMA binding and where its pinned
// pools live (what its transfers did is the window rules', package judge).
// pools are the ranges located so far; sampled tells the SKIP texts
// whether a live window ran.
func (h *Host) ProcessChecks(pid int, pools []Pool, sampled bool) []Check {
	scope, gone := h.Scope(pid, sampled)
	if gone && !sampled {
		return []Check{Skipped(scope, "process", "pid %d: no such process", pid)}
	}
	gpu, gpuNode, why := h.GPUOf(pid)
	var out []Check
	if gone {
		out = append(out, Skipped(scope, "NUMA binding", "the process exited: its memory policy can no longer be read"))
	} else {
		out = append(out, h.bindCheck(scope, pid, gpuNode, why))
	}
	return append(out, h.poolCheck(scope, pid, gpu, gpuNode, why, pools, sampled))
}

func (h *Host) bindCheck(scope string, pid, gpuNode int, why string) Check {
	const name = "NUMA binding"
	if len(h.Topo.Nodes) < 2 {
		return Check{Scope: scope, Name: name, Status: Pass, Detail: "one NUMA node: nothing to bind to"}
	}
	if gpuNode < 0 {
		return Skipped(scope, name, "the GPU's NUMA node is unknown (%s)", why)
	}
	facts, err := collectors.ReadBindFacts(h.ProcRoot, h.SysRoot, pid, h.PathEnv)
	if err != nil {
		return Skipped(scope, name, "cannot read the process's NUMA state: %v", err)
	}
	f := correlate.NUMABindSkipped(correlate.BindFacts{
		PID: uint32(pid), MemsAllowed: facts.MemsAllowed, OnlineNodes: facts.OnlineNodes, Policies: facts.Policies,
		GPUNodes: []int{gpuNode}, NumactlOnPath: facts.NumactlPath != "", NumactlPath: h.PathEnv,
		CapSysNice: facts.CapSysNice, Cpuset: facts.Cpuset,
	})
	c := Check{Scope: scope, Name: name, Status: Pass,
		Detail: fmt.Sprintf("Mems_allowed %s, policies %s, GPU on node %d (%s)", ktext.FormatList(facts.MemsAllowed), strings.Join(facts.Policies, ","), gpuNode, why)}
	if f != nil {
		c.Findings = []correlate.Finding{*f}
	}
	return c
}

func (h *Host) poolCheck(scope string, pid int, gpu string, gpuNode int, why string, pools []Pool, sampled bool) Check {
	const name = "pinned pool placement"
	if len(pools) == 0 {
		// Only a registration seen locates a pool here; the pages copies
		// read are judged by "host pages of copies", whenever the memory
		// was registered (docs/design.md, "Pages, not registrations").
		if !sampled {
			return Skipped(scope, name, "pools are located as they are registered, which needs a live window: "+
				"rerun with --sample while the server registers them, or while it loads to judge the pages its copies read (%s)", CheckPages)
		}
		return Skipped(scope, name, "no pinned pool registered during the window; pools registered before it are judged by the pages their copies read (%s)", CheckPages)
	}
	c := Check{Scope: scope, Name: name, Status: Pass}
	var lines []string
	for _, p := range pools {
		if p.Err != nil {
			lines = append(lines, fmt.Sprintf("%#x+%d MiB: %v", p.Start, p.Size>>20, p.Err))
			continue
		}
		lines = append(lines, fmt.Sprintf("%#x+%d MiB on %s (%s)", p.Start, p.Size>>20, nodesText(p.PagesByNode), p.Source))
		if gpuNode < 0 {
			continue
		}
		f := correlate.RemoteNUMAPool(correlate.PoolPlacement{PID: uint32(pid), Start: p.Start, Size: p.Size, GPU: gpu,
			GPUNode: gpuNode, PagesByNode: p.PagesByNode, Source: p.Source, Sides: h.NodeSide})
		if f != nil {
			f.Evidence = append(f.Evidence, "GPU chosen because "+why)
			if node := busiestNode(p.PagesByNode); node >= 0 {
				if path, err := h.Topo.HostToDevice(node, gpu); err == nil {
					f.Evidence = append(f.Evidence, fmt.Sprintf("H2D path from node %d: %s", node, PathText(path)))
				}
			}
			c.Findings = append(c.Findings, *f)
		}
	}
	c.Detail = JoinLimited(lines, 4)
	if infoOnly(c.Findings) {
		c.Status = Info
	}
	if gpuNode < 0 {
		c.Status = Skip
		c.Detail += fmt.Sprintf("; cannot compare with the GPU's node (%s)", why)
	}
	return c
}

// busiestNode is the node holding most of the pages, -1 for none.
func busiestNode(pages map[int]uint64) int {
	best := -1
	for _, n := range slices.Sorted(maps.Keys(pages)) {
		if best < 0 || pages[n] > pages[best] {
			best = n
		}
	}
	return best
}

func nodesText(pages map[int]uint64) string {
	nodes := slices.Sorted(maps.Keys(pages))
	parts := make([]string, len(nodes))
	for i, n := range nodes {
		parts[i] = fmt.Sprintf("N%d=%d", n, pages[n])
	}
	if len(parts) == 0 {
		return "no resident pages"
	}
	return strings.Join(parts, " ")
}
