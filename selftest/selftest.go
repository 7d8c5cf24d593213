// Package selftest proves the agent against the reference KV data path
// (refpath/): it runs every scenario under the real probes and compares what
// the agent reported with the scenario's ground truth, record by record,
// including RDMA work requests, the copy-kernel stand-in's GPU counters and
// the span output. It is the only package besides refpath that knows the
// reference path; production code learns its GPUs and lanes from it only
// through the placement the run configuration takes.
package selftest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/lanewatch/lanewatch/agent"
	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/selftest/refenv"
	"github.com/lanewatch/lanewatch/topology"
)

// Scenarios the selftest runs on each runtime build, after late-attach and
// late-pool-pages (PagesScenario).
var Scenarios = []string{"hicache-load", "pageable-load", "fragmented-load", "writeback-duplex",
	"h2d-overlap", "no-overlap", "big-and-trickle", "default-kind", "api-coverage", "failing-copies", "vmm-pool-managed",
	"inflight-serial", "inflight-queued",
	"layer-compute", "layer-compute-sync", "layer-compute-item", "decode-graphs",
	"decode-loop", "decode-loop-loads", "decode-item"}

// Runtimes are the two builds of the reference runtime: with and without a
// CET prologue, so both probe-site choices are exercised.
var Runtimes = []string{"plain", "cet"}

// Config locates the reference data path and says where to report.
type Config struct {
	RefDir    string    // refpath/build
	Out       io.Writer // the result table
	Live      io.Writer // a line per second of what the agent reported (live.go); nil for none
	Logger    *slog.Logger
	Scenarios []string // default Scenarios
	Runtimes  []string // default Runtimes
	RDMA      []string // default RDMAScenarios
	Pairs     []string // default PairScenarios
	// Xfer are the transfer-library lane rows (default XferScenarios):
	// shaped UCX records judged on an injected host (xferlane.go).
	Xfer []string
	// NoDevice runs the no-device scenario on each runtime build: a driver
	// whose cuInit fails, so every runtime call fails in the runtime and only
	// the runtime layer the agent then attaches can report it.
	NoDevice bool
	// KernelCopy runs the copy-kernel stand-in on a shared reference GPU
	// and reads its counters through the reference NVML library.
	KernelCopy bool
	// LinkTrains runs link-trains-up once per entry: a reference GPU whose
	// link idles below its maximum and trains up under load (or not), read
	// through the reference NVML library (linktrain.go).
	LinkTrains []LinkTrain
	// TPWorkers runs tp-workers on each runtime build: worker processes that
	// each see every reference GPU and choose theirs per thread; every copy's
	// GPU is compared.
	TPWorkers bool
	// Storage runs storage-load twice, its file's device placed on the
	// pool's node and on another (storage.go), with the storage tracer on,
	// and storage-writeback twice, the disk and a reference GPU placed under
	// one switch and apart (uplink.go).
	Storage bool
	Timeout time.Duration
	// Drivers gets the scenario drivers' own output: the rates they
	// measured, their errors. Nil is this process's stderr.
	Drivers io.Writer
}

// drivers is where the scenario drivers write.
func (c Config) drivers() io.Writer {
	if c.Drivers != nil {
		return c.Drivers
	}
	return os.Stderr
}

// Result is one row of the selftest table.
type Result struct {
	Scenario, Runtime   string
	PID                 uint32
	WantRecords, Got    int
	WantBytes, GotBytes uint64
	// WantFailed and GotFailed count the failed calls the scenario made and
	// the agent reported (copies or not), ErrorErrs the ones whose code or
	// call differs.
	WantFailed, GotFailed int
	ErrorErrs             int
	DirectionErrs         int
	MemoryErrs            int
	OtherErrs             int
	Drops                 uint64
	Latency               string // RDMA: posted→completed p50/p99, agent/truth
	Overlap               string // "flagged" or "none"
	OverlapErr            bool   // the agent's overlap verdict differs from the truth's
	// Raised is what the agent's judgement of the row raised at WARN or
	// FAIL, "rule/severity", each once, sorted.
	Raised   []string
	Problems []string
}

