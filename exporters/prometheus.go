package exporters

import (
	"log/slog"
	"maps"
	"net/http"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
)

// Metrics exports lanewatch to Prometheus in the node_exporter style: it is
// a correlate.Sink that counts every transfer as the engine emits it, and a
// prometheus.Collector that turns those counts and the state read at scrape
// time (the agent's health, the evaluator's last window) into const metrics.
// Register it on a registry of your own (NewRegistry), never the global one.
//
// Units are base units (bytes, seconds); counters end in _total. No label
// holds a pid, an address, a request id or a wr_id: every label value comes
// from a small fixed set (directions, memory kinds, ops, opcodes, statuses,
// rules, severities, library file names) or names hardware (GPU PCI
// addresses). A label set past
// maxSeries is counted under the value "other" rather than growing forever.
type Metrics struct {
	gpuSource string // GPU counter source, "" none
	gpuKnown  bool
	health    func() Health

	mu        sync.Mutex
	transfers map[transferKey]*transferCount
	failed    map[failedKey]uint64
	sm        map[string]uint64     // transfers moved by SMs, by kernel function name
	sizes     map[string]*histogram // by direction
	wrs       map[wrKey]uint64
	latency   map[string]*histogram // by RDMA opcode
	xfers     map[xferKey]*transferCount
	xferLat   map[string]*histogram // by transport
	window    Window
	hasWindow bool
	// fired counts the evaluation windows in which each rule and
	// severity had a finding: a window shorter than the scrape interval
	// is seen by increase() even when no scrape caught its gauge.
	fired map[findingKey]uint64

	rules ruleSeries // the window rules' series (ruleseries.go)

	requests *requestMetrics // per-request KV summaries (requestmetrics.go)

	// last is the latest copy's series: transfers come in bursts of one
	// kind, and each then counts without hashing its labels.
	last struct {
		key   transferKey
		count *transferCount
		size  *histogram
	}
}

type findingKey struct{ rule, sev string }

// Health is the agent's own state, read at every scrape.
type Health struct {
	Events         uint64         // probe events read from the ring buffer
	Drops          event.Drops    // events lost or damaged in BPF, by reason
	AttachedProbes map[string]int // library file (path as attached) → probe sites attached in it
	// AttachFailures counts failed tries to probe a library, by library
	// file name; Unprobed counts the libraries processes map that have no
	// probes (blind spots, until their probes are in), by file name.
	AttachFailures map[string]uint64
	Unprobed       map[string]int
	// ProbedLibraries: files with probes now; LibraryDetaches: libraries
	// whose probes were detached because no process mapped them any more.
	ProbedLibraries int
	LibraryDetaches uint64
	// LoaderHolds counts threads held at their loader notification until
	// a CUDA file their process newly maps was probed, by how each hold
	// ended (released, bound, agent_gone); LoaderHoldSeconds their total
	// time; nil: the kernel cannot hold.
	LoaderHolds       map[string]uint64
	LoaderHoldSeconds float64
	// CallerUnclassified counts driver calls neither the probe nor the
	// process's maps could place (reported under the driver's name).
	CallerUnclassified uint64
	Pending            int // transfers not yet emitted: copies awaiting a proof of completion, RDMA requests awaiting their completion
	// PageLookups counts host↔device copies by what became of locating
	// their host pages (PageLookupResults; docs/design.md, "Pages, not
	// registrations"); nil: no locator ran.
	PageLookups map[string]uint64
	// Kernels counts kernel launches by what the engine knew of their
	// kernel (docs/design.md, "Kernel movers"); zero when launches are not
	// probed.
	Kernels correlate.KernelStats
	// Graphs counts CUDA graph launches and the calls captured into graphs
	// (docs/design.md, "CUDA graphs").
	Graphs correlate.GraphStats
	// LaneCopies: what the copies counted in BPF moved per GPU lane and
	// direction (docs/design.md, "Lane byte totals"), exact when events
	// were dropped; LaneUncounted the copies the BPF flow table had no
	// room for. nil: no counters.
	LaneCopies    []LaneCopies
	LaneUncounted uint64
}

// LaneCopies is what the counted copies moved over one GPU's lane in one
// direction: GPU "" when unknown.
type LaneCopies struct {
	GPU, Direction string
	Copies, Bytes  uint64
	Shed           uint64 // of Copies, those whose events were shed (probes.Options.NoShedding)
}

// PageLookupResults are the values of lanewatch_page_lookups_total's
// result label: located by a move_pages query, located from the cache, no
// sampled page had a node (not resident, not mapped, the process gone),
// the query failed, over the page budget, behind (too many copies waiting).
var PageLookupResults = []string{"located", "cached", "no_node", "failed", "over_budget", "behind"}

