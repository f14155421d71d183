/* The CUDA path of the reference model (lib/refmodel/refmodel_cuda.c; a stub
 * without the CUDA backend): bf16 weights generated on the GPU from the seed,
 * bf16 KV, the kernels of lib/refmodel/kernels/. */
#ifndef OI_REFMODEL_CUDA_H
#define OI_REFMODEL_CUDA_H

#include "core/core.h"
#include "openinfer/experimental.h"
#include "openinfer/model.h"

typedef struct oi_rm_cuda oi_rm_cuda;

/* Checks that the shapes fit the kernels (head_dim 64 or 128; hidden,
 * q_heads * head_dim and intermediate multiples of 64). */
oi_status oi__rm_cuda_check(const oi_refmodel_options *o);
oi_status oi__rm_cuda_create(const oi_refmodel_options *o, oi_rm_cuda **out);
void oi__rm_cuda_destroy(oi_rm_cuda *m);
oi_status oi__rm_cuda_bind(oi_rm_cuda *m, uint32_t rank, const oi_kv_layout *kv);
void oi__rm_cuda_unbind(oi_rm_cuda *m, uint32_t rank);
oi_status oi__rm_cuda_forward(oi_rm_cuda *m, const oi_model_batch *b);

#endif
