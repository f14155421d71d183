/* The connector-facing calls of the embedded engine (issue 18, items 1, 2, 7
 * and 8): a lease is redeemable by any engine instance of its namespace
 * (scheduler queries, worker loads) with its TTL and world_size shares kept;
 * a lease of another namespace, a forged or an expired one is refused; a
 * host-level lookup needs no layout; query answers report pending blocks;
 * each save call reports what it accepted, deduplicated and dropped. */
#include "engine_testutil.h"

#define SEED 0xACE5ull
#define NB 64
#define BPB 1024 /* two arenas of 1 KiB: a host block is 2 KiB */

static etu_layout L, L2;
static uint64_t next_space = 7000;

static void fill_save(oi_engine *e, const etu_layout *lay, uint64_t space, const oi_block_hash *hs,
                      int n) {
  int64_t ids[NB];
  for (int i = 0; i < n; i++) {
    ids[i] = i;
    etu_fill_block(lay, i, space * 100 + (uint64_t)i, SEED);
  }
  CHECK_OK(etu_save_wait(e, ids, hs, (size_t)n));
  CHECK_OK(oi_engine_flush(e, UINT32_MAX));
}

static void hashes(uint64_t space, oi_block_hash *hs, int n) {
  for (int i = 0; i < n; i++)
    hs[i] = etu_hash(space, (uint64_t)i);
}

/* n hashes of a fresh space, the first `saved` of them saved by e.
 * @return the space. */
static uint64_t hashes_saved(oi_engine *e, const etu_layout *lay, oi_block_hash *hs, int n,
                             int saved) {
  uint64_t space = next_space++;
  hashes(space, hs, n);
  fill_save(e, lay, space, hs, saved);
  return space;
}

static oi_lookup_options lookup_opts(const char *ns, uint32_t world) {
  oi_lookup_options o;
  REQUIRE(oi_lookup_options_init(&o) == OI_OK);
  o.namespace_id = ns;
  o.world_size = world;
  return o;
}

static oi_status host_query(oi_host *h, const char *ns, uint32_t world, const oi_block_hash *hs,
                            size_t n, uint32_t flags, oi_query_result *q) {
  memset(q, 0, sizeof *q);
  q->struct_size = sizeof *q;
  oi_lookup_options o = lookup_opts(ns, world);
  return oi_host_query(h, &o, "req", hs, n, flags, q);
}

/* A scheduler engine queries; two worker engines (world_size 2) load the
 * lease byte-exact; a third load is refused; the querying engine never
 * loads. */
static void test_scheduler_queries_workers_load(void) {
  oi_host *h = etu_host_create(8u << 20);
  oi_engine *sched = etu_engine_create(h, &L, "shared", 2);
  oi_engine *w1 = etu_engine_create(h, &L2, "shared", 2);
  etu_layout L3;
  etu_layout_clone_shape(&L3, &L);
  oi_engine *w2 = etu_engine_create(h, &L3, "shared", 2);
  oi_block_hash hs[6];
  uint64_t space = hashes_saved(sched, &L, hs, 6, 4);
  oi_query_result q;
  CHECK_OK(etu_query(sched, "r1", hs, 6, &q));
  CHECK(q.hit_blocks == 4);
  CHECK(q.pending_blocks == 0);
  int64_t dst[4] = {40, 41, 42, 43};
  CHECK_OK(etu_load_wait(w1, q.lease, dst, 4));
  CHECK_OK(etu_load_wait(w2, q.lease, dst, 4));
  for (int i = 0; i < 4; i++) {
    CHECK(etu_block_matches(&L2, dst[i], space * 100 + (uint64_t)i, SEED, "worker 1"));
    CHECK(etu_block_matches(&L3, dst[i], space * 100 + (uint64_t)i, SEED, "worker 2"));
  }
  /* Both shares are spent: the budget holds across instances. */
  int64_t more[4] = {50, 51, 52, 53};
  CHECK_FAILS(oi_engine_load(sched, q.lease, more, 4, NULL, NULL), OI_ERR_LEASE_EXPIRED);
  CHECK(etu_block_is_zero(&L, 50));
  CHECK(etu_host_stats(h).blocks_leased == 0);
  oi_engine_destroy(w2);
  oi_engine_destroy(w1);
  oi_engine_destroy(sched);
  oi_host_destroy(h);
  etu_layout_free(&L3);
  etu_zero_block(&L2, 40), etu_zero_block(&L2, 41), etu_zero_block(&L2, 42),
      etu_zero_block(&L2, 43);
}

/* Another namespace's engine, a forged lease and an expired one are
 * refused, and a refused attempt neither consumes nor drops the lease. */
