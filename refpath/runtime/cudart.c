/*
 * Reference CUDA runtime (libcudart.so.12). Every call is implemented by calling
 * the exported driver function through the PLT, as the real runtime does, so a
 * uprobe on the driver symbol fires too (the agent must fold the pair into one
 * transfer). Built twice from this file: with and without CET (endbr64) prologues.
 *
 * Routing, as measured on NVIDIA's 11.8 and 12.4 runtimes:
 *   cudaMemcpy[_ptds]              kind 1/2/3: cuMemcpy{HtoD,DtoH,DtoD}_v2[_ptds]; 0, 4: cuMemcpy[_ptds]
 *   cudaMemcpyAsync[_ptsz]         kind 1/2/3: cuMemcpy{HtoD,DtoH,DtoD}Async_v2[_ptsz]; 0, 4: cuMemcpyAsync[_ptsz]
 *   cudaMemcpy2D[_ptds]            cuMemcpy2DUnaligned_v2[_ptds]
 *   cudaMemcpy2DAsync[_ptsz]       cuMemcpy2DAsync_v2[_ptsz]
 *   cudaMemcpyPeer[Async]          cuMemcpyPeer[Async]
 *   cudaMemcpyBatchAsync[_ptsz]    cuMemcpyBatchAsync[_ptsz]
 *   cudaMallocHost, cudaHostAlloc  cuMemHostAlloc (the real runtimes never call cuMemAllocHost)
 *   cudaMallocManaged              cuMemAllocManaged
 *   cudaMallocAsync[_ptsz]         cuMemAllocAsync[_ptsz]
 *   cudaMallocFromPoolAsync[_ptsz] cuMemAllocFromPoolAsync[_ptsz]
 *   cudaFreeAsync[_ptsz]           cuMemFreeAsync[_ptsz]
 *   cudaMemPoolCreate/Destroy      cuMemPoolCreate/Destroy (cudaMemPoolProps is laid out as CUmemPoolProps)
 *   other memory, stream, event    the matching cu* call (cudaEventRecordWithFlags: cuEventRecordWithFlags)
 *   cudaStreamBeginCapture[_ptsz]  cuStreamBeginCapture_v2[_ptsz]; EndCapture, IsCapturing, GraphLaunch likewise
 *   cudaGraphInstantiate[WithFlags] cuGraphInstantiateWithFlags (CUDA 12 signatures: flags)
 *   cudaLaunchKernel[_ptsz]        cuLaunchKernel[_ptsz] (all eleven arguments), with the CUfunction of
 *                                  cuModuleGetFunction(registered device name), asked once per context
 *   cudaLaunchKernelExC[_ptsz]     cuLaunchKernelEx[_ptsz]
 *
 * Devices, as CUDA 12's runtime handles them: cudaSetDevice(d) retains d's primary
 * context (once per process and device: cuDevicePrimaryCtxRetain) and makes it
 * current on the calling thread (cuCtxSetCurrent); a thread's first other runtime
 * call asks the driver for its current context (cuCtxGetCurrent: a context the
 * application made current with the driver API is used as it is) and, with none,
 * makes device 0's current: CUDA's implicit device. The real runtime asks on every
 * call, through its own table; this one asks once per thread.
 *
 * Initialisation is sticky, like the real runtime's: the first runtime call runs
 * cuInit(0); if that fails, its error (CUDA_ERROR_NO_DEVICE -> cudaErrorNoDevice) is
 * kept and every later runtime call returns it without calling the driver again.
 */
#include "refcuda.h"
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#define RT_API __attribute__((noinline, visibility("default")))
#define DP(p) ((CUdeviceptr)(uintptr_t)(p))

static pthread_once_t once = PTHREAD_ONCE_INIT;
static cudaError_t init_error; /* written once, under `once` */
static __thread cudaError_t last_error;
static __thread int thread_ready; /* the thread has a current context (set here or by the application) */

/* The primary context of each device, retained once per process. */
#define RT_MAX_DEVICES 8
static pthread_mutex_t primary_mu = PTHREAD_MUTEX_INITIALIZER;
static CUcontext primary[RT_MAX_DEVICES];

/* Driver status to runtime status: the codes we use share their numeric values
 * (CUDA_ERROR_NO_DEVICE 100 = cudaErrorNoDevice, CUDA_ERROR_NOT_INITIALIZED 3 =
 * cudaErrorInitializationError, CUDA_ERROR_INVALID_HANDLE 400 =
 * cudaErrorInvalidResourceHandle, ...). */
