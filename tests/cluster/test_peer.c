/* The peer transport (lib/cluster/peer*.c) over UCX's TCP transport on
 * 127.0.0.1: UCX loaded at run time (nothing mapped before the first net,
 * a missing or incomplete libucp refused with its name and dlerror());
 * SHA-256 and HMAC-SHA256 test vectors; connect and mutual
 * authentication; calls, sends not waited for, and answers given later
 * (in another order, after the caller gave up, after its connection went); reads from a holder
 * process (fork) byte-exact, many in flight, out-of-region reads refused;
 * wrong secrets refused both ways; junk bytes to the listener; a holder
 * stopped or killed mid-read; a net destroyed with operations in flight. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cluster/peer.h"
#include "cluster/sha256.h"
#include "cluster/ucx.h"
#include "core/core.h"
#include "rig.h"
#include "testutil.h"

#define MiB (1024ull * 1024)

static const uint8_t SECRET[] = "cluster secret: thirty-two bytes";
static const uint8_t OTHER[] = "another secret, also long enough";

/* ---- helpers ---- */

static void hex(const uint8_t *b, size_t n, char *out) {
  for (size_t i = 0; i < n; i++)
    sprintf(out + 2 * i, "%02x", b[i]);
}

static uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

static void fill(uint8_t *p, uint64_t off, uint64_t len) {
  for (uint64_t i = 0; i < len; i++)
    p[i] = (uint8_t)(mix((off + i) >> 3) >> (8 * ((off + i) & 7)));
}

static uint64_t first_bad(const uint8_t *p, uint64_t off, uint64_t len) {
  for (uint64_t i = 0; i < len; i++)
    if (p[i] != (uint8_t)(mix((off + i) >> 3) >> (8 * ((off + i) & 7)))) return i;
  return UINT64_MAX;
}

static void echo(void *ctx, const char *peer_id, const void *req, size_t len, oi_peer_reply *r) {
  OI_UNUSED(ctx);
  OI_UNUSED(peer_id);
  if (len >= 4 && memcmp(req, "FAIL", 4) == 0) {
    oi__peer_reply_status(r, OI_ERR_NOT_FOUND);
    return;
  }
  oi__peer_reply_set(r, req, len);
}

static int g_reads = OI_PEER_READS_AUTO;

static oi_peer_net *make_net(const char *id, const uint8_t *secret, uint32_t timeout_ms) {
  oi_peer_net_options o = {.reads = g_reads,
                           .listen_addr = "127.0.0.1:0",
                           .node_id = id,
                           .secret = secret,
                           .secret_len = 32,
                           .timeout_ms = timeout_ms,
                           .on_request = echo};
  oi_peer_net *n = NULL;
  oi_status st = oi__peer_net_create(&o, &n);
  if (st) fprintf(stderr, "net %s: %s\n", id, oi_last_error());
  REQUIRE(st == OI_OK);
  REQUIRE(oi__peer_net_port(n) != 0);
  return n;
}

static void addr_of(oi_peer_net *n, char *buf) {
  sprintf(buf, "127.0.0.1:%u", oi__peer_net_port(n));
}

/* A holder process: a net named `id` with a region of `len` bytes filled
 * with the pattern; returns its pid and writes its address. */
static pid_t spawn_holder(const char *id, uint64_t len, char *addr) {
  int fds[2];
  pid_t pid = tr_fork_pipe(fds);
  if (pid == 0) {
    uint8_t *region = oi__aligned_alloc(4096, len);
    if (!region) _exit(2);
    fill(region, 0, len);
    oi_peer_net *n = make_net(id, SECRET, 5000);
    if (oi__peer_net_register(n, region, len) != OI_OK) _exit(3);
    uint16_t port = oi__peer_net_port(n);
    if (write(fds[1], &port, sizeof(port)) != sizeof(port)) _exit(4);
    close(fds[1]);
    for (;;)
      pause();
  }
  uint16_t port = 0;
  REQUIRE(read(fds[0], &port, sizeof(port)) == sizeof(port));
  close(fds[0]);
  sprintf(addr, "127.0.0.1:%u", port);
  return pid;
}

/* SIGSTOP, and wait until the process is stopped (the signal is
 * asynchronous). */
static void stop_child(pid_t pid) {
  kill(pid, SIGSTOP);
  char path[64], buf[512];
  sprintf(path, "/proc/%d/stat", (int)pid);
  for (int i = 0; i < 1000; i++) {
    FILE *f = fopen(path, "r");
    if (!f) return;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = 0;
    char *c = strrchr(buf, ')');
    if (c && c[1] == ' ' && (c[2] == 'T' || c[2] == 't')) return;
    struct timespec d = {0, 1000000};
    nanosleep(&d, NULL);
  }
}

static void reap_child(pid_t pid) {
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
}

static double secs_since(uint64_t t0) { return (double)(oi__now_ns() - t0) / 1e9; }

/* ---- tests ---- */

