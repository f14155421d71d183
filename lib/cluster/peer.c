/* The peer transport: see peer.h and docs/cluster.md, "Peer transport".
 *
 * One progress thread per net makes every UCX call (the worker is created
 * UCS_THREAD_MODE_SINGLE). Callers build an `op`, queue it under `lock`,
 * wake the thread through an eventfd and sleep on `cond` until the thread
 * marks it done. The thread's loop: run the queued ops, progress the worker,
 * scan the active ops (finish the ready ones, enforce deadlines), close and
 * free dead connections, then arm the worker and sleep in epoll on the
 * worker's fd and the eventfd.
 *
 * Connections (oi_peer) live in the net's list and are touched only by the
 * progress thread, except the fields set before a connect returns (node id,
 * region), which the caller reads afterwards. */
#include "cluster/peer.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "cluster/sha256.h"
#include "cluster/ucx.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the peer messages are little-endian; this build writes them natively"
#endif

/* Active message ids. */
enum {
  AM_HELLO = 1,
  AM_CHALLENGE,
  AM_AUTH,
  AM_WELCOME,
  AM_REFUSE,
  AM_REQ,
  AM_REP,
  AM_READ, /* a read served by the holder's CPU (no native RMA: see get_cb) */
  AM_DATA, /* its bytes: the header says which read; the data is the payload */
  AM_LAST
};

#define MAGIC 0x5250494fu /* "OIPR" */
#define VERSION 1u
#define NONCE OI_PEER_NONCE
#define MAX_RKEY OI_PEER_MAX_RKEY
#define MAX_HANDSHAKES 256u /* inbound connections still authenticating */
#define HELLO_FIXED (4 + 2 + 2 + NONCE)
#define WELCOME_FIXED (4 + OI_SHA256_LEN + 8 + 8 + 4 + 4)
#define WELCOME_RMA 1u /* flag: the holder serves one-sided reads (rkey follows) */
#define READ_LEN 32    /* get id, read index, pad, offset, length */
#define DATA_HDR 16    /* get id, read index, status */
#define REQ_FIXED 8
#define REP_FIXED 12
#define IDLE_WAIT_MS 100
#define SHUTDOWN_MS 5000
#define OI_PEER_TCP_SEG "256k" /* UCX TCP segment size (see oi__peer_net_create) */
_Static_assert(OI_PEER_MAC_LEN == OI_SHA256_LEN, "the handshake MAC is an HMAC-SHA256");

enum { P_CONNECTING = 1, P_WAIT_HELLO, P_WAIT_AUTH, P_WAIT_WELCOME, P_READY, P_DEAD };
enum { OP_CONNECT = 1, OP_CALL, OP_GET, OP_CLOSE, OP_REGISTER, OP_ANSWER };

typedef struct op op;

struct oi_peer {
  oi_peer_net *net;
  ucp_ep_h ep;
  bool outbound;
  bool owned;      /* returned to a caller: freed by oi__peer_close / destroy */
  bool need_close; /* dead, ep still to close */
  bool flush;      /* close gently (a refusal still to deliver) */
  int state;
  uint64_t deadline; /* of the handshake */
  char addr[64];     /* "IP:PORT" for messages */
  char id[OI_PEER_MAX_NODE_ID + 1];
  uint8_t id_len;
  uint8_t nonce_mine[NONCE], nonce_theirs[NONCE];
  uint64_t rbase, rlen;
  ucp_rkey_h rkey;
  uint64_t next_call, next_get;
  uint64_t serial; /* unique in the net: a deferred answer finds its connection by it */
  bool rma;        /* reads with ucp_get_nbx (else AM_READ) */
  struct oi_peer *next;
};

struct oi_peer_reply {
  void *data;
  size_t len;
  oi_status status;
  oi_peer_ticket *deferred; /* set by oi__peer_defer: on_req sends nothing */
};

/* A request answered later (oi__peer_defer): its connection, by pointer and
 * serial (the connection may be gone and its memory reused by then), and
 * the call id its answer carries. */
struct oi_peer_ticket {
  oi_peer_net *net;
  oi_peer *peer;
  uint64_t serial;
  uint8_t call_id[8];
  oi_peer_reply reply;
};

struct op {
  int kind;
  _Atomic int refs; /* the caller's and, while queued or active, the thread's */
  oi_peer *peer;
  uint64_t deadline;
  struct op *next;          /* in the queue */
  struct op *anext, *aprev; /* in the active list */
  bool ready;               /* finished on the thread's side: the scan ends it */
  bool done;                /* under net->lock: the caller may read the result */
  oi_status st;
  char err[512];
  /* connect */
  struct sockaddr_in sin;
  oi_peer *result;
  /* call */
  uint64_t call_id;
  uint8_t *msg;
  size_t msg_len;
  void *reply;
  size_t reply_len;
  /* get */
  const oi_peer_read *reads;
  size_t n, pending;
  bool issued, timed_out, am;
  ucs_status_t ucx_err;
  oi_status fail_st; /* the connection failed under it */
  uint64_t bytes;
  uint64_t get_id;     /* AM reads: the id their DATA messages carry */
  uint8_t *got;        /* AM reads: which reads' DATA arrived */
  size_t want, landed; /* AM reads: non-empty reads, reads whose bytes are in */
  /* register */
  void *base;
  size_t len;
  /* answer: msg (the framed reply) goes to the connection `peer` if it is
   * still the one with this serial */
  uint64_t serial;
};

/* A message to send once the worker's progress returns (never from inside
 * a UCX callback: see flush_outbox). */
typedef struct outmsg {
  oi_peer *p;
  unsigned id;
  uint8_t hdr[DATA_HDR];
  size_t hlen;
  void *buf;
  size_t len;
  bool owned; /* buf is oi__malloc'd */
  bool eager;
  struct outmsg *next;
} outmsg;

typedef struct am_arg {
  oi_peer_net *net;
  unsigned id;
} am_arg;

struct oi_peer_net {
  char *node_id;
  uint8_t id_len;
  uint8_t *secret;
  size_t secret_len;
  uint32_t timeout_ms;
  oi_peer_request_fn on_request;
  void *on_request_ctx;

  ucp_context_h ctx;
  ucp_worker_h worker;
  ucp_listener_h listener;
  uint16_t port;
  int efd, wakefd, epfd;
  pthread_t thread;
  bool thread_started;

  /* Registered region (the thread's). */
  ucp_mem_h memh;
  void *rkey_buf;
  size_t rkey_len;
  uint64_t base, len;
  bool rma_serve; /* offer one-sided reads (see oi_peer_reads) */
  int read_mode;

  pthread_mutex_t lock; /* guards queue, stopping, op->done, waiters */
  pthread_cond_t cond;
  op *queue, *queue_tail;
  bool stopping;
  int waiters;
  _Atomic bool stop_req; /* read by the thread without the lock */
  am_arg am_args[AM_LAST];

  /* The thread's. */
  oi_peer *peers;
  uint64_t next_serial;
  op *active;
  uint32_t handshakes;
  outmsg *out_head, *out_tail;
  void **closing; /* ep close requests in progress */
  size_t nclosing, closing_cap;

  struct {
    _Atomic uint64_t accepted, refused, connected, connect_fails, calls, served, gets, reads,
        bytes_read, errors, bad_messages, bytes_served;
  } st;
};

#define STAT_ADD(net, f, v) atomic_fetch_add_explicit(&(net)->st.f, (v), memory_order_relaxed)

/* ---- little-endian fields ---- */

static void put16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }
static void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static uint16_t get16(const uint8_t *p) {
  uint16_t v;
  memcpy(&v, p, 2);
  return v;
}
static uint32_t get32(const uint8_t *p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}
static uint64_t get64(const uint8_t *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}

static oi_status ucs_to_oi(ucs_status_t s) {
  switch (s) {
  case UCS_OK: return OI_OK;
  case UCS_ERR_NO_MEMORY: return OI_ERR_OUT_OF_MEMORY;
  case UCS_ERR_TIMED_OUT: return OI_ERR_TIMEOUT;
  case UCS_ERR_CANCELED: return OI_ERR_CLOSED;
  default: return OI_ERR_IO;
  }
}

static oi_status parse_addr(const char *addr, struct sockaddr_in *sin) {
  if (!addr) return oi__fail(OI_ERR_INVALID_ARGUMENT, "peer: no address");
  const char *colon = strrchr(addr, ':');
  char ip[INET_ADDRSTRLEN];
  if (!colon || (size_t)(colon - addr) >= sizeof(ip) || colon == addr)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "peer: address \"%s\" is not IP:PORT", addr);
  memcpy(ip, addr, (size_t)(colon - addr));
  ip[colon - addr] = 0;
  char *end;
  errno = 0;
  unsigned long port = strtoul(colon + 1, &end, 10);
  memset(sin, 0, sizeof(*sin));
  sin->sin_family = AF_INET;
  if (colon[1] == 0 || *end || errno || port > 65535 || inet_pton(AF_INET, ip, &sin->sin_addr) != 1)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "peer: address \"%s\" is not IPv4 IP:PORT", addr);
  sin->sin_port = htons((uint16_t)port);
  return OI_OK;
}

static void format_addr(const struct sockaddr *sa, char *out, size_t cap) {
  if (sa && sa->sa_family == AF_INET) {
    const struct sockaddr_in *s = (const struct sockaddr_in *)sa;
    char ip[INET_ADDRSTRLEN] = "?";
    inet_ntop(AF_INET, &s->sin_addr, ip, sizeof(ip));
    snprintf(out, cap, "%s:%u", ip, ntohs(s->sin_port));
  } else if (sa && sa->sa_family == AF_INET6) {
    const struct sockaddr_in6 *s = (const struct sockaddr_in6 *)sa;
    char ip[INET6_ADDRSTRLEN] = "?";
    inet_ntop(AF_INET6, &s->sin6_addr, ip, sizeof(ip));
    snprintf(out, cap, "[%s]:%u", ip, ntohs(s->sin6_port));
  } else {
    snprintf(out, cap, "?");
  }
}

