/* The sharded index: (namespace id, 16-byte hash) -> host block, one
 * open-addressing table per shard (host_private.h), one lock per shard (no
 * global lock), and per shard and size class an LRU list of the blocks that
 * may be evicted. */
#include <string.h>

#include "host_private.h"

#define INITIAL_SLOTS 256
/* Grown by half when more than 7/8 full: between 7/12 and 7/8 full at any
 * size, so the table costs 8 / (7/12) <= 13.8 bytes per indexed block. */
#define MAX_LOAD_NUM 7
#define MAX_LOAD_DEN 8

#define key_hash oi__index_key

static inline uint32_t entry_tag(uint64_t e) { return (uint32_t)(e >> 32); }
static inline uint32_t entry_id(uint64_t e) { return (uint32_t)e; }
static inline uint32_t home_of(uint32_t tag, uint32_t n) {
  return (uint32_t)(((uint64_t)tag * n) >> 32);
}
/* How far slot `pos` is past the home of the entry it holds. */
static inline uint32_t dist_of(uint64_t e, uint32_t pos, uint32_t n) {
  uint32_t home = home_of(entry_tag(e), n);
  return pos >= home ? pos - home : pos + n - home;
}

static uint64_t *alloc_slots(uint32_t n) {
  uint64_t *t = oi__calloc_table((size_t)n * sizeof *t); /* huge pages when large */
  if (t) memset(t, 0xFF, (size_t)n * sizeof *t);         /* OI_INDEX_EMPTY */
  return t;
}

oi_status oi__index_init(oi_host *h) {
  h->nshards = h->opts.index_shards;
  h->shards = oi__aligned_alloc(64, h->nshards * sizeof *h->shards);
  if (!h->shards) return oi__fail(OI_ERR_OUT_OF_MEMORY, "host: out of memory for the index");
  memset(h->shards, 0, h->nshards * sizeof *h->shards);
  for (uint32_t i = 0; i < h->nshards; i++) {
    index_shard *s = &h->shards[i];
    pthread_mutex_init(&s->lock, NULL);
    s->host = h;
    for (int c = 0; c < OI_MAX_SIZE_CLASSES; c++)
      s->lru_head[c] = s->lru_tail[c] = OI_NIL;
    s->nslots = INITIAL_SLOTS;
    s->slots = alloc_slots(s->nslots);
    if (!s->slots) {
      h->nshards = i + 1;
      oi__index_fini(h);
      return oi__fail(OI_ERR_OUT_OF_MEMORY, "host: out of memory for the index");
    }
  }
  return OI_OK;
}

void oi__index_fini(oi_host *h) {
  if (!h->shards) return;
  for (uint32_t i = 0; i < h->nshards; i++) {
    oi__free(h->shards[i].slots);
    pthread_mutex_destroy(&h->shards[i].lock);
  }
  oi__free(h->shards);
  h->shards = NULL;
}

index_shard *oi__index_shard(oi_host *h, uint32_t ns, const oi_block_hash *hash) {
  return oi__index_shard_of(h, key_hash(ns, hash));
}

/* Lookups of a batch are dominated by cache misses (the shard, the table
 * line, the record). Prefetching the table lines and shard locks of a whole
 * batch first overlaps those misses before the locked walk. A hint only: the
 * shard's table pointer and size are read with relaxed atomics without the
 * lock, and a prefetch of a stale address is harmless (prefetches never
 * fault). */
void oi__index_prefetch(oi_host *h, uint32_t ns, const oi_block_hash *hashes, size_t n) {
  for (size_t i = 0; i < n; i++) {
    uint64_t k = key_hash(ns, &hashes[i]);
    index_shard *s = oi__index_shard_of(h, k);
    uint64_t *slots = __atomic_load_n(&s->slots, __ATOMIC_RELAXED);
    uint32_t nslots = __atomic_load_n(&s->nslots, __ATOMIC_RELAXED);
    __builtin_prefetch(&s->lock, 1);
    __builtin_prefetch(&slots[home_of((uint32_t)k, nslots)]);
  }
}

host_block *oi__index_find_locked(index_shard *s, uint32_t ns, const oi_block_hash *hash) {
  return oi__index_find_key_locked(s, key_hash(ns, hash), ns, hash);
}

