/*
 * drvcheck: direct checks of the reference driver's entry points that no scenario
 * reaches in every form (linked to libcuda.so.1 only, no runtime). Exit 0 when all
 * pass; every failed check prints one line.
 *
 *  - the cuInit gate: CUDA_ERROR_NOT_INITIALIZED (3) before a successful cuInit,
 *    CUDA_ERROR_NO_DEVICE (100) from cuInit with LW_REF_NO_DEVICE=1, and the call
 *    counter (refcudaDriverCalls);
 *  - cuMemcpy2D_v2/_ptds, cuMemcpy2DUnaligned_v2, cuMemcpy2DAsync_v2_ptsz: offsets
 *    (srcXInBytes/srcY, dstXInBytes/dstY), HOST/DEVICE/UNIFIED sides, ARRAY and bad
 *    pointers refused;
 *  - cuMemcpyPeer, cuMemcpyPeerAsync(_ptsz), cuMemcpyBatchAsync(_ptsz) (a bad entry:
 *    failIdx, nothing copied), cuEventRecordWithFlags(_ptsz);
 *  - a failed copy moves no lane bytes and uses up its engine-time record;
 *  - devices and contexts on two GPUs (LW_REF_GPUS, set here): no allocation without a
 *    current context, primary contexts, the per-thread stack (set current, push, pop,
 *    create, destroy), allocations on the current device and PCI bus ids;
 *  - kernels as a driver-API program (Triton, a custom loader) launches them: a module
 *    of the current context and its function (one handle per name), a library's
 *    kernel and its function per context, cuLaunchKernel(_ptsz) and cuLaunchKernelEx
 *    with a function or a CUkernel, parameters copied at the call, the kernel's bytes
 *    on the lanes, its time record; a bad image, an unknown name, another context's
 *    function, extra, an empty grid refused.
 */
#include "refcuda.h"
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static int failures;