// raise adds the findings at WARN or FAIL to Raised.
func (r *Result) raise(fs ...correlate.Finding) {
	r.Raised = slices.Compact(slices.Sorted(slices.Values(append(r.Raised, raisedBy(fs)...))))
}

// OK reports whether the agent saw exactly what the scenario did.
func (r Result) OK() bool {
	problems := 0
	for _, p := range r.Problems {
		if !isFindingNote(p) {
			problems++
		}
	}
	return r.WantRecords == r.Got && r.WantBytes == r.GotBytes && r.WantFailed == r.GotFailed && r.ErrorErrs == 0 &&
		r.DirectionErrs == 0 && r.MemoryErrs == 0 && r.OtherErrs == 0 && r.Drops == 0 && !r.OverlapErr && problems == 0
}

// Collector is a sink that keeps every transfer by pid and signals process
// exits (give OnExit to the agent's Config), for the selftest and for the
// tests that compare the agent's records with a scenario's truth.
type Collector struct {
	mu    sync.Mutex
	byPID map[uint32][]correlate.Transfer
	live  *liveView // nil for none
	exits map[uint32]chan struct{}
	// runtimeLayer gets the runtime probe count of each process whose
	// driver failed to initialise, once the agent tried its runtime layer.
	runtimeLayer map[uint32]chan int
	exitedAt     map[uint32]time.Time // processes exited, not yet forgotten
	// lost counts, per process, its events that said it lost events
	// before them (OnCall): a row's drops are its own processes', never
	// those of other processes firing the same probes.
	lost map[uint32]uint64
	// providers: processes a verbs context of which the agent resolved.
	providers map[uint32]bool
	acts      activityLog // the engine's activities (computeoverlap.go)
}

// NewCollector returns an empty collector; live, when not nil, gets a line
// per second of the transfers that arrived in it (live.go) between
// StartLive and its stop.
func NewCollector(live io.Writer) *Collector {
	c := &Collector{byPID: map[uint32][]correlate.Transfer{}, exits: map[uint32]chan struct{}{},
		runtimeLayer: map[uint32]chan int{}, lost: map[uint32]uint64{},
		providers: map[uint32]bool{}}
	if live != nil {
		c.live = newLiveView(live)
	}
	return c
}

// StartLive starts the live view's lines; stop prints the last one and
// returns once it did. Without a live view both do nothing.
func (c *Collector) StartLive() (stop func()) {
	if c.live == nil {
		return func() {}
	}
	quit, done := make(chan struct{}), make(chan struct{})
	go c.live.run(quit, done)
	return func() { close(quit); <-done }
}

// finished tells the live view of a row.
func (c *Collector) finished(rs ...Result) {
	if c.live != nil {
		for _, r := range rs {
			c.live.row(r)
		}
	}
}

// OnProvider is agent.Config.OnProvider.
func (c *Collector) OnProvider(pid uint32) {
	c.mu.Lock()
	c.providers[pid] = true
	c.mu.Unlock()
}

// ProviderResolved says whether the agent resolved a verbs context of pid.
func (c *Collector) ProviderResolved(pid uint32) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.providers[pid]
}

// OnCall is agent.Config.OnCall: it counts the events that said their
// process lost events before them (a full ring, a read fault, no slot).
func (c *Collector) OnCall(e *event.Call) {
	if !e.LostBefore {
		return
	}
	c.mu.Lock()
	c.lost[e.PID]++
	c.mu.Unlock()
}

// Lost is how many events of these processes said they lost events.
func (c *Collector) Lost(pids ...uint32) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var n uint64
	for _, pid := range pids {
		n += c.lost[pid]
	}
	return n
}

