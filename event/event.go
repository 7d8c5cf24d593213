// Package event is the vocabulary shared by the probes, the correlation
// engine and the exporters: the decoded probe call, what it does (Op), which
// API layer made it, the direction it states, the memory kinds a transfer's
// sides can have, and the reasons events are lost.
//
// probes fills these values from the ring buffer (decoding the C structs of
// bpf/lanewatch.h through their generated mirrors); correlate and the
// exporters read them and never see a probe table or a BPF constant.
package event

import "fmt"

// Kind says what produced a Call.
type Kind uint8

const (
	KindCall       Kind = iota + 1 // a probed call (see Call.Op)
	KindBatchEntry                 // one entry of a batch copy
	KindExec                       // a process replaced its image
	KindExit                       // a process exited
	KindWR                         // one work request of a post_send/post_recv chain
	KindWC                         // one completion returned by poll_cq
	// KindName is a piece of the name a call was given (a kernel's name
	// at cuModuleGetFunction, cuLibraryGetKernel): NamePiece holds it, Ret
	// how many bytes were read (NUL included), BatchIndex which piece.
	// The pieces of a name come before the call's own event, on its thread.
	KindName
)

// NamePieceBytes is the size of one piece of a name (KindName).
const NamePieceBytes = 72

// Call is one decoded probe hit: the raw arguments already mapped to what
// the call means. Fields a call does not have are zero.
type Call struct {
	Kind       Kind
	PID, TID   uint32
	Time       uint64 // CLOCK_MONOTONIC ns at entry
	ReturnTime uint64 // at return, 0 for entry-only probes
	Ret        uint64 // return code (cudaError_t / CUresult), valid when ReturnTime != 0

	// What the probed symbol is (from the probe table, filled by the decoder).
	Probe     uint16 // the table row, for recordings and diagnostics
	Symbol    string // the probed symbol, "cuMemcpyHtoDAsync_v2_ptsz"
	Op        Op
	Layer     Layer
	PerThread bool // a _ptsz/_ptds form: stream 0 is the calling thread's own
	Returns   bool // reported at return, with the result (Ret, ReturnTime)
	// RuntimeAPI is the runtime call that reaches a driver symbol
	// ("cudaMemcpyAsync_ptsz"); a copy is reported under it when the
	// caller is a CUDA runtime (ViaRuntime).
	RuntimeAPI string

	// Caller is the return address at entry (driver rows): who called.
	// ViaRuntime says it lies in a CUDA runtime library; the agent decides
	// it from the process's mappings before the engine sees the call.
	Caller     uint64
	ViaRuntime bool
	// CallerUnresolved: the probe could not look Caller up (the process's
	// mmap lock was busy); the agent decides ViaRuntime from its maps.
	CallerUnresolved bool

	// LostBefore: events of this process were lost in BPF since its
	// previous event (ring full, a call overwritten in its slot or without
	// slot memory, a read fault): a registration may be among them.
	// LostAny: any process may have lost events (the BPF table of
	// processes with losses was full). Said in ring order, so the engine
	// stops trusting what it knew from this event on (docs/design.md,
	// "Ring buffer, wakeups, drops").
	LostBefore, LostAny bool
	// Held: a linker notification whose thread waits until the CUDA files
	// its process newly maps are probed (docs/design.md, "Attach and
	// discovery"): its rescan comes first. HeldFile is the file it waits
	// for (device and inode as probes.FileID has them; zero when its
	// mappings could not be walked).
	Held     bool
	HeldFile [2]uint64

	Dst, Src uint64
	Bytes    uint64
	CopyKind CopyKind // direction stated by the call, or its fixed direction
	Stream   uint64
	Event    uint64
	Ptr      uint64 // range start (register, free) or the allocated pointer (allocs)
	Size     uint64
	Flags    uint64
	// Handle is a VMM allocation handle, a memory pool or a dma-buf fd
	// (cuMemGetHandleForAddressRange, ibv_reg_dmabuf_mr); Offset is where
	// in it a mapping or a memory region starts; Location is where new
	// memory lives (cuMemCreate, cuMemPoolCreate).
	Handle   uint64
	Offset   uint64
	Location Location

	// Device is the CUdevice argument of a context or bus-id call: NVIDIA's
	// driver uses the device ordinal as the handle (cuda.h: a CUmemLocation's
	// id is "a device ordinal" where cuMemAdvise takes a CUdevice; CPU is -1).
	Device int32
	// BusID is what cuDeviceGetPCIBusId wrote, NUL-padded ("0000:3B:00.0").
	BusID [16]byte

	BatchIndex uint32 // position in a batch copy, a WR chain or a poll's completions
	BatchCount uint64

	// Kernel launches (OpLaunch): the grid and block dimensions as the
	// call states them. Handle is the launched function (a CUfunction or
	// CUkernel at the driver, the host stub's address at the runtime).
	Grid, Block [3]uint32
	// NamePiece is one piece of a name (KindName): NUL-terminated within
	// Ret bytes.
	NamePiece [NamePieceBytes]byte

	RDMA RDMA // verbs and provider events
	Xfer Xfer // transfer library events (UCX)
}

