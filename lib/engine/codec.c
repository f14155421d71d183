/* The codec of an engine's namespace (engine/codec.h). */
#include "engine/codec.h"

#include <string.h>
#include <xxhash.h>

#include "host/host.h"

/* The shape fields: all 0 (no shape), or all set and within a frame's u16
 * fields, dividing the block into whole parts of bf16 elements. */
static oi_status shape_of(const oi_engine_options *o, const oi_layout *l, const char *what,
                          const char *name, bool required, oi_codec_shape *sh) {
  uint32_t t = o->codec_tokens, h = o->codec_heads, d = o->codec_head_dim;
  memset(sh, 0, sizeof *sh);
  sh->dtype = OI_CODEC_DTYPE_BF16;
  if (!t && !h && !d) {
    if (required)
      return oi__fail(OI_ERR_INVALID_ARGUMENT,
                      "%s: codec %s needs the block's shape (codec_tokens, codec_heads, "
                      "codec_head_dim)",
                      what, name);
    return OI_OK;
  }
  if (!t || !h || !d || t > UINT16_MAX || h > UINT16_MAX || d > UINT16_MAX)
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "%s: codec shape %u tokens x %u heads x %u head_dim: each must be 1..65535",
                    what, t, h, d);
  uint64_t part = (uint64_t)t * h * d * 2;
  if (l->block_bytes % part || l->block_bytes / part > UINT16_MAX)
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "%s: blocks of %llu bytes are not whole parts of %u tokens x %u heads x %u "
                    "head_dim bf16 (%llu bytes each, at most 65535 parts)",
                    what, (unsigned long long)l->block_bytes, t, h, d, (unsigned long long)part);
  *sh = (oi_codec_shape){.dtype = OI_CODEC_DTYPE_BF16,
                         .parts = (uint16_t)(l->block_bytes / part),
                         .tokens = (uint16_t)t,
                         .heads = (uint16_t)h,
                         .head_dim = (uint16_t)d};
  return OI_OK;
}

oi_status oi__engine_codec_resolve(const oi_engine_options *o, const oi_layout *l, const char *what,
                                   engine_codec *out) {
  memset(out, 0, sizeof *out);
  const char *name = o->codec ? o->codec : "none";
  int id = oi__codec_from_name(name);
  if (id < 0)
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "%s: codec '%s' is not one of none, lossless, int8, int8-hadamard, fp8", what,
                    name);
  if (id == OI_CODEC_NONE) {
    if (o->codec_tokens || o->codec_heads || o->codec_head_dim || o->codec_slot_bytes)
      return oi__fail(OI_ERR_INVALID_ARGUMENT,
                      "%s: codec_tokens, codec_heads, codec_head_dim and codec_slot_bytes are for "
                      "a codec; codec is none",
                      what);
    return OI_OK;
  }
  if (l->block_bytes > OI_CODEC_MAX_BYTES)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "%s: blocks of %llu bytes are past a frame's limit",
                    what, (unsigned long long)l->block_bytes);
  oi_codec_shape sh;
  oi_status st = shape_of(o, l, what, name, id != OI_CODEC_LOSSLESS, &sh);
  if (st != OI_OK) return st;
  uint64_t bound = oi__codec_bound(id, &sh, l->block_bytes);
  if (bound == 0)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "%s: codec %s takes no block of this shape", what,
                    name);
  uint64_t slot = o->codec_slot_bytes;
  if (id == OI_CODEC_LOSSLESS) {
    if (!slot) {
      /* Rounded down to the pool's slot alignment (the pool would round
       * up: a 12 KiB page's 74 % would take 75 %). */
      slot = l->block_bytes * OI_CODEC_LOSSLESS_SLOT_PCT / 100 & ~(uint64_t)(OI_SLOT_ALIGN - 1);
      if (slot < OI_CODEC_HEADER_BYTES + OI_SLOT_ALIGN)
        slot = OI_CODEC_HEADER_BYTES + OI_SLOT_ALIGN;
      if (slot > bound) slot = bound;
    }
    if (slot < OI_CODEC_HEADER_BYTES || slot > bound)
      return oi__fail(OI_ERR_INVALID_ARGUMENT,
                      "%s: codec_slot_bytes %llu is outside [%d, %llu] (the largest lossless "
                      "frame of a %llu-byte block)",
                      what, (unsigned long long)slot, OI_CODEC_HEADER_BYTES,
                      (unsigned long long)bound, (unsigned long long)l->block_bytes);
  } else if (slot && slot != bound) {
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "%s: codec %s frames of this shape are %llu bytes; codec_slot_bytes %llu "
                    "(0: that size)",
                    what, name, (unsigned long long)bound, (unsigned long long)slot);
  } else {
    slot = bound;
  }
  *out = (engine_codec){.id = id, .shape = sh, .slot_bytes = slot};
  return OI_OK;
}

uint64_t oi__engine_codec_shape_hash(const engine_codec *c, uint64_t layout_hash) {
  if (c->id == OI_CODEC_NONE) return layout_hash;
  uint64_t v[8] = {layout_hash,    (uint64_t)c->id,  oi__codec_frame_version(c->id),
                   c->shape.dtype, c->shape.parts,   c->shape.tokens,
                   c->shape.heads, c->shape.head_dim};
  uint64_t h = XXH3_64bits(v, sizeof v);
  return XXH3_64bits_withSeed(&c->slot_bytes, sizeof c->slot_bytes, h);
}
