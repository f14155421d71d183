/* Engine-owned memory in sidecar mode (cpu backend): the client's arena is a
 * sealed memfd it allocated itself, passed to the server over the socket.
 *  - a round trip is byte-exact, the server allocates nothing;
 *  - bad memory is refused with a specific status (unsealed, too small, no
 *    fd, an fd without arena_base, an fd given to an embedded engine, and
 *    the raw wire forms), and the session goes on;
 *  - the server is SIGKILLed under a running client: the client degrades
 *    (queries miss, saves drop, loads fail with OI_ERR_CLOSED, never the
 *    fatal handler), then reconnects to a server restarted on the same
 *    socket (a new epoch in oi_engine_stats, a log line) and saves and
 *    loads byte-exact again; old leases are invalid;
 *  - a degraded engine is destroyed promptly (its reconnect thread stops). */
#include <pthread.h>
#include <stdatomic.h>
#include <sys/mman.h>

#include "sidecar_util.h"

static test_server ts;

/* ---- the fatal handler must never run; log lines are kept ---------------------- */

static atomic_int fatal_calls;
static void fatal_fail(void *ctx, const char *reason) {
  (void)ctx;
  fprintf(stderr, "the fatal handler ran: %s\n", reason);
  atomic_fetch_add(&fatal_calls, 1);
  _exit(3);
}

static int reconnect_lines, degrade_lines;
static void log_capture(void *ctx, oi_log_level level, const char *line) {
  (void)ctx;
  (void)level;
  pthread_mutex_lock(&ts_log_lock);
  if (strstr(line, "reconnected to")) reconnect_lines++;
  if (strstr(line, "went away")) degrade_lines++;
  pthread_mutex_unlock(&ts_log_lock);
  fprintf(stderr, "%s\n", line);
}

static void owned_options(oi_engine_options *o, oi_arena_desc a[TL_ARENAS], const char *ns,
                          const owned_mem *m) {
  tl_options(o, a, ns);
  o->arena_base = m->base;
  o->arena_size = m->size;
  o->arena_fd = m->fd;
  o->control_deadline_ms = 5000;
}

static oi_status stats_of(oi_engine *e, oi_engine_stats *s) {
  memset(s, 0, sizeof *s);
  s->struct_size = sizeof *s;
  return oi_engine_get_stats(e, s);
}

/* Waits up to 20 s for the engine's connection state. */
static bool wait_connection(oi_engine *e, uint32_t state, oi_engine_stats *s) {
  for (int i = 0; i < 2000; i++) {
    if (stats_of(e, s) == OI_OK && s->connection == state) return true;
    usleep(10000);
  }
  return false;
}

/* Saves logical blocks [first, first + n) from device blocks [0, n) under
 * `salt`, waits for them, then queries, loads into [n, 2n) and compares. */
static void round_trip(oi_engine *e, const owned_mem *m, const oi_arena_desc *a, uint32_t salt,
                       uint64_t first, int n) {
  int64_t ids[8], dst[8];
  oi_block_hash h[8];
  REQUIRE(n <= 8 && 2 * n <= TL_BLOCKS);
  for (int i = 0; i < n; i++) {
    ids[i] = i;
    dst[i] = n + i;
    h[i] = tl_hash(salt, first + (uint64_t)i);
    tl_fill(m->base, a, i, first + (uint64_t)i);
    memset(m->base + a[0].offset + (uint64_t)dst[i] * a[0].block_stride, 0, 1);
  }
  oi_ticket *t = NULL;
  CHECK_OK(oi_engine_save(e, ids, h, (size_t)n, NULL, &t));
  if (t) CHECK_OK(oi_ticket_wait(t, 10000));
  oi_ticket_release(t);
  CHECK_OK(oi_engine_flush(e, 10000));
  oi_query_result q = {.struct_size = sizeof q};
  CHECK_OK(oi_engine_query(e, NULL, h, (size_t)n, 0, &q));
  CHECK(q.hit_blocks == (uint64_t)n);
  if (q.hit_blocks != (uint64_t)n) return;
  t = NULL;
  CHECK_OK(oi_engine_load(e, q.lease, dst, (size_t)n, NULL, &t));
  if (t) CHECK_OK(oi_ticket_wait(t, 10000));
  oi_ticket_release(t);
  for (int i = 0; i < n; i++)
    CHECK(tl_check(m->base, a, dst[i], first + (uint64_t)i));
}

