/* Logging (handler, level filter, line format) and the fatal handler. */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/core.h"
#include "testutil.h"

#define MAX_LINES 16

struct capture {
  int count;
  oi_log_level levels[MAX_LINES];
  char lines[MAX_LINES][1100];
};

static struct capture cap;

static void capture_fn(void *ctx, oi_log_level level, const char *line) {
  struct capture *c = ctx;
  if (c->count < MAX_LINES) {
    c->levels[c->count] = level;
    snprintf(c->lines[c->count], sizeof c->lines[0], "%s", line);
  }
  c->count++;
}

static void reset_capture(void) {
  memset(&cap, 0, sizeof cap);
  oi_set_log_handler(capture_fn, &cap);
}

/* Runs first, before anything reads the log level. */
static void level_defaults_from_environment(void) {
  CHECK(oi_get_log_level() == OI_LOG_ERROR); /* main() set OI_LOG_LEVEL=error */
}

static void handler_receives_formatted_lines(void) {
  reset_capture();
  CHECK_OK(oi_set_log_level(OI_LOG_WARN));
  OI_LOG(OI_LOG_WARN, "X", "hello %d", 5);
  REQUIRE(cap.count == 1);
  CHECK(cap.levels[0] == OI_LOG_WARN);
  CHECK(strstr(cap.lines[0], "level=warn component=X msg=\"hello 5\"") != NULL);
  CHECK(strcmp(cap.lines[0], "level=warn component=X msg=\"hello 5\"") == 0); /* no newline */

  OI_LOG(OI_LOG_ERROR, "device", "bad %s", "thing");
  REQUIRE(cap.count == 2);
  CHECK(cap.levels[1] == OI_LOG_ERROR);
  CHECK(strstr(cap.lines[1], "level=error component=device msg=\"bad thing\"") != NULL);
}

static void messages_below_the_level_are_dropped(void) {
  reset_capture();
  CHECK_OK(oi_set_log_level(OI_LOG_WARN));
  CHECK(oi_get_log_level() == OI_LOG_WARN);
  CHECK(!oi__log_enabled(OI_LOG_TRACE));
  CHECK(!oi__log_enabled(OI_LOG_INFO));
  CHECK(oi__log_enabled(OI_LOG_WARN));
  CHECK(oi__log_enabled(OI_LOG_ERROR));
  OI_LOG(OI_LOG_TRACE, "X", "trace");
  OI_LOG(OI_LOG_DEBUG, "X", "debug");
  OI_LOG(OI_LOG_INFO, "X", "info");
  CHECK(cap.count == 0);
  /* Library-internal debug logging (oi__fail logs at debug) is dropped too. */
  oi__fail(OI_ERR_IO, "quiet failure");
  CHECK(cap.count == 0);

  CHECK_OK(oi_set_log_level(OI_LOG_DEBUG));
  CHECK(oi_get_log_level() == OI_LOG_DEBUG);
  OI_LOG(OI_LOG_TRACE, "X", "trace");
  CHECK(cap.count == 0);
  OI_LOG(OI_LOG_DEBUG, "X", "debug now");
  REQUIRE(cap.count == 1);
  CHECK(strstr(cap.lines[0], "level=debug component=X msg=\"debug now\"") != NULL);
  oi__fail(OI_ERR_IO, "loud failure");
  REQUIRE(cap.count == 2);
  CHECK(strstr(cap.lines[1], "level=debug component=error msg=\"OI_ERR_IO: loud failure\"") !=
        NULL);

  CHECK_OK(oi_set_log_level(OI_LOG_TRACE));
  OI_LOG(OI_LOG_TRACE, "X", "trace now");
  REQUIRE(cap.count == 3);
  CHECK(strstr(cap.lines[2], "level=trace component=X") != NULL);
  oi_clear_error();
}

static void level_off_silences_everything(void) {
  reset_capture();
  CHECK_OK(oi_set_log_level(OI_LOG_OFF));
  CHECK(oi_get_log_level() == OI_LOG_OFF);
  for (int l = OI_LOG_TRACE; l <= OI_LOG_OFF; l++)
    CHECK(!oi__log_enabled((oi_log_level)l));
  OI_LOG(OI_LOG_ERROR, "X", "error");
  OI_LOG(OI_LOG_WARN, "X", "warn");
  CHECK(cap.count == 0);
}

static void invalid_level_is_rejected_and_level_unchanged(void) {
  CHECK_OK(oi_set_log_level(OI_LOG_INFO));
  oi_clear_error();
  CHECK_ST(oi_set_log_level((oi_log_level)42), OI_ERR_INVALID_ARGUMENT);
  CHECK(oi_last_error()[0] != '\0');
  CHECK(oi_get_log_level() == OI_LOG_INFO);
  CHECK_ST(oi_set_log_level((oi_log_level)6), OI_ERR_INVALID_ARGUMENT);
  CHECK_ST(oi_set_log_level((oi_log_level)-1), OI_ERR_INVALID_ARGUMENT);
  CHECK(oi_get_log_level() == OI_LOG_INFO);
  oi_clear_error();
}

