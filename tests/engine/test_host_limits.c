/* The host's limits, each refused with a status and a message that names
 * it, leaving what exists working: a namespace re-registered with the same
 * block size but another shape; a block larger than the pool's chunks; a
 * block size past the size classes one host serves. And leases still held
 * (a host-level lookup's, which no engine owns) when the host is destroyed:
 * freed with it (the sanitizer builds check nothing leaks). */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "core/core.h"
#include "testutil.h"

static uint8_t arena_mem[1 << 20];

static float host_high_watermark; /* 0: the default */

static oi_offload_host *host_new(uint64_t pool, uint64_t chunk) {
  oi_host_options ho;
  REQUIRE(oi_host_options_init(&ho) == OI_OK);
  ho.pool_bytes = pool;
  ho.chunk_bytes = chunk;
  if (host_high_watermark > 0) ho.high_watermark = ho.low_watermark = host_high_watermark;
  oi_offload_host *h = NULL;
  REQUIRE(oi_offload_host_create(&ho, &h) == OI_OK);
  return h;
}

/* An engine over `na` arenas of `bytes` per block (8 blocks each) in ns. */
static oi_status engine_new(oi_offload_host *h, const char *ns, uint32_t na, uint64_t bytes,
                            oi_offload_engine **e) {
  oi_arena_desc ad[4];
  static const char *names[4] = {"k", "v", "x", "y"};
  REQUIRE(na <= 4 && na * 8 * bytes <= sizeof arena_mem);
  for (uint32_t a = 0; a < na; a++)
    ad[a] = (oi_arena_desc){.name = names[a],
                            .base = arena_mem + (uint64_t)a * 8 * bytes,
                            .num_blocks = 8,
                            .bytes_per_block = bytes,
                            .block_stride = bytes,
                            .segments = 1};
  oi_engine_options eo;
  REQUIRE(oi_engine_options_init(&eo) == OI_OK);
  eo.namespace_id = ns;
  eo.arenas = ad;
  eo.num_arenas = na;
  *e = NULL;
  return oi_offload_engine_create(h, &eo, e);
}

static oi_block_hash hash_of(uint64_t k) {
  oi_block_hash hs;
  memset(&hs, 0, sizeof hs);
  memcpy(hs.bytes, &k, sizeof k);
  hs.bytes[15] = 0x11;
  return hs;
}

/* Saves block 0 under hash k, waits, and says whether a query hits it. */
static bool save_and_hit(oi_offload_engine *e, uint64_t k) {
  int64_t id = 0;
  oi_block_hash hs = hash_of(k);
  oi_ticket *t = NULL;
  CHECK_OK(oi_offload_engine_save(e, &id, &hs, 1, NULL, &t));
  CHECK_OK(oi_ticket_wait(t, 10000));
  oi_ticket_release(t);
  oi_query_result q = {.struct_size = sizeof q};
  CHECK_OK(oi_offload_engine_query(e, NULL, &hs, 1, 0, &q));
  if (q.hit_blocks) CHECK_OK(oi_offload_engine_release(e, q.lease));
  return q.hit_blocks == 1;
}

