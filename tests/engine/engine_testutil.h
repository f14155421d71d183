/* Helpers shared by the host-tier / embedded-engine conformance tests
 * (tests/engine/): KV layouts over memory the test allocates itself, byte
 * patterns that depend on (content key, arena, segment, offset), hashes, and
 * thin wrappers that wait for tickets.
 *
 * A "content key" names what a block holds: the logical block number in the
 * round-trip tests, a function of the block hash in the random and stress
 * tests (so any rank's save of hash H carries the same bytes). */
#ifndef OI_ENGINE_TESTUTIL_H
#define OI_ENGINE_TESTUTIL_H

#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "openinfer/openinfer.h"
#include "rig.h"
#include "testutil.h"

#define ETU_MAX_ARENAS 128
#define ETU_UNUSED __attribute__((unused))

/* ---- patterns ------------------------------------------------------------ */

static inline uint64_t etu_mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/* Seed of one (key, arena, segment) slice: every slice of every block differs. */
static inline uint64_t etu_slice_seed(uint64_t seed, uint64_t key, uint32_t arena, uint32_t seg) {
  return etu_mix(etu_mix(etu_mix(seed ^ 0x5EEDull) ^ key) ^ ((uint64_t)arena << 8 | seg));
}

/* Word i of a slice is mix(s + i): a slice shifted by any number of bytes, or
 * another slice, does not match. */
static inline void etu_fill_slice(uint8_t *p, uint64_t n, uint64_t s) {
  uint64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t v = etu_mix(s + i);
    memcpy(p + i, &v, 8);
  }
  if (i < n) {
    uint64_t v = etu_mix(s + i);
    memcpy(p + i, &v, (size_t)(n - i));
  }
}

/* @return the first mismatching offset, or -1. */
static inline int64_t etu_slice_mismatch(const uint8_t *p, uint64_t n, uint64_t s) {
  uint64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t v = etu_mix(s + i);
    if (memcmp(p + i, &v, 8) != 0) {
      for (uint64_t k = 0; k < 8; k++)
        if (p[i + k] != ((const uint8_t *)&v)[k]) return (int64_t)(i + k);
    }
  }
  if (i < n) {
    uint64_t v = etu_mix(s + i);
    for (uint64_t k = 0; i + k < n; k++)
      if (p[i + k] != ((const uint8_t *)&v)[k]) return (int64_t)(i + k);
  }
  return -1;
}

/* ---- layouts --------------------------------------------------------------- */

/* A layout plus the memory its arenas live in: one region; arena a starts at
 * region + offsets[a]. */
typedef struct etu_layout {
  uint32_t num_arenas;
  uint64_t num_blocks;
  oi_arena_desc arenas[ETU_MAX_ARENAS]; /* base = region + offset (absolute mode) */
  uint64_t offsets[ETU_MAX_ARENAS];
  char names[ETU_MAX_ARENAS][24];
  uint8_t *region;
  uint64_t region_bytes;
  uint64_t block_bytes; /* host block: sum of segments * bytes_per_block */
  /* Segments as separate regions (oi_engine_options.segment_offsets): segment
   * s of arena a starts at offsets[a] + seg_off[a][s]. */
  bool separate;
  uint64_t seg_off[ETU_MAX_ARENAS][8];
} etu_layout;

/* Starts a layout: the caller sets arenas[a].bytes_per_block, block_stride,
 * segments, segment_stride and offsets[a], then calls etu_layout_alloc. */
static ETU_UNUSED void etu_layout_begin(etu_layout *L, uint32_t num_arenas, uint64_t num_blocks) {
  REQUIRE(num_arenas <= ETU_MAX_ARENAS);
  memset(L, 0, sizeof *L);
  L->num_arenas = num_arenas;
  L->num_blocks = num_blocks;
  for (uint32_t a = 0; a < num_arenas; a++) {
    snprintf(L->names[a], sizeof L->names[a], "arena%u", a);
    L->arenas[a].name = L->names[a];
    L->arenas[a].num_blocks = num_blocks;
    L->arenas[a].segments = 1;
  }
}

