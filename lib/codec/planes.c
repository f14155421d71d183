/* The planes code of an exponent stream (planes.h): a prefix code of
 * three levels of fixed widths, each plane packed so that a warp of 32
 * lanes writes and reads it with ballots and prefix counts. */
#include "codec/planes.h"

#include <string.h>

#include "core/le_bytes.h"

#define CHUNK OI_PLANES_CHUNK

static size_t level_size(uint32_t w) { return w ? ((size_t)1 << w) - 1 : 0; }

/* The stream's length for widths w1, w2 with e1 level-1 and e2 level-2
 * escapes. */
static size_t stream_len(size_t n, uint32_t w1, uint32_t w2, size_t e1, size_t e2) {
  size_t chunks = (n + CHUNK - 1) / CHUNK, groups = (n + 31) / 32;
  return 2 + level_size(w1) + level_size(w2) + 4 * chunks + 4 * (size_t)w1 * groups +
         (e1 * w2 + 7) / 8 + e2;
}

void oi__planes_choose(const uint32_t h[256], size_t n, oi_planes_choice *c) {
  /* the symbols by count, ties by symbol (an insertion sort, stable) */
  for (int s = 0; s < 256; s++) {
    int k = s;
    while (k > 0 && h[c->sym[k - 1]] < h[s]) {
      c->sym[k] = c->sym[k - 1];
      k--;
    }
    c->sym[k] = (uint8_t)s;
  }
  size_t cum[257] = {0};
  for (int k = 0; k < 256; k++)
    cum[k + 1] = cum[k] + h[c->sym[k]];
  c->bytes = SIZE_MAX;
  for (uint32_t w1 = 1; w1 <= OI_PLANES_W_MAX; w1++) {
    size_t e1 = n - cum[level_size(w1)];
    for (uint32_t w2 = 0; w2 <= OI_PLANES_W_MAX; w2++) {
      if (w2 && !e1) break; /* nothing to code at level 2 */
      size_t e2 = w2 ? n - cum[level_size(w1) + level_size(w2)] : e1;
      size_t len = stream_len(n, w1, w2, e1, e2);
      if (len < c->bytes) c->bytes = len, c->w1 = w1, c->w2 = w2;
    }
  }
}

size_t oi__planes_encode(const uint8_t *exp, size_t n, uint8_t *dst, size_t cap) {
  uint32_t h[256] = {0};
  for (size_t i = 0; i < n; i++)
    h[exp[i]]++;
  oi_planes_choice c;
  oi__planes_choose(h, n, &c);
  if (c.bytes > cap) return 0;
  const uint32_t w1 = c.w1, w2 = c.w2;
  const size_t k1 = level_size(w1), k2 = level_size(w2);
  uint8_t code1[256], code2[256];
  memset(code1, (int)k1, sizeof code1);
  memset(code2, (int)k2, sizeof code2);
  size_t e1 = n, e2 = n;
  for (size_t k = 0; k < k1; k++)
    code1[c.sym[k]] = (uint8_t)k, e1 -= h[c.sym[k]], e2 -= h[c.sym[k]];
  for (size_t k = 0; k < k2; k++)
    code2[c.sym[k1 + k]] = (uint8_t)k, e2 -= h[c.sym[k1 + k]];
  const size_t chunks = (n + CHUNK - 1) / CHUNK, groups = (n + 31) / 32;
  dst[0] = (uint8_t)w1;
  dst[1] = (uint8_t)w2;
  memcpy(dst + 2, c.sym, k1 + k2);
  uint8_t *counts = dst + 2 + k1 + k2, *p1 = counts + 4 * chunks, *p2 = p1 + 4 * w1 * groups,
          *p3 = p2 + (e1 * w2 + 7) / 8;
  memset(p2, 0, (e1 * w2 + 7) / 8);
  size_t bit2 = 0;
  for (size_t ch = 0; ch < chunks; ch++) {
    uint32_t c1 = 0, c2 = 0;
    for (size_t g = ch * (CHUNK / 32); g < groups && g < (ch + 1) * (CHUNK / 32); g++) {
      uint32_t words[OI_PLANES_W_MAX] = {0};
      for (size_t j = 0, i = 32 * g; j < 32 && i < n; j++, i++) {
        uint32_t code = code1[exp[i]];
        for (uint32_t b = 0; b < w1; b++)
          words[b] |= (code >> b & 1u) << j;
        if (code < k1) continue;
        c1++;
        uint32_t second = w2 ? code2[exp[i]] : 0;
        for (uint32_t b = 0; b < w2; b++, bit2++)
          p2[bit2 >> 3] |= (uint8_t)((second >> b & 1u) << (bit2 & 7));
        if (second < k2) continue;
        *p3++ = exp[i];
        c2++;
      }
      for (uint32_t b = 0; b < w1; b++)
        put32(p1 + 4 * (w1 * g + b), words[b]);
    }
    put16(counts + 4 * ch, (uint16_t)c1);
    put16(counts + 4 * ch + 2, (uint16_t)c2);
  }
  return c.bytes;
}

