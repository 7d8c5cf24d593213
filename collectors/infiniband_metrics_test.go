package collectors

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/lanewatch/lanewatch/exporters"
)

// Counter names and values from the byteps#179 mlx5 sample (hw_counters).
func TestInfiniBandMetrics(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "class", "infiniband", "mlx5_0", "ports", "1")
	for name, body := range map[string]string{
		"state": "4: ACTIVE", "phys_state": "5: LinkUp", "rate": "100 Gb/sec (4X EDR)", "link_layer": "Ethernet",
		"counters/port_rcv_data": "1000", "hw_counters/np_cnp_sent": "1333", "hw_counters/local_ack_timeout_err": "2705",
		"hw_counters/rp_cnp_handled": "N/A",
	} {
		p := filepath.Join(dir, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.WriteFile(p, []byte(body+"\n"), 0o644)
	}
	reg := exporters.NewRegistry(exporters.NewMetrics(nil), map[string]exporters.Collector{"rdma_ports": NewInfiniBandMetrics(root)}, nil)
	want := `
# HELP lanewatch_rdma_port_active 1 when the port's state is ACTIVE.
# TYPE lanewatch_rdma_port_active gauge
lanewatch_rdma_port_active{device="mlx5_0",link_layer="Ethernet",port="1"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "lanewatch_rdma_port_active"); err != nil {
		t.Error(err)
	}
	got, err := testutil.GatherAndCount(reg, "lanewatch_rdma_port_counter_total")
	if err != nil || got != 3 { // port_rcv_data_bytes, np_cnp_sent, local_ack_timeout_err; N/A is not a zero
		t.Errorf("%d counters, %v", got, err)
	}
	if v := testutil.ToFloat64(prometheusCounterVec(t, reg, "hw:np_cnp_sent")); v != 1333 {
		t.Errorf("np_cnp_sent %v", v)
	}
	if n, _ := testutil.GatherAndCount(reg, "lanewatch_collector_success"); n != 1 {
		t.Error("no collector success metric")
	}
}

// prometheusCounterVec picks one lanewatch_rdma_port_counter_total series.
func prometheusCounterVec(t *testing.T, reg *prometheus.Registry, counter string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "lanewatch_rdma_port_counter_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "counter" && l.GetValue() == counter {
					c := prometheus.NewCounter(prometheus.CounterOpts{Name: "x"})
					c.Add(m.GetCounter().GetValue())
					return c
				}
			}
		}
	}
	t.Fatalf("no series for %s", counter)
	return nil
}
