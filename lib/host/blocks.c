/* The host tier's whole operations on blocks (host.h): reserve and end the
 * slots of a save, membership and prefix leases for a query, the loading
 * marks of a load, instance ids. Each takes the shard locks it needs, keeps
 * the LRU lists and pins right and updates the host's counters. */
#include <string.h>
#include <unistd.h>

#include "core/fault.h"
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
      uint64_t gap_ms = 0;
      if (OI_FAULT(OI_FAULT_RESERVE_GAP, &gap_ms)) usleep((useconds_t)(gap_ms * 1000));
      nspare += oi__index_evict_batch(h, (int)ns.cls, n - i, spare + nspare);
      pthread_mutex_lock(&s->lock);
      if ((b = oi__index_find_locked(s, ns.id, &hashes[i]))) { /* raced with another saver */
        bool in_flight = b->state == BLOCK_IN_FLIGHT;
        pthread_mutex_unlock(&s->lock);
        dedup++;
        if (in_flight && sink->in_flight) sink->in_flight(sink->ctx, i);
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
      if ((b = oi__index_find_locked(s, ns.id, &hashes[i]))) { /* raced with another saver */
        bool in_flight = b->state == BLOCK_IN_FLIGHT;
        pthread_mutex_unlock(&s->lock);
        oi__pool_free(h, nb);
        dedup++;
        if (in_flight && sink->in_flight) sink->in_flight(sink->ctx, i);
        continue;
      }
    }
    nb->hash = hashes[i];
    nb->ns = ns.id;
    nb->state = BLOCK_IN_FLIGHT;
    nb->spilling = nb->lower = 0;
    oi__index_insert_locked(h, s, nb);
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
    index_shard *s = &h->shards[b->shard];
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
  oi__index_prefetch(h, ns.id, hashes, n);
  for (size_t i = 0; i < n; i++) {
    uint64_t key = oi__index_key(ns.id, &hashes[i]);
    index_shard *s = oi__index_shard_of(h, key);
    pthread_mutex_lock(&s->lock);
    host_block *b = oi__index_find_key_locked(s, key, ns.id, &hashes[i]);
    bool hit = b && b->state == BLOCK_SEALED;
    in_flight += b && b->state == BLOCK_IN_FLIGHT;
    pthread_mutex_unlock(&s->lock);
    present[i] = hit;
    found += hit;
  }
  if (pending) *pending = in_flight;
  atomic_fetch_add(&h->c.query_hit_blocks, found);
  atomic_fetch_add(&h->c.query_miss_blocks, n - found);
  *hits = found;
}

/* The run of blocks in flight, or sealed, in hashes[from..n), where `from`
 * is where a walk of the sealed prefix stopped: a block there that is
 * sealed now sealed after that walk saw it in flight, and sealed blocks
 * behind one still in flight are not hits yet either. Both are pending (the
 * caller asks again), not misses: ending the run at a sealed block would
 * report 0 pending for a prefix whose next block just finished, and its
 * caller would stop waiting with blocks about to hit. */
static uint64_t in_flight_run(oi_offload_host *h, oi_host_ns ns, const oi_block_hash *hashes,
                              size_t from, size_t n) {
  uint64_t run = 0;
  for (size_t i = from; i < n; i++, run++) {
    uint64_t key = oi__index_key(ns.id, &hashes[i]);
    index_shard *s = oi__index_shard_of(h, key);
    pthread_mutex_lock(&s->lock);
    host_block *b = oi__index_find_key_locked(s, key, ns.id, &hashes[i]);
    bool in_flight = b && (b->state == BLOCK_IN_FLIGHT || b->state == BLOCK_SEALED);
    pthread_mutex_unlock(&s->lock);
    if (!in_flight) break;
  }
  return run;
}

void oi__host_prefix_probe(oi_offload_host *h, oi_host_ns ns, const oi_block_hash *hashes, size_t n,
                           uint64_t *sealed, uint64_t *pending) {
  size_t found = 0;
  for (; found < n; found++) {
    uint64_t key = oi__index_key(ns.id, &hashes[found]);
    index_shard *s = oi__index_shard_of(h, key);
    pthread_mutex_lock(&s->lock);
    host_block *b = oi__index_find_key_locked(s, key, ns.id, &hashes[found]);
    bool hit = b && b->state == BLOCK_SEALED;
    pthread_mutex_unlock(&s->lock);
    if (!hit) break;
  }
  *sealed = found;
  *pending = in_flight_run(h, ns, hashes, found, n);
}

oi_status oi__host_lease_prefix(oi_offload_host *h, oi_host_ns ns, uint32_t instance,
                                oi_host_principal principal, uint32_t shares,
                                const oi_block_hash *hashes, size_t n, uint64_t *hits,
                                uint64_t *pending, oi_lease *lease) {
  *hits = 0;
  if (pending) *pending = 0;
  if (n == 0) return OI_OK;
  host_block *stack[64], **pinned = n <= 64 ? stack : oi__malloc(n * sizeof *pinned);
  if (!pinned) return oi__fail(OI_ERR_OUT_OF_MEMORY, "query: out of memory");
  oi__index_prefetch(h, ns.id, hashes, n);
  size_t found = 0;
  pin_tally tally = {0, 0};
  for (; found < n; found++) {
    uint64_t key = oi__index_key(ns.id, &hashes[found]);
    index_shard *s = oi__index_shard_of(h, key);
    pthread_mutex_lock(&s->lock);
    host_block *b = oi__index_find_key_locked(s, key, ns.id, &hashes[found]);
    bool hit = b && b->state == BLOCK_SEALED;
    if (hit) oi__block_pin_locked(s, b, &tally);
    pthread_mutex_unlock(&s->lock);
    if (!hit) break;
    pinned[found] = b;
  }
  oi__pin_tally_apply(h, &tally);
  if (found > 0) {
    oi_status st = oi__lease_create(h, instance, ns.id, principal, shares, pinned, found, lease);
    if (st != OI_OK) {
      pin_tally undo = {0, 0};
      for (size_t i = 0; i < found; i++) {
        index_shard *s = &h->shards[pinned[i]->shard];
        pthread_mutex_lock(&s->lock);
        oi__block_unpin_locked(s, pinned[i], &undo);
        pthread_mutex_unlock(&s->lock);
      }
      oi__pin_tally_apply(h, &undo);
      if (pinned != stack) oi__free(pinned);
      return st;
    }
  }
  if (pinned != stack) oi__free(pinned);
  atomic_fetch_add(&h->c.query_hit_blocks, found);
  atomic_fetch_add(&h->c.query_miss_blocks, n - found);
  *hits = found;
  if (pending) *pending = in_flight_run(h, ns, hashes, found, n);
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
  for (size_t i = 0; i < n; i++) {
    host_block *b = blocks[i];
    index_shard *s = &h->shards[b->shard];
    pthread_mutex_lock(&s->lock);
    oi__block_pinned_update(h, true, b->pins || b->loading > 1);
    if (--b->loading == 0) {
      atomic_fetch_sub(&h->c.blocks_loading, 1);
      if (oi__block_evictable(b)) {
        b->last_used = oi__now_ns();
        oi__lru_push_locked(s, b);
      }
    }
    pthread_mutex_unlock(&s->lock);
  }
  if (ok) {
    atomic_fetch_add(&h->c.loads_completed, 1);
    atomic_fetch_add(&h->c.blocks_loaded, n);
    atomic_fetch_add(&h->c.bytes_loaded, bytes);
  } else {
    atomic_fetch_add(&h->c.loads_failed, 1);
  }
}
