/* The host tier's whole operations on blocks (host.h): reserve and end the
 * slots of a save, membership and prefix leases for a query, the loading
 * marks of a load, instance ids. Each takes the shard locks it needs, keeps
 * the LRU lists and pins right and updates the host's counters. */
#include <string.h>

#include "host_private.h"

uint32_t oi__host_instance_add(oi_offload_host *h) {
  uint32_t id = atomic_fetch_add(&h->next_instance, 1) + 1;
  atomic_fetch_add(&h->live_engines, 1);
  return id;
}

void oi__host_instance_remove(oi_offload_host *h, uint32_t instance) {
  oi__lease_drop_instance(h, instance);
  atomic_fetch_sub(&h->live_engines, 1);
}

uint8_t *oi__host_block_data(const oi_offload_host *h, const host_block *b) {
  return oi__block_data(h, b);
}

/* ---- saves ---- */

void oi__host_reserve(oi_offload_host *h, oi_host_ns ns, const oi_block_hash *hashes, size_t n,
                      const oi_host_reserve_sink *sink, oi_host_reserved *out) {
  /* Free slots for the whole call in one lock acquisition; eviction only
   * when the free list runs dry. (Without memory for the batch, slots come
   * one at a time.) */
  host_block **spare = oi__malloc(n * sizeof *spare);
  size_t nspare = spare ? oi__pool_alloc_batch(h, ns.cls, n, spare) : 0, used = 0;
  uint64_t dedup = 0, dropped = 0;
  size_t k = 0;
  oi__index_prefetch(h, ns.id, hashes, n);
  for (size_t i = 0; i < n; i++) {
    uint64_t key = oi__index_key(ns.id, &hashes[i]);
    index_shard *s = oi__index_shard_of(h, key);
    pthread_mutex_lock(&s->lock);
    host_block *b = oi__index_find_key_locked(s, key, ns.id, &hashes[i]);
    if (b) {
      bool in_flight = b->state == BLOCK_IN_FLIGHT;
      if (oi__block_evictable(b)) {
        oi__lru_remove_locked(s, b); /* a re-save is a use: move to the recent end */
        b->last_used = oi__now_ns();
        oi__lru_push_locked(s, b);
      }
      pthread_mutex_unlock(&s->lock);
      dedup++;
      if (in_flight && sink->in_flight) sink->in_flight(sink->ctx, i);
      continue;
    }
    if (spare && used == nspare && nspare < n) {
      /* The free list ran dry: evict for the rest of the call at once (no
       * shard lock may be held while evicting). */
      pthread_mutex_unlock(&s->lock);
      nspare += oi__index_evict_batch(h, (int)ns.cls, n - i, spare + nspare);
      pthread_mutex_lock(&s->lock);
      if (oi__index_find_locked(s, ns.id, &hashes[i])) { /* raced with another saver */
        pthread_mutex_unlock(&s->lock);
        dedup++;
        continue;
      }
    }
    host_block *nb = used < nspare ? spare[used++] : NULL;
    if (!nb) {
      pthread_mutex_unlock(&s->lock);
      nb = oi__pool_alloc(h, ns.cls); /* may evict: no shard lock held */
      if (!nb) {
        dropped++;
        continue;
      }
      pthread_mutex_lock(&s->lock);
      if (oi__index_find_locked(s, ns.id, &hashes[i])) { /* raced with another saver */
        pthread_mutex_unlock(&s->lock);
        oi__pool_free(h, nb);
        dedup++;
        continue;
      }
    }
    nb->hash = hashes[i];
    nb->ns = ns.id;
    nb->state = BLOCK_IN_FLIGHT;
    nb->spilling = nb->lower = 0;
    if (!oi__index_insert_locked(h, s, nb)) { /* the index could not grow */
      pthread_mutex_unlock(&s->lock);
      nb->state = BLOCK_FREE;
      oi__pool_free(h, nb);
      dropped++;
      continue;
    }
    pthread_mutex_unlock(&s->lock);
    k++;
    sink->accepted(sink->ctx, i, nb, oi__block_data(h, nb));
  }
  if (used < nspare) oi__pool_free_batch(h, spare + used, nspare - used);
  oi__free(spare);
  atomic_fetch_add(&h->c.blocks_in_flight, k);
  oi__ns_resident_add(h, ns.id, k);
  atomic_fetch_add(&h->c.saves_submitted, n);
  atomic_fetch_add(&h->c.saves_deduplicated, dedup);
  atomic_fetch_add(&h->c.saves_dropped, dropped);
  *out = (oi_host_reserved){.accepted = k, .deduplicated = dedup, .dropped = dropped};
}

