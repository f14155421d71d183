/* Prefix semantics of queries and the life of a lease: created iff hits > 0,
 * world_size shares, bound to its instance, released / consumed / expired
 * leases fail with OI_ERR_LEASE_EXPIRED, TTL expiry frees the pins, and a
 * count mismatch is rejected before any copy. */
#include "engine_testutil.h"

#define SEED 0xFEEDull
#define NB 32

static oi_host *host;
static etu_layout L;
static uint64_t next_space = 1000;

/* Saves hashes hs[i] for i where mask bit i is set, from block i (content
 * key = space * 64 + i), then flushes. */
static void save_mask(oi_engine *e, uint64_t space, const oi_block_hash *hs, int n, unsigned mask) {
  int64_t ids[32];
  oi_block_hash sel[32];
  int m = 0;
  for (int i = 0; i < n; i++)
    if (mask & (1u << i)) {
      ids[m] = i;
      sel[m] = hs[i];
      etu_fill_block(&L, i, space * 64 + (uint64_t)i, SEED);
      m++;
    }
  CHECK_OK(etu_save_wait(e, ids, sel, (size_t)m));
  CHECK_OK(oi_engine_flush(e, UINT32_MAX));
}

static uint64_t leases_active(void) { return etu_host_stats(host).leases_active; }

/* A query that hit nothing: ready, no lease, no new active lease. */
#define CHECK_NO_HIT(q, active_before)                                                             \
  do {                                                                                             \
    CHECK((q).hit_blocks == 0);                                                                    \
    CHECK((q).state == OI_QUERY_READY);                                                            \
    CHECK(etu_lease_is_zero((q).lease));                                                           \
    CHECK(leases_active() == (active_before));                                                     \
  } while (0)

/* Takes a fresh content space and sets hs[i] = its hash of i for i < n.
 * @return the space. */
static uint64_t new_hashes(oi_block_hash *hs, int n) {
  uint64_t space = next_space++;
  for (int i = 0; i < n; i++)
    hs[i] = etu_hash(space, (uint64_t)i);
  return space;
}

/* new_hashes, then save_mask of them. @return the space. */
static uint64_t save_new(oi_engine *e, oi_block_hash *hs, int n, unsigned mask) {
  uint64_t space = new_hashes(hs, n);
  save_mask(e, space, hs, n, mask);
  return space;
}

/* save_new of all n blocks, then a prefix query over them into q, which must
 * hit all n. @return the space. */
static uint64_t save_and_lease(oi_engine *e, oi_block_hash *hs, int n, oi_query_result *q) {
  uint64_t space = save_new(e, hs, n, (1u << n) - 1);
  CHECK_OK(etu_query(e, NULL, hs, (size_t)n, q));
  CHECK(q->hit_blocks == (uint64_t)n);
  return space;
}

/* @return whether device block dst[i] of l holds block i of `space` for
 * every i < n (each mismatch printed under label). */
static bool loaded(const etu_layout *l, const int64_t *dst, int n, uint64_t space,
                   const char *label) {
  bool ok = true;
  for (int i = 0; i < n; i++)
    ok &= etu_block_matches(l, dst[i], space * 64 + (uint64_t)i, SEED, label);
  return ok;
}

/* @return whether every device block dst[i], i < n, of L is zero. */
static bool all_zero(const int64_t *dst, int n) {
  bool ok = true;
  for (int i = 0; i < n; i++)
    ok &= etu_block_is_zero(&L, dst[i]);
  return ok;
}

/* Zeroes device blocks dst[i], i < n, of l (for the next test). */
static void zero_blocks(const etu_layout *l, const int64_t *dst, int n) {
  for (int i = 0; i < n; i++)
    etu_zero_block(l, dst[i]);
}

static void test_partial_prefix_hits_the_leading_run(void) {
  oi_engine *e = etu_engine_create(host, &L, "prefix", 1);
  oi_block_hash hs[5];
  uint64_t space = save_new(e, hs, 5, 0x7); /* 3 of 5 */
  oi_host_stats before = etu_host_stats(host);
  oi_query_result q;
  CHECK_OK(etu_query(e, "req-a", hs, 5, &q));
  CHECK(q.state == OI_QUERY_READY);
  CHECK(q.hit_blocks == 3);
  CHECK(!etu_lease_is_zero(q.lease));
  oi_host_stats after = etu_host_stats(host);
  CHECK(after.query_hit_blocks == before.query_hit_blocks + 3);
  CHECK(after.query_miss_blocks == before.query_miss_blocks + 2);
  CHECK(after.leases_active == before.leases_active + 1);
  CHECK(after.blocks_leased == before.blocks_leased + 3);
  int64_t dst[3] = {20, 21, 22};
  CHECK_OK(etu_load_wait(e, q.lease, dst, 3));
  CHECK(loaded(&L, dst, 3, space, "prefix 3 of 5"));
  CHECK(etu_block_is_zero(&L, 23));
  after = etu_host_stats(host);
  CHECK(after.leases_active == before.leases_active); /* its only share was consumed */
  CHECK(after.leases_released == before.leases_released + 1);
  zero_blocks(&L, dst, 3);
  oi_engine_destroy(e);
}

