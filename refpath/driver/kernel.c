/*
 * Kernels: modules and libraries loaded from a reference image (refcuda.h: each
 * kernel's name, the C function standing for its device code, its parameter sizes),
 * the handles NVIDIA's driver API names them by, and launches.
 *
 * As in NVIDIA's driver: a module belongs to the context current when it was loaded
 * and so do its functions (cuModuleGetFunction answers the same CUfunction for the
 * same name); a library is context-independent and so are its kernels, which launch
 * in the current context, cast to CUfunction (CUDA 12), or give their function there
 * through cuKernelGetFunction. A launch copies the parameters at the call and runs
 * the kernel on its stream's engine, in stream order; its SMs' loads and stores of
 * host memory take the GPU's lanes (refcudaSMCopy).
 */
#include "internal.h"
#include <stdlib.h>
#include <string.h>

#define MODULE_MAGIC 0x4d4f444cu   /* "MODL" */
#define LIBRARY_MAGIC 0x4c494252u  /* "LIBR" */
#define FUNCTION_MAGIC 0x46554e43u /* "FUNC" */
#define KERNEL_MAGIC 0x4b45524eu   /* "KERN" */
#define MAX_DEVICES 8

struct CUfunc_st {
	uint32_t magic;
	int device;
	const struct refcudaImageKernel *k;
};

struct CUkern_st {
	uint32_t magic;
	const struct refcudaImageKernel *k;
	struct CUfunc_st *per_device[MAX_DEVICES]; /* cuKernelGetFunction's answers */
};

/* A module or library: the image's kernels, and the handle of each made so far. */
struct CUmod_st {
	uint32_t magic;
	int device; /* modules only: the context's device */
	const struct refcudaImage *img;
	struct CUfunc_st **funcs; /* modules: per kernel */
	struct CUkern_st **kerns; /* libraries: per kernel */
};
struct CUlib_st {
	struct CUmod_st m;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static const struct refcudaImage *image_of(const void *p)
{
	const struct refcudaImage *img = p;
	if (!img || img->magic != REFCUDA_IMAGE_MAGIC || !img->kernels || img->count > 4096)
		return NULL;
	for (unsigned i = 0; i < img->count; i++)
		if (!img->kernels[i].name || !img->kernels[i].fn || img->kernels[i].nparams > REFCUDA_MAX_PARAMS)
			return NULL;
	return img;
}

static int kernel_index(const struct refcudaImage *img, const char *name)
{
	for (unsigned i = 0; i < img->count; i++)
		if (!strcmp(img->kernels[i].name, name))
			return (int)i;
	return -1;
}

static CUresult load(struct CUmod_st *m, uint32_t magic, const void *image, int device)
{
	m->img = image_of(image);
	if (!m->img)
		return CUDA_ERROR_INVALID_IMAGE;
	m->magic = magic;
	m->device = device;
	size_t n = m->img->count ? m->img->count : 1;
	if (magic == MODULE_MAGIC)
		m->funcs = calloc(n, sizeof *m->funcs);
	else
		m->kerns = calloc(n, sizeof *m->kerns);
	if (!m->funcs && !m->kerns)
		return CUDA_ERROR_OUT_OF_MEMORY;
	return CUDA_SUCCESS;
}

RC_API CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
	RC_GATE();
	if (!module)
		return CUDA_ERROR_INVALID_VALUE;
	int dev = rc_current_device();
	if (dev < 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	struct CUmod_st *m = calloc(1, sizeof *m);
	if (!m)
		return CUDA_ERROR_OUT_OF_MEMORY;
	CUresult r = load(m, MODULE_MAGIC, image, dev);
	if (r != CUDA_SUCCESS) {
		free(m);
		return r;
	}
	*module = m;
	return CUDA_SUCCESS;
}

/* Unloading frees the handles the module made: a later launch of one is the
 * application's bug (use after free), as with NVIDIA's driver. */
static void unload(struct CUmod_st *m)
{
	for (unsigned i = 0; i < m->img->count; i++) {
		if (m->funcs)
			free(m->funcs[i]);
		if (m->kerns && m->kerns[i]) {
			for (int d = 0; d < MAX_DEVICES; d++)
				free(m->kerns[i]->per_device[d]);
			free(m->kerns[i]);
		}
	}
	free(m->funcs);
	free(m->kerns);
	m->magic = 0;
	free(m);
}

RC_API CUresult cuModuleUnload(CUmodule hmod)
{
	RC_GATE();
	if (!hmod || hmod->magic != MODULE_MAGIC)
		return CUDA_ERROR_INVALID_HANDLE;
	pthread_mutex_lock(&mu);
	unload(hmod);
	pthread_mutex_unlock(&mu);
	return CUDA_SUCCESS;
}

RC_API CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name)
{
	RC_GATE();
	if (!hfunc || !name)
		return CUDA_ERROR_INVALID_VALUE;
	if (!hmod || hmod->magic != MODULE_MAGIC)
		return CUDA_ERROR_INVALID_HANDLE;
	int i = kernel_index(hmod->img, name);
	if (i < 0)
		return CUDA_ERROR_NOT_FOUND;
	pthread_mutex_lock(&mu);
	struct CUfunc_st *f = hmod->funcs[i];
	if (!f) {
		f = calloc(1, sizeof *f);
		if (f) {
			*f = (struct CUfunc_st){.magic = FUNCTION_MAGIC, .device = hmod->device, .k = &hmod->img->kernels[i]};
			hmod->funcs[i] = f;
		}
	}
	pthread_mutex_unlock(&mu);
	if (!f)
		return CUDA_ERROR_OUT_OF_MEMORY;
	*hfunc = f;
	return CUDA_SUCCESS;
}

