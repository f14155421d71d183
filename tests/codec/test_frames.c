/* The codec frames against hostile and odd input: random bytes, zeros,
 * NaN and infinity patterns, tiny and odd sizes (lossless: byte-exact, and
 * never more than the header and one byte larger); bad arguments refused
 * with their status; every single-byte change, every truncation and forged
 * frames (checksum recomputed) refused or, for a lossy payload, decoded to
 * some values, never a crash or a read outside the frame; the payload
 * decoders fed junk; exact round trips of values each format represents. */
#include <math.h>
#include <stdbool.h>
#include <string.h>
#include <xxhash.h>

#define LEN(a) (sizeof(a) / sizeof((a)[0]))

#include "codec/rans.h"
#include "codec_testutil.h"
#include "testutil.h"

static uint64_t seed = 40;

static void round_trip_lossless(const uint8_t *src, size_t n, const char *what) {
  size_t cap = oi__codec_bound(OI_CODEC_LOSSLESS, NULL, n);
  CHECK(cap == OI_CODEC_HEADER_BYTES + 1 + n);
  uint8_t *frame = malloc(cap), *back = malloc(n + 1);
  REQUIRE(frame && back);
  size_t fb = 0, out = 99;
  CHECK_OK(oi__codec_encode(OI_CODEC_LOSSLESS, NULL, src, n, frame, cap, &fb));
  CHECK(fb <= cap);
  CHECK_OK(oi__codec_decode(frame, fb, back, n + 1, &out));
  if (out != n || memcmp(back, src, n)) {
    fprintf(stderr, "%s, %zu bytes: not byte-exact\n", what, n);
    oi_test_failures++;
  }
  free(frame);
  free(back);
}

static void test_sizes_and_patterns(void) {
  static const size_t sizes[] = {0,   1,    2,    3,     5,     15,    16,    17,    31,
                                 32,  33,   34,   35,    36,    37,    63,    64,    100,
                                 255, 4095, 6144, 12289, 16384, 16386, 16390, 100001};
  uint8_t *b = malloc(100001);
  REQUIRE(b);
  for (size_t i = 0; i < LEN(sizes); i++) {
    size_t n = sizes[i];
    for (size_t j = 0; j < n; j++)
      b[j] = (uint8_t)ct_rand(&seed);
    round_trip_lossless(b, n, "random");
    memset(b, 0, n);
    round_trip_lossless(b, n, "zeros");
    memset(b, 0xff, n);
    round_trip_lossless(b, n, "ones");
    /* few distinct exponents, random mantissas (compresses) */
    for (size_t j = 0; j + 1 < n; j += 2) {
      uint64_t r = ct_rand(&seed);
      b[j] = (uint8_t)r;
      b[j + 1] = (uint8_t)(0x3c + (r >> 8) % 3) | (uint8_t)(r >> 16 & 0x80);
    }
    round_trip_lossless(b, n, "bf16-like");
  }
  free(b);
}

/* Parts of different exponent distributions (K and V of a layer, or
 * layers) get a table each when the shape names them: smaller, exact.
 * Parts of OI_RANS32_MIN elements: every stream wide (mode 2). */
static void test_parts_tables(void) {
  enum { PARTS = 4, PER = OI_RANS32_MIN };
  static uint16_t x[PARTS * PER], back[PARTS * PER];
  for (size_t k = 0; k < PARTS; k++)
    for (size_t i = 0; i < PER; i++)
      x[k * PER + i] =
          (uint16_t)((0x30 + 6 * k + ct_rand(&seed) % 3) << 7 | (ct_rand(&seed) & 0x807f));
  oi_codec_shape whole = {OI_CODEC_DTYPE_BF16, 0, 0, 0, 0},
                 parts = {OI_CODEC_DTYPE_BF16, PARTS, 16, 3, 32};
  static uint8_t f1[sizeof x + 64], f2[sizeof x + 64];
  size_t b1, b2, out;
  CHECK_OK(oi__codec_encode(OI_CODEC_LOSSLESS, &whole, x, sizeof x, f1, sizeof f1, &b1));
  CHECK_OK(oi__codec_encode(OI_CODEC_LOSSLESS, &parts, x, sizeof x, f2, sizeof f2, &b2));
  CHECK(b2 < b1);
  uint16_t segs;
  memcpy(&segs, f2 + OI_CODEC_HEADER_BYTES + 1, 2);
  CHECK(f2[OI_CODEC_HEADER_BYTES] == 2 && segs == PARTS);
  CHECK_OK(oi__codec_decode(f2, b2, back, sizeof back, &out));
  CHECK(out == sizeof x && !memcmp(back, x, sizeof x));
  CHECK_OK(oi__codec_decode(f1, b1, back, sizeof back, &out));
  CHECK(out == sizeof x && !memcmp(back, x, sizeof x));
  /* the same distribution in every part: one table (in the streams of the cap) */
  for (size_t i = 0; i < PARTS * PER; i++)
    x[i] = (uint16_t)((0x30 + ct_rand(&seed) % 3) << 7 | (ct_rand(&seed) & 0x807f));
  CHECK_OK(oi__codec_encode(OI_CODEC_LOSSLESS, &parts, x, sizeof x, f2, sizeof f2, &b2));
  memcpy(&segs, f2 + OI_CODEC_HEADER_BYTES + 1, 2);
  CHECK(segs == (PARTS * PER + OI_LOSSLESS_SEGMENT_MAX - 1) / OI_LOSSLESS_SEGMENT_MAX); /* capped */
  CHECK_OK(oi__codec_decode(f2, b2, back, sizeof back, &out));
  CHECK(out == sizeof x && !memcmp(back, x, sizeof x));
}

