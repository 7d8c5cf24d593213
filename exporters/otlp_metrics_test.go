package exporters

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/lanewatch/lanewatch/otlpbridge"
	"github.com/lanewatch/lanewatch/otlpbridge/shapes"
)

// The span index's holdings and evictions are series: an index at its
// budget says so (budget evictions), and what it holds stays within it.
func TestOTLPIndexMetrics(t *testing.T) {
	const budget = 256 << 10
	x := otlpbridge.NewIndex(otlpbridge.IndexConfig{MaxBytes: budget, Procs: otlpbridge.NewProcFS(t.TempDir())})
	s := shapes.SGLang{Version: shapes.SGLangCurrent, IDs: shapes.NewIDs(5)}
	now := time.Now()
	var spans []*tracepb.Span
	for i := range 5000 {
		_, rs := s.Request("prefill", strconv.Itoa(1e6+i), uint64(i+1), nil, now.UnixNano(), now.Add(time.Second).UnixNano())
		spans = append(spans, rs...)
	}
	x.AddAt([]*tracepb.ResourceSpans{shapes.Batch(shapes.SGLangResource(), shapes.SGLangScope, spans...)}, now)
	reg := NewRegistry(NewMetrics(func() Health { return Health{} }), map[string]Collector{
		"otlp": OTLPCollector{Stats: func() otlpbridge.Stats { return otlpbridge.Stats{} }, Index: x.Stats},
	}, nil)
	st := x.Stats()
	if st.CapEvicts == 0 || st.Bytes > budget {
		t.Fatalf("index stats %+v: want budget evictions and at most %d bytes", st, budget)
	}
	for name, want := range map[string]float64{
		`lanewatch_otlp_index_stored{kind="bytes"}`:                float64(st.Bytes),
		`lanewatch_otlp_index_stored{kind="things"}`:               float64(st.Stored),
		`lanewatch_otlp_index_evicted_total{reason="budget"}`:      float64(st.CapEvicts),
		`lanewatch_otlp_index_evicted_total{reason="age"}`:         0,
		`lanewatch_otlp_index_clamped_spans_total`:                 0,
		`lanewatch_otlp_index_evicted_total{reason="info_budget"}`: float64(st.InfoEvicts),
	} {
		if got := gatherValue(t, reg, name); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	if n, err := testutil.GatherAndCount(reg, "lanewatch_otlp_index_evicted_total"); err != nil || n != 5 {
		t.Errorf("%d eviction series (%v), want 5: every reason from the first scrape", n, err)
	}
}

// gatherValue is the value of one series, written as Prometheus writes it
// (name{label="value",...}; labels in the order gathered, i.e. sorted).
func gatherValue(t *testing.T, reg *prometheus.Registry, series string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			id := mf.GetName()
			if len(m.GetLabel()) > 0 {
				var parts []string
				for _, l := range m.GetLabel() {
					parts = append(parts, l.GetName()+`="`+l.GetValue()+`"`)
				}
				id += "{" + strings.Join(parts, ",") + "}"
			}
			if id != series {
				continue
			}
			switch {
			case m.Counter != nil:
				return m.Counter.GetValue()
			case m.Gauge != nil:
				return m.Gauge.GetValue()
			}
		}
	}
	t.Fatalf("no series %s", series)
	return 0
}
