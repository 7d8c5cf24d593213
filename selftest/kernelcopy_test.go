package selftest

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/otlpbridge"
)

const testKernel = "_Z20transfer_kernel_implIXadL_Z20get_global_offset_lfIKcEPT_S3_PKmllllEEXadL_ZS0_IcES3_S3_S5_llllEELb0EEvPKvPvS7_S8_PKlSA_lllllllS5_S5_S5_S5_"

// kernelTruth is a kernel-copy truth: four layered loads on stream 0x10
// (an event recorded after each) and a writeback on stream 0x20.
func kernelTruth() []TruthCall {
	var out []TruthCall
	t := uint64(1_000_000)
	for layer := range 4 {
		out = append(out,
			TruthCall{PID: 7, TID: 7, API: "cudaLaunchKernel", Op: TruthKernelCopy, Kernel: testKernel, Mover: "sm", GPU: "f223:25:00.0",
				Stream: 0x10, Layer: layer, TCallNs: t, TReturnNs: t + 5000, EngineEndNs: t + 90_000},
			TruthCall{PID: 7, TID: 7, API: "cudaEventRecord", Op: TruthEventRecord, Stream: 0x10, Layer: layer, TCallNs: t + 6000, TReturnNs: t + 7000})
		t += 100_000
	}
	return append(out, TruthCall{PID: 7, TID: 7, API: "cudaLaunchKernel", Op: TruthKernelCopy, Kernel: testKernel, Mover: "sm",
		GPU: "f223:25:00.0", Stream: 0x20, Layer: -1, TCallNs: t, TReturnNs: t + 5000, EngineEndNs: t + 90_000})
}

// records are what the agent must report of kernelTruth.
func records(truth []TruthCall) []correlate.Transfer {
	var out []correlate.Transfer
	layered := map[uint64]bool{0x10: true}
	for _, w := range launches(truth) {
		layer := -1
		if layered[w.Stream] {
			layer = w.Layer
		}
		out = append(out, correlate.Transfer{PID: w.PID, TID: w.TID, Stream: w.Stream, API: w.API, DriverAPI: "cuLaunchKernel",
			Op: event.OpKernelCopy, Mover: correlate.MoverSM, Kernel: "transfer_kernel_impl", KernelSymbol: w.Kernel,
			Direction: correlate.DirUnknown, BytesUnknown: true, GPU: w.GPU, SubmitNs: w.TCallNs + 100, CompleteNs: w.EngineEndNs + 10,
			BatchIndex: -1, Layer: layer})
	}
	return out
}

func TestCheckSMRecords(t *testing.T) {
	truth := kernelTruth()
	if p := CheckSMRecords(truth, records(truth)); len(p) != 0 {
		t.Errorf("the truth's own records: %v", p)
	}
	for name, spoil := range map[string]func(r []correlate.Transfer) []correlate.Transfer{
		"a layer":             func(r []correlate.Transfer) []correlate.Transfer { r[2].Layer = 3; return r },
		"the writeback layer": func(r []correlate.Transfer) []correlate.Transfer { r[4].Layer = 4; return r },
		"the GPU":             func(r []correlate.Transfer) []correlate.Transfer { r[0].GPU = ""; return r },
		"invented bytes": func(r []correlate.Transfer) []correlate.Transfer {
			r[1].Bytes, r[1].BytesUnknown = 8<<20, false
			return r
		},
		"a guessed direction": func(r []correlate.Transfer) []correlate.Transfer { r[1].Direction = correlate.DirH2D; return r },
		"the stream":          func(r []correlate.Transfer) []correlate.Transfer { r[3].Stream = 0x20; return r },
		"the kernel":          func(r []correlate.Transfer) []correlate.Transfer { r[0].KernelSymbol = "_Z6k_copyPvPKvm"; return r },
		"an early completion": func(r []correlate.Transfer) []correlate.Transfer { r[0].CompleteNs = r[0].SubmitNs + 1; return r },
		"a missing launch":    func(r []correlate.Transfer) []correlate.Transfer { return r[1:] },
		"no proof":            func(r []correlate.Transfer) []correlate.Transfer { r[4].CompleteNs = 0; return r },
	} {
		if p := CheckSMRecords(truth, spoil(records(truth))); len(p) == 0 {
			t.Errorf("%s spoilt: no problem found", name)
		}
	}
}

// The spans are SGLang's current form, and the bridge's rules read them:
// a transfer of each layer's load is attributed to its request, under its
// prefill_forward slice.
func TestSGLangCurrentSpans(t *testing.T) {
	truth := kernelTruth()
	const offset = 1_700_000_000_000_000_000
	req, per := SGLangCurrentSpans(truth, offset)
	if len(per) != 4 || per[0].id == per[3].id || per[0].id != per[1].id || per[2].id != per[3].id {
		t.Fatalf("requests by layer %+v: two requests of two layers each", per)
	}
	names := map[string]int{}
	for _, rs := range req.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				switch {
				case regexp.MustCompile(`^ Req [0-9a-f]{8}$`).MatchString(sp.GetName()):
					names["request"]++
				case regexp.MustCompile(`^Scheduler \[TP 0\] \(host:\S* \| pid:7\)$`).MatchString(sp.GetName()):
					names["thread"]++
				case sp.GetName() == "prefill_forward":
					names["slice"]++
				default:
					t.Errorf("span %q", sp.GetName())
				}
			}
		}
	}
	if names["request"] != 2 || names["thread"] != 2 || names["slice"] != 2 {
		t.Errorf("spans %v", names)
	}
	x := otlpbridge.NewIndex(otlpbridge.IndexConfig{})
	x.AddAt(req.GetResourceSpans(), time.Unix(0, offset+1_000_000_000))
	for _, w := range launches(truth) {
		a := x.Attribute(7, 7, int64(w.TCallNs)+100+offset)
		want, layered := per[w.Layer]
		switch {
		case !layered && w.Layer >= 0:
			t.Errorf("layer %d has no request", w.Layer)
		case !layered:
			if a.Request != "" {
				t.Errorf("the writeback attributed to %q", a.Request)
			}
		case a.Request != want.id || a.Parent != want.parent || !strings.HasPrefix(a.Rule, "sglang"):
			t.Errorf("layer %d: %+v, want %s under %x", w.Layer, a, want.id, want.parent.SpanID)
		}
	}
}
