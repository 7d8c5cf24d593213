package selftest

import (
	"strings"
	"testing"
	"time"

	collectorpb "go.opentelemetry.io/proto/otlp/collector/trace/v1"

	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/otlpbridge"
)

// localProcs: every process is on this host (SGLang's host id, this
// host's /etc/machine-id) and has no parent.
type localProcs struct{}

func (localProcs) HostID(uint32) (string, bool) { return HostID(), true }
func (localProcs) Parent(uint32) (uint32, bool) { return 0, false }

// hicacheLike is a truth of one copy per layer on the main thread of
// process 4242, and the transfers an agent reports for it.
func hicacheLike() ([]TruthCall, []correlate.Transfer) {
	var truth []TruthCall
	var got []correlate.Transfer
	for l := range 8 {
		call := uint64(1_000_000_000 + l*1_000_000)
		truth = append(truth, TruthCall{PID: 4242, TID: 4242, Op: TruthCopy, Direction: "H2D", Layer: l, TCallNs: call, TReturnNs: call + 500_000})
		got = append(got, correlate.Transfer{PID: 4242, TID: 4242, Op: event.OpCopy, Direction: "H2D", Layer: l, SubmitNs: call + 1000})
	}
	return truth, got
}

// TestSGLangSpansAttribute: the selftest's SGLang spans, current and first
// release, attribute every copy to its request under its span through the
// built-in rules; a span form the rules did not read would fail it.
func TestSGLangSpansAttribute(t *testing.T) {
	truth, got := hicacheLike()
	const offset = 1_700_000_000_000_000_000
	arrival := time.Unix(0, offset+2_000_000_000) // after the last span ended
	wall := func(m uint64) int64 { return int64(m) + offset }
	for name, form := range map[string]func([]TruthCall, int64) (*collectorpb.ExportTraceServiceRequest, []SpanRequest){
		"current": SGLangSpans, "September 2025": SGLangSpansSept2025,
	} {
		sent, per := form(truth, offset)
		if per[0].ID == per[len(per)-1].ID {
			t.Fatalf("%s: one request for every layer", name)
		}
		x := otlpbridge.NewIndex(otlpbridge.IndexConfig{Procs: localProcs{}})
		x.AddAt(sent.GetResourceSpans(), arrival)
		problems, matched := CheckAttribution(x, got, truth, per, wall)
		if len(problems) > 0 || matched != len(truth) {
			t.Errorf("%s: %d matched, %s", name, matched, strings.Join(problems, "; "))
		}
	}
	// Spans of another host's thread with the same id do not name ours.
	sent, per := SGLangSpans(truth, offset)
	x := otlpbridge.NewIndex(otlpbridge.IndexConfig{Procs: otherHost{}})
	x.AddAt(sent.GetResourceSpans(), arrival)
	if _, matched := CheckAttribution(x, got, truth, per, wall); matched != 0 {
		t.Errorf("another host's spans attributed %d copies", matched)
	}
}

type otherHost struct{ localProcs }

func (otherHost) HostID(uint32) (string, bool) { return "0123456789abcdef0123456789abcdef", true }

// TestVLLMSpansBatch: the selftest's vLLM requests all cover every copy of
// the API server's process: a batch, by span start.
func TestVLLMSpansBatch(t *testing.T) {
	truth, got := hicacheLike()
	const offset = 1_700_000_000_000_000_000
	arrival := time.Unix(0, offset+2_000_000_000)
	sent, reqs := VLLMSpans(truth, offset, 2)
	x := otlpbridge.NewIndex(otlpbridge.IndexConfig{Procs: localProcs{}})
	x.AddAt(sent.GetResourceSpans(), arrival)
	for _, tr := range got {
		a := x.Attribute(tr.PID, tr.TID, int64(tr.SubmitNs)+offset)
		if a.Batch != 2 || a.Requests[0] != reqs[1].ID || a.Requests[1] != reqs[0].ID || a.Scope != otlpbridge.ScopeOfProcess {
			t.Fatalf("layer %d: %+v", tr.Layer, a)
		}
	}
	if a := x.Attribute(9999, 9999, int64(got[0].SubmitNs)+offset); a.Rule != "" {
		t.Errorf("a process outside the instance: %+v", a)
	}
}
