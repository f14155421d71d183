/* The copy pipeline's codec stage (transfer.h's oi_xfer_config.codec,
 * docs/codecs.md): per direction, a pinned bounce group of whole blocks and
 * a lock that makes a group's copies and its codec step one unit of the
 * stream, and the workers that encode and decode a group's blocks in
 * parallel (the step's own thread, a stream's worker or a CUDA host
 * function, takes part and waits for the rest). */
#ifndef OI_TRANSFER_CODEC_STAGE_H
#define OI_TRANSFER_CODEC_STAGE_H

#include "codec/codec.h"
#include "device/device.h"

typedef struct oi_codec_stage oi_codec_stage;

/* Most blocks of one bounce group: group_blocks[d] is lowered to fit. */
#define OI_CODEC_BOUNCE_BYTES (32ull << 20)
/* Most encode/decode threads besides the step's own. */
#define OI_CODEC_MAX_WORKERS 7
/* Per-block bounces of layerwise saves are allocated in chunks of about
 * this many bytes (one block at least) as they are needed. */
#define OI_CODEC_BLOCK_CHUNK_BYTES (4ull << 20)

/* What a stage is made for: blocks of `block_bytes` in frame slots of
 * `frame_bytes`, per-block bounces (oi__codec_stage_block_take) bounded by
 * `block_bounce_bytes`; `planes`: a lossless stage's frames code their
 * exponents by the planes code (oi__codec_encode_planes). */
typedef struct oi_codec_stage_config {
  int codec;
  oi_codec_shape shape;
  uint64_t block_bytes, frame_bytes, block_bounce_bytes;
  bool planes;
  const uint32_t *log_id;
} oi_codec_stage_config;

/* A stage on device `dev` (its pinned memory). group_blocks[2] (per
 * direction, in and out) bound the bounce groups and are lowered to fit.
 * Messages start with "register". */
oi_status oi__codec_stage_create(oi_dev *dev, const oi_codec_stage_config *c,
                                 uint64_t group_blocks[2], oi_codec_stage **out);
/* Stops the workers, frees the buffers. Accepts NULL. */
void oi__codec_stage_destroy(oi_codec_stage *s);

/* Direction d's bounce blocks (group_blocks[d] of them). */
uint8_t *const *oi__codec_stage_bounce(const oi_codec_stage *s, int d);
/* Direction d's queueing lock (a group's copies and its step, queued). */
void oi__codec_stage_lock(oi_codec_stage *s, int d);
void oi__codec_stage_unlock(oi_codec_stage *s, int d);

/* Encodes the D2H bounce blocks [0, n) into slots[0..n), zeroing each slot
 * past its frame. A block that does not encode or whose frame does not fit
 * its slot gets bad[i] = 1 (its slot holds nothing to keep). @return how
 * many did not; when any, oi_last_error() on this thread says why the
 * first did not. */
size_t oi__codec_stage_encode(oi_codec_stage *s, uint8_t *const *slots, size_t n, uint8_t *bad);
/* The same from the blocks src[0..n) (per-block bounces). Encodes of the
 * stage run one at a time (they share the scratch frames): a caller waits
 * for the one running. */
size_t oi__codec_stage_encode_from(oi_codec_stage *s, uint8_t *const *src, uint8_t *const *slots,
                                   size_t n, uint8_t *bad);

/* A block of block_bytes of pinned memory of the stage's own, for a block
 * saved layer by layer until its last arena landed: NULL when the stage's
 * block_bounce_bytes are all taken (or no memory). Thread-safe. Given back
 * blocks are kept for the next take; all are freed with the stage. */
uint8_t *oi__codec_stage_block_take(oi_codec_stage *s);
void oi__codec_stage_block_put(oi_codec_stage *s, uint8_t *block);
/* Verifies and decodes the frames of slots[0..n) into the H2D bounce blocks
 * [0, n). A frame that is not whole, of another codec or of another size
 * clears its bounce block. @return OI_OK, or OI_ERR_PROTOCOL (logged, the
 * first failure's reason) when any did not decode. */
oi_status oi__codec_stage_decode(oi_codec_stage *s, uint8_t *const *slots, size_t n);

#endif