/* ---- ops ---- */

static void op_unref(op *o) {
  if (atomic_fetch_sub_explicit(&o->refs, 1, memory_order_acq_rel) != 1) return;
  oi__free(o->msg);
  oi__free(o->reply);
  oi__free(o->got);
  oi__free(o);
}

static void op_ready(op *o, oi_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void op_ready(op *o, oi_status st, const char *fmt, ...) {
  if (o->ready) return;
  o->ready = true;
  o->st = st;
  if (fmt) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(o->err, sizeof(o->err), fmt, ap);
    va_end(ap);
  }
}

/* Hands a finished op back to its caller (the thread's reference goes). */
static void op_done(oi_peer_net *net, op *o) {
  pthread_mutex_lock(&net->lock);
  o->done = true;
  pthread_cond_broadcast(&net->cond);
  pthread_mutex_unlock(&net->lock);
  op_unref(o);
}

static void active_add(oi_peer_net *net, op *o) {
  o->aprev = NULL;
  o->anext = net->active;
  if (net->active) net->active->aprev = o;
  net->active = o;
}

static void active_del(oi_peer_net *net, op *o) {
  if (o->aprev)
    o->aprev->anext = o->anext;
  else
    net->active = o->anext;
  if (o->anext) o->anext->aprev = o->aprev;
  o->anext = o->aprev = NULL;
}

static op *op_new(int kind) {
  op *o = oi__calloc(1, sizeof(*o));
  if (!o) return NULL;
  o->kind = kind;
  atomic_init(&o->refs, 2);
  return o;
}

static void wake(oi_peer_net *net) {
  uint64_t one = 1;
  ssize_t w = write(net->wakefd, &one, sizeof(one));
  OI_UNUSED(w); /* EAGAIN: the counter is already non-zero */
}

/* Queues `o` for the thread (false: the net is stopping, nothing queued);
 * `waiter`: the caller will wait for it (counted, destroy waits for them). */
static bool enqueue_ex(oi_peer_net *net, op *o, bool waiter) {
  pthread_mutex_lock(&net->lock);
  if (net->stopping) {
    pthread_mutex_unlock(&net->lock);
    return false;
  }
  if (waiter) net->waiters++;
  o->next = NULL;
  if (net->queue_tail)
    net->queue_tail->next = o;
  else
    net->queue = o;
  net->queue_tail = o;
  pthread_mutex_unlock(&net->lock);
  wake(net);
  return true;
}

static bool enqueue(oi_peer_net *net, op *o) { return enqueue_ex(net, o, false); }

/* Queues `o` and waits until the thread is done with it; then the result is
 * the caller's (the caller still drops its reference). */
static oi_status submit(oi_peer_net *net, op *o) {
  if (!enqueue_ex(net, o, true)) {
    op_unref(o); /* the thread's reference, never taken */
    o->st = OI_ERR_CLOSED;
    snprintf(o->err, sizeof(o->err), "peer: the net is shutting down");
    return OI_ERR_CLOSED;
  }
  pthread_mutex_lock(&net->lock);
  while (!o->done)
    pthread_cond_wait(&net->cond, &net->lock);
  if (--net->waiters == 0 && net->stopping) pthread_cond_broadcast(&net->cond);
  pthread_mutex_unlock(&net->lock);
  return o->st;
}

/* ---- connections (thread) ---- */

static oi_peer *peer_by_ep(oi_peer_net *net, ucp_ep_h ep) {
  if (!ep) return NULL;
  for (oi_peer *p = net->peers; p; p = p->next)
    if (p->ep == ep && p->state != P_DEAD) return p;
  return NULL;
}

static const char *peer_name(const oi_peer *p) { return p->id_len ? p->id : p->addr; }

/* Marks `p` dead: its ep is closed after this round of progress, its
 * connect and calls end with `st`; gets end when UCX completes their reads
 * (with an error, the ep being closed). */
static void peer_fail(oi_peer *p, oi_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void peer_fail(oi_peer *p, oi_status st, const char *fmt, ...) {
  if (p->state == P_DEAD) return;
  oi_peer_net *net = p->net;
  char msg[200];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  if (!p->outbound && p->state != P_READY) {
    STAT_ADD(net, refused, 1);
    OI_LOG(OI_LOG_WARN, "peer", "refused %s: %s", p->addr, msg);
  } else if (p->outbound && p->state != P_READY) {
    STAT_ADD(net, connect_fails, 1);
    OI_LOG(OI_LOG_WARN, "peer", "connecting to %s: %s", p->addr, msg);
  } else {
    if (st != OI_ERR_CLOSED) STAT_ADD(net, errors, 1);
    OI_LOG(OI_LOG_INFO, "peer", "connection with %s (%s) ends: %s", peer_name(p), p->addr, msg);
  }
  if (!p->outbound && p->state != P_READY && net->handshakes) net->handshakes--;
  p->state = P_DEAD;
  p->need_close = p->ep != NULL;
  for (op *o = net->active; o; o = o->anext) {
    if (o->peer != p) continue;
    if (o->kind == OP_CONNECT || o->kind == OP_CALL) op_ready(o, st, "peer %s: %s", p->addr, msg);
    if (o->kind == OP_GET && !o->fail_st) {
      o->fail_st = st;
      snprintf(o->err, sizeof(o->err), "peer %s: %s", peer_name(p), msg);
    }
  }
}

static void close_ep(oi_peer_net *net, oi_peer *p) {
  if (p->rkey) {
    oi__ucx.ucp_rkey_destroy(p->rkey);
    p->rkey = NULL;
  }
  if (!p->ep) return;
  ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                             .flags = p->flush ? 0 : UCP_EP_CLOSE_FLAG_FORCE};
  ucs_status_ptr_t r = oi__ucx.ucp_ep_close_nbx(p->ep, &prm);
  p->ep = NULL;
  p->need_close = false;
  if (r == NULL || UCS_PTR_IS_ERR(r)) return;
  if (oi__grow((void **)&net->closing, &net->closing_cap, net->nclosing + 1, sizeof(void *),
               SIZE_MAX / sizeof(void *))) {
    net->closing[net->nclosing++] = r;
  } else {
    /* No room to track it: wait for it here (rare). */
    while (oi__ucx.ucp_request_check_status(r) == UCS_INPROGRESS)
      oi__ucx.ucp_worker_progress(net->worker);
    oi__ucx.ucp_request_free(r);
  }
}

static void poll_closing(oi_peer_net *net) {
  size_t j = 0;
  for (size_t i = 0; i < net->nclosing; i++) {
    if (oi__ucx.ucp_request_check_status(net->closing[i]) == UCS_INPROGRESS)
      net->closing[j++] = net->closing[i];
    else
      oi__ucx.ucp_request_free(net->closing[i]);
  }
  net->nclosing = j;
}

static bool peer_referenced(oi_peer_net *net, oi_peer *p) {
  for (op *o = net->active; o; o = o->anext)
    if (o->peer == p) return true;
  return false;
}

/* Closes the eps of dead connections; frees the dead ones nobody holds. */
static void reap(oi_peer_net *net) {
  oi_peer **pp = &net->peers;
  while (*pp) {
    oi_peer *p = *pp;
    if (p->state == P_DEAD && p->need_close) close_ep(net, p);
    if (p->state == P_DEAD && !p->owned && !p->ep && !peer_referenced(net, p)) {
      *pp = p->next;
      oi__free(p);
      continue;
    }
    pp = &p->next;
  }
  poll_closing(net);
}

static void outmsg_free(outmsg *m) {
  if (m->owned) oi__free(m->buf);
  oi__free(m);
}

static void send_cb(void *request, ucs_status_t status, void *user) {
  OI_UNUSED(status); /* a failed send shows as the ep's error */
  outmsg_free(user);
  oi__ucx.ucp_request_free(request);
}

static void queue_msg(oi_peer *p, unsigned id, const void *hdr, size_t hlen, void *buf, size_t len,
                      bool owned, bool eager) {
  oi_peer_net *net = p->net;
  outmsg *m = oi__calloc(1, sizeof(*m));
  if (!m) {
    if (owned) oi__free(buf);
    peer_fail(p, OI_ERR_OUT_OF_MEMORY, "no memory for a message");
    return;
  }
  m->p = p;
  m->id = id;
  if (hlen) memcpy(m->hdr, hdr, hlen);
  m->hlen = hlen;
  m->buf = buf;
  m->len = len;
  m->owned = owned;
  m->eager = eager;
  if (net->out_tail)
    net->out_tail->next = m;
  else
    net->out_head = m;
  net->out_tail = m;
}

/* Sends `buf` (oi__malloc'd, taken) as active message `id` on p's ep. */
static void send_msg(oi_peer *p, unsigned id, void *buf, size_t len) {
  queue_msg(p, id, NULL, 0, buf, len, true, true);
}

/* Sends the queued messages. Not from inside the worker's progress: a UCX
 * 1.13 send that meets a transport endpoint which failed in the same round
 * (before UCP marked its ep failed) aborts the process; after the progress
 * returns, UCP has marked it and the send fails cleanly. */
