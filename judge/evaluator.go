// Package judge judges windows of transfers: the evaluator that closes
// `agent run`'s windows, and the window rules it and `agent diagnose
// --sample` run.
package judge

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/lanewatch/lanewatch/checks"
	"github.com/lanewatch/lanewatch/collectors"
	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/exporters"
	"github.com/lanewatch/lanewatch/topology"
)

// DefaultEvaluateInterval is how often `agent run` judges its transfers.
const DefaultEvaluateInterval = 10 * time.Second

// LaneRate is one direction of one GPU's link over a window.
type LaneRate struct {
	GPU       string
	Direction string  // checks.Inbound (toward the GPU) or checks.Outbound
	Demand    float64 // bytes per second the probed transfers moved over the window
	Capacity  float64 // bytes per second at the link's trained speed; 0 unknown
	// Measured is what the GPU's counters say crossed the link (DCGM or
	// NVML), and Unattributed the part no probe saw (copy kernels, other
	// processes, a remote peer's GPUDirect writes). HasMeasured is false
	// without counters.
	Measured, Unattributed float64
	HasMeasured            bool
	// Running is the link's per-direction rate at the speed and width the
	// counters' closing reading showed it at, bytes per second; 0 unknown.
	Running float64
	// SMTransfers counts the KV-transfer kernels launched on the GPU in
	// the window (transfers moved by SMs, docs/design.md "Kernel movers"):
	// their bytes are in Unattributed, on whichever lane they crossed —
	// neither a kernel's name nor its launch says which, so both lanes of
	// the GPU carry the count.
	SMTransfers int
}

// Verdict is the evaluator's judgement of one window.
type Verdict struct {
	At       time.Time
	Window   time.Duration // how long the transfers were collected
	Took     time.Duration // how long judging took
	Findings []correlate.Finding
	// Checks are the window's checks of every process that transferred,
	// SKIPs with their reasons included (e.g. a process whose GPU is unknown
	// gets no overlap judgement and no lane).
	Checks []checks.Check
	Lanes  []LaneRate
	// Peers are the window's peer copies (D2D between two GPUs) per pair
	// and path: only PCIe ones are lane demand (out of Src, into Dst);
	// NVLink ones cross no PCIe lane, and unknown ones are put on none.
	Peers []PeerRate
	// Series are the rules' metric series for the window
	// (exporters.Metrics.SetRuleSeries).
	Series []exporters.Sample
	// Losses are the events the window lost: the checks that rest on
	// them say so (checks.Check.Incomplete).
	Losses Losses
}

// PeerRate is the rate of the peer copies from one GPU to another over a
// window, and the path the topology says they took (checks.Path*).
type PeerRate struct {
	Src, Dst, Path string
	Bps            float64
}

