/* Layout validation: a bad layout would make a copy scribble over memory the
 * engine does not own, so every rule is checked before anything is kept. */
#include <stdlib.h>
#include <string.h>

#include "engine/layout.h"

/* Bytes from an arena's base to the end of its last slice. */
static uint64_t arena_span(const oi_arena_desc *a) {
  return (a->num_blocks - 1) * a->block_stride + (uint64_t)(a->segments - 1) * a->segment_stride +
         a->bytes_per_block;
}

static bool ranges_overlap(uint64_t a0, uint64_t alen, uint64_t b0, uint64_t blen) {
  return a0 < b0 + blen && b0 < a0 + alen;
}

/* Do block ia of arena A and block ib of arena B share a byte? */
static bool blocks_overlap(uint64_t abase, const oi_arena_desc *A, uint64_t ia, uint64_t bbase,
                           const oi_arena_desc *B, uint64_t ib) {
  for (uint32_t s = 0; s < A->segments; s++)
    for (uint32_t t = 0; t < B->segments; t++)
      if (ranges_overlap(abase + ia * A->block_stride + s * A->segment_stride, A->bytes_per_block,
                         bbase + ib * B->block_stride + t * B->segment_stride, B->bytes_per_block))
        return true;
  return false;
}

/* Exact for arenas with one block stride (interleaved page-first layouts
 * share address spans without sharing bytes); conservative (span overlap)
 * when strides differ. */
static bool arenas_overlap(uint64_t abase, const oi_arena_desc *A, uint64_t bbase,
                           const oi_arena_desc *B) {
  if (!ranges_overlap(abase, arena_span(A), bbase, arena_span(B))) return false;
  if (A->block_stride != B->block_stride || A->block_stride == 0) return true;
  uint64_t S = A->block_stride, n = A->num_blocks;
  /* Block 0 of A against the few blocks of B that can reach it, and block 0
   * of B against those of A: by translation this covers every pair. */
  for (int side = 0; side < 2; side++) {
    uint64_t x = side ? bbase : abase, y = side ? abase : bbase;
    const oi_arena_desc *X = side ? B : A, *Y = side ? A : B;
    if (y > x + S) continue; /* Y's block k starts after X's block 0 ends for k >= 0 */
    uint64_t first = y >= x ? 0 : (x - y) / S;
    for (uint64_t k = first > 0 ? first - 1 : 0; k <= first + 1 && k < n; k++)
      if (blocks_overlap(x, X, 0, y, Y, k)) return true;
  }
  return false;
}