static cudaError_t rt_error(CUresult r)
{
	return (cudaError_t)r;
}

static void do_init(void)
{
	init_error = rt_error(cuInit(0));
}

static cudaError_t ret(CUresult r)
{
	cudaError_t e = rt_error(r);
	if (e != cudaSuccess)
		last_error = e;
	return e;
}

static CUresult primary_ctx(int device, CUcontext *ctx)
{
	int n = 0;
	CUresult r = cuDeviceGetCount(&n);
	if (r != CUDA_SUCCESS)
		return r;
	if (device < 0 || device >= n || device >= RT_MAX_DEVICES)
		return CUDA_ERROR_INVALID_DEVICE;
	pthread_mutex_lock(&primary_mu);
	if (!primary[device])
		r = cuDevicePrimaryCtxRetain(&primary[device], device);
	*ctx = primary[device];
	pthread_mutex_unlock(&primary_mu);
	return r;
}

static CUresult set_device(int device)
{
	CUcontext c = NULL;
	CUresult r = primary_ctx(device, &c);
	if (r == CUDA_SUCCESS)
		r = cuCtxSetCurrent(c);
	if (r == CUDA_SUCCESS)
		thread_ready = 1;
	return r;
}

/* A thread's first call: the context current on it, else device 0's. */
static CUresult thread_context(void)
{
	CUcontext c = NULL;
	CUresult r = cuCtxGetCurrent(&c);
	if (r != CUDA_SUCCESS)
		return r;
	if (c) {
		thread_ready = 1;
		return CUDA_SUCCESS;
	}
	return set_device(0);
}

/* Every runtime call that uses a device starts here: after a failed initialisation
 * it returns the sticky error and the driver is never reached; a thread's first
 * call gets its context. INIT_PROCESS is the first half alone. */
#define INIT_PROCESS()                                               \
	do {                                                         \
		pthread_once(&once, do_init);                        \
		if (__builtin_expect(init_error != cudaSuccess, 0))  \
			return ret((CUresult)init_error);            \
	} while (0)
#define INIT()                                                               \
	do {                                                                 \
		INIT_PROCESS();                                              \
		if (__builtin_expect(!thread_ready, 0)) {                    \
			CUresult ctx_rc_ = thread_context();                 \
			if (ctx_rc_ != CUDA_SUCCESS)                         \
				return ret(ctx_rc_);                         \
		}                                                            \
	} while (0)

/* ---- 1D copies: the kind picks the driver function ---- */
static cudaError_t memcpy_sync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, int pt)
{
	INIT();
	switch (kind) {
	case cudaMemcpyHostToDevice:
		return ret(pt ? cuMemcpyHtoD_v2_ptds(DP(dst), src, n) : cuMemcpyHtoD_v2(DP(dst), src, n));
	case cudaMemcpyDeviceToHost:
		return ret(pt ? cuMemcpyDtoH_v2_ptds(dst, DP(src), n) : cuMemcpyDtoH_v2(dst, DP(src), n));
	case cudaMemcpyDeviceToDevice:
		return ret(pt ? cuMemcpyDtoD_v2_ptds(DP(dst), DP(src), n) : cuMemcpyDtoD_v2(DP(dst), DP(src), n));
	case cudaMemcpyHostToHost:
	case cudaMemcpyDefault:
		return ret(pt ? cuMemcpy_ptds(DP(dst), DP(src), n) : cuMemcpy(DP(dst), DP(src), n));
	}
	return ret((CUresult)cudaErrorInvalidMemcpyDirection);
}

static cudaError_t memcpy_async(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, cudaStream_t s,
				int pt)
{
	INIT();
	switch (kind) {
	case cudaMemcpyHostToDevice:
		return ret(pt ? cuMemcpyHtoDAsync_v2_ptsz(DP(dst), src, n, s) : cuMemcpyHtoDAsync_v2(DP(dst), src, n, s));
	case cudaMemcpyDeviceToHost:
		return ret(pt ? cuMemcpyDtoHAsync_v2_ptsz(dst, DP(src), n, s) : cuMemcpyDtoHAsync_v2(dst, DP(src), n, s));
	case cudaMemcpyDeviceToDevice:
		return ret(pt ? cuMemcpyDtoDAsync_v2_ptsz(DP(dst), DP(src), n, s)
			      : cuMemcpyDtoDAsync_v2(DP(dst), DP(src), n, s));
	case cudaMemcpyHostToHost:
	case cudaMemcpyDefault:
		return ret(pt ? cuMemcpyAsync_ptsz(DP(dst), DP(src), n, s) : cuMemcpyAsync(DP(dst), DP(src), n, s));
	}
	return ret((CUresult)cudaErrorInvalidMemcpyDirection);
}

