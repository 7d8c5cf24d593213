package correlate

import (
	"errors"
	"testing"

	"github.com/lanewatch/lanewatch/event"
)

// The shapes fi_pingpong showed under tracefs (FABRIC-RESEARCH §4): an
// rxm endpoint over tcp, sends posted with context NULL, most of them
// answered -FI_EAGAIN first, a transmit CQ and a receive CQ polled in
// turn, each CQ read returning 1 entry or -FI_EAGAIN.
const (
	fEP, fTxCQ, fRxCQ, fBuf = 0x5000, 0x6000, 0x7000, 0x7f00_0000_0000
	eagain                  = ^uint64(10) // -11 as the register holds it
)

type fstep struct {
	sym   string
	c     event.Call
	names *[2]string // FabricEndpoint before the call: provider, domain (nil: none; empty: unreadable)
}

func fsend(ts, ret, ctx uint64) fstep {
	return fstep{sym: "provider:fi_send", c: event.Call{Time: ts, ReturnTime: ts + 1, Ret: ret, Ptr: fEP, Src: fBuf, Bytes: 65536, Handle: ctx}}
}

func fread(cq, ts, n, ctx uint64) fstep {
	return fstep{sym: "provider:fi_cq_read", c: event.Call{Time: ts, ReturnTime: ts + 1, Ret: n, Ptr: cq, Handle: ctx, Size: 1}}
}

func fbind(cq, flags uint64) fstep {
	return fstep{sym: "provider:fi_ep_bind", c: event.Call{Time: 2, ReturnTime: 3, Ptr: fEP, Handle: cq, Flags: flags}}
}

func fopen(prov, dev string) fstep {
	return fstep{sym: "provider:fi_endpoint", c: event.Call{Time: 1, ReturnTime: 2, Ptr: fEP, Handle: 0x4000, Src: 0x3000}, names: &[2]string{prov, dev}}
}

func TestFabricRecords(t *testing.T) {
	const rxmTCP = "tcp;ofi_rxm"
	type want struct {
		api, status, transport, reason, device string
		complete                               uint64
	}
	sent := func(complete uint64) want { // status absent: its completion was not seen
		w := want{"fi_send", "", rxmTCP, "", "lo", complete}
		if complete != 0 {
			w.status = "success"
		}
		return w
	}
	for _, tc := range []struct {
		name  string
		steps []fstep
		want  []want
		stats FabricStats
	}{
		{
			name: "fi_pingpong: retries are no records, completions in posting order",
			steps: []fstep{fopen(rxmTCP, "lo"), fbind(fTxCQ, fiTransmit), fbind(fRxCQ, fiRecv),
				fsend(10, eagain, 0), fsend(12, eagain, 0), fsend(14, 0, 0), fread(fTxCQ, 20, eagain, 0), fread(fRxCQ, 22, 1, 0),
				fsend(30, 0, 0), fread(fTxCQ, 40, 1, 0), fread(fTxCQ, 50, 1, 0)},
			want:  []want{sent(41), sent(51)},
			stats: FabricStats{Posted: 2, Retries: 2, Completions: 3, Joined: 2, Unmatched: 1},
		},
		{
			name: "by context, out of order",
			steps: []fstep{fopen(rxmTCP, "lo"), fbind(fTxCQ, fiTransmit|fiRecv),
				fsend(10, 0, 0xc1), fsend(11, 0, 0xc2), fread(fTxCQ, 20, 1, 0xc2), fread(fTxCQ, 30, 1, 0xc1)},
			want:  []want{sent(21), sent(31)},
			stats: FabricStats{Posted: 2, Completions: 2, Joined: 2},
		},
		{
			name: "a shared CQ's entry without context is not guessed",
			steps: []fstep{fopen(rxmTCP, "lo"), fbind(fTxCQ, fiTransmit|fiRecv),
				fsend(10, 0, 0), fread(fTxCQ, 20, 1, 0)},
			want:  []want{sent(0)}, // at exit
			stats: FabricStats{Posted: 1, Completions: 1, Unmatched: 1, NoCompletion: 1},
		},
		{
			name:  "no transmit CQ seen: said at once, without completion",
			steps: []fstep{fopen(rxmTCP, "lo"), fsend(10, 0, 0)},
			want:  []want{sent(0)},
			stats: FabricStats{Posted: 1, NoCompletion: 1},
		},
		{
			name:  "an endpoint opened before the attach: transport unknown, said why",
			steps: []fstep{fbind(fTxCQ, fiTransmit), fsend(10, 0, 0), fread(fTxCQ, 20, 1, 0)},
			want:  []want{{"fi_send", "success", "unknown", ReasonEndpointNotSeen, "", 21}},
			stats: FabricStats{Posted: 1, Completions: 1, Joined: 1},
		},
		{
			name:  "provider unreadable",
			steps: []fstep{fopen("", ""), fsend(10, 0, 0)},
			want:  []want{{"fi_send", "", "unknown", ReasonProviderUnread, "", 0}},
			stats: FabricStats{Posted: 1, NoCompletion: 1},
		},
		{
			name: "inject completes nothing; a failed post is no record",
			steps: []fstep{fopen("efa", "rdmap0s6-rdm"), fbind(fTxCQ, fiTransmit),
				{sym: "provider:fi_inject", c: event.Call{Time: 5, ReturnTime: 6, Ptr: fEP, Src: fBuf, Bytes: 64}},
				fsend(10, ^uint64(4), 0)}, // -5: -FI_EIO
			want:  []want{{"fi_inject", "", "efa", "", "rdmap0s6-rdm", 0}},
			stats: FabricStats{Posted: 1, Failed: 1, NoCompletion: 1},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []Transfer
			e := NewEngine(Config{Sink: SinkFunc(func(tr *Transfer) { got = append(got, *tr) })})
			for _, s := range tc.steps {
				c := s.c
				c.Kind, c.PID, c.TID = event.KindCall, testPID, testPID
				if s.names != nil {
					var err error
					if s.names[0] == "" {
						err = errors.New("unreadable")
					}
					e.FabricEndpoint(testPID, c.Ptr, s.names[0], s.names[1], err)
				}
				e.Handle(call(t, s.sym, c))
			}
			e.ProcessExit(testPID)
			if len(got) != len(tc.want) {
				t.Fatalf("%d records, want %d: %+v", len(got), len(tc.want), got)
			}
			for i, w := range tc.want {
				g := got[i]
				lat := uint64(0)
				if w.complete != 0 {
					lat = w.complete - g.SubmitNs
				}
				if g.API != w.api || g.Status != w.status || g.Transport != w.transport || g.TransportReason != w.reason ||
					g.NetDevice != w.device || g.CompleteNs != w.complete || g.LatencyNs != lat || g.Endpoint != fEP ||
					g.Src.Addr != fBuf || g.Mover != MoverOf(ClassOf(w.transport)) {
					t.Errorf("record %d:\n got %+v\nwant %+v", i, g, w)
				}
			}
			if st := e.FabricStats(); st != tc.stats {
				t.Errorf("stats %+v, want %+v", st, tc.stats)
			}
		})
	}
}

