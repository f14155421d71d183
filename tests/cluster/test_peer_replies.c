/* The reader's side of the peer transport (lib/cluster/peer*.c) against a
 * fake holder: a raw TCP listener and UCX worker in a thread of this test
 * that speaks the handshake correctly over TCP (its MACs computed here from
 * the shared secret), swaps worker addresses, and
 * then answers the reader's calls and reads the way each case tells it: a
 * reply too short or too long, a reply status out of range or with bytes, a
 * reply with a header, a reply for another call, the same reply twice, a
 * DATA message for a read
 * that does not exist, with the wrong length, a bad status, twice, for an
 * unknown get, for an empty read, a message out of turn, a CHALLENGE of
 * another version, a WELCOME whose region does not parse, a REFUSE, and a
 * connection closed early. Each case ends with the status the transport
 * documents, the connection dead (or kept, where the answer was a valid
 * one), and the reader's net still serving a real holder. Deferred answers
 * (oi__peer_defer, oi__peer_answer) are checked too: answered from another
 * thread, with an error, and to a connection that closed meanwhile. The wire
 * layout is spelled out here (docs/cluster.md, "Peer transport"). */
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <time.h>

#include "cluster/peer.h"
#include "cluster/peer_wire.h"
#include "cluster/sha256.h"
#include "cluster/ucx.h"
#include "core/core.h"
#include "core/le_bytes.h"
#include "peer_tcp_util.h"
#include "testutil.h"

static const uint8_t SECRET[] = "cluster secret: thirty-two bytes";

#define REGION 8192u

static uint8_t region_byte(uint64_t off) { return (uint8_t)(off * 13 + 5); }

/* What the fake holder does. Handshake cases act at the HELLO or the AUTH;
 * reply cases at the first request of a connection (later ones are echoed);
 * read cases at the first read message (later ones are served). */
enum {
  GOOD = 0,
  /* handshake */
  H_CLOSE_AT_HELLO,
  H_CHALLENGE_V2,
  H_WELCOME_EARLY, /* a WELCOME instead of the CHALLENGE */
  H_WELCOME_BAD_REGION,
  H_WELCOME_BAD_MAC,
  H_REFUSE,
  H_CLOSE_AT_AUTH,
  H_SILENT,   /* no CHALLENGE: the connect times out */
  H_JUNK_KEY, /* one-sided reads offered with a region key of zeros */
  /* replies */
  R_SHORT,
  R_LONG,
  R_STATUS_POSITIVE,
  R_STATUS_UNKNOWN,
  R_ERROR_WITH_BYTES,
  R_HEADER,
  R_ERROR,      /* a valid refusal: the call fails, the connection stays */
  R_OTHER_CALL, /* a reply for no call (dropped), then the right one */
  R_TWICE,      /* the right reply twice: the second dropped */
  R_CHALLENGE,  /* a handshake message out of turn */
  R_REQUEST,    /* a request to the side that calls */
  R_CLOSE,
  /* reads */
  D_BAD_INDEX,
  D_WRONG_LENGTH,
  D_STATUS_POSITIVE,
  D_ERROR_WITH_BYTES,
  D_DUPLICATE,
  D_EMPTY_READ,
  D_UNKNOWN_GET, /* dropped, then the right one */
  D_REFUSED,     /* a valid refusal: the get fails, the connection stays */
  D_SHORT_HEADER,
  D_CLOSE,
  D_SILENT, /* no DATA: the get times out */
  /* a call and a get in flight together, answered in the other's order */
  X_INTERLEAVE,
  NMODES
};

typedef struct msg {
  unsigned id;
  uint8_t d[512];
  size_t len, hlen;
} msg;

typedef struct fake {
  ucp_context_h ctx;
  ucp_worker_h w; /* the connection's (one at a time; a worker each) */
  int lfd;        /* the TCP listener */
  int silent_fd;  /* H_SILENT: the socket held unanswered */
  int fd;         /* the handshake in progress */
  uint16_t port;
  pthread_t th;
  atomic_int stop;
  _Atomic int mode;
  ucp_ep_h ep;
  bool first_req_done, first_read_done;
  uint8_t nc[OI_PEER_NONCE], ns[OI_PEER_NONCE];
  char cid[OI_PEER_MAX_NODE_ID + 1];
  uint8_t cidl;
  msg in[64];
  int nin;
  msg held[4]; /* X_INTERLEAVE: the request and the reads, held */
  int nheld;
  uint8_t region[REGION];
} fake;

typedef struct fake_arg {
  fake *f;
  unsigned id;
} fake_arg;
static fake_arg fake_args[16];

static ucs_status_t fake_am(void *arg, const void *header, size_t header_length, void *data,
                            size_t length, const ucp_am_recv_param_t *param) {
  OI_UNUSED(header);
  OI_UNUSED(param);
  fake_arg *a = arg;
  fake *f = a->f;
  if (f->nin < (int)OI_ARRAY_LEN(f->in)) {
    msg *m = &f->in[f->nin++];
    m->id = a->id;
    m->len = length;
    m->hlen = header_length;
    memcpy(m->d, data, OI_MIN(length, sizeof m->d));
  }
  return UCS_OK;
}

static void fake_err(void *arg, ucp_ep_h ep, ucs_status_t st) {
  OI_UNUSED(arg);
  OI_UNUSED(ep);
  OI_UNUSED(st);
}

static void fake_wait(fake *f, ucs_status_ptr_t q) {
  if (!UCS_PTR_IS_PTR(q) || !f->w) return;
  for (int i = 0; i < 100000 && oi__ucx.ucp_request_check_status(q) == UCS_INPROGRESS; i++)
    oi__ucx.ucp_worker_progress(f->w);
  oi__ucx.ucp_request_free(q);
}

