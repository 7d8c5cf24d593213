package correlate

import (
	"slices"
	"time"

	"github.com/lanewatch/lanewatch/event"
)

// Sink receives every transfer exactly once. The pointer is only valid
// during the call: a sink that keeps the transfer must copy it.
type Sink interface {
	Transfer(*Transfer)
}

// SinkFunc adapts a function to Sink.
type SinkFunc func(*Transfer)

// Transfer calls f(t).
func (f SinkFunc) Transfer(t *Transfer) { f(t) }

// Defaults of Config.
const (
	DefaultPendingTimeout = 10 * time.Second
	DefaultMaxPending     = 1 << 16
	maxHandles            = 4096 // streams and events kept per process
	maxThreads            = 1 << 16
)

// Config tunes an Engine. The zero value works, with a sink that discards.
type Config struct {
	Sink Sink
	// PendingTimeout is how long, in event time (event.Call.Time), a
	// transfer waits for a synchronisation to prove its completion before
	// it is emitted without one.
	PendingTimeout time.Duration
	// MaxPending caps the transfers waiting per process; past it the oldest
	// is emitted without completion and counted.
	MaxPending int
	// MaxProcesses caps the processes tracked (registry included; every
	// process the caller calls ObservedFromStart/ObservedSince for counts,
	// default 32768). Events of processes past it are counted, and their
	// copies emitted at once with unknown memory.
	MaxProcesses int
	// MaxRanges caps pinned and device ranges per process, each.
	MaxRanges int
	// ExecObserved makes an exec event that reaches Handle mark the process
	// observed from its start. Leave it false when the caller decides that
	// itself (it knows whether its probes cover the new image).
	ExecObserved bool
	// Devices names the PCI address of a process's CUDA device ordinal when
	// the process did not say it itself (cuDeviceGetPCIBusId); nil: only
	// what processes said. See DeviceMap.
	Devices DeviceMap
	// KVKernels are the KV-transfer kernels whose launches are transfers
	// moved by SMs (docs/design.md, "Kernel movers"); nil: none.
	KVKernels *KernelSet
	// StubName is the symbol of the function at addr in process pid (a
	// host stub the runtime layer saw launched), "" unknown; asked once per
	// process and address, on the engine's goroutine. nil: runtime-layer
	// launches are unnamed.
	StubName func(pid uint32, addr uint64) string
	// Activity receives the launches, host waits and event records that
	// succeeded (computeoverlap.go); nil: none.
	Activity ActivitySink
}

// Stats are the engine's counters.
type Stats struct {
	Events         uint64 // calls and process events handled
	Transfers      uint64 // transfers emitted
	Completed      uint64 // ... of which with a proven completion time
	Merged         uint64 // driver calls folded into their runtime call
	TimedOut       uint64 // emitted without completion after PendingTimeout
	PendingEvicted uint64 // emitted without completion because MaxPending was hit
	FailedCalls    uint64 // calls that returned an error: reported, with no effect
	UnknownProbe   uint64 // events of an unknown kind or probe row
	HandleCapHits  uint64 // stream, event or thread tables of a process reset at their cap
	RangeCapHits   uint64 // registrations not kept (process marked lossy)
	ProcessCapHits uint64 // events of processes past MaxProcesses
	UnmatchedFrees uint64 // unregister/free of a range not held
	DeviceCapHits  uint64 // context, thread or stack state dropped at its cap (devices unknown after)
	Kernels        KernelStats
	Graphs         GraphStats // CUDA graph launches and stream captures (graphs.go)
	// LostBefore counts events that said their process lost events before
	// them (event.Call.LostBefore): each made that process lossy there.
	// LostAny counts events that said any process may have (LostAny).
	LostBefore, LostAny uint64
}

// perThreadStream tags a stream key as a thread's per-thread default
// stream; user-space stream handles are pointers far below this bit.
const perThreadStream = 1 << 63

// slot is the last call a thread made, kept until its next call so that a
// runtime call and the driver call nested in it become one.
type slot struct {
	valid      bool
	op         event.Op
	layer      event.Layer
	kind       event.CopyKind
	start, end uint64
	dst, src   uint64
	bytes      uint64
	ptr, size  uint64
	handle     uint64
	ev, key    uint64
	hasTx      bool
	tx         ref
	batch      []ref // the entries of the batch copy in flight
	// near is the copy a wait entered now would prove close to it
	// (Transfer.CompleteNear): the thread's last call, or the copy before
	// an event record on its stream that is the last call.
	near    ref
	hasNear bool
}

