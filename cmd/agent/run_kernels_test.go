package main

import (
	"bytes"
	"strings"
	"testing"
)

// agent run refuses a KV-transfer kernel pattern that does not compile,
// before loading anything, and documents --kernels with its cost.
func TestRunKernelFlags(t *testing.T) {
	var out, errb bytes.Buffer
	if code := realMain([]string{"run", "--kernels", "--kv-kernels", "^ok$", "--kv-kernels", "(("}, &out, &errb); code != 2 ||
		!strings.Contains(errb.String(), "--kv-kernels") || !strings.Contains(errb.String(), "((") {
		t.Errorf("bad pattern: %d %q", code, errb.String())
	}
	errb.Reset()
	realMain([]string{"run", "-h"}, &out, &errb)
	if !strings.Contains(errb.String(), "-kernels") || !strings.Contains(errb.String(), "Kernel movers") {
		t.Errorf("run -h does not document --kernels:\n%s", errb.String())
	}
}
