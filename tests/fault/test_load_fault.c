/* A failed load consumes its lease share and reports the error, never
 * success: a copy failing before any byte or midway, with one share and with
 * two. The blocks stay sealed, unpinned and loadable. A clock that jumps past
 * the lease TTL expires leases (the load fails, the pins go). Per-arena
 * progress of a layered load, embedded and over the sidecar. */
#include <pthread.h>

#include "fault_util.h"
#include "sidecar_util.h"

static void failing_load_consumes_the_lease(oi_fault_point point) {
  rig r;
  oi_lease l = rig_open_leased(&r, 16, 4096, 32, 0, 0, 6);
  REQUIRE(oi__fault_arm(point, 0, 1, 0) == OI_OK);
  CHECK_ST(rig_load(&r, l, 8, 6), OI_ERR_IO);
  CHECK(oi__fault_fired(point) == 1);
  CHECK_ST(rig_load(&r, l, 8, 6), OI_ERR_LEASE_EXPIRED); /* consumed */
  CHECK_ST(oi_engine_release(r.e, l), OI_ERR_LEASE_EXPIRED);
  oi_host_stats s = rig_stats(&r);
  CHECK(s.loads_failed >= 1 && s.loads_completed == 0);
  CHECK(s.blocks_leased == 0 && s.leases_active == 0 && s.blocks_sealed == 6);
  rig_check_quiet(&r);
  /* Still sealed and byte-exact. */
  CHECK(rig_query(&r, 0, 6, &l) == 6);
  CHECK_OK(rig_load(&r, l, 8, 6));
  for (int i = 0; i < 6; i++)
    CHECK(fu_check(&r, 8 + i, (uint64_t)i));
  rig_close(&r);
}

static void test_load_copy_fails_before_any_byte(void) {
  failing_load_consumes_the_lease(OI_FAULT_COPY_FAIL);
}
static void test_load_copy_fails_midway(void) {
  failing_load_consumes_the_lease(OI_FAULT_COPY_PARTIAL);
}

static void test_two_shares_one_fails(void) {
  rig r;
  oi_lease l = rig_open_leased(&r, 16, 4096, 32, 2, 50, 4);
  REQUIRE(oi__fault_arm(OI_FAULT_COPY_FAIL, 0, 1, 0) == OI_OK);
  CHECK_ST(rig_load(&r, l, 4, 4), OI_ERR_IO); /* share 1: failed, consumed */
  CHECK_OK(rig_load(&r, l, 8, 4));            /* share 2 */
  for (int i = 0; i < 4; i++)
    CHECK(fu_check(&r, 8 + i, 50 + (uint64_t)i));
  CHECK_ST(rig_load(&r, l, 12, 4), OI_ERR_LEASE_EXPIRED);
  rig_check_quiet(&r);
  CHECK(rig_stats(&r).blocks_leased == 0);
  rig_close(&r);
}

static void test_clock_jump_expires_leases(void) {
  rig r;
  rig_open(&r, 16, 4096, 32, 0, 0, 0, 60000);
  CHECK_OK(rig_save(&r, 0, 4));
  oi_lease used, idle;
  CHECK(rig_query(&r, 0, 4, &used) == 4);
  CHECK(rig_query(&r, 0, 2, &idle) == 2);
  CHECK(rig_stats(&r).blocks_leased == 4);
  REQUIRE(oi__fault_arm(OI_FAULT_CLOCK_JUMP, 0, 1, 120000) == OI_OK); /* 2 minutes, once */
  CHECK_ST(rig_load(&r, used, 8, 4), OI_ERR_LEASE_EXPIRED);
  CHECK(oi__fault_fired(OI_FAULT_CLOCK_JUMP) == 1);
  /* The maintenance thread expires the idle one and frees the pins (the
   * lease is unlinked, then counted expired and its pins dropped). */
  oi_host_stats s;
  for (int i = 0; i < 500; i++) {
    s = rig_stats(&r);
    if (s.leases_active == 0 && s.leases_expired == 2 && s.blocks_leased == 0) break;
    usleep(10000);
  }
  CHECK(s.leases_active == 0 && s.leases_expired == 2 && s.blocks_leased == 0);
  CHECK_ST(oi_engine_release(r.e, idle), OI_ERR_LEASE_EXPIRED);
  uint64_t evicted = 0;
  CHECK_OK(oi_host_evict_all(r.h, &evicted)); /* unpinned: evictable again */
  CHECK(evicted == 4);
  rig_check_quiet(&r);
  rig_close(&r);
}

