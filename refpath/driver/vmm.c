/*
 * The reference driver's other allocators, on host memory like the rest:
 *
 *  - managed memory (cuMemAllocManaged): host pages that every copy accepts on either
 *    side; no kernel runs here, so the pages stay on the host and a copy moves them as
 *    host memory (copy.c);
 *  - memory pools and stream-ordered allocations: the device's default pool is device
 *    memory (the arena), a pool the process creates lives on the device (the arena) or on
 *    a host NUMA node (page-locked host memory, as cuMemHostAlloc's); cuMemAllocAsync
 *    takes from the default pool (the current pool must be local to the device, cuda.h),
 *    cuMemAllocFromPoolAsync from the pool named, and cuMemFreeAsync queues the free on
 *    the stream, as the real driver does; cuMemFree frees either at once;
 *  - virtual memory management: cuMemAddressReserve reserves address space (PROT_NONE),
 *    cuMemCreate makes a physical allocation (a memfd) on the device or the host, cuMemMap
 *    maps it there without access (MAP_FIXED|MAP_SHARED, so one allocation can be mapped
 *    at several addresses), cuMemSetAccess makes it read-write, cuMemUnmap gives the range
 *    back to its reservation, cuMemRelease drops the handle (mappings keep the memory) and
 *    cuMemAddressFree returns the reservation. A mapping of a device allocation is device
 *    memory to every copy (mem.c), one of a host allocation page-locked host memory;
 *  - dma-buf export (cuMemGetHandleForAddressRange): an fd for a device range; the
 *    reference RDMA provider asks refcudaDmabufRange what it exports.
 *
 * One device (0); a location names it, or a host NUMA node (any id: one node here).
 */
#include "internal.h"
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define POOL_MAGIC 0x504f4f4cu /* "POOL" */
#define GRANULE (2u << 20)     /* cuMemGetAllocationGranularity: 2 MiB, as on NVIDIA GPUs */
#define MAX_ENTRIES 4096       /* of each table below */

struct CUmemPoolHandle_st {
	uint32_t magic;
	CUmemLocationType type; /* DEVICE or a host type */
};

/* The default pool of device 0: device memory. */
static struct CUmemPoolHandle_st default_pool = {POOL_MAGIC, CU_MEM_LOCATION_TYPE_DEVICE};

/* A physical allocation of cuMemCreate: the handle points at it. */
struct phys {
	int fd;
	size_t size;
	enum rc_mem kind; /* RC_MEM_DEVICE or RC_MEM_PINNED */
	int refs;         /* the handle, plus one per mapping */
};

/* What a range of the address space is to this driver. */
enum ent_type { ENT_MANAGED, ENT_POOL_HOST, ENT_POOL_DEVICE, ENT_RESERVED, ENT_MAPPED };
struct ent {
	uintptr_t base;
	size_t len;
	int type;
	struct phys *phys; /* ENT_MAPPED */
};

static struct {
	pthread_rwlock_t rw;
	struct ent v[MAX_ENTRIES];
	size_t n;
} T = {.rw = PTHREAD_RWLOCK_INITIALIZER};

static enum rc_mem kind_of(const struct ent *e)
{
	switch (e->type) {
	case ENT_MANAGED:
		return RC_MEM_MANAGED;
	case ENT_POOL_HOST:
		return RC_MEM_PINNED;
	case ENT_MAPPED:
		return e->phys->kind;
	}
	return RC_MEM_NONE; /* pool device memory is arena memory; a reservation holds nothing */
}

/* The entry holding [a, a+n) whole, of one of the types in mask (bits of enum ent_type). */
static struct ent *find(uintptr_t a, size_t n, unsigned mask)
{
	for (size_t i = 0; i < T.n; i++) {
		struct ent *e = &T.v[i];
		if ((mask >> e->type & 1) && a >= e->base && n <= e->len && a - e->base <= e->len - n)
			return e;
	}
	return NULL;
}

enum rc_mem rc_vmm_kind(const void *p, size_t n)
{
	if (!T.n) /* no lock on the copy path of a process that never used these */
		return RC_MEM_NONE;
	pthread_rwlock_rdlock(&T.rw);
	const struct ent *e = find((uintptr_t)p, n ? n : 1, 1u << ENT_MANAGED | 1u << ENT_POOL_HOST | 1u << ENT_MAPPED);
	enum rc_mem k = e ? kind_of(e) : RC_MEM_NONE;
	pthread_rwlock_unlock(&T.rw);
	return k;
}

