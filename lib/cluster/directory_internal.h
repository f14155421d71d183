/* The cluster tier's block directory in Redis, internal to lib/cluster: its
 * types and the functions its files share. See directory.h and
 * docs/cluster.md. directory.c: open, close, publishing, the synchronous
 * calls, stats; directory_format.c: the keys and values it writes, the
 * URL, slots; directory_conn.c: connections (sides) and rounds of
 * pipelined commands; directory_thread.c: the background thread.
 *
 * Connections come in two sides (`side`): the background thread's `bs` and
 * the synchronous calls' `ss`. A side holds one node for a single instance,
 * or a Redis Cluster's masters and its slot map; oi__dir_side_exec runs a round of
 * commands over a side, each to the master of its key's slot, pipelined,
 * following redirections.
 *
 * Locks: `lock` guards the queue, the advertised address, the thread's
 * wake-up flags and last_error; `sync_lock` guards the synchronous side
 * and its argument buffers. sync_lock may be held while taking lock, never
 * the reverse. The background side `bs` and the script's sha are the
 * background thread's alone (and oi__dir_open's before it starts,
 * oi__dir_close's after it ended). Counters are relaxed atomics.
 *
 * hiredis writes with write(2): a peer that went away raises SIGPIPE. Every
 * round trip runs with SIGPIPE blocked in the calling thread, and a SIGPIPE
 * it raised is consumed before the mask is restored. */
#ifndef OI_CLUSTER_DIRECTORY_INTERNAL_H
#define OI_CLUSTER_DIRECTORY_INTERNAL_H

#include <hiredis/hiredis.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "cluster/directory.h"
#include "cluster/redis_tls.h"
#include "cluster/sha256.h"

#define BACKOFF_MIN_MS 100u
#define BACKOFF_MAX_MS 2000u
#define PIPELINE 1024u /* commands appended before their replies are read */

extern const char oi__dir_cas_del[];

enum { Q_PUBLISH = 1, Q_UNPUBLISH = 2 };

typedef struct qent {
  oi_tier_key key;
  uint8_t op;
} qent;

/* One Redis server the directory talks to: the single instance, or one
 * master of a Redis Cluster. */
typedef struct rnode {
  char host[256]; /* or the socket path when port is 0 */
  int port;
  redisContext *c; /* NULL: not connected */
  uint32_t sent;   /* commands appended in the current round */
} rnode;

/* A command of a round (side_exec): the caller's index, its key's slot, the
 * node it goes to, whether ASKING goes first. */
typedef struct xitem {
  uint32_t i;
  uint16_t slot;
  int16_t node;
  uint8_t asking;
} xitem;

/* One set of connections: the background thread's or the synchronous
 * calls'. Single instance: one node, no slot map. Cluster: the masters, and
 * slots[s] the index of the master serving slot s (-1: none known). */
typedef struct side {
  rnode *nodes;
  size_t n_nodes, nodes_cap;
  int16_t *slots; /* OI_DIR_SLOTS entries; NULL for a single instance */
  bool up;        /* opened (side_open) and not lost since */
  bool stale;     /* a MOVED was followed: reload the slot map */
  xitem *it, *it2;
  size_t it_cap, it2_cap;
} side;

#define SEEDS_MAX 16u
#define NODES_MAX 1024u
#define REDIRECT_ROUNDS 5

/* A block entry whose MAC was checked, kept by its key so that the same
 * bytes read again need no second HMAC (oi__dir_entry_check): a lookup of
 * a hot prefix reads the same entries over and over. Only the exact bytes
 * that passed are kept, so a value that differs in one byte is checked in
 * full; the expiry is checked every time. Under sync_lock. */
#define VERIFIED_SLOTS 4096u
#define VERIFIED_VALUE_MAX (OI_DIR_NODE_ID_MAX + 2u * 21u + 2u * OI_DIR_MAC_LEN + 1u)
typedef struct verified {
  uint16_t klen, vlen; /* 0: empty */
  char key[OI_DIR_KEY_MAX];
  char val[VERIFIED_VALUE_MAX];
} verified;

