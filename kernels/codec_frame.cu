// Lossless frames made on the GPU (oi_kernel_lossless_frames): each block
// of a batch becomes the frame lib/codec's oi__codec_encode makes of it,
// byte for byte where its streams are wide (docs/codecs.md), in a slot of
// frame_bytes with zeros behind it. Kernels on one stream:
//   hist    each part's exponent histogram (a CTA a part of a block)
//   choose  one stream per part or streams of the whole block, by the cpu's
//           estimate of their bits (lossless.c's choose_segments); writes
//           the block's stream items
//   hist    each chosen stream's exponent histogram (a CTA a stream)
//   encode  kernels/codec_encode.cu's wide-stream encoder, or
//           kernels/codec_planes_encode.cu's planes code (a.planes: the
//           choice above by the streams' exact lengths, as lossless.c's)
//   pack    header, stream lengths, streams and the sign+mantissa plane;
//           the raw exponent plane where the streams do not pay; zeros
//           behind the frame; a frame past its slot is marked
//   hash    the data and frame checksums (XXH3, kernels/xxh3.cuh): each
//           1 KiB block's sums by a warp, then a warp a frame
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels.h"
#include "planes_choose.cuh"
#include "xxh3.cuh"

#define CHOOSE_THREADS 256
#define PACK_THREADS 256
#define PACK_SLICES 32
#define PACK_AHEAD 8 // loads a thread has in flight
#define HASH_WARPS 4
#define RANS32_LANES 32
#define RANS32_MIN 8192u

__global__ static void hist_kernel(const oi_kframe_args a) {
  __shared__ uint32_t h[256];
  const uint32_t part = blockIdx.x, b = blockIdx.y;
  const uint64_t n = a.block_bytes / 2, per = n / a.parts;
  for (uint32_t s = threadIdx.x; s < 256; s += blockDim.x)
    h[s] = 0;
  __syncthreads();
  const uint16_t *src =
      reinterpret_cast<const uint16_t *>(a.blocks + b * a.block_bytes) + (uint64_t)part * per;
  for (uint64_t i = threadIdx.x; i < per; i += blockDim.x)
    atomicAdd(&h[(src[i] >> 7) & 0xffu], 1u);
  __syncthreads();
  uint32_t *out = reinterpret_cast<uint32_t *>(a.hist) + ((uint64_t)b * a.parts + part) * 256;
  for (uint32_t s = threadIdx.x; s < 256; s += blockDim.x)
    out[s] = h[s];
}

// lossless.c's stream_bits, the same arithmetic in the same order.
__device__ static double stream_bits(const uint32_t *h, uint64_t n) {
  double bits = 8.0 * (2 + 4 * (n >= RANS32_MIN ? RANS32_LANES : 4) + 4);
  for (int s = 0; s < 256; s++)
    if (h[s]) bits += 12.0 - (double)h[s] * log2((double)h[s] / (double)n);
  return bits;
}

// lossless.c's choose_segments under the planes code: the streams' exact
// lengths, a warp a part, then the whole block's.
__device__ static uint32_t choose_planes(const oi_kframe_args &a, const uint32_t *h, uint64_t n,
                                         uint32_t *all) {
  __shared__ uint32_t wh[CHOOSE_THREADS / 32][256], wcum[CHOOSE_THREADS / 32][257];
  __shared__ unsigned long long wkey[CHOOSE_THREADS / 32][256];
  __shared__ unsigned long long split;
  const unsigned lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  if (threadIdx.x == 0) split = 0;
  __syncthreads();
  for (uint32_t p = warp; p < a.parts; p += CHOOSE_THREADS / 32) {
    for (uint32_t s = lane; s < 256; s += 32)
      wh[warp][s] = h[(uint64_t)p * 256 + s];
    __syncwarp();
    const planes_pick pk =
        planes_choose_warp(wh[warp], n / a.parts, wkey[warp], wcum[warp], NULL, lane);
    if (lane == 0) atomicAdd(&split, (unsigned long long)pk.bytes);
  }
  __syncthreads();
  uint32_t segs = 0;
  if (warp == 0) {
    const planes_pick pk = planes_choose_warp(all, n, wkey[0], wcum[0], NULL, lane);
    segs = split < pk.bytes ? a.segs_parts : a.segs_whole;
  }
  return segs;
}