/* Adds an entry under the write lock; CUDA_ERROR_OUT_OF_MEMORY when the table is full. */
static CUresult add(uintptr_t base, size_t len, int type, struct phys *phys)
{
	if (T.n == MAX_ENTRIES)
		return CUDA_ERROR_OUT_OF_MEMORY;
	T.v[T.n++] = (struct ent){base, len, type, phys};
	return CUDA_SUCCESS;
}

static void del(struct ent *e)
{
	*e = T.v[--T.n];
}

static void phys_unref(struct phys *p)
{
	if (--p->refs == 0) {
		close(p->fd);
		free(p);
	}
}

/* ---------------- managed memory ---------------- */

RC_API CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
	RC_GATE();
	rc_init();
	if (!dptr || !bytesize || flags != CU_MEM_ATTACH_GLOBAL)
		return CUDA_ERROR_INVALID_VALUE;
	void *p = mmap(NULL, bytesize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return CUDA_ERROR_OUT_OF_MEMORY;
	pthread_rwlock_wrlock(&T.rw);
	CUresult rc = add((uintptr_t)p, bytesize, ENT_MANAGED, NULL);
	pthread_rwlock_unlock(&T.rw);
	if (rc != CUDA_SUCCESS) {
		munmap(p, bytesize);
		return rc;
	}
	*dptr = (CUdeviceptr)(uintptr_t)p;
	return CUDA_SUCCESS;
}

/* Frees the managed or stream-ordered allocation that starts at dptr. */
static CUresult free_alloc(CUdeviceptr dptr)
{
	pthread_rwlock_wrlock(&T.rw);
	struct ent *e = find((uintptr_t)dptr, 1, 1u << ENT_MANAGED | 1u << ENT_POOL_HOST | 1u << ENT_POOL_DEVICE);
	if (!e || e->base != (uintptr_t)dptr) {
		pthread_rwlock_unlock(&T.rw);
		return CUDA_ERROR_INVALID_VALUE;
	}
	struct ent g = *e;
	del(e);
	pthread_rwlock_unlock(&T.rw);
	switch (g.type) {
	case ENT_MANAGED:
		munmap((void *)g.base, g.len);
		return CUDA_SUCCESS;
	case ENT_POOL_HOST:
		return rc_host_free((void *)g.base);
	}
	return rc_dev_free(dptr);
}

CUresult rc_vmm_free(CUdeviceptr dptr)
{
	return free_alloc(dptr);
}

/* ---------------- pools and stream-ordered allocations ---------------- */

static int host_location(CUmemLocationType t)
{
	return t == CU_MEM_LOCATION_TYPE_HOST || t == CU_MEM_LOCATION_TYPE_HOST_NUMA ||
	       t == CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT;
}

RC_API CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props)
{
	RC_GATE();
	rc_init();
	if (!pool || !props || props->allocType != CU_MEM_ALLOCATION_TYPE_PINNED)
		return CUDA_ERROR_INVALID_VALUE;
	CUmemLocation l = props->location;
	/* Host pools need a host NUMA node (cuda.h: CU_MEM_LOCATION_TYPE_HOST_NUMA). */
	if (!(l.type == CU_MEM_LOCATION_TYPE_DEVICE && l.id == 0) && l.type != CU_MEM_LOCATION_TYPE_HOST_NUMA)
		return CUDA_ERROR_INVALID_VALUE;
	struct CUmemPoolHandle_st *p = calloc(1, sizeof *p);
	if (!p)
		return CUDA_ERROR_OUT_OF_MEMORY;
	*p = (struct CUmemPoolHandle_st){POOL_MAGIC, l.type};
	*pool = p;
	return CUDA_SUCCESS;
}

RC_API CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
	RC_GATE();
	if (!pool || pool->magic != POOL_MAGIC || pool == &default_pool)
		return CUDA_ERROR_INVALID_VALUE;
	/* Allocations still out keep their memory until freed, as on the real driver. */
	pool->magic = 0;
	free(pool);
	return CUDA_SUCCESS;
}

RC_API CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev)
{
	RC_GATE();
	if (!pool_out)
		return CUDA_ERROR_INVALID_VALUE;
	if (dev != 0)
		return CUDA_ERROR_INVALID_DEVICE;
	*pool_out = &default_pool;
	return CUDA_SUCCESS;
}

