package agent

import (
	"errors"
	"log/slog"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lanewatch/lanewatch/checks"
	"github.com/lanewatch/lanewatch/collectors"
	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/judge"
)

// Where the host pages of each copy live (docs/design.md, "Pages, not
// registrations"). The engine emits an H2D or D2H copy; the page stage
// samples pages of its host range, answers from a cache of 2 MiB chunks or
// asks a worker, which queries the watched process with move_pages(2)
// (query only: nodes NULL), and hands the copy on with NUMANode and
// NUMAPages set. Transfers leave the stage in the order they entered, so a
// copy waits while an earlier one's pages are being located; nothing on the
// event path makes a system call, and what cannot be located in time or
// within the budget is counted and handed on unknown.

// PageStats counts what the page stage did with host↔device copies.
type PageStats struct {
	Copies   uint64 // H2D and D2H copies with a host address whose pages were looked for
	Located  uint64 // at least one sampled page had a node
	Cached   uint64 // of Located, answered from the cache alone
	NoNode   uint64 // queried, no sampled page had a node: not resident, not mapped, or the process was gone
	Failed   uint64 // the query itself failed (permission, a kernel without page migration)
	OverRate uint64 // not queried: over the page budget (pageRate)
	Behind   uint64 // not queried: pageMaxHeld copies were already waiting
	Queries  uint64 // move_pages calls
	Pages    uint64 // pages they asked about
}

// Limits of the page stage. Each sampled page costs the watched process a
// page-table walk under its mmap read lock; pageRate bounds those per
// second across all processes (bursts of pageBurst), pageMaxHeld the copies
// held back while their pages are looked up, pageMaxCached the chunks
// remembered (1<<17 chunks of 2 MiB cover 256 GiB; about 40 bytes each).
// A chunk's node is re-read after pageTTL: automatic NUMA balancing and
// migrations move pageable pages, and an address may be mapped anew.
const (
	pageRate      = 8192
	pageBurst     = 2048
	pageMaxHeld   = 4096
	pageMaxCached = 1 << 17
	pageTTL       = 30 * time.Second
	pageBatch     = 256 // pages per move_pages call at most
	chunkShift    = 21  // 2 MiB: a huge page, placed as one
)

// pageConfig is the page stage's environment; tests replace the lookup
// and the clock.
type pageConfig struct {
	lookup   func(pid int, addrs []uintptr) ([]int, error) // collectors.NodesOfPages
	now      func() time.Time
	pageSize uint64
	log      *slog.Logger
}

func defaultPageConfig(log *slog.Logger) pageConfig {
	return pageConfig{lookup: collectors.NodesOfPages, now: time.Now, pageSize: uint64(os.Getpagesize()), log: log}
}

// pageStage is the correlate.Sink between the engine and the agent's sink.
type pageStage struct {
	cfg  pageConfig
	next correlate.Sink

	mu      sync.Mutex
	queue   []*pageEntry // in engine order; delivered from the head
	wake    chan struct{}
	started bool
	closing bool
	done    chan struct{}
	cache   map[uint32]map[uint64]cachedNode // pid → chunk → node
	cached  int
	tokens  float64
	refill  time.Time
	stats   PageStats
	// now is cfg.now as last read, at a copy submitted at nowSubmit
	// (clock).
	now       time.Time
	nowSubmit uint64
}

// clockEvery is how far apart, in the copies' own submission times, the
// cache's TTL clock is read: a chunk lives 30 s, and reading the clock
// per copy cost more than the cache lookup it serves.
const clockEvery = uint64(10 * time.Millisecond)

// clock is the time for the cache's TTL at a copy submitted at submitNs
// (CLOCK_MONOTONIC ns): cfg.now read anew once the copies' own clock moved
// clockEvery past the last read, or back (another process's older copy).
func (s *pageStage) clock(submitNs uint64) time.Time {
	if s.now.IsZero() || submitNs < s.nowSubmit || submitNs-s.nowSubmit >= clockEvery {
		s.now, s.nowSubmit = s.cfg.now(), submitNs
	}
	return s.now
}

type cachedNode struct {
	node int16
	at   time.Time
}

