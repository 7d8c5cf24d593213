/*
 * Exported copy entry points of the reference driver. Each one is its own
 * function (no aliases): the per-thread forms (_ptds, _ptsz) differ only in how
 * stream 0 is read, but a uprobe on one must not fire for the other.
 *
 * Every copy is checked before it is submitted: a device side outside this
 * process's device arena, a NULL host side or a pitch below the row width fails
 * with CUDA_ERROR_INVALID_VALUE and moves nothing (no lane time). A failed call
 * still uses up its engine-time record(s) (see refcudaSetCopyRecords).
 */
#include "internal.h"

#define A REFCUDA_ASYNC
#define PT REFCUDA_PER_THREAD
#define DPTR(p) ((void *)(uintptr_t)(p))

/* Managed memory (vmm.c) is accepted on either side of any copy; its pages stay on
 * the host here (no kernel ever touches them), so a copy moves them as host memory
 * the driver can reach directly: never staged. */
static int is_managed(const void *p, size_t n)
{
	return rc_vmm_kind(p, n) == RC_MEM_MANAGED;
}

/* Direction of a copy from its pointers, as unified addressing resolves it. */
static int resolve_dir(const void *dst, const void *src, size_t n)
{
	int dd = rc_is_device(dst, n ? n : 1), sd = rc_is_device(src, n ? n : 1);
	return dd ? (sd ? RC_D2D : RC_H2D) : (sd ? RC_D2H : RC_H2H);
}

/* Span of a pitched region: (height-1)*pitch + width; SIZE_MAX when it overflows. */
static size_t extent(size_t pitch, size_t width, size_t height)
{
	size_t e;
	if (__builtin_mul_overflow(height - 1, pitch, &e) || __builtin_add_overflow(e, width, &e))
		return SIZE_MAX;
	return e;
}

/* Checks a copy (dir < 0: resolve it from the pointers) and describes it in *x.
 * An empty copy is valid and moves nothing. */
static CUresult prepare(struct rc_xfer *x, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
			size_t height, int dir)
{
	*x = (struct rc_xfer){.width = 0, .height = 0};
	if (!width || !height)
		return CUDA_SUCCESS;
	if (!dst || !src || dpitch < width || spitch < width)
		return CUDA_ERROR_INVALID_VALUE;
	size_t dext = extent(dpitch, width, height), sext = extent(spitch, width, height);
	if (dext == SIZE_MAX || sext == SIZE_MAX)
		return CUDA_ERROR_INVALID_VALUE;
	if (dir < 0)
		dir = resolve_dir(dst, src, dext > sext ? dext : sext);
	int dst_dev = dir == RC_H2D || dir == RC_D2D, src_dev = dir == RC_D2H || dir == RC_D2D;
	if ((dst_dev && !rc_is_device(dst, dext) && !is_managed(dst, dext)) ||
	    (src_dev && !rc_is_device(src, sext) && !is_managed(src, sext)))
		return CUDA_ERROR_INVALID_VALUE;
	*x = (struct rc_xfer){
		.dst = dst, .src = src, .dpitch = dpitch, .spitch = spitch, .width = width, .height = height,
		.dir = dir,
		.staged = (dir == RC_H2D && !rc_is_pinned(src, sext) && !is_managed(src, sext)) ||
			  (dir == RC_D2H && !rc_is_pinned(dst, dext) && !is_managed(dst, dext)),
	};
	return CUDA_SUCCESS;
}

