/* CUDA work of the benchmarks (the uninstalled `openinfer-bench`), kept out
 * of libopeninfer.so: the compute-bound interference stream and the
 * per-piece copy baseline (bench_cuda.cu), and the GEMM rate beside cuBLAS
 * (bench_gemm.c). Without the CUDA backend each fails with
 * OI_ERR_UNSUPPORTED (bench_cuda_none.c). */
#ifndef OI_TOOLS_BENCH_CUDA_H
#define OI_TOOLS_BENCH_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "openinfer/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* `count` compute-bound kernels of `ctas` CTAs and `iters` FMA iterations
 * each, back to back on a stream of their own on `device`; returns after
 * they ran. 0, or a cudaError_t as int. */
int bench_cuda_spin(int device, uint32_t ctas, uint32_t iters, uint32_t count);

/* One piece of a copy (device or pinned host addresses). */
typedef struct bench_piece {
  uint64_t src, dst, bytes;
} bench_piece;

/* The naive baseline: one cudaMemcpyAsync per piece on `stream` (from
 * bench_cuda_stream_create: non-blocking, the highest priority, as the
 * engine's streams), then a wait for the stream. 0, or a cudaError_t. */
int bench_cuda_stream_create(int device, void **stream);
int bench_cuda_piecewise(void *stream, const bench_piece *pieces, size_t n);
void bench_cuda_stream_destroy(void *stream);

/* The dense bf16 matmul rate of the reference model's GEMM at M x N x K
 * (median of `iters`), and of cuBLAS (0 when unavailable), and the largest
 * |mine - cublas| / max|cublas|. */
typedef struct bench_gemm_result {
  double mine_tflops, cublas_tflops, max_rel_diff;
  int cublas_found;
} bench_gemm_result;
oi_status bench_gemm(int device, uint32_t M, uint32_t N, uint32_t K, uint32_t iters,
                     bench_gemm_result *out);

#ifdef __cplusplus
}
#endif
#endif