/* Marking a load's blocks runs outside the lease lock (lib/host/lease.c). A
 * share of a two-share lease, paused while it marks (load_mark_gap: 300 ms
 * after its first run of 1,024 of 1,100 blocks), is met by a release of
 * the lease (first round) or by the lease's last share (second round): each
 * waits for the marker before it unpins or frees the lease. Every load
 * comes back byte-exact, and nothing stays leased, pinned or loading. */
typedef struct marker {
  rig *r;
  oi_lease l;
  int64_t dst0;
  size_t n;
  oi_status st;
} marker;

static void *marker_main(void *arg) {
  marker *m = arg;
  m->st = rig_load(m->r, m->l, m->dst0, m->n);
  return NULL;
}

static void test_a_release_and_the_last_share_wait_for_a_share_still_marking(void) {
  enum { N = 1100 };
  for (int round = 0; round < 2; round++) {
    rig r;
    oi_lease l = rig_open_leased(&r, 3 * N, 512, N + 8, 2, 0, N);
    REQUIRE(oi__fault_arm(OI_FAULT_LOAD_MARK_GAP, 0, 1, 300) == OI_OK);
    marker m = {.r = &r, .l = l, .dst0 = N, .n = N};
    pthread_t th;
    REQUIRE(pthread_create(&th, NULL, marker_main, &m) == 0);
    for (int i = 0; i < 5000 && oi__fault_fired(OI_FAULT_LOAD_MARK_GAP) == 0; i++)
      usleep(1000);
    REQUIRE(oi__fault_fired(OI_FAULT_LOAD_MARK_GAP) == 1); /* paused after its first run */
    uint64_t t0 = oi__now_ns();
    if (round == 0)
      CHECK_OK(oi_engine_release(r.e, l));
    else
      CHECK_OK(rig_load(&r, l, 2 * N, N)); /* the last share */
    double waited_ms = (double)(oi__now_ns() - t0) / 1e6;
    pthread_join(th, NULL);
    CHECK(waited_ms >= 100); /* it waited for the paused share */
    CHECK_OK(m.st);
    bool all = true;
    for (uint64_t i = 0; i < N; i++)
      all &= fu_check(&r, N + (int64_t)i, i) && (round == 0 || fu_check(&r, 2 * N + (int64_t)i, i));
    CHECK(all);
    oi__fault_disarm_all();
    oi_host_stats s = rig_stats(&r);
    CHECK(s.blocks_leased == 0 && s.leases_active == 0 && s.blocks_pinned == 0 &&
          s.blocks_loading == 0);
    rig_check_quiet(&r);
    uint64_t evicted = 0;
    CHECK_OK(oi_host_evict_all(r.h, &evicted));
    CHECK(evicted == N);
    rig_close(&r);
  }
}

/* Per-arena completion (oi_ticket_arena_wait) on the cpu backend: every copy
 * is slowed down (copy_slow), so each arena's wait returns while the later
 * arenas are still moving, with that arena's bytes in place; the copy of
 * arena 2 fails (copy_fail): the waits of arena 2 and 3 and the ticket get
 * the error, and once the load failed every wait (arena 0 included) does. */
#define AW_ARENAS 4
#define AW_BLOCKS 8
#define AW_BYTES 4096

static uint8_t aw_byte(uint32_t a, uint64_t logical, uint64_t i) {
  return (uint8_t)(fu_byte(logical, i) ^ (a * 37 + 1));
}

