package checks

import (
	"strings"
	"testing"

	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
)

const usec = uint64(1000)

// layers adds n copies of 16 KiB queued on one stream per layer, all
// proven done by one synchronisation at the layer's end (each taking 4 µs
// of a 4 GB/s lane), which follows the layer's last copy closely.
func layers(w *Window, pid uint32, stream uint64, nLayers, perLayer int, start uint64) uint64 {
	at := start
	for range nLayers {
		end := at + uint64(perLayer)*4*usec + 2*usec
		for i := range perLayer {
			w.Transfer(&correlate.Transfer{PID: pid, Stream: stream, GPU: gpuA, Op: event.OpCopy, Direction: correlate.DirH2D,
				Bytes: 16 << 10, HostMem: event.MemPinned, SubmitNs: at + uint64(i)*usec/2, CompleteNs: end, CompleteNear: i == perLayer-1})
		}
		at = end + usec
	}
	return at
}

func inflightFindings(cs []Check) (rules []string, text string) {
	var parts []string
	for _, c := range cs {
		parts = append(parts, string(c.Status)+" "+c.Scope+": "+c.Detail)
		for _, f := range c.Findings {
			rules = append(rules, f.Subject)
			parts = append(parts, f.Summary+"; "+strings.Join(f.Evidence, "; "))
		}
	}
	return rules, strings.Join(parts, " | ")
}

func TestInFlightChecksShapes(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fill  func(w *Window)
		place func(uint32) Placement
		want  []string
		text  []string
	}{
		{"one copy at a time, each synchronised", func(w *Window) {
			load(w, 1, 0x10, gpuA, correlate.DirH2D, 200, 16<<10, ms, 20*usec, true)
		}, placeAll(gpuA), []string{"pid 1 stream 0x10 H2D on PCIe link of GPU 0000:17:00.0 (inbound)"},
			[]string{"≈ 4 more copies of its typical 16 KiB", "0.82 GB/s while in flight against 4.00 GB/s"}},
		{"the same copies queued per layer", func(w *Window) {
			layers(w, 1, 0x10, 8, 64, ms)
		}, placeAll(gpuA), nil, []string{"inbound: pid 1 stream 0x10 H2D: 8 ops"}},
		// A decode step's sampled tokens read back, then .tolist()'s sync:
		// each proven close, each latency the step's compute, but 60 x 148 B
		// is no flow worth more in flight (issue 20).
		{"moves little: a decode loop's token read-back", func(w *Window) {
			load(w, 1, 0, gpuA, correlate.DirD2H, 60, 148, ms, ms, true)
		}, placeAll(gpuA), nil, []string{"outbound: pid 1 stream 0x0 D2H: 60 ops"}},
		{"each wait came after other calls: no latency of its own", func(w *Window) {
			for i := range uint64(200) {
				w.Transfer(&correlate.Transfer{PID: 1, Stream: 0x10, GPU: gpuA, Op: event.OpCopy, Direction: correlate.DirH2D, Bytes: 16 << 10,
					HostMem: event.MemPinned, SubmitNs: ms + i*20*usec, CompleteNs: ms + (i+1)*20*usec})
			}
		}, placeAll(gpuA), nil, []string{"no operation with a proven completion (200 without)"}},
		// B × L per lane: one large copy in flight beside the serial flow
		// keeps the lane's bytes in flight far above 4 GB/s × 20 µs,
		// while the lane is not saturated (0.82 + 2 GB/s).
		{"the lane keeps enough in flight", func(w *Window) {
			load(w, 1, 0x10, gpuA, correlate.DirH2D, 200, 16<<10, ms, 20*usec, true)
			load(w, 2, 0x20, gpuA, correlate.DirH2D, 1, 8<<20, ms, 4*ms, true)
		}, placeAll(gpuA), nil, []string{"pid 1 stream 0x10 H2D: 200 ops"}},
		// A serial flow busy a twentieth of its lane's busy time: the lane's
		// rate is the other flows' to explain.
		{"a small share of its lane's busy time", func(w *Window) {
			load(w, 1, 0x10, gpuA, correlate.DirH2D, 200, 16<<10, ms, 20*usec, true)
			// then 80 ms of 3 MiB copies, each 1 ms: 3 GB/s, no latency-bound flow
			load(w, 2, 0x20, gpuA, correlate.DirH2D, 80, 3<<20, 6*ms, ms, true)
		}, placeAll(gpuA), nil, []string{"pid 1 stream 0x10 H2D: 200 ops"}},
		{"rarely used", func(w *Window) {
			load(w, 1, 0x10, gpuA, correlate.DirH2D, 5, 16<<10, ms, 20*usec, true)
			load(w, 1, 0x10, gpuA, correlate.DirH2D, 50, 16<<10, 10*ms, 2*ms, false)
		}, placeAll(gpuA), nil, nil},
		{"capacity unknown", func(w *Window) {
			load(w, 1, 0x10, gpuA, correlate.DirH2D, 200, 16<<10, ms, 20*usec, true)
		}, func(uint32) Placement { return Placement{GPU: gpuA} }, nil,
			[]string{"SKIP pid 1: pid 1 stream 0x10 H2D: capacity of GPU 0000:17:00.0's inbound lane unknown"}},
		{"GPU unknown", func(w *Window) {
			load(w, 1, 0x10, "", correlate.DirH2D, 200, 16<<10, ms, 20*usec, true)
		}, func(uint32) Placement { return Placement{Why: "no GPU on this host"} }, nil,
			[]string{"SKIP pid 1: pid 1 stream 0x10 H2D: GPU unknown: no GPU on this host"}},
		{"lane saturated by another stream", func(w *Window) {
			load(w, 1, 0x10, gpuA, correlate.DirH2D, 200, 16<<10, ms, 20*usec, true)
			load(w, 2, 0x20, gpuA, correlate.DirH2D, 4, 4<<20, ms, ms, true)
		}, placeAll(gpuA), nil, []string{"pid 2 stream 0x20 H2D: 4 ops"}},
	} {
		w := NewWindow()
		tc.fill(w)
		got, text := inflightFindings(w.InFlightChecks(tc.place, nil, 0))
		if strings.Join(got, ",") != strings.Join(tc.want, ",") {
			t.Errorf("%s: findings %q, want %q: %s", tc.name, got, tc.want, text)
		}
		for _, s := range tc.text {
			if !strings.Contains(text, s) {
				t.Errorf("%s: lacks %q: %s", tc.name, s, text)
			}
		}
	}
}

