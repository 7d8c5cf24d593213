package otlpbridge

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	collectorpb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
)

// Upstream is where received traces go, read from the standard OTLP
// exporter variables (traces-specific first):
//
//	OTEL_EXPORTER_OTLP_TRACES_ENDPOINT / OTEL_EXPORTER_OTLP_ENDPOINT
//	OTEL_EXPORTER_OTLP_TRACES_PROTOCOL / OTEL_EXPORTER_OTLP_PROTOCOL   grpc | http/protobuf (default) | http/json
//	OTEL_EXPORTER_OTLP_TRACES_HEADERS  / OTEL_EXPORTER_OTLP_HEADERS    k=v,k2=v2 (URL-encoded values)
//	OTEL_EXPORTER_OTLP_TRACES_INSECURE / OTEL_EXPORTER_OTLP_INSECURE   true: no TLS for grpc
//	OTEL_EXPORTER_OTLP_TRACES_TIMEOUT  / OTEL_EXPORTER_OTLP_TIMEOUT    ms (default 10000)
//
// As in the SDK, the generic endpoint gets /v1/traces appended for HTTP, the
// traces endpoint is used as given, and an http:// grpc endpoint means no TLS.
type Upstream struct {
	Endpoint string // "" forwarding off
	Protocol string
	Headers  map[string]string
	Insecure bool
	Timeout  time.Duration
}

// UpstreamFromEnv reads the variables through getenv (os.Getenv when nil).
func UpstreamFromEnv(getenv func(string) string) (Upstream, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	get := func(name string) string {
		if v := getenv("OTEL_EXPORTER_OTLP_TRACES_" + name); v != "" {
			return v
		}
		return getenv("OTEL_EXPORTER_OTLP_" + name)
	}
	u := Upstream{Protocol: get("PROTOCOL"), Headers: map[string]string{}, Timeout: 10 * time.Second}
	if u.Protocol == "" {
		u.Protocol = "http/protobuf"
	}
	switch u.Protocol {
	case "grpc", "http/protobuf", "http/json":
	default:
		return u, fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL %q: want grpc, http/protobuf or http/json", u.Protocol)
	}
	if ep := getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"); ep != "" {
		u.Endpoint = ep
	} else if ep := getenv("OTEL_EXPORTER_OTLP_ENDPOINT"); ep != "" {
		u.Endpoint = ep
		if u.Protocol != "grpc" {
			u.Endpoint = strings.TrimRight(ep, "/") + "/v1/traces"
		}
	}
	if h := get("HEADERS"); h != "" {
		for _, kv := range strings.Split(h, ",") {
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				return u, fmt.Errorf("OTEL_EXPORTER_OTLP_HEADERS: %q is not key=value", kv)
			}
			if dv, err := url.QueryUnescape(strings.TrimSpace(v)); err == nil {
				v = dv
			}
			u.Headers[strings.TrimSpace(k)] = v
		}
	}
	if v := get("INSECURE"); strings.EqualFold(v, "true") {
		u.Insecure = true
	}
	if v := get("TIMEOUT"); v != "" {
		var ms int
		if _, err := fmt.Sscan(v, &ms); err != nil || ms <= 0 {
			return u, fmt.Errorf("OTEL_EXPORTER_OTLP_TIMEOUT %q: want milliseconds", v)
		}
		u.Timeout = time.Duration(ms) * time.Millisecond
	}
	if u.Protocol != "grpc" && u.Endpoint != "" && !strings.Contains(u.Endpoint, "://") {
		u.Endpoint = "http://" + u.Endpoint
	}
	return u, nil
}

// forwarder sends requests upstream.
type forwarder struct {
	up     Upstream
	conn   *grpc.ClientConn
	client collectorpb.TraceServiceClient
	http   *http.Client
}

func newForwarder(up Upstream) (*forwarder, error) {
	f := &forwarder{up: up}
	if up.Protocol != "grpc" {
		f.http = &http.Client{Timeout: up.Timeout}
		return f, nil
	}
	target, creds := up.Endpoint, credentials.NewTLS(&tls.Config{})
	if u, err := url.Parse(up.Endpoint); err == nil && u.Host != "" {
		target = u.Host
		if u.Scheme == "http" {
			up.Insecure = true
		}
	}
	if up.Insecure {
		creds = insecure.NewCredentials()
	}
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(creds))
	if err != nil {
		return nil, fmt.Errorf("upstream %s: %w", up.Endpoint, err)
	}
	f.conn, f.client = conn, collectorpb.NewTraceServiceClient(conn)
	return f, nil
}

func (f *forwarder) close() error {
	if f.conn != nil {
		return f.conn.Close()
	}
	return nil
}

// request is one received export, in the form it came and decoded.
type request struct {
	msg         *collectorpb.ExportTraceServiceRequest
	body        []byte // HTTP: the body as received (possibly compressed); nil for gRPC
	contentType string
	encoding    string
}

// send forwards r. An HTTP body goes out byte for byte when the upstream
// speaks the same encoding; otherwise the decoded message is re-encoded.
func (f *forwarder) send(ctx context.Context, r *request) error {
	ctx, cancel := context.WithTimeout(ctx, f.up.Timeout)
	defer cancel()
	if f.client != nil {
		if len(f.up.Headers) > 0 {
			ctx = metadata.NewOutgoingContext(ctx, metadata.New(f.up.Headers))
		}
		_, err := f.client.Export(ctx, r.msg)
		return err
	}
	body, ctype, enc := r.body, r.contentType, r.encoding
	wantJSON := f.up.Protocol == "http/json"
	if body == nil || (ctype == contentJSON) != wantJSON {
		var err error
		if wantJSON {
			body, err = marshalJSON(r.msg)
			ctype = contentJSON
		} else {
			body, err = proto.Marshal(r.msg)
			ctype = contentProto
		}
		if err != nil {
			return err
		}
		enc = ""
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, f.up.Endpoint, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", ctype)
	if enc != "" {
		req.Header.Set("Content-Encoding", enc)
	}
	for k, v := range f.up.Headers {
		req.Header.Set(k, v)
	}
	resp, err := f.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("upstream %s: %s", f.up.Endpoint, resp.Status)
	}
	return nil
}
