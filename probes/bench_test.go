package probes

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/cilium/ebpf/link"
)

// callbench runs the reference driver's tight cudaMemcpyAsync loop and
// returns its ns per call.
func callbench(tb testing.TB, ref, build string, iterations int) float64 {
	tb.Helper()
	cmd := exec.Command(filepath.Join(ref, "bin", "kvpath"), "--scenario", "callbench", "--iterations", strconv.Itoa(iterations))
	cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+filepath.Join(ref, build)+":"+filepath.Join(ref, "lib"))
	out, err := cmd.Output()
	if err != nil {
		tb.Fatalf("callbench: %v", err)
	}
	var r struct {
		NsPerCall float64 `json:"ns_per_call"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		tb.Fatalf("callbench output %q: %v", out, err)
	}
	return r.NsPerCall
}

// BenchmarkProbeCost measures, in one run and for both runtime builds, what a
// cudaMemcpyAsync call costs with no probe, with an empty BPF program at the
// symbol address (what a naive attach or bpftrace pays), and with lanewatch's
// probe at the site it chooses. The ratios are the result.
func BenchmarkProbeCost(b *testing.B) {
	requireRoot(b)
	ref := refDir(b)
	const iterations = 200000
	for _, build := range []string{"plain", "cet"} {
		lib := filepath.Join(ref, build, "libcudart.so.12")
		syms, err := LookupSymbols(lib, []string{"cudaMemcpyAsync"})
		if err != nil || len(syms) != 1 {
			b.Fatalf("%s: cudaMemcpyAsync: %v", lib, err)
		}
		sym := syms["cudaMemcpyAsync"]

		none := callbench(b, ref, build, iterations)

		var empty emptyObjects
		if err := loadEmptyObjects(&empty, nil); err != nil {
			b.Fatal(err)
		}
		ex, err := link.OpenExecutable(lib)
		if err != nil {
			b.Fatal(err)
		}
		l, err := ex.Uprobe("cudaMemcpyAsync", empty.LwEmpty, &link.UprobeOptions{Address: sym.Offset})
		if err != nil {
			b.Fatal(err)
		}
		emptyNs := callbench(b, ref, build, iterations)
		l.Close()
		empty.Close()

		p, err := Load(Options{})
		if err != nil {
			b.Fatal(err)
		}
		id := FileID{Inode: uint64(len(build))} // any key: one file per Probes
		af, err := p.AttachFile(id, lib, syms, 0)
		if err != nil {
			b.Fatal(err)
		}
		stop := make(chan struct{})
		done := make(chan uint64)
		go func() {
			var n uint64
			p.Read(stop, func(*Call) { n++ })
			done <- n
		}()
		lwNs := callbench(b, ref, build, iterations)
		close(stop)
		seen := <-done
		drops, _ := p.Drops()
		p.Close()

		b.ReportMetric(none, build+"-none-ns/call")
		b.ReportMetric(emptyNs, build+"-empty@symbol-ns/call")
		b.ReportMetric(lwNs, build+"-lanewatch-ns/call")
		b.ReportMetric(lwNs/emptyNs, build+"-lanewatch/empty")
		b.Logf("%s: site %s; none %.0f ns, empty program at symbol %.0f ns, lanewatch %.0f ns: ratio %.3f; events read %d, dropped %d",
			build, af.Sites["cudaMemcpyAsync"], none, emptyNs, lwNs, lwNs/emptyNs, seen, drops.Total())
	}
}
