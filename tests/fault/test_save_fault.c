/* A failed save leaves nothing visible: a copy that fails before any byte,
 * one that fails midway, one whose second group fails after the first group
 * landed, and a pool with no slot to give (the save is dropped and counted,
 * never blocks). Blocks sealed before stay intact; the same hashes save
 * cleanly once the fault is gone. */
#include "fault_util.h"

static atomic_int done_st = 1;
static void on_done(void *ctx, oi_status st) {
  (void)ctx;
  atomic_store(&done_st, st);
}

static void failing_copy_leaves_nothing(oi_fault_point point) {
  rig r;
  rig_open(&r, 16, 4096, 32, 0, 0, 0, 0);
  CHECK_OK(rig_save(&r, 100, 4)); /* sealed before the fault */
  REQUIRE(oi__fault_arm(point, 0, 1, 0) == OI_OK);
  int64_t ids[8];
  oi_block_hash hs[8];
  fu_stage(&r, ids, hs, 4, 8, 100);          /* already sealed */
  fu_stage(&r, ids + 4, hs + 4, 4, 12, 204); /* new */
  oi_save_options so;
  oi_save_options_init(&so);
  so.on_done = on_done;
  oi_ticket *t = NULL;
  CHECK_OK(oi_engine_save(r.e, ids, hs, 8, &so, &t));
  CHECK_ST(oi_ticket_wait(t, 60000), OI_ERR_IO);
  oi_ticket_release(t);
  CHECK(atomic_load(&done_st) == OI_ERR_IO);
  CHECK(oi__fault_fired(point) == 1);
  CHECK_OK(oi_engine_flush(r.e, 60000));
  CHECK(rig_visible(&r, 204, 4) == 0); /* nothing partial is served */
  CHECK(rig_visible(&r, 100, 4) == 4); /* what was sealed stays */
  oi_host_stats s = rig_stats(&r);
  CHECK(s.saves_failed == 4 && s.blocks_sealed == 4);
  rig_check_quiet(&r);
  /* The old blocks are intact. */
  oi_lease l;
  CHECK(rig_query(&r, 100, 4, &l) == 4);
  CHECK_OK(rig_load(&r, l, 12, 4));
  for (int i = 0; i < 4; i++)
    CHECK(fu_check(&r, 12 + i, 100 + (uint64_t)i));
  /* Without the fault the same hashes save and load byte-exact. */
  oi__fault_disarm_all();
  for (int i = 4; i < 8; i++)
    fu_fill(&r, 8 + i, 200 + (uint64_t)i); /* (the load above overwrote them) */
  CHECK_OK(tr_save(r.e, ids + 4, hs + 4, 4, 60000));
  rig_check_reload(&r, 204, 4);
  rig_check_quiet(&r);
  rig_close(&r);
}

static void test_copy_fails_before_any_byte(void) {
  failing_copy_leaves_nothing(OI_FAULT_COPY_FAIL);
}
static void test_copy_fails_midway(void) { failing_copy_leaves_nothing(OI_FAULT_COPY_PARTIAL); }

/* A save queued in two groups: the first lands, the second fails. */
static void test_second_group_fails(void) {
  rig_submit_group_bytes = 1 << 20; /* 256 KiB blocks: groups of 5 */
  rig r;
  rig_open(&r, 12, 256 << 10, 16, 0, 0, 0, 0);
  rig_submit_group_bytes = 0;
  REQUIRE(oi__fault_arm(OI_FAULT_COPY_FAIL, 1, 1, 0) == OI_OK);
  CHECK_ST(rig_save(&r, 0, 12), OI_ERR_IO);
  CHECK(oi__fault_fired(OI_FAULT_COPY_FAIL) == 1);
  CHECK(rig_visible(&r, 0, 12) == 0);
  oi_host_stats s = rig_stats(&r);
  CHECK(s.saves_failed == 12 && s.blocks_sealed == 0);
  rig_check_quiet(&r);
  rig_close(&r);
}

/* No slot: the save is dropped, counted, and the call does not block. */
static void test_no_host_slot(void) {
  rig r;
  rig_open(&r, 8, 4096, 8, 0, 0, 0, 0);
  REQUIRE(oi__fault_arm(OI_FAULT_HOST_ALLOC, 0, 0, 0) == OI_OK);
  CHECK_OK(rig_save(&r, 0, 8));
  CHECK(oi__fault_fired(OI_FAULT_HOST_ALLOC) >= 1);
  CHECK(rig_visible(&r, 0, 8) == 0);
  oi_host_stats s = rig_stats(&r);
  CHECK(s.saves_dropped == 8 && s.blocks_sealed == 0);
  rig_check_quiet(&r);
  oi__fault_disarm_all();
  CHECK_OK(rig_save(&r, 0, 8));
  CHECK(rig_visible(&r, 0, 8) == 8);
  rig_close(&r);
}

/* The pool cannot be mapped or pinned: host creation fails cleanly. */
static void test_pool_setup_fails(void) {
  oi_host_options ho = tr_host_options(1 << 20);
  oi_host *h = NULL;
  REQUIRE(oi__fault_arm(OI_FAULT_PINNED_ALLOC, 0, 1, 0) == OI_OK);
  CHECK_ST(oi_host_create(&ho, &h), OI_ERR_OUT_OF_MEMORY);
  CHECK(h == NULL);
  REQUIRE(oi__fault_arm(OI_FAULT_PIN_REGISTER, 0, 1, 0) == OI_OK);
  CHECK_ST(oi_host_create(&ho, &h), OI_ERR_OUT_OF_MEMORY);
  CHECK(h == NULL && strstr(oi_last_error(), "injected"));
  oi__fault_disarm_all();
  CHECK_OK(oi_host_create(&ho, &h));
  oi_host_destroy(h);
}

/* A layerwise save whose second layer fails: that call's ticket reports the
 * error, the blocks' slots are freed at once (nothing partial is ever
 * served), the later layers skip them (their tickets OK, nothing copied),
 * and once every layer arrived the hashes can be saved again. */
static void test_a_failed_layer_aborts_the_whole_block(void) {
  layer_rig r;
  fu_layer_rig_open(&r, "layer-fault");
  int64_t ids[2] = {0, 1};
  oi_block_hash hs[2] = {fu_hash(700), fu_hash(701)};
  oi_save_options so = fu_layer_save_options();
  oi_status want[FU_LAYERS] = {OI_OK, OI_ERR_IO, OI_OK};
  for (uint32_t a = 0; a < FU_LAYERS; a++) {
    if (a == 1) REQUIRE(oi__fault_arm(OI_FAULT_COPY_FAIL, 0, 1, 0) == OI_OK);
    so.arena_first = a;
    oi_ticket *t;
    CHECK_OK(oi_engine_save(r.e, ids, hs, 2, &so, &t));
    CHECK_ST(oi_ticket_wait(t, 60000), want[a]);
    oi_ticket_release(t);
    oi__fault_disarm_all();
    fu_check_layer_in_flight(&r, a);
  }
  fu_layer_save_aborted(&r, ids, hs);
  fu_layer_rig_close(&r);
}

int main(void) {
  REQUIRE_FAULTS();
  RUN_TEST(test_copy_fails_before_any_byte);
  RUN_TEST(test_copy_fails_midway);
  RUN_TEST(test_second_group_fails);
  RUN_TEST(test_no_host_slot);
  RUN_TEST(test_pool_setup_fails);
  RUN_TEST(test_a_failed_layer_aborts_the_whole_block);
  TEST_EXIT();
}
