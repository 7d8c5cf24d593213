package correlate

import (
	"slices"
	"strconv"

	"github.com/lanewatch/lanewatch/event"
)

// RDMA correlation (seed 002): a work request is posted, later completed
// (seen when the application polls its completion), and only then is its
// data safe to consume. The tracker keeps the registered memory regions,
// the posted requests per queue pair, joins each completion to its
// request, and keeps posted→completed latencies per queue pair and opcode.

// Work request opcodes (enum ibv_wr_opcode) and their directions.
var wrOpcodes = []struct{ name, dir string }{
	0: {"RDMA_WRITE", DirRDMAWrite}, 1: {"RDMA_WRITE_WITH_IMM", DirWriteImm}, 2: {"SEND", DirSend},
	3: {"SEND_WITH_IMM", DirSend}, 4: {"RDMA_READ", DirRDMARead}, 5: {"ATOMIC_CMP_AND_SWP", DirRDMARead},
	6: {"ATOMIC_FETCH_AND_ADD", DirRDMARead}, 9: {"SEND_WITH_INV", DirSend},
}

// Completion statuses (enum ibv_wc_status).
var wcStatuses = []string{"success", "LOC_LEN_ERR", "LOC_QP_OP_ERR", "LOC_EEC_OP_ERR", "LOC_PROT_ERR",
	"WR_FLUSH_ERR", "MW_BIND_ERR", "BAD_RESP_ERR", "LOC_ACCESS_ERR", "REM_INV_REQ_ERR", "REM_ACCESS_ERR",
	"REM_OP_ERR", "RETRY_EXC_ERR", "RNR_RETRY_EXC_ERR", "LOC_RDD_VIOL_ERR", "REM_INV_RD_REQ_ERR",
	"REM_ABORT_ERR", "INV_EECN_ERR", "INV_EEC_STATE_ERR", "FATAL_ERR", "RESP_TIMEOUT_ERR", "GENERAL_ERR"}

const (
	ibvSendSignaled = 2   // IBV_SEND_SIGNALED
	ibvWCRecv       = 128 // IBV_WC_RECV: completion opcodes from here on are receives
	// latencySamples bounds the posted→completed samples kept per queue pair and opcode.
	latencySamples = 4096
	// maxQueued bounds the requests waiting for a completion per queue.
	maxQueued = 1 << 14
	// Caps over every process: memory regions tracked, queues with
	// requests waiting, latency series (each up to latencySamples).
	maxRegions       = 1 << 16
	maxQueues        = 1 << 16
	maxLatencySeries = 1 << 10
)

// WROpcodeName names an ibv_wr_opcode.
func WROpcodeName(op uint32) string {
	if int(op) < len(wrOpcodes) && wrOpcodes[op].name != "" {
		return wrOpcodes[op].name
	}
	return "opcode_" + strconv.Itoa(int(op))
}

// WCStatusName names an ibv_wc_status.
func WCStatusName(s uint32) string {
	if int(s) < len(wcStatuses) {
		return wcStatuses[s]
	}
	return "status_" + strconv.Itoa(int(s))
}

type memRegion struct {
	pid          uint32
	mr           uint64
	addr, length uint64
	lkey, rkey   uint32
	mem          event.MemKind
	base         uint64 // the process's address of the region's first byte (a dma-buf region's addr is its iova)
}

// at is the process's address of the region's byte a work request
// addresses at addr (in the region's own addressing: its iova).
func (mr *memRegion) at(addr uint64) uint64 {
	if mr == nil || mr.base == 0 {
		return addr
	}
	return addr - mr.addr + mr.base
}

type pidPtr struct {
	pid uint32
	ptr uint64
}

type queueKey struct {
	pid  uint32
	qp   uint32
	recv bool
}

