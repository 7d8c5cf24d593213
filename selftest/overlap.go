package selftest

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/lanewatch/lanewatch/checks"
	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/selftest/refenv"
)

// PairScenarios run two kvpath processes on one shared reference GPU,
// released together (two rows each, like the RDMA roles).
var PairScenarios = []string{"two-proc-lane"}

// scenarioProc is one process of a scenario, the reference GPU whose lanes
// it used, and its truth. gpu is the GPU's PCI address (refenv.BusID) on
// shared lanes — the agent names each copy's GPU by it — and privateGPU's
// name on private lanes, which have no PCI identity: the agent's copies then
// name no GPU and are placed by their process.
type scenarioProc struct {
	pid   uint32
	gpu   string
	truth []TruthCall
}

// privateGPU names the reference GPU of a process with private lanes.
func privateGPU(pid uint32) string { return fmt.Sprintf("private GPU of pid %d", pid) }

// checkOverlap compares the agent's same-direction-overlap facts with the
// truth's; the verdict is judged with the row's others, once
// (checkDesigned). The agent's window must place every process on its link,
// and the truth's flows (which process, stream or queue pair, direction and
// GPU each transfer belongs to, as the scenario knows them) at the agent's
// own stamps must find each stamp inside the truth's brackets of it (else
// the row fails: the agent's times are wrong). The row's OVERLAP says
// whether the agent's links flagged overlap; the truth's other views only
// mark it "~" where they differ:
//
//   - the evidence view: each transfer in flight from its call's entry to
//     the return of the call that proved it done (the stream
//     synchronisation, the poll that returned its completion);
//   - the lanes view: from the call's return to the moment the copy engine
//     finished it (the poll's start for RDMA).
func checkOverlap(res *Result, scenario string, procs []scenarioProc, transfers []correlate.Transfer) {
	lane := refenv.LaneGBs()
	gpuOf := map[uint32]string{}
	for _, p := range procs {
		gpuOf[p.pid] = p.gpu
	}
	place := func(pid uint32) checks.Placement {
		if g, ok := gpuOf[pid]; ok {
			return checks.Placement{GPU: g, InboundGBs: lane, OutboundGBs: lane}
		}
		return checks.Placement{Why: fmt.Sprintf("pid %d is not a process of %s", pid, scenario)}
	}
	w := checks.NewWindow()
	for i := range transfers {
		w.Transfer(&transfers[i])
	}
	links, unknown := w.LinkOverlaps(place, nil, 0)
	agent := firedLinks(links)
	note := func(format string, args ...any) {
		res.Problems = append(res.Problems[:len(res.Problems):len(res.Problems)], fmt.Sprintf(format, args...))
	}
	for _, pid := range slices.Sorted(maps.Keys(unknown)) {
		res.OtherErrs++
		note("overlap: %s", unknown[pid])
	}
	stamps := agentStamps(transfers)
	matched, bad := truthOverlaps(procs, lane, atStamps, stamps)
	for _, b := range bad {
		res.OtherErrs++
		note("overlap: %s", b)
	}
	evidence, _ := truthOverlaps(procs, lane, atEvidence, stamped{})
	lanes, _ := truthOverlaps(procs, lane, atLanes, stamped{})
	byStamps, byEvidence, byLanes := firedLinks(matched), firedLinks(evidence), firedLinks(lanes)

	res.Overlap = "none"
	if agent != "" {
		res.Overlap = "flagged"
	}
	switch {
	case agent != byStamps:
		res.Overlap += "~"
		note("finding: the agent's links [%s] and the truth's flows at its stamps [%s] differ: agent %s; the truth's brackets [%s], its lanes [%s] %s",
			agent, byStamps, overlapText(links), byEvidence, byLanes, overlapText(lanes))
	case byStamps != byEvidence:
		res.Overlap += "~"
		note("finding: the agent's stamps [%s] and the truth's brackets around them [%s] lie on either side of a threshold: stamps %s; brackets %s",
			byStamps, byEvidence, overlapText(matched), overlapText(evidence))
	case byEvidence != byLanes:
		res.Overlap += "~"
		note("finding: completions proven late on this run: the lanes [%s] %s; the evidence [%s] %s",
			byLanes, overlapText(lanes), byEvidence, overlapText(evidence))
	case agent != "":
		note("finding: overlap as the truth measured it: %s", overlapText(evidence))
	}
}

// firedLinks names the links whose overlap fired, "gpu direction", sorted
// and joined.
func firedLinks(links []checks.LinkOverlap) string {
	var out []string
	for _, l := range links {
		if l.Finding != nil {
			out = append(out, l.GPU+" "+l.Direction)
		}
	}
	slices.Sort(out)
	return strings.Join(out, ", ")
}