host_block *oi__index_find_key_locked(index_shard *s, uint64_t key, uint32_t ns,
                                      const oi_block_hash *hash) {
  oi_host *h = s->host;
  uint32_t tag = (uint32_t)key, n = s->nslots, pos = home_of(tag, n);
  const uint64_t *t = s->slots;
  for (uint32_t d = 0;; d++) {
    uint64_t e = t[pos];
    if (e == OI_INDEX_EMPTY) return NULL;
    if (entry_tag(e) == tag) {
      host_block *b = oi__rec(h, entry_id(e));
      if (b->ns == ns && memcmp(b->hash.bytes, hash->bytes, sizeof hash->bytes) == 0) return b;
    } else if (dist_of(e, pos, n) < d) {
      return NULL; /* Robin Hood: ours would have displaced this one */
    }
    if (++pos == n) pos = 0;
  }
}

/* Places entry e (Robin Hood) in a table with a free slot. */
static void place(uint64_t *t, uint32_t n, uint64_t e) {
  uint32_t pos = home_of(entry_tag(e), n), d = 0;
  for (;;) {
    uint64_t cur = t[pos];
    if (cur == OI_INDEX_EMPTY) {
      t[pos] = e;
      return;
    }
    uint32_t cd = dist_of(cur, pos, n);
    if (cd < d) { /* the richer entry moves on */
      t[pos] = e;
      e = cur;
      d = cd;
    }
    if (++pos == n) pos = 0;
    d++;
  }
}

static bool grow_locked(index_shard *s) {
  uint64_t n64 = (uint64_t)s->nslots + s->nslots / 2;
  if (n64 > UINT32_MAX) return false;
  uint32_t n = (uint32_t)n64;
  uint64_t *t = alloc_slots(n);
  if (!t) return false;
  for (uint32_t i = 0; i < s->nslots; i++)
    if (s->slots[i] != OI_INDEX_EMPTY) place(t, n, s->slots[i]); /* tags only: no record read */
  uint64_t *old = s->slots;
  /* Relaxed atomic stores: oi__index_prefetch reads these without the lock. */
  __atomic_store_n(&s->slots, t, __ATOMIC_RELAXED);
  __atomic_store_n(&s->nslots, n, __ATOMIC_RELAXED);
  oi__free(old);
  return true;
}

size_t oi__host_foreach_sealed(oi_host *h,
                               void (*fn)(void *ctx, uint32_t ns, const oi_block_hash *hash),
                               void *ctx) {
  size_t n = 0;
  for (uint32_t i = 0; i < h->nshards; i++) {
    index_shard *s = &h->shards[i];
    pthread_mutex_lock(&s->lock);
    for (uint32_t k = 0; k < s->nslots; k++) {
      if (s->slots[k] == OI_INDEX_EMPTY) continue;
      host_block *b = oi__rec(h, entry_id(s->slots[k]));
      if (b->state == BLOCK_SEALED) {
        fn(ctx, b->ns, &b->hash);
        n++;
      }
    }
    pthread_mutex_unlock(&s->lock);
  }
  return n;
}

bool oi__index_insert_locked(oi_host *h, index_shard *s, host_block *b, uint64_t key) {
  (void)h;
  if ((uint64_t)(s->count + 1) * MAX_LOAD_DEN > (uint64_t)s->nslots * MAX_LOAD_NUM &&
      !grow_locked(s) && s->count + 2 > s->nslots)
    return false; /* full (one slot always stays empty: lookups end) */
  place(s->slots, s->nslots, (uint64_t)(uint32_t)key << 32 | b->id);
  s->count++;
  return true;
}

void oi__index_remove_locked(index_shard *s, host_block *b) {
  uint64_t *t = s->slots;
  uint32_t n = s->nslots, tag = (uint32_t)key_hash(b->ns, &b->hash);
  uint64_t want = (uint64_t)tag << 32 | b->id;
  uint32_t pos = home_of(tag, n);
  for (uint32_t d = 0;; d++) {
    uint64_t e = t[pos];
    if (e == want) break;
    if (e == OI_INDEX_EMPTY || (entry_tag(e) != tag && dist_of(e, pos, n) < d)) return;
    if (++pos == n) pos = 0;
  }
  /* Backward shift: the entries behind move one slot nearer their homes. */
  for (;;) {
    uint32_t next = pos + 1 == n ? 0 : pos + 1;
    uint64_t e = t[next];
    if (e == OI_INDEX_EMPTY || dist_of(e, next, n) == 0) break;
    t[pos] = e;
    pos = next;
  }
  t[pos] = OI_INDEX_EMPTY;
  s->count--;
}

