// The GPU decoder of the codec frames (docs/codecs.md): the same formats as
// lib/codec's cpu decoder, byte for byte. The host verifies each frame's
// header and checksum and cuts it into pieces (oi__codec_pieces); here:
//  - a lossless rANS stream: one warp; its lanes build the stream's decode
//    table in shared memory, lane 0 runs the four interleaved states (the
//    stream is one serial chain, as on the cpu; a frame's streams and the
//    batch's frames run in parallel), then the warp merges the exponents
//    with the sign+mantissa plane into bf16;
//  - a wide rANS stream: one warp, a round of 32 symbols at a time (lane k
//    holds state k; the lanes that need a word find it by a prefix count),
//    each exponent merged with its sign+mantissa byte as it is decoded;
//  - a stream of the planes code: a CTA, a warp a chunk (codec_planes.cu);
//  - raw exponents: the warp merges;
//  - int8 / fp8: a grid over the payload's elements, each scaled and
//    rounded to bf16 exactly as the cpu does (one IEEE multiply, round to
//    nearest even);
//  - int8-hadamard: a warp per transform block (or 32 codes): the exact
//    integer Walsh-Hadamard transform by butterflies in registers and
//    across lanes, then int8's one multiply.
// A stream that does not decode marks its frame's status; the frame's other
// pieces still run and the caller drops the block.
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels.h"

#define RANS_L (1u << 23)
#define PROB_BITS 12
#define PROB_SCALE (1u << PROB_BITS)
#define PROB_MASK (PROB_SCALE - 1)
#define WARPS 2 // per CTA of the lossless kernel: 2 x 17 KiB of shared memory

struct warp_smem {
  uint32_t tab[PROB_SCALE]; // slot -> symbol | (freq - 1) << 8 | (slot - start) << 20
  uint16_t start[256];      // of the present symbols, in order
  uint8_t sym[256];
};

__device__ static inline uint32_t le32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

// Lane 0 reads a stream's frequency table (as oi__rans_table_read does,
// with its checks), calling emit(index, symbol, freq, start) for each
// present symbol in order; *m gets their number. Returns the table's
// length in bytes, 0 when it is damaged.
template <typename Emit>
__device__ static uint32_t read_freqs(const uint8_t *src, uint32_t len, uint32_t *m, Emit emit) {
  if (len < 2) return 0;
  const uint8_t *p = src, *end = src + len;
  int lo = p[0], hi = p[1];
  p += 2;
  if (hi < lo) return 0;
  uint32_t sum = 0, k = 0;
  for (int s = lo; s <= hi; s++) {
    uint32_t v = 0;
    for (int shift = 0;; shift += 7) {
      if (p >= end || shift > 7) return 0;
      uint8_t b = *p++;
      v |= (uint32_t)(b & 0x7f) << shift;
      if (!(b & 0x80)) break;
    }
    if (v > PROB_SCALE || sum + v > PROB_SCALE) return 0;
    if (v) emit(k++, (uint32_t)s, v, sum);
    sum += v;
  }
  *m = k;
  return sum == PROB_SCALE ? (uint32_t)(p - src) : 0;
}

// Lane 0 reads the stream's table (as oi__rans_decode does, with its
// checks) into the present symbols' starts; then every lane fills the slots.
// Returns the table's length in bytes, 0 when it is damaged (every lane).
__device__ static uint32_t build_table(const uint8_t *src, uint32_t len, warp_smem *w,
                                       unsigned lane) {
  uint32_t used = 0, m = 0;
  if (lane == 0)
    used = read_freqs(src, len, &m, [w](uint32_t i, uint32_t s, uint32_t, uint32_t start) {
      w->start[i] = (uint16_t)start;
      w->sym[i] = (uint8_t)s;
    });
  used = __shfl_sync(0xffffffffu, used, 0);
  m = __shfl_sync(0xffffffffu, m, 0);
  __syncwarp();
  if (!used) return 0;
  for (uint32_t j = lane; j < PROB_SCALE; j += 32) {
    // the last present symbol whose start is <= j
    uint32_t a = 0, b = m; // start[a] <= j < start[b] (start[m] taken as 4096)
    while (b - a > 1) {
      uint32_t c = (a + b) / 2;
      if (w->start[c] <= j)
        a = c;
      else
        b = c;
    }
    uint32_t st = w->start[a], next = a + 1 < m ? w->start[a + 1] : PROB_SCALE;
    w->tab[j] = (uint32_t)w->sym[a] | (next - st - 1) << 8 | (j - st) << 20;
  }
  __syncwarp();
  return used;
}

