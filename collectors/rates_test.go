package collectors

import (
	"errors"
	"math"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/lanewatch/lanewatch/internal/sysfstest"
)

func TestRates(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	snap := func(d time.Duration, cs CounterSet, un ...string) Snapshot {
		return Snapshot{Time: t0.Add(d), Counters: cs, Unavailable: un}
	}
	tests := []struct {
		name       string
		prev, cur  Snapshot
		want       map[string]float64 // key → per second
		wantUnits  map[string]Unit
		wantResets []string
	}{
		{"bytes, packets, events over 2 s",
			snap(0, CounterSet{"mlx5_0/1/counters/port_xmit_data_bytes": 1000, "mlx5_0/1/counters/port_xmit_packets": 10,
				"mlx5_0/1/hw_counters/np_cnp_sent": 1333}),
			snap(2*time.Second, CounterSet{"mlx5_0/1/counters/port_xmit_data_bytes": 5000, "mlx5_0/1/counters/port_xmit_packets": 30,
				"mlx5_0/1/hw_counters/np_cnp_sent": 1339}),
			map[string]float64{"mlx5_0/1/counters/port_xmit_data_bytes": 2000, "mlx5_0/1/counters/port_xmit_packets": 10,
				"mlx5_0/1/hw_counters/np_cnp_sent": 3},
			map[string]Unit{"mlx5_0/1/counters/port_xmit_data_bytes": UnitBytes, "mlx5_0/1/counters/port_xmit_packets": UnitPackets,
				"mlx5_0/1/hw_counters/np_cnp_sent": UnitEvents},
			nil},
		{"unchanged counter is a zero rate",
			snap(0, CounterSet{"a/rx_prio3_pause": 7}), snap(time.Second, CounterSet{"a/rx_prio3_pause": 7}),
			map[string]float64{"a/rx_prio3_pause": 0}, nil, nil},
		{"reset: no rate, reported",
			snap(0, CounterSet{"mlx5_0/1/hw_counters/out_of_sequence": 500, "x/rx_packets_phy": 10}),
			snap(time.Second, CounterSet{"mlx5_0/1/hw_counters/out_of_sequence": 3, "x/rx_packets_phy": 20}),
			map[string]float64{"x/rx_packets_phy": 10}, nil,
			[]string{"mlx5_0/1/hw_counters/out_of_sequence"}},
		{"32-bit wrap is reported, not guessed",
			snap(0, CounterSet{"mlx4_0/1/counters/port_xmit_packets": math.MaxUint32 - 5}),
			snap(time.Second, CounterSet{"mlx4_0/1/counters/port_xmit_packets": 4}),
			map[string]float64{}, nil, []string{"mlx4_0/1/counters/port_xmit_packets"}},
		{"full 64-bit range increase",
			snap(0, CounterSet{"c/tx_bytes": 0}), snap(time.Second, CounterSet{"c/tx_bytes": math.MaxUint64}),
			map[string]float64{"c/tx_bytes": math.MaxUint64}, nil, nil},
		{"appeared and disappeared counters have no rate",
			snap(0, CounterSet{"old/rx_packets": 1, "both/rx_packets": 1}),
			snap(time.Second, CounterSet{"new/rx_packets": 9, "both/rx_packets": 4}),
			map[string]float64{"both/rx_packets": 3}, nil, nil},
		{"N/A in either reading: no value, no rate",
			snap(0, CounterSet{"d/1/counters/port_xmit_wait": 5}, "d/1/hw_counters/np_cnp_sent"),
			snap(time.Second, CounterSet{"d/1/hw_counters/np_cnp_sent": 9}, "d/1/counters/port_xmit_wait"),
			map[string]float64{}, nil, nil},
		{"pause duration in µs is a fraction of time",
			snap(0, CounterSet{"e/rx_prio3_pause_duration": 0}),
			snap(2*time.Second, CounterSet{"e/rx_prio3_pause_duration": 500_000}),
			map[string]float64{"e/rx_prio3_pause_duration": 0.25}, map[string]Unit{"e/rx_prio3_pause_duration": UnitSeconds}, nil},
		{"same time: no rates",
			snap(time.Second, CounterSet{"a/x": 1}), snap(time.Second, CounterSet{"a/x": 2}),
			map[string]float64{}, nil, nil},
		{"time went backwards: no rates",
			snap(2*time.Second, CounterSet{"a/x": 1}), snap(time.Second, CounterSet{"a/x": 2}),
			map[string]float64{}, nil, nil},
		{"empty snapshots", snap(0, nil), snap(time.Second, nil), map[string]float64{}, nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, resets := Rates(tt.prev, tt.cur)
			if !reflect.DeepEqual(resets, tt.wantResets) {
				t.Errorf("resets %v, want %v", resets, tt.wantResets)
			}
			if len(got) != len(tt.want) {
				t.Errorf("rates %v, want %v", got, tt.want)
			}
			for k, w := range tt.want {
				r, ok := got[k]
				if !ok || math.Abs(r.PerSecond-w) > 1e-9*math.Max(1, w) {
					t.Errorf("%s: %+v, %v; want %g/s", k, r, ok, w)
				}
				if r.PerSecond < 0 || math.IsInf(r.PerSecond, 0) || math.IsNaN(r.PerSecond) {
					t.Errorf("%s: rate %g", k, r.PerSecond)
				}
				if r.Interval != tt.cur.Time.Sub(tt.prev.Time) {
					t.Errorf("%s: interval %v", k, r.Interval)
				}
				if u, ok := tt.wantUnits[k]; ok && r.Unit != u {
					t.Errorf("%s: unit %s, want %s", k, r.Unit, u)
				}
			}
		})
	}
}

