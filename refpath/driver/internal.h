/* Internal interfaces of the reference driver (libcuda.so.1). Not installed. */
#ifndef REFPATH_DRIVER_INTERNAL_H
#define REFPATH_DRIVER_INTERNAL_H

#include "refcuda.h"
#include <pthread.h>
#include <stdint.h>
#include <stddef.h>
#include <time.h>

/* Everything is built with -fvisibility=hidden; only API entry points are exported.
 * noinline keeps every entry point a real function at its own address, so a uprobe
 * on it fires for every call. */
#define RC_API __attribute__((noinline, visibility("default")))

/* flags of the copy helpers */
#define REFCUDA_ASYNC 0x1u      /* return once enqueued (unless the host side is pageable) */
#define REFCUDA_PER_THREAD 0x2u /* stream 0 means the calling thread's default stream */

/* Directions, numbered like cudaMemcpyKind. */
enum rc_dir { RC_H2H = 0, RC_H2D = 1, RC_D2H = 2, RC_D2D = 3 };

#define RC_CHUNK (256u * 1024u) /* the engine moves data in chunks of this size */

static inline uint64_t rc_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* mover.c: a thread that stands for hardware moving bytes asks for SCHED_FIFO */
void rc_mover_thread(void);

/* init.c */
void rc_init(void); /* the driver's own state (arena, lanes, streams); cuInit and the helpers run it */

/*
 * Every exported cu* entry point but cuInit starts with RC_GATE() (copies call
 * rc_enter() themselves): it counts the call and, like the real driver, refuses it
 * with CUDA_ERROR_NOT_INITIALIZED until a cuInit has succeeded. rc_enter is a real
 * call (init.c), never inlined, so nothing of it is scheduled ahead of an entry
 * point's push %rbp: that first instruction is what the agent probes (the kernel
 * emulates a push; it would single-step a load).
 */
CUresult rc_enter(void);
#define RC_GATE()                                     \
	do {                                          \
		CUresult gate_rc_ = rc_enter();       \
		if (gate_rc_ != CUDA_SUCCESS)         \
			return gate_rc_;              \
	} while (0)

/* mem.c: device arena and the table of pinned (registered or allocated) host ranges */
int rc_is_device(const void *p, size_t n);
int rc_is_pinned(const void *p, size_t n);
void rc_mem_init(size_t device_bytes);
CUresult rc_dev_alloc(CUdeviceptr *dptr, size_t bytesize); /* the arena, as cuMemAlloc_v2 */
CUresult rc_dev_free(CUdeviceptr dptr);
CUresult rc_host_alloc(void **pp, size_t bytesize); /* pinned, as cuMemHostAlloc */
CUresult rc_host_free(void *p);

/* vmm.c: managed memory, pools, VMM mappings, dma-buf exports */
enum rc_mem { RC_MEM_NONE, RC_MEM_DEVICE, RC_MEM_PINNED, RC_MEM_MANAGED };
/* The kind of [p, p+n) when it lies in one managed allocation or one VMM mapping. */
enum rc_mem rc_vmm_kind(const void *p, size_t n);
/* cuMemFree of what is not arena memory: a managed or stream-ordered allocation. */
CUresult rc_vmm_free(CUdeviceptr dptr);

/* device.c: contexts, and the device each device allocation was made on */
int rc_current_device(void); /* the device of the context current on the calling thread, -1 none */
void rc_note_alloc(const void *p, size_t len, int dev);
void rc_note_free(const void *p);
int rc_device_of(const void *p); /* the device of the allocation holding p, -1 unknown */
/* lane.c: the devices (LW_REF_GPUS, or one) */
int rc_device_count(void);
const char *rc_device_name(int dev); /* its shared GPU's name, "" for private lanes; NULL: no such device */