type postedWR struct {
	t        Transfer
	opcode   uint32
	signaled bool
	// The first scatter/gather entry: the region it uses (checkDereg).
	local uint64
	lkey  uint32
	nsge  uint32
	// ep: the posting thread's WRITEs to the QP's port since its last
	// notice there, this WRITE among them (a plain WRITE; nil otherwise or
	// when the port is unknown).
	ep *notifyEpoch
}

// LatencyKey names a latency series.
type LatencyKey struct {
	PID    uint32
	QPNum  uint32
	Opcode string
}

// LatencySummary is posted→completed latency of one series.
type LatencySummary struct {
	LatencyKey
	Count    int    // completions measured (at most the last 4096 are kept)
	P50, P99 uint64 // ns
	InFlight int    // requests posted and not yet completed
}

// RDMAStats counts what the tracker saw and could not join.
type RDMAStats struct {
	WorkRequests   uint64            // posted, send and receive
	Completions    uint64            // polled
	Unmatched      uint64            // completions of requests posted before the agent looked
	Evicted        uint64            // requests emitted without a completion (queue cap, exit, flush)
	FailedMRs      uint64            // registrations that returned NULL
	ByStatus       map[string]uint64 // completions by status
	MemoryRegions  int               // live
	QueuedRequests int               // live
	// Caps over every process (maxRegions, maxQueues, maxLatencySeries):
	// registrations not tracked (their requests' memory unknown), requests
	// emitted at once without a completion, latency samples not kept.
	RegionCapHits, QueueCapHits, LatencyCapHits uint64
	// Ordering (ordering.go): notifications posted ahead of WRITEs to the
	// same peer on another QP (NotifiesAmbiguous of them with the WRITEs
	// of concurrent requests among them), those not judged because a QP's
	// peer is unknown, those posted after their thread's own WRITEs
	// completed while other requests' were outstanding (not a hazard),
	// regions deregistered with requests outstanding, and QPs or thread
	// epochs not kept (maxPeers).
	NotifiesAhead, NotifiesAmbiguous, NotifyPeerUnknown, NotifiesOwnDone, DeregsInFlight, PeerCapHits uint64
}

type rdmaTracker struct {
	mrs    map[pidPtr]*memRegion
	byLKey map[pidPtr]*memRegion // pid, lkey
	// byRKey holds the live regions of every process by rkey. An rkey is
	// unique per device only: regions of two devices (or of two processes
	// on the reference NIC) may share one, and the remote address then
	// decides (remoteRegion).
	byRKey map[uint32][]*memRegion
	queues map[queueKey][]postedWR
	lat    map[LatencyKey][]uint64
	// peers: where each QP connects, by pid and QP number; writing: each
	// process's plain WRITEs queued per QP; epochs: each thread's WRITEs
	// per remote port since its last notice there (ordering.go).
	peers   map[pidPtr]qpPeer
	writing map[uint32]map[uint32]int
	epochs  map[epochKey]*notifyEpoch
	stats   RDMAStats
}

func newRDMATracker() *rdmaTracker {
	return &rdmaTracker{mrs: map[pidPtr]*memRegion{}, byLKey: map[pidPtr]*memRegion{}, byRKey: map[uint32][]*memRegion{},
		queues: map[queueKey][]postedWR{}, lat: map[LatencyKey][]uint64{}, peers: map[pidPtr]qpPeer{},
		writing: map[uint32]map[uint32]int{}, epochs: map[epochKey]*notifyEpoch{}, stats: RDMAStats{ByStatus: map[string]uint64{}}}
}

// handle consumes one verbs or provider event.
func (r *rdmaTracker) handle(e *Engine, c *event.Call) {
	switch c.Op {
	case event.OpMRRegister:
		r.register(e, c)
	case event.OpMRDeregister:
		if mr := r.mrs[pidPtr{c.PID, c.RDMA.MR}]; mr != nil {
			r.checkDereg(c, mr)
			r.forget(mr)
		}
	case event.OpQPModify:
		r.connect(c)
	case event.OpPostSend, event.OpPostRecv:
		r.post(e, c, c.Op == event.OpPostRecv)
	case event.OpPollCQ:
		r.complete(e, c)
	}
}

