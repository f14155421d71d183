// Kernels of the CUDA reference model (see refmodel_kernels.h). bf16 storage,
// fp32 accumulation. Batch invariance: every output element is reduced in one
// fixed order that depends on nothing but its own row -- the GEMM walks K in
// ascending 16-wide steps into one accumulator for every tile shape (no
// split-K), norms and argmax reduce with fixed trees per row, and attention
// walks keys in absolute 64-key tiles inside absolute 2048-key segments that
// are merged in segment order, for prefill and decode alike.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math_constants.h>
#include <stdint.h>

#include "refmodel/refmodel_gen.h"
#include "refmodel_kernels.h"

typedef __nv_bfloat16 bf16;

// ---- primitives -------------------------------------------------------------

__device__ __forceinline__ uint32_t smem_u32(const void *p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, bool pred) {
  int n = pred ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(smem)), "l"(gmem),
               "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldsm_x4(uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3,
                                        const void *p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3,
                                          const void *p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(smem_u32(p)));
}

__device__ __forceinline__ void mma16816(float *c, const uint32_t *a, uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
               "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t *>(&v);
}

// Sets a kernel's dynamic shared-memory limit once per device.
static int allow_smem(const void *fn, size_t bytes, unsigned *done_mask) {
  int dev = 0;
  cudaGetDevice(&dev);
  unsigned bit = 1u << (dev & 31);
  if (__atomic_load_n(done_mask, __ATOMIC_ACQUIRE) & bit) return 0;
  cudaError_t e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
  if (e != cudaSuccess) return (int)e;
  __atomic_fetch_or(done_mask, bit, __ATOMIC_ACQ_REL);
  return 0;
}

// ---- GEMM: C = A[M][K] . W[N][K]^T -------------------------------------------
// 256 threads, 2 x 4 warps, a BM x 128 tile, K in 64-wide stages (3 deep,
// cp.async), swizzled shared memory read by ldmatrix, mma.sync m16n8k16.

#define G_BN 128
#define G_BK 64
#define G_STAGES 3
#define G_THREADS 256

template <int BM, int EPI>
__global__ void __launch_bounds__(G_THREADS) gemm_kernel(const bf16 *__restrict__ A,
                                                         const bf16 *__restrict__ W, void *C, int M,
                                                         int N, int K) {
  extern __shared__ __align__(128) uint8_t smem[];
  bf16 *As = reinterpret_cast<bf16 *>(smem);
  bf16 *Bs = As + G_STAGES * BM * G_BK;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * G_BN;
  constexpr int WM = BM / 2, MI = WM / 16, NI = 4;
  const int wm0 = (warp >> 2) * WM, wn0 = (warp & 3) * 32;
  float acc[MI][NI][4];
#pragma unroll
  for (int i = 0; i < MI; i++)
#pragma unroll
    for (int j = 0; j < NI; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) acc[i][j][e] = 0.0f;
  const int KT = K / G_BK;

  auto load = [&](int stage, int kt) {
    const int k0 = kt * G_BK;
    bf16 *as = As + stage * BM * G_BK;
    bf16 *bs = Bs + stage * G_BN * G_BK;
#pragma unroll
    for (int i = 0; i < BM * 8 / G_THREADS; i++) {
      int c = tid + i * G_THREADS, r = c >> 3, ch = c & 7;
      int gr = m0 + r;
      bool ok = gr < M;
      const bf16 *src = A + (size_t)(ok ? gr : 0) * K + k0 + ch * 8;
      cp_async16(as + r * G_BK + ((ch ^ (r & 7)) << 3), src, ok);
    }
#pragma unroll
    for (int i = 0; i < G_BN * 8 / G_THREADS; i++) {
      int c = tid + i * G_THREADS, r = c >> 3, ch = c & 7;
      int gn = n0 + r;
      bool ok = gn < N;
      const bf16 *src = W + (size_t)(ok ? gn : 0) * K + k0 + ch * 8;
      cp_async16(bs + r * G_BK + ((ch ^ (r & 7)) << 3), src, ok);
    }
  };

#pragma unroll
  for (int s = 0; s < G_STAGES - 1; s++) {
    if (s < KT) load(s, s);
    cp_async_commit();
  }
  for (int kt = 0; kt < KT; kt++) {
    cp_async_wait<G_STAGES - 2>();
    __syncthreads();
    int nk = kt + G_STAGES - 1;
    if (nk < KT) load(nk % G_STAGES, nk);
    cp_async_commit();
    const bf16 *as = As + (kt % G_STAGES) * BM * G_BK;
    const bf16 *bs = Bs + (kt % G_STAGES) * G_BN * G_BK;
#pragma unroll
    for (int ks = 0; ks < G_BK / 16; ks++) {
      uint32_t a[MI][4], b[NI][2];
#pragma unroll
      for (int mi = 0; mi < MI; mi++) {
        int r = wm0 + mi * 16 + (lane & 15), ch = ks * 2 + (lane >> 4);
        ldsm_x4(a[mi][0], a[mi][1], a[mi][2], a[mi][3], as + r * G_BK + ((ch ^ (r & 7)) << 3));
      }
#pragma unroll
      for (int nj = 0; nj < NI / 2; nj++) {
        int r = wn0 + nj * 16 + (lane & 7) + ((lane >> 4) << 3), ch = ks * 2 + ((lane >> 3) & 1);
        ldsm_x4(b[2 * nj][0], b[2 * nj][1], b[2 * nj + 1][0], b[2 * nj + 1][1],
                bs + r * G_BK + ((ch ^ (r & 7)) << 3));
      }
#pragma unroll
      for (int mi = 0; mi < MI; mi++)
#pragma unroll
        for (int ni = 0; ni < NI; ni++) mma16816(acc[mi][ni], a[mi], b[ni][0], b[ni][1]);
    }
  }
  cp_async_wait<0>();

  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int mi = 0; mi < MI; mi++)
