/* Deadline hits are errors: copies slowed by the copy_slow fault outlive
 * their deadlines; the save reports OI_ERR_TIMEOUT (ticket and on_done) and
 * is never visible; the load's ticket is fencing until its copy ended, then
 * OI_ERR_DEADLINE, and no byte lands after that; its lease is spent,
 * and a flush shorter than the slow copy times out. Nothing is freed under
 * the copies that are still running: slots and loading blocks stay held
 * until they end (a reused slot would show up as wrong bytes below). */
#include "fault_util.h"

static atomic_int done_st = 1;
static void on_done(void *ctx, oi_status st) {
  (void)ctx;
  atomic_store(&done_st, st);
}

static void test_save_and_load_deadlines(void) {
  rig r;
  rig_open(&r, 16, 4096, 32, 0, 50, 50, 0);
  REQUIRE(oi__fault_arm(OI_FAULT_COPY_SLOW, 0, 1, 300) == OI_OK);
  int64_t ids[4] = {0, 1, 2, 3};
  oi_block_hash hs[4];
  for (int i = 0; i < 4; i++) {
    hs[i] = fu_hash((uint64_t)i);
    fu_fill(&r, i, (uint64_t)i);
  }
  oi_save_options so;
  oi_save_options_init(&so);
  so.on_done = on_done;
  oi_ticket *t = NULL;
  uint64_t t0 = oi__now_ns();
  CHECK_OK(oi_engine_save(r.e, ids, hs, 4, &so, &t));
  CHECK_ST(oi_ticket_wait(t, 60000), OI_ERR_TIMEOUT);
  CHECK(oi__now_ns() - t0 < 250000000ull); /* told before the copy ended */
  oi_ticket_release(t);
  CHECK(atomic_load(&done_st) == OI_ERR_TIMEOUT);
  CHECK(rig_stats(&r).blocks_in_flight == 4);         /* the slots stay held under the copy */
  CHECK_ST(oi_engine_flush(r.e, 20), OI_ERR_TIMEOUT); /* shorter than the copy */
  CHECK_OK(oi_engine_flush(r.e, 60000));
  CHECK(rig_visible(&r, 0, 4) == 0); /* the late save is discarded */
  rig_check_quiet(&r);

  /* A load past its deadline: its ticket is fencing (not final) while the
   * slow copy may still land, and ends with OI_ERR_DEADLINE only once it
   * did; the destination blocks are the caller's from then on. */
  oi__fault_disarm_all();
  CHECK_OK(rig_save(&r, 10, 4));
  oi_lease l;
  CHECK(rig_query(&r, 10, 4, &l) == 4);
  oi_engine_stats es0;
  es0.struct_size = sizeof es0;
  CHECK_OK(oi_engine_get_stats(r.e, &es0));
  REQUIRE(oi__fault_arm(OI_FAULT_COPY_SLOW, 0, 1, 300) == OI_OK);
  int64_t lids[4] = {8, 9, 10, 11};
  t = NULL;
  t0 = oi__now_ns();
  CHECK_OK(oi_engine_load(r.e, l, lids, 4, NULL, &t));
  CHECK_ST(oi_ticket_wait(t, 60000), OI_ERR_TIMEOUT); /* at the deadline, not the copy's end */
  CHECK(oi__now_ns() - t0 < 250000000ull);
  CHECK(strstr(oi_last_error(), "OI_FENCING") != NULL);
  CHECK(oi_ticket_poll(t) == OI_FENCING);
  CHECK(oi_ticket_arena_poll(t, 0) == OI_FENCING);
  CHECK_ST(oi_ticket_arena_wait(t, 0, 60000), OI_ERR_TIMEOUT);
  CHECK(rig_stats(&r).blocks_loading == 4); /* held until the copy ends */
  uint64_t evicted = 99;
  CHECK_OK(oi_host_evict_all(r.h, &evicted));
  CHECK(evicted == 0);                                   /* loading blocks are not evictable */
  CHECK_ST(rig_load(&r, l, 8, 4), OI_ERR_LEASE_EXPIRED); /* spent */
  for (int i = 0; i < 500 && oi_ticket_poll(t) == OI_FENCING; i++)
    usleep(2000);
  CHECK(oi_ticket_poll(t) == OI_ERR_DEADLINE);
  CHECK(oi__now_ns() - t0 >= 295000000ull); /* not before the copy ended */
  CHECK_ST(oi_ticket_wait(t, 0), OI_ERR_DEADLINE);
  oi_ticket_release(t);
  for (int i = 0; i < 4; i++)
    CHECK(fu_check(&r, 8 + i, 10 + (uint64_t)i)); /* it did land, before the end */
  /* The caller's again: what it writes into the blocks now stays. */
  for (int i = 0; i < 4; i++)
    fu_fill(&r, 8 + i, 500 + (uint64_t)i);
  usleep(400000);
  for (int i = 0; i < 4; i++)
    CHECK(fu_check(&r, 8 + i, 500 + (uint64_t)i));
  oi_engine_stats es1;
  es1.struct_size = sizeof es1;
  CHECK_OK(oi_engine_get_stats(r.e, &es1));
  CHECK(es1.loads_failed == es0.loads_failed + 2); /* the late load and the spent lease's */
  CHECK(es1.loads_submitted == es0.loads_submitted + 1);
  CHECK(es1.loads_completed == es0.loads_completed); /* the late load never completed */
  for (int i = 0; i < 500 && rig_stats(&r).blocks_loading; i++)
    usleep(10000);
  rig_check_quiet(&r);
  rig_close(&r);
}

