package exporters

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/lanewatch/lanewatch/otlpbridge"
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
	descSpanWithheld = prometheus.NewDesc("lanewatch_span_withheld_transfers_total",
		"Transfers naming no request that no span was made for: no request the server sampled covers them (--spans.export-unattributed off), by reason as in lanewatch_span_unattributed_total.",
		[]string{"reason"}, nil)
	descSpanSummaries = prometheus.NewDesc("lanewatch_span_request_summaries_total",
		"Requests summed up in a lanewatch.kv span, by when: settled (their span ended and their transfers left the hold), early (before, to keep at most 16384 requests gathered).",
		[]string{"when"}, nil)
	descSpanHeld = prometheus.NewDesc("lanewatch_span_transfers_held",
		"Transfers held before becoming spans: hold (waiting --spans.hold for the server's spans), open (past it, waiting for a request still open).",
		[]string{"state"}, nil)
)

// SpansCollector exposes the span exporter's counters at scrape time.
type SpansCollector struct{ S *Spans }

// Describe implements Collector.
func (SpansCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descSpanTransfers, descSpanUnattributed, descSpanWithheld, descSpanIncomplete, descSpanEarly, descSpanHeld,
		descSpanSummaries} {
		ch <- d
	}
}

// Update implements Collector.
func (c SpansCollector) Update(ch chan<- prometheus.Metric) error {
	st := c.S.Stats()
	var none uint64
	for _, r := range UnattributedReasons {
		ch <- prometheus.MustNewConstMetric(descSpanUnattributed, prometheus.CounterValue, float64(st.Unattributed[r]), r)
		ch <- prometheus.MustNewConstMetric(descSpanWithheld, prometheus.CounterValue, float64(st.Withheld[r]), r)
	}
	ch <- prometheus.MustNewConstMetric(descSpanSummaries, prometheus.CounterValue, float64(st.Summaries-st.SummariesEarly), "settled")
	ch <- prometheus.MustNewConstMetric(descSpanSummaries, prometheus.CounterValue, float64(st.SummariesEarly), "early")
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

var (
	descOTLPReceived = prometheus.NewDesc("lanewatch_otlp_received_requests_total",
		"OTLP export requests received by the bridge, by transport (grpc, http).", []string{"transport"}, nil)
	descOTLPRefused = prometheus.NewDesc("lanewatch_otlp_rejected_requests_total",
		"OTLP export requests refused, by transport and reason: too_large (past --otlp.max-body: HTTP 413, gRPC ResourceExhausted), "+
			"bad_payload (undecodable: HTTP 400, gRPC InvalidArgument), unsupported (Content-Type or Content-Encoding: HTTP 415), "+
			"overloaded (--otlp.max-concurrent or the decode budget reached: HTTP 429, gRPC ResourceExhausted, both retryable), "+
			"read_error (the body could not be read: timeout, sender gone).",
		[]string{"transport", "reason"}, nil)
	descOTLPForwarded = prometheus.NewDesc("lanewatch_otlp_forwarded_requests_total",
		"Received OTLP requests forwarded upstream, by result (ok, failed: the sender was told so and may retry).", []string{"result"}, nil)
	descOTLPInFlight = prometheus.NewDesc("lanewatch_otlp_requests_in_flight",
		"OTLP requests being read or decoded now (at most --otlp.max-concurrent).", nil, nil)
	descOTLPBudget = prometheus.NewDesc("lanewatch_otlp_decode_budget_bytes",
		"The memory OTLP requests being read and decoded may hold (state=max, a quarter of --memory-limit) and hold now (state=used).", []string{"state"}, nil)
	descSpansExported = prometheus.NewDesc("lanewatch_spans_exported_total",
		"lanewatch's own spans (transfers, findings) sent upstream, by result (ok, failed: dropped after the exporter's retries).", []string{"result"}, nil)
	descIndexStored = prometheus.NewDesc("lanewatch_otlp_index_stored",
		"What the span index holds now for attribution: spans, request names, rooms and open requests (kind=things), and their estimated size (kind=bytes; the budget is --otlp.index-max-bytes).", []string{"kind"}, nil)
	descIndexEvicted = prometheus.NewDesc("lanewatch_otlp_index_evicted_total",
		"What the span index let go, by reason: age (a span past --otlp.index-window), budget (a span, the budget full), info_budget (a request name or room, the budget full), "+
			"open_expired (an open request without its span after the window), open_dropped (an open request not tracked: the budget full).", []string{"reason"}, nil)
	descIndexClamped = prometheus.NewDesc("lanewatch_otlp_index_clamped_spans_total",
		"Spans whose end lay past their arrival + --otlp.index-window: kept only until then.", nil, nil)
)

// OTLPCollector exposes the bridge's counters at scrape time.
type OTLPCollector struct {
	Stats func() otlpbridge.Stats
	Index func() otlpbridge.IndexStats // nil: no index metrics
}

// Describe implements Collector.
func (OTLPCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descOTLPReceived, descOTLPRefused, descOTLPForwarded, descOTLPInFlight, descOTLPBudget,
		descIndexStored, descIndexEvicted, descIndexClamped} {
		ch <- d
	}
}