// Window is the evaluator's verdict on the last interval.
type Window struct {
	At       time.Time           // when the window was judged
	Duration time.Duration       // how long judging took
	Findings []correlate.Finding // active findings: the rules that fired on the window
	Lanes    []Lane              // per GPU link direction, demand and capacity
	Peers    []Peer              // peer copies per pair of GPUs and path
	// EventsLost is how many events the probes counted lost or truncated
	// while the window was open; Incomplete, per check name, how many of
	// the window's checks rest on part of its events (checks.Check.Incomplete),
	// every check the window judged present.
	EventsLost uint64
	Incomplete map[string]int
}

// Peer is the rate of the window's peer copies (D2D between two GPUs)
// from Src to Dst, and the path the topology says they took: "nvlink"
// (on no PCIe lane), "pcie" (in both GPUs' lane demand) or "unknown".
type Peer struct {
	Src, Dst, Path string
	Bps            float64
}

// Lane is one direction of one GPU's link during the window.
type Lane struct {
	GPU       string  // PCI address (sysfs form)
	Direction string  // "inbound" (toward the GPU) or "outbound"
	Demand    float64 // bytes per second moved over the window; <0 unknown
	Capacity  float64 // bytes per second the lane carries at its trained speed; 0 unknown
	// Measured (from the GPU's counters) and the part of it no probe saw;
	// HasMeasured false without counters.
	Measured, Unattributed float64
	HasMeasured            bool
	// SMTransfers: KV-transfer kernel launches on the GPU in the window
	// (either lane: their direction is unknown; their bytes are in the
	// unattributed rate).
	SMTransfers int
}

type transferKey struct{ direction, hostMem, op string }

type failedKey struct{ api, err string }

type transferCount struct{ n, bytes uint64 }

type wrKey struct{ opcode, status string }

type xferKey struct{ api, transport, device string }

// maxSeries caps the label sets of each counter family.
const maxSeries = 512

const overflow = "other"

// Histogram buckets. Sizes: 4 KiB … 1 GiB in powers of 4, with the 64 KiB
// fragmentation threshold (correlate.Fragmentation) on a bucket edge.
// Latency: 1 µs … 262 ms in powers of 4.
var (
	sizeBuckets    = prometheus.ExponentialBuckets(4096, 4, 10)
	latencyBuckets = prometheus.ExponentialBuckets(1e-6, 4, 10)
)

// histogram is a cumulative-at-scrape histogram kept without locks of its own.
type histogram struct {
	counts []uint64 // per bucket, not cumulative; the last one is +Inf
	count  uint64
	sum    float64
}

func newHistogram(n int) *histogram { return &histogram{counts: make([]uint64, n+1)} }

func (h *histogram) observe(bounds []float64, v float64) {
	i := sort.SearchFloat64s(bounds, v) // first bound >= v: le semantics
	h.counts[i]++
	h.count++
	h.sum += v
}

func (h *histogram) metric(desc *prometheus.Desc, bounds []float64, labels ...string) prometheus.Metric {
	buckets := make(map[float64]uint64, len(bounds))
	var cum uint64
	for i, b := range bounds {
		cum += h.counts[i]
		buckets[b] = cum
	}
	return prometheus.MustNewConstHistogram(desc, h.count, h.sum, buckets, labels...)
}