// proc is the engine's state of one process.
type proc struct {
	pid     uint32
	mem     *procMem
	threads map[uint32]*slot
	streams map[uint64]*stream
	events  map[uint64]*cudaEvent
	fifo    queue // pending transfers, oldest first
	live    int
	dev     devices     // contexts, threads' current devices, owners of device memory (device.go)
	kernels procKernels // kernel handles and their names (kernels.go)
	// capture: the streams being captured into a graph, each mapped to the
	// stream whose capture it is part of (graphs.go); nil when none ever was.
	capture map[uint64]uint64
}

// Engine correlates probe calls into transfers. It is not safe for
// concurrent use: feed it from one goroutine, in ring buffer order.
type Engine struct {
	cfg        Config
	sink       Sink
	timeout    uint64
	sweepEvery uint64
	reg        *Registry
	procs      map[uint32]*proc
	last       *proc

	txs  []pending
	free []int32
	seq  uint64

	now, lastSweep uint64
	stats          Stats
	scratch        Transfer

	rdma   *rdmaTracker
	xfer   *xferTracker
	fabric fabricTracker // libfabric (fabric.go)

	devCapHits uint64 // DeviceCapHits of processes that exited

	kernelInfos map[string]kernelInfo // symbol → function name, KV-transfer or not
	kstats      KernelStats
	gstats      GraphStats

	act Activity // the activity being handed to cfg.Activity

	// near is the copy the wait being applied proves close to it, if that
	// wait completes it (Handle sets it around apply).
	near    ref
	hasNear bool
}

// NewEngine returns an engine with cfg's zero fields set to the defaults.
func NewEngine(cfg Config) *Engine {
	if cfg.Sink == nil {
		cfg.Sink = SinkFunc(func(*Transfer) {})
	}
	if cfg.PendingTimeout <= 0 {
		cfg.PendingTimeout = DefaultPendingTimeout
	}
	if cfg.MaxPending <= 0 {
		cfg.MaxPending = DefaultMaxPending
	}
	e := &Engine{
		cfg:     cfg,
		sink:    cfg.Sink,
		timeout: uint64(cfg.PendingTimeout),
		reg:     NewRegistry(cfg.MaxRanges, cfg.MaxProcesses),
		rdma:    newRDMATracker(),
		xfer:    newXferTracker(),
		procs:   map[uint32]*proc{},

		kernelInfos: map[string]kernelInfo{},
	}
	e.sweepEvery = max(e.timeout/8, 1)
	return e
}

// ObservedFromStart says every registration of the process can be seen
// (it started after the probes were in place).
func (e *Engine) ObservedFromStart(pid uint32) { e.reg.ObservedFromStart(pid) }

// ObservedSince says the agent began watching a running process whose
// address space then held snapshot. See Registry.ObservedSince.
func (e *Engine) ObservedSince(pid uint32, snapshot []Range) { e.reg.ObservedSince(pid, snapshot) }

// EventsLost says any process may have lost events: every process known
// now is lossy from here (Registry.MarkLossy).
func (e *Engine) EventsLost() {
	for pid := range e.reg.procs {
		e.reg.MarkLossy(pid)
	}
}

// Losses applies what c says of events lost before it, in ring order:
// its process (LostBefore), or every process (LostAny), lost events, so
// from c on their registrations are no longer proven (Registry.MarkLossy).
// Handle calls it; a caller that handles some events itself (exec, exit,
// the dynamic linker's notices) calls it for those. The losses an exec or
// exit event says of its process were the old image's: left alone.
func (e *Engine) Losses(c *event.Call) {
	if c.LostAny {
		e.stats.LostAny++
		e.EventsLost()
	}
	if c.LostBefore && c.Kind != event.KindExec && c.Kind != event.KindExit {
		e.stats.LostBefore++
		e.reg.MarkLossy(c.PID)
	}
}

// Processes lists the processes the engine holds state of (ranges,
// streams, pending transfers, what it was told it could see).
func (e *Engine) Processes() []uint32 {
	out := make([]uint32, 0, len(e.reg.procs)+len(e.procs))
	for pid := range e.reg.procs {
		out = append(out, pid)
	}
	for pid := range e.procs {
		if e.reg.procs[pid] == nil {
			out = append(out, pid)
		}
	}
	return out
}

// Pinned returns the process's live pinned host ranges.
func (e *Engine) Pinned(pid uint32) []Range { return e.reg.Pinned(pid) }

// PinnedPIDs lists the processes that hold pinned host ranges.
func (e *Engine) PinnedPIDs() []uint32 { return e.reg.PinnedPIDs() }

