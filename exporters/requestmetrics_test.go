package exporters

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"

	"github.com/lanewatch/lanewatch/internal/promtest"
)

// traceID and spanID are ids whose every byte is b.
func traceID(b byte) (t [16]byte) {
	for i := range t {
		t[i] = b
	}
	return t
}

func spanID(b byte) (s [8]byte) {
	for i := range s {
		s[i] = b
	}
	return s
}

// requestShapes are summaries as the span exporter builds them, one of each
// shape the metrics treat apart.
var requestShapes = []struct {
	name string
	r    RequestKV
}{
	{"prefix load, TTFT known", RequestKV{Trace: traceID(0xa1), Span: spanID(0xb1), End: 1_700_000_001e9,
		Bytes: [NumKVKinds]uint64{KVH2D: 64 << 20}, Wait: [NumKVKinds]time.Duration{KVH2D: 30 * time.Millisecond},
		WaitAll: 30 * time.Millisecond, Transfers: 8, TTFT: 100 * time.Millisecond, TTFTSource: TTFTVLLM, TTFTWait: 30 * time.Millisecond}},
	{"PD decode side and a storage read, TTFT unknown", RequestKV{Trace: traceID(0xa2), Span: spanID(0xb2), End: 1_700_000_002e9,
		Bytes: [NumKVKinds]uint64{KVRDMAIn: 256 << 20, KVStorage: 16 << 20},
		Wait:  [NumKVKinds]time.Duration{KVRDMAIn: 200 * time.Millisecond}, // a storage read's duration is not seen
		// overlapping: the union is less than the sum
		WaitAll: 201 * time.Millisecond, Transfers: 40}},
	{"no KV of its own, TTFT known", RequestKV{Trace: traceID(0xa3), Span: spanID(0xb3), End: 1_700_000_003e9,
		Shared: 2, SharedBytes: 1 << 20, TTFT: 50 * time.Millisecond, TTFTSource: TTFTSGLangPrefill}},
	{"no trace: counted, no exemplar", RequestKV{End: 1_700_000_004e9,
		Bytes: [NumKVKinds]uint64{KVD2H: 1 << 20}, Wait: [NumKVKinds]time.Duration{KVD2H: 2 * time.Millisecond},
		WaitAll: 2 * time.Millisecond, TTFT: 10 * time.Millisecond, TTFTSource: TTFTSGLangDecode, TTFTWait: 2 * time.Millisecond}},
	{"stalled past the last bucket, all of TTFT", RequestKV{Trace: traceID(0xa5), Span: spanID(0xb5), End: 1_700_000_005e9,
		Bytes: [NumKVKinds]uint64{KVRDMAIn: 1 << 30}, Wait: [NumKVKinds]time.Duration{KVRDMAIn: 40 * time.Second},
		WaitAll: 40 * time.Second, TTFT: 41 * time.Second, TTFTSource: TTFTVLLM, TTFTWait: 40 * time.Second}},
	{"same bucket as the first, ended earlier: not the exemplar", RequestKV{Trace: traceID(0xa6), Span: spanID(0xb6), End: 1_700_000_000e9,
		Bytes: [NumKVKinds]uint64{KVH2D: 64 << 20}, Wait: [NumKVKinds]time.Duration{KVH2D: 31 * time.Millisecond},
		WaitAll: 31 * time.Millisecond, TTFT: 100 * time.Millisecond, TTFTSource: TTFTVLLM, TTFTWait: 31 * time.Millisecond}},
}

func requestMetricsFed() (*Metrics, *prometheus.Registry) {
	m := NewMetrics(nil)
	for _, s := range requestShapes {
		m.RequestKV(&s.r)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(m)
	return m, reg
}

// bucketExemplar is one bucket's exemplar as a scrape shows it.
type bucketExemplar struct {
	le, trace, span string
	value           float64
	at              time.Time
}

// histogramOf gathers the histogram family name's series whose labels
// include want: count, sum and the buckets' exemplars.
func histogramOf(t *testing.T, reg *prometheus.Registry, name string, want map[string]string) (uint64, float64, []bucketExemplar) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if !hasLabels(m, want) {
				continue
			}
			h := m.GetHistogram()
			var exs []bucketExemplar
			for _, b := range h.GetBucket() {
				if e := b.GetExemplar(); e != nil {
					be := bucketExemplar{le: fmt.Sprint(b.GetUpperBound()), value: e.GetValue(), at: e.GetTimestamp().AsTime()}
					for _, l := range e.GetLabel() {
						switch l.GetName() {
						case "trace_id":
							be.trace = l.GetValue()
						case "span_id":
							be.span = l.GetValue()
						default:
							t.Errorf("%s%v: exemplar label %s", name, want, l.GetName())
						}
					}
					exs = append(exs, be)
				}
			}
			return h.GetSampleCount(), h.GetSampleSum(), exs
		}
	}
	t.Fatalf("no %s%v series", name, want)
	return 0, 0, nil
}

