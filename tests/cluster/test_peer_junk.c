/* Junk on a live node's peer port (issue #36): plain TCP connections to a
 * net's listener that send 1 to 64 zero bytes, 2000 zero bytes, a real
 * HELLO frame twice, a real HELLO with bytes appended, HELLOs with their
 * length fields edited, random bytes, every truncation of a real HELLO, and
 * a slowloris (one byte every 100 ms). Each is closed by the node (within
 * its handshake timeout where it waits for more), counted in its stats
 * (refused), and the node then serves a real peer: a call round-trips.
 * Then a fuzz loop: bounded junk connections (random lengths and bytes, a
 * few ms each) against one node, which still serves afterwards. UCX 1.13's
 * own listener aborted the process on the first kinds (tcp_sockcm_ep.c:825);
 * the node's listener never hands an unauthenticated byte to UCX.
 *
 * A flood of refusals is not a flood of log lines: at most 10 a second.
 *
 * The loop's count: OI_PEER_JUNK_ROUNDS (default 10000; the suite runs the
 * default). */
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/random.h>
#include <time.h>

#include "cluster/peer.h"
#include "cluster/peer_wire.h"
#include "cluster/ucx.h"
#include "core/core.h"
#include "core/le_bytes.h"
#include "peer_tcp_util.h"
#include "testutil.h"

static const uint8_t SECRET[] = "cluster secret: thirty-two bytes";
#define TIMEOUT_MS 300u /* the node's handshake deadline */

static void echo(void *ctx, const char *peer_id, const void *req, size_t len, oi_peer_reply *r) {
  OI_UNUSED(ctx);
  OI_UNUSED(peer_id);
  oi__peer_reply_set(r, req, len);
}

static oi_peer_net *make_net(const char *id, uint32_t timeout_ms) {
  oi_peer_net_options o = {.listen_addr = "127.0.0.1:0",
                           .node_id = id,
                           .secret = SECRET,
                           .secret_len = 32,
                           .timeout_ms = timeout_ms,
                           .on_request = echo};
  oi_peer_net *n = NULL;
  oi_status st = oi__peer_net_create(&o, &n);
  if (st) fprintf(stderr, "net %s: %s\n", id, oi_last_error());
  REQUIRE(st == OI_OK && n);
  return n;
}

static atomic_uint refusal_lines; /* log lines about refusals */

static void quiet(void *ctx, oi_log_level level, const char *line) {
  OI_UNUSED(ctx);
  OI_UNUSED(level);
  if (strstr(line, "refused")) atomic_fetch_add(&refusal_lines, 1);
}

static uint64_t refused_of(oi_peer_net *n) {
  oi_peer_stats s;
  oi__peer_net_stats(n, &s);
  return s.refused;
}

/* Waits up to ms for the node's refused count to reach want. */
static bool refused_reaches(oi_peer_net *n, uint64_t want, unsigned ms) {
  for (unsigned i = 0; i < ms / 10 && refused_of(n) < want; i++) {
    struct timespec ts = {0, 10000000};
    nanosleep(&ts, NULL);
  }
  return refused_of(n) >= want;
}

/* A real peer still connects and a call round-trips. */
static bool still_serves(oi_peer_net *node) {
  oi_peer_net *cl = make_net("client", 3000);
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%u", oi__peer_net_port(node));
  oi_peer *p = NULL;
  void *rep = NULL;
  size_t rl = 0;
  bool ok = oi__peer_connect(cl, addr, &p) == OI_OK &&
            oi__peer_call(p, "alive", 5, &rep, &rl, 0) == OI_OK && rl == 5 &&
            memcmp(rep, "alive", 5) == 0;
  if (!ok) fprintf(stderr, "the node does not serve: %s\n", oi_last_error());
  oi__free(rep);
  oi__peer_net_destroy(cl);
  return ok;
}

/* A real HELLO frame from "junk" (header and payload). */
static size_t hello_frame(uint8_t *b) {
  uint8_t h[OI_PEER_HELLO_FIXED + 8];
  size_t n = ptu_hello(h, OI_PEER_VERSION, "junk");
  return ptu_frame(b, OI_PEER_AM_HELLO, h, n);
}