static void fake_send_ex(fake *f, unsigned id, const void *hdr, size_t hl, const void *d,
                         size_t len, bool eager) {
  if (!f->ep) return;
  ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                            .flags = UCP_AM_SEND_FLAG_REPLY | (eager ? UCP_AM_SEND_FLAG_EAGER : 0)};
  fake_wait(f, oi__ucx.ucp_am_send_nbx(f->ep, id, hdr, hl, d, len, &rp));
}
static void fake_send(fake *f, unsigned id, const void *hdr, size_t hl, const void *d, size_t len) {
  fake_send_ex(f, id, hdr, hl, d, len, true);
}

/* Ends the connection: its endpoint, its worker (its sockets close: the
 * reader sees it at once), its handshake socket. */
static void fake_close_ep(fake *f) {
  if (f->ep) {
    ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                              .flags = UCP_EP_CLOSE_FLAG_FORCE};
    fake_wait(f, oi__ucx.ucp_ep_close_nbx(f->ep, &rp));
    f->ep = NULL;
  }
  if (f->w) oi__ucx.ucp_worker_destroy(f->w);
  f->w = NULL;
  if (f->fd >= 0) close(f->fd);
  f->fd = -1;
}

static void fake_worker(fake *f) {
  ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                            .thread_mode = UCS_THREAD_MODE_SINGLE};
  REQUIRE(oi__ucx.ucp_worker_create(f->ctx, &wp, &f->w) == UCS_OK);
  for (unsigned id = 1; id < 16; id++) {
    fake_args[id] = (fake_arg){f, id};
    ucp_am_handler_param_t hp = {
        .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                      UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG,
        .id = id,
        .flags = UCP_AM_FLAG_WHOLE_MSG,
        .cb = fake_am,
        .arg = &fake_args[id]};
    REQUIRE(oi__ucx.ucp_worker_set_am_recv_handler(f->w, &hp) == UCS_OK);
  }
}

/* The holder's proof: HMAC(secret, server label || client nonce || server
 * nonce || client id || server id), each id length-prefixed. */
static void fake_mac(const fake *f, uint8_t out[OI_PEER_MAC_LEN]) {
  static const char label[] = "openinfer peer v1 server";
  uint8_t ls = 4;
  oi_hmac_sha256 h;
  oi__hmac_sha256_init(&h, SECRET, 32);
  oi__hmac_sha256_update(&h, label, sizeof label);
  oi__hmac_sha256_update(&h, f->nc, OI_PEER_NONCE);
  oi__hmac_sha256_update(&h, f->ns, OI_PEER_NONCE);
  oi__hmac_sha256_update(&h, &f->cidl, 1);
  oi__hmac_sha256_update(&h, f->cid, f->cidl);
  oi__hmac_sha256_update(&h, &ls, 1);
  oi__hmac_sha256_update(&h, "fake", 4);
  oi__hmac_sha256_final(&h, out);
}

static void fake_welcome(fake *f, int mode) {
  uint8_t b[OI_PEER_WELCOME_FIXED + 16];
  put32(b, OI_PEER_MAGIC);
  fake_mac(f, b + 4);
  if (mode == H_WELCOME_BAD_MAC) b[4] ^= 1;
  put64(b + 4 + OI_PEER_MAC_LEN, 0);
  put64(b + 12 + OI_PEER_MAC_LEN, REGION);
  uint32_t klen = mode == H_JUNK_KEY ? 16 : 0;
  put32(b + 20 + OI_PEER_MAC_LEN, klen);
  put32(b + 24 + OI_PEER_MAC_LEN, mode == H_WELCOME_BAD_REGION ? 2 : klen ? 1 : 0);
  memset(b + OI_PEER_WELCOME_FIXED, 0, klen);
  ptu_send_frame(f->fd, OI_PEER_AM_WELCOME, b, OI_PEER_WELCOME_FIXED + klen);
}

/* The answer to a HELLO (false: the handshake goes no further). */
static bool fake_hello(fake *f, const msg *m, int mode) {
  memcpy(f->nc, m->d + 8, OI_PEER_NONCE);
  f->cidl = (uint8_t)(m->len - OI_PEER_HELLO_FIXED);
  memcpy(f->cid, m->d + OI_PEER_HELLO_FIXED, f->cidl);
  if (mode == H_CLOSE_AT_HELLO) return false;
  if (mode == H_SILENT) {
    f->silent_fd = f->fd;
    f->fd = -1;
    return false;
  }
  if (mode == H_WELCOME_EARLY) {
    fake_welcome(f, GOOD);
    return false;
  }
  uint8_t b[OI_PEER_HELLO_FIXED + 4];
  put32(b, OI_PEER_MAGIC);
  put16(b + 4, mode == H_CHALLENGE_V2 ? 2 : 1);
  put16(b + 6, 4);
  memset(f->ns, 0x5c, OI_PEER_NONCE);
  memcpy(b + 8, f->ns, OI_PEER_NONCE);
  memcpy(b + OI_PEER_HELLO_FIXED, "fake", 4);
  return ptu_send_frame(f->fd, OI_PEER_AM_CHALLENGE, b, sizeof b);
}

/* The answer to an AUTH (false: the handshake goes no further). */
static bool fake_auth(fake *f, int mode) {
  if (mode == H_CLOSE_AT_AUTH) return false;
  if (mode == H_REFUSE) {
    uint8_t b[4];
    put32(b, OI_PEER_MAGIC);
    ptu_send_frame(f->fd, OI_PEER_AM_REFUSE, b, 4);
    return false;
  }
  fake_welcome(f, mode);
  return true;
}

/* One connection's handshake over TCP, as `mode` says; then the worker
 * addresses, the endpoint and READY. */
