/* Failures at submit time (copy_submit, completion_submit: queuing a group
 * of copies or a job's completion fails inside the save or load call, not
 * later in the copy worker). The call fails with the error and hands back
 * no ticket (its on_done never runs); what was queued before drains; the
 * saved slots are aborted (nothing partial is ever visible), a load's lease
 * is consumed and its blocks unpinned; the engine keeps working. Also: a
 * flush that times out on a duplicate another engine is still saving, and a
 * lease whose id matches a live one but whose tag does not. */
#include <pthread.h>

#include "fault_util.h"

static atomic_int on_done_calls;
static void on_done(void *ctx, oi_status st) {
  (void)ctx;
  (void)st;
  atomic_fetch_add(&on_done_calls, 1);
}

/* A save of 12 blocks in groups of about 4; `point` fires on hit `after`. */
static void save_fails_at_submit(oi_fault_point point, uint64_t after) {
  rig_submit_group_bytes = 1 << 20; /* 256 KiB blocks: several groups */
  rig r;
  rig_open(&r, 24, 256 << 10, 32, 0, 0, 0, 0);
  rig_submit_group_bytes = 0;
  CHECK_OK(rig_save(&r, 500, 2)); /* sealed before the fault */
  int64_t ids[12];
  oi_block_hash hs[12];
  fu_stage(&r, ids, hs, 12, 12, 100);
  atomic_store(&on_done_calls, 0);
  oi_save_options so;
  oi_save_options_init(&so);
  so.on_done = on_done;
  oi_ticket *t = (oi_ticket *)&r; /* not NULL: the call must clear it */
  REQUIRE(oi__fault_arm(point, after, 1, 0) == OI_OK);
  CHECK_ST(oi_engine_save(r.e, ids, hs, 12, &so, &t), OI_ERR_IO);
  CHECK(t == NULL);
  CHECK(strstr(oi_last_error(), "save") && strstr(oi_last_error(), "injected"));
  CHECK(oi__fault_fired(point) == 1);
  oi__fault_disarm_all();
  CHECK(atomic_load(&on_done_calls) == 0);
  /* Nothing partial: not even the groups queued before the failure. */
  CHECK_OK(oi_engine_flush(r.e, 10000));
  CHECK(rig_visible(&r, 100, 12) == 0);
  CHECK(rig_visible(&r, 500, 2) == 2);
  oi_host_stats s = rig_stats(&r);
  CHECK(s.saves_failed == 12 && s.blocks_sealed == 2 && s.blocks_in_flight == 0);
  rig_check_quiet(&r);
  oi_engine_stats es = {.struct_size = sizeof es};
  CHECK_OK(oi_engine_get_stats(r.e, &es));
  CHECK(es.saves_failed == 12 && es.saves_pending == 0);
  /* The engine keeps working: the same hashes save and load byte-exact. */
  CHECK_OK(tr_save(r.e, ids, hs, 12, 60000));
  rig_check_reload(&r, 100, 12);
  rig_check_quiet(&r);
  rig_close(&r);
}

static void test_save_copy_submit_fails_on_the_first_group(void) {
  save_fails_at_submit(OI_FAULT_COPY_SUBMIT, 0);
}
static void test_save_copy_submit_fails_after_a_group_was_queued(void) {
  save_fails_at_submit(OI_FAULT_COPY_SUBMIT, 1);
}
static void test_save_completion_submit_fails(void) {
  save_fails_at_submit(OI_FAULT_COMPLETION_SUBMIT, 0);
}

/* A load whose submit fails: the lease is consumed, nothing stays pinned or
 * loading, the blocks stay and load again under a new lease. */
static void load_fails_at_submit(oi_fault_point point, uint32_t flags) {
  rig r;
  oi_lease l = rig_open_leased(&r, 16, 4096, 16, 0, 300, 4);
  CHECK(rig_stats(&r).blocks_leased == 4);
  memset(r.arena, 0, r.blocks * r.bytes);
  int64_t ids[4] = {8, 9, 10, 11};
  oi_load_options lo;
  oi_load_options_init(&lo);
  lo.flags = flags;
  oi_ticket *t = (oi_ticket *)&r;
  REQUIRE(oi__fault_arm(point, 0, 1, 0) == OI_OK);
  CHECK_ST(oi_engine_load(r.e, l, ids, 4, &lo, &t), OI_ERR_IO);
  CHECK(t == NULL);
  CHECK(strstr(oi_last_error(), "load") && strstr(oi_last_error(), "injected"));
  CHECK(oi__fault_fired(point) == 1);
  oi__fault_disarm_all();
  oi_host_stats s = rig_stats(&r);
  CHECK(s.blocks_loading == 0 && s.blocks_leased == 0 && s.blocks_pinned == 0);
  CHECK(s.leases_active == 0 && s.blocks_sealed == 4);
  rig_check_quiet(&r);
  oi_engine_stats es = {.struct_size = sizeof es};
  CHECK_OK(oi_engine_get_stats(r.e, &es));
  CHECK(es.loads_failed == 1 && es.loads_completed == 0);
  CHECK_ST(oi_engine_release(r.e, l), OI_ERR_LEASE_EXPIRED); /* consumed */
  CHECK(rig_query(&r, 300, 4, &l) == 4);
  CHECK_OK(rig_load(&r, l, 8, 4));
  for (int i = 0; i < 4; i++)
    CHECK(fu_check(&r, 8 + i, 300 + (uint64_t)i));
  rig_check_quiet(&r);
  rig_close(&r);
}

