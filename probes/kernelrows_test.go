package probes

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/internal/testenv"
)

// The kernel rows (docs/design.md, "Kernel movers"): the driver's launches
// named by the runtime calls that reach them, the three calls that name a
// handle, and the runtime's launches for the runtime layer; each reports at
// return with its result. Every kernel row is listed here.
func TestKernelRows(t *testing.T) {
	type row struct {
		op      event.Op
		layer   event.Layer
		runtime string
		prog    Program
		dims    Dims
	}
	want := map[string]row{
		"cuLaunchKernel":           {event.OpLaunch, event.LayerDriver, "cudaLaunchKernel", ProgEntryReturn, DimsArgs},
		"cuLaunchKernel_ptsz":      {event.OpLaunch, event.LayerDriver, "cudaLaunchKernel_ptsz", ProgEntryReturn, DimsArgs},
		"cuLaunchKernelEx":         {event.OpLaunch, event.LayerDriver, "cudaLaunchKernelExC", ProgLaunchEx, DimsConfig},
		"cuLaunchKernelEx_ptsz":    {event.OpLaunch, event.LayerDriver, "cudaLaunchKernelExC_ptsz", ProgLaunchEx, DimsConfig},
		"cuModuleGetFunction":      {event.OpKernelName, event.LayerDriver, "", ProgName, DimsNone},
		"cuLibraryGetKernel":       {event.OpKernelName, event.LayerDriver, "", ProgName, DimsNone},
		"cuKernelGetFunction":      {event.OpKernelFunction, event.LayerDriver, "", ProgEntryReturn, DimsNone},
		"cudaLaunchKernel":         {event.OpLaunch, event.LayerRuntime, "", ProgEntryReturn, DimsDim3},
		"cudaLaunchKernel_ptsz":    {event.OpLaunch, event.LayerRuntime, "", ProgEntryReturn, DimsDim3},
		"cudaLaunchKernelExC":      {event.OpLaunch, event.LayerRuntime, "", ProgLaunchEx, DimsConfig},
		"cudaLaunchKernelExC_ptsz": {event.OpLaunch, event.LayerRuntime, "", ProgLaunchEx, DimsConfig},
	}
	seen := 0
	for id, p := range Table {
		if !p.Op.IsKernel() {
			if p.Dims != DimsNone || p.Program == ProgName || p.Program == ProgLaunchEx {
				t.Errorf("row %d %s: launch facts on a row that is no kernel row", id, p.Symbol)
			}
			continue
		}
		seen++
		w, ok := want[p.Symbol]
		if !ok {
			t.Errorf("kernel row %s not checked here", p.Symbol)
			continue
		}
		got := row{p.Op, p.Layer, p.Runtime, p.Program, p.Dims}
		if got != w {
			t.Errorf("%s: %+v, want %+v", p.Symbol, got, w)
		}
		c, _ := Template(p.Symbol)
		if !c.Returns || c.PerThread != strings.HasSuffix(p.Symbol, "_ptsz") {
			t.Errorf("%s: returns %v, per-thread %v", p.Symbol, c.Returns, c.PerThread)
		}
		switch p.Op {
		case event.OpKernelName:
			// (handle out, parent, const char *name): the name is the
			// argument lw_name_return reads.
			if !p.OutHandle || p.Args.Handle != 0 || p.Args.Ptr != 1 || p.NArgs != int(lanewatchLwNameLW_NAME_ARG)+1 {
				t.Errorf("%s: %+v reads %d arguments; the name must be argument %d", p.Symbol, p.Args, p.NArgs, lanewatchLwNameLW_NAME_ARG)
			}
		case event.OpKernelFunction:
			if !p.OutHandle || p.Args.Handle != 0 || p.Args.Ptr != 1 {
				t.Errorf("%s: %+v", p.Symbol, p.Args)
			}
		case event.OpLaunch:
			if p.Args.Stream < 0 || p.Args.Handle < 0 || p.Out || p.OutHandle {
				t.Errorf("%s: %+v", p.Symbol, p.Args)
			}
		}
	}
	if seen != len(want) {
		t.Errorf("%d kernel rows, want %d", seen, len(want))
	}
}

