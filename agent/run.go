package agent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel"

	"github.com/lanewatch/lanewatch/checks"
	"github.com/lanewatch/lanewatch/collectors"
	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/exporters"
	"github.com/lanewatch/lanewatch/judge"
	"github.com/lanewatch/lanewatch/otlpbridge"
)

// RunConfig is everything `agent run` does around the tracer: where the
// records go, the metrics server and its evaluator, the OTLP bridge and the
// transfer spans.
type RunConfig struct {
	Trace   Config    // the tracer; its Sink and OnReady are set by Run
	Output  io.Writer // JSONL transfer records; nil: none, and no record is encoded
	SysRoot string    // sysfs mount point: topology, GPU placement, RDMA ports
	Version string
	Logger  *slog.Logger
	// OnReady runs once every probe is attached.
	OnReady func()

	// Place names the GPU of a process and its link's capacity. nil: this
	// host's placement (HostPlacement). The selftest gives the reference
	// data path's from outside; production code has no other.
	Place func(pid uint32) checks.Placement
	// MemoryLimit is the agent's memory ceiling in bytes (--memory-limit;
	// math.MaxInt64 or 0: none). The Go runtime's soft limit is already
	// set below it; bounded parts (span index, pending transfers) size
	// their budgets from it.
	MemoryLimit int64
	// Env reads the variables of traced processes' environments that
	// decide their GPU, once per process image, for the device map, the
	// placement and the host checks alike. nil: Run makes one over
	// Trace.ProcRoot.
	Env *collectors.EnvCache

	// TraceStorageReads traces the storage reads of the traced processes
	// (--trace-storage-reads; docs/design.md, "The storage leg").
	TraceStorageReads bool

	Metrics MetricsConfig
	Traces  TracesConfig
}

// MetricsConfig is the Prometheus side of `agent run`.
type MetricsConfig struct {
	Listen            string // "" turns metrics and the evaluator off
	Path              string
	EvaluateInterval  time.Duration
	HostCheckInterval time.Duration
	GPU               GPUConfig
	// TopoM is a saved `nvidia-smi topo -m` of this host (--topo-m): peer
	// copies between GPUs it shows NVLinked are kept off the PCIe lanes,
	// the others are put on them; "": every peer copy's path is unknown.
	TopoM string
	// ReadyMaxDropRatio: /readyz fails while more than this share of the
	// probe events since its previous check were dropped (0: DefaultReadyMaxDropRatio).
	ReadyMaxDropRatio float64
}

// TracesConfig is the OTLP side of `agent run`.
type TracesConfig struct {
	GRPCListen, HTTPListen string // the bridge's listeners; both "" turns it off
	Upstream               otlpbridge.Upstream
	Index                  otlpbridge.IndexConfig
	Spans                  exporters.SpanMode
	Hold                   time.Duration // a transfer waits this for the server's spans
	MaxHold                time.Duration // ... and at most this while a request that may cover it is open
	// ExportUnattributed makes spans of the transfers no request the
	// server sampled covers, too (exporters.SpansConfig).
	ExportUnattributed bool

	// Limits bound the receivers; a zero DecodeBudget is sized from
	// RunConfig.MemoryLimit (otlpbridge.DecodeBudgetFor).
	Limits otlpbridge.Limits
}

