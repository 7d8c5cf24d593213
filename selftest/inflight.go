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

// checkInflight checks a scenario's too-little-in-flight verdict: the
// agent's, from its records through checks.Window as `agent run` judges
// them, must be the designed one (designed: a flow that keeps one
// operation in flight at a time, each paying the reference mover's
// turnaround, refpath/driver/internal.h, refpath/rdma/provider.c; every
// other flow queues its operations). The truth's transfers at the agent's
// stamps and at its brackets (each operation in flight from its call's
// entry to the return of the call that proved it done) only say, beside a
// wrong verdict, what the rule would have measured of them.
func checkInflight(res *Result, scenario string, procs []scenarioProc, transfers []correlate.Transfer) {
	lane := refenv.LaneGBs()
	place := func(pid uint32) checks.Placement {
		for _, p := range procs {
			if p.pid == pid {
				return checks.Placement{GPU: p.gpu, InboundGBs: lane, OutboundGBs: lane}
			}
		}
		return checks.Placement{Why: fmt.Sprintf("pid %d is not a process of %s", pid, scenario)}
	}
	judge := func(ts []correlate.Transfer) (string, checks.InFlightReport) {
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
	agent, rep := judge(transfers)
	atStampsTs, _ := truthTransfers(procs, atStamps, agentStamps(transfers))
	byStamps, _ := judge(atStampsTs)
	evTs, _ := truthTransfers(procs, atEvidence, stamped{})
	byEvidence, evRep := judge(evTs)

	for _, f := range rep.Flows {
		if f.Finding != nil {
			note("finding: %s; %s", f.Finding.Summary, strings.Join(f.Finding.Evidence, "; "))
		}
	}
	want := fires(scenario, "too-little-in-flight")
	if (agent != "") != want {
		res.OtherErrs++
		note("in-flight: the agent flagged [%s], the scenario is designed %s: agent %s; the truth's transfers at the agent's stamps [%s], its brackets [%s] %s",
			agent, designedText(want), inflightText(rep), byStamps, byEvidence, inflightText(evRep))
		return
	}
	if want || byEvidence != "" {
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
