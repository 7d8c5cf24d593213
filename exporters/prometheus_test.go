package exporters

import (
	"bytes"
	"fmt"
	"os/exec"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"

	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/internal/promtest"
)

// feed gives m one of each kind of record the engine emits.
func feed(m *Metrics) {
	for _, t := range []correlate.Transfer{
		{Op: event.OpCopy, Direction: correlate.DirH2D, Bytes: 1 << 20, HostMem: event.MemPinned},
		{Op: event.OpCopy, Direction: correlate.DirH2D, Bytes: 1 << 20, HostMem: event.MemPinned},
		{Op: event.OpCopy, Direction: correlate.DirH2D, Bytes: 4096, HostMem: event.MemPageable},
		{Op: event.OpCopy2D, Direction: correlate.DirD2H, Bytes: 8192, HostMem: event.MemUnknown},
		{Op: event.OpCopyPeer, Direction: correlate.DirD2D, Bytes: 64 << 10},
		{Op: event.OpPostSend, Direction: correlate.DirWriteImm, Bytes: 1 << 20, Status: "success", SubmitNs: 1000, CompleteNs: 51000, QPNum: 7},
		{Op: event.OpPostSend, Direction: correlate.DirRDMARead, Bytes: 4096, Status: "remote_access_error", SubmitNs: 1000, CompleteNs: 3000, QPNum: 7},
		{Op: event.OpPostRecv, Direction: correlate.DirRecv, Bytes: 4096, QPNum: 8},
		{Op: event.OpKernelCopy, Mover: correlate.MoverSM, Kernel: "transfer_kernel_impl", Direction: correlate.DirUnknown, BytesUnknown: true},
		{Op: event.OpKernelCopy, Mover: correlate.MoverSM, Kernel: "transfer_kernel_impl", Direction: correlate.DirUnknown, BytesUnknown: true},
	} {
		m.Transfer(&t)
	}
	m.SetWindow(Window{
		At: time.Unix(1700000000, 0), Duration: 3 * time.Millisecond,
		Findings: []correlate.Finding{
			{Rule: "pageable-copy", Severity: correlate.SevFail, Subject: "pid 1"},
			{Rule: "pageable-copy", Severity: correlate.SevFail, Subject: "pid 2"},
			{Rule: "same-direction-overlap", Severity: correlate.SevWarn, Subject: "PCIe link of GPU 0000:3b:00.0"},
		},
		Lanes: []Lane{
			{GPU: "0000:17:00.0", Direction: "inbound", Demand: 40e9, Capacity: 63.015e9, SMTransfers: 12},
			{GPU: "0000:17:00.0", Direction: "outbound", Demand: 0, Capacity: 63.015e9},
			{GPU: "0000:3b:00.0", Direction: "inbound", Demand: 3.9e9},
		},
		Peers: []Peer{
			{Src: "0000:17:00.0", Dst: "0000:3b:00.0", Path: "nvlink", Bps: 276.07e9}, // nvbandwidth's D2D write CE, one GPU pair
			{Src: "0000:3b:00.0", Dst: "0000:17:00.0", Path: "unknown", Bps: 1e6},
		},
		EventsLost: 5, Incomplete: map[string]int{"pageable copies": 2, "fragmentation": 0},
	})
}