// Lookup classifies an address of a process from the registry.
func (e *Engine) Lookup(pid uint32, addr uint64) (event.MemKind, uint64) {
	return e.reg.Lookup(pid, addr)
}

// Stats returns the counters.
func (e *Engine) Stats() Stats {
	s := e.stats
	rs := e.reg.Stats()
	s.RangeCapHits, s.ProcessCapHits, s.UnmatchedFrees = rs.RangeCapHits, rs.ProcessCapHits, rs.UnmatchedFrees
	s.DeviceCapHits = e.devCapHits
	for _, p := range e.procs {
		s.DeviceCapHits += p.dev.capHits
	}
	s.Kernels = e.kstats
	s.Graphs = e.gstats
	return s
}

// Handle consumes one decoded call. Calls must come in ring buffer order.
func (e *Engine) Handle(c *event.Call) {
	e.stats.Events++
	if c.LostBefore || c.LostAny {
		e.Losses(c)
	}
	if c.Time > e.now {
		e.now = c.Time
		if e.now-e.lastSweep >= e.sweepEvery {
			e.lastSweep = e.now
			e.sweep()
		}
	}
	switch c.Kind {
	case event.KindCall, event.KindBatchEntry:
	case event.KindName:
		if p := e.proc(c.PID); p != nil {
			p.kernels.init(&e.kstats.CapHits)
			p.kernels.piece(c)
		}
		return
	case event.KindWR, event.KindWC:
		e.rdma.handle(e, c)
		return
	case event.KindExit:
		e.ProcessExit(c.PID)
		return
	case event.KindExec:
		e.ProcessExit(c.PID) // the old image's memory and streams are gone
		if e.cfg.ExecObserved {
			e.ObservedFromStart(c.PID)
		}
		return
	default:
		e.stats.UnknownProbe++
		return
	}
	switch {
	case c.Layer == event.LayerVerbs:
		e.rdma.handle(e, c)
		return
	case c.Layer == event.LayerUCP || c.Layer == event.LayerUCT:
		e.xfer.handleUCX(e, c)
		return
	case c.Layer == event.LayerFabric:
		e.fabric.handle(e, c)
		return
	case c.Op == event.OpLinkerUpdate:
		return // the caller rescans the process; nothing to correlate
	case !c.Op.IsCUDA(), c.Layer != event.LayerRuntime && c.Layer != event.LayerDriver:
		e.stats.UnknownProbe++
		return
	}
	batchResult := c.Kind == event.KindCall && c.Op == event.OpCopyBatch
	p := e.proc(c.PID)
	if p == nil {
		// A kernel call of an untracked process is no record: its kernel is unknown (kernels.go).
		if c.Failed() && !c.Op.IsKernel() || c.Op.IsCopy() && !batchResult {
			e.emitUntracked(c)
		}
		return
	}
	key := streamKey(c)
	th := p.threads[c.TID]
	if th == nil {
		if len(p.threads) >= maxThreads {
			e.forgetThreads(p)
		}
		th = &slot{}
		p.threads[c.TID] = th
	}
	if batchResult {
		// A batch copy's entries came at entry; this is the call's result.
		e.batchDone(th, c)
		return
	}
	if th.valid {
		if twin(th, c, key) {
			e.merge(th, c)
			return
		}
		e.close(th)
	}
	batch := th.batch[:0]
	if c.Kind == event.KindBatchEntry {
		batch = th.batch // the entries of one call gather until its result
	}
	near, hasNear := th.nearNext(c.Op, key)
	*th = slot{valid: true, op: c.Op, layer: c.Layer, kind: c.CopyKind, start: c.Time, end: c.ReturnTime,
		dst: c.Dst, src: c.Src, bytes: c.Bytes, ptr: c.Ptr, size: c.Size, handle: c.Handle, ev: c.Event, key: key, batch: batch,
		near: near, hasNear: hasNear}
	switch {
	case len(p.capture) > 0 && e.captured(p, c, key):
		// recorded into a graph: it runs at the graph's launches (graphs.go)
	case c.Op == event.OpLaunch:
		p.kernels.init(&e.kstats.CapHits)
		th.tx, th.hasTx = e.launch(p, c, key)
	case c.Op.IsKernel():
		p.kernels.init(&e.kstats.CapHits)
		p.kernels.apply(c)
	case c.Op == event.OpCaptureEnd:
		e.endCapture(p, key) // also when it failed: an invalidated capture ends too
		if c.Failed() {
			th.tx, th.hasTx = e.failed(p, c), true
		}
	case c.Failed():
		th.tx, th.hasTx = e.failed(p, c), true
	case c.Op.IsCopy():
		th.tx, th.hasTx = e.copy(p, c, key), true
		if c.Kind == event.KindBatchEntry {
			th.batch = append(th.batch, th.tx)
		}
	default:
		e.near, e.hasNear = near, hasNear
		e.apply(p, c, key)
		e.hasNear = false
	}
}

