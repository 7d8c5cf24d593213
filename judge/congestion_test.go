package judge_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lanewatch/lanewatch/checks"
	"github.com/lanewatch/lanewatch/collectors"
	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/internal/sysfstest"
	"github.com/lanewatch/lanewatch/judge"
)

// `agent run`'s evaluator judges rdma-congestion every window, per port and
// queue pair, with counters from the real samples — byteps#179's RoCE mlx5
// hw_counters and the procfs fixture's InfiniBand mlx4 ports in sysfs, a
// ConnectX-4 Lx's ethtool statistics (ethq) for the RoCE netdev — moved on
// between windows as a congested fabric moves them; the only stand-in is
// the NIC itself. Congestion steady from the first window fires for the
// congested port and its slow queue pair only; a window whose counters are
// still does not, whatever the latency (and teaches the port its quiet
// round trip: the lowest seen, so a slow quiet window is not the last
// word); receives waiting for their sender are left out.
func TestEvaluatorRDMACongestion(t *testing.T) {
	testdata := filepath.Join("..", "collectors", "testdata")
	sys, proc := sysfstest.RDMAHost(t, filepath.Join(testdata, "infiniband")), t.TempDir()
	sysfstest.OpenVerbs(t, proc, 100, "uverbs0") // the PD sender on mlx5_0
	sysfstest.OpenVerbs(t, proc, 200, "uverbs1") // another job on mlx4_0
	f, err := os.Open(filepath.Join(testdata, "ethtool", "ethq_mlx5_core_CX4_ubuntu1804_k4.15_fw14.23_stripped.txt"))
	if err != nil {
		t.Fatal(err)
	}
	eth, err := collectors.ParseEthtoolStats(f, "ethq")
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_700_000_000, 0)
	cong, err := checks.NewCongestion(checks.CongestionConfig{ProcRoot: proc, SysRoot: sys,
		EthtoolRead: func(string) (map[string]uint64, error) {
			out := map[string]uint64{}
			for k, v := range eth {
				out[k] = v
			}
			return out, nil
		},
		Clock: func() time.Time { now = now.Add(10 * time.Second); return now }})
	if err != nil || cong == nil {
		t.Fatalf("congestion: %v %v", cong, err)
	}
	e := judge.NewEvaluator(judge.EvaluatorConfig{Interval: 10 * time.Second, Congestion: cong})

	congest := func() { // 4000 CNPs/s and 2000 PHY pauses/s over a 10 s window
		sysfstest.AddCounter(t, filepath.Join(sys, "class/infiniband/mlx5_0/ports/1/hw_counters/np_cnp_sent"), 40_000)
		eth["rx_pause_ctrl_phy"] += 20_000
	}
	window := func(start, lat uint64) {
		for i := range uint64(64) {
			at := start + i*500_000
			// QP 7 on mlx5_0: 64 KiB writes taking lat (baseline 15.2 µs)
			e.Transfer(&correlate.Transfer{PID: 100, QPNum: 7, Op: event.OpPostSend, Direction: correlate.DirRDMAWrite, Bytes: 64 << 10,
				SubmitNs: at, CompleteNs: at + lat, Status: "success", WRID: i + 1})
			// QPs 8..15 on mlx4_0: 64 KiB writes in 20 µs (13.1 µs on a 40 Gb/s wire)
			for qp := uint32(8); qp < 16; qp++ {
				e.Transfer(&correlate.Transfer{PID: 200, QPNum: qp, Op: event.OpPostSend, Direction: correlate.DirRDMAWrite, Bytes: 64 << 10,
					SubmitNs: at, CompleteNs: at + 20_000, Status: "success", WRID: i + 1})
			}
			// receives QP 7 posted ahead, completed seconds later when the peer sent
			e.Transfer(&correlate.Transfer{PID: 100, QPNum: 7, Op: event.OpPostRecv, Direction: correlate.DirRecv, Bytes: 4096,
				SubmitNs: start, CompleteNs: start + 3e9 + i, Status: "success", WRID: 1000 + i})
		}
	}
	judge := func(name string, at time.Time, want string) {
		t.Helper()
		v := e.Evaluate(at)
		var got []string
		for _, f := range v.Findings {
			if f.Rule == "rdma-congestion" {
				got = append(got, f.Subject+" "+f.Summary)
			}
		}
		if strings.Join(got, ";") != want {
			t.Errorf("%s: findings %q, want %q", name, got, want)
		}
		var c *checks.Check
		for i := range v.Checks {
			if v.Checks[i].Name == checks.CheckCongestion {
				c = &v.Checks[i]
			}
		}
		if c == nil || !strings.Contains(c.Detail, "64 receive(s) left out") {
			t.Errorf("%s: congestion check %+v", name, c)
		}
	}
	congest()
	window(1e9, 400_000)
	judge("steady from the first window", time.Unix(1_700_000_010, 0),
		"RDMA port mlx5_0/1 sustained congestion: QP 7 (pid 100) completes late while the port counts enp178s0f0/rx_pause_ctrl_phy, mlx5_0/1/hw_counters/np_cnp_sent")
	window(11e9, 400_000) // the same latency, the counters still: not the fabric's
	judge("counters still, QP 7 as slow", time.Unix(1_700_000_020, 0), "")
	window(21e9, 12_000)
	judge("counters still, QP 7 healthy", time.Unix(1_700_000_030, 0), "")
	congest()
	window(31e9, 400_000)
	judge("congested again: a rise", time.Unix(1_700_000_040, 0),
		"RDMA port mlx5_0/1 rising congestion: QP 7 (pid 100) completes late while the port counts enp178s0f0/rx_pause_ctrl_phy, mlx5_0/1/hw_counters/np_cnp_sent")
}
