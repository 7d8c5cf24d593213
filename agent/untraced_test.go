package agent

import (
	"bufio"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/internal/testenv"
	"github.com/lanewatch/lanewatch/probes"
)

// kvDirect posts through mlx5 direct verbs, built against rdma-core's real
// header and libmlx5 (libibverbs-dev).
const kvDirect = `
#include <infiniband/mlx5dv.h>
int kv_direct_attach(struct ibv_qp *qp) {
	struct mlx5dv_qp dv;
	struct mlx5dv_obj obj = { .qp = { .in = qp, .out = &dv } };
	return mlx5dv_init_obj(&obj, MLX5DV_OBJ_QP);
}
`

// kvLoader dlopens argv[1] (every import bound), says so, and waits for
// its stdin to close.
const kvLoader = `
#include <dlfcn.h>
#include <stdio.h>
#include <unistd.h>
int main(int argc, char **argv) {
	if (!dlopen(argv[1], RTLD_NOW)) { fprintf(stderr, "%s\n", dlerror()); return 1; }
	printf("loaded\n");
	fflush(stdout);
	char c;
	while (read(0, &c, 1) > 0) {}
	return 0;
}
`

func gcc(t *testing.T, dir, out, src string, args ...string) string {
	t.Helper()
	if _, err := exec.LookPath("gcc"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("gcc is required under CI=true: %v", err)
		}
		t.Skip("gcc not installed")
	}
	c := filepath.Join(dir, out+".c")
	if err := os.WriteFile(c, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, out)
	if b, err := exec.Command("gcc", append([]string{"-o", bin, c}, args...)...).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, b)
	}
	return bin
}

// A real process that dlopens an object importing mlx5dv_init_obj is
// named by the scan that reads its maps, with the object and the reason,
// through the same verdict the attach reads (one read per file); once it
// exits, the next full scan forgets it.
func TestScanNamesUntracedProcess(t *testing.T) {
	testenv.RequireRoot(t)
	if _, err := os.Stat("/usr/include/infiniband/mlx5dv.h"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	dir := t.TempDir()
	lib := gcc(t, dir, "libkvdirect.so", kvDirect, "-shared", "-fPIC", "-lmlx5", "-libverbs")
	loader := gcc(t, dir, "kvloader", kvLoader, "-ldl")

	a, err := New(Config{Sink: correlate.SinkFunc(func(*correlate.Transfer) {}), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer a.close()

	cmd := exec.Command(loader, lib)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { stdin.Close(); cmd.Wait() }()
	if line, err := bufio.NewReader(stdout).ReadString('\n'); line != "loaded\n" {
		t.Fatalf("loader said %q (%v)", line, err)
	}
	pid := cmd.Process.Pid

	gen := a.beginFullScan()
	if _, _, _, err := a.scanProcess(pid); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := a.scanProcess(os.Getpid()); err != nil { // maps none
		t.Fatal(err)
	}
	a.endFullScan(gen)
	got := a.Untraced()
	if len(got) != 1 || got[0].PID != pid || len(got[0].Objects) != 1 {
		t.Fatalf("untraced %+v, want pid %d with %s", got, pid, lib)
	}
	u := got[0].Objects[0]
	if u.Path != lib || u.Kind != probes.UntracedMLX5DV || u.Sign != "imports mlx5dv_init_obj" {
		t.Errorf("object %+v", u)
	}
	if text := got[0].Text(); !strings.Contains(text, "pid ") || !strings.Contains(text, lib+" (imports mlx5dv_init_obj): mlx5 direct verbs") {
		t.Errorf("text %q", text)
	}

	stdin.Close()
	cmd.Wait()
	gen = a.beginFullScan()
	a.scanProcess(pid) // gone: no such process
	a.endFullScan(gen)
	if got := a.Untraced(); len(got) != 0 {
		t.Errorf("after it exited: %+v", got)
	}
}
