/* The GPU decoder of the codec frames (kernels/codec.cu) against the cpu's
 * (lib/codec): every frame decoded on the GPU must give the bytes
 * oi__codec_decode gives, byte for byte, for every codec:
 *  - each page of the committed real-KV corpus (argv[1]), each codec;
 *  - blocks of 64 pages (one stream per part) and blocks of Qwen3-4B and
 *    GLM5.2 size (the lossless encoder caps its streams so a warp each
 *    spreads a large block over the GPU; they are wide streams), and wide
 *    streams damaged past the checksum (a zeroed state, a changed word);
 *  - random bytes (exponents stored raw) and an odd-length block;
 *  - damaged frames (final states, a scale, an fp8 NaN code): the frame's
 *    status says so and the batch's other frames still decode exactly.
 * Then the rates, in logical bytes, beside a bulk H2D copy of the same
 * blocks in the same run: the decode kernel alone, and the frames' H2D with
 * the decode behind it, block by block on two streams (what a restore of
 * compressed blocks costs against the link). Skips (77) without a GPU. */
#include <cuda_runtime.h>
#include <time.h>

#include "../codec/codec_testutil.h"
#include "codec/codec.h"
#include "core/core.h"
#include "cu_check.h"
#include "kernels/kernels.h"
#include "testutil.h"

static uint8_t *corpus;
static size_t corpus_len;

/* A batch of frames in one device buffer, their blocks in another. */
typedef struct batch {
  size_t n, frame_total, logical_total;
  uint8_t *frames; /* host, concatenated (each at a multiple of 256) */
  size_t *frame_off, *frame_len, *block_off, *block_len;
  oi_kdec_item *items; /* host */
  size_t nitems;
  uint64_t max_lossy;
  unsigned lossless; /* the lossless kernels to run (oi_kdec_lossless_kernel) */
  int unverified;    /* planned without the frames' checksums (the load path's way) */
} batch;

static void batch_free(batch *b) {
  free(b->frames);
  free(b->frame_off);
  free(b->frame_len);
  free(b->block_off);
  free(b->block_len);
  free(b->items);
  memset(b, 0, sizeof *b);
}

static bool planes; /* lossless frames of the planes code (format 4) */

/* Encodes each block of `blocks` (n of `len` bytes at src + i * len) into
 * the batch. */
static void batch_encode(batch *b, int codec, const oi_codec_shape *sh, const uint8_t *src,
                         size_t n, size_t len) {
  memset(b, 0, sizeof *b);
  b->n = n;
  size_t bound = oi__codec_bound(codec, sh, len);
  REQUIRE(bound);
  size_t stride = (bound + 255) & ~(size_t)255;
  b->frames = calloc(n, stride);
  b->frame_off = calloc(n, sizeof(size_t));
  b->frame_len = calloc(n, sizeof(size_t));
  b->block_off = calloc(n, sizeof(size_t));
  b->block_len = calloc(n, sizeof(size_t));
  REQUIRE(b->frames && b->frame_off && b->frame_len && b->block_off && b->block_len);
  for (size_t i = 0; i < n; i++) {
    b->frame_off[i] = i * stride;
    b->block_off[i] = b->logical_total;
    b->block_len[i] = len;
    size_t fb = 0;
    oi_status st =
        planes && codec == OI_CODEC_LOSSLESS
            ? oi__codec_encode_planes(sh, src + i * len, len, b->frames + i * stride, stride, &fb)
            : oi__codec_encode(codec, sh, src + i * len, len, b->frames + i * stride, stride, &fb);
    if (st) fprintf(stderr, "encode: %s\n", oi_last_error());
    REQUIRE(st == OI_OK);
    b->frame_len[i] = fb;
    b->logical_total += (len + 255) & ~(size_t)255;
  }
  b->frame_total = n * stride;
}

/* Cuts the frames into kernel items for frames at dev_frames and blocks at
 * dev_blocks (the host frames are verified here, as a load does). */
