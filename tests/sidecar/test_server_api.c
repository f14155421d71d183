/* oi_server in this process (the embeddable server, as `openinfer serve`
 * runs it): every option and socket path check of oi_server_create refused
 * with its status and message and nothing returned; the socket's owner file
 * that cannot be written (a warning, the server still serves); a stale
 * socket whose owner still exists (its arenas left alone); a path too long
 * for the temporary bind name; oi_server_run twice, attach_cluster and
 * destroy while it runs; accept failing for want of descriptors (EMFILE:
 * the server waits and serves the queued clients once descriptors are
 * free); an arena on a device the server does not serve. */
#include <pthread.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include "sidecar_util.h"

static char dir[64];

/* Log lines (warnings and infos of the server). */
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static char log_seen[16384];
static void log_handler(void *ctx, oi_log_level level, const char *line) {
  (void)ctx;
  (void)level;
  pthread_mutex_lock(&log_lock);
  size_t n = strlen(log_seen);
  if (n + strlen(line) + 2 >= sizeof log_seen) n = 0; /* keep the latest */
  snprintf(log_seen + n, sizeof log_seen - n, "%s\n", line);
  pthread_mutex_unlock(&log_lock);
}
static bool log_has(const char *needle) {
  pthread_mutex_lock(&log_lock);
  bool ok = strstr(log_seen, needle) != NULL;
  pthread_mutex_unlock(&log_lock);
  return ok;
}
static bool wait_log(const char *needle, int ms) {
  for (int i = 0; i < ms / 10; i++) {
    if (log_has(needle)) return true;
    usleep(10000);
  }
  fprintf(stderr, "no log line with '%s' in:\n%s", needle, log_seen);
  return false;
}
static void log_clear(void) {
  pthread_mutex_lock(&log_lock);
  log_seen[0] = '\0';
  pthread_mutex_unlock(&log_lock);
}

static oi_host_options host_opts;

static void server_opts(oi_server_options *so, const char *path) {
  oi_server_options_init(so);
  so->socket_path = path;
  so->host = &host_opts;
}

static void *run_thread(void *arg) {
  oi_status st = oi_server_run(arg);
  return (void *)(intptr_t)st;
}

/* A server with default options at <dir>/<name>, that path in path[128]. */
static oi_server *create_server(char path[128], const char *name) {
  snprintf(path, 128, "%s/%s", dir, name);
  oi_server_options so;
  server_opts(&so, path);
  oi_server *s = NULL;
  REQUIRE(oi_server_create(&so, &s) == OI_OK);
  return s;
}

/* Runs server s on a thread of its own. @return the thread. */
static pthread_t serve(oi_server *s) {
  pthread_t th;
  REQUIRE(pthread_create(&th, NULL, run_thread, s) == 0);
  return th;
}

/* Stops server s (run by thread th), waits for the thread, destroys s. */
static void stop_and_destroy(oi_server *s, pthread_t th) {
  oi_server_stop(s);
  pthread_join(th, NULL);
  oi_server_destroy(s);
}

/* A client that says Hello and gets the reply. */
static bool served(const char *path) {
  wire_client c;
  if (!wc_connect(&c, path)) return false;
  bool ok = wc_hello(&c, NULL);
  wc_close(&c);
  return ok;
}

