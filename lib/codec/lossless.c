/* The lossless codec's payload: bf16 elements split into two planes, the
 * exponent byte (bits 7..14) entropy-coded by rANS and the sign+mantissa
 * byte (bit 15, bits 0..6) raw; the sign+mantissa byte of real KV carries
 * about 7.97 of its 8 bits, the exponent about 2.7 (docs/codecs.md).
 *
 * Payload, for n = bytes / 2 elements:
 *   mode u8: 0 the exponent plane raw (n bytes), 1 rANS-coded, 2 rANS-coded
 *           in wide streams, 3 coded by the planes code (frames of format 4)
 *   mode 1, 2, 3: segments u16 (S >= 1, S divides n), S stream lengths u32,
 *           then S streams (codec/rans.h: mode 1 narrow, mode 2 wide;
 *           codec/planes.h: mode 3), the k-th coding the exponents
 *           [k n / S, (k + 1) n / S): one table per part (K and V of a
 *           layer differ) where that is estimated to pay. The rANS encoder
 *           writes wide streams when they code OI_RANS32_MIN exponents or
 *           more (a GPU decodes a wide stream a warp-wide round at a time),
 *           narrow ones below (their states cost 112 bytes less)
 *   the sign+mantissa plane, n bytes
 *   the last byte of an odd-length block, raw */
#include "codec/codec_internal.h"
#include "codec/planes.h"
#include "codec/rans.h"
#include "core/le_bytes.h"

enum { MODE_RAW = 0, MODE_RANS = 1, MODE_RANS32 = 2, MODE_PLANES = 3 };
#define MAX_SEGMENTS 65535u

size_t oi__lossless_bound(size_t bytes) { return 1 + bytes; }

/* The estimated bits of coding `n` symbols of histogram `h` in one stream:
 * order-0 entropy, its table and the coder's final states. */
static double stream_bits(const uint32_t h[256], size_t n) {
  double bits = 8.0 * (2 + 4 * (n >= OI_RANS32_MIN ? OI_RANS32_LANES : 4) + 4);
  for (int s = 0; s < 256; s++)
    if (h[s]) bits += 12.0 - (double)h[s] * log2((double)h[s] / (double)n);
  return bits;
}

/* The bytes of coding `n` symbols of histogram `h` in one planes stream. */
static double planes_bits(const uint32_t h[256], size_t n) {
  oi_planes_choice c;
  oi__planes_choose(h, n, &c);
  return 8.0 * (double)c.bytes;
}

/* One stream, or one per part when the parts' own tables are estimated to
 * save more than they cost (rANS: by the order-0 entropy; the planes code:
 * exactly). */
static size_t choose_segments(const uint8_t *exp, size_t n, unsigned parts, bool planes) {
  if (parts < 2 || parts > MAX_SEGMENTS || n % parts || n / parts < 64) return 1;
  double (*bits)(const uint32_t *, size_t) = planes ? planes_bits : stream_bits;
  size_t per = n / parts;
  uint32_t all[256] = {0};
  double split = 0;
  for (unsigned k = 0; k < parts; k++) {
    uint32_t h[256];
    oi__histogram(exp + k * per, per, h);
    for (int s = 0; s < 256; s++)
      all[s] += h[s];
    split += bits(h, per);
  }
  return split < bits(all, n) ? parts : 1;
}

/* Splits each of `segs` streams further until none codes more than
 * OI_LOSSLESS_SEGMENT_MAX exponents, where the elements divide evenly: a
 * GPU decodes a frame's streams in parallel (kernels/codec.cu), one warp
 * each, and a stream of a whole large block would be one long serial chain.
 * Each extra stream costs its table and states (about 50 bytes, 0.15 % of
 * the 32 KiB it codes). */
static size_t cap_segments(size_t n, size_t segs) {
  size_t per = n / segs;
  if (per <= OI_LOSSLESS_SEGMENT_MAX) return segs;
  for (size_t f = (per + OI_LOSSLESS_SEGMENT_MAX - 1) / OI_LOSSLESS_SEGMENT_MAX;
       f <= per / 1024 && segs * f <= MAX_SEGMENTS; f++)
    if (per % f == 0) return segs * f;
  return segs;
}

void oi__histogram(const uint8_t *sym, size_t n, uint32_t h[256]) {
  uint32_t more[3][256] = {{0}}; /* four counts: a run of one symbol does not wait on itself */
  memset(h, 0, 256 * sizeof *h);
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    h[sym[i]]++;
    more[0][sym[i + 1]]++;
    more[1][sym[i + 2]]++;
    more[2][sym[i + 3]]++;
  }
  for (; i < n; i++)
    h[sym[i]]++;
  for (int s = 0; s < 256; s++)
    h[s] += more[0][s] + more[1][s] + more[2][s];
}

