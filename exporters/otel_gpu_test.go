package exporters

import (
	"fmt"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
)

// processPaths places every transfer of a process on one GPU, as a
// placement by process does.
type processPaths string

func (p processPaths) Path(t *correlate.Transfer) (Path, bool) {
	return Path{GPU: string(p), NUMANode: -1}, true
}

// A span names the GPU of its copies (docs/design.md, "Placement"): the
// copy's own when the engine knew it, the path's otherwise; one stream's
// copies onto two GPUs (a thread that switched device) are two spans.
func TestSpansGPU(t *testing.T) {
	mem := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(mem))
	s := NewSpans(SpansConfig{Tracer: tp.Tracer("t"), Mode: SpansBatched, Hold: time.Nanosecond, Paths: processPaths("0000:17:00.0")})
	for i, gpu := range []string{"0000:3b:00.0", "0000:3b:00.0", "0000:86:00.0", ""} {
		s.Transfer(&correlate.Transfer{PID: 7, TID: 7, Stream: 0x10, API: "cudaMemcpyAsync", Op: event.OpCopy, Direction: correlate.DirH2D,
			Bytes: 1 << 20, Src: correlate.Side{Mem: event.MemPinned}, Dst: correlate.Side{Mem: event.MemDevice}, HostMem: event.MemPinned,
			GPU: gpu, SubmitNs: uint64(1000 + i*100), CompleteNs: uint64(1050 + i*100), BatchIndex: -1, Layer: -1})
	}
	s.Release(time.Now().Add(time.Hour))
	var got []string
	for _, sp := range mem.GetSpans() {
		gpu := ""
		for _, a := range sp.Attributes {
			if a.Key == AttrGPU {
				gpu = a.Value.AsString()
			}
		}
		count := int64(0)
		for _, a := range sp.Attributes {
			if a.Key == AttrCount {
				count = a.Value.AsInt64()
			}
		}
		got = append(got, fmt.Sprintf("%s×%d", gpu, count))
	}
	want := "[0000:3b:00.0×2 0000:86:00.0×1 0000:17:00.0×1]"
	if fmt.Sprint(got) != want {
		t.Errorf("spans %v, want %s", got, want)
	}
}
