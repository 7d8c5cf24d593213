package probes

// The probe table: every symbol lanewatch attaches to, the program that runs
// there and how the raw argument registers decode into a Call. One row per
// exported symbol; the _ptds/_ptsz rows are the per-thread-default-stream
// forms of the same call (same arguments, different default stream).

// Op is what a probed call does, independent of which API spelled it.
type Op uint8

const (
	OpCopy            Op = iota + 1 // one linear copy: dst, src, bytes (+kind, +stream)
	OpCopy2D                        // width*height bytes between pitched buffers
	OpCopyPeer                      // device-to-device across GPUs
	OpCopyBatch                     // cudaMemcpyBatchAsync: arrays of dst/src/size
	OpHostAlloc                     // pinned host allocation (out pointer)
	OpHostRegister                  // pin an existing host range
	OpHostUnregister                // unpin a registered range
	OpHostFree                      // free a pinned allocation
	OpDeviceAlloc                   // device allocation (out pointer)
	OpDeviceFree                    // free a device allocation
	OpStreamSync                    // host waits for a stream
	OpEventRecord                   // marks a stream position
	OpEventSync                     // host waits for an event
	OpStreamWaitEvent               // a stream waits for an event (GPU side)
	OpLinkerUpdate                  // ld.so finished a dlopen/dlclose: rescan the process
	OpMRRegister                    // an RDMA memory region: addr, length, access → lkey, rkey
	OpMRDeregister                  // an RDMA memory region goes away (Ptr: the struct ibv_mr *)
	OpVerbsContext                  // a verbs object whose context holds the provider's ops table
	OpPostSend                      // one work request posted to a send queue
	OpPostRecv                      // one work request posted to a receive queue
	OpPollCQ                        // one completion polled from a completion queue
)

func (o Op) String() string {
	switch o {
	case OpCopy:
		return "copy"
	case OpCopy2D:
		return "copy2d"
	case OpCopyPeer:
		return "copy_peer"
	case OpCopyBatch:
		return "copy_batch"
	case OpHostAlloc:
		return "host_alloc"
	case OpHostRegister:
		return "host_register"
	case OpHostUnregister:
		return "host_unregister"
	case OpHostFree:
		return "host_free"
	case OpDeviceAlloc:
		return "device_alloc"
	case OpDeviceFree:
		return "device_free"
	case OpStreamSync:
		return "stream_sync"
	case OpEventRecord:
		return "event_record"
	case OpEventSync:
		return "event_sync"
	case OpStreamWaitEvent:
		return "stream_wait_event"
	case OpLinkerUpdate:
		return "linker_update"
	case OpMRRegister:
		return "mr_register"
	case OpMRDeregister:
		return "mr_deregister"
	case OpVerbsContext:
		return "verbs_context"
	case OpPostSend:
		return "post_send"
	case OpPostRecv:
		return "post_recv"
	case OpPollCQ:
		return "poll_cq"
	}
	return "unknown"
}

// IsCopy reports whether the op moves bytes.
func (o Op) IsCopy() bool { return o >= OpCopy && o <= OpCopyBatch }

// Layer says which API layer a symbol belongs to.
type Layer uint8

const (
	LayerRuntime  Layer = iota + 1 // libcudart: may call into the driver on the same thread
	LayerDriver                    // libcuda
	LayerLinker                    // ld.so
	LayerVerbs                     // libibverbs' exported entry points
	LayerProvider                  // an RDMA provider's data path, reached through the ops table
)

// CopyKind is the direction a call states (cudaMemcpyKind values).
type CopyKind uint8

