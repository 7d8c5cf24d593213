package correlate

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// rdma-congestion (seed 002 §6.2, §5): the fabric tells the host it is
// congested through counters — ECN marks and the CNPs that answer them,
// PFC pauses (InfiniBand's credit waits, port_xmit_wait, are the same
// link-level back-pressure), and the retransmissions of a fabric that
// dropped — while the queue pairs see it as completions that come late
// (posted ≠ completed, §5). A finding needs both on one port: counters
// alone may be another tenant's traffic; latency alone may be the
// application polling late.

// congestionSignals are substrings of the counters the rule watches, from
// the mlx5 hw_counters and ethtool statistics of the samples
// (np_cnp_sent, rp_cnp_handled, np_ecn_marked_roce_packets,
// rx_prio3_pause, tx_pause_ctrl_phy, port_xmit_wait) and the loss
// counters below. RNR counters (rnr_nak_retry_err, out_of_buffer) are left
// out on purpose: a receiver not ready is the peer application not posting
// receives in time (§4.3), not the fabric.
var congestionSignals = []string{"cnp", "ecn", "pause", "xmit_wait"}

// lossSignals mean packets were lost or timed out and retransmitted, not
// just slowed: the rule fails instead of warning.
var lossSignals = []string{"local_ack_timeout_err", "packet_seq_err", "out_of_sequence", "implied_nak_seq_err",
	"duplicate_request", "adp_retrans", "slow_restart"}

// IsCongestionCounter reports whether a counter (by file or statistic
// name) is one of the congestion or loss signals rdma-congestion watches.
func IsCongestionCounter(name string) bool {
	for _, s := range append(congestionSignals, lossSignals...) {
		if strings.Contains(name, s) {
			return true
		}
	}
	return false
}

func isLossCounter(name string) bool {
	for _, s := range lossSignals {
		if strings.Contains(name, s) {
			return true
		}
	}
	return false
}

// Thresholds of rdma-congestion, explained in docs/design.md ("Thresholds").
const (
	// SustainedSlowdown: a queue pair whose p99 completion takes this many
	// times the port's baseline, while the port's congestion counters
	// count, fires even without a rise — congestion present from the first
	// window has no earlier window to rise from.
	SustainedSlowdown = 2.0
	// riseSlowdown: with the counters rising, a queue pair whose p99
	// slowdown grew by a quarter since the previous interval and is above
	// the baseline fires.
	riseSlowdown = 1.25
	// risingCounter: a counter rate that appeared, or grew by half.
	risingCounter = 1.5
	// BaselineRTTNs is the round trip the baseline allows a completion
	// beyond its bytes' time at the port's rate until the port has shown
	// a quiet interval of its own, and the least it ever allows: an RC
	// completion waits for the responder's ACK (seed 002 §5.2), and 10 µs
	// is the order of the turnaround time §8.3 works with.
	BaselineRTTNs = 10_000
	// BusyPort: a port carrying this share of its rate in a direction is
	// busy, not starved: its queue pairs wait for its own bandwidth and the
	// sustained path does not judge them.
	BusyPort = 0.8
)

// QPLatency is one queue pair's completions over an interval, set against
// the port's baseline.
type QPLatency struct {
	PID   uint32
	QPNum uint32
	// Endpoint is a transfer library's endpoint (UCX's ucp_ep_h) whose
	// RDMA transfers stand for a queue pair the library drives itself
	// (rc_mlx5, dc_mlx5: no verbs call shows it); QPNum is then 0.
	Endpoint uint64
	// Placed is true when the queue pair is on this port for sure (its
	// process opened no other RDMA device); otherwise Ports names the
	// ports it may be on, this one among them.
	Placed bool
	Ports  []string
	// Batches is how many completions were measured (WRs completed
	// together, unsignaled ones with the next signaled, count once).
	Batches int
	// Slowdown is the p99 of each completion's time over its baseline
	// (its bytes at the port's rate plus the baseline round trip), in the
	// previous interval (0: not seen then) and this one.
	Slowdown [2]float64
	// P99Ns and BaselineNs are the p99 completion time and the baseline
	// of that completion, for the evidence.
	P99Ns, BaselineNs uint64
}

// CongestionFacts are one RDMA port's counters and queue pairs over an
// interval and the one before it.
type CongestionFacts struct {
	Port string // "mlx5_0/1"
	// Signals maps each congestion or loss counter of the port to its rate
	// per second over the previous interval and this one; the previous is
	// meaningful only with HasPrevious.
	Signals     map[string][2]float64
	HasPrevious bool
	// Busy is true when the port carried at least BusyPort of its rate in
	// a direction over the interval (its data counters).
	Busy bool
	// QPs are the queue pairs completing work on the port (or that may be
	// on it), receives excluded: a posted receive waits for the peer to
	// send, which is not the fabric's latency (§5).
	QPs []QPLatency
}

