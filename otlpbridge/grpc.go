package otlpbridge

import (
	"context"
	"fmt"
	"time"

	collectorpb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// The gRPC receiver decodes requests itself (serverCodec), so that a bad
// payload is answered InvalidArgument as OTLP asks (gRPC's own codec says
// Internal) and the decode is charged to the budget. A call is admitted
// (MaxConcurrent, and MaxBody of the budget for the message gRPC reads)
// before gRPC reads its message, by the tap, and released when it ends.

// newGRPCServer makes the gRPC server with the receiver's limits.
func (b *Bridge) newGRPCServer() *grpc.Server {
	rt := b.lim.ReadTimeout
	srv := grpc.NewServer(grpc.MaxRecvMsgSize(int(b.lim.MaxBody)), grpc.ForceServerCodec(serverCodec{}), grpc.InTapHandle(b.tap),
		grpc.ConnectionTimeout(min(rt, 10*time.Second)), grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: rt}))
	srv.RegisterService(&grpc.ServiceDesc{
		ServiceName: collectorpb.TraceService_ServiceDesc.ServiceName,
		HandlerType: (*any)(nil),
		Methods:     []grpc.MethodDesc{{MethodName: "Export", Handler: exportHandler}},
		Metadata:    collectorpb.TraceService_ServiceDesc.Metadata,
	}, b)
	return srv
}

type claimKey struct{}

// tap admits a call before gRPC reads its message: the claim holds MaxBody
// (the buffer gRPC may allocate) until the call ends, which the read
// timeout bounds, forwarding aside.
func (b *Bridge) tap(ctx context.Context, _ *tap.Info) (context.Context, error) {
	b.received[grpcIdx].Add(1)
	c, err := b.budget.admit()
	if err == nil {
		if err = c.charge(b.lim.MaxBody); err != nil {
			c.release()
		}
	}
	if err != nil {
		b.refuse(grpcIdx, ReasonOverloaded)
		return nil, overloaded(err)
	}
	ctx, cancel := context.WithTimeout(ctx, b.lim.ReadTimeout+b.cfg.Upstream.Timeout)
	context.AfterFunc(ctx, func() {
		c.release()
		cancel()
	})
	return context.WithValue(ctx, claimKey{}, c), nil
}

// overloaded is ResourceExhausted with the RetryInfo that makes OTLP
// exporters retry.
func overloaded(err error) error {
	st, derr := status.New(codes.ResourceExhausted, err.Error()).WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(time.Second)})
	if derr != nil {
		return status.Error(codes.ResourceExhausted, err.Error())
	}
	return st.Err()
}

// grpcRequest is a received message as serverCodec decoded it.
type grpcRequest struct {
	claim *claim
	msg   *collectorpb.ExportTraceServiceRequest
	err   error // errOverloaded, or why it is not an OTLP request
}

func (g *grpcRequest) decode(data []byte) {
	if g.claim != nil {
		if g.err = g.claim.charge(int64(len(data)) * CostPerByte); g.err != nil {
			return
		}
	}
	g.msg = &collectorpb.ExportTraceServiceRequest{}
	g.err = proto.Unmarshal(data, g.msg)
}

func exportHandler(srv any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
	b := srv.(*Bridge)
	in := &grpcRequest{}
	in.claim, _ = ctx.Value(claimKey{}).(*claim)
	if err := dec(in); err != nil {
		// gRPC's own refusals: past MaxRecvMsgSize, bad compression, gone.
		reason := ReasonReadError
		if status.Code(err) == codes.ResourceExhausted {
			reason = ReasonTooLarge
		}
		b.refuse(grpcIdx, reason)
		return nil, err
	}
	switch {
	case in.err == errOverloaded:
		b.refuse(grpcIdx, ReasonOverloaded)
		return nil, overloaded(in.err)
	case in.err != nil:
		b.refuse(grpcIdx, ReasonBadPayload)
		return nil, status.Errorf(codes.InvalidArgument, "cannot decode OTLP request: %v", in.err)
	}
	if err := b.handle(ctx, &request{msg: in.msg}); err != nil {
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	return &collectorpb.ExportTraceServiceResponse{}, nil
}

// serverCodec decodes requests into grpcRequest, never failing the call
// itself, and encodes responses as protobuf.
type serverCodec struct{}

func (serverCodec) Name() string { return "proto" }

func (serverCodec) Marshal(v any) ([]byte, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("cannot encode %T", v)
	}
	return proto.Marshal(m)
}

func (serverCodec) Unmarshal(data []byte, v any) error {
	switch x := v.(type) {
	case *grpcRequest:
		x.decode(data)
		return nil
	case proto.Message:
		return proto.Unmarshal(data, x)
	}
	return fmt.Errorf("cannot decode into %T", v)
}
