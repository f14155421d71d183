/* The peer transport's op queue and progress thread (the one thread that
 * makes UCX calls): see peer_internal.h. */
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

/* ---- ops ---- */

void oi__peer_op_unref(op *o) {
  if (atomic_fetch_sub_explicit(&o->refs, 1, memory_order_acq_rel) != 1) return;
  oi__free(o->msg);
  oi__free(o->reply);
  oi__free(o->got);
  oi__free(o);
}

void oi__peer_op_ready(op *o, oi_status st, const char *fmt, ...) {
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
void oi__peer_op_done(oi_peer_net *net, op *o) {
  pthread_mutex_lock(&net->lock);
  o->done = true;
  pthread_cond_broadcast(&net->cond);
  pthread_mutex_unlock(&net->lock);
  oi__peer_op_unref(o);
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

op *oi__peer_op_new(int kind) {
  op *o = oi__calloc(1, sizeof(*o));
  if (!o) return NULL;
  o->kind = kind;
  atomic_init(&o->refs, 2);
  return o;
}

void oi__peer_wake(oi_peer_net *net) {
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
  oi__peer_wake(net);
  return true;
}

bool oi__peer_enqueue(oi_peer_net *net, op *o) { return enqueue_ex(net, o, false); }

/* Queues `o` and waits until the thread is done with it; then the result is
 * the caller's (the caller still drops its reference). */
oi_status oi__peer_submit(oi_peer_net *net, op *o) {
  if (!enqueue_ex(net, o, true)) {
    oi__peer_op_unref(o); /* the thread's reference, never taken */
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

/* ---- ops on the thread ---- */

/* An endpoint to the worker at o->raddr (peer_tcp.c has authenticated
 * it) on p's worker. */
static oi_status make_ep(oi_peer_net *net, oi_peer *p, op *o) {
  ucp_ep_params_t ep = {
      .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER,
      .address = (const ucp_address_t *)o->raddr,
      .err_mode = UCP_ERR_HANDLING_MODE_PEER,
      .err_handler = {.cb = oi__peer_err_cb, .arg = net},
  };
  ucs_status_t s = oi__ucx.ucp_ep_create(oi__peer_worker(p), &ep, &p->ep);
  if (s != UCS_OK) {
    p->ep = NULL;
    oi__peer_op_ready(o, oi__peer_ucs_to_oi(s), "creating an endpoint: %s",
                      oi__ucx.ucs_status_string(s));
    return oi__peer_ucs_to_oi(s);
  }
  return OI_OK;
}

static void link_peer(oi_peer_net *net, oi_peer *p, int state) {
  p->state = state;
  p->serial = ++net->next_serial;
  p->next = net->peers;
  net->peers = p;
}

/* p's own worker (the spare, when one is made) and its address in
 * o->reply (false: o is ready with the error, p has no worker). */
static bool new_worker(oi_peer_net *net, oi_peer *p, op *o) {
  oi_status st = OI_OK;
  if (net->spare) {
    p->worker = net->spare;
    p->efd = net->spare_efd;
    net->spare = NULL;
    net->spare_efd = -1;
  } else {
    st = oi__peer_worker_new(net, &p->worker, &p->efd);
  }
  if (st) {
    oi__peer_op_ready(o, st, "%s", oi_last_error());
    return false;
  }
  ucp_address_t *a = NULL;
  size_t alen = 0;
  ucs_status_t s = oi__ucx.ucp_worker_get_address(p->worker, &a, &alen);
  if (s == UCS_OK) {
    o->reply = oi__malloc(alen);
    if (o->reply) {
      memcpy(o->reply, a, alen);
      o->reply_len = alen;
    }
    oi__ucx.ucp_worker_release_address(p->worker, a);
  }
  if (s != UCS_OK || !o->reply || alen > OI_PEER_MAX_FRAME) {
    oi__peer_op_ready(o, s != UCS_OK ? OI_ERR_IO : OI_ERR_OUT_OF_MEMORY,
                      "this connection's worker address: %s",
                      s != UCS_OK ? oi__ucx.ucs_status_string(s) : "no memory or too long");
    oi__peer_destroy_worker(net, p);
    return false;
  }
  return true;
}

/* The server's side, authenticated: the connection's worker (its address
 * goes to the client); the connection is listed, the handshake thread's
 * until OP_ACCEPT (owned: oi__peer_close drops it). */
static void run_worker(oi_peer_net *net, op *o) {
  oi_peer *p = o->peer;
  if (!new_worker(net, p, o)) return;
  p->owned = true;
  link_peer(net, p, P_ACCEPTING);
  oi__peer_op_ready(o, OI_OK, NULL);
}

/* Then its endpoint to the client's worker: the connection is the net's. */
static void run_accept(oi_peer_net *net, op *o) {
  oi_peer *p = o->peer;
  if (p->state != P_ACCEPTING) {
    oi__peer_op_ready(o, OI_ERR_CLOSED, "the connection is closed");
  } else if (make_ep(net, p, o) == OI_OK) {
    p->state = P_READY;
    p->owned = false;
    oi__peer_op_ready(o, OI_OK, NULL);
  } else {
    oi__peer_fail(p, o->st, "%s", o->err);
    p->owned = false;
  }
}

/* The client's side, authenticated: this connection's own worker, its
 * endpoint to the holder's, the region key; o->reply: this worker's
 * address for the holder. On failure nothing of p is kept. */
static void run_connect(oi_peer_net *net, op *o) {
  oi_peer *p = o->peer;
  if (!new_worker(net, p, o)) return;
  if (make_ep(net, p, o) == OI_OK) {
    ucs_status_t s;
    if (p->rma && p->rlen) {
      s = oi__ucx.ucp_ep_rkey_unpack(p->ep, o->rkey_in, &p->rkey);
      if (s != UCS_OK) {
        p->rkey = NULL;
        oi__peer_op_ready(o, OI_ERR_PROTOCOL, "unpacking the region key: %s",
                          oi__ucx.ucs_status_string(s));
      }
    }
    if (!o->ready) {
      link_peer(net, p, P_READY);
      p->owned = true;
      oi__peer_op_ready(o, OI_OK, NULL);
      return;
    }
  }
  /* Failed: undone here (p stays the caller's). */
  if (p->ep) {
    p->flush = false;
    oi__peer_close_ep(net, p);
  }
  oi__peer_destroy_worker(net, p);
}

static void start_call(oi_peer_net *net, op *o) {
  oi_peer *p = o->peer;
  STAT_ADD(net, calls, 1);
  if (p->state != P_READY) {
    oi__peer_op_ready(o, OI_ERR_CLOSED, "peer %s: the connection is closed", oi__peer_name(p));
    return;
  }
  o->call_id = ++p->next_call;
  put64(o->msg, o->call_id);
  uint8_t *b = o->msg;
  o->msg = NULL;
  oi__peer_send_msg(p, OI_PEER_AM_REQ, b, o->msg_len);
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
      uint8_t *b = oi__malloc(OI_PEER_READ_LEN);
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
      oi__peer_send_msg(p, OI_PEER_AM_READ, b, OI_PEER_READ_LEN);
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
  case OP_WORKER:
  case OP_ACCEPT:
    o->deadline = oi__deadline_ns(net->timeout_ms);
    active_add(net, o);
    if (o->kind == OP_CONNECT)
      run_connect(net, o);
    else if (o->kind == OP_WORKER)
      run_worker(net, o);
    else
      run_accept(net, o);
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
      oi__peer_send_msg(p, OI_PEER_AM_REP, b, o->msg_len);
    }
    oi__peer_op_unref(o); /* nobody waits for it */
    break;
  }
  case OP_CLOSE: {
    oi_peer *p = o->peer;
    if (p->state != P_DEAD) oi__peer_fail(p, OI_ERR_CLOSED, "closed by this node");
    if (p->ep) oi__peer_close_ep(net, p);
    p->owned = false; /* reap frees it */
    o->st = OI_OK;
    oi__peer_op_done(net, o);
    break;
  }
  case OP_ABORT: { /* ended now; closed and freed by oi__peer_close */
    oi_peer *p = o->peer;
    if (p->state != P_DEAD) oi__peer_fail(p, OI_ERR_CLOSED, "abandoned by this node");
    if (p->ep) oi__peer_close_ep(net, p);
    o->st = OI_OK;
    oi__peer_op_done(net, o);
    break;
  }
  case OP_REGISTER: {
    if (net->len) {
      o->st = OI_ERR_STATE;
      snprintf(o->err, sizeof(o->err), "peer: a region is already registered");
    } else if (!net->rma_serve) {
      pthread_mutex_lock(&net->lock); /* handshake threads read the region */
      net->base = (uint64_t)(uintptr_t)o->base;
      net->len = o->len;
      pthread_mutex_unlock(&net->lock);
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
        o->st = oi__peer_ucs_to_oi(s);
        snprintf(o->err, sizeof(o->err), "peer: registering %zu bytes: %s", o->len,
                 oi__ucx.ucs_status_string(s));
      } else {
        pthread_mutex_lock(&net->lock); /* handshake threads read the region */
        net->base = (uint64_t)(uintptr_t)o->base;
        net->len = o->len;
        pthread_mutex_unlock(&net->lock);
        o->st = OI_OK;
      }
    }
    oi__peer_op_done(net, o);
    break;
  }
  }
}