// nearNext is the copy a call of the thread made now (op on stream key)
// follows closely: the thread's last call if it was a copy (for an event
// record, a copy on the record's stream), or the copy its last call, an
// event record on that copy's stream, followed.
func (s *slot) nearNext(op event.Op, key uint64) (ref, bool) {
	switch {
	case s.hasTx && s.op.IsCopy():
		return s.tx, op != event.OpEventRecord || key == s.key
	case s.hasNear && s.op == event.OpEventRecord:
		return s.near, true
	}
	return ref{}, false
}

// batchDone applies a batch copy's result to the entries it reported at
// entry: when the call failed, none of them moved.
func (e *Engine) batchDone(th *slot, c *event.Call) {
	if c.Failed() {
		e.stats.FailedCalls++
		err := callError(c)
		for _, r := range th.batch {
			if e.live(r) {
				e.fail(r.idx, err)
			}
		}
	}
	th.batch = th.batch[:0]
}

// failed makes the record of a call that returned an error: reported with
// its error, kept on the thread (a runtime call may still fold into it),
// never a transfer nor an effect on memory or streams.
func (e *Engine) failed(p *proc, c *event.Call) ref {
	e.stats.FailedCalls++
	if p.live >= e.cfg.MaxPending {
		e.evictOldest(p)
	}
	idx := e.alloc()
	e.seq++
	t := &e.txs[idx]
	t.start(c, e.seq, p, nil, true, true)
	if c.Op.IsCopy() {
		classify(p.mem, c.CopyKind, &t.Transfer)
	} else {
		t.Bytes = c.Size
	}
	t.Error = callError(c)
	r := ref{idx: idx, seq: e.seq}
	e.push(&p.fifo, p.live, r)
	p.live++
	return r
}

// fail turns a pending copy into a failed call: it will not complete.
func (e *Engine) fail(idx int32, err *CallError) {
	t := &e.txs[idx]
	t.Error, t.CompleteNs, t.done = err, 0, true
	if t.st != nil {
		t.st.live--
		t.st = nil
	}
	t.lst = nil
	if !t.open {
		e.emit(idx)
	}
}

// streamKey names the stream a call uses within its process: handle 0 is
// the legacy default stream, or the thread's own for per-thread-default
// symbols; 1 and 2 are cudaStreamLegacy and cudaStreamPerThread.
func streamKey(c *event.Call) uint64 {
	switch c.Stream {
	case 0:
		if c.PerThread {
			return perThreadStream | uint64(c.TID)
		}
		return 0
	case 1:
		return 0
	case 2:
		return perThreadStream | uint64(c.TID)
	}
	return c.Stream
}

// twin reports whether c is the other layer's half of the call in s: same
// op, same operands, and the driver call nested in the runtime call's time.
func twin(s *slot, c *event.Call, key uint64) bool {
	if s.layer == c.Layer || s.op != c.Op {
		return false
	}
	rs, re, ds, de := s.start, s.end, c.Time, c.ReturnTime
	if s.layer == event.LayerDriver {
		rs, re, ds, de = c.Time, c.ReturnTime, s.start, s.end
	}
	if ds < rs || re != 0 && (ds > re || de > re) {
		return false
	}
	switch s.op {
	case event.OpCopy, event.OpCopy2D, event.OpCopyPeer, event.OpCopyBatch:
		return s.dst == c.Dst && s.src == c.Src && s.bytes == c.Bytes
	case event.OpHostRegister:
		return s.ptr == c.Ptr && s.size == c.Size
	case event.OpHostAlloc, event.OpDeviceAlloc, event.OpHostUnregister, event.OpHostFree, event.OpDeviceFree,
		event.OpManagedAlloc, event.OpPoolAlloc:
		return s.ptr == c.Ptr
	case event.OpPoolCreate, event.OpPoolDestroy:
		return s.handle == c.Handle
	case event.OpStreamSync, event.OpCaptureBegin, event.OpCaptureEnd:
		return s.key == key
	case event.OpGraphLaunch:
		return s.key == key && s.handle == c.Handle
	case event.OpEventRecord, event.OpStreamWaitEvent:
		return s.key == key && s.ev == c.Event
	case event.OpEventSync:
		return s.ev == c.Event
	}
	return false
}

