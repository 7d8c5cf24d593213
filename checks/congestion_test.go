package checks

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lanewatch/lanewatch/collectors"
	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/internal/sysfstest"
)

// fabric is the RDMA host of the congestion tests: the real samples' ports
// (sysfstest.RDMAHost: byteps#179's RoCE mlx5_0, the procfs fixture's
// InfiniBand mlx4_0), the ethtool statistics of a ConnectX-4 Lx (ethq's
// mlx5_core capture) for mlx5_0's netdev, processes with verbs devices
// open, and a clock that moves 10 s per sample. Counters move on only as a
// test adds to them.
type fabric struct {
	sys, proc string
	ethtool   map[string]uint64
	now       time.Time
}

const mlx5HW = "class/infiniband/mlx5_0/ports/1/hw_counters/"

func newFabric(t *testing.T) *fabric {
	t.Helper()
	f := &fabric{sys: sysfstest.RDMAHost(t, filepath.Join("..", "collectors", "testdata", "infiniband")), proc: t.TempDir(),
		now: time.Unix(1_700_000_000, 0)}
	file, err := os.Open(filepath.Join("..", "collectors", "testdata", "ethtool", "ethq_mlx5_core_CX4_ubuntu1804_k4.15_fw14.23_stripped.txt"))
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	if f.ethtool, err = collectors.ParseEthtoolStats(file, "ethq"); err != nil {
		t.Fatal(err)
	}
	sysfstest.OpenVerbs(t, f.proc, 100, "uverbs0")            // on mlx5_0 only
	sysfstest.OpenVerbs(t, f.proc, 200, "uverbs1")            // on mlx4_0 only
	sysfstest.OpenVerbs(t, f.proc, 300, "uverbs0", "uverbs1") // both: its QPs' port is not known
	return f
}

func (f *fabric) congestion(t *testing.T) *Congestion {
	t.Helper()
	c, err := NewCongestion(CongestionConfig{ProcRoot: f.proc, SysRoot: f.sys,
		EthtoolRead: func(dev string) (map[string]uint64, error) {
			if dev != "enp178s0f0" {
				t.Errorf("ethtool read of %s", dev)
			}
			out := map[string]uint64{}
			for k, v := range f.ethtool {
				out[k] = v
			}
			return out, nil
		},
		Clock: func() time.Time { f.now = f.now.Add(10 * time.Second); return f.now }})
	if err != nil || c == nil {
		t.Fatalf("NewCongestion: %v %v", c, err)
	}
	return c
}

// bump moves mlx5_0's counters on: hw_counters by name, ethtool statistics
// by name.
func (f *fabric) bump(t *testing.T, hw map[string]uint64, eth map[string]uint64) {
	for name, d := range hw {
		sysfstest.AddCounter(t, filepath.Join(f.sys, mlx5HW, name), d)
	}
	for name, d := range eth {
		if _, ok := f.ethtool[name]; !ok {
			t.Fatalf("ethtool sample has no %s", name)
		}
		f.ethtool[name] += d
	}
}

// writes are n RDMA WRITEs of size bytes on one queue pair, one at a time
// (each posted when the previous completed, plus a gap), each completing
// after lat ns.
func writes(pid, qp uint32, n int, size, lat, start uint64) []correlate.Transfer {
	var out []correlate.Transfer
	for i := range uint64(n) {
		at := start + i*(lat+50_000)
		out = append(out, correlate.Transfer{PID: pid, QPNum: qp, Op: event.OpPostSend, API: "ibv_post_send", Direction: correlate.DirRDMAWrite,
			Bytes: size, SubmitNs: at, CompleteNs: at + lat, Status: "success", WRID: i + 1})
	}
	return out
}

// healthy are queue pairs 8..15 of pid 200 on mlx4_0 (40 Gb/s: 64 KiB is
// 13.1 µs on the wire) completing in 20 µs.
func healthy(start uint64) []correlate.Transfer {
	var out []correlate.Transfer
	for qp := uint32(8); qp < 16; qp++ {
		out = append(out, writes(200, qp, 64, 64<<10, 20_000, start)...)
	}
	return out
}

func findingSubjects(c Check) []string {
	var out []string
	for _, f := range c.Findings {
		out = append(out, f.Subject+" "+string(f.Severity))
	}
	return out
}

