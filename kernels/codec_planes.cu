// The GPU decoder of the planes code's streams (lib/codec/planes.h): a CTA
// per stream, a warp per chunk of 1,024 exponents. No chunk waits on
// another: a warp finds where its chunk's escapes start by summing the
// counts of the chunks before it, then decodes its 32 groups of 32, each
// lane one exponent: its code from the group's w1 words (bit `lane` of
// each; the words' bytes loaded a byte a lane, then shuffled), an escape's
// place among the chunk's by a ballot and a prefix count, and the exponent
// merged with its sign+mantissa byte into bf16. Every check of the cpu
// decoder is made: the widths, the lengths, each chunk's counts against
// its codes, the zero padding; a stream that fails one sets its frame's
// status (its block is then not used).
#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels.h"

#define CHUNK 1024u
#define PLANES_WARPS 8
#define W_MAX 7u

struct planes_head {
  uint32_t w1, w2, k1, k2, chunks, groups;
  uint32_t e1, e2;       // the stream's escapes at levels 1 and 2
  const uint8_t *counts; // per chunk: e1 u16, e2 u16
  const uint8_t *p1, *p2, *p3;
  uint32_t bytes2;
  int ok;
};

__device__ static inline uint32_t get16(const uint8_t *p) { return p[0] | (uint32_t)p[1] << 8; }

// Warp 0 reads and checks the stream's head and counts (planes.c's
// oi__planes_decode, before its loop).
__device__ static void read_head(const oi_kdec_item &it, planes_head *h, unsigned lane) {
  const uint8_t *src = reinterpret_cast<const uint8_t *>(it.src);
  const uint32_t n = it.count;
  bool ok = it.len >= 2 && n > 0;
  uint32_t w1 = ok ? src[0] : 0, w2 = ok ? src[1] : 0;
  ok = ok && w1 >= 1 && w1 <= W_MAX && w2 <= W_MAX;
  const uint32_t k1 = (1u << w1) - 1, k2 = w2 ? (1u << w2) - 1 : 0;
  const uint32_t chunks = (n + CHUNK - 1) / CHUNK, groups = (n + 31) / 32;
  const uint64_t head = 2ull + k1 + k2 + 4ull * chunks + 4ull * w1 * groups;
  ok = ok && it.len >= head;
  uint32_t e1 = 0, e2 = 0;
  bool counts_ok = true;
  const uint8_t *counts = src + 2 + k1 + k2;
  for (uint32_t c = lane; ok && c < chunks; c += 32) {
    uint32_t c1 = get16(counts + 4 * c), c2 = get16(counts + 4 * c + 2);
    uint32_t in_chunk = n - c * CHUNK < CHUNK ? n - c * CHUNK : CHUNK;
    counts_ok = counts_ok && c1 <= in_chunk && c2 <= c1 && (w2 || c2 == c1);
    e1 += c1;
    e2 += c2;
  }
  for (int d = 16; d; d /= 2) {
    e1 += __shfl_xor_sync(0xffffffffu, e1, d);
    e2 += __shfl_xor_sync(0xffffffffu, e2, d);
  }
  ok = ok && __all_sync(0xffffffffu, counts_ok);
  const uint32_t bytes2 = (uint32_t)(((uint64_t)e1 * w2 + 7) / 8);
  ok = ok && (uint64_t)it.len == head + bytes2 + e2;
  const uint8_t *p1 = src + 2 + k1 + k2 + 4 * chunks, *p2 = p1 + 4ull * w1 * groups;
  const uint32_t tail = (uint32_t)(((uint64_t)e1 * w2) % 8);
  ok = ok && !(bytes2 && tail && (p2[bytes2 - 1] >> tail));
  if (lane == 0)
    *h = planes_head{w1, w2,     k1, k2, chunks,      groups, e1,
                     e2, counts, p1, p2, p2 + bytes2, bytes2, ok ? 1 : 0};
}

