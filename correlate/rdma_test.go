package correlate

import (
	"testing"

	"github.com/lanewatch/lanewatch/event"
)

func TestRDMAJoinsRequestsAndCompletions(t *testing.T) {
	var got []Transfer
	e := NewEngine(Config{Sink: SinkFunc(func(tr *Transfer) { got = append(got, *tr) })})
	const prefill, decode = 10, 20
	e.reg.AddDevice(decode, 0x7000_0000, 64<<20)  // decode's GPU memory (cudaMalloc)
	e.reg.AddPinned(prefill, 0x1000_0000, 64<<20) // prefill's pool (cudaHostRegister)
	reg := func(pid uint32, mr, addr, size uint64, lkey, rkey uint32) {
		e.Handle(call(t, "ibv_reg_mr_iova2", event.Call{Kind: event.KindCall, PID: pid, TID: pid,
			Time: 1, ReturnTime: 2, Ptr: addr, Size: size, RDMA: event.RDMA{MR: mr, LKey: lkey, RKey: rkey}}))
	}
	reg(prefill, 0xa1, 0x1000_0000, 64<<20, 1, 2)
	reg(decode, 0xb1, 0x7000_0000, 64<<20, 3, 4)
	post := "provider:post_send"
	for i, signaled := range []bool{false, false, true} {
		flags := uint32(0)
		if signaled {
			flags = 2
		}
		e.Handle(call(t, post, event.Call{Kind: event.KindWR, PID: prefill, TID: prefill, Time: 1000 + uint64(i), Bytes: 1 << 20,
			BatchIndex: uint32(i), RDMA: event.RDMA{QPNum: 5, WRID: uint64(i + 1), Opcode: 1, SendFlags: flags,
				Local: 0x1000_0000, LKey: 1, NumSGE: 1, RemoteAddr: 0x7000_0000 + uint64(i)<<20, RKey: 4}}))
	}
	e.Handle(call(t, "provider:post_recv", event.Call{Kind: event.KindWR, PID: decode, TID: decode, Time: 900,
		Bytes: 4096, RDMA: event.RDMA{QPNum: 6, WRID: 9, Local: 0x7000_0000, LKey: 3, NumSGE: 1}}))
	poll := "provider:poll_cq"
	e.Handle(call(t, poll, event.Call{Kind: event.KindWC, PID: prefill, TID: prefill, Time: 5000, ReturnTime: 6000,
		RDMA: event.RDMA{QPNum: 5, WRID: 3, Opcode: 1, Status: 0}}))
	e.Handle(call(t, poll, event.Call{Kind: event.KindWC, PID: decode, TID: decode, Time: 5500, ReturnTime: 6500, Bytes: 0,
		RDMA: event.RDMA{QPNum: 6, WRID: 9, Opcode: 129, Status: 0, Imm: 7}}))
	e.Handle(call(t, poll, event.Call{Kind: event.KindWC, PID: decode, TID: decode, ReturnTime: 7000,
		RDMA: event.RDMA{QPNum: 6, WRID: 99, Opcode: 129}})) // posted before the agent looked

	if len(got) != 4 {
		t.Fatalf("%d transfers, want 3 writes and a receive: %+v", len(got), got)
	}
	for i, w := range got[:3] {
		if w.Direction != DirWriteImm || w.Bytes != 1<<20 || w.Status != "success" || w.CompleteNs != 6000 ||
			w.Src.Mem != event.MemPinned || w.Dst.Mem != event.MemDevice || w.PeerPID != decode || w.WRID != uint64(i+1) || w.QPNum != 5 {
			t.Errorf("write %d: %+v", i, w)
		}
	}
	if r := got[3]; r.Direction != DirRecv || r.Bytes != 0 || r.Dst.Mem != event.MemDevice || r.CompleteNs != 6500 || r.WRID != 9 {
		t.Errorf("receive: %+v", r)
	}
	lat := e.RDMALatency()
	if len(lat) != 2 || lat[0].Opcode != "RDMA_WRITE_WITH_IMM" || lat[0].Count != 1 || lat[0].P50 != 6000-1002 ||
		lat[1].Opcode != "RECV" || lat[1].P99 != 6500-900 {
		t.Errorf("latency %+v", lat)
	}
	st := e.RDMAStats()
	if st.WorkRequests != 4 || st.Completions != 3 || st.Unmatched != 1 || st.MemoryRegions != 2 {
		t.Errorf("stats %+v", st)
	}
}