#pragma unroll
    for (int ni = 0; ni < NI; ni++)
#pragma unroll
      for (int half = 0; half < 2; half++) {
        int row = m0 + wm0 + mi * 16 + g + half * 8;
        int col = n0 + wn0 + ni * 8 + 2 * t;
        if (row >= M || col >= N) continue;
        float v0 = acc[mi][ni][half * 2], v1 = acc[mi][ni][half * 2 + 1];
        if (EPI == OI_RM_EPI_BF16) {
          *reinterpret_cast<uint32_t *>(reinterpret_cast<bf16 *>(C) + (size_t)row * N + col) =
              pack_bf16(v0, v1);
        } else if (EPI == OI_RM_EPI_RESID) {
          float2 *p = reinterpret_cast<float2 *>(reinterpret_cast<float *>(C) + (size_t)row * N + col);
          float2 x = *p;
          x.x += v0;
          x.y += v1;
          *p = x;
        } else if (EPI == OI_RM_EPI_SWIGLU) {
          float s = v0 / (1.0f + expf(-v0));
          reinterpret_cast<bf16 *>(C)[(size_t)row * (N / 2) + col / 2] = __float2bfloat16_rn(s * v1);
        } else {
          *reinterpret_cast<float2 *>(reinterpret_cast<float *>(C) + (size_t)row * N + col) =
              make_float2(v0, v1);
        }
      }
}

template <int BM, int EPI>
static int launch_gemm(const uint16_t *A, const uint16_t *W, void *C, uint32_t M, uint32_t N,
                       uint32_t K, cudaStream_t s) {
  static unsigned done = 0;
  size_t smem = (size_t)G_STAGES * (BM + G_BN) * G_BK * sizeof(bf16);
  int e = allow_smem((const void *)gemm_kernel<BM, EPI>, smem, &done);
  if (e) return e;
  dim3 grid((N + G_BN - 1) / G_BN, (M + BM - 1) / BM);
  gemm_kernel<BM, EPI><<<grid, G_THREADS, smem, s>>>(reinterpret_cast<const bf16 *>(A),
                                                      reinterpret_cast<const bf16 *>(W), C, (int)M,
                                                      (int)N, (int)K);
  return (int)cudaGetLastError();
}

template <int EPI>
static int gemm_epi(const uint16_t *A, const uint16_t *W, void *C, uint32_t M, uint32_t N,
                    uint32_t K, cudaStream_t s) {
  // Both tile heights walk K identically: the choice never changes a value.
  if (M <= 64) return launch_gemm<64, EPI>(A, W, C, M, N, K, s);
  return launch_gemm<128, EPI>(A, W, C, M, N, K, s);
}