// Descriptors, built once.
var (
	descTransfers = prometheus.NewDesc("lanewatch_transfers_total",
		"Transfers the agent reported (copies and RDMA work requests), by direction, host memory kind of a host<->device copy (pinned, pageable, device, unknown; empty when not H2D/D2H) and op.",
		[]string{"direction", "host_mem", "op"}, nil)
	descTransferBytes = prometheus.NewDesc("lanewatch_transfer_bytes_total",
		"Bytes moved by the transfers the agent reported, by direction, host memory kind and op.",
		[]string{"direction", "host_mem", "op"}, nil)
	descTransferSize = prometheus.NewDesc("lanewatch_transfer_size_bytes",
		"Size of each transfer in bytes, by direction; many under 64 KiB means a fragmented, latency-bound transfer.",
		[]string{"direction"}, nil)
	descFailed = prometheus.NewDesc("lanewatch_failed_calls_total",
		"CUDA calls that returned an error, by API and the error's name in that layer's enum (cudaError_t, CUresult; \"other\" for a code the agent's headers do not name). A failed call moved nothing and counts in no transfer metric.",
		[]string{"api", "error"}, nil)
	descSMTransfers = prometheus.NewDesc("lanewatch_sm_transfers_total",
		"Launches of KV-transfer kernels the agent reported as transfers moved by the GPU's SMs (op kernel_copy), by kernel function name. Their bytes and direction are unknown: they count in no transfer or byte metric; the GPU counters' unattributed rate holds their bytes.",
		[]string{"kernel"}, nil)
	descLaunches = prometheus.NewDesc("lanewatch_kernel_launches_total",
		"Kernel launches the probes saw (agent run --kernels), by what the agent knew of the kernel: kv_transfer (reported as a transfer moved by SMs), other, unnamed (its handle was named before the agent looked).",
		[]string{"class"}, nil)
	descGraphLaunches = prometheus.NewDesc("lanewatch_graph_launches_total",
		"CUDA graph launches (cudaGraphLaunch): each runs the copies, kernels and event records captured into its graph with no call of their own, so none of them is a transfer; the launch counts as compute on its stream.",
		nil, nil)
	descCaptured = prometheus.NewDesc("lanewatch_captured_copies_total",
		"Copy calls issued on a stream being captured into a CUDA graph: recorded into the graph, not run, so never a transfer record. Their bytes move at each launch of the graph, unseen.",
		nil, nil)
	descWRs = prometheus.NewDesc("lanewatch_rdma_work_requests_total",
		"RDMA work requests posted, by opcode (RDMA_WRITE, WRITE_IMM, RDMA_READ, SEND, RECV) and completion status (none: emitted without a polled completion).",
		[]string{"opcode", "status"}, nil)
	descWRLatency = prometheus.NewDesc("lanewatch_rdma_posted_to_completed_seconds",
		"Time from posting an RDMA work request to polling its completion, in seconds, by opcode.",
		[]string{"opcode"}, nil)
	descXfers = prometheus.NewDesc("lanewatch_xfer_transfers_total",
		"Transfers posted through a transfer library (UCX: ucp_put_nbx, ucp_get_nbx, ucp_tag_send_nbx, ucp_am_send_nbx), by the API, the transport that carried them (rc_mlx5, tcp, posix, ...; unknown when not seen) and its device (mlx5_0:1, lo; empty when unknown).",
		[]string{"api", "transport", "device"}, nil)
	descXferBytes = prometheus.NewDesc("lanewatch_xfer_bytes_total",
		"Bytes posted through a transfer library, by the API, transport and device, as lanewatch_xfer_transfers_total.",
		[]string{"api", "transport", "device"}, nil)
	descXferLatency = prometheus.NewDesc("lanewatch_xfer_posted_to_completed_seconds",
		"Time from posting a transfer-library transfer to its completion (UCX: the call's return when it completed at once, else the release of its request), in seconds, by transport.",
		[]string{"transport"}, nil)
	descFindings = prometheus.NewDesc("lanewatch_findings",
		"Active findings of the last evaluation window, by rule and severity (0: the rule did not fire).",
		[]string{"rule", "severity"}, nil)
	descFindingWindows = prometheus.NewDesc("lanewatch_finding_windows_total",
		"Evaluation windows in which the rule had a finding of this severity: alert on increase(), which sees a window no scrape caught in lanewatch_findings.",
		[]string{"rule", "severity"}, nil)
	descLaneDemand = prometheus.NewDesc("lanewatch_lane_demand_bytes_per_second",
		"Bytes per second moved over one direction of a GPU's link during the last evaluation window.",
		[]string{"gpu", "direction"}, nil)
	descLaneCapacity = prometheus.NewDesc("lanewatch_lane_capacity_bytes_per_second",
		"Payload capacity in bytes per second of one direction of a GPU's link at its trained speed and width.",
		[]string{"gpu", "direction"}, nil)
	descLaneMeasured = prometheus.NewDesc("lanewatch_lane_measured_bytes_per_second",
		"Bytes per second the GPU's own counters (DCGM or NVML) saw cross one direction of its link during the last window.",
		[]string{"gpu", "direction"}, nil)
	descLaneUnattributed = prometheus.NewDesc("lanewatch_lane_unattributed_bytes_per_second",
		"The part of the measured rate no probed transfer explains: copy kernels, other processes, a remote peer's GPUDirect writes.",
		[]string{"gpu", "direction"}, nil)
	descLaneSM = prometheus.NewDesc("lanewatch_lane_sm_transfers",
		"KV-transfer kernel launches (transfers moved by SMs) on the GPU during the last window, on both of its lanes: their direction is unknown, and their bytes are in the lanes' unattributed rate.",
		[]string{"gpu", "direction"}, nil)
	descPeerCopy = prometheus.NewDesc("lanewatch_peer_copy_bytes_per_second",
		"Bytes per second the probed peer copies (D2D between two GPUs) moved from src_gpu to dst_gpu during the last window, by path: nvlink (on no PCIe lane), pcie (in both GPUs' lane demand) or unknown (no topology says: on no lane).",
		[]string{"src_gpu", "dst_gpu", "path"}, nil)
	descGPUCounters = prometheus.NewDesc("lanewatch_gpu_counters_available",
		"1 when GPU link counters are read (source dcgm or nvml), 0 with the source none when neither library is on this host.",
		[]string{"source"}, nil)
	descEvalDuration = prometheus.NewDesc("lanewatch_evaluation_duration_seconds",
		"How long the last evaluation of the findings took, in seconds.", nil, nil)
	descEvalTime = prometheus.NewDesc("lanewatch_evaluation_timestamp_seconds",
		"Unix time of the last evaluation of the findings, in seconds.", nil, nil)
	descWindowLost = prometheus.NewDesc("lanewatch_window_events_lost",
		"Events the probes counted lost or truncated (every reason of lanewatch_probe_dropped_events_total) while the last judged window was open: its judgements rest on part of its events.",
		nil, nil)
	descWindowIncomplete = prometheus.NewDesc("lanewatch_window_incomplete_checks",
		"Checks of the last judged window, per check, that rest on part of its events because events were lost: a pass they cannot claim is a skip, a finding carries the loss in its evidence.",
		[]string{"check"}, nil)
	descEvents = prometheus.NewDesc("lanewatch_probe_events_total",
		"Probe events read from the BPF ring buffer.", nil, nil)
	descDrops = prometheus.NewDesc("lanewatch_probe_dropped_events_total",
		"Probe events lost or damaged in BPF, by reason: ring_full (ring buffer full), lost_return (return probe without its entry), batch_truncated, read_fault (user memory unreadable), wr_truncated (work requests past the per-call limit).",
		[]string{"reason"}, nil)
	descAttached = prometheus.NewDesc("lanewatch_attached_probes",
		"Probe sites attached, by library file name.", []string{"library"}, nil)
	descAttachFailures = prometheus.NewDesc("lanewatch_attach_failures_total",
		"Failed tries to probe a library a process maps (it could not be opened, read or attached; it is tried again), by library file name.",
		[]string{"library"}, nil)
	descUnprobed = prometheus.NewDesc("lanewatch_unprobed_libraries",
		"Libraries processes map that have no probes yet (a blind spot: their calls are not seen), by library file name; the agent log says why.",
		[]string{"library"}, nil)
	descProbedLibraries = prometheus.NewDesc("lanewatch_probed_libraries",
		"Library files with probes attached (each holds its links until no process maps it).", nil, nil)
	descLibraryDetaches = prometheus.NewDesc("lanewatch_library_detaches_total",
		"Libraries whose probes were detached because no process mapped them for the grace period (attached again when one does).", nil, nil)
	descLoaderHolds = prometheus.NewDesc("lanewatch_loader_holds_total",
		"Threads held at their dynamic linker notification until a CUDA library their process newly mapped was probed, by how the hold ended: "+
			"released (probed before the process's first call into it), bound (the agent did not probe it within the bound: late attach), agent_gone (the agent stopped).",
		[]string{"end"}, nil)
	descLoaderHoldSeconds = prometheus.NewDesc("lanewatch_loader_hold_seconds_total",
		"Time threads spent held at their dynamic linker notification (spinning on their CPU).", nil, nil)
	descCallerUnclassified = prometheus.NewDesc("lanewatch_caller_unclassified_total",
		"Driver calls whose caller neither the probe nor the process's maps could place: reported under the driver's name, not the runtime call's.", nil, nil)
	descPageLookups = prometheus.NewDesc("lanewatch_page_lookups_total",
		"Host<->device copies by what became of locating the NUMA node of their host pages: located (move_pages), cached, "+
			"no_node (not resident, not mapped, process gone), failed, over_budget, behind (the locator could not keep up).",
		[]string{"result"}, nil)
	descLaneCopies = prometheus.NewDesc("lanewatch_lane_copies_total",
		"Successful CUDA driver copies per GPU lane and direction (H2D, D2H, D2D, H2H; unknown: cudaMemcpyDefault copies, whose direction their pointers decide), from counters kept in BPF: exact even when events were dropped. "+
			"gpu is the GPU the copy records that arrived placed the copy's stream on, unknown when none did. Batch copies (cuMemcpyBatchAsync) are not counted.",
		[]string{"gpu", "direction"}, nil)
	descLaneBytes = prometheus.NewDesc("lanewatch_lane_bytes_total",
		"Bytes moved by the copies of lanewatch_lane_copies_total (width*height for 2D copies), per GPU lane and direction, from counters kept in BPF: exact even when events were dropped.",
		[]string{"gpu", "direction"}, nil)
	descLaneShed = prometheus.NewDesc("lanewatch_lane_shed_copies_total",
		"Of lanewatch_lane_copies_total, the copies whose events BPF shed while the ring was over three quarters full (until a quarter or less was unread): counted here with their bytes, in no transfer record, span or per-copy metric; a window that shed a process's copies says its judgements of that process are incomplete.",
		[]string{"gpu", "direction"}, nil)
	descLaneUncounted = prometheus.NewDesc("lanewatch_lane_uncounted_copies_total",
		"Successful copies the BPF flow table had no room for: in no lanewatch_lane_copies_total or lanewatch_lane_bytes_total series.",
		nil, nil)
	descPending = prometheus.NewDesc("lanewatch_transfers_pending",
		"Transfers waiting for a synchronisation to prove their completion, plus RDMA work requests not yet completed.", nil, nil)
)

