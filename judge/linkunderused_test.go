package judge

import (
	"testing"
	"time"

	"github.com/lanewatch/lanewatch/checks"
	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
)

// A lane the counters measured at a quarter of its capacity while copies
// were in flight the whole window is link-underused; the same lane
// measured near its capacity is not, and a lane no counter measured gets
// no check at all.
func TestUnderusedRule(t *testing.T) {
	const gpu = "0000:17:00.0"
	place := func(uint32) checks.Placement { return checks.Placement{GPU: gpu, InboundGBs: 25, OutboundGBs: 25} }
	for _, tc := range []struct {
		name     string
		measured float64 // bytes/s; 0: no counters
		checks   int
		fires    bool
	}{
		{"queued, a quarter of capacity", 6e9, 1, true},
		{"queued, near capacity", 24e9, 1, false},
		{"no counters", 0, 0, false},
	} {
		w := NewWindow(false)
		for i := range uint64(100) { // back to back on one stream: in flight the whole second
			w.Transfer(&correlate.Transfer{PID: 10, Stream: 0x10, Op: event.OpCopy, Direction: correlate.DirH2D, Bytes: 64 << 20,
				HostMem: event.MemPinned, SubmitNs: i * 1e7, CompleteNs: (i + 1) * 1e7, CompleteNear: true})
		}
		lane := LaneRate{GPU: gpu, Direction: checks.Inbound, Capacity: 25e9}
		if tc.measured > 0 {
			lane.Measured, lane.HasMeasured = tc.measured, true
		}
		j := underusedRule{}.Judge(w.Rotate(), &Env{Span: time.Second, Place: place, Lanes: []LaneRate{lane}})
		if len(j.Checks) != tc.checks {
			t.Fatalf("%s: %d checks, want %d: %+v", tc.name, len(j.Checks), tc.checks, j.Checks)
		}
		fired := len(j.Checks) == 1 && len(j.Checks[0].Findings) == 1 && j.Checks[0].Findings[0].Rule == "link-underused"
		if fired != tc.fires {
			t.Errorf("%s: fired %v, want %v: %+v", tc.name, fired, tc.fires, j.Checks)
		}
	}
}
