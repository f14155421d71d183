// The GPU encoder of the planes code (lib/codec/planes.h): a CTA a
// stream, its output byte for byte lib/codec's oi__planes_encode of the
// exponent bytes (bits 7..14) of the item's bf16 elements. Warp 0 picks
// the widths and the symbols from the stream's histogram; then each warp
// counts its chunks' escapes (ballots), the counts are summed ahead of
// each chunk, and each warp writes its chunks: a group's w1 words are w1
// ballots, an escape finds its place among the stream's by the sums and a
// prefix count, its level-2 code is or-ed into its bits (in shared memory,
// then copied out), its raw byte written. No step waits on a serial chain:
// every chunk is independent once the counts are summed. A stream whose
// level-2 plane is past P2_BYTES (more than 32,768 exponents, none of the
// encoder's streams of a model's block) is not coded: its frame is raw
// where the cpu's might not be.
#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels.h"
#include "planes_choose.cuh"

#define ENC_WARPS 8
#define P2_BYTES (32768u * PLANES_W_MAX / 8)

// Or-s the `w` bits of v into the little-endian bit string `bits` (shared
// memory) at bit `bit`: at most two words.
__device__ static inline void or_bits(uint32_t *bits, uint32_t bit, uint32_t v, uint32_t w) {
  const uint32_t sh = bit & 31;
  atomicOr(&bits[bit / 32], v << sh);
  if (sh + w > 32) atomicOr(&bits[bit / 32 + 1], v >> (32 - sh));
}