func TestUnitOf(t *testing.T) {
	for k, want := range map[string]Unit{
		"mlx5_0/1/counters/port_rcv_data_bytes":           UnitBytes,
		"eth0/rx_octets_phy":                              UnitBytes,
		"mlx5_0/1/counters/unicast_rcv_packets":           UnitPackets,
		"eth0/rx_pfc_ena_frames_pri3":                     UnitPackets,
		"mlx5_0/1/hw_counters/np_ecn_marked_roce_packets": UnitPackets,
		"eth0/tx_prio3_pause_duration":                    UnitSeconds,
		"mlx5_0/1/hw_counters/rp_cnp_handled":             UnitEvents,
		"mlx5_0/1/counters/port_xmit_wait":                UnitEvents,
		"eth0/tx_pause_storm_error_events":                UnitEvents,
		"bytes_dir/rx_prio3_pause":                        UnitEvents, // only the last element counts
	} {
		if got := UnitOf(k); got != want {
			t.Errorf("UnitOf(%s) = %s, want %s", k, got, want)
		}
	}
}

// TestRDMACountersSample samples a fixture tree twice, with the counters
// moved between the two readings as a busy RoCE port would, and one reset.
func TestRDMACountersSample(t *testing.T) {
	const sample = "prometheus-procfs_fixture_mlx5_0_IB-EDR_counters_and_hw_counters.txt"
	root := buildIBTree(t, mlx5Host, sample)
	var s Sampler = RDMACounters{SysRoot: root}
	prev, err := s.Sample()
	if err != nil {
		t.Fatal(err)
	}
	if got := prev.Counters["mlx5_0/1/counters/port_xmit_data_bytes"]; got != 2880761508848*4 {
		t.Errorf("port_xmit_data_bytes %d", got)
	}
	if got := prev.Counters["mlx5_0/1/hw_counters/req_cqe_error"]; got != 3481 {
		t.Errorf("req_cqe_error %d", got)
	}
	if _, ok := prev.Counters["mlx5_0/1/hw_counters/lifespan"]; ok {
		t.Error("lifespan is a setting, not a counter")
	}
	if len(prev.Counters) != 21+24 {
		t.Errorf("%d counters, want 45", len(prev.Counters))
	}

	port := filepath.Join(root, "class/infiniband/mlx5_0/ports/1")
	sysfstest.Write(t, filepath.Join(port, "counters/port_xmit_data"), "2880761508848\n") // +0
	sysfstest.Write(t, filepath.Join(port, "counters/port_rcv_data"), "18126346378\n")    // +1000 words
	sysfstest.Write(t, filepath.Join(port, "hw_counters/out_of_sequence"), "0\n")         // reset
	sysfstest.Write(t, filepath.Join(port, "hw_counters/local_ack_timeout_err"), "N/A\n") // unavailable now
	cur, err := s.Sample()
	if err != nil {
		t.Fatal(err)
	}
	if !cur.Time.After(prev.Time) {
		t.Fatalf("times %v, %v", prev.Time, cur.Time)
	}
	cur.Time = prev.Time.Add(500 * time.Millisecond) // a fixed interval for exact rates
	rates, resets := Rates(prev, cur)
	if !reflect.DeepEqual(resets, []string{"mlx5_0/1/hw_counters/out_of_sequence"}) {
		t.Errorf("resets %v", resets)
	}
	if r := rates["mlx5_0/1/counters/port_rcv_data_bytes"]; r.Delta != 4000 || r.PerSecond != 8000 || r.Unit != UnitBytes {
		t.Errorf("port_rcv_data_bytes rate %+v", r)
	}
	if r, ok := rates["mlx5_0/1/counters/port_xmit_data_bytes"]; !ok || r.PerSecond != 0 {
		t.Errorf("port_xmit_data_bytes rate %+v, %v", r, ok)
	}
	if _, ok := rates["mlx5_0/1/hw_counters/local_ack_timeout_err"]; ok {
		t.Error("N/A counter has a rate")
	}
	if !reflect.DeepEqual(cur.Unavailable, []string{"mlx5_0/1/hw_counters/local_ack_timeout_err"}) {
		t.Errorf("unavailable %v", cur.Unavailable)
	}
	if len(rates) != 45-2 {
		t.Errorf("%d rates, want 43", len(rates))
	}

	if _, err := (RDMACounters{SysRoot: filepath.Join(root, "missing")}).Sample(); err == nil {
		t.Error("missing sysfs root: no error")
	}
}