static void quotes_and_backslashes_in_messages_are_escaped(void) {
  reset_capture();
  CHECK_OK(oi_set_log_level(OI_LOG_WARN));
  OI_LOG(OI_LOG_WARN, "X", "say \"hi\" to C:\\dir\nnext");
  REQUIRE(cap.count == 1);
  CHECK(strcmp(cap.lines[0], "level=warn component=X msg=\"say \\\"hi\\\" to C:\\\\dir next\"") ==
        0);
  CHECK(strchr(cap.lines[0], '\n') == NULL);
}

static void long_message_is_truncated_and_stays_quoted(void) {
  reset_capture();
  CHECK_OK(oi_set_log_level(OI_LOG_WARN));
  char big[2000];
  memset(big, '"', sizeof big - 1); /* every char doubles when escaped */
  big[sizeof big - 1] = '\0';
  OI_LOG(OI_LOG_WARN, "X", "%s", big);
  REQUIRE(cap.count == 1);
  size_t len = strlen(cap.lines[0]);
  CHECK(len < 1024);
  CHECK(len > 0 && cap.lines[0][len - 1] == '"');
  /* The closing quote must not be an escaped one. */
  CHECK(len > 1 && cap.lines[0][len - 2] != '\\');
}

static void null_handler_restores_default_stderr(void) {
  reset_capture();
  CHECK_OK(oi_set_log_level(OI_LOG_WARN));
  oi_set_log_handler(NULL, NULL);

  /* Redirect stderr into a temporary file for the duration of one log call. */
  char path[] = "/tmp/oi_test_log_XXXXXX";
  int tmp = mkstemp(path);
  REQUIRE(tmp >= 0);
  unlink(path);
  fflush(stderr);
  int saved = dup(STDERR_FILENO);
  REQUIRE(saved >= 0);
  REQUIRE(dup2(tmp, STDERR_FILENO) >= 0);
  OI_LOG(OI_LOG_WARN, "X", "to stderr");
  fflush(stderr);
  REQUIRE(dup2(saved, STDERR_FILENO) >= 0);
  close(saved);

  char buf[512] = {0};
  ssize_t n = pread(tmp, buf, sizeof buf - 1, 0);
  close(tmp);
  CHECK(cap.count == 0); /* the old handler no longer receives lines */
  CHECK(n > 0);
  CHECK(strstr(buf, "level=warn component=X msg=\"to stderr\"") != NULL);
}

/* ---- fatal ---------------------------------------------------------------- */

static int fatal_pipe_fd = -1;
static char fatal_tag[] = "FATAL";

static void fatal_marker(void *ctx, const char *reason) {
  const char *tag = ctx;
  char buf[256];
  int n = snprintf(buf, sizeof buf, "%s:%s", tag, reason);
  if (n > 0) {
    ssize_t w = write(fatal_pipe_fd, buf, (size_t)n);
    (void)w;
  }
}

/* Forks a child that calls oi__fatal; returns the child's wait status and what
 * it wrote to the pipe. */
static int run_fatal_child(int install_handler, char *marker, size_t marker_size) {
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  fflush(stderr);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    close(fds[0]);
    struct rlimit no_core = {0, 0};
    setrlimit(RLIMIT_CORE, &no_core);
    oi_set_log_level(OI_LOG_OFF); /* keep the fatal log line out of the test output */
    fatal_pipe_fd = fds[1];
    if (install_handler) oi_set_fatal_handler(fatal_marker, fatal_tag);
    oi__fatal("x");
    /* not reached: oi__fatal is noreturn */
  }
  close(fds[1]);
  size_t got = 0;
  for (;;) {
    ssize_t n = read(fds[0], marker + got, marker_size - 1 - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += (size_t)n;
    if (got == marker_size - 1) break;
  }
  marker[got] = '\0';
  close(fds[0]);
  int wstatus = 0;
  pid_t w;
  do
    w = waitpid(pid, &wstatus, 0);
  while (w < 0 && errno == EINTR);
  REQUIRE(w == pid);
  return wstatus;
}

static void fatal_runs_the_handler_then_aborts(void) {
  char marker[256];
  int ws = run_fatal_child(1, marker, sizeof marker);
  CHECK(WIFSIGNALED(ws));
  CHECK(WIFSIGNALED(ws) && WTERMSIG(ws) == SIGABRT);
  CHECK(strcmp(marker, "FATAL:x") == 0);
}

static void fatal_without_a_handler_still_aborts(void) {
  char marker[256];
  int ws = run_fatal_child(0, marker, sizeof marker);
  CHECK(WIFSIGNALED(ws) && WTERMSIG(ws) == SIGABRT);
  CHECK(strcmp(marker, "") == 0);
}

int main(void) {
  /* Must happen before the first library call reads the level. */
  setenv("OI_LOG_LEVEL", "error", 1);
  RUN_TEST(level_defaults_from_environment);
  RUN_TEST(handler_receives_formatted_lines);
  RUN_TEST(messages_below_the_level_are_dropped);
  RUN_TEST(level_off_silences_everything);
  RUN_TEST(invalid_level_is_rejected_and_level_unchanged);
  RUN_TEST(quotes_and_backslashes_in_messages_are_escaped);
  RUN_TEST(long_message_is_truncated_and_stays_quoted);
  RUN_TEST(null_handler_restores_default_stderr);
  RUN_TEST(fatal_runs_the_handler_then_aborts);
  RUN_TEST(fatal_without_a_handler_still_aborts);
  oi_set_log_handler(NULL, NULL);
  TEST_EXIT();
}
