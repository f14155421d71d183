/* Leases: pins on the blocks a query reported, redeemable by any caller of
 * the query's namespace with the same principal (the embedding process, or
 * one sidecar peer uid), with a share per consumer (world_size) and a TTL.
 * The creating instance's removal drops its leases. A lease's
 * 16 bytes are its id and a random tag, so a stale or forged lease is
 * recognised as unknown rather than matched to a newer one. */
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "core/fault.h"
#include "host_private.h"

#define LEASE_BUCKETS 1024
#define LOAD_READY_RUN 1024 /* blocks (a multiple of OI_BATCH) */

oi_status oi__lease_init(oi_host *h) {
  pthread_mutex_init(&h->lease_lock, NULL);
  pthread_cond_init(&h->lease_cv, NULL);
  h->lease_nbuckets = LEASE_BUCKETS;
  h->lease_buckets = oi__calloc(h->lease_nbuckets, sizeof *h->lease_buckets);
  if (!h->lease_buckets) return oi__fail(OI_ERR_OUT_OF_MEMORY, "host: out of memory for leases");
  if (getrandom(&h->lease_tag_state, sizeof h->lease_tag_state, 0) != sizeof h->lease_tag_state)
    h->lease_tag_state = oi__now_ns();
  h->lease_tag_state |= 1;
  h->next_lease_id = 1;
  return OI_OK;
}

static void unpin_blocks(oi_host *h, host_block **blocks, size_t n) {
  oi__blocks_unpin(h, blocks, n);
}

/* Waits (lease lock held) until no share of `l`, unlinked, is still marking
 * its blocks: a marker reads l->blocks, and its marks must land while the
 * lease's pins still hold the blocks (then they hold them themselves). */
static void wait_markers_locked(oi_host *h, lease_rec *l) {
  while (l->markers)
    pthread_cond_wait(&h->lease_cv, &h->lease_lock);
}

static void free_lease_mem(lease_rec *l) {
  if (l->blocks != l->inline_blocks) oi__free(l->blocks);
  oi__free(l);
}

/* A record done with: kept for reuse when it is of the inline size. */
static void free_lease(oi_host *h, lease_rec *l) {
  if (l->blocks == l->inline_blocks) {
    pthread_mutex_lock(&h->lease_lock);
    if (h->lease_nspare < OI_LEASE_SPARE) {
      l->next = h->lease_spare;
      h->lease_spare = l;
      h->lease_nspare++;
      l = NULL;
    }
    pthread_mutex_unlock(&h->lease_lock);
  }
  if (l) free_lease_mem(l);
}

void oi__lease_fini(oi_host *h) {
  if (!h->lease_buckets) return;
  for (size_t i = 0; i < h->lease_nbuckets; i++)
    for (lease_rec *l = h->lease_buckets[i], *next; l; l = next) {
      next = l->next;
      free_lease_mem(l);
    }
  for (lease_rec *l = h->lease_spare, *next; l; l = next) {
    next = l->next;
    free_lease_mem(l);
  }
  h->lease_spare = NULL;
  oi__free(h->lease_buckets);
  h->lease_buckets = NULL;
  pthread_mutex_destroy(&h->lease_lock);
  pthread_cond_destroy(&h->lease_cv);
}

static uint64_t next_tag_locked(oi_host *h) {
  uint64_t x = h->lease_tag_state; /* xorshift64* */
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  h->lease_tag_state = x;
  return x * 0x2545F4914F6CDD1Dull;
}

oi_status oi__lease_create(oi_host *h, uint32_t instance, uint32_t ns, uint64_t principal,
                           uint32_t shares, host_block **blocks, size_t n, oi_lease *out) {
  uint64_t expires = oi__now_ns() + (uint64_t)h->opts.lease_ttl_ms * 1000000ull;
  lease_rec *l = NULL;
  bool small = n <= OI_LEASE_INLINE;
  if (OI_FAULT(OI_FAULT_LEASE_ALLOC, NULL)) /* (tests: the query's undo path) */
    return oi__fail(OI_ERR_OUT_OF_MEMORY, "query: out of memory for a lease");
  pthread_mutex_lock(&h->lease_lock);
  if (small && h->lease_spare) { /* a spare record: no allocation, one lock */
    l = h->lease_spare;
    h->lease_spare = l->next;
    h->lease_nspare--;
    l->blocks = l->inline_blocks;
  } else {
    pthread_mutex_unlock(&h->lease_lock);
    l = oi__malloc(sizeof *l + (small ? OI_LEASE_INLINE * sizeof l->inline_blocks[0] : 0));
    host_block **copy = l && !small ? oi__malloc(n * sizeof *copy) : NULL;
    if (!l || (!small && !copy)) {
      oi__free(l);
      return oi__fail(OI_ERR_OUT_OF_MEMORY, "query: out of memory for a lease");
    }
    l->blocks = small ? l->inline_blocks : copy;
    pthread_mutex_lock(&h->lease_lock);
  }
  memcpy(l->blocks, blocks, n * sizeof *blocks);
  l->n = n;
  l->instance = instance;
  l->ns = ns;
  l->principal = principal;
  l->shares_left = shares;
  l->markers = 0;
  l->expires_ns = expires;
  l->id = h->next_lease_id++;
  l->tag = next_tag_locked(h);
  size_t k = l->id & (h->lease_nbuckets - 1);
  l->next = h->lease_buckets[k];
  h->lease_buckets[k] = l;
  h->lease_count++;
  /* Counted and read while still under the lock: once it is unlocked the
   * maintenance thread may expire (and free) the lease. */
  atomic_fetch_add(&h->c.leases_active, 1);
  memcpy(out->bytes, &l->id, 8);
  memcpy(out->bytes + 8, &l->tag, 8);
  pthread_mutex_unlock(&h->lease_lock);
  return OI_OK;
}

