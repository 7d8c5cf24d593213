/*
 * Reference CUDA runtime (libcudart.so.12). Every call is implemented by calling
 * the exported driver function through the PLT, as the real runtime does, so a
 * uprobe on the driver symbol fires too (the agent must fold the pair into one
 * transfer). Built twice from this file: with and without CET (endbr64) prologues.
 */
#include "refcuda.h"
#include <pthread.h>
#include <stdint.h>

#define RT_API __attribute__((noinline, visibility("default")))
#define DP(p) ((CUdeviceptr)(uintptr_t)(p))

static pthread_once_t once = PTHREAD_ONCE_INIT;
static __thread cudaError_t last_error;

static void do_init(void)
{
	cuInit(0);
}

/* The driver and runtime codes we use share their numeric values. */
static cudaError_t ret(CUresult r)
{
	cudaError_t e = (cudaError_t)r;
	if (e != cudaSuccess)
		last_error = e;
	return e;
}

#define INIT() pthread_once(&once, do_init)

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
RT_API cudaError_t cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
				size_t height, enum cudaMemcpyKind kind)
{
	INIT();
	return ret(refcudaMemcpy2D(dst, dpitch, src, spitch, width, height, kind, 0, 0));
}

RT_API cudaError_t cudaMemcpy2D_ptds(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
				     size_t height, enum cudaMemcpyKind kind)
{
	INIT();
	return ret(refcudaMemcpy2D(dst, dpitch, src, spitch, width, height, kind, 0, REFCUDA_PER_THREAD));
}

RT_API cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
				     size_t height, enum cudaMemcpyKind kind, cudaStream_t stream)
{
	INIT();
	return ret(refcudaMemcpy2D(dst, dpitch, src, spitch, width, height, kind, stream, REFCUDA_ASYNC));
}

RT_API cudaError_t cudaMemcpy2DAsync_ptsz(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
					  size_t height, enum cudaMemcpyKind kind, cudaStream_t stream)
{
	INIT();
	return ret(refcudaMemcpy2D(dst, dpitch, src, spitch, width, height, kind, stream,
				   REFCUDA_ASYNC | REFCUDA_PER_THREAD));
}

/* ---- peer and batch ---- */
RT_API cudaError_t cudaMemcpyPeer(void *dst, int dstDevice, const void *src, int srcDevice, size_t count)
{
	INIT();
	return ret(refcudaMemcpyPeer(dst, dstDevice, src, srcDevice, count, 0, 0));
}

RT_API cudaError_t cudaMemcpyPeerAsync(void *dst, int dstDevice, const void *src, int srcDevice, size_t count,
				       cudaStream_t stream)
{
	INIT();
	return ret(refcudaMemcpyPeer(dst, dstDevice, src, srcDevice, count, stream, REFCUDA_ASYNC));
}

static cudaError_t batch(void **dsts, void **srcs, size_t *sizes, size_t count, struct cudaMemcpyAttributes *attrs,
			 size_t *attrsIdxs, size_t numAttrs, size_t *failIdx, cudaStream_t stream, unsigned flags)
{
	INIT();
	/* attributes are hints here; only their presence is checked */
	if (numAttrs && (!attrs || !attrsIdxs))
		return ret(CUDA_ERROR_INVALID_VALUE);
	return ret(refcudaMemcpyBatch(dsts, srcs, sizes, count, failIdx, stream, flags));
}

RT_API cudaError_t cudaMemcpyBatchAsync(void **dsts, void **srcs, size_t *sizes, size_t count,
					struct cudaMemcpyAttributes *attrs, size_t *attrsIdxs, size_t numAttrs,
					size_t *failIdx, cudaStream_t stream)
{
	return batch(dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs, failIdx, stream, REFCUDA_ASYNC);
}

RT_API cudaError_t cudaMemcpyBatchAsync_ptsz(void **dsts, void **srcs, size_t *sizes, size_t count,
					     struct cudaMemcpyAttributes *attrs, size_t *attrsIdxs, size_t numAttrs,
					     size_t *failIdx, cudaStream_t stream)
{
	return batch(dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs, failIdx, stream,
		     REFCUDA_ASYNC | REFCUDA_PER_THREAD);
}

/* ---- memory ---- */
RT_API cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags)
{
	INIT();
	return ret(cuMemHostAlloc(pHost, size, flags));
}

RT_API cudaError_t cudaMallocHost(void **ptr, size_t size)
{
	INIT();
	return ret(cuMemAllocHost_v2(ptr, size));
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

RT_API cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
	INIT();
	return ret(cuEventSynchronize(event));
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

RT_API cudaError_t cudaSetDevice(int device)
{
	INIT();
	return device == 0 ? cudaSuccess : ret((CUresult)cudaErrorInvalidDevice);
}

RT_API cudaError_t cudaGetDeviceCount(int *count)
{
	INIT();
	if (!count)
		return ret(CUDA_ERROR_INVALID_VALUE);
	*count = 1;
	return cudaSuccess;
}
