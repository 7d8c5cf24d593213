package probes

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"
	"github.com/cilium/ebpf/rlimit"

	"github.com/lanewatch/lanewatch/event"
)

// Options configure the loaded programs.
type Options struct {
	// RingBytes is the ring buffer size (a power of two, multiple of the page
	// size). Zero keeps the compiled-in 4 MiB.
	RingBytes uint32
	// WakeupBytes: the reader is woken only when this much data is unread;
	// below it, it drains on its own timer (DrainInterval). Zero: RingBytes/4.
	WakeupBytes uint64
	// DrainInterval is how often the reader drains without a wakeup.
	DrainInterval time.Duration
	// NoShedding keeps every counted copy's event when the ring fills, so
	// a full ring drops whatever comes (tests of losses). By default,
	// past three quarters of the ring unread, the successful copies the
	// BPF flows count are shed, counted there (Flow.Shed), until a
	// quarter or less is unread (docs/design.md 3.3, "Shedding").
	NoShedding bool
	// Between, if set, runs on the reading goroutine between events: with
	// idle true once a drain found the ring empty (every event reserved
	// before that moment was handled), else every BetweenEvents events
	// while events keep coming.
	Between func(idle bool)
	// Record, if set, receives every raw event before decoding: a recorded
	// stream can be replayed offline (bug reports, benchmarks).
	Record io.Writer
	Logger *slog.Logger
	// AllowSingleStep: on arm64, also probe sites the kernel single-steps
	// (refused by default: see chooseSiteHere). x86-64 always may.
	AllowSingleStep bool
}

// Probes owns the loaded BPF objects, every attach point and the reader.
// Close detaches everything, then closes the reader, then the objects.
type Probes struct {
	objs   lanewatchObjects
	hold   *holdObjects // the linker notification with its hold; nil where the kernel refused it (hold.go)
	reader *ringbuf.Reader
	opts   Options
	log    *slog.Logger

	mu        sync.Mutex
	files     map[FileID]*AttachedFile
	pidProbes map[*PIDProbes]bool // probes for one process each
	procLink  []link.Link         // exec/exit tracepoints
}

// FileID identifies a file by device and inode: a library is attached once
// however many processes map it and under whatever path.
type FileID struct {
	Dev   uint64
	Inode uint64
}

// AttachedFile records what was attached in one ELF file.
type AttachedFile struct {
	Path    string
	Sites   map[string]Site // symbol → chosen probe site
	links   []link.Link
	Missing []string // table symbols the file does not export
}

// Load loads the BPF programs and opens the ring buffer reader. It needs
// CAP_BPF and CAP_PERFMON (MissingPrivileges); a missing one is an error
// naming it.
func Load(opts Options) (*Probes, error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.DrainInterval == 0 {
		opts.DrainInterval = 20 * time.Millisecond
	}
	if err := fatalPrivileges(); err != nil {
		return nil, err
	}
	// Kernels from 5.11 charge BPF memory to the memory cgroup, not to
	// RLIMIT_MEMLOCK: there is nothing to lift (and nothing to fail on).
	if kernelBefore(5, 11) {
		if err := rlimit.RemoveMemlock(); err != nil {
			return nil, fmt.Errorf("lift RLIMIT_MEMLOCK for BPF maps (kernel before 5.11): %w", err)
		}
	}
	spec, err := loadLanewatch()
	if err != nil {
		return nil, fmt.Errorf("load BPF spec: %w", err)
	}
	if opts.RingBytes != 0 {
		spec.Maps["events"].MaxEntries = opts.RingBytes
	}
	if opts.WakeupBytes == 0 {
		opts.WakeupBytes = uint64(spec.Maps["events"].MaxEntries) / 4
	}
	if err := spec.Variables["wakeup_bytes"].Set(opts.WakeupBytes); err != nil {
		return nil, fmt.Errorf("set wakeup_bytes: %w", err)
	}
	if !opts.NoShedding {
		ring := uint64(spec.Maps["events"].MaxEntries)
		if err := errors.Join(spec.Variables["shed_on_bytes"].Set(ring-ring/4), spec.Variables["shed_off_bytes"].Set(ring/4)); err != nil {
			return nil, fmt.Errorf("set the shedding bounds: %w", err)
		}
	}
	if err := setPIDNamespace(spec, opts.Logger); err != nil {
		return nil, err
	}
	p := &Probes{opts: opts, log: opts.Logger, files: map[FileID]*AttachedFile{}, pidProbes: map[*PIDProbes]bool{}}
	if err := spec.LoadAndAssign(&p.objs, nil); err != nil {
		var verr *ebpf.VerifierError
		if errors.As(err, &verr) {
			return nil, fmt.Errorf("load BPF programs: %+v", verr)
		}
		return nil, fmt.Errorf("load BPF programs: %w", err)
	}
	if err := p.fillCountRows(); err != nil {
		p.Close()
		return nil, err
	}
	p.loadHold()
	p.reader, err = ringbuf.NewReader(p.objs.Events)
	if err != nil {
		p.Close()
		return nil, fmt.Errorf("open ring buffer: %w", err)
	}
	return p, nil
}