// Lane 0: decodes `n` exponents of the stream (after its table) into the
// low bytes of out16[0..n). True when the stream ends as the encoder began.
__device__ static bool rans_run(const uint8_t *p, const uint8_t *end, const uint32_t *tab,
                                uint8_t *out, uint32_t n) {
  if (end - p < 16) return false;
  uint32_t x0 = le32(p), x1 = le32(p + 4), x2 = le32(p + 8), x3 = le32(p + 12);
  p += 16;
  if (x0 < RANS_L || x1 < RANS_L || x2 < RANS_L || x3 < RANS_L) return false;
  uint32_t i = 0;
#define DECODE(xv, o)                                                                              \
  do {                                                                                             \
    uint32_t e_ = tab[(xv)&PROB_MASK];                                                             \
    (xv) = (((e_ >> 8) & 0xfffu) + 1) * ((xv) >> PROB_BITS) + (e_ >> 20);                          \
    (o) = (uint8_t)e_;                                                                             \
  } while (0)
#define RENORM(xv)                                                                                 \
  do {                                                                                             \
    uint32_t b_ = ((xv) < RANS_L) + ((xv) < (RANS_L >> 8));                                        \
    uint32_t w_ = (uint32_t)p[0] << 8 | p[1];                                                      \
    (xv) = (uint32_t)((uint64_t)(xv) << (8 * b_)) | (w_ >> (16 - 8 * b_));                         \
    p += b_;                                                                                       \
  } while (0)
  while (i + 4 <= n && end - p >= 8) {
    DECODE(x0, out[2 * i]);
    RENORM(x0);
    DECODE(x1, out[2 * i + 2]);
    RENORM(x1);
    DECODE(x2, out[2 * i + 4]);
    RENORM(x2);
    DECODE(x3, out[2 * i + 6]);
    RENORM(x3);
    i += 4;
  }
#undef RENORM
  uint32_t x[4] = {x0, x1, x2, x3};
  for (; i < n; i++) {
    uint32_t *xs = &x[i % 4];
    DECODE(*xs, out[2 * i]);
    while (*xs < RANS_L) {
      if (p >= end) return false;
      *xs = (*xs << 8) | *p++;
    }
  }
#undef DECODE
  return p == end && x[0] == RANS_L && x[1] == RANS_L && x[2] == RANS_L && x[3] == RANS_L;
}

__global__ static void __launch_bounds__(32 * WARPS)
    lossless_kernel(const oi_kdec_item *__restrict__ items, uint32_t n, int32_t *status) {
  __shared__ warp_smem smem[WARPS];
  const unsigned lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  warp_smem *w = &smem[warp];
  for (uint32_t k = blockIdx.x * WARPS + warp; k < n; k += gridDim.x * WARPS) {
    const oi_kdec_item it = items[k];
    uint8_t *out = reinterpret_cast<uint8_t *>(it.dst);
    const uint8_t *src = reinterpret_cast<const uint8_t *>(it.src);
    const uint8_t *sm = reinterpret_cast<const uint8_t *>(it.aux);
    if (it.kind == OI_KDEC_BYTES) {
      for (uint32_t i = lane; i < it.count; i += 32)
        out[i] = src[i];
      continue;
    }
    if (it.kind != OI_KDEC_RANS && it.kind != OI_KDEC_RAW_EXP) continue;
    bool ok = true;
    if (it.kind == OI_KDEC_RANS) {
      uint32_t used = build_table(src, it.len, w, lane);
      if (lane == 0) ok = used && rans_run(src + used, src + it.len, w->tab, out, it.count);
      ok = __shfl_sync(0xffffffffu, ok ? 1 : 0, 0);
      __syncwarp(); // lane 0's exponents (the low bytes of out) before the merge
      if (!ok) {
        if (lane == 0) atomicMax(&status[it.frame], OI_KDEC_BAD_STREAM);
        continue;
      }
    }
    uint16_t *o16 = reinterpret_cast<uint16_t *>(out);
    for (uint32_t i = lane; i < it.count; i += 32) {
      uint32_t e = it.kind == OI_KDEC_RANS ? out[2 * i] : src[i], s = sm[i];
      o16[i] = (uint16_t)((s & 0x80) << 8 | e << 7 | (s & 0x7f));
    }
    __syncwarp(); // the next stream's table is built over this one's
  }
}