static void flush_outbox(oi_peer_net *net) {
  outmsg *m;
  while ((m = net->out_head)) {
    net->out_head = m->next;
    if (!net->out_head) net->out_tail = NULL;
    oi_peer *p = m->p;
    if (!p->ep || (p->state == P_DEAD && m->id != AM_REFUSE)) {
      outmsg_free(m);
      continue;
    }
    ucp_request_param_t prm = {
        .op_attr_mask =
            UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS,
        .cb.send = send_cb,
        .user_data = m,
        .flags = UCP_AM_SEND_FLAG_REPLY | (m->eager ? UCP_AM_SEND_FLAG_EAGER : 0),
    };
    ucs_status_ptr_t r = oi__ucx.ucp_am_send_nbx(p->ep, m->id, m->hlen ? m->hdr : NULL, m->hlen,
                                                 m->buf, m->len, &prm);
    if (r == NULL) {
      outmsg_free(m);
    } else if (UCS_PTR_IS_ERR(r)) {
      outmsg_free(m);
      peer_fail(p, OI_ERR_IO, "sending: %s", oi__ucx.ucs_status_string(UCS_PTR_STATUS(r)));
    }
  }
}

/* The handler's arg is the net, not the connection: an ep closed gently may
 * still report an error after its connection was freed; looked up by ep it
 * finds nothing. */
static void err_cb(void *arg, ucp_ep_h ep, ucs_status_t status) {
  oi_peer *p = peer_by_ep(arg, ep);
  if (!p) return;
  peer_fail(p, status == UCS_ERR_CANCELED ? OI_ERR_CLOSED : OI_ERR_IO, "connection lost: %s",
            oi__ucx.ucs_status_string(status));
}

/* The handshake's MAC: HMAC-SHA256(secret, label || client nonce || server
 * nonce || client id (length-prefixed) || server id). */
static void handshake_mac(const oi_peer_net *net, const oi_peer *p, bool client_proof,
                          uint8_t out[OI_SHA256_LEN]) {
  static const char client_label[] = "openinfer peer v1 client";
  static const char server_label[] = "openinfer peer v1 server";
  const uint8_t *nc = p->outbound ? p->nonce_mine : p->nonce_theirs;
  const uint8_t *ns = p->outbound ? p->nonce_theirs : p->nonce_mine;
  const char *idc = p->outbound ? net->node_id : p->id;
  uint8_t lc = p->outbound ? net->id_len : p->id_len;
  const char *ids = p->outbound ? p->id : net->node_id;
  uint8_t ls = p->outbound ? p->id_len : net->id_len;
  oi_hmac_sha256 h;
  oi__hmac_sha256_init(&h, net->secret, net->secret_len);
  if (client_proof)
    oi__hmac_sha256_update(&h, client_label, sizeof(client_label));
  else
    oi__hmac_sha256_update(&h, server_label, sizeof(server_label));
  oi__hmac_sha256_update(&h, nc, NONCE);
  oi__hmac_sha256_update(&h, ns, NONCE);
  oi__hmac_sha256_update(&h, &lc, 1);
  oi__hmac_sha256_update(&h, idc, lc);
  oi__hmac_sha256_update(&h, &ls, 1);
  oi__hmac_sha256_update(&h, ids, ls);
  oi__hmac_sha256_final(&h, out);
}

/* HELLO and CHALLENGE share a layout: magic, version, id length, nonce, id. */
static void send_hello(oi_peer *p, unsigned am) {
  oi_peer_net *net = p->net;
  size_t len = HELLO_FIXED + net->id_len;
  uint8_t *b = oi__malloc(len);
  if (!b) {
    peer_fail(p, OI_ERR_OUT_OF_MEMORY, "no memory for the handshake");
    return;
  }
  put32(b, MAGIC);
  put16(b + 4, VERSION);
  put16(b + 6, net->id_len);
  memcpy(b + 8, p->nonce_mine, NONCE);
  memcpy(b + HELLO_FIXED, net->node_id, net->id_len);
  send_msg(p, am, b, len);
}

oi_status oi__peer_parse_hello(const uint8_t *d, size_t len, uint8_t nonce[OI_PEER_NONCE],
                               char id[OI_PEER_MAX_NODE_ID + 1], size_t *id_len) {
  if (len < HELLO_FIXED)
    return oi__fail(OI_ERR_PROTOCOL, "short handshake message (%zu bytes)", len);
  if (get32(d) != MAGIC) return oi__fail(OI_ERR_PROTOCOL, "bad handshake magic 0x%08x", get32(d));
  if (get16(d + 4) != VERSION)
    return oi__fail(OI_ERR_VERSION, "peer protocol version %u, this node speaks %u", get16(d + 4),
                    VERSION);
  size_t idl = get16(d + 6);
  if (idl == 0 || idl > OI_PEER_MAX_NODE_ID || len != HELLO_FIXED + idl ||
      memchr(d + HELLO_FIXED, 0, idl))
    return oi__fail(OI_ERR_PROTOCOL, "bad node id (length %zu, message %zu bytes)", idl, len);
  memcpy(nonce, d + 8, NONCE);
  memcpy(id, d + HELLO_FIXED, idl);
  id[idl] = 0;
  *id_len = idl;
  return OI_OK;
}

static bool parse_hello(oi_peer *p, const uint8_t *d, size_t len) {
  size_t idl = 0;
  oi_status st = oi__peer_parse_hello(d, len, p->nonce_theirs, p->id, &idl);
  if (st != OI_OK) {
    peer_fail(p, st, "%s", oi_last_error());
    return false;
  }
  p->id_len = (uint8_t)idl;
  return true;
}

static bool fresh_nonce(oi_peer *p) {
  if (getrandom(p->nonce_mine, NONCE, 0) != (ssize_t)NONCE) {
    peer_fail(p, OI_ERR_IO, "getrandom: %s", strerror(errno));
    return false;
  }
  return true;
}

static void on_hello(oi_peer *p, const uint8_t *d, size_t len) {
  if (!parse_hello(p, d, len) || !fresh_nonce(p)) return;
  p->state = P_WAIT_AUTH;
  send_hello(p, AM_CHALLENGE);
}

static void on_challenge(oi_peer *p, const uint8_t *d, size_t len) {
  if (!parse_hello(p, d, len)) return;
  size_t blen = 4 + OI_SHA256_LEN;
  uint8_t *b = oi__malloc(blen);
  if (!b) {
    peer_fail(p, OI_ERR_OUT_OF_MEMORY, "no memory for the handshake");
    return;
  }
  put32(b, MAGIC);
  handshake_mac(p->net, p, true, b + 4);
  p->state = P_WAIT_WELCOME;
  send_msg(p, AM_AUTH, b, blen);
}

oi_status oi__peer_parse_auth(const uint8_t *d, size_t len, const uint8_t **mac) {
  if (len != 4 + OI_SHA256_LEN || get32(d) != MAGIC)
    return oi__fail(OI_ERR_PROTOCOL, "bad authentication message (%zu bytes)", len);
  *mac = d + 4;
  return OI_OK;
}

static void on_auth(oi_peer *p, const uint8_t *d, size_t len) {
  oi_peer_net *net = p->net;
  uint8_t want[OI_SHA256_LEN];
  const uint8_t *mac = NULL;
  oi_status st = oi__peer_parse_auth(d, len, &mac);
  if (st != OI_OK) {
    peer_fail(p, st, "%s", oi_last_error());
    return;
  }
  handshake_mac(net, p, true, want);
  if (!oi__ct_equal(want, mac, OI_SHA256_LEN)) {
    /* Tell it why, then close once that is delivered. */
    uint8_t *b = oi__malloc(4);
    if (b) {
      put32(b, MAGIC);
      send_msg(p, AM_REFUSE, b, 4);
    }
    p->flush = true;
    peer_fail(p, OI_ERR_PERMISSION, "node \"%s\" failed to prove the cluster secret", p->id);
    return;
  }
  size_t blen = WELCOME_FIXED + net->rkey_len;
  uint8_t *b = oi__malloc(blen);
  if (!b) {
    peer_fail(p, OI_ERR_OUT_OF_MEMORY, "no memory for the handshake");
    return;
  }
  put32(b, MAGIC);
  handshake_mac(net, p, false, b + 4);
  put64(b + 4 + OI_SHA256_LEN, net->base);
  put64(b + 12 + OI_SHA256_LEN, net->len);
  put32(b + 20 + OI_SHA256_LEN, (uint32_t)net->rkey_len);
  put32(b + 24 + OI_SHA256_LEN, net->rkey_len ? WELCOME_RMA : 0);
  if (net->rkey_len) memcpy(b + WELCOME_FIXED, net->rkey_buf, net->rkey_len);
  p->state = P_READY;
  if (net->handshakes) net->handshakes--;
  STAT_ADD(net, accepted, 1);
  OI_LOG(OI_LOG_INFO, "peer", "accepted node \"%s\" from %s", p->id, p->addr);
  send_msg(p, AM_WELCOME, b, blen);
}

static op *connect_op_of(oi_peer_net *net, oi_peer *p) {
  for (op *o = net->active; o; o = o->anext)
    if (o->peer == p && o->kind == OP_CONNECT) return o;
  return NULL;
}