// Run traces until ctx is done, then detaches every probe, flushes every
// record and span, stops every server and logs a summary. Listeners are
// bound before any probe is attached, so a busy port fails at once. The
// errors of every part are joined.
func Run(ctx context.Context, cfg RunConfig) (err error) {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	cfg.Trace.Logger = log
	if cfg.Trace.ProcRoot == "" {
		cfg.Trace.ProcRoot = "/proc"
	}
	if cfg.Env == nil {
		cfg.Env = collectors.NewEnvCache(cfg.Trace.ProcRoot)
	}
	place := cfg.Place
	if place == nil {
		if place, err = HostPlacement(cfg.Trace.ProcRoot, cfg.SysRoot, cfg.Env); err != nil {
			log.Warn("GPU placement unknown: lane metrics, the overlap check and span paths need it", "err", err)
			place = nil
		}
	}
	var jsonl *exporters.JSONL
	var records correlate.Sink // nil: records are not encoded at all
	if cfg.Output != nil {
		jsonl = exporters.NewJSONL(cfg.Output)
		records = jsonl
	}
	var closers []func() error // run in reverse at the end
	defer func() {
		for i := len(closers) - 1; i >= 0; i-- {
			err = errors.Join(err, closers[i]())
		}
	}()

	// Libraries' own failure lines (net/http's, the OTel SDK's) go through
	// the logger, one line per cause per interval.
	limited := newLimitedLog(log, cmp.Or(cfg.Trace.LogInterval, time.Minute))
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		limited.Log(slog.LevelWarn, "otel\x00"+lineCause(err.Error()), "OTel SDK", "err", err)
	}))
	if cfg.TraceStorageReads {
		st, err := NewStorageReads(StorageConfig{ProcRoot: cfg.Trace.ProcRoot, SysRoot: cfg.SysRoot, Logger: log})
		if err != nil {
			return fmt.Errorf("--trace-storage-reads: %w", err)
		}
		closers = append(closers, st.Close)
		cfg.Trace.Storage = st
	}
	tr, err := startTraces(cfg, place, log, limited)
	if err != nil {
		return err
	}
	closers = append(closers, tr.stop)
	mx, err := listenMetrics(cfg, place, tr.collectors(), log, limited)
	if err != nil {
		return err
	}
	mx.onVerdict = tr.verdict
	if mx.exp != nil {
		tr.requests.set(mx.exp) // the request histograms
	}
	if cfg.Trace.Devices == nil {
		cfg.Trace.Devices = HostDeviceMap(cfg.Env, cfg.SysRoot, mx.gpu, log)
	}

	cfg.Trace.Sink = tr.tee(mx.tee(records))
	if mx.eval != nil {
		cfg.Trace.Activity = mx.eval  // compute overlap (computeoverlap.go)
		cfg.Trace.Lost = mx.eval.Lost // its windows' judgements say what they lost
	}
	cfg.Trace.OnReady = cfg.OnReady
	ag, err := New(cfg.Trace)
	if err != nil {
		mx.close()
		return fmt.Errorf("start: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	stopMetrics := mx.serve(ctx, ag, &wg)
	// Records reach the output within a second even when transfers are rare.
	wg.Add(1)
	go func() {
		defer wg.Done()
		every(ctx, time.Second, func(time.Time) {
			if err := jsonl.Flush(); err != nil {
				log.Error("write output", "err", err)
			}
		})
	}()
	runErr := ag.Run(ctx)
	spansErr := tr.stop() // every transfer is out of the engine: export the held spans
	cancel()
	stopMetrics()
	wg.Wait()
	logSummary(log, ag)
	return errors.Join(runErr, jsonl.Flush(), spansErr)
}

// every calls f on a ticker until ctx is done.
func every(ctx context.Context, d time.Duration, f func(time.Time)) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			f(now)
		}
	}
}

