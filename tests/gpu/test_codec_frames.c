/* Lossless frames made on the GPU (kernels/codec_frame.cu, the save path's
 * stream_encode) against the cpu's (lib/codec's oi__codec_encode), byte for
 * byte, with the committed real-KV corpus (argv[1]) tiled into blocks:
 *  - XXH3-64 on the GPU against libxxhash's, seeds 0 and not, lengths
 *    around its stripes and blocks;
 *  - frames of GLM5.2- and Qwen3-4B-sized blocks, with parts (the encoder
 *    chooses one stream per part or streams of the whole block) and
 *    without, random bytes (the exponent plane raw), a slot too small
 *    (marked, as the cpu refuses it): every frame, and the zeros behind it
 *    in its slot, equal to the cpu's, and decoded by the cpu (both
 *    checksums) to the block;
 *  - an engine's lossless namespace over four arenas: saves made on the
 *    device (OI_CODEC_ENCODE=device) leave the cpu's frames in the pool and
 *    load back byte-exact, decoded on the device and on the host; a save
 *    whose KV is written late on an engine stream waits for its event.
 * `--rates`: the frames of 256 GLM5.2 blocks (logical bytes), and an
 * engine's saves made on the device and on the host, beside bulk D2H of the
 * same bytes in the same run. Skips (77) without a GPU. */
#define XXH_STATIC_LINKING_ONLY
#include <cuda_runtime.h>
#include <time.h>
#include <xxhash.h>

#include "../codec/codec_testutil.h"
#include "codec/codec.h"
#include "core/core.h"
#include "cu_check.h"
#include "device/device.h"
#include "host/host_private.h"
#include "kernels/kernels.h"
#include "rig.h"
#include "testutil.h"

static uint8_t *corpus;
static size_t corpus_len;
static uint8_t *d_secret;