void oi__host_save_end(oi_offload_host *h, oi_host_ns ns, host_block *const *blocks, size_t n,
                       bool ok, uint64_t bytes, uint64_t latency_ns) {
  if (n) oi__hist_record(&h->c.save_latency, latency_ns);
  uint64_t now = oi__now_ns();
  for (size_t i = 0; i < n; i++) {
    host_block *b = blocks[i];
    index_shard *s = oi__block_shard(h, b);
    pthread_mutex_lock(&s->lock);
    if (ok) {
      b->state = BLOCK_SEALED;
      b->last_used = now;
      if (oi__block_evictable(b)) oi__lru_push_locked(s, b);
      oi__lower_note_sealed_locked(h, b);
      oi__watch_note_sealed(h, b);
      pthread_mutex_unlock(&s->lock);
    } else {
      oi__index_remove_locked(s, b); /* never visible: nothing partial is served */
      pthread_mutex_unlock(&s->lock);
      oi__pool_free(h, b);
    }
  }
  if (!ok) oi__ns_resident_add(h, ns.id, (uint64_t)0 - n);
  atomic_fetch_sub(&h->c.blocks_in_flight, n);
  if (ok) {
    atomic_fetch_add(&h->c.blocks_sealed, n);
    atomic_fetch_add(&h->c.saves_completed, n);
    atomic_fetch_add(&h->c.bytes_saved, bytes);
  } else {
    atomic_fetch_add(&h->c.saves_failed, n);
  }
  oi__host_notify_sealed(h);
}

/* ---- queries ---- */

void oi__host_membership(oi_offload_host *h, oi_host_ns ns, const oi_block_hash *hashes, size_t n,
                         uint8_t *present, uint64_t *hits, uint64_t *pending) {
  uint64_t found = 0, in_flight = 0;
  for (size_t at = 0; at < n; at += OI_BATCH) {
    size_t k = OI_MIN((size_t)OI_BATCH, n - at);
    index_batch q;
    oi__index_batch_lock(h, &q, ns.id, hashes + at, k);
    for (size_t i = 0; i < k; i++) {
      host_block *b = q.found[i];
      bool hit = b && b->state == BLOCK_SEALED;
      in_flight += b && b->state == BLOCK_IN_FLIGHT;
      present[at + i] = hit;
      found += hit;
    }
    oi__index_batch_unlock(h, &q);
  }
  if (pending) *pending = in_flight;
  atomic_fetch_add(&h->c.query_hit_blocks, found);
  atomic_fetch_add(&h->c.query_miss_blocks, n - found);
  *hits = found;
}

/* Walks the longest sealed prefix of hashes[0..n) and, with `pending`, the
 * run of blocks in flight, or sealed, right after it: a block there that is
 * sealed now sealed after the walk saw the one before it in flight, and
 * sealed blocks behind one still in flight are not hits yet either. Both are
 * pending (the caller asks again), not misses: ending the run at a sealed
 * block would report 0 pending for a prefix whose next block just finished,
 * and its caller would stop waiting with blocks about to hit.
 *
 * A batch of shards at a time (the first hash alone: a miss costs one
 * lookup). With `pinned`, pins the prefix into pinned[] (tallied in *t). */
static void prefix_walk(oi_offload_host *h, uint32_t ns, const oi_block_hash *hashes, size_t n,
                        host_block **pinned, pin_tally *t, uint64_t *sealed, uint64_t *pending) {
  size_t found = 0, run = 0;
  bool in_run = false, done = false;
  for (size_t at = 0; at < n && !done;) {
    size_t k = OI_MIN(at == 0 ? (size_t)1 : (size_t)OI_BATCH, n - at), i = 0;
    index_batch q;
    oi__index_batch_lock(h, &q, ns, hashes + at, k);
    if (!in_run) {
      while (i < k && q.found[i] && q.found[i]->state == BLOCK_SEALED)
        i++;
      if (pinned) {
        /* The LRU neighbours a pin unlinks from, all at once. */
        for (size_t j = 0; j < i; j++) {
          host_block *b = q.found[j];
          if (!oi__block_evictable(b)) continue;
          if (b->lru_prev != OI_NIL) __builtin_prefetch(oi__rec(h, b->lru_prev), 1);
          if (b->lru_next != OI_NIL) __builtin_prefetch(oi__rec(h, b->lru_next), 1);
        }
        for (size_t j = 0; j < i; j++) {
          oi__block_pin_locked(oi__index_batch_shard(h, &q, j), q.found[j], t);
          pinned[found + j] = q.found[j];
        }
      }
      found += i;
      if (i < k) {
        in_run = true;
        done = !pending;
      }
    }
    for (; in_run && !done && i < k; i++) {
      host_block *b = q.found[i];
      if (b && (b->state == BLOCK_IN_FLIGHT || b->state == BLOCK_SEALED))
        run++;
      else
        done = true;
    }
    oi__index_batch_unlock(h, &q);
    at += k;
  }
  *sealed = found;
  if (pending) *pending = run;
}

