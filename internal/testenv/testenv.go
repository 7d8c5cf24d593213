// Package testenv holds what the privileged tests of several packages need:
// the root check that may skip only outside CI, and the reference data path.
package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
)

// RequireRoot skips a BPF test outside CI when not root; under CI=true a BPF
// test must run, so it fails instead.
func RequireRoot(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") == "true" {
		tb.Fatal("BPF tests need root and CI=true forbids skipping them")
	}
	tb.Skip("BPF tests need root")
}

// RefDir is the reference data path's build directory (refpath/build). A
// test that needs it fails, never skips, when it is missing: `make test`
// builds it first.
func RefDir(tb testing.TB) string {
	tb.Helper()
	_, file, _, _ := runtime.Caller(0)
	d := filepath.Join(filepath.Dir(file), "..", "..", "refpath", "build")
	if _, err := os.Stat(filepath.Join(d, "bin", "kvpath")); err != nil {
		tb.Fatalf("reference data path not built (make -C refpath): %v", err)
	}
	return filepath.Clean(d)
}

// NVIDIA returns the folder holding the .so files of one of NVIDIA's real
// libraries that scripts/nvidia/fetch.sh unpacked, by its versions.env key
// ("TRIXIE_CUDA", "BOOKWORM_CUDART", …). `make test` fetches them first
// (`make nvidia-libs`): a test that needs them fails, never skips, when
// they are missing.
func NVIDIA(tb testing.TB, key string) string {
	tb.Helper()
	nvidiaOnce.Do(func() {
		_, file, _, _ := runtime.Caller(0)
		script := filepath.Join(filepath.Dir(file), "..", "..", "scripts", "nvidia", "fetch.sh")
		out, err := exec.Command("bash", script, "--env").Output()
		if err != nil {
			nvidiaErr = fmt.Errorf("%s --env: %v", script, err)
			return
		}
		nvidiaDirs = map[string]string{}
		for _, line := range strings.Split(string(out), "\n") {
			k, v, ok := strings.Cut(line, "=")
			if ok && v != "" {
				nvidiaDirs[strings.TrimSuffix(strings.TrimPrefix(k, "NVIDIA_"), "_DIR")] = v
			}
		}
	})
	dir := nvidiaDirs[key]
	if nvidiaErr != nil || dir == "" {
		tb.Fatalf("NVIDIA library %s not fetched (make nvidia-libs): %v", key, nvidiaErr)
	}
	return dir
}

var (
	nvidiaOnce sync.Once
	nvidiaDirs map[string]string
	nvidiaErr  error
)

// RealCUDA builds testdata/realcuda.c, the program that calls NVIDIA's real
// runtime or driver (loaded with dlopen), once per test binary, and returns
// its path.
func RealCUDA(tb testing.TB) string {
	tb.Helper()
	realCUDAOnce.Do(func() {
		_, file, _, _ := runtime.Caller(0)
		dir, err := os.MkdirTemp("", "lanewatch-realcuda-")
		if err != nil {
			realCUDAErr = err
			return
		}
		realCUDAPath = filepath.Join(dir, "realcuda")
		src := filepath.Join(filepath.Dir(file), "testdata", "realcuda.c")
		if out, err := exec.Command("gcc", "-O2", "-Wall", "-Werror", "-o", realCUDAPath, src, "-ldl").CombinedOutput(); err != nil {
			realCUDAErr = fmt.Errorf("build %s: %v\n%s", src, err, out)
		}
	})
	if realCUDAErr != nil {
		tb.Fatal(realCUDAErr)
	}
	return realCUDAPath
}

var (
	realCUDAOnce sync.Once
	realCUDAPath string
	realCUDAErr  error
)
