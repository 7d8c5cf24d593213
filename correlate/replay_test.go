package correlate_test

import (
	"os"
	"testing"

	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/probes"
	"github.com/lanewatch/lanewatch/selftest"
)

// testdata/hicache-load.events is a real recording (`agent run --record`) of
// the reference data path's hicache-load scenario, with the scenario's own
// ground truth beside it: 32 layers of 1 MiB H2D from a registered pool.
func recording(tb testing.TB) [][]byte {
	tb.Helper()
	b, err := os.ReadFile("testdata/hicache-load.events")
	if err != nil {
		tb.Fatal(err)
	}
	if len(b)%probes.EventSize != 0 {
		tb.Fatalf("recording is %d bytes, not a multiple of %d", len(b), probes.EventSize)
	}
	var recs [][]byte
	for off := 0; off < len(b); off += probes.EventSize {
		recs = append(recs, b[off:off+probes.EventSize])
	}
	return recs
}

// recordedCopies reads the recording's ground truth: every call, and the copies.
func recordedCopies(t *testing.T) (truth, copies []selftest.TruthCall) {
	t.Helper()
	f, err := os.Open("testdata/hicache-load.truth.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	truth, err = selftest.ReadTruth(f, f.Name())
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range truth {
		if c.IsCopy() {
			copies = append(copies, c)
		}
	}
	return truth, copies
}

func TestReplayRecordedHicacheLoad(t *testing.T) {
	truth, want := recordedCopies(t)
	pid := truth[0].PID

	var got []correlate.Transfer
	e := correlate.NewEngine(correlate.Config{ExecObserved: true, Sink: correlate.SinkFunc(func(tr *correlate.Transfer) {
		if tr.PID == pid {
			got = append(got, *tr)
		}
	})})
	var c event.Call
	for i, raw := range recording(t) {
		if err := probes.Decode(raw, &c); err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
		e.Handle(&c)
	}
	e.Flush()
	if len(got) != len(want) {
		t.Fatalf("%d transfers, truth has %d copies", len(got), len(want))
	}
	for i, g := range got {
		w := want[i]
		if g.API != w.API || g.DriverAPI != "cuMemcpyHtoDAsync_v2" || g.Bytes != w.Bytes || g.Direction != w.Direction ||
			g.Src.Addr != w.Src || g.Dst.Addr != w.Dst || string(g.HostMem) != w.ExpectHostMem || g.Stream != w.Stream {
			t.Errorf("transfer %d: got %+v, want %+v", i, g, w)
		}
		if g.CompleteNs <= g.SubmitNs {
			t.Errorf("transfer %d: completion %d not after submission %d (the stream syncs prove it)", i, g.CompleteNs, g.SubmitNs)
		}
	}
}

// BenchmarkPipelineRecorded replays the real recording: decode + classify
// per event, on one core.
func BenchmarkPipelineRecorded(b *testing.B) {
	recs := recording(b)
	e := correlate.NewEngine(correlate.Config{ExecObserved: true, Sink: correlate.SinkFunc(func(*correlate.Transfer) {})})
	var c event.Call
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		raw := recs[i%len(recs)]
		if err := probes.Decode(raw, &c); err != nil {
			b.Fatal(err)
		}
		e.Handle(&c)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}