extern "C" int oi_rm_gemm(int epi, const uint16_t *A, const uint16_t *W, void *C, uint32_t M,
                          uint32_t N, uint32_t K, void *stream) {
  if (M == 0 || N == 0) return 0;
  if (K == 0 || K % G_BK || N % 2) return (int)cudaErrorInvalidValue;
  cudaStream_t s = (cudaStream_t)stream;
  switch (epi) {
  case OI_RM_EPI_BF16: return gemm_epi<OI_RM_EPI_BF16>(A, W, C, M, N, K, s);
  case OI_RM_EPI_RESID: return gemm_epi<OI_RM_EPI_RESID>(A, W, C, M, N, K, s);
  case OI_RM_EPI_SWIGLU: return gemm_epi<OI_RM_EPI_SWIGLU>(A, W, C, M, N, K, s);
  case OI_RM_EPI_F32: return gemm_epi<OI_RM_EPI_F32>(A, W, C, M, N, K, s);
  default: return (int)cudaErrorInvalidValue;
  }
}

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
  for (uint32_t i = threadIdx.x; i < H; i += blockDim.x) x[(size_t)r * H + i] = oi_rm_bf2f(e[i]);
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
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  float s = 0.0f;
  if (threadIdx.x == 0) {
    for (int w = 0; w < 8; w++) s += red[w];
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
  for (uint32_t i = threadIdx.x; i < H; i += 256) ss += xr[i] * xr[i];
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
  for (uint32_t i = threadIdx.x; i < kvh * hd; i += blockDim.x) vdst[i] = vsrc[i];
}

extern "C" int oi_rm_rope_kv(uint16_t *qkv, const uint32_t *pos, const uint64_t *slot_off,
                             uint32_t T, uint32_t qh, uint32_t kvh, uint32_t hd,
                             const float *rope_cos, const float *rope_sin, uint8_t *layer_base,
                             uint64_t seg_stride, void *stream) {
  if (!T) return 0;
  rope_kv_kernel<<<T, 128, 0, (cudaStream_t)stream>>>(qkv, pos, slot_off, qh, kvh, hd, rope_cos,
                                                      rope_sin, layer_base, seg_stride);
  return (int)cudaGetLastError();
}

// ---- attention --------------------------------------------------------------------
// One CTA: a 64-row query tile (4 warps x 16 rows) of one sequence, one query
// head, one 2048-key segment. Keys in 64-key tiles (absolute boundaries),
// double-buffered with cp.async from the paged arena; S = Q K^T and O += P V
// on mma.sync; online softmax in the log2 domain. Writes unnormalized O, m, l.

