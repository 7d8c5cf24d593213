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
	"log"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	collectorpb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"golang.org/x/net/netutil"
	"google.golang.org/grpc"
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
)

// Config configures a Bridge.
type Config struct {
	GRPCListen string // "" no gRPC receiver
	HTTPListen string // "" no HTTP receiver
	Upstream   Upstream
	Index      IndexConfig
	Limits     Limits
	Logger     *slog.Logger
	// Warn logs a failure that may repeat for every request (a failed
	// forward): the agent's one line per cause per interval. nil:
	// Logger.Warn.
	Warn func(cause, msg string, args ...any)
	// ErrorLog takes the HTTP server's own lines (accept errors); nil:
	// Logger at WARN.
	ErrorLog *log.Logger
}

// Transports of the receivers: the transport label of their metrics.
const (
	TransportGRPC = "grpc"
	TransportHTTP = "http"
)

// Refusal is a transport and the reason a request was refused.
type Refusal struct{ Transport, Reason string }

// Stats are the bridge's counters.
type Stats struct {
	Requests      uint64             // export requests received
	BadRequests   uint64             // refused, for any reason
	Received      map[string]uint64  // by transport
	Refused       map[Refusal]uint64 // by transport and reason, every pair present
	Forwarded     uint64             // accepted upstream
	ForwardErrors uint64
	InFlight      int   // requests being read or decoded now
	BudgetUsed    int64 // bytes of the decode budget they hold
	Budget        int64
	Index         IndexStats
}

var transports = []string{TransportGRPC, TransportHTTP}

// Bridge is the OTLP receiver, forwarder and span index.
type Bridge struct {
	cfg    Config
	lim    Limits
	log    *slog.Logger
	warn   func(cause, msg string, args ...any)
	index  *Index
	fwd    *forwarder
	budget *budget

	grpcLn, httpLn net.Listener
	grpcSrv        *grpc.Server
	httpSrv        *http.Server
	conns          connSet // every connection accepted, for Close
	wg             sync.WaitGroup

	received           [2]atomic.Uint64                   // by transports index
	refused            [2][len(reasonIndex)]atomic.Uint64 // by transport, reason
	forwarded, fwdErrs atomic.Uint64
}

// reasonIndex numbers Reasons for the counters.
var reasonIndex = [...]string{ReasonTooLarge, ReasonBadPayload, ReasonUnsupported, ReasonOverloaded, ReasonReadError}

// New listens on the configured addresses; Serve starts answering.
func New(cfg Config) (*Bridge, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Index.Logger == nil {
		cfg.Index.Logger = cfg.Logger // the index logs at the bridge's level
	}
	lim := cfg.Limits.withDefaults()
	if err := lim.Check(); err != nil {
		return nil, err
	}
	b := &Bridge{cfg: cfg, lim: lim, log: cfg.Logger, warn: cfg.Warn, index: NewIndex(cfg.Index),
		budget: &budget{max: lim.DecodeBudget, concurrent: lim.MaxConcurrent}}
	if b.warn == nil {
		b.warn = func(_, msg string, args ...any) { b.log.Warn(msg, args...) }
	}
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
	b.log.Info("OTLP receiver limits", "max_body", b.lim.MaxBody, "max_concurrent", b.lim.MaxConcurrent, "decode_budget", b.lim.DecodeBudget,
		"max_connections", b.lim.MaxConnections, "read_timeout", b.lim.ReadTimeout)
	if b.grpcLn != nil {
		b.grpcSrv = b.newGRPCServer()
		ln := netutil.LimitListener(trackedListener{b.grpcLn, &b.conns}, b.lim.MaxConnections)
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			if err := b.grpcSrv.Serve(ln); err != nil {
				b.log.Error("OTLP gRPC receiver", "err", err)
			}
		}()
		b.log.Info("OTLP gRPC receiver", "listen", b.grpcLn.Addr().String())
	}
	if b.httpLn != nil {
		b.httpSrv = b.newHTTPServer()
		ln := netutil.LimitListener(trackedListener{b.httpLn, &b.conns}, b.lim.MaxConnections)
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			if err := b.httpSrv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				b.log.Error("OTLP HTTP receiver", "err", err)
			}
		}()
		b.log.Info("OTLP HTTP receiver", "listen", b.httpLn.Addr().String()+"/v1/traces")
	}
}

