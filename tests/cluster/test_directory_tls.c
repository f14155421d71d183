/* The block directory over TLS (rediss://) to a real redis-server with a
 * TLS port (certificates made here with the openssl command):
 *  - publish, look up and node records through TLS, with a client
 *    certificate (Redis asks for one) and with AUTH on top; the entries are
 *    in Redis, read back through its plain port;
 *  - every pump thread ends with its connection: none left after close;
 *  - Redis killed and started again: the directory degrades, reconnects
 *    over TLS and publishes again;
 *  - refused at open, naming the cause: a CA that did not sign Redis's
 *    certificate, a host name the certificate does not name, rediss:// to
 *    a plain port, a wrong password over TLS;
 *  - no client certificate where Redis asks for one: never connected,
 *    nothing written;
 *  - 1024 publishes and a lookup of 1024 keys through one connection; the
 *    TLS settings refused at each step (a directory, a missing file, a key
 *    as certificate, a key of another certificate); a closed port and a
 *    name that resolves to nothing fail before TLS, with the reason;
 *  - the options, through the public oi_host_cluster_options_check: TLS
 *    files with a redis:// url, a certificate without its key, a key others
 *    can read, a missing CA, a CA file with no certificate in it.
 * Skips (77) without redis-server, a redis-server without TLS, or openssl. */
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <sys/stat.h>

#include "cluster/directory.h"
#include "cluster/redis_tls.h"
#include "cluster_util.h"
#include "openinfer/experimental.h"

#define SECRET "the good cluster's secret"
#define PASSWORD "a-redis-password"

static char g_certs[64];
static int g_port, g_tls_port;
static pid_t g_redis;

static char *path_of(const char *name) {
  static char p[4][160];
  static int k;
  char *out = p[k++ % 4];
  snprintf(out, sizeof p[0], "%s/%s", g_certs, name);
  return out;
}

static oi_tier_key key_of(uint32_t i) {
  oi_tier_key k = {.ns_fp = 0x7171717171717171ull, .layout_fp = 0x0a0b0c0d0e0f1011ull};
  memcpy(k.hash, &i, sizeof i);
  return k;
}

typedef struct tls_args {
  const char *host; /* default 127.0.0.1 */
  int port;         /* default the TLS port */
  const char *ca, *cert, *key, *password;
  bool plain_scheme;
} tls_args;

static oi_status try_open(tls_args a, oi_dir **out) {
  char url[128];
  snprintf(url, sizeof url, "%s://%s:%d", a.plain_scheme ? "redis" : "rediss",
           a.host ? a.host : "127.0.0.1", a.port ? a.port : g_tls_port);
  oi_dir_options o;
  oi__dir_options_init(&o);
  o.url = url;
  o.node_id = "tls-node";
  o.epoch = 7;
  o.secret = SECRET;
  o.secret_len = strlen(SECRET);
  o.password = a.password;
  o.tls_ca_file = a.ca;
  o.tls_cert_file = a.cert;
  o.tls_key_file = a.key;
  o.timeout_ms = 1000;
  *out = NULL;
  return oi__dir_open(&o, out);
}

static void wait_no_pumps(void) {
  for (int i = 0; i < 200 && oi__redis_tls_pumps(); i++)
    sleep_ms(10);
  CHECK(oi__redis_tls_pumps() == 0);
}

/* n keys published through d arrive in Redis: looked up through d, and
 * present through the plain port (as the reader of another node sees). */
static void round_trip(oi_dir *d, uint32_t first, size_t n, const char *password) {
  oi_tier_key k[16];
  REQUIRE(n <= 16);
  for (uint32_t i = 0; i < n; i++)
    k[i] = key_of(first + i);
  CHECK_OK(oi__dir_publish(d, k, n));
  CHECK_OK(oi__dir_flush(d, 3000));
  oi_dir_holder h[16];
  size_t got = 0;
  CHECK_OK(oi__dir_lookup(d, k, n, h, &got));
  CHECK(got == n);
  for (size_t i = 0; i < got; i++)
    CHECK(strcmp(h[i].node_id, "tls-node") == 0 && h[i].epoch == 7);
  redisContext *c = raw(g_port);
  REQUIRE(c);
  if (password) {
    redisReply *a = redisCommand(c, "AUTH %s", password);
    CHECK(a && a->type == REDIS_REPLY_STATUS);
    if (a) freeReplyObject(a);
  }
  redisReply *r = redisCommand(c, "KEYS oi:b:*");
  CHECK(r && r->type == REDIS_REPLY_ARRAY && r->elements >= n);
  if (r) freeReplyObject(r);
  redisFree(c);
}

