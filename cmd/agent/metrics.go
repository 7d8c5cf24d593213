package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/lanewatch/lanewatch/agent"
	"github.com/lanewatch/lanewatch/collectors"
	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/exporters"
)

// metricsFlags are `agent run`'s Prometheus settings.
type metricsFlags struct {
	listen   *string
	path     *string
	interval *time.Duration
	sysRoot  *string
	gpu      agent.GPUConfig
	hostEach *time.Duration
}

func addMetricsFlags(fs *flag.FlagSet) *metricsFlags {
	f := &metricsFlags{
		listen: fs.String("web.listen-address", "127.0.0.1:9464",
			"address to serve Prometheus metrics on (loopback only by default; \"\" disables metrics and the evaluator)"),
		path: fs.String("web.telemetry-path", "/metrics", "path under which metrics are served"),
		interval: fs.Duration("evaluate-interval", agent.DefaultEvaluateInterval,
			"how often the last interval's transfers are judged (pageable copies, fragmentation, same-direction overlap) into lanewatch_findings"),
		sysRoot: fs.String("path.sysfs", "/sys", "sysfs mount point (GPU placement and link capacity)"),
	}
	f.hostEach = fs.Duration("host-check-interval", time.Minute,
		"how often the host and process checks of `agent diagnose` (links, IOMMU, NUMA binding, pool placement, pinned memory) refresh their findings")
	fs.StringVar(&f.gpu.Source, "gpu-counters", "auto", "GPU link counters: auto (DCGM, else NVML), dcgm, nvml or off; read once per evaluation")
	fs.StringVar(&f.gpu.NVMLLibrary, "nvml.library", "libnvidia-ml.so.1", "the NVML library to load at run time")
	fs.StringVar(&f.gpu.DCGMAddress, "dcgm.address", "", "a standalone nv-hostengine (host:port); empty starts an embedded host engine")
	return f
}

// metricsServer serves lanewatch's metrics and runs the evaluator that
// feeds lanewatch_findings. The zero value (metrics disabled) does nothing.
type metricsServer struct {
	onVerdict func(agent.Verdict) // also told every verdict (finding spans)
	gpu       collectors.GPUCounters
	procRoot  string
	sysRoot   string
	hostEach  time.Duration
	log       *slog.Logger
	metrics   *exporters.Metrics
	eval      *agent.Evaluator
	reg       *prometheus.Registry
	ln        net.Listener
	path      string
	agent     *agent.Agent
}

// start builds the metrics and binds the listener, so that a busy port
// fails the command before any probe is attached.
func (f *metricsFlags) start(log *slog.Logger, procRoot string) (*metricsServer, error) {
	if *f.listen == "" {
		return &metricsServer{}, nil
	}
	if *f.interval <= 0 {
		return nil, fmt.Errorf("--evaluate-interval %s: must be positive", *f.interval)
	}
	m := &metricsServer{log: log, path: *f.path, procRoot: procRoot, sysRoot: *f.sysRoot, hostEach: *f.hostEach}
	m.metrics = exporters.NewMetrics(m.health)
	place, err := agent.HostPlacement(procRoot, *f.sysRoot)
	if err != nil {
		log.Warn("GPU placement unknown: lane metrics and the overlap check need it", "err", err)
	}
	gpu, err := agent.OpenGPU(f.gpu)
	switch {
	case err == nil:
		log.Info("GPU counters", "source", gpu.Source())
		m.metrics.SetGPUCounters(gpu.Source())
	case agent.IsNoGPU(err):
		log.Info("GPU counters unavailable: lane rates come from the probes alone", "reason", err)
		m.metrics.SetGPUCounters("")
	default:
		return nil, err
	}
	m.gpu = gpu
	m.eval = agent.NewEvaluator(agent.EvaluatorConfig{Interval: *f.interval, Place: place, Publish: m.publish, GPU: gpu})
	scrapers := map[string]exporters.Collector{"rdma_ports": collectors.NewInfiniBandMetrics(*f.sysRoot), "host": collectors.NewHostMetrics(procRoot, *f.sysRoot)}
	if gpu != nil {
		scrapers["gpu"] = collectors.NewGPUMetrics(gpu)
	}
	m.reg = exporters.NewRegistry(m.metrics, scrapers, log)
	if m.ln, err = net.Listen("tcp", *f.listen); err != nil {
		return nil, fmt.Errorf("--web.listen-address: %w", err)
	}
	if tcp, ok := m.ln.Addr().(*net.TCPAddr); ok && !tcp.IP.IsLoopback() {
		log.Warn("metrics are served beyond loopback", "address", m.ln.Addr().String())
	}
	return m, nil
}

// tee adds the metrics and the evaluator to the transfer stream.
func (m *metricsServer) tee(sink correlate.Sink) correlate.Sink {
	if m.metrics == nil {
		return sink
	}
	return correlate.Tee(sink, m.metrics, m.eval)
}

// serve starts serving and evaluating until ctx is done; the returned
// function waits for both to stop.
func (m *metricsServer) serve(ctx context.Context, ag *agent.Agent) (wait func()) {
	if m.metrics == nil {
		return func() {}
	}
	m.agent = ag
	m.eval.SetHostFindings(ag.HostJudge(m.procRoot, m.sysRoot, m.hostEach, m.log))
	ctx, cancel := context.WithCancel(ctx)
	mux := http.NewServeMux()
	mux.Handle(m.path, promhttp.InstrumentMetricHandler(m.reg, promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{
		ErrorLog: slog.NewLogLogger(m.log.Handler(), slog.LevelError), Registry: m.reg})))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintf(w, "<html><head><title>lanewatch</title></head><body><h1>lanewatch</h1><p><a href=%q>Metrics</a></p></body></html>\n", m.path)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{}, 2)
	go func() {
		defer func() { done <- struct{}{} }()
		if err := srv.Serve(m.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			m.log.Error("serve metrics", "err", err)
		}
	}()
	go func() {
		defer func() { done <- struct{}{} }()
		m.eval.Run(ctx)
	}()
	m.log.Info("serving metrics", "address", m.ln.Addr().String(), "path", m.path)
	return func() {
		cancel()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			m.log.Warn("stop metrics server", "err", err)
		}
		<-done
		<-done
		if m.gpu != nil {
			if err := m.gpu.Close(); err != nil {
				m.log.Warn("close GPU counters", "err", err)
			}
		}
	}
}

func (m *metricsServer) health() exporters.Health {
	if m.agent == nil {
		return exporters.Health{}
	}
	st := m.agent.Stats()
	return exporters.Health{Events: st.Events, Drops: st.Drops, AttachedProbes: m.agent.AttachedProbes(),
		AttachFailures: st.AttachFailures, Pending: m.agent.Pending()}
}

// publish hands a verdict to the metrics and logs the findings it holds.
func (m *metricsServer) publish(v agent.Verdict) {
	w := exporters.Window{At: v.At, Duration: v.Took, Findings: v.Findings}
	for _, l := range v.Lanes {
		w.Lanes = append(w.Lanes, exporters.Lane{GPU: l.GPU, Direction: l.Direction, Demand: l.Demand, Capacity: l.Capacity,
			Measured: l.Measured, Unattributed: l.Unattributed, HasMeasured: l.HasMeasured})
	}
	m.metrics.SetWindow(w)
	if m.onVerdict != nil {
		m.onVerdict(v)
	}
	for _, f := range v.Findings {
		m.log.Info("finding", "rule", f.Rule, "severity", f.Severity, "subject", f.Subject, "summary", f.Summary)
	}
}
