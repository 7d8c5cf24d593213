// Package agent wires probes, the correlation engine and the exporters
// together and owns their lifecycle: process discovery, start and stop.
package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/probes"
)

// Config is everything `agent run` can be told.
type Config struct {
	ProcRoot string   // procfs root, "/proc" on a host
	PIDs     []int    // only these processes (empty: every process)
	Libs     []string // files to probe at start, before any process maps them
	// RootFS is the host's root filesystem ("" : "/"): its CUDA driver
	// library is probed at start, before any process maps it
	// (DriverLibraries); "-" looks for none.
	RootFS         string
	RescanInterval time.Duration // safety-net rescan of every process's mappings
	// ReleaseAfter: a probed library no process has mapped for this long
	// (found by the rescan) has its probes detached (0: 30 s).
	ReleaseAfter time.Duration
	RingBytes    uint32    // ring buffer size, 0 for the default
	NoShedding   bool      // never shed copies: a full ring drops (probes.Options.NoShedding)
	Record       io.Writer // raw events, for offline replay; nil for none
	Sink         correlate.Sink
	// Activity receives the engine's launches, host waits and event
	// records (correlate.Activity), on the reading goroutine; nil: none.
	Activity correlate.ActivitySink
	// Lost is told of each event that says events were lost before it
	// (event.Call.LostBefore: its process's; LostAny: any process's, all
	// true), on the reading goroutine, in ring order; nil: none. The
	// evaluator's window judges those processes' checks incomplete
	// (judge.Evaluator.Lost).
	Lost   func(pid uint32, all bool)
	Logger *slog.Logger
	// LogInterval: a cause that repeats (a library failing to attach at
	// every rescan) is logged at most once per interval (0: a minute).
	LogInterval time.Duration
	// Devices places a process's CUDA device ordinals on PCI functions
	// when the process does not name them itself (DeviceMap; nil: only what
	// processes say). See correlate.DeviceMap.
	Devices correlate.DeviceMap
	// OnExit runs after a process exited and its transfers were handed to
	// Sink: on the reading goroutine, or on the page locator's when some of
	// them were waiting for their pages (docs/design.md, "Pages, not
	// registrations").
	OnExit func(pid uint32)
	// OnReady runs once every probe is attached and the first scan is done.
	OnReady func()
	// OnRuntimeLayer runs on the discovery goroutine once the runtime layer
	// was tried for a process whose driver failed to initialise, with the
	// number of runtime probes attached for it (0 when none could be).
	OnRuntimeLayer func(pid uint32, probes int)
	// OnProvider runs on the discovery goroutine once a verbs context of
	// pid was resolved: its provider's data path probed, or why not logged.
	OnProvider func(pid uint32)
	// OnCall sees every decoded call before the engine does, on the reading
	// goroutine: it must not block (diagnose uses it to locate pools while
	// their process is alive).
	OnCall func(*event.Call)
	// Kernels attaches the kernel rows (launches, and the calls naming a
	// kernel handle): launches of KV-transfer kernels become transfers moved
	// by SMs (docs/design.md, "Kernel movers"). Every kernel launch of every
	// traced process then costs one entry+return pair.
	Kernels bool
	// AllowSingleStep: on arm64, also probe sites the kernel single-steps
	// (probes.Options.AllowSingleStep).
	AllowSingleStep bool
	// KVKernels are the KV-transfer kernels, regular expressions over a
	// kernel's demangled function name; nil: correlate.DefaultKVKernels.
	KVKernels []string
	// Storage, when set, traces the storage reads of every process the
	// agent sees make a call (NewStorageReads; docs/design.md, "The storage
	// leg"). The caller closes it after Run.
	Storage *StorageReads
}

// Stats is the agent's own health.
type Stats struct {
	Events  uint64
	Drops   event.Drops
	Links   int
	Files   int
	Engine  correlate.Stats
	Rescans uint64
	// GPUCounters is the selftest's one line about this host's GPU counters.
	GPUCounters string
	// AttachFailures counts files exporting probed symbols whose probes
	// could not be attached.
	AttachFailures uint64
	// CallerUnclassified counts driver calls whose caller neither the probe
	// nor the process's maps could place (named by the driver's symbol).
	CallerUnclassified uint64
	// Pages counts the page lookups of host↔device copies.
	Pages PageStats
	// LostExits counts processes whose exit event was lost (a full ring),
	// finished when /proc no longer showed them.
	LostExits uint64
	// LibraryDetaches counts libraries whose probes were detached: no
	// process mapped them any more.
	LibraryDetaches uint64
	// Holds: threads held at their loader notification until a new CUDA
	// file of their process was probed (probes.HoldStats).
	Holds probes.HoldStats
}

