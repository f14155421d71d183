/* What the codec's files share: the payload functions of each codec and the
 * bf16 / fp16 conversions. Internal to lib/codec. */
#ifndef OI_CODEC_CODEC_INTERNAL_H
#define OI_CODEC_CODEC_INTERNAL_H

#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "codec/codec.h"
#include "core/core.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the codec formats are little-endian; this build writes them natively"
#endif

/* Each codec's payload: encode returns the payload's length (dst has room
 * for the codec's bound), or 0 with oi_last_error() set on a refusal; decode
 * returns OI_OK or OI_ERR_PROTOCOL. */
size_t oi__lossless_bound(size_t bytes);
/* `parts`: the block's parts (the shape's, 0 if none): the exponents of
 * each may get their own table. `planes`: the exponents coded by the
 * planes code (mode 3, frames of format 4), else by rANS. */
size_t oi__lossless_encode(const uint8_t *src, size_t bytes, unsigned parts, bool planes,
                           uint8_t *dst);
/* The stream counts of a block's two candidate layouts (oi__lossless_gpu_plan):
 * false when one of them has streams that are not wide. */
bool oi__lossless_stream_counts(size_t bytes, unsigned parts, uint32_t *choice,
                                uint32_t *segs_parts, uint32_t *segs_whole);
oi_status oi__lossless_decode(const uint8_t *src, size_t len, uint8_t *dst, size_t logical);
/* h[s]: how many of sym[0..n) are s. */
void oi__histogram(const uint8_t *sym, size_t n, uint32_t h[256]);
/* A lossless payload's parts, its lengths checked (oi__lossless_parse):
 * mode 0 (exponents raw at `streams`) or 1, 2, 3 (`segs` streams from
 * `streams`, their lengths as u32 at `lens`, the k-th coding the exponents
 * [k n / segs, (k + 1) n / segs)); then the sign+mantissa plane at `sm`
 * (n bytes, then an odd block's last byte). */
typedef struct oi_lossless_layout {
  size_t n; /* elements: logical / 2 */
  unsigned mode;
  size_t segs;
  const uint8_t *lens, *streams, *sm;
} oi_lossless_layout;
oi_status oi__lossless_parse(const uint8_t *src, size_t len, size_t logical, oi_lossless_layout *l);

/* int8 and int8-hadamard (`rotate`): the same payload layout (int8.c). */
size_t oi__int8_bound(const oi_codec_shape *sh);
size_t oi__int8_encode(const oi_codec_shape *sh, const uint16_t *src, uint8_t *dst, bool rotate);
oi_status oi__int8_decode(const oi_codec_shape *sh, const uint8_t *src, size_t len, uint16_t *dst,
                          bool rotate);

size_t oi__fp8_bound(const oi_codec_shape *sh);
size_t oi__fp8_encode(const oi_codec_shape *sh, const uint16_t *src, uint8_t *dst);
oi_status oi__fp8_decode(const oi_codec_shape *sh, const uint8_t *src, size_t len, uint16_t *dst);

/* int8-hadamard's scaling after a transform of width b (a power of two):
 * 2^-floor(log2(b) / 2). */
float oi__int8h_down(unsigned b);

static inline float oi__bf16_to_f32(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* Round to nearest even (inputs are finite: the lossy codecs refuse others). */
static inline uint16_t oi__f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

/* IEEE binary16 (the int8 codec's scales): finite inputs, round to nearest even. */
static inline uint16_t oi__f32_to_f16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  float a = fabsf(f);
  if (a >= 65520.0f) return sign | 0x7c00u; /* overflows: infinity (refused by the caller) */
  if (a < 6.103515625e-05f) {               /* subnormal: multiples of 2^-24 */
    return sign | (uint16_t)nearbyintf(a * 16777216.0f);
  }
  uint32_t ua;
  memcpy(&ua, &a, 4);
  uint32_t exp = (ua >> 23) - 127 + 15, mant = ua & 0x7fffffu;
  uint32_t h = (exp << 10) | (mant >> 13);
  uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1))) h++;
  return sign | (uint16_t)h;
}

static inline float oi__f16_to_f32(uint16_t h) {
  uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  float v;
  if (exp == 0)
    v = ldexpf((float)mant, -24);
  else if (exp == 31)
    v = mant ? NAN : INFINITY;
  else
    v = ldexpf((float)(mant | 0x400), (int)exp - 25);
  return (h & 0x8000) ? -v : v;
}

/* Round to the nearest integer, ties to even, for |y| < 2^22, without a
 * library call: adding 1.5 * 2^23 leaves no fraction bits, and the addition
 * rounds in the default mode, to nearest even (the build does not use
 * -ffast-math, so the compiler keeps the sum). */
static inline float oi__round_even(float y) { return (y + 12582912.0f) - 12582912.0f; }

/* Elements of a shape (0 when a field is 0). */
static inline size_t oi__shape_elems(const oi_codec_shape *sh) {
  return (size_t)sh->parts * sh->tokens * sh->heads * sh->head_dim;
}

#endif
