package agent_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/lanewatch/lanewatch/agent"
	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/internal/testenv"
	"github.com/lanewatch/lanewatch/probes"
	"github.com/lanewatch/lanewatch/selftest"
)

// A library whose first process exits between the scan of its maps and the
// attach is not lost (issue 13 #1; docs/design.md, "Attach and discovery"):
// it is reported unprobed, with why, and the next process mapping the same
// file gets it probed and every copy of that process traced. The test ends
// the first process right after the agent read its maps, the window the
// issue's short-lived process fell into by chance.
func TestFirstProcessGoneBeforeAttach(t *testing.T) {
	testenv.RequireRoot(t)
	ref := testenv.RefDir(t)
	dir := t.TempDir() // fresh inodes: no other agent or test has them probed
	for _, f := range []string{"bin/kvpath", "plain/libcudart.so.12", "lib/libcuda.so.1"} {
		copyFile(t, filepath.Join(ref, f), filepath.Join(dir, f))
	}
	kvpath, driver := filepath.Join(dir, "bin/kvpath"), filepath.Join(dir, "lib/libcuda.so.1")

	var victim atomic.Int64 // the first process that mapped the driver, ended in the scan
	killed := make(chan struct{})
	r := startAgent(t, agent.Config{}, func(a *agent.Agent) {
		agent.SetAfterMaps(a, func(pid int, maps []probes.Mapping) {
			if !mapsFile(maps, driver) || !victim.CompareAndSwap(0, int64(pid)) {
				return
			}
			syscall.Kill(pid, syscall.SIGKILL)
			// Gone for the agent once its files cannot be reached any more
			// (a zombie has neither root nor map_files).
			for i := 0; i < 500; i++ {
				if _, err := os.Stat(filepath.Join("/proc", strconv.Itoa(pid), "root", driver)); err != nil {
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			close(killed)
		})
	})

	first := exec.Command(kvpath, "--scenario", "hicache-load", "--hold", "--truth", filepath.Join(dir, "first.jsonl"))
	firstIn, err := first.StdinPipe() // left open: it holds until killed
	if err != nil {
		t.Fatal(err)
	}
	defer firstIn.Close()
	if err := first.Start(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-killed:
	case <-time.After(30 * time.Second):
		first.Process.Kill()
		t.Fatal("the agent never scanned the first process with the driver mapped")
	}
	first.Wait()
	if int(victim.Load()) != first.Process.Pid {
		t.Fatalf("ended pid %d, not the first process %d", victim.Load(), first.Process.Pid)
	}

	// A blind spot, said: listed unprobed with its reason, counted by library.
	u := waitUnprobed(t, r.agent, driver, true)
	if u.Reason == "" || u.Failures == 0 {
		t.Errorf("unprobed %s without a reason or a failure: %+v", driver, u)
	}
	if n := r.agent.AttachFailures()["libcuda.so.1"]; n == 0 {
		t.Errorf("attach failures of libcuda.so.1 = 0, want the failed try counted; all: %v", r.agent.AttachFailures())
	}

	// The next process mapping the same file gets it probed.
	truth := filepath.Join(dir, "second.jsonl")
	second := exec.Command(kvpath, "--scenario", "hicache-load", "--hold", "--truth", truth)
	in := startReady(t, second)
	deadline := time.Now().Add(20 * time.Second)
	for r.agent.AttachedProbes()[driver] == 0 {
		if time.Now().After(deadline) {
			in.Close()
			second.Wait()
			t.Fatalf("%s not probed 20 s after a second process mapped it; attached: %v", driver, r.agent.AttachedProbes())
		}
		time.Sleep(20 * time.Millisecond)
	}
	waitUnprobed(t, r.agent, driver, false)
	in.Close() // releases it: every copy comes after its driver was probed
	if err := second.Wait(); err != nil {
		t.Fatal(err)
	}
	waitExit(t, r.col, second.Process.Pid)

	calls, err := selftest.ReadTruthFile(truth)
	if err != nil {
		t.Fatal(err)
	}
	var want []selftest.TruthCall
	for _, c := range calls {
		if c.IsCopy() {
			want = append(want, c)
		}
	}
	got := r.col.Take(uint32(second.Process.Pid))
	kinds := map[event.MemKind]int{}
	type key struct{ src, dst, bytes uint64 }
	left := map[key]int{}
	for _, w := range want {
		left[key{w.Src, w.Dst, w.Bytes}]++
	}
	for _, g := range got {
		kinds[g.HostMem]++
		k := key{g.Src.Addr, g.Dst.Addr, g.Bytes}
		if left[k] == 0 || g.Direction != correlate.DirH2D && g.Direction != correlate.DirD2H {
			t.Errorf("traced a copy the process did not make: %d B %s %#x→%#x", g.Bytes, g.Direction, g.Src.Addr, g.Dst.Addr)
		}
		left[k]--
	}
	// Its pool was registered before the hold, maybe before the attach:
	// pinned or unknown, never pageable (docs/design.md, "Late attach").
	// Every copy is traced, unless the ring lost some (an outside flood
	// on a busy machine): then the loss is counted, never silent.
	if kinds[event.MemPageable] != 0 || len(got) == 0 || len(got) < len(want) && r.agent.Stats().Drops.RingFull == 0 {
		t.Errorf("second process: traced %d of %d copies, host memory %v, drops %+v", len(got), len(want), kinds, r.agent.Stats().Drops)
	}
	t.Logf("first process %d ended before the attach (%s); second: %d of %d copies traced, host memory %v", first.Process.Pid, u.Reason, len(got), len(want), kinds)
}

// mapsFile says whether a process maps path executable (ld.so maps a
// library whole first, its code after).
func mapsFile(maps []probes.Mapping, path string) bool {
	for _, m := range maps {
		if m.Path == path && m.Executable() {
			return true
		}
	}
	return false
}

// waitUnprobed waits until path is (listed) or is not (!listed) among the
// agent's unprobed libraries, and returns its entry.
func waitUnprobed(t *testing.T, a *agent.Agent, path string, listed bool) agent.UnprobedLibrary {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var found *agent.UnprobedLibrary
		all := a.Unprobed()
		for i := range all {
			if all[i].Path == path {
				found = &all[i]
			}
		}
		if (found != nil) == listed {
			if found != nil {
				return *found
			}
			return agent.UnprobedLibrary{}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s listed unprobed: %v, want %v; unprobed: %+v", path, found != nil, listed, all)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
