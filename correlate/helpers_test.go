package correlate

import (
	"testing"

	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/probes"
)

const testPID = 4242

// probeID is the table row of sym.
func probeID(t testing.TB, sym string) uint16 {
	t.Helper()
	c, ok := probes.Template(sym)
	if !ok {
		t.Fatalf("no probe %q in the table", sym)
	}
	return c.Probe
}

// call is c as the decoder would describe a call of sym: c's fields plus
// what the table says of the symbol.
func call(t testing.TB, sym string, c event.Call) *event.Call {
	t.Helper()
	tmpl, ok := probes.Template(sym)
	if !ok {
		t.Fatalf("no probe %q in the table", sym)
	}
	c.Probe, c.Symbol, c.Op, c.Layer, c.PerThread, c.Returns = tmpl.Probe, tmpl.Symbol, tmpl.Op, tmpl.Layer, tmpl.PerThread, tmpl.Returns
	return &c
}

// mk builds a call of sym at ts (and returning at rts when the probe
// reports at return), as the decoder describes it.
func mk(t testing.TB, sym string, tid uint32, ts, rts uint64) *event.Call {
	t.Helper()
	c, ok := probes.Template(sym)
	if !ok {
		t.Fatalf("no probe %q in the table", sym)
	}
	c.PID, c.TID, c.Time = testPID, tid, ts
	if c.Returns {
		c.ReturnTime = rts
	}
	return &c
}

func cp(t testing.TB, sym string, tid uint32, ts, dst, src, bytes uint64, kind event.CopyKind, stream uint64) *event.Call {
	c := mk(t, sym, tid, ts, 0)
	c.Dst, c.Src, c.Bytes, c.Stream = dst, src, bytes, stream
	if c.Layer == event.LayerRuntime && c.Op != event.OpCopyPeer {
		c.CopyKind = kind
	}
	return c
}

func mem(t testing.TB, sym string, tid uint32, ts, rts, ptr, size uint64) *event.Call {
	c := mk(t, sym, tid, ts, rts)
	c.Ptr, c.Size = ptr, size
	return c
}

func syncCall(t testing.TB, sym string, tid uint32, ts, rts, stream, ev uint64) *event.Call {
	c := mk(t, sym, tid, ts, rts)
	c.Stream, c.Event = stream, ev
	return c
}

// collect is a sink that keeps copies and fails on a duplicate.
type collect struct {
	t   testing.TB
	got []Transfer
}

func (s *collect) Transfer(tr *Transfer) { s.got = append(s.got, *tr) }

func (s *collect) unique() {
	s.t.Helper()
	seen := map[[3]uint64]bool{}
	for _, tr := range s.got {
		k := [3]uint64{tr.SubmitNs, tr.Dst.Addr, uint64(tr.BatchIndex + 1)}
		if seen[k] {
			s.t.Fatalf("transfer emitted twice: %+v", tr)
		}
		seen[k] = true
	}
}

func newTest(t *testing.T, cfg Config) (*Engine, *collect) {
	s := &collect{t: t}
	cfg.Sink = s
	return NewEngine(cfg), s
}

// addresses used across tests
const (
	pool    = 0x7f00_0000_0000 // pinned pool
	poolLen = 1 << 30
	heap    = 0x5600_0000_0000 // ordinary host memory
	dev     = 0x7e00_0000_0000 // device allocation
	devLen  = 1 << 30
	mib     = 1 << 20
)
