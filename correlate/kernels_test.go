package correlate

import (
	"fmt"
	"strings"
	"testing"

	"github.com/lanewatch/lanewatch/event"
)

// sgl-kernel's KV-transfer kernels as the host compiler mangles them (g++ on
// the template instances transfer_kv_per_layer, transfer_kv_per_layer_mla_pf_lf,
// transfer_kv_all_layer_lf_pf and transfer_kv_per_layer_ph_lf launch), and
// other kernels a server launches.
const (
	sglPerLayer   = "_Z20transfer_kernel_implIXadL_Z20get_global_offset_lfIKcEPT_S3_PKmllllEEXadL_ZS0_IcES3_S3_S5_llllEELb0EEvPKvPvS7_S8_PKlSA_lllllllS5_S5_S5_S5_"
	sglMLAPfLf    = "_Z20transfer_kernel_implIXadL_Z20get_global_offset_pfIKcEPT_S3_PKmllllEEXadL_Z20get_global_offset_lfIcES3_S3_S5_llllEELb1EEvPKvPvS8_S9_PKlSB_lllllllS5_S5_S5_S5_"
	sglAllLfPf    = "_Z20transfer_kernel_implIXadL_Z24get_global_offset_lf_tblIKcEPT_S3_PKmllllEEXadL_Z20get_global_offset_pfIcES3_S3_S5_llllEELb0EEvPKvPvS8_S9_PKlSB_lllllllS5_S5_S5_S5_"
	sglPageHead   = "_Z30transfer_page_head_kernel_implIXadL_Z20get_global_offset_phIKcEPT_S3_PKmlllllllEEXadL_Z29get_global_offset_per_head_lfIcES3_S3_S5_lllllllEEEvPKvPvS8_S9_PKlSB_lllllllS5_S5_S5_S5_ll"
	flashAttn     = "_ZN5flash19flash_fwd_kernel_v2I23Flash_fwd_kernel_traitsILi128ELi64ELi64ELi4ELb0ELb0EN7cutlass6half_tEELb1ELb0ELb0ELb0ELb1ELb1ELb0ELb0EEEv16Flash_fwd_params"
	plainCopy     = "_Z6k_copyPvPKvm"
	tritonKernel  = "triton_poi_fused_add_0"
	stdNamespaced = "_ZNSt6vectorIiSaIiEE9push_backERKi"
)

func TestKernelName(t *testing.T) {
	cases := []struct{ symbol, want string }{
		{sglPerLayer, "transfer_kernel_impl"},
		{sglMLAPfLf, "transfer_kernel_impl"},
		{sglAllLfPf, "transfer_kernel_impl"},
		{sglPageHead, "transfer_page_head_kernel_impl"},
		{flashAttn, "flash::flash_fwd_kernel_v2"},
		{plainCopy, "k_copy"},
		{tritonKernel, tritonKernel}, // extern "C": the symbol is the name
		{stdNamespaced, "std::vector::push_back"},
		// Names cut where the probe's 568 bytes end, or shorter: the
		// qualified name at the front still reads.
		{sglPerLayer[:40], "transfer_kernel_impl"},
		{flashAttn[:30], "flash::flash_fwd_kernel_v2"},
		{"_ZN5flash19flash_f", "flash"},
		{"_Z20transfer_ker", "_Z20transfer_ker"}, // the length runs past the cut: nothing readable
		{"_Z", "_Z"},
		{"_Z0x", "_Z0x"},
		{"", ""},
	}
	for _, tc := range cases {
		if got := KernelName(tc.symbol); got != tc.want {
			t.Errorf("KernelName(%q) = %q, want %q", tc.symbol, got, tc.want)
		}
	}
}

func FuzzKernelName(f *testing.F) {
	for _, s := range []string{sglPerLayer, sglPageHead, flashAttn, plainCopy, tritonKernel, stdNamespaced, "_ZN", "_Z9999999999a", "_ZNK3foo3barEv"} {
		f.Add(s)
		f.Add(s[:len(s)/2])
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := KernelName(s)
		if s != "" && got == "" {
			t.Errorf("KernelName(%q) is empty", s)
		}
		if p := mangledPrefix(s); len(p) > 2*len(s) {
			t.Errorf("mangledPrefix(%q) = %q", s, p)
		}
	})
}

