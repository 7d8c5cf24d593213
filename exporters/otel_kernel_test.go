package exporters

import (
	"fmt"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
)

// A load stream's KV-transfer kernel launches are spans of their own, one
// per layer, apart from the copies on the same stream: named by the kernel,
// with lanewatch.mover sm and lanewatch.kernel, and neither bytes nor a
// rate (a launch states none) nor a fragmentation finding.
func TestSpansKernelCopies(t *testing.T) {
	mem := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(mem))
	s := NewSpans(SpansConfig{Tracer: tp.Tracer("t"), Mode: SpansBatched, Hold: time.Nanosecond})
	ts := uint64(1000)
	for layer := range 2 {
		for range 300 { // many launches of one layer: would be "fragmented" if their zero bytes counted
			s.Transfer(&correlate.Transfer{PID: 7, TID: 7, Stream: 0x10, API: "cudaLaunchKernel", Op: event.OpKernelCopy,
				Mover: correlate.MoverSM, Kernel: "transfer_kernel_impl", Direction: correlate.DirUnknown, BytesUnknown: true,
				Src: correlate.Side{Mem: event.MemUnknown}, Dst: correlate.Side{Mem: event.MemUnknown}, GPU: "0000:3b:00.0",
				SubmitNs: ts, CompleteNs: ts + 40, BatchIndex: -1, Layer: layer})
			ts += 50
		}
		s.Transfer(&correlate.Transfer{PID: 7, TID: 7, Stream: 0x10, API: "cudaMemcpyAsync", Op: event.OpCopy, Mover: correlate.MoverCopyEngine,
			Direction: correlate.DirH2D, Bytes: 1 << 20, Src: correlate.Side{Mem: event.MemPinned}, Dst: correlate.Side{Mem: event.MemDevice},
			HostMem: event.MemPinned, GPU: "0000:3b:00.0", SubmitNs: ts, CompleteNs: ts + 40, BatchIndex: -1, Layer: layer})
		ts += 50
	}
	s.Release(time.Now().Add(time.Hour))
	var got []string
	for _, sp := range mem.GetSpans() {
		var attrs []string
		for _, a := range sp.Attributes {
			switch a.Key {
			case AttrMover, AttrKernel, AttrLayer, AttrCount, AttrBytes, AttrRate:
				attrs = append(attrs, fmt.Sprintf("%s=%s", strings.TrimPrefix(string(a.Key), "lanewatch."), a.Value.String()))
			}
		}
		if len(sp.Events) > 0 {
			attrs = append(attrs, fmt.Sprintf("events=%d", len(sp.Events)))
		}
		got = append(got, sp.Name+" "+strings.Join(attrs, ","))
	}
	want := []string{
		"kernel_copy transfer_kernel_impl count=300,mover=sm,kernel=transfer_kernel_impl,layer=0",
		"transfer H2D count=1,bytes=1048576,mover=copy_engine,layer=0,rate_bytes_per_second=2.62144e+13",
		"kernel_copy transfer_kernel_impl count=300,mover=sm,kernel=transfer_kernel_impl,layer=1",
		"transfer H2D count=1,bytes=1048576,mover=copy_engine,layer=1,rate_bytes_per_second=2.62144e+13",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("spans:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
