/* The cluster tier's block directory against a real Redis Cluster: three
 * private redis-server masters on free loopback ports (cluster mode, slots
 * assigned with CLUSTER ADDSLOTSRANGE, joined with CLUSTER MEET), addressed
 * with a redis+cluster:// url. Key slots against known values and the
 * server's own CLUSTER KEYSLOT; publish and look up a prefix whose keys land
 * on all three masters; compare-and-delete between nodes on each master;
 * liveness; a slot migrated under running nodes (ASK while it moves, MOVED
 * after); one master stopped (lookups fail within the timeout) and
 * continued; one master killed (lookups fail fast, degraded, CLUSTERDOWN)
 * and restarted (recovered). Skips (77) when redis-server is not on PATH. */
#include <dirent.h>
#include <sys/stat.h>

#include "cluster/directory.h"
#include "cluster_util.h"

#define TEST_SECRET "the test cluster's secret"

#define MASTERS 3

static int g_port[MASTERS];
static pid_t g_pid[MASTERS];
static char g_id[MASTERS][48];
static char g_dir[64];
static char g_url[256];
static int g_owner[OI_DIR_SLOTS]; /* master index per slot, as the test set it */

static redisReply *cmd(int m, const char *fmt, ...) {
  redisContext *c = raw(g_port[m]);
  REQUIRE(c);
  va_list ap;
  va_start(ap, fmt);
  redisReply *r = redisvCommand(c, fmt, ap);
  va_end(ap);
  REQUIRE(r);
  redisFree(c);
  return r;
}

static void cmd_ok(int m, const char *fmt, const char *a, const char *b) {
  redisReply *r = cmd(m, fmt, a, b);
  if (r->type == REDIS_REPLY_ERROR) fprintf(stderr, "master %d: %s: %s\n", m, fmt, r->str);
  REQUIRE(r->type != REDIS_REPLY_ERROR);
  freeReplyObject(r);
}

/* A free port whose cluster bus port (+10000) is free too. */
static int free_cluster_port(void) {
  for (int tries = 0; tries < 1000; tries++) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int port = 20000 + (int)(oi__now_ns() / 1000 % 30000);
    a.sin_port = htons((uint16_t)port);
    bool ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
    close(fd);
    if (!ok) continue;
    fd = socket(AF_INET, SOCK_STREAM, 0);
    a.sin_port = htons((uint16_t)(port + 10000));
    ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
    close(fd);
    if (ok) return port;
  }
  fprintf(stderr, "no free port pair for a cluster node\n");
  exit(1);
}

static pid_t cluster_start(int m) {
  char port[16], conf[128];
  snprintf(port, sizeof port, "%d", g_port[m]);
  snprintf(conf, sizeof conf, "nodes-%d.conf", g_port[m]);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    freopen("/dev/null", "w", stdout);
    execlp("redis-server", "redis-server", "--port", port, "--save", "", "--appendonly", "no",
           "--bind", "127.0.0.1", "--daemonize", "no", "--dir", g_dir, "--cluster-enabled", "yes",
           "--cluster-config-file", conf, "--cluster-node-timeout", "2000", (char *)NULL);
    _exit(127);
  }
  for (int i = 0; i < 500; i++) {
    redisContext *c = raw(g_port[m]);
    if (c) {
      redisReply *r = redisCommand(c, "PING");
      bool ok = r && r->type == REDIS_REPLY_STATUS;
      if (r) freeReplyObject(r);
      redisFree(c);
      if (ok) return pid;
    }
    sleep_ms(10);
  }
  fprintf(stderr, "redis-server on port %d did not answer PING within 5 s\n", g_port[m]);
  exit(1);
}

static bool state_ok(int m) {
  redisContext *c = raw(g_port[m]);
  if (!c) return false;
  redisReply *r = redisCommand(c, "CLUSTER INFO");
  bool ok = r && r->type == REDIS_REPLY_STRING && strstr(r->str, "cluster_state:ok") &&
            strstr(r->str, "cluster_known_nodes:3");
  if (r) freeReplyObject(r);
  redisFree(c);
  return ok;
}

static void wait_state_ok(void) {
  uint64_t t0 = oi__now_ns();
  for (;;) {
    bool ok = true;
    for (int m = 0; m < MASTERS; m++)
      ok = ok && state_ok(m);
    if (ok) return;
    if (ms_since(t0) > 20000) {
      fprintf(stderr, "the cluster did not reach cluster_state:ok within 20 s\n");
      exit(1);
    }
    sleep_ms(50);
  }
}

