/* The peer transport's refusals (lib/cluster/peer*.c): handshake messages
 * that are malformed field by field (the parsers the connection code runs
 * on what a peer sent), addresses that are not IPv4 IP:PORT, calls, sends,
 * gets and registrations with bad arguments, a listener on an address this
 * host does not have, a net with no request handler, a handler whose reply
 * is too large, and reads forced to active messages by OI_PEER_READS; and
 * the cluster tier's LEASE and RELEASE messages malformed field by field. The
 * wire layout is spelled out here (docs/cluster.md, "Peer transport"): a
 * change to it must change this test. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>

#include "cluster/peer.h"
#include "cluster/peer_wire.h"
#include "cluster/sha256.h"
#include "cluster/tier.h"
#include "cluster/ucx.h"
#include "core/core.h"
#include "core/le_bytes.h"
#include "peer_tcp_util.h"
#include "testutil.h"

static const uint8_t SECRET[] = "cluster secret: thirty-two bytes";

static size_t make_hello(uint8_t *b, uint16_t version, const char *id, uint16_t idl) {
  put32(b, OI_PEER_MAGIC);
  put16(b + 4, version);
  put16(b + 6, idl);
  memset(b + 8, 0x11, OI_PEER_NONCE);
  memcpy(b + OI_PEER_HELLO_FIXED, id, strlen(id));
  return OI_PEER_HELLO_FIXED + strlen(id);
}

static void test_hello_refused(void) {
  uint8_t b[OI_PEER_HELLO_FIXED + 300], nonce[OI_PEER_NONCE];
  char id[OI_PEER_MAX_NODE_ID + 1];
  size_t idl = 0;
  size_t n = make_hello(b, 1, "node-a", 6);
  REQUIRE(oi__peer_parse_hello(b, n, nonce, id, &idl) == OI_OK);
  CHECK(idl == 6 && strcmp(id, "node-a") == 0 && nonce[0] == 0x11);

  CHECK_ST(oi__peer_parse_hello(b, OI_PEER_HELLO_FIXED - 1, nonce, id, &idl), OI_ERR_PROTOCOL);
  CHECK(strstr(oi_last_error(), "short"));
  b[0] ^= 1;
  CHECK_ST(oi__peer_parse_hello(b, n, nonce, id, &idl), OI_ERR_PROTOCOL);
  CHECK(strstr(oi_last_error(), "magic"));
  n = make_hello(b, 2, "node-a", 6);
  CHECK_ST(oi__peer_parse_hello(b, n, nonce, id, &idl), OI_ERR_VERSION);
  CHECK(strstr(oi_last_error(), "version 2"));
  /* The id: empty, longer than the limit, a length the message does not
   * match, a NUL inside. */
  n = make_hello(b, 1, "", 0);
  CHECK_ST(oi__peer_parse_hello(b, n, nonce, id, &idl), OI_ERR_PROTOCOL);
  char longid[OI_PEER_MAX_NODE_ID + 2];
  memset(longid, 'x', sizeof longid - 1);
  longid[sizeof longid - 1] = '\0';
  n = make_hello(b, 1, longid, (uint16_t)strlen(longid));
  CHECK_ST(oi__peer_parse_hello(b, n, nonce, id, &idl), OI_ERR_PROTOCOL);
  n = make_hello(b, 1, "node-a", 7);
  CHECK_ST(oi__peer_parse_hello(b, n, nonce, id, &idl), OI_ERR_PROTOCOL);
  n = make_hello(b, 1, "node-a", 6);
  b[OI_PEER_HELLO_FIXED + 2] = 0;
  CHECK_ST(oi__peer_parse_hello(b, n, nonce, id, &idl), OI_ERR_PROTOCOL);
  CHECK(strstr(oi_last_error(), "bad node id"));
  CHECK(idl == 6 && strcmp(id, "node-a") == 0); /* refusals wrote nothing */
}

static void test_auth_refused(void) {
  uint8_t b[4 + OI_PEER_MAC_LEN + 1];
  put32(b, OI_PEER_MAGIC);
  memset(b + 4, 0x22, OI_PEER_MAC_LEN + 1);
  const uint8_t *mac = NULL;
  REQUIRE(oi__peer_parse_auth(b, 4 + OI_PEER_MAC_LEN, &mac) == OI_OK);
  CHECK(mac == b + 4);
  mac = NULL;
  CHECK_ST(oi__peer_parse_auth(b, 4 + OI_PEER_MAC_LEN + 1, &mac), OI_ERR_PROTOCOL);
  CHECK_ST(oi__peer_parse_auth(b, 4 + OI_PEER_MAC_LEN - 1, &mac), OI_ERR_PROTOCOL);
  b[3] ^= 0x80;
  CHECK_ST(oi__peer_parse_auth(b, 4 + OI_PEER_MAC_LEN, &mac), OI_ERR_PROTOCOL);
  CHECK(mac == NULL && strstr(oi_last_error(), "bad authentication message"));
}

