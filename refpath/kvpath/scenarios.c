/*
 * The scenarios. Each makes its CUDA calls through recorded wrappers, so the truth
 * holds every copy and every memory/ordering call in call order. Stream and event
 * creation/destruction are not part of the truth (no op kind for them).
 *
 * Device memory of the reference path is host-addressable, so scenarios seed and
 * verify device buffers with plain memset/memcmp (not CUDA calls, not in the truth).
 */
#include "calls.h"
#include "kvpath.h"
#include "sglkernel.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define KiB 1024ull
#define MiB (1024ull * 1024ull)

/* ---------------- recorded wrappers ---------------- */

static struct truth_rec *copy_async(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, cudaStream_t s,
				    int layer, const char *phase)
{
	struct truth_rec *r = truth_copy("cudaMemcpyAsync", "copy", dst, src, n, kind, s, layer);
	r->phase = phase;
	TCALL(r, cudaMemcpyAsync(dst, src, n, kind, s));
	return r;
}

static int verify(const void *a, const void *b, size_t n, const char *what)
{
	if (memcmp(a, b, n) != 0) {
		fprintf(stderr, "kvpath: data mismatch after %s\n", what);
		return 1;
	}
	return 0;
}

static cudaStream_t new_stream(void)
{
	cudaStream_t s;
	CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	return s;
}

/* ---------------- HiCache-like layer loads ---------------- */

enum pool_kind { POOL_REGISTERED, POOL_MALLOC };

/*
 * Layer-by-layer load of a KV host pool into device buffers: each layer's copy on
 * the load stream, an event after it, and the compute stream waiting on it (the
 * way HiCache overlaps the load of layer i+1 with the compute of layer i).
 */
static int layer_load(const struct opts *o, enum pool_kind pk, size_t copy_bytes)
{
	size_t lb = o->layer_bytes, total = lb * (size_t)o->layers;
	if (copy_bytes > lb)
		copy_bytes = lb;
	size_t per_layer = lb / copy_bytes;
	char *pool;
	if (pk == POOL_REGISTERED) {
		pool = pool_mmap(total, 0x5a);
		host_register(pool, total, 0);
	} else {
		pool = malloc(total); /* pageable: never registered */
		if (!pool)
			return 1;
		memset(pool, 0x5a, total);
	}
	char *dev = dev_alloc(total);
	cudaStream_t load = new_stream(), compute = new_stream();
	cudaEvent_t *ev = calloc((size_t)o->layers, sizeof *ev);
	for (int i = 0; i < o->layers; i++)
		CHECK(cudaEventCreateWithFlags(&ev[i], cudaEventDisableTiming));
	hold_point(o);

	for (int i = 0; i < o->layers; i++) {
		size_t base = (size_t)i * lb;
		for (size_t k = 0; k < per_layer; k++)
			copy_async(dev + base + k * copy_bytes, pool + base + k * copy_bytes, copy_bytes,
				   cudaMemcpyHostToDevice, load, i, NULL);
		event_record(ev[i], load, i);
		stream_wait_event(compute, ev[i], i);
	}
	stream_sync(compute, NULL);
	stream_sync(load, NULL);
	int bad = verify(dev, pool, total, "layer load");

	for (int i = 0; i < o->layers; i++)
		CHECK(cudaEventDestroy(ev[i]));
	free(ev);
	CHECK(cudaStreamDestroy(load));
	CHECK(cudaStreamDestroy(compute));
	dev_free(dev);
	if (pk == POOL_REGISTERED) {
		host_unregister(pool);
		munmap(pool, total);
	} else {
		free(pool);
	}
	return bad;
}

static int sc_hicache_load(const struct opts *o, struct result *res)
{
	(void)res;
	return layer_load(o, POOL_REGISTERED, o->layer_bytes);
}

static int sc_pageable_load(const struct opts *o, struct result *res)
{
	(void)res;
	return layer_load(o, POOL_MALLOC, o->layer_bytes);
}

static int sc_fragmented_load(const struct opts *o, struct result *res)
{
	(void)res;
	if (o->layer_bytes % 4096) {
		fprintf(stderr, "kvpath: fragmented-load wants --layer-bytes a multiple of 4096\n");
		return 2;
	}
	return layer_load(o, POOL_REGISTERED, 4096);
}

/* ---------------- direction model checks ---------------- */

/* Achieved rate of the copies of one phase/direction(/stream), from engine times. */
static double phase_gbps(const char *phase, const char *dir, uint64_t stream)
{
	uint64_t lo = UINT64_MAX, hi = 0, bytes = 0;
	for (size_t i = 0; i < truth_count(); i++) {
		const struct truth_rec *r = truth_at(i);
		if (!r->phase || strcmp(r->phase, phase) || strcmp(r->op, "copy") || strcmp(r->direction, dir))
			continue;
		if (stream && r->stream != stream)
			continue;
		if (!r->eng || !r->eng->end_ns)
			continue;
		if (r->eng->start_ns < lo)
			lo = r->eng->start_ns;
		if (r->eng->end_ns > hi)
			hi = r->eng->end_ns;
		bytes += r->bytes;
	}
	return hi > lo ? (double)bytes / (double)(hi - lo) : 0; /* bytes per ns = GB/s */
}

static int sc_writeback_duplex(const struct opts *o, struct result *res)
{
	size_t lb = o->layer_bytes, total = lb * (size_t)o->layers;
	char *in = pool_mmap(total, 0x11), *out = pool_mmap(total, 0);
	host_register(in, total, 0);
	host_register(out, total, 0);
	char *din = dev_alloc(total), *dout = dev_alloc(total);
	memset(dout, 0x22, total); /* the KV to write back */
	cudaStream_t load = new_stream(), wb = new_stream();
	hold_point(o);

	for (int i = 0; i < o->layers; i++)
		copy_async(din + i * lb, in + i * lb, lb, cudaMemcpyHostToDevice, load, i, "alone");
	stream_sync(load, "alone");
	for (int i = 0; i < o->layers; i++)
		copy_async(out + i * lb, dout + i * lb, lb, cudaMemcpyDeviceToHost, wb, i, "alone");
	stream_sync(wb, "alone");
	memset(out, 0, total);
	for (int i = 0; i < o->layers; i++) {
		copy_async(din + i * lb, in + i * lb, lb, cudaMemcpyHostToDevice, load, i, "concurrent");
		copy_async(out + i * lb, dout + i * lb, lb, cudaMemcpyDeviceToHost, wb, i, "concurrent");
	}
	stream_sync(load, "concurrent");
	stream_sync(wb, "concurrent");
	int bad = verify(din, in, total, "H2D") | verify(out, dout, total, "D2H");

	double ha = phase_gbps("alone", "H2D", 0), da = phase_gbps("alone", "D2H", 0);
	double hc = phase_gbps("concurrent", "H2D", 0), dc = phase_gbps("concurrent", "D2H", 0);
	fprintf(stderr, "writeback-duplex: H2D alone %.2f GB/s, concurrent %.2f GB/s (x%.2f); "
			"D2H alone %.2f GB/s, concurrent %.2f GB/s (x%.2f)\n",
		ha, hc, hc > 0 ? ha / hc : 0, da, dc, dc > 0 ? da / dc : 0);
	snprintf(res->extra, sizeof res->extra,
		 "\"gbps\":{\"h2d_alone\":%.3f,\"d2h_alone\":%.3f,\"h2d_concurrent\":%.3f,\"d2h_concurrent\":%.3f},"
		 "\"slowdown\":{\"h2d\":%.3f,\"d2h\":%.3f}",
		 ha, da, hc, dc, hc > 0 ? ha / hc : 0, dc > 0 ? da / dc : 0);

	CHECK(cudaStreamDestroy(load));
	CHECK(cudaStreamDestroy(wb));
	dev_free(din);
	dev_free(dout);
	host_unregister(in);
	host_unregister(out);
	munmap(in, total);
	munmap(out, total);
	return bad;
}

