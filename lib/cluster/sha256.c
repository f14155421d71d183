/* SHA-256 as specified in FIPS 180-4 (section 6.2), HMAC as in RFC 2104.
 * The compression function runs on the CPU's SHA extensions (x86 SHA-NI)
 * where it has them, about five times faster than the portable code: every
 * directory entry a node reads has its HMAC checked (docs/cluster.md). */
#include "cluster/sha256.h"

#include <stdbool.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#define OI_SHA_NI 1
#endif

static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

static inline uint32_t rotr(uint32_t x, unsigned n) { return (x >> n) | (x << (32 - n)); }

static void compress_portable(uint32_t h[8], const uint8_t *p) {
  uint32_t w[64];
  for (int t = 0; t < 16; t++)
    w[t] = (uint32_t)p[4 * t] << 24 | (uint32_t)p[4 * t + 1] << 16 | (uint32_t)p[4 * t + 2] << 8 |
           (uint32_t)p[4 * t + 3];
  for (int t = 16; t < 64; t++) {
    uint32_t s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
    uint32_t s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
    w[t] = w[t - 16] + s0 + w[t - 7] + s1;
  }
  uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
  for (int t = 0; t < 64; t++) {
    uint32_t S1 = rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25);
    uint32_t ch = (e & f) ^ (~e & g);
    uint32_t t1 = k + S1 + ch + K[t] + w[t];
    uint32_t S0 = rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22);
    uint32_t maj = (a & b) ^ (a & c) ^ (b & c);
    uint32_t t2 = S0 + maj;
    k = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  h[0] += a;
  h[1] += b;
  h[2] += c;
  h[3] += d;
  h[4] += e;
  h[5] += f;
  h[6] += g;
  h[7] += k;
}

#ifdef OI_SHA_NI
/* The 64 rounds on SHA-NI: the state as ABEF and CDGH in two registers,
 * the message schedule four words at a time (sha256msg1 adds sigma0 of the
 * next words to W[t-16], the alignr brings in W[t-7], sha256msg2 adds
 * sigma1), two rounds per sha256rnds2. */
__attribute__((target("sha,sse4.1,ssse3"))) static void compress_ni(uint32_t h[8],
                                                                    const uint8_t *p) {
  const __m128i bswap = _mm_set_epi64x(0x0c0d0e0f08090a0bll, 0x0405060700010203ll);
  __m128i dcba = _mm_loadu_si128((const __m128i *)&h[0]);
  __m128i hgfe = _mm_loadu_si128((const __m128i *)&h[4]);
  __m128i badc = _mm_shuffle_epi32(dcba, 0xB1);
  __m128i efgh = _mm_shuffle_epi32(hgfe, 0x1B);
  __m128i abef = _mm_alignr_epi8(badc, efgh, 8);
  __m128i cdgh = _mm_blend_epi16(efgh, badc, 0xF0);
  const __m128i abef0 = abef, cdgh0 = cdgh;
  __m128i w[4];
  for (int i = 0; i < 16; i++) {
    if (i < 4) {
      w[i] = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p + 16 * i)), bswap);
    } else {
      __m128i t = _mm_sha256msg1_epu32(w[i & 3], w[(i + 1) & 3]);
      t = _mm_add_epi32(t, _mm_alignr_epi8(w[(i + 3) & 3], w[(i + 2) & 3], 4));
      w[i & 3] = _mm_sha256msg2_epu32(t, w[(i + 3) & 3]);
    }
    __m128i k = _mm_add_epi32(w[i & 3], _mm_loadu_si128((const __m128i *)&K[4 * i]));
    cdgh = _mm_sha256rnds2_epu32(cdgh, abef, k);
    abef = _mm_sha256rnds2_epu32(abef, cdgh, _mm_shuffle_epi32(k, 0x0E));
  }
  abef = _mm_add_epi32(abef, abef0);
  cdgh = _mm_add_epi32(cdgh, cdgh0);
  __m128i feba = _mm_shuffle_epi32(abef, 0x1B);
  __m128i dchg = _mm_shuffle_epi32(cdgh, 0xB1);
  _mm_storeu_si128((__m128i *)&h[0], _mm_blend_epi16(feba, dchg, 0xF0));
  _mm_storeu_si128((__m128i *)&h[4], _mm_alignr_epi8(dchg, feba, 8));
}

static bool cpu_has_sha_ni(void) {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_SSE4_1) || !(c & bit_SSSE3)) return false;
  return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b & bit_SHA);
}
#endif

/* -1: not decided yet; 0: portable; 1: SHA-NI. Decided once, at the first
 * use (a benign race: every thread decides the same). */
static int g_use_ni = -1;

static void compress(uint32_t h[8], const uint8_t *p) {
#ifdef OI_SHA_NI
  int use = __atomic_load_n(&g_use_ni, __ATOMIC_RELAXED);
  if (use < 0) {
    use = cpu_has_sha_ni();
    __atomic_store_n(&g_use_ni, use, __ATOMIC_RELAXED);
  }
  if (use) {
    compress_ni(h, p);
    return;
  }
#endif
  compress_portable(h, p);
}

