/* Pending answers (issue 18, item 7): while a save is in flight (held by the
 * copy_slow fault), another engine's query, a host lookup and a sidecar
 * lookup client report its blocks as pending, right after the hit prefix,
 * without leasing them; OI_QUERY_WAIT_PENDING waits for them to seal (then
 * they are hits, loaded byte-exact) or, past wait_ms, leaves them pending. */
#include "fault_util.h"
#include "sidecar_util.h"

static double now_s(void) { return (double)oi__now_ns() / 1e9; }

static oi_query_result fresh(uint32_t wait_ms, uint8_t *present) {
  oi_query_result q;
  memset(&q, 0, sizeof q);
  q.struct_size = sizeof q;
  q.wait_ms = wait_ms;
  q.present = present;
  return q;
}

static void test_embedded_pending_and_wait(void) {
  rig r;
  rig_open(&r, 32, 4096, 32, 1, 0, 0, 0);
  /* A second engine of the namespace, over its own memory. */
  uint8_t *arena2 = calloc(32, 4096);
  REQUIRE(arena2);
  oi_engine *e2 = fu_rig_engine(&r, arena2);
  rig peek = r; /* fu_check on the second arena */
  peek.arena = arena2;

  CHECK_OK(rig_save(&r, 0, 4)); /* 0..3 sealed */
  oi_block_hash hs[10];
  int64_t ids[4] = {4, 5, 6, 7};
  for (int i = 0; i < 10; i++)
    hs[i] = fu_hash((uint64_t)i);
  for (int i = 0; i < 4; i++)
    fu_fill(&r, ids[i], 4 + (uint64_t)i);
  REQUIRE(oi__fault_arm(OI_FAULT_COPY_SLOW, 0, 1, 1500) == OI_OK);
  oi_ticket *t = NULL;
  CHECK_OK(oi_engine_save(r.e, ids, &hs[4], 4, NULL, &t)); /* 4..7 in flight */

  /* No flag: pending blocks are a miss, reported, not leased. */
  double t0 = now_s();
  oi_query_result q = fresh(0, NULL);
  CHECK_OK(oi_engine_query(e2, NULL, hs, 10, 0, &q));
  CHECK(q.hit_blocks == 4 && q.pending_blocks == 4);
  oi_host_stats hs0 = rig_stats(&r);
  CHECK(hs0.blocks_in_flight == 4 && hs0.blocks_leased == 4);
  CHECK_OK(oi_engine_release(e2, q.lease));
  /* Membership counts the positions in flight. */
  uint8_t present[10];
  q = fresh(0, present);
  CHECK_OK(oi_engine_query(e2, NULL, hs, 10, OI_QUERY_MEMBERSHIP, &q));
  CHECK(q.hit_blocks == 4 && q.pending_blocks == 4 && present[3] == 1 && present[4] == 0);
  /* A lookup without a layout sees the same. */
  oi_lookup_options lo;
  oi_lookup_options_init(&lo);
  lo.lookup_deadline_ms = 10000; /* (not the breaker's test: slow machines) */
  lo.namespace_id = "fault";
  q = fresh(0, NULL);
  CHECK_OK(oi_host_query(r.h, &lo, NULL, hs, 10, 0, &q));
  CHECK(q.hit_blocks == 4 && q.pending_blocks == 4);
  CHECK_OK(oi_host_release(r.h, "fault", q.lease));
  /* A short wait runs out: still pending. */
  q = fresh(50, NULL);
  double tw = now_s();
  CHECK_OK(oi_engine_query(e2, NULL, hs, 10, OI_QUERY_WAIT_PENDING, &q));
  CHECK(now_s() - tw >= 0.045);
  CHECK(q.hit_blocks == 4 && q.pending_blocks == 4);
  CHECK_OK(oi_engine_release(e2, q.lease));
  CHECK(now_s() - t0 < 1.2); /* all of the above ran while the save was in flight */
  /* A long wait ends when the save seals: the blocks are hits now. */
  q = fresh(10000, NULL);
  CHECK_OK(oi_engine_query(e2, NULL, hs, 10, OI_QUERY_WAIT_PENDING, &q));
  CHECK(q.hit_blocks == 8 && q.pending_blocks == 0);
  CHECK(now_s() - t0 < 5.0);
  CHECK_OK(oi_ticket_wait(t, 10000));
  oi_ticket_release(t);
  int64_t dst[8] = {20, 21, 22, 23, 24, 25, 26, 27};
  CHECK_OK(tr_load(e2, q.lease, dst, 8, 10000));
  for (int i = 0; i < 8; i++)
    CHECK(fu_check(&peek, dst[i], (uint64_t)i));
  /* A failed save leaves nothing pending and a waiting query returns. */
  REQUIRE(oi__fault_arm(OI_FAULT_COPY_FAIL, 0, 1, 0) == OI_OK);
  int64_t id9 = 9;
  fu_fill(&r, 9, 8);
  CHECK_OK(oi_engine_save(r.e, &id9, &hs[8], 1, NULL, &t));
  CHECK(oi_ticket_wait(t, 10000) != OI_OK);
  oi_ticket_release(t);
  q = fresh(2000, NULL);
  CHECK_OK(oi_engine_query(e2, NULL, hs, 10, OI_QUERY_WAIT_PENDING, &q));
  CHECK(q.hit_blocks == 8 && q.pending_blocks == 0);
  CHECK_OK(oi_engine_release(e2, q.lease));
  oi_engine_destroy(e2);
  free(arena2);
  rig_close(&r);
}

