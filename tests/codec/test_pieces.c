/* A frame cut into pieces (oi__codec_pieces, what the GPU decoder
 * launches): decoding each piece on its own, in any order, into its
 * offsets gives the bytes oi__codec_decode gives, for every codec, on the
 * real-KV corpus (argv[1]), blocks of model size (the encoder's stream cap),
 * random bytes (exponents raw), odd lengths; damaged frames and short piece
 * arrays are refused with their status. Runs without a GPU: the GPU's own
 * decoder is tests/gpu/test_codec_kernels. */
#include <string.h>
#include <xxhash.h>

#include "codec_testutil.h"
#include "core/core.h"
#include "testutil.h"

static uint8_t *corpus;
static size_t corpus_len;

/* The pieces of frame f decoded one by one, last first, into dst. */
static bool decode_by_pieces(const uint8_t *f, size_t len, uint8_t *dst, size_t cap,
                             size_t *npieces) {
  oi_codec_info in;
  oi_codec_piece pc[4096];
  size_t n = 0;
  if (oi__codec_pieces(f, len, true, &in, pc, OI_ARRAY_LEN(pc), &n) != OI_OK) return false;
  REQUIRE(in.logical_bytes <= cap);
  *npieces = n;
  for (size_t k = n; k-- > 0;)
    if (ct_decode_piece(f, &pc[k], dst, in.logical_bytes) != 0) return false;
  return true;
}

static bool planes; /* lossless frames of the planes code */

/* Encodes src (len bytes) with codec and shape, then checks the pieces
 * against the frame's decode; returns the pieces. */
static size_t check_block(int codec, const oi_codec_shape *sh, const uint8_t *src, size_t len,
                          const char *what) {
  size_t cap = oi__codec_bound(codec, sh, len), fb = 0, ob = 0, n = 0;
  uint8_t *f = malloc(cap), *a = malloc(len + 1), *b = malloc(len + 1);
  REQUIRE(f && a && b);
  if (planes && codec == OI_CODEC_LOSSLESS)
    CHECK_OK(oi__codec_encode_planes(sh, src, len, f, cap, &fb));
  else
    CHECK_OK(oi__codec_encode(codec, sh, src, len, f, cap, &fb));
  CHECK_OK(oi__codec_decode(f, fb, a, len, &ob));
  memset(b, 0x5a, len);
  bool ok = decode_by_pieces(f, fb, b, len, &n);
  if (!ok || ob != len || memcmp(a, b, len) != 0) {
    fprintf(stderr, "%s: pieces decode %s\n", what, ok ? "to other bytes" : "failed");
    oi_test_failures++;
  }
  free(f);
  free(a);
  free(b);
  return n;
}

static void test_corpus_pages(void) {
  oi_codec_shape kv = CORPUS_SHAPE_KV;
  size_t pages = corpus_len / CORPUS_PAGE_BYTES;
  for (int c = OI_CODEC_LOSSLESS; c < OI_CODEC_COUNT; c++)
    for (size_t i = 0; i < pages; i++) {
      size_t n = check_block(c, &kv, corpus + i * CORPUS_PAGE_BYTES, CORPUS_PAGE_BYTES, "page");
      CHECK(n == (c == OI_CODEC_LOSSLESS ? 2u : 1u) || (c == OI_CODEC_LOSSLESS && n == 1));
    }
}

/* A model-sized block with no shape: many wide streams, none past the cap;
 * the ratio stays within 1 % of the same bytes as corpus pages (a table per
 * part, narrow streams: their states cost 112 bytes less each). */
