// The planes code's choice of widths (lib/codec/planes.c's
// oi__planes_choose) for one warp: the same symbols in the same order
// (by count, ties by symbol), the same shortest stream over every
// (w1, w2), so the GPU's streams are the cpu's byte for byte.
#ifndef OI_KERNELS_PLANES_CHOOSE_CUH
#define OI_KERNELS_PLANES_CHOOSE_CUH

#include <stdint.h>

#define PLANES_CHUNK 1024u
#define PLANES_W_MAX 7u

struct planes_pick {
  uint32_t w1, w2;
  uint64_t bytes;
};

__device__ static inline uint64_t planes_len(uint64_t n, uint32_t w1, uint32_t w2, uint64_t e1,
                                             uint64_t e2) {
  const uint64_t chunks = (n + PLANES_CHUNK - 1) / PLANES_CHUNK, groups = (n + 31) / 32;
  const uint64_t k1 = (1u << w1) - 1, k2 = w2 ? (1u << w2) - 1 : 0;
  return 2 + k1 + k2 + 4 * chunks + 4 * w1 * groups + (e1 * w2 + 7) / 8 + e2;
}

// h: the histogram in shared memory (256 counts summing to n); key: 256
// words of 64 bits and cum: 257 words, the warp's shared memory; sym (may
// be NULL): 256 bytes of shared memory that get the symbols in order.
// The order is a bitonic sort of count << 8 | (255 - symbol), largest
// first (so of equal counts the smaller symbol comes first). Every lane
// returns the choice.
__device__ static planes_pick planes_choose_warp(const uint32_t *h, uint64_t n,
                                                 unsigned long long *key, uint32_t *cum,
                                                 uint8_t *sym, unsigned lane) {
  for (uint32_t s = lane; s < 256; s += 32)
    key[s] = (unsigned long long)h[s] << 8 | (255u - s);
  __syncwarp();
  for (uint32_t k = 2; k <= 256; k *= 2)
    for (uint32_t j = k / 2; j > 0; j /= 2) {
      for (uint32_t t = lane; t < 128; t += 32) { // the pairs (i, i ^ j), i < i ^ j
        const uint32_t i = (t / j) * 2 * j + t % j, o = i ^ j;
        const unsigned long long a = key[i], b = key[o];
        const bool down = (i & k) == 0; // this run sorts largest first
        if (down ? a < b : a > b) key[i] = b, key[o] = a;
      }
      __syncwarp();
    }
  for (uint32_t r = lane; r < 256; r += 32) {
    cum[r + 1] = (uint32_t)(key[r] >> 8); // the sorted counts, shifted by one
    if (sym) sym[r] = (uint8_t)(255u - (key[r] & 0xffu));
  }
  __syncwarp();
  // their prefix sums: lane l sums places 8l + 1 .. 8l + 8
  uint32_t run = 0, v[8];
  for (int j = 0; j < 8; j++)
    run += v[j] = cum[8 * lane + 1 + j];
  uint32_t before = run;
  for (int d = 1; d < 32; d *= 2) {
    const uint32_t o = __shfl_up_sync(0xffffffffu, before, d);
    if (lane >= (unsigned)d) before += o;
  }
  before -= run;
  __syncwarp();
  for (int j = 0; j < 8; j++)
    cum[8 * lane + 1 + j] = before += v[j];
  if (lane == 0) cum[0] = 0;
  __syncwarp();
  planes_pick best = {0, 0, ~0ull};
  if (lane == 0)
    for (uint32_t w1 = 1; w1 <= PLANES_W_MAX; w1++) {
      const uint32_t k1 = (1u << w1) - 1;
      const uint64_t e1 = n - cum[k1];
      for (uint32_t w2 = 0; w2 <= PLANES_W_MAX; w2++) {
        if (w2 && !e1) break;
        const uint64_t e2 = w2 ? n - cum[k1 + (1u << w2) - 1] : e1;
        const uint64_t len = planes_len(n, w1, w2, e1, e2);
        if (len < best.bytes) best = planes_pick{w1, w2, len};
      }
    }
  best.w1 = __shfl_sync(0xffffffffu, best.w1, 0);
  best.w2 = __shfl_sync(0xffffffffu, best.w2, 0);
  best.bytes = __shfl_sync(0xffffffffu, best.bytes, 0);
  __syncwarp(); // key, cum and sym are read; the caller may reuse them
  return best;
}

#endif