static CUresult pool_alloc(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream stream, int per_thread)
{
	rc_init();
	if (!dptr || !bytesize || !pool || pool->magic != POOL_MAGIC)
		return CUDA_ERROR_INVALID_VALUE;
	if (!rc_stream_resolve(stream, per_thread))
		return CUDA_ERROR_INVALID_HANDLE;
	/* The allocation is usable in stream order at once: nothing here reuses memory a
	 * queued copy still reads, so it is taken now. */
	CUdeviceptr d = 0;
	CUresult rc;
	int type;
	if (host_location(pool->type)) {
		void *h = NULL;
		rc = rc_host_alloc(&h, bytesize);
		d = (CUdeviceptr)(uintptr_t)h;
		type = ENT_POOL_HOST;
	} else {
		rc = rc_dev_alloc(&d, bytesize);
		type = ENT_POOL_DEVICE;
	}
	if (rc != CUDA_SUCCESS)
		return rc;
	pthread_rwlock_wrlock(&T.rw);
	rc = add((uintptr_t)d, bytesize, type, NULL);
	pthread_rwlock_unlock(&T.rw);
	if (rc != CUDA_SUCCESS) {
		if (type == ENT_POOL_HOST)
			rc_host_free((void *)(uintptr_t)d);
		else
			rc_dev_free(d);
		return rc;
	}
	*dptr = d;
	return CUDA_SUCCESS;
}

RC_API CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
	RC_GATE();
	return pool_alloc(dptr, bytesize, &default_pool, hStream, 0);
}

RC_API CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
	RC_GATE();
	return pool_alloc(dptr, bytesize, &default_pool, hStream, 1);
}

RC_API CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream)
{
	RC_GATE();
	return pool_alloc(dptr, bytesize, pool, hStream, 0);
}

RC_API CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
					     CUstream hStream)
{
	RC_GATE();
	return pool_alloc(dptr, bytesize, pool, hStream, 1);
}

static void free_queued(uintptr_t dptr)
{
	free_alloc((CUdeviceptr)dptr); /* checked when it was queued */
}

static CUresult free_async(CUdeviceptr dptr, CUstream stream, int per_thread)
{
	rc_init();
	pthread_rwlock_rdlock(&T.rw);
	struct ent *e = find((uintptr_t)dptr, 1, 1u << ENT_POOL_HOST | 1u << ENT_POOL_DEVICE);
	int ok = e && e->base == (uintptr_t)dptr;
	pthread_rwlock_unlock(&T.rw);
	if (!ok)
		return CUDA_ERROR_INVALID_VALUE;
	return rc_stream_enqueue_fn(stream, per_thread, free_queued, (uintptr_t)dptr);
}

RC_API CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
	RC_GATE();
	return free_async(dptr, hStream, 0);
}

RC_API CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
	RC_GATE();
	return free_async(dptr, hStream, 1);
}

/* ---------------- virtual memory management ---------------- */

RC_API CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop, int option)
{
	RC_GATE();
	(void)option;
	if (!granularity || !prop)
		return CUDA_ERROR_INVALID_VALUE;
	*granularity = GRANULE;
	return CUDA_SUCCESS;
}

RC_API CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
				    unsigned long long flags)
{
	RC_GATE();
	rc_init();
	(void)addr; /* a hint */
	if (!ptr || !size || size % GRANULE || flags || (alignment & (alignment - 1)))
		return CUDA_ERROR_INVALID_VALUE;
	if (alignment < GRANULE)
		alignment = GRANULE;
	/* Over-reserve, then trim to the alignment. */
	size_t span = size + alignment;
	char *p = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (p == MAP_FAILED)
		return CUDA_ERROR_OUT_OF_MEMORY;
	uintptr_t a = ((uintptr_t)p + alignment - 1) & ~(uintptr_t)(alignment - 1);
	if (a > (uintptr_t)p)
		munmap(p, a - (uintptr_t)p);
	if ((uintptr_t)p + span > a + size)
		munmap((void *)(a + size), (uintptr_t)p + span - (a + size));
	pthread_rwlock_wrlock(&T.rw);
	CUresult rc = add(a, size, ENT_RESERVED, NULL);
	pthread_rwlock_unlock(&T.rw);
	if (rc != CUDA_SUCCESS) {
		munmap((void *)a, size);
		return rc;
	}
	*ptr = a;
	return CUDA_SUCCESS;
}