static void cluster_create(void) {
  snprintf(g_dir, sizeof g_dir, "/tmp/oi-rcluster-XXXXXX");
  REQUIRE(mkdtemp(g_dir));
  for (int m = 0; m < MASTERS; m++) {
    g_port[m] = free_cluster_port();
    g_pid[m] = cluster_start(m);
  }
  int lo = 0;
  for (int m = 0; m < MASTERS; m++) {
    int hi = m == MASTERS - 1 ? (int)OI_DIR_SLOTS - 1 : lo + (int)OI_DIR_SLOTS / MASTERS - 1;
    char a[16], b[16];
    snprintf(a, sizeof a, "%d", lo);
    snprintf(b, sizeof b, "%d", hi);
    redisReply *r = cmd(m, "CLUSTER ADDSLOTSRANGE %s %s", a, b);
    if (r->type == REDIS_REPLY_ERROR) { /* before Redis 7: the slots one by one */
      redisContext *c = raw(g_port[m]);
      REQUIRE(c);
      for (int s = lo; s <= hi; s++) {
        char sl[16];
        snprintf(sl, sizeof sl, "%d", s);
        const char *argv[3] = {"CLUSTER", "ADDSLOTS", sl};
        redisAppendCommandArgv(c, 3, argv, NULL);
      }
      for (int s = lo; s <= hi; s++) {
        void *v = NULL;
        REQUIRE(redisGetReply(c, &v) == REDIS_OK && v);
        REQUIRE(((redisReply *)v)->type == REDIS_REPLY_STATUS);
        freeReplyObject(v);
      }
      redisFree(c);
    }
    freeReplyObject(r);
    for (int s = lo; s <= hi; s++)
      g_owner[s] = m;
    lo = hi + 1;
    r = cmd(m, "CLUSTER MYID");
    REQUIRE(r->type == REDIS_REPLY_STRING);
    snprintf(g_id[m], sizeof g_id[m], "%s", r->str);
    freeReplyObject(r);
  }
  for (int m = 1; m < MASTERS; m++) {
    char p[16];
    snprintf(p, sizeof p, "%d", g_port[m]);
    cmd_ok(0, "CLUSTER MEET %s %s", "127.0.0.1", p);
  }
  wait_state_ok();
  snprintf(g_url, sizeof g_url, "redis+cluster://127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d", g_port[0],
           g_port[1], g_port[2]);
}

static void cluster_destroy(void) {
  for (int m = 0; m < MASTERS; m++)
    if (g_pid[m] > 0) redis_stop(g_pid[m]);
  tu_remove_dir(g_dir);
}

static oi_tier_key key_of(uint64_t ns, uint32_t i) {
  oi_tier_key k = {.ns_fp = ns, .layout_fp = 0x0123456789abcdefull};
  for (int b = 0; b < 16; b++)
    k.hash[b] = (uint8_t)(i * 7 + b);
  memcpy(k.hash, &i, sizeof i);
  return k;
}

static uint16_t slot_of(const oi_tier_key *k) {
  char s[OI_DIR_KEY_MAX + 1];
  oi__dir_key_format(NULL, k, s);
  return oi__dir_key_slot(s, strlen(s));
}

static oi_dir *open_node(const char *id, uint64_t epoch, const char *url) {
  oi_dir_options o;
  oi__dir_options_init(&o);
  o.secret = TEST_SECRET;
  o.secret_len = strlen(TEST_SECRET);
  o.url = url ? url : g_url;
  o.node_id = id;
  o.epoch = epoch;
  o.node_ttl_ms = 900;
  o.timeout_ms = 300;
  oi_dir *d = NULL;
  REQUIRE(oi__dir_open(&o, &d) == OI_OK);
  return d;
}

/* GET of a raw key at master m; "" when absent. */
static void raw_get(int m, const oi_tier_key *k, char *out, size_t cap) {
  char s[OI_DIR_KEY_MAX + 1];
  oi__dir_key_format(NULL, k, s);
  redisReply *r = cmd(m, "GET %s", s);
  snprintf(out, cap, "%s", r->type == REDIS_REPLY_STRING ? r->str : "");
  freeReplyObject(r);
}

