/*
 * Exported copy entry points of the reference driver. Each one is its own
 * function (no aliases): the per-thread forms (_ptds, _ptsz) differ only in how
 * stream 0 is read, but a uprobe on one must not fire for the other.
 */
#include "internal.h"

#define A REFCUDA_ASYNC
#define PT REFCUDA_PER_THREAD
#define DPTR(p) ((void *)(uintptr_t)(p))

/* Direction of a copy from its pointers, as unified addressing resolves it. */
static int resolve_dir(const void *dst, const void *src, size_t n)
{
	int dd = rc_is_device(dst, n ? n : 1), sd = rc_is_device(src, n ? n : 1);
	return dd ? (sd ? RC_D2D : RC_H2D) : (sd ? RC_D2H : RC_H2H);
}

/* extent is the span of the region: (height-1)*pitch + width */
static CUresult submit(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
		       int dir, CUstream stream, unsigned int flags)
{
	rc_init();
	if (!width || !height)
		return rc_submit_copy(&(struct rc_xfer){.width = 0, .height = 0}, stream, flags);
	if (!dst || !src || dpitch < width || spitch < width)
		return CUDA_ERROR_INVALID_VALUE;
	size_t dext = (height - 1) * dpitch + width, sext = (height - 1) * spitch + width;
	if (dir < 0)
		dir = resolve_dir(dst, src, dext > sext ? dext : sext);
	int dst_dev = dir == RC_H2D || dir == RC_D2D, src_dev = dir == RC_D2H || dir == RC_D2D;
	if ((dst_dev && !rc_is_device(dst, dext)) || (src_dev && !rc_is_device(src, sext)))
		return CUDA_ERROR_INVALID_VALUE;
	struct rc_xfer x = {
		.dst = dst, .src = src, .dpitch = dpitch, .spitch = spitch, .width = width, .height = height,
		.dir = dir,
		.staged = (dir == RC_H2D && !rc_is_pinned(src, sext)) || (dir == RC_D2H && !rc_is_pinned(dst, dext)),
	};
	return rc_submit_copy(&x, stream, flags);
}

static CUresult copy1d(void *dst, const void *src, size_t n, int dir, CUstream stream, unsigned int flags)
{
	return submit(dst, n, src, n, n, 1, dir, stream, flags);
}

/* ---- host to device ---- */
RC_API CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
	return copy1d(DPTR(dstDevice), srcHost, ByteCount, RC_H2D, 0, 0);
}
RC_API CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
	return copy1d(DPTR(dstDevice), srcHost, ByteCount, RC_H2D, 0, PT);
}
RC_API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount, CUstream hStream)
{
	return copy1d(DPTR(dstDevice), srcHost, ByteCount, RC_H2D, hStream, A);
}
RC_API CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount,
					  CUstream hStream)
{
	return copy1d(DPTR(dstDevice), srcHost, ByteCount, RC_H2D, hStream, A | PT);
}

/* ---- device to host ---- */
RC_API CUresult cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
	return copy1d(dstHost, DPTR(srcDevice), ByteCount, RC_D2H, 0, 0);
}
RC_API CUresult cuMemcpyDtoH_v2_ptds(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
	return copy1d(dstHost, DPTR(srcDevice), ByteCount, RC_D2H, 0, PT);
}
RC_API CUresult cuMemcpyDtoHAsync_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream)
{
	return copy1d(dstHost, DPTR(srcDevice), ByteCount, RC_D2H, hStream, A);
}
RC_API CUresult cuMemcpyDtoHAsync_v2_ptsz(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream)
{
	return copy1d(dstHost, DPTR(srcDevice), ByteCount, RC_D2H, hStream, A | PT);
}

/* ---- device to device ---- */
RC_API CUresult cuMemcpyDtoD_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount)
{
	return copy1d(DPTR(dstDevice), DPTR(srcDevice), ByteCount, RC_D2D, 0, 0);
}
RC_API CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount)
{
	return copy1d(DPTR(dstDevice), DPTR(srcDevice), ByteCount, RC_D2D, 0, PT);
}
RC_API CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount,
				     CUstream hStream)
{
	return copy1d(DPTR(dstDevice), DPTR(srcDevice), ByteCount, RC_D2D, hStream, A);
}
RC_API CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount,
					  CUstream hStream)
{
	return copy1d(DPTR(dstDevice), DPTR(srcDevice), ByteCount, RC_D2D, hStream, A | PT);
}

/* ---- unified: direction from the pointers ---- */
RC_API CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount)
{
	return copy1d(DPTR(dst), DPTR(src), ByteCount, -1, 0, 0);
}
RC_API CUresult cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount)
{
	return copy1d(DPTR(dst), DPTR(src), ByteCount, -1, 0, PT);
}
RC_API CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream)
{
	return copy1d(DPTR(dst), DPTR(src), ByteCount, -1, hStream, A);
}
RC_API CUresult cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream)
{
	return copy1d(DPTR(dst), DPTR(src), ByteCount, -1, hStream, A | PT);
}

/* ---- reference-only helpers for the runtime's 2D, peer and batch copies ---- */
RC_API CUresult refcudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
				size_t height, int kind, CUstream stream, unsigned int flags)
{
	if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault)
		return CUDA_ERROR_INVALID_VALUE;
	return submit(dst, dpitch, src, spitch, width, height, kind == cudaMemcpyDefault ? -1 : kind, stream, flags);
}

RC_API CUresult refcudaMemcpyPeer(void *dst, int dstDevice, const void *src, int srcDevice, size_t count,
				  CUstream stream, unsigned int flags)
{
	if (dstDevice != 0 || srcDevice != 0)
		return CUDA_ERROR_INVALID_DEVICE;
	return copy1d(dst, src, count, RC_D2D, stream, flags);
}

RC_API CUresult refcudaMemcpyBatch(void **dsts, void **srcs, const size_t *sizes, size_t count, size_t *failIdx,
				   CUstream stream, unsigned int flags)
{
	if (failIdx)
		*failIdx = SIZE_MAX;
	if (!count || !dsts || !srcs || !sizes)
		return CUDA_ERROR_INVALID_VALUE;
	for (size_t i = 0; i < count; i++) {
		CUresult rc = copy1d(dsts[i], srcs[i], sizes[i], -1, stream, flags);
		if (rc != CUDA_SUCCESS) {
			if (failIdx)
				*failIdx = i;
			return rc;
		}
	}
	return CUDA_SUCCESS;
}
