package checks

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/lanewatch/lanewatch/correlate"
)

// A port tree with the counter names of the real mlx5 samples (byteps#179
// hw_counters); counters are rewritten between the three snapshots.
func writePort(t *testing.T, root string, counters map[string]uint64) {
	t.Helper()
	dir := filepath.Join(root, "class", "infiniband", "mlx5_0", "ports", "1")
	for name, body := range map[string]string{"state": "4: ACTIVE", "phys_state": "5: LinkUp", "rate": "100 Gb/sec (4X EDR)", "link_layer": "Ethernet"} {
		os.MkdirAll(dir, 0o755)
		os.WriteFile(filepath.Join(dir, name), []byte(body+"\n"), 0o644)
	}
	for name, v := range counters {
		p := filepath.Join(dir, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.WriteFile(p, []byte(fmt.Sprintf("%d\n", v)), 0o644)
	}
}

func TestCongestionProbe(t *testing.T) {
	root := t.TempDir()
	steps := []map[string]uint64{
		{"hw_counters/np_cnp_sent": 1000, "hw_counters/local_ack_timeout_err": 2705, "counters/port_rcv_data": 1e6},
		{"hw_counters/np_cnp_sent": 1010, "hw_counters/local_ack_timeout_err": 2705, "counters/port_rcv_data": 2e6},
		{"hw_counters/np_cnp_sent": 1333, "hw_counters/local_ack_timeout_err": 2732, "counters/port_rcv_data": 3e6},
	}
	writePort(t, root, steps[0])
	cp, err := NewCongestion(root)
	if err != nil || cp == nil {
		t.Fatalf("probe: %v %v", cp, err)
	}
	for i, s := range steps {
		writePort(t, root, s)
		cp.Sample(i)
		time.Sleep(20 * time.Millisecond)
	}
	c := cp.Check([2]uint64{40_000, 120_000})
	if len(c.Findings) != 1 || c.Findings[0].Rule != "rdma-congestion" || c.Findings[0].Severity != correlate.SevFail ||
		c.Findings[0].Subject != "RDMA port mlx5_0/1" {
		t.Fatalf("rising CNPs and timeouts with latency: %+v", c)
	}
	if c := cp.Check([2]uint64{40_000, 41_000}); len(c.Findings) != 0 {
		t.Errorf("flat latency fired: %+v", c.Findings)
	}
	if cp, err := NewCongestion(t.TempDir()); cp != nil || err != nil {
		t.Errorf("a host without RDMA ports: %v %v", cp, err)
	}
}

func TestHalfLatencies(t *testing.T) {
	ts := []correlate.Transfer{
		{QPNum: 1, SubmitNs: 100, CompleteNs: 200},   // first half, 100 ns
		{QPNum: 1, SubmitNs: 1500, CompleteNs: 1900}, // second half, 400 ns
		{QPNum: 0, SubmitNs: 0, CompleteNs: 1900},    // a CUDA copy: not RDMA
		{QPNum: 2, SubmitNs: 10, CompleteNs: 0},      // never completed
	}
	if got := HalfLatencies(ts, 0, 2000*time.Nanosecond); got != [2]uint64{100, 400} {
		t.Errorf("%v", got)
	}
}
