/* The cluster tier under a host (tier.h): publishing sealed blocks in the
 * directory, fetching blocks other nodes hold, and answering their fetches.
 *
 * Threads: the tier's sealed and evicted ops only queue notes;
 * one worker thread turns notes into directory publishes and withdrawals,
 * republishes, and ends the leases peers did not release in time;
 * FETCHERS threads run fetch jobs (connect, LEASE, read, verify, RELEASE
 * sent without waiting for its answer, seal), about FETCH_JOB_BYTES each,
 * sharing the connections to holders.
 * SERVERS threads answer peers' LEASEs (pins, and a checksum of every block
 * leased), so that the peer transport's progress thread, which moves every
 * byte this node serves, never waits for them; RELEASEs are answered on the
 * progress thread (a lock and a list).
 *
 * Keys: a block is known across nodes by its namespace's name (hashed), its
 * hash and its layout fingerprint, as on disk: namespace ids are this
 * process's own. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "cluster/directory.h"
#include "cluster/peer.h"
#include "cluster/tier.h"
#include "openinfer/experimental.h"

/* ---- node-to-node messages -------------------------------------------------------- */

#define MSG_MAGIC 0x4c43494fu /* "OICL" */
#define MSG_VERSION 1u
enum { MSG_LEASE = 1, MSG_RELEASE = 2, MSG_LEASE_REPLY = 0x81, MSG_RELEASE_REPLY = 0x82 };
#define HDR_BYTES 8u
#define LEASE_BYTES(n) (HDR_BYTES + 24u + 16u * (size_t)(n))
#define LEASE_REPLY_BYTES(m) (HDR_BYTES + 16u + 24u * (size_t)(m))
#define RELEASE_BYTES (HDR_BYTES + 8u)

static void put16(uint8_t *p, uint16_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
}
static void put32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++)
    p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++)
    p[i] = (uint8_t)(v >> (8 * i));
}
static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t get32(const uint8_t *p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; i--)
    v = v << 8 | p[i];
  return v;
}
static uint64_t get64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--)
    v = v << 8 | p[i];
  return v;
}
static void put_hdr(uint8_t *p, uint16_t type) {
  put32(p, MSG_MAGIC);
  put16(p + 4, MSG_VERSION);
  put16(p + 6, type);
}

/* The type of a well-formed message of `len` bytes, or 0 (with a message). */
static int msg_type(const uint8_t *m, size_t len, bool reply) {
  if (len < HDR_BYTES) return oi__fail(OI_ERR_PROTOCOL, "cluster: a message of %zu bytes", len), 0;
  if (get32(m) != MSG_MAGIC) return oi__fail(OI_ERR_PROTOCOL, "cluster: bad magic"), 0;
  if (get16(m + 4) != MSG_VERSION)
    return oi__fail(OI_ERR_PROTOCOL, "cluster: version %u (this node speaks %u)", get16(m + 4),
                    MSG_VERSION),
           0;
  int type = get16(m + 6);
  switch (type) {
  case MSG_LEASE: {
    if (reply || len < LEASE_BYTES(0)) break;
    uint32_t n = get32(m + HDR_BYTES + 16);
    if (n == 0 || n > OI_CLUSTER_MAX_LEASE || get32(m + HDR_BYTES + 20) != 0 ||
        len != LEASE_BYTES(n))
      return oi__fail(OI_ERR_PROTOCOL, "cluster: a LEASE of %u hashes in %zu bytes", n, len), 0;
    return type;
  }
  case MSG_RELEASE:
    if (reply || len != RELEASE_BYTES) break;
    return type;
  case MSG_LEASE_REPLY: {
    if (!reply || len < LEASE_REPLY_BYTES(0)) break;
    uint32_t m_ = get32(m + HDR_BYTES + 8);
    if (m_ > OI_CLUSTER_MAX_LEASE || get32(m + HDR_BYTES + 12) != 0 || len != LEASE_REPLY_BYTES(m_))
      return oi__fail(OI_ERR_PROTOCOL, "cluster: a lease reply of %u blocks in %zu bytes", m_, len),
             0;
    return type;
  }
  case MSG_RELEASE_REPLY:
    if (!reply || len != HDR_BYTES) break;
    return type;
  default: break;
  }
  return oi__fail(OI_ERR_PROTOCOL, "cluster: unexpected message type %d of %zu bytes", type, len),
         0;
}

oi_status oi__cluster_msg_check(const void *msg, size_t len) {
  if (!msg) return oi__fail(OI_ERR_PROTOCOL, "cluster: no message");
  return msg_type(msg, len, false) ? OI_OK : OI_ERR_PROTOCOL;
}

oi_status oi__cluster_reply_check(const void *msg, size_t len) {
  if (!msg) return oi__fail(OI_ERR_PROTOCOL, "cluster: no reply");
  return msg_type(msg, len, true) ? OI_OK : OI_ERR_PROTOCOL;
}

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
  oi_offload_host *host;
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

  pthread_mutex_t peer_lock;
  peer_slot peers[MAX_PEERS];

  atomic_uint_fast64_t published, unpublished, lookups, remote_blocks, remote_failed, stale_removed,
      served_blocks, bytes_fetched, bytes_served, notes_dropped;
};

static const oi_tier_ops cluster_tier_ops;

cluster_tier *oi__cluster_tier_of(oi_offload_host *h) {
  return oi__host_tier_find(h, &cluster_tier_ops);
}