// One warp decodes chunk c, GROUPS_AHEAD groups at a time: their plane-1
// bytes (lane j < 4 w1 holds byte j of a group's words: bit L of word b is
// bit L % 8 of lane 4 b + L / 8's byte) and sign+mantissa bytes are loaded
// before any is decoded. False when its codes are not its counts or a
// group's padding is not zeros.
#define GROUPS_AHEAD 4
__device__ static bool decode_chunk(const oi_kdec_item &it, const planes_head &h,
                                    const uint8_t *sym, uint32_t c, unsigned lane) {
  const uint32_t n = it.count;
  // where the chunk's escapes start: the counts of the chunks before it
  uint32_t b1 = 0, b2 = 0;
  for (uint32_t j = lane; j < c; j += 32)
    b1 += get16(h.counts + 4 * j), b2 += get16(h.counts + 4 * j + 2);
  for (int d = 16; d; d /= 2) {
    b1 += __shfl_xor_sync(0xffffffffu, b1, d);
    b2 += __shfl_xor_sync(0xffffffffu, b2, d);
  }
  const uint32_t end1 = b1 + get16(h.counts + 4 * c), end2 = b2 + get16(h.counts + 4 * c + 2);
  const uint8_t *sm = reinterpret_cast<const uint8_t *>(it.aux);
  uint16_t *out16 = reinterpret_cast<uint16_t *>(it.dst);
  const unsigned lt = (1u << lane) - 1;
  const uint32_t w1 = h.w1, k1 = h.k1, gbytes = 4 * w1;
  const uint32_t g0 = c * (CHUNK / 32),
                 g_end = g0 + CHUNK / 32 < h.groups ? g0 + CHUNK / 32 : h.groups;
  bool ok = true;
  for (uint32_t ga = g0; ga < g_end; ga += GROUPS_AHEAD) {
    uint32_t pb[GROUPS_AHEAD], sb[GROUPS_AHEAD];
#pragma unroll
    for (int t = 0; t < GROUPS_AHEAD; t++) {
      const uint32_t g = ga + t, i = 32 * g + lane;
      pb[t] = g < g_end && lane < gbytes ? h.p1[gbytes * g + lane] : 0;
      sb[t] = g < g_end && i < n ? sm[i] : 0;
    }
#pragma unroll
    for (int t = 0; t < GROUPS_AHEAD; t++) {
      const uint32_t g = ga + t;
      if (g >= g_end) break;
      const uint32_t i = 32 * g + lane;
      const bool valid = i < n;
      uint32_t code = 0;
      for (uint32_t b = 0; b < w1; b++)
        code |= (__shfl_sync(0xffffffffu, pb[t], 4 * b + (lane >> 3)) >> (lane & 7) & 1u) << b;
      ok = ok && (valid || code == 0); // the codes past n are 0
      const bool esc1 = valid && code == k1;
      const unsigned m1 = __ballot_sync(0xffffffffu, esc1);
      uint32_t second = 0;
      bool esc2 = false;
      if (esc1) {
        const uint32_t r1 = b1 + __popc(m1 & lt);
        if (r1 >= end1) {
          ok = false;
        } else if (h.w2) {
          const uint32_t bit = r1 * h.w2, at = bit >> 3, sh = bit & 7;
          uint32_t v = h.p2[at];
          if (sh + h.w2 > 8) v |= (uint32_t)h.p2[at + 1] << 8;
          second = v >> sh & ((1u << h.w2) - 1);
          esc2 = second == h.k2;
        } else {
          esc2 = true;
        }
      }
      const unsigned m2 = __ballot_sync(0xffffffffu, esc2);
      uint32_t e = 0;
      if (esc2) {
        const uint32_t r2 = b2 + __popc(m2 & lt);
        if (r2 >= end2)
          ok = false;
        else
          e = h.p3[r2];
      } else {
        e = sym[esc1 ? k1 + second : code];
      }
      if (valid && ok) out16[i] = (uint16_t)((sb[t] & 0x80) << 8 | e << 7 | (sb[t] & 0x7f));
      b1 += __popc(m1);
      b2 += __popc(m2);
    }
  }
  return __all_sync(0xffffffffu, ok) && b1 == end1 && b2 == end2;
}

__global__ static void __launch_bounds__(32 * PLANES_WARPS)
    planes_kernel(const oi_kdec_item *__restrict__ items, uint32_t n, int32_t *status) {
  __shared__ planes_head h;
  __shared__ uint8_t sym[2 * 128];
  const unsigned lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  for (uint32_t k = blockIdx.x; k < n; k += gridDim.x) {
    const oi_kdec_item it = items[k];
    if (it.kind != OI_KDEC_PLANES) continue;
    if (warp == 0) read_head(it, &h, lane);
    __syncthreads();
    if (h.ok) {
      const uint8_t *src = reinterpret_cast<const uint8_t *>(it.src);
      for (uint32_t j = threadIdx.x; j < h.k1 + h.k2; j += blockDim.x)
        sym[j] = src[2 + j];
      __syncthreads();
      bool ok = true;
      for (uint32_t c = warp; c < h.chunks; c += PLANES_WARPS)
        ok = decode_chunk(it, h, sym, c, lane) && ok;
      if (!ok && lane == 0) atomicMax(&status[it.frame], OI_KDEC_BAD_STREAM);
    } else if (threadIdx.x == 0) {
      atomicMax(&status[it.frame], OI_KDEC_BAD_STREAM);
    }
    __syncthreads(); // the next stream's head and symbols over this one's
  }
}

extern "C" int oi_kernel_planes_decode(const oi_kdec_item *items, uint32_t n, int32_t *status,
                                       void *stream) {
  if (n == 0) return cudaSuccess;
  const uint32_t ctas = n < 65535u ? n : 65535u;
  planes_kernel<<<ctas, 32 * PLANES_WARPS, 0, static_cast<cudaStream_t>(stream)>>>(items, n,
                                                                                   status);
  return cudaGetLastError();
}
