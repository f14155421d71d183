/* What the codec tests share: reading the committed corpus
 * (tests/data/kvcorpus/kv.bin: 12,288-byte pages [K|V][16][3][64] bf16)
 * and a deterministic PRNG. */
#ifndef OI_TESTS_CODEC_TESTUTIL_H
#define OI_TESTS_CODEC_TESTUTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec/codec.h"
#include "codec/planes.h"
#include "codec/rans.h"

#define CORPUS_PAGE_BYTES 12288u
#define CORPUS_SHAPE_KV ((oi_codec_shape){OI_CODEC_DTYPE_BF16, 2, 16, 3, 64})
#define CORPUS_SHAPE_HALF ((oi_codec_shape){OI_CODEC_DTYPE_BF16, 1, 16, 3, 64})

/* The whole file (NULL on failure, with a message). */
static inline uint8_t *ct_read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "cannot open %s\n", path);
    return NULL;
  }
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *b = n > 0 ? malloc((size_t)n) : NULL;
  if (!b || fread(b, 1, (size_t)n, f) != (size_t)n) {
    fprintf(stderr, "cannot read %s\n", path);
    free(b);
    b = NULL;
  }
  fclose(f);
  *len = b ? (size_t)n : 0;
  return b;
}

static inline uint64_t ct_rand(uint64_t *s) { /* splitmix64 */
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* What a load of a corpus page through `codec` must give: the page itself
 * (none, lossless), or the codec's own round trip of it (int8, fp8). */
static inline void ct_expected_of(int codec, const uint8_t *page, uint8_t *out) {
  if (codec <= OI_CODEC_LOSSLESS) {
    memcpy(out, page, CORPUS_PAGE_BYTES);
    return;
  }
  oi_codec_shape sh = CORPUS_SHAPE_KV;
  uint8_t frame[2 * CORPUS_PAGE_BYTES];
  size_t fb = 0, ob = 0;
  if (oi__codec_encode(codec, &sh, page, CORPUS_PAGE_BYTES, frame, sizeof frame, &fb) != OI_OK ||
      oi__codec_decode(frame, fb, out, CORPUS_PAGE_BYTES, &ob) != OI_OK ||
      ob != CORPUS_PAGE_BYTES) {
    fprintf(stderr, "ct_expected_of: codec %d: %s\n", codec, oi_last_error());
    abort();
  }
}

static inline float ct_bf16(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* Decodes one piece of frame f on its own (what a GPU decoder does with
 * it, here on the cpu) into `block` (block_bytes, the frame's decoded
 * block): 0, or -1 when a lossless stream does not decode, -2 when a lossy
 * payload does not (oi_last_error() says why). */
static inline int ct_decode_piece(const uint8_t *f, const oi_codec_piece *p, uint8_t *block,
                                  size_t block_bytes) {
  uint8_t *out = block + p->dst;
  switch (p->kind) {
  case OI_CODEC_PIECE_RANS:
  case OI_CODEC_PIECE_RANS32:
  case OI_CODEC_PIECE_PLANES:
  case OI_CODEC_PIECE_RAW_EXP: {
    uint8_t *exp = malloc(p->count ? p->count : 1);
    if (!exp) abort();
    int rc = 0;
    if (p->kind == OI_CODEC_PIECE_RAW_EXP)
      memcpy(exp, f + p->src, p->count);
    else if ((p->kind == OI_CODEC_PIECE_PLANES
                  ? oi__planes_decode(f + p->src, p->len, exp, p->count)
              : p->kind == OI_CODEC_PIECE_RANS32
                  ? oi__rans32_decode(f + p->src, p->len, exp, p->count)
                  : oi__rans_decode(f + p->src, p->len, exp, p->count)) != 0)
      rc = -1;
    for (uint32_t i = 0; rc == 0 && i < p->count; i++) {
      uint8_t e = exp[i], sm = f[p->aux + i];
      out[2 * i] = (uint8_t)((e << 7) | (sm & 0x7f));
      out[2 * i + 1] = (uint8_t)((sm & 0x80) | (e >> 1));
    }
    free(exp);
    return rc;
  }
  case OI_CODEC_PIECE_BYTES: memcpy(out, f + p->src, p->count); return 0;
  default: { /* int8, int8-hadamard, fp8: the whole payload */
    int codec = p->kind == OI_CODEC_PIECE_INT8    ? OI_CODEC_INT8
                : p->kind == OI_CODEC_PIECE_INT8H ? OI_CODEC_INT8_HADAMARD
                                                  : OI_CODEC_FP8;
    oi_codec_shape sh = {.dtype = OI_CODEC_DTYPE_BF16,
                         .parts = (uint16_t)(codec != OI_CODEC_FP8
                                                 ? p->count / ((uint32_t)p->tokens * p->heads)
                                                 : p->count),
                         .tokens = p->tokens,
                         .heads = p->heads,
                         .head_dim = p->head_dim};
    return oi__codec_decode_payload(codec, &sh, f + p->src, p->len, block, block_bytes) == OI_OK
               ? 0
               : -2;
  }
  }
}

#endif