// Agent traces CUDA transfers in every matching process.
type Agent struct {
	cfg     Config
	log     *slog.Logger
	probes  *probes.Probes
	symbols []string

	filesMu     sync.Mutex
	files       map[probes.FileID]*fileState
	attachFails map[string]uint64 // failed tries to probe a library, by file name
	// sameFile: the verdicts of files attached on overlayfs, by what every
	// container's mount of one image layer shows alike (probes.Fingerprint).
	sameFile map[probes.Fingerprint]fileVerdict
	scanGen  uint64                 // full scans of every process, for the unprobed libraries they still see
	untraced map[int]*untracedState // processes moving data past the probes (untraced.go)
	limited  *limitedLog            // one line per cause per LogInterval

	engineMu sync.Mutex // the engine is fed by the reader and told about processes by discovery
	engine   *correlate.Engine
	pages    *pageStage // between the engine and cfg.Sink: where each copy's host pages are

	procMu    sync.Mutex
	procs     map[int]*procState // processes believed observed from their start
	scannedAt map[int]uint64     // initial scan: when each process's maps were read
	// preexisting: processes the initial scan found running, until they
	// exec or exit (their libfabric objects may predate the agent).
	preexisting map[int]bool

	rescan    chan int             // pids whose mappings changed (ld.so said so)
	held      chan heldReq         // the same, while a thread of the process waits for it (probes' hold): first
	providers chan providerReq     // verbs contexts whose provider functions may need probes
	contexts  map[providerReq]bool // resolved already; touched by the discovery goroutine only
	fabric    *fabricState         // libfabric objects whose ops name functions to probe (fabric.go)
	// The runtime layer of processes whose driver failed to initialise
	// (attachRuntime); pidProbes is touched by the discovery goroutine only.
	runtimeLayer chan runtimeLayerReq
	exited       chan int
	pidProbes    map[int][]*probes.PIDProbes

	events  atomic.Uint64
	rescans atomic.Uint64
	// attached: the first scan attached every probe; readerRound: when
	// the ring reader last came round (unix ns), for readiness.
	attached    atomic.Bool
	readerRound atomic.Int64
	attachErr   atomic.Uint64 // files whose probes could not be attached
	libDetaches atomic.Uint64 // libraries detached, mapped by no process any more
	targets     map[int]bool  // PIDs as a set; nil means all

	// callers classifies the driver calls the probes could not (the
	// reading goroutine's); callerErrs counts those it could not either.
	callers    *callerRanges
	callerErrs atomic.Uint64

	// stubs names the host stubs the runtime layer sees launched
	// (kernels.go), from mappings kept while the process lived.
	stubs *stubResolver

	finalMu sync.Mutex
	final   *Stats // the last counters, once Run has detached everything

	reap reaper // processes whose exit event was lost (the reading goroutine's)

	lanes *lanes // copy totals of processes gone, folded from the BPF counters (lanes.go)

	// storageWatched: the processes the storage tracer was told of (the
	// reading goroutine's).
	storageWatched map[uint32]bool

	// afterMaps, set by tests before Run, runs on the scanning goroutine
	// once a scan has read a process's maps: a test can end the process
	// there, between the maps and the files they name.
	afterMaps func(pid int, maps []probes.Mapping)
	// beforeVerdict, set by tests before Run, runs on the scanning
	// goroutine after a rescan attached a process's files, before it
	// decides whether they were attached late.
	beforeVerdict func(pid int)
}

// procState remembers since when a process has been watched with every
// library it maps already probed.
type procState struct {
	since uint64 // CLOCK_MONOTONIC ns: exec, or the initial scan
	// cleared: libraries attached up to here were proven probed before
	// the process's first call into them (lateAttach).
	cleared uint64
	// unsure: its hold ended unproven before a scan attached its files,
	// and none of its unregistered memory is pageable until the scan's
	// verdict (unsureBeforeAttach).
	unsure bool
}