func logSummary(log *slog.Logger, ag *Agent) {
	st := ag.Stats()
	xs, fs := ag.XferStats(), ag.FabricStats()
	args := []any{"events", st.Events, "transfers", st.Engine.Transfers, "library_transfers", xs.Posted + fs.Posted, "drops", st.Drops.Total()}
	for _, r := range st.Drops.Reasons() {
		args = append(args, r.Name, r.Count)
	}
	lanes, _ := ag.LaneCopies()
	var copies, shed uint64
	for _, l := range lanes {
		copies, shed = copies+l.Copies, shed+l.Shed
	}
	args = append(args, "counted_copies", copies, "shed", shed, "attach_failures", st.AttachFailures)
	log.Info("summary", args...)
	for _, u := range ag.Unprobed() {
		log.Warn("library mapped without probes until the end: its calls were not seen", "path", u.Path, "pid", u.PID,
			"failures", u.Failures, "since", u.Since.Format(time.RFC3339), "reason", u.Reason)
	}
	for _, p := range ag.Untraced() {
		log.Warn("process moved data past the probes until the end: its transfers through these objects were not seen", "pid", p.PID,
			"objects", p.Text())
	}
	if p := st.Pages; p.Copies > 0 {
		log.Info("host pages of copies", "copies", p.Copies, "located", p.Located, "from_cache", p.Cached, "no_node", p.NoNode,
			"failed", p.Failed, "over_budget", p.OverRate, "behind", p.Behind, "move_pages_calls", p.Queries, "pages_asked", p.Pages)
	}
	if sr := ag.cfg.Storage; sr != nil {
		s := sr.Stats()
		log.Info("storage reads", "reads", s.Reads, "not_block_device", s.NotBlock, "unresolved", s.Unresolved,
			"dropped", s.Dropped, "flows_over_cap", s.OverCap)
	}
	if xs.Posted > 0 {
		log.Info("ucx", "posted", xs.Posted, "failed", xs.Failed, "requests", xs.Requests, "requests_completed", xs.Completed,
			"emitted_without_completion", xs.Evicted, "lane_not_in_call", xs.NoLane, "iface_before_attach", xs.UnknownIfaces,
			"cap_hits", xs.IfaceCapHits+xs.MappedCapHits+xs.WaitCapHits+xs.EndpointCapHits)
	}
	if fs.Posted+fs.Retries+fs.Failed > 0 {
		log.Info("libfabric", "posted", fs.Posted, "retries", fs.Retries, "failed", fs.Failed, "completions", fs.Completions,
			"joined", fs.Joined, "unmatched_completions", fs.Unmatched, "emitted_without_completion", fs.NoCompletion, "cap_hits", fs.CapHits)
	}
	if rs := ag.RDMAStats(); rs.WorkRequests > 0 {
		log.Info("rdma", "work_requests", rs.WorkRequests, "completions", rs.Completions, "by_status", fmt.Sprint(rs.ByStatus),
			"unmatched_completions", rs.Unmatched, "never_completed", rs.Evicted,
			"regions_not_tracked", rs.RegionCapHits, "queue_cap_hits", rs.QueueCapHits, "latency_samples_not_kept", rs.LatencyCapHits,
			"notifies_ahead_of_data", rs.NotifiesAhead, "of_them_ambiguous", rs.NotifiesAmbiguous, "notifies_peer_unknown", rs.NotifyPeerUnknown,
			"notifies_after_own_writes_beside_others", rs.NotifiesOwnDone,
			"deregs_in_flight", rs.DeregsInFlight, "qp_peers_not_kept", rs.PeerCapHits)
		for _, l := range ag.RDMALatency() {
			log.Info("rdma posted→completed", "pid", l.PID, "qp", l.QPNum, "opcode", l.Opcode, "count", l.Count,
				"p50", time.Duration(l.P50), "p99", time.Duration(l.P99), "in_flight", l.InFlight)
		}
	}
}

// metrics serves lanewatch's metrics and runs the evaluator that feeds
// lanewatch_findings. The zero value (metrics off) does nothing.
type metrics struct {
	cfg       RunConfig
	log       *slog.Logger
	onVerdict func(judge.Verdict) // also told every verdict (finding spans)
	gpu       collectors.GPUCounters
	exp       *exporters.Metrics
	eval      *judge.Evaluator
	ln        net.Listener
	srv       *http.Server
	agent     atomic.Pointer[Agent] // set once the tracer is loaded
	skipped   map[string]bool       // window checks skipped, logged once per scope and reason
	links     *LinkWatch            // GPU link states read under load, for HostJudge; nil without counters
	live      *liveFlows            // the live view's flows and findings (live.go)
}

