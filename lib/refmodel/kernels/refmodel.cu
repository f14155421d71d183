// Kernels of the CUDA reference model (see refmodel_kernels.h). bf16 storage,
// fp32 accumulation. Batch invariance: every output element is reduced in one
// fixed order that depends on nothing but its own row -- the GEMM walks K in
// ascending 16-wide steps into one accumulator for every tile shape (no
// split-K), with one instruction kind per device for every M (wgmma on
// sm_90, mma.sync elsewhere; see refmodel_gemm.cu), norms and argmax reduce
// with fixed trees per row, and attention walks keys in absolute 64-key tiles
// inside absolute 2048-key segments that are merged in segment order, for
// prefill and decode alike.
#include "refmodel_common.cuh"
#include "refmodel_gen.h"
#include "refmodel_kernels.h"

// ---- weights ------------------------------------------------------------------

__global__ void gen_bf16_kernel(uint16_t *dst, uint64_t n, uint64_t seed, uint32_t tensor,
                                float scale) {
  for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
       i += (uint64_t)gridDim.x * blockDim.x)
    dst[i] = oi_rm_f2bf(oi_rm_uniform(seed, tensor, i, scale));
}

__global__ void gen_gate_up_kernel(uint16_t *dst, uint32_t F, uint32_t H, uint64_t seed,
                                   uint32_t tg, uint32_t tu, float scale) {
  uint64_t n = 2ull * F * H;
  for (uint64_t e = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; e < n;
       e += (uint64_t)gridDim.x * blockDim.x) {
    uint64_t r = e / H, c = e % H;
    dst[e] = oi_rm_f2bf(oi_rm_uniform(seed, (r & 1) ? tu : tg, (r >> 1) * H + c, scale));
  }
}

__global__ void gen_norm_kernel(float *dst, uint32_t n, uint64_t seed, uint32_t tensor) {
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    dst[i] = 1.0f + oi_rm_uniform(seed, tensor, i, 0.1f);
}

static unsigned gen_blocks(uint64_t n) {
  uint64_t b = (n + 255) / 256;
  return (unsigned)(b > 65536 ? 65536 : (b ? b : 1));
}

extern "C" int oi_rm_gen_bf16(uint16_t *dst, uint64_t n, uint64_t seed, uint32_t tensor,
                              float scale, void *stream) {
  gen_bf16_kernel<<<gen_blocks(n), 256, 0, (cudaStream_t)stream>>>(dst, n, seed, tensor, scale);
  return (int)cudaGetLastError();
}

extern "C" int oi_rm_gen_gate_up(uint16_t *dst, uint32_t F, uint32_t H, uint64_t seed,
                                 uint32_t t_gate, uint32_t t_up, float scale, void *stream) {
  gen_gate_up_kernel<<<gen_blocks(2ull * F * H), 256, 0, (cudaStream_t)stream>>>(
      dst, F, H, seed, t_gate, t_up, scale);
  return (int)cudaGetLastError();
}

extern "C" int oi_rm_gen_norm(float *dst, uint32_t n, uint64_t seed, uint32_t tensor,
                              void *stream) {
  gen_norm_kernel<<<gen_blocks(n), 256, 0, (cudaStream_t)stream>>>(dst, n, seed, tensor);
  return (int)cudaGetLastError();
}

extern "C" int oi_rm_fill_random(uint16_t *dst, uint64_t n, uint64_t seed, void *stream) {
  return oi_rm_gen_bf16(dst, n, seed, 999, 1.0f, stream);
}

// ---- elementwise and per-row kernels -------------------------------------------

__global__ void embed_kernel(const uint32_t *tokens, const uint16_t *emb, uint32_t H, float *x) {
  uint32_t r = blockIdx.x;
  const uint16_t *e = emb + (size_t)tokens[r] * H;
  for (uint32_t i = threadIdx.x; i < H; i += blockDim.x)
    x[(size_t)r * H + i] = oi_rm_bf2f(e[i]);
}

extern "C" int oi_rm_embed(const uint32_t *tokens, uint32_t T, const uint16_t *emb, uint32_t H,
                           float *x, void *stream) {
  if (!T) return 0;
  embed_kernel<<<T, 256, 0, (cudaStream_t)stream>>>(tokens, emb, H, x);
  return (int)cudaGetLastError();
}

// 256 threads: strided per-thread sums, then a fixed tree.
__device__ __forceinline__ float block_sum_256(float v, float *red) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  float s = 0.0f;
  if (threadIdx.x == 0) {
    for (int w = 0; w < 8; w++)
      s += red[w];
    red[8] = s;
  }
  __syncthreads();
  return red[8];
}

