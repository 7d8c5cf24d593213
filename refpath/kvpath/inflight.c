/*
 * inflight-serial and inflight-queued: the two ways to load the same small pages
 * (docs/design.md 6; seed 002 §8.3). A page-first KV layout's layer is many small
 * pages; a loader moves 8 layers of 32 pages of 16 KiB from a registered host pool
 * into the GPU on a load stream.
 *
 *   inflight-serial  waits for every page: cudaMemcpyAsync then cudaStreamSynchronize,
 *                    one copy in flight at a time, each paying the copy engine's
 *                    turnaround (RC_COPY_TURNAROUND_NS, driver/internal.h) with the
 *                    lane idle meanwhile: too-little-in-flight.
 *   inflight-queued  queues a layer's pages and synchronises once per layer: the
 *                    engine overlaps each turnaround with the bytes of the copies
 *                    before it. (No event per layer: a synchronisation drains the
 *                    stream each layer, so the agent's layer count would restart.)
 */
#include "calls.h"
#include "kvpath.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define PAGE_BYTES (16u * 1024u)

static void page_copy(char *dst, const char *src, cudaStream_t s, int layer)
{
	struct truth_rec *r = truth_copy("cudaMemcpyAsync", "copy", dst, src, PAGE_BYTES, cudaMemcpyHostToDevice, s, layer);
	TCALL(r, cudaMemcpyAsync(dst, src, PAGE_BYTES, cudaMemcpyHostToDevice, s));
}

static int pages_load(const struct opts *o, int serial)
{
	size_t per_layer = o->layer_bytes / PAGE_BYTES, total = o->layer_bytes * (size_t)o->layers;
	char *pool = pinned_pool(total, 0x3c), *dev = dev_alloc(total);
	cudaStream_t load;
	CHECK(cudaStreamCreateWithFlags(&load, cudaStreamNonBlocking));
	hold_point(o);

	submit_as_mover(serial); /* serial: one copy after another, no scheduler's gap between them */
	for (int l = 0; l < o->layers; l++) {
		for (size_t p = 0; p < per_layer; p++) {
			size_t off = (size_t)l * o->layer_bytes + p * PAGE_BYTES;
			page_copy(dev + off, pool + off, load, l);
			if (serial)
				stream_sync(load, NULL);
		}
		if (!serial)
			stream_sync(load, NULL);
	}
	submit_as_mover(0);
	int bad = memcmp(dev, pool, total) != 0;
	if (bad)
		fprintf(stderr, "kvpath: data mismatch after the page load\n");
	CHECK(cudaStreamDestroy(load));
	dev_free(dev);
	host_unregister(pool);
	munmap(pool, total);
	return bad;
}

int sc_inflight_serial(const struct opts *o, struct result *res)
{
	(void)res;
	return pages_load(o, 1);
}

int sc_inflight_queued(const struct opts *o, struct result *res)
{
	(void)res;
	return pages_load(o, 0);
}