func testHealth() Health {
	return Health{
		Events: 1234,
		Drops:  event.Drops{RingFull: 3, NoEntry: 1, WRTrunc: 2},
		AttachedProbes: map[string]int{
			"/usr/lib/x86_64-linux-gnu/libcuda.so.1": 20, "/proc/42/root/usr/lib/x86_64-linux-gnu/libcuda.so.1": 20,
			"/opt/venv/lib/libcudart.so.12": 30,
		},
		AttachFailures:  map[string]uint64{"libcuda.so.1": 2},
		Unprobed:        map[string]int{"libcuda.so.1": 1},
		ProbedLibraries: 2, LibraryDetaches: 7,
		LoaderHolds: map[string]uint64{"released": 4, "bound": 1, "agent_gone": 0}, LoaderHoldSeconds: 0.25,
		Pending: 5,
		Kernels: correlate.KernelStats{Launches: 9, KV: 2, Other: 5, Unnamed: 2},
		Graphs:  correlate.GraphStats{Launches: 70, CapturedCopies: 2, CapturedBytes: 640},
		LaneCopies: []LaneCopies{{GPU: "0000:3b:00.0", Direction: correlate.DirH2D, Copies: 3, Bytes: 192},
			{GPU: "", Direction: correlate.DirD2H, Copies: 1, Bytes: 64}},
		LaneUncounted: 4,
	}
}