/* The same on a slot being imported by m (ASKING first). */
static void raw_get_asking(int m, const oi_tier_key *k, char *out, size_t cap) {
  char s[OI_DIR_KEY_MAX + 1];
  oi__dir_key_format(NULL, k, s);
  redisContext *c = raw(g_port[m]);
  REQUIRE(c);
  freeReplyObject(redisCommand(c, "ASKING"));
  redisReply *r = redisCommand(c, "GET %s", s);
  REQUIRE(r);
  snprintf(out, cap, "%s", r->type == REDIS_REPLY_STRING ? r->str : "");
  freeReplyObject(r);
  redisFree(c);
}

/* ---- tests ---- */

static void test_slots(void) {
  CHECK(oi__dir_crc16("123456789", 9) == 0x31c3); /* the CRC-16/XMODEM check value */
  CHECK(oi__dir_key_slot("foo", 3) == 12182);
  CHECK(oi__dir_key_slot("bar", 3) == 5061);
  CHECK(oi__dir_key_slot("", 0) == 0);
  const char *a = "{user1000}.following", *b = "{user1000}.followers";
  CHECK(oi__dir_key_slot(a, strlen(a)) == oi__dir_key_slot(b, strlen(b)));
  CHECK(oi__dir_key_slot(a, strlen(a)) == oi__dir_key_slot("user1000", 8));
  /* the tag is the first '{' to the next '}', when not empty */
  CHECK(oi__dir_key_slot("foo{bar}{zap}", 13) == oi__dir_key_slot("bar", 3));
  CHECK(oi__dir_key_slot("foo{{bar}}zap", 13) == oi__dir_key_slot("{bar", 4));
  CHECK(oi__dir_key_slot("foo{}{bar}", 10) == (oi__dir_crc16("foo{}{bar}", 10) & 16383));
  CHECK(oi__dir_key_slot("{}", 2) == (oi__dir_crc16("{}", 2) & 16383));
  CHECK(oi__dir_key_slot("abc{", 4) == (oi__dir_crc16("abc{", 4) & 16383));
}

/* Directory keys against the server's own CLUSTER KEYSLOT. */
static void test_slots_server(void) {
  redisContext *c = raw(g_port[0]);
  REQUIRE(c);
  for (uint32_t i = 0; i < 300; i++) {
    oi_tier_key k = key_of(i * 0x9e3779b97f4a7c15ull, i);
    char s[OI_DIR_KEY_MAX + 1];
    oi__dir_key_format(NULL, &k, s);
    redisReply *r = redisCommand(c, "CLUSTER KEYSLOT %s", s);
    REQUIRE(r && r->type == REDIS_REPLY_INTEGER);
    CHECK(r->integer == slot_of(&k));
    freeReplyObject(r);
  }
  const char *odd[] = {"{user1000}.following", "foo{}{bar}", "foo{{bar}}zap", "a{b}c"};
  for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++) {
    redisReply *r = redisCommand(c, "CLUSTER KEYSLOT %s", odd[i]);
    REQUIRE(r && r->type == REDIS_REPLY_INTEGER);
    CHECK(r->integer == oi__dir_key_slot(odd[i], strlen(odd[i])));
    freeReplyObject(r);
  }
  redisFree(c);
}

