package otlpbridge

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	collectorpb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

func startBridge(t *testing.T, lim Limits) *Bridge {
	t.Helper()
	b, err := New(Config{GRPCListen: "127.0.0.1:0", HTTPListen: "127.0.0.1:0", Limits: lim, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	b.Serve()
	t.Cleanup(func() { b.Close() })
	return b
}

// rawPost sends headers (and body, if any) over its own connection and
// returns the response: what a sender that never sends its body gets.
func rawPost(t *testing.T, addr string, headers map[string]string, body []byte) *http.Response {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	var req strings.Builder
	fmt.Fprintf(&req, "POST /v1/traces HTTP/1.1\r\nHost: %s\r\n", addr)
	for k, v := range headers {
		fmt.Fprintf(&req, "%s: %s\r\n", k, v)
	}
	req.WriteString("\r\n")
	go func() { // the server may answer, and close, before it is all sent
		c.Write([]byte(req.String()))
		c.Write(body)
	}()
	c.SetReadDeadline(time.Now().Add(20 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("%v %v: %v", headers, len(body), err)
	}
	resp.Body.Close()
	return resp
}

func gzipped(b []byte) []byte {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Write(b)
	zw.Close()
	return buf.Bytes()
}

func validRequest(t *testing.T) []byte {
	now := time.Now().UnixNano()
	b, err := proto.Marshal(&collectorpb.ExportTraceServiceRequest{ResourceSpans: rs(nil, span(1, 2, "Scheduler", now, now+1000))})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Every OTLP/HTTP refusal has its status, as OTLP/HTTP specifies, and is
// counted by reason; the budget is whole again after each. On main a
// 200 MB body was read, then answered 400, and a gzip bomb decompressed
// to 64 MiB.
func TestHTTPLimits(t *testing.T) {
	const maxBody = 1 << 20
	b := startBridge(t, Limits{MaxBody: maxBody, MaxConcurrent: 2})
	addr := b.HTTPAddr().String()
	proto := map[string]string{"Content-Type": "application/x-protobuf"}
	with := func(h map[string]string, kv ...string) map[string]string {
		m := map[string]string{}
		for k, v := range h {
			m[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	bomb := gzipped(make([]byte, 64<<20)) // 64 MiB of zeros in 64 KiB
	valid := validRequest(t)
	validGz := gzipped(valid)
	for _, tc := range []struct {
		name    string
		headers map[string]string
		body    []byte
		code    int
		reason  string
	}{
		{"valid", with(proto, "Content-Length", fmt.Sprint(len(valid))), valid, 200, ""},
		{"valid gzip", with(proto, "Content-Encoding", "gzip", "Content-Length", fmt.Sprint(len(validGz))), validGz, 200, ""},
		{"200 MB declared, never sent", with(proto, "Content-Length", "200000000"), nil, 413, ReasonTooLarge},
		{"chunked past the limit", with(proto, "Transfer-Encoding", "chunked"), chunked(make([]byte, 3*maxBody)), 413, ReasonTooLarge},
		{"gzip bomb", with(proto, "Content-Encoding", "gzip", "Content-Length", fmt.Sprint(len(bomb))), bomb, 413, ReasonTooLarge},
		{"bad protobuf", with(proto, "Content-Length", "3"), []byte{0xff, 0xff, 0xff}, 400, ReasonBadPayload},
		{"bad gzip", with(proto, "Content-Encoding", "gzip", "Content-Length", "4"), []byte("nope"), 400, ReasonBadPayload},
		{"bad JSON", map[string]string{"Content-Type": "application/json", "Content-Length": "1"}, []byte("{"), 400, ReasonBadPayload},
		{"JSON id not hex", map[string]string{"Content-Type": "application/json", "Content-Length": fmt.Sprint(len(badID))}, []byte(badID), 400, ReasonBadPayload},
		{"text/plain", map[string]string{"Content-Type": "text/plain", "Content-Length": "0"}, nil, 415, ReasonUnsupported},
		{"brotli", with(proto, "Content-Encoding", "br", "Content-Length", "0"), nil, 415, ReasonUnsupported},
	} {
		before := b.Stats()
		resp := rawPost(t, addr, tc.headers, tc.body)
		after := b.Stats()
		if resp.StatusCode != tc.code {
			t.Errorf("%s: %s, want %d", tc.name, resp.Status, tc.code)
		}
		if tc.reason != "" {
			if d := after.Refused[Refusal{TransportHTTP, tc.reason}] - before.Refused[Refusal{TransportHTTP, tc.reason}]; d != 1 {
				t.Errorf("%s: %d more refused as %s, want 1", tc.name, d, tc.reason)
			}
		}
		if after.BudgetUsed != 0 || after.InFlight != 0 {
			t.Errorf("%s: budget %d bytes and %d requests still taken", tc.name, after.BudgetUsed, after.InFlight)
		}
	}
	if st := b.Stats(); st.Received[TransportHTTP] != 11 || st.Index.Spans == 0 {
		t.Errorf("received %d, %d spans indexed; want 11 and the valid ones'", st.Received[TransportHTTP], st.Index.Spans)
	}
}

// badID is OTLP/JSON whose span id is base64, not hex.
const badID = `{"resourceSpans":[{"scopeSpans":[{"spans":[{"spanId":"zzzzzzzzzzzzzzzz"}]}]}]}`

func chunked(b []byte) []byte {
	var out bytes.Buffer
	for len(b) > 0 {
		n := min(len(b), 64<<10)
		fmt.Fprintf(&out, "%x\r\n", n)
		out.Write(b[:n])
		out.WriteString("\r\n")
		b = b[n:]
	}
	out.WriteString("0\r\n\r\n")
	return out.Bytes()
}

// Past MaxConcurrent requests being read, the next is answered 429 with
// Retry-After over HTTP and ResourceExhausted with RetryInfo over gRPC
// (both retried by OTLP exporters), and counted overloaded.
func TestOverloaded(t *testing.T) {
	b := startBridge(t, Limits{MaxBody: 1 << 20, MaxConcurrent: 1})
	// One request admitted: its headers promise a body it never sends.
	hold, err := net.Dial("tcp", b.HTTPAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Close()
	fmt.Fprintf(hold, "POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\nContent-Length: 1000\r\n\r\nabc")
	deadline := time.Now().Add(10 * time.Second)
	for b.Stats().InFlight != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the held request was never admitted")
		}
		time.Sleep(5 * time.Millisecond)
	}
	body := validRequest(t)
	resp := rawPost(t, b.HTTPAddr().String(), map[string]string{"Content-Type": "application/x-protobuf", "Content-Length": fmt.Sprint(len(body))}, body)
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Errorf("HTTP: %s, Retry-After %q; want 429 with Retry-After", resp.Status, resp.Header.Get("Retry-After"))
	}
	err = grpcExport(t, b, &collectorpb.ExportTraceServiceRequest{})
	st := status.Convert(err)
	retry := false
	for _, d := range st.Details() {
		_, ok := d.(*errdetails.RetryInfo)
		retry = retry || ok
	}
	if st.Code() != codes.ResourceExhausted || !retry {
		t.Errorf("gRPC: %v (details %v); want ResourceExhausted with RetryInfo", err, st.Details())
	}
	s := b.Stats()
	if s.Refused[Refusal{TransportHTTP, ReasonOverloaded}] != 1 || s.Refused[Refusal{TransportGRPC, ReasonOverloaded}] != 1 {
		t.Errorf("refused as overloaded: %v", s.Refused)
	}
}

func grpcExport(t *testing.T, b *Bridge, req proto.Message, opts ...grpc.CallOption) error {
	t.Helper()
	conn, err := grpc.NewClient(b.GRPCAddr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return conn.Invoke(ctx, collectorpb.TraceService_Export_FullMethodName, req, &collectorpb.ExportTraceServiceResponse{}, opts...)
}

// rawBytes is a message that encodes as the given bytes, to send what no
// OTLP exporter would.
type rawBytes []byte

type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }
func (rawCodec) Marshal(v any) ([]byte, error) {
	if r, ok := v.(rawBytes); ok {
		return r, nil
	}
	return proto.Marshal(v.(proto.Message))
}
func (rawCodec) Unmarshal(d []byte, v any) error { return proto.Unmarshal(d, v.(proto.Message)) }

// gRPC answers as OTLP specifies: InvalidArgument for a payload that is
// not an ExportTraceServiceRequest (gRPC's own codec says Internal, as it
// did on main), ResourceExhausted past MaxBody; a valid one is indexed.
func TestGRPCStatus(t *testing.T) {
	b := startBridge(t, Limits{MaxBody: 1 << 20})
	conn, err := grpc.NewClient(b.GRPCAddr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	send := func(payload rawBytes) error {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		return conn.Invoke(ctx, collectorpb.TraceService_Export_FullMethodName, payload, &collectorpb.ExportTraceServiceResponse{},
			grpc.ForceCodec(rawCodec{}))
	}
	for _, tc := range []struct {
		name    string
		payload []byte
		code    codes.Code
		reason  string
	}{
		{"valid", validRequest(t), codes.OK, ""},
		{"truncated varint", []byte{0x0a, 0xff}, codes.InvalidArgument, ReasonBadPayload},
		{"length past the end", []byte{0x0a, 0x05, 1, 2}, codes.InvalidArgument, ReasonBadPayload},
		{"field number 0", []byte{0x00, 0x01}, codes.InvalidArgument, ReasonBadPayload},
		{"past MaxBody", append([]byte{0x0a, 0x80, 0x80, 0x80, 0x01}, make([]byte, 2<<20)...), codes.ResourceExhausted, ReasonTooLarge},
	} {
		before := b.Stats()
		err := send(tc.payload)
		if status.Code(err) != tc.code {
			t.Errorf("%s: %v, want %s", tc.name, err, tc.code)
		}
		after := b.Stats()
		if tc.reason != "" && after.Refused[Refusal{TransportGRPC, tc.reason}]-before.Refused[Refusal{TransportGRPC, tc.reason}] != 1 {
			t.Errorf("%s: not counted as %s: %v", tc.name, tc.reason, after.Refused)
		}
	}
	if st := b.Stats(); st.Index.Spans != 1 || st.Received[TransportGRPC] != 5 {
		t.Errorf("%d spans indexed, %d received; want 1 and 5", st.Index.Spans, st.Received[TransportGRPC])
	}
	deadline := time.Now().Add(10 * time.Second)
	for st := b.Stats(); st.BudgetUsed != 0 || st.InFlight != 0; st = b.Stats() {
		if time.Now().After(deadline) {
			t.Fatalf("calls ended but %d bytes and %d requests are still taken", st.BudgetUsed, st.InFlight)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A connection that sends nothing is closed after ReadTimeout, over HTTP
// and gRPC alike, and each listener serves at most MaxConnections: more
// wait in the backlog, holding no descriptor of the agent's.
func TestSlowAndManyConnections(t *testing.T) {
	const rt = 300 * time.Millisecond
	b := startBridge(t, Limits{MaxConnections: 2, ReadTimeout: rt})
	for _, addr := range []string{b.HTTPAddr().String(), b.GRPCAddr().String()} {
		var conns []net.Conn
		for range 3 {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			conns = append(conns, c)
		}
		// The first two are served and closed as idle; the third, accepted
		// only when one of them is gone, waits its own timeout after that:
		// it cannot be closed before twice the timeout.
		start := time.Now()
		for i, c := range conns {
			c.SetReadDeadline(time.Now().Add(20 * time.Second))
			if _, err := io.Copy(io.Discard, c); err != nil {
				t.Errorf("%s connection %d: not closed by the receiver: %v", addr, i, err)
			}
			if took, least := time.Since(start), time.Duration(1+i/2)*rt; took < least {
				t.Errorf("%s connection %d closed after %s, before %s: not held by the cap", addr, i, took, least)
			}
		}
	}
}

// The decode budget bounds the bytes requests being decoded hold: a
// request whose decode would pass it is refused as overloaded, and what
// it took is given back.
func TestDecodeBudget(t *testing.T) {
	bud := &budget{max: 1000, concurrent: 4}
	c1, err := bud.admit()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c1.readAll(bytes.NewReader(make([]byte, 60)), 100, -1, 10); err != nil {
		t.Fatalf("60 bytes at 10 each within 1000: %v", err)
	}
	c2, _ := bud.admit()
	if _, err := c2.readAll(bytes.NewReader(make([]byte, 50)), 100, -1, 10); err != errOverloaded {
		t.Errorf("600 + 500 > 1000: %v, want overloaded", err)
	}
	if _, err := c2.readAll(bytes.NewReader(make([]byte, 101)), 100, -1, 1); err != errTooLarge {
		t.Errorf("101 bytes of 100: %v, want too large", err)
	}
	c3, _ := bud.admit()
	if _, err := c3.readAll(bytes.NewReader(nil), 100, 90, 10); err != errOverloaded {
		t.Errorf("a declared size is paid for at once: %v, want overloaded", err)
	}
	c1.release()
	c1.release() // once only
	c2.release()
	c3.release()
	if used, _, n := bud.state(); used != 0 || n != 0 {
		t.Errorf("after release: %d bytes, %d requests", used, n)
	}
	for range 4 {
		if _, err := bud.admit(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := bud.admit(); err != errOverloaded {
		t.Errorf("fifth of 4: %v", err)
	}
}

// The limits a flag cannot give: a request of MaxBody must fit the budget.
func TestLimitsCheck(t *testing.T) {
	if err := (Limits{MaxBody: 8 << 20, DecodeBudget: 80 << 20}).Check(); err != nil {
		t.Error(err)
	}
	if err := (Limits{MaxBody: 8 << 20, DecodeBudget: 64 << 20}).Check(); err == nil || !strings.Contains(err.Error(), "--otlp.max-body 8388608") {
		t.Errorf("8 MiB in a 64 MiB budget: %v", err)
	}
	if got := DecodeBudgetFor(512<<20, Limits{}); got != 128<<20 {
		t.Errorf("budget of 512 MiB: %d, want a quarter", got)
	}
	if got := DecodeBudgetFor(1<<62, Limits{MaxBody: 1 << 20, MaxConcurrent: 2}); got != 2*RequestCost(1<<20) {
		t.Errorf("budget without a limit: %d", got)
	}
}

// Close ends within its grace whatever senders hold open: an idle
// connection on each receiver and a request whose body never comes.
func TestCloseWithOpenConnections(t *testing.T) {
	b, err := New(Config{GRPCListen: "127.0.0.1:0", HTTPListen: "127.0.0.1:0", Logger: slog.New(slog.DiscardHandler), Limits: Limits{ReadTimeout: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	b.Serve()
	for _, addr := range []string{b.GRPCAddr().String(), b.HTTPAddr().String(), b.HTTPAddr().String()} {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if addr == b.HTTPAddr().String() {
			fmt.Fprintf(c, "POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\nContent-Length: 100\r\n\r\n")
		}
	}
	start := time.Now()
	if err := b.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	// Not a timing test: without cutting them, Close waited for the
	// senders' timeouts (gRPC's handshake: 10 s; the read timeout: 1 min).
	if took := time.Since(start); took > 9*time.Second {
		t.Errorf("Close took %s: it waited for the senders, past its grace of %s", took, closeGrace)
	}
}