static void test_arena_waits_report_progress_and_a_failure_fails_every_later_wait(void) {
  oi_host_options ho = tr_host_options(16 << 20);
  oi_host *h = tr_host_new(&ho);
  uint8_t *mem = calloc(AW_ARENAS, AW_BLOCKS * AW_BYTES);
  REQUIRE(mem);
  oi_arena_desc ad[AW_ARENAS];
  const char *names[AW_ARENAS] = {"l0", "l1", "l2", "l3"};
  for (uint32_t a = 0; a < AW_ARENAS; a++)
    ad[a] = tr_arena(names[a], mem + (uint64_t)a * AW_BLOCKS * AW_BYTES, AW_BLOCKS, AW_BYTES);
  oi_engine_options eo = tr_engine_options("arena-wait", ad, AW_ARENAS);
  oi_engine *e = tr_engine_new(h, &eo);
  int64_t src[2] = {0, 1}, dst[2] = {6, 7};
  oi_block_hash hs[2] = {fu_hash(900), fu_hash(901)};
  for (uint32_t a = 0; a < AW_ARENAS; a++)
    for (int b = 0; b < 2; b++)
      for (uint64_t i = 0; i < AW_BYTES; i++)
        ((uint8_t *)ad[a].base)[(uint64_t)src[b] * AW_BYTES + i] = aw_byte(a, (uint64_t)b, i);
  oi_ticket *t;
  CHECK_OK(tr_save(e, src, hs, 2, 60000));
  oi_load_options lo;
  oi_load_options_init(&lo);
  lo.flags = OI_LOAD_ARENA_EVENTS;
  for (int fail = 0; fail < 2; fail++) {
    oi_query_result q = {.struct_size = sizeof q};
    CHECK_OK(oi_engine_query(e, NULL, hs, 2, 0, &q));
    REQUIRE(q.hit_blocks == 2);
    REQUIRE(oi__fault_arm(OI_FAULT_COPY_SLOW, 0, 0, 150) == OI_OK);         /* each arena: 150 ms */
    if (fail) REQUIRE(oi__fault_arm(OI_FAULT_COPY_FAIL, 2, 1, 0) == OI_OK); /* arena 2 */
    CHECK_OK(oi_engine_load(e, q.lease, dst, 2, &lo, &t));
    REQUIRE(t);
    for (uint32_t a = 0; a < 2; a++) {
      CHECK_OK(oi_ticket_arena_wait(t, a, 60000));
      CHECK(oi_ticket_poll(t) == OI_PENDING); /* the later arenas are still moving */
      CHECK(oi_ticket_arena_poll(t, AW_ARENAS - 1) == OI_PENDING);
      bool ok = true;
      for (int b = 0; b < 2; b++)
        for (uint64_t i = 0; i < AW_BYTES; i++)
          ok &= ((uint8_t *)ad[a].base)[(uint64_t)dst[b] * AW_BYTES + i] ==
                aw_byte(a, (uint64_t)b, i);
      CHECK(ok);
    }
    if (!fail) {
      for (uint32_t a = 2; a < AW_ARENAS; a++)
        CHECK_OK(oi_ticket_arena_wait(t, a, 60000));
      CHECK_OK(oi_ticket_wait(t, 60000));
      CHECK_OK(oi_ticket_arena_poll(t, 0));
    } else {
      CHECK_ST(oi_ticket_arena_wait(t, 2, 60000), OI_ERR_IO);
      CHECK_ST(oi_ticket_arena_wait(t, 3, 60000), OI_ERR_IO);
      CHECK_ST(oi_ticket_wait(t, 60000), OI_ERR_IO);
      CHECK_ST(oi_ticket_arena_wait(t, 0, 0), OI_ERR_IO); /* the load failed: every wait */
      CHECK_ST(oi_ticket_arena_poll(t, 1), OI_ERR_IO);
    }
    oi_ticket_release(t);
    oi__fault_disarm_all();
  }
  oi_engine_destroy(e);
  oi_host_destroy(h);
  free(mem);
}

/* The same over the sidecar: a server whose copies are slowed (copy_slow,
 * armed through OI_FAULTS) reports a layered load arena by arena
 * (LoadProgress frames), so the client's arena waits return while the later
 * arenas are still moving, each with that arena's bytes in place. */
static test_server ts;