/* Random bytes do not compress: the frame is the raw planes, no larger. */
static void test_incompressible_bound(void) {
  uint8_t b[6144];
  for (size_t j = 0; j < sizeof b; j++)
    b[j] = (uint8_t)ct_rand(&seed);
  uint8_t frame[6144 + 64];
  size_t fb = 0;
  CHECK_OK(oi__codec_encode(OI_CODEC_LOSSLESS, NULL, b, sizeof b, frame, sizeof frame, &fb));
  CHECK(fb == OI_CODEC_HEADER_BYTES + 1 + sizeof b);
  /* zeros: the exponent plane codes to a few bytes, the other plane stays */
  memset(b, 0, sizeof b);
  CHECK_OK(oi__codec_encode(OI_CODEC_LOSSLESS, NULL, b, sizeof b, frame, sizeof frame, &fb));
  CHECK(fb < OI_CODEC_HEADER_BYTES + 3072 + 32);
}

static const uint16_t SPECIAL[] = {0x7f80, 0xff80, 0x7fc0, 0xffc0, 0x7f81, 0xffff, 0x0001, 0x8000};

static void test_nan_inf(void) {
  oi_codec_shape sh = {OI_CODEC_DTYPE_BF16, 2, 4, 3, 8};
  uint16_t x[2 * 4 * 3 * 8];
  for (size_t s = 0; s < LEN(SPECIAL); s++) {
    for (size_t i = 0; i < LEN(x); i++)
      x[i] = (uint16_t)(0x3f80 + (ct_rand(&seed) & 0x7f));
    x[(s * 7) % LEN(x)] = SPECIAL[s];
    round_trip_lossless((const uint8_t *)x, sizeof x, "NaN/Inf");
    uint8_t frame[512];
    size_t fb = 0;
    bool finite = SPECIAL[s] == 0x0001 || SPECIAL[s] == 0x8000;
    for (int codec = OI_CODEC_INT8; codec < OI_CODEC_COUNT; codec++) {
      oi_status st = oi__codec_encode(codec, &sh, x, sizeof x, frame, sizeof frame, &fb);
      CHECK_ST(st, finite ? OI_OK : OI_ERR_INVALID_ARGUMENT);
      if (!finite) CHECK(strstr(oi_last_error(), "non-finite") != NULL);
    }
  }
  /* all-NaN, all-Inf blocks: lossless only */
  for (size_t i = 0; i < LEN(x); i++)
    x[i] = SPECIAL[i % 6];
  round_trip_lossless((const uint8_t *)x, sizeof x, "all special");
}