static void batch_plan(batch *b, uint64_t dev_frames, uint64_t dev_blocks) {
  free(b->items);
  size_t cap = 0;
  for (size_t i = 0; i < b->n; i++) {
    oi_codec_info in;
    REQUIRE(oi__codec_header_of(b->frames + b->frame_off[i], b->frame_len[i], &in) == OI_OK);
    cap += oi__codec_pieces_max(&in, b->frames + b->frame_off[i]);
  }
  b->items = calloc(cap, sizeof *b->items);
  oi_codec_piece *pc = calloc(cap, sizeof *pc);
  REQUIRE(b->items && pc);
  b->nitems = 0;
  b->max_lossy = 0;
  b->lossless = 0;
  for (size_t i = 0; i < b->n; i++) {
    oi_codec_info in;
    size_t k = 0;
    oi_status st = oi__codec_pieces(b->frames + b->frame_off[i], b->frame_len[i], !b->unverified,
                                    &in, pc, cap - b->nitems, &k);
    if (st) fprintf(stderr, "pieces: %s\n", oi_last_error());
    REQUIRE(st == OI_OK);
    for (size_t j = 0; j < k; j++) {
      const oi_codec_piece *p = &pc[j];
      uint64_t f = dev_frames + b->frame_off[i], d = dev_blocks + b->block_off[i];
      b->items[b->nitems++] = (oi_kdec_item){.src = f + p->src,
                                             .aux = f + p->aux,
                                             .dst = d + p->dst,
                                             .len = p->len,
                                             .count = p->count,
                                             .frame = (uint32_t)i,
                                             .kind = (uint16_t)p->kind,
                                             .tokens = p->tokens,
                                             .heads = p->heads,
                                             .head_dim = p->head_dim};
      if (p->kind == OI_CODEC_PIECE_INT8 || p->kind == OI_CODEC_PIECE_INT8H)
        b->max_lossy = OI_MAX(b->max_lossy, (uint64_t)p->count * p->head_dim);
      else if (p->kind == OI_CODEC_PIECE_FP8)
        b->max_lossy =
            OI_MAX(b->max_lossy, (uint64_t)p->count * p->tokens * p->heads * p->head_dim);
      b->lossless |= oi_kdec_lossless_kernel(p->kind);
    }
  }
  free(pc);
}

/* Decodes the batch on the GPU; *statuses gets each frame's status. Returns
 * the decoded blocks (host, block_off layout). */
static uint8_t *gpu_decode(batch *b, int32_t *statuses) {
  uint8_t *df = NULL, *db = NULL;
  oi_kdec_item *di = NULL;
  int32_t *ds = NULL;
  CU(cudaMalloc((void **)&df, b->frame_total));
  CU(cudaMalloc((void **)&db, b->logical_total));
  CU(cudaMemset(db, 0xa5, b->logical_total));
  CU(cudaMemcpy(df, b->frames, b->frame_total, cudaMemcpyHostToDevice));
  batch_plan(b, (uint64_t)(uintptr_t)df, (uint64_t)(uintptr_t)db);
  CU(cudaMalloc((void **)&di, b->nitems * sizeof *di));
  CU(cudaMalloc((void **)&ds, b->n * sizeof *ds));
  CU(cudaMemset(ds, 0, b->n * sizeof *ds));
  CU(cudaMemcpy(di, b->items, b->nitems * sizeof *di, cudaMemcpyHostToDevice));
  CU((cudaError_t)oi_kernel_codec_decode(di, (uint32_t)b->nitems, b->lossless, b->max_lossy, ds,
                                         NULL));
  CU(cudaDeviceSynchronize());
  uint8_t *out = malloc(b->logical_total);
  REQUIRE(out);
  CU(cudaMemcpy(out, db, b->logical_total, cudaMemcpyDeviceToHost));
  CU(cudaMemcpy(statuses, ds, b->n * sizeof *ds, cudaMemcpyDeviceToHost));
  cudaFree(df);
  cudaFree(db);
  cudaFree(di);
  cudaFree(ds);
  return out;
}

/* GPU against cpu for every frame of the batch; frames in `damaged` (a
 * bitmap, may be NULL) must fail with status `want_bad`, the others decode
 * exactly. Returns the frames that differ. */