// ---- the wide stream (lib/codec/rans.h): a warp-wide round at a time ----

#define RANS32_L (1u << 16)
#define WIDE_WARPS 4 // per CTA of the wide kernel: 4 x 5 KiB of shared memory

struct wide_smem {
  uint8_t idx[PROB_SCALE]; // slot -> the index of its symbol among the present ones
  uint32_t info[256];      // index -> symbol | (freq - 1) << 8 | start << 20
};

// As build_table, into the smaller table: lane 0 reads the frequencies,
// every lane fills four slots at a time. Returns the table's length in
// bytes, 0 when it is damaged (every lane).
__device__ static uint32_t build_wide_table(const uint8_t *src, uint32_t len, wide_smem *w,
                                            unsigned lane) {
  uint32_t used = 0, m = 0;
  if (lane == 0)
    used = read_freqs(src, len, &m, [w](uint32_t i, uint32_t s, uint32_t v, uint32_t start) {
      w->info[i] = s | (v - 1) << 8 | start << 20;
    });
  used = __shfl_sync(0xffffffffu, used, 0);
  m = __shfl_sync(0xffffffffu, m, 0);
  __syncwarp();
  if (!used) return 0;
  for (uint32_t j = 4 * lane; j < PROB_SCALE; j += 128) {
    uint32_t a = 0, b = m; // start(a) <= j < start(b) (start(m) taken as 4096)
    while (b - a > 1) {
      uint32_t c = (a + b) / 2;
      if ((w->info[c] >> 20) <= j)
        a = c;
      else
        b = c;
    }
    uint32_t word = 0;
    for (uint32_t q = 0; q < 4; q++) {
      while (a + 1 < m && (w->info[a + 1] >> 20) <= j + q)
        a++;
      word |= a << (8 * q);
    }
    reinterpret_cast<uint32_t *>(w->idx)[j / 4] = word;
  }
  __syncwarp();
  return used;
}

__device__ static inline uint32_t word_at(const uint8_t *words, uint32_t nwords, uint32_t j) {
  return j < nwords ? (uint32_t)words[2 * j] | (uint32_t)words[2 * j + 1] << 8 : 0;
}

// The warp's state while it decodes a wide stream.
struct wide_state {
  uint32_t x;           // this lane's rANS state
  uint32_t base, pos;   // the window's first word; the next word to read
  uint32_t win, next;   // this lane's word of the window's first 32 and of the next 32
  const uint8_t *words; // the stream's words
  uint32_t nwords;
};

// One round: symbols r..r+31 (lane k: r + k), `s` this lane's
// sign+mantissa byte (loaded rounds ahead). False when the stream reads
// past its words (every lane).
__device__ static inline bool wide_round(wide_state &st, const wide_smem *w, uint16_t *out16,
                                         uint32_t r, uint32_t n, uint32_t s, unsigned lane) {
  const uint32_t i = r + lane;
  const bool active = i < n;
  uint32_t e = 0, x = st.x;
  if (active) {
    e = w->info[w->idx[x & PROB_MASK]];
    x = (((e >> 8) & 0xfffu) + 1) * (x >> PROB_BITS) + (x & PROB_MASK) - (e >> 20);
  }
  const bool need = active && x < RANS32_L;
  const unsigned ask = __ballot_sync(0xffffffffu, need);
  const uint32_t k = st.pos - st.base + __popc(ask & ((1u << lane) - 1)); // < 64
  const uint32_t a = __shfl_sync(0xffffffffu, st.win, k & 31),
                 b = __shfl_sync(0xffffffffu, st.next, k & 31);
  if (need) x = x << 16 | (k < 32 ? a : b);
  st.x = x;
  st.pos += __popc(ask);
  if (st.pos > st.nwords) return false;
  if (st.pos - st.base >= 32) {
    st.base += 32;
    st.win = st.next;
    st.next = word_at(st.words, st.nwords, st.base + 32 + lane);
  }
  if (active) out16[i] = (uint16_t)((s & 0x80) << 8 | (e & 0xff) << 7 | (s & 0x7f));
  return true;
}

