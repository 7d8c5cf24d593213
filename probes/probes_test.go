package probes

import (
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/internal/testenv"
)

// collect reads events in the background until stop is called.
func collect(t *testing.T, p *Probes) (stop func() []event.Call) {
	t.Helper()
	var mu sync.Mutex
	var got []event.Call
	quit := make(chan struct{})
	done := make(chan error)
	go func() {
		done <- p.Read(quit, func(c *event.Call) {
			mu.Lock()
			got = append(got, *c)
			mu.Unlock()
		})
	}()
	return func() []event.Call {
		time.Sleep(100 * time.Millisecond) // let the timer-driven drain catch up
		close(quit)
		if err := <-done; err != nil {
			t.Errorf("Read: %v", err)
		}
		mu.Lock()
		defer mu.Unlock()
		return got
	}
}

func ldso(t *testing.T) string {
	t.Helper()
	p, err := filepath.EvalSymlinks("/lib64/ld-linux-x86-64.so.2")
	if err != nil {
		t.Fatalf("dynamic linker: %v", err)
	}
	return p
}

// A process started after the probes are attached is seen from exec to exit,
// and the dynamic linker's notification fires in it.
func TestProcessEventsAndLinkerProbe(t *testing.T) {
	testenv.RequireRoot(t)
	p, err := Load(Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.AttachProcessEvents(); err != nil {
		t.Fatal(err)
	}
	ld := ldso(t)
	syms, err := LookupSymbols(ld, []string{"_dl_debug_state"})
	if err != nil || len(syms) != 1 {
		t.Fatalf("%s: _dl_debug_state: %v %v", ld, syms, err)
	}
	if _, err := p.AttachFile(FileID{Inode: 1}, ld, syms, 0); err != nil {
		t.Fatal(err)
	}
	stop := collect(t, p)
	cmd := exec.Command("/bin/true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	pid := uint32(cmd.Process.Pid)
	var exec_, exit, linker int
	for _, c := range stop() {
		if c.PID != pid {
			continue
		}
		switch {
		case c.Kind == event.KindExec:
			exec_++
		case c.Kind == event.KindExit:
			exit++
		case c.Op == event.OpLinkerUpdate:
			linker++
		}
	}
	if exec_ != 1 || exit != 1 || linker == 0 {
		t.Errorf("pid %d: exec %d, exit %d, linker updates %d; want 1, 1, >0", pid, exec_, exit, linker)
	}
	if d, err := p.Drops(); err != nil || d.Total() != 0 {
		t.Errorf("drops %+v, err %v", d, err)
	}
}

// probedRefCopy loads the programs with opts and attaches sym in lib (a
// path under the reference build) of a copy of the reference path made for
// the caller: its probes see the caller's calls only, not those of every
// process using the shared libraries. It returns the probes (closed at
// the end) and the copy's root.
func probedRefCopy(tb testing.TB, opts Options, lib, sym string) (*Probes, string) {
	tb.Helper()
	testenv.RequireRoot(tb)
	ref := tb.TempDir()
	for _, f := range []string{"bin", "plain", "lib"} {
		if err := os.Mkdir(filepath.Join(ref, f), 0o755); err != nil {
			tb.Fatal(err)
		}
	}
	for _, f := range []string{"bin/kvpath", "plain/libcudart.so.12", "lib/libcuda.so.1"} {
		copyFile(tb, filepath.Join(testenv.RefDir(tb), f), filepath.Join(ref, f))
	}
	p, err := Load(opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { p.Close() })
	path := filepath.Join(ref, lib)
	syms, err := LookupSymbols(path, []string{sym})
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := p.AttachFile(FileID{Inode: 1}, path, syms, 0); err != nil {
		tb.Fatal(err)
	}
	return p, ref
}

// With a ring too small for a burst and no reader, every event is either in
// the ring or counted as dropped: none is lost silently.
func TestDropsAreCounted(t *testing.T) {
	testenv.RequireRoot(t)
	p, ref := probedRefCopy(t, Options{RingBytes: 4096}, "plain/libcudart.so.12", "cudaMemcpyAsync")
	const calls = 3000 + 1              // callbench warms up with one extra call
	callbench(t, ref, "plain", calls-1) // no reader yet: the ring fills up
	in := 0
	p.Read(closedChan(), func(c *event.Call) {
		if c.Symbol == "cudaMemcpyAsync" {
			in++
		}
	})
	d, err := p.Drops()
	if err != nil {
		t.Fatal(err)
	}
	if d.RingFull == 0 || uint64(in)+d.RingFull != calls {
		t.Errorf("%d events in the ring + %d counted drops, want %d calls with some dropped", in, d.RingFull, calls)
	}
}

func closedChan() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}
