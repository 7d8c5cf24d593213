// Command agent is lanewatch: it traces host↔device transfers of CUDA
// processes with eBPF uprobes and says, per transfer, who submitted it, which
// way it went, how many bytes, and what kind of host memory it used.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/lanewatch/lanewatch/agent"
	"github.com/lanewatch/lanewatch/exporters"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

const usage = `lanewatch agent: per-transfer observability for the data paths of LLM inference servers.

Usage:
  agent run      [flags]   trace every CUDA process on this host, one JSON record per transfer
  agent diagnose [flags]   one-shot checklist: topology, links, IOMMU, NUMA, pools, and (--sample) live transfers
  agent topo     [flags]   the GPU/NIC/NVMe relation matrix and the GPU → nearest RDMA device map
  agent selftest [flags]   run the bundled reference KV data path under the probes and check every record
  agent version            print the version

Run 'agent COMMAND -h' for the flags of a command. run, selftest and diagnose
--sample need root (CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN for /proc/PID/root).
`

func main() {
	os.Exit(realMain(os.Args[1:], os.Stdout, os.Stderr))
}

func realMain(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "run":
		return cmdRun(args[1:], stdout, stderr)
	case "selftest":
		return cmdSelftest(args[1:], stdout, stderr)
	case "diagnose":
		return cmdDiagnose(args[1:], stdout, stderr)
	case "topo":
		return cmdTopo(args[1:], stdout, stderr)
	case "version":
		fmt.Fprintln(stdout, "lanewatch", version)
		return 0
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	fmt.Fprintf(stderr, "agent: unknown command %q\n\n%s", args[0], usage)
	return 2
}

// pidList is a repeatable/comma-separated --pid flag.
type pidList []int

func (p *pidList) String() string {
	s := make([]string, len(*p))
	for i, v := range *p {
		s[i] = strconv.Itoa(v)
	}
	return strings.Join(s, ",")
}

func (p *pidList) Set(v string) error {
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return fmt.Errorf("not a process id: %q", f)
		}
		*p = append(*p, n)
	}
	return nil
}

// stringList is a repeatable --lib flag.
type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

// newFlagSet makes a command's flag set with its usage text and the
// --log.level flag every command has.
func newFlagSet(name, defaultLevel string, stderr io.Writer, about string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.String("log.level", defaultLevel, "log level: debug, info, warn, error")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: agent %s [flags]\n\n%s\n\nFlags:\n", name, about)
		fs.PrintDefaults()
	}
	return fs
}

// parse parses the flags and builds the logger; a nil logger means exit
// with the returned code (bad flags, or -h).
func parse(fs *flag.FlagSet, args []string, stderr io.Writer) (*slog.Logger, int) {
	if err := fs.Parse(args); err != nil {
		return nil, 2
	}
	var l slog.Level
	if err := l.UnmarshalText([]byte(fs.Lookup("log.level").Value.String())); err != nil {
		fmt.Fprintf(stderr, "--log.level: %v\n", err)
		return nil, 2
	}
	return slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: l})), 0
}