func TestMetricsValues(t *testing.T) {
	m := NewMetrics(testHealth)
	feed(m)
	reg := NewRegistry(m, nil, nil)
	want := `
# HELP lanewatch_findings Active findings of the last evaluation window, by rule and severity (0: the rule did not fire).
# TYPE lanewatch_findings gauge
lanewatch_findings{rule="cross-qp-notify",severity="fail"} 0
lanewatch_findings{rule="cross-qp-notify",severity="warn"} 0
lanewatch_findings{rule="far-nic",severity="warn"} 0
lanewatch_findings{rule="fragmented-copies",severity="warn"} 0
lanewatch_findings{rule="host-sync-in-loop",severity="warn"} 0
lanewatch_findings{rule="iommu-translated",severity="warn"} 0
lanewatch_findings{rule="kv-transfer-far-device",severity="warn"} 0
lanewatch_findings{rule="kv-transfer-tcp-fallback",severity="warn"} 0
lanewatch_findings{rule="link-degraded",severity="fail"} 0
lanewatch_findings{rule="link-degraded",severity="info"} 0
lanewatch_findings{rule="link-underused",severity="warn"} 0
lanewatch_findings{rule="mr-dereg-in-flight",severity="fail"} 0
lanewatch_findings{rule="numa-bind-skipped",severity="warn"} 0
lanewatch_findings{rule="pageable-copy",severity="fail"} 2
lanewatch_findings{rule="pageable-copy",severity="info"} 0
lanewatch_findings{rule="pageable-copy",severity="warn"} 0
lanewatch_findings{rule="pinned-pressure",severity="fail"} 0
lanewatch_findings{rule="pinned-pressure",severity="warn"} 0
lanewatch_findings{rule="rdma-congestion",severity="fail"} 0
lanewatch_findings{rule="rdma-congestion",severity="warn"} 0
lanewatch_findings{rule="remote-numa-pool",severity="fail"} 0
lanewatch_findings{rule="remote-numa-pool",severity="info"} 0
lanewatch_findings{rule="same-direction-overlap",severity="warn"} 1
lanewatch_findings{rule="serialized-load",severity="warn"} 0
lanewatch_findings{rule="too-little-in-flight",severity="warn"} 0
lanewatch_findings{rule="storage-far-pool",severity="info"} 0
lanewatch_findings{rule="storage-far-pool",severity="warn"} 0
lanewatch_findings{rule="storage-shared-uplink",severity="warn"} 0
# HELP lanewatch_lane_capacity_bytes_per_second Payload capacity in bytes per second of one direction of a GPU's link at its trained speed and width.
# TYPE lanewatch_lane_capacity_bytes_per_second gauge
lanewatch_lane_capacity_bytes_per_second{direction="inbound",gpu="0000:17:00.0"} 6.3015e+10
lanewatch_lane_capacity_bytes_per_second{direction="outbound",gpu="0000:17:00.0"} 6.3015e+10
# HELP lanewatch_lane_demand_bytes_per_second Bytes per second moved over one direction of a GPU's link during the last evaluation window.
# TYPE lanewatch_lane_demand_bytes_per_second gauge
lanewatch_lane_demand_bytes_per_second{direction="inbound",gpu="0000:17:00.0"} 4e+10
lanewatch_lane_demand_bytes_per_second{direction="inbound",gpu="0000:3b:00.0"} 3.9e+09
lanewatch_lane_demand_bytes_per_second{direction="outbound",gpu="0000:17:00.0"} 0
# HELP lanewatch_lane_sm_transfers KV-transfer kernel launches (transfers moved by SMs) on the GPU during the last window, on both of its lanes: their direction is unknown, and their bytes are in the lanes' unattributed rate.
# TYPE lanewatch_lane_sm_transfers gauge
lanewatch_lane_sm_transfers{direction="inbound",gpu="0000:17:00.0"} 12
lanewatch_lane_sm_transfers{direction="inbound",gpu="0000:3b:00.0"} 0
lanewatch_lane_sm_transfers{direction="outbound",gpu="0000:17:00.0"} 0
# HELP lanewatch_peer_copy_bytes_per_second Bytes per second the probed peer copies (D2D between two GPUs) moved from src_gpu to dst_gpu during the last window, by path: nvlink (on no PCIe lane), pcie (in both GPUs' lane demand) or unknown (no topology says: on no lane).
# TYPE lanewatch_peer_copy_bytes_per_second gauge
lanewatch_peer_copy_bytes_per_second{dst_gpu="0000:3b:00.0",path="nvlink",src_gpu="0000:17:00.0"} 2.7607e+11
lanewatch_peer_copy_bytes_per_second{dst_gpu="0000:17:00.0",path="unknown",src_gpu="0000:3b:00.0"} 1e+06
# HELP lanewatch_window_events_lost Events the probes counted lost or truncated (every reason of lanewatch_probe_dropped_events_total) while the last judged window was open: its judgements rest on part of its events.
# TYPE lanewatch_window_events_lost gauge
lanewatch_window_events_lost 5
# HELP lanewatch_window_incomplete_checks Checks of the last judged window, per check, that rest on part of its events because events were lost: a pass they cannot claim is a skip, a finding carries the loss in its evidence.
# TYPE lanewatch_window_incomplete_checks gauge
lanewatch_window_incomplete_checks{check="fragmentation"} 0
lanewatch_window_incomplete_checks{check="pageable copies"} 2
# HELP lanewatch_rdma_work_requests_total RDMA work requests posted, by opcode (RDMA_WRITE, WRITE_IMM, RDMA_READ, SEND, RECV) and completion status (none: emitted without a polled completion).
# TYPE lanewatch_rdma_work_requests_total counter
lanewatch_rdma_work_requests_total{opcode="RDMA_READ",status="remote_access_error"} 1
lanewatch_rdma_work_requests_total{opcode="RECV",status="none"} 1
lanewatch_rdma_work_requests_total{opcode="WRITE_IMM",status="success"} 1
# HELP lanewatch_probe_dropped_events_total Probe events lost or damaged in BPF, by reason: ring_full (ring buffer full), lost_return (return probe without its entry), batch_truncated, read_fault (user memory unreadable), wr_truncated (work requests past the per-call limit).
# TYPE lanewatch_probe_dropped_events_total counter
lanewatch_probe_dropped_events_total{reason="batch_truncated"} 0
lanewatch_probe_dropped_events_total{reason="lost_return"} 1
lanewatch_probe_dropped_events_total{reason="read_fault"} 0
lanewatch_probe_dropped_events_total{reason="ring_full"} 3
lanewatch_probe_dropped_events_total{reason="wr_truncated"} 2
# HELP lanewatch_attached_probes Probe sites attached, by library file name.
# TYPE lanewatch_attached_probes gauge
lanewatch_attached_probes{library="libcuda.so.1"} 40
lanewatch_attached_probes{library="libcudart.so.12"} 30
# HELP lanewatch_attach_failures_total Failed tries to probe a library a process maps (it could not be opened, read or attached; it is tried again), by library file name.
# TYPE lanewatch_attach_failures_total counter
lanewatch_attach_failures_total{library="libcuda.so.1"} 2
# HELP lanewatch_unprobed_libraries Libraries processes map that have no probes yet (a blind spot: their calls are not seen), by library file name; the agent log says why.
# TYPE lanewatch_unprobed_libraries gauge
lanewatch_unprobed_libraries{library="libcuda.so.1"} 1
# HELP lanewatch_probed_libraries Library files with probes attached (each holds its links until no process maps it).
# TYPE lanewatch_probed_libraries gauge
lanewatch_probed_libraries 2
# HELP lanewatch_library_detaches_total Libraries whose probes were detached because no process mapped them for the grace period (attached again when one does).
# TYPE lanewatch_library_detaches_total counter
lanewatch_library_detaches_total 7
# HELP lanewatch_loader_holds_total Threads held at their dynamic linker notification until a CUDA library their process newly mapped was probed, by how the hold ended: released (probed before the process's first call into it), bound (the agent did not probe it within the bound: late attach), agent_gone (the agent stopped).
# TYPE lanewatch_loader_holds_total counter
lanewatch_loader_holds_total{end="agent_gone"} 0
lanewatch_loader_holds_total{end="bound"} 1
lanewatch_loader_holds_total{end="released"} 4
# HELP lanewatch_loader_hold_seconds_total Time threads spent held at their dynamic linker notification (spinning on their CPU).
# TYPE lanewatch_loader_hold_seconds_total counter
lanewatch_loader_hold_seconds_total 0.25
# HELP lanewatch_transfers_pending Transfers waiting for a synchronisation to prove their completion, plus RDMA work requests not yet completed.
# TYPE lanewatch_transfers_pending gauge
lanewatch_transfers_pending 5
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"lanewatch_findings", "lanewatch_lane_capacity_bytes_per_second", "lanewatch_lane_demand_bytes_per_second", "lanewatch_lane_sm_transfers", "lanewatch_peer_copy_bytes_per_second",
		"lanewatch_window_events_lost", "lanewatch_window_incomplete_checks", "lanewatch_rdma_work_requests_total", "lanewatch_probe_dropped_events_total", "lanewatch_attached_probes",
		"lanewatch_attach_failures_total", "lanewatch_unprobed_libraries", "lanewatch_probed_libraries", "lanewatch_library_detaches_total", "lanewatch_loader_holds_total", "lanewatch_loader_hold_seconds_total", "lanewatch_transfers_pending"); err != nil {
		t.Error(err)
	}

	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, mm := range mf.GetMetric() {
			var lv []string
			for _, l := range mm.GetLabel() {
				lv = append(lv, l.GetName()+"="+l.GetValue())
			}
			key := mf.GetName() + "{" + strings.Join(lv, ",") + "}"
			switch {
			case mm.GetCounter() != nil:
				got[key] = mm.GetCounter().GetValue()
			case mm.GetHistogram() != nil:
				got[key+"_count"] = float64(mm.GetHistogram().GetSampleCount())
				got[key+"_sum"] = mm.GetHistogram().GetSampleSum()
			}
		}
	}
	for k, v := range map[string]float64{
		"lanewatch_transfers_total{direction=H2D,host_mem=pinned,op=copy}":      2,
		"lanewatch_transfer_bytes_total{direction=H2D,host_mem=pinned,op=copy}": 2 << 20,
		"lanewatch_transfers_total{direction=H2D,host_mem=pageable,op=copy}":    1,
		"lanewatch_transfers_total{direction=D2H,host_mem=pageable,op=copy}":    0, // pre-initialised
		"lanewatch_transfers_total{direction=D2D,host_mem=,op=copy_peer}":       1,
		"lanewatch_transfers_total{direction=WRITE_IMM,host_mem=,op=post_send}": 1,
		"lanewatch_transfer_size_bytes{direction=H2D}_count":                    3,
		"lanewatch_rdma_posted_to_completed_seconds{opcode=WRITE_IMM}_count":    1,
		"lanewatch_rdma_posted_to_completed_seconds{opcode=WRITE_IMM}_sum":      50e-6,
		"lanewatch_probe_events_total{}":                                        1234,
		"lanewatch_sm_transfers_total{kernel=transfer_kernel_impl}":             2,
		"lanewatch_kernel_launches_total{class=kv_transfer}":                    2,
		"lanewatch_kernel_launches_total{class=unnamed}":                        2,
		"lanewatch_kernel_launches_total{class=other}":                          5,
		"lanewatch_graph_launches_total{}":                                      70,
		"lanewatch_captured_copies_total{}":                                     2,
		"lanewatch_lane_bytes_total{direction=H2D,gpu=0000:3b:00.0}":            192,
		"lanewatch_lane_copies_total{direction=H2D,gpu=0000:3b:00.0}":           3,
		"lanewatch_lane_bytes_total{direction=D2H,gpu=unknown}":                 64,
		"lanewatch_lane_uncounted_copies_total{}":                               4,
	} {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("%s = %v (present %v), want %v", k, g, ok, v)
		}
	}
	if _, ok := got["lanewatch_rdma_posted_to_completed_seconds{opcode=RDMA_READ}_count"]; ok {
		t.Error("a failed completion was counted in the latency histogram")
	}
	// Moved by SMs, bytes unknown: in no transfer, byte or size series.
	for k := range got {
		if strings.Contains(k, "kernel_copy") || strings.Contains(k, "direction=unknown") {
			t.Errorf("a kernel's transfer counted as a copy: %s", k)
		}
	}
}

// A clean window after an active one sets every finding back to 0.
func TestMetricsWindowReplaced(t *testing.T) {
	m := NewMetrics(nil)
	feed(m)
	m.SetWindow(Window{At: time.Unix(1700000010, 0)})
	reg := NewRegistry(m, nil, nil)
	if n, err := testutil.GatherAndCount(reg, "lanewatch_lane_demand_bytes_per_second"); err != nil || n != 0 {
		t.Errorf("lane series after a window without lanes: %d %v", n, err)
	}
	if n, err := testutil.GatherAndCount(reg, "lanewatch_window_incomplete_checks"); err != nil || n != 0 {
		t.Errorf("incomplete checks after a window that judged none: %d series %v", n, err)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP lanewatch_window_events_lost Events the probes counted lost or truncated (every reason of lanewatch_probe_dropped_events_total) while the last judged window was open: its judgements rest on part of its events.
# TYPE lanewatch_window_events_lost gauge
lanewatch_window_events_lost 0
`), "lanewatch_window_events_lost"); err != nil {
		t.Error(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "lanewatch_findings" {
			continue
		}
		for _, mm := range mf.GetMetric() {
			if mm.GetGauge().GetValue() != 0 {
				t.Errorf("finding %v still %v after a clean window", mm.GetLabel(), mm.GetGauge().GetValue())
			}
		}
	}
}

