// Package diagnose runs `agent diagnose`: the checklist of seed 000
// ("排查清单") once, in its order — the path (topology, links, IOMMU, NUMA),
// then per process where its pools live and, with a live sample window,
// what its transfers did. The checks themselves are package checks; this
// package orders them and runs the probes for the window.
package diagnose

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/lanewatch/lanewatch/agent"
	"github.com/lanewatch/lanewatch/checks"
	"github.com/lanewatch/lanewatch/collectors"
	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/judge"
	"github.com/lanewatch/lanewatch/probes"
	"github.com/lanewatch/lanewatch/topology"
)

// Config is what `agent diagnose` can be told.
type Config struct {
	ProcRoot, SysRoot string
	PIDs              []int         // targets; empty: every process that maps a CUDA library
	Sample            time.Duration // live probe window; 0: static checks only
	Libs              []string      // also probe these files during the window
	// IBDevices is the RDMA devices the server was given (SGLang
	// --disaggregation-ib-device, checks.ParseIBDevices); checked by far-nic
	// when set.
	IBDevices checks.IBDevices
	PathEnv   string // PATH searched for numactl; empty: this process's PATH
	Logger    *slog.Logger
	// OnSampleStart runs once the probes are attached, when the window opens.
	OnSampleStart func()
	// OnProvider runs once a process's RDMA provider data path is probed
	// (agent.Config.OnProvider).
	OnProvider func(pid uint32)
	// TraceStorageReads traces the storage reads of the traced processes
	// during --sample (checklist item 6, storage-far-pool).
	TraceStorageReads bool
	// StoragePlace places block devices for the storage tracer; nil: sysfs.
	StoragePlace func(name string) topology.BlockPlacement
	// GPU says where the GPU counters read during --sample come from (the
	// zero value: DCGM, else NVML): their link states read under load are
	// what link-degraded judges GPUs by.
	GPU agent.GPUConfig
	// Kernels probes kernel launches during the window: compute overlap
	// (checklist item 3) needs them, and each launch of a traced process
	// costs one entry+return pair while the window lasts. false: item 3's
	// overlap is unknown and SKIPs.
	Kernels bool
}