// Steady congestion from the first interval: mlx5_0 counts CNPs and PHY
// pauses all along and QP 7 on it completes 64 KiB in 400 µs against a
// 15.2 µs baseline (5.2 µs at 100 Gb/s + 10 µs): it fires for that port and
// QP only, while eight healthy QPs on quiet mlx4_0 do not.
func TestCongestionSteadyFromTheFirstInterval(t *testing.T) {
	f := newFabric(t)
	c := f.congestion(t)
	c.Sample()
	f.bump(t, map[string]uint64{"np_cnp_sent": 40_000}, map[string]uint64{"rx_pause_ctrl_phy": 20_000})
	c.Sample()
	ts := append(writes(100, 7, 64, 64<<10, 400_000, 1e9), healthy(1e9)...)
	ch := c.Judge(ts)
	if got := strings.Join(findingSubjects(ch), ";"); got != "RDMA port mlx5_0/1 warn" {
		t.Fatalf("findings %q, want mlx5_0/1 warn: %+v", got, ch)
	}
	fd := ch.Findings[0]
	if !strings.Contains(fd.Summary, "sustained congestion: QP 7 (pid 100) completes late while the port counts enp178s0f0/rx_pause_ctrl_phy, mlx5_0/1/hw_counters/np_cnp_sent") ||
		strings.Contains(fd.Summary, "pid 200") {
		t.Errorf("summary %q", fd.Summary)
	}
	ev := strings.Join(fd.Evidence, "\n")
	if !strings.Contains(ev, "QP 7 of pid 100: p99 completion 400.0 µs against a 15.2 µs baseline (26.2×) over 64 completions, on this port") ||
		!strings.Contains(ev, "mlx5_0/1/hw_counters/np_cnp_sent 4000/s") || !strings.Contains(ev, "enp178s0f0/rx_pause_ctrl_phy 2000/s") {
		t.Errorf("evidence:\n%s", ev)
	}
	// The next interval, congestion still steady: still firing, and
	// against the previous interval it is not a rise.
	f.bump(t, map[string]uint64{"np_cnp_sent": 40_000}, map[string]uint64{"rx_pause_ctrl_phy": 20_000})
	c.Sample()
	ch = c.Judge(append(writes(100, 7, 64, 64<<10, 400_000, 11e9), healthy(11e9)...))
	if got := strings.Join(findingSubjects(ch), ";"); got != "RDMA port mlx5_0/1 warn" || !strings.HasPrefix(ch.Findings[0].Summary, "sustained") {
		t.Errorf("second interval: %q %+v", got, ch.Findings)
	}
}

// The same latency on a quiet fabric is no congestion finding (the host or
// the peer is slow, not the fabric); a quiet fabric with healthy QPs
// neither.
func TestCongestionQuietFabric(t *testing.T) {
	f := newFabric(t)
	c := f.congestion(t)
	c.Sample()
	c.Sample()
	if ch := c.Judge(append(writes(100, 7, 64, 64<<10, 400_000, 1e9), healthy(1e9)...)); len(ch.Findings) != 0 || ch.Status != Pass ||
		!strings.Contains(ch.Detail, "counting on none") {
		t.Errorf("quiet fabric: %+v", ch)
	}
	c.Sample()
	if ch := c.Judge(healthy(11e9)); len(ch.Findings) != 0 {
		t.Errorf("quiet, healthy: %+v", ch)
	}
}

// A rise inside the window (diagnose's halves): quiet first, then ECN
// marks appear and QP 7's completions go from 14 µs to 22 µs — 1.4× its
// baseline, under the sustained threshold, but a rise with the counters.
func TestCongestionRise(t *testing.T) {
	f := newFabric(t)
	c := f.congestion(t)
	c.Sample()
	c.Sample()
	f.bump(t, map[string]uint64{"np_ecn_marked_roce_packets": 9_000}, nil)
	c.Sample()
	if ch := c.Judge(writes(100, 7, 64, 64<<10, 14_000, 1e9)); len(ch.Findings) != 0 {
		t.Fatalf("quiet first half: %+v", ch)
	}
	ch := c.Judge(writes(100, 7, 64, 64<<10, 22_000, 11e9))
	if got := strings.Join(findingSubjects(ch), ";"); got != "RDMA port mlx5_0/1 warn" || !strings.HasPrefix(ch.Findings[0].Summary, "rising congestion: QP 7 (pid 100)") ||
		!strings.Contains(strings.Join(ch.Findings[0].Evidence, " "), "rising since the previous interval: mlx5_0/1/hw_counters/np_ecn_marked_roce_packets 0/s → 900/s") {
		t.Errorf("rise: %q %+v", got, ch.Findings)
	}
	// The same second half without the ECN marks: latency alone, nothing.
	f2 := newFabric(t)
	c2 := f2.congestion(t)
	c2.Sample()
	c2.Sample()
	c2.Sample()
	c2.Judge(writes(100, 7, 64, 64<<10, 14_000, 1e9))
	if ch := c2.Judge(writes(100, 7, 64, 64<<10, 22_000, 11e9)); len(ch.Findings) != 0 {
		t.Errorf("latency rise on a quiet fabric: %+v", ch.Findings)
	}
}

