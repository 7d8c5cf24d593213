/*
 * vmm-pool-managed (docs/design.md, "Late attach"; issue 11): copies from and to the
 * memory of the allocators beyond cudaMalloc and cudaHostAlloc, each of which an
 * observer must place or it takes the memory for pageable:
 *
 *  - virtual memory management: one reservation, a device allocation and a host-NUMA
 *    allocation (cuMemCreate) mapped into it, their handles released while mapped;
 *  - stream-ordered allocations: cudaMallocAsync (the device's pool), a host pool
 *    (cudaMemPoolCreate on a host NUMA node) and the device's default pool, whose
 *    handle comes from cudaDeviceGetDefaultMemPool (no probe sees that call);
 *  - managed memory (cudaMallocManaged).
 *
 * Copies use explicit kinds and cudaMemcpyDefault, through the runtime and the driver
 * API, so each kind is seen both as a stated side and placed by its address. A Default
 * copy with a managed side has no direction anyone can state (truth.h). Every call that
 * allocates, maps or frees is in the truth, then the copied bytes are verified. The VMM
 * device range is also exported as a dma-buf fd (cuMemGetHandleForAddressRange): the
 * end line's dmabuf_fd is the fd the call wrote.
 */
#include "calls.h"
#include "kvpath.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define KiB 1024ull
#define MiB (1024ull * 1024ull)

static struct truth_rec *mem_rec(const char *api, const char *op, size_t n)
{
	struct truth_rec *r = truth_new(api, op);
	r->size = n;
	return r;
}

/* A VMM allocation of n bytes on the device (0) or host NUMA node 0. */
static CUmemGenericAllocationHandle vmm_create(size_t n, int host)
{
	CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
				    .location = {host ? CU_MEM_LOCATION_TYPE_HOST_NUMA : CU_MEM_LOCATION_TYPE_DEVICE, 0}};
	CUmemGenericAllocationHandle h = 0;
	struct truth_rec *r = mem_rec("cuMemCreate", "mem_create", n);
	r->has_flags = 1;
	TCALL(r, cuMemCreate(&h, n, &prop, 0));
	return h;
}

static void vmm_map(CUdeviceptr va, size_t n, CUmemGenericAllocationHandle h)
{
	struct truth_rec *r = mem_rec("cuMemMap", "mem_map", n);
	r->ptr = va;
	r->has_flags = 1;
	TCALL(r, cuMemMap(va, n, 0, h, 0));
}

static void vmm_release(CUmemGenericAllocationHandle h)
{
	struct truth_rec *r = truth_new("cuMemRelease", "mem_release");
	TCALL(r, cuMemRelease(h));
}

static void *async_alloc(const char *api, size_t n, cudaMemPool_t pool, cudaStream_t s, enum mem_class c)
{
	void *p = NULL;
	struct truth_rec *r = mem_rec(api, "pool_alloc", n);
	r->stream = (uintptr_t)s;
	r->has_stream = 1;
	if (!strcmp(api, "cudaMallocAsync"))
		TCALL(r, cudaMallocAsync(&p, n, s));
	else if (!strcmp(api, "cudaMallocAsync_ptsz"))
		TCALL(r, cudaMallocAsync_ptsz(&p, n, s));
	else
		TCALL(r, cudaMallocFromPoolAsync(&p, n, pool, s));
	r->ptr = (uintptr_t)p;
	truth_note_mem(p, n, c, 0);
	return p;
}

static void free_async(void *p, cudaStream_t s)
{
	struct truth_rec *r = truth_new("cudaFreeAsync", "device_free");
	r->ptr = (uintptr_t)p;
	r->stream = (uintptr_t)s;
	r->has_stream = 1;
	TCALL(r, cudaFreeAsync(p, s));
	truth_forget_mem(p);
}

/* One copy through the runtime on stream s (NULL: cudaMemcpy, synchronous). */
static void copy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, cudaStream_t s)
{
	struct truth_rec *r = truth_copy(s ? "cudaMemcpyAsync" : "cudaMemcpy", "copy", dst, src, n, kind, s, -1);
	TCALL(r, s ? cudaMemcpyAsync(dst, src, n, kind, s) : cudaMemcpy(dst, src, n, kind));
}

