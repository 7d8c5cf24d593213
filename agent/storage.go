package agent

import (
	"errors"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/cilium/ebpf/ringbuf"
	"github.com/lanewatch/lanewatch/checks"
	"github.com/lanewatch/lanewatch/collectors"
	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/probes"
	"github.com/lanewatch/lanewatch/topology"
)

// StorageConfig configures the storage read tracer (docs/design.md, "The
// storage leg").
type StorageConfig struct {
	ProcRoot, SysRoot string
	// Place places a block device; nil: the host's PCI tree read from
	// SysRoot (topology.Host.PlaceBlock). The selftest injects its own.
	Place  func(name string) topology.BlockPlacement
	Logger *slog.Logger
}

// StorageStats counts what became of the reads the tracer reported.
type StorageStats struct {
	Reads      uint64 // reported by the tracer
	NotBlock   uint64 // from a file on no block device (tmpfs, overlayfs, a pipe, a socket)
	Unresolved uint64 // the fd was closed, or its fdinfo unreadable, before it was looked up
	Dropped    uint64 // lost to a full ring (BPF counter)
	OverCap    uint64 // flows over maxStorageFlows in a window
}

// maxStorageFlows bounds the (process, device) pairs of one window, and
// maxStorageFiles the open files remembered.
const (
	maxStorageFlows = 1024
	maxStorageFiles = 16384
)

// StorageReads turns the reads of the processes the agent traces into
// StorageFlows per window: which device each read came from (the fd's file
// system), whether it was direct (O_DIRECT: the device's DMA writes the
// buffer) or through the page cache, and whether the buffer is memory the
// process registered or allocated pinned, with the node of its page.
type StorageReads struct {
	cfg    StorageConfig
	tracer *probes.StorageTracer
	// kind classifies a buffer against the process's registrations; set by
	// the agent it is given to (Config.Storage).
	kind atomic.Pointer[func(pid uint32, addr uint64) event.MemKind]
	// poolRead is told of each read from a block device into a pinned
	// pool (the requests' summaries: exporters.Spans.StorageRead).
	poolRead atomic.Pointer[func(pid, tid uint32, at, bytes uint64)]

	mu      sync.Mutex
	files   map[fdKey]fileInfo
	flows   map[flowKey]*checks.StorageFlow
	watched map[uint32]bool
	seen    map[uint32]int // reads reported per watched process
	stats   StorageStats
	done    chan struct{}
}

type fdKey struct {
	pid uint32
	fd  int32
}

type fileInfo struct {
	collectors.OpenFile
	device string // "" on no block device
	place  topology.BlockPlacement
}

type flowKey struct {
	pid    uint32
	device string
}

// NewStorageReads loads and attaches the tracer; nothing is reported
// until the agent watches a process.
func NewStorageReads(cfg StorageConfig) (*StorageReads, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.ProcRoot == "" {
		cfg.ProcRoot = "/proc"
	}
	if cfg.SysRoot == "" {
		cfg.SysRoot = "/sys"
	}
	if cfg.Place == nil {
		host, err := topology.Read(cfg.SysRoot)
		if err != nil {
			return nil, err
		}
		cfg.Place = func(name string) topology.BlockPlacement { return host.PlaceBlock(cfg.SysRoot, name) }
	}
	tr, err := probes.OpenStorageTracer(cfg.Logger)
	if err != nil {
		return nil, err
	}
	s := &StorageReads{cfg: cfg, tracer: tr, files: map[fdKey]fileInfo{}, flows: map[flowKey]*checks.StorageFlow{},
		watched: map[uint32]bool{}, seen: map[uint32]int{}, done: make(chan struct{})}
	go s.read()
	return s, nil
}

// OnPoolRead has f told of every read from a block device into a pinned
// pool from now on.
func (s *StorageReads) OnPoolRead(f func(pid, tid uint32, at, bytes uint64)) { s.poolRead.Store(&f) }

// read resolves each reported read until Close.
func (s *StorageReads) read() {
	defer close(s.done)
	for {
		r, err := s.tracer.Read()
		if err != nil {
			if !errors.Is(err, ringbuf.ErrClosed) {
				s.cfg.Logger.Warn("storage reads: tracer stopped", "err", err)
			}
			return
		}
		s.add(r)
	}
}

// watch starts reporting pid's reads (once per process).
func (s *StorageReads) watch(pid uint32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.watched[pid] {
		return
	}
	if err := s.tracer.Watch(pid); err != nil {
		s.cfg.Logger.Warn("storage reads: cannot watch the process", "pid", pid, "err", err)
		return
	}
	s.watched[pid] = true
}

// unwatch stops reporting pid's reads and forgets its files.
func (s *StorageReads) unwatch(pid uint32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.watched[pid] {
		return
	}
	delete(s.watched, pid)
	delete(s.seen, pid)
	s.tracer.Unwatch(pid)
	for k := range s.files {
		if k.pid == pid {
			delete(s.files, k)
		}
	}
}

