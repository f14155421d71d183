/* `openinfer serve --disk DIR --disk-size SIZE`: blocks a client saved are
 * written to disk behind the pool; a clean stop writes what was still
 * queued; a server restarted on the same directory (a new epoch, an empty
 * pool) answers a lookup with them (promoted back, waited for) and another
 * session loads them byte-exact. Bad disk options are refused at start. */
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "sidecar_util.h"

static test_server ts;

static void test_disk_survives_a_restart(void) {
  char disk[600];
  snprintf(disk, sizeof disk, "%s/disk", ts.dir);
  REQUIRE(mkdir(disk, 0700) == 0);
  const char *extra[] = {"--disk", disk, "--disk-size", "32M", NULL};
  REQUIRE(ts_start(&ts, extra));
  CHECK(ts_log_contains(&ts, "disk tier attached"));
  TL_CLIENT(a, o, e, arena);
  uint8_t *base = tl_connect(ts.socket, "disk-ns", a, &o, &e, &arena);
  enum { N = 8 };
  int64_t ids[N];
  oi_block_hash hs[N];
  tl_fill_n(base, a, 90, ids, hs, N);
  CHECK_OK(tr_save(e, ids, hs, N, 10000));
  CHECK_OK(oi_engine_flush(e, 10000));
  uint64_t epoch1;
  oi_engine_stats es = {.struct_size = sizeof es};
  CHECK_OK(oi_engine_get_stats(e, &es));
  epoch1 = es.server_epoch;
  oi_imported_arena_close(arena);
  oi_engine_destroy(e);
  CHECK(ts_stop(&ts)); /* clean: what is still queued is written first */

  REQUIRE(ts_start(&ts, extra));
  CHECK(ts_log_contains(&ts, "8 blocks from an earlier run"));
  /* `openinfer stats` shows the disk tier. */
  char cmd[1400], out[8192];
  snprintf(cmd, sizeof cmd, "'%s' stats --socket '%s' --json", ts.exe, ts.socket);
  FILE *p = popen(cmd, "r");
  REQUIRE(p);
  size_t got = fread(out, 1, sizeof out - 1, p);
  out[got] = 0;
  CHECK(pclose(p) == 0);
  CHECK(strstr(out, "\"disk\": {") != NULL);
  CHECK(strstr(out, "\"blocks\": 8,") != NULL);
  CHECK(strstr(out, "\"lost_unwritten\": 0,") != NULL); /* (issue #37: counted by cause) */
  CHECK(strstr(out, "\"lost_no_room\": 0,") != NULL);
  oi_lookup_options lo;
  oi_lookup_options_init(&lo);
  lo.lookup_deadline_ms = 10000; /* (not the breaker's test: slow machines) */
  lo.namespace_id = "disk-ns";
  oi_lookup *c;
  CHECK_OK(oi_lookup_connect(ts.socket, &lo, &c));
  /* The namespace is bound once an engine of it registers: a worker first. */
  oi_arena_desc a2[TL_ARENAS];
  oi_engine_options o2;
  tl_options(&o2, a2, "disk-ns");
  CHECK_OK(oi_engine_connect(ts.socket, &o2, &e, &arena));
  base = oi_imported_arena_ptr(arena);
  CHECK_OK(oi_engine_get_stats(e, &es));
  CHECK(es.server_epoch != epoch1);
  oi_query_result q = {.struct_size = sizeof q, .wait_ms = 10000};
  CHECK_OK(oi_lookup_query(c, NULL, hs, N, OI_QUERY_WAIT_PENDING, &q));
  CHECK(q.hit_blocks == N);
  int64_t dst[N];
  for (int i = 0; i < N; i++)
    dst[i] = 16 + i;
  CHECK_OK(tr_load(e, q.lease, dst, N, 10000));
  for (int i = 0; i < N; i++)
    CHECK(tl_check(base, a2, dst[i], (uint64_t)i));
  oi_lookup_destroy(c);
  oi_imported_arena_close(arena);
  oi_engine_destroy(e);
  CHECK(ts_stop(&ts));
}

/* Exit status of `openinfer serve ARGS...` run to completion (a refusal
 * exits at once). */
static int serve_status(const char *const *args) {
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    const char *argv[16] = {ts.exe, "serve", "--socket", ts.socket, "--pool", "8M", "--no-metrics"};
    int n = 7;
    for (int i = 0; args[i] && n < 15; i++)
      argv[n++] = args[i];
    argv[n] = NULL;
    int devnull = open("/dev/null", O_WRONLY);
    if (devnull >= 0) dup2(devnull, 2);
    execv(ts.exe, (char *const *)argv);
    _exit(127);
  }
  int status;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

