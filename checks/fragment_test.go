package checks

import (
	"strings"
	"testing"
	"time"

	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
)

// copies adds n back-to-back copies of one direction and size on one
// stream, starting at start ns, each taking 1 µs per 4 KiB (at least 1 µs).
func copies(w *Window, dir string, stream uint64, n int, size, start uint64) uint64 {
	dur := max(1000, size/4096*1000)
	for i := range uint64(n) {
		w.Transfer(&correlate.Transfer{PID: 7, Stream: stream, Op: event.OpCopy, Direction: dir, Bytes: size, HostMem: event.MemPinned,
			SubmitNs: start + i*dur, CompleteNs: start + (i+1)*dur})
	}
	return start + uint64(n)*dur
}

// Fragmentation is judged per direction (seed 000 L2→L1 #4): the shapes
// the old all-directions count got wrong, each with the findings it must
// give and the directions they name.
func TestFragmentationPerDirection(t *testing.T) {
	for _, tc := range []struct {
		name   string
		fill   func(w *Window)
		want   []string // subjects of the fragmented-copies findings
		detail []string // what the check's detail must say
	}{
		{"many small H2D copies", func(w *Window) {
			copies(w, correlate.DirH2D, 1, 2048, 4096, 1)
		}, []string{"pid 7 H2D"}, []string{"H2D: 2048 copies"}},
		{".item() reads next to large H2D loads", func(w *Window) {
			at := copies(w, correlate.DirH2D, 1, 64, 32<<20, 1) // 64 layer loads of 32 MiB
			copies(w, correlate.DirD2H, 2, 4096, 8, at)         // a scalar read per decode step
		}, nil, []string{"D2H: 4096 copies", "H2D: 64 copies"}},
		{"a D2H write-back in pieces next to large H2D loads", func(w *Window) {
			at := copies(w, correlate.DirH2D, 1, 64, 32<<20, 1)
			copies(w, correlate.DirD2H, 2, 300, 4096, at)
		}, []string{"pid 7 D2H"}, nil},
		{"mixed directions, neither many enough alone", func(w *Window) {
			at := copies(w, correlate.DirH2D, 1, 200, 4096, 1)
			copies(w, correlate.DirD2H, 2, 200, 4096, at) // 400 small copies together, 200 per direction
		}, nil, nil},
		{"mixed directions, small H2D and large D2H", func(w *Window) {
			at := copies(w, correlate.DirH2D, 1, 300, 4096, 1)
			copies(w, correlate.DirD2H, 2, 300, 8<<20, at)
		}, []string{"pid 7 H2D"}, nil},
		{"small copies in both directions", func(w *Window) {
			at := copies(w, correlate.DirH2D, 1, 300, 4096, 1)
			copies(w, correlate.DirD2H, 2, 300, 16<<10, at)
		}, []string{"pid 7 D2H", "pid 7 H2D"}, nil},
		{"small D2D copies stay in GPU memory", func(w *Window) {
			copies(w, correlate.DirD2D, 1, 2048, 4096, 1)
		}, nil, []string{"D2D: 2048 copies", "not judged"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := NewWindow()
			tc.fill(w)
			c := checkByName(t, windowChecks(w, "pid 7", 7), CheckFragmentation)
			var got []string
			for _, f := range c.Findings {
				got = append(got, f.Subject)
			}
			if strings.Join(got, ",") != strings.Join(tc.want, ",") {
				t.Errorf("findings %v, want %v; detail %s", got, tc.want, c.Detail)
			}
			for _, d := range tc.detail {
				if !strings.Contains(c.Detail, d) {
					t.Errorf("detail %q lacks %q", c.Detail, d)
				}
			}
		})
	}
}

// link-underused names small copies as the likelier bottleneck of a lane
// only from the copies of that lane's direction.
func TestLaneFactsCountTheLaneDirection(t *testing.T) {
	w := NewWindow()
	at := copies(w, correlate.DirH2D, 1, 64, 32<<20, 1)
	copies(w, correlate.DirD2H, 2, 4096, 4096, at)
	gpuOf := func(uint32) string { return "0000:17:00.0" }
	if f := w.LaneFacts("0000:17:00.0", Inbound, gpuOf, time.Second); f.All != 64 || f.SmallCopies != 0 {
		t.Errorf("inbound lane counts %d copies, %d small: want the 64 large H2D only", f.All, f.SmallCopies)
	}
	if f := w.LaneFacts("0000:17:00.0", Outbound, gpuOf, time.Second); f.All != 4096 || f.SmallCopies != 4096 {
		t.Errorf("outbound lane counts %d copies, %d small: want the 4096 small D2H", f.All, f.SmallCopies)
	}
}
