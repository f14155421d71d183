/* The peer transport's TCP side: the node's own listener and the handshake
 * over a plain socket (peer_wire.h gives the frames), both sides. No byte a
 * peer sends reaches UCX before it proved the cluster secret: UCX's
 * sockaddr listener is not used; UCX endpoints are made from the worker
 * addresses the two sides swap once authenticated. See peer_internal.h. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cluster/peer_internal.h"

#define POLL_SLICE_MS 100 /* a handshake looks at the net's stop this often */

static bool stopping(const oi_peer_net *net) {
  return atomic_load_explicit(&net->stop_req, memory_order_acquire);
}

/* Waits until fd is ready for `ev`, the deadline passes or the net stops. */
static oi_status io_wait(const oi_peer_net *net, int fd, short ev, uint64_t deadline) {
  for (;;) {
    if (stopping(net)) return oi__fail(OI_ERR_CLOSED, "the net is shutting down");
    uint32_t ms = oi__ms_until(deadline);
    if (ms == 0) return oi__fail(OI_ERR_TIMEOUT, "no handshake within %u ms", net->timeout_ms);
    struct pollfd p = {.fd = fd, .events = ev};
    int n = poll(&p, 1, (int)OI_MIN(ms, (uint32_t)POLL_SLICE_MS));
    if (n < 0 && errno != EINTR) return oi__fail(OI_ERR_IO, "poll: %s", strerror(errno));
    if (n > 0) return OI_OK;
  }
}

static oi_status send_all(const oi_peer_net *net, int fd, const uint8_t *b, size_t len,
                          uint64_t deadline) {
  while (len) {
    ssize_t w = send(fd, b, len, MSG_NOSIGNAL);
    if (w > 0) {
      b += w;
      len -= (size_t)w;
    } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      oi_status st = io_wait(net, fd, POLLOUT, deadline);
      if (st) return st;
    } else if (!(w < 0 && errno == EINTR)) {
      return oi__fail(OI_ERR_IO, "sending: %s", w < 0 ? strerror(errno) : "nothing sent");
    }
  }
  return OI_OK;
}

static oi_status recv_all(const oi_peer_net *net, int fd, uint8_t *b, size_t len,
                          uint64_t deadline) {
  while (len) {
    ssize_t r = recv(fd, b, len, 0);
    if (r > 0) {
      b += r;
      len -= (size_t)r;
    } else if (r == 0) {
      return oi__fail(OI_ERR_CLOSED, "the connection closed during the handshake");
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      oi_status st = io_wait(net, fd, POLLIN, deadline);
      if (st) return st;
    } else if (errno != EINTR) {
      return oi__fail(OI_ERR_IO, "receiving: %s", strerror(errno));
    }
  }
  return OI_OK;
}

static oi_status send_frame(const oi_peer_net *net, int fd, unsigned kind, const void *payload,
                            size_t len, uint64_t deadline) {
  uint8_t *b = oi__malloc(OI_PEER_FRAME_HDR + len);
  if (!b) return oi__fail(OI_ERR_OUT_OF_MEMORY, "no memory for a handshake frame");
  put32(b, kind);
  put32(b + 4, (uint32_t)len);
  if (len) memcpy(b + OI_PEER_FRAME_HDR, payload, len);
  oi_status st = send_all(net, fd, b, OI_PEER_FRAME_HDR + len, deadline);
  oi__free(b);
  return st;
}

/* Reads one frame of kind `want` (or `alt`, when not 0) of at most `cap`
 * bytes into buf; anything else fails before its payload is read. */
static oi_status recv_frame(const oi_peer_net *net, int fd, unsigned want, unsigned alt,
                            uint8_t *buf, size_t cap, size_t *len, unsigned *kind,
                            uint64_t deadline) {
  uint8_t h[OI_PEER_FRAME_HDR];
  oi_status st = recv_all(net, fd, h, sizeof h, deadline);
  if (st) return st;
  unsigned k = get32(h);
  uint32_t n = get32(h + 4);
  if (k != want && (!alt || k != alt))
    return oi__fail(OI_ERR_PROTOCOL, "handshake frame of kind %u out of turn (expected %u)", k,
                    want);
  if (n > cap)
    return oi__fail(OI_ERR_PROTOCOL, "handshake frame of kind %u has %u bytes (at most %zu)", k, n,
                    cap);
  st = recv_all(net, fd, buf, n, deadline);
  if (st) return st;
  *len = n;
  if (kind) *kind = k;
  return OI_OK;
}