// What each launch form decodes to: the launched handle, the stream, the
// grid and block as the call states them (six arguments; two dim3 by
// value; the config lw_launch_ex_enter copied).
func TestDecodeLaunches(t *testing.T) {
	const at = int(lanewatchLwLaunchArgLW_LAUNCH_DIMS)
	ex := [9]uint64{0x7ffd0000, 0xf00d}
	ex[at], ex[at+1], ex[at+2] = 8|2<<32, 1|128<<32, 1|1<<32
	ex[lanewatchLwLaunchArgLW_LAUNCH_SHMEM] = 4096
	ex[lanewatchLwLaunchArgLW_LAUNCH_STREAM] = 0x5000
	cases := []struct {
		sym           string
		args          [9]uint64
		handle, strm  uint64
		grid, block   [3]uint32
		runtime       string
		perThreadForm bool
	}{
		// cuLaunchKernel(f, 8, 2, 1, 128, 1, 1, shmem, stream, params, extra):
		// junk in the registers' upper halves is not part of an unsigned int.
		{"cuLaunchKernel", [9]uint64{0xf00d, 0xdead_0000_0008, 2, 1, 128, 1, 1, 4096, 0x5000}, 0xf00d, 0x5000,
			[3]uint32{8, 2, 1}, [3]uint32{128, 1, 1}, "cudaLaunchKernel", false},
		{"cuLaunchKernel_ptsz", [9]uint64{0xf00d, 8, 2, 1, 128, 1, 1, 0, 0}, 0xf00d, 0,
			[3]uint32{8, 2, 1}, [3]uint32{128, 1, 1}, "cudaLaunchKernel_ptsz", true},
		{"cuLaunchKernelEx", ex, 0xf00d, 0x5000, [3]uint32{8, 2, 1}, [3]uint32{128, 1, 1}, "cudaLaunchKernelExC", false},
		// cudaLaunchKernel(stub, dim3{8,2,1}, dim3{128,1,1}, args, shmem, stream)
		{"cudaLaunchKernel", [9]uint64{0x401000, 8 | 2<<32, 1, 128 | 1<<32, 1, 0x7ffd, 0, 0x5000}, 0x401000, 0x5000,
			[3]uint32{8, 2, 1}, [3]uint32{128, 1, 1}, "", false},
		{"cudaLaunchKernelExC_ptsz", ex, 0xf00d, 0x5000, [3]uint32{8, 2, 1}, [3]uint32{128, 1, 1}, "", true},
	}
	for _, tc := range cases {
		var c event.Call
		if err := Decode(rawEvent(rowOf(t, tc.sym), tc.args, 0, 0), &c); err != nil {
			t.Fatal(err)
		}
		if c.Op != event.OpLaunch || c.Handle != tc.handle || c.Stream != tc.strm || c.Grid != tc.grid || c.Block != tc.block ||
			c.RuntimeAPI != tc.runtime || c.PerThread != tc.perThreadForm || c.Failed() {
			t.Errorf("%s: %+v", tc.sym, c)
		}
	}
}

// A name piece decodes to its bytes, the count bpf_probe_read_user_str
// returned and its position; the naming call itself to its new handle and
// its parent.
func TestDecodeNamePieces(t *testing.T) {
	name := "_Z20transfer_kernel_implIXadL_Z20get_global_offset_lfIKcEPT_"
	var args [9]uint64
	b := unsafe.Slice((*byte)(unsafe.Pointer(&args[0])), len(args)*8)
	n := copy(b[:event.NamePieceBytes-1], name)
	raw := rawEvent(rowOf(t, "cuModuleGetFunction"), args, 0, uint64(n+1))
	raw[0] = uint8(lanewatchLwEventKindLW_EV_NAME)
	(*lanewatchLwEvent)(unsafe.Pointer(&raw[0])).BatchIndex = 3
	var c event.Call
	if err := Decode(raw, &c); err != nil {
		t.Fatal(err)
	}
	got := c.NamePiece[:]
	if i := bytes.IndexByte(got, 0); i >= 0 {
		got = got[:i]
	}
	if c.Kind != event.KindName || c.BatchIndex != 3 || c.Ret != uint64(n+1) || string(got) != name[:n] || c.Symbol != "cuModuleGetFunction" {
		t.Errorf("piece: %+v %q", c, got)
	}
	if err := Decode(rawEvent(rowOf(t, "cuModuleGetFunction"), [9]uint64{0x7ffd10, 0x5555_0001, 0x4000}, 0x5555_0002, 0), &c); err != nil {
		t.Fatal(err)
	}
	if c.Op != event.OpKernelName || c.Handle != 0x5555_0002 || c.Ptr != 0x5555_0001 || c.Kind != event.KindCall {
		t.Errorf("cuModuleGetFunction: %+v", c)
	}
	if err := Decode(rawEvent(rowOf(t, "cuKernelGetFunction"), [9]uint64{0x7ffd10, 0x6666_0001}, 0x5555_0003, 0), &c); err != nil {
		t.Fatal(err)
	}
	if c.Op != event.OpKernelFunction || c.Handle != 0x5555_0003 || c.Ptr != 0x6666_0001 {
		t.Errorf("cuKernelGetFunction: %+v", c)
	}
}

