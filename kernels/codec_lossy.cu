// Lossy frames made on the GPU (oi_kernel_lossy_frames): each block of a
// batch becomes the frame lib/codec's oi__codec_encode makes of it under
// int8, int8-hadamard or fp8, byte for byte (lib/codec/int8.c, fp8.c: the
// same float operations in the same order, each rounded as the cpu rounds
// it; products are rounded before a sum, never fused). Kernels on one
// stream:
//   head    the header's first 32 bytes, zeros behind the payload, and the
//           block's checksum item (the payload, seeded, into bytes 32..39)
//   int8    a warp per token and head: (int8-hadamard: the transform's
//           butterflies in shared memory, stride 1, 2, 4, ... as the cpu),
//           the scale, the codes
//   fp8     a CTA per part and head: the scale over the block's tokens, the
//           codes
//   hash    kernels/codec_frame.cu's XXH3 of each payload
// A block the cpu refuses (a non-finite value, an int8 scale past fp16's
// range) gets OI_KENC_REFUSED; its slot's bytes are then no frame.
#include <cuda_runtime.h>
#include <float.h>
#include <stdint.h>

#include "kernels.h"

#define INT8_WARPS 8
#define FP8_THREADS 256

__device__ static inline float bf16_f32(uint16_t b) { return __uint_as_float((uint32_t)b << 16); }

// codec_internal.h's oi__round_even: (y + 1.5 * 2^23) - 1.5 * 2^23.
__device__ static inline float round_even(float y) {
  return __fadd_rn(__fadd_rn(y, 12582912.0f), -12582912.0f);
}

// codec_internal.h's oi__f32_to_f16, step for step.
__device__ static inline uint16_t f32_to_f16(float f) {
  const uint32_t u = __float_as_uint(f);
  const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  const float a = fabsf(f);
  if (a >= 65520.0f) return sign | 0x7c00u;
  if (a < 6.103515625e-05f) return sign | (uint16_t)rintf(__fmul_rn(a, 16777216.0f));
  const uint32_t ua = __float_as_uint(a);
  const uint32_t exp = (ua >> 23) - 127 + 15, mant = ua & 0x7fffffu;
  uint32_t h = (exp << 10) | (mant >> 13);
  const uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1))) h++;
  return sign | (uint16_t)h;
}

// codec_internal.h's oi__f16_to_f32 for the finite halves a scale can be.
__device__ static inline float f16_f32(uint16_t h) {
  const uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  const float v =
      exp == 0 ? ldexpf((float)mant, -24) : ldexpf((float)(mant | 0x400), (int)exp - 25);
  return (h & 0x8000) ? -v : v;
}

// fp8.c's f32_to_e4m3.
__device__ static inline uint8_t f32_to_e4m3(float v) {
  uint32_t u = __float_as_uint(v);
  const uint8_t sign = (uint8_t)((u >> 24) & 0x80);
  u &= 0x7fffffffu;
  const float a = __uint_as_float(u);
  if (!(a < 448.0f)) return sign | 0x7e;
  if (a < 0.015625f) return sign | (uint8_t)round_even(__fmul_rn(a, 512.0f));
  const uint32_t r = (u + 0x7ffffu + ((u >> 20) & 1u)) >> 20;
  const uint32_t code = r - (120u << 3);
  return sign | (uint8_t)(code > 0x7e ? 0x7e : code);
}