// merge folds c into the call held in s. The first half already took
// effect; the second only names itself on the transfer.
func (e *Engine) merge(s *slot, c *event.Call) {
	e.stats.Merged++
	s.valid = false
	if !s.hasTx || !e.live(s.tx) {
		return
	}
	t := &e.txs[s.tx.idx]
	if s.layer == event.LayerRuntime { // runtime first: c is the nested driver call
		t.DriverAPI = c.Symbol
		if s.kind == event.CopyDefault && c.CopyKind < event.CopyDefault {
			classify(t.p.mem, c.CopyKind, &t.Transfer) // the driver states the direction
		}
	} else { // driver first: c is the runtime call around it
		if t.DriverAPI == "" {
			t.DriverAPI = t.API
		}
		t.API = c.Symbol
		if t.Error != nil && c.Failed() {
			t.Error = callError(c) // what the application saw: the runtime's result
		}
		t.SubmitNs = min(t.SubmitNs, c.Time)
		t.Stream = c.Stream
		if c.CopyKind < event.CopyDefault && s.kind == event.CopyDefault {
			classify(t.p.mem, c.CopyKind, &t.Transfer)
		}
	}
	t.open = false
	if t.done {
		e.emit(s.tx.idx)
	}
}

// close ends the merge window of a thread's last call.
func (e *Engine) close(s *slot) {
	s.valid = false
	if !s.hasTx || !e.live(s.tx) {
		return
	}
	t := &e.txs[s.tx.idx]
	t.open = false
	if t.done {
		e.emit(s.tx.idx)
	}
}

func (e *Engine) proc(pid uint32) *proc {
	if e.last != nil && e.last.pid == pid {
		return e.last
	}
	p := e.procs[pid]
	if p == nil {
		m := e.reg.proc(pid)
		if m == nil {
			return nil
		}
		p = &proc{pid: pid, mem: m, threads: map[uint32]*slot{}, streams: map[uint64]*stream{}, events: map[uint64]*cudaEvent{}}
		e.procs[pid] = p
	}
	e.last = p
	return p
}

func (e *Engine) stream(p *proc, key uint64) *stream {
	st := p.streams[key]
	if st == nil {
		if len(p.streams) >= maxHandles {
			e.stats.HandleCapHits++
			for k, s := range p.streams {
				if s.live == 0 && len(s.deps) == 0 {
					delete(p.streams, k)
				}
			}
		}
		st = &stream{}
		p.streams[key] = st
	}
	return st
}

func (e *Engine) cudaEvent(p *proc, handle uint64) *cudaEvent {
	ev := p.events[handle]
	if ev == nil {
		if len(p.events) >= maxHandles {
			e.stats.HandleCapHits++
			clear(p.events) // a sync on a forgotten event proves nothing: transfers time out instead
		}
		ev = &cudaEvent{}
		p.events[handle] = ev
	}
	return ev
}

// classify fills direction and memory kinds from the stated direction and
// the registry (m may be nil: nothing known).
func classify(m *procMem, kind event.CopyKind, t *Transfer) {
	t.HostMem, t.HostMemReason, t.Src.Reason, t.Dst.Reason = "", "", "", ""
	switch kind {
	case event.CopyHostToDevice:
		t.Direction, t.Src.Mem, t.Dst.Mem = DirH2D, m.kind(t.Src.Addr), event.MemDevice
		t.HostMem = t.Src.Mem
	case event.CopyDeviceToHost:
		t.Direction, t.Src.Mem, t.Dst.Mem = DirD2H, event.MemDevice, m.kind(t.Dst.Addr)
		t.HostMem = t.Dst.Mem
	case event.CopyDeviceToDevice:
		t.Direction, t.Src.Mem, t.Dst.Mem = DirD2D, event.MemDevice, event.MemDevice
	case event.CopyHostToHost:
		t.Direction, t.Src.Mem, t.Dst.Mem = DirH2H, m.kind(t.Src.Addr), m.kind(t.Dst.Addr)
	default: // cudaMemcpyDefault: where each pointer lives decides
		s, d := m.kind(t.Src.Addr), m.kind(t.Dst.Addr)
		t.Src.Mem, t.Dst.Mem = s, d
		switch {
		case s == event.MemUnknown || d == event.MemUnknown:
			t.Direction = DirUnknown // an unplaced address may be device memory allocated before we looked
		case s == event.MemManaged || d == event.MemManaged:
			t.Direction = DirUnknown // managed pages may be on the host or a device when the copy runs
		case s == event.MemDevice && d == event.MemDevice:
			t.Direction = DirD2D
		case s == event.MemDevice:
			t.Direction, t.HostMem = DirD2H, d
		case d == event.MemDevice:
			t.Direction, t.HostMem = DirH2D, s
		default:
			t.Direction = DirH2H
		}
	}
	unknownReasons(m, t)
}

