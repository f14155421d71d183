/* The cluster end to end: one real `openinfer serve --cluster` per network
 * namespace (the tools/openinfer executable, path in argv[1]), three
 * namespaces joined by a bridge in a fourth, redis-server in the first. The
 * test process stays in the root namespace and connects sidecar engines to
 * every node through their Unix sockets (paths in the file system, which
 * network namespaces do not separate).
 *  (a) node 1 saves; node 2's query (OI_QUERY_WAIT_PENDING) fetches every
 *      block from node 1, byte-exact;
 *      its figures (oi_server_fetch_cluster_stats, `openinfer stats`, its
 *      --json and /metrics) count the fetch, not as saves;
 *  (b) node 3 gets them too (from node 1 or 2);
 *  (f) a node with another secret gets misses; the others keep serving;
 *  (e) a holder's link down: fetches from it miss within the deadline (no
 *      hang); link up: they work again;
 *  (c) a holder killed (SIGKILL): queries for blocks only it had miss
 *      within the deadline, never wrong bytes; the others keep serving;
 *  (d) Redis killed: queries for new blocks miss quickly (local only);
 *      restarted: after the nodes republish, fetches work again;
 *  then random saves and queries on random nodes against a reference model:
 *  every hit byte-exact, every block saved on a live node eventually hits
 *  on every node.
 * The nodes reach Redis as an operator who guards it would have them:
 * over TLS (rediss://, a CA and a client certificate made here with the
 * openssl command, Redis asking clients for one) with AUTH (a password
 * from --redis-auth-file); the test's own look at Redis goes through a
 * plain port with the password. Without the openssl command or a Redis
 * built with TLS, the nodes use plain TCP with AUTH (said in the output).
 * Needs CAP_NET_ADMIN and `ip` for the namespaces; without them every node
 * runs on 127.0.0.1 (said in the output), and a stopped server (SIGSTOP)
 * stands in for the link taken down (OI_NETNS_LOOPBACK=1 forces that mode).
 * Skips (77) without redis-server. */
#include <sched.h>
#include <stdarg.h>
#include <sys/prctl.h>

#include "../sidecar/sidecar_util.h"
#include "cluster_util.h"

#define NODES 4 /* 1..3 in the cluster; 4: another secret */
#define N 16    /* blocks per test; the arena has TL_BLOCKS = 32 */
#define WAIT_MS 4000
#define FETCH_TIMEOUT_MS 2000 /* serve's cluster timeout_ms (the default) */

static const char *NS = "netns-model";

static bool g_netns;
static char g_ns[NODES + 1][32]; /* [0]: the bridge's namespace; [k]: node k's */
static char g_addr[NODES + 1][32];
static int g_subnet[2];
static char g_dir[40];
static char g_secret[256], g_other_secret[256];
static int g_redis_port;       /* the nodes' (TLS where g_tls) */
static int g_redis_plain_port; /* the test's own look (with the password) */
static bool g_tls;
static char g_auth_file[64];
#define REDIS_PASSWORD "netns-redis-password"
static pid_t g_redis;
static redisContext *g_rc;
static const char *g_exe;
static pid_t g_main_pid;

typedef struct node {
  test_server ts;
  char id[32];
  oi_engine *e;
  oi_imported_arena *arena;
  uint8_t *base;
  oi_arena_desc a[TL_ARENAS];
} node;

static node g_nodes[NODES + 1];

/* ---- processes and namespaces ------------------------------------------------------------ */

/* Runs argv (execvp), output discarded; @return its exit status (-1: no). */
static int run_argv(char *const argv[]) {
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    int fd = open("/dev/null", O_WRONLY);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    execvp(argv[0], argv);
    _exit(127);
  }
  int status;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* `ip ARGS...`, the arguments split at spaces. @return true on success. */
