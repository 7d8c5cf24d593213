package selftest

import (
	"slices"
	"strings"
	"testing"

	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
)

// The truth's ordering verdict from its records, and checkOrdering failing
// a row whose agent records say otherwise.
func TestCheckOrdering(t *testing.T) {
	const gid = "fe80::1:0:ab4"
	postBy := func(tid uint32, seq int, qp uint32, id uint64, op string, signaled bool, at uint64) TruthCall {
		return TruthCall{Seq: seq, TID: tid, Op: TruthPostSend, QPNum: qp, WRID: id, Opcode: op, Signaled: signaled, LKey: 5, Addr: 0x1000, NumSGE: 1,
			Bytes: 4096, TPostNs: at, TPostEnd: at + 10}
	}
	post := func(seq int, qp uint32, id uint64, op string, signaled bool, at uint64) TruthCall {
		return postBy(1, seq, qp, id, op, signaled, at)
	}
	done := func(seq int, qp uint32, id uint64, at uint64) TruthCall {
		return TruthCall{Seq: seq, Op: TruthCompletion, CQ: "send", QPNum: qp, WRID: id, TPollBeg: at, TPollNs: at + 10}
	}
	connect := []TruthCall{{Seq: 1, Op: TruthConnect, QPNum: 8, DGID: gid}, {Seq: 2, Op: TruthConnect, QPNum: 9, DGID: gid}}
	early := append(connect[:2:2], post(3, 8, 1, "RDMA_WRITE", false, 100), post(4, 8, 2, "RDMA_WRITE", true, 200),
		post(5, 9, 3, "SEND", true, 300), done(6, 8, 2, 400), done(7, 9, 3, 500),
		TruthCall{Seq: 8, Op: TruthDeregMR, LKey: 5, Addr: 0x1000, Length: 1 << 20, TCallNs: 600, TReturnNs: 610})
	polled := append(connect[:2:2], post(3, 8, 1, "RDMA_WRITE", false, 100), post(4, 8, 2, "RDMA_WRITE", true, 200),
		done(5, 8, 2, 300), post(6, 9, 3, "SEND", true, 400), done(7, 9, 3, 500))
	// kv-notify-concurrent's shape: thread 1 (QPs 8, 9) notifies after its
	// WRITE's poll while thread 2's WRITE on QP 10 is out; thread 2's own
	// notice after its poll. Then a control thread (3) that wrote nothing
	// notifies while thread 2's next WRITE is out: ambiguous.
	concurrent := append(slices.Clone(connect), TruthCall{Seq: 3, Op: TruthConnect, QPNum: 10, DGID: gid}, TruthCall{Seq: 4, Op: TruthConnect, QPNum: 11, DGID: gid},
		postBy(1, 5, 8, 1, "RDMA_WRITE", true, 100), postBy(2, 6, 10, 2, "RDMA_WRITE", true, 110), done(7, 8, 1, 200),
		postBy(1, 8, 9, 3, "SEND", true, 300), done(9, 10, 2, 400), postBy(2, 10, 11, 4, "SEND", true, 500))
	control := append(slices.Clone(concurrent), postBy(2, 11, 10, 5, "RDMA_WRITE", true, 600), postBy(3, 12, 9, 6, "SEND", true, 700))
	dereg := append(connect[:2:2], post(3, 8, 1, "RDMA_WRITE", true, 100),
		TruthCall{Seq: 4, Op: TruthDeregMR, LKey: 5, Addr: 0x1000, Length: 1 << 20, TCallNs: 200, TReturnNs: 210}, done(5, 8, 1, 300))

	// No refpath scenario has the control thread's shape (correlate's unit
	// tests cover it): designed here for this test only.
	designed["kv-notify-control"] = []string{"cross-qp-notify/warn"}
	orderingBeside["kv-notify-control"] = 1
	defer delete(designed, "kv-notify-control")
	defer delete(orderingBeside, "kv-notify-control")
	orderingBeside["kv-notify-concurrent-test"] = 1
	defer delete(orderingBeside, "kv-notify-concurrent-test")
	for _, c := range []struct {
		name, scenario string
		truth          []TruthCall
		want           string
	}{
		{"notify before the writes' poll", "kv-notify-early", early, "cross-qp-notify/fail"},
		{"notify after it", "kv-notify-polled", polled, ""},
		{"concurrent requests, each notice after its own WRITEs", "kv-notify-concurrent-test", concurrent, ""},
		{"a control thread's notice beside a worker's WRITE", "kv-notify-control", control, "cross-qp-notify/warn"},
		{"dereg before the poll", "mr-dereg-early", dereg, "mr-dereg-in-flight/fail"},
	} {
		t.Run(c.name, func(t *testing.T) {
			v, ambiguous := truthOrder(c.truth)
			if v.rules() != c.want || len(ambiguous) > 0 {
				t.Fatalf("truth verdict [%s] %s %v, want [%s]", v.rules(), v, ambiguous, c.want)
			}
			// The agent's records as correlate makes them: the same facts pass, none fail.
			var agree []correlate.Transfer
			for id, n := range v.ahead {
				agree = append(agree, correlate.Transfer{PID: 3, Op: event.OpPostSend, Direction: correlate.DirSend, WRID: id,
					Order: &correlate.OrderFacts{NotifyAhead: &correlate.NotifyAhead{Writes: n.writes, DataQPs: []uint32{8}, Ambiguity: map[bool]string{false: "?"}[n.sure]}}})
			}
			for lkey, n := range v.deregs {
				agree = append(agree, correlate.Transfer{PID: 3, Op: event.OpPostSend, Direction: correlate.DirRDMAWrite, WRID: 1,
					Order: &correlate.OrderFacts{Dereg: &correlate.MRDereg{LKey: lkey, Outstanding: n}}})
			}
			res := Result{Scenario: c.scenario, Runtime: "prefill"}
			checkOrdering(&res, c.scenario, c.truth, agree)
			if res.OtherErrs != 0 {
				t.Errorf("agreeing records: %v", res.Problems)
			}
			res = Result{Scenario: c.scenario, Runtime: "prefill"}
			checkOrdering(&res, c.scenario, c.truth, nil)
			// A scenario not in designed is designed silent: its
			// truth firing is a designed-verdict error too.
			if (res.OtherErrs != 0) != (c.want != "") || (c.want != "" && !strings.Contains(strings.Join(res.Problems, "\n"), "ordering: agent")) {
				t.Errorf("no agent records: %d errors %v", res.OtherErrs, res.Problems)
			}
		})
	}
}
