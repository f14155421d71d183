/* The peer handshake's TCP side as the tests speak it raw (peer_wire.h:
 * frames of kind (4), length (4), payload, little-endian): blocking sockets
 * with a 3 s timeout each way, frames sent and read, a client's HELLO and
 * AUTH built from the shared secret, and a raw UCX worker whose endpoint is
 * made from a worker address the other side sent. */
#ifndef OI_TEST_CLUSTER_PEER_TCP_UTIL_H
#define OI_TEST_CLUSTER_PEER_TCP_UTIL_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "cluster/peer_wire.h"
#include "cluster/sha256.h"
#include "core/le_bytes.h"

static inline void ptu_timeouts(int fd, unsigned ms) {
  struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* A blocking connection to 127.0.0.1:port (-1 on failure). */
static inline int ptu_dial(uint16_t port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons(port)};
  sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr *)&sin, sizeof sin)) {
    close(fd);
    return -1;
  }
  ptu_timeouts(fd, 3000);
  return fd;
}

static inline bool ptu_send_raw(int fd, const void *b, size_t len) {
  const uint8_t *p = b;
  while (len) {
    ssize_t w = send(fd, p, len, MSG_NOSIGNAL);
    if (w <= 0) {
      if (w < 0 && errno == EINTR) continue;
      return false;
    }
    p += w;
    len -= (size_t)w;
  }
  return true;
}

static inline bool ptu_recv_raw(int fd, void *b, size_t len) {
  uint8_t *p = b;
  while (len) {
    ssize_t r = recv(fd, p, len, 0);
    if (r <= 0) {
      if (r < 0 && errno == EINTR) continue;
      return false;
    }
    p += r;
    len -= (size_t)r;
  }
  return true;
}

/* A frame's bytes in one buffer (b: at least OI_PEER_FRAME_HDR + len). */
static inline size_t ptu_frame(uint8_t *b, uint32_t kind, const void *p, size_t len) {
  put32(b, kind);
  put32(b + 4, (uint32_t)len);
  if (len) memcpy(b + OI_PEER_FRAME_HDR, p, len);
  return OI_PEER_FRAME_HDR + len;
}

static inline bool ptu_send_frame(int fd, uint32_t kind, const void *p, size_t len) {
  uint8_t h[OI_PEER_FRAME_HDR];
  put32(h, kind);
  put32(h + 4, (uint32_t)len);
  return ptu_send_raw(fd, h, sizeof h) && (!len || ptu_send_raw(fd, p, len));
}

/* Reads a frame: its length, or -1 (closed, timed out, larger than cap). */
static inline long ptu_recv_frame(int fd, uint32_t *kind, uint8_t *buf, size_t cap) {
  uint8_t h[OI_PEER_FRAME_HDR];
  if (!ptu_recv_raw(fd, h, sizeof h)) return -1;
  uint32_t n = get32(h + 4);
  *kind = get32(h);
  if (n > cap || (n && !ptu_recv_raw(fd, buf, n))) return -1;
  return (long)n;
}

/* Did the other side close (EOF or reset) within ms? Whatever it sent
 * first is read and dropped. */
static inline bool ptu_closed_within(int fd, unsigned ms) {
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (;;) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    long el = (t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000;
    if (el >= (long)ms) return false;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, (int)(ms - (unsigned long)el)) <= 0) continue;
    uint8_t b[512];
    ssize_t r = recv(fd, b, sizeof b, MSG_DONTWAIT);
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) return true;
  }
}

/* HELLO / CHALLENGE payload: magic, version, id length, nonce (32 x 0x11), id. */
static inline size_t ptu_hello(uint8_t *b, uint16_t version, const char *id) {
  uint16_t idl = (uint16_t)strlen(id);
  put32(b, OI_PEER_MAGIC);
  put16(b + 4, version);
  put16(b + 6, idl);
  memset(b + 8, 0x11, OI_PEER_NONCE);
  memcpy(b + OI_PEER_HELLO_FIXED, id, idl);
  return OI_PEER_HELLO_FIXED + idl;
}

/* The handshake MAC (peer_wire.c): HMAC(secret, label || client nonce ||
 * server nonce || client id || server id), ids length-prefixed. */
static inline void ptu_mac(const uint8_t *secret, size_t slen, bool client_proof,
                           const uint8_t nc[OI_PEER_NONCE], const uint8_t ns[OI_PEER_NONCE],
                           const char *cid, const char *sid, uint8_t out[OI_PEER_MAC_LEN]) {
  static const char client_label[] = "openinfer peer v1 client";
  static const char server_label[] = "openinfer peer v1 server";
  uint8_t lc = (uint8_t)strlen(cid), ls = (uint8_t)strlen(sid);
  oi_hmac_sha256 h;
  oi__hmac_sha256_init(&h, secret, slen);
  if (client_proof)
    oi__hmac_sha256_update(&h, client_label, sizeof client_label);
  else
    oi__hmac_sha256_update(&h, server_label, sizeof server_label);
  oi__hmac_sha256_update(&h, nc, OI_PEER_NONCE);
  oi__hmac_sha256_update(&h, ns, OI_PEER_NONCE);
  oi__hmac_sha256_update(&h, &lc, 1);
  oi__hmac_sha256_update(&h, cid, lc);
  oi__hmac_sha256_update(&h, &ls, 1);
  oi__hmac_sha256_update(&h, sid, ls);
  oi__hmac_sha256_final(&h, out);
}

/* A client's handshake as id `cid` up to the server's worker address
 * (addr: OI_PEER_MAX_FRAME bytes; its length returned, -1 on any failure;
 * the WELCOME's payload in welcome[OI_PEER_WELCOME_FIXED + OI_PEER_MAX_RKEY]
 * when not NULL). */
static inline long ptu_client_auth(int fd, const uint8_t *secret, size_t slen, const char *cid,
                                   uint8_t *addr, uint8_t *welcome) {
  static uint8_t b[OI_PEER_MAX_FRAME];
  size_t n = ptu_hello(b, OI_PEER_VERSION, cid);
  uint8_t nc[OI_PEER_NONCE], ns[OI_PEER_NONCE];
  memcpy(nc, b + 8, OI_PEER_NONCE);
  uint32_t kind = 0;
  if (!ptu_send_frame(fd, OI_PEER_AM_HELLO, b, n)) return -1;
  long got = ptu_recv_frame(fd, &kind, b, sizeof b);
  if (got < (long)OI_PEER_HELLO_FIXED || kind != OI_PEER_AM_CHALLENGE) return -1;
  memcpy(ns, b + 8, OI_PEER_NONCE);
  char sid[OI_PEER_MAX_NODE_ID + 1];
  size_t sl = (size_t)got - OI_PEER_HELLO_FIXED;
  memcpy(sid, b + OI_PEER_HELLO_FIXED, sl);
  sid[sl] = 0;
  uint8_t auth[4 + OI_PEER_MAC_LEN];
  put32(auth, OI_PEER_MAGIC);
  ptu_mac(secret, slen, true, nc, ns, cid, sid, auth + 4);
  if (!ptu_send_frame(fd, OI_PEER_AM_AUTH, auth, sizeof auth)) return -1;
  got = ptu_recv_frame(fd, &kind, b, sizeof b);
  if (got < (long)OI_PEER_WELCOME_FIXED || kind != OI_PEER_AM_WELCOME) return -1;
  if (welcome) memcpy(welcome, b, (size_t)got);
  got = ptu_recv_frame(fd, &kind, addr, OI_PEER_MAX_FRAME);
  if (got <= 0 || kind != OI_PEER_FR_ADDR) return -1;
  return got;
}

#endif
