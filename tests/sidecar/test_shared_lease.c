/* The connector-facing calls over a real `openinfer serve` (issue 18, items
 * 1, 2 and 8): a lookup client that registers no layout queries (prefix and
 * membership); engines of other sessions of the same user and namespace load
 * its lease byte-exact, world_size shares kept across sessions; another
 * namespace, a forged lease, another user and a lease whose client went are
 * refused; each save reports accepted / deduplicated / dropped before it
 * returns. The pending answers need a save in flight: tests/fault. */
#include <grp.h>

#include "sidecar_util.h"

static test_server ts;
static const char *NS = "shared-ns";
#define N 6

typedef struct eng {
  oi_engine *e;
  oi_imported_arena *arena;
  uint8_t *base;
  oi_arena_desc a[TL_ARENAS];
} eng;

static void eng_open(eng *g, const char *ns, uint32_t world) {
  oi_engine_options o;
  tl_options(&o, g->a, ns);
  o.world_size = world;
  CHECK_OK(oi_engine_connect(ts.socket, &o, &g->e, &g->arena));
  REQUIRE(g->e && g->arena);
  g->base = oi_imported_arena_ptr(g->arena);
}

static void eng_close(eng *g) {
  oi_imported_arena_close(g->arena);
  oi_engine_destroy(g->e);
}

static oi_status load_wait(eng *g, oi_lease l, const int64_t *dst, size_t n) {
  oi_ticket *t = NULL;
  oi_status st = oi_engine_load(g->e, l, dst, n, NULL, &t);
  if (st != OI_OK) return st;
  st = oi_ticket_wait(t, 10000);
  oi_ticket_release(t);
  return st;
}

static oi_lookup *client_open(const char *ns, uint32_t world) {
  oi_lookup_options lo;
  CHECK_OK(oi_lookup_options_init(&lo));
  lo.lookup_deadline_ms = 10000; /* (not the breaker's test: slow machines) */
  lo.namespace_id = ns;
  lo.world_size = world;
  lo.client_name = "scheduler";
  oi_lookup *c = NULL;
  CHECK_OK(oi_lookup_connect(ts.socket, &lo, &c));
  REQUIRE(c);
  return c;
}

static oi_block_hash hs[N];

static void test_save_counts_over_the_wire(void) {
  eng g;
  eng_open(&g, NS, 1);
  int64_t ids[N];
  for (int i = 0; i < N; i++) {
    ids[i] = i;
    hs[i] = tl_hash(7, (uint64_t)i);
    tl_fill(g.base, g.a, i, (uint64_t)i);
  }
  oi_save_result r;
  memset(&r, 0xCD, sizeof r);
  r.struct_size = sizeof r;
  oi_save_options so;
  oi_save_options_init(&so);
  so.result = &r;
  oi_ticket *t = NULL;
  CHECK_OK(oi_engine_save(g.e, ids, hs, 4, &so, &t));
  CHECK(r.accepted == 4 && r.deduplicated == 0 && r.dropped == 0);
  CHECK_OK(oi_ticket_wait(t, 10000));
  oi_ticket_release(t);
  CHECK_OK(oi_engine_save(g.e, ids, hs, N, &so, &t));
  CHECK(r.accepted == 2 && r.deduplicated == 4 && r.dropped == 0);
  CHECK_OK(oi_ticket_wait(t, 10000));
  oi_ticket_release(t);
  /* Without the result (and fire and forget) nothing changes. */
  CHECK_OK(oi_engine_save(g.e, ids, hs, N, NULL, NULL));
  CHECK_OK(oi_engine_flush(g.e, 10000));
  /* An error the server finds: the counts never come, the ticket says why. */
  int64_t bad = TL_BLOCKS;
  CHECK_ST(oi_engine_save(g.e, &bad, hs, 1, &so, &t), OI_ERR_INVALID_ARGUMENT);
  eng_close(&g);
}

/* As uid 65534, a lookup client of the same namespace tries to release
 * `lease`. @return its status as an exit code: 0 refused with PERMISSION. */
