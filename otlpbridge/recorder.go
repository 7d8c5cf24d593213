package otlpbridge

import (
	"context"
	"net"
	"sync"

	collectorpb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// Recorder is an in-memory OTLP gRPC trace collector on loopback: the
// selftest and the tests point the bridge and the span exporter at it and
// read back what arrived.
type Recorder struct {
	collectorpb.UnimplementedTraceServiceServer
	ln  net.Listener
	srv *grpc.Server

	mu   sync.Mutex
	reqs []*collectorpb.ExportTraceServiceRequest
}

// NewRecorder listens on a free loopback port and serves.
func NewRecorder() (*Recorder, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &Recorder{ln: ln, srv: grpc.NewServer()}
	collectorpb.RegisterTraceServiceServer(r.srv, r)
	go r.srv.Serve(ln)
	return r, nil
}

// Addr is host:port.
func (r *Recorder) Addr() string { return r.ln.Addr().String() }

// Export records a copy of the request.
func (r *Recorder) Export(_ context.Context, req *collectorpb.ExportTraceServiceRequest) (*collectorpb.ExportTraceServiceResponse, error) {
	r.mu.Lock()
	r.reqs = append(r.reqs, proto.Clone(req).(*collectorpb.ExportTraceServiceRequest))
	r.mu.Unlock()
	return &collectorpb.ExportTraceServiceResponse{}, nil
}

// Requests returns what arrived so far.
func (r *Recorder) Requests() []*collectorpb.ExportTraceServiceRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*collectorpb.ExportTraceServiceRequest(nil), r.reqs...)
}

// Close stops the server.
func (r *Recorder) Close() { r.srv.Stop() }
