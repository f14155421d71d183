// The reference model's paged attention and segment merge (see refmodel.cu for
// batch invariance).
#include "refmodel_common.cuh"
#include "refmodel_gen.h"
#include "refmodel_kernels.h"

// ---- attention --------------------------------------------------------------------
// One CTA: a query tile of up to 64 positions of one sequence for G query heads
// that share one KV head (GQA), over one 2048-key segment. Keys in 64-key tiles
// (absolute boundaries) flow through a STAGES-deep cp.async ring from the paged
// arena, loaded once for all G heads (a CTA per head re-read each K/V tile
// G times, from L2).
//
// The CTA's 4G m-tiles of 16 rows (m-tile i: head i % G, positions 16 (i / G)..)
// go NM to a warp, 4G / NM warps. With NM = 2 a warp shares every K and V
// fragment it reads from shared memory between its two m-tiles: one ldmatrix
// per 3.2 mma instead of one per 2, which measured faster than one m-tile per
// warp with twice the warps. Q is re-read from shared memory each tile: its
// fragments would not fit in registers beside two m-tiles' O and S.
//
// Batch invariance: a row's arithmetic is one fixed sequence whichever CTA,
// warp or m-tile runs it and whatever rows share the tile -- per key tile, S
// by mma m16n8k16 over head-dim in ascending 16-wide steps, the causal mask,
// the tile max, 2^(s - max), the row sum in a fixed order (the thread's 16 keys
// in order, then the quad), l = fma(l, alpha, sum), O scaled, then P V by mma
// over the tile's keys in ascending 16-wide steps. The float steps are _rn
// intrinsics so that no contraction choice of the compiler can differ between
// call sites. What is skipped is exactly a no-op for the rows it skips:
//  - a tile past every row of a warp (for a row that has seen a key: alpha 1,
//    P 0);
//  - the mask on a tile whose keys all precede the m-tile's first position;
//  - the O rescale when alpha is 1 for every row of the warp (O * 1 is O),
//    which is most tiles once the maxima have settled.
// Rows of a segment that begins after them are never read by the combine and
// are not written.
//
// The item order is reversed: the last items of a sequence reach furthest into
// their diagonal segment, so the heaviest CTAs of a segment start first and
// the light ones fill the tail.

