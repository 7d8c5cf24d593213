package agent_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lanewatch/lanewatch/agent"
	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/internal/testenv"
	"github.com/lanewatch/lanewatch/probes"
	"github.com/lanewatch/lanewatch/selftest"
)

// A process started after `agent run` (no --lib), its CUDA libraries in
// directories only its LD_LIBRARY_PATH names (fresh copies no process
// mapped before), is traced from its first CUDA call: its thread waits at
// ld.so's notification until the agent probed them (issue 20 #4;
// docs/design.md, "Attach and discovery"). Every copy of its truth is
// traced, none unknown for late_attach, the pinned pool pinned — by
// construction (the hold ends when the files are known, not after a
// time), so also with every other CPU busy.
func TestProcessAfterAgentTracedFromFirstCall(t *testing.T) {
	testenv.RequireRoot(t)
	ref := testenv.RefDir(t)
	busy(t)
	r := startAgent(t, agent.Config{RootFS: "-"})
	before := r.agent.Stats().Holds
	if !before.Available {
		t.Fatal("this kernel refused the hold program (sleepable uprobe_multi, task VMA iterator: Linux 6.7+)")
	}
	dir := t.TempDir()
	copyFile(t, filepath.Join(ref, "plain/libcudart.so.12"), filepath.Join(dir, "sdk/libcudart.so.12"))
	copyFile(t, filepath.Join(ref, "lib/libcuda.so.1"), filepath.Join(dir, "driver/libcuda.so.1"))
	ldPath := filepath.Join(dir, "sdk") + ":" + filepath.Join(dir, "driver")
	pid, got, want := runWithLibraryPath(t, r, ref, ldPath, filepath.Join(dir, "truth.jsonl"))
	checkFromFirstCall(t, pid, got, want)

	after := r.agent.Stats().Holds
	if after.Holds <= before.Holds || after.Bound != before.Bound || after.AgentGone != before.AgentGone {
		t.Errorf("holds %+v → %+v: want at least one, none ended by the bound or the agent's absence", before, after)
	}
	t.Logf("%d of %d copies traced from the first call; holds %d, held %.1f ms in all, longest %.1f ms",
		len(got), len(want), after.Holds-before.Holds, float64(after.HeldNS-before.HeldNS)/1e6, float64(after.MaxNS)/1e6)
}

// The host's driver, found at start through the ld.so.cache of the root
// filesystem (--path.rootfs), is probed before any process is seen: a
// process mapping that file is observed from its start, every copy traced,
// none late.
func TestDriverProbedAtStart(t *testing.T) {
	testenv.RequireRoot(t)
	ldconfig, err := exec.LookPath("ldconfig")
	if err != nil {
		t.Fatal("no ldconfig to write the root's ld.so.cache")
	}
	if runtime.GOARCH != "amd64" {
		t.Skip("the root's cache is written for x86-64's ld.so")
	}
	ref := testenv.RefDir(t)
	root := t.TempDir()
	driver := filepath.Join(root, "opt/nvidia/lib/libcuda.so.1")
	copyFile(t, filepath.Join(ref, "lib/libcuda.so.1"), driver)
	if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "etc/ld.so.conf"), []byte("/opt/nvidia/lib\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(ldconfig, "-r", root).CombinedOutput(); err != nil {
		t.Fatalf("ldconfig -r %s: %v\n%s", root, err, out)
	}
	r := startAgent(t, agent.Config{RootFS: root})
	if r.agent.AttachedProbes()[driver] == 0 {
		t.Fatalf("the driver %s, named by %s/etc/ld.so.cache, was not probed at start; attached: %v", driver, root, r.agent.AttachedProbes())
	}
	dir := t.TempDir()
	copyFile(t, filepath.Join(ref, "plain/libcudart.so.12"), filepath.Join(dir, "sdk/libcudart.so.12"))
	ldPath := filepath.Join(dir, "sdk") + ":" + filepath.Dir(driver)
	pid, got, want := runWithLibraryPath(t, r, ref, ldPath, filepath.Join(dir, "truth.jsonl"))
	checkFromFirstCall(t, pid, got, want)
}

// busy keeps every other CPU busy for the test: the hold must not depend
// on the agent getting a CPU soon.
func busy(t *testing.T) {
	for range max(1, runtime.NumCPU()-1) {
		spin := exec.Command("sh", "-c", "while :; do :; done")
		if err := spin.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { spin.Process.Kill(); spin.Wait() })
	}
}

// runWithLibraryPath runs kvpath's hicache-load (a pinned pool, layered
// loads) with LD_LIBRARY_PATH ldPath, and returns its pid, its records and
// its truth's copies.
func runWithLibraryPath(t *testing.T, r *running, ref, ldPath, truth string) (int, []correlate.Transfer, []selftest.TruthCall) {
	t.Helper()
	cmd := exec.Command(filepath.Join(ref, "bin/kvpath"), "--scenario", "hicache-load", "--truth", truth)
	cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+ldPath)
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	waitExit(t, r.col, pid)
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
	return pid, r.col.Take(uint32(pid)), want
}