// Label values that keep changing stop at maxSeries series.
func TestMetricsBounded(t *testing.T) {
	m := NewMetrics(nil)
	for i := range 3 * maxSeries {
		m.Transfer(&correlate.Transfer{Op: event.OpCopy, Direction: fmt.Sprintf("dir%d", i), Bytes: 1})
		m.Transfer(&correlate.Transfer{Op: event.OpPostSend, Direction: correlate.DirSend, Status: fmt.Sprintf("status_%d", i),
			SubmitNs: 1, CompleteNs: 2})
		m.Transfer(&correlate.Transfer{Op: event.OpXferPut, API: "ucp_put_nbx", Transport: fmt.Sprintf("tl%d", i), NetDevice: "d", LatencyNs: 1})
	}
	var lanes []LaneCopies
	for i := range 3 * maxSeries {
		lanes = append(lanes, LaneCopies{GPU: fmt.Sprintf("0000:%02x:00.0", i), Direction: correlate.DirH2D, Copies: 1, Bytes: 1})
	}
	m.health = func() Health { return Health{LaneCopies: lanes} }
	reg := NewRegistry(m, nil, nil)
	for _, name := range []string{"lanewatch_transfers_total", "lanewatch_rdma_work_requests_total", "lanewatch_xfer_transfers_total",
		"lanewatch_xfer_posted_to_completed_seconds", "lanewatch_lane_bytes_total", "lanewatch_lane_copies_total"} {
		n, err := testutil.GatherAndCount(reg, name)
		if err != nil || n > maxSeries+1 {
			t.Errorf("%s: %d series (%v), want at most %d", name, n, err, maxSeries+1)
		}
	}
}