static void fake_handshake(fake *f, int mode) {
  static uint8_t b[OI_PEER_MAX_FRAME];
  uint32_t kind = 0;
  long n = ptu_recv_frame(f->fd, &kind, b, sizeof b);
  if (n < (long)OI_PEER_HELLO_FIXED || n > 300 || kind != OI_PEER_AM_HELLO) return;
  msg m = {.id = kind, .len = (size_t)n};
  memcpy(m.d, b, (size_t)n);
  if (!fake_hello(f, &m, mode)) return;
  n = ptu_recv_frame(f->fd, &kind, b, sizeof b);
  if (n < 0 || kind != OI_PEER_AM_AUTH || !fake_auth(f, mode)) return;
  fake_worker(f);
  ucp_address_t *mine = NULL;
  size_t ml = 0;
  REQUIRE(oi__ucx.ucp_worker_get_address(f->w, &mine, &ml) == UCS_OK);
  bool ok = ptu_send_frame(f->fd, OI_PEER_FR_ADDR, mine, ml);
  oi__ucx.ucp_worker_release_address(f->w, mine);
  n = ok ? ptu_recv_frame(f->fd, &kind, b, sizeof b) : -1;
  if (n <= 0 || kind != OI_PEER_FR_ADDR) return; /* the reader gave up (a bad welcome) */
  ucp_ep_params_t ep = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                                      UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                                      UCP_EP_PARAM_FIELD_ERR_HANDLER,
                        .address = (const ucp_address_t *)b,
                        .err_mode = UCP_ERR_HANDLING_MODE_PEER,
                        .err_handler = {.cb = fake_err, .arg = f}};
  if (oi__ucx.ucp_ep_create(f->w, &ep, &f->ep) != UCS_OK) f->ep = NULL;
  ptu_send_frame(f->fd, OI_PEER_FR_READY, NULL, 0);
}

static void fake_req(fake *f, const msg *m, int mode) {
  static uint8_t big[OI_PEER_REP_FIXED + OI_PEER_MAX_MSG + 1];
  uint8_t b[OI_PEER_REP_FIXED + 256];
  size_t pl = m->len - 8; /* the payload, echoed */
  memcpy(b, m->d, 8);     /* the call id */
  put32(b + 8, 0);
  memcpy(b + OI_PEER_REP_FIXED, m->d + 8, OI_MIN(pl, 256));
  size_t len = OI_PEER_REP_FIXED + OI_MIN(pl, 256);
  if (f->first_req_done) mode = GOOD;
  f->first_req_done = true;
  switch (mode) {
  case R_SHORT: len = OI_PEER_REP_FIXED - 1; break;
  case R_LONG:
    memcpy(big, b, OI_PEER_REP_FIXED);
    fake_send(f, OI_PEER_AM_REP, NULL, 0, big, sizeof big);
    return;
  case R_STATUS_POSITIVE: put32(b + 8, 3); break;
  case R_STATUS_UNKNOWN:
    put32(b + 8, (uint32_t)(int32_t)(OI_ERR_BUSY - 1)), len = OI_PEER_REP_FIXED;
    break;
  case R_ERROR_WITH_BYTES: put32(b + 8, (uint32_t)(int32_t)OI_ERR_NOT_FOUND); break;
  case R_ERROR: put32(b + 8, (uint32_t)(int32_t)OI_ERR_NOT_FOUND), len = OI_PEER_REP_FIXED; break;
  case R_HEADER: {
    uint64_t h = 1;
    fake_send(f, OI_PEER_AM_REP, &h, sizeof h, b, len);
    return;
  }
  case R_OTHER_CALL: {
    uint8_t o[OI_PEER_REP_FIXED];
    put64(o, get64(m->d) + 1000);
    put32(o + 8, 0);
    fake_send(f, OI_PEER_AM_REP, NULL, 0, o, sizeof o);
    break; /* then the right one */
  }
  case R_TWICE: fake_send(f, OI_PEER_AM_REP, NULL, 0, b, len); break; /* then again */
  case R_CHALLENGE: fake_send(f, OI_PEER_AM_CHALLENGE, NULL, 0, b, len); return;
  case R_REQUEST: fake_send(f, OI_PEER_AM_REQ, NULL, 0, b, len); return;
  case R_CLOSE: fake_close_ep(f); return;
  default: break;
  }
  fake_send(f, OI_PEER_AM_REP, NULL, 0, b, len);
}

static void fake_data(fake *f, uint64_t get, uint32_t idx, int32_t st, const void *d, size_t len) {
  uint8_t h[OI_PEER_DATA_HDR];
  put64(h, get);
  put32(h + 8, idx);
  put32(h + 12, (uint32_t)st);
  fake_send(f, OI_PEER_AM_DATA, h, OI_PEER_DATA_HDR, d, len);
}

static void fake_read(fake *f, const msg *m, int mode) {
  uint64_t get = get64(m->d), off = get64(m->d + 16), n = get64(m->d + 24);
  uint32_t idx = get32(m->d + 8);
  const uint8_t *d = f->region + off;
  if (m->len != 32 || off > REGION || n > REGION - off) return;
  if (f->first_read_done) mode = GOOD;
  f->first_read_done = true;
  switch (mode) {
  case D_BAD_INDEX: fake_data(f, get, 99, 0, d, n); return;
  case D_WRONG_LENGTH: fake_data(f, get, idx, 0, d, n - 1); return;
  case D_STATUS_POSITIVE: fake_data(f, get, idx, 4, NULL, 0); return;
  case D_ERROR_WITH_BYTES: fake_data(f, get, idx, OI_ERR_IO, d, n); return;
  case D_DUPLICATE:
    fake_data(f, get, idx, 0, d, n);
    fake_data(f, get, idx, 0, d, n);
    return;
  case D_EMPTY_READ: fake_data(f, get, 1, 0, NULL, 0); return; /* read 1 is empty */
  case D_UNKNOWN_GET: fake_data(f, get + 1000, idx, 0, d, n); break;
  case D_REFUSED: fake_data(f, get, idx, OI_ERR_INVALID_ARGUMENT, NULL, 0); return;
  case D_SHORT_HEADER: {
    uint8_t h[8];
    put64(h, get);
    fake_send(f, OI_PEER_AM_DATA, h, sizeof h, d, n);
    return;
  }
  case D_CLOSE: fake_close_ep(f); return;
  case D_SILENT: return;
  default: break;
  }
  fake_data(f, get, idx, 0, d, n);
}

