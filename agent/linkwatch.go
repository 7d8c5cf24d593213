package agent

import (
	"log/slog"
	"sync"
	"time"

	"github.com/lanewatch/lanewatch/checks"
	"github.com/lanewatch/lanewatch/collectors"
	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/topology"
)

// LinkWatch keeps, per GPU, the link state read while the link carried
// traffic, for link-degraded (docs/design.md 1.2, "degraded link"). GPUs
// lower their link's speed and width when idle, so a state read at an idle
// moment says nothing; and a window's average rate does not say the link
// was busy at the moment of the read (a burst early in the window, idle at
// its end). So a read counts as under load only when the counters moved at
// least correlate.LinkBusyBps on both sides of it: between the reading
// before and this one, and between this one and the next, each at most
// maxGap apart. A rate-only source (NVML's throughput, measured over 20 ms
// at the read) says it directly.
//
// Per GPU it keeps the best such read since the last Take: a degraded link
// never reaches its maximum under load, while a healthy one that trained
// down between bursts reaches it in some read. Feed it every counter
// reading in time order (Add); it is safe for concurrent use.
type LinkWatch struct {
	maxGap time.Duration

	mu        sync.Mutex
	prev, cur *collectors.GPUSnapshot
	best      map[string]checks.LinkLoad // by PCI address, sysfs form
	max       map[string]float64         // the latest reading's max per-direction capacity, GB/s
}

// NewLinkWatch judges reads whose neighbours are at most maxGap away.
func NewLinkWatch(maxGap time.Duration) *LinkWatch {
	return &LinkWatch{maxGap: maxGap, best: map[string]checks.LinkLoad{}, max: map[string]float64{}}
}

// Add takes the next counter reading. One less than a tenth of maxGap
// after the previous is dropped (a rate over a few milliseconds says more
// about when the counters tick than about the link), and so is one older
// than the previous (readers racing).
func (w *LinkWatch) Add(s collectors.GPUSnapshot) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.cur != nil && s.Time.Sub(w.cur.Time) < w.maxGap/10 {
		return
	}
	for _, g := range s.GPUs {
		if gbs := g.MaxLinkBps() / 1e9; gbs > 0 {
			w.max[g.BusID] = gbs
		}
		if g.HasPCIeRate && !g.HasPCIeBytes {
			w.consider(g, g.PCIeTxBps+g.PCIeRxBps, s.Source)
		}
	}
	if w.prev != nil && w.cur != nil && w.close(*w.prev, *w.cur) && w.close(*w.cur, s) {
		before, after := rateByBus(*w.prev, *w.cur), rateByBus(*w.cur, s)
		for _, g := range w.cur.GPUs {
			b, ok1 := before[g.BusID]
			a, ok2 := after[g.BusID]
			if g.HasPCIeBytes && ok1 && ok2 {
				w.consider(g, min(b, a), w.cur.Source)
			}
		}
	}
	w.prev, w.cur = w.cur, &s
}

// close reports whether two readings are near enough for a rate between
// them to say the link was busy at either.
func (w *LinkWatch) close(a, b collectors.GPUSnapshot) bool {
	d := b.Time.Sub(a.Time)
	return d > 0 && d <= w.maxGap
}

// rateByBus is each GPU's total rate (both directions) between two
// readings; a counter that went backwards gives none.
func rateByBus(a, b collectors.GPUSnapshot) map[string]float64 {
	out := map[string]float64{}
	rates, _ := collectors.GPURates(a, b)
	for _, r := range rates {
		if len(r.Resets) == 0 {
			out[r.BusID] = r.TxBps + r.RxBps
		}
	}
	return out
}

func (w *LinkWatch) consider(g collectors.GPUReading, bps float64, source string) {
	if bps < correlate.LinkBusyBps || g.LinkGen == 0 || g.LinkWidth == 0 {
		return
	}
	ld := checks.LinkLoad{GTs: topology.GenGTs(g.LinkGen), Width: g.LinkWidth, Bps: bps, Source: source,
		MaxGTs: topology.GenGTs(g.MaxLinkGen), MaxWidth: g.MaxLinkWidth}
	if cur, ok := w.best[g.BusID]; !ok || ld.GBs() > cur.GBs() || (ld.GBs() == cur.GBs() && ld.Bps > cur.Bps) {
		w.best[g.BusID] = ld
	}
}

// Take returns the best read under load of each GPU since the last Take
// and starts over: a GPU without traffic since is not judged again until
// it has some.
func (w *LinkWatch) Take() map[string]checks.LinkLoad {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := w.best
	w.best = map[string]checks.LinkLoad{}
	return out
}

// MaxGBs is a GPU's per-direction capacity by the counters' maximum
// generation and width (what the device and system support), from the
// latest reading; 0 unknown. The capacity of a GPU sysfs does not show.
func (w *LinkWatch) MaxGBs(gpu string) float64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.max[gpu]
}

// WatchLinks returns counters that give w every reading they return:
// whoever reads them (the evaluator every counter interval, the metrics'
// scrapes) feeds w.
func WatchLinks(c collectors.GPUCounters, w *LinkWatch) collectors.GPUCounters {
	return watchedCounters{c, w}
}

type watchedCounters struct {
	collectors.GPUCounters
	w *LinkWatch
}

func (c watchedCounters) Sample() (collectors.GPUSnapshot, error) {
	s, err := c.GPUCounters.Sample()
	if err == nil {
		c.w.Add(s)
	}
	return s, err
}

// LaneCapacity is the per-direction capacity in GB/s of a GPU link's lanes,
// for the evaluator's lane judgements (EvaluatorConfig.LinkCapacity): the
// host's, the trained maximum sysfs shows (checks.Host.LaneCapacity), else
// the counters' maximum generation and width (w; a GPU sysfs does not
// show); 0 unknown. Either may be nil.
func LaneCapacity(host *checks.Host, w *LinkWatch) func(gpu string) float64 {
	return func(gpu string) float64 {
		if host != nil {
			if gbs, _ := host.LaneCapacity(gpu); gbs > 0 {
				return gbs
			}
		}
		if w != nil {
			return w.MaxGBs(gpu)
		}
		return 0
	}
}

// capacityHost is the host whose sysfs gives lane capacities (a link's
// trained maximum, docs/design.md 1.1); nil, said once, when it cannot be
// read: the GPU counters' maxima are then the only ones.
func capacityHost(procRoot, sysRoot string, log *slog.Logger) *checks.Host {
	host, err := checks.ReadHost(procRoot, sysRoot, "")
	if err != nil {
		log.Warn("link capacities unknown from sysfs: only the GPU counters' maxima are", "err", err)
		return nil
	}
	return host
}
