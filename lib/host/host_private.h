/* The host tier's internals, private to lib/host (the layers above use
 * host.h): the pool carved into size classes, the sharded index with
 * per-shard LRU lists, leases, counters.
 *
 * Lock order: lease table -> shard (a batch holds several, taken in
 * ascending shard order) -> the spill queue, the tiers' notify lock; chunk
 * table -> size class (no shard lock is held while allocating, and no size
 * class lock while a shard lock is taken: the rebalancer (rebalance.c) holds
 * one shard lock at a time, then frees what it evicted). A shard lock
 * protects the index entries, states, pins and LRU links of the blocks it
 * holds; a size class lock protects the free maps of its chunks and their
 * draining and fill marks. */
#ifndef OI_HOST_PRIVATE_H
#define OI_HOST_PRIVATE_H

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "device/device.h"
#include "host/host.h"
#include "host/tier.h"

#define OI_MAX_SIZE_CLASSES 8

typedef enum block_state {
  BLOCK_FREE = 0,
  BLOCK_IN_FLIGHT = 1, /* inserted in the index, bytes still landing: invisible */
  BLOCK_SEALED = 2,
} block_state;

/* Records are named inside the index by 32-bit ids: (chunk << slot_bits) |
 * slot. OI_NIL names none. */
#define OI_NIL UINT32_MAX

/* One host block slot, 48 bytes. While indexed, (ns, hash) names it in the
 * shard oi__block_shard picks. Every oi__block_evictable block is on its
 * shard's LRU list; so may be a pinned or loading one (a pin leaves the block
 * where it is; eviction unlinks what it meets at the tail that is not
 * evictable, and the unpin or load end that makes a block evictable moves it
 * to the recent end). Spilling and in-flight blocks never are. Its bytes are computed from its id
 * (oi__block_data), its size class from its chunk (oi__block_cls). The bit fields share one word:
 * they change only under the block's shard lock (or while the block is free, owned by whoever holds
 * it). */
struct host_block {
  oi_block_hash hash;
  uint32_t ns;
  uint32_t pins;               /* leases naming it */
  uint32_t loading : 24;       /* loads reading it */
  uint32_t state : 2;          /* block_state */
  uint32_t spilling : 1;       /* the spilling tier is copying its bytes (not evictable) */
  uint32_t lower : 1;          /* the spilling tier holds a copy (a spill or a promotion) */
  uint32_t spill_fate : 3;     /* oi_spill_fate: why the spilling tier does not hold it yet */
  uint32_t id;                 /* this record's id */
  uint32_t lru_prev, lru_next; /* ids, OI_NIL for none; a free slot's next free in lru_next */
  uint64_t last_used;
};

/* Whether a block may be evicted (then it is on its shard's LRU list). */
static inline bool oi__block_evictable(const host_block *b) {
  return b->state == BLOCK_SEALED && b->pins == 0 && b->loading == 0 && !b->spilling;
}

struct oi_host;

/* A sealed block waiting for the spilling tier: the record id it had and its
 * name (the id is checked against the index when taken: it may be reused). */
typedef struct spill_entry {
  uint32_t id;
  uint32_t ns;
  oi_block_hash hash;
} spill_entry;

/* A shard's index is an open-addressing table (Robin Hood linear probing,
 * backward-shift deletion) of 8-byte entries: the low 32 bits of the key (the
 * tag) above a record id. A slot's home is the tag scaled to the table size,
 * so the table reorganizes itself from the tags alone, and a lookup (a miss
 * too) reads one run of entries, usually one cache line, before any record. */
#define OI_INDEX_EMPTY UINT64_MAX

typedef struct index_shard {
  pthread_mutex_t lock;
  uint64_t *slots; /* (tag << 32) | id; OI_INDEX_EMPTY for none */
  uint32_t nslots, count;
  struct oi_host *host;
  uint32_t lru_head[OI_MAX_SIZE_CLASSES], lru_tail[OI_MAX_SIZE_CLASSES];
} __attribute__((aligned(64))) index_shard;

