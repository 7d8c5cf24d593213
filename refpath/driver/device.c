/*
 * Devices and contexts of the reference driver, with the semantics of NVIDIA's
 * (CUDA Driver API, "Device Management", "Primary Context Management", "Context
 * Management"):
 *  - a CUdevice is the device's ordinal (lane.c: LW_REF_GPUS, or one GPU);
 *  - each device has one primary context, a stable handle that
 *    cuDevicePrimaryCtxRetain returns and counts, without making it current;
 *  - each thread has a context stack: cuCtxSetCurrent replaces its top (pushes onto
 *    an empty stack; NULL pops), cuCtxPushCurrent pushes, cuCtxPopCurrent pops and
 *    returns what it popped, cuCtxCreate pushes a new context, cuCtxDestroy destroys
 *    a non-primary context and pops it from the calling thread where current;
 *  - cuMemAlloc allocates on the device of the context current on the calling
 *    thread (mem.c): the device of each allocation is kept here, and a copy takes
 *    the lanes of the device owning its device side (lane.c).
 */
#include "internal.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CTX_MAGIC 0x43545831u /* "CTX1" */
#define MAX_DEVICES 8
#define STACK_MAX 32

struct CUctx_st {
	uint32_t magic;
	int dev;
	int primary;
	int retains; /* primary: retains minus releases */
};

static struct CUctx_st primaries[MAX_DEVICES];
static pthread_mutex_t ctx_mu = PTHREAD_MUTEX_INITIALIZER;
static __thread CUcontext stack[STACK_MAX];
static __thread int depth;

static int valid_device(CUdevice dev)
{
	return dev >= 0 && dev < rc_device_count() && dev < MAX_DEVICES;
}

static int valid_ctx(CUcontext c)
{
	return c && __atomic_load_n(&c->magic, __ATOMIC_ACQUIRE) == CTX_MAGIC;
}

int rc_current_device(void)
{
	return depth > 0 && valid_ctx(stack[depth - 1]) ? stack[depth - 1]->dev : -1;
}

RC_API CUresult cuDeviceGetCount(int *count)
{
	RC_GATE();
	if (!count)
		return CUDA_ERROR_INVALID_VALUE;
	*count = rc_device_count();
	return CUDA_SUCCESS;
}

RC_API CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
	RC_GATE();
	if (!device)
		return CUDA_ERROR_INVALID_VALUE;
	if (!valid_device(ordinal))
		return CUDA_ERROR_INVALID_DEVICE;
	*device = ordinal;
	return CUDA_SUCCESS;
}