var _ = register(Rule{Name: "rdma-congestion", Severities: []Severity{SevWarn, SevFail}, Checklist: ChecklistCongestion, Where: InWindow | InDiagnose,
	Remediation: "check the fabric, not the host: ECN/PFC configuration (the RoCE priority must be lossless and match DCQCN's), " +
		"switch buffer and egress congestion toward this port, and whether PD traffic and other tenants share the priority"})

// RDMACongestion fires when a port's congestion counters count while queue
// pairs on it complete late: sustained (the counters count this interval
// and a queue pair's p99 completion is at least SustainedSlowdown times
// its baseline, the port not busy) or rising (a counter rose since the
// previous interval and a queue pair's slowdown rose by a quarter, above
// its baseline). Loss counters make it a failure.
func RDMACongestion(f CongestionFacts) *Finding {
	var counting, rising []string
	loss := false
	for _, n := range slices.Sorted(maps.Keys(f.Signals)) {
		r := f.Signals[n]
		if !IsCongestionCounter(n) || r[1] <= 0 {
			continue
		}
		counting = append(counting, fmt.Sprintf("%s %.0f/s", n, r[1]))
		if f.HasPrevious && r[1] > risingCounter*r[0] {
			rising = append(rising, fmt.Sprintf("%s %.0f/s → %.0f/s", n, r[0], r[1]))
		}
		loss = loss || isLossCounter(n)
	}
	if len(counting) == 0 {
		return nil // a quiet fabric: late completions are the host's or the peer's
	}
	var slow []string
	how := ""
	for _, q := range f.QPs {
		sustained := !f.Busy && q.Slowdown[1] >= SustainedSlowdown
		rose := len(rising) > 0 && q.Slowdown[0] > 0 && q.Slowdown[1] >= 1 && q.Slowdown[1] >= riseSlowdown*q.Slowdown[0]
		if !sustained && !rose {
			continue
		}
		where := "on this port"
		if !q.Placed {
			where = "its process opened " + strings.Join(q.Ports, ", ") + ": the port is not known"
		}
		text := fmt.Sprintf("%s of pid %d: p99 completion %s against a %s baseline (%.1f×) over %d completions, %s",
			q.Name(), q.PID, usText(q.P99Ns), usText(q.BaselineNs), q.Slowdown[1], q.Batches, where)
		if rose {
			text += fmt.Sprintf("; up from %.1f× the interval before", q.Slowdown[0])
			how = "rising"
		} else if how == "" {
			how = "sustained"
		}
		slow = append(slow, text)
	}
	if len(slow) == 0 {
		return nil
	}
	sev := SevWarn
	if loss {
		sev = SevFail
	}
	ev := append([]string{"counting: " + strings.Join(counting, ", ")}, slow...)
	if len(rising) > 0 {
		ev = append(ev, "rising since the previous interval: "+strings.Join(rising, ", "))
	}
	if f.Busy {
		ev = append(ev, fmt.Sprintf("the port carried ≥ %.0f%% of its rate: only rises are judged", 100*BusyPort))
	}
	qps := make([]string, 0, len(slow))
	for _, q := range f.QPs {
		for _, s := range slow {
			if strings.HasPrefix(s, fmt.Sprintf("%s of pid %d:", q.Name(), q.PID)) {
				qps = append(qps, fmt.Sprintf("%s (pid %d)", q.Name(), q.PID))
			}
		}
	}
	return newFinding("rdma-congestion", sev, "RDMA port "+f.Port,
		fmt.Sprintf("%s congestion: %s complete%s late while the port counts %s", how, strings.Join(qps, ", "),
			map[bool]string{true: "", false: "s"}[len(qps) > 1], strings.Join(signalNames(counting), ", ")),
		ev, "")
}

// Name says which queue: "QP 7", or a transfer library's endpoint.
func (q QPLatency) Name() string {
	if q.Endpoint != 0 {
		return fmt.Sprintf("endpoint %#x", q.Endpoint)
	}
	return fmt.Sprintf("QP %d", q.QPNum)
}

func signalNames(counting []string) []string {
	out := make([]string, len(counting))
	for i, c := range counting {
		out[i], _, _ = strings.Cut(c, " ")
	}
	return out
}

func usText(ns uint64) string {
	if ns >= 10_000_000 {
		return fmt.Sprintf("%.1f ms", float64(ns)/1e6)
	}
	return fmt.Sprintf("%.1f µs", float64(ns)/1e3)
}
