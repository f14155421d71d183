/* The server survives a client that dies at every step of the protocol:
 *  - a raw client sends the first k requests of a session in full, then
 *    request k cut at several points (nothing, part of the length prefix,
 *    part of the payload, all of it without waiting), and vanishes;
 *  - a real client is SIGKILLed after each step, with the server's copies
 *    slowed (copy_slow) so saves and loads are still running when it dies;
 *  - a real client's own socket is reset (sock_reset) at each of its sends;
 *  - short writes on both sides (sock_short) still give byte-exact round trips.
 * After each: the server frees the session's instance and arena, keeps
 * serving (a probe client's Hello and Stats), and leaks no shared memory. */
#include "fault_util.h"
#include "sidecar_util.h"

static test_server ts;

enum { STEPS = 9 };

/* A frame's lease field (a 16-byte bytes field) set to *lease. */
#define SET_LEASE(field, lease)                                                                    \
  do {                                                                                             \
    (field).size = 16;                                                                             \
    memcpy((field).bytes, (lease)->bytes, 16);                                                     \
  } while (0)

/* An envelope's body: the request `kind` of instance inst. */
#define SET_BODY(env, kind, inst)                                                                  \
  ((env).which_body = oiwire_Envelope_##kind##_tag, (env).body.kind.instance_id = (inst))

/* The encoded request of step k (a whole frame). */
static void step_frame(int k, uint32_t inst, const oi_lease *lease, uint8_t **frame, size_t *len) {
  oiwire_Envelope env;
  memset(&env, 0, sizeof env);
  env.request_id = 100 + (uint64_t)k;
  oi_arena_desc a[TL_ARENAS];
  uint64_t total;
  tl_arenas(a, &total);
  int64_t ids[4] = {0, 1, 2, 3}, dst[4] = {10, 11, 12, 13};
  oi_block_hash hs[4];
  for (int i = 0; i < 4; i++)
    hs[i] = tl_hash(9, (uint64_t)i);
  oi_wire_out out = {0};
  switch (k) {
  case 0:
    env.which_body = oiwire_Envelope_hello_tag;
    env.body.hello.protocol_version = OI_WIRE_PROTOCOL_VERSION;
    break;
  case 1:
    env.which_body = oiwire_Envelope_register_instance_tag;
    snprintf(env.body.register_instance.namespace_id,
             sizeof env.body.register_instance.namespace_id, "steps");
    env.body.register_instance.device = OI_DEVICE_CPU;
    env.body.register_instance.world_size = 1;
    env.body.register_instance.arena_size = total;
    out = (oi_wire_out){.arenas = a, .n_arenas = TL_ARENAS};
    break;
  case 2:
    SET_BODY(env, save, inst);
    out = (oi_wire_out){.ids = ids, .n_ids = 4, .hashes = hs, .n_hashes = 4};
    break;
  case 3:
    SET_BODY(env, flush, inst);
    env.body.flush.timeout_ms = 10000;
    break;
  case 4:
    SET_BODY(env, query, inst);
    out = (oi_wire_out){.hashes = hs, .n_hashes = 4};
    break;
  case 5:
    SET_BODY(env, load, inst);
    SET_LEASE(env.body.load.lease, lease);
    out = (oi_wire_out){.ids = dst, .n_ids = 4};
    break;
  case 6:
    SET_BODY(env, release, inst);
    SET_LEASE(env.body.release.lease, lease);
    break;
  case 7: SET_BODY(env, stats, inst); break;
  default: SET_BODY(env, unregister, inst); break;
  }
  REQUIRE(oi__wire_encode(&env, &out, frame, len) == OI_OK);
}

/* Waits for a reply with request id `id`. */
static bool await(wire_client *c, uint64_t id) {
  for (;;) {
    if (wc_recv(c, 10000) != OI_OK) return false;
    if (c->env.request_id == id) return true;
  }
}

static void server_is_clean(const char *what) {
  wire_client p;
  oiwire_StatsReply sr;
  memset(&sr, 0, sizeof sr);
  REQUIRE(wc_connect(&p, ts.socket));
  bool ok = wc_hello(&p, NULL) && WAIT_FOR_STATS(&p, sr, sr.instances == 0 && sr.sessions == 1);
  if (!ok)
    fprintf(stderr, "after %s: the server is not clean (instances %llu, sessions %llu)\n", what,
            (unsigned long long)sr.instances, (unsigned long long)sr.sessions);
  CHECK(ok);
  CHECK(sr.arena_bytes == 0);
  wc_close(&p);
  CHECK(shm_objects_of(ts.pid) == 0);
  CHECK(ts.pid != 0 && kill(ts.pid, 0) == 0);
}

static void test_raw_client_dies_at_every_step(void) {
  for (int k = 0; k < STEPS; k++) {
    uint8_t *f0;
    size_t l0;
    step_frame(k, 1, &(oi_lease){{0}}, &f0, &l0);
    size_t cuts[] = {0, 1, 3, 4, 5, l0 / 2, l0 - 1, l0};
    oi__free(f0);
    for (size_t ci = 0; ci < OI_ARRAY_LEN(cuts); ci++) {
      wire_client c;
      REQUIRE(wc_connect(&c, ts.socket));
      uint32_t inst = 0;
      oi_lease lease = {{0}};
      bool ok = true;
      for (int j = 0; j < k && ok; j++) { /* the steps before, in full */
        uint8_t *f;
        size_t l;
        step_frame(j, inst, &lease, &f, &l);
        ok = wc_send_raw(&c, f, l) && await(&c, 100 + (uint64_t)j);
        oi__free(f);
        if (ok && j == 1) inst = c.env.body.register_reply.instance_id;
        if (ok && j == 4) memcpy(lease.bytes, c.env.body.query_reply.lease.bytes, 16);
      }
      CHECK(ok);
      uint8_t *f;
      size_t l;
      step_frame(k, inst, &lease, &f, &l);
      size_t cut = OI_MIN(cuts[ci], l);
      if (cut) CHECK(wc_send_raw(&c, f, cut));
      oi__free(f);
      wc_close(&c); /* gone, mid-frame or with a reply pending */
    }
    char what[64];
    snprintf(what, sizeof what, "a raw client dying at step %d", k);
    server_is_clean(what);
  }
}

/* A real client: steps 0.. of connect, save, flush, query, load, release,
 * unregister; writes one byte to `fd` after each step. */
static int client_session(int fd, bool check) {
  TL_CLIENT(a, o, e, arena);
  tl_options(&o, a, "steps-real");
  if (oi_engine_connect(ts.socket, &o, &e, &arena) != OI_OK) return 2;
  STEP(fd);
  uint8_t *base = oi_imported_arena_ptr(arena);
  int64_t ids[8], dst[8];
  oi_block_hash hs[8];
  for (int i = 0; i < 8; i++) {
    ids[i] = i;
    dst[i] = 16 + i;
    hs[i] = tl_hash(21, (uint64_t)i);
    tl_fill(base, a, i, (uint64_t)i);
  }
  oi_ticket *t = NULL;
  if (oi_engine_save(e, ids, hs, 8, NULL, &t) != OI_OK) return 4;
  STEP(fd);
  if (oi_ticket_wait(t, 30000) != OI_OK) return 5;
  oi_ticket_release(t);
  if (oi_engine_flush(e, 30000) != OI_OK) return 6;
  STEP(fd);
  oi_query_result q = {.struct_size = sizeof q};
  if (oi_engine_query(e, NULL, hs, 8, 0, &q) != OI_OK || q.hit_blocks != 8) return 7;
  STEP(fd);
  if (oi_engine_load(e, q.lease, dst, 8, NULL, &t) != OI_OK) return 8;
  STEP(fd);
  if (oi_ticket_wait(t, 30000) != OI_OK) return 9;
  oi_ticket_release(t);
  if (check)
    for (int i = 0; i < 8; i++)
      if (!tl_check(base, a, dst[i], (uint64_t)i)) return 10;
  STEP(fd);
  oi_imported_arena_close(arena);
  oi_engine_destroy(e);
  return 0;
}

static void test_real_client_killed_at_every_step(void) {
  for (int k = 1; k <= 6; k++) {
    int p[2];
    pid_t child = tr_fork_pipe(p);
    if (child == 0) {
      int rc = client_session(p[1], false);
      if (rc) _exit(rc);
      for (;;)
        pause();
    }
    char c;
    int got = 0;
    while (got < k && read(p[0], &c, 1) == 1)
      got++;
    close(p[0]);
    kill(child, SIGKILL);
    int status;
    waitpid(child, &status, 0);
    CHECK(got == k);
    char what[64];
    snprintf(what, sizeof what, "a client killed after step %d", k);
    server_is_clean(what);
  }
}

static void fatal_exit(void *ctx, const char *reason) {
  (void)ctx;
  (void)reason;
  _exit(42);
}

/* The client's connection is reset at its n-th send: the client fails (an
 * error, or its fatal handler when its arena is mapped); the server cleans up. */
static void test_client_socket_reset_at_every_send(void) {
  int completed = 0;
  for (int n = 0; n < 10; n++) {
    pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      oi_set_fatal_handler(fatal_exit, NULL);
      oi__fault_arm(OI_FAULT_SOCK_RESET, (uint64_t)n, 1, 3);
      int rc = client_session(-1, true);
      /* Success is only right when the reset never fired before the end
       * (n past the session's sends) or hit the goodbye (unregister). */
      _exit(rc == 0 && oi__fault_fired(OI_FAULT_SOCK_RESET) && n < 6 ? 20 : rc);
    }
    int status;
    waitpid(child, &status, 0);
    CHECK(WIFEXITED(status));
    int rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    CHECK(rc != 10); /* never wrong bytes */
    completed += rc == 0 || rc == 20;
    CHECK(rc != 20); /* a reset client never reports a whole session */
    char what[64];
    snprintf(what, sizeof what, "a client reset at send %d", n);
    server_is_clean(what);
  }
  CHECK(completed < 10); /* the resets did end sessions */
}

