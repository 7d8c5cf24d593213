package probes

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/internal/testenv"
)

// A provider whose data-path functions are static (hidden), like every
// rdma-core provider, and a program that builds a struct ibv_context with
// the real verbs.h layout whose ops point at them — or, with mode 1 and 2,
// at the middle of a function and at data.
const fakeProvider = `
#include <infiniband/verbs.h>
#include <stddef.h>
static int ps(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad) { (void)wr; (void)bad; return qp ? 1 : 0; }
static int pr(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad) { (void)wr; (void)bad; return qp ? 2 : 0; }
static int pc(struct ibv_cq *cq, int n, struct ibv_wc *wc) {
	for (int i = 0; i < n; i++) {
		wc[i].wr_id = 100 + i; wc[i].status = IBV_WC_SUCCESS; wc[i].opcode = IBV_WC_RECV_RDMA_WITH_IMM;
		wc[i].byte_len = 4096 * (i + 1); wc[i].imm_data = 0xabc0 + i; wc[i].qp_num = 77; wc[i].wc_flags = IBV_WC_WITH_IMM;
	}
	return cq ? n : 0;
}
static char blob[64] = "data, not code";
__attribute__((visibility("default"))) struct ibv_context *fake_ctx(int mode) {
	static struct ibv_context c;
	c.ops.post_send = ps; c.ops.post_recv = pr; c.ops.poll_cq = pc;
	if (mode == 1) c.ops.post_send = (void *)((char *)ps + 1);
	if (mode == 2) c.ops.post_recv = (void *)blob;
	return &c;
}
`

const fakeMain = `
#include <infiniband/verbs.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
struct ibv_context *fake_ctx(int mode);
int main(int argc, char **argv) {
	struct ibv_context *c = fake_ctx(atoi(argv[1]));
	printf("%p %zu %zu %zu\n", (void *)c, offsetof(struct ibv_context, ops.post_send),
	       offsetof(struct ibv_context, ops.post_recv), offsetof(struct ibv_context, ops.poll_cq));
	fflush(stdout);
	getchar(); /* the test attaches, then lets the data path run */
	struct ibv_qp qp = {.context = c, .qp_num = 77};
	struct ibv_cq cq = {.context = c};
	struct ibv_sge sge[3] = {{0x1000, 4096, 11}, {0x3000, 8192, 11}, {0x9000, 100, 12}};
	struct ibv_send_wr w2 = {.wr_id = 2, .sg_list = &sge[2], .num_sge = 1, .opcode = IBV_WR_RDMA_READ};
	struct ibv_send_wr w1 = {.wr_id = 1, .next = &w2, .sg_list = sge, .num_sge = 2,
		.opcode = IBV_WR_RDMA_WRITE_WITH_IMM, .send_flags = IBV_SEND_SIGNALED, .imm_data = 0x1234};
	w1.wr.rdma.remote_addr = 0x7f0000001000; w1.wr.rdma.rkey = 0x5151;
	w2.wr.rdma.remote_addr = 0x7f0000009000; w2.wr.rdma.rkey = 0x5252;
	struct ibv_send_wr *bad;
	struct ibv_recv_wr r1 = {.wr_id = 9, .sg_list = sge, .num_sge = 1}, *rbad;
	struct ibv_wc wc[4];
	int got = c->ops.post_send(&qp, &w1, &bad) + c->ops.post_recv(&qp, &r1, &rbad) +
		  c->ops.poll_cq(&cq, 3, wc) + c->ops.poll_cq(&cq, 0, wc);
	printf("%d\n", got);
	fflush(stdout);
	getchar();
	return 0;
}
`

