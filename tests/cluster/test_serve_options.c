/* `openinfer serve --cluster` refuses what would make a node no other host
 * can reach, or a cluster option that cannot work, before it sets up its
 * pool (issue #36): --listen is required with --cluster (the refusal names
 * what to give); a loopback address is never advertised by a node that
 * listens elsewhere; 0.0.0.0 needs --advertise; the secret file (missing,
 * readable by others, too short), the node id, the directory URL and the
 * addresses are checked first (no "pool ready" line). The same checks
 * through oi_host_cluster_options_check, in process.
 *
 * argv[1]: the openinfer executable. Nothing here connects to Redis. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <signal.h>
#include <stdbool.h>

#include "openinfer/experimental.h"
#include "testutil.h"

static const char *g_exe;
static char g_dir[64];
static char g_secret[128], g_open_secret[128], g_short_secret[128], g_missing[128];

static void write_file(const char *path, const char *text, mode_t mode) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, mode);
  REQUIRE(fd >= 0);
  REQUIRE(write(fd, text, strlen(text)) == (ssize_t)strlen(text));
  REQUIRE(fchmod(fd, mode) == 0);
  close(fd);
}

/* Runs `openinfer serve ARGS...` with stderr into *out (up to cap - 1
 * bytes); returns its exit status (-1: killed or not run). */
static int run_serve(const char *const *args, char *out, size_t cap) {
  char log[128];
  snprintf(log, sizeof log, "%s/serve.log", g_dir);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd >= 0) {
      dup2(fd, 2);
      dup2(fd, 1);
      close(fd);
    }
    char sock[128];
    snprintf(sock, sizeof sock, "%s/oi.sock", g_dir);
    const char *argv[40] = {g_exe,    "serve", "--socket", sock,
                            "--pool", "64M",   "--no-pin", "--no-metrics"};
    int n = 8;
    for (int i = 0; args[i] && n < 39; i++)
      argv[n++] = args[i];
    argv[n] = NULL;
    execv(g_exe, (char *const *)argv);
    _exit(127);
  }
  int status = 0;
  /* A refusal is immediate; a server that started is stopped after 10 s. */
  for (int i = 0; i < 1000; i++) {
    if (waitpid(pid, &status, WNOHANG) == pid) break;
    usleep(10000);
    if (i == 999) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
    }
  }
  out[0] = 0;
  FILE *f = fopen(log, "r");
  if (f) {
    size_t r = fread(out, 1, cap - 1, f);
    out[r] = 0;
    fclose(f);
  }
  unlink(log);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* Each a refusal: exit status 2, the message on stderr, no pool set up. */
static void expect_refused(const char *what, const char *const *args, const char *msg) {
  char out[8192];
  int rc = run_serve(args, out, sizeof out);
  bool ok = rc == 2 && strstr(out, msg) && !strstr(out, "pool ready") &&
            !strstr(out, "openinfer serve: listening on");
  if (!ok) {
    fprintf(stderr, "%s: exit %d, expected 2 with \"%s\" and no pool; stderr:\n%s\n", what, rc, msg,
            out);
    oi_test_failures++;
  }
}

#define URL "redis://127.0.0.1:1"

static void test_serve_refusals(void) {
  {
    const char *a[] = {"--cluster", URL, "--node-id", "a", "--cluster-secret", g_secret, NULL};
    expect_refused("no --listen", a, "--cluster needs --node-id, --cluster-secret and --listen");
    expect_refused("no --listen, what to give", a, "--listen IP:PORT: an address of this host");
  }
  {
    const char *a[] = {"--listen", "10.1.2.3:7470", NULL};
    expect_refused("--listen without --cluster", a, "need --cluster");
  }
  {
    const char *a[] = {"--cluster", URL,        "--node-id",     "a",           "--cluster-secret",
                       g_secret,    "--listen", "10.1.2.3:7470", "--advertise", "127.0.0.1:7470",
                       NULL};
    expect_refused("loopback advertised", a, "is a loopback address but the node listens");
  }
  {
    const char *a[] = {"--cluster", URL,        "--node-id",    "a", "--cluster-secret",
                       g_secret,    "--listen", "0.0.0.0:7470", NULL};
    expect_refused("0.0.0.0 without --advertise", a, "0.0.0.0 needs an advertise_addr");
  }
  {
    const char *a[] = {"--cluster",        URL,          "--node-id", "a",
                       "--cluster-secret", g_secret,     "--listen",  "0.0.0.0:7470",
                       "--advertise",      "10.1.2.3:0", NULL};
    expect_refused("advertised port 0", a, "is not an address peers can dial");
  }
  {
    const char *a[] = {"--cluster", URL,        "--node-id", "a", "--cluster-secret",
                       g_secret,    "--listen", "host:7470", NULL};
    expect_refused("listen not IPv4", a, "listen_addr");
  }
  {
    const char *a[] = {"--cluster",   URL,        "--node-id",   "a", "--cluster-secret",
                       g_open_secret, "--listen", "127.0.0.1:0", NULL};
    expect_refused("secret readable by others", a, "chmod 600");
  }
  {
    const char *a[] = {"--cluster", URL,        "--node-id",   "a", "--cluster-secret",
                       g_missing,   "--listen", "127.0.0.1:0", NULL};
    expect_refused("secret missing", a, "cannot open the secret file");
  }
  {
    const char *a[] = {"--cluster",    URL,        "--node-id",   "a", "--cluster-secret",
                       g_short_secret, "--listen", "127.0.0.1:0", NULL};
    expect_refused("secret too short", a, "bytes (16 to");
  }
  {
    const char *a[] = {"--cluster", URL,        "--node-id",   "a b", "--cluster-secret",
                       g_secret,    "--listen", "127.0.0.1:0", NULL};
    expect_refused("bad node id", a, "node id 'a b'");
  }
  {
    const char *a[] = {"--cluster", "http://127.0.0.1:1", "--node-id",   "a", "--cluster-secret",
                       g_secret,    "--listen",           "127.0.0.1:0", NULL};
    expect_refused("bad directory URL", a, "expected redis://");
  }
}