// shedOf is the copies of pids whose events BPF shed (agent.ShedByProcess,
// docs/design.md 3.3 "Shedding"): a row's records lack them as they lack
// lost events.
func shedOf(ag agent.Tracing, pids []uint32) uint64 {
	if len(pids) == 0 {
		return 0
	}
	by, err := ag.ShedByProcess()
	if err != nil {
		return 0
	}
	var n uint64
	for _, pid := range pids {
		n += by[pid]
	}
	return n
}

// lossCount is what a row counts as its drops: the losses its processes
// said, the copies of theirs BPF shed, and every "any process may have
// lost" (cumulative: rows take the difference). Not the host-wide BPF drop counters: every process using a
// probed library file fires the probes, and one entered before an attach
// returns without its entry, which loses nothing of a row's process.
type lossCount func(pids ...uint32) uint64

// Transfer implements correlate.Sink.
func (c *Collector) Transfer(t *correlate.Transfer) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.byPID[t.PID] = append(c.byPID[t.PID], *t)
	if c.live != nil {
		c.live.transfer(t)
	}
}

// ExitChan is closed once the agent reported pid's exit (and so handed
// over all its transfers).
func (c *Collector) ExitChan(pid uint32) chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch, ok := c.exits[pid]
	if !ok {
		ch = make(chan struct{})
		c.exits[pid] = ch
	}
	return ch
}

// unclaimedFor is how long the transfers of an exited process wait to be
// taken: a process no scenario claims (another program on the host using
// the same libraries) is then forgotten, so the selftest's memory stays
// bounded on a busy host.
const unclaimedFor = time.Minute

// OnExit is agent.Config.OnExit.
func (c *Collector) OnExit(pid uint32) {
	close(c.ExitChan(pid))
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	if c.exitedAt == nil {
		c.exitedAt = map[uint32]time.Time{}
	}
	c.exitedAt[pid] = now
	for p, at := range c.exitedAt {
		if now.Sub(at) > unclaimedFor {
			delete(c.byPID, p)
			delete(c.exits, p)
			delete(c.runtimeLayer, p)
			delete(c.lost, p)
			delete(c.providers, p)
			delete(c.exitedAt, p)
			c.TakeActivities(p)
		}
	}
}

// RuntimeLayerChan gets, once, how many runtime probes the agent attached
// for pid after its driver failed to initialise.
func (c *Collector) RuntimeLayerChan(pid uint32) chan int {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch, ok := c.runtimeLayer[pid]
	if !ok {
		ch = make(chan int, 1)
		c.runtimeLayer[pid] = ch
	}
	return ch
}

// OnRuntimeLayer is agent.Config.OnRuntimeLayer.
func (c *Collector) OnRuntimeLayer(pid uint32, probes int) { c.RuntimeLayerChan(pid) <- probes }

// Take hands over and forgets the transfers of pid.
func (c *Collector) Take(pid uint32) []correlate.Transfer {
	c.mu.Lock()
	defer c.mu.Unlock()
	ts := c.byPID[pid]
	delete(c.byPID, pid)
	delete(c.exitedAt, pid)
	return ts
}

