// Deterministic test/benchmark pattern written on the device, identical to
// oi__pattern_byte in lib/device/device.h, so multi-GiB arenas are filled
// without staging through the host.
#include <cuda_runtime.h>

#include "kernels.h"

__device__ static inline unsigned long long pattern_word(unsigned long long seed,
                                                         unsigned long long word) {
  unsigned long long x = seed * 0x9E3779B97F4A7C15ull + word * 0xBF58476D1CE4E5B9ull;
  x ^= x >> 31;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 29;
  return x;
}

__global__ static void fill_pattern_kernel(unsigned char *dst, size_t bytes,
                                           unsigned long long seed) {
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < bytes; i += stride)
    dst[i] = (unsigned char)(pattern_word(seed, i >> 3) >> ((i & 7) * 8));
}

extern "C" int oi_kernel_fill_pattern(void *dst, size_t bytes, uint64_t seed, void *stream) {
  if (bytes == 0) return (int)cudaSuccess;
  size_t blocks = (bytes + 255) / 256;
  if (blocks > 4096) blocks = 4096;
  fill_pattern_kernel<<<(unsigned)blocks, 256, 0, (cudaStream_t)stream>>>((unsigned char *)dst,
                                                                          bytes, seed);
  return (int)cudaGetLastError();
}
