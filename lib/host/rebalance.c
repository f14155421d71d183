/* The size-class rebalancer: moves a chunk of the pool from one block size
 * to another that has no room left, as memcached's slab rebalancer moves
 * pages between slab classes.
 *
 * A save whose class finds no free slot and no chunk to carve asks for it
 * (oi__pool_rebalance_request: a bit and a signal, no lock, no wait) and
 * goes on as before: it evicts within its own class, or drops and counts.
 * The maintenance thread then, for each class that asked:
 *
 *  1. still starved? (a free slot or an uncarved chunk may have come since);
 *  2. candidates: the chunks of other classes that were filled least
 *     recently (oi__pool_victims), and what the index holds of them
 *     (oi__index_chunk_census): a chunk with a held block (pinned, leased,
 *     loading, spilling) is skipped;
 *  3. a class gives a chunk when the asking class has no block it could
 *     evict, or keeps its blocks for less than 4/5 of the time the giver
 *     keeps its own (the ages of their LRU tails, as memcached's automover
 *     compares them): the shares move until the classes keep their blocks
 *     about as long, a global LRU at the grain of a chunk, and the margin
 *     keeps a chunk from going back and forth. Of the candidates of the
 *     class with the oldest tail, the chunk whose newest block is oldest;
 *  4. drain it: marked draining (no slot of it is handed out again, and a
 *     slot of it that eviction takes goes back to it), its evictable blocks
 *     evicted, one shard lock at a time; once every slot is free it is
 *     carved again for the asking class. A held block met cancels the
 *     drain (the chunk serves its class again); a block in flight, or a
 *     slot a save reserved before the drain began, is waited for over the
 *     next passes (it seals and is evicted then, or is dropped), for up to
 *     DRAIN_PASSES passes, then the drain is cancelled. A block in flight
 *     is never touched: a busy class always has some, scattered over its
 *     chunks by eviction, so skipping such chunks would starve the other.
 *
 * Why here and not in the save's reserve: the drain walks every shard's
 * table and evicts up to a chunk of blocks, work that grows with the pool,
 * not with the save; and it may have to wait for slots other saves hold.
 * A save stays O(its hashes) and never waits: the ones that find no room
 * drop (counted), and the saves after the move find the chunk. */
#include "host_private.h"

/* Chunks looked at per request. */
#define VICTIMS 8
/* Passes of the maintenance thread a drain waits for its blocks in flight
 * and the slots saves took before it began. */
#define DRAIN_PASSES 16

static void drain_end(oi_host *h, bool cancel) {
  if (cancel) oi__pool_drain_cancel(h, h->drain.chunk);
  h->drain.chunk = OI_NIL;
}

/* Evicts what it can of the draining chunk and moves it if it is empty.
 * Returns whether the drain is over (moved or cancelled). */
static bool drain_step(oi_host *h) {
  bool held = false;
  size_t n = oi__index_evict_chunk(h, h->drain.chunk, &held);
  if (held) { /* a pinned, leased, loading or spilling block: this chunk stays */
    OI_LOG(OI_LOG_DEBUG, "host", "rebalance: chunk %u keeps a held block (%zu evicted); skipped",
           h->drain.chunk, n);
    drain_end(h, true);
    return true;
  }
  if (oi__pool_drain_finish(h, h->drain.chunk, h->drain.to)) {
    uint64_t moved = atomic_fetch_add(&h->chunks_moved, 1) + 1;
    OI_LOG(OI_LOG_DEBUG, "host",
           "rebalance: chunk %u moved from %llu-byte to %llu-byte blocks (%zu evicted; %llu moved "
           "in all)",
           h->drain.chunk, (unsigned long long)h->classes[h->drain.from].block_bytes,
           (unsigned long long)h->classes[h->drain.to].block_bytes, n, (unsigned long long)moved);
    drain_end(h, false);
    return true;
  }
  if (++h->drain.passes >= DRAIN_PASSES) {
    drain_end(h, true);
    return true;
  }
  return false;
}

/* The age of a class's oldest listed block (0: none listed). */
static uint64_t tail_age(uint64_t oldest, uint64_t now) {
  return oldest == UINT64_MAX ? 0 : now - OI_MIN(now, oldest);
}

/* Picks a chunk for class `to` and drains it. The classes that would give
 * are found from their LRU tails alone (a lock of each shard, briefly), so
 * a request that no class answers costs no walk of the index. */
static void rebalance_for(oi_host *h, uint32_t to) {
  if (!oi__pool_starved(h, to)) return;
  uint64_t oldest[OI_MAX_SIZE_CLASSES], now = oi__now_ns();
  oi__index_oldest(h, oldest);
  uint32_t ncls = atomic_load(&h->nclasses);
  uint64_t own = tail_age(oldest[to], now);
  unsigned givers = 0;
  for (uint32_t k = 0; k < ncls; k++) {
    /* The asking class keeps its blocks for less than 4/5 of the time the
     * other keeps its own (or has none it could evict): memory goes to it. */
    if (k != to && (oldest[to] == UINT64_MAX || own * 5 < tail_age(oldest[k], now) * 4))
      givers |= 1u << k;
  }
  if (!givers) return;
  uint32_t chunks[VICTIMS], from[VICTIMS];
  size_t n = oi__pool_victims(h, givers, chunks, from, VICTIMS);
  if (n == 0) return;
  chunk_census census[VICTIMS];
  oi__index_chunk_census(h, chunks, n, census);
  size_t best = n;
  uint64_t best_age = 0;
  for (size_t k = 0; k < n; k++) {
    if (census[k].held) continue; /* never a chunk with a held block */
    uint64_t age = tail_age(oldest[from[k]], now);
    if (best == n || age > best_age ||
        (age == best_age && census[k].newest < census[best].newest)) {
      best = k;
      best_age = age;
    }
  }
  if (best == n) return;
  if (!oi__pool_drain_begin(h, chunks[best], from[best])) return;
  h->drain.chunk = chunks[best];
  h->drain.from = from[best];
  h->drain.to = to;
  h->drain.passes = 0;
  drain_step(h);
}

void oi__rebalance_run(oi_host *h) {
  if (h->drain.chunk != OI_NIL && !drain_step(h)) return; /* still waiting for blocks in flight */
  unsigned want = atomic_exchange(&h->rebalance_want, 0);
  for (uint32_t cls = 0; want; cls++, want >>= 1) {
    if (!(want & 1)) continue;
    rebalance_for(h, cls);
    if (h->drain.chunk != OI_NIL) { /* the rest ask again after this one */
      if (want >> 1) atomic_fetch_or(&h->rebalance_want, (want >> 1) << (cls + 1));
      return;
    }
  }
}