static void test_round_trip_byte_exact(void) {
  REQUIRE(ts_start(&ts, NULL));
  owned_mem m;
  uint64_t total;
  oi_arena_desc a[TL_ARENAS];
  tl_arenas(a, &total);
  om_alloc(&m, total + 100, true);
  oi_engine_options o;
  owned_options(&o, a, "owned-rt", &m);
  oi_engine *e = NULL;
  oi_imported_arena *arena = (oi_imported_arena *)&m; /* must be set to NULL */
  CHECK_OK(oi_engine_connect(ts.socket, &o, &e, &arena));
  CHECK(arena == NULL);
  REQUIRE(e != NULL);
  round_trip(e, &m, a, 1, 0, 6);
  oi_engine_stats s;
  CHECK_OK(stats_of(e, &s));
  CHECK(s.connection == OI_CONNECTION_CONNECTED);
  CHECK(s.server_epoch != 0);
  CHECK(s.reconnects == 0);
  CHECK(s.saves_completed == 6);
  /* The server allocated no arena for it. */
  wire_client c;
  REQUIRE(wc_connect(&c, ts.socket) && wc_hello(&c, NULL));
  oiwire_StatsReply sr;
  REQUIRE(wc_server_stats(&c, &sr));
  CHECK(sr.instances == 1);
  CHECK(sr.arena_bytes == 0);
  CHECK(sr.server_epoch == s.server_epoch);
  /* arena_out is optional here. */
  oi_engine *e2 = NULL;
  CHECK_OK(oi_engine_connect(ts.socket, &o, &e2, NULL));
  oi_engine_destroy(e2);
  oi_engine_destroy(e);
  CHECK(WAIT_FOR_STATS(&c, sr, sr.instances == 0));
  CHECK(ts_log_contains(&ts, "unmapped its"));
  wc_close(&c);
  om_free(&m);
  CHECK(ts_stop(&ts));
}

