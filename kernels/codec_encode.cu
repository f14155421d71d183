// The GPU encoder of the wide rANS stream (lib/codec/rans32.c, the format
// in lib/codec/rans.h), byte for byte the cpu encoder's: one warp a
// stream. The warp counts the stream's exponents (bits 7..14 of each bf16
// element; each lane loads AHEAD rounds' at once, as the rounds below do)
// unless the item brings their histogram, normalises the counts to 12-bit
// frequencies exactly as the cpu does, and lane 0 writes the table. Then
// the rounds run backwards: lane k encodes the symbol of state k (its
// division by a multiply with the frequency's reciprocal, corrected to the
// exact quotient), and the lanes whose state must emit a word first find
// their place by a ballot (state 0's word lowest), writing downwards from
// the end of the item's scratch. Last, the final states and the words go
// behind the table.
#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels.h"

#define PROB_BITS 12
#define PROB_SCALE (1u << PROB_BITS)
#define RANS32_L (1u << 16)
#define ENC_WARPS 4
#define AHEAD 8       // rounds whose exponents a lane loads at once
#define COPY_AHEAD 16 // the words' bytes a lane moves at once

struct enc_smem {
  uint32_t count[256];
  uint32_t freq[256];
  uint32_t start[256];
  uint32_t rcp[256]; // floor((2^32 - 1) / freq): the rounds' quotient, corrected
};

__device__ static inline uint32_t exponent_of(const uint16_t *src, uint32_t i) {
  return (src[i] >> 7) & 0xffu;
}

// The warp's largest v (v > 0), the lowest symbol of equals; -1 when none.
__device__ static int warp_argmax(uint32_t v, int s) {
  if (!v) s = -1;
  for (int o = 16; o > 0; o >>= 1) {
    const uint32_t ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int os = __shfl_xor_sync(0xffffffffu, s, o);
    if (os >= 0 && (s < 0 || ov > v || (ov == v && os < s))) v = ov, s = os;
  }
  return s;
}

// rans_table.c's normalise, the same results: each lane computes its
// symbols' frequencies, then the warp finds the largest count (first of
// equals) and, while the sum is past the scale, the largest frequency
// above 1 (first of equals), as the cpu's scans do.
__device__ static void normalise(enc_smem *w, uint32_t n, unsigned lane) {
  uint32_t sum = 0, best = 0;
  int largest = -1;
  for (int s = lane; s < 256; s += 32) {
    const uint32_t c = w->count[s];
    uint32_t f = 0;
    if (c) {
      uint64_t q = ((uint64_t)c * PROB_SCALE + n / 2) / n;
      f = q ? (uint32_t)q : 1;
      if (c > best) best = c, largest = s; // ascending s: the first of equals
    }
    w->freq[s] = f;
    sum += f;
  }
  sum = __reduce_add_sync(0xffffffffu, sum);
  largest = warp_argmax(best, largest);
  __syncwarp();
  if (sum < PROB_SCALE) {
    if (lane == 0) w->freq[largest] += PROB_SCALE - sum;
    __syncwarp();
    return;
  }
  while (sum > PROB_SCALE) {
    uint32_t top = 0;
    int big = -1;
    for (int s = lane; s < 256; s += 32)
      if (w->freq[s] > 1 && w->freq[s] > top) top = w->freq[s], big = s;
    big = warp_argmax(top, big);
    const uint32_t fb = w->freq[big];
    uint32_t take = sum - PROB_SCALE;
    const uint32_t room = fb - fb / 2;
    if (take > room) take = room;
    if (!take) take = 1;
    __syncwarp();
    if (lane == 0) w->freq[big] = fb - take;
    __syncwarp();
    sum -= take;
  }
}

// The table's length: lo, hi and each frequency of lo..hi as LEB128.
__device__ static uint32_t table_len(const enc_smem *w) {
  int lo = 0, hi = 255;
  while (!w->freq[lo])
    lo++;
  while (!w->freq[hi])
    hi--;
  uint32_t tn = 2;
  for (int s = lo; s <= hi; s++)
    tn += w->freq[s] >= 0x80 ? 2 : 1; // (frequencies are below 2^14)
  return tn;
}

// Lane 0: the table (lo, hi, LEB128 frequencies) at dst and each present
// symbol's start. Returns its length.
__device__ static uint32_t write_table(enc_smem *w, uint8_t *dst) {
  int lo = 0, hi = 255;
  while (!w->freq[lo])
    lo++;
  while (!w->freq[hi])
    hi--;
  uint32_t tn = 0, at = 0;
  dst[tn++] = (uint8_t)lo;
  dst[tn++] = (uint8_t)hi;
  for (int s = lo; s <= hi; s++) {
    uint32_t v = w->freq[s];
    w->start[s] = at;
    at += v;
    while (v >= 0x80) {
      dst[tn++] = (uint8_t)(v | 0x80);
      v >>= 7;
    }
    dst[tn++] = (uint8_t)v;
  }
  return tn;
}