typedef struct size_class {
  pthread_mutex_t lock;
  uint64_t block_bytes;
  uint64_t slot_bytes;
  uint32_t
      free_chunks; /* chunks of this class with a free slot, chained by next_free (OI_NIL: none) */
  size_t nfree;
  atomic_uint_fast64_t slots;    /* carved slots */
  atomic_uint_fast64_t resident; /* in flight or sealed */
} size_class;

/* A carved chunk's free slots are bits (1: free), so taking a batch of
 * slots reads no record: 1 bit per slot. */
typedef struct pool_chunk {
  int cls; /* -1: not carved */
  uint32_t nslots;
  host_block *records;
  uint64_t *free_bits;
  uint32_t nfree;
  uint32_t word_hint; /* no free slot below this word */
  uint32_t next_free; /* the class's next chunk with a free slot (OI_NIL: none) */
  bool on_free_list;
  /* Being emptied for another class (rebalance.c): off its class's free
   * list, its freed slots are not counted in the class's nfree and no slot
   * of it is handed out, until it moves or the drain is cancelled. */
  atomic_bool draining; /* read without the lock by eviction (index.c) */
  uint64_t filled_seq;  /* h->fill_seq when a slot of it was last handed out */
} pool_chunk;

typedef struct ns_entry {
  char *name;
  uint64_t block_bytes;   /* stored per block (a codec's frame slot) */
  uint64_t logical_bytes; /* a block once decoded (block_bytes without a codec) */
  uint64_t shape_hash;
  uint32_t cls;
  int codec; /* oi_codec_id of its frames (OI_CODEC_NONE: blocks as they are) */
} ns_entry;

typedef struct lease_rec {
  struct lease_rec *next;
  uint64_t id, tag;
  uint32_t instance; /* the creator (0: none): its removal drops the lease */
  uint32_t shares_left;
  uint32_t markers;   /* shares marking its blocks now (outside the lease lock) */
  uint32_t ns;        /* redeemable in this namespace... */
  uint64_t principal; /* ...by this principal only */
  uint64_t expires_ns;
  size_t n;
  host_block **blocks; /* `inline_blocks` up to OI_LEASE_INLINE blocks */
  host_block *inline_blocks[];
} lease_rec;

/* Leases of up to this many blocks hold them in their record, and records
 * are kept for reuse (up to OI_LEASE_SPARE): a query allocates nothing. */
#define OI_LEASE_INLINE 64
#define OI_LEASE_SPARE 256

typedef struct host_counters {
  atomic_uint_fast64_t blocks_in_flight, blocks_sealed, blocks_leased, blocks_loading;
  atomic_uint_fast64_t saves_submitted, saves_completed, saves_deduplicated, saves_dropped,
      saves_failed;
  atomic_uint_fast64_t bytes_saved, bytes_loaded, loads_completed, loads_failed;
  atomic_uint_fast64_t query_hit_blocks, query_miss_blocks;
  atomic_uint_fast64_t leases_active, leases_expired, leases_released, evictions;
  atomic_uint_fast64_t loads_submitted, blocks_loaded;
  atomic_uint_fast64_t blocks_pinned; /* sealed blocks with pins > 0 or loading > 0 */
  oi_latency_hist save_latency, load_latency;
} host_counters;

/* Resident blocks per namespace: a two-level table (pages allocated when a
 * namespace is bound, never moved), so counters are updated without a lock.
 * Namespaces past OI_NS_COUNTED are served but not counted. */
#define OI_NS_PAGE 256
#define OI_NS_PAGES 256
#define OI_NS_COUNTED (OI_NS_PAGE * OI_NS_PAGES)

/* A read-rate estimate (rates.c): bytes per second, an EWMA of samples;
 * a tier's busy period (promotions in flight) makes one sample. */