/* Ends ready ops, enforces deadlines; returns ms until the next deadline
 * (capped). */
static int scan(oi_peer_net *net) {
  uint64_t now = oi__now_ns(), next = now + (uint64_t)IDLE_WAIT_MS * 1000000u;
  op *o = net->active;
  while (o) {
    op *nx = o->anext;
    bool failed = o->timed_out || o->fail_st || o->ucx_err != UCS_OK;
    if (o->kind == OP_GET && o->issued && o->pending == 0 && !o->ready &&
        (failed || !o->am || o->landed == o->want)) {
      if (o->timed_out) {
        oi__peer_op_ready(o, OI_ERR_TIMEOUT,
                          "peer %s: reads not done within the timeout (connection closed)",
                          oi__peer_name(o->peer));
      } else if (o->fail_st) {
        oi__peer_op_ready(o, o->fail_st, NULL);
      } else if (o->ucx_err != UCS_OK) {
        oi__peer_op_ready(o, oi__peer_ucs_to_oi(o->ucx_err), "peer %s: read failed: %s",
                          oi__peer_name(o->peer), oi__ucx.ucs_status_string(o->ucx_err));
      } else {
        STAT_ADD(net, bytes_read, o->bytes);
        oi__peer_op_ready(o, OI_OK, NULL);
      }
    }
    if (!o->ready && now >= o->deadline) {
      if (o->kind == OP_GET) {
        if (!o->timed_out) {
          o->timed_out = true;
          oi__peer_fail(o->peer, OI_ERR_TIMEOUT, "reads not done within the timeout");
          if (o->peer->ep) oi__peer_close_ep(net, o->peer);
        }
        next = now; /* progress until UCX gives the reads back */
      } else {
        oi__peer_op_ready(o, OI_ERR_TIMEOUT, "peer %s: no answer within the timeout",
                          o->peer ? oi__peer_name(o->peer) : "?");
      }
    } else if (!o->ready && o->deadline < next) {
      next = o->deadline;
    }
    if (o->ready) {
      if (o->st != OI_OK && (o->kind == OP_CALL || o->kind == OP_GET)) STAT_ADD(net, errors, 1);
      active_del(net, o);
      oi__peer_op_done(net, o);
    }
    o = nx;
  }
  now = oi__now_ns();
  return next <= now ? 0 : (int)((next - now + 999999) / 1000000);
}