static void test_load_copy_submit_fails(void) { load_fails_at_submit(OI_FAULT_COPY_SUBMIT, 0); }
static void test_load_completion_submit_fails(void) {
  load_fails_at_submit(OI_FAULT_COMPLETION_SUBMIT, 0);
}
static void test_layered_load_copy_submit_fails(void) {
  load_fails_at_submit(OI_FAULT_COPY_SUBMIT, OI_LOAD_ARENA_EVENTS);
}
static void test_layered_load_completion_submit_fails(void) {
  load_fails_at_submit(OI_FAULT_COMPLETION_SUBMIT, OI_LOAD_ARENA_EVENTS);
}

/* A layer-by-layer save whose second layer fails to queue: that call fails,
 * the blocks are aborted at once, the last layer skips them, a flush ends,
 * and whole saves of the same hashes work. */
static void layer_save_fails_at_submit(oi_fault_point point) {
  layer_rig r;
  fu_layer_rig_open(&r, "layer-submit");
  int64_t ids[2] = {0, 1};
  oi_block_hash hs[2] = {fu_hash(900), fu_hash(901)};
  oi_save_options so = fu_layer_save_options();
  for (uint32_t a = 0; a < FU_LAYERS; a++) {
    so.arena_first = a;
    oi_ticket *t = NULL;
    if (a == 1) {
      REQUIRE(oi__fault_arm(point, 0, 1, 0) == OI_OK);
      CHECK_ST(oi_engine_save(r.e, ids, hs, 2, &so, &t), OI_ERR_IO);
      CHECK(t == NULL);
      CHECK(oi__fault_fired(point) == 1);
      oi__fault_disarm_all();
    } else {
      CHECK_OK(oi_engine_save(r.e, ids, hs, 2, &so, &t));
      CHECK_OK(oi_ticket_wait(t, 60000));
      oi_ticket_release(t);
    }
    fu_check_layer_in_flight(&r, a);
  }
  fu_layer_save_aborted(&r, ids, hs);
  fu_layer_rig_close(&r);
}

static void test_layer_save_copy_submit_fails(void) {
  layer_save_fails_at_submit(OI_FAULT_COPY_SUBMIT);
}
static void test_layer_save_completion_submit_fails(void) {
  layer_save_fails_at_submit(OI_FAULT_COMPLETION_SUBMIT);
}

/* Engine B deduplicates against blocks engine A is still saving (its copy
 * slowed): B's flush waits for them, and with a short timeout says so; a
 * later flush (the duplicates stay noted) ends once A's save sealed. With
 * 4 blocks, and with 100 (B's list of noted duplicates grows past its
 * first 64 entries, none forgotten). */
