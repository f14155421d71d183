/* What the narrow and the wide rANS coder share (rans.h): the frequency
 * table that starts every stream (counts normalised to 12-bit frequencies,
 * written as lo, hi and LEB128 frequencies, read back into a one-load
 * decode table) and the stream's assembly behind it. */
#include "codec/rans.h"

#include "codec/codec_internal.h"

#include <string.h>

#include "core/le_bytes.h"

#define PROB_SCALE (1u << OI_RANS_PROB_BITS)

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

size_t oi__rans_table_write(const uint8_t *sym, size_t n, uint8_t table[OI_RANS_TABLE_MAX],
                            uint32_t freq[256], int *lo, int *hi) {
  uint32_t count[256];
  oi__histogram(sym, n, count);
  normalise(count, n, freq);
  int l = 0, h = 255;
  while (!freq[l])
    l++;
  while (!freq[h])
    h--;
  size_t tn = 0;
  table[tn++] = (uint8_t)l;
  table[tn++] = (uint8_t)h;
  for (int s = l; s <= h; s++)
    tn += put_leb(table + tn, freq[s]);
  *lo = l;
  *hi = h;
  return tn;
}

int oi__rans_table_read(const uint8_t **src, const uint8_t *end, uint32_t tab[OI_RANS_PROB_SCALE]) {
  const uint8_t *p = *src;
  if (end - p < 2) return -1;
  int lo = *p++, hi = *p++;
  if (hi < lo) return -1;
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
  *src = p;
  return 0;
}

size_t oi__rans_finish(uint8_t *dst, const uint8_t *table, size_t tn, const uint32_t *x, int ns,
                       uint8_t *ptr, const uint8_t *end) {
  for (int k = ns - 1; k >= 0; k--) { /* state 0 first in the stream */
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

int oi__rans_states_read(const uint8_t **src, const uint8_t *end, uint32_t *x, int ns,
                         uint32_t low) {
  const uint8_t *p = *src;
  if (end - p < 4 * ns) return -1;
  for (int k = 0; k < ns; k++, p += 4)
    if ((x[k] = get32(p)) < low) return -1;
  *src = p;
  return 0;
}

int oi__rans_states_ended(const uint32_t *x, int ns, uint32_t low) {
  int ended = 1;
  for (int k = 0; k < ns; k++)
    ended &= x[k] == low;
  return ended;
}
