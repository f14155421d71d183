/* The KV block codecs: pure functions that compress and decompress one block
 * of KV bytes (no I/O, no state; the caller's buffers, and scratch memory
 * only for the lossless codec's blocks past 16 KiB).
 * Every compressed block is a self-describing frame: a 40-byte header (magic,
 * format version, codec, dtype, shape, lengths, checksums) and the codec's
 * payload. The frame's checksum (XXH3-64 over the header's first 32 bytes
 * and the payload) is verified before any payload byte is decoded, so a
 * block that crossed a process, a disk or a network is either decoded from
 * the bytes it was encoded into or refused; the lossless codec also carries
 * the XXH3-64 of the original bytes and checks the decoded bytes against it.
 * docs/codecs.md describes the formats and their measured ratios.
 *
 * Codecs:
 * - OI_CODEC_LOSSLESS: bit-exact, any length. bf16 elements are split into
 *   an exponent plane (bits 7..14) coded by an order-0 rANS coder (one
 *   stream per part of the shape where that pays) and a sign+mantissa
 *   plane stored raw; an exponent plane that does not shrink is stored
 *   raw, so a block never grows by more than the header and a few bytes.
 * - OI_CODEC_INT8: lossy, symmetric int8 with one fp16 scale per token and
 *   head (amax / 127).
 * - OI_CODEC_FP8: lossy, fp8 e4m3 (OCP "fn": no infinities, max 448) with
 *   one fp32 scale per part and head over the block's tokens (amax / 448).
 * - OI_CODEC_INT8_HADAMARD: lossy, int8's payload of each head's values
 *   rotated by a Walsh-Hadamard transform first (blocks of the largest
 *   power of two dividing head_dim, at most OI_INT8H_BLOCK_MAX): the same
 *   size as int8, a third of its KL on the real model (docs/codecs.md).
 * The lossy codecs need the block's shape: elements ordered
 * [parts][tokens][heads][head_dim] (a part is K or V of one layer, or any
 * run of whole (tokens, heads, head_dim) tensors) and finite values.
 *
 * Errors: every function returns an oi_status and sets oi_last_error():
 * OI_ERR_INVALID_ARGUMENT for a bad argument, shape or dtype, a buffer too
 * small (the message gives the size needed) or a non-finite value under a
 * lossy codec; OI_ERR_VERSION for a frame of a later format; OI_ERR_PROTOCOL
 * for bytes that are not a whole frame (bad magic, truncated, checksum
 * mismatch, a payload that does not decode, decoded bytes that are not the
 * original's); OI_ERR_OUT_OF_MEMORY when the lossless decoder's scratch
 * plane of a block past 16 KiB cannot be allocated (the encoder then stores
 * the exponent plane raw instead: a larger frame, never a failure). */
#ifndef OI_CODEC_CODEC_H
#define OI_CODEC_CODEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "openinfer/common.h"

typedef enum oi_codec_id {
  OI_CODEC_NONE = 0, /* not a frame: blocks stored as they are */
  OI_CODEC_LOSSLESS = 1,
  OI_CODEC_INT8 = 2,
  OI_CODEC_FP8 = 3,
  OI_CODEC_INT8_HADAMARD = 4, /* frames of format version 3 */
} oi_codec_id;
#define OI_CODEC_COUNT 5
/* int8-hadamard's transform block: head_dim's largest power-of-two divisor,
 * at most this (oi__int8h_block). */
#define OI_INT8H_BLOCK_MAX 256u
unsigned oi__int8h_block(unsigned head_dim);

typedef enum oi_codec_dtype {
  OI_CODEC_DTYPE_BYTES = 0, /* opaque bytes (lossless only: planes of 16-bit elements) */
  OI_CODEC_DTYPE_BF16 = 1,
} oi_codec_dtype;

/* The frame format. */
#define OI_CODEC_MAGIC 0x434b494fu /* "OIKC" little-endian */
/* The newest format this build reads. A frame is written with the format
 * that introduced its codec's payload (oi__codec_frame_version), so a reader
 * of an earlier build refuses only the frames it cannot read, as too new:
 * 2: lossless payloads may hold wide rANS streams (mode 2);
 * 3: int8-hadamard;
 * 4: lossless payloads may hold streams of the planes code (mode 3).
 * Frames of version 1 still decode. */