oi_status oi__peer_parse_welcome(const uint8_t *d, size_t len,
                                 const uint8_t want_mac[OI_PEER_MAC_LEN], oi_peer_welcome *out) {
  if (len < WELCOME_FIXED || get32(d) != MAGIC)
    return oi__fail(OI_ERR_PROTOCOL, "bad welcome message (%zu bytes)", len);
  if (want_mac && !oi__ct_equal(want_mac, d + 4, OI_SHA256_LEN))
    return oi__fail(OI_ERR_PERMISSION, "the welcome's MAC does not prove the cluster secret");
  uint64_t base = get64(d + 4 + OI_SHA256_LEN), rlen = get64(d + 12 + OI_SHA256_LEN);
  uint32_t klen = get32(d + 20 + OI_SHA256_LEN), flags = get32(d + 24 + OI_SHA256_LEN);
  if (klen > MAX_RKEY || len != WELCOME_FIXED + klen || (flags & ~WELCOME_RMA) ||
      !(flags & WELCOME_RMA) != !klen || base + rlen < base)
    return oi__fail(OI_ERR_PROTOCOL, "bad region descriptor (base 0x%llx, %llu bytes, key %u)",
                    (unsigned long long)base, (unsigned long long)rlen, klen);
  *out = (oi_peer_welcome){.mac = d + 4,
                           .base = base,
                           .len = rlen,
                           .rkey = d + WELCOME_FIXED,
                           .rkey_len = klen,
                           .flags = flags};
  return OI_OK;
}

static void on_welcome(oi_peer *p, const uint8_t *d, size_t len) {
  oi_peer_net *net = p->net;
  uint8_t want[OI_SHA256_LEN];
  oi_peer_welcome w;
  /* The MAC is checked on a welcome of the right form before its region
   * descriptor is (a refusal reads as one). */
  handshake_mac(net, p, false, want);
  oi_status st = oi__peer_parse_welcome(d, len, want, &w);
  if (st == OI_ERR_PERMISSION) {
    peer_fail(p, OI_ERR_PERMISSION, "node \"%s\" failed to prove the cluster secret", p->id);
    return;
  }
  if (st != OI_OK) {
    peer_fail(p, st, "%s", oi_last_error());
    return;
  }
  uint64_t base = w.base, rlen = w.len;
  uint32_t klen = w.rkey_len;
  p->rma = klen && net->rma_serve;
  if (rlen && p->rma) {
    ucs_status_t s = oi__ucx.ucp_ep_rkey_unpack(p->ep, w.rkey, &p->rkey);
    if (s != UCS_OK) {
      p->rkey = NULL;
      peer_fail(p, OI_ERR_PROTOCOL, "unpacking the region key: %s", oi__ucx.ucs_status_string(s));
      return;
    }
  }
  p->rbase = base;
  p->rlen = rlen;
  p->state = P_READY;
  p->owned = true;
  STAT_ADD(net, connected, 1);
  OI_LOG(OI_LOG_INFO, "peer", "connected to node \"%s\" at %s (region %llu bytes, %s reads)", p->id,
         p->addr, (unsigned long long)rlen, p->rma ? "one-sided" : "served");
  op *o = connect_op_of(net, p);
  if (o) {
    o->result = p;
    op_ready(o, OI_OK, NULL);
  }
}

static void on_req(oi_peer *p, const uint8_t *d, size_t len) {
  oi_peer_net *net = p->net;
  if (len < REQ_FIXED || len - REQ_FIXED > OI_PEER_MAX_MSG) {
    peer_fail(p, OI_ERR_PROTOCOL, "bad request (%zu bytes)", len);
    return;
  }
  oi_peer_reply r = {.status = OI_OK};
  oi_peer_ticket ctx = {.net = net, .peer = p, .serial = p->serial};
  memcpy(ctx.call_id, d, 8);
  r.deferred = &ctx; /* the ticket oi__peer_defer copies */
  if (net->on_request)
    net->on_request(net->on_request_ctx, p->id, d + REQ_FIXED, len - REQ_FIXED, &r);
  else
    r.status = OI_ERR_UNSUPPORTED;
  if (r.deferred != &ctx) return; /* answered later, by oi__peer_answer */
  if (r.status != OI_OK) {
    oi__free(r.data);
    r.data = NULL;
    r.len = 0;
  }
  uint8_t *b = oi__malloc(REP_FIXED + r.len);
  if (!b) {
    oi__free(r.data);
    peer_fail(p, OI_ERR_OUT_OF_MEMORY, "no memory for a reply of %zu bytes", r.len);
    return;
  }
  memcpy(b, d, 8); /* the call id */
  put32(b + 8, (uint32_t)(int32_t)r.status);
  if (r.len) memcpy(b + REP_FIXED, r.data, r.len);
  oi__free(r.data);
  STAT_ADD(net, served, 1);
  send_msg(p, AM_REP, b, REP_FIXED + r.len);
}

static void on_rep(oi_peer *p, const uint8_t *d, size_t len) {
  oi_peer_net *net = p->net;
  if (len < REP_FIXED || len - REP_FIXED > OI_PEER_MAX_MSG) {
    peer_fail(p, OI_ERR_PROTOCOL, "bad reply (%zu bytes)", len);
    return;
  }
  uint64_t id = get64(d);
  int32_t st = (int32_t)get32(d + 8);
  if (st > 0 || st < OI_ERR_BUSY || (st != OI_OK && len != REP_FIXED)) {
    peer_fail(p, OI_ERR_PROTOCOL, "bad reply status %d", st);
    return;
  }
  for (op *o = net->active; o; o = o->anext) {
    if (o->peer != p || o->kind != OP_CALL || o->call_id != id || o->ready) continue;
    if (st == OI_OK && len > REP_FIXED) {
      o->reply = oi__malloc(len - REP_FIXED);
      if (!o->reply) {
        op_ready(o, OI_ERR_OUT_OF_MEMORY, "peer %s: no memory for a reply of %zu bytes",
                 peer_name(p), len - REP_FIXED);
        return;
      }
      memcpy(o->reply, d + REP_FIXED, len - REP_FIXED);
      o->reply_len = len - REP_FIXED;
    }
    op_ready(o, (oi_status)st, st ? "peer %s answered %s" : NULL, peer_name(p),
             oi_status_str((oi_status)st));
    return;
  }
  /* A call that timed out already: dropped. */
}

/* A read from the reader (holder side, connection authenticated). */
static void on_read(oi_peer *p, const uint8_t *d, size_t len) {
  oi_peer_net *net = p->net;
  if (len != READ_LEN) {
    peer_fail(p, OI_ERR_PROTOCOL, "bad read message (%zu bytes)", len);
    return;
  }
  uint8_t hdr[DATA_HDR];
  memcpy(hdr, d, 12); /* get id, read index */
  uint64_t off = get64(d + 16), n = get64(d + 24);
  if (!n || off > net->len || n > net->len - off) {
    STAT_ADD(net, bad_messages, 1);
    put32(hdr + 12, (uint32_t)(int32_t)OI_ERR_INVALID_ARGUMENT);
    queue_msg(p, AM_DATA, hdr, DATA_HDR, NULL, 0, false, true);
    return;
  }
  put32(hdr + 12, 0);
  STAT_ADD(net, bytes_served, n);
  /* Straight from the region (it outlives the net): no copy. */
  queue_msg(p, AM_DATA, hdr, DATA_HDR, (uint8_t *)(uintptr_t)net->base + off, n, false, false);
}

static void data_cb(void *request, ucs_status_t status, size_t length, void *user) {
  op *o = user;
  OI_UNUSED(length);
  if (status == UCS_OK)
    o->landed++;
  else if (o->ucx_err == UCS_OK)
    o->ucx_err = status;
  o->pending--;
  oi__ucx.ucp_request_free(request);
}

/* The bytes of one read (reader side). */
static void on_data(oi_peer *p, const uint8_t *hdr, void *data, size_t len, bool rndv) {
  oi_peer_net *net = p->net;
  uint64_t id = get64(hdr);
  uint32_t idx = get32(hdr + 8);
  int32_t st = (int32_t)get32(hdr + 12);
  op *o = net->active;
  while (o && !(o->kind == OP_GET && o->am && o->peer == p && o->get_id == id))
    o = o->anext;
  if (!o || o->ready || o->fail_st || o->timed_out) return; /* late: dropped */
  if (idx >= o->n || o->got[idx] || !o->reads[idx].len ||
      (st == OI_OK && len != o->reads[idx].len) || st > 0 || st < OI_ERR_BUSY ||
      (st != OI_OK && len)) {
    STAT_ADD(net, bad_messages, 1);
    peer_fail(p, OI_ERR_PROTOCOL, "bad read reply (read %u of %zu, %zu bytes, status %d)", idx,
              o->n, len, st);
    return;
  }
  o->got[idx] = 1;
  if (st != OI_OK) {
    o->fail_st = (oi_status)st;
    snprintf(o->err, sizeof(o->err), "peer %s refused read %u: %s", peer_name(p), idx,
             oi_status_str((oi_status)st));
    return;
  }
  void *dst = o->reads[idx].local_dst;
  if (!rndv) {
    memcpy(dst, data, len);
    o->landed++;
    return;
  }
  ucp_request_param_t prm = {
      .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
      .cb.recv_am = data_cb,
      .user_data = o,
  };
  ucs_status_ptr_t r = oi__ucx.ucp_am_recv_data_nbx(net->worker, data, dst, len, &prm);
  if (r == NULL) {
    o->landed++;
  } else if (UCS_PTR_IS_ERR(r)) {
    if (o->ucx_err == UCS_OK) o->ucx_err = UCS_PTR_STATUS(r);
  } else {
    o->pending++;
  }
}

