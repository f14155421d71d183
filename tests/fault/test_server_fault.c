/* Fault injection inside `openinfer serve` (armed through OI_FAULTS, read
 * by the server process at its first fault point): a save and a load whose
 * copy fails in the server come back to the client as errors, with the
 * server's message; a flush that times out in the server reports it; the
 * server refuses a client past --max-sessions and one whose session cannot
 * start, each with a status and a message; and it keeps serving throughout. */
#include <pthread.h>

#include "../sidecar/sidecar_util.h"
#include "fault_util.h"

static test_server ts;

/* Client log lines (the failed asynchronous operations are reported there). */
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static char log_seen[8192];
static void log_handler(void *ctx, oi_log_level level, const char *line) {
  (void)ctx;
  if (level < OI_LOG_WARN) return;
  pthread_mutex_lock(&log_lock);
  size_t n = strlen(log_seen);
  snprintf(log_seen + n, sizeof log_seen - n, "%s\n", line);
  pthread_mutex_unlock(&log_lock);
}
static bool log_has(const char *a, const char *b) {
  pthread_mutex_lock(&log_lock);
  bool ok = false;
  for (const char *p = log_seen; p && *p && !ok;) {
    const char *end = strchr(p, '\n');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    char line[1024];
    snprintf(line, sizeof line, "%.*s", (int)OI_MIN(len, sizeof line - 1), p);
    ok = strstr(line, a) && strstr(line, b);
    p = end ? end + 1 : NULL;
  }
  if (!ok) fprintf(stderr, "no client log line with '%s' and '%s' in:\n%s", a, b, log_seen);
  pthread_mutex_unlock(&log_lock);
  return ok;
}

static oi_status save_wait(oi_engine *e, const int64_t *src, const oi_block_hash *hs, size_t n) {
  return tr_save(e, src, hs, n, 60000);
}

static oi_status load_wait(oi_engine *e, oi_lease l, const int64_t *dst, size_t n) {
  return tr_load(e, l, dst, n, 60000);
}

/* The server's copies, in order: 0 the first save (copy_fail), 1 the second
 * save, 2 the first load (copy_partial), 3 the second load, 4 the third save
 * (copy_slow 1500 ms). */
#define SERVER_FAULTS "copy_fail:0:1,copy_partial:1:1,copy_slow:4:1:1500"

static void test_server_copy_failures_reach_the_client(void) {
  TL_CLIENT(a, o, e, arena);
  uint8_t *base = tl_connect(ts.socket, "server-fault", a, &o, &e, &arena);
  int64_t src[2], dst[2] = {10, 11};
  oi_block_hash hs[2];
  tl_fill_n(base, a, 90, src, hs, 2);

  /* A save whose copy fails in the server: an error, nothing visible. */
  CHECK_ST(save_wait(e, src, hs, 2), OI_ERR_IO);
  /* (the server's Result says what failed, on which instance and why; the
   * copy's own message stays in the server's log) */
  CHECK(log_has("save failed: save of 2 blocks failed in the server (instance ",
                "OI_ERR_IO (a copy between the arena and the host pool failed"));
  CHECK(ts_log_contains(&ts, "save of 2 blocks failed: OI_ERR_IO"));
  CHECK_OK(oi_engine_flush(e, 10000));
  oi_query_result q = {.struct_size = sizeof q};
  CHECK_OK(oi_engine_query(e, NULL, hs, 2, 0, &q));
  CHECK(q.hit_blocks == 0);
  CHECK(ts_log_contains(&ts, "fault injection armed from OI_FAULTS"));

  /* The server keeps serving: the same save succeeds. */
  CHECK_OK(save_wait(e, src, hs, 2));
  CHECK_OK(oi_engine_query(e, NULL, hs, 2, 0, &q));
  REQUIRE(q.hit_blocks == 2);

  /* A load whose copy fails midway in the server: an error with the
   * server's message; the lease is consumed, the blocks stay. */
  CHECK_ST(load_wait(e, q.lease, dst, 2), OI_ERR_IO);
  CHECK(log_has("load failed: load of 2 blocks failed in the server (instance ",
                "OI_ERR_IO (a copy between the arena and the host pool failed"));
  CHECK(ts_log_contains(&ts, "load of 2 blocks failed: OI_ERR_IO"));
  CHECK_ST(oi_engine_release(e, q.lease), OI_ERR_LEASE_EXPIRED);
  CHECK_OK(oi_engine_query(e, NULL, hs, 2, 0, &q));
  REQUIRE(q.hit_blocks == 2);
  CHECK_OK(load_wait(e, q.lease, dst, 2));
  for (int b = 0; b < 2; b++)
    CHECK(tl_check(base, a, dst[b], (uint64_t)b));

  /* A flush that times out in the server reports it to the client. */
  oi_block_hash h3[1] = {tl_hash(90, 7)};
  tl_fill(base, a, 2, 7);
  int64_t src3[1] = {2};
  oi_ticket *t;
  CHECK_OK(oi_engine_save(e, src3, h3, 1, NULL, &t));
  CHECK_ST(oi_engine_flush(e, 100), OI_ERR_TIMEOUT);
  CHECK(strstr(oi_last_error(), "flush") && strstr(oi_last_error(), "in flight"));
  CHECK_OK(oi_ticket_wait(t, 60000));
  oi_ticket_release(t);
  CHECK_OK(oi_engine_flush(e, 10000));

  /* --max-sessions 1: a second client is refused, saying why. */
  oi_engine *e2 = NULL;
  oi_imported_arena *arena2 = NULL;
  oi_arena_desc a2[TL_ARENAS];
  oi_engine_options o2;
  tl_options(&o2, a2, "server-fault");
  CHECK_ST(oi_engine_connect(ts.socket, &o2, &e2, &arena2), OI_ERR_BUSY);
  CHECK(strstr(oi_last_error(), "session limit"));
  CHECK(e2 == NULL && arena2 == NULL);
  CHECK(ts_log_contains(&ts, "sessions already"));
  /* ... and the first one is still served. */
  CHECK_OK(oi_engine_query(e, NULL, hs, 2, 0, &q));
  CHECK(q.hit_blocks == 2);
  CHECK_OK(oi_engine_release(e, q.lease));
  oi_imported_arena_close(arena);
  oi_engine_destroy(e);
}

