/* The peer transport, internal to lib/cluster: its types and the functions
 * its files share. peer.c: the API (nets, connections, calls, gets);
 * peer_progress.c: the op queue and the progress thread; peer_conn.c:
 * connections and the message handlers; peer_tcp.c: the node's TCP
 * listener and the handshake over it (both sides); peer_wire.c: the
 * handshake's messages parsed and its MAC; peer_wire.h: the messages.
 *
 * The handshake never touches UCX: the listener thread accepts plain TCP
 * connections and runs each handshake in a thread of its own (at most
 * MAX_HANDSHAKES at once), with the net's timeout as its deadline; a
 * client runs its side in oi__peer_connect's caller. Only once both sides
 * proved the secret do they swap UCX worker addresses and ask the progress
 * thread for workers and endpoints (OP_WORKER, OP_ACCEPT on the server,
 * OP_CONNECT on the client). Each connection has a UCX worker of its own
 * on both sides: UCX pairs the two endpoints two workers create to each
 * other by a count per remote worker, which two nodes' connections in both
 * directions, or a failed one, would put out of step; and a connection
 * ended on one side ends on the other at once (its worker destroyed, its
 * sockets close), where UCX would keep a shared socket open.
 *
 * One progress thread per net makes every UCX call (the worker is created
 * UCS_THREAD_MODE_SINGLE). Callers build an `op`, queue it under `lock`,
 * wake the thread through an eventfd and sleep on `cond` until the thread
 * marks it done. The thread's loop: run the queued ops, progress the worker,
 * scan the active ops (finish the ready ones, enforce deadlines), close and
 * free dead connections, then arm the workers and sleep in epoll on the
 * workers' fds and the eventfd.
 *
 * Connections (oi_peer) live in the net's list and are touched only by the
 * progress thread, except the fields set before a connect returns (node id,
 * region), which the caller reads afterwards. */
#ifndef OI_CLUSTER_PEER_INTERNAL_H
#define OI_CLUSTER_PEER_INTERNAL_H

#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "cluster/peer.h"
#include "cluster/peer_wire.h"
#include "cluster/sha256.h"
#include "cluster/ucx.h"
#include "core/le_bytes.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the peer messages are little-endian; this build writes them natively"
#endif

#define NONCE OI_PEER_NONCE
#define MAX_RKEY OI_PEER_MAX_RKEY
#define MAX_HANDSHAKES 256u /* inbound connections still authenticating */
#define IDLE_WAIT_MS 100
#define SHUTDOWN_MS 5000
#define OI_PEER_TCP_SEG "256k" /* UCX TCP segment size (see oi__peer_net_create) */
_Static_assert(OI_PEER_MAC_LEN == OI_SHA256_LEN, "the handshake MAC is an HMAC-SHA256");

/* P_ACCEPTING: an inbound connection's worker exists, its endpoint not
 * yet (the handshake thread holds it: owned). */
enum { P_ACCEPTING = 1, P_READY, P_DEAD };
enum {
  OP_CONNECT = 1,
  OP_CALL,
  OP_GET,
  OP_CLOSE,
  OP_REGISTER,
  OP_ANSWER,
  OP_WORKER,
  OP_ACCEPT,
  OP_ABORT
};

typedef struct op op;

struct oi_peer {
  oi_peer_net *net;
  ucp_ep_h ep;
  ucp_worker_h worker; /* its own worker (see above) */
  int efd;             /* the worker's event fd */
  void *close_req;     /* the ep's close, in progress on `worker` */
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
  bool rma;        /* reads with ucp_get_nbx (else OI_PEER_AM_READ) */
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
  /* connect, accept: the remote worker's address; connect: the holder's
   * region key (the thread unpacks it), and this side's worker address
   * back in reply / reply_len */
  uint8_t *raddr, *rkey_in;
  size_t raddr_len, rkey_in_len;
  /* answer: msg (the framed reply) goes to the connection `peer` if it is
   * still the one with this serial */
  uint64_t serial;
};

/* A message to send once the worker's progress returns (never from inside
 * a UCX callback: see flush_outbox). */