// Run runs every scenario of the reference data path under the real
// probes and compares what the agent reported with the ground truth.
func Run(ctx context.Context, cfg Config) (results []Result, stats agent.Stats, err error) {
	if cfg.Scenarios == nil {
		cfg.Scenarios = Scenarios
	}
	if cfg.Runtimes == nil {
		cfg.Runtimes = Runtimes
	}
	if cfg.RDMA == nil {
		cfg.RDMA = RDMAScenarios
	}
	if cfg.Pairs == nil {
		cfg.Pairs = PairScenarios
	}
	if cfg.Xfer == nil {
		cfg.Xfer = XferScenarios
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 30 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	kvpath := filepath.Join(cfg.RefDir, "bin", "kvpath")
	if _, err := os.Stat(kvpath); err != nil {
		return nil, stats, fmt.Errorf("reference data path not built (run `make -C refpath`): %w", err)
	}
	tmp, err := os.MkdirTemp("", "lanewatch-selftest-")
	if err != nil {
		return nil, stats, err
	}
	defer os.RemoveAll(tmp)

	// Asked before the reference NVML is loaded: the NVML binding is per process.
	gpuLine := GPUCountersLine()
	defer func() { stats.GPUCounters = gpuLine }()
	col := NewCollector(cfg.Live)
	defer col.StartLive()() // the last line before the table
	add := func(rs ...Result) {
		results = append(results, rs...)
		col.finished(rs...)
	}

	// late-attach starts before the agent: its pool is registered unseen.
	late, err := startHeld(ctx, cfg, kvpath, "late-attach", filepath.Join(tmp, "late-attach.jsonl"), nil)
	if err != nil {
		return nil, stats, err
	}
	defer late.cmd.Process.Kill()
	// So does late-pool-pages, whose pages the agent finds from its copies.
	pages, err := startHeld(ctx, cfg, kvpath, PagesScenario, filepath.Join(tmp, PagesScenario+".jsonl"), nil)
	if err != nil {
		return nil, stats, err
	}
	defer pages.cmd.Process.Kill()

	var storage *agent.StorageReads
	sp := &storagePlacement{}
	if cfg.Storage {
		if sp.topo, err = topology.Read("/sys"); err != nil {
			cfg.Logger.Warn("storage runs: the PCI tree is unreadable, devices are placed by name", "err", err)
		}
		if storage, err = agent.NewStorageReads(agent.StorageConfig{Place: sp.place, Logger: cfg.Logger}); err != nil {
			return nil, stats, fmt.Errorf("storage tracer: %w", err)
		}
		defer storage.Close()
	}
	ag, stopAgent, err := startAgent(ctx, cfg, col, storage)
	if err != nil {
		return nil, stats, err
	}
	defer stopAgent()
	defer func() { stats = ag.Stats() }() // runs before the agent stops
	drops := func(pids ...uint32) uint64 { return col.Lost(pids...) + ag.Stats().Engine.LostAny + shedOf(ag, pids) }

	runOne := func(name, runtime string, start func() (*proc, error)) (Result, error) {
		before := drops()
		p, err := start()
		if err != nil {
			return Result{}, err
		}
		res := Result{Scenario: name, Runtime: runtime, PID: p.pid}
		truth, got := p.finish(&res, col, cfg.Timeout, drops, before)
		checkOverlap(&res, name, []scenarioProc{{pid: p.pid, gpu: privateGPU(p.pid), truth: truth}}, got)
		noteInflight(&res, name, []scenarioProc{{pid: p.pid, gpu: privateGPU(p.pid), truth: truth}}, got)
		checkPages(&res, name, p.pid, p.truth, got)
		acts := col.TakeActivities(p.pid)
		checkCompute(&res, name, p.pid, truth, got, acts)
		checkDesigned(&res, name, []scenarioProc{{pid: p.pid, gpu: privateGPU(p.pid), truth: truth}}, got, acts)
		return res, nil
	}
	run := func(name, runtime string, start func() (*proc, error)) error {
		res, err := runOne(name, runtime, start)
		if err == nil {
			add(res)
		}
		return err
	}

	if err := run("late-attach", "plain", func() (*proc, error) { return late, late.release() }); err != nil {
		return results, stats, err
	}
	if err := run(PagesScenario, "plain", func() (*proc, error) { return pages, pages.releaseCopies(col, cfg.Timeout) }); err != nil {
		return results, stats, err
	}
	for _, rt := range cfg.Runtimes {
		env := []string{}
		if rt == "cet" {
			env = append(env, "LD_LIBRARY_PATH="+filepath.Join(cfg.RefDir, "cet")+":"+filepath.Join(cfg.RefDir, "lib"))
		}
		for _, sc := range cfg.Scenarios {
			truth := filepath.Join(tmp, rt+"-"+sc+".jsonl")
			if err := run(sc, rt, func() (*proc, error) { return start(ctx, cfg, kvpath, sc, truth, env) }); err != nil {
				return results, stats, err
			}
		}
		if cfg.NoDevice {
			truth := filepath.Join(tmp, rt+"-no-device.jsonl")
			if err := run("no-device", rt, func() (*proc, error) { return startNoDevice(ctx, cfg, kvpath, truth, env, col) }); err != nil {
				return results, stats, err
			}
		}
	}
	if cfg.KernelCopy {
		add(kernelCopyRun(ctx, cfg.RefDir, tmp, col, cfg, drops))
	}
	for _, lt := range cfg.LinkTrains {
		add(linkTrainRun(ctx, cfg.RefDir, tmp, col, cfg, drops, lt))
	}
	if cfg.TPWorkers {
		for _, rt := range cfg.Runtimes {
			add(tpWorkersRun(ctx, kvpath, rt, tmp, col, cfg, drops)...)
		}
	}
	if cfg.Storage {
		add(storageRun(ctx, kvpath, tmp, col, cfg, drops, storage, sp)...)
		add(uplinkRun(ctx, kvpath, tmp, col, cfg, drops)...)
	}
	for _, sc := range cfg.RDMA {
		add(rdmaRun(ctx, cfg.RefDir, sc, tmp, col, cfg, drops)...)
	}
	for _, sc := range cfg.Pairs {
		add(pairRun(ctx, kvpath, sc, tmp, col, cfg, drops)...)
	}
	for _, sc := range cfg.Xfer {
		add(xferRun(sc))
	}
	if slices.Contains(cfg.Scenarios, "hicache-load") { // span output: request and layer attribution (selftest_spans.go)
		add(spansCheck(ctx, kvpath, filepath.Join(tmp, "spans-hicache-load.jsonl"), col, cfg))
	}
	return results, stats, nil
}

// startAgent runs the agent on the reference libraries, every transfer and
// activity to col, and waits until it attached; stop stops it.
func startAgent(ctx context.Context, cfg Config, col *Collector, storage *agent.StorageReads) (ag agent.Tracing, stop func(), err error) {
	ag, err = agent.Start(ctx, agent.Config{
		Storage: storage,
		Libs: []string{
			filepath.Join(cfg.RefDir, "lib", "libcuda.so.1"),
			filepath.Join(cfg.RefDir, "plain", "libcudart.so.12"),
			filepath.Join(cfg.RefDir, "cet", "libcudart.so.12"),
			filepath.Join(cfg.RefDir, "rdma", "libibverbs.so.1"),
		},
		Sink:           col,
		Activity:       col,
		Logger:         cfg.Logger,
		Devices:        refDevices("/proc", cfg.Logger),
		Kernels:        true, // kernel-copy's launches: the kernel rows beside every scenario's copies
		OnExit:         col.OnExit,
		OnCall:         col.OnCall,
		OnProvider:     col.OnProvider,
		OnRuntimeLayer: col.OnRuntimeLayer,
	}, cfg.Timeout)
	if err != nil {
		return nil, nil, fmt.Errorf("agent: %w", err)
	}
	return ag, func() { ag.Stop() }, nil
}

// proc is a running scenario.
// finish waits for a scenario process to exit and compares what the agent
// reported of it with its truth, record by record; the row counts the
// events lost since before.
func (p *proc) finish(res *Result, col *Collector, timeout time.Duration, drops lossCount, before uint64) ([]TruthCall, []correlate.Transfer) {
	if err := p.wait(col, timeout); err != nil {
		res.Problems = append(res.Problems, err.Error())
	}
	res.Drops = drops(p.pid) - before
	truth, err := ReadTruthFile(p.truth)
	if err != nil {
		res.Problems = append(res.Problems, err.Error())
	}
	got := col.Take(p.pid)
	Compare(res, truth, got)
	return truth, got
}

type proc struct {
	cmd   *exec.Cmd
	pid   uint32
	truth string
	stdin io.WriteCloser
	out   *bufio.Reader
	ready string // a held scenario's ready line
}

func start(ctx context.Context, cfg Config, kvpath, scenario, truth string, env []string) (*proc, error) {
	cmd := exec.CommandContext(ctx, kvpath, "--scenario", scenario, "--truth", truth)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = cfg.drivers()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", scenario, err)
	}
	return &proc{cmd: cmd, pid: uint32(cmd.Process.Pid), truth: truth}, nil
}

