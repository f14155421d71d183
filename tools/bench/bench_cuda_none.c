/* bench_cuda.h without the CUDA backend: every call fails. */
#include <string.h>

#include "bench_cuda.h"
#include "core/core.h"

int bench_cuda_spin(int device, uint32_t ctas, uint32_t iters, uint32_t count) {
  OI_UNUSED(device);
  OI_UNUSED(ctas);
  OI_UNUSED(iters);
  OI_UNUSED(count);
  return -1;
}

int bench_cuda_stream_create(int device, void **stream) {
  OI_UNUSED(device);
  *stream = NULL;
  return -1;
}

int bench_cuda_piecewise(void *stream, const bench_piece *pieces, size_t n) {
  OI_UNUSED(stream);
  OI_UNUSED(pieces);
  OI_UNUSED(n);
  return -1;
}

void bench_cuda_stream_destroy(void *stream) { OI_UNUSED(stream); }

oi_status bench_gemm(int device, uint32_t M, uint32_t N, uint32_t K, uint32_t iters,
                     bench_gemm_result *out) {
  OI_UNUSED(device);
  OI_UNUSED(M);
  OI_UNUSED(N);
  OI_UNUSED(K);
  OI_UNUSED(iters);
  memset(out, 0, sizeof *out);
  return oi__fail(OI_ERR_UNSUPPORTED, "gemm bench: this build has no CUDA backend");
}