/* HELLO and CHALLENGE share a layout: magic, version, id length, nonce, id. */
static size_t build_hello(const oi_peer_net *net, const oi_peer *p, uint8_t *b) {
  put32(b, OI_PEER_MAGIC);
  put16(b + 4, OI_PEER_VERSION);
  put16(b + 6, net->id_len);
  memcpy(b + 8, p->nonce_mine, NONCE);
  memcpy(b + OI_PEER_HELLO_FIXED, net->node_id, net->id_len);
  return OI_PEER_HELLO_FIXED + net->id_len;
}

static oi_status fresh_nonce(oi_peer *p) {
  if (getrandom(p->nonce_mine, NONCE, 0) != (ssize_t)NONCE)
    return oi__fail(OI_ERR_IO, "getrandom: %s", strerror(errno));
  return OI_OK;
}

static void set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* ---- server ---- */

#define REFUSALS_LOGGED 10 /* a second, at most: a flood of junk is not a flood of lines */

/* Logs a refusal: at most REFUSALS_LOGGED lines a second, then one line
 * saying how many were not logged (every refusal is counted all the
 * same). */
static void log_refusal(oi_peer_net *net, const char *addr, const char *why) {
  uint64_t now = oi__now_ns(), dropped = 0;
  pthread_mutex_lock(&net->lock);
  if (now - net->refusal_window_ns >= 1000000000ull) {
    dropped = net->refusals_dropped;
    net->refusal_window_ns = now;
    net->refusals_logged = net->refusals_dropped = 0;
  }
  bool log = net->refusals_logged < REFUSALS_LOGGED;
  if (log)
    net->refusals_logged++;
  else
    net->refusals_dropped++;
  pthread_mutex_unlock(&net->lock);
  if (dropped)
    OI_LOG(OI_LOG_WARN, "peer", "%llu more refused connections not logged in the last second",
           (unsigned long long)dropped);
  if (log) OI_LOG(OI_LOG_WARN, "peer", "refused %s: %s", addr, why);
}

typedef struct hs {
  oi_peer_net *net;
  int fd;
  char addr[64];
} hs;

static void hs_done(oi_peer_net *net) {
  pthread_mutex_lock(&net->lock);
  net->hs_threads--;
  pthread_cond_broadcast(&net->cond);
  pthread_mutex_unlock(&net->lock);
}

/* Asks the progress thread for op `kind` on p (OP_WORKER: *addr, *alen get
 * the connection's worker address, oi__free it; OP_ACCEPT: addr is the
 * client's). */
static oi_status submit_peer_op(oi_peer_net *net, int kind, oi_peer *p, uint8_t **addr,
                                size_t *alen) {
  op *o = oi__peer_op_new(kind);
  if (!o) return oi__fail(OI_ERR_OUT_OF_MEMORY, "no memory");
  o->peer = p;
  if (kind == OP_ACCEPT) {
    o->raddr = *addr; /* the caller's; not freed with the op */
    o->raddr_len = *alen;
  }
  oi_status st = oi__peer_submit(net, o);
  o->raddr = NULL;
  if (st) {
    oi__fail(st, "%s", o->err);
  } else if (kind == OP_WORKER) {
    *addr = o->reply;
    *alen = o->reply_len;
    o->reply = NULL;
  }
  oi__peer_op_unref(o);
  return st;
}

/* The server's side of one handshake; on OI_OK the connection exists (the
 * progress thread made its worker and endpoint). *linked: p is in the
 * net's list (the progress thread's from then on); *counted: the refusal
 * is counted already. */