#define EXPECT(expr, want)                                                                                  \
	do {                                                                                                \
		long long got_ = (long long)(expr), want_ = (long long)(want);                              \
		if (got_ != want_) {                                                                        \
			fprintf(stderr, "drvcheck:%d: %s = %lld, expected %lld\n", __LINE__, #expr, got_, want_); \
			failures++;                                                                         \
		}                                                                                           \
	} while (0)

#define D(p) ((CUdeviceptr)(uintptr_t)(p))

static uint64_t lanes(void)
{
	return refcudaLaneBytes(1) + refcudaLaneBytes(0);
}

/* A kernel of the image below: copy(dst, src, n) by SM loads and stores. */
static void k_copy(const struct refcudaKernelLaunch *l, void *const *params)
{
	refcudaSMCopy(l, *(void **)params[0], *(const void **)params[1], *(size_t *)params[2]);
}

static const struct refcudaImageKernel image_kernels[] = {
	{.name = "_Z6k_copyPvPKvm", .fn = k_copy, .nparams = 3, .param_size = {8, 8, 8}},
};
static const struct refcudaImage image = {.magic = REFCUDA_IMAGE_MAGIC, .count = 1, .kernels = image_kernels};

static void fill(char *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (char)(seed + i * 7);
}

int main(void)
{
	/* ---- the gate ---- */
	EXPECT(refcudaDriverCalls(), 0);
	CUdeviceptr d = 0;
	EXPECT(cuMemAlloc_v2(&d, 4096), CUDA_ERROR_NOT_INITIALIZED);
	CUDA_MEMCPY2D m = {0};
	EXPECT(cuMemcpy2D_v2(&m), CUDA_ERROR_NOT_INITIALIZED);
	EXPECT(cuStreamSynchronize(NULL), CUDA_ERROR_NOT_INITIALIZED);
	setenv("LW_REF_NO_DEVICE", "1", 1);
	EXPECT(cuInit(0), CUDA_ERROR_NO_DEVICE);
	EXPECT(cuInit(0), CUDA_ERROR_NO_DEVICE); /* retried, same answer */
	EXPECT(cuMemcpyHtoD_v2(0, "", 1), CUDA_ERROR_NOT_INITIALIZED);
	EXPECT(cuMemHostAlloc(&(void *){NULL}, 4096, 0), CUDA_ERROR_NOT_INITIALIZED);
	EXPECT(refcudaDriverCalls(), 7);
	unsetenv("LW_REF_NO_DEVICE");
	char gpus[2][48], list[100];
	for (int i = 0; i < 2; i++)
		snprintf(gpus[i], sizeof gpus[i], "drvcheck-%d-%d", (int)getpid(), i);
	snprintf(list, sizeof list, "%s,%s", gpus[0], gpus[1]);
	setenv("LW_REF_GPUS", list, 1);
	EXPECT(cuInit(1), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuInit(0), CUDA_SUCCESS);
	EXPECT(refcudaDriverCalls(), 9);

	/* ---- devices and contexts ---- */
	EXPECT(cuMemAlloc_v2(&d, 4096), CUDA_ERROR_INVALID_CONTEXT); /* no context current */
	int ndev = 0;
	EXPECT(cuDeviceGetCount(&ndev), CUDA_SUCCESS);
	EXPECT(ndev, 2);
	CUdevice dv = -1;
	EXPECT(cuDeviceGet(&dv, 1), CUDA_SUCCESS);
	EXPECT(dv, 1);
	EXPECT(cuDeviceGet(&dv, 2), CUDA_ERROR_INVALID_DEVICE);
	char bus[2][16], want[16], name[48];
	for (int i = 0; i < 2; i++) {
		EXPECT(cuDeviceGetPCIBusId(bus[i], sizeof bus[i], i), CUDA_SUCCESS);
		EXPECT(refcudaDeviceBusId(i, want, sizeof want), 0);
		EXPECT(strcasecmp(bus[i], want), 0); /* the same address, as the driver and as sysfs write it */
	}
	EXPECT(strcmp(bus[0], bus[1]) < 0, 1); /* ordinals in PCI order */
	EXPECT(cuDeviceGetPCIBusId(bus[0], 12, 0), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuDeviceGetPCIBusId(bus[0], 16, 2), CUDA_ERROR_INVALID_DEVICE);
	CUcontext c0 = NULL, c1 = NULL, c = NULL, again = NULL;
	EXPECT(cuDevicePrimaryCtxRetain(&c0, 0), CUDA_SUCCESS);
	EXPECT(cuDevicePrimaryCtxRetain(&c1, 1), CUDA_SUCCESS);
	EXPECT(cuDevicePrimaryCtxRetain(&again, 0), CUDA_SUCCESS);
	EXPECT(again == c0 && c0 != c1, 1); /* one primary context per device */
	EXPECT(cuCtxGetCurrent(&c), CUDA_SUCCESS);
	EXPECT(c == NULL, 1); /* retaining makes nothing current */
	EXPECT(cuCtxPopCurrent_v2(&c), CUDA_ERROR_INVALID_CONTEXT);
	EXPECT(cuCtxSetCurrent(c1), CUDA_SUCCESS);
	EXPECT(cuCtxSetCurrent(c0), CUDA_SUCCESS); /* replaces the top */
	EXPECT(cuCtxGetDevice(&dv), CUDA_SUCCESS);
	EXPECT(dv, 0);
	CUdeviceptr on1 = 0;
	EXPECT(cuCtxPushCurrent_v2(c1), CUDA_SUCCESS);
	EXPECT(cuMemAlloc_v2(&on1, 4096), CUDA_SUCCESS); /* on device 1 */
	EXPECT(cuCtxPopCurrent_v2(&c), CUDA_SUCCESS);
	EXPECT(c == c1, 1);
	EXPECT(cuCtxGetDevice(&dv), CUDA_SUCCESS);
	EXPECT(dv, 0); /* c0 again: the push did not replace it */
	EXPECT(cuCtxCreate_v2(&c, 0, 1), CUDA_SUCCESS);
	EXPECT(cuCtxGetDevice(&dv), CUDA_SUCCESS);
	EXPECT(dv, 1);
	EXPECT(cuCtxDestroy_v2(c), CUDA_SUCCESS); /* popped from this thread */
	EXPECT(cuCtxSetCurrent(c), CUDA_ERROR_INVALID_CONTEXT);
	EXPECT(cuCtxDestroy_v2(c0), CUDA_ERROR_INVALID_CONTEXT); /* a primary context is not destroyed */
	EXPECT(cuCtxGetDevice(&dv), CUDA_SUCCESS);
	EXPECT(dv, 0);
	EXPECT(cuCtxSetCurrent(NULL), CUDA_SUCCESS); /* pops */
	EXPECT(cuCtxGetCurrent(&c), CUDA_SUCCESS);
	EXPECT(c == NULL, 1);
	EXPECT(cuCtxSetCurrent(c0), CUDA_SUCCESS);
	/* each allocation is its device's memory: its copies take that GPU's lanes */
	CUdeviceptr on0 = 0;
	EXPECT(cuMemAlloc_v2(&on0, 4096), CUDA_SUCCESS);
	unsigned int dom, b;
	for (int i = 0; i < 2; i++) {
		name[0] = 0;
		EXPECT(refcudaDevicePointer((void *)(uintptr_t)(i ? on1 : on0), 4096, name, sizeof name), 1);
		refcudaGPUIdentity(name, &dom, &b);
		snprintf(want, sizeof want, "%04x:%02x:00.0", dom, b);
		EXPECT(strcasecmp(want, bus[i]), 0);
	}
	uint64_t in0 = refcudaLaneBytes(1);
	EXPECT(cuMemcpyHtoD_v2(on1, "device one", 11), CUDA_SUCCESS);
	EXPECT(refcudaLaneBytes(1) - in0, 0); /* device 0's lane did not carry it */
	EXPECT(cuMemcpyHtoD_v2(on0, "device zero", 12), CUDA_SUCCESS);
	EXPECT(refcudaLaneBytes(1) - in0, 12);
	EXPECT(cuMemFree_v2(on0), CUDA_SUCCESS);
	EXPECT(cuMemFree_v2(on1), CUDA_SUCCESS);
	EXPECT(cuDevicePrimaryCtxRelease_v2(0), CUDA_SUCCESS);
	EXPECT(cuDevicePrimaryCtxRelease_v2(1), CUDA_SUCCESS);

	/* ---- buffers: one device allocation, pinned and pageable host memory ---- */
	const size_t N = 1 << 20;
	char *dev, *pin, *pin2;
	EXPECT(cuMemAlloc_v2(&d, 4 * N), CUDA_SUCCESS);
	dev = (char *)(uintptr_t)d;
	EXPECT(cuMemHostAlloc((void **)&pin, N, 0), CUDA_SUCCESS);
	EXPECT(cuMemHostAlloc((void **)&pin2, N, 0), CUDA_SUCCESS);
	char *pageable = malloc(N);
	if (!dev || !pin || !pin2 || !pageable)
		return 1;
	CUstream s;
	EXPECT(cuStreamCreate(&s, 0), CUDA_SUCCESS);

	/* ---- 2D: H2D with offsets on both sides ---- */
	fill(pin, N, 1);
	memset(dev, 0, 4 * N);
	const size_t W = 1000, H = 8, SP = 1024, DP = 2048;
	m = (CUDA_MEMCPY2D){
		.srcXInBytes = 24, .srcY = 2, .srcMemoryType = CU_MEMORYTYPE_HOST, .srcHost = pin, .srcPitch = SP,
		.dstXInBytes = 8, .dstY = 1, .dstMemoryType = CU_MEMORYTYPE_DEVICE, .dstDevice = D(dev), .dstPitch = DP,
		.WidthInBytes = W, .Height = H,
	};
	uint64_t l0 = lanes();
	EXPECT(cuMemcpy2D_v2(&m), CUDA_SUCCESS);
	EXPECT(lanes() - l0, W * H);
	for (size_t y = 0; y < H; y++)
		EXPECT(memcmp(dev + (y + 1) * DP + 8, pin + (y + 2) * SP + 24, W), 0);
	EXPECT(dev[DP + 7] | dev[DP + 8 + W], 0);

	/* D2H, device to pageable, through the _ptds form */
	memset(pageable, 0, N);
	m = (CUDA_MEMCPY2D){
		.srcMemoryType = CU_MEMORYTYPE_DEVICE, .srcDevice = D(dev + DP + 8), .srcPitch = DP,
		.dstMemoryType = CU_MEMORYTYPE_HOST, .dstHost = pageable, .dstPitch = W,
		.WidthInBytes = W, .Height = H,
	};
	EXPECT(cuMemcpy2D_v2_ptds(&m), CUDA_SUCCESS);
	for (size_t y = 0; y < H; y++)
		EXPECT(memcmp(pageable + y * W, pin + (y + 2) * SP + 24, W), 0);

	/* UNIFIED both sides (D2D here) and mixed (UNIFIED host source, DEVICE destination) */
	m = (CUDA_MEMCPY2D){
		.srcMemoryType = CU_MEMORYTYPE_UNIFIED, .srcDevice = D(dev), .srcPitch = DP,
		.dstMemoryType = CU_MEMORYTYPE_UNIFIED, .dstDevice = D(dev + 2 * N), .dstPitch = DP,
		.WidthInBytes = DP, .Height = H + 1,
	};
	l0 = lanes();
	EXPECT(cuMemcpy2DUnaligned_v2(&m), CUDA_SUCCESS);
	EXPECT(lanes() - l0, 0); /* D2D takes no PCIe lane */
	EXPECT(memcmp(dev + 2 * N, dev, DP * (H + 1)), 0);
	fill(pin2, N, 9);
	m = (CUDA_MEMCPY2D){
		.srcMemoryType = CU_MEMORYTYPE_UNIFIED, .srcDevice = D(pin2), .srcPitch = 512,
		.dstMemoryType = CU_MEMORYTYPE_DEVICE, .dstDevice = D(dev + 3 * N), .dstPitch = 512,
		.WidthInBytes = 512, .Height = 16,
	};
	l0 = lanes();
	EXPECT(cuMemcpy2DAsync_v2_ptsz(&m, NULL), CUDA_SUCCESS);
	EXPECT(cuStreamSynchronize_ptsz(NULL), CUDA_SUCCESS);
	EXPECT(lanes() - l0, 512 * 16);
	EXPECT(memcmp(dev + 3 * N, pin2, 512 * 16), 0);

	/* refused: ARRAY, NULL host side, device side outside the arena, pitch < width, NULL descriptor */
	struct refcudaCopyTimes rec[2];
	refcudaSetCopyRecords(rec, 2);
	l0 = lanes();
	m = (CUDA_MEMCPY2D){
		.srcMemoryType = CU_MEMORYTYPE_ARRAY, .srcPitch = 64,
		.dstMemoryType = CU_MEMORYTYPE_HOST, .dstHost = pin, .dstPitch = 64, .WidthInBytes = 64, .Height = 2,
	};
	EXPECT(cuMemcpy2D_v2(&m), CUDA_ERROR_INVALID_VALUE); /* uses up rec[0] */
	m.srcMemoryType = CU_MEMORYTYPE_DEVICE;
	m.srcDevice = D(dev);
	m.dstHost = NULL;
	refcudaSetCopyRecords(NULL, 0);
	EXPECT(cuMemcpy2D_v2(&m), CUDA_ERROR_INVALID_VALUE);
	m.dstHost = pin;
	m.srcDevice = 0x10;
	EXPECT(cuMemcpy2DAsync_v2(&m, s), CUDA_ERROR_INVALID_VALUE);
	m.srcDevice = D(dev);
	m.srcPitch = 1ull << 40; /* the second row lies far past the arena */
	EXPECT(cuMemcpy2D_v2(&m), CUDA_ERROR_INVALID_VALUE);
	m.srcDevice = D(dev);
	m.srcPitch = 32;
	EXPECT(cuMemcpy2D_v2(&m), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuMemcpy2D_v2(NULL), CUDA_ERROR_INVALID_VALUE);
	EXPECT(lanes() - l0, 0);

	/* records: a failed copy uses up its record, the next copy gets the next one */
	refcudaSetCopyRecords(rec, 2);
	EXPECT(cuMemcpyHtoD_v2(0x10, pin, 4096), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuMemcpyDtoH_v2(NULL, D(dev), 4096), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuMemcpyHtoD_v2(D(dev), pin, 4096), CUDA_SUCCESS);
	EXPECT(lanes() - l0, 4096);
	EXPECT(rec[0].end_ns | rec[1].end_ns, 0);
	refcudaSetCopyRecords(rec, 1);
	EXPECT(cuMemcpyHtoD_v2(D(dev), pin, 4096), CUDA_SUCCESS);
	EXPECT(rec[0].end_ns != 0 && rec[0].end_ns >= rec[0].start_ns, 1);

	/* ---- peer ---- */
	memset(dev + N, 0, N);
	EXPECT(cuMemcpyPeer(D(dev + N), NULL, D(dev), NULL, 4096), CUDA_SUCCESS);
	EXPECT(cuMemcpyPeerAsync(D(dev + N + 4096), NULL, D(dev + 4096), NULL, 4096, s), CUDA_SUCCESS);
	EXPECT(cuMemcpyPeerAsync_ptsz(D(dev + N + 8192), NULL, D(dev + 8192), NULL, 4096, NULL), CUDA_SUCCESS);
	EXPECT(cuStreamSynchronize(s), CUDA_SUCCESS);
	EXPECT(cuStreamSynchronize_ptsz(NULL), CUDA_SUCCESS);
	EXPECT(memcmp(dev + N, dev, 3 * 4096), 0);
	EXPECT(cuMemcpyPeer(D(pin), NULL, D(dev), NULL, 4096), CUDA_ERROR_INVALID_VALUE); /* host is no peer */

	/* ---- batch ---- */
	CUdeviceptr dsts[3] = {D(dev + 2 * N), D(pin2), D(dev + 2 * N + 8192)};
	CUdeviceptr srcs[3] = {D(pin), D(dev), D(dev)};
	size_t sizes[3] = {4096, 4096, 4096}, fail = 0;
	fill(pin, 4096, 3);
	memset(pin2, 0, 4096);
	EXPECT(cuMemcpyBatchAsync(dsts, srcs, sizes, 3, NULL, NULL, 0, &fail, s), CUDA_SUCCESS);
	EXPECT(fail, SIZE_MAX);
	EXPECT(cuStreamSynchronize(s), CUDA_SUCCESS);
	EXPECT(memcmp(dev + 2 * N, pin, 4096), 0);
	EXPECT(memcmp(pin2, dev, 4096), 0);
	l0 = lanes();
	srcs[1] = 0; /* entry 1: NULL source */
	refcudaSetCopyRecords(rec, 2);
	EXPECT(cuMemcpyBatchAsync_ptsz(dsts, srcs, sizes, 3, NULL, NULL, 0, &fail, NULL), CUDA_ERROR_INVALID_VALUE);
	EXPECT(fail, 1);
	EXPECT(cuStreamSynchronize_ptsz(NULL), CUDA_SUCCESS);
	EXPECT(lanes() - l0, 0); /* entry 0 was good but nothing was submitted */
	EXPECT(cuMemcpyHtoD_v2(D(dev), pin, 4096), CUDA_SUCCESS);
	EXPECT(rec[1].end_ns, 0); /* the failed batch used up both records */
	EXPECT(cuMemcpyBatchAsync(dsts, srcs, sizes, 3, NULL, NULL, 2, &fail, s), CUDA_ERROR_INVALID_VALUE);
	EXPECT(fail, SIZE_MAX);

	/* ---- cuEventRecordWithFlags ---- */
	CUevent e;
	EXPECT(cuEventCreate(&e, 0), CUDA_SUCCESS);
	EXPECT(cuMemcpyHtoDAsync_v2(D(dev), pin, N, s), CUDA_SUCCESS);
	EXPECT(cuEventRecordWithFlags(e, s, CU_EVENT_RECORD_DEFAULT), CUDA_SUCCESS);
	EXPECT(cuEventSynchronize(e), CUDA_SUCCESS);
	EXPECT(cuEventRecordWithFlags_ptsz(e, NULL, CU_EVENT_RECORD_EXTERNAL), CUDA_SUCCESS);
	EXPECT(cuEventSynchronize(e), CUDA_SUCCESS);
	EXPECT(cuEventRecordWithFlags(e, s, 0x80), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuEventRecordWithFlags(NULL, s, 0), CUDA_ERROR_INVALID_HANDLE);
	EXPECT(cuEventDestroy_v2(e), CUDA_SUCCESS);

	/* ---- kernels through the driver API ---- */
	const char *kname = image_kernels[0].name;
	CUmodule mod = NULL;
	CUfunction f = NULL, f2 = NULL;
	EXPECT(cuModuleLoadData(&mod, "not an image"), CUDA_ERROR_INVALID_IMAGE);
	EXPECT(cuModuleLoadData(&mod, &image), CUDA_SUCCESS);
	EXPECT(cuModuleGetFunction(&f, mod, "_Z4nopev"), CUDA_ERROR_NOT_FOUND);
	EXPECT(cuModuleGetFunction(&f, mod, kname), CUDA_SUCCESS);
	EXPECT(cuModuleGetFunction(&f2, mod, kname), CUDA_SUCCESS);
	EXPECT(f == f2, 1); /* one handle per module and name */
	fill(pin, N, 3);
	memset(dev, 0, N);
	void *kdst = dev, *ksrc = pin;
	size_t kn = N / 2;
	void *kp[3] = {&kdst, &ksrc, &kn};
	struct refcudaCopyTimes krec[2];
	refcudaSetCopyRecords(krec, 2);
	l0 = lanes();
	EXPECT(cuLaunchKernel(f, 0, 1, 1, 32, 1, 1, 0, s, kp, NULL), CUDA_ERROR_INVALID_VALUE); /* uses up krec[0] */
	EXPECT(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, s, kp, NULL), CUDA_SUCCESS);
	kn = 1; /* copied at the call: the launch above still moves N/2 */
	EXPECT(cuStreamSynchronize(s), CUDA_SUCCESS);
	EXPECT(lanes() - l0, N / 2);
	EXPECT(memcmp(dev, pin, N / 2), 0);
	EXPECT(krec[0].end_ns, 0);
	EXPECT(krec[1].end_ns >= krec[1].start_ns && krec[1].start_ns > 0, 1);
	EXPECT(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, s, kp, (void **)kp), CUDA_ERROR_NOT_SUPPORTED);
	EXPECT(cuLaunchKernel((CUfunction)pin, 1, 1, 1, 32, 1, 1, 0, s, kp, NULL), CUDA_ERROR_INVALID_HANDLE);
	CUlaunchConfig cfg = {.gridDimX = 1, .gridDimY = 1, .gridDimZ = 1, .blockDimX = 64, .blockDimY = 1, .blockDimZ = 1,
			      .hStream = s};
	kn = 4096;
	kdst = dev + N;
	EXPECT(cuLaunchKernelEx(&cfg, f, kp, NULL), CUDA_SUCCESS);
	cfg.hStream = NULL;
	kdst = dev + N + 4096;
	EXPECT(cuLaunchKernelEx_ptsz(&cfg, f, kp, NULL), CUDA_SUCCESS);
	EXPECT(cuLaunchKernel_ptsz(f, 1, 1, 1, 32, 1, 1, 0, NULL, kp, NULL), CUDA_SUCCESS);
	EXPECT(cuStreamSynchronize(s), CUDA_SUCCESS);
	EXPECT(cuStreamSynchronize_ptsz(NULL), CUDA_SUCCESS);
	EXPECT(memcmp(dev + N, pin, 8192), 0);
	CUlibrary lib = NULL;
	CUkernel k = NULL, k2 = NULL;
	EXPECT(cuLibraryLoadData(&lib, "nope", NULL, NULL, 0, NULL, NULL, 0), CUDA_ERROR_INVALID_IMAGE);
	EXPECT(cuLibraryLoadData(&lib, &image, NULL, NULL, 0, NULL, NULL, 0), CUDA_SUCCESS);
	EXPECT(cuLibraryGetKernel(&k, lib, "_Z4nopev"), CUDA_ERROR_NOT_FOUND);
	EXPECT(cuLibraryGetKernel(&k, lib, kname), CUDA_SUCCESS);
	EXPECT(cuLibraryGetKernel(&k2, lib, kname), CUDA_SUCCESS);
	EXPECT(k == k2, 1);
	EXPECT(cuKernelGetFunction(&f2, k), CUDA_SUCCESS);
	CUfunction again_f = NULL;
	EXPECT(cuKernelGetFunction(&again_f, k), CUDA_SUCCESS);
	EXPECT(again_f == f2 && f2 != f, 1);
	kdst = dev + 2 * N;
	EXPECT(cuLaunchKernel((CUfunction)k, 1, 1, 1, 32, 1, 1, 0, s, kp, NULL), CUDA_SUCCESS); /* a CUkernel, CUDA 12 */
	EXPECT(cuStreamSynchronize(s), CUDA_SUCCESS);
	EXPECT(memcmp(dev + 2 * N, pin, 4096), 0);
	/* another context: the module's function is not its; the kernel has one there */
	CUcontext kc1 = NULL;
	EXPECT(cuDevicePrimaryCtxRetain(&kc1, 1), CUDA_SUCCESS);
	EXPECT(cuCtxPushCurrent_v2(kc1), CUDA_SUCCESS);
	EXPECT(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, s, kp, NULL), CUDA_ERROR_INVALID_HANDLE);
	EXPECT(cuKernelGetFunction(&again_f, k), CUDA_SUCCESS);
	EXPECT(again_f != f2, 1);
	EXPECT(cuCtxPopCurrent_v2(&kc1), CUDA_SUCCESS);
	EXPECT(cuDevicePrimaryCtxRelease_v2(1), CUDA_SUCCESS);
	/* ---- stream capture and graphs: captured work runs at each launch, never at capture ---- */
	{
		CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_ACTIVE;
		CUgraph g = NULL, bad = NULL;
		CUgraphExec x = NULL, x2 = NULL;
		CUevent ge;
		EXPECT(cuEventCreate(&ge, 0), CUDA_SUCCESS);
		EXPECT(cuStreamBeginCapture_v2(NULL, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
		EXPECT(cuStreamBeginCapture_v2(s, 7), CUDA_ERROR_INVALID_VALUE);
		EXPECT(cuStreamEndCapture(s, &g), CUDA_ERROR_ILLEGAL_STATE);
		EXPECT(cuStreamIsCapturing(s, &st), CUDA_SUCCESS);
		EXPECT(st, CU_STREAM_CAPTURE_STATUS_NONE);
		fill(pin, N, 5);
		memset(dev, 0, 2 * N);
		kdst = dev + N, ksrc = pin, kn = 4096;
		l0 = lanes();
		EXPECT(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), CUDA_SUCCESS);
		EXPECT(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_ERROR_ILLEGAL_STATE);
		EXPECT(cuStreamIsCapturing(s, &st), CUDA_SUCCESS);
		EXPECT(st, CU_STREAM_CAPTURE_STATUS_ACTIVE);
		EXPECT(cuMemcpyHtoDAsync_v2(d, pin, 8192, s), CUDA_SUCCESS);
		EXPECT(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, s, kp, NULL), CUDA_SUCCESS);
		EXPECT(cuEventRecord(ge, s), CUDA_SUCCESS);
		EXPECT(cuMemcpyDtoHAsync_v2(pin2, d, 256, s), CUDA_SUCCESS);
		kn = 1; /* a kernel node's parameters were copied at capture */
		EXPECT(cuStreamEndCapture(s, &g), CUDA_SUCCESS);
		EXPECT(cuEventSynchronize(ge), CUDA_SUCCESS); /* never recorded: returns at once */
		EXPECT(lanes() - l0, 0);                    /* nothing ran */
		EXPECT(dev[0] == 0 && dev[N] == 0, 1);
		EXPECT(cuGraphInstantiateWithFlags(&x, g, 0), CUDA_SUCCESS);
		EXPECT(cuGraphInstantiate_v2(&x2, g, NULL, NULL, 0), CUDA_SUCCESS);
		EXPECT(cuGraphDestroy(g), CUDA_SUCCESS); /* the executable graphs keep their copies */
		for (int i = 0; i < 2; i++) {
			EXPECT(cuGraphLaunch(i ? x2 : x, s), CUDA_SUCCESS);
			EXPECT(cuEventSynchronize(ge), CUDA_SUCCESS);
			EXPECT(cuStreamSynchronize(s), CUDA_SUCCESS);
		}
		EXPECT(lanes() - l0, 2 * (8192 + 4096 + 256));
		EXPECT(memcmp(dev, pin, 8192) || memcmp(dev + N, pin, 4096) || memcmp(pin2, dev, 256), 0);
		EXPECT(cuGraphLaunch(NULL, s), CUDA_ERROR_INVALID_HANDLE);
		EXPECT(cuGraphLaunch_ptsz(x, NULL), CUDA_SUCCESS);
		EXPECT(cuStreamSynchronize_ptsz(NULL), CUDA_SUCCESS);
		/* a host wait during capture is refused and invalidates it */
		EXPECT(cuStreamBeginCapture(s), CUDA_SUCCESS);
		EXPECT(cuMemcpyHtoDAsync_v2(d, pin, 4096, s), CUDA_SUCCESS);
		EXPECT(cuStreamSynchronize(s), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
		EXPECT(cuStreamIsCapturing(s, &st), CUDA_SUCCESS);
		EXPECT(st, CU_STREAM_CAPTURE_STATUS_INVALIDATED);
		EXPECT(cuStreamEndCapture(s, &bad), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
		EXPECT(bad == NULL, 1);
		EXPECT(cuStreamBeginCapture_v2_ptsz(NULL, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
		EXPECT(cuMemcpyHtoD_v2_ptds(d, pin, 4096), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED); /* synchronous */
		EXPECT(cuStreamEndCapture_ptsz(NULL, &bad), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
		EXPECT(cuGraphExecDestroy(x), CUDA_SUCCESS);
		EXPECT(cuGraphExecDestroy(x2), CUDA_SUCCESS);
		EXPECT(cuEventDestroy_v2(ge), CUDA_SUCCESS);
	}
	EXPECT(cuLibraryUnload(lib), CUDA_SUCCESS);
	EXPECT(cuModuleUnload(mod), CUDA_SUCCESS);
	EXPECT(cuModuleUnload(NULL), CUDA_ERROR_INVALID_HANDLE);
	refcudaSetCopyRecords(NULL, 0);

	EXPECT(cuStreamDestroy_v2(s), CUDA_SUCCESS);
	EXPECT(cuMemFreeHost(pin), CUDA_SUCCESS);
	EXPECT(cuMemFreeHost(pin2), CUDA_SUCCESS);
	EXPECT(cuMemFree_v2(d), CUDA_SUCCESS);
	free(pageable);
	for (int i = 0; i < 2; i++) {
		char path[64];
		snprintf(path, sizeof path, "/lw-ref-%s", gpus[i]);
		shm_unlink(path);
	}
	if (failures) {
		fprintf(stderr, "drvcheck: %d failed\n", failures);
		return 1;
	}
	printf("drvcheck: ok (%llu driver calls)\n", refcudaDriverCalls());
	return 0;
}