static size_t make_welcome(uint8_t *b, uint64_t base, uint64_t len, uint32_t klen, uint32_t flags) {
  put32(b, OI_PEER_MAGIC);
  memset(b + 4, 0x33, OI_PEER_MAC_LEN);
  put64(b + 4 + OI_PEER_MAC_LEN, base);
  put64(b + 12 + OI_PEER_MAC_LEN, len);
  put32(b + 20 + OI_PEER_MAC_LEN, klen);
  put32(b + 24 + OI_PEER_MAC_LEN, flags);
  memset(b + OI_PEER_WELCOME_FIXED, 0x44, klen);
  return OI_PEER_WELCOME_FIXED + klen;
}

static void test_welcome_refused(void) {
  static uint8_t b[OI_PEER_WELCOME_FIXED + OI_PEER_MAX_RKEY + 8];
  uint8_t mac[OI_PEER_MAC_LEN], other[OI_PEER_MAC_LEN];
  memset(mac, 0x33, sizeof mac);
  memset(other, 0x34, sizeof other);
  oi_peer_welcome w;
  size_t n = make_welcome(b, 4096, 1 << 20, 16, 1);
  REQUIRE(oi__peer_parse_welcome(b, n, mac, &w) == OI_OK);
  CHECK(w.base == 4096 && w.len == 1 << 20 && w.rkey_len == 16 && w.flags == 1);
  CHECK_OK(oi__peer_parse_welcome(b, n, NULL, &w)); /* MAC not checked */
  n = make_welcome(b, 4096, 1 << 20, 0, 0);
  CHECK_OK(oi__peer_parse_welcome(b, n, mac, &w)); /* no one-sided reads, no key */

  memset(&w, 0x5a, sizeof w);
  CHECK_ST(oi__peer_parse_welcome(b, OI_PEER_WELCOME_FIXED - 1, mac, &w), OI_ERR_PROTOCOL);
  CHECK_ST(oi__peer_parse_welcome(b, n, other, &w), OI_ERR_PERMISSION);
  CHECK(strstr(oi_last_error(), "does not prove the cluster secret"));
  const struct {
    uint64_t base, len;
    uint32_t klen, flags;
    int extra; /* bytes beyond the key */
  } bad[] = {
      {0, 4096, OI_PEER_MAX_RKEY + 1, 1, 0}, /* key over the limit */
      {0, 4096, 16, 1, 1},                   /* the length does not match the key's */
      {0, 4096, 0, 2, 0},                    /* an unknown flag */
      {0, 4096, 16, 0, 0},                   /* a key without one-sided reads */
      {0, 4096, 0, 1, 0},                    /* one-sided reads without a key */
      {UINT64_MAX - 10, 4096, 0, 0, 0},      /* a region that wraps */
  };
  for (size_t i = 0; i < OI_ARRAY_LEN(bad); i++) {
    n = make_welcome(b, bad[i].base, bad[i].len, bad[i].klen, bad[i].flags) + (size_t)bad[i].extra;
    memset(&w, 0x5a, sizeof w);
    oi_status st = oi__peer_parse_welcome(b, n, mac, &w);
    if (st != OI_ERR_PROTOCOL || !strstr(oi_last_error(), "bad region descriptor") ||
        ((uint8_t *)&w)[0] != 0x5a) {
      fprintf(stderr, "welcome case %zu: %s (%s)\n", i, oi_status_str(st), oi_last_error());
      CHECK(false);
    }
  }
}

/* The cluster tier's node-to-node messages (LEASE, RELEASE and their
 * replies; "OICL", version 1): each check the holder and the reader run
 * on what a peer sent. */
#define CL_MAGIC 0x4c43494fu
#define CL_HDR 8u
#define CL_LEASE(n) (CL_HDR + 24u + 16u * (size_t)(n))
#define CL_LEASE_REPLY(m) (CL_HDR + 16u + 24u * (size_t)(m))

static size_t cl_msg(uint8_t *b, uint16_t version, uint16_t type, uint32_t count, uint32_t pad,
                     size_t len) {
  memset(b, 0, len);
  put32(b, CL_MAGIC);
  put16(b + 4, version);
  put16(b + 6, type);
  if (type == 1 && len >= CL_HDR + 24) { /* LEASE: ns, layout, n, pad */
    put32(b + CL_HDR + 16, count);
    put32(b + CL_HDR + 20, pad);
  } else if (type == 0x81 && len >= CL_HDR + 16) { /* LEASE_REPLY: lease, m, pad */
    put32(b + CL_HDR + 8, count);
    put32(b + CL_HDR + 12, pad);
  }
  return len;
}

