// The reference model's GEMM: C = A[M][K] . W[N][K]^T (see refmodel.cu for
// batch invariance). Two implementations, chosen per device and never mixed on
// one: on sm_90 (H100/H200) Hopper's wgmma fed by TMA, elsewhere mma.sync. Each
// walks K in one ascending order into one fp32 accumulator per output element,
// and its tile shapes, which vary with M and N, only decide which block
// computes an element, not how: a row's bytes do not depend on M.
#include <cuda.h>
#include <cudaTypedefs.h>

#include "refmodel_common.cuh"
#include "refmodel_gen.h"
#include "refmodel_hopper.cuh"
#include "refmodel_kernels.h"

// ---- mma.sync path (every arch but sm_90) ---------------------------------------
// 256 threads, 2 x 4 warps, a BM x 128 tile, K in 64-wide stages (3 deep,
// cp.async), swizzled shared memory read by ldmatrix, mma.sync m16n8k16.

#define G_BN 128
#define G_BK 64
#define G_STAGES 3
#define G_THREADS 256

template <int BM, int EPI>
__global__ void __launch_bounds__(G_THREADS)
    gemm_kernel(const bf16 *__restrict__ A, const bf16 *__restrict__ W, void *C, int M, int N,
                int K) {
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
      for (int e = 0; e < 4; e++)
        acc[i][j][e] = 0.0f;
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
        for (int ni = 0; ni < NI; ni++)
          mma16816(acc[mi][ni], a[mi], b[ni][0], b[ni][1]);
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
          float2 *p =
              reinterpret_cast<float2 *>(reinterpret_cast<float *>(C) + (size_t)row * N + col);
          float2 x = *p;
          x.x += v0;
          x.y += v1;
          *p = x;
        } else if (EPI == OI_RM_EPI_SWIGLU) {
          float s = v0 / (1.0f + expf(-v0));
          reinterpret_cast<bf16 *>(C)[(size_t)row * (N / 2) + col / 2] =
              __float2bfloat16_rn(s * v1);
        } else {
          *reinterpret_cast<float2 *>(reinterpret_cast<float *>(C) + (size_t)row * N + col) =
              make_float2(v0, v1);
        }
      }
}