typedef struct jcase {
  const char *what;
  uint8_t b[2100];
  size_t len;
} jcase;

static jcase cases[512];
static size_t ncases;

static jcase *add(const char *what, const void *b, size_t len) {
  REQUIRE(ncases < OI_ARRAY_LEN(cases) && len <= sizeof cases[0].b);
  jcase *c = &cases[ncases++];
  c->what = what;
  memcpy(c->b, b, len);
  c->len = len;
  return c;
}

static void build_cases(void) {
  static uint8_t zeros[2000];
  for (size_t n = 1; n <= 64; n++)
    add("zero bytes (1 to 64)", zeros, n);
  add("2000 zero bytes", zeros, 2000);
  uint8_t h[128], b[512];
  size_t hl = hello_frame(h);
  memcpy(b, h, hl);
  memcpy(b + hl, h, hl);
  add("a real HELLO frame twice", b, 2 * hl);
  memcpy(b, h, hl);
  memset(b + hl, 0xa5, 16);
  add("a real HELLO frame with 16 bytes appended", b, hl + 16);
  memset(b + hl, 0, 64);
  add("a real HELLO frame with 64 zero bytes appended", b, hl + 64);
  /* Length fields edited: the frame's, then the HELLO's id length. */
  const uint32_t lens[] = {0,          1,           (uint32_t)(hl - 9),   (uint32_t)(hl - 7),
                           0x7fffffff, 0xffffffffu, OI_PEER_MAX_FRAME + 1};
  for (size_t i = 0; i < OI_ARRAY_LEN(lens); i++) {
    memcpy(b, h, hl);
    put32(b + 4, lens[i]);
    add("a HELLO frame with its length edited", b, hl);
  }
  const uint16_t idls[] = {0, 3, 5, 255, 0xffff};
  for (size_t i = 0; i < OI_ARRAY_LEN(idls); i++) {
    memcpy(b, h, hl);
    put16(b + OI_PEER_FRAME_HDR + 6, idls[i]);
    add("a HELLO with its id length edited", b, hl);
  }
  memcpy(b, h, hl);
  put32(b, 0x5250494fu); /* the magic where the kind goes */
  add("a HELLO frame whose kind is the magic", b, hl);
  for (int i = 0; i < 40; i++) {
    uint16_t n = 0;
    REQUIRE(getrandom(&n, sizeof n, 0) == sizeof n);
    n = (uint16_t)(1 + n % 512);
    REQUIRE(getrandom(b, n, 0) == n);
    add("random bytes", b, n);
  }
  for (size_t n = 1; n < hl; n++)
    add("a real HELLO frame truncated", h, n);
}

/* Sends every case on its own connection (at most `batch` open at once),
 * then waits for the node to close each. */