enum { OI_RATE_LINK = 0, OI_RATE_DISK = 1, OI_RATE_REMOTE = 2, OI_RATES = 3 };
typedef struct host_rate {
  pthread_mutex_t lock;
  double bytes_per_s;
  uint64_t samples;
  size_t in_flight;
  uint64_t busy_start_ns, busy_bytes;
} host_rate;

struct oi_host {
  atomic_uint evicters; /* threads inside evict_until (host.c) */
  oi_host_options opts;
  oi_dev *dev;
  oi_pinned pool;
  uint64_t capacity;

  pthread_mutex_t chunk_lock;
  pool_chunk *chunks;
  uint32_t nchunks;
  uint32_t slot_bits; /* record id = (chunk << slot_bits) | slot */
  uint64_t chunk_bytes;

  pthread_mutex_t class_lock; /* creation of size classes */
  bool sector_slots;          /* under class_lock: see oi__host_sector_slots */
  size_class classes[OI_MAX_SIZE_CLASSES];
  atomic_uint nclasses;
  atomic_uint_fast64_t fill_seq; /* ordinal of slot hand-outs, for pool_chunk.filled_seq */

  /* The rebalancer (rebalance.c): classes that found no free slot and no
   * uncarved chunk (a bit each), and the chunk it drains across passes of
   * the maintenance thread (that thread's own state). */
  atomic_uint rebalance_want;
  struct {
    uint32_t chunk; /* OI_NIL: none */
    uint32_t from, to, passes;
  } drain;
  atomic_uint_fast64_t chunks_moved; /* for the debug log */

  index_shard *shards;
  uint32_t nshards;

  pthread_mutex_t ns_lock;
  ns_entry *ns;
  uint32_t nns, ns_cap;

  pthread_mutex_t lease_lock;
  pthread_cond_t lease_cv; /* a lease's last marker finished */
  lease_rec **lease_buckets;
  size_t lease_nbuckets, lease_count;
  lease_rec *lease_spare; /* records of OI_LEASE_INLINE blocks for reuse, under lease_lock */
  size_t lease_nspare;
  uint64_t next_lease_id;
  uint64_t lease_tag_state;

  /* Seal notifications: flushes that wait for blocks another engine has in
   * flight sleep here; every completed save broadcasts (when someone waits). */
  pthread_mutex_t seal_lock;
  pthread_cond_t seal_cv;
  int seal_waiters;

  atomic_uint next_instance;
  atomic_int live_engines;

  pthread_t maint_thread;
  bool maint_started;
  pthread_mutex_t maint_lock;
  pthread_cond_t maint_cv;
  bool stopping;

  /* The tier chain (tier.c): snapshots of its links in rank order,
   * published whole (a query reads the current one without a lock; a
   * snapshot replaced stays allocated until the host's destroy), under
   * tier_lock. tier_notify_lock (a reader lock: the shards' seal and
   * eviction paths do not serialize on it) guards the links' `notify`;
   * `notifying`: some link is told of seals or evictions. */
  pthread_mutex_t tier_lock;
  _Atomic(struct tier_chain *) chain; /* NULL: no tier (the query's one branch) */
  struct tier_chain *chains_old;      /* replaced snapshots, freed at destroy */
  oi_tier *tier_links;                /* every link ever attached, freed at destroy */
  pthread_rwlock_t tier_notify_lock;
  atomic_bool notifying;
  /* The spill queue (spill.c): the tier that takes spills, and the ring of
   * sealed blocks it has not copied yet (oldest seal first), under
   * spill_lock. */
  _Atomic(oi_tier *) spill_tier;
  pthread_mutex_t spill_lock;
  pthread_cond_t spill_cv; /* the ring got entries, or the tier stops */
  spill_entry *spill_ring;
  size_t spill_head, spill_count, spill_cap;
  atomic_uint_fast64_t spill_overflow; /* blocks not queued: the ring was full */
  size_t spill_taken;          /* under spill_lock: taken by the spilling tier, not ended yet */
  pthread_cond_t spill_end_cv; /* under spill_lock: spills ended (eviction waits for them) */
  /* Blocks that left the pool (evicted) without reaching the spilling tier,
   * by their oi_spill_fate (index 0 unused). */
  atomic_uint_fast64_t spill_lost[OI_SPILL_FATES];

