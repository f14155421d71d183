/* The peer transport: see peer.h and docs/cluster.md, "Peer transport";
 * its files and threads: peer_internal.h. This file: the API (nets,
 * connections, calls, gets, deferred answers). */
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

#include "cluster/peer_internal.h"

oi_status oi__peer_ucs_to_oi(ucs_status_t s) {
  switch (s) {
  case UCS_OK: return OI_OK;
  case UCS_ERR_NO_MEMORY: return OI_ERR_OUT_OF_MEMORY;
  case UCS_ERR_TIMED_OUT: return OI_ERR_TIMEOUT;
  case UCS_ERR_CANCELED: return OI_ERR_CLOSED;
  default: return OI_ERR_IO;
  }
}

oi_status oi__peer_parse_addr(const char *addr, struct sockaddr_in *sin) {
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

void oi__peer_format_addr(const struct sockaddr *sa, char *out, size_t cap) {
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
  op *o = oi__peer_op_new(OP_ANSWER);
  uint8_t *b = o ? oi__malloc(OI_PEER_REP_FIXED + len) : NULL;
  if (!b) { /* the caller's call times out: as if the answer were lost */
    OI_LOG(OI_LOG_WARN, "peer", "no memory for an answer of %zu bytes: dropped", len);
    oi__free(o);
  } else {
    memcpy(b, t->call_id, 8);
    put32(b + 8, (uint32_t)(int32_t)r->status);
    if (len) memcpy(b + OI_PEER_REP_FIXED, r->data, len);
    o->msg = b;
    o->msg_len = OI_PEER_REP_FIXED + len;
    o->peer = t->peer;
    o->serial = t->serial;
    if (!oi__peer_enqueue(net, o))
      oi__peer_op_unref(o); /* stopping: the thread's reference, never taken */
    oi__peer_op_unref(o);
  }
  oi__free(r->data);
  oi__free(t);
}

static void net_free(oi_peer_net *net) {
  if (net->lfd >= 0) close(net->lfd);
  if (net->lwake >= 0) close(net->lwake);
  for (oi_peer *p = net->peers; p; p = p->next)
    oi__peer_destroy_worker(net, p);
  if (net->rkey_buf) oi__ucx.ucp_rkey_buffer_release(net->rkey_buf);
  if (net->memh) oi__ucx.ucp_mem_unmap(net->ctx, net->memh);
  if (net->ctx) oi__ucx.ucp_cleanup(net->ctx);
  if (net->epfd >= 0) close(net->epfd);
  if (net->wakefd >= 0) close(net->wakefd);
  while (net->peers) {
    oi_peer *p = net->peers;
    net->peers = p->next;
    oi__free(p);
  }
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

/* A worker (single-threaded: the progress thread's) with the message
 * handlers, its event fd added to the net's epoll set. */
oi_status oi__peer_worker_new(oi_peer_net *net, ucp_worker_h *out, int *efd) {
  ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                            .thread_mode = UCS_THREAD_MODE_SINGLE};
  ucp_worker_h w = NULL;
  *out = NULL;
  *efd = -1;
  ucs_status_t s = oi__ucx.ucp_worker_create(net->ctx, &wp, &w);
  if (s != UCS_OK)
    return oi__fail(OI_ERR_IO, "peer: creating a UCX worker: %s", oi__ucx.ucs_status_string(s));
  for (unsigned id = OI_PEER_AM_HELLO; id < OI_PEER_AM_LAST; id++) {
    net->am_args[id] = (am_arg){net, id};
    ucp_am_handler_param_t hp = {
        .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                      UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG,
        .id = id,
        .flags = UCP_AM_FLAG_WHOLE_MSG,
        .cb = oi__peer_am_cb,
        .arg = &net->am_args[id],
    };
    s = oi__ucx.ucp_worker_set_am_recv_handler(w, &hp);
    if (s != UCS_OK) {
      oi__ucx.ucp_worker_destroy(w);
      return oi__fail(OI_ERR_IO, "peer: setting the message handlers: %s",
                      oi__ucx.ucs_status_string(s));
    }
  }
  int fd = -1;
  s = oi__ucx.ucp_worker_get_efd(w, &fd);
  if (s != UCS_OK) {
    oi__ucx.ucp_worker_destroy(w);
    return oi__fail(OI_ERR_IO, "peer: the worker's event fd: %s", oi__ucx.ucs_status_string(s));
  }
  struct epoll_event ev = {.events = EPOLLIN, .data.fd = fd};
  if (epoll_ctl(net->epfd, EPOLL_CTL_ADD, fd, &ev)) {
    oi__ucx.ucp_worker_destroy(w);
    return oi__fail(OI_ERR_IO, "peer: epoll_ctl: %s", strerror(errno));
  }
  *out = w;
  *efd = fd;
  return OI_OK;
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
    oi_status st = oi__peer_parse_addr(opts->listen_addr, &sin);
    if (st) return st;
  }
  /* UCX is loaded here, by the first net (see ucx.h). */
  oi_status lst = oi__ucx_load();
  if (lst) return lst;
  oi_peer_net *net = oi__calloc(1, sizeof(*net));
  if (!net) return oi__fail(OI_ERR_OUT_OF_MEMORY, "peer: no memory for a net");
  net->efd = net->wakefd = net->epfd = net->lfd = net->lwake = net->spare_efd = -1;
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
  net->no_spare = opts->no_spare_worker;
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
  net->wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  net->epfd = epoll_create1(EPOLL_CLOEXEC);
  if (net->wakefd < 0 || net->epfd < 0) {
    st = oi__fail(OI_ERR_IO, "peer: eventfd/epoll: %s", strerror(errno));
    goto fail;
  }
  struct epoll_event ev2 = {.events = EPOLLIN, .data.fd = net->wakefd};
  if (epoll_ctl(net->epfd, EPOLL_CTL_ADD, net->wakefd, &ev2)) {
    st = oi__fail(OI_ERR_IO, "peer: epoll_ctl: %s", strerror(errno));
    goto fail;
  }
  int rc = pthread_create(&net->thread, NULL, oi__peer_progress_main, net);
  if (rc) {
    st = oi__fail(OI_ERR_INTERNAL, "peer: starting the progress thread: %s", strerror(rc));
    goto fail;
  }
  net->thread_started = true;
  /* The node's own TCP listener: the handshake runs there, before any
   * byte reaches UCX (peer_tcp.c). */
  if (opts->listen_addr && (st = oi__peer_listen(net, &sin))) {
    oi__peer_net_destroy(net);
    return st;
  }
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
  oi__peer_wake(net);
  if (net->thread_started) pthread_join(net->thread, NULL);
  oi__peer_listen_stop(net); /* handshakes in flight end (their ops fail below) */
  /* Ops queued after the thread's last look: fail them. */
  for (op *q = oi__peer_take_queue(net); q;) {
    op *nx = q->next;
    q->st = OI_ERR_CLOSED;
    snprintf(q->err, sizeof(q->err), "peer: the net is shutting down");
    oi__peer_op_done(net, q);
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
  op *o = oi__peer_op_new(OP_REGISTER);
  if (!o) return oi__fail(OI_ERR_OUT_OF_MEMORY, "peer: no memory");
  o->base = base;
  o->len = len;
  oi_status st = oi__peer_submit(net, o);
  if (st) oi__fail(st, "%s", o->err);
  oi__peer_op_unref(o);
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
  struct sockaddr_in sin;
  oi_status st = oi__peer_parse_addr(addr, &sin);
  if (st) return st;
  pthread_mutex_lock(&net->lock);
  bool stop = net->stopping;
  pthread_mutex_unlock(&net->lock);
  if (stop) return oi__fail(OI_ERR_CLOSED, "peer: the net is shutting down");
  return oi__peer_tcp_connect(net, &sin, out);
}

void oi__peer_close(oi_peer *peer) {
  if (!peer) return;
  op *o = oi__peer_op_new(OP_CLOSE);
  if (!o) oi__fatal("peer: no memory to close a connection");
  o->peer = peer;
  oi__peer_submit(peer->net, o);
  oi__peer_op_unref(o);
}

void oi__peer_abort(oi_peer *peer) {
  if (!peer) return;
  op *o = oi__peer_op_new(OP_ABORT);
  if (!o) oi__fatal("peer: no memory to end a connection");
  o->peer = peer;
  oi__peer_submit(peer->net, o);
  oi__peer_op_unref(o);
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
  op *o = oi__peer_op_new(OP_CALL);
  if (o) {
    o->msg_len = OI_PEER_REQ_FIXED + len;
    o->msg = oi__malloc(o->msg_len);
    if (!o->msg) {
      oi__free(o);
      o = NULL;
    }
  }
  if (!o) return oi__fail(OI_ERR_OUT_OF_MEMORY, "peer: no memory for a request of %zu bytes", len);
  if (len) memcpy(o->msg + OI_PEER_REQ_FIXED, req, len);
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
  if (!oi__peer_enqueue(net, o)) {
    oi__peer_op_unref(o); /* the thread's reference, never taken */
    oi__peer_op_unref(o);
    return oi__fail(OI_ERR_CLOSED, "peer: the net is shutting down");
  }
  /* The caller's reference goes now: the thread ends the op (answer,
   * failure, timeout, close or destroy) and frees it with its own. */
  oi__peer_op_unref(o);
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
  st = oi__peer_submit(net, o);
  if (st) {
    oi__fail(st, "%s", o->err);
  } else {
    *reply = o->reply;
    *reply_len = o->reply_len;
    o->reply = NULL;
  }
  oi__peer_op_unref(o);
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
  op *o = oi__peer_op_new(OP_GET);
  if (!o) return oi__fail(OI_ERR_OUT_OF_MEMORY, "peer: no memory");
  o->peer = peer;
  o->reads = reads;
  o->n = n;
  o->bytes = bytes;
  o->deadline = oi__deadline_ns(timeout_ms ? timeout_ms : net->timeout_ms);
  oi_status st = oi__peer_submit(net, o);
  if (st) oi__fail(st, "%s", o->err);
  oi__peer_op_unref(o);
  return st;
}
