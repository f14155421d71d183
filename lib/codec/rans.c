/* Order-0 rANS over bytes (see rans.h for the stream format). After the
 * byte-wise rANS of F. Giesen's public-domain ryg_rans: states live in
 * [L, 256 L) with L = 2^23; the encoder runs backwards over the symbols and
 * writes backwards, the decoder runs forwards and reads forwards. */
#include "codec/rans.h"

#include <string.h>

#define PROB_SCALE (1u << OI_RANS_PROB_BITS)
#define PROB_MASK (PROB_SCALE - 1)
#define RANS_L (1u << 23)
#define NS 4 /* interleaved states (the decoder's fast loop is written for 4) */

/* Normalises counts (of n symbols) to frequencies summing to PROB_SCALE,
 * every present symbol at least 1. */
static void normalise(const uint32_t count[256], size_t n, uint32_t freq[256]) {
  uint32_t sum = 0;
  int largest = -1;
  for (int s = 0; s < 256; s++) {
    freq[s] = 0;
    if (!count[s]) continue;
    uint64_t f = ((uint64_t)count[s] * PROB_SCALE + n / 2) / n;
    freq[s] = f ? (uint32_t)f : 1;
    sum += freq[s];
    if (largest < 0 || count[s] > count[largest]) largest = s;
  }
  if (sum < PROB_SCALE) {
    freq[largest] += PROB_SCALE - sum;
    return;
  }
  /* Too many: take from the largest frequencies, one at a time, never
   * below 1 (at most 256 symbols present, so this ends). */
  while (sum > PROB_SCALE) {
    int big = -1;
    for (int s = 0; s < 256; s++)
      if (freq[s] > 1 && (big < 0 || freq[s] > freq[big])) big = s;
    uint32_t take = sum - PROB_SCALE;
    uint32_t room = freq[big] - freq[big] / 2;
    if (take > room) take = room;
    if (!take) take = 1;
    freq[big] -= take;
    sum -= take;
  }
}

static size_t put_leb(uint8_t *p, uint32_t v) {
  size_t i = 0;
  while (v >= 0x80) {
    p[i++] = (uint8_t)(v | 0x80);
    v >>= 7;
  }
  p[i++] = (uint8_t)v;
  return i;
}

/* A symbol's encoder constants: division by its frequency as a multiply
 * by a reciprocal and a shift (ryg_rans's RansEncSymbol). */
typedef struct enc_sym {
  uint32_t x_max, rcp_freq, bias;
  uint16_t cmpl_freq, rcp_shift;
} enc_sym;

static void enc_sym_init(enc_sym *e, uint32_t start, uint32_t freq) {
  e->x_max = ((RANS_L >> OI_RANS_PROB_BITS) << 8) * freq;
  e->cmpl_freq = (uint16_t)(PROB_SCALE - freq);
  if (freq < 2) {
    e->rcp_freq = ~0u;
    e->rcp_shift = 0;
    e->bias = start + PROB_SCALE - 1;
  } else {
    uint32_t shift = 0;
    while (freq > (1u << shift))
      shift++;
    e->rcp_freq = (uint32_t)(((1ull << (shift + 31)) + freq - 1) / freq);
    e->rcp_shift = (uint16_t)(shift - 1);
    e->bias = start;
  }
}

/* Renormalises then encodes one symbol; false when the output would pass
 * `limit` (writing backwards). Renormalisation writes 0, 1 or 2 bytes
 * without a branch: both candidate bytes are stored, the pointer moves by
 * the count (a byte stored below it is overwritten by the next symbol's). */
static inline int enc_put(uint32_t *x, uint8_t **ptr, const uint8_t *limit, const enc_sym *e) {
  uint32_t v = *x;
  uint8_t *p = *ptr;
  if (p - limit < 2) return 0;
  uint32_t b = (v >= e->x_max) + ((uint64_t)v >= (uint64_t)e->x_max << 8);
  p[-1] = (uint8_t)v;
  p[-2] = (uint8_t)(v >> 8);
  *ptr = p - b;
  v = (uint32_t)((uint64_t)v >> (8 * b));
  uint32_t q = (uint32_t)(((uint64_t)v * e->rcp_freq) >> 32) >> e->rcp_shift;
  *x = v + e->bias + q * e->cmpl_freq;
  return 1;
}

