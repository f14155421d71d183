/* The host tier's whole operations on blocks (host.h): reserve and end the
 * slots of a save, membership and prefix leases for a query, the loading
 * marks of a load, instance ids. Each takes the shard locks it needs, keeps
 * the LRU lists and pins right and updates the host's counters. */
#include <string.h>
#include <unistd.h>

#include "core/fault.h"
#include "host_private.h"

uint32_t oi__host_instance_add(oi_host *h) {
  uint32_t id = atomic_fetch_add(&h->next_instance, 1) + 1;
  atomic_fetch_add(&h->live_engines, 1);
  return id;
}

void oi__host_instance_remove(oi_host *h, uint32_t instance) {
  oi__lease_drop_instance(h, instance);
  atomic_fetch_sub(&h->live_engines, 1);
}

uint8_t *oi__host_block_data(const oi_host *h, const host_block *b) { return oi__block_data(h, b); }

/* ---- saves ---- */

typedef struct reserve_tally {
  size_t accepted;
  uint64_t dedup, dropped;
} reserve_tally;

/* The outcomes of reserved batches, for the sink once no shard lock is held
 * (a run of OI_ALL_SHARDS_RUN hashes at most). */
typedef struct reserve_out {
  size_t nacc, nfl, nunused;
  size_t acc_idx[OI_ALL_SHARDS_RUN];
  host_block *made[OI_ALL_SHARDS_RUN];
  uint8_t *data[OI_ALL_SHARDS_RUN];
  size_t fl_idx[OI_ALL_SHARDS_RUN]; /* found in flight */
  host_block *unused[OI_ALL_SHARDS_RUN];
} reserve_out;

/* Reserves hashes[idx[0..m)] (m <= OI_BATCH) with the slots
 * spare[*used..nspare): under one lock per shard, or (all_locked) under
 * every shard's lock, held by the caller. The hashes left without a slot go
 * to rest[*nrest...]; the outcomes to o, for reserve_report. */
static void reserve_batch(oi_host *h, oi_host_ns ns, const oi_block_hash *hashes, const size_t *idx,
                          size_t m, host_block **spare, size_t nspare, size_t *used,
                          bool all_locked, reserve_tally *t, size_t *rest, size_t *nrest,
                          reserve_out *o) {
  oi_block_hash copy[OI_BATCH];
  const oi_block_hash *hh = hashes + idx[0];
  uint64_t now = 0, inserted[8] = {0}; /* a filter of the keys this batch inserted */
  if (m == 0) return;
  for (size_t j = *used; j < nspare && j < *used + m; j++) /* the records this batch fills */
    oi__rec_prefetch(spare[j]);
  if (idx[m - 1] - idx[0] != m - 1) { /* not a contiguous run of hashes */
    for (size_t j = 0; j < m; j++)
      copy[j] = hashes[idx[j]];
    hh = copy;
  }
  index_batch q;
  if (all_locked)
    oi__index_batch_find_all_locked(h, &q, ns.id, hh, m);
  else
    oi__index_batch_lock(h, &q, ns.id, hh, m);
  for (size_t j = 0; j < m; j++) {
    index_shard *s = oi__index_batch_shard(h, &q, j);
    host_block *b = q.found[j];
    /* The same hash twice in one call: the first one's slot. */
    uint32_t bit = (uint32_t)(q.key[j] >> 20) & 511;
    if (!b && (inserted[bit / 64] >> (bit % 64) & 1))
      b = oi__index_find_key_locked(s, q.key[j], ns.id, &hh[j]);
    if (b) {
      if (oi__block_evictable(b)) {
        oi__lru_remove_locked(s, b); /* a re-save is a use: move to the recent end */
        b->last_used = now ? now : (now = oi__now_ns());
        oi__lru_push_locked(s, b);
      }
      t->dedup++;
      if (b->state == BLOCK_IN_FLIGHT) o->fl_idx[o->nfl++] = idx[j];
      continue;
    }
    if (*used == nspare) {
      rest[(*nrest)++] = idx[j];
      continue;
    }
    host_block *nb = spare[(*used)++];
    nb->hash = hh[j];
    nb->ns = ns.id;
    nb->state = BLOCK_IN_FLIGHT;
    nb->spilling = nb->lower = 0;
    nb->spill_fate = OI_SPILL_NONE;
    if (!oi__index_insert_locked(h, s, nb, q.key[j])) { /* the index could not grow */
      nb->state = BLOCK_FREE;
      o->unused[o->nunused++] = nb;
      t->dropped++;
      continue;
    }
    inserted[bit / 64] |= 1ull << (bit % 64);
    o->acc_idx[o->nacc] = idx[j];
    o->made[o->nacc++] = nb;
    t->accepted++;
  }
  if (!all_locked) oi__index_batch_unlock(h, &q);
}