static void test_stream_cap(void) {
  size_t len = 3452160; /* a GLM5.2 block */
  uint8_t *src = malloc(len);
  REQUIRE(src);
  for (size_t i = 0; i < len; i++)
    src[i] = corpus[i % corpus_len];
  oi_codec_shape none = {.dtype = OI_CODEC_DTYPE_BF16};
  size_t n = check_block(OI_CODEC_LOSSLESS, &none, src, len, "GLM5.2-sized block");
  CHECK(n >= len / 2 / OI_LOSSLESS_SEGMENT_MAX);
  size_t cap = oi__codec_bound(OI_CODEC_LOSSLESS, &none, len), fb = 0, k = 0;
  uint8_t *f = malloc(cap);
  REQUIRE(f);
  CHECK_OK(oi__codec_encode(OI_CODEC_LOSSLESS, &none, src, len, f, cap, &fb));
  oi_codec_info in;
  oi_codec_piece *pc = calloc(4096, sizeof *pc);
  REQUIRE(pc);
  CHECK_OK(oi__codec_pieces(f, fb, true, &in, pc, 4096, &k));
  for (size_t i = 0; i < k; i++)
    CHECK(pc[i].kind == OI_CODEC_PIECE_RANS32 && pc[i].count <= OI_LOSSLESS_SEGMENT_MAX);
  /* the same bytes as 281 corpus-page-sized blocks, one stream per part */
  size_t pages_fb = 0;
  oi_codec_shape kv = CORPUS_SHAPE_KV;
  uint8_t pf[2 * CORPUS_PAGE_BYTES];
  for (size_t p = 0; p + CORPUS_PAGE_BYTES <= len; p += CORPUS_PAGE_BYTES) {
    size_t b = 0;
    CHECK_OK(
        oi__codec_encode(OI_CODEC_LOSSLESS, &kv, src + p, CORPUS_PAGE_BYTES, pf, sizeof pf, &b));
    pages_fb += b;
  }
  double whole = (double)len / (double)fb,
         paged = (double)(len / CORPUS_PAGE_BYTES * CORPUS_PAGE_BYTES) / (double)pages_fb;
  printf("GLM5.2-sized block: %zu streams, ratio %.4f (as 12 KiB pages: %.4f)\n", k, whole, paged);
  CHECK(whole >= 1.40 && whole > paged * 0.99);
  free(pc);
  free(f);
  free(src);
}

/* The planes code's frames: a piece a stream (each at most the cap), on
 * every corpus page, a GLM5.2-sized block and odd lengths. */
static void test_planes_pieces(void) {
  planes = true;
  oi_codec_shape kv = CORPUS_SHAPE_KV, none = {.dtype = OI_CODEC_DTYPE_BF16};
  for (size_t i = 0; i < corpus_len / CORPUS_PAGE_BYTES; i++)
    CHECK(check_block(OI_CODEC_LOSSLESS, &kv, corpus + i * CORPUS_PAGE_BYTES, CORPUS_PAGE_BYTES,
                      "planes page") <= 2);
  size_t len = 3452160;
  uint8_t *src = malloc(len), *f = malloc(oi__codec_bound(OI_CODEC_LOSSLESS, &none, len));
  REQUIRE(src && f);
  for (size_t i = 0; i < len; i++)
    src[i] = corpus[i % corpus_len];
  size_t n = check_block(OI_CODEC_LOSSLESS, &none, src, len, "planes, GLM5.2-sized block");
  check_block(OI_CODEC_LOSSLESS, &none, corpus, 12289, "planes, odd length");
  size_t fb = 0, k = 0;
  CHECK_OK(oi__codec_encode_planes(&none, src, len, f,
                                   oi__codec_bound(OI_CODEC_LOSSLESS, &none, len), &fb));
  oi_codec_info in;
  oi_codec_piece *pc = calloc(4096, sizeof *pc);
  REQUIRE(pc);
  CHECK_OK(oi__codec_pieces(f, fb, true, &in, pc, 4096, &k));
  CHECK(k == n && k >= len / 2 / OI_LOSSLESS_SEGMENT_MAX);
  for (size_t i = 0; i < k; i++)
    CHECK(pc[i].kind == OI_CODEC_PIECE_PLANES && pc[i].count <= OI_LOSSLESS_SEGMENT_MAX);
  printf("planes, GLM5.2-sized block: %zu streams, ratio %.4f\n", k, (double)len / (double)fb);
  planes = false;
  free(pc);
  free(f);
  free(src);
}