// NewMetrics returns Metrics reading the agent's health from health at
// every scrape (nil: no health metrics); rules are the window rules'
// metrics (judge.Descs), published by SetRuleSeries.
func NewMetrics(health func() Health, rules ...Desc) *Metrics {
	m := &Metrics{
		health:    health,
		rules:     ruleSeries{descs: rules},
		transfers: map[transferKey]*transferCount{},
		failed:    map[failedKey]uint64{},
		sm:        map[string]uint64{},
		sizes:     map[string]*histogram{},
		wrs:       map[wrKey]uint64{},
		latency:   map[string]*histogram{},
		xfers:     map[xferKey]*transferCount{},
		xferLat:   map[string]*histogram{},
		fired:     map[findingKey]uint64{},
		requests:  newRequestMetrics(),
	}
	for _, r := range correlate.Rules {
		for _, sev := range r.Severities {
			m.fired[findingKey{r.Name, string(sev)}] = 0
		}
	}
	// Host<->device copies start at 0 for every memory kind, so that rate()
	// sees the first pageable copy instead of a series born non-zero.
	for _, dir := range []string{correlate.DirH2D, correlate.DirD2H} {
		for _, mem := range []event.MemKind{event.MemPinned, event.MemPageable, event.MemUnknown} {
			for _, op := range []event.Op{event.OpCopy, event.OpCopy2D, event.OpCopyBatch} {
				m.transfers[transferKey{dir, string(mem), op.String()}] = &transferCount{}
			}
		}
	}
	return m
}

