package correlate

import (
	"encoding/binary"
	"testing"

	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/probes"
)

// recorder lays out raw ring buffer records as struct lw_event
// (bpf/lanewatch.h): kind u8, flags u8, probe u16, pid u32, tid u32,
// batch_index u32, ts_ns, ret_ts_ns, ret, out, caller, args[9] u64;
// little-endian.
type recorder struct {
	t        testing.TB
	buf      []byte
	ts, rets []uint64 // per record, to shift the clock on replay
}

// add appends one call of sym. Semantic values go to the argument
// positions of the symbol's table row, as the BPF program would read them.
func (r *recorder) add(sym string, tid uint32, ts, rts uint64, v event.Call) {
	id := probeID(r.t, sym)
	row := &probes.Table[id]
	var rec [128]byte
	if len(rec) != probes.EventSize {
		r.t.Fatalf("lw_event is %d bytes, recorder writes %d", probes.EventSize, len(rec))
	}
	le := binary.LittleEndian
	rec[0] = byte(event.KindCall)
	if v.ViaRuntime {
		rec[1] = 1 // LW_F_VIA_RUNTIME
	}
	le.PutUint16(rec[2:], id)
	le.PutUint32(rec[4:], testPID)
	le.PutUint32(rec[8:], tid)
	le.PutUint64(rec[16:], ts)
	if c, _ := probes.Template(sym); !c.Returns {
		rts = 0
	}
	le.PutUint64(rec[24:], rts)
	set := func(i int, x uint64) {
		if i >= 0 {
			le.PutUint64(rec[56+8*i:], x)
		}
	}
	a := row.Args
	set(a.Dst, v.Dst)
	set(a.Src, v.Src)
	set(a.Bytes, v.Bytes)
	set(a.Kind, uint64(v.CopyKind))
	set(a.Stream, v.Stream)
	set(a.Event, v.Event)
	set(a.Size, v.Size)
	if row.Out {
		le.PutUint64(rec[40:], v.Ptr)
		set(a.Ptr, 0x7ffc_0000_1000) // the out pointer itself: a stack address
	} else {
		set(a.Ptr, v.Ptr)
	}
	r.buf = append(r.buf, rec[:]...)
	r.ts = append(r.ts, ts)
	r.rets = append(r.rets, rts)
}

// hicache records a HiCache-like stream as the probes report it: one event
// per driver call at its return, made through the runtime. A registered
// host pool and a device pool, then cycles of per-layer page loads on a
// load stream with an event per layer that the compute stream waits on,
// pageable write-backs on a third stream, and a synchronisation of both at
// the end of each cycle. It returns the span of one cycle in ns; setup is
// the number of records before the first cycle.
func hicache(t testing.TB, cycles int) (r *recorder, setup int, span uint64) {
	r = &recorder{t: t}
	const (
		loader, sched                = 101, 102
		load, compute, wback         = 0x5500_0000_1000, 0x5500_0000_2000, 0x5500_0000_3000
		layers, pages, page          = 32, 8, 64 << 10
		writebacks                   = 2
		step                         = 500 // ns between calls: 2 M calls/s per thread
		call                         = 200 // ns a call takes
		hostPool, devPool, writeHeap = pool, dev, heap
	)
	ts := uint64(1_000_000)
	r.add("cuMemHostRegister_v2", loader, ts, ts+90, event.Call{Ptr: hostPool, Size: poolLen, ViaRuntime: true})
	r.add("cuMemAlloc_v2", loader, ts+100, ts+190, event.Call{Ptr: devPool, Size: devLen, ViaRuntime: true})
	setup = len(r.ts)
	ts += 1000
	start := ts
	for range cycles {
		for l := range uint64(layers) {
			for p := range uint64(pages) {
				off := (l*pages + p) * page
				c := event.Call{Dst: devPool + off, Src: hostPool + off, Bytes: page, Stream: load, ViaRuntime: true}
				r.add("cuMemcpyHtoDAsync_v2", loader, ts, ts+call, c)
				ts += step
			}
			ev := event.Call{Event: 0x5500_0001_0000 + l, Stream: load, ViaRuntime: true}
			r.add("cuEventRecord", loader, ts, ts+call, ev)
			ev.Stream = compute
			r.add("cuStreamWaitEvent", sched, ts+60, ts+60+call, ev)
			ts += step
			for w := range uint64(writebacks) {
				c := event.Call{Dst: writeHeap + w*page, Src: devPool + w*page, Bytes: page, Stream: wback, ViaRuntime: true}
				r.add("cuMemcpyDtoHAsync_v2", sched, ts, ts+call, c)
				ts += step
			}
		}
		for _, s := range []uint64{compute, wback} {
			r.add("cuStreamSynchronize", sched, ts, ts+10000, event.Call{Stream: s, ViaRuntime: true})
			ts += 10000
		}
	}
	return r, setup, (ts - start) / uint64(cycles)
}