  host_counters c;
  host_rate rates[OI_RATES]; /* rates.c */
  uint64_t pool_setup_ns;
  _Atomic(atomic_uint_fast64_t *) ns_resident[OI_NS_PAGES];
};

/* The record named by id (not OI_NIL). Its chunk's record table is stable
 * while any of its slots is allocated. */
static inline host_block *oi__rec(const oi_host *h, uint32_t id) {
  return h->chunks[id >> h->slot_bits].records + (id & ((1u << h->slot_bits) - 1));
}
/* Prefetches a record for writing: both of its lines (a 48-byte record
 * crosses a line boundary at every other slot). */
static inline void oi__rec_prefetch(const host_block *b) {
  __builtin_prefetch(b, 1);
  __builtin_prefetch((const char *)b + sizeof *b - 1, 1);
}
/* A block's size class: its chunk's (stable while the block is allocated). */
static inline uint32_t oi__block_cls(const oi_host *h, const host_block *b) {
  return (uint32_t)h->chunks[b->id >> h->slot_bits].cls;
}
/* As oi__block_data, with the slot size of b's class known (the blocks of
 * one namespace share it). */
static inline uint8_t *oi__block_data_sized(const oi_host *h, const host_block *b,
                                            uint64_t slot_bytes) {
  return (uint8_t *)h->pool.host + (uint64_t)(b->id >> h->slot_bits) * h->chunk_bytes +
         (uint64_t)(b->id & ((1u << h->slot_bits) - 1)) * slot_bytes;
}

static inline uint8_t *oi__block_data(const oi_host *h, const host_block *b) {
  return oi__block_data_sized(h, b, h->classes[oi__block_cls(h, b)].slot_bytes);
}

/* Adds `d` (may be negative, two's complement) to namespace `ns`'s resident
 * blocks. `ns` is a namespace id (1-based). */
static inline void oi__ns_resident_add(oi_host *h, uint32_t ns, uint64_t d) {
  uint32_t i = ns - 1;
  if (ns == 0 || i >= OI_NS_COUNTED) return;
  atomic_uint_fast64_t *page =
      atomic_load_explicit(&h->ns_resident[i / OI_NS_PAGE], memory_order_acquire);
  if (page) atomic_fetch_add_explicit(&page[i % OI_NS_PAGE], d, memory_order_relaxed);
}
uint64_t oi__ns_resident_get(const oi_host *h, uint32_t ns);

/* blocks_pinned bookkeeping: call under the block's shard lock, with the
 * block's pins/loading counts before (was) and after (now) a change. */
static inline void oi__block_pinned_update(oi_host *h, bool was, bool now) {
  if (was != now) {
    if (now)
      atomic_fetch_add_explicit(&h->c.blocks_pinned, 1, memory_order_relaxed);
    else
      atomic_fetch_sub_explicit(&h->c.blocks_pinned, 1, memory_order_relaxed);
  }
}

/* ---- pool (pool.c) ---- */
oi_status oi__pool_init(oi_host *h);
void oi__pool_fini(oi_host *h);
/* Size class for a block size, created on first use. */
oi_status oi__pool_class_for(oi_host *h, uint64_t block_bytes, uint32_t *cls);
/* A free slot of class `cls`: from the free list, a newly carved chunk, or by
 * evicting the least recently used unpinned block. NULL when none. */
host_block *oi__pool_alloc(oi_host *h, uint32_t cls);
/* Up to `want` free slots of class `cls` (free list, then new chunks; never
 * evicts), in one lock acquisition. Returns how many were taken. */