// EvaluatorConfig tunes an Evaluator.
type EvaluatorConfig struct {
	Interval time.Duration // DefaultEvaluateInterval when zero
	// Congestion samples the RDMA port counters when the evaluator starts
	// and at every evaluation, and judges rdma-congestion per port and
	// queue pair over each window (checks.Congestion); nil: no RDMA port.
	Congestion *checks.Congestion
	// Place names the GPU of a process and its link's capacity; nil, or a
	// Placement without a GPU: unknown, and the lane judgements SKIP.
	Place func(pid uint32) checks.Placement
	// NUMA gives a GPU's NUMA node (sysfs numa_node, -1 unknown) and where
	// nodes sit from each other (their CPU packages); nil: every node
	// unknown, and remote-numa-pool is not judged on the pages the copies
	// read (checks.Window.PagesCheck), storage-far-pool says the socket is
	// unknown.
	NUMA checks.NUMAPlace
	// NICs places the host's RDMA devices from each GPU (*topology.Host);
	// nil: unknown, and kv-transfer-tcp-fallback and kv-transfer-far-device
	// are not judged.
	NICs NICPlace
	// Publish receives every verdict, on the evaluator's goroutine.
	Publish func(Verdict)
	// GPU counters; nil: none on this host. They are read every
	// CounterInterval (1 s when zero, at most Interval), so the overlap
	// rule can take the link's rate while flows contended rather than the
	// window's average (correlate.SameDirectionOverlap).
	GPU             collectors.GPUCounters
	CounterInterval time.Duration
	// LinkCapacity is the per-direction capacity in GB/s of a GPU link no
	// placed process names (a transfer's own GPU), 0 unknown; nil: only
	// the placements' capacities are known.
	LinkCapacity func(gpu string) float64
	// GPUPath says how two GPUs (PCI addresses) exchange peer copies,
	// checks.PathNVLink or checks.PathPCIe; ok false, or nil: unknown, and
	// those copies are on no lane.
	GPUPath func(src, dst string) (string, bool)
	// Storage is the storage reads of the traced processes
	// (--trace-storage-reads): checklist item 6 and storage-far-pool per
	// window; nil: not judged. Disks reads the block devices for item 7
	// (storage-shared-uplink); nil: not judged.
	Storage StorageFlows
	Disks   *DiskWindow
	// Now is CLOCK_MONOTONIC in ns, the probes' clock (event.Now when nil),
	// to stamp the counter samples on the transfers' time line.
	Now func() uint64
	// Kernels: kernel launches are probed (Config.Kernels); without them
	// compute overlap is unknown and its rules SKIP.
	Kernels bool
	// Drops is the probes' count of events lost or truncated since they
	// loaded (every reason of lanewatch_probe_dropped_events_total): read
	// as each window closes, the count since the previous close is the
	// window's (Losses.Events), whose processes are unknown. nil: only
	// the events that say so (Lost) make a window lossy.
	Drops func() (uint64, error)
	// Shed is the copies each process had shed since the probes loaded
	// (probes.Flow.Shed): read as each window closes, a process whose
	// count rose has its checks said incomplete. nil: none.
	Shed func() (map[uint32]uint64, error)
}

// Evaluator judges the transfers of each interval with every registered
// window rule (Judge, as diagnose judges its sample window) and publishes
// the findings that are active: a rule stops being active after a window
// in which it did not fire. It is a correlate.Sink and a
// correlate.ActivitySink; tee it with the other exporters.
type Evaluator struct {
	cfg     EvaluatorConfig
	cur     *Window
	mu      sync.Mutex // guards start and host
	start   time.Time
	prevGPU *collectors.GPUSnapshot
	host    func() []correlate.Finding
	// lastCounters is the latest counter reading and when it was taken
	// (CLOCK_MONOTONIC ns): each reading adds the rate since it to the
	// current window.
	lastCounters   *collectors.GPUSnapshot
	lastCountersAt uint64
	drops          uint64            // the latest reading of cfg.Drops
	shed           map[uint32]uint64 // the latest reading of cfg.Shed
}

// SetHostFindings adds the host-level findings (Agent.HostJudge) to every
// verdict from now on.
func (e *Evaluator) SetHostFindings(f func() []correlate.Finding) {
	e.mu.Lock()
	e.host = f
	e.mu.Unlock()
}

// NewEvaluator returns an evaluator whose first window starts now.
func NewEvaluator(cfg EvaluatorConfig) *Evaluator {
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultEvaluateInterval
	}
	if cfg.Congestion != nil {
		cfg.Congestion.Sample() // the first window's start
	}
	if cfg.Place == nil {
		cfg.Place = func(pid uint32) checks.Placement {
			return checks.Placement{Why: fmt.Sprintf("GPU of pid %d unknown: no placement configured", pid)}
		}
	}
	if cfg.Publish == nil {
		cfg.Publish = func(Verdict) {}
	}
	if cfg.CounterInterval <= 0 {
		cfg.CounterInterval = time.Second
	}
	cfg.CounterInterval = min(cfg.CounterInterval, cfg.Interval)
	if cfg.Now == nil {
		cfg.Now = event.Now
	}
	e := &Evaluator{cfg: cfg, cur: NewWindow(cfg.Kernels), start: time.Now()}
	e.dropsSince() // the first window's start
	e.shedSince()
	return e
}

// Transfer adds a transfer to the current window. It implements correlate.Sink.
func (e *Evaluator) Transfer(t *correlate.Transfer) { e.cur.Transfer(t) }

