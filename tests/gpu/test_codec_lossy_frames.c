/* Lossy frames made on the GPU (kernels/codec_lossy.cu, the save path's
 * stream_encode) against the cpu's (lib/codec's oi__codec_encode), byte for
 * byte, for int8, int8-hadamard and fp8:
 *  - the committed real-KV corpus (argv[1]) tiled into Qwen3-4B blocks
 *    (72 parts x 16 tokens x 8 heads x 128), and into shapes of head_dim
 *    96 (int8-hadamard's transform 32 wide) and 64;
 *  - values at the edges: zeros (scale 0), bf16 subnormals (fp16
 *    subnormal scales; fp8's scale below 2^-128, divided by), ties of the
 *    rounding, the largest bf16 (int8's scale past fp16: refused, as the
 *    cpu refuses it), a NaN and an infinity (refused by every codec);
 *  every frame and the zeros behind it in its slot equal to the cpu's, and
 *  decoded by the cpu (checksum verified);
 *  - an engine's namespace of each codec over four arenas: saves made on
 *    the device leave the cpu's frames in the pool and load back as the
 *    cpu's round trip of the KV, decoded on the device and on the host; a
 *    block with a NaN is not stored (counted) and its neighbours are.
 * `--rates`: an engine's saves of 256 Qwen3-4B blocks, frames made on the
 * device and on the host, beside bulk D2H of the same bytes in the same
 * run. Skips (77) without a GPU. */
#define XXH_STATIC_LINKING_ONLY
#include <cuda_runtime.h>
#include <math.h>
#include <time.h>
#include <xxhash.h>

#include "../codec/codec_testutil.h"
#include "codec/codec.h"
#include "core/core.h"
#include "cu_check.h"
#include "kernels/kernels.h"
#include "rig.h"
#include "testutil.h"

static uint8_t *corpus;
static size_t corpus_len;
static uint8_t *d_secret;

static const int CODECS[] = {OI_CODEC_INT8, OI_CODEC_INT8_HADAMARD, OI_CODEC_FP8};

