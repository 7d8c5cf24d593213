package selftest

import (
	"fmt"
	"slices"
	"strings"

	"github.com/lanewatch/lanewatch/checks"
	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/selftest/refenv"
)

// noteInflight notes, beside the row's too-little-in-flight verdict
// (judged with its others, once: checkDesigned), what the rule measured of
// the agent's flows and of the truth's transfers at the agent's stamps and
// at their brackets (each operation in flight from its call's entry to the
// return of the call that proved it done). Notes only: the truth has no
// in-flight figure of its own to hold the agent's to (its brackets widen
// with the machine's load; at the agent's stamps it is the agent's own),
// and the records themselves are compared by Compare and compareRDMA.
func noteInflight(res *Result, scenario string, procs []scenarioProc, transfers []correlate.Transfer) {
	lane := refenv.LaneGBs()
	place := func(pid uint32) checks.Placement {
		for _, p := range procs {
			if p.pid == pid {
				return checks.Placement{GPU: p.gpu, InboundGBs: lane, OutboundGBs: lane}
			}
		}
		return checks.Placement{Why: fmt.Sprintf("pid %d is not a process of %s", pid, scenario)}
	}
	measure := func(ts []correlate.Transfer) (string, checks.InFlightReport) {
		w := checks.NewWindow()
		for i := range ts {
			w.Transfer(&ts[i])
		}
		rep := w.InFlights(place, nil, 0)
		var fired []string
		for _, f := range rep.Flows {
			if f.Finding != nil {
				fired = append(fired, f.Finding.Subject)
			}
		}
		slices.Sort(fired)
		return strings.Join(fired, ", "), rep
	}
	note := func(format string, args ...any) {
		res.Problems = append(res.Problems[:len(res.Problems):len(res.Problems)], fmt.Sprintf(format, args...))
	}
	agent, rep := measure(transfers)
	atStampsTs, _ := truthTransfers(procs, atStamps, agentStamps(transfers))
	byStamps, _ := measure(atStampsTs)
	evTs, _ := truthTransfers(procs, atEvidence, stamped{})
	byEvidence, evRep := measure(evTs)
	switch {
	case agent != byStamps || agent != byEvidence:
		note("finding: in-flight: the agent's flows [%s] %s; the truth's transfers at the agent's stamps [%s], at its brackets [%s] %s",
			agent, inflightText(rep), byStamps, byEvidence, inflightText(evRep))
	case agent != "":
		note("finding: in-flight as the truth's brackets measured it: [%s] %s", byEvidence, inflightText(evRep))
	}
}

// inflightText says what a report measured of each judged flow.
func inflightText(r checks.InFlightReport) string {
	var out []string
	for _, f := range r.Flows {
		if f.Skip == "" && f.InFlight.Ops > 0 {
			out = append(out, f.GPU+" "+f.Direction+" "+f.InFlight.Text())
		}
	}
	if len(out) == 0 {
		return "no flow judged"
	}
	return strings.Join(out, "; ")
}

// truthTransfers are the scenario's copies and work requests on GPU links
// as transfers, each in flight over the time the view gives it
// (truthCopies, truthRequests), placed on the lanes the agent places them
// on: a copy on its process's GPU, a request on the GPU whose memory it
// crossed (its peer's for peerLink).
func truthTransfers(procs []scenarioProc, v view, st stamped) (out []correlate.Transfer, bad []string) {
	for _, p := range procs {
		copies, b := truthCopies(p.truth, v, st.copies[p.pid])
		bad = append(bad, b...)
		for _, c := range copies {
			out = append(out, correlate.Transfer{PID: p.pid, Stream: c.stream, GPU: p.gpu, Op: event.OpCopy, Direction: c.kind,
				Bytes: c.bytes, HostMem: event.MemPinned, SubmitNs: c.start, CompleteNs: c.end, CompleteNear: c.near})
		}
		reqs, b := truthRequests(p.truth, v, st.wrs[p.pid])
		bad = append(bad, b...)
		for _, r := range reqs {
			t := correlate.Transfer{PID: p.pid, QPNum: r.qp, Op: event.OpPostSend, Direction: r.kind, Bytes: r.bytes,
				SubmitNs: r.start, CompleteNs: r.end, Status: "success"}
			local, remote := &t.Src, &t.Dst
			if r.kind == correlate.DirRDMARead || r.kind == correlate.DirRecv {
				local, remote = &t.Dst, &t.Src
			}
			if r.kind == correlate.DirRecv {
				t.Op = event.OpPostRecv
			}
			if r.peerLink {
				for _, q := range procs {
					if q.pid != p.pid {
						t.PeerPID = q.pid
					}
				}
				remote.Mem = event.MemDevice
			} else {
				local.Mem = event.MemDevice
			}
			out = append(out, t)
		}
	}
	if len(bad) > 4 {
		bad = append(bad[:4], fmt.Sprintf("and %d more", len(bad)-4))
	}
	return out, bad
}
