/*
 * kvdl --lib PATH --truth FILE [--copies N] [--interval-ms M]
 *
 * Like a Python framework loading CUDA at run time: not linked to the runtime, it
 * dlopen()s PATH and resolves every function with dlsym. Registers a pool, then
 * makes N H2D cudaMemcpyAsync copies of 64 KiB, synchronising after each and
 * sleeping M ms in between (an observer can attach while it runs).
 */
#include "refcuda.h"
#include "truth.h"
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define COPY_BYTES (64u * 1024u)
#define POOL_BYTES (4u * 1024u * 1024u)

struct rt {
	cudaError_t (*HostRegister)(void *, size_t, unsigned int);
	cudaError_t (*HostUnregister)(void *);
	cudaError_t (*Malloc)(void **, size_t);
	cudaError_t (*Free)(void *);
	cudaError_t (*StreamCreate)(cudaStream_t *);
	cudaError_t (*StreamDestroy)(cudaStream_t);
	cudaError_t (*StreamSynchronize)(cudaStream_t);
	cudaError_t (*MemcpyAsync)(void *, const void *, size_t, enum cudaMemcpyKind, cudaStream_t);
};

static void *sym(void *h, const char *name)
{
	void *p = dlsym(h, name);
	if (!p) {
		fprintf(stderr, "kvdl: %s: %s\n", name, dlerror());
		exit(1);
	}
	return p;
}

static long num(const char *flag, const char *v)
{
	char *end;
	errno = 0;
	long n = strtol(v ? v : "", &end, 0);
	if (!v || errno || end == v || *end || n < 0) {
		fprintf(stderr, "kvdl: %s wants a number, got %s\n", flag, v ? v : "nothing");
		exit(2);
	}
	return n;
}

int main(int argc, char **argv)
{
	const char *lib = NULL, *truth = NULL;
	long copies = 200, interval_ms = 10, settle_ms = 0;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (!strcmp(a, "--lib") && v)
			lib = argv[++i];
		else if (!strcmp(a, "--truth") && v)
			truth = argv[++i];
		else if (!strcmp(a, "--copies"))
			copies = num(a, v), i++;
		else if (!strcmp(a, "--interval-ms"))
			interval_ms = num(a, v), i++;
		else if (!strcmp(a, "--settle-ms"))
			settle_ms = num(a, v), i++;
		else {
			fprintf(stderr, "usage: kvdl --lib PATH --truth FILE [--copies N] [--interval-ms M] [--settle-ms S]\n");
			return 2;
		}
	}
	if (!lib || !truth) {
		fprintf(stderr, "usage: kvdl --lib PATH --truth FILE [--copies N] [--interval-ms M] [--settle-ms S]\n");
		return 2;
	}
	void *h = dlopen(lib, RTLD_NOW);
	if (!h) {
		fprintf(stderr, "kvdl: dlopen %s: %s\n", lib, dlerror());
		return 1;
	}
	/* --settle-ms: pause between dlopen and the first call, as a server that
	 * loads CUDA then spends time on setup would; gives an observer time to attach */
	if (settle_ms > 0) {
		struct timespec st = {settle_ms / 1000, (settle_ms % 1000) * 1000000L};
		nanosleep(&st, NULL);
	}
	struct rt rt = {
		.HostRegister = (cudaError_t(*)(void *, size_t, unsigned int))sym(h, "cudaHostRegister"),
		.HostUnregister = (cudaError_t(*)(void *))sym(h, "cudaHostUnregister"),
		.Malloc = (cudaError_t(*)(void **, size_t))sym(h, "cudaMalloc"),
		.Free = (cudaError_t(*)(void *))sym(h, "cudaFree"),
		.StreamCreate = (cudaError_t(*)(cudaStream_t *))sym(h, "cudaStreamCreate"),
		.StreamDestroy = (cudaError_t(*)(cudaStream_t))sym(h, "cudaStreamDestroy"),
		.StreamSynchronize = (cudaError_t(*)(cudaStream_t))sym(h, "cudaStreamSynchronize"),
		.MemcpyAsync = (cudaError_t(*)(void *, const void *, size_t, enum cudaMemcpyKind, cudaStream_t))sym(
			h, "cudaMemcpyAsync"),
	};
	/* engine times come from the driver the runtime pulled in (dlsym searches its dependencies) */
	truth_init("dlopen", (truth_set_records_fn)dlsym(h, "refcudaSetCopyRecords"));

	char *pool = mmap(NULL, POOL_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	if (pool == MAP_FAILED) {
		perror("mmap");
		return 1;
	}
	memset(pool, 0x3c, POOL_BYTES);
	struct truth_rec *r = truth_new("cudaHostRegister", "host_register");
	r->ptr = (uintptr_t)pool;
	r->size = POOL_BYTES;
	r->has_flags = 1;
	TCALL(r, rt.HostRegister(pool, POOL_BYTES, 0));
	truth_note_mem(pool, POOL_BYTES, MEM_PINNED, 0);

	void *dev = NULL;
	r = truth_new("cudaMalloc", "device_alloc");
	r->size = POOL_BYTES;
	TCALL(r, rt.Malloc(&dev, POOL_BYTES));
	r->ptr = (uintptr_t)dev;
	truth_note_mem(dev, POOL_BYTES, MEM_DEVICE, 0);
	cudaStream_t s;
	CHECK(rt.StreamCreate(&s));

	const size_t slots = POOL_BYTES / COPY_BYTES;
	for (long i = 0; i < copies; i++) {
		size_t off = (size_t)i % slots * COPY_BYTES;
		r = truth_copy("cudaMemcpyAsync", "copy", (char *)dev + off, pool + off, COPY_BYTES,
			       cudaMemcpyHostToDevice, s, -1);
		TCALL(r, rt.MemcpyAsync((char *)dev + off, pool + off, COPY_BYTES, cudaMemcpyHostToDevice, s));
		r = truth_new("cudaStreamSynchronize", "stream_sync");
		r->stream = (uintptr_t)s;
		r->has_stream = 1;
		TCALL(r, rt.StreamSynchronize(s));
		if (interval_ms && i + 1 < copies) {
			struct timespec ts = {interval_ms / 1000, (interval_ms % 1000) * 1000000L};
			while (nanosleep(&ts, &ts) == -1 && errno == EINTR)
				;
		}
	}
	int bad = copies && memcmp(dev, pool, copies < (long)slots ? (size_t)copies * COPY_BYTES : POOL_BYTES) != 0;
	if (bad)
		fprintf(stderr, "kvdl: data mismatch\n");

	CHECK(rt.StreamDestroy(s));
	r = truth_new("cudaFree", "device_free");
	r->ptr = (uintptr_t)dev;
	TCALL(r, rt.Free(dev));
	r = truth_new("cudaHostUnregister", "host_unregister");
	r->ptr = (uintptr_t)pool;
	TCALL(r, rt.HostUnregister(pool));
	munmap(pool, POOL_BYTES);
	if (truth_write(truth, "") != 0)
		return 1;
	return bad;
}
