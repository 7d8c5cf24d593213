package exporters

import (
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Collector contributes metrics at scrape time, in node_exporter's shape:
// read the source, send const metrics, keep no state between scrapes. An
// error marks this scrape of it failed (lanewatch_collector_success 0);
// what it sent before the error is still exported. Describe sends every
// descriptor Update may use, for docs/metrics.md (the registry does not
// check them: see scrape.Describe).
type Collector interface {
	Update(ch chan<- prometheus.Metric) error
	Describe(ch chan<- *prometheus.Desc)
}

var (
	descCollectorDuration = prometheus.NewDesc("lanewatch_collector_duration_seconds",
		"How long a collector took at this scrape.", []string{"collector"}, nil)
	descCollectorSuccess = prometheus.NewDesc("lanewatch_collector_success",
		"1 when a collector read its source at this scrape.", []string{"collector"}, nil)
)

// scrape runs named collectors at every scrape and reports how each went.
type scrape struct {
	collectors map[string]Collector
	log        *slog.Logger
}

// Describe implements prometheus.Collector. Only the health metrics are
// described: the collectors' own metrics depend on the hardware found, so
// the registry checks them unchecked, as node_exporter's are.
func (s scrape) Describe(ch chan<- *prometheus.Desc) {
	ch <- descCollectorDuration
	ch <- descCollectorSuccess
}

// Collect implements prometheus.Collector.
func (s scrape) Collect(ch chan<- prometheus.Metric) {
	for name, c := range s.collectors {
		start := time.Now()
		ok := 1.0
		if err := c.Update(ch); err != nil {
			ok = 0
			s.log.Debug("collector failed", "collector", name, "err", err)
		}
		ch <- prometheus.MustNewConstMetric(descCollectorDuration, prometheus.GaugeValue, time.Since(start).Seconds(), name)
		ch <- prometheus.MustNewConstMetric(descCollectorSuccess, prometheus.GaugeValue, ok, name)
	}
}
