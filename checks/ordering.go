package checks

import (
	"fmt"
	"maps"
	"slices"

	"github.com/lanewatch/lanewatch/correlate"
)

// CheckOrdering names the RDMA ordering check (completed is not
// consumable: cross-qp-notify, mr-dereg-in-flight).
const CheckOrdering = "RDMA ordering"

// maxOrderKept bounds the hazards a window keeps per process; the rest
// are counted.
const maxOrderKept = 64

// orderTally is one process's ordering facts over a window.
type orderTally struct {
	notifies, unknown int
	ahead             []correlate.NotifyHazard
	aheadMore         int
	deregs            []*correlate.MRDereg // one per deregistration (shared by its requests)
}

// order notes a work request's ordering facts (correlate.OrderFacts) and
// counts the notifications judged; under w.mu.
func (w *Window) order(t *correlate.Transfer) {
	notify := t.Op == "post_send" && (t.Direction == correlate.DirWriteImm || t.Direction == correlate.DirSend)
	if !notify && t.Order == nil {
		return
	}
	if w.orders == nil {
		w.orders = map[uint32]*orderTally{}
	}
	o := w.orders[t.PID]
	if o == nil {
		o = &orderTally{}
		w.orders[t.PID] = o
	}
	if notify {
		o.notifies++
	}
	if t.Order == nil {
		return
	}
	if t.Order.PeerUnknown {
		o.unknown++
	}
	if a := t.Order.NotifyAhead; a != nil {
		if len(o.ahead) < maxOrderKept {
			o.ahead = append(o.ahead, correlate.NotifyHazard{QP: t.QPNum, WRID: t.WRID, Opcode: opcodeOf(t), PostedNs: t.SubmitNs, Ahead: *a})
		} else {
			o.aheadMore++
		}
	}
	if d := t.Order.Dereg; d != nil && !slices.Contains(o.deregs, d) && len(o.deregs) < maxOrderKept {
		o.deregs = append(o.deregs, d)
	}
}

// opcodeOf names a notification's opcode from its direction.
func opcodeOf(t *correlate.Transfer) string {
	if t.Direction == correlate.DirWriteImm {
		return "RDMA_WRITE_WITH_IMM"
	}
	return "SEND"
}

// OrderingPIDs lists the processes whose notifications or ordering facts
// the window saw.
func (w *Window) OrderingPIDs() []uint32 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Sorted(maps.Keys(w.orders))
}

// OrderingCheck judges one process's RDMA ordering over the window:
// notifications posted on another QP than outstanding WRITEs to the same
// peer (cross-qp-notify), regions deregistered under outstanding requests
// (mr-dereg-in-flight).
func (w *Window) OrderingCheck(scope string, pid uint32) Check {
	w.mu.Lock()
	defer w.mu.Unlock()
	o := w.orders[pid]
	if o == nil {
		return Skipped(scope, CheckOrdering, "no RDMA notification or deregistration under outstanding requests in the window")
	}
	c := Check{Scope: scope, Name: CheckOrdering, Status: Pass,
		Detail: fmt.Sprintf("%d notifications (SEND, WRITE_WITH_IMM), none posted ahead of WRITEs to the same peer on another QP", o.notifies)}
	if len(o.ahead) > 0 {
		c.Detail = fmt.Sprintf("%d of %d notifications posted ahead of WRITEs to the same peer on another QP", len(o.ahead)+o.aheadMore, o.notifies)
		c.Findings = append(c.Findings, *correlate.CrossQPNotify(pid, len(o.ahead)+o.aheadMore, o.notifies, o.ahead))
	}
	if o.unknown > 0 {
		c.Detail += fmt.Sprintf("; %d not judged: the peer of a QP is unknown (no ibv_modify_qp with an address vector seen)", o.unknown)
	}
	if len(o.deregs) > 0 {
		c.Detail += fmt.Sprintf("; %d regions deregistered with requests outstanding", len(o.deregs))
		c.Findings = append(c.Findings, *correlate.MRDeregInFlight(pid, o.deregs))
	}
	if len(c.Findings) > 0 {
		c.Status = Fail
	}
	return c
}
