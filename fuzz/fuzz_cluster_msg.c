/* The cluster tier's parsers of what another node or Redis sends
 * (lib/cluster, docs/cluster.md): the node-to-node requests as a holder
 * checks them (LEASE, RELEASE) and the replies as a reader checks them
 * (LEASE_REPLY, RELEASE_REPLY); the peer handshake's HELLO / CHALLENGE,
 * AUTH and WELCOME; a directory entry's value "<node_id> <epoch>" and a
 * node's liveness value "<epoch> <address>". Every parser runs on the whole
 * input, copied to a buffer of exactly its size (so AddressSanitizer sees a
 * read past it). Parsing must never crash; what a parser accepts must have
 * the exact form it promises, and the reads the code does after accepting
 * (the hashes of a LEASE, every block of a LEASE_REPLY, the region key of a
 * WELCOME) are made here too, within the message. A parser that refuses
 * says why (oi_last_error) and leaves its outputs alone.
 *
 * The messages' layouts (little-endian) are restated here from
 * docs/cluster.md: tier messages are magic "OICL", version 1, type (u16),
 * then LEASE: ns_fp, layout_fp, n (u32), 0 (u32), n hashes of 16 bytes;
 * RELEASE: lease id; LEASE_REPLY: lease id, m (u32), 0 (u32), m blocks of
 * offset, length, XXH3 (u64 each); RELEASE_REPLY: nothing. */
#include <errno.h>

#include "cluster/directory.h"
#include "cluster/peer.h"
#include "cluster/peer_wire.h"
#include "cluster/tier.h"
#include "fuzz_util.h"

#define TIER_MAGIC 0x4c43494fu

static uint16_t le16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t le32(const uint8_t *p) { return le16(p) | (uint32_t)le16(p + 2) << 16; }
static uint64_t le64(const uint8_t *p) { return le32(p) | (uint64_t)le32(p + 4) << 32; }

static volatile uint64_t sink; /* the walks' reads are kept */

/* A refusal says why. */
static void refused(oi_status st, const char *what) {
  FZ_ASSERT(st != OI_OK, "%s", what);
  FZ_ASSERT(oi_last_error()[0] != '\0', "%s refused (%s) without a message", what,
            oi_status_str(st));
  oi_clear_error();
}

static void tier_request(const uint8_t *m, size_t len) {
  oi_status st = oi__cluster_msg_check(m, len);
  if (st != OI_OK) {
    FZ_ASSERT(st == OI_ERR_PROTOCOL, "request: %s", oi_status_str(st));
    refused(st, "request");
    return;
  }
  FZ_ASSERT(len >= 8 && le32(m) == TIER_MAGIC && le16(m + 4) == 1, "request header");
  uint16_t type = le16(m + 6);
  if (type == 1) { /* LEASE: answer_lease reads ns_fp, layout_fp, n and n hashes */
    FZ_ASSERT(len >= 32, "LEASE of %zu bytes", len);
    uint32_t n = le32(m + 24);
    FZ_ASSERT(n >= 1 && n <= OI_CLUSTER_MAX_LEASE && le32(m + 28) == 0, "LEASE of %u hashes", n);
    FZ_ASSERT(len == 32 + 16 * (size_t)n, "LEASE of %u hashes in %zu bytes", n, len);
    uint64_t acc = le64(m + 8) ^ le64(m + 16);
    for (uint32_t i = 0; i < n; i++)
      acc += le64(m + 32 + 16 * (size_t)i) ^ le64(m + 40 + 16 * (size_t)i);
    sink = acc;
  } else {
    FZ_ASSERT(type == 2 && len == 16, "request type %u of %zu bytes accepted", type, len);
    sink = le64(m + 8); /* the lease id */
  }
  FZ_ASSERT(oi__cluster_reply_check(m, len) != OI_OK, "a request passes as a reply");
  oi_clear_error();
}

static void tier_reply(const uint8_t *m, size_t len) {
  oi_status st = oi__cluster_reply_check(m, len);
  if (st != OI_OK) {
    FZ_ASSERT(st == OI_ERR_PROTOCOL, "reply: %s", oi_status_str(st));
    refused(st, "reply");
    return;
  }
  FZ_ASSERT(len >= 8 && le32(m) == TIER_MAGIC && le16(m + 4) == 1, "reply header");
  uint16_t type = le16(m + 6);
  if (type == 0x81) { /* LEASE_REPLY: fetch_from reads the id, m and m blocks */
    FZ_ASSERT(len >= 24, "LEASE_REPLY of %zu bytes", len);
    uint64_t acc = le64(m + 8);
    uint32_t n = le32(m + 16);
    FZ_ASSERT(n <= OI_CLUSTER_MAX_LEASE && le32(m + 20) == 0, "LEASE_REPLY of %u blocks", n);
    FZ_ASSERT(len == 24 + 24 * (size_t)n, "LEASE_REPLY of %u blocks in %zu bytes", n, len);
    for (uint32_t i = 0; i < n; i++) {
      const uint8_t *e = m + 24 + 24 * (size_t)i;
      acc += le64(e) ^ le64(e + 8) ^ le64(e + 16);
    }
    sink = acc;
  } else {
    FZ_ASSERT(type == 0x82 && len == 8, "reply type %u of %zu bytes accepted", type, len);
  }
  FZ_ASSERT(oi__cluster_msg_check(m, len) != OI_OK, "a reply passes as a request");
  oi_clear_error();
}

