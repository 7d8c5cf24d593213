package probes

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/internal/testenv"
)

// The benchmarks here measure what a probed call costs the process that
// makes it, side by side in one run: each configuration is run once per
// round, rounds interleave them, and the fastest round of each is kept, so
// a noisy neighbour on this shared machine inflates none of them alone.
// The ratios are the result; docs/design.md, "One pair per call", has the
// figures.
//
// With -short (make test) they run one small round, to prove they still run.
func benchSize() (rounds, iterations int) {
	if testing.Short() {
		return 1, 20000
	}
	return 5, 200000
}

// nsPerCall runs a benchmark program that prints {"ns_per_call": X}.
func nsPerCall(tb testing.TB, cmd *exec.Cmd) float64 {
	tb.Helper()
	out, err := cmd.Output()
	if err != nil {
		tb.Fatalf("%s: %v", cmd, err)
	}
	return parseNsPerCall(tb, cmd, out)
}

// parseNsPerCall reads what a benchmark program printed.
func parseNsPerCall(tb testing.TB, cmd *exec.Cmd, out []byte) float64 {
	tb.Helper()
	var r struct {
		NsPerCall float64 `json:"ns_per_call"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		tb.Fatalf("%s output %q: %v", cmd, out, err)
	}
	return r.NsPerCall
}

// callbench runs the reference runtime's tight cudaMemcpyAsync loop (each
// call goes on to the reference driver's cuMemcpyHtoDAsync_v2).
func callbench(tb testing.TB, ref, build string, iterations int) float64 {
	return nsPerCall(tb, callbenchCmd(ref, build, iterations))
}

func callbenchCmd(ref, build string, iterations int) *exec.Cmd {
	cmd := exec.Command(filepath.Join(ref, "bin", "kvpath"), "--scenario", "callbench", "--iterations", strconv.Itoa(iterations))
	cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+filepath.Join(ref, build)+":"+filepath.Join(ref, "lib"))
	return cmd
}

// withBaseline runs f with a baseline program from bpf/empty.bpf.c at the
// symbol's own address (where a naive tool attaches): the empty program
// alone, or the bpftrace-equivalent entry+return pair.
func withBaseline(tb testing.TB, lib string, sym Symbol, pair bool, f func() float64) float64 {
	tb.Helper()
	var objs emptyObjects
	if err := loadEmptyObjects(&objs, nil); err != nil {
		tb.Fatal(err)
	}
	defer objs.Close()
	ex, err := link.OpenExecutable(lib)
	if err != nil {
		tb.Fatal(err)
	}
	opts := &link.UprobeOptions{Address: sym.Offset}
	if !pair {
		l, err := ex.Uprobe(sym.Name, objs.LwEmpty, opts)
		if err != nil {
			tb.Fatal(err)
		}
		defer l.Close()
		return f()
	}
	for _, p := range []struct {
		prog *ebpf.Program
		ret  bool
	}{{objs.LwNaiveEntry, false}, {objs.LwNaiveReturn, true}} {
		attach := ex.Uprobe
		if p.ret {
			attach = ex.Uretprobe
		}
		l, err := attach(sym.Name, p.prog, opts)
		if err != nil {
			tb.Fatal(err)
		}
		defer l.Close()
	}
	return f()
}

// withBpftrace runs f under a real bpftrace timing the symbol (entry+return,
// a histogram of latencies), if bpftrace is installed.
func withBpftrace(tb testing.TB, lib, symbol string, f func() float64) (float64, error) {
	bin, err := exec.LookPath("bpftrace")
	if err != nil {
		return 0, err
	}
	script := fmt.Sprintf(`BEGIN { printf("ready\n"); } uprobe:%[1]s:%[2]s { @s[tid] = nsecs; } uretprobe:%[1]s:%[2]s /@s[tid]/ { @ns = hist(nsecs - @s[tid]); delete(@s[tid]); }`, lib, symbol)
	cmd := exec.Command(bin, "-e", script)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, err
	}
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	defer func() { cmd.Process.Signal(os.Interrupt); cmd.Wait() }()
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		ok := false
		for sc.Scan() {
			if !ok && strings.TrimSpace(sc.Text()) == "ready" {
				ok = true
				ready <- true
			}
		}
		if !ok {
			ready <- false
		}
	}()
	select {
	case ok := <-ready:
		if !ok {
			return 0, fmt.Errorf("bpftrace exited before attaching")
		}
	case <-time.After(30 * time.Second):
		return 0, fmt.Errorf("bpftrace did not attach within 30 s")
	}
	return f(), nil
}

// lanewatchRun is one run under the probes as `agent run` attaches them.
type lanewatchRun struct {
	ns      float64
	sites   map[string]Site
	events  map[string]uint64 // events read, by symbol
	dropped uint64
	drops   event.Drops // dropped, by reason
	// laneRuns is how often lw_uct_lane ran (a UCT call nested in a UCP
	// one): counted only while BPF statistics are on (ebpf.EnableStats).
	laneRuns uint64
}

// withLanewatch runs f with every driver row of the table attached to lib
// the way `agent run --kernels` attaches it (thunks resolved, one
// entry+return pair per row) and a reader draining the ring buffer, as in
// the agent.
func withLanewatch(tb testing.TB, lib string, f func() float64) lanewatchRun {
	return withRows(tb, lib, driverSymbols(), f)
}

// withRows is withLanewatch with only the rows names lists.
func withRows(tb testing.TB, lib string, names []string, f func() float64) lanewatchRun {
	return withFiles(tb, map[string][]string{lib: names}, f)
}

// withFiles is withRows in several files: the rows each file's names list.
func withFiles(tb testing.TB, files map[string][]string, f func() float64) lanewatchRun {
	tb.Helper()
	p, err := Load(Options{})
	if err != nil {
		tb.Fatal(err)
	}
	defer p.Close()
	r := lanewatchRun{sites: map[string]Site{}}
	inode := uint64(0)
	for lib, names := range files {
		syms, err := LookupSymbols(lib, names)
		if err != nil {
			tb.Fatal(err)
		}
		inode++
		af, err := p.AttachFile(FileID{Inode: inode}, lib, syms, 0)
		if err != nil {
			tb.Fatal(err)
		}
		for sym, site := range af.Sites {
			r.sites[sym] = site
		}
	}
	stop := make(chan struct{})
	done := make(chan map[string]uint64)
	go func() {
		n := map[string]uint64{}
		p.Read(stop, func(c *event.Call) { n[c.Symbol]++ })
		done <- n
	}()
	lane0 := progRuns(p.objs.LwUctLane)
	r.ns = f()
	r.laneRuns = progRuns(p.objs.LwUctLane) - lane0
	close(stop)
	r.events = <-done
	drops, err := p.Drops()
	if err != nil {
		tb.Fatal(err)
	}
	r.dropped, r.drops = drops.Total(), drops
	return r
}

// progRuns is how often a program ran, while BPF statistics were on.
func progRuns(prog *ebpf.Program) uint64 {
	s, err := prog.Stats()
	if err != nil {
		return 0
	}
	return s.RunCount
}

// BenchmarkWholeStack: one cudaMemcpyAsync through the reference runtime
// and driver (both builds), with no probe, with the bpftrace-equivalent
// entry+return pair on the runtime symbol (and a real bpftrace when
// installed), and with every probe `agent run` attaches. Traps per copy are
// counted from the events: each is one entry and one return hit.
func BenchmarkWholeStack(b *testing.B) {
	testenv.RequireRoot(b)
	ref := testenv.RefDir(b)
	benchRounds, iterations := benchSize()
	driver := filepath.Join(ref, "lib", "libcuda.so.1")
	for _, build := range []string{"plain", "cet"} {
		runtime := filepath.Join(ref, build, "libcudart.so.12")
		syms, err := LookupSymbols(runtime, []string{"cudaMemcpyAsync"})
		if err != nil || len(syms) != 1 {
			b.Fatalf("%s: cudaMemcpyAsync: %v", runtime, err)
		}
		run := func() float64 { return callbench(b, ref, build, iterations) }
		none, pair, trace, lw := math.Inf(1), math.Inf(1), math.Inf(1), math.Inf(1)
		var last lanewatchRun
		var traceErr error
		for range benchRounds {
			none = min(none, run())
			pair = min(pair, withBaseline(b, runtime, syms["cudaMemcpyAsync"], true, run))
			if traceErr == nil {
				var ns float64
				ns, traceErr = withBpftrace(b, runtime, "cudaMemcpyAsync", run)
				trace = min(trace, ns)
			}
			last = withLanewatch(b, driver, run)
			lw = min(lw, last.ns)
		}
		copies := float64(iterations + 1) // and the warm-up copy
		traps := 2 * float64(last.events["cuMemcpyHtoDAsync_v2"]) / copies
		b.ReportMetric(none, build+"-none-ns/call")
		b.ReportMetric(pair, build+"-pair@runtime-ns/call")
		b.ReportMetric(lw, build+"-lanewatch-ns/call")
		b.ReportMetric((lw-none)/(pair-none), build+"-lanewatch/pair-added")
		b.ReportMetric(traps, build+"-traps/copy")
		b.Logf("%s: none %.0f ns; bpftrace-equivalent pair on cudaMemcpyAsync +%.0f ns; lanewatch (%d driver rows, copy at cuMemcpyHtoDAsync_v2 %s) +%.0f ns: lanewatch/pair %.2f of the added cost, %.2f traps per copy, %d dropped (best of %d)",
			build, none, pair-none, len(last.sites), last.sites["cuMemcpyHtoDAsync_v2"], lw-none, (lw-none)/(pair-none), traps, last.dropped, benchRounds)
		if traceErr != nil {
			b.Logf("%s: real bpftrace not measured: %v", build, traceErr)
		} else {
			b.ReportMetric(trace, build+"-bpftrace-ns/call")
			b.Logf("%s: real bpftrace (entry+return on cudaMemcpyAsync, latency histogram) +%.0f ns: lanewatch/bpftrace %.2f", build, trace-none, (lw-none)/(trace-none))
		}
	}
}

// BenchmarkRealDriver: NVIDIA's real driver (535, 550) with no GPU, where
// cuMemcpyHtoD_v2 fails fast (3: not initialised) past its dispatch thunk:
// no probe, an empty program at the exported symbol (the thunk, whose
// RIP-relative compare is single-stepped), and lanewatch as `agent run`
// attaches it (every driver row at its implementation, one entry+return
// pair).
func BenchmarkRealDriver(b *testing.B) {
	testenv.RequireRoot(b)
	prog := testenv.RealCUDA(b)
	benchRounds, iterations := benchSize()
	for _, drv := range []struct{ name, key string }{{"535", "BOOKWORM_CUDA"}, {"550", "TRIXIE_CUDA"}} {
		lib := filepath.Join(testenv.NVIDIA(b, drv.key), "libcuda.so.1")
		syms, err := LookupSymbols(lib, []string{"cuMemcpyHtoD_v2"})
		if err != nil || len(syms) != 1 {
			b.Fatalf("%s: cuMemcpyHtoD_v2: %v", lib, err)
		}
		run := func() float64 { return nsPerCall(b, exec.Command(prog, "bench", lib, strconv.Itoa(iterations))) }
		none, empty, lw := math.Inf(1), math.Inf(1), math.Inf(1)
		var last lanewatchRun
		for range benchRounds {
			none = min(none, run())
			empty = min(empty, withBaseline(b, lib, syms["cuMemcpyHtoD_v2"], false, run))
			last = withLanewatch(b, lib, run)
			lw = min(lw, last.ns)
		}
		b.ReportMetric(none, drv.name+"-none-ns/call")
		b.ReportMetric(empty, drv.name+"-empty@symbol-ns/call")
		b.ReportMetric(lw, drv.name+"-lanewatch-ns/call")
		b.ReportMetric(lw/empty, drv.name+"-lanewatch/empty")
		b.Logf("driver %s: none %.0f ns, empty program at the exported symbol %.0f ns, lanewatch %.0f ns (cuMemcpyHtoD_v2 at %s; %d events for %d calls, %d dropped): lanewatch/empty %.3f per call, %.3f of the added cost (best of %d)",
			drv.name, none, empty, lw, last.sites["cuMemcpyHtoD_v2"], last.events["cuMemcpyHtoD_v2"], iterations+1, last.dropped, lw/empty, (lw-none)/(empty-none), benchRounds)
	}
}

// launchbench runs the reference runtime's tight cudaLaunchKernel loop of an
// empty kernel (each launch goes on to the reference driver's cuLaunchKernel).
func launchbench(tb testing.TB, ref, build string, iterations int) float64 {
	cmd := exec.Command(filepath.Join(ref, "bin", "kvpath"), "--scenario", "launchbench", "--iterations", strconv.Itoa(iterations))
	cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+filepath.Join(ref, build)+":"+filepath.Join(ref, "lib"))
	return nsPerCall(tb, cmd)
}

// BenchmarkLaunch: what probing kernel launches costs a launch
// (docs/design.md, "Kernel movers"). One cudaLaunchKernel of an empty
// kernel through the reference runtime and driver (both builds): with no
// probe, with the bpftrace-equivalent entry+return pair on
// cudaLaunchKernel, with every driver row but the kernel rows (agent run
// without --kernels: a launch meets no probe) and with every driver row
// (agent run --kernels: one pair at cuLaunchKernel).
func BenchmarkLaunch(b *testing.B) {
	testenv.RequireRoot(b)
	ref := testenv.RefDir(b)
	benchRounds, iterations := benchSize()
	driver := filepath.Join(ref, "lib", "libcuda.so.1")
	var noKernels []string
	for _, p := range Table {
		if p.Layer == event.LayerDriver && !p.Op.IsKernel() {
			noKernels = append(noKernels, p.Symbol)
		}
	}
	for _, build := range []string{"plain", "cet"} {
		runtime := filepath.Join(ref, build, "libcudart.so.12")
		syms, err := LookupSymbols(runtime, []string{"cudaLaunchKernel"})
		if err != nil || len(syms) != 1 {
			b.Fatalf("%s: cudaLaunchKernel: %v", runtime, err)
		}
		run := func() float64 { return launchbench(b, ref, build, iterations) }
		none, pair, off, on := math.Inf(1), math.Inf(1), math.Inf(1), math.Inf(1)
		var last lanewatchRun
		for range benchRounds {
			none = min(none, run())
			pair = min(pair, withBaseline(b, runtime, syms["cudaLaunchKernel"], true, run))
			off = min(off, withRows(b, driver, noKernels, run).ns)
			last = withLanewatch(b, driver, run)
			on = min(on, last.ns)
		}
		launches := float64(iterations + 1) // and the warm-up launch
		traps := 2 * float64(last.events["cuLaunchKernel"]) / launches
		b.ReportMetric(none, build+"-none-ns/launch")
		b.ReportMetric(pair, build+"-pair@runtime-ns/launch")
		b.ReportMetric(off, build+"-lanewatch-nokernels-ns/launch")
		b.ReportMetric(on, build+"-lanewatch-kernels-ns/launch")
		b.ReportMetric((on-none)/(pair-none), build+"-lanewatch/pair-added")
		b.ReportMetric(traps, build+"-traps/launch")
		b.Logf("%s: none %.0f ns per launch; bpftrace-equivalent pair on cudaLaunchKernel +%.0f ns; lanewatch without the kernel rows %+.0f ns; with them (cuLaunchKernel at %s) +%.0f ns: %.2f of the pair's added cost, %.0f%% of a launch, %.2f traps per launch, %d dropped (best of %d)",
			build, none, pair-none, off-none, last.sites["cuLaunchKernel"], on-none, (on-none)/(pair-none), 100*(on-none)/none, traps, last.dropped, benchRounds)
	}
}