static void test_same_block_size_another_shape_is_refused(void) {
  oi_offload_host *h = host_new(4 << 20, 0);
  oi_offload_engine *one, *other = (oi_offload_engine *)h;
  CHECK_OK(engine_new(h, "shape", 1, 8192, &one)); /* one arena of 8 KiB */
  CHECK(save_and_hit(one, 1));
  /* two arenas of 4 KiB: 8 KiB blocks too, but another layout */
  CHECK_ST(engine_new(h, "shape", 2, 4096, &other), OI_ERR_INVALID_ARGUMENT);
  CHECK(other == NULL);
  CHECK(strstr(oi_last_error(), "another shape") && strstr(oi_last_error(), "'shape'"));
  /* another block size: refused, naming both sizes */
  CHECK_ST(engine_new(h, "shape", 1, 4096, &other), OI_ERR_INVALID_ARGUMENT);
  CHECK(strstr(oi_last_error(), "8192 bytes") && strstr(oi_last_error(), "4096 bytes"));
  /* the same shape joins; another namespace may have the other shape */
  CHECK_OK(engine_new(h, "shape", 1, 8192, &other));
  oi_block_hash hs = hash_of(1);
  oi_query_result q = {.struct_size = sizeof q};
  CHECK_OK(oi_offload_engine_query(other, NULL, &hs, 1, 0, &q));
  CHECK(q.hit_blocks == 1); /* it sees the first engine's block */
  CHECK_OK(oi_offload_engine_release(other, q.lease));
  oi_offload_engine_destroy(other);
  CHECK_OK(engine_new(h, "shape-2", 2, 4096, &other));
  CHECK(save_and_hit(other, 2));
  oi_offload_engine_destroy(other);
  oi_offload_engine_destroy(one);
  oi_offload_host_destroy(h);
}

static void test_a_block_larger_than_a_chunk_is_refused(void) {
  oi_offload_host *h = host_new(4 << 20, 64 << 10); /* 64 KiB chunks */
  oi_offload_engine *e = (oi_offload_engine *)h;
  CHECK_ST(engine_new(h, "big", 1, (64 << 10) + 256, &e), OI_ERR_INVALID_ARGUMENT);
  CHECK(e == NULL);
  CHECK(strstr(oi_last_error(), "does not fit") && strstr(oi_last_error(), "chunk_bytes"));
  /* exactly a chunk fits */
  CHECK_OK(engine_new(h, "big", 1, 64 << 10, &e));
  CHECK(save_and_hit(e, 3));
  oi_offload_engine_destroy(e);
  oi_offload_host_destroy(h);
}

static void test_block_sizes_past_the_size_classes_are_refused(void) {
  oi_offload_host *h = host_new(8 << 20, 0);
  oi_offload_engine *e[8];
  char ns[16];
  for (int i = 0; i < 8; i++) { /* 8 sizes: 1 KiB .. 8 KiB */
    snprintf(ns, sizeof ns, "size-%d", i);
    CHECK_OK(engine_new(h, ns, 1, 1024u * (uint32_t)(i + 1), &e[i]));
  }
  oi_offload_engine *ninth = (oi_offload_engine *)h;
  CHECK_ST(engine_new(h, "size-8", 1, 9 * 1024, &ninth), OI_ERR_UNSUPPORTED);
  CHECK(ninth == NULL);
  CHECK(strstr(oi_last_error(), "already serves 8 block sizes"));
  oi_host_stats s = {.struct_size = sizeof s};
  CHECK_OK(oi_offload_host_stats(h, &s));
  CHECK(s.size_classes == 8);
  /* a new namespace of a size already served is fine, and every class works */
  CHECK_OK(engine_new(h, "size-8", 1, 2048, &ninth));
  for (int i = 0; i < 8; i++)
    CHECK(save_and_hit(e[i], 100 + (uint64_t)i));
  CHECK(save_and_hit(ninth, 200));
  oi_offload_engine_destroy(ninth);
  for (int i = 0; i < 8; i++)
    oi_offload_engine_destroy(e[i]);
  oi_offload_host_destroy(h);
}

