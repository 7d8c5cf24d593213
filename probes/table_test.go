package probes

import (
	"reflect"
	"strings"
	"testing"
	"unsafe"

	"github.com/lanewatch/lanewatch/event"
)

// Every argument a row names is one its program reads, and a row that
// copies a string at return leaves the slots the copy lands in unread.
func TestTableArgsWithinNArgs(t *testing.T) {
	for id, p := range Table {
		v := reflect.ValueOf(p.Args)
		for i := 0; i < v.NumField(); i++ {
			idx := int(v.Field(i).Int())
			filled := p.Program == ProgCopy2D || p.Program == ProgUCPMemMap || // lw_copy2d_enter, lw_ucp_mem_map_enter fill their slots
				p.Program == ProgFabricMsg || p.Program == ProgFabricRMAMsg || // and lw_fabric_{,rma_}msg_enter
				p.Program == ProgLaunchEx && idx == int(lanewatchLwLaunchArgLW_LAUNCH_STREAM) // lw_launch_ex_enter too
			if idx >= p.NArgs && !filled {
				t.Errorf("row %d %s: %s is argument %d, the program reads %d", id, p.Symbol, v.Type().Field(i).Name, idx, p.NArgs)
			}
		}
		if p.OutStr && (!p.Out || p.NArgs > int(lanewatchLwOutstrLW_OUTSTR_ARG)) {
			t.Errorf("row %d %s: a string copy needs an out pointer and args %d.. free (reads %d)", id, p.Symbol, lanewatchLwOutstrLW_OUTSTR_ARG, p.NArgs)
		}
	}
}

// The device and context rows: one per entry point NVIDIA's 535 and 550
// drivers export under the name the runtime resolves (the _v2 forms of
// push, pop and destroy), each reporting at return with its out pointer.
func TestContextRows(t *testing.T) {
	want := map[string]event.Op{
		"cuDevicePrimaryCtxRetain": event.OpCtxRetain,
		"cuCtxCreate_v2":           event.OpCtxCreate, "cuCtxCreate_v3": event.OpCtxCreate, "cuCtxCreate_v4": event.OpCtxCreate,
		"cuCtxSetCurrent": event.OpCtxSetCurrent, "cuCtxPushCurrent_v2": event.OpCtxPush,
		"cuCtxPopCurrent_v2": event.OpCtxPop, "cuCtxDestroy_v2": event.OpCtxDestroy,
		"cuDeviceGetPCIBusId": event.OpDeviceBusID,
	}
	for sym, op := range want {
		c, ok := Template(sym)
		if !ok || c.Op != op || c.Layer != event.LayerDriver || !c.Returns {
			t.Errorf("%s: %+v, %v", sym, c, ok)
		}
	}
	for _, p := range Table {
		if p.Op.IsContext() && want[p.Symbol] == 0 {
			t.Errorf("context row %s not checked here", p.Symbol)
		}
	}
}

// rawEvent lays out a struct lw_event as the ring buffer delivers it.
func rawEvent(probe int, args [9]uint64, out, ret uint64) []byte {
	ev := lanewatchLwEvent{Kind: uint8(lanewatchLwEventKindLW_EV_CALL), Probe: uint16(probe), Pid: 7, Tid: 8,
		TsNs: 100, RetTsNs: 200, Ret: ret, Out: out, Args: args}
	return unsafe.Slice((*byte)(unsafe.Pointer(&ev)), unsafe.Sizeof(ev))
}

func rowOf(t *testing.T, sym string) int {
	t.Helper()
	c, ok := Template(sym)
	if !ok {
		t.Fatalf("no row %s", sym)
	}
	return int(c.Probe)
}