// TestEthtoolCountersRoCE finds the RoCE netdev through the port's
// gid_attrs and reads it through the injected reader (the saved ethtool -S
// of the same host, byteps#179).
func TestEthtoolCountersRoCE(t *testing.T) {
	host := sysfstest.Host{Funcs: []sysfstest.Func{{BDF: "0000:b2:00.0", HB: "pci0000:b0",
		Class: "0x020000", Vendor: "0x15b3", Device: "0x1017", Net: []string{"enp178s0f0"}, RDMA: []string{"mlx5_0"}}}}
	root := buildIBTree(t, host, "byteps-issue-179_mlx5_0_hw_counters_PARTIAL_grep.txt")
	port := filepath.Join(root, "class/infiniband/mlx5_0/ports/1")
	sysfstest.Write(t, filepath.Join(port, "link_layer"), "Ethernet\n")
	sysfstest.Write(t, filepath.Join(port, "gid_attrs/ndevs/0"), "enp178s0f0\n")

	saved := readEthtoolSample(t, "byteps-issue-179_mlx5_enp178s0f0_grep_prio_before_2to1.txt")
	var asked []string
	s := EthtoolCounters{SysRoot: root, Read: func(ifname string) (map[string]uint64, error) {
		asked = append(asked, ifname)
		if ifname != "enp178s0f0" {
			return nil, errors.New("unexpected netdev " + ifname)
		}
		return saved, nil
	}}
	snap, err := s.Sample()
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(asked, []string{"enp178s0f0"}) {
		t.Errorf("read %v", asked)
	}
	if len(snap.Counters) != 32 || snap.Counters["enp178s0f0/rx_prio0_bytes"] != 88178050405854 {
		t.Errorf("snapshot %v", snap.Counters)
	}
	s.Read = func(string) (map[string]uint64, error) { return nil, errors.New("boom") }
	if _, err := s.Sample(); err == nil {
		t.Error("reader error lost")
	}
}
