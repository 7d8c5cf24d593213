package correlate

import (
	"fmt"
	"net"
	"slices"
	"strings"

	"github.com/lanewatch/lanewatch/event"
)

// Completed is not consumable (seed 002 §4.1, §5): the tracker checks two
// orderings as work requests are posted and regions deregistered, from the
// requests it holds as outstanding (posted, no completion polled yet; a
// later signaled request's completion covers the unsignaled ones before it
// on its queue, as complete() applies):
//
//   - a notification (SEND, SEND_WITH_IMM, RDMA_WRITE_WITH_IMM) posted on
//     one QP while plain RDMA WRITEs to the same remote port are outstanding
//     on another: QPs are not ordered with each other, so the consumer may
//     act on the notice before the data lands (cross-qp-notify);
//   - ibv_dereg_mr of a region that outstanding requests of the process use
//     by lkey or address (mr-dereg-in-flight).
//
// Which data a notice announces is in its payload, which the agent does not
// read. A server with concurrent requests posts request X's notice while
// request Y's WRITEs to the same decode peer are in flight, and that is
// healthy; two different local QPs never share a remote QP (RC connects
// one to one), so dest_qp_num names the endpoints but cannot say that the
// notice's consumer is the data's. The evidence is the posting thread: a
// thread's WRITEs to a port since its previous notice there (its epoch)
// are what its next notice most likely announces.
//
//   - sure (FAIL): every outstanding WRITE to the port on another QP is the
//     notifying thread's own, posted since its previous notice, and none of
//     its epoch completed or was lost from view: nothing completed that the
//     notice could announce instead.
//   - not a hazard: none outstanding is the thread's own, and its epoch has
//     WRITEs, all completed or on the notice's own QP (ordered before it):
//     its data is done, the in-flight WRITEs are other requests'.
//   - ambiguous (WARN, with why): anything else — other requests' WRITEs
//     beside the thread's own, part of its epoch already complete (the
//     notice may announce that part), or a thread that wrote nothing to the
//     port (a control thread notifying for workers).
//
// The facts ride on the transfers they concern (Transfer.Order), so every
// consumer of transfers judges them in its own window.

// OrderFacts are a work request's ordering facts; nil on almost every one.
type OrderFacts struct {
	// PeerUnknown: a notification posted while another QP of the process
	// had WRITEs outstanding, and the remote port of one of the two QPs is
	// unknown (no ibv_modify_qp with an address vector seen): not judged.
	PeerUnknown bool `json:"peer_unknown,omitempty"`
	// NotifyAhead: a notification posted ahead of WRITEs to the same peer
	// still outstanding on other QPs, surely or ambiguously (its Ambiguity).
	NotifyAhead *NotifyAhead `json:"notify_ahead,omitempty"`
	// Dereg: the request's memory region was deregistered while it was
	// outstanding. Every request of one deregistration shares it.
	Dereg *MRDereg `json:"mr_deregistered,omitempty"`
}

// NotifyAhead is what was outstanding when a notification was posted.
type NotifyAhead struct {
	Peer     string   `json:"peer"`                // the remote port both QPs connect to ("gid fe80::…", "lid 7")
	RemoteQP uint32   `json:"remote_qp,omitempty"` // the notice's QP's remote QP (dest_qp_num; 0 not seen)
	DataQPs  []uint32 `json:"data_qps"`            // the QPs whose WRITEs were outstanding
	// DataRemoteQPs: their remote QPs, in DataQPs' order (0 not seen).
	DataRemoteQPs []uint32 `json:"data_remote_qps,omitempty"`
	Writes        int      `json:"writes"`    // WRITEs outstanding on them
	Bytes         uint64   `json:"bytes"`     // their bytes
	OldestNs      uint64   `json:"oldest_ns"` // when the oldest of them was posted
	// Own: the outstanding WRITEs the notifying thread posted since its
	// previous notice to the port; OtherTIDs: the threads that posted the
	// rest (at most maxOtherTIDs).
	Own       int      `json:"own"`
	OtherTIDs []uint32 `json:"other_tids,omitempty"`
	// Ambiguity: "" when the notice can only be about these WRITEs (a
	// FAIL), else why the agent cannot tell (a WARN).
	Ambiguity string `json:"ambiguity,omitempty"`
}