static bool ip(const char *fmt, ...) {
  char line[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  char *argv[32];
  int n = 0;
  argv[n++] = "ip";
  for (char *save = NULL, *tok = strtok_r(line, " ", &save); tok && n < 31;
       tok = strtok_r(NULL, " ", &save))
    argv[n++] = tok;
  argv[n] = NULL;
  return run_argv(argv) == 0;
}

static void netns_delete_all(void) {
  for (int k = 0; k <= 3; k++)
    if (g_ns[k][0]) {
      char *argv[] = {"ip", "netns", "del", g_ns[k], NULL};
      run_argv(argv);
    }
}

/* Kills every process the test started and removes the namespaces: at exit
 * and on SIGINT/SIGTERM/SIGHUP, so a failure leaves nothing behind. */
static volatile sig_atomic_t g_cleaning;

static void cleanup(void) {
  if (getpid() != g_main_pid) return;
  g_cleaning = 1;
  for (int k = 1; k <= NODES; k++)
    if (g_nodes[k].ts.pid) {
      kill(g_nodes[k].ts.pid, SIGKILL);
      waitpid(g_nodes[k].ts.pid, NULL, 0);
      ts_unlink_shm_of(g_nodes[k].ts.pid);
      g_nodes[k].ts.pid = 0;
    }
  if (g_redis) {
    kill(g_redis, SIGKILL);
    waitpid(g_redis, NULL, 0);
    g_redis = 0;
  }
  if (g_netns) netns_delete_all();
  g_netns = false;
}

static void on_fatal_signal(int sig) {
  cleanup();
  signal(sig, SIG_DFL);
  raise(sig);
}

/* Namespaces named oinet<pid>-* whose test process is gone (a run killed
 * with SIGKILL): removed. */
static void remove_leftovers(void) {
  DIR *d = opendir("/run/netns");
  if (!d) return;
  struct dirent *de;
  while ((de = readdir(d))) {
    int pid;
    char rest[64];
    if (sscanf(de->d_name, "oinet%d-%63s", &pid, rest) != 2) continue;
    if (pid == getpid() || kill(pid, 0) == 0 || errno != ESRCH) continue;
    char name[300];
    snprintf(name, sizeof name, "%s", de->d_name);
    char *argv[] = {"ip", "netns", "del", name, NULL};
    run_argv(argv);
  }
  closedir(d);
}

/* Three namespaces with veths to a bridge in a fourth, 10.A.B.k/24 each,
 * links and loopback up. @return false where namespaces cannot be made. */
static bool netns_setup(void) {
  if (!on_path("ip") || getenv("OI_NETNS_LOOPBACK")) return false;
  remove_leftovers();
  int pid = getpid();
  g_subnet[0] = 64 + (pid >> 8) % 128;
  g_subnet[1] = pid & 255;
  snprintf(g_ns[0], sizeof g_ns[0], "oinet%d-br", pid);
  if (!ip("netns add %s", g_ns[0])) {
    g_ns[0][0] = 0;
    return false;
  }
  g_netns = true; /* from here on, cleanup removes them */
  bool ok = ip("-n %s link add br0 type bridge", g_ns[0]) && ip("-n %s link set br0 up", g_ns[0]) &&
            ip("-n %s link set lo up", g_ns[0]);
  for (int k = 1; ok && k <= 3; k++) {
    snprintf(g_ns[k], sizeof g_ns[k], "oinet%d-%d", pid, k);
    snprintf(g_addr[k], sizeof g_addr[k], "10.%d.%d.%d", g_subnet[0], g_subnet[1], k);
    ok = ip("netns add %s", g_ns[k]) &&
         ip("link add v%d netns %s type veth peer name b%d netns %s", k, g_ns[k], k, g_ns[0]) &&
         ip("-n %s link set b%d master br0", g_ns[0], k) &&
         ip("-n %s link set b%d up", g_ns[0], k) &&
         ip("-n %s addr add %s/24 dev v%d", g_ns[k], g_addr[k], k) &&
         ip("-n %s link set v%d up", g_ns[k], k) && ip("-n %s link set lo up", g_ns[k]);
  }
  if (!ok) {
    fprintf(stderr, "setting up the network namespaces failed\n");
    netns_delete_all();
    g_netns = false;
    memset(g_ns, 0, sizeof g_ns);
  }
  return ok;
}

/* In a child: enter namespace `ns` (NULL: stay). */
static void enter_netns(const char *ns) {
  if (!ns) return;
  char p[160];
  snprintf(p, sizeof p, "/run/netns/%s", ns);
  int fd = open(p, O_RDONLY | O_CLOEXEC);
  if (fd < 0 || setns(fd, CLONE_NEWNET) != 0) {
    perror("setns");
    _exit(126);
  }
  close(fd);
}

static const char *node_ns(int k) { return g_netns ? g_ns[k == 4 ? 3 : k] : NULL; }
static const char *node_addr(int k) { return g_netns ? g_addr[k == 4 ? 3 : k] : "127.0.0.1"; }
static const char *redis_addr(void) { return g_netns ? g_addr[1] : "127.0.0.1"; }

/* A connection to Redis from the test process: made inside node 1's
 * namespace (this thread enters it and comes back), used from here. */
static redisContext *redis_connect(void) {
  int self = -1;
  if (g_netns) {
    self = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    char p[128];
    snprintf(p, sizeof p, "/run/netns/%s", g_ns[1]);
    int fd = open(p, O_RDONLY | O_CLOEXEC);
    REQUIRE(self >= 0 && fd >= 0 && setns(fd, CLONE_NEWNET) == 0);
    close(fd);
  }
  struct timeval tv = {1, 0};
  redisContext *c = redisConnectWithTimeout(redis_addr(), g_redis_plain_port, tv);
  if (self >= 0) {
    REQUIRE(setns(self, CLONE_NEWNET) == 0);
    close(self);
  }
  if (c && c->err) {
    redisFree(c);
    c = NULL;
  }
  if (c) {
    redisSetTimeout(c, tv);
    redisReply *r = redisCommand(c, "AUTH %s", REDIS_PASSWORD);
    bool ok = r && r->type == REDIS_REPLY_STATUS;
    if (r) freeReplyObject(r);
    if (!ok) {
      redisFree(c);
      c = NULL;
    }
  }
  return c;
}

static void redis_up(void) {
  char port[16];
  snprintf(port, sizeof port, "%d", g_redis_plain_port);
  const char *const *tls = g_tls ? redis_tls_args(g_dir, g_redis_port, true) : NULL;
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    enter_netns(node_ns(1));
    int fd = open("/dev/null", O_WRONLY);
    if (fd >= 0) dup2(fd, 1);
    /* (protected mode refuses clients off loopback; the namespaces are private) */
    const char *argv[32] = {"redis-server",
                            "--port",
                            port,
                            "--bind",
                            redis_addr(),
                            "--save",
                            "",
                            "--appendonly",
                            "no",
                            "--daemonize",
                            "no",
                            "--protected-mode",
                            "no",
                            "--requirepass",
                            REDIS_PASSWORD};
    for (int i = 0; tls && tls[i]; i++)
      argv[15 + i] = tls[i];
    execvp("redis-server", (char *const *)argv);
    _exit(127);
  }
  g_redis = pid;
  for (int i = 0; i < 500; i++) {
    if ((g_rc = redis_connect())) {
      redisReply *r = redisCommand(g_rc, "PING");
      bool ok = r && r->type == REDIS_REPLY_STATUS;
      if (r) freeReplyObject(r);
      if (ok) return;
      redisFree(g_rc);
      g_rc = NULL;
    }
    sleep_ms(10);
  }
  REQUIRE(!"redis-server answered PING within 5 s");
}