// Xfer is what a transfer library's call says besides its buffer (Src)
// and count (Bytes): a UCP transfer as posted, the lane it went on, or a
// transport interface opened.
type Xfer struct {
	Endpoint uint64 // ucp_ep_h
	Remote   uint64 // the remote address (put, get), the tag (tag send), the AM id (am send)
	// The request parameters (ucp_request_param_t): which fields are set
	// (ParamMask, UCP_OP_ATTR_FIELD_*), the datatype (contiguous 1-byte
	// elements when not set), the memory type and handle.
	ParamMask uint32
	MemType   uint32 // ucs_memory_type_t
	Datatype  uint64
	Memh      uint64
	// Iface is the interface of the first UCT call nested in the UCP call
	// (0: none was), LaneSymbol that call's function, LaneCalls how many
	// UCT calls were nested.
	Iface      uint64
	LaneSymbol string
	LaneCalls  uint32
	// An interface's transport and device names (uct_iface_open),
	// NUL-padded; Iface is the new interface.
	Transport, Device [16]byte
}

// Location is where an allocation's memory lives (CUmemLocation, cuda.h),
// read from the properties cuMemCreate and cuMemPoolCreate are given.
type Location struct {
	Type uint32 // CUmemLocationType (LocDevice...); 0 invalid or not read
	ID   int32  // a device ordinal or a host NUMA node, by Type
}

// CUmemLocationType values (cuda.h 12.4).
const (
	LocDevice          = 1
	LocHost            = 2
	LocHostNUMA        = 3
	LocHostNUMACurrent = 4
)

// Kind is the memory kind at the location: device memory, or page-locked
// host memory (the driver pins what it allocates on a host location);
// unknown for a location not read or not known.
func (l Location) Kind() MemKind {
	switch l.Type {
	case LocDevice:
		return MemDevice
	case LocHost, LocHostNUMA, LocHostNUMACurrent:
		return MemPinned
	}
	return MemUnknown
}