static void test_bad_arguments(void) {
  uint16_t x[96] = {0};
  uint8_t frame[512], back[512];
  size_t fb = 0, out = 0;
  oi_codec_shape sh = {OI_CODEC_DTYPE_BF16, 1, 2, 3, 16};
  CHECK_ST(oi__codec_encode(OI_CODEC_NONE, &sh, x, 192, frame, 512, &fb), OI_ERR_INVALID_ARGUMENT);
  CHECK_ST(oi__codec_encode(OI_CODEC_COUNT, &sh, x, 192, frame, 512, &fb), OI_ERR_INVALID_ARGUMENT);
  CHECK_ST(oi__codec_encode(-1, &sh, x, 192, frame, 512, &fb), OI_ERR_INVALID_ARGUMENT);
  CHECK_ST(oi__codec_encode(OI_CODEC_LOSSLESS, &sh, x, 192, NULL, 512, &fb),
           OI_ERR_INVALID_ARGUMENT);
  CHECK_ST(oi__codec_encode(OI_CODEC_LOSSLESS, &sh, NULL, 192, frame, 512, &fb),
           OI_ERR_INVALID_ARGUMENT);
  CHECK_ST(oi__codec_encode(OI_CODEC_LOSSLESS, &sh, x, 192, frame, 512, NULL),
           OI_ERR_INVALID_ARGUMENT);
  /* a dst one byte short of the bound */
  size_t need = oi__codec_bound(OI_CODEC_LOSSLESS, &sh, 192);
  CHECK_ST(oi__codec_encode(OI_CODEC_LOSSLESS, &sh, x, 192, frame, need - 1, &fb),
           OI_ERR_INVALID_ARGUMENT);
  CHECK(strstr(oi_last_error(), "needed") != NULL);
  for (int codec = OI_CODEC_INT8; codec < OI_CODEC_COUNT; codec++) {
    need = oi__codec_bound(codec, &sh, 192);
    CHECK(need > OI_CODEC_HEADER_BYTES);
    CHECK_ST(oi__codec_encode(codec, &sh, x, 192, frame, need - 1, &fb), OI_ERR_INVALID_ARGUMENT);
    CHECK_ST(oi__codec_encode(codec, NULL, x, 192, frame, 512, &fb), OI_ERR_INVALID_ARGUMENT);
    oi_codec_shape bad = sh;
    bad.heads = 0;
    CHECK_ST(oi__codec_encode(codec, &bad, x, 192, frame, 512, &fb), OI_ERR_INVALID_ARGUMENT);
    CHECK(oi__codec_bound(codec, &bad, 192) == 0);
    bad = sh;
    bad.dtype = OI_CODEC_DTYPE_BYTES;
    CHECK_ST(oi__codec_encode(codec, &bad, x, 192, frame, 512, &fb), OI_ERR_INVALID_ARGUMENT);
    CHECK_ST(oi__codec_encode(codec, &sh, x, 190, frame, 512, &fb), OI_ERR_INVALID_ARGUMENT);
    CHECK(strstr(oi_last_error(), "shape") != NULL);
    CHECK_ST(oi__codec_encode(codec, &sh, (const uint8_t *)x + 1, 192, frame, 512, &fb),
             OI_ERR_INVALID_ARGUMENT);
    CHECK_OK(oi__codec_encode(codec, &sh, x, 192, frame, need, &fb));
    CHECK(fb == need);
    CHECK_ST(oi__codec_decode(frame, fb, back, 191, &out), OI_ERR_INVALID_ARGUMENT);
    CHECK_ST(oi__codec_decode(frame, fb, back + 1, 192, &out), OI_ERR_INVALID_ARGUMENT);
    CHECK_OK(oi__codec_decode(frame, fb, back, 192, &out));
    CHECK(out == 192 && !memcmp(back, x, 192)); /* zeros are exact under either */
  }
  CHECK_ST(oi__codec_decode(NULL, 100, back, 512, &out), OI_ERR_INVALID_ARGUMENT);
  CHECK_ST(oi__codec_decode(frame, fb, NULL, 512, &out), OI_ERR_INVALID_ARGUMENT);
  CHECK_ST(oi__codec_decode(frame, fb, back, 512, NULL), OI_ERR_INVALID_ARGUMENT);
  CHECK(oi__codec_from_name("lossless") == OI_CODEC_LOSSLESS && oi__codec_from_name("fp8") == 3);
  CHECK(oi__codec_from_name("zstd") == -1 && oi__codec_from_name(NULL) == -1);
  CHECK(!strcmp(oi__codec_name(OI_CODEC_INT8), "int8") && oi__codec_name(9) == NULL);
  CHECK(oi__codec_from_name("int8-hadamard") == OI_CODEC_INT8_HADAMARD);
}

/* A frame of each codec over a bf16 block; each byte changed (two ways)
 * and each truncation is refused; padding after a frame is not read. */
static void test_corruption(void) {
  oi_codec_shape sh = {OI_CODEC_DTYPE_BF16, 2, 4, 3, 16};
  size_t n = 2 * 4 * 3 * 16 * 2;
  uint16_t x[2 * 4 * 3 * 16];
  for (size_t i = 0; i < LEN(x); i++)
    x[i] = (uint16_t)(0x3c00 + ct_rand(&seed) % 0x600) | (uint16_t)(ct_rand(&seed) & 0x8000);
  for (int codec = OI_CODEC_LOSSLESS; codec < OI_CODEC_COUNT; codec++) {
    uint8_t frame[2048], bad[2048], back[2048];
    size_t fb = 0, out = 0;
    CHECK_OK(oi__codec_encode(codec, &sh, x, n, frame, sizeof frame, &fb));
    size_t refused = 0;
    for (size_t i = 0; i < fb; i++)
      for (int flip = 0; flip < 2; flip++) {
        memcpy(bad, frame, fb);
        bad[i] ^= flip ? 0x80 : 0x01;
        oi_status st = oi__codec_decode(bad, fb, back, sizeof back, &out);
        if (st == OI_ERR_PROTOCOL || (i == 4 && st == OI_ERR_VERSION))
          refused++;
        else
          fprintf(stderr, "%s: byte %zu ^%d gave %s\n", oi__codec_name(codec), i, flip,
                  oi_status_str(st));
      }
    CHECK(refused == 2 * fb);
    for (size_t cut = 0; cut < fb; cut++)
      CHECK_ST(oi__codec_decode(frame, cut, back, sizeof back, &out), OI_ERR_PROTOCOL);
    /* a frame at the start of a larger slot: the padding is ignored */
    memcpy(bad, frame, fb);
    memset(bad + fb, 0xee, 100);
    CHECK_OK(oi__codec_decode(bad, fb + 100, back, sizeof back, &out));
    CHECK(out == n);
    if (codec == OI_CODEC_LOSSLESS) CHECK(!memcmp(back, x, n));
    oi_codec_info info;
    CHECK_OK(oi__codec_info_of(bad, fb + 100, &info));
    CHECK(info.frame_bytes == fb && info.codec == codec && info.shape.heads == 3);
  }
}

