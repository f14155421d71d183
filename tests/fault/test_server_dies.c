/* The client's fatal handler runs when the server dies, whenever it dies:
 *  - the server resets the client's connection at each of its replies
 *    (sock_reset armed in `openinfer serve` through OI_FAULTS);
 *  - the server is SIGKILLed after each step of the client.
 * Each client is a child whose fatal handler exits 42. Once connected, a
 * client either completes (the server died after its last reply) or its
 * fatal handler runs; it never reports a wrong byte (exit 10); before it is
 * connected, a failure is an ordinary error. */
#include "fault_util.h"
#include "sidecar_util.h"

#include <sys/mman.h>

static test_server ts;

static void fatal_exit(void *ctx, const char *reason) {
  (void)ctx;
  (void)reason;
  _exit(42);
}

/* connect, save, flush, query, load (checked), then waits for the watchdog;
 * a byte on `fd` after each step. */
static int client(int fd) {
  signal(SIGPIPE, SIG_IGN);
  oi_set_fatal_handler(fatal_exit, NULL);
  TL_CLIENT(a, o, e, arena);
  tl_options(&o, a, "dies");
  if (oi_engine_connect(ts.socket, &o, &e, &arena) != OI_OK) return 2; /* not connected yet */
  STEP(fd);
  uint8_t *base = oi_imported_arena_ptr(arena);
  int64_t ids[4] = {0, 1, 2, 3}, dst[4] = {20, 21, 22, 23};
  oi_block_hash hs[4];
  for (int i = 0; i < 4; i++) {
    hs[i] = tl_hash(33, (uint64_t)i);
    tl_fill(base, a, i, (uint64_t)i);
  }
  oi_ticket *t = NULL;
  oi_status st = oi_engine_save(e, ids, hs, 4, NULL, &t);
  if (st == OI_OK) st = oi_ticket_wait(t, 30000), oi_ticket_release(t);
  STEP(fd);
  if (st == OI_OK) st = oi_engine_flush(e, 30000);
  STEP(fd);
  oi_query_result q = {.struct_size = sizeof q};
  if (st == OI_OK) st = oi_engine_query(e, NULL, hs, 4, 0, &q);
  STEP(fd);
  if (st == OI_OK && q.hit_blocks == 4) {
    st = oi_engine_load(e, q.lease, dst, 4, NULL, &t);
    if (st == OI_OK) {
      st = oi_ticket_wait(t, 30000);
      oi_ticket_release(t);
      if (st == OI_OK)
        for (int i = 0; i < 4; i++)
          if (!tl_check(base, a, dst[i], (uint64_t)i)) return 10;
    }
  }
  STEP(fd);
  /* Errors above are fine (the server is going); the watchdog must fire. */
  sleep(20);
  return 11;
}

static void test_server_resets_each_reply(void) {
  int fatal = 0, refused = 0;
  for (int n = 0; n < 6; n++) { /* the session's replies: hello .. load */
    char spec[64];
    snprintf(spec, sizeof spec, "sock_reset:%d:1:2", n);
    setenv("OI_FAULTS", spec, 1);
    REQUIRE(ts_start(&ts, NULL));
    unsetenv("OI_FAULTS");
    pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) _exit(client(-1));
    int status;
    waitpid(child, &status, 0);
    int rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    if (rc != 42 && rc != 2)
      fprintf(stderr, "reset at reply %d: the client exited %d (0x%x)\n", n, rc, status);
    CHECK(rc == 42 || rc == 2);
    fatal += rc == 42;
    refused += rc == 2;
    CHECK(ts_stop(&ts)); /* the server itself lived on */
  }
  CHECK(fatal == 4 && refused == 2); /* hello and register replies: connect fails; later: fatal */
  fprintf(stderr, "  resets: %d fatal-handler runs, %d refused connects\n", fatal, refused);
}

static void test_server_killed_after_each_step(void) {
  for (int k = 1; k <= 5; k++) {
    REQUIRE(ts_start(&ts, NULL));
    int p[2];
    pid_t child = tr_fork_pipe(p);
    if (child == 0) {
      _exit(client(p[1]));
    }
    char c;
    int got = 0;
    while (got < k && read(p[0], &c, 1) == 1)
      got++;
    pid_t server = ts.pid;
    ts_kill(&ts);
    ts_unlink_shm_of(server);
    int status;
    waitpid(child, &status, 0);
    close(p[0]);
    int rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    if (rc != 42) fprintf(stderr, "server killed after step %d: the client exited %d\n", k, rc);
    CHECK(rc == 42);
  }
}

int main(int argc, char **argv) {
  REQUIRE_FAULTS();
  if (argc < 2) TEST_SKIP("usage: test_server_dies OPENINFER_EXE");
  ts_init(&ts, argv[1]);
  RUN_TEST(test_server_resets_each_reply);
  RUN_TEST(test_server_killed_after_each_step);
  ts_cleanup(&ts);
  TEST_EXIT();
}
