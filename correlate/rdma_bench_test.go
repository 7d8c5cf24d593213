package correlate

import (
	"testing"

	"github.com/lanewatch/lanewatch/event"
)

// BenchmarkRDMATransfer correlates a KV transfer's verbs events: per
// iteration a chain of 4 RDMA WRITEs (the last signaled) on a data QP, a
// SEND notice and the two completions polled — the tracker's cost per work
// request, the ordering checks included. "other-qp" posts the notice on a
// second QP to the same peer after the writes' completion (judged, not
// fired).
func BenchmarkRDMATransfer(b *testing.B) {
	for _, notifyQP := range []uint32{5, 6} {
		name := "same-qp"
		if notifyQP == 6 {
			name = "other-qp"
		}
		b.Run(name, func(b *testing.B) {
			e := NewEngine(Config{Sink: SinkFunc(func(*Transfer) {})})
			e.Handle(call(b, "ibv_reg_mr_iova2", event.Call{Kind: event.KindCall, PID: 1, Time: 1, ReturnTime: 2, Ptr: 0x1000_0000,
				Size: 64 << 20, RDMA: event.RDMA{MR: 0xa1, LKey: 11, RKey: 12}}))
			for _, qp := range []uint32{5, 6} {
				e.Handle(call(b, "ibv_modify_qp", event.Call{Kind: event.KindCall, PID: 1, Time: 3, ReturnTime: 4,
					RDMA: event.RDMA{QPNum: qp, AttrMask: ibvQPAV | ibvQPDestQPN, IsGlobal: true, DGID: [16]byte{0xfe, 0x80, 15: 1}}}))
			}
			post, poll := call(b, "provider:post_send", event.Call{Kind: event.KindWR, PID: 1, Bytes: 1 << 20,
				RDMA: event.RDMA{Local: 0x1000_0000, LKey: 11, NumSGE: 1, RKey: 99}}), call(b, "provider:poll_cq", event.Call{Kind: event.KindWC, PID: 1})
			b.ReportAllocs()
			b.ResetTimer()
			id := uint64(0)
			for i := range b.N {
				t := uint64(i) * 100
				for k := range 4 {
					id++
					post.Time, post.RDMA.QPNum, post.RDMA.WRID, post.RDMA.Opcode, post.RDMA.SendFlags = t+uint64(k), 5, id, opRDMAWrite, 0
					if k == 3 {
						post.RDMA.SendFlags = ibvSendSignaled
					}
					e.Handle(post)
				}
				poll.ReturnTime, poll.RDMA.QPNum, poll.RDMA.WRID = t+10, 5, id
				e.Handle(poll)
				id++
				post.Time, post.RDMA.QPNum, post.RDMA.WRID, post.RDMA.Opcode, post.RDMA.SendFlags = t+20, notifyQP, id, 2, ibvSendSignaled
				e.Handle(post)
				poll.ReturnTime, poll.RDMA.QPNum, poll.RDMA.WRID = t+30, notifyQP, id
				e.Handle(poll)
			}
			b.ReportMetric(float64(b.N*5)/b.Elapsed().Seconds(), "wrs/s")
		})
	}
}
