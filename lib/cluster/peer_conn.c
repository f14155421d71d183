/* The peer transport's connections (progress thread): their endpoints and
 * workers, the outbox and the handlers of every message (peer_wire.h); the
 * handshake is peer_tcp.c's. See peer_internal.h. */
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

/* ---- connections (thread) ---- */

static oi_peer *peer_by_ep(oi_peer_net *net, ucp_ep_h ep) {
  if (!ep) return NULL;
  for (oi_peer *p = net->peers; p; p = p->next)
    if (p->ep == ep && p->state != P_DEAD) return p;
  return NULL;
}

const char *oi__peer_name(const oi_peer *p) { return p->id_len ? p->id : p->addr; }

/* Marks `p` dead: its ep is closed after this round of progress, its
 * connect and calls end with `st`; gets end when UCX completes their reads
 * (with an error, the ep being closed). */
void oi__peer_fail(oi_peer *p, oi_status st, const char *fmt, ...) {
  if (p->state == P_DEAD) return;
  oi_peer_net *net = p->net;
  char msg[200];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  if (p->state != P_READY) { /* a handshake's: peer_tcp.c counts and logs it */
  } else {
    if (st != OI_ERR_CLOSED) STAT_ADD(net, errors, 1);
    OI_LOG(OI_LOG_INFO, "peer", "connection with %s (%s) ends: %s", oi__peer_name(p), p->addr, msg);
  }
  p->state = P_DEAD;
  p->need_close = p->ep != NULL;
  for (op *o = net->active; o; o = o->anext) {
    if (o->peer != p) continue;
    if (o->kind == OP_CONNECT || o->kind == OP_CALL)
      oi__peer_op_ready(o, st, "peer %s: %s", p->addr, msg);
    if (o->kind == OP_GET && !o->fail_st) {
      o->fail_st = st;
      snprintf(o->err, sizeof(o->err), "peer %s: %s", oi__peer_name(p), msg);
    }
  }
}

void oi__peer_close_ep(oi_peer_net *net, oi_peer *p) {
  OI_UNUSED(net);
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
  p->close_req = r; /* reap destroys the worker once this is done */
}

static bool peer_referenced(oi_peer_net *net, oi_peer *p) {
  for (op *o = net->active; o; o = o->anext)
    if (o->peer == p) return true;
  return false;
}

ucp_worker_h oi__peer_worker(const oi_peer *p) { return p->worker; }

/* An outbound connection's worker, once its ep is closed (or at the end). */
void oi__peer_destroy_worker(oi_peer_net *net, oi_peer *p) {
  if (!p->worker) return;
  if (p->close_req) {
    uint64_t end = oi__deadline_ns(SHUTDOWN_MS);
    while (oi__ucx.ucp_request_check_status(p->close_req) == UCS_INPROGRESS && oi__now_ns() < end)
      oi__ucx.ucp_worker_progress(p->worker);
    oi__ucx.ucp_request_free(p->close_req);
    p->close_req = NULL;
  }
  if (p->efd >= 0) epoll_ctl(net->epfd, EPOLL_CTL_DEL, p->efd, NULL);
  oi__ucx.ucp_worker_destroy(p->worker);
  p->worker = NULL;
  p->efd = -1;
}

/* Closes the eps of dead connections (and then their own workers); frees
 * the dead ones nobody holds. */
