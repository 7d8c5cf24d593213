package probes

import (
	"os"
	"path/filepath"
	"testing"
)

// requireRoot skips a BPF test outside CI when not root; under CI=true a BPF
// test must run, so it fails instead.
func requireRoot(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") == "true" {
		tb.Fatal("BPF tests need root and CI=true forbids skipping them")
	}
	tb.Skip("BPF tests need root")
}

// refDir is the reference data path's build directory; tests that use it
// fail (never skip) when it is missing: `make test` builds it first.
func refDir(tb testing.TB) string {
	tb.Helper()
	d, err := filepath.Abs("../refpath/build")
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(d, "bin", "kvpath")); err != nil {
		tb.Fatalf("reference data path not built (make -C refpath): %v", err)
	}
	return d
}
