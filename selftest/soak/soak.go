// Package soak runs the agent binary (`agent run`) for a long time
// against the reference workload and everything around it at once:
// reference processes starting and exiting continuously (the churn), the
// spans an inference server would send for them, hostile OTLP clients,
// Prometheus scrapes and a trace upstream that goes down and comes back.
// At quiet points (no process, request or connection of the soak in
// flight) it reads the agent's RSS, goroutines, file descriptors, BPF
// links and drops, and it matches every record the agent wrote with the
// truth of the process that made it. It fails on growth after warm-up,
// on any lost or wrong record, on any drop, and on an unclean exit.
package soak

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"

	"github.com/lanewatch/lanewatch/selftest"
)

// Config says what to run and how long.
type Config struct {
	AgentBin    string        // bin/agent
	RefDir      string        // refpath/build
	Duration    time.Duration // default 10m
	Interval    time.Duration // between quiet points, one printed line each (default Duration/12, 1s to 10s)
	WarmUp      time.Duration // samples before it are not judged (default Duration/5)
	Slots       int           // reference processes running at a time (default 2)
	FlapEvery   time.Duration // the upstream changes mode (default 5s)
	ScrapeEvery time.Duration // Prometheus scrapes of /metrics (default 1s)
	Hostile     Hostile       // the zero value sends no hostile traffic
	RingBytes   uint64        // --ring-bytes (default 64 MiB: no drops)
	MemoryLimit string        // --memory-limit ("": the agent's default)
	Growth      float64       // allowed growth after warm-up (default 0.10)
	RSSFloor    float64       // RSS growth allowed whatever the ratio (default 32 MiB)
	CountFloor  float64       // goroutine and fd growth allowed whatever the ratio (default 5)
	ExitLimit   time.Duration // the most a clean exit after SIGINT may take (default 2s)
	Out         io.Writer     // the lines and the summary
	AgentLog    io.Writer     // the agent's log; nil: only its last lines on failure
}

// DefaultHostile is the hostile traffic of `make soak`: modest volumes.
var DefaultHostile = Hostile{Every: 2 * time.Second, BodyBytes: 16 << 20, Conns: 64, Hold: 2 * time.Second}

func (c *Config) defaults() {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.Duration, 10*time.Minute)
	def(&c.Interval, min(max(c.Duration/12, time.Second), 10*time.Second))
	def(&c.WarmUp, c.Duration/5)
	def(&c.FlapEvery, 5*time.Second)
	def(&c.ScrapeEvery, time.Second)
	if c.Slots == 0 {
		c.Slots = 2
	}
	if c.RingBytes == 0 {
		c.RingBytes = 64 << 20
	}
	if c.Growth == 0 {
		c.Growth = 0.10
	}
	if c.RSSFloor == 0 {
		c.RSSFloor = 32 << 20
	}
	if c.CountFloor == 0 {
		c.CountFloor = 5
	}
	def(&c.ExitLimit, 2*time.Second)
	if c.Out == nil {
		c.Out = io.Discard
	}
}

// Sample is what one quiet point read.
type Sample struct {
	Elapsed    time.Duration
	RSS        uint64
	Goroutines float64 // go_goroutines
	HeapInuse  float64 // go_memstats_heap_inuse_bytes
	FDs        int     // /proc/PID/fd
	Links      int     // bpf_link fds
	Probes     float64 // lanewatch_attached_probes
	Drops      float64 // lanewatch_probe_dropped_events_total
	RingFull   float64 // ... of them, because the ring was full
	Ledger     ledgerStats
	Pending    int // processes exited whose records are not all in yet
	Upstream   upstreamMode
}

// Report is the soak's outcome.
type Report struct {
	Samples  []Sample
	Growth   []growth
	Ledger   ledgerStats
	Started  int // reference processes
	ExitTook time.Duration
	Failures []string
}

// OK reports whether the soak passed.
func (r *Report) OK() bool { return len(r.Failures) == 0 }

func (r *Report) fail(format string, args ...any) {
	r.Failures = append(r.Failures, fmt.Sprintf(format, args...))
}