// New loads the BPF programs. Nothing is attached until Run.
func New(cfg Config) (*Agent, error) {
	if cfg.ProcRoot == "" {
		cfg.ProcRoot = "/proc"
	}
	if cfg.RootFS == "" {
		cfg.RootFS = "/"
	}
	if cfg.RescanInterval == 0 {
		cfg.RescanInterval = 10 * time.Second
	}
	if cfg.ReleaseAfter == 0 {
		cfg.ReleaseAfter = defaultReleaseAfter
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.LogInterval == 0 {
		cfg.LogInterval = time.Minute
	}
	if cfg.Sink == nil {
		return nil, errors.New("agent: no sink for transfers")
	}
	kv, err := KVKernelSet(cfg.KVKernels)
	if err != nil {
		return nil, fmt.Errorf("agent: KV-transfer kernels: %w", err)
	}
	stubs := newStubResolver(cfg.ProcRoot, cfg.Logger)
	var a *Agent
	between := func(idle bool) { a.between(idle) } // a is set before anything is read
	p, err := probes.Load(probes.Options{RingBytes: cfg.RingBytes, NoShedding: cfg.NoShedding, Record: cfg.Record, Logger: cfg.Logger, Between: between,
		AllowSingleStep: cfg.AllowSingleStep})
	if err != nil {
		return nil, err
	}
	pages := newPageStage(cfg.Sink, defaultPageConfig(cfg.Logger))
	a = &Agent{
		cfg:         cfg,
		log:         cfg.Logger,
		probes:      p,
		symbols:     kernelRows(symbolNames(), cfg.Kernels),
		files:       map[probes.FileID]*fileState{},
		engine:      correlate.NewEngine(engineConfig(cfg, pages, kv, stubs)),
		pages:       pages,
		procs:       map[int]*procState{},
		scannedAt:   map[int]uint64{},
		preexisting: map[int]bool{},
		rescan:      make(chan int, 1024),
		held:        make(chan heldReq, 1024),
		providers:   make(chan providerReq, 256),
		contexts:    map[providerReq]bool{},
		fabric:      newFabricState(),

		runtimeLayer: make(chan runtimeLayerReq, 256),
		exited:       make(chan int, 1024),
		pidProbes:    map[int][]*probes.PIDProbes{},
		callers:      newCallerRanges(cfg.ProcRoot),
		stubs:        stubs,
		attachFails:  map[string]uint64{},
		sameFile:     map[probes.Fingerprint]fileVerdict{},
		untraced:     map[int]*untracedState{},
		limited:      newLimitedLog(cfg.Logger, cfg.LogInterval),

		storageWatched: map[uint32]bool{},
		lanes:          newLanes(),
	}
	a.storageLookup()
	if len(cfg.PIDs) > 0 {
		a.targets = map[int]bool{}
		for _, pid := range cfg.PIDs {
			a.targets[pid] = true
		}
	}
	return a, nil
}

// Run attaches, then reads events until ctx is done; then it detaches every
// probe and flushes every pending transfer.
func (a *Agent) Run(ctx context.Context) (err error) {
	defer func() {
		final := a.Stats() // read the BPF counters while they still exist
		a.finishLanes()
		a.finalMu.Lock()
		a.final = &final
		a.finalMu.Unlock()
		err = errors.Join(err, a.close())
	}()

	// Exec/exit first: a process started from here on is seen from its start.
	if err := a.probes.AttachProcessEvents(); err != nil {
		return err
	}
	for _, lib := range a.cfg.Libs {
		if err := a.attachLib(lib); err != nil {
			a.log.Error("cannot probe library", "path", lib, "err", err) // the other targets still run
		}
	}
	a.attachDriver()
	a.initialScan()
	// Holds from here: a process held during the first scan would wait
	// for it to reach its pid.
	beatDone := a.beat(ctx)
	defer beatDone()
	for _, pid := range a.cfg.PIDs { // named: their storage reads from now, not from their next call
		a.storageSeen(uint32(pid))
	}
	a.attached.Store(true)
	if a.cfg.OnReady != nil {
		a.cfg.OnReady()
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		a.discover(stop)
	}()
	go func() {
		<-ctx.Done()
		close(stop)
	}()
	a.pages.start()
	err = a.probes.Read(stop, a.handle)
	wg.Wait()
	a.engineMu.Lock()
	a.engine.Flush()
	a.engineMu.Unlock()
	a.pages.close() // locates what waits, hands it on
	return err
}

// beat tells the hold program the agent is alive (probes.Beat), every
// beatEvery until ctx ends or the returned stop is called. A process is
// held only while the agent beats: with --pid the others would wait for
// nothing, so there it never beats.
func (a *Agent) beat(ctx context.Context) (stop func()) {
	if a.targets != nil || !a.probes.HoldAvailable() {
		return func() {}
	}
	done := make(chan struct{})
	beat := func() {
		if err := a.probes.Beat(); err != nil {
			a.limited.Log(slog.LevelWarn, "beat", "hold map: processes are not held at their loader notification", "err", err)
		}
	}
	beat()
	go func() {
		t := time.NewTicker(beatEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-done:
				return
			case <-t.C:
				beat()
			}
		}
	}()
	return sync.OnceFunc(func() {
		close(done)
		// Stopping: a thread held now goes on at its next check rather
		// than when the beat goes stale (detaching waits for it).
		if err := a.probes.EndBeat(); err != nil {
			a.log.Warn("hold map: end the beat", "err", err)
		}
	})
}