/* ---- batches ---- */

void oi__shard_set_lock(oi_host *h, shard_set *set, const uint32_t *shard, size_t n) {
  uint32_t k = 0;
  if (h->nshards <= 64) { /* the usual case: a bit mask sorts them */
    uint64_t mask = 0;
    for (size_t i = 0; i < n; i++)
      mask |= 1ull << shard[i];
    for (; mask; mask &= mask - 1)
      set->ids[k++] = (uint32_t)__builtin_ctzll(mask);
  } else {
    for (size_t i = 0; i < n; i++) { /* insertion, without duplicates */
      uint32_t v = shard[i], j = k;
      while (j > 0 && set->ids[j - 1] > v)
        j--;
      if (j > 0 && set->ids[j - 1] == v) continue;
      memmove(&set->ids[j + 1], &set->ids[j], (k - j) * sizeof set->ids[0]);
      set->ids[j] = v;
      k++;
    }
  }
  set->n = k;
  for (uint32_t i = 0; i < k; i++)
    pthread_mutex_lock(&h->shards[set->ids[i]].lock);
}

void oi__shard_set_unlock(oi_host *h, shard_set *set) {
  for (uint32_t i = set->n; i-- > 0;)
    pthread_mutex_unlock(&h->shards[set->ids[i]].lock);
  set->n = 0;
}

/* The first entry of s's table with tag `tag` (its id), or OI_NIL. */
static uint32_t first_with_tag(const index_shard *s, uint32_t tag) {
  uint32_t n = s->nslots, pos = home_of(tag, n);
  const uint64_t *t = s->slots;
  for (uint32_t d = 0;; d++) {
    uint64_t e = t[pos];
    if (e == OI_INDEX_EMPTY) return OI_NIL;
    if (entry_tag(e) == tag) return entry_id(e);
    if (dist_of(e, pos, n) < d) return OI_NIL;
    if (++pos == n) pos = 0;
  }
}

/* The keys and shards of a batch, their table lines and locks prefetched. */
static void batch_keys(oi_host *h, index_batch *q, uint32_t ns, const oi_block_hash *hashes,
                       size_t n) {
  q->n = n;
  q->ns = ns;
  q->hashes = hashes;
  q->locked.n = 0;
  for (size_t i = 0; i < n; i++) {
    uint64_t k = key_hash(ns, &hashes[i]);
    uint32_t si = (uint32_t)(k >> 48) & (h->nshards - 1);
    index_shard *s = &h->shards[si];
    q->key[i] = k;
    q->shard[i] = si;
    /* A hint before the lock (see oi__index_prefetch). */
    uint64_t *slots = __atomic_load_n(&s->slots, __ATOMIC_RELAXED);
    uint32_t nslots = __atomic_load_n(&s->nslots, __ATOMIC_RELAXED);
    __builtin_prefetch(&s->lock, 1);
    __builtin_prefetch(&slots[home_of((uint32_t)k, nslots)]);
  }
}

/* The batch's lookups, its shards locked: every table run first (their
 * misses overlap), the candidates' records prefetched, then checked. */
static void batch_find(oi_host *h, index_batch *q) {
  uint32_t cand[OI_BATCH];
  for (size_t i = 0; i < q->n; i++) {
    cand[i] = first_with_tag(&h->shards[q->shard[i]], (uint32_t)q->key[i]);
    if (cand[i] != OI_NIL) oi__rec_prefetch(oi__rec(h, cand[i]));
  }
  for (size_t i = 0; i < q->n; i++) {
    host_block *b = NULL;
    if (cand[i] != OI_NIL) {
      b = oi__rec(h, cand[i]);
      if (b->ns != q->ns || memcmp(b->hash.bytes, q->hashes[i].bytes, sizeof b->hash.bytes) != 0)
        b = oi__index_find_key_locked(&h->shards[q->shard[i]], q->key[i], q->ns, &q->hashes[i]);
    }
    q->found[i] = b;
  }
}

