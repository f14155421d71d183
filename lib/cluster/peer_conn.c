/* The peer transport's connections (progress thread): the handshake, the
 * outbox and the handlers of every message (peer_wire.h). See
 * peer_internal.h. */
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
  if (!p->outbound && p->state != P_READY) {
    STAT_ADD(net, refused, 1);
    OI_LOG(OI_LOG_WARN, "peer", "refused %s: %s", p->addr, msg);
  } else if (p->outbound && p->state != P_READY) {
    STAT_ADD(net, connect_fails, 1);
    OI_LOG(OI_LOG_WARN, "peer", "connecting to %s: %s", p->addr, msg);
  } else {
    if (st != OI_ERR_CLOSED) STAT_ADD(net, errors, 1);
    OI_LOG(OI_LOG_INFO, "peer", "connection with %s (%s) ends: %s", oi__peer_name(p), p->addr, msg);
  }
  if (!p->outbound && p->state != P_READY && net->handshakes) net->handshakes--;
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
void oi__peer_reap(oi_peer_net *net) {
  oi_peer **pp = &net->peers;
  while (*pp) {
    oi_peer *p = *pp;
    if (p->state == P_DEAD && p->need_close) oi__peer_close_ep(net, p);
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

/* The handshake's MAC: HMAC-SHA256(secret, label || client nonce || server
 * nonce || client id (length-prefixed) || server id). */
/* HELLO and CHALLENGE share a layout: magic, version, id length, nonce, id. */
void oi__peer_send_hello(oi_peer *p, unsigned am) {
  oi_peer_net *net = p->net;
  size_t len = OI_PEER_HELLO_FIXED + net->id_len;
  uint8_t *b = oi__malloc(len);
  if (!b) {
    oi__peer_fail(p, OI_ERR_OUT_OF_MEMORY, "no memory for the handshake");
    return;
  }
  put32(b, OI_PEER_MAGIC);
  put16(b + 4, OI_PEER_VERSION);
  put16(b + 6, net->id_len);
  memcpy(b + 8, p->nonce_mine, NONCE);
  memcpy(b + OI_PEER_HELLO_FIXED, net->node_id, net->id_len);
  oi__peer_send_msg(p, am, b, len);
}

static bool parse_hello(oi_peer *p, const uint8_t *d, size_t len) {
  size_t idl = 0;
  oi_status st = oi__peer_parse_hello(d, len, p->nonce_theirs, p->id, &idl);
  if (st != OI_OK) {
    oi__peer_fail(p, st, "%s", oi_last_error());
    return false;
  }
  p->id_len = (uint8_t)idl;
  return true;
}

bool oi__peer_fresh_nonce(oi_peer *p) {
  if (getrandom(p->nonce_mine, NONCE, 0) != (ssize_t)NONCE) {
    oi__peer_fail(p, OI_ERR_IO, "getrandom: %s", strerror(errno));
    return false;
  }
  return true;
}

static void on_hello(oi_peer *p, const uint8_t *d, size_t len) {
  if (!parse_hello(p, d, len) || !oi__peer_fresh_nonce(p)) return;
  p->state = P_WAIT_AUTH;
  oi__peer_send_hello(p, OI_PEER_AM_CHALLENGE);
}

static void on_challenge(oi_peer *p, const uint8_t *d, size_t len) {
  if (!parse_hello(p, d, len)) return;
  size_t blen = 4 + OI_SHA256_LEN;
  uint8_t *b = oi__malloc(blen);
  if (!b) {
    oi__peer_fail(p, OI_ERR_OUT_OF_MEMORY, "no memory for the handshake");
    return;
  }
  put32(b, OI_PEER_MAGIC);
  oi__peer_handshake_mac(p->net, p, true, b + 4);
  p->state = P_WAIT_WELCOME;
  oi__peer_send_msg(p, OI_PEER_AM_AUTH, b, blen);
}

static void on_auth(oi_peer *p, const uint8_t *d, size_t len) {
  oi_peer_net *net = p->net;
  uint8_t want[OI_SHA256_LEN];
  const uint8_t *mac = NULL;
  oi_status st = oi__peer_parse_auth(d, len, &mac);
  if (st != OI_OK) {
    oi__peer_fail(p, st, "%s", oi_last_error());
    return;
  }
  oi__peer_handshake_mac(net, p, true, want);
  if (!oi__ct_equal(want, mac, OI_SHA256_LEN)) {
    /* Tell it why, then close once that is delivered. */
    uint8_t *b = oi__malloc(4);
    if (b) {
      put32(b, OI_PEER_MAGIC);
      oi__peer_send_msg(p, OI_PEER_AM_REFUSE, b, 4);
    }
    p->flush = true;
    oi__peer_fail(p, OI_ERR_PERMISSION, "node \"%s\" failed to prove the cluster secret", p->id);
    return;
  }
  size_t blen = OI_PEER_WELCOME_FIXED + net->rkey_len;
  uint8_t *b = oi__malloc(blen);
  if (!b) {
    oi__peer_fail(p, OI_ERR_OUT_OF_MEMORY, "no memory for the handshake");
    return;
  }
  put32(b, OI_PEER_MAGIC);
  oi__peer_handshake_mac(net, p, false, b + 4);
  put64(b + 4 + OI_SHA256_LEN, net->base);
  put64(b + 12 + OI_SHA256_LEN, net->len);
  put32(b + 20 + OI_SHA256_LEN, (uint32_t)net->rkey_len);
  put32(b + 24 + OI_SHA256_LEN, net->rkey_len ? OI_PEER_WELCOME_RMA : 0);
  if (net->rkey_len) memcpy(b + OI_PEER_WELCOME_FIXED, net->rkey_buf, net->rkey_len);
  p->state = P_READY;
  if (net->handshakes) net->handshakes--;
  STAT_ADD(net, accepted, 1);
  OI_LOG(OI_LOG_INFO, "peer", "accepted node \"%s\" from %s", p->id, p->addr);
  oi__peer_send_msg(p, OI_PEER_AM_WELCOME, b, blen);
}

static op *connect_op_of(oi_peer_net *net, oi_peer *p) {
  for (op *o = net->active; o; o = o->anext)
    if (o->peer == p && o->kind == OP_CONNECT) return o;
  return NULL;
}

static void on_welcome(oi_peer *p, const uint8_t *d, size_t len) {
  oi_peer_net *net = p->net;
  uint8_t want[OI_SHA256_LEN];
  oi_peer_welcome w;
  /* The MAC is checked on a welcome of the right form before its region
   * descriptor is (a refusal reads as one). */
  oi__peer_handshake_mac(net, p, false, want);
  oi_status st = oi__peer_parse_welcome(d, len, want, &w);
  if (st == OI_ERR_PERMISSION) {
    oi__peer_fail(p, OI_ERR_PERMISSION, "node \"%s\" failed to prove the cluster secret", p->id);
    return;
  }
  if (st != OI_OK) {
    oi__peer_fail(p, st, "%s", oi_last_error());
    return;
  }
  uint64_t base = w.base, rlen = w.len;
  uint32_t klen = w.rkey_len;
  p->rma = klen && net->rma_serve;
  if (rlen && p->rma) {
    ucs_status_t s = oi__ucx.ucp_ep_rkey_unpack(p->ep, w.rkey, &p->rkey);
    if (s != UCS_OK) {
      p->rkey = NULL;
      oi__peer_fail(p, OI_ERR_PROTOCOL, "unpacking the region key: %s",
                    oi__ucx.ucs_status_string(s));
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
    oi__peer_op_ready(o, OI_OK, NULL);
  }
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
  ucs_status_ptr_t r = oi__ucx.ucp_am_recv_data_nbx(net->worker, data, dst, len, &prm);
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
  int want = 0;
  switch (id) {
  case OI_PEER_AM_HELLO: want = P_WAIT_HELLO; break;
  case OI_PEER_AM_CHALLENGE: want = P_CONNECTING; break;
  case OI_PEER_AM_AUTH: want = P_WAIT_AUTH; break;
  case OI_PEER_AM_WELCOME:
  case OI_PEER_AM_REFUSE: want = P_WAIT_WELCOME; break;
  default: want = P_READY; break;
  }
  bool ok_side = (id == OI_PEER_AM_HELLO || id == OI_PEER_AM_AUTH || id == OI_PEER_AM_REQ ||
                  id == OI_PEER_AM_READ)
                     ? !p->outbound
                     : p->outbound;
  if (p->state != want || !ok_side) {
    STAT_ADD(net, bad_messages, 1);
    oi__peer_fail(p, OI_ERR_PROTOCOL, "message %u out of turn", id);
    return UCS_OK;
  }
  switch (id) {
  case OI_PEER_AM_HELLO: on_hello(p, d, length); break;
  case OI_PEER_AM_CHALLENGE: on_challenge(p, d, length); break;
  case OI_PEER_AM_AUTH: on_auth(p, d, length); break;
  case OI_PEER_AM_WELCOME: on_welcome(p, d, length); break;
  case OI_PEER_AM_REFUSE:
    oi__peer_fail(p, OI_ERR_PERMISSION, "refused: this node's secret is not the peer's");
    break;
  case OI_PEER_AM_REQ: on_req(p, d, length); break;
  case OI_PEER_AM_REP: on_rep(p, d, length); break;
  case OI_PEER_AM_READ: on_read(p, d, length); break;
  case OI_PEER_AM_DATA: on_data(p, header, data, length, rndv); break;
  }
  return UCS_OK;
}

void oi__peer_conn_cb(ucp_conn_request_h req, void *arg) {
  oi_peer_net *net = arg;
  ucp_conn_request_attr_t attr = {.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR};
  char addr[64] = "?";
  if (oi__ucx.ucp_conn_request_query(req, &attr) == UCS_OK)
    oi__peer_format_addr((const struct sockaddr *)&attr.client_address, addr, sizeof(addr));
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
      .err_handler = {.cb = oi__peer_err_cb, .arg = net},
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
