/* The cluster tier's peer transport (docs/cluster.md, "Peer transport"): node-to-node
 * connections over UCX (RDMA verbs where an HCA exists, TCP otherwise),
 * mutually authenticated with HMAC-SHA256 over a secret the cluster shares;
 * a request/response call over active messages, and one-sided reads (RMA
 * gets) from the region a holder registered (its host pool) into local
 * memory.
 *
 * Threads: a net owns one UCX context and one worker, driven by its own
 * progress thread; every UCX call is made on that thread (callers hand it
 * commands and wait), so the worker runs single-threaded. Every function
 * here may be called from any thread, concurrently, except inside
 * on_request (which runs on the progress thread: it must not block and
 * must not call into the same net). */
#ifndef OI_CLUSTER_PEER_H
#define OI_CLUSTER_PEER_H

#include <stddef.h>
#include <stdint.h>

#include "core/core.h"

/* Bounds on what a peer may send. */
#define OI_PEER_MAX_MSG (1u << 20)   /* a call's request or reply payload */
#define OI_PEER_MAX_NODE_ID 255u     /* bytes of a node id */
#define OI_PEER_MIN_SECRET 16u       /* bytes of the shared secret, at least */
#define OI_PEER_MAX_SECRET 1024u     /* and at most */
#define OI_PEER_MAX_READS (1u << 16) /* reads in one oi__peer_get */
#define OI_PEER_NONCE 32u            /* bytes of a handshake nonce */
#define OI_PEER_MAC_LEN 32u          /* bytes of a handshake MAC (HMAC-SHA256) */
#define OI_PEER_MAX_RKEY 4096u       /* bytes of the region key in a welcome */

typedef struct oi_peer_net oi_peer_net;
typedef struct oi_peer oi_peer;

/* The holder's answer to a request. `status` OI_OK (the default) sends
 * `data` (len bytes, at most OI_PEER_MAX_MSG) back; any other status is sent
 * alone and the caller's oi__peer_call returns it. Set it with
 * oi__peer_reply_set (copies) or oi__peer_reply_status. */
typedef struct oi_peer_reply oi_peer_reply;
oi_status oi__peer_reply_set(oi_peer_reply *r, const void *data, size_t len);
void oi__peer_reply_status(oi_peer_reply *r, oi_status st);

/* An answer given later, from any thread, so that on_request need not do
 * slow work on the progress thread (which moves every byte of the net).
 * Inside on_request, oi__peer_defer(r) takes the request over: nothing is
 * sent when on_request returns. Fill oi__peer_ticket_reply(ticket) with
 * oi__peer_reply_set / oi__peer_reply_status, then oi__peer_answer(ticket)
 * sends it (and frees the ticket). An answer whose connection has gone
 * since, or whose net is stopping, is dropped (the caller's call times out
 * or ends with the connection). Every ticket must be answered before
 * oi__peer_net_destroy.
 * @return NULL when out of memory: then r is answered when on_request
 *         returns, as if not deferred. */
typedef struct oi_peer_ticket oi_peer_ticket;
oi_peer_ticket *oi__peer_defer(oi_peer_reply *r);
oi_peer_reply *oi__peer_ticket_reply(oi_peer_ticket *t);
void oi__peer_answer(oi_peer_ticket *t);

/* A request from an authenticated peer (node id `peer_node_id`), on the
 * progress thread. The reply goes back when it returns. */
typedef void (*oi_peer_request_fn)(void *ctx, const char *peer_node_id, const void *req, size_t len,
                                   oi_peer_reply *r);

/* How reads reach the holder's region. One-sided (ucp_get_nbx) where the
 * transport does RMA in hardware (RDMA verbs); over TCP UCX 1.13 only
 * emulates RMA in software, and its emulation aborts the holder process
 * when a reader's connection fails while a read is being answered, so there
 * the holder serves reads itself: the reader asks with a message and the
 * bytes come back as an active message (rendezvous into local_dst for large
 * ones). The holder decides (its welcome says whether it serves one-sided
 * reads); AUTO: one-sided when an RDMA device exists (/sys/class/infiniband),
 * or as the environment's OI_PEER_READS=rma|am says. Only a net with
 * one-sided reads enables UCX's RMA at all: UCX's software RMA answers a
 * get for any address of the process from any connected endpoint. */