static void test_a_gap_breaks_the_prefix(void) {
  oi_engine *e = etu_engine_create(host, &L, "prefix", 1);
  oi_block_hash hs[5];
  save_new(e, hs, 5, 0x1B); /* 0, 1, 3, 4: block 2 missing */
  oi_query_result q;
  CHECK_OK(etu_query(e, NULL, hs, 5, &q));
  CHECK(q.hit_blocks == 2);
  CHECK(!etu_lease_is_zero(q.lease));
  CHECK_OK(oi_engine_release(e, q.lease));
  /* Starting after the gap, the rest is a prefix of its own. */
  CHECK_OK(etu_query(e, NULL, hs + 3, 2, &q));
  CHECK(q.hit_blocks == 2);
  CHECK_OK(oi_engine_release(e, q.lease));
  oi_engine_destroy(e);
}

static void test_first_block_missing_means_no_hit_and_no_lease(void) {
  oi_engine *e = etu_engine_create(host, &L, "prefix", 1);
  oi_block_hash hs[5];
  save_new(e, hs, 5, 0x1E); /* 1..4 */
  uint64_t active = leases_active();
  oi_query_result q;
  memset(&q.lease, 0xAB, sizeof q.lease);
  CHECK_OK(etu_query(e, NULL, hs, 5, &q));
  CHECK_NO_HIT(q, active);
  oi_engine_destroy(e);
}

static void test_empty_query_hits_nothing_and_makes_no_lease(void) {
  oi_engine *e = etu_engine_create(host, &L, "prefix", 1);
  oi_block_hash hs[1] = {etu_hash(next_space++, 0)};
  uint64_t active = leases_active();
  oi_query_result q;
  memset(&q, 0xCD, sizeof q);
  q.struct_size = sizeof q;
  q.present = NULL;
  CHECK_OK(oi_engine_query(e, "empty", hs, 0, 0, &q));
  CHECK_NO_HIT(q, active);
  oi_engine_destroy(e);
}

static void test_membership_reports_each_position(void) {
  oi_engine *e = etu_engine_create(host, &L, "prefix", 1);
  oi_block_hash hs[7];
  save_new(e, hs, 7, 0x54); /* 2, 4, 6 */
  uint64_t active = leases_active();
  uint64_t leased = etu_host_stats(host).blocks_leased;
  uint8_t present[7];
  memset(present, 0xAA, sizeof present);
  oi_query_result q;
  memset(&q, 0, sizeof q);
  q.struct_size = sizeof q;
  q.present = present;
  CHECK_OK(oi_engine_query(e, "m", hs, 7, OI_QUERY_MEMBERSHIP, &q));
  CHECK(q.hit_blocks == 3);
  CHECK(etu_lease_is_zero(q.lease));
  const uint8_t want[7] = {0, 0, 1, 0, 1, 0, 1};
  CHECK(memcmp(present, want, 7) == 0);
  CHECK(leases_active() == active);
  CHECK(etu_host_stats(host).blocks_leased == leased);
  /* The same hashes as a prefix query: nothing, since position 0 is missing. */
  CHECK_OK(etu_query(e, "m", hs, 7, &q));
  CHECK(q.hit_blocks == 0);
  oi_engine_destroy(e);
}

