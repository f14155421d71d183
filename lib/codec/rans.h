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

/* Codes sym[0..n) (n >= 1) into dst[0..cap). @return the stream's length,
 * or 0 when it would not fit in cap (the caller then stores the bytes raw). */
size_t oi__rans_encode(const uint8_t *sym, size_t n, uint8_t *dst, size_t cap);

/* Decodes exactly n symbols (n >= 1) from src[0..len) into out.
 * @return 0, or -1 when the stream is damaged (out's contents then unspecified). */
int oi__rans_decode(const uint8_t *src, size_t len, uint8_t *out, size_t n);

#endif
