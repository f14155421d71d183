/* The sidecar's load fence and circuit breaker against a real `openinfer
 * serve`, in both memory modes (server-allocated arena; engine-owned memfd):
 *  - a load whose server is stopped (SIGSTOP) past the load deadline, its
 *    copies slowed in the server (copy_slow through OI_FAULTS): the ticket is
 *    OI_FENCING (not final, waits return at once) while stopped; after
 *    SIGCONT the server finishes the copy and answers, and only then the
 *    ticket ends, with OI_ERR_DEADLINE; bytes written into the destination
 *    afterwards never change (every byte checked); loads_failed counts it,
 *    loads_completed does not;
 *  - a stopped server SIGKILLed under a fenced load: the ticket ends once
 *    the process is gone (a zombie, not yet reaped); engine-owned, the
 *    engine degrades; server-allocated, the fatal handler runs, the load
 *    already ended;
 *  - the breaker: a stopped server costs the first membership query its
 *    lookup deadline, the next 100 return a miss in well under 1 ms each
 *    (95th percentile), saves drop and are counted, loads are refused,
 *    flush returns at once; after SIGCONT the engine hits again within 1 s.
 *    The same for a lookup client. */
#include <pthread.h>

#include "../sidecar/sidecar_util.h"
#include "fault_util.h"

#define LOAD_DEADLINE_MS 200
#define COPY_SLOW_MS 400
#define SLACK_MS 1500 /* a shared 2-core machine under sanitizers */

static const char *exe;

static int unresponsive_lines, live_lines, fence_lines;
static void log_handler(void *ctx, oi_log_level level, const char *line) {
  (void)ctx;
  (void)level;
  pthread_mutex_lock(&ts_log_lock);
  if (strstr(line, "is marked unresponsive")) unresponsive_lines++;
  if (strstr(line, "answered a probe")) live_lines++;
  if (strstr(line, "missed its deadline") && strstr(line, "fencing")) fence_lines++;
  pthread_mutex_unlock(&ts_log_lock);
  fprintf(stderr, "%s\n", line);
}

static void fatal_fail(void *ctx, const char *reason) {
  (void)ctx;
  fprintf(stderr, "the fatal handler ran: %s\n", reason);
  _exit(3);
}

static double ms_since(uint64_t t0) { return (double)(oi__now_ns() - t0) / 1e6; }

/* SIGSTOP takes effect asynchronously: waits until the process is stopped. */
static void stop_server(pid_t pid) {
  REQUIRE(kill(pid, SIGSTOP) == 0);
  char path[64], buf[512];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  for (int i = 0; i < 5000; i++) {
    FILE *f = fopen(path, "r");
    REQUIRE(f != NULL);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *paren = strrchr(buf, ')');
    if (paren && paren[1] == ' ' && (paren[2] == 'T' || paren[2] == 't')) return;
    usleep(1000);
  }
  REQUIRE(!"the server did not stop within 5 s");
}

/* ---- an engine in either memory mode -------------------------------------------------- */

typedef struct sc_engine {
  bool owned;
  oi_engine *e;
  oi_imported_arena *arena;
  owned_mem m;
  uint8_t *base;
  oi_arena_desc a[TL_ARENAS];
} sc_engine;

static void sc_connect(sc_engine *s, const test_server *ts, bool owned, const char *ns) {
  memset(s, 0, sizeof *s);
  s->owned = owned;
  oi_engine_options o;
  tl_options(&o, s->a, ns);
  o.load_deadline_ms = LOAD_DEADLINE_MS;
  o.control_deadline_ms = 5000;
  if (owned) {
    uint64_t total;
    tl_arenas(s->a, &total);
    om_alloc(&s->m, (total + 4095) & ~4095ull, true);
    o.arena_base = s->m.base;
    o.arena_size = s->m.size;
    o.arena_fd = s->m.fd;
    REQUIRE(oi_engine_connect(ts->socket, &o, &s->e, NULL) == OI_OK);
    s->base = s->m.base;
  } else {
    REQUIRE(oi_engine_connect(ts->socket, &o, &s->e, &s->arena) == OI_OK);
    s->base = oi_imported_arena_ptr(s->arena);
  }
}