// lw_launch_ex_enter reads grid, block, shared memory and stream from the
// first 40 bytes of CUlaunchConfig and cudaLaunchConfig_t: checked against
// the reference's declarations and NVIDIA's 11.8/12.4 cuda.h (compiled), and
// 12.4's driver_types.h (which needs the toolkit's other headers to compile:
// its field declarations are read).
func TestLaunchConfigLayout(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	const src = `#include <stddef.h>
#include <stdio.h>
#include HEADER
int main(void) {
	printf("%zu %zu %zu %zu\n", offsetof(CUlaunchConfig, gridDimX), offsetof(CUlaunchConfig, blockDimZ),
	       offsetof(CUlaunchConfig, sharedMemBytes), offsetof(CUlaunchConfig, hStream));
#ifdef REFCUDA_H
	printf("%zu %zu %zu %zu\n", offsetof(cudaLaunchConfig_t, gridDim), offsetof(cudaLaunchConfig_t, blockDim),
	       offsetof(cudaLaunchConfig_t, dynamicSmemBytes), offsetof(cudaLaunchConfig_t, stream));
#endif
	return 0;
}
`
	stream := strconv.Itoa(int(lanewatchLwLaunchArgLW_LAUNCH_STREAM_OFF))
	driver := "0 20 24 " + stream
	headers := map[string][]string{"refcuda.h": {filepath.Join(root, "refpath", "include", "refcuda.h"), driver, "0 12 24 " + stream}}
	cached, _ := filepath.Glob(filepath.Join(root, ".cache", "nvidia", "headers", "nvidia-cuda-dev-*", "cuda.h"))
	for _, h := range cached {
		if strings.Contains(h, "-11.") {
			continue // CUlaunchConfig is CUDA 12's
		}
		headers[filepath.Base(filepath.Dir(h))] = []string{h, driver}
	}
	if len(cached) == 0 {
		t.Log("no NVIDIA cuda.h cached (scripts/nvidia/gen-errors.sh): checked against refcuda.h only")
	}
	for name, h := range headers {
		dir := t.TempDir()
		c := filepath.Join(dir, "layout.c")
		if err := os.WriteFile(c, []byte(strings.Replace(src, "HEADER", `"`+h[0]+`"`, 1)), 0o644); err != nil {
			t.Fatal(err)
		}
		bin := filepath.Join(dir, "layout")
		if out, err := exec.Command("gcc", "-o", bin, c).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", name, err, out)
		}
		out, err := exec.Command(bin).Output()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got := strings.Join(strings.Fields(string(out)), " "); got != strings.Join(h[1:], " ") {
			t.Errorf("%s: offsets %s, want %s", name, got, strings.Join(h[1:], " "))
		}
	}
	types, _ := filepath.Glob(filepath.Join(root, ".cache", "nvidia", "headers", "nvidia-cuda-dev-12*", "driver_types.h"))
	fields := regexp.MustCompile(`(?s)struct cudaLaunchConfig_st \{\s*dim3 gridDim;[^\n]*\n\s*dim3 blockDim;[^\n]*\n\s*size_t dynamicSmemBytes;[^\n]*\n\s*cudaStream_t stream;`)
	for _, h := range types {
		b, err := os.ReadFile(h)
		if err != nil {
			t.Fatal(err)
		}
		// dim3 is three unsigned ints: grid at 0, block at 12, the size_t at
		// 24, the stream at 32.
		if !fields.Match(b) {
			t.Errorf("%s: cudaLaunchConfig_st does not open with gridDim, blockDim, dynamicSmemBytes, stream", h)
		}
	}
}