static void test_wrong_namespace_forged_and_expired_are_refused(void) {
  oi_host *h = etu_host_create_opts(8u << 20, 0, 300); /* TTL 300 ms */
  oi_engine *a = etu_engine_create(h, &L, "ns-a", 1);
  oi_engine *b = etu_engine_create(h, &L2, "ns-b", 1);
  oi_block_hash hs[3];
  uint64_t space = hashes_saved(a, &L, hs, 3, 3);
  oi_query_result q;
  CHECK_OK(etu_query(a, NULL, hs, 3, &q));
  CHECK(q.hit_blocks == 3);
  int64_t dst[3] = {30, 31, 32};
  oi_clear_error();
  CHECK_FAILS(oi_engine_load(b, q.lease, dst, 3, NULL, NULL), OI_ERR_PERMISSION);
  CHECK(strstr(oi_last_error(), "namespace") != NULL);
  CHECK_FAILS(oi_engine_release(b, q.lease), OI_ERR_PERMISSION);
  CHECK(etu_block_is_zero(&L2, 30));
  /* The host-level release checks the namespace too. */
  CHECK_FAILS(oi_host_release(h, "ns-b", q.lease), OI_ERR_PERMISSION);
  /* A forged lease: the right id with another tag. */
  oi_lease forged = q.lease;
  forged.bytes[12] ^= 0x5A;
  CHECK_FAILS(oi_engine_load(a, forged, dst, 3, NULL, NULL), OI_ERR_LEASE_EXPIRED);
  CHECK_FAILS(oi_host_release(h, "ns-a", forged), OI_ERR_LEASE_EXPIRED);
  /* The real one still works after every refusal. */
  CHECK_OK(etu_load_wait(a, q.lease, dst, 3));
  for (int i = 0; i < 3; i++)
    CHECK(etu_block_matches(&L, dst[i], space * 100 + (uint64_t)i, SEED, "after refusals"));
  /* Expired: the TTL holds for every redeemer. */
  oi_engine *a2 = etu_engine_create(h, &L2, "ns-a", 1);
  CHECK_OK(etu_query(a, NULL, hs, 3, &q));
  CHECK(q.hit_blocks == 3);
  etu_sleep_ms(450);
  CHECK_FAILS(oi_engine_load(a2, q.lease, dst, 3, NULL, NULL), OI_ERR_LEASE_EXPIRED);
  CHECK(etu_block_is_zero(&L2, 30));
  oi_engine_destroy(a2);
  oi_engine_destroy(b);
  oi_engine_destroy(a);
  oi_host_destroy(h);
  for (int i = 30; i < 33; i++)
    etu_zero_block(&L, i);
}

/* A lookup with no layout: prefix lease and membership from the host; its
 * lease's shares go to engines of the namespace; it outlives any engine. */