/* The local namespace whose name and layout have these fingerprints. */
static bool find_ns(cluster_tier *t, uint64_t ns_fp, uint64_t layout_fp, oi_host_ns *out,
                    uint64_t *block_bytes) {
  char name[256];
  for (uint32_t id = 1;; id++) {
    uint64_t nf, lf, bb;
    if (!oi__host_namespace_fps(t->host, id, &nf, &lf, &bb)) return false;
    if (nf != ns_fp || lf != layout_fp) continue;
    if (!oi__host_namespace_info(t->host, id, name, sizeof name, NULL, NULL) ||
        !oi__host_find_namespace(t->host, name, out))
      return false;
    *block_bytes = bb;
    return true;
  }
}

/* ---- notes: seals and evictions ---- */

static void note_add(cluster_tier *t, uint32_t ns, const oi_block_hash *hash, bool sealed) {
  pthread_mutex_lock(&t->lock);
  if (t->count == t->cap) {
    size_t cap = t->cap ? t->cap * 2 : 4096;
    note *r = cap <= NOTE_RING_MAX ? oi__malloc(cap * sizeof *r) : NULL;
    if (!r) {
      pthread_mutex_unlock(&t->lock);
      atomic_fetch_add(&t->notes_dropped, 1); /* the entry expires by its TTL */
      return;
    }
    for (size_t i = 0; i < t->count; i++)
      r[i] = t->ring[(t->head + i) % t->cap];
    oi__free(t->ring);
    t->ring = r;
    t->cap = cap;
    t->head = 0;
  }
  t->ring[(t->head + t->count++) % t->cap] = (note){.ns = ns, .sealed = sealed, .hash = *hash};
  if (t->count == 1) pthread_cond_signal(&t->cv);
  pthread_mutex_unlock(&t->lock);
}

static void on_sealed(void *ctx, uint32_t ns, const oi_block_hash *hash) {
  note_add(ctx, ns, hash, true);
}
static void on_evicted(void *ctx, uint32_t ns, const oi_block_hash *hash) {
  note_add(ctx, ns, hash, false);
}

/* The directory connected again (Redis may have restarted empty, and
 * batches in flight when it was lost are gone): the worker publishes every
 * block this node holds. */
static void on_reconnect(void *ctx) {
  cluster_tier *t = ctx;
  atomic_store(&t->republish, true);
  pthread_mutex_lock(&t->lock);
  pthread_cond_signal(&t->cv);
  pthread_mutex_unlock(&t->lock);
}

/* Publishes and withdraws a batch of notes (the worker). */
/* Runs of notes of one kind go to the directory in one call; a namespace's
 * fingerprints are looked up once per run of its notes. */
static void send_keys(cluster_tier *t, bool sealed, const oi_tier_key *keys, size_t n) {
  if (n == 0) return;
  if (sealed) {
    if (oi__dir_publish(t->dir, keys, n) == OI_OK) atomic_fetch_add(&t->published, n);
  } else if (oi__dir_unpublish(t->dir, keys, n) == OI_OK) {
    atomic_fetch_add(&t->unpublished, n);
  }
}

static void apply_notes(cluster_tier *t, const note *notes, size_t n) {
  oi_tier_key keys[256];
  size_t nk = 0;
  bool kind = false;
  uint32_t ns = 0; /* ns ids start at 1 */
  uint64_t ns_fp = 0, layout_fp = 0;
  bool known = false;
  for (size_t i = 0; i < n; i++) {
    if (notes[i].ns != ns) {
      ns = notes[i].ns;
      known = oi__host_namespace_fps(t->host, ns, &ns_fp, &layout_fp, NULL);
    }
    if (!known) continue;
    if (nk && (notes[i].sealed != kind || nk == OI_ARRAY_LEN(keys))) {
      send_keys(t, kind, keys, nk);
      nk = 0;
    }
    kind = notes[i].sealed;
    keys[nk].ns_fp = ns_fp;
    memcpy(keys[nk].hash, notes[i].hash.bytes, sizeof keys[nk].hash);
    keys[nk].layout_fp = layout_fp;
    nk++;
  }
  send_keys(t, kind, keys, nk);
}

/* ---- holder: answering peers ---- */

static void lease_end(cluster_tier *t, remote_lease *l, bool ok) {
  oi__host_load_end(t->host, l->blocks, l->n, ok, ok ? l->bytes : 0, 0);
  oi__free(l->blocks);
  oi__free(l);
}