// AttachProcessEvents attaches the exec/exit tracepoints (tp_btf: no tracefs needed).
func (p *Probes) AttachProcessEvents() error {
	for _, prog := range []*ebpf.Program{p.objs.LwExec, p.objs.LwExit} {
		l, err := link.AttachTracing(link.TracingOptions{Program: prog})
		if err != nil {
			return fmt.Errorf("attach %s: %w", prog, err)
		}
		p.mu.Lock()
		p.procLink = append(p.procLink, l)
		p.mu.Unlock()
	}
	return nil
}

// AttachFile attaches every table row whose symbol syms names, at the
// cheapest safe site of each. Symbol offsets are file offsets; provider rows
// ("provider:post_send") come with offsets read from a process's ops table.
// pid > 0 limits the probes to one process. Rows already attached in this
// file are skipped, so a file is probed once per row however often it is
// found; on a failure the links made by this call are closed again.
func (p *Probes) AttachFile(id FileID, path string, syms map[string]Symbol, pid int) (*AttachedFile, error) {
	return p.AttachFileAs(id, path, path, syms, pid)
}

// AttachFileAs is AttachFile for a file the agent opens by another path
// than its name: a MappedFile's /proc/self/fd/N. name is what
// AttachedFile.Path reports (the path as the process sees it).
func (p *Probes) AttachFileAs(id FileID, name, path string, syms map[string]Symbol, pid int) (*AttachedFile, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	af := p.files[id]
	if af == nil {
		af = &AttachedFile{Path: name, Sites: map[string]Site{}}
	}
	plan, chosen, err := planSites(path, syms, func(sym string) bool { _, done := af.Sites[sym]; return done }, p.sitePolicy())
	if err != nil {
		return nil, err
	}
	if len(chosen) == 0 {
		if p.files[id] == nil {
			af.Missing = missingRows(syms)
			p.files[id] = af
		}
		return af, nil
	}
	made, err := p.attachPlan(path, plan, pid)
	if err != nil {
		return nil, err
	}
	af.links = append(af.links, made...)
	for sym, site := range chosen {
		af.Sites[sym] = site
	}
	af.Missing = missingRows(syms)
	p.files[id] = af
	return af, nil
}

// PIDProbes are probes attached for one process only (AttachPID).
type PIDProbes struct {
	Path  string
	Sites map[string]Site
	p     *Probes
	links []link.Link
}