static void tile(uint8_t *dst, size_t bytes, size_t from) {
  for (size_t i = 0; i < bytes; i++)
    dst[i] = corpus[(from + i) % corpus_len];
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* How the blocks of a case are filled (block b of n). */
enum fill { CORPUS, ZEROS, SUBNORMAL, TIES, HUGE_VAL_BF16, ONE_NAN, ONE_INF };

static void fill_block(uint16_t *x, size_t elems, enum fill f, size_t b) {
  uint64_t seed = 7 + b;
  switch (f) {
  case CORPUS: tile((uint8_t *)x, elems * 2, 8192 + b * 65536); break;
  case ZEROS: memset(x, 0, elems * 2); break;
  case SUBNORMAL: /* bf16 subnormals and zeros, both signs */
    for (size_t i = 0; i < elems; i++)
      x[i] =
          (uint16_t)((ct_rand(&seed) & 0x8000u) | (ct_rand(&seed) % 4 ? ct_rand(&seed) & 0x7f : 0));
    break;
  case TIES: /* small integers and halves: y / scale lands on .5 often */
    for (size_t i = 0; i < elems; i++) {
      float v = (float)((int)(ct_rand(&seed) % 255) - 127) * 0.5f;
      uint32_t u;
      memcpy(&u, &v, 4);
      x[i] = (uint16_t)(u >> 16);
    }
    break;
  case HUGE_VAL_BF16: /* the corpus with the largest finite bf16 in it */
    tile((uint8_t *)x, elems * 2, 4096);
    x[elems / 3] = 0x7f7f;
    break;
  case ONE_NAN:
  case ONE_INF:
    tile((uint8_t *)x, elems * 2, 2048);
    x[elems / 2] = f == ONE_NAN ? 0x7fc0 : 0xff80;
    break;
  }
}

/* n blocks of shape sh under `codec` framed on the GPU; returns the blocks
 * whose slot differs from the cpu's frame and zeros (or whose refusal
 * differs). */
static size_t check_codec(int codec, const char *what, oi_codec_shape sh, size_t n, enum fill f) {
  size_t elems = (size_t)sh.parts * sh.tokens * sh.heads * sh.head_dim, bb = elems * 2;
  oi_lossy_gpu_plan p;
  REQUIRE(oi__lossy_gpu_plan(codec, &sh, bb, &p));
  uint64_t fb = (OI_CODEC_HEADER_BYTES + p.payload_bytes + 7) & ~7ull;
  fb += 64; /* a slot larger than the frame: the kernels zero the rest */
  uint16_t *blocks = malloc(n * bb);
  uint8_t *gpu = malloc(n * fb), *cpu = calloc(1, fb), *back = malloc(bb);
  int32_t *status = malloc(n * 4);
  REQUIRE(blocks && gpu && cpu && back && status);
  for (size_t b = 0; b < n; b++)
    fill_block(blocks + b * elems, elems, f, b);
  uint8_t *d_blocks = NULL, *d_frames = NULL, *d_work = NULL;
  int32_t *d_status = NULL;
  uint64_t items = (n * sizeof(oi_khash_item) + 255) & ~255ull;
  CU(cudaMalloc((void **)&d_blocks, n * bb));
  CU(cudaMalloc((void **)&d_frames, n * fb));
  CU(cudaMalloc((void **)&d_status, n * 4));
  CU(cudaMalloc((void **)&d_work, items + n * oi_klossy_scratch_bytes(p.payload_bytes)));
  CU(cudaMemcpy(d_blocks, blocks, n * bb, cudaMemcpyHostToDevice));
  CU(cudaMemset(d_frames, 0xa5, n * fb)); /* what the kernels must overwrite */
  CU(cudaMemset(d_status, 0x5a, n * 4));
  oi_klossy_args a = {.blocks = (uint64_t)(uintptr_t)d_blocks,
                      .frames = (uint64_t)(uintptr_t)d_frames,
                      .status = (uint64_t)(uintptr_t)d_status,
                      .items = (uint64_t)(uintptr_t)d_work,
                      .scratch = (uint64_t)(uintptr_t)d_work + items,
                      .secret = (uint64_t)(uintptr_t)d_secret,
                      .block_bytes = bb,
                      .frame_bytes = fb,
                      .seed = p.seed,
                      .n = (uint32_t)n,
                      .kind = codec == OI_CODEC_INT8  ? OI_KLOSSY_INT8
                              : codec == OI_CODEC_FP8 ? OI_KLOSSY_FP8
                                                      : OI_KLOSSY_INT8H,
                      .payload_bytes = p.payload_bytes,
                      .parts = p.parts,
                      .tokens = p.tokens,
                      .heads = p.heads,
                      .head_dim = p.head_dim,
                      .rot_block = p.rot_block,
                      .down = p.down};
  memcpy(a.header, p.header, sizeof a.header);
  CU((cudaError_t)oi_kernel_lossy_frames(&a, NULL));
  CU(cudaDeviceSynchronize());
  CU(cudaMemcpy(gpu, d_frames, n * fb, cudaMemcpyDeviceToHost));
  CU(cudaMemcpy(status, d_status, n * 4, cudaMemcpyDeviceToHost));
  size_t bad = 0, refused = 0;
  for (size_t b = 0; b < n; b++) {
    size_t out = 0, got = 0;
    memset(cpu, 0, fb);
    oi_status cst = oi__codec_encode(codec, &sh, blocks + b * elems, bb, cpu, fb, &out);
    bool same;
    if (cst != OI_OK) { /* the cpu refuses the block: so must the GPU */
      same = status[b] == OI_KENC_REFUSED;
      refused++;
    } else {
      same = status[b] == 0 && out == OI_CODEC_HEADER_BYTES + p.payload_bytes &&
             !memcmp(gpu + b * fb, cpu, fb) &&
             oi__codec_decode(gpu + b * fb, fb, back, bb, &got) == OI_OK && got == bb;
    }
    if (!same) {
      size_t at = 0;
      while (at < fb && gpu[b * fb + at] == cpu[at])
        at++;
      fprintf(stderr, "%s: block %zu: status %d, cpu %s (%zu bytes); first differing byte %zu\n",
              what, b, status[b], cst == OI_OK ? "framed it" : "refused it", out, at);
      bad++;
    }
  }
  printf("%-14s %-44s %2zu frames (%zu refused), %zu differ\n", oi__codec_name(codec), what, n,
         refused, bad);
  cudaFree(d_blocks);
  cudaFree(d_frames);
  cudaFree(d_status);
  cudaFree(d_work);
  free(blocks);
  free(gpu);
  free(cpu);
  free(back);
  free(status);
  return bad;
}

static void test_frames(void) {
  const oi_codec_shape qwen = {OI_CODEC_DTYPE_BF16, 72, 16, 8, 128};
  const oi_codec_shape d96 = {OI_CODEC_DTYPE_BF16, 4, 16, 3, 96};
  const oi_codec_shape d64 = {OI_CODEC_DTYPE_BF16, 6, 32, 2, 64};
  for (size_t c = 0; c < sizeof CODECS / sizeof CODECS[0]; c++) {
    int k = CODECS[c];
    CHECK(check_codec(k, "Qwen3-4B blocks, the corpus", qwen, 4, CORPUS) == 0);
    CHECK(check_codec(k, "head_dim 96, the corpus", d96, 3, CORPUS) == 0);
    CHECK(check_codec(k, "head_dim 64, the corpus", d64, 3, CORPUS) == 0);
    CHECK(check_codec(k, "zeros", d64, 2, ZEROS) == 0);
    CHECK(check_codec(k, "bf16 subnormals", d96, 2, SUBNORMAL) == 0);
    CHECK(check_codec(k, "halves (rounding ties)", d64, 2, TIES) == 0);
    CHECK(check_codec(k, "the largest bf16", d64, 2, HUGE_VAL_BF16) == 0);
    CHECK(check_codec(k, "a NaN", d96, 2, ONE_NAN) == 0);
    CHECK(check_codec(k, "an infinity", d96, 2, ONE_INF) == 0);
  }
  /* a shape the lossy codecs do not take: no plan */
  oi_lossy_gpu_plan p;
  oi_codec_shape odd = {OI_CODEC_DTYPE_BF16, 2, 16, 8, 0};
  CHECK(!oi__lossy_gpu_plan(OI_CODEC_INT8, &odd, 4096, &p));
  CHECK(strstr(oi_last_error(), "zero field") != NULL);
  CHECK(!oi__lossy_gpu_plan(OI_CODEC_LOSSLESS, &odd, 4096, &p));
  CHECK(strstr(oi_last_error(), "not a lossy codec") != NULL);
}

/* ---- the engine's saves ------------------------------------------------------------ */

#define ARENAS 4
#define LAYER_BYTES (2u * 16 * 8 * 128 * 2) /* K and V of 16 tokens x 8 heads x 128, bf16 */
#define BLOCK_BYTES (ARENAS * LAYER_BYTES)

typedef struct engine_rig {
  oi_host *host;
  oi_engine *eng;
  uint8_t *region; /* device: ARENAS arenas of n blocks */
  oi_arena_desc ad[ARENAS];
} engine_rig;

static void engine_open(engine_rig *r, int codec, size_t n) {
  oi_host_options ho = tr_host_options((uint64_t)n * BLOCK_BYTES + (64ull << 20));
  ho.device = 0;
  r->host = tr_host_new(&ho);
  CU(cudaMalloc((void **)&r->region, n * BLOCK_BYTES));
  tr_layers(r->ad, ARENAS, tr_layer_names, NULL, n, LAYER_BYTES);
  oi_engine_options eo = tr_engine_options(oi__codec_name(codec), r->ad, ARENAS);
  eo.device = 0;
  eo.arena_base = r->region;
  eo.arena_size = n * BLOCK_BYTES;
  eo.codec = oi__codec_name(codec);
  eo.codec_tokens = 16;
  eo.codec_heads = 8;
  eo.codec_head_dim = 128;
  r->eng = tr_engine_new(r->host, &eo);
}

static void engine_close(engine_rig *r) {
  oi_engine_destroy(r->eng);
  oi_host_destroy(r->host);
  cudaFree(r->region);
}

/* Block i as the arenas hold it (layer by layer), packed into out. */
static void block_of(const uint8_t *kv, size_t n, size_t i, uint8_t *out) {
  for (int a = 0; a < ARENAS; a++)
    memcpy(out + (size_t)a * LAYER_BYTES, kv + ((size_t)a * n + i) * LAYER_BYTES, LAYER_BYTES);
}

/* Saves n blocks with frames made where `encode` says and loads them back
 * decoded where `decode` says: each block as the cpu's round trip of it.
 * Block `nan_at` (< n) has a NaN: not stored (counted), the others are.
 * Returns the blocks that differ. */
static size_t engine_round(int codec, const char *encode, const char *decode, size_t n,
                           size_t nan_at) {
  setenv("OI_CODEC_ENCODE", encode, 1);
  setenv("OI_CODEC_DECODE", decode, 1);
  engine_rig r;
  engine_open(&r, codec, n);
  size_t region = n * BLOCK_BYTES;
  uint8_t *kv = malloc(region), *back = malloc(region), *blk = malloc(BLOCK_BYTES),
          *want = malloc(BLOCK_BYTES), *frame = malloc(2 * BLOCK_BYTES);
  int64_t *ids = malloc(n * sizeof *ids);
  oi_block_hash *hs = malloc(n * sizeof *hs);
  REQUIRE(kv && back && blk && want && frame && ids && hs);
  tile(kv, region, 12345 * 2);
  if (nan_at < n) {
    uint16_t nan = 0x7fc0;
    memcpy(kv + ((size_t)2 * n + nan_at) * LAYER_BYTES + 1000, &nan, 2); /* in layer 2 */
  }
  for (size_t i = 0; i < n; i++) {
    ids[i] = (int64_t)i;
    hs[i] = tr_hash(i, 17, (uint8_t)(0x40 + codec));
  }
  CU(cudaMemcpy(r.region, kv, region, cudaMemcpyHostToDevice));
  CHECK_OK(tr_save(r.eng, ids, hs, n, 60000));
  oi_query_result q;
  CHECK_OK(tr_query(r.eng, "r", hs, n, 0, NULL, &q));
  CHECK(q.hit_blocks == (nan_at < n ? nan_at : n)); /* hits are a prefix */
  size_t bad = 0;
  if (q.hit_blocks) {
    CU(cudaMemset(r.region, 0x33, region));
    CHECK_OK(tr_load(r.eng, q.lease, ids, q.hit_blocks, 60000));
    CU(cudaMemcpy(back, r.region, region, cudaMemcpyDeviceToHost));
    oi_codec_shape sh = {OI_CODEC_DTYPE_BF16, 2 * ARENAS, 16, 8, 128};
    for (size_t i = 0; i < q.hit_blocks; i++) {
      size_t fl = 0, got = 0;
      block_of(kv, n, i, blk);
      REQUIRE(oi__codec_encode(codec, &sh, blk, BLOCK_BYTES, frame, 2 * BLOCK_BYTES, &fl) == OI_OK);
      REQUIRE(oi__codec_decode(frame, fl, want, BLOCK_BYTES, &got) == OI_OK);
      block_of(back, n, i, blk);
      bad += memcmp(blk, want, BLOCK_BYTES) != 0;
    }
  }
  if (nan_at < n) { /* the blocks after it were stored */
    CHECK_OK(tr_query(r.eng, "r2", hs + nan_at + 1, n - nan_at - 1, 0, NULL, &q));
    CHECK(q.hit_blocks == n - nan_at - 1);
    if (q.hit_blocks) oi_engine_release(r.eng, q.lease);
    CHECK(tr_engine_stats(r.eng).saves_not_encoded == 1);
  }
  printf("%-14s engine saves, encode %-6s decode %-6s %3zu blocks%s: %zu differ\n",
         oi__codec_name(codec), encode, decode, n, nan_at < n ? " (one with a NaN)" : "", bad);
  engine_close(&r);
  free(kv);
  free(back);
  free(blk);
  free(want);
  free(frame);
  free(ids);
  free(hs);
  unsetenv("OI_CODEC_ENCODE");
  unsetenv("OI_CODEC_DECODE");
  return bad;
}

static void test_engine(void) {
  for (size_t c = 0; c < sizeof CODECS / sizeof CODECS[0]; c++) {
    CHECK(engine_round(CODECS[c], "device", "device", 40, SIZE_MAX) == 0);
    CHECK(engine_round(CODECS[c], "device", "host", 40, SIZE_MAX) == 0);
    CHECK(engine_round(CODECS[c], "device", "device", 12, 5) == 0);
  }
}

/* The best save rate of n blocks over five rounds, frames made where
 * `encode` says, in logical GB/s; *bulk: the best D2H of the same bytes in
 * one copy, between the rounds. */
static double save_gbps(int codec, const char *encode, size_t n, double *bulk) {
  setenv("OI_CODEC_ENCODE", encode, 1);
  engine_rig r;
  engine_open(&r, codec, n);
  size_t region = n * BLOCK_BYTES;
  uint8_t *kv = malloc(region), *pinned = NULL;
  int64_t *ids = malloc(n * sizeof *ids);
  oi_block_hash *hs = malloc(n * sizeof *hs);
  REQUIRE(kv && ids && hs);
  tile(kv, region, 0);
  CU(cudaMemcpy(r.region, kv, region, cudaMemcpyHostToDevice));
  CU(cudaMallocHost((void **)&pinned, region));
  double best = 0, best_bulk = 0;
  for (int rep = 0; rep < 5; rep++) {
    oi_host_evict_all(r.host, NULL);
    for (size_t i = 0; i < n; i++) {
      ids[i] = (int64_t)i;
      hs[i] = tr_hash(i, 18, (uint8_t)(rep + 1));
    }
    double t0 = now_s();
    CHECK_OK(tr_save(r.eng, ids, hs, n, 60000));
    double gbps = (double)region / (now_s() - t0) / 1e9;
    best = gbps > best ? gbps : best;
    t0 = now_s();
    CU(cudaMemcpy(pinned, r.region, region, cudaMemcpyDeviceToHost));
    gbps = (double)region / (now_s() - t0) / 1e9;
    best_bulk = gbps > best_bulk ? gbps : best_bulk;
  }
  CHECK(tr_engine_stats(r.eng).saves_not_encoded == 0);
  *bulk = best_bulk;
  engine_close(&r);
  cudaFreeHost(pinned);
  free(kv);
  free(ids);
  free(hs);
  unsetenv("OI_CODEC_ENCODE");
  return best;
}

static void rates(void) {
  for (size_t c = 0; c < sizeof CODECS / sizeof CODECS[0]; c++) {
    double bulk_dev = 0, bulk_host = 0;
    double dev_rate = save_gbps(CODECS[c], "device", 256, &bulk_dev);
    double host_rate = save_gbps(CODECS[c], "host", 256, &bulk_host);
    printf("%-14s engine saves, 256 blocks of %u B: frames on the device %.1f GB/s (%.2fx bulk "
           "D2H %.1f), on the host %.1f GB/s (%.2fx bulk %.1f)\n",
           oi__codec_name(CODECS[c]), BLOCK_BYTES, dev_rate, dev_rate / bulk_dev, bulk_dev,
           host_rate, host_rate / bulk_host, bulk_host);
  }
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
  RUN_TEST(test_frames);
  RUN_TEST(test_engine);
  if (argc >= 3 && strcmp(argv[2], "--rates") == 0) rates();
  cudaFree(d_secret);
  free(corpus);
  TEST_EXIT();
}
