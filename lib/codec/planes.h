/* The planes code of an exponent stream: a prefix code of fixed widths
 * whose every plane a GPU packs and unpacks with warp ballots, every chunk
 * of 1,024 exponents independently of the others (lib/codec/planes.c;
 * docs/codecs.md "The planes code"). Pure functions over caller buffers.
 *
 * A stream coding n exponents (n >= 1), C = ceil(n / 1024) chunks:
 *   w1 u8 (1..7), w2 u8 (0..7)
 *   the 2^w1 - 1 level-1 symbols, then the 2^w2 - 1 level-2 symbols (u8
 *     each; none when w2 is 0): code i of a level is its i-th symbol, code
 *     2^w - 1 (all ones) an escape to the next level; level 3 is the raw
 *     byte
 *   per chunk: e1 u16 (its level-1 escapes), e2 u16 (its level-2 escapes;
 *     e2 == e1 when w2 is 0), little-endian
 *   plane 1: ceil(n / 32) groups of w1 words (u32, little-endian): bit j of
 *     the group's word b is bit b of the code of exponent 32 g + j (the
 *     codes past n are 0)
 *   plane 2: the level-2 codes of the stream's level-1 escapes in order,
 *     w2 bits each, least significant bit first, to a whole byte (the bits
 *     after the last code 0)
 *   plane 3: the raw bytes of the level-2 escapes in order
 * Chunk c's escapes start at the sums of the counts of the chunks before
 * it, so a decoder of chunk c needs only those counts.
 * The decoder checks every length, that each chunk's escapes are its
 * counts and that the padding is zeros, so a damaged stream is refused,
 * never read past. */
#ifndef OI_CODEC_PLANES_H
#define OI_CODEC_PLANES_H

#include <stddef.h>
#include <stdint.h>

#define OI_PLANES_CHUNK 1024u
#define OI_PLANES_W_MAX 7u

/* The widths and symbols the encoder chooses for a stream of histogram h
 * over n exponents: the shortest stream over every (w1, w2), the symbols
 * by count (ties: the smaller symbol first). */
typedef struct oi_planes_choice {
  uint32_t w1, w2;
  uint8_t sym[256]; /* by count: level 1 is sym[0 .. 2^w1 - 1), level 2 the next 2^w2 - 1 */
  size_t bytes;     /* the stream's length */
} oi_planes_choice;

void oi__planes_choose(const uint32_t h[256], size_t n, oi_planes_choice *c);

/* Codes exp[0..n) (n >= 1) into dst[0..cap). @return the stream's length,
 * or 0 when it would not fit in cap (the caller then stores them raw). */
size_t oi__planes_encode(const uint8_t *exp, size_t n, uint8_t *dst, size_t cap);

/* Decodes exactly n exponents (n >= 1) from src[0..len) into out.
 * @return 0, or -1 when the stream is damaged (out's contents then
 * unspecified). */
int oi__planes_decode(const uint8_t *src, size_t len, uint8_t *out, size_t n);

#endif
