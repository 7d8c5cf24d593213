package correlate

import (
	"testing"

	"github.com/lanewatch/lanewatch/event"
)

func TestRegistryLookup(t *testing.T) {
	r := NewRegistry(0, 0)
	r.ObservedFromStart(1)
	r.AddPinned(1, 0x1000, 0x1000)
	r.AddPinned(1, 0x1000, 0x1000) // runtime and driver both report it
	r.AddPinned(1, 0x4000, 0x100)
	r.AddDevice(1, 0x10000, 0x1000)
	if n := len(r.procs[1].pinned); n != 2 {
		t.Fatalf("duplicate insert: %d pinned ranges, want 2", n)
	}
	for _, tc := range []struct {
		addr  uint64
		kind  event.MemKind
		start uint64
	}{
		{0xfff, event.MemPageable, 0},
		{0x1000, event.MemPinned, 0x1000},
		{0x1fff, event.MemPinned, 0x1000},
		{0x2000, event.MemPageable, 0},
		{0x40ff, event.MemPinned, 0x4000},
		{0x4100, event.MemPageable, 0},
		{0x10800, event.MemDevice, 0x10000},
	} {
		k, s := r.Lookup(1, tc.addr)
		if k != tc.kind || s != tc.start {
			t.Errorf("Lookup(%#x) = %s %#x, want %s %#x", tc.addr, k, s, tc.kind, tc.start)
		}
	}
	if k, _ := r.Lookup(2, 0x1000); k != event.MemUnknown {
		t.Errorf("unknown process: %s, want unknown", k)
	}
	r.RemovePinned(1, 0x1000)
	if k, _ := r.Lookup(1, 0x1800); k != event.MemPageable {
		t.Errorf("after unregister: %s, want pageable", k)
	}
	r.RemovePinned(1, 0x1000)
	if r.Stats().UnmatchedFrees != 1 {
		t.Errorf("unmatched frees = %d, want 1", r.Stats().UnmatchedFrees)
	}
	if a := testing.AllocsPerRun(100, func() { r.Lookup(1, 0x4010) }); a != 0 {
		t.Errorf("Lookup allocates %v times", a)
	}
}

func TestRegistryOverlapReplaces(t *testing.T) {
	r := NewRegistry(0, 0)
	r.ObservedFromStart(1)
	r.AddPinned(1, 0x1000, 0x1000)
	r.AddPinned(1, 0x3000, 0x1000)
	r.AddDevice(1, 0x5000, 0x1000)
	// A new mapping over all three: the old ones were freed unseen.
	r.AddPinned(1, 0x1800, 0x4000)
	m := r.procs[1]
	if len(m.pinned) != 1 || m.pinned[0] != (Range{0x1800, 0x5800}) || len(m.device) != 0 {
		t.Fatalf("pinned %v device %v", m.pinned, m.device)
	}
}

func TestRegistryObservationWindow(t *testing.T) {
	r := NewRegistry(0, 0)
	r.ObservedSince(1, []Range{{0x3000, 0x4000}, {0x1000, 0x2000}, {0x1800, 0x2800}})
	for _, tc := range []struct {
		addr uint64
		kind event.MemKind
	}{
		{0x0fff, event.MemPageable}, {0x1000, event.MemUnknown}, {0x27ff, event.MemUnknown}, {0x2800, event.MemPageable},
		{0x3000, event.MemUnknown}, {0x4000, event.MemPageable},
	} {
		if k, _ := r.Lookup(1, tc.addr); k != tc.kind {
			t.Errorf("Lookup(%#x) = %s, want %s", tc.addr, k, tc.kind)
		}
	}
	r.MarkLossy(1)
	if k, _ := r.Lookup(1, 0x5000); k != event.MemUnknown {
		t.Errorf("lossy: %s, want unknown", k)
	}
}

func TestRegistryCaps(t *testing.T) {
	r := NewRegistry(2, 1)
	r.ObservedFromStart(1)
	r.AddPinned(1, 0x1000, 0x100)
	r.AddPinned(1, 0x2000, 0x100)
	r.AddPinned(1, 0x2000, 0x100) // idempotent, not a cap hit
	r.AddPinned(1, 0x3000, 0x100)
	if got := r.Stats().RangeCapHits; got != 1 {
		t.Fatalf("range cap hits = %d, want 1", got)
	}
	// The lost range must not be reported pageable.
	if k, _ := r.Lookup(1, 0x3010); k != event.MemUnknown {
		t.Errorf("address of a dropped range: %s, want unknown", k)
	}
	r.AddPinned(2, 0x1000, 0x100)
	if got := r.Stats().ProcessCapHits; got != 1 {
		t.Fatalf("process cap hits = %d, want 1", got)
	}
}