// beatEvery is how often the agent beats: well inside probes.BeatStale.
const beatEvery = probes.BeatStale / 20

// attachLib probes a file named on the command line.
func (a *Agent) attachLib(path string) error {
	abs, err := filepath.Abs(path)
	if err != nil {
		return err
	}
	mf, err := probes.OpenFile(abs)
	if err != nil {
		return err
	}
	defer mf.Close() // closed already when it was read
	id := mf.ID
	v := a.inspectFile(id, abs, 0, func() (*probes.MappedFile, error) { return mf, nil })
	a.filesMu.Lock()
	st := a.files[id]
	probed := st != nil && !st.unprobed
	a.filesMu.Unlock()
	if err := a.probes.MarkKnown(id, probed); err != nil {
		a.log.Warn("hold map", "path", abs, "err", err)
	}
	switch {
	case v.probed:
	case len(v.runtime) > 0:
		// docs/design.md, "One pair per call"
		a.log.Info("CUDA runtime: its calls are traced in the driver it loads; runtime probes are attached to a process only when its driver fails to initialise",
			"path", abs, "runtime entry points", len(v.runtime))
	default:
		return fmt.Errorf("%s: exports none of the probed symbols", abs)
	}
	return nil
}

// attachDriver probes the host's CUDA driver library before any process
// is seen: every process that maps it later (a container's bind-mount of
// it too: the same inode) is traced from its first call, none races the
// attach (docs/design.md, "Attach and discovery").
func (a *Agent) attachDriver() {
	if a.cfg.RootFS == "-" {
		return
	}
	paths, problems := DriverLibraries(a.cfg.RootFS)
	for _, err := range problems {
		a.log.Warn("looking for the CUDA driver library", "root", a.cfg.RootFS, "err", err)
	}
	if len(paths) == 0 {
		a.log.Info("no CUDA driver library under the root filesystem (ld.so.cache, the driver's directories, "+gpuOperatorDriverRoot+
			"): a driver first seen in a process is probed while that process waits at its loader notification", "root", a.cfg.RootFS)
	}
	for _, p := range paths {
		if err := a.attachLib(p); err != nil {
			a.log.Warn("CUDA driver library found but not probed", "path", p, "err", err)
			continue
		}
		a.log.Info("CUDA driver library probed at start", "path", p)
	}
}

