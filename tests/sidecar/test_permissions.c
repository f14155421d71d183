/* Security: the socket is created 0600 by default (and with the mode asked
 * for); a peer whose uid is not allowed is refused (SO_PEERCRED), one that is
 * allowed (by uid or gid) is served. The peer of another uid is a child that
 * drops to uid 65534, so that part needs root (skipped, exit 77, otherwise). */
#include <grp.h>

#include "sidecar_util.h"

static test_server ts;

static void test_socket_is_0600(void) {
  REQUIRE(ts_start(&ts, NULL));
  struct stat st;
  CHECK(lstat(ts.socket, &st) == 0 && S_ISSOCK(st.st_mode));
  CHECK((st.st_mode & 0777) == 0600);
  CHECK(ts_stop(&ts));
  CHECK(access(ts.socket, F_OK) != 0); /* removed on exit */
  const char *mode[] = {"--socket-mode", "0660", NULL};
  REQUIRE(ts_start(&ts, mode));
  CHECK(lstat(ts.socket, &st) == 0 && (st.st_mode & 0777) == 0660);
  CHECK(ts_stop(&ts));
}

/* In a child running as uid/gid 65534: connect + hello. @return the status
 * of oi_engine_connect-like access as an exit code: 0 served,
 * 10 refused by the server, 11 refused by the socket file, other: error. */
static int as_nobody(bool hello_only) {
  pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    if (setgroups(0, NULL) != 0 || setgid(65534) != 0 || setuid(65534) != 0) _exit(20);
    if (hello_only) {
      wire_client c;
      if (!wc_connect(&c, ts.socket))
        _exit(oi_last_error()[0] && strstr(oi_last_error(), "ermission") ? 11 : 21);
      _exit(wc_hello(&c, NULL) ? 0 : 10);
    }
    TL_CLIENT(a, o, e, arena);
    tl_options(&o, a, "perm");
    oi_status st = oi_engine_connect(ts.socket, &o, &e, &arena);
    if (st == OI_ERR_PERMISSION && strstr(oi_last_error(), "not allowed")) _exit(10);
    if (st == OI_ERR_PERMISSION) _exit(11);
    fprintf(stderr, "connect as nobody: %s %s\n", oi_status_str(st), oi_last_error());
    _exit(22);
  }
  int status;
  waitpid(child, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 99;
}

static void test_other_uid_is_refused_unless_allowed(void) {
  /* 0600: the socket file itself keeps the other uid out */
  REQUIRE(ts_start(&ts, NULL));
  CHECK(as_nobody(false) == 11);
  CHECK(ts_stop(&ts));
  /* world-writable socket: SO_PEERCRED refuses */
  const char *open_mode[] = {"--socket-mode", "0666", NULL};
  REQUIRE(ts_start(&ts, open_mode));
  CHECK(as_nobody(false) == 10);
  CHECK(ts_log_contains(&ts, "not allowed"));
  CHECK(as_nobody(true) == 10);
  CHECK(ts_stop(&ts));
  /* allowed by uid, and by gid */
  const char *by_uid[] = {"--socket-mode", "0666", "--allow-uid", "65534", NULL};
  REQUIRE(ts_start(&ts, by_uid));
  CHECK(as_nobody(true) == 0);
  CHECK(ts_stop(&ts));
  const char *by_gid[] = {"--socket-mode", "0666", "--allow-gid", "65534", NULL};
  REQUIRE(ts_start(&ts, by_gid));
  CHECK(as_nobody(true) == 0);
  CHECK(ts_stop(&ts));
}

int main(int argc, char **argv) {
  if (argc < 2) TEST_SKIP("usage: test_permissions OPENINFER_EXE");
  ts_init(&ts, argv[1]);
  chmod(ts.dir, 0755); /* the other uid must reach the socket */
  RUN_TEST(test_socket_is_0600);
  if (geteuid() != 0) {
    ts_cleanup(&ts);
    if (oi_test_failures) return 1;
    TEST_SKIP("not root: cannot be a peer with another uid (socket mode checked)");
  }
  RUN_TEST(test_other_uid_is_refused_unless_allowed);
  if (oi_test_failures) ts_dump_log(&ts);
  ts_cleanup(&ts);
  TEST_EXIT();
}