static void test_raw_odd_and_refusals(void) {
  uint64_t seed = 11;
  size_t len = 100001;
  uint8_t *src = malloc(len);
  REQUIRE(src);
  for (size_t i = 0; i < len; i++)
    src[i] = (uint8_t)ct_rand(&seed);
  oi_codec_shape none = {.dtype = OI_CODEC_DTYPE_BYTES};
  /* random: exponents raw, in pieces of at most the cap, and the odd byte */
  size_t n = check_block(OI_CODEC_LOSSLESS, &none, src, len, "random, odd length");
  CHECK(n == (len / 2 + OI_LOSSLESS_SEGMENT_MAX - 1) / OI_LOSSLESS_SEGMENT_MAX + 1);
  check_block(OI_CODEC_LOSSLESS, &none, corpus, 12289, "corpus, odd length");
  check_block(OI_CODEC_LOSSLESS, &none, corpus, 2, "one element");
  /* refusals */
  size_t cap = oi__codec_bound(OI_CODEC_LOSSLESS, &none, CORPUS_PAGE_BYTES), fb = 0, k = 0;
  uint8_t *f = malloc(cap);
  REQUIRE(f);
  oi_codec_shape kv = CORPUS_SHAPE_KV;
  CHECK_OK(oi__codec_encode(OI_CODEC_LOSSLESS, &kv, corpus, CORPUS_PAGE_BYTES, f, cap, &fb));
  oi_codec_info in;
  oi_codec_piece pc[4];
  CHECK_ST(oi__codec_pieces(f, fb, true, &in, pc, 1, &k), OI_ERR_INVALID_ARGUMENT);
  CHECK(strstr(oi_last_error(), "the frame needs 2") != NULL);
  CHECK_ST(oi__codec_pieces(f, fb, true, &in, NULL, 4, &k), OI_ERR_INVALID_ARGUMENT);
  CHECK_ST(oi__codec_pieces(f, fb, true, NULL, pc, 4, &k), OI_ERR_INVALID_ARGUMENT);
  CHECK_ST(oi__codec_pieces(f, fb - 1, true, &in, pc, 4, &k), OI_ERR_PROTOCOL);
  f[fb - 1] ^= 1; /* the sign+mantissa plane: only the checksum tells */
  CHECK_ST(oi__codec_pieces(f, fb, true, &in, pc, 4, &k), OI_ERR_PROTOCOL);
  CHECK(strstr(oi_last_error(), "checksum") != NULL);
  /* unverified (the GPU path's): the checksum is not read, the rest is */
  CHECK_OK(oi__codec_pieces(f, fb, false, &in, pc, 4, &k));
  CHECK(k == 2 && pc[0].kind == OI_CODEC_PIECE_RANS);
  CHECK_ST(oi__codec_pieces(f, fb - 1, false, &in, pc, 4, &k), OI_ERR_PROTOCOL);
  f[0] ^= 1;
  CHECK_ST(oi__codec_pieces(f, fb, false, &in, pc, 4, &k), OI_ERR_PROTOCOL);
  free(f);
  free(src);
}

/* What a GPU needs to make the cpu's lossless frames
 * (oi__lossless_gpu_plan): for model-sized blocks of the corpus, the
 * encoder's frame has one of the plan's two stream counts, each stream
 * within the plan's room, the plan's header but for the payload length,
 * and a data checksum the plan's secret reproduces; blocks whose streams
 * would not be wide are refused, saying why. */