static void test_a_miss_does_not_poison_a_later_hit_for_the_same_req_id(void) {
  oi_engine *e = etu_engine_create(host, &L, "prefix", 1);
  oi_block_hash hs[4];
  uint64_t space = new_hashes(hs, 4);
  oi_query_result q;
  CHECK_OK(etu_query(e, "r1", hs, 4, &q));
  CHECK(q.hit_blocks == 0);
  CHECK(q.state == OI_QUERY_READY);
  CHECK_OK(etu_query(e, "r1", hs, 4, &q)); /* asked twice */
  CHECK(q.hit_blocks == 0);
  save_mask(e, space, hs, 4, 0xF);
  CHECK_OK(etu_query(e, "r1", hs, 4, &q));
  CHECK(q.state == OI_QUERY_READY);
  CHECK(q.hit_blocks == 4);
  int64_t dst[4] = {30, 29, 28, 27};
  CHECK_OK(etu_load_wait(e, q.lease, dst, 4));
  CHECK(loaded(&L, dst, 4, space, "after miss"));
  zero_blocks(&L, dst, 4);
  oi_engine_destroy(e);
}

static void test_a_lease_serves_exactly_world_size_loads(void) {
  enum { W = 3 };
  oi_engine *e = etu_engine_create(host, &L, "prefix", W);
  oi_block_hash hs[3];
  uint64_t space = save_new(e, hs, 3, 0x7);
  oi_host_stats before = etu_host_stats(host);
  oi_query_result q;
  CHECK_OK(etu_query(e, NULL, hs, 3, &q));
  CHECK(q.hit_blocks == 3);
  for (int r = 0; r < W; r++) {
    int64_t dst[3] = {10 + 3 * r, 11 + 3 * r, 12 + 3 * r};
    CHECK_OK(etu_load_wait(e, q.lease, dst, 3));
    CHECK(loaded(&L, dst, 3, space, "world_size share"));
    if (r < W - 1) CHECK(leases_active() == before.leases_active + 1);
  }
  CHECK(leases_active() == before.leases_active);
  /* The W+1-th load fails and copies nothing. */
  int64_t extra[3] = {25, 26, 24};
  oi_ticket *t = NULL;
  oi_clear_error();
  oi_status st = oi_engine_load(e, q.lease, extra, 3, NULL, &t);
  if (st == OI_OK)
    st = etu_ticket_finish(t); /* an implementation may report through the ticket */
  else
    oi_ticket_release(t);
  CHECK(st == OI_ERR_LEASE_EXPIRED);
  CHECK(all_zero(extra, 3));
  CHECK_FAILS(oi_engine_release(e, q.lease), OI_ERR_LEASE_EXPIRED);
  oi_host_stats after = etu_host_stats(host);
  CHECK(after.blocks_leased == before.blocks_leased);
  for (int i = 10; i < 19; i++)
    etu_zero_block(&L, i);
  oi_engine_destroy(e);
}

static void test_a_lease_is_shared_in_its_namespace(void) {
  etu_layout L2;
  etu_layout_clone_shape(&L2, &L);
  oi_engine *a = etu_engine_create(host, &L, "prefix", 1);
  oi_engine *b = etu_engine_create(host, &L2, "prefix", 1);
  oi_block_hash hs[2];
  oi_query_result q;
  uint64_t space = save_and_lease(a, hs, 2, &q);
  /* Another instance of the namespace redeems a's lease (its one share). */
  int64_t dst[2] = {20, 21};
  CHECK_OK(etu_load_wait(b, q.lease, dst, 2));
  CHECK(loaded(&L2, dst, 2, space, "other rank loads a's lease"));
  /* The share is gone for everyone, the querying instance included. */
  CHECK_FAILS(oi_engine_load(a, q.lease, dst, 2, NULL, NULL), OI_ERR_LEASE_EXPIRED);
  CHECK(all_zero(dst, 2));
  /* b may release a lease a took. */
  CHECK_OK(etu_query(a, NULL, hs, 2, &q));
  CHECK_OK(oi_engine_release(b, q.lease));
  CHECK_FAILS(oi_engine_release(a, q.lease), OI_ERR_LEASE_EXPIRED);
  zero_blocks(&L2, dst, 2);
  oi_engine_destroy(a);
  oi_engine_destroy(b);
  etu_layout_free(&L2);
}