/* Frames forged with a valid checksum: the header's fields and the payload
 * changed, the checksum recomputed. The decoders refuse what they can see
 * is wrong; a lossless frame never decodes to other bytes. */
static void refix(uint8_t *f, size_t fb) {
  uint64_t h = XXH3_64bits_withSeed(f + OI_CODEC_HEADER_BYTES, fb - OI_CODEC_HEADER_BYTES,
                                    XXH3_64bits(f, 32));
  memcpy(f + 32, &h, 8);
}

static void test_forged(void) {
  oi_codec_shape sh = {OI_CODEC_DTYPE_BF16, 2, 16, 3, 64};
  size_t n = 12288;
  uint16_t *x = malloc(n);
  uint8_t *frame = malloc(n + 64), *bad = malloc(n + 64), *back = malloc(n + 2);
  REQUIRE(x && frame && bad && back);
  for (size_t i = 0; i < n / 2; i++)
    x[i] = (uint16_t)(0x3c00 + ct_rand(&seed) % 0x500) | (uint16_t)(ct_rand(&seed) & 0x8000);
  for (int codec = OI_CODEC_LOSSLESS; codec < OI_CODEC_COUNT; codec++) {
    size_t fb = 0, out = 0, ok_other = 0;
    CHECK_OK(oi__codec_encode(codec, &sh, x, n, frame, n + 64, &fb));
    for (int it = 0; it < 3000; it++) {
      memcpy(bad, frame, fb);
      size_t len = fb;
      int kind = it % 4;
      if (kind == 0) { /* a payload byte */
        bad[OI_CODEC_HEADER_BYTES + ct_rand(&seed) % (fb - OI_CODEC_HEADER_BYTES)] ^=
            (uint8_t)(1 + ct_rand(&seed) % 255);
      } else if (kind == 1) { /* a header field: codec, dtype, flags, lengths, shape */
        size_t at = 5 + ct_rand(&seed) % 19;
        bad[at] ^= (uint8_t)(1 + ct_rand(&seed) % 255);
      } else if (kind == 2) { /* a shorter payload, its length field to match */
        len = OI_CODEC_HEADER_BYTES + ct_rand(&seed) % (fb - OI_CODEC_HEADER_BYTES);
        uint32_t pl = (uint32_t)(len - OI_CODEC_HEADER_BYTES);
        memcpy(bad + 12, &pl, 4);
      } else { /* another codec's id over this payload */
        bad[5] = (uint8_t)(1 + ct_rand(&seed) % (OI_CODEC_COUNT - 1));
        bad[9] ^= (uint8_t)(ct_rand(&seed) & 1);
      }
      refix(bad, len);
      memset(back, 0x5a, n + 2);
      oi_status st = oi__codec_decode(bad, len, back, n + 2, &out);
      CHECK(st == OI_OK || st == OI_ERR_PROTOCOL || st == OI_ERR_INVALID_ARGUMENT);
      if (st == OI_OK) {
        oi_codec_info info;
        CHECK_OK(oi__codec_info_of(bad, len, &info));
        if (info.codec == OI_CODEC_LOSSLESS) CHECK(out == n && !memcmp(back, x, n));
        if (memcmp(back, x, n)) ok_other++;
      }
    }
    printf("forged %s frames: %zu of 3000 decoded to other values (lossy payloads only)\n",
           oi__codec_name(codec), ok_other);
  }
  free(x);
  free(frame);
  free(bad);
  free(back);
}

/* The payload decoders on junk (no checksum in the way). */
static void test_payload_junk(void) {
  uint8_t src[20000], dst[20000];
  for (int it = 0; it < 20000; it++) {
    size_t len = ct_rand(&seed) % (it < 10000 ? 64 : sizeof src);
    for (size_t i = 0; i < len; i++)
      src[i] = (uint8_t)ct_rand(&seed);
    if (len && it % 3 == 0) src[0] = 1; /* the rANS mode */
    if (len > 8 && it % 6 == 0) {       /* a plausible segment count, stream length and table */
      uint32_t l = (uint32_t)(len - 7);
      src[1] = 1, src[2] = 0; /* one segment */
      memcpy(src + 3, &l, 4);
      if (len > 9) src[7] = 0x3c, src[8] = 0x3e;
    }
    int codec = 1 + it % (OI_CODEC_COUNT - 1);
    oi_codec_shape sh = {OI_CODEC_DTYPE_BF16, (uint16_t)(1 + it % 2), (uint16_t)(1 + it % 7), 3,
                         (uint16_t)(1 + it % 64)};
    size_t logical = codec == OI_CODEC_LOSSLESS
                         ? ct_rand(&seed) % sizeof dst
                         : sh.parts * sh.tokens * sh.heads * sh.head_dim * 2u;
    oi_status st = oi__codec_decode_payload(codec, &sh, src, len, dst, logical);
    CHECK(st == OI_OK || st == OI_ERR_PROTOCOL);
  }
}

/* Codes 4,000 symbols of 5 values into coded[0..cap) with `enc`; every
 * truncation of the stream is refused by `dec`. @return its length. */