// initialScan finds every process that already maps a probed library. Those
// may have registered memory before we looked: they are observed since now.
// Every other process can only register memory through a library it maps
// later, which we will see: it is observed from its start.
func (a *Agent) initialScan() {
	pids := a.cfg.PIDs
	if len(pids) == 0 {
		all, err := listPIDs(a.cfg.ProcRoot)
		if err != nil {
			a.log.Error("cannot list processes", "err", err)
		}
		pids = all
	}
	scanStart := event.Now()
	gen := a.beginFullScan()
	defer a.endFullScan(gen)
	for _, pid := range pids {
		a.procMu.Lock()
		a.scannedAt[pid] = event.Now()
		a.preexisting[pid] = true
		a.procMu.Unlock()
		probed, _, snapshot, err := a.scanProcess(pid)
		if err != nil {
			if a.targets[pid] {
				a.log.Error(describeScanError(pid, err)) // named on the command line: say so
			} else {
				a.log.Debug(describeScanError(pid, err))
			}
			continue
		}
		a.engineMu.Lock()
		if probed {
			a.engine.ObservedSince(uint32(pid), snapshot)
		} else {
			a.engine.ObservedFromStart(uint32(pid))
		}
		a.engineMu.Unlock()
		if !probed {
			a.procMu.Lock()
			a.procs[pid] = &procState{since: scanStart}
			a.procMu.Unlock()
		}
	}
}

// discover rescans processes whose dynamic linker reported a change, and
// every process now and then in case a loader bypassed ld.so.
func (a *Agent) discover(stop <-chan struct{}) {
	tick := time.NewTicker(a.cfg.RescanInterval)
	defer tick.Stop()
	dropTick := time.NewTicker(time.Second)
	defer dropTick.Stop()
	var lastDrops event.Drops
	for {
		select {
		case <-stop:
			return
		case <-dropTick.C:
			lastDrops = a.checkDrops(lastDrops)
		case req := <-a.held:
			a.rescanHeldProcess(req)
		case pid := <-a.rescan:
			a.rescanProcess(pid, false)
		case req := <-a.providers:
			a.attachProvider(req)
		case req := <-a.fabric.reqs:
			a.attachFabric(req)
		case req := <-a.runtimeLayer:
			a.attachRuntime(req)
		case pid := <-a.exited:
			a.detachRuntime(pid)
		case <-tick.C:
			for pid := range a.pidProbes { // exits the channel could not carry
				if _, err := os.Stat(filepath.Join(a.cfg.ProcRoot, strconv.Itoa(pid))); err != nil {
					a.detachRuntime(pid)
				}
			}
			pids := a.cfg.PIDs
			if len(pids) == 0 {
				pids, _ = listPIDs(a.cfg.ProcRoot)
			}
			gen := a.beginFullScan()
			for _, pid := range pids {
				a.rescanProcess(pid, false)
				a.rescanHeld() // a held process waits for no full scan
			}
			a.endFullScan(gen)
			a.releaseUnmapped(gen)
		}
	}
}

// rescanHeld rescans the processes held at their loader notification.
func (a *Agent) rescanHeld() {
	for {
		select {
		case req := <-a.held:
			a.rescanHeldProcess(req)
		default:
			return
		}
	}
}

// heldReq is a process held at its loader notification, and the file it
// waits for (zero: its mappings could not be walked).
type heldReq struct {
	pid  int
	file probes.FileID
}

// rescanHeldProcess rescans a held process. One whose maps the agent may
// not read (CAP_SYS_PTRACE) is released at once by the file it waits for,
// marked not probed: it cannot be traced, so it must not wait for the
// bound.
func (a *Agent) rescanHeldProcess(req heldReq) {
	if err := a.rescanProcess(req.pid, true); !errors.Is(err, fs.ErrPermission) || req.file == (probes.FileID{}) {
		return
	}
	if err := a.probes.MarkKnown(req.file, false); err != nil {
		a.limited.Log(slog.LevelWarn, "hold map", "cannot release a process held at its loader notification (it goes on at the hold's bound)", "pid", req.pid, "err", err)
	}
}

