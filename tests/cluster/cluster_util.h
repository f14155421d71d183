/* Shared by the cluster tier's tests: private redis-server processes on
 * free loopback ports. */
#ifndef OI_TEST_CLUSTER_UTIL_H
#define OI_TEST_CLUSTER_UTIL_H

#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cluster/sha256.h"
#include "core/core.h"
#include "rig.h"
#include "testutil.h"

static inline bool on_path(const char *prog) {
  const char *path = getenv("PATH");
  if (!path) return false;
  char buf[4096];
  for (const char *p = path; *p;) {
    size_t len = strcspn(p, ":");
    snprintf(buf, sizeof buf, "%.*s/%s", (int)len, p, prog);
    if (access(buf, X_OK) == 0) return true;
    p += len;
    if (*p == ':') p++;
  }
  return false;
}

static inline int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  REQUIRE(bind(fd, (struct sockaddr *)&a, sizeof a) == 0);
  socklen_t len = sizeof a;
  REQUIRE(getsockname(fd, (struct sockaddr *)&a, &len) == 0);
  close(fd);
  return ntohs(a.sin_port);
}

static inline void sleep_ms(unsigned ms) {
  struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

static inline double ms_since(uint64_t t0) { return (double)(oi__now_ns() - t0) / 1e6; }

static inline redisContext *raw(int port) {
  struct timeval tv = {1, 0};
  redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
  if (c && c->err) {
    redisFree(c);
    return NULL;
  }
  return c;
}

/* Starts redis-server on `port` (with `password`: --requirepass; and the
 * arguments in `extra`, NULL-ended, when not NULL) and waits until it
 * answers PING there. */
static inline pid_t redis_start_ex(int port, const char *password, const char *const *extra) {
  char p[16];
  snprintf(p, sizeof p, "%d", port);
  const char *argv[48] = {"redis-server", "--port", p,           "--save",      "",  "--appendonly",
                          "no",           "--bind", "127.0.0.1", "--daemonize", "no"};
  int n = 11;
  if (password) argv[n++] = "--requirepass", argv[n++] = password;
  for (int i = 0; extra && extra[i] && n < 47; i++)
    argv[n++] = extra[i];
  argv[n] = NULL;
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    freopen("/dev/null", "w", stdout);
    execvp("redis-server", (char *const *)argv);
    _exit(127);
  }
  for (int i = 0; i < 500; i++) {
    redisContext *c = raw(port);
    if (c) {
      bool ok = true;
      if (password) {
        redisReply *a = redisCommand(c, "AUTH %s", password);
        ok = a && a->type == REDIS_REPLY_STATUS;
        if (a) freeReplyObject(a);
      }
      redisReply *r = ok ? redisCommand(c, "PING") : NULL;
      ok = r && r->type == REDIS_REPLY_STATUS;
      if (r) freeReplyObject(r);
      redisFree(c);
      if (ok) return pid;
    }
    if (waitpid(pid, NULL, WNOHANG) == pid) {
      fprintf(stderr, "redis-server on port %d exited at start\n", port);
      exit(1);
    }
    sleep_ms(10);
  }
  fprintf(stderr, "redis-server on port %d did not answer PING within 5 s\n", port);
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  exit(1);
}

static inline pid_t redis_start_auth(int port, const char *password) {
  return redis_start_ex(port, password, NULL);
}

/* ---- TLS: certificates made with the openssl command ---- */

/* In dir: a CA (ca.crt, ca.key), a server certificate for IP `server_ip`
 * and 127.0.0.1 signed by it (server.crt, server.key), a client certificate
 * signed by it (client.crt, client.key), and a CA nobody used
 * (other-ca.crt). Keys mode 0600. false when the openssl command failed. */
static inline bool tls_make_certs(const char *dir, const char *server_ip) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd,
           "set -e; cd '%s'; umask 077; k='-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes';"
           "openssl req -x509 $k -keyout ca.key -out ca.crt -days 2 -subj '/CN=test ca';"
           "openssl req -x509 $k -keyout other-ca.key -out other-ca.crt -days 2 -subj '/CN=other';"
           "openssl req $k -keyout server.key -out server.csr -subj '/CN=redis';"
           "printf 'subjectAltName=IP:%s,IP:127.0.0.1\\n' > server.ext;"
           "openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial "
           "-out server.crt -days 2 -extfile server.ext;"
           "openssl req $k -keyout client.key -out client.csr -subj '/CN=node';"
           "openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial "
           "-out client.crt -days 2;"
           "chmod 644 ca.crt other-ca.crt server.crt client.crt",
           dir, server_ip);
  char full[2200];
  snprintf(full, sizeof full, "(%s) >/dev/null 2>&1", cmd);
  return system(full) == 0;
}