static void answer_lease(cluster_tier *t, const char *peer, const uint8_t *m, oi_peer_reply *r) {
  uint64_t ns_fp = get64(m + HDR_BYTES), layout_fp = get64(m + HDR_BYTES + 8);
  uint32_t n = get32(m + HDR_BYTES + 16);
  const uint8_t *hp = m + HDR_BYTES + 24;
  oi_block_hash hashes[OI_CLUSTER_MAX_LEASE];
  for (uint32_t i = 0; i < n; i++)
    memcpy(hashes[i].bytes, hp + 16 * (size_t)i, 16);
  oi_host_ns ns;
  uint64_t bb = 0, hits = 0;
  oi_lease lease;
  host_block **blocks = NULL;
  remote_lease *l = NULL;
  uint8_t *out = NULL;
  /* Namespaces are enforced here: only blocks of the namespace and layout
   * named, and only the leading run this node holds sealed. */
  if (find_ns(t, ns_fp, layout_fp, &ns, &bb) &&
      oi__host_lease_prefix(t->host, ns, 0, CLUSTER_PRINCIPAL, 1, hashes, n, &hits, NULL, &lease) ==
          OI_OK &&
      hits > 0) {
    blocks = oi__malloc(hits * sizeof *blocks);
    l = oi__calloc(1, sizeof *l);
    if (!blocks || !l ||
        oi__host_load_begin(t->host, ns, CLUSTER_PRINCIPAL, lease, hits, blocks, NULL) != OI_OK) {
      oi__host_release(t->host, ns, CLUSTER_PRINCIPAL, lease);
      oi__free(blocks);
      oi__free(l);
      blocks = NULL;
      l = NULL;
      hits = 0;
    }
  } else {
    hits = 0;
  }
  size_t len = LEASE_REPLY_BYTES(hits);
  out = oi__malloc(len);
  if (!out) {
    if (l) {
      l->blocks = blocks;
      l->n = hits;
      lease_end(t, l, false);
    }
    oi__peer_reply_status(r, OI_ERR_OUT_OF_MEMORY);
    return;
  }
  put_hdr(out, MSG_LEASE_REPLY);
  uint64_t id = 0;
  if (l) {
    pthread_mutex_lock(&t->lease_lock);
    id = ++t->next_lease;
    pthread_mutex_unlock(&t->lease_lock);
  }
  put64(out + HDR_BYTES, id);
  put32(out + HDR_BYTES + 8, (uint32_t)hits);
  put32(out + HDR_BYTES + 12, 0);
  for (uint64_t i = 0; i < hits; i++) {
    uint8_t *data = oi__host_block_data(t->host, blocks[i]);
    uint8_t *e = out + LEASE_REPLY_BYTES(i);
    put64(e, (uint64_t)(data - t->pool_base));
    put64(e + 8, bb);
    put64(e + 16, XXH3_64bits(data, bb));
  }
  if (l) {
    *l = (remote_lease){.id = id,
                        .deadline_ns = oi__deadline_ns(4 * t->timeout_ms),
                        .bytes = hits * bb,
                        .n = hits,
                        .blocks = blocks};
    snprintf(l->peer, sizeof l->peer, "%s", peer);
    pthread_mutex_lock(&t->lease_lock);
    l->next = t->leases;
    t->leases = l;
    pthread_mutex_unlock(&t->lease_lock);
    atomic_fetch_add(&t->served_blocks, hits);
    atomic_fetch_add(&t->bytes_served, hits * bb);
  }
  if (oi__peer_reply_set(r, out, len) != OI_OK) oi__peer_reply_status(r, OI_ERR_OUT_OF_MEMORY);
  oi__free(out);
}

static void answer_release(cluster_tier *t, const char *peer, const uint8_t *m, oi_peer_reply *r) {
  uint64_t id = get64(m + HDR_BYTES);
  remote_lease *found = NULL;
  pthread_mutex_lock(&t->lease_lock);
  for (remote_lease **p = &t->leases; *p; p = &(*p)->next)
    if ((*p)->id == id && !strcmp((*p)->peer, peer)) { /* another node's: not found */
      found = *p;
      *p = found->next;
      break;
    }
  pthread_mutex_unlock(&t->lease_lock);
  if (found) lease_end(t, found, true);
  uint8_t out[HDR_BYTES];
  put_hdr(out, MSG_RELEASE_REPLY);
  if (oi__peer_reply_set(r, out, sizeof out) != OI_OK)
    oi__peer_reply_status(r, OI_ERR_OUT_OF_MEMORY);
}

/* Hands a LEASE to the server threads (false: answer it here). */
static bool serve_later(cluster_tier *t, const char *peer, const void *req, size_t len,
                        oi_peer_reply *r) {
  serve_job *sj = oi__malloc(sizeof *sj + len);
  if (!sj) return false;
  bool queued = false;
  pthread_mutex_lock(&t->slock);
  if (!t->sstop && t->nservers > 0 && t->sq_len < SERVE_QUEUE_MAX &&
      (sj->ticket = oi__peer_defer(r)) != NULL) {
    sj->next = NULL;
    snprintf(sj->peer, sizeof sj->peer, "%s", peer);
    sj->len = len;
    memcpy(sj->msg, req, len);
    if (t->sq_tail)
      t->sq_tail->next = sj;
    else
      t->sq = sj;
    t->sq_tail = sj;
    t->sq_len++;
    pthread_cond_signal(&t->scv);
    queued = true;
  }
  pthread_mutex_unlock(&t->slock);
  if (!queued) oi__free(sj);
  return queued;
}

static void on_request(void *ctx, const char *peer_node_id, const void *req, size_t len,
                       oi_peer_reply *r) {
  cluster_tier *t = ctx;
  int type = msg_type(req, len, false);
  if (!type) {
    OI_LOG(OI_LOG_WARN, "cluster", "refusing a request from node '%s': %s", peer_node_id,
           oi_last_error());
    oi__peer_reply_status(r, OI_ERR_PROTOCOL);
    return;
  }
  if (type == MSG_LEASE) {
    if (!serve_later(t, peer_node_id, req, len, r)) answer_lease(t, peer_node_id, req, r);
  } else {
    answer_release(t, peer_node_id, req, r);
  }
}

/* A server: answers queued LEASEs; when stopping, refuses what is queued. */
static void *server_main(void *arg) {
  cluster_tier *t = arg;
  for (;;) {
    pthread_mutex_lock(&t->slock);
    while (!t->sstop && !t->sq)
      pthread_cond_wait(&t->scv, &t->slock);
    serve_job *sj = t->sq;
    if (sj) {
      t->sq = sj->next;
      if (!t->sq) t->sq_tail = NULL;
      t->sq_len--;
    }
    bool stop = t->sstop;
    pthread_mutex_unlock(&t->slock);
    if (!sj) return NULL; /* stopping, nothing queued */
    oi_peer_reply *r = oi__peer_ticket_reply(sj->ticket);
    if (stop)
      oi__peer_reply_status(r, OI_ERR_CLOSED);
    else
      answer_lease(t, sj->peer, sj->msg, r);
    oi__peer_answer(sj->ticket);
    oi__free(sj);
  }
}