// A write names the remote address, a read pulls into the local buffer.
func TestFabricRMADirections(t *testing.T) {
	var got []Transfer
	e := NewEngine(Config{Sink: SinkFunc(func(tr *Transfer) { got = append(got, *tr) })})
	e.FabricEndpoint(testPID, fEP, "verbs;ofi_rxm", "mlx5_0", nil)
	for _, s := range []fstep{
		{sym: "provider:fi_write", c: event.Call{Time: 1, ReturnTime: 2, Ptr: fEP, Src: fBuf, Dst: 0x9000, Bytes: 4096}},
		{sym: "provider:fi_read", c: event.Call{Time: 3, ReturnTime: 4, Ptr: fEP, Dst: fBuf, Src: 0x9000, Bytes: 8192}},
		// more iovecs than the probe sums (LW_FMSG_MANY)
		{sym: "provider:fi_writemsg", c: event.Call{Time: 5, ReturnTime: 6, Ptr: fEP, Src: fBuf, Dst: 0x9000, Bytes: ^uint64(0)}},
	} {
		c := s.c
		c.Kind, c.PID, c.TID = event.KindCall, testPID, testPID
		e.Handle(call(t, s.sym, c))
	}
	if len(got) != 3 {
		t.Fatalf("records %+v", got)
	}
	if m := got[2]; m.API != "fi_writemsg" || !m.BytesUnknown || m.Bytes != 0 || m.Direction != DirRDMAWrite {
		t.Errorf("writemsg of many iovecs: %+v", m)
	}
	w, r := got[0], got[1]
	if w.Op != event.OpXferPut || w.Direction != DirRDMAWrite || w.RemoteAddr != 0x9000 || w.Src.Addr != fBuf || w.Dst.Addr != 0x9000 || w.Mover != MoverNIC {
		t.Errorf("write %+v", w)
	}
	if r.Op != event.OpXferGet || r.Direction != DirRDMARead || r.RemoteAddr != 0x9000 || r.Dst.Addr != fBuf || r.Src.Addr != 0x9000 || r.Bytes != 8192 {
		t.Errorf("read %+v", r)
	}
}

// The queues are bounded: past maxQueued records waiting on one CQ, the
// oldest goes out without its completion, counted.
func TestFabricQueueBound(t *testing.T) {
	n := 0
	e := NewEngine(Config{Sink: SinkFunc(func(*Transfer) { n++ })})
	e.FabricEndpoint(testPID, fEP, "tcp;ofi_rxm", "lo", nil)
	b := fbind(fTxCQ, fiTransmit)
	b.c.Kind, b.c.PID, b.c.TID = event.KindCall, testPID, testPID
	e.Handle(call(t, b.sym, b.c))
	for i := range maxQueued + 3 {
		s := fsend(uint64(10+i), 0, 0)
		s.c.Kind, s.c.PID, s.c.TID = event.KindCall, testPID, testPID
		e.Handle(call(t, s.sym, s.c))
	}
	if st := e.FabricStats(); n != 3 || st.CapHits != 3 || st.NoCompletion != 3 {
		t.Errorf("%d records out, stats %+v; want the 3 oldest, counted", n, st)
	}
	e.ProcessExit(testPID)
	if n != maxQueued+3 {
		t.Errorf("%d records after exit, want %d", n, maxQueued+3)
	}
}
