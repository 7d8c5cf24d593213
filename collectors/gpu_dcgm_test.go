package collectors

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// fakeDCGM is a dcgmSource fed by the test: rate samples pushed between
// Sample calls, latest values per GPU.
type fakeDCGM struct {
	gpus      []uint
	pending   []dcgmValue
	latest    map[uint]map[uint16]dcgmValue
	latestErr map[uint]error
	sinceArgs []int64
	// ignoreSince hands every pending sample whatever the cursor: a host
	// engine whose clock went back.
	ignoreSince bool
	closed      bool
}

func newFakeDCGM() *fakeDCGM {
	return &fakeDCGM{latest: map[uint]map[uint16]dcgmValue{}, latestErr: map[uint]error{}}
}

func (f *fakeDCGM) GPUs() ([]uint, error) { return slices.Clone(f.gpus), nil }

func (f *fakeDCGM) Latest(gpu uint, fields []uint16) ([]dcgmValue, error) {
	if err := f.latestErr[gpu]; err != nil {
		return nil, err
	}
	out := make([]dcgmValue, len(fields))
	for i, fl := range fields {
		v, ok := f.latest[gpu][fl]
		if !ok {
			// Never watched / not found: DCGM's int64 NOT_FOUND marker.
			v = dcgmValue{Type: 'i', Int: dcgmInt64Blank + 1}
		}
		v.GPU, v.Field = gpu, fl
		out[i] = v
	}
	return out, nil
}

func (f *fakeDCGM) Since(since int64) ([]dcgmValue, int64, error) {
	f.sinceArgs = append(f.sinceArgs, since)
	var out []dcgmValue
	next := since
	for _, v := range f.pending {
		if v.Ts > since || f.ignoreSince {
			out = append(out, v)
			next = max(next, v.Ts+1)
		}
	}
	f.pending = nil
	return out, next, nil
}

func (f *fakeDCGM) Close() error { f.closed = true; return nil }

// rate pushes one profiling sample (bytes/s) at ts seconds.
func (f *fakeDCGM) rate(ts float64, gpu uint, field uint16, bps int64) {
	f.pending = append(f.pending, dcgmValue{GPU: gpu, Field: field, Ts: int64(ts * 1e6), Type: 'i', Int: bps})
}

func (f *fakeDCGM) set(gpu uint, field uint16, v dcgmValue) {
	if f.latest[gpu] == nil {
		f.latest[gpu] = map[uint16]dcgmValue{}
	}
	f.latest[gpu][field] = v
}

// identity gives a GPU the latest fields a DGX-2 V100 would have.
func (f *fakeDCGM) identity(gpu uint, uuid string) {
	f.set(gpu, dcgmFieldName, dcgmValue{Type: 's', Str: "Tesla V100-SXM3-32GB"})
	f.set(gpu, dcgmFieldNVMLIndex, dcgmValue{Type: 'i', Int: int64(gpu)})
	f.set(gpu, dcgmFieldUUID, dcgmValue{Type: 's', Str: uuid})
	f.set(gpu, dcgmFieldPCIBusID, dcgmValue{Type: 's', Str: fmt.Sprintf("00000000:%02X:00.0", 0x34+gpu)})
	f.set(gpu, dcgmFieldPCIeReplay, dcgmValue{Type: 'i', Int: 0})
	f.set(gpu, dcgmFieldLinkGen, dcgmValue{Type: 'i', Int: 3})
	f.set(gpu, dcgmFieldMaxLinkGen, dcgmValue{Type: 'i', Int: 3})
	f.set(gpu, dcgmFieldLinkWidth, dcgmValue{Type: 'i', Int: 16})
	f.set(gpu, dcgmFieldMaxLinkWidth, dcgmValue{Type: 'i', Int: 16})
}

func readDmon(t *testing.T, file string) map[uint]dmonRow {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "dcgm", file))
	if err != nil {
		t.Fatal(err)
	}
	rows, err := parseDmonText(strings.NewReader(string(b)), file)
	if err != nil {
		t.Fatal(err)
	}
	out := map[uint]dmonRow{}
	for _, r := range rows {
		if r.Entity != "GPU" {
			t.Fatalf("%s:%d: entity %q", file, r.Line, r.Entity)
		}
		out[r.ID] = r
	}
	return out
}