/* Ends the leases peers did not release in time (a reader that died). A
 * late read of such a block may see its slot reused: the reader's checksum
 * catches that, and it is a miss there. */
static void expire_leases(cluster_tier *t, bool all) {
  uint64_t now = oi__now_ns();
  remote_lease *done = NULL;
  pthread_mutex_lock(&t->lease_lock);
  for (remote_lease **p = &t->leases; *p;) {
    remote_lease *l = *p;
    if (all || l->deadline_ns <= now) {
      *p = l->next;
      l->next = done;
      done = l;
    } else {
      p = &l->next;
    }
  }
  pthread_mutex_unlock(&t->lease_lock);
  while (done) {
    remote_lease *l = done;
    done = l->next;
    lease_end(t, l, false);
  }
}

/* ---- reader: fetching ---- */

/* Closes a dead slot's connection once nobody uses it (peer_lock held). */
static void slot_reap_locked(peer_slot *s) {
  if (s->peer && s->dead && s->users == 0) {
    oi__peer_close(s->peer);
    memset(s, 0, sizeof *s);
  }
}

/* A connection to holder `h` (connecting when there is none), held until
 * peer_put. @return its slot, or -1 (*stale: the holder is gone or is
 * another incarnation). */
static int peer_get(cluster_tier *t, const oi_dir_holder *h, bool *stale) {
  *stale = false;
  pthread_mutex_lock(&t->peer_lock);
  for (int i = 0; i < MAX_PEERS; i++) {
    peer_slot *s = &t->peers[i];
    if (!s->peer || s->dead || strcmp(s->node_id, h->node_id)) continue;
    if (s->epoch == h->epoch) {
      s->users++;
      pthread_mutex_unlock(&t->peer_lock);
      return i;
    }
    s->dead = true; /* the node restarted since */
    slot_reap_locked(s);
  }
  pthread_mutex_unlock(&t->peer_lock);
  char addr[128];
  uint64_t epoch = 0;
  oi_status st = oi__dir_node_lookup(t->dir, h->node_id, addr, sizeof addr, &epoch);
  if (st == OI_ERR_NOT_FOUND || (st == OI_OK && epoch != h->epoch)) {
    *stale = true;
    return -1;
  }
  if (st != OI_OK) return -1;
  oi_peer *p = NULL;
  if (oi__peer_connect(t->net, addr, &p) != OI_OK) {
    OI_LOG(OI_LOG_INFO, "cluster", "cannot reach node '%s' at %s: %s", h->node_id, addr,
           oi_last_error());
    return -1;
  }
  pthread_mutex_lock(&t->peer_lock);
  int slot = -1;
  for (int i = 0; i < MAX_PEERS && slot < 0; i++)
    if (!t->peers[i].peer) slot = i;
  if (slot < 0) { /* full: an idle slot goes */
    for (int i = 0; i < MAX_PEERS && slot < 0; i++)
      if (t->peers[i].users == 0) {
        oi__peer_close(t->peers[i].peer);
        slot = i;
      }
  }
  if (slot < 0) { /* every slot busy: this fetch goes without caching */
    pthread_mutex_unlock(&t->peer_lock);
    oi__peer_close(p);
    return -1;
  }
  t->peers[slot] = (peer_slot){.epoch = h->epoch, .peer = p, .users = 1};
  snprintf(t->peers[slot].node_id, sizeof t->peers[slot].node_id, "%s", h->node_id);
  pthread_mutex_unlock(&t->peer_lock);
  return slot;
}

/* Gives a connection back; `failed`: it is not to be used again. */
static void peer_put(cluster_tier *t, int slot, bool failed) {
  pthread_mutex_lock(&t->peer_lock);
  peer_slot *s = &t->peers[slot];
  s->users--;
  if (failed) s->dead = true;
  slot_reap_locked(s);
  pthread_mutex_unlock(&t->peer_lock);
}