static bool tl_check_arena(const uint8_t *base, const oi_arena_desc *a, uint32_t ar, int64_t id,
                           uint64_t logical) {
  for (uint32_t s = 0; s < a[ar].segments; s++) {
    const uint8_t *p =
        base + a[ar].offset + (uint64_t)id * a[ar].block_stride + s * a[ar].segment_stride;
    for (uint64_t i = 0; i < a[ar].bytes_per_block; i++)
      if (p[i] != tl_byte(logical, ar, s, i)) return false;
  }
  return true;
}

static void test_sidecar_arena_waits_report_progress(void) {
  TL_CLIENT(a, o, e, arena);
  uint8_t *base = tl_connect(ts.socket, "layered", a, &o, &e, &arena);
  int64_t src[2], dst[2] = {20, 21};
  oi_block_hash hs[2];
  tl_fill_n(base, a, 70, src, hs, 2);
  oi_ticket *t;
  CHECK_OK(tr_save(e, src, hs, 2, 60000));
  oi_query_result q = {.struct_size = sizeof q};
  CHECK_OK(oi_engine_query(e, NULL, hs, 2, 0, &q));
  REQUIRE(q.hit_blocks == 2);
  oi_load_options lo;
  oi_load_options_init(&lo);
  lo.flags = OI_LOAD_ARENA_EVENTS;
  CHECK_OK(oi_engine_load(e, q.lease, dst, 2, &lo, &t));
  REQUIRE(t);
  CHECK(oi_ticket_arena_event(t, 0) == NULL); /* events live in the server's process */
  for (uint32_t ar = 0; ar + 1 < TL_ARENAS; ar++) {
    CHECK_OK(oi_ticket_arena_wait(t, ar, 60000));
    CHECK(oi_ticket_poll(t) == OI_PENDING); /* the later arenas are still moving */
    CHECK(oi_ticket_arena_poll(t, TL_ARENAS - 1) == OI_PENDING);
    for (int b = 0; b < 2; b++)
      CHECK(tl_check_arena(base, a, ar, dst[b], (uint64_t)b));
  }
  CHECK_ST(oi_ticket_arena_wait(t, TL_ARENAS, 0), OI_ERR_INVALID_ARGUMENT);
  CHECK_OK(oi_ticket_arena_wait(t, TL_ARENAS - 1, 60000));
  CHECK_OK(oi_ticket_wait(t, 60000));
  for (int b = 0; b < 2; b++)
    CHECK(tl_check(base, a, dst[b], (uint64_t)b));
  oi_ticket_release(t);
  /* Without the flag: no per-arena progress, an arena wait waits for all. */
  CHECK_OK(oi_engine_query(e, NULL, hs, 2, 0, &q));
  REQUIRE(q.hit_blocks == 2);
  CHECK_OK(oi_engine_load(e, q.lease, dst, 2, NULL, &t));
  CHECK_OK(oi_ticket_arena_wait(t, 0, 60000));
  CHECK(oi_ticket_poll(t) == OI_OK);
  oi_ticket_release(t);
  oi_imported_arena_close(arena);
  oi_engine_destroy(e);
}

int main(int argc, char **argv) {
  REQUIRE_FAULTS();
  RUN_TEST(test_load_copy_fails_before_any_byte);
  RUN_TEST(test_load_copy_fails_midway);
  RUN_TEST(test_two_shares_one_fails);
  RUN_TEST(test_clock_jump_expires_leases);
  RUN_TEST(test_a_release_and_the_last_share_wait_for_a_share_still_marking);
  RUN_TEST(test_arena_waits_report_progress_and_a_failure_fails_every_later_wait);
  if (argc < 2) TEST_SKIP("usage: test_load_fault OPENINFER_EXE (sidecar part)");
  ts_init(&ts, argv[1]);
  setenv("OI_FAULTS", "copy_slow:0:0:150", 1); /* the server's every copy: 150 ms */
  REQUIRE(ts_start(&ts, NULL));
  unsetenv("OI_FAULTS");
  RUN_TEST(test_sidecar_arena_waits_report_progress);
  CHECK(ts_stop(&ts));
  TEST_EXIT();
}
