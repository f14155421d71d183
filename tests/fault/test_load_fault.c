/* A failed load consumes its lease share and reports the error, never
 * success: a copy failing before any byte or midway, with one share and with
 * two. The blocks stay sealed, unpinned and loadable. A clock that jumps past
 * the lease TTL expires leases (the load fails, the pins go). */
#include "fault_util.h"

static void failing_load_consumes_the_lease(oi_fault_point point) {
  rig r;
  rig_open(&r, 16, 4096, 32, 0, 0, 0, 0);
  CHECK_OK(rig_save(&r, 0, 6));
  oi_lease l;
  CHECK(rig_query(&r, 0, 6, &l) == 6);
  REQUIRE(oi__fault_arm(point, 0, 1, 0) == OI_OK);
  CHECK_ST(rig_load(&r, l, 8, 6), OI_ERR_IO);
  CHECK(oi__fault_fired(point) == 1);
  CHECK_ST(rig_load(&r, l, 8, 6), OI_ERR_LEASE_EXPIRED); /* consumed */
  CHECK_ST(oi_offload_engine_release(r.e, l), OI_ERR_LEASE_EXPIRED);
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
  rig_open(&r, 16, 4096, 32, 2, 0, 0, 0);
  CHECK_OK(rig_save(&r, 50, 4));
  oi_lease l;
  CHECK(rig_query(&r, 50, 4, &l) == 4);
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
  /* The maintenance thread expires the idle one and frees the pins. */
  oi_host_stats s;
  for (int i = 0; i < 500; i++) {
    s = rig_stats(&r);
    if (s.leases_active == 0) break;
    usleep(10000);
  }
  CHECK(s.leases_active == 0 && s.leases_expired == 2 && s.blocks_leased == 0);
  CHECK_ST(oi_offload_engine_release(r.e, idle), OI_ERR_LEASE_EXPIRED);
  uint64_t evicted = 0;
  CHECK_OK(oi_offload_host_evict_all(r.h, &evicted)); /* unpinned: evictable again */
  CHECK(evicted == 4);
  rig_check_quiet(&r);
  rig_close(&r);
}

int main(void) {
  REQUIRE_FAULTS();
  RUN_TEST(test_load_copy_fails_before_any_byte);
  RUN_TEST(test_load_copy_fails_midway);
  RUN_TEST(test_two_shares_one_fails);
  RUN_TEST(test_clock_jump_expires_leases);
  TEST_EXIT();
}