func overlapText(links []checks.LinkOverlap) string {
	var out []string
	for _, l := range links {
		if l.Overlap.TimedFlows > 1 || l.Finding != nil {
			out = append(out, l.GPU+" "+l.Overlap.Text())
		}
	}
	if len(out) == 0 {
		return "no link with two flows"
	}
	return strings.Join(out, "; ")
}

// view says which time each transfer of a truth flow gets.
type view int

const (
	atEvidence view = iota // the call's entry to the return of the call that proved it done
	atLanes                // the call's return to the engine's end (RDMA: the poll's start)
	atStamps               // the agent's own stamps of the same record
)

// stamped are the agent's records of a scenario, to match with the truth's:
// each process's copies in the order Compare matches them, and the work
// requests by queue pair and wr_id.
type stamped struct {
	copies map[uint32][]correlate.Transfer
	wrs    map[uint32]map[[3]uint64]correlate.Transfer
}

func agentStamps(transfers []correlate.Transfer) stamped {
	st := stamped{copies: map[uint32][]correlate.Transfer{}, wrs: map[uint32]map[[3]uint64]correlate.Transfer{}}
	for _, g := range transfers {
		switch {
		case g.Op == event.OpPostSend || g.Op == event.OpPostRecv:
			if st.wrs[g.PID] == nil {
				st.wrs[g.PID] = map[[3]uint64]correlate.Transfer{}
			}
			st.wrs[g.PID][wrKey(g.Op == event.OpPostRecv, g.QPNum, g.WRID)] = g
		case !g.Failed():
			st.copies[g.PID] = append(st.copies[g.PID], g)
		}
	}
	for _, cs := range st.copies {
		slices.SortStableFunc(cs, func(a, b correlate.Transfer) int {
			return cmp.Or(cmp.Compare(a.SubmitNs, b.SubmitNs), cmp.Compare(a.BatchIndex, b.BatchIndex))
		})
	}
	return st
}

// truthOverlaps judges the rule on flows built from the truth, each
// transfer in flight over the time the view gives it. At the agent's
// stamps, bad lists the records whose stamps lie outside the truth's
// brackets or that the agent lacks.
func truthOverlaps(procs []scenarioProc, lane float64, v view, st stamped) (out []checks.LinkOverlap, bad []string) {
	type key struct{ gpu, dir, flow string }
	flows := map[key]*correlate.Flow{}
	add := func(gpu, dir, name string, start, end, bytes uint64) {
		k := key{gpu, dir, name}
		if flows[k] == nil {
			flows[k] = &correlate.Flow{Name: name}
		}
		flows[k].Add(start, end, bytes)
	}
	peerOf := func(pid uint32) (scenarioProc, bool) {
		for _, p := range procs {
			if p.pid != pid {
				return p, true
			}
		}
		return scenarioProc{}, false
	}
	for _, p := range procs {
		copies, b := truthCopies(p.truth, v, st.copies[p.pid])
		bad = append(bad, b...)
		for _, c := range copies {
			add(p.gpu, c.dir, fmt.Sprintf("pid %d stream %#x %s", p.pid, c.stream, c.kind), c.start, c.end, c.bytes)
		}
		peer, _ := peerOf(p.pid)
		reqs, b := truthRequests(p.truth, v, st.wrs[p.pid])
		bad = append(bad, b...)
		for _, r := range reqs {
			owner, gpu := p.pid, p.gpu
			if r.peerLink {
				owner, gpu = peer.pid, peer.gpu
			}
			if owner == 0 {
				continue
			}
			add(gpu, r.dir, fmt.Sprintf("pid %d QP %d %s", p.pid, r.qp, r.kind), r.start, r.end, r.bytes)
		}
	}
	type lk struct{ gpu, dir string }
	byLink := map[lk][]key{}
	for k := range flows {
		byLink[lk{k.gpu, k.dir}] = append(byLink[lk{k.gpu, k.dir}], k)
	}
	for _, l := range slices.SortedFunc(maps.Keys(byLink), func(a, b lk) int { return cmp.Or(cmp.Compare(a.gpu, b.gpu), cmp.Compare(a.dir, b.dir)) }) {
		keys := byLink[l]
		slices.SortFunc(keys, func(a, b key) int { return cmp.Compare(a.flow, b.flow) })
		t := correlate.LinkTraffic{Segment: "PCIe link of GPU " + l.gpu, Direction: l.dir, CapacityGBs: lane}
		for _, k := range keys {
			t.Flows = append(t.Flows, *flows[k])
		}
		o := correlate.MeasureOverlap(t)
		out = append(out, checks.LinkOverlap{GPU: l.gpu, Direction: l.dir, Overlap: o, Finding: correlate.SameDirectionOverlap(o)})
	}
	if len(bad) > 4 {
		bad = append(bad[:4], fmt.Sprintf("and %d more", len(bad)-4))
	}
	return out, bad
}

