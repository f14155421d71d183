/* The lossless codec's payload: bf16 elements split into two planes, the
 * exponent byte (bits 7..14) entropy-coded by rANS and the sign+mantissa
 * byte (bit 15, bits 0..6) raw; the sign+mantissa byte of real KV carries
 * about 7.97 of its 8 bits, the exponent about 2.7 (docs/codecs.md).
 *
 * Payload, for n = bytes / 2 elements:
 *   mode u8: 0 the exponent plane raw (n bytes), 1 rANS-coded
 *   mode 1: stream length u32, then the rANS stream (codec/rans.h)
 *   the sign+mantissa plane, n bytes
 *   the last byte of an odd-length block, raw */
#include "codec/codec_internal.h"
#include "codec/rans.h"

enum { MODE_RAW = 0, MODE_RANS = 1 };

static inline void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static inline uint32_t get32(const uint8_t *p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}

size_t oi__lossless_bound(size_t bytes) { return 1 + bytes; }

size_t oi__lossless_encode(const uint8_t *src, size_t bytes, uint8_t *dst) {
  size_t n = bytes / 2;
  uint8_t *exp = dst + 1;
  /* The sign+mantissa plane goes to its place at the end of the payload
   * once the exponent plane's length is known; it is built in place after
   * a raw exponent plane, then moved down if the coded one is shorter. */
  uint8_t *sm_raw = dst + 1 + n;
  for (size_t i = 0; i < n; i++) {
    uint16_t x = (uint16_t)(src[2 * i] | src[2 * i + 1] << 8);
    exp[i] = (uint8_t)(x >> 7);
    sm_raw[i] = (uint8_t)(((x >> 8) & 0x80) | (x & 0x7f));
  }
  size_t len = 1 + 2 * n;
  dst[0] = MODE_RAW;
  if (n >= 16) {
    /* The coded exponent stream pays when it is shorter than n - 4 bytes
     * (its u32 length included): the coder gets a scratch buffer of that
     * size and gives up past it. */
    uint8_t stack_buf[8192];
    uint8_t *buf = n - 4 <= sizeof stack_buf ? stack_buf : oi__malloc(n - 4);
    if (buf) {
      size_t coded = oi__rans_encode(exp, n, buf, n - 4);
      if (coded) {
        dst[0] = MODE_RANS;
        put32(dst + 1, (uint32_t)coded);
        /* The planes in their final places: the coded exponents occupy
         * [5, 5 + coded), below the sign+mantissa plane's new place, which
         * is below its old one (coded + 4 < n): move it down first. */
        memmove(dst + 5 + coded, sm_raw, n);
        memcpy(dst + 5, buf, coded);
        len = 5 + coded + n;
      }
      if (buf != stack_buf) oi__free(buf);
    }
  }
  if (bytes & 1) dst[len++] = src[bytes - 1];
  return len;
}

oi_status oi__lossless_decode(const uint8_t *src, size_t len, uint8_t *dst, size_t logical) {
  size_t n = logical / 2;
  if (len < 1) return oi__fail(OI_ERR_PROTOCOL, "codec: lossless payload is empty");
  const uint8_t *p = src + 1, *end = src + len;
  const uint8_t *exp;
  uint8_t stack_buf[8192];
  uint8_t *buf = NULL;
  if (src[0] == MODE_RAW) {
    if ((size_t)(end - p) < n) goto short_payload;
    exp = p;
    p += n;
  } else if (src[0] == MODE_RANS) {
    if (end - p < 4) goto short_payload;
    size_t coded = get32(p);
    p += 4;
    if ((size_t)(end - p) < coded || !n) goto short_payload;
    buf = n <= sizeof stack_buf ? stack_buf : oi__malloc(n);
    if (!buf) return oi__fail(OI_ERR_OUT_OF_MEMORY, "codec: %zu bytes for an exponent plane", n);
    if (oi__rans_decode(p, coded, buf, n) != 0) {
      if (buf != stack_buf) oi__free(buf);
      return oi__fail(OI_ERR_PROTOCOL, "codec: lossless exponent stream does not decode");
    }
    exp = buf;
    p += coded;
  } else {
    return oi__fail(OI_ERR_PROTOCOL, "codec: lossless payload of unknown mode %u", src[0]);
  }
  if ((size_t)(end - p) != n + (logical & 1)) {
    if (buf && buf != stack_buf) oi__free(buf);
    goto short_payload;
  }
  for (size_t i = 0; i < n; i++) {
    uint8_t e = exp[i], sm = p[i];
    dst[2 * i] = (uint8_t)((e << 7) | (sm & 0x7f));
    dst[2 * i + 1] = (uint8_t)((sm & 0x80) | (e >> 1));
  }
  if (logical & 1) dst[logical - 1] = p[n];
  if (buf && buf != stack_buf) oi__free(buf);
  return OI_OK;
short_payload:
  return oi__fail(OI_ERR_PROTOCOL, "codec: lossless payload of %zu bytes does not hold %zu", len,
                  logical);
}