// 2^x on the MUFU alone. exp2f adds a rescaling of inputs below -126 to keep
// subnormal results; here those are flushed to zero -- weights below 2^-126
// beside the tile maximum's weight of 1 -- which saves three instructions of
// the ~10 per score.
__device__ __forceinline__ float ex2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// One 64-key tile of the online softmax for one 16-row m-tile: masks S (keys
// past a row's position, when MASK), scales to the log2 domain, updates m and
// l, rescales O and leaves P (bf16) as the A fragments of P V.
template <int HD, bool MASK>
__device__ __forceinline__ void softmax_tile(float (&s)[8][4], const uint32_t (&rp)[2], uint32_t k0,
                                             int t, float scale_log2, float (&m)[2], float (&l)[2],
                                             float (&o)[HD / 8][4], uint32_t (&pa)[4][4]) {
  float mx0 = -CUDART_INF_F, mx1 = -CUDART_INF_F;
#pragma unroll
  for (int ni = 0; ni < 8; ni++)
#pragma unroll
    for (int e = 0; e < 4; e++) {
      float v = __fmul_rn(s[ni][e], scale_log2);
      if (MASK && k0 + ni * 8 + 2 * t + (e & 1) > rp[e >> 1]) v = -CUDART_INF_F;
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
  float mn0 = fmaxf(m[0], mx0), mn1 = fmaxf(m[1], mx1);
  float mu0 = mn0 == -CUDART_INF_F ? 0.0f : mn0, mu1 = mn1 == -CUDART_INF_F ? 0.0f : mn1;
  float al0 = ex2_ftz(__fsub_rn(m[0], mu0)), al1 = ex2_ftz(__fsub_rn(m[1], mu1));
  m[0] = mn0;
  m[1] = mn1;
  float rs0 = 0.0f, rs1 = 0.0f;
#pragma unroll
  for (int ni = 0; ni < 8; ni++) {
    float p0 = ex2_ftz(__fsub_rn(s[ni][0], mu0)), p1 = ex2_ftz(__fsub_rn(s[ni][1], mu0));
    float p2 = ex2_ftz(__fsub_rn(s[ni][2], mu1)), p3 = ex2_ftz(__fsub_rn(s[ni][3], mu1));
    rs0 = __fadd_rn(rs0, __fadd_rn(p0, p1));
    rs1 = __fadd_rn(rs1, __fadd_rn(p2, p3));
    pa[ni >> 1][(ni & 1) * 2 + 0] = pack_bf16(p0, p1);
    pa[ni >> 1][(ni & 1) * 2 + 1] = pack_bf16(p2, p3);
  }
  rs0 = __fadd_rn(rs0, __shfl_xor_sync(0xffffffffu, rs0, 1));
  rs0 = __fadd_rn(rs0, __shfl_xor_sync(0xffffffffu, rs0, 2));
  rs1 = __fadd_rn(rs1, __shfl_xor_sync(0xffffffffu, rs1, 1));
  rs1 = __fadd_rn(rs1, __shfl_xor_sync(0xffffffffu, rs1, 2));
  l[0] = __fmaf_rn(l[0], al0, rs0);
  l[1] = __fmaf_rn(l[1], al1, rs1);
  if (__all_sync(0xffffffffu, al0 == 1.0f && al1 == 1.0f)) return;
#pragma unroll
  for (int d = 0; d < HD / 8; d++) {
    o[d][0] = __fmul_rn(o[d][0], al0);
    o[d][1] = __fmul_rn(o[d][1], al0);
    o[d][2] = __fmul_rn(o[d][2], al1);
    o[d][3] = __fmul_rn(o[d][3], al1);
  }
}

template <int HD, int G, int NM, int STAGES>
__global__ void __launch_bounds__(128 * G / NM, NM == 1 && G <= 2 ? 2 : 1)
    attn_kernel(const oi_rm_attn_params p) {
  extern __shared__ __align__(128) uint8_t smem[];
  constexpr int CH = HD / 8, NT = 128 * G / NM;
  bf16 *Qs = reinterpret_cast<bf16 *>(smem); // [G][64][HD]
  bf16 *Ks = Qs + G * 64 * HD;               // [STAGES][64][HD]
  bf16 *Vs = Ks + STAGES * 64 * HD;
  const oi_rm_item it = p.items[p.n_items - 1 - blockIdx.x];
  const int z = blockIdx.z, h0 = blockIdx.y * G;
  const int kvh = h0 / (p.q_heads / p.kv_heads);
  const uint32_t kv_end = it.pos0 + it.nrows;
  const uint32_t seg0 = (uint32_t)z * OI_RM_ATTN_SEG;
  if (seg0 >= kv_end) return;
  const uint32_t seg_end = min(seg0 + OI_RM_ATTN_SEG, kv_end);
  const int ntiles = (int)((seg_end - seg0 + 63) / 64);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;

  for (int c = tid; c < G * 64 * CH; c += NT) {
    int hq = c / (64 * CH), r = (c / CH) % 64, ch = c % CH;
    bool ok = r < (int)it.nrows;
    const bf16 *src = reinterpret_cast<const bf16 *>(p.q) +
                      (size_t)(it.row0 + (ok ? r : 0)) * p.q_ld + (size_t)(h0 + hq) * HD + ch * 8;
    cp_async16(Qs + (hq * 64 + r) * HD + ((ch ^ (r & 7)) << 3), src, ok);
  }
  // pos / page_size without a division per key: with magic = floor((2^32 - 1) /
  // page_size) the high product undershoots by at most one.
  const uint32_t psz = p.page_size, magic = 0xffffffffu / psz;
  const uint8_t *kv_base = p.layer_base + (uint64_t)kvh * HD * 2;
  // A thread loads one key row per tile (one block-table lookup), chunks
  // tid % TPR + TPR k, so that each cp.async of a warp covers whole sectors.
  constexpr int TPR = NT / 64;
  const int kr = tid / TPR, kc = tid % TPR;
  auto load_kv = [&](int stage, int tile) {
    uint32_t pos = seg0 + (uint32_t)tile * 64 + kr;
    bool ok = pos < kv_end;
    const uint8_t *src = p.layer_base;
    if (ok) {
      uint32_t pg = __umulhi(pos, magic), off = pos - pg * psz;
      if (off >= psz) pg++, off -= psz;
      int64_t blk = p.tables[it.table_off + pg];
      src = kv_base + (uint64_t)blk * p.block_stride + (uint64_t)off * p.token_stride;
    }
    bf16 *kd = Ks + stage * 64 * HD + kr * HD, *vd = Vs + stage * 64 * HD + kr * HD;
#pragma unroll
    for (int k = 0; k < CH / TPR; k++) {
      int ch = kc + TPR * k, so = (ch ^ (kr & 7)) << 3;
      cp_async16(kd + so, ok ? src + ch * 16 : src, ok);
      cp_async16(vd + so, ok ? src + p.seg_stride + ch * 16 : src, ok);
    }
  };
  load_kv(0, 0);
  cp_async_commit();
#pragma unroll
  for (int s = 1; s < STAGES - 1; s++) {
    if (s < ntiles) load_kv(s, s);
    cp_async_commit();
  }

  const int g = lane >> 2, t = lane & 3;
  // The warp's m-tiles NM w + i. When NM divides G they are heads of the same
  // 16 positions (one mask), said so to the compiler.
  int mq[NM], mr[NM]; // m-tile: its head's Q in shared memory, its first row
  uint32_t rp[NM][2]; // positions of this thread's rows g and g + 8
#pragma unroll
  for (int i = 0; i < NM; i++) {
    mq[i] = (NM * warp + i) % G;
    mr[i] = (G % NM == 0 ? NM * warp / G : (NM * warp + i) / G) * 16;
    rp[i][0] = it.pos0 + mr[i] + g;
    rp[i][1] = rp[i][0] + 8;
  }
  const bool active = mr[0] < (int)it.nrows;
  const uint32_t wmax = it.pos0 + (uint32_t)min(mr[NM - 1] + 15, (int)it.nrows - 1);
  float o[NM][HD / 8][4];
  float m[NM][2], l[NM][2];
#pragma unroll
  for (int i = 0; i < NM; i++) {
#pragma unroll
    for (int d = 0; d < HD / 8; d++)
      o[i][d][0] = o[i][d][1] = o[i][d][2] = o[i][d][3] = 0.0f;
    m[i][0] = m[i][1] = -CUDART_INF_F;
    l[i][0] = l[i][1] = 0.0f;
  }

  for (int j = 0; j < ntiles; j++) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    // The stage refilled here held tile j - 1, which every warp has finished.
    if (j + STAGES - 1 < ntiles) load_kv((j + STAGES - 1) % STAGES, j + STAGES - 1);
    cp_async_commit();
    const uint32_t k0 = seg0 + (uint32_t)j * 64;
    if (!active || k0 > wmax) continue;
    const bf16 *ks = Ks + (j % STAGES) * 64 * HD, *vs = Vs + (j % STAGES) * 64 * HD;
    float s[NM][8][4];
#pragma unroll
    for (int i = 0; i < NM; i++)
#pragma unroll
      for (int n = 0; n < 8; n++)
        s[i][n][0] = s[i][n][1] = s[i][n][2] = s[i][n][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
      uint32_t qa[NM][4];
#pragma unroll
      for (int i = 0; i < NM; i++) {
        int r = mr[i] + (lane & 15), ch = kk * 2 + (lane >> 4);
        ldsm_x4(qa[i][0], qa[i][1], qa[i][2], qa[i][3],
                Qs + (mq[i] * 64 + r) * HD + ((ch ^ (r & 7)) << 3));
      }
#pragma unroll
      for (int nj = 0; nj < 4; nj++) {
        int r = nj * 16 + (lane & 7) + ((lane >> 4) << 3), ch = kk * 2 + ((lane >> 3) & 1);
        uint32_t b0, b1, b2, b3;
        ldsm_x4(b0, b1, b2, b3, ks + r * HD + ((ch ^ (r & 7)) << 3));
#pragma unroll
        for (int i = 0; i < NM; i++) {
          mma16816(s[i][2 * nj], qa[i], b0, b1);
          mma16816(s[i][2 * nj + 1], qa[i], b2, b3);
        }
      }
    }
    uint32_t pa[NM][4][4];
#pragma unroll
    for (int i = 0; i < NM; i++) {
      if (k0 + 63 <= it.pos0 + mr[i])
        softmax_tile<HD, false>(s[i], rp[i], k0, t, p.scale_log2, m[i], l[i], o[i], pa[i]);
      else
        softmax_tile<HD, true>(s[i], rp[i], k0, t, p.scale_log2, m[i], l[i], o[i], pa[i]);
    }
#pragma unroll
    for (int kk = 0; kk < 4; kk++)
#pragma unroll
      for (int dj = 0; dj < HD / 16; dj++) {
        int r = kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3), ch = dj * 2 + (lane >> 4);
        uint32_t b0, b1, b2, b3;
        ldsm_x4_t(b0, b1, b2, b3, vs + r * HD + ((ch ^ (r & 7)) << 3));
#pragma unroll
        for (int i = 0; i < NM; i++) {
          mma16816(o[i][2 * dj], pa[i][kk], b0, b1);
          mma16816(o[i][2 * dj + 1], pa[i][kk], b2, b3);
        }
      }
  }
  cp_async_wait<0>();
