package probes

import (
	"bufio"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/internal/testenv"
)

// BenchmarkUCXPut: what probing UCX costs a put (docs/measurements.md,
// "UCX"). A real ucx_perftest client putting 8 bytes at a time to a server
// on loopback, over shared memory (posix) and over TCP: small puts, so the
// probes' cost is not hidden behind the copy. The time per put is
// perftest's own (its overall message rate), with no probe, with the
// bpftrace-equivalent entry+return pair on ucp_put_nbx (and a real
// bpftrace when installed), and with every row of every UCX file as
// `agent run` attaches them, and with those but the UCT lane rows (the
// lane's own share). A last run, with BPF statistics on (they cost
// time, so no timed run has them), counts the UCT lane probes a put meets
// (in the client and the server: a program's runs are not per process),
// and those a 1 MiB put meets.
func BenchmarkUCXPut(b *testing.B) {
	testenv.RequireRoot(b)
	bin := testenv.Tool(b, "ucx_perftest", "ucx-utils")
	benchRounds, puts := benchSize()
	for _, tl := range []struct {
		name string
		env  []string
	}{
		{"posix", []string{"UCX_TLS=posix,cma,self"}},
		{"tcp", []string{"UCX_TLS=tcp", "UCX_NET_DEVICES=lo"}},
	} {
		files, libucp := ucxFiles(b, testenv.StartPerftest(b, bin, tl.env...).Pid())
		syms, err := LookupSymbols(libucp, []string{"ucp_put_nbx"})
		if err != nil || len(syms) != 1 {
			b.Fatalf("%s: ucp_put_nbx: %v", libucp, err)
		}
		putsOf := func(size, n int) func() float64 {
			return func() float64 {
				srv := testenv.StartPerftest(b, bin, tl.env...)
				f, _ := srv.Run(b, srv.Client("ucp_put_bw", size, n))
				if f.Iterations != n {
					b.Fatalf("perftest reported %d iterations, asked %d", f.Iterations, n)
				}
				return f.NsPerMessage()
			}
		}
		run := putsOf(8, puts)
		noLanes := withoutLanes(files)
		none, pair, trace, ucp, lw := math.Inf(1), math.Inf(1), math.Inf(1), math.Inf(1), math.Inf(1)
		var last lanewatchRun
		var traceErr error
		for range benchRounds {
			none = min(none, run())
			pair = min(pair, withBaseline(b, libucp, syms["ucp_put_nbx"], true, run))
			if traceErr == nil {
				var ns float64
				ns, traceErr = withBpftrace(b, libucp, "ucp_put_nbx", run)
				trace = min(trace, ns)
			}
			ucp = min(ucp, withFiles(b, noLanes, run).ns)
			last = withFiles(b, files, run)
			lw = min(lw, last.ns)
		}
		stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
		if err != nil {
			b.Fatalf("BPF statistics: %v", err)
		}
		counted := withFiles(b, files, run)
		// 1 MiB puts too: a transport that fragments makes many UCT calls
		// a put, each a lane probe.
		bigPuts := puts / 1000
		countedBig := withFiles(b, files, putsOf(1<<20, bigPuts))
		stats.Close()
		bigLanes := float64(countedBig.laneRuns) / float64(bigPuts)
		lanes := float64(counted.laneRuns) / float64(puts)
		ucpEvents := float64(counted.events["ucp_put_nbx"]) / float64(puts)
		b.ReportMetric(none, tl.name+"-none-ns/put")
		b.ReportMetric(pair, tl.name+"-pair@ucp_put_nbx-ns/put")
		b.ReportMetric(ucp, tl.name+"-lanewatch-nolanes-ns/put")
		b.ReportMetric(lw, tl.name+"-lanewatch-ns/put")
		b.ReportMetric((lw-none)/(pair-none), tl.name+"-lanewatch/pair-added")
		b.ReportMetric(lanes, tl.name+"-uct-lane-probes/put")
		b.ReportMetric(bigLanes, tl.name+"-uct-lane-probes/MiB-put")
		b.ReportMetric(ucpEvents, tl.name+"-ucp-events/put")
		b.Logf("%s: none %.0f ns per 8-byte put; bpftrace-equivalent pair on ucp_put_nbx +%.0f ns; lanewatch (%d rows in %d UCX files, ucp_put_nbx at %s) +%.0f ns, of which the UCT lane rows +%.0f: lanewatch/pair %.2f of the added cost; a put is %.2f ucp_put_nbx events (an entry+return pair each) and %.2f UCT lane probes (entry only, client and server; %.1f a 1 MiB put); %d dropped %+v (best of %d, %d puts a run)",
			tl.name, none, pair-none, len(last.sites), len(files), last.sites["ucp_put_nbx"], lw-none, lw-ucp, (lw-none)/(pair-none), ucpEvents, lanes, bigLanes, last.dropped, last.drops, benchRounds, puts)
		if traceErr != nil {
			b.Logf("%s: real bpftrace not measured: %v", tl.name, traceErr)
		} else {
			b.ReportMetric(trace, tl.name+"-bpftrace-ns/put")
			b.Logf("%s: real bpftrace (entry+return on ucp_put_nbx, latency histogram) +%.0f ns: lanewatch/bpftrace %.2f", tl.name, trace-none, (lw-none)/(trace-none))
		}
	}
}