/* JIT and library options are hints here: accepted, not read. */
RC_API CUresult cuLibraryLoadData(CUlibrary *library, const void *code, CUjit_option *jitOptions,
				  void **jitOptionsValues, unsigned int numJitOptions, CUlibraryOption *libraryOptions,
				  void **libraryOptionValues, unsigned int numLibraryOptions)
{
	RC_GATE();
	(void)jitOptions, (void)jitOptionsValues, (void)numJitOptions;
	(void)libraryOptions, (void)libraryOptionValues, (void)numLibraryOptions;
	if (!library)
		return CUDA_ERROR_INVALID_VALUE;
	struct CUlib_st *l = calloc(1, sizeof *l);
	if (!l)
		return CUDA_ERROR_OUT_OF_MEMORY;
	CUresult r = load(&l->m, LIBRARY_MAGIC, code, -1);
	if (r != CUDA_SUCCESS) {
		free(l);
		return r;
	}
	*library = l;
	return CUDA_SUCCESS;
}

RC_API CUresult cuLibraryUnload(CUlibrary library)
{
	RC_GATE();
	if (!library || library->m.magic != LIBRARY_MAGIC)
		return CUDA_ERROR_INVALID_HANDLE;
	pthread_mutex_lock(&mu);
	unload(&library->m);
	pthread_mutex_unlock(&mu);
	return CUDA_SUCCESS;
}

RC_API CUresult cuLibraryGetKernel(CUkernel *pKernel, CUlibrary library, const char *name)
{
	RC_GATE();
	if (!pKernel || !name)
		return CUDA_ERROR_INVALID_VALUE;
	if (!library || library->m.magic != LIBRARY_MAGIC)
		return CUDA_ERROR_INVALID_HANDLE;
	struct CUmod_st *m = &library->m;
	int i = kernel_index(m->img, name);
	if (i < 0)
		return CUDA_ERROR_NOT_FOUND;
	pthread_mutex_lock(&mu);
	struct CUkern_st *k = m->kerns[i];
	if (!k) {
		k = calloc(1, sizeof *k);
		if (k) {
			k->magic = KERNEL_MAGIC;
			k->k = &m->img->kernels[i];
			m->kerns[i] = k;
		}
	}
	pthread_mutex_unlock(&mu);
	if (!k)
		return CUDA_ERROR_OUT_OF_MEMORY;
	*pKernel = k;
	return CUDA_SUCCESS;
}

RC_API CUresult cuKernelGetFunction(CUfunction *pFunc, CUkernel kernel)
{
	RC_GATE();
	if (!pFunc)
		return CUDA_ERROR_INVALID_VALUE;
	if (!kernel || kernel->magic != KERNEL_MAGIC)
		return CUDA_ERROR_INVALID_HANDLE;
	int dev = rc_current_device();
	if (dev < 0 || dev >= MAX_DEVICES)
		return CUDA_ERROR_INVALID_CONTEXT;
	pthread_mutex_lock(&mu);
	struct CUfunc_st *f = kernel->per_device[dev];
	if (!f) {
		f = calloc(1, sizeof *f);
		if (f) {
			*f = (struct CUfunc_st){.magic = FUNCTION_MAGIC, .device = dev, .k = kernel->k};
			kernel->per_device[dev] = f;
		}
	}
	pthread_mutex_unlock(&mu);
	if (!f)
		return CUDA_ERROR_OUT_OF_MEMORY;
	*pFunc = f;
	return CUDA_SUCCESS;
}

