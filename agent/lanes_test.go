package agent_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lanewatch/lanewatch/agent"
	"github.com/lanewatch/lanewatch/checks"
	"github.com/lanewatch/lanewatch/collectors"
	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/exporters"
	"github.com/lanewatch/lanewatch/internal/testenv"
	"github.com/lanewatch/lanewatch/judge"
	"github.com/lanewatch/lanewatch/selftest/refenv"
)

// Byte totals per lane equal the application's own in a run that dropped
// most of its events (issue 23): the reader is held while kvpath's
// callbench makes far more copies than the ring holds, so drops are
// certain; the BPF-side counters still hold every copy. The lane is the
// GPU the warm-up copy's record placed the stream on (read before the
// flood); the truth is what kvpath's driver says it moved over that GPU's
// inbound lane. The totals are checked while the process's counters are
// in the BPF map and again once a sweep folded them (the process gone,
// its exit event lost with the rest), and as /metrics renders them.
// Without shedding the ring drops what it cannot hold; with it (the
// default), the copies past three quarters of the ring are shed, counted
// on their lane, and nothing is dropped.
func TestLaneBytesExactWithDrops(t *testing.T) {
	for _, shed := range []bool{false, true} {
		t.Run(map[bool]string{false: "drops", true: "sheds"}[shed], func(t *testing.T) { laneBytesExact(t, shed) })
	}
}