/* One copy call (1D, 2D or peer): the gate, the checks, then the stream. */
static CUresult submit(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
		       int dir, CUstream stream, unsigned int flags)
{
	struct rc_xfer x;
	CUresult rc = rc_enter();
	if (rc == CUDA_SUCCESS)
		rc = prepare(&x, dst, dpitch, src, spitch, width, height, dir);
	if (rc != CUDA_SUCCESS) {
		rc_copy_records_skip(1);
		return rc;
	}
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

/* ---- 2D: the copy is described by a CUDA_MEMCPY2D ---- */

/* One side of a 2D copy: its base address, and whether it is device memory
 * (1), host memory (0) or unified (-1: resolved from the address). */
static CUresult side2d(CUmemorytype type, const void *host, CUdeviceptr dev, const char **base, int *is_dev)
{
	switch (type) {
	case CU_MEMORYTYPE_HOST:
		*base = host;
		*is_dev = 0;
		break;
	case CU_MEMORYTYPE_DEVICE:
		*base = DPTR(dev);
		*is_dev = 1;
		break;
	case CU_MEMORYTYPE_UNIFIED:
		*base = DPTR(dev);
		*is_dev = -1;
		break;
	default: /* CU_MEMORYTYPE_ARRAY: no CUDA arrays in the reference path */
		return CUDA_ERROR_INVALID_VALUE;
	}
	return *base ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

static CUresult copy2d(const CUDA_MEMCPY2D *p, CUstream stream, unsigned int flags)
{
	const char *src, *dst;
	int sd, dd;
	CUresult rc = rc_enter();
	if (rc == CUDA_SUCCESS && !p)
		rc = CUDA_ERROR_INVALID_VALUE;
	if (rc == CUDA_SUCCESS)
		rc = side2d(p->srcMemoryType, p->srcHost, p->srcDevice, &src, &sd);
	if (rc == CUDA_SUCCESS)
		rc = side2d(p->dstMemoryType, p->dstHost, p->dstDevice, &dst, &dd);
	if (rc != CUDA_SUCCESS) {
		rc_copy_records_skip(1);
		return rc;
	}
	src += p->srcY * p->srcPitch + p->srcXInBytes;
	dst += p->dstY * p->dstPitch + p->dstXInBytes;
	size_t w = p->WidthInBytes, h = p->Height;
	int dir = -1; /* both unified: from the pointers, like cuMemcpy */
	if (sd >= 0 || dd >= 0) {
		/* one unified side is resolved on its own, from its address and extent */
		if (sd < 0)
			sd = w && h && rc_is_device(src, extent(p->srcPitch, w, h));
		if (dd < 0)
			dd = w && h && rc_is_device(dst, extent(p->dstPitch, w, h));
		dir = dd ? (sd ? RC_D2D : RC_H2D) : (sd ? RC_D2H : RC_H2H);
	}
	struct rc_xfer x;
	rc = prepare(&x, (void *)dst, p->dstPitch, src, p->srcPitch, w, h, dir);
	if (rc != CUDA_SUCCESS) {
		rc_copy_records_skip(1);
		return rc;
	}
	return rc_submit_copy(&x, stream, flags);
}

/* cuMemcpy2D and cuMemcpy2DUnaligned differ only in pitch alignment rules, which
 * host memory does not have: both run the same copy. */
RC_API CUresult cuMemcpy2D_v2(const CUDA_MEMCPY2D *pCopy)
{
	return copy2d(pCopy, 0, 0);
}
RC_API CUresult cuMemcpy2D_v2_ptds(const CUDA_MEMCPY2D *pCopy)
{
	return copy2d(pCopy, 0, PT);
}
RC_API CUresult cuMemcpy2DUnaligned_v2(const CUDA_MEMCPY2D *pCopy)
{
	return copy2d(pCopy, 0, 0);
}
RC_API CUresult cuMemcpy2DUnaligned_v2_ptds(const CUDA_MEMCPY2D *pCopy)
{
	return copy2d(pCopy, 0, PT);
}
RC_API CUresult cuMemcpy2DAsync_v2(const CUDA_MEMCPY2D *pCopy, CUstream hStream)
{
	return copy2d(pCopy, hStream, A);
}
RC_API CUresult cuMemcpy2DAsync_v2_ptsz(const CUDA_MEMCPY2D *pCopy, CUstream hStream)
{
	return copy2d(pCopy, hStream, A | PT);
}

/* ---- peer: one device per process, so a D2D copy; the contexts are not read ---- */
RC_API CUresult cuMemcpyPeer(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice,
			     CUcontext srcContext, size_t ByteCount)
{
	(void)dstContext;
	(void)srcContext;
	return copy1d(DPTR(dstDevice), DPTR(srcDevice), ByteCount, RC_D2D, 0, 0);
}
RC_API CUresult cuMemcpyPeerAsync(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice,
				  CUcontext srcContext, size_t ByteCount, CUstream hStream)
{
	(void)dstContext;
	(void)srcContext;
	return copy1d(DPTR(dstDevice), DPTR(srcDevice), ByteCount, RC_D2D, hStream, A);
}
RC_API CUresult cuMemcpyPeerAsync_ptsz(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice,
				       CUcontext srcContext, size_t ByteCount, CUstream hStream)
{
	(void)dstContext;
	(void)srcContext;
	return copy1d(DPTR(dstDevice), DPTR(srcDevice), ByteCount, RC_D2D, hStream, A | PT);
}

/* ---- batch: every entry checked before any is submitted ---- */
static CUresult batch(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count, void *attrs,
		      size_t *attrsIdxs, size_t numAttrs, size_t *failIdx, CUstream stream, unsigned int flags)
{
	struct rc_xfer x;
	CUresult rc = rc_enter();
	if (failIdx)
		*failIdx = SIZE_MAX;
	if (rc == CUDA_SUCCESS && (!count || !dsts || !srcs || !sizes || (numAttrs && (!attrs || !attrsIdxs))))
		rc = CUDA_ERROR_INVALID_VALUE;
	if (rc == CUDA_SUCCESS && !rc_stream_resolve(stream, (flags & PT) != 0))
		rc = CUDA_ERROR_INVALID_HANDLE;
	for (size_t i = 0; rc == CUDA_SUCCESS && i < count; i++) {
		rc = prepare(&x, DPTR(dsts[i]), sizes[i], DPTR(srcs[i]), sizes[i], sizes[i], 1, -1);
		if (rc != CUDA_SUCCESS && failIdx)
			*failIdx = i;
	}
	if (rc != CUDA_SUCCESS) {
		rc_copy_records_skip(count);
		return rc;
	}
	for (size_t i = 0; i < count; i++) {
		prepare(&x, DPTR(dsts[i]), sizes[i], DPTR(srcs[i]), sizes[i], sizes[i], 1, -1);
		rc_submit_copy(&x, stream, flags);
	}
	return CUDA_SUCCESS;
}

RC_API CUresult cuMemcpyBatchAsync(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count, void *attrs,
				   size_t *attrsIdxs, size_t numAttrs, size_t *failIdx, CUstream hStream)
{
	return batch(dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs, failIdx, hStream, A);
}
RC_API CUresult cuMemcpyBatchAsync_ptsz(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count,
					void *attrs, size_t *attrsIdxs, size_t numAttrs, size_t *failIdx,
					CUstream hStream)
{
	return batch(dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs, failIdx, hStream, A | PT);
}