static void test_create_refuses_bad_options(void) {
  char path[128];
  snprintf(path, sizeof path, "%s/a.sock", dir);
  oi_server *s = (oi_server *)&s;
  oi_server_options so;
  CHECK_ST(oi_server_options_init(NULL), OI_ERR_INVALID_ARGUMENT);
  server_opts(&so, path);
  CHECK_ST(oi_server_create(&so, NULL), OI_ERR_INVALID_ARGUMENT);
  CHECK_ST(oi_server_create(NULL, &s), OI_ERR_INVALID_ARGUMENT);
  CHECK(s == NULL);
  int32_t dev = 5;
  char longp[200];
  memset(longp, 'x', sizeof longp);
  longp[0] = '/';
  longp[sizeof longp - 1] = '\0';
  char missing[128], file[128], file_dir[160];
  snprintf(missing, sizeof missing, "%s/no-such-dir/a.sock", dir);
  snprintf(file, sizeof file, "%s/plain-file", dir);
  snprintf(file_dir, sizeof file_dir, "%s/a.sock", file);
  FILE *f = fopen(file, "w");
  REQUIRE(f);
  fclose(f);
  static const struct {
    oi_status st;
    const char *msg;
  } want[] = {
      {OI_ERR_INVALID_ARGUMENT, "struct_size 0 is too small"},
      {OI_ERR_INVALID_ARGUMENT, "host options are NULL"},
      {OI_ERR_INVALID_ARGUMENT, "socket_mode 1000 is not a permission mode"},
      {OI_ERR_INVALID_ARGUMENT, "a list has a count but no array"},
      {OI_ERR_INVALID_ARGUMENT, "a list has a count but no array"},
      {OI_ERR_INVALID_ARGUMENT, "a list has a count but no array"},
      {OI_ERR_INVALID_ARGUMENT, "max_sessions is 0"},
      {OI_ERR_INVALID_ARGUMENT, "log_level 42 is not an oi_log_level"},
      {OI_ERR_INVALID_ARGUMENT, "server_create: device 5"},
      {OI_ERR_INVALID_ARGUMENT, "server_create host: struct_size 0"},
      {OI_ERR_INVALID_ARGUMENT, "the socket path is empty"},
      {OI_ERR_INVALID_ARGUMENT, "is longer than 107 bytes"},
      {OI_ERR_INVALID_ARGUMENT, "no-such-dir: No such file or directory"},
      {OI_ERR_INVALID_ARGUMENT, "plain-file is not a directory"},
      {OI_ERR_STATE, "plain-file exists and is not a socket (not removing it)"},
      {OI_ERR_STATE, "/etc exists and is not a socket"},
  };
  bool root = geteuid() == 0; /* (root may create a socket in /; others may not) */
  oi_host_options bad_ho = {.struct_size = 0};
  for (size_t i = 0; i < OI_ARRAY_LEN(want); i++) {
    server_opts(&so, path);
    switch (i) {
    case 0: so.struct_size = 0; break;
    case 1: so.host = NULL; break;
    case 2: so.socket_mode = 01000; break;
    case 3: so.num_allowed_uids = 1; break;
    case 4: so.num_allowed_gids = 1; break;
    case 5: so.num_devices = 1; break;
    case 6: so.max_sessions = 0; break;
    case 7: so.log_level = 42; break;
    case 8: so.devices = &dev, so.num_devices = 1; break;
    case 9: so.host = &bad_ho; break;
    case 10: so.socket_path = ""; break;
    case 11: so.socket_path = longp; break;
    case 12: so.socket_path = missing; break;
    case 13: so.socket_path = file_dir; break;
    case 14: so.socket_path = file; break;
    case 15: so.socket_path = "/etc"; break; /* (its directory is the root) */
    }
    s = (oi_server *)&s;
    oi_status st = oi_server_create(&so, &s);
    oi_status want_st = want[i].st;
    const char *want_msg = want[i].msg;
    if (i == 8) want_st = st == OI_OK ? OI_ERR_INVALID_ARGUMENT : st; /* the device's own error */
    if (i == 15 && !root)
      want_st = OI_ERR_PERMISSION, want_msg = "no permission to create a socket in /";
    if (st != want_st || s != NULL || !strstr(oi_last_error(), want_msg)) {
      fprintf(stderr, "case %zu: %s '%s', expected %s '%s'\n", i, oi_status_str(st),
              oi_last_error(), oi_status_str(want_st), want_msg);
      CHECK(0);
    }
  }
  /* Nothing was left behind: the plain file stays, no socket appeared. */
  struct stat st;
  CHECK(stat(file, &st) == 0 && S_ISREG(st.st_mode));
  CHECK(lstat(path, &st) != 0);
  unlink(file);
  /* NULL servers. */
  CHECK(oi_server_epoch(NULL) == 0 && oi_server_socket_path(NULL) == NULL);
  CHECK_ST(oi_server_stop(NULL), OI_ERR_INVALID_ARGUMENT);
  CHECK_ST(oi_server_run(NULL), OI_ERR_INVALID_ARGUMENT);
  CHECK_ST(oi_server_attach_cluster(NULL, NULL), OI_ERR_INVALID_ARGUMENT);
  oi_server_destroy(NULL);
}

