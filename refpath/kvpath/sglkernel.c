/*
 * A stand-in for sgl-kernel's KV-transfer kernel (sgl-kernel/csrc/kvcacheio/transfer.cu),
 * shaped as nvcc leaves a kernel in a host object: its device code (here a C function
 * the reference driver runs on the stream's engine, its loads and stores of host
 * memory taking the GPU's lanes), its host stub under the kernel's mangled name, and a
 * constructor registering both with the runtime (nvcc's __sti____cudaRegisterAll).
 *
 * The kernel is transfer_kernel_impl<&get_global_offset_lf<char const>,
 * &get_global_offset_lf<char>, false>, what sgl-kernel's transfer_kv_per_layer
 * launches (HiCache's `kernel` I/O backend, layer-first layout, K and V): each warp
 * moves items_per_warp pages of item_size_bytes, K then V, from src_k/src_v at
 * src_indices to dst_k/dst_v at dst_indices. Its name is the Itanium mangling of that
 * instance as the host compiler (g++) spells it; the same kernel serves loads (host
 * pool to device) and writebacks: nothing in its name says which.
 */
#include "sglkernel.h"
#include <stdio.h>
#include <stdlib.h>

#define SGL_KV_NAME                                                                                              \
	"_Z20transfer_kernel_implIXadL_Z20get_global_offset_lfIKcEPT_S3_PKmllllEEXadL_ZS0_IcES3_S3_S5_llllEELb0EEvPKvPvS7_" \
	"S8_PKlSA_lllllllS5_S5_S5_S5_"

const char *const sgl_transfer_kernel_name = SGL_KV_NAME;

enum { P_SRC_K, P_DST_K, P_SRC_V, P_DST_V, P_SRC_IDX, P_DST_IDX, P_START_LAYER, P_NUM_LAYERS, P_NUM_ITEMS,
       P_ITEMS_PER_WARP, P_ITEM_SIZE, P_SRC_DIM, P_DST_DIM, P_SRC_K_TBL, P_DST_K_TBL, P_SRC_V_TBL, P_DST_V_TBL, P_N };

#define P(type, i) (*(type *)params[i])

/* get_global_offset_lf: base + layer_id * layer_dim + page_id * item_size_bytes */
static char *offset_lf(char *base, int64_t layer, int64_t dim, int64_t page, int64_t item)
{
	return base + layer * dim + page * item;
}

/* The device code: every warp's items, K then V of each (IsMLA false). */
static void transfer_kernel_impl_lf_lf(const struct refcudaKernelLaunch *l, void *const *params)
{
	int64_t items = P(int64_t, P_NUM_ITEMS), per_warp = P(int64_t, P_ITEMS_PER_WARP);
	int64_t item = P(int64_t, P_ITEM_SIZE), start = P(int64_t, P_START_LAYER), layers = P(int64_t, P_NUM_LAYERS);
	const int64_t *src_idx = P(const int64_t *, P_SRC_IDX), *dst_idx = P(const int64_t *, P_DST_IDX);
	int64_t warps = (int64_t)l->grid[0] * l->block[0] / 32;
	for (int64_t w = 0; w < warps; w++)
		for (int64_t i = 0; i < per_warp; i++) {
			int64_t id = i * warps + w;
			if (id >= items)
				break;
			int64_t sp = src_idx[id], dp = dst_idx[id];
			if (sp < 0 || dp < 0)
				continue;
			for (int64_t layer = start; layer < start + layers; layer++) {
				refcudaSMCopy(l, offset_lf(P(char *, P_DST_K), layer, P(int64_t, P_DST_DIM), dp, item),
					      offset_lf(P(char *, P_SRC_K), layer, P(int64_t, P_SRC_DIM), sp, item), (size_t)item);
				refcudaSMCopy(l, offset_lf(P(char *, P_DST_V), layer, P(int64_t, P_DST_DIM), dp, item),
					      offset_lf(P(char *, P_SRC_V), layer, P(int64_t, P_SRC_DIM), sp, item), (size_t)item);
			}
		}
}

static const struct refcudaImageKernel kernels[] = {{
	.name = SGL_KV_NAME,
	.fn = transfer_kernel_impl_lf_lf,
	.nparams = P_N,
	.param_size = {8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8},
}};
static const struct refcudaImage image = {.magic = REFCUDA_IMAGE_MAGIC, .count = 1, .kernels = kernels};
static const __fatBinC_Wrapper_t fatbin = {.magic = FATBINC_MAGIC, .version = 1,
					   .data = (const unsigned long long *)&image};