static inline uint64_t etu_arena_extent(const oi_arena_desc *d) {
  uint32_t segs = d->segments ? d->segments : 1;
  return (d->num_blocks - 1) * d->block_stride + (uint64_t)(segs - 1) * d->segment_stride +
         d->bytes_per_block;
}

static inline uint64_t etu_arena_extent_in(const etu_layout *L, uint32_t a) {
  const oi_arena_desc *d = &L->arenas[a];
  if (!L->separate) return etu_arena_extent(d);
  uint64_t far = 0;
  for (uint32_t s = 0; s < d->segments; s++)
    far = L->seg_off[a][s] > far ? L->seg_off[a][s] : far;
  return far + (d->num_blocks - 1) * d->block_stride + d->bytes_per_block;
}

/* Allocates the (zeroed) region and points every arena's base into it. */
static ETU_UNUSED void etu_layout_alloc(etu_layout *L) {
  uint64_t end = 0, bb = 0;
  for (uint32_t a = 0; a < L->num_arenas; a++) {
    oi_arena_desc *d = &L->arenas[a];
    if (d->segments == 0) d->segments = 1;
    uint64_t e = L->offsets[a] + etu_arena_extent_in(L, a);
    if (e > end) end = e;
    bb += (uint64_t)d->segments * d->bytes_per_block;
  }
  L->region_bytes = end;
  L->block_bytes = bb;
  L->region = calloc(1, (size_t)end + 64);
  REQUIRE(L->region);
  for (uint32_t a = 0; a < L->num_arenas; a++)
    L->arenas[a].base = L->region + L->offsets[a];
}

static ETU_UNUSED void etu_layout_free(etu_layout *L) {
  free(L->region);
  L->region = NULL;
}

/* Arenas one after another, each dense (block_stride = bytes_per_block),
 * offsets rounded up to `align` (1: unaligned). */
static ETU_UNUSED void etu_layout_packed(etu_layout *L, uint32_t num_arenas, uint64_t num_blocks,
                                         const uint64_t *bytes_per_block, uint64_t align) {
  etu_layout_begin(L, num_arenas, num_blocks);
  uint64_t off = 0;
  for (uint32_t a = 0; a < num_arenas; a++) {
    off = (off + align - 1) / align * align;
    L->offsets[a] = off;
    L->arenas[a].bytes_per_block = bytes_per_block[a];
    L->arenas[a].block_stride = bytes_per_block[a];
    off += num_blocks * bytes_per_block[a];
  }
  etu_layout_alloc(L);
}

/* num_arenas arenas of the same size, each dense, 64-byte aligned. */
static ETU_UNUSED void etu_layout_simple(etu_layout *L, uint32_t num_arenas, uint64_t num_blocks,
                                         uint64_t bytes_per_block) {
  uint64_t bpb[ETU_MAX_ARENAS];
  for (uint32_t a = 0; a < num_arenas; a++)
    bpb[a] = bytes_per_block;
  etu_layout_packed(L, num_arenas, num_blocks, bpb, 64);
}

/* Page-first: block b of every arena lies together; arena a's slice of block b
 * is at a * bytes_per_block + b * (num_arenas * bytes_per_block). */
static ETU_UNUSED void etu_layout_page_first(etu_layout *L, uint32_t num_arenas,
                                             uint64_t num_blocks, uint64_t bytes_per_block) {
  etu_layout_begin(L, num_arenas, num_blocks);
  for (uint32_t a = 0; a < num_arenas; a++) {
    L->offsets[a] = a * bytes_per_block;
    L->arenas[a].bytes_per_block = bytes_per_block;
    L->arenas[a].block_stride = num_arenas * bytes_per_block;
  }
  etu_layout_alloc(L);
}

/* A second allocation of the same layout shape (another rank's KV memory). */
static ETU_UNUSED void etu_layout_clone_shape(etu_layout *dst, const etu_layout *src) {
  *dst = *src;
  for (uint32_t a = 0; a < dst->num_arenas; a++)
    dst->arenas[a].name = dst->names[a];
  etu_layout_alloc(dst);
}

