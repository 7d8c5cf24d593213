package probes

import "github.com/lanewatch/lanewatch/event"

// The probe table: every symbol lanewatch attaches to, the program that runs
// there and how the raw argument registers decode into a Call. One row per
// exported symbol; the _ptds/_ptsz rows are the per-thread-default-stream
// forms of the same call (same arguments, different default stream).
//
// CUDA is traced at the driver (docs/design.md, "One pair per call"): every
// copy, whoever makes it — the runtime, a static runtime inside another
// library, an application on the driver API — reaches an exported driver
// entry point, so one entry+return pair there gives its arguments and its
// result. A driver row names the runtime call that reaches it (Runtime);
// the runtime's own rows are attached only to a process whose driver failed
// to initialise, where runtime calls fail before reaching the driver.

// kindFromArg marks a row whose direction is its cudaMemcpyKind argument,
// kindFromTypes one whose direction follows the CUmemorytype of each side.
const (
	kindFromArg   event.CopyKind = 255
	kindFromTypes event.CopyKind = 254
)

// Program selects the BPF program attached at a row's symbol.
type Program uint8

const (
	ProgEntry        Program = iota + 1 // arguments at entry only, no result
	ProgEntryReturn                     // arguments kept at entry, emitted at return with the result
	ProgBatch                           // entry walks the dst/src/size arrays; the result at return
	ProgCopy2D                          // entry reads struct CUDA_MEMCPY2D; the result at return
	ProgPostSend                        // entry; walks the ibv_send_wr chain
	ProgPostRecv                        // entry; walks the ibv_recv_wr chain
	ProgPollCQ                          // entry kept, one event per completion at return
	ProgProp                            // entry reads a CUmemLocation from the struct at the last argument; the result at return
	ProgName                            // entry kept; at return the name argument (LW_NAME_ARG) goes out in pieces, then the result
	ProgLaunchEx                        // entry reads the launch config at argument 0 (grid, block, stream); the result at return
	ProgModifyQP                        // entry reads the QP's number and where attr connects it (enum lw_qp_arg); the result at return
	ProgLinker                          // the dynamic linker's notification: entry only, holding the thread while a new CUDA file is probed (hold.go)
	ProgUCP                             // entry puts a UCP transfer in one shape and reads its request parameters (enum lw_ucp_arg); the result at return
	ProgUCTLane                         // entry only, emits nothing: notes the lane in the UCP call it is nested in (lw_uct_lane)
	ProgUCTIface                        // entry reads the transport and device names (enum lw_uct_iface_arg); *iface_p at return
	ProgUCPMemMap                       // entry reads the range and memory type (enum lw_ucp_mem_map_arg); *memh_p at return
	ProgFabricMsg                       // entry reads a libfabric struct fi_msg or fi_msg_tagged (enum lw_fabric_msg_arg); the result at return
	ProgFabricRMAMsg                    // the same for a struct fi_msg_rma, its first remote address too
)

// Dims says where a launch row finds its grid and block dimensions.
type Dims uint8

const (
	DimsNone   Dims = iota
	DimsArgs        // six unsigned arguments from argument 1 (cuLaunchKernel)
	DimsDim3        // two dim3 passed by value from argument 1, each in two registers (cudaLaunchKernel)
	DimsConfig      // the config lw_launch_ex_enter read (enum lw_launch_arg)
)

// noArg marks an argument a call does not have.
const noArg = -1

// Args maps the semantic fields of a call to 0-based argument positions
// (System V: 0..5 in registers, 6.. on the stack).
type Args struct {
	Dst, Src, Bytes int // copy operands; Bytes is width for 2D
	Height          int // 2D copies: bytes = width*height
	Kind            int // cudaMemcpyKind argument
	Stream          int
	Event           int
	Ptr             int // range start for register/free, out pointer for allocs
	Size            int // range length for alloc/register
	Flags           int
	Count           int // batch: number of entries
	Device          int // a CUdevice argument (context and bus-id calls)
	Handle          int // a VMM allocation handle, a memory pool or a dma-buf fd
	Offset          int // where in Handle a mapping or a memory region starts
}

// Probe is one row of the table.
type Probe struct {
	Symbol  string
	Layer   event.Layer
	Op      event.Op
	Program Program
	Kind    event.CopyKind // fixed direction, or kindFromArg
	Args    Args
	NArgs   int  // arguments the program reads (covers every index in Args)
	Out     bool // Ptr is an out pointer: the program reads *Ptr at return
	// OutRet: the program reads 8 bytes at the return value + OutOff instead
	// (the lkey and rkey of a new struct ibv_mr, the context of a new QP).
	OutRet bool
	OutOff uint16
	// OutStr: the program also copies 16 bytes at the out pointer at return
	// (the string cuDeviceGetPCIBusId wrote) into Call.BusID.
	OutStr bool
	// OutHandle: the out pointer is Args.Handle's argument (a new VMM
	// handle, pool or dma-buf fd) instead of Args.Ptr's; OutInt: it points
	// to 4 bytes (an int fd).
	OutHandle, OutInt bool
	// Runtime is the runtime call that reaches this driver row, the API a
	// copy made through the runtime is reported under ("cudaMemcpyAsync").
	Runtime string
	// Dims: a launch row's grid and block dimensions.
	Dims Dims
}

// ProviderPrefix names rows attached by file offset: the provider functions
// a stripped RDMA provider only exposes through struct ibv_context_ops.
const ProviderPrefix = "provider:"

func copyArgs(dst, src, bytes, kind, stream int) Args {
	return Args{Dst: dst, Src: src, Bytes: bytes, Height: noArg, Kind: kind, Stream: stream,
		Event: noArg, Ptr: noArg, Size: noArg, Flags: noArg, Count: noArg, Device: noArg, Handle: noArg, Offset: noArg}
}

func memArgs(ptr, size, flags int) Args {
	return Args{Dst: noArg, Src: noArg, Bytes: noArg, Height: noArg, Kind: noArg, Stream: noArg,
		Event: noArg, Ptr: ptr, Size: size, Flags: flags, Count: noArg, Device: noArg, Handle: noArg, Offset: noArg}
}

