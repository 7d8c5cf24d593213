package probes

import (
	"fmt"
	"unsafe"
)

// EventKind says what produced an Event.
type EventKind uint8

const (
	EventCall       EventKind = 1 // a probed call (see Call.Probe)
	EventBatchEntry EventKind = 2 // one entry of a batch copy
	EventExec       EventKind = 3 // a process replaced its image
	EventExit       EventKind = 4 // a process exited
	EventWR         EventKind = 5 // one work request of a post_send/post_recv chain
	EventWC         EventKind = 6 // one completion returned by poll_cq
)

// Call is one decoded probe hit: the raw arguments already mapped to what
// the call means through its Table row. Fields a call does not have are zero.
type Call struct {
	Kind       EventKind
	Probe      uint16 // row of Table
	PID, TID   uint32
	Time       uint64 // CLOCK_MONOTONIC ns at entry
	ReturnTime uint64 // at return, 0 for entry-only probes
	Ret        uint64 // return code (cudaError_t / CUresult), valid when ReturnTime != 0

	Dst, Src uint64
	Bytes    uint64
	CopyKind CopyKind // direction stated by the call, or its fixed direction
	Stream   uint64
	Event    uint64
	Ptr      uint64 // range start (register, free) or the allocated pointer (allocs)
	Size     uint64
	Flags    uint64

	BatchIndex uint32 // position in a batch copy, a WR chain or a poll's completions
	BatchCount uint64

	RDMA RDMA // verbs and provider events
}

// RDMA is what a verbs or provider event carries (see bpf/lanewatch.h).
type RDMA struct {
	Context    uint64 // struct ibv_context * (OpVerbsContext)
	MR         uint64 // struct ibv_mr * (register: the result; deregister: the argument)
	QP, CQ     uint64 // object pointers
	QPNum      uint32
	WRID       uint64
	Opcode     uint32 // enum ibv_wr_opcode for WRs, enum ibv_wc_opcode for completions
	SendFlags  uint32
	Status     uint32 // enum ibv_wc_status
	RemoteAddr uint64
	RKey, LKey uint32
	Imm        uint32
	NumSGE     uint32
	WCFlags    uint32
	Local      uint64 // first SGE's address
}

// Row returns the table row of a call event, or nil for process events.
func (c *Call) Row() *Probe {
	if c.Kind == EventExec || c.Kind == EventExit || int(c.Probe) >= len(Table) {
		return nil
	}
	return &Table[c.Probe]
}

// EventSize is the size of one ring buffer record.
const EventSize = int(unsafe.Sizeof(lanewatchLwEvent{}))

// Decode turns one ring buffer record into a Call. It does not allocate.
func Decode(raw []byte, c *Call) error {
	if len(raw) < EventSize {
		return fmt.Errorf("short event: %d bytes, want %d", len(raw), EventSize)
	}
	// The record is the C struct byte for byte (generated mirror, host layout).
	ev := (*lanewatchLwEvent)(unsafe.Pointer(&raw[0]))
	*c = Call{
		Kind:       EventKind(ev.Kind),
		Probe:      ev.Probe,
		PID:        ev.Pid,
		TID:        ev.Tid,
		Time:       ev.TsNs,
		ReturnTime: ev.RetTsNs,
		Ret:        ev.Ret,
		BatchIndex: ev.BatchIndex,
	}
	switch c.Kind {
	case EventExec, EventExit:
		return nil
	case EventCall, EventBatchEntry, EventWR, EventWC:
	default:
		return fmt.Errorf("unknown event kind %d", ev.Kind)
	}
	if int(ev.Probe) >= len(Table) {
		return fmt.Errorf("event for probe %d, table has %d rows", ev.Probe, len(Table))
	}
	p := &Table[ev.Probe]
	a := &ev.Args
	arg := func(i int) uint64 {
		if i < 0 || i >= len(a) {
			return 0
		}
		return a[i]
	}
	c.Dst, c.Src, c.Bytes = arg(p.Args.Dst), arg(p.Args.Src), arg(p.Args.Bytes)
	if p.Args.Height >= 0 {
		c.Bytes *= arg(p.Args.Height)
	}
	c.CopyKind = p.Kind
	if p.Kind == kindFromArg {
		c.CopyKind = CopyKind(arg(p.Args.Kind))
	}
	c.Stream, c.Event, c.Flags = arg(p.Args.Stream), arg(p.Args.Event), arg(p.Args.Flags)
	c.Ptr, c.Size = arg(p.Args.Ptr), arg(p.Args.Size)
	if p.Out {
		c.Ptr = ev.Out // the value the call wrote through its out pointer
	}
	switch c.Kind {
	case EventWR:
		decodeWR(ev, c)
		return nil
	case EventWC:
		decodeWC(ev, c)
		return nil
	}
	if p.Layer == LayerVerbs {
		decodeVerbs(p, ev, c)
	}
	if c.Kind == EventBatchEntry {
		// lw_batch replaced args 0..2 with this entry's dst, src and size.
		c.Dst, c.Src, c.Bytes = a[0], a[1], a[2]
		c.BatchCount = arg(p.Args.Count)
	}
	return nil
}