/* The run states: run twice, attach a cluster or destroy while it runs
 * (refused, the server keeps running), run after it ran. A live socket is
 * not taken over by a second server. */
static void test_run_states(void) {
  char path[128];
  snprintf(path, sizeof path, "%s/r.sock", dir);
  oi_server_options so;
  server_opts(&so, path);
  oi_server *s = NULL;
  REQUIRE(oi_server_create(&so, &s) == OI_OK);
  CHECK(!strcmp(oi_server_socket_path(s), path) && oi_server_epoch(s) != 0);
  pthread_t th = serve(s);
  CHECK(served(path)); /* the thread runs it */
  CHECK_ST(oi_server_run(s), OI_ERR_STATE);
  CHECK(strstr(oi_last_error(), "is running"));
  oi_host_cluster_options co;
  memset(&co, 0, sizeof co);
  CHECK_ST(oi_server_attach_cluster(s, &co), OI_ERR_STATE);
  CHECK(strstr(oi_last_error(), "runs already"));
  log_clear();
  oi_server_destroy(s); /* refused: it runs */
  CHECK(log_has("server_destroy while oi_server_run runs: refused"));
  CHECK(served(path));
  /* A second server on the live socket: BUSY, the first one untouched. */
  oi_server *s2 = (oi_server *)&s2;
  CHECK_ST(oi_server_create(&so, &s2), OI_ERR_BUSY);
  CHECK(s2 == NULL && strstr(oi_last_error(), "another server listens"));
  CHECK(served(path));
  oi_server_stop(s);
  void *ret = NULL;
  pthread_join(th, &ret);
  CHECK((oi_status)(intptr_t)ret == OI_OK);
  CHECK_ST(oi_server_run(s), OI_ERR_STATE);
  CHECK(strstr(oi_last_error(), "already ran"));
  oi_server_destroy(s);
  struct stat sb;
  CHECK(lstat(path, &sb) != 0); /* its socket removed */
}

/* The owner file `<socket>.pid` cannot be written (a directory stands where
 * its temporary file or the file itself would go): a warning, and the
 * server serves. A stale socket whose owner still runs: replaced, the
 * owner's arenas left alone. A path with no room for the temporary bind
 * name: bound directly. A relative path. */
