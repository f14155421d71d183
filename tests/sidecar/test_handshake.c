/* Session slots and the handshake deadline: connections that never send
 * Hello are closed after --handshake-timeout with a reason, so they cannot
 * lock everyone else out of a server at --max-sessions; a session past its
 * Hello stays connected however long it is idle. */
#include "sidecar_util.h"

static test_server ts;

/* Waits up to timeout_ms for the session-ending Result (request id 0);
 * @return its status, or OI_OK when none came. */
static oi_status closing_reason(wire_client *c, int timeout_ms) {
  for (;;) {
    oi_status st = wc_recv(c, timeout_ms);
    if (st != OI_OK) return OI_OK;
    if (c->env.request_id == 0 && c->env.which_body == oiwire_Envelope_result_tag)
      return c->env.body.result.status;
  }
}

static void test_silent_connections_are_cut_and_slots_come_back(void) {
  const char *extra[] = {"--max-sessions", "2", "--handshake-timeout", "400", NULL};
  REQUIRE(ts_start(&ts, extra));
  wire_client hello, silent, third;
  REQUIRE(wc_connect(&hello, ts.socket) && wc_hello(&hello, NULL)); /* slot 1: said Hello */
  REQUIRE(wc_connect(&silent, ts.socket));                          /* slot 2: says nothing */
  usleep(100000);
  /* Full: a third connection is refused at once, with a reason. */
  REQUIRE(wc_connect(&third, ts.socket));
  CHECK(closing_reason(&third, 2000) == OI_ERR_BUSY);
  CHECK(wc_closed(&third, 2000));
  wc_close(&third);
  /* The silent one is told why and closed after the deadline... */
  uint64_t t0 = oi__now_ns();
  CHECK(closing_reason(&silent, 3000) == OI_ERR_TIMEOUT);
  CHECK(wc_closed(&silent, 2000));
  double waited_ms = (double)(oi__now_ns() - t0) / 1e6;
  CHECK(waited_ms < 2000);
  wc_close(&silent);
  CHECK(ts_log_contains(&ts, "no Hello within 400 ms"));
  /* ...which frees its slot (once the server has reaped the session, a
   * moment after the close): a real client gets in. */
  oiwire_StatsReply sr;
  CHECK(WAIT_FOR_STATS(&hello, sr, sr.sessions == 1));
  TL_CLIENT(a, o, e, arena);
  tl_options(&o, a, "handshake");
  e = NULL;
  arena = NULL;
  CHECK_OK(oi_engine_connect(ts.socket, &o, &e, &arena));
  /* The session that said Hello is still served long after the deadline. */
  usleep(800000);
  CHECK(wc_server_stats(&hello, &sr) && sr.sessions == 2);
  if (e) {
    oi_imported_arena_close(arena);
    oi_engine_destroy(e);
  }
  wc_close(&hello);
  CHECK(ts_stop(&ts));
}

static void test_bad_deadline_is_refused(void) {
  /* 0 is not a deadline; the CLI says so before starting anything. */
  char cmd[512];
  snprintf(cmd, sizeof cmd, "%s serve --socket %s/x.sock --handshake-timeout 0 2>/dev/null", ts.exe,
           ts.dir);
  int rc = system(cmd);
  CHECK(WIFEXITED(rc) && WEXITSTATUS(rc) == 2);
  oi_server_options so;
  oi_server_options_init(&so);
  CHECK(so.handshake_timeout_ms == 10000);
  oi_host_options ho = tr_host_options(1 << 20);
  so.host = &ho;
  so.handshake_timeout_ms = 0;
  char path[160];
  snprintf(path, sizeof path, "%s/y.sock", ts.dir);
  so.socket_path = path;
  oi_server *s = NULL;
  CHECK_ST(oi_server_create(&so, &s), OI_ERR_INVALID_ARGUMENT);
  CHECK(s == NULL && strstr(oi_last_error(), "handshake_timeout_ms"));
}

int main(int argc, char **argv) {
  if (argc < 2) TEST_SKIP("usage: test_handshake OPENINFER_EXE");
  signal(SIGPIPE, SIG_IGN);
  ts_init(&ts, argv[1]);
  RUN_TEST(test_silent_connections_are_cut_and_slots_come_back);
  RUN_TEST(test_bad_deadline_is_refused);
  if (oi_test_failures) ts_dump_log(&ts);
  ts_cleanup(&ts);
  TEST_EXIT();
}