// Run runs the soak. An error means it could not run; a failed soak is
// a Report with Failures.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg.defaults()
	libs := []string{
		filepath.Join(cfg.RefDir, "lib", "libcuda.so.1"),
		filepath.Join(cfg.RefDir, "plain", "libcudart.so.12"),
		filepath.Join(cfg.RefDir, "cet", "libcudart.so.12"),
		filepath.Join(cfg.RefDir, "rdma", "libibverbs.so.1"),
	}
	for _, f := range append([]string{cfg.AgentBin, filepath.Join(cfg.RefDir, "bin", "kvpath")}, libs...) {
		if _, err := os.Stat(f); err != nil {
			return nil, fmt.Errorf("%w (make build)", err)
		}
	}
	tmp, err := os.MkdirTemp("", "lanewatch-soak-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	up, err := newUpstream()
	if err != nil {
		return nil, err
	}
	defer up.close()
	output := filepath.Join(tmp, "records.jsonl")
	p, err := startAgent(agentArgs{bin: cfg.AgentBin, libs: libs, output: output, metrics: ports[0], grpc: ports[1], http: ports[2],
		upstream: up.URL(), memoryLimit: cfg.MemoryLimit, ringBytes: cfg.RingBytes}, cfg.AgentLog)
	if err != nil {
		return nil, err
	}
	defer p.kill()
	if err := p.waitReady(time.Minute); err != nil {
		return nil, err
	}
	tail, err := openTailer(output)
	if err != nil {
		return nil, err
	}
	defer tail.close()
	s := &soak{cfg: cfg, p: p, up: up, tail: tail, ledger: newLedger(), gate: newGate(), rep: &Report{}, start: time.Now()}
	return s.rep, s.run(ctx, tmp, ports)
}

// soak is one run's state.
type soak struct {
	cfg    Config
	p      *agentProc
	up     *upstream
	tail   *tailer
	ledger *ledger
	gate   *gate
	counts otlpCounts
	rep    *Report
	// finalDrops are every drop the agent counted, read before SIGINT.
	finalDrops, finalRingFull float64
	start                     time.Time
}

func (s *soak) run(ctx context.Context, tmp string, ports []string) error {
	cfg := s.cfg
	fmt.Fprintf(cfg.Out, "soak: agent pid %d, %s, a line every %s, warm-up %s, %d workload slots, hostile OTLP %v, upstream flaps every %s\n",
		s.p.pid, cfg.Duration, cfg.Interval, cfg.WarmUp, cfg.Slots, cfg.Hostile.Every > 0, cfg.FlapEvery)
	load, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	normal, err := newNormalTraffic(ports[2], ports[1], &s.counts)
	if err != nil {
		return err
	}
	defer normal.close()
	w := newWorkload(cfg.RefDir, tmp, s.ledger, func(kind string, truth []selftest.TruthCall) { normal.send(load, kind, truth) })
	var wg sync.WaitGroup
	for range cfg.Slots {
		wg.Go(func() { s.gate.loop(load, 0, w.runNext) })
	}
	if cfg.Hostile.Every > 0 {
		h := newHostileTraffic(cfg.Hostile, ports[2], ports[1], &s.counts)
		for _, k := range h.kinds() {
			wg.Go(func() { s.gate.loop(load, cfg.Hostile.Every, k) })
		}
	}
	wg.Go(func() { s.scrapeLoop(load) })
	wg.Go(func() { s.flap(load) })
	pollCtx, stopPoll := context.WithCancel(context.Background())
	var polling sync.WaitGroup
	polling.Go(func() { s.pollLoop(pollCtx) })
	defer func() { stopPoll(); polling.Wait() }()

	runErr := s.sampleLoop(ctx)
	if runErr == nil {
		runErr = s.drain(ctx) // what runs finishes: no process is killed half-way
	}
	stopLoad()
	s.gate.resume()
	s.gate.wake()
	wg.Wait()
	removeWires()
	if runErr != nil {
		return runErr
	}
	started, errs := w.counts()
	s.rep.Started = started
	if errs > 0 {
		s.rep.fail("%d reference runs failed (the agent must never harm what it watches): %s", errs, strings.Join(w.errorList(), "; "))
	}
	if err := s.finish(stopPoll, &polling); err != nil {
		return err
	}
	s.judge()
	s.summary()
	return nil
}

