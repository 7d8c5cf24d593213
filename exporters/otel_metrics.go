package exporters

import (
	"github.com/prometheus/client_golang/prometheus"
)

var (
	descSpanTransfers = prometheus.NewDesc("lanewatch_span_transfers_total",
		"Transfers made into spans, by attribution: request (one request), batch (several requests: ids and links), none (no request, by reason in lanewatch_span_unattributed_total).",
		[]string{"attribution"}, nil)
	descSpanUnattributed = prometheus.NewDesc("lanewatch_span_unattributed_total",
		"Transfer spans naming no request, by reason: no_attributor (no OTLP bridge), no_spans (no server span indexed), not_covered (no span covered it), "+
			"other_host (only another host's thread spans did), ambiguous (more spans of one thread or process covered it than a batch could be told from), open_timeout (a request that may cover it was still open after --spans.max-hold), "+
			"memory (released while waiting to stay within the held budget), open_at_exit (still waiting when the agent stopped), stopping (not attributed: the agent was stopping and its grace had passed).",
		[]string{"reason"}, nil)
	descSpanIncomplete = prometheus.NewDesc("lanewatch_span_incomplete_total",
		"Transfer spans attributed while a request that may also cover them was still open (--spans.max-hold, the held budget, exit).", nil, nil)
	descSpanEarly = prometheus.NewDesc("lanewatch_span_early_releases_total",
		"Transfers released before --spans.hold because the held budget was full.", nil, nil)
	descSpanHeld = prometheus.NewDesc("lanewatch_span_transfers_held",
		"Transfers held before becoming spans: hold (waiting --spans.hold for the server's spans), open (past it, waiting for a request still open).",
		[]string{"state"}, nil)
)

// SpansCollector exposes the span exporter's counters at scrape time.
type SpansCollector struct{ S *Spans }

// Update implements Collector.
func (c SpansCollector) Update(ch chan<- prometheus.Metric) error {
	st := c.S.Stats()
	var none uint64
	for _, r := range UnattributedReasons {
		ch <- prometheus.MustNewConstMetric(descSpanUnattributed, prometheus.CounterValue, float64(st.Unattributed[r]), r)
	}
	for _, v := range st.Unattributed {
		none += v
	}
	ch <- prometheus.MustNewConstMetric(descSpanTransfers, prometheus.CounterValue, float64(st.Attributed), "request")
	ch <- prometheus.MustNewConstMetric(descSpanTransfers, prometheus.CounterValue, float64(st.Batched), "batch")
	ch <- prometheus.MustNewConstMetric(descSpanTransfers, prometheus.CounterValue, float64(none), "none")
	ch <- prometheus.MustNewConstMetric(descSpanIncomplete, prometheus.CounterValue, float64(st.Incomplete))
	ch <- prometheus.MustNewConstMetric(descSpanEarly, prometheus.CounterValue, float64(st.EarlyRelease))
	ch <- prometheus.MustNewConstMetric(descSpanHeld, prometheus.GaugeValue, float64(st.Held-st.Waiting), "hold")
	ch <- prometheus.MustNewConstMetric(descSpanHeld, prometheus.GaugeValue, float64(st.Waiting), "open")
	return nil
}
