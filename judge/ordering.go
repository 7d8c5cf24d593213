package judge

import (
	"fmt"
	"maps"
	"slices"

	"github.com/lanewatch/lanewatch/checks"
	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
)

// RDMA ordering: completed is not consumable (cross-qp-notify,
// mr-dereg-in-flight), per process whose notifications or ordering facts
// the window saw. The rule gathers its own facts: each work request's
// ordering facts (correlate.OrderFacts), which correlate put on it.

var _ = register(orderingRule{})

// CheckOrdering names the RDMA ordering check (completed is not
// consumable: cross-qp-notify, mr-dereg-in-flight).
const CheckOrdering = "RDMA ordering"

type orderingRule struct{}

func (orderingRule) Check() string    { return CheckOrdering }
func (orderingRule) Raises() []string { return []string{"cross-qp-notify", "mr-dereg-in-flight"} }
func (orderingRule) Unsampled() string {
	return "needs a live window (--sample): notifications are judged against the requests outstanding when they were posted"
}

func (r orderingRule) Judge(w *Window, env *Env) (j Judgement) {
	facts := factsOf[orderingFacts](w, r)
	for _, pid := range slices.Sorted(maps.Keys(facts)) {
		j.Checks = append(j.Checks, orderingCheck(facts[pid], env.scope(pid), pid))
	}
	return j
}

// maxOrderKept bounds the hazards a window keeps per process; the rest
// are counted.
const maxOrderKept = 64

// orderTally is one process's ordering facts over a window.
type orderTally struct {
	notifies, unknown int
	// sure: notices that can only be about the WRITEs they overtook;
	// ambiguous: the rest (correlate.NotifyAhead.Ambiguity). The *More
	// counts are those not kept.
	sure, ambiguous         []correlate.NotifyHazard
	sureMore, ambiguousMore int
	deregs                  []*correlate.MRDereg // one per deregistration (shared by its requests)
}

// orderingFacts are the window's ordering facts per process.
type orderingFacts map[uint32]*orderTally

func (orderingRule) NewFacts() Facts { return orderingFacts{} }

// Transfer notes a work request's ordering facts (correlate.OrderFacts)
// and counts the notifications judged.
func (facts orderingFacts) Transfer(t *correlate.Transfer) {
	notify := t.Op == event.OpPostSend && (t.Direction == correlate.DirWriteImm || t.Direction == correlate.DirSend)
	if !notify && t.Order == nil {
		return
	}
	o := facts[t.PID]
	if o == nil {
		o = &orderTally{}
		facts[t.PID] = o
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
		kept, more := &o.sure, &o.sureMore
		if a.Ambiguity != "" {
			kept, more = &o.ambiguous, &o.ambiguousMore
		}
		if len(*kept) < maxOrderKept {
			*kept = append(*kept, correlate.NotifyHazard{QP: t.QPNum, WRID: t.WRID, Opcode: opcodeOf(t), PostedNs: t.SubmitNs, Ahead: *a})
		} else {
			*more++
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

func (orderingFacts) Activity(*correlate.Activity) {}

// OrderingPIDs lists the processes whose notifications or ordering facts
// the window saw.
func (w *Window) OrderingPIDs() []uint32 {
	return slices.Sorted(maps.Keys(factsOf[orderingFacts](w, orderingRule{})))
}

// orderingCheck judges one process's RDMA ordering over the window:
// notifications posted on another QP than outstanding WRITEs to the same
// peer (cross-qp-notify: FAIL when they can only be about those WRITEs,
// WARN when concurrent requests' data cannot be told apart), regions
// deregistered under outstanding requests (mr-dereg-in-flight, FAIL).
func orderingCheck(o *orderTally, scope string, pid uint32) checks.Check {
	if o == nil {
		return checks.Skipped(scope, CheckOrdering, "no RDMA notification or deregistration under outstanding requests in the window")
	}
	c := checks.Check{Scope: scope, Name: CheckOrdering, Status: checks.Pass,
		Detail: fmt.Sprintf("%d notifications (SEND, WRITE_WITH_IMM), none posted ahead of WRITEs to the same peer on another QP", o.notifies)}
	sure, ambiguous := len(o.sure)+o.sureMore, len(o.ambiguous)+o.ambiguousMore
	if sure+ambiguous > 0 {
		c.Detail = fmt.Sprintf("%d of %d notifications posted ahead of WRITEs to the same peer on another QP (%d surely about them, "+
			"%d beside concurrent requests' data)", sure+ambiguous, o.notifies, sure, ambiguous)
	}
	if sure > 0 {
		c.Findings = append(c.Findings, *correlate.CrossQPNotify(pid, correlate.SevFail, sure, o.notifies, o.sure))
	}
	if ambiguous > 0 {
		c.Findings = append(c.Findings, *correlate.CrossQPNotify(pid, correlate.SevWarn, ambiguous, o.notifies, o.ambiguous))
	}
	if o.unknown > 0 {
		c.Detail += fmt.Sprintf("; %d not judged: the peer of a QP is unknown (no ibv_modify_qp with an address vector seen)", o.unknown)
	}
	if len(o.deregs) > 0 {
		c.Detail += fmt.Sprintf("; %d regions deregistered with requests outstanding", len(o.deregs))
		c.Findings = append(c.Findings, *correlate.MRDeregInFlight(pid, o.deregs))
	}
	for _, f := range c.Findings {
		if f.Severity == correlate.SevFail {
			c.Status = checks.Fail
		} else if c.Status == checks.Pass {
			c.Status = checks.Warn
		}
	}
	return c
}
