package agent_test

import (
	"bytes"
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
	"github.com/lanewatch/lanewatch/selftest"
)

// A real ucx_perftest pair on loopback, over shared memory and over TCP,
// puts and gets of 1 MiB: one record per call the client made (counted
// by the kernel: runCounting), each with its bytes as posted, the
// transport and device UCX was told to use, and its latency.
func TestUCXPerftestRecords(t *testing.T) {
	testenv.RequireRoot(t)
	perftest := testenv.Tool(t, "ucx_perftest", "ucx-utils")
	ucp := ldconfigPath(t, "libucp.so.0")
	r := startAgent(t, agent.Config{})
	for _, c := range []struct {
		tls, devices, test, api string
		transport, device       string
		// rows: the transfer-library scenarios that judge these very
		// records, on their injected hosts (selftest.JudgeXfer): tcp
		// beside an RDMA device near the GPU fires kv-transfer-tcp-fallback,
		// on a host without one it is the best lane; shared memory beside
		// RDMA devices needs no NIC.
		rows []string
	}{
		{"posix,cma,self", "", "ucp_put_bw", "ucp_put_nbx", "posix", "memory", []string{"xfer-same-host"}},
		{"posix,cma,self", "", "ucp_get", "ucp_get_nbx", "posix", "memory", nil},
		{"tcp", "lo", "ucp_put_bw", "ucp_put_nbx", "tcp", "lo", []string{"xfer-tcp-fallback", "xfer-tcp-no-rdma"}},
		{"tcp", "lo", "ucp_get", "ucp_get_nbx", "tcp", "lo", []string{"xfer-tcp-fallback"}},
		// Tag sends: rendezvous, the receiver pulls the data; a send UCX
		// queues reaches no transport itself and is said to be on its
		// endpoint's last lane (transport_inferred).
		{"posix,cma,self", "", "tag_bw", "ucp_tag_send_nbx", "posix", "memory", nil},
	} {
		t.Run(c.tls+"/"+c.test, func(t *testing.T) {
			const size, n = 1 << 20, 2000
			env := []string{"UCX_TLS=" + c.tls}
			if c.devices != "" {
				env = append(env, "UCX_NET_DEVICES="+c.devices)
			}
			srv := testenv.StartPerftest(t, perftest, env...)
			// The server maps libucp and libuct: once the agent probes those
			// files, every process using them is probed from its start.
			waitAttached(t, r.agent, "libucp.so", "libuct.so")
			before := r.agent.XferStats()
			_, dropsBefore := r.agent.EventsAndDrops()

			cl := srv.Client(c.test, size, n)
			// The truth: the kernel's own count of the client's entries to
			// the function, nothing of the agent's.
			want, _ := runCounting(t, ucp, c.api, cl)
			waitExit(t, r.col, cl.Process.Pid)
			if want < n {
				t.Fatalf("the client entered %s %d times, want at least %d", c.api, want, n)
			}

			got := 0
			records := r.col.Take(uint32(cl.Process.Pid))
			for _, row := range c.rows {
				if res := selftest.JudgeXfer(row, uint32(cl.Process.Pid), records); !res.OK() {
					t.Errorf("%s on these records: %v", row, res.Problems)
				}
			}
			for _, x := range records {
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
			if after := r.agent.XferStats(); after.Evicted != before.Evicted {
				t.Errorf("records without a completion or lane: %+v, before %+v", after, before)
			}
			if _, d := r.agent.EventsAndDrops(); d.Sub(dropsBefore).Total() != 0 {
				t.Errorf("drops while the client ran: %+v", d.Sub(dropsBefore))
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

// runCounting runs cmd and counts its process's entries to a function
// with a tracefs uprobe: the kernel's own account, in a trace instance of
// the test's own, independent of the agent's BPF programs. The command
// starts behind a shell that waits for a line, so the probe's filter
// names its pid before it runs (exec keeps the pid); calls from threads
// other than its first are not counted.
func runCounting(t *testing.T, path, symbol string, cmd *exec.Cmd) (calls int, out []byte) {
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
	write := func(file, line string) {
		f, err := os.OpenFile(file, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.WriteString(line + "\n"); err != nil {
			t.Fatalf("%s: %q: %v", file, line, err)
		}
	}
	tag := fmt.Sprintf("lw%d_%s", os.Getpid(), symbol)
	instance := filepath.Join(tracefs, "instances", tag)
	if err := os.Mkdir(instance, 0o755); err != nil {
		t.Fatal(err)
	}
	event := filepath.Join(instance, "events", "lwtruth", tag)
	write(filepath.Join(tracefs, "uprobe_events"), fmt.Sprintf("p:lwtruth/%s %s:%#x", tag, path, syms[symbol].Offset))
	defer func() {
		write(filepath.Join(event, "enable"), "0")
		if err := os.Remove(instance); err != nil {
			t.Error(err)
		}
		write(filepath.Join(tracefs, "uprobe_events"), "-:lwtruth/"+tag)
	}()
	write(filepath.Join(instance, "buffer_size_kb"), "8192")

	gated := exec.Command("sh", append([]string{"-c", `read _ && exec "$0" "$@"`, cmd.Path}, cmd.Args[1:]...)...)
	gated.Env = cmd.Env
	var buf bytes.Buffer
	gated.Stdout, gated.Stderr = &buf, &buf
	gate, err := gated.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := gated.Start(); err != nil {
		t.Fatal(err)
	}
	cmd.Process = gated.Process
	write(filepath.Join(event, "filter"), fmt.Sprintf("common_pid == %d", gated.Process.Pid))
	write(filepath.Join(event, "enable"), "1")
	gate.Write([]byte("go\n"))
	gate.Close()
	if err := gated.Wait(); err != nil {
		t.Fatalf("%s: %v\n%s", cmd, err, buf.Bytes())
	}
	write(filepath.Join(event, "enable"), "0")
	trace, err := os.ReadFile(filepath.Join(instance, "trace"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(trace), "\n") {
		if !strings.HasPrefix(line, "#") && strings.Contains(line, " "+tag+": ") {
			calls++
		}
	}
	if strings.Contains(string(trace), "LOST") {
		t.Fatalf("the trace instance lost events: %d counted", calls)
	}
	return calls, buf.Bytes()
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