static int sc_h2d_overlap(const struct opts *o, struct result *res)
{
	size_t lb = o->layer_bytes, total = lb * (size_t)o->layers;
	char *a = pool_mmap(total, 0x33), *b = pool_mmap(total, 0x44);
	host_register(a, total, 0);
	host_register(b, total, 0);
	char *da = dev_alloc(total), *db = dev_alloc(total);
	cudaStream_t s1 = new_stream(), s2 = new_stream();
	hold_point(o);

	for (int i = 0; i < o->layers; i++)
		copy_async(da + i * lb, a + i * lb, lb, cudaMemcpyHostToDevice, s1, i, "alone");
	stream_sync(s1, "alone");
	submit_as_mover(1); /* the two flows' ends are proven without a scheduler's delay */
	for (int i = 0; i < o->layers; i++) {
		copy_async(da + i * lb, a + i * lb, lb, cudaMemcpyHostToDevice, s1, i, "concurrent");
		copy_async(db + i * lb, b + i * lb, lb, cudaMemcpyHostToDevice, s2, i, "concurrent");
	}
	stream_sync(s1, "concurrent");
	stream_sync(s2, "concurrent");
	submit_as_mover(0);
	int bad = verify(da, a, total, "H2D stream 1") | verify(db, b, total, "H2D stream 2");

	double alone = phase_gbps("alone", "H2D", (uintptr_t)s1);
	double c1 = phase_gbps("concurrent", "H2D", (uintptr_t)s1), c2 = phase_gbps("concurrent", "H2D", (uintptr_t)s2);
	double both = phase_gbps("concurrent", "H2D", 0);
	fprintf(stderr, "h2d-overlap: alone %.2f GB/s; concurrent stream1 %.2f GB/s (x%.2f), stream2 %.2f GB/s (x%.2f), "
			"aggregate %.2f GB/s\n",
		alone, c1, c1 > 0 ? alone / c1 : 0, c2, c2 > 0 ? alone / c2 : 0, both);
	snprintf(res->extra, sizeof res->extra,
		 "\"gbps\":{\"h2d_alone\":%.3f,\"h2d_stream1_concurrent\":%.3f,\"h2d_stream2_concurrent\":%.3f,"
		 "\"h2d_aggregate_concurrent\":%.3f},\"slowdown\":{\"stream1\":%.3f,\"stream2\":%.3f}",
		 alone, c1, c2, both, c1 > 0 ? alone / c1 : 0, c2 > 0 ? alone / c2 : 0);

	CHECK(cudaStreamDestroy(s1));
	CHECK(cudaStreamDestroy(s2));
	dev_free(da);
	dev_free(db);
	host_unregister(a);
	host_unregister(b);
	munmap(a, total);
	munmap(b, total);
	return bad;
}

/* ---------------- cudaMemcpyDefault ---------------- */

static int sc_default_kind(const struct opts *o, struct result *res)
{
	(void)res;
	size_t n = o->layer_bytes, total = 8 * n;
	char *pinned = pool_mmap(total, 0x55);
	host_register(pinned, total, 0);
	char *pageable = malloc(total), *pageable2 = malloc(total);
	if (!pageable || !pageable2)
		return 1;
	memset(pageable, 0x66, total);
	char *d1 = dev_alloc(total), *d2 = dev_alloc(total);
	cudaStream_t s = new_stream();
	hold_point(o);

	/* distinct sizes so each record is unambiguous */
	copy_async(d1, pinned, n, cudaMemcpyDefault, s, -1, NULL);                       /* H2D pinned */
	copy_async(pinned + 2 * n, d1, n + 4096, cudaMemcpyDefault, s, -1, NULL);        /* D2H pinned */
	copy_async(d2, d1, n + 8192, cudaMemcpyDefault, s, -1, NULL);                    /* D2D */
	copy_async(d1 + 4 * n, pageable, n + 12288, cudaMemcpyDefault, s, -1, NULL);    /* H2D pageable */
	struct truth_rec *r = truth_copy("cudaMemcpy", "copy", pageable + 4 * n, d2, n + 16384, cudaMemcpyDefault,
					 NULL, -1);                                       /* D2H pageable, sync */
	TCALL(r, cudaMemcpy(pageable + 4 * n, d2, n + 16384, cudaMemcpyDefault));
	r = truth_copy("cudaMemcpy", "copy", pageable2, pinned, n + 20480, cudaMemcpyDefault, NULL, -1); /* H2H */
	TCALL(r, cudaMemcpy(pageable2, pinned, n + 20480, cudaMemcpyDefault));
	stream_sync(s, NULL);
	int bad = verify(d1, pinned, n, "H2D") | verify(d1 + 4 * n, pageable, n + 12288, "H2D pageable") |
		  verify(pageable2, pinned, n + 20480, "H2H");

	CHECK(cudaStreamDestroy(s));
	dev_free(d1);
	dev_free(d2);
	host_unregister(pinned);
	munmap(pinned, total);
	free(pageable);
	free(pageable2);
	return bad;
}

/* ---------------- late attach ---------------- */

static int sc_late_attach(const struct opts *o, struct result *res)
{
	(void)res;
	size_t lb = o->layer_bytes, total = lb * (size_t)o->layers;
	char *pool = pool_mmap(total, 0x77);
	host_register(pool, total, 1); /* before the observer attaches: it cannot know */
	/* pageable memory mapped before the observer attaches: it cannot know either that
	 * nobody registered it (docs/design.md, "Late attach") */
	size_t pn = 2 * MiB;
	char *old = pool_mmap(pn, 0x79);
	truth_note_mem(old, pn, MEM_PAGEABLE, 1);
	char *dev = dev_alloc(total + 2 * pn);
	cudaStream_t s = new_stream();
	hold_point(o);

	for (int i = 0; i < o->layers; i++)
		copy_async(dev + i * lb, pool + i * lb, lb, cudaMemcpyHostToDevice, s, i, NULL);
	/* fresh pageable memory after the attach: >= 1 MiB so malloc maps it anew */
	char *fresh = malloc(pn);
	if (!fresh)
		return 1;
	memset(fresh, 0x78, pn);
	copy_async(dev + total, fresh, pn, cudaMemcpyHostToDevice, s, -1, NULL);
	copy_async(dev + total + pn, old, pn, cudaMemcpyHostToDevice, s, -1, NULL);
	stream_sync(s, NULL);
	int bad = verify(dev, pool, total, "pool load") | verify(dev + total, fresh, pn, "pageable load") |
		  verify(dev + total + pn, old, pn, "early pageable load");

	free(fresh);
	truth_forget_mem(old);
	munmap(old, pn);
	CHECK(cudaStreamDestroy(s));
	dev_free(dev);
	host_unregister(pool);
	munmap(pool, total);
	return bad;
}

/* ---------------- every API once ---------------- */