static void sha256_vectors_once(void) {
  struct {
    const char *msg, *want;
  } v[] = {
      {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
      {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
      {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
       "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
  };
  uint8_t d[32];
  char h[65];
  for (size_t i = 0; i < OI_ARRAY_LEN(v); i++) {
    oi__sha256(v[i].msg, strlen(v[i].msg), d);
    hex(d, 32, h);
    CHECK(strcmp(h, v[i].want) == 0);
  }
  /* One million 'a', fed in uneven pieces. */
  char chunk[997];
  memset(chunk, 'a', sizeof(chunk));
  oi_sha256 s;
  oi__sha256_init(&s);
  size_t left = 1000000;
  for (size_t k = 1; left; k = (k * 7 + 13) % 997 + 1) {
    size_t take = OI_MIN(k, left);
    oi__sha256_update(&s, chunk, take);
    left -= take;
  }
  oi__sha256_final(&s, d);
  hex(d, 32, h);
  CHECK(strcmp(h, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0") == 0);

  /* RFC 4231 test cases 1, 2, 6, 7. */
  uint8_t k20[20], k131[131];
  memset(k20, 0x0b, sizeof(k20));
  memset(k131, 0xaa, sizeof(k131));
  struct {
    const void *key;
    size_t klen;
    const char *msg, *want;
  } hm[] = {
      {k20, 20, "Hi There", "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"},
      {"Jefe", 4, "what do ya want for nothing?",
       "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"},
      {k131, 131, "Test Using Larger Than Block-Size Key - Hash Key First",
       "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"},
      {k131, 131,
       "This is a test using a larger than block-size key and a larger than block-size data. "
       "The key needs to be hashed before being used by the HMAC algorithm.",
       "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2"},
  };
  for (size_t i = 0; i < OI_ARRAY_LEN(hm); i++) {
    oi__hmac_sha256(hm[i].key, hm[i].klen, hm[i].msg, strlen(hm[i].msg), d);
    hex(d, 32, h);
    if (strcmp(h, hm[i].want)) fprintf(stderr, "hmac case %zu: %s\n", i, h);
    CHECK(strcmp(h, hm[i].want) == 0);
  }
  CHECK(oi__ct_equal("abcd", "abcd", 4) && !oi__ct_equal("abcd", "abce", 4));
}

/* The vectors on the portable code and, where the CPU has them, on its
 * SHA extensions; then both on pseudo-random messages of every length up
 * to three blocks and more, digest for digest. */
static void test_sha256_vectors(void) {
  oi__sha256_accelerated(0);
  CHECK(!oi__sha256_accelerated(-1));
  sha256_vectors_once();
  bool ni = oi__sha256_accelerated(1);
  fprintf(stderr, "  sha256: the CPU's SHA extensions %s\n",
          ni ? "used" : "absent (portable only)");
  if (!ni) return;
  sha256_vectors_once();
  uint8_t msg[300], a[32], b[32];
  uint64_t x = 88172645463325252ull;
  for (size_t i = 0; i < sizeof msg; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    msg[i] = (uint8_t)x;
  }
  for (size_t len = 0; len <= sizeof msg; len++) {
    oi__sha256_accelerated(0);
    oi__sha256(msg, len, a);
    oi__sha256_accelerated(1);
    oi__sha256(msg, len, b);
    CHECK(memcmp(a, b, 32) == 0);
  }
}

static void test_options_refused(void) {
  oi_peer_net *n = NULL;
  oi_peer_net_options o = {
      .listen_addr = "127.0.0.1:0", .node_id = "a", .secret = SECRET, .secret_len = 8};
  CHECK_ST(oi__peer_net_create(&o, &n), OI_ERR_INVALID_ARGUMENT); /* short secret */
  o.secret_len = 32;
  o.node_id = "";
  CHECK_ST(oi__peer_net_create(&o, &n), OI_ERR_INVALID_ARGUMENT);
  o.node_id = "a";
  o.listen_addr = "localhost";
  CHECK_ST(oi__peer_net_create(&o, &n), OI_ERR_INVALID_ARGUMENT);
  CHECK(n == NULL);
}

static void test_connect_call(void) {
  oi_peer_net *a = make_net("node-a", SECRET, 5000), *b = make_net("node-b", SECRET, 5000);
  char addr[64];
  addr_of(b, addr);
  oi_peer *p = NULL;
  CHECK_OK(oi__peer_connect(a, addr, &p));
  REQUIRE(p);
  CHECK(strcmp(oi__peer_node_id(p), "node-b") == 0);
  CHECK(oi__peer_region_len(p) == 0);
  size_t sizes[] = {0, 1, 100, 65536, OI_PEER_MAX_MSG};
  uint8_t *buf = malloc(OI_PEER_MAX_MSG);
  fill(buf, 7, OI_PEER_MAX_MSG);
  for (size_t i = 0; i < OI_ARRAY_LEN(sizes); i++) {
    void *rep = NULL;
    size_t rl = 99;
    CHECK_OK(oi__peer_call(p, buf, sizes[i], &rep, &rl, 0));
    CHECK(rl == sizes[i]);
    CHECK(rl == 0 ? rep == NULL : (rep && memcmp(rep, buf, rl) == 0));
    oi__free(rep);
  }
  void *rep;
  size_t rl;
  CHECK_ST(oi__peer_call(p, "FAIL", 4, &rep, &rl, 0), OI_ERR_NOT_FOUND);
  CHECK_ST(oi__peer_call(p, buf, OI_PEER_MAX_MSG + 1, &rep, &rl, 0), OI_ERR_INVALID_ARGUMENT);
  /* A read from a peer that exposes nothing. */
  oi_peer_read r = {0, 1, buf};
  CHECK_ST(oi__peer_get(p, &r, 1, 0), OI_ERR_INVALID_ARGUMENT);
  free(buf);
  /* Both directions at once, and a second connection. */
  oi_peer *q = NULL, *p2 = NULL;
  char aaddr[64];
  addr_of(a, aaddr);
  CHECK_OK(oi__peer_connect(b, aaddr, &q));
  CHECK_OK(oi__peer_connect(a, addr, &p2));
  CHECK_OK(oi__peer_call(q, "hello", 5, &rep, &rl, 0));
  CHECK(rl == 5 && memcmp(rep, "hello", 5) == 0);
  oi__free(rep);
  CHECK_OK(oi__peer_call(p2, "x", 1, &rep, &rl, 0));
  oi__free(rep);
  oi_peer_stats sa, sb;
  oi__peer_net_stats(a, &sa);
  oi__peer_net_stats(b, &sb);
  CHECK(sa.connected == 2 && sa.accepted == 1 && sa.refused == 0);
  CHECK(sb.connected == 1 && sb.accepted == 2 && sb.refused == 0);
  CHECK(sb.served == OI_ARRAY_LEN(sizes) + 2);
  CHECK(sa.calls == OI_ARRAY_LEN(sizes) + 2);
  /* Idle cost: two nets, three connections, nothing to do for a second. */
  struct rusage r0, r1;
  getrusage(RUSAGE_SELF, &r0);
  sleep(1);
  getrusage(RUSAGE_SELF, &r1);
  double cpu_ms = (double)(r1.ru_utime.tv_sec - r0.ru_utime.tv_sec) * 1e3 +
                  (double)(r1.ru_utime.tv_usec - r0.ru_utime.tv_usec) / 1e3 +
                  (double)(r1.ru_stime.tv_sec - r0.ru_stime.tv_sec) * 1e3 +
                  (double)(r1.ru_stime.tv_usec - r0.ru_stime.tv_usec) / 1e3;
  fprintf(stderr, "  two idle nets: %.1f ms of CPU in 1 s\n", cpu_ms);
  CHECK(cpu_ms < 100);
  oi__peer_close(p);
  oi__peer_close(p2);
  /* A connection to nothing fails within the timeout. */
  uint16_t port = oi__peer_net_port(b);
  oi__peer_net_destroy(b);
  oi_peer *dead = NULL;
  uint64_t t0 = oi__now_ns();
  oi_status st = oi__peer_connect(a, addr, &dead);
  CHECK(st == OI_ERR_IO || st == OI_ERR_TIMEOUT || st == OI_ERR_CLOSED);
  CHECK(dead == NULL);
  CHECK(secs_since(t0) < 7);
  (void)port;
  oi__peer_net_destroy(a); /* frees q too */
}

static void test_fork_read(void) {
  const uint64_t len = 64 * MiB;
  char addr[64];
  pid_t pid = spawn_holder("holder", len, addr);
  oi_peer_net *a = make_net("reader", SECRET, 5000);
  oi_peer *p = NULL;
  CHECK_OK(oi__peer_connect(a, addr, &p));
  REQUIRE(p);
  CHECK(strcmp(oi__peer_node_id(p), "holder") == 0);
  CHECK(oi__peer_region_len(p) == len);
  void *rep;
  size_t rl;
  CHECK_OK(oi__peer_call(p, "ping", 4, &rep, &rl, 0));
  CHECK(rl == 4);
  oi__free(rep);

  /* The whole region in 1 MiB pieces, 16 at a time. */
  uint8_t *dst = malloc(len);
  memset(dst, 0, len);
  uint64_t t0 = oi__now_ns();
  for (uint64_t off = 0; off < len; off += 16 * MiB) {
    oi_peer_read rs[16];
    for (int i = 0; i < 16; i++)
      rs[i] = (oi_peer_read){off + (uint64_t)i * MiB, MiB, dst + off + (uint64_t)i * MiB};
    CHECK_OK(oi__peer_get(p, rs, 16, 10000));
  }
  double s = secs_since(t0);
  fprintf(stderr, "  64 MiB in 1 MiB reads: %.3f s (%.2f GB/s)\n", s, (double)len / s / 1e9);
  CHECK(first_bad(dst, 0, len) == UINT64_MAX);

  /* 4096 reads of odd sizes at odd offsets, all in flight together. */
  enum { N = 4096 };
  oi_peer_read *rs = malloc(N * sizeof(*rs));
  uint64_t *offs = malloc(N * sizeof(uint64_t));
  uint8_t *small = malloc((uint64_t)N * 5000);
  memset(small, 0, (uint64_t)N * 5000);
  for (int i = 0; i < N; i++) {
    uint64_t l = 1 + mix(i) % 4999;
    offs[i] = mix(i + 1000000) % (len - l);
    rs[i] = (oi_peer_read){offs[i], l, small + (uint64_t)i * 5000};
  }
  CHECK_OK(oi__peer_get(p, rs, N, 10000));
  int bad = 0;
  for (int i = 0; i < N; i++)
    if (first_bad(rs[i].local_dst, offs[i], rs[i].len) != UINT64_MAX) bad++;
  CHECK(bad == 0);

  /* Outside the region: refused, nothing issued, the connection still fine. */
  oi_peer_read out[] = {
      {len, 1, dst}, {len - 10, 11, dst}, {UINT64_MAX - 3, 8, dst}, {0, len + 1, dst}};
  for (size_t i = 0; i < OI_ARRAY_LEN(out); i++) {
    oi_peer_read two[2] = {{0, 8, dst}, out[i]};
    CHECK_ST(oi__peer_get(p, two, 2, 0), OI_ERR_INVALID_ARGUMENT);
  }
  oi_peer_read edge = {len - 10, 10, dst};
  CHECK_OK(oi__peer_get(p, &edge, 1, 0));
  CHECK(first_bad(dst, len - 10, 10) == UINT64_MAX);
  oi_peer_stats st;
  oi__peer_net_stats(a, &st);
  CHECK(st.bytes_read >= len);
  CHECK(st.errors == 0);
  free(rs);
  free(offs);
  free(small);
  free(dst);
  oi__peer_close(p);
  oi__peer_net_destroy(a);
  reap_child(pid);
}

static void test_wrong_secret(void) {
  oi_peer_net *a = make_net("good-a", SECRET, 3000), *c = make_net("good-c", SECRET, 3000);
  oi_peer_net *b = make_net("intruder", OTHER, 3000);
  char aa[64], ba[64], ca[64];
  addr_of(a, aa);
  addr_of(b, ba);
  addr_of(c, ca);
  oi_peer *p = NULL;
  CHECK_ST(oi__peer_connect(b, aa, &p), OI_ERR_PERMISSION); /* a refuses b */
  CHECK(p == NULL);
  CHECK_ST(oi__peer_connect(a, ba, &p), OI_ERR_PERMISSION); /* b refuses a */
  CHECK(p == NULL);
  oi_peer_stats s;
  oi__peer_net_stats(a, &s);
  CHECK(s.refused == 1 && s.accepted == 0 && s.connect_fails == 1);
  oi__peer_net_stats(b, &s);
  CHECK(s.refused == 1 && s.accepted == 0 && s.connect_fails == 1);
  /* a still serves the nodes that know the secret. */
  CHECK_OK(oi__peer_connect(c, aa, &p));
  void *rep;
  size_t rl;
  CHECK_OK(oi__peer_call(p, "ok", 2, &rep, &rl, 0));
  oi__free(rep);
  oi__peer_close(p);
  CHECK_OK(oi__peer_connect(a, ca, &p));
  oi__peer_close(p);
  oi__peer_net_stats(a, &s);
  CHECK(s.accepted == 1 && s.connected == 1);
  oi__peer_net_destroy(a);
  oi__peer_net_destroy(b);
  oi__peer_net_destroy(c);
}

static int tcp_connect(uint16_t port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons(port)};
  sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr *)&sin, sizeof(sin))) {
    close(fd);
    return -1;
  }
  return fd;
}

static void test_garbage(void) {
  oi_peer_net *a = make_net("target", SECRET, 1000), *c = make_net("client", SECRET, 3000);
  uint16_t port = oi__peer_net_port(a);
  uint8_t junk[65536];
  for (size_t i = 0; i < sizeof(junk); i++)
    junk[i] = (uint8_t)mix(i);
  int keep[4];
  for (int round = 0; round < 4; round++) {
    int fd = tcp_connect(port);
    CHECK(fd >= 0);
    if (fd < 0) continue;
    size_t n = round == 0 ? 1 : round == 1 ? 16 : round == 2 ? 200 : sizeof(junk);
    ssize_t w = send(fd, junk, n, MSG_NOSIGNAL);
    (void)w;
    if (round % 2) {
      close(fd);
      keep[round] = -1;
    } else {
      keep[round] = fd; /* left open, silent */
    }
  }
  /* An idle TCP connection that never speaks. */
  int idle = tcp_connect(port);
  struct timespec ts = {0, 200 * 1000000};
  nanosleep(&ts, NULL);
  char addr[64];
  addr_of(a, addr);
  oi_peer *p = NULL;
  CHECK_OK(oi__peer_connect(c, addr, &p));
  void *rep;
  size_t rl;
  CHECK_OK(oi__peer_call(p, "still here", 10, &rep, &rl, 0));
  CHECK(rl == 10);
  oi__free(rep);
  oi__peer_close(p);
  for (int i = 0; i < 4; i++)
    if (keep[i] >= 0) close(keep[i]);
  if (idle >= 0) close(idle);
  oi_peer_stats s;
  oi__peer_net_stats(a, &s);
  CHECK(s.accepted == 1);
  oi__peer_net_destroy(a);
  oi__peer_net_destroy(c);
}

static void test_holder_stopped_and_killed(void) {
  const uint64_t len = 256 * MiB;
  char addr[64];
  pid_t pid = spawn_holder("mortal", len, addr);
  oi_peer_net *a = make_net("reader", SECRET, 5000);
  oi_peer *p = NULL;
  CHECK_OK(oi__peer_connect(a, addr, &p));
  REQUIRE(p);
  uint8_t *dst = malloc(len);
  oi_peer_read *rs = malloc(256 * sizeof(*rs));
  for (int i = 0; i < 256; i++)
    rs[i] = (oi_peer_read){(uint64_t)i * MiB, MiB, dst + i * MiB};

  /* Stopped: a call and a get time out within their timeouts. */
  stop_child(pid);
  void *rep;
  size_t rl;
  uint64_t t0 = oi__now_ns();
  rep = NULL;
  rl = 0;
  CHECK_ST(oi__peer_call(p, "x", 1, &rep, &rl, 300), OI_ERR_TIMEOUT);
  double s = secs_since(t0);
  fprintf(stderr, "  call on a stopped holder: %.3f s, reply %zu bytes\n", s, rl);
  CHECK(s >= 0.29 && s < 1.3);
  t0 = oi__now_ns();
  CHECK_ST(oi__peer_get(p, rs, 256, 500), OI_ERR_TIMEOUT);
  s = secs_since(t0);
  fprintf(stderr, "  get on a stopped holder: OI_ERR_TIMEOUT after %.3f s\n", s);
  CHECK(s >= 0.49 && s < 1.5);
  /* The connection is dead now. */
  CHECK_ST(oi__peer_get(p, rs, 1, 500), OI_ERR_CLOSED);
  oi__peer_close(p);
  kill(pid, SIGCONT);

  /* Killed mid-read: a fresh connection, 256 MiB requested, SIGKILL soon. */
  CHECK_OK(oi__peer_connect(a, addr, &p));
  REQUIRE(p);
  pid_t killer = fork();
  if (killer == 0) {
    struct timespec d = {0, 30 * 1000000};
    nanosleep(&d, NULL);
    kill(pid, SIGKILL);
    _exit(0);
  }
  oi_status st = OI_OK;
  for (int round = 0; round < 20 && st == OI_OK; round++) {
    t0 = oi__now_ns(); /* the get that fails must fail within its timeout */
    st = oi__peer_get(p, rs, 256, 3000);
  }
  s = secs_since(t0);
  fprintf(stderr, "  holder killed mid-read: %s after %.3f s\n", oi_status_str(st), s);
  CHECK(st == OI_ERR_IO || st == OI_ERR_TIMEOUT || st == OI_ERR_CLOSED);
  CHECK(s < 3.5);
  CHECK_ST(oi__peer_call(p, "x", 1, &rep, &rl, 500), OI_ERR_CLOSED);
  waitpid(killer, NULL, 0);
  waitpid(pid, NULL, 0);
  oi__peer_close(p);
  free(rs);
  free(dst);
  oi__peer_net_destroy(a);
}

/* One-sided reads (UCX's RMA; emulated over TCP): two nets in this process. */
static void test_rma_reads(void) {
  const uint64_t len = 16 * MiB;
  uint8_t *region = oi__aligned_alloc(4096, len);
  fill(region, 0, len);
  g_reads = OI_PEER_READS_RMA;
  oi_peer_net *h = make_net("rma-holder", SECRET, 5000), *a = make_net("rma-reader", SECRET, 5000);
  g_reads = OI_PEER_READS_AUTO;
  CHECK_OK(oi__peer_net_register(h, region, len));
  CHECK_ST(oi__peer_net_register(h, region, len), OI_ERR_STATE);
  char addr[64];
  addr_of(h, addr);
  oi_peer *p = NULL;
  CHECK_OK(oi__peer_connect(a, addr, &p));
  REQUIRE(p);
  CHECK(oi__peer_region_len(p) == len);
  uint8_t *dst = calloc(1, len);
  oi_peer_read rs[64];
  for (int i = 0; i < 64; i++)
    rs[i] = (oi_peer_read){(uint64_t)i * (len / 64), len / 64, dst + (uint64_t)i * (len / 64)};
  CHECK_OK(oi__peer_get(p, rs, 64, 10000));
  CHECK(first_bad(dst, 0, len) == UINT64_MAX);
  oi_peer_read out = {len - 1, 2, dst};
  CHECK_ST(oi__peer_get(p, &out, 1, 0), OI_ERR_INVALID_ARGUMENT);
  oi_peer_stats st;
  oi__peer_net_stats(h, &st);
  CHECK(st.bytes_served == 0); /* nothing went through the holder's own reads */
  free(dst);
  oi__peer_close(p);
  oi__peer_net_destroy(a);
  oi__peer_net_destroy(h);
  oi__free(region);
}

/* A reader process killed while this holder answers its reads: the holder
 * keeps serving. */
static void test_reader_killed(void) {
  const uint64_t len = 64 * MiB;
  /* The readers are forked before this process has a net (a child of a
   * process with a UCX context inherits its state); each waits for the
   * holder's address on a pipe. */
  enum { R = 3 };
  pid_t pids[R];
  int pipes[R][2];
  for (int i = 0; i < R; i++) {
    REQUIRE(pipe(pipes[i]) == 0);
    pids[i] = fork();
    REQUIRE(pids[i] >= 0);
    if (pids[i] == 0) {
      char addr[64] = {0};
      close(pipes[i][1]);
      if (read(pipes[i][0], addr, sizeof(addr) - 1) <= 0) _exit(0);
      oi_peer_net *a = make_net("doomed", SECRET, 5000);
      oi_peer *p = NULL;
      if (oi__peer_connect(a, addr, &p)) _exit(2);
      uint8_t *dst = malloc(len);
      oi_peer_read rs[64];
      for (int k = 0; k < 64; k++)
        rs[k] = (oi_peer_read){(uint64_t)k * MiB, MiB, dst + k * MiB};
      for (;;)
        oi__peer_get(p, rs, 64, 5000);
    }
    close(pipes[i][0]);
  }
  uint8_t *region = oi__aligned_alloc(4096, len);
  fill(region, 0, len);
  oi_peer_net *h = make_net("steady", SECRET, 2000);
  CHECK_OK(oi__peer_net_register(h, region, len));
  char addr[64];
  addr_of(h, addr);
  for (int i = 0; i < R; i++) {
    oi_peer_stats st;
    oi__peer_net_stats(h, &st);
    uint64_t base = st.bytes_served;
    CHECK(write(pipes[i][1], addr, strlen(addr)) == (ssize_t)strlen(addr));
    close(pipes[i][1]);
    uint64_t t0 = oi__now_ns();
    do { /* until it is in and reading */
      struct timespec d = {0, 5000000};
      nanosleep(&d, NULL);
      oi__peer_net_stats(h, &st);
    } while ((st.accepted < (uint64_t)i + 1 || st.bytes_served < base + 16 * MiB) &&
             secs_since(t0) < 20);
    struct timespec d = {0, (10 + 20 * i) * 1000000};
    nanosleep(&d, NULL);
    kill(pids[i], SIGKILL);
    waitpid(pids[i], NULL, 0);
  }
  oi_peer_net *c = make_net("survivor", SECRET, 5000);
  oi_peer *p = NULL;
  CHECK_OK(oi__peer_connect(c, addr, &p));
  uint8_t *dst = malloc(4 * MiB);
  oi_peer_read r = {7, 4 * MiB, dst};
  CHECK_OK(oi__peer_get(p, &r, 1, 5000));
  CHECK(first_bad(dst, 7, 4 * MiB) == UINT64_MAX);
  oi_peer_stats st;
  oi__peer_net_stats(h, &st);
  fprintf(stderr, "  holder after 3 readers killed: %llu accepted, %llu MiB served\n",
          (unsigned long long)st.accepted, (unsigned long long)(st.bytes_served / MiB));
  CHECK(st.accepted == R + 1);
  free(dst);
  oi__peer_close(p);
  oi__peer_net_destroy(c);
  oi__peer_net_destroy(h);
  oi__free(region);
}

typedef struct inflight {
  oi_peer *p;
  int kind;
  oi_status st;
  uint8_t *dst;
} inflight;

static void *inflight_main(void *arg) {
  inflight *f = arg;
  if (f->kind == 0) {
    oi_peer_read rs[8];
    for (int i = 0; i < 8; i++)
      rs[i] = (oi_peer_read){(uint64_t)i * MiB, MiB, f->dst + i * MiB};
    f->st = oi__peer_get(f->p, rs, 8, 60000);
  } else {
    void *rep;
    size_t rl;
    f->st = oi__peer_call(f->p, "x", 1, &rep, &rl, 60000);
  }
  return NULL;
}

static void test_destroy_in_flight(void) {
  char addr[64];
  pid_t pid = spawn_holder("frozen", 8 * MiB, addr);
  oi_peer_net *a = make_net("reader", SECRET, 5000);
  oi_peer *p = NULL;
  CHECK_OK(oi__peer_connect(a, addr, &p));
  REQUIRE(p);
  stop_child(pid);
  enum { T = 4 };
  inflight f[T];
  pthread_t th[T];
  for (int i = 0; i < T; i++) {
    f[i] = (inflight){p, i % 2, OI_OK, malloc(8 * MiB)};
    pthread_create(&th[i], NULL, inflight_main, &f[i]);
  }
  struct timespec d = {0, 200 * 1000000};
  nanosleep(&d, NULL);
  uint64_t t0 = oi__now_ns();
  oi__peer_net_destroy(a);
  for (int i = 0; i < T; i++) {
    pthread_join(th[i], NULL);
    CHECK(f[i].st == OI_ERR_CLOSED);
    free(f[i].dst);
  }
  double s = secs_since(t0);
  fprintf(stderr, "  destroy with %d operations in flight: %.3f s\n", T, s);
  CHECK(s < 3);
  kill(pid, SIGCONT);
  reap_child(pid);
}

/* oi__peer_send: requests not waited for arrive and are answered (the
 * answers dropped), in order with calls; a peer closed and a net destroyed
 * with sends in flight. */
static void test_send(void) {
  oi_peer_net *a = make_net("sender", SECRET, 5000), *b = make_net("receiver", SECRET, 5000);
  char addr[64];
  addr_of(b, addr);
  oi_peer *p = NULL;
  CHECK_OK(oi__peer_connect(a, addr, &p));
  REQUIRE(p);
  CHECK_ST(oi__peer_send(p, "x", OI_PEER_MAX_MSG + 1, 0), OI_ERR_INVALID_ARGUMENT);
  CHECK_ST(oi__peer_send(NULL, "x", 1, 0), OI_ERR_INVALID_ARGUMENT);
  for (int i = 0; i < 100; i++)
    CHECK_OK(oi__peer_send(p, i % 2 ? "FAIL" : "ping", 4, 0));
  /* A call after them is answered after them (one connection, in order). */
  void *rep = NULL;
  size_t rl = 0;
  CHECK_OK(oi__peer_call(p, "after", 5, &rep, &rl, 0));
  oi__free(rep);
  oi_peer_stats sa, sb;
  oi__peer_net_stats(b, &sb);
  CHECK(sb.served == 101);
  /* The sender counts them as calls, and the refused ones (FAIL) as errors
   * as its thread ends them (their answers came before the call's). */
  for (int i = 0; i < 500; i++) {
    oi__peer_net_stats(a, &sa);
    if (sa.errors >= 50) break;
    usleep(10000);
  }
  CHECK(sa.calls == 101);
  CHECK(sa.errors == 50);
  /* Closed right after sends, then the net destroyed right after more. */
  for (int i = 0; i < 10; i++)
    CHECK_OK(oi__peer_send(p, "ping", 4, 0));
  oi__peer_close(p);
  oi_peer *q = NULL;
  CHECK_OK(oi__peer_connect(a, addr, &q));
  for (int i = 0; i < 10; i++)
    CHECK_OK(oi__peer_send(q, "ping", 4, 0));
  oi__peer_net_destroy(a);
  oi__peer_net_destroy(b);
}

/* ---- answers given later (oi__peer_defer) ---- */

/* Requests deferred by defer_all, in arrival order. */
static struct {
  pthread_mutex_t lock;
  oi_peer_ticket *tickets[16];
  char req[16][16];
  size_t n;
} g_later = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void defer_all(void *ctx, const char *peer_id, const void *req, size_t len,
                      oi_peer_reply *r) {
  OI_UNUSED(ctx);
  OI_UNUSED(peer_id);
  pthread_mutex_lock(&g_later.lock);
  if (len < sizeof g_later.req[0] && g_later.n < OI_ARRAY_LEN(g_later.tickets)) {
    oi_peer_ticket *t = oi__peer_defer(r);
    REQUIRE(t);
    memcpy(g_later.req[g_later.n], req, len);
    g_later.req[g_later.n][len] = 0;
    g_later.tickets[g_later.n++] = t;
  } else {
    oi__peer_reply_status(r, OI_ERR_BUSY); /* answered now */
  }
  pthread_mutex_unlock(&g_later.lock);
}

/* Waits until `n` requests are deferred. */
static void wait_deferred(size_t n) {
  for (int i = 0; i < 2000; i++) {
    pthread_mutex_lock(&g_later.lock);
    size_t have = g_later.n;
    pthread_mutex_unlock(&g_later.lock);
    if (have >= n) return;
    usleep(1000);
  }
  REQUIRE(!"requests not deferred in time");
}

/* Answers deferred request i: its own bytes back, or NOT_FOUND for "FAIL". */
static void answer_deferred(size_t i) {
  pthread_mutex_lock(&g_later.lock);
  oi_peer_ticket *t = g_later.tickets[i];
  char req[16];
  memcpy(req, g_later.req[i], sizeof req);
  g_later.tickets[i] = NULL;
  pthread_mutex_unlock(&g_later.lock);
  REQUIRE(t);
  oi_peer_reply *r = oi__peer_ticket_reply(t);
  if (!strcmp(req, "FAIL"))
    oi__peer_reply_status(r, OI_ERR_NOT_FOUND);
  else
    CHECK_OK(oi__peer_reply_set(r, req, strlen(req)));
  oi__peer_answer(t);
}

typedef struct later_call {
  oi_peer *p;
  const char *req;
  uint32_t timeout_ms;
  oi_status st;
  char reply[16];
} later_call;

static void *later_call_main(void *arg) {
  later_call *c = arg;
  void *rep = NULL;
  size_t rl = 0;
  c->st = oi__peer_call(c->p, c->req, strlen(c->req), &rep, &rl, c->timeout_ms);
  if (c->st == OI_OK && rl < sizeof c->reply) memcpy(c->reply, rep, rl);
  oi__free(rep);
  return NULL;
}

static void test_deferred_answers(void) {
  oi_peer_net_options o = {.reads = g_reads,
                           .listen_addr = "127.0.0.1:0",
                           .node_id = "later",
                           .secret = SECRET,
                           .secret_len = 32,
                           .timeout_ms = 5000,
                           .on_request = defer_all};
  oi_peer_net *h = NULL;
  CHECK_OK(oi__peer_net_create(&o, &h));
  oi_peer_net *a = make_net("asker", SECRET, 5000);
  char addr[64];
  addr_of(h, addr);
  oi_peer *p = NULL;
  CHECK_OK(oi__peer_connect(a, addr, &p));
  /* Three calls in flight on one connection, answered in another order
   * than asked, each by its own bytes or status. */
  later_call c[3] = {{p, "first", 0, 0, {0}}, {p, "FAIL", 0, 0, {0}}, {p, "third", 0, 0, {0}}};
  pthread_t th[3];
  for (int i = 0; i < 3; i++) {
    REQUIRE(pthread_create(&th[i], NULL, later_call_main, &c[i]) == 0);
    wait_deferred((size_t)i + 1); /* so that request i is deferred i-th */
  }
  usleep(50000);
  for (int i = 0; i < 3; i++) /* nothing was answered when on_request returned */
    CHECK(c[i].reply[0] == 0);
  answer_deferred(2);
  answer_deferred(0);
  answer_deferred(1);
  for (int i = 0; i < 3; i++)
    pthread_join(th[i], NULL);
  CHECK_OK(c[0].st);
  CHECK(strcmp(c[0].reply, "first") == 0);
  CHECK_ST(c[1].st, OI_ERR_NOT_FOUND);
  CHECK_OK(c[2].st);
  CHECK(strcmp(c[2].reply, "third") == 0);
  oi_peer_stats sh;
  oi__peer_net_stats(h, &sh);
  CHECK(sh.served == 3);
  /* An answer after the caller gave up (its call timed out) is dropped
   * there; the connection stays usable. */
  later_call late = {p, "late", 100, 0, {0}};
  later_call_main(&late);
  CHECK_ST(late.st, OI_ERR_TIMEOUT);
  wait_deferred(4);
  answer_deferred(3);
  later_call next = {p, "next", 0, 0, {0}};
  REQUIRE(pthread_create(&th[0], NULL, later_call_main, &next) == 0);
  wait_deferred(5);
  answer_deferred(4);
  pthread_join(th[0], NULL);
  CHECK_OK(next.st);
  CHECK(strcmp(next.reply, "next") == 0);
  /* An answer whose connection has gone (the asker's net destroyed) is
   * dropped: nothing sent, nothing crashes; the holder serves others. */
  later_call gone = {p, "gone", 200, 0, {0}};
  later_call_main(&gone);
  CHECK_ST(gone.st, OI_ERR_TIMEOUT);
  wait_deferred(6);
  oi__peer_net_destroy(a); /* frees p */
  usleep(300000); /* the holder sees the connection end (a closed ep: at once on loopback) */
  oi__peer_net_stats(h, &sh);
  uint64_t served = sh.served;
  answer_deferred(5);
  usleep(50000);
  oi__peer_net_stats(h, &sh);
  CHECK(sh.served == served);
  oi_peer_net *b = make_net("asker-2", SECRET, 5000);
  oi_peer *q = NULL;
  CHECK_OK(oi__peer_connect(b, addr, &q));
  later_call again = {q, "again", 0, 0, {0}};
  REQUIRE(pthread_create(&th[0], NULL, later_call_main, &again) == 0);
  wait_deferred(7);
  answer_deferred(6);
  pthread_join(th[0], NULL);
  CHECK_OK(again.st);
  CHECK(strcmp(again.reply, "again") == 0);
  oi__peer_net_destroy(b);
  oi__peer_net_destroy(h);
  g_later.n = 0;
}

/* ---- UCX loaded at run time (lib/cluster/ucx.h) ---- */

/* Whether the process has `name` mapped (/proc/self/maps). */
static bool mapped(const char *name) {
  REQUIRE(access("/proc/self/maps", R_OK) == 0);
  return tr_file_contains("/proc/self/maps", name);
}

static void test_ucx_loading(void) {
  /* Nothing loads UCX before the first net: the library does not link it. */
  CHECK(!mapped("libucp.so"));
  CHECK(!mapped("libucs.so"));
  /* A library that is not there: OI_ERR_UNSUPPORTED, the name and dlerror(). */
  oi_ucx_api api;
  CHECK_ST(oi__ucx_open("libucp-absent.so.0", NULL, &api), OI_ERR_UNSUPPORTED);
  CHECK(strstr(oi_last_error(), "libucp-absent.so.0") != NULL);
  CHECK(strstr(oi_last_error(), "cannot open shared object file") != NULL);
  CHECK(api.ucp_init_version == NULL);
  /* One that loads but lacks the functions (libucs has no ucp_*). */
  CHECK_ST(oi__ucx_open("libucs.so.0", NULL, &api), OI_ERR_UNSUPPORTED);
  CHECK(strstr(oi_last_error(), "lacks ucp_") != NULL);
  CHECK(api.ucs_status_string == NULL);
  CHECK(!mapped("libucp.so"));
  /* The real one: every function resolved. */
  CHECK_ST(oi__ucx_open(OI_UCX_LIBRARY, OI_UCS_LIBRARY, &api), OI_OK);
  void *const *fns = (void *const *)&api;
  for (size_t i = 0; i < sizeof(api) / sizeof(void *); i++)
    CHECK(fns[i] != NULL);
  CHECK(strcmp(api.ucs_status_string(UCS_ERR_NO_MEMORY), "Out of memory") == 0);
  CHECK(mapped("libucp.so"));
  /* And a net works through the table oi__ucx_load fills. */
  oi_peer_net *n = make_net("loader", SECRET, 2000);
  CHECK(oi__ucx.ucp_worker_progress != NULL);
  oi__peer_net_destroy(n);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  RUN_TEST(test_ucx_loading);
  RUN_TEST(test_sha256_vectors);
  RUN_TEST(test_options_refused);
  RUN_TEST(test_connect_call);
  RUN_TEST(test_send);
  RUN_TEST(test_deferred_answers);
  RUN_TEST(test_fork_read);
  RUN_TEST(test_rma_reads);
  RUN_TEST(test_reader_killed);
  RUN_TEST(test_wrong_secret);
  RUN_TEST(test_garbage);
  RUN_TEST(test_holder_stopped_and_killed);
  RUN_TEST(test_destroy_in_flight);
  TEST_EXIT();
}