/* X_INTERLEAVE: once the request and both reads are in, answers the one
 * that came last first (the reader finds its op behind the other). */
static void fake_hold(fake *f, const msg *m) {
  if (f->nheld < (int)OI_ARRAY_LEN(f->held)) f->held[f->nheld++] = *m;
  if (f->nheld < 3) return;
  bool req_first = f->held[0].id == OI_PEER_AM_REQ;
  for (int pass = 0; pass < 2; pass++)
    for (int i = 0; i < f->nheld; i++) {
      bool is_req = f->held[i].id == OI_PEER_AM_REQ;
      if (is_req != (pass == (req_first ? 1 : 0))) continue;
      if (is_req)
        fake_req(f, &f->held[i], GOOD);
      else
        fake_read(f, &f->held[i], GOOD);
    }
  f->nheld = 0;
}

static void *fake_main(void *arg) {
  fake *f = arg;
  while (!atomic_load(&f->stop)) {
    int busy = 0;
    while (f->w && oi__ucx.ucp_worker_progress(f->w))
      busy = 1;
    int cfd = accept4(f->lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (cfd >= 0) {
      fake_close_ep(f); /* one connection at a time: the last one ends */
      int fl = 0;
      ioctl(cfd, FIONBIO, &fl); /* blocking, with timeouts */
      ptu_timeouts(cfd, 3000);
      f->fd = cfd;
      f->nin = 0;
      f->first_req_done = f->first_read_done = false;
      f->nheld = 0;
      fake_handshake(f, atomic_load(&f->mode));
      if (f->fd >= 0) close(f->fd);
      f->fd = -1;
      busy = 1;
    }
    /* Messages are answered here, never from inside the progress. */
    msg in[OI_ARRAY_LEN(f->in)];
    int nin = f->nin;
    memcpy(in, f->in, sizeof(msg) * (size_t)nin);
    f->nin = 0;
    int mode = atomic_load(&f->mode);
    for (int i = 0; i < nin; i++) {
      busy = 1;
      switch (in[i].id) {
      case OI_PEER_AM_REQ:
      case OI_PEER_AM_READ:
        if (mode == X_INTERLEAVE) {
          fake_hold(f, &in[i]);
          break;
        }
        if (in[i].id == OI_PEER_AM_REQ)
          fake_req(f, &in[i], mode);
        else
          fake_read(f, &in[i], mode);
        break;
      default: break;
      }
    }
    if (!busy) {
      struct timespec ts = {0, 500000};
      nanosleep(&ts, NULL);
    }
  }
  fake_close_ep(f);
  return NULL;
}

static fake *fake_start(void) {
  fake *f = calloc(1, sizeof *f);
  REQUIRE(f);
  f->fd = f->silent_fd = -1;
  for (uint64_t i = 0; i < REGION; i++)
    f->region[i] = region_byte(i);
  ucp_config_t *cfg = NULL;
  REQUIRE(oi__ucx.ucp_config_read(NULL, NULL, &cfg) == UCS_OK);
  ucp_params_t up = {.field_mask = UCP_PARAM_FIELD_FEATURES, .features = UCP_FEATURE_AM};
  REQUIRE(oi__ucx.ucp_init_version(UCP_API_MAJOR, UCP_API_MINOR, &up, cfg, &f->ctx) == UCS_OK);
  oi__ucx.ucp_config_release(cfg);
  f->lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = 0};
  sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t sl = sizeof sin;
  REQUIRE(f->lfd >= 0 && bind(f->lfd, (struct sockaddr *)&sin, sizeof sin) == 0 &&
          listen(f->lfd, 16) == 0 && getsockname(f->lfd, (struct sockaddr *)&sin, &sl) == 0);
  f->port = ntohs(sin.sin_port);
  REQUIRE(pthread_create(&f->th, NULL, fake_main, f) == 0);
  return f;
}

static void fake_stop(fake *f) {
  atomic_store(&f->stop, 1);
  pthread_join(f->th, NULL);
  close(f->lfd);
  if (f->silent_fd >= 0) close(f->silent_fd);
  oi__ucx.ucp_cleanup(f->ctx);
  free(f);
}

static void echo(void *ctx, const char *peer_id, const void *req, size_t len, oi_peer_reply *r) {
  OI_UNUSED(ctx);
  OI_UNUSED(peer_id);
  oi__peer_reply_set(r, req, len);
}

static oi_peer_net *make_net(const char *id, oi_peer_request_fn fn, void *ctx,
                             uint32_t timeout_ms) {
  oi_peer_net_options o = {.listen_addr = "127.0.0.1:0",
                           .node_id = id,
                           .secret = SECRET,
                           .secret_len = 32,
                           .timeout_ms = timeout_ms,
                           .on_request = fn,
                           .on_request_ctx = ctx,
                           .reads = OI_PEER_READS_AM};
  oi_peer_net *n = NULL;
  oi_status st = oi__peer_net_create(&o, &n);
  if (st) fprintf(stderr, "net %s: %s\n", id, oi_last_error());
  REQUIRE(st == OI_OK && n);
  return n;
}

static void addr_of(uint16_t port, char *out, size_t cap) {
  snprintf(out, cap, "127.0.0.1:%u", port);
}