#define SLOT (128 * KiB) /* each call gets its own region of every buffer */

static size_t cov_size(int k)
{
	return 8192 + 1024 * (size_t)k; /* distinct per call, < SLOT/2 */
}

struct cov {
	char *pin, *cupin, *pool, *pool2, *pageable, *d1, *d2;
	int k; /* next call index */
	cudaStream_t s;
};

static char *slot(char *base, int k)
{
	return base + (size_t)k * SLOT;
}

/* A driver copy record: kind is the one the driver function implies. */
#define DRV_COPY(api, kind, dst, src, n, stream, expr)                                             \
	do {                                                                                     \
		struct truth_rec *dr_ = truth_copy(api, "copy", dst, src, n, kind, stream, -1); \
		TCALL(dr_, expr);                                                               \
	} while (0)

static void cov_2d(struct cov *c, const char *api, int to_dev, int async, int pt)
{
	int k = c->k++;
	size_t n = cov_size(k), h = 4, w = n / h, pitch = w + 256;
	char *dev = slot(c->d1, k), *host = slot(c->pin, k);
	void *dst = to_dev ? dev : host, *src = to_dev ? host : dev;
	enum cudaMemcpyKind kind = to_dev ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
	cudaStream_t s = pt ? NULL : c->s;
	struct truth_rec *r = truth_copy(api, "copy2d", dst, src, w * h, kind, async ? s : NULL, -1);
	r->is2d = 1;
	r->dpitch = r->spitch = pitch;
	r->width = w;
	r->height = h;
	if (!async)
		TCALL(r, pt ? cudaMemcpy2D_ptds(dst, pitch, src, pitch, w, h, kind)
			    : cudaMemcpy2D(dst, pitch, src, pitch, w, h, kind));
	else
		TCALL(r, pt ? cudaMemcpy2DAsync_ptsz(dst, pitch, src, pitch, w, h, kind, s)
			    : cudaMemcpy2DAsync(dst, pitch, src, pitch, w, h, kind, s));
}

static void cov_batch(struct cov *c, int pt)
{
	const char *api = pt ? "cudaMemcpyBatchAsync_ptsz" : "cudaMemcpyBatchAsync";
	void *dsts[3], *srcs[3];
	size_t sizes[3], fail = 0;
	struct truth_rec *r[3];
	cudaStream_t s = pt ? NULL : c->s;
	for (int i = 0; i < 3; i++) {
		int k = c->k++;
		sizes[i] = cov_size(k);
		/* entry 0: H2D pinned, 1: D2H pinned, 2: D2D */
		dsts[i] = i == 1 ? slot(c->pin, k) : slot(c->d1, k);
		srcs[i] = i == 0 ? slot(c->pin, k) : i == 1 ? slot(c->d1, k) : slot(c->d2, k);
		r[i] = truth_copy_unarmed(api, "copy_batch", dsts[i], srcs[i], sizes[i], cudaMemcpyDefault, s, -1);
		r[i]->batch_index = i;
	}
	truth_arm_times(r, 3);
	uint64_t t0 = truth_now_ns();
	int ret = pt ? cudaMemcpyBatchAsync_ptsz(dsts, srcs, sizes, 3, NULL, NULL, 0, &fail, s)
		     : cudaMemcpyBatchAsync(dsts, srcs, sizes, 3, NULL, NULL, 0, &fail, s);
	uint64_t t1 = truth_now_ns();
	for (int i = 0; i < 3; i++) {
		r[i]->t_call_ns = t0;
		r[i]->t_return_ns = t1;
		r[i]->ret = ret;
	}
	if (ret) {
		fprintf(stderr, "kvpath: %s failed: %d (entry %zu)\n", api, ret, fail);
		exit(1);
	}
}

/* One 1D runtime copy: pinned host side, direction by kind. */
static void cov_rt(struct cov *c, const char *api, enum cudaMemcpyKind kind, int async, int pt)
{
	int k = c->k++;
	size_t n = cov_size(k);
	char *dst = kind == cudaMemcpyDeviceToHost ? slot(c->pin, k) : slot(c->d1, k);
	char *src = kind == cudaMemcpyHostToDevice ? slot(c->pin, k) : kind == cudaMemcpyDeviceToDevice ? slot(c->d2, k) : slot(c->d1, k);
	cudaStream_t s = pt ? NULL : c->s;
	struct truth_rec *r = truth_copy(api, "copy", dst, src, n, kind, async ? s : NULL, -1);
	if (!async)
		TCALL(r, pt ? cudaMemcpy_ptds(dst, src, n, kind) : cudaMemcpy(dst, src, n, kind));
	else
		TCALL(r, pt ? cudaMemcpyAsync_ptsz(dst, src, n, kind, s) : cudaMemcpyAsync(dst, src, n, kind, s));
}

static void *alloc_rec(const char *api, size_t n, int how)
{
	void *p = NULL;
	struct truth_rec *r = truth_new(api, "host_alloc");
	r->size = n;
	switch (how) {
	case 0:
		TCALL(r, cudaMallocHost(&p, n));
		break;
	case 1:
		r->has_flags = 1;
		TCALL(r, cudaHostAlloc(&p, n, cudaHostAllocDefault));
		break;
	case 2:
		r->has_flags = 1;
		TCALL(r, cuMemHostAlloc(&p, n, 0));
		break;
	default:
		TCALL(r, cuMemAllocHost_v2(&p, n));
		break;
	}
	r->ptr = (uintptr_t)p;
	truth_note_mem(p, n, MEM_PINNED, 0);
	return p;
}

static void free_rec(const char *api, void *p)
{
	struct truth_rec *r = truth_new(api, "host_free");
	r->ptr = (uintptr_t)p;
	TCALL(r, strcmp(api, "cudaFreeHost") ? cuMemFreeHost(p) : cudaFreeHost(p));
	truth_forget_mem(p);
}

static struct truth_rec *order_rec(const char *api, const char *op, cudaStream_t s, cudaEvent_t e)
{
	struct truth_rec *r = truth_new(api, op);
	if (strcmp(op, "event_sync")) {
		r->stream = (uintptr_t)s;
		r->has_stream = 1;
	}
	if (e) {
		r->event = (uintptr_t)e;
		r->has_event = 1;
	}
	r->has_flags = !strcmp(op, "stream_wait_event");
	return r;
}