// What a context call and a bus-id call decode to: the device from its
// register's low half, the context through the out pointer, the string
// from the two slots lw_call_return copied it into.
func TestDecodeContextCalls(t *testing.T) {
	var c event.Call
	// cuDevicePrimaryCtxRetain(&ctx, 3): a register holding 3 in its low half, junk above.
	if err := Decode(rawEvent(rowOf(t, "cuDevicePrimaryCtxRetain"), [9]uint64{0x7ffd1000, 0xdead_0000_0003}, 0x5555_0000_1230, 0), &c); err != nil {
		t.Fatal(err)
	}
	if c.Op != event.OpCtxRetain || c.Device != 3 || c.Ptr != 0x5555_0000_1230 || c.Failed() {
		t.Errorf("retain: %+v", c)
	}
	if err := Decode(rawEvent(rowOf(t, "cuCtxSetCurrent"), [9]uint64{0x5555_0000_1230}, 0, 0), &c); err != nil {
		t.Fatal(err)
	}
	if c.Op != event.OpCtxSetCurrent || c.Ptr != 0x5555_0000_1230 {
		t.Errorf("set current: %+v", c)
	}
	for _, s := range []string{"0000:3B:00.0", "00000000:3B:00.0", "0000:3b:00.0\x00\xff\xff"} {
		var args [9]uint64
		args[0], args[1], args[2] = 0x7ffd2000, 16, 1
		b := []byte(s)
		for i := 0; i < 16 && i < len(b); i++ {
			args[6+i/8] |= uint64(b[i]) << (8 * (i % 8))
		}
		if err := Decode(rawEvent(rowOf(t, "cuDeviceGetPCIBusId"), args, 0, 0), &c); err != nil {
			t.Fatal(err)
		}
		got := strings.TrimRight(string(c.BusID[:]), "\x00")
		if c.Op != event.OpDeviceBusID || c.Device != 1 || got != strings.TrimRight(s[:min(len(s), 16)], "\x00") {
			t.Errorf("bus id %q: device %d, %q", s, c.Device, got)
		}
	}
	// A row without a device argument decodes none.
	if err := Decode(rawEvent(rowOf(t, "cuMemAlloc_v2"), [9]uint64{1, 2, 3}, 0x1000, 0), &c); err != nil || c.Device != 0 {
		t.Errorf("alloc: device %d, %v", c.Device, err)
	}
}

// The cookie asks for the string copy on the bus-id row only.
func TestCookieOutStr(t *testing.T) {
	bit := uint64(1) << lanewatchLwCookieShiftLW_COOKIE_OUTSTR_SHIFT
	for id, p := range Table {
		if got := Cookie(id, 0)&bit != 0; got != p.OutStr {
			t.Errorf("row %d %s: OUTSTR %v, OutStr %v", id, p.Symbol, got, p.OutStr)
		}
	}
}

// The caller flags: classified by the probe, or left to the agent when
// the probe could not look (the process's mmap lock was busy).
func TestDecodeCallerFlags(t *testing.T) {
	for _, f := range []struct {
		flags           uint8
		via, unresolved bool
	}{
		{0, false, false},
		{uint8(lanewatchLwEventFlagLW_F_VIA_RUNTIME), true, false},
		{uint8(lanewatchLwEventFlagLW_F_CALLER_UNRESOLVED), false, true},
	} {
		ev := lanewatchLwEvent{Kind: uint8(lanewatchLwEventKindLW_EV_CALL), Flags: f.flags, Probe: uint16(rowOf(t, "cuMemcpyHtoDAsync_v2")),
			Pid: 7, Tid: 8, TsNs: 100, RetTsNs: 200, Caller: 0x7f00_1234}
		var c event.Call
		if err := Decode(unsafe.Slice((*byte)(unsafe.Pointer(&ev)), unsafe.Sizeof(ev)), &c); err != nil {
			t.Fatal(err)
		}
		if c.ViaRuntime != f.via || c.CallerUnresolved != f.unresolved || c.Caller != 0x7f00_1234 {
			t.Errorf("flags %#x: via %v unresolved %v caller %#x", f.flags, c.ViaRuntime, c.CallerUnresolved, c.Caller)
		}
	}
}