// NewRegistry returns a registry holding m, the scrape-time collectors by
// name (each with lanewatch_collector_duration_seconds and _success), and
// the Go runtime and process collectors. log may be nil.
func NewRegistry(m *Metrics, scrapers map[string]Collector, log *slog.Logger) *prometheus.Registry {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(m, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if len(scrapers) > 0 {
		reg.MustRegister(scrape{collectors: scrapers, log: log})
	}
	return reg
}

// Handler serves a scrape of reg: in the classic text format, which old
// scrapers get unchanged, or as OpenMetrics to a scraper that asks for it
// (Prometheus does by itself), which alone carries the request histograms'
// exemplars. Errors go to log.
func Handler(reg *prometheus.Registry, log *slog.Logger) http.Handler {
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelError), Registry: reg, EnableOpenMetrics: true})
}

// transferCount is the series of k, created at zero; past maxSeries, the
// overflow series (and its key).
func (m *Metrics) transferCount(k transferKey) (transferKey, *transferCount) {
	c := m.transfers[k]
	if c == nil {
		if len(m.transfers) >= maxSeries {
			k = transferKey{overflow, overflow, overflow}
			c = m.transfers[k]
		}
		if c == nil {
			c = &transferCount{}
			m.transfers[k] = c
		}
	}
	return k, c
}