func (r *rdmaTracker) register(e *Engine, c *event.Call) {
	if c.RDMA.MR == 0 {
		r.stats.FailedMRs++
		return
	}
	// Registering host memory pins it, but a region over device memory
	// (nvidia-peermem, dma-buf) is GPU memory: only what the registry
	// placed is known (docs/design.md, "Correlation").
	mem, base := event.MemUnknown, c.Ptr
	if c.RDMA.Dmabuf {
		mem, base = e.reg.dmabufRegion(c.PID, uint32(c.Handle), c.Offset, c.Size)
	} else if kind, _ := e.reg.Lookup(c.PID, c.Ptr); kind == event.MemPinned || kind == event.MemDevice || kind == event.MemManaged {
		mem = kind
	}
	mr := &memRegion{pid: c.PID, mr: c.RDMA.MR, addr: c.Ptr, length: c.Size, lkey: c.RDMA.LKey, rkey: c.RDMA.RKey, mem: mem,
		base: base}
	if old := r.mrs[pidPtr{c.PID, mr.mr}]; old != nil {
		r.forget(old)
	} else if len(r.mrs) >= maxRegions {
		r.stats.RegionCapHits++
		return
	}
	r.mrs[pidPtr{c.PID, mr.mr}] = mr
	r.byLKey[pidPtr{c.PID, uint64(mr.lkey)}] = mr
	r.byRKey[mr.rkey] = append(r.byRKey[mr.rkey], mr)
}

func (r *rdmaTracker) forget(mr *memRegion) {
	delete(r.mrs, pidPtr{mr.pid, mr.mr})
	if r.byLKey[pidPtr{mr.pid, uint64(mr.lkey)}] == mr {
		delete(r.byLKey, pidPtr{mr.pid, uint64(mr.lkey)})
	}
	if rs := slices.DeleteFunc(r.byRKey[mr.rkey], func(x *memRegion) bool { return x == mr }); len(rs) > 0 {
		r.byRKey[mr.rkey] = rs
	} else {
		delete(r.byRKey, mr.rkey)
	}
}

// remoteRegion is the live region a work request's rkey and remote address
// name: the one region with that rkey whose range holds the address, or the
// only region with that rkey; nil when none, or when several could be it
// (the owner is then unknown, never guessed).
func (r *rdmaTracker) remoteRegion(rkey uint32, addr uint64) *memRegion {
	rs := r.byRKey[rkey]
	if len(rs) == 1 {
		return rs[0]
	}
	var found *memRegion
	for _, mr := range rs {
		if addr >= mr.addr && addr-mr.addr < mr.length {
			if found != nil {
				return nil
			}
			found = mr
		}
	}
	return found
}

// side classifies one end of a work request from the region its key names.
func (r *rdmaTracker) side(mr *memRegion, addr uint64) Side {
	if mr == nil {
		return Side{Addr: addr, Mem: event.MemUnknown}
	}
	return Side{Addr: addr, Mem: mr.mem}
}