template <int BM, int EPI>
static int mma_launch(const uint16_t *A, const uint16_t *W, void *C, uint32_t M, uint32_t N,
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

// ---- wgmma path (sm_90a) ---------------------------------------------------------
// Persistent, warp-specialised: one CTA per SM walks output tiles of BM x BN
// (BM = 64 NC). Warpgroup 0's first thread is the producer: TMA loads each
// 64-wide K stage of A (BM rows) and W (BN rows) into 128-byte-swizzled
// shared memory, a ring of STAGES buffers with a full and an empty mbarrier
// each. Warpgroups 1..NC consume: each owns 64 rows of the tile and issues
// wgmma m64nBNk16 with both operands read from shared memory, keeping one
// stage of products in flight while it waits for the next. The producer runs
// ahead into the next tile while the consumers store the last one straight
// from registers (RESID as reductions in L2: no load round trip). K is walked
// in ascending 16-wide steps into one accumulator for every tile shape (no
// split-K): an element's value depends on its row of A and its row of W only,
// not on the tile shape or the wgmma width (checked bit for bit on an H200
// across every shape here and against launches of 1..1000 rows).
#ifdef OI_RM_GEMM_SM90A

#define WG_BK 64    // K per stage: one 128-byte swizzle row of bf16
#define WG_GROUP 16 // tile order: GROUP m-tiles down before the next n-tile (L2 reuse)

template <int NC, int BN> struct wg_cfg {
  static constexpr int BM = 64 * NC, THREADS = 128 * (NC + 1);
  static constexpr int A_BYTES = BM * WG_BK * 2, B_BYTES = BN * WG_BK * 2;
  static constexpr int STAGE_BYTES = A_BYTES + B_BYTES; // multiples of 1024: stages stay aligned
  static constexpr int FIT = (227 * 1024 - 1024 - 256) / STAGE_BYTES;
  static constexpr int STAGES = FIT > 12 ? 12 : FIT;
  // + 1024: the dynamic window is aligned up to the swizzle atom by hand.
  static constexpr int SMEM = STAGES * STAGE_BYTES + 1024 + 2 * STAGES * 8;
};

// Tile t of the persistent walk: columns of `group` m-tiles, each walked down
// before moving one n-tile right, so the CTAs running at once share A and W
// panels in L2.
__device__ __forceinline__ void wg_tile(int t, int tiles_m, int tiles_n, int group, int &tm,
                                        int &tn) {
  int per = group * tiles_n, g = t / per, m0 = g * group;
  int gm = min(group, tiles_m - m0), r = t - g * per;
  tm = m0 + r % gm;
  tn = r / gm;
}

// Stores one consumer thread's accumulators: rows row0 (+8), columns col0 +
// 8j (+1); see wgmma_bf16 for the layout.
template <int EPI, int BN>
__device__ __forceinline__ void wg_epilogue(const float *acc, void *C, int M, int N, int row0,
                                            int col0, int lane) {
  constexpr int J = BN / 8;
  // SWIGLU: lane pairs (l, l+1) hold adjacent outputs; the even lane stores
  // both as one word when rows of N/2 keep that word aligned.
  const bool pair = (N & 3) == 0;
#pragma unroll
  for (int j = 0; j < J; j++)
#pragma unroll
    for (int h = 0; h < 2; h++) {
      int row = row0 + 8 * h, col = col0 + 8 * j;
      float v0 = acc[4 * j + 2 * h], v1 = acc[4 * j + 2 * h + 1];
      if (EPI == OI_RM_EPI_SWIGLU) {
        // Fast exp and divide: the epilogue is not hidden behind the tensor cores.
        float o = __fdividef(v0, 1.0f + __expf(-v0)) * v1;
        float o1 = __shfl_down_sync(0xffffffffu, o, 1);
        if (row >= M || col >= N) continue;
        bf16 *out = reinterpret_cast<bf16 *>(C) + (size_t)row * (N / 2) + col / 2;
        if (!pair)
          *out = __float2bfloat16_rn(o);
        else if (!(lane & 1))
          *reinterpret_cast<uint32_t *>(out) = pack_bf16(o, o1);
        continue;
      }
      if (row >= M || col >= N) continue;
      if (EPI == OI_RM_EPI_BF16)
        *reinterpret_cast<uint32_t *>(reinterpret_cast<bf16 *>(C) + (size_t)row * N + col) =
            pack_bf16(v0, v1);
      else if (EPI == OI_RM_EPI_RESID)
        // The add happens in L2: no load round trip while the tensor cores idle.
        red_add_f32x2(reinterpret_cast<float *>(C) + (size_t)row * N + col, v0, v1);
      else
        *reinterpret_cast<float2 *>(reinterpret_cast<float *>(C) + (size_t)row * N + col) =
            make_float2(v0, v1);
    }
}

template <int NC, int BN, int EPI>
__global__ void __launch_bounds__(128 * (NC + 1), 1)
    wg_gemm_kernel(const __grid_constant__ CUtensorMap tma_a,
                   const __grid_constant__ CUtensorMap tma_w, void *C, int M, int N, int K,
                   int tiles_m, int tiles_n, int group) {
#ifdef OI_RM_SM90A_DEVICE
  using cfg = wg_cfg<NC, BN>;
  extern __shared__ uint8_t wg_smem[];
  // Stage s: A at base + s * STAGE_BYTES, W after it; then full[s], empty[s].
  const uint32_t base = (smem_u32(wg_smem) + 1023u) & ~1023u;
  const uint32_t full = base + cfg::STAGES * cfg::STAGE_BYTES, empty = full + 8 * cfg::STAGES;
  const int wg = threadIdx.x >> 7, ntiles = tiles_m * tiles_n, KB = K / WG_BK;
  if (threadIdx.x == 0) {
    for (int s = 0; s < cfg::STAGES; s++) {
      mbar_init(full + 8 * s, 1);
      mbar_init(empty + 8 * s, 4 * NC); // lane 0 of every consumer warp
    }
    mbar_fence_init();
  }
  __syncthreads();

  if (wg == 0) {
    // Producer: hands registers to the consumers (128 x 40 + 256 x 232 <= 64K).
    if (NC > 1) setmaxnreg_dec<40>();
    if (threadIdx.x >= 32) return;
    const int lane = threadIdx.x;
    if (lane == 0) {
      tma_prefetch_desc(&tma_a);
      tma_prefetch_desc(&tma_w);
    }
    int s = 0;
    uint32_t ph = 0;
    for (int t = blockIdx.x; t < ntiles; t += gridDim.x) {
      int tm, tn;
      wg_tile(t, tiles_m, tiles_n, group, tm, tn);
      if (EPI == OI_RM_EPI_RESID) {
        // The whole warp pulls the tile's residual rows into L2 while its
        // K loop runs, so the epilogue's reductions find them there.
        __syncwarp();
        int r0 = tm * cfg::BM, c0 = tn * BN, rows = min(cfg::BM, M - r0), cols = min(BN, N - c0);
        for (int r = lane; r < rows; r += 32) {
          const char *p = reinterpret_cast<const char *>(C) + ((size_t)(r0 + r) * N + c0) * 4;
          uintptr_t a = (uintptr_t)p & ~(uintptr_t)127, e = (uintptr_t)(p + cols * 4);
          for (; a < e; a += 128)
            asm volatile("prefetch.global.L2 [%0];\n" ::"l"(a));
        }
      }
      if (lane != 0) continue;
      for (int kb = 0; kb < KB; kb++) {
        mbar_wait(empty + 8 * s, ph ^ 1);
        const uint32_t a = base + s * cfg::STAGE_BYTES;
        mbar_arrive_expect_tx(full + 8 * s, cfg::STAGE_BYTES);
        tma_load_2d(a, &tma_a, full + 8 * s, kb * WG_BK, tm * cfg::BM);
        tma_load_2d(a + cfg::A_BYTES, &tma_w, full + 8 * s, kb * WG_BK, tn * BN);
        if (++s == cfg::STAGES) s = 0, ph ^= 1;
      }
    }
  } else {
    if (NC > 1) setmaxnreg_inc<232>();
    const int cw = wg - 1, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
    float acc[BN / 2];
    int s = 0;
    uint32_t ph = 0;
    for (int t = blockIdx.x; t < ntiles; t += gridDim.x) {
      int tm, tn;
      wg_tile(t, tiles_m, tiles_n, group, tm, tn);
#pragma unroll
      for (int i = 0; i < BN / 2; i++) {
        acc[i] = 0.0f;
        reg_fence(acc[i]);
      }
      int prev = 0;
      for (int kb = 0; kb < KB; kb++) {
        mbar_wait(full + 8 * s, ph);
        const uint32_t a = base + s * cfg::STAGE_BYTES;
        const uint64_t da = wgmma_desc_sw128(a + cw * 64 * 128),
                       db = wgmma_desc_sw128(a + cfg::A_BYTES);
        wgmma_fence();
#pragma unroll
        for (int k = 0; k < WG_BK / 16; k++)
          wgmma_bf16<BN>::run(acc, da + 2 * k, db + 2 * k);
        wgmma_commit();
        // At most this stage's products still in flight: the previous stage is free.
        wgmma_wait<1>();
        if (kb > 0 && lane == 0) mbar_arrive(empty + 8 * prev);
        prev = s;
        if (++s == cfg::STAGES) s = 0, ph ^= 1;
      }
      wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < BN / 2; i++)
        reg_fence(acc[i]);
      if (lane == 0) mbar_arrive(empty + 8 * prev);
      wg_epilogue<EPI, BN>(acc, C, M, N, tm * cfg::BM + cw * 64 + warp * 16 + (lane >> 2),
                           tn * BN + 2 * (lane & 3), lane);
    }
  }
#endif
}

