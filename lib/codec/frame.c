/* The codec frame: its header, its checksums, the arguments' checks, and
 * the dispatch to each codec's payload (codec.h has the contract).
 *
 * Header, 40 bytes, little-endian:
 *    0 magic u32 "OIKC"       4 version u8 (2, 3, 4)  5 codec u8  6 dtype u8  7 flags u8 (0)
 *    8 logical bytes u32     12 payload bytes u32
 *   16 parts u16  18 tokens u16  20 heads u16  22 head_dim u16
 *   24 data_xxh u64: XXH3-64 of the original bytes (lossless), else 0
 *   32 frame_xxh u64: XXH3-64 of the payload seeded with XXH3-64 of bytes 0..31 */
#define XXH_STATIC_LINKING_ONLY /* XXH3_generateSecret_fromSeed */
#include <xxhash.h>

#include "codec/codec_internal.h"
#include "core/le_bytes.h"

static const char *const NAMES[OI_CODEC_COUNT] = {"none", "lossless", "int8", "fp8",
                                                  "int8-hadamard"};

unsigned oi__codec_frame_version(int codec) {
  if (codec < 0 || codec >= OI_CODEC_COUNT) return 0;
  return codec == OI_CODEC_INT8_HADAMARD ? 3 : 2;
}

static bool is_lossy(int codec) {
  return codec == OI_CODEC_INT8 || codec == OI_CODEC_FP8 || codec == OI_CODEC_INT8_HADAMARD;
}

const char *oi__codec_name(int codec) {
  return codec >= 0 && codec < OI_CODEC_COUNT ? NAMES[codec] : NULL;
}

int oi__codec_from_name(const char *name) {
  if (!name) return -1;
  for (int i = 0; i < OI_CODEC_COUNT; i++)
    if (!strcmp(name, NAMES[i])) return i;
  return -1;
}

static uint64_t frame_xxh(const uint8_t *hdr, const uint8_t *payload, size_t len) {
  return XXH3_64bits_withSeed(payload, len, XXH3_64bits(hdr, 32));
}

/* The header's first 24 bytes (the checksums follow). */
static void write_header(uint8_t *h, int codec, unsigned version, const oi_codec_shape *sh,
                         size_t bytes, size_t len) {
  put32(h, OI_CODEC_MAGIC);
  h[4] = (uint8_t)version;
  h[5] = (uint8_t)codec;
  h[6] = sh->dtype;
  h[7] = 0;
  put32(h + 8, (uint32_t)bytes);
  put32(h + 12, (uint32_t)len);
  put16(h + 16, sh->parts);
  put16(h + 18, sh->tokens);
  put16(h + 20, sh->heads);
  put16(h + 22, sh->head_dim);
}

/* A lossy codec's shape: bf16, no zero field, `bytes` its exact size. */
static oi_status check_lossy_shape(int codec, const oi_codec_shape *sh, size_t bytes,
                                   oi_status st) {
  if (!sh) return oi__fail(st, "codec %s: needs the block's shape", NAMES[codec]);
  if (sh->dtype != OI_CODEC_DTYPE_BF16)
    return oi__fail(st, "codec %s: dtype %u is not bf16", NAMES[codec], sh->dtype);
  if (!sh->parts || !sh->tokens || !sh->heads || !sh->head_dim)
    return oi__fail(st, "codec %s: shape %ux%ux%ux%u has a zero field", NAMES[codec], sh->parts,
                    sh->tokens, sh->heads, sh->head_dim);
  if (oi__shape_elems(sh) * 2 != bytes)
    return oi__fail(st, "codec %s: shape %ux%ux%ux%u is %zu bytes of bf16, the block %zu",
                    NAMES[codec], sh->parts, sh->tokens, sh->heads, sh->head_dim,
                    oi__shape_elems(sh) * 2, bytes);
  return OI_OK;
}

static size_t payload_bound(int codec, const oi_codec_shape *sh, size_t bytes) {
  switch (codec) {
  case OI_CODEC_LOSSLESS: return oi__lossless_bound(bytes);
  case OI_CODEC_INT8:
  case OI_CODEC_INT8_HADAMARD: return oi__int8_bound(sh);
  case OI_CODEC_FP8: return oi__fp8_bound(sh);
  default: return 0;
  }
}

