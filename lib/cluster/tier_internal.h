/* The cluster tier's private declarations, shared by its files: tier.c
 * (attach, destroy, stats; notes of seals and evictions and the worker that
 * publishes them), tier_msg.c (the node-to-node messages' checks),
 * tier_serve.c (the holder: answering peers' LEASEs and RELEASEs) and
 * tier_fetch.c (the reader: the tier's lookup and promote, the fetchers).
 * Included by no file outside lib/cluster. */
#ifndef OI_CLUSTER_TIER_INTERNAL_H
#define OI_CLUSTER_TIER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "cluster/directory.h"
#include "cluster/peer.h"
#include "cluster/tier.h"
#include "cluster/tier_wire.h"

/* ---- node-to-node messages (tier_msg.c; their layout: tier_wire.h) ---- */

/* The type of a well-formed message of `len` bytes, or 0 (with a message). */
int oi__cluster_msg_type(const uint8_t *m, size_t len, bool reply);

/* ---- the tier ---------------------------------------------------------------------- */

#define NOTE_RING_MAX (1u << 20)
#define MAX_PEERS 64
#define CLUSTER_PRINCIPAL ((oi_host_principal)1 << 63 | 0x434cu) /* never a uid */

typedef struct note {
  uint32_t ns;
  bool sealed; /* else evicted */
  oi_block_hash hash;
} note;

/* A block being fetched: its pool slot, in flight. */
typedef struct fetch_item {
  host_block *b;
  uint8_t *data;
  oi_tier_key key;
  oi_dir_holder holder;
} fetch_item;

typedef struct fetch_job {
  struct fetch_job *next;
  oi_host_ns ns;
  uint64_t block_bytes;
  size_t n;
  fetch_item items[];
} fetch_job;

/* Blocks this node leased to a peer, until RELEASE or expiry. */
typedef struct remote_lease {
  struct remote_lease *next;
  uint64_t id, deadline_ns, bytes;
  size_t n;
  host_block **blocks;
  char peer[OI_PEER_MAX_NODE_ID + 1]; /* only this node may release it */
} remote_lease;

/* A connection to a holder, shared by the fetchers: `users` of them hold it;
 * a failed one is `dead` (not handed out again) and closed by its last
 * user (no operation on a peer may be in flight when it closes). */
typedef struct peer_slot {
  char node_id[OI_DIR_NODE_ID_MAX + 1];
  uint64_t epoch;
  oi_peer *peer;
  uint32_t users;
  bool dead;
} peer_slot;

/* A holder that did not answer (a connect, a LEASE or a read timed out,
 * was refused or lost its connection): down, by node id and incarnation,
 * until a probe connects to it again. Its blocks miss at once meanwhile
 * (the lookup's run stops before them, and fetches of them queued or in
 * flight end). */
typedef struct down_holder {
  char node_id[OI_DIR_NODE_ID_MAX + 1]; /* "": a free record */
  uint64_t epoch;
  uint64_t next_probe_ns;
  uint32_t probe_ms; /* the wait before the next probe, doubled by each that fails */
} down_holder;

#define MAX_DOWN 64
/* A down holder is probed (connected to) PROBE_MS after it went down, then
 * at intervals doubling to PROBE_MAX_MS (a node that refuses us is not
 * asked twice a second forever). */
#define PROBE_MS 500
#define PROBE_MAX_MS 5000

#define FETCHERS 4 /* threads that run fetch jobs */
/* Bytes of blocks per fetch job (at least one block, at most a LEASE's):
 * several jobs of one run go in parallel, and a job of small blocks is not
 * one round trip per few KiB. */
#define FETCH_JOB_BYTES (8u << 20)
#define SERVERS 4 /* threads that answer LEASEs */
/* LEASEs queued for them, at most: past it the progress thread answers
 * (and so reads no more requests meanwhile): a flood of LEASEs costs
 * bounded memory. */
#define SERVE_QUEUE_MAX 256

/* A LEASE to answer on a server thread. */
typedef struct serve_job {
  struct serve_job *next;
  oi_peer_ticket *ticket;
  char peer[OI_PEER_MAX_NODE_ID + 1];
  size_t len;
  uint8_t msg[];
} serve_job;

struct cluster_tier {
  oi_host *host;
  oi_tier *link; /* in the host's chain */
  oi_dir *dir;
  oi_peer_net *net;
  char node_id[OI_DIR_NODE_ID_MAX + 1];
  uint32_t timeout_ms;
  uint8_t *pool_base;
  uint64_t pool_bytes;

  pthread_mutex_t lock; /* notes, jobs, stop */
  pthread_cond_t cv;
  note *ring;
  size_t head, count, cap;
  fetch_job *jobs, *jobs_tail;
  bool stop;
  atomic_bool republish;    /* the directory reconnected: publish everything held */
  uint64_t refresh_ns;      /* and every this often (half the entries' TTL) */
  uint64_t next_refresh_ns; /* the worker's */
  pthread_t worker;
  bool worker_started;
  pthread_cond_t jcv; /* a fetch job is queued (under lock) */
  pthread_t fetchers[FETCHERS];
  int nfetchers;

  pthread_mutex_t slock; /* sq, sstop */
  pthread_cond_t scv;
  serve_job *sq, *sq_tail;
  size_t sq_len;
  bool sstop; /* stopping: LEASEs are answered on the progress thread again */
  pthread_t servers[SERVERS];
  int nservers;

  pthread_mutex_t lease_lock;
  remote_lease *leases;
  uint64_t next_lease;

  pthread_mutex_t peer_lock; /* peers, down */
  peer_slot peers[MAX_PEERS];
  down_holder down[MAX_DOWN];
  atomic_uint ndown;  /* records in use in down: 0, the lookup does not look */
  pthread_cond_t pcv; /* the prober: a holder went down, or stopping (under lock) */
  pthread_t prober;
  bool prober_started;
  pthread_mutex_t busy_lock; /* busy, busy_since_ns: fetches in flight, since */
  uint32_t busy;
  uint64_t busy_since_ns;

  atomic_uint_fast64_t published, unpublished, lookups, remote_blocks, remote_failed, stale_removed,
      served_blocks, bytes_fetched, bytes_served, notes_dropped, fetches, fetch_ns,
      holders_marked_down, publish_failures;
};

/* tier_serve.c: the holder. Answers a peer's request (the peer transport's
 * on_request); a server thread; ends the leases peers did not release in
 * time (all: every one). */
void oi__cluster_on_request(void *ctx, const char *peer_node_id, const void *req, size_t len,
                            oi_peer_reply *r);
void *oi__cluster_server_main(void *arg);
void oi__cluster_expire_leases(cluster_tier *t, bool all);

/* tier_fetch.c: the reader. The tier's lookup and promote (oi_tier_ops); a
 * fetcher thread. */
size_t oi__cluster_tier_lookup(void *self, const oi_tier_key *keys, size_t n, void **claim);
size_t oi__cluster_tier_promote(void *self, void *claim, oi_host_ns ns, uint64_t bb,
                                const oi_tier_key *keys, const oi_tier_slot *slots, size_t k);
void *oi__cluster_fetcher_main(void *arg);
/* The prober thread: connects to down holders (PROBE_MS, backing off) until they
 * answer (then they are up again). */
void *oi__cluster_prober_main(void *arg);
/* Holders with a connection in use now, and holders down. */
void oi__cluster_holder_counts(cluster_tier *t, uint64_t *up, uint64_t *down);

#endif