void oi__host_prefix_probe(oi_offload_host *h, oi_host_ns ns, const oi_block_hash *hashes, size_t n,
                           uint64_t *sealed, uint64_t *pending) {
  prefix_walk(h, ns.id, hashes, n, NULL, NULL, sealed, pending);
}

oi_status oi__host_lease_prefix(oi_offload_host *h, oi_host_ns ns, uint32_t instance,
                                oi_host_principal principal, uint32_t shares,
                                const oi_block_hash *hashes, size_t n, uint64_t *hits,
                                uint64_t *pending, oi_lease *lease) {
  *hits = 0;
  if (pending) *pending = 0;
  if (n == 0) return OI_OK;
  host_block *stack[OI_BATCH], **pinned = n <= OI_BATCH ? stack : oi__malloc(n * sizeof *pinned);
  if (!pinned) return oi__fail(OI_ERR_OUT_OF_MEMORY, "query: out of memory");
  uint64_t found, run = 0;
  pin_tally tally = {0, 0};
  prefix_walk(h, ns.id, hashes, n, pinned, &tally, &found, pending ? &run : NULL);
  oi__pin_tally_apply(h, &tally);
  if (found > 0) {
    oi_status st = oi__lease_create(h, instance, ns.id, principal, shares, pinned, found, lease);
    if (st != OI_OK) {
      oi__blocks_unpin(h, pinned, found);
      if (pinned != stack) oi__free(pinned);
      return st;
    }
  }
  if (pinned != stack) oi__free(pinned);
  atomic_fetch_add(&h->c.query_hit_blocks, found);
  atomic_fetch_add(&h->c.query_miss_blocks, n - found);
  *hits = found;
  if (pending) *pending = run;
  return OI_OK;
}

oi_status oi__host_release(oi_offload_host *h, oi_host_ns ns, oi_host_principal principal,
                           oi_lease lease) {
  return oi__lease_release(h, ns.id, principal, lease);
}

/* ---- loads ---- */

oi_status oi__host_load_begin(oi_offload_host *h, oi_host_ns ns, oi_host_principal principal,
                              oi_lease lease, size_t n, host_block **out) {
  oi_status st = oi__lease_consume(h, ns.id, principal, lease, n, out);
  if (st == OI_OK)
    atomic_fetch_add(&h->c.loads_submitted, 1);
  else if (st == OI_ERR_LEASE_EXPIRED || st == OI_ERR_PERMISSION)
    atomic_fetch_add(&h->c.loads_failed, 1);
  return st;
}

void oi__host_load_end(oi_offload_host *h, host_block *const *blocks, size_t n, bool ok,
                       uint64_t bytes, uint64_t latency_ns) {
  if (n) oi__hist_record(&h->c.load_latency, latency_ns);
  uint64_t now = oi__now_ns(), unloaded = 0;
  for (size_t at = 0; at < n; at += OI_BATCH) { /* each shard locked once per batch */
    size_t k = OI_MIN((size_t)OI_BATCH, n - at);
    shard_set set;
    oi__blocks_lock(h, &set, blocks + at, k);
    for (size_t i = at; i < at + k; i++) {
      host_block *b = blocks[i];
      oi__block_pinned_update(h, true, b->pins || b->loading > 1);
      if (--b->loading == 0) {
        unloaded++;
        if (oi__block_evictable(b)) {
          b->last_used = now;
          oi__lru_push_locked(oi__block_shard(h, b), b);
        }
      }
    }
    oi__shard_set_unlock(h, &set);
  }
  if (unloaded) atomic_fetch_sub(&h->c.blocks_loading, unloaded);
  if (ok) {
    atomic_fetch_add(&h->c.loads_completed, 1);
    atomic_fetch_add(&h->c.blocks_loaded, n);
    atomic_fetch_add(&h->c.bytes_loaded, bytes);
  } else {
    atomic_fetch_add(&h->c.loads_failed, 1);
  }
}
