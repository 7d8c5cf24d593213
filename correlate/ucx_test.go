package correlate

import (
	"testing"

	"github.com/lanewatch/lanewatch/event"
)

// ucpCall is a UCP call of sym as the decoder reports it: posted at ts,
// returned at rts with ret, on endpoint ep, its first nested UCT call on
// iface (0: none).
func ucpCall(t *testing.T, sym string, ts, rts, ret, ep, iface uint64) *event.Call {
	c := mk(t, sym, 1, ts, rts)
	c.Src, c.Bytes, c.Ret = 0x7000, 1<<20, ret
	c.Xfer = event.Xfer{Endpoint: ep, Remote: 0x9000, Datatype: 8, Iface: iface}
	if iface != 0 {
		c.Xfer.LaneSymbol, c.Xfer.LaneCalls = "uct_tcp_ep_am_bcopy", 1
	}
	return c
}

func ifaceOpen(t *testing.T, iface uint64, tl, dev string) *event.Call {
	c := mk(t, "uct_iface_open", 1, 10, 11)
	c.Xfer.Iface = iface
	copy(c.Xfer.Transport[:], tl)
	copy(c.Xfer.Device[:], dev)
	return c
}

func TestUCXRecords(t *testing.T) {
	const ucsErrNoResource = uint64(1<<64 - 2) // (ucs_status_ptr_t)UCS_ERR_NO_RESOURCE
	type want struct {
		api, dir, transport, device, reason string
		inferred                            bool
		complete, latency                   uint64
		err                                 string
	}
	for _, c := range []struct {
		name  string
		calls func(t *testing.T) []*event.Call
		want  []want
	}{
		{"done at return", func(t *testing.T) []*event.Call {
			return []*event.Call{ifaceOpen(t, 0xa0, "tcp", "lo"), ucpCall(t, "ucp_put_nbx", 100, 150, 0, 0xe1, 0xa0)}
		}, []want{{api: "ucp_put_nbx", dir: DirRDMAWrite, transport: "tcp", device: "lo", complete: 150, latency: 50}}},
		{"a request, done when freed", func(t *testing.T) []*event.Call {
			free := mem(t, "ucp_request_free", 1, 400, 0, 0x5000, 0)
			return []*event.Call{ifaceOpen(t, 0xa0, "posix", "memory"), ucpCall(t, "ucp_get_nbx", 100, 120, 0x5000, 0xe1, 0xa0), free}
		}, []want{{api: "ucp_get_nbx", dir: DirRDMARead, transport: "posix", device: "memory", complete: 400, latency: 300}}},
		{"released by the deprecated form", func(t *testing.T) []*event.Call {
			rel := mem(t, "ucp_request_release", 1, 400, 0, 0x5000, 0)
			return []*event.Call{ifaceOpen(t, 0xa0, "tcp", "lo"), ucpCall(t, "ucp_put_nbx", 100, 120, 0x5000, 0xe1, 0xa0), rel}
		}, []want{{api: "ucp_put_nbx", dir: DirRDMAWrite, transport: "tcp", device: "lo", complete: 400, latency: 300}}},
		{"an error: failed, nothing moved", func(t *testing.T) []*event.Call {
			return []*event.Call{ucpCall(t, "ucp_put_nbx", 100, 120, ucsErrNoResource, 0xe1, 0)}
		}, []want{{api: "ucp_put_nbx", dir: DirRDMAWrite, transport: "unknown", reason: transportSeen, err: "UCS_ERR_NO_RESOURCE"}}},
		{"queued: its endpoint's last lane, inferred", func(t *testing.T) []*event.Call {
			return []*event.Call{ifaceOpen(t, 0xa0, "posix", "memory"),
				ucpCall(t, "ucp_tag_send_nbx", 100, 110, 0, 0xe1, 0xa0), ucpCall(t, "ucp_tag_send_nbx", 200, 210, 0, 0xe1, 0),
				ucpCall(t, "ucp_tag_send_nbx", 300, 310, 0, 0xe2, 0)} // another endpoint: nothing known of it
		}, []want{{api: "ucp_tag_send_nbx", dir: DirSend, transport: "posix", device: "memory", complete: 110, latency: 10},
			{api: "ucp_tag_send_nbx", dir: DirSend, transport: "posix", device: "memory", inferred: true, complete: 210, latency: 10},
			{api: "ucp_tag_send_nbx", dir: DirSend, transport: "unknown", reason: transportSeen, complete: 310, latency: 10}}},
		{"an interface opened before the agent looked", func(t *testing.T) []*event.Call {
			return []*event.Call{ucpCall(t, "ucp_put_nbx", 100, 150, 0, 0xe1, 0xa0)}
		}, []want{{api: "ucp_put_nbx", dir: DirRDMAWrite, transport: "tcp", reason: ifaceUnseen, complete: 150, latency: 50}}},
		{"a request never freed goes out at exit, without a completion", func(t *testing.T) []*event.Call {
			exit := &event.Call{Kind: event.KindExit, PID: testPID}
			return []*event.Call{ifaceOpen(t, 0xa0, "tcp", "lo"), ucpCall(t, "ucp_put_nbx", 100, 120, 0x5000, 0xe1, 0xa0), exit}
		}, []want{{api: "ucp_put_nbx", dir: DirRDMAWrite, transport: "tcp", device: "lo"}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var got []Transfer
			e := NewEngine(Config{Sink: SinkFunc(func(x *Transfer) { got = append(got, *x) })})
			for _, call := range c.calls(t) {
				e.Handle(call)
			}
			e.Flush()
			if len(got) != len(c.want) {
				t.Fatalf("%d records, want %d: %+v", len(got), len(c.want), got)
			}
			for i, w := range c.want {
				x := got[i]
				errName := ""
				if x.Error != nil {
					errName = x.Error.Name
				}
				g := want{x.API, x.Direction, x.Transport, x.NetDevice, x.TransportReason, x.TransportInferred, x.CompleteNs, x.LatencyNs, errName}
				if g != w {
					t.Errorf("record %d:\n got %+v\nwant %+v", i, g, w)
				}
				if x.Bytes != 1<<20 || !x.Op.IsXfer() {
					t.Errorf("record %d: %d bytes, op %s", i, x.Bytes, x.Op)
				}
			}
		})
	}
}

