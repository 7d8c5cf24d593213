package probes

import "github.com/lanewatch/lanewatch/event"

// The probe table: every symbol lanewatch attaches to, the program that runs
// there and how the raw argument registers decode into a Call. One row per
// exported symbol; the _ptds/_ptsz rows are the per-thread-default-stream
// forms of the same call (same arguments, different default stream).

// kindFromArg marks a row whose direction is its cudaMemcpyKind argument.
const kindFromArg event.CopyKind = 255

// Program selects the BPF program attached at a row's symbol.
type Program uint8

const (
	ProgEntry       Program = iota + 1 // arguments at entry only: the cheap, common case
	ProgEntryReturn                    // arguments saved at entry, emitted at return with the result
	ProgBatch                          // entry; walks the dst/src/size arrays
	ProgPostSend                       // entry; walks the ibv_send_wr chain
	ProgPostRecv                       // entry; walks the ibv_recv_wr chain
	ProgPollCQ                         // entry saved, one event per completion at return
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
}

// ProviderPrefix names rows attached by file offset: the provider functions
// a stripped RDMA provider only exposes through struct ibv_context_ops.
const ProviderPrefix = "provider:"

func copyArgs(dst, src, bytes, kind, stream int) Args {
	return Args{Dst: dst, Src: src, Bytes: bytes, Height: noArg, Kind: kind, Stream: stream,
		Event: noArg, Ptr: noArg, Size: noArg, Flags: noArg, Count: noArg}
}

func memArgs(ptr, size, flags int) Args {
	return Args{Dst: noArg, Src: noArg, Bytes: noArg, Height: noArg, Kind: noArg, Stream: noArg,
		Event: noArg, Ptr: ptr, Size: size, Flags: flags, Count: noArg}
}

