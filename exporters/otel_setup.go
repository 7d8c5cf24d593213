package exporters

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// ServiceName is lanewatch's service.name (OTEL_SERVICE_NAME overrides it).
const ServiceName = "lanewatch"

// NewResource describes this agent: service.name=lanewatch, then the
// environment (OTEL_RESOURCE_ATTRIBUTES, OTEL_SERVICE_NAME), the process and
// the host.
func NewResource(ctx context.Context) (*resource.Resource, error) {
	return resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", ServiceName)),
		resource.WithFromEnv(), resource.WithProcess(), resource.WithHost(), resource.WithTelemetrySDK())
}

// NewOTLPSpanExporter makes the SDK's OTLP trace exporter for the protocol
// named by OTEL_EXPORTER_OTLP_TRACES_PROTOCOL / OTEL_EXPORTER_OTLP_PROTOCOL
// (grpc, or http/protobuf by default); endpoint, headers, TLS and timeout
// come from the standard OTEL_EXPORTER_OTLP_* variables, which the SDK reads.
func NewOTLPSpanExporter(ctx context.Context) (sdktrace.SpanExporter, error) {
	proto := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if proto == "" {
		proto = os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	switch proto {
	case "grpc":
		return otlptracegrpc.New(ctx)
	case "", "http/protobuf":
		return otlptracehttp.New(ctx)
	}
	return nil, fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL %q: lanewatch exports spans over grpc or http/protobuf", proto)
}

// NewTracerProvider exports through the SDK's batch span processor.
func NewTracerProvider(res *resource.Resource, exp sdktrace.SpanExporter, opts ...sdktrace.BatchSpanProcessorOption) *sdktrace.TracerProvider {
	return sdktrace.NewTracerProvider(sdktrace.WithResource(res), sdktrace.WithBatcher(exp, opts...),
		sdktrace.WithSampler(sdktrace.AlwaysSample()))
}

// CountingExporter counts the spans its exporter sent and those it failed
// to send (the batch is dropped: the SDK does not retry past its exporter).
type CountingExporter struct {
	sdktrace.SpanExporter
	exported, failed atomic.Uint64
}

// CountExports wraps exp.
func CountExports(exp sdktrace.SpanExporter) *CountingExporter {
	return &CountingExporter{SpanExporter: exp}
}

// ExportSpans implements sdktrace.SpanExporter.
func (c *CountingExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	err := c.SpanExporter.ExportSpans(ctx, spans)
	if err != nil {
		c.failed.Add(uint64(len(spans)))
	} else {
		c.exported.Add(uint64(len(spans)))
	}
	return err
}

// Counts returns the spans exported and failed so far.
func (c *CountingExporter) Counts() (exported, failed uint64) {
	return c.exported.Load(), c.failed.Load()
}
