package correlate

import (
	"strings"
	"testing"

	"github.com/lanewatch/lanewatch/event"
)

// orderRig is one process with a region and QPs, fed events in order.
type orderRig struct {
	t   *testing.T
	e   *Engine
	got []Transfer
	now uint64
}

const orderPID = 7

func newOrderRig(t *testing.T) *orderRig {
	r := &orderRig{t: t}
	r.e = NewEngine(Config{Sink: SinkFunc(func(tr *Transfer) { r.got = append(r.got, *tr) })})
	r.e.Handle(call(t, "ibv_reg_mr_iova2", event.Call{Kind: event.KindCall, PID: orderPID, Time: 1, ReturnTime: 2,
		Ptr: 0x1000_0000, Size: 64 << 20, RDMA: event.RDMA{MR: 0xa1, LKey: 11, RKey: 12}}))
	return r
}

func (r *orderRig) tick() uint64 { r.now += 1000; return r.now }

// connect is ibv_modify_qp to RTR with an address vector (gid "" and lid 0: none).
func (r *orderRig) connect(qp uint32, gid byte, lid uint16) {
	rd := event.RDMA{QPNum: qp, DestQPNum: qp + 100, AttrMask: ibvQPAV | ibvQPDestQPN | 1, DLID: lid}
	if gid != 0 {
		rd.IsGlobal, rd.DGID = true, [16]byte{0xfe, 0x80, 15: gid}
	}
	r.e.Handle(call(r.t, "ibv_modify_qp", event.Call{Kind: event.KindCall, PID: orderPID, Time: r.tick(), ReturnTime: r.tick(), RDMA: rd}))
}

func (r *orderRig) post(qp uint32, id uint64, op uint32, signaled bool, local uint64) {
	r.postBy(1, qp, id, op, signaled, local)
}

// postBy posts from thread tid.
func (r *orderRig) postBy(tid, qp uint32, id uint64, op uint32, signaled bool, local uint64) {
	flags := uint32(0)
	if signaled {
		flags = ibvSendSignaled
	}
	r.e.Handle(call(r.t, "provider:post_send", event.Call{Kind: event.KindWR, PID: orderPID, TID: tid, Time: r.tick(), Bytes: 1 << 20,
		RDMA: event.RDMA{QPNum: qp, WRID: id, Opcode: op, SendFlags: flags, Local: local, LKey: 11, NumSGE: 1, RKey: 99}}))
}

func (r *orderRig) poll(qp uint32, id uint64, status uint32) {
	r.e.Handle(call(r.t, "provider:poll_cq", event.Call{Kind: event.KindWC, PID: orderPID, Time: r.tick(), ReturnTime: r.tick(),
		RDMA: event.RDMA{QPNum: qp, WRID: id, Status: status}}))
}

func (r *orderRig) dereg() {
	r.e.Handle(call(r.t, "ibv_dereg_mr", event.Call{Kind: event.KindCall, PID: orderPID, Time: r.tick(), Ptr: 0xa1, RDMA: event.RDMA{MR: 0xa1}}))
}

func (r *orderRig) byID(id uint64) Transfer {
	r.e.ProcessExit(orderPID) // emits what is still outstanding
	for _, g := range r.got {
		if g.WRID == id {
			return g
		}
	}
	r.t.Fatalf("wr %d not emitted: %+v", id, r.got)
	return Transfer{}
}