__global__ static void __launch_bounds__(CHOOSE_THREADS) choose_kernel(const oi_kframe_args a) {
  __shared__ uint32_t all[256];
  __shared__ double part_bits[OI_KFRAME_MAX_PARTS];
  __shared__ uint32_t segs_s;
  const uint32_t b = blockIdx.x;
  const uint64_t n = a.block_bytes / 2;
  if (a.parts > 1) {
    const uint32_t *h = reinterpret_cast<const uint32_t *>(a.hist) + (uint64_t)b * a.parts * 256;
    for (uint32_t p = threadIdx.x; !a.planes && p < a.parts; p += blockDim.x)
      part_bits[p] = stream_bits(h + (uint64_t)p * 256, n / a.parts);
    for (uint32_t s = threadIdx.x; s < 256; s += blockDim.x) {
      uint32_t t = 0;
      for (uint32_t p = 0; p < a.parts; p++)
        t += h[(uint64_t)p * 256 + s];
      all[s] = t;
    }
    __syncthreads();
    if (a.planes) {
      const uint32_t segs = choose_planes(a, h, n, all);
      if (threadIdx.x == 0) segs_s = segs;
    } else if (threadIdx.x == 0) {
      double split = 0;
      for (uint32_t p = 0; p < a.parts; p++)
        split += part_bits[p];
      segs_s = split < stream_bits(all, n) ? a.segs_parts : a.segs_whole;
    }
  } else if (threadIdx.x == 0) {
    segs_s = a.segs_whole;
  }
  __syncthreads();
  const uint32_t segs = segs_s;
  const uint64_t per = n / segs;
  oi_kenc_item *items = reinterpret_cast<oi_kenc_item *>(a.items) + (uint64_t)b * a.max_segs;
  for (uint32_t k = threadIdx.x; k < a.max_segs; k += blockDim.x) {
    const uint64_t at = (uint64_t)b * a.max_segs + k;
    items[k] = oi_kenc_item{a.blocks + b * a.block_bytes + 2 * per * k,
                            a.streams + at * a.stream_cap,
                            a.scratch + at * a.stream_cap,
                            k < segs ? (uint32_t)per : 0u,
                            a.stream_cap,
                            k < segs ? a.hist + at * 256 * 4 : 0};
  }
  if (threadIdx.x == 0) reinterpret_cast<uint32_t *>(a.segs)[b] = segs;
}

// Each stream's exponent histogram (a CTA a stream), for the encoder: its
// warps then start from the counts.
__global__ static void stream_hist_kernel(const oi_kframe_args a) {
  __shared__ uint32_t h[256];
  const oi_kenc_item it = reinterpret_cast<const oi_kenc_item *>(a.items)[blockIdx.x];
  if (!it.count) return;
  for (uint32_t s = threadIdx.x; s < 256; s += blockDim.x)
    h[s] = 0;
  __syncthreads();
  const uint16_t *src = reinterpret_cast<const uint16_t *>(it.src);
  for (uint32_t i = threadIdx.x; i < it.count; i += blockDim.x)
    atomicAdd(&h[(src[i] >> 7) & 0xffu], 1u);
  __syncthreads();
  uint32_t *out = reinterpret_cast<uint32_t *>(it.hist);
  for (uint32_t s = threadIdx.x; s < 256; s += blockDim.x)
    out[s] = h[s];
}

__device__ static inline uint8_t sm_byte(uint16_t x) {
  return (uint8_t)(((x >> 8) & 0x80) | (x & 0x7f));
}

// to[i] = from[i] for i = t0, t0 + step, ... below len, PACK_AHEAD loads
// in flight.
__device__ static void copy_bytes(uint8_t *__restrict__ to, const uint8_t *__restrict__ from,
                                  uint64_t len, uint64_t t0, uint64_t step) {
  for (uint64_t i0 = t0; i0 < len; i0 += step * PACK_AHEAD) {
    uint8_t v[PACK_AHEAD];
#pragma unroll
    for (int t = 0; t < PACK_AHEAD; t++)
      v[t] = i0 + t * step < len ? from[i0 + t * step] : 0;
#pragma unroll
    for (int t = 0; t < PACK_AHEAD; t++)
      if (i0 + t * step < len) to[i0 + t * step] = v[t];
  }
}

