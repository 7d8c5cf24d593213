package agent_test

import (
	"bufio"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lanewatch/lanewatch/agent"
	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/internal/testenv"
	"github.com/lanewatch/lanewatch/selftest"
)

// A registration lost in a full ring buffer never makes the pool's copies
// pageable (issue 13 #4; docs/design.md, "Ring buffer, wakeups, drops").
// The process is watched from its start (it mapped no CUDA library when
// the agent scanned it), then the ring is filled while the reader is held,
// so its exec, its pool's registration and everything up to its hold point
// are lost; the reader drains, the process copies from the pool. Each copy
// must be unknown, saying events_lost — never pageable, whenever the agent
// learns of the drops.
func TestLostRegistrationIsNeverPageable(t *testing.T) {
	testenv.RequireRoot(t)
	ref := testenv.RefDir(t)
	dir := t.TempDir()
	for _, f := range []string{"bin/kvpath", "plain/libcudart.so.12", "lib/libcuda.so.1"} {
		copyFile(t, filepath.Join(ref, f), filepath.Join(dir, f))
	}
	kvpath := filepath.Join(dir, "bin/kvpath")
	truth := filepath.Join(dir, "victim.jsonl")

	// The victim: a shell that execs kvpath on a line, so the agent's
	// first scan finds no CUDA library in it (observed from its start).
	victim := exec.Command("sh", "-c", `read go; exec "$0" "$@"`, kvpath, "--scenario", "hicache-load", "--hold", "--truth", truth)
	in, err := victim.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := victim.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	victim.Stderr = os.Stderr
	if err := victim.Start(); err != nil {
		t.Fatal(err)
	}
	defer victim.Process.Kill()

	// held closes when the reader should stop; release lets it go on.
	var hold sync.Once
	held, release := make(chan struct{}), make(chan struct{})
	armed := make(chan struct{})
	var seenMu sync.Mutex
	seen := map[uint32]bool{} // processes a call event was read from
	r := startAgent(t, agent.Config{NoShedding: true, Libs: []string{filepath.Join(dir, "lib/libcuda.so.1")},
		OnCall: func(c *event.Call) {
			seenMu.Lock()
			seen[c.PID] = true
			seenMu.Unlock()
			select {
			case <-armed:
				hold.Do(func() { close(held); <-release })
			default:
			}
		}})

	var released sync.Once
	letGo := func() { released.Do(func() { close(release) }) }
	t.Cleanup(letGo) // before the agent's own: a failing test must not hold its reader forever

	// Hold the reader at the next call event, then fill the ring (more
	// calls than a 4 MiB ring holds).
	close(armed)
	fill := exec.Command(kvpath, "--scenario", "callbench", "--iterations", "80000")
	fill.Stderr = os.Stderr
	if err := fill.Run(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("the reader never saw a call to be held at")
	}
	if d := r.agent.Stats().Drops; d.RingFull == 0 {
		t.Fatalf("the ring never filled while the reader was held: %+v", d)
	}

	// The victim execs kvpath, registers its pool and reaches its hold
	// point while every event is lost.
	io.WriteString(in, "go\n")
	stdout := bufio.NewReader(out)
	if line, err := stdout.ReadString('\n'); err != nil || !strings.HasPrefix(line, "ready") {
		t.Fatalf("victim: %q %v", line, err)
	}
	letGo() // the reader drains the ring
	// The victim's copies must find room in the ring: wait until a call
	// made after the release was read (the ring is read in order, so
	// everything before it was drained), not for time to pass — on a busy
	// machine draining 80000 calls takes a while, and copies lost to a
	// still-full ring would leave nothing to judge.
	drained := func(pid int) bool {
		seenMu.Lock()
		defer seenMu.Unlock()
		return seen[uint32(pid)]
	}
	for i := 0; ; i++ {
		marker := exec.Command(kvpath, "--scenario", "callbench", "--iterations", "1")
		if err := marker.Run(); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(2 * time.Second)
		for !drained(marker.Process.Pid) && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if drained(marker.Process.Pid) {
			break
		}
		if i == 30 {
			t.Fatal("no call made after the reader was released was read in 60 s")
		}
	}
	io.WriteString(in, "copy\n")
	go io.Copy(io.Discard, stdout)
	if err := victim.Wait(); err != nil {
		t.Fatal(err)
	}
	waitExit(t, r.col, victim.Process.Pid)

	calls, err := selftest.ReadTruthFile(truth)
	if err != nil {
		t.Fatal(err)
	}
	copies := 0
	for _, c := range calls {
		if c.IsCopy() {
			copies++
		}
	}
	pool := registered(t, truth, "cudaHostRegister")
	got := r.col.Take(uint32(victim.Process.Pid))
	kinds, reasons := map[event.MemKind]int{}, map[string]int{}
	for _, g := range got {
		kinds[g.HostMem]++
		reasons[g.HostMemReason]++
		if g.Src.Addr < pool.Start || g.Src.Addr >= pool.End {
			t.Errorf("copy from %#x, outside the pool %#x-%#x", g.Src.Addr, pool.Start, pool.End)
		}
	}
	if len(got) == 0 || kinds[event.MemPageable] != 0 || kinds[event.MemUnknown] != len(got) || reasons[correlate.ReasonEventsLost] != len(got) {
		t.Errorf("copies from a pool whose registration was lost: %d of %d traced, host memory %v, reasons %v; want unknown, events_lost",
			len(got), copies, kinds, reasons)
	}
	st := r.agent.Stats()
	t.Logf("%d of %d copies traced, host memory %v, reasons %v; drops %+v, processes marked lossy %d",
		len(got), copies, kinds, reasons, st.Drops, st.Engine.LostBefore)
}