func TestKernelSet(t *testing.T) {
	def, err := NewKernelSet(DefaultKVKernels)
	if err != nil {
		t.Fatal(err)
	}
	for _, sym := range []string{sglPerLayer, sglMLAPfLf, sglAllLfPf, sglPageHead} {
		if !def.Match(KernelName(sym)) {
			t.Errorf("default set does not match %s", KernelName(sym))
		}
	}
	for _, sym := range []string{flashAttn, plainCopy, tritonKernel, "transfer_kernel_impl2", "ns::transfer_kernel_impl"} {
		if def.Match(KernelName(sym)) {
			t.Errorf("default set matches %s", sym)
		}
	}
	mine, err := NewKernelSet([]string{`^flexkv::transfer_kv_`, `^k_copy$`})
	if err != nil || !mine.Match("flexkv::transfer_kv_layers_kernel") || !mine.Match("k_copy") || mine.Match("transfer_kernel_impl") {
		t.Errorf("custom set: %v", err)
	}
	if _, err := NewKernelSet([]string{"("}); err == nil || !strings.Contains(err.Error(), `"("`) {
		t.Errorf("a bad pattern: %v", err)
	}
	var none *KernelSet
	if none.Match("transfer_kernel_impl") {
		t.Error("a nil set matches")
	}
}

// kernelWorld drives one process through the driver calls a runtime makes
// to name and launch kernels, on devWorld's device map.
type kernelWorld struct {
	*devWorld
	stubs map[uint64]int // StubName's questions
}

func newKernelWorld(t *testing.T) *kernelWorld {
	w := &kernelWorld{devWorld: &devWorld{t: t, asked: map[int]int{}}, stubs: map[uint64]int{}}
	set, err := NewKernelSet(DefaultKVKernels)
	if err != nil {
		t.Fatal(err)
	}
	w.e, w.s = newTest(t, Config{
		Devices:   func(_ uint32, ordinal int) string { w.asked[ordinal]++; return fmt.Sprintf("0000:%x0:00.0", ordinal) },
		KVKernels: set,
		StubName: func(pid uint32, addr uint64) string {
			w.stubs[addr]++
			if pid == testPID && addr == 0x401000 {
				return sglPerLayer
			}
			return ""
		},
	})
	w.e.ObservedFromStart(testPID)
	return w
}

// name sends sym in the pieces lw_name_return emits (71 characters and a NUL
// each), then the naming call that returns handle.
func (w *kernelWorld) name(api string, tid uint32, handle, parent uint64, sym string, ret uint64) {
	w.t.Helper()
	for i := 0; i == 0 || i*(event.NamePieceBytes-1) <= len(sym); i++ {
		w.ts += 1
		c := mk(w.t, api, tid, w.ts, w.ts)
		c.Kind, c.BatchIndex = event.KindName, uint32(i)
		rest := sym[min(i*(event.NamePieceBytes-1), len(sym)):]
		n := copy(c.NamePiece[:event.NamePieceBytes-1], rest)
		c.NamePiece[n] = 0
		c.Ret = uint64(n + 1)
		w.e.Handle(c)
	}
	w.call(api, tid, func(c *event.Call) { c.Handle, c.Ptr, c.Ret = handle, parent, ret })
}

// launch is cuLaunchKernel of handle on stream from the runtime (or from
// the application when !viaRuntime).
func (w *kernelWorld) launch(sym string, tid uint32, handle, stream uint64, viaRuntime bool, ret uint64) {
	w.call(sym, tid, func(c *event.Call) {
		c.Handle, c.Stream, c.ViaRuntime, c.Ret = handle, stream, viaRuntime, ret
		c.Grid, c.Block = [3]uint32{2, 1, 1}, [3]uint32{128, 1, 1}
	})
}

func (w *kernelWorld) record(tid uint32, stream, ev uint64) {
	w.call("cuEventRecord", tid, func(c *event.Call) { c.Stream, c.Event = stream, ev })
}

func (w *kernelWorld) sync(tid uint32, stream uint64) {
	w.call("cuStreamSynchronize", tid, func(c *event.Call) { c.Stream = stream })
}

func (w *kernelWorld) transfers() []Transfer {
	w.e.Flush()
	got := w.s.got
	w.s.got = nil
	return got
}