bool oi__sha256_accelerated(int force) {
#ifdef OI_SHA_NI
  if (force >= 0)
    __atomic_store_n(&g_use_ni, force && cpu_has_sha_ni(), __ATOMIC_RELAXED);
  else if (__atomic_load_n(&g_use_ni, __ATOMIC_RELAXED) < 0)
    __atomic_store_n(&g_use_ni, (int)cpu_has_sha_ni(), __ATOMIC_RELAXED);
  return __atomic_load_n(&g_use_ni, __ATOMIC_RELAXED) == 1;
#else
  (void)force;
  return false;
#endif
}

void oi__sha256_init(oi_sha256 *s) {
  static const uint32_t H0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  memcpy(s->h, H0, sizeof(H0));
  s->bytes = 0;
  s->fill = 0;
}

void oi__sha256_update(oi_sha256 *s, const void *data, size_t len) {
  const uint8_t *p = data;
  s->bytes += len;
  if (s->fill) {
    size_t take = OI_SHA256_BLOCK - s->fill;
    if (take > len) take = len;
    memcpy(s->buf + s->fill, p, take);
    s->fill += take;
    p += take;
    len -= take;
    if (s->fill < OI_SHA256_BLOCK) return;
    compress(s->h, s->buf);
    s->fill = 0;
  }
  for (; len >= OI_SHA256_BLOCK; p += OI_SHA256_BLOCK, len -= OI_SHA256_BLOCK)
    compress(s->h, p);
  memcpy(s->buf, p, len);
  s->fill = len;
}

void oi__sha256_final(oi_sha256 *s, uint8_t out[OI_SHA256_LEN]) {
  uint64_t bits = s->bytes * 8;
  s->buf[s->fill++] = 0x80;
  if (s->fill > OI_SHA256_BLOCK - 8) {
    memset(s->buf + s->fill, 0, OI_SHA256_BLOCK - s->fill);
    compress(s->h, s->buf);
    s->fill = 0;
  }
  memset(s->buf + s->fill, 0, OI_SHA256_BLOCK - 8 - s->fill);
  for (int i = 0; i < 8; i++)
    s->buf[OI_SHA256_BLOCK - 1 - i] = (uint8_t)(bits >> (8 * i));
  compress(s->h, s->buf);
  for (int i = 0; i < 8; i++) {
    out[4 * i] = (uint8_t)(s->h[i] >> 24);
    out[4 * i + 1] = (uint8_t)(s->h[i] >> 16);
    out[4 * i + 2] = (uint8_t)(s->h[i] >> 8);
    out[4 * i + 3] = (uint8_t)s->h[i];
  }
  memset(s, 0, sizeof(*s));
}

void oi__sha256(const void *data, size_t len, uint8_t out[OI_SHA256_LEN]) {
  oi_sha256 s;
  oi__sha256_init(&s);
  oi__sha256_update(&s, data, len);
  oi__sha256_final(&s, out);
}

void oi__hmac_sha256_init(oi_hmac_sha256 *h, const void *key, size_t key_len) {
  uint8_t k[OI_SHA256_BLOCK] = {0}, pad[OI_SHA256_BLOCK];
  if (key_len > OI_SHA256_BLOCK)
    oi__sha256(key, key_len, k);
  else if (key_len)
    memcpy(k, key, key_len);
  for (int i = 0; i < OI_SHA256_BLOCK; i++)
    pad[i] = k[i] ^ 0x36;
  oi__sha256_init(&h->inner);
  oi__sha256_update(&h->inner, pad, sizeof(pad));
  for (int i = 0; i < OI_SHA256_BLOCK; i++)
    pad[i] = k[i] ^ 0x5c;
  oi__sha256_init(&h->outer);
  oi__sha256_update(&h->outer, pad, sizeof(pad));
  memset(k, 0, sizeof(k));
  memset(pad, 0, sizeof(pad));
}

void oi__hmac_sha256_update(oi_hmac_sha256 *h, const void *data, size_t len) {
  oi__sha256_update(&h->inner, data, len);
}

void oi__hmac_sha256_final(oi_hmac_sha256 *h, uint8_t out[OI_SHA256_LEN]) {
  uint8_t ih[OI_SHA256_LEN];
  oi__sha256_final(&h->inner, ih);
  oi__sha256_update(&h->outer, ih, sizeof(ih));
  oi__sha256_final(&h->outer, out);
  memset(ih, 0, sizeof(ih));
}

void oi__hmac_sha256(const void *key, size_t key_len, const void *data, size_t len,
                     uint8_t out[OI_SHA256_LEN]) {
  oi_hmac_sha256 h;
  oi__hmac_sha256_init(&h, key, key_len);
  oi__hmac_sha256_update(&h, data, len);
  oi__hmac_sha256_final(&h, out);
}

int oi__ct_equal(const void *a, const void *b, size_t n) {
  const volatile uint8_t *x = a, *y = b;
  uint8_t d = 0;
  for (size_t i = 0; i < n; i++)
    d |= x[i] ^ y[i];
  return d == 0;
}
