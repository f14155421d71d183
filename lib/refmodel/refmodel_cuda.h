/* The CUDA path of the reference model (lib/refmodel/refmodel_cuda.c; a stub
 * without the CUDA backend): bf16 weights generated on the GPU from the seed,
 * bf16 KV, the kernels of kernels/refmodel.cu. */
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

/* Benchmarks and self-checks: the dense bf16 matmul rate of the model's GEMM
 * at M x N x K (median of `iters`), and of cuBLAS (cublasGemmEx, loaded with
 * dlopen; 0 when unavailable), and the largest |mine - cublas| / max|cublas|. */
typedef struct oi_rm_gemm_bench {
  double mine_tflops, cublas_tflops, max_rel_diff;
  int cublas_found;
} oi_rm_gemm_bench;
oi_status oi__rm_cuda_gemm_bench(int device, uint32_t M, uint32_t N, uint32_t K, uint32_t iters,
                                 oi_rm_gemm_bench *out);

#endif