// A CTA writes every PACK_SLICES-th stretch of its block's frame.
__global__ static void __launch_bounds__(PACK_THREADS) pack_kernel(const oi_kframe_args a) {
  __shared__ uint64_t off[OI_KFRAME_MAX_SEGS + 1];
  __shared__ uint32_t coded_s;
  const uint32_t b = blockIdx.x;
  const uint64_t n = a.block_bytes / 2;
  const uint32_t segs = reinterpret_cast<const uint32_t *>(a.segs)[b];
  const uint32_t *lens = reinterpret_cast<const uint32_t *>(a.lens) + (uint64_t)b * a.max_segs;
  const uint64_t head = 3 + 4ull * segs;
  if (threadIdx.x == 0) {
    // lossless.c: the streams pay when they total at most n - head - 1
    // bytes (each stream's encoder had the room left of that)
    bool ok = n > head + 1;
    uint64_t used = 0;
    off[0] = 0;
    for (uint32_t k = 0; ok && k < segs; k++) {
      ok = lens[k] > 0;
      used += lens[k];
      off[k + 1] = used;
    }
    coded_s = ok && used <= n - head - 1;
  }
  __syncthreads();
  const bool coded = coded_s;
  const uint64_t len = coded ? head + off[segs] + n : 1 + 2 * n;
  uint8_t *frame = reinterpret_cast<uint8_t *>(a.frames + b * a.frame_bytes);
  uint8_t *payload = frame + OI_KFRAME_HEADER;
  int32_t *status = reinterpret_cast<int32_t *>(a.status);
  if (OI_KFRAME_HEADER + len > a.frame_bytes) { // the cpu's "a frame past its slot"
    if (blockIdx.y == 0 && threadIdx.x == 0) status[b] = OI_KENC_PAST_SLOT;
    return;
  }
  if (blockIdx.y == 0 && threadIdx.x == 0) status[b] = 0;
  const uint16_t *src = reinterpret_cast<const uint16_t *>(a.blocks + b * a.block_bytes);
  const uint64_t t0 = (uint64_t)blockIdx.y * PACK_THREADS + threadIdx.x,
                 step = (uint64_t)gridDim.y * PACK_THREADS;
  if (blockIdx.y == 0) { // the header but its checksums, the payload's head
    for (uint32_t i = threadIdx.x; i < 24; i += PACK_THREADS)
      frame[i] = i >= 12 && i < 16             ? (uint8_t)(len >> (8 * (i - 12)))
                 : i == 4 && coded && a.planes ? (uint8_t)OI_KFRAME_PLANES_VERSION // its format
                                               : a.header[i];
    if (coded) {
      if (threadIdx.x == 0) {
        payload[0] = a.planes ? 3 : 2; // lossless.c's MODE_PLANES, MODE_RANS32
        payload[1] = (uint8_t)segs;
        payload[2] = (uint8_t)(segs >> 8);
      }
      for (uint32_t k = threadIdx.x; k < segs; k += PACK_THREADS)
        for (int j = 0; j < 4; j++)
          payload[3 + 4 * k + j] = (uint8_t)(lens[k] >> (8 * j));
    } else if (threadIdx.x == 0) {
      payload[0] = 0; // MODE_RAW
    }
  }
  uint8_t *sm;
  if (coded) {
    for (uint32_t k = 0; k < segs; k++)
      copy_bytes(payload + head + off[k],
                 reinterpret_cast<const uint8_t *>(a.streams +
                                                   ((uint64_t)b * a.max_segs + k) * a.stream_cap),
                 lens[k], t0, step);
    sm = payload + head + off[segs];
  } else {
    for (uint64_t i0 = t0; i0 < n; i0 += step * PACK_AHEAD) {
      uint16_t v[PACK_AHEAD];
#pragma unroll
      for (int t = 0; t < PACK_AHEAD; t++)
        v[t] = i0 + t * step < n ? src[i0 + t * step] : 0;
#pragma unroll
      for (int t = 0; t < PACK_AHEAD; t++)
        if (i0 + t * step < n) payload[1 + i0 + t * step] = (uint8_t)(v[t] >> 7);
    }
    sm = payload + 1 + n;
  }
  for (uint64_t i0 = t0; i0 < n; i0 += step * PACK_AHEAD) {
    uint16_t v[PACK_AHEAD];
#pragma unroll
    for (int t = 0; t < PACK_AHEAD; t++)
      v[t] = i0 + t * step < n ? src[i0 + t * step] : 0;
#pragma unroll
    for (int t = 0; t < PACK_AHEAD; t++)
      if (i0 + t * step < n) sm[i0 + t * step] = sm_byte(v[t]);
  }
  for (uint64_t i = OI_KFRAME_HEADER + len + t0; i < a.frame_bytes; i += step)
    frame[i] = 0;
}