#pragma unroll
  for (int i = 0; i < NM; i++)
#pragma unroll
    for (int half = 0; half < 2; half++) {
      int row = mr[i] + g + half * 8;
      if (row >= (int)it.nrows || rp[i][half] < seg0) continue;
      size_t base = ((size_t)(it.row0 + row) * p.q_heads + h0 + mq[i]) * p.nseg + z;
      float *po = p.part_o + base * HD;
#pragma unroll
      for (int d = 0; d < HD / 8; d++)
        *reinterpret_cast<float2 *>(po + d * 8 + 2 * t) =
            make_float2(o[i][d][half * 2], o[i][d][half * 2 + 1]);
      if (t == 0) {
        p.part_ml[base * 2] = m[i][half];
        p.part_ml[base * 2 + 1] = l[i][half];
      }
    }
}

template <int HD, int G, int NM, int STAGES>
static int launch_attn(const oi_rm_attn_params *p, cudaStream_t s) {
  static unsigned done = 0;
  size_t smem = (size_t)(G + 2 * STAGES) * 64 * HD * sizeof(bf16);
  int e = allow_smem((const void *)attn_kernel<HD, G, NM, STAGES>, smem, &done);
  if (e) return e;
  dim3 grid(p->n_items, p->q_heads / G, p->nseg);
  attn_kernel<HD, G, NM, STAGES><<<grid, 128 * G / NM, smem, s>>>(*p);
  return (int)cudaGetLastError();
}

