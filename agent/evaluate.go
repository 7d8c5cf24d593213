package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/lanewatch/lanewatch/collectors"
	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/topology"
)

// DefaultEvaluateInterval is how often `agent run` judges its transfers.
const DefaultEvaluateInterval = 10 * time.Second

// Placement is the GPU a process feeds and that GPU link's per-direction
// capacity, in GB/s (0: unknown).
type Placement struct {
	GPU                     string // PCI address, or "ref-<name>" on the reference path; "" unknown
	InboundGBs, OutboundGBs float64
}

// LaneRate is one direction of one GPU's link over a window.
type LaneRate struct {
	GPU       string
	Direction string  // "inbound" (toward the GPU) or "outbound"
	Demand    float64 // bytes per second the probed transfers moved over the window
	Capacity  float64 // bytes per second at the link's trained speed; 0 unknown
	// Measured is what the GPU's counters say crossed the link (DCGM or
	// NVML), and Unattributed the part no probe saw (copy kernels, other
	// processes, a remote peer's GPUDirect writes). HasMeasured is false
	// without counters.
	Measured, Unattributed float64
	HasMeasured            bool
}

// Verdict is the evaluator's judgement of one window.
type Verdict struct {
	At       time.Time
	Window   time.Duration // how long the transfers were collected
	Took     time.Duration // how long judging took
	Findings []correlate.Finding
	Lanes    []LaneRate
}

// EvaluatorConfig tunes an Evaluator.
type EvaluatorConfig struct {
	Interval time.Duration // DefaultEvaluateInterval when zero
	// Place names the GPU of a process; nil or an empty GPU: unknown (the
	// window's overlap check then has no capacity and cannot fire).
	Place func(pid uint32) Placement
	// Publish receives every verdict, on the evaluator's goroutine.
	Publish func(Verdict)
	// GPU counters, read once per window; nil: none on this host.
	GPU collectors.GPUCounters
}

// Evaluator judges the transfers of each interval with the rules diagnose
// applies to its sample window (pageable copies, fragmentation,
// same-direction overlap; agent/sample.go) and publishes the findings that
// are active: a rule stops being active after a window in which it did not
// fire. It is a correlate.Sink; tee it with the other exporters.
type Evaluator struct {
	cfg     EvaluatorConfig
	cur     *sample
	mu      sync.Mutex // guards start and host
	start   time.Time
	prevGPU *collectors.GPUSnapshot
	host    func() []correlate.Finding
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
	if cfg.Place == nil {
		cfg.Place = func(uint32) Placement { return Placement{} }
	}
	if cfg.Publish == nil {
		cfg.Publish = func(Verdict) {}
	}
	return &Evaluator{cfg: cfg, cur: newSample(), start: time.Now()}
}

// Transfer adds a transfer to the current window. It implements correlate.Sink.
func (e *Evaluator) Transfer(t *correlate.Transfer) { e.cur.Transfer(t) }

// Run evaluates every interval until ctx is done.
func (e *Evaluator) Run(ctx context.Context) {
	t := time.NewTicker(e.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			e.cfg.Publish(e.Evaluate(now))
		}
	}
}

// Evaluate closes the current window at now, starts the next and judges
// the closed one.
func (e *Evaluator) Evaluate(now time.Time) Verdict {
	begin := time.Now()
	win := e.cur.rotate()
	e.mu.Lock()
	span := now.Sub(e.start)
	e.start = now
	host := e.host
	e.mu.Unlock()

	v := Verdict{At: now, Window: span}
	type laneKey struct{ gpu, dir string }
	lanes := map[laneKey]*LaneRate{}
	measured := e.measure()
	win.measured = map[string]float64{}
	for k, l := range measured {
		win.measured[k.gpu+"\x00"+k.dir] = l.Measured
	}
	for _, pid := range win.pids() {
		pl := e.cfg.Place(pid)
		for _, c := range win.checks(fmt.Sprintf("pid %d", pid), pid, pl.GPU, pl.InboundGBs) {
			v.Findings = append(v.Findings, c.Findings...)
		}
		if pl.GPU == "" {
			continue
		}
		for dir, gbs := range map[string]float64{laneIn: pl.InboundGBs, laneOut: pl.OutboundGBs} {
			k := laneKey{pl.GPU, dir}
			if lanes[k] == nil {
				lanes[k] = &LaneRate{GPU: pl.GPU, Direction: dir, Capacity: gbs * 1e9}
			}
			if span > 0 {
				lanes[k].Demand += float64(win.laneBytes(pid, dir)) / span.Seconds()
			}
		}
	}
	for k, m := range measured {
		l := lanes[laneKey{k.gpu, k.dir}]
		if l == nil {
			l = &LaneRate{GPU: k.gpu, Direction: k.dir, Capacity: m.Capacity}
			lanes[laneKey{k.gpu, k.dir}] = l
		}
		l.Measured, l.HasMeasured = m.Measured, true
		l.Unattributed = max(0, m.Measured-l.Demand)
		if l.Capacity == 0 {
			l.Capacity = m.Capacity
		}
	}
	for _, l := range lanes {
		v.Lanes = append(v.Lanes, *l)
		if l.HasMeasured && span > 0 {
			f := win.laneFacts(l.GPU, l.Direction, func(pid uint32) string { return e.cfg.Place(pid).GPU }, span)
			f.MeasuredBps, f.CapacityBps = l.Measured, l.Capacity
			if fd := correlate.LinkUnderused(f); fd != nil {
				v.Findings = append(v.Findings, *fd)
			}
		}
	}
	sort.Slice(v.Lanes, func(i, j int) bool {
		if v.Lanes[i].GPU != v.Lanes[j].GPU {
			return v.Lanes[i].GPU < v.Lanes[j].GPU
		}
		return v.Lanes[i].Direction < v.Lanes[j].Direction
	})
	if host != nil {
		v.Findings = append(v.Findings, host()...)
	}
	v.Took = time.Since(begin)
	return v
}

