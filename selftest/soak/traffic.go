package soak

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	collectorpb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/lanewatch/lanewatch/selftest"
)

// otlpCounts counts the soak's OTLP requests by what they were and how
// the agent answered (HTTP status, "grpc ok", or the client's error).
type otlpCounts struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *otlpCounts) add(what, answer string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[what+" "+answer]++
}

func (c *otlpCounts) snapshot() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int, len(c.n))
	for k, v := range c.n {
		out[k] = v
	}
	return out
}

func (c *otlpCounts) total(prefix string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for k, v := range c.n {
		if len(k) >= len(prefix) && k[:len(prefix)] == prefix {
			n += v
		}
	}
	return n
}

// normalTraffic sends, for every finished reference process that copied,
// the spans an inference server would have exported for it (selftest's
// SGLang and vLLM shapes, otlpbridge/shapes), in turn over OTLP/HTTP
// protobuf, OTLP/HTTP JSON and gRPC, as one long-lived client each.
type normalTraffic struct {
	httpURL string
	http    *http.Client
	grpc    *grpc.ClientConn
	offset  int64 // Unix ns − CLOCK_MONOTONIC ns
	n       atomic.Uint64
	counts  *otlpCounts
}

func newNormalTraffic(httpAddr, grpcAddr string, counts *otlpCounts) (*normalTraffic, error) {
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	return &normalTraffic{httpURL: "http://" + httpAddr + "/v1/traces", http: &http.Client{Timeout: 20 * time.Second}, grpc: conn,
		offset: time.Now().UnixNano() - int64(monoNow()), counts: counts}, nil
}

func (t *normalTraffic) close() {
	t.grpc.Close()
	t.http.CloseIdleConnections()
}

// send is the workload's onFinished.
func (t *normalTraffic) send(ctx context.Context, kind string, truth []selftest.TruthCall) {
	n := t.n.Add(1)
	var req *collectorpb.ExportTraceServiceRequest
	switch n % 3 {
	case 0:
		req, _ = selftest.SGLangSpans(truth, t.offset)
	case 1:
		req, _ = selftest.SGLangSpansSept2025(truth, t.offset)
	default:
		req, _ = selftest.VLLMSpans(truth, t.offset, 2)
	}
	if len(req.GetResourceSpans()) == 0 {
		return // no copies: a server would have had nothing to say of them
	}
	switch n % 4 {
	case 0, 1:
		t.postProto(ctx, req)
	case 2:
		t.postJSON(ctx, req)
	default:
		_, err := collectorpb.NewTraceServiceClient(t.grpc).Export(ctx, req)
		t.counts.add("normal grpc", errAnswer(err, "ok"))
	}
}

func (t *normalTraffic) postProto(ctx context.Context, req *collectorpb.ExportTraceServiceRequest) {
	body, err := proto.Marshal(req)
	if err != nil {
		t.counts.add("normal http/protobuf", "marshal: "+err.Error())
		return
	}
	t.counts.add("normal http/protobuf", post(ctx, t.http, t.httpURL, "application/x-protobuf", body))
}

func (t *normalTraffic) postJSON(ctx context.Context, req *collectorpb.ExportTraceServiceRequest) {
	body, err := otlpJSON(req)
	if err != nil {
		t.counts.add("normal http/json", "marshal: "+err.Error())
		return
	}
	t.counts.add("normal http/json", post(ctx, t.http, t.httpURL, "application/json", body))
}

// otlpJSON is OTLP/JSON: protojson with trace and span ids in hex.
func otlpJSON(m proto.Message) ([]byte, error) {
	b, err := protojson.Marshal(m)
	if err != nil {
		return nil, err
	}
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return nil, err
	}
	if err := hexIDs(v); err != nil {
		return nil, err
	}
	return json.Marshal(v)
}

func hexIDs(v any) error {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			if s, ok := e.(string); ok && (k == "traceId" || k == "spanId" || k == "parentSpanId") {
				raw, err := base64.StdEncoding.DecodeString(s)
				if err != nil {
					return fmt.Errorf("%s %q: %w", k, s, err)
				}
				x[k] = hex.EncodeToString(raw)
				continue
			}
			if err := hexIDs(e); err != nil {
				return err
			}
		}
	case []any:
		for _, e := range x {
			if err := hexIDs(e); err != nil {
				return err
			}
		}
	}
	return nil
}

// post sends one body and returns the answer's status, or the error.
func post(ctx context.Context, c *http.Client, url, ctype string, body []byte) string {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err.Error()
	}
	req.Header.Set("Content-Type", ctype)
	resp, err := c.Do(req)
	if err != nil {
		return "error"
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	return fmt.Sprint(resp.StatusCode)
}

