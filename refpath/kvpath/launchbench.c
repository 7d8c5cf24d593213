/*
 * launchbench: the cost of one kernel launch through the reference runtime and driver
 * (cudaLaunchKernel of an empty kernel: cuLaunchKernel, the parameters copied, the
 * launch queued on the stream), for `make bench` to measure a launch probe against.
 * The kernel is registered as nvcc registers one (a fatbin and its host stub).
 */
#include "kvpath.h"
#include <stdio.h>
#include <stdlib.h>

static void noop_device(const struct refcudaKernelLaunch *l, void *const *params)
{
	(void)l, (void)params;
}

static const struct refcudaImageKernel kernels[] = {{.name = "_Z4noopi", .fn = noop_device, .nparams = 1, .param_size = {4}}};
static const struct refcudaImage image = {.magic = REFCUDA_IMAGE_MAGIC, .count = 1, .kernels = kernels};
static const __fatBinC_Wrapper_t fatbin = {.magic = FATBINC_MAGIC, .version = 1, .data = (const unsigned long long *)&image};

/* void noop(int): its host stub, under its mangled name */
__attribute__((noinline, used)) void noop_stub(int x) __asm__("_Z4noopi");
void noop_stub(int x)
{
	(void)x;
}

static void **handle;

__attribute__((constructor)) static void register_noop(void)
{
	handle = __cudaRegisterFatBinary((void *)&fatbin);
	if (handle) {
		__cudaRegisterFunction(handle, (const char *)noop_stub, "_Z4noopi", "_Z4noopi", -1, NULL, NULL, NULL, NULL, NULL);
		__cudaRegisterFatBinaryEnd(handle);
	}
}

int sc_launchbench(const struct opts *o, struct result *res)
{
	long n = o->iterations ? o->iterations : 100000;
	cudaStream_t s;
	int x = 1;
	void *args[] = {&x};
	dim3 g = {1, 1, 1}, b = {32, 1, 1};
	CHECK(cudaStreamCreate(&s));
	CHECK(cudaLaunchKernel((const void *)noop_stub, g, b, args, 0, s)); /* warm up: module, function, engine */
	CHECK(cudaStreamSynchronize(s));
	hold_point(o);

	uint64_t sync_ns = 0, t0 = truth_now_ns();
	for (long i = 0; i < n; i++) {
		if (cudaLaunchKernel((const void *)noop_stub, g, b, args, 0, s) != cudaSuccess) {
			fprintf(stderr, "kvpath: launchbench launch %ld failed\n", i);
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
	printf("{\"calls\":%ld,\"ns_per_call\":%.1f,\"enqueue_ns_per_call\":%.1f}\n", n, per, enq);
	fflush(stdout);
	snprintf(res->extra, sizeof res->extra, "\"bench_calls\":%ld,\"ns_per_call\":%.1f,\"enqueue_ns_per_call\":%.1f", n,
		 per, enq);
	CHECK(cudaStreamDestroy(s));
	return 0;
}
