package correlate

import (
	"fmt"
	"strings"
	"testing"
)

const ms = uint64(1e6)

// queued is a flow of n copies of size bytes submitted together at start
// and proven done one after another every each ns (a stream drained copy
// by copy, or a queue pair's completions).
func queued(name string, start uint64, n int, bytes, each uint64) Flow {
	f := Flow{Name: name}
	for i := 1; i <= n; i++ {
		f.Spans = append(f.Spans, Span{Start: start, End: start + uint64(i)*each, Bytes: bytes})
	}
	return f
}

// synced is a flow of copies each submitted and synchronised on its own,
// back to back from start.
func synced(name string, start uint64, n int, bytes, each uint64) Flow {
	f := Flow{Name: name}
	for i := range n {
		s := start + uint64(i)*each
		f.Spans = append(f.Spans, Span{Start: s, End: s + each, Bytes: bytes})
	}
	return f
}

func judge(t *testing.T, l LinkTraffic) (*Finding, Overlap) {
	t.Helper()
	if l.Segment == "" {
		l.Segment, l.Direction = "PCIe link of GPU 0000:17:00.0", "inbound"
	}
	o := MeasureOverlap(l)
	return SameDirectionOverlap(o), o
}

// The shapes of issue 11 on a 4 GB/s lane (4 MiB per ms): 1 MiB moves in
// 0.25 ms alone, 0.5 ms while another flow shares the lane.
func TestSameDirectionOverlapShapes(t *testing.T) {
	const mib = uint64(1 << 20)
	// Two flows in alternating phases: A, then B, then A, then B. Each
	// flow's first-to-last interval covers the other's phases, but they
	// are never in flight together.
	alternating := []Flow{{Name: "pid 1 stream 0xa H2D"}, {Name: "pid 1 stream 0xb H2D"}}
	for phase := range 4 {
		f := &alternating[phase%2]
		f.Spans = append(f.Spans, synced("", uint64(phase)*20*ms, 64, mib, ms/4).Spans...)
	}
	// Sixteen streams sharing the lane evenly, each far under 10% of it.
	var sixteen []Flow
	for i := range 16 {
		sixteen = append(sixteen, queued(fmt.Sprintf("pid 1 stream %#x H2D", 0x10+i), 0, 16, mib, 4*ms))
	}
	cases := []struct {
		name  string
		l     LinkTraffic
		fires bool
		text  string // in the finding's evidence, or the measure's text
	}{
		{"two flows never in flight together", LinkTraffic{CapacityGBs: 4, Flows: alternating}, false, "never two at once"},
		{"a big flow and a trickle of 4 KiB copies", LinkTraffic{CapacityGBs: 4, Flows: []Flow{
			queued("pid 1 stream 0xa H2D", 0, 64, mib, ms/4),
			synced("pid 1 stream 0xb H2D", ms, 4, 4096, ms/10), // each waits 0.1 ms behind the big flow's chunks
		}}, false, "never two at once"},
		{"a big flow and a trickle proven done only at the end", LinkTraffic{CapacityGBs: 4, Flows: []Flow{
			queued("pid 1 stream 0xa H2D", 0, 64, mib, ms/4),
			queued("pid 1 stream 0xb H2D", ms, 4, 4096, 15*ms), // in flight 15 to 60 ms, 4 KiB each
		}}, false, "never two at once"},
		{"two saturating streams of one process", LinkTraffic{CapacityGBs: 4, Flows: []Flow{
			queued("pid 1 stream 0xa H2D", 0, 64, mib, ms/2),
			queued("pid 1 stream 0xb H2D", 0, 64, mib, ms/2),
		}}, true, "pid 1 stream 0xb H2D: 64 MiB, 2.10 GB/s"},
		{"two processes saturating one lane", LinkTraffic{CapacityGBs: 4, Flows: []Flow{
			queued("pid 1 stream 0xa H2D", 0, 64, mib, ms/2),
			queued("pid 2 stream 0xa H2D", ms/4, 64, mib, ms/2),
		}}, true, "pid 2 stream 0xa H2D"},
		// seed 000 L2→L1 #5: a PD receive lands on the inbound lane while
		// HiCache loads the next layers.
		{"an RDMA receive and H2D on the inbound lane", LinkTraffic{CapacityGBs: 4, Flows: []Flow{
			queued("pid 1 stream 0xa H2D", 0, 64, mib, ms/2),
			synced("pid 2 QP 7 WRITE_IMM", 0, 64, mib, ms/2),
		}}, true, "pid 2 QP 7 WRITE_IMM"},
		{"sixteen equal streams", LinkTraffic{CapacityGBs: 4, Flows: sixteen}, true, "16 flows"},
		{"overlap for a tenth of the time in flight", LinkTraffic{CapacityGBs: 4, Flows: []Flow{
			synced("pid 1 stream 0xa H2D", 0, 64, mib, ms/2),
			synced("pid 1 stream 0xb H2D", 15*ms, 8, mib, ms/2), // 4 ms of the 32 in flight
		}}, false, "contending for 4ms (12%)"},
		{"capacity unknown", LinkTraffic{Flows: []Flow{
			queued("pid 1 stream 0xa H2D", 0, 64, mib, ms/2),
			queued("pid 1 stream 0xb H2D", 0, 64, mib, ms/2),
		}}, false, "capacity unknown"},
		{"lane far from saturated", LinkTraffic{CapacityGBs: 32, Flows: []Flow{
			queued("pid 1 stream 0xa H2D", 0, 64, mib, ms/2),
			queued("pid 1 stream 0xb H2D", 0, 64, mib, ms/2),
		}}, false, "of 32.00 GB/s"},
		{"contention a sliver of a long window", LinkTraffic{CapacityGBs: 4, WindowNs: 10_000 * ms, Flows: []Flow{
			queued("pid 1 stream 0xa H2D", 0, 4, mib, ms/2),
			queued("pid 1 stream 0xb H2D", 0, 4, mib, ms/2),
		}}, false, "contending for 2ms"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f, o := judge(t, c.l)
			if (f != nil) != c.fires {
				t.Fatalf("fired %v, want %v: %s %+v", f != nil, c.fires, o.Text(), f)
			}
			text := o.Text()
			if f != nil {
				text = f.Summary + "; " + strings.Join(f.Evidence, "; ")
			}
			if !strings.Contains(text, c.text) {
				t.Errorf("%q lacks %q", text, c.text)
			}
		})
	}
}