static void redis_down(void) {
  if (g_rc) redisFree(g_rc);
  g_rc = NULL;
  redis_stop(g_redis);
  g_redis = 0;
}

/* Starts `openinfer serve --cluster` for node k in its namespace and waits
 * for its ready line. */
static bool node_start(int k, const char *secret) {
  node *n = &g_nodes[k];
  test_server *ts = &n->ts;
  static int generation;
  snprintf(n->id, sizeof n->id, "node-%d", k);
  snprintf(ts->dir, sizeof ts->dir, "%s", g_dir);
  snprintf(ts->socket, sizeof ts->socket, "%s/node%d.sock", g_dir, k);
  snprintf(ts->log, sizeof ts->log, "%s/node%d-%d.log", g_dir, k, generation++);
  char url[96], listen[64], ca[128], cert[128], key[128];
  snprintf(url, sizeof url, "%s://%s:%d", g_tls ? "rediss" : "redis", redis_addr(), g_redis_port);
  snprintf(ca, sizeof ca, "%s/ca.crt", g_dir);
  snprintf(cert, sizeof cert, "%s/client.crt", g_dir);
  snprintf(key, sizeof key, "%s/client.key", g_dir);
  snprintf(listen, sizeof listen, "%s:0", node_addr(k));
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    int fd = open(ts->log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd >= 0) {
      dup2(fd, 2);
      dup2(fd, 1);
      close(fd);
    }
    /* Node 2 serves /metrics (on its namespace's loopback): test_a2. */
    const char *args[] = {g_exe,
                          "serve",
                          "--socket",
                          ts->socket,
                          "--pool",
                          "64M",
                          "--no-pin",
                          "--log-level",
                          "info",
                          "--cluster",
                          url,
                          "--node-id",
                          n->id,
                          "--cluster-secret",
                          secret,
                          "--listen",
                          listen,
                          "--redis-auth-file",
                          g_auth_file,
                          k == 2 ? "--metrics-addr" : "--no-metrics",
                          k == 2 ? "127.0.0.1:0" : NULL,
                          NULL,
                          NULL,
                          NULL,
                          NULL,
                          NULL,
                          NULL,
                          NULL};
    if (g_tls) {
      int a = 0;
      while (args[a])
        a++;
      const char *tls_args[] = {"--redis-tls-ca",  ca, "--redis-tls-cert", cert,
                                "--redis-tls-key", key};
      for (int i = 0; i < 6; i++)
        args[a + i] = tls_args[i];
    }
    if (!g_netns) {
      execv(g_exe, (char *const *)args);
      _exit(127);
    }
    /* `ip netns exec` (which execs, no fork) also mounts the namespace's own
     * /sys: UCX finds its network devices in /sys/class/net, and with the
     * root namespace's there it finds none that reaches a peer ("Destination
     * is unreachable"). */
    const char *argv[4 + OI_ARRAY_LEN(args)] = {"ip", "netns", "exec", node_ns(k)};
    for (int i = 0; args[i]; i++)
      argv[4 + i] = args[i];
    execvp("ip", (char *const *)argv);
    _exit(127);
  }
  ts->pid = pid;
  for (int i = 0; i < 1000; i++) { /* 10 s */
    if (ts_log_contains(ts, "openinfer serve: listening on")) return true;
    int status;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      ts->pid = 0;
      fprintf(stderr, "node %d exited before it was ready (status 0x%x)\n", k, status);
      ts_dump_log(ts);
      return false;
    }
    sleep_ms(10);
  }
  fprintf(stderr, "node %d did not get ready in 10 s\n", k);
  ts_dump_log(ts);
  return false;
}