// pageEntry is a transfer waiting for its pages, or a process exit
// waiting for the transfers before it.
type pageEntry struct {
	t     correlate.Transfer
	exit  func()
	pages [correlate.MaxPageSamples]uint64 // sampled page addresses
	n     int
	idx   [correlate.MaxPageSamples]int // each sample's page in the query
	ready bool                          // located, or given up: may be delivered
	asked bool                          // in a query now
}

func newPageStage(next correlate.Sink, cfg pageConfig) *pageStage {
	return &pageStage{cfg: cfg, next: next, wake: make(chan struct{}, 1), done: make(chan struct{}),
		cache: map[uint32]map[uint64]cachedNode{}, tokens: pageBurst}
}

// start runs the worker until close.
func (s *pageStage) start() {
	s.mu.Lock()
	s.started = true
	s.mu.Unlock()
	go s.run()
}

// close lets the worker locate what is queued, deliver it and stop; later
// transfers are handed on unknown at once.
func (s *pageStage) close() {
	s.mu.Lock()
	started := s.started
	s.closing = true
	s.mu.Unlock()
	if !started {
		s.mu.Lock()
		for _, e := range s.queue {
			e.ready = true
		}
		s.deliver()
		s.mu.Unlock()
		return
	}
	s.signal()
	<-s.done
}

func (s *pageStage) Stats() PageStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

func (s *pageStage) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Transfer implements correlate.Sink; it never blocks on a system call.
func (s *pageStage) Transfer(t *correlate.Transfer) {
	// The pages on the stack: an entry is built only for a copy that must
	// wait, so the common case (pages cached, nothing queued) allocates
	// nothing.
	var pages [correlate.MaxPageSamples]uint64
	n := samplePages(t, s.cfg.pageSize, &pages)
	s.mu.Lock()
	defer s.mu.Unlock()
	if n > 0 {
		s.stats.Copies++
		if pn, ok := s.fromCache(t.PID, pages[:n], s.clock(t.SubmitNs)); ok {
			t.SetPages(pn)
			s.stats.Located++
			s.stats.Cached++
			n = 0
		}
	}
	if n == 0 && len(s.queue) == 0 {
		s.next.Transfer(t)
		return
	}
	e := &pageEntry{t: *t, pages: pages, n: n, ready: n == 0}
	if e.n > 0 && s.closing {
		e.ready = true // the worker is stopping: nothing will locate it
		s.stats.Behind++
	}
	s.queue = append(s.queue, e)
	if !e.ready {
		s.signal()
	}
	// Every entry before the oldest waiting one is ready, so handing that
	// one on shortens the queue.
	for len(s.queue) > pageMaxHeld && s.giveUpOldest() {
		s.deliver()
	}
	s.deliver()
}

// Exit hands fn on after every transfer that entered before it, and
// forgets the process's chunks.
func (s *pageStage) Exit(pid uint32, fn func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if m := s.cache[pid]; m != nil {
		s.cached -= len(m)
		delete(s.cache, pid)
	}
	if fn == nil {
		return
	}
	if len(s.queue) == 0 {
		fn()
		return
	}
	s.queue = append(s.queue, &pageEntry{exit: fn, ready: true})
}

// giveUpOldest hands on the oldest copy still waiting without its pages.
func (s *pageStage) giveUpOldest() bool {
	for _, e := range s.queue {
		if !e.ready {
			e.ready = true
			if s.stats.Behind == 0 {
				s.cfg.log.Warn("host pages of copies not located: too many copies waiting for their lookup (counted as behind)", "waiting", pageMaxHeld)
			}
			s.stats.Behind++
			return true
		}
	}
	return false
}

// deliver hands on the ready entries at the head of the queue.
func (s *pageStage) deliver() {
	i := 0
	for ; i < len(s.queue) && s.queue[i].ready; i++ {
		e := s.queue[i]
		if e.exit != nil {
			e.exit()
			continue
		}
		s.next.Transfer(&e.t)
	}
	if i > 0 {
		clear(s.queue[:i])
		s.queue = s.queue[i:]
		if len(s.queue) == 0 {
			s.queue = nil // let the backing array go
		}
	}
}