static void hello(const uint8_t *d, size_t len) {
  uint8_t nonce[OI_PEER_NONCE];
  char id[OI_PEER_MAX_NODE_ID + 1];
  size_t id_len = 7777;
  memset(nonce, 0xA5, sizeof nonce);
  memset(id, 0x5A, sizeof id);
  oi_status st = oi__peer_parse_hello(d, len, nonce, id, &id_len);
  if (st != OI_OK) {
    FZ_ASSERT(st == OI_ERR_PROTOCOL || st == OI_ERR_VERSION, "hello: %s", oi_status_str(st));
    for (size_t i = 0; i < sizeof nonce; i++)
      FZ_ASSERT(nonce[i] == 0xA5, "a refused hello wrote the nonce");
    for (size_t i = 0; i < sizeof id; i++)
      FZ_ASSERT(id[i] == 0x5A, "a refused hello wrote the node id");
    FZ_ASSERT(id_len == 7777, "a refused hello wrote the id length");
    refused(st, "hello");
    return;
  }
  FZ_ASSERT(len >= OI_PEER_HELLO_FIXED && le32(d) == OI_PEER_MAGIC && le16(d + 4) == 1,
            "hello header");
  FZ_ASSERT(id_len >= 1 && id_len <= OI_PEER_MAX_NODE_ID, "a node id of %zu bytes", id_len);
  FZ_ASSERT(id_len == le16(d + 6) && len == OI_PEER_HELLO_FIXED + id_len,
            "a node id of %zu bytes in a hello of %zu", id_len, len);
  FZ_ASSERT(strlen(id) == id_len, "the node id holds a NUL or is not terminated");
  FZ_ASSERT(!memcmp(id, d + OI_PEER_HELLO_FIXED, id_len), "the node id is not the message's");
  FZ_ASSERT(!memcmp(nonce, d + 8, OI_PEER_NONCE), "the nonce is not the message's");
}

static void auth(const uint8_t *d, size_t len) {
  const uint8_t *mac = NULL;
  oi_status st = oi__peer_parse_auth(d, len, &mac);
  if (st != OI_OK) {
    FZ_ASSERT(st == OI_ERR_PROTOCOL && !mac, "auth: %s", oi_status_str(st));
    refused(st, "auth");
    return;
  }
  FZ_ASSERT(len == 4 + OI_PEER_MAC_LEN && le32(d) == OI_PEER_MAGIC && mac == d + 4,
            "auth of %zu bytes", len);
  uint64_t acc = 0;
  for (size_t i = 0; i < OI_PEER_MAC_LEN; i++)
    acc += mac[i];
  sink = acc;
}

/* want: NULL, the message's own MAC, or one that differs from it. */
static oi_status welcome(const uint8_t *d, size_t len, const uint8_t *want) {
  oi_peer_welcome w;
  memset(&w, 0x5A, sizeof w);
  oi_status st = oi__peer_parse_welcome(d, len, want, &w);
  if (st != OI_OK) {
    FZ_ASSERT(st == OI_ERR_PROTOCOL || (st == OI_ERR_PERMISSION && want), "welcome: %s",
              oi_status_str(st));
    const uint8_t *b = (const uint8_t *)&w;
    for (size_t i = 0; i < sizeof w; i++)
      FZ_ASSERT(b[i] == 0x5A, "a refused welcome wrote its output");
    refused(st, "welcome");
    return st;
  }
  FZ_ASSERT(len >= OI_PEER_WELCOME_FIXED && le32(d) == OI_PEER_MAGIC, "welcome of %zu bytes", len);
  FZ_ASSERT(w.mac == d + 4, "the MAC is not the message's");
  FZ_ASSERT(!want || !memcmp(want, w.mac, OI_PEER_MAC_LEN), "a welcome with another MAC passed");
  FZ_ASSERT(w.rkey_len <= OI_PEER_MAX_RKEY && len == OI_PEER_WELCOME_FIXED + (size_t)w.rkey_len &&
                w.rkey == d + OI_PEER_WELCOME_FIXED,
            "a key of %u bytes in a welcome of %zu", w.rkey_len, len);
  FZ_ASSERT(w.flags <= 1 && (w.flags == 1) == (w.rkey_len > 0), "flags %u with a key of %u bytes",
            w.flags, w.rkey_len);
  FZ_ASSERT(w.base + w.len >= w.base, "the region wraps");
  FZ_ASSERT(w.base == le64(d + 36) && w.len == le64(d + 44), "the region is not the message's");
  uint64_t acc = 0;
  for (uint32_t i = 0; i < w.rkey_len; i++)
    acc += w.rkey[i];
  sink = acc;
  return st;
}