__global__ static void __launch_bounds__(32 * ENC_WARPS)
    rans32_encode_kernel(const oi_kenc_item *__restrict__ items, uint32_t n, uint32_t *lens) {
  __shared__ enc_smem smem[ENC_WARPS];
  const unsigned lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  const unsigned below = (1u << lane) - 1;
  enc_smem *w = &smem[warp];
  for (uint32_t k = blockIdx.x * ENC_WARPS + warp; k < n; k += gridDim.x * ENC_WARPS) {
    const oi_kenc_item it = items[k];
    const uint16_t *src = reinterpret_cast<const uint16_t *>(it.src);
    uint8_t *dst = reinterpret_cast<uint8_t *>(it.dst);
    uint8_t *scratch = reinterpret_cast<uint8_t *>(it.scratch);
    const uint32_t count = it.count;
    // the histogram: the item's, or lanes holding the same exponent add once (a match)
    const uint32_t *given = reinterpret_cast<const uint32_t *>(it.hist);
    for (uint32_t s = lane; s < 256; s += 32)
      w->count[s] = given ? given[s] : 0;
    __syncwarp();
    for (uint32_t r0 = 0; !given && r0 < count; r0 += 32 * AHEAD) { // AHEAD rounds' loads in flight
      uint32_t e[AHEAD];
#pragma unroll
      for (int t = 0; t < AHEAD; t++) {
        const uint32_t i = r0 + 32 * t + lane;
        e[t] = i < count ? exponent_of(src, i) : 256u + lane;
      }
#pragma unroll
      for (int t = 0; t < AHEAD; t++) {
        const unsigned same = __match_any_sync(0xffffffffu, e[t]);
        if (e[t] < 256u && lane == (unsigned)(__ffs(same) - 1))
          atomicAdd(&w->count[e[t]], __popc(same));
      }
    }
    __syncwarp();
    uint32_t tn = 0;
    if (count) normalise(w, count, lane);
    if (lane == 0 && count && it.cap >= table_len(w) + 4 * 32) tn = write_table(w, dst);
    tn = __shfl_sync(0xffffffffu, tn, 0);
    for (uint32_t s = lane; s < 256; s += 32)
      w->rcp[s] = w->freq[s] ? 0xffffffffu / w->freq[s] : 0;
    __syncwarp();
    if (!tn) { // nothing to code, or the table and states do not fit
      if (lane == 0) lens[k] = 0;
      continue;
    }
    // the rounds, backwards; words downwards from the scratch's end
    const uint32_t limit = tn + 4 * 32; // no word below the table and states
    uint32_t x = RANS32_L, ptr = it.cap;
    bool fits = true;
    const uint32_t rounds = (count + 31) / 32;
    for (uint32_t top = rounds; top > 0 && fits;) { // rounds top-1 down, AHEAD a chunk
      const uint32_t m = top < AHEAD ? top : AHEAD;
      uint32_t sym[AHEAD];
#pragma unroll
      for (int t = 0; t < AHEAD; t++) {
        const uint32_t i = (top - 1 - t) * 32 + lane;
        sym[t] = (uint32_t)t < m && i < count ? exponent_of(src, i) : 0;
      }
#pragma unroll
      for (int t = 0; t < AHEAD; t++) {
        if ((uint32_t)t >= m) break;
        const bool active = (top - 1 - t) * 32 + lane < count;
        const uint32_t s = sym[t];
        const uint32_t f = active ? w->freq[s] : 1;
        const bool emit = active && (uint64_t)x >= (uint64_t)f << 20;
        const unsigned ask = __ballot_sync(0xffffffffu, emit);
        const uint32_t c = 2 * __popc(ask);
        if (ptr < limit + c) {
          fits = false; // (every lane: the same ballot)
          break;
        }
        if (emit) {
          uint32_t at = ptr - c + 2 * __popc(ask & below);
          scratch[at] = (uint8_t)x;
          scratch[at + 1] = (uint8_t)(x >> 8);
          x >>= 16;
        }
        ptr -= c;
        if (active) { // x / f by a multiply, corrected: exactly the cpu's division
          uint32_t q = __umulhi(x, w->rcp[s]), r = x - q * f;
          while (r >= f)
            q++, r -= f;
          x = (q << PROB_BITS) + r + w->start[s];
        }
      }
      top -= m;
    }
    if (!fits) {
      if (lane == 0) lens[k] = 0;
      continue;
    }
    // the final states (state 0 first), then the words
    uint8_t *st = dst + tn + 4 * lane;
    st[0] = (uint8_t)x;
    st[1] = (uint8_t)(x >> 8);
    st[2] = (uint8_t)(x >> 16);
    st[3] = (uint8_t)(x >> 24);
    const uint32_t words = it.cap - ptr;
    for (uint32_t j0 = 0; j0 < words; j0 += 32 * COPY_AHEAD) { // COPY_AHEAD loads in flight
      uint8_t v[COPY_AHEAD];
#pragma unroll
      for (int t = 0; t < COPY_AHEAD; t++) {
        const uint32_t j = j0 + 32 * t + lane;
        v[t] = j < words ? scratch[ptr + j] : 0;
      }
#pragma unroll
      for (int t = 0; t < COPY_AHEAD; t++) {
        const uint32_t j = j0 + 32 * t + lane;
        if (j < words) dst[limit + j] = v[t];
      }
    }
    if (lane == 0) lens[k] = limit + words;
    __syncwarp();
  }
}

extern "C" int oi_kernel_rans32_encode(const oi_kenc_item *items, uint32_t n, uint32_t *lens,
                                       void *stream) {
  if (n == 0) return cudaSuccess;
  uint32_t ctas = (n + ENC_WARPS - 1) / ENC_WARPS;
  if (ctas > 65535u) ctas = 65535u;
  rans32_encode_kernel<<<ctas, 32 * ENC_WARPS, 0, static_cast<cudaStream_t>(stream)>>>(items, n,
                                                                                       lens);
  return cudaGetLastError();
}