static int sc_api_coverage(const struct opts *o, struct result *res)
{
	(void)o;
	(void)res;
	const size_t BUF = 64 * SLOT; /* 8 MiB: room for 64 calls */
	struct cov c = {0};
	/* it calls the driver API directly: initialise the driver first, as a driver-API
	 * program must (not in the truth; every later call is) */
	CHECK(cuInit(0));
	c.pin = alloc_rec("cudaMallocHost", BUF, 0);
	char *hostalloc = alloc_rec("cudaHostAlloc", 1 * MiB, 1);
	c.cupin = alloc_rec("cuMemHostAlloc", BUF, 2);
	char *cuallochost = alloc_rec("cuMemAllocHost_v2", 1 * MiB, 3);
	c.pool = pool_mmap(BUF, 0x12);
	host_register(c.pool, BUF, 0);
	c.pool2 = pool_mmap(BUF, 0x13);
	{
		struct truth_rec *r = truth_new("cuMemHostRegister_v2", "host_register");
		r->ptr = (uintptr_t)c.pool2;
		r->size = BUF;
		r->has_flags = 1;
		TCALL(r, cuMemHostRegister_v2(c.pool2, BUF, 0));
		truth_note_mem(c.pool2, BUF, MEM_PINNED, 0);
	}
	c.d1 = dev_alloc(BUF);
	{
		CUdeviceptr d = 0;
		struct truth_rec *r = truth_new("cuMemAlloc_v2", "device_alloc");
		r->size = BUF;
		TCALL(r, cuMemAlloc_v2(&d, BUF));
		r->ptr = d;
		c.d2 = (char *)(uintptr_t)d;
		truth_note_mem(c.d2, BUF, MEM_DEVICE, 0);
	}
	c.pageable = malloc(BUF);
	if (!c.pageable)
		return 1;
	memset(c.pageable, 0x14, BUF);
	c.s = new_stream();
	cudaEvent_t e1, e2;
	CHECK(cudaEventCreate(&e1));
	CHECK(cudaEventCreateWithFlags(&e2, cudaEventDisableTiming));
	hold_point(o);

	/* runtime 1D copies, every form */
	cov_rt(&c, "cudaMemcpy", cudaMemcpyHostToDevice, 0, 0);
	cov_rt(&c, "cudaMemcpy_ptds", cudaMemcpyDeviceToHost, 0, 1);
	cov_rt(&c, "cudaMemcpy", cudaMemcpyDeviceToDevice, 0, 0);
	cov_rt(&c, "cudaMemcpyAsync", cudaMemcpyHostToDevice, 1, 0);
	cov_rt(&c, "cudaMemcpyAsync", cudaMemcpyDeviceToHost, 1, 0);
	cov_rt(&c, "cudaMemcpyAsync_ptsz", cudaMemcpyHostToDevice, 1, 1);
	cov_rt(&c, "cudaMemcpyAsync_ptsz", cudaMemcpyDeviceToDevice, 1, 1);
	{ /* H2H by kind 0, pageable -> pinned */
		int k = c.k++;
		size_t n = cov_size(k);
		struct truth_rec *r = truth_copy("cudaMemcpy", "copy", slot(c.pin, k), slot(c.pageable, k), n,
						 cudaMemcpyHostToHost, NULL, -1);
		TCALL(r, cudaMemcpy(slot(c.pin, k), slot(c.pageable, k), n, cudaMemcpyHostToHost));
	}
	{ /* pageable H2D on a stream: the call blocks while the driver stages */
		int k = c.k++;
		size_t n = cov_size(k);
		struct truth_rec *r = truth_copy("cudaMemcpyAsync", "copy", slot(c.d1, k), slot(c.pageable, k), n,
						 cudaMemcpyHostToDevice, c.s, -1);
		TCALL(r, cudaMemcpyAsync(slot(c.d1, k), slot(c.pageable, k), n, cudaMemcpyHostToDevice, c.s));
	}
	{ /* from cudaHostAlloc and cuMemAllocHost_v2 memory: pinned */
		int k = c.k++;
		size_t n = cov_size(k);
		struct truth_rec *r = truth_copy("cudaMemcpyAsync", "copy", slot(c.d1, k), hostalloc, n,
						 cudaMemcpyHostToDevice, c.s, -1);
		TCALL(r, cudaMemcpyAsync(slot(c.d1, k), hostalloc, n, cudaMemcpyHostToDevice, c.s));
		k = c.k++;
		n = cov_size(k);
		r = truth_copy("cudaMemcpyAsync", "copy", cuallochost, slot(c.d1, k), n, cudaMemcpyDeviceToHost, c.s, -1);
		TCALL(r, cudaMemcpyAsync(cuallochost, slot(c.d1, k), n, cudaMemcpyDeviceToHost, c.s));
	}

	/* 2D: kind (7th) and stream (8th) on the stack */
	cov_2d(&c, "cudaMemcpy2D", 1, 0, 0);
	cov_2d(&c, "cudaMemcpy2D_ptds", 0, 0, 1);
	cov_2d(&c, "cudaMemcpy2DAsync", 1, 1, 0);
	cov_2d(&c, "cudaMemcpy2DAsync_ptsz", 0, 1, 1);

	/* peer (one device: D2D) */
	{
		int k = c.k++;
		size_t n = cov_size(k);
		struct truth_rec *r = truth_copy("cudaMemcpyPeer", "copy_peer", slot(c.d2, k), slot(c.d1, k), n,
						 cudaMemcpyDeviceToDevice, NULL, -1);
		TCALL(r, cudaMemcpyPeer(slot(c.d2, k), 0, slot(c.d1, k), 0, n));
		k = c.k++;
		n = cov_size(k);
		r = truth_copy("cudaMemcpyPeerAsync", "copy_peer", slot(c.d2, k), slot(c.d1, k), n,
			       cudaMemcpyDeviceToDevice, c.s, -1);
		TCALL(r, cudaMemcpyPeerAsync(slot(c.d2, k), 0, slot(c.d1, k), 0, n, c.s));
	}

	/* batch: 3 entries each */
	cov_batch(&c, 0);
	cov_batch(&c, 1);

	/* every driver copy function and its per-thread form */
	int k;
	size_t n;
#define NEXT() (k = c.k++, n = cov_size(k))
#define D(p) ((CUdeviceptr)(uintptr_t)(p))
	NEXT();
	DRV_COPY("cuMemcpyHtoD_v2", 1, slot(c.d1, k), slot(c.cupin, k), n, NULL, cuMemcpyHtoD_v2(D(slot(c.d1, k)), slot(c.cupin, k), n));
	NEXT();
	DRV_COPY("cuMemcpyHtoD_v2_ptds", 1, slot(c.d1, k), slot(c.cupin, k), n, NULL, cuMemcpyHtoD_v2_ptds(D(slot(c.d1, k)), slot(c.cupin, k), n));
	NEXT();
	DRV_COPY("cuMemcpyHtoDAsync_v2", 1, slot(c.d1, k), slot(c.pool, k), n, c.s, cuMemcpyHtoDAsync_v2(D(slot(c.d1, k)), slot(c.pool, k), n, c.s));
	NEXT();
	DRV_COPY("cuMemcpyHtoDAsync_v2_ptsz", 1, slot(c.d1, k), slot(c.pool2, k), n, NULL, cuMemcpyHtoDAsync_v2_ptsz(D(slot(c.d1, k)), slot(c.pool2, k), n, NULL));
	NEXT();
	DRV_COPY("cuMemcpyDtoH_v2", 2, slot(c.cupin, k), slot(c.d1, k), n, NULL, cuMemcpyDtoH_v2(slot(c.cupin, k), D(slot(c.d1, k)), n));
	NEXT();
	DRV_COPY("cuMemcpyDtoH_v2_ptds", 2, slot(c.cupin, k), slot(c.d1, k), n, NULL, cuMemcpyDtoH_v2_ptds(slot(c.cupin, k), D(slot(c.d1, k)), n));
	NEXT();
	DRV_COPY("cuMemcpyDtoHAsync_v2", 2, slot(c.pool, k), slot(c.d1, k), n, c.s, cuMemcpyDtoHAsync_v2(slot(c.pool, k), D(slot(c.d1, k)), n, c.s));
	NEXT();
	DRV_COPY("cuMemcpyDtoHAsync_v2_ptsz", 2, slot(c.pageable, k), slot(c.d1, k), n, NULL, cuMemcpyDtoHAsync_v2_ptsz(slot(c.pageable, k), D(slot(c.d1, k)), n, NULL));
	NEXT();
	DRV_COPY("cuMemcpyDtoD_v2", 3, slot(c.d2, k), slot(c.d1, k), n, NULL, cuMemcpyDtoD_v2(D(slot(c.d2, k)), D(slot(c.d1, k)), n));
	NEXT();
	DRV_COPY("cuMemcpyDtoD_v2_ptds", 3, slot(c.d2, k), slot(c.d1, k), n, NULL, cuMemcpyDtoD_v2_ptds(D(slot(c.d2, k)), D(slot(c.d1, k)), n));
	NEXT();
	DRV_COPY("cuMemcpyDtoDAsync_v2", 3, slot(c.d2, k), slot(c.d1, k), n, c.s, cuMemcpyDtoDAsync_v2(D(slot(c.d2, k)), D(slot(c.d1, k)), n, c.s));
	NEXT();
	DRV_COPY("cuMemcpyDtoDAsync_v2_ptsz", 3, slot(c.d2, k), slot(c.d1, k), n, NULL, cuMemcpyDtoDAsync_v2_ptsz(D(slot(c.d2, k)), D(slot(c.d1, k)), n, NULL));
	NEXT();
	DRV_COPY("cuMemcpy", 4, slot(c.d1, k), slot(c.pool, k), n, NULL, cuMemcpy(D(slot(c.d1, k)), D(slot(c.pool, k)), n));
	NEXT();
	DRV_COPY("cuMemcpy_ptds", 4, slot(c.pool2, k), slot(c.d1, k), n, NULL, cuMemcpy_ptds(D(slot(c.pool2, k)), D(slot(c.d1, k)), n));
	NEXT();
	DRV_COPY("cuMemcpyAsync", 4, slot(c.d2, k), slot(c.pageable, k), n, c.s, cuMemcpyAsync(D(slot(c.d2, k)), D(slot(c.pageable, k)), n, c.s));
	NEXT();
	DRV_COPY("cuMemcpyAsync_ptsz", 4, slot(c.d2, k), slot(c.d1, k), n, NULL, cuMemcpyAsync_ptsz(D(slot(c.d2, k)), D(slot(c.d1, k)), n, NULL));
#undef NEXT
#undef D

	/* ordering calls, runtime and driver, every per-thread form */
	struct truth_rec *r;
	r = order_rec("cudaEventRecord", "event_record", c.s, e1);
	TCALL(r, cudaEventRecord(e1, c.s));
	r = order_rec("cudaEventRecord_ptsz", "event_record", NULL, e2);
	TCALL(r, cudaEventRecord_ptsz(e2, NULL));
	r = order_rec("cudaStreamWaitEvent", "stream_wait_event", c.s, e2);
	TCALL(r, cudaStreamWaitEvent(c.s, e2, 0));
	r = order_rec("cudaStreamWaitEvent_ptsz", "stream_wait_event", NULL, e1);
	TCALL(r, cudaStreamWaitEvent_ptsz(NULL, e1, 0));
	r = order_rec("cudaEventSynchronize", "event_sync", NULL, e1);
	TCALL(r, cudaEventSynchronize(e1));
	r = order_rec("cuEventRecord", "event_record", c.s, e1);
	TCALL(r, cuEventRecord(e1, c.s));
	r = order_rec("cuEventRecord_ptsz", "event_record", NULL, e2);
	TCALL(r, cuEventRecord_ptsz(e2, NULL));
	r = order_rec("cuStreamWaitEvent", "stream_wait_event", c.s, e2);
	TCALL(r, cuStreamWaitEvent(c.s, e2, 0));
	r = order_rec("cuStreamWaitEvent_ptsz", "stream_wait_event", NULL, e1);
	TCALL(r, cuStreamWaitEvent_ptsz(NULL, e1, 0));
	r = order_rec("cuEventSynchronize", "event_sync", NULL, e2);
	TCALL(r, cuEventSynchronize(e2));
	r = order_rec("cudaStreamSynchronize", "stream_sync", c.s, NULL);
	TCALL(r, cudaStreamSynchronize(c.s));
	r = order_rec("cudaStreamSynchronize_ptsz", "stream_sync", NULL, NULL);
	TCALL(r, cudaStreamSynchronize_ptsz(NULL));
	r = order_rec("cuStreamSynchronize", "stream_sync", c.s, NULL);
	TCALL(r, cuStreamSynchronize(c.s));
	r = order_rec("cuStreamSynchronize_ptsz", "stream_sync", NULL, NULL);
	TCALL(r, cuStreamSynchronize_ptsz(NULL));
	r = order_rec("cudaStreamSynchronize", "stream_sync", NULL, NULL); /* legacy default stream */
	TCALL(r, cudaStreamSynchronize(NULL));

	/* teardown through every free/unregister entry point */
	CHECK(cudaEventDestroy(e1));
	CHECK(cudaEventDestroy(e2));
	CHECK(cudaStreamDestroy(c.s));
	free_rec("cudaFreeHost", c.pin);
	free_rec("cudaFreeHost", hostalloc);
	free_rec("cuMemFreeHost", c.cupin);
	free_rec("cuMemFreeHost", cuallochost);
	host_unregister(c.pool);
	{
		struct truth_rec *u = truth_new("cuMemHostUnregister", "host_unregister");
		u->ptr = (uintptr_t)c.pool2;
		TCALL(u, cuMemHostUnregister(c.pool2));
		truth_forget_mem(c.pool2);
	}
	dev_free(c.d1);
	{
		struct truth_rec *u = truth_new("cuMemFree_v2", "device_free");
		u->ptr = (uintptr_t)c.d2;
		TCALL(u, cuMemFree_v2((CUdeviceptr)(uintptr_t)c.d2));
		truth_forget_mem(c.d2);
	}
	munmap(c.pool, BUF);
	munmap(c.pool2, BUF);
	free(c.pageable);
	return 0;
}