/* Fetches items[0..n) (one holder) into their slots; seals what verified. */
static void fetch_from(cluster_tier *t, fetch_job *j, fetch_item *items, size_t n) {
  bool *ok = oi__calloc(n, sizeof *ok);
  uint8_t *req = oi__malloc(LEASE_BYTES(n));
  oi_peer_read *reads = oi__malloc(n * sizeof *reads);
  uint64_t *sums = oi__malloc(n * sizeof *sums);
  void *reply = NULL;
  size_t rlen = 0, m = 0;
  uint64_t lease_id = 0;
  bool stale = false, failed = false;
  oi_peer *p = NULL;
  int slot = -1;
  if (!ok || !req || !reads || !sums) goto end;
  slot = peer_get(t, &items[0].holder, &stale);
  if (slot < 0) {
    goto end;
  }
  p = t->peers[slot].peer; /* stable while we hold the slot */
  put_hdr(req, MSG_LEASE);
  put64(req + HDR_BYTES, items[0].key.ns_fp);
  put64(req + HDR_BYTES + 8, items[0].key.layout_fp);
  put32(req + HDR_BYTES + 16, (uint32_t)n);
  put32(req + HDR_BYTES + 20, 0);
  for (size_t i = 0; i < n; i++)
    memcpy(req + HDR_BYTES + 24 + 16 * i, items[i].key.hash, 16);
  oi_status st = oi__peer_call(p, req, LEASE_BYTES(n), &reply, &rlen, t->timeout_ms);
  if (st != OI_OK) {
    OI_LOG(OI_LOG_INFO, "cluster", "lease from node '%s': %s", items[0].holder.node_id,
           oi_last_error());
    failed = st == OI_ERR_CLOSED || st == OI_ERR_IO;
    goto end;
  }
  if (msg_type(reply, rlen, true) != MSG_LEASE_REPLY) {
    OI_LOG(OI_LOG_WARN, "cluster", "node '%s' answered a lease badly: %s", items[0].holder.node_id,
           oi_last_error());
    goto end;
  }
  const uint8_t *rp = reply;
  lease_id = get64(rp + HDR_BYTES);
  m = get32(rp + HDR_BYTES + 8);
  if (m > n) m = 0; /* more than asked for: not believed */
  for (size_t i = 0; i < m; i++) {
    const uint8_t *e = rp + LEASE_REPLY_BYTES(i);
    uint64_t len = get64(e + 8);
    if (len != j->block_bytes) { /* another layout after all: none of it */
      m = i;
      break;
    }
    reads[i] = (oi_peer_read){.remote_offset = get64(e), .len = len, .local_dst = items[i].data};
    sums[i] = get64(e + 16);
  }
  if (m) {
    st = oi__peer_get(p, reads, m, t->timeout_ms);
    if (st == OI_OK) {
      for (size_t i = 0; i < m; i++)
        ok[i] = XXH3_64bits(items[i].data, j->block_bytes) == sums[i];
    } else {
      OI_LOG(OI_LOG_INFO, "cluster", "reading %zu blocks from node '%s': %s", m,
             items[0].holder.node_id, oi_last_error());
      failed = st != OI_ERR_INVALID_ARGUMENT; /* the connection is dead after a failed read */
    }
  }
  if (!failed && lease_id) {
    /* Best effort, and not waited for: the holder's lease expires anyway,
     * and its answer says nothing the reader needs. */
    uint8_t rel[RELEASE_BYTES];
    put_hdr(rel, MSG_RELEASE);
    put64(rel + HDR_BYTES, lease_id);
    if (oi__peer_send(p, rel, sizeof rel, t->timeout_ms) != OI_OK)
      OI_LOG(OI_LOG_DEBUG, "cluster", "release at node '%s': %s", items[0].holder.node_id,
             oi_last_error());
  }
  /* The holder leases the leading run it holds: the first block past it is
   * not there (its entry is stale); the ones after may be, and just miss. */
  stale = stale || m < n;
end:
  if (slot >= 0) peer_put(t, slot, failed);
  for (size_t i = 0; i < n; i++) {
    bool good = ok && ok[i];
    if (good) { /* counted before the seal, which may end a query's wait */
      atomic_fetch_add(&t->remote_blocks, 1);
      atomic_fetch_add(&t->bytes_fetched, j->block_bytes);
    }
    oi__tier_promote_end(t->link, j->ns, items[i].b, good, good ? j->block_bytes : 0, 0);
    if (!good) {
      atomic_fetch_add(&t->remote_failed, 1);
      bool holder_gone = slot < 0; /* no connection: every entry of it is stale */
      if (stale && (holder_gone || i == m) &&
          oi__dir_remove_stale(t->dir, &items[i].key, &items[i].holder) == OI_OK)
        atomic_fetch_add(&t->stale_removed, 1);
    }
  }
  oi__free(ok);
  oi__free(req);
  oi__free(reads);
  oi__free(sums);
  oi__free(reply);
}

static void run_job(cluster_tier *t, fetch_job *j) {
  /* Runs of one holder, in prefix order. */
  for (size_t a = 0; a < j->n;) {
    size_t b = a + 1;
    while (b < j->n && !strcmp(j->items[b].holder.node_id, j->items[a].holder.node_id) &&
           j->items[b].holder.epoch == j->items[a].holder.epoch)
      b++;
    fetch_from(t, j, j->items + a, b - a);
    a = b;
  }
}

/* The tier's lookup: who holds the leading run of keys (one directory round
 * trip); *claim: their holders, for promote. */
static size_t tier_lookup(void *self, const oi_tier_key *keys, size_t n, void **claim) {
  cluster_tier *t = self;
  if (n == 0) return 0;
  n = OI_MIN(n, (size_t)OI_CLUSTER_MAX_LEASE);
  oi_dir_holder *holders = oi__malloc(n * sizeof *holders);
  size_t run = 0;
  if (!holders) return 0;
  atomic_fetch_add(&t->lookups, 1);
  if (oi__dir_lookup(t->dir, keys, n, holders, &run) != OI_OK) run = 0; /* degraded: local only */
  for (size_t i = 0; i < run; i++)
    if (!strcmp(holders[i].node_id, t->node_id)) { /* ours, yet not here: gone since */
      run = i;
      break;
    }
  if (run == 0) {
    oi__free(holders);
    return 0;
  }
  *claim = holders;
  return run;
}