// promtool check metrics finds nothing to complain about in a real scrape
// (Go and process collectors included).
func TestPromtoolCheckMetrics(t *testing.T) {
	promtool := promtest.Tool(t, "promtool")
	m := NewMetrics(testHealth)
	feed(m)
	reg := NewRegistry(m, nil, nil)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var text bytes.Buffer
	enc := expfmt.NewEncoder(&text, expfmt.NewFormat(expfmt.TypeTextPlain))
	var names []string
	for _, mf := range mfs {
		if err := enc.Encode(mf); err != nil {
			t.Fatal(err)
		}
		names = append(names, mf.GetName())
	}
	sort.Strings(names)
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = &text
	out, err := cmd.CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}
	t.Logf("promtool check metrics: clean on %d families", len(names))
}

func BenchmarkMetricsTransfer(b *testing.B) {
	m := NewMetrics(nil)
	t := correlate.Transfer{Op: event.OpCopy, Direction: correlate.DirH2D, Bytes: 1 << 20, HostMem: event.MemPinned}
	b.ReportAllocs()
	for b.Loop() {
		m.Transfer(&t)
	}
}

// A transfer library's transfers count by API, transport and device, and
// their latency by transport; one whose transport is unknown says so, and
// one without a completion has no latency sample.
func TestMetricsXfer(t *testing.T) {
	m := NewMetrics(nil)
	for _, x := range []correlate.Transfer{
		{Op: event.OpXferPut, API: "ucp_put_nbx", Direction: correlate.DirRDMAWrite, Bytes: 1 << 20, Transport: "tcp", NetDevice: "lo", LatencyNs: 2000},
		{Op: event.OpXferPut, API: "ucp_put_nbx", Direction: correlate.DirRDMAWrite, Bytes: 1 << 20, Transport: "tcp", NetDevice: "lo", LatencyNs: 3000},
		{Op: event.OpXferSend, API: "ucp_tag_send_nbx", Direction: correlate.DirSend, Bytes: 8, Transport: "unknown", TransportReason: "transport_not_seen"},
	} {
		m.Transfer(&x)
	}
	reg := NewRegistry(m, nil, nil)
	want := `
# HELP lanewatch_xfer_bytes_total Bytes posted through a transfer library, by the API, transport and device, as lanewatch_xfer_transfers_total.
# TYPE lanewatch_xfer_bytes_total counter
lanewatch_xfer_bytes_total{api="ucp_put_nbx",device="lo",transport="tcp"} 2.097152e+06
lanewatch_xfer_bytes_total{api="ucp_tag_send_nbx",device="",transport="unknown"} 8
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "lanewatch_xfer_bytes_total"); err != nil {
		t.Error(err)
	}
	if n, err := testutil.GatherAndCount(reg, "lanewatch_xfer_transfers_total"); err != nil || n != 2 {
		t.Errorf("xfer transfer series: %d, %v", n, err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "lanewatch_xfer_posted_to_completed_seconds" {
			continue
		}
		if len(mf.Metric) != 1 || mf.Metric[0].GetHistogram().GetSampleCount() != 2 {
			t.Errorf("latency: %v", mf.Metric)
		}
		return
	}
	t.Error("no lanewatch_xfer_posted_to_completed_seconds")
}