// The checksums: the data checksum over the block (pass 0), then the frame
// checksum over the payload (pass 1), seeded with the hash of the header's
// first 32 bytes, which hold the data checksum. Each pass: every whole
// 1 KiB block's sums by a warp each, then a warp a frame.
__device__ static xxh_job frame_job(const oi_kframe_args &a, uint32_t b, int pass) {
  uint64_t *sums =
      reinterpret_cast<uint64_t *>(a.sums + b * oi_kframe_sums_bytes(a.block_bytes, a.frame_bytes));
  if (pass == 0)
    return xxh_job{reinterpret_cast<const uint8_t *>(a.blocks + b * a.block_bytes),
                   reinterpret_cast<const uint8_t *>(a.secret), sums, a.block_bytes};
  const uint8_t *frame = reinterpret_cast<const uint8_t *>(a.frames + b * a.frame_bytes);
  uint64_t len = 0;
  for (int i = 0; i < 4; i++)
    len |= (uint64_t)frame[12 + i] << (8 * i);
  return xxh_job{frame + OI_KFRAME_HEADER,
                 reinterpret_cast<const uint8_t *>(a.secrets) + (uint64_t)b * OI_XXH_SECRET_BYTES,
                 sums, len};
}

__global__ static void __launch_bounds__(32 * HASH_WARPS)
    sums_kernel(const oi_kframe_args a, int pass) {
  const unsigned lane = threadIdx.x & 31;
  const uint64_t per = oi_kframe_sums_bytes(a.block_bytes, a.frame_bytes) / 64, tasks = per * a.n;
  const int32_t *status = reinterpret_cast<const int32_t *>(a.status);
  for (uint64_t t = (uint64_t)blockIdx.x * HASH_WARPS + threadIdx.x / 32; t < tasks;
       t += (uint64_t)gridDim.x * HASH_WARPS) {
    const uint32_t b = (uint32_t)(t / per);
    if (pass && status[b]) continue; /* (pass 0 may run beside the pack: no status yet) */
    const xxh_job jb = frame_job(a, b, pass);
    const uint64_t j = t % per;
    if (j < xxh3_whole_blocks(jb.len)) xxh3_block_sums(jb, j, lane);
  }
}

__global__ static void __launch_bounds__(32 * HASH_WARPS)
    finish_kernel(const oi_kframe_args a, int pass) {
  const unsigned lane = threadIdx.x & 31;
  const uint32_t b = blockIdx.x * HASH_WARPS + threadIdx.x / 32;
  if (b >= a.n || (pass && reinterpret_cast<const int32_t *>(a.status)[b])) return;
  uint8_t *frame = reinterpret_cast<uint8_t *>(a.frames + b * a.frame_bytes);
  const uint64_t h = xxh3_finish(frame_job(a, b, pass), lane);
  if (lane == 0) reinterpret_cast<uint64_t *>(frame)[3 + pass] = h;
}