// sampleLoop takes a sample at every interval until the duration ends.
func (s *soak) sampleLoop(ctx context.Context) error {
	for next := s.cfg.Interval; next <= s.cfg.Duration; next += s.cfg.Interval {
		if late := time.Since(s.start); next < late { // a quiet point took long: the next is one interval on
			next = late.Truncate(s.cfg.Interval) + s.cfg.Interval
		}
		if next > s.cfg.Duration {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.p.done:
			return fmt.Errorf("the agent exited during the soak: %v\n%s", s.p.exitErr, strings.Join(s.p.log.Lines(), "\n"))
		case <-time.After(time.Until(s.start.Add(next))):
		}
		sm, err := s.quietSample(ctx)
		if err != nil {
			return err
		}
		s.rep.Samples = append(s.rep.Samples, sm)
		s.printSample(sm)
	}
	return nil
}

// drain waits until no piece of load is in flight, and starts none.
func (s *soak) drain(ctx context.Context) error {
	paused := make(chan struct{})
	go func() { s.gate.pause(); close(paused) }()
	select {
	case <-paused:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(quietPointTimeout):
		return fmt.Errorf("the load did not finish within %s", quietPointTimeout)
	}
}

// removeWires removes the reference RDMA wires of runs the soak killed
// (rdmapath removes its own when it finishes).
func removeWires() {
	names, _ := filepath.Glob(fmt.Sprintf("/dev/shm/lw-ref-wire-soak%d-*", os.Getpid()))
	for _, n := range names {
		os.Remove(n)
	}
}

// quietPointTimeout bounds the wait for every piece of load in flight to
// finish (the longest is an RDMA scenario, about a second).
const quietPointTimeout = time.Minute

// quietSample pauses the load, lets the agent settle, reads its figures
// and resumes.
func (s *soak) quietSample(ctx context.Context) (Sample, error) {
	paused := make(chan struct{})
	go func() { s.gate.pause(); close(paused) }()
	select {
	case <-paused:
	case <-ctx.Done():
		return Sample{}, ctx.Err()
	case <-time.After(quietPointTimeout):
		return Sample{}, fmt.Errorf("the load did not reach a quiet point within %s", quietPointTimeout)
	}
	defer s.gate.resume()
	time.Sleep(500 * time.Millisecond) // closed connections' handlers return
	now := time.Now()
	fig, err := readProc(s.p.pid, false)
	if err != nil {
		return Sample{}, fmt.Errorf("agent /proc: %w", err)
	}
	sc, err := s.p.scrapeMetrics(ctx)
	if err != nil {
		return Sample{}, fmt.Errorf("scrape: %w", err)
	}
	pending, _ := s.ledger.pending(now)
	return Sample{Elapsed: now.Sub(s.start).Round(time.Second), RSS: fig.RSS, HeapInuse: sc.HeapInuse, Goroutines: sc.Goroutines, FDs: fig.FDs, Links: fig.Links,
		Probes: sc.Probes, Drops: sc.Drops, RingFull: sc.RingFull, Ledger: s.ledger.stats(), Pending: pending, Upstream: s.up.currentMode()}, nil
}

func (s *soak) printSample(sm Sample) {
	l := sm.Ledger
	fmt.Fprintf(s.cfg.Out, "t=%-5s rss=%6.1fMiB heap=%6.1fMiB goroutines=%-3.0f fds=%-3d links=%-3d probes=%-3.0f drops=%.0f(ring_full:%.0f) procs=%d matched=%d/%d records=%d/%d pending=%d bad=%d foreign=%d upstream=%s otlp=normal:%d,hostile:%d\n",
		sm.Elapsed, float64(sm.RSS)/(1<<20), sm.HeapInuse/(1<<20), sm.Goroutines, sm.FDs, sm.Links, sm.Probes, sm.Drops, sm.RingFull, l.Finished, l.Matched,
		l.Finished-sm.Pending, l.GotRecords, l.WantRecords, sm.Pending, l.Mismatched, l.Foreign, sm.Upstream,
		s.counts.total("normal"), s.counts.total("hostile"))
}

// scrapeLoop is Prometheus: /metrics every ScrapeEvery.
func (s *soak) scrapeLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(s.cfg.ScrapeEvery):
		}
		if _, err := s.p.scrapeMetrics(ctx); err != nil && ctx.Err() == nil {
			s.counts.add("scrape", "error")
		} else {
			s.counts.add("scrape", "ok")
		}
	}
}