template <int HD>
__global__ void __launch_bounds__(128) attn_kernel(const oi_rm_attn_params p) {
  extern __shared__ __align__(128) uint8_t smem[];
  constexpr int CH = HD / 8;
  bf16 *Qs = reinterpret_cast<bf16 *>(smem);
  bf16 *Ks = Qs + 64 * HD;
  bf16 *Vs = Ks + 2 * 64 * HD;
  const oi_rm_item it = p.items[blockIdx.x];
  const int h = blockIdx.y, z = blockIdx.z;
  const int kvh = h / (p.q_heads / p.kv_heads);
  const uint32_t kv_end = it.pos0 + it.nrows;
  const uint32_t seg0 = (uint32_t)z * OI_RM_ATTN_SEG;
  if (seg0 >= kv_end) return;
  const uint32_t seg_end = min(seg0 + OI_RM_ATTN_SEG, kv_end);
  const int ntiles = (int)((seg_end - seg0 + 63) / 64);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;

  for (int c = tid; c < 64 * CH; c += 128) {
    int r = c / CH, ch = c % CH;
    bool ok = r < (int)it.nrows;
    const bf16 *src = reinterpret_cast<const bf16 *>(p.q) +
                      (size_t)(it.row0 + (ok ? r : 0)) * p.q_ld + (size_t)h * HD + ch * 8;
    cp_async16(Qs + r * HD + ((ch ^ (r & 7)) << 3), src, ok);
  }
  auto load_kv = [&](int stage, int tile) {
    uint32_t k0 = seg0 + (uint32_t)tile * 64;
    for (int c = tid; c < 64 * CH; c += 128) {
      int r = c / CH, ch = c % CH;
      uint32_t pos = k0 + r;
      bool ok = pos < kv_end;
      const uint8_t *src = p.layer_base;
      if (ok) {
        int64_t blk = p.tables[it.table_off + pos / p.page_size];
        src = p.layer_base + (uint64_t)blk * p.block_stride +
              (uint64_t)(pos % p.page_size) * p.token_stride + (uint64_t)kvh * HD * 2 + ch * 16;
      }
      int off = stage * 64 * HD + r * HD + ((ch ^ (r & 7)) << 3);
      cp_async16(Ks + off, src, ok);
      cp_async16(Vs + off, ok ? src + p.seg_stride : src, ok);
    }
  };
  load_kv(0, 0);
  cp_async_commit();

  const int wr0 = warp * 16;
  const bool active = wr0 < (int)it.nrows;
  const uint32_t wmax = it.pos0 + (uint32_t)min(wr0 + 15, (int)it.nrows - 1);
  const int g = lane >> 2, t = lane & 3;
  const uint32_t rpos0 = it.pos0 + wr0 + g, rpos1 = rpos0 + 8;
  uint32_t qf[HD / 16][4];
  float o[HD / 8][4];
#pragma unroll
  for (int i = 0; i < HD / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float m0 = -CUDART_INF_F, m1 = -CUDART_INF_F, l0 = 0.0f, l1 = 0.0f;

  for (int j = 0; j < ntiles; j++) {
    if (j + 1 < ntiles) load_kv((j + 1) & 1, j + 1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    if (j == 0 && active) {
#pragma unroll
      for (int kk = 0; kk < HD / 16; kk++) {
        int r = wr0 + (lane & 15), ch = kk * 2 + (lane >> 4);
        ldsm_x4(qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3], Qs + r * HD + ((ch ^ (r & 7)) << 3));
      }
    }
    const uint32_t k0 = seg0 + (uint32_t)j * 64;
    // A tile past every row of this warp is fully masked: a no-op, skipped.
    if (active && k0 <= wmax) {
      const bf16 *ks = Ks + (j & 1) * 64 * HD, *vs = Vs + (j & 1) * 64 * HD;
      float s[8][4];
#pragma unroll
      for (int i = 0; i < 8; i++) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < HD / 16; kk++)
#pragma unroll
        for (int nj = 0; nj < 4; nj++) {
          int r = nj * 16 + (lane & 7) + ((lane >> 4) << 3), ch = kk * 2 + ((lane >> 3) & 1);
          uint32_t b0, b1, b2, b3;
          ldsm_x4(b0, b1, b2, b3, ks + r * HD + ((ch ^ (r & 7)) << 3));
          mma16816(s[2 * nj], qf[kk], b0, b1);
          mma16816(s[2 * nj + 1], qf[kk], b2, b3);
        }
      float mx0 = -CUDART_INF_F, mx1 = -CUDART_INF_F;
#pragma unroll
      for (int ni = 0; ni < 8; ni++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
          uint32_t key = k0 + ni * 8 + 2 * t + (e & 1);
          uint32_t rp = e < 2 ? rpos0 : rpos1;
          float v = key <= rp ? s[ni][e] * p.scale_log2 : -CUDART_INF_F;
          s[ni][e] = v;
          if (e < 2)
            mx0 = fmaxf(mx0, v);
          else
            mx1 = fmaxf(mx1, v);
        }
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
      float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
      float mu0 = mn0 == -CUDART_INF_F ? 0.0f : mn0, mu1 = mn1 == -CUDART_INF_F ? 0.0f : mn1;
      float al0 = exp2f(m0 - mu0), al1 = exp2f(m1 - mu1);
      m0 = mn0;
      m1 = mn1;
      float rs0 = 0.0f, rs1 = 0.0f;
      uint32_t pa[4][4];
#pragma unroll
      for (int ni = 0; ni < 8; ni++) {
        float p0 = exp2f(s[ni][0] - mu0), p1 = exp2f(s[ni][1] - mu0);
        float p2 = exp2f(s[ni][2] - mu1), p3 = exp2f(s[ni][3] - mu1);
        rs0 += p0 + p1;
        rs1 += p2 + p3;
        pa[ni >> 1][(ni & 1) * 2 + 0] = pack_bf16(p0, p1);
        pa[ni >> 1][(ni & 1) * 2 + 1] = pack_bf16(p2, p3);
      }
      rs0 += __shfl_xor_sync(0xffffffffu, rs0, 1);
      rs0 += __shfl_xor_sync(0xffffffffu, rs0, 2);
      rs1 += __shfl_xor_sync(0xffffffffu, rs1, 1);
      rs1 += __shfl_xor_sync(0xffffffffu, rs1, 2);
      l0 = l0 * al0 + rs0;
      l1 = l1 * al1 + rs1;
#pragma unroll
      for (int dn = 0; dn < HD / 8; dn++) {
        o[dn][0] *= al0;
        o[dn][1] *= al0;
        o[dn][2] *= al1;
        o[dn][3] *= al1;
      }
#pragma unroll
      for (int kk = 0; kk < 4; kk++)
#pragma unroll
        for (int dj = 0; dj < HD / 16; dj++) {
          int r = kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3), ch = dj * 2 + (lane >> 4);
          uint32_t b0, b1, b2, b3;
          ldsm_x4_t(b0, b1, b2, b3, vs + r * HD + ((ch ^ (r & 7)) << 3));
          mma16816(o[2 * dj], pa[kk], b0, b1);
          mma16816(o[2 * dj + 1], pa[kk], b2, b3);
        }
    }
    __syncthreads();
  }
  cp_async_wait<0>();
  if (!active) return;