// Activity adds an engine activity (a launch, a host wait, an event
// record) to the current window. It implements correlate.ActivitySink.
func (e *Evaluator) Activity(a *correlate.Activity) { e.cur.Activity(a) }

// Run evaluates every interval until ctx is done.
func (e *Evaluator) Run(ctx context.Context) {
	t := time.NewTicker(e.cfg.Interval)
	defer t.Stop()
	var counters <-chan time.Time
	if e.cfg.GPU != nil {
		c := time.NewTicker(e.cfg.CounterInterval)
		defer c.Stop()
		counters = c.C
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-counters:
			e.SampleCounters()
		case now := <-t.C:
			e.cfg.Publish(e.Evaluate(now))
		}
	}
}

// SampleCounters reads the GPU counters once and adds each lane's rate
// since the previous reading to the current window, stamped with the
// CLOCK_MONOTONIC interval it covers; it returns the reading (false:
// none). Run calls it every CounterInterval, and Evaluate once before it
// closes a window; calls must not run concurrently with those.
func (e *Evaluator) SampleCounters() (collectors.GPUSnapshot, bool) {
	if e.cfg.GPU == nil {
		return collectors.GPUSnapshot{}, false
	}
	before := e.cfg.Now()
	snap, err := e.cfg.GPU.Sample()
	after := e.cfg.Now()
	if err != nil {
		return snap, false
	}
	at := before + (after-before)/2
	if e.lastCounters != nil && at > e.lastCountersAt {
		rates, _ := collectors.GPURates(*e.lastCounters, snap)
		for _, r := range rates {
			e.cur.AddCounterSample(r.BusID, checks.Inbound, e.lastCountersAt, at, r.RxBps)
			e.cur.AddCounterSample(r.BusID, checks.Outbound, e.lastCountersAt, at, r.TxBps)
		}
	}
	e.lastCounters, e.lastCountersAt = &snap, at
	return snap, true
}

type laneKey struct{ gpu, dir string }

// Evaluate closes the current window at now, starts the next and judges
// the closed one with every registered rule (Judge).
func (e *Evaluator) Evaluate(now time.Time) Verdict {
	begin := time.Now()
	snap, read := e.SampleCounters() // the window's last counter samples, before it closes
	win := e.cur.Rotate()
	if n := e.dropsSince(); n > 0 {
		win.Dropped(n)
	}
	win.Shed(e.shedSince())
	e.mu.Lock()
	span := now.Sub(e.start)
	e.start = now
	host := e.host
	e.mu.Unlock()

	v := Verdict{At: now, Window: span}
	place := checks.PlaceOnce(e.cfg.Place) // placing reads a process's environment: once per window
	env := &Env{Span: span, Place: place, NUMA: e.cfg.NUMA, NICs: e.cfg.NICs, Capacity: func(gpu string) float64 {
		if e.cfg.LinkCapacity == nil {
			return 0
		}
		return e.cfg.LinkCapacity(gpu)
	}}
	v.Lanes, v.Peers = LaneRates(win, env, e.cfg.GPUPath, e.measure(snap, read))
	env.Lanes = v.Lanes
	env.Congestion = e.cfg.Congestion // rdma-congestion: sampled as the window is judged
	if e.cfg.Storage != nil {
		env.StorageReads = e.cfg.Storage.Flows()
	}
	if d := e.cfg.Disks; d != nil {
		env.DiskRates, env.Storage = d.Rates, d.host
	}
	j := Judge(win, env)
	v.Checks, v.Findings, v.Series, v.Losses = j.Checks, j.Findings(), j.Series, win.Losses()
	if host != nil {
		v.Findings = append(v.Findings, host()...)
	}
	v.Took = time.Since(begin)
	return v
}

