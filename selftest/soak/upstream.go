package soak

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	collectorpb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/lanewatch/lanewatch/exporters"
)

// upstreamMode is what the soak's OTLP collector does at the moment.
type upstreamMode int

const (
	modeUp      upstreamMode = iota
	modeDown                 // not listening: connections are refused
	modeFailing              // answers 503 Service Unavailable
	modeSlow                 // answers after slowDelay
)

func (m upstreamMode) String() string {
	return [...]string{"up", "down", "503", "slow"}[m]
}

const (
	slowDelay = 1500 * time.Millisecond
	// Bodies up to this are decoded and checked; larger ones (the hostile
	// load forwarded) are read and counted only, so the soak's own memory
	// stays bounded.
	maxDecoded = 16 << 20
)

// upstream is the OTLP/HTTP collector the agent forwards to and exports
// its transfer spans to: a real server on a fixed loopback port that
// flaps — down (closed listener), failing (503), slow — and records what
// the soak checks: the spans of the traced processes, and the spans and
// bodies of the normal OTLP traffic the agent forwarded.
type upstream struct {
	addr string

	mu   sync.Mutex
	mode upstreamMode
	ln   net.Listener
	srv  *http.Server

	st upstreamStats
}

type upstreamStats struct {
	Requests      int // answered 2xx
	Refused       int // answered 503 while failing
	Metrics       int // /v1/metrics requests (OTLP metrics, when the agent sends them)
	Big           int // bodies over maxDecoded: counted, not decoded
	BigBytes      int64
	Bad           int // bodies that did not decode
	TransferSpans int // lanewatch's spans
	Forwarded     int // spans of the soak's OTLP traffic the agent forwarded
	Flaps         int
}

func newUpstream() (*upstream, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	u := &upstream{addr: ln.Addr().String()}
	u.serve(ln)
	return u, nil
}

func (u *upstream) serve(ln net.Listener) {
	u.ln = ln
	u.srv = &http.Server{Handler: http.HandlerFunc(u.handle), ReadHeaderTimeout: 10 * time.Second}
	go u.srv.Serve(ln)
}

// URL is the OTLP endpoint (OTEL_EXPORTER_OTLP_ENDPOINT).
func (u *upstream) URL() string { return "http://" + u.addr }

// set changes the mode. Going down closes the listener and every
// connection; coming up listens again on the same port.
func (u *upstream) set(m upstreamMode) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	if m == u.mode {
		return nil
	}
	u.st.Flaps++
	if m == modeDown {
		srv := u.srv
		u.srv, u.ln, u.mode = nil, nil, m
		u.mu.Unlock()
		srv.Close()
		u.mu.Lock()
		return nil
	}
	if u.mode == modeDown {
		var ln net.Listener
		var err error
		for range 50 { // the port is ours; a close may take a moment to release it
			if ln, err = net.Listen("tcp", u.addr); err == nil {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err != nil {
			return fmt.Errorf("upstream: listen again on %s: %w", u.addr, err)
		}
		u.serve(ln)
	}
	u.mode = m
	return nil
}

func (u *upstream) close() {
	u.mu.Lock()
	srv := u.srv
	u.srv = nil
	u.mu.Unlock()
	if srv != nil {
		srv.Close()
	}
}

func (u *upstream) currentMode() upstreamMode {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.mode
}

func (u *upstream) stats() upstreamStats {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.st
}

func eachSpan(req *collectorpb.ExportTraceServiceRequest, fn func(res []*commonpb.KeyValue, sp *tracepb.Span)) {
	for _, rs := range req.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				fn(rs.GetResource().GetAttributes(), sp)
			}
		}
	}
}

func (u *upstream) handle(w http.ResponseWriter, r *http.Request) {
	switch u.currentMode() {
	case modeFailing:
		io.Copy(io.Discard, r.Body)
		u.mu.Lock()
		u.st.Refused++
		u.mu.Unlock()
		http.Error(w, "flapping", http.StatusServiceUnavailable)
		return
	case modeSlow:
		select {
		case <-time.After(slowDelay):
		case <-r.Context().Done():
			return
		}
	}
	if r.URL.Path == "/v1/metrics" {
		io.Copy(io.Discard, r.Body)
		u.mu.Lock()
		u.st.Metrics++
		u.st.Requests++
		u.mu.Unlock()
		w.WriteHeader(http.StatusOK)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxDecoded+1))
	if err != nil {
		return
	}
	if len(body) > maxDecoded {
		n, _ := io.Copy(io.Discard, r.Body)
		u.mu.Lock()
		u.st.Big++
		u.st.BigBytes += int64(len(body)) + n
		u.st.Requests++
		u.mu.Unlock()
		w.WriteHeader(http.StatusOK)
		return
	}
	plain := body
	if r.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(bytes.NewReader(body))
		if err == nil {
			plain, err = io.ReadAll(io.LimitReader(zr, maxDecoded))
		}
		if err != nil {
			u.bad(w)
			return
		}
	}
	var req collectorpb.ExportTraceServiceRequest
	if err := proto.Unmarshal(plain, &req); err != nil {
		u.bad(w)
		return
	}
	u.mu.Lock()
	u.st.Requests++
	eachSpan(&req, func(res []*commonpb.KeyValue, _ *tracepb.Span) {
		if v, _ := attrString(res, "service.name"); v == exporters.ServiceName {
			u.st.TransferSpans++
		} else {
			u.st.Forwarded++
		}
	})
	u.mu.Unlock()
	w.Header().Set("Content-Type", "application/x-protobuf")
	resp, _ := proto.Marshal(&collectorpb.ExportTraceServiceResponse{})
	w.Write(resp)
}

func (u *upstream) bad(w http.ResponseWriter) {
	u.mu.Lock()
	u.st.Bad++
	u.mu.Unlock()
	http.Error(w, "bad body", http.StatusBadRequest)
}

func attrString(kvs []*commonpb.KeyValue, key string) (string, bool) {
	for _, kv := range kvs {
		if kv.GetKey() != key {
			continue
		}
		switch v := kv.GetValue().GetValue().(type) {
		case *commonpb.AnyValue_StringValue:
			return v.StringValue, true
		case *commonpb.AnyValue_IntValue:
			return strconv.FormatInt(v.IntValue, 10), true
		}
		return "", true
	}
	return "", false
}

// waitUp makes sure the upstream is up (the end of a cycle, the agent's
// shutdown) and answers.
func (u *upstream) waitUp(ctx context.Context) error {
	if err := u.set(modeUp); err != nil {
		return err
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, u.URL()+"/v1/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return errors.Join(errors.New("upstream does not answer"), err)
	}
	resp.Body.Close()
	return nil
}