static void test_host_lookup_without_a_layout(void) {
  oi_host *h = etu_host_create(8u << 20);
  oi_block_hash hs[5];
  uint64_t space = next_space++;
  hashes(space, hs, 5);
  /* Nothing registered the namespace yet: a miss, no lease. */
  oi_query_result q;
  CHECK_OK(host_query(h, "lookup", 1, hs, 5, 0, &q));
  CHECK(q.hit_blocks == 0 && etu_lease_is_zero(q.lease));
  uint8_t present[5] = {9, 9, 9, 9, 9};
  memset(&q, 0, sizeof q);
  q.struct_size = sizeof q;
  q.present = present;
  oi_lookup_options lo = lookup_opts("lookup", 1);
  CHECK_OK(oi_host_query(h, &lo, NULL, hs, 5, OI_QUERY_MEMBERSHIP, &q));
  CHECK(q.hit_blocks == 0 && present[0] == 0 && present[4] == 0);

  oi_engine *saver = etu_engine_create(h, &L, "lookup", 1);
  fill_save(saver, &L, space, hs, 3);
  oi_engine_destroy(saver); /* the blocks stay in the tier */
  oi_host_stats before = etu_host_stats(h);
  CHECK_OK(host_query(h, "lookup", 2, hs, 5, 0, &q));
  CHECK(q.hit_blocks == 3 && !etu_lease_is_zero(q.lease));
  CHECK(etu_host_stats(h).blocks_leased == before.blocks_leased + 3);
  oi_engine *w1 = etu_engine_create(h, &L2, "lookup", 1);
  etu_layout L3;
  etu_layout_clone_shape(&L3, &L);
  oi_engine *w2 = etu_engine_create(h, &L3, "lookup", 1);
  int64_t dst[3] = {10, 11, 12};
  CHECK_OK(etu_load_wait(w1, q.lease, dst, 3));
  oi_engine_destroy(w1); /* the lease belongs to no engine: it lives on */
  CHECK_OK(etu_load_wait(w2, q.lease, dst, 3));
  for (int i = 0; i < 3; i++) {
    CHECK(etu_block_matches(&L2, dst[i], space * 100 + (uint64_t)i, SEED, "lookup worker 1"));
    CHECK(etu_block_matches(&L3, dst[i], space * 100 + (uint64_t)i, SEED, "lookup worker 2"));
  }
  CHECK_FAILS(oi_engine_load(w2, q.lease, dst, 3, NULL, NULL), OI_ERR_LEASE_EXPIRED);
  CHECK(etu_host_stats(h).blocks_leased == before.blocks_leased);
  /* Membership needs no lease. */
  memset(present, 9, sizeof present);
  memset(&q, 0, sizeof q);
  q.struct_size = sizeof q;
  q.present = present;
  CHECK_OK(oi_host_query(h, &lo, NULL, hs, 5, OI_QUERY_MEMBERSHIP, &q));
  CHECK(q.hit_blocks == 3 && present[0] == 1 && present[2] == 1 && present[3] == 0);
  CHECK(etu_lease_is_zero(q.lease));
  /* An engine may release a lookup's lease, the host may release it once. */
  CHECK_OK(host_query(h, "lookup", 1, hs, 5, 0, &q));
  CHECK_OK(oi_host_release(h, "lookup", q.lease));
  CHECK_FAILS(oi_engine_release(w2, q.lease), OI_ERR_LEASE_EXPIRED);
  CHECK_OK(host_query(h, "lookup", 1, hs, 5, 0, &q));
  CHECK_OK(oi_engine_release(w2, q.lease));
  CHECK(etu_host_stats(h).blocks_leased == before.blocks_leased);
  /* Bad input. */
  oi_lookup_options bad = lookup_opts(NULL, 1);
  CHECK_FAILS(oi_host_query(h, &bad, NULL, hs, 5, 0, &q), OI_ERR_INVALID_ARGUMENT);
  bad = lookup_opts("lookup", 0);
  CHECK_FAILS(oi_host_query(h, &bad, NULL, hs, 5, 0, &q), OI_ERR_INVALID_ARGUMENT);
  CHECK_FAILS(oi_host_query(NULL, &lo, NULL, hs, 5, 0, &q), OI_ERR_INVALID_ARGUMENT);
  CHECK_FAILS(oi_host_query(h, NULL, NULL, hs, 5, 0, &q), OI_ERR_INVALID_ARGUMENT);
  CHECK_FAILS(oi_host_query(h, &lo, NULL, hs, 5, 1u << 7, &q), OI_ERR_INVALID_ARGUMENT);
  CHECK_FAILS(oi_host_query(h, &lo, NULL, NULL, 5, 0, &q), OI_ERR_INVALID_ARGUMENT);
  CHECK_FAILS(oi_host_release(h, NULL, q.lease), OI_ERR_INVALID_ARGUMENT);
  CHECK(etu_host_stats(h).blocks_leased == before.blocks_leased);
  oi_engine_destroy(w2);
  oi_host_destroy(h);
  etu_layout_free(&L3);
  for (int i = 10; i < 13; i++)
    etu_zero_block(&L2, i);
}

/* Query flags and the result struct: one smaller than its 0.1 layout is
 * refused (nothing written); WAIT_PENDING is not for membership; with
 * nothing in flight it answers at once. */
static void test_query_flags_and_old_structs(void) {
  oi_host *h = etu_host_create(8u << 20);
  oi_engine *e = etu_engine_create(h, &L, "flags", 1);
  oi_block_hash hs[4];
  (void)hashes_saved(e, &L, hs, 4, 2);
  oi_query_result q;
  memset(&q, 0xEE, sizeof q);
  q.struct_size = (uint32_t)offsetof(oi_query_result, reserved);
  q.present = NULL;
  CHECK_FAILS(oi_engine_query(e, NULL, hs, 4, 0, &q), OI_ERR_INVALID_ARGUMENT);
  CHECK(q.hit_blocks == 0xEEEEEEEEEEEEEEEEull); /* refused: nothing written */
  CHECK_FAILS(oi_engine_query(e, NULL, hs, 4, OI_QUERY_WAIT_PENDING, &q), OI_ERR_INVALID_ARGUMENT);
  memset(&q, 0, sizeof q);
  q.struct_size = sizeof q;
  uint8_t present[4];
  q.present = present;
  CHECK_FAILS(oi_engine_query(e, NULL, hs, 4, OI_QUERY_MEMBERSHIP | OI_QUERY_WAIT_PENDING, &q),
              OI_ERR_INVALID_ARGUMENT);
  q.present = NULL;
  q.wait_ms = 5000;
  double t0 = etu_now_s();
  CHECK_OK(oi_engine_query(e, NULL, hs, 4, OI_QUERY_WAIT_PENDING, &q));
  CHECK(etu_now_s() - t0 < 1.0); /* nothing in flight: no wait */
  CHECK(q.hit_blocks == 2 && q.pending_blocks == 0 && q.wait_ms == 5000);
  CHECK_OK(oi_engine_release(e, q.lease));
  CHECK(etu_host_stats(h).blocks_leased == 0);
  oi_engine_destroy(e);
  oi_host_destroy(h);
}