void oi__index_batch_lock(oi_host *h, index_batch *q, uint32_t ns, const oi_block_hash *hashes,
                          size_t n) {
  batch_keys(h, q, ns, hashes, n);
  oi__shard_set_lock(h, &q->locked, q->shard, n);
  batch_find(h, q);
}

void oi__index_batch_find_all_locked(oi_host *h, index_batch *q, uint32_t ns,
                                     const oi_block_hash *hashes, size_t n) {
  batch_keys(h, q, ns, hashes, n);
  batch_find(h, q);
}

void oi__shards_lock_all(oi_host *h) {
  for (uint32_t s = 0; s < h->nshards; s++)
    pthread_mutex_lock(&h->shards[s].lock);
}

void oi__shards_unlock_all(oi_host *h) {
  for (uint32_t s = h->nshards; s-- > 0;)
    pthread_mutex_unlock(&h->shards[s].lock);
}

void oi__blocks_lock(oi_host *h, shard_set *set, host_block *const *blocks, size_t n) {
  uint32_t shard[OI_BATCH];
  for (size_t i = 0; i < n; i++) {
    shard[i] = (uint32_t)(oi__block_shard(h, blocks[i]) - h->shards);
    __builtin_prefetch(&h->shards[shard[i]].lock, 1);
  }
  oi__shard_set_lock(h, set, shard, n);
}

void oi__blocks_runs(oi_host *h, host_block *const *blocks, size_t n, bool all_ok,
                     oi_blocks_run_fn fn, void *ctx) {
  if (!all_ok || !oi__all_shards_for(h, n)) {
    for (size_t at = 0; at < n; at += OI_BATCH) {
      size_t k = OI_MIN((size_t)OI_BATCH, n - at);
      shard_set set;
      oi__blocks_lock(h, &set, blocks + at, k);
      fn(h, ctx, blocks, at, at + k);
      oi__shard_set_unlock(h, &set);
    }
    return;
  }
  for (size_t at = 0; at < n; at += OI_ALL_SHARDS_RUN) {
    size_t end = OI_MIN(n, at + OI_ALL_SHARDS_RUN);
    for (size_t i = at; i < OI_MIN(end, at + OI_RUN_PREFETCH); i++)
      __builtin_prefetch(blocks[i], 1);
    oi__shards_lock_all(h);
    fn(h, ctx, blocks, at, end);
    oi__shards_unlock_all(h);
  }
}

void oi__blocks_unpin(oi_host *h, host_block *const *blocks, size_t n) {
  pin_tally t = {0, 0, 0};
  for (size_t at = 0; at < n; at += OI_BATCH) {
    size_t k = OI_MIN((size_t)OI_BATCH, n - at);
    shard_set set;
    oi__blocks_lock(h, &set, blocks + at, k);
    for (size_t i = 0; i < k; i++) {
      host_block *b = blocks[at + i];
      oi__block_unpin_locked(oi__block_shard(h, b), b, &t);
    }
    oi__shard_set_unlock(h, &set);
  }
  oi__pin_tally_apply(h, &t);
}

void oi__lru_push_locked(index_shard *s, host_block *b) {
  int c = (int)oi__block_cls(s->host, b);
  b->lru_prev = OI_NIL;
  b->lru_next = s->lru_head[c];
  if (s->lru_head[c] != OI_NIL) oi__rec(s->host, s->lru_head[c])->lru_prev = b->id;
  s->lru_head[c] = b->id;
  if (s->lru_tail[c] == OI_NIL) s->lru_tail[c] = b->id;
}

void oi__lru_remove_locked(index_shard *s, host_block *b) {
  oi_host *h = s->host;
  int c = (int)oi__block_cls(s->host, b);
  if (b->lru_prev != OI_NIL)
    oi__rec(h, b->lru_prev)->lru_next = b->lru_next;
  else if (s->lru_head[c] == b->id)
    s->lru_head[c] = b->lru_next;
  else
    return; /* not on the list */
  if (b->lru_next != OI_NIL)
    oi__rec(h, b->lru_next)->lru_prev = b->lru_prev;
  else
    s->lru_tail[c] = b->lru_prev;
  b->lru_prev = b->lru_next = OI_NIL;
}