static void redis_up(const char *password, bool auth_clients) {
  g_port = free_port();
  g_tls_port = free_port();
  g_redis = redis_start_ex(g_port, password, redis_tls_args(g_certs, g_tls_port, auth_clients));
}

static void redis_down(void) {
  redis_stop(g_redis);
  g_redis = 0;
}

/* ---- tests ---- */

static void test_round_trip_with_client_certificate(void) {
  redis_up(NULL, true);
  oi_dir *d = NULL;
  oi_status st = try_open((tls_args){.ca = path_of("ca.crt"),
                                     .cert = path_of("client.crt"),
                                     .key = path_of("client.key")},
                          &d);
  if (st != OI_OK) fprintf(stderr, "open: %s\n", oi_last_error());
  REQUIRE(st == OI_OK && d);
  oi_dir_stats s;
  oi__dir_stats(d, &s);
  CHECK(s.connected);
  CHECK(oi__redis_tls_pumps() >= 1);
  round_trip(d, 0, 16, NULL);
  CHECK_OK(oi__dir_set_advertise(d, "127.0.0.1:7470"));
  CHECK_OK(oi__dir_flush(d, 3000));
  char addr[64] = "";
  oi_status nst = OI_ERR_NOT_FOUND;
  for (int i = 0; i < 200 && nst == OI_ERR_NOT_FOUND; i++) {
    nst = oi__dir_node_lookup(d, "tls-node", addr, sizeof addr, NULL);
    if (nst == OI_ERR_NOT_FOUND) sleep_ms(10);
  }
  CHECK(nst == OI_OK && strcmp(addr, "127.0.0.1:7470") == 0);

  /* Redis killed: degraded; started again on the same ports: back over TLS */
  redis_stop(g_redis);
  oi_tier_key k = key_of(500);
  size_t got = 9;
  oi_dir_holder h;
  bool down = false;
  for (int i = 0; i < 300 && !down; i++) {
    down = oi__dir_lookup(d, &k, 1, &h, &got) == OI_ERR_CLOSED;
    if (!down) sleep_ms(10);
  }
  CHECK(down);
  g_redis = redis_start_ex(g_port, NULL, redis_tls_args(g_certs, g_tls_port, true));
  bool back = false;
  for (int i = 0; i < 1000 && !back; i++) {
    oi__dir_stats(d, &s);
    back = s.connected;
    if (!back) sleep_ms(10);
  }
  CHECK(back);
  round_trip(d, 100, 8, NULL);
  oi__dir_close(d);
  wait_no_pumps();
  redis_down();
}

static void test_auth_over_tls(void) {
  redis_up(PASSWORD, false);
  oi_dir *d = NULL;
  CHECK_OK(try_open((tls_args){.ca = path_of("ca.crt"), .password = PASSWORD}, &d));
  if (d) round_trip(d, 200, 4, PASSWORD);
  oi__dir_close(d);
  d = NULL;
  CHECK(try_open((tls_args){.ca = path_of("ca.crt"), .password = "not-the-password"}, &d) ==
        OI_ERR_PERMISSION);
  CHECK(!d && strstr(oi_last_error(), "AUTH"));
  fprintf(stderr, "  wrong password over TLS: %s\n", oi_last_error());
  wait_no_pumps();
  redis_down();
}

static void test_refused_at_open(void) {
  redis_up(NULL, false);
  oi_dir *d = NULL;
  /* a CA that did not sign Redis's certificate */
  CHECK(try_open((tls_args){.ca = path_of("other-ca.crt")}, &d) == OI_ERR_PERMISSION && !d);
  CHECK(strstr(oi_last_error(), "certificate is refused"));
  fprintf(stderr, "  another CA: %s\n", oi_last_error());
  /* a name the certificate does not carry (it names 127.0.0.1 by IP) */
  CHECK(try_open((tls_args){.host = "localhost", .ca = path_of("ca.crt")}, &d) ==
            OI_ERR_PERMISSION &&
        !d);
  CHECK(strstr(oi_last_error(), "certificate is refused"));
  fprintf(stderr, "  another name: %s\n", oi_last_error());
  /* rediss:// to the plain port: Redis waits for the end of a command
   * line that never comes, so the handshake times out (1 s here): a
   * directory that never connects (or a refusal), within the timeout */
  uint64_t t0 = oi__now_ns();
  oi_status st = try_open((tls_args){.port = g_port, .ca = path_of("ca.crt")}, &d);
  double ms = ms_since(t0);
  CHECK(ms < 2500);
  if (st == OI_OK) {
    oi_dir_stats s;
    oi__dir_stats(d, &s);
    CHECK(!s.connected && strstr(s.last_error, "TLS"));
    fprintf(stderr, "  TLS to the plain port: degraded, %s (%.0f ms)\n", s.last_error, ms);
    oi__dir_close(d);
  } else {
    CHECK(st == OI_ERR_PERMISSION && !d);
    fprintf(stderr, "  TLS to the plain port: %s (%.0f ms)\n", oi_last_error(), ms);
  }
  wait_no_pumps();
  redis_down();
}