/* Finds and unlinks nothing; returns the link to the lease or NULL, having
 * set the error: unknown, or (the id of a live lease with another tag) stale
 * or forged. The live lease is left as it was. */
static lease_rec **find_locked(oi_host *h, oi_lease lease, const char *what) {
  uint64_t id, tag;
  memcpy(&id, lease.bytes, 8);
  memcpy(&tag, lease.bytes + 8, 8);
  lease_rec **link = &h->lease_buckets[id & (h->lease_nbuckets - 1)];
  for (; id && *link; link = &(*link)->next)
    if ((*link)->id == id) {
      if ((*link)->tag == tag) return link;
      oi__fail(OI_ERR_LEASE_EXPIRED,
               "%s: lease refused (its tag does not match the live lease of that id: stale or "
               "forged)",
               what);
      return NULL;
    }
  oi__fail(OI_ERR_LEASE_EXPIRED, "%s: lease unknown (released, fully consumed or expired)", what);
  return NULL;
}

static lease_rec *unlink_locked(oi_host *h, lease_rec **link) {
  lease_rec *l = *link;
  *link = l->next;
  h->lease_count--;
  atomic_fetch_sub(&h->c.leases_active, 1);
  return l;
}

/* Why `l` may not be redeemed by (ns, principal), or OI_OK. Lock held. */
static oi_status check_owner_locked(const lease_rec *l, uint32_t ns, uint64_t principal,
                                    const char *what) {
  if (l->ns != ns)
    return oi__fail(OI_ERR_PERMISSION, "%s: the lease belongs to another namespace", what);
  if (l->principal != principal)
    return oi__fail(OI_ERR_PERMISSION,
                    "%s: the lease was issued to other credentials (another user of the server)",
                    what);
  return OI_OK;
}

/* Marking a load's blocks: what the run tallies. */
typedef struct mark_tally {
  bool last;           /* the lease's last share: its pins become the marks */
  uint64_t slot_bytes; /* of the lease's blocks (one namespace: one size class) */
  uint64_t loading;
  pin_tally t;
} mark_tally;

static inline void mark_one(oi_host *h, host_block *b, host_block **out, uint8_t **data,
                            mark_tally *m) {
  oi__block_pinned_update(h, b->pins || b->loading, true);
  m->loading += b->loading++ == 0;
  if (m->last) m->t.leased -= --b->pins == 0; /* still held: loading */
  *out = b;
  if (data) *data = oi__block_data_sized(h, b, m->slot_bytes);
}

/* Marks blocks[0..k) (k <= LOAD_READY_RUN) loading, in order: a run of
 * oi__blocks_runs (every shard locked once per OI_ALL_SHARDS_RUN blocks for
 * a large load). */
typedef struct mark_run_ctx {
  host_block **out;
  uint8_t **data;
  mark_tally *m;
} mark_run_ctx;

static void mark_some(oi_host *h, void *ctx, host_block *const *blocks, size_t from, size_t to) {
  mark_run_ctx *c = ctx;
  for (size_t i = from; i < to; i++) {
    if (i + OI_RUN_PREFETCH < to) __builtin_prefetch(blocks[i + OI_RUN_PREFETCH], 1);
    mark_one(h, blocks[i], c->out + i, c->data ? c->data + i : NULL, c->m);
  }
}

static void mark_run(oi_host *h, host_block *const *blocks, size_t k, host_block **out,
                     uint8_t **data, mark_tally *m) {
  mark_run_ctx c = {out, data, m};
  oi__blocks_runs(h, blocks, k, true, mark_some, &c);
}

