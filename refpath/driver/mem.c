/*
 * Memory of the reference driver:
 *  - "device memory" is one mmap'ed arena per process; device pointers are
 *    addresses inside it, so a copy's direction can be told from its pointers
 *    (cudaMemcpyDefault) exactly as unified addressing does on a real GPU;
 *  - the driver's own table of pinned host ranges (registered or allocated by
 *    it) decides whether a copy's host side is pinned or pageable.
 */
#include "internal.h"
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define ARENA_ALIGN 256u
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

struct blk {
	size_t off, len;
};

static struct {
	pthread_mutex_t mu;
	char *base;
	size_t size, bump;
	struct blk *free; /* sorted by offset, coalesced */
	size_t nfree, capfree;
	struct blk *live;
	size_t nlive, caplive;
} arena = {.mu = PTHREAD_MUTEX_INITIALIZER};

struct hrange {
	uintptr_t base;
	size_t len;
	int owned; /* allocated by cuMemHostAlloc/cuMemAllocHost: munmap on free */
};

static struct {
	pthread_rwlock_t rw;
	struct hrange *v;
	size_t n, cap;
} hreg = {.rw = PTHREAD_RWLOCK_INITIALIZER};

void rc_mem_init(size_t device_bytes)
{
	if (device_bytes < (1u << 20))
		device_bytes = 1u << 20;
	/* NORESERVE: a big arena costs nothing until it is touched. */
	void *p = mmap(NULL, device_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (p == MAP_FAILED)
		return; /* every allocation will fail with OUT_OF_MEMORY */
	arena.base = p;
	arena.size = device_bytes;
}

static int in_arena(const void *p, size_t n)
{
	uintptr_t a = (uintptr_t)p, b = (uintptr_t)arena.base;
	return arena.base && a >= b && n <= arena.size && a - b <= arena.size - n;
}

/* Device memory: the arena, or a VMM mapping of a device allocation (vmm.c). */
int rc_is_device(const void *p, size_t n)
{
	return in_arena(p, n) || rc_vmm_kind(p, n) == RC_MEM_DEVICE;
}

/* Page-locked host memory: registered or allocated by cuMemHostAlloc, a host pool's
 * allocation, or a VMM mapping of a host allocation (vmm.c). */
int rc_is_pinned(const void *p, size_t n)
{
	if (rc_vmm_kind(p, n) == RC_MEM_PINNED)
		return 1;
	uintptr_t a = (uintptr_t)p;
	int hit = 0;
	pthread_rwlock_rdlock(&hreg.rw);
	for (size_t i = 0; i < hreg.n; i++) {
		const struct hrange *r = &hreg.v[i];
		if (a >= r->base && n <= r->len && a - r->base <= r->len - n) {
			hit = 1;
			break;
		}
	}
	pthread_rwlock_unlock(&hreg.rw);
	return hit;
}

static int grow(void **v, size_t *cap, size_t need, size_t elem)
{
	if (need <= *cap)
		return 0;
	size_t nc = *cap ? *cap * 2 : 16;
	while (nc < need)
		nc *= 2;
	void *nv = realloc(*v, nc * elem);
	if (!nv)
		return -1;
	*v = nv;
	*cap = nc;
	return 0;
}

/* ---- host ranges ---- */

static CUresult hreg_add(void *p, size_t len, int owned)
{
	uintptr_t a = (uintptr_t)p;
	CUresult rc = CUDA_SUCCESS;
	pthread_rwlock_wrlock(&hreg.rw);
	for (size_t i = 0; i < hreg.n; i++) {
		const struct hrange *r = &hreg.v[i];
		if (a < r->base + r->len && r->base < a + len) {
			rc = CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
			goto out;
		}
	}
	if (grow((void **)&hreg.v, &hreg.cap, hreg.n + 1, sizeof *hreg.v)) {
		rc = CUDA_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	hreg.v[hreg.n++] = (struct hrange){a, len, owned};
out:
	pthread_rwlock_unlock(&hreg.rw);
	return rc;
}

/* Removes the range that starts at p and whose ownership matches; returns its length or 0. */
static size_t hreg_del(void *p, int owned)
{
	size_t len = 0;
	pthread_rwlock_wrlock(&hreg.rw);
	for (size_t i = 0; i < hreg.n; i++) {
		if (hreg.v[i].base == (uintptr_t)p && hreg.v[i].owned == owned) {
			len = hreg.v[i].len;
			hreg.v[i] = hreg.v[--hreg.n];
			break;
		}
	}
	pthread_rwlock_unlock(&hreg.rw);
	return len;
}

RC_API CUresult cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int Flags)
{
	RC_GATE();
	(void)Flags;
	rc_init();
	if (!p || !bytesize)
		return CUDA_ERROR_INVALID_VALUE;
	return hreg_add(p, bytesize, 0);
}

RC_API CUresult cuMemHostUnregister(void *p)
{
	RC_GATE();
	rc_init();
	if (!p)
		return CUDA_ERROR_INVALID_VALUE;
	return hreg_del(p, 0) ? CUDA_SUCCESS : CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
}

CUresult rc_host_alloc(void **pp, size_t bytesize)
{
	rc_init();
	if (!pp || !bytesize)
		return CUDA_ERROR_INVALID_VALUE;
	/* Page-locked memory is resident: populate it up front like the real driver. */
	void *p = mmap(NULL, bytesize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	if (p == MAP_FAILED)
		return CUDA_ERROR_OUT_OF_MEMORY;
	CUresult rc = hreg_add(p, bytesize, 1);
	if (rc != CUDA_SUCCESS) {
		munmap(p, bytesize);
		return rc;
	}
	*pp = p;
	return CUDA_SUCCESS;
}

RC_API CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags)
{
	RC_GATE();
	(void)Flags;
	return rc_host_alloc(pp, bytesize);
}

RC_API CUresult cuMemAllocHost_v2(void **pp, size_t bytesize)
{
	RC_GATE();
	return rc_host_alloc(pp, bytesize);
}

CUresult rc_host_free(void *p)
{
	size_t len = hreg_del(p, 1);
	if (!len)
		return CUDA_ERROR_INVALID_VALUE;
	munmap(p, len);
	return CUDA_SUCCESS;
}

RC_API CUresult cuMemFreeHost(void *p)
{
	RC_GATE();
	rc_init();
	if (!p)
		return CUDA_SUCCESS;
	return rc_host_free(p);
}

/* ---- device arena: bump allocation plus a coalescing first-fit free list ---- */

/* On the device of the context current on the calling thread (device.c). */
RC_API CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
	RC_GATE();
	int dev = rc_current_device();
	if (dev < 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	CUresult rc = rc_dev_alloc(dptr, bytesize);
	if (rc == CUDA_SUCCESS)
		rc_note_alloc((void *)(uintptr_t)*dptr, bytesize, dev);
	return rc;
}

CUresult rc_dev_alloc(CUdeviceptr *dptr, size_t bytesize)
{
	rc_init();
	if (!dptr || !bytesize)
		return CUDA_ERROR_INVALID_VALUE;
	if (!arena.base)
		return CUDA_ERROR_OUT_OF_MEMORY;
	size_t len = (bytesize + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);
	if (len < bytesize)
		return CUDA_ERROR_OUT_OF_MEMORY;
	CUresult rc = CUDA_SUCCESS;
	size_t off = SIZE_MAX;
	pthread_mutex_lock(&arena.mu);
	if (grow((void **)&arena.live, &arena.caplive, arena.nlive + 1, sizeof *arena.live)) {
		rc = CUDA_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	for (size_t i = 0; i < arena.nfree; i++) {
		struct blk *b = &arena.free[i];
		if (b->len >= len) {
			off = b->off;
			b->off += len;
			b->len -= len;
			if (!b->len) {
				memmove(b, b + 1, (arena.nfree - i - 1) * sizeof *b);
				arena.nfree--;
			}
			break;
		}
	}
	if (off == SIZE_MAX) {
		if (arena.size - arena.bump < len) {
			rc = CUDA_ERROR_OUT_OF_MEMORY;
			goto out;
		}
		off = arena.bump;
		arena.bump += len;
	}
	arena.live[arena.nlive++] = (struct blk){off, len};
	*dptr = (CUdeviceptr)(uintptr_t)(arena.base + off);
out:
	pthread_mutex_unlock(&arena.mu);
	if (rc == CUDA_SUCCESS) {
		/* Back the allocation now, like real device memory: first-touch page faults
		 * inside the copy engine would otherwise dominate the modelled link time. */
		uintptr_t lo = (uintptr_t)(arena.base + off) & ~(uintptr_t)4095;
		uintptr_t hi = ((uintptr_t)(arena.base + off + len) + 4095) & ~(uintptr_t)4095;
		madvise((void *)lo, hi - lo, MADV_POPULATE_WRITE); /* best effort */
	}
	return rc;
}

/* Device memory, and the managed and stream-ordered allocations vmm.c keeps. */
RC_API CUresult cuMemFree_v2(CUdeviceptr dptr)
{
	RC_GATE();
	rc_init();
	if (!dptr)
		return CUDA_SUCCESS;
	if (!in_arena((void *)(uintptr_t)dptr, 1))
		return rc_vmm_free(dptr);
	return rc_dev_free(dptr);
}

CUresult rc_dev_free(CUdeviceptr dptr)
{
	if (!in_arena((void *)(uintptr_t)dptr, 1))
		return CUDA_ERROR_INVALID_VALUE;
	size_t off = (size_t)((char *)(uintptr_t)dptr - arena.base), len = 0;
	CUresult rc = CUDA_SUCCESS;
	pthread_mutex_lock(&arena.mu);
	for (size_t i = 0; i < arena.nlive; i++) {
		if (arena.live[i].off == off) {
			len = arena.live[i].len;
			arena.live[i] = arena.live[--arena.nlive];
			break;
		}
	}
	if (!len) {
		rc = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	rc_note_free((void *)(uintptr_t)dptr);
	/* Give the pages back so a long run does not keep touched memory. */
	uintptr_t lo = ((uintptr_t)arena.base + off + 4095) & ~(uintptr_t)4095;
	uintptr_t hi = ((uintptr_t)arena.base + off + len) & ~(uintptr_t)4095;
	if (hi > lo)
		madvise((void *)lo, hi - lo, MADV_DONTNEED);
	if (off + len == arena.bump) {
		arena.bump = off;
		/* the last free block may now touch the bump pointer */
		while (arena.nfree && arena.free[arena.nfree - 1].off + arena.free[arena.nfree - 1].len == arena.bump) {
			arena.bump = arena.free[arena.nfree - 1].off;
			arena.nfree--;
		}
		goto out;
	}
	if (grow((void **)&arena.free, &arena.capfree, arena.nfree + 1, sizeof *arena.free)) {
		rc = CUDA_ERROR_OUT_OF_MEMORY; /* leak the block rather than corrupt the list */
		goto out;
	}
	size_t i = 0;
	while (i < arena.nfree && arena.free[i].off < off)
		i++;
	memmove(&arena.free[i + 1], &arena.free[i], (arena.nfree - i) * sizeof *arena.free);
	arena.free[i] = (struct blk){off, len};
	arena.nfree++;
	if (i + 1 < arena.nfree && arena.free[i].off + arena.free[i].len == arena.free[i + 1].off) {
		arena.free[i].len += arena.free[i + 1].len;
		memmove(&arena.free[i + 1], &arena.free[i + 2], (arena.nfree - i - 2) * sizeof *arena.free);
		arena.nfree--;
	}
	if (i > 0 && arena.free[i - 1].off + arena.free[i - 1].len == arena.free[i].off) {
		arena.free[i - 1].len += arena.free[i].len;
		memmove(&arena.free[i], &arena.free[i + 1], (arena.nfree - i - 1) * sizeof *arena.free);
		arena.nfree--;
	}
out:
	pthread_mutex_unlock(&arena.mu);
	return rc;
}
