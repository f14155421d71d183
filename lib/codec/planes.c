/* The planes code of an exponent stream (planes.h): a prefix code of
 * three levels of fixed widths, each plane packed so that a warp of 32
 * lanes writes and reads it with ballots and prefix counts. */
#include "codec/planes.h"

#include <string.h>

#include "codec/codec_internal.h"
#include "core/le_bytes.h"

#define CHUNK OI_PLANES_CHUNK

static size_t level_size(uint32_t w) { return w ? ((size_t)1 << w) - 1 : 0; }

/* A group's lanes go eight at a time: lane j's code in byte j of a u64
 * (codes are below 2^7), and bit b of those eight codes is one byte of
 * plane word b. */
#define LSB_OF_BYTES 0x0101010101010101ull
/* bits at 8k (k < 8) to bit 56 + k: the terms land on distinct bits */
#define GATHER_LSBS 0x0102040810204080ull

/* Bit b of the eight codes in v, as a byte (bit k: lane k). */
static uint32_t plane_byte(uint64_t v, uint32_t b) {
  return (uint32_t)((((v >> b) & LSB_OF_BYTES) * GATHER_LSBS) >> 56);
}

/* The eight bits of x each to bit 0 of a byte (bit k: byte k). */
static uint64_t spread_bits(uint32_t x) {
  static const uint32_t nibble[16] = {0x00000000u, 0x00000001u, 0x00000100u, 0x00000101u,
                                      0x00010000u, 0x00010001u, 0x00010100u, 0x00010101u,
                                      0x01000000u, 0x01000001u, 0x01000100u, 0x01000101u,
                                      0x01010000u, 0x01010001u, 0x01010100u, 0x01010101u};
  return nibble[x & 15u] | (uint64_t)nibble[(x >> 4) & 15u] << 32;
}

/* The stream's length for widths w1, w2 with e1 level-1 and e2 level-2
 * escapes. */
static size_t stream_len(size_t n, uint32_t w1, uint32_t w2, size_t e1, size_t e2) {
  size_t chunks = (n + CHUNK - 1) / CHUNK, groups = (n + 31) / 32;
  return 2 + level_size(w1) + level_size(w2) + 4 * chunks + 4 * (size_t)w1 * groups +
         (e1 * w2 + 7) / 8 + e2;
}

void oi__planes_choose(const uint32_t h[256], size_t n, oi_planes_choice *c) {
  /* the symbols by count, ties by symbol: the present ones by an
   * insertion sort (stable), then the absent ones in order */
  int present = 0;
  for (int s = 0; s < 256; s++) {
    if (!h[s]) continue;
    int k = present++;
    while (k > 0 && h[c->sym[k - 1]] < h[s]) {
      c->sym[k] = c->sym[k - 1];
      k--;
    }
    c->sym[k] = (uint8_t)s;
  }
  for (int s = 0; s < 256; s++)
    if (!h[s]) c->sym[present++] = (uint8_t)s;
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
  uint32_t h[256];
  oi__histogram(exp, n, h);
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
  uint64_t acc = 0; /* plane 2's bits not yet written, least significant first */
  uint32_t nacc = 0;
  for (size_t ch = 0; ch < chunks; ch++) {
    uint32_t c1 = 0, c2 = 0;
    for (size_t g = ch * (CHUNK / 32); g < groups && g < (ch + 1) * (CHUNK / 32); g++) {
      uint32_t words[OI_PLANES_W_MAX] = {0};
      const size_t in_group = n - 32 * g < 32 ? n - 32 * g : 32;
      const uint8_t *e = exp + 32 * g;
      for (size_t k = 0; 8 * k < in_group; k++) {
        const size_t m = in_group - 8 * k < 8 ? in_group - 8 * k : 8;
        uint64_t v = 0; /* lane j's code in byte j; 0 past n */
        if (m == 8)
          v = (uint64_t)code1[e[8 * k]] | (uint64_t)code1[e[8 * k + 1]] << 8 |
              (uint64_t)code1[e[8 * k + 2]] << 16 | (uint64_t)code1[e[8 * k + 3]] << 24 |
              (uint64_t)code1[e[8 * k + 4]] << 32 | (uint64_t)code1[e[8 * k + 5]] << 40 |
              (uint64_t)code1[e[8 * k + 6]] << 48 | (uint64_t)code1[e[8 * k + 7]] << 56;
        else
          for (size_t j = 0; j < m; j++)
            v |= (uint64_t)code1[e[8 * k + j]] << (8 * j);
        for (uint32_t b = 0; b < w1; b++)
          words[b] |= plane_byte(v, b) << (8 * k);
      }
      uint32_t esc = ~0u; /* the lanes whose code is all ones: level-1 escapes */
      for (uint32_t b = 0; b < w1; b++)
        esc &= words[b];
      for (; esc; esc &= esc - 1) { /* the level-1 escapes, in order */
        const uint8_t x = e[__builtin_ctz(esc)];
        c1++;
        uint32_t second = w2 ? code2[x] : 0;
        acc |= (uint64_t)second << nacc;
        for (nacc += w2; nacc >= 8; nacc -= 8, acc >>= 8)
          *p2++ = (uint8_t)acc;
        if (second < k2) continue;
        *p3++ = x;
        c2++;
      }
      for (uint32_t b = 0; b < w1; b++)
        put32(p1 + 4 * (w1 * g + b), words[b]);
    }
    put16(counts + 4 * ch, (uint16_t)c1);
    put16(counts + 4 * ch + 2, (uint16_t)c2);
  }
  if (nacc) *p2 = (uint8_t)acc; /* the last bits, then zeros */
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
  uint8_t dec1[128] = {0}; /* level-1 codes to symbols (the escape's entry unused) */
  memcpy(dec1, sym1, k1);
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
      /* every lane by its level-1 symbol, then the escapes (all ones) */
      uint32_t esc = in_group < 32 ? (1u << in_group) - 1 : ~0u;
      for (uint32_t b = 0; b < w1; b++)
        esc &= words[b];
      uint8_t *o = out + 32 * g;
      for (size_t k = 0; 8 * k < in_group; k++) {
        uint64_t v = 0;
        for (uint32_t b = 0; b < w1; b++)
          v |= spread_bits(words[b] >> (8 * k) & 0xffu) << b;
        for (size_t j = 0; j < 8 && 8 * k + j < in_group; j++)
          o[8 * k + j] = dec1[v >> (8 * j) & 0xffu];
      }
      for (; esc; esc &= esc - 1) {
        if (!c1--) return -1;
        uint8_t *lane = o + __builtin_ctz(esc);
        uint32_t second = 0;
        if (w2) { /* a code spans two bytes at most */
          size_t at = bit2 >> 3;
          uint32_t two = p2[at] | (at + 1 < bytes2 ? (uint32_t)p2[at + 1] << 8 : 0u);
          second = two >> (bit2 & 7) & ((1u << w2) - 1);
          bit2 += w2;
        }
        if (second < k2) {
          *lane = sym2[second];
          continue;
        }
        if (!c2--) return -1;
        *lane = *p3++;
      }
    }
    if (c1 || c2) return -1;
  }
  return 0;
}
