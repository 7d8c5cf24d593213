package correlate

import (
	"cmp"
	"slices"
	"strings"

	"github.com/lanewatch/lanewatch/event"
)

// libfabric (docs/design.md, "Transfer libraries"): a send, write or read
// as the application posted it through an endpoint's ops, joined to its
// completion read from the CQ bound to the endpoint's transmits. One
// record per call that returned 0: -FI_EAGAIN asks the application to
// call again, so a retry is counted, never a transfer. A completion
// carries the context the post was given; where the application passed
// none (fi_pingpong does), a transmit-only CQ completes its sends in the
// order they were posted. The provider and domain names come from the
// agent (FabricEndpoint), which reads them from the fi_info the endpoint
// was opened with.

const (
	fiEAgain   = -11        // -FI_EAGAIN: not posted, call again
	fiTransmit = 1 << 11    // FI_TRANSMIT: a CQ bound to an endpoint's sends
	fiRecv     = 1 << 10    // FI_RECV: to its receives
	fiManyIovs = ^uint64(0) // a msg form's bytes the probe could not sum (LW_FMSG_MANY)
	// Caps: endpoints and CQs known, over every process.
	maxFabricObjects = 1 << 14
)

// Transport reasons of a libfabric record whose provider is not known.
const (
	ReasonEndpointNotSeen = "endpoint_not_seen" // opened before its constructor was probed (late attach)
	ReasonProviderUnread  = "provider_unread"   // the fi_info it was opened with could not be read
)

// FabricStats counts what the libfabric tracker saw and could not join.
type FabricStats struct {
	Posted       uint64 // sends, writes and reads that returned 0: one record each
	Retries      uint64 // calls that returned -FI_EAGAIN: not posted, no record
	Failed       uint64 // calls that returned another error: no record
	Completions  uint64 // CQ entries read from probed CQs
	Joined       uint64 // records completed by a CQ entry
	Unmatched    uint64 // CQ entries joined to no record (receives on a shared CQ, posts before the attach)
	NoCompletion uint64 // records emitted without a completion (inject, no transmit CQ known, exit, caps)
	CapHits      uint64 // an endpoint, CQ or queue past its cap
}

type fabricEP struct {
	provider, device, reason string
	txCQ                     uint64 // the CQ bound to its transmits, 0 unknown
}

type fabricPosted struct {
	t   Transfer
	ctx uint64
}

type fabricTracker struct {
	eps    map[pidPtr]*fabricEP
	cqs    map[pidPtr]uint64         // a CQ's bind flags (fiTransmit, fiRecv)
	queues map[pidPtr][]fabricPosted // posted, waiting on their transmit CQ
	stats  FabricStats
}

// FabricEndpoint names the provider and domain of the endpoint ep of
// process pid; err says why they could not be read. The agent calls it
// before handing the engine the endpoint's constructor call.
func (e *Engine) FabricEndpoint(pid uint32, ep uint64, provider, device string, err error) {
	f := &e.fabric
	x := f.ep(pid, ep)
	if x == nil {
		return
	}
	x.provider, x.device, x.reason = provider, device, ""
	if err != nil {
		x.provider, x.device, x.reason = "", "", ReasonProviderUnread
	}
}

// FabricStats returns the libfabric tracker's counters.
func (e *Engine) FabricStats() FabricStats { return e.fabric.stats }

func (f *fabricTracker) ep(pid uint32, ep uint64) *fabricEP {
	k := pidPtr{pid, ep}
	if x := f.eps[k]; x != nil {
		return x
	}
	if f.eps == nil {
		f.eps, f.cqs, f.queues = map[pidPtr]*fabricEP{}, map[pidPtr]uint64{}, map[pidPtr][]fabricPosted{}
	}
	if len(f.eps) >= maxFabricObjects {
		f.stats.CapHits++
		return nil
	}
	x := &fabricEP{reason: ReasonEndpointNotSeen}
	f.eps[k] = x
	return x
}

func (f *fabricTracker) handle(e *Engine, c *event.Call) {
	if c.Kind != event.KindCall {
		return // only a call's own event means anything here
	}
	switch {
	case c.Op.IsXfer():
		f.post(e, c)
	case c.Op == event.OpXferDone:
		f.complete(e, c)
	case c.Op == event.OpFabricObject && strings.HasSuffix(c.Symbol, "fi_ep_bind") && int32(c.Ret) == 0:
		// (&ep->fid, &cq->fid, flags): a CQ (or a counter, an AV: bound
		// without FI_TRANSMIT, or never read) now reports the endpoint's ops.
		x := f.ep(c.PID, c.Ptr)
		if x == nil {
			return
		}
		if c.Flags&fiTransmit != 0 {
			x.txCQ = c.Handle
		}
		k := pidPtr{c.PID, c.Handle}
		if _, ok := f.cqs[k]; ok || len(f.cqs) < maxFabricObjects {
			f.cqs[k] |= c.Flags & (fiTransmit | fiRecv)
		} else {
			f.stats.CapHits++
		}
	}
}