func TestCrossQPNotify(t *testing.T) {
	const data, ctrl, data2 = 5, 6, 7
	const write, writeImm, send = 0, 1, 2
	cases := []struct {
		name string
		run  func(r *orderRig)
		// want: "fail" (surely ahead of its data), "warn" (ahead, but
		// concurrent data cannot be told apart), "unknown" (not judged),
		// "own-done" (other requests' WRITEs outstanding, its own complete)
		// or "" (ordered)
		want string
	}{
		{"notify on another QP before the data completed", func(r *orderRig) {
			r.connect(data, 9, 0)
			r.connect(ctrl, 9, 0)
			r.post(data, 1, write, false, 0x1000_0000)
			r.post(data, 2, write, true, 0x1010_0000)
			r.post(ctrl, 100, send, true, 0x1020_0000)
		}, "fail"},
		{"WRITE_WITH_IMM on the data QP", func(r *orderRig) {
			r.connect(data, 9, 0)
			r.connect(ctrl, 9, 0)
			r.post(data, 1, write, false, 0x1000_0000)
			r.post(data, 100, writeImm, true, 0x1010_0000)
		}, ""},
		{"notify after the signaled write's completion covers the unsignaled one", func(r *orderRig) {
			r.connect(data, 9, 0)
			r.connect(ctrl, 9, 0)
			r.post(data, 1, write, false, 0x1000_0000)
			r.post(data, 2, write, true, 0x1010_0000)
			r.poll(data, 2, 0)
			r.post(ctrl, 100, send, true, 0x1020_0000)
		}, ""},
		// Part of the thread's data completed: the notice may announce that
		// part (request A's WRITE polled, B's still out, A's notice).
		{"notify before the last unsignaled write's covering completion", func(r *orderRig) {
			r.connect(data, 9, 0)
			r.connect(ctrl, 9, 0)
			r.post(data, 1, write, true, 0x1000_0000)
			r.post(data, 2, write, false, 0x1010_0000)
			r.poll(data, 1, 0)
			r.post(ctrl, 100, writeImm, true, 0x1020_0000)
		}, "warn"},
		{"QPs to different peers", func(r *orderRig) {
			r.connect(data, 9, 0)
			r.connect(ctrl, 8, 0)
			r.post(data, 1, write, true, 0x1000_0000)
			r.post(ctrl, 100, send, true, 0x1020_0000)
		}, ""},
		{"same peer by LID (InfiniBand, no GRH)", func(r *orderRig) {
			r.connect(data, 0, 4)
			r.connect(ctrl, 0, 4)
			r.post(data, 1, write, true, 0x1000_0000)
			r.post(ctrl, 100, send, true, 0x1020_0000)
		}, "fail"},
		{"the data QP's peer unknown", func(r *orderRig) {
			r.connect(ctrl, 9, 0)
			r.post(data, 1, write, true, 0x1000_0000)
			r.post(ctrl, 100, send, true, 0x1020_0000)
		}, "unknown"},
		{"an address vector with no address", func(r *orderRig) {
			r.connect(data, 0, 0)
			r.connect(ctrl, 9, 0)
			r.post(data, 1, write, true, 0x1000_0000)
			r.post(ctrl, 100, send, true, 0x1020_0000)
		}, "unknown"},
		{"only reads outstanding on the other QP", func(r *orderRig) {
			r.connect(data, 9, 0)
			r.connect(ctrl, 9, 0)
			r.post(data, 1, 4 /* READ */, true, 0x1000_0000)
			r.post(ctrl, 100, send, true, 0x1020_0000)
		}, ""},
		// Concurrent PD requests (issue 20): thread 1's notice after its own
		// WRITEs completed, thread 2's WRITEs to the same decode peer out.
		{"concurrent requests, each notice after its own WRITEs", func(r *orderRig) {
			r.connect(data, 9, 0)
			r.connect(ctrl, 9, 0)
			r.connect(data2, 9, 0)
			r.postBy(1, data, 1, write, true, 0x1000_0000)
			r.postBy(2, data2, 2, write, true, 0x1010_0000)
			r.poll(data, 1, 0)
			r.postBy(1, ctrl, 100, send, true, 0x1020_0000)
		}, "own-done"},
		{"its own WRITEs on the notice's QP, another thread's out", func(r *orderRig) {
			r.connect(data, 9, 0)
			r.connect(ctrl, 9, 0)
			r.postBy(2, data, 1, write, true, 0x1000_0000)
			r.postBy(1, ctrl, 2, write, false, 0x1010_0000)
			r.postBy(1, ctrl, 100, send, true, 0x1020_0000)
		}, "own-done"},
		{"a control thread that wrote nothing notifies", func(r *orderRig) {
			r.connect(data, 9, 0)
			r.connect(ctrl, 9, 0)
			r.postBy(2, data, 1, write, true, 0x1000_0000)
			r.postBy(1, ctrl, 100, send, true, 0x1020_0000)
		}, "warn"},
		{"its own WRITEs and another thread's outstanding", func(r *orderRig) {
			r.connect(data, 9, 0)
			r.connect(ctrl, 9, 0)
			r.connect(data2, 9, 0)
			r.postBy(1, data, 1, write, true, 0x1000_0000)
			r.postBy(2, data2, 2, write, true, 0x1010_0000)
			r.postBy(1, ctrl, 100, send, true, 0x1020_0000)
		}, "warn"},
		{"the previous notice closes the epoch", func(r *orderRig) {
			r.connect(data, 9, 0)
			r.connect(ctrl, 9, 0)
			r.post(data, 1, write, true, 0x1000_0000)
			r.poll(data, 1, 0)
			r.post(ctrl, 50, send, true, 0x1020_0000)
			r.post(data, 2, write, true, 0x1010_0000)
			r.post(ctrl, 100, send, true, 0x1020_0000)
		}, "fail"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := newOrderRig(t)
			c.run(r)
			n := r.byID(100)
			got := ""
			switch {
			case n.Order != nil && n.Order.NotifyAhead != nil && n.Order.NotifyAhead.Ambiguity == "":
				got = "fail"
			case n.Order != nil && n.Order.NotifyAhead != nil:
				got = "warn"
			case n.Order != nil && n.Order.PeerUnknown:
				got = "unknown"
			case r.e.RDMAStats().NotifiesOwnDone == 1:
				got = "own-done"
			}
			if got != c.want {
				t.Fatalf("notify: %q, want %q (%+v)", got, c.want, n.Order)
			}
			st := r.e.RDMAStats()
			if (st.NotifiesAhead == 1) != (got == "fail" || got == "warn") || (st.NotifiesAmbiguous == 1) != (got == "warn") ||
				(st.NotifyPeerUnknown == 1) != (got == "unknown") {
				t.Errorf("stats %+v", st)
			}
			if got == "fail" || got == "warn" {
				a := n.Order.NotifyAhead
				if a.Peer == "" || len(a.DataQPs) < 1 || a.DataQPs[0] != data || a.Writes < 1 || a.OldestNs == 0 ||
					a.RemoteQP != ctrl+100 || a.DataRemoteQPs[0] != data+100 {
					t.Errorf("evidence %+v", a)
				}
				sev := SevFail
				if got == "warn" {
					sev = SevWarn
				}
				f := CrossQPNotify(orderPID, sev, 1, 1, []NotifyHazard{{QP: ctrl, WRID: 100, Opcode: "SEND", PostedNs: n.SubmitNs, Ahead: *a}})
				if f == nil || f.Rule != "cross-qp-notify" || f.Severity != sev || !strings.Contains(f.Evidence[0], "(→ QP 105") ||
					!strings.Contains(f.Evidence[0], "on QP 6 (→ QP 106)") ||
					!strings.Contains(f.Evidence[0], map[bool]string{true: "none completed", false: a.Ambiguity}[sev == SevFail]) {
					t.Errorf("finding %+v", f)
				}
			}
		})
	}
}