// rescanProcess attaches libraries the process mapped since the last scan.
// If one of them was probed only after the process started, calls made
// through it before that may have been missed (lateAttach): the process is
// no longer observed from its start, and memory mapped before now is
// unknown rather than pageable. held: a thread of it waits at its loader
// notification for this scan. The error is why its maps could not be read.
func (a *Agent) rescanProcess(pid int, held bool) error {
	a.rescans.Add(1)
	probed, lastAttach, snapshot, err := a.scanProcess(pid)
	if err != nil {
		a.log.Debug(describeScanError(pid, err))
		return err
	}
	if !probed {
		return nil
	}
	a.procMu.Lock()
	st, fromStart := a.procs[pid]
	var since, cleared uint64
	if fromStart {
		since, cleared = st.since, st.cleared
	}
	a.procMu.Unlock()
	if !fromStart {
		return nil
	}
	if lastAttach <= max(since, cleared) {
		a.sure(pid)
		return nil
	}
	if a.beforeVerdict != nil {
		a.beforeVerdict(pid)
	}
	switch a.lateAttach(pid, since, lastAttach, held) {
	case attachProven:
		a.procMu.Lock()
		if st := a.procs[pid]; st != nil {
			st.cleared = max(st.cleared, lastAttach)
		}
		a.procMu.Unlock()
		a.sure(pid)
		return nil
	case attachUndecided:
		return nil // its next notification, or a rescan, decides
	}
	a.procMu.Lock()
	delete(a.procs, pid)
	a.procMu.Unlock()
	a.log.Info("library probed after the process started using it: earlier registrations unknown", "pid", pid)
	a.engineMu.Lock()
	a.engine.ObservedSince(uint32(pid), snapshot)
	a.engineMu.Unlock()
	return nil
}

// unsureBeforeAttach is called by a scan before it attaches a process's
// files. A process observed from its start whose hold already ended
// unproven (its bound, or the agent's beat gone stale) went on before
// those files were probed, so it is late (lateAttach) — but its verdict
// comes after the attach, and the copies it makes meanwhile would be
// classified first, its unregistered memory pageable. Until the verdict,
// none of it is: every unregistered address is unknown (late_attach).
func (a *Agent) unsureBeforeAttach(pid int) {
	if !a.probes.HoldAvailable() || a.targets != nil {
		return
	}
	a.procMu.Lock()
	st, fromStart := a.procs[pid]
	var since uint64
	if fromStart {
		since = st.since
	}
	a.procMu.Unlock()
	if !fromStart {
		return
	}
	if v, err := a.probes.VerifiedOf(uint32(pid)); err != nil || !v.BrokenSince(since) {
		return
	}
	a.procMu.Lock()
	if st := a.procs[pid]; st != nil {
		st.unsure = true
	}
	a.procMu.Unlock()
	a.engineMu.Lock()
	a.engine.ObservedSince(uint32(pid), []correlate.Range{{Start: 0, End: ^uint64(0)}})
	a.engineMu.Unlock()
}

// sure ends what unsureBeforeAttach began when the scan found the process
// observed from its start after all.
func (a *Agent) sure(pid int) {
	a.procMu.Lock()
	st := a.procs[pid]
	unsure := st != nil && st.unsure
	if unsure {
		st.unsure = false
	}
	a.procMu.Unlock()
	if unsure {
		a.engineMu.Lock()
		a.engine.ObservedFromStart(uint32(pid))
		a.engineMu.Unlock()
	}
}

// attachVerdict says whether a library attached after a process started
// was probed before the process's first call into it.
type attachVerdict int

const (
	attachLate attachVerdict = iota
	attachProven
	attachUndecided
)

// provenWait is how long the rescan of a held process waits for its
// notification to say it went on (its hold sees the files known at its
// next poll).
const provenWait = 50 * time.Millisecond