func laneBytesExact(t *testing.T, shed bool) {
	testenv.RequireRoot(t)
	ref := testenv.RefDir(t)
	dir := t.TempDir()
	for _, f := range []string{"bin/kvpath", "plain/libcudart.so.12", "lib/libcuda.so.1"} {
		copyFile(t, filepath.Join(ref, f), filepath.Join(dir, f))
	}
	name := fmt.Sprintf("lanes%d", os.Getpid()) // a reference GPU of this test's own, with a PCI address
	t.Cleanup(func() { os.Remove(refenv.LaneFile(name)) })
	gpus := []collectors.CUDAGPU{{BusID: refenv.BusID(name), Model: "reference GPU"}}

	// kvpath, exec'd by a shell the agent is told to trace (Config.PIDs):
	// the agent sees it from its start, and no other process's copies
	// share its ring.
	const iterations = 20000 // the 64 KiB ring holds ~450 events
	kv := exec.Command("sh", "-c", `read go; exec "$0" "$@"`, filepath.Join(dir, "bin/kvpath"), "--scenario", "callbench",
		"--iterations", strconv.Itoa(iterations), "--hold")
	kv.Env = append(os.Environ(), "LD_LIBRARY_PATH="+filepath.Join(dir, "plain")+":"+filepath.Join(dir, "lib"), refenv.SharedGPUs(name))
	kv.Stderr = os.Stderr
	in, err := kv.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := kv.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := kv.Start(); err != nil {
		t.Fatal(err)
	}
	defer kv.Process.Kill()
	pid := uint32(kv.Process.Pid)

	var mu sync.Mutex
	copied := map[uint32]bool{} // processes whose copy records were read
	var judged atomic.Int64     // kvpath's transfers the evaluator got
	var hold sync.Once
	armed, held, release := make(chan struct{}), make(chan struct{}), make(chan struct{})
	// With shedding, a ring whose last quarter holds more than the events
	// two CPUs submit between fill checks (64 each).
	ring := uint32(64 << 10)
	if shed {
		ring = 256 << 10
	}
	// The evaluator's window: the drops make it say its judgements rest
	// on part of it (the drop counters moved while it was open).
	var tracer atomic.Pointer[agent.Agent]
	ev := judge.NewEvaluator(judge.EvaluatorConfig{Drops: func() (uint64, error) {
		if a := tracer.Load(); a != nil {
			return a.Stats().Drops.Total(), nil
		}
		return 0, nil // loaded after the evaluator: nothing dropped yet
	}, Shed: func() (map[uint32]uint64, error) {
		if a := tracer.Load(); a != nil {
			return a.ShedByProcess()
		}
		return nil, nil
	}})
	r := startAgent(t, agent.Config{RingBytes: ring, NoShedding: !shed, Libs: []string{filepath.Join(dir, "lib/libcuda.so.1")}, PIDs: []int{int(pid)},
		Devices: agent.DeviceMap(collectors.NewEnvCache("/proc"), gpus, nil), Lost: ev.Lost,
		Sink: correlate.SinkFunc(func(tr *correlate.Transfer) {
			if tr.PID == pid {
				judged.Add(1)
			}
			ev.Transfer(tr)
		}),
		OnCall: func(c *event.Call) {
			if c.Symbol == "cuMemcpyHtoDAsync_v2" {
				mu.Lock()
				copied[c.PID] = true
				mu.Unlock()
			}
			select {
			case <-armed:
				hold.Do(func() { close(held); <-release })
			default:
			}
		}})
	tracer.Store(r.agent) // before the flood: its drops are the window's
	var released sync.Once
	letGo := func() { released.Do(func() { close(release) }) }
	t.Cleanup(letGo) // before the agent's own: a failing test must not hold its reader forever

	io.WriteString(in, "go\n") // the shell execs kvpath
	stdout := bufio.NewReader(out)
	if line, err := stdout.ReadString('\n'); err != nil || line != fmt.Sprintf("ready %d\n", pid) {
		t.Fatalf("kvpath: %q %v", line, err)
	}
	// The warm-up copy was made before the hold point: its record places
	// the stream on the GPU.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		mu.Lock()
		ok := copied[pid]
		mu.Unlock()
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the warm-up copy's record was never read")
		}
	}

	close(armed) // the reader stops at the next call: the flood's first
	io.WriteString(in, "go\n")
	line, err := stdout.ReadString('\n')
	if err != nil {
		t.Fatalf("kvpath's result: %v", err)
	}
	var truth struct {
		Calls       uint64 `json:"calls"`
		GPU         string `json:"gpu"`
		LaneInBytes uint64 `json:"lane_in_bytes"`
	}
	if err := json.Unmarshal([]byte(line), &truth); err != nil || truth.Calls != iterations || truth.LaneInBytes == 0 || truth.GPU == "" {
		t.Fatalf("kvpath said %q (%v)", line, err)
	}
	if err := kv.Wait(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-held:
	case <-time.After(30 * time.Second):
		t.Fatal("the reader never saw a call to be held at")
	}
	drops := r.agent.Stats().Drops.RingFull
	if !shed && drops == 0 {
		t.Fatal("no event dropped while the reader was held: the test proves nothing")
	}
	if shed && drops != 0 {
		t.Errorf("%d events dropped while shedding", drops)
	}
	letGo()

	check := func(when string) {
		t.Helper()
		lanes, uncounted := r.agent.LaneCopies()
		var got exporters.LaneCopies
		for _, l := range lanes {
			if l.GPU == truth.GPU && l.Direction == correlate.DirH2D {
				got = l
			}
		}
		if shed != (got.Shed > 0) || got.Shed >= got.Copies {
			t.Errorf("%s: %d of %d copies shed (shedding %v)", when, got.Shed, got.Copies, shed)
		}
		if got.Bytes != truth.LaneInBytes || got.Copies != truth.Calls+1 || uncounted != 0 { // and the warm-up copy
			t.Errorf("%s: lanes %+v (%d uncounted); the application moved %d bytes in %d copies over %s's inbound lane (%d events dropped)",
				when, lanes, uncounted, truth.LaneInBytes, truth.Calls+1, truth.GPU, drops)
		}
	}
	check("before the sweep")
	// The process is gone: a sweep folds its counters and deletes them.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		n, err := agent.FlowsOf(r.agent, int(pid))
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d flows of the gone process never folded", n)
		}
	}
	check("after the sweep")

	// As /metrics says it.
	m := exporters.NewMetrics(func() exporters.Health {
		lanes, uncounted := r.agent.LaneCopies()
		return exporters.Health{LaneCopies: lanes, LaneUncounted: uncounted}
	})
	mfs, err := exporters.NewRegistry(m, nil, nil).Gather()
	if err != nil {
		t.Fatal(err)
	}
	var scraped float64 = -1
	for _, mf := range mfs {
		if mf.GetName() != "lanewatch_lane_bytes_total" {
			continue
		}
		for _, s := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range s.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["gpu"] == truth.GPU && labels["direction"] == correlate.DirH2D {
				scraped = s.GetCounter().GetValue()
			}
		}
	}
	if scraped != float64(truth.LaneInBytes) {
		t.Errorf("lanewatch_lane_bytes_total{gpu=%q,direction=\"H2D\"} %v, want %d", truth.GPU, scraped, truth.LaneInBytes)
	}

	// The window that dropped them: every check of it rests on part of
	// its events (whose, the counters do not say), and none passes. The
	// process is gone, so nothing is dropped after: the next window is
	// whole as far as the counters go.
	for deadline := time.Now().Add(30 * time.Second); judged.Load() == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the evaluator never got a transfer of kvpath's: its window has nothing to judge")
		}
	}
	v := ev.Evaluate(time.Now())
	if total := r.agent.Stats().Drops.Total(); !shed && (v.Losses.Events != total || !v.Losses.All) {
		t.Errorf("window losses %+v, want the %d events the probes dropped, any process's", v.Losses, total)
	}
	shedInWindow := v.Losses.Shed[pid]
	if shed && (v.Losses.Events != 0 || v.Losses.All || shedInWindow == 0) {
		t.Errorf("window losses %+v, want kvpath's copies shed and nothing dropped", v.Losses)
	}
	var partial int
	for _, c := range v.Checks {
		if c.Status == checks.Pass {
			t.Errorf("%s %s passes a window that dropped %d events: %s", c.Scope, c.Name, v.Losses.Events, c.Detail)
		}
		if c.Incomplete != "" {
			partial++
		}
	}
	if !slices.ContainsFunc(v.Checks, func(c checks.Check) bool { return c.Scope == fmt.Sprintf("pid %d", pid) && c.Incomplete != "" }) {
		t.Errorf("no check of pid %d says it rests on part of the window: %+v", pid, v.Checks)
	}
	if v = ev.Evaluate(time.Now()); v.Losses.Events != 0 || v.Losses.All {
		t.Errorf("the window after: losses %+v, want no drop counted", v.Losses)
	}
	if !t.Failed() {
		t.Logf("%d copies, %d bytes over %s's inbound lane counted exactly with %d events dropped, %d copies shed; %d checks of their window said incomplete",
			truth.Calls+1, truth.LaneInBytes, truth.GPU, drops, shedInWindow, partial)
	}
}