#define evictable oi__block_evictable

/* Walks at most this many records from the tail to find a block's place. */
#define LRU_ORDERED_WALK 64

void oi__lru_insert_ordered_locked(index_shard *s, host_block *b) {
  oi_host *h = s->host;
  int c = (int)oi__block_cls(s->host, b);
  uint32_t cur = s->lru_tail[c];
  for (int i = 0; cur != OI_NIL && oi__rec(h, cur)->last_used < b->last_used; i++) {
    if (i == LRU_ORDERED_WALK) return oi__lru_push_locked(s, b); /* far from the tail */
    cur = oi__rec(h, cur)->lru_prev;
  }
  if (cur == OI_NIL) return oi__lru_push_locked(s, b); /* the most recent */
  host_block *after = oi__rec(h, cur);                 /* b goes right behind it */
  b->lru_prev = cur;
  b->lru_next = after->lru_next;
  if (after->lru_next != OI_NIL)
    oi__rec(h, after->lru_next)->lru_prev = b->id;
  else
    s->lru_tail[c] = b->id;
  after->lru_next = b->id;
}

/* A pin leaves the block where it is on its LRU list: unlinking it would
 * touch two neighbour records at random addresses per hit (a query's largest
 * cost). Eviction unlinks the pinned blocks it meets at a list's tail, and
 * the unpin that makes a block evictable again moves it to the recent end. */
void oi__block_pin_locked(index_shard *s, host_block *b, pin_tally *t) {
  (void)s;
  t->pinned += !(b->pins || b->loading);
  t->leased += b->pins++ == 0;
}

void oi__block_unpin_locked(index_shard *s, host_block *b, pin_tally *t) {
  t->leased -= --b->pins == 0;
  t->pinned -= !(b->pins || b->loading);
  if (evictable(b)) {
    b->last_used = t->now ? t->now : (t->now = oi__now_ns());
    oi__lru_remove_locked(s, b); /* still listed where it was pinned */
    oi__lru_push_locked(s, b);
  }
}

void oi__pin_tally_apply(oi_host *h, const pin_tally *t) {
  /* One atomic per counter per batch, not per block (two's complement adds). */
  if (t->leased)
    atomic_fetch_add_explicit(&h->c.blocks_leased, (uint64_t)t->leased, memory_order_relaxed);
  if (t->pinned)
    atomic_fetch_add_explicit(&h->c.blocks_pinned, (uint64_t)t->pinned, memory_order_relaxed);
}

/* A block the pool evicts that the spilling tier does not hold, counted
 * under its fate (its shard lock held). */
static inline void note_lost(oi_host *h, const host_block *b) {
  if (!b->lower && b->spill_fate != OI_SPILL_NONE)
    atomic_fetch_add_explicit(&h->spill_lost[b->spill_fate], 1, memory_order_relaxed);
}

/* Whether a block waits for the spilling tier's write (eviction passes it
 * over while it can). */
static inline bool awaits_spill(const host_block *b) {
  return !b->lower && b->spill_fate == OI_SPILL_UNWRITTEN;
}

/* Records an eviction pass looks at from a list's tail for one it may take. */
#define EVICT_WALK 64

/* The oldest block of shard s's list c that a pass may take (`spare`: pass
 * over blocks awaiting their spill), looking at most EVICT_WALK records
 * from the tail. */
static host_block *tail_candidate(oi_host *h, index_shard *s, uint32_t c, bool spare) {
  uint32_t cur = s->lru_tail[c];
  for (int i = 0; cur != OI_NIL && i < EVICT_WALK; i++) {
    host_block *t = oi__rec(h, cur);
    if (!spare || !evictable(t) || !awaits_spill(t)) return t; /* held ones: the run unlists them */
    cur = t->lru_prev;
  }
  return NULL;
}