#define WIDE_CHUNK 8 // rounds whose sign+mantissa bytes are loaded a chunk ahead

// The warp decodes a wide stream of `n` exponents round by round (lane k
// holds state k) and merges each with its sign+mantissa byte into out16.
// The stream's words are read through a window of 64 (two per lane, the
// next 32 loaded as the first 32 are used up): a lane that needs a word
// takes the one at the round's position plus its rank among the lanes that
// need one. The sign+mantissa bytes of the next WIDE_CHUNK rounds are
// loaded while this chunk decodes, so no round waits on device memory.
// True when every state ends where the encoder began and the words are
// used up exactly.
__device__ static bool wide_run(const uint8_t *p, const uint8_t *end, const wide_smem *w,
                                const uint8_t *sm, uint16_t *out16, uint32_t n, unsigned lane) {
  if (end - p < 4 * 32 || (end - p) % 2) return false;
  wide_state st;
  st.x = le32(p + 4 * lane);
  if (!__all_sync(0xffffffffu, st.x >= RANS32_L)) return false;
  st.words = p + 4 * 32;
  st.nwords = (uint32_t)(end - st.words) / 2;
  st.base = st.pos = 0;
  st.win = word_at(st.words, st.nwords, lane);
  st.next = word_at(st.words, st.nwords, 32 + lane);
  uint32_t cur[WIDE_CHUNK], ahead[WIDE_CHUNK];
#pragma unroll
  for (int j = 0; j < WIDE_CHUNK; j++) {
    uint32_t i = 32 * j + lane;
    cur[j] = i < n ? sm[i] : 0;
  }
  for (uint32_t r = 0; r < n; r += 32 * WIDE_CHUNK) {
#pragma unroll
    for (int j = 0; j < WIDE_CHUNK; j++) {
      uint32_t i = r + 32 * (WIDE_CHUNK + j) + lane;
      ahead[j] = i < n ? sm[i] : 0;
    }
#pragma unroll
    for (int j = 0; j < WIDE_CHUNK; j++)
      if (!wide_round(st, w, out16, r + 32 * j, n, cur[j], lane)) return false;
#pragma unroll
    for (int j = 0; j < WIDE_CHUNK; j++)
      cur[j] = ahead[j];
  }
  return __all_sync(0xffffffffu, st.x == RANS32_L) && st.pos == st.nwords;
}

__global__ static void __launch_bounds__(32 * WIDE_WARPS)
    wide_kernel(const oi_kdec_item *__restrict__ items, uint32_t n, int32_t *status) {
  __shared__ wide_smem smem[WIDE_WARPS];
  const unsigned lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  wide_smem *w = &smem[warp];
  for (uint32_t k = blockIdx.x * WIDE_WARPS + warp; k < n; k += gridDim.x * WIDE_WARPS) {
    const oi_kdec_item it = items[k];
    if (it.kind != OI_KDEC_RANS32) continue;
    const uint8_t *src = reinterpret_cast<const uint8_t *>(it.src);
    uint32_t used = build_wide_table(src, it.len, w, lane);
    bool ok =
        used && wide_run(src + used, src + it.len, w, reinterpret_cast<const uint8_t *>(it.aux),
                         reinterpret_cast<uint16_t *>(it.dst), it.count, lane);
    if (!ok && lane == 0) atomicMax(&status[it.frame], OI_KDEC_BAD_STREAM);
    __syncwarp(); // the next stream's table is built over this one's
  }
}

