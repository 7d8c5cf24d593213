package exporters

import (
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/lanewatch/lanewatch/correlate"
)

func TestFindingSpans(t *testing.T) {
	mem := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(mem))
	s := NewSpans(SpansConfig{Tracer: tp.Tracer("t"), Mode: SpansBatched})
	pageable := correlate.Finding{Rule: "pageable-copy", Severity: correlate.SevFail, Subject: "pid 7",
		Summary: "32 copies used pageable memory", Remediation: "register the buffer", Evidence: []string{"APIs: cudaMemcpyAsync"}}
	at := time.Unix(1700000000, 0)
	if n := s.Findings([]correlate.Finding{pageable}, at); n != 1 {
		t.Fatalf("first evaluation: %d spans", n)
	}
	if n := s.Findings([]correlate.Finding{pageable}, at.Add(time.Second)); n != 0 {
		t.Errorf("a finding still active made %d more spans", n)
	}
	s.Findings(nil, at.Add(2*time.Second))
	if n := s.Findings([]correlate.Finding{pageable}, at.Add(3*time.Second)); n != 1 {
		t.Errorf("a finding that came back: %d spans", n)
	}
	spans := mem.GetSpans()
	if len(spans) != 2 || spans[0].Name != "lanewatch.finding pageable-copy" || spans[0].Status.Code.String() != "Error" ||
		!spans[0].StartTime.Equal(at) {
		t.Fatalf("spans %+v", spans)
	}
	attrs := map[string]string{}
	for _, a := range spans[0].Attributes {
		attrs[string(a.Key)] = a.Value.String()
	}
	if attrs["lanewatch.finding.severity"] != "fail" || attrs["lanewatch.finding.remediation"] != "register the buffer" ||
		attrs["lanewatch.finding.subject"] != "pid 7" {
		t.Errorf("attributes %v", attrs)
	}
}