/* Evicts up to `want` of the least recently used evictable blocks of class
 * `cls` (any class when cls < 0). Each round finds the shard whose oldest
 * candidate is oldest and takes up to EVICT_RUN blocks from that tail under
 * one lock: approximately global LRU, without scanning every shard per
 * block. `spare`: blocks awaiting their spill are passed over. */
#define EVICT_RUN 16

static size_t evict_pass(oi_host *h, int cls, size_t want, host_block **out, bool spare) {
  uint32_t nclasses = atomic_load(&h->nclasses);
  size_t got = 0, unlisted = 0, nback = 0;
  host_block *back[EVICT_RUN]; /* slots of draining chunks: freed, not reused */
  int misses = 0;
  while (got < want && misses < 4) {
    index_shard *best = NULL;
    int best_cls = -1;
    uint64_t best_time = UINT64_MAX;
    for (uint32_t i = 0; i < h->nshards; i++) {
      index_shard *s = &h->shards[i];
      pthread_mutex_lock(&s->lock);
      for (uint32_t c = 0; c < nclasses; c++) {
        if (cls >= 0 && (int)c != cls) continue;
        if (s->lru_tail[c] == OI_NIL) continue;
        host_block *t = tail_candidate(h, s, c, spare);
        if (t && t->last_used < best_time) {
          best = s;
          best_cls = (int)c;
          best_time = t->last_used;
        }
      }
      pthread_mutex_unlock(&s->lock);
    }
    if (!best) break;
    size_t before = got, skipped = unlisted;
    pthread_mutex_lock(&best->lock);
    uint32_t cur = best->lru_tail[best_cls];
    for (int r = 0, walked = 0; r < EVICT_RUN && got < want && cur != OI_NIL; walked++) {
      host_block *t = oi__rec(h, cur);
      cur = t->lru_prev;
      if (!evictable(t)) { /* pinned or loading (a pin leaves it listed): its unpin relists it */
        oi__lru_remove_locked(best, t);
        unlisted++;
        continue;
      }
      if (spare && awaits_spill(t)) { /* left where it is */
        if (walked >= EVICT_WALK) break;
        continue;
      }
      oi__lru_remove_locked(best, t);
      r++;
      note_lost(h, t);
      oi__index_remove_locked(best, t);
      t->state = BLOCK_FREE;
      oi__ns_resident_add(h, t->ns, (uint64_t)-1);
      /* A slot of a chunk the rebalancer empties goes back to it, so a
       * busy class does not refill the chunk it gives away. */
      if (cls >= 0 &&
          atomic_load_explicit(&h->chunks[t->id >> h->slot_bits].draining, memory_order_relaxed))
        back[nback++] = t;
      else
        out[got++] = t;
    }
    pthread_mutex_unlock(&best->lock);
    if (nback) {
      atomic_fetch_sub(&h->c.blocks_sealed, nback);
      atomic_fetch_add(&h->c.evictions, nback);
      oi__tier_note_evicted(h, back, nback);
      oi__pool_free_batch(h, back, nback);
      unlisted += nback; /* progress: not a miss */
      nback = 0;
    }
    if (got == before && unlisted == skipped) misses++; /* raced with a pin: look again */
  }
  if (got) {
    atomic_fetch_sub(&h->c.blocks_sealed, got);
    atomic_fetch_add(&h->c.evictions, got);
    oi__tier_note_evicted(h, out, got); /* the records keep ns and hash until freed */
  }
  return got;
}

/* How long eviction waits for spills to end before it takes blocks the
 * spilling tier does not hold yet (each counted as a loss). */
#define SPILL_WAIT_NS (100ull * 1000000ull)

size_t oi__index_evict_batch(oi_host *h, int cls, size_t want, host_block **out) {
  return oi__index_evict_batch_spared(h, cls, want, out, false);
}

size_t oi__index_evict_batch_spared(oi_host *h, int cls, size_t want, host_block **out,
                                    bool spare_only) {
  if (!atomic_load_explicit(&h->spill_tier, memory_order_acquire))
    return evict_pass(h, cls, want, out, false);
  if (spare_only) return evict_pass(h, cls, want, out, true);
  /* Blocks the spilling tier holds first; then, for a bounded time, those
   * it writes meanwhile; then the rest. */
  size_t got = evict_pass(h, cls, want, out, true);
  uint64_t deadline = oi__now_ns() + SPILL_WAIT_NS;
  while (got < want && oi__now_ns() < deadline && oi__host_spill_wait_end(h, deadline))
    got += evict_pass(h, cls, want - got, out + got, true);
  if (got < want) got += evict_pass(h, cls, want - got, out + got, false);
  return got;
}