size_t oi__rans_encode(const uint8_t *sym, size_t n, uint8_t *dst, size_t cap) {
  if (!n) return 0;
  uint32_t count[256] = {0}, freq[256];
  for (size_t i = 0; i < n; i++)
    count[sym[i]]++;
  normalise(count, n, freq);
  int lo = 0, hi = 255;
  while (!freq[lo])
    lo++;
  while (!freq[hi])
    hi--;
  /* The table: at most 2 + 256 * 2 bytes. */
  uint8_t table[2 + 256 * 2];
  size_t tn = 0;
  table[tn++] = (uint8_t)lo;
  table[tn++] = (uint8_t)hi;
  enc_sym es[256];
  uint32_t start = 0;
  for (int s = lo; s <= hi; s++) {
    tn += put_leb(table + tn, freq[s]);
    enc_sym_init(&es[s], start, freq[s]);
    start += freq[s];
  }
  if (cap < tn + 4 * NS) return 0;
  /* Code backwards from dst's end; the stream is moved down after the table. */
  uint8_t *end = dst + cap;
  uint8_t *ptr = end;
  const uint8_t *limit = dst + tn + 4 * NS;
  /* Symbol i goes to state i % NS; backwards, so the decoder runs forwards. */
  uint32_t x[NS];
  for (int k = 0; k < NS; k++)
    x[k] = RANS_L;
  size_t i = n;
  while (i % NS) {
    i--;
    if (!enc_put(&x[i % NS], &ptr, limit, &es[sym[i]])) return 0;
  }
  while (i > 0) {
    i -= NS;
    for (int k = NS - 1; k >= 0; k--)
      if (!enc_put(&x[k], &ptr, limit, &es[sym[i + (size_t)k]])) return 0;
  }
  /* The final states, state 0 first in the stream. */
  for (int k = NS - 1; k >= 0; k--) {
    ptr -= 4;
    ptr[0] = (uint8_t)x[k];
    ptr[1] = (uint8_t)(x[k] >> 8);
    ptr[2] = (uint8_t)(x[k] >> 16);
    ptr[3] = (uint8_t)(x[k] >> 24);
  }
  size_t coded = (size_t)(end - ptr);
  memcpy(dst, table, tn);
  memmove(dst + tn, ptr, coded);
  return tn + coded;
}

int oi__rans_decode(const uint8_t *src, size_t len, uint8_t *out, size_t n) {
  if (!n || len < 2) return -1;
  const uint8_t *p = src, *end = src + len;
  int lo = *p++, hi = *p++;
  if (hi < lo) return -1;
  /* One load per symbol: slot -> symbol | (freq - 1) << 8 | (slot - start) << 20. */
  uint32_t tab[PROB_SCALE];
  uint32_t sum = 0;
  for (int s = lo; s <= hi; s++) {
    uint32_t v = 0;
    for (int shift = 0;; shift += 7) {
      if (p >= end || shift > 7) return -1;
      uint8_t b = *p++;
      v |= (uint32_t)(b & 0x7f) << shift;
      if (!(b & 0x80)) break;
    }
    if (v > PROB_SCALE || sum + v > PROB_SCALE) return -1;
    for (uint32_t j = 0; j < v; j++)
      tab[sum + j] = (uint32_t)s | (v - 1) << 8 | j << 20;
    sum += v;
  }
  if (sum != PROB_SCALE) return -1;
  if (end - p < 4 * NS) return -1;
  uint32_t x[NS];
  for (int k = 0; k < NS; k++, p += 4) {
    x[k] = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    if (x[k] < RANS_L) return -1;
  }
  size_t i = 0;
  /* A decoded state is at least 2^11 (its old value >= L = 2^23, >> 12), so
   * two bytes bring it back to L: while 2 NS bytes remain, NS symbols need
   * no bounds checks. */
#define DECODE(xv, o)                                                                              \
  do {                                                                                             \
    uint32_t e_ = tab[(xv)&PROB_MASK];                                                             \
    (xv) = (((e_ >> 8) & 0xfffu) + 1) * ((xv) >> OI_RANS_PROB_BITS) + (e_ >> 20);                  \
    (o) = (uint8_t)e_;                                                                             \
  } while (0)
  /* renormalisation without a branch: b = 0, 1 or 2 bytes */
#define RENORM(xv)                                                                                 \
  do {                                                                                             \
    uint32_t b_ = ((xv) < RANS_L) + ((xv) < (RANS_L >> 8));                                        \
    uint32_t w_ = (uint32_t)p[0] << 8 | p[1];                                                      \
    (xv) = (uint32_t)((uint64_t)(xv) << (8 * b_)) | (w_ >> (16 - 8 * b_));                         \
    p += b_;                                                                                       \
  } while (0)
  uint32_t x0 = x[0], x1 = x[1], x2 = x[2], x3 = x[3];
  while (i + NS <= n && end - p >= 2 * NS) {
    DECODE(x0, out[i]);
    RENORM(x0);
    DECODE(x1, out[i + 1]);
    RENORM(x1);
    DECODE(x2, out[i + 2]);
    RENORM(x2);
    DECODE(x3, out[i + 3]);
    RENORM(x3);
    i += NS;
  }
#undef RENORM
  x[0] = x0, x[1] = x1, x[2] = x2, x[3] = x3;
  for (; i < n; i++) {
    uint32_t *xs = &x[i % NS];
    DECODE(*xs, out[i]);
    while (*xs < RANS_L) {
      if (p >= end) return -1;
      *xs = (*xs << 8) | *p++;
    }
  }
#undef DECODE
  int ended = 1;
  for (int k = 0; k < NS; k++)
    ended &= x[k] == RANS_L;
  return (p == end && ended) ? 0 : -1;
}