static void test_cluster_messages_refused(void) {
  static uint8_t b[CL_LEASE(OI_CLUSTER_MAX_LEASE + 1) + 64];
  /* Well formed: each type where it belongs. */
  CHECK_OK(oi__cluster_msg_check(b, cl_msg(b, 1, 1, 3, 0, CL_LEASE(3))));
  CHECK_OK(oi__cluster_msg_check(b, cl_msg(b, 1, 2, 0, 0, CL_HDR + 8)));
  CHECK_OK(oi__cluster_reply_check(b, cl_msg(b, 1, 0x81, 2, 0, CL_LEASE_REPLY(2))));
  CHECK_OK(oi__cluster_reply_check(b, cl_msg(b, 1, 0x82, 0, 0, CL_HDR)));
  CHECK_OK(oi__cluster_reply_check(b, cl_msg(b, 1, 0x81, 0, 0, CL_LEASE_REPLY(0))));

  CHECK_ST(oi__cluster_msg_check(NULL, 8), OI_ERR_PROTOCOL);
  CHECK_ST(oi__cluster_reply_check(NULL, 8), OI_ERR_PROTOCOL);
  CHECK_ST(oi__cluster_msg_check(b, CL_HDR - 1), OI_ERR_PROTOCOL);
  const struct {
    uint16_t version, type;
    uint32_t count, pad;
    size_t len;
    bool reply;
    const char *why;
  } bad[] = {
      {2, 1, 3, 0, CL_LEASE(3), false, "version 2"},
      {1, 1, 0, 0, CL_LEASE(0), false, "LEASE of 0"},
      {1, 1, OI_CLUSTER_MAX_LEASE + 1, 0, CL_LEASE(OI_CLUSTER_MAX_LEASE + 1), false, "LEASE of"},
      {1, 1, 3, 1, CL_LEASE(3), false, "LEASE of 3"},     /* padding not zero */
      {1, 1, 3, 0, CL_LEASE(3) + 1, false, "LEASE of 3"}, /* a byte more */
      {1, 1, 3, 0, CL_HDR + 10, false, "unexpected message type 1"},
      {1, 2, 0, 0, CL_HDR + 9, false, "unexpected message type 2"},
      {1, 0x81, 2, 0, CL_LEASE_REPLY(2), false, "unexpected message type 129"}, /* a reply */
      {1, 1, 3, 0, CL_LEASE(3), true, "unexpected message type 1"},             /* a request */
      {1, 0x81, OI_CLUSTER_MAX_LEASE + 1, 0, CL_LEASE_REPLY(0), true, "lease reply of"},
      {1, 0x81, 2, 7, CL_LEASE_REPLY(2), true, "lease reply of 2"},
      {1, 0x81, 2, 0, CL_LEASE_REPLY(3), true, "lease reply of 2"},
      {1, 0x82, 0, 0, CL_HDR + 1, true, "unexpected message type 130"},
      {1, 9, 0, 0, CL_HDR, true, "unexpected message type 9"},
  };
  for (size_t i = 0; i < OI_ARRAY_LEN(bad); i++) {
    size_t n = cl_msg(b, bad[i].version, bad[i].type, bad[i].count, bad[i].pad, bad[i].len);
    oi_status st = bad[i].reply ? oi__cluster_reply_check(b, n) : oi__cluster_msg_check(b, n);
    if (st != OI_ERR_PROTOCOL || !strstr(oi_last_error(), bad[i].why)) {
      fprintf(stderr, "message case %zu: %s (%s)\n", i, oi_status_str(st), oi_last_error());
      CHECK(false);
    }
  }
  cl_msg(b, 1, 1, 3, 0, CL_LEASE(3));
  b[1] ^= 0xff;
  CHECK_ST(oi__cluster_msg_check(b, CL_LEASE(3)), OI_ERR_PROTOCOL);
  CHECK(strstr(oi_last_error(), "bad magic"));
}

static void answer(void *ctx, const char *peer_id, const void *req, size_t len, oi_peer_reply *r) {
  OI_UNUSED(ctx);
  OI_UNUSED(peer_id);
  if (len >= 3 && memcmp(req, "BIG", 3) == 0) {
    /* Too large to send: refused, and the handler answers an error. */
    static uint8_t big[OI_PEER_MAX_MSG + 1];
    if (oi__peer_reply_set(r, big, sizeof big) == OI_ERR_INVALID_ARGUMENT)
      oi__peer_reply_status(r, OI_ERR_OUT_OF_MEMORY);
    return;
  }
  oi__peer_reply_set(r, req, len);
}

static oi_peer_net *make_net(const char *id, oi_peer_request_fn fn, int reads) {
  oi_peer_net_options o = {.listen_addr = "127.0.0.1:0",
                           .node_id = id,
                           .secret = SECRET,
                           .secret_len = 32,
                           .timeout_ms = 5000,
                           .on_request = fn,
                           .reads = reads};
  oi_peer_net *n = NULL;
  oi_status st = oi__peer_net_create(&o, &n);
  if (st) fprintf(stderr, "net %s: %s\n", id, oi_last_error());
  REQUIRE(st == OI_OK && n);
  return n;
}

