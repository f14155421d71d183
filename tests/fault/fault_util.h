/* Helpers of the fault-injection tests (suite 'fault'): skip (77) in builds
 * without -Dfault_injection=true; a host and an engine over a malloc'ed arena
 * whose blocks hold patterns that depend on (logical block, byte). */
#ifndef OI_FAULT_UTIL_H
#define OI_FAULT_UTIL_H

#include <stdatomic.h>
#include <unistd.h>

#include "core/core.h"
#include "core/fault.h"
#include "rig.h"
#include "testutil.h"

#pragma GCC diagnostic ignored "-Wunused-function"

/* A child's step of the protocol is done: tells the parent on fd (best
 * effort: it may have stopped listening). */
#define STEP(fd)                                                                                   \
  do {                                                                                             \
    if ((fd) >= 0 && write((fd), "s", 1) != 1) {                                                   \
    }                                                                                              \
  } while (0)

/* Skips without fault injection; reads OI_FAULTS now (none set: nothing
 * armed), so a later setenv for a child server never arms this process. */
#define REQUIRE_FAULTS()                                                                           \
  do {                                                                                             \
    if (!oi__fault_available()) TEST_SKIP("built without -Dfault_injection=true");                 \
    unsetenv("OI_FAULTS");                                                                         \
    oi__fault_arm(OI_FAULT_HOST_ALLOC, 0, 0, 0);                                                   \
    oi__fault_disarm_all();                                                                        \
  } while (0)

typedef struct rig {
  oi_host *h;
  oi_engine *e;
  uint8_t *arena;
  uint64_t blocks, bytes; /* device blocks, bytes per block */
} rig;

static uint8_t fu_byte(uint64_t logical, uint64_t i) {
  uint64_t x = (logical + 1) * 0x9E3779B97F4A7C15ull ^ (i + 1) * 0xBF58476D1CE4E5B9ull;
  x ^= x >> 31;
  return (uint8_t)(x ^ (x >> 13));
}

static void fu_fill(rig *r, int64_t id, uint64_t logical) {
  for (uint64_t i = 0; i < r->bytes; i++)
    r->arena[(uint64_t)id * r->bytes + i] = fu_byte(logical, i);
}

static bool fu_check(const rig *r, int64_t id, uint64_t logical) {
  for (uint64_t i = 0; i < r->bytes; i++)
    if (r->arena[(uint64_t)id * r->bytes + i] != fu_byte(logical, i)) {
      fprintf(stderr, "block %lld byte %llu: 0x%02x, expected 0x%02x (logical %llu)\n",
              (long long)id, (unsigned long long)i, r->arena[(uint64_t)id * r->bytes + i],
              fu_byte(logical, i), (unsigned long long)logical);
      return false;
    }
  return true;
}

static oi_block_hash fu_hash(uint64_t logical) { return tr_hash(logical, 12, 0xFA); }

/* oi_engine_options.submit_group_bytes of the next rig_open (0: default). */
static uint64_t rig_submit_group_bytes;

/* A host of `pool_blocks` slots and one engine over `blocks` device blocks
 * of `bytes`. Deadlines and world size as given (0: defaults). */
static void rig_open(rig *r, uint64_t blocks, uint64_t bytes, uint64_t pool_blocks, uint32_t world,
                     uint32_t save_deadline_ms, uint32_t load_deadline_ms, uint32_t lease_ttl_ms) {
  memset(r, 0, sizeof *r);
  r->blocks = blocks;
  r->bytes = bytes;
  uint64_t slot = (bytes + 255) & ~255ull;
  oi_host_options ho = tr_host_options(0);
  ho.chunk_bytes = slot * 4;
  ho.pool_bytes = ((pool_blocks + 3) / 4) * ho.chunk_bytes;
  ho.high_watermark = 1.0f;
  if (lease_ttl_ms) ho.lease_ttl_ms = lease_ttl_ms;
  r->h = tr_host_new(&ho);
  r->arena = calloc(blocks, bytes);
  REQUIRE(r->arena);
  oi_arena_desc ad = tr_arena("kv", r->arena, blocks, bytes);
  oi_engine_options eo = tr_engine_options("fault", &ad, 1);
  if (world) eo.world_size = world;
  if (save_deadline_ms) eo.save_deadline_ms = save_deadline_ms;
  if (load_deadline_ms) eo.load_deadline_ms = load_deadline_ms;
  eo.submit_group_bytes = rig_submit_group_bytes;
  r->e = tr_engine_new(r->h, &eo);
}

