/* Copy plans: a layout and a list of (device block id, host block) pairs
 * become one descriptor list for a device stream, with runs that are
 * contiguous on both sides merged into one piece. */
#ifndef OI_TRANSFER_PLAN_H
#define OI_TRANSFER_PLAN_H

#include "device/device.h"

#define OI_LAYOUT_MAX_SEGMENTS 8

/* One arena of a validated layout, with absolute addresses. Block b, segment
 * s lives at base + seg_off[s] + b * block_stride (seg_off[s] is
 * s * segment_stride unless the layout gave segment offsets: then a segment
 * may be a region of its own). */
typedef struct oi_arena_rt {
  char *name;
  uintptr_t base;
  uint64_t num_blocks;
  uint64_t bytes_per_block;
  uint64_t block_stride;
  uint64_t segment_stride;
  uint32_t segments;
  uint64_t host_offset; /* where this arena's slices start inside a host block */
  uint64_t seg_off[OI_LAYOUT_MAX_SEGMENTS];
} oi_arena_rt;

typedef struct oi_layout {
  uint32_t num_arenas;
  oi_arena_rt *arenas;
  uint64_t num_blocks;
  uint64_t block_bytes; /* one host block: every arena's segments */
  uint64_t shape_hash;  /* fingerprint of (segments, bytes_per_block) per arena */
} oi_layout;

/* The most pieces n blocks of `l` make (before merging). */
size_t oi__plan_pieces(const oi_layout *l, size_t n);
/* Builds the descriptors moving block ids[i] <-> host_blocks[i] for every
 * arena and segment, in direction `dir` (D2H: device is the source), into
 * descs[0..cap) when n blocks fit there (oi__plan_pieces(l, n) <= cap):
 * true, with *n_descs set; false otherwise. */
bool oi__plan_build_into(const oi_layout *l, const int64_t *ids, uint8_t *const *host_blocks,
                         size_t n, oi_copy_dir dir, oi_copy_desc *descs, size_t cap,
                         size_t *n_descs);

#endif