/* The tier's promote: fetch jobs for the slots, from their holders. */
static size_t tier_promote(void *self, void *claim, oi_host_ns ns, uint64_t bb,
                           const oi_tier_key *keys, const oi_tier_slot *slots, size_t k) {
  cluster_tier *t = self;
  oi_dir_holder *holders = claim;
  fetch_job *j = NULL;
  size_t started = 0;
  if (k == 0) goto out;
  j = oi__calloc(1, sizeof *j + k * sizeof j->items[0]);
  if (!j) { /* the slots go: misses */
    for (size_t i = 0; i < k; i++)
      oi__tier_promote_end(t->link, ns, slots[i].block, false, 0, 0);
    goto out;
  }
  j->ns = ns;
  j->block_bytes = bb;
  for (size_t i = 0; i < k; i++)
    j->items[j->n++] = (fetch_item){.b = slots[i].block,
                                    .data = slots[i].data,
                                    .key = keys[slots[i].idx],
                                    .holder = holders[slots[i].idx]};
  started = j->n;
  /* Jobs of about FETCH_JOB_BYTES, in prefix order: the fetchers take them
   * in parallel, so one job's lease, reads and checksums overlap another's. */
  size_t chunk = (size_t)OI_MAX(1u, OI_MIN(FETCH_JOB_BYTES / bb, OI_CLUSTER_MAX_LEASE));
  fetch_job *first = NULL, **tail = &first;
  for (size_t a = 0; a < j->n; a += chunk) {
    size_t k = OI_MIN(chunk, j->n - a);
    fetch_job *cj = oi__malloc(sizeof *cj + k * sizeof cj->items[0]);
    if (!cj) { /* the rest of the run goes: slots freed, misses */
      for (size_t i = a; i < j->n; i++)
        oi__tier_promote_end(t->link, ns, j->items[i].b, false, 0, 0);
      started = a;
      break;
    }
    cj->next = NULL;
    cj->ns = ns;
    cj->block_bytes = bb;
    cj->n = k;
    memcpy(cj->items, j->items + a, k * sizeof cj->items[0]);
    *tail = cj;
    tail = &cj->next;
  }
  pthread_mutex_lock(&t->lock);
  if (t->stop) { /* stopping: nothing starts now */
    pthread_mutex_unlock(&t->lock);
    while (first) {
      fetch_job *cj = first;
      first = cj->next;
      for (size_t i = 0; i < cj->n; i++)
        oi__tier_promote_end(t->link, ns, cj->items[i].b, false, 0, 0);
      oi__free(cj);
    }
    started = 0;
    goto out;
  }
  if (first) {
    if (t->jobs_tail)
      t->jobs_tail->next = first;
    else
      t->jobs = first;
    fetch_job *last = first;
    while (last->next)
      last = last->next;
    t->jobs_tail = last;
    pthread_cond_broadcast(&t->jcv);
  }
  pthread_mutex_unlock(&t->lock);
out:
  oi__free(j);
  oi__free(holders);
  return started;
}

/* ---- the worker ---- */

static void *worker_main(void *arg) {
  cluster_tier *t = arg;
  note batch[256];
  for (;;) {
    pthread_mutex_lock(&t->lock);
    while (!t->stop && t->count == 0 && !atomic_load(&t->republish)) {
      struct timespec ts = oi__timespec(oi__deadline_ns(100));
      pthread_cond_timedwait(&t->cv, &t->lock, &ts);
      if (t->count == 0) break; /* time to look at the leases */
    }
    size_t k = OI_MIN(t->count, OI_ARRAY_LEN(batch));
    for (size_t i = 0; i < k; i++)
      batch[i] = t->ring[(t->head + i) % t->cap];
    if (k) {
      t->head = (t->head + k) % t->cap;
      t->count -= k;
    }
    bool stop = t->stop;
    pthread_mutex_unlock(&t->lock);
    bool refresh = oi__now_ns() >= t->next_refresh_ns;
    if (!stop && (atomic_exchange(&t->republish, false) || refresh)) {
      /* Entries expire unless refreshed, and one entry names one holder:
       * when the node it names evicts the block, the entry goes although
       * an earlier holder may still have it. Republishing all we hold
       * every half TTL keeps the directory true within that time. */
      size_t n = oi__host_foreach_sealed(t->host, on_sealed, t);
      t->next_refresh_ns = oi__now_ns() + t->refresh_ns;
      OI_LOG(refresh ? OI_LOG_DEBUG : OI_LOG_INFO, "cluster", "publishing the %zu blocks held%s", n,
             refresh ? " (refresh)" : " (the directory reconnected)");
    }
    if (k) apply_notes(t, batch, k);
    expire_leases(t, false);
    if (stop && !k) return NULL;
  }
}

/* A fetcher: runs fetch jobs; when stopping, drops what is queued. */
static void *fetcher_main(void *arg) {
  cluster_tier *t = arg;
  for (;;) {
    pthread_mutex_lock(&t->lock);
    while (!t->stop && !t->jobs)
      pthread_cond_wait(&t->jcv, &t->lock);
    fetch_job *j = t->jobs;
    if (j) {
      t->jobs = j->next;
      if (!t->jobs) t->jobs_tail = NULL;
    }
    bool stop = t->stop;
    pthread_mutex_unlock(&t->lock);
    if (!j) return NULL; /* stopping, nothing queued */
    if (stop)
      for (size_t i = 0; i < j->n; i++)
        oi__tier_promote_end(t->link, j->ns, j->items[i].b, false, 0, 0);
    else
      run_job(t, j);
    oi__free(j);
  }
}

/* ---- attach, destroy, stats ---- */