static void test_gpu_plan(void) {
  static const struct {
    uint64_t bytes;
    uint16_t parts, tokens, heads, head_dim;
  } cases[] = {{3452160, 58, 16, 1, 1860},
               {2359296, 72, 16, 8, 128},
               {2359296, 0, 0, 0, 0},
               {1179648, 2, 16, 8, 288}};
  for (size_t c = 0; c < OI_ARRAY_LEN(cases); c++) {
    uint64_t bb = cases[c].bytes;
    oi_codec_shape sh = {.dtype = OI_CODEC_DTYPE_BF16,
                         .parts = cases[c].parts,
                         .tokens = cases[c].tokens,
                         .heads = cases[c].heads,
                         .head_dim = cases[c].head_dim};
    oi_lossless_gpu_plan p;
    REQUIRE(oi__lossless_gpu_plan(&sh, bb, &p));
    CHECK(p.segs_whole >= 1 && p.max_segs >= p.segs_whole && p.max_segs >= p.segs_parts);
    CHECK(p.parts == (sh.parts > 1 ? sh.parts : 0u));
    uint8_t *block = malloc(bb), *frame = malloc(bb + 64);
    REQUIRE(block && frame);
    for (size_t i = 0; i < bb; i++)
      block[i] = corpus[(i + 4096 * c) % corpus_len];
    size_t out = 0;
    REQUIRE(oi__codec_encode(OI_CODEC_LOSSLESS, &sh, block, bb, frame, bb + 64, &out) == OI_OK);
    const uint8_t *pl = frame + OI_CODEC_HEADER_BYTES;
    uint32_t segs = (uint32_t)(pl[1] | pl[2] << 8);
    CHECK(pl[0] == 2);
    CHECK(segs == p.segs_whole || segs == p.segs_parts);
    for (uint32_t k = 0; k < segs; k++) {
      const uint8_t *l = pl + 3 + 4 * k;
      CHECK((uint32_t)(l[0] | l[1] << 8 | l[2] << 16 | (uint32_t)l[3] << 24) <= p.stream_cap);
    }
    CHECK(!memcmp(frame, p.header, 12) && !memcmp(frame + 16, p.header + 16, 8));
    CHECK(!memcmp(p.header + 12, "\0\0\0\0", 4));
    uint64_t data_xxh = 0;
    memcpy(&data_xxh, frame + 24, 8);
    CHECK(XXH3_64bits_withSecret(block, bb, p.secret, sizeof p.secret) == data_xxh);
    free(block);
    free(frame);
  }
  oi_lossless_gpu_plan p;
  oi_codec_shape none = {.dtype = OI_CODEC_DTYPE_BF16};
  CHECK(!oi__lossless_gpu_plan(&none, 12288, &p));
  CHECK(strstr(oi_last_error(), "no wide streams") != NULL);
  CHECK(!oi__lossless_gpu_plan(&none, 2359298, &p)); /* not a multiple of 8 */
  oi_codec_shape small = {.dtype = OI_CODEC_DTYPE_BF16,
                          .parts = 288,
                          .tokens = 16,
                          .heads = 2,
                          .head_dim = 128}; /* parts of 4,096 exponents */
  CHECK(!oi__lossless_gpu_plan(&small, 2359296, &p));
  CHECK(strstr(oi_last_error(), "fewer than 8192") != NULL);
  CHECK(!oi__lossless_gpu_plan(&none, 2359296, NULL));
  oi_codec_shape odd = {.dtype = 7};
  CHECK(!oi__lossless_gpu_plan(&odd, 2359296, &p) && strstr(oi_last_error(), "dtype 7"));
  CHECK(!oi__lossless_gpu_plan(&none, OI_CODEC_MAX_BYTES + 8, &p));
  /* too many streams or parts for one launch's tables (sizes only: nothing is encoded) */
  oi_codec_shape many = {.dtype = OI_CODEC_DTYPE_BF16,
                         .parts = 1100,
                         .tokens = 16,
                         .heads = 4,
                         .head_dim = 128}; /* parts of 8,192 exponents */
  CHECK(!oi__lossless_gpu_plan(&many, (size_t)1100 * 16384, &p));
  CHECK(strstr(oi_last_error(), "past 1024") != NULL);
  CHECK(!oi__lossless_gpu_plan(&none, (size_t)1100 * 65536, &p)); /* 1,100 streams of 32,768 */
  CHECK(strstr(oi_last_error(), "past 1024") != NULL);
}

/* What a GPU needs to make the cpu's lossy frames (oi__lossy_gpu_plan): for
 * each lossy codec and a few shapes, the plan's header is the frame's first
 * 24 bytes, its seed the XXH3-64 of the first 32 (so the frame's checksum
 * is the payload's seeded with it), its payload length the frame's; the
 * transform's width and scaling are int8-hadamard's; codecs and shapes the
 * lossy codecs do not take are refused, saying why. */