static void sc_close(sc_engine *s) {
  if (s->arena) oi_imported_arena_close(s->arena);
  oi_engine_destroy(s->e);
  if (s->owned) om_free(&s->m);
}

static oi_engine_stats sc_stats(sc_engine *s) {
  oi_engine_stats st;
  memset(&st, 0, sizeof st);
  st.struct_size = sizeof st;
  CHECK_OK(oi_engine_get_stats(s->e, &st));
  return st;
}

/* Saves logical blocks first..first+n-1 from device blocks 0..n-1. */
static void sc_save(sc_engine *s, uint32_t salt, size_t n, oi_block_hash *hs) {
  int64_t src[8];
  for (size_t i = 0; i < n; i++) {
    src[i] = (int64_t)i;
    hs[i] = tl_hash(salt, i);
    tl_fill(s->base, s->a, src[i], i);
  }
  CHECK_OK(tr_save(s->e, src, hs, n, 60000));
}

static oi_status wait_not(oi_ticket *t, oi_status not_this, uint32_t limit_ms) {
  uint64_t t0 = oi__now_ns();
  oi_status st;
  while ((st = oi_ticket_poll(t)) == not_this && ms_since(t0) < limit_ms)
    usleep(2000);
  return st;
}

/* ---- the load fence -------------------------------------------------------------------- */

static void fence_in_mode(bool owned) {
  static test_server ts;
  ts_init(&ts, exe);
  char faults[64];
  snprintf(faults, sizeof faults, "copy_slow:0:0:%d", COPY_SLOW_MS); /* every copy */
  setenv("OI_FAULTS", faults, 1);
  REQUIRE(ts_start(&ts, NULL));
  unsetenv("OI_FAULTS");
  sc_engine s;
  sc_connect(&s, &ts, owned, owned ? "fence-owned" : "fence-arena");
  oi_block_hash hs[4];
  sc_save(&s, 70, 4, hs);
  oi_query_result q = {.struct_size = sizeof q};
  CHECK_OK(oi_engine_query(s.e, NULL, hs, 4, 0, &q));
  REQUIRE(q.hit_blocks == 4);
  oi_engine_stats s0 = sc_stats(&s);

  int64_t dst[4] = {10, 11, 12, 13};
  for (int i = 0; i < 4; i++)
    tl_fill(s.base, s.a, dst[i], 50 + (uint64_t)i); /* what the engine had there */
  oi_ticket *t = NULL;
  uint64_t t0 = oi__now_ns();
  CHECK_OK(oi_engine_load(s.e, q.lease, dst, 4, NULL, &t));
  REQUIRE(t != NULL);
  usleep(50000); /* the server took it; its copy sleeps */
  stop_server(ts.pid);

  /* Past the deadline: fencing, not final; a wait returns at once. */
  CHECK_ST(wait_not(t, OI_PENDING, LOAD_DEADLINE_MS + SLACK_MS), OI_FENCING);
  CHECK(ms_since(t0) >= LOAD_DEADLINE_MS - 20);
  uint64_t w0 = oi__now_ns();
  CHECK_ST(oi_ticket_wait(t, 10000), OI_ERR_TIMEOUT);
  CHECK(ms_since(w0) < 1000); /* at once (generous: a slow machine) */
  CHECK(strstr(oi_last_error(), "OI_FENCING") != NULL);
  usleep(COPY_SLOW_MS * 1000 * 2); /* stopped well past the copy's own length */
  CHECK_ST(oi_ticket_poll(t), OI_FENCING);
  CHECK(ts_log_count(&fence_lines) >= 1);
  /* The breaker opened with the miss: a load is refused, counted failed. */
  oi_ticket *t2 = NULL;
  CHECK_ST(oi_engine_load(s.e, q.lease, dst, 4, NULL, &t2), OI_ERR_CLOSED);
  CHECK(strstr(oi_last_error(), "unresponsive") != NULL);
  CHECK(t2 == NULL);

  /* SIGCONT: the server finishes its copy, answers; only then it ends. */
  REQUIRE(kill(ts.pid, SIGCONT) == 0);
  CHECK_ST(wait_not(t, OI_FENCING, COPY_SLOW_MS + SLACK_MS * 2), OI_ERR_DEADLINE);
  CHECK_ST(oi_ticket_wait(t, 0), OI_ERR_DEADLINE);
  for (int i = 0; i < 4; i++) /* the late copy landed before the ticket ended */
    CHECK(tl_check(s.base, s.a, dst[i], (uint64_t)i));
  oi_ticket_release(t);
  /* The blocks are the caller's again: what it writes stays. */
  for (int i = 0; i < 4; i++)
    tl_fill(s.base, s.a, dst[i], 500 + (uint64_t)i);
  usleep(COPY_SLOW_MS * 1000 * 2);
  for (int i = 0; i < 4; i++)
    CHECK(tl_check(s.base, s.a, dst[i], 500 + (uint64_t)i));

  /* The caller's view: 2 failed (fenced, refused), none completed. */
  for (int i = 0; i < 200 && sc_stats(&s).connection != OI_CONNECTION_CONNECTED; i++)
    usleep(10000);
  oi_engine_stats s1 = sc_stats(&s);
  CHECK(s1.connection == OI_CONNECTION_CONNECTED);
  CHECK(s1.loads_failed == s0.loads_failed + 2);
  CHECK(s1.loads_completed == s0.loads_completed);
  sc_close(&s);
  CHECK(ts_stop(&ts));
  ts_cleanup(&ts);
}