size_t oi__codec_bound(int codec, const oi_codec_shape *shape, size_t bytes) {
  if (codec == OI_CODEC_LOSSLESS) return OI_CODEC_HEADER_BYTES + oi__lossless_bound(bytes);
  if (!is_lossy(codec)) return 0;
  if (!shape || shape->dtype != OI_CODEC_DTYPE_BF16 || oi__shape_elems(shape) * 2 != bytes ||
      !bytes)
    return 0;
  return OI_CODEC_HEADER_BYTES + payload_bound(codec, shape, bytes);
}

/* oi__codec_encode, a lossless block's exponents coded by the planes code
 * where `planes` (oi__codec_encode_planes). */
static oi_status encode_frame(int codec, const oi_codec_shape *shape, const void *src, size_t bytes,
                              void *dst, size_t cap, size_t *out_bytes, bool planes) {
  if (codec <= OI_CODEC_NONE || codec >= OI_CODEC_COUNT)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "codec: %d is not a codec that frames blocks", codec);
  if ((!src && bytes) || !dst || !out_bytes)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "codec %s: NULL %s", NAMES[codec],
                    !dst         ? "dst"
                    : !out_bytes ? "out_bytes"
                                 : "src");
  if (bytes > OI_CODEC_MAX_BYTES)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "codec %s: a block of %zu bytes is past the limit %zu",
                    NAMES[codec], bytes, OI_CODEC_MAX_BYTES);
  oi_codec_shape sh = {0};
  if (codec == OI_CODEC_LOSSLESS) {
    if (shape) sh = *shape;
    if (sh.dtype > OI_CODEC_DTYPE_BF16)
      return oi__fail(OI_ERR_INVALID_ARGUMENT, "codec lossless: unknown dtype %u", sh.dtype);
  } else {
    oi_status st = check_lossy_shape(codec, shape, bytes, OI_ERR_INVALID_ARGUMENT);
    if (st != OI_OK) return st;
    sh = *shape;
  }
  size_t need = OI_CODEC_HEADER_BYTES + payload_bound(codec, &sh, bytes);
  if (cap < need)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "codec %s: dst of %zu bytes, %zu needed", NAMES[codec],
                    cap, need);
  uint8_t *h = dst, *payload = h + OI_CODEC_HEADER_BYTES;
  size_t len;
  uint64_t data_xxh = 0;
  if (codec == OI_CODEC_LOSSLESS) {
    len = oi__lossless_encode(src, bytes, sh.parts, planes, payload);
    data_xxh = XXH3_64bits(src, bytes);
  } else {
    if ((uintptr_t)src & 1)
      return oi__fail(OI_ERR_INVALID_ARGUMENT, "codec %s: src is not 2-byte aligned", NAMES[codec]);
    len = codec == OI_CODEC_FP8
              ? oi__fp8_encode(&sh, src, payload)
              : oi__int8_encode(&sh, src, payload, codec == OI_CODEC_INT8_HADAMARD);
    if (!len) return OI_ERR_INVALID_ARGUMENT; /* (the codec set the message) */
  }
  /* a payload of the planes code is format 4's (mode 3; raw is mode 0 in
   * every format) */
  unsigned version =
      planes && payload[0] ? OI_LOSSLESS_PLANES_VERSION : oi__codec_frame_version(codec);
  write_header(h, codec, version, &sh, bytes, len);
  put64(h + 24, data_xxh);
  put64(h + 32, frame_xxh(h, payload, len));
  *out_bytes = OI_CODEC_HEADER_BYTES + len;
  return OI_OK;
}

oi_status oi__codec_encode(int codec, const oi_codec_shape *shape, const void *src, size_t bytes,
                           void *dst, size_t cap, size_t *out_bytes) {
  return encode_frame(codec, shape, src, bytes, dst, cap, out_bytes, false);
}

oi_status oi__codec_encode_planes(const oi_codec_shape *shape, const void *src, size_t bytes,
                                  void *dst, size_t cap, size_t *out_bytes) {
  return encode_frame(OI_CODEC_LOSSLESS, shape, src, bytes, dst, cap, out_bytes, true);
}

