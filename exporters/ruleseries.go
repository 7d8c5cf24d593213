package exporters

import (
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// Desc is one metric of a window rule (judge.Rule): its descriptor and
// whether it is a gauge (the last window's value) or a counter (every
// window's increase, summed since start).
type Desc struct {
	*prometheus.Desc
	Name   string
	Type   prometheus.ValueType
	Labels []string
}

// NewDesc describes a window rule's metric.
func NewDesc(name, help string, t prometheus.ValueType, labels ...string) Desc {
	return Desc{Desc: prometheus.NewDesc(name, help, labels, nil), Name: name, Type: t, Labels: labels}
}

// Sample is one series of a rule's metric over a window: a gauge's value,
// or a counter's increase in the window.
type Sample struct {
	Desc   Desc
	Value  float64
	Labels []string
}

// ruleSeries are the window rules' series: the last window's gauges and
// the counters' totals since start, each bounded by maxSeries.
type ruleSeries struct {
	descs    []Desc
	gauges   []Sample
	counters map[string]*Sample // by descriptor and labels
}

// SetRuleSeries publishes a window's rule series: its gauges replace the
// previous window's, its counters' increases add to their totals.
func (m *Metrics) SetRuleSeries(samples []Sample) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.rules.gauges = m.rules.gauges[:0]
	if m.rules.counters == nil {
		m.rules.counters = map[string]*Sample{}
	}
	for _, s := range samples {
		if s.Desc.Type != prometheus.CounterValue {
			if len(m.rules.gauges) < maxSeries {
				m.rules.gauges = append(m.rules.gauges, Sample{Desc: s.Desc, Value: s.Value, Labels: slices.Clone(s.Labels)})
			}
			continue
		}
		k := s.Desc.String() + "\x00" + strings.Join(s.Labels, "\x00")
		t := m.rules.counters[k]
		if t == nil {
			if len(m.rules.counters) >= maxSeries {
				continue
			}
			t = &Sample{Desc: s.Desc, Labels: slices.Clone(s.Labels)}
			m.rules.counters[k] = t
		}
		t.Value += s.Value
	}
}

func (m *Metrics) collectRules(ch chan<- prometheus.Metric) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, s := range m.rules.gauges {
		ch <- prometheus.MustNewConstMetric(s.Desc.Desc, s.Desc.Type, s.Value, s.Labels...)
	}
	for _, s := range m.rules.counters {
		ch <- prometheus.MustNewConstMetric(s.Desc.Desc, s.Desc.Type, s.Value, s.Labels...)
	}
}
