package agent

import (
	"bufio"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/lanewatch/lanewatch/internal/testenv"
	"github.com/lanewatch/lanewatch/probes"
)

// Without Config.Kernels no kernel row is looked up, so none is attached;
// with it every one is.
func TestKernelRows(t *testing.T) {
	all := symbolNames()
	off := kernelRows(all, false)
	for _, p := range probes.Table {
		if got := slices.Contains(off, p.Symbol); got == p.Op.IsKernel() {
			t.Errorf("%s looked up without --kernels: %v", p.Symbol, got)
		}
	}
	if on := kernelRows(all, true); len(on) != len(probes.Table) {
		t.Errorf("%d rows with --kernels, the table has %d", len(on), len(probes.Table))
	}
}

// A host stub is named by the function holding its address in the file its
// process maps there: the reference sgl-kernel stand-in's stub in a held
// kvpath process, found through its maps and kvpath's symbol table (the
// stub is a local symbol named after its kernel, as nvcc's are).
func TestStubNames(t *testing.T) {
	ref := testenv.RefDir(t)
	const stub = "_Z20transfer_kernel_implIXadL_Z20get_global_offset_lfIKcEPT_S3_PKmllllEEXadL_ZS0_IcES3_S3_S5_llllEELb0EEvPKvPvS7_S8_PKlSA_lllllllS5_S5_S5_S5_"
	bin := filepath.Join(ref, "bin", "kvpath")
	cmd := exec.Command(bin, "--scenario", "kernel-copy", "--hold", "--truth", filepath.Join(t.TempDir(), "t.jsonl"))
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { io.WriteString(in, "go\n"); in.Close(); cmd.Process.Kill(); cmd.Wait() }()
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || !strings.HasPrefix(line, "ready") {
		t.Fatalf("kvpath not held: %q %v", line, err)
	}
	go io.Copy(io.Discard, out)
	syms, err := probes.LookupSymbols(bin, []string{stub})
	if err != nil || len(syms) != 1 {
		t.Fatalf("%s: %v %v", bin, syms, err)
	}
	maps, err := probes.ReadMaps("/proc", cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	var addr uint64
	for _, m := range maps {
		off := syms[stub].Offset
		if m.Executable() && strings.HasSuffix(m.Path, "/kvpath") && off >= m.Offset && off-m.Offset < m.End-m.Start {
			addr = m.Start + off - m.Offset
		}
	}
	if addr == 0 {
		t.Fatalf("the stub is in no executable mapping of kvpath: %+v", maps)
	}
	r := newStubResolver("/proc", slog.Default())
	name := r.name
	pid := uint32(cmd.Process.Pid)
	for _, a := range []uint64{addr, addr + 8} {
		if got := name(pid, a); got != stub {
			t.Errorf("stub at %#x named %q", a, got)
		}
	}
	// Kept while it lives, its mappings name its stubs once it is gone
	// (its maps read empty as a zombie, or are no more).
	r.keep(cmd.Process.Pid, maps)
	io.WriteString(in, "go\n")
	in.Close()
	cmd.Wait()
	if got := name(pid, addr); got != stub {
		t.Errorf("after exit, the stub at %#x named %q", addr, got)
	}
	r.forget(cmd.Process.Pid)
	if got := name(pid, addr); got != "" {
		t.Errorf("forgotten, the stub at %#x still named %q", addr, got)
	}
	if got := name(pid, 0x10); got != "" {
		t.Errorf("an unmapped address named %q", got)
	}
	if got := name(1<<30, addr); got != "" {
		t.Errorf("a process that does not exist: %q", got)
	}
	// This test binary is linked without a symbol table (go test -s -w):
	// its functions have no name to give.
	if got := name(uint32(os.Getpid()), uint64(reflect.ValueOf(TestStubNames).Pointer())); got != "" && got != "github.com/lanewatch/lanewatch/agent.TestStubNames" {
		t.Errorf("a Go function named %q", got)
	}
}

// Bad KV-kernel patterns are refused before anything is loaded.
func TestKVKernelSet(t *testing.T) {
	if _, err := KVKernelSet([]string{"(("}); err == nil {
		t.Error("a bad pattern accepted")
	}
	s, err := KVKernelSet(nil)
	if err != nil || !s.Match("transfer_kernel_impl") || s.Match("flash_fwd_kernel") {
		t.Errorf("defaults: %v", err)
	}
}
