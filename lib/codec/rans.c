/* Order-0 rANS over bytes (see rans.h for the stream format). After the
 * byte-wise rANS of F. Giesen's public-domain ryg_rans: states live in
 * [L, 256 L) with L = 2^23; the encoder runs backwards over the symbols and
 * writes backwards, the decoder runs forwards and reads forwards. */
#include "codec/rans.h"

#include <string.h>

#define PROB_SCALE (1u << OI_RANS_PROB_BITS)
#define PROB_MASK (PROB_SCALE - 1)
#define RANS_L (1u << 23)

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

typedef struct enc_sym {
  uint32_t freq, start, x_max;
} enc_sym;

/* Renormalises then encodes one symbol; false when the output would pass
 * `limit` (writing backwards). */
static inline int enc_put(uint32_t *x, uint8_t **ptr, const uint8_t *limit, const enc_sym *e) {
  uint32_t v = *x;
  while (v >= e->x_max) {
    if (*ptr <= limit) return 0;
    *--*ptr = (uint8_t)v;
    v >>= 8;
  }
  *x = ((v / e->freq) << OI_RANS_PROB_BITS) + (v % e->freq) + e->start;
  return 1;
}

size_t oi__rans_encode(const uint8_t *sym, size_t n, uint8_t *dst, size_t cap) {
  if (!n) return 0;
  uint32_t count[256] = {0}, freq[256];
  for (size_t i = 0; i < n; i++) count[sym[i]]++;
  normalise(count, n, freq);
  int lo = 0, hi = 255;
  while (!freq[lo]) lo++;
  while (!freq[hi]) hi--;
  /* The table: at most 2 + 256 * 2 bytes. */
  uint8_t table[2 + 256 * 2];
  size_t tn = 0;
  table[tn++] = (uint8_t)lo;
  table[tn++] = (uint8_t)hi;
  enc_sym es[256];
  uint32_t start = 0;
  for (int s = lo; s <= hi; s++) {
    tn += put_leb(table + tn, freq[s]);
    es[s].freq = freq[s];
    es[s].start = start;
    es[s].x_max = ((RANS_L >> OI_RANS_PROB_BITS) << 8) * freq[s];
    start += freq[s];
  }
  if (cap < tn + 8) return 0;
  /* Code backwards from dst's end; the stream is moved down after the table. */
  uint8_t *end = dst + cap;
  uint8_t *ptr = end;
  const uint8_t *limit = dst + tn + 8;
  uint32_t x[2] = {RANS_L, RANS_L};
  for (size_t i = n; i-- > 0;)
    if (!enc_put(&x[i & 1], &ptr, limit, &es[sym[i]])) return 0;
  /* The final states, state 0 first in the stream. */
  for (int k = 1; k >= 0; k--) {
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
  uint16_t freq[256], start[256];
  uint8_t lut[PROB_SCALE];
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
    freq[s] = (uint16_t)v;
    start[s] = (uint16_t)sum;
    if (v) memset(lut + sum, s, v);
    sum += v;
  }
  if (sum != PROB_SCALE) return -1;
  if (end - p < 8) return -1;
  uint32_t x[2];
  for (int k = 0; k < 2; k++, p += 4)
    x[k] = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
  if (x[0] < RANS_L || x[1] < RANS_L) return -1;
  for (size_t i = 0; i < n; i++) {
    uint32_t *xs = &x[i & 1];
    uint32_t v = *xs;
    uint32_t slot = v & PROB_MASK;
    uint8_t s = lut[slot];
    v = freq[s] * (v >> OI_RANS_PROB_BITS) + slot - start[s];
    while (v < RANS_L) {
      if (p >= end) return -1;
      v = (v << 8) | *p++;
    }
    *xs = v;
    out[i] = s;
  }
  return (p == end && x[0] == RANS_L && x[1] == RANS_L) ? 0 : -1;
}
