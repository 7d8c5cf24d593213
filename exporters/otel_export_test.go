package exporters

import (
	"context"
	"errors"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

type failingExporter struct{ fail bool }

func (f *failingExporter) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error {
	if f.fail {
		return errors.New("upstream down")
	}
	return nil
}
func (f *failingExporter) Shutdown(context.Context) error { return nil }

// Spans the exporter sent and those it failed to send are counted apart.
func TestCountingExporter(t *testing.T) {
	inner := &failingExporter{}
	c := CountExports(inner)
	spans := tracetest.SpanStubs{{Name: "a"}, {Name: "b"}, {Name: "c"}}.Snapshots()
	if err := c.ExportSpans(context.Background(), spans); err != nil {
		t.Fatal(err)
	}
	inner.fail = true
	if err := c.ExportSpans(context.Background(), spans[:2]); err == nil {
		t.Fatal("the exporter's error was not returned")
	}
	if ok, failed := c.Counts(); ok != 3 || failed != 2 {
		t.Errorf("exported %d, failed %d; want 3 and 2", ok, failed)
	}
}