// registered is the range the first call named api registered, from a
// truth file ("ptr", "bytes").
func registered(t *testing.T, truth, api string) correlate.Range {
	t.Helper()
	b, err := os.ReadFile(truth)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		var c struct {
			API   string `json:"api"`
			Ptr   uint64 `json:"ptr"`
			Bytes uint64 `json:"bytes"`
		}
		if json.Unmarshal([]byte(line), &c) == nil && c.API == api {
			return correlate.Range{Start: c.Ptr, End: c.Ptr + c.Bytes}
		}
	}
	t.Fatalf("%s: no %s", truth, api)
	return correlate.Range{}
}

// A process whose exit event was lost (a full ring) is still finished: its
// transfers handed on, OnExit told, its state released, counted — once
// /proc no longer shows it, after everything it sent was read.
func TestLostExitIsReaped(t *testing.T) {
	testenv.RequireRoot(t)
	ref := testenv.RefDir(t)
	dir := t.TempDir()
	for _, f := range []string{"bin/kvpath", "plain/libcudart.so.12", "lib/libcuda.so.1"} {
		copyFile(t, filepath.Join(ref, f), filepath.Join(dir, f))
	}
	kvpath := filepath.Join(dir, "bin/kvpath")

	victim := exec.Command(kvpath, "--scenario", "hicache-load", "--hold", "--truth", filepath.Join(dir, "victim.jsonl"))
	in, err := victim.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := victim.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	victim.Stderr = os.Stderr

	var hold sync.Once
	held, release, armed := make(chan struct{}), make(chan struct{}), make(chan struct{})
	r := startAgent(t, agent.Config{NoShedding: true, Libs: []string{filepath.Join(dir, "lib/libcuda.so.1")},
		OnCall: func(*event.Call) {
			select {
			case <-armed:
				hold.Do(func() { close(held); <-release })
			default:
			}
		}})
	var released sync.Once
	letGo := func() { released.Do(func() { close(release) }) }
	t.Cleanup(letGo)

	if err := victim.Start(); err != nil {
		t.Fatal(err)
	}
	defer victim.Process.Kill()
	stdout := bufio.NewReader(out)
	if line, err := stdout.ReadString('\n'); err != nil || !strings.HasPrefix(line, "ready") {
		t.Fatalf("victim: %q %v", line, err)
	}
	// Once the engine holds the victim, hold the reader and fill the ring
	// (more calls than a 4 MiB ring holds): everything from here to its
	// exit is lost.
	for deadline := time.Now().Add(20 * time.Second); !agent.Holds(r.agent, victim.Process.Pid); {
		if time.Now().After(deadline) {
			t.Fatal("the victim's events were never read")
		}
		time.Sleep(10 * time.Millisecond)
	}
	close(armed)
	fill := exec.Command(kvpath, "--scenario", "callbench", "--iterations", "80000")
	fill.Stderr = os.Stderr
	if err := fill.Run(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("the reader never saw a call to be held at")
	}
	in.Close()
	go io.Copy(io.Discard, stdout)
	if err := victim.Wait(); err != nil {
		t.Fatal(err)
	}
	exitsBefore := r.agent.Stats().Drops.RingFull
	letGo()
	waitExit(t, r.col, victim.Process.Pid)
	st := r.agent.Stats()
	if st.LostExits == 0 {
		t.Errorf("the exit was reaped but not counted: %+v", st)
	}
	t.Logf("ring full %d when the victim exited; lost exits reaped %d", exitsBefore, st.LostExits)
}
