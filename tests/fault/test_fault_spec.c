/* OI_FAULTS, the environment's way to arm fault points (how `openinfer
 * serve` is armed in tests): a good spec arms its points; a malformed one
 * (an unknown point, a value that is not a number, an item too long) is
 * reported on stderr and arms nothing, not even the items before the bad
 * one. The environment is read once per process, so each spec runs in a
 * child process of its own (this program again, with --child). clock_jump shows whether it was
 * armed: oi__fault_clock adds its jump only when armed. */
#include <fcntl.h>
#include <sys/wait.h>

#include "fault_util.h"

/* Runs `spec` in a child; *jump_ms: what the first clock reading jumped
 * (0: not armed); `log`: what the child wrote to stderr. */
static bool run_spec(const char *spec, uint64_t *jump_ms, char *log, size_t cap) {
  char path[] = "/tmp/oi-fault-spec-XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) return false;
  unlink(path);
  int pp[2];
  if (pipe(pp) != 0) return false;
  pid_t pid = fork();
  if (pid == 0) {
    close(pp[0]);
    dup2(fd, 2);
    dup2(pp[1], 1);
    setenv("OI_FAULTS", spec, 1);
    execl("/proc/self/exe", "test_fault_spec", "--child", (char *)NULL);
    _exit(127);
  }
  close(pp[1]);
  bool ok = read(pp[0], jump_ms, sizeof *jump_ms) == (ssize_t)sizeof *jump_ms;
  close(pp[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  ssize_t n = pread(fd, log, cap - 1, 0);
  log[n > 0 ? n : 0] = '\0';
  close(fd);
  return ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

static void test_good_spec_arms(void) {
  uint64_t jump = 0;
  char log[1024];
  /* Empty items between commas are skipped. */
  REQUIRE(run_spec("copy_slow:0:0:1,,clock_jump:0:1:7000", &jump, log, sizeof log));
  CHECK(jump == 7000);
  CHECK(strstr(log, "fault injection armed from OI_FAULTS"));
}

static void test_bad_specs_arm_nothing(void) {
  char long_item[200];
  memset(long_item, 'a', sizeof long_item - 1);
  long_item[sizeof long_item - 1] = '\0';
  char long_spec[256];
  snprintf(long_spec, sizeof long_spec, "clock_jump:0:1:7000,%s", long_item);
  const struct {
    const char *spec, *why;
  } cases[] = {
      {"clock_jump:0:1:7000,no_such_point", "no fault point 'no_such_point'"},
      {"clock_jump:0:1:7000,copy_fail:x", "is not a number list"},
      {"clock_jump:0:1:7000,copy_fail:1:2z", "is not a number list"},
      {long_spec, "bad item"},
  };
  for (size_t i = 0; i < OI_ARRAY_LEN(cases); i++) {
    uint64_t jump = 1;
    char log[2048];
    REQUIRE(run_spec(cases[i].spec, &jump, log, sizeof log));
    if (jump != 0 || !strstr(log, "ignored") || !strstr(log, cases[i].why)) {
      fprintf(stderr, "spec '%.60s': jump %llu, stderr: %s\n", cases[i].spec,
              (unsigned long long)jump, log);
      CHECK(false);
    }
  }
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "--child") == 0) {
    /* The first hit of a point reads OI_FAULTS. */
    uint64_t jump = oi__fault_clock(0) / 1000000ull;
    return write(1, &jump, sizeof jump) == (ssize_t)sizeof jump ? 0 : 1;
  }
  if (!oi__fault_available()) TEST_SKIP("built without -Dfault_injection=true");
  RUN_TEST(test_good_spec_arms);
  RUN_TEST(test_bad_specs_arm_nothing);
  TEST_EXIT();
}
