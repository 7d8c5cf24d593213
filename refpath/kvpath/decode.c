/*
 * Healthy decode loops (issue 20): what SGLang and vLLM run most of the time, each
 * designed to raise no WARN or FAIL (INFO allowed). The compute stream is the legacy
 * default stream, where a PyTorch forward runs unless told otherwise; its kernels are
 * the compute stand-in of computeoverlap.c (DL_KERNEL_NS each). Per decode step:
 *
 *   decode-loop        4 input-metadata H2D cudaMemcpyAsync of 64-512 B from fresh
 *                      malloc'ed (pageable) memory on the compute stream (what
 *                      torch.tensor(list).to(dev, non_blocking=True) does), 40 compute
 *                      launches on it, the sampled tokens back as a 148 B D2H
 *                      cudaMemcpyAsync into malloc'ed memory and one
 *                      cudaStreamSynchronize of the compute stream (.tolist()).
 *   decode-loop-loads  the same, and every DL_LOAD_EVERY steps (from the first) a
 *                      prefix-cache hit: --layers (16) layers of --layer-bytes (4 MiB)
 *                      H2D from a registered pool on a load stream, an event recorded
 *                      after each layer, and the compute stream waiting on layer l's
 *                      event (cudaStreamWaitEvent) before layer l's launches.
 *   decode-item        the decode loop, and per step a .item() (a 4-byte blocking
 *                      cudaMemcpy D2H, which waits for the step's kernels on the legacy
 *                      stream) and a 128 B pageable D2H cudaMemcpyAsync (logprobs)
 *                      before the step's synchronisation.
 *
 * --iterations is the number of steps (60). End line: steps, launches, loads (layered
 * load episodes).
 */
#include "calls.h"
#include "kvpath.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define DL_STEPS 60
#define DL_LAUNCHES 40         /* compute kernels per step */
#define DL_KERNEL_NS 25000ll   /* each: 25 us, a 1 ms step */
#define DL_LOAD_EVERY 20       /* a prefix-cache hit every 20 steps */
#define DL_TOKENS_BYTES 148    /* 37 sampled token ids */
#define DL_LOGPROBS_BYTES 128
#define DL_META_MAX 512

/* the four input-metadata tensors of a step: positions, sequence lengths, ... */
static const size_t meta_bytes[4] = {64, 192, 384, 512};

enum dl_shape { DL_PLAIN, DL_LOADS, DL_ITEM };

static struct truth_rec *copy_async(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, cudaStream_t s,
				    int layer)
{
	struct truth_rec *r = truth_copy("cudaMemcpyAsync", "copy", dst, src, n, kind, s, layer);
	TCALL(r, cudaMemcpyAsync(dst, src, n, kind, s));
	return r;
}

