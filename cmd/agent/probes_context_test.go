package main

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/lanewatch/lanewatch/internal/testenv"
)

// The device and context rows on NVIDIA's real drivers (docs/design.md,
// "Placement"): each entry point the runtime resolves to choose a thread's
// device is exported by 535 and 550 under the table's versioned name and
// probed at its implementation through the thunk; cuCtxCreate_v4 (CUDA
// 12.5) is absent from both. And both runtimes name each of them but
// cuCtxDestroy (the runtime never destroys a context: that row is for
// driver-API programs) among the driver functions they resolve with
// cuGetProcAddress, unversioned: the driver hands back the versions the
// table probes.
func TestProbesContextRowsReal(t *testing.T) {
	rows := []string{"cuDevicePrimaryCtxRetain", "cuCtxCreate_v2", "cuCtxCreate_v3", "cuCtxSetCurrent", "cuCtxPushCurrent_v2",
		"cuCtxPopCurrent_v2", "cuCtxDestroy_v2", "cuDeviceGetPCIBusId"}
	for _, key := range []string{"BOOKWORM_CUDA", "TRIXIE_CUDA"} {
		path := filepath.Join(testenv.NVIDIA(t, key), "libcuda.so.1")
		var out, errb bytes.Buffer
		if code := realMain([]string{"probes", path}, &out, &errb); code != 0 {
			t.Fatalf("agent probes %s: %d %s", path, code, errb.String())
		}
		text := out.String()
		for _, sym := range rows {
			re := regexp.MustCompile(`(?m)^    ` + sym + ` +implementation 0x[0-9a-f]+ \+0 PUSH RBP \(emulated, through the thunk's slot 0x[0-9a-f]+\)$`)
			if !re.MatchString(text) {
				t.Errorf("%s: %s not probed at its implementation:\n%s", key, sym, text)
			}
		}
		if !regexp.MustCompile(`(?m)^    cuCtxCreate_v4 +absent$`).MatchString(text) {
			t.Errorf("%s: cuCtxCreate_v4 not listed absent", key)
		}
	}
	for _, rt := range []struct{ key, file string }{{"BOOKWORM_CUDART", "libcudart.so.11.0"}, {"TRIXIE_CUDART", "libcudart.so.12"}} {
		b, err := os.ReadFile(filepath.Join(testenv.NVIDIA(t, rt.key), rt.file))
		if err != nil {
			t.Fatal(err)
		}
		for _, sym := range rows {
			if sym == "cuCtxDestroy_v2" {
				continue
			}
			base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(sym, "_v2"), "_v3"), "_v4")
			if !bytes.Contains(b, []byte("\x00"+base+"\x00")) {
				t.Errorf("%s does not name %s", rt.file, base)
			}
		}
	}
}
