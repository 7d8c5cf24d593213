package correlate

import (
	"encoding/binary"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/probes"
)

// Offsets of struct lw_event's fields in a ring record (bpf/lanewatch.h),
// for building records the way the BPF programs write them.
const (
	recKind    = 0
	recProbe   = 2
	recPID     = 4
	recTID     = 8
	recBatch   = 12
	recTime    = 16
	recRetTime = 24
	recRet     = 32
	recOut     = 40
	recArgs    = 56
)

// Event kinds of struct lw_event (enum lw_event_kind).
const (
	lwCall  = 1
	lwExec  = 3
	lwExit  = 4
	lwWR    = 5
	lwWC    = 6
	lwBatch = 2
)

// record builds one raw ring record.
func record(kind byte, probe int, pid, tid uint32, ts, retTS, ret, out uint64, args ...uint64) []byte {
	b := make([]byte, probes.EventSize)
	b[recKind] = kind
	binary.LittleEndian.PutUint16(b[recProbe:], uint16(probe))
	binary.LittleEndian.PutUint32(b[recPID:], pid)
	binary.LittleEndian.PutUint32(b[recTID:], tid)
	binary.LittleEndian.PutUint64(b[recTime:], ts)
	binary.LittleEndian.PutUint64(b[recRetTime:], retTS)
	binary.LittleEndian.PutUint64(b[recRet:], ret)
	binary.LittleEndian.PutUint64(b[recOut:], out)
	for i, a := range args {
		binary.LittleEndian.PutUint64(b[recArgs+8*i:], a)
	}
	return b
}

// rowOf is the first probe-table row of op.
func rowOf(tb testing.TB, op event.Op) int {
	for i := range probes.Table {
		if probes.Table[i].Op == op {
			return i
		}
	}
	tb.Fatalf("no probe row for op %v", op)
	return 0
}

// rowNamed is the probe-table row of symbol.
func rowNamed(tb testing.TB, symbol string) int {
	for i := range probes.Table {
		if probes.Table[i].Symbol == symbol {
			return i
		}
	}
	tb.Fatalf("no probe row %s", symbol)
	return 0
}

// ringFeeder hands records to the engine as the agent's reading goroutine
// does (probes.Probes.Read): each decoded into one reused Call, the ones
// Decode refuses counted and skipped. Records are copied into an 8-byte
// aligned buffer first, as the ring's are.
type ringFeeder struct {
	e                 *Engine
	buf               []byte // a 128-byte heap object: 8-byte aligned
	c                 event.Call
	decoded, rejected int
	pids              map[uint32]bool
}

func newRingFeeder(e *Engine) *ringFeeder {
	return &ringFeeder{e: e, buf: make([]byte, probes.EventSize), pids: map[uint32]bool{}}
}

func (f *ringFeeder) feed(rec []byte) {
	copy(f.buf, rec)
	if probes.Decode(f.buf[:len(rec)], &f.c) != nil {
		f.rejected++
		return
	}
	f.decoded++
	f.pids[f.c.PID] = true
	f.e.Handle(&f.c)
}

// retained says what the engine still holds of any process ("" nothing).
func (e *Engine) retained() string {
	r := e.rdma
	var left []string
	for what, n := range map[string]int{"processes": len(e.procs), "registry processes": len(e.reg.procs),
		"memory regions": len(r.mrs), "lkeys": len(r.byLKey), "rkeys": len(r.byRKey), "queues": len(r.queues),
		"latency series": len(r.lat)} {
		if n > 0 {
			left = append(left, fmt.Sprintf("%d %s", n, what))
		}
	}
	if e.last != nil {
		left = append(left, fmt.Sprintf("the last process (%d)", e.last.pid))
	}
	slices.Sort(left)
	return strings.Join(left, ", ")
}