func hasLabels(m *dto.Metric, want map[string]string) bool {
	n := 0
	for _, l := range m.GetLabel() {
		if v, ok := want[l.GetName()]; ok && v == l.GetValue() {
			n++
		}
	}
	return n == len(want)
}

func TestRequestKVHistograms(t *testing.T) {
	_, reg := requestMetricsFed()
	hexID := func(b byte, n int) string { return strings.Repeat(fmt.Sprintf("%02x", b), n) }
	at := func(s int64) time.Time { return time.Unix(s, 0).UTC() }
	for _, c := range []struct {
		name   string
		labels map[string]string
		count  uint64
		sum    float64
		ex     []bucketExemplar
	}{
		// Every request, its union of waits; the second of the 32 ms bucket
		// ended earlier than the first: the first stays its exemplar.
		{"lanewatch_request_kv_seconds", map[string]string{"kind": "all"}, 6, 0.030 + 0.201 + 0 + 0.002 + 40 + 0.031, []bucketExemplar{
			{le: "0.001", trace: hexID(0xa3, 16), span: hexID(0xb3, 8), value: 0, at: at(1_700_000_003)},
			{le: "0.032", trace: hexID(0xa1, 16), span: hexID(0xb1, 8), value: 0.030, at: at(1_700_000_001)},
			{le: "0.256", trace: hexID(0xa2, 16), span: hexID(0xb2, 8), value: 0.201, at: at(1_700_000_002)},
			{le: "+Inf", trace: hexID(0xa5, 16), span: hexID(0xb5, 8), value: 40, at: at(1_700_000_005)},
		}},
		{"lanewatch_request_kv_seconds", map[string]string{"kind": "h2d"}, 2, 0.061, []bucketExemplar{
			{le: "0.032", trace: hexID(0xa1, 16), span: hexID(0xb1, 8), value: 0.030, at: at(1_700_000_001)},
		}},
		{"lanewatch_request_kv_seconds", map[string]string{"kind": "d2h"}, 1, 0.002, nil}, // its request has no trace
		{"lanewatch_request_kv_seconds", map[string]string{"kind": "rdma_in"}, 2, 40.2, []bucketExemplar{
			{le: "0.256", trace: hexID(0xa2, 16), span: hexID(0xb2, 8), value: 0.2, at: at(1_700_000_002)},
			{le: "+Inf", trace: hexID(0xa5, 16), span: hexID(0xb5, 8), value: 40, at: at(1_700_000_005)},
		}},
		{"lanewatch_request_kv_seconds", map[string]string{"kind": "rdma_out"}, 0, 0, nil},
		{"lanewatch_request_kv_seconds", map[string]string{"kind": "storage"}, 0, 0, nil}, // bytes, no wait to tell
		// The requests with a TTFT: 0.3, 0 (none of its own), 0.2, 40/41, 0.31.
		{"lanewatch_request_kv_ttft_share", nil, 5, 0.3 + 0 + 0.2 + 40.0/41 + 0.31, []bucketExemplar{
			{le: "0.01", trace: hexID(0xa3, 16), span: hexID(0xb3, 8), value: 0, at: at(1_700_000_003)},
			{le: "0.3", trace: hexID(0xa1, 16), span: hexID(0xb1, 8), value: 0.3, at: at(1_700_000_001)},
			{le: "0.4", trace: hexID(0xa6, 16), span: hexID(0xb6, 8), value: 0.31, at: at(1_700_000_000)},
			{le: "1", trace: hexID(0xa5, 16), span: hexID(0xb5, 8), value: 40.0 / 41, at: at(1_700_000_005)},
		}},
	} {
		count, sum, ex := histogramOf(t, reg, c.name, c.labels)
		if count != c.count || math.Abs(sum-c.sum) > 1e-9 {
			t.Errorf("%s%v: count %d sum %g, want %d and %g", c.name, c.labels, count, sum, c.count, c.sum)
		}
		if len(ex) != len(c.ex) {
			t.Errorf("%s%v: exemplars %+v, want %+v", c.name, c.labels, ex, c.ex)
			continue
		}
		for i, e := range ex {
			w := c.ex[i]
			if e.le != w.le || e.trace != w.trace || e.span != w.span || math.Abs(e.value-w.value) > 1e-9 || !e.at.Equal(w.at) {
				t.Errorf("%s%v: exemplar %+v, want %+v", c.name, c.labels, e, w)
			}
		}
	}
	var counts []string
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() == "lanewatch_request_kv_summaries_total" {
			for _, m := range mf.GetMetric() {
				counts = append(counts, fmt.Sprintf("%s=%g", m.GetLabel()[0].GetValue(), m.GetCounter().GetValue()))
			}
		}
	}
	if got := strings.Join(counts, " "); got != "known=5 unknown=1" {
		t.Errorf("lanewatch_request_kv_summaries_total: %s, want known=5 unknown=1", got)
	}
}