__global__ static void __launch_bounds__(32 * ENC_WARPS)
    planes_encode_kernel(const oi_kenc_item *__restrict__ items, uint32_t *lens) {
  __shared__ uint32_t h[256], cum[257];
  __shared__ unsigned long long key[256];
  __shared__ uint8_t sym[256], code1[256], code2[256];
  __shared__ planes_pick pick;
  __shared__ uint32_t p2s[P2_BYTES / 4 + 1];
  const oi_kenc_item it = items[blockIdx.x];
  const unsigned lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  const uint64_t n = it.count;
  if (n == 0 || !it.hist) {
    if (threadIdx.x == 0) lens[blockIdx.x] = 0;
    return;
  }
  for (uint32_t s = threadIdx.x; s < 256; s += blockDim.x)
    h[s] = reinterpret_cast<const uint32_t *>(it.hist)[s];
  __syncthreads();
  if (warp == 0) {
    const planes_pick p = planes_choose_warp(h, n, key, cum, sym, lane);
    if (lane == 0) pick = p;
  }
  __syncthreads();
  const planes_pick p = pick;
  if (p.bytes > it.cap) { // lossless.c: the streams do not pay
    if (threadIdx.x == 0) lens[blockIdx.x] = 0;
    return;
  }
  const uint32_t w1 = p.w1, w2 = p.w2, k1 = (1u << w1) - 1, k2 = w2 ? (1u << w2) - 1 : 0;
  for (uint32_t s = threadIdx.x; s < 256; s += blockDim.x) {
    code1[s] = (uint8_t)k1;
    code2[s] = (uint8_t)k2;
  }
  __syncthreads();
  for (uint32_t r = threadIdx.x; r < k1 + k2; r += blockDim.x) {
    if (r < k1)
      code1[sym[r]] = (uint8_t)r;
    else
      code2[sym[r]] = (uint8_t)(r - k1);
  }
  __syncthreads();
  const uint16_t *src = reinterpret_cast<const uint16_t *>(it.src);
  const uint32_t chunks = (uint32_t)((n + PLANES_CHUNK - 1) / PLANES_CHUNK),
                 groups = (uint32_t)((n + 31) / 32), n32 = (uint32_t)n;
  uint32_t *counts = reinterpret_cast<uint32_t *>(it.scratch); // per chunk: e1, e2, then sums
  const unsigned lt = (1u << lane) - 1;
  // pass 1: each chunk's escapes
  for (uint32_t c = warp; c < chunks; c += ENC_WARPS) {
    uint32_t c1 = 0, c2 = 0;
    const uint32_t g_end = (c + 1) * 32 < groups ? (c + 1) * 32 : groups;
    for (uint32_t g = c * 32; g < g_end; g++) {
      const uint32_t i = 32 * g + lane;
      const uint32_t e = i < n32 ? (src[i] >> 7) & 0xffu : 0;
      const bool esc1 = i < n32 && code1[e] == k1;
      const bool esc2 = esc1 && (!w2 || code2[e] == k2);
      c1 += __popc(__ballot_sync(0xffffffffu, esc1));
      c2 += __popc(__ballot_sync(0xffffffffu, esc2));
    }
    if (lane == 0) counts[2 * c] = c1, counts[2 * c + 1] = c2;
  }
  __syncthreads();
  // the sums ahead of each chunk (warp 0, 32 chunks a step), the stream's head
  uint8_t *dst = reinterpret_cast<uint8_t *>(it.dst);
  uint8_t *cnt = dst + 2 + k1 + k2, *p1 = cnt + 4 * chunks, *p2 = p1 + 4ull * w1 * groups;
  uint32_t *sums = counts + 2 * chunks;
  __shared__ uint64_t e1_total;
  if (warp == 0) {
    uint32_t s1 = 0, s2 = 0;
    for (uint32_t c0 = 0; c0 < chunks; c0 += 32) {
      const uint32_t c = c0 + lane;
      const uint32_t a1 = c < chunks ? counts[2 * c] : 0, a2 = c < chunks ? counts[2 * c + 1] : 0;
      uint32_t x1 = a1, x2 = a2;
      for (int d = 1; d < 32; d *= 2) {
        const uint32_t o1 = __shfl_up_sync(0xffffffffu, x1, d),
                       o2 = __shfl_up_sync(0xffffffffu, x2, d);
        if (lane >= (unsigned)d) x1 += o1, x2 += o2;
      }
      if (c < chunks) {
        sums[2 * c] = s1 + x1 - a1;
        sums[2 * c + 1] = s2 + x2 - a2;
        cnt[4 * c] = (uint8_t)a1;
        cnt[4 * c + 1] = (uint8_t)(a1 >> 8);
        cnt[4 * c + 2] = (uint8_t)a2;
        cnt[4 * c + 3] = (uint8_t)(a2 >> 8);
      }
      s1 += __shfl_sync(0xffffffffu, x1, 31);
      s2 += __shfl_sync(0xffffffffu, x2, 31);
    }
    if (lane == 0) e1_total = s1;
  }
  if (threadIdx.x == 0) dst[0] = (uint8_t)w1, dst[1] = (uint8_t)w2;
  for (uint32_t r = threadIdx.x; r < k1 + k2; r += blockDim.x)
    dst[2 + r] = sym[r];
  __syncthreads();
  const uint64_t bytes2 = (e1_total * w2 + 7) / 8;
  if (bytes2 > P2_BYTES) { // not coded (above)
    if (threadIdx.x == 0) lens[blockIdx.x] = 0;
    return;
  }
  uint8_t *p3 = p2 + bytes2;
  for (uint64_t j = threadIdx.x; j < (bytes2 + 3) / 4; j += blockDim.x)
    p2s[j] = 0;
  __syncthreads();
  // pass 2: the planes
  for (uint32_t c = warp; c < chunks; c += ENC_WARPS) {
    uint32_t b1 = sums[2 * c], b2 = sums[2 * c + 1];
    const uint32_t g_end = (c + 1) * 32 < groups ? (c + 1) * 32 : groups;
    for (uint32_t g = c * 32; g < g_end; g++) {
      const uint32_t i = 32 * g + lane;
      const uint32_t e = i < n32 ? (src[i] >> 7) & 0xffu : 0;
      const uint32_t code = i < n32 ? code1[e] : 0;
      uint32_t mine = 0; // lane j < 4 w1: byte j % 4 of word j / 4
#pragma unroll
      for (uint32_t b = 0; b < PLANES_W_MAX; b++) {
        if (b >= w1) break;
        const unsigned word = __ballot_sync(0xffffffffu, code >> b & 1u);
        if (lane / 4 == b) mine = word >> (8 * (lane % 4)) & 0xffu;
      }
      if (lane < 4 * w1) p1[4 * w1 * g + lane] = (uint8_t)mine;
      const bool esc1 = i < n32 && code == k1;
      const unsigned m1 = __ballot_sync(0xffffffffu, esc1);
      const uint32_t second = esc1 && w2 ? code2[e] : 0;
      if (esc1 && w2) or_bits(p2s, (b1 + __popc(m1 & lt)) * w2, second, w2);
      const bool esc2 = esc1 && (!w2 || second == k2);
      const unsigned m2 = __ballot_sync(0xffffffffu, esc2);
      if (esc2) p3[b2 + __popc(m2 & lt)] = (uint8_t)e;
      b1 += __popc(m1);
      b2 += __popc(m2);
    }
  }
  __syncthreads();
  const uint8_t *p2b = reinterpret_cast<const uint8_t *>(p2s);
  for (uint64_t j = threadIdx.x; j < bytes2; j += blockDim.x)
    p2[j] = p2b[j];
  if (threadIdx.x == 0) lens[blockIdx.x] = (uint32_t)p.bytes;
}

extern "C" int oi_kernel_planes_encode(const oi_kenc_item *items, uint32_t n, uint32_t *lens,
                                       void *stream) {
  if (n == 0) return cudaSuccess;
  if (n > 65535u) return cudaErrorInvalidValue;
  planes_encode_kernel<<<n, 32 * ENC_WARPS, 0, static_cast<cudaStream_t>(stream)>>>(items, lens);
  return cudaGetLastError();
}