const (
	dmonRandRead = "nvidia_gds_config_guide_dgx2_dcgmi_dmon_1009_1010_gpu10_randread.txt"
	dmonSeqRead  = "nvidia_gds_config_guide_dgx2_dcgmi_dmon_1009_1010_gpu12_seqread.txt"
)

func dgx2UUID(gpu uint) string { return fmt.Sprintf("GPU-d9x2-0000-0000-0000-%012d", gpu) }

func ratesByUUID(rs []GPURate) map[string]GPURate {
	m := map[string]GPURate{}
	for _, r := range rs {
		m[r.UUID] = r
	}
	return m
}

// TestDCGMDmonSeries plays the two published DGX-2 `dcgmi dmon -e
// 1009,1010 -d 1000` captures as a series: four 1 s DCGM samples of the
// random-read workload (GPUs 0, 1, 9, 10 published), then four of the
// sequential-read one (GPUs 0, 1, 11–15). GPUs 9 and 10 disappear between
// the two, 11–15 appear.
func TestDCGMDmonSeries(t *testing.T) {
	rand, seq := readDmon(t, dmonRandRead), readDmon(t, dmonSeqRead)
	if len(rand) != 4 || len(seq) != 7 {
		t.Fatalf("rows: %d randread, %d seqread", len(rand), len(seq))
	}
	src := newFakeDCGM()
	c := newDCGMCollector(src, DCGMOptions{})
	var snaps []GPUSnapshot
	ts := 1000.0
	play := func(rows map[uint]dmonRow) {
		src.gpus = nil
		for id := range rows {
			src.gpus = append(src.gpus, id)
			src.identity(id, dgx2UUID(id))
		}
		slices.Sort(src.gpus)
		for range 4 {
			ts++
			for id, r := range rows {
				src.rate(ts, id, dcgmFieldPCIeTxBytes, r.Values["PCITX"])
				src.rate(ts, id, dcgmFieldPCIeRxBytes, r.Values["PCIRX"])
			}
			s, err := c.Sample()
			if err != nil {
				t.Fatal(err)
			}
			snaps = append(snaps, s)
		}
	}
	play(rand)
	play(seq)

	first := snaps[0]
	if first.Source != "dcgm" || !first.Time.Equal(time.UnixMicro(1001e6)) || len(first.GPUs) != 4 {
		t.Fatalf("first snapshot: %+v", first)
	}
	g10 := first.GPUs[3]
	want := GPUReading{
		Index: 10, UUID: dgx2UUID(10), BusID: "0000:3e:00.0", Name: "Tesla V100-SXM3-32GB",
		HasPCIeBytes: true, // totals start at 0 with the first sample
		PCIeTxBps:    22110153, PCIeRxBps: 124205217, HasPCIeRate: true,
		HasReplay: true,
		LinkGen:   3, MaxLinkGen: 3, LinkWidth: 16, MaxLinkWidth: 16,
	}
	if g10 != want {
		t.Errorf("GPU 10 first reading\n got %+v\nwant %+v", g10, want)
	}

	// Within a phase every interval's rate is the published one, RX being
	// host→device (GDS reads land in GPU memory: RX ≫ TX on GPUs 10, 12).
	check := func(i int, rows map[uint]dmonRow) {
		t.Helper()
		rs, gone := GPURates(snaps[i-1], snaps[i])
		if len(gone) != 0 || len(rs) != len(rows) {
			t.Fatalf("snapshot %d: %d rates, gone %v", i, len(rs), gone)
		}
		byUUID := ratesByUUID(rs)
		for id, r := range rows {
			got := byUUID[dgx2UUID(id)]
			if got.TxBps != float64(r.Values["PCITX"]) || got.RxBps != float64(r.Values["PCIRX"]) || got.Resets != nil {
				t.Errorf("snapshot %d GPU %d: tx %v rx %v resets %v, dmon says %d %d",
					i, id, got.TxBps, got.RxBps, got.Resets, r.Values["PCITX"], r.Values["PCIRX"])
			}
		}
	}
	for i := 1; i < 4; i++ {
		check(i, rand)
	}
	for i := 5; i < 8; i++ {
		check(i, seq)
	}
	if r := ratesByUUID(must2(GPURates(snaps[6], snaps[7])))[dgx2UUID(12)]; r.RxBps != 4721644934 {
		t.Errorf("GPU 12 seqread RX %v B/s, want 4721644934", r.RxBps)
	}

	// The change of phase: 9 and 10 are gone, 11–15 new (no rate), 0 and 1
	// carry the new workload's rate over (4 s, 5 s].
	rs, gone := GPURates(snaps[3], snaps[4])
	if !slices.Equal(gone, []string{dgx2UUID(9), dgx2UUID(10)}) {
		t.Errorf("gone %v, want GPUs 9 and 10", gone)
	}
	if len(rs) != 2 {
		t.Fatalf("rates across the change: %+v", rs)
	}
	if r := ratesByUUID(rs)[dgx2UUID(0)]; r.TxBps != 4712070210 || r.RxBps != 5237742827 {
		t.Errorf("GPU 0 across the change: %+v", r)
	}
	// GPU 0's total is the integral of both phases: 4 s of randread (the
	// first sample only starts the total) and 4 s of seqread.
	last := snaps[7].GPUs[0]
	wantTx := uint64(3*108216883 + 4*4712070210)
	if last.PCIeTxBytes != wantTx || last.PCIeRxBytes != uint64(3*122481373+4*5237742827) {
		t.Errorf("GPU 0 totals %d/%d, want %d/%d", last.PCIeTxBytes, last.PCIeRxBytes, wantTx, uint64(3*122481373+4*5237742827))
	}
	// The cursor moves on: each Since call starts after the previous one.
	if !slices.IsSorted(src.sinceArgs) || src.sinceArgs[0] != 0 || src.sinceArgs[1] != 1001e6+1 {
		t.Errorf("Since cursors %v", src.sinceArgs)
	}
}