static void test_addresses_and_arguments(void) {
  oi_peer_net *a = make_net("node-a", answer, OI_PEER_READS_AUTO);
  oi_peer *p = (oi_peer *)1;
  const char *bad[] = {"127.0.0.1",
                       ":80",
                       "127.0.0.1:",
                       "127.0.0.1:99999",
                       "localhost:80",
                       "127.0.0.1:8x",
                       "::1:80",
                       "1.2.3.4.5:80",
                       "300.1.1.1:80",
                       "127.0.0.1:-1",
                       "1234567890.1234567:80",
                       "127.0.0.1:99999999999999999999999"};
  for (size_t i = 0; i < OI_ARRAY_LEN(bad); i++) {
    oi_status st = oi__peer_connect(a, bad[i], &p);
    if (st != OI_ERR_INVALID_ARGUMENT || !strstr(oi_last_error(), "IP:PORT")) {
      fprintf(stderr, "address '%s': %s (%s)\n", bad[i], oi_status_str(st), oi_last_error());
      CHECK(false);
    }
  }
  CHECK_ST(oi__peer_connect(a, NULL, &p), OI_ERR_INVALID_ARGUMENT);
  CHECK_ST(oi__peer_connect(NULL, "127.0.0.1:1", &p), OI_ERR_INVALID_ARGUMENT);
  CHECK_ST(oi__peer_connect(a, "127.0.0.1:1", NULL), OI_ERR_INVALID_ARGUMENT);

  /* Registrations: empty, then twice. */
  static uint8_t region[8192];
  CHECK_ST(oi__peer_net_register(a, NULL, 4096), OI_ERR_INVALID_ARGUMENT);
  CHECK_ST(oi__peer_net_register(a, region, 0), OI_ERR_INVALID_ARGUMENT);
  CHECK_ST(oi__peer_net_register(NULL, region, 4096), OI_ERR_INVALID_ARGUMENT);
  CHECK_OK(oi__peer_net_register(a, region, sizeof region));
  CHECK_ST(oi__peer_net_register(a, region, sizeof region), OI_ERR_STATE);

  /* Calls, sends and gets without what they need. */
  void *rep = NULL;
  size_t rl = 0;
  CHECK_ST(oi__peer_call(NULL, "x", 1, &rep, &rl, 0), OI_ERR_INVALID_ARGUMENT);
  CHECK_ST(oi__peer_send(NULL, "x", 1, 0), OI_ERR_INVALID_ARGUMENT);
  oi_peer_net *b = make_net("node-b", answer, OI_PEER_READS_AUTO);
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%u", oi__peer_net_port(a));
  p = NULL;
  REQUIRE(oi__peer_connect(b, addr, &p) == OI_OK && p);
  CHECK(oi__peer_region_len(p) == sizeof region);
  CHECK_ST(oi__peer_call(p, NULL, 4, &rep, &rl, 0), OI_ERR_INVALID_ARGUMENT);
  CHECK_ST(oi__peer_call(p, "x", 1, NULL, &rl, 0), OI_ERR_INVALID_ARGUMENT);
  CHECK_ST(oi__peer_call(p, "x", 1, &rep, NULL, 0), OI_ERR_INVALID_ARGUMENT);
  CHECK_ST(oi__peer_send(p, NULL, 4, 0), OI_ERR_INVALID_ARGUMENT);
  CHECK_ST(oi__peer_send(p, "x", OI_PEER_MAX_MSG + 1, 0), OI_ERR_INVALID_ARGUMENT);
  uint8_t dst[64];
  oi_peer_read r = {.remote_offset = 0, .len = sizeof dst, .local_dst = dst};
  CHECK_ST(oi__peer_get(NULL, &r, 1, 0), OI_ERR_INVALID_ARGUMENT);
  CHECK_ST(oi__peer_get(p, NULL, 1, 0), OI_ERR_INVALID_ARGUMENT);
  CHECK_ST(oi__peer_get(p, &r, (size_t)OI_PEER_MAX_READS + 1, 0), OI_ERR_INVALID_ARGUMENT);
  oi_peer_read nodst = {.remote_offset = 0, .len = 8, .local_dst = NULL};
  CHECK_ST(oi__peer_get(p, &nodst, 1, 0), OI_ERR_INVALID_ARGUMENT);
  CHECK(strstr(oi_last_error(), "no destination"));
  CHECK_OK(oi__peer_get(p, &r, 0, 0)); /* nothing to read */

  /* A reply too large for the wire: the handler's error reaches the
   * caller; the connection still answers. */
  CHECK_ST(oi__peer_call(p, "BIG", 3, &rep, &rl, 0), OI_ERR_OUT_OF_MEMORY);
  CHECK_OK(oi__peer_call(p, "ok", 2, &rep, &rl, 0));
  CHECK(rl == 2 && memcmp(rep, "ok", 2) == 0);
  oi__free(rep);
  oi__peer_close(p);
  oi__peer_close(NULL);
  oi__peer_net_destroy(b);
  oi__peer_net_destroy(a);
  oi__peer_net_destroy(NULL);
}

static void test_no_handler(void) {
  /* A net without on_request answers every call OI_ERR_UNSUPPORTED. */
  oi_peer_net *a = make_net("node-a", NULL, OI_PEER_READS_AUTO);
  oi_peer_net *b = make_net("node-b", answer, OI_PEER_READS_AUTO);
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%u", oi__peer_net_port(a));
  oi_peer *p = NULL;
  REQUIRE(oi__peer_connect(b, addr, &p) == OI_OK);
  void *rep = (void *)1;
  size_t rl = 7;
  CHECK_ST(oi__peer_call(p, "hello", 5, &rep, &rl, 0), OI_ERR_UNSUPPORTED);
  CHECK(strstr(oi_last_error(), "node-a"));
  oi_peer_stats s;
  oi__peer_net_stats(a, &s);
  CHECK(s.served == 1);
  oi__peer_net_destroy(b);
  oi__peer_net_destroy(a);
}