const (
	loadStream = 0x5000
	fnKV       = 0xf00d_0001 // CUfunction of sglPerLayer
	fnOther    = 0xf00d_0002
)

// HiCache's kernel backend through the runtime: one launch per layer on the
// load stream, an event recorded after each; every launch a transfer moved
// by SMs with its kernel, stream, layer, GPU and completion, its direction
// and bytes unknown; the other kernel's launch none.
func TestKernelLaunchesPerLayer(t *testing.T) {
	w := newKernelWorld(t)
	w.setDevice(1, 3)
	w.name("cuModuleGetFunction", 1, fnKV, 0xa0d0, sglPerLayer, 0)
	w.name("cuModuleGetFunction", 1, fnOther, 0xa0d0, plainCopy, 0)
	for layer := range 3 {
		w.launch("cuLaunchKernel", 1, fnKV, loadStream, true, 0)
		w.launch("cuLaunchKernel", 1, fnOther, loadStream, true, 0) // compute between loads
		w.record(1, loadStream, 0xe0+uint64(layer))
	}
	w.sync(1, loadStream)
	got := w.transfers()
	if len(got) != 3 {
		t.Fatalf("%d transfers, want 3: %+v", len(got), got)
	}
	for i, tr := range got {
		want := Transfer{PID: testPID, TID: 1, Stream: loadStream, API: "cudaLaunchKernel", DriverAPI: "cuLaunchKernel",
			Op: event.OpKernelCopy, Mover: MoverSM, Kernel: "transfer_kernel_impl", KernelSymbol: sglPerLayer,
			Direction: DirUnknown, BytesUnknown: true, Src: Side{Mem: event.MemUnknown}, Dst: Side{Mem: event.MemUnknown},
			GPU: "0000:30:00.0", SubmitNs: tr.SubmitNs, CompleteNs: tr.CompleteNs, CallNs: tr.CallNs, BatchIndex: -1, Layer: i}
		if tr != want {
			t.Errorf("launch %d:\n got %+v\nwant %+v", i, tr, want)
		}
		if tr.CompleteNs <= tr.SubmitNs {
			t.Errorf("launch %d: completion %d not proven by the sync", i, tr.CompleteNs)
		}
	}
	ks := w.e.KernelStats()
	if ks != (KernelStats{Launches: 6, KV: 3, Other: 3}) {
		t.Errorf("stats %+v", ks)
	}
}

// A launch names its kernel only through a naming call the engine saw: a
// handle made before (late attach) is unnamed and makes no record; a
// naming call that failed names nothing; a name whose first piece was lost
// is unknown.
func TestKernelHandleUnseen(t *testing.T) {
	w := newKernelWorld(t)
	w.setDevice(1, 0)
	w.launch("cuLaunchKernel", 1, fnKV, loadStream, true, 0) // made before the agent looked
	w.name("cuModuleGetFunction", 1, fnKV, 0xa0d0, sglPerLayer, 500)
	w.launch("cuLaunchKernel", 1, fnKV, loadStream, true, 0) // CUDA_ERROR_NOT_FOUND named nothing
	// pieces 1.. without piece 0 (lost to a full ring)
	w.ts++
	c := mk(t, "cuModuleGetFunction", 1, w.ts, w.ts)
	c.Kind, c.BatchIndex, c.Ret = event.KindName, 1, 10
	copy(c.NamePiece[:], "ernel_impl")
	w.e.Handle(c)
	w.call("cuModuleGetFunction", 1, func(c *event.Call) { c.Handle = fnKV + 8 })
	w.launch("cuLaunchKernel", 1, fnKV+8, loadStream, true, 0)
	if got := w.transfers(); len(got) != 0 {
		t.Errorf("unnamed launches made records: %+v", got)
	}
	if ks := w.e.KernelStats(); ks.Unnamed != 3 || ks.KV != 0 {
		t.Errorf("stats %+v", ks)
	}
}