static void fatal_is_a_failure(void *ctx, const char *reason) {
  (void)ctx;
  if (g_cleaning) /* the servers are being killed: the cleanup ends the process */
    for (;;)
      pause();
  fprintf(stderr, "unexpected fatal handler call: %s\n", reason);
  cleanup();
  _exit(3);
}

static void engine_open(int k) {
  node *n = &g_nodes[k];
  oi_engine_options o;
  tl_options(&o, n->a, NS);
  REQUIRE(oi_engine_connect(n->ts.socket, &o, &n->e, &n->arena) == OI_OK);
  n->base = oi_imported_arena_ptr(n->arena);
}

static void engine_close(int k) {
  node *n = &g_nodes[k];
  if (n->arena) oi_imported_arena_close(n->arena);
  if (n->e) oi_engine_destroy(n->e);
  n->arena = NULL;
  n->e = NULL;
  n->base = NULL;
}

/* ---- saves, queries, the directory ------------------------------------------------------- */

/* Saves logical blocks (salt, first..first+count) on node k and flushes. */
static void save(int k, uint32_t salt, uint64_t first, int count) {
  node *n = &g_nodes[k];
  int64_t ids[N];
  oi_block_hash hs[N];
  REQUIRE(count <= N);
  for (int b = 0; b < count; b++) {
    ids[b] = b;
    hs[b] = tl_hash(salt, first + (uint64_t)b);
    tl_fill(n->base, n->a, b, salt * 1000003ull + first + (uint64_t)b);
  }
  CHECK_OK(tr_save(n->e, ids, hs, (size_t)count, 10000));
  CHECK_OK(oi_engine_flush(n->e, 10000));
}

/* One query on node k with OI_QUERY_WAIT_PENDING; the hits are loaded into
 * device blocks N.. and checked byte by byte (any wrong byte fails the
 * test). @return the hits; *ms: the query's time. */
static uint64_t query_once(int k, uint32_t salt, uint64_t first, int count, uint32_t wait_ms,
                           double *ms) {
  node *n = &g_nodes[k];
  oi_block_hash hs[N];
  for (int b = 0; b < count; b++)
    hs[b] = tl_hash(salt, first + (uint64_t)b);
  oi_query_result q = {.struct_size = sizeof q, .wait_ms = wait_ms};
  uint64_t t0 = oi__now_ns();
  oi_status st =
      oi_engine_query(n->e, NULL, hs, (size_t)count, wait_ms ? OI_QUERY_WAIT_PENDING : 0, &q);
  if (ms) *ms = ms_since(t0);
  CHECK_OK(st);
  if (st != OI_OK || q.hit_blocks == 0) return 0;
  int64_t dst[N];
  for (uint64_t b = 0; b < q.hit_blocks; b++) {
    dst[b] = N + (int64_t)b;
    tl_fill(n->base, n->a, dst[b], 0xdeadull); /* not any block's bytes */
  }
  CHECK_OK(tr_load(n->e, q.lease, dst, q.hit_blocks, 10000));
  for (uint64_t b = 0; b < q.hit_blocks; b++)
    CHECK(tl_check(n->base, n->a, dst[b], salt * 1000003ull + first + b));
  return q.hit_blocks;
}

/* Queries until every block hits (publishing is asynchronous) or
 * `deadline_ms` passed. @return the last hits. */
static uint64_t query_until(int k, uint32_t salt, uint64_t first, int count, double deadline_ms) {
  uint64_t t0 = oi__now_ns(), hits = 0;
  while ((hits = query_once(k, salt, first, count, WAIT_MS, NULL)) < (uint64_t)count &&
         ms_since(t0) < deadline_ms)
    sleep_ms(100);
  return hits;
}

/* The holder named by the directory entry of (salt, logical): "node-K"
 * (empty when there is none). */
static void entry_holder(uint32_t salt, uint64_t logical, char *out, size_t cap) {
  out[0] = 0;
  oi_block_hash h = tl_hash(salt, logical);
  char hex[33];
  for (int i = 0; i < 16; i++)
    snprintf(hex + 2 * i, 3, "%02x", h.bytes[i]);
  if (!g_rc && !(g_rc = redis_connect())) return;
  redisReply *r = redisCommand(g_rc, "KEYS oi:b:*:%s:*", hex);
  if (r && r->type == REDIS_REPLY_ARRAY && r->elements == 1) {
    redisReply *v = redisCommand(g_rc, "GET %s", r->element[0]->str);
    if (v && v->type == REDIS_REPLY_STRING)
      snprintf(out, cap, "%.*s", (int)strcspn(v->str, " "), v->str);
    if (v) freeReplyObject(v);
  }
  if (!r) { /* the connection is gone: a new one next time */
    redisFree(g_rc);
    g_rc = NULL;
  }
  if (r) freeReplyObject(r);
}