static test_server ts;

/* The server's copies sleep 1 s each: a save stays in flight. */
static void test_sidecar_pending_and_wait(void) {
  TL_CLIENT(a, o, e, arena);
  uint8_t *base = tl_connect(ts.socket, "pending", a, &o, &e, &arena);
  int64_t ids[4] = {0, 1, 2, 3};
  oi_block_hash hs[5];
  for (int i = 0; i < 5; i++)
    hs[i] = tl_hash(3, (uint64_t)i);
  for (int i = 0; i < 4; i++)
    tl_fill(base, a, ids[i], (uint64_t)i);
  oi_save_result sr = {.struct_size = sizeof sr};
  oi_save_options so;
  oi_save_options_init(&so);
  so.result = &sr;
  oi_ticket *t = NULL;
  double t0 = now_s();
  CHECK_OK(oi_engine_save(e, ids, hs, 4, &so, &t));
  CHECK(sr.accepted == 4 && sr.deduplicated == 0 && sr.dropped == 0);
  CHECK(now_s() - t0 < 0.8); /* the counts came before the copy ended */

  oi_lookup_options lo;
  oi_lookup_options_init(&lo);
  lo.lookup_deadline_ms = 10000; /* (not the breaker's test: slow machines) */
  lo.namespace_id = "pending";
  oi_lookup *c = NULL;
  CHECK_OK(oi_lookup_connect(ts.socket, &lo, &c));
  REQUIRE(c);
  oi_query_result q = fresh(0, NULL);
  CHECK_OK(oi_lookup_query(c, NULL, hs, 5, 0, &q));
  CHECK(q.hit_blocks == 0 && q.pending_blocks == 4);
  CHECK(now_s() - t0 < 0.9); /* answered while the save was in flight */
  q = fresh(10000, NULL);
  CHECK_OK(oi_lookup_query(c, NULL, hs, 5, OI_QUERY_WAIT_PENDING, &q));
  CHECK(q.hit_blocks == 4 && q.pending_blocks == 0);
  CHECK_OK(oi_ticket_wait(t, 10000));
  oi_ticket_release(t);
  /* A worker session loads the lookup's lease byte-exact. */
  TL_CLIENT(a2, o2, w, warena);
  uint8_t *wbase = tl_connect(ts.socket, "pending", a2, &o2, &w, &warena);
  int64_t dst[4] = {10, 11, 12, 13};
  CHECK_OK(tr_load(w, q.lease, dst, 4, 10000));
  for (int i = 0; i < 4; i++)
    CHECK(tl_check(wbase, a2, dst[i], (uint64_t)i));
  /* The engine's own query carries pending_blocks and wait_ms too. */
  tl_fill(base, a, 4, 4);
  int64_t id4 = 4;
  /* (with the result, save returns once the server reserved the block, so
   * the other session's query comes after it) */
  CHECK_OK(oi_engine_save(e, &id4, &hs[4], 1, &so, &t));
  CHECK(sr.accepted == 1);
  q = fresh(0, NULL);
  CHECK_OK(oi_engine_query(w, NULL, hs, 5, 0, &q));
  CHECK(q.hit_blocks == 4 && q.pending_blocks == 1);
  CHECK_OK(oi_engine_release(w, q.lease));
  q = fresh(10000, NULL);
  CHECK_OK(oi_engine_query(w, NULL, hs, 5, OI_QUERY_WAIT_PENDING, &q));
  CHECK(q.hit_blocks == 5 && q.pending_blocks == 0);
  CHECK_OK(oi_engine_release(w, q.lease));
  CHECK_OK(oi_ticket_wait(t, 10000));
  oi_ticket_release(t);
  oi_lookup_destroy(c);
  oi_imported_arena_close(warena);
  oi_engine_destroy(w);
  oi_imported_arena_close(arena);
  oi_engine_destroy(e);
}

int main(int argc, char **argv) {
  REQUIRE_FAULTS();
  RUN_TEST(test_embedded_pending_and_wait);
  if (argc < 2) TEST_SKIP("usage: test_pending_fault OPENINFER_EXE (sidecar part)");
  ts_init(&ts, argv[1]);
  setenv("OI_FAULTS", "copy_slow:0:0:1000", 1);
  REQUIRE(ts_start(&ts, NULL));
  unsetenv("OI_FAULTS");
  RUN_TEST(test_sidecar_pending_and_wait);
  CHECK(ts_stop(&ts));
  if (oi_test_failures) ts_dump_log(&ts);
  ts_cleanup(&ts);
  TEST_EXIT();
}
