package probes

import (
	"fmt"
	"strings"
	"unsafe"

	"github.com/lanewatch/lanewatch/event"
)

// EventSize is the size of one ring buffer record (struct lw_event).
const EventSize = int(unsafe.Sizeof(lanewatchLwEvent{}))

// kinds maps the C event kinds (enum lw_event_kind) to the vocabulary's;
// an array, not a map: Decode runs for every event.
var kinds = func() (k [8]event.Kind) {
	k[lanewatchLwEventKindLW_EV_CALL] = event.KindCall
	k[lanewatchLwEventKindLW_EV_BATCH_ENTRY] = event.KindBatchEntry
	k[lanewatchLwEventKindLW_EV_EXEC] = event.KindExec
	k[lanewatchLwEventKindLW_EV_EXIT] = event.KindExit
	k[lanewatchLwEventKindLW_EV_WR] = event.KindWR
	k[lanewatchLwEventKindLW_EV_WC] = event.KindWC
	k[lanewatchLwEventKindLW_EV_NAME] = event.KindName
	return k
}()

// rowFacts is what every event of a table row carries besides its
// arguments, computed once so that Decode does not allocate.
type rowFacts struct {
	perThread, returns bool
}

var facts = func() []rowFacts {
	out := make([]rowFacts, len(Table))
	for i, p := range Table {
		out[i] = rowFacts{
			perThread: strings.HasSuffix(p.Symbol, "_ptsz") || strings.HasSuffix(p.Symbol, "_ptds"),
			returns: p.Program == ProgEntryReturn || p.Program == ProgBatch || p.Program == ProgCopy2D || p.Program == ProgProp ||
				p.Program == ProgName || p.Program == ProgLaunchEx || p.Program == ProgModifyQP ||
				p.Program == ProgUCP || p.Program == ProgUCTIface || p.Program == ProgUCPMemMap ||
				p.Program == ProgFabricMsg || p.Program == ProgFabricRMAMsg,
		}
	}
	return out
}()

// describe fills what the table says of row id: what the symbol is and the
// direction it fixes (a row whose direction is an argument gets it later).
func describe(c *event.Call, id uint16) {
	p := &Table[id]
	c.Probe, c.Symbol, c.Op, c.Layer, c.RuntimeAPI = id, p.Symbol, p.Op, p.Layer, p.Runtime
	c.PerThread, c.Returns = facts[id].perThread, facts[id].returns
	c.CopyKind = p.Kind
	if p.Kind == kindFromArg || p.Kind == kindFromTypes {
		c.CopyKind = 0
	}
}

// Template is a call of the row named symbol as the decoder describes it
// before reading arguments; false when the table has no such row. Tests and
// tools build calls from it.
func Template(symbol string) (event.Call, bool) {
	for i := range Table {
		if Table[i].Symbol == symbol {
			c := event.Call{Kind: event.KindCall}
			describe(&c, uint16(i))
			return c, true
		}
	}
	return event.Call{}, false
}