// The frame checksum's secret: its seed's, the hash of the header's first
// 32 bytes (the pack's 24 and the data checksum).
__global__ static void __launch_bounds__(32 * HASH_WARPS) secret_kernel(const oi_kframe_args a) {
  const unsigned lane = threadIdx.x & 31;
  const uint32_t b = blockIdx.x * HASH_WARPS + threadIdx.x / 32;
  if (b >= a.n || reinterpret_cast<const int32_t *>(a.status)[b]) return;
  const uint8_t *frame = reinterpret_cast<const uint8_t *>(a.frames + b * a.frame_bytes);
  const uint64_t seed = xxh3_32(frame, reinterpret_cast<const uint8_t *>(a.secret));
  xxh3_seed_secret(reinterpret_cast<const uint8_t *>(a.secret), seed,
                   reinterpret_cast<uint8_t *>(a.secrets) + (uint64_t)b * OI_XXH_SECRET_BYTES,
                   lane);
}

// Enough CTAs of sums_kernel for `tasks` warps' work, at most 8 a warp.
static uint32_t sums_ctas(uint64_t tasks) {
  uint64_t ctas = (tasks + 8 * HASH_WARPS - 1) / (8 * HASH_WARPS);
  return (uint32_t)(ctas < 1 ? 1 : ctas > 65535 ? 65535 : ctas);
}

// OI_KFRAME_STAGES=1 (environment; measuring only: it waits for each
// kernel): each step's time on stderr.
namespace {
struct stages {
  cudaStream_t s;
  bool on;
  cudaEvent_t ev[8];
  int n = 0;
  const char *names[8];
  explicit stages(cudaStream_t st) : s(st), on(getenv("OI_KFRAME_STAGES") != nullptr) {}
  void mark(const char *name) {
    if (!on || n == 8) return;
    cudaEventCreate(&ev[n]);
    cudaEventRecord(ev[n], s);
    names[n++] = name;
  }
  ~stages() {
    if (!on || n == 0) return;
    cudaEventSynchronize(ev[n - 1]);
    for (int i = 1; i < n; i++) {
      float ms = 0;
      cudaEventElapsedTime(&ms, ev[i - 1], ev[i]);
      fprintf(stderr, "  frames: %-8s %8.1f us\n", names[i], ms * 1e3);
    }
    for (int i = 0; i < n; i++)
      cudaEventDestroy(ev[i]);
  }
};
} // namespace

extern "C" int oi_kernel_lossless_frames(const oi_kframe_args *a, void *stream, void *side,
                                         void *fork, void *join) {
  cudaStream_t s = static_cast<cudaStream_t>(stream), s2 = static_cast<cudaStream_t>(side);
  if (a->n == 0) return cudaSuccess;
  if (a->n > 65535u || a->parts > OI_KFRAME_MAX_PARTS || a->max_segs > OI_KFRAME_MAX_SEGS ||
      a->segs_whole == 0 || a->segs_whole > a->max_segs || a->segs_parts > a->max_segs ||
      (a->parts > 1 && a->segs_parts == 0) || (side && (!fork || !join)))
    return cudaErrorInvalidValue;
  const uint32_t frames_ctas = (a->n + HASH_WARPS - 1) / HASH_WARPS;
  const uint32_t sums = sums_ctas(oi_kframe_sums_bytes(a->block_bytes, a->frame_bytes) / 64 * a->n);
  stages st(s);
  st.mark("start");
  // the data checksums need only the blocks: beside the encode where there is a side stream
  cudaStream_t hs = side ? s2 : s;
  if (side) {
    cudaEventRecord(static_cast<cudaEvent_t>(fork), s);
    cudaStreamWaitEvent(s2, static_cast<cudaEvent_t>(fork), 0);
  }
  sums_kernel<<<sums, 32 * HASH_WARPS, 0, hs>>>(*a, 0);
  finish_kernel<<<frames_ctas, 32 * HASH_WARPS, 0, hs>>>(*a, 0);
  if (side) cudaEventRecord(static_cast<cudaEvent_t>(join), s2);
  st.mark("data xxh");
  if (a->parts > 1) hist_kernel<<<dim3(a->parts, a->n), 256, 0, s>>>(*a);
  choose_kernel<<<a->n, CHOOSE_THREADS, 0, s>>>(*a);
  stream_hist_kernel<<<a->n * a->max_segs, 256, 0, s>>>(*a);
  st.mark("choose");
  const oi_kenc_item *items = reinterpret_cast<const oi_kenc_item *>(a->items);
  uint32_t *lens = reinterpret_cast<uint32_t *>(a->lens);
  int err = a->planes ? oi_kernel_planes_encode(items, a->n * a->max_segs, lens, stream)
                      : oi_kernel_rans32_encode(items, a->n * a->max_segs, lens, stream);
  if (err != cudaSuccess) return err;
  st.mark("encode");
  pack_kernel<<<dim3(a->n, PACK_SLICES), PACK_THREADS, 0, s>>>(*a);
  st.mark("pack");
  if (side) cudaStreamWaitEvent(s, static_cast<cudaEvent_t>(join), 0);
  secret_kernel<<<frames_ctas, 32 * HASH_WARPS, 0, s>>>(*a);
  sums_kernel<<<sums, 32 * HASH_WARPS, 0, s>>>(*a, 1);
  finish_kernel<<<frames_ctas, 32 * HASH_WARPS, 0, s>>>(*a, 1);
  st.mark("frame xxh");
  return cudaGetLastError();
}

