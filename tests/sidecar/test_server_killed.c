/* The server dies under a live client: the client's watchdog runs the fatal
 * handler (the memory its arena maps is gone). SIGKILL and a clean stop both
 * count. A client that shut down cleanly never triggers it, whatever the
 * server does afterwards. Each client is a child process whose fatal
 * handler writes a marker file and exits 0. */
#include "sidecar_util.h"

static test_server ts;
static char marker[256];

static void fatal_marker(void *ctx, const char *reason) {
  (void)ctx;
  int fd = open(marker, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd >= 0) {
    ssize_t w = write(fd, reason, strlen(reason));
    (void)w;
    close(fd);
  }
  _exit(0);
}

static bool marker_says(const char *needle) {
  FILE *f = fopen(marker, "r");
  if (!f) return false;
  char buf[1024] = {0};
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  return strstr(buf, needle) != NULL;
}

/* clean: shut down cleanly, then say so and live on for a while. */
static void client(int ready_fd, bool clean) {
  oi_set_fatal_handler(fatal_marker, NULL);
  TL_CLIENT(a, o, e, arena);
  tl_options(&o, a, "watchdog");
  if (oi_engine_connect(ts.socket, &o, &e, &arena) != OI_OK) _exit(2);
  int64_t id = 0;
  oi_block_hash h = tl_hash(5, 0);
  if (oi_engine_save(e, &id, &h, 1, NULL, NULL) != OI_OK) _exit(3);
  if (oi_engine_flush(e, 10000) != OI_OK) _exit(4);
  if (clean) {
    oi_imported_arena_close(arena);
    oi_engine_destroy(e);
  }
  if (write(ready_fd, "r", 1) != 1) _exit(5);
  sleep(clean ? 2 : 30); /* the watchdog fires long before, if it must */
  _exit(clean ? 0 : 6);
}

/* Runs a client, then `what` to the server; @return the client's status. */
static int run(bool clean, int sig) {
  unlink(marker);
  REQUIRE(ts_start(&ts, NULL));
  int p[2];
  pid_t child = tr_fork_pipe(p);
  if (child == 0) {
    client(p[1], clean);
  }
  char c;
  CHECK(read(p[0], &c, 1) == 1);
  close(p[0]);
  if (sig == SIGKILL)
    ts_kill(&ts);
  else
    CHECK(ts_stop(&ts));
  int status;
  waitpid(child, &status, 0);
  return status;
}

static void test_server_sigkill_runs_the_fatal_handler(void) {
  int status = run(false, SIGKILL);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  CHECK(marker_says("sidecar server"));
}

static void test_server_stop_runs_the_fatal_handler(void) {
  int status = run(false, SIGTERM);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  CHECK(marker_says("sidecar server"));
}

static void test_clean_shutdown_never_runs_it(void) {
  int status = run(true, SIGKILL);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  CHECK(access(marker, F_OK) != 0);
  status = run(true, SIGTERM);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  CHECK(access(marker, F_OK) != 0);
}

int main(int argc, char **argv) {
  if (argc < 2) TEST_SKIP("usage: test_server_killed OPENINFER_EXE");
  ts_init(&ts, argv[1]);
  snprintf(marker, sizeof marker, "%s/fatal-marker", ts.dir);
  RUN_TEST(test_server_sigkill_runs_the_fatal_handler);
  RUN_TEST(test_server_stop_runs_the_fatal_handler);
  RUN_TEST(test_clean_shutdown_never_runs_it);
  unlink(marker);
  ts_cleanup(&ts);
  TEST_EXIT();
}