oi_status oi__layout_build(const oi_engine_options *o, const char *what, oi_layout *out) {
  memset(out, 0, sizeof *out);
  if (o->num_arenas == 0 || !o->arenas)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "%s: layout has no arenas", what);
  if (o->num_arenas > OI_MAX_ARENAS)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "%s: %u arenas (at most %d)", what, o->num_arenas,
                    OI_MAX_ARENAS);
  bool by_offset = o->arena_base != NULL;
  const oi_arena_desc *A = o->arenas;
  uint64_t block_bytes = 0;
  for (uint32_t i = 0; i < o->num_arenas; i++) {
    const oi_arena_desc *a = &A[i];
    const char *nm = a->name ? a->name : "?";
    if (!a->name || !a->name[0])
      return oi__fail(OI_ERR_INVALID_ARGUMENT, "%s: arena %u has no name", what, i);
    if (a->num_blocks == 0)
      return oi__fail(OI_ERR_INVALID_ARGUMENT, "%s: arena '%s' has zero blocks", what, nm);
    if (a->num_blocks != A[0].num_blocks)
      return oi__fail(OI_ERR_INVALID_ARGUMENT,
                      "%s: arena '%s' has %llu blocks but arena '%s' has %llu (every arena is "
                      "indexed by the same block ids)",
                      what, nm, (unsigned long long)a->num_blocks, A[0].name,
                      (unsigned long long)A[0].num_blocks);
    if (a->bytes_per_block == 0)
      return oi__fail(OI_ERR_INVALID_ARGUMENT, "%s: arena '%s' has bytes_per_block 0", what, nm);
    if (a->segments == 0 || a->segments > OI_MAX_SEGMENTS)
      return oi__fail(OI_ERR_INVALID_ARGUMENT, "%s: arena '%s' has %u segments (1..%d)", what, nm,
                      a->segments, OI_MAX_SEGMENTS);
    if (a->segments > 1 && a->segment_stride < a->bytes_per_block)
      return oi__fail(OI_ERR_INVALID_ARGUMENT,
                      "%s: arena '%s' segment_stride %llu is smaller than bytes_per_block %llu",
                      what, nm, (unsigned long long)a->segment_stride,
                      (unsigned long long)a->bytes_per_block);
    /* (found by fuzz_layout: a huge segment_stride overflowed the footprint) */
    if (a->segments > 1 &&
        a->segment_stride > (UINT64_MAX - a->bytes_per_block) / (a->segments - 1))
      return oi__fail(OI_ERR_INVALID_ARGUMENT,
                      "%s: arena '%s' segments span more than the address space", what, nm);
    uint64_t footprint = (uint64_t)(a->segments - 1) * a->segment_stride + a->bytes_per_block;
    if (a->block_stride < footprint)
      return oi__fail(OI_ERR_INVALID_ARGUMENT,
                      "%s: arena '%s' block_stride %llu is smaller than one block's %llu bytes",
                      what, nm, (unsigned long long)a->block_stride, (unsigned long long)footprint);
    if (a->num_blocks > (UINT64_MAX - footprint) / a->block_stride)
      return oi__fail(OI_ERR_INVALID_ARGUMENT, "%s: arena '%s' spans more than the address space",
                      what, nm);
    if (by_offset) {
      if (a->base)
        return oi__fail(OI_ERR_INVALID_ARGUMENT,
                        "%s: arena '%s' sets base although arena_base is set (use offset)", what,
                        nm);
      if (a->offset > o->arena_size || arena_span(a) > o->arena_size - a->offset)
        return oi__fail(OI_ERR_INVALID_ARGUMENT,
                        "%s: arena '%s' (offset %llu, %llu bytes) reaches past the arena's %llu "
                        "bytes",
                        what, nm, (unsigned long long)a->offset, (unsigned long long)arena_span(a),
                        (unsigned long long)o->arena_size);
    } else if (!a->base) {
      return oi__fail(OI_ERR_INVALID_ARGUMENT, "%s: arena '%s' has no base address", what, nm);
    }
    for (uint32_t j = 0; j < i; j++)
      if (!strcmp(A[j].name, a->name))
        return oi__fail(OI_ERR_INVALID_ARGUMENT, "%s: two arenas are named '%s'", what, nm);
    block_bytes += (uint64_t)a->segments * a->bytes_per_block;
  }
  uintptr_t root = (uintptr_t)o->arena_base;
  for (uint32_t i = 0; i < o->num_arenas; i++)
    for (uint32_t j = 0; j < i; j++) {
      uint64_t bi = by_offset ? root + A[i].offset : (uintptr_t)A[i].base;
      uint64_t bj = by_offset ? root + A[j].offset : (uintptr_t)A[j].base;
      if (arenas_overlap(bj, &A[j], bi, &A[i]))
        return oi__fail(OI_ERR_INVALID_ARGUMENT, "%s: arenas '%s' and '%s' overlap", what,
                        A[j].name, A[i].name);
    }

  oi_arena_rt *rt = oi__calloc(o->num_arenas, sizeof *rt);
  if (!rt) return oi__fail(OI_ERR_OUT_OF_MEMORY, "%s: out of memory", what);
  uint64_t host_off = 0, shape = 1469598103934665603ull;
  for (uint32_t i = 0; i < o->num_arenas; i++) {
    const oi_arena_desc *a = &A[i];
    rt[i] = (oi_arena_rt){.name = oi__strdup(a->name),
                          .base = by_offset ? root + a->offset : (uintptr_t)a->base,
                          .num_blocks = a->num_blocks,
                          .bytes_per_block = a->bytes_per_block,
                          .block_stride = a->block_stride,
                          .segment_stride = a->segment_stride,
                          .segments = a->segments,
                          .host_offset = host_off};
    host_off += (uint64_t)a->segments * a->bytes_per_block;
    shape = (shape ^ a->segments) * 1099511628211ull;
    shape = (shape ^ a->bytes_per_block) * 1099511628211ull;
    if (!rt[i].name) {
      out->arenas = rt;
      out->num_arenas = i;
      oi__layout_free(out);
      return oi__fail(OI_ERR_OUT_OF_MEMORY, "%s: out of memory", what);
    }
  }
  out->num_arenas = o->num_arenas;
  out->arenas = rt;
  out->num_blocks = A[0].num_blocks;
  out->block_bytes = block_bytes;
  out->shape_hash = shape;
  return OI_OK;
}

void oi__layout_free(oi_layout *l) {
  if (!l || !l->arenas) return;
  for (uint32_t i = 0; i < l->num_arenas; i++)
    oi__free(l->arenas[i].name);
  oi__free(l->arenas);
  memset(l, 0, sizeof *l);
}