static void tier_free(cluster_tier *t) {
  if (!t) return;
  /* Fetches in progress end within timeout_ms; queued ones are dropped. */
  pthread_mutex_lock(&t->lock);
  t->stop = true;
  pthread_cond_broadcast(&t->cv);
  pthread_cond_broadcast(&t->jcv);
  pthread_mutex_unlock(&t->lock);
  for (int i = 0; i < t->nfetchers; i++)
    pthread_join(t->fetchers[i], NULL);
  if (t->worker_started) pthread_join(t->worker, NULL);
  /* Every deferred LEASE is answered (refused) before the net goes; LEASEs
   * that come meanwhile are answered on the progress thread. */
  pthread_mutex_lock(&t->slock);
  t->sstop = true;
  pthread_cond_broadcast(&t->scv);
  pthread_mutex_unlock(&t->slock);
  for (int i = 0; i < t->nservers; i++)
    pthread_join(t->servers[i], NULL);
  oi__peer_net_destroy(t->net); /* frees our peers; no request is answered after this */
  for (int i = 0; i < MAX_PEERS; i++)
    t->peers[i].peer = NULL;
  expire_leases(t, true);
  oi__dir_close(t->dir);
  oi__free(t->ring);
  pthread_mutex_destroy(&t->lock);
  pthread_cond_destroy(&t->cv);
  pthread_cond_destroy(&t->jcv);
  pthread_mutex_destroy(&t->peer_lock);
  pthread_mutex_destroy(&t->lease_lock);
  pthread_mutex_destroy(&t->slock);
  pthread_cond_destroy(&t->scv);
  oi__free(t);
}

static void tier_destroy(void *self) { tier_free(self); }

/* Reads the cluster's secret: a regular file of this user, private. */
static oi_status read_secret(const char *path, uint8_t *buf, size_t cap, size_t *len) {
  int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0)
    return oi__fail(errno == ENOENT ? OI_ERR_NOT_FOUND : OI_ERR_PERMISSION,
                    "host_attach_cluster: cannot open the secret file %s: %s", path,
                    strerror(errno));
  struct stat st;
  oi_status s = OI_OK;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
    s = oi__fail(OI_ERR_PERMISSION, "host_attach_cluster: %s is not a regular file", path);
  else if (st.st_uid != geteuid() || (st.st_mode & 077))
    s = oi__fail(OI_ERR_PERMISSION,
                 "host_attach_cluster: the secret file %s must belong to this user and be "
                 "readable by no one else (chmod 600 %s)",
                 path, path);
  ssize_t n = s == OI_OK ? read(fd, buf, cap) : 0;
  close(fd);
  if (s != OI_OK) return s;
  if (n < 0)
    return oi__fail(OI_ERR_IO, "host_attach_cluster: reading %s: %s", path, strerror(errno));
  while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
    n--;
  if (n < (ssize_t)OI_PEER_MIN_SECRET || (size_t)n >= cap)
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "host_attach_cluster: the secret in %s has %zd bytes (%u to %u)", path, n,
                    OI_PEER_MIN_SECRET, OI_PEER_MAX_SECRET);
  *len = (size_t)n;
  return OI_OK;
}

OI_API oi_status oi_host_cluster_options_init(oi_host_cluster_options *o) {
  if (!o) return oi__fail(OI_ERR_INVALID_ARGUMENT, "host_cluster_options_init: options is NULL");
  memset(o, 0, sizeof *o);
  o->struct_size = sizeof *o;
  return OI_OK;
}