// Every series exists at zero before the first request, so that rate()
// sees the first one.
func TestRequestKVSeriesBornAtZero(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewMetrics(nil))
	for _, kind := range append(KVKindNames[:], "all") {
		if n, _, ex := histogramOf(t, reg, "lanewatch_request_kv_seconds", map[string]string{"kind": kind}); n != 0 || len(ex) != 0 {
			t.Errorf("kind %s: count %d, exemplars %v before any request", kind, n, ex)
		}
	}
	if n, _, _ := histogramOf(t, reg, "lanewatch_request_kv_ttft_share", nil); n != 0 {
		t.Errorf("ttft share: count %d before any request", n)
	}
}

// get GETs the handler's scrape with accept as the Accept header.
func get(t *testing.T, url, accept string) (contentType, body string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape: HTTP %d, %v\n%s", resp.StatusCode, err, b)
	}
	return resp.Header.Get("Content-Type"), string(b)
}

// Asked for OpenMetrics, the handler sends the exemplars; a scraper that
// asks for nothing gets the classic text format, without them, as before.
func TestHandlerOpenMetricsExemplars(t *testing.T) {
	_, reg := requestMetricsFed()
	srv := httptest.NewServer(Handler(reg, slog.New(slog.DiscardHandler)))
	defer srv.Close()

	ct, om := get(t, srv.URL, "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5")
	// An exemplar's labels come in no set order: sorted here.
	om = exemplarLabels.ReplaceAllStringFunc(om, func(s string) string {
		l := strings.Split(s[4:len(s)-1], ",")
		sort.Strings(l)
		return " # {" + strings.Join(l, ",") + "}"
	})
	if !strings.HasPrefix(ct, "application/openmetrics-text") || !strings.HasSuffix(om, "# EOF\n") {
		t.Fatalf("asked for OpenMetrics, got %q ending %q", ct, om[max(0, len(om)-20):])
	}
	for _, want := range []string{
		`lanewatch_request_kv_seconds_bucket{kind="all",le="0.032"} 4 # {span_id="b1b1b1b1b1b1b1b1",trace_id="a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1"} 0.03 1.700000001e+09`,
		`lanewatch_request_kv_seconds_bucket{kind="all",le="+Inf"} 6 # {span_id="b5b5b5b5b5b5b5b5",trace_id="a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5"} 40.0 1.700000005e+09`,
		`lanewatch_request_kv_ttft_share_bucket{le="0.3"} 3 # {span_id="b1b1b1b1b1b1b1b1",trace_id="a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1"} 0.3 1.700000001e+09`,
	} {
		if !strings.Contains(om, want+"\n") {
			t.Errorf("OpenMetrics scrape lacks\n%s\nin\n%s", want, grepLines(om, "lanewatch_request_kv"))
		}
	}
	if n := strings.Count(om, ` # {`); n != 4+1+2+4 {
		t.Errorf("OpenMetrics scrape: %d exemplars, want 11:\n%s", n, grepLines(om, " # {"))
	}

	ct, text := get(t, srv.URL, "")
	if !strings.HasPrefix(ct, "text/plain; version=0.0.4") || strings.Contains(text, "# {") || strings.Contains(text, "# EOF") {
		t.Errorf("plain scrape: %q, with exemplars or an EOF:\n%s", ct, grepLines(text, "lanewatch_request_kv"))
	}
	if !strings.Contains(text, `lanewatch_request_kv_seconds_bucket{kind="all",le="0.032"} 4`+"\n") {
		t.Errorf("plain scrape lacks the request histogram:\n%s", grepLines(text, "lanewatch_request_kv"))
	}
}

var exemplarLabels = regexp.MustCompile(` # \{[^}]*\}`)

func grepLines(s, substr string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// promtool check metrics lints the request series (promtool reads the
// classic text format only: the OpenMetrics scrape is Prometheus's to
// parse, TestPrometheusStoresExemplars).
func TestPromtoolCheckRequestMetrics(t *testing.T) {
	promtool := promtest.Tool(t, "promtool")
	_, reg := requestMetricsFed()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var text bytes.Buffer
	enc := expfmt.NewEncoder(&text, expfmt.NewFormat(expfmt.TypeTextPlain))
	n := 0
	for _, mf := range mfs {
		if strings.HasPrefix(mf.GetName(), "lanewatch_request_kv") {
			n++
			if err := enc.Encode(mf); err != nil {
				t.Fatal(err)
			}
		}
	}
	if n != 3 {
		t.Fatalf("%d request families, want 3", n)
	}
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = &text
	if out, err := cmd.CombinedOutput(); err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}
}