static oi_status serve_handshake(oi_peer_net *net, int fd, oi_peer *p, uint8_t *buf, bool *linked,
                                 bool *counted) {
  uint64_t deadline = oi__deadline_ns(net->timeout_ms);
  size_t len = 0;
  oi_status st = recv_frame(net, fd, OI_PEER_AM_HELLO, 0, buf,
                            OI_PEER_HELLO_FIXED + OI_PEER_MAX_NODE_ID, &len, NULL, deadline);
  if (st) return st;
  size_t idl = 0;
  st = oi__peer_parse_hello(buf, len, p->nonce_theirs, p->id, &idl);
  if (st) return st;
  p->id_len = (uint8_t)idl;
  if ((st = fresh_nonce(p))) return st;
  len = build_hello(net, p, buf);
  st = send_frame(net, fd, OI_PEER_AM_CHALLENGE, buf, len, deadline);
  if (st) return st;
  st = recv_frame(net, fd, OI_PEER_AM_AUTH, 0, buf, 4 + OI_SHA256_LEN, &len, NULL, deadline);
  if (st) return st;
  const uint8_t *mac = NULL;
  if ((st = oi__peer_parse_auth(buf, len, &mac))) return st;
  uint8_t want[OI_SHA256_LEN];
  oi__peer_handshake_mac(net, p, true, want);
  if (!oi__ct_equal(want, mac, OI_SHA256_LEN)) {
    /* Counted before the client is told why (it may look at once). */
    STAT_ADD(net, refused, 1);
    *counted = true;
    uint8_t r[4];
    put32(r, OI_PEER_MAGIC);
    send_frame(net, fd, OI_PEER_AM_REFUSE, r, sizeof r, deadline);
    return oi__fail(OI_ERR_PERMISSION, "node \"%s\" failed to prove the cluster secret", p->id);
  }
  /* The welcome: the region as registered now (under the lock: the
   * progress thread registers it). */
  put32(buf, OI_PEER_MAGIC);
  oi__peer_handshake_mac(net, p, false, buf + 4);
  pthread_mutex_lock(&net->lock);
  put64(buf + 4 + OI_SHA256_LEN, net->base);
  put64(buf + 12 + OI_SHA256_LEN, net->len);
  put32(buf + 20 + OI_SHA256_LEN, (uint32_t)net->rkey_len);
  put32(buf + 24 + OI_SHA256_LEN, net->rkey_len ? OI_PEER_WELCOME_RMA : 0);
  if (net->rkey_len) memcpy(buf + OI_PEER_WELCOME_FIXED, net->rkey_buf, net->rkey_len);
  len = OI_PEER_WELCOME_FIXED + net->rkey_len;
  pthread_mutex_unlock(&net->lock);
  st = send_frame(net, fd, OI_PEER_AM_WELCOME, buf, len, deadline);
  if (st) return st;
  /* Authenticated both ways: the connection's worker, its address to the
   * client, the client's back, the endpoint, READY. */
  uint8_t *mine = NULL;
  size_t ml = 0;
  if ((st = submit_peer_op(net, OP_WORKER, p, &mine, &ml))) return st;
  *linked = true;
  st = send_frame(net, fd, OI_PEER_FR_ADDR, mine, ml, deadline);
  oi__free(mine);
  if (!st)
    st = recv_frame(net, fd, OI_PEER_FR_ADDR, 0, buf, OI_PEER_MAX_FRAME, &len, NULL, deadline);
  if (!st && len == 0) st = oi__fail(OI_ERR_PROTOCOL, "an empty worker address");
  if (st) {
    oi__peer_close(p); /* still the handshake's (owned) */
    return st;
  }
  char who[OI_PEER_MAX_NODE_ID + 80]; /* p is the net's once accepted: not read after */
  snprintf(who, sizeof who, "node \"%s\" from %s", p->id, p->addr);
  if ((st = submit_peer_op(net, OP_ACCEPT, p, &buf, &len))) return st;
  /* Counted before the client learns it (it may look at once); the
   * client's error on a READY lost ends the connection on both sides. */
  STAT_ADD(net, accepted, 1);
  OI_LOG(OI_LOG_INFO, "peer", "accepted %s", who);
  send_frame(net, fd, OI_PEER_FR_READY, NULL, 0, deadline);
  return OI_OK;
}