/* Mappings of the process `pid` whose line names `what`. */
static int server_maps(pid_t pid, const char *what) {
  char path[64], line[512];
  snprintf(path, sizeof path, "/proc/%d/maps", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  int n = 0;
  while (fgets(line, sizeof line, f))
    n += strstr(line, what) != NULL;
  fclose(f);
  return n;
}

/* server_maps once it reaches `want`, or its last count after 5 s: the
 * server may answer a refused registration before it unmaps the memory. */
static int server_maps_settles(pid_t pid, const char *what, int want) {
  int n = server_maps(pid, what);
  for (int i = 0; i < 500 && n != want; i++) {
    usleep(10000);
    n = server_maps(pid, what);
  }
  return n;
}

static void test_bad_memory_is_refused(void) {
  REQUIRE(ts_start(&ts, NULL));
  uint64_t total;
  oi_arena_desc a[TL_ARENAS];
  tl_arenas(a, &total);
  oi_engine_options o;
  oi_engine *e = NULL;

  owned_mem unsealed;
  om_alloc(&unsealed, total, false);
  owned_options(&o, a, "owned-bad", &unsealed);
  CHECK_ST(oi_engine_connect(ts.socket, &o, &e, NULL), OI_ERR_INVALID_ARGUMENT);
  CHECK(strstr(oi_last_error(), "F_SEAL_SHRINK") != NULL);
  CHECK(e == NULL);

  owned_mem small;
  om_alloc(&small, total / 2, true);
  owned_options(&o, a, "owned-bad", &small);
  o.arena_size = total; /* the memfd holds half */
  CHECK_ST(oi_engine_connect(ts.socket, &o, &e, NULL), OI_ERR_INVALID_ARGUMENT);
  CHECK(strstr(oi_last_error(), "holds") != NULL);

  owned_mem good;
  om_alloc(&good, total + 8192, true);
  /* arena_base must be the memfd's shared mapping from offset 0. */
  owned_options(&o, a, "owned-bad", &good);
  o.arena_base = small.base; /* another memfd's memory */
  o.arena_size = total / 2;
  o.num_arenas = 1;
  a[0].num_blocks = 2;
  CHECK_ST(oi_engine_connect(ts.socket, &o, &e, NULL), OI_ERR_INVALID_ARGUMENT);
  CHECK(strstr(oi_last_error(), "not a read-write MAP_SHARED mapping") != NULL);
  tl_arenas(a, &total);
  owned_options(&o, a, "owned-bad", &good);
  o.arena_base = good.base + 4096; /* file offset 4096, not 0 */
  o.arena_size = total;
  CHECK_ST(oi_engine_connect(ts.socket, &o, &e, NULL), OI_ERR_INVALID_ARGUMENT);
  uint8_t *heap = malloc(total);
  REQUIRE(heap);
  o.arena_base = heap; /* not the memfd at all */
  CHECK_ST(oi_engine_connect(ts.socket, &o, &e, NULL), OI_ERR_INVALID_ARGUMENT);
  free(heap);
  owned_options(&o, a, "owned-bad", &good);
  o.arena_fd = -1; /* no fd */
  CHECK_ST(oi_engine_connect(ts.socket, &o, &e, NULL), OI_ERR_INVALID_ARGUMENT);
  owned_options(&o, a, "owned-bad", &good);
  o.arena_base = NULL; /* an fd without arena_base */
  oi_imported_arena *arena = NULL;
  CHECK_ST(oi_engine_connect(ts.socket, &o, &e, &arena), OI_ERR_INVALID_ARGUMENT);
  tl_options(&o, a, "owned-bad");
  CHECK_ST(oi_engine_connect(ts.socket, &o, &e, NULL), OI_ERR_INVALID_ARGUMENT);
  owned_options(&o, a, "owned-bad", &good);
  o.arena_size = total - 1; /* the layout reaches past arena_size */
  CHECK_ST(oi_engine_connect(ts.socket, &o, &e, NULL), OI_ERR_INVALID_ARGUMENT);
  /* An embedded engine takes no arena_fd. */
  oi_host_options ho = tr_host_options(8 << 20);
  ho.flags = OI_HOST_NO_PIN;
  oi_host *h = tr_host_new(&ho);
  owned_options(&o, a, "owned-bad", &good);
  CHECK_ST(oi_engine_create(h, &o, &e), OI_ERR_INVALID_ARGUMENT);
  oi_host_destroy(h);

  /* The raw wire: client_owned without an fd, with a handle on cpu, a
   * handle without client_owned; the session goes on after each. */
  wire_client c;
  REQUIRE(wc_connect(&c, ts.socket) && wc_hello(&c, NULL));
  for (int k = 0; k < 3; k++) {
    oiwire_Envelope env;
    memset(&env, 0, sizeof env);
    env.which_body = oiwire_Envelope_register_instance_tag;
    oiwire_Register *r = &env.body.register_instance;
    snprintf(r->namespace_id, sizeof r->namespace_id, "owned-wire");
    r->device = OI_DEVICE_CPU;
    r->world_size = 1;
    r->arena_size = total;
    r->client_owned = k != 2;
    if (k >= 1) r->client_handle.size = 64;
    oi_wire_out out = {.arenas = a, .n_arenas = TL_ARENAS};
    REQUIRE(wc_call(&c, &env, &out));
    CHECK(wc_status(&c) == OI_ERR_INVALID_ARGUMENT);
  }
  /* An fd that is not a memfd, sent with an engine-owned register. */
  {
    oiwire_Envelope env;
    memset(&env, 0, sizeof env);
    env.which_body = oiwire_Envelope_register_instance_tag;
    env.request_id = 99;
    oiwire_Register *r = &env.body.register_instance;
    snprintf(r->namespace_id, sizeof r->namespace_id, "owned-wire");
    r->device = OI_DEVICE_CPU;
    r->world_size = 1;
    r->arena_size = total;
    r->client_owned = true;
    oi_wire_out out = {.arenas = a, .n_arenas = TL_ARENAS};
    uint8_t *frame;
    size_t len;
    REQUIRE(oi__wire_encode(&env, &out, &frame, &len) == OI_OK);
    int pfd[2];
    REQUIRE(pipe(pfd) == 0);
    REQUIRE(oi__wire_send_fd(c.fd, frame, len, pfd[0]) == OI_OK);
    oi__free(frame);
    close(pfd[0]);
    close(pfd[1]);
    REQUIRE(wc_recv(&c, 5000) == OI_OK);
    CHECK(c.env.request_id == 99 && wc_status(&c) == OI_ERR_INVALID_ARGUMENT);
  }
  /* An engine-owned arena whose engine the server cannot create (its
   * namespace serves the same block size in another shape): refused with
   * the host's reason, and the server unmaps the client's memory. */
  {
    TL_CLIENT(a1, o1, first, fa);
    tl_options(&o1, a1, "owned-shape");
    first = NULL;
    fa = NULL;
    CHECK_OK(oi_engine_connect(ts.socket, &o1, &first, &fa));
    CHECK(server_maps(ts.pid, "memfd:oi-test-arena") == 0);
    owned_options(&o, a, "owned-shape", &good);
    o.num_arenas = 1;
    a[0] = (oi_arena_desc){.name = "flat",
                           .num_blocks = TL_BLOCKS,
                           .bytes_per_block = 256 * 2 + 384 + 96, /* the same block size */
                           .block_stride = 1024,
                           .segments = 1};
    CHECK_ST(oi_engine_connect(ts.socket, &o, &e, NULL), OI_ERR_INVALID_ARGUMENT);
    CHECK(e == NULL && strstr(oi_last_error(), "another shape"));
    CHECK(server_maps_settles(ts.pid, "memfd:oi-test-arena", 0) == 0);
    oi_imported_arena_close(fa);
    oi_engine_destroy(first);
    tl_arenas(a, &total);
  }
  oiwire_StatsReply sr;
  CHECK(wc_server_stats(&c, &sr)); /* the session lives on */
  CHECK(sr.instances == 0);
  wc_close(&c);
  om_free(&unsealed);
  om_free(&small);
  om_free(&good);
  CHECK(ts_stop(&ts));
}

/* ---- the server dies under a running client -------------------------------------- */

typedef struct worker {
  oi_engine *e;
  atomic_bool stop;
  atomic_int bad; /* a status a degraded engine must never return */
  atomic_int saves, queries;
  atomic_int done_calls;
} worker;

static void on_save_done(void *ctx, oi_status st) {
  worker *w = ctx;
  atomic_fetch_add(&w->done_calls, 1);
  (void)st; /* OI_OK, or OI_ERR_CLOSED for a save in flight when the server died */
}

/* Saves and queries device blocks 24..27 in a loop, as an engine would. */
static void *worker_main(void *arg) {
  worker *w = arg;
  uint64_t round = 0;
  while (!atomic_load(&w->stop)) {
    int64_t ids[4] = {24, 25, 26, 27};
    oi_block_hash h[4];
    for (int i = 0; i < 4; i++)
      h[i] = tl_hash(77, round * 4 + (uint64_t)i);
    oi_save_options so;
    oi_save_options_init(&so);
    so.on_done = on_save_done;
    so.on_done_ctx = w;
    oi_ticket *t = NULL;
    oi_status st = oi_engine_save(w->e, ids, h, 4, &so, &t);
    if (st != OI_OK) {
      fprintf(stderr, "worker: save returned %s: %s\n", oi_status_str(st), oi_last_error());
      atomic_fetch_add(&w->bad, 1);
    } else {
      st = oi_ticket_wait(t, 20000);
      if (st != OI_OK && st != OI_ERR_CLOSED) atomic_fetch_add(&w->bad, 1);
      oi_ticket_release(t);
      atomic_fetch_add(&w->saves, 1);
    }
    uint8_t present[4];
    oi_query_result q = {.struct_size = sizeof q, .present = present};
    st = oi_engine_query(w->e, NULL, h, 4, OI_QUERY_MEMBERSHIP, &q);
    if (st != OI_OK) {
      fprintf(stderr, "worker: query returned %s: %s\n", oi_status_str(st), oi_last_error());
      atomic_fetch_add(&w->bad, 1);
    }
    atomic_fetch_add(&w->queries, 1);
    round++;
    usleep(2000);
  }
  return NULL;
}

/* An engine of namespace ns connected, engine-owned, over fresh sealed
 * memory *m of the test layout (its arenas in a); REQUIREs success. */
static oi_engine *owned_connect(const char *ns, oi_arena_desc a[TL_ARENAS], owned_mem *m) {
  uint64_t total;
  tl_arenas(a, &total);
  om_alloc(m, total, true);
  oi_engine_options o;
  owned_options(&o, a, ns, m);
  oi_engine *e = NULL;
  REQUIRE(oi_engine_connect(ts.socket, &o, &e, NULL) == OI_OK);
  return e;
}

static void test_server_killed_degrade_and_reconnect(void) {
  REQUIRE(ts_start(&ts, NULL));
  owned_mem m;
  oi_arena_desc a[TL_ARENAS];
  oi_engine *e = owned_connect("owned-kill", a, &m);
  round_trip(e, &m, a, 2, 0, 4);
  oi_engine_stats s;
  REQUIRE(stats_of(e, &s) == OI_OK);
  uint64_t epoch1 = s.server_epoch;
  CHECK(s.connection == OI_CONNECTION_CONNECTED && epoch1 != 0);
  /* A lease of the first epoch, kept across the kill. */
  oi_block_hash h[4];
  for (int i = 0; i < 4; i++)
    h[i] = tl_hash(2, (uint64_t)i);
  oi_query_result q = {.struct_size = sizeof q};
  CHECK_OK(oi_engine_query(e, NULL, h, 4, 0, &q));
  CHECK(q.hit_blocks == 4);
  oi_lease old_lease = q.lease;

  worker w;
  memset(&w, 0, sizeof w);
  w.e = e;
  pthread_t th;
  REQUIRE(pthread_create(&th, NULL, worker_main, &w) == 0);
  usleep(100000);

  ts_kill(&ts); /* SIGKILL under the running worker */
  CHECK(wait_connection(e, OI_CONNECTION_DEGRADED, &s));
  CHECK(s.server_epoch == 0);
  for (int i = 0; i < 200 && ts_log_count(&degrade_lines) < 1; i++) /* logged after the state */
    usleep(10000);
  CHECK(ts_log_count(&degrade_lines) >= 1);
  /* Degraded: queries miss, saves drop, loads fail, release: expired. */
  oi_query_result miss = {.struct_size = sizeof miss};
  CHECK_OK(oi_engine_query(e, NULL, h, 4, 0, &miss));
  CHECK(miss.hit_blocks == 0);
  static const oi_lease zero;
  CHECK(memcmp(&miss.lease, &zero, sizeof zero) == 0);
  uint8_t present[4] = {1, 1, 1, 1};
  oi_query_result mq = {.struct_size = sizeof mq, .present = present};
  CHECK_OK(oi_engine_query(e, NULL, h, 4, OI_QUERY_MEMBERSHIP, &mq));
  CHECK(mq.hit_blocks == 0 && present[0] == 0 && present[3] == 0);
  int64_t ids[2] = {0, 1};
  oi_ticket *t = NULL;
  int before = atomic_load(&w.done_calls);
  oi_save_options so;
  oi_save_options_init(&so);
  so.on_done = on_save_done;
  so.on_done_ctx = &w;
  CHECK_OK(oi_engine_save(e, ids, h, 2, &so, &t));
  CHECK(t != NULL && oi_ticket_poll(t) == OI_OK); /* completed at once: nothing to copy */
  CHECK(atomic_load(&w.done_calls) > before);
  oi_ticket_release(t);
  int64_t dst[4] = {8, 9, 10, 11};
  t = NULL;
  CHECK_ST(oi_engine_load(e, old_lease, dst, 4, NULL, &t), OI_ERR_CLOSED);
  CHECK(t == NULL);
  CHECK_ST(oi_engine_release(e, old_lease), OI_ERR_LEASE_EXPIRED);
  CHECK_OK(oi_engine_flush(e, 1000));
  CHECK_OK(stats_of(e, &s));
  CHECK(s.connection == OI_CONNECTION_DEGRADED);
  CHECK(s.disconnected_saves >= 2);
  CHECK(s.disconnected_query_misses >= 8);
  CHECK(s.block_bytes > 0 && s.num_blocks == TL_BLOCKS);
  usleep(300000); /* the worker keeps going, degraded */

  /* A server comes back on the same socket: a new epoch. */
  REQUIRE(ts_start(&ts, NULL));
  CHECK(wait_connection(e, OI_CONNECTION_CONNECTED, &s));
  CHECK(s.reconnects == 1);
  CHECK(s.server_epoch != 0 && s.server_epoch != epoch1);
  for (int i = 0; i < 200 && ts_log_count(&reconnect_lines) < 1; i++)
    usleep(10000);
  CHECK(ts_log_count(&reconnect_lines) >= 1);
  usleep(200000); /* the worker runs against the new server */
  atomic_store(&w.stop, true);
  pthread_join(th, NULL);
  CHECK(atomic_load(&w.bad) == 0);
  CHECK(atomic_load(&w.saves) > 0 && atomic_load(&w.queries) > 0);
  /* Old leases are invalid in the new epoch. */
  t = NULL;
  oi_status st = oi_engine_load(e, old_lease, dst, 4, NULL, &t);
  if (st == OI_OK) {
    CHECK_ST(oi_ticket_wait(t, 10000), OI_ERR_LEASE_EXPIRED);
    oi_ticket_release(t);
  } else {
    CHECK_ST(st, OI_ERR_LEASE_EXPIRED);
  }
  /* Byte-exact again: the new server maps the same memory. */
  round_trip(e, &m, a, 3, 100, 4);
  wire_client c;
  REQUIRE(wc_connect(&c, ts.socket) && wc_hello(&c, NULL));
  oiwire_StatsReply sr;
  REQUIRE(wc_server_stats(&c, &sr));
  CHECK(sr.instances == 1 && sr.server_epoch == s.server_epoch);
  wc_close(&c);
  oi_engine_destroy(e);
  om_free(&m);
  CHECK(ts_stop(&ts));
  CHECK(atomic_load(&fatal_calls) == 0);
}

static void test_degraded_engine_is_destroyed_promptly(void) {
  REQUIRE(ts_start(&ts, NULL));
  owned_mem m;
  oi_arena_desc a[TL_ARENAS];
  oi_engine *e = owned_connect("owned-destroy", a, &m);
  ts_kill(&ts);
  oi_engine_stats s;
  CHECK(wait_connection(e, OI_CONNECTION_DEGRADED, &s));
  uint64_t t0 = 0;
  struct timespec a0, a1;
  clock_gettime(CLOCK_MONOTONIC, &a0);
  oi_engine_destroy(e);
  clock_gettime(CLOCK_MONOTONIC, &a1);
  t0 = (uint64_t)(a1.tv_sec - a0.tv_sec) * 1000 + (uint64_t)(a1.tv_nsec - a0.tv_nsec) / 1000000;
  CHECK(t0 < 3000);
  om_free(&m);
}

int main(int argc, char **argv) {
  if (argc < 2) TEST_SKIP("usage: test_owned OPENINFER_EXE");
  oi_set_fatal_handler(fatal_fail, NULL);
  oi_set_log_handler(log_capture, NULL);
  ts_init(&ts, argv[1]);
  RUN_TEST(test_round_trip_byte_exact);
  RUN_TEST(test_bad_memory_is_refused);
  RUN_TEST(test_server_killed_degrade_and_reconnect);
  RUN_TEST(test_degraded_engine_is_destroyed_promptly);
  ts_cleanup(&ts);
  TEST_EXIT();
}
