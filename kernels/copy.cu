// The batch copy kernel: one launch moves every piece of a save or load
// (all blocks x all arenas x segments) between device arenas and mapped
// pinned host memory. Pieces arrive pre-split into entries of at most
// OI_KCOPY_CHUNK bytes, so CTAs share the work evenly; each CTA walks entries
// with a grid stride. Within an entry the widest access both addresses allow
// is used (16-byte vectors when src and dst agree modulo 16), with byte heads
// and tails for sizes and addresses that are not multiples of the width.
#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels.h"

// Copies `bytes` from src to dst with the threads [0, nthreads) of a group
// (a CTA, or a warp), `tid` being this thread's index in it: byte heads up
// to the destination's alignment (the source agrees modulo sizeof(W)), then
// words, each thread issuing up to UNROLL loads before its stores (guarded,
// so a piece's last round keeps its loads in flight too), then byte tails.
template <typename W, int UNROLL>
__device__ static inline void copy_words(const uint8_t *__restrict__ src, uint8_t *__restrict__ dst,
                                         uint64_t bytes, unsigned tid, unsigned nthreads) {
  uint64_t head = (sizeof(W) - ((uintptr_t)dst & (sizeof(W) - 1))) & (sizeof(W) - 1);
  if (head > bytes) head = bytes;
  for (uint64_t i = tid; i < head; i += nthreads)
    dst[i] = src[i];
  src += head;
  dst += head;
  bytes -= head;
  const W *s = reinterpret_cast<const W *>(src);
  W *d = reinterpret_cast<W *>(dst);
  const uint64_t words = bytes / sizeof(W);
  for (uint64_t i = tid; i < words; i += (uint64_t)nthreads * UNROLL) {
    W v[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; u++)
      if (i + (uint64_t)u * nthreads < words) v[u] = s[i + (uint64_t)u * nthreads];
#pragma unroll
    for (int u = 0; u < UNROLL; u++)
      if (i + (uint64_t)u * nthreads < words) d[i + (uint64_t)u * nthreads] = v[u];
  }
  for (uint64_t k = words * sizeof(W) + tid; k < bytes; k += nthreads)
    dst[k] = src[k];
}

// The widest words both addresses allow: 16 bytes when src and dst agree
// modulo 16, else 8, 4 or 1.
template <int UNROLL>
__device__ static inline void copy_piece(const uint8_t *__restrict__ src, uint8_t *__restrict__ dst,
                                         uint64_t bytes, unsigned tid, unsigned nthreads) {
  const uintptr_t mis = (uintptr_t)src ^ (uintptr_t)dst;
  if ((mis & 15) == 0)
    copy_words<int4, UNROLL>(src, dst, bytes, tid, nthreads);
  else if ((mis & 7) == 0)
    copy_words<uint2, UNROLL>(src, dst, bytes, tid, nthreads);
  else if ((mis & 3) == 0)
    copy_words<uint32_t, UNROLL>(src, dst, bytes, tid, nthreads);
  else
    copy_words<uint8_t, UNROLL>(src, dst, bytes, tid, nthreads);
}

__global__ static void batch_copy_kernel(const oi_kcopy_entry *__restrict__ entries, uint32_t n) {
  // The table may live in mapped host memory: one thread reads each entry,
  // one entry ahead, so the PCIe round trip overlaps the previous copy.
  __shared__ oi_kcopy_entry cur;
  oi_kcopy_entry next;
  if (threadIdx.x == 0 && blockIdx.x < n) next = entries[blockIdx.x];
  for (uint32_t e = blockIdx.x; e < n; e += gridDim.x) {
    __syncthreads(); // everyone is done with the previous entry
    if (threadIdx.x == 0) {
      cur = next;
      if (e + gridDim.x < n) next = entries[e + gridDim.x];
    }
    __syncthreads();
    const oi_kcopy_entry ent = cur;
    copy_piece<4>(reinterpret_cast<const uint8_t *>(ent.src), reinterpret_cast<uint8_t *>(ent.dst),
                  ent.bytes, threadIdx.x, blockDim.x);
  }
}

// Small pieces: one warp per entry, so a CTA of OI_KCOPY_THREADS threads has
// OI_KCOPY_THREADS / 32 entries in flight instead of one, and no barrier
// between entries. Lanes 0-2 read the next entry's three words while the
// warp copies.
__global__ static void warp_copy_kernel(const oi_kcopy_entry *__restrict__ entries, uint32_t n) {
  const unsigned lane = threadIdx.x & 31u;
  const uint32_t per_cta = blockDim.x / 32u;
  const uint32_t stride = gridDim.x * per_cta;
  uint32_t e = blockIdx.x * per_cta + threadIdx.x / 32u;
  const uint64_t *words = reinterpret_cast<const uint64_t *>(entries);
  unsigned long long f = 0;
  if (e < n && lane < 3) f = words[(uint64_t)e * 3 + lane];
  for (; e < n; e += stride) {
    const uint64_t src = __shfl_sync(0xffffffffu, f, 0);
    const uint64_t dst = __shfl_sync(0xffffffffu, f, 1);
    const uint64_t bytes = __shfl_sync(0xffffffffu, f, 2);
    const uint32_t next = e + stride;
    if (next < n && lane < 3) f = words[(uint64_t)next * 3 + lane];
    copy_piece<8>(reinterpret_cast<const uint8_t *>(src), reinterpret_cast<uint8_t *>(dst), bytes,
                  lane, 32u);
  }
}

extern "C" int oi_kernel_batch_copy_warps(const oi_kcopy_entry *entries, uint32_t n, uint32_t ctas,
                                          void *stream) {
  if (n == 0) return (int)cudaSuccess;
  const uint32_t per_cta = OI_KCOPY_THREADS / 32;
  if (ctas == 0) ctas = 1;
  if (ctas > (n + per_cta - 1) / per_cta) ctas = (n + per_cta - 1) / per_cta;
  warp_copy_kernel<<<ctas, OI_KCOPY_THREADS, 0, (cudaStream_t)stream>>>(entries, n);
  return (int)cudaGetLastError();
}

extern "C" int oi_kernel_batch_copy(const oi_kcopy_entry *entries, uint32_t n, uint32_t ctas,
                                    void *stream) {
  if (n == 0) return (int)cudaSuccess;
  if (ctas == 0) ctas = 1;
  if (ctas > n) ctas = n;
  batch_copy_kernel<<<ctas, OI_KCOPY_THREADS, 0, (cudaStream_t)stream>>>(entries, n);
  return (int)cudaGetLastError();
}