// lateAttach decides for a process observed from since whose libraries
// were attached up to attached. ld.so runs no code of the libraries it
// mapped before its notification (_dl_debug_state), and the notification's
// program holds the thread there until every CUDA file the process maps is
// known to the agent (probed) — so a process whose notification proved
// that at or after attached (probes.Verified.OK), and none went on
// unproven since it started, made no call before the probes were in
// (docs/design.md, "Attach and discovery"). Without the hold (a kernel
// that refused it, --pid), attached after since is late, as before.
func (a *Agent) lateAttach(pid int, since, attached uint64, held bool) attachVerdict {
	if !a.probes.HoldAvailable() || a.targets != nil {
		return attachLate
	}
	deadline := time.Now().Add(provenWait)
	for {
		v, err := a.probes.VerifiedOf(uint32(pid))
		switch {
		case err != nil:
			a.log.Debug("read the hold map", "pid", pid, "err", err)
			return attachLate
		case v.BrokenSince(since):
			return attachLate
		case v.Found && v.OK >= attached:
			return attachProven
		}
		if !held || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	// Not proven yet: the process has not reached a notification since the
	// attach. A library ld.so did not load (no notification) is late once
	// a rescan interval passed without one.
	if event.Now()-attached < uint64(a.cfg.RescanInterval) {
		return attachUndecided
	}
	return attachLate
}

// checkDrops says when the BPF side lost events: at most one line per
// LogInterval, with the losses since the previous line. Which processes
// may have lost a registration the events themselves say, in ring order
// (event.Call.LostBefore, correlate.Engine.Losses; docs/design.md, "Ring
// buffer, wakeups, drops"): nothing is marked here.
func (a *Agent) checkDrops(last event.Drops) event.Drops {
	d, err := a.probes.Drops()
	if err != nil {
		a.limited.Log(slog.LevelWarn, "drops\x00read", "read drop counters", "err", err)
		return last
	}
	if d.Total() == last.Total() {
		return last
	}
	since := d.Sub(last)
	var args []any
	for _, r := range since.Reasons() {
		args = append(args, r.Name, r.Count)
	}
	a.engineMu.Lock()
	es := a.engine.Stats()
	a.engineMu.Unlock()
	args = append(args, "processes_marked_lossy", es.LostBefore, "all_marked_lossy", es.LostAny)
	if !a.limited.Log(slog.LevelWarn, "drops", "probe events dropped: the memory of the processes that lost them is unknown from there (host_mem_reason events_lost)", args...) {
		return last // counted into the next line
	}
	return d
}

// handle runs on the reading goroutine for every event, in ring order.
func (a *Agent) handle(c *event.Call) {
	a.events.Add(1)
	if c.LostAny {
		// Every process, traced or not: the event itself may be anyone's.
		a.engineMu.Lock()
		a.engine.Losses(&event.Call{LostAny: true})
		a.engineMu.Unlock()
		c.LostAny = false
		if a.cfg.Lost != nil {
			a.cfg.Lost(0, true)
		}
	}
	if a.targets != nil && !a.targets[int(c.PID)] {
		return
	}
	if c.LostBefore {
		if a.cfg.Lost != nil {
			a.cfg.Lost(c.PID, false) // an exec's or exit's too: the pid's window lost them
		}
		if c.Kind == event.KindExec || c.Kind == event.KindExit || c.Op == event.OpLinkerUpdate {
			// Events the engine does not see: their process's losses go to
			// it here (an exec's or exit's are ignored there).
			a.engineMu.Lock()
			a.engine.Losses(c)
			a.engineMu.Unlock()
		}
	}
	switch c.Kind {
	case event.KindExec:
		a.procMu.Lock()
		if c.Time < a.scannedAt[int(c.PID)] {
			// Queued before the initial scan read this image's maps: the
			// scan's verdict is newer than this event.
			a.procMu.Unlock()
			return
		}
		a.procs[int(c.PID)] = &procState{since: c.Time}
		delete(a.preexisting, int(c.PID))
		a.procMu.Unlock()
		a.engineMu.Lock()
		gpus := a.engine.StreamGPUs(c.PID)
		a.engine.ProcessExit(c.PID) // the old image's memory is gone
		a.engine.ObservedFromStart(c.PID)
		a.engineMu.Unlock()
		a.lanes.exit(c.PID, gpus) // for the old image's copy counters
		a.pages.Exit(c.PID, nil)  // and so are its chunks' nodes
		return
	case event.KindExit:
		a.procMu.Lock()
		delete(a.procs, int(c.PID))
		delete(a.preexisting, int(c.PID))
		a.procMu.Unlock()
		a.fabricExited(int(c.PID))
		a.storageExit(c.PID)
		a.callers.forget(c.PID)
		select {
		case a.exited <- int(c.PID):
		default: // the periodic rescan notices it
		}
		a.engineMu.Lock()
		gpus := a.engine.StreamGPUs(c.PID)
		a.engine.ProcessExit(c.PID)
		a.engineMu.Unlock()
		a.lanes.exit(c.PID, gpus) // for its copy counters, until they are folded
		var onExit func()
		if a.cfg.OnExit != nil {
			pid := c.PID // c is reused for the next event; the exit may wait
			onExit = func() { a.cfg.OnExit(pid) }
		}
		a.pages.Exit(c.PID, onExit) // after the transfers waiting for their pages
		return
	}
	if c.Op == event.OpVerbsContext && c.RDMA.Context != 0 {
		select {
		case a.providers <- providerReq{int(c.PID), c.RDMA.Context}:
		default:
			a.limited.Log(slog.LevelWarn, "provider queue full", "provider resolution queue full: RDMA data path of this context not probed", "pid", c.PID)
		}
	}
	if c.Op == event.OpFabricObject {
		a.fabricObject(c)
	}
	if c.Op == event.OpLinkerUpdate && c.Held {
		select {
		case a.held <- heldReq{int(c.PID), probes.FileID{Dev: c.HeldFile[0], Inode: c.HeldFile[1]}}:
		default: // it goes on at the hold's bound, counted
			a.limited.Log(slog.LevelWarn, "held queue full", "held-process queue full: this process goes on at the hold's bound", "pid", c.PID)
		}
		return
	}
	if c.Op == event.OpLinkerUpdate {
		select {
		case a.rescan <- int(c.PID):
		default: // discovery is behind; the periodic rescan will catch up
		}
		return
	}
	if c.Layer == event.LayerDriver {
		if c.Op == event.OpInit && c.Failed() {
			select {
			case a.runtimeLayer <- runtimeLayerReq{int(c.PID), uint32(c.Ret)}:
			default:
				a.limited.Log(slog.LevelWarn, "runtime queue full", "runtime-layer queue full: this process's failing runtime calls are not traced", "pid", c.PID)
			}
		}
	}
	if c.CallerUnresolved && c.Caller != 0 {
		via, err := a.callers.viaRuntime(c.PID, c.Caller)
		if err != nil {
			a.callerErrs.Add(1)
			a.log.Debug("caller of a driver call not classified: reported under the driver's name", "pid", c.PID, "err", err)
		}
		c.ViaRuntime = via
	}
	if a.cfg.OnCall != nil {
		a.cfg.OnCall(c)
	}
	a.engineMu.Lock()
	a.engine.Handle(c)
	a.engineMu.Unlock()
	a.storageSeen(c.PID)
}

// RDMALatency summarises posted→completed latency per queue pair and opcode.
func (a *Agent) RDMALatency() []correlate.LatencySummary {
	a.engineMu.Lock()
	defer a.engineMu.Unlock()
	return a.engine.RDMALatency()
}

// RDMAStats counts work requests, completions by status and what could not be joined.
func (a *Agent) RDMAStats() correlate.RDMAStats {
	a.engineMu.Lock()
	defer a.engineMu.Unlock()
	return a.engine.RDMAStats()
}

// FabricStats counts libfabric's transfers and what of them could not be
// joined.
func (a *Agent) FabricStats() correlate.FabricStats {
	a.engineMu.Lock()
	defer a.engineMu.Unlock()
	return a.engine.FabricStats()
}

// XferStats counts the transfer libraries' transfers (UCX) and what of
// them could not be joined.
func (a *Agent) XferStats() correlate.XferStats {
	a.engineMu.Lock()
	defer a.engineMu.Unlock()
	return a.engine.XferStats()
}

// Stats reads the agent's counters; after Run returned, their last values.
func (a *Agent) Stats() Stats {
	a.finalMu.Lock()
	final := a.final
	a.finalMu.Unlock()
	if final != nil {
		return *final
	}
	d, err := a.probes.Drops()
	if err != nil {
		a.limited.Log(slog.LevelWarn, "drops\x00read", "read drop counters", "err", err)
	}
	a.engineMu.Lock()
	es := a.engine.Stats()
	a.engineMu.Unlock()
	holds, err := a.probes.HoldStats()
	if err != nil {
		a.limited.Log(slog.LevelWarn, "holds\x00read", "read hold counters", "err", err)
	}
	return Stats{Holds: holds, Events: a.events.Load(), Drops: d, Links: a.probes.Links(), Files: len(a.probes.Files()), Engine: es, Rescans: a.rescans.Load(),
		AttachFailures: a.attachErr.Load(), CallerUnclassified: a.callerErrs.Load(), Pages: a.pages.Stats(), LostExits: a.reap.lost.Load(),
		LibraryDetaches: a.libDetaches.Load()}
}

func (a *Agent) close() error {
	return a.probes.Close()
}