static void *serve_main(void *arg) {
  hs *h = arg;
  oi_peer_net *net = h->net;
  oi_peer *p = oi__calloc(1, sizeof(*p));
  uint8_t *buf = oi__malloc(OI_PEER_MAX_FRAME);
  oi_status st = OI_ERR_OUT_OF_MEMORY;
  bool counted = false, allocated = p && buf;
  if (allocated) {
    p->net = net;
    p->efd = -1;
    snprintf(p->addr, sizeof(p->addr), "%s", h->addr);
    bool linked = false;
    st = serve_handshake(net, h->fd, p, buf, &linked, &counted);
    if (linked) p = NULL; /* the progress thread's */
  }
  if (st != OI_OK) {
    if (!counted) STAT_ADD(net, refused, 1);
    log_refusal(net, h->addr, allocated ? oi_last_error() : "no memory");
    /* A refusal is a reset, not a FIN: nothing lingers on the port. */
    struct linger lg = {.l_onoff = 1, .l_linger = 0};
    setsockopt(h->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
  }
  close(h->fd);
  oi__free(p);
  oi__free(buf);
  oi__free(h);
  hs_done(net);
  return NULL;
}

static void *listen_main(void *arg) {
  oi_peer_net *net = arg;
  for (;;) {
    struct pollfd pf[2] = {{.fd = net->lfd, .events = POLLIN},
                           {.fd = net->lwake, .events = POLLIN}};
    int n = poll(pf, 2, -1);
    if (stopping(net)) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      OI_LOG(OI_LOG_ERROR, "peer", "listener poll: %s", strerror(errno));
      break;
    }
    if (!(pf[0].revents & POLLIN)) continue;
    struct sockaddr_storage sa;
    socklen_t sl = sizeof sa;
    int fd = accept4(net->lfd, (struct sockaddr *)&sa, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED) {
        OI_LOG(OI_LOG_WARN, "peer", "accept: %s", strerror(errno));
        struct timespec ts = {0, 10000000}; /* EMFILE and the like: not a busy loop */
        nanosleep(&ts, NULL);
      }
      continue;
    }
    char addr[64];
    oi__peer_format_addr((const struct sockaddr *)&sa, addr, sizeof addr);
    pthread_mutex_lock(&net->lock);
    bool full = net->hs_threads >= MAX_HANDSHAKES;
    if (!full) net->hs_threads++;
    pthread_mutex_unlock(&net->lock);
    hs *h = full ? NULL : oi__calloc(1, sizeof(*h));
    pthread_t t;
    pthread_attr_t at;
    bool started = false;
    if (h) {
      h->net = net;
      h->fd = fd;
      snprintf(h->addr, sizeof h->addr, "%s", addr);
      set_nodelay(fd);
      pthread_attr_init(&at);
      pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
      pthread_attr_setstacksize(&at, 256 * 1024);
      started = pthread_create(&t, &at, serve_main, h) == 0;
      pthread_attr_destroy(&at);
    }
    if (!started) {
      STAT_ADD(net, refused, 1);
      log_refusal(net, addr,
                  full ? "too many connections authenticating" : "no memory or thread for it");
      close(fd);
      oi__free(h);
      if (!full) hs_done(net);
    }
  }
  return NULL;
}