// XXH3-64 of each item (tests: the same hashes as libxxhash's), through
// the frames' own steps: the item's secret, its blocks' sums, the chain.
__device__ static xxh_job item_job(const oi_khash_item &it) {
  uint8_t *scratch = reinterpret_cast<uint8_t *>(it.scratch);
  return xxh_job{reinterpret_cast<const uint8_t *>(it.src), scratch,
                 reinterpret_cast<uint64_t *>(scratch + OI_XXH_SECRET_BYTES), it.len};
}

__global__ static void __launch_bounds__(32 * HASH_WARPS)
    item_secret_kernel(const oi_khash_item *items, uint32_t n, const uint8_t *def) {
  const uint32_t k = blockIdx.x * HASH_WARPS + threadIdx.x / 32;
  if (k < n)
    xxh3_seed_secret(def, items[k].seed, reinterpret_cast<uint8_t *>(items[k].scratch),
                     threadIdx.x & 31);
}

__global__ static void __launch_bounds__(32 * HASH_WARPS)
    item_sums_kernel(const oi_khash_item *items, uint32_t n, uint64_t per) {
  for (uint64_t t = (uint64_t)blockIdx.x * HASH_WARPS + threadIdx.x / 32; t < per * n;
       t += (uint64_t)gridDim.x * HASH_WARPS) {
    const xxh_job jb = item_job(items[t / per]);
    if (t % per < xxh3_whole_blocks(jb.len)) xxh3_block_sums(jb, t % per, threadIdx.x & 31);
  }
}

__global__ static void __launch_bounds__(32 * HASH_WARPS)
    item_finish_kernel(const oi_khash_item *items, uint32_t n) {
  const uint32_t k = blockIdx.x * HASH_WARPS + threadIdx.x / 32;
  if (k >= n) return;
  const uint64_t h = xxh3_finish(item_job(items[k]), threadIdx.x & 31);
  if ((threadIdx.x & 31) == 0) *reinterpret_cast<uint64_t *>(items[k].out) = h;
}

extern "C" int oi_kernel_xxh3(const oi_khash_item *items, uint32_t n, uint64_t max_len,
                              const void *secret, void *stream) {
  if (n == 0) return cudaSuccess;
  if (max_len <= 240) return cudaErrorInvalidValue;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const uint32_t ctas = (n + HASH_WARPS - 1) / HASH_WARPS;
  const uint64_t per = xxh3_whole_blocks(max_len);
  item_secret_kernel<<<ctas, 32 * HASH_WARPS, 0, s>>>(items, n,
                                                      static_cast<const uint8_t *>(secret));
  if (per) item_sums_kernel<<<sums_ctas(per * n), 32 * HASH_WARPS, 0, s>>>(items, n, per);
  item_finish_kernel<<<ctas, 32 * HASH_WARPS, 0, s>>>(items, n);
  return cudaGetLastError();
}