// unknownReasons says why each side classify found unknown is (Reason
// constants), and the host side's why as the transfer's.
func unknownReasons(m *procMem, t *Transfer) {
	if t.Src.Mem == event.MemUnknown {
		t.Src.Reason = m.unknownWhy(t.Src.Addr)
	}
	if t.Dst.Mem == event.MemUnknown {
		t.Dst.Reason = m.unknownWhy(t.Dst.Addr)
	}
	if t.HostMem == event.MemUnknown {
		switch t.Direction {
		case DirH2D:
			t.HostMemReason = t.Src.Reason
		case DirD2H:
			t.HostMemReason = t.Dst.Reason
		}
	}
}

func newTransfer(t *Transfer, c *event.Call) {
	*t = Transfer{PID: c.PID, TID: c.TID, Stream: c.Stream, API: c.Symbol, Op: c.Op, Bytes: c.Bytes,
		Src: Side{Addr: c.Src}, Dst: Side{Addr: c.Dst}, SubmitNs: c.Time, BatchIndex: -1, Layer: -1}
	if c.Op.IsCopy() {
		t.Mover = MoverCopyEngine
	}
	if c.ViaRuntime && c.RuntimeAPI != "" {
		// The runtime called this driver entry point: report the call the
		// application made (docs/design.md, "One pair per call").
		t.API, t.DriverAPI = c.RuntimeAPI, c.Symbol
	}
	if c.Kind == event.KindBatchEntry {
		t.BatchIndex = int(c.BatchIndex)
	}
	if c.Returns && c.ReturnTime > c.Time {
		t.CallNs = c.ReturnTime - c.Time
	}
}

// copy makes a pending transfer of a copy call.
func (e *Engine) copy(p *proc, c *event.Call, key uint64) ref {
	if p.live >= e.cfg.MaxPending {
		e.evictOldest(p)
	}
	st := e.stream(p, key)
	idx := e.alloc()
	e.seq++
	t := &e.txs[idx]
	// A runtime call may still be joined by its driver call, and a driver
	// call reported at return by the runtime call around it.
	t.start(c, e.seq, p, st, c.Layer == event.LayerRuntime || c.Returns, false)
	classify(p.mem, c.CopyKind, &t.Transfer)
	t.GPU = e.pciOf(p, p.dev.copyDevice(p.mem, c, &t.Transfer))
	if t.GPU != "" {
		st.gpu = t.GPU
	}
	if t.Direction == DirD2D && t.GPU != "" {
		if src := e.pciOf(p, p.dev.ownerOf(p.mem, t.Src.Addr)); src != t.GPU {
			t.SrcGPU = src // a peer copy: "" when its source's owner is unknown
		}
	}
	t.lst, t.recAt = st, st.records
	t.Layer = int(st.records - st.drainedAt)
	r := ref{idx: idx, seq: e.seq}
	e.push(&st.q, st.live, r)
	st.live++
	e.push(&p.fifo, p.live, r)
	p.live++
	return r
}

// push appends r to q, first dropping stale refs at its front and, when
// stale refs outnumber live ones behind a stuck front, everywhere.
func (e *Engine) push(q *queue, live int, r ref) {
	for q.len() > 0 && !e.live(q.front()) {
		q.pop()
	}
	if q.len() > 2*live+64 {
		n := 0
		for _, x := range q.buf[q.head:] {
			if e.live(x) {
				q.buf[n] = x
				n++
			}
		}
		q.buf, q.head = q.buf[:n], 0
	}
	q.push(r)
}

func (e *Engine) live(r ref) bool { return e.txs[r.idx].seq == r.seq }

func (e *Engine) alloc() int32 {
	if n := len(e.free); n > 0 {
		idx := e.free[n-1]
		e.free = e.free[:n-1]
		return idx
	}
	e.txs = append(e.txs, pending{})
	return int32(len(e.txs) - 1)
}

// emit hands a pending transfer to the sink and frees its slot.
func (e *Engine) emit(idx int32) {
	t := &e.txs[idx]
	if t.st != nil {
		t.st.live--
		t.st = nil
	}
	t.p.live--
	if t.lst != nil && t.lst.records == t.recAt {
		t.Layer = -1 // no event recorded on its stream after it: no per-layer pattern
	}
	t.lst = nil
	e.stats.Transfers++
	if t.done {
		e.stats.Completed++
	}
	e.sink.Transfer(&t.Transfer)
	t.seq, t.p = 0, nil
	e.free = append(e.free, idx)
}

