package agent_test

import (
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lanewatch/lanewatch/agent"
	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/internal/testenv"
	"github.com/lanewatch/lanewatch/selftest"
)

// A library no process maps any more has its probes detached once the
// grace passes (issue 13, the soak's link growth; docs/design.md, "Attach
// and discovery"): N private copies of the reference libraries, each used
// by one kvpath process, leave no link behind; a copy a held process still
// maps keeps its probes and every copy of it is traced; a copy mapped again
// after its release is attached again and traced exactly.
func TestReleaseUnmappedLibraries(t *testing.T) {
	testenv.RequireRoot(t)
	ref := testenv.RefDir(t)
	const copies = 8
	r := startAgent(t, agent.Config{RescanInterval: 200 * time.Millisecond, ReleaseAfter: time.Second})

	held := newCopy(t, ref)
	heldProc := startHeld(t, r, held)

	baseLinks, baseFDs, baseFiles := r.agent.Stats().Links, linkFDs(t), agent.ProbedFiles(r.agent)
	var dirs []string
	var procs []*heldKV
	for range copies {
		dir := newCopy(t, ref)
		dirs = append(dirs, dir)
		procs = append(procs, startHeld(t, r, dir))
	}
	peak, ours := r.agent.Stats().Links, 0
	for _, dir := range dirs {
		ours += agent.LinksIn(r.agent, driverIn(dir))
	}
	for _, p := range procs {
		p.finish(t, r)
	}

	// Every copy's links go once no process maps it and the grace passed.
	deadline := time.Now().Add(30 * time.Second)
	for left := ours; left > 0; {
		left = 0
		for _, dir := range dirs {
			left += agent.LinksIn(r.agent, driverIn(dir))
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d links of %d unmapped library copies still attached 30 s after their processes exited (grace 1 s); links %d → %d → %d",
				left, ours, copies, baseLinks, peak, r.agent.Stats().Links)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Back to the baseline, unless other processes on this host made the
	// agent probe or release other libraries meanwhile (then per file only).
	var after, afterFDs int
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		after, afterFDs = r.agent.Stats().Links, linkFDs(t)
		if !maps.Equal(baseFiles, agent.ProbedFiles(r.agent)) {
			t.Logf("other libraries probed or released meanwhile: links %d (fds %d), baseline %d (%d)", after, afterFDs, baseLinks, baseFDs)
			break
		}
		if after == baseLinks && afterFDs == baseFDs {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("links %d (link fds %d) 10 s after the release, want the baseline %d (%d)", after, afterFDs, baseLinks, baseFDs)
		}
	}
	if n := r.agent.LibraryDetaches(); n < copies {
		t.Errorf("library detaches = %d, want at least %d", n, copies)
	}
	if !strings.Contains(r.logs.String(), "probes detached") {
		t.Error("no log line for a detached library")
	}

	// The held process's library kept its probes all along: every copy traced.
	if agent.LinksIn(r.agent, driverIn(held)) == 0 {
		t.Fatalf("%s detached while a process maps it", driverIn(held))
	}
	for _, l := range strings.Split(r.logs.String(), "\n") {
		if strings.Contains(l, "probes detached") && strings.Contains(l, driverIn(held)) {
			t.Errorf("a library a live process maps was detached: %s", l)
		}
	}
	heldProc.finish(t, r)

	// Mapped again after its release: attached again, traced exactly.
	startHeld(t, r, dirs[0]).finish(t, r)
	t.Logf("%d library copies: links %d (fds %d) with one held → %d with all mapped (%d theirs) → %d (fds %d) after release; %d detaches",
		copies, baseLinks, baseFDs, peak, ours, after, afterFDs, r.agent.LibraryDetaches())
}

// newCopy copies kvpath and the reference libraries to fresh inodes.
func newCopy(t *testing.T, ref string) string {
	dir := t.TempDir()
	for _, f := range []string{"bin/kvpath", "plain/libcudart.so.12", "lib/libcuda.so.1"} {
		copyFile(t, filepath.Join(ref, f), filepath.Join(dir, f))
	}
	return dir
}

func driverIn(dir string) string { return filepath.Join(dir, "lib/libcuda.so.1") }

// heldKV is a kvpath process holding before its copies until finish.
type heldKV struct {
	cmd   *exec.Cmd
	in    io.WriteCloser
	truth string
}

// startHeld starts the copy's kvpath and waits until its driver is probed:
// every copy it makes comes after.
func startHeld(t *testing.T, r *running, dir string) *heldKV {
	t.Helper()
	h := &heldKV{truth: filepath.Join(dir, "truth.jsonl")}
	os.Remove(h.truth)
	h.cmd = exec.Command(filepath.Join(dir, "bin/kvpath"), "--scenario", "hicache-load", "--hold", "--truth", h.truth)
	h.in = startReady(t, h.cmd)
	deadline := time.Now().Add(20 * time.Second)
	for r.agent.AttachedProbes()[driverIn(dir)] == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%s not probed 20 s after a process mapped it", driverIn(dir))
		}
		time.Sleep(20 * time.Millisecond)
	}
	return h
}

// finish releases the process and checks that each of its copies was
// traced, once, with host memory never pageable (the pool may be
// registered before the attach: unknown then), unless the ring lost events.
func (h *heldKV) finish(t *testing.T, r *running) {
	t.Helper()
	h.in.Close()
	if err := h.cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	waitExit(t, r.col, h.cmd.Process.Pid)
	calls, err := selftest.ReadTruthFile(h.truth)
	if err != nil {
		t.Fatal(err)
	}
	type key struct{ src, dst, bytes uint64 }
	left := map[key]int{}
	want := 0
	for _, c := range calls {
		if c.IsCopy() {
			left[key{c.Src, c.Dst, c.Bytes}]++
			want++
		}
	}
	got := r.col.Take(uint32(h.cmd.Process.Pid))
	for _, g := range got {
		k := key{g.Src.Addr, g.Dst.Addr, g.Bytes}
		if left[k] == 0 || g.HostMem == event.MemPageable {
			t.Errorf("pid %d: traced a copy it did not make, or pageable: %d B %#x→%#x %v", h.cmd.Process.Pid, g.Bytes, g.Src.Addr, g.Dst.Addr, g.HostMem)
		}
		left[k]--
	}
	if len(got) != want && r.agent.Stats().Drops.RingFull == 0 || want == 0 {
		t.Errorf("pid %d: traced %d of %d copies", h.cmd.Process.Pid, len(got), want)
	}
}

// linkFDs counts this process's BPF link descriptors (the agent's own).
func linkFDs(t *testing.T) int {
	entries, err := os.ReadDir("/proc/self/fdinfo")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join("/proc/self/fdinfo", e.Name()))
		if err == nil && strings.Contains(string(b), "\nlink_id:") {
			n++
		}
	}
	return n
}