static ucs_status_t am_cb(void *arg, const void *header, size_t header_length, void *data,
                          size_t length, const ucp_am_recv_param_t *param) {
  oi_peer_net *net = ((am_arg *)arg)->net;
  unsigned id = ((am_arg *)arg)->id;
  OI_UNUSED(header);
  oi_peer *p = (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)
                   ? peer_by_ep(net, param->reply_ep)
                   : NULL;
  if (!p) {
    STAT_ADD(net, bad_messages, 1);
    return UCS_OK;
  }
  bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  if (id == AM_DATA ? header_length != DATA_HDR : (header_length || rndv)) {
    STAT_ADD(net, bad_messages, 1);
    peer_fail(p, OI_ERR_PROTOCOL, "unexpected message form (header %zu bytes, rendezvous %d)",
              header_length, !!(param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV));
    return UCS_OK;
  }
  const uint8_t *d = data;
  int want = 0;
  switch (id) {
  case AM_HELLO: want = P_WAIT_HELLO; break;
  case AM_CHALLENGE: want = P_CONNECTING; break;
  case AM_AUTH: want = P_WAIT_AUTH; break;
  case AM_WELCOME:
  case AM_REFUSE: want = P_WAIT_WELCOME; break;
  default: want = P_READY; break;
  }
  bool ok_side = (id == AM_HELLO || id == AM_AUTH || id == AM_REQ || id == AM_READ) ? !p->outbound
                                                                                    : p->outbound;
  if (p->state != want || !ok_side) {
    STAT_ADD(net, bad_messages, 1);
    peer_fail(p, OI_ERR_PROTOCOL, "message %u out of turn", id);
    return UCS_OK;
  }
  switch (id) {
  case AM_HELLO: on_hello(p, d, length); break;
  case AM_CHALLENGE: on_challenge(p, d, length); break;
  case AM_AUTH: on_auth(p, d, length); break;
  case AM_WELCOME: on_welcome(p, d, length); break;
  case AM_REFUSE:
    peer_fail(p, OI_ERR_PERMISSION, "refused: this node's secret is not the peer's");
    break;
  case AM_REQ: on_req(p, d, length); break;
  case AM_REP: on_rep(p, d, length); break;
  case AM_READ: on_read(p, d, length); break;
  case AM_DATA: on_data(p, header, data, length, rndv); break;
  }
  return UCS_OK;
}

static void conn_cb(ucp_conn_request_h req, void *arg) {
  oi_peer_net *net = arg;
  ucp_conn_request_attr_t attr = {.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR};
  char addr[64] = "?";
  if (oi__ucx.ucp_conn_request_query(req, &attr) == UCS_OK)
    format_addr((const struct sockaddr *)&attr.client_address, addr, sizeof(addr));
  if (atomic_load_explicit(&net->stop_req, memory_order_relaxed) ||
      net->handshakes >= MAX_HANDSHAKES) {
    STAT_ADD(net, refused, 1);
    OI_LOG(OI_LOG_WARN, "peer", "refused %s: %s", addr,
           net->handshakes >= MAX_HANDSHAKES ? "too many connections authenticating"
                                             : "shutting down");
    oi__ucx.ucp_listener_reject(net->listener, req);
    return;
  }
  oi_peer *p = oi__calloc(1, sizeof(*p));
  if (!p) {
    STAT_ADD(net, refused, 1);
    oi__ucx.ucp_listener_reject(net->listener, req);
    return;
  }
  p->net = net;
  snprintf(p->addr, sizeof(p->addr), "%s", addr);
  p->state = P_WAIT_HELLO;
  p->deadline = oi__deadline_ns(net->timeout_ms);
  ucp_ep_params_t ep = {
      .field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER,
      .conn_request = req,
      .err_mode = UCP_ERR_HANDLING_MODE_PEER,
      .err_handler = {.cb = err_cb, .arg = net},
  };
  ucs_status_t s = oi__ucx.ucp_ep_create(net->worker, &ep, &p->ep);
  if (s != UCS_OK) {
    STAT_ADD(net, refused, 1);
    OI_LOG(OI_LOG_WARN, "peer", "refused %s: creating its endpoint: %s", addr,
           oi__ucx.ucs_status_string(s));
    oi__free(p);
    return;
  }
  net->handshakes++;
  p->serial = ++net->next_serial;
  p->next = net->peers;
  net->peers = p;
}

/* ---- ops on the thread ---- */

static void start_connect(oi_peer_net *net, op *o) {
  oi_peer *p = oi__calloc(1, sizeof(*p));
  if (!p) {
    op_ready(o, OI_ERR_OUT_OF_MEMORY, "peer: no memory for a connection");
    return;
  }
  p->net = net;
  p->outbound = true;
  p->state = P_CONNECTING;
  format_addr((const struct sockaddr *)&o->sin, p->addr, sizeof(p->addr));
  p->serial = ++net->next_serial;
  p->next = net->peers;
  net->peers = p;
  o->peer = p;
  if (!fresh_nonce(p)) return;
  ucp_ep_params_t ep = {
      .field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                    UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER,
      .flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER,
      .sockaddr = {.addr = (const struct sockaddr *)&o->sin, .addrlen = sizeof(o->sin)},
      .err_mode = UCP_ERR_HANDLING_MODE_PEER,
      .err_handler = {.cb = err_cb, .arg = net},
  };
  ucs_status_t s = oi__ucx.ucp_ep_create(net->worker, &ep, &p->ep);
  if (s != UCS_OK) {
    p->ep = NULL;
    peer_fail(p, ucs_to_oi(s), "creating an endpoint: %s", oi__ucx.ucs_status_string(s));
    return;
  }
  send_hello(p, AM_HELLO);
}

static void start_call(oi_peer_net *net, op *o) {
  oi_peer *p = o->peer;
  STAT_ADD(net, calls, 1);
  if (p->state != P_READY) {
    op_ready(o, OI_ERR_CLOSED, "peer %s: the connection is closed", peer_name(p));
    return;
  }
  o->call_id = ++p->next_call;
  put64(o->msg, o->call_id);
  uint8_t *b = o->msg;
  o->msg = NULL;
  send_msg(p, AM_REQ, b, o->msg_len);
}

static void get_cb(void *request, ucs_status_t status, void *user) {
  op *o = user;
  if (status != UCS_OK && o->ucx_err == UCS_OK) o->ucx_err = status;
  o->pending--;
  oi__ucx.ucp_request_free(request);
}

static void start_get(oi_peer_net *net, op *o) {
  oi_peer *p = o->peer;
  STAT_ADD(net, gets, 1);
  STAT_ADD(net, reads, o->n);
  if (p->state != P_READY || !p->ep) {
    o->issued = true;
    o->ucx_err = UCS_ERR_CANCELED;
    return;
  }
  if (!p->rma) {
    o->am = true;
    o->get_id = ++p->next_get;
    o->got = oi__calloc(o->n, 1);
    if (!o->got) {
      o->issued = true;
      o->fail_st = OI_ERR_OUT_OF_MEMORY;
      snprintf(o->err, sizeof(o->err), "peer: no memory for %zu reads", o->n);
      return;
    }
    for (size_t i = 0; i < o->n && p->state == P_READY; i++) {
      const oi_peer_read *r = &o->reads[i];
      if (!r->len) continue;
      uint8_t *b = oi__malloc(READ_LEN);
      if (!b) {
        o->fail_st = OI_ERR_OUT_OF_MEMORY;
        snprintf(o->err, sizeof(o->err), "peer: no memory for %zu reads", o->n);
        break;
      }
      put64(b, o->get_id);
      put32(b + 8, (uint32_t)i);
      put32(b + 12, 0);
      put64(b + 16, r->remote_offset);
      put64(b + 24, r->len);
      o->want++;
      send_msg(p, AM_READ, b, READ_LEN);
    }
    o->issued = true;
    return;
  }
  ucp_request_param_t prm = {
      .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
      .cb.send = get_cb,
      .user_data = o,
  };
  for (size_t i = 0; i < o->n; i++) {
    const oi_peer_read *r = &o->reads[i];
    if (!r->len) continue;
    ucs_status_ptr_t q = oi__ucx.ucp_get_nbx(p->ep, r->local_dst, r->len,
                                             p->rbase + r->remote_offset, p->rkey, &prm);
    if (q == NULL) continue;
    if (UCS_PTR_IS_ERR(q)) {
      if (o->ucx_err == UCS_OK) o->ucx_err = UCS_PTR_STATUS(q);
      break;
    }
    o->pending++;
  }
  o->issued = true;
}

static void run_op(oi_peer_net *net, op *o) {
  switch (o->kind) {
  case OP_CONNECT:
    o->deadline = oi__deadline_ns(net->timeout_ms);
    active_add(net, o);
    start_connect(net, o);
    break;
  case OP_CALL:
    active_add(net, o);
    start_call(net, o);
    break;
  case OP_GET:
    active_add(net, o);
    start_get(net, o);
    break;
  case OP_ANSWER: {
    oi_peer *p = net->peers;
    while (p && !(p == o->peer && p->serial == o->serial))
      p = p->next;
    if (p && p->state == P_READY) { /* else the connection is gone: dropped */
      STAT_ADD(net, served, 1);
      uint8_t *b = o->msg;
      o->msg = NULL;
      send_msg(p, AM_REP, b, o->msg_len);
    }
    op_unref(o); /* nobody waits for it */
    break;
  }
  case OP_CLOSE: {
    oi_peer *p = o->peer;
    if (p->state != P_DEAD) peer_fail(p, OI_ERR_CLOSED, "closed by this node");
    if (p->ep) close_ep(net, p);
    p->owned = false; /* reap frees it */
    o->st = OI_OK;
    op_done(net, o);
    break;
  }
  case OP_REGISTER: {
    if (net->len) {
      o->st = OI_ERR_STATE;
      snprintf(o->err, sizeof(o->err), "peer: a region is already registered");
    } else if (!net->rma_serve) {
      net->base = (uint64_t)(uintptr_t)o->base;
      net->len = o->len;
      o->st = OI_OK;
    } else {
      ucp_mem_map_params_t mp = {.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS |
                                               UCP_MEM_MAP_PARAM_FIELD_LENGTH,
                                 .address = o->base,
                                 .length = o->len};
      ucs_status_t s = oi__ucx.ucp_mem_map(net->ctx, &mp, &net->memh);
      if (s == UCS_OK)
        s = oi__ucx.ucp_rkey_pack(net->ctx, net->memh, &net->rkey_buf, &net->rkey_len);
      if (s == UCS_OK && net->rkey_len > MAX_RKEY) s = UCS_ERR_EXCEEDS_LIMIT;
      if (s != UCS_OK) {
        if (net->rkey_buf) oi__ucx.ucp_rkey_buffer_release(net->rkey_buf);
        if (net->memh) oi__ucx.ucp_mem_unmap(net->ctx, net->memh);
        net->rkey_buf = NULL;
        net->rkey_len = 0;
        net->memh = NULL;
        o->st = ucs_to_oi(s);
        snprintf(o->err, sizeof(o->err), "peer: registering %zu bytes: %s", o->len,
                 oi__ucx.ucs_status_string(s));
      } else {
        net->base = (uint64_t)(uintptr_t)o->base;
        net->len = o->len;
        o->st = OI_OK;
      }
    }
    op_done(net, o);
    break;
  }
  }
}