func TestMRDeregInFlight(t *testing.T) {
	for _, c := range []struct {
		name string
		run  func(r *orderRig)
		want int // requests marked
	}{
		{"dereg before the poll", func(r *orderRig) {
			r.post(5, 1, 0, false, 0x1000_0000)
			r.post(5, 2, 0, true, 0x1010_0000)
			r.dereg()
			r.poll(5, 2, 4 /* LOC_PROT_ERR */)
		}, 2},
		{"dereg after the poll", func(r *orderRig) {
			r.post(5, 1, 0, false, 0x1000_0000)
			r.post(5, 2, 0, true, 0x1010_0000)
			r.poll(5, 2, 0)
			r.dereg()
		}, 0},
		{"another region's requests", func(r *orderRig) {
			r.e.Handle(call(r.t, "provider:post_send", event.Call{Kind: event.KindWR, PID: orderPID, Time: r.tick(), Bytes: 64,
				RDMA: event.RDMA{QPNum: 5, WRID: 1, SendFlags: ibvSendSignaled, Local: 0x9000_0000, LKey: 77, NumSGE: 1}}))
			r.dereg()
		}, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newOrderRig(t)
			c.run(r)
			r.e.ProcessExit(orderPID)
			marked := 0
			var d *MRDereg
			for _, g := range r.got {
				if g.Order != nil && g.Order.Dereg != nil {
					marked++
					d = g.Order.Dereg
				}
			}
			if marked != c.want {
				t.Fatalf("%d requests marked, want %d: %+v", marked, c.want, r.got)
			}
			if c.want == 0 {
				return
			}
			if d.Outstanding != c.want || d.LKey != 11 || d.Length != 64<<20 || len(d.QPs) != 1 || d.Opcodes[0] != "RDMA_WRITE" {
				t.Errorf("evidence %+v", d)
			}
			if f := MRDeregInFlight(orderPID, []*MRDereg{d}); f == nil || !strings.Contains(f.Evidence[0], "2 requests outstanding") {
				t.Errorf("finding %+v", f)
			}
		})
	}
}

