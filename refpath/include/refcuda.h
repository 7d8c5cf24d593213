/*
 * refcuda.h — types and prototypes of the reference CUDA runtime (libcudart.so.12)
 * and driver (libcuda.so.1) that lanewatch's reference KV data path implements on
 * host memory.
 *
 * Written for lanewatch from the public ABI only (names, argument order, integer
 * widths, enum values): the point is that a uprobe attached to one of these symbols
 * sees the same registers and stack slots it would see on the real libraries.
 * Only what the reference path needs is declared.
 */
#ifndef REFCUDA_H
#define REFCUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- shared handle types: the runtime hands out the driver's own handles ---- */
struct CUstream_st;
struct CUevent_st;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;
typedef unsigned long long CUdeviceptr;
/* Contexts are the driver's (a primary context per device, made current per thread);
 * arrays are opaque: no CUDA arrays here. A CUdevice is the device's ordinal, as in
 * NVIDIA's driver (cuda.h: CUmemLocation.id is "a device ordinal"). */
struct CUctx_st;
struct CUarray_st;
typedef struct CUctx_st *CUcontext;
typedef struct CUarray_st *CUarray;
typedef int CUdevice;

/* Special stream handles accepted by every stream argument. */
#define CU_STREAM_LEGACY ((CUstream)0x1)
#define CU_STREAM_PER_THREAD ((CUstream)0x2)
#define cudaStreamLegacy ((cudaStream_t)0x1)
#define cudaStreamPerThread ((cudaStream_t)0x2)

/* ---- status codes: ints, success is 0; runtime and driver share the values we use ---- */
typedef enum cudaError {
	cudaSuccess = 0,
	cudaErrorInvalidValue = 1,
	cudaErrorMemoryAllocation = 2,
	cudaErrorInitializationError = 3,
	cudaErrorInvalidMemcpyDirection = 21,
	cudaErrorInvalidDeviceFunction = 98, /* a launch of a host function no fatbin registered */
	cudaErrorNoDevice = 100,
	cudaErrorInvalidDevice = 101,
	cudaErrorDeviceUninitialized = 201, /* no context current: the driver's CUDA_ERROR_INVALID_CONTEXT */
	cudaErrorInvalidResourceHandle = 400,
	cudaErrorIllegalState = 401,
	cudaErrorNotReady = 600,
	cudaErrorHostMemoryAlreadyRegistered = 712,
	cudaErrorHostMemoryNotRegistered = 713,
	cudaErrorStreamCaptureUnsupported = 900,
	cudaErrorStreamCaptureInvalidated = 901,
	cudaErrorUnknown = 999,
} cudaError_t;

typedef enum cudaError_enum {
	CUDA_SUCCESS = 0,
	CUDA_ERROR_INVALID_VALUE = 1,
	CUDA_ERROR_OUT_OF_MEMORY = 2,
	CUDA_ERROR_NOT_INITIALIZED = 3,
	CUDA_ERROR_NO_DEVICE = 100,
	CUDA_ERROR_INVALID_DEVICE = 101,
	CUDA_ERROR_INVALID_IMAGE = 200,
	CUDA_ERROR_INVALID_CONTEXT = 201,
	CUDA_ERROR_INVALID_HANDLE = 400,
	CUDA_ERROR_ILLEGAL_STATE = 401,
	CUDA_ERROR_NOT_FOUND = 500,
	CUDA_ERROR_NOT_READY = 600,
	CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712,
	CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED = 713,
	CUDA_ERROR_NOT_SUPPORTED = 801,
	CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
	CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901,
	CUDA_ERROR_UNKNOWN = 999,
} CUresult;

enum cudaMemcpyKind {
	cudaMemcpyHostToHost = 0,
	cudaMemcpyHostToDevice = 1,
	cudaMemcpyDeviceToHost = 2,
	cudaMemcpyDeviceToDevice = 3,
	cudaMemcpyDefault = 4,
};

/* Memory types of a CUDA_MEMCPY2D side (cuda.h values). */
typedef enum CUmemorytype_enum {
	CU_MEMORYTYPE_HOST = 0x01,
	CU_MEMORYTYPE_DEVICE = 0x02,
	CU_MEMORYTYPE_ARRAY = 0x03,   /* unsupported here: CUDA_ERROR_INVALID_VALUE */
	CU_MEMORYTYPE_UNIFIED = 0x04, /* resolved from the address in srcDevice/dstDevice */
} CUmemorytype;

/* The 2D copy descriptor of cuMemcpy2D*, laid out exactly as cuda.h's CUDA_MEMCPY2D_v2. */
typedef struct CUDA_MEMCPY2D_st {
	size_t srcXInBytes; /* source start: base + srcY * srcPitch + srcXInBytes */
	size_t srcY;
	CUmemorytype srcMemoryType;
	const void *srcHost; /* HOST */
	CUdeviceptr srcDevice; /* DEVICE, UNIFIED */
	CUarray srcArray;    /* ARRAY */
	size_t srcPitch;
	size_t dstXInBytes;
	size_t dstY;
	CUmemorytype dstMemoryType;
	void *dstHost;
	CUdeviceptr dstDevice;
	CUarray dstArray;
	size_t dstPitch;
	size_t WidthInBytes; /* bytes per row */
	size_t Height;       /* rows */
} CUDA_MEMCPY2D;