void oi__peer_reap(oi_peer_net *net) {
  oi_peer **pp = &net->peers;
  while (*pp) {
    oi_peer *p = *pp;
    if (p->state == P_DEAD && p->need_close) oi__peer_close_ep(net, p);
    if (p->close_req && oi__ucx.ucp_request_check_status(p->close_req) != UCS_INPROGRESS) {
      oi__ucx.ucp_request_free(p->close_req);
      p->close_req = NULL;
    }
    if (p->state == P_DEAD && p->worker && !p->ep && !p->close_req && !peer_referenced(net, p))
      oi__peer_destroy_worker(net, p);
    if (p->state == P_DEAD && !p->owned && !p->ep && !p->worker && !peer_referenced(net, p)) {
      *pp = p->next;
      oi__free(p);
      continue;
    }
    pp = &p->next;
  }
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
    oi__peer_fail(p, OI_ERR_OUT_OF_MEMORY, "no memory for a message");
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
void oi__peer_send_msg(oi_peer *p, unsigned id, void *buf, size_t len) {
  queue_msg(p, id, NULL, 0, buf, len, true, true);
}

/* Sends the queued messages. Not from inside the worker's progress: a UCX
 * 1.13 send that meets a transport endpoint which failed in the same round
 * (before UCP marked its ep failed) aborts the process; after the progress
 * returns, UCP has marked it and the send fails cleanly. */
void oi__peer_flush_outbox(oi_peer_net *net) {
  outmsg *m;
  while ((m = net->out_head)) {
    net->out_head = m->next;
    if (!net->out_head) net->out_tail = NULL;
    oi_peer *p = m->p;
    if (!p->ep || (p->state == P_DEAD && m->id != OI_PEER_AM_REFUSE)) {
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
      oi__peer_fail(p, OI_ERR_IO, "sending: %s", oi__ucx.ucs_status_string(UCS_PTR_STATUS(r)));
    }
  }
}

/* The handler's arg is the net, not the connection: an ep closed gently may
 * still report an error after its connection was freed; looked up by ep it
 * finds nothing. */
void oi__peer_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status) {
  oi_peer *p = peer_by_ep(arg, ep);
  if (!p) return;
  oi__peer_fail(p, status == UCS_ERR_CANCELED ? OI_ERR_CLOSED : OI_ERR_IO, "connection lost: %s",
                oi__ucx.ucs_status_string(status));
}

static void on_req(oi_peer *p, const uint8_t *d, size_t len) {
  oi_peer_net *net = p->net;
  if (len < OI_PEER_REQ_FIXED || len - OI_PEER_REQ_FIXED > OI_PEER_MAX_MSG) {
    oi__peer_fail(p, OI_ERR_PROTOCOL, "bad request (%zu bytes)", len);
    return;
  }
  oi_peer_reply r = {.status = OI_OK};
  oi_peer_ticket ctx = {.net = net, .peer = p, .serial = p->serial};
  memcpy(ctx.call_id, d, 8);
  r.deferred = &ctx; /* the ticket oi__peer_defer copies */
  if (net->on_request)
    net->on_request(net->on_request_ctx, p->id, d + OI_PEER_REQ_FIXED, len - OI_PEER_REQ_FIXED, &r);
  else
    r.status = OI_ERR_UNSUPPORTED;
  if (r.deferred != &ctx) return; /* answered later, by oi__peer_answer */
  if (r.status != OI_OK) {
    oi__free(r.data);
    r.data = NULL;
    r.len = 0;
  }
  uint8_t *b = oi__malloc(OI_PEER_REP_FIXED + r.len);
  if (!b) {
    oi__free(r.data);
    oi__peer_fail(p, OI_ERR_OUT_OF_MEMORY, "no memory for a reply of %zu bytes", r.len);
    return;
  }
  memcpy(b, d, 8); /* the call id */
  put32(b + 8, (uint32_t)(int32_t)r.status);
  if (r.len) memcpy(b + OI_PEER_REP_FIXED, r.data, r.len);
  oi__free(r.data);
  STAT_ADD(net, served, 1);
  oi__peer_send_msg(p, OI_PEER_AM_REP, b, OI_PEER_REP_FIXED + r.len);
}

static void on_rep(oi_peer *p, const uint8_t *d, size_t len) {
  oi_peer_net *net = p->net;
  if (len < OI_PEER_REP_FIXED || len - OI_PEER_REP_FIXED > OI_PEER_MAX_MSG) {
    oi__peer_fail(p, OI_ERR_PROTOCOL, "bad reply (%zu bytes)", len);
    return;
  }
  uint64_t id = get64(d);
  int32_t st = (int32_t)get32(d + 8);
  if (st > 0 || st < OI_ERR_BUSY || (st != OI_OK && len != OI_PEER_REP_FIXED)) {
    oi__peer_fail(p, OI_ERR_PROTOCOL, "bad reply status %d", st);
    return;
  }
  for (op *o = net->active; o; o = o->anext) {
    if (o->peer != p || o->kind != OP_CALL || o->call_id != id || o->ready) continue;
    if (st == OI_OK && len > OI_PEER_REP_FIXED) {
      o->reply = oi__malloc(len - OI_PEER_REP_FIXED);
      if (!o->reply) {
        oi__peer_op_ready(o, OI_ERR_OUT_OF_MEMORY, "peer %s: no memory for a reply of %zu bytes",
                          oi__peer_name(p), len - OI_PEER_REP_FIXED);
        return;
      }
      memcpy(o->reply, d + OI_PEER_REP_FIXED, len - OI_PEER_REP_FIXED);
      o->reply_len = len - OI_PEER_REP_FIXED;
    }
    oi__peer_op_ready(o, (oi_status)st, st ? "peer %s answered %s" : NULL, oi__peer_name(p),
                      oi_status_str((oi_status)st));
    return;
  }
  /* A call that timed out already: dropped. */
}