RT_API cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
{
	return memcpy_sync(dst, src, count, kind, 0);
}

RT_API cudaError_t cudaMemcpy_ptds(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
{
	return memcpy_sync(dst, src, count, kind, 1);
}

RT_API cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
				   cudaStream_t stream)
{
	return memcpy_async(dst, src, count, kind, stream, 0);
}

RT_API cudaError_t cudaMemcpyAsync_ptsz(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
					cudaStream_t stream)
{
	return memcpy_async(dst, src, count, kind, stream, 1);
}

/* ---- 2D: the 7th (kind) and 8th (stream) arguments are passed on the stack ---- */

/* The driver's descriptor of a 2D copy: memory types follow the kind (Default:
 * both unified, resolved by the driver from the addresses). 0 if the kind is bad. */
static int desc2d(CUDA_MEMCPY2D *m, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
		  size_t height, enum cudaMemcpyKind kind)
{
	CUmemorytype st, dt;
	switch (kind) {
	case cudaMemcpyHostToHost:
		st = dt = CU_MEMORYTYPE_HOST;
		break;
	case cudaMemcpyHostToDevice:
		st = CU_MEMORYTYPE_HOST;
		dt = CU_MEMORYTYPE_DEVICE;
		break;
	case cudaMemcpyDeviceToHost:
		st = CU_MEMORYTYPE_DEVICE;
		dt = CU_MEMORYTYPE_HOST;
		break;
	case cudaMemcpyDeviceToDevice:
		st = dt = CU_MEMORYTYPE_DEVICE;
		break;
	case cudaMemcpyDefault:
		st = dt = CU_MEMORYTYPE_UNIFIED;
		break;
	default:
		return 0;
	}
	*m = (CUDA_MEMCPY2D){
		.srcMemoryType = st, .srcPitch = spitch,
		.dstMemoryType = dt, .dstPitch = dpitch,
		.WidthInBytes = width, .Height = height,
	};
	if (st == CU_MEMORYTYPE_HOST)
		m->srcHost = src;
	else
		m->srcDevice = DP(src);
	if (dt == CU_MEMORYTYPE_HOST)
		m->dstHost = dst;
	else
		m->dstDevice = DP(dst);
	return 1;
}

RT_API cudaError_t cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
				size_t height, enum cudaMemcpyKind kind)
{
	INIT();
	CUDA_MEMCPY2D m;
	if (!desc2d(&m, dst, dpitch, src, spitch, width, height, kind))
		return ret((CUresult)cudaErrorInvalidMemcpyDirection);
	return ret(cuMemcpy2DUnaligned_v2(&m));
}

RT_API cudaError_t cudaMemcpy2D_ptds(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
				     size_t height, enum cudaMemcpyKind kind)
{
	INIT();
	CUDA_MEMCPY2D m;
	if (!desc2d(&m, dst, dpitch, src, spitch, width, height, kind))
		return ret((CUresult)cudaErrorInvalidMemcpyDirection);
	return ret(cuMemcpy2DUnaligned_v2_ptds(&m));
}

RT_API cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
				     size_t height, enum cudaMemcpyKind kind, cudaStream_t stream)
{
	INIT();
	CUDA_MEMCPY2D m;
	if (!desc2d(&m, dst, dpitch, src, spitch, width, height, kind))
		return ret((CUresult)cudaErrorInvalidMemcpyDirection);
	return ret(cuMemcpy2DAsync_v2(&m, stream));
}

RT_API cudaError_t cudaMemcpy2DAsync_ptsz(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
					  size_t height, enum cudaMemcpyKind kind, cudaStream_t stream)
{
	INIT();
	CUDA_MEMCPY2D m;
	if (!desc2d(&m, dst, dpitch, src, spitch, width, height, kind))
		return ret((CUresult)cudaErrorInvalidMemcpyDirection);
	return ret(cuMemcpy2DAsync_v2_ptsz(&m, stream));
}