// maxOtherTIDs bounds the threads a NotifyAhead names.
const maxOtherTIDs = 8

// MRDereg is one ibv_dereg_mr of a region requests still used.
type MRDereg struct {
	Addr        uint64   `json:"addr"`
	Length      uint64   `json:"length"`
	LKey        uint32   `json:"lkey"`
	AtNs        uint64   `json:"at_ns"`       // when ibv_dereg_mr was entered
	Outstanding int      `json:"outstanding"` // requests using it, posted and not completed
	QPs         []uint32 `json:"qps"`
	Opcodes     []string `json:"opcodes"`
	OldestNs    uint64   `json:"oldest_ns"` // when the oldest of them was posted
}

// ibv_qp_attr_mask bits (verbs.h).
const (
	ibvQPAV      = 1 << 7
	ibvQPDestQPN = 1 << 20
)

// maxPeers bounds the QPs whose remote port is kept, over every process.
const maxPeers = 1 << 16

// isNotify: the opcodes that tell the peer something arrived (a receive
// completion at its end): SEND, SEND_WITH_IMM, RDMA_WRITE_WITH_IMM.
func isNotify(op uint32) bool { return op == 1 || op == 2 || op == 3 }

// opRDMAWrite is IBV_WR_RDMA_WRITE: data with no notice of its own.
const opRDMAWrite = 0

// qpPeer is where a QP connects: the remote port (QPPeer; "" unknown) and
// the remote QP on it (dest_qp_num; 0 not seen).
type qpPeer struct {
	port string
	qpn  uint32
}

// notifyEpoch counts one thread's plain WRITEs to one remote port since its
// last notice there: posted, completed (a polled completion covers them),
// lost from view (emitted without one: a queue cap).
type notifyEpoch struct {
	posted, done, lost int
}

type epochKey struct {
	pid, tid uint32
	port     string
}

// QPPeer names the remote port an ibv_modify_qp connects a QP to: its GID
// when the address vector is global (RoCE always is), else its LID; ""
// when the call names neither.
func QPPeer(r *event.RDMA) string {
	if r.AttrMask&ibvQPAV == 0 {
		return ""
	}
	if r.IsGlobal && r.DGID != [16]byte{} {
		return "gid " + net.IP(r.DGID[:]).String()
	}
	if r.DLID != 0 {
		return fmt.Sprintf("lid %d", r.DLID)
	}
	return ""
}

// connect keeps where a QP connects (OpQPModify that succeeded).
func (r *rdmaTracker) connect(c *event.Call) {
	if c.Ret != 0 || c.RDMA.AttrMask&ibvQPAV == 0 {
		return // a state change alone says nothing of the peer
	}
	k := pidPtr{c.PID, uint64(c.RDMA.QPNum)}
	peer := qpPeer{port: QPPeer(&c.RDMA)}
	if c.RDMA.AttrMask&ibvQPDestQPN != 0 {
		peer.qpn = c.RDMA.DestQPNum
	}
	if _, ok := r.peers[k]; !ok && len(r.peers) >= maxPeers {
		r.stats.PeerCapHits++
		return
	}
	r.peers[k] = peer // port "" unknown: a reconnect to no address forgets the old one
}

// epoch counts a plain WRITE the thread tid posts on qp in its epoch for
// the QP's port, and returns it; nil when the port is unknown or the cap
// is reached.
func (r *rdmaTracker) epoch(pid, tid, qp uint32) *notifyEpoch {
	port := r.peers[pidPtr{pid, uint64(qp)}].port
	if port == "" {
		return nil
	}
	k := epochKey{pid, tid, port}
	ep := r.epochs[k]
	if ep == nil {
		if len(r.epochs) >= maxPeers {
			r.stats.PeerCapHits++
			return nil
		}
		ep = &notifyEpoch{}
		r.epochs[k] = ep
	}
	ep.posted++
	return ep
}

// writeQueued and writeGone count a process's plain RDMA WRITEs waiting
// on each QP, so that a notice looks only at the QPs that have some.
func (r *rdmaTracker) writeQueued(pid, qp uint32) {
	w := r.writing[pid]
	if w == nil {
		w = map[uint32]int{}
		r.writing[pid] = w
	}
	w[qp]++
}