// ucxFiles are the UCX files a UCX process maps and the table rows each
// exports, as `agent run` attaches them: UCX's own libraries from the
// process's mappings (libucp, libuct, libucs, libucm), and the transport
// modules UCX loads at init whatever UCX_TLS says (libuct_ib, libuct_cma,
// ...: the ucx folder beside libuct). libucp is the one holding ucp_put_nbx.
func ucxFiles(tb testing.TB, pid int) (files map[string][]string, libucp string) {
	tb.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	paths := map[string]bool{}
	var libuct string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 6 || !strings.HasPrefix(filepath.Base(fields[5]), "libuc") {
			continue
		}
		paths[fields[5]] = true
		if strings.HasPrefix(filepath.Base(fields[5]), "libuct.so") {
			libuct = fields[5]
		}
	}
	if err := sc.Err(); err != nil {
		tb.Fatal(err)
	}
	if libuct == "" {
		tb.Fatalf("pid %d maps no libuct: %v", pid, paths)
	}
	modules, err := filepath.Glob(filepath.Join(filepath.Dir(libuct), "ucx", "libuct_*.so.0"))
	if err != nil || len(modules) == 0 {
		tb.Fatalf("no UCX transport modules beside %s: %v", libuct, err)
	}
	for _, m := range modules {
		real, err := filepath.EvalSymlinks(m)
		if err != nil {
			tb.Fatal(err)
		}
		paths[real] = true
	}
	var all []string
	for _, p := range Table {
		all = append(all, p.Symbol)
	}
	files = map[string][]string{}
	for path := range paths {
		syms, err := LookupSymbols(path, all)
		if err != nil {
			tb.Fatal(err)
		}
		for sym := range syms {
			files[path] = append(files[path], sym)
			if sym == "ucp_put_nbx" {
				libucp = path
			}
		}
	}
	if libucp == "" {
		tb.Fatalf("no UCX file exports ucp_put_nbx: %v", paths)
	}
	return files, libucp
}

// withoutLanes is files without the UCT lane rows.
func withoutLanes(files map[string][]string) map[string][]string {
	lane := map[string]bool{}
	for _, p := range Table {
		if p.Op == event.OpXferLane {
			lane[p.Symbol] = true
		}
	}
	out := map[string][]string{}
	for path, names := range files {
		for _, n := range names {
			if !lane[n] {
				out[path] = append(out[path], n)
			}
		}
	}
	return out
}
