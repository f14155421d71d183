/* Launchers of the CUDA kernels (extern "C", called only from lib/device/cuda.c
 * and benchmarks). Each returns a cudaError_t as int. */
#ifndef OI_KERNELS_H
#define OI_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Writes oi__pattern_byte(seed, i) to dst[i] for i in [0, bytes) on `stream`. */
int oi_kernel_fill_pattern(void *dst, size_t bytes, uint64_t seed, void *stream);

/* One entry of a batch copy: at most OI_KCOPY_CHUNK bytes. */
typedef struct oi_kcopy_entry {
  uint64_t src;
  uint64_t dst;
  uint64_t bytes;
} oi_kcopy_entry;

#define OI_KCOPY_CHUNK (128u << 10)
#define OI_KCOPY_THREADS 512

/* Copies every entry with at most `ctas` CTAs. The table may be in device
 * memory or in mapped pinned host memory (it is read one entry ahead). */
int oi_kernel_batch_copy(const oi_kcopy_entry *entries, uint32_t n, uint32_t ctas, void *stream);

/* Pieces averaging less than this go one warp per entry (entries of at most
 * OI_KCOPY_WARP_CHUNK bytes): a CTA then has OI_KCOPY_THREADS / 32 pieces in
 * flight, where the CTA-wide copy has one. */
#define OI_KCOPY_WARP_BELOW (64u << 10)
#define OI_KCOPY_WARP_CHUNK (32u << 10)

/* As oi_kernel_batch_copy, one warp per entry. */
int oi_kernel_batch_copy_warps(const oi_kcopy_entry *entries, uint32_t n, uint32_t ctas,
                               void *stream);

/* The GPU decoder of the codec frames (kernels/codec.cu; the format is
 * docs/codecs.md's, the pieces lib/codec's oi_codec_piece with absolute
 * addresses). Kinds as oi_codec_piece_kind. */
enum {
  OI_KDEC_RANS = 1,
  OI_KDEC_RAW_EXP = 2,
  OI_KDEC_BYTES = 3,
  OI_KDEC_INT8 = 4,
  OI_KDEC_FP8 = 5,
  OI_KDEC_RANS32 = 6,
  OI_KDEC_INT8H = 7,  /* int8-hadamard: as INT8, the codes rotated (lib/codec/int8.c) */
  OI_KDEC_PLANES = 8, /* a stream of the planes code (lib/codec/planes.h), else as RANS */
};

typedef struct oi_kdec_item {
  uint64_t src, aux, dst; /* device addresses */
  uint32_t len, count;
  uint32_t frame; /* the status entry of the item's frame */
  uint16_t kind, tokens, heads, head_dim;
} oi_kdec_item;

/* What a frame's status entry says after a decode (0: decoded). */
enum {
  OI_KDEC_BAD_STREAM = 1, /* a rANS stream does not decode (its table, a read past its end,
                           * final states) */
  OI_KDEC_BAD_SCALE = 2,  /* a lossy scale that is not finite */
  OI_KDEC_NAN_CODE = 3,   /* an fp8 NaN code */
};

/* Which of oi_kernel_codec_decode's lossless kernels decodes items of a
 * kind: a bit of its `lossless` mask (0: a lossy kind). */
static inline unsigned oi_kdec_lossless_kernel(unsigned kind) {
  return kind == OI_KDEC_RANS32                                                     ? 2u
         : kind == OI_KDEC_PLANES                                                   ? 4u
         : kind == OI_KDEC_RANS || kind == OI_KDEC_RAW_EXP || kind == OI_KDEC_BYTES ? 1u
                                                                                    : 0u;
}

/* Decodes the items (a table in device memory) on `stream`; a frame's
 * items write only its own block, and status[frame] (device memory, zeroed
 * by the caller) gets a nonzero code when one of them fails (the block's
 * bytes are then not to be used). Lossless items run in three kernels (a
 * warp an item, a warp a wide stream, a CTA a planes stream), each
 * launched only where `lossless` (the OR of the items'
 * oi_kdec_lossless_kernel) has its bit; lossy ones run in a grid over their
 * elements, `max_lossy_elems` the most of an item (0: none). */