// RDMA is what a verbs or provider event carries.
type RDMA struct {
	Context    uint64 // struct ibv_context * (OpVerbsContext)
	MR         uint64 // struct ibv_mr * (register: the result; deregister: the argument)
	QP, CQ     uint64 // object pointers
	QPNum      uint32
	WRID       uint64
	Opcode     uint32 // enum ibv_wr_opcode for WRs, enum ibv_wc_opcode for completions
	SendFlags  uint32
	Status     uint32 // enum ibv_wc_status
	RemoteAddr uint64
	RKey, LKey uint32
	Imm        uint32
	NumSGE     uint32
	WCFlags    uint32
	Local      uint64 // first SGE's address
	// Dmabuf: the region registered is a dma-buf fd's memory
	// (ibv_reg_dmabuf_mr: Call.Handle the fd, Call.Offset where in it).
	Dmabuf bool
	// Where a QP connects (OpQPModify, struct ibv_qp_attr): AttrMask says
	// which of DestQPNum and the address vector (DGID when IsGlobal, DLID)
	// the call set.
	AttrMask  uint32
	DestQPNum uint32
	DGID      [16]byte
	DLID      uint16
	IsGlobal  bool
}

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
	OpInit                          // the driver initialises (cuInit), or the runtime reports it (cudaGetDeviceCount)
	OpLinkerUpdate                  // ld.so finished a dlopen/dlclose: rescan the process
	OpMRRegister                    // an RDMA memory region: addr, length, access → lkey, rkey
	OpMRDeregister                  // an RDMA memory region goes away (Ptr: the struct ibv_mr *)
	OpVerbsContext                  // a verbs object whose context holds the provider's ops table
	OpPostSend                      // one work request posted to a send queue
	OpPostRecv                      // one work request posted to a receive queue
	OpPollCQ                        // one completion polled from a completion queue

	// Device and context selection: which GPU a thread's calls use
	// (docs/design.md, "Placement").
	OpCtxRetain     // a device's primary context retained: Ptr the context (out), Device the device
	OpCtxCreate     // a context created and pushed on the thread: Ptr the context (out), Device
	OpCtxSetCurrent // the top of the thread's context stack replaced by Ptr (0: popped)
	OpCtxPush       // Ptr pushed on the thread's context stack
	OpCtxPop        // the top of the thread's context stack popped: Ptr what was popped (out)
	OpCtxDestroy    // the context Ptr destroyed (popped if it was current on the thread)
	OpDeviceBusID   // cuDeviceGetPCIBusId: the PCI address (BusID) of Device

	// Allocators beyond cuMemAlloc and cuMemHostAlloc (docs/design.md, "Late
	// attach"): memory the registry must place, or a copy from it would be
	// taken for pageable.
	OpManagedAlloc   // managed (unified) memory: Ptr (out), Size
	OpPoolAlloc      // stream-ordered allocation from the memory pool Handle: Ptr (out), Size
	OpPoolCreate     // a memory pool: Handle (out), Location
	OpPoolDestroy    // a memory pool goes away: Handle
	OpMemCreate      // a VMM physical allocation: Handle (out), Size, Location
	OpMemRelease     // a VMM allocation handle released (its mappings keep the memory): Handle
	OpAddressReserve // a VMM virtual address range: Ptr (out), Size
	OpAddressFree    // a VMM virtual address range goes away: Ptr, Size
	OpMemMap         // the VMM allocation Handle mapped at [Ptr, Ptr+Size) from Offset
	OpMemUnmap       // the mappings in [Ptr, Ptr+Size) go away
	OpDmabufExport   // device memory [Ptr, Ptr+Size) exported as a dma-buf fd: Handle (out); Flags the handle type

	// Kernels (docs/design.md, "Kernel movers"): launches and the calls
	// that give a kernel handle its name.
	OpLaunch         // a kernel launched on Stream: Handle the function (driver) or host stub (runtime), Grid, Block
	OpKernelName     // a handle named: Handle (out) the new CUfunction or CUkernel, Ptr its module or library; the name came in KindName pieces
	OpKernelFunction // a CUkernel's CUfunction in the current context: Handle (out) the function, Ptr the kernel

	// OpCtxSync: the host waits for every stream of the thread's current
	// context (cuCtxSynchronize, cudaDeviceSynchronize).
	OpCtxSync
	// OpQPModify: ibv_modify_qp, where a QP learns its peer (RDMA.AttrMask,
	// DestQPNum, DGID, DLID, IsGlobal); Ret its result.
	OpQPModify

	// CUDA graphs (docs/design.md, "CUDA graphs"): work issued on a
	// capturing stream is recorded into a graph, not run; a graph launch
	// runs it on Stream.
	OpGraphLaunch  // an executable graph (Handle) launched on Stream
	OpCaptureBegin // Stream starts capturing: its copies, launches and records go into a graph
	OpCaptureEnd   // Stream's capture ends (also when the call fails: the capture is over)

	// OpKernelCopy is no probed call's op: it is the op of a transfer the
	// engine made from the launch of a KV-transfer kernel, whose bytes the
	// GPU's SMs move (docs/design.md, "Kernel movers").
	OpKernelCopy

	// Transfer libraries (docs/design.md, "Transfer libraries"): UCX and
	// libfabric post a transfer, a transport carries it, a request or a
	// completion queue says when it finished.
	OpXferPut      // a one-sided write as posted (ucp_put_nbx, fi_write): Src the local buffer, Dst the remote address
	OpXferGet      // a one-sided read as posted (ucp_get_nbx, fi_read): Dst the local buffer, Src the remote address
	OpXferSend     // a message as posted (ucp_tag_send_nbx, ucp_am_send_nbx, fi_send): Src the local buffer
	OpXferDone     // a posted transfer's request completed or released (ucp_request_free; a CQ entry)
	OpXferLane     // a transport's endpoint operation (UCT): the lane a posted transfer went on
	OpXferIface    // a transport interface opened (uct_iface_open): its transport and device
	OpXferMemMap   // memory registered with the library (ucp_mem_map): Ptr, Size, its memory type
	OpFabricObject // a libfabric object constructed (fabric, domain, endpoint, CQ): its ops name the provider's functions
)

