package correlate

import (
	"bytes"
	"strings"

	"github.com/lanewatch/lanewatch/event"
)

// UCX (docs/design.md, "Transfer libraries"): a UCP call is the transfer
// as the application posted it; the first UCT endpoint call nested in it
// (lw_uct_lane) names the interface it went on, whose transport and
// device uct_iface_open named. The call's result says when it finished:
// UCS_OK, done at return; an error, failed; a request pointer, done when
// the request is freed (ucp_request_free, which an application calls in
// its completion callback or once ucp_request_check_status says done).

// UCS status codes are small negative numbers (ucs/type/status.h): a
// ucs_status_ptr_t at or above -ucsErrLast is one, anything else nonzero
// a request.
const ucsErrLast = 100

// ucs_memory_type_t values (ucs/memory/memory_type.h).
const (
	ucsMemHost        = 0
	ucsMemCUDA        = 1
	ucsMemCUDAManaged = 2
	ucsMemROCm        = 3
	ucsMemROCmManaged = 4
)

// UCP_OP_ATTR_FIELD_MEMORY_TYPE, and UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE.
const (
	ucpOpFieldMemoryType     = 1 << 6
	ucpMemMapFieldMemoryType = 1 << 4
)

// Datatype classes (ucp_dt_type, the low 3 bits of ucp_datatype_t).
const (
	ucpDatatypeContig = 0
	ucpDatatypeShift  = 3
	ucpDatatypeMask   = 7
)

// Caps: interfaces and mapped ranges remembered, requests waiting for
// their completion (over every process).
const (
	maxIfaces     = 1 << 12
	maxMapped     = 1 << 14
	maxXferWaits  = 1 << 14
	maxEndpoints  = 1 << 14
	transportSeen = "transport_not_seen" // no UCT call nested in the UCP call, nor in an earlier one of its endpoint
	ifaceUnseen   = "iface_not_seen"     // a UCT call was, on an interface opened before the agent looked
)

// XferStats counts what the transfer-library tracker saw and could not
// join.
type XferStats struct {
	Posted        uint64 // transfers posted (UCP calls that returned)
	Failed        uint64 // of them, those that returned an error
	Requests      uint64 // of them, those that returned a request
	Completed     uint64 // requests whose completion was seen
	Evicted       uint64 // requests emitted without one (cap, exit, timeout, flush)
	NoLane        uint64 // transfers with no UCT call nested (their endpoint's last lane, or unknown)
	UnknownIfaces uint64 // transfers on an interface opened before the agent looked
	Waiting       int    // requests waiting now
	// Caps: interfaces and mapped ranges not remembered, requests emitted
	// at once without a completion.
	IfaceCapHits, MappedCapHits, WaitCapHits, EndpointCapHits uint64
}

// epOp is an endpoint's transfers of one kind: a UCP endpoint keeps a
// lane per kind (its RMA lanes, its active-message lane).
type epOp struct {
	pid uint32
	ep  uint64
	op  event.Op
}

type ucxLane struct{ transport, device string }

type mappedRange struct {
	start, end uint64
	mem        event.MemKind
}

type xferWait struct {
	t   Transfer
	key pidPtr
}

type xferTracker struct {
	ifaces  map[pidPtr]ucxLane
	lastOn  map[epOp]uint64 // the interface an endpoint's last transfer of a kind went on
	mapped  map[uint32][]mappedRange
	nMapped int
	waiting map[pidPtr]int // (pid, request) → index in order
	order   []xferWait     // requests waiting, oldest first; a zero key is a slot already emitted
	stats   XferStats
}

func newXferTracker() *xferTracker {
	return &xferTracker{ifaces: map[pidPtr]ucxLane{}, lastOn: map[epOp]uint64{}, mapped: map[uint32][]mappedRange{}, waiting: map[pidPtr]int{}}
}

// handleUCX consumes one UCP or UCT event.
func (x *xferTracker) handleUCX(e *Engine, c *event.Call) {
	if c.Kind != event.KindCall {
		return // only a call's own event means anything here
	}
	switch c.Op {
	case event.OpXferIface:
		x.iface(c)
	case event.OpXferMemMap:
		x.memMap(c)
	case event.OpXferPut, event.OpXferGet, event.OpXferSend:
		x.post(e, c)
	case event.OpXferDone:
		x.done(e, c)
	}
}