typedef struct outmsg {
  oi_peer *p;
  unsigned id;
  uint8_t hdr[OI_PEER_DATA_HDR];
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
  int lfd;   /* the TCP listener (-1: none) */
  int lwake; /* eventfd: wakes the listener thread to stop */
  pthread_t lthread;
  bool lthread_started;
  uint32_t hs_threads;        /* handshake threads running (under lock) */
  uint64_t refusal_window_ns; /* refusals logged and not, this second (under lock) */
  uint32_t refusals_logged;
  uint64_t refusals_dropped;
  uint16_t port;
  int efd, wakefd, epfd;
  pthread_t thread;
  bool thread_started;
  /* A worker made ahead by the progress thread while it had nothing else
   * to do (and its event fd), for the next connection on either side:
   * making one takes several ms (UCX opens its TCP interfaces), which a
   * connection's first fetch would otherwise wait for twice (both ends). */
  ucp_worker_h spare;
  int spare_efd;
  uint64_t spare_retry_ns; /* after a failure to make one: not before then */
  bool no_spare;           /* oi_peer_net_options.no_spare_worker */

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
  am_arg am_args[OI_PEER_AM_LAST];

  /* The thread's. */
  oi_peer *peers;
  uint64_t next_serial;
  op *active;
  outmsg *out_head, *out_tail;

  struct {
    _Atomic uint64_t accepted, refused, connected, connect_fails, calls, served, gets, reads,
        bytes_read, errors, bad_messages, bytes_served;
  } st;
};

#define STAT_ADD(net, f, v) atomic_fetch_add_explicit(&(net)->st.f, (v), memory_order_relaxed)

/* ---- peer.c */
oi_status oi__peer_ucs_to_oi(ucs_status_t s);
void oi__peer_format_addr(const struct sockaddr *sa, char *out, size_t cap);

/* ---- peer_progress.c: the op queue and the progress thread */
void oi__peer_op_unref(op *o);
void oi__peer_op_ready(op *o, oi_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void oi__peer_op_done(oi_peer_net *net, op *o);
op *oi__peer_op_new(int kind);
void oi__peer_wake(oi_peer_net *net);
bool oi__peer_enqueue(oi_peer_net *net, op *o);
oi_status oi__peer_submit(oi_peer_net *net, op *o);
op *oi__peer_take_queue(oi_peer_net *net);
void *oi__peer_progress_main(void *arg);

/* ---- peer_conn.c: connections, the handshake, the message handlers */
const char *oi__peer_name(const oi_peer *p);
void oi__peer_fail(oi_peer *p, oi_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void oi__peer_close_ep(oi_peer_net *net, oi_peer *p);
void oi__peer_reap(oi_peer_net *net);
void oi__peer_send_msg(oi_peer *p, unsigned id, void *buf, size_t len);
void oi__peer_flush_outbox(oi_peer_net *net);
void oi__peer_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status);
ucs_status_t oi__peer_am_cb(void *arg, const void *header, size_t header_length, void *data,
                            size_t length, const ucp_am_recv_param_t *param);
ucp_worker_h oi__peer_worker(const oi_peer *p);
void oi__peer_destroy_worker(oi_peer_net *net, oi_peer *p);

/* ---- peer.c: a worker with the message handlers and its fd in epoll */
oi_status oi__peer_worker_new(oi_peer_net *net, ucp_worker_h *w, int *efd);

/* ---- peer_tcp.c: the listener and the handshake */
oi_status oi__peer_listen(oi_peer_net *net, const struct sockaddr_in *sin);
void oi__peer_listen_stop(oi_peer_net *net);
oi_status oi__peer_tcp_connect(oi_peer_net *net, const struct sockaddr_in *sin, oi_peer **out);

/* ---- peer_wire.c */
void oi__peer_handshake_mac(const oi_peer_net *net, const oi_peer *p, bool client_proof,
                            uint8_t out[OI_SHA256_LEN]);

#endif /* OI_CLUSTER_PEER_INTERNAL_H */
