/* Layout validation: a bad layout would make a copy scribble over memory the
 * engine does not own, so every rule is checked before anything is kept. */
#include <stdlib.h>
#include <string.h>

#include "engine/layout.h"

/* One segment of one arena: a strided run of num_blocks slices. */
typedef struct strip {
  uint64_t start, end; /* [start, end): from the first slice's first byte to the last's end */
  uint64_t stride, bytes;
  uint32_t arena, seg;
} strip;

/* Do two strips share a byte? Exact for one block stride (interleaved
 * page-first layouts and the segments of one arena share address spans
 * without sharing bytes); conservative (span overlap) when strides differ.
 *
 * With one stride S, block i of X starts at x + i*S and block j of Y at
 * y + j*S; they share a byte iff [0, bx) and [d + m*S, d + m*S + by) do,
 * where d = y - x and m = j - i in [-(n-1), n-1]. Both slices are at most S
 * long, so only the m within one of -d/S can meet [0, bx). */
static bool strips_overlap(const strip *X, const strip *Y, uint64_t n) {
  if (X->start >= Y->end || Y->start >= X->end) return false;
  if (X->stride != Y->stride || X->stride == 0 || n == 0) return true;
  __int128 S = X->stride, d = (__int128)Y->start - (__int128)X->start;
  __int128 lim = (__int128)n - 1;
  __int128 m0 = -d / S; /* truncated toward zero: check around it */
  for (__int128 m = m0 - 2; m <= m0 + 2; m++) {
    if (m < -lim || m > lim) continue;
    __int128 y0 = d + m * S; /* Y's slice start relative to X's slice start */
    if (y0 < (__int128)X->bytes && y0 + (__int128)Y->bytes > 0) return true;
  }
  return false;
}

static int cmp_strip(const void *a, const void *b) {
  const strip *x = a, *y = b;
  return (x->start > y->start) - (x->start < y->start);
}

/* Sorted by start, a strip can only overlap the strips after it that start
 * before it ends. */
static oi_status check_overlaps(const oi_arena_rt *rt, uint32_t num, const char *what) {
  size_t ns = 0;
  for (uint32_t i = 0; i < num; i++)
    ns += rt[i].segments;
  strip *S = oi__malloc(ns * sizeof *S);
  if (!S) return oi__fail(OI_ERR_OUT_OF_MEMORY, "%s: out of memory", what);
  size_t k = 0;
  for (uint32_t i = 0; i < num; i++)
    for (uint32_t s = 0; s < rt[i].segments; s++) {
      uint64_t start = rt[i].base + rt[i].seg_off[s];
      S[k++] = (strip){.start = start,
                       .end = start + (rt[i].num_blocks - 1) * rt[i].block_stride +
                              rt[i].bytes_per_block,
                       .stride = rt[i].block_stride,
                       .bytes = rt[i].bytes_per_block,
                       .arena = i,
                       .seg = s};
    }
  qsort(S, ns, sizeof *S, cmp_strip);
  oi_status st = OI_OK;
  for (size_t i = 0; i < ns && st == OI_OK; i++)
    for (size_t j = i + 1; j < ns && S[j].start < S[i].end && st == OI_OK; j++) {
      if (!strips_overlap(&S[i], &S[j], rt[0].num_blocks)) continue;
      const strip *a = S[i].arena <= S[j].arena ? &S[i] : &S[j], *b = a == &S[i] ? &S[j] : &S[i];
      if (a->arena == b->arena)
        st = oi__fail(OI_ERR_INVALID_ARGUMENT, "%s: arena '%s' segments %u and %u overlap", what,
                      rt[a->arena].name, OI_MIN(a->seg, b->seg), OI_MAX(a->seg, b->seg));
      else
        st = oi__fail(OI_ERR_INVALID_ARGUMENT, "%s: arenas '%s' and '%s' overlap", what,
                      rt[a->arena].name, rt[b->arena].name);
    }
  oi__free(S);
  return st;
}

/* The checks of one arena that need no other arena. On success *span is the
 * bytes from the arena's base to the end of its farthest slice and seg_off
 * holds where each segment starts. `off` is the arena's segment offsets, or
 * NULL (segment_stride's rule). */
static oi_status check_arena(const oi_arena_desc *a, const uint64_t *off, const char *what,
                             uint64_t *seg_off, uint64_t *span) {
  const char *nm = a->name;
  if (a->bytes_per_block == 0)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "%s: arena '%s' has bytes_per_block 0", what, nm);
  if (a->segments == 0 || a->segments > OI_MAX_SEGMENTS)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "%s: arena '%s' has %u segments (1..%d)", what, nm,
                    a->segments, OI_MAX_SEGMENTS);
  if (!off) {
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
    for (uint32_t s = 0; s < a->segments; s++)
      seg_off[s] = (uint64_t)s * a->segment_stride;
    *span = (a->num_blocks - 1) * a->block_stride + footprint;
    return OI_OK;
  }
  /* Segments as separate regions: each is a run of num_blocks slices. */
  if (a->block_stride < a->bytes_per_block)
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "%s: arena '%s' block_stride %llu is smaller than bytes_per_block %llu", what,
                    nm, (unsigned long long)a->block_stride,
                    (unsigned long long)a->bytes_per_block);
  uint64_t run;
  if (__builtin_mul_overflow(a->num_blocks - 1, a->block_stride, &run) ||
      __builtin_add_overflow(run, a->bytes_per_block, &run))
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "%s: arena '%s' spans more than the address space",
                    what, nm);
  *span = 0;
  for (uint32_t s = 0; s < a->segments; s++) {
    uint64_t end;
    if (__builtin_add_overflow(off[s], run, &end))
      return oi__fail(OI_ERR_INVALID_ARGUMENT,
                      "%s: arena '%s' segment %u (offset %llu) spans more than the address space",
                      what, nm, s, (unsigned long long)off[s]);
    seg_off[s] = off[s];
    *span = OI_MAX(*span, end);
  }
  return OI_OK;
}

