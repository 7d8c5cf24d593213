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

	BatchIndex uint32
	BatchCount uint64
}

// Row returns the table row of a call event, or nil for process events.
func (c *Call) Row() *Probe {
	if (c.Kind != EventCall && c.Kind != EventBatchEntry) || int(c.Probe) >= len(Table) {
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
	case EventCall, EventBatchEntry:
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
	if c.Kind == EventBatchEntry {
		// lw_batch replaced args 0..2 with this entry's dst, src and size.
		c.Dst, c.Src, c.Bytes = a[0], a[1], a[2]
		c.BatchCount = arg(p.Args.Count)
	}
	return nil
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
	return c
}