static inline uint8_t *etu_slice_ptr(const etu_layout *L, uint32_t a, int64_t block, uint32_t s) {
  const oi_arena_desc *d = &L->arenas[a];
  return L->region + L->offsets[a] + (uint64_t)block * d->block_stride +
         (L->separate ? L->seg_off[a][s] : (uint64_t)s * d->segment_stride);
}

/* vLLM's layer tensor [2, num_blocks, block_size, heads, dim]: one arena per
 * layer whose K half (num_blocks dense blocks) and V half are two separate
 * regions, 64 bytes of gap after each half (so a stray write shows);
 * v_first puts the V half first in memory (segment 1 below segment 0). */
static ETU_UNUSED void etu_layout_kv_halves(etu_layout *L, uint32_t layers, uint64_t num_blocks,
                                            uint64_t bytes_per_block, bool v_first) {
  etu_layout_begin(L, layers, num_blocks);
  L->separate = true;
  uint64_t half = num_blocks * bytes_per_block + 64;
  for (uint32_t a = 0; a < layers; a++) {
    L->offsets[a] = (uint64_t)a * 2 * half;
    L->arenas[a].bytes_per_block = bytes_per_block;
    L->arenas[a].block_stride = bytes_per_block;
    L->arenas[a].segments = 2;
    L->seg_off[a][0] = v_first ? half : 0;
    L->seg_off[a][1] = v_first ? 0 : half;
  }
  etu_layout_alloc(L);
}

/* Writes content `key` into device block `block` (every arena, every segment). */
static ETU_UNUSED void etu_fill_block(const etu_layout *L, int64_t block, uint64_t key,
                                      uint64_t seed) {
  for (uint32_t a = 0; a < L->num_arenas; a++)
    for (uint32_t s = 0; s < L->arenas[a].segments; s++)
      etu_fill_slice(etu_slice_ptr(L, a, block, s), L->arenas[a].bytes_per_block,
                     etu_slice_seed(seed, key, a, s));
}

/* @return true when device block `block` holds content `key`; otherwise
 * prints where it first differs (label names the check). */
static ETU_UNUSED bool etu_block_matches(const etu_layout *L, int64_t block, uint64_t key,
                                         uint64_t seed, const char *label) {
  for (uint32_t a = 0; a < L->num_arenas; a++)
    for (uint32_t s = 0; s < L->arenas[a].segments; s++) {
      int64_t at = etu_slice_mismatch(etu_slice_ptr(L, a, block, s), L->arenas[a].bytes_per_block,
                                      etu_slice_seed(seed, key, a, s));
      if (at >= 0) {
        fprintf(stderr,
                "  [%s] block %" PRId64 " (content %" PRIu64 "): arena %u segment %u differs at "
                "byte %" PRId64 " of %" PRIu64 "\n",
                label ? label : "", block, key, a, s, at, L->arenas[a].bytes_per_block);
        return false;
      }
    }
  return true;
}

static ETU_UNUSED bool etu_block_is_zero(const etu_layout *L, int64_t block) {
  for (uint32_t a = 0; a < L->num_arenas; a++)
    for (uint32_t s = 0; s < L->arenas[a].segments; s++) {
      const uint8_t *p = etu_slice_ptr(L, a, block, s);
      for (uint64_t i = 0; i < L->arenas[a].bytes_per_block; i++)
        if (p[i]) {
          fprintf(stderr, "  block %" PRId64 " arena %u segment %u byte %" PRIu64 " is not zero\n",
                  block, a, s, i);
          return false;
        }
    }
  return true;
}

static ETU_UNUSED void etu_zero_block(const etu_layout *L, int64_t block) {
  for (uint32_t a = 0; a < L->num_arenas; a++)
    for (uint32_t s = 0; s < L->arenas[a].segments; s++)
      memset(etu_slice_ptr(L, a, block, s), 0, (size_t)L->arenas[a].bytes_per_block);
}

