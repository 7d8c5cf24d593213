package agent_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lanewatch/lanewatch/agent"
	"github.com/lanewatch/lanewatch/internal/testenv"
	"github.com/lanewatch/lanewatch/probes"
)

// A real ucx_perftest pair on loopback, over shared memory and over TCP,
// puts and gets of 1 MiB: one record per call the client made (counted
// by ucxTruth in the client), each with its bytes as posted, the
// transport and device UCX was told to use, and its latency.
func TestUCXPerftestRecords(t *testing.T) {
	testenv.RequireRoot(t)
	perftest := testenv.Tool(t, "ucx_perftest", "ucx-utils")
	ucp := ldconfigPath(t, "libucp.so.0")
	r := startAgent(t, agent.Config{})
	port := 13420
	for _, c := range []struct {
		tls, devices, test, api string
		transport, device       string
	}{
		{"posix,cma,self", "", "ucp_put_bw", "ucp_put_nbx", "posix", "memory"},
		{"posix,cma,self", "", "ucp_get", "ucp_get_nbx", "posix", "memory"},
		{"tcp", "lo", "ucp_put_bw", "ucp_put_nbx", "tcp", "lo"},
		{"tcp", "lo", "ucp_get", "ucp_get_nbx", "tcp", "lo"},
	} {
		t.Run(c.tls+"/"+c.test, func(t *testing.T) {
			port++
			const size, n = 1 << 20, 2000
			env := append(os.Environ(), "UCX_TLS="+c.tls)
			if c.devices != "" {
				env = append(env, "UCX_NET_DEVICES="+c.devices)
			}
			srv := exec.Command(perftest, "-p", fmt.Sprint(port))
			srv.Env = env
			if err := srv.Start(); err != nil {
				t.Fatal(err)
			}
			defer srv.Wait()
			defer srv.Process.Kill()
			testenv.WaitListen(t, port)
			// The server maps libucp and libuct: once the agent probes those
			// files, every process using them is probed from its start.
			waitAttached(t, r.agent, "libucp.so", "libuct.so")
			before := r.agent.XferStats()
			// The truth: the kernel's own count of the client's entries to
			// the function (a tracefs uprobe, nothing of the agent's); the
			// server makes no put or get (they are one-sided).
			calls := entryCounter(t, ucp, c.api)

			cl := exec.Command(perftest, "127.0.0.1", "-p", fmt.Sprint(port), "-t", c.test, "-s", fmt.Sprint(size),
				"-n", fmt.Sprint(n), "-w", "0")
			cl.Env = env
			if out, err := cl.CombinedOutput(); err != nil {
				t.Fatalf("%s: %v\n%s", cl, err, out)
			}
			waitExit(t, r.col, cl.Process.Pid)
			want := calls()
			if want < n {
				t.Fatalf("the client entered %s %d times, want at least %d", c.api, want, n)
			}

			got := 0
			for _, x := range r.col.Take(uint32(cl.Process.Pid)) {
				if x.API != c.api {
					t.Errorf("a %s record: %+v", x.API, x)
					continue
				}
				got++
				if x.Bytes != size || x.Transport != c.transport || x.NetDevice != c.device || x.TransportReason != "" ||
					x.CompleteNs < x.SubmitNs || x.LatencyNs != x.CompleteNs-x.SubmitNs || x.LatencyNs == 0 || x.Failed() {
					t.Errorf("record %d: bytes %d transport %q (%s) device %q latency %d (submit %d, complete %d), error %v; want %d bytes on %s/%s with its latency",
						got, x.Bytes, x.Transport, x.TransportReason, x.NetDevice, x.LatencyNs, x.SubmitNs, x.CompleteNs, x.Error, size, c.transport, c.device)
				}
			}
			if got != want {
				t.Errorf("%d %s records, the client made %d calls", got, c.api, want)
			}
			if after := r.agent.XferStats(); after.Evicted != before.Evicted || after.NoLane != before.NoLane {
				t.Errorf("records without a completion or lane: %+v, before %+v", after, before)
			}
			if _, d := r.agent.EventsAndDrops(); d.Total() != 0 {
				t.Errorf("drops: %+v", d)
			}
		})
	}
}

// ldconfigPath is the file the dynamic linker loads for a library name.
func ldconfigPath(t *testing.T, name string) string {
	t.Helper()
	out, err := exec.Command("ldconfig", "-p").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[0] == name && strings.Contains(line, "x86-64") {
			return f[len(f)-1]
		}
	}
	t.Fatalf("%s not in ldconfig -p", name)
	return ""
}

// entryCounter counts entries to a function with a tracefs uprobe: the
// kernel's own count (uprobe_profile's hits), an account independent of
// the agent's BPF programs. Its events are filtered out, so nothing is
// written to the trace buffer; the probe is removed when the test ends.
func entryCounter(t *testing.T, path, symbol string) func() int {
	t.Helper()
	const tracefs = "/sys/kernel/tracing"
	if _, err := os.Stat(filepath.Join(tracefs, "uprobe_events")); err != nil {
		if out, err := exec.Command("mount", "-t", "tracefs", "nodev", tracefs).CombinedOutput(); err != nil {
			t.Fatalf("tracefs: %v %s", err, out)
		}
	}
	syms, err := probes.LookupSymbols(path, []string{symbol})
	if err != nil || syms[symbol].Offset == 0 {
		t.Fatalf("%s in %s: %v", symbol, path, err)
	}
	name := fmt.Sprintf("lwtruth/%s_%d", symbol, os.Getpid())
	write := func(file, line string) {
		f, err := os.OpenFile(filepath.Join(tracefs, file), os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.WriteString(line + "\n"); err != nil {
			t.Fatalf("%s: %q: %v", file, line, err)
		}
	}
	write("uprobe_events", fmt.Sprintf("p:%s %s:%#x", name, path, syms[symbol].Offset))
	event := filepath.Join("events", name)
	write(filepath.Join(event, "filter"), "common_pid == 0")
	write(filepath.Join(event, "enable"), "1")
	t.Cleanup(func() {
		write(filepath.Join(event, "enable"), "0")
		write("uprobe_events", "-:"+name)
	})
	return func() int {
		b, err := os.ReadFile(filepath.Join(tracefs, "uprobe_profile"))
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) == 3 && "lwtruth/"+f[1] == name {
				var n int
				fmt.Sscan(f[2], &n)
				return n
			}
		}
		t.Fatalf("%s not in uprobe_profile:\n%s", name, b)
		return 0
	}
}

// waitAttached waits until the agent probes a file of each name.
func waitAttached(t testing.TB, a *agent.Agent, names ...string) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		probed := a.AttachedProbes()
		have := 0
		for _, n := range names {
			for path := range probed {
				if strings.Contains(filepath.Base(path), n) {
					have++
					break
				}
			}
		}
		if have == len(names) {
			return
		}
	}
	t.Fatalf("%v not probed: %v", names, a.AttachedProbes())
}