static size_t check_batch(batch *b, const char *what, const uint8_t *damaged, int32_t want_bad) {
  int32_t *stt = calloc(b->n, sizeof *stt);
  REQUIRE(stt);
  uint8_t *gpu = gpu_decode(b, stt);
  size_t bad = 0, cap = 0;
  for (size_t i = 0; i < b->n; i++)
    cap = OI_MAX(cap, b->block_len[i]);
  uint8_t *cpu = malloc(cap);
  REQUIRE(cpu);
  for (size_t i = 0; i < b->n; i++) {
    if (damaged && damaged[i]) {
      if (stt[i] != want_bad) {
        fprintf(stderr, "%s: damaged frame %zu: status %d, want %d\n", what, i, stt[i], want_bad);
        bad++;
      }
      continue;
    }
    size_t ob = 0;
    REQUIRE(oi__codec_decode(b->frames + b->frame_off[i], b->frame_len[i], cpu, cap, &ob) == OI_OK);
    if (stt[i] != 0 || ob != b->block_len[i] || memcmp(cpu, gpu + b->block_off[i], ob) != 0) {
      size_t at = 0;
      while (at < ob && cpu[at] == gpu[b->block_off[i] + at])
        at++;
      fprintf(stderr, "%s: frame %zu: status %d, first differing byte %zu of %zu\n", what, i,
              stt[i], at, ob);
      bad++;
    }
  }
  printf("%-44s %6zu frames, %7zu pieces, %zu differ\n", what, b->n, b->nitems, bad);
  free(cpu);
  free(gpu);
  free(stt);
  return bad;
}

/* n blocks of `len` bytes, the corpus tiled from page `first`. */
static uint8_t *tiled(size_t n, size_t len, size_t first) {
  uint8_t *p = malloc(n * len);
  REQUIRE(p);
  size_t at = (first * CORPUS_PAGE_BYTES) % corpus_len;
  for (size_t i = 0; i < n * len;) {
    size_t c = OI_MIN(n * len - i, corpus_len - at);
    memcpy(p + i, corpus + at, c);
    i += c;
    at = (at + c) % corpus_len;
  }
  return p;
}

static void test_corpus_pages(void) {
  size_t pages = corpus_len / CORPUS_PAGE_BYTES;
  oi_codec_shape kv = CORPUS_SHAPE_KV;
  for (int c = OI_CODEC_LOSSLESS; c < OI_CODEC_COUNT; c++) {
    batch b;
    batch_encode(&b, c, &kv, corpus, pages, CORPUS_PAGE_BYTES);
    char what[64];
    snprintf(what, sizeof what, "corpus pages, %s", oi__codec_name(c));
    CHECK(check_batch(&b, what, NULL, 0) == 0);
    batch_free(&b);
  }
  /* 64 pages a block: one stream per part (128 parts) */
  oi_codec_shape big = {OI_CODEC_DTYPE_BF16, 128, 16, 3, 64};
  uint8_t *src = tiled(3, 64 * CORPUS_PAGE_BYTES, 0);
  for (int c = OI_CODEC_LOSSLESS; c < OI_CODEC_COUNT; c++) {
    batch b;
    batch_encode(&b, c, &big, src, 3, 64 * CORPUS_PAGE_BYTES);
    char what[64];
    snprintf(what, sizeof what, "64-page blocks, %s", oi__codec_name(c));
    CHECK(check_batch(&b, what, NULL, 0) == 0);
    batch_free(&b);
  }
  free(src);
}

/* Model-sized blocks with no shape: the encoder's stream cap gives a large
 * block many streams. */