func TestRDMAErrorsAndExit(t *testing.T) {
	var got []Transfer
	e := NewEngine(Config{Sink: SinkFunc(func(tr *Transfer) { got = append(got, *tr) })})
	post, poll := "provider:post_send", "provider:poll_cq"
	for i := 1; i <= 3; i++ {
		e.Handle(call(t, post, event.Call{Kind: event.KindWR, PID: 1, Time: uint64(i), Bytes: 64,
			RDMA: event.RDMA{QPNum: 2, WRID: uint64(i), Opcode: 4 /* READ */, SendFlags: 2, RKey: 77}}))
	}
	e.Handle(call(t, poll, event.Call{Kind: event.KindWC, PID: 1, ReturnTime: 10,
		RDMA: event.RDMA{QPNum: 2, WRID: 1, Opcode: 2, Status: 10 /* REM_ACCESS_ERR */}}))
	if len(got) != 1 || got[0].Status != "REM_ACCESS_ERR" || got[0].Direction != DirRDMARead || got[0].Dst.Mem != event.MemUnknown {
		t.Fatalf("error completion: %+v", got)
	}
	e.ProcessExit(1)
	if len(got) != 3 || got[1].CompleteNs != 0 || got[2].CompleteNs != 0 {
		t.Fatalf("exit must emit the two requests still in flight once, without a completion: %+v", got)
	}
	if st := e.RDMAStats(); st.Evicted != 2 || st.QueuedRequests != 0 || st.ByStatus["REM_ACCESS_ERR"] != 1 {
		t.Errorf("stats %+v", st)
	}
	e.Flush()
	if len(got) != 3 {
		t.Errorf("flush emitted again: %d", len(got))
	}
}

func TestPercentile(t *testing.T) {
	s := []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	if Percentile(s, 50) != 5 || Percentile(s, 99) != 10 || Percentile(nil, 50) != 0 || Percentile([]uint64{7}, 99) != 7 {
		t.Error(Percentile(s, 50), Percentile(s, 99))
	}
}

// An rkey is unique per device only: two processes' regions may share one.
// The remote address then names the owner; where it cannot, the peer and
// the remote memory are unknown, never the wrong process. A send's rkey
// field means nothing and names no peer.
func TestRDMASharedRKey(t *testing.T) {
	var got []Transfer
	e := NewEngine(Config{Sink: SinkFunc(func(tr *Transfer) { got = append(got, *tr) })})
	const poster, a, b = 10, 20, 30
	e.reg.AddPinned(poster, 0x1000_0000, 1<<20)
	e.reg.AddDevice(a, 0x7000_0000, 1<<20)
	e.reg.AddPinned(b, 0x9000_0000, 1<<20)
	reg := func(pid uint32, mr, addr uint64, lkey, rkey uint32) {
		e.Handle(call(t, "ibv_reg_mr_iova2", event.Call{Kind: event.KindCall, PID: pid, TID: pid,
			Time: 1, ReturnTime: 2, Ptr: addr, Size: 1 << 20, RDMA: event.RDMA{MR: mr, LKey: lkey, RKey: rkey}}))
	}
	reg(poster, 0xa1, 0x1000_0000, 1, 2)
	reg(a, 0xb1, 0x7000_0000, 3, 77)
	reg(b, 0xc1, 0x9000_0000, 4, 77) // the same rkey, another device's
	post := func(wrid uint64, opcode uint32, remote uint64) {
		e.Handle(call(t, "provider:post_send", event.Call{Kind: event.KindWR, PID: poster, TID: poster, Time: 100 + wrid, Bytes: 4096,
			RDMA: event.RDMA{QPNum: 5, WRID: wrid, Opcode: opcode, SendFlags: 2, Local: 0x1000_0000, LKey: 1, NumSGE: 1,
				RemoteAddr: remote, RKey: 77}}))
	}
	post(1, 0, 0x7000_1000) // RDMA_WRITE into a's region
	post(2, 0, 0x9000_2000) // into b's
	post(3, 0, 0x5000_0000) // in neither: either could own the rkey
	post(4, 2, 0x7000_1000) // SEND: its rkey field is not read
	e.Flush()
	want := []struct {
		peer uint32
		mem  event.MemKind
	}{{a, event.MemDevice}, {b, event.MemPinned}, {0, event.MemUnknown}, {0, event.MemUnknown}}
	if len(got) != len(want) {
		t.Fatalf("%d records: %+v", len(got), got)
	}
	for i, w := range want {
		if got[i].PeerPID != w.peer || got[i].Dst.Mem != w.mem {
			t.Errorf("wr %d: peer %d remote %s, want peer %d remote %s", got[i].WRID, got[i].PeerPID, got[i].Dst.Mem, w.peer, w.mem)
		}
	}
}
