package correlate

import (
	"fmt"
	"strings"
	"testing"
)

// Counter names are the real samples': byteps#179 mlx5 hw_counters
// (np_cnp_sent, np_ecn_marked_roce_packets, local_ack_timeout_err), the
// procfs mlx5 fixture (roce_adp_retrans, rnr_nak_retry_err, out_of_buffer),
// the mlx5 ethtool statistics (rx_prio3_pause, tx_pause_ctrl_phy) and the
// mlx4 fixture (port_xmit_wait).
func TestRDMACongestion(t *testing.T) {
	slow := QPLatency{PID: 42, QPNum: 7, Placed: true, Batches: 64, Slowdown: [2]float64{0, 27}, P99Ns: 412_000, BaselineNs: 15_240}
	healthy := func(qp uint32, s float64) QPLatency {
		return QPLatency{PID: 43, QPNum: qp, Placed: true, Batches: 64, Slowdown: [2]float64{s, s}, P99Ns: 12_000, BaselineNs: 15_240}
	}
	many := []QPLatency{slow}
	for qp := uint32(8); qp < 40; qp++ {
		many = append(many, healthy(qp, 0.8))
	}
	cnp := map[string][2]float64{"mlx5_0/1/hw_counters/np_cnp_sent": {400, 400}, "enp178s0f0/rx_prio3_pause": {200, 200}}
	for _, tc := range []struct {
		name string
		f    CongestionFacts
		want Severity
		qps  string // the QPs the summary names
	}{
		{"steady CNPs and pauses from the first window, one QP far above baseline",
			CongestionFacts{Signals: cnp, QPs: []QPLatency{slow}}, SevWarn, "QP 7 (pid 42)"},
		{"steady, against the previous interval too",
			CongestionFacts{Signals: cnp, HasPrevious: true, QPs: []QPLatency{slow}}, SevWarn, "QP 7 (pid 42)"},
		{"one congested QP among many healthy ones",
			CongestionFacts{Signals: cnp, QPs: many}, SevWarn, "QP 7 (pid 42)"},
		{"counters count, every QP at its baseline",
			CongestionFacts{Signals: cnp, QPs: many[1:]}, "", ""},
		{"quiet fabric, a slow QP (the host or the peer, not the fabric)",
			CongestionFacts{Signals: map[string][2]float64{"mlx5_0/1/hw_counters/np_cnp_sent": {0, 0}}, QPs: []QPLatency{slow}}, "", ""},
		{"only traffic counters",
			CongestionFacts{Signals: map[string][2]float64{"mlx5_0/1/counters/port_rcv_data_bytes": {1e9, 9e9}}, QPs: []QPLatency{slow}}, "", ""},
		{"receiver not ready is the peer application's",
			CongestionFacts{Signals: map[string][2]float64{"mlx5_0/1/hw_counters/rnr_nak_retry_err": {0, 50}, "mlx5_0/1/hw_counters/out_of_buffer": {0, 9}},
				HasPrevious: true, QPs: []QPLatency{slow}}, "", ""},
		{"a rise inside the window: CNPs appear, a QP's slowdown rises above its baseline",
			CongestionFacts{Signals: map[string][2]float64{"mlx5_0/1/hw_counters/np_ecn_marked_roce_packets": {0, 900}}, HasPrevious: true,
				QPs: []QPLatency{{PID: 42, QPNum: 7, Placed: true, Batches: 64, Slowdown: [2]float64{0.9, 1.6}}}}, SevWarn, "QP 7 (pid 42)"},
		{"counters rise, latency flat",
			CongestionFacts{Signals: map[string][2]float64{"mlx5_0/1/hw_counters/np_cnp_sent": {10, 1333}}, HasPrevious: true,
				QPs: []QPLatency{healthy(9, 1.5)}}, "", ""},
		{"latency rises below the baseline",
			CongestionFacts{Signals: map[string][2]float64{"mlx5_0/1/hw_counters/np_cnp_sent": {10, 1333}}, HasPrevious: true,
				QPs: []QPLatency{{PID: 43, QPNum: 9, Placed: true, Slowdown: [2]float64{0.3, 0.8}}}}, "", ""},
		{"a rise needs a previous interval",
			CongestionFacts{Signals: map[string][2]float64{"mlx5_0/1/hw_counters/np_cnp_sent": {0, 1333}},
				QPs: []QPLatency{{PID: 42, QPNum: 7, Placed: true, Slowdown: [2]float64{0.9, 1.6}}}}, "", ""},
		{"timeouts and retransmissions: a failure",
			CongestionFacts{Signals: map[string][2]float64{"mlx5_0/1/hw_counters/local_ack_timeout_err": {0, 27}, "mlx5_0/1/hw_counters/roce_adp_retrans": {0, 3}},
				QPs: []QPLatency{slow}}, SevFail, "QP 7 (pid 42)"},
		{"InfiniBand credit waits", CongestionFacts{Signals: map[string][2]float64{"mlx4_0/1/counters/port_xmit_wait": {0, 3599}}, QPs: []QPLatency{slow}},
			SevWarn, "QP 7 (pid 42)"},
		{"a busy port waits for its own bandwidth", CongestionFacts{Signals: cnp, Busy: true, QPs: []QPLatency{slow}}, "", ""},
		{"a busy port still shows a rise",
			CongestionFacts{Signals: map[string][2]float64{"enp178s0f0/tx_pause_ctrl_phy": {0, 80}}, HasPrevious: true, Busy: true,
				QPs: []QPLatency{{PID: 42, QPNum: 7, Placed: true, Slowdown: [2]float64{1.1, 3}}}}, SevWarn, "QP 7 (pid 42)"},
		{"two slow QPs", CongestionFacts{Signals: cnp, QPs: []QPLatency{slow, {PID: 44, QPNum: 3, Ports: []string{"mlx5_0/1", "mlx5_1/1"}, Slowdown: [2]float64{0, 5}}}},
			SevWarn, "QP 7 (pid 42), QP 3 (pid 44)"},
	} {
		tc.f.Port = "mlx5_0/1"
		f := RDMACongestion(tc.f)
		got := Severity("")
		if f != nil {
			got = f.Severity
		}
		if got != tc.want {
			t.Errorf("%s: %q, want %q (%+v)", tc.name, got, tc.want, f)
			continue
		}
		if f == nil {
			continue
		}
		if f.Subject != "RDMA port mlx5_0/1" || !strings.Contains(f.Summary, tc.qps+" complete") {
			t.Errorf("%s: subject %q summary %q, want the QPs %s", tc.name, f.Subject, f.Summary, tc.qps)
		}
		for _, q := range tc.f.QPs {
			if named := strings.Contains(f.Summary, fmt.Sprintf("QP %d (pid %d)", q.QPNum, q.PID)); named && !strings.Contains(tc.qps, fmt.Sprintf("QP %d (", q.QPNum)) {
				t.Errorf("%s: healthy QP %d named: %s", tc.name, q.QPNum, f.Summary)
			}
		}
	}
	f := RDMACongestion(CongestionFacts{Port: "mlx5_0/1", Signals: cnp, QPs: []QPLatency{{PID: 44, QPNum: 3, Ports: []string{"mlx5_0/1", "mlx5_1/1"}, Batches: 8,
		Slowdown: [2]float64{0, 5}, P99Ns: 76_000, BaselineNs: 15_200}}})
	if f == nil || !strings.Contains(strings.Join(f.Evidence, " "), "QP 3 of pid 44: p99 completion 76.0 µs against a 15.2 µs baseline (5.0×) over 8 completions, its process opened mlx5_0/1, mlx5_1/1: the port is not known") {
		t.Errorf("evidence of an unplaced QP: %+v", f)
	}
}

func TestIsCongestionCounter(t *testing.T) {
	for name, want := range map[string]bool{
		"hw_counters/np_cnp_sent": true, "hw_counters/rp_cnp_handled": true, "hw_counters/np_ecn_marked_roce_packets": true,
		"rx_prio3_pause": true, "rx_prio3_pause_duration": true, "tx_pause_ctrl_phy": true, "counters/port_xmit_wait": true,
		"hw_counters/local_ack_timeout_err": true, "hw_counters/roce_adp_retrans": true, "hw_counters/duplicate_request": true,
		"hw_counters/rnr_nak_retry_err": false, "hw_counters/out_of_buffer": false, "counters/port_rcv_data_bytes": false,
		"rx_prio3_bytes": false, "hw_counters/rx_read_requests": false,
	} {
		if IsCongestionCounter(name) != want {
			t.Errorf("%s: %v, want %v", name, !want, want)
		}
	}
}