static void test_model_blocks(void) {
  const struct {
    const char *what;
    size_t len;
  } m[] = {{"Qwen3-4B blocks (2,359,296 B), lossless", 2359296},
           {"GLM5.2 blocks (3,452,160 B), lossless", 3452160}};
  oi_codec_shape none = {.dtype = OI_CODEC_DTYPE_BF16};
  for (size_t i = 0; i < OI_ARRAY_LEN(m); i++) {
    uint8_t *src = tiled(4, m[i].len, 17 * i);
    batch b;
    batch_encode(&b, OI_CODEC_LOSSLESS, &none, src, 4, m[i].len);
    CHECK(check_batch(&b, m[i].what, NULL, 0) == 0);
    /* each stream at most OI_LOSSLESS_SEGMENT_MAX exponents */
    for (size_t k = 0; k < b.nitems; k++)
      CHECK(b.items[k].count <= OI_LOSSLESS_SEGMENT_MAX);
    CHECK(b.nitems >= 4 * (m[i].len / 2 / OI_LOSSLESS_SEGMENT_MAX));
    for (size_t k = 0; k < b.nitems; k++)
      CHECK(b.items[k].kind == OI_KDEC_RANS32);
    /* Wide streams damaged past the checksums: frame 1's first stream has
     * its state 0 zeroed, frame 3's a byte of its middle word changed. */
    uint8_t damaged[4] = {0, 1, 0, 1};
    for (size_t f = 1; f < 4; f += 2) {
      uint8_t *frame = b.frames + b.frame_off[f];
      oi_codec_info in;
      oi_codec_piece pc[512];
      size_t k = 0;
      REQUIRE(oi__codec_pieces(frame, b.frame_len[f], true, &in, pc, 512, &k) == OI_OK);
      REQUIRE(pc[0].kind == OI_CODEC_PIECE_RANS32);
      uint8_t *st = frame + pc[0].src;
      size_t t = 2; /* past the table: lo, hi, the LEB128 frequencies */
      for (int sym = st[0]; sym <= st[1]; sym++)
        while (st[t++] & 0x80) {
        }
      if (f == 1)
        memset(st + t, 0, 4);
      else
        st[t + 128 + (pc[0].len - t - 128) / 2] ^= 0x04;
    }
    b.unverified = 1;
    CHECK(check_batch(&b, "  the same, frames 1 and 3 damaged", damaged, OI_KDEC_BAD_STREAM) == 0);
    batch_free(&b);
    free(src);
  }
}

static void test_raw_and_odd(void) {
  uint64_t seed = 7;
  size_t len = 40000;
  uint8_t *src = malloc(3 * len + 1);
  REQUIRE(src);
  for (size_t i = 0; i < 3 * len + 1; i++)
    src[i] = (uint8_t)ct_rand(&seed);
  oi_codec_shape none = {.dtype = OI_CODEC_DTYPE_BYTES};
  batch b;
  batch_encode(&b, OI_CODEC_LOSSLESS, &none, src, 3, len);
  CHECK(check_batch(&b, "random bytes (exponents raw), lossless", NULL, 0) == 0);
  CHECK(b.nitems == 3 * ((len / 2 + OI_LOSSLESS_SEGMENT_MAX - 1) / OI_LOSSLESS_SEGMENT_MAX));
  batch_free(&b);
  /* odd lengths: the last byte rides raw */
  uint8_t *odd = tiled(1, 24577, 3);
  batch_encode(&b, OI_CODEC_LOSSLESS, &none, odd, 1, 24577);
  CHECK(check_batch(&b, "an odd-length block (24,577 B), lossless", NULL, 0) == 0);
  batch_free(&b);
  free(odd);
  free(src);
}

/* Frames damaged after the host verified them (what a bad stream past the
 * checksums would look like): each reports its status and leaves the
 * batch's other frames exact. */