// Update implements Collector.
func (c OTLPCollector) Update(ch chan<- prometheus.Metric) error {
	st := c.Stats()
	for _, t := range []string{otlpbridge.TransportGRPC, otlpbridge.TransportHTTP} {
		ch <- prometheus.MustNewConstMetric(descOTLPReceived, prometheus.CounterValue, float64(st.Received[t]), t)
		for _, r := range otlpbridge.Reasons {
			ch <- prometheus.MustNewConstMetric(descOTLPRefused, prometheus.CounterValue, float64(st.Refused[otlpbridge.Refusal{Transport: t, Reason: r}]), t, r)
		}
	}
	ch <- prometheus.MustNewConstMetric(descOTLPForwarded, prometheus.CounterValue, float64(st.Forwarded), "ok")
	ch <- prometheus.MustNewConstMetric(descOTLPForwarded, prometheus.CounterValue, float64(st.ForwardErrors), "failed")
	ch <- prometheus.MustNewConstMetric(descOTLPInFlight, prometheus.GaugeValue, float64(st.InFlight))
	ch <- prometheus.MustNewConstMetric(descOTLPBudget, prometheus.GaugeValue, float64(st.Budget), "max")
	ch <- prometheus.MustNewConstMetric(descOTLPBudget, prometheus.GaugeValue, float64(st.BudgetUsed), "used")
	if c.Index == nil {
		return nil
	}
	ix := c.Index()
	ch <- prometheus.MustNewConstMetric(descIndexStored, prometheus.GaugeValue, float64(ix.Stored), "things")
	ch <- prometheus.MustNewConstMetric(descIndexStored, prometheus.GaugeValue, float64(ix.Bytes), "bytes")
	for _, e := range []struct {
		reason string
		n      uint64
	}{{"age", ix.Evicted}, {"budget", ix.CapEvicts}, {"info_budget", ix.InfoEvicts}, {"open_expired", ix.OpenExpired}, {"open_dropped", ix.OpenDropped}} {
		ch <- prometheus.MustNewConstMetric(descIndexEvicted, prometheus.CounterValue, float64(e.n), e.reason)
	}
	ch <- prometheus.MustNewConstMetric(descIndexClamped, prometheus.CounterValue, float64(ix.Clamped))
	return nil
}

// SpanExportCollector exposes the span exporter's sent and failed spans.
type SpanExportCollector struct{ E *CountingExporter }

// Describe implements Collector.
func (SpanExportCollector) Describe(ch chan<- *prometheus.Desc) { ch <- descSpansExported }

// Update implements Collector.
func (c SpanExportCollector) Update(ch chan<- prometheus.Metric) error {
	ok, failed := c.E.Counts()
	ch <- prometheus.MustNewConstMetric(descSpansExported, prometheus.CounterValue, float64(ok), "ok")
	ch <- prometheus.MustNewConstMetric(descSpansExported, prometheus.CounterValue, float64(failed), "failed")
	return nil
}