/* Waits until node k's entries for (salt, first..first+count) are in Redis. */
static bool wait_published(int k, uint32_t salt, uint64_t first, int count) {
  char holder[80];
  for (int i = 0; i < 500; i++) { /* 5 s */
    int found = 0;
    for (int b = 0; b < count; b++) {
      entry_holder(salt, first + (uint64_t)b, holder, sizeof holder);
      found += !strcmp(holder, g_nodes[k].id);
    }
    if (found == count) return true;
    sleep_ms(10);
  }
  return false;
}

/* ---- the tests ----------------------------------------------------------------------------- */

static void test_a_fetch_across_nodes(void) {
  save(1, 1, 0, N);
  double ms;
  uint64_t t0 = oi__now_ns();
  /* Without a wait: the fetch starts, and the sidecar client sees the
   * blocks pending (OI_QUERY_LOADING) through the wire. */
  CHECK(wait_published(1, 1, 0, N));
  oi_block_hash hs[N];
  for (int b = 0; b < N; b++)
    hs[b] = tl_hash(1, (uint64_t)b);
  oi_query_result q = {.struct_size = sizeof q};
  CHECK_OK(oi_engine_query(g_nodes[2].e, NULL, hs, N, 0, &q));
  CHECK(q.hit_blocks == 0 && q.pending_blocks == N && q.state == OI_QUERY_LOADING);
  fprintf(stderr, "  node 2 without a wait: %llu hits, %llu pending, state %u\n",
          (unsigned long long)q.hit_blocks, (unsigned long long)q.pending_blocks, q.state);
  if (q.hit_blocks) CHECK_OK(oi_engine_release(g_nodes[2].e, q.lease));
  CHECK(query_until(2, 1, 0, N, 10000) == N);
  fprintf(stderr, "  node 2: %d blocks from node 1 in %.1f ms after the save\n", N, ms_since(t0));
  /* node 2 holds them itself now */
  CHECK(query_once(2, 1, 0, N, 0, &ms) == N);
}

/* GET /metrics from node k's endpoint (127.0.0.1 in its namespace) into
 * out (NUL-terminated). @return false when it could not be had. */
static bool scrape(int k, char *out, size_t cap) {
  const char *at = NULL;
  FILE *f = fopen(g_nodes[k].ts.log, "r");
  char line[512];
  unsigned port = 0;
  while (f && fgets(line, sizeof line, f))
    if ((at = strstr(line, "metrics on http://127.0.0.1:"))) port = (unsigned)atoi(at + 28);
  if (f) fclose(f);
  if (!port) return false;
  int p[2];
  REQUIRE(pipe(p) == 0);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    close(p[0]);
    enter_netns(node_ns(k));
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) _exit(1);
    const char *req = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (write(fd, req, strlen(req)) != (ssize_t)strlen(req)) _exit(1);
    char buf[4096];
    ssize_t n;
    while ((n = read(fd, buf, sizeof buf)) > 0)
      if (write(p[1], buf, (size_t)n) != n) _exit(1);
    _exit(0);
  }
  close(p[1]);
  size_t len = 0;
  ssize_t n;
  while (len + 1 < cap && (n = read(p[0], out + len, cap - 1 - len)) > 0)
    len += (size_t)n;
  out[len] = 0;
  close(p[0]);
  int status;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 && len > 0;
}

