// Command agent is lanewatch: it traces host↔device transfers of CUDA
// processes with eBPF uprobes and says, per transfer, who submitted it, which
// way it went, how many bytes, and what kind of host memory it used.
package main

import (
	"context"
	"encoding/json"
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

	"github.com/lanewatch/lanewatch/collectors"
	"github.com/lanewatch/lanewatch/selftest"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

const usage = `lanewatch agent: per-transfer observability for the data paths of LLM inference servers.

Usage:
  agent run      [flags]   trace every CUDA process on this host, one JSON record per transfer
  agent diagnose [flags]   one-shot checklist: topology, links, IOMMU, NUMA, pools, and (--sample) live transfers
  agent topo     [flags]   the GPU/NIC/NVMe relation matrix and the GPU → nearest RDMA device map
  agent top      [flags]   a terminal view of a running agent: lane rates, top processes, requests, findings
  agent selftest [flags]   run the bundled reference KV data path under the probes and check every record
  agent selftest --replay [--json] FILE...
                           replay PyTorch profiler (Kineto) traces through the reference runtime under the probes
  agent probes   LIB...    where each probe-table symbol of a library is probed (or that it is absent)
  agent version            print the version

Run 'agent COMMAND -h' for the flags of a command. run, selftest and diagnose
--sample need CAP_BPF and CAP_PERFMON (BPF programs, uprobes, tracepoints); for
processes of other users (or holding capabilities the agent lacks) also
CAP_SYS_PTRACE (their maps and libraries: to trace them at all) and
CAP_DAC_READ_SEARCH (their environment: which GPU); CAP_CHECKPOINT_RESTORE for
libraries replaced on disk since they were mapped. Not root. On kernels before
5.11 also CAP_SYS_RESOURCE (RLIMIT_MEMLOCK). Each one missing is named at start.
`

func main() {
	os.Exit(realMain(os.Args[1:], os.Stdout, os.Stderr))
}

func realMain(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	for _, c := range commands {
		if c.name == args[0] {
			return c.run(args[1:], stdout, stderr)
		}
	}
	switch args[0] {
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

// commands are the commands with flags, in the usage's order: each makes
// its flag set and parses it before it checks or does anything else.
var commands = []struct {
	name string
	run  func(args []string, stdout, stderr io.Writer) int
}{{"run", cmdRun}, {"diagnose", cmdDiagnose}, {"topo", cmdTopo}, {"top", cmdTop}, {"selftest", cmdSelftest}, {"probes", cmdProbes}}

// flagSet is a command's flag set with the text its usage opens with.
type flagSet struct {
	*flag.FlagSet
	about string
}

// describeFlags, when set, is handed each command's flag set at parse,
// which then parses nothing and stops the command: docs/flags.md is written
// from the flag sets themselves so (docs_test.go), each command run up to
// its parse and no further.
var describeFlags func(fs *flagSet)

// newFlagSet makes a command's flag set with its usage text and the
// --log.level flag every command has.
func newFlagSet(name, defaultLevel string, stderr io.Writer, about string) *flagSet {
	fs := &flagSet{flag.NewFlagSet(name, flag.ContinueOnError), about}
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
func parse(fs *flagSet, args []string, stderr io.Writer) (*slog.Logger, int) {
	if describeFlags != nil {
		describeFlags(fs)
		return nil, 0
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, 0 // asked for: the usage is the answer
		}
		return nil, 2
	}
	var l slog.Level
	if err := l.UnmarshalText([]byte(fs.Lookup("log.level").Value.String())); err != nil {
		fmt.Fprintf(stderr, "--log.level: %v\n", err)
		return nil, 2
	}
	return slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: l})), 0
}