enum { OI_PEER_READS_AUTO = 0, OI_PEER_READS_RMA = 1, OI_PEER_READS_AM = 2 };

typedef struct oi_peer_net_options {
  const char *listen_addr;       /* "IP:PORT" (IPv4); port 0 picks a free one; NULL: no listener */
  const char *node_id;           /* this node's id, 1..OI_PEER_MAX_NODE_ID bytes */
  const uint8_t *secret;         /* shared by the cluster */
  size_t secret_len;             /* OI_PEER_MIN_SECRET..OI_PEER_MAX_SECRET */
  uint32_t timeout_ms;           /* connect and handshake; calls and gets given 0 (0: 5000) */
  oi_peer_request_fn on_request; /* NULL: every request is answered OI_ERR_UNSUPPORTED */
  void *on_request_ctx;
  int reads; /* OI_PEER_READS_*: one-sided reads both offered and used, or neither */
  /* No worker made ahead: each connection makes its own when it is made
   * (several ms more per connection, on both sides; for tests of a
   * worker that fails to be made). */
  bool no_spare_worker;
} oi_peer_net_options;

typedef struct oi_peer_stats {
  uint64_t accepted;      /* inbound connections that authenticated */
  uint64_t refused;       /* inbound connections refused (failed or abandoned handshake) */
  uint64_t connected;     /* outbound connections that authenticated */
  uint64_t connect_fails; /* outbound connections that did not */
  uint64_t calls;         /* oi__peer_call made (answered or not) */
  uint64_t served;        /* requests answered to peers */
  uint64_t gets;          /* oi__peer_get made */
  uint64_t reads;         /* reads in them */
  uint64_t bytes_read;    /* bytes of gets that completed */
  uint64_t errors;        /* calls and gets that failed, endpoint errors */
  uint64_t bad_messages;  /* malformed or unexpected messages from peers */
  uint64_t bytes_served;  /* bytes of reads served to peers (served reads only) */
} oi_peer_stats;

struct sockaddr_in;
/* Parses "IP:PORT" (IPv4, port 0..65535) into *sin.
 * @return OI_ERR_INVALID_ARGUMENT, naming the address, when it is not one. */
oi_status oi__peer_parse_addr(const char *addr, struct sockaddr_in *sin);

/* Creates a net: the UCX context (RMA and active messages), the worker, the
 * listener and the progress thread. */
oi_status oi__peer_net_create(const oi_peer_net_options *opts, oi_peer_net **out);
/* The port the listener is bound to (0 without one). */
uint16_t oi__peer_net_port(const oi_peer_net *net);
/* Stops the net: every operation still waiting ends with OI_ERR_CLOSED,
 * every connection is closed and every oi_peer of the net is freed (do not
 * oi__peer_close them afterwards); calls made after (or racing with) this
 * one are not allowed. NULL is a no-op. */
void oi__peer_net_destroy(oi_peer_net *net);
/* Registers [base, base+len) (once per net; it must outlive the net): the
 * only memory peers can read, and only once authenticated. With one-sided
 * reads it is mapped with UCX (ucp_mem_map) and its key goes to peers. Connections made earlier do
 * not see it (a peer learns the region in its handshake).
 * @return OI_ERR_STATE when a region is already registered. */
oi_status oi__peer_net_register(oi_peer_net *net, void *base, size_t len);
void oi__peer_net_stats(const oi_peer_net *net, oi_peer_stats *out);

/* Connects to the net at "IP:PORT" and authenticates both ways within the
 * net's timeout_ms.
 * @return OI_ERR_PERMISSION when either side refused the other,
 *         OI_ERR_TIMEOUT, OI_ERR_IO (unreachable, reset), OI_ERR_PROTOCOL. */
oi_status oi__peer_connect(oi_peer_net *net, const char *addr, oi_peer **out);
/* Closes the connection and frees `peer` (no operation on it may be in
 * flight, but oi__peer_send's). NULL is a no-op. */
void oi__peer_close(oi_peer *peer);
/* Ends the connection now, from any thread, with operations on it in
 * flight: they end with OI_ERR_CLOSED (a get once no transfer can still
 * write into its local_dst), and every later one fails. The peer is still
 * to be oi__peer_close'd. For a reader that learned the holder is gone. */
void oi__peer_abort(oi_peer *peer);
/* The node id the peer proved, and the size of the region it exposes. */
const char *oi__peer_node_id(const oi_peer *peer);
uint64_t oi__peer_region_len(const oi_peer *peer);