#define OI_CODEC_VERSION 4
#define OI_CODEC_HEADER_BYTES 40
/* The largest block a frame holds (its lengths are 32-bit). */
#define OI_CODEC_MAX_BYTES ((size_t)UINT32_MAX - 4096)

/* A block's shape: `parts` tensors of [tokens][heads][head_dim] elements of
 * `dtype`. The lossless codec needs only the dtype (and accepts a zero
 * shape); the lossy ones need all four and a bf16 dtype. */
typedef struct oi_codec_shape {
  uint8_t dtype; /* oi_codec_dtype */
  uint16_t parts, tokens, heads, head_dim;
} oi_codec_shape;

/* What a frame's header says, once verified. */
typedef struct oi_codec_info {
  uint8_t codec, version, dtype;
  oi_codec_shape shape;
  uint32_t logical_bytes; /* the block's bytes once decoded */
  uint32_t frame_bytes;   /* header + payload */
  uint64_t data_xxh;      /* XXH3-64 of the original bytes (lossless), else 0 */
} oi_codec_info;

/* The format version a frame of `codec` is written with (2, or 3 for
 * int8-hadamard); 0 for an unknown id. It is part of a codec namespace's
 * identity. */
unsigned oi__codec_frame_version(int codec);

/* Static name ("lossless"); NULL for an unknown id. */
const char *oi__codec_name(int codec);
/* The id of a name ("none", "lossless", "int8", "fp8", "int8-hadamard");
 * -1 if unknown. */
int oi__codec_from_name(const char *name);

/* The largest frame oi__codec_encode writes for `bytes` of input (the exact
 * size for the lossy codecs, which need the shape); 0 when the codec or the
 * shape is not one encode takes. */
size_t oi__codec_bound(int codec, const oi_codec_shape *shape, size_t bytes);

/* Compresses `src[0..bytes)` with `codec` into dst (capacity `cap`,
 * oi__codec_bound is always enough); *out_bytes gets the frame's length.
 * The lossy codecs need bytes == parts * tokens * heads * head_dim * 2. */
oi_status oi__codec_encode(int codec, const oi_codec_shape *shape, const void *src, size_t bytes,
                           void *dst, size_t cap, size_t *out_bytes);

/* oi__codec_encode of a lossless frame whose exponents are coded by the
 * planes code (codec/planes.h: fixed-width planes a GPU packs with warp
 * ballots), format OI_LOSSLESS_PLANES_VERSION. Not yet what a lossless
 * namespace writes: its GPU encoder and decoder are to come
 * (docs/codecs.md "The planes code"). */
#define OI_LOSSLESS_PLANES_VERSION 4
oi_status oi__codec_encode_planes(const oi_codec_shape *shape, const void *src, size_t bytes,
                                  void *dst, size_t cap, size_t *out_bytes);

/* Verifies a frame (at the start of `src[0..bytes)`: bytes past the frame,
 * such as a slot's padding, are ignored) and decodes it into
 * dst (capacity `cap` >= its logical bytes); *out_bytes gets them. */
oi_status oi__codec_decode(const void *src, size_t bytes, void *dst, size_t cap, size_t *out_bytes);

/* Reads and verifies a frame's header and checksum without decoding. */
oi_status oi__codec_info_of(const void *src, size_t bytes, oi_codec_info *info);
/* The same checks but the checksum's (a frame in this process's own memory
 * that no disk or network carried since a check: the GPU decoder's path,
 * which checks each stream's end states instead). */
oi_status oi__codec_header_of(const void *src, size_t bytes, oi_codec_info *info);

/* A frame cut into pieces that decode independently, for a decoder that
 * runs many at once (the GPU's, kernels/codec.cu). Offsets: `src` and `aux`
 * from the frame's first byte, `dst` from the decoded block's. */
typedef enum oi_codec_piece_kind {
  OI_CODEC_PIECE_RANS = 1,    /* lossless: a rANS stream src[0..len) of `count` exponents,
                               * their sign+mantissa bytes at aux; 2 count bytes to dst */
  OI_CODEC_PIECE_RAW_EXP = 2, /* lossless: `count` raw exponents at src, sign+mantissa at aux */
  OI_CODEC_PIECE_BYTES = 3,   /* `count` bytes copied from src (an odd block's last byte) */
  OI_CODEC_PIECE_INT8 = 4,    /* a whole int8 payload at src: `count` groups (parts x tokens
                               * x heads) of head_dim */
  OI_CODEC_PIECE_FP8 = 5,     /* a whole fp8 payload at src: count = parts */
  OI_CODEC_PIECE_RANS32 = 6,  /* lossless: a wide rANS stream (codec/rans.h), else as RANS */
  OI_CODEC_PIECE_INT8H = 7,   /* a whole int8-hadamard payload: as INT8 */
  OI_CODEC_PIECE_PLANES = 8,  /* lossless: a stream of the planes code (codec/planes.h), else
                               * as RANS */
} oi_codec_piece_kind;