func (r *rdmaTracker) post(e *Engine, c *event.Call, recv bool) {
	r.stats.WorkRequests++
	var local *memRegion
	if c.RDMA.NumSGE > 0 { // a receive for WRITE_WITH_IMM has no buffer: its lkey means nothing
		local = r.byLKey[pidPtr{c.PID, uint64(c.RDMA.LKey)}]
	}
	w := postedWR{opcode: c.RDMA.Opcode, signaled: c.RDMA.SendFlags&ibvSendSignaled != 0, local: c.RDMA.Local,
		lkey: c.RDMA.LKey, nsge: c.RDMA.NumSGE}
	t := &w.t
	*t = Transfer{PID: c.PID, TID: c.TID, API: "ibv_post_send", Op: event.OpPostSend, Mover: MoverNIC, Bytes: c.Bytes,
		SubmitNs: c.Time, BatchIndex: int(c.BatchIndex), Layer: -1, QPNum: c.RDMA.QPNum, WRID: c.RDMA.WRID}
	if recv {
		t.API, t.Op, t.Direction = "ibv_post_recv", event.OpPostRecv, DirRecv
		t.Dst = r.side(local, c.RDMA.Local)
		t.Src = Side{Mem: event.MemUnknown}
	} else {
		dir := DirUnknown
		if int(w.opcode) < len(wrOpcodes) && wrOpcodes[w.opcode].dir != "" {
			dir = wrOpcodes[w.opcode].dir
		}
		t.Direction = dir
		var remote *memRegion
		if dir != DirSend { // a send lands in the peer's posted receive: its rkey field means nothing
			remote = r.remoteRegion(c.RDMA.RKey, c.RDMA.RemoteAddr)
		}
		if remote != nil && remote.pid != c.PID {
			t.PeerPID = remote.pid
		}
		l, rm := r.side(local, c.RDMA.Local), r.side(remote, c.RDMA.RemoteAddr)
		t.Src, t.Dst = l, rm
		if dir == DirRDMARead {
			t.Src, t.Dst = rm, l
		}
	}
	if local != nil && local.mem != event.MemDevice {
		t.HostMem = local.mem
	}
	// The GPU whose link the bytes cross (docs/design.md, "Placement"): the
	// device holding this process's buffer, else a local peer's at the rkey.
	switch {
	case local != nil && local.mem == event.MemDevice:
		t.GPU = e.memGPU(c.PID, local.at(c.RDMA.Local))
	case !recv && t.PeerPID != 0 && (t.Src.Mem == event.MemDevice || t.Dst.Mem == event.MemDevice):
		t.GPU = e.memGPU(t.PeerPID, r.remoteRegion(c.RDMA.RKey, c.RDMA.RemoteAddr).at(c.RDMA.RemoteAddr))
	}
	if !recv && isNotify(w.opcode) {
		r.checkNotify(c.PID, c.TID, c.RDMA.QPNum, t)
	}
	if !recv && w.opcode == opRDMAWrite {
		w.ep = r.epoch(c.PID, c.TID, c.RDMA.QPNum)
	}
	k := queueKey{c.PID, c.RDMA.QPNum, recv}
	q, ok := r.queues[k]
	if !ok && len(r.queues) >= maxQueues {
		r.stats.QueueCapHits++
		if w.ep != nil {
			w.ep.lost++ // never followed to its completion
		}
		r.emit(e, t, "", 0)
		return
	}
	if len(q) >= maxQueued {
		r.writeGone(k, &q[0], false)
		r.emit(e, &q[0].t, "", 0)
		q = q[1:]
	}
	r.queues[k] = append(q, w)
	if !recv && w.opcode == opRDMAWrite {
		r.writeQueued(k.pid, k.qp)
	}
}

// complete joins a completion with its request. Queues complete in order,
// so the requests posted before it (unsignaled ones) are complete too.
func (r *rdmaTracker) complete(e *Engine, c *event.Call) {
	r.stats.Completions++
	status := WCStatusName(c.RDMA.Status)
	r.stats.ByStatus[status]++
	k := queueKey{c.PID, c.RDMA.QPNum, c.RDMA.Opcode >= ibvWCRecv}
	q := r.queues[k]
	i := slices.IndexFunc(q, func(w postedWR) bool { return w.t.WRID == c.RDMA.WRID })
	if i < 0 {
		r.stats.Unmatched++
		return
	}
	at := c.ReturnTime
	for j := 0; j <= i; j++ {
		w := &q[j]
		st := "success" // an earlier request on an in-order queue finished before this one
		if j == i {
			st = status
			if k.recv {
				w.t.Bytes = c.Bytes // what actually arrived
			}
			if w.signaled || k.recv {
				lk := LatencyKey{c.PID, k.qp, WROpcodeName(w.opcode)}
				if k.recv {
					lk.Opcode = "RECV"
				}
				s, ok := r.lat[lk]
				switch {
				case !ok && len(r.lat) >= maxLatencySeries:
					r.stats.LatencyCapHits++
				case len(s) >= latencySamples:
					r.lat[lk] = append(s[1:], at-w.t.SubmitNs)
				default:
					r.lat[lk] = append(s, at-w.t.SubmitNs)
				}
			}
		}
		r.writeGone(k, w, true)
		r.emit(e, &w.t, st, at)
	}
	if q = slices.Delete(q, 0, i+1); len(q) > 0 {
		r.queues[k] = q
	} else {
		delete(r.queues, k) // an empty queue holds no place under maxQueues
	}
}

