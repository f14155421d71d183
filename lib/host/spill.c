/* The spill queue: what the tier that takes spills (tier.h, OI_TIER_SPILLS)
 * is fed: the sealed blocks it has not copied yet, and the holds that keep
 * a block's bytes stable while it copies them.
 *
 * The queue is a ring of (record id, namespace, hash), oldest seal first,
 * filled as blocks seal. A queued block may be evicted, or its slot reused,
 * before the tier takes it: oi__host_spill_take checks each entry against
 * the index and skips the stale ones. A held block is off the LRU list
 * (spilling); its hold ends with oi__host_spill_end, which puts it back at
 * its place in LRU order. The ring is bounded: when it is full the block
 * that seals is not queued (counted in spill_overflow, and marked: its pool
 * copy stays its only one, and its eviction is counted as a loss).
 *
 * No silent loss: every block queued carries its fate (OI_SPILL_UNWRITTEN,
 * then a failed write's cause, or `lower` once the tier holds it); the pool
 * evicting one the tier does not hold counts it under its fate
 * (oi__index_note_lost), and eviction passes such blocks over while others
 * are there, waiting a bounded time for their spill (index.c). */
#include <string.h>

#include "host_private.h"

#define SPILL_RING_MIN 4096
#define SPILL_RING_MAX (1u << 22) /* 4M entries, 96 MiB */

void oi__spill_init(oi_host *h) {
  pthread_mutex_init(&h->spill_lock, NULL);
  oi__cond_init_monotonic(&h->spill_cv);
  oi__cond_init_monotonic(&h->spill_end_cv);
}

void oi__spill_fini(oi_host *h) {
  pthread_mutex_lock(&h->spill_lock);
  oi__free(h->spill_ring);
  h->spill_ring = NULL;
  h->spill_cap = h->spill_count = h->spill_head = h->spill_taken = 0;
  pthread_mutex_unlock(&h->spill_lock);
  pthread_cond_destroy(&h->spill_cv);
  pthread_cond_destroy(&h->spill_end_cv);
  pthread_mutex_destroy(&h->spill_lock);
}

/* Lock order: shard -> spill_lock (called with the blocks' shard locks). */
void oi__spill_note_sealed_locked(oi_host *h, host_block *const *blocks, size_t n) {
  /* Without a spilling tier (attached once, before its blocks matter), no lock. */
  if (!atomic_load_explicit(&h->spill_tier, memory_order_acquire)) return;
  pthread_mutex_lock(&h->spill_lock);
  if (!atomic_load_explicit(&h->spill_tier, memory_order_relaxed)) { /* destroyed since */
    pthread_mutex_unlock(&h->spill_lock);
    return;
  }
  for (size_t i = 0; i < n; i++) {
    host_block *b = blocks[i];
    if (b->lower) continue;
    if (h->spill_count == h->spill_cap) {
      size_t cap = h->spill_cap ? h->spill_cap * 2 : SPILL_RING_MIN;
      spill_entry *r = cap <= SPILL_RING_MAX ? oi__malloc(cap * sizeof *r) : NULL;
      if (r) { /* unwrap the ring into the new array */
        for (size_t j = 0; j < h->spill_count; j++)
          r[j] = h->spill_ring[(h->spill_head + j) % h->spill_cap];
        oi__free(h->spill_ring);
        h->spill_ring = r;
        h->spill_cap = cap;
        h->spill_head = 0;
      }
    }
    if (h->spill_count < h->spill_cap) {
      h->spill_ring[(h->spill_head + h->spill_count) % h->spill_cap] =
          (spill_entry){.id = b->id, .ns = b->ns, .hash = b->hash};
      b->spill_fate = OI_SPILL_UNWRITTEN; /* (its shard lock is held) */
      if (h->spill_count++ == 0) pthread_cond_signal(&h->spill_cv);
    } else { /* full: this block is not queued */
      b->spill_fate = OI_SPILL_QUEUE_FULL;
      atomic_fetch_add(&h->spill_overflow, 1);
    }
  }
  pthread_mutex_unlock(&h->spill_lock);
}

static uint64_t ns_block_bytes(oi_host *h, uint32_t ns) {
  pthread_mutex_lock(&h->ns_lock);
  uint64_t bytes = ns >= 1 && ns <= h->nns ? h->ns[ns - 1].block_bytes : 0;
  pthread_mutex_unlock(&h->ns_lock);
  return bytes;
}