/* Whether a mapping lies in [base, base+len). */
static int mapped_in(uintptr_t base, size_t len)
{
	for (size_t i = 0; i < T.n; i++)
		if (T.v[i].type == ENT_MAPPED && T.v[i].base < base + len && base < T.v[i].base + T.v[i].len)
			return 1;
	return 0;
}

RC_API CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
	RC_GATE();
	pthread_rwlock_wrlock(&T.rw);
	struct ent *e = find((uintptr_t)ptr, size, 1u << ENT_RESERVED);
	CUresult rc = CUDA_ERROR_INVALID_VALUE;
	/* the whole reservation, with nothing mapped in it any more */
	if (e && e->base == (uintptr_t)ptr && e->len == size && !mapped_in(e->base, e->len)) {
		del(e);
		munmap((void *)(uintptr_t)ptr, size);
		rc = CUDA_SUCCESS;
	}
	pthread_rwlock_unlock(&T.rw);
	return rc;
}

RC_API CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
			    unsigned long long flags)
{
	RC_GATE();
	rc_init();
	if (!handle || !prop || !size || size % GRANULE || flags || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED)
		return CUDA_ERROR_INVALID_VALUE;
	CUmemLocation l = prop->location;
	enum rc_mem kind;
	if (l.type == CU_MEM_LOCATION_TYPE_DEVICE && l.id == 0)
		kind = RC_MEM_DEVICE;
	else if (host_location(l.type))
		kind = RC_MEM_PINNED;
	else
		return l.type == CU_MEM_LOCATION_TYPE_DEVICE ? CUDA_ERROR_INVALID_DEVICE : CUDA_ERROR_INVALID_VALUE;
	struct phys *p = calloc(1, sizeof *p);
	if (!p)
		return CUDA_ERROR_OUT_OF_MEMORY;
	p->fd = memfd_create("refcuda-vmm", MFD_CLOEXEC);
	if (p->fd < 0 || ftruncate(p->fd, (off_t)size) != 0) {
		if (p->fd >= 0)
			close(p->fd);
		free(p);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	p->size = size;
	p->kind = kind;
	p->refs = 1;
	*handle = (CUmemGenericAllocationHandle)(uintptr_t)p;
	return CUDA_SUCCESS;
}

RC_API CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
	RC_GATE();
	if (!handle)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_rwlock_wrlock(&T.rw);
	phys_unref((struct phys *)(uintptr_t)handle);
	pthread_rwlock_unlock(&T.rw);
	return CUDA_SUCCESS;
}

RC_API CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
			 unsigned long long flags)
{
	RC_GATE();
	struct phys *p = (struct phys *)(uintptr_t)handle;
	if (!ptr || !p || !size || flags || size % GRANULE || offset % GRANULE || offset > p->size ||
	    size > p->size - offset)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_rwlock_wrlock(&T.rw);
	CUresult rc = CUDA_ERROR_INVALID_VALUE;
	/* inside one reservation, over nothing mapped */
	if (find((uintptr_t)ptr, size, 1u << ENT_RESERVED) && !mapped_in((uintptr_t)ptr, size)) {
		void *m = mmap((void *)(uintptr_t)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, p->fd, (off_t)offset);
		rc = m == MAP_FAILED ? CUDA_ERROR_OUT_OF_MEMORY : add((uintptr_t)ptr, size, ENT_MAPPED, p);
		if (rc == CUDA_SUCCESS)
			p->refs++;
		else if (m != MAP_FAILED)
			mmap(m, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
	}
	pthread_rwlock_unlock(&T.rw);
	return rc;
}

RC_API CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
	RC_GATE();
	if (!ptr || !size || !desc || count != 1 || desc->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
	    desc->location.id != 0)
		return CUDA_ERROR_INVALID_VALUE;
	int prot = desc->flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? PROT_READ | PROT_WRITE : PROT_NONE;
	pthread_rwlock_rdlock(&T.rw);
	/* every byte of the range mapped: walk it mapping by mapping */
	CUresult rc = CUDA_SUCCESS;
	for (uintptr_t a = (uintptr_t)ptr; a < (uintptr_t)ptr + size && rc == CUDA_SUCCESS;) {
		struct ent *e = find(a, 1, 1u << ENT_MAPPED);
		if (!e)
			rc = CUDA_ERROR_INVALID_VALUE;
		else
			a = e->base + e->len;
	}
	if (rc == CUDA_SUCCESS && mprotect((void *)(uintptr_t)ptr, size, prot) != 0)
		rc = CUDA_ERROR_INVALID_VALUE;
	pthread_rwlock_unlock(&T.rw);
	return rc;
}