static void test_no_client_certificate(void) {
  redis_up(NULL, true);
  oi_dir *d = NULL;
  oi_status st = try_open((tls_args){.ca = path_of("ca.crt")}, &d);
  /* TLS 1.3: the server refuses after the client's side of the handshake
   * ended, so the refusal may arrive as a lost connection: a refusal at
   * open, or a directory that never connects; never an entry written */
  if (st == OI_OK) {
    oi_dir_stats s;
    oi__dir_stats(d, &s);
    CHECK(!s.connected);
    oi_tier_key k = key_of(300);
    oi__dir_publish(d, &k, 1);
    oi__dir_flush(d, 300);
    oi__dir_close(d);
  } else {
    CHECK(st == OI_ERR_PERMISSION);
  }
  fprintf(stderr, "  no client certificate: %s\n", st == OI_OK ? "degraded" : oi_last_error());
  redisContext *c = raw(g_port);
  REQUIRE(c);
  redisReply *r = redisCommand(c, "DBSIZE");
  CHECK(r && r->type == REDIS_REPLY_INTEGER && r->integer == 0);
  if (r) freeReplyObject(r);
  redisFree(c);
  wait_no_pumps();
  redis_down();
}

/* Much through one TLS connection at once: a batch of 1024 publishes and
 * a lookup of 1024 keys (a reply of about 150 KB through the pump's 16 KB
 * buffers); then the TLS settings and connects refused at each step. */
#define BIG 1024u
static void test_tls_edges(void) {
  redis_up(NULL, false);
  oi_dir *d = NULL;
  CHECK_OK(try_open((tls_args){.ca = path_of("ca.crt")}, &d));
  REQUIRE(d);
  static oi_tier_key k[BIG];
  static oi_dir_holder h[BIG];
  for (uint32_t i = 0; i < BIG; i++)
    k[i] = key_of(10000 + i);
  CHECK_OK(oi__dir_publish(d, k, BIG));
  CHECK_OK(oi__dir_flush(d, 10000));
  size_t got = 0;
  CHECK_OK(oi__dir_lookup(d, k, BIG, h, &got));
  CHECK(got == BIG);
  CHECK(strcmp(h[BIG - 1].node_id, "tls-node") == 0);
  oi__dir_close(d);

  oi_redis_tls *t = (oi_redis_tls *)1;
  CHECK(oi__redis_tls_create(NULL, NULL, NULL, NULL) == OI_ERR_INVALID_ARGUMENT);
  CHECK(oi__redis_tls_create(g_certs, NULL, NULL, &t) == OI_ERR_INVALID_ARGUMENT && !t);
  CHECK(strstr(oi_last_error(), "not a regular file"));
  CHECK(oi__redis_tls_create(NULL, path_of("nothing.crt"), path_of("client.key"), &t) ==
        OI_ERR_NOT_FOUND);
  CHECK(oi__redis_tls_create(NULL, path_of("ca.key"), path_of("client.key"), &t) ==
        OI_ERR_INVALID_ARGUMENT);
  CHECK(strstr(oi_last_error(), "no usable certificate"));
  CHECK(oi__redis_tls_create(NULL, path_of("client.crt"), path_of("server.key"), &t) ==
        OI_ERR_INVALID_ARGUMENT);
  CHECK(strstr(oi_last_error(), "not usable or not the certificate's"));
  oi__redis_tls_destroy(NULL);
  /* connects that fail before TLS: a closed port, a name that resolves to
   * nothing; quickly, with the reason */
  CHECK_OK(oi__redis_tls_create(path_of("ca.crt"), NULL, NULL, &t));
  bool refused = true;
  char err[256];
  int closed = free_port();
  uint64_t t0 = oi__now_ns();
  CHECK(!oi__redis_tls_connect(t, "127.0.0.1", closed, 1000, &refused, err, sizeof err));
  CHECK(!refused && strstr(err, "connect") && ms_since(t0) < 900);
  fprintf(stderr, "  a closed port: %s\n", err);
  CHECK(!oi__redis_tls_connect(t, "no-such-host.invalid", 6379, 1000, &refused, err, sizeof err));
  CHECK(!refused && strstr(err, "no-such-host.invalid"));
  fprintf(stderr, "  no such host: %s\n", err);
  redisContext *c =
      oi__redis_tls_connect(t, "127.0.0.1", g_tls_port, 1000, &refused, err, sizeof err);
  CHECK(c && !refused);
  if (c) {
    redisReply *r = redisCommand(c, "PING");
    CHECK(r && r->type == REDIS_REPLY_STATUS && strcmp(r->str, "PONG") == 0);
    if (r) freeReplyObject(r);
    redisFree(c);
  }
  oi__redis_tls_destroy(t);
  wait_no_pumps();
  redis_down();
}