/* The low bytes of the four u16 lanes of x, in order. */
static uint32_t low_bytes(uint64_t x) {
  x = (x | x >> 8) & 0x0000ffff0000ffffull;
  return (uint32_t)(x | x >> 16);
}

/* The exponent byte (bits 7..14) and the sign+mantissa byte of each of n
 * bf16 (the buffers do not overlap), four at a time (the machine is
 * little-endian: codec_internal.h). */
static void split_planes(const uint8_t *src, size_t n, uint8_t *exp, uint8_t *sm) {
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    uint64_t v;
    memcpy(&v, src + 2 * i, sizeof v);
    uint32_t e = low_bytes(v >> 7 & 0x00ff00ff00ff00ffull),
             m = low_bytes((v >> 8 & 0x0080008000800080ull) | (v & 0x007f007f007f007full));
    memcpy(exp + i, &e, sizeof e);
    memcpy(sm + i, &m, sizeof m);
  }
  for (; i < n; i++) {
    uint16_t x = (uint16_t)(src[2 * i] | src[2 * i + 1] << 8);
    exp[i] = (uint8_t)(x >> 7);
    sm[i] = (uint8_t)(((x >> 8) & 0x80) | (x & 0x7f));
  }
}

/* Four bytes to the low bytes of four u16 lanes (low_bytes undone). */
static uint64_t byte_lanes(uint32_t b) {
  uint64_t x = b;
  x = (x | x << 16) & 0x0000ffff0000ffffull;
  return (x | x << 8) & 0x00ff00ff00ff00ffull;
}

/* n bf16 from their exponent and sign+mantissa bytes (split_planes undone). */
static void merge_planes(const uint8_t *exp, const uint8_t *sm, size_t n, uint8_t *dst) {
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    uint32_t e, m;
    memcpy(&e, exp + i, sizeof e);
    memcpy(&m, sm + i, sizeof m);
    uint64_t el = byte_lanes(e), ml = byte_lanes(m);
    uint64_t v = el << 7 | (ml & 0x007f007f007f007full) | (ml & 0x0080008000800080ull) << 8;
    memcpy(dst + 2 * i, &v, sizeof v);
  }
  for (; i < n; i++) {
    dst[2 * i] = (uint8_t)((exp[i] << 7) | (sm[i] & 0x7f));
    dst[2 * i + 1] = (uint8_t)((sm[i] & 0x80) | (exp[i] >> 1));
  }
}

size_t oi__lossless_encode(const uint8_t *src, size_t bytes, unsigned parts, bool planes,
                           uint8_t *dst) {
  size_t n = bytes / 2;
  uint8_t *exp = dst + 1;
  /* Both planes raw first (the exponents after the mode byte, then the
   * sign+mantissa plane); if the coded exponents are shorter, the
   * sign+mantissa plane moves down behind them. */
  uint8_t *sm_raw = dst + 1 + n;
  split_planes(src, n, exp, sm_raw);
  size_t len = 1 + 2 * n;
  dst[0] = MODE_RAW;
  size_t segs = n >= 16 ? cap_segments(n, choose_segments(exp, n, parts, planes)) : 0;
  size_t head = 3 + 4 * segs; /* mode, segments, lengths */
  if (segs && n > head + 1) {
    /* The streams pay when they total less than n - head bytes: the coder
     * gets a scratch buffer of that size and gives up past it. */
    size_t cap = n - head - 1, used = 0, per = n / segs;
    uint8_t stack_buf[8192];
    uint8_t *buf = cap <= sizeof stack_buf ? stack_buf : oi__malloc(cap);
    uint32_t lens_stack[64];
    uint32_t *lens = segs <= 64 ? lens_stack : oi__malloc(segs * sizeof *lens);
    bool ok = buf && lens, wide = per >= OI_RANS32_MIN;
    for (size_t k = 0; ok && k < segs; k++) {
      size_t c = planes ? oi__planes_encode(exp + k * per, per, buf + used, cap - used)
                 : wide ? oi__rans32_encode(exp + k * per, per, buf + used, cap - used)
                        : oi__rans_encode(exp + k * per, per, buf + used, cap - used);
      ok = c > 0;
      if (ok) lens[k] = (uint32_t)c, used += c;
    }
    if (ok) {
      /* sign+mantissa plane first: its new place overlaps only the raw
       * exponents, already coded */
      memmove(dst + head + used, sm_raw, n);
      dst[0] = planes ? MODE_PLANES : wide ? MODE_RANS32 : MODE_RANS;
      put16(dst + 1, (uint16_t)segs);
      for (size_t k = 0; k < segs; k++)
        put32(dst + 3 + 4 * k, lens[k]);
      memcpy(dst + head, buf, used);
      len = head + used + n;
    }
    if (buf != stack_buf) oi__free(buf);
    if (lens != lens_stack) oi__free(lens);
  }
  if (bytes & 1) dst[len++] = src[bytes - 1];
  return len;
}