int oi__planes_decode(const uint8_t *src, size_t len, uint8_t *out, size_t n) {
  if (len < 2 || !n) return -1;
  const uint32_t w1 = src[0], w2 = src[1];
  if (w1 < 1 || w1 > OI_PLANES_W_MAX || w2 > OI_PLANES_W_MAX) return -1;
  const size_t k1 = level_size(w1), k2 = level_size(w2);
  const size_t chunks = (n + CHUNK - 1) / CHUNK, groups = (n + 31) / 32;
  const size_t head = 2 + k1 + k2 + 4 * chunks + 4 * (size_t)w1 * groups;
  if (len < head) return -1;
  const uint8_t *sym1 = src + 2, *sym2 = sym1 + k1, *counts = sym2 + k2, *p1 = counts + 4 * chunks;
  size_t e1 = 0, e2 = 0;
  for (size_t ch = 0; ch < chunks; ch++) {
    size_t c1 = get16(counts + 4 * ch), c2 = get16(counts + 4 * ch + 2);
    size_t in_chunk = n - ch * CHUNK < CHUNK ? n - ch * CHUNK : CHUNK;
    if (c1 > in_chunk || c2 > c1 || (!w2 && c2 != c1)) return -1;
    e1 += c1;
    e2 += c2;
  }
  const size_t bytes2 = (e1 * w2 + 7) / 8;
  if (len != head + bytes2 + e2) return -1;
  const uint8_t *p2 = p1 + 4 * (size_t)w1 * groups, *p3 = p2 + bytes2;
  if (bytes2 && (e1 * w2) % 8 && p2[bytes2 - 1] >> ((e1 * w2) % 8)) return -1; /* padding */
  size_t bit2 = 0;
  for (size_t ch = 0; ch < chunks; ch++) {
    size_t c1 = get16(counts + 4 * ch), c2 = get16(counts + 4 * ch + 2);
    for (size_t g = ch * (CHUNK / 32); g < groups && g < (ch + 1) * (CHUNK / 32); g++) {
      uint32_t words[OI_PLANES_W_MAX];
      size_t in_group = n - 32 * g < 32 ? n - 32 * g : 32;
      for (uint32_t b = 0; b < w1; b++) {
        words[b] = get32(p1 + 4 * (w1 * g + b));
        if (in_group < 32 && words[b] >> in_group) return -1; /* codes past n are 0 */
      }
      for (size_t j = 0, i = 32 * g; j < in_group; j++, i++) {
        uint32_t code = 0;
        for (uint32_t b = 0; b < w1; b++)
          code |= (words[b] >> j & 1u) << b;
        if (code < k1) {
          out[i] = sym1[code];
          continue;
        }
        if (!c1--) return -1;
        uint32_t second = 0;
        for (uint32_t b = 0; b < w2; b++, bit2++)
          second |= (uint32_t)(p2[bit2 >> 3] >> (bit2 & 7) & 1u) << b;
        if (second < k2) {
          out[i] = sym2[second];
          continue;
        }
        if (!c2--) return -1;
        out[i] = *p3++;
      }
    }
    if (c1 || c2) return -1;
  }
  return 0;
}