static void test_lossy_gpu_plan(void) {
  static const oi_codec_shape shapes[] = {{OI_CODEC_DTYPE_BF16, 2, 16, 3, 64},
                                          {OI_CODEC_DTYPE_BF16, 4, 16, 2, 96},
                                          {OI_CODEC_DTYPE_BF16, 2, 8, 1, 576}};
  static const int codecs[] = {OI_CODEC_INT8, OI_CODEC_INT8_HADAMARD, OI_CODEC_FP8};
  for (size_t s = 0; s < OI_ARRAY_LEN(shapes); s++)
    for (size_t c = 0; c < OI_ARRAY_LEN(codecs); c++) {
      const oi_codec_shape *sh = &shapes[s];
      size_t elems = (size_t)sh->parts * sh->tokens * sh->heads * sh->head_dim, bb = 2 * elems;
      oi_lossy_gpu_plan p;
      REQUIRE(oi__lossy_gpu_plan(codecs[c], sh, bb, &p));
      uint8_t *block = malloc(bb), *frame = malloc(2 * bb + 64);
      REQUIRE(block && frame);
      for (size_t i = 0; i < bb; i++)
        block[i] = corpus[(i + 8192 * s) % corpus_len];
      size_t out = 0;
      REQUIRE(oi__codec_encode(codecs[c], sh, block, bb, frame, 2 * bb + 64, &out) == OI_OK);
      CHECK(out == OI_CODEC_HEADER_BYTES + p.payload_bytes);
      CHECK(!memcmp(frame, p.header, 24) && !memcmp(frame + 24, "\0\0\0\0\0\0\0\0", 8));
      CHECK(XXH3_64bits(frame, 32) == p.seed);
      uint64_t frame_xxh = 0;
      memcpy(&frame_xxh, frame + 32, 8);
      CHECK(XXH3_64bits_withSecret(frame + OI_CODEC_HEADER_BYTES, p.payload_bytes, p.secret,
                                   sizeof p.secret) ==
            XXH3_64bits(frame + OI_CODEC_HEADER_BYTES, p.payload_bytes));
      CHECK(XXH3_64bits_withSeed(frame + OI_CODEC_HEADER_BYTES, p.payload_bytes, p.seed) ==
            frame_xxh);
      CHECK(p.parts == sh->parts && p.tokens == sh->tokens && p.heads == sh->heads &&
            p.head_dim == sh->head_dim);
      if (codecs[c] == OI_CODEC_INT8_HADAMARD) {
        unsigned want = sh->head_dim == 64 ? 64 : sh->head_dim == 96 ? 32 : 64; /* 576 = 9 x 64 */
        CHECK(p.rot_block == want);
        CHECK(p.down == (want == 64 ? 0.125f : 0.25f)); /* 2^-floor(log2(b) / 2) */
      } else {
        CHECK(p.rot_block == 1 && p.down == 1.0f);
      }
      free(block);
      free(frame);
    }
  oi_lossy_gpu_plan p;
  const oi_codec_shape qwen = {OI_CODEC_DTYPE_BF16, 72, 16, 8, 128};
  CHECK(!oi__lossy_gpu_plan(OI_CODEC_INT8, &qwen, 2359296, NULL));
  CHECK(strstr(oi_last_error(), "NULL plan") != NULL);
  CHECK(!oi__lossy_gpu_plan(OI_CODEC_LOSSLESS, &qwen, 2359296, &p));
  CHECK(strstr(oi_last_error(), "not a lossy codec") != NULL);
  CHECK(!oi__lossy_gpu_plan(OI_CODEC_INT8, &qwen, 2359296 + 2, &p)); /* not the shape's bytes */
  CHECK(strstr(oi_last_error(), "is 2359296 bytes of bf16") != NULL);
  CHECK(!oi__lossy_gpu_plan(OI_CODEC_FP8, NULL, 2359296, &p));
  CHECK(strstr(oi_last_error(), "needs the block's shape") != NULL);
}

int main(int argc, char **argv) {
  REQUIRE(argc >= 2);
  corpus = ct_read_file(argv[1], &corpus_len);
  REQUIRE(corpus && corpus_len % CORPUS_PAGE_BYTES == 0);
  RUN_TEST(test_corpus_pages);
  RUN_TEST(test_stream_cap);
  RUN_TEST(test_planes_pieces);
  RUN_TEST(test_raw_odd_and_refusals);
  RUN_TEST(test_gpu_plan);
  RUN_TEST(test_lossy_gpu_plan);
  free(corpus);
  TEST_EXIT();
}
