package judge

import (
	"fmt"

	"github.com/lanewatch/lanewatch/checks"
	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/exporters"
)

// Compute overlap (docs/design.md, "Compute overlap"): the engine's
// launches, host waits and event records reach the evaluator's window
// beside the transfers; each window judges every process's load streams
// against its compute (checks.ComputeCheck).

// Activity adds an engine activity to the current window. It implements
// correlate.ActivitySink.
func (e *Evaluator) Activity(a *correlate.Activity) { e.cur.Activity(a) }

// judgeCompute adds each process's compute-overlap check and findings to v.
func judgeCompute(v *Verdict, win *checks.Window) {
	for _, pid := range win.ComputePIDs() {
		r := win.Compute(pid)
		c := checks.ComputeCheck(fmt.Sprintf("pid %d", pid), r)
		v.Checks = append(v.Checks, c)
		v.Findings = append(v.Findings, c.Findings...)
		v.Compute = append(v.Compute, r)
	}
}

// ComputeSeries sums a verdict's load streams per GPU (those whose
// overlap is known) and its host waits per API.
func ComputeSeries(v Verdict) ([]exporters.ComputeGPU, []exporters.HostWait) {
	gpus := map[string]*exporters.ComputeGPU{}
	waits := map[string]*exporters.HostWait{}
	var gout []exporters.ComputeGPU
	var wout []exporters.HostWait
	for _, r := range v.Compute {
		for _, s := range r.Streams {
			if r.Unknown != "" || s.BusyNs == 0 {
				continue
			}
			g := gpus[s.GPU]
			if g == nil {
				g = &exporters.ComputeGPU{GPU: s.GPU}
				gpus[s.GPU] = g
			}
			g.BusyNs += s.BusyNs
			g.OverlapNs += s.OverlapNs
		}
		for _, h := range r.Waits {
			w := waits[h.API]
			if w == nil {
				w = &exporters.HostWait{API: h.API}
				waits[h.API] = w
			}
			w.Count += uint64(h.Count)
			w.Ns += h.Ns
		}
	}
	for _, g := range gpus {
		gout = append(gout, *g)
	}
	for _, w := range waits {
		wout = append(wout, *w)
	}
	return gout, wout
}
