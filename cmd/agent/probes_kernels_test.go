package main

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/lanewatch/lanewatch/internal/testenv"
)

// The kernel rows on NVIDIA's real libraries (docs/design.md, "Kernel
// movers"): 535 and 550 export each launch form and each call that names a
// handle under the table's name, each probed at its implementation through
// the thunk; both runtimes export the runtime layer's launches and name, among
// the driver functions they resolve with cuGetProcAddress, the ones their
// launches go through (cuLaunchKernel, cuLaunchKernelEx, with their _ptsz
// forms) and the one their functions come from (cuModuleGetFunction); 12.4
// also names cuLibraryGetKernel and cuKernelGetFunction.
func TestProbesKernelRowsReal(t *testing.T) {
	driverRows := []string{"cuLaunchKernel", "cuLaunchKernel_ptsz", "cuLaunchKernelEx", "cuLaunchKernelEx_ptsz",
		"cuModuleGetFunction", "cuLibraryGetKernel", "cuKernelGetFunction"}
	for _, key := range []string{"BOOKWORM_CUDA", "TRIXIE_CUDA"} {
		path := filepath.Join(testenv.NVIDIA(t, key), "libcuda.so.1")
		var out, errb bytes.Buffer
		if code := realMain([]string{"probes", path}, &out, &errb); code != 0 {
			t.Fatalf("agent probes %s: %d %s", path, code, errb.String())
		}
		for _, sym := range driverRows {
			re := regexp.MustCompile(`(?m)^    ` + sym + ` +implementation 0x[0-9a-f]+ \+0 PUSH RBP \(emulated, through the thunk's slot 0x[0-9a-f]+\)$`)
			if !re.MatchString(out.String()) {
				t.Errorf("%s: %s not probed at its implementation:\n%s", key, sym, out.String())
			}
		}
	}
	for _, rt := range []struct {
		key, file string
		resolves  []string
	}{
		{"BOOKWORM_CUDART", "libcudart.so.11.0", []string{"cuLaunchKernel", "cuLaunchKernel_ptsz", "cuLaunchKernelEx", "cuLaunchKernelEx_ptsz", "cuModuleGetFunction"}},
		{"TRIXIE_CUDART", "libcudart.so.12", []string{"cuLaunchKernel", "cuLaunchKernel_ptsz", "cuLaunchKernelEx", "cuLaunchKernelEx_ptsz", "cuModuleGetFunction",
			"cuLibraryGetKernel", "cuKernelGetFunction"}},
	} {
		path := filepath.Join(testenv.NVIDIA(t, rt.key), rt.file)
		var out, errb bytes.Buffer
		if code := realMain([]string{"probes", path}, &out, &errb); code != 0 {
			t.Fatalf("agent probes %s: %d %s", path, code, errb.String())
		}
		for _, sym := range []string{"cudaLaunchKernel", "cudaLaunchKernel_ptsz", "cudaLaunchKernelExC", "cudaLaunchKernelExC_ptsz"} {
			if !regexp.MustCompile(`(?m)^    ` + sym + ` +\+0 PUSH [A-Z0-9]+ \(emulated\)$`).MatchString(out.String()) {
				t.Errorf("%s: %s not probed at an emulated site:\n%s", rt.file, sym, out.String())
			}
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, sym := range rt.resolves {
			if !bytes.Contains(b, []byte("\x00"+sym+"\x00")) {
				t.Errorf("%s does not name %s", rt.file, sym)
			}
		}
	}
}
