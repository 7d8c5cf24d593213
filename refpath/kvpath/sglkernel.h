/* kvpath: a stand-in for sgl-kernel's KV-transfer kernel (sglkernel.c). */
#ifndef REFPATH_SGLKERNEL_H
#define REFPATH_SGLKERNEL_H

#include "refcuda.h"
#include <stdint.h>

/* The kernel's device name (mangled), as registered and as the driver is asked it. */
extern const char *const sgl_transfer_kernel_name;
/* What the host stub's cudaLaunchKernel returned. */
extern cudaError_t sgl_last_launch;

/* sgl-kernel's transfer_kv_per_layer: one launch moving num_items pages of item_size
 * bytes of K and of V, from src_*[src_indices[i]] to dst_*[dst_indices[i]] (the
 * indices in device memory), on stream. */
cudaError_t sgl_transfer_kv_per_layer(const void *src_k, void *dst_k, const void *src_v, void *dst_v,
				      const int64_t *src_indices, const int64_t *dst_indices, int64_t num_items,
				      int64_t item_size, int64_t block_quota, int64_t num_warps_per_block,
				      cudaStream_t stream);

#endif