static void test_fence_server_allocated(void) { fence_in_mode(false); }
static void test_fence_engine_owned(void) { fence_in_mode(true); }

/* Engine-owned: the stopped server is killed under a fenced load; the
 * ticket ends once the process is gone (here a zombie: not reaped yet). */
static void test_fence_ends_when_the_server_is_gone(void) {
  static test_server ts;
  ts_init(&ts, exe);
  char faults[64];
  snprintf(faults, sizeof faults, "copy_slow:0:0:%d", COPY_SLOW_MS);
  setenv("OI_FAULTS", faults, 1);
  REQUIRE(ts_start(&ts, NULL));
  unsetenv("OI_FAULTS");
  sc_engine s;
  sc_connect(&s, &ts, true, "fence-killed");
  oi_block_hash hs[4];
  sc_save(&s, 71, 4, hs);
  oi_query_result q = {.struct_size = sizeof q};
  CHECK_OK(oi_engine_query(s.e, NULL, hs, 4, 0, &q));
  REQUIRE(q.hit_blocks == 4);
  int64_t dst[4] = {20, 21, 22, 23};
  oi_ticket *t = NULL;
  CHECK_OK(oi_engine_load(s.e, q.lease, dst, 4, NULL, &t));
  usleep(50000);
  pid_t pid = ts.pid;
  stop_server(pid);
  CHECK_ST(wait_not(t, OI_PENDING, LOAD_DEADLINE_MS + SLACK_MS), OI_FENCING);
  REQUIRE(kill(pid, SIGKILL) == 0);
  uint64_t k0 = oi__now_ns();
  CHECK_ST(wait_not(t, OI_FENCING, SLACK_MS), OI_ERR_DEADLINE);
  fprintf(stderr, "the fenced load ended %.1f ms after the server's SIGKILL\n", ms_since(k0));
  /* The server is gone: its socket closed as it died, and it has exited (the
   * kernel closes a dying process's files before it marks it exited: under
   * load that takes a moment, so give it one second). */
  siginfo_t si;
  memset(&si, 0, sizeof si);
  for (int i = 0; i < 100 && si.si_pid != pid; i++) {
    if (waitid(P_PID, (id_t)pid, &si, WEXITED | WNOHANG | WNOWAIT) != 0) break;
    if (si.si_pid != pid) usleep(10000);
  }
  CHECK(si.si_pid == pid);
  oi_ticket_release(t);
  ts_kill(&ts); /* reaps it */
  for (int i = 0; i < 4; i++)
    tl_fill(s.base, s.a, dst[i], 600 + (uint64_t)i);
  usleep(300000);
  for (int i = 0; i < 4; i++)
    CHECK(tl_check(s.base, s.a, dst[i], 600 + (uint64_t)i));
  sc_close(&s);
  ts_cleanup(&ts);
}

/* Server-allocated: the stopped server SIGKILLed under a fenced load: the
 * fatal handler runs (the arena's memory is gone), and by then the load has
 * ended (the server is gone: nothing can land). In a child process. */