// Transfers without a proven completion have no time in flight: they are
// counted and said, never placed in time.
func TestSameDirectionOverlapUntimed(t *testing.T) {
	const mib = uint64(1 << 20)
	untimed := Flow{Name: "pid 2 stream 0xc H2D", Untimed: 64, UntimedBytes: 64 * mib}
	f, o := judge(t, LinkTraffic{CapacityGBs: 4, Flows: []Flow{queued("pid 1 stream 0xa H2D", 0, 64, mib, ms/4), untimed}})
	if f != nil || o.Untimed != 64 || !strings.Contains(o.Text(), "64 transfers (64 MiB) without a proven completion") {
		t.Errorf("one timed flow and one untimed: %+v %s", f, o.Text())
	}
	f, o = judge(t, LinkTraffic{CapacityGBs: 4, Flows: []Flow{
		queued("pid 1 stream 0xa H2D", 0, 64, mib, ms/2), queued("pid 1 stream 0xb H2D", 0, 64, mib, ms/2), untimed}})
	if f == nil || !strings.Contains(strings.Join(f.Evidence, " "), "64 transfers (64 MiB) without a proven completion are not placed in time") {
		t.Errorf("two contending flows beside an untimed one: %+v", f)
	}
	if _, o := judge(t, LinkTraffic{CapacityGBs: 4, Flows: []Flow{untimed}}); !strings.Contains(o.Text(), "none with a proven completion") {
		t.Errorf("only untimed transfers: %s", o.Text())
	}
}

// With GPU counters, the demand is what they measured while the flows
// contended, not the window's average and not the probes' lower bound.
func TestSameDirectionOverlapCounters(t *testing.T) {
	const mib = uint64(1 << 20)
	// Two flows in flight together for 40 ms whose completions were proven
	// late: by the probes they moved 2 × 32 MiB in 40 ms, 1.68 GB/s.
	flows := []Flow{queued("pid 1 stream 0xa H2D", 10*ms, 1, 32*mib, 40*ms), queued("pid 2 QP 7 WRITE_IMM", 10*ms, 1, 32*mib, 40*ms)}
	every10ms := func(bps ...float64) []CounterSample {
		var out []CounterSample
		for i, r := range bps {
			out = append(out, CounterSample{Start: uint64(i) * 10 * ms, End: uint64(i+1) * 10 * ms, Bps: r})
		}
		return out
	}
	base := LinkTraffic{CapacityGBs: 4, Flows: flows}
	if f, o := judge(t, base); f != nil || o.DemandMeasured {
		t.Fatalf("probes alone: %+v %s", f, o.Text())
	}
	l := base
	l.Counters = every10ms(0, 3.9e9, 3.9e9, 3.9e9, 3.9e9, 0, 0, 0, 0, 0) // saturated while they overlap, idle after
	f, o := judge(t, l)
	if f == nil || !o.DemandMeasured || o.DemandGBs != 3.9 || !strings.Contains(strings.Join(f.Evidence, " "), "from the GPU's PCIe counters") {
		t.Fatalf("counters during the overlap: %+v %s", f, o.Text())
	}
	// The window's average (1.56 GB/s over 100 ms) would not have fired.
	l.Counters = every10ms(0.2e9, 0.2e9, 0.2e9, 0.2e9, 0.2e9, 0, 0, 0, 0, 0)
	if f, o := judge(t, l); f != nil || !o.DemandMeasured {
		t.Errorf("counters say the lane was nearly idle: %+v %s", f, o.Text())
	}
	// One sample over the whole window cannot say what happened during the
	// overlap: the probes decide, and the evidence says why.
	l.Counters = []CounterSample{{Start: 0, End: 1000 * ms, Bps: 3.9e9}}
	if _, o := judge(t, l); o.DemandMeasured || !strings.Contains(o.CounterNote, "coarser than the 40ms of overlap") {
		t.Errorf("one coarse sample: %+v", o)
	}
}