static void test_bad_urls(void) {
  const char *bad[][2] = {
      {"redis+cluster://", "no host"},
      {"redis+cluster://127.0.0.1:1,", "no host"},
      {"redis+cluster://127.0.0.1:0", "port"},
      {"redis+cluster://127.0.0.1:1/2", "database 0"},
      {"redis+cluster://u:p@127.0.0.1:1", "credentials"},
      {"redis+cluster://1:1,2:1,3:1,4:1,5:1,6:1,7:1,8:1,9:1,10:1,11:1,12:1,13:1,14:1,15:1,16:1,"
       "17:1",
       "more than 16"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    oi_dir_options o;
    oi__dir_options_init(&o);
    o.secret = TEST_SECRET;
    o.secret_len = strlen(TEST_SECRET);
    o.url = bad[i][0];
    o.node_id = "x";
    oi_dir *d = NULL;
    oi_status st = oi__dir_open(&o, &d);
    if (st != OI_ERR_INVALID_ARGUMENT || d || !strstr(oi_last_error(), bad[i][1])) {
      fprintf(stderr, "url '%s': %s, '%s' (wanted '%s')\n", bad[i][0], oi_status_str(st),
              oi_last_error(), bad[i][1]);
      oi_test_failures++;
    }
    oi__dir_close(d);
  }
}

static void test_round_trip(void) {
  oi_dir *a = open_node("node-a", 7, NULL);
  CHECK(oi__dir_generation(a) == 1);
  enum { N = 64 };
  oi_tier_key keys[N];
  int per_master[MASTERS] = {0};
  for (uint32_t i = 0; i < N; i++) {
    keys[i] = key_of(100, i);
    per_master[g_owner[slot_of(&keys[i])]]++;
  }
  for (int m = 0; m < MASTERS; m++)
    CHECK(per_master[m] > 0); /* the prefix spans all three masters */
  CHECK_OK(oi__dir_publish(a, keys, 40));
  CHECK_OK(oi__dir_publish(a, keys + 41, N - 41)); /* keys[40] missing: the prefix stops there */
  CHECK_OK(oi__dir_flush(a, 2000));

  /* each entry is on its slot's master, and the server counts it there */
  for (uint32_t i = 0; i < N; i++) {
    if (i == 40) continue;
    char v[128];
    int m = g_owner[slot_of(&keys[i])];
    raw_get(m, &keys[i], v, sizeof v);
    CHECK(strncmp(v, "node-a 7 ", 9) == 0);
    char slot[16];
    snprintf(slot, sizeof slot, "%u", slot_of(&keys[i]));
    redisReply *r = cmd(m, "CLUSTER COUNTKEYSINSLOT %s", slot);
    CHECK(r->type == REDIS_REPLY_INTEGER && r->integer >= 1);
    freeReplyObject(r);
  }

  oi_dir *b = open_node("node-b", 1, NULL);
  oi_dir_holder h[N];
  size_t n = 99;
  CHECK_OK(oi__dir_lookup(b, keys, N, h, &n));
  CHECK(n == 40);
  for (size_t i = 0; i < n; i++)
    CHECK(strcmp(h[i].node_id, "node-a") == 0 && h[i].epoch == 7);
  CHECK_OK(oi__dir_lookup(b, keys + 41, N - 41, h, &n));
  CHECK(n == N - 41);
  CHECK_OK(oi__dir_lookup(b, keys + 40, 5, h, &n));
  CHECK(n == 0);

  /* one round trip: a 64-block lookup across three masters */
  CHECK_OK(oi__dir_publish(a, keys + 40, 1));
  CHECK_OK(oi__dir_flush(a, 2000));
  uint64_t t0 = oi__now_ns();
  for (int i = 0; i < 200; i++) {
    CHECK_OK(oi__dir_lookup(b, keys, N, h, &n));
    CHECK(n == N);
  }
  fprintf(stderr, "  64-block lookup over 3 masters: %.1f us mean\n", ms_since(t0) * 1000 / 200);

  oi_dir_stats st;
  oi__dir_stats(a, &st);
  CHECK(st.connected && st.published == N && st.errors == 0 && st.redirects == 0);
  oi__dir_stats(b, &st);
  CHECK(st.lookups == 203 && st.errors == 0 && st.redirects == 0);
  oi__dir_close(a);
  oi__dir_close(b);
}

static void test_cas(void) {
  oi_dir *a = open_node("a", 1, NULL), *b = open_node("b", 2, NULL);
  /* one key per master */
  oi_tier_key k[MASTERS];
  bool have[MASTERS] = {false};
  for (uint32_t i = 0, got = 0; got < MASTERS; i++) {
    oi_tier_key c = key_of(200, i);
    int m = g_owner[slot_of(&c)];
    if (!have[m]) {
      have[m] = true;
      k[m] = c;
      got++;
    }
  }
  CHECK_OK(oi__dir_publish(a, k, MASTERS));
  CHECK_OK(oi__dir_flush(a, 2000));
  CHECK_OK(oi__dir_publish(b, k, MASTERS)); /* b now holds them: the entries name b */
  CHECK_OK(oi__dir_flush(b, 2000));
  CHECK_OK(oi__dir_unpublish(a, k, MASTERS)); /* a's eviction must not remove b's entries */
  CHECK_OK(oi__dir_flush(a, 2000));
  oi_dir_holder h[MASTERS];
  size_t n = 0;
  CHECK_OK(oi__dir_lookup(a, k, MASTERS, h, &n));
  CHECK(n == MASTERS);
  for (size_t i = 0; i < n; i++)
    CHECK(strcmp(h[i].node_id, "b") == 0 && h[i].epoch == 2);
  oi_dir_stats sa;
  oi__dir_stats(a, &sa);
  CHECK(sa.unpublish_missed == MASTERS && sa.unpublished == 0);

  /* every master's script cache flushed: EVALSHA falls back to EVAL */
  for (int m = 0; m < MASTERS; m++)
    freeReplyObject(cmd(m, "SCRIPT FLUSH"));
  CHECK_OK(oi__dir_unpublish(b, k, MASTERS));
  CHECK_OK(oi__dir_flush(b, 2000));
  CHECK_OK(oi__dir_lookup(a, k, MASTERS, h, &n));
  CHECK(n == 0);
  oi_dir_stats sb;
  oi__dir_stats(b, &sb);
  CHECK(sb.unpublished == MASTERS && sb.errors == 0);

  /* stale removal on each master */
  CHECK_OK(oi__dir_publish(a, k, MASTERS));
  CHECK_OK(oi__dir_flush(a, 2000));
  CHECK_OK(oi__dir_lookup(b, k, MASTERS, h, &n));
  CHECK(n == MASTERS);
  for (int m = 0; m < MASTERS; m++) {
    oi_dir_holder older = h[m]; /* the record read, of an earlier incarnation */
    older.epoch = 0;
    CHECK_ST(oi__dir_remove_stale(b, &k[m], &older), OI_ERR_NOT_FOUND);
    CHECK_OK(oi__dir_remove_stale(b, &k[m], &h[m]));
  }
  CHECK_OK(oi__dir_lookup(b, k, 1, h, &n));
  CHECK(n == 0);

  /* liveness */
  char addr[OI_DIR_ADDR_MAX + 1];
  uint64_t epoch = 0;
  CHECK_OK(oi__dir_set_advertise(a, "10.0.0.1:4000"));
  oi_status st = OI_ERR_NOT_FOUND;
  for (int i = 0; i < 100 && st != OI_OK; i++) {
    st = oi__dir_node_lookup(b, "a", addr, sizeof addr, &epoch);
    if (st != OI_OK) sleep_ms(10);
  }
  CHECK_OK(st);
  CHECK(strcmp(addr, "10.0.0.1:4000") == 0 && epoch == 1);
  oi__dir_close(a); /* a clean leave deletes the liveness key */
  CHECK_ST(oi__dir_node_lookup(b, "a", addr, sizeof addr, &epoch), OI_ERR_NOT_FOUND);
  oi__dir_close(b);
}

static void test_garbage(void) {
  oi_dir *a = open_node("g", 3, NULL);
  oi_tier_key keys[3];
  for (uint32_t i = 0; i < 3; i++)
    keys[i] = key_of(550, i);
  CHECK_OK(oi__dir_publish(a, keys, 3));
  CHECK_OK(oi__dir_flush(a, 2000));
  char s[OI_DIR_KEY_MAX + 1];
  oi__dir_key_format(NULL, &keys[1], s);
  int m = g_owner[slot_of(&keys[1])];
  freeReplyObject(cmd(m, "SET %s %s", s, "not a holder value"));
  oi_dir_holder h[3];
  size_t n = 0;
  CHECK_OK(oi__dir_lookup(a, keys, 3, h, &n));
  CHECK(n == 1);
  freeReplyObject(cmd(m, "DEL %s", s));
  freeReplyObject(cmd(m, "RPUSH %s x", s)); /* a key of another type: absent */
  CHECK_OK(oi__dir_lookup(a, keys, 3, h, &n));
  CHECK(n == 1);
  oi_dir_stats st;
  oi__dir_stats(a, &st);
  CHECK(st.parse_failures == 1 && st.errors == 0);
  freeReplyObject(cmd(m, "DEL %s", s));
  oi__dir_close(a);
}

/* Keys of the directory's form in one slot. */
static void keys_in_slot(uint16_t slot, oi_tier_key *out, size_t n) {
  size_t got = 0;
  for (uint32_t i = 0; got < n; i++) {
    oi_tier_key k = key_of(500, i);
    if (slot_of(&k) == slot) out[got++] = k;
  }
}

static void migrate_key(int from, int to, const oi_tier_key *k) {
  char s[OI_DIR_KEY_MAX + 1], port[16];
  oi__dir_key_format(NULL, k, s);
  snprintf(port, sizeof port, "%d", g_port[to]);
  redisReply *r = cmd(from, "MIGRATE 127.0.0.1 %s %s 0 2000", port, s);
  if (r->type == REDIS_REPLY_ERROR) fprintf(stderr, "MIGRATE: %s\n", r->str);
  CHECK(r->type == REDIS_REPLY_STATUS);
  freeReplyObject(r);
}

static void test_migration(void) {
  oi_dir *a = open_node("mig-a", 3, NULL), *b = open_node("mig-b", 1, NULL);
  const uint16_t slot = 777; /* on master 0 */
  const int from = 0, to = 2;
  REQUIRE(g_owner[slot] == from);
  enum { K = 5 };
  oi_tier_key k[K];
  keys_in_slot(slot, k, K);
  CHECK_OK(oi__dir_publish(a, k, 3)); /* k[3], k[4] come later */
  CHECK_OK(oi__dir_flush(a, 2000));
  oi_dir_holder h[K];
  size_t n = 0;
  CHECK_OK(oi__dir_lookup(b, k, K, h, &n)); /* b's connections and map are ready */
  CHECK(n == 3);

  /* the slot starts moving: k[0] is on the target, k[1], k[2] still here */
  char sl[16];
  snprintf(sl, sizeof sl, "%u", slot);
  cmd_ok(to, "CLUSTER SETSLOT %s IMPORTING %s", sl, g_id[from]);
  cmd_ok(from, "CLUSTER SETSLOT %s MIGRATING %s", sl, g_id[to]);
  migrate_key(from, to, &k[0]);
  CHECK_OK(oi__dir_lookup(b, k, 3, h, &n)); /* k[0] through ASK */
  CHECK(n == 3);
  for (size_t i = 0; i < n; i++)
    CHECK(strcmp(h[i].node_id, "mig-a") == 0 && h[i].epoch == 3);
  oi_dir_stats st;
  oi__dir_stats(b, &st);
  CHECK(st.redirects >= 1 && st.errors == 0);
  /* a new entry in the moving slot goes to the target (ASK), so does an
   * unpublish of a moved one */
  CHECK_OK(oi__dir_publish(a, &k[3], 1));
  CHECK_OK(oi__dir_unpublish(a, &k[0], 1));
  CHECK_OK(oi__dir_flush(a, 2000));
  char v[128];
  raw_get_asking(to, &k[3], v, sizeof v);
  CHECK(strncmp(v, "mig-a 3 ", 8) == 0);
  raw_get(from, &k[3], v, sizeof v);
  CHECK(strcmp(v, "") == 0);
  raw_get_asking(to, &k[0], v, sizeof v);
  CHECK(strcmp(v, "") == 0);
  CHECK_OK(oi__dir_publish(a, &k[0], 1));
  CHECK_OK(oi__dir_flush(a, 2000));
  CHECK_OK(oi__dir_lookup(b, k, K, h, &n));
  CHECK(n == 4);

  /* the move completes: the rest migrated, the slot assigned to the target
   * everywhere; the old owner answers MOVED */
  migrate_key(from, to, &k[1]);
  migrate_key(from, to, &k[2]);
  for (int m = 0; m < MASTERS; m++)
    cmd_ok(m, "CLUSTER SETSLOT %s NODE %s", sl, g_id[to]);
  g_owner[slot] = to;
  uint64_t before = st.redirects;
  CHECK_OK(oi__dir_lookup(b, k, K, h, &n));
  CHECK(n == 4);
  for (size_t i = 0; i < n; i++)
    CHECK(strcmp(h[i].node_id, "mig-a") == 0 && h[i].epoch == 3);
  oi__dir_stats(b, &st);
  CHECK(st.redirects > before && st.errors == 0);
  before = st.redirects;
  CHECK_OK(oi__dir_lookup(b, k, K, h, &n)); /* the map was reloaded: no redirection now */
  CHECK(n == 4);
  oi__dir_stats(b, &st);
  CHECK(st.redirects == before);
  CHECK_OK(oi__dir_publish(a, &k[4], 1)); /* a's writer follows MOVED too */
  CHECK_OK(oi__dir_flush(a, 2000));
  CHECK_OK(oi__dir_lookup(b, k, K, h, &n));
  CHECK(n == K);
  oi_dir_stats sa;
  oi__dir_stats(a, &sa);
  CHECK(sa.redirects >= 2 && sa.errors == 0 && sa.queue_dropped == 0);
  oi__dir_close(a);
  oi__dir_close(b);
}

static void test_seed_fallback(void) {
  char url[128];
  snprintf(url, sizeof url, "redis+cluster://127.0.0.1:%d,127.0.0.1:%d", free_port(), g_port[1]);
  oi_dir *d = open_node("seeds", 1, url);
  oi_dir_stats st;
  oi__dir_stats(d, &st);
  CHECK(st.connected && st.generation == 1);
  oi_tier_key k = key_of(600, 1);
  CHECK_OK(oi__dir_publish(d, &k, 1));
  CHECK_OK(oi__dir_flush(d, 2000));
  oi_dir_holder h;
  size_t n = 0;
  CHECK_OK(oi__dir_lookup(d, &k, 1, &h, &n));
  CHECK(n == 1);
  oi__dir_close(d);

  /* a plain url naming one master of the cluster: refused with a hint */
  snprintf(url, sizeof url, "redis://127.0.0.1:%d", g_port[0]);
  d = open_node("plain", 1, url);
  oi_tier_key keys[16];
  for (uint32_t i = 0; i < 16; i++)
    keys[i] = key_of(601, i);
  CHECK_ST(oi__dir_lookup(d, keys, 16, &h, &n), OI_ERR_PROTOCOL);
  CHECK(strstr(oi_last_error(), "redis+cluster://") != NULL);
  oi__dir_close(d);
}

/* A master that stops answering (SIGSTOP): no hang past the timeout. */
static void test_master_stopped(void) {
  oi_dir *a = open_node("stop-a", 4, NULL);
  enum { N = 64 };
  oi_tier_key keys[N];
  for (uint32_t i = 0; i < N; i++)
    keys[i] = key_of(650, i);
  CHECK_OK(oi__dir_publish(a, keys, N));
  CHECK_OK(oi__dir_flush(a, 2000));
  oi_dir_holder h[N];
  size_t n = 0;
  CHECK_OK(oi__dir_lookup(a, keys, N, h, &n));
  CHECK(n == N);

  const int victim = 2;
  kill(g_pid[victim], SIGSTOP); /* well under the node timeout: no failover state */
  uint64_t t0 = oi__now_ns();
  CHECK_ST(oi__dir_lookup(a, keys, N, h, &n), OI_ERR_CLOSED);
  double first = ms_since(t0);
  CHECK(first < 300 + 500); /* timeout_ms, and slack for a loaded machine */
  t0 = oi__now_ns();
  CHECK_ST(oi__dir_lookup(a, keys, N, h, &n), OI_ERR_CLOSED);
  double second = ms_since(t0);
  CHECK(second < 50);
  fprintf(stderr, "  master stopped: first lookup %.1f ms, the next %.2f ms\n", first, second);
  kill(g_pid[victim], SIGCONT);
  wait_state_ok();
  oi_status st = OI_ERR_CLOSED;
  t0 = oi__now_ns();
  while (st != OI_OK && ms_since(t0) < 10000) {
    st = oi__dir_lookup(a, keys, N, h, &n);
    if (st != OI_OK) sleep_ms(20);
  }
  CHECK_OK(st);
  CHECK(n == N); /* nothing was lost: the master only paused */
  oi__dir_close(a);
}

static void test_master_killed(void) {
  oi_dir *a = open_node("kill-a", 9, NULL), *b = open_node("kill-b", 1, NULL);
  enum { N = 64 };
  oi_tier_key keys[N];
  for (uint32_t i = 0; i < N; i++)
    keys[i] = key_of(700, i);
  CHECK_OK(oi__dir_publish(a, keys, N));
  CHECK_OK(oi__dir_flush(a, 2000));
  oi_dir_holder h[N];
  size_t n = 0;
  CHECK_OK(oi__dir_lookup(b, keys, N, h, &n));
  CHECK(n == N);
  uint64_t gen = oi__dir_generation(b);

  const int victim = 1;
  redis_stop(g_pid[victim]);
  g_pid[victim] = 0;
  /* the first lookup finds the master gone, within the timeout; the next
   * ones fail at once (degraded, local only) */
  uint64_t t0 = oi__now_ns();
  CHECK_ST(oi__dir_lookup(b, keys, N, h, &n), OI_ERR_CLOSED);
  double first = ms_since(t0);
  CHECK(n == 0 && first < 1000);
  t0 = oi__now_ns();
  oi_status st = OI_OK;
  for (int i = 0; i < 100; i++)
    st = oi__dir_lookup(b, keys, N, h, &n);
  CHECK_ST(st, OI_ERR_CLOSED);
  double rest = ms_since(t0);
  CHECK(rest < 500);
  fprintf(stderr, "  master killed: first lookup %.1f ms, 100 more %.1f ms\n", first, rest);
  /* publishes keep being queued; the writer degrades too */
  CHECK_OK(oi__dir_publish(a, keys, N));
  oi_dir_stats sb;
  for (int i = 0; i < 300; i++) {
    oi__dir_stats(a, &sb);
    if (!sb.connected) break;
    sleep_ms(10);
  }
  CHECK(!sb.connected);
  oi__dir_stats(b, &sb);
  CHECK(!sb.connected && sb.errors >= 1);

  /* the other masters mark it failed: cluster_state:fail, every command
   * answered CLUSTERDOWN; a directory opened now opens degraded */
  t0 = oi__now_ns();
  while (state_ok(0) && ms_since(t0) < 15000)
    sleep_ms(50);
  CHECK(!state_ok(0));
  {
    redisReply *r = cmd(0, "GET %s", "x");
    CHECK(r->type == REDIS_REPLY_ERROR && strncmp(r->str, "CLUSTERDOWN", 11) == 0);
    freeReplyObject(r);
    char url[64];
    snprintf(url, sizeof url, "redis+cluster://127.0.0.1:%d", g_port[0]);
    oi_dir *c = open_node("late", 1, url);
    oi_dir_stats sc;
    oi__dir_stats(c, &sc);
    CHECK(!sc.connected && sc.generation == 0 && strstr(sc.last_error, "not ok"));
    t0 = oi__now_ns();
    CHECK_ST(oi__dir_lookup(c, keys, N, h, &n), OI_ERR_CLOSED);
    CHECK(ms_since(t0) < 50);
    oi__dir_close(c);
  }

  /* restarted empty with its cluster config: the cluster heals, both nodes
   * reconnect (new generation), a republishes, lookups answer again */
  g_pid[victim] = cluster_start(victim);
  wait_state_ok();
  t0 = oi__now_ns();
  while ((oi__dir_generation(a) == gen || oi__dir_generation(b) == gen) && ms_since(t0) < 10000)
    sleep_ms(20);
  CHECK(oi__dir_generation(b) > gen && oi__dir_generation(a) > 1);
  /* republished (as the tier does at each new generation) until b finds
   * every holder: the masters may take a moment to agree the cluster is ok */
  st = OI_ERR_CLOSED;
  n = 0;
  t0 = oi__now_ns();
  while ((st != OI_OK || n != N) && ms_since(t0) < 15000) {
    CHECK_OK(oi__dir_publish(a, keys, N));
    if (oi__dir_flush(a, 2000) == OI_OK) st = oi__dir_lookup(b, keys, N, h, &n);
    if (st != OI_OK || n != N) sleep_ms(50);
  }
  CHECK_OK(st);
  CHECK(n == N);
  for (size_t i = 0; i < n; i++)
    CHECK(strcmp(h[i].node_id, "kill-a") == 0 && h[i].epoch == 9);
  fprintf(stderr, "  recovered %.0f ms after cluster_state:ok\n", ms_since(t0));
  oi__dir_close(a);
  oi__dir_close(b);
}

int main(void) {
  signal(SIGPIPE, SIG_DFL); /* the directory must never let one through */
  RUN_TEST(test_slots);
  RUN_TEST(test_bad_urls);
  if (!on_path("redis-server")) TEST_SKIP("redis-server is not on PATH");
  cluster_create();
  RUN_TEST(test_slots_server);
  RUN_TEST(test_round_trip);
  RUN_TEST(test_cas);
  RUN_TEST(test_garbage);
  RUN_TEST(test_migration);
  RUN_TEST(test_seed_fallback);
  RUN_TEST(test_master_stopped);
  RUN_TEST(test_master_killed);
  cluster_destroy();
  TEST_EXIT();
}