// decodeWR reads the slots lw_post_send/lw_post_recv fill (enum lw_wr_arg).
func decodeWR(ev *lanewatchLwEvent, c *Call) {
	a := &ev.Args
	c.Dst, c.Src, c.Bytes, c.Ptr, c.Size = 0, 0, a[2], 0, 0
	c.RDMA = RDMA{
		QP: a[0], WRID: a[1], Opcode: uint32(a[3]), SendFlags: uint32(a[3] >> 32),
		RemoteAddr: a[4], RKey: uint32(a[5]), Imm: uint32(a[5] >> 32),
		Local: a[6], LKey: uint32(a[7]), NumSGE: uint32(a[7] >> 32), QPNum: uint32(a[8]),
	}
}

// decodeWC reads the slots lw_poll_cq_return fills (enum lw_wc_arg).
func decodeWC(ev *lanewatchLwEvent, c *Call) {
	a := &ev.Args
	c.Dst, c.Src, c.Ptr, c.Size = 0, 0, 0, 0
	c.Bytes = uint64(uint32(a[3]))
	c.RDMA = RDMA{
		CQ: a[0], WRID: a[1], Status: uint32(a[2]), Opcode: uint32(a[2] >> 32),
		Imm: uint32(a[3] >> 32), QPNum: uint32(a[4]), WCFlags: uint32(a[4] >> 32),
	}
}

// decodeVerbs fills the verbs results: a new MR's pointer and keys, the
// context a verbs object belongs to.
func decodeVerbs(p *Probe, ev *lanewatchLwEvent, c *Call) {
	switch p.Op {
	case OpMRRegister:
		c.RDMA.MR = ev.Ret
		if ev.Ret != 0 {
			c.RDMA.LKey, c.RDMA.RKey = uint32(ev.Out), uint32(ev.Out>>32)
		}
	case OpVerbsContext:
		c.RDMA.Context = ev.Ret // ibv_open_device returns it
		if p.OutRet {
			c.RDMA.Context = ev.Out // the first field of a new CQ or QP
		}
	case OpMRDeregister:
		c.RDMA.MR = c.Ptr
	}
}

// Cookie packs what the BPF program needs to know about an attach point:
// the probe id, how many arguments to read, which one is an out pointer and
// how far the stack pointer has moved between the symbol and the probe site.
func Cookie(id int, spDelta int) uint64 {
	p := &Table[id]
	c := uint64(id) | uint64(p.NArgs)<<16 | uint64(spDelta)<<32
	if p.Out {
		c |= uint64(p.Args.Ptr+1) << 24
	}
	if p.OutRet {
		c |= 1<<40 | uint64(p.OutOff)<<48
	}
	return c
}
