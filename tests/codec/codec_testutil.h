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

#endif