var opNames = [...]string{
	OpCopy: "copy", OpCopy2D: "copy2d", OpCopyPeer: "copy_peer", OpCopyBatch: "copy_batch",
	OpHostAlloc: "host_alloc", OpHostRegister: "host_register", OpHostUnregister: "host_unregister",
	OpHostFree: "host_free", OpDeviceAlloc: "device_alloc", OpDeviceFree: "device_free",
	OpStreamSync: "stream_sync", OpEventRecord: "event_record", OpEventSync: "event_sync",
	OpStreamWaitEvent: "stream_wait_event", OpInit: "init", OpLinkerUpdate: "linker_update",
	OpMRRegister: "mr_register", OpMRDeregister: "mr_deregister", OpVerbsContext: "verbs_context",
	OpPostSend: "post_send", OpPostRecv: "post_recv", OpPollCQ: "poll_cq",
	OpCtxRetain: "ctx_retain", OpCtxCreate: "ctx_create", OpCtxSetCurrent: "ctx_set_current", OpCtxPush: "ctx_push",
	OpCtxPop: "ctx_pop", OpCtxDestroy: "ctx_destroy", OpDeviceBusID: "device_pci_bus_id",
	OpManagedAlloc: "managed_alloc", OpPoolAlloc: "pool_alloc", OpPoolCreate: "pool_create", OpPoolDestroy: "pool_destroy",
	OpMemCreate: "mem_create", OpMemRelease: "mem_release", OpAddressReserve: "address_reserve",
	OpAddressFree: "address_free", OpMemMap: "mem_map", OpMemUnmap: "mem_unmap", OpDmabufExport: "dmabuf_export",
	OpLaunch: "launch", OpKernelName: "kernel_name", OpKernelFunction: "kernel_function",
	OpCtxSync:     "ctx_sync",
	OpQPModify:    "qp_modify",
	OpGraphLaunch: "graph_launch", OpCaptureBegin: "capture_begin", OpCaptureEnd: "capture_end",
	OpKernelCopy: "kernel_copy",
	OpXferPut:    "xfer_put", OpXferGet: "xfer_get", OpXferSend: "xfer_send", OpXferDone: "xfer_done",
	OpXferLane: "xfer_lane", OpXferIface: "xfer_iface", OpXferMemMap: "xfer_mem_map", OpFabricObject: "fabric_object",
}

// opByName inverts opNames for ParseOp.
var opByName = func() map[string]Op {
	m := make(map[string]Op, len(opNames))
	for o, name := range opNames {
		if name != "" {
			m[name] = Op(o)
		}
	}
	return m
}()

// String is the op's name as records carry it ("copy", "post_send").
func (o Op) String() string {
	if int(o) < len(opNames) && opNames[o] != "" {
		return opNames[o]
	}
	return "unknown"
}

// ParseOp is the op String names. A name it does not know (including
// "unknown") is an error: outside text never becomes an op by default.
func ParseOp(name string) (Op, error) {
	if o, ok := opByName[name]; ok {
		return o, nil
	}
	return 0, fmt.Errorf("unknown op %q", name)
}

// MarshalText writes the op's name, so records carry "op":"copy".
func (o Op) MarshalText() ([]byte, error) { return []byte(o.String()), nil }

// UnmarshalText reads a name MarshalText wrote (ParseOp).
func (o *Op) UnmarshalText(b []byte) error {
	op, err := ParseOp(string(b))
	if err != nil {
		return err
	}
	*o = op
	return nil
}

// Failed reports whether a call that returns its result failed: CUDA
// results (cudaError_t, CUresult) are 32-bit enums, 0 for success; the upper
// half of rax is not part of them.
func (c *Call) Failed() bool { return c.Returns && uint32(c.Ret) != 0 }

// IsCopy reports whether the op moves bytes.
func (o Op) IsCopy() bool { return o >= OpCopy && o <= OpCopyBatch }

// IsCUDA reports whether the op is a CUDA runtime or driver call the engine
// correlates (copies, memory, ordering, initialisation).
func (o Op) IsCUDA() bool {
	return o >= OpCopy && o <= OpInit || o.IsContext() || o.IsMemory() || o.IsKernel() || o == OpCtxSync || o.IsGraph()
}

