package selftest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"

	collectorpb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/exporters"
	"github.com/lanewatch/lanewatch/otlpbridge"
	"github.com/lanewatch/lanewatch/otlpbridge/shapes"
)

// The kernel-copy scenario's SM-moved transfers (docs/design.md, "Kernel
// movers"): every launch of the sgl-kernel stand-in is a record moved by
// SMs, in launch order, with its kernel, stream, thread, GPU and layer (on
// the load stream, where an event is recorded per layer), its direction and
// bytes unknown, its submission inside the launch call and its completion
// proven after the kernel ran.

// splitSM separates the records moved by SMs from the rest.
func splitSM(got []correlate.Transfer) (sm, rest []correlate.Transfer) {
	for _, t := range got {
		if t.Mover == correlate.MoverSM {
			sm = append(sm, t)
		} else {
			rest = append(rest, t)
		}
	}
	return sm, rest
}

// launches are the truth's KV-transfer kernel launches in call order.
func launches(truth []TruthCall) []TruthCall {
	var out []TruthCall
	for _, t := range truth {
		if t.Op == TruthKernelCopy {
			out = append(out, t)
		}
	}
	return out
}

// CheckSMRecords compares the agent's SM-moved records with the truth's
// launches, record by record; it returns the problems (none: they agree).
func CheckSMRecords(truth []TruthCall, sm []correlate.Transfer) []string {
	want := launches(truth)
	var problems []string
	problem := func(format string, args ...any) {
		if len(problems) < 8 {
			problems = append(problems, fmt.Sprintf(format, args...))
		}
	}
	if len(sm) != len(want) {
		problem("%d records moved by SMs, the scenario launched %d KV-transfer kernels", len(sm), len(want))
	}
	layered := map[uint64]bool{}
	for _, t := range truth {
		if t.Op == TruthEventRecord {
			layered[t.Stream] = true
		}
	}
	for i := 0; i < len(want) && i < len(sm); i++ {
		w, g := want[i], sm[i]
		layer := -1
		if layered[w.Stream] {
			layer = w.Layer
		}
		switch {
		case g.Op != event.OpKernelCopy || g.API != w.API || g.DriverAPI != "cuLaunchKernel" || g.KernelSymbol != w.Kernel ||
			g.Kernel != correlate.KernelName(w.Kernel):
			problem("launch %d: %s/%s %s (%s), want %s/cuLaunchKernel kernel_copy of %s", i, g.API, g.DriverAPI, g.Op, g.Kernel, w.API, w.Kernel)
		case g.Stream != w.Stream || g.TID != w.TID || g.PID != w.PID:
			problem("launch %d: pid %d tid %d stream %#x, want %d %d %#x", i, g.PID, g.TID, g.Stream, w.PID, w.TID, w.Stream)
		case g.GPU != w.GPU:
			problem("launch %d: GPU %q, want %q", i, g.GPU, w.GPU)
		case g.Layer != layer:
			problem("launch %d: layer %d, want %d", i, g.Layer, layer)
		case !g.BytesUnknown || g.Bytes != 0 || g.Direction != correlate.DirUnknown:
			problem("launch %d: %d bytes (unknown %v) %s: a launch states neither", i, g.Bytes, g.BytesUnknown, g.Direction)
		case g.SubmitNs < w.TCallNs || g.SubmitNs > w.TReturnNs:
			problem("launch %d: submitted at %d, outside its call [%d, %d]", i, g.SubmitNs, w.TCallNs, w.TReturnNs)
		case g.CompleteNs == 0 || w.EngineEndNs != 0 && g.CompleteNs < w.EngineEndNs:
			problem("launch %d: completion %d, the kernel ended at %d", i, g.CompleteNs, w.EngineEndNs)
		}
	}
	return problems
}

// hostID is this host's /etc/machine-id, what SGLang's _get_host_id reads
// in the scenario's process (it shares the selftest's root); "" unknown.
func hostID() string {
	b, err := os.ReadFile("/etc/machine-id")
	if err != nil {
		return ""
	}
	return string(bytes.TrimSpace(b))
}

// smRequest is the request a layer's load served, with the span its
// transfers must hang under.
type smRequest struct {
	id     string
	parent otlpbridge.SpanRef
}