/* Ends ready ops, enforces deadlines; returns ms until the next deadline
 * (capped). */
static int scan(oi_peer_net *net) {
  uint64_t now = oi__now_ns(), next = now + (uint64_t)IDLE_WAIT_MS * 1000000u;
  for (oi_peer *p = net->peers; p; p = p->next) {
    if (p->state == P_DEAD || p->state == P_READY) continue;
    if (p->outbound) continue; /* the connect op's deadline */
    if (now >= p->deadline)
      peer_fail(p, OI_ERR_TIMEOUT, "no handshake within %u ms", net->timeout_ms);
    else if (p->deadline < next)
      next = p->deadline;
  }
  op *o = net->active;
  while (o) {
    op *nx = o->anext;
    bool failed = o->timed_out || o->fail_st || o->ucx_err != UCS_OK;
    if (o->kind == OP_GET && o->issued && o->pending == 0 && !o->ready &&
        (failed || !o->am || o->landed == o->want)) {
      if (o->timed_out) {
        op_ready(o, OI_ERR_TIMEOUT,
                 "peer %s: reads not done within the timeout (connection closed)",
                 peer_name(o->peer));
      } else if (o->fail_st) {
        op_ready(o, o->fail_st, NULL);
      } else if (o->ucx_err != UCS_OK) {
        op_ready(o, ucs_to_oi(o->ucx_err), "peer %s: read failed: %s", peer_name(o->peer),
                 oi__ucx.ucs_status_string(o->ucx_err));
      } else {
        STAT_ADD(net, bytes_read, o->bytes);
        op_ready(o, OI_OK, NULL);
      }
    }
    if (!o->ready && now >= o->deadline) {
      if (o->kind == OP_GET) {
        if (!o->timed_out) {
          o->timed_out = true;
          peer_fail(o->peer, OI_ERR_TIMEOUT, "reads not done within the timeout");
          if (o->peer->ep) close_ep(net, o->peer);
        }
        next = now; /* progress until UCX gives the reads back */
      } else {
        if (o->kind == OP_CONNECT && o->peer)
          peer_fail(o->peer, OI_ERR_TIMEOUT, "no handshake within %u ms", net->timeout_ms);
        op_ready(o, OI_ERR_TIMEOUT, "peer %s: no answer within the timeout",
                 o->peer ? peer_name(o->peer) : "?");
      }
    } else if (!o->ready && o->deadline < next) {
      next = o->deadline;
    }
    if (o->ready) {
      if (o->st != OI_OK && o->kind != OP_CONNECT) STAT_ADD(net, errors, 1);
      active_del(net, o);
      op_done(net, o);
    }
    o = nx;
  }
  now = oi__now_ns();
  return next <= now ? 0 : (int)((next - now + 999999) / 1000000);
}

static op *take_queue(oi_peer_net *net) {
  pthread_mutex_lock(&net->lock);
  op *q = net->queue;
  net->queue = net->queue_tail = NULL;
  pthread_mutex_unlock(&net->lock);
  return q;
}

static void shutdown_all(oi_peer_net *net) {
  if (net->listener) {
    oi__ucx.ucp_listener_destroy(net->listener);
    net->listener = NULL;
  }
  for (op *q = take_queue(net); q;) {
    op *nx = q->next;
    if (q->kind == OP_CLOSE) {
      run_op(net, q);
    } else {
      q->st = OI_ERR_CLOSED;
      snprintf(q->err, sizeof(q->err), "peer: the net is shutting down");
      op_done(net, q);
    }
    q = nx;
  }
  for (oi_peer *p = net->peers; p; p = p->next) {
    peer_fail(p, OI_ERR_CLOSED, "the net is shutting down");
    if (p->ep) close_ep(net, p);
  }
  uint64_t end = oi__deadline_ns(SHUTDOWN_MS);
  for (;;) {
    while (oi__ucx.ucp_worker_progress(net->worker)) {
    }
    flush_outbox(net);
    for (op *o = net->active; o; o = o->anext)
      if (o->kind == OP_GET && o->pending == 0 && !o->ready)
        op_ready(o, OI_ERR_CLOSED, "peer: the net is shutting down");
    scan(net);
    reap(net);
    if ((!net->active && !net->nclosing) || oi__now_ns() >= end) break;
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
  if (net->active || net->nclosing)
    OI_LOG(OI_LOG_ERROR, "peer", "shutdown: %s still pending after %d ms",
           net->active ? "operations" : "endpoint closes", SHUTDOWN_MS);
}

/* A worker that cannot be armed is polled every millisecond; its error is
 * logged at the first failure and then at most once a second, with how
 * many there were (one line a loop would be a thousand a second). */
#define ARM_LOG_EVERY_NS 1000000000ull

static void *progress_main(void *arg) {
  oi_peer_net *net = arg;
  struct epoll_event evs[4];
  uint64_t arm_logged_ns = 0, arm_failures = 0;
  for (;;) {
    if (atomic_load_explicit(&net->stop_req, memory_order_acquire)) break;
    for (op *q = take_queue(net); q;) {
      op *nx = q->next;
      run_op(net, q);
      q = nx;
    }
    /* Bounded: a worker that keeps reporting progress (retries toward a
     * dead peer) must not keep the deadlines from being enforced. */
    bool busy = false;
    for (int i = 0; i < 64 && (busy = oi__ucx.ucp_worker_progress(net->worker) != 0); i++) {
    }
    flush_outbox(net);
    int wait_ms = scan(net);
    reap(net);
    if (net->nclosing && wait_ms > 1) wait_ms = 1;
    if (busy) continue;
    ucs_status_t s = oi__ucx.ucp_worker_arm(net->worker);
    if (s == UCS_ERR_BUSY) continue;
    if (s != UCS_OK) {
      uint64_t now = oi__now_ns();
      arm_failures++;
      if (arm_logged_ns == 0 || now - arm_logged_ns >= ARM_LOG_EVERY_NS) {
        OI_LOG(OI_LOG_ERROR, "peer",
               "arming the worker: %s (%llu time(s) since the last report; polling every 1 ms)",
               oi__ucx.ucs_status_string(s), (unsigned long long)arm_failures);
        arm_logged_ns = now;
        arm_failures = 0;
      }
      wait_ms = OI_MIN(wait_ms, 1);
    }
    int n = epoll_wait(net->epfd, evs, OI_ARRAY_LEN(evs), wait_ms);
    for (int i = 0; i < n; i++) {
      if (evs[i].data.fd == net->wakefd) {
        uint64_t v;
        ssize_t r = read(net->wakefd, &v, sizeof(v));
        OI_UNUSED(r);
      }
    }
  }
  shutdown_all(net);
  return NULL;
}

/* ---- API ---- */

oi_status oi__peer_reply_set(oi_peer_reply *r, const void *data, size_t len) {
  if (len > OI_PEER_MAX_MSG)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "peer: a reply of %zu bytes (at most %u)", len,
                    OI_PEER_MAX_MSG);
  void *c = NULL;
  if (len) {
    c = oi__malloc(len);
    if (!c) return oi__fail(OI_ERR_OUT_OF_MEMORY, "peer: a reply of %zu bytes", len);
    memcpy(c, data, len);
  }
  oi__free(r->data);
  r->data = c;
  r->len = len;
  r->status = OI_OK;
  return OI_OK;
}

void oi__peer_reply_status(oi_peer_reply *r, oi_status st) { r->status = st; }

oi_peer_ticket *oi__peer_defer(oi_peer_reply *r) {
  if (!r || !r->deferred) return NULL;
  oi_peer_ticket *t = oi__malloc(sizeof *t);
  if (!t) return NULL; /* answered now, as if not deferred */
  *t = *r->deferred;
  t->reply = (oi_peer_reply){.status = OI_OK};
  r->deferred = t;
  return t;
}

oi_peer_reply *oi__peer_ticket_reply(oi_peer_ticket *t) { return t ? &t->reply : NULL; }