int sc_vmm_pool_managed(const struct opts *o, struct result *res)
{
	const size_t N = 256 * KiB; /* each copy; every buffer holds several */
	int bad = 0;

	/* the other side of most copies: pinned host and cudaMalloc memory */
	void *pinned = NULL;
	{
		struct truth_rec *r = mem_rec("cudaMallocHost", "host_alloc", 8 * MiB);
		TCALL(r, cudaMallocHost(&pinned, 8 * MiB));
		r->ptr = (uintptr_t)pinned;
		truth_note_mem(pinned, 8 * MiB, MEM_PINNED, 0);
	}
	char *pin = pinned, *dev = dev_alloc(8 * MiB);
	cudaStream_t s;
	CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

	/* VMM: reserve 3 granules, map a device and a host allocation, release both handles */
	CUmemAllocationProp gp = {.type = CU_MEM_ALLOCATION_TYPE_PINNED, .location = {CU_MEM_LOCATION_TYPE_DEVICE, 0}};
	size_t G = 0;
	CHECK(cuMemGetAllocationGranularity(&G, &gp, 0));
	CUdeviceptr va = 0;
	{
		struct truth_rec *r = mem_rec("cuMemAddressReserve", "address_reserve", 3 * G);
		TCALL(r, cuMemAddressReserve(&va, 3 * G, 0, 0, 0));
		r->ptr = va;
	}
	CUmemGenericAllocationHandle hd = vmm_create(G, 0), hh = vmm_create(G, 1);
	vmm_map(va, G, hd);
	vmm_map(va + G, G, hh);
	CUmemAccessDesc rw = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
	CHECK(cuMemSetAccess(va, 2 * G, &rw, 1));
	vmm_release(hd); /* the mappings keep the memory */
	vmm_release(hh);
	char *vdev = (char *)(uintptr_t)va, *vhost = (char *)(uintptr_t)(va + G);
	truth_note_mem(vdev, G, MEM_DEVICE, 0);
	truth_note_mem(vhost, G, MEM_PINNED, 0);
	int fd = -1;
	{
		struct truth_rec *r = mem_rec("cuMemGetHandleForAddressRange", "dmabuf_export", G);
		r->ptr = va;
		r->flags = CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD;
		r->has_flags = 1;
		TCALL(r, cuMemGetHandleForAddressRange(&fd, va, G, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0));
	}
	snprintf(res->extra, sizeof res->extra, "\"dmabuf_fd\":%d", fd);

	/* pools: the device's (cudaMallocAsync, and its default pool by handle), a host pool's */
	cudaMemPool_t hostpool = NULL, defpool = NULL;
	{
		cudaMemPoolProps props = {.allocType = CU_MEM_ALLOCATION_TYPE_PINNED,
					  .location = {cudaMemLocationTypeHostNuma, 0}};
		struct truth_rec *r = truth_new("cudaMemPoolCreate", "pool_create");
		TCALL(r, cudaMemPoolCreate(&hostpool, &props));
	}
	CHECK(cudaDeviceGetDefaultMemPool(&defpool, 0));
	char *adev = async_alloc("cudaMallocAsync", 4 * MiB, NULL, s, MEM_DEVICE);
	char *adev2 = async_alloc("cudaMallocAsync_ptsz", 4 * MiB, NULL, NULL, MEM_DEVICE);
	char *ahost = async_alloc("cudaMallocFromPoolAsync", 4 * MiB, hostpool, s, MEM_PINNED);
	char *adef = async_alloc("cudaMallocFromPoolAsync", 4 * MiB, defpool, s, MEM_DEVICE);

	/* managed memory */
	char *man = NULL;
	{
		struct truth_rec *r = mem_rec("cudaMallocManaged", "managed_alloc", 4 * MiB);
		r->has_flags = 1;
		TCALL(r, cudaMallocManaged((void **)&man, 4 * MiB, cudaMemAttachGlobal));
		r->ptr = (uintptr_t)man;
		truth_note_mem(man, 4 * MiB, MEM_MANAGED, 0);
	}
	/* every byte is seeded by the host (device memory here is host-addressable) */
	for (size_t i = 0; i < 8 * MiB; i++)
		pin[i] = (char)(i * 7), dev[i] = (char)(i * 13);
	memset(vhost, 0x31, G);
	memset(vdev, 0x32, G);
	memset(ahost, 0x33, 4 * MiB);
	memset(adef, 0x34, 4 * MiB);
	memset(man, 0x35, 4 * MiB);
	hold_point(o);

	CHECK(cudaStreamSynchronize(s)); /* the allocations are usable in stream order; not in the truth */
	/* VMM device memory: the shape, a Default copy from it was taken for H2H */
	copy(pin, vdev, N, cudaMemcpyDefault, s);
	copy(vdev + N, pin + N, N, cudaMemcpyHostToDevice, s);
	{ /* the driver API, directly */
		struct truth_rec *r = truth_copy("cuMemcpyDtoH_v2", "copy", pin + 2 * N, vdev + 2 * N, N,
						 cudaMemcpyDeviceToHost, NULL, -1);
		TCALL(r, cuMemcpyDtoH_v2(pin + 2 * N, (CUdeviceptr)(uintptr_t)(vdev + 2 * N), N));
	}
	/* VMM host memory: pinned, never pageable */
	copy(dev, vhost, N, cudaMemcpyDefault, s);
	copy(vdev + 3 * N, vhost + N, N, cudaMemcpyHostToDevice, s);
	/* stream-ordered allocations */
	copy(pin + 3 * N, adev, N, cudaMemcpyDeviceToHost, s);
	copy(adev + N, ahost, N, cudaMemcpyDefault, s);
	copy(adef, dev + N, N, cudaMemcpyDefault, s);
	copy(dev + 2 * N, adef + N, N, cudaMemcpyDeviceToDevice, s);
	copy(adev2, ahost + N, N, cudaMemcpyHostToDevice, s);
	/* managed memory: stated, then placed by its address */
	copy(dev + 3 * N, man, N, cudaMemcpyHostToDevice, s);
	copy(man + N, dev + 4 * N, N, cudaMemcpyDefault, s);
	copy(man + 2 * N, pin + 4 * N, N, cudaMemcpyDefault, NULL);
	stream_sync(s, NULL);

	bad |= memcmp(pin, vdev, N) || memcmp(vdev + N, pin + N, N) || memcmp(pin + 2 * N, vdev + 2 * N, N);
	bad |= memcmp(dev, vhost, N) || memcmp(vdev + 3 * N, vhost + N, N);
	bad |= memcmp(pin + 3 * N, adev, N) || memcmp(adev + N, ahost, N) || memcmp(adef, dev + N, N) ||
	       memcmp(dev + 2 * N, adef + N, N) || memcmp(adev2, ahost + N, N);
	bad |= memcmp(dev + 3 * N, man, N) || memcmp(man + N, dev + 4 * N, N) || memcmp(man + 2 * N, pin + 4 * N, N);
	if (bad)
		fprintf(stderr, "kvpath: vmm-pool-managed: data mismatch\n");

	/* frees: stream-ordered, managed, VMM, the pool */
	free_async(adev, s);
	free_async(adev2, s);
	free_async(ahost, s);
	free_async(adef, s);
	stream_sync(s, NULL);
	dev_free(man);
	{
		struct truth_rec *r = mem_rec("cuMemUnmap", "mem_unmap", 2 * G);
		r->ptr = va;
		TCALL(r, cuMemUnmap(va, 2 * G));
		truth_forget_mem(vdev);
		truth_forget_mem(vhost);
	}
	{
		struct truth_rec *r = mem_rec("cuMemAddressFree", "address_free", 3 * G);
		r->ptr = va;
		TCALL(r, cuMemAddressFree(va, 3 * G));
	}
	{
		struct truth_rec *r = truth_new("cudaMemPoolDestroy", "pool_destroy");
		TCALL(r, cudaMemPoolDestroy(hostpool));
	}
	close(fd);
	CHECK(cudaStreamDestroy(s));
	dev_free(dev);
	{
		struct truth_rec *r = truth_new("cudaFreeHost", "host_free");
		r->ptr = (uintptr_t)pinned;
		TCALL(r, cudaFreeHost(pinned));
		truth_forget_mem(pinned);
	}
	return bad;
}