#ifndef __cplusplus
_Static_assert(sizeof(CUmemorytype) == 4, "CUmemorytype is an int-sized enum");
_Static_assert(sizeof(CUDA_MEMCPY2D) == 128, "CUDA_MEMCPY2D is 128 bytes");
_Static_assert(offsetof(CUDA_MEMCPY2D, srcMemoryType) == 16, "CUDA_MEMCPY2D.srcMemoryType");
_Static_assert(offsetof(CUDA_MEMCPY2D, srcHost) == 24, "CUDA_MEMCPY2D.srcHost");
_Static_assert(offsetof(CUDA_MEMCPY2D, srcDevice) == 32, "CUDA_MEMCPY2D.srcDevice");
_Static_assert(offsetof(CUDA_MEMCPY2D, srcArray) == 40, "CUDA_MEMCPY2D.srcArray");
_Static_assert(offsetof(CUDA_MEMCPY2D, srcPitch) == 48, "CUDA_MEMCPY2D.srcPitch");
_Static_assert(offsetof(CUDA_MEMCPY2D, dstMemoryType) == 72, "CUDA_MEMCPY2D.dstMemoryType");
_Static_assert(offsetof(CUDA_MEMCPY2D, dstHost) == 80, "CUDA_MEMCPY2D.dstHost");
_Static_assert(offsetof(CUDA_MEMCPY2D, dstDevice) == 88, "CUDA_MEMCPY2D.dstDevice");
_Static_assert(offsetof(CUDA_MEMCPY2D, dstPitch) == 104, "CUDA_MEMCPY2D.dstPitch");
_Static_assert(offsetof(CUDA_MEMCPY2D, WidthInBytes) == 112, "CUDA_MEMCPY2D.WidthInBytes");
_Static_assert(offsetof(CUDA_MEMCPY2D, Height) == 120, "CUDA_MEMCPY2D.Height");
#endif

/*
 * Managed memory, memory pools and virtual memory management (cuda.h 12.4 and
 * driver_types.h layouts: the agent reads CUmemLocation out of the properties).
 */
typedef unsigned long long CUmemGenericAllocationHandle;
struct CUmemPoolHandle_st;
typedef struct CUmemPoolHandle_st *CUmemoryPool;
typedef struct CUmemPoolHandle_st *cudaMemPool_t;
typedef int CUdevice;

typedef enum CUmemLocationType_enum {
	CU_MEM_LOCATION_TYPE_INVALID = 0x0,
	CU_MEM_LOCATION_TYPE_DEVICE = 0x1,
	CU_MEM_LOCATION_TYPE_HOST = 0x2,
	CU_MEM_LOCATION_TYPE_HOST_NUMA = 0x3,
	CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT = 0x4,
} CUmemLocationType;
#define cudaMemLocationTypeDevice CU_MEM_LOCATION_TYPE_DEVICE
#define cudaMemLocationTypeHostNuma CU_MEM_LOCATION_TYPE_HOST_NUMA

typedef struct CUmemLocation_st {
	CUmemLocationType type;
	int id; /* a device ordinal or a host NUMA node */
} CUmemLocation;

#define CU_MEM_ALLOCATION_TYPE_PINNED 0x1
#define CU_MEM_HANDLE_TYPE_NONE 0x0
typedef struct CUmemAllocationProp_st {
	int type;                 /* CUmemAllocationType: CU_MEM_ALLOCATION_TYPE_PINNED */
	int requestedHandleTypes; /* CUmemAllocationHandleType */
	CUmemLocation location;
	void *win32HandleMetaData;
	struct {
		unsigned char compressionType;
		unsigned char gpuDirectRDMACapable;
		unsigned short usage;
		unsigned char reserved[4];
	} allocFlags;
} CUmemAllocationProp;

/* CUmemPoolProps, and the runtime's cudaMemPoolProps, which is laid out alike. */
typedef struct CUmemPoolProps_st {
	int allocType;   /* CU_MEM_ALLOCATION_TYPE_PINNED */
	int handleTypes; /* CUmemAllocationHandleType */
	CUmemLocation location;
	void *win32SecurityAttributes;
	size_t maxSize;
	unsigned char reserved[56];
} CUmemPoolProps;
typedef CUmemPoolProps cudaMemPoolProps;

#define CU_MEM_ACCESS_FLAGS_PROT_NONE 0x0
#define CU_MEM_ACCESS_FLAGS_PROT_READWRITE 0x3
typedef struct CUmemAccessDesc_st {
	CUmemLocation location;
	int flags; /* CUmemAccess_flags */
} CUmemAccessDesc;

