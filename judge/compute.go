package judge

import (
	"maps"
	"slices"

	"github.com/lanewatch/lanewatch/checks"
	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/exporters"
	"github.com/prometheus/client_golang/prometheus"
)

// Compute overlap (docs/design.md, "Compute overlap"): the engine's
// launches, host waits and event records reach the window beside the
// transfers; each window judges every process's load streams against its
// compute (serialized-load, host-sync-in-loop; checks.ComputeCheck).

var _ = register(computeRule{})

type computeRule struct{}

func (computeRule) Check() string    { return checks.CheckComputeOverlap }
func (computeRule) Raises() []string { return []string{"serialized-load", "host-sync-in-loop"} }
func (computeRule) Unsampled() string {
	return "needs a live window (--sample): copies, launches and host waits are judged by when they ran"
}

func (computeRule) Judge(w *Window, env *Env) (j Judgement) {
	var reports []correlate.ComputeReport
	for _, pid := range env.pids(w.ComputePIDs()) {
		r := w.Compute(pid)
		j.Checks = append(j.Checks, checks.ComputeCheck(env.scope(pid), r))
		reports = append(reports, r)
	}
	j.Series = computeSeries(reports)
	return j
}

var (
	descComputeOverlap = exporters.NewDesc("lanewatch_copy_compute_overlap_ratio",
		"Share of the H2D load streams' copy time during the last window that kernels on the GPU's other streams could have overlapped: an upper bound (kernels are bounded from launch to the completion a host wait proved), so near 0 proves the loads ran beside no compute. Absent when unknown (kernel launches not probed, no launch or no completed load in the window).",
		prometheus.GaugeValue, "gpu")
	descHostWait = exporters.NewDesc("lanewatch_host_wait_seconds_total",
		"Time host threads spent blocked in GPU waits, by API: stream, event and device synchronisations and element reads (blocking D2H copies of at most 32 bytes, the .item() shape).",
		prometheus.CounterValue, "api")
	descHostWaits = exporters.NewDesc("lanewatch_host_waits_total",
		"GPU waits host threads made, by API (see lanewatch_host_wait_seconds_total).",
		prometheus.CounterValue, "api")
)

func (computeRule) Descs() []exporters.Desc {
	return []exporters.Desc{descComputeOverlap, descHostWait, descHostWaits}
}

// computeSeries is each GPU's load streams' overlap ratio (those whose
// overlap is known) and the window's host waits per API.
func computeSeries(reports []correlate.ComputeReport) []exporters.Sample {
	type load struct{ busy, overlap uint64 }
	type wait struct {
		count uint64
		ns    uint64
	}
	gpus := map[string]*load{}
	waits := map[string]*wait{}
	for _, r := range reports {
		for _, s := range r.Streams {
			if r.Unknown != "" || s.BusyNs == 0 {
				continue
			}
			gpu := s.GPU
			if gpu == "" {
				gpu = "unknown"
			}
			if gpus[gpu] == nil {
				gpus[gpu] = &load{}
			}
			gpus[gpu].busy += s.BusyNs
			gpus[gpu].overlap += s.OverlapNs
		}
		for _, h := range r.Waits {
			if waits[h.API] == nil {
				waits[h.API] = &wait{}
			}
			waits[h.API].count += uint64(h.Count)
			waits[h.API].ns += h.Ns
		}
	}
	var out []exporters.Sample
	for _, gpu := range slices.Sorted(maps.Keys(gpus)) {
		g := gpus[gpu]
		out = append(out, exporters.Sample{Desc: descComputeOverlap, Value: float64(g.overlap) / float64(g.busy), Labels: []string{gpu}})
	}
	for _, api := range slices.Sorted(maps.Keys(waits)) {
		w := waits[api]
		out = append(out, exporters.Sample{Desc: descHostWait, Value: float64(w.ns) / 1e9, Labels: []string{api}},
			exporters.Sample{Desc: descHostWaits, Value: float64(w.count), Labels: []string{api}})
	}
	return out
}