// Transfer counts one transfer. It implements correlate.Sink.
func (m *Metrics) Transfer(t *correlate.Transfer) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if t.Failed() {
		// Nothing moved: counted as a failed call, never as a transfer.
		fk := failedKey{t.API, t.Error.Name}
		if fk.err == "" {
			fk.err = overflow // a code the headers do not name
		}
		if _, ok := m.failed[fk]; !ok && len(m.failed) >= maxSeries {
			fk = failedKey{overflow, overflow}
		}
		m.failed[fk]++
		return
	}
	if t.Mover == correlate.MoverSM {
		// Moved by SMs, bytes unknown: never a copy-engine transfer or byte.
		k := t.Kernel
		if _, ok := m.sm[k]; !ok && len(m.sm) >= maxSeries {
			k = overflow
		}
		m.sm[k]++
		return
	}
	k := transferKey{t.Direction, string(t.HostMem), t.Op.String()}
	if m.last.count == nil || m.last.key != k {
		series, c := m.transferCount(k)
		h := m.sizes[series.direction]
		if h == nil {
			h = newHistogram(len(sizeBuckets))
			m.sizes[series.direction] = h
		}
		m.last.key, m.last.count, m.last.size = k, c, h
	}
	m.last.count.n++
	m.last.count.bytes += t.Bytes
	m.last.size.observe(sizeBuckets, float64(t.Bytes))

	if t.Op.IsXfer() {
		m.xfer(t)
		return
	}
	if t.Op != event.OpPostSend && t.Op != event.OpPostRecv {
		return
	}
	status := t.Status
	if status == "" {
		status = "none"
	}
	wk := wrKey{t.Direction, status}
	if _, ok := m.wrs[wk]; !ok && len(m.wrs) >= maxSeries {
		wk = wrKey{overflow, overflow}
	}
	m.wrs[wk]++
	if t.CompleteNs > t.SubmitNs && t.Status == "success" {
		lh := m.latency[t.Direction]
		if lh == nil {
			if len(m.latency) >= maxSeries {
				return
			}
			lh = newHistogram(len(latencyBuckets))
			m.latency[t.Direction] = lh
		}
		lh.observe(latencyBuckets, float64(t.CompleteNs-t.SubmitNs)/1e9)
	}
}

// xfer counts a transfer library's transfer by the lane it went on, and
// its posted → completed latency by transport. Caller holds m.mu.
func (m *Metrics) xfer(t *correlate.Transfer) {
	k := xferKey{t.API, t.Transport, t.NetDevice}
	if k.transport == "" {
		k.transport = "unknown"
	}
	c := m.xfers[k]
	if c == nil {
		if len(m.xfers) >= maxSeries {
			k = xferKey{overflow, overflow, overflow}
			c = m.xfers[k]
		}
		if c == nil {
			c = &transferCount{}
			m.xfers[k] = c
		}
	}
	c.n++
	c.bytes += t.Bytes
	if t.LatencyNs == 0 {
		return
	}
	h := m.xferLat[k.transport]
	if h == nil {
		if len(m.xferLat) >= maxSeries {
			return
		}
		h = newHistogram(len(latencyBuckets))
		m.xferLat[k.transport] = h
	}
	h.observe(latencyBuckets, float64(t.LatencyNs)/1e9)
}

// SetWindow publishes the evaluator's verdict on the last interval,
// replacing the previous one.
func (m *Metrics) SetWindow(w Window) {
	w.Findings = append([]correlate.Finding(nil), w.Findings...)
	w.Lanes = append([]Lane(nil), w.Lanes...)
	w.Peers = append([]Peer(nil), w.Peers...)
	w.Incomplete = maps.Clone(w.Incomplete)
	m.mu.Lock()
	m.window, m.hasWindow = w, true
	seen := map[findingKey]bool{}
	for _, f := range w.Findings {
		k := findingKey{f.Rule, string(f.Severity)}
		if _, known := m.fired[k]; seen[k] || !known && len(m.fired) >= maxSeries {
			continue
		}
		seen[k] = true
		m.fired[k]++
	}
	m.mu.Unlock()
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descTransfers, descTransferBytes, descTransferSize, descFailed, descSMTransfers, descLaunches, descGraphLaunches, descCaptured, descWRs, descWRLatency, descXfers, descXferBytes, descXferLatency,
		descFindings, descFindingWindows, descLaneDemand, descLaneCapacity, descLaneMeasured, descLaneUnattributed, descLaneSM, descPeerCopy, descGPUCounters,
		descEvalDuration, descEvalTime, descWindowLost, descWindowIncomplete,
		descEvents, descDrops, descAttached, descAttachFailures, descUnprobed, descProbedLibraries, descLibraryDetaches, descLoaderHolds, descLoaderHoldSeconds, descCallerUnclassified, descPending, descPageLookups,
		descLaneCopies, descLaneBytes, descLaneShed, descLaneUncounted,
		descRequestKV, descRequestTTFTShare, descRequestSummaries,
	} {
		ch <- d
	}
	for _, d := range m.rules.descs {
		ch <- d.Desc
	}
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	m.collectCounts(ch)
	m.collectWindow(ch)
	m.collectRules(ch)
	m.requests.collect(ch)
	if m.health != nil {
		collectHealth(ch, m.health())
	}
}