static void test_listen_refused(void) {
  /* An address of no interface here (TEST-NET-1): the listener fails. */
  oi_peer_net_options o = {
      .listen_addr = "192.0.2.1:0", .node_id = "x", .secret = SECRET, .secret_len = 32};
  oi_peer_net *n = (oi_peer_net *)1;
  oi_status st = oi__peer_net_create(&o, &n);
  CHECK(st == OI_ERR_IO);
  CHECK(strstr(oi_last_error(), "192.0.2.1"));
  /* A node id over the limit; a secret over the limit. */
  char longid[OI_PEER_MAX_NODE_ID + 2];
  memset(longid, 'n', sizeof longid - 1);
  longid[sizeof longid - 1] = '\0';
  o.listen_addr = "127.0.0.1:0";
  o.node_id = longid;
  CHECK_ST(oi__peer_net_create(&o, &n), OI_ERR_INVALID_ARGUMENT);
  o.node_id = "x";
  o.secret_len = OI_PEER_MAX_SECRET + 1;
  CHECK_ST(oi__peer_net_create(&o, &n), OI_ERR_INVALID_ARGUMENT);
  CHECK_ST(oi__peer_net_create(NULL, &n), OI_ERR_INVALID_ARGUMENT);
  /* No node id; no secret. */
  o.secret_len = 32;
  o.node_id = NULL;
  CHECK_ST(oi__peer_net_create(&o, &n), OI_ERR_INVALID_ARGUMENT);
  CHECK(strstr(oi_last_error(), "node id of 0 bytes"));
  o.node_id = "x";
  o.secret = NULL;
  CHECK_ST(oi__peer_net_create(&o, &n), OI_ERR_INVALID_ARGUMENT);
  CHECK(strstr(oi_last_error(), "a secret of 0 bytes"));
  /* No net: port 0, stats all zero. */
  CHECK(oi__peer_net_port(NULL) == 0);
  oi_peer_stats s;
  memset(&s, 0x5a, sizeof s);
  oi__peer_net_stats(NULL, &s);
  CHECK(s.accepted == 0 && s.calls == 0 && s.bytes_served == 0);
}

static void test_no_listener(void) {
  /* A net without a listen address: port 0, nobody can dial it, and it
   * dials out, calls and destroys cleanly. */
  oi_peer_net_options o = {.node_id = "dialer", .secret = SECRET, .secret_len = 32};
  oi_peer_net *d = NULL;
  REQUIRE(oi__peer_net_create(&o, &d) == OI_OK && d);
  CHECK(oi__peer_net_port(d) == 0);
  oi_peer_net *a = make_net("node-a", answer, OI_PEER_READS_AUTO);
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%u", oi__peer_net_port(a));
  oi_peer *p = NULL;
  REQUIRE(oi__peer_connect(d, addr, &p) == OI_OK && p);
  void *rep = NULL;
  size_t rl = 0;
  CHECK_OK(oi__peer_call(p, "hi", 2, &rep, &rl, 0));
  CHECK(rl == 2 && memcmp(rep, "hi", 2) == 0);
  oi__free(rep);
  oi__peer_net_destroy(d);
  oi__peer_net_destroy(a);
}

static void test_restart_reuses_the_port(void) {
  /* A connection the net closed first leaves its port in TIME_WAIT (as a
   * node that crashed or stopped does): a new net listens there at once
   * (SO_REUSEADDR on the node's own listener) and serves. */
  oi_peer_net *a = make_net("node-a", answer, OI_PEER_READS_AUTO);
  uint16_t port = oi__peer_net_port(a);
  struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons(port)};
  inet_pton(AF_INET, "127.0.0.1", &sin.sin_addr);
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0 && connect(fd, (struct sockaddr *)&sin, sizeof sin) == 0);
  struct timespec ts = {0, 200000000};
  nanosleep(&ts, NULL); /* accepted by UCX */
  oi__peer_net_destroy(a);
  nanosleep(&ts, NULL);
  close(fd); /* the net's side is now in TIME_WAIT */
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%u", port);
  oi_peer_net_options o = {.listen_addr = addr,
                           .node_id = "node-a2",
                           .secret = SECRET,
                           .secret_len = 32,
                           .timeout_ms = 2000,
                           .on_request = answer};
  oi_peer_net *b = NULL;
  CHECK_OK(oi__peer_net_create(&o, &b));
  if (!b) return;
  CHECK(oi__peer_net_port(b) == port);
  oi_peer_net *d = make_net("dialer", answer, OI_PEER_READS_AUTO);
  oi_peer *p = NULL;
  CHECK_OK(oi__peer_connect(d, addr, &p));
  if (p) {
    void *rep = NULL;
    size_t rl = 0;
    CHECK_OK(oi__peer_call(p, "hi", 2, &rep, &rl, 0));
    CHECK(rl == 2 && rep && memcmp(rep, "hi", 2) == 0);
    oi__free(rep);
    oi__peer_close(p);
  }
  oi__peer_net_destroy(d);
  oi__peer_net_destroy(b);
}