/* ---------------- call overhead ---------------- */

static int sc_callbench(const struct opts *o, struct result *res)
{
	long n = o->iterations ? o->iterations : 100000;
	void *pinned = NULL, *dev = NULL;
	cudaStream_t s;
	/* setup is not measured and not recorded */
	CHECK(cudaMallocHost(&pinned, 4096));
	CHECK(cudaMalloc(&dev, 4096));
	CHECK(cudaStreamCreate(&s));
	CHECK(cudaMemcpyAsync(dev, pinned, 64, cudaMemcpyHostToDevice, s)); /* warm up: engine thread, PLT */
	CHECK(cudaStreamSynchronize(s));
	hold_point(o);

	uint64_t sync_ns = 0, t0 = truth_now_ns();
	for (long i = 0; i < n; i++) {
		if (cudaMemcpyAsync(dev, pinned, 64, cudaMemcpyHostToDevice, s) != cudaSuccess) {
			fprintf(stderr, "kvpath: callbench copy %ld failed\n", i);
			return 1;
		}
		if ((i & 1023) == 1023) {
			uint64_t a = truth_now_ns();
			CHECK(cudaStreamSynchronize(s));
			sync_ns += truth_now_ns() - a;
		}
	}
	uint64_t a = truth_now_ns();
	CHECK(cudaStreamSynchronize(s));
	uint64_t t1 = truth_now_ns();
	sync_ns += t1 - a;
	double per = (double)(t1 - t0) / (double)n, enq = (double)(t1 - t0 - sync_ns) / (double)n;
	/* What the application moved, as its driver counted it (the warm-up
	 * copy included), and over which GPU: the totals the agent's BPF-side
	 * counters must equal, however many events it dropped. */
	char gpu[32] = "";
	refcudaDeviceBusId(0, gpu, sizeof gpu);
	unsigned long long in = refcudaLaneBytes(1);
	printf("{\"calls\":%ld,\"ns_per_call\":%.1f,\"enqueue_ns_per_call\":%.1f,\"gpu\":\"%s\",\"lane_in_bytes\":%llu}\n",
	       n, per, enq, gpu, in);
	fflush(stdout);
	snprintf(res->extra, sizeof res->extra,
		 "\"bench_calls\":%ld,\"ns_per_call\":%.1f,\"enqueue_ns_per_call\":%.1f,\"gpu\":\"%s\",\"lane_in_bytes\":%llu",
		 n, per, enq, gpu, in);

	CHECK(cudaStreamDestroy(s));
	CHECK(cudaFree(dev));
	CHECK(cudaFreeHost(pinned));
	return 0;
}