// AttachPID attaches the rows syms names in the file at path, for process
// pid only: the kernel then places no breakpoint in any other process.
// They are kept apart from the file's own attachments (AttachFile) and
// detached by Close (or by Probes.Close).
func (p *Probes) AttachPID(path string, syms map[string]Symbol, pid int) (*PIDProbes, error) {
	if pid <= 0 {
		return nil, fmt.Errorf("attach %s for pid %d: not a process", path, pid)
	}
	plan, chosen, err := planSites(path, syms, func(string) bool { return false }, p.sitePolicy())
	if err != nil {
		return nil, err
	}
	pp := &PIDProbes{Path: path, Sites: chosen, p: p}
	if len(chosen) == 0 {
		return pp, nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if pp.links, err = p.attachPlan(path, plan, pid); err != nil {
		return nil, err
	}
	p.pidProbes[pp] = true
	return pp, nil
}

// sitePolicy is the site policy of Options.
func (p *Probes) sitePolicy() sitePolicy { return sitePolicy{allowSingleStep: p.opts.AllowSingleStep} }

// Close detaches the process's probes.
func (pp *PIDProbes) Close() error {
	pp.p.mu.Lock()
	delete(pp.p.pidProbes, pp)
	links := pp.links
	pp.links = nil
	pp.p.mu.Unlock()
	return closeLinks(links)
}

// planSites chooses the site of every table row syms names (skipping those
// done says are attached already) and groups them by program.
func planSites(path string, syms map[string]Symbol, done func(sym string) bool, pol sitePolicy) (map[Program]*sites, map[string]Site, error) {
	plan := map[Program]*sites{}
	chosen := map[string]Site{}
	err := eachSite(path, syms, done, pol, func(i int, at uint64, site Site, err error) error {
		if err != nil {
			return err
		}
		row := &Table[i]
		if plan[row.Program] == nil {
			plan[row.Program] = &sites{}
		}
		plan[row.Program].add(at, Cookie(i, site.SPDelta))
		chosen[row.Symbol] = site
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	return plan, chosen, nil
}

// eachSite chooses the site of every table row syms names, in table order,
// skipping those done says are attached already, and hands each (or why it
// has none) to fn; an error from fn stops the walk.
func eachSite(path string, syms map[string]Symbol, done func(sym string) bool, pol sitePolicy, fn func(row int, at uint64, site Site, err error) error) error {
	var thunks *ThunkResolver // opened at the first symbol, for all of them
	defer func() {
		if thunks != nil {
			thunks.Close()
		}
	}()
	impls := map[uint64]string{} // implementation → the row that probes it
	for i := range Table {
		row := &Table[i]
		sym, ok := syms[row.Symbol]
		if !ok || done(row.Symbol) {
			continue
		}
		provider := strings.HasPrefix(row.Symbol, ProviderPrefix)    // found by offset, no symbol to decode
		if thunks == nil && !provider && runtime.GOARCH == "amd64" { // dispatch thunks are decoded as x86-64
			var err error
			if thunks, err = NewThunkResolver(path); err != nil {
				return err
			}
		}
		resolver := thunks
		if provider {
			resolver = nil
		}
		at, site, err := chooseSite(path, row.Symbol, sym, resolver, impls, pol)
		if err := fn(i, at, site, err); err != nil {
			return err
		}
	}
	return nil
}

// SymbolCoverage is what the agent does with one table row in one file.
type SymbolCoverage struct {
	Symbol  string
	Layer   event.Layer
	Present bool  // the file exports the symbol
	Site    Site  // where it is probed, when Present and Err is nil
	Err     error // why no site could be chosen
}

// Coverage lists, for every layer of which path exports at least one table
// symbol, each of that layer's rows: absent, or the site the agent would
// probe it at (through a dispatch thunk where it is one), without attaching
// anything. RDMA provider rows, found by offset at run time, are not listed.
func Coverage(path string) ([]SymbolCoverage, error) {
	var names []string
	for _, row := range Table {
		if !strings.HasPrefix(row.Symbol, ProviderPrefix) {
			names = append(names, row.Symbol)
		}
	}
	syms, err := LookupSymbols(path, names)
	if err != nil {
		return nil, err
	}
	layers := map[event.Layer]bool{}
	for _, row := range Table {
		if _, ok := syms[row.Symbol]; ok {
			layers[row.Layer] = true
		}
	}
	byRow := map[int]SymbolCoverage{}
	err = eachSite(path, syms, func(string) bool { return false }, sitePolicy{}, func(i int, _ uint64, site Site, err error) error {
		byRow[i] = SymbolCoverage{Symbol: Table[i].Symbol, Layer: Table[i].Layer, Present: true, Site: site, Err: err}
		return nil
	})
	if err != nil {
		return nil, err
	}
	var out []SymbolCoverage
	for i, row := range Table {
		if !layers[row.Layer] || strings.HasPrefix(row.Symbol, ProviderPrefix) {
			continue
		}
		c, ok := byRow[i]
		if !ok {
			c = SymbolCoverage{Symbol: row.Symbol, Layer: row.Layer}
		}
		out = append(out, c)
	}
	return out, nil
}

// chooseSite picks where to probe one symbol and returns that file offset.
// A dispatch thunk (docs/design.md, "NVIDIA's real libraries") is probed at
// its implementation, whose first instruction the kernel emulates, when the
// thunk is proven to hand its arguments over untouched and the
// implementation to be a function start no other row probes; otherwise the
// thunk itself, saying why in Site.NotResolved.
func chooseSite(path, name string, sym Symbol, thunks *ThunkResolver, impls map[uint64]string, pol sitePolicy) (uint64, Site, error) {
	var note string
	if thunks != nil {
		t, err := thunks.Resolve(sym)
		switch {
		case err == nil && impls[t.Impl] != "":
			note = fmt.Sprintf("implementation %#x is also %s's: probed at the thunk so each row keeps its own site", t.Impl, impls[t.Impl])
		case err == nil:
			code, err := ReadCode(path, t.ImplOffset, 16)
			if err != nil {
				return 0, Site{}, fmt.Errorf("%s: read %s's implementation: %w", path, name, err)
			}
			site, err := pol.choose(code)
			if err != nil {
				return 0, Site{}, fmt.Errorf("%s: %s's implementation %#x: %w", path, name, t.Impl, err)
			}
			impls[t.Impl] = name
			site.Thunk = &t
			return t.ImplOffset + site.Offset, site, nil
		case !errors.Is(err, ErrNotThunk):
			note = err.Error()
		}
	}
	code, err := ReadCode(path, sym.Offset, 16)
	if err != nil {
		return 0, Site{}, fmt.Errorf("%s: read %s: %w", path, name, err)
	}
	site, err := pol.choose(code)
	if err != nil {
		return 0, Site{}, fmt.Errorf("%s: %s: %w", path, name, err)
	}
	site.NotResolved = note
	return sym.Offset + site.Offset, site, nil
}

// attachPlan makes the links of a plan: per program, one uprobe_multi link
// with every site, the return half of a pair before its entry half. A
// return probe fires only for calls entered after it was attached, so no
// call can leave its entry in the thread's slot without its return (which
// the next call of that layer would take for a lost call, and the process
// for lossy: docs/design.md, "Ring buffer, wakeups, drops"); a call
// entered in between returns without its entry, counted as lost_return.
// On a failure the links made so far are closed again.
func (p *Probes) attachPlan(path string, plan map[Program]*sites, pid int) ([]link.Link, error) {
	ex, err := link.OpenExecutable(path)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	var made []link.Link
	for _, prog := range slices.Sorted(maps.Keys(plan)) {
		s := plan[prog]
		progs := p.programsFor(prog)
		slices.Reverse(progs) // return first
		for _, a := range progs {
			opts := &link.UprobeMultiOptions{Addresses: s.addrs, Cookies: s.cookies, PID: uint32(pid)}
			var l link.Link
			if a.isReturn {
				l, err = ex.UretprobeMulti(nil, a.prog, opts)
			} else {
				l, err = ex.UprobeMulti(nil, a.prog, opts)
			}
			if err != nil {
				closeLinks(made) // never leave an entry probe whose return half is missing
				return nil, fmt.Errorf("%s: attach %s at %d sites: %w", path, a.prog, len(s.addrs), err)
			}
			made = append(made, l)
		}
	}
	return made, nil
}

type attachProg struct {
	prog     *ebpf.Program
	isReturn bool
}

// programsFor lists the programs a row's Program needs, entry first.
func (p *Probes) programsFor(prog Program) []attachProg {
	switch prog {
	case ProgEntry:
		return []attachProg{{p.objs.LwCall, false}}
	case ProgLinker:
		if p.hold != nil {
			return []attachProg{{p.hold.LwLinkerHold, false}}
		}
		return []attachProg{{p.objs.LwCall, false}}
	case ProgBatch:
		return []attachProg{{p.objs.LwBatch, false}, {p.objs.LwCallReturn, true}}
	case ProgCopy2D:
		return []attachProg{{p.objs.LwCopy2dEnter, false}, {p.objs.LwCallReturn, true}}
	case ProgEntryReturn:
		return []attachProg{{p.objs.LwCallEnter, false}, {p.objs.LwCallReturn, true}}
	case ProgProp:
		return []attachProg{{p.objs.LwPropEnter, false}, {p.objs.LwCallReturn, true}}
	case ProgName:
		return []attachProg{{p.objs.LwCallEnter, false}, {p.objs.LwNameReturn, true}}
	case ProgLaunchEx:
		return []attachProg{{p.objs.LwLaunchExEnter, false}, {p.objs.LwCallReturn, true}}
	case ProgModifyQP:
		return []attachProg{{p.objs.LwModifyQpEnter, false}, {p.objs.LwCallReturn, true}}
	case ProgPostSend:
		return []attachProg{{p.objs.LwPostSend, false}}
	case ProgPostRecv:
		return []attachProg{{p.objs.LwPostRecv, false}}
	case ProgPollCQ:
		return []attachProg{{p.objs.LwCallEnter, false}, {p.objs.LwPollCqReturn, true}}
	case ProgUCP:
		return []attachProg{{p.objs.LwUcpEnter, false}, {p.objs.LwCallReturn, true}}
	case ProgUCTLane:
		return []attachProg{{p.objs.LwUctLane, false}}
	case ProgUCTIface:
		return []attachProg{{p.objs.LwUctIfaceEnter, false}, {p.objs.LwCallReturn, true}}
	case ProgUCPMemMap:
		return []attachProg{{p.objs.LwUcpMemMapEnter, false}, {p.objs.LwCallReturn, true}}
	case ProgFabricMsg:
		return []attachProg{{p.objs.LwFabricMsgEnter, false}, {p.objs.LwCallReturn, true}}
	case ProgFabricRMAMsg:
		return []attachProg{{p.objs.LwFabricRmaMsgEnter, false}, {p.objs.LwCallReturn, true}}
	}
	return nil
}

// missingRows lists the exported-symbol rows a file lacks (provider rows
// are never exported, so they are not "missing").
func missingRows(syms map[string]Symbol) []string {
	var out []string
	for _, row := range Table {
		if _, ok := syms[row.Symbol]; !ok && !strings.HasPrefix(row.Symbol, ProviderPrefix) {
			out = append(out, row.Symbol)
		}
	}
	return out
}

// sites collects the file offsets and cookies of one program's attach points.
type sites struct {
	addrs   []uint64
	cookies []uint64
}

func (s *sites) add(addr, cookie uint64) {
	s.addrs = append(s.addrs, addr)
	s.cookies = append(s.cookies, cookie)
}

// closeLinks detaches links, keeping every error. Each detach waits for
// the kernel's RCU grace periods (tens of ms per uprobe-multi link): they
// run side by side, so that shutdown does not grow with the libraries
// probed.
func closeLinks(links []link.Link) error {
	errs := make([]error, len(links))
	var wg sync.WaitGroup
	next := make(chan int)
	for range min(len(links), closeWorkers) {
		wg.Go(func() {
			for i := range next {
				errs[i] = links[i].Close()
			}
		})
	}
	for i := range links {
		next <- i
	}
	close(next)
	wg.Wait()
	return errors.Join(errs...)
}

// closeWorkers bounds the links detached at once (each holds a thread).
const closeWorkers = 32

// Files returns a copy of what is attached, by file.
func (p *Probes) Files() map[FileID]AttachedFile {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[FileID]AttachedFile, len(p.files))
	for id, af := range p.files {
		out[id] = *af
	}
	return out
}

// DetachFile removes every probe attached in one file (AttachFile), and
// returns how many links it closed: the file is then unknown to Probes, and
// attaching it again starts afresh. Its links count in Links until they
// are closed. The caller attaches nothing in the file meanwhile.
func (p *Probes) DetachFile(id FileID) (int, error) {
	p.mu.Lock()
	af := p.files[id]
	var links []link.Link
	if af != nil {
		links = af.links
	}
	p.mu.Unlock()
	if af == nil {
		return 0, nil
	}
	err := closeLinks(links) // not under mu: tens of ms each
	p.mu.Lock()
	if p.files[id] == af {
		delete(p.files, id)
	}
	p.mu.Unlock()
	return len(links), err
}

// FileLinks is the number of links attached in one file.
func (p *Probes) FileLinks(id FileID) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if af := p.files[id]; af != nil {
		return len(af.links)
	}
	return 0
}

// Links is the number of attach points in place.
func (p *Probes) Links() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.procLink)
	for _, af := range p.files {
		n += len(af.links)
	}
	for pp := range p.pidProbes {
		n += len(pp.links)
	}
	return n
}