/* A save reported late is discarded; meanwhile the pool is reused for new
 * saves. If the late copy's slots had been handed out, the new blocks would
 * hold the late copy's bytes. */
static void test_no_slot_reuse_under_a_late_copy(void) {
  rig r;
  rig_open(&r, 16, 4096, 8, 0, 30, 0, 0); /* 8 slots */
  REQUIRE(oi__fault_arm(OI_FAULT_COPY_SLOW, 0, 1, 300) == OI_OK);
  CHECK_ST(rig_save(&r, 0, 4), OI_ERR_TIMEOUT); /* 4 slots held by the late copy */
  /* A second engine (its own streams, no deadline) saves meanwhile. */
  oi_engine *late = r.e;
  r.e = fu_rig_engine(&r, r.arena);
  /* 8 new blocks into a pool with 4 free slots: 4 land, 4 are dropped. */
  int64_t ids[8];
  oi_block_hash hs[8];
  fu_stage(&r, ids, hs, 8, 8, 100);
  CHECK_OK(tr_save(r.e, ids, hs, 8, 60000));
  CHECK_OK(oi_engine_flush(r.e, 60000));
  oi_host_stats s = rig_stats(&r);
  CHECK(s.saves_dropped == 4 && s.blocks_sealed == 4);
  if (s.saves_dropped != 4 || s.blocks_sealed != 4)
    fprintf(stderr, "dropped %llu sealed %llu failed %llu evictions %llu in flight %llu\n",
            (unsigned long long)s.saves_dropped, (unsigned long long)s.blocks_sealed,
            (unsigned long long)s.saves_failed, (unsigned long long)s.evictions,
            (unsigned long long)s.blocks_in_flight);
  rig_check_reload(&r, 100, 4);
  CHECK_OK(oi_engine_flush(late, 60000)); /* the late copy lands, and is discarded */
  oi_engine_destroy(late);
  CHECK(rig_visible(&r, 0, 4) == 0 && rig_visible(&r, 100, 4) == 4);
  rig_check_quiet(&r);
  rig_close(&r);
}

/* Destroying an engine with slow copies in flight waits for them: the arena
 * is freed right after destroy returns (ASan reports a copy into it). */
static void test_destroy_waits_for_live_copies(void) {
  rig r;
  oi_lease l = rig_open_leased(&r, 16, 4096, 32, 0, 0, 4);
  REQUIRE(oi__fault_arm(OI_FAULT_COPY_SLOW, 0, 0, 100) == OI_OK);
  int64_t ids[4] = {8, 9, 10, 11};
  CHECK_OK(oi_engine_load(r.e, l, ids, 4, NULL, NULL));
  for (int i = 0; i < 4; i++)
    fu_fill(&r, 12 + i, 40 + (uint64_t)i);
  int64_t sids[4] = {12, 13, 14, 15};
  oi_block_hash hs[4];
  for (int i = 0; i < 4; i++)
    hs[i] = fu_hash(40 + (uint64_t)i);
  CHECK_OK(oi_engine_save(r.e, sids, hs, 4, NULL, NULL));
  oi_engine_destroy(r.e); /* the copies are still sleeping */
  r.e = NULL;
  free(r.arena); /* a copy still running would now touch freed memory */
  r.arena = NULL;
  oi__fault_disarm_all();
  oi_host_destroy(r.h);
}

int main(void) {
  REQUIRE_FAULTS();
  RUN_TEST(test_save_and_load_deadlines);
  RUN_TEST(test_no_slot_reuse_under_a_late_copy);
  RUN_TEST(test_destroy_waits_for_live_copies);
  TEST_EXIT();
}