/* The value of metric `name` (a line "name value") in a scrape, or -1. */
static double metric_value(const char *text, const char *name) {
  size_t len = strlen(name);
  for (const char *l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
    if (!strncmp(l, name, len) && l[len] == ' ') return atof(l + len + 1);
  return -1;
}

/* Node 2 fetched N blocks from node 1 in (a): its figures say so, through
 * the sidecar protocol (oi_server_fetch_cluster_stats, `openinfer stats`
 * and its --json) and /metrics; its saves are not counted up by them. */
static void test_a2_stats_of_a_fetch(void) {
  oi_host_cluster_stats c = {.struct_size = sizeof c};
  CHECK_OK(oi_server_fetch_cluster_stats(g_nodes[2].ts.socket, 10000, &c));
  CHECK(c.remote_blocks == N && c.fetches >= 1 && c.bytes_fetched > 0 && c.bytes_fetched % N == 0 &&
        c.fetch_ns > 0);
  CHECK(c.directory_connected == 1 && c.holders_up >= 1 && c.holders_down == 0 && c.lookups >= 1);
  oi_host_cluster_stats c1 = {.struct_size = sizeof c1};
  CHECK_OK(oi_server_fetch_cluster_stats(g_nodes[1].ts.socket, 10000, &c1));
  CHECK(c1.served_blocks >= N && c1.bytes_served >= c.bytes_fetched && c1.published >= N);
  fprintf(stderr,
          "  node 2: %llu blocks, %llu bytes in %llu fetches (%.2f GB/s); node 1 served %llu\n",
          (unsigned long long)c.remote_blocks, (unsigned long long)c.bytes_fetched,
          (unsigned long long)c.fetches, (double)c.bytes_fetched / (double)c.fetch_ns,
          (unsigned long long)c1.served_blocks);
  oi_server_stats ss = {.struct_size = sizeof ss};
  oi_host_stats hs = {.struct_size = sizeof hs};
  CHECK_OK(oi_server_fetch_stats(g_nodes[2].ts.socket, 10000, &ss, &hs, NULL, 0));
  CHECK(hs.saves_submitted == 0 && hs.saves_completed == 0 && hs.bytes_saved == 0);
  CHECK(hs.blocks_sealed >= N);
  /* `openinfer stats`, both forms. */
  char cmd[512], out[16384];
  for (int json = 0; json < 2; json++) {
    snprintf(cmd, sizeof cmd, "%s stats --socket %s%s", g_exe, g_nodes[2].ts.socket,
             json ? " --json" : "");
    FILE *p = popen(cmd, "r");
    REQUIRE(p);
    size_t len = fread(out, 1, sizeof out - 1, p);
    out[len] = 0;
    CHECK(pclose(p) == 0);
    char want[64];
    if (json)
      snprintf(want, sizeof want, "\"fetched_blocks\": %d,", N);
    else
      snprintf(want, sizeof want, "%-14s %d blocks", "  fetched:", N);
    CHECK(strstr(out, want) != NULL);
    CHECK(strstr(out, json ? "\"saves_submitted\": 0," : "saves:         0 blocks submitted"));
    if (!strstr(out, want)) fprintf(stderr, "%s", out);
  }
  static char text[1 << 17];
  CHECK(scrape(2, text, sizeof text));
  CHECK(metric_value(text, "openinfer_cluster_fetched_blocks_total") == N);
  CHECK(metric_value(text, "openinfer_cluster_fetched_bytes_total") == (double)c.bytes_fetched);
  CHECK(metric_value(text, "openinfer_cluster_fetches_total") >= 1);
  CHECK(metric_value(text, "openinfer_cluster_fetch_seconds_total") > 0);
  CHECK(strstr(text, "openinfer_cluster_holders{state=\"down\"} 0") != NULL);
  CHECK(metric_value(text, "openinfer_save_blocks_submitted_total") == 0);
}

static void test_b_third_node(void) {
  uint64_t t0 = oi__now_ns();
  CHECK(query_until(3, 1, 0, N, 10000) == N);
  char holder[80];
  entry_holder(1, 0, holder, sizeof holder);
  fprintf(stderr, "  node 3: %d blocks in %.1f ms (the entry now names %s)\n", N, ms_since(t0),
          holder[0] ? holder : "nobody");
}

static void test_f_wrong_secret(void) {
  REQUIRE(node_start(4, g_other_secret));
  engine_open(4);
  save(1, 2, 0, N);
  CHECK(wait_published(1, 2, 0, N));
  double ms;
  /* node 4 does not believe the entries (their MACs are under the
   * cluster's secret): a miss at once, without dialing anyone */
  CHECK(query_once(4, 2, 0, N, WAIT_MS, &ms) == 0);
  CHECK(ms < WAIT_MS + 1500);
  fprintf(stderr, "  node 4 (another secret): a miss in %.1f ms\n", ms);
  CHECK(query_once(4, 1, 0, N, WAIT_MS, NULL) == 0); /* nor from node 2 or 3 */
  CHECK(query_until(2, 2, 0, N, 10000) == N);        /* node 1 keeps serving */
  CHECK(query_until(3, 2, 0, N, 10000) == N);
  CHECK(ts_log_contains(&g_nodes[4].ts, "not believed"));
  engine_close(4);
  CHECK(ts_stop(&g_nodes[4].ts));
}

/* Node 2 holds blocks nobody else has; its link goes down (netns), or it is
 * stopped (loopback). */
static void test_e_link_down(void) {
  save(2, 3, 0, N);
  CHECK(wait_published(2, 3, 0, N));
  if (g_netns)
    REQUIRE(ip("-n %s link set v2 down", g_ns[2]));
  else
    kill(g_nodes[2].ts.pid, SIGSTOP);
  double ms;
  uint64_t hits = query_once(3, 3, 0, N, WAIT_MS, &ms);
  CHECK(hits == 0);
  CHECK(ms < FETCH_TIMEOUT_MS + 1500); /* the fetch timed out, before WAIT_MS */
  fprintf(stderr, "  node 3 with node 2 %s: %llu hits in %.1f ms\n",
          g_netns ? "cut off (link down)" : "stopped", (unsigned long long)hits, ms);
  /* what node 3 holds, it serves meanwhile */
  CHECK(query_once(3, 1, 0, N, 0, NULL) == N);
  uint64_t t0 = oi__now_ns();
  if (g_netns)
    REQUIRE(ip("-n %s link set v2 up", g_ns[2]));
  else
    kill(g_nodes[2].ts.pid, SIGCONT);
  CHECK(query_until(3, 3, 0, N, 15000) == N);
  fprintf(stderr, "  node 3: node 2's blocks again %.1f ms after %s\n", ms_since(t0),
          g_netns ? "link up" : "SIGCONT");
}

static void test_c_holder_killed(void) {
  save(1, 4, 0, N);
  CHECK(wait_published(1, 4, 0, N));
  engine_close(1); /* its arena is the server's memory */
  ts_kill(&g_nodes[1].ts);
  double ms;
  uint64_t hits = query_once(3, 4, 0, N, WAIT_MS, &ms);
  CHECK(hits == 0);
  CHECK(ms < WAIT_MS + 1500);
  fprintf(stderr, "  node 3, node 1 killed: %llu hits in %.1f ms\n", (unsigned long long)hits, ms);
  CHECK(query_once(2, 4, 0, N, WAIT_MS, &ms) == 0);
  CHECK(ms < WAIT_MS + 1500);
  /* the others keep serving: what they hold, and across nodes */
  CHECK(query_once(2, 1, 0, N, 0, NULL) == N);
  CHECK(query_once(3, 2, 0, N, 0, NULL) == N);
  save(2, 5, 0, N);
  CHECK(query_until(3, 5, 0, N, 10000) == N);
  /* node 1 again (a new epoch): its old entries are stale, a miss */
  REQUIRE(node_start(1, g_secret));
  engine_open(1);
  CHECK(query_once(3, 4, 0, N, WAIT_MS, &ms) == 0);
  CHECK(query_until(1, 5, 0, N, 10000) == N);
}

static void test_d_redis_down_and_back(void) {
  save(2, 7, 0, N); /* published before Redis goes */
  CHECK(wait_published(2, 7, 0, N));
  redis_down();
  save(2, 6, 0, N); /* queued while Redis is down */
  double ms;
  uint64_t hits = query_once(3, 6, 0, N, WAIT_MS, &ms);
  CHECK(hits == 0);
  CHECK(ms < 1500);
  fprintf(stderr, "  Redis down: node 3 misses in %.1f ms\n", ms);
  hits = query_once(3, 7, 0, N, WAIT_MS, &ms);
  CHECK(hits == 0);
  CHECK(ms < 1500);
  CHECK(query_once(3, 1, 0, N, 0, NULL) == N); /* local blocks still hit */
  uint64_t t0 = oi__now_ns();
  redis_up();
  CHECK(query_until(3, 6, 0, N, 15000) == N);
  CHECK(query_until(3, 7, 0, N, 15000) == N);
  fprintf(stderr, "  Redis back: node 2's blocks fetched again %.1f ms after the restart\n",
          ms_since(t0));
}

/* Random saves and queries on random nodes against a model: which blocks
 * were saved anywhere, and which each node holds for sure (saved there, or
 * hit there before; the pools are far larger than what is saved, so nothing
 * is evicted). A query hits at least the leading run the node holds, at most
 * the leading run saved anywhere; every hit is checked byte-exact in
 * query_once. At the end every saved block hits on every node. */
static void test_random_ops(void) {
#define RN 256
  uint64_t rng = 0x2545F4914F6CDD1Dull ^ (uint64_t)getpid();
  static bool saved[RN], held[4][RN];
  uint64_t hits = 0, queries = 0, saves = 0, ops = 0;
  uint64_t t0 = oi__now_ns();
  for (; ops < 10000 && ms_since(t0) < 15000; ops++) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    int k = 1 + (int)(rng % 3);
    uint64_t first = (rng >> 8) % RN;
    int count = 1 + (int)((rng >> 20) % 4);
    if (first + (uint64_t)count > RN) count = (int)(RN - first);
    if ((rng >> 32) % 8 == 0) {
      save(k, 8, first, count);
      for (int b = 0; b < count; b++)
        saved[first + (uint64_t)b] = held[k][first + (uint64_t)b] = true;
      saves++;
    } else {
      uint64_t lo = 0, hi = 0;
      while (lo < (uint64_t)count && held[k][first + lo])
        lo++;
      while (hi < (uint64_t)count && saved[first + hi])
        hi++;
      uint64_t h = query_once(k, 8, first, count, (rng >> 40) % 2 ? 200 : 0, NULL);
      CHECK(h >= lo && h <= hi);
      for (uint64_t b = 0; b < h; b++)
        held[k][first + b] = true;
      hits += h;
      queries++;
    }
  }
  fprintf(stderr, "  %llu operations (%llu saves, %llu queries, %llu blocks hit) in %.0f ms\n",
          (unsigned long long)ops, (unsigned long long)saves, (unsigned long long)queries,
          (unsigned long long)hits, ms_since(t0));
  int missing = 0;
  uint64_t t1 = oi__now_ns();
  for (uint64_t b = 0; b < RN; b++)
    if (saved[b])
      for (int k = 1; k <= 3; k++)
        if (query_until(k, 8, b, 1, OI_MAX(0.0, 10000 - ms_since(t1))) != 1) missing++;
  CHECK(missing == 0);
  fprintf(stderr, "  every saved block hits on every node: %.0f ms\n", ms_since(t1));
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s OPENINFER_EXE\n", argv[0]);
    return 2;
  }
  if (!on_path("redis-server")) TEST_SKIP("redis-server is not on PATH");
  g_exe = argv[1];
  g_main_pid = getpid();
  signal(SIGPIPE, SIG_IGN);
  oi_set_fatal_handler(fatal_is_a_failure, NULL);
  atexit(cleanup);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_fatal_signal;
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGHUP, &sa, NULL);
  snprintf(g_dir, sizeof g_dir, "/tmp/oi-netns-XXXXXX");
  REQUIRE(mkdtemp(g_dir));
  snprintf(g_secret, sizeof g_secret, "%s/secret", g_dir);
  snprintf(g_other_secret, sizeof g_other_secret, "%s/other-secret", g_dir);
  static const char *texts[2] = {"a-cluster-secret-of-32-bytes-000\n",
                                 "another-secret-nobody-else-has-0"};
  const char *paths[2] = {g_secret, g_other_secret};
  for (int i = 0; i < 2; i++) {
    int fd = open(paths[i], O_WRONLY | O_CREAT | O_TRUNC, 0600);
    REQUIRE(fd >= 0 && write(fd, texts[i], strlen(texts[i])) == (ssize_t)strlen(texts[i]));
    close(fd);
  }
  uint64_t t0 = oi__now_ns();
  if (netns_setup())
    fprintf(stderr, "network namespaces %s..%s and %s, nodes at 10.%d.%d.1-3\n", g_ns[1], g_ns[3],
            g_ns[0], g_subnet[0], g_subnet[1]);
  else
    fprintf(stderr, "NOTE: no network namespaces here (needs CAP_NET_ADMIN and `ip`): every node "
                    "runs on 127.0.0.1, and a stopped server stands in for a link down\n");
  g_redis_port = g_netns ? 6379 : free_port();
  g_redis_plain_port = g_netns ? 6380 : free_port();
  snprintf(g_auth_file, sizeof g_auth_file, "%s/redis-auth", g_dir);
  int afd = open(g_auth_file, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  REQUIRE(afd >= 0 && write(afd, "password=" REDIS_PASSWORD "\n", 30) == 30);
  close(afd);
  g_tls = on_path("openssl") && redis_has_tls() && tls_make_certs(g_dir, redis_addr());
  fprintf(stderr, "  the nodes reach Redis %s, with AUTH\n",
          g_tls ? "over TLS (rediss://, client certificates)"
                : "over plain TCP (no openssl command or no TLS in this redis-server)");
  redis_up();
  for (int k = 1; k <= 3; k++) {
    REQUIRE(node_start(k, g_secret));
    engine_open(k);
  }
  fprintf(stderr, "  set up in %.0f ms\n", ms_since(t0));
  RUN_TEST(test_a_fetch_across_nodes);
  RUN_TEST(test_a2_stats_of_a_fetch);
  RUN_TEST(test_b_third_node);
  if (getenv("OI_NETNS_QUICK")) goto done; /* by hand: (a) and (b) only */
  RUN_TEST(test_f_wrong_secret);
  RUN_TEST(test_e_link_down);
  RUN_TEST(test_c_holder_killed);
  RUN_TEST(test_d_redis_down_and_back);
  RUN_TEST(test_random_ops);
done:
  for (int k = 1; k <= 3; k++)
    engine_close(k);
  for (int k = 1; k <= 3; k++)
    CHECK(ts_stop(&g_nodes[k].ts)); /* a clean stop */
  if (oi_test_failures)
    for (int k = 1; k <= NODES; k++)
      if (g_nodes[k].ts.log[0]) ts_dump_log(&g_nodes[k].ts);
  redis_down();
  cleanup();
  if (oi_test_failures) {
    fprintf(stderr, "server logs kept in %s\n", g_dir);
    TEST_EXIT();
  }
  tu_remove_dir(g_dir);
  fprintf(stderr, "total %.1f s\n", ms_since(t0) / 1000);
  TEST_EXIT();
}
