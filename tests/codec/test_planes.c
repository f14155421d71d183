/* The planes code of an exponent stream (lib/codec/planes.h): round trips
 * over every length class and distribution, the widths the encoder picks
 * against every (w1, w2) tried by hand, and damaged streams refused, never
 * read past (ASan builds). (Its frames: codec_test_frames.)
 *
 *   codec_test_planes KV_BIN */
#include <string.h>

#include "codec/planes.h"
#include "codec_testutil.h"
#include "core/le_bytes.h"
#include "testutil.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t next_rand(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (uint32_t)(rng >> 11);
}

/* Exponents drawn from a geometric-like law over `spread` symbols around
 * 120 (real KV's exponents crowd a few values), some raw outliers. */
static void draw(uint8_t *e, size_t n, unsigned spread, unsigned outlier_per_mille) {
  for (size_t i = 0; i < n; i++) {
    unsigned k = 0;
    while (k + 1 < spread && (next_rand() & 3) == 0)
      k++;
    e[i] = (uint8_t)(120 + k);
    if (next_rand() % 1000 < outlier_per_mille) e[i] = (uint8_t)next_rand();
  }
}

/* Codes and decodes e[0..n); the stream's length (0 on a failure). */
static size_t round_trip(const uint8_t *e, size_t n) {
  size_t cap = 2 * n + 4096;
  uint8_t *s = malloc(cap), *back = malloc(n);
  REQUIRE(s && back);
  size_t len = oi__planes_encode(e, n, s, cap);
  CHECK(len > 0);
  memset(back, 0xa5, n);
  CHECK(oi__planes_decode(s, len, back, n) == 0);
  CHECK(!memcmp(back, e, n));
  /* one byte short or one too many: refused */
  CHECK(oi__planes_decode(s, len - 1, back, n) == -1);
  CHECK(oi__planes_decode(s, len + 1, back, n) == -1);
  free(s);
  free(back);
  return len;
}

/* Lengths around a group (32) and a chunk (1,024), every distribution. */
static void test_round_trips(void) {
  static const size_t lens[] = {1, 2, 31, 32, 33, 63, 1023, 1024, 1025, 2047, 3072, 32768, 40000};
  static const unsigned spreads[] = {1, 2, 4, 9, 40, 256};
  uint8_t *e = malloc(40000);
  REQUIRE(e);
  size_t cases = 0;
  for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++)
    for (size_t k = 0; k < sizeof spreads / sizeof spreads[0]; k++)
      for (unsigned out = 0; out <= 50; out += 25) {
        draw(e, lens[i], spreads[k], out);
        CHECK(round_trip(e, lens[i]) > 0);
        cases++;
      }
  /* uniform bytes: every symbol, level 3 at its widest */
  for (size_t i = 0; i < 40000; i++)
    e[i] = (uint8_t)next_rand();
  CHECK(round_trip(e, 40000) > 0);
  printf("%zu round trips byte-exact\n", cases + 1);
  free(e);
}

/* The length of a stream of widths (w1, w2) for histogram h, as the format
 * counts it, from the symbols sorted by count. */
static size_t len_of(const uint32_t *h, size_t n, uint32_t w1, uint32_t w2) {
  uint32_t c[256];
  memcpy(c, h, sizeof c);
  size_t covered = 0, k1 = (1u << w1) - 1, k2 = w2 ? (1u << w2) - 1 : 0, e1 = 0;
  for (size_t k = 0; k < k1 + k2; k++) { /* the k-th most frequent */
    int best = 0;
    for (int s = 1; s < 256; s++)
      if (c[s] > c[best]) best = s;
    covered += c[best];
    c[best] = 0;
    if (k + 1 == k1) e1 = n - covered;
  }
  size_t e2 = w2 ? n - covered : e1;
  size_t chunks = (n + 1023) / 1024, groups = (n + 31) / 32;
  return 2 + k1 + k2 + 4 * chunks + 4 * w1 * groups + (e1 * w2 + 7) / 8 + e2;
}