size_t oi__pool_alloc_batch(oi_host *h, uint32_t cls, size_t want, host_block **out);
void oi__pool_free(oi_host *h, host_block *b);
void oi__pool_free_batch(oi_host *h, host_block **blocks, size_t n);
/* Whether class `cls` has no free slot and no uncarved chunk is left. */
bool oi__pool_starved(oi_host *h, uint32_t cls);
/* Up to `max` (at most 8) carved chunks of the classes in the bit mask
 * `classes`, not draining, the least recently filled first (their class in
 * from[]). Returns how many. */
size_t oi__pool_victims(oi_host *h, unsigned classes, uint32_t *chunks, uint32_t *from, size_t max);
/* Marks chunk `ci` of class `cls` draining: no slot of it is handed out
 * from now on. false: it is no longer of that class, or drains already. */
bool oi__pool_drain_begin(oi_host *h, uint32_t ci, uint32_t cls);
/* Ends a drain that did not move its chunk: its free slots serve its class again. */
void oi__pool_drain_cancel(oi_host *h, uint32_t ci);
/* Moves draining chunk `ci` to class `to` if every slot of it is free: its
 * record table and free map rebuilt for the new slot size. false: some slot
 * is still taken (it stays draining), or the new tables could not be
 * allocated (it is left uncarved, for any class). */
bool oi__pool_drain_finish(oi_host *h, uint32_t ci, uint32_t to);
/* A class found no free slot and no chunk to carve (a save's reserve): asks
 * the maintenance thread to move a chunk to it; takes no lock, never waits.
 * A lone class has no one to take from. */
static inline void oi__pool_rebalance_request(oi_host *h, uint32_t cls) {
  unsigned bit = 1u << cls;
  if (atomic_load_explicit(&h->nclasses, memory_order_relaxed) < 2 ||
      (atomic_load_explicit(&h->rebalance_want, memory_order_relaxed) & bit))
    return;
  if (!(atomic_fetch_or(&h->rebalance_want, bit) & bit)) pthread_cond_signal(&h->maint_cv);
}

/* ---- rebalance.c ---- */
/* One pass of the size-class rebalancer (the maintenance thread's). */
void oi__rebalance_run(oi_host *h);

/* ---- index (index.c) ---- */
oi_status oi__index_init(oi_host *h);
void oi__index_fini(oi_host *h);
/* The index's hash of a key: picks the shard (high bits) and the bucket (low bits). */
static inline uint64_t oi__index_key(uint32_t ns, const oi_block_hash *h) {
  uint64_t a, b;
  memcpy(&a, h->bytes, 8);
  memcpy(&b, h->bytes + 8, 8);
  /* The first word is mixed before the second joins it: hashes whose two
   * words are related (a = b * c + k, as some engines' names are) must not
   * cancel into a handful of keys (one pattern of that kind once put 32,768
   * blocks in a few buckets and took a minute to save). */
  uint64_t x = a ^ ((uint64_t)ns * 0xC2B2AE3D27D4EB4Full);
  x ^= x >> 33;
  x *= 0xFF51AFD7ED558CCDull;
  x ^= x >> 33;
  x ^= b;
  x *= 0xC4CEB9FE1A85EC53ull;
  x ^= x >> 33;
  return x;
}
static inline index_shard *oi__index_shard_of(oi_host *h, uint64_t key) {
  return &h->shards[(key >> 48) & (h->nshards - 1)];
}
/* The shard holding an indexed block (from its name, which does not change
 * while it is indexed). */
static inline index_shard *oi__block_shard(oi_host *h, const host_block *b) {
  return oi__index_shard_of(h, oi__index_key(b->ns, &b->hash));
}
index_shard *oi__index_shard(oi_host *h, uint32_t ns, const oi_block_hash *hash);
host_block *oi__index_find_locked(index_shard *s, uint32_t ns, const oi_block_hash *hash);
/* As oi__index_find_locked, given key = oi__index_key(ns, hash). */
host_block *oi__index_find_key_locked(index_shard *s, uint64_t key, uint32_t ns,
                                      const oi_block_hash *hash);
