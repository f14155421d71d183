/* An order-0 rANS coder of bytes (four interleaved 32-bit states, 12-bit
 * probabilities, byte-wise renormalisation), the entropy stage of the
 * lossless codec. Pure functions over caller buffers.
 *
 * A stream is its frequency table then the coded bytes:
 *   lo u8, hi u8 (the first and last symbol present), then hi - lo + 1
 *   frequencies as LEB128 (each < 2^13, summing to 4096), then the four final
 *   encoder states (4 bytes each, little-endian, state 0 first) and the
 *   renormalisation bytes in the order the decoder reads them.
 * The decoder checks every read against the stream's end, that the table
 * sums to 4096, and that every state ends where the encoder began and the
 * stream is used up, so a damaged stream is refused, never read past. */
#ifndef OI_CODEC_RANS_H
#define OI_CODEC_RANS_H

#include <stddef.h>
#include <stdint.h>

#define OI_RANS_PROB_BITS 12
#define OI_RANS_PROB_SCALE (1u << OI_RANS_PROB_BITS)
/* The longest table: lo, hi and 256 LEB128 frequencies of 2 bytes. */
#define OI_RANS_TABLE_MAX (2 + 256 * 2)

/* Counts sym[0..n) (n >= 1), normalises the counts to frequencies summing
 * to OI_RANS_PROB_SCALE (every present symbol at least 1; freq[] of the
 * others 0) and writes the table. @return its length; *lo, *hi the first
 * and last symbol present. */
size_t oi__rans_table_write(const uint8_t *sym, size_t n, uint8_t table[OI_RANS_TABLE_MAX],
                            uint32_t freq[256], int *lo, int *hi);

/* Reads a table at *src (before end) into the one-load decode table:
 * slot -> symbol | (freq - 1) << 8 | (slot - start) << 20, and moves *src
 * past it. @return 0, or -1 when it is damaged (truncated, a frequency
 * past 2^13 or the sum not OI_RANS_PROB_SCALE). */
int oi__rans_table_read(const uint8_t **src, const uint8_t *end, uint32_t tab[OI_RANS_PROB_SCALE]);

/* Reads the `ns` initial decoder states at *src (4 bytes each,
 * little-endian) into x[], each at least `low`, and moves *src past them.
 * @return 0, or -1 when they are truncated or one is below `low`. */
int oi__rans_states_read(const uint8_t **src, const uint8_t *end, uint32_t *x, int ns,
                         uint32_t low);

/* Whether every one of the `ns` states ended where the encoder began (`low`). */
int oi__rans_states_ended(const uint32_t *x, int ns, uint32_t low);

/* Decodes one symbol of state *x through a table of oi__rans_table_read
 * (before its renormalisation, which differs between the coders). */
static inline uint8_t oi__rans_decode_step(const uint32_t *tab, uint32_t *x) {
  uint32_t e = tab[*x & (OI_RANS_PROB_SCALE - 1)];
  *x = (((e >> 8) & 0xfffu) + 1) * (*x >> OI_RANS_PROB_BITS) + (e >> 20);
  return (uint8_t)e;
}

/* Ends an encode: the `ns` final states x[] are written below ptr (the
 * coded words or bytes run from ptr to end, where the encoder wrote them
 * backwards; it left room for the states above dst + tn), then the table
 * goes to dst and the rest moves down behind it. @return the stream's
 * length. */
size_t oi__rans_finish(uint8_t *dst, const uint8_t *table, size_t tn, const uint32_t *x, int ns,
                       uint8_t *ptr, const uint8_t *end);

/* Codes sym[0..n) (n >= 1) into dst[0..cap). @return the stream's length,
 * or 0 when it would not fit in cap (the caller then stores the bytes raw). */
size_t oi__rans_encode(const uint8_t *sym, size_t n, uint8_t *dst, size_t cap);

/* Decodes exactly n symbols (n >= 1) from src[0..len) into out.
 * @return 0, or -1 when the stream is damaged (out's contents then unspecified). */
int oi__rans_decode(const uint8_t *src, size_t len, uint8_t *out, size_t n);

/* The wide stream (rans32.c), for decoders that run a warp of 32 lanes in
 * step (kernels/codec.cu): 32 interleaved 32-bit states, symbol i on state
 * i % 32, states in [2^16, 2^32) renormalised by 16-bit words. A stream is
 * the same table, then the 32 final encoder states (4 bytes each,
 * little-endian, state 0 first), then the words (little-endian) in the
 * order the decoder reads them: round r decodes symbols 32 r .. 32 r + 31
 * in state order, and each state that fell below 2^16 reads the next word,
 * in state order. So the lanes of a round find their words by a prefix
 * count of the lanes that need one. The same checks as the narrow stream's.
 * 112 bytes more of states than the narrow stream: the encoder uses it for
 * streams of OI_RANS32_MIN symbols and more. */
#define OI_RANS32_LANES 32
#define OI_RANS32_MIN 8192u
size_t oi__rans32_encode(const uint8_t *sym, size_t n, uint8_t *dst, size_t cap);
int oi__rans32_decode(const uint8_t *src, size_t len, uint8_t *out, size_t n);

#endif