__device__ static inline float warp_max(float v) {
  for (int o = 16; o; o >>= 1)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ static inline uint8_t *frame_of(const oi_klossy_args &a, uint32_t b) {
  return reinterpret_cast<uint8_t *>(a.frames) + (uint64_t)b * a.frame_bytes;
}

__device__ static inline void refuse(const oi_klossy_args &a, uint32_t b) {
  reinterpret_cast<int32_t *>(a.status)[b] = OI_KENC_REFUSED;
}

// A CTA a block: the header's first 32 bytes, the zeros behind the payload,
// the status, and the block's checksum item.
__global__ static void head_kernel(const oi_klossy_args a) {
  const uint32_t b = blockIdx.x;
  uint8_t *f = frame_of(a, b);
  for (uint32_t i = threadIdx.x; i < 32; i += blockDim.x)
    f[i] = i < 24 ? a.header[i] : 0;
  for (uint64_t i = OI_KFRAME_HEADER + a.payload_bytes + threadIdx.x; i < a.frame_bytes;
       i += blockDim.x)
    f[i] = 0;
  if (threadIdx.x == 0) {
    reinterpret_cast<int32_t *>(a.status)[b] = 0;
    oi_khash_item *it = reinterpret_cast<oi_khash_item *>(a.items) + b;
    *it = oi_khash_item{(uint64_t)(uintptr_t)(f + OI_KFRAME_HEADER), a.payload_bytes, a.seed,
                        (uint64_t)(uintptr_t)(f + 32),
                        a.scratch + (uint64_t)b * oi_klossy_scratch_bytes(a.payload_bytes)};
  }
}

// A warp per token and head (group g of the block, blockIdx.y): int8.c's
// oi__int8_encode of one group. rot > 1 (int8-hadamard): the values go
// through shared memory (a.head_dim floats a warp), where the butterflies
// of each rot-wide block run stage by stage, as fwht_f32 runs them.
__global__ static void __launch_bounds__(32 * INT8_WARPS) int8_kernel(const oi_klossy_args a) {
  extern __shared__ float ys[];
  const unsigned lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  const uint32_t b = blockIdx.y, d = a.head_dim, rot = a.rot_block;
  const uint64_t groups = (uint64_t)a.parts * a.tokens * a.heads;
  const uint64_t g = (uint64_t)blockIdx.x * INT8_WARPS + warp;
  if (g >= groups) return;
  const uint16_t *x =
      reinterpret_cast<const uint16_t *>(a.blocks + (uint64_t)b * a.block_bytes) + g * d;
  uint8_t *payload = frame_of(a, b) + OI_KFRAME_HEADER;
  int8_t *q = reinterpret_cast<int8_t *>(payload + 2 * groups) + g * d;
  float *y = ys + (uint64_t)warp * d;
  bool finite = true;
  float amax = 0.0f;
  if (rot > 1) {
    for (uint32_t i = lane; i < d; i += 32) {
      const float v = bf16_f32(x[i]);
      finite = finite && fabsf(v) <= FLT_MAX;
      y[i] = v;
    }
    __syncwarp();
    for (uint32_t h = 1; h < rot; h <<= 1) {
      for (uint32_t p = lane; p < d / 2; p += 32) {               // pair p: j = its lower index
        const uint32_t j = ((p & ~(h - 1)) << 1) | (p & (h - 1)); // h: a power of two
        const float lo = y[j], hi = y[j + h];
        y[j] = __fadd_rn(lo, hi);
        y[j + h] = __fsub_rn(lo, hi);
      }
      __syncwarp();
    }
    const float down = a.down;
    for (uint32_t i = lane; i < d; i += 32) {
      const float v = __fmul_rn(y[i], down);
      y[i] = v;
      amax = fabsf(v) > amax ? fabsf(v) : amax;
    }
  } else {
    for (uint32_t i = lane; i < d; i += 32) {
      const float v = bf16_f32(x[i]);
      finite = finite && fabsf(v) <= FLT_MAX;
      amax = fabsf(v) > amax ? fabsf(v) : amax;
    }
  }
  if (!__all_sync(0xffffffffu, finite)) {
    if (lane == 0) refuse(a, b);
    return;
  }
  amax = warp_max(amax); // (the largest of the same values: any order gives it)
  const uint16_t s16 = f32_to_f16(__fdiv_rn(amax, 127.0f));
  if ((s16 & 0x7c00u) == 0x7c00u) {
    if (lane == 0) refuse(a, b);
    return;
  }
  if (lane == 0) {
    payload[2 * g] = (uint8_t)s16;
    payload[2 * g + 1] = (uint8_t)(s16 >> 8);
  }
  const float scale = f16_f32(s16);
  const float inv = scale > 0.0f ? __fdiv_rn(1.0f, scale) : 0.0f;
  __syncwarp();
  for (uint32_t i = lane; i < d; i += 32) {
    const float v = rot > 1 ? y[i] : bf16_f32(x[i]);
    const float r = round_even(__fmul_rn(v, inv));
    q[i] = (int8_t)(r > 127.0f ? 127.0f : (r < -127.0f ? -127.0f : r));
  }
}

// A CTA per part and head (blockIdx.x = p * heads + h, blockIdx.y the
// block): fp8.c's oi__fp8_encode of one scale's values.
__global__ static void __launch_bounds__(FP8_THREADS) fp8_kernel(const oi_klossy_args a) {
  __shared__ float wmax[FP8_THREADS / 32];
  __shared__ int wbad[FP8_THREADS / 32];
  const uint32_t b = blockIdx.y, H = a.heads, D = a.head_dim, T = a.tokens;
  const uint32_t p = blockIdx.x / H, h = blockIdx.x % H;
  const uint16_t *src = reinterpret_cast<const uint16_t *>(a.blocks + (uint64_t)b * a.block_bytes);
  uint8_t *payload = frame_of(a, b) + OI_KFRAME_HEADER;
  uint8_t *codes = payload + (uint64_t)a.parts * H * 4;
  const uint32_t elems = T * D; // (u16 fields: no overflow)
  float amax = 0.0f;
  bool finite = true;
  for (uint32_t k = threadIdx.x; k < elems; k += blockDim.x) {
    const uint32_t t = k / D;
    const uint64_t off = (((uint64_t)p * T + t) * H + h) * D + (k - t * D);
    const float v = fabsf(bf16_f32(src[off]));
    finite = finite && v <= FLT_MAX;
    amax = v > amax ? v : amax;
  }
  const unsigned lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  amax = warp_max(amax);
  const bool all = __all_sync(0xffffffffu, finite);
  if (lane == 0) {
    wmax[warp] = amax;
    wbad[warp] = !all;
  }
  __syncthreads();
  bool bad = false;
  amax = 0.0f;
  for (int w = 0; w < FP8_THREADS / 32; w++) {
    amax = fmaxf(amax, wmax[w]);
    bad = bad || wbad[w];
  }
  if (bad) {
    if (threadIdx.x == 0) refuse(a, b);
    return;
  }
  const float scale = __fdiv_rn(amax, 448.0f);
  if (threadIdx.x == 0) {
    const uint32_t s = __float_as_uint(scale);
    uint8_t *out = payload + ((uint64_t)p * H + h) * 4;
    out[0] = (uint8_t)s;
    out[1] = (uint8_t)(s >> 8);
    out[2] = (uint8_t)(s >> 16);
    out[3] = (uint8_t)(s >> 24);
  }
  const float inv = scale > 0.0f ? __fdiv_rn(1.0f, scale) : 0.0f;
  const bool divide = !(inv <= FLT_MAX); // a scale below 2^-128: divide, as fp8.c
  for (uint32_t k = threadIdx.x; k < elems; k += blockDim.x) {
    const uint32_t t = k / D;
    const uint64_t off = (((uint64_t)p * T + t) * H + h) * D + (k - t * D);
    const float v = bf16_f32(src[off]);
    codes[off] = f32_to_e4m3(divide ? __fdiv_rn(v, scale) : __fmul_rn(v, inv));
  }
}

extern "C" int oi_kernel_lossy_frames(const oi_klossy_args *a, void *stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (a->n == 0) return cudaSuccess;
  const uint64_t groups = (uint64_t)a->parts * a->tokens * a->heads;
  const bool int8 = a->kind == OI_KLOSSY_INT8 || a->kind == OI_KLOSSY_INT8H;
  if (a->n > 65535u || !groups || !a->head_dim || a->payload_bytes <= 240 ||
      OI_KFRAME_HEADER + (uint64_t)a->payload_bytes > a->frame_bytes ||
      (uint64_t)a->parts * a->heads > 2147483647u ||
      (int8 && ((groups + INT8_WARPS - 1) / INT8_WARPS > 2147483647u ||
                (a->kind == OI_KLOSSY_INT8H && (a->rot_block < 2 || a->head_dim % a->rot_block ||
                                                a->head_dim > OI_KLOSSY_MAX_DIM)))) ||
      (!int8 && a->kind != OI_KLOSSY_FP8))
    return cudaErrorInvalidValue;
  head_kernel<<<a->n, 256, 0, s>>>(*a);
  if (int8) {
    const size_t smem = a->kind == OI_KLOSSY_INT8H ? (size_t)INT8_WARPS * a->head_dim * 4 : 0;
    int8_kernel<<<dim3((unsigned)((groups + INT8_WARPS - 1) / INT8_WARPS), a->n), 32 * INT8_WARPS,
                  smem, s>>>(*a);
  } else {
    fp8_kernel<<<dim3((unsigned)(a->parts * a->heads), a->n), FP8_THREADS, 0, s>>>(*a);
  }
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  return oi_kernel_xxh3(reinterpret_cast<const oi_khash_item *>(a->items), a->n, a->payload_bytes,
                        reinterpret_cast<const void *>(a->secret), stream);
}