const (
	KindHostToHost     CopyKind = 0
	KindHostToDevice   CopyKind = 1
	KindDeviceToHost   CopyKind = 2
	KindDeviceToDevice CopyKind = 3
	KindDefault        CopyKind = 4 // resolved from the pointers (unified addressing)
	kindFromArg        CopyKind = 255
)

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
	Layer   Layer
	Op      Op
	Program Program
	Kind    CopyKind // fixed direction, or kindFromArg
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
	rt := func(sym string, op Op, prog Program, kind CopyKind, a Args, n int) Probe {
		return Probe{Symbol: sym, Layer: LayerRuntime, Op: op, Program: prog, Kind: kind, Args: a, NArgs: n}
	}
	drv := func(sym string, op Op, prog Program, kind CopyKind, a Args, n int) Probe {
		return Probe{Symbol: sym, Layer: LayerDriver, Op: op, Program: prog, Kind: kind, Args: a, NArgs: n}
	}
	out := func(p Probe) Probe { p.Out = true; return p }

	// --- CUDA runtime: copies ---
	// cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
	add(withForms(rt("cudaMemcpy", OpCopy, ProgEntry, kindFromArg, copyArgs(0, 1, 2, 3, noArg), 4), "_ptds")...)
	// cudaMemcpyAsync(dst, src, count, kind, cudaStream_t stream)
	add(withForms(rt("cudaMemcpyAsync", OpCopy, ProgEntry, kindFromArg, copyArgs(0, 1, 2, 3, 4), 5), "_ptsz")...)
	// cudaMemcpy2D(dst, dpitch, src, spitch, width, height, kind): kind is the 7th, on the stack
	c2d := copyArgs(0, 2, 4, 6, noArg)
	c2d.Height = 5
	add(withForms(rt("cudaMemcpy2D", OpCopy2D, ProgEntry, kindFromArg, c2d, 7), "_ptds")...)
	// cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, kind, stream): 7th and 8th on the stack
	c2da := copyArgs(0, 2, 4, 6, 7)
	c2da.Height = 5
	add(withForms(rt("cudaMemcpy2DAsync", OpCopy2D, ProgEntry, kindFromArg, c2da, 8), "_ptsz")...)
	// cudaMemcpyPeer(dst, int dstDevice, src, int srcDevice, count): no per-thread form exists
	add(rt("cudaMemcpyPeer", OpCopyPeer, ProgEntry, KindDeviceToDevice, copyArgs(0, 2, 4, noArg, noArg), 5))
	// cudaMemcpyPeerAsync(dst, dstDevice, src, srcDevice, count, stream)
	add(rt("cudaMemcpyPeerAsync", OpCopyPeer, ProgEntry, KindDeviceToDevice, copyArgs(0, 2, 4, noArg, 5), 6))
	// cudaMemcpyBatchAsync(void **dsts, void **srcs, size_t *sizes, size_t count,
	//   cudaMemcpyAttributes *attrs, size_t *attrsIdxs, size_t numAttrs, size_t *failIdx, cudaStream_t stream)
	// (CUDA 12.8 layout: the stream is the 9th argument, on the stack.)
	batch := copyArgs(0, 1, 2, noArg, 8)
	batch.Count = 3
	add(withForms(rt("cudaMemcpyBatchAsync", OpCopyBatch, ProgBatch, KindDefault, batch, 9), "_ptsz")...)

	// --- CUDA runtime: memory ---
	add(out(rt("cudaHostAlloc", OpHostAlloc, ProgEntryReturn, 0, memArgs(0, 1, 2), 3)))      // (void **pHost, size_t size, unsigned flags)
	add(out(rt("cudaMallocHost", OpHostAlloc, ProgEntryReturn, 0, memArgs(0, 1, noArg), 2))) // (void **ptr, size_t size)
	add(rt("cudaHostRegister", OpHostRegister, ProgEntryReturn, 0, memArgs(0, 1, 2), 3))     // (void *ptr, size_t size, unsigned flags)
	add(rt("cudaHostUnregister", OpHostUnregister, ProgEntry, 0, memArgs(0, noArg, noArg), 1))
	add(rt("cudaFreeHost", OpHostFree, ProgEntry, 0, memArgs(0, noArg, noArg), 1))
	add(out(rt("cudaMalloc", OpDeviceAlloc, ProgEntryReturn, 0, memArgs(0, 1, noArg), 2))) // (void **devPtr, size_t size)
	add(rt("cudaFree", OpDeviceFree, ProgEntry, 0, memArgs(0, noArg, noArg), 1))

	// --- CUDA runtime: ordering ---
	add(withForms(rt("cudaStreamSynchronize", OpStreamSync, ProgEntryReturn, 0, syncArgs(0, noArg, noArg), 1), "_ptsz")...)
	add(withForms(rt("cudaEventRecord", OpEventRecord, ProgEntry, 0, syncArgs(1, 0, noArg), 2), "_ptsz")...) // (event, stream)
	add(rt("cudaEventSynchronize", OpEventSync, ProgEntryReturn, 0, syncArgs(noArg, 0, noArg), 1))
	add(withForms(rt("cudaStreamWaitEvent", OpStreamWaitEvent, ProgEntry, 0, syncArgs(0, 1, 2), 3), "_ptsz")...) // (stream, event, flags)

	// --- CUDA driver: copies (CUdeviceptr is an unsigned 64-bit address) ---
	add(withForms(drv("cuMemcpyHtoD_v2", OpCopy, ProgEntry, KindHostToDevice, copyArgs(0, 1, 2, noArg, noArg), 3), "_ptds")...)
	add(withForms(drv("cuMemcpyHtoDAsync_v2", OpCopy, ProgEntry, KindHostToDevice, copyArgs(0, 1, 2, noArg, 3), 4), "_ptsz")...)
	add(withForms(drv("cuMemcpyDtoH_v2", OpCopy, ProgEntry, KindDeviceToHost, copyArgs(0, 1, 2, noArg, noArg), 3), "_ptds")...)
	add(withForms(drv("cuMemcpyDtoHAsync_v2", OpCopy, ProgEntry, KindDeviceToHost, copyArgs(0, 1, 2, noArg, 3), 4), "_ptsz")...)
	add(withForms(drv("cuMemcpyDtoD_v2", OpCopy, ProgEntry, KindDeviceToDevice, copyArgs(0, 1, 2, noArg, noArg), 3), "_ptds")...)
	add(withForms(drv("cuMemcpyDtoDAsync_v2", OpCopy, ProgEntry, KindDeviceToDevice, copyArgs(0, 1, 2, noArg, 3), 4), "_ptsz")...)
	add(withForms(drv("cuMemcpy", OpCopy, ProgEntry, KindDefault, copyArgs(0, 1, 2, noArg, noArg), 3), "_ptds")...)
	add(withForms(drv("cuMemcpyAsync", OpCopy, ProgEntry, KindDefault, copyArgs(0, 1, 2, noArg, 3), 4), "_ptsz")...)

	// --- CUDA driver: memory ---
	add(drv("cuMemHostRegister_v2", OpHostRegister, ProgEntryReturn, 0, memArgs(0, 1, 2), 3))
	add(out(drv("cuMemHostAlloc", OpHostAlloc, ProgEntryReturn, 0, memArgs(0, 1, 2), 3)))
	add(out(drv("cuMemAllocHost_v2", OpHostAlloc, ProgEntryReturn, 0, memArgs(0, 1, noArg), 2)))
	add(drv("cuMemHostUnregister", OpHostUnregister, ProgEntry, 0, memArgs(0, noArg, noArg), 1))
	add(drv("cuMemFreeHost", OpHostFree, ProgEntry, 0, memArgs(0, noArg, noArg), 1))
	add(out(drv("cuMemAlloc_v2", OpDeviceAlloc, ProgEntryReturn, 0, memArgs(0, 1, noArg), 2)))
	add(drv("cuMemFree_v2", OpDeviceFree, ProgEntry, 0, memArgs(0, noArg, noArg), 1))

	// --- CUDA driver: ordering (applications that skip the runtime) ---
	add(withForms(drv("cuStreamSynchronize", OpStreamSync, ProgEntryReturn, 0, syncArgs(0, noArg, noArg), 1), "_ptsz")...)
	add(withForms(drv("cuEventRecord", OpEventRecord, ProgEntry, 0, syncArgs(1, 0, noArg), 2), "_ptsz")...)
	add(drv("cuEventSynchronize", OpEventSync, ProgEntryReturn, 0, syncArgs(noArg, 0, noArg), 1))
	add(withForms(drv("cuStreamWaitEvent", OpStreamWaitEvent, ProgEntry, 0, syncArgs(0, 1, 2), 3), "_ptsz")...)

	// --- dynamic linker: fires after every dlopen/dlclose, so new libraries get probed ---
	add(Probe{Symbol: "_dl_debug_state", Layer: LayerLinker, Op: OpLinkerUpdate, Program: ProgEntry,
		Args: syncArgs(noArg, noArg, noArg), NArgs: 0})

	// --- RDMA verbs (libibverbs exports) ---
	verbs := func(sym string, op Op, prog Program, a Args, n int) Probe {
		return Probe{Symbol: sym, Layer: LayerVerbs, Op: op, Program: prog, Args: a, NArgs: n}
	}
	keys := func(p Probe) Probe { p.OutRet, p.OutOff = true, 36; return p } // struct ibv_mr: lkey at 36, rkey at 40
	ctxOf := func(p Probe) Probe { p.OutRet, p.OutOff = true, 0; return p } // ibv_cq/ibv_qp: context first
	// ibv_reg_mr_iova2(pd, addr, length, iova, access): the funnel ibv_reg_mr and its variants call
	add(keys(verbs("ibv_reg_mr_iova2", OpMRRegister, ProgEntryReturn, memArgs(1, 2, 4), 5)))
	// ibv_reg_dmabuf_mr(pd, offset, length, iova, fd, access): device memory exported as a dma-buf
	add(keys(verbs("ibv_reg_dmabuf_mr", OpMRRegister, ProgEntryReturn, memArgs(3, 2, 5), 6)))
	add(verbs("ibv_dereg_mr", OpMRDeregister, ProgEntry, memArgs(0, noArg, noArg), 1))
	// ibv_open_device(device) returns the context itself; create_cq/create_qp return objects whose first field is it
	open := verbs("ibv_open_device", OpVerbsContext, ProgEntryReturn, memArgs(noArg, noArg, noArg), 1)
	open.OutRet = false
	add(open)
	add(ctxOf(verbs("ibv_create_cq", OpVerbsContext, ProgEntryReturn, memArgs(noArg, noArg, noArg), 5)))
	add(ctxOf(verbs("ibv_create_qp", OpVerbsContext, ProgEntryReturn, memArgs(noArg, noArg, noArg), 2)))

	// --- RDMA provider data path (attached at offsets read from the ops table) ---
	prov := func(name string, op Op, prog Program, n int) Probe {
		return Probe{Symbol: ProviderPrefix + name, Layer: LayerProvider, Op: op, Program: prog,
			Args: memArgs(noArg, noArg, noArg), NArgs: n}
	}
	add(prov("post_send", OpPostSend, ProgPostSend, 3))
	add(prov("post_recv", OpPostRecv, ProgPostRecv, 3))
	add(prov("poll_cq", OpPollCQ, ProgPollCQ, 3))
	return t
}