// On the reference driver under the real programs: the name rows send the
// kernel's name in pieces before their own event, which carries the new
// handle; the launches carry that handle and their stream (kvpath
// kernel-copy through the runtime: cuModuleGetFunction and cuLaunchKernel;
// drvcheck on the driver API: every launch form, libraries and kernels).
func TestKernelProbesOnReference(t *testing.T) {
	testenv.RequireRoot(t)
	ref := testenv.RefDir(t)
	p, err := Load(Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	lib := filepath.Join(ref, "lib", "libcuda.so.1")
	want := []string{"cuLaunchKernel", "cuLaunchKernel_ptsz", "cuLaunchKernelEx", "cuLaunchKernelEx_ptsz", "cuModuleGetFunction",
		"cuLibraryGetKernel", "cuKernelGetFunction"}
	syms, err := LookupSymbols(lib, want)
	if err != nil || len(syms) != len(want) {
		t.Fatalf("%s: %v %v", lib, syms, err)
	}
	if _, err := p.AttachFile(FileID{Inode: 1}, lib, syms, 0); err != nil {
		t.Fatal(err)
	}
	stop := collect(t, p)
	kv := exec.Command(filepath.Join(ref, "bin", "kvpath"), "--scenario", "kernel-copy", "--truth", filepath.Join(t.TempDir(), "t.jsonl"))
	if out, err := kv.CombinedOutput(); err != nil {
		t.Fatalf("kvpath: %v\n%s", err, out)
	}
	drv := exec.Command(filepath.Join(ref, "bin", "drvcheck"))
	if out, err := drv.CombinedOutput(); err != nil {
		t.Fatalf("drvcheck: %v\n%s", err, out)
	}
	got := stop()
	const kvName = "_Z20transfer_kernel_implIXadL_Z20get_global_offset_lfIKcEPT_S3_PKmllllEEXadL_ZS0_IcES3_S3_S5_llllEELb0EEvPKvPvS7_S8_PKlSA_lllllllS5_S5_S5_S5_"
	type proc struct {
		names    map[uint64]string // handle → name
		launches map[string]int    // by symbol
		pending  []byte
		streams  map[uint64]bool
		unnamed  int
	}
	procs := map[uint32]*proc{}
	for _, c := range got {
		pr := procs[c.PID]
		if pr == nil {
			pr = &proc{names: map[uint64]string{}, launches: map[string]int{}, streams: map[uint64]bool{}}
			procs[c.PID] = pr
		}
		switch {
		case c.Kind == event.KindName:
			if c.BatchIndex == 0 {
				pr.pending = pr.pending[:0]
			}
			piece := c.NamePiece[:c.Ret-1]
			pr.pending = append(pr.pending, piece...)
		case c.Op == event.OpKernelName && !c.Failed():
			pr.names[c.Handle] = string(pr.pending)
			pr.pending = pr.pending[:0]
		case c.Op == event.OpKernelFunction && !c.Failed():
			pr.names[c.Handle] = pr.names[c.Ptr]
		case c.Op == event.OpLaunch && !c.Failed():
			pr.launches[c.Symbol]++
			if pr.names[c.Handle] == "" {
				pr.unnamed++
			}
			pr.streams[c.Stream] = true
		}
	}
	k := procs[uint32(kv.Process.Pid)]
	if k == nil || k.launches["cuLaunchKernel"] != 12 || len(k.streams) != 2 || k.unnamed != 0 {
		t.Errorf("kernel-copy: %+v, want 12 launches on two streams", k)
	} else {
		for h, n := range k.names {
			if n != kvName {
				t.Errorf("kernel-copy: handle %#x named %q", h, n)
			}
		}
	}
	d := procs[uint32(drv.Process.Pid)]
	if d == nil || d.unnamed != 0 {
		t.Fatalf("drvcheck: %+v, want every launch of a named handle", d)
	}
	for _, sym := range []string{"cuLaunchKernel", "cuLaunchKernel_ptsz", "cuLaunchKernelEx", "cuLaunchKernelEx_ptsz"} {
		if d.launches[sym] == 0 {
			t.Errorf("drvcheck: no %s seen: %v", sym, d.launches)
		}
	}
	for h, n := range d.names {
		if n != "_Z6k_copyPvPKvm" {
			t.Errorf("drvcheck: handle %#x named %q", h, n)
		}
	}
}