static void test_released_and_unknown_leases_fail_with_lease_expired(void) {
  oi_engine *e = etu_engine_create(host, &L, "prefix", 2);
  oi_block_hash hs[2];
  save_new(e, hs, 2, 0x3);
  oi_host_stats before = etu_host_stats(host);
  oi_query_result q;
  CHECK_OK(etu_query(e, NULL, hs, 2, &q));
  CHECK(etu_host_stats(host).blocks_leased == before.blocks_leased + 2);
  CHECK_OK(oi_engine_release(e, q.lease));
  oi_host_stats after = etu_host_stats(host);
  CHECK(after.leases_active == before.leases_active);
  CHECK(after.blocks_leased == before.blocks_leased);
  CHECK(after.leases_released == before.leases_released + 1);
  CHECK_FAILS(oi_engine_release(e, q.lease), OI_ERR_LEASE_EXPIRED);
  int64_t dst[2] = {20, 21};
  CHECK_FAILS(oi_engine_load(e, q.lease, dst, 2, NULL, NULL), OI_ERR_LEASE_EXPIRED);
  CHECK(all_zero(dst, 2));
  /* A partly consumed lease can still be released, once. */
  CHECK_OK(etu_query(e, NULL, hs, 2, &q));
  CHECK_OK(etu_load_wait(e, q.lease, dst, 2));
  CHECK_OK(oi_engine_release(e, q.lease));
  CHECK_FAILS(oi_engine_release(e, q.lease), OI_ERR_LEASE_EXPIRED);
  zero_blocks(&L, dst, 2);
  /* A lease nobody issued. */
  oi_lease forged;
  for (int i = 0; i < 16; i++)
    forged.bytes[i] = (uint8_t)(0x5A + 7 * i);
  CHECK_FAILS(oi_engine_load(e, forged, dst, 2, NULL, NULL), OI_ERR_LEASE_EXPIRED);
  CHECK_FAILS(oi_engine_release(e, forged), OI_ERR_LEASE_EXPIRED);
  /* The all-zero "no lease" is refused too (either code is a clear answer). */
  oi_lease none;
  memset(&none, 0, sizeof none);
  oi_clear_error();
  oi_status st = oi_engine_load(e, none, dst, 2, NULL, NULL);
  CHECK(st == OI_ERR_LEASE_EXPIRED || st == OI_ERR_INVALID_ARGUMENT);
  CHECK(strlen(oi_last_error()) > 0);
  CHECK(all_zero(dst, 2));
  oi_engine_destroy(e);
}

static void test_count_mismatch_is_rejected_before_any_copy(void) {
  oi_engine *e = etu_engine_create(host, &L, "prefix", 1);
  oi_block_hash hs[3];
  oi_query_result q;
  uint64_t space = save_and_lease(e, hs, 3, &q);
  /* Destinations hold a sentinel the load must not touch. */
  int64_t dst[4] = {20, 21, 22, 23};
  for (int i = 0; i < 4; i++)
    etu_fill_block(&L, dst[i], 999, SEED);
  CHECK_FAILS(oi_engine_load(e, q.lease, dst, 2, NULL, NULL), OI_ERR_INVALID_ARGUMENT);
  CHECK_FAILS(oi_engine_load(e, q.lease, dst, 4, NULL, NULL), OI_ERR_INVALID_ARGUMENT);
  for (int i = 0; i < 4; i++)
    CHECK(etu_block_matches(&L, dst[i], 999, SEED, "untouched"));
  /* The share was not consumed by the rejected calls. */
  CHECK_OK(etu_load_wait(e, q.lease, dst, 3));
  CHECK(loaded(&L, dst, 3, space, "after mismatch"));
  CHECK(etu_block_matches(&L, 23, 999, SEED, "not a destination"));
  zero_blocks(&L, dst, 4);
  oi_engine_destroy(e);
}

static void test_leased_blocks_are_pinned_until_released(void) {
  oi_engine *e = etu_engine_create(host, &L, "prefix", 1);
  oi_query_result q;
  oi_block_hash hs[3];
  uint64_t space = save_and_lease(e, hs, 3, &q);
  uint64_t evicted = 12345;
  CHECK_OK(oi_host_evict_all(host, &evicted));
  oi_host_stats s = etu_host_stats(host);
  CHECK(s.blocks_sealed == 3 && s.blocks_leased == 3);
  uint8_t present[3];
  CHECK(etu_membership(e, hs, 3, present) == 3);
  int64_t dst[3] = {22, 20, 21};
  CHECK_OK(etu_load_wait(e, q.lease, dst, 3));
  CHECK(loaded(&L, dst, 3, space, "pinned"));
  CHECK_OK(oi_host_evict_all(host, &evicted));
  CHECK(evicted == 3);
  CHECK(etu_host_stats(host).blocks_sealed == 0);
  CHECK(etu_membership(e, hs, 3, present) == 0);
  zero_blocks(&L, dst, 3);
  oi_engine_destroy(e);
}

