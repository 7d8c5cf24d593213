package otlpbridge

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	collectorpb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// Default listen addresses: the OTLP ports plus 10000, so the bridge can
// run beside a collector that owns 4317/4318 on the same host.
const (
	DefaultGRPCListen = "127.0.0.1:14317"
	DefaultHTTPListen = "127.0.0.1:14318"
	contentProto      = "application/x-protobuf"
	contentJSON       = "application/json"
	maxBody           = 64 << 20
)

// Config configures a Bridge.
type Config struct {
	GRPCListen string // "" no gRPC receiver
	HTTPListen string // "" no HTTP receiver
	Upstream   Upstream
	Index      IndexConfig
	Logger     *slog.Logger
}

// Stats are the bridge's counters.
type Stats struct {
	Requests      uint64 // export requests received
	BadRequests   uint64 // undecodable
	Forwarded     uint64 // accepted upstream
	ForwardErrors uint64
	Index         IndexStats
}

// Bridge is the OTLP receiver, forwarder and span index.
type Bridge struct {
	collectorpb.UnimplementedTraceServiceServer

	cfg   Config
	log   *slog.Logger
	index *Index
	fwd   *forwarder

	grpcLn, httpLn net.Listener
	grpcSrv        *grpc.Server
	httpSrv        *http.Server
	wg             sync.WaitGroup

	requests, bad, forwarded, fwdErrs atomic.Uint64
}

// New listens on the configured addresses; Serve starts answering.
func New(cfg Config) (*Bridge, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	b := &Bridge{cfg: cfg, log: cfg.Logger, index: NewIndex(cfg.Index)}
	if cfg.Upstream.Endpoint != "" {
		for _, l := range []string{cfg.GRPCListen, cfg.HTTPListen} {
			if l != "" && sameEndpoint(cfg.Upstream.Endpoint, l) {
				return nil, fmt.Errorf("OTLP upstream %s is the bridge's own listen address: it would forward to itself", cfg.Upstream.Endpoint)
			}
		}
		f, err := newForwarder(cfg.Upstream)
		if err != nil {
			return nil, err
		}
		b.fwd = f
	}
	var err error
	if cfg.GRPCListen != "" {
		if b.grpcLn, err = net.Listen("tcp", cfg.GRPCListen); err != nil {
			b.Close()
			return nil, fmt.Errorf("OTLP gRPC listen: %w", err)
		}
	}
	if cfg.HTTPListen != "" {
		if b.httpLn, err = net.Listen("tcp", cfg.HTTPListen); err != nil {
			b.Close()
			return nil, fmt.Errorf("OTLP HTTP listen: %w", err)
		}
	}
	return b, nil
}

func sameEndpoint(endpoint, listen string) bool {
	host := endpoint
	if i := bytes.Index([]byte(host), []byte("://")); i >= 0 {
		host = host[i+3:]
	}
	if i := bytes.IndexByte([]byte(host), '/'); i >= 0 {
		host = host[:i]
	}
	h1, p1, err1 := net.SplitHostPort(host)
	h2, p2, err2 := net.SplitHostPort(listen)
	if err1 != nil || err2 != nil || p1 != p2 {
		return false
	}
	local := func(h string) bool {
		return h == "" || h == "localhost" || net.ParseIP(h).IsLoopback() || net.ParseIP(h).IsUnspecified()
	}
	return h1 == h2 || local(h1) && local(h2)
}

// Index is the span index that attributes transfers.
func (b *Bridge) Index() *Index { return b.index }

// GRPCAddr is the gRPC receiver's address, nil when off.
func (b *Bridge) GRPCAddr() net.Addr {
	if b.grpcLn == nil {
		return nil
	}
	return b.grpcLn.Addr()
}

// HTTPAddr is the HTTP receiver's address, nil when off.
func (b *Bridge) HTTPAddr() net.Addr {
	if b.httpLn == nil {
		return nil
	}
	return b.httpLn.Addr()
}

// Serve starts the receivers in the background.
func (b *Bridge) Serve() {
	if b.fwd == nil {
		b.log.Info("OTLP forwarding off: no OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT set; received traces are only indexed")
	} else {
		b.log.Info("OTLP forwarding", "upstream", b.cfg.Upstream.Endpoint, "protocol", b.cfg.Upstream.Protocol)
	}
	if b.grpcLn != nil {
		b.grpcSrv = grpc.NewServer(grpc.MaxRecvMsgSize(maxBody))
		collectorpb.RegisterTraceServiceServer(b.grpcSrv, b)
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			if err := b.grpcSrv.Serve(b.grpcLn); err != nil {
				b.log.Error("OTLP gRPC receiver", "err", err)
			}
		}()
		b.log.Info("OTLP gRPC receiver", "listen", b.grpcLn.Addr().String())
	}
	if b.httpLn != nil {
		mux := http.NewServeMux()
		mux.HandleFunc("POST /v1/traces", b.serveHTTP)
		b.httpSrv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			if err := b.httpSrv.Serve(b.httpLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
				b.log.Error("OTLP HTTP receiver", "err", err)
			}
		}()
		b.log.Info("OTLP HTTP receiver", "listen", b.httpLn.Addr().String()+"/v1/traces")
	}
}

