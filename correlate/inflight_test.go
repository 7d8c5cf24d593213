package correlate

import (
	"math"
	"strings"
	"testing"
)

// serialOps is a flow that keeps one operation in flight at a time: each
// takes lat ns and the next is submitted gap ns after the previous one
// completed.
func serialOps(n int, bytes, lat, gap uint64) []Span {
	var out []Span
	at := uint64(1_000_000)
	for i := 0; i < n; i++ {
		out = append(out, Span{Start: at, End: at + lat, Bytes: bytes})
		at += lat + gap
	}
	return out
}

// queuedOps is a flow that queues depth operations at once, each taking
// service ns on the path in turn, all proven done when the last finishes
// (one synchronisation per batch), batches back to back.
func queuedOps(batches, depth int, bytes, service uint64) []Span {
	var out []Span
	at := uint64(1_000_000)
	for b := 0; b < batches; b++ {
		end := at + uint64(depth)*service
		for i := 0; i < depth; i++ {
			out = append(out, Span{Start: at + uint64(i)*100, End: end, Bytes: bytes})
		}
		at = end + 100
	}
	return out
}

// overlapping: operations submitted every step ns, alternating short and
// long latencies, so about lat/step are in flight at once.
func overlapping(n int, bytes, short, long uint64) []Span {
	var out []Span
	at := uint64(1_000_000)
	for i := 0; i < n; i++ {
		lat := long
		if i%2 == 0 {
			lat = short
		}
		out = append(out, Span{Start: at, End: at + lat, Bytes: bytes})
		at += (short + long) / 2
	}
	return out
}

// TestInFlightLittlesLaw checks avg in flight = rate × latency on known
// shapes: exactly with the byte-weighted mean latency, and with the p50
// on a serial flow of equal operations.
func TestInFlightLittlesLaw(t *testing.T) {
	for _, tc := range []struct {
		name string
		ops  []Span
	}{
		{"serial", serialOps(100, 16<<10, 20_000, 0)},
		{"serial with gaps", serialOps(100, 16<<10, 20_000, 5_000)},
		{"queued", queuedOps(10, 64, 16<<10, 4_000)},
		{"mixed sizes", append(serialOps(50, 4<<10, 10_000, 0), serialOps(50, 1<<20, 300_000, 0)...)},
	} {
		m := MeasureInFlight(tc.name, false, tc.ops)
		little := m.RateGBs() * float64(m.MeanNs)
		if math.Abs(m.AvgBytes()-little) > 1e-6*m.AvgBytes()+float64(m.Ops) {
			t.Errorf("%s: avg in flight %.0f B, rate × mean latency %.0f B", tc.name, m.AvgBytes(), little)
		}
		opsLittle := float64(m.Ops) / float64(m.BusyNs) * (m.OpNs / float64(m.Ops))
		if math.Abs(m.AvgOps()-opsLittle) > 1e-9 {
			t.Errorf("%s: avg ops in flight %.3f, throughput × mean latency %.3f", tc.name, m.AvgOps(), opsLittle)
		}
	}
	m := MeasureInFlight("serial", false, serialOps(100, 16<<10, 20_000, 0))
	if got, want := m.AvgBytes(), m.RateGBs()*float64(m.P50Ns); math.Abs(got-want) > 1 {
		t.Errorf("serial: avg in flight %.0f B, rate × p50 %.0f B", got, want)
	}
	if m.AvgOps() != 1 || m.P50Ns != 20_000 || m.TurnaroundNs != 20_000 || m.TypicalBytes != 16<<10 {
		t.Errorf("serial: %+v", m)
	}
}

