/* The block directory against a scripted fake Redis (a RESP server in a
 * thread of this test, on loopback TCP or a unix socket): what a real
 * redis-server rarely says. It keeps keys like Redis (SET, GET, MGET, the
 * compare-and-delete script, a one-master CLUSTER SLOTS) and answers a
 * command the test names with the reply the test gives: SELECT refused,
 * SCRIPT LOAD refused or odd, error and unexpected replies to SET, the
 * compare-and-delete, MGET, GET and PING, a single instance that answers
 * like a cluster (MOVED), a "cluster" that is not one, CLUSTER SLOTS that
 * do not parse or serve nothing, TRYAGAIN, CLUSTERDOWN and redirections
 * that do not parse. Each case checks the status, the stats and the
 * directory's last error. */
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "cluster/directory.h"
#include "testutil.h"

#define TEST_SECRET "the test cluster's secret"

/* ---- the fake -------------------------------------------------------------- */

#define FK_CONNS 64
#define FK_KEYS 256

typedef struct override {
  char cmd[32];   /* "SET", "CLUSTER SLOTS", ... */
  char match[32]; /* a prefix of the first argument after the command; "" any */
  char reply[512];
  int times; /* replies left; -1 always */
} override;

static struct fake {
  int lfd, port;
  char path[108]; /* unix socket, or "" */
  pthread_t acceptor;
  atomic_bool stop;
  pthread_mutex_t lock;
  int conns[FK_CONNS];
  pthread_t threads[FK_CONNS];
  atomic_bool ended[FK_CONNS]; /* its thread returned: the slot is reused */
  int n_conns;
  char keys[FK_KEYS][96], vals[FK_KEYS][256];
  int n_keys;
  override ov[32];
  int n_ov;
  char seen[4096]; /* the commands seen, "CMD ARG1\n" each */
} fk;

static void fk_override(const char *cmd, const char *match, const char *reply, int times) {
  pthread_mutex_lock(&fk.lock);
  REQUIRE(fk.n_ov < (int)OI_ARRAY_LEN(fk.ov));
  override *o = &fk.ov[fk.n_ov++];
  snprintf(o->cmd, sizeof o->cmd, "%s", cmd);
  snprintf(o->match, sizeof o->match, "%s", match);
  snprintf(o->reply, sizeof o->reply, "%s", reply);
  o->times = times;
  pthread_mutex_unlock(&fk.lock);
}

static void fk_clear(void) {
  pthread_mutex_lock(&fk.lock);
  fk.n_ov = 0;
  fk.n_keys = 0;
  fk.seen[0] = '\0';
  pthread_mutex_unlock(&fk.lock);
}

static bool fk_saw(const char *line) {
  pthread_mutex_lock(&fk.lock);
  bool yes = strstr(fk.seen, line) != NULL;
  pthread_mutex_unlock(&fk.lock);
  return yes;
}

static bool read_line(int fd, char *buf, size_t cap) {
  size_t n = 0;
  for (;;) {
    char c;
    if (read(fd, &c, 1) != 1) return false;
    if (c == '\n') break;
    if (n + 1 < cap) buf[n++] = c;
  }
  if (n && buf[n - 1] == '\r') n--;
  buf[n] = '\0';
  return true;
}

static bool write_all(int fd, const char *s, size_t n) {
  while (n) {
    ssize_t w = write(fd, s, n);
    if (w <= 0) return false;
    s += w;
    n -= (size_t)w;
  }
  return true;
}

static int key_index(const char *k) {
  for (int i = 0; i < fk.n_keys; i++)
    if (strcmp(fk.keys[i], k) == 0) return i;
  return -1;
}

static void bulk(char *out, size_t cap, const char *v) {
  size_t len = strlen(out);
  if (v)
    snprintf(out + len, cap - len, "$%zu\r\n%s\r\n", strlen(v), v);
  else
    snprintf(out + len, cap - len, "$-1\r\n");
}

/* The reply to argv[0..argc) under fk.lock, as Redis would give it. */
static void fk_answer(int argc, char argv[][300], char *out, size_t cap) {
  char cmd[64];
  snprintf(cmd, sizeof cmd, "%.30s", argv[0]);
  for (char *p = cmd; *p; p++)
    if (*p >= 'a' && *p <= 'z') *p = (char)(*p - 'a' + 'A');
  if ((!strcmp(cmd, "CLUSTER") || !strcmp(cmd, "SCRIPT")) && argc > 1) {
    size_t l = strlen(cmd);
    snprintf(cmd + l, sizeof cmd - l, " %.20s", argv[1]);
    for (char *p = cmd + l; *p; p++)
      if (*p >= 'a' && *p <= 'z') *p = (char)(*p - 'a' + 'A');
  }
  size_t sl = strlen(fk.seen);
  snprintf(fk.seen + sl, sizeof fk.seen - sl, "%s %.80s\n", cmd, argc > 1 ? argv[1] : "");
  if (strlen(fk.seen) > sizeof fk.seen / 2) fk.seen[0] = '\0';
  for (int i = 0; i < fk.n_ov; i++) {
    override *o = &fk.ov[i];
    if (o->times == 0 || strcmp(o->cmd, cmd) != 0) continue;
    if (o->match[0] && (argc < 2 || strncmp(argv[1], o->match, strlen(o->match)) != 0)) continue;
    if (o->times > 0) o->times--;
    snprintf(out, cap, "%s", o->reply);
    return;
  }
  out[0] = '\0';
  if (!strcmp(cmd, "PING")) {
    snprintf(out, cap, "+PONG\r\n");
  } else if (!strcmp(cmd, "SELECT") || !strcmp(cmd, "ASKING")) {
    snprintf(out, cap, "+OK\r\n");
  } else if (!strcmp(cmd, "SCRIPT LOAD")) {
    bulk(out, cap, "0123456789abcdef0123456789abcdef01234567");
  } else if (!strcmp(cmd, "SET") && argc >= 3) {
    int i = key_index(argv[1]);
    if (i < 0 && fk.n_keys < FK_KEYS) i = fk.n_keys++;
    if (i >= 0) {
      snprintf(fk.keys[i], sizeof fk.keys[i], "%s", argv[1]);
      snprintf(fk.vals[i], sizeof fk.vals[i], "%s", argv[2]);
    }
    snprintf(out, cap, "+OK\r\n");
  } else if (!strcmp(cmd, "GET") && argc == 2) {
    int i = key_index(argv[1]);
    bulk(out, cap, i < 0 ? NULL : fk.vals[i]);
  } else if (!strcmp(cmd, "MGET")) {
    snprintf(out, cap, "*%d\r\n", argc - 1);
    for (int a = 1; a < argc; a++) {
      int i = key_index(argv[a]);
      bulk(out, cap, i < 0 ? NULL : fk.vals[i]);
    }
  } else if ((!strcmp(cmd, "EVALSHA") || !strcmp(cmd, "EVAL")) && argc == 5) {
    int i = key_index(argv[3]);
    bool del = i >= 0 && strncmp(fk.vals[i], argv[4], strlen(argv[4])) == 0;
    if (del) {
      fk.n_keys--;
      memcpy(fk.keys[i], fk.keys[fk.n_keys], sizeof fk.keys[i]);
      memcpy(fk.vals[i], fk.vals[fk.n_keys], sizeof fk.vals[i]);
    }
    snprintf(out, cap, ":%d\r\n", del ? 1 : 0);
  } else if (!strcmp(cmd, "CLUSTER INFO")) {
    bulk(out, cap, "cluster_state:ok\r\ncluster_slots_assigned:16384");
  } else if (!strcmp(cmd, "CLUSTER SLOTS")) {
    snprintf(out, cap, "*1\r\n*3\r\n:0\r\n:16383\r\n*3\r\n$9\r\n127.0.0.1\r\n:%d\r\n$2\r\nid\r\n",
             fk.port);
  } else {
    snprintf(out, cap, "-ERR unknown command '%s'\r\n", cmd);
  }
}