// TestInFlightRDMA: a queue pair writing into a peer's GPU one request at
// a time is judged on that GPU's inbound lane; one between host memory is
// measured but skipped, its path's capacity unknown.
func TestInFlightRDMA(t *testing.T) {
	w := NewWindow()
	const prefill, decode = 10, 11
	at := ms
	for i := range uint64(100) {
		w.Transfer(&correlate.Transfer{PID: prefill, PeerPID: decode, QPNum: 7, WRID: i, Op: event.OpPostSend, Direction: correlate.DirRDMAWrite,
			Bytes: 16 << 10, Src: correlate.Side{Mem: event.MemPinned}, Dst: correlate.Side{Mem: event.MemDevice},
			SubmitNs: at, CompleteNs: at + 15*usec, Status: "success"})
		w.Transfer(&correlate.Transfer{PID: prefill, QPNum: 8, WRID: i, Op: event.OpPostSend, Direction: correlate.DirRDMAWrite,
			Bytes: 16 << 10, Src: correlate.Side{Mem: event.MemPinned}, Dst: correlate.Side{Mem: event.MemPinned},
			SubmitNs: at, CompleteNs: at + 15*usec, Status: "success"})
		at += 16 * usec
	}
	place := func(pid uint32) Placement {
		if pid == decode {
			return Placement{GPU: gpuB, InboundGBs: 4, OutboundGBs: 4}
		}
		return Placement{GPU: gpuA, InboundGBs: 4, OutboundGBs: 4}
	}
	rep := w.InFlights(place, nil, 0)
	got, text := inflightFindings(rep.Checks())
	if len(got) != 1 || got[0] != "pid 10 QP 7 RDMA_WRITE on PCIe link of GPU 0000:18:00.0 (inbound)" ||
		!strings.Contains(text, "more work requests") ||
		!strings.Contains(text, "SKIP pid 10: pid 10 QP 8 RDMA_WRITE: on no GPU link") {
		t.Fatalf("%q: %s", got, text)
	}
	if len(rep.Lanes) != 1 || rep.Lanes[0].GPU != gpuB || rep.Lanes[0].Flows != 1 {
		t.Fatalf("lanes %+v", rep.Lanes)
	}
	// one 16 KiB request in flight 15 of every 16 µs: 15.4 KiB on average
	if a := rep.Lanes[0].AvgBytes; a < 15<<10 || a > 16<<10 || rep.Lanes[0].AvgOps < 0.9 {
		t.Fatalf("lane average %+v", rep.Lanes[0])
	}
}

// TestInFlightBound: past the window's bound operations are counted, not
// kept, and the check says so; Rotate starts the next window empty.
func TestInFlightBound(t *testing.T) {
	w := NewWindow()
	w.mu.Lock()
	w.inflight.ops = maxInflightOps
	w.mu.Unlock()
	load(w, 1, 0x10, gpuA, correlate.DirH2D, 3, 16<<10, ms, 20*usec, true)
	load(w, 1, 0x11, gpuA, correlate.DirH2D, 1, 16<<10, ms, 20*usec, true)
	old := w.Rotate()
	if old.inflight.dropped != 4 || w.inflight.dropped != 0 || w.inflight.flows != nil {
		t.Fatalf("old %+v new %+v", old.inflight, w.inflight)
	}
}