static bool node_char(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '-';
}

/* Digits s[0..n) as the independent reading: strtoull over a copy. */
static bool digits_value(const char *s, size_t n, uint64_t *v) {
  if (n == 0 || n > 20) return false;
  char buf[32];
  for (size_t i = 0; i < n; i++)
    if (s[i] < '0' || s[i] > '9') return false;
  memcpy(buf, s, n);
  buf[n] = '\0';
  errno = 0;
  unsigned long long x = strtoull(buf, NULL, 10);
  if (errno == ERANGE) return false;
  *v = x;
  return true;
}

static void holder(const char *s, size_t len) {
  oi_dir_holder h;
  memset(&h, 0x5A, sizeof h);
  if (!oi__dir_holder_parse(s, len, &h)) {
    const uint8_t *b = (const uint8_t *)&h;
    for (size_t i = 0; i < sizeof h; i++)
      FZ_ASSERT(b[i] == 0x5A, "a refused entry wrote its output");
    return;
  }
  size_t n = strnlen(h.node_id, sizeof h.node_id);
  FZ_ASSERT(n >= 1 && n <= OI_DIR_NODE_ID_MAX, "a node id of %zu bytes", n);
  for (size_t i = 0; i < n; i++)
    FZ_ASSERT(node_char(h.node_id[i]), "node id byte 0x%02x", (unsigned char)h.node_id[i]);
  FZ_ASSERT(len > n + 1 && !memcmp(s, h.node_id, n) && s[n] == ' ',
            "not '<node_id> <epoch> <expiry> <mac>'");
  const char *sp = memchr(s + n + 1, ' ', len - n - 1);
  FZ_ASSERT(sp != NULL, "no expiry after the epoch");
  uint64_t e = 0, x = 0;
  FZ_ASSERT(digits_value(s + n + 1, (size_t)(sp - s) - n - 1, &e) && e == h.epoch,
            "the epoch %llu is not the entry's", (unsigned long long)h.epoch);
  FZ_ASSERT(len == (size_t)(sp - s) + 1 + (len - (size_t)(sp - s) - 34) + 33 &&
                digits_value(sp + 1, len - (size_t)(sp - s) - 34, &x) && x == h.expiry_ms &&
                s[len - 33] == ' ',
            "the expiry %llu is not the entry's", (unsigned long long)h.expiry_ms);
}

static void liveness(const char *s, size_t len) {
  uint64_t epoch = 7777;
  size_t off = 7777, alen = 7777;
  if (!oi__dir_liveness_parse(s, len, &epoch, &off, &alen, NULL, NULL)) {
    FZ_ASSERT(epoch == 7777 && off == 7777 && alen == 7777, "a refused value wrote its output");
    return;
  }
  FZ_ASSERT(off >= 2 && s[off - 1] == ' ' && off + alen + 35 <= len && s[off + alen] == ' ' &&
                s[len - 33] == ' ',
            "address at %zu, %zu bytes of %zu", off, alen, len);
  uint64_t e = 0;
  FZ_ASSERT(digits_value(s, off - 1, &e) && e == epoch, "the epoch is not the value's");
  FZ_ASSERT(alen >= 1 && alen <= OI_DIR_ADDR_MAX, "an address of %zu bytes", alen);
  for (size_t i = 0; i < alen; i++)
    FZ_ASSERT(s[off + i] > 0x20 && s[off + i] < 0x7f, "address byte 0x%02x",
              (unsigned char)s[off + i]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static bool quiet;
  if (!quiet) {
    oi_set_log_level(OI_LOG_ERROR);
    quiet = true;
  }
  /* Exactly `size` bytes on the heap: a read past the message is caught. */
  uint8_t *m = malloc(size ? size : 1);
  FZ_ASSERT(m, "oom");
  if (size) memcpy(m, data, size);
  oi_clear_error();
  tier_request(m, size);
  tier_reply(m, size);
  hello(m, size);
  auth(m, size);
  oi_status plain = welcome(m, size, NULL);
  if (size >= 4 + OI_PEER_MAC_LEN) {
    uint8_t mac[OI_PEER_MAC_LEN];
    memcpy(mac, m + 4, sizeof mac);
    FZ_ASSERT(welcome(m, size, mac) == plain, "its own MAC changes the welcome's verdict");
    mac[size % OI_PEER_MAC_LEN] ^= 1;
    oi_status other = welcome(m, size, mac);
    FZ_ASSERT(other == (size >= OI_PEER_WELCOME_FIXED && le32(m) == OI_PEER_MAGIC
                            ? OI_ERR_PERMISSION
                            : OI_ERR_PROTOCOL),
              "a welcome with another MAC: %s", oi_status_str(other));
  }
  holder((const char *)m, size);
  liveness((const char *)m, size);
  free(m);
  return 0;
}