// Decode turns one ring buffer record into a Call, filling what the call
// means from its table row. It does not allocate.
func Decode(raw []byte, c *event.Call) error {
	if len(raw) < EventSize {
		return fmt.Errorf("short event: %d bytes, want %d", len(raw), EventSize)
	}
	// The record is the C struct byte for byte (generated mirror, host layout).
	ev := (*lanewatchLwEvent)(unsafe.Pointer(&raw[0]))
	var kind event.Kind
	if int(ev.Kind) < len(kinds) {
		kind = kinds[ev.Kind]
	}
	if kind == 0 {
		return fmt.Errorf("unknown event kind %d", ev.Kind)
	}
	*c = event.Call{
		Kind:       kind,
		Probe:      ev.Probe,
		PID:        ev.Pid,
		TID:        ev.Tid,
		Time:       ev.TsNs,
		ReturnTime: ev.RetTsNs,
		Ret:        ev.Ret,
		BatchIndex: ev.BatchIndex,
		LostBefore: ev.Flags&uint8(lanewatchLwEventFlagLW_F_LOST_BEFORE) != 0,
		LostAny:    ev.Flags&uint8(lanewatchLwEventFlagLW_F_LOST_ANY) != 0,
		Held:       ev.Flags&uint8(lanewatchLwEventFlagLW_F_HELD) != 0,
	}
	if kind == event.KindExec || kind == event.KindExit {
		return nil
	}
	if int(ev.Probe) >= len(Table) {
		return fmt.Errorf("event for probe %d, table has %d rows", ev.Probe, len(Table))
	}
	p := &Table[ev.Probe]
	describe(c, ev.Probe)
	a := &ev.Args
	if c.Held {
		c.HeldFile = [2]uint64{a[0], a[1]} // bpf/hold.bpf.c linker_event
	}
	if kind == event.KindName {
		wordBytes(c.NamePiece[:], a[:]) // lw_name_return put a piece of the name in args[0..]
		return nil
	}
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
	if p.Kind == kindFromArg || p.Kind == kindFromTypes {
		c.CopyKind = statedKind(p, arg(p.Args.Kind))
	}
	c.Caller = ev.Caller
	c.ViaRuntime = ev.Flags&uint8(lanewatchLwEventFlagLW_F_VIA_RUNTIME) != 0
	c.CallerUnresolved = ev.Flags&uint8(lanewatchLwEventFlagLW_F_CALLER_UNRESOLVED) != 0
	c.Stream, c.Event, c.Flags = arg(p.Args.Stream), arg(p.Args.Event), arg(p.Args.Flags)
	c.Ptr, c.Size = arg(p.Args.Ptr), arg(p.Args.Size)
	if p.Out {
		c.Ptr = ev.Out // the value the call wrote through its out pointer
	}
	if p.Args.Device >= 0 {
		c.Device = int32(arg(p.Args.Device)) // CUdevice is an int: the register's low half
	}
	c.Handle, c.Offset = arg(p.Args.Handle), arg(p.Args.Offset)
	if p.OutHandle {
		c.Handle = ev.Out // a new handle, pool or fd, written through the out pointer
	}
	if p.Program == ProgProp {
		// lw_prop_enter put the CUmemLocation there (0: not read).
		loc := a[lanewatchLwPropArgLW_PROP_LOCATION]
		c.Location = event.Location{Type: uint32(loc), ID: int32(uint32(loc >> 32))}
	}
	if p.OutStr {
		wordBytes(c.BusID[:], a[lanewatchLwOutstrLW_OUTSTR_ARG:]) // lw_call_return copied the string there
	}
	if p.Dims != DimsNone {
		decodeDims(p.Dims, a, c)
	}
	switch kind {
	case event.KindWR:
		decodeWR(ev, c)
		return nil
	case event.KindWC:
		decodeWC(ev, c)
		return nil
	}
	if p.Layer == event.LayerVerbs {
		decodeVerbs(p, ev, c)
	}
	if p.Layer == event.LayerUCP || p.Layer == event.LayerUCT {
		decodeUCX(p, ev, c)
	}
	if kind == event.KindBatchEntry {
		// lw_batch replaced args 0..2 with this entry's dst, src and size.
		c.Dst, c.Src, c.Bytes = a[0], a[1], a[2]
		c.BatchCount = arg(p.Args.Count)
	}
	return nil
}

// decodeDims reads a launch's grid and block dimensions (Probe.Dims).
func decodeDims(d Dims, a *[9]uint64, c *event.Call) {
	lo, hi := func(w uint64) uint32 { return uint32(w) }, func(w uint64) uint32 { return uint32(w >> 32) }
	switch d {
	case DimsArgs: // six unsigned ints: each argument's low half
		c.Grid = [3]uint32{lo(a[1]), lo(a[2]), lo(a[3])}
		c.Block = [3]uint32{lo(a[4]), lo(a[5]), lo(a[6])}
	case DimsDim3: // struct dim3 {x, y, z} by value: x|y<<32 in one register, z in the next
		c.Grid = [3]uint32{lo(a[1]), hi(a[1]), lo(a[2])}
		c.Block = [3]uint32{lo(a[3]), hi(a[3]), lo(a[4])}
	case DimsConfig: // the config's first 24 bytes, copied by lw_launch_ex_enter
		const at = int(lanewatchLwLaunchArgLW_LAUNCH_DIMS)
		c.Grid = [3]uint32{lo(a[at]), hi(a[at]), lo(a[at+1])}
		c.Block = [3]uint32{hi(a[at+1]), lo(a[at+2]), hi(a[at+2])}
	}
}

// CUmemorytype values (cuda.h).
const (
	memTypeHost    = 1
	memTypeDevice  = 2
	memTypeArray   = 3
	memTypeUnified = 4
)

// kindOfTypes is the direction of a 2D copy from the memory type of each
// side; an array or unified side is resolved from the pointers (Default).
func kindOfTypes(src, dst uint32) event.CopyKind {
	switch {
	case src == memTypeHost && dst == memTypeDevice:
		return event.CopyHostToDevice
	case src == memTypeDevice && dst == memTypeHost:
		return event.CopyDeviceToHost
	case src == memTypeDevice && dst == memTypeDevice:
		return event.CopyDeviceToDevice
	case src == memTypeHost && dst == memTypeHost:
		return event.CopyHostToHost
	}
	return event.CopyDefault
}