// listenMetrics builds the metrics and binds the listener.
func listenMetrics(cfg RunConfig, place func(uint32) checks.Placement, extra map[string]exporters.Collector, log *slog.Logger, limited *limitedLog) (*metrics, error) {
	mc := cfg.Metrics
	if mc.Listen == "" {
		return &metrics{}, nil
	}
	if mc.EvaluateInterval <= 0 {
		return nil, fmt.Errorf("--evaluate-interval %s: must be positive", mc.EvaluateInterval)
	}
	m := &metrics{cfg: cfg, log: log, skipped: map[string]bool{}, live: newLiveFlows(time.Now())}
	m.exp = exporters.NewMetrics(m.health, judge.Descs()...)
	gpu, err := OpenGPU(mc.GPU)
	switch {
	case err == nil:
		log.Info("GPU counters", "source", gpu.Source())
		m.exp.SetGPUCounters(gpu.Source())
	case IsNoGPU(err):
		log.Info("GPU counters unavailable: lane rates come from the probes alone", "reason", err)
		m.exp.SetGPUCounters("")
	default:
		return nil, err
	}
	if gpu != nil {
		// Every reading (the evaluator's each second, the scrapes') feeds
		// the link watch: link-degraded judges GPUs as read under load.
		m.links = NewLinkWatch(3 * time.Second)
		gpu = WatchLinks(gpu, m.links)
	}
	m.gpu = gpu
	procRoot := cfg.Trace.ProcRoot
	if procRoot == "" {
		procRoot = "/proc"
	}
	cong, err := checks.NewCongestion(checks.CongestionConfig{ProcRoot: procRoot, SysRoot: cfg.SysRoot})
	switch {
	case err != nil:
		log.Warn("RDMA port counters unreadable: rdma-congestion is not judged", "err", err)
	case cong == nil:
		log.Info("no RDMA port: rdma-congestion is not judged", "sysfs", cfg.SysRoot)
	}
	numa, nics, err := HostPlaces(cfg.SysRoot)
	if err != nil {
		log.Warn("PCI tree unreadable: remote-numa-pool is not judged on the pages copies read, nor the transfer libraries' lanes", "err", err)
	}
	var peerPath func(src, dst string) (string, bool)
	if mc.TopoM != "" {
		if peerPath, err = PeerPaths(mc.TopoM, cfg.SysRoot); err != nil {
			return nil, err
		}
	}
	var disks *judge.DiskWindow
	var diskPlace func(string) collectors.DiskPlace
	if sh, err := HostStorage(cfg.SysRoot); err != nil {
		log.Warn("block devices unplaced: storage-shared-uplink is not judged, disk metrics are labelled unknown", "err", err)
	} else {
		disks, diskPlace = judge.NewDiskWindow(procRoot, sh), DiskPlacer(sh)
	}
	m.eval = judge.NewEvaluator(judge.EvaluatorConfig{Interval: mc.EvaluateInterval, Place: place, Publish: m.publish, GPU: gpu, Congestion: cong,
		NUMA: numa, NICs: nics, LinkCapacity: LaneCapacity(capacityHost(procRoot, cfg.SysRoot, log), m.links), GPUPath: peerPath,
		Kernels: cfg.Trace.Kernels, Storage: storageFlows(cfg.Trace.Storage), Disks: disks, Drops: m.drops, Shed: m.shed})
	scrapers := map[string]exporters.Collector{
		"rdma_ports": collectors.NewInfiniBandMetrics(cfg.SysRoot),
		"host":       collectors.NewHostMetrics(cfg.Trace.ProcRoot, cfg.SysRoot),
		"disk":       collectors.NewDiskMetrics(procRoot, cfg.SysRoot, diskPlace),
	}
	if gpu != nil {
		scrapers["gpu"] = collectors.NewGPUMetrics(gpu)
	}
	maps.Copy(scrapers, extra)
	reg := exporters.NewRegistry(m.exp, scrapers, log)
	if m.ln, err = net.Listen("tcp", mc.Listen); err != nil {
		m.close()
		return nil, fmt.Errorf("--web.listen-address: %w", err)
	}
	if tcp, ok := m.ln.Addr().(*net.TCPAddr); ok && !tcp.IP.IsLoopback() {
		log.Warn("metrics are served beyond loopback", "address", m.ln.Addr().String())
	}
	mux := http.NewServeMux()
	mux.Handle(mc.Path, promhttp.InstrumentMetricHandler(reg, exporters.Handler(reg, log)))
	ready := &readiness{maxDropRatio: cmp.Or(mc.ReadyMaxDropRatio, DefaultReadyMaxDropRatio), now: time.Now}
	mux.HandleFunc(LivePath, m.serveLive)
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { serveAlive(w) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		var src healthSource
		if ag := m.agent.Load(); ag != nil {
			src = ag
		}
		ready.serveReady(w, src)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintf(w, "<html><head><title>lanewatch</title></head><body><h1>lanewatch</h1><p><a href=%q>Metrics</a> <a href=/healthz>Alive</a> <a href=/readyz>Ready</a> <a href=%s>Live</a></p></body></html>\n", mc.Path, LivePath)
	})
	m.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: time.Minute, ErrorLog: limited.lineLogger("metrics server")}
	return m, nil
}