// Heads per CTA: the most of 4, 2, 1 that divides the GQA group. Shapes and
// stage depths as measured on an H200, attention alone, causal 16K prefill in
// 4,096-token chunks, hd 128, 32 query heads (the former one-head, 4-warp
// kernel: 150 TFLOP/s):
//   4 heads, 8 warps of two m-tiles, 4 stages, one CTA per SM:  264 TFLOP/s
//     (3 stages 263; 16 warps of one m-tile 243)
//   2 heads, 8 warps of one m-tile, 2 stages, two CTAs per SM:  252
//     (4 warps of two m-tiles 245)
//   1 head, 4 warps of one m-tile, 2 stages, two CTAs per SM:   200
//     (3 stages 194; 2 warps of two m-tiles 123)
//
// Items of at most 16 rows (decode steps, the last tokens of a restored prompt)
// fill one m-tile per head: the 4-head CTA would run them on 2 of its 8 warps,
// one CTA per (KV head, segment) -- 16 CTAs for a 4,096-token context, each
// walking its 32 key tiles serially. One head per CTA gives 4x the CTAs with
// the same per-row arithmetic.
template <int HD> static int launch_attn_hd(const oi_rm_attn_params *p, cudaStream_t s) {
  uint32_t group = p->q_heads / p->kv_heads;
  if (p->max_rows && p->max_rows <= 16) return launch_attn<HD, 1, 1, 2>(p, s);
  if (group % 4 == 0) return launch_attn<HD, 4, 2, 4>(p, s);
  if (group % 2 == 0) return launch_attn<HD, 2, 1, 2>(p, s);
  return launch_attn<HD, 1, 1, 2>(p, s);
}

extern "C" int oi_rm_attention(const oi_rm_attn_params *p, void *stream) {
  if (!p->n_items) return 0;
  if (p->n_items > 2147483647u || p->q_heads > 65535 || p->nseg > 65535 || !p->kv_heads ||
      p->q_heads % p->kv_heads || !p->page_size)
    return (int)cudaErrorInvalidValue;
  if (p->head_dim == 128) return launch_attn_hd<128>(p, (cudaStream_t)stream);
  if (p->head_dim == 64) return launch_attn_hd<64>(p, (cudaStream_t)stream);
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
  for (uint32_t s = 0; s < ns; s++)
    M = fmaxf(M, ml[2 * s]);
  float L = 0.0f, acc[HD / 32];
#pragma unroll
  for (int i = 0; i < HD / 32; i++)
    acc[i] = 0.0f;
  for (uint32_t s = 0; s < ns; s++) {
    float wt = exp2f(ml[2 * s] - M);
    L += ml[2 * s + 1] * wt;
#pragma unroll
    for (int i = 0; i < HD / 32; i++)
      acc[i] += po[(size_t)s * HD + lane + 32 * i] * wt;
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
    combine_kernel<128>
        <<<blocks, 128, 0, (cudaStream_t)stream>>>(part_o, part_ml, pos, T, q_heads, nseg, out);
  else if (hd == 64)
    combine_kernel<64>
        <<<blocks, 128, 0, (cudaStream_t)stream>>>(part_o, part_ml, pos, T, q_heads, nseg, out);
  else
    return (int)cudaErrorInvalidValue;
  return (int)cudaGetLastError();
}