static void test_reads_by_environment(void) {
  /* OI_PEER_READS=am: the holder serves reads itself, byte-exact. */
  setenv("OI_PEER_READS", "am", 1);
  oi_peer_net *a = make_net("node-a", answer, OI_PEER_READS_AUTO);
  oi_peer_net *b = make_net("node-b", answer, OI_PEER_READS_AUTO);
  static uint8_t region[1 << 16];
  for (size_t i = 0; i < sizeof region; i++)
    region[i] = (uint8_t)(i * 7 + 3);
  CHECK_OK(oi__peer_net_register(a, region, sizeof region));
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%u", oi__peer_net_port(a));
  oi_peer *p = NULL;
  REQUIRE(oi__peer_connect(b, addr, &p) == OI_OK);
  uint8_t dst[3][1000];
  memset(dst, 0, sizeof dst);
  oi_peer_read r[3] = {
      {0, 1000, dst[0]}, {5000, 1000, dst[1]}, {sizeof region - 1000, 1000, dst[2]}};
  CHECK_OK(oi__peer_get(p, r, 3, 0));
  for (int k = 0; k < 3; k++)
    CHECK(memcmp(dst[k], region + r[k].remote_offset, 1000) == 0);
  /* Past the region: refused before anything is issued. */
  oi_peer_read past = {sizeof region - 10, 11, dst[0]};
  CHECK_ST(oi__peer_get(p, &past, 1, 0), OI_ERR_INVALID_ARGUMENT);
  oi__peer_net_destroy(b);
  oi__peer_net_destroy(a);
  /* (Unset once no net runs: a net's thread reads UCX_* variables while
   * it makes a worker, and unsetenv may move them.) */
  unsetenv("OI_PEER_READS");
}

/* ---- a raw UCX client that breaks the protocol before authenticating ---- */

typedef struct raw_client {
  ucp_context_h ctx;
  ucp_worker_h w;
  ucp_ep_h ep;
  atomic_int failed; /* the server dropped the connection */
  unsigned last_id;  /* the last message the server sent, and its bytes */
  uint8_t last[256];
  size_t last_len, last_hlen;
  uint8_t last_hdr[16];
} raw_client;

static void raw_err(void *arg, ucp_ep_h ep, ucs_status_t st) {
  OI_UNUSED(ep);
  OI_UNUSED(st);
  atomic_store(&((raw_client *)arg)->failed, 1);
}

typedef struct raw_arg {
  raw_client *r;
  unsigned id;
} raw_arg;
static raw_arg raw_args[16];

static ucs_status_t raw_drop(void *arg, const void *header, size_t header_length, void *data,
                             size_t length, const ucp_am_recv_param_t *param) {
  OI_UNUSED(param);
  raw_arg *a = arg;
  if (a && a->r) { /* kept for the test to read */
    a->r->last_id = a->id;
    a->r->last_len = length;
    a->r->last_hlen = header_length;
    if (data) memcpy(a->r->last, data, OI_MIN(length, sizeof a->r->last));
    if (header) memcpy(a->r->last_hdr, header, OI_MIN(header_length, sizeof a->r->last_hdr));
  }
  return UCS_OK;
}

static void raw_progress(raw_client *r, unsigned ms) {
  uint64_t end = oi__now_ns() + (uint64_t)ms * 1000000ull;
  while (oi__now_ns() < end) {
    oi__ucx.ucp_worker_progress(r->w);
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
}

/* A raw UCX worker with an endpoint to the worker at `addr` (the server's,
 * from the TCP handshake); *mine: this worker's address (release it with
 * ucp_worker_release_address). */
static void raw_open(raw_client *r, const uint8_t *addr, ucp_address_t **mine, size_t *mine_len) {
  memset(r, 0, sizeof *r);
  ucp_config_t *cfg = NULL;
  REQUIRE(oi__ucx.ucp_config_read(NULL, NULL, &cfg) == UCS_OK);
  ucp_params_t up = {.field_mask = UCP_PARAM_FIELD_FEATURES, .features = UCP_FEATURE_AM};
  REQUIRE(oi__ucx.ucp_init_version(UCP_API_MAJOR, UCP_API_MINOR, &up, cfg, &r->ctx) == UCS_OK);
  oi__ucx.ucp_config_release(cfg);
  ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                            .thread_mode = UCS_THREAD_MODE_SINGLE};
  REQUIRE(oi__ucx.ucp_worker_create(r->ctx, &wp, &r->w) == UCS_OK);
  for (unsigned id = 1; id < 16; id++) { /* whatever the server answers: dropped */
    ucp_am_handler_param_t hp = {
        .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                      UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG,
        .id = id,
        .flags = UCP_AM_FLAG_WHOLE_MSG,
        .cb = raw_drop,
        .arg = &raw_args[id]};
    raw_args[id] = (raw_arg){r, id};
    REQUIRE(oi__ucx.ucp_worker_set_am_recv_handler(r->w, &hp) == UCS_OK);
  }
  REQUIRE(oi__ucx.ucp_worker_get_address(r->w, mine, mine_len) == UCS_OK);
  ucp_ep_params_t ep = {
      .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER,
      .address = (const ucp_address_t *)addr,
      .err_mode = UCP_ERR_HANDLING_MODE_PEER,
      .err_handler = {.cb = raw_err, .arg = r},
  };
  REQUIRE(oi__ucx.ucp_ep_create(r->w, &ep, &r->ep) == UCS_OK);
}

/* Sends one active message (the receiver learns the ep: REPLY flag). */
static void raw_send(raw_client *r, unsigned id, const void *hdr, size_t hl, const void *d,
                     size_t len) {
  ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                            .flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER};
  ucs_status_ptr_t q = oi__ucx.ucp_am_send_nbx(r->ep, id, hdr, hl, d, len, &rp);
  if (UCS_PTR_IS_PTR(q)) {
    for (int i = 0; i < 2000 && oi__ucx.ucp_request_check_status(q) == UCS_INPROGRESS; i++)
      raw_progress(r, 1);
    oi__ucx.ucp_request_free(q);
  }
}