func syncArgs(stream, event, flags int) Args {
	return Args{Dst: noArg, Src: noArg, Bytes: noArg, Height: noArg, Kind: noArg, Stream: stream,
		Event: event, Ptr: noArg, Size: noArg, Flags: flags, Count: noArg, Device: noArg, Handle: noArg, Offset: noArg}
}

// ctxArgs is a context or device call: ptr the context (or an out
// pointer), dev the CUdevice argument.
func ctxArgs(ptr, dev int) Args {
	a := memArgs(ptr, noArg, noArg)
	a.Device = dev
	return a
}

// withForms returns the row plus its per-thread-default-stream twin.
func withForms(p Probe, suffix string) []Probe {
	twin := p
	twin.Symbol = p.Symbol + suffix
	return []Probe{p, twin}
}

// Table lists every probe. Row order is the probe id carried in BPF cookies,
// so append only.
var Table = buildTable()

func buildTable() []Probe {
	var t []Probe
	add := func(ps ...Probe) { t = append(t, ps...) }

	// --- CUDA driver: every call that moves bytes, pins or allocates memory,
	// or orders work, with its result. Runtime (11.8, 12.4) dispatch, read in
	// their code: cudaMemcpy[Async] with an explicit kind calls the
	// matching HtoD/DtoH/DtoD entry point, cudaMemcpyDefault the unified
	// cuMemcpy[Async]; cudaMemcpy2D calls cuMemcpy2DUnaligned_v2;
	// cudaMallocHost and cudaHostAlloc both call cuMemHostAlloc. ---
	driver := func(sym, runtime string, op event.Op, kind event.CopyKind, a Args, n int) Probe {
		return Probe{Symbol: sym, Layer: event.LayerDriver, Op: op, Program: ProgEntryReturn, Kind: kind, Args: a, NArgs: n, Runtime: runtime}
	}
	twins := func(p Probe, suffix, runtimeSuffix string) []Probe {
		ps := withForms(p, suffix)
		if p.Runtime != "" {
			ps[1].Runtime = p.Runtime + runtimeSuffix
		}
		return ps
	}
	add(driver("cuInit", "", event.OpInit, 0, syncArgs(noArg, noArg, 0), 1))
	// cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t bytes[, CUstream])
	for _, c := range []struct {
		sym  string
		kind event.CopyKind
	}{{"cuMemcpyHtoD", event.CopyHostToDevice}, {"cuMemcpyDtoH", event.CopyDeviceToHost}, {"cuMemcpyDtoD", event.CopyDeviceToDevice}} {
		add(twins(driver(c.sym+"_v2", "cudaMemcpy", event.OpCopy, c.kind, copyArgs(0, 1, 2, noArg, noArg), 3), "_ptds", "_ptds")...)
		add(twins(driver(c.sym+"Async_v2", "cudaMemcpyAsync", event.OpCopy, c.kind, copyArgs(0, 1, 2, noArg, 3), 4), "_ptsz", "_ptsz")...)
	}
	add(twins(driver("cuMemcpy", "cudaMemcpy", event.OpCopy, event.CopyDefault, copyArgs(0, 1, 2, noArg, noArg), 3), "_ptds", "_ptds")...)
	add(twins(driver("cuMemcpyAsync", "cudaMemcpyAsync", event.OpCopy, event.CopyDefault, copyArgs(0, 1, 2, noArg, 3), 4), "_ptsz", "_ptsz")...)
	// cuMemcpy2D*(const CUDA_MEMCPY2D *[, CUstream]): lw_copy2d_enter puts the
	// struct's fields in the argument slots of enum lw_copy2d_arg.
	c2d := func(sym, runtime string, stream int) Probe {
		a := copyArgs(int(lanewatchLwCopy2dArgLW_C2D_DST), int(lanewatchLwCopy2dArgLW_C2D_SRC), int(lanewatchLwCopy2dArgLW_C2D_WIDTH),
			int(lanewatchLwCopy2dArgLW_C2D_TYPES), stream)
		a.Height = int(lanewatchLwCopy2dArgLW_C2D_HEIGHT)
		p := driver(sym, runtime, event.OpCopy2D, kindFromTypes, a, 2)
		p.Program = ProgCopy2D
		return p
	}
	add(twins(c2d("cuMemcpy2D_v2", "", noArg), "_ptds", "")...)
	add(twins(c2d("cuMemcpy2DUnaligned_v2", "cudaMemcpy2D", noArg), "_ptds", "_ptds")...)
	add(twins(c2d("cuMemcpy2DAsync_v2", "cudaMemcpy2DAsync", 1), "_ptsz", "_ptsz")...)
	// cuMemcpyPeer(dst, dstCtx, src, srcCtx, bytes[, stream]): Ptr is the
	// destination's context, which names its device.
	peer := func(stream int) Args { a := copyArgs(0, 2, 4, noArg, stream); a.Ptr = 1; return a }
	add(driver("cuMemcpyPeer", "cudaMemcpyPeer", event.OpCopyPeer, event.CopyDeviceToDevice, peer(noArg), 5))
	add(twins(driver("cuMemcpyPeerAsync", "cudaMemcpyPeerAsync", event.OpCopyPeer, event.CopyDeviceToDevice, peer(5), 6), "_ptsz", "")...)
	// cuMemcpyBatchAsync(dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs, failIdx, stream): CUDA 12.8
	dbatch := copyArgs(0, 1, 2, noArg, 8)
	dbatch.Count = 3
	b := driver("cuMemcpyBatchAsync", "cudaMemcpyBatchAsync", event.OpCopyBatch, event.CopyDefault, dbatch, 9)
	b.Program = ProgBatch
	add(twins(b, "_ptsz", "_ptsz")...)

	out := func(p Probe) Probe { p.Out = true; return p }
	add(driver("cuMemHostRegister_v2", "cudaHostRegister", event.OpHostRegister, 0, memArgs(0, 1, 2), 3))
	add(out(driver("cuMemHostAlloc", "cudaHostAlloc", event.OpHostAlloc, 0, memArgs(0, 1, 2), 3)))
	add(out(driver("cuMemAllocHost_v2", "", event.OpHostAlloc, 0, memArgs(0, 1, noArg), 2))) // driver API programs only
	add(driver("cuMemHostUnregister", "cudaHostUnregister", event.OpHostUnregister, 0, memArgs(0, noArg, noArg), 1))
	add(driver("cuMemFreeHost", "cudaFreeHost", event.OpHostFree, 0, memArgs(0, noArg, noArg), 1))
	add(out(driver("cuMemAlloc_v2", "cudaMalloc", event.OpDeviceAlloc, 0, memArgs(0, 1, noArg), 2)))
	add(driver("cuMemFree_v2", "cudaFree", event.OpDeviceFree, 0, memArgs(0, noArg, noArg), 1))

	add(twins(driver("cuStreamSynchronize", "cudaStreamSynchronize", event.OpStreamSync, 0, syncArgs(0, noArg, noArg), 1), "_ptsz", "_ptsz")...)
	add(twins(driver("cuEventRecord", "cudaEventRecord", event.OpEventRecord, 0, syncArgs(1, 0, noArg), 2), "_ptsz", "_ptsz")...)
	add(twins(driver("cuEventRecordWithFlags", "cudaEventRecordWithFlags", event.OpEventRecord, 0, syncArgs(1, 0, 2), 3), "_ptsz", "_ptsz")...)
	add(driver("cuEventSynchronize", "cudaEventSynchronize", event.OpEventSync, 0, syncArgs(noArg, 0, noArg), 1))
	add(twins(driver("cuStreamWaitEvent", "cudaStreamWaitEvent", event.OpStreamWaitEvent, 0, syncArgs(0, 1, 2), 3), "_ptsz", "_ptsz")...)

	// --- CUDA runtime: attached to a process only when its driver failed to
	// initialise (then every runtime call fails before reaching the driver,
	// and only here is its error seen). ---
	rt := func(sym string, op event.Op, prog Program, kind event.CopyKind, a Args, n int) Probe {
		return Probe{Symbol: sym, Layer: event.LayerRuntime, Op: op, Program: prog, Kind: kind, Args: a, NArgs: n}
	}
	// cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
	add(withForms(rt("cudaMemcpy", event.OpCopy, ProgEntryReturn, kindFromArg, copyArgs(0, 1, 2, 3, noArg), 4), "_ptds")...)
	// cudaMemcpyAsync(dst, src, count, kind, cudaStream_t stream)
	add(withForms(rt("cudaMemcpyAsync", event.OpCopy, ProgEntryReturn, kindFromArg, copyArgs(0, 1, 2, 3, 4), 5), "_ptsz")...)
	// cudaMemcpy2D(dst, dpitch, src, spitch, width, height, kind): kind is the 7th, on the stack
	rc2d := copyArgs(0, 2, 4, 6, noArg)
	rc2d.Height = 5
	add(withForms(rt("cudaMemcpy2D", event.OpCopy2D, ProgEntryReturn, kindFromArg, rc2d, 7), "_ptds")...)
	// cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, kind, stream): 7th and 8th on the stack
	rc2da := copyArgs(0, 2, 4, 6, 7)
	rc2da.Height = 5
	add(withForms(rt("cudaMemcpy2DAsync", event.OpCopy2D, ProgEntryReturn, kindFromArg, rc2da, 8), "_ptsz")...)
	// cudaMemcpyPeer(dst, int dstDevice, src, int srcDevice, count): no per-thread form exists
	rtPeer := func(stream int) Args { a := copyArgs(0, 2, 4, noArg, stream); a.Device = 1; return a }
	add(rt("cudaMemcpyPeer", event.OpCopyPeer, ProgEntryReturn, event.CopyDeviceToDevice, rtPeer(noArg), 5))
	// cudaMemcpyPeerAsync(dst, dstDevice, src, srcDevice, count, stream)
	add(rt("cudaMemcpyPeerAsync", event.OpCopyPeer, ProgEntryReturn, event.CopyDeviceToDevice, rtPeer(5), 6))
	// cudaMemcpyBatchAsync(void **dsts, void **srcs, size_t *sizes, size_t count,
	//   cudaMemcpyAttributes *attrs, size_t *attrsIdxs, size_t numAttrs, size_t *failIdx, cudaStream_t stream)
	// (CUDA 12.8 layout: the stream is the 9th argument, on the stack.)
	batch := copyArgs(0, 1, 2, noArg, 8)
	batch.Count = 3
	add(withForms(rt("cudaMemcpyBatchAsync", event.OpCopyBatch, ProgBatch, event.CopyDefault, batch, 9), "_ptsz")...)
	rtOut := func(p Probe) Probe { p.Out = true; return p }
	add(rtOut(rt("cudaHostAlloc", event.OpHostAlloc, ProgEntryReturn, 0, memArgs(0, 1, 2), 3)))      // (void **pHost, size_t size, unsigned flags)
	add(rtOut(rt("cudaMallocHost", event.OpHostAlloc, ProgEntryReturn, 0, memArgs(0, 1, noArg), 2))) // (void **ptr, size_t size)
	add(rt("cudaHostRegister", event.OpHostRegister, ProgEntryReturn, 0, memArgs(0, 1, 2), 3))       // (void *ptr, size_t size, unsigned flags)
	add(rt("cudaHostUnregister", event.OpHostUnregister, ProgEntryReturn, 0, memArgs(0, noArg, noArg), 1))
	add(rt("cudaFreeHost", event.OpHostFree, ProgEntryReturn, 0, memArgs(0, noArg, noArg), 1))
	add(rtOut(rt("cudaMalloc", event.OpDeviceAlloc, ProgEntryReturn, 0, memArgs(0, 1, noArg), 2))) // (void **devPtr, size_t size)
	add(rt("cudaFree", event.OpDeviceFree, ProgEntryReturn, 0, memArgs(0, noArg, noArg), 1))
	add(withForms(rt("cudaStreamSynchronize", event.OpStreamSync, ProgEntryReturn, 0, syncArgs(0, noArg, noArg), 1), "_ptsz")...)
	add(withForms(rt("cudaEventRecord", event.OpEventRecord, ProgEntryReturn, 0, syncArgs(1, 0, noArg), 2), "_ptsz")...) // (event, stream)
	add(rt("cudaEventSynchronize", event.OpEventSync, ProgEntryReturn, 0, syncArgs(noArg, 0, noArg), 1))
	add(withForms(rt("cudaStreamWaitEvent", event.OpStreamWaitEvent, ProgEntryReturn, 0, syncArgs(0, 1, 2), 3), "_ptsz")...) // (stream, event, flags)
	add(rt("cudaGetDeviceCount", event.OpInit, ProgEntryReturn, 0, syncArgs(noArg, noArg, noArg), 1))

	// --- dynamic linker: fires after every dlopen/dlclose, so new libraries get probed ---
	add(Probe{Symbol: "_dl_debug_state", Layer: event.LayerLinker, Op: event.OpLinkerUpdate, Program: ProgLinker,
		Args: syncArgs(noArg, noArg, noArg), NArgs: 0})

	// --- RDMA verbs (libibverbs exports) ---
	verbs := func(sym string, op event.Op, prog Program, a Args, n int) Probe {
		return Probe{Symbol: sym, Layer: event.LayerVerbs, Op: op, Program: prog, Args: a, NArgs: n}
	}
	keys := func(p Probe) Probe { p.OutRet, p.OutOff = true, 36; return p } // struct ibv_mr: lkey at 36, rkey at 40
	ctxOf := func(p Probe) Probe { p.OutRet, p.OutOff = true, 0; return p } // ibv_cq/ibv_qp: context first
	// ibv_reg_mr_iova2(pd, addr, length, iova, access): the funnel ibv_reg_mr and its variants call
	add(keys(verbs("ibv_reg_mr_iova2", event.OpMRRegister, ProgEntryReturn, memArgs(1, 2, 4), 5)))
	// ibv_reg_dmabuf_mr(pd, offset, length, iova, fd, access): the region is the dma-buf fd's
	// memory from offset (docs/design.md, "RDMA"); iova is how work requests address it
	dmabuf := memArgs(3, 2, 5)
	dmabuf.Handle, dmabuf.Offset = 4, 1
	add(keys(verbs("ibv_reg_dmabuf_mr", event.OpMRRegister, ProgEntryReturn, dmabuf, 6)))
	add(verbs("ibv_dereg_mr", event.OpMRDeregister, ProgEntry, memArgs(0, noArg, noArg), 1))
	// ibv_open_device(device) returns the context itself; create_cq/create_qp return objects whose first field is it
	open := verbs("ibv_open_device", event.OpVerbsContext, ProgEntryReturn, memArgs(noArg, noArg, noArg), 1)
	open.OutRet = false
	add(open)
	add(ctxOf(verbs("ibv_create_cq", event.OpVerbsContext, ProgEntryReturn, memArgs(noArg, noArg, noArg), 5)))
	add(ctxOf(verbs("ibv_create_qp", event.OpVerbsContext, ProgEntryReturn, memArgs(noArg, noArg, noArg), 2)))

	// --- RDMA provider data path (attached at offsets read from the ops table) ---
	prov := func(name string, op event.Op, prog Program, n int) Probe {
		return Probe{Symbol: ProviderPrefix + name, Layer: event.LayerProvider, Op: op, Program: prog,
			Args: memArgs(noArg, noArg, noArg), NArgs: n}
	}
	add(prov("post_send", event.OpPostSend, ProgPostSend, 3))
	add(prov("post_recv", event.OpPostRecv, ProgPostRecv, 3))
	add(prov("poll_cq", event.OpPollCQ, ProgPollCQ, 3))

	// --- CUDA driver: device and context selection, which GPU each thread's
	// calls use (docs/design.md, "Placement"). The runtime resolves these by
	// name through cuGetProcAddress (11.8 and 12.4 name them all, versioned
	// as below) and makes a device's primary context current on a thread
	// with them: cudaSetDevice, or device 0 on a thread's first call.
	// cuCtxGetCurrent/cuCtxGetDevice are not probed: they answer, and the
	// runtime asks them on its hot paths. Nothing a copy does reaches these,
	// so they cost no copy a probe. ---
	ctxRow := func(sym, runtime string, op event.Op, a Args, n int) Probe {
		return driver(sym, runtime, op, 0, a, n)
	}
	// cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
	add(out(ctxRow("cuDevicePrimaryCtxRetain", "", event.OpCtxRetain, ctxArgs(0, 1), 2)))
	// cuCtxCreate_v2(CUcontext *pctx, unsigned flags, CUdevice dev)
	add(out(ctxRow("cuCtxCreate_v2", "", event.OpCtxCreate, ctxArgs(0, 2), 3)))
	// cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *params, int numParams, unsigned flags, CUdevice dev)
	add(out(ctxRow("cuCtxCreate_v3", "", event.OpCtxCreate, ctxArgs(0, 4), 5)))
	// cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned flags, CUdevice dev): CUDA 12.5+
	add(out(ctxRow("cuCtxCreate_v4", "", event.OpCtxCreate, ctxArgs(0, 3), 4)))
	// cuCtxSetCurrent(CUcontext ctx), cuCtxPushCurrent_v2(ctx), cuCtxPopCurrent_v2(CUcontext *pctx), cuCtxDestroy_v2(ctx)
	add(ctxRow("cuCtxSetCurrent", "", event.OpCtxSetCurrent, ctxArgs(0, noArg), 1))
	add(ctxRow("cuCtxPushCurrent_v2", "", event.OpCtxPush, ctxArgs(0, noArg), 1))
	add(out(ctxRow("cuCtxPopCurrent_v2", "", event.OpCtxPop, ctxArgs(0, noArg), 1)))
	add(ctxRow("cuCtxDestroy_v2", "", event.OpCtxDestroy, ctxArgs(0, noArg), 1))
	// cuDeviceGetPCIBusId(char *pciBusId, int len, CUdevice dev): the
	// process's own answer to which PCI function an ordinal is (NCCL asks it
	// for every device it uses); the string is read at return.
	bus := out(ctxRow("cuDeviceGetPCIBusId", "cudaDeviceGetPCIBusId", event.OpDeviceBusID, ctxArgs(0, 2), 3))
	bus.OutStr = true
	add(bus)

	// --- CUDA driver and runtime: the allocators beyond cuMemAlloc and
	// cuMemHostAlloc, so that no memory of theirs is taken for pageable
	// (docs/design.md, "Late attach"). NVIDIA's 535 and 550 drivers export
	// each under these names; the 11.8 and 12.4 runtimes resolve them through
	// cuGetProcAddress: cudaMallocManaged → cuMemAllocManaged,
	// cudaMallocAsync[_ptsz] → cuMemAllocAsync[_ptsz], cudaMallocFromPoolAsync
	// → cuMemAllocFromPoolAsync, cudaFreeAsync → cuMemFreeAsync,
	// cudaMemPoolCreate/Destroy → cuMemPoolCreate/Destroy. The virtual
	// memory management calls (cuMemCreate ...) have no runtime form. ---
	handleArgs := func(h int) Args {
		a := memArgs(noArg, noArg, noArg)
		a.Handle = h
		return a
	}
	outHandle := func(p Probe) Probe { p.OutHandle = true; return p }
	// A row whose last argument is a CUmemAllocationProp or CUmemPoolProps.
	prop := func(p Probe) Probe { p.Program = ProgProp; return p }
	// cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned flags)
	add(out(driver("cuMemAllocManaged", "cudaMallocManaged", event.OpManagedAlloc, 0, memArgs(0, 1, 2), 3)))
	// cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream): from the
	// current pool of the stream's device, which cuDeviceSetMemPool requires
	// to be local to that device (cuda.h): device memory.
	async := memArgs(0, 1, noArg)
	async.Stream = 2
	add(twins(out(driver("cuMemAllocAsync", "cudaMallocAsync", event.OpDeviceAlloc, 0, async, 3)), "_ptsz", "_ptsz")...)
	// cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream)
	fromPool := memArgs(0, 1, noArg)
	fromPool.Handle, fromPool.Stream = 2, 3
	add(twins(out(driver("cuMemAllocFromPoolAsync", "cudaMallocFromPoolAsync", event.OpPoolAlloc, 0, fromPool, 4)), "_ptsz", "_ptsz")...)
	// cuMemFreeAsync(CUdeviceptr dptr, CUstream): any stream-ordered allocation
	freeAsync := memArgs(0, noArg, noArg)
	freeAsync.Stream = 1
	add(twins(driver("cuMemFreeAsync", "cudaFreeAsync", event.OpDeviceFree, 0, freeAsync, 2), "_ptsz", "_ptsz")...)
	// cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props), cuMemPoolDestroy(pool)
	add(prop(outHandle(driver("cuMemPoolCreate", "cudaMemPoolCreate", event.OpPoolCreate, 0, handleArgs(0), 2))))
	add(driver("cuMemPoolDestroy", "cudaMemPoolDestroy", event.OpPoolDestroy, 0, handleArgs(0), 1))
	// cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const
	// CUmemAllocationProp *prop, unsigned long long flags): three arguments
	// read, so the properties are the last.
	create := handleArgs(0)
	create.Size = 1
	add(prop(outHandle(driver("cuMemCreate", "", event.OpMemCreate, 0, create, 3))))
	add(driver("cuMemRelease", "", event.OpMemRelease, 0, handleArgs(0), 1)) // (handle)
	// cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr, flags)
	add(out(driver("cuMemAddressReserve", "", event.OpAddressReserve, 0, memArgs(0, 1, noArg), 2)))
	add(driver("cuMemAddressFree", "", event.OpAddressFree, 0, memArgs(0, 1, noArg), 2)) // (ptr, size)
	// cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle, flags)
	mapArgs := memArgs(0, 1, 4)
	mapArgs.Offset, mapArgs.Handle = 2, 3
	add(driver("cuMemMap", "", event.OpMemMap, 0, mapArgs, 5))
	add(driver("cuMemUnmap", "", event.OpMemUnmap, 0, memArgs(0, 1, noArg), 2)) // (ptr, size)
	// cuMemGetHandleForAddressRange(void *handle, CUdeviceptr dptr, size_t
	// size, CUmemRangeHandleType type, flags): for CU_MEM_RANGE_HANDLE_TYPE_
	// DMA_BUF_FD, *handle is an int fd that ibv_reg_dmabuf_mr may register.
	export := memArgs(1, 2, 3)
	export.Handle = 0
	dmabufOut := outHandle(driver("cuMemGetHandleForAddressRange", "", event.OpDmabufExport, 0, export, 4))
	dmabufOut.OutInt = true
	add(dmabufOut)
	// The runtime forms, attached only where the driver failed to initialise.
	// cudaMallocManaged(void **devPtr, size_t size, unsigned flags)
	add(rtOut(rt("cudaMallocManaged", event.OpManagedAlloc, ProgEntryReturn, 0, memArgs(0, 1, 2), 3)))
	add(withForms(rtOut(rt("cudaMallocAsync", event.OpDeviceAlloc, ProgEntryReturn, 0, async, 3)), "_ptsz")...) // (void **devPtr, size, stream)
	// cudaMallocFromPoolAsync(void **ptr, size_t size, cudaMemPool_t pool, cudaStream_t stream)
	add(withForms(rtOut(rt("cudaMallocFromPoolAsync", event.OpPoolAlloc, ProgEntryReturn, 0, fromPool, 4)), "_ptsz")...)
	add(withForms(rt("cudaFreeAsync", event.OpDeviceFree, ProgEntryReturn, 0, freeAsync, 2), "_ptsz")...) // (void *devPtr, stream)
	// cudaMemPoolCreate(cudaMemPool_t *memPool, const cudaMemPoolProps *props): laid out as CUmemPoolProps
	add(prop(outHandle(rt("cudaMemPoolCreate", event.OpPoolCreate, ProgEntryReturn, 0, handleArgs(0), 2))))
	add(rt("cudaMemPoolDestroy", event.OpPoolDestroy, ProgEntryReturn, 0, handleArgs(0), 1))

	// --- Kernels (docs/design.md, "Kernel movers"): launches, and the
	// calls that give a kernel handle its name. Read in the 11.8 and 12.4
	// runtimes: cudaLaunchKernel[_ptsz] calls cuLaunchKernel[_ptsz] (all
	// eleven arguments) with a CUfunction the runtime got once per context
	// and kernel from cuModuleGetFunction(&f, module, the name
	// __cudaRegisterFunction registered); cudaLaunchKernelExC[_ptsz] calls
	// cuLaunchKernelEx[_ptsz]. 12.4 also resolves cuLibraryGetKernel and
	// cuKernelGetFunction, which programs on the driver API (and CUDA 12's
	// CUkernel handles, launchable as functions) use. A launch costs its
	// process one entry+return pair. ---
	launchArgs := func(handle, stream int) Args {
		a := handleArgs(handle)
		a.Stream = stream
		return a
	}
	dims := func(p Probe, d Dims) Probe { p.Dims = d; return p }
	// cuLaunchKernel(CUfunction f, gridX, gridY, gridZ, blockX, blockY,
	// blockZ, unsigned sharedMemBytes, CUstream hStream, void **params,
	// void **extra): blockZ, the shared memory and the stream on the stack.
	add(twins(dims(driver("cuLaunchKernel", "cudaLaunchKernel", event.OpLaunch, 0, launchArgs(0, 8), 9), DimsArgs), "_ptsz", "_ptsz")...)
	// cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **params, void **extra)
	ex := dims(driver("cuLaunchKernelEx", "cudaLaunchKernelExC", event.OpLaunch, 0, launchArgs(1, int(lanewatchLwLaunchArgLW_LAUNCH_STREAM)), 2), DimsConfig)
	ex.Program = ProgLaunchEx
	add(twins(ex, "_ptsz", "_ptsz")...)
	// cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name) and
	// cuLibraryGetKernel(CUkernel *pKernel, CUlibrary library, const char *name):
	// the new handle (out), its parent, the name (third: LW_NAME_ARG).
	named := func(sym string) Probe {
		a := handleArgs(0)
		a.Ptr = 1
		p := outHandle(driver(sym, "", event.OpKernelName, 0, a, 3))
		p.Program = ProgName
		return p
	}
	add(named("cuModuleGetFunction"), named("cuLibraryGetKernel"))
	// cuKernelGetFunction(CUfunction *pFunc, CUkernel kernel)
	kf := handleArgs(0)
	kf.Ptr = 1
	add(outHandle(driver("cuKernelGetFunction", "", event.OpKernelFunction, 0, kf, 2)))
	// The runtime forms, attached only where the driver failed to
	// initialise: the launched function is the host stub.
	// cudaLaunchKernel(const void *func, dim3 gridDim, dim3 blockDim, void
	// **args, size_t sharedMem, cudaStream_t stream): each dim3 in two
	// registers, the shared memory and the stream on the stack.
	add(withForms(dims(rt("cudaLaunchKernel", event.OpLaunch, ProgEntryReturn, 0, launchArgs(0, 7), 8), DimsDim3), "_ptsz")...)
	// cudaLaunchKernelExC(const cudaLaunchConfig_t *config, const void *func, void **args)
	rex := dims(rt("cudaLaunchKernelExC", event.OpLaunch, ProgLaunchEx, 0, launchArgs(1, int(lanewatchLwLaunchArgLW_LAUNCH_STREAM)), 2), DimsConfig)
	add(withForms(rex, "_ptsz")...)

	// Host waits for a whole context (docs/design.md, "Compute overlap"):
	// cudaDeviceSynchronize calls cuCtxSynchronize; both take no argument.
	add(driver("cuCtxSynchronize", "cudaDeviceSynchronize", event.OpCtxSync, 0, syncArgs(noArg, noArg, noArg), 0))
	add(rt("cudaDeviceSynchronize", event.OpCtxSync, ProgEntryReturn, 0, syncArgs(noArg, noArg, noArg), 0))
	// --- RDMA setup: where each QP connects, for the ordering rules
	// (docs/design.md, "Completed is not consumable"). ibv_modify_qp(qp,
	// attr, attr_mask): a setup call, never on the data path. ---
	add(verbs("ibv_modify_qp", event.OpQPModify, ProgModifyQP, memArgs(noArg, noArg, 2), 3))

	// --- CUDA graphs (docs/design.md, "CUDA graphs"): a graph launch runs
	// the copies, kernels and records captured into it with no call of
	// their own, so it is reported as compute on its stream; work issued on
	// a capturing stream is recorded, not run, so the engine tracks each
	// stream's capture. NVIDIA's 535 and 550 drivers export all of these
	// but cuStreamBeginCaptureToGraph (550 only, CUDA 12.3+); the 11.8 and
	// 12.4 runtimes resolve them: cudaGraphLaunch[_ptsz] → cuGraphLaunch
	// [_ptsz], cudaStreamBeginCapture[_ptsz] → cuStreamBeginCapture_v2
	// [_ptsz], cudaStreamEndCapture[_ptsz] → cuStreamEndCapture[_ptsz].
	// A graph launch costs one entry+return pair, like a kernel launch. ---
	// cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream)
	add(twins(driver("cuGraphLaunch", "cudaGraphLaunch", event.OpGraphLaunch, 0, launchArgs(0, 1), 2), "_ptsz", "_ptsz")...)
	// cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode)
	add(twins(driver("cuStreamBeginCapture_v2", "cudaStreamBeginCapture", event.OpCaptureBegin, 0, syncArgs(0, noArg, 1), 2), "_ptsz", "_ptsz")...)
	// cuStreamBeginCapture(CUstream hStream): CUDA 10.0's form, still exported
	add(twins(driver("cuStreamBeginCapture", "", event.OpCaptureBegin, 0, syncArgs(0, noArg, noArg), 1), "_ptsz", "")...)
	// cuStreamBeginCaptureToGraph(CUstream hStream, CUgraph hGraph, const
	// CUgraphNode *deps, const CUgraphEdgeData *edges, size_t n, mode)
	add(twins(driver("cuStreamBeginCaptureToGraph", "cudaStreamBeginCaptureToGraph", event.OpCaptureBegin, 0, syncArgs(0, noArg, noArg), 1), "_ptsz", "_ptsz")...)
	// cuStreamEndCapture(CUstream hStream, CUgraph *phGraph)
	add(twins(driver("cuStreamEndCapture", "cudaStreamEndCapture", event.OpCaptureEnd, 0, syncArgs(0, noArg, noArg), 1), "_ptsz", "_ptsz")...)
	// The runtime form, attached only where the driver failed to initialise.
	// cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream)
	add(withForms(rt("cudaGraphLaunch", event.OpGraphLaunch, ProgEntryReturn, 0, launchArgs(0, 1), 2), "_ptsz")...)

	// --- UCX (docs/design.md, "Transfer libraries"): NIXL's default
	// backend. A transfer as the application posted it is a UCP call,
	// entry+return; ucp_put_nbi/get_nbi/put_nb/get_nb call the _nbx forms
	// (read in 1.13's code), so these four are every put, get and send.
	// The lane it went on is the first UCT endpoint call nested in it,
	// whose interface uct_iface_open named. A request the call returned
	// is complete by the time it is freed (ucp_request_free or _release):
	// an application frees it in its completion callback or once
	// ucp_request_check_status said done. ---
	ucp := func(sym string, op event.Op, n int) Probe {
		a := copyArgs(noArg, int(lanewatchLwUcpArgLW_UCP_BUFFER), int(lanewatchLwUcpArgLW_UCP_COUNT), noArg, noArg)
		a.Ptr = int(lanewatchLwUcpArgLW_UCP_EP)
		return Probe{Symbol: sym, Layer: event.LayerUCP, Op: op, Program: ProgUCP, Args: a, NArgs: n}
	}
	add(ucp("ucp_put_nbx", event.OpXferPut, 6), ucp("ucp_get_nbx", event.OpXferGet, 6))
	add(ucp("ucp_tag_send_nbx", event.OpXferSend, 5), ucp("ucp_am_send_nbx", event.OpXferSend, 7))
	// ucp_request_free(void *request), and ucp_request_release, its
	// deprecated form (its own code in 1.13, still called: ucx_perftest
	// releases its last request so).
	for _, sym := range []string{"ucp_request_free", "ucp_request_release"} {
		add(Probe{Symbol: sym, Layer: event.LayerUCP, Op: event.OpXferDone, Program: ProgEntry,
			Args: memArgs(0, noArg, noArg), NArgs: 1})
	}
	// ucp_mem_map(ucp_context_h, const ucp_mem_map_params_t *, ucp_mem_h *memh_p)
	mm := memArgs(int(lanewatchLwUcpMemMapArgLW_UMM_ADDRESS), int(lanewatchLwUcpMemMapArgLW_UMM_LENGTH), int(lanewatchLwUcpMemMapArgLW_UMM_FLAGS))
	mm.Handle = 2
	add(Probe{Symbol: "ucp_mem_map", Layer: event.LayerUCP, Op: event.OpXferMemMap, Program: ProgUCPMemMap,
		Args: mm, NArgs: 3, OutHandle: true})
	// uct_iface_open(md, worker, const uct_iface_params_t *, config, uct_iface_h *iface_p)
	iface := handleArgs(4)
	add(Probe{Symbol: "uct_iface_open", Layer: event.LayerUCT, Op: event.OpXferIface, Program: ProgUCTIface,
		Args: iface, NArgs: 5, OutHandle: true})
	// The transports' endpoint operations (uct.h: ep->iface->ops.ep_*), as
	// Debian's 1.13 exports them: libuct (tcp, the shared-memory
	// transports posix and sysv, cma's base, self) and libuct_ib (the
	// mlx5 and verbs transports). Each names its lane to the UCP call it
	// is nested in; none emits an event.
	lane := func(sym string) Probe {
		return Probe{Symbol: sym, Layer: event.LayerUCT, Op: event.OpXferLane, Program: ProgUCTLane,
			Args: memArgs(0, noArg, noArg), NArgs: 1}
	}
	for _, sym := range UCTLaneSymbols {
		add(lane(sym))
	}

	// --- libfabric (docs/design.md, "Transfer libraries"): NIXL's backend
	// on EFA. fi_fabric is the one constructor an application calls by
	// name; every other call goes through the ops of the object it is
	// given, so each row below is attached at the file offset the object
	// a previous row returned names (probes/fabric.go): fabric → domain →
	// endpoint and CQ → sends, writes, reads and CQ reads. One entry+return
	// pair each: a send that returned -FI_EAGAIN is a retry, not a
	// transfer. Their calls nest in themselves (a layered provider such as
	// rxm calls its core through the same functions): only the outermost,
	// the application's, is reported (enum lw_slot). Objects: Ptr the new
	// object (out), Handle its parent, Src the struct fi_info given. ---
	fab := func(sym string, op event.Op, a Args, n int) Probe {
		return Probe{Symbol: sym, Layer: event.LayerFabric, Op: op, Program: ProgEntryReturn, Args: a, NArgs: n}
	}
	object := func(sym string, n int) Probe { // (parent, info or attr, **out, context)
		a := memArgs(2, noArg, noArg)
		a.Handle, a.Src = 0, 1
		p := fab(sym, event.OpFabricObject, a, n)
		p.Out = true
		return p
	}
	// fi_fabric(struct fi_fabric_attr *attr, struct fid_fabric **fabric, void *context)
	fabric := memArgs(1, noArg, noArg)
	fabric.Handle = 0
	fabricRow := fab("fi_fabric", event.OpFabricObject, fabric, 3)
	fabricRow.Out = true
	add(fabricRow)
	// fabric->ops->domain(fabric, info, &domain, context), domain->ops->endpoint(domain, info, &ep, context),
	// domain->ops->cq_open(domain, attr, &cq, context)
	add(object(FabricRowDomain, 4), object(FabricRowEndpoint, 4), object(FabricRowCQOpen, 4))
	// ep->fid.ops->bind(&ep->fid, &cq->fid, flags): which CQ reports the endpoint's sends
	bind := memArgs(0, noArg, 2)
	bind.Handle = 1
	add(fab(ProviderPrefix+"fi_ep_bind", event.OpFabricObject, bind, 3))
	// Data: Ptr the endpoint, Src/Dst the local buffer and the peer (its
	// fi_addr_t for messages, the remote address for RMA), Bytes the
	// length, Handle the context the completion will carry.
	xfer := func(sym string, op event.Op, local, bytes, peer, ctx, n int) Probe {
		a := copyArgs(noArg, local, bytes, noArg, noArg)
		if op == event.OpXferGet {
			a.Dst, a.Src = local, peer
		} else {
			a.Dst = peer
		}
		a.Ptr, a.Handle = 0, ctx
		return fab(ProviderPrefix+sym, op, a, n)
	}
	// msg->send(ep, buf, len, desc, dest_addr, context), senddata(ep, buf, len, desc, data, dest_addr, context),
	// inject(ep, buf, len, dest_addr); tagged: send(ep, buf, len, desc, dest_addr, tag, context),
	// inject(ep, buf, len, dest_addr, tag)
	add(xfer("fi_send", event.OpXferSend, 1, 2, 4, 5, 6), xfer("fi_senddata", event.OpXferSend, 1, 2, 5, 6, 7),
		xfer("fi_inject", event.OpXferSend, 1, 2, 3, noArg, 4),
		xfer("fi_tsend", event.OpXferSend, 1, 2, 4, 6, 7), xfer("fi_tinject", event.OpXferSend, 1, 2, 3, noArg, 5))
	// rma->write(ep, buf, len, desc, dest_addr, addr, key, context), writedata(ep, buf, len, desc, data,
	// dest_addr, addr, key, context), inject(ep, buf, len, dest_addr, addr, key), read(ep, buf, len, desc,
	// src_addr, addr, key, context)
	add(xfer("fi_write", event.OpXferPut, 1, 2, 5, 7, 8), xfer("fi_writedata", event.OpXferPut, 1, 2, 6, 8, 9),
		xfer("fi_inject_write", event.OpXferPut, 1, 2, 4, noArg, 6), xfer("fi_read", event.OpXferGet, 1, 2, 5, 7, 8))
	// cq->ops->read(cq, buf, count): returns how many entries it wrote (or
	// -FI_EAGAIN); every CQ format starts with the op_context, and the
	// first entry's is read at return (Handle).
	cqRead := memArgs(0, 2, noArg)
	cqRead.Handle = 1
	cq := fab(ProviderPrefix+"fi_cq_read", event.OpXferDone, cqRead, 3)
	cq.OutHandle = true
	add(cq)
	// The msg forms (NIXL's backend writes and reads with them):
	// sendmsg(ep, const struct fi_msg *msg, flags), tagged sendmsg(ep,
	// const struct fi_msg_tagged *, flags), writemsg and readmsg(ep, const
	// struct fi_msg_rma *, flags). The entry reads the message (enum
	// lw_fabric_msg_arg); OutOff is where its context is (no out pointer).
	msg := func(sym string, op event.Op, prog Program, contextOff uint16) Probe {
		const local, remote = int(lanewatchLwFabricMsgArgLW_FMSG_LOCAL), int(lanewatchLwFabricMsgArgLW_FMSG_REMOTE)
		a := copyArgs(noArg, local, int(lanewatchLwFabricMsgArgLW_FMSG_BYTES), noArg, noArg)
		switch op {
		case event.OpXferGet:
			a.Dst, a.Src = local, remote
		case event.OpXferPut:
			a.Dst = remote
		}
		a.Ptr, a.Handle = 0, int(lanewatchLwFabricMsgArgLW_FMSG_CONTEXT)
		p := fab(ProviderPrefix+sym, op, a, 3)
		p.Program, p.OutOff = prog, contextOff
		return p
	}
	add(msg("fi_sendmsg", event.OpXferSend, ProgFabricMsg, 32), msg("fi_tsendmsg", event.OpXferSend, ProgFabricMsg, 48),
		msg("fi_writemsg", event.OpXferPut, ProgFabricRMAMsg, 48), msg("fi_readmsg", event.OpXferGet, ProgFabricRMAMsg, 48))
	return t
}

