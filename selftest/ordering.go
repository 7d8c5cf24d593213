package selftest

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/lanewatch/lanewatch/correlate"
)

// orderingBeside is how many notices a scenario posts, by construction,
// after its own WRITEs completed while another request's WRITEs to the same
// port are outstanding (rdmapath.c, kv-notify-concurrent: 4 threads × 2
// requests, every notice but the last): the shape its silence is about.
var orderingBeside = map[string]int{"kv-notify-concurrent": 7}

// OrderingScenarios are the RDMA scenarios of the ordering rules: each
// firing one beside those that must not (a notice on the data QP, one after
// the polled completions, concurrent requests' notices each after its own
// WRITEs while others' are in flight; a deregistration after the poll).
var OrderingScenarios = []string{"kv-notify-early", "kv-notify-imm", "kv-notify-polled", "kv-notify-concurrent", "mr-dereg-early", "mr-dereg-polled"}

// orderVerdict is one process's ordering facts, the same from the agent's
// records and from the truth: the notifications posted ahead of WRITEs to
// their peer on another QP (wr_id → WRITEs outstanding, and whether the
// notice can only be about them), and each deregistration's outstanding
// requests (lkey → count).
type orderVerdict struct {
	ahead  map[uint64]notifyVerdict
	deregs map[uint32]int
	beside int // notices after their own WRITEs with other requests' outstanding (truth only)
}

type notifyVerdict struct {
	writes int
	sure   bool
}

func (v orderVerdict) rules() string {
	var r []string
	sure, ambiguous := false, false
	for _, n := range v.ahead {
		sure, ambiguous = sure || n.sure, ambiguous || !n.sure
	}
	if sure {
		r = append(r, "cross-qp-notify/fail")
	}
	if ambiguous {
		r = append(r, "cross-qp-notify/warn")
	}
	if len(v.deregs) > 0 {
		r = append(r, "mr-dereg-in-flight/fail")
	}
	return strings.Join(r, ",")
}

func (v orderVerdict) String() string {
	return fmt.Sprintf("notifications ahead %v, deregistrations with requests outstanding %v", v.ahead, v.deregs)
}

// checkOrdering compares a role's ordering facts, from the agent's
// records, with the truth's: exact, on each notification and
// deregistration. The rules the agent's window fires on them are judged
// with the scenario's others, once (checkDesigned, on the row that holds
// both roles' records). For the prefill role (the one that posts) the
// truth's own verdict, computed here apart from correlate, must be the
// designed one: the design is held to the scenario's construction, never
// to the rule under test.
func checkOrdering(res *Result, scenario string, truth []TruthCall, got []correlate.Transfer) {
	note := func(format string, args ...any) {
		res.Problems = append(res.Problems[:len(res.Problems):len(res.Problems)], fmt.Sprintf(format, args...))
	}
	agent := agentOrder(got)
	want, ambiguous := truthOrder(truth)
	for _, a := range ambiguous {
		res.OtherErrs++
		note("ordering: %s", a)
	}
	if !maps.Equal(agent.ahead, want.ahead) || !maps.Equal(agent.deregs, want.deregs) {
		res.OtherErrs++
		note("ordering: agent %s; truth %s", agent, want)
	}
	if res.Runtime != "prefill" {
		return
	}
	if d := strings.Join(designedAmong(scenario, "cross-qp-notify", "mr-dereg-in-flight"), ","); want.rules() != d { // rule/severity
		res.OtherErrs++
		note("ordering: the scenario was designed to fire [%s], its truth fires [%s]", d, want.rules())
	}
	if want.beside != orderingBeside[scenario] {
		res.OtherErrs++
		note("ordering: the scenario was designed to post %d notices after their own WRITEs beside another request's, its truth posts %d",
			orderingBeside[scenario], want.beside)
	}
}

// agentOrder reads the ordering facts the agent put on its records.
func agentOrder(got []correlate.Transfer) orderVerdict {
	v := orderVerdict{ahead: map[uint64]notifyVerdict{}, deregs: map[uint32]int{}}
	for _, g := range got {
		if g.Order == nil {
			continue
		}
		if a := g.Order.NotifyAhead; a != nil {
			v.ahead[g.WRID] = notifyVerdict{a.Writes, a.Ambiguity == ""}
		}
		if d := g.Order.Dereg; d != nil {
			v.deregs[d.LKey] = d.Outstanding
		}
	}
	return v
}

// truthWR is one posted request of the truth and when a poll proved it
// done: the start of the poll that returned its completion or a later
// one's on its queue (which covers it), 0 never.
type truthWR struct {
	TruthCall
	doneNs uint64
}