// The count a UCP call posts is in elements of its datatype: contiguous
// ones of a size, or an iov (count is entries: bytes unknown).
func TestUCXBytesOfDatatype(t *testing.T) {
	for _, c := range []struct {
		datatype, count, bytes uint64
		unknown                bool
	}{
		{8, 4096, 4096, false},       // ucp_dt_make_contig(1)
		{4 << 3, 1024, 4096, false},  // ucp_dt_make_contig(4)
		{2, 3, 0, true},              // ucp_dt_make_iov()
		{0x7f0000001003, 1, 0, true}, // a generic datatype's handle
	} {
		var got []Transfer
		e := NewEngine(Config{Sink: SinkFunc(func(x *Transfer) { got = append(got, *x) })})
		call := ucpCall(t, "ucp_put_nbx", 100, 110, 0, 0xe1, 0)
		call.Bytes, call.Xfer.Datatype = c.count, c.datatype
		e.Handle(call)
		if len(got) != 1 || got[0].Bytes != c.bytes || got[0].BytesUnknown != c.unknown {
			t.Errorf("datatype %#x count %d: %+v, want %d bytes (unknown %v)", c.datatype, c.count, got, c.bytes, c.unknown)
		}
	}
}

// The local buffer's memory: what the request says, what the CUDA
// registry placed, what ucp_mem_map mapped; unknown otherwise.
func TestUCXLocalMemory(t *testing.T) {
	for _, c := range []struct {
		name  string
		setup func(t *testing.T) []*event.Call
		mask  uint32
		mtype uint32
		want  event.MemKind
	}{
		{"nothing known", nil, 0, 0, event.MemUnknown},
		{"the request says CUDA", nil, ucpOpFieldMemoryType, ucsMemCUDA, event.MemDevice},
		{"the request says host: not more than that", nil, ucpOpFieldMemoryType, ucsMemHost, event.MemUnknown},
		{"mapped with ucp_mem_map", func(t *testing.T) []*event.Call {
			m := mem(t, "ucp_mem_map", 1, 10, 11, 0x7000, 1<<21)
			return []*event.Call{m}
		}, 0, 0, event.MemRegistered},
		{"mapped with ucp_mem_map as CUDA memory", func(t *testing.T) []*event.Call {
			m := mem(t, "ucp_mem_map", 1, 10, 11, 0x7000, 1<<21)
			m.Xfer.ParamMask, m.Xfer.MemType = ucpMemMapFieldMemoryType, ucsMemCUDA
			return []*event.Call{m}
		}, 0, 0, event.MemDevice},
		{"pinned by CUDA", func(t *testing.T) []*event.Call {
			return []*event.Call{mem(t, "cuMemHostRegister_v2", 1, 10, 11, 0x7000, 1<<21)}
		}, 0, 0, event.MemPinned},
	} {
		t.Run(c.name, func(t *testing.T) {
			var got []Transfer
			e := NewEngine(Config{Sink: SinkFunc(func(x *Transfer) {
				if x.Op.IsXfer() {
					got = append(got, *x)
				}
			})})
			e.ObservedFromStart(testPID)
			if c.setup != nil {
				for _, call := range c.setup(t) {
					e.Handle(call)
				}
			}
			call := ucpCall(t, "ucp_put_nbx", 100, 110, 0, 0xe1, 0)
			call.Xfer.ParamMask, call.Xfer.MemType = c.mask, c.mtype
			e.Handle(call)
			e.Flush()
			if len(got) != 1 || got[0].Src.Mem != c.want {
				t.Fatalf("%+v, want the local buffer %s", got, c.want)
			}
		})
	}
}

// Requests waiting for their release are bounded: at the cap the oldest
// goes out without a completion, counted.
func TestUCXWaitsBounded(t *testing.T) {
	n := 0
	e := NewEngine(Config{Sink: SinkFunc(func(*Transfer) { n++ })})
	for i := range uint64(maxXferWaits + 10) {
		e.Handle(ucpCall(t, "ucp_put_nbx", 100+i, 110+i, 0x10000+i*8, 0xe1, 0))
	}
	if s := e.XferStats(); n != 10 || s.WaitCapHits != 10 || s.Evicted != 10 || s.Waiting != maxXferWaits {
		t.Errorf("%d emitted, stats %+v", n, s)
	}
	e.Flush()
	if s := e.XferStats(); n != maxXferWaits+10 || s.Waiting != 0 {
		t.Errorf("%d emitted after flush, stats %+v", n, s)
	}
}