static size_t coded_4000_cuts_refused(size_t (*enc)(const uint8_t *, size_t, uint8_t *, size_t),
                                      int (*dec)(const uint8_t *, size_t, uint8_t *, size_t),
                                      uint8_t *sym, uint8_t *coded, size_t cap, uint8_t *back) {
  for (size_t i = 0; i < 4000; i++)
    sym[i] = (uint8_t)(60 + ct_rand(&seed) % 5);
  size_t c = enc(sym, 4000, coded, cap);
  REQUIRE(c > 0);
  for (size_t cut = 0; cut < c; cut++)
    CHECK(dec(coded, cut, back, 4000) != 0);
  return c;
}

static void test_rans(void) {
  uint8_t sym[5000], coded[6000], back[5000];
  /* one symbol: a few bytes */
  memset(sym, 7, sizeof sym);
  size_t c = oi__rans_encode(sym, sizeof sym, coded, sizeof coded);
  CHECK(c > 0 && c < 24); /* the table (4 bytes) and the four states */
  CHECK(oi__rans_decode(coded, c, back, sizeof sym) == 0 && !memcmp(back, sym, sizeof sym));
  /* n = 1, and every symbol once or more (uniform: does not fit in n bytes) */
  sym[0] = 200;
  c = oi__rans_encode(sym, 1, coded, sizeof coded);
  CHECK(c > 0 && oi__rans_decode(coded, c, back, 1) == 0 && back[0] == 200);
  for (size_t i = 0; i < sizeof sym; i++)
    sym[i] = (uint8_t)ct_rand(&seed);
  CHECK(oi__rans_encode(sym, sizeof sym, coded, sizeof sym) == 0);
  c = oi__rans_encode(sym, sizeof sym, coded, sizeof coded);
  CHECK(c > sizeof sym && oi__rans_decode(coded, c, back, sizeof sym) == 0 &&
        !memcmp(back, sym, sizeof sym));
  /* skewed: 255 rare symbols and one common (frequencies normalised to sum, none lost) */
  for (size_t i = 0; i < sizeof sym; i++)
    sym[i] = i < 255 ? (uint8_t)i : 255;
  c = oi__rans_encode(sym, sizeof sym, coded, sizeof coded);
  CHECK(c > 0 && oi__rans_decode(coded, c, back, sizeof sym) == 0 &&
        !memcmp(back, sym, sizeof sym));
  c = coded_4000_cuts_refused(oi__rans_encode, oi__rans_decode, sym, coded, sizeof coded, back);
  /* the stream is used exactly: one symbol more or fewer is refused */
  CHECK(oi__rans_decode(coded, c, back, 3999) != 0);
  CHECK(oi__rans_decode(coded, c, back, 4001) != 0);
  CHECK(oi__rans_decode(coded, c, back, 4000) == 0 && !memcmp(back, sym, 4000));
}

/* The wide stream: lengths that fill no round, one round, part of the last
 * round; one symbol, every symbol, skewed; every truncation, one symbol
 * more or fewer, a changed word or state refused. */
static void test_rans32(void) {
  static uint8_t sym[70000], coded[72000], back[70001]; /* (n + 1 decoded below) */
  const size_t lens[] = {1, 31, 32, 33, 1000, 4096, 70000};
  for (size_t t = 0; t < sizeof lens / sizeof lens[0]; t++) {
    size_t n = lens[t];
    for (size_t i = 0; i < n; i++) /* about 2.7 bits a symbol, as KV's exponents */
      sym[i] = (uint8_t)(118 + (ct_rand(&seed) % 8) * (ct_rand(&seed) % 3));
    size_t c = oi__rans32_encode(sym, n, coded, sizeof coded);
    CHECK(c > 0 && oi__rans32_decode(coded, c, back, n) == 0 && !memcmp(back, sym, n));
    if (n >= 4096) CHECK(c < n / 2); /* fewer than 4 bits a symbol */
    /* (a stream of one distinct symbol, frequency 4096, decodes more of
     * it from an unused state: the frame says how many there are) */
    if (n > 1) CHECK(oi__rans32_decode(coded, c, back, n + 1) != 0);
    if (n > 1) CHECK(oi__rans32_decode(coded, c, back, n - 1) != 0);
  }
  /* one symbol: the table and the 32 states */
  memset(sym, 7, 5000);
  size_t c = oi__rans32_encode(sym, 5000, coded, sizeof coded);
  CHECK(c > 0 && c <= 4 + 4 * OI_RANS32_LANES);
  CHECK(oi__rans32_decode(coded, c, back, 5000) == 0 && !memcmp(back, sym, 5000));
  /* uniform bytes do not fit in n bytes; with room they round-trip */
  for (size_t i = 0; i < 5000; i++)
    sym[i] = (uint8_t)ct_rand(&seed);
  CHECK(oi__rans32_encode(sym, 5000, coded, 5000) == 0);
  c = oi__rans32_encode(sym, 5000, coded, sizeof coded);
  CHECK(c > 5000 && oi__rans32_decode(coded, c, back, 5000) == 0 && !memcmp(back, sym, 5000));
  /* skewed: 255 rare symbols and one common (its frequency near 4096) */
  for (size_t i = 0; i < 70000; i++)
    sym[i] = i < 255 ? (uint8_t)i : 255;
  c = oi__rans32_encode(sym, 70000, coded, sizeof coded);
  CHECK(c > 0 && oi__rans32_decode(coded, c, back, 70000) == 0 && !memcmp(back, sym, 70000));
  /* damage */
  c = coded_4000_cuts_refused(oi__rans32_encode, oi__rans32_decode, sym, coded, sizeof coded, back);
  size_t refused = 0, tried = 0;
  for (size_t at = 0; at < c; at += 7, tried++) {
    coded[at] ^= 0x10;
    refused += oi__rans32_decode(coded, c, back, 4000) != 0 || memcmp(back, sym, 4000) != 0;
    coded[at] ^= 0x10;
  }
  /* a changed bit anywhere is refused or (rarely, past the decoder's
   * checks) gives other symbols, which the frame's checksum refuses */
  printf("wide stream: %zu of %zu changed bits refused or seen\n", refused, tried);
  CHECK(refused == tried);
  CHECK(oi__rans32_decode(coded, c, back, 4000) == 0 && !memcmp(back, sym, 4000));
}