static void test_bad_disk_options(void) {
  char open_dir[600];
  snprintf(open_dir, sizeof open_dir, "%s/open", ts.dir);
  REQUIRE(mkdir(open_dir, 0700) == 0);
  REQUIRE(chmod(open_dir, 0777) == 0);
  const char *no_size[] = {"--disk", open_dir, NULL};
  CHECK(serve_status(no_size) == 2); /* usage */
  const char *bad_size[] = {"--disk", open_dir, "--disk-size", "lots", NULL};
  CHECK(serve_status(bad_size) == 2);
  const char *world[] = {"--disk", open_dir, "--disk-size", "8M", NULL};
  CHECK(serve_status(world) == 1); /* refused: others may write there */
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* Every bad disk option is refused before the pool is set up: with an
 * 8 GiB pool (pinned, were it reached) each refusal takes well under 1 s.
 * A directory others may write, a size too small for a block, a size
 * larger than the file system (no data file left), a file in place of the
 * directory, a directory another server holds (its lock). */
static void test_bad_disk_options_before_the_pool(void) {
  char open_dir[600], dir[600], file[700], data[700], lock[700];
  snprintf(open_dir, sizeof open_dir, "%s/open8g", ts.dir);
  snprintf(dir, sizeof dir, "%s/d8g", ts.dir);
  snprintf(file, sizeof file, "%s/data", dir);
  snprintf(data, sizeof data, "%s/openinfer-disk.data", dir);
  snprintf(lock, sizeof lock, "%s/openinfer-disk.lock", dir);
  REQUIRE(mkdir(open_dir, 0700) == 0 && chmod(open_dir, 0777) == 0);
  REQUIRE(mkdir(dir, 0700) == 0);
  int fd = open(file, O_WRONLY | O_CREAT, 0600);
  REQUIRE(fd >= 0);
  close(fd);
  const char *world[] = {"--pool", "8G", "--disk", open_dir, "--disk-size", "8M", NULL};
  const char *tiny[] = {"--pool", "8G", "--disk", dir, "--disk-size", "8K", NULL};
  const char *huge[] = {"--pool", "8G", "--disk", dir, "--disk-size", "1000T", NULL};
  const char *not_dir[] = {"--pool", "8G", "--disk", file, "--disk-size", "8M", NULL};
  const char *held[] = {"--pool", "8G", "--disk", dir, "--disk-size", "8M", NULL};
  const char *const *cases[] = {world, tiny, huge, not_dir, held};
  const char *names[] = {"world-writable", "8K", "1000T", "not a directory", "held"};
  for (int i = 0; i < 5; i++) {
    int lfd = -1;
    if (cases[i] == held) { /* this process holds the directory, as a server would */
      lfd = open(lock, O_RDWR | O_CREAT, 0600);
      REQUIRE(lfd >= 0 && flock(lfd, LOCK_EX | LOCK_NB) == 0);
    }
    double t0 = now_s();
    int rc = serve_status(cases[i]);
    double dt = now_s() - t0;
    fprintf(stderr, "  %-16s refused (exit %d) in %.3f s with --pool 8G\n", names[i], rc, dt);
    CHECK(rc == 1);
    CHECK(dt < 1.0);
    if (lfd >= 0) close(lfd);
  }
  CHECK(access(data, F_OK) != 0); /* no data file left by the refusals */
}

/* Two servers on one disk directory: the second is refused (exit 1, the
 * message names the first's pid); once the first is killed with SIGKILL
 * (its lock dies with it), the second starts on the same directory. */
static void test_one_server_per_dir(void) {
  char disk[600];
  snprintf(disk, sizeof disk, "%s/shared-disk", ts.dir);
  REQUIRE(mkdir(disk, 0700) == 0);
  const char *extra[] = {"--disk", disk, "--disk-size", "16M", NULL};
  REQUIRE(ts_start(&ts, extra));
  static test_server tb; /* (registered with ts_atexit: not on the stack) */
  ts_init(&tb, ts.exe);
  CHECK(!ts_start(&tb, extra)); /* refused: it exits before it is ready */
  char pid[64];
  snprintf(pid, sizeof pid, "pid %ld", (long)ts.pid);
  CHECK(ts_log_contains(&tb, pid));
  CHECK(ts_log_contains(&tb, "one server per disk directory"));
  ts_kill(&ts);
  CHECK(ts_start(&tb, extra));
  CHECK(ts_log_contains(&tb, "disk tier attached"));
  CHECK(ts_stop(&tb));
  ts_cleanup(&tb);
}

int main(int argc, char **argv) {
  if (argc < 2) TEST_SKIP("usage: test_disk OPENINFER_EXE");
  ts_init(&ts, argv[1]);
  RUN_TEST(test_disk_survives_a_restart);
  RUN_TEST(test_bad_disk_options);
  RUN_TEST(test_bad_disk_options_before_the_pool);
  RUN_TEST(test_one_server_per_dir);
  ts_cleanup(&ts); /* its directory and the disks' under it */
  TEST_EXIT();
}
