package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/lanewatch/lanewatch/collectors"
	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/probes"
	"github.com/lanewatch/lanewatch/topology"
)

// DiagnoseConfig is what `agent diagnose` can be told.
type DiagnoseConfig struct {
	ProcRoot, SysRoot string
	PIDs              []int         // targets; empty: every process that maps a CUDA library
	Sample            time.Duration // live probe window; 0: static checks only
	Libs              []string      // also probe these files during the window
	// IBDevices is the GPU index → RDMA device map the server was given
	// (SGLang --disaggregation-ib-device); checked by far-nic when set.
	IBDevices map[string]string
	PathEnv   string // PATH searched for numactl; empty: this process's PATH
	Logger    *slog.Logger
	// OnSampleStart runs once the probes are attached, when the window opens.
	OnSampleStart func()
}

// Diagnose runs the checklist of seed 000 ("排查清单") in its order: the
// path (topology, links, IOMMU, NUMA), then per process where its pools
// live and, with a sample window, what its transfers did. An error means
// diagnose itself could not run.
func Diagnose(ctx context.Context, cfg DiagnoseConfig) (*Report, error) {
	if cfg.ProcRoot == "" {
		cfg.ProcRoot = "/proc"
	}
	if cfg.SysRoot == "" {
		cfg.SysRoot = "/sys"
	}
	if cfg.PathEnv == "" {
		cfg.PathEnv = os.Getenv("PATH")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	host, err := topology.Read(cfg.SysRoot)
	if err != nil {
		return nil, fmt.Errorf("read topology: %w", err)
	}
	d := &diagnosis{cfg: cfg, host: host, gpus: host.BDFs(topology.KindGPU)}
	var win *window
	if cfg.Sample > 0 {
		win, err = d.sample(ctx)
		if err != nil {
			return nil, err
		}
	}
	r := &Report{}
	d.hostChecks(r)
	if win != nil {
		r.add(d.pinnedPressure(win))
		r.add(d.congestionCheck(win))
	} else {
		r.add(skipf(hostScope, "pinned memory", "pinned pools are seen as they are registered: rerun with --sample"))
		r.add(skipf(hostScope, "RDMA congestion", "needs a live window (--sample) to compare counter rates with latency"))
	}
	for _, pid := range d.targets(win) {
		d.processChecks(r, pid, win)
	}
	return r, nil
}

type diagnosis struct {
	cfg  DiagnoseConfig
	host *topology.Host
	gpus []string // GPU BDFs in CUDA's PCI order
}

const hostScope = "host"

func (d *diagnosis) hostChecks(r *Report) {
	h := d.host
	nics, nvme := h.BDFs(topology.KindNIC), h.BDFs(topology.KindNVMe)
	detail := fmt.Sprintf("%d PCI functions, %d GPU, %d NIC, %d NVMe, %d NUMA node(s)", len(h.Functions), len(d.gpus), len(nics), len(nvme), len(h.Nodes))
	if len(d.gpus) == 0 {
		r.add(Check{Scope: hostScope, Name: "PCI topology", Status: Skip,
			Detail: detail + ": no GPU on this host (no PCI function of class 0x0300/0x0302); GPU checks are skipped"})
	} else {
		r.add(Check{Scope: hostScope, Name: "PCI topology", Status: Pass, Detail: detail + ": GPUs " + joinLimited(d.gpus, 8)})
	}
	r.add(d.pathCheck())
	r.add(d.nicCheck())
	r.add(d.linkCheck())
	r.add(d.iommuCheck())
	r.add(d.numactlCheck())
	r.add(d.hugepagesCheck())
}

// pathCheck lists, per GPU, the H2D path from its own node's memory and the
// segment that bounds it: the ceiling a prefix-cache load can reach.
func (d *diagnosis) pathCheck() Check {
	const name = "H2D path per GPU"
	if len(d.gpus) == 0 {
		return skipf(hostScope, name, "no GPU")
	}
	var lines []string
	for i, gpu := range d.gpus {
		node := d.host.Functions[gpu].NUMANode
		if node < 0 {
			node = 0
		}
		p, err := d.host.HostToDevice(node, gpu)
		if err != nil {
			lines = append(lines, fmt.Sprintf("GPU%d: %v", i, err))
			continue
		}
		lines = append(lines, fmt.Sprintf("GPU%d from node %d: %s", i, node, pathText(p)))
	}
	return Check{Scope: hostScope, Name: name, Status: Pass, Detail: joinLimited(lines, 8)}
}

// pathText prints a path's segments and names its bottleneck.
func pathText(p topology.Path) string {
	names := make([]string, len(p.Segments))
	for i, s := range p.Segments {
		names[i] = s.Name + "(" + s.Dir + ")"
	}
	out := strings.Join(names, " → ")
	if p.Bottleneck >= 0 {
		b := p.Segments[p.Bottleneck]
		out += fmt.Sprintf("; bottleneck %s %.2f GB/s", b.Name, b.CapacityGBs)
	}
	return out
}

func (d *diagnosis) nicCheck() Check {
	const name = "RDMA NIC per GPU"
	if len(d.host.RDMA) == 0 {
		return skipf(hostScope, name, "no RDMA device (%s/class/infiniband is empty): GPUDirect RDMA checks are skipped", d.cfg.SysRoot)
	}
	if len(d.gpus) == 0 {
		return skipf(hostScope, name, "%d RDMA device(s) but no GPU", len(d.host.RDMA))
	}
	nearest := d.host.NearestRDMA()
	js, _ := json.Marshal(nearest)
	c := Check{Scope: hostScope, Name: name, Status: Pass, Detail: "nearest RDMA device per GPU (SGLang --disaggregation-ib-device): " + string(js)}
	for idx, used := range d.cfg.IBDevices {
		i, err := strconv.Atoi(idx)
		if err != nil || i < 0 || i >= len(d.gpus) {
			c.Status, c.Detail = Warn, fmt.Sprintf("--ib-devices names GPU %q, this host has GPUs 0..%d", idx, len(d.gpus)-1)
			continue
		}
		rel := map[string]string{}
		for dev, bdf := range d.host.RDMA {
			if bdf != "" {
				rel[dev] = string(d.host.Relation(d.gpus[i], bdf))
			}
		}
		if f := correlate.FarNIC(correlate.NICChoice{GPU: d.gpus[i], Used: used, Relations: rel}); f != nil {
			c.Findings = append(c.Findings, *f)
		}
	}
	return c
}

func (d *diagnosis) linkCheck() Check {
	const name = "PCIe links"
	var lines []string
	c := Check{Scope: hostScope, Name: name, Status: Pass}
	for _, kind := range []string{topology.KindGPU, topology.KindNIC, topology.KindNVMe} {
		for _, bdf := range d.host.BDFs(kind) {
			l := d.host.Functions[bdf].Link
			if !l.Known || l.MaxWidth == 0 {
				continue
			}
			lines = append(lines, fmt.Sprintf("%s %s Gen%d x%d %.2f GB/s", kind, bdf, topology.Generation(l.CurSpeedGTs), l.CurWidth, l.CurGBs()))
			f := correlate.LinkDegraded(correlate.LinkFacts{Device: kind + " " + bdf, CurGTs: l.CurSpeedGTs, MaxGTs: l.MaxSpeedGTs,
				CurWidth: l.CurWidth, MaxWidth: l.MaxWidth, CurGBs: l.CurGBs(), MaxGBs: l.MaxGBs()})
			if f != nil {
				c.Findings = append(c.Findings, *f)
			}
		}
	}
	if len(lines) == 0 {
		return skipf(hostScope, name, "no GPU, NIC or NVMe reports a PCIe link state (virtual devices)")
	}
	c.Detail = joinLimited(lines, 6) + "; a GPU idling at a low speed is power saving, not a fault"
	return c
}

func (d *diagnosis) iommuCheck() Check {
	const name = "IOMMU"
	rdmaNICs := map[string]bool{}
	for _, bdf := range d.host.RDMA {
		rdmaNICs[bdf] = true
	}
	peer := len(d.gpus) > 1 || (len(d.gpus) > 0 && len(rdmaNICs) > 0)
	devs := append(append([]string(nil), d.gpus...), sortedKeys(rdmaNICs)...)
	if len(devs) == 0 {
		return skipf(hostScope, name, "no GPU or RDMA NIC to check")
	}
	c := Check{Scope: hostScope, Name: name, Status: Pass}
	var modes []string
	for _, bdf := range devs {
		f := d.host.Functions[bdf]
		if f == nil {
			continue
		}
		if f.IOMMUGroup < 0 {
			modes = append(modes, bdf+": no IOMMU group (not translated)")
			continue
		}
		modes = append(modes, fmt.Sprintf("%s: group %d %s", bdf, f.IOMMUGroup, f.IOMMUType))
		if fd := correlate.IOMMUTranslated(correlate.IOMMUFacts{Device: bdf, Group: f.IOMMUGroup, Type: f.IOMMUType, PeerExpected: peer}); fd != nil {
			c.Findings = append(c.Findings, *fd)
		}
	}
	c.Detail = joinLimited(modes, 6)
	return c
}

func (d *diagnosis) numactlCheck() Check {
	const name = "numactl"
	path, err := collectors.FindNumactl(d.cfg.PathEnv)
	if len(d.host.Nodes) < 2 {
		if err != nil {
			return Check{Scope: hostScope, Name: name, Status: Pass, Detail: "one NUMA node: binding has nothing to choose (numactl is not installed either)"}
		}
		return Check{Scope: hostScope, Name: name, Status: Pass, Detail: "one NUMA node: binding has nothing to choose; numactl at " + path}
	}
	if err != nil {
		return Check{Scope: hostScope, Name: name, Status: Warn,
			Detail: fmt.Sprintf("%d NUMA nodes and no numactl in PATH=%s: SGLang skips its per-GPU NUMA binding silently", len(d.host.Nodes), d.cfg.PathEnv),
			Fix:    "install numactl (apt-get install numactl) in the server's image"}
	}
	return Check{Scope: hostScope, Name: name, Status: Pass, Detail: "numactl at " + path}
}

func (d *diagnosis) hugepagesCheck() Check {
	m, err := collectors.ReadMeminfo(d.cfg.ProcRoot)
	if err != nil {
		return skipf(hostScope, "hugepages", "cannot read meminfo: %v", err)
	}
	return Check{Scope: hostScope, Name: "hugepages", Status: Pass,
		Detail: fmt.Sprintf("%d of %d huge pages of %d KiB free; MemAvailable %d MiB of %d MiB",
			m.HugePagesFree, m.HugePagesTotal, m.HugepagesizeBytes>>10, m.MemAvailableBytes>>20, m.MemTotalBytes>>20)}
}

// targets are the processes to check: the ones named, else every process
// mapping a CUDA library now, plus every process that moved bytes during the
// window.
func (d *diagnosis) targets(win *window) []int {
	if len(d.cfg.PIDs) > 0 {
		return d.cfg.PIDs
	}
	set := map[int]bool{}
	for _, pid := range cudaProcesses(d.cfg.ProcRoot) {
		set[pid] = true
	}
	if win != nil {
		for _, pid := range win.sample.pids() {
			set[int(pid)] = true
		}
	}
	out := sortedKeys(set)
	return out
}

// cudaProcesses lists the processes that map a file named like the CUDA
// runtime or driver.
func cudaProcesses(procRoot string) []int {
	pids, _ := listPIDs(procRoot)
	var out []int
	for _, pid := range pids {
		maps, err := probes.ReadMaps(procRoot, pid)
		if err != nil {
			continue
		}
		for _, m := range maps {
			if m.FileBacked() && looksLikeCUDA(m.Path) {
				out = append(out, pid)
				break
			}
		}
	}
	return out
}

// gpuOf picks the GPU a process uses: the first CUDA_VISIBLE_DEVICES entry
// when it is an index, else GPU 0 (CUDA orders GPUs by PCI address when
// CUDA_DEVICE_ORDER=PCI_BUS_ID; the default "fastest first" order usually
// agrees on homogeneous servers). The reason says which applied.
func (d *diagnosis) gpuOf(pid int) (bdf string, node int, reason string) {
	if len(d.gpus) == 0 {
		return "", -1, "no GPU on this host"
	}
	idx, reason := 0, "CUDA_VISIBLE_DEVICES unset: assumed GPU 0"
	if env, err := os.ReadFile(filepath.Join(d.cfg.ProcRoot, strconv.Itoa(pid), "environ")); err == nil {
		for _, kv := range strings.Split(string(env), "\x00") {
			v, ok := strings.CutPrefix(kv, "CUDA_VISIBLE_DEVICES=")
			if !ok {
				continue
			}
			first, _, _ := strings.Cut(v, ",")
			if n, err := strconv.Atoi(first); err == nil && n >= 0 && n < len(d.gpus) {
				idx, reason = n, "CUDA_VISIBLE_DEVICES="+v
			} else {
				reason = "CUDA_VISIBLE_DEVICES=" + v + " is not a GPU index here: assumed GPU 0"
			}
		}
	}
	bdf = d.gpus[idx]
	return bdf, d.host.Functions[bdf].NUMANode, reason
}

func (d *diagnosis) processChecks(r *Report, pid int, win *window) {
	scope := fmt.Sprintf("pid %d", pid)
	st, err := collectors.ReadStatus(d.cfg.ProcRoot, pid)
	gone := errors.Is(err, fs.ErrNotExist)
	switch {
	case err == nil:
		scope = fmt.Sprintf("pid %d (%s)", pid, st.Name)
	case gone && win == nil:
		r.add(skipf(scope, "process", "pid %d: no such process", pid))
		return
	case gone:
		scope = fmt.Sprintf("pid %d (exited during the window)", pid)
	}
	gpu, gpuNode, why := d.gpuOf(pid)
	if gone {
		r.add(skipf(scope, "NUMA binding", "the process exited: its memory policy can no longer be read"))
	} else {
		r.add(d.bindCheck(scope, pid, gpuNode, why))
	}
	r.add(d.poolCheck(scope, pid, gpu, gpuNode, why, win))
	d.sampleChecks(r, scope, pid, gpu, win)
}

// processChecksStatic is a live process's NUMA binding and pool placement,
// without a sample window's transfer checks (agent run's host judge).
func (d *diagnosis) processChecksStatic(r *Report, pid int, win *window) {
	scope := fmt.Sprintf("pid %d", pid)
	gpu, gpuNode, why := d.gpuOf(pid)
	r.add(d.bindCheck(scope, pid, gpuNode, why))
	r.add(d.poolCheck(scope, pid, gpu, gpuNode, why, win))
}

// sampleChecks adds the window's transfer checks of one process.
func (d *diagnosis) sampleChecks(r *Report, scope string, pid int, gpu string, win *window) {
	if win == nil || win.sample == nil {
		return
	}
	inbound := 0.0
	if f := d.host.Functions[gpu]; f != nil {
		inbound = f.Link.CurGBs()
	}
	for _, c := range win.sample.checks(scope, uint32(pid), gpu, inbound) {
		r.add(c)
	}
}

func (d *diagnosis) bindCheck(scope string, pid, gpuNode int, why string) Check {
	const name = "NUMA binding"
	if len(d.host.Nodes) < 2 {
		return Check{Scope: scope, Name: name, Status: Pass, Detail: "one NUMA node: nothing to bind to"}
	}
	if gpuNode < 0 {
		return skipf(scope, name, "the GPU's NUMA node is unknown (%s)", why)
	}
	facts, err := collectors.ReadBindFacts(d.cfg.ProcRoot, d.cfg.SysRoot, pid, d.cfg.PathEnv)
	if err != nil {
		return skipf(scope, name, "cannot read the process's NUMA state: %v", err)
	}
	f := correlate.NUMABindSkipped(correlate.BindFacts{
		PID: uint32(pid), MemsAllowed: facts.MemsAllowed, OnlineNodes: facts.OnlineNodes, Policies: facts.Policies,
		GPUNodes: []int{gpuNode}, NumactlOnPath: facts.NumactlPath != "", NumactlPath: d.cfg.PathEnv,
		CapSysNice: facts.CapSysNice, Cpuset: facts.Cpuset,
	})
	c := Check{Scope: scope, Name: name, Status: Pass,
		Detail: fmt.Sprintf("Mems_allowed %s, policies %s, GPU on node %d (%s)", collectors.FormatCPUList(facts.MemsAllowed), strings.Join(facts.Policies, ","), gpuNode, why)}
	if f != nil {
		c.Findings = []correlate.Finding{*f}
	}
	return c
}

func (d *diagnosis) poolCheck(scope string, pid int, gpu string, gpuNode int, why string, win *window) Check {
	const name = "pinned pool placement"
	var placements []placement
	if win != nil {
		placements = win.placements(pid)
	}
	if len(placements) == 0 {
		if win == nil {
			return skipf(scope, name, "no pinned pool known without a live window: rerun with --sample while the server registers or loads")
		}
		return skipf(scope, name, "no pinned pool registered or used in the window")
	}
	c := Check{Scope: scope, Name: name, Status: Pass}
	var lines []string
	for _, p := range placements {
		if p.err != nil {
			lines = append(lines, fmt.Sprintf("%#x+%d MiB: %v", p.start, p.size>>20, p.err))
			continue
		}
		lines = append(lines, fmt.Sprintf("%#x+%d MiB on %s (%s)", p.start, p.size>>20, nodesText(p.pages), p.source))
		if gpuNode < 0 {
			continue
		}
		f := correlate.RemoteNUMAPool(correlate.PoolPlacement{PID: uint32(pid), Start: p.start, Size: p.size, GPU: gpu,
			GPUNode: gpuNode, PagesByNode: p.pages, Source: p.source})
		if f != nil {
			f.Evidence = append(f.Evidence, "GPU chosen because "+why)
			if node := busiestNode(p.pages); node >= 0 {
				if path, err := d.host.HostToDevice(node, gpu); err == nil {
					f.Evidence = append(f.Evidence, fmt.Sprintf("H2D path from node %d: %s", node, pathText(path)))
				}
			}
			c.Findings = append(c.Findings, *f)
		}
	}
	c.Detail = joinLimited(lines, 4)
	if gpuNode < 0 {
		c.Status = Skip
		c.Detail += fmt.Sprintf("; cannot compare with the GPU's node (%s)", why)
	}
	return c
}

func (d *diagnosis) pinnedPressure(win *window) Check {
	m, err := collectors.ReadMeminfo(d.cfg.ProcRoot)
	if err != nil {
		return skipf(hostScope, "pinned memory", "cannot read meminfo: %v", err)
	}
	facts := correlate.PinnedFacts{MemTotal: m.MemTotalBytes, MemAvailable: m.MemAvailableBytes, ByProcess: win.pinnedBytes()}
	for _, b := range facts.ByProcess {
		facts.PinnedBytes += b
	}
	c := Check{Scope: hostScope, Name: "pinned memory", Status: Pass,
		Detail: fmt.Sprintf("%d MiB pinned by the processes seen in the window, %d MiB of %d MiB available", facts.PinnedBytes>>20, m.MemAvailableBytes>>20, m.MemTotalBytes>>20)}
	if f := correlate.PinnedPressure(facts); f != nil {
		c.Findings = []correlate.Finding{*f}
	}
	return c
}

func (d *diagnosis) congestionCheck(w *window) Check {
	if w.congestion == nil {
		return skipf(hostScope, "RDMA congestion", "no RDMA port in %s/class/infiniband", d.cfg.SysRoot)
	}
	w.sample.mu.Lock()
	lat := halfLatencies(w.sample.rdmas, w.start, d.cfg.Sample)
	w.sample.mu.Unlock()
	return w.congestion.check(lat)
}

// window is what a live probe window saw.
type window struct {
	start      uint64 // CLOCK_MONOTONIC ns when it opened
	congestion *congestionProbe
	sample     *sample
	mu         sync.Mutex
	pools      map[int][]placement
	pinned     map[uint32]uint64
}

// placement is where one pool's pages were found.
type placement struct {
	start, size uint64
	pages       map[int]uint64
	source      string
	err         error
}

func (w *window) placements(pid int) []placement {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.pools[pid]
}

func (w *window) pinnedBytes() map[uint32]uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[uint32]uint64{}
	for pid, b := range w.pinned {
		out[pid] = b
	}
	return out
}

