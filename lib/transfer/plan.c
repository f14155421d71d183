#include "plan.h"

static size_t pieces_per_block(const oi_layout *l) {
  size_t p = 0;
  for (uint32_t a = 0; a < l->num_arenas; a++)
    p += l->arenas[a].segments;
  return p;
}

static size_t plan(const oi_layout *l, const int64_t *ids, uint8_t *const *host_blocks, size_t n,
                   oi_copy_dir dir, oi_copy_desc *d) {
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    const uint8_t *host = host_blocks[i];
    for (uint32_t a = 0; a < l->num_arenas; a++) {
      const oi_arena_rt *ar = &l->arenas[a];
      uintptr_t dev = ar->base + (uint64_t)ids[i] * ar->block_stride;
      uintptr_t hst = (uintptr_t)host + ar->host_offset;
      for (uint32_t s = 0; s < ar->segments; s++) {
        uintptr_t dv = dev + ar->seg_off[s], hs = hst + s * ar->bytes_per_block;
        uintptr_t src = dir == OI_COPY_D2H ? dv : hs, dst = dir == OI_COPY_D2H ? hs : dv;
        if (k > 0 && d[k - 1].src + d[k - 1].bytes == src && d[k - 1].dst + d[k - 1].bytes == dst) {
          d[k - 1].bytes += ar->bytes_per_block; /* contiguous on both sides: one piece */
        } else {
          d[k++] = (oi_copy_desc){.src = src, .dst = dst, .bytes = ar->bytes_per_block};
        }
      }
    }
  }
  return k;
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

oi_status oi__plan_build(const oi_layout *l, const int64_t *ids, uint8_t *const *host_blocks,
                         size_t n, oi_copy_dir dir, oi_copy_desc **descs, size_t *n_descs) {
  size_t ppb = pieces_per_block(l);
  oi_copy_desc *d = oi__malloc(n * ppb * sizeof *d + 1);
  if (!d) return oi__fail(OI_ERR_OUT_OF_MEMORY, "copy plan: out of memory for %zu pieces", n * ppb);
  *n_descs = plan(l, ids, host_blocks, n, dir, d);
  *descs = d;
  return OI_OK;
}