// decodeWR reads the slots lw_post_send/lw_post_recv fill (enum lw_wr_arg).
func decodeWR(ev *lanewatchLwEvent, c *event.Call) {
	a := &ev.Args
	c.Dst, c.Src, c.Ptr, c.Size = 0, 0, 0, 0
	c.Bytes = a[lanewatchLwWrArgLW_WR_BYTES]
	op, keys, lkey := a[lanewatchLwWrArgLW_WR_OPCODE], a[lanewatchLwWrArgLW_WR_RKEY_IMM], a[lanewatchLwWrArgLW_WR_LKEY_NSGE]
	c.RDMA = event.RDMA{
		QP: a[lanewatchLwWrArgLW_WR_QP], WRID: a[lanewatchLwWrArgLW_WR_ID],
		Opcode: uint32(op), SendFlags: uint32(op >> 32),
		RemoteAddr: a[lanewatchLwWrArgLW_WR_REMOTE], RKey: uint32(keys), Imm: uint32(keys >> 32),
		Local: a[lanewatchLwWrArgLW_WR_LOCAL], LKey: uint32(lkey), NumSGE: uint32(lkey >> 32),
		QPNum: uint32(a[lanewatchLwWrArgLW_WR_QPNUM]),
	}
}

// decodeWC reads the slots lw_poll_cq_return fills (enum lw_wc_arg).
func decodeWC(ev *lanewatchLwEvent, c *event.Call) {
	a := &ev.Args
	c.Dst, c.Src, c.Ptr, c.Size = 0, 0, 0, 0
	status, lenImm, qpFlags := a[lanewatchLwWcArgLW_WC_STATUS_OP], a[lanewatchLwWcArgLW_WC_LEN_IMM], a[lanewatchLwWcArgLW_WC_QPNUM_FLAGS]
	c.Bytes = uint64(uint32(lenImm))
	c.RDMA = event.RDMA{
		CQ: a[lanewatchLwWcArgLW_WC_CQ], WRID: a[lanewatchLwWcArgLW_WC_ID],
		Status: uint32(status), Opcode: uint32(status >> 32),
		Imm: uint32(lenImm >> 32), QPNum: uint32(qpFlags), WCFlags: uint32(qpFlags >> 32),
	}
}

// decodeVerbs fills the verbs results: a new MR's pointer and keys, the
// context a verbs object belongs to.
func decodeVerbs(p *Probe, ev *lanewatchLwEvent, c *event.Call) {
	switch p.Op {
	case event.OpMRRegister:
		c.RDMA.MR = ev.Ret
		c.RDMA.Dmabuf = p.Args.Handle >= 0 // ibv_reg_dmabuf_mr names the fd
		if ev.Ret != 0 {
			c.RDMA.LKey, c.RDMA.RKey = uint32(ev.Out), uint32(ev.Out>>32)
		}
	case event.OpVerbsContext:
		c.RDMA.Context = ev.Ret // ibv_open_device returns it
		if p.OutRet {
			c.RDMA.Context = ev.Out // the first field of a new CQ or QP
		}
	case event.OpMRDeregister:
		c.RDMA.MR = c.Ptr
	case event.OpQPModify:
		decodeModifyQP(ev, c)
	}
}

// decodeUCX reads the slots lw_ucp_enter, lw_uct_lane and
// lw_uct_iface_enter fill (enum lw_ucp_arg, enum lw_uct_iface_arg).
func decodeUCX(p *Probe, ev *lanewatchLwEvent, c *event.Call) {
	a := &ev.Args
	switch p.Program {
	case ProgUCP:
		mask, lane := a[lanewatchLwUcpArgLW_UCP_PARAM_MASK], a[lanewatchLwUcpArgLW_UCP_LANE]
		c.Xfer = event.Xfer{Endpoint: a[lanewatchLwUcpArgLW_UCP_EP], Remote: a[lanewatchLwUcpArgLW_UCP_REMOTE],
			ParamMask: uint32(mask), MemType: uint32(mask >> 32), Datatype: a[lanewatchLwUcpArgLW_UCP_DATATYPE],
			Memh: a[lanewatchLwUcpArgLW_UCP_PARAM_MEMH], Iface: ev.Out, LaneCalls: uint32(lane >> 16)}
		if row := int(uint16(lane)); ev.Out != 0 && row < len(Table) {
			c.Xfer.LaneSymbol = Table[row].Symbol
		}
		c.Ptr = 0
	case ProgUCTIface:
		c.Xfer.Iface = ev.Out
		wordBytes(c.Xfer.Transport[:], a[lanewatchLwUctIfaceArgLW_UCT_IFACE_TL:])
		wordBytes(c.Xfer.Device[:], a[lanewatchLwUctIfaceArgLW_UCT_IFACE_DEV:])
	case ProgUCPMemMap:
		mask := a[lanewatchLwUcpMemMapArgLW_UMM_MASK]
		c.Xfer.ParamMask, c.Xfer.MemType = uint32(mask), uint32(mask>>32)
	}
}