int oi_kernel_codec_decode(const oi_kdec_item *items, uint32_t n, unsigned lossless,
                           uint64_t max_lossy_elems, int32_t *status, void *stream);

/* The items of kind OI_KDEC_PLANES (kernels/codec_planes.cu; the others
 * are skipped): a CTA a stream, a warp a chunk. oi_kernel_codec_decode
 * runs it with the lossless kernels. */
int oi_kernel_planes_decode(const oi_kdec_item *items, uint32_t n, int32_t *status, void *stream);

/* Zeroes block i (blocks + i * block_bytes) of each frame i < n whose
 * status is nonzero: a block that did not decode goes out as zeros. */
int oi_kernel_codec_zero_failed(const int32_t *status, uint32_t n, uint8_t *blocks,
                                uint64_t block_bytes, void *stream);

/* The GPU encoder of the wide rANS stream (kernels/codec_encode.cu): one
 * item a stream, its output byte for byte lib/codec's oi__rans32_encode of
 * the exponent bytes (bits 7..14) of `count` bf16 elements at src, into
 * dst with at most `cap` bytes; scratch is `cap` bytes of device memory of
 * the item's own. lens[k] gets the stream's length, 0 when it would not
 * fit in cap (as the cpu encoder's 0). hist: 0, or the device address of
 * the item's exponent histogram (256 u32) when another kernel counted it. */
typedef struct oi_kenc_item {
  uint64_t src, dst, scratch; /* device addresses */
  uint32_t count, cap;
  uint64_t hist;
} oi_kenc_item;

int oi_kernel_rans32_encode(const oi_kenc_item *items, uint32_t n, uint32_t *lens, void *stream);

/* The same items coded by the planes code (kernels/codec_planes_encode.cu):
 * byte for byte lib/codec's oi__planes_encode; hist must be set (a stream
 * without one, or of count 0, gets length 0); scratch holds 16 bytes a
 * chunk of 1,024. n at most 65,535. */
int oi_kernel_planes_encode(const oi_kenc_item *items, uint32_t n, uint32_t *lens, void *stream);

/* Lossless frames made on the GPU (kernels/codec_frame.cu): block i of
 * `blocks` (n blocks of block_bytes, device memory) becomes the frame
 * lib/codec's oi__codec_encode makes of it where both candidate stream
 * counts give wide streams, in frame i of `frames` (frame_bytes each),
 * zeros behind it; status[i] is 0, or OI_KENC_PAST_SLOT when the frame
 * does not fit its slot (its bytes are then no frame). The other buffers
 * are the kernels' scratch, all device memory: hist n * max(parts,
 * max_segs) * 256 u32, items n * max_segs oi_kenc_item, lens n * max_segs u32,
 * segs n u32, streams and scratch n * max_segs * stream_cap bytes. parts:
 * the block's parts when the encoder may code one stream per part (else
 * 0); segs_parts and segs_whole the stream counts of either choice
 * (lossless.c's cap_segments). header: the frame's first 24 bytes (its
 * payload length is written here). secret: XXH3's default secret, 192
 * bytes of device memory. block_bytes and frame_bytes are multiples of 8,
 * blocks and frames 8-byte aligned. */
#define OI_KFRAME_HEADER 40
#define OI_KFRAME_MAX_PARTS 1024u
#define OI_KFRAME_MAX_SEGS 1024u
enum { OI_KENC_PAST_SLOT = 1 };