/* Prefetches what looking up `hashes` will touch (a hint; takes no lock). */
void oi__index_prefetch(oi_host *h, uint32_t ns, const oi_block_hash *hashes, size_t n);
/* ---- batches: per call, not per block, locking ----
 * A batch of up to OI_BATCH hashes (or blocks) takes each shard it touches
 * once, in ascending shard order (so batches never deadlock one another;
 * nothing else holds two shard locks), after prefetching the table lines
 * and the locks of all of them; lookups then overlap their misses: every
 * table run is read first, the candidate records are prefetched, then
 * checked. Lock order is unchanged: lease table -> shards -> spill queue,
 * tier notifications. OI_BATCH is in host.h (a reserve sink hears of a batch at once). */

typedef struct shard_set {
  uint32_t n;
  uint32_t ids[OI_BATCH]; /* distinct shard indexes, ascending */
} shard_set;

/* Locks the distinct shards of shard[0..n) (n <= OI_BATCH), each once. */
void oi__shard_set_lock(oi_host *h, shard_set *set, const uint32_t *shard, size_t n);
void oi__shard_set_unlock(oi_host *h, shard_set *set);

typedef struct index_batch {
  size_t n;
  uint32_t ns;
  const oi_block_hash *hashes;
  shard_set locked;
  uint64_t key[OI_BATCH];
  uint32_t shard[OI_BATCH];
  host_block *found[OI_BATCH]; /* NULL: not indexed */
} index_batch;

/* Looks up hashes[0..n) (n <= OI_BATCH) of namespace ns and returns with
 * their shards locked (q->found valid until oi__index_batch_unlock). */
void oi__index_batch_lock(oi_host *h, index_batch *q, uint32_t ns, const oi_block_hash *hashes,
                          size_t n);
/* As oi__index_batch_lock, with every shard's lock held by the caller
 * (oi__shards_lock_all); locks nothing. */
void oi__index_batch_find_all_locked(oi_host *h, index_batch *q, uint32_t ns,
                                     const oi_block_hash *hashes, size_t n);
/* Every shard's lock, in ascending order; released in descending order. */
void oi__shards_lock_all(oi_host *h);
void oi__shards_unlock_all(oi_host *h);
static inline void oi__index_batch_unlock(oi_host *h, index_batch *q) {
  oi__shard_set_unlock(h, &q->locked);
}
static inline index_shard *oi__index_batch_shard(oi_host *h, const index_batch *q, size_t i) {
  return &h->shards[q->shard[i]];
}
/* Locks the shards of blocks[0..n) (n <= OI_BATCH, indexed blocks). */
void oi__blocks_lock(oi_host *h, shard_set *set, host_block *const *blocks, size_t n);
/* Runs of blocks a caller handles under one taking of every shard lock
 * (oi__blocks_runs), and how far ahead such a walk prefetches records. */
#define OI_ALL_SHARDS_RUN 512
#define OI_RUN_PREFETCH 8
/* Whether a call over n blocks (or hashes) takes every shard's lock once per
 * run of OI_ALL_SHARDS_RUN: n at least that, with at most a quarter as many
 * shards (64 by default: nearly every shard holds some of such a run). */
static inline bool oi__all_shards_for(const oi_host *h, size_t n) {
  return n >= OI_ALL_SHARDS_RUN && (size_t)h->nshards * 4 <= OI_ALL_SHARDS_RUN;
}
/* Handles blocks[from..to) with the shard locks of those blocks held. */
typedef void (*oi_blocks_run_fn)(oi_host *h, void *ctx, host_block *const *blocks, size_t from,
                                 size_t to);