// newHTTPServer times out slow senders: headers, body, idle keep-alives;
// the write timeout leaves room to forward upstream.
func (b *Bridge) newHTTPServer() *http.Server {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/traces", b.serveHTTP)
	errLog := b.cfg.ErrorLog
	if errLog == nil {
		errLog = slog.NewLogLogger(b.log.Handler(), slog.LevelWarn)
	}
	rt := b.lim.ReadTimeout
	return &http.Server{Handler: mux, ReadHeaderTimeout: min(rt, 10*time.Second), ReadTimeout: rt, IdleTimeout: rt,
		WriteTimeout: rt + b.cfg.Upstream.Timeout + 5*time.Second, MaxHeaderBytes: 64 << 10, ErrorLog: errLog}
}

// closeGrace is how long Close lets running exports finish, both
// receivers at once; then the connections still open (a sender that sends
// nothing holds one until its read timeout) are cut.
const closeGrace = 2 * time.Second

// Close stops the receivers, within closeGrace, and the forwarder.
func (b *Bridge) Close() error {
	deadline := time.Now().Add(closeGrace)
	var stopping sync.WaitGroup
	var httpErr error
	if b.grpcSrv != nil {
		stopping.Go(func() {
			done := make(chan struct{})
			go func() { b.grpcSrv.GracefulStop(); close(done) }()
			select {
			case <-done:
			case <-time.After(time.Until(deadline)):
				b.conns.closeAll() // gRPC's Stop waits for connections still in their handshake
				b.grpcSrv.Stop()
			}
		})
	} else if b.grpcLn != nil {
		b.grpcLn.Close()
	}
	if b.httpSrv != nil {
		stopping.Go(func() {
			ctx, cancel := context.WithDeadline(context.Background(), deadline)
			defer cancel()
			if err := b.httpSrv.Shutdown(ctx); err != nil {
				httpErr = b.httpSrv.Close()
			}
		})
	} else if b.httpLn != nil {
		b.httpLn.Close()
	}
	stopping.Wait()
	b.wg.Wait()
	errs := []error{httpErr}
	if b.fwd != nil {
		errs = append(errs, b.fwd.close())
	}
	return errors.Join(errs...)
}

// Stats returns the counters.
func (b *Bridge) Stats() Stats {
	st := Stats{Received: map[string]uint64{}, Refused: map[Refusal]uint64{}, Forwarded: b.forwarded.Load(),
		ForwardErrors: b.fwdErrs.Load(), Index: b.index.Stats()}
	for t, name := range transports {
		st.Received[name] = b.received[t].Load()
		st.Requests += st.Received[name]
		for r, reason := range reasonIndex {
			n := b.refused[t][r].Load()
			st.Refused[Refusal{name, reason}] = n
			st.BadRequests += n
		}
	}
	st.BudgetUsed, st.Budget, st.InFlight = b.budget.state()
	return st
}

// refuse counts a refused request.
func (b *Bridge) refuse(transport int, reason string) {
	for r, name := range reasonIndex {
		if name == reason {
			b.refused[transport][r].Add(1)
		}
	}
}

// handle indexes a request and forwards it; a forwarding error goes back to
// the sender (which retries), as a collector's would.
func (b *Bridge) handle(ctx context.Context, r *request) error {
	b.index.Add(r.msg.GetResourceSpans())
	if b.fwd == nil {
		return nil
	}
	if err := b.fwd.send(ctx, r); err != nil {
		b.fwdErrs.Add(1)
		b.warn("forward\x00"+b.cfg.Upstream.Endpoint, "forward OTLP traces upstream", "upstream", b.cfg.Upstream.Endpoint, "err", err)
		return fmt.Errorf("forward upstream: %w", err)
	}
	b.forwarded.Add(1)
	return nil
}

const httpIdx, grpcIdx = 1, 0