/* ---------------- copy-kernel stand-in ---------------- */

static char kernel_gpu[32]; /* the PCI address of device 0, the scenario's GPU */

/* One sgl-kernel transfer_kv_per_layer launch on stream s: pages [first, first+n)
 * of item bytes of K and V, moved by the kernel between two pools laid out alike
 * (page p of layer buffer k at k + p*item). The truth names the kernel, its stream,
 * layer, GPU and the bytes it moved (the scenario knows which way). */
static void kernel_copy(char *dst_k, const char *src_k, char *dst_v, const char *src_v, const int64_t *idx,
			int64_t n, int64_t item, int inbound, cudaStream_t s, int layer)
{
	struct truth_rec *r = truth_copy_unarmed("cudaLaunchKernel", "kernel_copy", dst_k, src_k, (uint64_t)(2 * n * item),
						 inbound ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, s, layer);
	r->kernel = sgl_transfer_kernel_name;
	r->gpu = kernel_gpu;
	truth_arm_times(&r, 1);
	TCALL(r, sgl_transfer_kv_per_layer(src_k, dst_k, src_v, dst_v, idx, idx, n, item, 2, 4, s));
}

/*
 * HiCache's `kernel` I/O backend: the bytes go over the GPU's lanes by SM copy
 * kernels, not by copy calls. `layers` loads of layer_bytes (half K, half V, 8 pages
 * each) into the GPU, one sgl-kernel transfer_kv_per_layer launch per layer on the
 * load stream with an event recorded after each layer (64 MiB by default); then
 * layers/2 writebacks out of it on a write stream (32 MiB); a few ordinary
 * cudaMemcpyAsync copies (probed) of layer_bytes/8 beside them, 4 H2D on the load
 * stream and 2 D2H on the write stream. Run it with LW_REF_GPU=<name> so the lanes,
 * and their byte counters, are in /dev/shm/lw-ref-<name> where the NVML stand-in
 * reads them. The end line has the bytes per direction: lane_bytes (the lane
 * counters' increase during the scenario), kernel_bytes and copy_bytes (what the
 * scenario moved each way), and launches.
 */
static int sc_kernel_copy(const struct opts *o, struct result *res)
{
	const int64_t pages = 8;
	size_t lb = o->layer_bytes, total = lb * (size_t)o->layers, cb = lb / 8 ? lb / 8 : 1;
	int64_t item = (int64_t)(lb / 2 / (size_t)pages);
	int nout = o->layers / 2 ? o->layers / 2 : 1;
	char *in = pool_mmap(total, 0x33), *out = pool_mmap(total, 0);
	host_register(in, total, 0);
	host_register(out, total, 0);
	char *dev = dev_alloc(total);
	/* the page indices, in device memory as sgl-kernel's are (written as a kernel would) */
	int64_t *idx = (int64_t *)dev_alloc((size_t)pages * sizeof *idx);
	for (int64_t p = 0; p < pages; p++)
		idx[p] = p;
	cudaStream_t s = new_stream(), w = new_stream();
	cudaEvent_t ev;
	CHECK(cudaEventCreate(&ev));
	if (refcudaDeviceBusId(0, kernel_gpu, sizeof kernel_gpu) != 0) {
		fprintf(stderr, "kernel-copy: no device 0\n");
		return 1;
	}
	const char *gpu = getenv("LW_REF_GPU");
	hold_point(o);

	uint64_t in0 = refcudaLaneBytes(1), out0 = refcudaLaneBytes(0);
	uint64_t kin = 0, kout = 0, cin = 0, cout = 0;
	int launches = 0;
	for (int i = 0; i < o->layers; i++) {
		char *hk = in + (size_t)i * lb, *dk = dev + (size_t)i * lb;
		kernel_copy(dk, hk, dk + lb / 2, hk + lb / 2, idx, pages, item, 1, s, i);
		kin += lb;
		launches++;
		if (i < 4) {
			copy_async(dk, hk, cb, cudaMemcpyHostToDevice, s, i, NULL);
			cin += cb;
		}
		event_record(ev, s, i);
	}
	stream_sync(s, NULL);
	int bad = verify(dev, in, total, "kernel copy in");
	memset(dev, 0x44, total); /* what the layers' compute left in the device pool */
	for (int i = 0; i < nout; i++) {
		char *hk = out + (size_t)i * lb, *dk = dev + (size_t)i * lb;
		kernel_copy(hk, dk, hk + lb / 2, dk + lb / 2, idx, pages, item, 0, w, -1);
		kout += lb;
		launches++;
		if (i < 2) {
			copy_async(out + total - (size_t)(i + 1) * cb, dev + total - (size_t)(i + 1) * cb, cb,
				   cudaMemcpyDeviceToHost, w, -1, NULL);
			cout += cb;
		}
	}
	stream_sync(w, NULL);
	bad |= verify(out, dev, (size_t)nout * lb, "kernel copy out");
	uint64_t lin = refcudaLaneBytes(1) - in0, lout = refcudaLaneBytes(0) - out0;

	/* private lanes see only this process; shared ones may carry other processes' bytes too */
	int shared = gpu && *gpu;
	if (shared ? (lin < kin + cin || lout < kout + cout) : (lin != kin + cin || lout != kout + cout)) {
		fprintf(stderr, "kernel-copy: lane counters moved H2D %llu D2H %llu, the scenario moved %llu and %llu\n",
			(unsigned long long)lin, (unsigned long long)lout, (unsigned long long)(kin + cin),
			(unsigned long long)(kout + cout));
		bad = 1;
	}
	fprintf(stderr, "kernel-copy: lanes H2D %llu D2H %llu bytes (kernel %llu/%llu in %d launches, copies %llu/%llu)%s%s\n",
		(unsigned long long)lin, (unsigned long long)lout, (unsigned long long)kin, (unsigned long long)kout,
		launches, (unsigned long long)cin, (unsigned long long)cout, shared ? " on gpu " : "", shared ? gpu : "");
	snprintf(res->extra, sizeof res->extra,
		 "\"gpu\":\"%s\",\"lane_bytes\":{\"h2d\":%llu,\"d2h\":%llu},\"kernel_bytes\":{\"h2d\":%llu,\"d2h\":%llu},"
		 "\"copy_bytes\":{\"h2d\":%llu,\"d2h\":%llu},\"launches\":%d",
		 shared ? gpu : "", (unsigned long long)lin, (unsigned long long)lout, (unsigned long long)kin,
		 (unsigned long long)kout, (unsigned long long)cin, (unsigned long long)cout, launches);

	CHECK(cudaEventDestroy(ev));
	CHECK(cudaStreamDestroy(s));
	CHECK(cudaStreamDestroy(w));
	dev_free(idx);
	dev_free(dev);
	host_unregister(in);
	host_unregister(out);
	munmap(in, total);
	munmap(out, total);
	return bad;
}

