package agent

import (
	"math"
	"testing"
	"time"

	"github.com/lanewatch/lanewatch/checks"
	"github.com/lanewatch/lanewatch/collectors"
	"github.com/lanewatch/lanewatch/internal/sysfstest"
	"github.com/lanewatch/lanewatch/topology"
)

// reading is a GPU counter reading: cumulative bytes (inbound), the link's
// current generation and width, and its max (NVML's shape: the
// nvidia_smi_q samples' "PCIe Generation Max/Current", "Link Width").
func reading(at time.Duration, bytes uint64, gen, width int) collectors.GPUSnapshot {
	return collectors.GPUSnapshot{Time: time.Unix(1000, 0).Add(at), Source: "nvml", GPUs: []collectors.GPUReading{{
		BusID: "0000:01:00.0", UUID: "GPU-1", PCIeRxBytes: bytes, HasPCIeBytes: true,
		LinkGen: gen, MaxLinkGen: 4, LinkWidth: width, MaxLinkWidth: 16}}}
}

func TestLinkWatch(t *testing.T) {
	const gb = 1_000_000_000
	s := time.Second
	type r = collectors.GPUSnapshot
	for _, tt := range []struct {
		name     string
		readings []r
		want     *checks.LinkLoad
	}{
		// thamada_L4 at idle: Current 1, no traffic.
		{"idle at Gen1, no traffic", []r{reading(0, 0, 1, 16), reading(s, 0, 1, 16), reading(2*s, 0, 1, 16)}, nil},
		{"under load at Gen4", []r{reading(0, 0, 4, 16), reading(s, 10*gb, 4, 16), reading(2*s, 20*gb, 4, 16)},
			&checks.LinkLoad{GTs: 16, Width: 16, Bps: 10 * gb, Source: "nvml", MaxGTs: 16, MaxWidth: 16}},
		{"under load, trained down to Gen1", []r{reading(0, 0, 1, 16), reading(s, 3*gb, 1, 16), reading(2*s, 6*gb, 1, 16)},
			&checks.LinkLoad{GTs: 2.5, Width: 16, Bps: 3 * gb, Source: "nvml", MaxGTs: 16, MaxWidth: 16}},
		// A burst before the read, idle after it: the Gen1 read is idle, not
		// a degraded link.
		{"read just after a burst", []r{reading(0, 0, 4, 16), reading(s, 10*gb, 1, 16), reading(2*s, 10*gb, 1, 16)}, nil},
		{"read just before a burst", []r{reading(0, 0, 1, 16), reading(s, 0, 1, 16), reading(2*s, 10*gb, 4, 16)}, nil},
		// Readings a window apart say nothing about the moment of the read.
		{"neighbours too far apart", []r{reading(0, 0, 1, 16), reading(10*s, 30*gb, 1, 16), reading(20*s, 60*gb, 1, 16)}, nil},
		// Bursts: the best read under load wins.
		{"best read under load", []r{reading(0, 0, 1, 16), reading(s, 5*gb, 1, 16), reading(2*s, 15*gb, 4, 16), reading(3*s, 25*gb, 4, 16)},
			&checks.LinkLoad{GTs: 16, Width: 16, Bps: 10 * gb, Source: "nvml", MaxGTs: 16, MaxWidth: 16}},
		{"traffic under the busy threshold", []r{reading(0, 0, 1, 16), reading(s, 50e6, 1, 16), reading(2*s, 100e6, 1, 16)}, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			w := NewLinkWatch(3 * time.Second)
			for _, s := range tt.readings {
				w.Add(s)
			}
			got := w.Take()
			ld, ok := got["0000:01:00.0"]
			switch {
			case tt.want == nil && ok:
				t.Fatalf("a read under load: %+v", ld)
			case tt.want != nil && (!ok || ld != *tt.want):
				t.Fatalf("= %+v (%v), want %+v", ld, ok, *tt.want)
			}
			if len(w.Take()) != 0 {
				t.Error("Take did not start over")
			}
			if max := w.MaxGBs("0000:01:00.0"); math.Abs(max-topology.LinkGBs(16, 16)) > 1e-9 || w.MaxGBs("0000:02:00.0") != 0 {
				t.Errorf("MaxGBs = %v, want the Gen4 x16 max", w.MaxGBs("0000:01:00.0"))
			}
		})
	}
	// A rate-only source (nvmlDeviceGetPcieThroughput, over 20 ms at the
	// read) is judged by its own reading.
	w := NewLinkWatch(3 * time.Second)
	w.Add(collectors.GPUSnapshot{Time: time.Unix(1000, 0), Source: "nvml", GPUs: []collectors.GPUReading{{BusID: "0000:01:00.0",
		PCIeRxBps: 8e9, HasPCIeRate: true, LinkGen: 3, MaxLinkGen: 4, LinkWidth: 16, MaxLinkWidth: 16}}})
	if ld := w.Take()["0000:01:00.0"]; ld.GTs != 8 || ld.Bps != 8e9 {
		t.Errorf("rate-only reading: %+v", ld)
	}
}