/* "[domain]:[bus]:[device].[function]" in hex (cuda.h), 13 bytes with the NUL. */
RC_API CUresult cuDeviceGetPCIBusId(char *pciBusId, int len, CUdevice dev)
{
	RC_GATE();
	if (!pciBusId || len < 13)
		return CUDA_ERROR_INVALID_VALUE;
	if (!valid_device(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	unsigned int domain, bus;
	refcudaGPUIdentity(rc_device_name(dev), &domain, &bus);
	snprintf(pciBusId, (size_t)len, "%04X:%02X:00.0", domain, bus);
	return CUDA_SUCCESS;
}

RC_API int refcudaDeviceBusId(int dev, char *buf, size_t len)
{
	rc_init();
	if (!valid_device(dev) || !buf)
		return -1;
	unsigned int domain, bus;
	refcudaGPUIdentity(rc_device_name(dev), &domain, &bus);
	snprintf(buf, len, "%04x:%02x:00.0", domain, bus);
	return 0;
}

RC_API CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
	RC_GATE();
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	if (!valid_device(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	struct CUctx_st *c = &primaries[dev];
	pthread_mutex_lock(&ctx_mu);
	c->dev = dev;
	c->primary = 1;
	c->retains++;
	__atomic_store_n(&c->magic, CTX_MAGIC, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&ctx_mu);
	*pctx = c;
	return CUDA_SUCCESS;
}

/* The primary context stays valid (its handle is stable) when released: nothing
 * here holds device state that would need tearing down. */
RC_API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
	RC_GATE();
	if (!valid_device(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	CUresult rc = CUDA_SUCCESS;
	pthread_mutex_lock(&ctx_mu);
	if (primaries[dev].retains > 0)
		primaries[dev].retains--;
	else
		rc = CUDA_ERROR_INVALID_CONTEXT;
	pthread_mutex_unlock(&ctx_mu);
	return rc;
}

static CUresult push(CUcontext c)
{
	if (depth == STACK_MAX)
		return CUDA_ERROR_OUT_OF_MEMORY;
	stack[depth++] = c;
	return CUDA_SUCCESS;
}

RC_API CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
	RC_GATE();
	(void)flags;
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	if (!valid_device(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	if (depth == STACK_MAX)
		return CUDA_ERROR_OUT_OF_MEMORY;
	struct CUctx_st *c = calloc(1, sizeof *c);
	if (!c)
		return CUDA_ERROR_OUT_OF_MEMORY;
	c->dev = dev;
	__atomic_store_n(&c->magic, CTX_MAGIC, __ATOMIC_RELEASE);
	*pctx = c;
	return push(c);
}

/* A destroyed context's memory is kept (another thread may still name it): only its
 * magic goes, so it is refused from then on. */
RC_API CUresult cuCtxDestroy_v2(CUcontext ctx)
{
	RC_GATE();
	if (!valid_ctx(ctx) || ctx->primary)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (depth > 0 && stack[depth - 1] == ctx)
		depth--;
	__atomic_store_n(&ctx->magic, 0, __ATOMIC_RELEASE);
	return CUDA_SUCCESS;
}

RC_API CUresult cuCtxSetCurrent(CUcontext ctx)
{
	RC_GATE();
	if (!ctx) {
		if (depth > 0)
			depth--;
		return CUDA_SUCCESS;
	}
	if (!valid_ctx(ctx))
		return CUDA_ERROR_INVALID_CONTEXT;
	if (depth == 0)
		return push(ctx);
	stack[depth - 1] = ctx;
	return CUDA_SUCCESS;
}

RC_API CUresult cuCtxGetCurrent(CUcontext *pctx)
{
	RC_GATE();
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	*pctx = depth > 0 ? stack[depth - 1] : NULL;
	return CUDA_SUCCESS;
}

RC_API CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
	RC_GATE();
	if (!valid_ctx(ctx))
		return CUDA_ERROR_INVALID_CONTEXT;
	return push(ctx);
}

RC_API CUresult cuCtxPopCurrent_v2(CUcontext *pctx)
{
	RC_GATE();
	if (depth == 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	CUcontext c = stack[--depth];
	if (pctx)
		*pctx = c;
	return CUDA_SUCCESS;
}

RC_API CUresult cuCtxGetDevice(CUdevice *device)
{
	RC_GATE();
	if (!device)
		return CUDA_ERROR_INVALID_VALUE;
	int d = rc_current_device();
	if (d < 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	*device = d;
	return CUDA_SUCCESS;
}

/* ---- the device of each device allocation ---- */

struct owned {
	uintptr_t base;
	size_t len;
	int dev;
};
static struct {
	pthread_rwlock_t rw;
	struct owned *v;
	size_t n, cap;
} own = {.rw = PTHREAD_RWLOCK_INITIALIZER};

void rc_note_alloc(const void *p, size_t len, int dev)
{
	pthread_rwlock_wrlock(&own.rw);
	if (own.n == own.cap) {
		size_t cap = own.cap ? 2 * own.cap : 64;
		struct owned *v = realloc(own.v, cap * sizeof *v);
		if (!v) {
			pthread_rwlock_unlock(&own.rw);
			return; /* its copies take device 0's lanes */
		}
		own.v = v;
		own.cap = cap;
	}
	own.v[own.n++] = (struct owned){(uintptr_t)p, len, dev};
	pthread_rwlock_unlock(&own.rw);
}

void rc_note_free(const void *p)
{
	pthread_rwlock_wrlock(&own.rw);
	for (size_t i = 0; i < own.n; i++)
		if (own.v[i].base == (uintptr_t)p) {
			own.v[i] = own.v[--own.n];
			break;
		}
	pthread_rwlock_unlock(&own.rw);
}

int rc_device_of(const void *p)
{
	uintptr_t a = (uintptr_t)p;
	int dev = -1;
	pthread_rwlock_rdlock(&own.rw);
	for (size_t i = 0; i < own.n; i++)
		if (a >= own.v[i].base && a - own.v[i].base < own.v[i].len) {
			dev = own.v[i].dev;
			break;
		}
	pthread_rwlock_unlock(&own.rw);
	return dev;
}
