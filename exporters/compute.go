package exporters

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Compute overlap (docs/design.md, "Compute overlap"): the share of each
// GPU's load-stream copy time that compute could overlap in the last
// window, and the host's time blocked in waits, by API.

var (
	descComputeOverlap = prometheus.NewDesc("lanewatch_copy_compute_overlap_ratio",
		"Share of the H2D load streams' copy time during the last window that kernels on the GPU's other streams could have overlapped: an upper bound (kernels are bounded from launch to the completion a host wait proved), so near 0 proves the loads ran beside no compute. Absent when unknown (kernel launches not probed, no launch or no completed load in the window).",
		[]string{"gpu"}, nil)
	descHostWait = prometheus.NewDesc("lanewatch_host_wait_seconds_total",
		"Time host threads spent blocked in GPU waits, by API: stream, event and device synchronisations and element reads (blocking D2H copies of at most 32 bytes, the .item() shape).",
		[]string{"api"}, nil)
	descHostWaits = prometheus.NewDesc("lanewatch_host_waits_total",
		"GPU waits host threads made, by API (see lanewatch_host_wait_seconds_total).",
		[]string{"api"}, nil)
)

// ComputeGPU is one GPU's load streams in a window: copy time, and the part
// of it compute could overlap.
type ComputeGPU struct {
	GPU               string // "" unknown
	BusyNs, OverlapNs uint64
}

// HostWait is a window's host waits through one API.
type HostWait struct {
	API   string
	Count uint64
	Ns    uint64
}

// computeMetrics are the compute-overlap series.
type computeMetrics struct {
	gpus  []ComputeGPU
	waits map[string]*HostWait // totals since start, by API
}

// SetCompute publishes a window's compute overlap per GPU and adds its
// host waits to the totals.
func (m *Metrics) SetCompute(gpus []ComputeGPU, waits []HostWait) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.compute.gpus = append([]ComputeGPU(nil), gpus...)
	if m.compute.waits == nil {
		m.compute.waits = map[string]*HostWait{}
	}
	for _, w := range waits {
		t := m.compute.waits[w.API]
		if t == nil {
			if len(m.compute.waits) >= maxSeries {
				continue
			}
			t = &HostWait{API: w.API}
			m.compute.waits[w.API] = t
		}
		t.Count += w.Count
		t.Ns += w.Ns
	}
}

func (m *Metrics) collectCompute(ch chan<- prometheus.Metric) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, g := range m.compute.gpus {
		if g.BusyNs == 0 {
			continue
		}
		gpu := g.GPU
		if gpu == "" {
			gpu = "unknown"
		}
		ch <- prometheus.MustNewConstMetric(descComputeOverlap, prometheus.GaugeValue, float64(g.OverlapNs)/float64(g.BusyNs), gpu)
	}
	for _, w := range m.compute.waits {
		ch <- prometheus.MustNewConstMetric(descHostWait, prometheus.CounterValue, float64(w.Ns)/1e9, w.API)
		ch <- prometheus.MustNewConstMetric(descHostWaits, prometheus.CounterValue, float64(w.Count), w.API)
	}
}
