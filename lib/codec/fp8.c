/* The fp8 codec's payload: OCP fp8 e4m3 ("fn": bias 7, no infinities, max
 * 448, 0x7f / 0xff NaN, never written) with one scale per part and head
 * over the block's tokens. For a shape of P parts, T tokens, H heads and D
 * channels:
 *   P*H scales, fp32 (amax / 448 over the T*D values they scale), [part][head]
 *   then P*T*H*D e4m3 codes of x / scale (round to nearest even, saturating),
 *   [part][token][head][channel]; x = e4m3 * scale, rounded to bf16. */
#include "codec/codec_internal.h"

/* v to e4m3, round to nearest even, saturating at 448 (a NaN, which the
 * encoder never passes, saturates too rather than reach an undefined cast). */
static inline uint8_t f32_to_e4m3(float v) {
  uint32_t u;
  memcpy(&u, &v, 4);
  uint8_t sign = (uint8_t)((u >> 24) & 0x80);
  u &= 0x7fffffffu;
  float a;
  memcpy(&a, &u, 4);
  if (!(a < 448.0f)) return sign | 0x7e;
  if (a < 0.015625f) /* below 2^-6: subnormals, multiples of 2^-9 (8 is 2^-6's code) */
    return sign | (uint8_t)oi__round_even(a * 512.0f);
  /* normals: keep 3 of the 23 mantissa bits, rounding to nearest even, and
   * rebias the exponent from 127 to 7 (a carry out of the mantissa goes
   * into the exponent, as it should) */
  uint32_t r = (u + 0x7ffffu + ((u >> 20) & 1u)) >> 20;
  uint32_t code = r - (120u << 3);
  return sign | (uint8_t)(code > 0x7e ? 0x7e : code);
}

static float e4m3_value(uint8_t c) {
  int exp = (c >> 3) & 15, mant = c & 7;
  float v;
  if ((c & 0x7f) == 0x7f)
    v = NAN;
  else if (!exp)
    v = ldexpf((float)mant, -9);
  else
    v = ldexpf((float)(8 + mant), exp - 10);
  return (c & 0x80) ? -v : v;
}

size_t oi__fp8_bound(const oi_codec_shape *sh) {
  return (size_t)sh->parts * sh->heads * 4 + oi__shape_elems(sh);
}

size_t oi__fp8_encode(const oi_codec_shape *sh, const uint16_t *src, uint8_t *dst) {
  size_t P = sh->parts, T = sh->tokens, H = sh->heads, D = sh->head_dim;
  uint8_t *codes = dst + P * H * 4;
  for (size_t p = 0; p < P; p++)
    for (size_t h = 0; h < H; h++) {
      float amax = 0.0f;
      for (size_t t = 0; t < T; t++) {
        const uint16_t *x = src + ((p * T + t) * H + h) * D;
        for (size_t i = 0; i < D; i++) {
          float a = fabsf(oi__bf16_to_f32(x[i]));
          if (!(a <= FLT_MAX)) {
            oi__fail(OI_ERR_INVALID_ARGUMENT, "codec fp8: a non-finite value (element %zu)",
                     (size_t)(x + i - src));
            return 0;
          }
          amax = a > amax ? a : amax;
        }
      }
      float scale = amax / 448.0f;
      memcpy(dst + (p * H + h) * 4, &scale, 4);
      float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
      /* A scale below 2^-128 (amax a bf16 subnormal) has no finite
       * reciprocal (0 * inf would be NaN): divide instead, rarely. */
      bool divide = !(inv <= FLT_MAX);
      for (size_t t = 0; t < T; t++) {
        size_t off = ((p * T + t) * H + h) * D;
        for (size_t i = 0; i < D; i++) {
          float v = oi__bf16_to_f32(src[off + i]);
          codes[off + i] = f32_to_e4m3(divide ? v / scale : v * inv);
        }
      }
    }
  return oi__fp8_bound(sh);
}

oi_status oi__fp8_decode(const oi_codec_shape *sh, const uint8_t *src, size_t len, uint16_t *dst) {
  if (len != oi__fp8_bound(sh))
    return oi__fail(OI_ERR_PROTOCOL, "codec fp8: payload of %zu bytes, the shape needs %zu", len,
                    oi__fp8_bound(sh));
  float lut[256];
  for (int c = 0; c < 256; c++)
    lut[c] = e4m3_value((uint8_t)c);
  size_t P = sh->parts, T = sh->tokens, H = sh->heads, D = sh->head_dim;
  const uint8_t *codes = src + P * H * 4;
  for (size_t p = 0; p < P; p++)
    for (size_t h = 0; h < H; h++) {
      float scale;
      memcpy(&scale, src + (p * H + h) * 4, 4);
      if (!(fabsf(scale) <= FLT_MAX))
        return oi__fail(OI_ERR_PROTOCOL, "codec fp8: scale %zu is not finite", p * H + h);
      for (size_t t = 0; t < T; t++) {
        size_t off = ((p * T + t) * H + h) * D;
        for (size_t i = 0; i < D; i++) {
          uint8_t c = codes[off + i];
          if ((c & 0x7f) == 0x7f)
            return oi__fail(OI_ERR_PROTOCOL, "codec fp8: a NaN code at element %zu", off + i);
          dst[off + i] = oi__f32_to_bf16(lut[c] * scale);
        }
      }
    }
  return OI_OK;
}
