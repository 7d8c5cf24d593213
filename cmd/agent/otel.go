package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/lanewatch/lanewatch/agent"
	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/exporters"
	"github.com/lanewatch/lanewatch/otlpbridge"
)

// otelFlags are run's trace flags: the OTLP bridge that receives the
// inference server's traces, and the transfer spans.
type otelFlags struct {
	grpcListen, httpListen *string
	spans                  *string
	hold, window           *time.Duration
	maxSpans               *int
	rules                  stringList
}

func addOTelFlags(fs *flag.FlagSet) *otelFlags {
	f := &otelFlags{
		grpcListen: fs.String("otlp.grpc-listen", otlpbridge.DefaultGRPCListen, "receive the inference server's OTLP traces over gRPC here (\"\": off); forwarded unchanged to OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT"),
		httpListen: fs.String("otlp.http-listen", otlpbridge.DefaultHTTPListen, "receive OTLP/HTTP traces (POST /v1/traces, protobuf or JSON) here (\"\": off)"),
		spans:      fs.String("spans", string(exporters.SpansBatched), "transfer spans: per-transfer, batched (one span per run of transfers with the same stream, direction, layer and request) or off"),
		hold:       fs.Duration("spans.hold", 15*time.Second, "how long a transfer waits for the server's spans before it is attributed and exported"),
		window:     fs.Duration("otlp.index-window", 2*time.Minute, "how long received spans are kept for attribution"),
		maxSpans:   fs.Int("otlp.index-max-spans", 100_000, "received spans kept at most for attribution (the oldest are evicted and counted)"),
	}
	fs.Var(&f.rules, "otlp.rule", "attribution rule replacing the built-in SGLang/vLLM ones (repeatable): name=N,span=REGEXP,scope=thread|process|trace,request=ATTR,thread=ATTR,process=ATTR")
	return f
}

// otelRun is the running bridge and span exporter.
type otelRun struct {
	log    *slog.Logger
	bridge *otlpbridge.Bridge
	spans  *exporters.Spans
	stopTP func(context.Context) error
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once
	err    error
}

// start opens the bridge's listeners and the span exporter. Either may be off.
func (f *otelFlags) start(log *slog.Logger, paths exporters.PathResolver) (*otelRun, error) {
	mode, err := exporters.ParseSpanMode(*f.spans)
	if err != nil {
		return nil, err
	}
	var rules []otlpbridge.Rule
	for _, s := range f.rules {
		r, err := otlpbridge.ParseRule(s)
		if err != nil {
			return nil, fmt.Errorf("--otlp.rule: %w", err)
		}
		rules = append(rules, r)
	}
	up, err := otlpbridge.UpstreamFromEnv(nil)
	if err != nil {
		return nil, err
	}
	o := &otelRun{log: log, done: make(chan struct{})}
	if *f.grpcListen != "" || *f.httpListen != "" {
		o.bridge, err = otlpbridge.New(otlpbridge.Config{GRPCListen: *f.grpcListen, HTTPListen: *f.httpListen, Upstream: up, Logger: log,
			Index: otlpbridge.IndexConfig{Rules: rules, Window: *f.window, MaxSpans: *f.maxSpans}})
		if err != nil {
			return nil, err
		}
		o.bridge.Serve()
	}
	ctx, cancel := context.WithCancel(context.Background())
	o.cancel = cancel
	if mode == exporters.SpansOff || up.Endpoint == "" {
		if mode != exporters.SpansOff {
			log.Info("transfer spans off: no OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT set")
		}
		close(o.done)
		return o, nil
	}
	res, err := exporters.NewResource(ctx)
	if err != nil {
		log.Warn("OTel resource", "err", err) // partial resource still usable
	}
	exp, err := exporters.NewOTLPSpanExporter(ctx)
	if err != nil {
		o.stop()
		return nil, err
	}
	tp := exporters.NewTracerProvider(res, exp)
	o.stopTP = tp.Shutdown
	clock := otlpbridge.NewClock()
	cfg := exporters.SpansConfig{Tracer: tp.Tracer("github.com/lanewatch/lanewatch"), Mode: mode, Wall: clock.Wall, Hold: *f.hold, Logger: log, Paths: paths}
	if o.bridge != nil {
		cfg.Attributor = o.bridge.Index()
	}
	o.spans = exporters.NewSpans(cfg)
	go func() {
		defer close(o.done)
		refresh := time.NewTicker(10 * time.Second)
		defer refresh.Stop()
		release := time.NewTicker(250 * time.Millisecond)
		defer release.Stop()
		for {
			select {
			case <-ctx.Done():
				return // stop releases the rest
			case <-refresh.C:
				clock.Refresh()
			case now := <-release.C:
				o.spans.Release(now)
			}
		}
	}()
	log.Info("transfer spans", "mode", mode, "upstream", up.Endpoint, "hold", *f.hold)
	return o, nil
}

// tee adds the span exporter to the transfer sinks.
func (o *otelRun) tee(s correlate.Sink) correlate.Sink {
	if o == nil || o.spans == nil {
		return s
	}
	return correlate.Tee(s, o.spans)
}

// stop releases every held transfer as spans, flushes them upstream, then
// closes the bridge. Call it after the agent flushed its transfers.
func (o *otelRun) stop() error {
	if o == nil {
		return nil
	}
	o.once.Do(func() { o.err = o.shutdown() })
	return o.err
}

func (o *otelRun) shutdown() error {
	o.cancel()
	<-o.done
	var errs []error
	if o.spans != nil {
		o.spans.Release(time.Time{})
		st := o.spans.Stats()
		o.log.Info("transfer spans", "transfers", st.Transfers, "spans", st.Spans, "attributed", st.Attributed, "batch", st.Batched,
			"early_release", st.EarlyRelease)
	}
	if o.stopTP != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		errs = append(errs, o.stopTP(ctx))
		cancel()
	}
	if o.bridge != nil {
		errs = append(errs, o.bridge.Close())
		st := o.bridge.Stats()
		o.log.Info("OTLP bridge", "requests", st.Requests, "bad", st.BadRequests, "forwarded", st.Forwarded, "forward_errors", st.ForwardErrors,
			"spans", st.Index.Spans, "indexed", st.Index.Indexed, "evicted", st.Index.Evicted, "cap_evicted", st.Index.CapEvicts)
	}
	return errors.Join(errs...)
}

// verdict turns the evaluator's findings into spans.
func (o *otelRun) verdict(v agent.Verdict) {
	if o != nil && o.spans != nil {
		o.spans.Findings(v.Findings, v.At)
	}
}