oi_status oi__lease_consume(oi_host *h, uint32_t ns, uint64_t principal, oi_lease lease, size_t n,
                            host_block **out, const oi_host_load_sink *sink) {
  pthread_mutex_lock(&h->lease_lock);
  lease_rec **link = find_locked(h, lease, "load");
  if (!link) {
    pthread_mutex_unlock(&h->lease_lock);
    return OI_ERR_LEASE_EXPIRED;
  }
  lease_rec *l = *link;
  if (oi__now_ns() >= l->expires_ns) {
    unlink_locked(h, link);
    wait_markers_locked(h, l);
    pthread_mutex_unlock(&h->lease_lock);
    atomic_fetch_add(&h->c.leases_expired, 1);
    unpin_blocks(h, l->blocks, l->n);
    free_lease(h, l);
    return oi__fail(OI_ERR_LEASE_EXPIRED, "load: lease expired after %u ms", h->opts.lease_ttl_ms);
  }
  oi_status st = check_owner_locked(l, ns, principal, "load");
  if (st != OI_OK) {
    pthread_mutex_unlock(&h->lease_lock);
    return st;
  }
  if (n != l->n) {
    pthread_mutex_unlock(&h->lease_lock);
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "load: %zu destination blocks for a lease of %zu", n,
                    l->n);
  }
  /* The last share's pins turn into loading marks in the same pass (one
   * visit per block: the block stays held throughout, never evictable in
   * between); an earlier share adds marks and leaves the pins. The marking
   * runs outside the lease lock (it takes shard locks, and the sink queues
   * copies), counted in l->markers: whoever unlinks the lease (its last
   * share, a release, an expiry) waits for the markers before it unpins
   * or frees it. The last share unlinks it first, so no share starts
   * after it. The sink hears of each run of LOAD_READY_RUN blocks marked
   * (their copies can start while the rest are marked). */
  bool last = --l->shares_left == 0;
  if (last) unlink_locked(h, link);
  l->markers++;
  pthread_mutex_unlock(&h->lease_lock);
  mark_tally m = {.last = last, /* (a lease holds at least one block) */
                  .slot_bytes = h->classes[oi__block_cls(h, l->blocks[0])].slot_bytes};
  uint8_t **data = sink ? sink->data : NULL;
  for (size_t at = 0; at < n; at += LOAD_READY_RUN) {
    size_t k = OI_MIN((size_t)LOAD_READY_RUN, n - at);
    mark_run(h, l->blocks + at, k, out + at, data ? data + at : NULL, &m);
    /* Counted before the sink hears of the run: its copies may end (and
     * count their blocks out) before the next run is marked. */
    if (m.loading) atomic_fetch_add(&h->c.blocks_loading, m.loading);
    m.loading = 0;
    if (sink && sink->ready) sink->ready(sink->ctx, at + k);
    uint64_t gap_ms = 0; /* (tests: a release, an expiry or the last share meets a marker) */
    if (OI_FAULT(OI_FAULT_LOAD_MARK_GAP, &gap_ms)) usleep((useconds_t)(gap_ms * 1000));
  }
  pthread_mutex_lock(&h->lease_lock);
  if (--l->markers == 0) pthread_cond_broadcast(&h->lease_cv);
  if (last) wait_markers_locked(h, l); /* earlier shares still marking */
  pthread_mutex_unlock(&h->lease_lock);
  if (last) {
    oi__pin_tally_apply(h, &m.t);
    atomic_fetch_add(&h->c.leases_released, 1);
    free_lease(h, l);
  }
  return OI_OK;
}

oi_status oi__lease_release(oi_host *h, uint32_t ns, uint64_t principal, oi_lease lease) {
  pthread_mutex_lock(&h->lease_lock);
  lease_rec **link = find_locked(h, lease, "release");
  if (!link) {
    pthread_mutex_unlock(&h->lease_lock);
    return OI_ERR_LEASE_EXPIRED;
  }
  oi_status st = check_owner_locked(*link, ns, principal, "release");
  if (st != OI_OK) {
    pthread_mutex_unlock(&h->lease_lock);
    return st;
  }
  lease_rec *l = unlink_locked(h, link);
  wait_markers_locked(h, l);
  pthread_mutex_unlock(&h->lease_lock);
  atomic_fetch_add(&h->c.leases_released, 1);
  unpin_blocks(h, l->blocks, l->n);
  free_lease(h, l);
  return OI_OK;
}

/* Unlinks every lease matching `pred` under the lock, then unpins outside. */
static void drop_matching(oi_host *h, bool by_instance, uint32_t instance, uint64_t now,
                          atomic_uint_fast64_t *counter) {
  lease_rec *dropped = NULL;
  pthread_mutex_lock(&h->lease_lock);
  for (size_t i = 0; i < h->lease_nbuckets && h->lease_count; i++) {
    lease_rec **link = &h->lease_buckets[i];
    while (*link) {
      lease_rec *l = *link;
      bool match = by_instance ? l->instance == instance : now >= l->expires_ns;
      if (match) {
        unlink_locked(h, link);
        l->next = dropped;
        dropped = l;
      } else {
        link = &l->next;
      }
    }
  }
  for (lease_rec *l = dropped; l; l = l->next)
    wait_markers_locked(h, l);
  pthread_mutex_unlock(&h->lease_lock);
  while (dropped) {
    lease_rec *l = dropped;
    dropped = l->next;
    atomic_fetch_add(counter, 1);
    unpin_blocks(h, l->blocks, l->n);
    free_lease(h, l);
  }
}

void oi__lease_drop_instance(oi_host *h, uint32_t instance) {
  if (instance == 0) return; /* leases without a creating instance */
  drop_matching(h, true, instance, 0, &h->c.leases_released);
}

void oi__lease_expire(oi_host *h, uint64_t now_ns) {
  drop_matching(h, false, 0, now_ns, &h->c.leases_expired);
}
