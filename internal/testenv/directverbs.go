package testenv

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// directVerbsC posts through mlx5 direct verbs: built against rdma-core's
// real header and libmlx5 (libibverbs-dev), it imports mlx5dv_init_obj,
// which hands a queue pair's work queue and doorbell to its caller.
const directVerbsC = `
#include <infiniband/mlx5dv.h>
int kv_direct_attach(struct ibv_qp *qp) {
	struct mlx5dv_qp dv;
	struct mlx5dv_obj obj = { .qp = { .in = qp, .out = &dv } };
	return mlx5dv_init_obj(&obj, MLX5DV_OBJ_QP);
}
`

// loaderC dlopens argv[1] (RTLD_NOW: every import bound), says "loaded",
// and waits for its stdin to close.
const loaderC = `
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

// DirectVerbsLib builds, in dir, a library that imports mlx5dv_init_obj
// and returns its path. It skips outside CI without gcc or rdma-core's
// mlx5dv.h, and fails under CI=true.
func DirectVerbsLib(tb testing.TB, dir string) string {
	tb.Helper()
	if _, err := os.Stat("/usr/include/infiniband/mlx5dv.h"); err != nil {
		skipOrFail(tb, "rdma-core's mlx5dv.h (libibverbs-dev): %v", err)
	}
	return compileC(tb, dir, "libkvdirect.so", directVerbsC, "-shared", "-fPIC", "-Wl,--no-as-needed", "-lmlx5", "-libverbs")
}

// LoadingProcess starts a real process that dlopens lib and waits; it
// returns its pid once lib is loaded, and ends it with the test. stop
// ends it earlier, and waits for it.
func LoadingProcess(tb testing.TB, lib string) (pid int, stop func()) {
	tb.Helper()
	loader := compileC(tb, tb.TempDir(), "kvloader", loaderC, "-ldl")
	cmd := exec.Command(loader, lib)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	stopped := false
	stop = func() {
		if !stopped {
			stopped = true
			stdin.Close()
			cmd.Wait()
		}
	}
	tb.Cleanup(stop)
	if line, err := bufio.NewReader(stdout).ReadString('\n'); line != "loaded\n" {
		tb.Fatalf("%s %s said %q (%v)", loader, lib, line, err)
	}
	return cmd.Process.Pid, stop
}

// compileC builds src with gcc into dir/out.
func compileC(tb testing.TB, dir, out, src string, flags ...string) string {
	tb.Helper()
	if _, err := exec.LookPath("gcc"); err != nil {
		skipOrFail(tb, "gcc: %v", err)
	}
	c := filepath.Join(dir, out+".c")
	if err := os.WriteFile(c, []byte(src), 0o644); err != nil {
		tb.Fatal(err)
	}
	bin := filepath.Join(dir, out)
	if b, err := exec.Command("gcc", append(append([]string{}, flags...), "-o", bin, c)...).CombinedOutput(); err != nil {
		tb.Fatalf("gcc %s: %v\n%s", out, err, b)
	}
	return bin
}

// skipOrFail skips outside CI; under CI=true every test must run.
func skipOrFail(tb testing.TB, format string, args ...any) {
	tb.Helper()
	if os.Getenv("CI") == "true" {
		tb.Fatalf("required under CI=true: "+format, args...)
	}
	tb.Skipf(format, args...)
}