// tee adds the metrics and the evaluator to the transfer stream.
func (m *metrics) tee(sink correlate.Sink) correlate.Sink {
	if m.exp == nil {
		return correlate.Tee(sink)
	}
	return correlate.Tee(sink, m.exp, m.eval, m.live)
}

// serve starts serving and evaluating until ctx is done; the returned
// function stops the server and waits for both.
func (m *metrics) serve(ctx context.Context, ag *Agent, wg *sync.WaitGroup) (stop func()) {
	if m.exp == nil {
		return func() {}
	}
	m.agent.Store(ag)
	var loads func() map[string]checks.LinkLoad
	if m.links != nil {
		loads = m.links.Take
	}
	m.eval.SetHostFindings(ag.HostJudge(m.cfg.Trace.ProcRoot, m.cfg.SysRoot, m.cfg.Env, m.cfg.Metrics.HostCheckInterval, m.log, loads))
	wg.Add(3)
	go func() {
		defer wg.Done()
		every(ctx, time.Second, m.live.roll) // the live view's seconds
	}()
	go func() {
		defer wg.Done()
		if err := m.srv.Serve(m.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			m.log.Error("serve metrics", "err", err)
		}
	}()
	go func() {
		defer wg.Done()
		m.eval.Run(ctx)
	}()
	m.log.Info("serving metrics", "address", m.ln.Addr().String(), "path", m.cfg.Metrics.Path)
	return func() {
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if err := m.srv.Shutdown(sctx); err != nil {
			m.log.Warn("stop metrics server", "err", err)
		}
		m.close()
	}
}

// close releases the GPU counters (the listener is closed by Shutdown, or
// here when the server never started).
func (m *metrics) close() {
	if m.srv == nil && m.ln != nil {
		m.ln.Close()
	}
	if m.gpu != nil {
		if err := m.gpu.Close(); err != nil {
			m.log.Warn("close GPU counters", "err", err)
		}
		m.gpu = nil
	}
}

// drops is the probes' count of events lost or truncated, for the
// evaluator's windows (judge.EvaluatorConfig.Drops); 0 before they load.
func (m *metrics) drops() (uint64, error) {
	ag := m.agent.Load()
	if ag == nil {
		return 0, nil
	}
	d, err := ag.probes.Drops()
	return d.Total(), err
}

// shed is the copies each traced process had shed (Agent.ShedByProcess).
func (m *metrics) shed() (map[uint32]uint64, error) {
	ag := m.agent.Load()
	if ag == nil {
		return nil, nil
	}
	return ag.ShedByProcess()
}