func TestTooLittleInFlight(t *testing.T) {
	const capGBs = 4.0 // bytes per ns
	for _, tc := range []struct {
		name   string
		ops    []Span
		cap    float64
		lane   float64 // others' rate on the lane, GB/s
		fires  bool
		reason string
	}{
		// 16 KiB each, 20 µs turnaround: 0.82 GB/s of 4, 16 KiB in flight
		// against a B×L of 80 kB.
		{"one at a time", serialOps(200, 16<<10, 20_000, 500), capGBs, 0, true, ""},
		// the same copies queued 64 deep: 4 GB/s, the lane busy.
		{"queued deep", queuedOps(4, 64, 16<<10, 4_096), capGBs, 0, false, "saturated"},
		// busy a fraction of the time: no demand the path fails.
		{"rarely used", serialOps(200, 16<<10, 20_000, 200_000), capGBs, 0, false, "idle"},
		{"too few ops", serialOps(8, 16<<10, 20_000, 0), capGBs, 0, false, "few"},
		{"capacity unknown", serialOps(200, 16<<10, 20_000, 0), 0, 0, false, "unknown"},
		// another flow fills the lane: the path is saturated.
		{"lane saturated by others", serialOps(200, 16<<10, 20_000, 0), capGBs, 3.5, false, "saturated"},
		// queued 64 deep on a path slower than the lane: slow, but not for
		// want of operations in flight (every copy proven at the batch's end).
		{"queued slow", queuedOps(4, 64, 16<<10, 10_000), capGBs, 0, false, "deep"},
		// two in flight, each latency mostly queueing: the low percentile
		// is the turnaround, and in flight covers B × L.
		{"covered", overlapping(200, 16<<10, 2_000, 18_000), capGBs, 0, false, "covered"},
		// issue 20: a decode step's token read-back, 148 B each, its latency
		// the step's compute (1 ms): under the byte floor.
		{"moves little", serialOps(60, 148, 1_000_000, 0), capGBs, 0, false, "floor"},
		// the same serial copies, each proven by a wait after other calls
		{"proven far", farOps(serialOps(200, 16<<10, 20_000, 500)), capGBs, 0, false, "far"},
	} {
		m := MeasureInFlight("pid 1 stream 0x10 H2D", false, tc.ops)
		m.CapacityGBs, m.LaneGBs = tc.cap, max(tc.lane, m.RateGBs())
		f := TooLittleInFlight(m, "PCIe link of GPU 0000:3b:00.0 inbound")
		if (f != nil) != tc.fires {
			t.Errorf("%s: fired %v, want %v: %s", tc.name, f != nil, tc.fires, m.Text())
			continue
		}
		if f == nil {
			continue
		}
		ev := strings.Join(f.Evidence, "\n")
		for _, want := range []string{"0.8", "GB/s capacity", "p50 20µs", "bandwidth-delay product 4.00 GB/s × 20µs = 78.1 KiB", "≈ 4 more copies of its typical 16 KiB"} {
			if !strings.Contains(ev, want) {
				t.Errorf("%s: evidence lacks %q:\n%s", tc.name, want, ev)
			}
		}
		if f.Rule != "too-little-in-flight" || f.Severity != SevWarn {
			t.Errorf("%s: %+v", tc.name, f)
		}
	}
}

func farOps(ops []Span) []Span {
	for i := range ops {
		ops[i].Far = true
	}
	return ops
}

// B × L per lane and the lane's busy time (issue 20): a serial flow is
// not judged when its lane's bytes in flight (every flow's) cover B × L,
// nor when it is in flight under a tenth of the lane's busy time.
func TestTooLittleInFlightLane(t *testing.T) {
	for _, tc := range []struct {
		name              string
		laneBusy          uint64
		laneBytesInFlight float64 // average over the lane's busy time
		fires             bool
	}{
		{"alone on its lane", 0, 0, true},
		{"the lane as busy as the flow, 16 KiB in flight", 200 * 20_500, 16 << 10, true},
		{"the lane keeps 1 MiB in flight", 200 * 20_500, 1 << 20, false},
		{"the flow a twentieth of the lane's busy time", 20 * 200 * 20_500, 16 << 10, false},
	} {
		m := MeasureInFlight("pid 1 stream 0x10 H2D", false, serialOps(200, 16<<10, 20_000, 500))
		m.CapacityGBs, m.LaneGBs = 4, m.RateGBs()
		m.LaneBusyNs, m.LaneByteNs = tc.laneBusy, tc.laneBytesInFlight*float64(tc.laneBusy)
		if f := TooLittleInFlight(m, "lane"); (f != nil) != tc.fires {
			t.Errorf("%s: fired %v, want %v: %s", tc.name, f != nil, tc.fires, m.Text())
		}
	}
}

// TestInFlightRDMAWords: a queue pair's finding speaks of work requests.
func TestInFlightRDMAWords(t *testing.T) {
	m := MeasureInFlight("pid 2 QP 7 RDMA_WRITE", true, serialOps(64, 16<<10, 15_000, 0))
	m.CapacityGBs, m.LaneGBs = 4, m.RateGBs()
	f := TooLittleInFlight(m, "PCIe link of GPU gpu-decode inbound")
	if f == nil || !strings.Contains(strings.Join(f.Evidence, " "), "more work requests") ||
		!strings.Contains(f.Remediation, "outstanding") {
		t.Fatalf("%+v", f)
	}
}

// TestInFlightXferWords: a transfer library's endpoint speaks of transfers.
func TestInFlightXferWords(t *testing.T) {
	m := MeasureInFlight("pid 2 endpoint 0x5555 RDMA_READ", false, serialOps(64, 16<<10, 15_000, 0))
	m.Xfer = true
	m.CapacityGBs, m.LaneGBs = 4, m.RateGBs()
	f := TooLittleInFlight(m, "PCIe link of GPU gpu-decode inbound")
	if f == nil || !strings.Contains(strings.Join(f.Evidence, " "), "more transfers") ||
		!strings.Contains(f.Remediation, "outstanding on the endpoint") {
		t.Fatalf("%+v", f)
	}
}

// TestInFlightUntimed: operations without a proven completion are counted,
// not judged.
func TestInFlightUntimed(t *testing.T) {
	ops := append(serialOps(10, 1, 10, 0), Span{Start: 5, End: 0, Bytes: 9}, Span{Start: 7, End: 7, Bytes: 9})
	m := MeasureInFlight("f", false, ops)
	if m.Untimed != 2 || m.Ops != 10 || m.Bytes != 10 {
		t.Fatalf("%+v", m)
	}
	if e := MeasureInFlight("none", false, nil); e.Ops != 0 || e.AvgBytes() != 0 || e.RateGBs() != 0 || !strings.Contains(e.Text(), "no operation") {
		t.Fatalf("%+v", e)
	}
}