func (x *xferTracker) iface(c *event.Call) {
	if c.Ret != 0 || c.Xfer.Iface == 0 {
		return // the open failed: no interface
	}
	k := pidPtr{c.PID, c.Xfer.Iface}
	if _, ok := x.ifaces[k]; !ok && len(x.ifaces) >= maxIfaces {
		x.stats.IfaceCapHits++
		return
	}
	x.ifaces[k] = ucxLane{transport: cString(c.Xfer.Transport[:]), device: cString(c.Xfer.Device[:])}
}

func (x *xferTracker) memMap(c *event.Call) {
	if c.Ret != 0 || c.Ptr == 0 || c.Size == 0 {
		return // failed, or UCX allocated the memory itself (its address is not in the call)
	}
	if x.nMapped >= maxMapped {
		x.stats.MappedCapHits++
		return
	}
	mem := event.MemRegistered
	if c.Xfer.ParamMask&ucpMemMapFieldMemoryType != 0 {
		mem = memOfUCS(c.Xfer.MemType)
	}
	x.mapped[c.PID] = append(x.mapped[c.PID], mappedRange{start: c.Ptr, end: c.Ptr + c.Size, mem: mem})
	x.nMapped++
}

// memOfUCS is the memory kind a ucs_memory_type_t names.
func memOfUCS(t uint32) event.MemKind {
	switch t {
	case ucsMemHost:
		return event.MemRegistered
	case ucsMemCUDA, ucsMemROCm:
		return event.MemDevice
	case ucsMemCUDAManaged, ucsMemROCmManaged:
		return event.MemManaged
	}
	return event.MemUnknown
}

// localMem is what backs a transfer's local buffer: what the application
// told UCX (the request's memory type), what the CUDA registry placed,
// what it mapped with ucp_mem_map; unknown otherwise — host memory UCX
// registers on the fly is neither pinned by CUDA nor provably pageable.
func (x *xferTracker) localMem(e *Engine, c *event.Call) event.MemKind {
	if c.Xfer.ParamMask&ucpOpFieldMemoryType != 0 {
		if m := memOfUCS(c.Xfer.MemType); m != event.MemRegistered && m != event.MemUnknown {
			return m
		}
	}
	if kind, _ := e.reg.Lookup(c.PID, c.Src); kind == event.MemDevice || kind == event.MemManaged || kind == event.MemPinned {
		return kind
	}
	for _, r := range x.mapped[c.PID] {
		if c.Src >= r.start && c.Src < r.end {
			return r.mem
		}
	}
	return event.MemUnknown
}

func (x *xferTracker) post(e *Engine, c *event.Call) {
	x.stats.Posted++
	t := Transfer{PID: c.PID, TID: c.TID, API: c.Symbol, Op: c.Op, Bytes: c.Bytes, SubmitNs: c.Time, BatchIndex: -1, Layer: -1,
		Endpoint: c.Xfer.Endpoint}
	if dt := c.Xfer.Datatype; dt&ucpDatatypeMask == ucpDatatypeContig {
		t.Bytes = c.Bytes * (dt >> ucpDatatypeShift)
	} else {
		t.Bytes, t.BytesUnknown = 0, true // an iov or generic datatype: count is not bytes
	}
	local := Side{Addr: c.Src, Mem: x.localMem(e, c)}
	remote := Side{Mem: event.MemUnknown}
	switch c.Op {
	case event.OpXferPut:
		t.Direction, t.RemoteAddr = DirRDMAWrite, c.Xfer.Remote
		remote.Addr = c.Xfer.Remote
		t.Src, t.Dst = local, remote
	case event.OpXferGet:
		t.Direction, t.RemoteAddr = DirRDMARead, c.Xfer.Remote
		remote.Addr = c.Xfer.Remote
		t.Src, t.Dst = remote, local
	default:
		t.Direction = DirSend
		t.Src, t.Dst = local, remote
	}
	if local.Mem != event.MemDevice {
		t.HostMem = local.Mem
	} else {
		t.GPU = e.memGPU(c.PID, c.Src)
	}
	x.lane(c, &t)
	t.Mover = MoverOf(ClassOf(t.Transport))

	status := int64(c.Ret)
	switch {
	case c.Ret == 0: // UCS_OK: complete at return
		t.CompleteNs, t.LatencyNs = c.ReturnTime, c.ReturnTime-c.Time
		e.sink.Transfer(&t)
	case status < 0 && status >= -ucsErrLast:
		x.stats.Failed++
		t.Error = &CallError{Code: uint32(c.Ret), Name: ucsStatusName(status)}
		e.sink.Transfer(&t)
	default:
		x.stats.Requests++
		x.wait(e, pidPtr{c.PID, c.Ret}, t)
	}
}