#pragma unroll
  for (int half = 0; half < 2; half++) {
    int row = wr0 + g + half * 8;
    if (row >= (int)it.nrows) continue;
    size_t base = ((size_t)(it.row0 + row) * p.q_heads + h) * p.nseg + z;
    float *po = p.part_o + base * HD;
#pragma unroll
    for (int dn = 0; dn < HD / 8; dn++)
      *reinterpret_cast<float2 *>(po + dn * 8 + 2 * t) =
          make_float2(o[dn][half * 2], o[dn][half * 2 + 1]);
    if (t == 0) {
      p.part_ml[base * 2] = half ? m1 : m0;
      p.part_ml[base * 2 + 1] = half ? l1 : l0;
    }
  }
}

template <int HD> static int launch_attn(const oi_rm_attn_params *p, cudaStream_t s) {
  static unsigned done = 0;
  size_t smem = (size_t)5 * 64 * HD * sizeof(bf16);
  int e = allow_smem((const void *)attn_kernel<HD>, smem, &done);
  if (e) return e;
  dim3 grid(p->n_items, p->q_heads, p->nseg);
  attn_kernel<HD><<<grid, 128, smem, s>>>(*p);
  return (int)cudaGetLastError();
}

extern "C" int oi_rm_attention(const oi_rm_attn_params *p, void *stream) {
  if (!p->n_items) return 0;
  if (p->n_items > 2147483647u || p->q_heads > 65535 || p->nseg > 65535)
    return (int)cudaErrorInvalidValue;
  if (p->head_dim == 128) return launch_attn<128>(p, (cudaStream_t)stream);
  if (p->head_dim == 64) return launch_attn<64>(p, (cudaStream_t)stream);
  return (int)cudaErrorInvalidValue;
}

template <int HD>
__global__ void combine_kernel(const float *part_o, const float *part_ml, const uint32_t *pos,
                               uint32_t T, uint32_t qh, uint32_t nseg, uint16_t *out) {
  uint32_t w = blockIdx.x * 4 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (w >= T * qh) return;
  uint32_t row = w / qh, h = w % qh;
  uint32_t ns = pos[row] / OI_RM_ATTN_SEG + 1;
  size_t base = ((size_t)row * qh + h) * nseg;
  const float *ml = part_ml + base * 2;
  const float *po = part_o + base * HD;
  float M = -CUDART_INF_F;
  for (uint32_t s = 0; s < ns; s++) M = fmaxf(M, ml[2 * s]);
  float L = 0.0f, acc[HD / 32];
#pragma unroll
  for (int i = 0; i < HD / 32; i++) acc[i] = 0.0f;
  for (uint32_t s = 0; s < ns; s++) {
    float wt = exp2f(ml[2 * s] - M);
    L += ml[2 * s + 1] * wt;
#pragma unroll
    for (int i = 0; i < HD / 32; i++) acc[i] += po[(size_t)s * HD + lane + 32 * i] * wt;
  }
  float inv = 1.0f / L;
#pragma unroll
  for (int i = 0; i < HD / 32; i++)
    out[(size_t)row * qh * HD + (size_t)h * HD + lane + 32 * i] = oi_rm_f2bf(acc[i] * inv);
}

extern "C" int oi_rm_attn_combine(const float *part_o, const float *part_ml, const uint32_t *pos,
                                  uint32_t T, uint32_t q_heads, uint32_t hd, uint32_t nseg,
                                  uint16_t *out, void *stream) {
  if (!T) return 0;
  unsigned blocks = (unsigned)(((uint64_t)T * q_heads + 3) / 4);
  if (hd == 128)
    combine_kernel<128><<<blocks, 128, 0, (cudaStream_t)stream>>>(part_o, part_ml, pos, T, q_heads,
                                                                  nseg, out);
  else if (hd == 64)
    combine_kernel<64><<<blocks, 128, 0, (cudaStream_t)stream>>>(part_o, part_ml, pos, T, q_heads,
                                                                 nseg, out);
  else
    return (int)cudaErrorInvalidValue;
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
      if (oi != 0xFFFFFFFFu &&
          (bi[threadIdx.x] == 0xFFFFFFFFu || ov > bv[threadIdx.x] ||
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