static oi_ticket *child_ticket;
static void fatal_in_child(void *ctx, const char *reason) {
  (void)ctx;
  (void)reason;
  _exit(oi_ticket_poll(child_ticket) == OI_ERR_DEADLINE ? 42 : 43);
}

static int fenced_child(const test_server *ts, int fd) {
  signal(SIGPIPE, SIG_IGN);
  oi_set_fatal_handler(fatal_in_child, NULL);
  sc_engine s;
  sc_connect(&s, ts, false, "fence-fatal");
  oi_block_hash hs[4];
  sc_save(&s, 75, 4, hs);
  oi_query_result q = {.struct_size = sizeof q};
  if (oi_engine_query(s.e, NULL, hs, 4, 0, &q) != OI_OK || q.hit_blocks != 4) return 2;
  int64_t dst[4] = {20, 21, 22, 23};
  if (oi_engine_load(s.e, q.lease, dst, 4, NULL, &child_ticket) != OI_OK) return 3;
  char c = 'L';
  if (write(fd, &c, 1) != 1) return 4; /* the parent stops the server */
  if (wait_not(child_ticket, OI_PENDING, LOAD_DEADLINE_MS + SLACK_MS) != OI_FENCING) return 5;
  c = 'F';
  if (write(fd, &c, 1) != 1) return 4; /* the parent kills it */
  sleep(20);
  return 6; /* the watchdog never ran */
}

static void test_fenced_load_then_fatal_when_server_allocated(void) {
  static test_server ts;
  ts_init(&ts, exe);
  char faults[64];
  snprintf(faults, sizeof faults, "copy_slow:0:0:%d", COPY_SLOW_MS);
  setenv("OI_FAULTS", faults, 1);
  REQUIRE(ts_start(&ts, NULL));
  unsetenv("OI_FAULTS");
  int p[2];
  pid_t child = tr_fork_pipe(p);
  if (child == 0) {
    _exit(fenced_child(&ts, p[1]));
  }
  char c = 0;
  CHECK(read(p[0], &c, 1) == 1 && c == 'L');
  usleep(50000);
  stop_server(ts.pid);
  CHECK(read(p[0], &c, 1) == 1 && c == 'F');
  pid_t pid = ts.pid;
  kill(pid, SIGKILL);
  int status = 0;
  CHECK(waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 42);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 42)
    fprintf(stderr, "the client's status is 0x%x\n", status);
  close(p[0]);
  ts_kill(&ts);
  ts_cleanup(&ts);
}

/* ---- the breaker -------------------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* 100 calls' times: median and 95th percentile. */
static void percentiles(double *v, int n, double *p50, double *p95) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  *p50 = v[n / 2];
  *p95 = v[(n * 95) / 100];
}