// UCTLaneSymbols are the UCT endpoint operations probed for the lane of a
// UCP transfer: put, get and active messages of every transport UCX 1.13
// exports them for (nm -D libuct.so.0 ucx/libuct_ib.so.0).
var UCTLaneSymbols = func() []string {
	var out []string
	for _, tl := range []string{"rc_mlx5", "dc_mlx5", "rc_verbs"} {
		for _, op := range []string{"put_short", "put_bcopy", "put_zcopy", "get_bcopy", "get_zcopy",
			"am_short", "am_short_iov", "am_bcopy", "am_zcopy"} {
			out = append(out, "uct_"+tl+"_ep_"+op)
		}
	}
	return append(out,
		"uct_tcp_ep_put_zcopy", "uct_tcp_ep_am_short", "uct_tcp_ep_am_short_iov", "uct_tcp_ep_am_bcopy", "uct_tcp_ep_am_zcopy",
		"uct_sm_ep_put_short", "uct_sm_ep_put_bcopy", "uct_sm_ep_get_bcopy",
		"uct_mm_ep_am_short", "uct_mm_ep_am_short_iov", "uct_mm_ep_am_bcopy",
		"uct_scopy_ep_put_zcopy", "uct_scopy_ep_get_zcopy",
		"uct_self_ep_am_short", "uct_self_ep_am_short_iov", "uct_self_ep_am_bcopy")
}()