/* Another engine of the rig's namespace and shape (default options) over
 * `mem`, which holds r->blocks blocks of r->bytes. */
static oi_engine *fu_rig_engine(rig *r, uint8_t *mem) {
  oi_arena_desc ad = tr_arena("kv", mem, r->blocks, r->bytes);
  return tr_engine(r->h, "fault", &ad, 1);
}

static void rig_close(rig *r) {
  oi__fault_disarm_all();
  oi_engine_destroy(r->e);
  oi_host_destroy(r->h);
  free(r->arena);
  memset(r, 0, sizeof *r);
}

/* The most blocks one rig_save, rig_query, rig_visible or rig_load names. */
#define RIG_MAX_BLOCKS 2048

/* Stages n blocks for a save: ids[i] = id0 + i, hs[i] = fu_hash(first + i),
 * and device block id0 + i filled with logical block first + i. */
static void fu_stage(rig *r, int64_t *ids, oi_block_hash *hs, size_t n, int64_t id0,
                     uint64_t first) {
  for (size_t i = 0; i < n; i++) {
    ids[i] = id0 + (int64_t)i;
    hs[i] = fu_hash(first + i);
    fu_fill(r, id0 + (int64_t)i, first + i);
  }
}

/* Saves logical blocks first..first+n-1 from device blocks 0..n-1 and waits.
 * @return the ticket's status. */
static oi_status rig_save(rig *r, uint64_t first, size_t n) {
  int64_t ids[RIG_MAX_BLOCKS];
  oi_block_hash hs[RIG_MAX_BLOCKS];
  REQUIRE(n <= RIG_MAX_BLOCKS);
  fu_stage(r, ids, hs, n, 0, first);
  return tr_save(r->e, ids, hs, n, 60000);
}

/* Hits (prefix) for logical first..first+n-1; the lease in *lease. */
static uint64_t rig_query(rig *r, uint64_t first, size_t n, oi_lease *lease) {
  oi_block_hash hs[RIG_MAX_BLOCKS];
  REQUIRE(n <= RIG_MAX_BLOCKS);
  for (size_t i = 0; i < n; i++)
    hs[i] = fu_hash(first + i);
  oi_query_result q;
  CHECK_OK(tr_query(r->e, NULL, hs, n, 0, NULL, &q));
  if (lease) *lease = q.lease;
  return q.hit_blocks;
}

/* Membership: how many of first..first+n-1 are visible. */
static uint64_t rig_visible(rig *r, uint64_t first, size_t n) {
  oi_block_hash hs[RIG_MAX_BLOCKS];
  uint8_t present[RIG_MAX_BLOCKS];
  REQUIRE(n <= RIG_MAX_BLOCKS);
  for (size_t i = 0; i < n; i++)
    hs[i] = fu_hash(first + i);
  oi_query_result q;
  CHECK_OK(tr_query(r->e, NULL, hs, n, OI_QUERY_MEMBERSHIP, present, &q));
  return q.hit_blocks;
}

/* rig_open (default deadlines and TTL), then logical blocks first..first+n-1
 * saved and queried, both CHECKed. @return the query's lease. */
static oi_lease rig_open_leased(rig *r, uint64_t blocks, uint64_t bytes, uint64_t pool_blocks,
                                uint32_t world, uint64_t first, size_t n) {
  rig_open(r, blocks, bytes, pool_blocks, world, 0, 0, 0);
  CHECK_OK(rig_save(r, first, n));
  oi_lease l;
  CHECK(rig_query(r, first, n, &l) == n);
  return l;
}

/* Loads a lease of n blocks into device blocks dst0..dst0+n-1 and waits. */
static oi_status rig_load(rig *r, oi_lease lease, int64_t dst0, size_t n) {
  int64_t ids[RIG_MAX_BLOCKS];
  REQUIRE(n <= RIG_MAX_BLOCKS);
  for (size_t i = 0; i < n; i++)
    ids[i] = dst0 + (int64_t)i;
  return tr_load(r->e, lease, ids, n, 60000);
}

static oi_host_stats rig_stats(rig *r) { return tr_host_stats(r->h); }