static void test_options_check(void) {
  oi_host_cluster_options o;
  CHECK_OK(oi_host_cluster_options_init(&o));
  CHECK_ST(oi_host_cluster_options_check(NULL), OI_ERR_INVALID_ARGUMENT);
  o.redis_url = URL;
  o.node_id = "a";
  o.secret_file = g_secret;
  CHECK_ST(oi_host_cluster_options_check(&o), OI_ERR_INVALID_ARGUMENT);
  CHECK(strstr(oi_last_error(), "listen_addr"));
  o.listen_addr = "127.0.0.1:0"; /* a cluster on this host */
  CHECK_OK(oi_host_cluster_options_check(&o));
  o.advertise_addr = "127.0.0.2:7470";
  CHECK_OK(oi_host_cluster_options_check(&o));
  o.listen_addr = "10.1.2.3:7470";
  o.advertise_addr = NULL;
  CHECK_OK(oi_host_cluster_options_check(&o));
  o.advertise_addr = "127.0.0.1:7470";
  CHECK_ST(oi_host_cluster_options_check(&o), OI_ERR_INVALID_ARGUMENT);
  o.listen_addr = "0.0.0.0:7470";
  CHECK_ST(oi_host_cluster_options_check(&o), OI_ERR_INVALID_ARGUMENT);
  o.advertise_addr = "10.1.2.3:7470";
  CHECK_OK(oi_host_cluster_options_check(&o));
  o.advertise_addr = "0.0.0.0:7470";
  CHECK_ST(oi_host_cluster_options_check(&o), OI_ERR_INVALID_ARGUMENT);
  o.advertise_addr = "10.1.2.3:7470";
  o.secret_file = g_open_secret;
  CHECK_ST(oi_host_cluster_options_check(&o), OI_ERR_PERMISSION);
  o.secret_file = g_missing;
  CHECK_ST(oi_host_cluster_options_check(&o), OI_ERR_NOT_FOUND);
  o.secret_file = g_secret;
  o.node_id = "no spaces";
  CHECK_ST(oi_host_cluster_options_check(&o), OI_ERR_INVALID_ARGUMENT);
}

int main(int argc, char **argv) {
  if (argc < 2) TEST_SKIP("no openinfer executable given");
  g_exe = argv[1];
  snprintf(g_dir, sizeof g_dir, "/tmp/oi-serve-opts-XXXXXX");
  REQUIRE(mkdtemp(g_dir));
  snprintf(g_secret, sizeof g_secret, "%s/secret", g_dir);
  snprintf(g_open_secret, sizeof g_open_secret, "%s/open-secret", g_dir);
  snprintf(g_short_secret, sizeof g_short_secret, "%s/short-secret", g_dir);
  snprintf(g_missing, sizeof g_missing, "%s/no-such-secret", g_dir);
  write_file(g_secret, "0123456789abcdef0123456789abcdef\n", 0600);
  write_file(g_open_secret, "0123456789abcdef0123456789abcdef\n", 0644);
  write_file(g_short_secret, "short\n", 0600);
  RUN_TEST(test_serve_refusals);
  RUN_TEST(test_options_check);
  tu_remove_dir(g_dir);
  TEST_EXIT();
}