typedef struct oi_kframe_args {
  uint64_t blocks, frames, hist, items, lens, segs, streams, scratch, status, secret;
  uint64_t sums, secrets; /* the checksums' scratch: n * oi_kframe_sums_bytes and n * 192
                           * bytes */
  uint64_t block_bytes, frame_bytes;
  uint32_t n, parts, segs_whole, segs_parts, max_segs, stream_cap;
  uint32_t planes; /* the streams are the planes code's (lossless mode 3, frames of format
                    * OI_KFRAME_PLANES_VERSION), else wide rANS */
  uint8_t header[24];
} oi_kframe_args;
#define OI_KFRAME_PLANES_VERSION 4

/* A frame's bytes of oi_kframe_args.sums: 64 per whole 1 KiB block of the
 * longer of its block and its payload (at most its slot). */
#ifdef __CUDACC__
__host__ __device__
#endif
    static inline uint64_t
    oi_kframe_sums_bytes(uint64_t block_bytes, uint64_t frame_bytes) {
  uint64_t longer = block_bytes > frame_bytes ? block_bytes : frame_bytes;
  return 64 * ((longer - 1) / 1024);
}

/* On `stream`; with a `side` stream (else NULL), the data checksums run
 * there beside the encode, forked and joined by the caller's events `fork`
 * and `join` (cudaEvent_t). */
int oi_kernel_lossless_frames(const oi_kframe_args *a, void *stream, void *side, void *fork,
                              void *join);

/* XXH3-64 (seed 0: XXH3_64bits, else XXH3_64bits_withSeed) of each item's
 * len bytes at src (240 < len <= max_len, src 8-byte aligned, device
 * memory) into *out (device memory), by the frames' own checksum steps;
 * scratch: the item's device memory, 192 + 64 * ((len - 1) / 1024) bytes,
 * 8-byte aligned; secret as above. */
typedef struct oi_khash_item {
  uint64_t src, len, seed, out, scratch;
} oi_khash_item;

int oi_kernel_xxh3(const oi_khash_item *items, uint32_t n, uint64_t max_len, const void *secret,
                   void *stream);

/* Lossy frames made on the GPU (kernels/codec_lossy.cu): block i of
 * `blocks` (n blocks of block_bytes, device memory) becomes the frame
 * lib/codec's oi__codec_encode makes of it under int8, int8-hadamard or fp8
 * (kind), byte for byte, in frame i of `frames` (frame_bytes each), zeros
 * behind it; status[i] is 0, or OI_KENC_REFUSED where the cpu encoder
 * refuses the block (a non-finite value, an int8 scale past fp16's range:
 * its bytes are then no frame). header: the frame's first 24 bytes; seed:
 * the XXH3-64 of its first 32 (the 24, then 8 zero bytes), the payload
 * checksum's seed; down: int8-hadamard's 2^-floor(log2(rot_block) / 2),
 * rot_block its transform's width (head_dim at most OI_KLOSSY_MAX_DIM).
 * items: n oi_khash_item and scratch: n * oi_klossy_scratch_bytes, device
 * memory; secret: XXH3's default secret, 192 bytes of device memory. */
#define OI_KLOSSY_MAX_DIM 1024u
enum { OI_KLOSSY_INT8 = 1, OI_KLOSSY_INT8H = 2, OI_KLOSSY_FP8 = 3 };
enum { OI_KENC_REFUSED = 2 };

typedef struct oi_klossy_args {
  uint64_t blocks, frames, status, items, scratch, secret;
  uint64_t block_bytes, frame_bytes, seed;
  uint32_t n, kind, payload_bytes, parts, tokens, heads, head_dim, rot_block;
  float down;
  uint8_t header[24];
} oi_klossy_args;

#ifdef __CUDACC__
__host__ __device__
#endif
    static inline uint64_t
    oi_klossy_scratch_bytes(uint64_t payload_bytes) {
  return 192 + 64 * ((payload_bytes - 1) / 1024);
}

int oi_kernel_lossy_frames(const oi_klossy_args *a, void *stream);

#ifdef __cplusplus
}
#endif
#endif