static void test_short_writes_both_sides(void) {
  pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    oi__fault_arm(OI_FAULT_SOCK_SHORT, 0, 0, 5);
    _exit(client_session(-1, true));
  }
  int status;
  waitpid(child, &status, 0);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  server_is_clean("short writes");
}

int main(int argc, char **argv) {
  REQUIRE_FAULTS();
  if (argc < 2) TEST_SKIP("usage: test_protocol_fault OPENINFER_EXE");
  ts_init(&ts, argv[1]);
  REQUIRE(ts_start(&ts, NULL));
  RUN_TEST(test_raw_client_dies_at_every_step);
  RUN_TEST(test_client_socket_reset_at_every_send);
  CHECK(ts_stop(&ts));
  /* A server whose copies are slow (saves and loads still running at the
   * kill) and whose every send is cut into 3-byte writes. */
  setenv("OI_FAULTS", "copy_slow:0:0:30,sock_short:0:0:3", 1);
  REQUIRE(ts_start(&ts, NULL));
  unsetenv("OI_FAULTS");
  RUN_TEST(test_real_client_killed_at_every_step);
  RUN_TEST(test_short_writes_both_sides);
  CHECK(ts_stop(&ts));
  if (oi_test_failures) ts_dump_log(&ts);
  ts_cleanup(&ts);
  TEST_EXIT();
}