/* ---- peer and batch ---- */

/* A peer copy names each side's device: the driver call takes their primary contexts. */
RT_API cudaError_t cudaMemcpyPeer(void *dst, int dstDevice, const void *src, int srcDevice, size_t count)
{
	INIT();
	CUcontext dc = NULL, sc = NULL;
	CUresult r = primary_ctx(dstDevice, &dc);
	if (r == CUDA_SUCCESS)
		r = primary_ctx(srcDevice, &sc);
	if (r != CUDA_SUCCESS)
		return ret(r);
	return ret(cuMemcpyPeer(DP(dst), dc, DP(src), sc, count));
}

RT_API cudaError_t cudaMemcpyPeerAsync(void *dst, int dstDevice, const void *src, int srcDevice, size_t count,
				       cudaStream_t stream)
{
	INIT();
	CUcontext dc = NULL, sc = NULL;
	CUresult r = primary_ctx(dstDevice, &dc);
	if (r == CUDA_SUCCESS)
		r = primary_ctx(srcDevice, &sc);
	if (r != CUDA_SUCCESS)
		return ret(r);
	return ret(cuMemcpyPeerAsync(DP(dst), dc, DP(src), sc, count, stream));
}

/* The runtime's own argument check, then the driver (void * and CUdeviceptr arrays
 * have the same layout). */
static int batch_args_ok(struct cudaMemcpyAttributes *attrs, size_t *attrsIdxs, size_t numAttrs)
{
	/* attributes are hints here; only their presence is checked */
	return !numAttrs || (attrs && attrsIdxs);
}

RT_API cudaError_t cudaMemcpyBatchAsync(void **dsts, void **srcs, size_t *sizes, size_t count,
					struct cudaMemcpyAttributes *attrs, size_t *attrsIdxs, size_t numAttrs,
					size_t *failIdx, cudaStream_t stream)
{
	INIT();
	if (!batch_args_ok(attrs, attrsIdxs, numAttrs))
		return ret(CUDA_ERROR_INVALID_VALUE);
	return ret(cuMemcpyBatchAsync((CUdeviceptr *)dsts, (CUdeviceptr *)srcs, sizes, count, attrs, attrsIdxs,
				      numAttrs, failIdx, stream));
}

RT_API cudaError_t cudaMemcpyBatchAsync_ptsz(void **dsts, void **srcs, size_t *sizes, size_t count,
					     struct cudaMemcpyAttributes *attrs, size_t *attrsIdxs, size_t numAttrs,
					     size_t *failIdx, cudaStream_t stream)
{
	INIT();
	if (!batch_args_ok(attrs, attrsIdxs, numAttrs))
		return ret(CUDA_ERROR_INVALID_VALUE);
	return ret(cuMemcpyBatchAsync_ptsz((CUdeviceptr *)dsts, (CUdeviceptr *)srcs, sizes, count, attrs,
					   attrsIdxs, numAttrs, failIdx, stream));
}

/* ---- memory ---- */
RT_API cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags)
{
	INIT();
	return ret(cuMemHostAlloc(pHost, size, flags));
}

/* Like the real runtimes, which never resolve cuMemAllocHost: cuMemHostAlloc, flags 0. */
RT_API cudaError_t cudaMallocHost(void **ptr, size_t size)
{
	INIT();
	return ret(cuMemHostAlloc(ptr, size, cudaHostAllocDefault));
}

RT_API cudaError_t cudaHostRegister(void *ptr, size_t size, unsigned int flags)
{
	INIT();
	return ret(cuMemHostRegister_v2(ptr, size, flags));
}

RT_API cudaError_t cudaHostUnregister(void *ptr)
{
	INIT();
	return ret(cuMemHostUnregister(ptr));
}

RT_API cudaError_t cudaFreeHost(void *ptr)
{
	INIT();
	return ret(cuMemFreeHost(ptr));
}

RT_API cudaError_t cudaMalloc(void **devPtr, size_t size)
{
	INIT();
	if (!devPtr)
		return ret(CUDA_ERROR_INVALID_VALUE);
	CUdeviceptr d = 0;
	CUresult r = cuMemAlloc_v2(&d, size);
	*devPtr = (void *)(uintptr_t)d;
	return ret(r);
}