#define CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD 0x1
#define CU_MEM_ATTACH_GLOBAL 0x1u
#define cudaMemAttachGlobal 0x01u

#ifndef __cplusplus
_Static_assert(sizeof(CUmemLocation) == 8, "CUmemLocation is 8 bytes");
_Static_assert(offsetof(CUmemAllocationProp, location) == 8, "CUmemAllocationProp.location");
_Static_assert(sizeof(CUmemAllocationProp) == 32, "CUmemAllocationProp is 32 bytes");
_Static_assert(offsetof(CUmemPoolProps, location) == 8, "CUmemPoolProps.location");
_Static_assert(sizeof(CUmemPoolProps) == 88, "CUmemPoolProps is 88 bytes");
#endif

/* cuEventRecordWithFlags flags */
#define CU_EVENT_RECORD_DEFAULT 0x0u
#define CU_EVENT_RECORD_EXTERNAL 0x1u
#define cudaEventRecordDefault 0x00u
#define cudaEventRecordExternal 0x01u

/* Flags (accepted, mostly ignored: everything is host memory). */
#define cudaHostAllocDefault 0x00u
#define cudaHostRegisterDefault 0x00u
#define cudaStreamDefault 0x00u
#define cudaStreamNonBlocking 0x01u
#define cudaEventDefault 0x00u
#define cudaEventDisableTiming 0x02u

/*
 * Per-copy attributes of cudaMemcpyBatchAsync (CUDA 12.8 argument layout). Our
 * own minimal definition: the reference path resolves every entry's direction
 * from its pointers and ignores the attributes (attrs may be NULL, numAttrs 0).
 */
struct cudaMemcpyAttributes {
	int srcAccessOrder;
	struct { int type; int id; } srcLocHint, dstLocHint;
	unsigned int flags;
};

/*
 * Kernels: modules and libraries, their functions and kernels, launches (cuda.h 12.4
 * and driver_types.h layouts; the agent reads a launch config's stream at byte 32).
 */
struct CUmod_st;
struct CUfunc_st;
struct CUlib_st;
struct CUkern_st;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUlib_st *CUlibrary;
typedef struct CUkern_st *CUkernel;
typedef int CUjit_option;
typedef int CUlibraryOption;
typedef struct CUlaunchAttribute_st CUlaunchAttribute; /* accepted, not read: attributes are hints here */
typedef struct CUlaunchConfig_st {
	unsigned int gridDimX, gridDimY, gridDimZ;
	unsigned int blockDimX, blockDimY, blockDimZ;
	unsigned int sharedMemBytes;
	CUstream hStream;
	CUlaunchAttribute *attrs;
	unsigned int numAttrs;
} CUlaunchConfig;
typedef struct dim3 {
	unsigned int x, y, z;
} dim3;
typedef struct uint3 {
	unsigned int x, y, z;
} uint3;
typedef struct cudaLaunchConfig_st {
	dim3 gridDim;
	dim3 blockDim;
	size_t dynamicSmemBytes;
	cudaStream_t stream;
	void *attrs; /* cudaLaunchAttribute *: hints, not read */
	unsigned int numAttrs;
} cudaLaunchConfig_t;
#ifndef __cplusplus
_Static_assert(offsetof(CUlaunchConfig, sharedMemBytes) == 24, "CUlaunchConfig.sharedMemBytes");
_Static_assert(offsetof(CUlaunchConfig, hStream) == 32, "CUlaunchConfig.hStream");
_Static_assert(offsetof(cudaLaunchConfig_t, dynamicSmemBytes) == 24, "cudaLaunchConfig_t.dynamicSmemBytes");
_Static_assert(offsetof(cudaLaunchConfig_t, stream) == 32, "cudaLaunchConfig_t.stream");
#endif

/*
 * What nvcc puts in a host object for its device code (fatbinary_section.h): a wrapper
 * with NVIDIA's magic and version around the fatbin data. A real fatbin holds SASS and
 * PTX, which nothing here can run; the reference's data is a struct refcudaImage: each
 * kernel's (mangled) name, the C function that stands for its device code, and the
 * sizes of its parameters (as a cubin's parameter info tells the driver how many
 * bytes to copy at a launch). cuModuleLoadData and cuLibraryLoadData take that data;
 * anything else is CUDA_ERROR_INVALID_IMAGE.
 */
#define FATBINC_MAGIC 0x466243b1
typedef struct {
	int magic;
	int version;
	const unsigned long long *data;
	void *filename_or_fatbins;
} __fatBinC_Wrapper_t;