// LaneRates are the window's rates on each lane of each GPU link: the
// demand of its transfers (every copy on the link of the GPU it names, else
// its process's placement: docs/design.md, "Which GPU"), the capacity,
// and what the counters measured (measured, keyed by lane); and its peer
// copies per pair of GPUs and path (gpuPath; nil: every path unknown).
func LaneRates(win *Window, env *Env, gpuPath func(src, dst string) (string, bool), measured map[laneKey]LaneRate) ([]LaneRate, []PeerRate) {
	lanes := map[laneKey]*LaneRate{}
	for _, pid := range win.PIDs() {
		pl := env.Place(pid)
		if pl.GPU == "" {
			continue // no lane the host did not show
		}
		for dir, gbs := range map[string]float64{checks.Inbound: pl.InboundGBs, checks.Outbound: pl.OutboundGBs} {
			k := laneKey{pl.GPU, dir}
			if lanes[k] == nil {
				lanes[k] = &LaneRate{GPU: pl.GPU, Direction: dir, Capacity: gbs * 1e9}
			}
		}
	}
	lane := func(gpu, dir string) *LaneRate {
		l := lanes[laneKey{gpu, dir}]
		if l == nil {
			l = &LaneRate{GPU: gpu, Direction: dir, Capacity: env.Capacity(gpu) * 1e9}
			lanes[laneKey{gpu, dir}] = l
		}
		return l
	}
	rate := func(b uint64) float64 {
		if env.Span <= 0 {
			return 0
		}
		return float64(b) / env.Span.Seconds()
	}
	for k, b := range win.LinkBytes(env.Place) {
		lane(k[0], k[1]).Demand += rate(b)
	}
	// Peer copies: PCIe ones leave the source's link and enter the
	// destination's; NVLink ones cross no PCIe lane; unknown ones are on
	// none, never guessed onto one.
	var peers []PeerRate
	for _, f := range win.PeerBytes(gpuPath) {
		peers = append(peers, PeerRate{Src: f.Src, Dst: f.Dst, Path: f.Path, Bps: rate(f.Bytes)})
		if f.Path == checks.PathPCIe {
			lane(f.Src, checks.Outbound).Demand += rate(f.Bytes)
			lane(f.Dst, checks.Inbound).Demand += rate(f.Bytes)
		}
	}
	for gpu, n := range win.SMTransfers() {
		if gpu == "" {
			continue // no GPU the thread's context calls showed
		}
		for _, dir := range []string{checks.Inbound, checks.Outbound} {
			lane(gpu, dir).SMTransfers = n
		}
	}
	for k, m := range measured {
		l := lanes[k]
		if l == nil {
			l = &LaneRate{GPU: k.gpu, Direction: k.dir, Capacity: m.Capacity}
			lanes[k] = l
		}
		l.Measured, l.HasMeasured, l.Running = m.Measured, true, m.Running
		l.Unattributed = max(0, m.Measured-l.Demand)
		if l.Capacity == 0 {
			l.Capacity = m.Capacity
		}
	}
	out := make([]LaneRate, 0, len(lanes))
	for _, l := range lanes {
		out = append(out, *l)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].GPU != out[j].GPU {
			return out[i].GPU < out[j].GPU
		}
		return out[i].Direction < out[j].Direction
	})
	return out, peers
}

// measure turns the counter reading that closes a window (read: there is
// one) into per-lane rates since the one that closed the previous window.
func (e *Evaluator) measure(snap collectors.GPUSnapshot, read bool) map[laneKey]LaneRate {
	out := map[laneKey]LaneRate{}
	if !read {
		return out
	}
	prev := e.prevGPU
	e.prevGPU = &snap
	if prev == nil {
		return out
	}
	rates, _ := collectors.GPURates(*prev, snap)
	byKey := map[string]collectors.GPUReading{}
	for _, g := range snap.GPUs {
		byKey[g.BusID] = g
	}
	for _, r := range rates {
		g := byKey[r.BusID]
		capacity, running := g.MaxLinkBps(), topology.LinkGBs(topology.GenGTs(g.LinkGen), g.LinkWidth)*1e9
		out[laneKey{r.BusID, checks.Inbound}] = LaneRate{Measured: r.RxBps, Capacity: capacity, Running: running}
		out[laneKey{r.BusID, checks.Outbound}] = LaneRate{Measured: r.TxBps, Capacity: capacity, Running: running}
	}
	return out
}