// truthOrder judges the truth's records: a request is outstanding at a
// call when it was posted before it and the poll that proved it done began
// after the call returned; one whose poll began inside the call's brackets
// is ambiguous (the scenarios order them by program order, so none is).
// A notice posted ahead of WRITEs to its port on other QPs is sure when
// every one of them is its thread's own since that thread's previous
// notice to the port and none of those completed; not a hazard when none
// is its own and its thread wrote to the port since that notice; else
// ambiguous (docs/design.md; computed here from the truth, apart from
// correlate).
func truthOrder(truth []TruthCall) (orderVerdict, []string) {
	v := orderVerdict{ahead: map[uint64]notifyVerdict{}, deregs: map[uint32]int{}}
	var ambiguous []string
	peer := map[uint32]string{}
	done := map[[3]uint64]uint64{}
	for _, t := range truth {
		switch t.Op {
		case TruthConnect:
			peer[t.QPNum] = t.DGID
		case TruthCompletion:
			done[wrKey(t.CQ == "recv", t.QPNum, t.WRID)] = t.TPollBeg
		}
	}
	queues := map[[2]uint64][]*truthWR{} // {recv, qp}
	var order []*truthWR
	for _, t := range truth {
		if t.Op != TruthPostSend && t.Op != TruthPostRecv {
			continue
		}
		recv := t.Op == TruthPostRecv
		w := &truthWR{TruthCall: t, doneNs: done[wrKey(recv, t.QPNum, t.WRID)]}
		k := [2]uint64{wrKey(recv, 0, 0)[0], uint64(t.QPNum)}
		queues[k] = append(queues[k], w)
		order = append(order, w)
	}
	for _, q := range queues { // a completion covers the requests before it on its queue
		covered := uint64(0)
		for i := len(q) - 1; i >= 0; i-- {
			if q[i].doneNs != 0 {
				covered = q[i].doneNs
			}
			q[i].doneNs = covered
		}
	}
	// outstanding at a call bracketed [from, to] (w is posted before it, by
	// its seq: each thread posts and polls its own requests): its covering
	// poll began after the call returned; ok false when that poll began
	// inside the call's brackets.
	outstanding := func(w *truthWR, from, to uint64) (bool, bool) {
		if w.doneNs == 0 || w.doneNs > to {
			return true, true
		}
		return false, w.doneNs < from
	}
	isNotice := func(w *truthWR) bool {
		return w.Op == TruthPostSend && (w.Opcode == "SEND" || w.Opcode == "SEND_WITH_IMM" || w.Opcode == "RDMA_WRITE_WITH_IMM")
	}
	type threadPort struct {
		tid  uint32
		port string
	}
	lastNotice := map[threadPort]int{} // seq of a thread's previous notice to a port
	for _, n := range order {
		if !isNotice(n) {
			continue
		}
		tp := threadPort{n.TID, peer[n.QPNum]}
		since := lastNotice[tp]
		lastNotice[tp] = n.Seq
		own, others, epoch, epochDone := 0, 0, 0, 0
		for _, w := range order {
			if w.Op != TruthPostSend || w.Opcode != "RDMA_WRITE" || peer[w.QPNum] == "" || peer[w.QPNum] != peer[n.QPNum] || w.Seq > n.Seq {
				continue
			}
			mine := w.TID == n.TID && w.Seq > since
			out, ok := outstanding(w, n.TPostNs, n.TPostEnd)
			if !ok {
				ambiguous = append(ambiguous, fmt.Sprintf("WRITE wr %d and the notice wr %d: brackets straddle", w.WRID, n.WRID))
			}
			if mine {
				epoch++
				if !out {
					epochDone++
				}
			}
			if w.QPNum == n.QPNum || !out {
				continue
			}
			if mine {
				own++
			} else {
				others++
			}
		}
		switch {
		case own+others == 0:
		case own == 0 && epoch > 0:
			v.beside++
		default:
			v.ahead[n.WRID] = notifyVerdict{own + others, own > 0 && others == 0 && epochDone == 0}
		}
	}
	charged := map[*truthWR]bool{} // a request is reported with its first deregistration
	for _, d := range truth {
		if d.Op != TruthDeregMR {
			continue
		}
		n := 0
		for _, w := range order {
			if w.Seq > d.Seq || w.NumSGE == 0 || charged[w] || w.LKey != d.LKey && (w.Addr < d.Addr || w.Addr-d.Addr >= d.Length) {
				continue
			}
			out, ok := outstanding(w, d.TCallNs, d.TReturnNs)
			if !ok {
				ambiguous = append(ambiguous, fmt.Sprintf("wr %d and the deregistration of lkey %#x: brackets straddle", w.WRID, d.LKey))
			}
			if out {
				n++
				charged[w] = true
			}
		}
		if n > 0 {
			v.deregs[d.LKey] = n
		}
	}
	slices.Sort(ambiguous)
	return v, slices.Compact(ambiguous)
}