static void test_leases_held_when_the_host_is_destroyed(void) {
  oi_offload_host *h = host_new(4 << 20, 0);
  oi_offload_engine *e;
  CHECK_OK(engine_new(h, "held", 1, 4096, &e));
  CHECK(save_and_hit(e, 7));
  oi_block_hash hs = hash_of(7);
  /* an engine's own lease: dropped when the engine goes */
  oi_query_result q = {.struct_size = sizeof q};
  CHECK_OK(oi_offload_engine_query(e, NULL, &hs, 1, 0, &q));
  CHECK(q.hit_blocks == 1);
  /* a lookup's lease (no instance): outlives every engine */
  oi_lookup_options lo;
  REQUIRE(oi_lookup_options_init(&lo) == OI_OK);
  lo.namespace_id = "held";
  oi_query_result lq = {.struct_size = sizeof lq};
  CHECK_OK(oi_offload_host_query(h, &lo, "req", &hs, 1, 0, &lq));
  CHECK(lq.hit_blocks == 1);
  oi_host_stats s = {.struct_size = sizeof s};
  CHECK_OK(oi_offload_host_stats(h, &s));
  CHECK(s.leases_active == 2 && s.blocks_leased == 1);
  oi_offload_engine_destroy(e);
  CHECK_OK(oi_offload_host_stats(h, &s));
  CHECK(s.leases_active == 1 && s.blocks_leased == 1 && s.blocks_pinned == 1);
  /* the host goes with the lease still held: freed, no complaint */
  oi_offload_host_destroy(h);
}

/* One block size holds every chunk of the pool (background eviction off):
 * a save of another size finds no chunk and evicts only within its own
 * size, so it is dropped and counted at once, never waits, and the first
 * size's blocks stay; once a whole chunk is free again (evict_all), the
 * second size gets it. (This pins down a limit, not a promise: the first
 * size's blocks are evictable, yet the second size gets nothing until a
 * whole chunk frees; docs/guarantees.md, Gaps.) */
static void test_another_block_size_while_one_fills_the_pool(void) {
  host_high_watermark = 1.0f;
  oi_offload_host *h = host_new(256 << 10, 64 << 10); /* 4 chunks of 16 4-KiB slots */
  host_high_watermark = 0;
  oi_offload_engine *a, *b;
  CHECK_OK(engine_new(h, "fills", 1, 4096, &a));
  int64_t ids[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  for (uint64_t k = 0; k < 64; k += 8) {
    oi_block_hash hs[8];
    for (int i = 0; i < 8; i++)
      hs[i] = hash_of(5000 + k + (uint64_t)i);
    oi_ticket *t;
    CHECK_OK(oi_offload_engine_save(a, ids, hs, 8, NULL, &t));
    CHECK_OK(oi_ticket_wait(t, 10000));
    oi_ticket_release(t);
  }
  oi_host_stats s = {.struct_size = sizeof s};
  CHECK_OK(oi_offload_host_stats(h, &s));
  CHECK(s.blocks_sealed == 64 && s.free_bytes == 0);
  CHECK_OK(engine_new(h, "other-size", 1, 8192, &b));
  oi_save_result res = {.struct_size = sizeof res};
  oi_save_options so;
  oi_save_options_init(&so);
  so.result = &res;
  oi_block_hash hb = hash_of(6000);
  oi_ticket *t;
  uint64_t t0 = oi__now_ns();
  CHECK_OK(oi_offload_engine_save(b, ids, &hb, 1, &so, &t));
  CHECK_OK(oi_ticket_wait(t, 10000));
  oi_ticket_release(t);
  CHECK(oi__now_ns() - t0 < 2000000000ull); /* never waits for room */
  CHECK(res.dropped == 1 && res.accepted == 0);
  CHECK_OK(oi_offload_host_stats(h, &s));
  CHECK(s.saves_dropped == 1 && s.blocks_sealed == 64 && s.evictions == 0);
  uint64_t ev = 0;
  CHECK_OK(oi_offload_host_evict_all(h, &ev));
  CHECK(ev == 64);
  CHECK(save_and_hit(b, 6000));
  oi_offload_engine_destroy(b);
  oi_offload_engine_destroy(a);
  oi_offload_host_destroy(h);
}

int main(void) {
  RUN_TEST(test_same_block_size_another_shape_is_refused);
  RUN_TEST(test_a_block_larger_than_a_chunk_is_refused);
  RUN_TEST(test_block_sizes_past_the_size_classes_are_refused);
  RUN_TEST(test_leases_held_when_the_host_is_destroyed);
  RUN_TEST(test_another_block_size_while_one_fills_the_pool);
  TEST_EXIT();
}