struct oi_dir {
  oi_dir_options o; /* url and node_id point at the copies below */
  char *url, *node_id;
  bool cluster; /* redis+cluster:// */
  bool tls;     /* rediss:// or rediss+cluster:// */
  oi_redis_tls *tls_ctx;
  char host[256];
  int port;
  char unix_path[108];
  uint32_t db;
  struct {
    char host[256];
    int port;
  } seeds[SEEDS_MAX]; /* cluster: the addresses of the url */
  size_t n_seeds;
  char self_val[OI_DIR_NODE_ID_MAX + 24]; /* "<node_id> <epoch> ": our entries start so */
  char node_key[OI_DIR_NODE_ID_MAX + OI_DIR_PREFIX_MAX + 8];     /* "<prefix>node:<node_id>" */
  char prefix[OI_DIR_PREFIX_MAX + 1];                            /* "oi:" or "oi:<name>:" */
  char dropped_key[OI_DIR_NODE_ID_MAX + OI_DIR_PREFIX_MAX + 12]; /* "<prefix>dropped:<node_id>" */
  oi_hmac_sha256 mac0;            /* keyed with the cluster secret; copied for each MAC */
  char *user, *password;          /* Redis AUTH; NULL: none */
  _Atomic bool auth_refused;      /* the last connect failed at AUTH or at TLS's certificates */
  _Atomic uint64_t reject_log_ns; /* when a rejected value was last logged */

  pthread_mutex_t lock;
  pthread_cond_t cv;      /* wakes the thread (CLOCK_MONOTONIC) */
  pthread_cond_t done_cv; /* q_done advanced */
  qent *q, *q2;           /* q: producers append; q2: the thread's batch */
  size_t q_len, q_cap, q2_cap;
  uint64_t q_seq, q_done; /* entries given; entries sent, lost or dropped */
  char *advertise;
  bool advertise_dirty, check, stop;
  char last_error[OI_DIR_ERROR_TEXT];
  pthread_t thread;
  bool thread_ok;

  side bs; /* the background thread's */
  char sha[41];

  pthread_mutex_t sync_lock;
  side ss;           /* the synchronous calls' */
  uint64_t sync_gen; /* the generation `ss` was opened in */
  char *keybuf;
  size_t keybuf_cap;
  const char **argv;
  size_t *argvlen;
  size_t argv_cap, argvlen_cap;
  uint8_t *found;
  size_t found_cap;
  verified *seen; /* entries whose MAC passed, by key (NULL until the first) */

  _Atomic bool connected;
  _Atomic uint64_t generation, reconnects, published, unpublished, unpublish_missed, stale_removed,
      lookups, lookup_keys, entries_found, parse_failures, queue_dropped, errors, lookup_ns_sum,
      redirects, rejected_entries, dropped;
  oi_latency_hist lookup_hist;
};

#define ADD(field, v) atomic_fetch_add_explicit(&d->field, (v), memory_order_relaxed)

typedef struct sigpipe_guard {
  sigset_t old;
  bool pending_before;
} sigpipe_guard;

/* A round of pipelined commands over a side's nodes (oi__dir_side_exec). */
enum { XR_OK, XR_LOST, XR_DOWN };
enum { R_DONE, R_RETRY, R_KEPT };

typedef struct xops {
  /* The key of command i (its slot picks the node). */
  const char *(*key)(oi_dir *d, void *ctx, size_t i, char buf[OI_DIR_KEY_MAX + 24]);
  /* Appends command i to c. */
  void (*append)(oi_dir *d, void *ctx, size_t i, redisContext *c);
  /* The final reply of command i (NULL: redirections did not settle; the
   * error is noted). R_RETRY sends it again (NOSCRIPT), R_KEPT keeps r. */
  int (*reply)(oi_dir *d, void *ctx, size_t i, redisReply *r);
  void *ctx;
} xops;