oi_status oi__layout_build(const oi_engine_options *o, const char *what, oi_layout *out) {
  memset(out, 0, sizeof *out);
  if (o->num_arenas == 0 || !o->arenas)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "%s: layout has no arenas", what);
  if (o->num_arenas > OI_MAX_ARENAS)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "%s: %u arenas (at most %d)", what, o->num_arenas,
                    OI_MAX_ARENAS);
  /* o is the library's copy (oi__struct_in_min): segment_offsets is set or
   * NULL. */
  const uint64_t *offs = o->segment_offsets;
  if (!offs && o->num_segment_offsets)
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "%s: num_segment_offsets is %u but segment_offsets is NULL", what,
                    o->num_segment_offsets);
  bool by_offset = o->arena_base != NULL;
  const oi_arena_desc *A = o->arenas;
  oi_arena_rt *rt = oi__calloc(o->num_arenas, sizeof *rt);
  if (!rt) return oi__fail(OI_ERR_OUT_OF_MEMORY, "%s: out of memory", what);
  oi_status st = OI_OK;
  uint64_t block_bytes = 0, noff = 0;
  uintptr_t root = (uintptr_t)o->arena_base;
  uint32_t i = 0;
  for (; i < o->num_arenas && st == OI_OK; i++) {
    const oi_arena_desc *a = &A[i];
    const char *nm = a->name ? a->name : "?";
    if (!a->name || !a->name[0]) {
      st = oi__fail(OI_ERR_INVALID_ARGUMENT, "%s: arena %u has no name", what, i);
      break;
    }
    if (a->num_blocks == 0) {
      st = oi__fail(OI_ERR_INVALID_ARGUMENT, "%s: arena '%s' has zero blocks", what, nm);
      break;
    }
    if (a->num_blocks != A[0].num_blocks) {
      st = oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "%s: arena '%s' has %llu blocks but arena '%s' has %llu (every arena is "
                    "indexed by the same block ids)",
                    what, nm, (unsigned long long)a->num_blocks, A[0].name,
                    (unsigned long long)A[0].num_blocks);
      break;
    }
    if (offs && a->segments >= 1 && a->segments <= OI_MAX_SEGMENTS &&
        noff + a->segments > o->num_segment_offsets) {
      st = oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "%s: arena '%s' needs segment offsets %llu..%llu but num_segment_offsets is %u",
                    what, nm, (unsigned long long)noff,
                    (unsigned long long)(noff + a->segments - 1), o->num_segment_offsets);
      break;
    }
    uint64_t span = 0;
    st = check_arena(a, offs ? offs + noff : NULL, what, rt[i].seg_off, &span);
    if (st != OI_OK) break;
    noff += a->segments;
    if (by_offset) {
      if (a->base) {
        st = oi__fail(OI_ERR_INVALID_ARGUMENT,
                      "%s: arena '%s' sets base although arena_base is set (use offset)", what, nm);
        break;
      }
      if (a->offset > o->arena_size || span > o->arena_size - a->offset) {
        st = oi__fail(OI_ERR_INVALID_ARGUMENT,
                      "%s: arena '%s' (offset %llu, %llu bytes) reaches past the arena's %llu "
                      "bytes",
                      what, nm, (unsigned long long)a->offset, (unsigned long long)span,
                      (unsigned long long)o->arena_size);
        break;
      }
    } else if (!a->base) {
      st = oi__fail(OI_ERR_INVALID_ARGUMENT, "%s: arena '%s' has no base address", what, nm);
      break;
    } else if ((uintptr_t)a->base > UINTPTR_MAX - span) {
      st = oi__fail(OI_ERR_INVALID_ARGUMENT, "%s: arena '%s' spans past the address space", what,
                    nm);
      break;
    }
    for (uint32_t j = 0; j < i; j++)
      if (!strcmp(A[j].name, a->name)) {
        st = oi__fail(OI_ERR_INVALID_ARGUMENT, "%s: two arenas are named '%s'", what, nm);
        break;
      }
    if (st != OI_OK) break;
    rt[i].base = by_offset ? root + a->offset : (uintptr_t)a->base;
    rt[i].num_blocks = a->num_blocks;
    rt[i].bytes_per_block = a->bytes_per_block;
    rt[i].block_stride = a->block_stride;
    rt[i].segment_stride = a->segment_stride;
    rt[i].segments = a->segments;
    rt[i].name = (char *)a->name; /* borrowed until the copies below */
    block_bytes += (uint64_t)a->segments * a->bytes_per_block;
  }
  if (st == OI_OK && offs && noff != o->num_segment_offsets)
    st = oi__fail(OI_ERR_INVALID_ARGUMENT,
                  "%s: num_segment_offsets is %u but the arenas have %llu segments", what,
                  o->num_segment_offsets, (unsigned long long)noff);
  if (st == OI_OK) st = check_overlaps(rt, o->num_arenas, what);
  if (st != OI_OK) {
    oi__free(rt);
    return st;
  }

  uint64_t host_off = 0, shape = 1469598103934665603ull;
  for (i = 0; i < o->num_arenas; i++) {
    const oi_arena_desc *a = &A[i];
    rt[i].name = oi__strdup(a->name);
    rt[i].host_offset = host_off;
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