op *oi__peer_take_queue(oi_peer_net *net) {
  pthread_mutex_lock(&net->lock);
  op *q = net->queue;
  net->queue = net->queue_tail = NULL;
  pthread_mutex_unlock(&net->lock);
  return q;
}

/* The net's worker and each outbound connection's: any progress? */
static bool progress_all(oi_peer_net *net) {
  bool any = false;
  for (oi_peer *p = net->peers; p; p = p->next)
    if (p->worker && oi__ucx.ucp_worker_progress(p->worker)) any = true;
  return any;
}

/* Arms every worker: UCS_ERR_BUSY when one has events still to progress. */
static ucs_status_t arm_all(oi_peer_net *net) {
  ucs_status_t s = UCS_OK;
  for (oi_peer *p = net->peers; p && s == UCS_OK; p = p->next)
    if (p->worker) s = oi__ucx.ucp_worker_arm(p->worker);
  return s;
}

/* With nothing in flight and no spare worker: makes one for the next
 * connection (a failure is retried after a second; a connection then makes
 * its own, and says why if that fails too). */
static void make_spare(oi_peer_net *net) {
  if (net->no_spare || net->spare || net->active || oi__now_ns() < net->spare_retry_ns) return;
  pthread_mutex_lock(&net->lock);
  bool queued = net->queue != NULL;
  pthread_mutex_unlock(&net->lock);
  if (queued) return;
  if (oi__peer_worker_new(net, &net->spare, &net->spare_efd) != OI_OK) {
    net->spare = NULL;
    net->spare_efd = -1;
    net->spare_retry_ns = oi__now_ns() + 1000000000ull;
    oi_clear_error();
  }
}

