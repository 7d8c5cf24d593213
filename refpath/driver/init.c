/*
 * Process-wide initialisation of the reference driver: read the environment once.
 *
 * cuInit is the gate, as on the real driver: until one succeeds every other cu*
 * entry point returns CUDA_ERROR_NOT_INITIALIZED (3). With LW_REF_NO_DEVICE=1 cuInit
 * fails with CUDA_ERROR_NO_DEVICE (100) every time it is called, like a machine with
 * no GPU, and the driver never becomes usable.
 */
#include "internal.h"
#include <stdlib.h>
#include <string.h>

static pthread_once_t once = PTHREAD_ONCE_INIT;
static int rc_ready; /* a cuInit has succeeded */
/* calls into exported cu* entry points, per thread (no locked add on the fast path) */
static __thread unsigned long long rc_calls __attribute__((tls_model("initial-exec")));

static double env_double(const char *name, double def)
{
	const char *v = getenv(name);
	if (!v || !*v)
		return def;
	char *end;
	double d = strtod(v, &end);
	return (end != v && d > 0) ? d : def;
}

static void do_init(void)
{
	double mb = env_double("LW_REF_DEVICE_MB", 512);
	rc_mem_init((size_t)(mb * 1024 * 1024));
	rc_lane_init(env_double("LW_REF_H2D_GBPS", 4), env_double("LW_REF_D2H_GBPS", 4));
	rc_streams_init();
}

/* Every entry point calls this; after the first call it is one load and a branch. */
void rc_init(void)
{
	pthread_once(&once, do_init);
}

/* A call, not inlined: keeps cuInit's first instruction its push %rbp. */
__attribute__((noinline)) static void count_call(void)
{
	rc_calls++;
}

/* The gate of every other entry point (internal.h). */
__attribute__((noinline)) CUresult rc_enter(void)
{
	rc_calls++;
	return __builtin_expect(__atomic_load_n(&rc_ready, __ATOMIC_ACQUIRE), 1) ? CUDA_SUCCESS
										    : CUDA_ERROR_NOT_INITIALIZED;
}

static int no_device(void)
{
	const char *v = getenv("LW_REF_NO_DEVICE");
	return v && *v && strcmp(v, "0") != 0;
}

RC_API CUresult cuInit(unsigned int Flags)
{
	count_call();
	if (Flags != 0)
		return CUDA_ERROR_INVALID_VALUE;
	if (no_device())
		return CUDA_ERROR_NO_DEVICE;
	rc_init();
	__atomic_store_n(&rc_ready, 1, __ATOMIC_RELEASE);
	return CUDA_SUCCESS;
}

RC_API unsigned long long refcudaDriverCalls(void)
{
	return rc_calls;
}