void oi__peer_answer(oi_peer_ticket *t) {
  if (!t) return;
  oi_peer_net *net = t->net;
  oi_peer_reply *r = &t->reply;
  size_t len = r->status == OI_OK ? r->len : 0;
  op *o = op_new(OP_ANSWER);
  uint8_t *b = o ? oi__malloc(REP_FIXED + len) : NULL;
  if (!b) { /* the caller's call times out: as if the answer were lost */
    OI_LOG(OI_LOG_WARN, "peer", "no memory for an answer of %zu bytes: dropped", len);
    oi__free(o);
  } else {
    memcpy(b, t->call_id, 8);
    put32(b + 8, (uint32_t)(int32_t)r->status);
    if (len) memcpy(b + REP_FIXED, r->data, len);
    o->msg = b;
    o->msg_len = REP_FIXED + len;
    o->peer = t->peer;
    o->serial = t->serial;
    if (!enqueue(net, o)) op_unref(o); /* stopping: the thread's reference, never taken */
    op_unref(o);
  }
  oi__free(r->data);
  oi__free(t);
}

static void net_free(oi_peer_net *net) {
  if (net->listener) oi__ucx.ucp_listener_destroy(net->listener);
  if (net->rkey_buf) oi__ucx.ucp_rkey_buffer_release(net->rkey_buf);
  if (net->memh) oi__ucx.ucp_mem_unmap(net->ctx, net->memh);
  if (net->worker) oi__ucx.ucp_worker_destroy(net->worker);
  if (net->ctx) oi__ucx.ucp_cleanup(net->ctx);
  if (net->epfd >= 0) close(net->epfd);
  if (net->wakefd >= 0) close(net->wakefd);
  while (net->peers) {
    oi_peer *p = net->peers;
    net->peers = p->next;
    oi__free(p);
  }
  oi__free(net->closing);
  if (net->secret) memset(net->secret, 0, net->secret_len);
  oi__free(net->secret);
  oi__free(net->node_id);
  pthread_mutex_destroy(&net->lock);
  pthread_cond_destroy(&net->cond);
  oi__free(net);
}

/* Is there an RDMA device (where UCX does one-sided reads in hardware)? */
static bool have_rdma_device(void) {
  DIR *d = opendir("/sys/class/infiniband");
  if (!d) return false;
  bool any = false;
  struct dirent *e;
  while (!any && (e = readdir(d)))
    any = e->d_name[0] != '.';
  closedir(d);
  return any;
}

oi_status oi__peer_net_create(const oi_peer_net_options *opts, oi_peer_net **out) {
  if (!opts || !out) return oi__fail(OI_ERR_INVALID_ARGUMENT, "peer: no options or no output");
  *out = NULL;
  size_t idl = opts->node_id ? strlen(opts->node_id) : 0;
  if (idl == 0 || idl > OI_PEER_MAX_NODE_ID)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "peer: node id of %zu bytes (1..%u)", idl,
                    OI_PEER_MAX_NODE_ID);
  if (!opts->secret || opts->secret_len < OI_PEER_MIN_SECRET ||
      opts->secret_len > OI_PEER_MAX_SECRET)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "peer: a secret of %zu bytes (%u..%u)",
                    opts->secret ? opts->secret_len : 0, OI_PEER_MIN_SECRET, OI_PEER_MAX_SECRET);
  struct sockaddr_in sin;
  if (opts->listen_addr) {
    oi_status st = parse_addr(opts->listen_addr, &sin);
    if (st) return st;
  }
  /* UCX is loaded here, by the first net (see ucx.h). */
  oi_status lst = oi__ucx_load();
  if (lst) return lst;
  oi_peer_net *net = oi__calloc(1, sizeof(*net));
  if (!net) return oi__fail(OI_ERR_OUT_OF_MEMORY, "peer: no memory for a net");
  net->efd = net->wakefd = net->epfd = -1;
  pthread_mutex_init(&net->lock, NULL);
  oi__cond_init_monotonic(&net->cond);
  net->node_id = oi__strdup(opts->node_id);
  net->id_len = (uint8_t)idl;
  net->secret = oi__malloc(opts->secret_len);
  net->secret_len = opts->secret_len;
  net->timeout_ms = opts->timeout_ms ? opts->timeout_ms : 5000;
  net->on_request = opts->on_request;
  net->on_request_ctx = opts->on_request_ctx;
  net->read_mode = opts->reads;
  if (net->read_mode == OI_PEER_READS_AUTO) {
    const char *e = getenv("OI_PEER_READS");
    if (e && strcmp(e, "rma") == 0)
      net->read_mode = OI_PEER_READS_RMA;
    else if (e && strcmp(e, "am") == 0)
      net->read_mode = OI_PEER_READS_AM;
  }
  net->rma_serve = net->read_mode == OI_PEER_READS_RMA ||
                   (net->read_mode == OI_PEER_READS_AUTO && have_rdma_device());
  oi_status st = OI_OK;
  if (!net->node_id || !net->secret) {
    st = oi__fail(OI_ERR_OUT_OF_MEMORY, "peer: no memory for a net");
    goto fail;
  }
  memcpy(net->secret, opts->secret, opts->secret_len);

  ucp_config_t *cfg;
  ucs_status_t s = oi__ucx.ucp_config_read(NULL, NULL, &cfg);
  if (s != UCS_OK) {
    st = oi__fail(OI_ERR_IO, "peer: reading the UCX configuration: %s",
                  oi__ucx.ucs_status_string(s));
    goto fail;
  }
  /* UCX's TCP transport writes a peer's put straight to the address the
   * peer names (its rendezvous uses it): off (UCX_TCP_PUT_ENABLE=n), so that
   * over TCP no peer can write into this process; rendezvous then goes by
   * active messages, about half the throughput on loopback.
   * OI_PEER_TCP_PUT=1 keeps it on (a trusted network; docs/cluster.md, "Peer transport"). */
  const char *tcp_put = getenv("OI_PEER_TCP_PUT");
  s = tcp_put && strcmp(tcp_put, "1") == 0 ? UCS_OK
                                           : oi__ucx.ucp_config_modify(cfg, "PUT_ENABLE", "n");
  if (s != UCS_OK)
    OI_LOG(OI_LOG_WARN, "peer", "turning UCX_TCP_PUT_ENABLE off failed: %s",
           oi__ucx.ucs_status_string(s));
  /* UCX's TCP transport moves a message in segments of TX_SEG_SIZE bytes
   * (8 KiB by default), each its own send and receive on the progress
   * threads: served reads of 1 MiB moved 0.80 of a plain TCP stream on the
   * H200 machine, 1.06 with 256 KiB segments (docs/cluster.md, "Cross-node
   * restore throughput"). Each connection keeps a receive buffer of
   * RX_SEG_SIZE. The environment's UCX_TCP_TX_SEG_SIZE / UCX_TCP_RX_SEG_SIZE
   * win. */
  static const char *const seg_keys[][2] = {{"UCX_TCP_TX_SEG_SIZE", "TX_SEG_SIZE"},
                                            {"UCX_TCP_RX_SEG_SIZE", "RX_SEG_SIZE"}};
  for (size_t i = 0; i < OI_ARRAY_LEN(seg_keys); i++) {
    if (getenv(seg_keys[i][0])) continue;
    s = oi__ucx.ucp_config_modify(cfg, seg_keys[i][1], OI_PEER_TCP_SEG);
    if (s != UCS_OK)
      OI_LOG(OI_LOG_WARN, "peer", "setting %s to %s failed: %s", seg_keys[i][0], OI_PEER_TCP_SEG,
             oi__ucx.ucs_status_string(s));
  }
  ucp_params_t up = {.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME,
                     /* RMA only when reads are one-sided: UCX's software
                      * RMA (over TCP) answers a get for any address from any
                      * connected endpoint, authenticated or not. */
                     .features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP |
                                 (net->rma_serve ? UCP_FEATURE_RMA : 0),
                     .name = "openinfer-peer"};
  s = oi__ucx.ucp_init_version(UCP_API_MAJOR, UCP_API_MINOR, &up, cfg, &net->ctx);
  oi__ucx.ucp_config_release(cfg);
  if (s != UCS_OK) {
    net->ctx = NULL;
    st = oi__fail(OI_ERR_IO, "peer: initializing UCX: %s", oi__ucx.ucs_status_string(s));
    goto fail;
  }
  ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                            .thread_mode = UCS_THREAD_MODE_SINGLE};
  s = oi__ucx.ucp_worker_create(net->ctx, &wp, &net->worker);
  if (s != UCS_OK) {
    net->worker = NULL;
    st = oi__fail(OI_ERR_IO, "peer: creating the UCX worker: %s", oi__ucx.ucs_status_string(s));
    goto fail;
  }
  for (unsigned id = AM_HELLO; id < AM_LAST; id++) {
    net->am_args[id] = (am_arg){net, id};
    ucp_am_handler_param_t hp = {
        .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                      UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG,
        .id = id,
        .flags = UCP_AM_FLAG_WHOLE_MSG,
        .cb = am_cb,
        .arg = &net->am_args[id],
    };
    s = oi__ucx.ucp_worker_set_am_recv_handler(net->worker, &hp);
    if (s != UCS_OK) {
      st = oi__fail(OI_ERR_IO, "peer: setting the message handlers: %s",
                    oi__ucx.ucs_status_string(s));
      goto fail;
    }
  }
  s = oi__ucx.ucp_worker_get_efd(net->worker, &net->efd);
  if (s != UCS_OK) {
    st = oi__fail(OI_ERR_IO, "peer: the worker's event fd: %s", oi__ucx.ucs_status_string(s));
    goto fail;
  }
  net->wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  net->epfd = epoll_create1(EPOLL_CLOEXEC);
  if (net->wakefd < 0 || net->epfd < 0) {
    st = oi__fail(OI_ERR_IO, "peer: eventfd/epoll: %s", strerror(errno));
    goto fail;
  }
  struct epoll_event ev = {.events = EPOLLIN, .data.fd = net->efd};
  struct epoll_event ev2 = {.events = EPOLLIN, .data.fd = net->wakefd};
  if (epoll_ctl(net->epfd, EPOLL_CTL_ADD, net->efd, &ev) ||
      epoll_ctl(net->epfd, EPOLL_CTL_ADD, net->wakefd, &ev2)) {
    st = oi__fail(OI_ERR_IO, "peer: epoll_ctl: %s", strerror(errno));
    goto fail;
  }
  if (opts->listen_addr) {
    ucp_listener_params_t lp = {
        .field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER,
        .sockaddr = {.addr = (const struct sockaddr *)&sin, .addrlen = sizeof(sin)},
        .conn_handler = {.cb = conn_cb, .arg = net},
    };
    s = oi__ucx.ucp_listener_create(net->worker, &lp, &net->listener);
    if (s != UCS_OK) {
      net->listener = NULL;
      st = oi__fail(OI_ERR_IO, "peer: listening on %s: %s", opts->listen_addr,
                    oi__ucx.ucs_status_string(s));
      goto fail;
    }
    ucp_listener_attr_t la = {.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR};
    s = oi__ucx.ucp_listener_query(net->listener, &la);
    if (s != UCS_OK) {
      st = oi__fail(OI_ERR_IO, "peer: querying the listener: %s", oi__ucx.ucs_status_string(s));
      goto fail;
    }
    if (la.sockaddr.ss_family == AF_INET)
      net->port = ntohs(((struct sockaddr_in *)&la.sockaddr)->sin_port);
    else if (la.sockaddr.ss_family == AF_INET6)
      net->port = ntohs(((struct sockaddr_in6 *)&la.sockaddr)->sin6_port);
  }
  int rc = pthread_create(&net->thread, NULL, progress_main, net);
  if (rc) {
    st = oi__fail(OI_ERR_INTERNAL, "peer: starting the progress thread: %s", strerror(rc));
    goto fail;
  }
  net->thread_started = true;
  OI_LOG(OI_LOG_INFO, "peer", "node \"%s\" listening on port %u (%s reads)", net->node_id,
         net->port, net->rma_serve ? "one-sided" : "served");
  *out = net;
  return OI_OK;