func (m *metrics) health() exporters.Health {
	ag := m.agent.Load()
	if ag == nil {
		return exporters.Health{}
	}
	st := ag.Stats()
	lanes, uncounted := ag.LaneCopies()
	return exporters.Health{LaneCopies: lanes, LaneUncounted: uncounted, Events: st.Events, Drops: st.Drops, AttachedProbes: ag.AttachedProbes(),
		AttachFailures: ag.AttachFailures(), Unprobed: ag.UnprobedByLibrary(), CallerUnclassified: st.CallerUnclassified, Pending: ag.Pending(), PageLookups: st.Pages.ByResult(),
		Kernels: st.Engine.Kernels, Graphs: st.Engine.Graphs, ProbedLibraries: st.Files, LibraryDetaches: st.LibraryDetaches,
		LoaderHolds: st.Holds.ByEnd(), LoaderHoldSeconds: float64(st.Holds.HeldNS) / 1e9}
}

// publish hands a verdict to the metrics and logs what it holds: every
// finding, and once each judgement a process could not get (its GPU
// unknown, say).
func (m *metrics) publish(v judge.Verdict) {
	w := exporters.Window{At: v.At, Duration: v.Took, Findings: v.Findings, EventsLost: v.Losses.Events, Incomplete: map[string]int{}}
	var partial int
	for _, c := range v.Checks {
		n := w.Incomplete[c.Name] // every check judged has its series, 0 when whole
		if c.Incomplete != "" {
			n++
			partial++
		}
		w.Incomplete[c.Name] = n
	}
	for _, l := range v.Lanes {
		w.Lanes = append(w.Lanes, exporters.Lane{GPU: l.GPU, Direction: l.Direction, Demand: l.Demand, Capacity: l.Capacity,
			Measured: l.Measured, Unattributed: l.Unattributed, HasMeasured: l.HasMeasured, SMTransfers: l.SMTransfers})
	}
	for _, p := range v.Peers {
		w.Peers = append(w.Peers, exporters.Peer{Src: p.Src, Dst: p.Dst, Path: p.Path, Bps: p.Bps})
	}
	m.exp.SetWindow(w)
	m.exp.SetRuleSeries(v.Series)
	m.live.setFindings(v.At, v.Findings)
	if m.onVerdict != nil {
		m.onVerdict(v)
	}
	for _, f := range v.Findings {
		m.log.Info("finding", "rule", f.Rule, "severity", f.Severity, "subject", f.Subject, "summary", f.Summary)
	}
	if v.Losses.Lossy() {
		m.log.Info("window judged on part of its events", "events_lost", v.Losses.Events, "any_process", v.Losses.All,
			"processes", len(v.Losses.PIDs), "incomplete_checks", partial)
	}
	for _, c := range v.Checks {
		key := c.Scope + "\x00" + c.Name + "\x00" + c.Detail
		if c.Status != checks.Skip || c.Incomplete != "" || m.skipped[key] {
			continue // a window's losses are said once, above
		}
		if len(m.skipped) >= 4096 {
			clear(m.skipped)
		}
		m.skipped[key] = true
		m.log.Info("judgement skipped", "scope", c.Scope, "check", c.Name, "reason", c.Detail)
	}
}

// traces is the running OTLP bridge and span exporter.
type traces struct {
	requests lateRequests // where the requests' summaries go besides their spans
	log      *slog.Logger
	bridge   *otlpbridge.Bridge
	spans    *exporters.Spans
	sent     *exporters.CountingExporter // the spans' exporter
	stopTP   func(context.Context) error
	cancel   context.CancelFunc
	done     chan struct{}
	once     sync.Once
	err      error
}