func cmdRun(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("run", "info", stderr, "Attaches uprobes to every CUDA runtime/driver library mapped by a process\n(and to libraries loaded later), writes one JSON record per host↔device transfer,\nand detaches cleanly on SIGINT/SIGTERM.")
	var pids pidList
	var libs stringList
	fs.Var(&pids, "pid", "trace only these processes (repeatable or comma-separated); default: every process that maps a CUDA library, now or later")
	fs.Var(&libs, "lib", "also probe this ELF file at start (repeatable), before any process maps it")
	output := fs.String("output", "-", "where to write JSONL transfer records (- for stdout)")
	procRoot := fs.String("path.procfs", "/proc", "procfs mount point")
	rescan := fs.Duration("rescan-interval", 10*time.Second, "how often every process's mappings are rescanned, besides the dynamic linker's notifications")
	ring := fs.Uint("ring-bytes", 0, "BPF ring buffer size in bytes, a power of two (0: 4 MiB)")
	record := fs.String("record", "", "also write every raw probe event to this file (120-byte records of bpf/lanewatch.h's struct lw_event), for offline replay")
	mf := addMetricsFlags(fs)
	of := addOTelFlags(fs)
	log, code := parse(fs, args, stderr)
	if log == nil {
		return code
	}
	var rec io.Writer
	if *record != "" {
		f, err := os.Create(*record)
		if err != nil {
			log.Error("open record file", "err", err)
			return 1
		}
		defer f.Close()
		bw := bufio.NewWriterSize(f, 1<<20)
		defer bw.Flush()
		rec = bw
	}
	out := stdout
	if *output != "-" {
		f, err := os.Create(*output)
		if err != nil {
			log.Error("open output", "err", err)
			return 1
		}
		defer f.Close()
		out = f
	}
	sink := exporters.NewJSONL(out)
	var paths exporters.PathResolver
	if p, err := agent.NewPaths(*procRoot, *mf.sysRoot); err != nil {
		log.Warn("transfer spans without topology", "err", err)
	} else {
		paths = p
	}
	ot, err := of.start(log, paths)
	if err != nil {
		log.Error("traces", "err", err)
		return 1
	}
	defer ot.stop()
	mx, err := mf.start(log, *procRoot)
	if err != nil {
		log.Error("metrics", "err", err)
		return 1
	}
	mx.onVerdict = ot.verdict
	ag, err := agent.New(agent.Config{
		ProcRoot: *procRoot, PIDs: pids, Libs: libs, RescanInterval: *rescan,
		RingBytes: uint32(*ring), Record: rec, Sink: ot.tee(mx.tee(sink)), Logger: log,
		OnReady: func() { log.Info("lanewatch running: probes attached", "version", version, "output", *output) },
	})
	if err != nil {
		log.Error("start", "err", err)
		return 1
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer cancel()
	defer mx.serve(ctx, ag)()
	// Records reach the output within a second even when transfers are rare.
	flushDone := make(chan struct{})
	go func() {
		defer close(flushDone)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if err := sink.Flush(); err != nil {
					log.Error("write output", "err", err)
				}
			}
		}
	}()
	runErr := ag.Run(ctx)
	otErr := ot.stop() // every transfer is out of the engine: export the held spans
	cancel()
	<-flushDone
	flushErr := sink.Flush()
	st := ag.Stats()
	log.Info("summary", "events", st.Events, "transfers", st.Engine.Transfers, "drops", st.Drops.Total(),
		"ring_full", st.Drops.RingFull, "lost_returns", st.Drops.NoEntry, "batch_truncated", st.Drops.BatchTrunc,
		"read_faults", st.Drops.ReadFault)
	if rs := ag.RDMAStats(); rs.WorkRequests > 0 {
		log.Info("rdma", "work_requests", rs.WorkRequests, "completions", rs.Completions, "by_status", fmt.Sprint(rs.ByStatus),
			"unmatched_completions", rs.Unmatched, "never_completed", rs.Evicted)
		for _, l := range ag.RDMALatency() {
			log.Info("rdma posted→completed", "pid", l.PID, "qp", l.QPNum, "opcode", l.Opcode, "count", l.Count,
				"p50", time.Duration(l.P50), "p99", time.Duration(l.P99), "in_flight", l.InFlight)
		}
	}
	if err := errors.Join(runErr, flushErr, otErr); err != nil {
		log.Error("stopped", "err", err)
		return 1
	}
	log.Info("stopped: every probe detached")
	return 0
}

func cmdSelftest(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("selftest", "warn", stderr, "Runs every scenario of the reference KV data path under the real probes and compares\nwhat the agent saw with the scenario's ground truth, record by record. Exits 1 on any\nmismatch or drop.")
	refDir := fs.String("refpath", defaultRefDir(), "build directory of the reference data path (make -C refpath)")
	live := fs.Bool("live", false, "print every transfer as the agent reports it")
	scenarios := fs.String("scenarios", strings.Join(agent.Scenarios, ","), "comma-separated CUDA scenarios to run after late-attach")
	rdma := fs.String("rdma", strings.Join(agent.RDMAScenarios, ","), "comma-separated RDMA scenarios (two processes each); empty for none")
	kernelCopy := fs.Bool("kernel-copy", true, "run the copy-kernel stand-in and read its GPU counters through the reference NVML library")
	log, code := parse(fs, args, stderr)
	if log == nil {
		return code
	}
	cfg := agent.SelftestConfig{RefDir: *refDir, Out: stdout, Logger: log, Scenarios: splitList(*scenarios), RDMA: splitList(*rdma), KernelCopy: *kernelCopy}
	if *live {
		cfg.Live = stdout
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer cancel()
	results, stats, err := agent.Selftest(ctx, cfg)
	ok := agent.PrintResults(stdout, results, stats)
	fmt.Fprintln(stdout, stats.GPUCounters)
	if rss, rerr := peakRSS(); rerr == nil {
		fmt.Fprintf(stdout, "agent peak RSS %.1f MiB\n", float64(rss)/(1<<20))
	}
	if err != nil {
		fmt.Fprintln(stderr, "selftest:", err)
		return 1
	}
	if !ok {
		fmt.Fprintln(stdout, "selftest FAILED")
		return 1
	}
	fmt.Fprintln(stdout, "selftest passed")
	return 0
}

// splitList splits a comma-separated flag; empty means none (not nil, which
// would mean "the defaults").
func splitList(s string) []string {
	out := []string{}
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// defaultRefDir finds refpath/build next to the binary (bin/agent) or in the
// working directory.
func defaultRefDir() string {
	if exe, err := os.Executable(); err == nil {
		d := filepath.Join(filepath.Dir(exe), "..", "refpath", "build")
		if _, err := os.Stat(d); err == nil {
			return filepath.Clean(d)
		}
	}
	return filepath.Join("refpath", "build")
}

// peakRSS reads VmHWM from /proc/self/status, in bytes.
func peakRSS() (uint64, error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb * 1024, err
		}
	}
	return 0, errors.New("no VmHWM in /proc/self/status")
}