// Run runs the checklist. An error means diagnose itself could not run.
func Run(ctx context.Context, cfg Config) (*checks.Report, error) {
	if cfg.ProcRoot == "" {
		cfg.ProcRoot = "/proc"
	}
	if cfg.SysRoot == "" {
		cfg.SysRoot = "/sys"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	host, err := checks.ReadHost(cfg.ProcRoot, cfg.SysRoot, cfg.PathEnv)
	if err != nil {
		return nil, err
	}
	var win *window
	if cfg.Sample > 0 {
		win, err = sample(ctx, cfg, host.Env)
		if err != nil {
			return nil, err
		}
	}
	if win != nil {
		host.Loads = win.links // GPU links are judged as read under load
	}
	if win != nil {
		host.Pinned = &checks.PinnedPools{ByProcess: win.pinnedBytes(), Seen: "the processes seen in the window"}
	}
	r := &checks.Report{}
	for _, c := range host.HostChecks(cfg.IBDevices) {
		r.Add(c)
	}
	// The window rules, through the one loop `agent run`'s evaluator
	// judges its windows with (judge.Judge): host- and GPU-scoped checks
	// here, each process's under it below.
	var judged map[string][]checks.Check
	if win != nil {
		judged = map[string][]checks.Check{}
		for _, c := range win.judge(cfg, host, targets(cfg, win)) {
			if c.Scope == checks.HostScope || strings.HasPrefix(c.Scope, "GPU ") {
				r.Add(c)
			} else {
				judged[c.Scope] = append(judged[c.Scope], c)
			}
		}
		r.Add(win.storageCheck(host))
	} else {
		for _, c := range judge.Unsampled() {
			r.Add(c)
		}
		r.Add(checks.Skipped(checks.HostScope, checks.CheckStorage, "throughput is measured over a live window (--sample)"))
	}
	r.Add(checks.GDSCheck(cfg.ProcRoot, cfg.SysRoot, probes.MappedFiles))
	var files probes.UntracedFiles // each mapped file read once for every process
	var untraced []untracedTarget
	for _, pid := range targets(cfg, win) {
		var pools []checks.Pool
		if win != nil {
			pools = win.poolsOf(pid)
		}
		cs := host.ProcessChecks(pid, pools, win != nil)
		for _, c := range cs {
			r.Add(c)
		}
		if len(cs) == 0 || cs[0].Name == "process" {
			continue
		}
		scope := cs[0].Scope
		u := untracedOf(&files, cfg.ProcRoot, pid, scope)
		untraced = append(untraced, u)
		r.Add(u.check())
		for _, c := range judged[scope] {
			r.Add(c)
		}
		delete(judged, scope)
		// The process-wide picture from numa_maps, for the person reading
		// the report: INFO, no finding, so agent run's periodic checks
		// leave it out (docs/design.md, "Pages, not registrations").
		_, gpuNode, why := host.GPUOf(pid)
		r.Add(host.MemoryCheck(scope, pid, gpuNode, why))
	}
	for _, scope := range slices.Sorted(maps.Keys(judged)) { // judged, though not a target
		for _, c := range judged[scope] {
			r.Add(c)
		}
	}
	qualifyRDMA(r, untraced)
	return r, nil
}

// scopeOnce names each process once (its status read from procfs), for
// every rule that reports on it.
func scopeOnce(host *checks.Host) func(pid uint32) string {
	named := map[uint32]string{}
	return func(pid uint32) string {
		s, ok := named[pid]
		if !ok {
			s, _ = host.Scope(int(pid), true)
			named[pid] = s
		}
		return s
	}
}

// judge runs the window rules over the window, each process named as the
// report names it; targets are judged even when the window saw nothing of
// them.
func (w *window) judge(cfg Config, host *checks.Host, targets []int) []checks.Check {
	env := &judge.Env{Span: w.length, Place: checks.PlaceOnce(host.Place), NUMA: host, NICs: host.Topo,
		Capacity: func(gpu string) float64 { gbs, _ := host.LaneCapacity(gpu); return gbs },
		Scope:    scopeOnce(host),
		// counters sampled at the window's start, middle and end: two halves
		Congestion: w.congestion, CongestionSplits: []uint64{w.start + uint64(w.length/2)},
		Storage: host.StorageHost(),
		DiskRates: func() ([]collectors.DiskRate, error) {
			if w.disksErr != nil {
				return nil, w.disksErr
			}
			rates, _ := collectors.DiskRates(w.disks[0], w.disks[1])
			return rates, nil
		}}
	for _, pid := range targets {
		env.Targets = append(env.Targets, uint32(pid))
	}
	if w.congestion == nil {
		env.CongestionUnjudged = "no RDMA port in " + cfg.SysRoot + "/class/infiniband"
	}
	env.StorageReads, env.StorageUnjudged = w.storage, w.storageUnjudged(cfg)
	env.Lanes, _ = judge.LaneRates(w.transfers, env, nil, nil)
	return judge.Judge(w.transfers, env).Checks
}

// targets are the processes to check: the ones named, else every process
// mapping a CUDA library now, plus every process that moved bytes during the
// window.
func targets(cfg Config, win *window) []int {
	if len(cfg.PIDs) > 0 {
		return cfg.PIDs
	}
	set := map[int]bool{}
	for _, pid := range agent.CUDAProcesses(cfg.ProcRoot) {
		set[pid] = true
	}
	if win != nil {
		for _, pid := range win.transfers.PIDs() {
			set[int(pid)] = true
		}
		for _, pid := range win.transfers.OrderingPIDs() {
			set[int(pid)] = true
		}
	}
	return slices.Sorted(maps.Keys(set))
}

// window is what a live probe window saw.
type window struct {
	start      uint64 // CLOCK_MONOTONIC ns when it opened
	length     time.Duration
	congestion *checks.Congestion
	transfers  *judge.Window
	mu         sync.Mutex
	pools      map[int][]checks.Pool
	pinned     map[uint32]uint64
	links      map[string]checks.LinkLoad // GPU link states read under load (watchLinks)
	disks      [2]collectors.DiskSample   // /proc/diskstats at the window's start and end
	storage    []checks.StorageFlow       // the traced processes' storage reads (--trace-storage-reads)
	storageErr error
	disksErr   error
}

func (w *window) poolsOf(pid int) []checks.Pool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.pools[pid]
}

