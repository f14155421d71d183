/* A client SIGKILLed at any point (right after registering; with saves in
 * flight): the server frees its instance and its arena (the shared-memory
 * object is gone), keeps the blocks it saved (another client restores them
 * byte-exact), and keeps serving. */
#include "sidecar_util.h"

static test_server ts;
static const char *NS = "killed-ns";

enum { KILL_AFTER_REGISTER, KILL_WITH_SAVES_IN_FLIGHT };

/* The doomed client: registers, maybe saves, says "ready", waits to die. */
static void doomed_client(int mode, int ready_fd) {
  TL_CLIENT(a, o, e, arena);
  tl_options(&o, a, NS);
  o.instance_name = "doomed";
  if (oi_engine_connect(ts.socket, &o, &e, &arena) != OI_OK) _exit(2);
  uint8_t *base = oi_imported_arena_ptr(arena);
  if (mode == KILL_WITH_SAVES_IN_FLIGHT) {
    int64_t ids[TL_BLOCKS];
    oi_block_hash hashes[TL_BLOCKS];
    for (int i = 0; i < TL_BLOCKS; i++) {
      ids[i] = i;
      hashes[i] = tl_hash(3, (uint64_t)i);
      tl_fill(base, a, i, (uint64_t)i);
    }
    /* 8 sealed for sure, then a stream of saves still going when we die */
    if (oi_engine_save(e, ids, hashes, 8, NULL, NULL) != OI_OK) _exit(3);
    if (oi_engine_flush(e, 10000) != OI_OK) _exit(4);
    for (int round = 0; round < 50; round++) {
      for (int i = 8; i < TL_BLOCKS; i++)
        hashes[i] = tl_hash(100 + (uint32_t)round, (uint64_t)i);
      oi_engine_save(e, ids + 8, hashes + 8, TL_BLOCKS - 8, NULL, NULL);
    }
  }
  if (write(ready_fd, "r", 1) != 1) _exit(5);
  for (;;)
    pause();
}

static void kill_client(int mode) {
  int p[2];
  pid_t child = tr_fork_pipe(p);
  if (child == 0) {
    doomed_client(mode, p[1]);
  }
  char c;
  CHECK(read(p[0], &c, 1) == 1);
  close(p[0]);
  kill(child, SIGKILL);
  int status;
  waitpid(child, &status, 0);
  CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
}

static void test_client_killed(void) {
  wire_client wc;
  REQUIRE(wc_connect(&wc, ts.socket) && wc_hello(&wc, NULL));
  oiwire_StatsReply sr;

  kill_client(KILL_AFTER_REGISTER);
  /* The session ends a moment after its instances: wait for all of it. */
  CHECK(WAIT_FOR_STATS(&wc, sr,
                       sr.instances == 0 && sr.instances_cleaned_up == 1 && sr.arena_bytes == 0 &&
                           sr.sessions == 1));
  CHECK(sr.arena_bytes == 0 && sr.sessions == 1);
  CHECK(shm_objects_of(ts.pid) == 0);

  kill_client(KILL_WITH_SAVES_IN_FLIGHT);
  CHECK(WAIT_FOR_STATS(&wc, sr,
                       sr.instances == 0 && sr.instances_cleaned_up == 2 && sr.arena_bytes == 0 &&
                           sr.sessions == 1));
  CHECK(sr.arena_bytes == 0 && sr.sessions == 1);
  CHECK(shm_objects_of(ts.pid) == 0);
  CHECK(sr.host_blocks_sealed >= 8);
  wc_close(&wc);

  /* Another client restores what the dead one saved. */
  TL_CLIENT(a, o, e, arena);
  uint8_t *base = tl_connect(ts.socket, NS, a, &o, &e, &arena);
  oi_block_hash hashes[8];
  int64_t dst[8];
  for (int i = 0; i < 8; i++) {
    hashes[i] = tl_hash(3, (uint64_t)i);
    dst[i] = 31 - i;
  }
  oi_query_result qr = {.struct_size = sizeof qr};
  CHECK_OK(oi_engine_query(e, NULL, hashes, 8, 0, &qr));
  CHECK(qr.hit_blocks == 8);
  CHECK_OK(tr_load(e, qr.lease, dst, 8, 10000));
  for (int i = 0; i < 8; i++)
    CHECK(tl_check(base, a, dst[i], (uint64_t)i));
  oi_imported_arena_close(arena);
  oi_engine_destroy(e);
}

int main(int argc, char **argv) {
  if (argc < 2) TEST_SKIP("usage: test_client_killed OPENINFER_EXE");
  ts_init(&ts, argv[1]);
  REQUIRE(ts_start(&ts, NULL));
  RUN_TEST(test_client_killed);
  CHECK(ts_stop(&ts));
  if (oi_test_failures) ts_dump_log(&ts);
  ts_cleanup(&ts);
  TEST_EXIT();
}