func must2[A, B any](a A, _ B) A { return a }

// TestDCGMIrregularSampling: DCGM samples every second at a varying rate;
// the agent samples DCGM after 0, 1, 2 or 3 of them. The integrated totals
// are exact and the rate of each interval is its bytes over DCGM's time.
func TestDCGMIrregularSampling(t *testing.T) {
	src := newFakeDCGM()
	src.gpus = []uint{0}
	src.identity(0, "GPU-a")
	c := newDCGMCollector(src, DCGMOptions{})
	rx := []int64{1e9, 3e9, 0, 12e9, 12e9, 5e8, 7e9}
	var ts float64 = 100
	var sum uint64
	var snaps []GPUSnapshot
	batches := [][]int64{rx[:1], rx[1:3], nil, rx[3:6], rx[6:]}
	for bi, b := range batches {
		for _, v := range b {
			ts++
			if ts > 101 {
				sum += uint64(v)
			}
			src.rate(ts, 0, dcgmFieldPCIeTxBytes, 0)
			src.rate(ts, 0, dcgmFieldPCIeRxBytes, v)
		}
		s, err := c.Sample()
		if err != nil {
			t.Fatal(err)
		}
		if got := s.GPUs[0].PCIeRxBytes; got != sum {
			t.Errorf("batch %d: total %d, want %d", bi, got, sum)
		}
		snaps = append(snaps, s)
	}
	// batch 1 → 2: 2 s, 3e9 + 0 bytes/s.
	r := must2(GPURates(snaps[0], snaps[1]))
	if len(r) != 1 || r[0].RxBps != 1.5e9 {
		t.Errorf("rate over two DCGM samples: %+v", r)
	}
	// No new DCGM sample: same Time, no rate (not 0).
	if !snaps[2].Time.Equal(snaps[1].Time) {
		t.Errorf("a Sample without new DCGM samples moved Time: %v → %v", snaps[1].Time, snaps[2].Time)
	}
	if r := must2(GPURates(snaps[1], snaps[2])); r != nil {
		t.Errorf("rates over an empty interval: %+v", r)
	}
	r = must2(GPURates(snaps[2], snaps[3]))
	if want := (12e9 + 12e9 + 5e8) / 3; math.Abs(r[0].RxBps-want) > 1e-6 {
		t.Errorf("rate over three samples %v, want %v", r[0].RxBps, want)
	}
}