/* Calls fn over blocks[0..n) (indexed blocks), run after run. With all_ok
 * and oi__all_shards_for(h, n), each run of OI_ALL_SHARDS_RUN blocks is handled with every shard's
 * lock taken in ascending order: no block's shard is computed (a hash of its name) and no set
 * sorted, and each lock is held a few microseconds (fn should prefetch OI_RUN_PREFETCH records
 * ahead; the first ones are). Otherwise runs of OI_BATCH blocks under their shards' locks. The
 * caller passes all_ok false when fn takes another lock (ThreadSanitizer keeps at most 64 held). */
void oi__blocks_runs(oi_host *h, host_block *const *blocks, size_t n, bool all_ok,
                     oi_blocks_run_fn fn, void *ctx);
/* Unpins blocks[0..n), any n, a batch of shards at a time. */
void oi__blocks_unpin(oi_host *h, host_block *const *blocks, size_t n);

/* Indexes b (its ns and hash set; key = oi__index_key of them, which the
 * caller computed to find s). false: the table is full and could not grow
 * (out of memory); b is not indexed. */
bool oi__index_insert_locked(oi_host *h, index_shard *s, host_block *b, uint64_t key);
void oi__index_remove_locked(index_shard *s, host_block *b);
void oi__lru_push_locked(index_shard *s, host_block *b); /* most recent end */
void oi__lru_remove_locked(index_shard *s, host_block *b);
/* Pin bookkeeping under the block's shard lock. */
/* Pins and unpins, under the block's shard lock. The leased/pinned block
 * counters change are tallied and applied once per batch. */
typedef struct pin_tally {
  int64_t leased, pinned;
  uint64_t now; /* an unpin's use time, read once per batch (0: not yet) */
} pin_tally;
void oi__block_pin_locked(index_shard *s, host_block *b, pin_tally *t);
void oi__block_unpin_locked(index_shard *s, host_block *b, pin_tally *t);
void oi__pin_tally_apply(oi_host *h, const pin_tally *t);
/* Evicts the least recently used evictable block of class `cls` (any class
 * when cls < 0) and returns it (removed from the index, state FREE, still
 * counted resident in its class: pass it to oi__pool_free or reuse it), or NULL. */
host_block *oi__index_evict_one(oi_host *h, int cls);
/* Waits (a little, at most until deadline_ns) for a spill to end.
 * @return false when no block is queued or being spilled (nothing to wait for). */
bool oi__host_spill_wait_end(oi_host *h, uint64_t deadline_ns);
size_t oi__index_evict_batch(oi_host *h, int cls, size_t want, host_block **out);
/* As oi__index_evict_batch; spare_only: never a block awaiting its spill
 * (the maintenance thread's watermark eviction, which is not urgent). */
size_t oi__index_evict_batch_spared(oi_host *h, int cls, size_t want, host_block **out,
                                    bool spare_only);
/* Whether an indexed block is held: pinned (leased), loading or spilling.
 * A rebalance never takes a chunk with a held block (an in-flight block it
 * waits for: it seals, or is dropped, soon). */
static inline bool oi__block_held(const host_block *b) {
  return b->pins || b->loading || b->spilling;
}
/* What the index holds of chunks[0..n) (n <= 8), each shard read under its
 * lock, one at a time: per chunk, its indexed blocks, how many of them are
 * held (oi__block_held) and the newest use among them. */
typedef struct chunk_census {
  uint32_t indexed, held;
  uint64_t newest;
} chunk_census;
void oi__index_chunk_census(oi_host *h, const uint32_t *chunks, size_t n, chunk_census *out);
/* Evicts every evictable indexed block of chunk `ci`, one shard lock at a
 * time, and frees them (counted as evictions, the watcher told); blocks in
 * flight are left as they are. Sets *held when it met a held block
 * (oi__block_held; left as it is). Returns how many it evicted. */