static void test_damaged(void) {
  size_t pages = 24;
  oi_codec_shape kv = CORPUS_SHAPE_KV;
  for (int c = OI_CODEC_LOSSLESS; c < OI_CODEC_COUNT; c++) {
    batch b;
    batch_encode(&b, c, &kv, corpus, pages, CORPUS_PAGE_BYTES);
    uint8_t *df = NULL, *db = NULL;
    oi_kdec_item *di = NULL;
    int32_t *ds = NULL, st[24];
    CU(cudaMalloc((void **)&df, b.frame_total));
    CU(cudaMalloc((void **)&db, b.logical_total));
    batch_plan(&b, (uint64_t)(uintptr_t)df, (uint64_t)(uintptr_t)db); /* verifies them intact */
    uint8_t *dmg = malloc(b.frame_total), damaged[24] = {0};
    REQUIRE(dmg);
    memcpy(dmg, b.frames, b.frame_total);
    int32_t want = 0;
    for (size_t i = 3; i < pages; i += 7) {
      damaged[i] = 1;
      uint8_t *f = dmg + b.frame_off[i];
      oi_codec_piece pc[8];
      oi_codec_info in;
      size_t k = 0;
      REQUIRE(oi__codec_pieces(b.frames + b.frame_off[i], b.frame_len[i], true, &in, pc, 8, &k) ==
              OI_OK);
      if (c == OI_CODEC_LOSSLESS) {
        /* the first stream's state 0: after its table (lo, hi, LEB128s) */
        REQUIRE(pc[0].kind == OI_CODEC_PIECE_RANS);
        uint8_t *s = f + pc[0].src;
        size_t t = 2;
        for (int sym = s[0]; sym <= s[1]; sym++)
          while (s[t++] & 0x80) {
          }
        memset(s + t, 0, 4);
        want = OI_KDEC_BAD_STREAM;
      } else if (c != OI_CODEC_FP8) {
        f[pc[0].src + 2 * 5] = 0x00, f[pc[0].src + 2 * 5 + 1] = 0x7c; /* scale 5: +inf */
        want = OI_KDEC_BAD_SCALE;
      } else {
        f[pc[0].src + pc[0].count * pc[0].heads * 4 + 100] = 0x7f; /* a NaN code */
        want = OI_KDEC_NAN_CODE;
      }
    }
    CU(cudaMemcpy(df, dmg, b.frame_total, cudaMemcpyHostToDevice));
    CU(cudaMalloc((void **)&di, b.nitems * sizeof *di));
    CU(cudaMalloc((void **)&ds, pages * sizeof *ds));
    CU(cudaMemset(ds, 0, pages * sizeof *ds));
    CU(cudaMemcpy(di, b.items, b.nitems * sizeof *di, cudaMemcpyHostToDevice));
    CU((cudaError_t)oi_kernel_codec_decode(di, (uint32_t)b.nitems, b.lossless, b.max_lossy, ds,
                                           NULL));
    CU(cudaDeviceSynchronize());
    uint8_t *out = malloc(b.logical_total), *want_page = malloc(CORPUS_PAGE_BYTES);
    REQUIRE(out && want_page);
    CU(cudaMemcpy(out, db, b.logical_total, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(st, ds, sizeof st, cudaMemcpyDeviceToHost));
    size_t wrong = 0;
    for (size_t i = 0; i < pages; i++) {
      if (damaged[i]) {
        wrong += st[i] != want;
        continue;
      }
      ct_expected_of(c, corpus + i * CORPUS_PAGE_BYTES, want_page);
      wrong += st[i] != 0 || memcmp(out + b.block_off[i], want_page, CORPUS_PAGE_BYTES) != 0;
    }
    printf("damaged frames, %-29s %zu of %zu frames as expected\n", oi__codec_name(c),
           pages - wrong, pages);
    CHECK(wrong == 0);
    free(out);
    free(want_page);
    free(dmg);
    cudaFree(df);
    cudaFree(db);
    cudaFree(di);
    cudaFree(ds);
    batch_free(&b);
  }
}

/* Damages the first planes stream of a verified frame past its checksum:
 * how 1: its first chunk's level-1 count one more; 2: w1 0; 3: its first
 * exponent's code flipped to or from the escape; 4: a code set in its last
 * group's padding (n not a multiple of 32). */
static void damage_planes(uint8_t *frame, size_t len, int how) {
  oi_codec_info in;
  oi_codec_piece pc[512];
  size_t k = 0;
  REQUIRE(oi__codec_pieces(frame, len, true, &in, pc, 512, &k) == OI_OK);
  REQUIRE(pc[0].kind == OI_CODEC_PIECE_PLANES);
  uint8_t *st = frame + pc[0].src;
  uint32_t w1 = st[0], w2 = st[1], n = pc[0].count;
  size_t counts = 2 + ((1u << w1) - 1) + (w2 ? (1u << w2) - 1 : 0);
  size_t groups = (n + 31) / 32, chunks = (n + 1023) / 1024;
  uint8_t *p1 = st + counts + 4 * chunks;
  if (how == 1) st[counts] = (uint8_t)(st[counts] + 1);
  if (how == 2) st[0] = 0;
  if (how == 3) {
    uint32_t code = 0;
    for (uint32_t b = 0; b < w1; b++)
      code |= (p1[4 * b] & 1u) << b;
    for (uint32_t b = 0; b < w1; b++) /* escape: all ones; else bit 0 cleared */
      p1[4 * b] =
          (uint8_t)(code == (1u << w1) - 1 ? (b ? p1[4 * b] : p1[4 * b] & ~1u) : p1[4 * b] | 1u);
  }
  if (how == 4) {
    REQUIRE(n % 32);
    p1[4 * w1 * (groups - 1) + 3] |= 0x80;
  }
}

/* The planes code's streams (a CTA a stream, a warp a chunk): corpus pages,
 * 64-page blocks, model-sized blocks, odd lengths, byte-exact against the
 * cpu; streams damaged past the checksums (a chunk's count, a width, a
 * code in a group's padding) refused. */
static void test_planes(void) {
  planes = true;
  oi_codec_shape kv = CORPUS_SHAPE_KV, big = {OI_CODEC_DTYPE_BF16, 128, 16, 3, 64},
                 none = {.dtype = OI_CODEC_DTYPE_BF16};
  batch b;
  batch_encode(&b, OI_CODEC_LOSSLESS, &kv, corpus, corpus_len / CORPUS_PAGE_BYTES,
               CORPUS_PAGE_BYTES);
  CHECK(check_batch(&b, "corpus pages, lossless (planes)", NULL, 0) == 0);
  batch_free(&b);
  uint8_t *src = tiled(3, 64 * CORPUS_PAGE_BYTES, 0);
  batch_encode(&b, OI_CODEC_LOSSLESS, &big, src, 3, 64 * CORPUS_PAGE_BYTES);
  CHECK(check_batch(&b, "64-page blocks, lossless (planes)", NULL, 0) == 0);
  batch_free(&b);
  free(src);
  uint8_t *odd = tiled(4, 2002, 3);
  batch_encode(&b, OI_CODEC_LOSSLESS, &none, odd, 4, 2002); /* 1,001 exponents: a group of 9 */
  CHECK(check_batch(&b, "1,001-element blocks, lossless (planes)", NULL, 0) == 0);
  uint8_t pad_damaged[4] = {0, 0, 1, 0};
  damage_planes(b.frames + b.frame_off[2], b.frame_len[2], 4);
  b.unverified = 1;
  CHECK(check_batch(&b, "  the same, frame 2's padding", pad_damaged, OI_KDEC_BAD_STREAM) == 0);
  batch_free(&b);
  free(odd);
  const size_t lens[2] = {2359296, 3452160};
  for (int m = 0; m < 2; m++) {
    src = tiled(4, lens[m], 17 * (size_t)m);
    batch_encode(&b, OI_CODEC_LOSSLESS, &none, src, 4, lens[m]);
    CHECK(check_batch(&b,
                      m ? "GLM5.2 blocks, lossless (planes)" : "Qwen3-4B blocks, lossless (planes)",
                      NULL, 0) == 0);
    for (size_t k = 0; k < b.nitems; k++)
      CHECK(b.items[k].kind == OI_KDEC_PLANES && b.items[k].count <= OI_LOSSLESS_SEGMENT_MAX);
    /* frame 1: its first stream's first chunk count one more; frame 2: its
     * first stream's w1 0; frame 3: its first exponent's code made an
     * escape where it was none, or none where it was (the chunk's escapes
     * then differ from its count) */
    uint8_t damaged[4] = {0, 1, 1, 1};
    for (size_t f = 1; f < 4; f++)
      damage_planes(b.frames + b.frame_off[f], b.frame_len[f], (int)f);
    b.unverified = 1;
    CHECK(check_batch(&b, "  the same, damaged streams", damaged, OI_KDEC_BAD_STREAM) == 0);
    batch_free(&b);
    free(src);
  }
  planes = false;
}

static double ms_of(cudaEvent_t a, cudaEvent_t b) {
  float ms = 0;
  CU(cudaEventElapsedTime(&ms, a, b));
  return ms;
}

/* Rates: n blocks of `len` bytes, the corpus tiled, through `codec`. */
static void rates(const char *what, int codec, const oi_codec_shape *sh, size_t n, size_t len) {
  uint8_t *src = tiled(n, len, 5);
  batch b;
  batch_encode(&b, codec, sh, src, n, len);
  size_t frame_bytes = 0;
  for (size_t i = 0; i < n; i++)
    frame_bytes += b.frame_len[i];
  uint8_t *h_logical = NULL, *h_frames = NULL, *d_logical = NULL, *d_frames = NULL, *d_out = NULL;
  CU(cudaMallocHost((void **)&h_logical, n * len));
  CU(cudaMallocHost((void **)&h_frames, b.frame_total));
  memcpy(h_logical, src, n * len);
  memcpy(h_frames, b.frames, b.frame_total);
  CU(cudaMalloc((void **)&d_logical, n * len));
  CU(cudaMalloc((void **)&d_frames, b.frame_total));
  CU(cudaMalloc((void **)&d_out, b.logical_total));
  batch_plan(&b, (uint64_t)(uintptr_t)d_frames, (uint64_t)(uintptr_t)d_out);
  oi_kdec_item *di = NULL;
  int32_t *ds = NULL;
  CU(cudaMalloc((void **)&di, b.nitems * sizeof *di));
  CU(cudaMalloc((void **)&ds, n * sizeof *ds));
  CU(cudaMemset(ds, 0, n * sizeof *ds));
  CU(cudaMemcpy(di, b.items, b.nitems * sizeof *di, cudaMemcpyHostToDevice));
  /* per block: its items' range */
  size_t *first = calloc(n + 1, sizeof *first);
  REQUIRE(first);
  for (size_t k = 0, i = 0; i <= n; i++) {
    while (k < b.nitems && b.items[k].frame < i)
      k++;
    first[i] = k;
  }
  cudaStream_t s1, s2;
  CU(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  CU(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  cudaEvent_t e0, e1, *landed = calloc(n, sizeof *landed);
  REQUIRE(landed);
  CU(cudaEventCreate(&e0));
  CU(cudaEventCreate(&e1));
  for (size_t i = 0; i < n; i++)
    CU(cudaEventCreateWithFlags(&landed[i], cudaEventDisableTiming));
  double best_bulk = 1e30, best_fr = 1e30, best_dec = 1e30, best_pipe = 1e30;
  for (int rep = 0; rep < 5; rep++) {
    /* bulk H2D of the logical blocks: one copy per block, as a restore moves them */
    CU(cudaEventRecord(e0, s1));
    for (size_t i = 0; i < n; i++)
      CU(cudaMemcpyAsync(d_logical + i * len, h_logical + i * len, len, cudaMemcpyHostToDevice,
                         s1));
    CU(cudaEventRecord(e1, s1));
    CU(cudaEventSynchronize(e1));
    best_bulk = OI_MIN(best_bulk, ms_of(e0, e1));
    /* the frames alone */
    CU(cudaEventRecord(e0, s1));
    for (size_t i = 0; i < n; i++)
      CU(cudaMemcpyAsync(d_frames + b.frame_off[i], h_frames + b.frame_off[i], b.frame_len[i],
                         cudaMemcpyHostToDevice, s1));
    CU(cudaEventRecord(e1, s1));
    CU(cudaEventSynchronize(e1));
    best_fr = OI_MIN(best_fr, ms_of(e0, e1));
    /* the decode alone */
    CU(cudaEventRecord(e0, s1));
    CU((cudaError_t)oi_kernel_codec_decode(di, (uint32_t)b.nitems, b.lossless, b.max_lossy, ds,
                                           s1));
    CU(cudaEventRecord(e1, s1));
    CU(cudaEventSynchronize(e1));
    best_dec = OI_MIN(best_dec, ms_of(e0, e1));
    /* a restore: each block's frame over the link, its decode behind it */
    CU(cudaEventRecord(e0, s1));
    CU(cudaStreamWaitEvent(s2, e0, 0));
    for (size_t i = 0; i < n; i++) {
      CU(cudaMemcpyAsync(d_frames + b.frame_off[i], h_frames + b.frame_off[i], b.frame_len[i],
                         cudaMemcpyHostToDevice, s1));
      CU(cudaEventRecord(landed[i], s1));
      CU(cudaStreamWaitEvent(s2, landed[i], 0));
      CU((cudaError_t)oi_kernel_codec_decode(di + first[i], (uint32_t)(first[i + 1] - first[i]),
                                             b.lossless, b.max_lossy, ds, s2));
    }
    CU(cudaEventRecord(e1, s2));
    CU(cudaEventSynchronize(e1));
    best_pipe = OI_MIN(best_pipe, ms_of(e0, e1));
  }
  int32_t *st = calloc(n, sizeof *st);
  REQUIRE(st);
  CU(cudaMemcpy(st, ds, n * sizeof *ds, cudaMemcpyDeviceToHost));
  uint8_t *out = malloc(b.logical_total), *cpu = malloc(len);
  REQUIRE(out && cpu);
  CU(cudaMemcpy(out, d_out, b.logical_total, cudaMemcpyDeviceToHost));
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) {
    size_t ob = 0;
    REQUIRE(oi__codec_decode(b.frames + b.frame_off[i], b.frame_len[i], cpu, len, &ob) == OI_OK);
    bad += st[i] != 0 || memcmp(out + b.block_off[i], cpu, len) != 0;
  }
  CHECK(bad == 0);
  double gb = (double)n * (double)len / 1e9;
  printf("%-34s %3zu x %8zu B, ratio %.3f: bulk H2D %.1f GB/s (%.0f us); frames H2D %.1f "
         "(%.0f us); decode alone %.1f GB/s (%.0f us); restore (frames + decode) %.1f GB/s "
         "(%.0f us) = %.3f x bulk; %zu differ\n",
         what, n, len, (double)n * len / (double)frame_bytes, gb / best_bulk * 1e3, best_bulk * 1e3,
         gb / best_fr * 1e3, best_fr * 1e3, gb / best_dec * 1e3, best_dec * 1e3,
         gb / best_pipe * 1e3, best_pipe * 1e3, best_bulk / best_pipe, bad);
  for (size_t i = 0; i < n; i++)
    cudaEventDestroy(landed[i]);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaStreamDestroy(s1);
  cudaStreamDestroy(s2);
  cudaFreeHost(h_logical);
  cudaFreeHost(h_frames);
  cudaFree(d_logical);
  cudaFree(d_frames);
  cudaFree(d_out);
  cudaFree(di);
  cudaFree(ds);
  free(first);
  free(landed);
  free(st);
  free(out);
  free(cpu);
  batch_free(&b);
  free(src);
}

int main(int argc, char **argv) {
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) TEST_SKIP("no CUDA device");
  REQUIRE(argc >= 2);
  corpus = ct_read_file(argv[1], &corpus_len);
  REQUIRE(corpus && corpus_len % CORPUS_PAGE_BYTES == 0);
  test_corpus_pages();
  test_model_blocks();
  test_raw_and_odd();
  test_damaged();
  test_planes();
  if (argc < 3 || strcmp(argv[2], "--rates") != 0) goto done;
  oi_codec_shape none = {.dtype = OI_CODEC_DTYPE_BF16};
  oi_codec_shape qwen = {OI_CODEC_DTYPE_BF16, 72, 16, 8, 128};
  /* the lossless rows for each code: rANS, then the planes code */
  for (int code = 0; code < 2; code++) {
    planes = code == 1;
    static const size_t glm_blocks[] = {2, 9, 22, 256};
    for (size_t i = 0; i < sizeof glm_blocks / sizeof glm_blocks[0]; i++)
      rates(planes ? "GLM5.2 lossless (planes)" : "GLM5.2 lossless", OI_CODEC_LOSSLESS, &none,
            glm_blocks[i], 3452160);
    rates(planes ? "Qwen3-4B lossless (planes)" : "Qwen3-4B lossless", OI_CODEC_LOSSLESS, &qwen,
          256, 2359296);
  }
  planes = false;
  rates("Qwen3-4B int8", OI_CODEC_INT8, &qwen, 256, 2359296);
  rates("Qwen3-4B int8-hadamard", OI_CODEC_INT8_HADAMARD, &qwen, 256, 2359296);
  rates("Qwen3-4B fp8", OI_CODEC_FP8, &qwen, 256, 2359296);
done:
  free(corpus);
  fprintf(stderr, "%-60s %s\n", "test_codec_kernels", oi_test_failures ? "FAILED" : "ok");
  TEST_EXIT();
}
