// Package testenv holds what the privileged tests of several packages need:
// the root check that may skip only outside CI, and the reference data path.
package testenv

import (
	"os"
	"path/filepath"
	"runtime"
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