func (m *Metrics) collectCounts(ch chan<- prometheus.Metric) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, c := range m.transfers {
		ch <- prometheus.MustNewConstMetric(descTransfers, prometheus.CounterValue, float64(c.n), k.direction, k.hostMem, k.op)
		ch <- prometheus.MustNewConstMetric(descTransferBytes, prometheus.CounterValue, float64(c.bytes), k.direction, k.hostMem, k.op)
	}
	for dir, h := range m.sizes {
		ch <- h.metric(descTransferSize, sizeBuckets, dir)
	}
	for k, n := range m.failed {
		ch <- prometheus.MustNewConstMetric(descFailed, prometheus.CounterValue, float64(n), k.api, k.err)
	}
	for kernel, n := range m.sm {
		ch <- prometheus.MustNewConstMetric(descSMTransfers, prometheus.CounterValue, float64(n), kernel)
	}
	for k, n := range m.wrs {
		ch <- prometheus.MustNewConstMetric(descWRs, prometheus.CounterValue, float64(n), k.opcode, k.status)
	}
	for op, h := range m.latency {
		ch <- h.metric(descWRLatency, latencyBuckets, op)
	}
	for k, c := range m.xfers {
		ch <- prometheus.MustNewConstMetric(descXfers, prometheus.CounterValue, float64(c.n), k.api, k.transport, k.device)
		ch <- prometheus.MustNewConstMetric(descXferBytes, prometheus.CounterValue, float64(c.bytes), k.api, k.transport, k.device)
	}
	for tr, h := range m.xferLat {
		ch <- h.metric(descXferLatency, latencyBuckets, tr)
	}
}

// SetGPUCounters says where GPU link counters come from ("" for none).
func (m *Metrics) SetGPUCounters(source string) {
	m.mu.Lock()
	m.gpuSource, m.gpuKnown = source, true
	m.mu.Unlock()
}

func (m *Metrics) collectWindow(ch chan<- prometheus.Metric) {
	m.mu.Lock()
	w, ok := m.window, m.hasWindow
	src, known := m.gpuSource, m.gpuKnown
	m.mu.Unlock()
	if known {
		if src == "" {
			ch <- prometheus.MustNewConstMetric(descGPUCounters, prometheus.GaugeValue, 0, "none")
		} else {
			ch <- prometheus.MustNewConstMetric(descGPUCounters, prometheus.GaugeValue, 1, src)
		}
	}
	type rs struct{ rule, sev string }
	active := map[rs]int{}
	for _, r := range correlate.Rules {
		for _, s := range r.Severities {
			active[rs{r.Name, string(s)}] = 0
		}
	}
	for _, f := range w.Findings {
		k := rs{f.Rule, string(f.Severity)}
		if _, known := active[k]; !known && len(active) >= maxSeries {
			continue
		}
		active[k]++
	}
	for k, n := range active {
		ch <- prometheus.MustNewConstMetric(descFindings, prometheus.GaugeValue, float64(n), k.rule, k.sev)
	}
	m.mu.Lock()
	for k, n := range m.fired {
		ch <- prometheus.MustNewConstMetric(descFindingWindows, prometheus.CounterValue, float64(n), k.rule, k.sev)
	}
	m.mu.Unlock()
	if !ok {
		return
	}
	for _, l := range w.Lanes {
		if l.Demand >= 0 {
			ch <- prometheus.MustNewConstMetric(descLaneDemand, prometheus.GaugeValue, l.Demand, l.GPU, l.Direction)
		}
		if l.Capacity > 0 {
			ch <- prometheus.MustNewConstMetric(descLaneCapacity, prometheus.GaugeValue, l.Capacity, l.GPU, l.Direction)
		}
		if l.HasMeasured {
			ch <- prometheus.MustNewConstMetric(descLaneMeasured, prometheus.GaugeValue, l.Measured, l.GPU, l.Direction)
			ch <- prometheus.MustNewConstMetric(descLaneUnattributed, prometheus.GaugeValue, l.Unattributed, l.GPU, l.Direction)
		}
		ch <- prometheus.MustNewConstMetric(descLaneSM, prometheus.GaugeValue, float64(l.SMTransfers), l.GPU, l.Direction)
	}
	for _, p := range w.Peers {
		ch <- prometheus.MustNewConstMetric(descPeerCopy, prometheus.GaugeValue, p.Bps, p.Src, p.Dst, p.Path)
	}
	ch <- prometheus.MustNewConstMetric(descEvalDuration, prometheus.GaugeValue, w.Duration.Seconds())
	ch <- prometheus.MustNewConstMetric(descEvalTime, prometheus.GaugeValue, float64(w.At.UnixNano())/1e9)
	ch <- prometheus.MustNewConstMetric(descWindowLost, prometheus.GaugeValue, float64(w.EventsLost))
	for check, n := range w.Incomplete {
		ch <- prometheus.MustNewConstMetric(descWindowIncomplete, prometheus.GaugeValue, float64(n), check)
	}
}

