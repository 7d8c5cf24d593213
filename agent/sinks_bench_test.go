package agent

import (
	"cmp"
	"compress/gzip"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/probes"
)

// evalEvery is how many events the benchmark's evaluator judges a window
// after: about a second of one copying thread's under the probes.
const evalEvery = 400_000

// BenchmarkAgentHandle replays a recorded stream of one copying thread
// through a real agent's handle and the DaemonSet's sinks (the page stage,
// metrics, the evaluator judging a window per second's worth of events),
// one event per iteration: the agent's CPU per event, the collector's
// included, without the ring. The recording (testdata/callbench.events.gz,
// 4,114 events) is `agent run --record` beside `kvpath --scenario
// callbench --iterations 4096` on the reference path, the kvpath process's
// events only; it is cycled from its second stream sync to its last with
// the clock shifted. LANEWATCH_RECORDING names another recording.
func BenchmarkAgentHandle(b *testing.B) {
	raw, err := readRecording(cmp.Or(os.Getenv("LANEWATCH_RECORDING"), "testdata/callbench.events.gz"))
	if err != nil {
		b.Fatal(err)
	}
	n := len(raw) / probes.EventSize
	recs := make([][]byte, n)
	for i := range recs {
		recs[i] = raw[i*probes.EventSize : (i+1)*probes.EventSize]
	}
	// The cycle: from the first stream sync after the warm-up to the last.
	var c event.Call
	var syncs []int
	for i, r := range recs {
		if probes.Decode(r, &c) == nil && c.Kind == event.KindCall && c.Op == event.OpStreamSync {
			syncs = append(syncs, i)
		}
	}
	if len(syncs) < 3 {
		b.Fatalf("%d stream syncs in the recording", len(syncs))
	}
	from, to := syncs[1]+1, syncs[len(syncs)-1]+1
	span := binary.LittleEndian.Uint64(recs[to-1][16:]) - binary.LittleEndian.Uint64(recs[from][16:]) + 1000

	mx, err := listenMetrics(RunConfig{Metrics: MetricsConfig{Listen: "127.0.0.1:0", Path: "/metrics", EvaluateInterval: time.Second}}, nil, nil, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	if err != nil {
		b.Fatal(err)
	}
	defer mx.close()
	a, err := New(Config{Sink: mx.tee(nil), Activity: mx.eval, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	defer a.probes.Close()
	a.pages.cfg.lookup = func(pid int, addrs []uintptr) ([]int, error) { return make([]int, len(addrs)), nil }
	a.pages.start()
	defer a.pages.close()
	for i := range from {
		if probes.Decode(recs[i], &c) == nil {
			a.handle(&c)
		}
	}
	buf := make([]byte, probes.EventSize)
	var shift uint64
	j := from
	next := func() {
		copy(buf, recs[j])
		le := binary.LittleEndian
		le.PutUint64(buf[16:], le.Uint64(buf[16:])+shift)
		if rt := le.Uint64(buf[24:]); rt != 0 {
			le.PutUint64(buf[24:], rt+shift)
		}
		if probes.Decode(buf, &c) == nil {
			a.handle(&c)
		}
		if j++; j == to {
			j, shift = from, shift+span
		}
	}
	for range 2 * (to - from) {
		next()
	}
	b.ReportAllocs()
	cpu0 := processCPU(b)
	b.ResetTimer()
	for i := range b.N {
		next()
		if i%evalEvery == evalEvery-1 { // the window a second holds at a copier's full rate
			mx.eval.Evaluate(time.Now())
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
	b.ReportMetric(float64(processCPU(b)-cpu0)/float64(b.N), "cpu-ns/event")
}

// readRecording reads raw events, gunzipped when the name ends in .gz.
func readRecording(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var r io.Reader = f
	if strings.HasSuffix(path, ".gz") {
		if r, err = gzip.NewReader(f); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
	}
	raw, err := io.ReadAll(r)
	if err == nil && len(raw)%probes.EventSize != 0 {
		err = fmt.Errorf("%d bytes, not a multiple of %d", len(raw), probes.EventSize)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return raw, nil
}

// processCPU is the CPU time the process used so far, every thread's (the
// collector's too), in ns.
func processCPU(b *testing.B) int64 {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