oi_status oi__peer_listen(oi_peer_net *net, const struct sockaddr_in *sin) {
  net->lwake = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (net->lwake < 0) return oi__fail(OI_ERR_IO, "peer: eventfd: %s", strerror(errno));
  net->lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (net->lfd < 0) return oi__fail(OI_ERR_IO, "peer: socket: %s", strerror(errno));
  /* A node restarted after a crash or a stop listens again at once, not
   * after the connections it left in TIME_WAIT are gone (about 60 s). */
  int one = 1;
  setsockopt(net->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  char a[64];
  oi__peer_format_addr((const struct sockaddr *)sin, a, sizeof a);
  if (bind(net->lfd, (const struct sockaddr *)sin, sizeof *sin) || listen(net->lfd, 128))
    return oi__fail(OI_ERR_IO, "peer: listening on %s: %s", a, strerror(errno));
  struct sockaddr_in got;
  socklen_t gl = sizeof got;
  if (getsockname(net->lfd, (struct sockaddr *)&got, &gl))
    return oi__fail(OI_ERR_IO, "peer: getsockname: %s", strerror(errno));
  net->port = ntohs(got.sin_port);
  int rc = pthread_create(&net->lthread, NULL, listen_main, net);
  if (rc) return oi__fail(OI_ERR_INTERNAL, "peer: starting the listener thread: %s", strerror(rc));
  net->lthread_started = true;
  return OI_OK;
}

/* Stops the listener and waits for the handshakes in flight (each sees
 * stop_req within POLL_SLICE_MS). stop_req is set. */
void oi__peer_listen_stop(oi_peer_net *net) {
  if (net->lthread_started) {
    uint64_t one = 1;
    ssize_t w = write(net->lwake, &one, sizeof one);
    OI_UNUSED(w);
    pthread_join(net->lthread, NULL);
    net->lthread_started = false;
  }
  pthread_mutex_lock(&net->lock);
  while (net->hs_threads)
    pthread_cond_wait(&net->cond, &net->lock);
  pthread_mutex_unlock(&net->lock);
  if (net->lfd >= 0) close(net->lfd);
  if (net->lwake >= 0) close(net->lwake);
  net->lfd = net->lwake = -1;
}

/* ---- client ---- */

static oi_status tcp_dial(oi_peer_net *net, const struct sockaddr_in *sin, uint64_t deadline,
                          int *out) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return oi__fail(OI_ERR_IO, "socket: %s", strerror(errno));
  set_nodelay(fd);
  if (connect(fd, (const struct sockaddr *)sin, sizeof *sin) && errno != EINPROGRESS) {
    oi_status st = oi__fail(OI_ERR_IO, "connecting: %s", strerror(errno));
    close(fd);
    return st;
  }
  oi_status st = io_wait(net, fd, POLLOUT, deadline);
  int err = 0;
  socklen_t el = sizeof err;
  if (!st && (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) || err))
    st = oi__fail(OI_ERR_IO, "connecting: %s", strerror(err ? err : errno));
  if (st) {
    close(fd);
    return st;
  }
  *out = fd;
  return OI_OK;
}

/* The client's side up to the holder's worker address; then the progress
 * thread makes this connection's worker and endpoint (OP_CONNECT), and the
 * client sends its address and waits for READY. */
static oi_status client_handshake(oi_peer_net *net, int fd, oi_peer *p, uint8_t *buf,
                                  uint64_t deadline) {
  size_t len = build_hello(net, p, buf);
  oi_status st = send_frame(net, fd, OI_PEER_AM_HELLO, buf, len, deadline);
  if (!st)
    st = recv_frame(net, fd, OI_PEER_AM_CHALLENGE, 0, buf,
                    OI_PEER_HELLO_FIXED + OI_PEER_MAX_NODE_ID, &len, NULL, deadline);
  if (st) return st;
  size_t idl = 0;
  if ((st = oi__peer_parse_hello(buf, len, p->nonce_theirs, p->id, &idl))) return st;
  p->id_len = (uint8_t)idl;
  put32(buf, OI_PEER_MAGIC);
  oi__peer_handshake_mac(net, p, true, buf + 4);
  st = send_frame(net, fd, OI_PEER_AM_AUTH, buf, 4 + OI_SHA256_LEN, deadline);
  unsigned kind = 0;
  if (!st)
    st = recv_frame(net, fd, OI_PEER_AM_WELCOME, OI_PEER_AM_REFUSE, buf,
                    OI_PEER_WELCOME_FIXED + MAX_RKEY, &len, &kind, deadline);
  if (st) return st;
  if (kind == OI_PEER_AM_REFUSE)
    return oi__fail(OI_ERR_PERMISSION, "refused: this node's secret is not the peer's");
  uint8_t want[OI_SHA256_LEN];
  oi__peer_handshake_mac(net, p, false, want);
  oi_peer_welcome w;
  st = oi__peer_parse_welcome(buf, len, want, &w);
  if (st == OI_ERR_PERMISSION)
    return oi__fail(OI_ERR_PERMISSION, "node \"%s\" failed to prove the cluster secret", p->id);
  if (st) return st;
  p->rbase = w.base;
  p->rlen = w.len;
  p->rma = w.rkey_len && net->rma_serve;
  return OI_OK;
}

