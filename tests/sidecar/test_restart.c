/* Restarts: a restarted server has a new epoch (Hello) and clients register
 * again; a stale socket file left by a killed server is replaced; a live one
 * is not (the second server fails, the first keeps serving); a path that is
 * not a socket is never removed. Unregister of an instance the server
 * already cleaned up (or never knew) succeeds. */
#include "sidecar_util.h"

static test_server ts;

static uint64_t epoch_now(void) {
  wire_client c;
  uint64_t epoch = 0;
  if (wc_connect(&c, ts.socket)) wc_hello(&c, &epoch);
  wc_close(&c);
  return epoch;
}

static bool client_round_trip(uint64_t expect_hits) {
  TL_CLIENT(a, o, e, arena);
  tl_options(&o, a, "restart");
  if (oi_engine_connect(ts.socket, &o, &e, &arena) != OI_OK) return false;
  int64_t id = 1;
  oi_block_hash h = tl_hash(11, 1);
  oi_query_result qr = {.struct_size = sizeof qr};
  bool ok = oi_engine_query(e, NULL, &h, 1, 0, &qr) == OI_OK && qr.hit_blocks == expect_hits;
  if (qr.hit_blocks) oi_engine_release(e, qr.lease);
  ok = ok && oi_engine_save(e, &id, &h, 1, NULL, NULL) == OI_OK &&
       oi_engine_flush(e, 10000) == OI_OK;
  oi_imported_arena_close(arena);
  oi_engine_destroy(e);
  return ok;
}

static void test_restart_changes_the_epoch(void) {
  REQUIRE(ts_start(&ts, NULL));
  uint64_t e1 = epoch_now();
  CHECK(e1 != 0);
  CHECK(epoch_now() == e1);
  CHECK(client_round_trip(0));
  CHECK(client_round_trip(1)); /* the cache outlives the client */
  CHECK(ts_stop(&ts));
  REQUIRE(ts_start(&ts, NULL));
  uint64_t e2 = epoch_now();
  CHECK(e2 != 0 && e2 != e1);
  CHECK(client_round_trip(0)); /* a new server: a new, empty pool */
  /* killed: the socket file stays behind, and the next server replaces it */
  ts_kill(&ts);
  CHECK(access(ts.socket, F_OK) == 0);
  REQUIRE(ts_start(&ts, NULL));
  uint64_t e3 = epoch_now();
  CHECK(e3 != 0 && e3 != e2 && e3 != e1);
  CHECK(client_round_trip(0));
}

static void test_a_live_socket_is_not_taken_over(void) {
  /* ts is running (from the previous test) */
  test_server second = ts;
  second.pid = 0;
  bool started = ts_start(&second, NULL);
  CHECK(!started);
  if (started) ts_kill(&second);
  CHECK(ts_log_contains(&second, "another server listens"));
  CHECK(epoch_now() != 0);
  CHECK(client_round_trip(1));
  CHECK(ts_stop(&ts));
  /* not a socket: refused, and left alone */
  FILE *f = fopen(ts.socket, "w");
  REQUIRE(f != NULL);
  fputs("precious", f);
  fclose(f);
  CHECK(!ts_start(&ts, NULL));
  struct stat st;
  CHECK(stat(ts.socket, &st) == 0 && S_ISREG(st.st_mode) && st.st_size == 8);
  unlink(ts.socket);
}

static void test_unregister_of_a_cleaned_instance_succeeds(void) {
  REQUIRE(ts_start(&ts, NULL));
  wire_client a, b;
  REQUIRE(wc_connect(&a, ts.socket) && wc_hello(&a, NULL));
  uint32_t inst = wc_register(&a, "restart", NULL, NULL);
  CHECK(inst != 0);
  wc_close(&a); /* the session ends: the server cleans its instance up */
  REQUIRE(wc_connect(&b, ts.socket) && wc_hello(&b, NULL));
  oiwire_StatsReply sr;
  CHECK(WAIT_FOR_STATS(&b, sr, sr.instances == 0 && sr.instances_cleaned_up == 1));
  oiwire_Envelope env;
  memset(&env, 0, sizeof env);
  env.which_body = oiwire_Envelope_unregister_tag;
  env.body.unregister.instance_id = inst;
  CHECK(wc_call(&b, &env, NULL) && wc_status(&b) == OI_OK);
  /* and twice for one's own */
  uint32_t mine = wc_register(&b, "restart", NULL, NULL);
  CHECK(mine != 0);
  for (int i = 0; i < 2; i++) {
    memset(&env, 0, sizeof env);
    env.which_body = oiwire_Envelope_unregister_tag;
    env.body.unregister.instance_id = mine;
    CHECK(wc_call(&b, &env, NULL) && wc_status(&b) == OI_OK);
  }
  CHECK(WAIT_FOR_STATS(&b, sr, sr.instances == 0 && sr.instances_cleaned_up == 1));
  wc_close(&b);
  CHECK(ts_stop(&ts));
}

static char owner_file[200];

/* A SIGKILLed server cannot unlink its cpu arenas' shared memory; the next
 * server on the same socket finds the stale socket, reads the dead owner's
 * pid from <socket>.pid and removes them. */
static void test_a_killed_servers_arenas_are_removed_by_the_next(void) {
  REQUIRE(ts_start(&ts, NULL));
  snprintf(owner_file, sizeof owner_file, "%s.pid", ts.socket);
  CHECK(access(owner_file, F_OK) == 0);
  wire_client a;
  REQUIRE(wc_connect(&a, ts.socket) && wc_hello(&a, NULL));
  CHECK(wc_register(&a, "leftovers", NULL, NULL) != 0); /* the server allocates a shm arena */
  pid_t old = ts.pid;
  CHECK(shm_objects_of(old) == 1);
  kill(old, SIGKILL);
  CHECK(waitpid(old, NULL, 0) == old);
  ts.pid = 0;
  wc_close(&a);
  CHECK(shm_objects_of(old) == 1); /* left behind */
  REQUIRE(ts_start(&ts, NULL));
  CHECK(shm_objects_of(old) == 0);
  CHECK(ts_log_contains(&ts, "removed 1 shared-memory arena that a dead server"));
  ts_unlink_shm_of(old); /* in case the check failed */
  CHECK(ts_stop(&ts));
  CHECK(access(owner_file, F_OK) != 0); /* a clean stop removes it */
}

int main(int argc, char **argv) {
  if (argc < 2) TEST_SKIP("usage: test_restart OPENINFER_EXE");
  ts_init(&ts, argv[1]);
  RUN_TEST(test_restart_changes_the_epoch);
  RUN_TEST(test_a_live_socket_is_not_taken_over);
  RUN_TEST(test_unregister_of_a_cleaned_instance_succeeds);
  RUN_TEST(test_a_killed_servers_arenas_are_removed_by_the_next);
  if (oi_test_failures) ts_dump_log(&ts);
  ts_cleanup(&ts);
  TEST_EXIT();
}
