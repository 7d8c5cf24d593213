/*
 * link-trains-up (docs/design.md 6, issue 11): an idle GPU link that trains up under
 * load. Real GPUs lower their link's speed and width when idle ("These may be reduced
 * when the GPU is not in use", nvidia-smi; the samples' idle GPUs read Gen1) and train
 * back up as soon as traffic comes, so a capacity read at an idle moment is not the
 * link's. Run it with LW_REF_GPU=<name> (shared lanes, stamped busy while used) and
 * read the GPU through the NVML stand-in with LW_REF_NVML_IDLE_LINK set: the stand-in
 * reports the idle state while the lanes are idle and the loaded state
 * (LW_REF_NVML_LINK, by default the max) while they carry traffic.
 *
 * Setup (two registered pools, device buffers, two streams) moves nothing on the
 * lanes, then the --hold point. After it, `iterations` rounds (16 by default), each
 * `layers` H2D copies of layer_bytes on each of two streams at once (2 x 32 x 4 MiB),
 * then a sync of both: two flows on one inbound lane, as in h2d-overlap, for long
 * enough (4 GiB, about a second on the default 4 GB/s lane) to be read while busy.
 * End line: lane_bytes (the lane counters' increase), copy_bytes, traffic_ns (first
 * copy to last sync) and rounds.
 */
#include "calls.h"
#include "kvpath.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static void lt_copy(void *dst, const void *src, size_t n, cudaStream_t s, int layer)
{
	struct truth_rec *r = truth_copy("cudaMemcpyAsync", "copy", dst, src, n, cudaMemcpyHostToDevice, s, layer);
	TCALL(r, cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, s));
}

int sc_link_trains_up(const struct opts *o, struct result *res)
{
	size_t lb = o->layer_bytes, total = lb * (size_t)o->layers;
	long rounds = o->iterations > 0 ? o->iterations : 16;
	char *a = pinned_pool(total, 0x51), *b = pinned_pool(total, 0x52);
	char *da = dev_alloc(total), *db = dev_alloc(total);
	cudaStream_t s1, s2;
	CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
	CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
	hold_point(o);

	uint64_t in0 = refcudaLaneBytes(1), out0 = refcudaLaneBytes(0), t0 = truth_now_ns(), copied = 0;
	for (long k = 0; k < rounds; k++) {
		for (int i = 0; i < o->layers; i++) {
			lt_copy(da + (size_t)i * lb, a + (size_t)i * lb, lb, s1, i);
			lt_copy(db + (size_t)i * lb, b + (size_t)i * lb, lb, s2, i);
			copied += 2 * lb;
		}
		stream_sync(s1, NULL);
		stream_sync(s2, NULL);
	}
	uint64_t t1 = truth_now_ns(), lin = refcudaLaneBytes(1) - in0, lout = refcudaLaneBytes(0) - out0;
	int bad = 0;
	if (memcmp(da, a, total) || memcmp(db, b, total)) {
		fprintf(stderr, "link-trains-up: data mismatch after the copies\n");
		bad = 1;
	}
	/* shared lanes may carry other processes' bytes too, never fewer than ours */
	if (lin < copied) {
		fprintf(stderr, "link-trains-up: the inbound lane counted %llu bytes, the copies moved %llu\n",
			(unsigned long long)lin, (unsigned long long)copied);
		bad = 1;
	}
	double gbps = t1 > t0 ? (double)copied / (double)(t1 - t0) : 0;
	fprintf(stderr, "link-trains-up: %ld rounds, %llu bytes H2D on two streams in %.3f s (%.2f GB/s)\n", rounds,
		(unsigned long long)copied, (double)(t1 - t0) / 1e9, gbps);
	snprintf(res->extra, sizeof res->extra,
		 "\"lane_bytes\":{\"h2d\":%llu,\"d2h\":%llu},\"copy_bytes\":{\"h2d\":%llu,\"d2h\":0},\"traffic_ns\":%llu,"
		 "\"rounds\":%ld",
		 (unsigned long long)lin, (unsigned long long)lout, (unsigned long long)copied,
		 (unsigned long long)(t1 - t0), rounds);

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