// lane names the transport and device the transfer went on. A call that
// made no UCT call (UCX queued it, and its worker's progress sends it; a
// rendezvous whose receiver pulls) is said to be on its endpoint's last
// lane for its kind, marked transport_inferred.
func (x *xferTracker) lane(c *event.Call, t *Transfer) {
	iface, k := c.Xfer.Iface, epOp{c.PID, c.Xfer.Endpoint, c.Op}
	switch {
	case iface != 0:
		if _, ok := x.lastOn[k]; ok || len(x.lastOn) < maxEndpoints {
			x.lastOn[k] = iface
		} else {
			x.stats.EndpointCapHits++
		}
	case x.lastOn[k] != 0:
		x.stats.NoLane++
		iface, t.TransportInferred = x.lastOn[k], true
	default:
		x.stats.NoLane++
		t.Transport, t.TransportReason = "unknown", transportSeen
		return
	}
	if l, ok := x.ifaces[pidPtr{c.PID, iface}]; ok {
		t.Transport, t.NetDevice = l.transport, l.device
		return
	}
	// The interface was opened before the agent looked: the UCT function
	// that carried it still names the transport, not the device.
	x.stats.UnknownIfaces++
	t.Transport, t.TransportReason = transportOfLaneSymbol(c.Xfer.LaneSymbol), ifaceUnseen
	if t.Transport == "" {
		t.Transport = "unknown"
	}
}

// transportOfLaneSymbol is the transport a UCT endpoint function belongs
// to ("uct_rc_mlx5_ep_put_zcopy" → rc_mlx5); "" when it serves several
// (uct_sm_ep_* serve posix and sysv, uct_scopy_ep_* cma and knem).
func transportOfLaneSymbol(sym string) string {
	rest, ok := strings.CutPrefix(sym, "uct_")
	if !ok {
		return ""
	}
	for _, tl := range []string{"rc_mlx5", "dc_mlx5", "rc_verbs", "ud_mlx5", "ud_verbs", "tcp", "self"} {
		if strings.HasPrefix(rest, tl+"_ep_") {
			return tl
		}
	}
	return ""
}

// wait keeps a request until its completion, bounded: at the cap the
// oldest goes out without one.
func (x *xferTracker) wait(e *Engine, k pidPtr, t Transfer) {
	if _, dup := x.waiting[k]; dup {
		x.evict(e, x.waiting[k]) // the same request again: the earlier one's free was not seen
	}
	if len(x.waiting) >= maxXferWaits {
		x.stats.WaitCapHits++
		x.evictOldest(e)
	}
	if len(x.order) > 2*maxXferWaits {
		x.compact()
	}
	x.waiting[k] = len(x.order)
	x.order = append(x.order, xferWait{t: t, key: k})
}

func (x *xferTracker) done(e *Engine, c *event.Call) {
	k := pidPtr{c.PID, c.Ptr}
	i, ok := x.waiting[k]
	if !ok {
		return // a request posted before the agent looked, or not a transfer's
	}
	w := &x.order[i]
	w.t.CompleteNs, w.t.LatencyNs = c.Time, c.Time-w.t.SubmitNs
	x.stats.Completed++
	x.emit(e, i)
}