__global__ void rmsnorm_kernel(const float *x, const uint32_t *rows, uint32_t H, const float *w,
                               float eps, uint16_t *out) {
  __shared__ float red[9];
  uint32_t r = blockIdx.x, src = rows ? rows[r] : r;
  const float *xr = x + (size_t)src * H;
  float ss = 0.0f;
  for (uint32_t i = threadIdx.x; i < H; i += 256)
    ss += xr[i] * xr[i];
  ss = block_sum_256(ss, red);
  float inv = 1.0f / sqrtf(ss / (float)H + eps);
  for (uint32_t i = threadIdx.x; i < H; i += 256)
    out[(size_t)r * H + i] = oi_rm_f2bf(xr[i] * inv * w[i]);
}

extern "C" int oi_rm_rmsnorm(const float *x, const uint32_t *rows, uint32_t R, uint32_t H,
                             const float *w, float eps, uint16_t *out, void *stream) {
  if (!R) return 0;
  rmsnorm_kernel<<<R, 256, 0, (cudaStream_t)stream>>>(x, rows, H, w, eps, out);
  return (int)cudaGetLastError();
}

__global__ void rope_kv_kernel(uint16_t *qkv, const uint32_t *pos, const uint64_t *slot_off,
                               uint32_t qh, uint32_t kvh, uint32_t hd, const float *rc,
                               const float *rs, uint8_t *layer_base, uint64_t seg_stride) {
  uint32_t r = blockIdx.x, half = hd / 2, p = pos[r];
  uint16_t *row = qkv + (size_t)r * (qh + 2 * kvh) * hd;
  uint16_t *kdst = reinterpret_cast<uint16_t *>(layer_base + slot_off[r]);
  uint16_t *vdst = reinterpret_cast<uint16_t *>(layer_base + slot_off[r] + seg_stride);
  const float *c = rc + (size_t)p * half, *s = rs + (size_t)p * half;
  for (uint32_t idx = threadIdx.x; idx < (qh + kvh) * half; idx += blockDim.x) {
    uint32_t head = idx / half, i = idx % half;
    uint16_t *v = row + (size_t)head * hd;
    float a = oi_rm_bf2f(v[2 * i]), b = oi_rm_bf2f(v[2 * i + 1]);
    float ra = a * c[i] - b * s[i], rb = a * s[i] + b * c[i];
    if (head < qh) {
      v[2 * i] = oi_rm_f2bf(ra);
      v[2 * i + 1] = oi_rm_f2bf(rb);
    } else {
      uint16_t *k = kdst + (size_t)(head - qh) * hd;
      k[2 * i] = oi_rm_f2bf(ra);
      k[2 * i + 1] = oi_rm_f2bf(rb);
    }
  }
  const uint16_t *vsrc = row + (size_t)(qh + kvh) * hd;
  for (uint32_t i = threadIdx.x; i < kvh * hd; i += blockDim.x)
    vdst[i] = vsrc[i];
}

extern "C" int oi_rm_rope_kv(uint16_t *qkv, const uint32_t *pos, const uint64_t *slot_off,
                             uint32_t T, uint32_t qh, uint32_t kvh, uint32_t hd,
                             const float *rope_cos, const float *rope_sin, uint8_t *layer_base,
                             uint64_t seg_stride, void *stream) {
  if (!T) return 0;
  rope_kv_kernel<<<T, 512, 0, (cudaStream_t)stream>>>(qkv, pos, slot_off, qh, kvh, hd, rope_cos,
                                                      rope_sin, layer_base, seg_stride);
  return (int)cudaGetLastError();
}

// ---- argmax -------------------------------------------------------------------------

__global__ void argmax_kernel(const float *logits, uint32_t V, uint32_t *out) {
  __shared__ float bv[256];
  __shared__ uint32_t bi[256];
  const float *l = logits + (size_t)blockIdx.x * V;
  float best = -CUDART_INF_F;
  uint32_t idx = 0xFFFFFFFFu;
  for (uint32_t i = threadIdx.x; i < V; i += 256)
    if (l[i] > best || idx == 0xFFFFFFFFu) {
      if (idx == 0xFFFFFFFFu || l[i] > best) {
        best = l[i];
        idx = i;
      }
    }
  bv[threadIdx.x] = best;
  bi[threadIdx.x] = idx;
  __syncthreads();
  for (int s = 128; s > 0; s >>= 1) {
    if ((int)threadIdx.x < s) {
      float ov = bv[threadIdx.x + s];
      uint32_t oi = bi[threadIdx.x + s];
      if (oi != 0xFFFFFFFFu && (bi[threadIdx.x] == 0xFFFFFFFFu || ov > bv[threadIdx.x] ||
                                (ov == bv[threadIdx.x] && oi < bi[threadIdx.x]))) {
        bv[threadIdx.x] = ov;
        bi[threadIdx.x] = oi;
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = bi[0] == 0xFFFFFFFFu ? 0 : bi[0];
}

extern "C" int oi_rm_argmax(const float *logits, uint32_t R, uint32_t V, uint32_t *out,
                            void *stream) {
  if (!R) return 0;
  argmax_kernel<<<R, 256, 0, (cudaStream_t)stream>>>(logits, V, out);
  return (int)cudaGetLastError();
}