// A real Prometheus with exemplar storage scrapes the handler (it asks for
// OpenMetrics by itself), parses the scrape, and answers
// query_exemplars with the requests' trace ids.
func TestPrometheusStoresExemplars(t *testing.T) {
	// The agent's whole registry: every family of it must parse as
	// OpenMetrics, or the target is down.
	m := NewMetrics(testHealth)
	feed(m)
	for _, s := range requestShapes {
		m.RequestKV(&s.r)
	}
	reg := NewRegistry(m, nil, nil)
	// Exemplars timestamped now, inside the query's range.
	now := time.Now()
	m.RequestKV(&RequestKV{Trace: traceID(0xc1), Span: spanID(0xd1), End: now.UnixNano(),
		Bytes: [NumKVKinds]uint64{KVH2D: 1 << 20}, Wait: [NumKVKinds]time.Duration{KVH2D: 3 * time.Millisecond}, WaitAll: 3 * time.Millisecond,
		TTFT: 6 * time.Millisecond, TTFTSource: TTFTVLLM, TTFTWait: 3 * time.Millisecond})
	srv := httptest.NewServer(Handler(reg, slog.New(slog.DiscardHandler)))
	defer srv.Close()
	prom := promtest.StartWithFlags(t, []string{"--enable-feature=exemplar-storage"}, fmt.Sprintf(`global:
  scrape_interval: 1s
scrape_configs:
  - job_name: lanewatch
    static_configs:
      - targets: [%q]
`, strings.TrimPrefix(srv.URL, "http://")))

	trace := strings.Repeat("c1", 16)
	want := map[string]bool{`kind="all"`: false, `kind="h2d"`: false, "ttft_share": false}
	var last string
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		last = ""
		for _, q := range []string{`lanewatch_request_kv_seconds_bucket{job="lanewatch"}`, `lanewatch_request_kv_ttft_share_bucket{job="lanewatch"}`} {
			exs, err := prom.Exemplars(q, now.Add(-time.Hour), now.Add(time.Hour))
			if err != nil {
				last += err.Error()
				continue
			}
			for _, e := range exs {
				last += fmt.Sprintf("%v %v %s; ", e.Series, e.Labels, e.Value)
				if e.Labels["trace_id"] != trace || e.Labels["span_id"] != strings.Repeat("d1", 8) || e.Series["le"] != "0.004" && e.Series["le"] != "0.5" {
					continue
				}
				switch {
				case e.Series["__name__"] == "lanewatch_request_kv_ttft_share_bucket" && e.Value == "0.5":
					want["ttft_share"] = true
				case e.Series["kind"] == "all" && e.Value == "0.003":
					want[`kind="all"`] = true
				case e.Series["kind"] == "h2d" && e.Value == "0.003":
					want[`kind="h2d"`] = true
				}
			}
		}
		if want[`kind="all"`] && want[`kind="h2d"`] && want["ttft_share"] {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	for k, ok := range want {
		if !ok {
			t.Errorf("Prometheus has no exemplar of trace %s on %s within 60s; last answer: %s", trace, k, last)
		}
	}
	// The scrape parsed: the target is up, and a series of the window is in.
	for q, want := range map[string]string{`up{job="lanewatch"}`: "1", `lanewatch_window_events_lost{job="lanewatch"}`: "5"} {
		res, err := prom.Query(q)
		var got []string
		for _, v := range res {
			got = append(got, v)
		}
		if err != nil || len(got) != 1 || got[0] != want {
			t.Errorf("%s: %v %v, want one series at %s", q, res, err, want)
		}
	}
}

// Summaries arrive from the span exporter's goroutine while scrapes run:
// every one is counted (go test -race checks the locking).
func TestRequestKVWhileScraping(t *testing.T) {
	m := NewMetrics(nil)
	reg := prometheus.NewRegistry()
	reg.MustRegister(m)
	const n = 2000
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range n {
			r := requestShapes[i%len(requestShapes)].r
			m.RequestKV(&r)
		}
	}()
	for scraping := true; scraping; {
		select {
		case <-done:
			scraping = false
		default:
		}
		if _, err := reg.Gather(); err != nil {
			t.Fatal(err)
		}
	}
	if count, _, _ := histogramOf(t, reg, "lanewatch_request_kv_seconds", map[string]string{"kind": "all"}); count != n {
		t.Errorf("%d requests observed, want %d", count, n)
	}
}