/* The reader still serves: a call to a real holder answers byte-exact. */
static bool still_serves(oi_peer *real) {
  void *rep = NULL;
  size_t rl = 0;
  oi_status st = oi__peer_call(real, "alive", 5, &rep, &rl, 0);
  bool ok = st == OI_OK && rl == 5 && memcmp(rep, "alive", 5) == 0;
  oi__free(rep);
  return ok;
}

/* Is the connection dead? A call on it ends OI_ERR_CLOSED at once. */
static bool dead(oi_peer *p) {
  void *rep = NULL;
  size_t rl = 0;
  oi_status st = oi__peer_call(p, "x", 1, &rep, &rl, 0);
  oi__free(rep);
  return st == OI_ERR_CLOSED;
}

static void test_handshake_answered_badly(void) {
  fake *f = fake_start();
  /* Handshakes get 5 s (a loaded or sanitized run is slow); the silent
   * holder is met by a net of 500 ms. */
  oi_peer_net *rd = make_net("reader", echo, NULL, 5000);
  oi_peer_net *quick = make_net("quick", echo, NULL, 500);
  oi_peer_net *real = make_net("real", echo, NULL, 5000);
  char addr[64], raddr[64];
  addr_of(f->port, addr, sizeof addr);
  addr_of(oi__peer_net_port(real), raddr, sizeof raddr);
  oi_peer *rp = NULL;
  REQUIRE(oi__peer_connect(rd, raddr, &rp) == OI_OK);
  const struct {
    int mode;
    oi_status st, st2; /* either */
    const char *why;
  } cases[] = {
      {H_CLOSE_AT_HELLO, OI_ERR_IO, OI_ERR_CLOSED, ""},
      {H_CHALLENGE_V2, OI_ERR_VERSION, OI_ERR_VERSION, "version 2"},
      {H_WELCOME_EARLY, OI_ERR_PROTOCOL, OI_ERR_PROTOCOL, "frame of kind 4 out of turn"},
      {H_WELCOME_BAD_REGION, OI_ERR_PROTOCOL, OI_ERR_PROTOCOL, "bad region descriptor"},
      {H_WELCOME_BAD_MAC, OI_ERR_PERMISSION, OI_ERR_PERMISSION, "failed to prove"},
      {H_REFUSE, OI_ERR_PERMISSION, OI_ERR_PERMISSION, "refused"},
      {H_CLOSE_AT_AUTH, OI_ERR_IO, OI_ERR_CLOSED, ""},
      {H_SILENT, OI_ERR_TIMEOUT, OI_ERR_TIMEOUT, "no handshake within 500 ms"},
  };
  for (size_t i = 0; i < OI_ARRAY_LEN(cases); i++) {
    atomic_store(&f->mode, cases[i].mode);
    oi_peer *p = (oi_peer *)1;
    oi_status st = oi__peer_connect(cases[i].mode == H_SILENT ? quick : rd, addr, &p);
    if ((st != cases[i].st && st != cases[i].st2) || !strstr(oi_last_error(), cases[i].why)) {
      fprintf(stderr, "handshake case %d: %s (%s)\n", cases[i].mode, oi_status_str(st),
              oi_last_error());
      CHECK(false);
    }
    if (st == OI_OK) oi__peer_close(p);
    CHECK(still_serves(rp));
  }
  /* And the fake's right handshake connects, with its region. */
  atomic_store(&f->mode, GOOD);
  oi_peer *p = NULL;
  REQUIRE(oi__peer_connect(rd, addr, &p) == OI_OK);
  CHECK(oi__peer_region_len(p) == REGION && strcmp(oi__peer_node_id(p), "fake") == 0);
  oi__peer_close(p);
  oi_peer_stats s, sq;
  oi__peer_net_stats(rd, &s);
  oi__peer_net_stats(quick, &sq);
  CHECK(s.connect_fails + sq.connect_fails >= OI_ARRAY_LEN(cases));
  oi__peer_close(rp);
  oi__peer_net_destroy(quick);
  oi__peer_net_destroy(rd);
  oi__peer_net_destroy(real);
  fake_stop(f);
}