// file resolves pid's fd: one stat per read, which tells a reused fd; the
// fdinfo, block device and placement once per file behind it (an O_DIRECT
// set later with fcntl on the same fd is not seen).
func (s *StorageReads) file(pid uint32, fd int32) (fileInfo, error) {
	of, err := collectors.StatFD(s.cfg.ProcRoot, pid, fd)
	if err != nil {
		return fileInfo{}, err
	}
	k := fdKey{pid, fd}
	s.mu.Lock()
	f, ok := s.files[k]
	s.mu.Unlock()
	if ok && f.Dev == of.Dev && f.Ino == of.Ino {
		return f, nil
	}
	f = fileInfo{OpenFile: of}
	if f.device, err = collectors.BlockDeviceName(s.cfg.SysRoot, of.Dev); err != nil {
		return fileInfo{}, err
	}
	if f.device != "" { // a pipe's or socket's flags do not matter: not storage
		if f.Direct, err = collectors.FDDirect(s.cfg.ProcRoot, pid, fd); err != nil {
			return fileInfo{}, err
		}
	}
	if f.device != "" {
		f.place = s.cfg.Place(f.device)
	}
	s.mu.Lock()
	if len(s.files) >= maxStorageFiles {
		clear(s.files)
	}
	s.files[k] = f
	s.mu.Unlock()
	return f, nil
}

// add puts one read into its window's flow.
func (s *StorageReads) add(r probes.StorageRead) {
	f, err := s.file(r.PID, r.FD)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats.Reads++
	if s.watched[r.PID] {
		s.seen[r.PID]++
	}
	switch {
	case err != nil:
		s.stats.Unresolved++
		return
	case f.device == "":
		s.stats.NotBlock++
		return
	}
	pool := false
	if k := s.kind.Load(); k != nil {
		pool = (*k)(r.PID, r.Buf) == event.MemPinned
	}
	if fn := s.poolRead.Load(); pool && r.Bytes > 0 && fn != nil {
		(*fn)(r.PID, r.TID, r.Time, uint64(r.Bytes))
	}
	fk := flowKey{r.PID, f.device}
	fl := s.flows[fk]
	if fl == nil {
		if len(s.flows) >= maxStorageFlows {
			s.stats.OverCap++
			return
		}
		fl = &checks.StorageFlow{PID: r.PID, Device: f.device, Place: f.place, DirectPool: map[int]uint64{}}
		s.flows[fk] = fl
	}
	fl.Reads++
	b := uint64(r.Bytes)
	switch {
	case f.Direct && pool:
		fl.DirectPool[pageNode(r.PID, r.Buf)] += b
	case f.Direct:
		fl.DirectOther += b
	case pool:
		fl.CachedPool += b
	default:
		fl.CachedOther += b
	}
}

// pageNode is the NUMA node of the page at addr in pid, -1 unknown. One
// move_pages(2) query per direct read into a pool: such reads are large
// (a KV page or more each).
func pageNode(pid uint32, addr uint64) int {
	nodes, err := collectors.NodesOfPages(int(pid), []uintptr{uintptr(addr &^ 4095)})
	if err != nil || len(nodes) != 1 || nodes[0] < 0 {
		return -1
	}
	return nodes[0]
}

// Flows ends the window: its flows by process and device, and starts the
// next.
func (s *StorageReads) Flows() []checks.StorageFlow {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]checks.StorageFlow, 0, len(s.flows))
	for _, f := range s.flows {
		out = append(out, *f)
	}
	clear(s.flows)
	slices.SortFunc(out, func(a, b checks.StorageFlow) int {
		if a.PID != b.PID {
			return int(a.PID) - int(b.PID)
		}
		if a.Device < b.Device {
			return -1
		}
		return 1
	})
	return out
}

// Watching reports whether pid's reads are reported.
func (s *StorageReads) Watching(pid uint32) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.watched[pid]
}

// InPool reports whether the agent knows addr of pid as memory the process
// registered or allocated pinned (what a read into it is counted as).
func (s *StorageReads) InPool(pid uint32, addr uint64) bool {
	k := s.kind.Load()
	return k != nil && (*k)(pid, addr) == event.MemPinned
}

// Seen is how many reads of a watched pid were reported and resolved (or
// found unresolvable) so far.
func (s *StorageReads) Seen(pid uint32) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.seen[pid]
}

// Stats counts the reads so far.
func (s *StorageReads) Stats() StorageStats {
	s.mu.Lock()
	st := s.stats
	s.mu.Unlock()
	st.Dropped = s.tracer.Drops()
	return st
}

// Close detaches the tracer and waits for its reader.
func (s *StorageReads) Close() error {
	err := s.tracer.Close()
	<-s.done
	return err
}

// storageSeen tells the storage tracer about a process the agent saw make
// a call (the reading goroutine's; once per process).
func (a *Agent) storageSeen(pid uint32) {
	if a.cfg.Storage == nil || a.storageWatched[pid] {
		return
	}
	a.storageWatched[pid] = true
	a.cfg.Storage.watch(pid)
	a.log.Debug("storage reads watched", "pid", pid)
}

// storageExit forgets an exited process.
func (a *Agent) storageExit(pid uint32) {
	if a.cfg.Storage == nil {
		return
	}
	delete(a.storageWatched, pid)
	a.cfg.Storage.unwatch(pid)
}

// storageLookup gives the tracer the engine's view of a process's memory.
func (a *Agent) storageLookup() {
	if a.cfg.Storage == nil {
		return
	}
	kind := func(pid uint32, addr uint64) event.MemKind {
		a.engineMu.Lock()
		defer a.engineMu.Unlock()
		k, _ := a.engine.Lookup(pid, addr)
		return k
	}
	a.cfg.Storage.kind.Store(&kind)
}
