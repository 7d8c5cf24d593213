package agent_test

import (
	"fmt"
	"os"
	"strings"
	"time"
	"os/exec"
	"sync"
	"testing"

	"github.com/lanewatch/lanewatch/agent"
	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/internal/testenv"
)

func TestUCXDebug(t *testing.T) {
	testenv.RequireRoot(t)
	var mu sync.Mutex
	ops := map[string]int{}
	r := startAgent(t, agent.Config{OnCall: func(c *event.Call) {
		mu.Lock()
		ops[c.Symbol+"/"+c.Op.String()]++
		mu.Unlock()
	}})
	srv := exec.Command("ucx_perftest", "-p", "13411")
	srv.Env = append(os.Environ(), "UCX_TLS="+os.Getenv("LWTLS"))
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer srv.Process.Kill()
	waitListen(t, 13411)
	waitAttached(t, r.agent, "libucp.so", "libuct.so")
	cl := exec.Command("ucx_perftest", "127.0.0.1", "-p", "13411", "-t", os.Getenv("LWTEST"), "-s", "1048576", "-n", "2000", "-w", "0")
	cl.Env = srv.Env
	out, err := cl.CombinedOutput()
	if err != nil {
		t.Fatalf("%v %s", err, out)
	}
	waitExit(t, r.col, cl.Process.Pid)
	mu.Lock()
	t.Log(ops)
	mu.Unlock()
	ts := r.col.Take(uint32(cl.Process.Pid))
	t.Log(len(ts))
	if len(ts) > 0 {
		t.Logf("%+v", ts[0])
	}
	kinds := map[string]int{}
	for _, x := range ts {
		kinds[fmt.Sprintf("%s %s %s %d lat=%v reason=%s", x.API, x.Transport, x.NetDevice, x.Bytes, x.LatencyNs > 0, x.TransportReason)]++
	}
	t.Log(kinds, r.agent.XferStats())
}

// waitListen waits until a socket listens on the TCP port (procfs).
func waitListen(t *testing.T, port int) {
	t.Helper()
	want := fmt.Sprintf(":%04X ", port)
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
			b, _ := os.ReadFile(f)
			for _, line := range strings.Split(string(b), "\n") {
				fields := strings.Fields(line)
				if len(fields) > 3 && strings.HasSuffix(fields[1], want[:len(want)-1]) && fields[3] == "0A" {
					return
				}
			}
		}
	}
	t.Fatalf("nothing listens on port %d", port)
}

// waitAttached waits until the agent probes a file of each name.
func waitAttached(t *testing.T, a *agent.Agent, names ...string) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		have := 0
		for _, n := range names {
			for path := range a.AttachedProbes() {
				if strings.Contains(path, n) {
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
