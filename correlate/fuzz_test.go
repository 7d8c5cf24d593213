package correlate

import (
	"testing"
	"time"

	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/probes"
)

// FuzzEngine feeds arbitrary call sequences (small address and handle
// alphabets, so that registrations, twins and syncs collide) and checks the
// engine's promise: every copy is emitted exactly once, never lost.
func FuzzEngine(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15})
	f.Add([]byte("\x10\x20\x30\x40\x50\x60\x70\x80\x90\xa0\xb0\xc0\xd0\xe0\xf0\xff"))
	f.Fuzz(func(t *testing.T, data []byte) {
		var copies, posted int
		seen, xfers := map[uint64]int{}, map[uint64]int{}
		e := NewEngine(Config{PendingTimeout: time.Microsecond * 50, MaxPending: 8, MaxRanges: 4, MaxProcesses: 2,
			Sink: SinkFunc(func(tr *Transfer) {
				if tr.Op.IsXfer() { // a transfer library's: one record per call posted
					xfers[tr.SubmitNs]++
					return
				}
				seen[tr.SubmitNs<<8|uint64(tr.BatchIndex+1)]++
			})})
		e.ObservedFromStart(1)
		e.ObservedSince(2, []Range{{0x1000, 0x3000}})
		ts := uint64(1000)
		addr := func(b byte) uint64 { return 0x1000 * uint64(b&7) }
		for len(data) >= 4 {
			op, a, b, x := data[0], data[1], data[2], data[3]
			data = data[4:]
			ts += uint64(x&0xf)*10 + 1
			id := uint16(op) % uint16(len(probes.Table)+1)                       // one past the table: unknown probe
			c := event.Call{Kind: event.KindCall, Probe: id, Op: event.Op(0xff)} // unknown to the engine
			if int(id) < len(probes.Table) {
				c, _ = probes.Template(probes.Table[id].Symbol)
			}
			c.PID, c.TID, c.Time = uint32(1+x>>6), uint32(1+x>>4&3), ts
			c.Dst, c.Src, c.Bytes, c.CopyKind = addr(a), addr(b), uint64(a>>3), event.CopyKind(b>>5)
			c.Stream, c.Event, c.Ptr, c.Size = uint64(a>>6), uint64(b>>6), addr(a), 0x1000*uint64(b>>3&3)
			if x&0x20 != 0 {
				c.Kind = event.KindBatchEntry
				c.BatchIndex = uint32(b & 3)
			}
			if op == 0xff {
				c.Kind = event.KindExit
			}
			if c.Returns {
				c.ReturnTime = ts + uint64(a&3)
				c.Ret = uint64(b & 1 & (a >> 2))
			}
			if c.Op.IsCopy() && c.Kind != event.KindExit {
				copies++
			}
			// (A libfabric call that returned non-zero posted nothing: -FI_EAGAIN is a retry.)
			if c.Op.IsXfer() && c.Kind == event.KindCall && (c.Layer != event.LayerFabric || c.Ret == 0) {
				posted++
			}
			// Unique submit times identify transfers in seen.
			e.Handle(&c)
		}
		e.Flush()
		total := 0
		for k, n := range seen {
			if n != 1 {
				t.Fatalf("transfer %#x emitted %d times", k, n)
			}
			total += n
		}
		for k, n := range xfers {
			if n != 1 {
				t.Fatalf("transfer-library record %#x emitted %d times", k, n)
			}
		}
		if len(xfers) != posted {
			t.Fatalf("%d transfer-library records from %d calls", len(xfers), posted)
		}
		st := e.Stats()
		if uint64(total) != st.Transfers {
			t.Fatalf("sink saw %d, stats say %d", total, st.Transfers)
		}
		if total > copies || total < copies-int(st.Merged) {
			t.Fatalf("%d transfers from %d copies (%d merges)", total, copies, st.Merged)
		}
		for i := range e.txs {
			if e.txs[i].seq != 0 {
				t.Fatalf("pending transfer left after Flush: %+v", e.txs[i])
			}
		}
	})
}