/* @return true when every byte of the region (slices, gaps and padding) is zero. */
static ETU_UNUSED bool etu_region_is_zero(const etu_layout *L) {
  for (uint64_t i = 0; i < L->region_bytes + 64; i++)
    if (L->region[i]) {
      fprintf(stderr, "  region byte %" PRIu64 " of %" PRIu64 " is not zero\n", i, L->region_bytes);
      return false;
    }
  return true;
}

/* ---- hashes -------------------------------------------------------------- */

/* Hash number i of hash space `space` (distinct spaces never collide). */
static ETU_UNUSED oi_block_hash etu_hash(uint64_t space, uint64_t i) {
  oi_block_hash h;
  uint64_t a = etu_mix(space * 0x100000001B3ull + 0xABCDEFull), b = etu_mix(a ^ (i + 1));
  memcpy(h.bytes, &b, 8);
  memcpy(h.bytes + 8, &i, 8);
  h.bytes[15] ^= (uint8_t)space;
  return h;
}

/* A content key derived from the hash only. */
static ETU_UNUSED uint64_t etu_hash_key(const oi_block_hash *h) {
  uint64_t a, b;
  memcpy(&a, h->bytes, 8);
  memcpy(&b, h->bytes + 8, 8);
  return etu_mix(a ^ etu_mix(b));
}

static inline bool etu_lease_is_zero(oi_lease l) {
  for (int i = 0; i < 16; i++)
    if (l.bytes[i]) return false;
  return true;
}

/* ---- objects --------------------------------------------------------------- */

/* high_watermark 0: the default (background eviction above 95%); 1.0 turns
 * background eviction off, so only saves that need room evict. */
static ETU_UNUSED oi_host *etu_host_create_wm(uint64_t pool_bytes, uint64_t chunk_bytes,
                                              uint32_t lease_ttl_ms, float high_watermark,
                                              float low_watermark) {
  oi_host_options o = tr_host_options(pool_bytes);
  o.device = OI_DEVICE_CPU;
  o.chunk_bytes = chunk_bytes;
  if (lease_ttl_ms) o.lease_ttl_ms = lease_ttl_ms;
  if (high_watermark > 0) {
    o.high_watermark = high_watermark;
    o.low_watermark = low_watermark;
  }
  return tr_host_new(&o);
}

static ETU_UNUSED oi_host *etu_host_create_opts(uint64_t pool_bytes, uint64_t chunk_bytes,
                                                uint32_t lease_ttl_ms) {
  return etu_host_create_wm(pool_bytes, chunk_bytes, lease_ttl_ms, 0, 0);
}

static ETU_UNUSED oi_host *etu_host_create(uint64_t pool_bytes) {
  return etu_host_create_opts(pool_bytes, 0, 0);
}

/* Engine options describing L. use_offsets: arenas by offset from arena_base
 * (base NULL) instead of absolute base pointers. The arena array is copied
 * into `arenas_out` (ETU_MAX_ARENAS entries) so callers may edit it. */
static ETU_UNUSED void etu_engine_opts(const etu_layout *L, const char *ns, uint32_t world_size,
                                       bool use_offsets, oi_engine_options *o,
                                       oi_arena_desc *arenas_out) {
  REQUIRE(oi_engine_options_init(o) == OI_OK);
  memcpy(arenas_out, L->arenas, sizeof(oi_arena_desc) * L->num_arenas);
  if (use_offsets) {
    for (uint32_t a = 0; a < L->num_arenas; a++) {
      arenas_out[a].base = NULL;
      arenas_out[a].offset = L->offsets[a];
    }
    o->arena_base = L->region;
    o->arena_size = L->region_bytes;
  }
  o->device = OI_DEVICE_CPU;
  o->namespace_id = ns;
  o->world_size = world_size;
  o->num_arenas = L->num_arenas;
  o->arenas = arenas_out;
  if (L->separate) {
    static __thread uint64_t flat[ETU_MAX_ARENAS * 8];
    uint32_t k = 0;
    for (uint32_t a = 0; a < L->num_arenas; a++)
      for (uint32_t s = 0; s < L->arenas[a].segments; s++)
        flat[k++] = L->seg_off[a][s];
    o->segment_offsets = flat;
    o->num_segment_offsets = k;
  }
}