// startHeld starts a scenario with --hold and waits until it is ready.
func startHeld(ctx context.Context, cfg Config, kvpath, scenario, truth string, env []string) (*proc, error) {
	cmd := exec.CommandContext(ctx, kvpath, "--scenario", scenario, "--truth", truth, "--hold")
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = cfg.drivers()
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", scenario, err)
	}
	p := &proc{cmd: cmd, pid: uint32(cmd.Process.Pid), truth: truth, stdin: stdin, out: bufio.NewReader(stdout)}
	line, err := p.out.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "ready") {
		cmd.Process.Kill()
		return nil, fmt.Errorf("%s: expected a ready line, got %q: %v", scenario, line, err)
	}
	p.ready = strings.TrimSpace(line)
	return p, nil
}

// startNoDevice starts no-device against a driver that finds no GPU; the
// scenario holds after its first runtime call (the runtime's cuInit failed)
// and is released once the agent attached the runtime layer for it.
func startNoDevice(ctx context.Context, cfg Config, kvpath, truth string, env []string, col *Collector) (*proc, error) {
	timeout := cfg.Timeout
	p, err := startHeld(ctx, cfg, kvpath, "no-device", truth, append(env, refenv.NoDeviceEnv))
	if err != nil {
		return nil, err
	}
	select {
	case n := <-col.RuntimeLayerChan(p.pid):
		if n == 0 {
			p.cmd.Process.Kill()
			return nil, fmt.Errorf("no-device: the agent attached no runtime probe for pid %d after cuInit failed", p.pid)
		}
	case <-time.After(timeout):
		p.cmd.Process.Kill()
		return nil, fmt.Errorf("no-device: the agent did not attach the runtime layer for pid %d within %s", p.pid, timeout)
	}
	return p, p.release()
}

