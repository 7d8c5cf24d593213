// Package correlate turns decoded probe calls into transfers: it keeps a
// per-process registry of pinned and device memory, classifies every copy
// (direction, memory kind of each side), folds a runtime call and the driver
// call it makes on the same thread into one transfer, and learns when a
// transfer completed from the synchronisations that follow it.
//
// It makes no system calls: it is fed by events, so it runs and is tested
// alone.
package correlate

import "github.com/lanewatch/lanewatch/event"

// Directions of a transfer.
const (
	DirH2D     = "H2D"
	DirD2H     = "D2H"
	DirD2D     = "D2D"
	DirH2H     = "H2H"
	DirUnknown = "unknown" // cudaMemcpyDefault with a side the registry cannot place

	// RDMA directions, from the posting side (seed 002): a WRITE pushes to
	// the remote, a READ pulls toward the initiator, WRITE_IMM also consumes
	// a receive at the target, RECV is data that arrived into this process.
	DirRDMAWrite = "RDMA_WRITE"
	DirWriteImm  = "WRITE_IMM"
	DirRDMARead  = "RDMA_READ"
	DirSend      = "SEND"
	DirRecv      = "RECV"
)

// Side is one end of a transfer.
type Side struct {
	Addr uint64        `json:"addr"`
	Mem  event.MemKind `json:"memory"`
	// Reason says why Mem is unknown (a Reason constant: events_lost,
	// late_attach, not_observed, range_cap, vmm_unseen, untracked); ""
	// otherwise, or when it is unknown by nature (an RDMA region).
	Reason string `json:"reason,omitempty"`
}