// replay feeds the records after the setup through Decode and Handle
// round after round, shifting the clock by the recording's span each round.
type replay struct {
	r        *recorder
	from, j  int
	span     uint64 // of all cycles of the recording
	shift    uint64
	e        *Engine
	c        event.Call
	nrecords int
}

func (p *replay) next(tb testing.TB) {
	if p.j == p.nrecords {
		p.j = p.from
		p.shift += p.span
	}
	rec := p.r.buf[p.j*probes.EventSize : (p.j+1)*probes.EventSize]
	binary.LittleEndian.PutUint64(rec[16:], p.r.ts[p.j]+p.shift)
	if rt := p.r.rets[p.j]; rt != 0 {
		binary.LittleEndian.PutUint64(rec[24:], rt+p.shift)
	}
	if err := probes.Decode(rec, &p.c); err != nil {
		tb.Fatal(err)
	}
	p.e.Handle(&p.c)
	p.j++
}

func newReplay(tb testing.TB, e *Engine, cycles int) *replay {
	r, setup, span := hicache(tb, cycles)
	p := &replay{r: r, span: span * uint64(cycles), e: e, nrecords: len(r.ts)}
	e.ObservedFromStart(testPID)
	for p.j < setup {
		p.next(tb)
	}
	p.from = setup
	return p
}

type countSink struct{ n, completed, pinned, pageable int }

func (s *countSink) Transfer(t *Transfer) {
	s.n++
	if t.CompleteNs != 0 {
		s.completed++
	}
	switch t.HostMem {
	case event.MemPinned:
		s.pinned++
	case event.MemPageable:
		s.pageable++
	}
}

func TestPipelineReplay(t *testing.T) {
	sink := &countSink{}
	e := NewEngine(Config{Sink: sink})
	p := newReplay(t, e, 4)
	for range 3 * (p.nrecords - p.from) {
		p.next(t)
	}
	// Steady state: a whole cycle of Decode+Handle allocates nothing.
	cycle := (p.nrecords - p.from) / 4
	if a := testing.AllocsPerRun(20, func() {
		for range cycle {
			p.next(t)
		}
	}); a != 0 {
		t.Errorf("one cycle of %d events allocates %v times", cycle, a)
	}
	e.Flush()
	st := e.Stats()
	if sink.n != sink.completed || uint64(sink.n) != st.Transfers || st.TimedOut+st.PendingEvicted != 0 {
		t.Errorf("sink %+v stats %+v", sink, st)
	}
	if sink.pinned == 0 || sink.pageable == 0 || sink.pinned+sink.pageable != sink.n {
		t.Errorf("memory kinds %+v", sink)
	}
	if st.Merged != 0 { // one event per call: nothing to fold
		t.Errorf("merged %d of %d events", st.Merged, st.Events)
	}
}

// BenchmarkPipeline decodes and correlates a recorded HiCache-like event
// stream, one ring buffer record per iteration.
func BenchmarkPipeline(b *testing.B) {
	e := NewEngine(Config{Sink: &countSink{}})
	p := newReplay(b, e, 16)
	for range p.nrecords - p.from { // warm: slab, maps and queues at size
		p.next(b)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		p.next(b)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}