// Driver-API programs: a library's kernel and its function in the current
// context, launched as either handle; cuLaunchKernelEx on a second
// thread's per-thread stream. Named as the driver call, on each thread's
// device.
func TestKernelLibraryAndDirectLaunches(t *testing.T) {
	w := newKernelWorld(t)
	w.setDevice(1, 1)
	w.setDevice(2, 2)
	const kern, fn = 0xbeef_0001, 0xbeef_0002
	w.name("cuLibraryGetKernel", 1, kern, 0x11b0, sglPageHead, 0)
	w.call("cuKernelGetFunction", 1, func(c *event.Call) { c.Handle, c.Ptr = fn, kern })
	w.launch("cuLaunchKernel", 1, fn, loadStream, false, 0)
	w.launch("cuLaunchKernel", 1, kern, loadStream, false, 0) // a CUkernel launches as a function (CUDA 12)
	w.launch("cuLaunchKernelEx_ptsz", 2, kern, 0, false, 0)
	got := w.transfers()
	if len(got) != 3 {
		t.Fatalf("%d transfers: %+v", len(got), got)
	}
	for i, want := range []struct {
		api, gpu string
		tid      uint32
	}{{"cuLaunchKernel", "0000:10:00.0", 1}, {"cuLaunchKernel", "0000:10:00.0", 1}, {"cuLaunchKernelEx_ptsz", "0000:20:00.0", 2}} {
		tr := got[i]
		if tr.API != want.api || tr.DriverAPI != "" || tr.GPU != want.gpu || tr.TID != want.tid || tr.Kernel != "transfer_page_head_kernel_impl" ||
			tr.Mover != MoverSM || tr.Layer != -1 {
			t.Errorf("launch %d: %+v", i, tr)
		}
	}
}

// The runtime layer (a process whose driver failed to initialise): the
// launched function is the host stub, named by its symbol (StubName, asked
// once per stub); a failed launch of a KV-transfer kernel is a failed call
// with its kernel, one of another kernel or an unnamed stub no record.
func TestKernelRuntimeLayerStubs(t *testing.T) {
	w := newKernelWorld(t)
	for range 2 {
		w.launch("cudaLaunchKernel", 1, 0x401000, loadStream, false, 100)
	}
	w.launch("cudaLaunchKernel", 1, 0x402000, loadStream, false, 100)
	got := w.transfers()
	if len(got) != 2 {
		t.Fatalf("%d records: %+v", len(got), got)
	}
	for _, tr := range got {
		if !tr.Failed() || tr.Error.Code != 100 || tr.Error.Name != "cudaErrorNoDevice" || tr.Kernel != "transfer_kernel_impl" ||
			tr.Op != event.OpKernelCopy || tr.Mover != MoverSM || !tr.BytesUnknown || tr.API != "cudaLaunchKernel" {
			t.Errorf("failed launch: %+v", tr)
		}
	}
	if w.stubs[0x401000] != 1 || w.stubs[0x402000] != 1 {
		t.Errorf("StubName asked %v: once per stub expected", w.stubs)
	}
	if ks := w.e.KernelStats(); ks.Failed != 3 || ks.Launches != 0 {
		t.Errorf("stats %+v", ks)
	}
}

// Copies say their mover, next to the kernels'.
func TestCopyMover(t *testing.T) {
	w := newKernelWorld(t)
	w.setDevice(1, 0)
	w.h2d(1, dev0)
	got := w.transfers()
	if len(got) != 1 || got[0].Mover != MoverCopyEngine || got[0].BytesUnknown || got[0].Bytes != mib {
		t.Errorf("copy: %+v", got)
	}
}

// A process past MaxProcesses is not tracked: its failed launches and naming
// calls make no record (their kernel cannot be known), its failed copies do.
func TestKernelCallsUntracked(t *testing.T) {
	e, s := newTest(t, Config{MaxProcesses: 1})
	e.ObservedFromStart(1)
	e.ObservedFromStart(2) // past the cap
	for _, sym := range []string{"cuLaunchKernel", "cudaLaunchKernel", "cuModuleGetFunction"} {
		c := mk(t, sym, 2, 100, 150)
		c.PID, c.Ret, c.Handle = 2, 100, 0x401000
		e.Handle(c)
	}
	c := mk(t, "cuMemcpyHtoD_v2", 2, 200, 250)
	c.PID, c.Ret, c.Bytes = 2, 1, mib
	e.Handle(c)
	e.Flush()
	if len(s.got) != 1 || s.got[0].Op != event.OpCopy || !s.got[0].Failed() {
		t.Errorf("untracked process: %+v", s.got)
	}
	if e.Stats().ProcessCapHits == 0 {
		t.Error("pid 2 was tracked: the test proves nothing")
	}
}