static void raw_close(raw_client *r) {
  ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                            .flags = UCP_EP_CLOSE_FLAG_FORCE};
  ucs_status_ptr_t q = oi__ucx.ucp_ep_close_nbx(r->ep, &rp);
  if (UCS_PTR_IS_PTR(q)) {
    for (int i = 0; i < 2000 && oi__ucx.ucp_request_check_status(q) == UCS_INPROGRESS; i++)
      raw_progress(r, 1);
    oi__ucx.ucp_request_free(q);
  }
  oi__ucx.ucp_worker_destroy(r->w);
  oi__ucx.ucp_cleanup(r->ctx);
}

/* Waits up to 3 s for the server's `refused` count to reach `want`. */
static bool refused_soon(oi_peer_net *n, uint64_t want) {
  for (int i = 0; i < 300; i++) {
    oi_peer_stats s;
    oi__peer_net_stats(n, &s);
    if (s.refused >= want) return true;
    struct timespec ts = {0, 10000000};
    nanosleep(&ts, NULL);
  }
  return false;
}

/* Plain TCP clients that break the handshake (peer_wire.h's frames): each
 * is refused and closed by the server, which then serves a real peer. */
static void test_raw_client_breaks_the_protocol(void) {
  oi_peer_net_options o = {.listen_addr = "127.0.0.1:0",
                           .node_id = "server",
                           .secret = SECRET,
                           .secret_len = 32,
                           .timeout_ms = 300,
                           .on_request = answer};
  oi_peer_net *srv = NULL;
  REQUIRE(oi__peer_net_create(&o, &srv) == OI_OK);
  uint16_t port = oi__peer_net_port(srv);
  uint8_t hello[OI_PEER_HELLO_FIXED + 16];
  size_t hl = make_hello(hello, 1, "raw", 3);
  enum { REQ_FIRST, AUTH_FIRST, HELLO_HUGE, HELLO_V2, NOTHING, AUTH_SHORT, AUTH_BAD_MAC, NCASES };
  static const char *const what[] = {"a request before any handshake (out of turn)",
                                     "an AUTH before the HELLO (out of turn)",
                                     "a HELLO frame claiming 1 MiB (over the frame limit)",
                                     "a HELLO of another protocol version",
                                     "nothing at all (no handshake within the timeout)",
                                     "a HELLO, then an AUTH a byte short",
                                     "a HELLO, then an AUTH whose MAC proves no secret"};
  for (int c = 0; c < NCASES; c++) {
    int fd = ptu_dial(port);
    REQUIRE(fd >= 0);
    uint8_t b[256];
    uint32_t kind = 0;
    bool refused_frame = true;
    switch (c) {
    case REQ_FIRST: ptu_send_frame(fd, OI_PEER_AM_REQ, hello, hl); break;
    case AUTH_FIRST: ptu_send_frame(fd, OI_PEER_AM_AUTH, hello, 4 + OI_PEER_MAC_LEN); break;
    case HELLO_HUGE:
      put32(b, OI_PEER_AM_HELLO);
      put32(b + 4, 1u << 20);
      ptu_send_raw(fd, b, 8);
      ptu_send_raw(fd, hello, hl);
      break;
    case HELLO_V2: {
      size_t n = make_hello(b, 2, "raw", 3);
      ptu_send_frame(fd, OI_PEER_AM_HELLO, b, n);
      break;
    }
    case NOTHING: break;
    default: {
      ptu_send_frame(fd, OI_PEER_AM_HELLO, hello, hl);
      CHECK(ptu_recv_frame(fd, &kind, b, sizeof b) > 0 && kind == OI_PEER_AM_CHALLENGE);
      uint8_t auth[4 + OI_PEER_MAC_LEN];
      put32(auth, OI_PEER_MAGIC);
      memset(auth + 4, 0, OI_PEER_MAC_LEN);
      ptu_send_frame(fd, OI_PEER_AM_AUTH, auth, c == AUTH_SHORT ? sizeof auth - 1 : sizeof auth);
      if (c == AUTH_BAD_MAC) /* told why, then closed */
        refused_frame = ptu_recv_frame(fd, &kind, b, sizeof b) == 4 && kind == OI_PEER_AM_REFUSE;
      break;
    }
    }
    bool closed = ptu_closed_within(fd, 3000);
    close(fd);
    if (!closed || !refused_frame || !refused_soon(srv, (uint64_t)c + 1)) {
      fprintf(stderr, "the server did not refuse %s\n", what[c]);
      CHECK(false);
    }
  }
  oi_peer_stats s;
  oi__peer_net_stats(srv, &s);
  CHECK(s.refused == NCASES);
  CHECK(s.accepted == 0);
  /* And it still serves a real peer. */
  oi_peer_net *cl = make_net("client", answer, OI_PEER_READS_AUTO);
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%u", port);
  oi_peer *p = NULL;
  CHECK_OK(oi__peer_connect(cl, addr, &p));
  void *rep = NULL;
  size_t rl = 0;
  CHECK_OK(oi__peer_call(p, "still", 5, &rep, &rl, 0));
  CHECK(rl == 5);
  oi__free(rep);
  oi__peer_net_destroy(cl);
  oi__peer_net_destroy(srv);
}

