package exporters_test

import (
	"context"
	"os"
	"sync/atomic"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/exporters"
	"github.com/lanewatch/lanewatch/probes"
)

// countingExporter is an in-memory span exporter that only counts.
type countingExporter struct{ n atomic.Int64 }

func (c *countingExporter) ExportSpans(_ context.Context, s []sdktrace.ReadOnlySpan) error {
	c.n.Add(int64(len(s)))
	return nil
}
func (c *countingExporter) Shutdown(context.Context) error { return nil }

// BenchmarkCorrelateExport replays real recordings (`agent run --record`)
// through decode, the correlation engine and the batched span exporter with
// the SDK's batch span processor, and reports events/s and the spans made
// per 1 000 transfers.
func BenchmarkCorrelateExport(b *testing.B) {
	for _, rec := range []struct{ name, path string }{
		{"hicache-load", "../correlate/testdata/hicache-load.events"},
		{"fragmented-load", "../checks/testdata/events/fragmented-load.events"},
	} {
		b.Run(rec.name, func(b *testing.B) {
			raw, err := os.ReadFile(rec.path)
			if err != nil {
				b.Fatal(err)
			}
			n := len(raw) / probes.EventSize
			exp := &countingExporter{}
			tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp, sdktrace.WithBlocking(), sdktrace.WithMaxQueueSize(1<<16)))
			spans := exporters.NewSpans(exporters.SpansConfig{Tracer: tp.Tracer("bench"), Mode: exporters.SpansBatched, Hold: time.Nanosecond})
			e := correlate.NewEngine(correlate.Config{ExecObserved: true, Sink: spans})
			var c event.Call
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				j := i % n
				if err := probes.Decode(raw[j*probes.EventSize:(j+1)*probes.EventSize], &c); err != nil {
					b.Fatal(err)
				}
				e.Handle(&c)
				if j == n-1 {
					e.Flush()
					spans.Release(time.Time{})
				}
			}
			e.Flush()
			spans.Release(time.Time{})
			if err := tp.ForceFlush(context.Background()); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			st := spans.Stats()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
			b.ReportMetric(float64(st.Transfers)/b.Elapsed().Seconds(), "transfers/s") // events per transfer change with the probes
			if st.Transfers > 0 {
				b.ReportMetric(float64(exp.n.Load())*1000/float64(st.Transfers), "spans/1000transfers")
			}
			tp.Shutdown(context.Background())
		})
	}
}