#define REFCUDA_IMAGE_MAGIC 0x6b666572u /* "refk" */
#define REFCUDA_MAX_PARAMS 32
struct refcudaKernelLaunch;
/* A kernel's device code: params[i] points to the launch's copy of parameter i. */
typedef void (*refcudaKernelFn)(const struct refcudaKernelLaunch *l, void *const *params);
struct refcudaImageKernel {
	const char *name;
	refcudaKernelFn fn;
	unsigned int nparams;
	unsigned int param_size[REFCUDA_MAX_PARAMS];
};
struct refcudaImage {
	unsigned int magic;
	unsigned int count;
	const struct refcudaImageKernel *kernels;
};
/* What a kernel runs with, on its stream's engine. */
struct refcudaKernelLaunch {
	unsigned int grid[3], block[3], shared;
	int device;       /* the device it runs on */
	uint64_t *cursor; /* the engine's lane cursor (lane.c) */
};
/*
 * An SM's loads and stores inside a kernel: n bytes from src to dst, one side this
 * process's device memory. Paced and counted on the lane of the GPU owning the device
 * side (inbound when the host side is the source), like a copy engine's chunks: a
 * copy kernel moves bytes over PCIe as DMA does, it is only the mover that differs.
 * CUDA_ERROR_INVALID_VALUE when neither side is device memory.
 */
CUresult refcudaSMCopy(const struct refcudaKernelLaunch *l, void *dst, const void *src, size_t n);

/*
 * Stream capture and graphs (cuda.h 12.4, driver_types.h). Work submitted to a
 * capturing stream (copies, kernel launches, event records) is recorded as the
 * nodes of a graph, in submission order, and not run; cuGraphLaunch runs an
 * instantiated graph's nodes on its stream, as if each were submitted there at the
 * launch. One stream per capture: anything capture cannot record (a host wait on the
 * stream, a synchronous copy, a stream wait on an event, a stream-ordered free)
 * fails with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates the capture, whose
 * cuStreamEndCapture then fails with CUDA_ERROR_STREAM_CAPTURE_INVALIDATED. The
 * legacy default stream cannot capture (as on NVIDIA's driver). A graph launched on a
 * capturing stream is captured in turn (its nodes join the capture). The capture mode
 * is checked, not enforced: other threads' calls are never refused.
 */
struct CUgraph_st;
struct CUgraphExec_st;
struct CUgraphNode_st;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphExec_st *CUgraphExec;
typedef struct CUgraphNode_st *CUgraphNode;
typedef struct CUgraph_st *cudaGraph_t;
typedef struct CUgraphExec_st *cudaGraphExec_t;
typedef struct CUgraphNode_st *cudaGraphNode_t;
typedef enum CUstreamCaptureMode_enum {
	CU_STREAM_CAPTURE_MODE_GLOBAL = 0,
	CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1,
	CU_STREAM_CAPTURE_MODE_RELAXED = 2,
} CUstreamCaptureMode;
typedef enum CUstreamCaptureStatus_enum {
	CU_STREAM_CAPTURE_STATUS_NONE = 0,
	CU_STREAM_CAPTURE_STATUS_ACTIVE = 1,
	CU_STREAM_CAPTURE_STATUS_INVALIDATED = 2,
} CUstreamCaptureStatus;
enum cudaStreamCaptureMode {
	cudaStreamCaptureModeGlobal = 0,
	cudaStreamCaptureModeThreadLocal = 1,
	cudaStreamCaptureModeRelaxed = 2,
};
enum cudaStreamCaptureStatus {
	cudaStreamCaptureStatusNone = 0,
	cudaStreamCaptureStatusActive = 1,
	cudaStreamCaptureStatusInvalidated = 2,
};

/* ================= runtime: libcudart.so.12 ================= */
cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind);
cudaError_t cudaMemcpy_ptds(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind, cudaStream_t stream);
cudaError_t cudaMemcpyAsync_ptsz(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind, cudaStream_t stream);
cudaError_t cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
			 enum cudaMemcpyKind kind);
cudaError_t cudaMemcpy2D_ptds(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
			      enum cudaMemcpyKind kind);
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
			      enum cudaMemcpyKind kind, cudaStream_t stream);
cudaError_t cudaMemcpy2DAsync_ptsz(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
				   size_t height, enum cudaMemcpyKind kind, cudaStream_t stream);
cudaError_t cudaMemcpyPeer(void *dst, int dstDevice, const void *src, int srcDevice, size_t count);
cudaError_t cudaMemcpyPeerAsync(void *dst, int dstDevice, const void *src, int srcDevice, size_t count,
				cudaStream_t stream);
cudaError_t cudaMemcpyBatchAsync(void **dsts, void **srcs, size_t *sizes, size_t count,
				 struct cudaMemcpyAttributes *attrs, size_t *attrsIdxs, size_t numAttrs, size_t *failIdx,
				 cudaStream_t stream);
cudaError_t cudaMemcpyBatchAsync_ptsz(void **dsts, void **srcs, size_t *sizes, size_t count,
				      struct cudaMemcpyAttributes *attrs, size_t *attrsIdxs, size_t numAttrs,
				      size_t *failIdx, cudaStream_t stream);
cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags);
cudaError_t cudaMallocHost(void **ptr, size_t size);
cudaError_t cudaHostRegister(void *ptr, size_t size, unsigned int flags);
cudaError_t cudaHostUnregister(void *ptr);
cudaError_t cudaFreeHost(void *ptr);
cudaError_t cudaMalloc(void **devPtr, size_t size);
cudaError_t cudaFree(void *devPtr);
cudaError_t cudaMallocManaged(void **devPtr, size_t size, unsigned int flags);
cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t stream);
cudaError_t cudaMallocAsync_ptsz(void **devPtr, size_t size, cudaStream_t stream);
cudaError_t cudaMallocFromPoolAsync(void **ptr, size_t size, cudaMemPool_t memPool, cudaStream_t stream);
cudaError_t cudaMallocFromPoolAsync_ptsz(void **ptr, size_t size, cudaMemPool_t memPool, cudaStream_t stream);
cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t stream);
cudaError_t cudaFreeAsync_ptsz(void *devPtr, cudaStream_t stream);
cudaError_t cudaMemPoolCreate(cudaMemPool_t *memPool, const cudaMemPoolProps *poolProps);
cudaError_t cudaMemPoolDestroy(cudaMemPool_t memPool);
cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *memPool, int device);
cudaError_t cudaStreamCreate(cudaStream_t *pStream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamSynchronize_ptsz(cudaStream_t stream);
cudaError_t cudaEventCreate(cudaEvent_t *event);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream);
cudaError_t cudaEventRecord_ptsz(cudaEvent_t event, cudaStream_t stream);
cudaError_t cudaEventRecordWithFlags(cudaEvent_t event, cudaStream_t stream, unsigned int flags);
cudaError_t cudaEventRecordWithFlags_ptsz(cudaEvent_t event, cudaStream_t stream, unsigned int flags);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventQuery(cudaEvent_t event); /* cudaErrorNotReady: not yet reached */
cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags);
cudaError_t cudaStreamWaitEvent_ptsz(cudaStream_t stream, cudaEvent_t event, unsigned int flags);
cudaError_t cudaDeviceSynchronize(void);
/* CUDA 12's signatures: cudaGraphInstantiate takes flags (11.x took an error node
 * and a log buffer), both call cuGraphInstantiateWithFlags. */
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode);
cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t stream, enum cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *pGraph);
cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t stream, cudaGraph_t *pGraph);
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, enum cudaStreamCaptureStatus *pCaptureStatus);
cudaError_t cudaStreamIsCapturing_ptsz(cudaStream_t stream, enum cudaStreamCaptureStatus *pCaptureStatus);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *pGraphExec, cudaGraph_t graph, unsigned long long flags);
cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t *pGraphExec, cudaGraph_t graph, unsigned long long flags);
cudaError_t cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream);
cudaError_t cudaGraphLaunch_ptsz(cudaGraphExec_t graphExec, cudaStream_t stream);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t graphExec);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);
cudaError_t cudaGetLastError(void);
/* cudaSetDevice makes the device's primary context current on the calling thread
 * through the driver (cuDevicePrimaryCtxRetain once per device, cuCtxSetCurrent), as
 * CUDA 12's runtime does; a thread's first other call with no context current makes
 * device 0's current (CUDA's implicit device). */
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int *device);
cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaDeviceGetPCIBusId(char *pciBusId, int len, int device);
/*
 * Kernels, as nvcc-generated code reaches the runtime: a constructor registers each
 * fatbin and the host stub of each of its kernels with the kernel's device name
 * (__cudaRegisterFunction); `k<<<g, b, s, st>>>(args)` pushes the launch
 * configuration and calls k's host stub, which pops it and calls cudaLaunchKernel
 * with its own address. The runtime loads the fatbin into the current context once
 * (cuModuleLoadData), asks the function's handle once per context
 * (cuModuleGetFunction with the registered name) and launches it with cuLaunchKernel
 * (cudaLaunchKernelExC: cuLaunchKernelEx), as NVIDIA's 11.8 and 12.4 runtimes do.
 */
void **__cudaRegisterFatBinary(void *fatCubin);
void __cudaRegisterFatBinaryEnd(void **fatCubinHandle);
void __cudaUnregisterFatBinary(void **fatCubinHandle);
void __cudaRegisterFunction(void **fatCubinHandle, const char *hostFun, char *deviceFun, const char *deviceName,
			    int thread_limit, uint3 *tid, uint3 *bid, dim3 *bDim, dim3 *gDim, int *wSize);
unsigned int __cudaPushCallConfiguration(dim3 gridDim, dim3 blockDim, size_t sharedMem, void *stream);
cudaError_t __cudaPopCallConfiguration(dim3 *gridDim, dim3 *blockDim, size_t *sharedMem, void *stream);
cudaError_t cudaLaunchKernel(const void *func, dim3 gridDim, dim3 blockDim, void **args, size_t sharedMem,
			     cudaStream_t stream);
cudaError_t cudaLaunchKernel_ptsz(const void *func, dim3 gridDim, dim3 blockDim, void **args, size_t sharedMem,
				  cudaStream_t stream);
cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t *config, const void *func, void **args);
cudaError_t cudaLaunchKernelExC_ptsz(const cudaLaunchConfig_t *config, const void *func, void **args);

/* ================= driver: libcuda.so.1 ================= */
CUresult cuInit(unsigned int Flags);
CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount);
CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount);
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount, CUstream hStream);
CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount, CUstream hStream);
CUresult cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount);
CUresult cuMemcpyDtoH_v2_ptds(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount);
CUresult cuMemcpyDtoHAsync_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream);
CUresult cuMemcpyDtoHAsync_v2_ptsz(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream);
CUresult cuMemcpyDtoD_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount);
CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount);
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream);
CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream);
CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount);
CUresult cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount);
CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream);
CUresult cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream);
/* 2D: cuMemcpy2D_v2 and cuMemcpy2DUnaligned_v2 behave alike here (no pitch alignment rules). */
CUresult cuMemcpy2D_v2(const CUDA_MEMCPY2D *pCopy);
CUresult cuMemcpy2D_v2_ptds(const CUDA_MEMCPY2D *pCopy);
CUresult cuMemcpy2DUnaligned_v2(const CUDA_MEMCPY2D *pCopy);
CUresult cuMemcpy2DUnaligned_v2_ptds(const CUDA_MEMCPY2D *pCopy);
CUresult cuMemcpy2DAsync_v2(const CUDA_MEMCPY2D *pCopy, CUstream hStream);
CUresult cuMemcpy2DAsync_v2_ptsz(const CUDA_MEMCPY2D *pCopy, CUstream hStream);
/* Peer: one device per process, so both sides must be this process's device memory;
 * the contexts are not looked at. */
CUresult cuMemcpyPeer(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice, CUcontext srcContext,
		      size_t ByteCount);
CUresult cuMemcpyPeerAsync(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice,
			   CUcontext srcContext, size_t ByteCount, CUstream hStream);
CUresult cuMemcpyPeerAsync_ptsz(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice,
				CUcontext srcContext, size_t ByteCount, CUstream hStream);
/* Batch (CUDA 12.8 layout: hStream is the 9th argument, on the stack). Every entry's
 * direction is resolved from its pointers; attrs are hints and not read. All entries
 * are checked before any is submitted: on an error *failIdx is the bad entry (or
 * SIZE_MAX when the error is not an entry's) and nothing was copied. */
CUresult cuMemcpyBatchAsync(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count, void *attrs,
			    size_t *attrsIdxs, size_t numAttrs, size_t *failIdx, CUstream hStream);
CUresult cuMemcpyBatchAsync_ptsz(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count, void *attrs,
				 size_t *attrsIdxs, size_t numAttrs, size_t *failIdx, CUstream hStream);
CUresult cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int Flags);
CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags);
CUresult cuMemAllocHost_v2(void **pp, size_t bytesize);
CUresult cuMemHostUnregister(void *p);
CUresult cuMemFreeHost(void *p);
CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize);
CUresult cuMemFree_v2(CUdeviceptr dptr); /* device, managed and stream-ordered allocations */
/* Managed memory: host pages here, accepted as either side of any copy. */
CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags);
/* Stream-ordered allocations: cuMemAllocAsync from the device's default pool (device
 * memory), cuMemAllocFromPoolAsync from a pool; the free is queued on the stream. */
CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream);
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream);
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream);
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream);
CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream);
/* Pools on the device (device memory) or a host NUMA node (pinned host memory). */
CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps);
CUresult cuMemPoolDestroy(CUmemoryPool pool);
CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev);
/* Virtual memory management: reserve address space, create a physical allocation on the
 * device or the host, map it, give it access; unmap, release, free. */
CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
			     unsigned long long flags);
CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size);
CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
		     unsigned long long flags);
CUresult cuMemRelease(CUmemGenericAllocationHandle handle);
CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
		  unsigned long long flags);
CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count);
CUresult cuMemUnmap(CUdeviceptr ptr, size_t size);
CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop, int option);
/* A dma-buf fd for device memory [dptr, dptr+size) (CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD):
 * *(int *)handle gets it. */
CUresult cuMemGetHandleForAddressRange(void *handle, CUdeviceptr dptr, size_t size, int handleType,
				       unsigned long long flags);
CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags);
CUresult cuStreamDestroy_v2(CUstream hStream);
CUresult cuStreamSynchronize(CUstream hStream);
CUresult cuStreamSynchronize_ptsz(CUstream hStream);
CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags);
CUresult cuEventDestroy_v2(CUevent hEvent);
CUresult cuEventRecord(CUevent hEvent, CUstream hStream);
CUresult cuEventRecord_ptsz(CUevent hEvent, CUstream hStream);
CUresult cuEventRecordWithFlags(CUevent hEvent, CUstream hStream, unsigned int flags);
CUresult cuEventRecordWithFlags_ptsz(CUevent hEvent, CUstream hStream, unsigned int flags);
CUresult cuEventSynchronize(CUevent hEvent);
CUresult cuEventQuery(CUevent hEvent);
CUresult cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream);
CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags);
CUresult cuStreamWaitEvent_ptsz(CUstream hStream, CUevent hEvent, unsigned int Flags);
CUresult cuCtxSynchronize(void);
/* Stream capture and graphs. cuStreamBeginCapture[_ptsz] is CUDA 10.0's form, kept
 * exported by NVIDIA's drivers (no mode argument); cuda.h maps cuStreamBeginCapture to
 * _v2. cuGraphInstantiate and cuGraphInstantiate_v2 are the exported 11.x forms
 * (error node, log buffer); CUDA 12's cuda.h maps cuGraphInstantiate to
 * cuGraphInstantiateWithFlags. */
CUresult cuStreamBeginCapture(CUstream hStream);
CUresult cuStreamBeginCapture_ptsz(CUstream hStream);
CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode);
CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode);
CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph);
CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph);
CUresult cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *captureStatus);
CUresult cuStreamIsCapturing_ptsz(CUstream hStream, CUstreamCaptureStatus *captureStatus);
CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags);
CUresult cuGraphInstantiate(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode, char *logBuffer,
			    size_t bufferSize);
CUresult cuGraphInstantiate_v2(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode, char *logBuffer,
			       size_t bufferSize);
CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream);
CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream);
CUresult cuGraphExecDestroy(CUgraphExec hGraphExec);
CUresult cuGraphDestroy(CUgraph hGraph);
/* Modules belong to the context current when they are loaded, and so do their
 * functions; a library is context-independent, its kernels too: a CUkernel launches
 * (cast to CUfunction, as CUDA 12 allows) in the current context, and
 * cuKernelGetFunction gives its function there. A handle asked twice is the same. */
CUresult cuModuleLoadData(CUmodule *module, const void *image);
CUresult cuModuleUnload(CUmodule hmod);
CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name);
CUresult cuLibraryLoadData(CUlibrary *library, const void *code, CUjit_option *jitOptions, void **jitOptionsValues,
			   unsigned int numJitOptions, CUlibraryOption *libraryOptions, void **libraryOptionValues,
			   unsigned int numLibraryOptions);
CUresult cuLibraryUnload(CUlibrary library);
CUresult cuLibraryGetKernel(CUkernel *pKernel, CUlibrary library, const char *name);
CUresult cuKernelGetFunction(CUfunction *pFunc, CUkernel kernel);
/* The parameters are copied at the call (kernelParams[i] points to parameter i); the
 * kernel runs on the stream's engine in stream order. extra is not supported
 * (CUDA_ERROR_NOT_SUPPORTED). */
CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
			unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ, unsigned int sharedMemBytes,
			CUstream hStream, void **kernelParams, void **extra);
CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
			     unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
			     unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra);
CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra);
CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra);

/*
 * Devices and contexts. The devices are the GPUs LW_REF_GPUS names (comma-separated
 * reference GPU names, each with its own shared lanes), in the PCI order of their
 * identities (refcudaGPUIdentity: a host of one model, so CUDA's default order is the
 * PCI order); without it one GPU, LW_REF_GPU's or private lanes. Each thread has a
 * context stack as in NVIDIA's driver: cuCtxSetCurrent replaces its top (NULL pops),
 * push/pop, cuCtxCreate pushes, cuCtxDestroy pops it where current. cuMemAlloc
 * allocates on the current context's device (CUDA_ERROR_INVALID_CONTEXT without one);
 * a copy takes the lanes of the device owning its device side.
 */
CUresult cuDeviceGet(CUdevice *device, int ordinal);
CUresult cuDeviceGetCount(int *count);
CUresult cuDeviceGetPCIBusId(char *pciBusId, int len, CUdevice dev); /* "F123:45:00.0" */
CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev);
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev);
CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);
CUresult cuCtxDestroy_v2(CUcontext ctx);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuCtxGetCurrent(CUcontext *pctx);
CUresult cuCtxPushCurrent_v2(CUcontext ctx);
CUresult cuCtxPopCurrent_v2(CUcontext *pctx);
CUresult cuCtxGetDevice(CUdevice *device);

/* ---- reference-only helpers exported by libcuda.so.1 (never probed) ---- */

/*
 * Driver calls made so far by the calling thread: every call into an exported cu*
 * entry point counts (cuInit included, also when it fails), the refcuda* helpers do
 * not. Lets a scenario check that a runtime call did (or did not) reach the driver.
 */
unsigned long long refcudaDriverCalls(void);

/*
 * Ground-truth timing: the next n copy calls made by the calling thread into the
 * driver (one record per 1D/2D/peer copy, one per batch entry, one per kernel
 * launch) write when their engine started and finished into recs[0..n-1]
 * (CLOCK_MONOTONIC ns). Values are
 * valid once the copy's stream has been synchronised. Zero means the copy never
 * ran: a copy call that fails still uses up its record(s); a call that never
 * reaches the driver (the runtime refused it) does not. refcudaSetCopyRecords(NULL,
 * 0) disarms.
 */