func (r *rdmaTracker) emit(e *Engine, t *Transfer, status string, completeNs uint64) {
	if completeNs == 0 {
		r.stats.Evicted++
	}
	t.Status, t.CompleteNs = status, completeNs
	e.stats.Transfers++
	e.sink.Transfer(t)
}

// drain emits a process's requests still waiting for a completion.
func (r *rdmaTracker) drain(e *Engine, pid uint32) {
	keys := make([]queueKey, 0)
	for k := range r.queues {
		if pid == 0 || k.pid == pid {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, func(a, b queueKey) int { return int(a.qp) - int(b.qp) })
	for _, k := range keys {
		for i := range r.queues[k] {
			r.emit(e, &r.queues[k][i].t, "", 0)
		}
		delete(r.queues, k)
	}
	if pid == 0 {
		clear(r.writing)
	} else {
		delete(r.writing, pid)
	}
}

// exit forgets a process after draining it, its latency samples too: a
// daemon sees processes come and go, and kept they would grow without bound.
func (r *rdmaTracker) exit(e *Engine, pid uint32) {
	r.drain(e, pid)
	for k, mr := range r.mrs {
		if k.pid == pid {
			r.forget(mr)
		}
	}
	for k := range r.lat {
		if k.PID == pid {
			delete(r.lat, k)
		}
	}
	r.forgetPeers(pid)
}

// RDMALatency summarises posted→completed latency per queue pair and
// opcode of the processes still running: what the seed calls "posted ≠
// completed".
func (e *Engine) RDMALatency() []LatencySummary {
	r := e.rdma
	var out []LatencySummary
	for k, s := range r.lat {
		sorted := slices.Clone(s)
		slices.Sort(sorted)
		inflight := len(r.queues[queueKey{k.PID, k.QPNum, k.Opcode == "RECV"}])
		out = append(out, LatencySummary{LatencyKey: k, Count: len(s), P50: Percentile(sorted, 50), P99: Percentile(sorted, 99), InFlight: inflight})
	}
	slices.SortFunc(out, func(a, b LatencySummary) int {
		if a.PID != b.PID {
			return int(a.PID) - int(b.PID)
		}
		if a.QPNum != b.QPNum {
			return int(a.QPNum) - int(b.QPNum)
		}
		if a.Opcode < b.Opcode {
			return -1
		}
		return 1
	})
	return out
}

// RDMAStats returns the tracker's counters.
func (e *Engine) RDMAStats() RDMAStats {
	s := e.rdma.stats
	s.ByStatus = map[string]uint64{}
	for k, v := range e.rdma.stats.ByStatus {
		s.ByStatus[k] = v
	}
	s.MemoryRegions = len(e.rdma.mrs)
	for _, q := range e.rdma.queues {
		s.QueuedRequests += len(q)
	}
	return s
}

// Percentile is the nearest-rank percentile of sorted values.
func Percentile(sorted []uint64, p int) uint64 {
	if len(sorted) == 0 {
		return 0
	}
	i := (p*len(sorted)+99)/100 - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}