/* Logical blocks first..first+n-1 are all found (CHECKed), and their lease
 * loads them byte-exact (CHECKed) into device blocks 0..n-1 of a zeroed
 * arena. */
static void rig_check_reload(rig *r, uint64_t first, size_t n) {
  oi_lease l;
  CHECK(rig_query(r, first, n, &l) == n);
  memset(r->arena, 0, r->blocks * r->bytes);
  CHECK_OK(rig_load(r, l, 0, n));
  for (size_t i = 0; i < n; i++)
    CHECK(fu_check(r, (int64_t)i, first + i));
}

/* The pool's accounting is whole and nothing is half-done. */
static void rig_check_quiet(rig *r) {
  oi_host_stats s = rig_stats(r);
  CHECK(s.blocks_in_flight == 0);
  CHECK(s.blocks_loading == 0);
  CHECK(s.used_bytes + s.free_bytes == s.capacity_bytes);
  CHECK(s.block_bytes_resident == s.blocks_sealed * r->bytes);
}

/* Layer-by-layer saves: a host and an engine over three arenas (a layer
 * each) of 8 blocks of 4 KiB. */
enum { FU_LAYERS = 3, FU_LAYER_BLOCKS = 8, FU_LAYER_BYTES = 4096 };

typedef struct layer_rig {
  oi_host *h;
  oi_engine *e;
  uint8_t *mem;
  oi_arena_desc ad[FU_LAYERS];
} layer_rig;

/* A host of 16 MiB and FU_LAYERS arenas of `blocks` blocks of FU_LAYER_BYTES;
 * @return the options of the engine over them, for the caller to adjust. */
static oi_engine_options fu_layer_rig_begin(layer_rig *r, const char *ns, uint64_t blocks) {
  r->h = tr_host(16 << 20);
  r->mem = calloc(FU_LAYERS, blocks * FU_LAYER_BYTES);
  REQUIRE(r->mem);
  tr_layers(r->ad, FU_LAYERS, tr_layer_names, r->mem, blocks, FU_LAYER_BYTES);
  return tr_engine_options(ns, r->ad, FU_LAYERS);
}

static void fu_layer_rig_open(layer_rig *r, const char *ns) {
  memset(r, 0, sizeof *r);
  oi_engine_options eo = fu_layer_rig_begin(r, ns, FU_LAYER_BLOCKS);
  r->e = tr_engine_new(r->h, &eo);
}

static void fu_layer_rig_close(layer_rig *r) {
  oi_engine_destroy(r->e);
  oi_host_destroy(r->h);
  free(r->mem);
}

/* The options of one call of a layer-by-layer save: one arena (layer) a
 * call, arena_first for the caller to set. */
static oi_save_options fu_layer_save_options(void) {
  oi_save_options so;
  oi_save_options_init(&so);
  so.arena_count = 1;
  return so;
}

/* After layer a of a layer-by-layer save of two blocks in which layer 1
 * fails: both blocks are in flight after layer 0 and freed as soon as a
 * layer failed; neither is ever sealed. */
static void fu_check_layer_in_flight(layer_rig *r, uint32_t a) {
  oi_host_stats s = tr_host_stats(r->h);
  CHECK(s.blocks_in_flight == (a == 0 ? 2u : 0u));
  CHECK(s.blocks_sealed == 0);
}

/* After a layer-by-layer save of hs[0..2) that one layer failed: a flush
 * ends, neither block hits, the engine counts two failed saves and none
 * pending; whole saves of the same hashes then work and hit. */
static void fu_layer_save_aborted(layer_rig *r, const int64_t *ids, const oi_block_hash *hs) {
  CHECK_OK(oi_engine_flush(r->e, 10000));
  oi_query_result q;
  CHECK_OK(tr_query(r->e, NULL, hs, 2, 0, NULL, &q));
  CHECK(q.hit_blocks == 0);
  oi_engine_stats es = tr_engine_stats(r->e);
  CHECK(es.saves_failed == 2 && es.saves_completed == 0 && es.saves_pending == 0);
  CHECK_OK(tr_save(r->e, ids, hs, 2, 60000)); /* whole blocks, again */
  CHECK_OK(tr_query(r->e, NULL, hs, 2, 0, NULL, &q));
  CHECK(q.hit_blocks == 2);
  CHECK_OK(oi_engine_release(r->e, q.lease));
}

#endif