// Close stops the receivers (letting running exports finish) and the forwarder.
func (b *Bridge) Close() error {
	var errs []error
	if b.grpcSrv != nil {
		done := make(chan struct{})
		go func() { b.grpcSrv.GracefulStop(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			b.grpcSrv.Stop()
		}
	} else if b.grpcLn != nil {
		b.grpcLn.Close()
	}
	if b.httpSrv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		errs = append(errs, b.httpSrv.Shutdown(ctx))
		cancel()
	} else if b.httpLn != nil {
		b.httpLn.Close()
	}
	b.wg.Wait()
	if b.fwd != nil {
		errs = append(errs, b.fwd.close())
	}
	return errors.Join(errs...)
}

// Stats returns the counters.
func (b *Bridge) Stats() Stats {
	return Stats{Requests: b.requests.Load(), BadRequests: b.bad.Load(), Forwarded: b.forwarded.Load(),
		ForwardErrors: b.fwdErrs.Load(), Index: b.index.Stats()}
}

// Export is the gRPC TraceService.
func (b *Bridge) Export(ctx context.Context, req *collectorpb.ExportTraceServiceRequest) (*collectorpb.ExportTraceServiceResponse, error) {
	if err := b.handle(ctx, &request{msg: req}); err != nil {
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	return &collectorpb.ExportTraceServiceResponse{}, nil
}

// handle indexes a request and forwards it; a forwarding error goes back to
// the sender (which retries), as a collector's would.
func (b *Bridge) handle(ctx context.Context, r *request) error {
	b.requests.Add(1)
	b.index.Add(r.msg.GetResourceSpans())
	if b.fwd == nil {
		return nil
	}
	if err := b.fwd.send(ctx, r); err != nil {
		b.fwdErrs.Add(1)
		b.log.Warn("forward OTLP traces upstream", "upstream", b.cfg.Upstream.Endpoint, "err", err)
		return fmt.Errorf("forward upstream: %w", err)
	}
	b.forwarded.Add(1)
	return nil
}

func (b *Bridge) serveHTTP(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(io.LimitReader(req.Body, maxBody+1))
	if err != nil || len(body) > maxBody {
		b.bad.Add(1)
		http.Error(w, "cannot read body", http.StatusBadRequest)
		return
	}
	r := &request{body: body, encoding: req.Header.Get("Content-Encoding"), msg: &collectorpb.ExportTraceServiceRequest{}}
	plain := body
	switch r.encoding {
	case "", "identity":
	case "gzip":
		zr, err := gzip.NewReader(bytes.NewReader(body))
		if err == nil {
			plain, err = io.ReadAll(io.LimitReader(zr, maxBody))
		}
		if err != nil {
			b.bad.Add(1)
			http.Error(w, "bad gzip body", http.StatusBadRequest)
			return
		}
	default:
		b.bad.Add(1)
		http.Error(w, "unsupported Content-Encoding", http.StatusUnsupportedMediaType)
		return
	}
	ctype := req.Header.Get("Content-Type")
	switch {
	case ctype == contentProto || ctype == "application/protobuf":
		r.contentType = contentProto
		err = proto.Unmarshal(plain, r.msg)
	case ctype == contentJSON || len(ctype) > len(contentJSON) && ctype[:len(contentJSON)+1] == contentJSON+";":
		r.contentType = contentJSON
		err = unmarshalJSON(plain, r.msg)
	default:
		b.bad.Add(1)
		http.Error(w, "Content-Type must be application/x-protobuf or application/json", http.StatusUnsupportedMediaType)
		return
	}
	if err != nil {
		b.bad.Add(1)
		http.Error(w, "cannot decode OTLP request: "+err.Error(), http.StatusBadRequest)
		return
	}
	if err := b.handle(req.Context(), r); err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	w.Header().Set("Content-Type", r.contentType)
	if r.contentType == contentJSON {
		io.WriteString(w, "{}")
		return
	}
	resp, _ := proto.Marshal(&collectorpb.ExportTraceServiceResponse{})
	w.Write(resp)
}

// OTLP/JSON writes trace and span ids as hex, where protojson expects base64.
var idKeys = map[string]bool{"traceId": true, "spanId": true, "parentSpanId": true}

func unmarshalJSON(b []byte, m proto.Message) error {
	fixed, err := rewriteIDs(b, func(s string) (string, error) {
		raw, err := hex.DecodeString(s)
		if err != nil {
			return "", fmt.Errorf("id %q is not hex: %w", s, err)
		}
		return base64.StdEncoding.EncodeToString(raw), nil
	})
	if err != nil {
		return err
	}
	return protojson.UnmarshalOptions{DiscardUnknown: true}.Unmarshal(fixed, m)
}

func marshalJSON(m proto.Message) ([]byte, error) {
	b, err := protojson.Marshal(m)
	if err != nil {
		return nil, err
	}
	return rewriteIDs(b, func(s string) (string, error) {
		raw, err := base64.StdEncoding.DecodeString(s)
		return hex.EncodeToString(raw), err
	})
}

func rewriteIDs(b []byte, conv func(string) (string, error)) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	var walk func(any) error
	walk = func(v any) error {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				if s, ok := e.(string); ok && idKeys[k] && s != "" {
					c, err := conv(s)
					if err != nil {
						return err
					}
					x[k] = c
					continue
				}
				if err := walk(e); err != nil {
					return err
				}
			}
		case []any:
			for _, e := range x {
				if err := walk(e); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(v); err != nil {
		return nil, err
	}
	return json.Marshal(v)
}
