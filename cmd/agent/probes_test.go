package main

import (
	"bytes"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/lanewatch/lanewatch/internal/testenv"
)

// agent probes on NVIDIA's real driver and runtime: every exported driver
// row is listed at its implementation, through the thunk, never
// single-stepped; absent rows say so; the runtime's rows are at emulated
// sites.
func TestProbesRealLibraries(t *testing.T) {
	for _, lib := range []struct{ key, file, header string }{
		// 535 lacks cuStreamBeginCaptureToGraph[_ptsz] (CUDA 12.3+)
		{"BOOKWORM_CUDA", "libcuda.so.1", "CUDA driver: 82 of 87 table symbols exported; sites: emulated 82, through a thunk 82"},
		{"TRIXIE_CUDA", "libcuda.so.1", "CUDA driver: 84 of 87 table symbols exported; sites: emulated 84, through a thunk 84"},
		{"BOOKWORM_CUDART", "libcudart.so.11.0", "41 of 43 table symbols exported; sites: emulated 41"},
		{"TRIXIE_CUDART", "libcudart.so.12", "41 of 43 table symbols exported; sites: emulated 41"},
	} {
		path := filepath.Join(testenv.NVIDIA(t, lib.key), lib.file)
		var out, errb bytes.Buffer
		if code := realMain([]string{"probes", path}, &out, &errb); code != 0 {
			t.Fatalf("agent probes %s: %d %s", path, code, errb.String())
		}
		text := out.String()
		if !strings.Contains(text, lib.header) {
			t.Errorf("%s %s: no %q in\n%s", lib.key, lib.file, lib.header, text)
		}
		if strings.Contains(text, "single-step") || strings.Contains(text, "NOT PROBED") {
			t.Errorf("%s %s:\n%s", lib.key, lib.file, text)
		}
		if lib.file == "libcuda.so.1" {
			thunk := regexp.MustCompile(`(?m)^    cuMemcpyHtoDAsync_v2 +implementation 0x[0-9a-f]+ \+0 PUSH RBP \(emulated, through the thunk's slot 0x[0-9a-f]+\)$`)
			if !thunk.MatchString(text) || !regexp.MustCompile(`(?m)^    cuMemcpyBatchAsync +absent$`).MatchString(text) {
				t.Errorf("%s: rows\n%s", lib.key, text)
			}
			// graph launches and the capture calls: each at its implementation, past the thunk
			for _, sym := range []string{"cuGraphLaunch", "cuGraphLaunch_ptsz", "cuStreamBeginCapture_v2", "cuStreamBeginCapture_v2_ptsz",
				"cuStreamBeginCapture", "cuStreamEndCapture", "cuStreamEndCapture_ptsz"} {
				row := regexp.MustCompile(`(?m)^    ` + sym + ` +implementation 0x[0-9a-f]+ \+0 PUSH RBP \(emulated, through the thunk's slot 0x[0-9a-f]+\)$`)
				if !row.MatchString(text) {
					t.Errorf("%s: %s not probed through its thunk:\n%s", lib.key, sym, text)
				}
			}
		}
	}
}

func TestProbesErrors(t *testing.T) {
	var out, errb bytes.Buffer
	if code := realMain([]string{"probes"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), "name at least one library") {
		t.Errorf("no library: %d %q", code, errb.String())
	}
	errb.Reset()
	self := filepath.Join("testdata", "none.so")
	if code := realMain([]string{"probes", self}, &out, &errb); code != 1 || !strings.Contains(errb.String(), self) {
		t.Errorf("missing file: %d %q", code, errb.String())
	}
	errb.Reset()
	if code := realMain([]string{"probes", "/proc/self/exe"}, &out, &errb); code != 1 || !strings.Contains(errb.String(), "exports no symbol of the probe table") {
		t.Errorf("a binary with no table symbol: %d %q", code, errb.String())
	}
}

// A library that posts through mlx5 direct verbs exports no table symbol
// and says why the agent cannot see what it moves.
func TestProbesUntraced(t *testing.T) {
	lib := testenv.DirectVerbsLib(t, t.TempDir())
	var out, errb bytes.Buffer
	code := realMain([]string{"probes", lib}, &out, &errb)
	want := lib + "\n  not traced (imports mlx5dv_init_obj): mlx5 direct verbs: it can build its own RDMA work requests and ring the NIC's doorbell, past ibv_post_send and the provider functions the agent probes\n"
	if code != 1 || out.String() != want || !strings.Contains(errb.String(), "exports no symbol of the probe table") {
		t.Errorf("agent probes %s: %d\n%s\nwant\n%s\nstderr %s", lib, code, out.String(), want, errb.String())
	}
}