struct refcudaCopyTimes {
	uint64_t start_ns, end_ns;
};
void refcudaSetCopyRecords(struct refcudaCopyTimes *recs, size_t n);

/*
 * Shared GPU lanes for the reference RDMA provider. With LW_REF_GPU=<name> this
 * process's GPU lanes (inbound = H2D direction, outbound = D2H) live in
 * /dev/shm/lw-ref-<name>, so another process can consume them.
 *
 * refcudaDevicePointer: 1 if [p, p+n) lies in this process's device arena; gpu gets
 * the GPU's name (LW_REF_GPU, "" when its lanes are private).
 * refcudaLaneReserve: reserves `bytes` of lane time on gpu's inbound/outbound lane
 * after *cursor (the end of the caller's previous reservation, 0 for none; updated)
 * and returns when that time ends (CLOCK_MONOTONIC ns), without waiting.
 * refcudaLaneTransfer: the same in chunks, waiting until the bytes are across.
 * gpu "" or NULL is this process's own GPU.
 */
int refcudaDevicePointer(const void *p, size_t n, char *gpu, size_t gpulen);
uint64_t refcudaLaneReserve(const char *gpu, int inbound, size_t bytes, uint64_t *cursor);
void refcudaLaneTransfer(const char *gpu, int inbound, size_t bytes);

/*
 * The head of a shared GPU file /dev/shm/lw-ref-<name> (the lanes follow it). Other
 * programs (the NVML stand-in, checks) map just this head, read-only, to read the
 * GPU's cumulative lane byte counters: bytes[0] counts bytes that crossed the
 * inbound lane (host to device: the GPU's PCIe RX), bytes[1] the outbound lane (TX).
 * A chunk is counted when its lane time is reserved, by every copy that takes a lane
 * (runtime/driver copies, kernels' refcudaSMCopy, the RDMA provider), and never reset
 * while the file exists. busy_until_ns[i] is the end (CLOCK_MONOTONIC ns) of the
 * last lane time reserved on lane i: the lane carries traffic until then, which is
 * how the NVML stand-in knows whether the GPU's link is idle. Read them with
 * __atomic_load_n(..., __ATOMIC_RELAXED).
 * The file is usable when magic is REFCUDA_LANE_MAGIC and state is
 * REFCUDA_LANE_READY; a file with another magic is an older layout.
 */
#define REFCUDA_LANE_MAGIC 0x6c776c6e65763033ull /* "lwlnev03" */
#define REFCUDA_LANE_READY 2u
#define REFCUDA_LANE_NAME_MAX 48
struct refcudaLaneHead {
	uint64_t magic;
	uint32_t state;
	uint32_t pad;
	char name[REFCUDA_LANE_NAME_MAX];
	uint64_t bytes[2];         /* [0] inbound (H2D, RX), [1] outbound (D2H, TX) */
	uint64_t busy_until_ns[2]; /* same lanes: end of the last reserved lane time */
};

/*
 * The device range [*base, *base + *len) a dma-buf fd of cuMemGetHandleForAddressRange
 * stands for: 1, or 0 when fd is not one this driver handed out (or it was closed).
 * The reference RDMA provider's ibv_reg_dmabuf_mr asks it, as a NIC driver asks the
 * exporter for the pages.
 */
int refcudaDmabufRange(int fd, void **base, size_t *len);

/* Cumulative bytes on this process's own GPU lane (shared or private): device 0's. */
uint64_t refcudaLaneBytes(int inbound);

/*
 * The PCI identity of the reference GPU named name, which the NVML stand-in reports
 * too: domain 0xF000 | bits 8..19 of FNV-1a-64(name), bus its low byte, device 0,
 * function 0. Domain 0xFxxx marks a reference GPU: no real host has one in sysfs.
 */
static inline uint64_t refcudaFNV1a(const char *a, const char *b)
{
	uint64_t h = 0xcbf29ce484222325ull;
	for (const char *s = a; *s; s++)
		h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
	for (const char *s = b; *s; s++)
		h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
	return h;
}
static inline void refcudaGPUIdentity(const char *name, unsigned int *domain, unsigned int *bus)
{
	uint64_t h = refcudaFNV1a(name, "");
	*domain = 0xf000u | (unsigned int)((h >> 8) & 0xfff);
	*bus = (unsigned int)(h & 0xff);
}

/*
 * Reference-only (never probed): the PCI address of device ordinal dev in sysfs form
 * ("f123:45:00.0"), what an observer should report as the GPU of a copy on it; -1
 * when there is no such device. The truth of the scenarios names GPUs with it.
 */
int refcudaDeviceBusId(int dev, char *buf, size_t len);


#ifdef __cplusplus
}
#endif
#endif