func buildFakeProvider(t *testing.T) (dir, lib, debugLib string) {
	t.Helper()
	if _, err := os.Stat("/usr/include/infiniband/verbs.h"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("libibverbs-dev is missing (verbs.h)")
		}
		t.Skip("libibverbs-dev is missing")
	}
	dir = t.TempDir()
	os.WriteFile(filepath.Join(dir, "prov.c"), []byte(fakeProvider), 0o644)
	os.WriteFile(filepath.Join(dir, "main.c"), []byte(fakeMain), 0o644)
	debugLib = filepath.Join(dir, "debug", "libfakeprov.so")
	os.MkdirAll(filepath.Dir(debugLib), 0o755)
	lib = filepath.Join(dir, "libfakeprov.so")
	for _, args := range [][]string{
		{"gcc", "-O2", "-fPIC", "-shared", "-fcf-protection=full", "-fvisibility=hidden", "-o", debugLib, filepath.Join(dir, "prov.c")},
		{"cp", debugLib, lib},
		{"strip", "--strip-all", lib},
		{"gcc", "-O2", "-o", filepath.Join(dir, "fake"), filepath.Join(dir, "main.c"), "-L" + dir, "-lfakeprov", "-Wl,-rpath," + dir},
	} {
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
	}
	return dir, lib, debugLib
}

// startFake runs the program and returns its pid, the context address and
// the offsets the compiler gives the ops fields.
func startFake(t *testing.T, dir string, mode int) (int, uint64, [3]uint64) {
	pid, ctx, offs, _ := startFakeIO(t, dir, mode)
	return pid, ctx, offs
}

// fakeIO lets a test release the fake program's data path and read what it printed.
type fakeIO struct {
	in  io.Writer
	out *bufio.Reader
}

func startFakeIO(t *testing.T, dir string, mode int) (int, uint64, [3]uint64, fakeIO) {
	t.Helper()
	cmd := exec.Command(filepath.Join(dir, "fake"), fmt.Sprint(mode))
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); cmd.Wait() })
	rd := bufio.NewReader(stdout)
	line, err := rd.ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	var vals [4]uint64
	fields := strings.Fields(line)
	for i := range vals {
		v, err := strconv.ParseUint(fields[min(i, len(fields)-1)], 0, 64)
		if err != nil || len(fields) != 4 {
			t.Fatalf("%q: %v", line, err)
		}
		vals[i] = v
	}
	return cmd.Process.Pid, vals[0], [3]uint64{vals[1], vals[2], vals[3]}, fakeIO{stdin, rd}
}

func TestResolveProviderOps(t *testing.T) {
	testenv.RequireRoot(t) // /proc/PID/mem of another process
	dir, lib, debugLib := buildFakeProvider(t)
	if syms, _ := LookupSymbols(lib, []string{"ps", "pr", "pc"}); len(syms) != 0 {
		t.Fatalf("the stripped provider still names its functions: %v", syms)
	}
	pid, ctx, offs := startFake(t, dir, 0)
	if offs != [3]uint64{ctxOpsPostSend, ctxOpsPostRecv, ctxOpsPollCQ} {
		t.Fatalf("verbs.h puts post_send/post_recv/poll_cq at %v, the agent assumes %v", offs,
			[3]uint64{ctxOpsPostSend, ctxOpsPostRecv, ctxOpsPollCQ})
	}
	fns, err := ResolveProviderOps("/proc", pid, ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The unstripped copy has the same layout and names the static functions.
	want, err := LookupSymbols(debugLib, []string{"ps", "pr", "pc"})
	if err != nil || len(want) != 3 {
		t.Fatalf("debug symbols: %v %v", want, err)
	}
	for i, name := range []string{"ps", "pr", "pc"} {
		if fns[i].FileOffset != want[name].Offset || fns[i].Path != lib {
			t.Errorf("%s: resolved %s+%#x, want %s+%#x", fns[i].Row, fns[i].Path, fns[i].FileOffset, lib, want[name].Offset)
		}
	}
}

// A pointer into the middle of a function, or at data, is refused with a
// message naming it; nothing is attached.
func TestResolveProviderOpsRejectsWrongPointers(t *testing.T) {
	testenv.RequireRoot(t)
	dir, _, _ := buildFakeProvider(t)
	for mode, want := range map[int]string{1: "ops.post_send", 2: "ops.post_recv"} {
		pid, ctx, _ := startFake(t, dir, mode)
		_, err := ResolveProviderOps("/proc", pid, ctx)
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "not attached") {
			t.Errorf("mode %d: err %v, want a refusal naming %s", mode, err, want)
		}
		t.Logf("mode %d: %v", mode, err)
	}
}