// flap cycles the upstream through up, down, up, failing, up, slow.
func (s *soak) flap(ctx context.Context) {
	modes := []upstreamMode{modeDown, modeUp, modeFailing, modeUp, modeSlow, modeUp}
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-time.After(s.cfg.FlapEvery):
		}
		if err := s.up.set(modes[i%len(modes)]); err != nil {
			s.counts.add("upstream", err.Error())
		}
	}
}

// pollLoop reads the agent's output as it grows.
func (s *soak) pollLoop(ctx context.Context) {
	for {
		if err := s.tail.poll(s.ledger); err != nil {
			s.ledger.mu.Lock()
			s.ledger.problem("reading the output: %v", err)
			s.ledger.mu.Unlock()
		}
		s.ledger.forget(time.Now(), time.Minute)
		select {
		case <-ctx.Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// finish waits for the records of the last processes, stops the agent
// with SIGINT and checks that it exited cleanly, in time, and left no BPF
// link or program behind.
func (s *soak) finish(stopPoll context.CancelFunc, polling *sync.WaitGroup) error {
	if err := s.up.waitUp(context.Background()); err != nil {
		s.rep.fail("upstream: %v", err)
	}
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if n, _ := s.ledger.pending(time.Now()); n == 0 {
			break
		}
	}
	fig, err := readProc(s.p.pid, true)
	if err != nil {
		return fmt.Errorf("agent /proc: %w", err)
	}
	final, err := s.p.scrapeMetrics(context.Background())
	if err != nil {
		return fmt.Errorf("last scrape: %w", err)
	}
	// Events lost because the ring was full fail the soak: it sizes the
	// ring so that none is. Other drops (a return probe without its entry:
	// a process already inside a call when its library was probed, other
	// programs' included) are reported; any that touched the workload
	// shows as a lost or wrong record.
	if final.RingFull > 0 {
		s.rep.fail("the agent lost %.0f probe events to a full ring (the soak sizes the ring so that none is)", final.RingFull)
	}
	s.finalDrops, s.finalRingFull = final.Drops, final.RingFull
	took, err := s.p.stop(s.cfg.ExitLimit)
	s.rep.ExitTook = took
	if err != nil {
		s.rep.fail("SIGINT: %v (exit took %s with %d BPF links to detach)", err, took.Round(time.Millisecond), fig.Links)
	}
	stopPoll()
	polling.Wait()
	if err := s.tail.poll(s.ledger); err != nil {
		return fmt.Errorf("reading the output: %w", err)
	}
	s.ledger.close()
	s.rep.Ledger = s.ledger.stats()
	// The kernel frees a sleepable program (the loader hold's) only after
	// an RCU tasks-trace grace period, and a thread held in it leaves it
	// when the hold sees the agent stop: gone within a few seconds, or
	// left behind.
	var left []string
	exited := time.Now()
	for deadline := exited.Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if left, err = bpfLeft(fig); err != nil {
			return err
		}
		if len(left) == 0 || time.Now().After(deadline) {
			break
		}
	}
	if len(left) > 0 {
		s.rep.fail("after the agent exited, BPF objects it held remain: %s", strings.Join(left, ", "))
	}
	fmt.Fprintf(s.cfg.Out, "exit: SIGINT → exit in %s; the agent held %d links and %d programs, %d remain (looked for %s)\n",
		took.Round(time.Millisecond), len(fig.LinkIDs), len(fig.ProgIDs), len(left), time.Since(exited).Round(time.Millisecond))
	return nil
}

// bpfLeft returns the links and programs of fig still in the kernel.
func bpfLeft(fig procFigures) ([]string, error) {
	var left []string
	ids, err := linksLeft(fig.LinkIDs)
	if err != nil {
		return nil, err
	}
	for _, id := range ids {
		left = append(left, fmt.Sprintf("link %d", id))
	}
	for _, id := range fig.ProgIDs {
		prog, err := ebpf.NewProgramFromID(id)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("program %d: %w", id, err)
		}
		prog.Close()
		left = append(left, fmt.Sprintf("program %d", id))
	}
	return left, nil
}