RT_API cudaError_t cudaFree(void *devPtr)
{
	INIT();
	return ret(cuMemFree_v2(DP(devPtr)));
}

/* Out pointers of the allocators below: the driver writes a CUdeviceptr. */
static cudaError_t out_ptr(void **p, CUdeviceptr d, CUresult r)
{
	*p = (void *)(uintptr_t)d;
	return ret(r);
}

RT_API cudaError_t cudaMallocManaged(void **devPtr, size_t size, unsigned int flags)
{
	INIT();
	if (!devPtr)
		return ret(CUDA_ERROR_INVALID_VALUE);
	CUdeviceptr d = 0;
	return out_ptr(devPtr, d, cuMemAllocManaged(&d, size, flags));
}

RT_API cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t stream)
{
	INIT();
	if (!devPtr)
		return ret(CUDA_ERROR_INVALID_VALUE);
	CUdeviceptr d = 0;
	CUresult r = cuMemAllocAsync(&d, size, stream);
	return out_ptr(devPtr, d, r);
}

RT_API cudaError_t cudaMallocAsync_ptsz(void **devPtr, size_t size, cudaStream_t stream)
{
	INIT();
	if (!devPtr)
		return ret(CUDA_ERROR_INVALID_VALUE);
	CUdeviceptr d = 0;
	CUresult r = cuMemAllocAsync_ptsz(&d, size, stream);
	return out_ptr(devPtr, d, r);
}

RT_API cudaError_t cudaMallocFromPoolAsync(void **ptr, size_t size, cudaMemPool_t memPool, cudaStream_t stream)
{
	INIT();
	if (!ptr)
		return ret(CUDA_ERROR_INVALID_VALUE);
	CUdeviceptr d = 0;
	CUresult r = cuMemAllocFromPoolAsync(&d, size, memPool, stream);
	return out_ptr(ptr, d, r);
}

RT_API cudaError_t cudaMallocFromPoolAsync_ptsz(void **ptr, size_t size, cudaMemPool_t memPool, cudaStream_t stream)
{
	INIT();
	if (!ptr)
		return ret(CUDA_ERROR_INVALID_VALUE);
	CUdeviceptr d = 0;
	CUresult r = cuMemAllocFromPoolAsync_ptsz(&d, size, memPool, stream);
	return out_ptr(ptr, d, r);
}

RT_API cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t stream)
{
	INIT();
	return ret(cuMemFreeAsync(DP(devPtr), stream));
}

RT_API cudaError_t cudaFreeAsync_ptsz(void *devPtr, cudaStream_t stream)
{
	INIT();
	return ret(cuMemFreeAsync_ptsz(DP(devPtr), stream));
}

RT_API cudaError_t cudaMemPoolCreate(cudaMemPool_t *memPool, const cudaMemPoolProps *poolProps)
{
	INIT();
	return ret(cuMemPoolCreate(memPool, poolProps));
}

RT_API cudaError_t cudaMemPoolDestroy(cudaMemPool_t memPool)
{
	INIT();
	return ret(cuMemPoolDestroy(memPool));
}

RT_API cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *memPool, int device)
{
	INIT();
	return ret(cuDeviceGetDefaultMemPool(memPool, device));
}

/* ---- streams and events ---- */
RT_API cudaError_t cudaStreamCreate(cudaStream_t *pStream)
{
	INIT();
	return ret(cuStreamCreate(pStream, 0));
}

RT_API cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags)
{
	INIT();
	return ret(cuStreamCreate(pStream, flags));
}

RT_API cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
	INIT();
	return ret(cuStreamDestroy_v2(stream));
}

RT_API cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
	INIT();
	return ret(cuStreamSynchronize(stream));
}

RT_API cudaError_t cudaStreamSynchronize_ptsz(cudaStream_t stream)
{
	INIT();
	return ret(cuStreamSynchronize_ptsz(stream));
}

RT_API cudaError_t cudaEventCreate(cudaEvent_t *event)
{
	INIT();
	return ret(cuEventCreate(event, 0));
}

RT_API cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags)
{
	INIT();
	return ret(cuEventCreate(event, flags));
}

RT_API cudaError_t cudaEventDestroy(cudaEvent_t event)
{
	INIT();
	return ret(cuEventDestroy_v2(event));
}

RT_API cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
	INIT();
	return ret(cuEventRecord(event, stream));
}