static void flush_waits_for_duplicates(int n) {
  rig r;
  rig_open(&r, (uint64_t)n, 4096, (uint64_t)n + 16, 0, 0, 0, 0);
  uint8_t *arena_b = calloc((size_t)n, 4096);
  REQUIRE(arena_b);
  oi_engine *b = fu_rig_engine(&r, arena_b); /* rig_open's namespace and shape */
  int64_t ids[100];
  oi_block_hash hs[100];
  REQUIRE(n <= 100);
  for (int i = 0; i < n; i++) {
    ids[i] = i;
    hs[i] = fu_hash(40 + (uint64_t)i);
    fu_fill(&r, i, 40 + (uint64_t)i);
  }
  REQUIRE(oi__fault_arm(OI_FAULT_COPY_SLOW, 0, 1, 600) == OI_OK);
  oi_ticket *ta;
  CHECK_OK(oi_engine_save(r.e, ids, hs, (size_t)n, NULL, &ta));
  oi_save_result res = {.struct_size = sizeof res};
  oi_save_options so;
  oi_save_options_init(&so);
  so.result = &res;
  oi_ticket *tb;
  CHECK_OK(oi_engine_save(b, ids, hs, (size_t)n, &so, &tb));
  CHECK(res.deduplicated == (uint64_t)n && res.accepted == 0);
  CHECK_OK(oi_ticket_wait(tb, 1000)); /* nothing of B's own to copy */
  oi_ticket_release(tb);
  CHECK(oi_ticket_poll(ta) == OI_PENDING);
  CHECK_ST(oi_engine_flush(b, 50), OI_ERR_TIMEOUT);
  CHECK(strstr(oi_last_error(), "deduplicated") && strstr(oi_last_error(), "another engine"));
  CHECK_OK(oi_engine_flush(b, 60000)); /* still noted: waits for A's seal */
  oi_host_stats hs4 = rig_stats(&r);
  CHECK(hs4.blocks_sealed == (uint64_t)n && hs4.blocks_in_flight == 0);
  CHECK_OK(oi_ticket_wait(ta, 60000));
  oi_ticket_release(ta);
  oi_engine_destroy(b);
  free(arena_b);
  rig_check_quiet(&r);
  rig_close(&r);
}

static void test_flush_times_out_on_a_duplicate_another_engine_saves(void) {
  flush_waits_for_duplicates(4);
  flush_waits_for_duplicates(100);
}

/* A lease whose id is a live lease's but whose tag is not (a stale lease
 * from another host, or a forged one) is refused with LEASE_EXPIRED and a
 * message saying so; the live lease is untouched and still loads. */
static void test_lease_with_a_live_id_and_another_tag_is_refused(void) {
  rig r;
  oi_lease l = rig_open_leased(&r, 8, 4096, 8, 0, 60, 2);
  oi_lease bad = l;
  bad.bytes[8] ^= 0x01; /* the tag's first byte */
  int64_t ids[2] = {4, 5};
  CHECK_ST(oi_engine_load(r.e, bad, ids, 2, NULL, NULL), OI_ERR_LEASE_EXPIRED);
  CHECK(strstr(oi_last_error(), "tag does not match"));
  CHECK_ST(oi_engine_release(r.e, bad), OI_ERR_LEASE_EXPIRED);
  CHECK(strstr(oi_last_error(), "release") && strstr(oi_last_error(), "stale or forged"));
  oi_lease unknown = l;
  unknown.bytes[0] ^= 0x40; /* another id */
  CHECK_ST(oi_engine_release(r.e, unknown), OI_ERR_LEASE_EXPIRED);
  CHECK(strstr(oi_last_error(), "lease unknown"));
  oi_host_stats s = rig_stats(&r);
  CHECK(s.leases_active == 1 && s.blocks_leased == 2);
  memset(r.arena, 0, r.blocks * r.bytes);
  CHECK_OK(rig_load(&r, l, 4, 2));
  CHECK(fu_check(&r, 4, 60) && fu_check(&r, 5, 61));
  rig_check_quiet(&r);
  rig_close(&r);
}

/* Creating a query's lease fails after its blocks were pinned
 * (lease_alloc): the query fails, every pin is undone (the blocks are
 * evictable again), and the next query leases them. */
static void test_a_lease_that_cannot_be_created_undoes_its_pins(void) {
  rig r;
  rig_open(&r, 8, 4096, 8, 0, 0, 0, 0);
  CHECK_OK(rig_save(&r, 80, 4));
  oi_block_hash hs[4];
  for (int i = 0; i < 4; i++)
    hs[i] = fu_hash(80 + (uint64_t)i);
  oi_query_result q = {.struct_size = sizeof q};
  REQUIRE(oi__fault_arm(OI_FAULT_LEASE_ALLOC, 0, 1, 0) == OI_OK);
  CHECK_ST(oi_engine_query(r.e, NULL, hs, 4, 0, &q), OI_ERR_OUT_OF_MEMORY);
  CHECK(strstr(oi_last_error(), "lease"));
  CHECK(oi__fault_fired(OI_FAULT_LEASE_ALLOC) == 1);
  oi_host_stats s = rig_stats(&r);
  CHECK(s.blocks_pinned == 0 && s.blocks_leased == 0 && s.leases_active == 0);
  CHECK(s.blocks_sealed == 4);
  rig_check_quiet(&r);
  oi_lease l;
  CHECK(rig_query(&r, 80, 4, &l) == 4); /* the next query leases them */
  CHECK_OK(oi_engine_release(r.e, l));
  uint64_t evicted = 0;
  CHECK_OK(oi_host_evict_all(r.h, &evicted));
  CHECK(evicted == 4); /* no pin left behind */
  rig_close(&r);
}