/* Tells the sink what reserve_batch found (no shard lock held), OI_BATCH
 * blocks at a time, and empties o. */
static void reserve_report(oi_host *h, const oi_host_reserve_sink *sink, reserve_out *o) {
  if (o->nunused) oi__pool_free_batch(h, o->unused, o->nunused);
  for (size_t j = 0; j < o->nacc; j++)
    o->data[j] = oi__block_data(h, o->made[j]);
  for (size_t at = 0; at < o->nacc; at += OI_BATCH)
    sink->accepted(sink->ctx, o->acc_idx + at, o->made + at, o->data + at,
                   OI_MIN((size_t)OI_BATCH, o->nacc - at));
  if (sink->in_flight)
    for (size_t j = 0; j < o->nfl; j++)
      sink->in_flight(sink->ctx, o->fl_idx[j]);
  o->nacc = o->nfl = o->nunused = 0;
}

/* One hash the batches found no slot for: a slot from the pool (which may
 * evict one block; no shard lock held), then the index. */
static void reserve_one(oi_host *h, oi_host_ns ns, const oi_block_hash *hashes, size_t i,
                        const oi_host_reserve_sink *sink, reserve_tally *t) {
  host_block *nb = oi__pool_alloc(h, ns.cls);
  if (!nb) {
    t->dropped++;
    return;
  }
  uint64_t key = oi__index_key(ns.id, &hashes[i]);
  index_shard *s = oi__index_shard_of(h, key);
  pthread_mutex_lock(&s->lock);
  host_block *b = oi__index_find_key_locked(s, key, ns.id, &hashes[i]);
  if (b) { /* raced with another saver: its copy may still be in flight (a flush waits) */
    bool in_flight = b->state == BLOCK_IN_FLIGHT;
    pthread_mutex_unlock(&s->lock);
    oi__pool_free(h, nb);
    t->dedup++;
    if (in_flight && sink->in_flight) sink->in_flight(sink->ctx, i);
    return;
  }
  nb->hash = hashes[i];
  nb->ns = ns.id;
  nb->state = BLOCK_IN_FLIGHT;
  nb->spilling = nb->lower = 0;
  nb->spill_fate = OI_SPILL_NONE;
  if (!oi__index_insert_locked(h, s, nb, key)) {
    pthread_mutex_unlock(&s->lock);
    nb->state = BLOCK_FREE;
    oi__pool_free(h, nb);
    t->dropped++;
    return;
  }
  pthread_mutex_unlock(&s->lock);
  t->accepted++;
  uint8_t *data = oi__block_data(h, nb);
  sink->accepted(sink->ctx, &i, &nb, &data, 1);
}