RT_API cudaError_t cudaEventRecord_ptsz(cudaEvent_t event, cudaStream_t stream)
{
	INIT();
	return ret(cuEventRecord_ptsz(event, stream));
}

RT_API cudaError_t cudaEventRecordWithFlags(cudaEvent_t event, cudaStream_t stream, unsigned int flags)
{
	INIT();
	return ret(cuEventRecordWithFlags(event, stream, flags));
}

RT_API cudaError_t cudaEventRecordWithFlags_ptsz(cudaEvent_t event, cudaStream_t stream, unsigned int flags)
{
	INIT();
	return ret(cuEventRecordWithFlags_ptsz(event, stream, flags));
}

RT_API cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
	INIT();
	return ret(cuEventSynchronize(event));
}

RT_API cudaError_t cudaEventQuery(cudaEvent_t event)
{
	INIT();
	CUresult r = cuEventQuery(event);
	return r == CUDA_ERROR_NOT_READY ? cudaErrorNotReady : ret(r); /* an answer, not a sticky error */
}

RT_API cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream)
{
	INIT();
	return ret(cuMemsetD8Async((CUdeviceptr)(uintptr_t)devPtr, (unsigned char)value, count, stream));
}

RT_API cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags)
{
	INIT();
	return ret(cuStreamWaitEvent(stream, event, flags));
}

RT_API cudaError_t cudaStreamWaitEvent_ptsz(cudaStream_t stream, cudaEvent_t event, unsigned int flags)
{
	INIT();
	return ret(cuStreamWaitEvent_ptsz(stream, event, flags));
}

/* ---- stream capture and graphs ---- */
RT_API cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode)
{
	INIT();
	return ret(cuStreamBeginCapture_v2(stream, (CUstreamCaptureMode)mode));
}

RT_API cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t stream, enum cudaStreamCaptureMode mode)
{
	INIT();
	return ret(cuStreamBeginCapture_v2_ptsz(stream, (CUstreamCaptureMode)mode));
}

RT_API cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *pGraph)
{
	INIT();
	return ret(cuStreamEndCapture(stream, pGraph));
}

RT_API cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t stream, cudaGraph_t *pGraph)
{
	INIT();
	return ret(cuStreamEndCapture_ptsz(stream, pGraph));
}

RT_API cudaError_t cudaStreamIsCapturing(cudaStream_t stream, enum cudaStreamCaptureStatus *pCaptureStatus)
{
	INIT();
	return ret(cuStreamIsCapturing(stream, (CUstreamCaptureStatus *)pCaptureStatus));
}

RT_API cudaError_t cudaStreamIsCapturing_ptsz(cudaStream_t stream, enum cudaStreamCaptureStatus *pCaptureStatus)
{
	INIT();
	return ret(cuStreamIsCapturing_ptsz(stream, (CUstreamCaptureStatus *)pCaptureStatus));
}

RT_API cudaError_t cudaGraphInstantiate(cudaGraphExec_t *pGraphExec, cudaGraph_t graph, unsigned long long flags)
{
	INIT();
	return ret(cuGraphInstantiateWithFlags(pGraphExec, graph, flags));
}

RT_API cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t *pGraphExec, cudaGraph_t graph, unsigned long long flags)
{
	INIT();
	return ret(cuGraphInstantiateWithFlags(pGraphExec, graph, flags));
}

RT_API cudaError_t cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream)
{
	INIT();
	return ret(cuGraphLaunch(graphExec, stream));
}

RT_API cudaError_t cudaGraphLaunch_ptsz(cudaGraphExec_t graphExec, cudaStream_t stream)
{
	INIT();
	return ret(cuGraphLaunch_ptsz(graphExec, stream));
}

RT_API cudaError_t cudaGraphExecDestroy(cudaGraphExec_t graphExec)
{
	INIT();
	return ret(cuGraphExecDestroy(graphExec));
}

RT_API cudaError_t cudaGraphDestroy(cudaGraph_t graph)
{
	INIT();
	return ret(cuGraphDestroy(graph));
}

RT_API cudaError_t cudaDeviceSynchronize(void)
{
	INIT();
	return ret(cuCtxSynchronize());
}

RT_API cudaError_t cudaGetLastError(void)
{
	cudaError_t e = last_error;
	last_error = cudaSuccess;
	return e;
}