func collectHealth(ch chan<- prometheus.Metric, h Health) {
	ch <- prometheus.MustNewConstMetric(descEvents, prometheus.CounterValue, float64(h.Events))
	for _, d := range h.Drops.Reasons() {
		ch <- prometheus.MustNewConstMetric(descDrops, prometheus.CounterValue, float64(d.Count), d.Name)
	}
	byLib := map[string]int{}
	for path, n := range h.AttachedProbes {
		byLib[filepath.Base(path)] += n
	}
	for lib, n := range byLib {
		ch <- prometheus.MustNewConstMetric(descAttached, prometheus.GaugeValue, float64(n), lib)
	}
	for lib, n := range h.AttachFailures {
		ch <- prometheus.MustNewConstMetric(descAttachFailures, prometheus.CounterValue, float64(n), lib)
	}
	for lib, n := range h.Unprobed {
		ch <- prometheus.MustNewConstMetric(descUnprobed, prometheus.GaugeValue, float64(n), lib)
	}
	ch <- prometheus.MustNewConstMetric(descProbedLibraries, prometheus.GaugeValue, float64(h.ProbedLibraries))
	ch <- prometheus.MustNewConstMetric(descLibraryDetaches, prometheus.CounterValue, float64(h.LibraryDetaches))
	if h.LoaderHolds != nil {
		for end, n := range h.LoaderHolds {
			ch <- prometheus.MustNewConstMetric(descLoaderHolds, prometheus.CounterValue, float64(n), end)
		}
		ch <- prometheus.MustNewConstMetric(descLoaderHoldSeconds, prometheus.CounterValue, h.LoaderHoldSeconds)
	}
	ch <- prometheus.MustNewConstMetric(descCallerUnclassified, prometheus.CounterValue, float64(h.CallerUnclassified))
	ch <- prometheus.MustNewConstMetric(descPending, prometheus.GaugeValue, float64(h.Pending))
	for _, l := range []struct {
		class string
		n     uint64
	}{{"kv_transfer", h.Kernels.KV}, {"other", h.Kernels.Other}, {"unnamed", h.Kernels.Unnamed}} {
		ch <- prometheus.MustNewConstMetric(descLaunches, prometheus.CounterValue, float64(l.n), l.class)
	}
	ch <- prometheus.MustNewConstMetric(descGraphLaunches, prometheus.CounterValue, float64(h.Graphs.Launches))
	ch <- prometheus.MustNewConstMetric(descCaptured, prometheus.CounterValue, float64(h.Graphs.CapturedCopies))
	collectLaneCopies(ch, h)
	if h.PageLookups != nil {
		for _, r := range PageLookupResults {
			ch <- prometheus.MustNewConstMetric(descPageLookups, prometheus.CounterValue, float64(h.PageLookups[r]), r)
		}
	}
}

// collectLaneCopies sends the BPF-side copy totals, one series per GPU
// and direction, past maxSeries under "other".
func collectLaneCopies(ch chan<- prometheus.Metric, h Health) {
	if h.LaneCopies == nil {
		return
	}
	type key struct{ gpu, dir string }
	type total struct{ n, bytes, shed uint64 }
	sum := map[key]*total{}
	for _, l := range h.LaneCopies {
		k := key{l.GPU, l.Direction}
		if k.gpu == "" {
			k.gpu = "unknown"
		}
		if _, ok := sum[k]; !ok && len(sum) >= maxSeries {
			k = key{overflow, overflow}
		}
		c := sum[k]
		if c == nil {
			c = &total{}
			sum[k] = c
		}
		c.n += l.Copies
		c.bytes += l.Bytes
		c.shed += l.Shed
	}
	for k, c := range sum {
		ch <- prometheus.MustNewConstMetric(descLaneCopies, prometheus.CounterValue, float64(c.n), k.gpu, k.dir)
		ch <- prometheus.MustNewConstMetric(descLaneBytes, prometheus.CounterValue, float64(c.bytes), k.gpu, k.dir)
		ch <- prometheus.MustNewConstMetric(descLaneShed, prometheus.CounterValue, float64(c.shed), k.gpu, k.dir)
	}
	ch <- prometheus.MustNewConstMetric(descLaneUncounted, prometheus.CounterValue, float64(h.LaneUncounted))
}