__attribute__((unused)) static int nobody_release(oi_lease lease) {
  pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    if (setgroups(0, NULL) != 0 || setgid(65534) != 0 || setuid(65534) != 0) _exit(20);
    oi_lookup_options lo;
    oi_lookup_options_init(&lo);
    lo.lookup_deadline_ms = 10000; /* (not the breaker's test: slow machines) */
    lo.namespace_id = NS;
    oi_lookup *c = NULL;
    if (oi_lookup_connect(ts.socket, &lo, &c) != OI_OK) {
      fprintf(stderr, "nobody connect: %s\n", oi_last_error());
      _exit(21);
    }
    oi_status st = oi_lookup_release(c, lease);
    oi_lookup_destroy(c);
    if (st == OI_ERR_PERMISSION && strstr(oi_last_error(), "credentials")) _exit(0);
    fprintf(stderr, "nobody release: %s %s\n", oi_status_str(st), oi_last_error());
    _exit(22);
  }
  int status;
  waitpid(child, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 99;
}

static void test_lookup_client_leases_for_other_sessions(void) {
  oi_lookup *c = client_open(NS, 2);
  /* Prefix: N saved, then a miss. */
  oi_block_hash q[N + 2];
  memcpy(q, hs, sizeof hs);
  q[N] = tl_hash(7, 100);
  q[N + 1] = tl_hash(7, 101);
  oi_query_result qr;
  memset(&qr, 0, sizeof qr);
  qr.struct_size = sizeof qr;
  CHECK_OK(oi_lookup_query(c, "req-1", q, N + 2, 0, &qr));
  CHECK(qr.hit_blocks == N && qr.pending_blocks == 0);
  oi_lease lease = qr.lease;
  /* Membership, no lease. */
  uint8_t present[N + 2];
  memset(present, 9, sizeof present);
  oi_query_result mr;
  memset(&mr, 0, sizeof mr);
  mr.struct_size = sizeof mr;
  mr.present = present;
  oi_block_hash mixed[3] = {q[N], hs[1], hs[2]};
  CHECK_OK(oi_lookup_query(c, NULL, mixed, 3, OI_QUERY_MEMBERSHIP, &mr));
  CHECK(mr.hit_blocks == 2 && present[0] == 0 && present[1] == 1 && present[2] == 1);

  /* Two worker sessions load the one lease (world_size 2), byte-exact. */
  eng w1, w2;
  eng_open(&w1, NS, 1);
  eng_open(&w2, NS, 1);
  int64_t dst[N];
  for (int i = 0; i < N; i++)
    dst[i] = 20 + i;
  CHECK_OK(load_wait(&w1, lease, dst, N));
  CHECK_OK(load_wait(&w2, lease, dst, N));
  for (int i = 0; i < N; i++) {
    CHECK(tl_check(w1.base, w1.a, dst[i], (uint64_t)i));
    CHECK(tl_check(w2.base, w2.a, dst[i], (uint64_t)i));
  }
  /* The budget holds across sessions. */
  int64_t more[N] = {10, 11, 12, 13, 14, 15};
  CHECK_ST(load_wait(&w1, lease, more, N), OI_ERR_LEASE_EXPIRED);
  CHECK(tl_is_zero(w1.base, w1.a, 10));

  /* Another namespace's engine is refused; the lease survives it. */
  memset(&qr, 0, sizeof qr);
  qr.struct_size = sizeof qr;
  CHECK_OK(oi_lookup_query(c, NULL, hs, N, 0, &qr));
  CHECK(qr.hit_blocks == N);
  eng other;
  eng_open(&other, "another-ns", 1);
  CHECK_ST(load_wait(&other, qr.lease, dst, N), OI_ERR_PERMISSION);
  CHECK(tl_is_zero(other.base, other.a, 20));
  CHECK_ST(oi_engine_release(other.e, qr.lease), OI_ERR_PERMISSION);
  /* A forged one is unknown. */
  oi_lease forged = qr.lease;
  forged.bytes[9] ^= 0x3C;
  CHECK_ST(load_wait(&w1, forged, more, N), OI_ERR_LEASE_EXPIRED);
  CHECK_ST(oi_lookup_release(c, forged), OI_ERR_LEASE_EXPIRED);
  /* Another user may not touch it (needs root to be another uid, and a
   * forked child that starts threads, which ThreadSanitizer refuses: the
   * normal and ASan stages run it). */
#ifdef __SANITIZE_THREAD__
  fprintf(stderr, "  (TSan build: the other-uid refusal runs in the other builds)\n");
#else
  if (geteuid() == 0)
    CHECK(nobody_release(qr.lease) == 0);
  else
    fprintf(stderr, "  (not root: the other-uid refusal is not exercised)\n");
#endif
  /* A worker may release it; then it is gone for the client too. */
  CHECK_OK(oi_engine_release(w1.e, qr.lease));
  CHECK_ST(oi_lookup_release(c, qr.lease), OI_ERR_LEASE_EXPIRED);
  /* The client's own release. */
  CHECK_OK(oi_lookup_query(c, NULL, hs, N, 0, &qr));
  CHECK_OK(oi_lookup_release(c, qr.lease));
  CHECK_ST(load_wait(&w2, qr.lease, more, N), OI_ERR_LEASE_EXPIRED);
  /* Bad input is refused by the client before the wire. */
  CHECK_ST(oi_lookup_query(c, NULL, hs, N, 1u << 9, &qr), OI_ERR_INVALID_ARGUMENT);
  CHECK_ST(oi_lookup_query(NULL, NULL, hs, N, 0, &qr), OI_ERR_INVALID_ARGUMENT);
  CHECK_ST(oi_lookup_query(c, NULL, NULL, N, 0, &qr), OI_ERR_INVALID_ARGUMENT);
  CHECK_ST(oi_lookup_query(c, NULL, hs, N, OI_QUERY_MEMBERSHIP | OI_QUERY_WAIT_PENDING, &mr),
           OI_ERR_INVALID_ARGUMENT);
  /* A client's leases go with it. */
  CHECK_OK(oi_lookup_query(c, NULL, hs, N, 0, &qr));
  CHECK(qr.hit_blocks == N);
  oi_lookup_destroy(c);
  oi_status st = OI_OK;
  for (int i = 0; i < 200; i++) { /* the server ends the session asynchronously */
    st = oi_engine_release(w2.e, qr.lease);
    if (st != OI_OK) break;
    /* released by us before the server saw the end: query again */
    oi_lookup *c2 = client_open(NS, 1);
    CHECK_OK(oi_lookup_query(c2, NULL, hs, N, 0, &qr));
    oi_lookup_destroy(c2);
    usleep(10000);
  }
  CHECK(st == OI_ERR_LEASE_EXPIRED);
  eng_close(&other);
  eng_close(&w2);
  eng_close(&w1);
}