__device__ static inline uint16_t f32_to_bf16(float f) {
  uint32_t u = __float_as_uint(f);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

// e4m3 ("fn") code to float, exactly (powers of two built from their bits).
__device__ static inline float e4m3_value(uint32_t c) {
  uint32_t exp = (c >> 3) & 15, mant = c & 7;
  float v = exp ? (float)(8 + mant) * __uint_as_float((exp - 10 + 127) << 23)
                : (float)mant * __uint_as_float((127u - 9) << 23);
  return (c & 0x80) ? -v : v;
}

// One CTA row per item (blockIdx.y), the row's CTAs striding its elements.
__global__ static void lossy_kernel(const oi_kdec_item *__restrict__ items, int32_t *status) {
  const oi_kdec_item it = items[blockIdx.y];
  if (it.kind != OI_KDEC_INT8 && it.kind != OI_KDEC_FP8) return;
  const uint8_t *src = reinterpret_cast<const uint8_t *>(it.src);
  uint16_t *out = reinterpret_cast<uint16_t *>(it.dst);
  const uint64_t d = it.head_dim;
  const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
  if (it.kind == OI_KDEC_INT8) {
    const uint64_t groups = it.count, elems = groups * d;
    const int8_t *q = reinterpret_cast<const int8_t *>(src + 2 * groups);
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < elems; i += stride) {
      uint64_t g = i / d;
      uint16_t s16 = (uint16_t)(src[2 * g] | src[2 * g + 1] << 8);
      float scale = __half2float(__ushort_as_half(s16));
      if (!(fabsf(scale) <= 65504.0f)) {
        atomicMax(&status[it.frame], OI_KDEC_BAD_SCALE);
        return;
      }
      out[i] = f32_to_bf16((float)q[i] * scale);
    }
  } else {
    const uint64_t P = it.count, T = it.tokens, H = it.heads, elems = P * T * H * d;
    const uint8_t *codes = src + P * H * 4;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < elems; i += stride) {
      uint64_t p = i / (T * H * d), h = (i / d) % H;
      float scale = __uint_as_float(le32(src + (p * H + h) * 4));
      uint32_t c = codes[i];
      if (!(fabsf(scale) <= 3.402823466e38f) || (c & 0x7f) == 0x7f) {
        atomicMax(&status[it.frame], (c & 0x7f) == 0x7f ? OI_KDEC_NAN_CODE : OI_KDEC_BAD_SCALE);
        return;
      }
      out[i] = f32_to_bf16(e4m3_value(c) * scale);
    }
  }
}

// int8-hadamard (lib/codec/int8.c): a warp per chunk of max(b, 32) codes, b
// the transform block (head_dim's largest power-of-two divisor, at most
// 256): lane k holds E = max(b / 32, 1) consecutive codes; the transform's
// butterflies run in registers for strides below E and across lanes
// (__shfl_xor) above. Integer sums are exact in any order, so t = H q is
// the cpu's; then the one multiply by scale * 2^-(log2(b) - floor(log2(b)
// / 2)) and bf16, as int8.
template <int E>
__device__ static void int8h_chunks(const oi_kdec_item &it, int32_t *status, uint32_t b,
                                    uint32_t lg, unsigned lane, uint64_t first, uint64_t step) {
  const uint8_t *src = reinterpret_cast<const uint8_t *>(it.src);
  uint16_t *out = reinterpret_cast<uint16_t *>(it.dst);
  const uint64_t d = it.head_dim, groups = it.count, elems = groups * d;
  const int8_t *q = reinterpret_cast<const int8_t *>(src + 2 * groups);
  const float up = __uint_as_float((127u - (lg - lg / 2)) << 23);
  for (uint64_t c = first; c * 32 * E < elems; c += step) {
    const uint64_t i0 = c * 32 * E + (uint64_t)lane * E; // this lane's first code
    const bool active = i0 < elems;                      // (E = 1 past a short last chunk)
    int32_t v[E];
#pragma unroll
    for (int j = 0; j < E; j++)
      v[j] = active ? q[i0 + j] : 0;
#pragma unroll
    for (int h = 1; h < E; h <<= 1)
#pragma unroll
      for (int j = 0; j < E; j++)
        if (!(j & h)) {
          const int32_t a = v[j], e = v[j + h];
          v[j] = a + e;
          v[j + h] = a - e;
        }
    for (uint32_t h = E; h < b; h <<= 1) {
      const unsigned m = h / E; // the partner lane's distance
#pragma unroll
      for (int j = 0; j < E; j++) {
        const int32_t p = __shfl_xor_sync(0xffffffffu, v[j], m);
        v[j] = (lane & m) ? p - v[j] : v[j] + p;
      }
    }
    if (!active) continue;
    const uint64_t g = i0 / d;
    const uint16_t s16 = (uint16_t)(src[2 * g] | src[2 * g + 1] << 8);
    const float scale = __half2float(__ushort_as_half(s16));
    if (!(fabsf(scale) <= 65504.0f)) atomicMax(&status[it.frame], OI_KDEC_BAD_SCALE);
    const float mul = scale * up; // exact: a power of two
#pragma unroll
    for (int j = 0; j < E; j++)
      out[i0 + j] = f32_to_bf16(__fmul_rn((float)v[j], mul));
  }
}

