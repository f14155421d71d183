// The reference model's paged attention and segment merge (see refmodel.cu for
// batch invariance).
#include "refmodel/refmodel_gen.h"
#include "refmodel_common.cuh"
#include "refmodel_kernels.h"

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