/* Another saver inserts the same hash while this save, evicting for a slot,
 * has its shard unlocked (reserve_gap holds it there 300 ms): this save
 * counts the block deduplicated, and since the other engine's copy is still
 * running (copy_slow), its flush waits for it like for any duplicate in
 * flight: a short flush times out, a long one returns once it sealed. */
typedef struct racer {
  oi_engine *e;
  oi_block_hash h;
  oi_save_result res;
  oi_status st;
} racer;

static void *racer_main(void *arg) {
  racer *r = arg;
  int64_t id = 7;
  oi_save_options so;
  oi_save_options_init(&so);
  r->res.struct_size = sizeof r->res;
  so.result = &r->res;
  oi_ticket *t = NULL;
  r->st = oi_engine_save(r->e, &id, &r->h, 1, &so, &t);
  if (r->st == OI_OK) {
    r->st = oi_ticket_wait(t, 60000);
    oi_ticket_release(t);
  }
  return NULL;
}

static void test_another_saver_inserts_the_same_hash_in_between(void) {
  rig r;
  rig_open(&r, 8, 4096, 8, 0, 0, 0, 0);
  CHECK_OK(rig_save(&r, 1000, 8)); /* the pool is full: the next saves evict */
  uint8_t *arena_b = calloc(8, 4096);
  REQUIRE(arena_b);
  oi_engine *b = fu_rig_engine(&r, arena_b); /* rig_open's namespace and shape */
  racer a = {.e = r.e, .h = fu_hash(2000)};
  fu_fill(&r, 7, 2000);
  REQUIRE(oi__fault_arm(OI_FAULT_RESERVE_GAP, 0, 1, 300) == OI_OK);
  pthread_t th;
  REQUIRE(pthread_create(&th, NULL, racer_main, &a) == 0);
  for (int i = 0; i < 5000 && oi__fault_fired(OI_FAULT_RESERVE_GAP) == 0; i++)
    usleep(1000);
  REQUIRE(oi__fault_fired(OI_FAULT_RESERVE_GAP) == 1); /* A is in its gap */
  REQUIRE(oi__fault_arm(OI_FAULT_COPY_SLOW, 0, 1, 800) == OI_OK);
  int64_t id = 0;
  oi_block_hash hb = fu_hash(2000);
  oi_ticket *tb;
  CHECK_OK(oi_engine_save(b, &id, &hb, 1, NULL, &tb)); /* B inserts it, copies slowly */
  pthread_join(th, NULL);
  CHECK_OK(a.st);
  CHECK(a.res.deduplicated == 1 && a.res.accepted == 0); /* A found B's block after its gap */
  CHECK(oi_ticket_poll(tb) == OI_PENDING);
  CHECK_ST(oi_engine_flush(r.e, 50), OI_ERR_TIMEOUT); /* A waits for B's copy */
  CHECK(strstr(oi_last_error(), "another engine"));
  CHECK_OK(oi_engine_flush(r.e, 60000));
  CHECK(rig_visible(&r, 2000, 1) == 1); /* sealed when the flush returned */
  CHECK(rig_stats(&r).blocks_in_flight == 0);
  CHECK_OK(oi_ticket_wait(tb, 60000));
  oi_ticket_release(tb);
  oi_engine_destroy(b);
  free(arena_b);
  rig_check_quiet(&r);
  rig_close(&r);
}

int main(void) {
  REQUIRE_FAULTS();
  RUN_TEST(test_save_copy_submit_fails_on_the_first_group);
  RUN_TEST(test_save_copy_submit_fails_after_a_group_was_queued);
  RUN_TEST(test_save_completion_submit_fails);
  RUN_TEST(test_load_copy_submit_fails);
  RUN_TEST(test_load_completion_submit_fails);
  RUN_TEST(test_layered_load_copy_submit_fails);
  RUN_TEST(test_layered_load_completion_submit_fails);
  RUN_TEST(test_layer_save_copy_submit_fails);
  RUN_TEST(test_layer_save_completion_submit_fails);
  RUN_TEST(test_flush_times_out_on_a_duplicate_another_engine_saves);
  RUN_TEST(test_lease_with_a_live_id_and_another_tag_is_refused);
  RUN_TEST(test_a_lease_that_cannot_be_created_undoes_its_pins);
  RUN_TEST(test_another_saver_inserts_the_same_hash_in_between);
  TEST_EXIT();
}