// emitUntracked reports a copy of a process past MaxProcesses at once.
func (e *Engine) emitUntracked(c *event.Call) {
	newTransfer(&e.scratch, c)
	classify(nil, c.CopyKind, &e.scratch)
	if c.Failed() {
		e.stats.FailedCalls++
		e.scratch.Error = callError(c)
	}
	e.stats.Transfers++
	e.sink.Transfer(&e.scratch)
}

func (e *Engine) complete(idx int32, at uint64) {
	t := &e.txs[idx]
	t.CompleteNs, t.done = at, true
	t.CompleteNear = e.hasNear && e.near.idx == idx && e.near.seq == t.seq
	if t.st != nil {
		t.st.live--
		t.st = nil
	}
	if !t.open {
		e.emit(idx)
	}
}

// completeUpTo completes the transfers of st numbered up to upTo that were
// submitted before cutoff, at time at.
func (e *Engine) completeUpTo(st *stream, upTo, cutoff, at uint64) {
	for st.q.len() > 0 {
		r := st.q.front()
		t := &e.txs[r.idx]
		if t.seq != r.seq || t.st != st {
			st.q.pop()
			continue
		}
		if r.seq > upTo || t.SubmitNs >= cutoff {
			return
		}
		st.q.pop()
		e.complete(r.idx, at)
	}
}

// apply gives a memory or ordering call its effect.
func (e *Engine) apply(p *proc, c *event.Call, key uint64) {
	m := p.mem
	switch c.Op {
	case event.OpHostAlloc, event.OpHostRegister:
		e.reg.add(m, &m.pinned, c.Ptr, c.Size)
	case event.OpDeviceAlloc:
		e.reg.add(m, &m.device, c.Ptr, c.Size)
		p.dev.own(m, c.Ptr, p.dev.current(c.TID)) // allocated on the thread's current device
	case event.OpHostUnregister, event.OpHostFree:
		if c.Ptr != 0 {
			e.reg.unpin(m, c.Ptr)
		}
	case event.OpDeviceFree:
		if c.Ptr != 0 { // cudaFree(0) only initialises the context
			e.reg.free(m, c.Ptr) // device, managed or pool memory (allocators.go)
		}
	case event.OpManagedAlloc, event.OpPoolAlloc, event.OpPoolCreate, event.OpPoolDestroy, event.OpMemCreate,
		event.OpMemRelease, event.OpAddressReserve, event.OpAddressFree, event.OpMemMap, event.OpMemUnmap,
		event.OpDmabufExport:
		e.memory(p, c)
	case event.OpCtxRetain, event.OpCtxCreate, event.OpCtxSetCurrent, event.OpCtxPush, event.OpCtxPop,
		event.OpCtxDestroy, event.OpDeviceBusID:
		p.dev.apply(c)
		if c.Op == event.OpCtxRetain || c.Op == event.OpCtxCreate {
			// Name the device now, while the process surely lives: a
			// DeviceMap reads its environment (docs/design.md, "Placement").
			e.pciOf(p, c.Device)
		}
	case event.OpCtxSync:
		// Not a proof for the engine: the context's streams are not known
		// apart from the process's other GPUs'. Only the wait is reported.
		e.note(p, c, Activity{Stream: c.Stream})
	case event.OpStreamSync:
		if c.ReturnTime == 0 {
			return
		}
		e.note(p, c, Activity{Stream: c.Stream})
		// Work queued before the call, and all it waited for, is done.
		if st := p.streams[key]; st != nil {
			e.completeUpTo(st, e.seq, c.Time, c.ReturnTime)
			st.drained(e.seq)
			for _, d := range st.deps {
				e.completeUpTo(d.st, d.upTo, ^uint64(0), c.ReturnTime)
				d.st.drained(d.upTo)
			}
			st.deps = st.deps[:0]
		}
	case event.OpEventRecord:
		ev := e.cudaEvent(p, c.Event)
		st := e.stream(p, key)
		ev.recorded, ev.recStream = c.Time, c.Stream
		ev.inCapture = false
		e.note(p, c, Activity{Stream: c.Stream})
		ev.caps = append(append(ev.caps[:0], capture{st: st, upTo: e.seq}), st.deps...)
		st.records++
		st.lastRecSeq = e.seq
	case event.OpGraphLaunch:
		e.graphLaunch(p, c)
	case event.OpCaptureBegin:
		e.beginCapture(p, key)
	case event.OpEventSync:
		ev := p.events[c.Event]
		if c.ReturnTime == 0 || ev == nil || ev.recorded > c.Time {
			e.note(p, c, Activity{}) // a wait on an event whose stream is unknown
			return                   // a record after the wait began may not be what it waited for
		}
		e.note(p, c, Activity{Stream: ev.recStream, RecordNs: ev.recorded})
		for _, d := range ev.caps {
			e.completeUpTo(d.st, d.upTo, ^uint64(0), c.ReturnTime)
			d.st.drained(d.upTo)
		}
	case event.OpStreamWaitEvent:
		ev := p.events[c.Event]
		if ev == nil || e.joinCapture(p, ev, key) {
			return
		}
		// Which load's layer the stream now waits for (host-sync-in-loop's episodes).
		e.note(p, c, Activity{Stream: c.Stream, RecordNs: ev.recorded, RecordStream: ev.recStream})
		st := e.stream(p, key)
		for _, d := range ev.caps {
			if d.st != st {
				st.addDep(d)
			}
		}
	}
}

