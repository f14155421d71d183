/* The int8 codec's payload: symmetric int8 with one scale per token and
 * head. For a shape of P parts, T tokens, H heads and D channels:
 *   P*T*H scales, IEEE fp16 (amax / 127 of the D values they scale),
 *   then P*T*H*D int8 values, q = round(x / scale) in [-127, 127],
 * both in [part][token][head] order; x = q * scale, rounded to bf16. */
#include "codec/codec_internal.h"

size_t oi__int8_bound(const oi_codec_shape *sh) {
  size_t groups = (size_t)sh->parts * sh->tokens * sh->heads;
  return groups * 2 + groups * sh->head_dim;
}

size_t oi__int8_encode(const oi_codec_shape *sh, const uint16_t *src, uint8_t *dst) {
  size_t groups = (size_t)sh->parts * sh->tokens * sh->heads, d = sh->head_dim;
  uint8_t *scales = dst;
  int8_t *q = (int8_t *)(dst + groups * 2);
  for (size_t g = 0; g < groups; g++) {
    const uint16_t *x = src + g * d;
    float amax = 0.0f;
    for (size_t i = 0; i < d; i++) {
      float v = fabsf(oi__bf16_to_f32(x[i]));
      if (!(v <= FLT_MAX)) {
        oi__fail(OI_ERR_INVALID_ARGUMENT, "codec int8: a non-finite value (element %zu)",
                 g * d + i);
        return 0;
      }
      amax = v > amax ? v : amax;
    }
    uint16_t s16 = oi__f32_to_f16(amax / 127.0f);
    if ((s16 & 0x7c00u) == 0x7c00u) {
      oi__fail(OI_ERR_INVALID_ARGUMENT, "codec int8: |x| = %g is past the fp16 scales' range",
               (double)amax);
      return 0;
    }
    memcpy(scales + 2 * g, &s16, 2);
    float scale = oi__f16_to_f32(s16);
    float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
    for (size_t i = 0; i < d; i++) {
      float r = oi__round_even(oi__bf16_to_f32(x[i]) * inv);
      r = r > 127.0f ? 127.0f : (r < -127.0f ? -127.0f : r);
      q[g * d + i] = (int8_t)r;
    }
  }
  return oi__int8_bound(sh);
}

oi_status oi__int8_decode(const oi_codec_shape *sh, const uint8_t *src, size_t len, uint16_t *dst) {
  if (len != oi__int8_bound(sh))
    return oi__fail(OI_ERR_PROTOCOL, "codec int8: payload of %zu bytes, the shape needs %zu", len,
                    oi__int8_bound(sh));
  size_t groups = (size_t)sh->parts * sh->tokens * sh->heads, d = sh->head_dim;
  const int8_t *q = (const int8_t *)(src + groups * 2);
  for (size_t g = 0; g < groups; g++) {
    uint16_t s16;
    memcpy(&s16, src + 2 * g, 2);
    float scale = oi__f16_to_f32(s16);
    if (!(fabsf(scale) <= 65504.0f))
      return oi__fail(OI_ERR_PROTOCOL, "codec int8: scale %zu is not finite", g);
    for (size_t i = 0; i < d; i++)
      dst[g * d + i] = oi__f32_to_bf16((float)q[g * d + i] * scale);
  }
  return OI_OK;
}
