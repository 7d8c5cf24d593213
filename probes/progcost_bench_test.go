package probes

import (
	"math"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/internal/testenv"
)

// BenchmarkCopyPrograms: the kernel's own run time (bpf_stats) of the
// entry and return programs per cudaMemcpyAsync of callbench through the
// reference driver, a reader draining the ring: what one copy costs in
// BPF, its count in its flow (flows.go) included, without the trap and
// scheduling noise of the whole-stack figure (best of the rounds).
func BenchmarkCopyPrograms(b *testing.B) {
	testenv.RequireRoot(b)
	stats, err := ebpf.EnableStats(unix.BPF_STATS_RUN_TIME)
	if err != nil {
		b.Fatalf("enable BPF run-time stats: %v", err)
	}
	defer stats.Close()
	p, ref := probedRefCopy(b, Options{}, "lib/libcuda.so.1", "cuMemcpyHtoDAsync_v2")
	quit, done := make(chan struct{}), make(chan error)
	go func() { done <- p.Read(quit, func(*event.Call) {}) }()
	defer func() { close(quit); <-done }()
	rounds, iterations := benchSize()
	perRun := func(prog *ebpf.Program, before *ebpf.ProgramStats) float64 {
		after, err := prog.Stats()
		if err != nil {
			b.Fatal(err)
		}
		if after.RunCount <= before.RunCount {
			b.Fatalf("%s never ran", prog)
		}
		return float64(after.Runtime-before.Runtime) / float64(after.RunCount-before.RunCount)
	}
	enter, ret := math.Inf(1), math.Inf(1)
	for range rounds {
		e0, err := p.objs.LwCallEnter.Stats()
		if err != nil {
			b.Fatal(err)
		}
		r0, err := p.objs.LwCallReturn.Stats()
		if err != nil {
			b.Fatal(err)
		}
		callbench(b, ref, "plain", iterations)
		enter, ret = min(enter, perRun(p.objs.LwCallEnter, e0)), min(ret, perRun(p.objs.LwCallReturn, r0))
	}
	b.ReportMetric(enter, "entry-ns/copy")
	b.ReportMetric(ret, "return-ns/copy")
	b.Logf("per copy in BPF: entry %.0f ns, return %.0f ns (best of %d rounds of %d copies)", enter, ret, rounds, iterations)
}