// startTraces opens the bridge's listeners and the span exporter. Either
// may be off.
func startTraces(cfg RunConfig, place func(uint32) checks.Placement, log *slog.Logger, limited *limitedLog) (*traces, error) {
	tc := cfg.Traces
	t := &traces{log: log, done: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	t.cancel = cancel
	if tc.Index.Procs == nil {
		// The server's processes as the agent's procfs shows them: their
		// machine ids (SGLang's host_id) and parents (vLLM's process tree).
		tc.Index.Procs = otlpbridge.NewProcFS(cfg.Trace.ProcRoot)
	}
	if tc.Index.Logger == nil {
		tc.Index.Logger = log
	}
	if tc.Index.MaxBytes == 0 {
		tc.Index.MaxBytes = otlpbridge.IndexBytesFor(cfg.MemoryLimit) // its share of the ceiling
	}
	if tc.GRPCListen != "" || tc.HTTPListen != "" {
		if tc.Limits.DecodeBudget == 0 {
			tc.Limits.DecodeBudget = otlpbridge.DecodeBudgetFor(cfg.MemoryLimit, tc.Limits)
		}
		br, err := otlpbridge.New(otlpbridge.Config{GRPCListen: tc.GRPCListen, HTTPListen: tc.HTTPListen, Upstream: tc.Upstream,
			Logger: log, Index: tc.Index, Limits: tc.Limits, ErrorLog: limited.lineLogger("OTLP HTTP receiver"),
			Warn: func(cause, msg string, args ...any) { limited.Log(slog.LevelWarn, cause, msg, args...) }})
		if err != nil {
			cancel()
			return nil, err
		}
		t.bridge = br
		br.Serve()
		log.Info("OTLP span index", "max_bytes", tc.Index.MaxBytes, "max_things", tc.Index.MaxSpans, "window", tc.Index.Window)
	}
	if tc.Spans == exporters.SpansOff || tc.Upstream.Endpoint == "" {
		if tc.Spans != exporters.SpansOff {
			log.Info("transfer spans off: no OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT set")
		}
		close(t.done)
		return t, nil
	}
	res, err := exporters.NewResource(ctx)
	if err != nil {
		log.Warn("OTel resource", "err", err) // partial resource still usable
	}
	exp, err := exporters.NewOTLPSpanExporter(ctx)
	if err != nil {
		close(t.done)
		return nil, errors.Join(err, t.stop())
	}
	t.sent = exporters.CountExports(exp)
	tp := exporters.NewTracerProvider(res, t.sent)
	t.stopTP = tp.Shutdown
	clock := otlpbridge.NewClock()
	sc := exporters.SpansConfig{Tracer: tp.Tracer("github.com/lanewatch/lanewatch"), Mode: tc.Spans, Wall: clock.Wall, Hold: tc.Hold,
		MaxHold: tc.MaxHold, ExportUnattributed: tc.ExportUnattributed, Requests: &t.requests, StorageReads: cfg.Trace.Storage != nil, Logger: log}
	if place != nil {
		if paths, err := NewPaths(cfg.SysRoot, place); err != nil {
			log.Warn("transfer spans without topology", "err", err)
		} else {
			sc.Paths = paths
		}
	}
	if t.bridge != nil {
		sc.Attributor = t.bridge.Index()
	}
	t.spans = exporters.NewSpans(sc)
	if cfg.Trace.Storage != nil {
		cfg.Trace.Storage.OnPoolRead(t.spans.StorageRead) // their requests' summaries
	}
	go func() {
		defer close(t.done)
		release := time.NewTicker(250 * time.Millisecond)
		defer release.Stop()
		refresh := time.NewTicker(10 * time.Second)
		defer refresh.Stop()
		for {
			select {
			case <-ctx.Done():
				return // stop releases the rest
			case <-refresh.C:
				clock.Refresh()
			case now := <-release.C:
				t.spans.Release(now)
			}
		}
	}()
	log.Info("transfer spans", "mode", tc.Spans, "upstream", tc.Upstream.Endpoint, "hold", tc.Hold, "max_hold", max(tc.MaxHold, tc.Hold))
	return t, nil
}

// lateRequests passes the requests' summaries on to a sink set once the
// metrics exist (after the span exporter started).
type lateRequests struct {
	sink atomic.Pointer[exporters.RequestSink]
}

func (l *lateRequests) set(s exporters.RequestSink) { l.sink.Store(&s) }

// RequestKV implements exporters.RequestSink.
func (l *lateRequests) RequestKV(r *exporters.RequestKV) {
	if s := l.sink.Load(); s != nil {
		(*s).RequestKV(r)
	}
}

// collectors are the metrics of the bridge and the span exporter.
func (t *traces) collectors() map[string]exporters.Collector {
	c := map[string]exporters.Collector{}
	if t.spans != nil {
		c["spans"] = exporters.SpansCollector{S: t.spans}
	}
	if t.sent != nil {
		c["span_export"] = exporters.SpanExportCollector{E: t.sent}
	}
	if t.bridge != nil {
		c["otlp"] = exporters.OTLPCollector{Stats: t.bridge.Stats, Index: t.bridge.Index().Stats}
	}
	return c
}

// tee adds the span exporter to the transfer sinks.
func (t *traces) tee(s correlate.Sink) correlate.Sink {
	if t.spans == nil {
		return correlate.Tee(s)
	}
	return correlate.Tee(s, t.spans)
}

// stop releases every held transfer as spans, flushes them upstream, then
// closes the bridge. Call it after the tracer flushed its transfers; it
// runs once.
func (t *traces) stop() error {
	t.once.Do(func() { t.err = t.shutdown() })
	return t.err
}

func (t *traces) shutdown() error {
	if t.spans != nil {
		// A second to attribute what is held, then the rest leaves
		// unattributed: the agent stops in time whatever the index holds.
		t.spans.Stop(time.Second)
	}
	t.cancel()
	<-t.done
	var errs []error
	if t.spans != nil {
		t.spans.Release(time.Time{})
		st := t.spans.Stats()
		var none []any
		for _, r := range exporters.UnattributedReasons {
			if n := st.Unattributed[r]; n > 0 {
				none = append(none, "unattributed_"+r, n)
			}
		}
		var withheld uint64
		for _, n := range st.Withheld {
			withheld += n
		}
		t.log.Info("transfer spans", append([]any{"transfers", st.Transfers, "spans", st.Spans, "attributed", st.Attributed, "batch", st.Batched,
			"late", st.Late, "incomplete", st.Incomplete, "early_release", st.EarlyRelease, "withheld", withheld,
			"request_summaries", st.Summaries}, none...)...)
	}
	if t.stopTP != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		errs = append(errs, t.stopTP(ctx))
		cancel()
		ok, failed := t.sent.Counts()
		t.log.Info("span export", "exported", ok, "failed", failed)
	}
	if t.bridge != nil {
		errs = append(errs, t.bridge.Close())
		st := t.bridge.Stats()
		t.log.Info("OTLP bridge", "requests", st.Requests, "refused", st.BadRequests, "forwarded", st.Forwarded, "forward_errors", st.ForwardErrors,
			"spans", st.Index.Spans, "indexed", st.Index.Indexed, "evicted", st.Index.Evicted, "cap_evicted", st.Index.CapEvicts,
			"info_evicted", st.Index.InfoEvicts, "clamped", st.Index.Clamped, "index_bytes", st.Index.Bytes,
			"open_requests", st.Index.Open, "open_expired", st.Index.OpenExpired, "open_dropped", st.Index.OpenDropped)
	}
	return errors.Join(errs...)
}

// verdict turns the evaluator's findings into spans.
func (t *traces) verdict(v judge.Verdict) {
	if t.spans != nil {
		t.spans.Findings(v.Findings, v.At)
	}
}

// HostPlacement places processes on this host's GPUs the way diagnose does
// (checks.Host.Place): CUDA_VISIBLE_DEVICES, else GPU 0, with the link's
// trained capacity; on a host whose sysfs shows no GPU every GPU is
// unknown, with the reason. Environments are read through env (nil: a
// cache of this placement's own).
func HostPlacement(procRoot, sysRoot string, env *collectors.EnvCache) (func(pid uint32) checks.Placement, error) {
	h, err := checks.ReadHost(procRoot, sysRoot, "")
	if err != nil {
		return nil, err
	}
	if env != nil {
		h.Env = env
	}
	return h.Place, nil
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