/* The redis-server arguments for a TLS port with dir's certificates;
 * auth_clients: Redis asks clients for a certificate. Static storage. */
static inline const char *const *redis_tls_args(const char *dir, int tls_port, bool auth_clients) {
  static char port[16], cert[300], key[300], ca[300];
  static const char *args[12];
  snprintf(port, sizeof port, "%d", tls_port);
  snprintf(cert, sizeof cert, "%s/server.crt", dir);
  snprintf(key, sizeof key, "%s/server.key", dir);
  snprintf(ca, sizeof ca, "%s/ca.crt", dir);
  const char *a[] = {"--tls-port",
                     port,
                     "--tls-cert-file",
                     cert,
                     "--tls-key-file",
                     key,
                     "--tls-ca-cert-file",
                     ca,
                     "--tls-auth-clients",
                     auth_clients ? "yes" : "no",
                     NULL};
  memcpy(args, a, sizeof a);
  return args;
}

/* Whether this redis-server speaks TLS (built with it: its binary knows
 * the option). */
static inline bool redis_has_tls(void) {
  return system("grep -q tls-cert-file \"$(command -v redis-server)\" 2>/dev/null") == 0;
}

static inline pid_t redis_start(int port) { return redis_start_auth(port, NULL); }

/* GET of a raw key on the redis-server at `port`; "" when absent. */
static inline void redis_get(int port, const char *key, char *out, size_t cap) {
  redisContext *c = raw(port);
  REQUIRE(c);
  redisReply *r = redisCommand(c, "GET %s", key);
  REQUIRE(r);
  snprintf(out, cap, "%s", r->type == REDIS_REPLY_STRING ? r->str : "");
  freeReplyObject(r);
  redisFree(c);
}

static inline void redis_stop(pid_t pid) {
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
}

/* ---- directory values as a node with `secret` writes them (docs/cluster.md,
 * "What the directory holds"), computed here independently of the library:
 * "<fields> <expiry_ms> <mac>", the MAC the first 16 bytes of HMAC-SHA256
 * over the tag and its NUL, the key's length (2 bytes, little-endian), the
 * key and "<fields> <expiry_ms>", in 32 lowercase hex digits. */
#define DIR_TAG_BLOCK "openinfer directory v1 block entry"
#define DIR_TAG_NODE "openinfer directory v1 node record"

static inline uint64_t wall_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static inline void dir_sign(const char *secret, const char *tag, const char *key,
                            const char *fields, uint64_t expiry_ms, char *out, size_t cap) {
  char body[1200];
  snprintf(body, sizeof body, "%s %llu", fields, (unsigned long long)expiry_ms);
  oi_hmac_sha256 h;
  oi__hmac_sha256_init(&h, secret, strlen(secret));
  oi__hmac_sha256_update(&h, tag, strlen(tag) + 1);
  uint8_t kl[2] = {(uint8_t)strlen(key), (uint8_t)(strlen(key) >> 8)};
  oi__hmac_sha256_update(&h, kl, 2);
  oi__hmac_sha256_update(&h, key, strlen(key));
  oi__hmac_sha256_update(&h, body, strlen(body));
  uint8_t mac[OI_SHA256_LEN];
  oi__hmac_sha256_final(&h, mac);
  int n = snprintf(out, cap, "%s ", body);
  for (int i = 0; i < 16; i++)
    n += snprintf(out + n, cap - (size_t)n, "%02x", mac[i]);
}

/* A block entry naming node/epoch, live for ttl_ms. */
static inline void dir_entry(const char *secret, const char *key, const char *node, uint64_t epoch,
                             uint64_t ttl_ms, char *out, size_t cap) {
  char fields[128];
  snprintf(fields, sizeof fields, "%s %llu", node, (unsigned long long)epoch);
  dir_sign(secret, DIR_TAG_BLOCK, key, fields, wall_ms() + ttl_ms, out, cap);
}

/* A node record (at node_key) of epoch at addr, live for ttl_ms. */
static inline void dir_node(const char *secret, const char *node_key, uint64_t epoch,
                            const char *addr, uint64_t ttl_ms, char *out, size_t cap) {
  char fields[1100];
  snprintf(fields, sizeof fields, "%llu %s", (unsigned long long)epoch, addr);
  dir_sign(secret, DIR_TAG_NODE, node_key, fields, wall_ms() + ttl_ms, out, cap);
}

#endif