size_t oi__host_spill_take(oi_host *h, oi_host_spill *out, size_t max, uint32_t timeout_ms) {
  spill_entry batch[64];
  size_t got = 0;
  uint64_t deadline = oi__deadline_ns(timeout_ms);
  while (got == 0) {
    pthread_mutex_lock(&h->spill_lock);
    if (h->spill_count == 0 && timeout_ms) {
      struct timespec ts = oi__timespec(deadline);
      pthread_cond_timedwait(&h->spill_cv, &h->spill_lock, &ts);
    }
    size_t k = OI_MIN(OI_MIN(max, OI_ARRAY_LEN(batch)), h->spill_count);
    for (size_t i = 0; i < k; i++)
      batch[i] = h->spill_ring[(h->spill_head + i) % h->spill_cap];
    if (k) {
      h->spill_head = (h->spill_head + k) % h->spill_cap;
      h->spill_count -= k;
      h->spill_taken += k; /* in the backlog until skipped below or ended */
    }
    pthread_mutex_unlock(&h->spill_lock);
    size_t skipped = 0;
    if (k == 0) return 0; /* nothing queued within timeout_ms (or woken to stop) */
    for (size_t i = 0; i < k; i++) {
      spill_entry *q = &batch[i];
      uint64_t key = oi__index_key(q->ns, &q->hash);
      index_shard *s = oi__index_shard_of(h, key);
      pthread_mutex_lock(&s->lock);
      host_block *b = oi__index_find_key_locked(s, key, q->ns, &q->hash);
      bool take = b && b->id == q->id && b->state == BLOCK_SEALED && !b->lower && !b->spilling;
      if (take) {
        oi__lru_remove_locked(s, b); /* listed if evictable, or pinned where it was */
        b->spilling = 1;
      }
      pthread_mutex_unlock(&s->lock);
      if (!take) { /* evicted, reused, or held by the spilling tier already */
        skipped++;
        continue;
      }
      out[got++] = (oi_host_spill){.block = b,
                                   .ns = q->ns,
                                   .hash = q->hash,
                                   .data = oi__block_data(h, b),
                                   .bytes = ns_block_bytes(h, q->ns)};
    }
    if (skipped) {
      pthread_mutex_lock(&h->spill_lock);
      h->spill_taken -= skipped;
      pthread_mutex_unlock(&h->spill_lock);
    }
    /* A batch of stale entries only: look at the next (past the deadline
     * too: 0 must mean the queue is empty, or a drain stops early). */
  }
  return got;
}

static void spill_end_one(oi_host *h, const oi_host_spill *sp, bool ok, oi_spill_fate why) {
  host_block *b = sp->block;
  index_shard *s = oi__block_shard(h, b);
  pthread_mutex_lock(&s->lock);
  b->spilling = 0;
  if (ok)
    b->lower = 1;
  else
    b->spill_fate = why;
  if (oi__block_evictable(b)) oi__lru_insert_ordered_locked(s, b);
  pthread_mutex_unlock(&s->lock);
}

static void spill_ended(oi_host *h, size_t n) {
  pthread_mutex_lock(&h->spill_lock);
  h->spill_taken -= n;
  pthread_cond_broadcast(&h->spill_end_cv);
  pthread_mutex_unlock(&h->spill_lock);
}

void oi__host_spill_end(oi_host *h, const oi_host_spill *spills, size_t n, const bool *ok) {
  for (size_t i = 0; i < n; i++)
    spill_end_one(h, &spills[i], ok[i], OI_SPILL_UNWRITTEN);
  spill_ended(h, n);
}

void oi__host_spill_end_unwritten(oi_host *h, const oi_host_spill *spill, oi_spill_fate why) {
  spill_end_one(h, spill, false, why);
  spill_ended(h, 1);
}

void oi__host_spill_lost(const oi_host *h, uint64_t lost[OI_SPILL_FATES]) {
  for (int i = 0; i < OI_SPILL_FATES; i++)
    lost[i] = atomic_load(&((oi_host *)h)->spill_lost[i]);
}

bool oi__host_spill_wait_end(oi_host *h, uint64_t deadline_ns) {
  pthread_mutex_lock(&h->spill_lock);
  bool pending = h->spill_count + h->spill_taken > 0;
  if (pending) {
    struct timespec ts = oi__timespec(OI_MIN(deadline_ns, oi__now_ns() + 2000000ull));
    pthread_cond_timedwait(&h->spill_end_cv, &h->spill_lock, &ts);
  }
  pthread_mutex_unlock(&h->spill_lock);
  return pending;
}

size_t oi__host_spill_backlog(oi_host *h) {
  pthread_mutex_lock(&h->spill_lock);
  size_t n = h->spill_count + h->spill_taken;
  pthread_mutex_unlock(&h->spill_lock);
  return n;
}

void oi__host_spill_wake(oi_host *h) {
  pthread_mutex_lock(&h->spill_lock);
  pthread_cond_broadcast(&h->spill_cv);
  pthread_mutex_unlock(&h->spill_lock);
}

uint64_t oi__host_spill_overflow(const oi_host *h) {
  return atomic_load(&((oi_host *)h)->spill_overflow);
}

void oi__host_sector_slots(oi_host *h) {
  pthread_mutex_lock(&h->class_lock);
  h->sector_slots = true;
  pthread_mutex_unlock(&h->class_lock);
}

uint64_t oi__host_slot_bytes(oi_host *h, uint32_t ns_id) {
  pthread_mutex_lock(&h->ns_lock);
  uint32_t cls = ns_id >= 1 && ns_id <= h->nns ? h->ns[ns_id - 1].cls : UINT32_MAX;
  pthread_mutex_unlock(&h->ns_lock);
  return cls < atomic_load(&h->nclasses) ? h->classes[cls].slot_bytes : 0;
}