/* A copy: 2D in general (1D is height 1). */
struct rc_xfer {
	char *dst;
	const char *src;
	size_t dpitch, spitch, width, height;
	int dir;    /* enum rc_dir */
	int staged; /* host side is pageable: staged through a pinned bounce buffer */
	struct refcudaCopyTimes *times;
	uint64_t ready_ns; /* a queued copy's first byte moves no earlier (RC_COPY_TURNAROUND_NS); 0 none */
};

/*
 * The copy engine's turnaround: a copy queued on a stream moves its first byte no
 * earlier than this after it was submitted (descriptor fetch, the engine's start, its
 * completion write), however idle the lane. Copies queued behind others overlap it
 * with their predecessors' bytes, so a deep queue never sees it; one copy at a time,
 * each waited for, pays it every time. Real engines take a few to ~10 us per copy;
 * 10 us against the reference's 4 GB/s lanes is a bandwidth-delay product of 40 kB.
 */
#define RC_COPY_TURNAROUND_NS 10000ull

/* lane.c: the per-direction PCIe lane model */
void rc_lane_init(double h2d_gbps, double d2h_gbps);
/* Runs a copy in the calling thread. *cursor: end of this engine's previous chunk
 * if the copy follows it without a gap, else 0; updated. */
void rc_xfer_run(const struct rc_xfer *x, uint64_t *cursor);

/* stream.c */
struct CUstream_st *rc_stream_resolve(CUstream s, int per_thread);
int rc_submit_copy(struct rc_xfer *x, CUstream s, unsigned int flags);
void rc_copy_records_skip(size_t n); /* a failed copy call uses up its n engine-time records */
/* kernel.c: a launch whose parameters were copied at the call, run by its stream's
 * engine (which sets l.cursor) and freed there. */
struct rc_launch {
	size_t size; /* bytes allocated, data included: a graph node copies it whole (graph.c) */
	refcudaKernelFn fn;
	struct refcudaKernelLaunch l;
	struct refcudaCopyTimes *times; /* ground truth (refcudaSetCopyRecords), NULL when not armed */
	void *params[REFCUDA_MAX_PARAMS];
	unsigned char data[]; /* the parameters' copies: params[i] points into it */
};
/* Queues a launch on the stream (taking the thread's next time record); the
 * engine runs it in stream order and frees it. */
CUresult rc_submit_kernel(struct rc_launch *k, CUstream s, int per_thread);
/* Queues fn(arg) on the stream: it runs once the work submitted before it is done. */
CUresult rc_stream_enqueue_fn(CUstream s, int per_thread, void (*fn)(uintptr_t), uintptr_t arg);
void rc_streams_init(void);

/* What a stream's engine runs, in submission order; a graph's nodes are the same
 * (graph.c), copied onto the launch stream at each cuGraphLaunch. */
enum rc_op_type { OP_COPY, OP_EVENT_RECORD, OP_WAIT_EVENT, OP_FN, OP_KERNEL, OP_STOP };
struct rc_op {
	int type;
	struct rc_xfer x;
	struct CUevent_st *ev;
	uint64_t gen;
	void (*fn)(uintptr_t); /* OP_FN: a stream-ordered free */
	uintptr_t arg;
	struct rc_launch *k; /* OP_KERNEL */
};
/* Submits o to the stream: queued, or recorded into the stream's capture (OP_COPY,
 * OP_KERNEL, OP_EVENT_RECORD; any other op fails with
 * CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates the capture). A kernel's
 * launch and an event's reference go with the op. */
CUresult rc_stream_submit(CUstream s, int per_thread, const struct rc_op *o);
void rc_event_ref(struct CUevent_st *e);
void rc_event_unref(struct CUevent_st *e);

/* graph.c: a graph is its nodes, in the order they were captured */
struct CUgraph_st *rc_graph_new(void);
/* Appends o (taking its kernel launch and event reference); CUDA_ERROR_OUT_OF_MEMORY. */
CUresult rc_graph_add(struct CUgraph_st *g, const struct rc_op *o);
void rc_graph_free(struct CUgraph_st *g);

#endif
