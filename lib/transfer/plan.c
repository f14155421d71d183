#include "plan.h"

static size_t pieces_per_block(const oi_layout *l) {
  size_t p = 0;
  for (uint32_t a = 0; a < l->num_arenas; a++)
    p += l->arenas[a].segments;
  return p;
}

/* The piece being built, kept apart from d[] (in registers once inlined):
 * stores to d[] could alias ids[] and the layout for the compiler, which
 * would reload them for every piece otherwise. */
typedef struct piece_acc {
  uintptr_t src, dst, bytes; /* bytes 0: none yet */
  size_t k;                  /* pieces stored in d[] */
} piece_acc;

static inline void add_piece(piece_acc *a, oi_copy_desc *d, uintptr_t src, uintptr_t dst,
                             uint64_t len) {
  if (a->bytes && a->src + a->bytes == src && a->dst + a->bytes == dst) {
    a->bytes += len; /* contiguous on both sides: one piece */
    return;
  }
  if (a->bytes) d[a->k++] = (oi_copy_desc){.src = a->src, .dst = a->dst, .bytes = a->bytes};
  a->src = src;
  a->dst = dst;
  a->bytes = len;
}

static size_t plan(const oi_layout *l, const int64_t *ids, uint8_t *const *host_blocks, size_t n,
                   oi_copy_dir dir, oi_copy_desc *d) {
  const bool d2h = dir == OI_COPY_D2H;
  const uint32_t narenas = l->num_arenas;
  const oi_arena_rt *arenas = l->arenas;
  piece_acc a = {0, 0, 0, 0};
  if (narenas == 1 && arenas[0].segments == 1) { /* one piece a block: the common case */
    const uintptr_t base = arenas[0].base + arenas[0].seg_off[0];
    const uint64_t stride = arenas[0].block_stride, bpb = arenas[0].bytes_per_block;
    const uintptr_t hoff = arenas[0].host_offset;
    if (d2h) /* a loop per direction: nothing chosen per piece */
      for (size_t i = 0; i < n; i++)
        add_piece(&a, d, base + (uint64_t)ids[i] * stride, (uintptr_t)host_blocks[i] + hoff, bpb);
    else
      for (size_t i = 0; i < n; i++)
        add_piece(&a, d, (uintptr_t)host_blocks[i] + hoff, base + (uint64_t)ids[i] * stride, bpb);
  } else {
    for (size_t i = 0; i < n; i++) {
      const uintptr_t host = (uintptr_t)host_blocks[i];
      for (uint32_t r = 0; r < narenas; r++) {
        const oi_arena_rt *ar = &arenas[r];
        uintptr_t dev = ar->base + (uint64_t)ids[i] * ar->block_stride;
        uintptr_t hst = host + ar->host_offset;
        for (uint32_t s = 0; s < ar->segments; s++) {
          uintptr_t dv = dev + ar->seg_off[s], hs = hst + s * ar->bytes_per_block;
          add_piece(&a, d, d2h ? dv : hs, d2h ? hs : dv, ar->bytes_per_block);
        }
      }
    }
  }
  if (a.bytes) d[a.k++] = (oi_copy_desc){.src = a.src, .dst = a.dst, .bytes = a.bytes};
  return a.k;
}

size_t oi__plan_pieces(const oi_layout *l, size_t n) { return n * pieces_per_block(l); }

bool oi__plan_build_into(const oi_layout *l, const int64_t *ids, uint8_t *const *host_blocks,
                         size_t n, oi_copy_dir dir, oi_copy_desc *descs, size_t cap,
                         size_t *n_descs) {
  size_t ppb = pieces_per_block(l);
  if (ppb && n > cap / ppb) return false;
  *n_descs = plan(l, ids, host_blocks, n, dir, descs);
  return true;
}