func errAnswer(err error, ok string) string {
	if err != nil {
		return "error"
	}
	return ok
}

// Hostile is the abuse of the agent's OTLP ports, in modest volumes:
// every Every, an oversized body, garbage on each port and format, slow
// clients that trickle a body and idle connections held open.
type Hostile struct {
	Every     time.Duration // between rounds of each kind (0: no hostile traffic)
	BodyBytes int           // the oversized body
	Conns     int           // idle connections held per round (half on each port)
	Hold      time.Duration // how long a slow or idle client holds its connection
}

// hostileTraffic runs the Hostile kinds, each in its own loop.
type hostileTraffic struct {
	cfg                Hostile
	httpAddr, grpcAddr string
	client             *http.Client // no keep-alive: each abuse on its own connection
	counts             *otlpCounts
	big                []byte
}

func newHostileTraffic(cfg Hostile, httpAddr, grpcAddr string, counts *otlpCounts) *hostileTraffic {
	big := make([]byte, cfg.BodyBytes)
	rand.NewChaCha8([32]byte{1}).Read(big)
	return &hostileTraffic{cfg: cfg, httpAddr: httpAddr, grpcAddr: grpcAddr, counts: counts, big: big,
		client: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}}
}

// kinds are the hostile loops' rounds.
func (h *hostileTraffic) kinds() []func(ctx context.Context) {
	return []func(ctx context.Context){h.oversized, h.garbage, h.slow, h.idle}
}

func (h *hostileTraffic) url() string { return "http://" + h.httpAddr + "/v1/traces" }

func (h *hostileTraffic) oversized(ctx context.Context) {
	h.counts.add("hostile oversized", post(ctx, h.client, h.url(), "application/x-protobuf", h.big))
}

// garbage sends bodies that are not OTLP: random protobuf, broken JSON,
// a wrong content type, and random bytes on the gRPC port.
func (h *hostileTraffic) garbage(ctx context.Context) {
	junk := make([]byte, 4096)
	rand.NewChaCha8([32]byte{byte(time.Now().UnixNano())}).Read(junk)
	h.counts.add("hostile garbage-protobuf", post(ctx, h.client, h.url(), "application/x-protobuf", junk))
	h.counts.add("hostile garbage-json", post(ctx, h.client, h.url(), "application/json", []byte(`{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"zz`)))
	h.counts.add("hostile wrong-type", post(ctx, h.client, h.url(), "text/plain", junk[:64]))
	h.counts.add("hostile garbage-grpc", h.raw(ctx, h.grpcAddr, junk, time.Second))
}

// raw writes b on a new connection and reads until the peer closes or
// wait passed.
func (h *hostileTraffic) raw(ctx context.Context, addr string, b []byte, wait time.Duration) string {
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return "dial error"
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(wait))
	if _, err := c.Write(b); err != nil {
		return "closed"
	}
	io.Copy(io.Discard, c)
	return "sent"
}

// slow clients announce a 1 MiB body and trickle a byte every 100 ms for
// Hold, then leave: four at a time.
func (h *hostileTraffic) slow(ctx context.Context) {
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h.counts.add("hostile slow", h.trickle(ctx))
		}()
	}
	wg.Wait()
}

func (h *hostileTraffic) trickle(ctx context.Context) string {
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp", h.httpAddr)
	if err != nil {
		return "dial error"
	}
	defer c.Close()
	fmt.Fprintf(c, "POST /v1/traces HTTP/1.1\r\nHost: %s\r\nContent-Type: application/x-protobuf\r\nContent-Length: %d\r\n\r\n", h.httpAddr, 1<<20)
	end := time.Now().Add(h.cfg.Hold)
	for time.Now().Before(end) && ctx.Err() == nil {
		c.SetWriteDeadline(time.Now().Add(time.Second))
		if _, err := c.Write([]byte{0x0a}); err != nil {
			return "cut off" // the agent closed it: what a bounded receiver does
		}
		time.Sleep(100 * time.Millisecond)
	}
	return "held"
}

// idle opens Conns connections, sends nothing, and closes them after Hold.
func (h *hostileTraffic) idle(ctx context.Context) {
	var conns []net.Conn
	for i := range h.cfg.Conns {
		addr := h.httpAddr
		if i%2 == 1 {
			addr = h.grpcAddr
		}
		c, err := (&net.Dialer{Timeout: 2 * time.Second}).DialContext(ctx, "tcp", addr)
		if err != nil {
			h.counts.add("hostile idle", "dial error")
			continue
		}
		conns = append(conns, c)
	}
	h.counts.add("hostile idle", fmt.Sprintf("round of %d", len(conns)))
	select {
	case <-ctx.Done():
	case <-time.After(h.cfg.Hold):
	}
	for _, c := range conns {
		c.Close()
	}
}