bool oi__lossless_stream_counts(size_t bytes, unsigned parts, uint32_t *choice,
                                uint32_t *segs_parts, uint32_t *segs_whole) {
  size_t n = bytes / 2;
  if (bytes % 8 || n < OI_RANS32_MIN) {
    oi__fail(OI_ERR_INVALID_ARGUMENT,
             "a block of %zu bytes (not a multiple of 8, or under %u "
             "elements) has no wide streams",
             bytes, OI_RANS32_MIN);
    return false;
  }
  bool choose = !(parts < 2 || parts > MAX_SEGMENTS || n % parts || n / parts < 64);
  size_t whole = cap_segments(n, 1), split = choose ? cap_segments(n, parts) : 0;
  if (n / whole < OI_RANS32_MIN || (choose && n / split < OI_RANS32_MIN)) {
    oi__fail(OI_ERR_INVALID_ARGUMENT,
             "a block of %zu bytes in %u parts has streams of fewer "
             "than %u exponents",
             bytes, parts, OI_RANS32_MIN);
    return false;
  }
  *choice = choose ? parts : 0;
  *segs_parts = (uint32_t)split;
  *segs_whole = (uint32_t)whole;
  return true;
}

/* Reads a payload's layout, checking every length against the payload's
 * (no stream is decoded here). */
oi_status oi__lossless_parse(const uint8_t *src, size_t len, size_t logical,
                             oi_lossless_layout *l) {
  size_t n = logical / 2;
  *l = (oi_lossless_layout){.n = n};
  if (len < 1) return oi__fail(OI_ERR_PROTOCOL, "codec: lossless payload is empty");
  const uint8_t *p = src + 1, *end = src + len;
  l->mode = src[0];
  if (src[0] == MODE_RAW) {
    if ((size_t)(end - p) < n) goto short_payload;
    l->streams = p;
    p += n;
  } else if (src[0] == MODE_RANS || src[0] == MODE_RANS32 || src[0] == MODE_PLANES) {
    if (end - p < 2) goto short_payload;
    size_t segs = get16(p);
    p += 2;
    if (!segs || !n || n % segs)
      return oi__fail(OI_ERR_PROTOCOL, "codec: lossless payload of %zu segments for %zu elements",
                      segs, n);
    if ((size_t)(end - p) < 4 * segs) goto short_payload;
    l->segs = segs;
    l->lens = p;
    p += 4 * segs;
    l->streams = p;
    for (size_t k = 0; k < segs; k++) {
      size_t c = get32(l->lens + 4 * k);
      if ((size_t)(end - p) < c)
        return oi__fail(OI_ERR_PROTOCOL, "codec: lossless stream %zu of %zu bytes truncated", k, c);
      p += c;
    }
  } else {
    return oi__fail(OI_ERR_PROTOCOL, "codec: lossless payload of unknown mode %u", src[0]);
  }
  if ((size_t)(end - p) != n + (logical & 1)) goto short_payload;
  l->sm = p;
  return OI_OK;
short_payload:
  return oi__fail(OI_ERR_PROTOCOL, "codec: lossless payload of %zu bytes does not hold %zu", len,
                  logical);
}

oi_status oi__lossless_decode(const uint8_t *src, size_t len, uint8_t *dst, size_t logical) {
  oi_lossless_layout l;
  oi_status st = oi__lossless_parse(src, len, logical, &l);
  if (st != OI_OK) return st;
  size_t n = l.n;
  const uint8_t *exp = l.streams;
  uint8_t stack_buf[8192];
  uint8_t *buf = NULL;
  if (l.mode != MODE_RAW) {
    buf = n <= sizeof stack_buf ? stack_buf : oi__malloc(n);
    if (!buf) return oi__fail(OI_ERR_OUT_OF_MEMORY, "codec: %zu bytes for an exponent plane", n);
    size_t per = n / l.segs;
    const uint8_t *p = l.streams;
    for (size_t k = 0; k < l.segs; k++) {
      size_t c = get32(l.lens + 4 * k);
      if ((l.mode == MODE_PLANES   ? oi__planes_decode(p, c, buf + k * per, per)
           : l.mode == MODE_RANS32 ? oi__rans32_decode(p, c, buf + k * per, per)
                                   : oi__rans_decode(p, c, buf + k * per, per)) != 0) {
        st = oi__fail(OI_ERR_PROTOCOL, "codec: lossless exponent stream %zu does not decode", k);
        goto out;
      }
      p += c;
    }
    exp = buf;
  }
  merge_planes(exp, l.sm, n, dst);
  if (logical & 1) dst[logical - 1] = l.sm[n];
out:
  if (buf && buf != stack_buf) oi__free(buf);
  return st;
}