RC_API CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
	RC_GATE();
	if (!ptr || !size)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_rwlock_wrlock(&T.rw);
	/* whole mappings only, as the real driver requires */
	CUresult rc = CUDA_SUCCESS;
	for (size_t i = 0; i < T.n; i++) {
		struct ent *e = &T.v[i];
		if (e->type == ENT_MAPPED && e->base < (uintptr_t)ptr + size && (uintptr_t)ptr < e->base + e->len &&
		    (e->base < (uintptr_t)ptr || e->base + e->len > (uintptr_t)ptr + size))
			rc = CUDA_ERROR_INVALID_VALUE;
	}
	if (rc == CUDA_SUCCESS) {
		for (size_t i = 0; i < T.n;) {
			struct ent *e = &T.v[i];
			if (e->type == ENT_MAPPED && e->base >= (uintptr_t)ptr && e->base < (uintptr_t)ptr + size) {
				/* back to reserved address space */
				mmap((void *)e->base, e->len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE,
				     -1, 0);
				phys_unref(e->phys);
				del(e);
				continue;
			}
			i++;
		}
	}
	pthread_rwlock_unlock(&T.rw);
	return rc;
}

/* ---------------- dma-buf export ---------------- */

/* An exported range: the fd handed out and the device memory it stands for. */
static struct {
	pthread_mutex_t mu;
	struct {
		int fd;
		uintptr_t base;
		size_t len;
	} v[64];
	size_t n;
} X = {.mu = PTHREAD_MUTEX_INITIALIZER};

/*
 * A dma-buf fd for device memory [dptr, dptr+size). The reference has no dma-buf
 * exporter in the kernel: the fd is a memfd standing for the range, and the reference
 * RDMA provider learns the range from refcudaDmabufRange, as a real NIC driver learns
 * the pages from the exporter.
 */
RC_API CUresult cuMemGetHandleForAddressRange(void *handle, CUdeviceptr dptr, size_t size, int handleType,
					      unsigned long long flags)
{
	RC_GATE();
	if (!handle || !dptr || !size || flags || handleType != CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD)
		return CUDA_ERROR_INVALID_VALUE;
	if (!rc_is_device((void *)(uintptr_t)dptr, size))
		return CUDA_ERROR_INVALID_VALUE;
	int fd = memfd_create("refcuda-dmabuf", MFD_CLOEXEC);
	if (fd < 0)
		return CUDA_ERROR_OUT_OF_MEMORY;
	pthread_mutex_lock(&X.mu);
	/* A slot under this fd number was closed since (the kernel reused it); a slot
	 * whose fd the process closed is free again. */
	size_t i = 0;
	while (i < X.n && X.v[i].fd != fd)
		i++;
	if (i == X.n)
		for (i = 0; i < X.n && fcntl(X.v[i].fd, F_GETFD) != -1;)
			i++;
	if (i == sizeof X.v / sizeof X.v[0]) {
		pthread_mutex_unlock(&X.mu);
		close(fd);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	X.v[i].fd = fd;
	X.v[i].base = (uintptr_t)dptr;
	X.v[i].len = size;
	if (i == X.n)
		X.n++;
	pthread_mutex_unlock(&X.mu);
	*(int *)handle = fd;
	return CUDA_SUCCESS;
}

/* Reference-only (refcuda.h): the device range dma-buf fd exports, 0 if it is none of ours. */
RC_API int refcudaDmabufRange(int fd, void **base, size_t *len)
{
	int hit = 0;
	pthread_mutex_lock(&X.mu);
	for (size_t i = 0; i < X.n; i++)
		if (X.v[i].fd == fd && fcntl(fd, F_GETFD) != -1) {
			*base = (void *)X.v[i].base;
			*len = X.v[i].len;
			hit = 1;
			break;
		}
	pthread_mutex_unlock(&X.mu);
	return hit;
}