// fakeCounters returns its readings in turn.
type fakeCounters struct{ s []collectors.GPUSnapshot }

func (f *fakeCounters) Sample() (collectors.GPUSnapshot, error) {
	s := f.s[0]
	f.s = f.s[1:]
	return s, nil
}
func (f *fakeCounters) Source() string { return "nvml" }
func (f *fakeCounters) Close() error   { return nil }

// Whoever reads watched counters feeds the watch; readings a few
// milliseconds apart (a scrape next to the evaluator's read) are dropped.
func TestWatchLinks(t *testing.T) {
	const gb = 1_000_000_000
	s := time.Second
	w := NewLinkWatch(3 * time.Second)
	c := WatchLinks(&fakeCounters{s: []collectors.GPUSnapshot{reading(0, 0, 4, 16), reading(10*time.Millisecond, 5*gb, 1, 16),
		reading(s, 10*gb, 4, 16), reading(2*s, 20*gb, 4, 16)}}, w)
	for range 4 {
		if _, err := c.Sample(); err != nil {
			t.Fatal(err)
		}
	}
	ld, ok := w.Take()["0000:01:00.0"]
	if want := (checks.LinkLoad{GTs: 16, Width: 16, Bps: 10 * gb, Source: "nvml", MaxGTs: 16, MaxWidth: 16}); !ok || ld != want {
		t.Fatalf("= %+v %v, want %+v (the 10 ms reading dropped)", ld, ok, want)
	}
	if c.Source() != "nvml" || c.Close() != nil {
		t.Error("the wrapper hides the counters' own methods")
	}
}

// A lane's capacity is the host's trained maximum, else the counters' max.
func TestLaneCapacity(t *testing.T) {
	sys := sysfstest.Build(t, sysfstest.Host{
		Nodes: []sysfstest.Node{{CPUs: "0-3", Distance: "10"}},
		Funcs: []sysfstest.Func{
			{BDF: "0000:00:01.1", HB: "pci0000:00", Class: "0x060400", Vendor: "0x1022", Device: "0x14ab", NUMA: "0",
				Cur: "2.5 GT/s PCIe", Max: "32.0 GT/s PCIe", CurW: "16", MaxW: "16"},
			{BDF: "0000:01:00.0", Parent: "0000:00:01.1", Class: "0x030000", Vendor: "0x10de", Device: "0x26b1", NUMA: "0",
				Cur: "2.5 GT/s PCIe", Max: "16.0 GT/s PCIe", CurW: "16", MaxW: "16"}, // idle at Gen1
		},
	})
	host, err := checks.ReadHost("/proc", sys, "")
	if err != nil {
		t.Fatal(err)
	}
	w := NewLinkWatch(3 * time.Second)
	r := reading(0, 0, 1, 8)
	r.GPUs[0].BusID, r.GPUs[0].MaxLinkGen, r.GPUs[0].MaxLinkWidth = "f123:45:00.0", 3, 8
	w.Add(r)
	capacity := LaneCapacity(host, w)
	for gpu, want := range map[string]float64{
		"0000:01:00.0": topology.LinkGBs(16, 16), // sysfs: Gen4 x16, not the idle Gen1
		"f123:45:00.0": topology.LinkGBs(8, 8),   // the counters' max
		"0000:09:00.0": 0,
	} {
		if got := capacity(gpu); got != want {
			t.Errorf("%s: %v, want %v", gpu, got, want)
		}
	}
	if got := LaneCapacity(nil, nil)("0000:01:00.0"); got != 0 {
		t.Errorf("no host, no counters: %v", got)
	}
}