size_t oi__index_evict_chunk(oi_host *h, uint32_t ci, bool *held);
/* The oldest use at the LRU tails of each size class, oldest[0..
 * OI_MAX_SIZE_CLASSES) (UINT64_MAX: none listed). A pinned block may still
 * be listed at a tail: an approximation. */
void oi__index_oldest(oi_host *h, uint64_t *oldest);

/* ---- leases (lease.c) ---- */
oi_status oi__lease_init(oi_host *h);
void oi__lease_fini(oi_host *h);
/* Creates a lease over blocks the caller already pinned. */
oi_status oi__lease_create(oi_host *h, uint32_t instance, uint32_t ns, uint64_t principal,
                           uint32_t shares, host_block **blocks, size_t n, oi_lease *out);
/* Consumes one share of `lease` for a load of n blocks on `instance`; marks
 * the blocks loading and copies them to out (n entries). */
oi_status oi__lease_consume(oi_host *h, uint32_t ns, uint64_t principal, oi_lease lease, size_t n,
                            host_block **out, const oi_host_load_sink *sink);
oi_status oi__lease_release(oi_host *h, uint32_t ns, uint64_t principal, oi_lease lease);
void oi__lease_drop_instance(oi_host *h, uint32_t instance);
void oi__lease_expire(oi_host *h, uint64_t now_ns);

/* ---- host.c ---- */
/* Wakes flushes waiting for in-flight blocks to seal or drop. */
void oi__host_notify_sealed(oi_host *h);

/* ---- tier.c ---- */
/* A link of the chain. */
struct oi_tier {
  oi_host *host;
  const oi_tier_ops *ops;
  void *self;
  bool notify; /* told of seals and evictions (under tier_notify_lock) */
  bool destroyed;
  oi_tier *next_link; /* in tier_links */
};
/* A snapshot of the chain: its links in rank order. */
typedef struct tier_chain {
  struct tier_chain *older; /* in chains_old */
  size_t n;
  oi_tier *links[];
} tier_chain;
void oi__tier_init(oi_host *h);
/* rates.c: the read-rate estimates (OI_RATE_*). A sample of `bytes` in
 * `ns`; a tier's promotions: k slots begin, one ends (its bytes when ok);
 * the estimates (bytes per second) and sample counts; the OI_RATE_* of an
 * oi_block_where (-1: none). */
void oi__rates_init(oi_host *h);
void oi__rates_fini(oi_host *h);
void oi__rate_sample(oi_host *h, int which, uint64_t bytes, uint64_t ns);
void oi__rate_busy_begin(oi_host *h, int which, size_t k);
void oi__rate_busy_end(oi_host *h, int which, uint64_t bytes, bool ok);
void oi__rates_read(const oi_host *h, uint64_t bytes_per_s[OI_RATES], uint64_t samples[OI_RATES]);
int oi__rate_of_where(uint32_t where);
/* Stops telling the tiers of seals and evictions (waits for calls in
 * progress), then destroys the tiers that do not take spills, farthest
 * first (host destroy, first thing). */
void oi__tier_fini_upper(oi_host *h);
/* Destroys the tier that takes spills (it drains its queue), then frees the
 * chain (host destroy, after the maintenance thread stopped). */
void oi__tier_fini(oi_host *h);
/* Tells the listening tiers that blocks[0..n) sealed / were evicted. */
void oi__tier_note_sealed(oi_host *h, host_block *const *blocks, size_t n);
void oi__tier_note_evicted(oi_host *h, host_block *const *blocks, size_t n);

/* ---- spill.c ---- */
void oi__spill_init(oi_host *h);
void oi__spill_fini(oi_host *h);
/* Blocks just sealed (their shard locks held): queued for the spilling
 * tier unless it holds them already. */
void oi__spill_note_sealed_locked(oi_host *h, host_block *const *blocks, size_t n);
/* Puts an evictable block back on its LRU list in last_used order (a spill
 * that ended is not a use). */
void oi__lru_insert_ordered_locked(index_shard *s, host_block *b);

#endif
