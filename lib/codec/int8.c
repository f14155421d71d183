/* The int8 codecs' payload: symmetric int8 with one scale per token and
 * head. For a shape of P parts, T tokens, H heads and D channels:
 *   P*T*H scales, IEEE fp16 (amax / 127 of the D values they scale),
 *   then P*T*H*D int8 values, q = round(y / scale) in [-127, 127],
 * both in [part][token][head] order.
 *   int8:          y = x; decoded x = q * scale, rounded to bf16.
 *   int8-hadamard: y is x rotated by a Walsh-Hadamard transform in blocks
 *   of b channels (b: the largest power of two dividing D, at most
 *   OI_INT8H_BLOCK_MAX), y = H x * 2^-k with k = floor(log2(b) / 2) (H of
 *   +-1 entries: about orthonormal). The rotation spreads a head's outlier
 *   channels over the block, so one scale fits its values better. Decoded
 *   x = t * 2^-(log2(b) - k) * scale with t = H q, exact in int32: one
 *   rounding (the multiply), then bf16, as in int8. */
#include "codec/codec_internal.h"

size_t oi__int8_bound(const oi_codec_shape *sh) {
  size_t groups = (size_t)sh->parts * sh->tokens * sh->heads;
  return groups * 2 + groups * sh->head_dim;
}

unsigned oi__int8h_block(unsigned head_dim) {
  unsigned b = head_dim & (0u - head_dim);
  return b > OI_INT8H_BLOCK_MAX ? OI_INT8H_BLOCK_MAX : b;
}

static unsigned log2_of(unsigned b) {
  unsigned k = 0;
  while ((1u << k) < b)
    k++;
  return k;
}

float oi__int8h_down(unsigned b) { return ldexpf(1.0f, -(int)(log2_of(b) / 2)); }

/* The unnormalized Walsh-Hadamard transform of v[0..b), b a power of two:
 * butterflies of stride 1, 2, 4, ... (the order every decoder follows), on
 * floats (the encoder's values) or int32 (the decoder's exact codes). */
#define FWHT(name, T)                                                                              \
  static void name(T *v, unsigned b) {                                                             \
    for (unsigned h = 1; h < b; h <<= 1)                                                           \
      for (unsigned i = 0; i < b; i += 2 * h)                                                      \
        for (unsigned j = i; j < i + h; j++) {                                                     \
          T a = v[j], c = v[j + h];                                                                \
          v[j] = a + c;                                                                            \
          v[j + h] = a - c;                                                                        \
        }                                                                                          \
  }
FWHT(fwht_f32, float)
FWHT(fwht_i32, int32_t)

/* One group's d values y (already rotated for int8-hadamard) into its fp16
 * scale and codes; false (oi_last_error set) when the scale overflows. */
static bool quantize(const float *y, size_t d, uint8_t *scale_out, int8_t *q) {
  float amax = 0.0f;
  for (size_t i = 0; i < d; i++)
    amax = fabsf(y[i]) > amax ? fabsf(y[i]) : amax;
  uint16_t s16 = oi__f32_to_f16(amax / 127.0f);
  if ((s16 & 0x7c00u) == 0x7c00u) {
    oi__fail(OI_ERR_INVALID_ARGUMENT, "codec int8: |y| = %g is past the fp16 scales' range",
             (double)amax);
    return false;
  }
  memcpy(scale_out, &s16, 2);
  float scale = oi__f16_to_f32(s16);
  float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
  for (size_t i = 0; i < d; i++) {
    float r = oi__round_even(y[i] * inv);
    q[i] = (int8_t)(r > 127.0f ? 127.0f : (r < -127.0f ? -127.0f : r));
  }
  return true;
}

size_t oi__int8_encode(const oi_codec_shape *sh, const uint16_t *src, uint8_t *dst, bool rotate) {
  size_t groups = (size_t)sh->parts * sh->tokens * sh->heads, d = sh->head_dim;
  unsigned b = rotate ? oi__int8h_block(sh->head_dim) : 1;
  float down = oi__int8h_down(b);
  int8_t *q = (int8_t *)(dst + groups * 2);
  float stack_y[512]; /* a group's values, rotated block by block */
  float *y = d <= 512 ? stack_y : oi__malloc(d * sizeof *y);
  if (!y) {
    oi__fail(OI_ERR_OUT_OF_MEMORY, "codec int8: out of memory for a group of %zu values", d);
    return 0;
  }
  size_t len = oi__int8_bound(sh);
  for (size_t g = 0; g < groups && len; g++) {
    const uint16_t *x = src + g * d;
    for (size_t i = 0; i < d; i++) {
      y[i] = oi__bf16_to_f32(x[i]);
      if (!(fabsf(y[i]) <= FLT_MAX)) {
        oi__fail(OI_ERR_INVALID_ARGUMENT, "codec int8: a non-finite value (element %zu)",
                 g * d + i);
        len = 0;
        break;
      }
    }
    if (len && b > 1)
      for (size_t at = 0; at < d; at += b) {
        fwht_f32(y + at, b);
        for (unsigned i = 0; i < b; i++)
          y[at + i] *= down;
      }
    if (len && !quantize(y, d, dst + 2 * g, q + g * d)) len = 0;
  }
  if (y != stack_y) oi__free(y);
  return len;
}

oi_status oi__int8_decode(const oi_codec_shape *sh, const uint8_t *src, size_t len, uint16_t *dst,
                          bool rotate) {
  if (len != oi__int8_bound(sh))
    return oi__fail(OI_ERR_PROTOCOL, "codec int8: payload of %zu bytes, the shape needs %zu", len,
                    oi__int8_bound(sh));
  size_t groups = (size_t)sh->parts * sh->tokens * sh->heads, d = sh->head_dim;
  unsigned b = rotate ? oi__int8h_block(sh->head_dim) : 1;
  float up = ldexpf(1.0f, -(int)(log2_of(b) - log2_of(b) / 2));
  const int8_t *q = (const int8_t *)(src + groups * 2);
  int32_t t[OI_INT8H_BLOCK_MAX];
  for (size_t g = 0; g < groups; g++) {
    uint16_t s16;
    memcpy(&s16, src + 2 * g, 2);
    float scale = oi__f16_to_f32(s16);
    if (!(fabsf(scale) <= 65504.0f))
      return oi__fail(OI_ERR_PROTOCOL, "codec int8: scale %zu is not finite", g);
    /* scale * up is exact (a power of two), and so is (float)t (|t| <=
     * 127 b < 2^24): the multiply below is the one rounding before bf16. */
    float step = scale * up;
    if (b == 1) { /* int8, or a head_dim of no even divisor: no transform */
      for (size_t i = 0; i < d; i++)
        dst[g * d + i] = oi__f32_to_bf16((float)q[g * d + i] * step);
      continue;
    }
    for (size_t at = 0; at < d; at += b) {
      for (unsigned i = 0; i < b; i++)
        t[i] = q[g * d + at + i];
      fwht_i32(t, b);
      for (unsigned i = 0; i < b; i++)
        dst[g * d + at + i] = oi__f32_to_bf16((float)t[i] * step);
    }
  }
  return OI_OK;
}
