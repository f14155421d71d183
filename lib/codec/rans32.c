/* The wide rANS stream (rans.h, "the wide stream"): 32 interleaved states
 * renormalised by 16-bit words, so that a warp decodes a round of 32
 * symbols at once, each lane finding its word by a prefix count
 * (kernels/codec.cu). States live in [L, 2^32) with L = 2^16: a decoded
 * state is at least its frequency times 2^4, so one word brings it back to
 * L. The encoder runs backwards over the symbols (within a round, state 31
 * first) and writes backwards; the decoder runs forwards. */
#include "codec/rans.h"

#include "core/le_bytes.h"

#define LANES OI_RANS32_LANES
#define RANS_L (1u << 16)

size_t oi__rans32_encode(const uint8_t *sym, size_t n, uint8_t *dst, size_t cap) {
  if (!n) return 0;
  uint32_t freq[256], start[256];
  uint8_t table[OI_RANS_TABLE_MAX];
  int lo, hi;
  size_t tn = oi__rans_table_write(sym, n, table, freq, &lo, &hi);
  for (int s = lo, at = 0; s <= hi; at += (int)freq[s], s++)
    start[s] = (uint32_t)at;
  size_t head = tn + 4 * LANES;
  if (cap < head) return 0;
  /* Words backwards from dst's end, never below the table and states. */
  uint8_t *end = dst + cap, *ptr = end;
  const uint8_t *limit = dst + head;
  uint32_t x[LANES];
  for (int k = 0; k < LANES; k++)
    x[k] = RANS_L;
  for (size_t r = (n + LANES - 1) / LANES; r-- > 0;) {
    const uint8_t *s = sym + r * LANES;
    int top = n - r * LANES < LANES ? (int)(n - r * LANES) : LANES;
    for (int k = top - 1; k >= 0; k--) {
      uint32_t f = freq[s[k]], v = x[k];
      /* past (L >> 12 << 16) * f the encoded state would pass 2^32 */
      if ((uint64_t)v >= (uint64_t)f << 20) {
        if (ptr - limit < 2) return 0;
        ptr -= 2;
        ptr[0] = (uint8_t)v;
        ptr[1] = (uint8_t)(v >> 8);
        v >>= 16;
      }
      x[k] = ((v / f) << OI_RANS_PROB_BITS) + v % f + start[s[k]];
    }
  }
  return oi__rans_finish(dst, table, tn, x, LANES, ptr, end);
}

int oi__rans32_decode(const uint8_t *src, size_t len, uint8_t *out, size_t n) {
  if (!n) return -1;
  const uint8_t *p = src, *end = src + len;
  uint32_t tab[OI_RANS_PROB_SCALE];
  if (oi__rans_table_read(&p, end, tab) != 0) return -1;
  uint32_t x[LANES];
  if (oi__rans_states_read(&p, end, x, LANES, RANS_L) != 0 || (end - p) % 2) return -1;
  size_t i = 0;
  /* While a word for every lane remains, a round needs no bounds checks:
   * the 32 decodes (independent), then the words in state order. */
  while (i + LANES <= n && end - p >= 2 * LANES) {
    for (int k = 0; k < LANES; k++)
      out[i + (size_t)k] = oi__rans_decode_step(tab, &x[k]);
    for (int k = 0; k < LANES; k++) {
      uint32_t b = x[k] < RANS_L, w = get16(p);
      x[k] = b ? x[k] << 16 | w : x[k];
      p += 2 * b;
    }
    i += LANES;
  }
  for (; i < n; i++) {
    uint32_t *xs = &x[i % LANES];
    out[i] = oi__rans_decode_step(tab, xs);
    if (*xs < RANS_L) {
      if (end - p < 2) return -1;
      *xs = *xs << 16 | get16(p);
      p += 2;
    }
  }
  return (p == end && oi__rans_states_ended(x, LANES, RANS_L)) ? 0 : -1;
}