func syncArgs(stream, event, flags int) Args {
	return Args{Dst: noArg, Src: noArg, Bytes: noArg, Height: noArg, Kind: noArg, Stream: stream,
		Event: event, Ptr: noArg, Size: noArg, Flags: flags, Count: noArg}
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
	rt := func(sym string, op event.Op, prog Program, kind event.CopyKind, a Args, n int) Probe {
		return Probe{Symbol: sym, Layer: event.LayerRuntime, Op: op, Program: prog, Kind: kind, Args: a, NArgs: n}
	}
	drv := func(sym string, op event.Op, prog Program, kind event.CopyKind, a Args, n int) Probe {
		return Probe{Symbol: sym, Layer: event.LayerDriver, Op: op, Program: prog, Kind: kind, Args: a, NArgs: n}
	}
	out := func(p Probe) Probe { p.Out = true; return p }

	// --- CUDA runtime: copies ---
	// cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
	add(withForms(rt("cudaMemcpy", event.OpCopy, ProgEntry, kindFromArg, copyArgs(0, 1, 2, 3, noArg), 4), "_ptds")...)
	// cudaMemcpyAsync(dst, src, count, kind, cudaStream_t stream)
	add(withForms(rt("cudaMemcpyAsync", event.OpCopy, ProgEntry, kindFromArg, copyArgs(0, 1, 2, 3, 4), 5), "_ptsz")...)
	// cudaMemcpy2D(dst, dpitch, src, spitch, width, height, kind): kind is the 7th, on the stack
	c2d := copyArgs(0, 2, 4, 6, noArg)
	c2d.Height = 5
	add(withForms(rt("cudaMemcpy2D", event.OpCopy2D, ProgEntry, kindFromArg, c2d, 7), "_ptds")...)
	// cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, kind, stream): 7th and 8th on the stack
	c2da := copyArgs(0, 2, 4, 6, 7)
	c2da.Height = 5
	add(withForms(rt("cudaMemcpy2DAsync", event.OpCopy2D, ProgEntry, kindFromArg, c2da, 8), "_ptsz")...)
	// cudaMemcpyPeer(dst, int dstDevice, src, int srcDevice, count): no per-thread form exists
	add(rt("cudaMemcpyPeer", event.OpCopyPeer, ProgEntry, event.CopyDeviceToDevice, copyArgs(0, 2, 4, noArg, noArg), 5))
	// cudaMemcpyPeerAsync(dst, dstDevice, src, srcDevice, count, stream)
	add(rt("cudaMemcpyPeerAsync", event.OpCopyPeer, ProgEntry, event.CopyDeviceToDevice, copyArgs(0, 2, 4, noArg, 5), 6))
	// cudaMemcpyBatchAsync(void **dsts, void **srcs, size_t *sizes, size_t count,
	//   cudaMemcpyAttributes *attrs, size_t *attrsIdxs, size_t numAttrs, size_t *failIdx, cudaStream_t stream)
	// (CUDA 12.8 layout: the stream is the 9th argument, on the stack.)
	batch := copyArgs(0, 1, 2, noArg, 8)
	batch.Count = 3
	add(withForms(rt("cudaMemcpyBatchAsync", event.OpCopyBatch, ProgBatch, event.CopyDefault, batch, 9), "_ptsz")...)

	// --- CUDA runtime: memory ---
	add(out(rt("cudaHostAlloc", event.OpHostAlloc, ProgEntryReturn, 0, memArgs(0, 1, 2), 3)))      // (void **pHost, size_t size, unsigned flags)
	add(out(rt("cudaMallocHost", event.OpHostAlloc, ProgEntryReturn, 0, memArgs(0, 1, noArg), 2))) // (void **ptr, size_t size)
	add(rt("cudaHostRegister", event.OpHostRegister, ProgEntryReturn, 0, memArgs(0, 1, 2), 3))     // (void *ptr, size_t size, unsigned flags)
	add(rt("cudaHostUnregister", event.OpHostUnregister, ProgEntry, 0, memArgs(0, noArg, noArg), 1))
	add(rt("cudaFreeHost", event.OpHostFree, ProgEntry, 0, memArgs(0, noArg, noArg), 1))
	add(out(rt("cudaMalloc", event.OpDeviceAlloc, ProgEntryReturn, 0, memArgs(0, 1, noArg), 2))) // (void **devPtr, size_t size)
	add(rt("cudaFree", event.OpDeviceFree, ProgEntry, 0, memArgs(0, noArg, noArg), 1))

	// --- CUDA runtime: ordering ---
	add(withForms(rt("cudaStreamSynchronize", event.OpStreamSync, ProgEntryReturn, 0, syncArgs(0, noArg, noArg), 1), "_ptsz")...)
	add(withForms(rt("cudaEventRecord", event.OpEventRecord, ProgEntry, 0, syncArgs(1, 0, noArg), 2), "_ptsz")...) // (event, stream)
	add(rt("cudaEventSynchronize", event.OpEventSync, ProgEntryReturn, 0, syncArgs(noArg, 0, noArg), 1))
	add(withForms(rt("cudaStreamWaitEvent", event.OpStreamWaitEvent, ProgEntry, 0, syncArgs(0, 1, 2), 3), "_ptsz")...) // (stream, event, flags)

	// --- CUDA driver: copies (CUdeviceptr is an unsigned 64-bit address) ---
	add(withForms(drv("cuMemcpyHtoD_v2", event.OpCopy, ProgEntry, event.CopyHostToDevice, copyArgs(0, 1, 2, noArg, noArg), 3), "_ptds")...)
	add(withForms(drv("cuMemcpyHtoDAsync_v2", event.OpCopy, ProgEntry, event.CopyHostToDevice, copyArgs(0, 1, 2, noArg, 3), 4), "_ptsz")...)
	add(withForms(drv("cuMemcpyDtoH_v2", event.OpCopy, ProgEntry, event.CopyDeviceToHost, copyArgs(0, 1, 2, noArg, noArg), 3), "_ptds")...)
	add(withForms(drv("cuMemcpyDtoHAsync_v2", event.OpCopy, ProgEntry, event.CopyDeviceToHost, copyArgs(0, 1, 2, noArg, 3), 4), "_ptsz")...)
	add(withForms(drv("cuMemcpyDtoD_v2", event.OpCopy, ProgEntry, event.CopyDeviceToDevice, copyArgs(0, 1, 2, noArg, noArg), 3), "_ptds")...)
	add(withForms(drv("cuMemcpyDtoDAsync_v2", event.OpCopy, ProgEntry, event.CopyDeviceToDevice, copyArgs(0, 1, 2, noArg, 3), 4), "_ptsz")...)
	add(withForms(drv("cuMemcpy", event.OpCopy, ProgEntry, event.CopyDefault, copyArgs(0, 1, 2, noArg, noArg), 3), "_ptds")...)
	add(withForms(drv("cuMemcpyAsync", event.OpCopy, ProgEntry, event.CopyDefault, copyArgs(0, 1, 2, noArg, 3), 4), "_ptsz")...)

	// --- CUDA driver: memory ---
	add(drv("cuMemHostRegister_v2", event.OpHostRegister, ProgEntryReturn, 0, memArgs(0, 1, 2), 3))
	add(out(drv("cuMemHostAlloc", event.OpHostAlloc, ProgEntryReturn, 0, memArgs(0, 1, 2), 3)))
	add(out(drv("cuMemAllocHost_v2", event.OpHostAlloc, ProgEntryReturn, 0, memArgs(0, 1, noArg), 2)))
	add(drv("cuMemHostUnregister", event.OpHostUnregister, ProgEntry, 0, memArgs(0, noArg, noArg), 1))
	add(drv("cuMemFreeHost", event.OpHostFree, ProgEntry, 0, memArgs(0, noArg, noArg), 1))
	add(out(drv("cuMemAlloc_v2", event.OpDeviceAlloc, ProgEntryReturn, 0, memArgs(0, 1, noArg), 2)))
	add(drv("cuMemFree_v2", event.OpDeviceFree, ProgEntry, 0, memArgs(0, noArg, noArg), 1))

	// --- CUDA driver: ordering (applications that skip the runtime) ---
	add(withForms(drv("cuStreamSynchronize", event.OpStreamSync, ProgEntryReturn, 0, syncArgs(0, noArg, noArg), 1), "_ptsz")...)
	add(withForms(drv("cuEventRecord", event.OpEventRecord, ProgEntry, 0, syncArgs(1, 0, noArg), 2), "_ptsz")...)
	add(drv("cuEventSynchronize", event.OpEventSync, ProgEntryReturn, 0, syncArgs(noArg, 0, noArg), 1))
	add(withForms(drv("cuStreamWaitEvent", event.OpStreamWaitEvent, ProgEntry, 0, syncArgs(0, 1, 2), 3), "_ptsz")...)

	// --- dynamic linker: fires after every dlopen/dlclose, so new libraries get probed ---
	add(Probe{Symbol: "_dl_debug_state", Layer: event.LayerLinker, Op: event.OpLinkerUpdate, Program: ProgEntry,
		Args: syncArgs(noArg, noArg, noArg), NArgs: 0})

	// --- RDMA verbs (libibverbs exports) ---
	verbs := func(sym string, op event.Op, prog Program, a Args, n int) Probe {
		return Probe{Symbol: sym, Layer: event.LayerVerbs, Op: op, Program: prog, Args: a, NArgs: n}
	}
	keys := func(p Probe) Probe { p.OutRet, p.OutOff = true, 36; return p } // struct ibv_mr: lkey at 36, rkey at 40
	ctxOf := func(p Probe) Probe { p.OutRet, p.OutOff = true, 0; return p } // ibv_cq/ibv_qp: context first
	// ibv_reg_mr_iova2(pd, addr, length, iova, access): the funnel ibv_reg_mr and its variants call
	add(keys(verbs("ibv_reg_mr_iova2", event.OpMRRegister, ProgEntryReturn, memArgs(1, 2, 4), 5)))
	// ibv_reg_dmabuf_mr(pd, offset, length, iova, fd, access): device memory exported as a dma-buf
	add(keys(verbs("ibv_reg_dmabuf_mr", event.OpMRRegister, ProgEntryReturn, memArgs(3, 2, 5), 6)))
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
	return t
}