static void test_replies_answered_badly(void) {
  fake *f = fake_start();
  oi_peer_net *rd = make_net("reader", echo, NULL, 5000);
  oi_peer_net *real = make_net("real", echo, NULL, 5000);
  char addr[64], raddr[64];
  addr_of(f->port, addr, sizeof addr);
  addr_of(oi__peer_net_port(real), raddr, sizeof raddr);
  oi_peer *rp = NULL;
  REQUIRE(oi__peer_connect(rd, raddr, &rp) == OI_OK);
  const struct {
    int mode;
    oi_status st, st2;
    const char *why;
    bool kept; /* the connection survives (a valid answer) */
  } cases[] = {
      {GOOD, OI_OK, OI_OK, "", true},
      {R_SHORT, OI_ERR_PROTOCOL, OI_ERR_PROTOCOL, "bad reply (11 bytes)", false},
      {R_LONG, OI_ERR_PROTOCOL, OI_ERR_PROTOCOL, "bad reply", false},
      {R_STATUS_POSITIVE, OI_ERR_PROTOCOL, OI_ERR_PROTOCOL, "bad reply status 3", false},
      {R_STATUS_UNKNOWN, OI_ERR_PROTOCOL, OI_ERR_PROTOCOL, "bad reply status -17", false},
      {R_ERROR_WITH_BYTES, OI_ERR_PROTOCOL, OI_ERR_PROTOCOL, "bad reply status -2", false},
      {R_HEADER, OI_ERR_PROTOCOL, OI_ERR_PROTOCOL, "unexpected message form", false},
      {R_ERROR, OI_ERR_NOT_FOUND, OI_ERR_NOT_FOUND, "answered OI_ERR_NOT_FOUND", true},
      {R_OTHER_CALL, OI_OK, OI_OK, "", true},
      {R_TWICE, OI_OK, OI_OK, "", true},
      {R_CHALLENGE, OI_ERR_PROTOCOL, OI_ERR_PROTOCOL, "message 2 out of turn", false},
      {R_REQUEST, OI_ERR_PROTOCOL, OI_ERR_PROTOCOL, "message 6 out of turn", false},
      {R_CLOSE, OI_ERR_IO, OI_ERR_CLOSED, "", false},
  };
  for (size_t i = 0; i < OI_ARRAY_LEN(cases); i++) {
    atomic_store(&f->mode, cases[i].mode);
    oi_peer *p = NULL;
    REQUIRE(oi__peer_connect(rd, addr, &p) == OI_OK);
    oi_peer_stats s0, s1;
    oi__peer_net_stats(rd, &s0);
    void *rep = NULL;
    size_t rl = 0;
    oi_status st = oi__peer_call(p, "question", 8, &rep, &rl, 0);
    bool ok = (st == cases[i].st || st == cases[i].st2) && strstr(oi_last_error(), cases[i].why);
    if (st == OI_OK)
      ok = ok && rl == 8 && memcmp(rep, "question", 8) == 0;
    else
      ok = ok && rep == NULL && rl == 0;
    oi__free(rep);
    /* Dead, or still answering (the fake echoes later requests). */
    if (cases[i].kept) {
      rep = NULL;
      ok = ok && oi__peer_call(p, "again", 5, &rep, &rl, 0) == OI_OK && rl == 5 &&
           memcmp(rep, "again", 5) == 0;
      oi__free(rep);
    } else {
      ok = ok && dead(p);
    }
    oi__peer_net_stats(rd, &s1);
    if (!cases[i].kept && cases[i].mode != R_CLOSE) ok = ok && s1.errors > s0.errors;
    if (!ok) {
      fprintf(stderr, "reply case %d: %s (%s)\n", cases[i].mode, oi_status_str(st),
              oi_last_error());
      CHECK(false);
    }
    oi__peer_close(p);
    CHECK(still_serves(rp));
  }
  oi__peer_close(rp);
  oi__peer_net_destroy(rd);
  oi__peer_net_destroy(real);
  fake_stop(f);
}

static void test_reads_answered_badly(void) {
  fake *f = fake_start();
  oi_peer_net *rd = make_net("reader", echo, NULL, 5000);
  oi_peer_net *real = make_net("real", echo, NULL, 5000);
  char addr[64], raddr[64];
  addr_of(f->port, addr, sizeof addr);
  addr_of(oi__peer_net_port(real), raddr, sizeof raddr);
  oi_peer *rp = NULL;
  REQUIRE(oi__peer_connect(rd, raddr, &rp) == OI_OK);
  const struct {
    int mode;
    oi_status st, st2;
    const char *why;
    bool kept;
  } cases[] = {
      {GOOD, OI_OK, OI_OK, "", true},
      {D_BAD_INDEX, OI_ERR_PROTOCOL, OI_ERR_PROTOCOL, "bad read reply (read 99 of 3", false},
      {D_WRONG_LENGTH, OI_ERR_PROTOCOL, OI_ERR_PROTOCOL, "99 bytes", false},
      {D_STATUS_POSITIVE, OI_ERR_PROTOCOL, OI_ERR_PROTOCOL, "status 4", false},
      {D_ERROR_WITH_BYTES, OI_ERR_PROTOCOL, OI_ERR_PROTOCOL, "status -6", false},
      {D_DUPLICATE, OI_ERR_PROTOCOL, OI_ERR_PROTOCOL, "bad read reply (read 0", false},
      {D_EMPTY_READ, OI_ERR_PROTOCOL, OI_ERR_PROTOCOL, "bad read reply (read 1", false},
      {D_UNKNOWN_GET, OI_OK, OI_OK, "", true},
      {D_REFUSED, OI_ERR_INVALID_ARGUMENT, OI_ERR_INVALID_ARGUMENT, "refused read 0", true},
      {D_SHORT_HEADER, OI_ERR_PROTOCOL, OI_ERR_PROTOCOL, "unexpected message form", false},
      {D_CLOSE, OI_ERR_IO, OI_ERR_CLOSED, "", false},
      {D_SILENT, OI_ERR_TIMEOUT, OI_ERR_TIMEOUT, "not done within the timeout", false},
  };
  for (size_t i = 0; i < OI_ARRAY_LEN(cases); i++) {
    atomic_store(&f->mode, cases[i].mode);
    oi_peer *p = NULL;
    REQUIRE(oi__peer_connect(rd, addr, &p) == OI_OK);
    /* Three reads, the middle one empty (never sent). */
    uint8_t dst[3][100];
    memset(dst, 0xee, sizeof dst);
    oi_peer_read r[3] = {{0, 100, dst[0]}, {500, 0, dst[1]}, {1000, 100, dst[2]}};
    oi_status st = oi__peer_get(p, r, 3, cases[i].mode == D_SILENT ? 300 : 0);
    bool ok = (st == cases[i].st || st == cases[i].st2) && strstr(oi_last_error(), cases[i].why);
    if (st == OI_OK)
      for (int k = 0; k < 100; k++)
        ok = ok && dst[0][k] == region_byte((uint64_t)k) &&
             dst[2][k] == region_byte(1000u + (uint64_t)k) && dst[1][k] == 0xee;
    if (cases[i].kept) { /* served again, byte-exact */
      memset(dst, 0, sizeof dst);
      ok = ok && oi__peer_get(p, r, 3, 0) == OI_OK && dst[2][99] == region_byte(1099);
    } else {
      ok = ok && dead(p);
    }
    if (!ok) {
      fprintf(stderr, "read case %d: %s (%s)\n", cases[i].mode, oi_status_str(st), oi_last_error());
      CHECK(false);
    }
    oi__peer_close(p);
    CHECK(still_serves(rp));
  }
  oi_peer_stats s;
  oi__peer_net_stats(rd, &s);
  CHECK(s.bad_messages >= 6);
  oi__peer_close(rp);
  oi__peer_net_destroy(rd);
  oi__peer_net_destroy(real);
  fake_stop(f);
}