// Receives posted ahead wait for the peer to send: seconds of posted →
// completed on QP 7 while CNPs count are not congestion, and are left out.
func TestCongestionReceivesLeftOut(t *testing.T) {
	f := newFabric(t)
	c := f.congestion(t)
	c.Sample()
	f.bump(t, map[string]uint64{"np_cnp_sent": 40_000}, nil)
	c.Sample()
	ts := writes(100, 7, 64, 64<<10, 12_000, 1e9) // QP 7's writes are healthy
	for i := range uint64(32) {
		ts = append(ts, correlate.Transfer{PID: 100, QPNum: 7, Op: event.OpPostRecv, API: "ibv_post_recv", Direction: correlate.DirRecv,
			Bytes: 64 << 10, SubmitNs: 1e9 + i, CompleteNs: 6e9 + i*1e6, Status: "success", WRID: 1000 + i})
	}
	ch := c.Judge(ts)
	if len(ch.Findings) != 0 || !strings.Contains(ch.Detail, "32 receive(s) left out") {
		t.Errorf("receives judged as congestion: %+v", ch)
	}
}

// Retransmissions and timeouts counting with a slow QP fail; a QP whose
// process opened both NICs fires on the congested port only, saying its
// port is not known.
func TestCongestionLossAndUnplacedQP(t *testing.T) {
	f := newFabric(t)
	c := f.congestion(t)
	c.Sample()
	f.bump(t, map[string]uint64{"local_ack_timeout_err": 270, "np_cnp_sent": 1_333}, nil)
	c.Sample()
	ch := c.Judge(append(writes(300, 9, 32, 1<<20, 2_000_000, 1e9), healthy(1e9)...))
	if got := strings.Join(findingSubjects(ch), ";"); got != "RDMA port mlx5_0/1 fail" {
		t.Fatalf("findings %q: %+v", got, ch)
	}
	ev := strings.Join(ch.Findings[0].Evidence, " ")
	if !strings.Contains(ev, "QP 9 of pid 300") || !strings.Contains(ev, "its process opened mlx4_0/1, mlx4_0/2, mlx5_0/1: the port is not known") {
		t.Errorf("evidence %q", ev)
	}
}

// A port whose quiet intervals show a longer round trip (a cross-spine
// path: 40 µs) learns it: 60 µs completions with CNPs counting are then
// within twice its baseline, where the 10 µs default would have fired.
func TestCongestionLearnsTheQuietBaseline(t *testing.T) {
	for _, learn := range []bool{true, false} {
		f := newFabric(t)
		c := f.congestion(t)
		c.Sample()
		c.Sample()
		if learn {
			c.Judge(writes(100, 7, 64, 64<<10, 45_000, 1e9)) // quiet: 5.2 µs wire + ~40 µs round trip
		} else {
			c.Judge(nil)
		}
		f.bump(t, map[string]uint64{"np_cnp_sent": 40_000}, nil)
		c.Sample()
		ch := c.Judge(writes(100, 7, 64, 64<<10, 60_000, 11e9))
		if fired := len(ch.Findings) > 0; fired == learn {
			t.Errorf("learned %v: fired %v (%+v; %s)", learn, fired, ch.Findings, ch.Detail)
		}
		if learn && !strings.Contains(ch.Detail, "baseline round trip mlx5_0/1 40µs") {
			t.Errorf("detail %q", ch.Detail)
		}
	}
}