// wordBytes fills dst with the bytes BPF copied into argument slots from
// memory: in memory order, as the host's (little-endian) words hold them.
func wordBytes(dst []byte, words []uint64) {
	for i := range dst {
		dst[i] = byte(words[i/8] >> (8 * (i % 8)))
	}
}

// decodeModifyQP reads the slots lw_modify_qp_enter fills (enum lw_qp_arg).
func decodeModifyQP(ev *lanewatchLwEvent, c *event.Call) {
	a := &ev.Args
	nums, av := a[lanewatchLwQpArgLW_QP_NUMS], a[lanewatchLwQpArgLW_QP_AV]
	c.RDMA.QP, c.RDMA.AttrMask = a[0], uint32(c.Flags)
	c.RDMA.QPNum, c.RDMA.DestQPNum = uint32(nums), uint32(nums>>32)
	wordBytes(c.RDMA.DGID[:], a[lanewatchLwQpArgLW_QP_DGID:])
	c.RDMA.DLID = uint16(av)           // ah_attr byte 24
	c.RDMA.IsGlobal = av>>40&0xff != 0 // ah_attr byte 29
}

// Cookie packs what the BPF program needs to know about an attach point
// (enum lw_cookie_shift): the probe id, how many arguments to read, which
// one is an out pointer and how far the stack pointer has moved between the
// symbol and the probe site.
func Cookie(id int, spDelta int) uint64 {
	p := &Table[id]
	c := uint64(id)<<lanewatchLwCookieShiftLW_COOKIE_PROBE_SHIFT |
		uint64(p.NArgs)<<lanewatchLwCookieShiftLW_COOKIE_NARGS_SHIFT |
		uint64(spDelta)<<lanewatchLwCookieShiftLW_COOKIE_SPDELTA_SHIFT
	if p.Out {
		c |= uint64(p.Args.Ptr+1) << lanewatchLwCookieShiftLW_COOKIE_OUTARG_SHIFT
	}
	if p.OutHandle {
		c |= uint64(p.Args.Handle+1) << lanewatchLwCookieShiftLW_COOKIE_OUTARG_SHIFT
	}
	if p.OutInt {
		c |= 1 << lanewatchLwCookieShiftLW_COOKIE_OUTINT_SHIFT
	}
	if p.OutRet {
		c |= 1<<lanewatchLwCookieShiftLW_COOKIE_OUTRET_SHIFT | uint64(p.OutOff)<<lanewatchLwCookieShiftLW_COOKIE_OUTOFF_SHIFT
	}
	if p.Program == ProgFabricMsg || p.Program == ProgFabricRMAMsg {
		c |= uint64(p.OutOff) << lanewatchLwCookieShiftLW_COOKIE_OUTOFF_SHIFT // the message's context (enum lw_fabric_msg_arg)
	}
	// The in-flight slot is the row's layer: a runtime call and the driver
	// call it makes are in flight together on one thread.
	c |= uint64(slotOf(p.Layer)) << lanewatchLwCookieShiftLW_COOKIE_SLOT_SHIFT
	if p.Layer == event.LayerDriver {
		c |= 1 << lanewatchLwCookieShiftLW_COOKIE_CALLER_SHIFT
	}
	if p.Op == event.OpLinkerUpdate {
		c |= 1 << lanewatchLwCookieShiftLW_COOKIE_WAKE_SHIFT
	}
	if p.OutStr {
		c |= 1 << lanewatchLwCookieShiftLW_COOKIE_OUTSTR_SHIFT
	}
	return c
}

// slotOf is the in-flight slot of a layer (LW_NSLOTS of them): calls of
// different layers may nest, calls of one layer do not.
func slotOf(l event.Layer) uint8 {
	switch l {
	case event.LayerRuntime:
		return 0
	case event.LayerDriver:
		return 1
	case event.LayerVerbs:
		return 2
	case event.LayerUCP, event.LayerUCT:
		// A UCT row keeps no call of its own: it notes its lane in the
		// UCP call it is nested in (lw_uct_lane).
		return 4
	case event.LayerFabric:
		// Its calls nest in themselves: the BPF programs skip those
		// (enum lw_slot).
		return uint8(lanewatchLwSlotLW_SLOT_NESTS)
	}
	return 3 // the RDMA provider (and ld.so, entry only)
}