// measure reads the GPU counters and turns them into per-lane rates since
// the previous window.
func (e *Evaluator) measure() map[struct{ gpu, dir string }]LaneRate {
	out := map[struct{ gpu, dir string }]LaneRate{}
	if e.cfg.GPU == nil {
		return out
	}
	snap, err := e.cfg.GPU.Sample()
	if err != nil {
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
		lane, capacity := gpuLane(g), linkBps(g)
		out[struct{ gpu, dir string }{lane, laneIn}] = LaneRate{Measured: r.RxBps, Capacity: capacity}
		out[struct{ gpu, dir string }{lane, laneOut}] = LaneRate{Measured: r.TxBps, Capacity: capacity}
	}
	return out
}

// laneFacts gathers what the probes saw on one lane of one GPU during the
// window: how much of it a transfer was in flight (the union of the flows'
// busy intervals), pageable and small copies.
func (s *sample) laneFacts(gpu, dir string, gpuOf func(uint32) string, span time.Duration) correlate.LaneFacts {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := correlate.LaneFacts{GPU: gpu, Direction: dir}
	var iv [][2]uint64
	for pid, p := range s.procs {
		if gpuOf(pid) != gpu {
			continue
		}
		f.PageableCopies += p.pageable
		f.SmallCopies += p.sizes.CountBelow(64 << 10)
		f.All += p.sizes.Count()
		for k, b := range p.flows {
			if k.dir == dir && b.end > b.start {
				iv = append(iv, [2]uint64{b.start, b.end})
			}
		}
	}
	sort.Slice(iv, func(i, j int) bool { return iv[i][0] < iv[j][0] })
	var busy, curS, curE uint64
	for i, x := range iv {
		switch {
		case i == 0:
			curS, curE = x[0], x[1]
		case x[0] > curE:
			busy += curE - curS
			curS, curE = x[0], x[1]
		default:
			curE = max(curE, x[1])
		}
	}
	if len(iv) > 0 {
		busy += curE - curS
	}
	f.BusyFraction = min(1, float64(busy)/float64(span.Nanoseconds()))
	return f
}

// rotate hands back the window collected so far and starts a new one in s.
func (s *sample) rotate() *sample {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := &sample{procs: s.procs, rdmas: s.rdmas, measured: s.measured}
	s.procs, s.rdmas = map[uint32]*procSample{}, nil
	return old
}

// laneBytes is what moved over one lane of the process's GPU link during
// the window: its own copies and the RDMA requests placed on it.
func (s *sample) laneBytes(pid uint32, dir string) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.procs[pid]
	if p == nil {
		return 0
	}
	var n uint64
	for k, b := range p.flows {
		if k.dir == dir {
			n += b.bytes
		}
	}
	return n
}

// HostPlacement places processes on this host's GPUs the way diagnose does
// (CUDA_VISIBLE_DEVICES, else GPU 0), with the link's trained capacity. On
// a host without GPUs it places processes of the reference data path on
// their reference GPU ("ref-" + LW_REF_GPU, or "ref-private" for a process's
// own lanes) with the lane rates from their environment (refpath/README.md).
func HostPlacement(procRoot, sysRoot string) (func(pid uint32) Placement, error) {
	host, err := topology.Read(sysRoot)
	if err != nil {
		return nil, fmt.Errorf("read topology: %w", err)
	}
	d := &diagnosis{cfg: DiagnoseConfig{ProcRoot: procRoot, SysRoot: sysRoot}, host: host, gpus: host.BDFs(topology.KindGPU)}
	return func(pid uint32) Placement {
		if len(d.gpus) > 0 {
			bdf, _, _ := d.gpuOf(int(pid))
			gbs := 0.0
			if f := host.Functions[bdf]; f != nil {
				gbs = f.Link.CurGBs()
			}
			return Placement{GPU: bdf, InboundGBs: gbs, OutboundGBs: gbs}
		}
		return refPlacement(procRoot, pid)
	}, nil
}

// refPlacement reads a reference-path process's lanes from its environment.
func refPlacement(procRoot string, pid uint32) Placement {
	env, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(int(pid)), "environ"))
	if err != nil {
		return Placement{}
	}
	pl := Placement{GPU: "ref-private", InboundGBs: 4, OutboundGBs: 4} // refpath/driver/init.c defaults
	for _, kv := range strings.Split(string(env), "\x00") {
		k, v, _ := strings.Cut(kv, "=")
		f, ferr := strconv.ParseFloat(v, 64)
		switch {
		case k == "LW_REF_GPU" && v != "":
			pl.GPU = "ref-" + v
		case k == "LW_REF_H2D_GBPS" && ferr == nil && f > 0:
			pl.InboundGBs = f
		case k == "LW_REF_D2H_GBPS" && ferr == nil && f > 0:
			pl.OutboundGBs = f
		}
	}
	return pl
}

// AttachedProbes counts the probe sites attached per file, by path.
func (a *Agent) AttachedProbes() map[string]int {
	out := map[string]int{}
	for _, af := range a.probes.Files() {
		out[af.Path] += len(af.Sites)
	}
	return out
}

// Pending is the number of copies waiting for a proof of completion plus
// the RDMA work requests posted and not yet completed.
func (a *Agent) Pending() int {
	a.engineMu.Lock()
	defer a.engineMu.Unlock()
	return a.engine.Pending() + a.engine.RDMAStats().QueuedRequests
}