// release lets a held scenario go on with its copies.
func (p *proc) release() error {
	_, err := io.WriteString(p.stdin, "go\n")
	if err == nil {
		err = p.stdin.Close()
	}
	return err
}

// wait waits for the process to exit and for the agent to have flushed its
// transfers (the agent saw the exit event).
func (p *proc) wait(col *Collector, timeout time.Duration) error {
	if p.out != nil {
		go io.Copy(io.Discard, p.out)
	}
	if err := p.cmd.Wait(); err != nil {
		return fmt.Errorf("scenario exited: %w", err)
	}
	return p.waitExit(col, timeout)
}

// waitExit waits until the agent reported the process's exit (and so
// handed over all its transfers).
func (p *proc) waitExit(col *Collector, timeout time.Duration) error {
	select {
	case <-col.ExitChan(p.pid):
		return nil
	case <-time.After(timeout):
		return fmt.Errorf("agent did not report the exit of pid %d within %s", p.pid, timeout)
	}
}

// ReadTruthFile reads a scenario's truth file (ReadTruth).
func ReadTruthFile(path string) ([]TruthCall, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ReadTruth(f, path)
}

// Compare matches the agent's records with the truth record by record, in
// submission order: every copy (failed ones with their error, and no bytes
// counted for them), and every other call that failed. It counts what
// differs in res.
func Compare(res *Result, truth []TruthCall, got []correlate.Transfer) {
	var want []TruthCall
	for _, t := range truth {
		switch {
		case t.IsCopy():
			want = append(want, t)
			if t.Result == 0 {
				res.WantBytes += t.Bytes
			}
		case t.Result != 0:
			want = append(want, t) // a failed call is reported even when it moves nothing
		}
		if t.Result != 0 {
			res.WantFailed++
		}
	}
	sort.SliceStable(got, func(i, j int) bool {
		if got[i].SubmitNs != got[j].SubmitNs {
			return got[i].SubmitNs < got[j].SubmitNs
		}
		return got[i].BatchIndex < got[j].BatchIndex
	})
	res.WantRecords, res.Got = len(want), len(got)
	for _, g := range got {
		if g.Failed() {
			res.GotFailed++
		} else {
			res.GotBytes += g.Bytes
		}
	}
	problem := func(format string, args ...any) {
		if len(res.Problems) < 5 {
			res.Problems = append(res.Problems, fmt.Sprintf(format, args...))
		}
	}
	// Layers are the agent's count of event records on a load stream
	// (docs/design.md, "Completion and layers"): compared on the streams
	// where the scenario records one per layer.
	layered := map[uint64]bool{}
	for _, t := range truth {
		if t.Op == TruthEventRecord {
			layered[t.Stream] = true
		}
	}
	for i := 0; i < len(want) && i < len(got); i++ {
		w, g := want[i], got[i]
		if w.Result != 0 || g.Failed() {
			api := w.API
			if w.Op == TruthInit {
				// The runtime initialises the driver inside whichever runtime
				// call comes first; before the runtime layer is attached the
				// agent sees only that cuInit.
				api = "cuInit"
			}
			if !g.Failed() || g.Error.Code != uint32(w.Result) || g.API != api || g.TID != w.TID {
				res.ErrorErrs++
				problem("record %d: want %s tid %d result %d, got %s tid %d error %+v", i, w.API, w.TID, w.Result, g.API, g.TID, g.Error)
				continue
			}
			if w.Op == TruthKernelCopy && (g.Op != event.OpKernelCopy || g.KernelSymbol != w.Kernel || g.Mover != correlate.MoverSM || !g.BytesUnknown) {
				// a refused KV-transfer kernel launch, named by its host stub
				res.ErrorErrs++
				problem("record %d: want the refused launch of %s, got %s %s kernel %q", i, w.Kernel, g.Op, g.Mover, g.KernelSymbol)
				continue
			}
			if !w.IsCopy() {
				continue
			}
		}
		if w.API != g.API || w.Bytes != g.Bytes || w.Dst != g.Dst.Addr || w.Src != g.Src.Addr || w.TID != g.TID || w.Stream != g.Stream {
			res.OtherErrs++
			problem("record %d: want %s %d B %#x→%#x tid %d stream %#x, got %s %d B %#x→%#x tid %d stream %#x", i,
				w.API, w.Bytes, w.Src, w.Dst, w.TID, w.Stream, g.API, g.Bytes, g.Src.Addr, g.Dst.Addr, g.TID, g.Stream)
			continue
		}
		if w.Direction != g.Direction {
			res.DirectionErrs++
			problem("record %d (%s): direction want %s got %s", i, w.API, w.Direction, g.Direction)
		}
		if w.ExpectHostMem != string(g.HostMem) && (w.Direction == "H2D" || w.Direction == "D2H") {
			res.MemoryErrs++
			problem("record %d (%s %s): host memory want %s got %s", i, w.API, w.Direction, w.ExpectHostMem, g.HostMem)
		}
		if w.GPU != "" && w.Result == 0 && w.GPU != g.GPU {
			res.OtherErrs++
			problem("record %d (%s %s tid %d): gpu want %s got %q", i, w.API, w.Direction, w.TID, w.GPU, g.GPU)
		}
		// Each side's kind: a device side the call states, else what an
		// observer can know of the address (truth.h in refpath/kvpath).
		if w.ExpectSrcMem != "" && (w.ExpectSrcMem != string(g.Src.Mem) || w.ExpectDstMem != string(g.Dst.Mem)) {
			res.MemoryErrs++
			problem("record %d (%s %s): memory want %s→%s got %s→%s", i, w.API, w.Direction, w.ExpectSrcMem, w.ExpectDstMem,
				g.Src.Mem, g.Dst.Mem)
		}
		if w.Result == 0 {
			if msg := checkCompletion(w, g, truth); msg != "" {
				res.OtherErrs++
				problem("record %d (%s): %s", i, w.API, msg)
			}
			if layered[w.Stream] && w.Layer >= 0 && g.Layer != w.Layer {
				res.OtherErrs++
				problem("record %d (%s): layer %d, truth %d", i, w.API, g.Layer, w.Layer)
			}
		}
	}
	if len(want) != len(got) {
		res.OtherErrs++
		problem("want %d records, got %d", len(want), len(got))
	}
}