/* "MOVED|ASK <slot> <host>:<port>" into slot, host, port; an empty host is
 * `deflt`. */

/* One command over a side (oi__dir_side_one). */
typedef struct one_ctx {
  const char *pre; /* NULL, or an argument before the key */
  const char *key;
  const char *cmd; /* a format of [pre,] key [and arg] */
  const char *arg;
  redisReply *r; /* the reply, kept */
} one_ctx;

/* ---- directory_format.c */
/* Values carry "<fields> <expiry_ms> <mac hex32>": the MAC is HMAC-SHA256
 * under the cluster secret of the kind's tag, the Redis key and the fields
 * with the expiry, cut to OI_DIR_MAC_LEN bytes. */
#define OI_DIR_TAG_BLOCK "openinfer directory v1 block entry"
#define OI_DIR_TAG_NODE "openinfer directory v1 node record"
#define OI_DIR_VALUE_MAX (OI_DIR_ADDR_MAX + 96u)
uint64_t oi__dir_wall_ms(void);
void oi__dir_mac(const oi_dir *d, const char *tag, const char *key, size_t klen, const char *fields,
                 size_t flen, uint8_t out[OI_DIR_MAC_LEN]);
/* A block entry's value for holder node_id/epoch, expiring at expiry_ms
 * (with its MAC; key: the entry's Redis key) into out (OI_DIR_VALUE_MAX + 1).
 * @return its length. */
size_t oi__dir_entry_value(const oi_dir *d, const char *key, size_t klen, const char *node_id,
                           uint64_t epoch, uint64_t expiry_ms, char *out);
/* A node record's value for this node at addr. @return its length. */
size_t oi__dir_node_value(const oi_dir *d, const char *addr, uint64_t expiry_ms, char *out);
/* Whether block entry value s[0..len) at `key` is believed (parses, its MAC
 * holds, not past its expiry and the clock skew allowed): on true *out is
 * its holder. Counts what is not (parse_failures, rejected_entries). */
bool oi__dir_entry_check(oi_dir *d, const char *key, size_t klen, const char *s, size_t len,
                         oi_dir_holder *out);
/* Counts a value not believed (rejected_entries) and logs why, at most once
 * a minute. */
void oi__dir_reject(oi_dir *d, const char *key, const char *why);
bool oi__dir_node_id_valid(const char *s, size_t len);
bool oi__dir_addr_valid(const char *s, size_t len);
bool oi__dir_parse_u64(const char *s, size_t len, uint64_t *out);
oi_status oi__dir_parse_url(oi_dir *d, const char *url);
oi_status oi__dir_tls_open(oi_dir *d, const oi_dir_options *opts);

/* ---- directory_conn.c */
void oi__dir_note_error(oi_dir *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void oi__dir_sigpipe_block(sigpipe_guard *g);
void oi__dir_sigpipe_restore(sigpipe_guard *g);
redisContext *oi__dir_connect(oi_dir *d, const char *host, int port, char *err, size_t cap);
void oi__dir_side_drop(side *s);
void oi__dir_side_free(side *s);
bool oi__dir_side_open(oi_dir *d, side *s, bool script, char *err, size_t cap);
bool oi__dir_is_err(redisReply *r, const char *prefix);
int oi__dir_side_exec(oi_dir *d, side *s, size_t n, const xops *x, char *err, size_t cap);
bool oi__dir_bg_connect(oi_dir *d);

/* ---- directory_thread.c */
const char *oi__dir_cluster_hint(oi_dir *d, const char *e);
int oi__dir_side_one(oi_dir *d, side *s, one_ctx *o, char *err, size_t cap);
void *oi__dir_thread_main(void *arg);

#endif /* OI_CLUSTER_DIRECTORY_INTERNAL_H */