/* A server that cannot start a session refuses that connection with
 * OI_ERR_INTERNAL and its reason; the next client is served. */
static void test_a_session_that_cannot_start_is_refused(void) {
  static test_server t2; /* registered for the exit-time cleanup: not on the stack */
  ts_init(&t2, ts.exe);
  setenv("OI_FAULTS", "session_start:0:1", 1);
  REQUIRE(ts_start(&t2, NULL));
  unsetenv("OI_FAULTS");
  TL_CLIENT(a, o, e, arena);
  tl_options(&o, a, "session-fault");
  e = NULL;
  arena = NULL;
  CHECK_ST(oi_engine_connect(t2.socket, &o, &e, &arena), OI_ERR_INTERNAL);
  CHECK(strstr(oi_last_error(), "cannot start a session"));
  CHECK(e == NULL && arena == NULL);
  CHECK_OK(oi_engine_connect(t2.socket, &o, &e, &arena));
  REQUIRE(e && arena);
  oi_query_result q = {.struct_size = sizeof q};
  oi_block_hash h = tl_hash(91, 0);
  CHECK_OK(oi_engine_query(e, NULL, &h, 1, 0, &q));
  CHECK(q.hit_blocks == 0);
  oi_imported_arena_close(arena);
  oi_engine_destroy(e);
  CHECK(ts_stop(&t2));
}

/* A layered load (OI_LOAD_ARENA_EVENTS) whose copies fail in the server:
 * the ticket and every arena's wait fail with the server's status, and the
 * Result says what failed; the server keeps serving. */
static void test_a_layered_load_failure_reaches_the_client(void) {
  static test_server t3; /* registered for the exit-time cleanup: not on the stack */
  ts_init(&t3, ts.exe);
  setenv("OI_FAULTS", "copy_fail:1:0", 1); /* the save's copy passes, every later one fails */
  REQUIRE(ts_start(&t3, NULL));
  unsetenv("OI_FAULTS");
  TL_CLIENT(a, o, e, arena);
  uint8_t *base = tl_connect(t3.socket, "layered-fault", a, &o, &e, &arena);
  int64_t src[2], dst[2] = {10, 11};
  oi_block_hash hs[2];
  tl_fill_n(base, a, 92, src, hs, 2);
  CHECK_OK(save_wait(e, src, hs, 2));
  oi_query_result q = {.struct_size = sizeof q};
  CHECK_OK(oi_engine_query(e, NULL, hs, 2, 0, &q));
  REQUIRE(q.hit_blocks == 2);
  oi_load_options lo;
  oi_load_options_init(&lo);
  lo.flags = OI_LOAD_ARENA_EVENTS;
  oi_ticket *t = NULL;
  CHECK_OK(oi_engine_load(e, q.lease, dst, 2, &lo, &t));
  CHECK_ST(oi_ticket_wait(t, 60000), OI_ERR_IO);
  for (uint32_t ar = 0; ar < TL_ARENAS; ar++)
    CHECK_ST(oi_ticket_arena_wait(t, ar, 10000), OI_ERR_IO);
  oi_ticket_release(t);
  CHECK(log_has("load of 2 blocks failed in the server (instance ", "OI_ERR_IO"));
  CHECK(ts_log_contains(&t3, "load of 2 blocks failed: OI_ERR_IO"));
  CHECK(tl_is_zero(base, a, dst[0]) && tl_is_zero(base, a, dst[1])); /* no copy landed */
  /* The server keeps serving: the blocks are still there. */
  CHECK_OK(oi_engine_query(e, NULL, hs, 2, 0, &q));
  CHECK(q.hit_blocks == 2);
  CHECK_OK(oi_engine_release(e, q.lease));
  oi_imported_arena_close(arena);
  oi_engine_destroy(e);
  CHECK(ts_stop(&t3));
}

int main(int argc, char **argv) {
  REQUIRE_FAULTS();
  if (argc < 2) TEST_SKIP("usage: test_server_fault OPENINFER_EXE");
  oi_set_log_handler(log_handler, NULL);
  ts_init(&ts, argv[1]);
  setenv("OI_FAULTS", SERVER_FAULTS, 1);
  const char *extra[] = {"--max-sessions", "1", NULL};
  REQUIRE(ts_start(&ts, extra));
  unsetenv("OI_FAULTS");
  RUN_TEST(test_server_copy_failures_reach_the_client);
  CHECK(ts_stop(&ts));
  RUN_TEST(test_a_session_that_cannot_start_is_refused);
  RUN_TEST(test_a_layered_load_failure_reaches_the_client);
  TEST_EXIT();
}