// done: a polled completion covered it; else it left the queue without
// one (lost from view).
func (r *rdmaTracker) writeGone(k queueKey, w *postedWR, done bool) {
	if k.recv || w.opcode != opRDMAWrite {
		return
	}
	if w.ep != nil {
		if done {
			w.ep.done++
		} else {
			w.ep.lost++
		}
	}
	if n := r.writing[k.pid][k.qp]; n > 1 {
		r.writing[k.pid][k.qp] = n - 1
	} else if n == 1 {
		delete(r.writing[k.pid], k.qp)
	}
}

// checkNotify judges a notification the thread tid is about to queue on
// qp against the WRITEs outstanding on the process's other QPs, and closes
// the thread's epoch for the QP's port.
func (r *rdmaTracker) checkNotify(pid, tid, qp uint32, t *Transfer) {
	me := r.peers[pidPtr{pid, uint64(qp)}]
	ek := epochKey{pid, tid, me.port}
	cur := r.epochs[ek]
	if me.port != "" {
		delete(r.epochs, ek)
	}
	ahead := NotifyAhead{Peer: me.port, RemoteQP: me.qpn}
	unknown := false
	for other := range r.writing[pid] {
		if other == qp {
			continue // one QP executes in order: the notice follows its data
		}
		q := r.queues[queueKey{pid, other, false}]
		otherPeer := r.peers[pidPtr{pid, uint64(other)}]
		if me.port == "" || otherPeer.port == "" {
			unknown = true
			continue
		}
		if otherPeer.port != me.port {
			continue
		}
		ahead.DataQPs = append(ahead.DataQPs, other)
		for _, w := range q {
			if w.opcode != opRDMAWrite {
				continue
			}
			ahead.Writes++
			ahead.Bytes += w.t.Bytes
			if ahead.OldestNs == 0 || w.t.SubmitNs < ahead.OldestNs {
				ahead.OldestNs = w.t.SubmitNs
			}
			if cur != nil && w.ep == cur {
				ahead.Own++
			} else if !slices.Contains(ahead.OtherTIDs, w.t.TID) && len(ahead.OtherTIDs) < maxOtherTIDs {
				ahead.OtherTIDs = append(ahead.OtherTIDs, w.t.TID)
			}
		}
	}
	switch {
	case ahead.Writes > 0 && ahead.Own == 0 && cur != nil && cur.posted > 0 && cur.lost == 0:
		// Its own WRITEs completed (or ride its QP): the in-flight ones are
		// other requests'.
		r.stats.NotifiesOwnDone++
	case ahead.Writes > 0:
		slices.Sort(ahead.DataQPs)
		for _, d := range ahead.DataQPs {
			ahead.DataRemoteQPs = append(ahead.DataRemoteQPs, r.peers[pidPtr{pid, uint64(d)}].qpn)
		}
		slices.Sort(ahead.OtherTIDs)
		ahead.Ambiguity = ambiguity(tid, &ahead, cur)
		r.stats.NotifiesAhead++
		if ahead.Ambiguity != "" {
			r.stats.NotifiesAmbiguous++
		}
		a := ahead // on the heap only when it fired
		orderOf(t).NotifyAhead = &a
	case unknown:
		r.stats.NotifyPeerUnknown++
		orderOf(t).PeerUnknown = true
	}
}