static void test_ttl_expiry_frees_the_pins(void) {
  oi_host *h = etu_host_create_opts(16 << 20, 0, 100);
  oi_engine *e = etu_engine_create(h, &L, "ttl", 1);
  oi_block_hash hs[3];
  uint64_t space = save_new(e, hs, 3, 0x7);

  /* Within the TTL a lease works. */
  oi_query_result q;
  CHECK_OK(etu_query(e, NULL, hs, 3, &q));
  int64_t dst[3] = {20, 21, 22};
  CHECK_OK(etu_load_wait(e, q.lease, dst, 3));
  CHECK(loaded(&L, dst, 3, space, "ttl"));
  zero_blocks(&L, dst, 3);

  CHECK_OK(etu_query(e, NULL, hs, 3, &q));
  CHECK(q.hit_blocks == 3);
  uint64_t evicted = 99;
  CHECK_OK(oi_host_evict_all(h, &evicted));
  CHECK(evicted == 0); /* pinned */
  double t0 = etu_now_s();
  evicted = 0;
  while (etu_now_s() - t0 < 5.0) {
    etu_sleep_ms(50);
    CHECK_OK(oi_host_evict_all(h, &evicted));
    if (evicted) break;
  }
  double waited = etu_now_s() - t0;
  CHECK(evicted == 3);
  CHECK(waited >= 0.05);
  oi_host_stats s = etu_host_stats(h);
  CHECK(s.leases_expired == 1);
  CHECK(s.leases_active == 0);
  CHECK(s.blocks_leased == 0);
  CHECK(s.blocks_sealed == 0);
  CHECK_FAILS(oi_engine_load(e, q.lease, dst, 3, NULL, NULL), OI_ERR_LEASE_EXPIRED);
  CHECK(all_zero(dst, 3));
  CHECK_FAILS(oi_engine_release(e, q.lease), OI_ERR_LEASE_EXPIRED);

  /* An expired lease whose blocks were never evicted also fails to load. */
  save_mask(e, space, hs, 3, 0x7);
  CHECK_OK(etu_query(e, NULL, hs, 3, &q));
  CHECK(q.hit_blocks == 3);
  etu_sleep_ms(400);
  CHECK_FAILS(oi_engine_load(e, q.lease, dst, 3, NULL, NULL), OI_ERR_LEASE_EXPIRED);
  CHECK(all_zero(dst, 3));
  s = etu_host_stats(h);
  CHECK(s.leases_expired == 2);
  CHECK(s.leases_active == 0);
  oi_engine_destroy(e);
  oi_host_destroy(h);
}

static void test_destroying_an_engine_releases_its_leases(void) {
  oi_engine *e = etu_engine_create(host, &L, "prefix", 4);
  oi_block_hash hs[2];
  save_new(e, hs, 2, 0x3);
  uint64_t active = leases_active();
  oi_query_result q;
  CHECK_OK(etu_query(e, NULL, hs, 2, &q));
  CHECK_OK(etu_query(e, NULL, hs, 1, &q));
  CHECK(leases_active() == active + 2);
  oi_engine_destroy(e);
  CHECK(leases_active() == active);
  uint64_t evicted = 0;
  CHECK_OK(oi_host_evict_all(host, &evicted));
  CHECK(etu_host_stats(host).blocks_leased == 0);
  CHECK(etu_host_stats(host).blocks_sealed == 0);
}

int main(void) {
  etu_layout_simple(&L, 3, NB, 1536);
  host = etu_host_create(16 << 20);
  RUN_TEST(test_partial_prefix_hits_the_leading_run);
  RUN_TEST(test_a_gap_breaks_the_prefix);
  RUN_TEST(test_first_block_missing_means_no_hit_and_no_lease);
  RUN_TEST(test_empty_query_hits_nothing_and_makes_no_lease);
  RUN_TEST(test_membership_reports_each_position);
  RUN_TEST(test_a_miss_does_not_poison_a_later_hit_for_the_same_req_id);
  RUN_TEST(test_a_lease_serves_exactly_world_size_loads);
  RUN_TEST(test_a_lease_is_shared_in_its_namespace);
  RUN_TEST(test_released_and_unknown_leases_fail_with_lease_expired);
  RUN_TEST(test_count_mismatch_is_rejected_before_any_copy);
  /* Uses evict_all on the shared host: every block of earlier tests goes. */
  RUN_TEST(test_leased_blocks_are_pinned_until_released);
  RUN_TEST(test_ttl_expiry_frees_the_pins);
  RUN_TEST(test_destroying_an_engine_releases_its_leases);
  oi_host_destroy(host);
  etu_layout_free(&L);
  TEST_EXIT();
}