/* Sends `req` (len <= OI_PEER_MAX_MSG) to the peer's on_request and waits
 * for the answer: *reply (oi__free it; NULL when reply_len is 0) and
 * *reply_len. timeout_ms 0: the net's.
 * @return the status the holder answered, OI_ERR_TIMEOUT (the connection
 *         stays usable), OI_ERR_CLOSED / OI_ERR_IO (the connection failed). */
oi_status oi__peer_call(oi_peer *peer, const void *req, size_t len, void **reply, size_t *reply_len,
                        uint32_t timeout_ms);

/* Sends `req` as oi__peer_call does but does not wait: OI_OK once it is
 * queued; the answer, or the call's failure or timeout (timeout_ms 0: the
 * net's), is dropped when it comes (a failure counts in stats.errors). For
 * requests whose answer nobody needs (a lease's release). The peer may be
 * closed, and the net destroyed, with such sends still in flight.
 * @return OI_ERR_INVALID_ARGUMENT, OI_ERR_CLOSED (the net is stopping). */
oi_status oi__peer_send(oi_peer *peer, const void *req, size_t len, uint32_t timeout_ms);

/* One read: `len` bytes at `remote_offset` in the peer's region into
 * `local_dst`. */
typedef struct oi_peer_read {
  uint64_t remote_offset;
  uint64_t len;
  void *local_dst;
} oi_peer_read;

/* Issues all n reads at once (one-sided: the holder's CPU does not take
 * part where the transport can do RMA) and waits for all of them. OI_OK
 * only when every byte arrived. On a timeout the connection is closed (UCX
 * cannot cancel a get in flight): the call returns OI_ERR_TIMEOUT once no
 * transfer can still write into a local_dst, and the peer is then dead
 * (every later operation: OI_ERR_CLOSED). timeout_ms 0: the net's.
 * @return OI_ERR_INVALID_ARGUMENT for a read outside the advertised region
 *         (nothing issued), OI_ERR_TIMEOUT, OI_ERR_IO, OI_ERR_CLOSED. */
oi_status oi__peer_get(oi_peer *peer, const oi_peer_read *reads, size_t n, uint32_t timeout_ms);

/* The handshake's parsers, as the connection code runs them on what a peer
 * sent (also for the fuzz target): they only read d[0..len) and fail with a
 * message (oi_last_error) on anything malformed. */

/* HELLO (from a client) and CHALLENGE (from the server): magic, version,
 * id length, nonce, id. On OI_OK: the nonce, the id (1..OI_PEER_MAX_NODE_ID
 * bytes, no NUL, NUL-terminated in id) and its length.
 * @return OI_ERR_PROTOCOL, OI_ERR_VERSION (another protocol version). */
oi_status oi__peer_parse_hello(const uint8_t *d, size_t len, uint8_t nonce[OI_PEER_NONCE],
                               char id[OI_PEER_MAX_NODE_ID + 1], size_t *id_len);
/* AUTH (from the client): magic, MAC. On OI_OK *mac points at the MAC's
 * OI_PEER_MAC_LEN bytes in d (the caller compares it).
 * @return OI_ERR_PROTOCOL. */
oi_status oi__peer_parse_auth(const uint8_t *d, size_t len, const uint8_t **mac);

/* WELCOME (from the server): magic, MAC, the region's base and length, the
 * key's length, flags, the key. */
typedef struct oi_peer_welcome {
  const uint8_t *mac;  /* OI_PEER_MAC_LEN bytes in d */
  uint64_t base, len;  /* the region (base + len does not wrap) */
  const uint8_t *rkey; /* rkey_len bytes in d: the last of the message */
  uint32_t rkey_len;   /* at most OI_PEER_MAX_RKEY; 0 exactly when flags is 0 */
  uint32_t flags;      /* 0, or 1: one-sided reads served (the key follows) */
} oi_peer_welcome;
/* `want_mac` (NULL: not checked) is compared, in constant time, before the
 * region descriptor is: a welcome whose MAC differs is OI_ERR_PERMISSION.
 * @return OI_ERR_PROTOCOL, OI_ERR_PERMISSION. */
oi_status oi__peer_parse_welcome(const uint8_t *d, size_t len,
                                 const uint8_t want_mac[OI_PEER_MAC_LEN], oi_peer_welcome *out);

#endif