/* One connection (slot k): RESP arrays of bulk strings in, replies out.
 * "CLOSE" as a reply closes the connection. */
static void *fk_conn(void *arg) {
  int k = (int)(intptr_t)arg;
  int fd = fk.conns[k];
  static __thread char argv[40][300];
  char line[512], out[8192];
  while (!atomic_load(&fk.stop)) {
    if (!read_line(fd, line, sizeof line) || line[0] != '*') break;
    int argc = atoi(line + 1), kept = 0;
    bool ok = true;
    for (int a = 0; a < argc && ok; a++) {
      ok = read_line(fd, line, sizeof line) && line[0] == '$';
      size_t len = ok ? (size_t)atol(line + 1) : 0;
      char buf[4096];
      size_t got = 0;
      while (ok && got < len + 2) {
        ssize_t r = read(fd, buf, OI_MIN(len + 2 - got, sizeof buf));
        if (r <= 0)
          ok = false;
        else {
          if (kept < 40 && got < sizeof argv[0] - 1)
            memcpy(argv[kept] + got, buf, OI_MIN((size_t)r, sizeof argv[0] - 1 - got));
          got += (size_t)r;
        }
      }
      if (ok && kept < 40) {
        argv[kept][OI_MIN(len, sizeof argv[0] - 1)] = '\0';
        kept++;
      }
    }
    if (!ok || kept == 0) break;
    pthread_mutex_lock(&fk.lock);
    fk_answer(kept, argv, out, sizeof out);
    pthread_mutex_unlock(&fk.lock);
    if (!strncmp(out, "DELAY ", 6)) { /* "DELAY <ms> <reply>": answered late */
      char *sp = strchr(out + 6, ' ');
      struct timespec ts = {0, atol(out + 6) * 1000000L};
      nanosleep(&ts, NULL);
      memmove(out, sp + 1, strlen(sp + 1) + 1);
    }
    if (!strcmp(out, "CLOSE") || !write_all(fd, out, strlen(out))) break;
  }
  shutdown(fd, SHUT_RDWR);
  atomic_store(&fk.ended[k], true);
  return NULL;
}

static void *fk_accept(void *arg) {
  (void)arg;
  while (!atomic_load(&fk.stop)) {
    int c = accept(fk.lfd, NULL, NULL);
    if (c < 0) continue;
    pthread_mutex_lock(&fk.lock);
    int k = -1;
    for (int i = 0; i < fk.n_conns && k < 0 && !atomic_load(&fk.stop); i++)
      if (atomic_load(&fk.ended[i])) { /* a connection that ended: its slot */
        pthread_join(fk.threads[i], NULL);
        close(fk.conns[i]);
        atomic_store(&fk.ended[i], false);
        k = i;
      }
    if (k < 0 && fk.n_conns < FK_CONNS && !atomic_load(&fk.stop)) k = fk.n_conns++;
    if (k < 0) {
      pthread_mutex_unlock(&fk.lock);
      close(c);
      continue;
    }
    fk.conns[k] = c;
    pthread_create(&fk.threads[k], NULL, fk_conn, (void *)(intptr_t)k);
    pthread_mutex_unlock(&fk.lock);
  }
  return NULL;
}

static void fk_start(bool unix_socket) {
  memset(&fk, 0, sizeof fk);
  pthread_mutex_init(&fk.lock, NULL);
  if (unix_socket) {
    snprintf(fk.path, sizeof fk.path, "/tmp/oi-fake-redis-%d.sock", (int)getpid());
    unlink(fk.path);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", fk.path);
    fk.lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fk.lfd >= 0 && bind(fk.lfd, (struct sockaddr *)&a, sizeof a) == 0);
  } else {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    fk.lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(fk.lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    socklen_t len = sizeof a;
    REQUIRE(fk.lfd >= 0 && bind(fk.lfd, (struct sockaddr *)&a, sizeof a) == 0 &&
            getsockname(fk.lfd, (struct sockaddr *)&a, &len) == 0);
    fk.port = ntohs(a.sin_port);
  }
  REQUIRE(listen(fk.lfd, 64) == 0);
  REQUIRE(pthread_create(&fk.acceptor, NULL, fk_accept, NULL) == 0);
}

static void fk_stop(void) {
  atomic_store(&fk.stop, true);
  shutdown(fk.lfd, SHUT_RDWR);
  pthread_join(fk.acceptor, NULL);
  close(fk.lfd);
  pthread_mutex_lock(&fk.lock);
  for (int i = 0; i < fk.n_conns; i++)
    shutdown(fk.conns[i], SHUT_RDWR);
  pthread_mutex_unlock(&fk.lock);
  for (int i = 0; i < fk.n_conns; i++) {
    pthread_join(fk.threads[i], NULL);
    close(fk.conns[i]);
  }
  if (fk.path[0]) unlink(fk.path);
  pthread_mutex_destroy(&fk.lock);
}

/* ---- helpers ----------------------------------------------------------------- */

static oi_tier_key key_of(uint32_t i) {
  oi_tier_key k = {.ns_fp = 0x1122334455667788ull, .layout_fp = 0xabcdef0123456789ull};
  memcpy(k.hash, &i, sizeof i);
  return k;
}

static oi_dir *open_dir(const char *url, uint32_t node_ttl_ms) {
  oi_dir_options o;
  oi__dir_options_init(&o);
  o.secret = TEST_SECRET;
  o.secret_len = strlen(TEST_SECRET);
  o.url = url;
  o.node_id = "nodeA";
  o.epoch = 7;
  o.timeout_ms = 300;
  o.node_ttl_ms = node_ttl_ms;
  oi_dir *d = NULL;
  REQUIRE(oi__dir_open(&o, &d) == OI_OK && d);
  return d;
}

static oi_dir_stats stats_of(oi_dir *d) {
  oi_dir_stats s;
  oi__dir_stats(d, &s);
  return s;
}

