package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
)

func rules(v Verdict) map[string]int {
	out := map[string]int{}
	for _, f := range v.Findings {
		out[f.Rule]++
	}
	return out
}

// A window with pageable copies fires pageable-copy; the next, clean
// window fires nothing: findings are per window.
func TestEvaluatorWindows(t *testing.T) {
	place := func(uint32) Placement { return Placement{GPU: "ref-gpu0", InboundGBs: 4, OutboundGBs: 4} }
	e := NewEvaluator(EvaluatorConfig{Interval: time.Second, Place: place})
	start := time.Now()
	for i := range 3 {
		e.Transfer(&correlate.Transfer{PID: 10, API: "cudaMemcpy", Op: "copy", Direction: correlate.DirH2D, Bytes: 1 << 20,
			HostMem: event.MemPageable, SubmitNs: uint64(i) * 1e6, CompleteNs: uint64(i)*1e6 + 5e5})
	}
	e.Transfer(&correlate.Transfer{PID: 11, API: "cudaMemcpyAsync", Op: "copy", Direction: correlate.DirD2H, Bytes: 1 << 20,
		HostMem: event.MemPinned, SubmitNs: 1, CompleteNs: 1e6})
	v := e.Evaluate(start.Add(2 * time.Second))
	if got := rules(v); got["pageable-copy"] != 1 || len(got) != 1 {
		t.Errorf("first window findings %v, want pageable-copy once", got)
	}
	if len(v.Lanes) != 2 {
		t.Fatalf("lanes %+v, want inbound and outbound of ref-gpu0", v.Lanes)
	}
	for _, l := range v.Lanes {
		want := float64(3<<20) / v.Window.Seconds()
		if l.Direction == "outbound" {
			want = float64(1<<20) / v.Window.Seconds()
		}
		if l.GPU != "ref-gpu0" || l.Capacity != 4e9 || l.Demand != want {
			t.Errorf("lane %+v, want demand %v capacity 4e9", l, want)
		}
	}
	v = e.Evaluate(start.Add(3 * time.Second))
	if len(v.Findings) != 0 || len(v.Lanes) != 0 {
		t.Errorf("clean window: findings %v lanes %v", rules(v), v.Lanes)
	}
	if v.Window != time.Second {
		t.Errorf("second window lasted %v, want 1s", v.Window)
	}
}

// Many small copies make fragmented-copies; two streams saturating the
// inbound lane together make same-direction-overlap, which needs a known
// capacity.
func TestEvaluatorFragmentationAndOverlap(t *testing.T) {
	for _, tc := range []struct {
		name     string
		capacity float64
		want     map[string]int
	}{
		{"known capacity", 4, map[string]int{"fragmented-copies": 1, "same-direction-overlap": 1}},
		{"unknown capacity", 0, map[string]int{"fragmented-copies": 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			place := func(uint32) Placement { return Placement{GPU: "0000:17:00.0", InboundGBs: tc.capacity} }
			e := NewEvaluator(EvaluatorConfig{Place: place})
			for i := range 300 {
				for _, stream := range []uint64{1, 2} { // 2 × 4 KiB per µs = 8 GB/s on the inbound lane
					e.Transfer(&correlate.Transfer{PID: 7, Stream: stream, Op: "copy", Direction: correlate.DirH2D, Bytes: 4096,
						HostMem: event.MemPinned, SubmitNs: uint64(i) * 1000, CompleteNs: uint64(i+1) * 1000})
				}
			}
			got := rules(e.Evaluate(time.Now()))
			if len(got) != len(tc.want) {
				t.Errorf("findings %v, want %v", got, tc.want)
			}
			for r, n := range tc.want {
				if got[r] != n {
					t.Errorf("findings %v, want %v", got, tc.want)
				}
			}
		})
	}
}

func TestRefPlacement(t *testing.T) {
	root := t.TempDir()
	for pid, env := range map[string]string{
		"1": "PATH=/bin\x00LW_REF_GPU=gpu-decode\x00LW_REF_H2D_GBPS=2.5\x00",
		"2": "HOME=/root\x00LW_REF_D2H_GBPS=bad\x00",
	} {
		if err := os.MkdirAll(filepath.Join(root, pid), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, pid, "environ"), []byte(env), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for pid, want := range map[uint32]Placement{
		1: {GPU: "ref-gpu-decode", InboundGBs: 2.5, OutboundGBs: 4},
		2: {GPU: "ref-private", InboundGBs: 4, OutboundGBs: 4},
		3: {},
	} {
		if got := refPlacement(root, pid); got != want {
			t.Errorf("pid %d: %+v, want %+v", pid, got, want)
		}
	}
}

// A lane the counters saw nearly idle while a probed flow was in flight all
// window is reported, with the staging copy as the likelier bottleneck.
func TestLaneFactsUnderused(t *testing.T) {
	s := newSample()
	const sec = uint64(1e9)
	for i := uint64(0); i < 10; i++ { // ten pageable 1 MiB H2D copies back to back over 1 s
		s.Transfer(&correlate.Transfer{PID: 7, Direction: correlate.DirH2D, HostMem: event.MemPageable, Bytes: 1 << 20,
			SubmitNs: i * sec / 10, CompleteNs: (i + 1) * sec / 10})
	}
	f := s.laneFacts("ref-x", laneIn, func(uint32) string { return "ref-x" }, time.Second)
	if f.BusyFraction < 0.99 || f.PageableCopies != 10 || f.All != 10 {
		t.Fatalf("facts %+v", f)
	}
	f.MeasuredBps, f.CapacityBps = 10.5e6, 4e9
	if fd := correlate.LinkUnderused(f); fd == nil || !strings.Contains(strings.Join(fd.Evidence, " "), "CPU staging copy") {
		t.Errorf("finding %+v", fd)
	}
	if g := s.laneFacts("other-gpu", laneIn, func(uint32) string { return "ref-x" }, time.Second); g.BusyFraction != 0 || g.All != 0 {
		t.Errorf("another GPU's lane: %+v", g)
	}
}