func (x *xferTracker) emit(e *Engine, i int) {
	w := &x.order[i]
	delete(x.waiting, w.key)
	w.key = pidPtr{}
	e.sink.Transfer(&w.t)
	w.t = Transfer{}
}

func (x *xferTracker) evict(e *Engine, i int) {
	x.stats.Evicted++
	x.emit(e, i)
}

func (x *xferTracker) evictOldest(e *Engine) {
	for i := range x.order {
		if x.order[i].key != (pidPtr{}) {
			x.evict(e, i)
			return
		}
	}
}

// compact drops the emitted slots from the front of order.
func (x *xferTracker) compact() {
	live := x.order[:0]
	for _, w := range x.order {
		if w.key != (pidPtr{}) {
			x.waiting[w.key] = len(live)
			live = append(live, w)
		}
	}
	clear(x.order[len(live):])
	x.order = live
}

// sweep emits requests that waited past the engine's timeout, without a
// completion.
func (x *xferTracker) sweep(e *Engine) {
	for i := range x.order {
		w := &x.order[i]
		if w.key == (pidPtr{}) {
			continue
		}
		if w.t.SubmitNs+e.timeout >= e.now {
			break
		}
		x.evict(e, i)
	}
	x.compact()
}

// drain emits the requests of pid still waiting (every process's for 0).
func (x *xferTracker) drain(e *Engine, pid uint32) {
	for i := range x.order {
		if k := x.order[i].key; k != (pidPtr{}) && (pid == 0 || k.pid == pid) {
			x.evict(e, i)
		}
	}
	x.compact()
}

// exit forgets a process.
func (x *xferTracker) exit(e *Engine, pid uint32) {
	x.drain(e, pid)
	for k := range x.ifaces {
		if k.pid == pid {
			delete(x.ifaces, k)
		}
	}
	for k := range x.lastOn {
		if k.pid == pid {
			delete(x.lastOn, k)
		}
	}
	x.nMapped -= len(x.mapped[pid])
	delete(x.mapped, pid)
}

// XferStats returns the transfer-library tracker's counters.
func (e *Engine) XferStats() XferStats {
	s := e.xfer.stats
	s.Waiting = len(e.xfer.waiting)
	return s
}

// ucsStatusName names a ucs_status_t error (ucs/type/status.h).
func ucsStatusName(s int64) string { return ucsStatusNames[s] }

var ucsStatusNames = map[int64]string{-1: "UCS_ERR_NO_MESSAGE", -2: "UCS_ERR_NO_RESOURCE", -3: "UCS_ERR_IO_ERROR",
	-4: "UCS_ERR_NO_MEMORY", -5: "UCS_ERR_INVALID_PARAM", -6: "UCS_ERR_UNREACHABLE", -7: "UCS_ERR_INVALID_ADDR",
	-8: "UCS_ERR_NOT_IMPLEMENTED", -9: "UCS_ERR_MESSAGE_TRUNCATED", -10: "UCS_ERR_NO_PROGRESS",
	-11: "UCS_ERR_BUFFER_TOO_SMALL", -12: "UCS_ERR_NO_ELEM", -13: "UCS_ERR_SOME_CONNECTS_FAILED",
	-14: "UCS_ERR_NO_DEVICE", -15: "UCS_ERR_BUSY", -16: "UCS_ERR_CANCELED", -17: "UCS_ERR_SHMEM_SEGMENT",
	-18: "UCS_ERR_ALREADY_EXISTS", -19: "UCS_ERR_OUT_OF_RANGE", -20: "UCS_ERR_TIMED_OUT",
	-21: "UCS_ERR_EXCEEDS_LIMIT", -22: "UCS_ERR_UNSUPPORTED", -23: "UCS_ERR_REJECTED",
	-24: "UCS_ERR_NOT_CONNECTED", -25: "UCS_ERR_CONNECTION_RESET", -40: "UCS_ERR_FIRST_LINK_FAILURE",
	-80: "UCS_ERR_ENDPOINT_TIMEOUT"}

// cString is a NUL-padded name as a string.
func cString(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}