// judge turns the samples and the ledger into failures.
func (s *soak) judge() {
	cfg, rep := s.cfg, s.rep
	var since []Sample
	for _, sm := range rep.Samples {
		if sm.Elapsed > cfg.WarmUp {
			since = append(since, sm)
		}
	}
	series := func(f func(Sample) float64) []float64 {
		v := make([]float64, len(since))
		for i, sm := range since {
			v[i] = f(sm)
		}
		return v
	}
	rep.Growth = []growth{
		judgeGrowth("rss", series(func(sm Sample) float64 { return float64(sm.RSS) }), cfg.Growth, cfg.RSSFloor),
		judgeGrowth("goroutines", series(func(sm Sample) float64 { return sm.Goroutines }), cfg.Growth, cfg.CountFloor),
		// fds other than BPF links: the links are judged below.
		judgeGrowth("fds-but-links", series(func(sm Sample) float64 { return float64(sm.FDs - sm.Links) }), cfg.Growth, cfg.CountFloor),
		judgeGrowth("links", series(func(sm Sample) float64 { return float64(sm.Links) }), cfg.Growth, 0),
		// Probe sites: the agent also probes the libraries other programs
		// on the host map, and links grow with them.
		judgeGrowth("probe-sites", series(func(sm Sample) float64 { return sm.Probes }), cfg.Growth, 0),
	}
	sitesGrew := rep.Growth[len(rep.Growth)-1].Fail
	for i, g := range rep.Growth {
		switch {
		case g.Name == "probe-sites" && g.Fail:
			rep.Growth[i].Excused = "the agent probed more libraries (other programs on the host mapped them)"
		case g.Name == "links" && g.Fail && sitesGrew:
			rep.Growth[i].Excused = "so did the probe sites: links grown with them are not told from a leak"
		case g.TooFewSince || g.Fail:
			rep.fail("%s", g)
		}
	}
	l := rep.Ledger
	if l.Lost > 0 || l.LostProcs > 0 {
		rep.fail("%d records of %d processes lost", l.Lost, l.LostProcs)
	}
	if l.Mismatched > 0 || l.ExtraRecords > 0 {
		rep.fail("%d processes' records differ from their truth (%d records after judgement)", l.Mismatched, l.ExtraRecords)
	}
	if s.tail.bad > 0 {
		rep.fail("%d output lines are not records", s.tail.bad)
	}
	if l.Finished == 0 || l.Matched == 0 {
		rep.fail("no process of the workload was matched: the soak proved nothing")
	}
	for _, p := range s.ledger.problemList() {
		rep.fail("ledger: %s", p)
	}
}

func (s *soak) summary() {
	out, rep := s.cfg.Out, s.rep
	l := rep.Ledger
	fmt.Fprintf(out, "records: %d processes started, %d finished with truth, %d matched record by record, %d differ, %d lost (%d records); %d/%d records; %d foreign records (other programs on the host) not judged\n",
		rep.Started, l.Finished, l.Matched, l.Mismatched, l.LostProcs, l.Lost, l.GotRecords, l.WantRecords, l.Foreign)
	st := s.up.stats()
	fmt.Fprintf(out, "drops: %.0f probe events counted by the agent, %.0f of them to a full ring (the workload's records are judged one by one above)\n",
		s.finalDrops, s.finalRingFull)
	fmt.Fprintf(out, "upstream: %d flaps, %d requests answered, %d refused with 503, %d transfer spans, %d forwarded spans\n",
		st.Flaps, st.Requests, st.Refused, st.TransferSpans, st.Forwarded)
	counts := s.counts.snapshot()
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, " %s=%d", strings.ReplaceAll(k, " ", ":"), counts[k])
	}
	fmt.Fprintf(out, "requests:%s\n", b.String())
	if c := s.p.log.Counts(); len(c) > 0 {
		fmt.Fprintf(out, "agent warnings and errors: %v\n", c)
	}
	for _, g := range rep.Growth {
		fmt.Fprintf(out, "growth %s\n", g)
	}
	if rep.OK() {
		fmt.Fprintf(out, "PASS\n")
		return
	}
	for _, f := range rep.Failures {
		fmt.Fprintf(out, "FAIL: %s\n", f)
	}
}

// freePorts returns n loopback addresses free a moment ago.
func freePorts(n int) ([]string, error) {
	var out []string
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		lns = append(lns, ln)
		out = append(out, ln.Addr().String())
	}
	return out, nil
}
