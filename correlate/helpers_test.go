package correlate

import (
	"testing"

	"github.com/lanewatch/lanewatch/probes"
)

const testPID = 4242

// probeID finds a row of probes.Table by symbol.
func probeID(t testing.TB, sym string) uint16 {
	t.Helper()
	for i := range probes.Table {
		if probes.Table[i].Symbol == sym {
			return uint16(i)
		}
	}
	t.Fatalf("no probe %q in the table", sym)
	return 0
}

// mk builds a call of sym at ts (and returning at rts when the row has a
// return probe), with the row's fixed direction if it has one.
func mk(t testing.TB, sym string, tid uint32, ts, rts uint64) *probes.Call {
	t.Helper()
	id := probeID(t, sym)
	row := &probes.Table[id]
	c := &probes.Call{Kind: probes.EventCall, Probe: id, PID: testPID, TID: tid, Time: ts}
	if row.Program == probes.ProgEntryReturn {
		c.ReturnTime = rts
	}
	if row.Kind <= probes.KindDefault {
		c.CopyKind = row.Kind
	}
	return c
}

func cp(t testing.TB, sym string, tid uint32, ts, dst, src, bytes uint64, kind probes.CopyKind, stream uint64) *probes.Call {
	c := mk(t, sym, tid, ts, 0)
	c.Dst, c.Src, c.Bytes, c.Stream = dst, src, bytes, stream
	if probes.Table[c.Probe].Layer == probes.LayerRuntime && probes.Table[c.Probe].Op != probes.OpCopyPeer {
		c.CopyKind = kind
	}
	return c
}

func mem(t testing.TB, sym string, tid uint32, ts, rts, ptr, size uint64) *probes.Call {
	c := mk(t, sym, tid, ts, rts)
	c.Ptr, c.Size = ptr, size
	return c
}

func syncCall(t testing.TB, sym string, tid uint32, ts, rts, stream, ev uint64) *probes.Call {
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