// Unsignaled writes complete with the next signaled one (seed 002 §4.3):
// a batch is measured once, from when the queue pair reached it, so deep
// queues of the application's own are not congestion.
func TestCongestionBatchesAndOwnQueue(t *testing.T) {
	f := newFabric(t)
	c := f.congestion(t)
	c.Sample()
	f.bump(t, map[string]uint64{"np_cnp_sent": 40_000}, nil)
	c.Sample()
	// 64 writes of 64 KiB posted at once, completing back to back every
	// 5.3 µs (line rate): the last waits 340 µs behind its own queue.
	var ts []correlate.Transfer
	for i := range uint64(64) {
		ts = append(ts, correlate.Transfer{PID: 100, QPNum: 7, Op: event.OpPostSend, Direction: correlate.DirRDMAWrite, Bytes: 64 << 10,
			SubmitNs: 1e9, CompleteNs: 1e9 + 8_000 + (i+1)*5_300, Status: "success", WRID: i + 1})
	}
	// and 16 unsignaled writes completing with a signaled 17th.
	for i := range uint64(17) {
		ts = append(ts, correlate.Transfer{PID: 100, QPNum: 7, Op: event.OpPostSend, Direction: correlate.DirRDMAWrite, Bytes: 64 << 10,
			SubmitNs: 2e9 + i*100, CompleteNs: 2e9 + 100_000, Status: "success", WRID: 100 + i})
	}
	if ch := c.Judge(ts); len(ch.Findings) != 0 {
		t.Errorf("own queue taken for congestion: %+v", ch.Findings)
	}
}

// Without RDMA ports there is nothing to judge; one sample is no interval.
func TestCongestionNoPortsOneSample(t *testing.T) {
	if c, err := NewCongestion(CongestionConfig{SysRoot: t.TempDir()}); c != nil || err != nil {
		t.Errorf("a host without RDMA ports: %v %v", c, err)
	}
	f := newFabric(t)
	c := f.congestion(t)
	c.Sample()
	if ch := c.Judge(nil); ch.Status != Skip {
		t.Errorf("one sample: %+v", ch)
	}
}

// ucxPuts are a UCX endpoint's RDMA puts on dev (rc_mlx5, as
// TestUCXPerftestRecords's records are shaped), one at a time.
func ucxPuts(pid uint32, ep uint64, dev string, n int, size, lat, start uint64) []correlate.Transfer {
	var out []correlate.Transfer
	for _, w := range writes(pid, 0, n, size, lat, start) {
		out = append(out, correlate.Transfer{PID: pid, Op: event.OpXferPut, API: "ucp_put_nbx", Direction: correlate.DirRDMAWrite,
			Bytes: w.Bytes, SubmitNs: w.SubmitNs, CompleteNs: w.CompleteNs, LatencyNs: lat, Transport: "rc_mlx5", NetDevice: dev, Endpoint: ep})
	}
	return out
}

// A UCX endpoint drives its queue pairs itself (no verbs call shows them):
// its RDMA puts are judged as one queue, on the port the library names —
// placed even for pid 300, which opened both devices. Late puts while
// mlx5_0 counts CNPs fire for that endpoint; the same endpoint on time,
// and puts over tcp however late, do not.
func TestCongestionUCXEndpoint(t *testing.T) {
	f := newFabric(t)
	c := f.congestion(t)
	c.Sample()
	f.bump(t, map[string]uint64{"np_cnp_sent": 40_000}, nil)
	c.Sample()
	tcp := ucxPuts(300, 0xe2, "eth0", 64, 64<<10, 900_000, 1e9)
	for i := range tcp {
		tcp[i].Transport = "tcp"
	}
	ch := c.Judge(append(append(ucxPuts(300, 0xe1, "mlx5_0:1", 64, 64<<10, 400_000, 1e9), tcp...), healthy(1e9)...))
	if got := strings.Join(findingSubjects(ch), ";"); got != "RDMA port mlx5_0/1 warn" {
		t.Fatalf("findings %q, want mlx5_0/1 warn: %+v", got, ch)
	}
	fd := ch.Findings[0]
	ev := strings.Join(fd.Evidence, "\n")
	if !strings.Contains(fd.Summary, "endpoint 0xe1 (pid 300) completes late") || strings.Contains(fd.Summary, "0xe2") ||
		!strings.Contains(ev, "endpoint 0xe1 of pid 300: p99 completion 400.0 µs against a 15.2 µs baseline (26.2×) over 64 completions, on this port") {
		t.Errorf("summary %q, evidence:\n%s", fd.Summary, ev)
	}
	f.bump(t, map[string]uint64{"np_cnp_sent": 40_000}, nil)
	c.Sample()
	if ch := c.Judge(append(ucxPuts(300, 0xe1, "mlx5_0:1", 64, 64<<10, 14_000, 11e9), healthy(11e9)...)); len(ch.Findings) != 0 {
		t.Errorf("the endpoint on time: %+v", ch.Findings)
	}
}