// Transfer is one copy as the engine reports it, one per runtime call (or
// per driver call made directly, or per batch entry).
//
// JSON schema (one object per transfer, snake_case):
//
//	pid, tid          process and thread that submitted the copy
//	stream            stream handle as passed to the call (0: default stream)
//	api               probed symbol of the outer call ("cudaMemcpyAsync_ptsz")
//	driver_api        driver symbol folded into it, when the runtime called one
//	op                copy | copy2d | copy_peer | copy_batch | kernel_copy
//	                  (a KV-transfer kernel's launch) | post_send | post_recv
//	mover             who moves the bytes: copy_engine (copies), sm (kernel_copy:
//	                  the GPU's SMs), nic (RDMA work requests, network transports),
//	                  cpu (a transfer library's same-host transport)
//	kernel            kernel_copy: the kernel's function name, demangled without
//	                  template arguments ("transfer_kernel_impl")
//	kernel_symbol     kernel_copy: the kernel's symbol as the driver was given it
//	direction         H2D | D2H | D2D | H2H | unknown (always for kernel_copy: a
//	                  kernel's name and launch do not state it)
//	bytes             bytes moved (width*height for 2D copies); 0 with
//	                  bytes_unknown for kernel_copy
//	bytes_unknown     true when the record's bytes are not known (a kernel's
//	                  launch states none; docs/design.md, "Kernel movers")
//	src, dst          {"addr": address, "memory": pinned|pageable|device|managed|unknown,
//	                  "reason": why unknown} (reason: events_lost, late_attach,
//	                  not_observed, range_cap, vmm_unseen, untracked)
//	host_mem          memory of the host side, H2D and D2H only
//	host_mem_reason   why host_mem is unknown (the host side's reason)
//	gpu               PCI address (sysfs form, "0000:3b:00.0") of the GPU whose
//	                  link the copy crossed; absent when unknown
//	src_gpu           D2D between two GPUs (a peer copy): PCI address of the GPU
//	                  whose memory the copy read, when it differs from gpu;
//	                  absent when unknown or the same GPU
//	submit_ns         CLOCK_MONOTONIC ns when the call was entered
//	complete_ns       CLOCK_MONOTONIC ns by which a synchronisation proved the
//	                  copy finished (an upper bound); absent when unknown
//	complete_near     true when that synchronisation was the next call the
//	                  copy's thread made after it (or after an event record on
//	                  the copy's stream): complete_ns - submit_ns is then the
//	                  copy's own latency, not other work's (docs/design.md 7)
//	batch_index       position in a cudaMemcpyBatchAsync call, -1 otherwise
//	numa_node         NUMA node of the host pages the copy read (H2D) or wrote
//	                  (D2H): the node of most of numa_pages; absent when unknown
//	numa_pages        node of each host page sampled, in address order (one
//	                  page in each third of the range; move_pages(2), see
//	                  docs/design.md "Pages, not registrations"); absent when
//	                  no sampled page could be located
//	layer             per-layer index on a load stream, -1 when the stream shows
//	                  no per-layer pattern (see Layer below)
//	inferred          behavioural guess of the host memory (pinned|pageable),
//	                  never overwriting host_mem; absent until measured
//	call_ns           duration of the submitting call, the evidence for inferred
//	order             RDMA: ordering facts, when any (correlate.OrderFacts):
//	                  {"notify_ahead": {...}} a notification posted on another QP
//	                  than outstanding WRITEs to its peer, {"peer_unknown": true}
//	                  the same not judged, {"mr_deregistered": {...}} its region
//	                  was deregistered while it was outstanding
//	transport         transfer libraries (op xfer_put|xfer_get|xfer_send): the
//	                  library's transport that carried it (UCX: rc_mlx5, dc_mlx5,
//	                  rc_verbs, ud_*, cuda_ipc, cuda_copy, tcp, posix, sysv, cma,
//	                  self; libfabric: the provider, "tcp;ofi_rxm", "efa", "verbs");
//	                  "unknown" with transport_reason when the agent could not see it
//	transport_reason  why transport is unknown (transport_not_seen: no call of its
//	                  endpoint reached a transport yet; iface_not_seen: the
//	                  interface was opened before the agent looked, so the device
//	                  is unknown and the transport is the one its function names)
//	transport_inferred true when the call itself reached no transport (queued for
//	                  the library's progress, or a rendezvous the receiver pulls):
//	                  transport and device are those of its endpoint's last
//	                  transfer of the same kind
//	device            the device of that lane ("mlx5_0:1", "lo", "memory";
//	                  libfabric: the domain's name); absent when unknown
//	remote_addr       the remote address a put or get named
//	endpoint          the library's endpoint handle (ucp_ep_h, struct fid_ep *)
//	latency_ns        posted → completed, when the completion was seen
//	error             {"code": N, "name": "cudaErrorNoDevice"} when the call
//	                  failed: the record then moved nothing (its bytes are what
//	                  was asked), and no metric, rule, span or lane counts it
type Transfer struct {
	PID       uint32   `json:"pid"`
	TID       uint32   `json:"tid"`
	Stream    uint64   `json:"stream"`
	API       string   `json:"api"`
	DriverAPI string   `json:"driver_api,omitempty"`
	Op        event.Op `json:"op"`
	// Mover is who moves the bytes: MoverCopyEngine, MoverSM, MoverNIC.
	Mover string `json:"mover,omitempty"`
	// Kernel and KernelSymbol name the kernel of a kernel_copy.
	Kernel       string `json:"kernel,omitempty"`
	KernelSymbol string `json:"kernel_symbol,omitempty"`
	Direction    string `json:"direction"`
	Bytes        uint64 `json:"bytes"`
	// BytesUnknown: Bytes is not known (0), never a count of zero.
	BytesUnknown bool          `json:"bytes_unknown,omitempty"`
	Src          Side          `json:"src"`
	Dst          Side          `json:"dst"`
	HostMem      event.MemKind `json:"host_mem,omitempty"`
	// HostMemReason: why HostMem is unknown (the host side's Reason).
	HostMemReason string `json:"host_mem_reason,omitempty"`
	// GPU is the PCI address (sysfs form) of the GPU whose link the copy
	// crossed: the device owning its device pointer, else the device current
	// on the submitting thread; "" when unknown.
	GPU string `json:"gpu,omitempty"`
	// SrcGPU is, for a D2D copy between two GPUs (a peer copy), the GPU
	// whose memory it read (the owner of its source pointer); "" when
	// unknown or the same as GPU. The copy's path between the two (NVLink
	// or PCIe) is the topology's to say (checks.Window.PeerBytes).
	SrcGPU     string `json:"src_gpu,omitempty"`
	SubmitNs   uint64 `json:"submit_ns"`
	CompleteNs uint64 `json:"complete_ns,omitempty"`
	// CompleteNear: the completion was proven by the next call the copy's
	// thread made (a synchronisation entered right after the copy returned,
	// or after an event record on its stream that the wait is on), so
	// CompleteNs−SubmitNs is the copy's own latency; otherwise the wait
	// came after other calls (launches, other copies), whose work its time
	// may include. Judged by call order, never by a time threshold.
	CompleteNear bool `json:"complete_near,omitempty"`
	BatchIndex   int  `json:"batch_index"`

	// NUMANode and NUMAPages say where the host pages of an H2D or D2H
	// copy were, located by the agent after the engine emitted the copy
	// (SetPages); their zero values are unknown, and every other record
	// (D2D, H2H, RDMA, failed calls) leaves them so.
	NUMANode  Node      `json:"numa_node,omitzero"`
	NUMAPages PageNodes `json:"numa_pages,omitzero"`

	// Layer is the copy's layer on a per-layer load stream: HiCache-style
	// loaders record one event on the load stream after each layer's copies,
	// so the number of event records on the copy's stream since that stream
	// was last proven drained (a synchronisation of it, or of an event or
	// stream that captured its last record) is the layer. It is kept only
	// when the pattern is confirmed, i.e. an event was recorded on the
	// stream after the copy; -1 otherwise (no per-layer pattern).
	Layer int `json:"layer"`

	// Behavioural evidence (docs/design.md, "Late attach"): how long the call
	// held its caller, and (not inferred yet) the memory kind that implies.
	Inferred event.MemKind `json:"inferred,omitempty"`
	CallNs   uint64        `json:"call_ns,omitempty"`

	// RDMA work requests (op post_send/post_recv): the queue pair, the
	// request's id, its completion status, and the process on this host that
	// owns the remote memory when its rkey is known here.
	QPNum   uint32 `json:"qp_num,omitempty"`
	WRID    uint64 `json:"wr_id,omitempty"`
	Status  string `json:"status,omitempty"`
	PeerPID uint32 `json:"peer_pid,omitempty"`
	// Order: the request's ordering facts (ordering.go), nil when none.
	Order *OrderFacts `json:"order,omitempty"`

	// Transfer libraries (op xfer_*: UCX, libfabric): the transport and
	// device of the lane the library chose, where it was seen; the remote
	// address and endpoint as posted; posted → completed latency.
	Transport       string `json:"transport,omitempty"`
	TransportReason string `json:"transport_reason,omitempty"`
	// TransportInferred: the call itself reached no transport (UCX queued
	// it for its worker's progress, or a rendezvous's receiver pulls the
	// data); its endpoint's last transfer of the same kind went on it.
	TransportInferred bool   `json:"transport_inferred,omitempty"`
	NetDevice         string `json:"device,omitempty"`
	RemoteAddr        uint64 `json:"remote_addr,omitempty"`
	Endpoint          uint64 `json:"endpoint,omitempty"`
	LatencyNs         uint64 `json:"latency_ns,omitempty"`

	// Error is the result of a CUDA call that failed, nil otherwise. A
	// failed call is reported (copies, memory and ordering calls alike) but
	// is never a transfer: nothing moved.
	Error *CallError `json:"error,omitempty"`
}

// CallError is a failed call's result: the code the probed function
// returned and its name in that layer's enum (cudaError_t for the runtime,
// CUresult for the driver; "" when the headers the agent was built from do
// not know it).
type CallError struct {
	Code uint32 `json:"code"`
	Name string `json:"name"`
}

// Failed reports whether the record is a failed call rather than a transfer.
func (t *Transfer) Failed() bool { return t.Error != nil }

// callError names a failed call's result by its layer.
func callError(c *event.Call) *CallError {
	code := uint32(c.Ret)
	name, _ := event.DriverErrorName(uint64(code))
	if c.Layer == event.LayerRuntime {
		name, _ = event.RuntimeErrorName(uint64(code))
	}
	return &CallError{Code: code, Name: name}
}