// checkCompletion compares a copy's complete_ns with the truth: never
// before the copy engine finished it, and present, no later than that
// synchronisation returned, when a later stream_sync of the copy's stream
// proved it done (docs/design.md, "Completion and layers").
func checkCompletion(w TruthCall, g correlate.Transfer, truth []TruthCall) string {
	if g.CompleteNs != 0 && w.EngineEndNs != 0 && g.CompleteNs < w.EngineEndNs {
		return fmt.Sprintf("complete_ns %d before the engine finished it at %d", g.CompleteNs, w.EngineEndNs)
	}
	if w.Stream <= 2 {
		return "" // 0, cudaStreamLegacy, cudaStreamPerThread: which stream depends on the API's per-thread form
	}
	for _, s := range truth {
		if s.Seq <= w.Seq || s.Op != TruthStreamSync || s.Stream != w.Stream || s.Result != 0 {
			continue
		}
		switch {
		case g.CompleteNs == 0:
			return fmt.Sprintf("no complete_ns, though stream_sync seq %d proved it done", s.Seq)
		case s.TReturnNs != 0 && g.CompleteNs > s.TReturnNs:
			return fmt.Sprintf("complete_ns %d after stream_sync seq %d returned at %d", g.CompleteNs, s.Seq, s.TReturnNs)
		}
		return ""
	}
	return ""
}