static void test_socket_files(void) {
  char path[128], owner[160], tmp[200];
  snprintf(path, sizeof path, "%s/o.sock", dir);
  snprintf(owner, sizeof owner, "%s.pid", path);
  snprintf(tmp, sizeof tmp, "%s.%d.tmp", owner, (int)getpid());
  oi_server_options so;
  server_opts(&so, path);
  for (int k = 0; k < 2; k++) {
    const char *blocker = k == 0 ? tmp : owner;
    REQUIRE(mkdir(blocker, 0700) == 0);
    log_clear();
    oi_server *s = NULL;
    REQUIRE(oi_server_create(&so, &s) == OI_OK);
    char want[256];
    snprintf(want, sizeof want, "cannot write %s", owner);
    CHECK(log_has(want));
    pthread_t th = serve(s);
    CHECK(served(path));
    stop_and_destroy(s, th);
    CHECK(rmdir(blocker) == 0);
  }

  /* A stale socket (bound, nothing listens) whose owner file names a live
   * process that is not this one. */
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  memcpy(sa.sun_path, path, strlen(path) + 1); /* (well under sun_path) */
  REQUIRE(fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0);
  close(fd);
  FILE *f = fopen(owner, "w");
  REQUIRE(f);
  fprintf(f, "%d\n", (int)getppid());
  fclose(f);
  log_clear();
  oi_server *s = NULL;
  REQUIRE(oi_server_create(&so, &s) == OI_OK);
  CHECK(log_has("replacing the stale socket"));
  CHECK(log_has("still exists: leaving its arenas alone"));
  pthread_t th = serve(s);
  CHECK(served(path));
  stop_and_destroy(s, th);
  struct stat sb;
  CHECK(lstat(owner, &sb) != 0); /* its own owner file removed with it */

  /* Stale sockets whose owner file names this process, holds no number, or
   * names a process that has exited (and left no arenas): replaced, nothing
   * removed or reported of an owner, and the server serves. */
  pid_t dead = fork();
  REQUIRE(dead >= 0);
  if (dead == 0) _exit(0);
  REQUIRE(waitpid(dead, NULL, 0) == dead);
  for (int k = 0; k < 3; k++) {
    fd = socket(AF_UNIX, SOCK_STREAM, 0);
    REQUIRE(fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0);
    close(fd);
    f = fopen(owner, "w");
    REQUIRE(f);
    if (k == 0) fprintf(f, "%d\n", (int)getpid());
    if (k == 1) fprintf(f, "not a pid\n");
    if (k == 2) fprintf(f, "%d\n", (int)dead);
    fclose(f);
    log_clear();
    s = NULL;
    REQUIRE(oi_server_create(&so, &s) == OI_OK);
    CHECK(log_has("replacing the stale socket"));
    CHECK(!log_has("still exists") && !log_has("left behind"));
    th = serve(s);
    CHECK(served(path));
    stop_and_destroy(s, th);
    CHECK(lstat(owner, &sb) != 0);
  }

  /* 100 bytes: "<path>.<pid>.tmp" does not fit in sun_path. */
  char longp[108];
  int n = snprintf(longp, sizeof longp, "%s/", dir);
  memset(longp + n, 'l', 100 - (size_t)n);
  longp[100] = '\0';
  server_opts(&so, longp);
  REQUIRE(oi_server_create(&so, &s) == OI_OK);
  th = serve(s);
  CHECK(served(longp));
  stop_and_destroy(s, th);
  CHECK(lstat(longp, &sb) != 0);

  /* No path: $XDG_RUNTIME_DIR/openinfer.sock (a directory too long for
   * it: refused). */
  const char *saved = getenv("XDG_RUNTIME_DIR");
  char *keep = saved ? strdup(saved) : NULL;
  setenv("XDG_RUNTIME_DIR", dir, 1);
  server_opts(&so, NULL);
  REQUIRE(oi_server_create(&so, &s) == OI_OK);
  char def[128];
  snprintf(def, sizeof def, "%s/openinfer.sock", dir);
  CHECK(!strcmp(oi_server_socket_path(s), def) && lstat(def, &sb) == 0 && S_ISSOCK(sb.st_mode));
  oi_server_destroy(s);
  CHECK(lstat(def, &sb) != 0);
  char longdir[120];
  memset(longdir, 'd', sizeof longdir);
  longdir[0] = '/';
  longdir[sizeof longdir - 1] = '\0';
  setenv("XDG_RUNTIME_DIR", longdir, 1);
  s = (oi_server *)&s;
  CHECK_ST(oi_server_create(&so, &s), OI_ERR_INVALID_ARGUMENT);
  CHECK(s == NULL && strstr(oi_last_error(), "default socket path is too long"));
  if (keep)
    setenv("XDG_RUNTIME_DIR", keep, 1);
  else
    unsetenv("XDG_RUNTIME_DIR");
  free(keep);

  /* A relative path (no directory part): the working directory. */
  char cwd[4096];
  REQUIRE(getcwd(cwd, sizeof cwd));
  REQUIRE(chdir(dir) == 0);
  server_opts(&so, "rel.sock");
  REQUIRE(oi_server_create(&so, &s) == OI_OK);
  CHECK(lstat("rel.sock", &sb) == 0 && S_ISSOCK(sb.st_mode));
  oi_server_destroy(s);
  CHECK(lstat("rel.sock", &sb) != 0);
  REQUIRE(chdir(cwd) == 0);
}