/* The host stub, under the kernel's own mangled name as nvcc's is: it pops the
 * configuration the call site pushed and launches itself. */
__attribute__((noinline, used)) void sgl_transfer_kernel_stub(const void *src_k, void *dst_k, const void *src_v,
							    void *dst_v, const int64_t *src_indices,
							    const int64_t *dst_indices, int64_t start_layer_id,
							    int64_t num_layers_to_process, int64_t num_items,
							    int64_t items_per_warp, int64_t item_size_bytes,
							    int64_t src_layout_dim, int64_t dst_layout_dim,
							    const uintptr_t *src_k_tbl, const uintptr_t *dst_k_tbl,
							    const uintptr_t *src_v_tbl, const uintptr_t *dst_v_tbl)
	__asm__(SGL_KV_NAME);

void sgl_transfer_kernel_stub(const void *src_k, void *dst_k, const void *src_v, void *dst_v,
			      const int64_t *src_indices, const int64_t *dst_indices, int64_t start_layer_id,
			      int64_t num_layers_to_process, int64_t num_items, int64_t items_per_warp,
			      int64_t item_size_bytes, int64_t src_layout_dim, int64_t dst_layout_dim,
			      const uintptr_t *src_k_tbl, const uintptr_t *dst_k_tbl, const uintptr_t *src_v_tbl,
			      const uintptr_t *dst_v_tbl)
{
	void *args[P_N] = {&src_k, &dst_k, &src_v, &dst_v, &src_indices, &dst_indices, &start_layer_id,
			   &num_layers_to_process, &num_items, &items_per_warp, &item_size_bytes, &src_layout_dim,
			   &dst_layout_dim, &src_k_tbl, &dst_k_tbl, &src_v_tbl, &dst_v_tbl};
	dim3 grid, block;
	size_t shared;
	cudaStream_t stream;
	if (__cudaPopCallConfiguration(&grid, &block, &shared, &stream) != cudaSuccess)
		return;
	sgl_last_launch = cudaLaunchKernel((const void *)sgl_transfer_kernel_stub, grid, block, args, shared, stream);
}

cudaError_t sgl_last_launch;

static void **handle;

static void unregister(void)
{
	__cudaUnregisterFatBinary(handle);
}

__attribute__((constructor)) static void register_all(void)
{
	handle = __cudaRegisterFatBinary((void *)&fatbin);
	if (!handle) {
		fprintf(stderr, "sglkernel: fatbin not registered\n");
		exit(1);
	}
	__cudaRegisterFunction(handle, (const char *)sgl_transfer_kernel_stub, (char *)SGL_KV_NAME, SGL_KV_NAME, -1, NULL,
			       NULL, NULL, NULL, NULL);
	__cudaRegisterFatBinaryEnd(handle);
	atexit(unregister);
}

/* sgl-kernel's transfer_kv_launcher: the grid from the item count and the
 * block quota, then transfer_kernel_impl<<<grid, warps * 32, 0, stream>>>. */
cudaError_t sgl_transfer_kv_per_layer(const void *src_k, void *dst_k, const void *src_v, void *dst_v,
				      const int64_t *src_indices, const int64_t *dst_indices, int64_t num_items,
				      int64_t item_size, int64_t block_quota, int64_t num_warps_per_block,
				      cudaStream_t stream)
{
	int64_t per_warp = (num_items + block_quota * num_warps_per_block - 1) / (block_quota * num_warps_per_block);
	int64_t blocks = (num_items + per_warp * num_warps_per_block - 1) / (per_warp * num_warps_per_block);
	dim3 grid = {(unsigned int)blocks, 1, 1}, block = {(unsigned int)(num_warps_per_block * 32), 1, 1};
	__cudaPushCallConfiguration(grid, block, 0, stream);
	sgl_last_launch = cudaErrorUnknown;
	sgl_transfer_kernel_stub(src_k, dst_k, src_v, dst_v, src_indices, dst_indices, 0, 1, num_items, per_warp, item_size,
				 0, 0, NULL, NULL, NULL, NULL);
	return sgl_last_launch;
}