// Drops sums the per-CPU drop counters by reason (enum lw_drop_reason).
func (p *Probes) Drops() (event.Drops, error) {
	var d event.Drops
	for reason, dst := range map[lanewatchLwDropReason]*uint64{
		lanewatchLwDropReasonLW_DROP_RING_FULL: &d.RingFull, lanewatchLwDropReasonLW_DROP_NO_ENTRY: &d.NoEntry,
		lanewatchLwDropReasonLW_DROP_BATCH_TRUNC: &d.BatchTrunc, lanewatchLwDropReasonLW_DROP_READ_FAULT: &d.ReadFault,
		lanewatchLwDropReasonLW_DROP_WR_TRUNC: &d.WRTrunc,
	} {
		var perCPU []uint64
		if err := p.objs.Drops.Lookup(uint32(reason), &perCPU); err != nil {
			return d, fmt.Errorf("read drop counter %d: %w", reason, err)
		}
		for _, v := range perCPU {
			*dst += v
		}
	}
	return d, nil
}

// BetweenEvents is how many events Read handles between two calls of
// Options.Between while the ring is never found empty.
const BetweenEvents = 1 << 16

// Read drains the ring buffer until stop is closed, calling handle for every
// event in order. handle runs on the reading goroutine and must not block; the
// Call it receives is reused for the next event.
func (p *Probes) Read(stop <-chan struct{}, handle func(*event.Call)) error {
	var rec ringbuf.Record
	var call event.Call
	for {
		select {
		case <-stop:
			return p.drain(&rec, &call, handle)
		default:
		}
		p.reader.SetDeadline(time.Now().Add(p.opts.DrainInterval))
		for n := 1; ; n++ {
			if p.opts.Between != nil && n%BetweenEvents == 0 {
				p.opts.Between(false)
			}
			err := p.reader.ReadInto(&rec)
			if errors.Is(err, os.ErrDeadlineExceeded) {
				if p.opts.Between != nil {
					p.opts.Between(true)
				}
				break
			}
			if errors.Is(err, ringbuf.ErrClosed) {
				return nil
			}
			if err != nil {
				return fmt.Errorf("read ring buffer: %w", err)
			}
			p.record(rec.RawSample)
			if err := Decode(rec.RawSample, &call); err != nil {
				p.log.Warn("bad event", "err", err)
				continue
			}
			handle(&call)
		}
	}
}