static oi_status header_of(const void *src, size_t bytes, oi_codec_info *info, bool verify) {
  if (!src || !info)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "codec: NULL %s", src ? "info" : "src");
  const uint8_t *h = src;
  if (bytes < OI_CODEC_HEADER_BYTES)
    return oi__fail(OI_ERR_PROTOCOL, "codec: %zu bytes cannot hold a frame's %d-byte header", bytes,
                    OI_CODEC_HEADER_BYTES);
  if (get32(h) != OI_CODEC_MAGIC)
    return oi__fail(OI_ERR_PROTOCOL, "codec: not a frame (magic %08x)", get32(h));
  if (h[4] > OI_CODEC_VERSION)
    return oi__fail(OI_ERR_VERSION, "codec: frame format %u, this build reads up to %d", h[4],
                    OI_CODEC_VERSION);
  if (h[4] == 0) return oi__fail(OI_ERR_PROTOCOL, "codec: frame format 0");
  oi_codec_info in = {.version = h[4], .codec = h[5], .dtype = h[6]};
  in.logical_bytes = get32(h + 8);
  uint32_t plen = get32(h + 12);
  in.shape = (oi_codec_shape){.dtype = h[6],
                              .parts = get16(h + 16),
                              .tokens = get16(h + 18),
                              .heads = get16(h + 20),
                              .head_dim = get16(h + 22)};
  in.data_xxh = get64(h + 24);
  if ((size_t)plen > bytes - OI_CODEC_HEADER_BYTES)
    return oi__fail(OI_ERR_PROTOCOL, "codec: frame of %zu bytes truncated (%zu given)",
                    (size_t)plen + OI_CODEC_HEADER_BYTES, bytes);
  in.frame_bytes = (uint32_t)(OI_CODEC_HEADER_BYTES + plen);
  if (verify && get64(h + 32) != frame_xxh(h, h + OI_CODEC_HEADER_BYTES, plen))
    return oi__fail(OI_ERR_PROTOCOL, "codec: frame checksum mismatch");
  /* A checksummed header from this format's writer: anything else is a
   * writer's bug or a forgery, refused all the same. */
  if (in.codec <= OI_CODEC_NONE || in.codec >= OI_CODEC_COUNT || h[7] ||
      in.dtype > OI_CODEC_DTYPE_BF16)
    return oi__fail(OI_ERR_PROTOCOL, "codec: frame of codec %u, dtype %u, flags %u", in.codec,
                    in.dtype, h[7]);
  /* int8-hadamard came with format 3, the planes code with format 4: an
   * earlier format cannot hold them. */
  if (in.codec == OI_CODEC_INT8_HADAMARD && in.version < 3)
    return oi__fail(OI_ERR_PROTOCOL, "codec: a frame of codec %s in format %u, which predates it",
                    NAMES[in.codec], in.version);
  if (in.codec == OI_CODEC_LOSSLESS && in.version < OI_LOSSLESS_PLANES_VERSION && plen &&
      h[OI_CODEC_HEADER_BYTES] == 3)
    return oi__fail(OI_ERR_PROTOCOL,
                    "codec: a lossless frame of the planes code in format %u, which predates it",
                    in.version);
  if (in.codec != OI_CODEC_LOSSLESS &&
      check_lossy_shape(in.codec, &in.shape, in.logical_bytes, OI_ERR_PROTOCOL) != OI_OK)
    return OI_ERR_PROTOCOL;
  *info = in;
  return OI_OK;
}

oi_status oi__codec_info_of(const void *src, size_t bytes, oi_codec_info *info) {
  return header_of(src, bytes, info, true);
}

oi_status oi__codec_header_of(const void *src, size_t bytes, oi_codec_info *info) {
  return header_of(src, bytes, info, false);
}

oi_status oi__codec_decode_payload(int codec, const oi_codec_shape *shape, const uint8_t *src,
                                   size_t bytes, uint8_t *dst, size_t logical) {
  if (codec == OI_CODEC_LOSSLESS) return oi__lossless_decode(src, bytes, dst, logical);
  if (!is_lossy(codec)) return oi__fail(OI_ERR_PROTOCOL, "codec: unknown codec %d", codec);
  oi_status st = check_lossy_shape(codec, shape, logical, OI_ERR_PROTOCOL);
  if (st != OI_OK) return st;
  if ((uintptr_t)dst & 1)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "codec %s: dst is not 2-byte aligned", NAMES[codec]);
  return codec == OI_CODEC_FP8
             ? oi__fp8_decode(shape, src, bytes, (uint16_t *)dst)
             : oi__int8_decode(shape, src, bytes, (uint16_t *)dst, codec == OI_CODEC_INT8_HADAMARD);
}