void oi__host_reserve(oi_host *h, oi_host_ns ns, const oi_block_hash *hashes, size_t n,
                      const oi_host_reserve_sink *sink, oi_host_reserved *out) {
  reserve_tally t = {0, 0, 0};
  reserve_out o;
  o.nacc = o.nfl = o.nunused = 0;
  /* A run of hashes at a time: their free slots taken under one size class
   * lock, their index entries made under one lock per shard (OI_BATCH hashes
   * a run) or, when oi__all_shards_for the call, under every shard's lock
   * taken once per run of OI_ALL_SHARDS_RUN (as oi__blocks_runs). Eviction
   * only when the free list runs dry, for the run's remaining hashes at
   * once, with no shard lock held. Nothing is allocated. */
  bool all = oi__all_shards_for(h, n);
  size_t run = all ? OI_ALL_SHARDS_RUN : OI_BATCH;
  for (size_t at = 0; at < n; at += run) {
    size_t m = OI_MIN(run, n - at);
    host_block *spare[OI_ALL_SHARDS_RUN];
    size_t idx[OI_ALL_SHARDS_RUN], rest[OI_ALL_SHARDS_RUN], nrest = 0, used = 0;
    for (size_t j = 0; j < m; j++)
      idx[j] = at + j;
    size_t nspare = oi__pool_alloc_batch(h, ns.cls, m, spare);
    if (all) oi__shards_lock_all(h);
    for (size_t b = 0; b < m; b += OI_BATCH)
      reserve_batch(h, ns, hashes, idx + b, OI_MIN((size_t)OI_BATCH, m - b), spare, nspare, &used,
                    all, &t, rest, &nrest, &o);
    if (all) oi__shards_unlock_all(h);
    reserve_report(h, sink, &o);
    if (nrest) { /* the free list ran dry */
      size_t nidx = nrest, nleft = 0;
      memcpy(idx, rest, nrest * sizeof *idx);
      /* Unused slots go back first: what remains to evict is for the rest. */
      if (used < nspare) oi__pool_free_batch(h, spare + used, nspare - used);
      used = 0;
      uint64_t gap_ms = 0; /* (tests: another saver may insert these hashes meanwhile) */
      if (OI_FAULT(OI_FAULT_RESERVE_GAP, &gap_ms)) usleep((useconds_t)(gap_ms * 1000));
      nspare = oi__index_evict_batch(h, (int)ns.cls, nidx, spare);
      for (size_t b = 0; b < nidx; b += OI_BATCH) {
        reserve_batch(h, ns, hashes, idx + b, OI_MIN((size_t)OI_BATCH, nidx - b), spare, nspare,
                      &used, false, &t, rest, &nleft, &o);
        reserve_report(h, sink, &o);
      }
      for (size_t j = 0; j < nleft; j++)
        reserve_one(h, ns, hashes, rest[j], sink, &t);
    }
    if (used < nspare) oi__pool_free_batch(h, spare + used, nspare - used);
  }
  atomic_fetch_add(&h->c.blocks_in_flight, t.accepted);
  oi__ns_resident_add(h, ns.id, t.accepted);
  if (!sink->promotion) { /* a tier's promotion is no save */
    atomic_fetch_add(&h->c.saves_submitted, n);
    atomic_fetch_add(&h->c.saves_deduplicated, t.dedup);
    atomic_fetch_add(&h->c.saves_dropped, t.dropped);
  }
  *out = (oi_host_reserved){.accepted = t.accepted, .deduplicated = t.dedup, .dropped = t.dropped};
}

/* Seals (ok) or unindexes blocks[from..to), their shards locked. */
typedef struct save_end_ctx {
  bool ok;
  uint64_t now;
} save_end_ctx;

static void save_end_some(oi_host *h, void *ctx, host_block *const *blocks, size_t from,
                          size_t to) {
  save_end_ctx *c = ctx;
  for (size_t i = from; i < to; i++) {
    if (i + OI_RUN_PREFETCH < to) __builtin_prefetch(blocks[i + OI_RUN_PREFETCH], 1);
    host_block *b = blocks[i];
    index_shard *s = oi__block_shard(h, b);
    if (c->ok) {
      b->state = BLOCK_SEALED;
      b->last_used = c->now;
      if (oi__block_evictable(b)) oi__lru_push_locked(s, b);
    } else {
      oi__index_remove_locked(s, b); /* never visible: nothing partial is served */
    }
  }
  if (c->ok) { /* told under the shard locks, as each block seals */
    oi__spill_note_sealed_locked(h, blocks + from, to - from);
    oi__tier_note_sealed(h, blocks + from, to - from);
  }
}

static void slots_end(oi_host *h, oi_host_ns ns, host_block *const *blocks, size_t n, bool ok,
                      bool save, uint64_t bytes, uint64_t latency_ns) {
  if (n && save) oi__hist_record(&h->c.save_latency, latency_ns);
  save_end_ctx c = {.ok = ok, .now = oi__now_ns()};
  /* Every shard at once only while sealing takes no other lock (the spill
   * queue's, the tiers' notify lock). */
  bool all_ok = !atomic_load_explicit(&h->spill_tier, memory_order_acquire) &&
                !atomic_load_explicit(&h->notifying, memory_order_relaxed);
  /* Counted sealed before any block is: once sealed, one may be evicted
   * (and counted out) before this call ends. */
  if (ok) atomic_fetch_add(&h->c.blocks_sealed, n);
  oi__blocks_runs(h, blocks, n, all_ok, save_end_some, &c);
  if (!ok) {
    oi__pool_free_batch(h, (host_block **)blocks, n);
    oi__ns_resident_add(h, ns.id, (uint64_t)0 - n);
  }
  atomic_fetch_sub(&h->c.blocks_in_flight, n);
  if (save && ok) {
    atomic_fetch_add(&h->c.saves_completed, n);
    atomic_fetch_add(&h->c.bytes_saved, bytes);
  } else if (save) {
    atomic_fetch_add(&h->c.saves_failed, n);
  }
  oi__host_notify_sealed(h);
}