typedef struct caller {
  oi_peer *p;
  const char *q;
  uint32_t timeout_ms;
  oi_status st;
  char rep[32];
  size_t rl;
} caller;

static void *call_main(void *arg) {
  caller *c = arg;
  void *rep = NULL;
  c->st = oi__peer_call(c->p, c->q, strlen(c->q), &rep, &c->rl, c->timeout_ms);
  if (rep) memcpy(c->rep, rep, OI_MIN(c->rl, sizeof c->rep));
  oi__free(rep);
  return NULL;
}

/* ---- deferred answers ---- */

typedef struct deferrer {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  oi_peer_ticket *t[8];
  char req[8][16];
  int n;
} deferrer;

static void defer_all(void *ctx, const char *peer_id, const void *req, size_t len,
                      oi_peer_reply *r) {
  OI_UNUSED(peer_id);
  deferrer *d = ctx;
  oi_peer_ticket *t = oi__peer_defer(r);
  if (!t) { /* no memory for a ticket: answered now */
    oi__peer_reply_set(r, req, len);
    return;
  }
  pthread_mutex_lock(&d->lock);
  memcpy(d->req[d->n], req, OI_MIN(len, sizeof d->req[0]));
  d->t[d->n++] = t;
  pthread_cond_broadcast(&d->cond);
  pthread_mutex_unlock(&d->lock);
}

static oi_peer_ticket *take_ticket(deferrer *d, int i, char *req) {
  pthread_mutex_lock(&d->lock);
  while (d->n <= i)
    pthread_cond_wait(&d->cond, &d->lock);
  oi_peer_ticket *t = d->t[i];
  memcpy(req, d->req[i], sizeof d->req[0]);
  pthread_mutex_unlock(&d->lock);
  return t;
}

typedef struct getter {
  oi_peer *p;
  oi_status st;
  uint8_t dst[2][100];
} getter;

static void *get_main(void *arg) {
  getter *g = arg;
  oi_peer_read r[2] = {{0, 100, g->dst[0]}, {1000, 100, g->dst[1]}};
  g->st = oi__peer_get(g->p, r, 2, 0);
  return NULL;
}

/* A call and a get in flight on one connection, each answered after the
 * other was issued, in either order, while a call to another holder (which
 * defers its answer) is in flight between them: each reply finds its own op
 * past the others, all byte-exact. */
static void test_call_and_get_interleaved(void) {
  fake *f = fake_start();
  oi_peer_net *rd = make_net("reader", echo, NULL, 5000);
  deferrer d = {.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};
  oi_peer_net *h = make_net("holder", defer_all, &d, 5000);
  char addr[64], haddr[64];
  addr_of(f->port, addr, sizeof addr);
  addr_of(oi__peer_net_port(h), haddr, sizeof haddr);
  oi_peer *hp = NULL;
  REQUIRE(oi__peer_connect(rd, haddr, &hp) == OI_OK);
  atomic_store(&f->mode, X_INTERLEAVE);
  for (int order = 0; order < 2; order++) {
    oi_peer *p = NULL;
    REQUIRE(oi__peer_connect(rd, addr, &p) == OI_OK);
    getter g = {.p = p};
    pthread_t th, hth;
    caller hc = {.p = hp, .q = "elsewhere"};
    void *rep = NULL;
    size_t rl = 0;
    oi_status cst;
    struct timespec ts = {0, 50000000};
    char hreq[16];
    if (order == 0) { /* the get first, then the call */
      REQUIRE(pthread_create(&th, NULL, get_main, &g) == 0);
      nanosleep(&ts, NULL);
      REQUIRE(pthread_create(&hth, NULL, call_main, &hc) == 0);
      oi_peer_ticket *ht = take_ticket(&d, order, hreq);
      cst = oi__peer_call(p, "crossed", 7, &rep, &rl, 0);
      pthread_join(th, NULL);
      oi__peer_reply_set(oi__peer_ticket_reply(ht), "there", 5);
      oi__peer_answer(ht);
      pthread_join(hth, NULL);
    } else { /* the call first (in a thread), then the get */
      caller c = {.p = p, .q = "crossed"};
      REQUIRE(pthread_create(&th, NULL, call_main, &c) == 0);
      nanosleep(&ts, NULL);
      REQUIRE(pthread_create(&hth, NULL, call_main, &hc) == 0);
      oi_peer_ticket *ht = take_ticket(&d, order, hreq);
      get_main(&g);
      pthread_join(th, NULL);
      oi__peer_reply_set(oi__peer_ticket_reply(ht), "there", 5);
      oi__peer_answer(ht);
      pthread_join(hth, NULL);
      cst = c.st;
      rl = c.rl;
      rep = oi__malloc(32);
      memcpy(rep, c.rep, sizeof c.rep);
    }
    CHECK_OK(cst);
    CHECK(rl == 7 && memcmp(rep, "crossed", 7) == 0);
    CHECK(hc.st == OI_OK && hc.rl == 5 && memcmp(hc.rep, "there", 5) == 0);
    CHECK(memcmp(hreq, "elsewhere", 9) == 0);
    oi__free(rep);
    CHECK_OK(g.st);
    for (int k = 0; k < 100; k++)
      if (g.dst[0][k] != region_byte((uint64_t)k) ||
          g.dst[1][k] != region_byte(1000u + (uint64_t)k)) {
        CHECK(false);
        break;
      }
    oi__peer_close(p);
  }
  oi__peer_close(hp);
  oi__peer_net_destroy(rd);
  oi__peer_net_destroy(h);
  fake_stop(f);
}

