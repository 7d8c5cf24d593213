package agent_test

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lanewatch/lanewatch/agent"
	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/internal/testenv"
	"github.com/lanewatch/lanewatch/probes"
)

// A real fi_pingpong pair (libfabric-bin) over libfabric's tcp provider,
// RDM endpoints (rxm over tcp), 200 sends of 64 KiB each way: the client's
// every send is one record, with the provider named, joined to its
// completion. libfabric's data path is found stage by stage from the
// objects a process builds (probes/fabric.go), each stage probed after the
// agent read the previous one's return, so a first process outruns the
// chain. Learning pairs run until the agent says every stage is probed
// (its own state, not a time), bounded; then
// the measured pair runs with the whole chain in place from its start.
func TestFabricPingpong(t *testing.T) {
	testenv.RequireRoot(t)
	bin := testenv.Tool(t, "fi_pingpong", "libfabric-bin")
	libs, _ := filepath.Glob("/usr/lib/*/libfabric.so.1")
	if len(libs) != 1 {
		t.Fatalf("libfabric.so.1: %v", libs)
	}
	lib, err := filepath.EvalSymlinks(libs[0])
	if err != nil {
		t.Fatal(err)
	}
	// fi_fabric is probed from the start; the stages after it are learned.
	r := startAgent(t, agent.Config{Libs: []string{lib}})
	probed := func() []string {
		var missing []string
		have := r.agent.FabricFunctions()
		for _, row := range []string{probes.FabricRowDomain, probes.FabricRowEndpoint, probes.FabricRowCQOpen,
			"provider:fi_ep_bind", "provider:fi_send", "provider:fi_cq_read"} {
			if have[row] == 0 {
				missing = append(missing, row)
			}
		}
		return missing
	}
	// Three stages after fi_fabric (domain; endpoint and CQ; sends, binds
	// and CQ reads), a pair each at most, and two more for a stage whose
	// process exited before discovery read its object.
	const learning = 3 + 2
	for run := 1; len(probed()) > 0; run++ {
		if run > learning {
			t.Fatalf("after %d learning pairs, not probed: %v; probed: %v", run-1, probed(), r.agent.FabricFunctions())
		}
		_, client := pingpongPair(t, r, bin)
		r.col.Take(uint32(client))
		// Every constructor of the pair reached discovery before its
		// exit did (ring order): wait for their resolution.
		deadline := time.Now().Add(30 * time.Second)
		for r.agent.FabricPending() != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("libfabric objects still unresolved 30 s after the pair: %d", r.agent.FabricPending())
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Logf("learning pair %d: probed %v", run, r.agent.FabricFunctions())
	}

	server, client := pingpongPair(t, r, bin)
	got := r.col.Take(uint32(client))
	r.col.Take(uint32(server))
	sends, other := 0, map[string]int{}
	for _, g := range got {
		if g.API != "fi_send" {
			other[g.API]++
			continue
		}
		sends++
		if g.Bytes != 65536 || g.Transport != "tcp;ofi_rxm" || g.NetDevice == "" || g.Direction != correlate.DirSend ||
			g.Mover != correlate.MoverNIC || g.Status != "success" || g.CompleteNs == 0 || g.LatencyNs != g.CompleteNs-g.SubmitNs ||
			g.Endpoint == 0 || g.Src.Addr == 0 {
			t.Errorf("send: %+v", g)
		}
	}
	d := r.agent.Stats().Drops
	fs := r.agent.Stats().Engine
	// Every send is a record, unless the ring lost some (an outside flood
	// on a busy machine): then the loss is counted, never silent.
	// (Its setup sends its address with one fi_sendmsg: a record of its own.)
	if sends != 200 && !(sends < 200 && d.RingFull > 0) {
		t.Errorf("client: %d send records, want 200 (fi_pingpong -I 200); drops %+v", sends, d)
	}
	t.Logf("client pid %d: %d send records, others %v; engine %d transfers; drops %+v", client, sends, other, fs.Transfers, d)
}

// pingpongPair runs fi_pingpong's server and client on loopback and
// returns their pids once the agent saw both exit.
func pingpongPair(t *testing.T, r *running, bin string) (server, client int) {
	t.Helper()
	port := freePort(t)
	args := []string{"-p", "tcp", "-e", "rdm", "-S", "65536", "-I", "200"}
	srv := exec.Command(bin, append(args, "-B", fmt.Sprint(port))...)
	var srvOut strings.Builder
	srv.Stdout, srv.Stderr = &srvOut, &srvOut
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	// The client connects once: start it when the server listens.
	deadline := time.Now().Add(30 * time.Second)
	for !listening(t, port) {
		if time.Now().After(deadline) {
			srv.Process.Kill()
			srv.Wait()
			t.Fatalf("fi_pingpong server not listening on %d after 30 s: %s", port, srvOut.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	cl := exec.Command(bin, append(args, "-P", fmt.Sprint(port), "127.0.0.1")...)
	out, err := cl.CombinedOutput()
	if err != nil {
		srv.Process.Kill()
		srv.Wait()
		t.Fatalf("fi_pingpong client: %v\n%s\nserver: %s", err, out, srvOut.String())
	}
	if err := srv.Wait(); err != nil {
		t.Fatalf("fi_pingpong server: %v\n%s", err, srvOut.String())
	}
	waitExit(t, r.col, srv.Process.Pid)
	waitExit(t, r.col, cl.Process.Pid)
	return srv.Process.Pid, cl.Process.Pid
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// listening says whether a socket listens on TCP port (/proc/net/tcp{,6}:
// local address :PORT in hex, state 0A).
func listening(t *testing.T, port int) bool {
	want := fmt.Sprintf(":%04X", port)
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		fd, err := os.Open(f)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(fd)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) > 3 && strings.HasSuffix(fields[1], want) && fields[3] == "0A" {
				fd.Close()
				return true
			}
		}
		fd.Close()
	}
	return false
}