static ETU_UNUSED oi_engine *etu_engine_create_mode(oi_host *h, const etu_layout *L, const char *ns,
                                                    uint32_t world_size, bool use_offsets) {
  static __thread oi_arena_desc arenas[ETU_MAX_ARENAS];
  oi_engine_options o;
  etu_engine_opts(L, ns, world_size, use_offsets, &o, arenas);
  return tr_engine_new(h, &o);
}

static ETU_UNUSED oi_engine *etu_engine_create(oi_host *h, const etu_layout *L, const char *ns,
                                               uint32_t world_size) {
  return etu_engine_create_mode(h, L, ns, world_size, false);
}

#define etu_host_stats tr_host_stats
#define etu_engine_stats tr_engine_stats

/* @return true when used + free == capacity (printing the numbers otherwise). */
static ETU_UNUSED bool etu_accounting_ok(const oi_host_stats *s) {
  if (s->used_bytes + s->free_bytes == s->capacity_bytes) return true;
  fprintf(stderr, "  accounting: used %" PRIu64 " + free %" PRIu64 " != capacity %" PRIu64 "\n",
          s->used_bytes, s->free_bytes, s->capacity_bytes);
  return false;
}

/* Waits for a ticket (forever), releases it, returns its final status. */
static ETU_UNUSED oi_status etu_ticket_finish(oi_ticket *t) {
  if (!t) return OI_ERR_INTERNAL;
  return tr_wait(t, UINT32_MAX);
}

/* save + wait. @return the save call's error, or else the ticket's status. */
static ETU_UNUSED oi_status etu_save_wait(oi_engine *e, const int64_t *ids,
                                          const oi_block_hash *hashes, size_t n) {
  return tr_save(e, ids, hashes, n, UINT32_MAX);
}

/* load + wait. */
static ETU_UNUSED oi_status etu_load_wait(oi_engine *e, oi_lease lease, const int64_t *dst,
                                          size_t n) {
  return tr_load(e, lease, dst, n, UINT32_MAX);
}

/* A prefix query with a fresh result struct. */
static ETU_UNUSED oi_status etu_query(oi_engine *e, const char *req_id, const oi_block_hash *hashes,
                                      size_t n, oi_query_result *out) {
  return tr_query(e, req_id, hashes, n, 0, NULL, out);
}

/* Membership query: present[i] = 0/1. @return the number present, or -1 on error. */
static ETU_UNUSED int64_t etu_membership(oi_engine *e, const oi_block_hash *hashes, size_t n,
                                         uint8_t *present) {
  oi_query_result r;
  oi_status st = tr_query(e, NULL, hashes, n, OI_QUERY_MEMBERSHIP, present, &r);
  if (st != OI_OK) {
    fprintf(stderr, "membership query: %s: %s\n", oi_status_str(st), oi_last_error());
    return -1;
  }
  if (!etu_lease_is_zero(r.lease)) {
    fprintf(stderr, "membership query returned a lease\n");
    return -1;
  }
  return (int64_t)r.hit_blocks;
}

static ETU_UNUSED void etu_sleep_ms(unsigned ms) {
  struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static ETU_UNUSED double etu_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Calls `expr` (a status expression) after clearing the last error and checks
 * it returns `expected` with a non-empty message. */
#define CHECK_FAILS(expr, expected)                                                                \
  do {                                                                                             \
    oi_clear_error();                                                                              \
    CHECK_ST(expr, expected);                                                                      \
    if (strlen(oi_last_error()) == 0) {                                                            \
      fprintf(stderr, "%s:%d: %s left no error message\n", __FILE__, __LINE__, #expr);             \
      oi_test_failures++;                                                                          \
    }                                                                                              \
  } while (0)

#endif
