/* Layout validation (oi__layout_build, the checks of every register) with
 * fuzzed arena descriptors over a real buffer. Must never crash; on error
 * nothing is kept; an accepted layout must be sound: in offset mode every
 * (block, segment) slice of every arena lies inside [base, base+arena_size)
 * and no byte belongs to two slices (checked exhaustively with an owner map),
 * and a copy plan of the first and last block moves exactly the layout's bytes
 * to and from host blocks (ASan checks every access of the exact-size
 * buffers). In base mode (absolute addresses) only the overlap rule applies.
 * With mode bit 8 the arenas' segments are separate regions
 * (oi_engine_options.segment_offsets: one fuzzed offset per segment, the
 * count sometimes off by one), under the same owner-map check. */
#include "engine/layout.h"
#include "fuzz_util.h"

#define MAX_ARENA_SIZE (64u << 10)
#define MAX_ARENAS 6

static const char *const names[] = {"k", "v", "kv", "mla", "idx", "k"}; /* one duplicate */

static void check_slices(const oi_layout *l, uintptr_t lo, size_t span, uint8_t *owner) {
  memset(owner, 0, span);
  for (uint32_t a = 0; a < l->num_arenas; a++) {
    const oi_arena_rt *r = &l->arenas[a];
    for (uint64_t b = 0; b < r->num_blocks; b++)
      for (uint32_t s = 0; s < r->segments; s++) {
        uintptr_t start = r->base + b * r->block_stride + r->seg_off[s];
        FZ_ASSERT(start >= lo && start - lo <= span && r->bytes_per_block <= span - (start - lo),
                  "arena '%s' block %llu segment %u is outside the arena", r->name,
                  (unsigned long long)b, s);
        for (uint64_t i = 0; i < r->bytes_per_block; i++) {
          FZ_ASSERT(!owner[start - lo + i], "arena '%s' block %llu segment %u overlaps arena %u",
                    r->name, (unsigned long long)b, s, owner[start - lo + i] - 1u);
          owner[start - lo + i] = (uint8_t)(a + 1);
        }
      }
  }
}

/* The plan of n blocks in direction dir, into an array of exactly
 * oi__plan_pieces(l, n) descriptors (one fewer must be refused). */
static oi_copy_desc *plan_of(const oi_layout *l, const int64_t *ids, uint8_t *const *host, size_t n,
                             oi_copy_dir dir, size_t *nd) {
  size_t cap = oi__plan_pieces(l, n);
  oi_copy_desc *d = malloc((cap ? cap : 1) * sizeof *d);
  FZ_ASSERT(d, "out of memory");
  FZ_ASSERT(!cap || !oi__plan_build_into(l, ids, host, n, dir, d, cap - 1, nd),
            "a plan of %zu pieces fit in %zu", cap, cap - 1);
  FZ_ASSERT(oi__plan_build_into(l, ids, host, n, dir, d, cap, nd), "no plan in %zu pieces", cap);
  FZ_ASSERT(*nd <= cap, "%zu pieces planned into %zu", *nd, cap);
  return d;
}

/* Saves blocks 0 and last to host blocks and loads them back into each
 * other's place through copy plans, as the cpu stream would. */
