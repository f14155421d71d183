/* The codec of an engine's namespace (oi_engine_options.codec,
 * docs/codecs.md): the options checked against the layout, the slot a frame
 * gets in the pool, and the fingerprint the codec adds to the namespace's
 * identity. */
#ifndef OI_ENGINE_CODEC_H
#define OI_ENGINE_CODEC_H

#include "codec/codec.h"
#include "openinfer/engine.h"
#include "transfer/plan.h"

typedef struct engine_codec {
  int id; /* oi_codec_id; OI_CODEC_NONE: blocks stored as they are */
  oi_codec_shape shape;
  uint64_t slot_bytes; /* a frame's slot in the pool (0 for none) */
} engine_codec;

/* Default lossless slot: this share of the block, in percent. */
#define OI_CODEC_LOSSLESS_SLOT_PCT 74

/* Checks the codec fields of `o` against layout `l` into *out; messages
 * start with `what`. OI_ERR_INVALID_ARGUMENT names the field. */
oi_status oi__engine_codec_resolve(const oi_engine_options *o, const oi_layout *l, const char *what,
                                   engine_codec *out);

/* What the namespace stores per block: the frame slot, or the block. */
static inline uint64_t oi__engine_codec_stored_bytes(const engine_codec *c, const oi_layout *l) {
  return c->id == OI_CODEC_NONE ? l->block_bytes : c->slot_bytes;
}

/* The namespace's shape fingerprint: the layout's unchanged without a codec
 * (namespaces bound before codecs existed keep theirs), else mixed with the
 * codec, its format version, the shape and the slot, so two engines differing
 * in any of them never share a namespace, in the pool or a tier. */
uint64_t oi__engine_codec_shape_hash(const engine_codec *c, uint64_t layout_hash);

#endif
