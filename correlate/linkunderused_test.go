package correlate

import (
	"strings"
	"testing"
)

func TestLinkUnderused(t *testing.T) {
	base := LaneFacts{GPU: "0000:18:00.0", Direction: "inbound", MeasuredBps: 20e9, CapacityBps: 63.02e9, BusyFraction: 0.95, All: 64}
	cases := []struct {
		name   string
		edit   func(*LaneFacts)
		fire   bool
		likely string
	}{
		{"queued and slow", func(*LaneFacts) {}, true, "copy engine"},
		{"pageable copies", func(f *LaneFacts) { f.PageableCopies = 32 }, true, "CPU staging copy"},
		{"fragmented", func(f *LaneFacts) { f.SmallCopies, f.All = 2048, 2048 }, true, "per-copy overhead"},
		{"link busy", func(f *LaneFacts) { f.MeasuredBps = 55e9 }, false, ""},
		{"nothing queued", func(f *LaneFacts) { f.BusyFraction = 0.1 }, false, ""},
		{"capacity unknown", func(f *LaneFacts) { f.CapacityBps = 0 }, false, ""},
		// trained down to Gen4 x8 (15.75 GB/s) and carrying most of it: the
		// link is the narrow segment, link-degraded says so
		{"link trained down and full", func(f *LaneFacts) { f.RunningBps, f.MeasuredBps = 15.75e9, 14e9 }, false, ""},
		// trained down, carrying under half even of that: still elsewhere
		{"link trained down, underused still", func(f *LaneFacts) { f.RunningBps, f.MeasuredBps = 31.5e9, 10e9 }, true, "copy engine"},
		{"running at its maximum", func(f *LaneFacts) { f.RunningBps = 63.02e9 }, true, "copy engine"},
	}
	for _, c := range cases {
		f := base
		c.edit(&f)
		got := LinkUnderused(f)
		if (got != nil) != c.fire {
			t.Errorf("%s: fired %v", c.name, got != nil)
			continue
		}
		if got != nil && !strings.Contains(strings.Join(got.Evidence, " "), c.likely) {
			t.Errorf("%s: evidence %q lacks %q", c.name, got.Evidence, c.likely)
		}
	}
}