// post makes the record of a send, write or read that was posted.
func (f *fabricTracker) post(e *Engine, c *event.Call) {
	switch ret := int64(c.Ret); {
	case ret == fiEAgain:
		f.stats.Retries++
		return
	case ret != 0:
		f.stats.Failed++
		return
	}
	f.stats.Posted++
	x := f.ep(c.PID, c.Ptr)
	var p fabricPosted
	t := &p.t
	*t = Transfer{PID: c.PID, TID: c.TID, API: strings.TrimPrefix(c.Symbol, "provider:"), Op: c.Op, Bytes: c.Bytes,
		SubmitNs: c.Time, BatchIndex: -1, Layer: -1, Endpoint: c.Ptr, Transport: "unknown", TransportReason: ReasonEndpointNotSeen}
	if x != nil && x.provider != "" {
		t.Transport, t.TransportReason, t.NetDevice = x.provider, "", x.device
	} else if x != nil {
		t.TransportReason = x.reason
	}
	t.Mover = MoverOf(ClassOf(t.Transport))
	if t.Bytes == fiManyIovs { // a message of more iovecs than the probe sums
		t.Bytes, t.BytesUnknown = 0, true
	}
	local := c.Src
	switch c.Op {
	case event.OpXferSend:
		t.Direction = DirSend
	case event.OpXferPut:
		t.Direction, t.RemoteAddr = DirRDMAWrite, c.Dst
	case event.OpXferGet:
		t.Direction, t.RemoteAddr, local = DirRDMARead, c.Src, c.Dst
	}
	mem, _ := e.Lookup(c.PID, local)
	l, remote := Side{Addr: local, Mem: mem}, Side{Addr: c.Dst, Mem: event.MemUnknown}
	if c.Op == event.OpXferSend {
		remote.Addr = 0 // a message's peer is an address-vector index, not memory
	}
	t.Src, t.Dst = l, remote
	if c.Op == event.OpXferGet {
		t.Src, t.Dst = Side{Addr: c.Src, Mem: event.MemUnknown}, l
	}
	if mem == event.MemDevice {
		t.GPU = e.memGPU(c.PID, local)
	}
	p.ctx = c.Handle
	// An inject completes nothing: its buffer is free when it returns.
	if strings.Contains(t.API, "inject") || x == nil || x.txCQ == 0 {
		f.emit(e, t, 0)
		return
	}
	k := pidPtr{c.PID, x.txCQ}
	q, ok := f.queues[k]
	if !ok && len(f.queues) >= maxQueues {
		f.stats.CapHits++
		f.emit(e, t, 0)
		return
	}
	if len(q) >= maxQueued {
		f.stats.CapHits++
		f.emit(e, &q[0].t, 0)
		q = q[1:]
	}
	f.queues[k] = append(q, p)
}

// complete joins the entries a CQ read returned to the records waiting on
// that CQ: the first entry by its context when it has one, the rest in
// posting order when the CQ reports transmits only.
func (f *fabricTracker) complete(e *Engine, c *event.Call) {
	n := int64(c.Ret)
	if n <= 0 {
		return // -FI_EAGAIN: nothing yet
	}
	f.stats.Completions += uint64(n)
	k := pidPtr{c.PID, c.Ptr}
	q := f.queues[k]
	fifo := f.cqs[k]&fiRecv == 0
	for i := int64(0); i < n; i++ {
		j := -1
		switch {
		case i == 0 && c.Handle != 0:
			j = slices.IndexFunc(q, func(p fabricPosted) bool { return p.ctx == c.Handle })
		case fifo && len(q) > 0:
			j = 0
		}
		if j < 0 {
			f.stats.Unmatched++
			continue
		}
		f.stats.Joined++
		q[j].t.Status = "success"
		f.emit(e, &q[j].t, c.ReturnTime)
		q = slices.Delete(q, j, j+1)
	}
	if len(q) > 0 {
		f.queues[k] = q
	} else {
		delete(f.queues, k)
	}
}

func (f *fabricTracker) emit(e *Engine, t *Transfer, completeNs uint64) {
	if completeNs == 0 {
		f.stats.NoCompletion++
	} else {
		t.CompleteNs, t.LatencyNs = completeNs, completeNs-t.SubmitNs
	}
	e.sink.Transfer(t) // counted in FabricStats, as UCX's in its own: Stats.Transfers are copies
}

// drain emits the records of process pid (0: every process) still waiting
// for a completion, and with exit forgets its endpoints and CQs.
func (f *fabricTracker) drain(e *Engine, pid uint32, exit bool) {
	keys := make([]pidPtr, 0)
	for k := range f.queues {
		if pid == 0 || k.pid == pid {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, func(a, b pidPtr) int { return cmp.Or(cmp.Compare(a.pid, b.pid), cmp.Compare(a.ptr, b.ptr)) })
	for _, k := range keys {
		for i := range f.queues[k] {
			f.emit(e, &f.queues[k][i].t, 0)
		}
		delete(f.queues, k)
	}
	if !exit {
		return
	}
	for k := range f.eps {
		if k.pid == pid {
			delete(f.eps, k)
		}
	}
	for k := range f.cqs {
		if k.pid == pid {
			delete(f.cqs, k)
		}
	}
}