/* A launch: the function's kernel on its context's device (a CUkernel: the current
 * context's), its parameters copied now, queued on the stream. */
static CUresult launch_one(CUfunction f, const unsigned int grid[3], const unsigned int block[3], unsigned int shared,
			   CUstream stream, int per_thread, void **params, void **extra, int *submitted)
{
	int cur = rc_current_device();
	if (cur < 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	const struct refcudaImageKernel *k;
	int dev;
	if (f && ((struct CUkern_st *)f)->magic == KERNEL_MAGIC) {
		k = ((struct CUkern_st *)f)->k;
		dev = cur;
	} else if (f && f->magic == FUNCTION_MAGIC) {
		k = f->k;
		dev = f->device;
		if (dev != cur)
			return CUDA_ERROR_INVALID_HANDLE; /* a function of another context */
	} else {
		return CUDA_ERROR_INVALID_HANDLE;
	}
	if (extra)
		return CUDA_ERROR_NOT_SUPPORTED;
	for (int i = 0; i < 3; i++)
		if (!grid[i] || !block[i])
			return CUDA_ERROR_INVALID_VALUE;
	if (k->nparams && !params)
		return CUDA_ERROR_INVALID_VALUE;
	size_t bytes = 0;
	for (unsigned i = 0; i < k->nparams; i++)
		bytes += (k->param_size[i] + 7u) & ~7u;
	struct rc_launch *l = calloc(1, sizeof *l + bytes);
	if (!l)
		return CUDA_ERROR_OUT_OF_MEMORY;
	l->size = sizeof *l + bytes;
	l->fn = k->fn;
	memcpy(l->l.grid, grid, sizeof l->l.grid);
	memcpy(l->l.block, block, sizeof l->l.block);
	l->l.shared = shared;
	l->l.device = dev;
	size_t off = 0;
	for (unsigned i = 0; i < k->nparams; i++) {
		l->params[i] = l->data + off;
		memcpy(l->data + off, params[i], k->param_size[i]);
		off += (k->param_size[i] + 7u) & ~7u;
	}
	*submitted = 1;
	CUresult r = rc_submit_kernel(l, stream, per_thread);
	if (r != CUDA_SUCCESS)
		free(l);
	return r;
}

/* A launch that fails before its stream takes it uses up its time record, as a
 * failed copy does (refcudaSetCopyRecords). */
static CUresult launch(CUfunction f, const unsigned int grid[3], const unsigned int block[3], unsigned int shared,
		       CUstream stream, int per_thread, void **params, void **extra)
{
	int submitted = 0;
	CUresult r = launch_one(f, grid, block, shared, stream, per_thread, params, extra, &submitted);
	if (!submitted)
		rc_copy_records_skip(1);
	return r;
}

RC_API CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
			       unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
			       unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra)
{
	RC_GATE();
	return launch(f, (unsigned int[3]){gridDimX, gridDimY, gridDimZ}, (unsigned int[3]){blockDimX, blockDimY, blockDimZ},
		      sharedMemBytes, hStream, 0, kernelParams, extra);
}

RC_API CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
				    unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
				    unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra)
{
	RC_GATE();
	return launch(f, (unsigned int[3]){gridDimX, gridDimY, gridDimZ}, (unsigned int[3]){blockDimX, blockDimY, blockDimZ},
		      sharedMemBytes, hStream, 1, kernelParams, extra);
}

static CUresult launch_ex(const CUlaunchConfig *c, CUfunction f, void **params, void **extra, int per_thread)
{
	if (!c)
		return CUDA_ERROR_INVALID_VALUE;
	return launch(f, (unsigned int[3]){c->gridDimX, c->gridDimY, c->gridDimZ},
		      (unsigned int[3]){c->blockDimX, c->blockDimY, c->blockDimZ}, c->sharedMemBytes, c->hStream, per_thread,
		      params, extra);
}

RC_API CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra)
{
	RC_GATE();
	return launch_ex(config, f, kernelParams, extra, 0);
}

RC_API CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra)
{
	RC_GATE();
	return launch_ex(config, f, kernelParams, extra, 1);
}