oi_status oi__peer_tcp_connect(oi_peer_net *net, const struct sockaddr_in *sin, oi_peer **out) {
  uint64_t deadline = oi__deadline_ns(net->timeout_ms);
  oi_peer *p = oi__calloc(1, sizeof(*p));
  uint8_t *buf = oi__malloc(OI_PEER_MAX_FRAME);
  uint8_t *rkey = NULL, *haddr = NULL;
  int fd = -1;
  bool linked = false;
  oi_status st;
  if (!p || !buf) {
    st = oi__fail(OI_ERR_OUT_OF_MEMORY, "no memory for a connection");
    goto out;
  }
  p->net = net;
  p->outbound = true;
  p->efd = -1;
  oi__peer_format_addr((const struct sockaddr *)sin, p->addr, sizeof(p->addr));
  if ((st = fresh_nonce(p)) || (st = tcp_dial(net, sin, deadline, &fd)) ||
      (st = client_handshake(net, fd, p, buf, deadline)))
    goto out;
  /* The region key: copied out of buf before the next frame reuses it. */
  size_t klen = 0, alen = 0;
  if (p->rma) {
    oi_peer_welcome w;
    oi__peer_parse_welcome(buf, OI_PEER_WELCOME_FIXED + get32(buf + 20 + OI_SHA256_LEN), NULL, &w);
    klen = w.rkey_len;
    rkey = oi__malloc(klen);
    if (!rkey) {
      st = oi__fail(OI_ERR_OUT_OF_MEMORY, "no memory");
      goto out;
    }
    memcpy(rkey, w.rkey, klen);
  }
  st = recv_frame(net, fd, OI_PEER_FR_ADDR, 0, buf, OI_PEER_MAX_FRAME, &alen, NULL, deadline);
  if (st) goto out;
  if (alen == 0) {
    st = oi__fail(OI_ERR_PROTOCOL, "an empty worker address");
    goto out;
  }
  op *o = oi__peer_op_new(OP_CONNECT);
  if (!o) {
    st = oi__fail(OI_ERR_OUT_OF_MEMORY, "no memory");
    goto out;
  }
  o->peer = p;
  o->raddr = buf;
  o->raddr_len = alen;
  o->rkey_in = rkey;
  o->rkey_in_len = klen;
  st = oi__peer_submit(net, o);
  o->raddr = o->rkey_in = NULL;
  if (st) {
    oi__fail(st, "%s", o->err);
  } else {
    linked = true; /* the thread's list holds p now */
    haddr = o->reply;
    alen = o->reply_len;
    o->reply = NULL;
  }
  oi__peer_op_unref(o);
  if (st) goto out;
  st = send_frame(net, fd, OI_PEER_FR_ADDR, haddr, alen, deadline);
  size_t rl = 0;
  if (!st) st = recv_frame(net, fd, OI_PEER_FR_READY, 0, buf, 0, &rl, NULL, deadline);
out:
  if (fd >= 0) close(fd);
  oi__free(buf);
  oi__free(rkey);
  oi__free(haddr);
  if (st) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s", oi_last_error());
    STAT_ADD(net, connect_fails, 1);
    OI_LOG(OI_LOG_WARN, "peer", "connecting to %s: %s", p ? p->addr : "?", msg);
    if (linked)
      oi__peer_close(p);
    else
      oi__free(p);
    char a[64] = "?";
    oi__peer_format_addr((const struct sockaddr *)sin, a, sizeof a);
    return oi__fail(st, "peer %s: %s", a, msg);
  }
  STAT_ADD(net, connected, 1);
  OI_LOG(OI_LOG_INFO, "peer", "connected to node \"%s\" at %s (region %llu bytes, %s reads)", p->id,
         p->addr, (unsigned long long)p->rlen, p->rma ? "one-sided" : "served");
  *out = p;
  return OI_OK;
}