// checkFromFirstCall compares a process's records with its truth: every
// copy traced, with the host memory the truth expects, none unknown for
// late_attach.
func checkFromFirstCall(t *testing.T, pid int, got []correlate.Transfer, want []selftest.TruthCall) {
	t.Helper()
	type key struct{ src, dst, bytes uint64 }
	wantMem := map[key][]string{}
	for _, w := range want {
		k := key{w.Src, w.Dst, w.Bytes}
		wantMem[k] = append(wantMem[k], w.ExpectHostMem)
	}
	kinds, late := map[event.MemKind]int{}, 0
	for _, g := range got {
		kinds[g.HostMem]++
		if g.HostMemReason == correlate.ReasonLateAttach || g.Src.Reason == correlate.ReasonLateAttach || g.Dst.Reason == correlate.ReasonLateAttach {
			late++
		}
		k := key{g.Src.Addr, g.Dst.Addr, g.Bytes}
		if len(wantMem[k]) == 0 {
			t.Errorf("pid %d: a record the truth does not have: %d B %#x→%#x", pid, g.Bytes, g.Src.Addr, g.Dst.Addr)
			continue
		}
		if exp := wantMem[k][0]; exp != "" && string(g.HostMem) != exp {
			t.Errorf("pid %d: %d B %#x→%#x host memory %s (%s), truth %s", pid, g.Bytes, g.Src.Addr, g.Dst.Addr, g.HostMem, g.HostMemReason, exp)
		}
		wantMem[k] = wantMem[k][1:]
	}
	if late != 0 || len(got) != len(want) || kinds[event.MemPinned] == 0 {
		t.Errorf("pid %d: %d records of %d copies, %d late_attach, host memory %v: want every copy, none late, the pool pinned", pid, len(got), len(want), late, kinds)
	}
}

// The bound, firing: the agent's scan of a held process takes longer than
// the hold's bound (made so: it sleeps past it), so the process goes on
// before its driver is probed. The hold is counted as ended by the bound
// and /readyz says so; the pool it registered unseen is unknown
// (late_attach), never pageable.
func TestHoldBoundIsLateNeverPageable(t *testing.T) {
	testenv.RequireRoot(t)
	ref := testenv.RefDir(t)
	dir := t.TempDir()
	copyFile(t, filepath.Join(ref, "plain/libcudart.so.12"), filepath.Join(dir, "sdk/libcudart.so.12"))
	driver := filepath.Join(dir, "driver/libcuda.so.1")
	copyFile(t, filepath.Join(ref, "lib/libcuda.so.1"), driver)
	var slept atomic.Bool
	// The verdict waits until the process made its copies and exited, so
	// every copy is recorded before the agent decides it was late: the
	// records must not depend on which comes first.
	copied := make(chan struct{})
	var copiedOnce sync.Once
	letVerdict := func() { copiedOnce.Do(func() { close(copied) }) }
	t.Cleanup(letVerdict)
	r := startAgent(t, agent.Config{RootFS: "-"}, func(a *agent.Agent) {
		agent.SetAfterMaps(a, func(pid int, maps []probes.Mapping) {
			if mapsFile(maps, driver) && slept.CompareAndSwap(false, true) {
				time.Sleep(probes.HoldBound + time.Second)
			}
		})
		agent.SetBeforeVerdict(a, func(int) {
			select {
			case <-copied:
			case <-time.After(30 * time.Second):
			}
		})
	})
	before := r.agent.Stats().Holds
	cmd := exec.Command(filepath.Join(ref, "bin/kvpath"), "--scenario", "hicache-load", "--hold", "--truth", filepath.Join(dir, "truth.jsonl"))
	cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+filepath.Join(dir, "sdk")+":"+filepath.Dir(driver))
	in := startReady(t, cmd)
	deadline := time.Now().Add(30 * time.Second)
	for r.agent.AttachedProbes()[driver] == 0 {
		if time.Now().After(deadline) {
			in.Close()
			cmd.Wait()
			t.Fatalf("%s never probed", driver)
		}
		time.Sleep(20 * time.Millisecond)
	}
	in.Close() // its copies now: after the probes, from the pool registered before them
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	waitExit(t, r.col, cmd.Process.Pid)
	letVerdict()
	got := r.col.Take(uint32(cmd.Process.Pid))
	kinds, late := map[event.MemKind]int{}, 0
	for _, g := range got {
		kinds[g.HostMem]++
		if g.HostMemReason == correlate.ReasonLateAttach {
			late++
		}
	}
	after := r.agent.Stats().Holds
	if after.Bound != before.Bound+1 {
		t.Errorf("holds ended by the bound: %d → %d, want one more", before.Bound, after.Bound)
	}
	if len(got) == 0 || kinds[event.MemPageable] != 0 || late != len(got) {
		t.Errorf("%d records, host memory %v, %d late_attach: want every one unknown for late_attach, none pageable", len(got), kinds, late)
		// Seen once in 4 CI runs, never in 30 here: the agent's own account
		// of the process (its scans, attaches and late decision) says why.
		for _, l := range strings.Split(r.logs.String(), "\n") {
			if strings.Contains(l, fmt.Sprintf("pid=%d ", cmd.Process.Pid)) || strings.Contains(l, "driver/libcuda.so.1") {
				t.Log(l)
			}
		}
	}
	if r.agent.HoldBoundHits() != after.Bound {
		t.Errorf("HoldBoundHits %d, stats %d", r.agent.HoldBoundHits(), after.Bound)
	}
	t.Logf("the hold ended by its bound (longest hold %.0f ms); %d records, all unknown (late_attach)", float64(after.MaxNS)/1e6, len(got))
}