func (s *pageStage) run() {
	defer close(s.done)
	for {
		for s.step() {
		}
		// step found nothing to ask and delivered the rest: the queue is
		// empty unless a transfer arrived since, which signalled.
		s.mu.Lock()
		finished := s.closing && len(s.queue) == 0
		s.mu.Unlock()
		if finished {
			return
		}
		<-s.wake
	}
}

// step queries the pages of the waiting copies of one process (the
// earliest waiting copy's) and reports whether it did anything. A chunk is
// asked once per query, however many waiting copies sample it, and a copy
// whose chunks an earlier query located is answered from the cache.
func (s *pageStage) step() bool {
	s.mu.Lock()
	var batch []*pageEntry
	var addrs []uintptr
	asked := map[uint64]int{} // chunk → index in addrs
	pid := uint32(0)
	now := s.cfg.now()
	for _, e := range s.queue {
		if e.ready || e.asked || e.exit != nil {
			continue
		}
		if pn, ok := s.fromCache(e.t.PID, e.pages[:e.n], now); ok {
			e.t.SetPages(pn)
			e.ready = true
			s.stats.Located++
			s.stats.Cached++
			continue
		}
		if pid == 0 {
			pid = e.t.PID
		}
		if e.t.PID != pid || len(addrs)+e.n > pageBatch {
			continue
		}
		fresh := 0
		for _, pg := range e.pages[:e.n] {
			if _, ok := asked[pg>>chunkShift]; !ok {
				fresh++
			}
		}
		if !s.take(now, fresh) {
			e.ready = true
			if s.stats.OverRate == 0 {
				s.cfg.log.Warn("host pages of copies not located: over the page budget (counted as over_budget)", "pages_per_second", pageRate)
			}
			s.stats.OverRate++
			continue
		}
		for j, pg := range e.pages[:e.n] {
			i, ok := asked[pg>>chunkShift]
			if !ok {
				i = len(addrs)
				asked[pg>>chunkShift] = i
				addrs = append(addrs, uintptr(pg))
			}
			e.idx[j] = i
		}
		e.asked = true
		batch = append(batch, e)
	}
	if len(batch) == 0 {
		s.deliver()
		s.mu.Unlock()
		return false
	}
	s.mu.Unlock()

	nodes, err := s.cfg.lookup(int(pid), addrs)
	if collectors.IsNoNUMA(err) {
		// A kernel without NUMA has one node: every page is on node 0.
		nodes, err = make([]int, len(addrs)), nil
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats.Queries++
	s.stats.Pages += uint64(len(addrs))
	if err == nil {
		for i, a := range addrs {
			if nodes[i] >= 0 {
				s.remember(pid, uint64(a), nodes[i], now)
			}
		}
	}
	for _, e := range batch {
		e.asked = false
		if e.ready {
			continue // given up while asked (giveUpOldest): already handed on, and counted
		}
		e.ready = true
		var pn correlate.PageNodes
		for j := 0; j < e.n && err == nil; j++ {
			pn.Add(nodes[e.idx[j]])
		}
		switch {
		case err != nil && !processGone(err):
			if s.stats.Failed == 0 {
				s.cfg.log.Warn("cannot locate the host pages of copies: their NUMA node stays unknown", "pid", pid, "err", err)
			}
			s.stats.Failed++
		case pn.IsZero():
			s.stats.NoNode++
		default:
			s.stats.Located++
			e.t.SetPages(pn)
		}
	}
	s.deliver()
	return true
}

// processGone reports whether a query failed because the process has no
// memory any more: ESRCH (reaped), EINVAL (exited, not yet reaped: the
// kernel finds no mm; also a kernel thread).
func processGone(err error) bool { return errors.Is(err, unix.ESRCH) || errors.Is(err, unix.EINVAL) }

// take spends n pages of the budget, refilled at pageRate per second.
func (s *pageStage) take(now time.Time, n int) bool {
	if !s.refill.IsZero() {
		s.tokens = min(pageBurst, s.tokens+now.Sub(s.refill).Seconds()*pageRate)
	}
	s.refill = now
	if s.tokens < float64(n) {
		return false
	}
	s.tokens -= float64(n)
	return true
}

// fromCache answers every sampled page from its chunk's remembered node.
func (s *pageStage) fromCache(pid uint32, pages []uint64, now time.Time) (correlate.PageNodes, bool) {
	m := s.cache[pid]
	if m == nil {
		return correlate.PageNodes{}, false
	}
	var pn correlate.PageNodes
	for _, p := range pages {
		c, ok := m[p>>chunkShift]
		if !ok || now.Sub(c.at) > pageTTL {
			return correlate.PageNodes{}, false
		}
		pn.Add(int(c.node))
	}
	return pn, true
}

// remember keeps a chunk's node. At the cap, an eighth of the chunks go
// (in the map's order, which is random).
func (s *pageStage) remember(pid uint32, page uint64, node int, now time.Time) {
	m := s.cache[pid]
	if m == nil {
		m = map[uint64]cachedNode{}
		s.cache[pid] = m
	}
	if _, ok := m[page>>chunkShift]; !ok {
		if s.cached >= pageMaxCached {
			s.evict(pageMaxCached / 8)
		}
		s.cached++
	}
	m[page>>chunkShift] = cachedNode{node: int16(node), at: now}
}

func (s *pageStage) evict(n int) {
	for pid, m := range s.cache {
		for c := range m {
			if n == 0 {
				return
			}
			delete(m, c)
			s.cached--
			n--
		}
		if len(m) == 0 {
			delete(s.cache, pid)
		}
	}
}

// samplePages picks the host pages of an H2D or D2H copy to locate: one
// in each of up to three equal parts of its range, at a position that
// varies from copy to copy (a hash of the copy), so that memory whose
// nodes alternate page by page (interleave) is not read at the same phase
// every time. It returns how many it wrote into out (0: nothing to locate).
func samplePages(t *correlate.Transfer, pageSize uint64, out *[correlate.MaxPageSamples]uint64) int {
	if t.Failed() || t.Bytes == 0 || t.QPNum != 0 {
		return 0
	}
	var addr uint64
	switch t.Direction {
	case correlate.DirH2D:
		addr = t.Src.Addr
	case correlate.DirD2H:
		addr = t.Dst.Addr
	default:
		return 0
	}
	if addr == 0 || addr+t.Bytes < addr {
		return 0
	}
	first := addr &^ (pageSize - 1)
	pages := ((addr+t.Bytes-1)&^(pageSize-1)-first)/pageSize + 1
	if pages == 1 { // a small copy: its one page, nothing to draw
		out[0] = first
		return 1
	}
	k := min(uint64(correlate.MaxPageSamples), pages)
	h := mix(uint64(t.PID)<<32 ^ addr ^ t.Bytes<<7 ^ t.SubmitNs)
	for i := uint64(0); i < k; i++ {
		lo, hi := i*pages/k, (i+1)*pages/k
		h = mix(h + i)
		out[i] = first + (lo+h%(hi-lo))*pageSize
	}
	return int(k)
}

// mix is splitmix64's finaliser.
func mix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// HostPlaces reads the sysfs tree under sysRoot once for the window
// rules that place devices: each GPU's NUMA node (-1 unknown) and where
// nodes sit from each other, for remote-numa-pool on the pages copies read
// and storage-far-pool; where the RDMA devices sit from each GPU, for the
// transfer-library lanes (kv-transfer-tcp-fallback, kv-transfer-far-device).
func HostPlaces(sysRoot string) (checks.NUMAPlace, judge.NICPlace, error) {
	h, err := checks.ReadHost("", sysRoot, "")
	if err != nil {
		return nil, nil, err
	}
	return h, h.Topo, nil
}

// ByResult gives the counts as lanewatch_page_lookups_total's results
// (exporters.PageLookupResults): every copy looked for is in one.
func (s PageStats) ByResult() map[string]uint64 {
	return map[string]uint64{"located": s.Located - s.Cached, "cached": s.Cached, "no_node": s.NoNode, "failed": s.Failed,
		"over_budget": s.OverRate, "behind": s.Behind}
}