func (w *window) pinnedBytes() map[uint32]uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return maps.Clone(w.pinned)
}

// storageCheck lists block device throughput over the window.
func (w *window) storageCheck(host *checks.Host) checks.Check {
	if w.disksErr != nil {
		return checks.Skipped(checks.HostScope, checks.CheckStorage, "diskstats: %v", w.disksErr)
	}
	rates, reset := collectors.DiskRates(w.disks[0], w.disks[1])
	return host.StorageCheck(rates, reset)
}

// poolQueue bounds the placements waiting for move_pages; past it, pools are
// counted as not located rather than blocking the probe reader.
const poolQueue = 1024

// sample runs the probes for the window. Pools are located the moment they
// are registered, while their process is alive, by a worker so the reader
// never blocks. Environments are read through env (the host's).
func sample(ctx context.Context, cfg Config, env *collectors.EnvCache) (*window, error) {
	w := &window{length: cfg.Sample, transfers: judge.NewWindow(cfg.Kernels), pools: map[int][]checks.Pool{}, pinned: map[uint32]uint64{}}
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
			w.pools[p.pid] = append(w.pools[p.pid], checks.Pool{Start: p.start, Size: p.size, PagesByNode: pn.ByNode, Source: src, Err: err})
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
		case queue <- key:
		default:
			dropped++
		}
	}
	var storage *agent.StorageReads
	if cfg.TraceStorageReads {
		storage, w.storageErr = agent.NewStorageReads(agent.StorageConfig{ProcRoot: cfg.ProcRoot, SysRoot: cfg.SysRoot,
			Place: cfg.StoragePlace, Logger: cfg.Logger})
		if storage != nil {
			defer func() { w.storage = storage.Flows(); storage.Close() }()
		}
	}
	ag, err := agent.Start(ctx, agent.Config{ProcRoot: cfg.ProcRoot, PIDs: cfg.PIDs, Libs: cfg.Libs, Sink: w.transfers, Logger: cfg.Logger,
		Activity: w.transfers, Lost: w.transfers.Lost, Kernels: cfg.Kernels, Storage: storage, OnCall: onCall, OnProvider: cfg.OnProvider,
		// each copy's GPU (docs/design.md, "Which GPU"), from sysfs
		Devices: agent.HostDeviceMap(env, cfg.SysRoot, nil, cfg.Logger)}, 0)
	if err != nil {
		close(queue)
		return nil, fmt.Errorf("start probes: %w", err)
	}
	cong, err := checks.NewCongestion(checks.CongestionConfig{ProcRoot: cfg.ProcRoot, SysRoot: cfg.SysRoot})
	if err != nil {
		cfg.Logger.Warn("RDMA counters unreadable", "err", err)
	}
	w.congestion = cong
	// The GPU counters, if any, read through the window: link-degraded
	// judges a GPU's link as read under load.
	stopLinks := watchLinks(cfg.GPU)
	defer func() { w.links = stopLinks() }()
	w.start = event.Now()
	if cong != nil {
		cong.Sample()
	}
	w.disks[0], w.disksErr = collectors.ReadDiskstats(cfg.ProcRoot)
	if cfg.OnSampleStart != nil {
		cfg.OnSampleStart()
	}
	for half := 1; half <= 2; half++ {
		select {
		case <-time.After(cfg.Sample / 2):
		case <-ctx.Done():
		}
		if cong != nil {
			cong.Sample()
		}
	}
	if w.disksErr == nil {
		w.disks[1], w.disksErr = collectors.ReadDiskstats(cfg.ProcRoot)
	}
	runErr := ag.Stop()
	if d := ag.Stats().Drops.Total(); d > 0 {
		w.transfers.Dropped(d) // the probes ran for this window: every drop is its
	}
	close(queue)
	workers.Wait()
	if dropped > 0 {
		cfg.Logger.Warn("pools not located: queue full", "count", dropped)
	}
	return w, runErr
}