// TestDCGMMissingFields: a PCIe-only GPU whose NVLink fields are not
// supported, a blank PCIe sample (profiling paused by another profiler),
// blank device fields.
func TestDCGMMissingFields(t *testing.T) {
	src := newFakeDCGM()
	src.gpus = []uint{0}
	src.identity(0, "GPU-l4")
	src.set(0, dcgmFieldPCIeReplay, dcgmValue{Type: 'i', Int: dcgmInt64Blank + 2}) // NOT_SUPPORTED
	src.set(0, dcgmFieldLinkGen, dcgmValue{Type: 'i', Int: dcgmInt32Blank})        // 32-bit BLANK
	src.set(0, dcgmFieldName, dcgmValue{Type: 's', Str: "<<<NOT_SUPPORTED>>>"})
	src.set(0, dcgmFieldMaxLinkWidth, dcgmValue{Status: -5, Type: 'i', Int: 16}) // an error status
	c := newDCGMCollector(src, DCGMOptions{})
	nvBlank := dcgmValue{Type: 'i', Int: dcgmInt64Blank + 2}
	push := func(ts float64, tx, rx int64, blank bool) {
		if blank {
			src.pending = append(src.pending,
				dcgmValue{GPU: 0, Field: dcgmFieldPCIeTxBytes, Ts: int64(ts * 1e6), Type: 'i', Int: dcgmInt64Blank},
				dcgmValue{GPU: 0, Field: dcgmFieldPCIeRxBytes, Ts: int64(ts * 1e6), Type: 'd', Float: dcgmFloat64Blank})
		} else {
			src.rate(ts, 0, dcgmFieldPCIeTxBytes, tx)
			src.rate(ts, 0, dcgmFieldPCIeRxBytes, rx)
		}
		for _, f := range []uint16{dcgmFieldNVLinkTxBytes, dcgmFieldNVLinkRxBytes} {
			v := nvBlank
			v.GPU, v.Field, v.Ts = 0, f, int64(ts*1e6)
			src.pending = append(src.pending, v)
		}
	}
	sample := func() GPUSnapshot {
		t.Helper()
		s, err := c.Sample()
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	push(1, 100, 200, false)
	s1 := sample()
	push(2, 100, 200, false)
	s2 := sample()
	push(3, 0, 0, true) // paused: (2 s, 3 s] unmeasured
	s3 := sample()
	push(4, 100, 200, false)
	s4 := sample()
	push(5, 100, 200, false)
	s5 := sample()

	g := s1.GPUs[0]
	if g.HasNVLink || g.HasReplay || g.LinkGen != 0 || g.Name != "" || g.MaxLinkWidth != 0 || g.LinkWidth != 16 {
		t.Errorf("blank fields read as values: %+v", g)
	}
	if r := must2(GPURates(s1, s2)); r[0].RxBps != 200 || r[0].NVLinkRxBps != 0 || r[0].Resets != nil {
		t.Errorf("s1→s2: %+v", r)
	}
	if g := s3.GPUs[0]; g.HasPCIeBytes || g.HasPCIeRate {
		t.Errorf("the reading over a blank sample claims a value: %+v", g)
	}
	if r := must2(GPURates(s2, s3)); len(r) != 1 || r[0].RxBps != 0 || r[0].TxBps != 0 {
		t.Errorf("the interval with the gap has a rate: %+v", r)
	}
	// s3 has no total: GPURates falls back on s4's latest DCGM rate, which
	// is the average over (3 s, 4 s], all of s3→s4.
	if r := must2(GPURates(s3, s4)); len(r) != 1 || r[0].RxBps != 200 || r[0].TxBps != 100 {
		t.Errorf("the interval after the gap: %+v", r)
	}
	if g := s4.GPUs[0]; !g.HasPCIeBytes || g.PCIeRxBytes != 400 {
		t.Errorf("after the gap: %+v (the unmeasured second must not be counted)", g)
	}
	if r := must2(GPURates(s4, s5)); r[0].RxBps != 200 || r[0].TxBps != 100 {
		t.Errorf("s4→s5: %+v", r)
	}
}

// TestDCGMResets: the replay counter going back (driver reload), DCGM's
// clock going back (host engine restart), a total wrapping at 2^64, another
// GPU behind the same DCGM id.
func TestDCGMResets(t *testing.T) {
	src := newFakeDCGM()
	src.gpus = []uint{0}
	src.identity(0, "GPU-a")
	c := newDCGMCollector(src, DCGMOptions{})
	sample := func() GPUSnapshot {
		t.Helper()
		s, err := c.Sample()
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	push := func(ts float64, bps int64) {
		for _, f := range dcgmRateFields {
			src.rate(ts, 0, f, bps)
		}
	}
	src.set(0, dcgmFieldPCIeReplay, dcgmValue{Type: 'i', Int: 7})
	push(10, 1000)
	s1 := sample()
	push(11, 1000)
	src.set(0, dcgmFieldPCIeReplay, dcgmValue{Type: 'i', Int: 9})
	s2 := sample()
	if r := must2(GPURates(s1, s2)); r[0].ReplayPerSec != 2 || r[0].NVLinkTxBps != 1000 || r[0].Resets != nil {
		t.Errorf("s1→s2: %+v", r)
	}
	// Driver reload: the replay counter restarts.
	push(12, 1000)
	src.set(0, dcgmFieldPCIeReplay, dcgmValue{Type: 'i', Int: 0})
	s3 := sample()
	if r := must2(GPURates(s2, s3)); !slices.Equal(r[0].Resets, []string{"replay"}) || r[0].TxBps != 1000 {
		t.Errorf("replay reset: %+v", r)
	}
	// Host engine restarted with its clock behind: totals start over.
	src.ignoreSince = true
	push(5, 1000)
	s4 := sample()
	if g := s4.GPUs[0]; g.PCIeTxBytes != 0 || !g.HasPCIeBytes {
		t.Errorf("after DCGM's clock went back: %+v", g)
	}
	r, _ := GPURates(s3, s4)
	if len(r) != 0 {
		// s4's Time (12 s, the newest seen) is not after s3's: no rates.
		t.Errorf("rates over a clock going back: %+v", r)
	}
	push(6, 1000)
	s5 := sample()
	if g := s5.GPUs[0]; g.PCIeTxBytes != 1000 {
		t.Errorf("after the restart: %+v", g)
	}

	// A total wraps at 2^64 like any uint64 counter: GPURates calls it a
	// reset, it is not unwrapped.
	var g dcgmIntegrator
	g.add(dcgmValue{Ts: 1e6, Type: 'i', Int: 5})
	g.total = math.MaxUint64 - 10
	g.add(dcgmValue{Ts: 2e6, Type: 'i', Int: 100})
	if tot, ok := g.take(); !ok || tot != 89 {
		t.Errorf("wrapped total %d %v, want 89", tot, ok)
	}
	a := GPUSnapshot{Time: time.Unix(1, 0), GPUs: []GPUReading{{UUID: "x", HasPCIeBytes: true, PCIeRxBytes: math.MaxUint64 - 10}}}
	b := GPUSnapshot{Time: time.Unix(2, 0), GPUs: []GPUReading{{UUID: "x", HasPCIeBytes: true, PCIeRxBytes: 89}}}
	if r := must2(GPURates(a, b)); !slices.Equal(r[0].Resets, []string{"pcie_rx_bytes"}) {
		t.Errorf("wrap: %+v", r)
	}

	// Another GPU behind DCGM id 0 (hot swap, ids renumbered): totals start
	// over; GPURates pairs by UUID so the old one is gone.
	src.identity(0, "GPU-b")
	src.ignoreSince = false
	push(20, 1000)
	s6 := sample()
	if g := s6.GPUs[0]; g.UUID != "GPU-b" || g.PCIeTxBytes != 0 {
		t.Errorf("new GPU behind id 0: %+v", g)
	}
	push(21, 1000)
	s7 := sample()
	if g := s7.GPUs[0]; g.PCIeTxBytes != 1000 {
		t.Errorf("new GPU's total: %+v", g)
	}
	if r, gone := GPURates(s5, s6); len(r) != 0 || !slices.Equal(gone, []string{"GPU-a"}) {
		t.Errorf("swap: rates %+v gone %v", r, gone)
	}
}

// TestDCGMGPUDisappears: DCGM stops listing a GPU, or cannot read it.
func TestDCGMGPUDisappears(t *testing.T) {
	src := newFakeDCGM()
	src.gpus = []uint{0, 1, 2}
	for _, id := range src.gpus {
		src.identity(id, dgx2UUID(id))
	}
	c := newDCGMCollector(src, DCGMOptions{})
	push := func(ts float64) {
		for _, id := range []uint{0, 1, 2} {
			src.rate(ts, id, dcgmFieldPCIeTxBytes, 10)
			src.rate(ts, id, dcgmFieldPCIeRxBytes, 20)
		}
	}
	push(1)
	s1, _ := c.Sample()
	push(2)
	src.gpus = []uint{0, 2}                      // GPU 1 fell off the bus
	src.latestErr[2] = errors.New("GPU is lost") // GPU 2 listed but unreadable
	s2, err := c.Sample()
	if err != nil {
		t.Fatal(err)
	}
	if len(s2.GPUs) != 1 || s2.GPUs[0].UUID != dgx2UUID(0) {
		t.Fatalf("snapshot: %+v", s2.GPUs)
	}
	rs, gone := GPURates(s1, s2)
	if len(rs) != 1 || rs[0].RxBps != 20 || !slices.Equal(gone, []string{dgx2UUID(1), dgx2UUID(2)}) {
		t.Errorf("rates %+v gone %v", rs, gone)
	}
	// Back again: its totals restart at 0 and it has no rate on its first
	// reading (it appeared).
	delete(src.latestErr, 2)
	src.gpus = []uint{0, 1, 2}
	push(3)
	s3, _ := c.Sample()
	if g := s3.GPUs[1]; g.UUID != dgx2UUID(1) || g.PCIeRxBytes != 0 || !g.HasPCIeBytes {
		t.Errorf("GPU 1 back: %+v", g)
	}
	// Every GPU unreadable: an error, not an empty snapshot.
	for _, id := range src.gpus {
		src.latestErr[id] = errors.New("connection to host engine lost")
	}
	if _, err := c.Sample(); err == nil || !strings.Contains(err.Error(), "host engine lost") {
		t.Errorf("all GPUs unreadable: err %v", err)
	}
	if err := c.Close(); err != nil || !src.closed {
		t.Errorf("Close: %v", err)
	}
}

// TestDCGMKeepAge: a Sample later than KeepAge after the previous one may
// have lost DCGM's oldest samples; the interval is reported unmeasured.
func TestDCGMKeepAge(t *testing.T) {
	src := newFakeDCGM()
	src.gpus = []uint{0}
	src.identity(0, "GPU-a")
	c := newDCGMCollector(src, DCGMOptions{KeepAge: 10 * time.Second})
	now := time.Unix(1000, 0)
	c.now = func() time.Time { return now }
	for _, ts := range []float64{1, 2} {
		src.rate(ts, 0, dcgmFieldPCIeTxBytes, 10)
		src.rate(ts, 0, dcgmFieldPCIeRxBytes, 10)
		now = now.Add(time.Second)
		if _, err := c.Sample(); err != nil {
			t.Fatal(err)
		}
	}
	// 30 s later: DCGM kept only the last 10 s of samples.
	for ts := 22.0; ts <= 32; ts++ {
		src.rate(ts, 0, dcgmFieldPCIeTxBytes, 10)
		src.rate(ts, 0, dcgmFieldPCIeRxBytes, 10)
	}
	now = now.Add(30 * time.Second)
	s, err := c.Sample()
	if err != nil {
		t.Fatal(err)
	}
	if g := s.GPUs[0]; g.HasPCIeBytes || !g.HasPCIeRate {
		t.Errorf("after lost samples: %+v (want no total claimed, the latest rate kept)", g)
	}
	if !c.gpus[0].pcieRx.started || c.gpus[0].pcieRx.total != 10+100 {
		t.Errorf("integrated %+v, want 10 + 10 s × 10 (22 s → 32 s), the lost 20 s not guessed", c.gpus[0].pcieRx)
	}
	src.rate(33, 0, dcgmFieldPCIeTxBytes, 10)
	src.rate(33, 0, dcgmFieldPCIeRxBytes, 10)
	now = now.Add(time.Second)
	s2, err := c.Sample()
	if err != nil {
		t.Fatal(err)
	}
	if g := s2.GPUs[0]; !g.HasPCIeBytes || g.PCIeRxBytes != 120 {
		t.Errorf("next sample: %+v", g)
	}
	if r := must2(GPURates(s, s2)); r[0].RxBps != 10 {
		t.Errorf("rate after the loss: %+v", r)
	}
}

// TestDCGMExporterSample reads the published dcgm-exporter output of an
// A100 (whole-GPU series; MIG series skipped) as DCGM values: field names
// are DCGM's, and the exporter's PROF_PCIE values are bytes/s.
func TestDCGMExporterSample(t *testing.T) {
	const file = "nvidia_cloud-native-docs_dcgm-exporter_A100_MIG_metrics.prom.txt"
	b, err := os.ReadFile(filepath.Join("testdata", "dcgm", file))
	if err != nil {
		t.Fatal(err)
	}
	// The MIG block repeats names after a blank line; parse the whole-GPU
	// block.
	whole, _, _ := strings.Cut(string(b), "\n\n")
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(whole + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	byField := map[string]uint16{
		"DCGM_FI_PROF_PCIE_TX_BYTES": dcgmFieldPCIeTxBytes, "DCGM_FI_PROF_PCIE_RX_BYTES": dcgmFieldPCIeRxBytes,
		"DCGM_FI_DEV_PCIE_REPLAY_COUNTER": dcgmFieldPCIeReplay,
	}
	src := newFakeDCGM()
	src.gpus = []uint{0}
	var uuid string
	for name, fam := range fams {
		m := fam.GetMetric()[0]
		for _, l := range m.GetLabel() {
			if l.GetName() == "UUID" {
				uuid = l.GetValue()
			}
		}
		f, ok := byField[name]
		if !ok {
			continue
		}
		v := int64(m.GetUntyped().GetValue())
		if f == dcgmFieldPCIeReplay {
			src.set(0, f, dcgmValue{Type: 'i', Int: v})
			continue
		}
		src.rate(1, 0, f, v)
	}
	src.set(0, dcgmFieldUUID, dcgmValue{Type: 's', Str: uuid})
	src.set(0, dcgmFieldNVMLIndex, dcgmValue{Type: 'i', Int: 0})
	c := newDCGMCollector(src, DCGMOptions{})
	s, err := c.Sample()
	if err != nil {
		t.Fatal(err)
	}
	g := s.GPUs[0]
	if g.UUID != "GPU-34319582-d595-d1c7-d1d2-179bcfa61660" || !g.HasReplay || g.Replay != 0 ||
		!g.HasPCIeRate || g.PCIeTxBps != 33011804 || g.PCIeRxBps != 97863601 || g.HasNVLink {
		t.Errorf("A100 reading: %+v", g)
	}
}

func TestDCGMBlank(t *testing.T) {
	for _, tc := range []struct {
		v     dcgmValue
		blank bool
	}{
		{dcgmValue{Type: 'i', Int: 0}, false},
		{dcgmValue{Type: 'i', Int: 4721644934}, false},
		{dcgmValue{Type: 'i', Int: dcgmInt64Blank}, true},
		{dcgmValue{Type: 'i', Int: dcgmInt64Blank + 3}, true}, // NOT_PERMISSIONED
		{dcgmValue{Type: 'i', Int: dcgmInt32Blank + 1}, true}, // int32 NOT_FOUND
		{dcgmValue{Type: 'i', Int: dcgmInt32Blank + 4}, false},
		{dcgmValue{Type: 'i', Int: -1}, true},
		{dcgmValue{Type: 'd', Float: 1.5}, false},
		{dcgmValue{Type: 'd', Float: dcgmFloat64Blank + 2}, true},
		{dcgmValue{Type: 'd', Float: math.NaN()}, true},
		{dcgmValue{Type: 's', Str: "GPU-x"}, false},
		{dcgmValue{Type: 's', Str: "<<<NULL>>>"}, true},
		{dcgmValue{Type: 's', Str: ""}, true},
		{dcgmValue{Type: 'b'}, true},
		{dcgmValue{Status: 2, Type: 'i', Int: 5}, true},
	} {
		if got := tc.v.blank(); got != tc.blank {
			t.Errorf("%+v: blank %v, want %v", tc.v, got, tc.blank)
		}
	}
}

func TestNormalizeBusID(t *testing.T) {
	for in, want := range map[string]string{
		"00000000:3B:00.0": "0000:3b:00.0",
		"0000:3b:00.0":     "0000:3b:00.0",
		"00000001:C1:00.0": "0001:c1:00.0",
		"garbage":          "garbage",
		"":                 "",
	} {
		if got := PCIAddress(in); got != want {
			t.Errorf("PCIAddress(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestOpenDCGMUnavailable calls the real OpenDCGM. On a host without
// libdcgm.so (or a build without cgo) it must return ErrNoGPUCounters
// quickly; on a host with DCGM it must open and sample.
func TestOpenDCGMUnavailable(t *testing.T) {
	for i := range 2 { // twice: a failed open must not leave the collector "busy"
		start := time.Now()
		c, err := OpenDCGM(DCGMOptions{Timeout: 20 * time.Second})
		el := time.Since(start)
		if err == nil {
			defer c.Close()
			if os.Getenv("LANEWATCH_EXPECT_NO_DCGM") != "" {
				t.Fatal("OpenDCGM succeeded on a host said to have no DCGM")
			}
			s, err := c.Sample()
			t.Logf("DCGM present: %d GPUs, err %v", len(s.GPUs), err)
			return
		}
		if !errors.Is(err, ErrNoGPUCounters) {
			t.Fatalf("try %d: %v does not wrap ErrNoGPUCounters", i, err)
		}
		if strings.Count(err.Error(), "\n") != 0 || !strings.Contains(err.Error(), "DCGM") {
			t.Errorf("error is not one line naming DCGM: %q", err)
		}
		if el > 10*time.Second {
			t.Errorf("OpenDCGM took %v to fail", el)
		}
		t.Logf("try %d (%v): %v", i, el, err)
	}
}

// DCGM's NVLink profiling fields (1011/1012, bytes/s) integrated into
// totals and exported at scrape time as lanewatch_gpu_nvlink_bytes_total,
// next to a GPU whose NVLink fields DCGM leaves blank: that GPU has no
// NVLink series at all, never a 0. The rates are nvbandwidth's
// device_to_device_memcpy_write_ce on an 8-GPU NVLink system, GPU 0 ← GPU 1
// 276.07 GB/s (shared/samples/bandwidth/nvidia_nvbandwidth_README_example_8gpu_H2D_26GBps.txt),
// written by GPU 1 (TX) into GPU 0 (RX), for two seconds.
func TestDCGMNVLinkExported(t *testing.T) {
	src := newFakeDCGM()
	src.gpus = []uint{0, 1, 2}
	src.identity(0, "GPU-0")
	src.identity(1, "GPU-1")
	src.identity(2, "GPU-pcie-only")
	const bps = 276070000000
	push := func(ts float64) {
		for gpu := uint(0); gpu < 3; gpu++ {
			src.rate(ts, gpu, dcgmFieldPCIeTxBytes, 1000)
			src.rate(ts, gpu, dcgmFieldPCIeRxBytes, 2000)
		}
		src.rate(ts, 0, dcgmFieldNVLinkRxBytes, bps)
		src.rate(ts, 0, dcgmFieldNVLinkTxBytes, 0)
		src.rate(ts, 1, dcgmFieldNVLinkTxBytes, bps)
		src.rate(ts, 1, dcgmFieldNVLinkRxBytes, 0)
	}
	c := newDCGMCollector(src, DCGMOptions{})
	push(10)
	if _, err := c.Sample(); err != nil { // the totals count from here
		t.Fatal(err)
	}
	push(11)
	push(12)
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectorFunc(NewGPUMetrics(c).Update))
	if err := testutil.GatherAndCompare(reg, strings.NewReader(fmt.Sprintf(`
# HELP lanewatch_gpu_nvlink_bytes_total Bytes over all of the GPU's NVLinks per direction, as the GPU counts them.
# TYPE lanewatch_gpu_nvlink_bytes_total counter
lanewatch_gpu_nvlink_bytes_total{direction="inbound",gpu="0000:34:00.0"} %d
lanewatch_gpu_nvlink_bytes_total{direction="outbound",gpu="0000:34:00.0"} 0
lanewatch_gpu_nvlink_bytes_total{direction="inbound",gpu="0000:35:00.0"} 0
lanewatch_gpu_nvlink_bytes_total{direction="outbound",gpu="0000:35:00.0"} %[1]d
`, 2*bps)), "lanewatch_gpu_nvlink_bytes_total"); err != nil {
		t.Error(err) // GPU 2 (0000:36:00.0) has no NVLink fields: no series
	}
	if n, _ := testutil.GatherAndCount(reg, "lanewatch_gpu_pcie_bytes_total"); n != 6 {
		t.Errorf("%d PCIe series, want the three GPUs' two directions", n)
	}
}