/* Values each lossy format represents come back exactly: int8 groups whose
 * amax is 127 (scale 1), fp8 blocks whose amax is 448 (scale 1) holding
 * every finite e4m3 value. */
static void test_lossy_exact(void) {
  oi_codec_shape sh = {OI_CODEC_DTYPE_BF16, 1, 2, 1, 128};
  uint16_t x[256], back[256];
  uint8_t frame[1024];
  size_t fb, out;
  for (int i = 0; i < 256; i++) {
    float v = (float)((i % 255) - 127);
    uint32_t u;
    memcpy(&u, &v, 4);
    x[i] = (uint16_t)(u >> 16);
  }
  CHECK_OK(oi__codec_encode(OI_CODEC_INT8, &sh, x, sizeof x, frame, sizeof frame, &fb));
  CHECK_OK(oi__codec_decode(frame, fb, back, sizeof back, &out));
  CHECK(!memcmp(back, x, sizeof x));
  /* e4m3: the 127 non-negative finite values and their negatives (-0 too) */
  int k = 0;
  for (int c = 0; c < 256; c++) {
    if ((c & 0x7f) == 0x7f) continue;
    int e = (c >> 3) & 15, m = c & 7;
    float v = e ? ldexpf((float)(8 + m), e - 10) : ldexpf((float)m, -9);
    if (c & 0x80) v = -v;
    uint32_t u;
    memcpy(&u, &v, 4);
    x[k++] = (uint16_t)(u >> 16);
  }
  while (k < 256)
    x[k++] = 0x43e0; /* 448 */
  CHECK_OK(oi__codec_encode(OI_CODEC_FP8, &sh, x, sizeof x, frame, sizeof frame, &fb));
  CHECK_OK(oi__codec_decode(frame, fb, back, sizeof back, &out));
  CHECK(!memcmp(back, x, sizeof x));
  /* past 448 saturates at the scale's top; a tie rounds to even (1 + 1/16 -> 1) */
  for (int i = 0; i < 256; i++)
    x[i] = 0;
  x[0] = 0x43e0; /* 448: scale 1 */
  x[1] = 0x3f88; /* 1.0625: halfway between 1 and 1.125 */
  x[2] = 0x3f98; /* 1.1875: halfway between 1.125 and 1.25 -> 1.25 */
  CHECK_OK(oi__codec_encode(OI_CODEC_FP8, &sh, x, sizeof x, frame, sizeof frame, &fb));
  CHECK_OK(oi__codec_decode(frame, fb, back, sizeof back, &out));
  CHECK(back[0] == 0x43e0 && back[1] == 0x3f80 && back[2] == 0x3fa0);
}

/* Extremes of bf16 under the lossy codecs: subnormals beside zeros (an fp8
 * scale with no finite reciprocal: found by fuzz_codec, crash-b163c2...),
 * the largest finite values (finite: fp8 takes them, int8's fp16 scales
 * cannot), nothing decoded to NaN. */
static void test_lossy_extremes(void) {
  oi_codec_shape sh = {OI_CODEC_DTYPE_BF16, 2, 4, 3, 8};
  uint16_t x[2 * 4 * 3 * 8], back[2 * 4 * 3 * 8];
  uint8_t frame[512];
  size_t fb, out;
  for (int round = 0; round < 3; round++) {
    for (size_t i = 0; i < LEN(x); i++)
      x[i] = round == 0   ? (i % 3 ? 0x0000 : 0x0001)            /* tiny subnormals and zeros */
             : round == 1 ? (uint16_t)(i % 2 ? 0x8003 : 0x0000)  /* negative subnormals */
                          : (uint16_t)(i % 2 ? 0x7f7f : 0xff7f); /* +-3.39e38 */
    for (int codec = OI_CODEC_INT8; codec < OI_CODEC_COUNT; codec++) {
      oi_status st = oi__codec_encode(codec, &sh, x, sizeof x, frame, sizeof frame, &fb);
      if (round == 2 && codec != OI_CODEC_FP8) {
        CHECK_ST(st, OI_ERR_INVALID_ARGUMENT);
        CHECK(strstr(oi_last_error(), "fp16") != NULL);
        continue;
      }
      CHECK_OK(st);
      CHECK_OK(oi__codec_decode(frame, fb, back, sizeof back, &out));
      size_t nan = 0, far = 0;
      for (size_t i = 0; i < LEN(x); i++) {
        float v = ct_bf16(x[i]), got = ct_bf16(back[i]);
        if (got != got) nan++;
        if (fabsf(got - v) > fabsf(v) / 8 + 1e-38f) far++;
      }
      CHECK(nan == 0);
      if (round == 2) CHECK(far == 0); /* fp8 keeps the largest values within 1/16 */
    }
  }
}