// FuzzRingRecords feeds arbitrary ring records (probes.EventSize bytes
// each, as the BPF ring hands them to the agent) through probes.Decode into
// Engine.Handle. Whatever the bytes say — any kind, probe row, pid, thread,
// time, handle — the engine must not panic, must count every event it was
// given, must hand the sink every transfer it counts and hold none after
// Flush, and must hold nothing of a process once it exited (it kept the
// latency samples of exited processes' queue pairs): its state is bounded
// by the processes alive and its caps (TestHostileRingStreamsStayBounded),
// not by the stream's length.
func FuzzRingRecords(f *testing.F) {
	if b, err := os.ReadFile("testdata/hicache-load.events"); err == nil { // a real recording, in windows
		for off := 0; off+8*probes.EventSize <= len(b); off += 8 * probes.EventSize {
			f.Add(b[off : off+8*probes.EventSize])
		}
	} else {
		f.Fatal(err)
	}
	mr, post, poll := rowOf(f, event.OpMRRegister), rowOf(f, event.OpPostSend), rowOf(f, event.OpPollCQ)
	copyRow := rowNamed(f, "cuMemcpyHtoDAsync_v2")
	var rdma []byte
	rdma = append(rdma, record(lwExec, 0, 7, 7, 1, 0, 0, 0)...)
	rdma = append(rdma, record(lwCall, mr, 7, 8, 2, 3, 0x5000, 0x1234_0000_0042, 0, 0x10000, 4096)...)
	rdma = append(rdma, record(lwWR, post, 7, 8, 4, 0, 0, 0, 0xaa, 1, 4096, 0|2<<32, 0x20000, 0x1234, 0x10000, 0x42|1<<32, 17)...)
	rdma = append(rdma, record(lwWC, poll, 7, 8, 5, 6, 0, 0, 0xcc, 1, 0, 4096, 17)...)
	rdma = append(rdma, record(lwCall, copyRow, 7, 9, 7, 8, 0, 0, 0x7000_0000, 0x10000, 4096, 0)...)
	rdma = append(rdma, record(lwExit, 0, 7, 7, 9, 0, 0, 0)...)
	f.Add(rdma)
	f.Fuzz(func(t *testing.T, data []byte) {
		transfers := 0
		e := NewEngine(Config{ExecObserved: true, MaxPending: 8, MaxRanges: 8, MaxProcesses: 4,
			Sink:    SinkFunc(func(*Transfer) { transfers++ }),
			Devices: func(pid uint32, ordinal int) string { return "" }})
		feed := newRingFeeder(e)
		for len(data) >= probes.EventSize {
			feed.feed(data[:probes.EventSize])
			data = data[probes.EventSize:]
		}
		if len(data) > 0 {
			var c event.Call
			if err := probes.Decode(data, &c); err == nil {
				t.Fatalf("a %d-byte record decoded", len(data))
			}
		}
		if st := e.Stats(); st.Events != uint64(feed.decoded) {
			t.Fatalf("engine counted %d events, %d were handed to it", st.Events, feed.decoded)
		}
		e.Flush()
		if n := e.Pending(); n != 0 {
			t.Fatalf("%d copies still pending after Flush", n)
		}
		if n := e.RDMAStats().QueuedRequests; n != 0 {
			t.Fatalf("%d work requests still queued after Flush", n)
		}
		if st := e.Stats(); uint64(transfers) != st.Transfers {
			t.Fatalf("sink saw %d transfers, stats say %d", transfers, st.Transfers)
		}
		for pid := range feed.pids {
			e.ProcessExit(pid)
		}
		if left := e.retained(); left != "" {
			t.Fatalf("after every process exited the engine still holds %s", left)
		}
	})
}

// Streams of valid records that name ever new threads, memory regions and
// queue pairs — what a corrupted or hostile ring would say — leave the
// engine's state within its caps, and each cap that is hit is counted: a
// long-running agent's memory is bounded by its caps, not by how long a
// process lives.
func TestHostileRingStreamsStayBounded(t *testing.T) {
	const n = 3 << 16 // three times every cap below
	copyRow := rowNamed(t, "cuMemcpyHtoDAsync_v2")
	mr, post, poll := rowOf(t, event.OpMRRegister), rowOf(t, event.OpPostSend), rowOf(t, event.OpPollCQ)
	const pid = 100
	for _, tc := range []struct {
		name   string
		recs   func(i uint64) [][]byte
		held   func(e *Engine) int
		limit  int
		capHit func(e *Engine) uint64
	}{
		{"a new thread per copy", func(i uint64) [][]byte {
			return [][]byte{record(lwCall, copyRow, pid, uint32(1000+i), 10+2*i, 11+2*i, 0, 0, 0x7000_0000, 0x10000, 4096, 0)}
		}, func(e *Engine) int { return len(e.procs[pid].threads) }, 1 << 16,
			func(e *Engine) uint64 { return e.Stats().HandleCapHits }},
		{"a new memory region per registration", func(i uint64) [][]byte {
			return [][]byte{record(lwCall, mr, pid, 1, 10+2*i, 11+2*i, 0x1000+i, uint64(i)<<32|i, 0, 0x10000+i*4096, 4096)}
		}, func(e *Engine) int { return len(e.rdma.mrs) }, 1 << 16,
			func(e *Engine) uint64 { return e.RDMAStats().RegionCapHits }},
		{"a new queue pair per request", func(i uint64) [][]byte {
			return [][]byte{record(lwWR, post, pid, 1, 10+2*i, 0, 0, 0, 0xaa, i, 4096, 0|2<<32, 0x20000, 0x1234, 0x10000, 0x42|1<<32, 1+i)}
		}, func(e *Engine) int { return len(e.rdma.queues) }, 1 << 16,
			func(e *Engine) uint64 { return e.RDMAStats().QueueCapHits }},
		{"a new queue pair per completed request", func(i uint64) [][]byte {
			return [][]byte{
				record(lwWR, post, pid, 1, 10+3*i, 0, 0, 0, 0xaa, i, 4096, 0|2<<32, 0x20000, 0x1234, 0x10000, 0x42|1<<32, 1+i),
				record(lwWC, poll, pid, 1, 11+3*i, 12+3*i, 0, 0, 0xcc, i, 0, 4096, 1+i),
			}
		}, func(e *Engine) int { return len(e.rdma.lat) }, 1 << 10,
			func(e *Engine) uint64 { return e.RDMAStats().LatencyCapHits }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			transfers := 0
			e := NewEngine(Config{ExecObserved: true, Sink: SinkFunc(func(*Transfer) { transfers++ })})
			feed := newRingFeeder(e)
			feed.feed(record(lwExec, 0, pid, pid, 1, 0, 0, 0))
			for i := range uint64(n) {
				for _, r := range tc.recs(i) {
					feed.feed(r)
				}
			}
			if feed.rejected > 0 {
				t.Fatalf("%d records refused by Decode", feed.rejected)
			}
			if held := tc.held(e); held > tc.limit {
				t.Errorf("after %d records the engine holds %d, its cap is %d", n, held, tc.limit)
			}
			if tc.capHit(e) == 0 {
				t.Errorf("no cap hit counted")
			}
			e.ProcessExit(pid)
			if left := e.retained(); left != "" {
				t.Errorf("after the exit the engine still holds %s", left)
			}
		})
	}
}
