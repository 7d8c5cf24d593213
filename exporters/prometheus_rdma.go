package exporters

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	lwcollectors "github.com/lanewatch/lanewatch/collectors"
)

// RDMAPorts exports every RDMA port's counters and hw_counters at scrape
// time (node_exporter style: read, push const metrics, keep no state), so
// Prometheus computes the rates. Labels are bounded by the hardware:
// device, port and the counter's file name.
type RDMAPorts struct {
	SysRoot string

	counter, state, duration, success *prometheus.Desc
}

// NewRDMAPorts describes the metrics once.
func NewRDMAPorts(sysRoot string) *RDMAPorts {
	return &RDMAPorts{
		SysRoot: sysRoot,
		counter: prometheus.NewDesc("lanewatch_rdma_port_counter_total",
			"RDMA port counters and hw_counters (congestion: np_cnp_sent, rp_cnp_handled, np_ecn_marked_roce_packets; loss: out_of_sequence, packet_seq_err, local_ack_timeout_err, …); port_rcv_data/port_xmit_data are converted from 4-byte words to bytes and named *_bytes.",
			[]string{"device", "port", "counter"}, nil),
		state: prometheus.NewDesc("lanewatch_rdma_port_active", "1 when the port's state is ACTIVE.",
			[]string{"device", "port", "link_layer"}, nil),
		duration: prometheus.NewDesc("lanewatch_collector_duration_seconds", "How long a collector took at this scrape.",
			[]string{"collector"}, nil),
		success: prometheus.NewDesc("lanewatch_collector_success", "1 when a collector read its source at this scrape.",
			[]string{"collector"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (r *RDMAPorts) Describe(ch chan<- *prometheus.Desc) {
	ch <- r.counter
	ch <- r.state
	ch <- r.duration
	ch <- r.success
}

// Collect implements prometheus.Collector.
func (r *RDMAPorts) Collect(ch chan<- prometheus.Metric) {
	start := time.Now()
	ports, err := lwcollectors.ReadInfiniBand(r.SysRoot)
	ok := 1.0
	if err != nil {
		ok = 0
	}
	for _, p := range ports {
		port := strconv.Itoa(p.Port)
		active := 0.0
		if p.State == "ACTIVE" {
			active = 1
		}
		ch <- prometheus.MustNewConstMetric(r.state, prometheus.GaugeValue, active, p.Device, port, p.LinkLayer)
		for name, v := range p.Counters {
			ch <- prometheus.MustNewConstMetric(r.counter, prometheus.CounterValue, float64(v), p.Device, port, name)
		}
		for name, v := range p.HWCounters {
			ch <- prometheus.MustNewConstMetric(r.counter, prometheus.CounterValue, float64(v), p.Device, port, "hw:"+name)
		}
	}
	ch <- prometheus.MustNewConstMetric(r.duration, prometheus.GaugeValue, time.Since(start).Seconds(), "rdma_ports")
	ch <- prometheus.MustNewConstMetric(r.success, prometheus.GaugeValue, ok, "rdma_ports")
}