// record copies a raw event to Options.Record; the first write error stops
// recording and is logged once.
func (p *Probes) record(raw []byte) {
	if p.opts.Record == nil {
		return
	}
	if _, err := p.opts.Record.Write(raw[:min(len(raw), EventSize)]); err != nil {
		p.log.Error("recording stopped", "err", err)
		p.opts.Record = nil
	}
}

// drain hands over what is left in the ring without waiting.
func (p *Probes) drain(rec *ringbuf.Record, call *event.Call, handle func(*event.Call)) error {
	p.reader.SetDeadline(time.Now())
	for {
		err := p.reader.ReadInto(rec)
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, ringbuf.ErrClosed) {
				return nil
			}
			return err
		}
		p.record(rec.RawSample)
		if Decode(rec.RawSample, call) == nil {
			handle(call)
		}
	}
}

// Close detaches every probe, then closes the reader and the objects,
// returning the first error.
func (p *Probes) Close() error {
	p.mu.Lock()
	all := p.procLink
	for _, af := range p.files {
		all = append(all, af.links...)
		af.links = nil
	}
	for pp := range p.pidProbes {
		all = append(all, pp.links...)
		pp.links = nil
	}
	p.pidProbes = map[*PIDProbes]bool{}
	errs := []error{closeLinks(all)}
	p.files = map[FileID]*AttachedFile{}
	p.procLink = nil
	p.mu.Unlock()
	if p.reader != nil {
		errs = append(errs, p.reader.Close())
	}
	if p.hold != nil {
		errs = append(errs, p.hold.Close())
	}
	errs = append(errs, p.objs.Close())
	return errors.Join(errs...)
}