// ambiguity says why a notice posted ahead of outstanding WRITEs may be
// about other data ("" when it can only be about them: see the top of this
// file); cur is the notifying thread's epoch, nil when it has none.
func ambiguity(tid uint32, a *NotifyAhead, cur *notifyEpoch) string {
	var ep notifyEpoch
	if cur != nil {
		ep = *cur
	}
	others := a.Writes - a.Own
	switch {
	case a.Own > 0 && others == 0 && ep.done == 0 && ep.lost == 0:
		return ""
	case a.Own == 0 && ep.posted == 0:
		return fmt.Sprintf("thread %d posted no WRITE to that port since its previous notice (a control thread?); "+
			"the outstanding ones were posted by thread %s: whether the notice announces them cannot be told", tid, qpList(a.OtherTIDs))
	case ep.lost > 0:
		return fmt.Sprintf("%d of the WRITEs thread %d posted to that port since its previous notice left the agent's view "+
			"without a completion (queue cap): whether the notice announces the outstanding ones cannot be told", ep.lost, tid)
	case others > 0:
		return fmt.Sprintf("%d of them were posted by thread %d since its previous notice, %d by thread %s or before that notice: "+
			"concurrent requests' data cannot be told apart", a.Own, tid, others, qpList(a.OtherTIDs))
	}
	return fmt.Sprintf("%d of the %d WRITEs thread %d posted to that port since its previous notice had completed: "+
		"the notice may announce those", ep.done, ep.posted, tid)
}

func orderOf(t *Transfer) *OrderFacts {
	if t.Order == nil {
		t.Order = &OrderFacts{}
	}
	return t.Order
}

// checkDereg marks the process's outstanding requests that use mr, about
// to be deregistered at c.Time: by lkey, or by an address inside it.
func (r *rdmaTracker) checkDereg(c *event.Call, mr *memRegion) {
	d := &MRDereg{Addr: mr.addr, Length: mr.length, LKey: mr.lkey, AtNs: c.Time}
	for k, q := range r.queues {
		if k.pid != mr.pid {
			continue
		}
		for i := range q {
			w := &q[i]
			if w.nsge == 0 || (w.lkey != mr.lkey && (w.local < mr.addr || w.local-mr.addr >= mr.length)) {
				continue
			}
			if w.t.Order != nil && w.t.Order.Dereg != nil {
				continue // under an earlier deregistration already: reported with it
			}
			d.Outstanding++
			if !slices.Contains(d.QPs, k.qp) {
				d.QPs = append(d.QPs, k.qp)
			}
			name := WROpcodeName(w.opcode)
			if k.recv {
				name = "RECV"
			}
			if !slices.Contains(d.Opcodes, name) {
				d.Opcodes = append(d.Opcodes, name)
			}
			if d.OldestNs == 0 || w.t.SubmitNs < d.OldestNs {
				d.OldestNs = w.t.SubmitNs
			}
			orderOf(&w.t).Dereg = d
		}
	}
	if d.Outstanding > 0 {
		slices.Sort(d.QPs)
		slices.Sort(d.Opcodes)
		r.stats.DeregsInFlight++
	}
}

// forgetPeers drops a process's QPs (it exited).
func (r *rdmaTracker) forgetPeers(pid uint32) {
	for k := range r.peers {
		if k.pid == pid {
			delete(r.peers, k)
		}
	}
	delete(r.writing, pid)
	for k := range r.epochs {
		if k.pid == pid {
			delete(r.epochs, k)
		}
	}
}

// NotifyHazard is one notification a window saw posted ahead of its data.
type NotifyHazard struct {
	QP       uint32 // the notification's QP
	WRID     uint64
	Opcode   string
	PostedNs uint64
	Ahead    NotifyAhead
}

var _ = register(Rule{Name: "cross-qp-notify", Severities: []Severity{SevFail, SevWarn}, Checklist: ChecklistNotifyOrder, Where: InWindow | InDiagnose,
	Remediation: "announce data on the QP that carried it (RDMA_WRITE_WITH_IMM for the last WRITE, or a SEND after the WRITEs on the same QP), " +
		"or post the notification only after polling the WRITEs' successful completions"})