// FuzzRDMAOrdering feeds arbitrary verbs sequences (two processes, three
// QPs, two peers, one region, small wr_id alphabets) and checks the
// tracker's promises: every request is emitted exactly once, a notice's
// facts only on notices, a deregistration's count equal to the requests
// that carry it.
func FuzzRDMAOrdering(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 16, 17, 18, 19, 32, 33, 34, 35, 48, 49, 50, 51})
	f.Add([]byte("\x00\x05\x10\x15\x20\x25\x30\x35\x40\x45\x50\x55\x60\x65\x70\x75"))
	f.Fuzz(func(t *testing.T, data []byte) {
		emitted := map[[3]uint64]int{}
		deregs := map[*MRDereg]int{}
		posted := 0
		e := NewEngine(Config{Sink: SinkFunc(func(tr *Transfer) {
			emitted[[3]uint64{uint64(tr.PID), uint64(tr.QPNum), tr.WRID}]++
			if tr.Order == nil {
				return
			}
			if tr.Order.NotifyAhead != nil && (tr.Op != event.OpPostSend || (tr.Direction != DirSend && tr.Direction != DirWriteImm)) {
				t.Fatalf("notice facts on %+v", tr)
			}
			if d := tr.Order.Dereg; d != nil {
				deregs[d]++
			}
		})})
		ts, id := uint64(0), uint64(0)
		for len(data) >= 2 {
			a, b := data[0], data[1]
			data = data[2:]
			ts += 10
			pid, qp := uint32(1+a>>7), uint32(5+a>>5&3)
			switch a & 7 {
			case 0:
				e.Handle(call(t, "ibv_reg_mr_iova2", event.Call{Kind: event.KindCall, PID: pid, Time: ts, ReturnTime: ts + 1,
					Ptr: 0x1000_0000, Size: 1 << 20, RDMA: event.RDMA{MR: 0xa1, LKey: 11, RKey: 12}}))
			case 1:
				e.Handle(call(t, "ibv_dereg_mr", event.Call{Kind: event.KindCall, PID: pid, Time: ts, Ptr: 0xa1, RDMA: event.RDMA{MR: 0xa1}}))
			case 2:
				e.Handle(call(t, "ibv_modify_qp", event.Call{Kind: event.KindCall, PID: pid, Time: ts, ReturnTime: ts + 1, Ret: uint64(b >> 7),
					RDMA: event.RDMA{QPNum: qp, AttrMask: uint32(b&1) * ibvQPAV, IsGlobal: b&2 != 0, DGID: [16]byte{15: b >> 2 & 1}, DLID: uint16(b >> 3 & 1)}}))
			case 3, 4, 5:
				id++
				posted++
				e.Handle(call(t, "provider:post_send", event.Call{Kind: event.KindWR, PID: pid, Time: ts, Bytes: 64,
					RDMA: event.RDMA{QPNum: qp, WRID: id, Opcode: uint32(b & 3), SendFlags: uint32(b>>2&1) * ibvSendSignaled,
						Local: 0x1000_0000 + uint64(b>>3)<<16, LKey: 11 + uint32(b>>6&1), NumSGE: uint32(b >> 7)}}))
			case 6:
				e.Handle(call(t, "provider:poll_cq", event.Call{Kind: event.KindWC, PID: pid, Time: ts, ReturnTime: ts + 1,
					RDMA: event.RDMA{QPNum: qp, WRID: id - uint64(b&7), Status: uint32(b >> 6)}}))
			case 7:
				e.ProcessExit(pid)
			}
			checkWriting(t, e.rdma)
		}
		e.ProcessExit(1)
		e.ProcessExit(2)
		n := 0
		for k, c := range emitted {
			if c != 1 {
				t.Fatalf("request %v emitted %d times", k, c)
			}
			n++
		}
		if n != posted {
			t.Fatalf("%d requests emitted of %d posted", n, posted)
		}
		for d, c := range deregs {
			if d.Outstanding != c || c == 0 {
				t.Fatalf("deregistration %+v carried by %d requests", d, c)
			}
		}
	})
}

// checkWriting: the WRITE counts checkNotify reads are the queues' own.
func checkWriting(t *testing.T, r *rdmaTracker) {
	want := map[uint32]map[uint32]int{}
	for k, q := range r.queues {
		for _, w := range q {
			if !k.recv && w.opcode == opRDMAWrite {
				if want[k.pid] == nil {
					want[k.pid] = map[uint32]int{}
				}
				want[k.pid][k.qp]++
			}
		}
	}
	for pid, m := range r.writing {
		for qp, n := range m {
			if want[pid][qp] != n {
				t.Fatalf("pid %d QP %d: %d WRITEs counted, %d queued", pid, qp, n, want[pid][qp])
			}
		}
	}
	for pid, m := range want {
		for qp, n := range m {
			if r.writing[pid][qp] != n {
				t.Fatalf("pid %d QP %d: %d WRITEs queued, %d counted", pid, qp, n, r.writing[pid][qp])
			}
		}
	}
}
