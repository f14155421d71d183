/* A frame cut into pieces that decode independently (codec.h,
 * oi__codec_pieces): what a GPU decoder launches, one warp per rANS
 * stream, narrow or wide (kernels/codec.cu), one CTA per stream of the
 * planes code (kernels/codec_planes.cu). */
#include "codec/codec_internal.h"
#include "core/le_bytes.h"

/* Raw exponents (a frame whose coded plane would not have been shorter) go
 * in pieces of this many, so a large block still spreads over warps. */
#define RAW_PIECE OI_LOSSLESS_SEGMENT_MAX

size_t oi__codec_pieces_max(const oi_codec_info *info, const void *frame) {
  if (info->codec != OI_CODEC_LOSSLESS) return 1;
  const uint8_t *payload = (const uint8_t *)frame + OI_CODEC_HEADER_BYTES;
  size_t n = info->logical_bytes / 2, tail = info->logical_bytes & 1;
  if (info->frame_bytes > OI_CODEC_HEADER_BYTES + 2 && payload[0] >= 1 && payload[0] <= 3)
    return (size_t)get16(payload + 1) + tail;
  return (n + RAW_PIECE - 1) / RAW_PIECE + tail;
}

oi_status oi__codec_pieces(const void *frame, size_t bytes, bool verify, oi_codec_info *info,
                           oi_codec_piece *out, size_t cap, size_t *n) {
  if (!out || !n || !info)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "codec: NULL %s", !out ? "out" : !n ? "n" : "info");
  oi_status st =
      verify ? oi__codec_info_of(frame, bytes, info) : oi__codec_header_of(frame, bytes, info);
  if (st != OI_OK) return st;
  const uint8_t *f = frame, *payload = f + OI_CODEC_HEADER_BYTES;
  size_t plen = info->frame_bytes - OI_CODEC_HEADER_BYTES, need = oi__codec_pieces_max(info, f);
  if (cap < need)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "codec: %zu pieces given, the frame needs %zu", cap,
                    need);
  const oi_codec_shape *sh = &info->shape;
  if (info->codec != OI_CODEC_LOSSLESS) {
    bool fp8 = info->codec == OI_CODEC_FP8;
    size_t want = fp8 ? oi__fp8_bound(sh) : oi__int8_bound(sh);
    if (plen != want)
      return oi__fail(OI_ERR_PROTOCOL, "codec %s: payload of %zu bytes, the shape needs %zu",
                      oi__codec_name(info->codec), plen, want);
    out[0] =
        (oi_codec_piece){.kind = fp8                            ? OI_CODEC_PIECE_FP8
                                 : info->codec == OI_CODEC_INT8 ? OI_CODEC_PIECE_INT8
                                                                : OI_CODEC_PIECE_INT8H,
                         .src = OI_CODEC_HEADER_BYTES,
                         .len = (uint32_t)plen,
                         .count = fp8 ? sh->parts : (uint32_t)sh->parts * sh->tokens * sh->heads,
                         .tokens = sh->tokens,
                         .heads = sh->heads,
                         .head_dim = sh->head_dim};
    *n = 1;
    return OI_OK;
  }
  oi_lossless_layout l;
  if ((st = oi__lossless_parse(payload, plen, info->logical_bytes, &l)) != OI_OK) return st;
  size_t k = 0;
  uint32_t sm = (uint32_t)(l.sm - f);
  if (l.mode >= 1 && l.mode <= 3) {
    static const int kinds[4] = {0, OI_CODEC_PIECE_RANS, OI_CODEC_PIECE_RANS32,
                                 OI_CODEC_PIECE_PLANES};
    size_t per = l.n / l.segs;
    uint32_t at = (uint32_t)(l.streams - f);
    for (size_t s = 0; s < l.segs; s++) {
      uint32_t c = get32(l.lens + 4 * s);
      out[k++] = (oi_codec_piece){.kind = kinds[l.mode],
                                  .src = at,
                                  .aux = sm + (uint32_t)(s * per),
                                  .dst = (uint32_t)(2 * s * per),
                                  .len = c,
                                  .count = (uint32_t)per};
      at += c;
    }
  } else {
    uint32_t raw = (uint32_t)(l.streams - f);
    for (size_t i = 0; i < l.n; i += RAW_PIECE) {
      uint32_t c = (uint32_t)OI_MIN((size_t)RAW_PIECE, l.n - i);
      out[k++] = (oi_codec_piece){.kind = OI_CODEC_PIECE_RAW_EXP,
                                  .src = raw + (uint32_t)i,
                                  .aux = sm + (uint32_t)i,
                                  .dst = (uint32_t)(2 * i),
                                  .count = c};
    }
  }
  if (info->logical_bytes & 1)
    out[k++] = (oi_codec_piece){.kind = OI_CODEC_PIECE_BYTES,
                                .src = sm + (uint32_t)l.n,
                                .dst = info->logical_bytes - 1,
                                .count = 1};
  *n = k;
  return OI_OK;
}