oi_status oi__codec_decode(const void *src, size_t bytes, void *dst, size_t cap,
                           size_t *out_bytes) {
  if (!dst || !out_bytes)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "codec: NULL %s", dst ? "out_bytes" : "dst");
  oi_codec_info in;
  oi_status st = oi__codec_info_of(src, bytes, &in);
  if (st != OI_OK) return st;
  if (cap < in.logical_bytes)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "codec: dst of %zu bytes, the block is %u", cap,
                    in.logical_bytes);
  const uint8_t *payload = (const uint8_t *)src + OI_CODEC_HEADER_BYTES;
  st = oi__codec_decode_payload(in.codec, &in.shape, payload,
                                in.frame_bytes - OI_CODEC_HEADER_BYTES, dst, in.logical_bytes);
  if (st != OI_OK) return st;
  if (in.codec == OI_CODEC_LOSSLESS && XXH3_64bits(dst, in.logical_bytes) != in.data_xxh)
    return oi__fail(OI_ERR_PROTOCOL, "codec: lossless block decoded to other bytes (checksum)");
  *out_bytes = in.logical_bytes;
  return OI_OK;
}

bool oi__lossless_gpu_plan(const oi_codec_shape *shape, size_t bytes, oi_lossless_gpu_plan *p) {
  if (!p) {
    oi__fail(OI_ERR_INVALID_ARGUMENT, "codec lossless: NULL plan");
    return false;
  }
  oi_codec_shape sh = shape ? *shape : (oi_codec_shape){0};
  if (sh.dtype > OI_CODEC_DTYPE_BF16 || bytes > OI_CODEC_MAX_BYTES) {
    oi__fail(OI_ERR_INVALID_ARGUMENT, "codec lossless: dtype %u, %zu bytes", sh.dtype, bytes);
    return false;
  }
  *p = (oi_lossless_gpu_plan){0};
  if (!oi__lossless_stream_counts(bytes, sh.parts, &p->parts, &p->segs_parts, &p->segs_whole))
    return false;
  /* (one stream per part at least: past the bound in parts is past it in streams) */
  p->max_segs = OI_MAX(p->segs_parts, p->segs_whole);
  if (p->max_segs > OI_LOSSLESS_GPU_MAX_SEGS) {
    oi__fail(OI_ERR_INVALID_ARGUMENT, "codec lossless: %u streams (%u parts), past %u", p->max_segs,
             p->parts, OI_LOSSLESS_GPU_MAX_SEGS);
    return false;
  }
  /* a stream's room: its exponents raw, its table and states, rounded */
  size_t per = bytes / 2 / OI_MIN(p->segs_parts ? p->segs_parts : p->segs_whole, p->segs_whole);
  p->stream_cap = (uint32_t)((per + 1024 + 255) & ~(size_t)255);
  write_header(p->header, OI_CODEC_LOSSLESS, oi__codec_frame_version(OI_CODEC_LOSSLESS), &sh, bytes,
               0);
  XXH3_generateSecret_fromSeed(p->secret, 0); /* seed 0: the default secret */
  return true;
}

bool oi__lossy_gpu_plan(int codec, const oi_codec_shape *shape, size_t bytes,
                        oi_lossy_gpu_plan *p) {
  if (!p) {
    oi__fail(OI_ERR_INVALID_ARGUMENT, "codec: NULL plan");
    return false;
  }
  if (!is_lossy(codec)) {
    oi__fail(OI_ERR_INVALID_ARGUMENT, "codec: %d is not a lossy codec", codec);
    return false;
  }
  if (check_lossy_shape(codec, shape, bytes, OI_ERR_INVALID_ARGUMENT) != OI_OK) return false;
  *p = (oi_lossy_gpu_plan){.payload_bytes = (uint32_t)payload_bound(codec, shape, bytes),
                           .parts = shape->parts,
                           .tokens = shape->tokens,
                           .heads = shape->heads,
                           .head_dim = shape->head_dim,
                           .rot_block = 1,
                           .down = 1.0f};
  if (codec == OI_CODEC_INT8_HADAMARD) {
    p->rot_block = oi__int8h_block(shape->head_dim);
    p->down = oi__int8h_down(p->rot_block);
  }
  uint8_t h[32] = {0};
  write_header(h, codec, oi__codec_frame_version(codec), shape, bytes, p->payload_bytes);
  memcpy(p->header, h, sizeof p->header);
  p->seed = XXH3_64bits(h, 32);
  XXH3_generateSecret_fromSeed(p->secret, 0); /* seed 0: the default secret */
  return true;
}