func cmdSelftest(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("selftest", "warn", stderr, "Runs every scenario of the reference KV data path under the real probes and compares\nwhat the agent saw with the scenario's ground truth, record by record. Exits 1 on any\nmismatch or drop.\n\n"+
		"agent selftest --replay [--json] FILE... replays PyTorch profiler (Kineto) traces, .json or\n"+
		".json.gz, instead: each trace's CUDA calls, thread by thread with their original gaps, are\n"+
		"made again through the reference runtime (copies from the host memory CUPTI recorded,\n"+
		"kernels and graph launches lasting their GPU time, memsets, events, stream waits and\n"+
		"syncs, on as many streams) while the agent watches. It prints per trace CUPTI's copies\n"+
		"by direction and host memory beside the agent's records, and the findings; --json one\n"+
		"object per trace. A trace's NAME.expect.json, where present, gives its expected verdicts.")
	refDir := fs.String("refpath", defaultRefDir(), "build directory of the reference data path (make -C refpath)")
	live := fs.Bool("live", false, "print a line per second: the copies the agent reported, GB/s per GPU link and direction, the rows finished and the rules they raised")
	scenarios := fs.String("scenarios", strings.Join(selftest.Scenarios, ","), "comma-separated CUDA scenarios to run after late-attach")
	rdma := fs.String("rdma", strings.Join(selftest.RDMAScenarios, ","), "comma-separated RDMA scenarios (two processes each); empty for none")
	pairs := fs.String("pairs", strings.Join(selftest.PairScenarios, ","), "comma-separated scenarios of two kvpath processes on one shared reference GPU; empty for none")
	xfer := fs.String("xfer", strings.Join(selftest.XferScenarios, ","), "comma-separated transfer-library lane rows: a UCX client's puts as the UCX probes will report them (shaped records), judged on an injected host with or without RDMA NICs by the GPU (kv-transfer-tcp-fallback, kv-transfer-far-device must fire where designed, nothing else); empty for none")
	kernelCopy := fs.Bool("kernel-copy", true, "run the copy-kernel stand-in and read its GPU counters through the reference NVML library")
	noDevice := fs.Bool("no-device", true, "run no-device on each runtime build: cuInit fails, every runtime call fails before the driver, and the agent must attach the runtime layer to report them")
	linkTrain := fs.Bool("link-train", true, "run link-trains-up: a reference GPU whose NVML link idles at Gen1 and trains to its maximum under load; the lane capacity must be the trained maximum and no link or overlap finding appear")
	storage := fs.Bool("storage", true, "run storage-load twice: layers read O_DIRECT from a file on this machine's disk into the registered pool, then H2D, the file's device placed on the pool's node (storage-far-pool must not fire) and on another (it must); and storage-writeback twice, file reads beside D2H with the disk and a reference GPU placed under one switch (storage-shared-uplink must fire) and apart (it must not)")
	tpWorkers := fs.Bool("tp-workers", true, "run tp-workers on each runtime build: worker processes that each see every reference GPU and choose theirs per thread, every copy's GPU compared")
	replay := fs.Bool("replay", false, "replay the Kineto traces named after the flags instead of the scenarios (see above)")
	asJSON := fs.Bool("json", false, "with --replay: one JSON object per trace: trace, cupti and agent copies by direction/host memory, in_graphs, findings")
	maxGap := fs.Duration("max-gap", selftest.DefaultReplayMaxGap, "with --replay: the longest idle stretch of a trace kept (longer ones are cut to it); 0 keeps all")
	log, code := parse(fs, args, stderr)
	if log == nil {
		return code
	}
	var files []string // flags may follow the files too
	for rest := fs.Args(); len(rest) > 0; {
		if strings.HasPrefix(rest[0], "-") {
			if err := fs.Parse(rest); err != nil {
				return 2
			}
			rest = fs.Args()
			continue
		}
		files, rest = append(files, rest[0]), rest[1:]
	}
	if len(files) > 0 != *replay {
		fmt.Fprintln(stderr, "selftest: trace files go with --replay, and --replay needs at least one")
		return 2
	}
	if !checkPrivileges(stderr, "selftest", log) {
		return 1
	}
	if *replay {
		return replayTraces(files, *refDir, *live, *asJSON, *maxGap, log, stdout, stderr)
	}
	cfg := selftest.Config{RefDir: *refDir, Out: stdout, Logger: log, Scenarios: splitList(*scenarios), RDMA: splitList(*rdma), Pairs: splitList(*pairs), Xfer: splitList(*xfer), KernelCopy: *kernelCopy,
		NoDevice: *noDevice, TPWorkers: *tpWorkers, Storage: *storage}
	if *linkTrain {
		cfg.LinkTrains = []selftest.LinkTrain{selftest.LinkTrainsUp}
	}
	var drivers *os.File
	if *live {
		cfg.Live = stdout
		drivers = openDriversLog(log)
		cfg.Drivers = drivers
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer cancel()
	results, stats, err := selftest.Run(ctx, cfg)
	ok := selftest.PrintResults(stdout, results, stats)
	fmt.Fprintln(stdout, stats.GPUCounters)
	if st, err := collectors.ReadStatus("/proc", os.Getpid()); err == nil {
		fmt.Fprintf(stdout, "agent peak RSS %.1f MiB\n", float64(st.PeakRSSBytes)/(1<<20))
	}
	sayDriversLog(stdout, drivers, err != nil || !ok)
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

// replayTraces is `agent selftest --replay`.
func replayTraces(files []string, refDir string, live, asJSON bool, maxGap time.Duration, log *slog.Logger, stdout, stderr io.Writer) int {
	cfg := selftest.Config{RefDir: refDir, Logger: log}
	var drivers *os.File
	if live {
		cfg.Live = stdout
		drivers = openDriversLog(log)
		cfg.Drivers = drivers
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer cancel()
	results, stats, err := selftest.Replay(ctx, cfg, files, maxGap)
	ok := true
	if asJSON {
		enc := json.NewEncoder(stdout)
		for _, r := range results {
			ok = ok && r.OK()
			if err := enc.Encode(r); err != nil {
				fmt.Fprintln(stderr, "selftest:", err)
				return 1
			}
		}
	} else {
		ok = selftest.PrintReplay(stdout, results, stats)
	}
	sayDriversLog(stderr, drivers, err != nil || !ok) // stderr: --json's stdout is its objects alone
	if err != nil {
		fmt.Fprintln(stderr, "selftest:", err)
		return 1
	}
	if !ok {
		fmt.Fprintln(stderr, "selftest --replay: FAILED")
		return 1
	}
	return 0
}

// driversFailedLines is how many of the scenario drivers' last lines a
// failed --live run shows after its table; the file has them all.
const driversFailedLines = 40

// openDriversLog makes the file that --live gives the scenario drivers'
// own lines (the rates they measured, their errors), so that the live view
// has the screen; nil, and the lines on stderr, when it cannot.
func openDriversLog(log *slog.Logger) *os.File {
	f, err := os.CreateTemp("", "lanewatch-selftest-drivers-*.log")
	if err != nil {
		log.Warn("the scenario drivers' lines go to stderr", "err", err)
		return nil
	}
	return f
}

// sayDriversLog closes the drivers' file and names it, with its last lines
// when the run failed: a driver's error explains its row.
func sayDriversLog(w io.Writer, f *os.File, failed bool) {
	if f == nil {
		return
	}
	f.Close()
	b, err := os.ReadFile(f.Name())
	if err != nil {
		fmt.Fprintf(w, "scenario drivers' output: %v\n", err)
		return
	}
	var lines []string
	if s := strings.TrimSuffix(string(b), "\n"); s != "" {
		lines = strings.Split(s, "\n")
	}
	fmt.Fprintf(w, "scenario drivers' output (%d lines): %s\n", len(lines), f.Name())
	if !failed {
		return
	}
	from := max(0, len(lines)-driversFailedLines)
	if from > 0 {
		fmt.Fprintf(w, "  (its last %d lines:)\n", len(lines)-from)
	}
	for _, l := range lines[from:] {
		fmt.Fprintf(w, "  %s\n", l)
	}
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