/* CUDA 12: the device's primary context is initialised and current at once. */
RT_API cudaError_t cudaSetDevice(int device)
{
	INIT_PROCESS();
	return ret(set_device(device));
}

RT_API cudaError_t cudaGetDevice(int *device)
{
	INIT();
	if (!device)
		return ret(CUDA_ERROR_INVALID_VALUE);
	CUdevice d = 0;
	CUresult r = cuCtxGetDevice(&d);
	if (r == CUDA_SUCCESS)
		*device = d;
	return ret(r);
}

RT_API cudaError_t cudaDeviceGetPCIBusId(char *pciBusId, int len, int device)
{
	INIT_PROCESS();
	return ret(cuDeviceGetPCIBusId(pciBusId, len, device));
}

/* Initialises like every call; with no usable driver the count is 0 and the
 * initialisation error is returned (cudaErrorNoDevice with LW_REF_NO_DEVICE=1). */
RT_API cudaError_t cudaGetDeviceCount(int *count)
{
	pthread_once(&once, do_init);
	if (init_error != cudaSuccess) {
		if (count)
			*count = 0;
		return ret((CUresult)init_error);
	}
	if (!count)
		return ret(CUDA_ERROR_INVALID_VALUE);
	return ret(cuDeviceGetCount(count));
}

/* ---- kernels: what nvcc-generated code calls (refcuda.h) ---- */

/*
 * Registrations come from constructors, before main and before any CUDA call: they
 * only record what was registered, as the real runtime does; the driver is reached
 * at a kernel's first launch in a context: the fatbin is loaded there once
 * (cuModuleLoadData) and the function asked once (cuModuleGetFunction with the
 * device name __cudaRegisterFunction gave), as the 11.8 and 12.4 runtimes do.
 */
#define RT_MAX_FUNCS 1024
struct rt_fatbin {
	const __fatBinC_Wrapper_t *w;
	CUmodule mod[RT_MAX_DEVICES]; /* per device: its primary context's module */
};
struct rt_func {
	const void *host; /* the host stub */
	const char *name; /* the device function's (mangled) name */
	struct rt_fatbin *fb;
	CUfunction f[RT_MAX_DEVICES];
};
static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static struct rt_func funcs[RT_MAX_FUNCS];
static int nfuncs;

RT_API void **__cudaRegisterFatBinary(void *fatCubin)
{
	const __fatBinC_Wrapper_t *w = fatCubin;
	if (!w || w->magic != FATBINC_MAGIC || w->version != 1)
		return NULL;
	struct rt_fatbin *fb = calloc(1, sizeof *fb);
	if (fb)
		fb->w = w;
	return (void **)fb;
}

RT_API void __cudaRegisterFatBinaryEnd(void **fatCubinHandle)
{
	(void)fatCubinHandle;
}

/* At exit: the functions of the fatbin are forgotten; its modules go with the
 * process (the driver may be gone already). */
RT_API void __cudaUnregisterFatBinary(void **fatCubinHandle)
{
	struct rt_fatbin *fb = (struct rt_fatbin *)fatCubinHandle;
	if (!fb)
		return;
	pthread_mutex_lock(&reg_mu);
	for (int i = 0; i < nfuncs; i++)
		if (funcs[i].fb == fb)
			funcs[i] = (struct rt_func){0};
	pthread_mutex_unlock(&reg_mu);
}

RT_API void __cudaRegisterFunction(void **fatCubinHandle, const char *hostFun, char *deviceFun, const char *deviceName,
				   int thread_limit, uint3 *tid, uint3 *bid, dim3 *bDim, dim3 *gDim, int *wSize)
{
	(void)deviceFun, (void)thread_limit, (void)tid, (void)bid, (void)bDim, (void)gDim, (void)wSize;
	if (!fatCubinHandle || !hostFun || !deviceName)
		return;
	pthread_mutex_lock(&reg_mu);
	if (nfuncs < RT_MAX_FUNCS)
		funcs[nfuncs++] = (struct rt_func){.host = hostFun, .name = deviceName, .fb = (struct rt_fatbin *)fatCubinHandle};
	pthread_mutex_unlock(&reg_mu);
}

/* `k<<<g, b, s, st>>>(...)`: the call site pushes the configuration, k's host stub pops it. */
static __thread struct {
	dim3 grid, block;
	size_t shared;
	void *stream;
	int set;
} call_config;