/* A read from the reader (holder side, connection authenticated). */
static void on_read(oi_peer *p, const uint8_t *d, size_t len) {
  oi_peer_net *net = p->net;
  if (len != OI_PEER_READ_LEN) {
    oi__peer_fail(p, OI_ERR_PROTOCOL, "bad read message (%zu bytes)", len);
    return;
  }
  uint8_t hdr[OI_PEER_DATA_HDR];
  memcpy(hdr, d, 12); /* get id, read index */
  uint64_t off = get64(d + 16), n = get64(d + 24);
  if (!n || off > net->len || n > net->len - off) {
    STAT_ADD(net, bad_messages, 1);
    put32(hdr + 12, (uint32_t)(int32_t)OI_ERR_INVALID_ARGUMENT);
    queue_msg(p, OI_PEER_AM_DATA, hdr, OI_PEER_DATA_HDR, NULL, 0, false, true);
    return;
  }
  put32(hdr + 12, 0);
  STAT_ADD(net, bytes_served, n);
  /* Straight from the region (it outlives the net): no copy. */
  queue_msg(p, OI_PEER_AM_DATA, hdr, OI_PEER_DATA_HDR, (uint8_t *)(uintptr_t)net->base + off, n,
            false, false);
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
    oi__peer_fail(p, OI_ERR_PROTOCOL, "bad read reply (read %u of %zu, %zu bytes, status %d)", idx,
                  o->n, len, st);
    return;
  }
  o->got[idx] = 1;
  if (st != OI_OK) {
    o->fail_st = (oi_status)st;
    snprintf(o->err, sizeof(o->err), "peer %s refused read %u: %s", oi__peer_name(p), idx,
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
  ucs_status_ptr_t r = oi__ucx.ucp_am_recv_data_nbx(oi__peer_worker(p), data, dst, len, &prm);
  if (r == NULL) {
    o->landed++;
  } else if (UCS_PTR_IS_ERR(r)) {
    if (o->ucx_err == UCS_OK) o->ucx_err = UCS_PTR_STATUS(r);
  } else {
    o->pending++;
  }
}

ucs_status_t oi__peer_am_cb(void *arg, const void *header, size_t header_length, void *data,
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
  if (id == OI_PEER_AM_DATA ? header_length != OI_PEER_DATA_HDR : (header_length || rndv)) {
    STAT_ADD(net, bad_messages, 1);
    oi__peer_fail(p, OI_ERR_PROTOCOL, "unexpected message form (header %zu bytes, rendezvous %d)",
                  header_length, !!(param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV));
    return UCS_OK;
  }
  const uint8_t *d = data;
  /* The handshake's messages travel over TCP only (peer_tcp.c): over UCX
   * they are out of turn. */
  bool handshake = id < OI_PEER_AM_REQ;
  bool ok_side = (id == OI_PEER_AM_REQ || id == OI_PEER_AM_READ) ? !p->outbound : p->outbound;
  if (p->state != P_READY || handshake || !ok_side) {
    STAT_ADD(net, bad_messages, 1);
    oi__peer_fail(p, OI_ERR_PROTOCOL, "message %u out of turn", id);
    return UCS_OK;
  }
  switch (id) {
  case OI_PEER_AM_REQ: on_req(p, d, length); break;
  case OI_PEER_AM_REP: on_rep(p, d, length); break;
  case OI_PEER_AM_READ: on_read(p, d, length); break;
  case OI_PEER_AM_DATA: on_data(p, header, data, length, rndv); break;
  }
  return UCS_OK;
}