typedef struct oi_codec_piece {
  uint32_t kind; /* oi_codec_piece_kind */
  uint32_t src, aux, dst;
  uint32_t len, count;
  uint16_t tokens, heads, head_dim;
} oi_codec_piece;

/* The most exponents the lossless encoder codes in one rANS stream, where
 * the block's elements divide evenly (lossless.c, cap_segments): a piece
 * each. Frames of earlier writers may have longer streams; they decode. */
#define OI_LOSSLESS_SEGMENT_MAX 32768u

/* The most pieces oi__codec_pieces cuts a verified frame of `info` into. */
size_t oi__codec_pieces_max(const oi_codec_info *info, const void *frame);

/* Reads a frame's header (oi__codec_info_of, or oi__codec_header_of when
 * `verify` is false) and cuts its payload into pieces (out: at least
 * oi__codec_pieces_max entries; cap says how many), checking every length as
 * the cpu decoder does. The pieces do not check a lossless block's checksum
 * of its decoded bytes: a decoder of pieces verifies each stream's end
 * states instead. */
oi_status oi__codec_pieces(const void *frame, size_t bytes, bool verify, oi_codec_info *info,
                           oi_codec_piece *out, size_t cap, size_t *n);

/* What a GPU needs to make a block's lossless frame byte for byte as
 * oi__codec_encode does (kernels/codec_frame.cu): the stream counts of
 * either choice the encoder makes (one stream per part, or streams of the
 * whole block; each then capped at OI_LOSSLESS_SEGMENT_MAX exponents), the
 * part count it chooses by (0: it codes the whole block), the room of each
 * stream, and the frame's first 24 bytes but its payload length (bytes
 * 12..15, zero here) and XXH3's secret. Only blocks whose streams are all wide qualify (even
 * lengths, multiples of 8, at most OI_LOSSLESS_GPU_MAX_SEGS streams or
 * parts): false otherwise, with the reason in oi_last_error(). A stream
 * whose code passes its room makes the frame raw where the cpu might still
 * have coded it (a stream coded past its own length; not seen in real KV). */
#define OI_LOSSLESS_GPU_MAX_SEGS 1024u
typedef struct oi_lossless_gpu_plan {
  uint32_t parts, segs_parts, segs_whole, max_segs, stream_cap;
  uint8_t header[24];
  uint8_t secret[192]; /* XXH3's default secret, for a GPU's checksums */
} oi_lossless_gpu_plan;
bool oi__lossless_gpu_plan(const oi_codec_shape *shape, size_t bytes, oi_lossless_gpu_plan *p);

/* What a GPU needs to make a block's frame under a lossy codec byte for
 * byte as oi__codec_encode does (kernels/codec_lossy.cu): the frame's first
 * 24 bytes (bytes 24..31 are zero), the XXH3-64 of its first 32 (the
 * payload checksum's seed), the payload's exact length, the shape, and for
 * int8-hadamard the transform's width and its 2^-floor(log2(width) / 2)
 * (1 and 1 otherwise). False, with the reason in oi_last_error(), for a
 * codec that is not lossy or a shape it does not take. */
typedef struct oi_lossy_gpu_plan {
  uint8_t header[24];
  uint8_t secret[192];
  uint64_t seed;
  uint32_t payload_bytes, parts, tokens, heads, head_dim, rot_block;
  float down;
} oi_lossy_gpu_plan;
bool oi__lossy_gpu_plan(int codec, const oi_codec_shape *shape, size_t bytes, oi_lossy_gpu_plan *p);

/* The payload decoders without the frame's checksum: for the fuzz target,
 * which must reach them with arbitrary bytes. They validate everything they
 * read and never touch memory outside src[0..bytes) and dst[0..logical). */
oi_status oi__codec_decode_payload(int codec, const oi_codec_shape *shape, const uint8_t *src,
                                   size_t bytes, uint8_t *dst, size_t logical);

#endif