/* ---------------- errors ---------------- */

/* Driver calls since `before` must be `want`: checks whether a call reached the driver. */
static int driver_calls_since(unsigned long long before, unsigned long long want, const char *what)
{
	unsigned long long got = refcudaDriverCalls() - before;
	if (got != want) {
		fprintf(stderr, "kvpath: %s made %llu driver calls, expected %llu\n", what, got, want);
		return 1;
	}
	return 0;
}

#define BAD_DEVPTR ((void *)0x10) /* far outside the device arena */

/*
 * Copies that fail in the driver with CUDA_ERROR_INVALID_VALUE (1), interleaved with
 * good ones: round i makes a good H2D cudaMemcpyAsync from the pinned pool and syncs
 * its stream, then failing copy i: cudaMemcpyAsync H2D to a device pointer outside
 * the arena, cudaMemcpy D2H into a NULL host pointer, cuMemcpyHtoD_v2 to a bad device
 * pointer (the driver API directly), cudaMemcpy2DAsync H2D to a bad device pointer.
 * Each copy call reaches the driver exactly once; a failed one moves no lane bytes
 * and gets no engine times. Truth: result 0 for the good calls, 1 for the failed
 * copies (recorded with the direction and host memory they asked for).
 */
static int sc_failing_copies(const struct opts *o, struct result *res)
{
	size_t n = o->layer_bytes, total = 4 * n;
	char *pool = pool_mmap(total + 1 * MiB, 0x5c);
	host_register(pool, total + 1 * MiB, 0);
	char *dev = dev_alloc(total);
	cudaStream_t s = new_stream();
	hold_point(o);

	int bad = 0;
	for (int i = 0; i < 4; i++) {
		unsigned long long c = refcudaDriverCalls();
		copy_async(dev + (size_t)i * n, pool + (size_t)i * n, n, cudaMemcpyHostToDevice, s, -1, NULL);
		bad |= driver_calls_since(c, 1, "a good cudaMemcpyAsync");
		stream_sync(s, NULL);

		/* distinct sizes, all from the pool's spare MiB: each record is unambiguous */
		size_t m = (size_t)(i + 1) * 16 * KiB;
		char *host = pool + total;
		uint64_t in0 = refcudaLaneBytes(1), out0 = refcudaLaneBytes(0);
		c = refcudaDriverCalls();
		struct truth_rec *r;
		switch (i) {
		case 0:
			r = truth_copy("cudaMemcpyAsync", "copy", BAD_DEVPTR, host, m, cudaMemcpyHostToDevice, s, -1);
			TCALL_EXPECT(r, cudaMemcpyAsync(BAD_DEVPTR, host, m, cudaMemcpyHostToDevice, s),
				     cudaErrorInvalidValue);
			break;
		case 1:
			r = truth_copy("cudaMemcpy", "copy", NULL, dev, m, cudaMemcpyDeviceToHost, NULL, -1);
			TCALL_EXPECT(r, cudaMemcpy(NULL, dev, m, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
			break;
		case 2: /* kind: the one the driver function implies (HtoD 1) */
			r = truth_copy("cuMemcpyHtoD_v2", "copy", BAD_DEVPTR, host, m, cudaMemcpyHostToDevice, NULL, -1);
			TCALL_EXPECT(r, cuMemcpyHtoD_v2((CUdeviceptr)(uintptr_t)BAD_DEVPTR, host, m),
				     CUDA_ERROR_INVALID_VALUE);
			break;
		default: {
			size_t h = 4, w = m / h, pitch = w + 256;
			r = truth_copy("cudaMemcpy2DAsync", "copy2d", BAD_DEVPTR, host, w * h, cudaMemcpyHostToDevice, s,
				       -1);
			r->is2d = 1;
			r->dpitch = r->spitch = pitch;
			r->width = w;
			r->height = h;
			TCALL_EXPECT(r, cudaMemcpy2DAsync(BAD_DEVPTR, pitch, host, pitch, w, h, cudaMemcpyHostToDevice, s),
				     cudaErrorInvalidValue);
			break;
		}
		}
		bad |= driver_calls_since(c, 1, r->api);
		if (refcudaLaneBytes(1) != in0 || refcudaLaneBytes(0) != out0) {
			fprintf(stderr, "kvpath: the failed %s moved bytes on the lanes\n", r->api);
			bad = 1;
		}
		/* a runtime error is not sticky: cudaGetLastError reports and clears it */
		if (i != 2 && cudaGetLastError() != cudaErrorInvalidValue) {
			fprintf(stderr, "kvpath: cudaGetLastError after the failed %s is not cudaErrorInvalidValue\n",
				r->api);
			bad = 1;
		}
	}
	stream_sync(s, NULL);
	bad |= verify(dev, pool, total, "the good copies");
	snprintf(res->extra, sizeof res->extra, "\"expected_errors\":4");

	CHECK(cudaStreamDestroy(s));
	dev_free(dev);
	host_unregister(pool);
	munmap(pool, total + 1 * MiB);
	return bad;
}

/*
 * A machine without a GPU: LW_REF_NO_DEVICE=1 is set here, before the first CUDA
 * call, so the runtime's cuInit(0) fails with CUDA_ERROR_NO_DEVICE. The first call,
 * cudaGetDeviceCount, returns cudaErrorNoDevice (100); after the hold point 8 more
 * runtime calls return the same sticky error without reaching the driver (checked
 * with the driver's call counter: the runtime's one cuInit is the only driver call).
 * Copies are recorded as requested. Their host memory is pageable: the registration
 * failed, and an observer that saw the process from its start (the agent's driver
 * probes did) and its failed registration (the runtime layer did) knows nothing was
 * pinned.
 */
static int sc_no_device(const struct opts *o, struct result *res)
{
	int bad = 0;
	if (refcudaDriverCalls() != 0) {
		fprintf(stderr, "kvpath: no-device: the driver was called before the scenario started\n");
		return 1;
	}
	setenv("LW_REF_NO_DEVICE", "1", 1);
	int count = -1;
	struct truth_rec *r = truth_new("cudaGetDeviceCount", "init");
	TCALL_EXPECT(r, cudaGetDeviceCount(&count), cudaErrorNoDevice);
	if (count != 0) {
		fprintf(stderr, "kvpath: no-device: cudaGetDeviceCount says %d devices\n", count);
		bad = 1;
	}
	bad |= driver_calls_since(0, 1, "cudaGetDeviceCount (the runtime's cuInit)");
	unsigned long long c0 = refcudaDriverCalls();
	size_t n = o->layer_bytes;
	char *host = pool_mmap(4 * n, 0x6e);
	hold_point(o);

	void *pinned = NULL, *dev = NULL;
	r = truth_new("cudaMallocHost", "host_alloc");
	r->size = n;
	TCALL_EXPECT(r, cudaMallocHost(&pinned, n), cudaErrorNoDevice);
	r->ptr = (uintptr_t)pinned;

	r = truth_new("cudaHostRegister", "host_register");
	r->ptr = (uintptr_t)host;
	r->size = 4 * n;
	r->has_flags = 1;
	TCALL_EXPECT(r, cudaHostRegister(host, 4 * n, cudaHostRegisterDefault), cudaErrorNoDevice);
	/* not pinned: not noted */

	r = truth_new("cudaMalloc", "device_alloc");
	r->size = n;
	TCALL_EXPECT(r, cudaMalloc(&dev, n), cudaErrorNoDevice);
	r->ptr = (uintptr_t)dev; /* untouched: NULL, and the copies below use it as the app would */

	size_t m = n + 4 * KiB;
	r = truth_copy("cudaMemcpy", "copy", dev, host, m, cudaMemcpyHostToDevice, NULL, -1);
	TCALL_EXPECT(r, cudaMemcpy(dev, host, m, cudaMemcpyHostToDevice), cudaErrorNoDevice);
	m += 4 * KiB;
	r = truth_copy("cudaMemcpyAsync", "copy", dev, host + n, m, cudaMemcpyHostToDevice, NULL, -1);
	TCALL_EXPECT(r, cudaMemcpyAsync(dev, host + n, m, cudaMemcpyHostToDevice, NULL), cudaErrorNoDevice);
	m += 4 * KiB;
	r = truth_copy("cudaMemcpyAsync", "copy", host + 2 * n, dev, m, cudaMemcpyDeviceToHost, NULL, -1);
	TCALL_EXPECT(r, cudaMemcpyAsync(host + 2 * n, dev, m, cudaMemcpyDeviceToHost, NULL), cudaErrorNoDevice);
	{
		size_t h = 4, w = (m + 4 * KiB) / h, pitch = w + 256;
		r = truth_copy("cudaMemcpy2D", "copy2d", dev, host, w * h, cudaMemcpyHostToDevice, NULL, -1);
			r->is2d = 1;
		r->dpitch = r->spitch = pitch;
		r->width = w;
		r->height = h;
		TCALL_EXPECT(r, cudaMemcpy2D(dev, pitch, host, pitch, w, h, cudaMemcpyHostToDevice), cudaErrorNoDevice);
	}
	/* a KV-transfer kernel's launch: refused by the runtime like the copies */
	r = truth_copy_unarmed("cudaLaunchKernel", "kernel_copy", dev, host, 2 * n, cudaMemcpyHostToDevice, NULL, -1);
	r->kernel = sgl_transfer_kernel_name;
	TCALL_EXPECT(r, sgl_transfer_kv_per_layer(host, dev, host + n, (char *)dev + n / 2, NULL, NULL, 8, (int64_t)(n / 8), 2, 4, NULL),
		     cudaErrorNoDevice);
	r = truth_new("cudaStreamSynchronize", "stream_sync");
	r->stream = 0;
	r->has_stream = 1;
	TCALL_EXPECT(r, cudaStreamSynchronize(NULL), cudaErrorNoDevice);

	bad |= driver_calls_since(c0, 0, "the runtime calls after a failed initialisation");
	snprintf(res->extra, sizeof res->extra, "\"init_error\":%d,\"driver_calls\":%llu,\"expected_errors\":%zu",
		 (int)cudaErrorNoDevice, refcudaDriverCalls(), truth_count());
	munmap(host, 4 * n);
	return bad;
}

const struct scenario scenarios[] = {
	{"hicache-load", sc_hicache_load, 32, 1 * MiB, 1},
	{"pageable-load", sc_pageable_load, 32, 1 * MiB, 1},
	{"fragmented-load", sc_fragmented_load, 32, 256 * KiB, 1}, /* 32 x 64 copies of 4 KiB */
	{"writeback-duplex", sc_writeback_duplex, 32, 2 * MiB, 1},
	{"h2d-overlap", sc_h2d_overlap, 32, 2 * MiB, 1},
	{"default-kind", sc_default_kind, 1, 1 * MiB, 1},
	{"late-attach", sc_late_attach, 32, 1 * MiB, 1},
	{"late-pool-pages", sc_late_pool_pages, 32, 1 * MiB, 1},
	{"api-coverage", sc_api_coverage, 1, 0, 1},
	{"kernel-copy", sc_kernel_copy, 8, 8 * MiB, 1}, /* 64 MiB in, 32 MiB out by kernels */
	{"failing-copies", sc_failing_copies, 4, 1 * MiB, 1},
	{"no-device", sc_no_device, 1, 1 * MiB, 1},
	{"link-trains-up", sc_link_trains_up, 32, 4 * MiB, 1}, /* 16 rounds x 2 streams x 32 x 4 MiB H2D */
	{"vmm-pool-managed", sc_vmm_pool_managed, 1, 0, 1},
	{"no-overlap", sc_no_overlap, 16, 1 * MiB, 1},         /* 4 phases A B A B of 16 x 1 MiB H2D */
	{"big-and-trickle", sc_big_and_trickle, 64, 1 * MiB, 1}, /* 64 x 1 MiB H2D and 4 x 4 KiB */
	{"two-proc-lane", sc_two_proc_lane, 64, 1 * MiB, 1},     /* per process: 64 x 1 MiB H2D, in lockstep */
	{"tp-workers", sc_tp_workers, 4, 1 * MiB, 1}, /* ranks x (4 + 3) copies of 1 MiB, on three GPUs */
	{"inflight-serial", sc_inflight_serial, 8, 512 * KiB, 1}, /* 8 x 32 pages of 16 KiB, each waited for */
	{"inflight-queued", sc_inflight_queued, 8, 512 * KiB, 1}, /* the same, one sync per layer */
	{"callbench", sc_callbench, 1, 64, 0},
	{"launchbench", sc_launchbench, 1, 64, 0},
	{"layer-compute", sc_layer_compute, 8, 4 * MiB, 1},           /* 8 x 4 MiB H2D up front, 8 kernels of 1 ms */
	{"layer-compute-sync", sc_layer_compute_sync, 8, 4 * MiB, 1}, /* ... the load stream synchronized per layer */
	{"layer-compute-item", sc_layer_compute_item, 8, 4 * MiB, 1}, /* ... a 4-byte cudaMemcpy D2H per layer */
	{"decode-graphs", sc_decode_graphs, 1, 0, 1}, /* captured once; 300 x cudaGraphLaunch + 128 B D2H + sync */
	{"decode-loop", sc_decode_loop, 16, 4 * MiB, 1},             /* 60 steps: 4 small pageable H2D, 40 kernels, a D2H and a sync */
	{"decode-loop-loads", sc_decode_loop_loads, 16, 4 * MiB, 1}, /* ... and every 20 steps 16 x 4 MiB H2D, one event per layer */
	{"decode-item", sc_decode_item, 16, 4 * MiB, 1},             /* ... and per step a 4-byte cudaMemcpy D2H and a 128 B D2H */
	{"storage-load", sc_storage_load, 16, 2 * MiB, 1}, /* 16 x 2 MiB read from a file into the pool, each then H2D */
	{"storage-writeback", sc_storage_writeback, 64, 4 * MiB, 1}, /* 64 x 4 MiB read from a file beside 64 x 4 MiB D2H */
	{"replay", sc_replay, 1, 0, 1}, /* a trace's call stream (--script) */
	{NULL, NULL, 0, 0, 0},
};