static void test_client_errors(void) {
  oi_lookup_options lo;
  oi_lookup_options_init(&lo);
  lo.lookup_deadline_ms = 10000; /* (not the breaker's test: slow machines) */
  oi_lookup *c = (oi_lookup *)1;
  CHECK_ST(oi_lookup_connect(ts.socket, &lo, &c), OI_ERR_INVALID_ARGUMENT); /* no ns */
  CHECK(c == NULL);
  lo.namespace_id = NS;
  CHECK_ST(oi_lookup_connect(ts.socket, NULL, &c), OI_ERR_INVALID_ARGUMENT);
  CHECK_ST(oi_lookup_connect(ts.socket, &lo, NULL), OI_ERR_INVALID_ARGUMENT);
  char missing[300];
  snprintf(missing, sizeof missing, "%s/none.sock", ts.dir);
  CHECK_ST(oi_lookup_connect(missing, &lo, &c), OI_ERR_NOT_FOUND);
  oi_lookup_destroy(NULL);
  /* A dead server is not fatal to a lookup client: its calls fail. */
  c = client_open(NS, 1);
  CHECK(ts_stop(&ts));
  oi_query_result qr;
  memset(&qr, 0, sizeof qr);
  qr.struct_size = sizeof qr;
  CHECK_ST(oi_lookup_query(c, NULL, hs, N, 0, &qr), OI_ERR_CLOSED);
  oi_lookup_destroy(c);
}

int main(int argc, char **argv) {
  if (argc < 2) TEST_SKIP("usage: test_shared_lease OPENINFER_EXE");
  oi_set_fatal_handler(ts_fatal_is_a_failure, NULL);
  ts_init(&ts, argv[1]);
  chmod(ts.dir, 0755); /* another uid must reach the socket */
  const char *extra[] = {"--socket-mode", "0666", "--allow-uid", "65534", NULL};
  REQUIRE(ts_start(&ts, extra));
  RUN_TEST(test_save_counts_over_the_wire);
  RUN_TEST(test_lookup_client_leases_for_other_sessions);
  RUN_TEST(test_client_errors);
  if (oi_test_failures) ts_dump_log(&ts);
  ts_cleanup(&ts);
  TEST_EXIT();
}