static void tile(uint8_t *dst, size_t bytes, size_t from) {
  for (size_t i = 0; i < bytes; i++)
    dst[i] = corpus[(from + i) % corpus_len];
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void test_xxh3(void) {
  const size_t lens[] = {241,  255,  256,  1023, 1024,   1025,   1088,   2047,
                         2048, 2049, 4095, 4096, 4097,   5000,   16448,  65553,
                         3000, 3001, 3007, 7777, 100000, 589829, 2359296};
  const size_t n = OI_ARRAY_LEN(lens) * 2;
  size_t total = 0;
  for (size_t k = 0; k < OI_ARRAY_LEN(lens); k++)
    total += (lens[k] + 7) & ~(size_t)7;
  uint8_t *buf = malloc(total), *d_buf = NULL, *d_scratch = NULL;
  size_t max_len = 0, scratch = 0;
  for (size_t k = 0; k < OI_ARRAY_LEN(lens); k++) {
    max_len = OI_MAX(max_len, lens[k]);
    scratch += 2 * (192 + 64 * ((lens[k] - 1) / 1024));
  }
  uint64_t *d_out = NULL, out[OI_ARRAY_LEN(lens) * 2];
  oi_khash_item items[OI_ARRAY_LEN(lens) * 2], *d_items = NULL;
  REQUIRE(buf);
  tile(buf, total, 12345);
  CU(cudaMalloc((void **)&d_buf, total));
  CU(cudaMalloc((void **)&d_out, n * 8));
  CU(cudaMalloc((void **)&d_items, sizeof items));
  CU(cudaMalloc((void **)&d_scratch, scratch));
  CU(cudaMemcpy(d_buf, buf, total, cudaMemcpyHostToDevice));
  uint64_t seeds[2] = {0, 0x9d1c3b7a55e0f123ull};
  size_t sat = 0;
  for (size_t k = 0, at = 0; k < OI_ARRAY_LEN(lens); at += (lens[k] + 7) & ~(size_t)7, k++)
    for (int s = 0; s < 2; s++) {
      items[2 * k + s] = (oi_khash_item){.src = (uint64_t)(uintptr_t)(d_buf + at),
                                         .len = lens[k],
                                         .seed = seeds[s] + k,
                                         .out = (uint64_t)(uintptr_t)(d_out + 2 * k + s),
                                         .scratch = (uint64_t)(uintptr_t)(d_scratch + sat)};
      sat += 192 + 64 * ((lens[k] - 1) / 1024);
    }
  for (size_t k = 0; k < OI_ARRAY_LEN(lens); k++)
    items[2 * k].seed = 0;
  CU(cudaMemcpy(d_items, items, sizeof items, cudaMemcpyHostToDevice));
  CU((cudaError_t)oi_kernel_xxh3(d_items, (uint32_t)n, max_len, d_secret, NULL));
  CU(cudaMemcpy(out, d_out, sizeof out, cudaMemcpyDeviceToHost));
  size_t bad = 0;
  for (size_t k = 0, at = 0; k < OI_ARRAY_LEN(lens); at += (lens[k] + 7) & ~(size_t)7, k++)
    for (int s = 0; s < 2; s++) {
      uint64_t seed = items[2 * k + s].seed;
      uint64_t want =
          seed ? XXH3_64bits_withSeed(buf + at, lens[k], seed) : XXH3_64bits(buf + at, lens[k]);
      if (out[2 * k + s] != want) {
        fprintf(stderr, "xxh3: %zu bytes, seed %llx: gpu %016llx, libxxhash %016llx\n", lens[k],
                (unsigned long long)seed, (unsigned long long)out[2 * k + s],
                (unsigned long long)want);
        bad++;
      }
    }
  printf("%-52s %3zu hashes, %zu differ\n", "XXH3-64, 241 B to 2.25 MiB, seeded and not", n, bad);
  CHECK(bad == 0);
  free(buf);
  cudaFree(d_buf);
  cudaFree(d_out);
  cudaFree(d_items);
  cudaFree(d_scratch);
}

static bool planes; /* the planes code's frames (format 4), else wide rANS */

/* The kernels' buffers for n blocks of a plan. */
typedef struct frame_rig {
  oi_kframe_args a;
  uint8_t *d_blocks, *d_frames, *d_work;
  int32_t *d_status;
} frame_rig;

static frame_rig rig_new(const oi_lossless_gpu_plan *p, size_t n, uint64_t bb, uint64_t fb) {
  frame_rig r = {0};
  uint64_t per = n * p->max_segs;
  uint64_t hist = n * OI_MAX(p->parts, p->max_segs) * 256 * 4, items = per * sizeof(oi_kenc_item),
           lens = per * 4, segs = n * 4, streams = per * p->stream_cap;
  CU(cudaMalloc((void **)&r.d_blocks, n * bb));
  CU(cudaMalloc((void **)&r.d_frames, n * fb));
  CU(cudaMalloc((void **)&r.d_status, n * 4));
  uint64_t sums = n * oi_kframe_sums_bytes(bb, fb), secrets = n * 192;
  CU(cudaMalloc((void **)&r.d_work,
                hist + items + lens + segs + 2 * streams + sums + secrets + 2048));
  uint64_t w = (uint64_t)(uintptr_t)r.d_work;
  r.a = (oi_kframe_args){.blocks = (uint64_t)(uintptr_t)r.d_blocks,
                         .frames = (uint64_t)(uintptr_t)r.d_frames,
                         .hist = w,
                         .items = w + ((hist + 255) & ~255ull),
                         .status = (uint64_t)(uintptr_t)r.d_status,
                         .secret = (uint64_t)(uintptr_t)d_secret,
                         .block_bytes = bb,
                         .frame_bytes = fb,
                         .n = (uint32_t)n,
                         .parts = p->parts,
                         .segs_whole = p->segs_whole,
                         .segs_parts = p->segs_parts,
                         .max_segs = p->max_segs,
                         .stream_cap = p->stream_cap,
                         .planes = planes};
  r.a.lens = r.a.items + ((items + 255) & ~255ull);
  r.a.segs = r.a.lens + ((lens + 255) & ~255ull);
  r.a.streams = r.a.segs + ((segs + 255) & ~255ull);
  r.a.scratch = r.a.streams + streams;
  r.a.sums = r.a.scratch + ((streams + 255) & ~255ull);
  r.a.secrets = r.a.sums + ((sums + 255) & ~255ull);
  memcpy(r.a.header, p->header, sizeof r.a.header);
  CU(cudaMemset(r.d_frames, 0xa5, n * fb)); /* what the pack must overwrite */
  return r;
}

static void rig_free(frame_rig *r) {
  cudaFree(r->d_blocks);
  cudaFree(r->d_frames);
  cudaFree(r->d_status);
  cudaFree(r->d_work);
}

/* n blocks of `bb` bytes (the corpus from `from`, or random bytes) framed
 * on the GPU into slots of fb; returns the blocks whose slot differs from
 * the cpu's frame and zeros (or whose refusal differs). */
static size_t check_frames(const char *what, uint64_t bb, uint16_t parts, size_t n, bool random,
                           uint64_t fb) {
  oi_codec_shape sh = {.dtype = OI_CODEC_DTYPE_BF16, .parts = parts};
  if (parts) {
    sh.tokens = 16;
    sh.heads = 1;
    sh.head_dim = (uint16_t)(bb / parts / 2 / 16);
    REQUIRE((uint64_t)sh.parts * sh.tokens * sh.heads * sh.head_dim * 2 == bb);
  }
  oi_lossless_gpu_plan p;
  REQUIRE(oi__lossless_gpu_plan(&sh, bb, &p));
  uint8_t *blocks = malloc(n * bb), *gpu = malloc(n * fb), *cpu = calloc(1, fb + bb),
          *back = malloc(bb);
  int32_t *status = malloc(n * 4);
  REQUIRE(blocks && gpu && cpu && back && status);
  uint64_t seed = 99;
  if (random)
    for (size_t i = 0; i < n * bb; i++)
      blocks[i] = (uint8_t)ct_rand(&seed);
  else
    tile(blocks, n * bb, 8192); /* even: whole bf16 elements of the corpus */
  frame_rig r = rig_new(&p, n, bb, fb);
  CU(cudaMemcpy(r.d_blocks, blocks, n * bb, cudaMemcpyHostToDevice));
  CU((cudaError_t)oi_kernel_lossless_frames(&r.a, NULL, NULL, NULL, NULL));
  CU(cudaDeviceSynchronize());
  CU(cudaMemcpy(gpu, r.d_frames, n * fb, cudaMemcpyDeviceToHost));
  CU(cudaMemcpy(status, r.d_status, n * 4, cudaMemcpyDeviceToHost));
  size_t bad = 0, refused = 0, coded = 0;
  for (size_t b = 0; b < n; b++) {
    size_t out = 0, got = 0;
    memset(cpu, 0, fb + bb);
    REQUIRE((planes ? oi__codec_encode_planes(&sh, blocks + b * bb, bb, cpu, fb + bb, &out)
                    : oi__codec_encode(OI_CODEC_LOSSLESS, &sh, blocks + b * bb, bb, cpu, fb + bb,
                                       &out)) == OI_OK);
    bool same;
    if (out > fb) { /* the cpu's frame is past the slot: the GPU's refuses it */
      same = status[b] == OI_KENC_PAST_SLOT;
      refused++;
    } else {
      memset(cpu + out, 0, fb - out); /* the slot's bytes behind the frame: zeros */
      same = status[b] == 0 && !memcmp(gpu + b * fb, cpu, fb) &&
             oi__codec_decode(gpu + b * fb, fb, back, bb, &got) == OI_OK && got == bb &&
             !memcmp(back, blocks + b * bb, bb);
      coded += cpu[OI_CODEC_HEADER_BYTES] == (planes ? 3 : 2);
    }
    if (!same) {
      size_t at = 0;
      while (at < fb && gpu[b * fb + at] == cpu[at])
        at++;
      fprintf(stderr, "%s: block %zu: status %d, cpu frame %zu bytes; first differing byte %zu\n",
              what, b, status[b], out, at);
      bad++;
    }
  }
  printf("%-52s %3zu frames (%zu coded, %zu past the slot), %zu differ\n", what, n, coded, refused,
         bad);
  rig_free(&r);
  free(blocks);
  free(gpu);
  free(cpu);
  free(back);
  free(status);
  return bad;
}

static void test_frames(void) {
  const uint64_t glm = 3452160, qwen = 2359296;
  for (int code = 0; code < 2; code++) { /* wide rANS, then the planes code */
    planes = code;
    if (planes) printf("the planes code:\n");
    CHECK(check_frames("GLM5.2 blocks, 58 parts", glm, 58, 6, false, glm) == 0);
    CHECK(check_frames("GLM5.2 blocks, no shape", glm, 0, 3, false, (glm * 3 / 4) & ~255ull) == 0);
    CHECK(check_frames("Qwen3-4B blocks, 72 parts", qwen, 72, 5, false, (qwen * 3 / 4) & ~255ull) ==
          0);
    CHECK(check_frames("Qwen3-4B blocks, 2 parts", qwen, 2, 3, false, qwen) == 0);
    CHECK(check_frames("random bytes (the exponent plane raw)", qwen, 72, 2, true, qwen + 4096) ==
          0);
    CHECK(check_frames("a slot too small (0.6 of the block)", qwen, 72, 3, false,
                       (qwen * 6 / 10) & ~255ull) == 0);
  }
  planes = false;
  /* blocks whose streams would not be wide: the host encodes them */
  oi_lossless_gpu_plan p;
  oi_codec_shape sh = {.dtype = OI_CODEC_DTYPE_BF16};
  CHECK(!oi__lossless_gpu_plan(&sh, 12288, &p));
  CHECK(strstr(oi_last_error(), "no wide streams") != NULL);
}

/* ---- the engine's saves ------------------------------------------------------------ */

static oi_dev *dev;

/* One lossless namespace over four arenas (layers) of `n` blocks of 4 x
 * 589,824 bytes (a Qwen3-4B block), saved with frames made where `encode`
 * says, loaded back decoded where `decode` says; returns the save's
 * seconds (or 0 when the bytes did not come back). */
static double engine_round(const char *encode, const char *decode, size_t n, bool check,
                           bool late) {
  setenv("OI_CODEC_ENCODE", encode, 1);
  setenv("OI_CODEC_DECODE", decode, 1);
  enum { ARENAS = 4 };
  const uint64_t per = 589824, bb = ARENAS * per;
  uint64_t bytes = 2 * n * per; /* an arena's */
  uint8_t *region = NULL, *host = malloc(bytes), *kv = NULL, *busy = NULL;
  REQUIRE(host && dev->ops->mem_alloc(dev, ARENAS * bytes, 0, (void **)&region) == OI_OK);
  CU(cudaMalloc((void **)&kv, ARENAS * bytes));
  for (int a = 0; a < ARENAS; a++) {
    tile(host, bytes, 1000 * (size_t)a);
    CU(cudaMemcpy(kv + a * bytes, host, bytes, cudaMemcpyHostToDevice));
  }
  /* late: the KV lands in the arenas on an engine stream after 16 fills of
   * 1 GiB; the save waits for its event (a save that read the arenas
   * early would frame zeros) */
  cudaStream_t user = NULL;
  cudaEvent_t written = NULL;
  if (late) {
    CU(cudaMemset(region, 0, ARENAS * bytes));
    CU(cudaDeviceSynchronize()); /* (the engine stream below does not wait for the legacy one) */
    CU(cudaMalloc((void **)&busy, 1ull << 30));
    CU(cudaStreamCreateWithFlags(&user, cudaStreamNonBlocking));
    CU(cudaEventCreateWithFlags(&written, cudaEventDisableTiming));
    for (int i = 0; i < 16; i++)
      CU(cudaMemsetAsync(busy, i, 1ull << 30, user));
    CU(cudaMemcpyAsync(region, kv, ARENAS * bytes, cudaMemcpyDeviceToDevice, user));
    CU(cudaEventRecord(written, user));
  } else {
    CU(cudaMemcpy(region, kv, ARENAS * bytes, cudaMemcpyDeviceToDevice));
  }
  oi_arena_desc ad[ARENAS];
  tr_layers(ad, ARENAS, tr_layer_names, NULL, 2 * n, per);
  oi_host_options ho = tr_host_options(2 * n * bb);
  ho.device = 0;
  oi_host *h = tr_host_new(&ho);
  oi_engine_options eo = tr_engine_options("frames", ad, ARENAS);
  eo.device = 0;
  eo.arena_base = region;
  eo.arena_size = ARENAS * bytes;
  eo.codec = "lossless";
  eo.codec_tokens = 16;
  eo.codec_heads = 8;
  eo.codec_head_dim = 128; /* 72 parts of 32 KiB per block */
  oi_engine *e = tr_engine_new(h, &eo);
  int64_t *ids = calloc(n, sizeof *ids), *dst = calloc(n, sizeof *dst);
  oi_block_hash *hs = calloc(n, sizeof *hs);
  REQUIRE(ids && dst && hs);
  for (size_t b = 0; b < n; b++) {
    ids[b] = (int64_t)b;
    dst[b] = (int64_t)(2 * n - 1 - b);
    hs[b] = tr_hash(b, 21, 0x5a);
  }
  double t0 = now_s();
  oi_save_options so;
  REQUIRE(oi_save_options_init(&so) == OI_OK);
  so.wait_event = written;
  oi_ticket *ticket = NULL;
  oi_status sst = oi_engine_save(e, ids, hs, n, &so, &ticket); /* (then the ticket: in order) */
  CHECK_OK(tr_then_wait(sst, ticket, 60000));
  double t_save = now_s() - t0;
  oi_engine_stats es = {.struct_size = sizeof es};
  CHECK_OK(oi_engine_get_stats(e, &es));
  CHECK(es.saves_not_encoded == 0);
  size_t bad = 0;
  if (check) {
    /* the pool's frames are the cpu's, byte for byte */
    uint8_t *block = malloc(bb), *want = malloc(bb + 64);
    REQUIRE(block && want);
    oi_codec_shape sh = {
        .dtype = OI_CODEC_DTYPE_BF16, .parts = 72, .tokens = 16, .heads = 8, .head_dim = 128};
    for (size_t b = 0; b < n; b++) {
      for (int a = 0; a < ARENAS; a++) {
        tile(host, bytes, 1000 * (size_t)a);
        memcpy(block + a * per, host + b * per, per);
      }
      size_t out = 0;
      const char *code = getenv("OI_LOSSLESS_CODE"); /* rANS's frames, else the planes code's */
      REQUIRE((!code || strcmp(code, "rans")
                   ? oi__codec_encode_planes(&sh, block, bb, want, bb + 64, &out)
                   : oi__codec_encode(OI_CODEC_LOSSLESS, &sh, block, bb, want, bb + 64, &out)) ==
              OI_OK);
      oi_host_ns ns;
      REQUIRE(oi__host_find_namespace(h, "frames", &ns));
      index_shard *s = oi__index_shard(h, ns.id, &hs[b]);
      pthread_mutex_lock(&s->lock);
      host_block *hb = oi__index_find_locked(s, ns.id, &hs[b]);
      bool same = hb && !memcmp(oi__block_data(h, hb), want, out);
      pthread_mutex_unlock(&s->lock);
      bad += !same;
    }
    free(block);
    free(want);
    CHECK(bad == 0);
    oi_query_result q;
    CHECK_OK(tr_query(e, "r", hs, n, 0, NULL, &q));
    CHECK(q.hit_blocks == n);
    oi_load_options lo;
    oi_load_options_init(&lo);
    oi_ticket *t = NULL;
    CHECK_OK(oi_engine_load(e, q.lease, dst, n, &lo, &t));
    CHECK_OK(tr_wait(t, 60000));
    size_t wrong = 0;
    uint8_t *src = malloc(bytes);
    REQUIRE(src);
    for (int a = 0; a < ARENAS; a++) {
      tile(src, bytes, 1000 * (size_t)a);
      REQUIRE(dev->ops->mem_copy(dev, host, region + a * bytes, bytes) == OI_OK);
      for (size_t b = 0; b < n; b++)
        wrong += memcmp(host + (2 * n - 1 - b) * per, src + b * per, per) != 0;
    }
    free(src);
    CHECK(wrong == 0);
    printf("engine, 4 arenas, %zu blocks%s: frames made on the %s %s the cpu's (%zu differ); "
           "loaded decoded on the %s, %zu pieces wrong\n",
           n, late ? ", written after a wait the save waits for" : "", encode,
           bad ? "are not" : "are", bad, decode, wrong);
    bad += wrong;
  }
  oi_engine_destroy(e);
  oi_host_destroy(h);
  dev->ops->mem_free(dev, region);
  cudaFree(kv);
  if (late) {
    cudaFree(busy);
    cudaEventDestroy(written);
    cudaStreamDestroy(user);
  }
  free(host);
  free(ids);
  free(dst);
  free(hs);
  return bad ? 0 : t_save;
}

static void test_engine(void) {
  setenv("OI_LOSSLESS_CODE", "rans", 1); /* rANS's frames, both ways */
  CHECK(engine_round("device", "device", 24, true, false) > 0);
  unsetenv("OI_LOSSLESS_CODE"); /* the planes code's, the default */
  CHECK(engine_round("device", "device", 24, true, false) > 0);
  CHECK(engine_round("device", "host", 24, true, false) > 0);
  CHECK(engine_round("device", "device", 24, true, true) > 0);
}

/* ---- rates ------------------------------------------------------------------------- */

/* The frame kernels' time for n GLM5.2 blocks of the corpus; *d2h gets a
 * bulk D2H of the same bytes' (milliseconds). */
static float frames_ms(size_t n, float *d2h) {
  const uint64_t bb = 3452160, fb = (bb * 3 / 4) & ~255ull;
  oi_codec_shape sh = {.dtype = OI_CODEC_DTYPE_BF16,
                       .parts = 58,
                       .tokens = 16,
                       .heads = 1,
                       .head_dim = (uint16_t)(bb / 58 / 2 / 16)};
  oi_lossless_gpu_plan p;
  REQUIRE(oi__lossless_gpu_plan(&sh, bb, &p));
  uint8_t *blocks = NULL;
  CU(cudaMallocHost((void **)&blocks, n * bb));
  tile(blocks, n * bb, 0);
  frame_rig r = rig_new(&p, n, bb, fb);
  CU(cudaMemcpy(r.d_blocks, blocks, n * bb, cudaMemcpyHostToDevice));
  cudaEvent_t a, b, fork, join;
  cudaStream_t side;
  CU(cudaEventCreate(&a));
  CU(cudaEventCreate(&b));
  CU(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  CU(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
  CU(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  float best = 1e30f, best_d2h = 1e30f;
  for (int rep = 0; rep < 5; rep++) { /* as the engine runs them: the data checksums beside */
    float ms = 0;
    CU(cudaEventRecord(a, NULL));
    CU((cudaError_t)oi_kernel_lossless_frames(&r.a, NULL, side, fork, join));
    CU(cudaEventRecord(b, NULL));
    CU(cudaEventSynchronize(b));
    CU(cudaEventElapsedTime(&ms, a, b));
    best = ms < best ? ms : best;
    CU(cudaEventRecord(a, NULL));
    CU(cudaMemcpyAsync(blocks, r.d_blocks, n * bb, cudaMemcpyDeviceToHost, NULL));
    CU(cudaEventRecord(b, NULL));
    CU(cudaEventSynchronize(b));
    CU(cudaEventElapsedTime(&ms, a, b));
    best_d2h = ms < best_d2h ? ms : best_d2h;
  }
  setenv("OI_KFRAME_STAGES", "1", 1); /* one more run, each step timed */
  CU((cudaError_t)oi_kernel_lossless_frames(&r.a, NULL, NULL, NULL, NULL));
  CU(cudaDeviceSynchronize());
  unsetenv("OI_KFRAME_STAGES");
  double logical = (double)n * bb;
  printf("frames of %3zu GLM5.2 blocks%s: %.1f GB/s logical (%.0f us); bulk D2H %.1f GB/s: %.2fx\n",
         n, planes ? " (planes)" : "", logical / best / 1e6, best * 1e3, logical / best_d2h / 1e6,
         best_d2h / best);
  rig_free(&r);
  cudaFreeHost(blocks);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaEventDestroy(fork);
  cudaEventDestroy(join);
  cudaStreamDestroy(side);
  *d2h = best_d2h / (float)n;
  return best;
}

static void rates(void) {
  float d2h_ms = 0;
  frames_ms(10, &d2h_ms); /* one save group (32 MiB) */
  frames_ms(256, &d2h_ms);
  planes = true;
  frames_ms(10, &d2h_ms);
  frames_ms(256, &d2h_ms);
  planes = false;
  double bulk = 3452160.0 / d2h_ms / 1e6; /* GB/s */
  /* an engine's saves, frames made on the device and on the host */
  const size_t nb = 160;
  setenv("OI_LOSSLESS_CODE", "rans", 1);
  double t_dev = engine_round("device", "device", nb, false, false),
         t_host = engine_round("host", "device", nb, false, false);
  unsetenv("OI_LOSSLESS_CODE");
  double lb = (double)nb * 4 * 589824;
  printf(
      "engine saves, %zu Qwen3-4B blocks, rANS: frames made on the device %.1f GB/s, on the host "
      "%.1f GB/s (logical, call to completion); bulk D2H %.1f GB/s: %.2fx and %.2fx\n",
      nb, lb / t_dev / 1e9, lb / t_host / 1e9, bulk, lb / t_dev / 1e9 / bulk,
      lb / t_host / 1e9 / bulk);
  double t_planes = engine_round("device", "device", nb, false, false); /* the default */
  printf("engine saves, %zu Qwen3-4B blocks, the planes code: frames made on the device %.1f GB/s "
         "(%.2fx bulk D2H)\n",
         nb, lb / t_planes / 1e9, lb / t_planes / 1e9 / bulk);
}

int main(int argc, char **argv) {
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) TEST_SKIP("no CUDA device");
  REQUIRE(argc >= 2);
  corpus = ct_read_file(argv[1], &corpus_len);
  REQUIRE(corpus && corpus_len);
  uint8_t secret[192];
  XXH3_generateSecret_fromSeed(secret, 0);
  CU(cudaMalloc((void **)&d_secret, sizeof secret));
  CU(cudaMemcpy(d_secret, secret, sizeof secret, cudaMemcpyHostToDevice));
  REQUIRE(oi__dev_open(0, &dev) == OI_OK);
  RUN_TEST(test_xxh3);
  RUN_TEST(test_frames);
  RUN_TEST(test_engine);
  if (argc >= 3 && strcmp(argv[2], "--rates") == 0) rates();
  oi__dev_close(dev);
  cudaFree(d_secret);
  free(corpus);
  TEST_EXIT();
}