static int dl_run(const struct opts *o, struct result *res, enum dl_shape shape)
{
	long steps = o->iterations > 0 ? o->iterations : DL_STEPS;
	int layers = o->layers;
	size_t lb = o->layer_bytes, total = lb * (size_t)layers;
	cudaStream_t compute = NULL, load = NULL;
	char *meta_dev = dev_alloc(4 * DL_META_MAX), *tokens_dev = dev_alloc(DL_TOKENS_BYTES + DL_LOGPROBS_BYTES + 4);
	memset(tokens_dev, 0x7b, DL_TOKENS_BYTES + DL_LOGPROBS_BYTES + 4);
	char *pool = NULL, *kv = NULL;
	cudaEvent_t *ev = NULL;
	if (shape == DL_LOADS) {
		pool = pinned_pool(total, 0x4d);
		kv = dev_alloc(total);
		CHECK(cudaStreamCreateWithFlags(&load, cudaStreamNonBlocking));
		ev = calloc((size_t)layers, sizeof *ev);
		for (int l = 0; l < layers; l++)
			CHECK(cudaEventCreateWithFlags(&ev[l], cudaEventDisableTiming));
	}
	hold_point(o);

	int bad = 0, loads = 0;
	long launches = 0;
	for (long step = 0; step < steps; step++) {
		int loading = shape == DL_LOADS && step % DL_LOAD_EVERY == 0;
		if (loading) { /* the prefix-cache hit: every layer's KV, an event after each */
			for (int l = 0; l < layers; l++) {
				copy_async(kv + (size_t)l * lb, pool + (size_t)l * lb, lb, cudaMemcpyHostToDevice, load, l);
				event_record(ev[l], load, l);
			}
			loads++;
		}
		/* the step's inputs: fresh CPU tensors, copied non_blocking from pageable memory */
		char *meta[4];
		for (int i = 0; i < 4; i++) {
			meta[i] = malloc(meta_bytes[i]);
			if (!meta[i])
				return 1;
			memset(meta[i], (int)(step + i), meta_bytes[i]);
			copy_async(meta_dev + i * DL_META_MAX, meta[i], meta_bytes[i], cudaMemcpyHostToDevice, compute, -1);
		}
		/* the forward: layer l's launches wait for layer l's KV when it is loading */
		int waited = -1;
		for (int k = 0; k < DL_LAUNCHES; k++) {
			int layer = loading ? k * layers / DL_LAUNCHES : -1;
			if (loading && layer != waited) {
				stream_wait_event(compute, ev[layer], layer);
				waited = layer;
			}
			compute_launch(meta_dev, compute, layer, DL_KERNEL_NS);
			launches++;
		}
		char *tokens = malloc(DL_TOKENS_BYTES), *logprobs = malloc(DL_LOGPROBS_BYTES);
		int32_t value = 0;
		if (!tokens || !logprobs)
			return 1;
		if (shape == DL_ITEM) {
			struct truth_rec *r = truth_copy("cudaMemcpy", "copy", &value, tokens_dev + DL_TOKENS_BYTES + DL_LOGPROBS_BYTES,
							 4, cudaMemcpyDeviceToHost, NULL, -1);
			TCALL(r, cudaMemcpy(&value, tokens_dev + DL_TOKENS_BYTES + DL_LOGPROBS_BYTES, 4, cudaMemcpyDeviceToHost));
			copy_async(logprobs, tokens_dev + DL_TOKENS_BYTES, DL_LOGPROBS_BYTES, cudaMemcpyDeviceToHost, compute, -1);
		}
		copy_async(tokens, tokens_dev, DL_TOKENS_BYTES, cudaMemcpyDeviceToHost, compute, -1);
		stream_sync(compute, NULL); /* .tolist() */
		if (memcmp(tokens, tokens_dev, DL_TOKENS_BYTES) ||
		    (shape == DL_ITEM && (memcmp(logprobs, tokens_dev + DL_TOKENS_BYTES, DL_LOGPROBS_BYTES) ||
					  memcmp(&value, tokens_dev + DL_TOKENS_BYTES + DL_LOGPROBS_BYTES, 4)))) {
			fprintf(stderr, "kvpath: decode step %ld read back other bytes than the device holds\n", step);
			bad = 1;
		}
		for (int i = 0; i < 4; i++) {
			if (memcmp(meta_dev + i * DL_META_MAX, meta[i], meta_bytes[i])) {
				fprintf(stderr, "kvpath: decode step %ld: metadata %d not on the device\n", step, i);
				bad = 1;
			}
			free(meta[i]);
		}
		free(tokens);
		free(logprobs);
	}
	if (shape == DL_LOADS) {
		stream_sync(load, NULL);
		if (memcmp(kv, pool, total)) {
			fprintf(stderr, "kvpath: decode-loop-loads: the loaded KV differs from the pool\n");
			bad = 1;
		}
		for (int l = 0; l < layers; l++)
			CHECK(cudaEventDestroy(ev[l]));
		free(ev);
		CHECK(cudaStreamDestroy(load));
		dev_free(kv);
		host_unregister(pool);
		munmap(pool, total);
	}
	snprintf(res->extra, sizeof res->extra, "\"steps\":%ld,\"launches\":%ld,\"loads\":%d", steps, launches, loads);
	dev_free(meta_dev);
	dev_free(tokens_dev);
	return bad;
}

int sc_decode_loop(const struct opts *o, struct result *res) { return dl_run(o, res, DL_PLAIN); }
int sc_decode_loop_loads(const struct opts *o, struct result *res) { return dl_run(o, res, DL_LOADS); }
int sc_decode_item(const struct opts *o, struct result *res) { return dl_run(o, res, DL_ITEM); }