OI_API oi_status oi_offload_host_attach_cluster(oi_offload_host *h,
                                                const oi_host_cluster_options *o) {
  if (!h) return oi__fail(OI_ERR_INVALID_ARGUMENT, "host_attach_cluster: host is NULL");
  oi_host_cluster_options opts;
  oi_host_cluster_options_init(&opts);
  oi_status st = oi__struct_in(&opts, sizeof opts, o, "host_attach_cluster");
  if (st != OI_OK) return st;
  if (!opts.redis_url || !opts.node_id || !opts.listen_addr || !opts.secret_file)
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "host_attach_cluster: redis_url, node_id, listen_addr and secret_file are "
                    "required");
  if (oi__cluster_tier_of(h))
    return oi__fail(OI_ERR_STATE, "host_attach_cluster: a cluster tier is attached already");
  oi_host_pool_info pool;
  oi__host_pool_info(h, &pool);
  if (!pool.base)
    return oi__fail(OI_ERR_STATE, "host_attach_cluster: the host's pool is not ready");
  uint8_t secret[OI_PEER_MAX_SECRET + 1];
  size_t secret_len = 0;
  if ((st = read_secret(opts.secret_file, secret, sizeof secret, &secret_len)) != OI_OK) return st;

  cluster_tier *t = oi__calloc(1, sizeof *t);
  if (!t) return oi__fail(OI_ERR_OUT_OF_MEMORY, "host_attach_cluster: out of memory");
  t->host = h;
  t->timeout_ms = opts.timeout_ms ? opts.timeout_ms : 2000;
  t->pool_base = pool.base;
  t->pool_bytes = pool.bytes;
  snprintf(t->node_id, sizeof t->node_id, "%s", opts.node_id);
  pthread_mutex_init(&t->lock, NULL);
  pthread_mutex_init(&t->lease_lock, NULL);
  pthread_mutex_init(&t->peer_lock, NULL);
  pthread_mutex_init(&t->slock, NULL);
  pthread_cond_init(&t->scv, NULL);
  pthread_cond_init(&t->jcv, NULL);
  oi__cond_init_monotonic(&t->cv);

  oi_dir_options dopt;
  oi__dir_options_init(&dopt);
  dopt.url = opts.redis_url;
  dopt.node_id = opts.node_id;
  dopt.epoch = oi__now_ns() ^ ((uint64_t)getpid() << 40);
  dopt.on_reconnect = on_reconnect;
  dopt.on_reconnect_ctx = t;
  t->refresh_ns = (uint64_t)(dopt.block_ttl_ms ? dopt.block_ttl_ms : 600000) * 1000000ull / 2;
  t->next_refresh_ns = oi__now_ns() + t->refresh_ns;
  if ((st = oi__dir_open(&dopt, &t->dir)) != OI_OK) goto fail;
  int rc;
  for (int i = 0; i < SERVERS; i++) { /* before the net: it may be asked at once */
    if ((rc = pthread_create(&t->servers[i], NULL, server_main, t)) != 0) {
      st = oi__fail(OI_ERR_INTERNAL, "host_attach_cluster: cannot start its threads: %s",
                    strerror(rc));
      goto fail;
    }
    t->nservers++;
  }

  oi_peer_net_options popt = {.listen_addr = opts.listen_addr,
                              .node_id = opts.node_id,
                              .secret = secret,
                              .secret_len = secret_len,
                              .timeout_ms = t->timeout_ms,
                              .on_request = on_request,
                              .on_request_ctx = t};
  st = oi__peer_net_create(&popt, &t->net);
  memset(secret, 0, sizeof secret);
  if (st != OI_OK) goto fail;
  if ((st = oi__peer_net_register(t->net, pool.base, pool.bytes)) != OI_OK) goto fail;
  char adv[128];
  if (opts.advertise_addr) {
    snprintf(adv, sizeof adv, "%s", opts.advertise_addr);
  } else {
    const char *colon = strrchr(opts.listen_addr, ':');
    int iplen = colon ? (int)(colon - opts.listen_addr) : (int)strlen(opts.listen_addr);
    if (iplen == 7 && !strncmp(opts.listen_addr, "0.0.0.0", 7)) {
      st = oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "host_attach_cluster: listening on 0.0.0.0 needs an advertise_addr "
                    "(the address peers dial)");
      goto fail;
    }
    snprintf(adv, sizeof adv, "%.*s:%u", iplen, opts.listen_addr, oi__peer_net_port(t->net));
  }
  if ((st = oi__dir_set_advertise(t->dir, adv)) != OI_OK) goto fail;
  rc = pthread_create(&t->worker, NULL, worker_main, t);
  if (rc != 0) {
    st =
        oi__fail(OI_ERR_INTERNAL, "host_attach_cluster: cannot start its thread: %s", strerror(rc));
    goto fail;
  }
  t->worker_started = true;
  for (int i = 0; i < FETCHERS; i++) {
    if ((rc = pthread_create(&t->fetchers[i], NULL, fetcher_main, t)) != 0) {
      st = oi__fail(OI_ERR_INTERNAL, "host_attach_cluster: cannot start its threads: %s",
                    strerror(rc));
      goto fail;
    }
    t->nfetchers++;
  }
  atomic_store(&t->republish, true); /* blocks sealed before the attach */
  if ((st = oi__host_tier_attach(h, &cluster_tier_ops, t, &t->link)) != OI_OK) goto fail;
  OI_LOG(OI_LOG_INFO, "cluster", "node '%s' joined the cluster at %s; peers dial %s", opts.node_id,
         opts.redis_url, adv);
  return OI_OK;
fail:
  memset(secret, 0, sizeof secret);
  tier_free(t);
  return st;
}

/* The tier's stats: *out is an oi_host_cluster_stats. */
static oi_status tier_stats(void *self, void *out) {
  cluster_tier *t = self;
  oi_dir_stats ds;
  oi__dir_stats(t->dir, &ds);
  oi_peer_stats ps;
  oi__peer_net_stats(t->net, &ps);
  oi_host_cluster_stats *s = out;
  memset(s, 0, sizeof *s);
  s->struct_size = sizeof *s;
  s->directory_connected = ds.connected;
  s->published = atomic_load(&t->published);
  s->unpublished = atomic_load(&t->unpublished);
  s->lookups = atomic_load(&t->lookups);
  s->remote_blocks = atomic_load(&t->remote_blocks);
  s->remote_failed = atomic_load(&t->remote_failed);
  s->stale_removed = atomic_load(&t->stale_removed);
  s->served_blocks = atomic_load(&t->served_blocks);
  s->peers_refused = ps.refused;
  s->bytes_fetched = atomic_load(&t->bytes_fetched);
  s->bytes_served = atomic_load(&t->bytes_served);
  s->port = oi__peer_net_port(t->net);
  return OI_OK;
}

/* Past the pool and the disk; it publishes what the pool seals and
 * withdraws what it evicts. */
static const oi_tier_ops cluster_tier_ops = {.name = "cluster",
                                             .rank = 20,
                                             .lookup = tier_lookup,
                                             .promote = tier_promote,
                                             .sealed = on_sealed,
                                             .evicted = on_evicted,
                                             .stats = tier_stats,
                                             .destroy = tier_destroy};

OI_API oi_status oi_offload_host_cluster_stats(const oi_offload_host *h,
                                               oi_host_cluster_stats *out) {
  if (!h || !out)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "host_cluster_stats: %s is NULL", h ? "out" : "host");
  oi_host_cluster_stats s;
  oi_status st = oi__host_tier_stats(h, &cluster_tier_ops, &s, "host_cluster_stats");
  if (st != OI_OK) return st;
  return oi__struct_out(out, &s, sizeof s, "host_cluster_stats");
}