/* A holder that offers one-sided reads (a region key of zeros) and answers
 * none: the reader's get times out, nothing lands in its buffer, and the
 * connection is closed. (UCX warns of the read it cannot deliver to the
 * fake, which has no RMA: UCX_LOG_LEVEL=error in main.) */
static void test_junk_region_key(void) {
  fake *f = fake_start();
  oi_peer_net_options o = {.listen_addr = "127.0.0.1:0",
                           .node_id = "reader",
                           .secret = SECRET,
                           .secret_len = 32,
                           .timeout_ms = 5000,
                           .reads = OI_PEER_READS_RMA};
  oi_peer_net *rd = NULL;
  REQUIRE(oi__peer_net_create(&o, &rd) == OI_OK);
  char addr[64];
  addr_of(f->port, addr, sizeof addr);
  atomic_store(&f->mode, H_JUNK_KEY);
  oi_peer *p = NULL;
  REQUIRE(oi__peer_connect(rd, addr, &p) == OI_OK);
  CHECK(oi__peer_region_len(p) == REGION);
  uint8_t dst[100];
  memset(dst, 0xee, sizeof dst);
  oi_peer_read r = {0, 100, dst};
  CHECK_ST(oi__peer_get(p, &r, 1, 300), OI_ERR_TIMEOUT);
  CHECK(strstr(oi_last_error(), "connection closed"));
  CHECK(dst[0] == 0xee && dst[99] == 0xee);
  CHECK(dead(p));
  oi__peer_close(p);
  oi__peer_net_destroy(rd);
  fake_stop(f);
}

static void test_deferred_answers(void) {
  deferrer d = {.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};
  oi_peer_net *h = make_net("holder", defer_all, &d, 5000);
  oi_peer_net *rd = make_net("reader", echo, NULL, 5000);
  char addr[64];
  addr_of(oi__peer_net_port(h), addr, sizeof addr);
  oi_peer *p = NULL;
  REQUIRE(oi__peer_connect(rd, addr, &p) == OI_OK);
  CHECK(oi__peer_defer(NULL) == NULL && oi__peer_ticket_reply(NULL) == NULL);
  oi__peer_answer(NULL); /* a no-op */

  /* Answered from this thread, with bytes, then with an error. */
  caller c = {.p = p, .q = "first"};
  pthread_t th;
  REQUIRE(pthread_create(&th, NULL, call_main, &c) == 0);
  char req[16];
  oi_peer_ticket *t = take_ticket(&d, 0, req);
  CHECK(memcmp(req, "first", 5) == 0);
  CHECK_OK(oi__peer_reply_set(oi__peer_ticket_reply(t), "later", 5));
  oi__peer_answer(t);
  pthread_join(th, NULL);
  CHECK(c.st == OI_OK && c.rl == 5 && memcmp(c.rep, "later", 5) == 0);

  c = (caller){.p = p, .q = "second"};
  REQUIRE(pthread_create(&th, NULL, call_main, &c) == 0);
  t = take_ticket(&d, 1, req);
  oi__peer_reply_set(oi__peer_ticket_reply(t), "dropped", 7); /* an error sends no bytes */
  oi__peer_reply_status(oi__peer_ticket_reply(t), OI_ERR_BUSY);
  oi__peer_answer(t);
  pthread_join(th, NULL);
  CHECK(c.st == OI_ERR_BUSY && c.rl == 0);

  /* The caller gives up and closes its connection before the answer: the
   * answer finds no connection and is dropped; the holder still answers a
   * new connection. */
  c = (caller){.p = p, .q = "third", .timeout_ms = 200};
  REQUIRE(pthread_create(&th, NULL, call_main, &c) == 0);
  t = take_ticket(&d, 2, req);
  pthread_join(th, NULL);
  CHECK(c.st == OI_ERR_TIMEOUT);
  oi__peer_close(p);
  oi_peer_stats s0, s1;
  oi__peer_net_stats(h, &s0);
  /* The holder learns of the close on its progress thread: wait for it. */
  for (int i = 0; i < 200; i++) {
    struct timespec ts = {0, 5000000};
    nanosleep(&ts, NULL);
  }
  oi_peer_ticket *late = t;
  p = NULL;
  REQUIRE(oi__peer_connect(rd, addr, &p) == OI_OK);
  /* Answered now, with a new connection in the holder's list (perhaps at
   * the old one's address): still dropped. */
  CHECK_OK(oi__peer_reply_set(oi__peer_ticket_reply(late), "late", 4));
  oi__peer_answer(late);
  c = (caller){.p = p, .q = "fourth"};
  REQUIRE(pthread_create(&th, NULL, call_main, &c) == 0);
  t = take_ticket(&d, 3, req);
  CHECK(memcmp(req, "fourth", 6) == 0);
  CHECK_OK(oi__peer_reply_set(oi__peer_ticket_reply(t), "fine", 4));
  oi__peer_answer(t);
  pthread_join(th, NULL);
  CHECK(c.st == OI_OK && c.rl == 4 && memcmp(c.rep, "fine", 4) == 0);
  oi__peer_net_stats(h, &s1);
  CHECK(s1.served == s0.served + 1); /* the late answer was not sent */

  oi__peer_close(p);
  oi__peer_net_destroy(rd);
  oi__peer_net_destroy(h);
}

int main(void) {
  setenv("UCX_LOG_LEVEL", "error", 0); /* before UCX loads */
  if (oi__ucx_load() != OI_OK) TEST_SKIP("UCX is not installed");
  RUN_TEST(test_handshake_answered_badly);
  RUN_TEST(test_replies_answered_badly);
  RUN_TEST(test_reads_answered_badly);
  RUN_TEST(test_call_and_get_interleaved);
  RUN_TEST(test_junk_region_key);
  RUN_TEST(test_deferred_answers);
  TEST_EXIT();
}