// IsGraph reports whether the op launches a CUDA graph or begins or ends a
// stream capture.
func (o Op) IsGraph() bool { return o >= OpGraphLaunch && o <= OpCaptureEnd }

// IsXfer reports whether the op is a transfer library's posted transfer
// (UCX, libfabric): a record of its own, judged like an RDMA one.
func (o Op) IsXfer() bool { return o >= OpXferPut && o <= OpXferSend }

// IsKernel reports whether the op launches or names a kernel.
func (o Op) IsKernel() bool { return o >= OpLaunch && o <= OpKernelFunction }

// IsContext reports whether the op selects or names a device or context.
func (o Op) IsContext() bool { return o >= OpCtxRetain && o <= OpDeviceBusID }

// IsMemory reports whether the op is one of the managed, pool, VMM and
// dma-buf calls (they follow the context ops in the numbering).
func (o Op) IsMemory() bool { return o >= OpManagedAlloc && o <= OpDmabufExport }

// Layer says which API layer a symbol belongs to.
type Layer uint8

const (
	LayerRuntime  Layer = iota + 1 // libcudart: may call into the driver on the same thread
	LayerDriver                    // libcuda
	LayerLinker                    // ld.so
	LayerVerbs                     // libibverbs' exported entry points
	LayerProvider                  // an RDMA provider's data path, reached through the ops table
	LayerUCP                       // UCX's application API (libucp): transfers as posted
	LayerUCT                       // UCX's transports (libuct, libuct_ib, ...): the lane a transfer went on
	LayerFabric                    // libfabric: its constructors, and the provider functions its ops tables name
)

// CopyKind is the direction a call states (cudaMemcpyKind values).
type CopyKind uint8

const (
	CopyHostToHost     CopyKind = 0
	CopyHostToDevice   CopyKind = 1
	CopyDeviceToHost   CopyKind = 2
	CopyDeviceToDevice CopyKind = 3
	CopyDefault        CopyKind = 4 // resolved from the pointers (unified addressing)
)

// MemKind is what backs one side of a transfer.
type MemKind string

// Memory kinds. MemUnknown is a real answer, not an error: the agent could
// not have seen the registration (late attach, lost events, caps).
const (
	MemPinned   MemKind = "pinned"   // page-locked host memory (host alloc or register)
	MemPageable MemKind = "pageable" // host memory provably never registered
	MemDevice   MemKind = "device"   // device memory
	MemManaged  MemKind = "managed"  // managed (unified) memory: pages migrate between host and devices
	// MemRegistered: host memory mapped with a transfer library
	// (ucp_mem_map), which registers it with the NICs that need it.
	MemRegistered MemKind = "registered"
	MemUnknown    MemKind = "unknown" // host or device memory the agent cannot classify
)

// Drops counts events lost or damaged before they reached the reader, by
// reason.
type Drops struct {
	RingFull   uint64 // events lost because the ring buffer was full
	NoEntry    uint64 // return probes without their saved entry
	BatchTrunc uint64 // batch entries beyond the per-call limit
	ReadFault  uint64 // user memory that could not be read
	WRTrunc    uint64 // work requests or completions beyond the per-call limit
}

// Total is every event lost or damaged.
func (d Drops) Total() uint64 {
	return d.RingFull + d.NoEntry + d.BatchTrunc + d.ReadFault + d.WRTrunc
}

// Lossy reports whether events may be missing altogether (not only
// truncated or damaged): a registration may have been missed.
func (d Drops) Lossy() bool { return d.RingFull != 0 || d.NoEntry != 0 }

// Sub is the drops since an earlier reading.
func (d Drops) Sub(before Drops) Drops {
	return Drops{d.RingFull - before.RingFull, d.NoEntry - before.NoEntry, d.BatchTrunc - before.BatchTrunc,
		d.ReadFault - before.ReadFault, d.WRTrunc - before.WRTrunc}
}

// Reasons lists the counts with their metric and log names, in a fixed order.
func (d Drops) Reasons() []DropReason {
	return []DropReason{{"ring_full", d.RingFull}, {"lost_return", d.NoEntry}, {"batch_truncated", d.BatchTrunc},
		{"read_fault", d.ReadFault}, {"wr_truncated", d.WRTrunc}}
}

// DropReason is one reason's name and count.
type DropReason struct {
	Name  string
	Count uint64
}