static oi_status check_cluster(const char *url, const char *ca, const char *cert, const char *key,
                               const char *secret) {
  oi_host_cluster_options o;
  oi_host_cluster_options_init(&o);
  o.redis_url = url;
  o.node_id = "n1";
  o.listen_addr = "127.0.0.1:0";
  o.secret_file = secret;
  o.redis_tls_ca_file = ca;
  o.redis_tls_cert_file = cert;
  o.redis_tls_key_file = key;
  return oi_host_cluster_options_check(&o);
}

static void test_options(void) {
  char secret[160], loose[160], empty[160];
  snprintf(secret, sizeof secret, "%s/secret", g_certs);
  snprintf(loose, sizeof loose, "%s/loose.key", g_certs);
  snprintf(empty, sizeof empty, "%s/empty.crt", g_certs);
  int fd = open(secret, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  REQUIRE(fd >= 0 && write(fd, "a-cluster-secret-of-32-bytes-000", 32) == 32);
  close(fd);
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "cp '%s' '%s' && chmod 644 '%s' && echo nothing > '%s'",
           path_of("client.key"), loose, loose, empty);
  REQUIRE(system(cmd) == 0);
  const char *ca = path_of("ca.crt"), *cert = path_of("client.crt"), *key = path_of("client.key");
  CHECK_OK(check_cluster("rediss://10.0.0.1:6379", ca, cert, key, secret));
  CHECK_OK(check_cluster("rediss+cluster://10.0.0.1:6379,10.0.0.2", ca, NULL, NULL, secret));
  CHECK(check_cluster("redis://10.0.0.1:6379", ca, NULL, NULL, secret) == OI_ERR_INVALID_ARGUMENT);
  CHECK(strstr(oi_last_error(), "rediss://"));
  CHECK(check_cluster("rediss://10.0.0.1", ca, cert, NULL, secret) == OI_ERR_INVALID_ARGUMENT);
  CHECK(strstr(oi_last_error(), "both"));
  CHECK(check_cluster("rediss://10.0.0.1", ca, cert, loose, secret) == OI_ERR_PERMISSION);
  CHECK(strstr(oi_last_error(), "chmod 600"));
  CHECK(check_cluster("rediss://10.0.0.1", "/nonexistent/ca.crt", NULL, NULL, secret) ==
        OI_ERR_NOT_FOUND);
  CHECK(check_cluster("rediss://10.0.0.1", empty, NULL, NULL, secret) == OI_ERR_INVALID_ARGUMENT);
  CHECK(strstr(oi_last_error(), empty));
  CHECK(check_cluster("rediss://10.0.0.1", cert, NULL, NULL, secret) == OI_OK); /* a cert: a CA */
  CHECK(check_cluster("rediss:/bad", ca, NULL, NULL, secret) == OI_ERR_INVALID_ARGUMENT);
  CHECK(check_cluster("rediss://", NULL, NULL, NULL, secret) == OI_ERR_INVALID_ARGUMENT);
  fprintf(stderr, "  %s\n", oi_last_error());
  CHECK(oi__redis_tls_pumps() == 0);
}

int main(void) {
  if (!on_path("redis-server")) TEST_SKIP("redis-server is not on PATH");
  if (!on_path("openssl")) TEST_SKIP("the openssl command is not on PATH");
  if (!redis_has_tls()) TEST_SKIP("this redis-server was built without TLS");
  signal(SIGPIPE, SIG_IGN);
  snprintf(g_certs, sizeof g_certs, "/tmp/oi-dir-tls-XXXXXX");
  REQUIRE(mkdtemp(g_certs));
  REQUIRE(tls_make_certs(g_certs, "127.0.0.1"));
  RUN_TEST(test_round_trip_with_client_certificate);
  RUN_TEST(test_auth_over_tls);
  RUN_TEST(test_refused_at_open);
  RUN_TEST(test_no_client_certificate);
  RUN_TEST(test_tls_edges);
  RUN_TEST(test_options);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_certs);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_certs);
  TEST_EXIT();
}