// truthSpan is one transfer of the truth on a GPU link, with one end of
// its brackets.
type truthSpan struct {
	dir, kind         string
	stream            uint64
	qp                uint32
	peerLink          bool // the link is the peer's GPU's (the remote side's memory)
	start, end, bytes uint64
	// near: the truth's next call of the copy's thread is the
	// synchronisation of its stream (or an event record on it and that
	// event's synchronisation): its wait follows it closely, by call order
	// (correlate.Transfer.CompleteNear).
	near bool
}

// truthNear says whether truth[i], a copy, is followed by its thread's
// next calls waiting for its stream: a stream_sync of it, or an
// event_record on it and then an event_sync.
func truthNear(truth []TruthCall, i int) bool {
	c := truth[i]
	var next []TruthCall
	for _, y := range truth[i+1:] {
		if y.End || y.TID != c.TID {
			continue
		}
		if next = append(next, y); len(next) == 2 {
			break
		}
	}
	switch {
	case len(next) > 0 && next[0].Op == TruthStreamSync && next[0].Stream == c.Stream:
		return true
	case len(next) == 2 && next[0].Op == TruthEventRecord && next[0].Stream == c.Stream && next[1].Op == TruthEventSync:
		return true
	}
	return false
}

// truthCopies are a process's H2D and D2H copies, in submission order. The
// agent stamps a copy's submission inside the call (TCallNs..TReturnNs) and
// its completion no earlier than the engine finished it and no later than
// the first synchronisation of its stream after it returned; a copy that no
// such synchronisation follows has no bracket (the agent may leave it
// without a completion) and is left out of the time judgement (end 0). At
// the agent's stamps (got: its copies in Compare's order), a stamp outside
// those brackets is bad.
func truthCopies(truth []TruthCall, v view, got []correlate.Transfer) (out []truthSpan, bad []string) {
	n := 0 // the copy's place among the process's copies that did not fail
	for i, c := range truth {
		if !c.IsCopy() || c.Result != 0 {
			continue
		}
		n++
		if c.Direction != "H2D" && c.Direction != "D2H" {
			continue
		}
		s := truthSpan{dir: checks.Inbound, kind: c.Direction, stream: c.Stream, bytes: c.Bytes, start: c.TCallNs, near: truthNear(truth, i)}
		if c.Direction == "D2H" {
			s.dir = checks.Outbound
		}
		var proof uint64
		for _, y := range truth[i+1:] {
			if y.Op == TruthStreamSync && y.Stream == c.Stream && c.Stream > 2 && y.Result == 0 {
				proof = y.TReturnNs
				break
			}
		}
		switch v {
		case atEvidence:
			s.end = proof
		case atLanes:
			if proof != 0 {
				s.start, s.end = c.TReturnNs, max(c.EngineEndNs, c.TReturnNs+1)
			}
		case atStamps:
			if n > len(got) {
				bad = append(bad, fmt.Sprintf("seq %d (%s %d B): no record of the agent", c.Seq, c.API, c.Bytes))
				continue
			}
			g := got[n-1]
			s.start, s.end = g.SubmitNs, g.CompleteNs
			if g.SubmitNs < c.TCallNs || g.SubmitNs > c.TReturnNs || (g.CompleteNs != 0 && g.CompleteNs < c.EngineEndNs) ||
				(proof != 0 && g.CompleteNs > proof) {
				bad = append(bad, fmt.Sprintf("seq %d (%s %d B): stamped %d..%d, the truth brackets [%d,%d]..[%d,%d]", c.Seq, c.API, c.Bytes,
					g.SubmitNs, g.CompleteNs, c.TCallNs, c.TReturnNs, c.EngineEndNs, proof))
			}
		}
		out = append(out, s)
	}
	return out, bad
}