// SGLangCurrentSpans makes what a current SGLang (the class-based tracing,
// otlpbridge/shapes.SGLangCurrent) exports for the scenario's layered loads
// in two requests: the loads of the first half of the layers serve request
// 0, the rest request 1. Each request has its ` Req <rid8>` span (rid), a
// `Scheduler [TP 0] (host:… | pid:TID)` thread span (pid the loading
// thread, thread_label, host_id) and under it a prefill_forward slice
// covering that request's loads: the innermost forward slice is the parent
// of a transfer inside it. offset converts the truth's CLOCK_MONOTONIC ns to
// Unix ns. It returns the spans and, by layer, the request.
func SGLangCurrentSpans(truth []TruthCall, offset int64) (*collectorpb.ExportTraceServiceRequest, map[int]smRequest) {
	var loads []TruthCall
	for _, t := range launches(truth) {
		if t.Layer >= 0 {
			loads = append(loads, t)
		}
	}
	per := map[int]smRequest{}
	if len(loads) == 0 {
		return &collectorpb.ExportTraceServiceRequest{}, per
	}
	split := len(loads) / 2
	groups := [2][]TruthCall{loads[:split], loads[split:]}
	s := shapes.SGLang{Version: shapes.SGLangCurrent, IDs: shapes.NewIDs(uint32(loads[0].PID))}
	var spans []*tracepb.Span
	for g, ls := range groups {
		if len(ls) == 0 {
			continue
		}
		// Each request's spans end before the next one's begin: halfway
		// between the last launch of one and the first of the next.
		start, end := int64(ls[0].TCallNs)-2000, int64(ls[len(ls)-1].TReturnNs)+2000
		if g == 0 && len(groups[1]) > 0 {
			end = (int64(ls[len(ls)-1].TReturnNs) + int64(groups[1][0].TCallNs)) / 2
		}
		if g == 1 && len(groups[0]) > 0 {
			start = (int64(groups[0][len(groups[0])-1].TReturnNs)+int64(ls[0].TCallNs))/2 + 1
		}
		rid := fmt.Sprintf("%08x%024x", uint32(ls[0].PID), g+1)
		req, rs := s.Request("unified", rid, 0, nil, start+offset-5000, end+offset+5000)
		spans = append(spans, rs...)
		th, tsp := s.Thread(req, shapes.SGLangThread{Label: "Scheduler", TID: ls[0].TID, HostID: hostID(), TP: shapes.Rank(0)},
			start+offset, end+offset)
		sl, ssp := s.Slice(th, "prefill_forward", start+offset, end+offset)
		spans = append(spans, tsp, ssp)
		for _, l := range ls {
			per[l.Layer] = smRequest{id: rid, parent: otlpbridge.SpanRef{TraceID: sl.TraceID, SpanID: sl.SpanID}}
		}
	}
	return &collectorpb.ExportTraceServiceRequest{ResourceSpans: []*tracepb.ResourceSpans{
		shapes.Batch(shapes.SGLangResource(), shapes.SGLangScope, spans...)}}, per
}

// smSpansCheck replays what a current SGLang would export for the
// scenario's loads through a real OTLP bridge (gRPC, loopback) forwarding
// to an in-process collector, feeds the agent's SM-moved records to the
// span exporter, and checks each layer's span: in its request's trace under
// the request's prefill_forward slice, with the request's id, moved by SMs,
// named by its kernel. It returns the problems and the layers matched.
func smSpansCheck(ctx context.Context, truth []TruthCall, sm []correlate.Transfer, cfg Config) (problems []string, matched int) {
	fail := func(err error) ([]string, int) { return append(problems, err.Error()), matched }
	clock := otlpbridge.NewClock()
	sent, per := SGLangCurrentSpans(truth, clock.Offset())
	received, err := throughBridge(ctx, cfg, clock, sm, sent)
	if err != nil {
		return fail(err)
	}
	pid := ""
	if len(sm) > 0 {
		pid = strconv.FormatUint(uint64(sm[0].PID), 10)
	}
	seen := map[int]bool{}
	for _, sp := range TransferSpans(received) {
		if v, _ := attrText(sp.GetAttributes(), "lanewatch.pid"); v != pid {
			continue
		}
		mover, _ := attrText(sp.GetAttributes(), string(exporters.AttrMover))
		if mover != correlate.MoverSM {
			continue
		}
		lv, _ := attrText(sp.GetAttributes(), string(exporters.AttrLayer))
		layer, err := strconv.Atoi(lv)
		if err != nil {
			continue // a writeback: no layer, and no request covers it
		}
		want, ok := per[layer]
		if !ok {
			problems = append(problems, fmt.Sprintf("SM span of layer %d: no such load", layer))
			continue
		}
		seen[layer] = true
		rid, _ := attrText(sp.GetAttributes(), string(exporters.AttrRequest))
		kernel, _ := attrText(sp.GetAttributes(), string(exporters.AttrKernel))
		_, hasBytes := attrText(sp.GetAttributes(), string(exporters.AttrBytes))
		switch {
		case string(sp.GetTraceId()) != string(want.parent.TraceID[:]):
			problems = append(problems, fmt.Sprintf("layer %d: trace %x, want the request's %x", layer, sp.GetTraceId(), want.parent.TraceID))
		case string(sp.GetParentSpanId()) != string(want.parent.SpanID[:]):
			problems = append(problems, fmt.Sprintf("layer %d: parent %x, want the prefill_forward slice %x", layer, sp.GetParentSpanId(), want.parent.SpanID))
		case rid != want.id:
			problems = append(problems, fmt.Sprintf("layer %d: request %q, want %q", layer, rid, want.id))
		case kernel != "transfer_kernel_impl" || sp.GetName() != "kernel_copy transfer_kernel_impl" || hasBytes:
			problems = append(problems, fmt.Sprintf("layer %d: span %q kernel %q, bytes stated %v", layer, sp.GetName(), kernel, hasBytes))
		default:
			matched++
		}
	}
	if len(seen) != len(per) {
		problems = append(problems, fmt.Sprintf("%d of %d loaded layers have an SM span", len(seen), len(per)))
	}
	return problems, matched
}