/* The encoder's stream is the shortest of every (w1, w2). */
static void test_choice(const uint8_t *kv, size_t len) {
  size_t pages = len / CORPUS_PAGE_BYTES, checked = 0;
  uint8_t *e = malloc(CORPUS_PAGE_BYTES / 2), *s = malloc(2 * CORPUS_PAGE_BYTES);
  REQUIRE(e && s);
  for (size_t p = 0; p < pages; p += 7) {
    const uint8_t *page = kv + p * CORPUS_PAGE_BYTES;
    size_t n = CORPUS_PAGE_BYTES / 2;
    uint32_t h[256] = {0};
    for (size_t i = 0; i < n; i++) {
      e[i] = (uint8_t)((page[2 * i] | page[2 * i + 1] << 8) >> 7);
      h[e[i]]++;
    }
    size_t best = SIZE_MAX;
    for (uint32_t w1 = 1; w1 <= OI_PLANES_W_MAX; w1++)
      for (uint32_t w2 = 0; w2 <= OI_PLANES_W_MAX; w2++) {
        size_t l = len_of(h, n, w1, w2);
        if (l < best) best = l;
      }
    size_t got = oi__planes_encode(e, n, s, 2 * CORPUS_PAGE_BYTES);
    CHECK(got == best);
    CHECK(oi__planes_encode(e, n, s, best - 1) == 0); /* past cap: not coded */
    checked++;
  }
  printf("%zu corpus pages: the encoder's widths give the shortest stream\n", checked);
  free(e);
  free(s);
}

/* Damaged streams: widths out of range, counts past their chunk, counts
 * that are not the codes', non-zero padding; every truncation. */
static void test_damage(void) {
  enum { N = 3000 };
  uint8_t e[N], back[N], s[2 * N + 4096], d[2 * N + 4096];
  draw(e, N, 40, 25);
  size_t len = oi__planes_encode(e, N, s, sizeof s);
  REQUIRE(len > 0);
  uint32_t w1 = s[0], w2 = s[1];
  CHECK(w2 > 0); /* this law needs all three levels */
  size_t counts = 2 + ((1u << w1) - 1) + ((1u << w2) - 1);
  size_t refused = 0, tried = 0;
  /* widths */
  const uint8_t widths[][2] = {{0, 0}, {8, 0}, {1, 8}, {255, 1}};
  for (size_t i = 0; i < 4; i++) {
    memcpy(d, s, len);
    d[0] = widths[i][0];
    d[1] = widths[i][1];
    tried++;
    refused += oi__planes_decode(d, len, back, N) == -1;
  }
  /* each chunk's counts: one more, one less, e2 past e1 */
  for (size_t ch = 0; ch < (N + 1023) / 1024; ch++)
    for (int f = 0; f < 4; f++) {
      memcpy(d, s, len);
      uint8_t *c = d + counts + 4 * ch;
      uint16_t e1 = (uint16_t)get16(c);
      if (f == 0) put16(c, (uint16_t)(e1 + 1));
      if (f == 1) put16(c, (uint16_t)(e1 - 1));
      if (f == 2) put16(c + 2, (uint16_t)(e1 + 1));
      if (f == 3) put16(c, 2000), put16(c + 2, 0);
      tried++;
      refused += oi__planes_decode(d, len, back, N) == -1;
    }
  /* a code past n in the last group (N % 32 = 24: bits 24..31 are padding) */
  memcpy(d, s, len);
  size_t groups = (N + 31) / 32, chunks = (N + 1023) / 1024;
  d[counts + 4 * chunks + 4 * w1 * (groups - 1) + 3] |= 0x80;
  tried++;
  refused += oi__planes_decode(d, len, back, N) == -1;
  CHECK(refused == tried);
  /* every truncation, and the wrong count of exponents */
  size_t trunc = 0;
  for (size_t l = 0; l < len; l++)
    trunc += oi__planes_decode(s, l, back, N) == -1;
  CHECK(trunc == len);
  /* another count of groups (the count of exponents is the frame's to
   * say: within the last group, the zero padding is the only check) */
  CHECK(oi__planes_decode(s, len, back, N - 32) == -1);
  CHECK(oi__planes_decode(s, len, back, N + 32) == -1);
  CHECK(oi__planes_decode(s, len, back, 0) == -1);
  /* random bytes never read past their end (ASan) */
  for (int k = 0; k < 2000; k++) {
    size_t l = next_rand() % 400;
    for (size_t i = 0; i < l; i++)
      d[i] = (uint8_t)next_rand();
    if (l >= 2) d[0] = (uint8_t)(1 + next_rand() % 7), d[1] = (uint8_t)(next_rand() % 8);
    (void)oi__planes_decode(d, l, back, 1 + next_rand() % 200);
  }
  printf("damaged streams: %zu of %zu refused, %zu of %zu truncations refused\n", refused, tried,
         trunc, len);
}

int main(int argc, char **argv) {
  REQUIRE(argc == 2);
  size_t len;
  uint8_t *kv = ct_read_file(argv[1], &len);
  REQUIRE(kv && len >= CORPUS_PAGE_BYTES);
  RUN_TEST(test_round_trips);
  test_choice(kv, len);
  RUN_TEST(test_damage);
  free(kv);
  TEST_EXIT();
}