// poolQueue bounds the placements waiting for move_pages; past it, pools are
// counted as not located rather than blocking the probe reader.
const poolQueue = 1024

// sample runs the probes for the window. Pools are located the moment they
// are registered, while their process is alive, by a worker so the reader
// never blocks.
func (d *diagnosis) sample(ctx context.Context) (*window, error) {
	w := &window{sample: newSample(), pools: map[int][]placement{}, pinned: map[uint32]uint64{}}
	type pool struct {
		pid         int
		start, size uint64
	}
	queue := make(chan pool, poolQueue)
	var dropped int
	var workers sync.WaitGroup
	workers.Add(1)
	go func() {
		defer workers.Done()
		for p := range queue {
			pn, err := collectors.RangeNodes(p.pid, p.start, p.start+p.size, 0)
			src := "move_pages"
			if err == nil && pn.Sampled() {
				src = fmt.Sprintf("move_pages, every %d pages", pn.Stride)
			}
			w.mu.Lock()
			w.pools[p.pid] = append(w.pools[p.pid], placement{start: p.start, size: p.size, pages: pn.ByNode, source: src, err: err})
			w.pinned[uint32(p.pid)] += p.size
			w.mu.Unlock()
		}
	}()
	queued := map[pool]bool{} // touched only by the reader goroutine
	onCall := func(c *event.Call) {
		if (c.Op != event.OpHostRegister && c.Op != event.OpHostAlloc) || c.Ret != 0 || c.Size == 0 {
			return
		}
		// cudaHostRegister calls cuMemHostRegister_v2: locate the range once.
		key := pool{int(c.PID), c.Ptr, c.Size}
		if queued[key] {
			return
		}
		queued[key] = true
		select {
		case queue <- pool{int(c.PID), c.Ptr, c.Size}:
		default:
			dropped++
		}
	}
	ready := make(chan struct{})
	ag, err := New(Config{ProcRoot: d.cfg.ProcRoot, PIDs: d.cfg.PIDs, Libs: d.cfg.Libs, Sink: w.sample, Logger: d.cfg.Logger,
		OnCall: onCall, OnReady: func() { close(ready) }})
	if err != nil {
		close(queue)
		return nil, fmt.Errorf("start probes: %w", err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- ag.Run(runCtx) }()
	cp, err := newCongestionProbe(d.cfg.SysRoot)
	if err != nil {
		d.cfg.Logger.Warn("RDMA counters unreadable", "err", err)
	}
	w.congestion = cp
	select {
	case <-ready:
		w.start = monotonicNow()
		if cp != nil {
			cp.sample(0)
		}
		if d.cfg.OnSampleStart != nil {
			d.cfg.OnSampleStart()
		}
		for half := 1; half <= 2; half++ {
			select {
			case <-time.After(d.cfg.Sample / 2):
			case <-ctx.Done():
			}
			if cp != nil {
				cp.sample(half)
			}
		}
	case err := <-done:
		stop()
		close(queue)
		return nil, fmt.Errorf("probes: %w", err)
	}
	stop()
	runErr := <-done
	close(queue)
	workers.Wait()
	if dropped > 0 {
		d.cfg.Logger.Warn("pools not located: queue full", "count", dropped)
	}
	return w, runErr
}

// busiestNode is the node holding most of the pages, -1 for none.
func busiestNode(pages map[int]uint64) int {
	best := -1
	for _, n := range sortedKeys(pages) {
		if best < 0 || pages[n] > pages[best] {
			best = n
		}
	}
	return best
}

func nodesText(pages map[int]uint64) string {
	nodes := sortedKeys(pages)
	parts := make([]string, len(nodes))
	for i, n := range nodes {
		parts[i] = fmt.Sprintf("N%d=%d", n, pages[n])
	}
	if len(parts) == 0 {
		return "no resident pages"
	}
	return strings.Join(parts, " ")
}

func sortedKeys[K int | string, V any](m map[K]V) []K {
	out := make([]K, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}