static int open_fds(void) {
  int n = 0;
  DIR *d = opendir("/proc/self/fd");
  if (!d) return -1;
  struct dirent *de;
  while ((de = readdir(d)))
    n += de->d_name[0] != '.';
  closedir(d);
  return n - 1; /* the directory's own */
}

/* The process runs out of descriptors while clients wait in the listen
 * queue: accept fails with EMFILE, the server says so and waits (it does
 * not spin), and once descriptors are free it serves the waiting clients. */
static void test_accept_without_descriptors(void) {
  char path[128];
  oi_server *s = create_server(path, "m.sock");
  /* Three clients queue before the server runs. */
  wire_client c[3];
  for (int i = 0; i < 3; i++)
    REQUIRE(wc_connect(&c[i], path));
  struct rlimit old, low;
  REQUIRE(getrlimit(RLIMIT_NOFILE, &old) == 0);
  int used = open_fds();
  REQUIRE(used > 0);
  low = old;
  low.rlim_cur = (rlim_t)used + 16;
  REQUIRE(setrlimit(RLIMIT_NOFILE, &low) == 0);
  int nul = open("/dev/null", O_RDONLY | O_CLOEXEC);
  REQUIRE(nul >= 0);
  int filler[64], nfill = 0;
  while (nfill < 64 && (filler[nfill] = dup(nul)) >= 0)
    nfill++;
  CHECK(nfill < 64 && errno == EMFILE);
  log_clear();
  pthread_t th = serve(s);
  CHECK(wait_log("accept: Too many open files", 5000));
  usleep(50000); /* still out of descriptors: nobody accepted */
  for (int i = 0; i < nfill; i++)
    close(filler[i]);
  close(nul);
  REQUIRE(setrlimit(RLIMIT_NOFILE, &old) == 0);
  for (int i = 0; i < 3; i++) {
    CHECK(wc_hello(&c[i], NULL));
    wc_close(&c[i]);
  }
  CHECK(served(path));
  stop_and_destroy(s, th);
}

/* --arena-devices cpu: a Register for another device is refused with
 * OI_ERR_PERMISSION, the session stays; the cpu registers. */
static void test_device_not_served(void) {
  char path[128];
  snprintf(path, sizeof path, "%s/d.sock", dir);
  oi_server_options so;
  server_opts(&so, path);
  int32_t cpu = OI_DEVICE_CPU;
  so.devices = &cpu;
  so.num_devices = 1;
  oi_server *s = NULL;
  REQUIRE(oi_server_create(&so, &s) == OI_OK);
  pthread_t th = serve(s);
  wire_client c;
  REQUIRE(wc_connect(&c, path) && wc_hello(&c, NULL));
  CHECK(wc_call_register(&c, "not-served", 3));
  CHECK(wc_status(&c) == OI_ERR_PERMISSION &&
        strstr(c.env.body.result.message, "does not serve device 3"));
  CHECK(wc_register(&c, "served", NULL, NULL) != 0);
  wc_close(&c);
  stop_and_destroy(s, th);
}

int main(void) {
  snprintf(dir, sizeof dir, "/tmp/oi-srvapi-XXXXXX");
  REQUIRE(mkdtemp(dir));
  oi_set_log_handler(log_handler, NULL);
  oi_set_log_level(OI_LOG_INFO);
  oi_host_options_init(&host_opts);
  host_opts.pool_bytes = 8 << 20;
  host_opts.flags = OI_HOST_NO_PIN;
  RUN_TEST(test_create_refuses_bad_options);
  RUN_TEST(test_run_states);
  RUN_TEST(test_socket_files);
  RUN_TEST(test_accept_without_descriptors);
  RUN_TEST(test_device_not_served);
  oi_set_log_handler(NULL, NULL);
  CHECK(rmdir(dir) == 0); /* every server removed what it made */
  TEST_EXIT();
}