typedef PFN_cuTensorMapEncodeTiled_v12000 pfn_encode_tiled;

// cuTensorMapEncodeTiled through cudart, as lib/device/cuda.c resolves the
// driver (no link against libcuda).
static pfn_encode_tiled tensor_map_encoder() {
  static pfn_encode_tiled fn;
  pfn_encode_tiled f = __atomic_load_n(&fn, __ATOMIC_ACQUIRE);
  if (f) return f;
  void *p = NULL;
  cudaDriverEntryPointQueryResult q;
  if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                       &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess || !p) {
    cudaGetLastError();
    return NULL;
  }
  f = (pfn_encode_tiled)p;
  __atomic_store_n(&fn, f, __ATOMIC_RELEASE);
  return f;
}

// A row-major bf16 [rows][K] matrix read in boxes of box_rows x 64, 128-byte
// swizzled (the layout wgmma_desc_sw128 describes); rows past the end read 0.
static int make_tensor_map(CUtensorMap *m, const uint16_t *p, uint32_t rows, uint32_t K,
                           uint32_t box_rows) {
  pfn_encode_tiled enc = tensor_map_encoder();
  if (!enc) return (int)cudaErrorNotSupported;
  cuuint64_t dim[2] = {K, rows}, stride[1] = {(cuuint64_t)K * 2};
  cuuint32_t box[2] = {WG_BK, box_rows}, estride[2] = {1, 1};
  CUresult r = enc(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<uint16_t *>(p), dim, stride,
                   box, estride, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                   CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? 0 : (int)cudaErrorInvalidValue;
}

template <int NC, int BN, int EPI>
static int wg_launch(const uint16_t *A, const uint16_t *W, void *C, uint32_t M, uint32_t N,
                     uint32_t K, int sms, int group, cudaStream_t s) {
  using cfg = wg_cfg<NC, BN>;
  static unsigned done = 0;
  int e = allow_smem((const void *)wg_gemm_kernel<NC, BN, EPI>, cfg::SMEM, &done);
  if (e) return e;
  CUtensorMap ma, mw;
  if ((e = make_tensor_map(&ma, A, M, K, cfg::BM)) || (e = make_tensor_map(&mw, W, N, K, BN)))
    return e;
  int tiles_m = (int)((M + cfg::BM - 1) / cfg::BM), tiles_n = (int)((N + BN - 1) / BN);
  int tiles = tiles_m * tiles_n, grid = tiles < sms ? tiles : sms;
  wg_gemm_kernel<NC, BN, EPI><<<grid, cfg::THREADS, cfg::SMEM, s>>>(
      ma, mw, C, (int)M, (int)N, (int)K, tiles_m, tiles_n, group);
  return (int)cudaGetLastError();
}

// Tile shape for (M, N): one wave of a persistent grid does SMS tiles, and a
// 128 x BN tile costs about BN + 24 column-equivalents per K step (A's load
// and the epilogue amortised over BN; fitted on H200 timings of the model's
// shapes), so minimise waves x (BN + 24). Rows M <= 64 (decode) are
// memory-bound: one consumer warpgroup, and narrow tiles so that more SMs
// pull W. Values do not depend on the choice.
enum { WG_C1_64, WG_C1_128, WG_C2_128, WG_C2_160, WG_C2_192, WG_C2_256 };

static int wg_choose(uint32_t M, uint32_t N, int sms) {
  if (M <= 64) return (N + 127) / 128 >= (uint32_t)sms ? WG_C1_128 : WG_C1_64;
  static const int bn[] = {256, 192, 160, 128}, id[] = {WG_C2_256, WG_C2_192, WG_C2_160, WG_C2_128};
  uint64_t tm = (M + 127) / 128, best = ~0ull;
  int pick = WG_C2_256;
  for (int i = 0; i < 4; i++) {
    uint64_t tiles = tm * ((N + bn[i] - 1) / bn[i]), waves = (tiles + sms - 1) / sms;
    uint64_t cost = waves * (uint64_t)(bn[i] + 24);
    if (cost < best) best = cost, pick = id[i];
  }
  return pick;
}

template <int EPI>
static int wg_gemm(int cfg, const uint16_t *A, const uint16_t *W, void *C, uint32_t M, uint32_t N,
                   uint32_t K, int sms, int group, cudaStream_t s) {
  switch (cfg) {
  case WG_C1_64: return wg_launch<1, 64, EPI>(A, W, C, M, N, K, sms, group, s);
  case WG_C1_128: return wg_launch<1, 128, EPI>(A, W, C, M, N, K, sms, group, s);
  case WG_C2_128: return wg_launch<2, 128, EPI>(A, W, C, M, N, K, sms, group, s);
  case WG_C2_160: return wg_launch<2, 160, EPI>(A, W, C, M, N, K, sms, group, s);
  case WG_C2_192: return wg_launch<2, 192, EPI>(A, W, C, M, N, K, sms, group, s);
  default: return wg_launch<2, 256, EPI>(A, W, C, M, N, K, sms, group, s);
  }
}

#endif // OI_RM_GEMM_SM90A

// ---- dispatch -------------------------------------------------------------------------

#ifdef OI_RM_GEMM_SM90A
// Per device: whether it runs the wgmma path (compute capability 9.0: the
// sm_90a code in this object runs there and nowhere else), and its SM count.
// Packed in one word, found once.
static int device_kind(int *sms) {
  static int info[64];
  int dev = 0;
  cudaGetDevice(&dev);
  int v = dev >= 0 && dev < 64 ? __atomic_load_n(&info[dev], __ATOMIC_ACQUIRE) : 0;
  if (!v) {
    int major = 0, minor = 0, n = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev);
    cudaGetLastError();
    v = 1 | (major == 9 && minor == 0) << 1 | (n > 0 ? n : 1) << 2;
    if (dev >= 0 && dev < 64) __atomic_store_n(&info[dev], v, __ATOMIC_RELEASE);
  }
  *sms = v >> 2;
  return (v >> 1) & 1;
}
#endif

template <int EPI>
static int gemm_epi(const uint16_t *A, const uint16_t *W, void *C, uint32_t M, uint32_t N,
                    uint32_t K, cudaStream_t s) {
#ifdef OI_RM_GEMM_SM90A
  // One instruction kind per device for every M: small M pads the tile
  // rather than falling back to mma.sync.
  int sms = 1;
  if (device_kind(&sms)) {
    if (((uintptr_t)A | (uintptr_t)W) & 15) return (int)cudaErrorInvalidValue; // TMA
    return wg_gemm<EPI>(wg_choose(M, N, sms), A, W, C, M, N, K, sms, WG_GROUP, s);
  }
#endif
  // Both tile heights walk K identically: the choice never changes a value.
  if (M <= 64) return mma_launch<64, EPI>(A, W, C, M, N, K, s);
  return mma_launch<128, EPI>(A, W, C, M, N, K, s);
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