/* ---- what the rebalancer asks of the index (rebalance.c) ---- */

void oi__index_chunk_census(oi_host *h, const uint32_t *chunks, size_t n, chunk_census *out) {
  for (size_t k = 0; k < n; k++)
    out[k] = (chunk_census){0, 0, 0};
  for (uint32_t i = 0; i < h->nshards; i++) {
    index_shard *s = &h->shards[i];
    pthread_mutex_lock(&s->lock);
    for (uint32_t p = 0; p < s->nslots; p++) {
      uint64_t e = s->slots[p];
      if (e == OI_INDEX_EMPTY) continue;
      uint32_t ci = entry_id(e) >> h->slot_bits;
      for (size_t k = 0; k < n; k++) {
        if (chunks[k] != ci) continue;
        const host_block *b = oi__rec(h, entry_id(e)); /* indexed here: stable under the lock */
        out[k].indexed++;
        out[k].held += b->state == BLOCK_SEALED && oi__block_held(b);
        if (b->last_used > out[k].newest) out[k].newest = b->last_used;
        break;
      }
    }
    pthread_mutex_unlock(&s->lock);
  }
}

size_t oi__index_evict_chunk(oi_host *h, uint32_t ci, bool *held) {
  size_t total = 0;
  host_block *batch[OI_BATCH];
  for (uint32_t i = 0; i < h->nshards; i++) {
    index_shard *s = &h->shards[i];
    size_t got = 0;
    bool more = true;
    /* An eviction shifts the entries after it back: the walk starts over
     * after each batch, until a walk finds nothing more to take. */
    while (more) {
      more = false;
      pthread_mutex_lock(&s->lock);
      for (uint32_t p = 0; p < s->nslots && got < OI_BATCH; p++) {
        uint64_t e = s->slots[p];
        if (e == OI_INDEX_EMPTY || entry_id(e) >> h->slot_bits != ci) continue;
        host_block *b = oi__rec(h, entry_id(e));
        if (!evictable(b)) { /* in flight, pinned, leased, loading or spilling: untouched */
          if (b->state == BLOCK_SEALED && oi__block_held(b)) *held = true;
          continue;
        }
        oi__lru_remove_locked(s, b);
        note_lost(h, b);
        oi__index_remove_locked(s, b);
        b->state = BLOCK_FREE;
        oi__ns_resident_add(h, b->ns, (uint64_t)-1);
        batch[got++] = b;
        p--; /* the next entry may have shifted into this slot */
      }
      pthread_mutex_unlock(&s->lock);
      if (got) {
        atomic_fetch_sub(&h->c.blocks_sealed, got);
        atomic_fetch_add(&h->c.evictions, got);
        oi__tier_note_evicted(h, batch, got);
        oi__pool_free_batch(h, batch, got);
        total += got;
        more = got == OI_BATCH;
        got = 0;
      }
    }
  }
  return total;
}

void oi__index_oldest(oi_host *h, uint64_t *oldest) {
  uint32_t n = atomic_load(&h->nclasses);
  for (uint32_t c = 0; c < OI_MAX_SIZE_CLASSES; c++)
    oldest[c] = UINT64_MAX;
  for (uint32_t i = 0; i < h->nshards; i++) {
    index_shard *s = &h->shards[i];
    pthread_mutex_lock(&s->lock);
    for (uint32_t c = 0; c < n; c++)
      if (s->lru_tail[c] != OI_NIL) {
        uint64_t t = oi__rec(h, s->lru_tail[c])->last_used;
        if (t < oldest[c]) oldest[c] = t;
      }
    pthread_mutex_unlock(&s->lock);
  }
}

host_block *oi__index_evict_one(oi_host *h, int cls) {
  host_block *b = NULL;
  return oi__index_evict_batch(h, cls, 1, &b) ? b : NULL;
}