// CrossQPNotify reports a process's notifications posted on one QP while
// WRITEs to the same peer were outstanding on another (seed 002 §5.3): the
// receiver may consume stale or partial data. sev is SevFail for the
// notices that can only be about those WRITEs, SevWarn for the ambiguous
// ones (each hazard says why); n counts them all, hazards are the ones
// kept for evidence.
func CrossQPNotify(pid uint32, sev Severity, n, notifies int, hazards []NotifyHazard) *Finding {
	if len(hazards) == 0 {
		return nil
	}
	var ev []string
	for i, h := range hazards {
		if i == 4 {
			ev = append(ev, fmt.Sprintf("and %d more", len(hazards)-i))
			break
		}
		e := fmt.Sprintf("%s wr %d on QP %d%s to %s posted while %d RDMA_WRITEs (%s) on QP %s%s to the same port were "+
			"outstanding, the oldest posted %s before", h.Opcode, h.WRID, h.QP, remoteQP(h.Ahead.RemoteQP), h.Ahead.Peer,
			h.Ahead.Writes, bytesText(h.Ahead.Bytes), qpList(h.Ahead.DataQPs), remoteQPs(h.Ahead.DataRemoteQPs),
			nsText(h.PostedNs-min(h.PostedNs, h.Ahead.OldestNs)))
		if h.Ahead.Ambiguity != "" {
			e += ": " + h.Ahead.Ambiguity
		} else {
			e += ": all of them posted by the notifying thread since its previous notice, none completed"
		}
		ev = append(ev, e)
	}
	if sev == SevFail {
		return newFinding("cross-qp-notify", SevFail, fmt.Sprintf("pid %d", pid),
			fmt.Sprintf("%d of %d notifications were posted on another QP than the RDMA WRITEs they follow, before those completed: "+
				"QPs are not ordered with each other, so the receiver may read stale or partial data", n, notifies),
			ev, "")
	}
	return newFinding("cross-qp-notify", SevWarn, fmt.Sprintf("pid %d", pid),
		fmt.Sprintf("%d of %d notifications were posted on another QP while RDMA WRITEs to the same port were outstanding, "+
			"beside data of concurrent requests or after part of their own completed: whether they announce the outstanding "+
			"WRITEs cannot be told from the verbs calls (the evidence says why per notice)", n, notifies),
		ev, "")
}

// remoteQP and remoteQPs name the remote end of QPs (dest_qp_num) when seen.
func remoteQP(q uint32) string {
	if q == 0 {
		return ""
	}
	return fmt.Sprintf(" (→ QP %d)", q)
}

func remoteQPs(qs []uint32) string {
	if !slices.ContainsFunc(qs, func(q uint32) bool { return q != 0 }) {
		return ""
	}
	return " (→ QP " + qpList(qs) + ")"
}

var _ = register(Rule{Name: "mr-dereg-in-flight", Severities: []Severity{SevFail}, Checklist: ChecklistDeregOrder, Where: InWindow | InDiagnose,
	Remediation: "deregister (and free or reuse) a region only after every request using it completed: poll their completions " +
		"(a signaled request covers the unsignaled ones before it on its QP), or reference-count the buffer"})

// MRDeregInFlight reports regions deregistered while requests using them
// were outstanding (seed 002 §4.1): they complete in error (mlx5:
// IBV_WC_LOC_PROT_ERR) or, worse, the buffer is reused under them.
func MRDeregInFlight(pid uint32, deregs []*MRDereg) *Finding {
	if len(deregs) == 0 {
		return nil
	}
	var ev []string
	for i, d := range deregs {
		if i == 4 {
			ev = append(ev, fmt.Sprintf("and %d more", len(deregs)-i))
			break
		}
		ev = append(ev, fmt.Sprintf("region %#x+%s (lkey %#x) deregistered with %d requests outstanding (%s on QP %s), "+
			"the oldest posted %s before", d.Addr, bytesText(d.Length), d.LKey, d.Outstanding, strings.Join(d.Opcodes, ", "),
			qpList(d.QPs), nsText(d.AtNs-min(d.AtNs, d.OldestNs))))
	}
	return newFinding("mr-dereg-in-flight", SevFail, fmt.Sprintf("pid %d", pid),
		fmt.Sprintf("%d memory regions were deregistered while work requests using them were still outstanding", len(deregs)),
		ev, "")
}

func qpList(qps []uint32) string {
	s := make([]string, len(qps))
	for i, q := range qps {
		s[i] = fmt.Sprint(q)
	}
	return strings.Join(s, ", ")
}

func nsText(ns uint64) string {
	switch {
	case ns >= 1e9:
		return fmt.Sprintf("%.2f s", float64(ns)/1e9)
	case ns >= 1e6:
		return fmt.Sprintf("%.2f ms", float64(ns)/1e6)
	}
	return fmt.Sprintf("%.1f µs", float64(ns)/1e3)
}