static void test_junk_kinds(void) {
  build_cases();
  oi_set_log_handler(quiet, NULL);
  oi_peer_net *node = make_net("node", TIMEOUT_MS);
  uint16_t port = oi__peer_net_port(node);
  uint64_t t0 = oi__now_ns();
  const size_t batch = 100;
  for (size_t first = 0; first < ncases; first += batch) {
    int fds[100];
    size_t end = OI_MIN(ncases, first + batch);
    for (size_t i = first; i < end; i++) {
      fds[i - first] = ptu_dial(port);
      REQUIRE(fds[i - first] >= 0);
      ptu_send_raw(fds[i - first], cases[i].b, cases[i].len); /* may fail: closed already */
    }
    for (size_t i = first; i < end; i++) {
      if (!ptu_closed_within(fds[i - first], 3 * TIMEOUT_MS + 2000)) {
        fprintf(stderr, "case %zu (%s, %zu bytes): not closed by the node\n", i, cases[i].what,
                cases[i].len);
        CHECK(false);
      }
      close(fds[i - first]);
    }
  }
  CHECK(refused_reaches(node, ncases, 3000));
  CHECK(refused_of(node) == ncases);
  printf("  %zu junk connections closed in %.2f s, %llu refused\n", ncases,
         (double)(oi__now_ns() - t0) / 1e9, (unsigned long long)refused_of(node));
  /* A slowloris: a real HELLO a byte every 100 ms; closed by the deadline
   * (the node does not wait a timeout per byte). */
  uint8_t h[128];
  size_t hl = hello_frame(h);
  int fd = ptu_dial(port);
  REQUIRE(fd >= 0);
  uint64_t s0 = oi__now_ns();
  size_t sent = 0;
  bool closed = false;
  while (sent < hl && !closed) {
    if (!ptu_send_raw(fd, h + sent, 1)) break;
    sent++;
    closed = ptu_closed_within(fd, 100);
  }
  if (!closed) closed = ptu_closed_within(fd, 1000);
  double secs = (double)(oi__now_ns() - s0) / 1e9;
  printf("  slowloris: closed after %zu of %zu bytes, %.2f s\n", sent, hl, secs);
  CHECK(closed && sent < hl && secs < (TIMEOUT_MS + 400) / 1000.0);
  close(fd);
  CHECK(refused_reaches(node, ncases + 1, 3000));
  CHECK(still_serves(node));
  oi_peer_stats s;
  oi__peer_net_stats(node, &s);
  CHECK(s.accepted == 1 && s.refused == ncases + 1);
  oi__peer_net_destroy(node);
  oi_set_log_handler(NULL, NULL);
}

/* Bounded junk connections in a loop: random lengths (0..600) and bytes,
 * each closed by the client after at most a few ms (half of them with a
 * reset); the node crashes on none and serves afterwards. */
static void test_junk_loop(void) {
  oi_set_log_handler(quiet, NULL);
  const char *e = getenv("OI_PEER_JUNK_ROUNDS");
  long rounds = e ? atol(e) : 10000;
  oi_peer_net *node = make_net("node", TIMEOUT_MS);
  uint16_t port = oi__peer_net_port(node);
  atomic_store(&refusal_lines, 0);
  uint64_t t0 = oi__now_ns();
  uint8_t b[600];
  long dialed = 0;
  for (long i = 0; i < rounds; i++) {
    uint32_t r[2];
    REQUIRE(getrandom(r, sizeof r, 0) == sizeof r);
    size_t n = r[0] % sizeof b;
    REQUIRE(getrandom(b, n, 0) == (ssize_t)n);
    if (i % 7 == 0 && n >= 8) put32(b, 1 + r[1] % 20); /* a plausible frame kind */
    int fd = ptu_dial(port);
    if (fd < 0) continue; /* the backlog full for a moment: not a crash */
    dialed++;
    ptu_send_raw(fd, b, n);
    ptu_closed_within(fd, r[1] % 3);
    if (r[1] & 1) {
      struct linger lg = {.l_onoff = 1, .l_linger = 0};
      setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    }
    close(fd);
  }
  double secs = (double)(oi__now_ns() - t0) / 1e9;
  CHECK(dialed > rounds * 9 / 10);
  CHECK(refused_reaches(node, (uint64_t)dialed, 10000));
  printf("  %ld junk connections (%ld dialed) in %.1f s: %llu refused, 0 crashes\n", rounds, dialed,
         secs, (unsigned long long)refused_of(node));
  CHECK(refused_of(node) == (uint64_t)dialed);
  /* Logged at most 10 a second, plus a line a second saying how many were
   * not. */
  unsigned lines = atomic_load(&refusal_lines);
  double all = (double)(oi__now_ns() - t0) / 1e9;
  printf("  %u log lines about them\n", lines);
  CHECK(lines <= 11 * ((unsigned)all + 2));
  CHECK(still_serves(node));
  oi__peer_net_destroy(node);
  oi_set_log_handler(NULL, NULL);
}

int main(void) {
  if (oi__ucx_load() != OI_OK) TEST_SKIP("UCX is not installed");
  RUN_TEST(test_junk_kinds);
  RUN_TEST(test_junk_loop);
  TEST_EXIT();
}