static void drop_spare(oi_peer_net *net) {
  if (!net->spare) return;
  if (net->spare_efd >= 0) epoll_ctl(net->epfd, EPOLL_CTL_DEL, net->spare_efd, NULL);
  oi__ucx.ucp_worker_destroy(net->spare);
  net->spare = NULL;
  net->spare_efd = -1;
}

static void shutdown_all(oi_peer_net *net) {
  for (op *q = oi__peer_take_queue(net); q;) {
    op *nx = q->next;
    if (q->kind == OP_CLOSE) {
      run_op(net, q);
    } else {
      q->st = OI_ERR_CLOSED;
      snprintf(q->err, sizeof(q->err), "peer: the net is shutting down");
      oi__peer_op_done(net, q);
    }
    q = nx;
  }
  for (oi_peer *p = net->peers; p; p = p->next) {
    oi__peer_fail(p, OI_ERR_CLOSED, "the net is shutting down");
    if (p->ep) oi__peer_close_ep(net, p);
  }
  uint64_t end = oi__deadline_ns(SHUTDOWN_MS);
  for (;;) {
    while (progress_all(net)) {
    }
    oi__peer_flush_outbox(net);
    for (op *o = net->active; o; o = o->anext)
      if (o->kind == OP_GET && o->pending == 0 && !o->ready)
        oi__peer_op_ready(o, OI_ERR_CLOSED, "peer: the net is shutting down");
    scan(net);
    oi__peer_reap(net);
    bool closing = false;
    for (oi_peer *p = net->peers; p; p = p->next)
      closing = closing || p->close_req;
    if ((!net->active && !closing) || oi__now_ns() >= end) break;
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
  if (net->active)
    OI_LOG(OI_LOG_ERROR, "peer", "shutdown: operations still pending after %d ms", SHUTDOWN_MS);
  drop_spare(net);
}

/* A worker that cannot be armed is polled every millisecond; its error is
 * logged at the first failure and then at most once a second, with how
 * many there were (one line a loop would be a thousand a second). */
#define ARM_LOG_EVERY_NS 1000000000ull

void *oi__peer_progress_main(void *arg) {
  oi_peer_net *net = arg;
  struct epoll_event evs[4];
  uint64_t arm_logged_ns = 0, arm_failures = 0;
  for (;;) {
    if (atomic_load_explicit(&net->stop_req, memory_order_acquire)) break;
    for (op *q = oi__peer_take_queue(net); q;) {
      op *nx = q->next;
      run_op(net, q);
      q = nx;
    }
    /* Bounded: a worker that keeps reporting progress (retries toward a
     * dead peer) must not keep the deadlines from being enforced. */
    bool busy = false;
    for (int i = 0; i < 64 && (busy = progress_all(net)); i++) {
    }
    oi__peer_flush_outbox(net);
    int wait_ms = scan(net);
    oi__peer_reap(net);
    if (busy) continue;
    make_spare(net);
    ucs_status_t s = arm_all(net);
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
