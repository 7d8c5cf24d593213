package agent

import (
	"cmp"
	"fmt"
	"slices"
	"testing"

	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/exporters"
	"github.com/lanewatch/lanewatch/probes"
)

// place puts each flow on its stream's lane: what the engine knows of a
// live process first, what it knew at the exit of a gone one, else an
// unknown GPU; the default streams (handles 0, 1, 2) as one; a process not
// traced nowhere.
func TestPlaceFlows(t *testing.T) {
	const a, b = "0000:3b:00.0", "0000:5e:00.0"
	h2d, d2h := event.CopyHostToDevice, event.CopyDeviceToHost
	flow := func(pid uint32, stream uint64, kind event.CopyKind, calls, bytes uint64) probes.Flow {
		return probes.Flow{PID: pid, Stream: stream, Kind: kind, Calls: calls, Bytes: bytes}
	}
	now := map[uint32]map[uint64]string{
		10: {0x5a: a, 0: b},
		11: {0x5a: b}, // pid reused: the live process's streams, not the exited one's
	}
	exited := map[uint32]map[uint64]string{
		11: {0x5a: a, 0x5b: a},
		12: {0x5c: b},
	}
	for _, tc := range []struct {
		name  string
		flows []probes.Flow
		want  []exporters.LaneCopies
	}{
		{"live streams", []probes.Flow{flow(10, 0x5a, h2d, 2, 128), flow(10, 0x5a, d2h, 1, 64)},
			[]exporters.LaneCopies{{GPU: a, Direction: correlate.DirD2H, Copies: 1, Bytes: 64}, {GPU: a, Direction: correlate.DirH2D, Copies: 2, Bytes: 128}}},
		{"default streams as one", []probes.Flow{flow(10, 0, h2d, 1, 1), flow(10, 1, h2d, 1, 2), flow(10, 2, h2d, 1, 4)},
			[]exporters.LaneCopies{{GPU: b, Direction: correlate.DirH2D, Copies: 3, Bytes: 7}}},
		{"now before exited", []probes.Flow{flow(11, 0x5a, h2d, 1, 8), flow(11, 0x5b, h2d, 1, 16)},
			[]exporters.LaneCopies{{GPU: a, Direction: correlate.DirH2D, Copies: 1, Bytes: 16}, {GPU: b, Direction: correlate.DirH2D, Copies: 1, Bytes: 8}}},
		{"a gone process's streams as it exited", []probes.Flow{flow(12, 0x5c, d2h, 3, 300)},
			[]exporters.LaneCopies{{GPU: b, Direction: correlate.DirD2H, Copies: 3, Bytes: 300}}},
		{"never placed: unknown GPU; cudaMemcpyDefault: unknown direction", []probes.Flow{flow(13, 0x5d, event.CopyDefault, 1, 1), flow(10, 0x99, h2d, 1, 2)},
			[]exporters.LaneCopies{{GPU: "", Direction: correlate.DirH2D, Copies: 1, Bytes: 2}, {GPU: "", Direction: correlate.DirUnknown, Copies: 1, Bytes: 1}}},
		{"not traced", []probes.Flow{flow(99, 0x5a, h2d, 1, 1)}, nil},
	} {
		totals := map[laneKey]*exporters.LaneCopies{}
		place(totals, tc.flows, now, exited, func(pid uint32) bool { return pid != 99 })
		var got []exporters.LaneCopies
		for _, l := range totals {
			got = append(got, *l)
		}
		slices.SortFunc(got, func(x, y exporters.LaneCopies) int {
			return cmp.Or(cmp.Compare(x.GPU, y.GPU), cmp.Compare(x.Direction, y.Direction))
		})
		if fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

// An exit keeps the engine's streams until a sweep finds the process
// gone; an exec's merge with the new image's; past the bound, none.
func TestLanesExit(t *testing.T) {
	l := newLanes()
	l.exit(1, map[uint64]string{0x5a: "x"})
	l.exit(1, map[uint64]string{0x5b: "y"}) // exec'd, then exited
	l.exit(2, nil)
	if fmt.Sprint(l.exited) != "map[1:map[90:x 91:y]]" {
		t.Errorf("exited %v", l.exited)
	}
	l.forget(map[uint32]bool{1: true})
	if len(l.exited) != 1 {
		t.Errorf("a live process's streams forgotten: %v", l.exited)
	}
	l.forget(map[uint32]bool{})
	if len(l.exited) != 0 {
		t.Errorf("a gone process's streams kept: %v", l.exited)
	}
	for pid := range uint32(maxExitedStreams + 10) {
		l.exit(pid, map[uint64]string{1: "x"})
	}
	if len(l.exited) != maxExitedStreams {
		t.Errorf("%d processes' streams kept, bound %d", len(l.exited), maxExitedStreams)
	}
}