/* Waits up to 2 s for the server's message `id`. */
static bool raw_wait(raw_client *r, unsigned id) {
  for (int i = 0; i < 200 && r->last_id != id; i++)
    raw_progress(r, 10);
  return r->last_id == id;
}

/* A raw client that authenticates properly (the handshake's MAC computed
 * here), then misbehaves: a request too short, a read message of the wrong
 * length, a read outside the region, a reply sent the wrong way. */
static void test_raw_client_after_authenticating(void) {
  static uint8_t region[8192];
  oi_peer_net_options o = {.listen_addr = "127.0.0.1:0",
                           .node_id = "server",
                           .secret = SECRET,
                           .secret_len = 32,
                           .timeout_ms = 2000,
                           .on_request = answer,
                           .reads = OI_PEER_READS_AM};
  oi_peer_net *srv = NULL;
  REQUIRE(oi__peer_net_create(&o, &srv) == OI_OK);
  REQUIRE(oi__peer_net_register(srv, region, sizeof region) == OI_OK);
  uint16_t port = oi__peer_net_port(srv);
  enum { GOOD, SHORT_REQ, BAD_READ_LEN, READ_OUTSIDE, WRONG_WAY, NCASES };
  for (int c = 0; c < NCASES; c++) {
    /* The handshake over TCP (its MAC computed here), then the worker
     * addresses swapped and READY. */
    raw_client r;
    static uint8_t saddr[OI_PEER_MAX_FRAME];
    int fd = ptu_dial(port);
    REQUIRE(fd >= 0);
    long sl = ptu_client_auth(fd, SECRET, 32, "raw", saddr, NULL);
    REQUIRE(sl > 0);
    ucp_address_t *mine = NULL;
    size_t ml = 0;
    raw_open(&r, saddr, &mine, &ml);
    REQUIRE(ptu_send_frame(fd, OI_PEER_FR_ADDR, mine, ml));
    oi__ucx.ucp_worker_release_address(r.w, mine);
    uint32_t kind = 0;
    uint8_t rb[8];
    REQUIRE(ptu_recv_frame(fd, &kind, rb, sizeof rb) == 0 && kind == OI_PEER_FR_READY);
    close(fd);
    oi_peer_stats s0;
    oi__peer_net_stats(srv, &s0);
    uint8_t msg[64];
    memset(msg, 0, sizeof msg);
    bool dropped = false;
    switch (c) {
    case GOOD: /* a request: answered (echoed), the connection kept */
      put64(msg, 77);
      memcpy(msg + 8, "ping", 4);
      raw_send(&r, 6, NULL, 0, msg, 12);
      CHECK(raw_wait(&r, 7) && r.last_len == 12 + 4 && memcmp(r.last + 12, "ping", 4) == 0);
      break;
    case SHORT_REQ:
      raw_send(&r, 6, NULL, 0, msg, 4);
      dropped = true;
      break;
    case BAD_READ_LEN:
      raw_send(&r, 8, NULL, 0, msg, 31);
      dropped = true;
      break;
    case READ_OUTSIDE: /* answered with a refusal, counted, the connection kept */
      put64(msg, 5);
      put64(msg + 16, sizeof region - 4);
      put64(msg + 24, 8);
      raw_send(&r, 8, NULL, 0, msg, 32);
      CHECK(raw_wait(&r, 9) && r.last_hlen == 16 && r.last_len == 0);
      CHECK((int32_t)(r.last_hdr[12] | r.last_hdr[13] << 8 | r.last_hdr[14] << 16 |
                      (uint32_t)r.last_hdr[15] << 24) == OI_ERR_INVALID_ARGUMENT);
      break;
    case WRONG_WAY: /* a reply from the side that does not call */
      raw_send(&r, 7, NULL, 0, msg, 12);
      dropped = true;
      break;
    }
    for (int i = 0; i < 200 && dropped && !atomic_load(&r.failed); i++)
      raw_progress(&r, 10);
    if (atomic_load(&r.failed) != (int)dropped) {
      fprintf(stderr, "case %d: the connection was %s\n", c, dropped ? "kept" : "dropped");
      CHECK(false);
    }
    oi_peer_stats s1;
    oi__peer_net_stats(srv, &s1);
    if (c == READ_OUTSIDE || c == WRONG_WAY) CHECK(s1.bad_messages > s0.bad_messages);
    raw_close(&r);
  }
  oi_peer_stats s;
  oi__peer_net_stats(srv, &s);
  CHECK(s.accepted == NCASES);
  oi__peer_net_destroy(srv);
}

int main(void) {
  RUN_TEST(test_hello_refused);
  RUN_TEST(test_auth_refused);
  RUN_TEST(test_welcome_refused);
  RUN_TEST(test_cluster_messages_refused);
  if (oi__ucx_load() != OI_OK) TEST_SKIP("UCX is not installed");
  RUN_TEST(test_addresses_and_arguments);
  RUN_TEST(test_no_handler);
  RUN_TEST(test_listen_refused);
  RUN_TEST(test_no_listener);
  RUN_TEST(test_restart_reuses_the_port);
  RUN_TEST(test_reads_by_environment);
  RUN_TEST(test_raw_client_breaks_the_protocol);
  RUN_TEST(test_raw_client_after_authenticating);
  TEST_EXIT();
}
