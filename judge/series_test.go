package judge

import (
	"strings"
	"testing"

	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/exporters"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// The overlap ratio is the last window's, per GPU ("unknown" unnamed; a
// GPU with no completed load has none); host waits add up across windows.
func TestComputeSeries(t *testing.T) {
	m := exporters.NewMetrics(nil, Descs()...)
	m.SetRuleSeries(computeSeries([]correlate.ComputeReport{{
		Streams: []correlate.LoadStream{{GPU: "0000:3b:00.0", BusyNs: 1000, OverlapNs: 0}},
		Waits:   []correlate.HostWait{{API: "cudaStreamSynchronize", Count: 8, Ns: 4e8}}}}))
	m.SetRuleSeries(computeSeries([]correlate.ComputeReport{
		{Streams: []correlate.LoadStream{{GPU: "0000:3b:00.0", BusyNs: 1000, OverlapNs: 900}, {GPU: "", BusyNs: 10, OverlapNs: 5}, {GPU: "0000:17:00.0"}},
			Waits: []correlate.HostWait{{API: "cudaStreamSynchronize", Count: 2, Ns: 1e8}, {API: "cudaMemcpy", Count: 8, Ns: 8e6}}},
		{Unknown: "kernel launches not probed", Streams: []correlate.LoadStream{{GPU: "0000:17:00.0", BusyNs: 10}}}}))
	want := `
# HELP lanewatch_copy_compute_overlap_ratio Share of the H2D load streams' copy time during the last window that kernels on the GPU's other streams could have overlapped: an upper bound (kernels are bounded from launch to the completion a host wait proved), so near 0 proves the loads ran beside no compute. Absent when unknown (kernel launches not probed, no launch or no completed load in the window).
# TYPE lanewatch_copy_compute_overlap_ratio gauge
lanewatch_copy_compute_overlap_ratio{gpu="0000:3b:00.0"} 0.9
lanewatch_copy_compute_overlap_ratio{gpu="unknown"} 0.5
# HELP lanewatch_host_wait_seconds_total Time host threads spent blocked in GPU waits, by API: stream, event and device synchronisations and element reads (blocking D2H copies of at most 32 bytes, the .item() shape).
# TYPE lanewatch_host_wait_seconds_total counter
lanewatch_host_wait_seconds_total{api="cudaMemcpy"} 0.008
lanewatch_host_wait_seconds_total{api="cudaStreamSynchronize"} 0.5
# HELP lanewatch_host_waits_total GPU waits host threads made, by API (see lanewatch_host_wait_seconds_total).
# TYPE lanewatch_host_waits_total counter
lanewatch_host_waits_total{api="cudaMemcpy"} 8
lanewatch_host_waits_total{api="cudaStreamSynchronize"} 10
`
	if err := testutil.GatherAndCompare(exporters.NewRegistry(m, nil, nil), strings.NewReader(want),
		"lanewatch_copy_compute_overlap_ratio", "lanewatch_host_wait_seconds_total", "lanewatch_host_waits_total"); err != nil {
		t.Error(err)
	}
}