static uint16_t to_bf16(float v) { /* nearest even (finite v) */
  uint32_t u;
  memcpy(&u, &v, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static float f16_value(uint16_t h) {
  int e = (h >> 10) & 31, m = h & 1023;
  float v = e ? ldexpf((float)(m | 1024), e - 25) : ldexpf((float)m, -24);
  return h & 0x8000 ? -v : v;
}

/* int8-hadamard's decoded values from its payload, computed as the format
 * says (codec.h) with the Sylvester matrix's entries (-1)^popcount(i & j),
 * not the codec's butterflies: t = H q exactly, then one rounding of
 * t * 2^-(log2(b) - floor(log2(b) / 2)) * scale, then bf16. */
static void int8h_reference(const oi_codec_shape *sh, const uint8_t *payload, uint16_t *out) {
  size_t groups = (size_t)sh->parts * sh->tokens * sh->heads, d = sh->head_dim;
  unsigned b = d & (0u - (unsigned)d), lg = 0;
  if (b > OI_INT8H_BLOCK_MAX) b = OI_INT8H_BLOCK_MAX;
  while ((1u << lg) < b)
    lg++;
  const int8_t *q = (const int8_t *)(payload + 2 * groups);
  for (size_t g = 0; g < groups; g++) {
    uint16_t s16;
    memcpy(&s16, payload + 2 * g, 2);
    double step = ldexp(f16_value(s16), -(int)(lg - lg / 2));
    for (size_t at = 0; at < d; at += b)
      for (unsigned i = 0; i < b; i++) {
        long t = 0;
        for (unsigned j = 0; j < b; j++)
          t += (__builtin_popcount(i & j) & 1 ? -1 : 1) * q[g * d + at + j];
        out[g * d + at + i] = to_bf16((float)((double)t * step)); /* (exact in double) */
      }
  }
}

/* int8-hadamard: its frames are format 3 (the others stay 2) and a frame
 * that says an earlier format is refused; the decoder matches a reference
 * of the format over head_dims of every transform block (1 for an odd
 * head_dim, where the payload is int8's, 16, 32, 64, 128, and 256 twice
 * for 512 and four times for 1024, whose group is past the encoder's
 * stack); values the rotation represents come back exactly. */
static void test_int8_hadamard(void) {
  static const uint16_t dims[] = {3, 80, 96, 64, 128, 512, 1024};
  for (size_t k = 0; k < LEN(dims); k++) {
    oi_codec_shape sh = {OI_CODEC_DTYPE_BF16, 2, 3, 2, dims[k]};
    size_t n = (size_t)sh.parts * sh.tokens * sh.heads * sh.head_dim;
    uint16_t *x = malloc(2 * n), *back = malloc(2 * n), *ref = malloc(2 * n);
    size_t cap = oi__codec_bound(OI_CODEC_INT8_HADAMARD, &sh, 2 * n);
    uint8_t *frame = malloc(cap), *plain = malloc(cap);
    REQUIRE(x && back && ref && frame && plain);
    for (size_t i = 0; i < n; i++) /* values near 1, every 16th channel 30x larger */
      x[i] = to_bf16(((float)(ct_rand(&seed) % 2001) / 1000.0f - 1.0f) * (i % 16 == 5 ? 30 : 1));
    size_t fb, pb, out;
    CHECK_OK(oi__codec_encode(OI_CODEC_INT8_HADAMARD, &sh, x, 2 * n, frame, cap, &fb));
    CHECK_OK(oi__codec_encode(OI_CODEC_INT8, &sh, x, 2 * n, plain, cap, &pb));
    CHECK(fb == cap && pb == fb && frame[4] == 3 && plain[4] == 2 && frame[5] == 4);
    CHECK_OK(oi__codec_decode(frame, fb, back, 2 * n, &out));
    int8h_reference(&sh, frame + OI_CODEC_HEADER_BYTES, ref);
    CHECK(out == 2 * n && !memcmp(back, ref, 2 * n));
    /* an odd head_dim has no rotation: int8's payload */
    if (dims[k] == 3)
      CHECK(!memcmp(frame + OI_CODEC_HEADER_BYTES, plain + OI_CODEC_HEADER_BYTES,
                    fb - OI_CODEC_HEADER_BYTES));
    else
      CHECK(memcmp(frame + OI_CODEC_HEADER_BYTES, plain + OI_CODEC_HEADER_BYTES,
                   fb - OI_CODEC_HEADER_BYTES) != 0);
    /* the same frame claiming format 2 (checksum recomputed): refused */
    frame[4] = 2;
    refix(frame, fb);
    CHECK_ST(oi__codec_decode(frame, fb, back, 2 * n, &out), OI_ERR_PROTOCOL);
    CHECK(strstr(oi_last_error(), "predates") != NULL);
    frame[4] = OI_CODEC_VERSION + 1;
    refix(frame, fb);
    CHECK_ST(oi__codec_decode(frame, fb, back, 2 * n, &out), OI_ERR_VERSION);
    /* A head whose channels are all c rotates to one value (c * b / 2^k
     * in channel 0 of each block), and x = 127 * 2^-m * (H's columns 1 and
     * 2) to 127 and 127 in channels 1 and 2: both come back exactly. */
    unsigned b = oi__int8h_block(dims[k]), lg = 0;
    while ((1u << lg) < b)
      lg++;
    float unit = ldexpf(127.0f, -(int)(lg - lg / 2));
    for (size_t g = 0; g < n / dims[k]; g++)
      for (size_t c = 0; c < dims[k]; c++) {
        unsigned i = (unsigned)(c % b);
        float v = g % 2 ? 0.375f * (float)(1 + g)
                        : unit * ((float)(__builtin_popcount(i & 1) & 1 ? -1 : 1) +
                                  (float)(__builtin_popcount(i & 2) & 1 ? -1 : 1));
        x[g * dims[k] + c] = to_bf16(v);
      }
    CHECK_OK(oi__codec_encode(OI_CODEC_INT8_HADAMARD, &sh, x, 2 * n, frame, cap, &fb));
    CHECK_OK(oi__codec_decode(frame, fb, back, 2 * n, &out));
    CHECK(!memcmp(back, x, 2 * n));
    free(x), free(back), free(ref), free(frame), free(plain);
  }
  CHECK(oi__int8h_block(64) == 64 && oi__int8h_block(96) == 32 && oi__int8h_block(576) == 64 &&
        oi__int8h_block(1024) == OI_INT8H_BLOCK_MAX && oi__int8h_block(7) == 1);
}

/* The planes code (mode 3): its frames are format 4 and decode; the same
 * frame claiming format 3 (checksum recomputed) is refused; bytes that do
 * not compress stay raw (mode 0) in a frame of the codec's own format. */
static void test_planes_frames(void) {
  oi_codec_shape sh = {OI_CODEC_DTYPE_BF16, 2, 16, 3, 64};
  size_t n = 12288, cap = oi__codec_bound(OI_CODEC_LOSSLESS, &sh, n), fb = 0, out = 0;
  uint16_t *x = malloc(n);
  uint8_t *f = malloc(cap), *back = malloc(n);
  REQUIRE(x && f && back);
  for (size_t i = 0; i < n / 2; i++)
    x[i] = (uint16_t)(0x3c00 + ct_rand(&seed) % 0x500) | (uint16_t)(ct_rand(&seed) & 0x8000);
  CHECK_OK(oi__codec_encode_planes(&sh, x, n, f, cap, &fb));
  oi_codec_info in;
  CHECK_OK(oi__codec_info_of(f, fb, &in));
  CHECK(in.version == OI_LOSSLESS_PLANES_VERSION && f[OI_CODEC_HEADER_BYTES] == 3 && fb < n);
  CHECK_OK(oi__codec_decode(f, fb, back, n, &out));
  CHECK(out == n && !memcmp(back, x, n));
  f[4] = 3;
  refix(f, fb);
  CHECK_ST(oi__codec_decode(f, fb, back, n, &out), OI_ERR_PROTOCOL);
  CHECK(strstr(oi_last_error(), "predates") != NULL);
  for (size_t i = 0; i < n / 2; i++)
    x[i] = (uint16_t)ct_rand(&seed);
  CHECK_OK(oi__codec_encode_planes(NULL, x, n, f, cap, &fb));
  CHECK_OK(oi__codec_info_of(f, fb, &in));
  CHECK(in.version == 2 && f[OI_CODEC_HEADER_BYTES] == 0);
  CHECK_OK(oi__codec_decode(f, fb, back, n, &out));
  CHECK(out == n && !memcmp(back, x, n));
  free(x);
  free(f);
  free(back);
}

int main(void) {
  RUN_TEST(test_sizes_and_patterns);
  RUN_TEST(test_incompressible_bound);
  RUN_TEST(test_parts_tables);
  RUN_TEST(test_nan_inf);
  RUN_TEST(test_bad_arguments);
  RUN_TEST(test_corruption);
  RUN_TEST(test_forged);
  RUN_TEST(test_payload_junk);
  RUN_TEST(test_rans);
  RUN_TEST(test_rans32);
  RUN_TEST(test_lossy_exact);
  RUN_TEST(test_lossy_extremes);
  RUN_TEST(test_int8_hadamard);
  RUN_TEST(test_planes_frames);
  TEST_EXIT();
}