static void breaker_in_mode(bool owned) {
  static test_server ts;
  ts_init(&ts, exe);
  REQUIRE(ts_start(&ts, NULL));
  sc_engine s;
  sc_connect(&s, &ts, owned, owned ? "breaker-owned" : "breaker-arena");
  oi_block_hash hs[4];
  sc_save(&s, 72, 4, hs);
  uint8_t present[4];
  oi_query_result q = {.struct_size = sizeof q, .present = present};
  CHECK_OK(oi_engine_query(s.e, NULL, hs, 4, OI_QUERY_MEMBERSHIP, &q));
  REQUIRE(q.hit_blocks == 4);
  oi_engine_stats s0 = sc_stats(&s);
  int lines0 = ts_log_count(&unresponsive_lines);

  stop_server(ts.pid);
  /* The first membership query waits its lookup deadline (50 ms). */
  uint64_t t0 = oi__now_ns();
  q.present = present;
  CHECK_ST(oi_engine_query(s.e, NULL, hs, 4, OI_QUERY_MEMBERSHIP, &q), OI_ERR_TIMEOUT);
  double first = ms_since(t0);
  CHECK(first >= 45 && first < 50 + SLACK_MS);
  CHECK(strstr(oi_last_error(), "membership query of 4 hashes: no reply") != NULL);
  /* The next 100: a miss each, without a round trip. */
  double v[100];
  for (int i = 0; i < 100; i++) {
    memset(present, 0xEE, sizeof present);
    q.present = present;
    uint64_t c0 = oi__now_ns();
    CHECK_OK(oi_engine_query(s.e, NULL, hs, 4, OI_QUERY_MEMBERSHIP, &q));
    v[i] = ms_since(c0);
    CHECK(q.hit_blocks == 0 && present[0] == 0 && present[3] == 0);
  }
  double p50, p95;
  percentiles(v, 100, &p50, &p95);
  fprintf(stderr,
          "%s: hung server: first query %.1f ms; the next 100: median %.4f ms, p95 %.4f ms\n",
          owned ? "engine-owned" : "server-allocated", first, p50, p95);
  CHECK(p95 <= 1.0);
  /* Saves drop (counted), loads are refused, flush returns at once. */
  int64_t src[2] = {4, 5};
  oi_block_hash h2[2] = {tl_hash(73, 0), tl_hash(73, 1)};
  oi_save_result res = {.struct_size = sizeof res};
  oi_save_options so;
  oi_save_options_init(&so);
  so.result = &res;
  oi_ticket *t = NULL;
  uint64_t c0 = oi__now_ns();
  CHECK_OK(oi_engine_save(s.e, src, h2, 2, &so, &t));
  CHECK(ms_since(c0) < 50);
  CHECK(res.dropped == 2 && res.accepted == 0);
  CHECK_OK(oi_ticket_wait(t, 0));
  oi_ticket_release(t);
  oi_lease lease;
  memset(lease.bytes, 0xAB, sizeof lease.bytes);
  int64_t dst[2] = {20, 21};
  c0 = oi__now_ns();
  CHECK_ST(oi_engine_load(s.e, lease, dst, 2, NULL, &t), OI_ERR_CLOSED);
  CHECK(strstr(oi_last_error(), "unresponsive") != NULL);
  CHECK_ST(oi_engine_flush(s.e, 60000), OI_ERR_TIMEOUT);
  CHECK(ms_since(c0) < 50);
  oi_engine_stats s1 = sc_stats(&s); /* no round trip either */
  CHECK(s1.connection == OI_CONNECTION_DEGRADED);
  CHECK(s1.disconnected_query_misses == s0.disconnected_query_misses + 400);
  CHECK(s1.disconnected_saves == s0.disconnected_saves + 2);
  CHECK(s1.loads_failed == s0.loads_failed + 1);
  CHECK(ts_log_count(&unresponsive_lines) == lines0 + 1); /* once per opening */

  /* SIGCONT: a probe is answered and the engine hits again within 1 s. */
  int live0 = ts_log_count(&live_lines);
  REQUIRE(kill(ts.pid, SIGCONT) == 0);
  uint64_t r0 = oi__now_ns();
  bool hit = false;
  while (!hit && ms_since(r0) < 1000 + SLACK_MS) {
    q.present = present;
    hit = oi_engine_query(s.e, NULL, hs, 4, OI_QUERY_MEMBERSHIP, &q) == OI_OK && q.hit_blocks == 4;
    if (!hit) usleep(1000);
  }
  double recovery = ms_since(r0);
  fprintf(stderr, "%s: hits again %.1f ms after SIGCONT\n",
          owned ? "engine-owned" : "server-allocated", recovery);
  CHECK(hit && recovery < 1000);
  CHECK(ts_log_count(&live_lines) == live0 + 1);
  sc_close(&s);
  CHECK(ts_stop(&ts));
  ts_cleanup(&ts);
}

static void test_breaker_server_allocated(void) { breaker_in_mode(false); }
static void test_breaker_engine_owned(void) { breaker_in_mode(true); }