func (e *Engine) evictOldest(p *proc) {
	for p.fifo.len() > 0 {
		r := p.fifo.front()
		p.fifo.pop()
		if e.live(r) {
			if !e.txs[r.idx].done {
				e.stats.PendingEvicted++
			}
			e.emit(r.idx)
			return
		}
	}
}

// sweep emits transfers that waited past the timeout and ends merge
// windows of threads that went quiet.
func (e *Engine) sweep() {
	e.xfer.sweep(e)
	for _, p := range e.procs {
		for p.fifo.len() > 0 {
			r := p.fifo.front()
			t := &e.txs[r.idx]
			if t.seq != r.seq {
				p.fifo.pop()
				continue
			}
			if t.SubmitNs+e.timeout >= e.now {
				break
			}
			p.fifo.pop()
			if !t.done {
				e.stats.TimedOut++
			}
			e.emit(r.idx)
		}
		for tid, th := range p.threads {
			if max(th.start, th.end)+e.timeout < e.now {
				e.close(th)
				delete(p.threads, tid)
			}
		}
	}
}

// forgetThreads makes room in p's thread table at its cap (counted in
// HandleCapHits): threads without a call in their merge window go first;
// if none has left one, every window is ended (a runtime call whose
// driver call is then forgotten becomes a second record).
func (e *Engine) forgetThreads(p *proc) {
	e.stats.HandleCapHits++
	for tid, th := range p.threads {
		if !th.valid {
			delete(p.threads, tid)
		}
	}
	if len(p.threads) < maxThreads {
		return
	}
	for tid, th := range p.threads {
		e.close(th)
		delete(p.threads, tid)
	}
}

// drain emits every pending transfer of p, oldest first.
func (e *Engine) drain(p *proc) {
	for _, th := range p.threads {
		e.close(th)
	}
	for p.fifo.len() > 0 {
		r := p.fifo.front()
		p.fifo.pop()
		if e.live(r) {
			e.emit(r.idx)
		}
	}
}

// Flush emits every pending transfer, with its completion when known. The
// engine stays usable.
func (e *Engine) Flush() {
	e.rdma.drain(e, 0)
	e.xfer.drain(e, 0)
	e.fabric.drain(e, 0, false)
	pids := make([]uint32, 0, len(e.procs))
	for pid := range e.procs {
		pids = append(pids, pid)
	}
	slices.Sort(pids)
	for _, pid := range pids {
		e.drain(e.procs[pid])
	}
}

// ProcessExit emits the process's pending transfers and forgets it.
func (e *Engine) ProcessExit(pid uint32) {
	e.rdma.exit(e, pid)
	e.xfer.exit(e, pid)
	e.fabric.drain(e, pid, true)
	if p := e.procs[pid]; p != nil {
		e.drain(p)
		e.devCapHits += p.dev.capHits
		delete(e.procs, pid)
		if e.last == p {
			e.last = nil
		}
	}
	e.reg.Forget(pid)
}

// Tee hands every transfer to each sink in turn; nil sinks (an output
// turned off) are left out, and with none left a transfer goes nowhere.
func Tee(sinks ...Sink) Sink {
	var out []Sink
	for _, s := range sinks {
		if s != nil {
			out = append(out, s)
		}
	}
	if len(out) == 1 {
		return out[0]
	}
	return SinkFunc(func(t *Transfer) {
		for _, s := range out {
			s.Transfer(t)
		}
	})
}