// serveHTTP reads, decodes, indexes and forwards one OTLP/HTTP request
// within the limits: 413 past MaxBody (declared, read or decompressed),
// 429 with Retry-After when overloaded, 415 for what OTLP does not send,
// 400 for an undecodable body.
func (b *Bridge) serveHTTP(w http.ResponseWriter, req *http.Request) {
	b.received[httpIdx].Add(1)
	refuse := func(reason string, code int, msg string) {
		b.refuse(httpIdx, reason)
		switch code {
		case http.StatusTooManyRequests:
			w.Header().Set("Retry-After", "1")
		case http.StatusRequestEntityTooLarge:
			w.Header().Set("Connection", "close") // the rest of the body is not read
		}
		http.Error(w, msg, code)
	}
	r := &request{encoding: req.Header.Get("Content-Encoding"), msg: &collectorpb.ExportTraceServiceRequest{}}
	r.contentType = otlpContentType(req.Header.Get("Content-Type"))
	switch {
	case r.contentType == "":
		refuse(ReasonUnsupported, http.StatusUnsupportedMediaType, "Content-Type must be application/x-protobuf or application/json")
		return
	case r.encoding != "" && r.encoding != "identity" && r.encoding != "gzip":
		refuse(ReasonUnsupported, http.StatusUnsupportedMediaType, "unsupported Content-Encoding")
		return
	case req.ContentLength > b.lim.MaxBody:
		refuse(ReasonTooLarge, http.StatusRequestEntityTooLarge, fmt.Sprintf("body of %d bytes: the limit is %d", req.ContentLength, b.lim.MaxBody))
		return
	}
	c, err := b.budget.admit()
	if err != nil {
		refuse(ReasonOverloaded, http.StatusTooManyRequests, err.Error())
		return
	}
	defer c.release()
	plain, err := b.readHTTPBody(c, req, r)
	switch {
	case errors.Is(err, errTooLarge):
		refuse(ReasonTooLarge, http.StatusRequestEntityTooLarge, fmt.Sprintf("body over the limit of %d bytes (after decompression)", b.lim.MaxBody))
		return
	case errors.Is(err, errOverloaded):
		refuse(ReasonOverloaded, http.StatusTooManyRequests, err.Error())
		return
	case errors.Is(err, errBadGzip):
		refuse(ReasonBadPayload, http.StatusBadRequest, err.Error())
		return
	case err != nil:
		refuse(ReasonReadError, http.StatusBadRequest, "cannot read body: "+err.Error())
		return
	}
	if r.contentType == contentProto {
		err = proto.Unmarshal(plain, r.msg)
	} else {
		err = unmarshalJSON(plain, r.msg)
	}
	if err != nil {
		refuse(ReasonBadPayload, http.StatusBadRequest, "cannot decode OTLP request: "+err.Error())
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

var errBadGzip = errors.New("bad gzip body")

// readHTTPBody reads the body (kept in r.body, as received, for forwarding)
// and returns it decompressed, charging c for both.
func (b *Bridge) readHTTPBody(c *claim, req *http.Request, r *request) ([]byte, error) {
	if r.encoding != "gzip" {
		body, err := c.readAll(req.Body, b.lim.MaxBody, req.ContentLength, BodyCost+CostPerByte)
		r.body = body
		return body, err
	}
	body, err := c.readAll(req.Body, b.lim.MaxBody, req.ContentLength, BodyCost)
	if err != nil {
		return nil, err
	}
	r.body = body
	zr, err := gzip.NewReader(bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errBadGzip, err)
	}
	plain, err := c.readAll(zr, b.lim.MaxBody, -1, CostPerByte)
	if err != nil && !errors.Is(err, errTooLarge) && !errors.Is(err, errOverloaded) {
		err = fmt.Errorf("%w: %v", errBadGzip, err)
	}
	return plain, err
}

// otlpContentType names the encoding of an OTLP/HTTP Content-Type ("":
// neither protobuf nor JSON).
func otlpContentType(ctype string) string {
	mt, _, _ := strings.Cut(ctype, ";")
	switch strings.TrimSpace(mt) {
	case contentProto, "application/protobuf":
		return contentProto
	case contentJSON:
		return contentJSON
	}
	return ""
}

// OTLP/JSON writes trace and span ids as hex, where protojson expects base64.
var idKeys = map[string]bool{"traceId": true, "spanId": true, "parentSpanId": true}

// unmarshalJSON decodes OTLP/JSON. protojson reads the hex ids as base64
// (hex digits are base64 digits): encoding the bytes it made back as
// base64 gives the hex text again, decoded here. This keeps the decode
// within protojson's own cost, where rewriting the JSON first took 22x
// the body.
func unmarshalJSON(b []byte, m *collectorpb.ExportTraceServiceRequest) error {
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(b, m); err != nil {
		return err
	}
	return hexIDs(m)
}

// hexIDs turns every trace and span id protojson read from OTLP/JSON's hex
// into its bytes.
func hexIDs(m *collectorpb.ExportTraceServiceRequest) error {
	var err error
	fix := func(id *[]byte) {
		if err != nil || len(*id) == 0 {
			return
		}
		text := base64.StdEncoding.EncodeToString(*id)
		raw, e := hex.DecodeString(text)
		if e != nil {
			err = fmt.Errorf("id %q is not hex", text)
			return
		}
		*id = raw
	}
	for _, rs := range m.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				fix(&sp.TraceId)
				fix(&sp.SpanId)
				fix(&sp.ParentSpanId)
				for _, l := range sp.GetLinks() {
					fix(&l.TraceId)
					fix(&l.SpanId)
				}
			}
		}
	}
	return err
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