static void check_plan(const oi_layout *l, uint8_t *buf, size_t size) {
  int64_t ids[2] = {0, (int64_t)l->num_blocks - 1};
  size_t n = l->num_blocks > 1 ? 2 : 1;
  uint8_t *host[2] = {malloc(l->block_bytes), malloc(l->block_bytes)};
  FZ_ASSERT(host[0] && host[1], "out of memory");
  for (size_t i = 0; i < size; i++)
    buf[i] = (uint8_t)(i * 131 + 7);
  size_t nd = 0;
  oi_copy_desc *d = plan_of(l, ids, host, n, OI_COPY_D2H, &nd);
  uint64_t moved = 0;
  for (size_t i = 0; i < nd; i++) {
    memcpy((void *)d[i].dst, (const void *)d[i].src, d[i].bytes);
    moved += d[i].bytes;
  }
  FZ_ASSERT(moved == n * l->block_bytes, "a save plan moves %llu bytes for %zu blocks of %llu",
            (unsigned long long)moved, n, (unsigned long long)l->block_bytes);
  free(d);
  /* Load them back swapped: block 0's bytes into the last block and back. */
  int64_t swapped[2] = {ids[n - 1], ids[0]};
  d = plan_of(l, swapped, host, n, OI_COPY_H2D, &nd);
  for (size_t i = 0; i < nd; i++)
    memcpy((void *)d[i].dst, (const void *)d[i].src, d[i].bytes);
  free(d);
  /* The host block is each arena's segments in order: check them in place. */
  for (uint32_t a = 0; a < l->num_arenas; a++) {
    const oi_arena_rt *r = &l->arenas[a];
    for (size_t k = 0; k < n; k++)
      for (uint32_t s = 0; s < r->segments; s++) {
        const uint8_t *dev =
            (const uint8_t *)(r->base + (uint64_t)swapped[k] * r->block_stride + r->seg_off[s]);
        const uint8_t *h = host[k] + r->host_offset + (uint64_t)s * r->bytes_per_block;
        FZ_ASSERT(!memcmp(dev, h, r->bytes_per_block), "arena '%s' segment %u differs after a load",
                  r->name, s);
      }
  }
  free(host[0]);
  free(host[1]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz f = {data, size, 0};
  uint8_t mode = fz_u8(&f);
  bool by_offset = !(mode & 1);
  size_t arena_size = 1 + fz_u16(&f) % MAX_ARENA_SIZE;
  uint32_t num = fz_u8(&f) % (MAX_ARENAS + 1); /* 0 included */
  oi_arena_desc A[MAX_ARENAS];
  memset(A, 0, sizeof A);
  uint8_t *buf = malloc(arena_size);
  if (!buf) return 0;
  bool with_offs = mode & 8;
  uint64_t offs[MAX_ARENAS * 9];
  uint32_t noffs = 0;
  for (uint32_t i = 0; i < num; i++) {
    A[i].name = (mode & 2) ? names[i] : names[fz_u8(&f) % 6];
    if (fz_u8(&f) == 0xff) A[i].name = (fz_u8(&f) & 1) ? "" : NULL;
    A[i].offset = fz_size(&f, arena_size);
    A[i].num_blocks = fz_size(&f, 16);
    A[i].bytes_per_block = fz_size(&f, 256);
    A[i].block_stride = fz_size(&f, 1024);
    A[i].segments = (uint32_t)fz_size(&f, 9);
    A[i].segment_stride = fz_size(&f, 512);
    /* Separate regions: each segment anywhere in the arena (up to 9 entries:
     * a tenth segment count is refused before its offsets matter). */
    for (uint32_t s = 0; with_offs && s < A[i].segments && s < 9; s++)
      offs[noffs++] = fz_size(&f, arena_size);
    if (!by_offset) {
      /* Absolute addresses inside (or just past) the buffer; a stray base
       * sometimes rides along with arena_base set. */
      A[i].base = buf + A[i].offset % arena_size;
      A[i].offset = 0;
    } else if ((mode & 4) && fz_u8(&f) == 0x7f) {
      A[i].base = buf;
    }
  }
  oi_engine_options o;
  oi_engine_options_init(&o);
  o.namespace_id = "fuzz";
  o.num_arenas = num;
  o.arenas = num || !(mode & 16) ? A : NULL;
  o.arena_base = by_offset ? buf : NULL;
  o.arena_size = by_offset ? arena_size : 0;
  if (with_offs) {
    o.segment_offsets = offs;
    o.num_segment_offsets = noffs;
    uint8_t skew = fz_u8(&f);
    if (skew == 0xfe && noffs > 0) o.num_segment_offsets--; /* one short */
    if (skew == 0xfd) o.num_segment_offsets++;  /* one too many (reads stay inside offs) */
    if (skew == 0xfc) o.segment_offsets = NULL; /* a count without an array */
  }
  oi_layout l;
  oi_status st = oi__layout_build(&o, "fuzz", &l);
  if (st != OI_OK) {
    FZ_ASSERT(st == OI_ERR_INVALID_ARGUMENT || st == OI_ERR_OUT_OF_MEMORY, "status %s",
              oi_status_str(st));
    FZ_ASSERT(oi_last_error()[0], "an error without a message");
    FZ_ASSERT(l.arenas == NULL && l.num_arenas == 0, "a refused layout kept something");
  } else {
    if (getenv("OI_FUZZ_VERBOSE"))
      for (uint32_t i = 0; i < num; i++)
        fprintf(stderr,
                "arena %u '%s': offset %llu base %p num_blocks %llu bytes_per_block %llu "
                "block_stride %llu segments %u segment_stride %llu (arena_size %zu, buf %p)\n",
                i, A[i].name, (unsigned long long)A[i].offset, A[i].base,
                (unsigned long long)A[i].num_blocks, (unsigned long long)A[i].bytes_per_block,
                (unsigned long long)A[i].block_stride, A[i].segments,
                (unsigned long long)A[i].segment_stride, arena_size, (void *)buf);
    FZ_ASSERT(num > 0 && l.num_arenas == num && l.num_blocks == A[0].num_blocks, "shape");
    uint64_t bb = 0;
    for (uint32_t i = 0; i < num; i++)
      bb += (uint64_t)A[i].segments * A[i].bytes_per_block;
    FZ_ASSERT(l.block_bytes == bb, "block_bytes %llu, expected %llu",
              (unsigned long long)l.block_bytes, (unsigned long long)bb);
    if (by_offset) {
      uint8_t *owner = malloc(arena_size);
      FZ_ASSERT(owner, "out of memory");
      check_slices(&l, (uintptr_t)buf, arena_size, owner);
      free(owner);
      check_plan(&l, buf, arena_size);
    } else {
      /* The slices lie within [lo, lo + span): non-overlap over that window. */
      uintptr_t lo = UINTPTR_MAX, hi = 0;
      for (uint32_t i = 0; i < l.num_arenas; i++) {
        const oi_arena_rt *r = &l.arenas[i];
        uintptr_t end = r->base + (r->num_blocks - 1) * r->block_stride + r->bytes_per_block;
        uint64_t far = 0;
        for (uint32_t s = 0; s < r->segments; s++)
          far = OI_MAX(far, r->seg_off[s]);
        end += far;
        lo = OI_MIN(lo, r->base);
        hi = OI_MAX(hi, end);
      }
      if (hi - lo <= (4u << 20)) {
        uint8_t *owner = malloc(hi - lo);
        FZ_ASSERT(owner, "out of memory");
        check_slices(&l, lo, hi - lo, owner);
        free(owner);
      }
    }
    oi__layout_free(&l);
  }
  free(buf);
  oi_clear_error();
  return 0;
}