/* Save results: deduplicated blocks; a pool full of pinned blocks drops
 * with the ticket still OK, and the caller sees it per call. */
static void test_save_result_reports_each_call(void) {
  /* 16 slots of 2 KiB, no background eviction. */
  oi_host *h = etu_host_create_wm(16 * 2048, 16 * 2048, 0, 1.0f, 1.0f);
  oi_engine *e = etu_engine_create(h, &L, "counts", 1);
  uint64_t space = next_space++;
  oi_block_hash hs[NB];
  hashes(space, hs, NB);
  int64_t ids[NB];
  for (int i = 0; i < NB; i++) {
    ids[i] = i;
    etu_fill_block(&L, i, space * 100 + (uint64_t)i, SEED);
  }
  oi_save_result res;
  memset(&res, 0xAB, sizeof res);
  res.struct_size = sizeof res;
  oi_save_options so;
  CHECK_OK(oi_save_options_init(&so));
  so.result = &res;
  oi_ticket *t = NULL;
  CHECK_OK(oi_engine_save(e, ids, hs, 8, &so, &t));
  CHECK(res.accepted == 8 && res.deduplicated == 0 && res.dropped == 0);
  CHECK_OK(etu_ticket_finish(t));
  /* Half known, half new. */
  CHECK_OK(oi_engine_save(e, &ids[4], &hs[4], 8, &so, &t));
  CHECK(res.accepted == 4 && res.deduplicated == 4 && res.dropped == 0);
  CHECK_OK(etu_ticket_finish(t));
  CHECK_OK(oi_engine_flush(e, UINT32_MAX));
  /* Pin all 12 sealed blocks, then offer 20 more: 4 slots are left. */
  oi_query_result q;
  CHECK_OK(etu_query(e, NULL, hs, 12, &q));
  CHECK(q.hit_blocks == 12);
  CHECK_OK(oi_engine_save(e, &ids[12], &hs[12], 20, &so, &t));
  CHECK(res.accepted == 4 && res.deduplicated == 0 && res.dropped == 16);
  CHECK_OK(etu_ticket_finish(t)); /* the ticket is OK: the drops are in the result */
  CHECK_OK(oi_engine_flush(e, UINT32_MAX));
  /* Now every slot is pinned or sealed; pin the last 4 too: all drop. */
  oi_query_result q2;
  CHECK_OK(etu_query(e, NULL, &hs[12], 4, &q2));
  CHECK(q2.hit_blocks == 4);
  CHECK_OK(oi_engine_save(e, &ids[40], &hs[40], 6, &so, &t));
  CHECK(res.accepted == 0 && res.deduplicated == 0 && res.dropped == 6);
  CHECK_OK(etu_ticket_finish(t));
  uint8_t present[6];
  CHECK(etu_membership(e, &hs[40], 6, present) == 0);
  /* Loads of what was accepted are byte-exact. */
  int64_t dst[4] = {60, 61, 62, 63};
  CHECK_OK(etu_load_wait(e, q2.lease, dst, 4));
  for (int i = 0; i < 4; i++)
    CHECK(etu_block_matches(&L, dst[i], space * 100 + 12 + (uint64_t)i, SEED, "accepted"));
  CHECK_OK(oi_engine_release(e, q.lease));
  /* Without the result pointer nothing changes (and NULL options work). */
  CHECK_OK(etu_save_wait(e, &ids[50], &hs[50], 2));
  /* A result struct too small is refused before anything happens. */
  res.struct_size = 8;
  uint64_t submitted = etu_engine_stats(e).saves_submitted;
  CHECK_FAILS(oi_engine_save(e, ids, hs, 2, &so, &t), OI_ERR_INVALID_ARGUMENT);
  CHECK(t == NULL && etu_engine_stats(e).saves_submitted == submitted);
  oi_engine_destroy(e);
  oi_host_destroy(h);
  for (int i = 0; i < NB; i++)
    etu_zero_block(&L, i);
}

int main(void) {
  etu_layout_simple(&L, 2, NB, BPB);
  etu_layout_clone_shape(&L2, &L);
  RUN_TEST(test_scheduler_queries_workers_load);
  RUN_TEST(test_wrong_namespace_forged_and_expired_are_refused);
  RUN_TEST(test_host_lookup_without_a_layout);
  RUN_TEST(test_query_flags_and_old_structs);
  RUN_TEST(test_save_result_reports_each_call);
  etu_layout_free(&L2);
  etu_layout_free(&L);
  TEST_EXIT();
}