RT_API unsigned int __cudaPushCallConfiguration(dim3 gridDim, dim3 blockDim, size_t sharedMem, void *stream)
{
	call_config.grid = gridDim;
	call_config.block = blockDim;
	call_config.shared = sharedMem;
	call_config.stream = stream;
	call_config.set = 1;
	return 0;
}

RT_API cudaError_t __cudaPopCallConfiguration(dim3 *gridDim, dim3 *blockDim, size_t *sharedMem, void *stream)
{
	if (!call_config.set)
		return ret(CUDA_ERROR_INVALID_VALUE);
	*gridDim = call_config.grid;
	*blockDim = call_config.block;
	*sharedMem = call_config.shared;
	*(void **)stream = call_config.stream;
	call_config.set = 0;
	return cudaSuccess;
}

/* The CUfunction of host stub func in the current context: loaded and asked at its
 * first launch there. */
static cudaError_t function_of(const void *func, CUfunction *f)
{
	CUdevice dev = 0;
	CUresult r = cuCtxGetDevice(&dev);
	if (r != CUDA_SUCCESS)
		return ret(r);
	if (dev < 0 || dev >= RT_MAX_DEVICES)
		return ret(CUDA_ERROR_INVALID_DEVICE);
	pthread_mutex_lock(&reg_mu);
	struct rt_func *rf = NULL;
	for (int i = 0; i < nfuncs && !rf; i++)
		if (funcs[i].host == func)
			rf = &funcs[i];
	if (!rf) {
		pthread_mutex_unlock(&reg_mu);
		return ret((CUresult)cudaErrorInvalidDeviceFunction);
	}
	if (!rf->fb->mod[dev])
		r = cuModuleLoadData(&rf->fb->mod[dev], rf->fb->w->data);
	if (r == CUDA_SUCCESS && !rf->f[dev])
		r = cuModuleGetFunction(&rf->f[dev], rf->fb->mod[dev], rf->name);
	*f = rf->f[dev];
	pthread_mutex_unlock(&reg_mu);
	return ret(r);
}

static cudaError_t launch(const void *func, dim3 g, dim3 b, void **args, size_t shared, cudaStream_t s, int pt)
{
	INIT();
	CUfunction f = NULL;
	cudaError_t e = function_of(func, &f);
	if (e != cudaSuccess)
		return e;
	if (pt)
		return ret(cuLaunchKernel_ptsz(f, g.x, g.y, g.z, b.x, b.y, b.z, (unsigned int)shared, s, args, NULL));
	return ret(cuLaunchKernel(f, g.x, g.y, g.z, b.x, b.y, b.z, (unsigned int)shared, s, args, NULL));
}

RT_API cudaError_t cudaLaunchKernel(const void *func, dim3 gridDim, dim3 blockDim, void **args, size_t sharedMem,
				    cudaStream_t stream)
{
	return launch(func, gridDim, blockDim, args, sharedMem, stream, 0);
}

RT_API cudaError_t cudaLaunchKernel_ptsz(const void *func, dim3 gridDim, dim3 blockDim, void **args, size_t sharedMem,
					 cudaStream_t stream)
{
	return launch(func, gridDim, blockDim, args, sharedMem, stream, 1);
}

static cudaError_t launch_ex(const cudaLaunchConfig_t *config, const void *func, void **args, int pt)
{
	INIT();
	if (!config)
		return ret(CUDA_ERROR_INVALID_VALUE);
	CUfunction f = NULL;
	cudaError_t e = function_of(func, &f);
	if (e != cudaSuccess)
		return e;
	CUlaunchConfig c = {
		.gridDimX = config->gridDim.x, .gridDimY = config->gridDim.y, .gridDimZ = config->gridDim.z,
		.blockDimX = config->blockDim.x, .blockDimY = config->blockDim.y, .blockDimZ = config->blockDim.z,
		.sharedMemBytes = (unsigned int)config->dynamicSmemBytes, .hStream = config->stream,
	};
	return ret(pt ? cuLaunchKernelEx_ptsz(&c, f, args, NULL) : cuLaunchKernelEx(&c, f, args, NULL));
}

RT_API cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t *config, const void *func, void **args)
{
	return launch_ex(config, func, args, 0);
}

RT_API cudaError_t cudaLaunchKernelExC_ptsz(const cudaLaunchConfig_t *config, const void *func, void **args)
{
	return launch_ex(config, func, args, 1);
}