void oi__host_save_end(oi_host *h, oi_host_ns ns, host_block *const *blocks, size_t n, bool ok,
                       uint64_t bytes, uint64_t latency_ns) {
  slots_end(h, ns, blocks, n, ok, true, bytes, latency_ns);
}

void oi__host_promote_end(oi_host *h, oi_host_ns ns, host_block *const *blocks, size_t n, bool ok) {
  slots_end(h, ns, blocks, n, ok, false, 0, 0);
}

/* ---- queries ---- */

void oi__host_membership(oi_host *h, oi_host_ns ns, const oi_block_hash *hashes, size_t n,
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
static void prefix_walk(oi_host *h, uint32_t ns, const oi_block_hash *hashes, size_t n,
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
      if (pinned) { /* a pin leaves the block on its LRU list: no neighbour is touched */
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

void oi__host_prefix_probe(oi_host *h, oi_host_ns ns, const oi_block_hash *hashes, size_t n,
                           uint64_t *sealed, uint64_t *pending) {
  prefix_walk(h, ns.id, hashes, n, NULL, NULL, sealed, pending);
}

oi_status oi__host_lease_prefix(oi_host *h, oi_host_ns ns, uint32_t instance,
                                oi_host_principal principal, uint32_t shares,
                                const oi_block_hash *hashes, size_t n, uint64_t *hits,
                                uint64_t *pending, oi_lease *lease) {
  *hits = 0;
  if (pending) *pending = 0;
  if (n == 0) return OI_OK;
  host_block *stack[OI_BATCH], **pinned = n <= OI_BATCH ? stack : oi__malloc(n * sizeof *pinned);
  if (!pinned) return oi__fail(OI_ERR_OUT_OF_MEMORY, "query: out of memory");
  uint64_t found, run = 0;
  pin_tally tally = {0, 0, 0};
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

oi_status oi__host_release(oi_host *h, oi_host_ns ns, oi_host_principal principal, oi_lease lease) {
  return oi__lease_release(h, ns.id, principal, lease);
}

/* ---- loads ---- */

oi_status oi__host_load_begin(oi_host *h, oi_host_ns ns, oi_host_principal principal,
                              oi_lease lease, size_t n, host_block **out,
                              const oi_host_load_sink *sink) {
  oi_status st = oi__lease_consume(h, ns.id, principal, lease, n, out, sink);
  if (st == OI_OK)
    atomic_fetch_add(&h->c.loads_submitted, 1);
  else if (st == OI_ERR_LEASE_EXPIRED || st == OI_ERR_PERMISSION)
    atomic_fetch_add(&h->c.loads_failed, 1);
  return st;
}

/* Ends the loading marks of blocks[from..to), their shards locked. */
typedef struct load_end_ctx {
  uint64_t now, unloaded, unpinned;
} load_end_ctx;

static void load_end_some(oi_host *h, void *ctx, host_block *const *blocks, size_t from,
                          size_t to) {
  load_end_ctx *c = ctx;
  for (size_t i = from; i < to; i++) {
    if (i + OI_RUN_PREFETCH < to) __builtin_prefetch(blocks[i + OI_RUN_PREFETCH], 1);
    host_block *b = blocks[i];
    c->unpinned += !(b->pins || b->loading > 1); /* one atomic per call, not per block */
    if (--b->loading == 0) {
      c->unloaded++;
      if (oi__block_evictable(b)) {
        index_shard *s = oi__block_shard(h, b);
        b->last_used = c->now;
        oi__lru_remove_locked(s, b); /* still listed where it was pinned */
        oi__lru_push_locked(s, b);
      }
    }
  }
}

void oi__host_load_end(oi_host *h, host_block *const *blocks, size_t n, bool ok, uint64_t bytes,
                       uint64_t latency_ns) {
  if (n) oi__hist_record(&h->c.load_latency, latency_ns);
  load_end_ctx c = {.now = oi__now_ns()};
  oi__blocks_runs(h, blocks, n, true, load_end_some, &c);
  if (c.unloaded) atomic_fetch_sub(&h->c.blocks_loading, c.unloaded);
  if (c.unpinned) atomic_fetch_sub_explicit(&h->c.blocks_pinned, c.unpinned, memory_order_relaxed);
  if (ok) {
    oi__rate_sample(h, OI_RATE_LINK, bytes, latency_ns); /* the link's estimate */
    atomic_fetch_add(&h->c.loads_completed, 1);
    atomic_fetch_add(&h->c.blocks_loaded, n);
    atomic_fetch_add(&h->c.bytes_loaded, bytes);
  } else {
    atomic_fetch_add(&h->c.loads_failed, 1);
  }
}
