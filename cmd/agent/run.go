package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/lanewatch/lanewatch/agent"
	"github.com/lanewatch/lanewatch/exporters"
	"github.com/lanewatch/lanewatch/judge"
	"github.com/lanewatch/lanewatch/otlpbridge"
	"github.com/lanewatch/lanewatch/probes"
)

func cmdRun(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("run", "info", stderr, "Attaches uprobes to every CUDA runtime/driver library mapped by a process\n(and to libraries loaded later), writes one JSON record per host↔device transfer,\nand detaches cleanly on SIGINT/SIGTERM.")
	var pids pidList
	var libs, rules, kvKernels stringList
	fs.Var(&pids, "pid", "trace only these processes (repeatable or comma-separated); default: every process that maps a CUDA library, now or later")
	fs.Var(&libs, "lib", "also probe this ELF file at start (repeatable), before any process maps it")
	output := fs.String("output", "-", "where to write JSONL transfer records (- for stdout; off: none, and no record is encoded — the DaemonSet's setting, whose records are read from /metrics and spans)")
	procRoot := fs.String("path.procfs", "/proc", "procfs mount point")
	sysRoot := fs.String("path.sysfs", "/sys", "sysfs mount point (GPU placement, link capacity, RDMA ports)")
	rootFS := fs.String("path.rootfs", "/", "the host's root filesystem, where the CUDA driver library is looked for at start and probed before any process maps it: what its /etc/ld.so.cache resolves libcuda.so.1 to, the driver's usual directories, the GPU operator's /run/nvidia/driver (- : none)")
	rescan := fs.Duration("rescan-interval", 10*time.Second, "how often every process's mappings are rescanned, besides the dynamic linker's notifications")
	ring := fs.Uint("ring-bytes", 0, fmt.Sprintf("BPF ring buffer size in bytes, a power of two from a page to %d (0: 4 MiB)", maxRingBytes))
	memLimit := fs.String("memory-limit", "", fmt.Sprintf("the agent's memory ceiling, as GOMEMLIMIT writes it (512MiB, 2GiB, off); the Go runtime's soft limit is set to it less the BPF ring (twice) and 64 MiB for C libraries, and bounded parts size their budgets from it (default %d MiB, 4.5x the peak make rss measures; GOMEMLIMIT when set)", defaultMemoryLimit>>20))
	record := fs.String("record", "", fmt.Sprintf("also write every raw probe event to this file (%d-byte records of bpf/lanewatch.h's struct lw_event), for offline replay", probes.EventSize))
	kernels := fs.Bool("kernels", false, "probe kernel launches (cuLaunchKernel[Ex][_ptsz]) and the calls naming kernels: launches of KV-transfer kernels (HiCache's kernel I/O backend) become transfers moved by SMs, op kernel_copy, and the others are the compute the H2D loads must overlap (lanewatch_copy_compute_overlap_ratio, serialized-load; unknown without them). Off by default: every kernel launch of every traced process then costs one entry+return pair (+1.6–2.1 µs per launch on the reference path's VM, make bench; docs/design.md, \"Kernel movers\")")
	storageReads := fs.Bool("trace-storage-reads", false, "trace the read, pread64, preadv and preadv2 of the traced processes: which block device and which buffer (registered pool or not, its NUMA node) each read filled, for storage-far-pool and checklist item 6. Off by default: its program runs at the exit of every system call on the host (+≈0.1 µs per call measured on the reference path's VM, ≈1–2 µs per watched read; docs/design.md, \"The storage leg\"); io_uring and GPUDirect Storage reads are not seen")
	singleStep := fs.Bool("allow-single-step", false, "on arm64, also probe functions whose first instruction the kernel single-steps rather than simulates (refused by default: single-stepped uprobes have corrupted probed processes on Grace hosts; docs/operating.md \"Probe sites on arm64\"). No effect on x86-64")
	pprofAddr := fs.String("debug.pprof", "", "serve Go's profiles (net/http/pprof: /debug/pprof/profile, heap, goroutine …) on this address (\"\": off); loopback only, e.g. 127.0.0.1:6060: the profiles name code and memory, and a CPU profile costs the agent while it runs")
	fs.Var(&kvKernels, "kv-kernels", "with --kernels, a `pattern` of KV-transfer kernels: a regular expression over the kernel's demangled function name (repeatable; replaces the default, sgl-kernel's ^transfer_kernel_impl$ and ^transfer_page_head_kernel_impl$)")

	var mc agent.MetricsConfig
	fs.StringVar(&mc.Listen, "web.listen-address", "127.0.0.1:9464", "address to serve Prometheus metrics on (loopback only by default; \"\" disables metrics and the evaluator)")
	fs.StringVar(&mc.Path, "web.telemetry-path", "/metrics", "path under which metrics are served")
	fs.DurationVar(&mc.EvaluateInterval, "evaluate-interval", judge.DefaultEvaluateInterval,
		"how often the last interval's transfers are judged (pageable copies, fragmentation, same-direction overlap, RDMA congestion per port and queue pair) into lanewatch_findings")
	fs.DurationVar(&mc.HostCheckInterval, "host-check-interval", time.Minute,
		"how often the host and process checks of `agent diagnose` (links, IOMMU, NUMA binding, pool placement, pinned memory) refresh their findings")
	fs.Float64Var(&mc.ReadyMaxDropRatio, "ready.max-drop-ratio", agent.DefaultReadyMaxDropRatio,
		"/readyz fails while more than this share of the probe events since its previous check were dropped or damaged (beside /metrics, with /healthz)")
	fs.StringVar(&mc.GPU.Source, "gpu-counters", "auto", "GPU link counters: auto (DCGM, else NVML), dcgm, nvml or off; read once per evaluation")
	fs.StringVar(&mc.GPU.NVMLLibrary, "nvml.library", "libnvidia-ml.so.1", "the NVML library to load at run time")
	fs.StringVar(&mc.TopoM, "topo-m", "", "a `file` holding this host's nvidia-smi topo -m output: peer copies (D2D between GPUs) over the NVLinks it shows are kept off the PCIe lanes, the others are PCIe lane demand; without it, peer copies are on no lane (path unknown)")
	fs.StringVar(&mc.GPU.DCGMAddress, "dcgm.address", "", "a standalone nv-hostengine (host:port); empty starts an embedded host engine")

	var tc agent.TracesConfig
	fs.StringVar(&tc.GRPCListen, "otlp.grpc-listen", otlpbridge.DefaultGRPCListen, "receive the inference server's OTLP traces over gRPC here (\"\": off); forwarded unchanged to OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT")
	fs.StringVar(&tc.HTTPListen, "otlp.http-listen", otlpbridge.DefaultHTTPListen, "receive OTLP/HTTP traces (POST /v1/traces, protobuf or JSON) here (\"\": off)")
	spans := fs.String("spans", string(exporters.SpansBatched), "transfer spans: per-transfer, batched (one span per run of transfers with the same stream, direction, layer and request), summary (no transfer spans: one lanewatch.kv span per request sums its transfers up) or off; every mode but off also makes the lanewatch.kv span of each request")
	fs.BoolVar(&tc.ExportUnattributed, "spans.export-unattributed", false, "also make spans of transfers no request the server sampled covers (servers export only sampled requests: at 1% sampling these would be 99% of the spans); off, they are counted in lanewatch_span_withheld_transfers_total. Without an OTLP receiver no transfer can be attributed and all are exported")
	fs.DurationVar(&tc.Hold, "spans.hold", 15*time.Second, "how long a transfer waits for the server's spans before it is attributed")
	fs.DurationVar(&tc.MaxHold, "spans.max-hold", 5*time.Minute, "how long a transfer waits at most, past --spans.hold, while a request that may cover it is still open (servers export a request's spans when it ends); the held transfers stay within their budget")
	fs.DurationVar(&tc.Index.Window, "otlp.index-window", 2*time.Minute, "how long received spans are kept for attribution after they end (an end later than arrival + this is clamped to it)")
	fs.IntVar(&tc.Index.MaxSpans, "otlp.index-max-spans", 0,
		"things the span index keeps at most: spans, request names, rooms, open requests (the oldest are evicted and counted; 0: --otlp.index-max-bytes alone)")
	indexBytes := fs.String("otlp.index-max-bytes", "",
		"the span index's memory budget (estimated), as --memory-limit writes it; the oldest are evicted and counted (default an eighth of --memory-limit, 64MiB without one)")
	maxBody := fs.String("otlp.max-body", "", fmt.Sprintf("the largest OTLP request taken, as received and decompressed, as --memory-limit writes sizes; larger ones get HTTP 413 / gRPC ResourceExhausted (default %d MiB, less when a quarter of --memory-limit cannot decode one that size: %dx it)",
		otlpbridge.DefaultMaxBody>>20, otlpbridge.BodyCost+otlpbridge.CostPerByte))
	fs.IntVar(&tc.Limits.MaxConcurrent, "otlp.max-concurrent", otlpbridge.DefaultMaxConcurrent, "OTLP requests read and decoded at once, over both receivers; more, or more than a quarter of --memory-limit can decode, get HTTP 429 / gRPC ResourceExhausted, which OTLP senders retry")
	fs.IntVar(&tc.Limits.MaxConnections, "otlp.max-connections", otlpbridge.DefaultMaxConnections, "open connections each OTLP receiver serves; more wait in the kernel's listen backlog")
	fs.DurationVar(&tc.Limits.ReadTimeout, "otlp.read-timeout", otlpbridge.DefaultReadTimeout, "time an OTLP sender has to send a request (headers and body; gRPC: the call); idle connections are closed after it too")
	fs.Var(&rules, "otlp.rule", "attribution rule replacing the built-in SGLang/vLLM ones (repeatable, first match wins): "+otlpbridge.RuleSyntax)
	log, code := parse(fs, args, stderr)
	if log == nil {
		return code
	}
	flagErr := errors.Join(checkRoot("path.procfs", *procRoot), checkRoot("path.sysfs", *sysRoot), checkRootFS(*rootFS), checkLibs(libs), checkRing(*ring),
		positive("rescan-interval", *rescan), notNegative("host-check-interval", mc.HostCheckInterval), positive("spans.hold", tc.Hold),
		positive("spans.max-hold", tc.MaxHold), positive("otlp.index-window", tc.Index.Window), positive("evaluate-interval", mc.EvaluateInterval))
	if r := mc.ReadyMaxDropRatio; !(r > 0 && r <= 1) {
		flagErr = errors.Join(flagErr, fmt.Errorf("--ready.max-drop-ratio %g: must be in (0, 1]", r))
	}
	if tc.Index.MaxSpans < 0 {
		flagErr = errors.Join(flagErr, fmt.Errorf("--otlp.index-max-spans %d: must not be negative", tc.Index.MaxSpans))
	}
	if *indexBytes != "" {
		var err error
		tc.Index.MaxBytes, err = parseSize(*indexBytes)
		switch {
		case err != nil:
			flagErr = errors.Join(flagErr, fmt.Errorf("--otlp.index-max-bytes %w", err))
		case tc.Index.MaxBytes == 0:
			flagErr = errors.Join(flagErr, fmt.Errorf("--otlp.index-max-bytes 0: must be positive"))
		case tc.Index.MaxBytes == math.MaxInt64 && tc.Index.MaxSpans == 0:
			flagErr = errors.Join(flagErr, fmt.Errorf("--otlp.index-max-bytes off: needs --otlp.index-max-spans, or nothing bounds the index"))
		}
	}
	flagErr = errors.Join(flagErr, positiveInt("otlp.max-concurrent", tc.Limits.MaxConcurrent), positiveInt("otlp.max-connections", tc.Limits.MaxConnections),
		positive("otlp.read-timeout", tc.Limits.ReadTimeout))
	if *maxBody != "" {
		n, err := parseSize(*maxBody)
		switch {
		case err != nil:
			flagErr = errors.Join(flagErr, fmt.Errorf("--otlp.max-body %w", err))
		case n < 1024 || n > math.MaxInt32:
			flagErr = errors.Join(flagErr, fmt.Errorf("--otlp.max-body %s: want from 1KiB to 2GiB", *maxBody))
		default:
			tc.Limits.MaxBody = n
		}
	}
	if flagErr == nil {
		flagErr = checkPIDs(*procRoot, pids)
	}
	if code := usageErrors(stderr, "run", flagErr); code != 0 {
		return code
	}
	limit, goLimit, limitSource, err := applyMemoryLimit(*memLimit, uint64(*ring))
	if err != nil {
		return usageErrors(stderr, "run", err)
	}
	log.Info("memory limit", "bytes", limit, "go_soft_limit", goLimit, "from", limitSource)
	if tc.GRPCListen != "" || tc.HTTPListen != "" {
		if err := otlpLimits(&tc.Limits, limit); err != nil {
			return usageErrors(stderr, "run", err)
		}
	}
	if tc.Spans, err = exporters.ParseSpanMode(*spans); err != nil {
		fmt.Fprintf(stderr, "--spans: %v\n", err)
		return 2
	}
	for _, s := range rules {
		r, err := otlpbridge.ParseRule(s)
		if err != nil {
			fmt.Fprintf(stderr, "--otlp.rule: %v\n", err)
			return 2
		}
		tc.Index.Rules = append(tc.Index.Rules, r)
	}
	var kv []string // nil: the default set
	if len(kvKernels) > 0 {
		kv = kvKernels
	}
	if _, err := agent.KVKernelSet(kv); err != nil {
		fmt.Fprintf(stderr, "--kv-kernels: %v\n", err)
		return 2
	}
	if !checkPrivileges(stderr, "run", log) {
		return 1
	}
	if tc.Upstream, err = otlpbridge.UpstreamFromEnv(nil); err != nil {
		log.Error("traces", "err", err)
		return 1
	}
	cfg := agent.RunConfig{
		Trace: agent.Config{ProcRoot: *procRoot, RootFS: *rootFS, PIDs: pids, Libs: libs, RescanInterval: *rescan, RingBytes: uint32(*ring),
			Kernels: *kernels, KVKernels: kv, AllowSingleStep: *singleStep},
		Output:  stdout,
		SysRoot: *sysRoot, Version: version, Logger: log, Metrics: mc, Traces: tc, MemoryLimit: limit, TraceStorageReads: *storageReads,
		OnReady: func() { log.Info("lanewatch running: probes attached", "version", version, "output", *output) },
	}
	if *record != "" {
		f, err := os.Create(*record)
		if err != nil {
			log.Error("open record file", "err", err)
			return 1
		}
		defer f.Close()
		bw := bufio.NewWriterSize(f, 1<<20)
		defer bw.Flush()
		cfg.Trace.Record = bw
	}
	if *pprofAddr != "" {
		stopProfiles, err := servePprof(*pprofAddr, log)
		if err != nil {
			log.Error("--debug.pprof", "err", err)
			return 1
		}
		defer stopProfiles()
	}
	switch *output {
	case "-":
	case "off", "":
		cfg.Output = nil
	default:
		f, err := os.Create(*output)
		if err != nil {
			log.Error("open output", "err", err)
			return 1
		}
		defer f.Close()
		cfg.Output = f
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer cancel()
	if err := agent.Run(ctx, cfg); err != nil {
		log.Error("stopped", "err", err)
		return 1
	}
	log.Info("stopped: every probe detached")
	return 0
}

// otlpLimits sizes the receivers' decode budget from the memory limit and,
// unless --otlp.max-body was given, the largest request from the budget;
// an explicit --otlp.max-body must fit it.
func otlpLimits(l *otlpbridge.Limits, memoryLimit int64) error {
	auto := l.MaxBody == 0
	if auto {
		l.MaxBody = otlpbridge.DefaultMaxBody
	}
	l.DecodeBudget = otlpbridge.DecodeBudgetFor(memoryLimit, *l)
	if auto {
		l.MaxBody = min(l.MaxBody, l.DecodeBudget/(otlpbridge.BodyCost+otlpbridge.CostPerByte))
	}
	return l.Check()
}

// servePprof serves Go's profiles on addr until stop; a failure to listen
// is the caller's to report.
func servePprof(addr string, log *slog.Logger) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Warn("--debug.pprof stopped serving", "err", err)
		}
	}()
	log.Info("serving Go profiles", "address", ln.Addr().String(), "path", "/debug/pprof/")
	return func() { srv.Close() }, nil
}