// One CTA row per item (blockIdx.y), the row's warps striding its chunks.
__global__ static void int8h_kernel(const oi_kdec_item *__restrict__ items, int32_t *status) {
  const oi_kdec_item it = items[blockIdx.y];
  if (it.kind != OI_KDEC_INT8H) return;
  uint32_t b = (uint32_t)(it.head_dim & (0u - (uint32_t)it.head_dim)), lg = 0;
  if (b > 256) b = 256;
  while ((1u << lg) < b)
    lg++;
  const unsigned lane = threadIdx.x & 31;
  const uint64_t first = (uint64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32,
                 step = (uint64_t)gridDim.x * (blockDim.x / 32);
  switch (b <= 32 ? 1 : b / 32) {
  case 1: int8h_chunks<1>(it, status, b, lg, lane, first, step); break;
  case 2: int8h_chunks<2>(it, status, b, lg, lane, first, step); break;
  case 4: int8h_chunks<4>(it, status, b, lg, lane, first, step); break;
  default: int8h_chunks<8>(it, status, b, lg, lane, first, step); break;
  }
}

extern "C" int oi_kernel_codec_decode(const oi_kdec_item *items, uint32_t n, unsigned lossless,
                                      uint64_t max_lossy_elems, int32_t *status, void *stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (n == 0) return cudaSuccess;
  // each kernel skips the others' kinds
  if (lossless & oi_kdec_lossless_kernel(OI_KDEC_RANS)) {
    uint32_t ctas = (n + WARPS - 1) / WARPS;
    if (ctas > 65535u) ctas = 65535u;
    lossless_kernel<<<ctas, 32 * WARPS, 0, s>>>(items, n, status);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  if (lossless & oi_kdec_lossless_kernel(OI_KDEC_RANS32)) {
    uint32_t ctas = (n + WIDE_WARPS - 1) / WIDE_WARPS;
    if (ctas > 65535u) ctas = 65535u;
    wide_kernel<<<ctas, 32 * WIDE_WARPS, 0, s>>>(items, n, status);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  if (lossless & oi_kdec_lossless_kernel(OI_KDEC_PLANES)) {
    cudaError_t err = (cudaError_t)oi_kernel_planes_decode(items, n, status, stream);
    if (err != cudaSuccess) return err;
  }
  if (max_lossy_elems) {
    // rows of at most 65535 items (a grid's y), each over its elements
    uint64_t per_row = (max_lossy_elems + 255) / 256;
    uint32_t x = per_row > 64 ? 64 : (uint32_t)per_row;
    for (uint32_t first = 0; first < n; first += 65535u) {
      uint32_t rows = n - first < 65535u ? n - first : 65535u;
      lossy_kernel<<<dim3(x, rows), 256, 0, s>>>(items + first, status);
      cudaError_t err = cudaGetLastError();
      if (err != cudaSuccess) return err;
      int8h_kernel<<<dim3(x, rows), 256, 0, s>>>(items + first, status);
      if ((err = cudaGetLastError()) != cudaSuccess) return err;
    }
  }
  return cudaSuccess;
}

__global__ static void zero_failed_kernel(const int32_t *__restrict__ status, uint8_t *blocks,
                                          uint64_t block_bytes) {
  if (status[blockIdx.y] == 0) return;
  uint8_t *b = blocks + (uint64_t)blockIdx.y * block_bytes;
  for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < block_bytes;
       i += (uint64_t)gridDim.x * blockDim.x)
    b[i] = 0;
}

extern "C" int oi_kernel_codec_zero_failed(const int32_t *status, uint32_t n, uint8_t *blocks,
                                           uint64_t block_bytes, void *stream) {
  for (uint32_t first = 0; first < n; first += 65535u) {
    uint32_t rows = n - first < 65535u ? n - first : 65535u;
    zero_failed_kernel<<<dim3(8, rows), 256, 0, static_cast<cudaStream_t>(stream)>>>(
        status + first, blocks + (uint64_t)first * block_bytes, block_bytes);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}
