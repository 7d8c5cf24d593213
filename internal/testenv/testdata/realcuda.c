/*
 * Calls NVIDIA's real CUDA runtime or driver, loaded with dlopen, on a host
 * without a GPU: every call fails, and the agent must report each one with
 * its error. Prints one JSON line per call (api, result, bytes, tid) on
 * stdout (bytes: what a copy moves or an allocation asks for), the truth the
 * test compares the agent's records with.
 *
 *   realcuda runtime LIBCUDART   cudaGetDeviceCount, then "ready" and a wait
 *                                for a line on stdin, then memory and copies
 *   realcuda driver LIBCUDA      cuInit, then the driver's copy entry points
 *   realcuda bench LIBCUDA N     N calls of cuMemcpyHtoD_v2 without cuInit (each
 *                                fails fast with 3): {"ns_per_call":X}, for
 *                                make bench
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define MiB (1u << 20)

static void *lib;

static void *sym(const char *name)
{
	void *f = dlsym(lib, name);
	if (!f) {
		fprintf(stderr, "realcuda: %s: %s\n", name, dlerror());
		exit(2);
	}
	return f;
}

static void record(const char *api, int result, size_t bytes)
{
	printf("{\"api\":\"%s\",\"result\":%d,\"bytes\":%zu,\"tid\":%ld}\n", api, result, bytes,
	       (long)syscall(SYS_gettid));
	fflush(stdout);
}

/* CALL(api, bytes, args): calls api through its dlsym'd pointer and records it. */
#define CALL(type, api, bytes, ...) record(#api, ((type)sym(#api))(__VA_ARGS__), bytes)

typedef int (*fn_i)(int *);
typedef int (*fn_alloc)(void **, size_t);
typedef int (*fn_reg)(void *, size_t, unsigned);
typedef int (*fn_copy)(void *, const void *, size_t, int);
typedef int (*fn_copy_async)(void *, const void *, size_t, int, void *);
typedef int (*fn_copy2d)(void *, size_t, const void *, size_t, size_t, size_t, int);
typedef int (*fn_sync)(void *);
typedef int (*fn_init)(unsigned);
typedef int (*fn_htod)(uint64_t, const void *, size_t);
typedef int (*fn_dtoh)(void *, uint64_t, size_t);
typedef int (*fn_htod_async)(uint64_t, const void *, size_t, void *);
typedef int (*fn_memalloc)(uint64_t *, size_t);

static int runtime(void)
{
	int n = -1;
	CALL(fn_i, cudaGetDeviceCount, 0, &n);
	printf("ready\n");
	fflush(stdout);
	char line[16];
	if (!fgets(line, sizeof line, stdin))
		return 1;

	char *host = malloc(8 * MiB);
	memset(host, 1, 8 * MiB);
	void *dev = NULL, *pinned = NULL;
	CALL(fn_alloc, cudaMalloc, 1 * MiB, &dev, 1 * MiB);
	CALL(fn_alloc, cudaMallocHost, 1 * MiB, &pinned, 1 * MiB);
	CALL(fn_reg, cudaHostRegister, 4 * MiB, host, 4 * MiB, 0);
	CALL(fn_copy, cudaMemcpy, 1 * MiB, dev, host, 1 * MiB, 1);
	CALL(fn_copy_async, cudaMemcpyAsync, 2 * MiB, dev, host, 2 * MiB, 1, NULL);
	CALL(fn_copy_async, cudaMemcpyAsync, 3 * MiB, host, dev, 3 * MiB, 2, NULL);
	CALL(fn_copy2d, cudaMemcpy2D, 4 * 4096, dev, 8192, host, 8192, 4096, 4, 1);
	CALL(fn_sync, cudaStreamSynchronize, 0, NULL);
	return 0;
}

static int driver(void)
{
	char *host = malloc(4 * MiB);
	memset(host, 1, 4 * MiB);
	uint64_t dev = 0;
	CALL(fn_init, cuInit, 0, 0);
	CALL(fn_memalloc, cuMemAlloc_v2, 1 * MiB, &dev, 1 * MiB);
	CALL(fn_htod, cuMemcpyHtoD_v2, 1 * MiB, 0x1000, host, 1 * MiB);
	CALL(fn_dtoh, cuMemcpyDtoH_v2, 2 * MiB, host, 0x1000, 2 * MiB);
	CALL(fn_htod_async, cuMemcpyHtoDAsync_v2, 3 * MiB, 0x1000, host, 3 * MiB, NULL);
	return 0;
}

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int bench(long n)
{
	static char host[64];
	fn_htod copy = (fn_htod)sym("cuMemcpyHtoD_v2");
	if (copy(0x1000, host, sizeof host) != 3) { /* warm up: PLT, page faults */
		fprintf(stderr, "realcuda: cuMemcpyHtoD_v2 before cuInit did not return 3\n");
		return 1;
	}
	uint64_t t0 = now_ns();
	for (long i = 0; i < n; i++)
		copy(0x1000, host, sizeof host);
	printf("{\"calls\":%ld,\"ns_per_call\":%.1f}\n", n, (double)(now_ns() - t0) / (double)n);
	return 0;
}

int main(int argc, char **argv)
{
	int is_bench = argc == 4 && !strcmp(argv[1], "bench");
	if (!is_bench && (argc != 3 || (strcmp(argv[1], "runtime") && strcmp(argv[1], "driver")))) {
		fprintf(stderr, "usage: realcuda runtime LIBCUDART | realcuda driver LIBCUDA | realcuda bench LIBCUDA N\n");
		return 2;
	}
	lib = dlopen(argv[2], RTLD_NOW | RTLD_GLOBAL);
	if (!lib) {
		fprintf(stderr, "realcuda: %s\n", dlerror());
		return 2;
	}
	if (is_bench)
		return bench(atol(argv[3]));
	return strcmp(argv[1], "runtime") ? driver() : runtime();
}