static void sleep_ms(unsigned ms) {
  struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

/* Waits up to 3 s for the last error to contain `what`. */
static bool error_soon(oi_dir *d, const char *what) {
  for (int i = 0; i < 300; i++) {
    if (strstr(stats_of(d).last_error, what)) return true;
    sleep_ms(10);
  }
  fprintf(stderr, "last error '%s', expected '%s'\n", stats_of(d).last_error, what);
  return false;
}

static char url[160];

/* ---- single instance ----------------------------------------------------------- */

static void test_select(void) {
  /* A database Redis refuses: degraded at open, with SELECT's reason. */
  fk_clear();
  fk_override("SELECT", "", "-ERR DB index is out of range\r\n", -1);
  snprintf(url, sizeof url, "redis://127.0.0.1:%d/7", fk.port);
  oi_dir *d = open_dir(url, 0);
  oi_dir_stats s = stats_of(d);
  CHECK(!s.connected);
  CHECK(strstr(s.last_error, "SELECT 7") && strstr(s.last_error, "out of range"));
  size_t n = 9;
  oi_dir_holder h[1];
  oi_tier_key k = key_of(1);
  CHECK_ST(oi__dir_lookup(d, &k, 1, h, &n), OI_ERR_CLOSED);
  CHECK(n == 0);
  oi__dir_close(d);
}

static void test_unix_socket_with_db(void) {
  /* unix:/PATH?db=N: connected on the socket, database N selected, a
   * publish found by a lookup. */
  fk_clear();
  snprintf(url, sizeof url, "unix:%s?db=3", fk.path);
  oi_dir *d = open_dir(url, 0);
  CHECK(stats_of(d).connected);
  CHECK(fk_saw("SELECT 3\n"));
  oi_tier_key k[2] = {key_of(1), key_of(2)};
  CHECK_OK(oi__dir_publish(d, k, 1));
  CHECK_OK(oi__dir_flush(d, 3000));
  oi_dir_holder h[2];
  size_t n = 0;
  CHECK_OK(oi__dir_lookup(d, k, 2, h, &n));
  CHECK(n == 1 && strcmp(h[0].node_id, "nodeA") == 0 && h[0].epoch == 7);
  oi__dir_close(d);
}

static void test_script_load(void) {
  /* SCRIPT LOAD refused: connected all the same, the compare-and-delete
   * sent whole (EVAL) instead of by digest. */
  fk_clear();
  snprintf(url, sizeof url, "redis://127.0.0.1:%d", fk.port);
  fk_override("SCRIPT LOAD", "", "-NOPERM scripts are not allowed\r\n", -1);
  oi_dir *d = open_dir(url, 0);
  CHECK(stats_of(d).connected);
  oi_tier_key k = key_of(1);
  CHECK_OK(oi__dir_publish(d, &k, 1));
  CHECK_OK(oi__dir_unpublish(d, &k, 1));
  CHECK_OK(oi__dir_flush(d, 3000));
  CHECK(fk_saw("EVAL ") && !fk_saw("EVALSHA"));
  CHECK(stats_of(d).unpublished == 1);
  oi__dir_close(d);
  /* The connection closed instead of a reply: degraded at open. */
  fk_clear();
  fk_override("SCRIPT LOAD", "", "CLOSE", -1);
  d = open_dir(url, 0);
  CHECK(!stats_of(d).connected);
  CHECK(strstr(stats_of(d).last_error, "SCRIPT LOAD"));
  oi__dir_close(d);
}

static void test_error_replies(void) {
  fk_clear();
  snprintf(url, sizeof url, "redis://127.0.0.1:%d", fk.port);
  oi_dir *d = open_dir(url, 300);
  REQUIRE(stats_of(d).connected);
  oi_tier_key k[3] = {key_of(1), key_of(2), key_of(3)};
  oi_dir_holder h[3];
  size_t n = 9;

  /* A single instance that answers like a cluster node: the error and a
   * hint to use redis+cluster://. */
  fk_override("SET", "oi:b:", "-MOVED 3999 127.0.0.1:1\r\n", 1);
  CHECK_OK(oi__dir_publish(d, k, 1));
  CHECK_OK(oi__dir_flush(d, 3000));
  oi_dir_stats s = stats_of(d);
  CHECK(s.published == 0 && s.errors >= 1);
  CHECK(strstr(s.last_error, "publish: MOVED") && strstr(s.last_error, "redis+cluster://"));
  CHECK(s.connected); /* an error reply is Redis answering */

  /* The compare-and-delete answers neither 1 nor 0. */
  fk_override("EVALSHA", "", "+what\r\n", 1);
  CHECK_OK(oi__dir_unpublish(d, k, 1));
  CHECK_OK(oi__dir_flush(d, 3000));
  s = stats_of(d);
  CHECK(s.unpublished == 0 && s.unpublish_missed == 0);
  CHECK(strstr(s.last_error, "unpublish: unexpected reply"));
  /* ... and an error reply (CROSSSLOT earns the hint too). */
  fk_override("EVALSHA", "", "-CROSSSLOT Keys in request don't hash to the same slot\r\n", 1);
  CHECK_OK(oi__dir_unpublish(d, k, 1));
  CHECK_OK(oi__dir_flush(d, 3000));
  CHECK(strstr(stats_of(d).last_error, "unpublish: CROSSSLOT") &&
        strstr(stats_of(d).last_error, "redis+cluster://"));

  /* MGET: an error, then an array of the wrong length. */
  CHECK_OK(oi__dir_publish(d, k, 3));
  CHECK_OK(oi__dir_flush(d, 3000));
  fk_override("MGET", "", "-ERR boom\r\n", 1);
  CHECK_ST(oi__dir_lookup(d, k, 3, h, &n), OI_ERR_PROTOCOL);
  CHECK(n == 0 && strstr(oi_last_error(), "boom"));
  fk_override("MGET", "", "*1\r\n$-1\r\n", 1);
  CHECK_ST(oi__dir_lookup(d, k, 3, h, &n), OI_ERR_PROTOCOL);
  CHECK(n == 0 && strstr(stats_of(d).last_error, "MGET: unexpected reply"));
  CHECK_OK(oi__dir_lookup(d, k, 3, h, &n)); /* the next one answers */
  CHECK(n == 3);

  /* A node's liveness key of the wrong type. */
  char addr[64];
  uint64_t epoch = 0;
  fk_override("GET", "oi:node:", ":12\r\n", 1);
  CHECK_ST(oi__dir_node_lookup(d, "nodeB", addr, sizeof addr, &epoch), OI_ERR_PROTOCOL);

  /* Removing a stale entry: an error reply. */
  oi_dir_holder me = h[0]; /* the record a lookup read */
  CHECK(strcmp(me.node_id, "nodeA") == 0 && me.epoch == 7);
  fk_override("EVAL", "", "-ERR script killed\r\n", 1);
  CHECK_ST(oi__dir_remove_stale(d, &k[0], &me), OI_ERR_PROTOCOL);
  CHECK(strstr(stats_of(d).last_error, "remove stale: ERR script killed"));
  CHECK_OK(oi__dir_remove_stale(d, &k[0], &me)); /* answered now: removed */

  /* The beat (every 100 ms with node_ttl_ms 300): PING answered with an
   * error; with an address advertised, the node key's SET refused. */
  fk_override("PING", "", "-LOADING Redis is loading the dataset in memory\r\n", -1);
  CHECK(error_soon(d, "PING: LOADING"));
  CHECK_OK(oi__dir_set_advertise(d, "tcp://127.0.0.1:9"));
  fk_override("SET", "oi:node:", "-OOM command not allowed\r\n", -1);
  CHECK(error_soon(d, "refreshing the node key: OOM"));
  CHECK(stats_of(d).connected);
  oi__dir_close(d);
}

/* ---- a Redis Cluster of one fake master --------------------------------------- */

/* The fake answers `cmd` with `reply` (the rest as a cluster of one): the
 * directory at `url` must not connect, and its last error must say `why`. */
typedef struct refusal {
  const char *cmd, *reply, *why;
} refusal;

static void expect_refusals(const refusal *cases, size_t n) {
  for (size_t i = 0; i < n; i++) {
    fk_clear();
    fk_override(cases[i].cmd, "", cases[i].reply, -1);
    oi_dir *d = open_dir(url, 0);
    oi_dir_stats s = stats_of(d);
    if (s.connected || !strstr(s.last_error, cases[i].why)) {
      fprintf(stderr, "case %zu: connected %d, last error '%s'\n", i, s.connected, s.last_error);
      CHECK(false);
    }
    oi__dir_close(d);
  }
}

static void test_not_a_cluster(void) {
  snprintf(url, sizeof url, "redis+cluster://127.0.0.1:%d", fk.port);
  const refusal cases[] = {
      {"CLUSTER INFO", "-ERR This instance has cluster support disabled\r\n",
       "not a Redis Cluster?"},
      {"CLUSTER INFO", "$20\r\ncluster_state:fail\r\n\r\n", "the cluster is not ok"},
      {"CLUSTER SLOTS", "-ERR nope\r\n", "CLUSTER SLOTS: ERR nope"},
      {"CLUSTER SLOTS", "*1\r\n:5\r\n", "not [start, end, [host, port, ...]]"},
      {"CLUSTER SLOTS", "*1\r\n*3\r\n:0\r\n:20000\r\n*2\r\n$9\r\n127.0.0.1\r\n:7000\r\n",
       "out of bounds"},
      {"CLUSTER SLOTS", "*0\r\n", "no slot is served"},
  };
  expect_refusals(cases, OI_ARRAY_LEN(cases));
}

static void test_cluster_replies(void) {
  fk_clear();
  snprintf(url, sizeof url, "redis+cluster://127.0.0.1:%d", fk.port);
  oi_dir *d = open_dir(url, 0);
  REQUIRE(stats_of(d).connected);
  oi_tier_key k[3] = {key_of(1), key_of(2), key_of(3)};
  oi_dir_holder h[3];
  size_t n = 0;
  CHECK_OK(oi__dir_publish(d, k, 3));
  CHECK_OK(oi__dir_flush(d, 3000));
  CHECK(stats_of(d).published == 3);
  CHECK_OK(oi__dir_lookup(d, k, 3, h, &n));
  CHECK(n == 3);
  /* TRYAGAIN (a slot being migrated): retried, then answered. */
  fk_override("GET", "oi:b:", "-TRYAGAIN Multiple keys request during rehashing of slot\r\n", 2);
  n = 0;
  CHECK_OK(oi__dir_lookup(d, k, 3, h, &n));
  CHECK(n == 3);
  /* A key of another type: absent, as MGET answers (the prefix ends). */
  fk_override("GET", "oi:b:", "-WRONGTYPE Operation against a key holding the wrong kind\r\n", 1);
  CHECK_OK(oi__dir_lookup(d, k, 3, h, &n));
  CHECK(n == 0);
  /* An error reply to one GET: the lookup fails with it. */
  fk_override("GET", "oi:b:", "-ERR odd\r\n", 1);
  CHECK_ST(oi__dir_lookup(d, k, 3, h, &n), OI_ERR_PROTOCOL);
  CHECK(n == 0 && strstr(oi_last_error(), "ERR odd"));
  /* A redirection that does not parse: the lookup fails, no entries, and
   * the directory degrades. */
  fk_override("GET", "oi:b:", "-MOVED nonsense\r\n", 1);
  CHECK_ST(oi__dir_lookup(d, k, 3, h, &n), OI_ERR_CLOSED);
  CHECK(n == 0);
  CHECK(error_soon(d, "redirection that does not parse"));
  oi__dir_close(d);
  /* CLUSTERDOWN: the lookup fails and the directory degrades. */
  d = open_dir(url, 0);
  REQUIRE(stats_of(d).connected);
  fk_override("GET", "oi:b:", "-CLUSTERDOWN The cluster is down\r\n", -1);
  CHECK_ST(oi__dir_lookup(d, k, 3, h, &n), OI_ERR_CLOSED);
  CHECK(n == 0);
  CHECK(error_soon(d, "CLUSTERDOWN The cluster is down"));
  oi__dir_close(d);
}

/* The publish queue: a flush that outlasts its timeout, a flush while
 * degraded, and a queue past its limit (entries dropped and counted). */
static void test_queue_limits(void) {
  fk_clear();
  snprintf(url, sizeof url, "redis://127.0.0.1:%d", fk.port);
  oi_dir *d = open_dir(url, 0);
  REQUIRE(stats_of(d).connected);
  oi_tier_key k = key_of(1);
  fk_override("SET", "oi:b:", "DELAY 150 +OK\r\n", 1);
  CHECK_OK(oi__dir_publish(d, &k, 1));
  CHECK_ST(oi__dir_flush(d, 50), OI_ERR_TIMEOUT);
  CHECK(strstr(oi_last_error(), "not sent within 50 ms"));
  CHECK_OK(oi__dir_flush(d, 3000)); /* it is answered, late */
  CHECK(stats_of(d).published == 1);
  oi__dir_close(d);

  /* Nobody listens: degraded. A flush says so; the queue keeps at most
   * OI_DIR_QUEUE_MAX entries and counts the rest dropped. */
  int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  REQUIRE(lfd >= 0 && bind(lfd, (struct sockaddr *)&a, sizeof a) == 0 &&
          getsockname(lfd, (struct sockaddr *)&a, &len) == 0);
  snprintf(url, sizeof url, "redis://127.0.0.1:%d", ntohs(a.sin_port));
  close(lfd); /* a port just freed: connections are refused */
  d = open_dir(url, 0);
  CHECK(!stats_of(d).connected);
  CHECK_ST(oi__dir_flush(d, 100), OI_ERR_CLOSED);
  enum { CHUNK = 65536 };
  oi_tier_key *keys = malloc(CHUNK * sizeof *keys);
  REQUIRE(keys);
  for (uint32_t i = 0; i < CHUNK; i++)
    keys[i] = key_of(i);
  for (uint32_t r = 0; r < OI_DIR_QUEUE_MAX / CHUNK + 1; r++)
    CHECK_OK(oi__dir_publish(d, keys, CHUNK));
  oi_dir_stats s = stats_of(d);
  CHECK(s.queue_dropped == CHUNK);
  CHECK(s.queue_depth == OI_DIR_QUEUE_MAX);
  CHECK_ST(oi__dir_flush(d, 100), OI_ERR_CLOSED);
  CHECK_ST(oi__dir_publish(NULL, keys, 1), OI_ERR_INVALID_ARGUMENT);
  CHECK_ST(oi__dir_publish(d, NULL, 1), OI_ERR_INVALID_ARGUMENT);
  CHECK_OK(oi__dir_publish(d, NULL, 0));
  CHECK_ST(oi__dir_flush(NULL, 10), OI_ERR_INVALID_ARGUMENT);
  free(keys);
  oi__dir_close(d);
}

/* Redirections and lost connections on a "cluster" of one fake master:
 * a MOVED that names no host (the same host), a MOVED back to the same
 * node forever (given up after the rounds), a map reload that fails
 * after a MOVED, a slot no master serves, a master whose CLUSTER INFO turns
 * not ok, and the synchronous side's connection closed under a GET and an
 * EVAL (degraded, OI_ERR_CLOSED). */
static void test_cluster_redirects(void) {
  fk_clear();
  snprintf(url, sizeof url, "redis+cluster://127.0.0.1:%d", fk.port);
  oi_dir *d = open_dir(url, 0);
  REQUIRE(stats_of(d).connected);
  oi_tier_key k[2] = {key_of(1), key_of(2)};
  oi_dir_holder h[2];
  size_t n = 9;
  CHECK_OK(oi__dir_publish(d, k, 2));
  CHECK_OK(oi__dir_flush(d, 3000));
  /* MOVED to ":PORT": the same host; followed (and the map reloaded). */
  char moved[64];
  snprintf(moved, sizeof moved, "-MOVED 100 :%d\r\n", fk.port);
  fk_override("GET", "oi:b:", moved, 1);
  uint64_t redirects = stats_of(d).redirects;
  CHECK_OK(oi__dir_lookup(d, k, 2, h, &n));
  CHECK(n == 2 && stats_of(d).redirects > redirects);
  /* ... and the map reload after it fails: noted, the lookup answered. */
  fk_override("GET", "oi:b:", moved, 1);
  fk_override("CLUSTER SLOTS", "", "-ERR busy\r\n", 1);
  CHECK_OK(oi__dir_lookup(d, k, 2, h, &n));
  CHECK(n == 2);
  CHECK(error_soon(d, "reloading the slot map"));
  /* MOVED forever: given up after the rounds, the lookup fails. */
  snprintf(moved, sizeof moved, "-MOVED 100 127.0.0.1:%d\r\n", fk.port);
  fk_override("GET", "oi:b:", moved, -1);
  CHECK(oi__dir_lookup(d, k, 2, h, &n) != OI_OK);
  CHECK(n == 0 && strstr(oi_last_error(), "redirected too often"));
  fk_clear();
  oi__dir_close(d);

  /* A map with slots no master serves: a key there cannot be asked. */
  fk_override("CLUSTER SLOTS", "", "", -1);
  char slots[256];
  snprintf(slots, sizeof slots,
           "*1\r\n*3\r\n:0\r\n:1\r\n*3\r\n$9\r\n127.0.0.1\r\n:%d\r\n$2\r\nid\r\n", fk.port);
  fk_clear();
  fk_override("CLUSTER SLOTS", "", slots, -1);
  d = open_dir(url, 0);
  REQUIRE(stats_of(d).connected);
  CHECK(oi__dir_lookup(d, k, 2, h, &n) != OI_OK);
  CHECK(n == 0);
  CHECK(error_soon(d, "no master serves slot"));
  oi__dir_close(d);

  /* The beat finds the cluster not ok: degraded. */
  fk_clear();
  d = open_dir(url, 300);
  REQUIRE(stats_of(d).connected);
  fk_override("CLUSTER INFO", "", "$20\r\ncluster_state:fail\r\n\r\n", -1);
  CHECK(error_soon(d, "the cluster is not ok"));
  oi__dir_close(d);

  /* The synchronous side's connection closes under a GET, then an EVAL. */
  fk_clear();
  snprintf(url, sizeof url, "redis://127.0.0.1:%d", fk.port);
  d = open_dir(url, 0);
  REQUIRE(stats_of(d).connected);
  char addr[64];
  uint64_t epoch = 0;
  CHECK_ST(oi__dir_node_lookup(NULL, "x", addr, sizeof addr, &epoch), OI_ERR_INVALID_ARGUMENT);
  CHECK_ST(oi__dir_node_lookup(d, "x", NULL, 0, &epoch), OI_ERR_INVALID_ARGUMENT);
  fk_override("GET", "oi:node:", "CLOSE", 1);
  CHECK_ST(oi__dir_node_lookup(d, "nodeB", addr, sizeof addr, &epoch), OI_ERR_CLOSED);
  CHECK(strstr(oi_last_error(), "GET"));
  oi__dir_close(d);
  d = open_dir(url, 300); /* a beat every 100 ms */
  REQUIRE(stats_of(d).connected);
  oi_dir_holder me = {.epoch = 7};
  snprintf(me.node_id, sizeof me.node_id, "nodeA");
  fk_override("EVAL", "", "CLOSE", 1);
  CHECK_ST(oi__dir_remove_stale(d, &k[0], &me), OI_ERR_CLOSED);
  CHECK(strstr(oi_last_error(), "EVAL"));
  /* The background side's connection is still up, so its check may find
   * Redis answering and end the degradation at once. Once its PING is
   * closed too, and every reconnection with it (each begins with SCRIPT
   * LOAD), the directory stays degraded: refused at once. */
  fk_override("PING", "", "CLOSE", -1);
  fk_override("SCRIPT LOAD", "", "CLOSE", -1);
  CHECK(error_soon(d, "SCRIPT LOAD"));
  CHECK(!stats_of(d).connected);
  CHECK_ST(oi__dir_remove_stale(d, &k[0], &me), OI_ERR_CLOSED);
  CHECK(strstr(oi_last_error(), "unreachable"));
  CHECK_ST(oi__dir_node_lookup(d, "nodeB", addr, sizeof addr, &epoch), OI_ERR_CLOSED);
  oi__dir_close(d);
}

/* URLs that parse (an IPv6 host in brackets) and that do not (a unix
 * socket path too long, trailing bytes). */
static void test_more_urls(void) {
  oi_dir_options o;
  oi__dir_options_init(&o);
  o.secret = TEST_SECRET;
  o.secret_len = strlen(TEST_SECRET);
  o.node_id = "u";
  o.timeout_ms = 100;
  oi_dir *d = NULL;
  o.url = "redis://[::1]:1";
  CHECK_OK(oi__dir_open(&o, &d)); /* parsed; nobody there: degraded */
  CHECK(d && !stats_of(d).connected);
  oi__dir_close(d);
  d = NULL;
  char longpath[200] = "unix:/";
  memset(longpath + 6, 'p', 150);
  longpath[156] = '\0';
  o.url = longpath;
  CHECK_ST(oi__dir_open(&o, &d), OI_ERR_INVALID_ARGUMENT);
  CHECK(strstr(oi_last_error(), "longer than"));
  o.url = "redis://127.0.0.1:6379,127.0.0.1:6380"; /* a list: cluster urls only */
  CHECK_ST(oi__dir_open(&o, &d), OI_ERR_INVALID_ARGUMENT);
  CHECK(strstr(oi_last_error(), "unexpected"));
  CHECK(d == NULL);
}

/* Replies of the wrong kind to a single instance: SELECT answered with an
 * integer or not at all, a script digest of the wrong length, a publish
 * answered with an integer or an error that is (ASK) or is not a sign of a
 * cluster, NOSCRIPT, the node key's SET and PING answered with an integer,
 * PING unanswered, a node lookup and a stale removal answered oddly. */
static void test_odd_replies(void) {
  snprintf(url, sizeof url, "redis://127.0.0.1:%d/7", fk.port);
  const struct {
    const char *reply, *why;
  } selects[] = {{":1\r\n", "SELECT 7: unexpected reply"}, {"CLOSE", "SELECT 7: "}};
  for (size_t i = 0; i < OI_ARRAY_LEN(selects); i++) {
    fk_clear();
    fk_override("SELECT", "", selects[i].reply, -1);
    oi_dir *d = open_dir(url, 0);
    oi_dir_stats s = stats_of(d);
    if (s.connected || !strstr(s.last_error, selects[i].why)) {
      fprintf(stderr, "SELECT case %zu: connected %d, '%s'\n", i, s.connected, s.last_error);
      CHECK(false);
    }
    oi__dir_close(d);
  }

  /* A digest that is not 40 characters: not used, the script goes whole. */
  fk_clear();
  snprintf(url, sizeof url, "redis://127.0.0.1:%d", fk.port);
  fk_override("SCRIPT LOAD", "", "$3\r\nabc\r\n", -1);
  oi_dir *d = open_dir(url, 300);
  REQUIRE(stats_of(d).connected);
  oi_tier_key k[2] = {key_of(1), key_of(2)};
  CHECK_OK(oi__dir_publish(d, k, 1));
  CHECK_OK(oi__dir_unpublish(d, k, 1));
  CHECK_OK(oi__dir_flush(d, 3000));
  CHECK(fk_saw("EVAL ") && !fk_saw("EVALSHA") && stats_of(d).unpublished == 1);
  oi__dir_close(d);

  fk_clear();
  d = open_dir(url, 300);
  REQUIRE(stats_of(d).connected);
  const struct {
    const char *reply, *why;
    bool hint;
  } publishes[] = {{":1\r\n", "publish: unexpected reply", false},
                   {"-ASK 12 127.0.0.1:1\r\n", "publish: ASK 12", true},
                   {"-ERR odd\r\n", "publish: ERR odd", false}};
  for (size_t i = 0; i < OI_ARRAY_LEN(publishes); i++) {
    fk_override("SET", "oi:b:", publishes[i].reply, 1);
    CHECK_OK(oi__dir_publish(d, k, 1));
    CHECK_OK(oi__dir_flush(d, 3000));
    oi_dir_stats s = stats_of(d);
    if (s.published != 0 || !strstr(s.last_error, publishes[i].why) ||
        publishes[i].hint != (strstr(s.last_error, "redis+cluster://") != NULL)) {
      fprintf(stderr, "publish case %zu: published %llu, '%s'\n", i,
              (unsigned long long)s.published, s.last_error);
      CHECK(false);
    }
  }
  /* The script cache was flushed (NOSCRIPT): the script goes whole, and
   * the entry is removed. */
  CHECK_OK(oi__dir_publish(d, k, 1));
  CHECK_OK(oi__dir_flush(d, 3000));
  fk_override("EVALSHA", "", "-NOSCRIPT No matching script. Please use EVAL.\r\n", 1);
  CHECK_OK(oi__dir_unpublish(d, k, 1));
  CHECK_OK(oi__dir_flush(d, 3000));
  CHECK(fk_saw("EVALSHA ") && fk_saw("EVAL oi:b:") == false && stats_of(d).unpublished == 1);
  oi_dir_holder h[2];
  size_t n = 9;
  CHECK_OK(oi__dir_lookup(d, k, 1, h, &n));
  CHECK(n == 0);

  /* A node's liveness key answered with an error; a stale removal answered
   * with a status. */
  char addr[64];
  fk_override("GET", "oi:node:", "-ERR no such thing\r\n", 1);
  CHECK_ST(oi__dir_node_lookup(d, "nodeB", addr, sizeof addr, NULL), OI_ERR_PROTOCOL);
  CHECK(strstr(oi_last_error(), "answered GET with ERR no such thing"));
  oi_dir_holder me = {.epoch = 7};
  snprintf(me.node_id, sizeof me.node_id, "nodeA");
  fk_override("EVAL", "", "+OK\r\n", 1);
  CHECK_ST(oi__dir_remove_stale(d, &k[1], &me), OI_ERR_PROTOCOL);
  CHECK(strstr(oi_last_error(), "answered EVAL with an unexpected reply"));

  /* The beat: PING answered with an integer (noted, still connected), the
   * node key's SET answered with one, then PING unanswered (degraded). */
  fk_override("PING", "", ":1\r\n", -1);
  CHECK(error_soon(d, "PING: unexpected reply"));
  CHECK(stats_of(d).connected);
  fk_clear();
  CHECK_OK(oi__dir_set_advertise(d, "127.0.0.1:9"));
  fk_override("SET", "oi:node:", ":1\r\n", -1);
  CHECK(error_soon(d, "refreshing the node key: unexpected reply"));
  CHECK(stats_of(d).connected);
  CHECK_OK(oi__dir_set_advertise(d, NULL));
  fk_clear();
  uint64_t reconnects = stats_of(d).reconnects;
  fk_override("PING", "", "CLOSE", 1);
  char why[64];
  snprintf(why, sizeof why, "PING 127.0.0.1:%d", fk.port);
  CHECK(error_soon(d, why));
  /* the connection was lost, and made again */
  for (int i = 0; i < 300 && stats_of(d).reconnects == reconnects; i++)
    sleep_ms(10);
  CHECK(stats_of(d).reconnects == reconnects + 1 && stats_of(d).connected);
  oi__dir_close(d);
}

/* CLUSTER SLOTS and CLUSTER INFO that a cluster seed answers badly, field
 * by field, and a master the map names that does not answer. */
static void test_bad_slot_maps(void) {
  snprintf(url, sizeof url, "redis+cluster://127.0.0.1:%d", fk.port);
  int dead = 0;
  {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    REQUIRE(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
            getsockname(fd, (struct sockaddr *)&a, &len) == 0);
    dead = ntohs(a.sin_port);
    close(fd); /* nobody listens there */
  }
  char valid[128], deadmap[128];
  snprintf(valid, sizeof valid, "*3\r\n:0\r\n:100\r\n*2\r\n$9\r\n127.0.0.1\r\n:%d\r\n", fk.port);
  snprintf(deadmap, sizeof deadmap, "*1\r\n*3\r\n:0\r\n:16383\r\n*2\r\n$9\r\n127.0.0.1\r\n:%d\r\n",
           dead);
  char then_bad[256], deadwhy[64];
  snprintf(then_bad, sizeof then_bad, "*2\r\n%s*1\r\n:5\r\n", valid);
  snprintf(deadwhy, sizeof deadwhy, "connect 127.0.0.1:%d", dead);
  const char *shape = "not [start, end, [host, port, ...]]";
  const refusal cases[] = {
      {"CLUSTER INFO", "CLOSE", "CLUSTER INFO at 127.0.0.1"},
      {"CLUSTER SLOTS", "CLOSE", "CLUSTER SLOTS: "},
      {"CLUSTER SLOTS", "+OK\r\n", "CLUSTER SLOTS: unexpected reply"},
      {"CLUSTER SLOTS", "*1\r\n*2\r\n:0\r\n:1\r\n", shape},
      {"CLUSTER SLOTS", "*1\r\n*3\r\n$1\r\na\r\n:1\r\n*2\r\n$1\r\nh\r\n:1\r\n", shape},
      {"CLUSTER SLOTS", "*1\r\n*3\r\n:0\r\n$1\r\nb\r\n*2\r\n$1\r\nh\r\n:1\r\n", shape},
      {"CLUSTER SLOTS", "*1\r\n*3\r\n:0\r\n:1\r\n:5\r\n", shape},
      {"CLUSTER SLOTS", "*1\r\n*3\r\n:0\r\n:1\r\n*1\r\n$1\r\nh\r\n", shape},
      {"CLUSTER SLOTS", "*1\r\n*3\r\n:0\r\n:1\r\n*2\r\n:7\r\n:1\r\n", shape},
      {"CLUSTER SLOTS", "*1\r\n*3\r\n:0\r\n:1\r\n*2\r\n$1\r\nh\r\n$1\r\n1\r\n", shape},
      {"CLUSTER SLOTS", "*1\r\n*3\r\n:-1\r\n:1\r\n*2\r\n$1\r\nh\r\n:1\r\n", "out of bounds"},
      {"CLUSTER SLOTS", "*1\r\n*3\r\n:5\r\n:4\r\n*2\r\n$1\r\nh\r\n:1\r\n", "out of bounds"},
      {"CLUSTER SLOTS", "*1\r\n*3\r\n:0\r\n:1\r\n*2\r\n$1\r\nh\r\n:0\r\n", "out of bounds"},
      {"CLUSTER SLOTS", "*1\r\n*3\r\n:0\r\n:1\r\n*2\r\n$1\r\nh\r\n:70000\r\n", "out of bounds"},
      {"CLUSTER SLOTS", then_bad, shape}, /* a good entry, then a bad one */
      {"CLUSTER SLOTS", deadmap, deadwhy},
  };
  expect_refusals(cases, OI_ARRAY_LEN(cases));
}

/* Two masters that are one fake (127.0.0.1 and 127.1 name the same
 * address, and the directory tells masters apart by their names): the map
 * read, a master with no host in it (the seed's), the map shrunk to one
 * master after a MOVED (the other's connection closed); redirections that
 * do not parse, one to a master that does not answer, an ASK whose ASKING
 * is not answered; a publish, a node lookup and a stale removal redirected
 * forever; a beat whose CLUSTER INFO is an error. */
static void test_cluster_masters(void) {
  fk_clear();
  snprintf(url, sizeof url, "redis+cluster://127.0.0.1:%d", fk.port);
  char two[320], one[160];
  snprintf(two, sizeof two,
           "*3\r\n*3\r\n:0\r\n:8191\r\n*2\r\n$9\r\n127.0.0.1\r\n:%d\r\n"
           "*3\r\n:8192\r\n:12000\r\n*2\r\n$5\r\n127.1\r\n:%d\r\n"
           "*3\r\n:12001\r\n:16383\r\n*2\r\n$0\r\n\r\n:%d\r\n",
           fk.port, fk.port, fk.port);
  snprintf(one, sizeof one, "*1\r\n*3\r\n:0\r\n:16383\r\n*2\r\n$5\r\n127.1\r\n:%d\r\n", fk.port);
  fk_override("CLUSTER SLOTS", "", two, 1);
  fk_override("CLUSTER SLOTS", "", one, -1);
  oi_dir *d = open_dir(url, 0);
  REQUIRE(stats_of(d).connected);
  enum { N = 32 };
  oi_tier_key k[N];
  oi_dir_holder h[N];
  for (uint32_t i = 0; i < N; i++)
    k[i] = key_of(i);
  size_t n = 0;
  CHECK_OK(oi__dir_publish(d, k, N));
  CHECK_OK(oi__dir_flush(d, 3000));
  CHECK(stats_of(d).published == N);
  CHECK_OK(oi__dir_lookup(d, k, N, h, &n));
  CHECK(n == N);
  /* A MOVED: the map is read again, one master now. */
  char moved[64];
  snprintf(moved, sizeof moved, "-MOVED 100 127.1:%d\r\n", fk.port);
  fk_override("GET", "oi:b:", moved, 1);
  uint64_t redirects = stats_of(d).redirects;
  CHECK_OK(oi__dir_lookup(d, k, N, h, &n));
  CHECK(n == N && stats_of(d).redirects == redirects + 1);
  CHECK(stats_of(d).connected);
  oi__dir_close(d);

  /* Redirections that do not parse: the lookup fails, degraded. */
  char longhost[400];
  snprintf(longhost, sizeof longhost, "-MOVED 100 %0300d:1\r\n", 7);
  const char *bad[] = {"-MOVED 99999 127.0.0.1:1\r\n",
                       "-MOVED x 127.0.0.1:1\r\n",
                       "-MOVED 100 127.0.0.1\r\n",
                       "-MOVED 100 127.0.0.1:x\r\n",
                       "-MOVED 100 127.0.0.1:0\r\n",
                       "-MOVED 100 127.0.0.1:70000\r\n",
                       longhost};
  for (size_t i = 0; i < OI_ARRAY_LEN(bad); i++) {
    fk_clear();
    oi_dir *e = open_dir(url, 0);
    REQUIRE(stats_of(e).connected);
    fk_override("GET", "oi:b:", bad[i], 1);
    oi_status st = oi__dir_lookup(e, k, 2, h, &n);
    if (st != OI_ERR_CLOSED || n != 0 || !error_soon(e, "redirection that does not parse")) {
      fprintf(stderr, "redirection %zu: %s (%s)\n", i, oi_status_str(st), oi_last_error());
      CHECK(false);
    }
    oi__dir_close(e);
  }

  /* A MOVED to a master nobody answers for; an ASK whose ASKING goes
   * unanswered: the connection is lost, the lookup fails. */
  fk_clear();
  d = open_dir(url, 0);
  REQUIRE(stats_of(d).connected);
  snprintf(moved, sizeof moved, "-MOVED 100 127.0.0.1:1\r\n");
  fk_override("GET", "oi:b:", moved, 1);
  CHECK_ST(oi__dir_lookup(d, k, 2, h, &n), OI_ERR_CLOSED);
  CHECK(n == 0 && strstr(oi_last_error(), "connect 127.0.0.1:1"));
  oi__dir_close(d);
  fk_clear();
  d = open_dir(url, 0);
  REQUIRE(stats_of(d).connected);
  snprintf(moved, sizeof moved, "-ASK 100 127.0.0.1:%d\r\n", fk.port);
  fk_override("GET", "oi:b:", moved, 1);
  fk_override("ASKING", "", "CLOSE", 1);
  CHECK_ST(oi__dir_lookup(d, k, 2, h, &n), OI_ERR_CLOSED);
  CHECK(n == 0 && strstr(oi_last_error(), "GET"));
  oi__dir_close(d);

  /* Redirected forever: a node lookup, a stale removal, a publish. */
  fk_clear();
  d = open_dir(url, 0);
  REQUIRE(stats_of(d).connected);
  snprintf(moved, sizeof moved, "-MOVED 100 127.0.0.1:%d\r\n", fk.port);
  fk_override("GET", "oi:node:", moved, -1);
  char addr[64];
  CHECK_ST(oi__dir_node_lookup(d, "nodeB", addr, sizeof addr, NULL), OI_ERR_CLOSED);
  CHECK(strstr(oi_last_error(), "redirected too often"));
  fk_override("EVAL", "", moved, -1);
  oi_dir_holder me = {.epoch = 7};
  snprintf(me.node_id, sizeof me.node_id, "nodeA");
  CHECK_ST(oi__dir_remove_stale(d, &k[0], &me), OI_ERR_PROTOCOL);
  CHECK(strstr(oi_last_error(), "answered EVAL with redirected too often"));
  fk_override("SET", "oi:b:", moved, -1);
  CHECK_OK(oi__dir_publish(d, k, 1));
  CHECK_OK(oi__dir_flush(d, 3000));
  CHECK(stats_of(d).published == 0);
  CHECK(error_soon(d, "still redirected after"));
  oi__dir_close(d);

  /* The beat's CLUSTER INFO answered with an error: not ok, degraded. */
  fk_clear();
  d = open_dir(url, 300);
  REQUIRE(stats_of(d).connected);
  uint64_t reconnects = stats_of(d).reconnects;
  fk_override("CLUSTER INFO", "", "-ERR busy\r\n", 1);
  CHECK(error_soon(d, "the cluster is not ok"));
  for (int i = 0; i < 300 && stats_of(d).reconnects == reconnects; i++)
    sleep_ms(10);
  CHECK(stats_of(d).reconnects == reconnects + 1); /* and made again */
  oi__dir_close(d);
}

/* URLs refused field by field; calls with what they need missing. */
static void test_urls_and_arguments(void) {
  char longhost[300] = "redis://";
  memset(longhost + 8, 'h', 280);
  longhost[288] = '\0';
  const struct {
    const char *url, *why;
  } cases[] = {
      {"unix:/", "must be absolute"},
      {"unix:/tmp/r.sock?dbx=1", "?db=N"},
      {"unix:/tmp/r.sock?db=1000001", "?db=N"},
      {"redis+cluster://127.0.0.1:1/1", "database 0 only"},
      {"redis+cluster://127.0.0.1:1,", "no host"},
      {"redis+cluster://a@127.0.0.1:1", "credentials"},
      {"redis://127.0.0.1:1/1000001", "not a database number"},
      {longhost, "an overlong host"},
  };
  for (size_t i = 0; i < OI_ARRAY_LEN(cases); i++) {
    oi_dir_options o;
    oi__dir_options_init(&o);
    o.secret = TEST_SECRET;
    o.secret_len = strlen(TEST_SECRET);
    o.url = cases[i].url;
    o.node_id = "u";
    oi_dir *d = (oi_dir *)1;
    oi_status st = oi__dir_open(&o, &d);
    if (st != OI_ERR_INVALID_ARGUMENT || d || !strstr(oi_last_error(), cases[i].why)) {
      fprintf(stderr, "url '%.40s': %s (%s)\n", cases[i].url, oi_status_str(st), oi_last_error());
      CHECK(false);
    }
  }
  /* URLs that parse: a cluster with "/" or "/0" after its addresses, a
   * database left empty. Nobody listens on port 1: degraded. */
  const char *good[] = {"redis+cluster://127.0.0.1:1/", "redis+cluster://127.0.0.1:1/0",
                        "redis://127.0.0.1:1/"};
  for (size_t i = 0; i < OI_ARRAY_LEN(good); i++) {
    oi_dir_options o;
    oi__dir_options_init(&o);
    o.secret = TEST_SECRET;
    o.secret_len = strlen(TEST_SECRET);
    o.url = good[i];
    o.node_id = "u";
    o.timeout_ms = 100;
    oi_dir *d = NULL;
    CHECK_OK(oi__dir_open(&o, &d));
    CHECK(d && !stats_of(d).connected);
    oi__dir_close(d);
  }
  /* The parsers refuse what is no entry and no liveness value. */
  oi_dir_holder h;
  CHECK(!oi__dir_holder_parse(NULL, 4, &h));
  uint64_t e = 0;
  size_t off = 0, len = 0;
#define MAC32 " 0123456789abcdef0123456789abcdef"
  CHECK(!oi__dir_liveness_parse(NULL, 4, &e, &off, &len, NULL, NULL));
  CHECK(!oi__dir_liveness_parse("12 5" MAC32, 37, &e, &off, &len, NULL, NULL));
  CHECK(!oi__dir_liveness_parse("x2 127.0.0.1:1 5" MAC32, 49, &e, &off, &len, NULL, NULL));
  CHECK(!oi__dir_liveness_parse("12  5" MAC32, 38, &e, &off, &len, NULL, NULL));
  CHECK(oi__dir_liveness_parse("12 127.0.0.1:1 5" MAC32, 49, &e, &off, &len, NULL, NULL));
  CHECK(e == 12 && off == 3 && len == 11);
  /* Calls without what they need; observing nothing. */
  fk_clear();
  snprintf(url, sizeof url, "redis://127.0.0.1:%d", fk.port);
  oi_dir *d = open_dir(url, 0);
  oi_tier_key k = key_of(1);
  oi_dir_holder out[1];
  CHECK_ST(oi__dir_lookup(d, &k, 1, out, NULL), OI_ERR_INVALID_ARGUMENT);
  CHECK_ST(oi__dir_set_advertise(NULL, "127.0.0.1:1"), OI_ERR_INVALID_ARGUMENT);
  CHECK_ST(oi__dir_remove_stale(d, &k, NULL), OI_ERR_INVALID_ARGUMENT);
  CHECK(oi__dir_generation(NULL) == 0 && oi__dir_generation(d) == 1);
  oi_dir_stats s;
  memset(&s, 0x5a, sizeof s);
  oi__dir_stats(NULL, &s);
  CHECK(!s.connected && s.generation == 0 && s.last_error[0] == '\0');
  oi__dir_stats(d, NULL);
  oi__dir_options_init(NULL);
  oi__dir_close(d);
}

int main(void) {
  fk_start(false);
  RUN_TEST(test_select);
  RUN_TEST(test_script_load);
  RUN_TEST(test_error_replies);
  RUN_TEST(test_queue_limits);
  RUN_TEST(test_not_a_cluster);
  RUN_TEST(test_cluster_replies);
  RUN_TEST(test_cluster_redirects);
  RUN_TEST(test_more_urls);
  RUN_TEST(test_odd_replies);
  RUN_TEST(test_bad_slot_maps);
  RUN_TEST(test_cluster_masters);
  RUN_TEST(test_urls_and_arguments);
  fk_stop();
  fk_start(true);
  RUN_TEST(test_unix_socket_with_db);
  fk_stop();
  TEST_EXIT();
}