fail:
  net_free(net);
  return st;
}

uint16_t oi__peer_net_port(const oi_peer_net *net) { return net ? net->port : 0; }

void oi__peer_net_destroy(oi_peer_net *net) {
  if (!net) return;
  pthread_mutex_lock(&net->lock);
  net->stopping = true;
  pthread_mutex_unlock(&net->lock);
  atomic_store_explicit(&net->stop_req, true, memory_order_release);
  wake(net);
  if (net->thread_started) pthread_join(net->thread, NULL);
  /* Ops queued after the thread's last look: fail them. */
  for (op *q = take_queue(net); q;) {
    op *nx = q->next;
    q->st = OI_ERR_CLOSED;
    snprintf(q->err, sizeof(q->err), "peer: the net is shutting down");
    op_done(net, q);
    q = nx;
  }
  pthread_mutex_lock(&net->lock);
  while (net->waiters)
    pthread_cond_wait(&net->cond, &net->lock);
  pthread_mutex_unlock(&net->lock);
  net_free(net);
}

oi_status oi__peer_net_register(oi_peer_net *net, void *base, size_t len) {
  if (!net || !base || !len)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "peer: registering an empty region");
  op *o = op_new(OP_REGISTER);
  if (!o) return oi__fail(OI_ERR_OUT_OF_MEMORY, "peer: no memory");
  o->base = base;
  o->len = len;
  oi_status st = submit(net, o);
  if (st) oi__fail(st, "%s", o->err);
  op_unref(o);
  return st;
}

void oi__peer_net_stats(const oi_peer_net *net, oi_peer_stats *out) {
  memset(out, 0, sizeof(*out));
  if (!net) return;
#define LOAD(f) out->f = atomic_load_explicit(&net->st.f, memory_order_relaxed)
  LOAD(accepted);
  LOAD(refused);
  LOAD(connected);
  LOAD(connect_fails);
  LOAD(calls);
  LOAD(served);
  LOAD(gets);
  LOAD(reads);
  LOAD(bytes_read);
  LOAD(errors);
  LOAD(bad_messages);
  LOAD(bytes_served);
#undef LOAD
}

oi_status oi__peer_connect(oi_peer_net *net, const char *addr, oi_peer **out) {
  if (!net || !out) return oi__fail(OI_ERR_INVALID_ARGUMENT, "peer: no net or no output");
  *out = NULL;
  op *o = op_new(OP_CONNECT);
  if (!o) return oi__fail(OI_ERR_OUT_OF_MEMORY, "peer: no memory");
  oi_status st = parse_addr(addr, &o->sin);
  if (st) {
    oi__free(o);
    return st;
  }
  st = submit(net, o);
  if (st)
    oi__fail(st, "%s", o->err);
  else
    *out = o->result;
  op_unref(o);
  return st;
}

void oi__peer_close(oi_peer *peer) {
  if (!peer) return;
  op *o = op_new(OP_CLOSE);
  if (!o) oi__fatal("peer: no memory to close a connection");
  o->peer = peer;
  submit(peer->net, o);
  op_unref(o);
}

const char *oi__peer_node_id(const oi_peer *peer) { return peer->id; }
uint64_t oi__peer_region_len(const oi_peer *peer) { return peer->rlen; }

/* A call's op: the request (at most OI_PEER_MAX_MSG bytes) framed for the
 * holder. */
static oi_status call_new(oi_peer *peer, const void *req, size_t len, uint32_t timeout_ms,
                          op **out) {
  if (len > OI_PEER_MAX_MSG)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "peer: a request of %zu bytes (at most %u)", len,
                    OI_PEER_MAX_MSG);
  op *o = op_new(OP_CALL);
  if (o) {
    o->msg_len = REQ_FIXED + len;
    o->msg = oi__malloc(o->msg_len);
    if (!o->msg) {
      oi__free(o);
      o = NULL;
    }
  }
  if (!o) return oi__fail(OI_ERR_OUT_OF_MEMORY, "peer: no memory for a request of %zu bytes", len);
  if (len) memcpy(o->msg + REQ_FIXED, req, len);
  o->peer = peer;
  o->deadline = oi__deadline_ns(timeout_ms ? timeout_ms : peer->net->timeout_ms);
  *out = o;
  return OI_OK;
}

oi_status oi__peer_send(oi_peer *peer, const void *req, size_t len, uint32_t timeout_ms) {
  if (!peer || (len && !req))
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "peer: send without a peer or request");
  oi_peer_net *net = peer->net;
  op *o = NULL;
  oi_status st = call_new(peer, req, len, timeout_ms, &o);
  if (st != OI_OK) return st;
  if (!enqueue(net, o)) {
    op_unref(o); /* the thread's reference, never taken */
    op_unref(o);
    return oi__fail(OI_ERR_CLOSED, "peer: the net is shutting down");
  }
  /* The caller's reference goes now: the thread ends the op (answer,
   * failure, timeout, close or destroy) and frees it with its own. */
  op_unref(o);
  return OI_OK;
}

oi_status oi__peer_call(oi_peer *peer, const void *req, size_t len, void **reply, size_t *reply_len,
                        uint32_t timeout_ms) {
  if (!peer || !reply || !reply_len || (len && !req))
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "peer: call without a peer, request or reply");
  *reply = NULL;
  *reply_len = 0;
  oi_peer_net *net = peer->net;
  op *o = NULL;
  oi_status st = call_new(peer, req, len, timeout_ms, &o);
  if (st != OI_OK) return st;
  st = submit(net, o);
  if (st) {
    oi__fail(st, "%s", o->err);
  } else {
    *reply = o->reply;
    *reply_len = o->reply_len;
    o->reply = NULL;
  }
  op_unref(o);
  return st;
}

oi_status oi__peer_get(oi_peer *peer, const oi_peer_read *reads, size_t n, uint32_t timeout_ms) {
  if (!peer || (n && !reads))
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "peer: get without a peer or reads");
  if (n > OI_PEER_MAX_READS)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "peer: %zu reads in one get (at most %u)", n,
                    OI_PEER_MAX_READS);
  uint64_t bytes = 0;
  for (size_t i = 0; i < n; i++) {
    const oi_peer_read *r = &reads[i];
    if (r->len && !r->local_dst)
      return oi__fail(OI_ERR_INVALID_ARGUMENT, "peer: read %zu has no destination", i);
    if (r->remote_offset > peer->rlen || r->len > peer->rlen - r->remote_offset)
      return oi__fail(OI_ERR_INVALID_ARGUMENT,
                      "peer %s: read %zu of %llu bytes at offset %llu is outside its region of "
                      "%llu bytes",
                      peer->id, i, (unsigned long long)r->len, (unsigned long long)r->remote_offset,
                      (unsigned long long)peer->rlen);
    bytes += r->len;
  }
  if (n == 0) return OI_OK;
  oi_peer_net *net = peer->net;
  op *o = op_new(OP_GET);
  if (!o) return oi__fail(OI_ERR_OUT_OF_MEMORY, "peer: no memory");
  o->peer = peer;
  o->reads = reads;
  o->n = n;
  o->bytes = bytes;
  o->deadline = oi__deadline_ns(timeout_ms ? timeout_ms : net->timeout_ms);
  oi_status st = submit(net, o);
  if (st) oi__fail(st, "%s", o->err);
  op_unref(o);
  return st;
}