static void test_breaker_lookup_client(void) {
  static test_server ts;
  ts_init(&ts, exe);
  REQUIRE(ts_start(&ts, NULL));
  sc_engine s;
  sc_connect(&s, &ts, false, "breaker-lookup");
  oi_block_hash hs[4];
  sc_save(&s, 74, 4, hs);
  oi_lookup_options lo;
  oi_lookup_options_init(&lo);
  CHECK(lo.lookup_deadline_ms == 50 && lo.probe_interval_ms == 100);
  lo.namespace_id = "breaker-lookup";
  oi_lookup *c = NULL;
  REQUIRE(oi_lookup_connect(ts.socket, &lo, &c) == OI_OK);
  oi_query_result q = {.struct_size = sizeof q};
  CHECK_OK(oi_lookup_query(c, NULL, hs, 4, 0, &q));
  CHECK(q.hit_blocks == 4);
  CHECK_OK(oi_lookup_release(c, q.lease));

  stop_server(ts.pid);
  uint64_t t0 = oi__now_ns();
  CHECK_ST(oi_lookup_query(c, NULL, hs, 4, 0, &q), OI_ERR_TIMEOUT);
  double first = ms_since(t0);
  CHECK(first >= 45 && first < 50 + SLACK_MS);
  CHECK(strstr(oi_last_error(), "lookup of 4 hashes: no reply") != NULL);
  double v[100];
  for (int i = 0; i < 100; i++) {
    uint64_t c0 = oi__now_ns();
    CHECK_OK(oi_lookup_query(c, NULL, hs, 4, 0, &q));
    v[i] = ms_since(c0);
    CHECK(q.hit_blocks == 0);
  }
  double p50, p95;
  percentiles(v, 100, &p50, &p95);
  fprintf(stderr,
          "lookup client: hung server: first query %.1f ms; the next 100: median %.4f ms, "
          "p95 %.4f ms\n",
          first, p50, p95);
  CHECK(p95 <= 1.0);
  REQUIRE(kill(ts.pid, SIGCONT) == 0);
  uint64_t r0 = oi__now_ns();
  bool hit = false;
  while (!hit && ms_since(r0) < 1000 + SLACK_MS) {
    hit = oi_lookup_query(c, NULL, hs, 4, 0, &q) == OI_OK && q.hit_blocks == 4;
    if (!hit) usleep(1000);
  }
  double recovery = ms_since(r0);
  fprintf(stderr, "lookup client: hits again %.1f ms after SIGCONT\n", recovery);
  CHECK(hit && recovery < 1000);
  if (hit) CHECK_OK(oi_lookup_release(c, q.lease));
  oi_lookup_destroy(c);
  sc_close(&s);
  CHECK(ts_stop(&ts));
  ts_cleanup(&ts);
}

/* Options: 0 is refused, naming the field. */
static void test_breaker_options(void) {
  oi_lookup_options lo;
  oi_lookup_options_init(&lo);
  lo.namespace_id = "x";
  lo.lookup_deadline_ms = 0;
  oi_lookup *c = NULL;
  CHECK_ST(oi_lookup_connect("/nonexistent/oi.sock", &lo, &c), OI_ERR_INVALID_ARGUMENT);
  CHECK(strstr(oi_last_error(), "lookup_deadline_ms is 0") != NULL);
  lo.lookup_deadline_ms = 50;
  lo.probe_interval_ms = 0;
  CHECK_ST(oi_lookup_connect("/nonexistent/oi.sock", &lo, &c), OI_ERR_INVALID_ARGUMENT);
  CHECK(strstr(oi_last_error(), "probe_interval_ms is 0") != NULL);
  oi_arena_desc a[TL_ARENAS];
  oi_engine_options o;
  tl_options(&o, a, "x");
  CHECK(o.lookup_deadline_ms == 50 && o.probe_interval_ms == 100);
  o.probe_interval_ms = 0;
  oi_engine *e = NULL;
  oi_imported_arena *ar = NULL;
  CHECK_ST(oi_engine_connect("/nonexistent/oi.sock", &o, &e, &ar), OI_ERR_INVALID_ARGUMENT);
  CHECK(strstr(oi_last_error(), "probe_interval_ms is 0") != NULL);
}

int main(int argc, char **argv) {
  REQUIRE_FAULTS();
  if (argc < 2) TEST_SKIP("usage: test_sidecar_fence OPENINFER_EXE");
  exe = argv[1];
  signal(SIGPIPE, SIG_IGN);
  oi_set_log_handler(log_handler, NULL);
  oi_set_fatal_handler(fatal_fail, NULL);
  RUN_TEST(test_breaker_options);
  RUN_TEST(test_fence_server_allocated);
  RUN_TEST(test_fence_engine_owned);
  RUN_TEST(test_fence_ends_when_the_server_is_gone);
  RUN_TEST(test_fenced_load_then_fatal_when_server_allocated);
  RUN_TEST(test_breaker_server_allocated);
  RUN_TEST(test_breaker_engine_owned);
  RUN_TEST(test_breaker_lookup_client);
  TEST_EXIT();
}
