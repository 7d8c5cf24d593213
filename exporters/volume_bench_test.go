package exporters_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/exporters"
	"github.com/lanewatch/lanewatch/otlpbridge"
	"github.com/lanewatch/lanewatch/otlpbridge/shapes"
	"github.com/lanewatch/lanewatch/probes"
)

// recordedTransfers replays a real recording through the engine and
// returns its successful transfers.
func recordedTransfers(tb testing.TB, path string) []correlate.Transfer {
	raw, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	var out []correlate.Transfer
	e := correlate.NewEngine(correlate.Config{ExecObserved: true, Sink: correlate.SinkFunc(func(t *correlate.Transfer) {
		if !t.Failed() {
			out = append(out, *t)
		}
	})})
	var c event.Call
	for i := 0; i+probes.EventSize <= len(raw); i += probes.EventSize {
		if err := probes.Decode(raw[i:i+probes.EventSize], &c); err != nil {
			tb.Fatalf("%s: event %d: %v", path, i/probes.EventSize, err)
		}
		e.Handle(&c)
	}
	e.Flush()
	return out
}

// Span volume (docs/measurements.md, "Trace volume"): a node serving
// volumeRate requests per second, each loading its prefix from the host
// pool as the recorded hicache-load does (32 layers, one copy each, on a
// load stream), one request after another, the server sampling one in
// `every` (SGLang's current spans for those only). It reports the spans
// lanewatch makes per second for each span mode, the old default (every
// transfer a span, unattributed ones as roots) beside the new ones.
const (
	volumeRate     = 20 // requests per second per node
	volumeRequests = 400
)

func BenchmarkSpanVolume(b *testing.B) {
	load := recordedTransfers(b, "../correlate/testdata/hicache-load.events")
	if len(load) == 0 {
		b.Fatal("no transfers in the recording")
	}
	period := int64(time.Second) / volumeRate
	for _, every := range []int{1, 10, 100} {
		for _, m := range []struct {
			name   string
			mode   exporters.SpanMode
			export bool
		}{
			{"per-transfer+unattributed", exporters.SpansPerTransfer, true},
			{"batched+unattributed", exporters.SpansBatched, true},
			{"batched", exporters.SpansBatched, false},
			{"summary", exporters.SpansSummary, false},
		} {
			b.Run(fmt.Sprintf("sampled=1in%d/%s", every, m.name), func(b *testing.B) {
				var spans, summaries int64
				for b.Loop() {
					spans, summaries = spanVolume(b, load, period, every, m.mode, m.export)
				}
				perSec := float64(spans) * volumeRate / volumeRequests
				b.ReportMetric(perSec, "spans/s")
				b.ReportMetric(perSec*1000, "spans/s/1000nodes")
				b.ReportMetric(float64(summaries)*volumeRate/volumeRequests, "summaries/s")
			})
		}
	}
}

// spanVolume runs volumeRequests requests through a real index and span
// exporter and returns the spans made and how many were summaries.
func spanVolume(b *testing.B, load []correlate.Transfer, period int64, every int, mode exporters.SpanMode, export bool) (spans, summaries int64) {
	first, last := load[0].SubmitNs, load[0].SubmitNs
	for _, t := range load {
		first, last = min(first, t.SubmitNs), max(last, t.SubmitNs, t.CompleteNs)
	}
	x := otlpbridge.NewIndex(otlpbridge.IndexConfig{Window: time.Hour, Procs: otlpbridge.NewProcFS("/proc")})
	exp := &countingExporter{}
	kv := &countingExporter{}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithSpanProcessor(summaryCounter{kv}))
	s := exporters.NewSpans(exporters.SpansConfig{Tracer: tp.Tracer("volume"), Mode: mode, Attributor: x, Hold: time.Nanosecond,
		ExportUnattributed: export})
	sg := shapes.SGLang{Version: shapes.SGLangCurrent, IDs: shapes.NewIDs(7)}
	var sent []*tracepb.Span
	for i := range volumeRequests {
		shift := uint64(int64(i) * period)
		for _, t := range load {
			t.SubmitNs += shift
			if t.CompleteNs != 0 {
				t.CompleteNs += shift
			}
			s.Transfer(&t)
		}
		if i%every != 0 {
			continue // not sampled: the server sends nothing
		}
		start, end := int64(first+shift)-1000, int64(last+shift)+1000
		req, rs := sg.Request("unified", fmt.Sprintf("vol%08d", i), 0, nil, start, end)
		th, ts := sg.Thread(req, shapes.SGLangThread{Label: "Scheduler", TID: load[0].TID, HostID: "unknown", TP: shapes.Rank(0)}, start, end)
		_, fs := sg.Slice(th, "prefill_forward", start, end)
		sent = append(append(sent, fs, ts), rs...)
	}
	x.AddAt([]*tracepb.ResourceSpans{shapes.Batch(shapes.SGLangResource(), shapes.SGLangScope, sent...)},
		time.Unix(0, int64(last)+int64(volumeRequests)*period))
	s.Release(time.Time{})
	if err := tp.ForceFlush(context.Background()); err != nil {
		b.Fatal(err)
	}
	tp.Shutdown(context.Background())
	return exp.n.Load(), kv.n.Load()
}

// summaryCounter counts the lanewatch.kv spans that end.
type summaryCounter struct{ c *countingExporter }

func (summaryCounter) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (p summaryCounter) OnEnd(s sdktrace.ReadOnlySpan) {
	if s.Name() == "lanewatch.kv" {
		p.c.n.Add(1)
	}
}
func (summaryCounter) Shutdown(context.Context) error   { return nil }
func (summaryCounter) ForceFlush(context.Context) error { return nil }
