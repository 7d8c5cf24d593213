package exporters

import (
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
)

// Per-request buckets. KV wait: 1 ms … 32.8 s in powers of 2 (a prefix
// load of a few MB to a PD transfer stalled behind a congested link). TTFT
// share: fine near 0 (a healthy request) and even steps to 1.
var (
	requestKVBuckets = prometheus.ExponentialBuckets(0.001, 2, 16)
	ttftShareBuckets = []float64{0.01, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1}
)

var (
	descRequestKV = prometheus.NewDesc("lanewatch_request_kv_seconds",
		"Time each summarised request (one lanewatch.kv span) waited on the KV movement attributed to it: the union of its transfers' intervals inside its span (a batch's it shared included), not their sum, in seconds. Kind all: every kind together; h2d, d2h, rdma_in, rdma_out: the kinds it moved or waited on (storage reads add bytes to its span, no wait: their duration is not seen). Scraped as OpenMetrics, each bucket carries the latest request's trace_id and span_id as an exemplar.",
		[]string{"kind"}, nil)
	descRequestTTFTShare = prometheus.NewDesc("lanewatch_request_kv_ttft_share",
		"Share (0 to 1) of each summarised request's time to first token it waited on KV movement (lanewatch.kv.ttft_share), for the requests whose server spans give their TTFT. Scraped as OpenMetrics, each bucket carries the latest request's trace_id and span_id as an exemplar.",
		nil, nil)
	descRequestSummaries = prometheus.NewDesc("lanewatch_request_kv_summaries_total",
		"Requests summarised (one lanewatch.kv span each), by whether the server's spans gave their time to first token: known (counted in lanewatch_request_kv_ttft_share) or unknown.",
		[]string{"ttft"}, nil)
)

// exemplar is a bucket's latest observation and the request it came from.
type exemplar struct {
	value float64
	at    int64 // Unix ns; 0: none
	trace [16]byte
	span  [8]byte
}

// exemplarHistogram is a histogram that keeps, per bucket (+Inf last),
// the exemplar with the latest timestamp: what a scrape shows only moves
// forward, as Prometheus's exemplar storage requires of a series.
type exemplarHistogram struct {
	histogram
	ex []exemplar
}

func newExemplarHistogram(n int) *exemplarHistogram {
	return &exemplarHistogram{histogram: *newHistogram(n), ex: make([]exemplar, n+1)}
}

func (h *exemplarHistogram) observe(bounds []float64, v float64, e exemplar) {
	h.histogram.observe(bounds, v)
	if e.trace == ([16]byte{}) {
		return // no trace to link to
	}
	i := sort.SearchFloat64s(bounds, v)
	if e.at >= h.ex[i].at {
		e.value = v
		h.ex[i] = e
	}
}

func (h *exemplarHistogram) metric(desc *prometheus.Desc, bounds []float64, labels ...string) prometheus.Metric {
	m := h.histogram.metric(desc, bounds, labels...)
	var exs []prometheus.Exemplar
	for _, e := range h.ex {
		if e.at == 0 {
			continue
		}
		// As the spans carry them: 32 and 16 lowercase hex digits.
		l := prometheus.Labels{"trace_id": trace.TraceID(e.trace).String()}
		if e.span != ([8]byte{}) {
			l["span_id"] = trace.SpanID(e.span).String()
		}
		exs = append(exs, prometheus.Exemplar{Value: e.value, Labels: l, Timestamp: time.Unix(0, e.at)})
	}
	if len(exs) == 0 {
		return m
	}
	// Hex labels (63 runes at most) and a timestamp from an int64 of
	// nanoseconds are always valid.
	return prometheus.MustNewMetricWithExemplars(m, exs...)
}

// requestMetrics are the per-request KV series. They have a lock of their
// own: a summary per request must not wait behind the per-transfer counts.
type requestMetrics struct {
	mu        sync.Mutex
	kv        [NumKVKinds + 1]*exemplarHistogram // by KVKind; NumKVKinds: all
	share     *exemplarHistogram
	summaries [2]uint64 // requests summarised: [0] TTFT unknown, [1] known
}

func newRequestMetrics() *requestMetrics {
	r := &requestMetrics{share: newExemplarHistogram(len(ttftShareBuckets))}
	for i := range r.kv {
		r.kv[i] = newExemplarHistogram(len(requestKVBuckets))
	}
	return r
}

// RequestKV observes one request's summary: its KV wait, overall and by
// each kind it moved, and its KV share of TTFT where that is known. The
// exemplars' timestamp is the request span's end (the time of the call
// when unknown). It implements RequestSink.
func (m *Metrics) RequestKV(r *RequestKV) {
	at := r.End
	if at <= 0 {
		at = time.Now().UnixNano()
	}
	e := exemplar{at: at, trace: r.Trace, span: r.Span}
	q := m.requests
	q.mu.Lock()
	defer q.mu.Unlock()
	q.kv[NumKVKinds].observe(requestKVBuckets, r.WaitAll.Seconds(), e)
	for k, b := range r.Bytes {
		// A kind it moved bytes of or waited on (a batch's transfers are
		// in its wait, not its bytes); a storage read's duration is not
		// seen: no wait to tell.
		if (b > 0 || r.Wait[k] > 0) && KVKind(k) != KVStorage {
			q.kv[k].observe(requestKVBuckets, r.Wait[k].Seconds(), e)
		}
	}
	if share, ok := r.TTFTShare(); ok {
		q.share.observe(ttftShareBuckets, share, e)
		q.summaries[1]++
	} else {
		q.summaries[0]++
	}
}

func (q *requestMetrics) collect(ch chan<- prometheus.Metric) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for k, h := range q.kv {
		kind := "all"
		if k < int(NumKVKinds) {
			kind = KVKindNames[k]
		}
		ch <- h.metric(descRequestKV, requestKVBuckets, kind)
	}
	ch <- q.share.metric(descRequestTTFTShare, ttftShareBuckets)
	ch <- prometheus.MustNewConstMetric(descRequestSummaries, prometheus.CounterValue, float64(q.summaries[0]), "unknown")
	ch <- prometheus.MustNewConstMetric(descRequestSummaries, prometheus.CounterValue, float64(q.summaries[1]), "known")
}
