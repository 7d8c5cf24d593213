package judge

import (
	"strings"
	"testing"

	"github.com/lanewatch/lanewatch/checks"
	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
)

// The ordering check over a window's work requests: each verdict, from the
// facts correlate put on them, one finding per rule and process.
func TestOrderingCheck(t *testing.T) {
	notify := func(id uint64, order *correlate.OrderFacts) correlate.Transfer {
		return correlate.Transfer{PID: 3, Op: event.OpPostSend, Direction: correlate.DirSend, QPNum: 9, WRID: id, SubmitNs: 5000,
			CompleteNs: 6000, Status: "success", Order: order}
	}
	write := func(id uint64, order *correlate.OrderFacts) correlate.Transfer {
		return correlate.Transfer{PID: 3, Op: event.OpPostSend, Direction: correlate.DirRDMAWrite, QPNum: 8, WRID: id, SubmitNs: 1000,
			CompleteNs: 7000, Status: "LOC_PROT_ERR", Order: order}
	}
	ahead := &correlate.OrderFacts{NotifyAhead: &correlate.NotifyAhead{Peer: "gid fe80::1", DataQPs: []uint32{8}, Writes: 4, Bytes: 4 << 20, OldestNs: 1000}}
	ambiguous := &correlate.OrderFacts{NotifyAhead: &correlate.NotifyAhead{Peer: "gid fe80::1", DataQPs: []uint32{8}, Writes: 4, Bytes: 4 << 20,
		OldestNs: 1000, OtherTIDs: []uint32{12}, Ambiguity: "thread 11 posted no WRITE to that port since its previous notice"}}
	dereg := &correlate.MRDereg{Addr: 0x1000, Length: 1 << 20, LKey: 5, AtNs: 3000, Outstanding: 2, QPs: []uint32{8}, Opcodes: []string{"RDMA_WRITE"}, OldestNs: 1000}
	for _, c := range []struct {
		name      string
		transfers []correlate.Transfer
		status    checks.Status
		rules     string
		detail    string
	}{
		{"no notification", []correlate.Transfer{write(1, nil)}, checks.Skip, "", "no RDMA notification"},
		{"ordered notifications", []correlate.Transfer{write(1, nil), notify(2, nil), notify(3, nil)}, checks.Pass, "", "2 notifications"},
		{"a notification ahead of its data", []correlate.Transfer{notify(2, ahead), notify(3, nil)}, checks.Fail, "cross-qp-notify", "1 of 2 notifications"},
		{"a notification beside concurrent requests' data", []correlate.Transfer{notify(2, ambiguous), notify(3, nil)}, checks.Warn, "cross-qp-notify",
			"(0 surely about them, 1 beside concurrent requests' data)"},
		{"one sure, one ambiguous", []correlate.Transfer{notify(2, ambiguous), notify(3, ahead)}, checks.Fail, "cross-qp-notify,cross-qp-notify",
			"2 of 2 notifications"},
		{"peer unknown", []correlate.Transfer{notify(2, &correlate.OrderFacts{PeerUnknown: true})}, checks.Pass, "", "1 not judged"},
		{"one deregistration under two requests", []correlate.Transfer{write(1, &correlate.OrderFacts{Dereg: dereg}), write(2, &correlate.OrderFacts{Dereg: dereg})},
			checks.Fail, "mr-dereg-in-flight", "1 regions deregistered"},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := NewWindow(false)
			for i := range c.transfers {
				w.Transfer(&c.transfers[i])
			}
			old := w.Rotate()
			got := orderingCheck(factsOf[orderingFacts](old, orderingRule{})[3], "pid 3", 3)
			var rules []string
			for _, f := range got.Findings {
				rules = append(rules, f.Rule)
			}
			if got.Status != c.status || strings.Join(rules, ",") != c.rules || !strings.Contains(got.Detail, c.detail) {
				t.Errorf("%s %v: %s; want %s [%s] %q", got.Status, rules, got.Detail, c.status, c.rules, c.detail)
			}
			if len(w.OrderingPIDs()) != 0 {
				t.Error("Rotate left ordering facts in the new window")
			}
		})
	}
}