// The provider probes, attached at the resolved offsets of a stripped
// library, decode a work-request chain (opcode, bytes over every SGE,
// remote address, rkey, immediate, QP number), a receive and the
// completions a poll returned; an empty poll emits nothing.
func TestProviderProbesDecode(t *testing.T) {
	testenv.RequireRoot(t)
	dir, lib, _ := buildFakeProvider(t)
	pid, ctx, _, io := startFakeIO(t, dir, 0)
	fns, err := ResolveProviderOps("/proc", pid, ctx)
	if err != nil {
		t.Fatal(err)
	}
	p, err := Load(Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	syms := map[string]Symbol{}
	for _, f := range fns {
		syms[f.Row] = Symbol{Name: f.Row, Offset: f.FileOffset}
	}
	af, err := p.AttachFile(fns[0].File, lib, syms, pid)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("sites: %v", af.Sites)
	stop := collect(t, p)
	fmt.Fprintln(io.in)
	if line, err := io.out.ReadString('\n'); err != nil || strings.TrimSpace(line) != "6" {
		t.Fatalf("data path returned %q, %v", line, err)
	}
	var wrs, wcs []event.Call
	for _, c := range stop() {
		switch {
		case c.PID != uint32(pid):
		case c.Kind == event.KindWR:
			wrs = append(wrs, c)
		case c.Kind == event.KindWC:
			wcs = append(wcs, c)
		}
	}
	if len(wrs) != 3 || len(wcs) != 3 {
		t.Fatalf("%d WR events, %d completions; want 3 and 3", len(wrs), len(wcs))
	}
	w := wrs[0]
	if w.Op != event.OpPostSend || w.RDMA.WRID != 1 || w.RDMA.Opcode != 1 /* IBV_WR_RDMA_WRITE_WITH_IMM */ ||
		w.RDMA.SendFlags != 2 /* IBV_SEND_SIGNALED */ || w.Bytes != 4096+8192 || w.RDMA.NumSGE != 2 ||
		w.RDMA.RemoteAddr != 0x7f0000001000 || w.RDMA.RKey != 0x5151 || w.RDMA.Imm != 0x1234 ||
		w.RDMA.Local != 0x1000 || w.RDMA.LKey != 11 || w.RDMA.QPNum != 77 || w.BatchIndex != 0 {
		t.Errorf("first WR: %+v %+v", w, w.RDMA)
	}
	if w := wrs[1]; w.RDMA.WRID != 2 || w.RDMA.Opcode != 4 /* IBV_WR_RDMA_READ */ || w.Bytes != 100 || w.RDMA.RKey != 0x5252 || w.BatchIndex != 1 {
		t.Errorf("second WR: %+v", w.RDMA)
	}
	if w := wrs[2]; w.Op != event.OpPostRecv || w.RDMA.WRID != 9 || w.Bytes != 4096 {
		t.Errorf("recv WR: %+v", w.RDMA)
	}
	for i, c := range wcs {
		if c.RDMA.WRID != uint64(100+i) || c.RDMA.Status != 0 || c.RDMA.Opcode != 129 /* IBV_WC_RECV_RDMA_WITH_IMM */ ||
			c.Bytes != uint64(4096*(i+1)) || c.RDMA.Imm != uint32(0xabc0+i) || c.RDMA.QPNum != 77 || c.RDMA.WCFlags != 2 {
			t.Errorf("completion %d: bytes %d %+v", i, c.Bytes, c.RDMA)
		}
	}
}
