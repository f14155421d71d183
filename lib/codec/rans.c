/* Order-0 rANS over bytes (see rans.h for the stream format). After the
 * byte-wise rANS of F. Giesen's public-domain ryg_rans: states live in
 * [L, 256 L) with L = 2^23; the encoder runs backwards over the symbols and
 * writes backwards, the decoder runs forwards and reads forwards. */
#include "codec/rans.h"

#define PROB_SCALE (1u << OI_RANS_PROB_BITS)
#define RANS_L (1u << 23)
#define NS 4 /* interleaved states (the decoder's fast loop is written for 4) */

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
  uint32_t freq[256];
  uint8_t table[OI_RANS_TABLE_MAX];
  int lo, hi;
  size_t tn = oi__rans_table_write(sym, n, table, freq, &lo, &hi);
  enc_sym es[256];
  for (int s = lo, start = 0; s <= hi; start += (int)freq[s], s++)
    enc_sym_init(&es[s], (uint32_t)start, freq[s]);
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
  return oi__rans_finish(dst, table, tn, x, NS, ptr, end);
}

int oi__rans_decode(const uint8_t *src, size_t len, uint8_t *out, size_t n) {
  if (!n) return -1;
  const uint8_t *p = src, *end = src + len;
  uint32_t tab[PROB_SCALE];
  if (oi__rans_table_read(&p, end, tab) != 0) return -1;
  uint32_t x[NS];
  if (oi__rans_states_read(&p, end, x, NS, RANS_L) != 0) return -1;
  size_t i = 0;
  /* A decoded state is at least 2^11 (its old value >= L = 2^23, >> 12), so
   * two bytes bring it back to L: while 2 NS bytes remain, NS symbols need
   * no bounds checks. */
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
    out[i] = oi__rans_decode_step(tab, &x0);
    RENORM(x0);
    out[i + 1] = oi__rans_decode_step(tab, &x1);
    RENORM(x1);
    out[i + 2] = oi__rans_decode_step(tab, &x2);
    RENORM(x2);
    out[i + 3] = oi__rans_decode_step(tab, &x3);
    RENORM(x3);
    i += NS;
  }
#undef RENORM
  x[0] = x0, x[1] = x1, x[2] = x2, x[3] = x3;
  for (; i < n; i++) {
    uint32_t *xs = &x[i % NS];
    out[i] = oi__rans_decode_step(tab, xs);
    while (*xs < RANS_L) {
      if (p >= end) return -1;
      *xs = (*xs << 8) | *p++;
    }
  }
  return (p == end && oi__rans_states_ended(x, NS, RANS_L)) ? 0 : -1;
}