// truthRequests are a process's RDMA work requests that crossed a GPU link,
// in post order, with the brackets of their post and of the poll that
// returned their completion (an unsignaled request completes with the next
// signaled one of its queue, seed 002 §4.3); at the agent's stamps (got, by
// queue pair and wr_id), the agent's, which compareRDMA checks against the
// same brackets. Failed requests are left out, as the agent leaves them.
func truthRequests(truth []TruthCall, v view, got map[[3]uint64]correlate.Transfer) (out []truthSpan, bad []string) {
	done := map[[3]uint64]TruthCall{}
	for _, t := range truth {
		if t.Op == TruthCompletion {
			done[wrKey(t.CQ == "recv", t.QPNum, t.WRID)] = t
		}
	}
	var sends []TruthCall
	for _, t := range truth {
		if t.Op == TruthPostSend {
			sends = append(sends, t)
		}
	}
	for _, t := range truth {
		if t.Op != TruthPostSend && t.Op != TruthPostRecv {
			continue
		}
		recv := t.Op == TruthPostRecv
		c, ok := done[wrKey(recv, t.QPNum, t.WRID)]
		if !recv && !t.Signaled { // the next signaled request of its queue completes it
			ok = false
			for _, n := range sends {
				if n.QPNum == t.QPNum && n.Seq > t.Seq && n.Signaled {
					c, ok = done[wrKey(false, n.QPNum, n.WRID)]
					break
				}
			}
		}
		s := truthSpan{kind: wrDirection(t), qp: t.QPNum, bytes: t.Bytes}
		if recv {
			s.bytes = c.ByteLen
		}
		if ok && c.Status != 0 {
			continue
		}
		switch v {
		case atEvidence:
			s.start = t.TPostNs
			if ok {
				s.end = c.TPollNs
			}
		case atLanes:
			if ok {
				s.start, s.end = t.TPostEnd, max(c.TPollBeg, t.TPostEnd+1)
			}
		case atStamps:
			g, seen := got[wrKey(recv, t.QPNum, t.WRID)]
			if !seen {
				bad = append(bad, fmt.Sprintf("%s QP %d wr %d: no record of the agent", t.Op, t.QPNum, t.WRID))
				continue
			}
			s.start, s.end = g.SubmitNs, g.CompleteNs
		}
		// the links it crosses, as the agent places them (checks.rdmaLanes)
		into := s.kind == correlate.DirRDMARead || recv
		if t.LocalMem == "device" {
			s.dir, s.peerLink = laneDir(into), false
			out = append(out, s)
		}
		if t.RemoteMem == "device" && s.kind != correlate.DirSend {
			s.dir, s.peerLink = laneDir(!into), true
			out = append(out, s)
		}
	}
	return out, bad
}

func laneDir(into bool) string {
	if into {
		return checks.Inbound
	}
	return checks.Outbound
}

// pairRun runs one pair scenario: two kvpath processes with their lanes on
// one shared reference GPU, released together, one row each; the second
// row carries the overlap verdict over both processes' transfers.
func pairRun(ctx context.Context, kvpath, scenario, tmp string, col *Collector, cfg Config, drops lossCount) []Result {
	gpu := fmt.Sprintf("selftest-%d-%s", os.Getpid(), scenario)
	defer os.Remove(refenv.LaneFile(gpu))
	defer os.Remove(refenv.PairFile(gpu))
	before := drops()
	names := []string{"proc-a", "proc-b"}
	var procs []*proc
	var problems []string
	for _, n := range names {
		p, err := startHeld(ctx, cfg, kvpath, scenario, filepath.Join(tmp, scenario+"-"+n+".jsonl"), []string{refenv.SharedGPU(gpu)})
		if err != nil {
			problems = append(problems, err.Error())
			break
		}
		procs = append(procs, p)
	}
	for _, p := range procs {
		if err := p.release(); err != nil {
			problems = append(problems, err.Error())
		}
	}
	var out []Result
	var all []correlate.Transfer
	var sp []scenarioProc
	for i, p := range procs {
		res := Result{Scenario: scenario, Runtime: names[i], PID: p.pid, Problems: slices.Clone(problems)}
		if err := p.wait(col, cfg.Timeout); err != nil {
			res.Problems = append(res.Problems, err.Error())
		}
		truth, err := ReadTruthFile(p.truth)
		if err != nil {
			res.Problems = append(res.Problems, err.Error())
		}
		got := col.Take(p.pid)
		Compare(&res, truth, got)
		all = append(all, got...)
		sp = append(sp, scenarioProc{pid: p.pid, gpu: refenv.BusID(gpu), truth: truth})
		out = append(out, res)
	}
	if len(out) == 0 {
		return []Result{{Scenario: scenario, Runtime: names[0], Problems: problems}}
	}
	var pids []uint32
	for _, p := range procs {
		pids = append(pids, p.pid)
	}
	dropped := drops(pids...) - before
	for i := range out {
		out[i].Drops = dropped
	}
	checkOverlap(&out[len(out)-1], scenario, sp, all)
	noteInflight(&out[len(out)-1], scenario, sp, all)
	var acts []correlate.Activity
	for _, p := range procs {
		acts = append(acts, col.TakeActivities(p.pid)...)
	}
	checkDesigned(&out[len(out)-1], scenario, sp, all, acts)
	return out
}