// PrintResults writes the selftest table and returns whether all passed.
func PrintResults(w io.Writer, results []Result, stats agent.Stats) bool {
	ok := true
	fmt.Fprintf(w, "%-17s %-7s %-11s %-21s %-7s %-9s %-11s %-5s %-8s %-6s %s\n",
		"SCENARIO", "BUILD", "RECORDS", "BYTES", "FAILED", "DIRECTION", "MEMORY KIND", "DROPS", "OVERLAP", "RESULT", "LATENCY agent/truth")
	for _, r := range results {
		verdict := "ok"
		if !r.OK() {
			verdict, ok = "FAIL", false
		}
		overlap := r.Overlap
		if r.OverlapErr {
			overlap += "!"
		}
		failed := fmt.Sprintf("%d/%d", r.GotFailed, r.WantFailed)
		if r.ErrorErrs > 0 {
			failed += "!"
		}
		fmt.Fprintf(w, "%-17s %-7s %-11s %-21s %-7s %-9s %-11s %-5d %-8s %-6s %s\n", r.Scenario, r.Runtime,
			fmt.Sprintf("%d/%d", r.Got, r.WantRecords), fmt.Sprintf("%d/%d", r.GotBytes, r.WantBytes), failed,
			errCell(r.DirectionErrs), errCell(r.MemoryErrs), r.Drops, overlap, verdict, r.Latency)
		for _, p := range r.Problems {
			fmt.Fprintf(w, "    %s\n", p)
		}
	}
	fmt.Fprintf(w, "events %d, drops %d (ring full %d, lost returns %d, batch truncated %d, read faults %d), attach points %d in %d files\n",
		stats.Events, stats.Drops.Total(), stats.Drops.RingFull, stats.Drops.NoEntry, stats.Drops.BatchTrunc,
		stats.Drops.ReadFault, stats.Links, stats.Files)
	return ok
}

func errCell(n int) string {
	if n == 0 {
		return "exact"
	}
	return fmt.Sprintf("%d wrong", n)
}
