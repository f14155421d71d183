/* The pool: fixed-size chunks, each carved on first use into equal slots of
 * one size class (one class per distinct block size), so blocks never
 * fragment the pool. A chunk keeps its class until it is wholly free: then a
 * class that finds no room may take it back (reclaim_free_chunk, at once) or
 * the rebalancer empties one for it (the drain_* functions, rebalance.c). */
#include <string.h>

#include "core/fault.h"
#include "host_private.h"

#define MIN_AUTO_CHUNK (256ull << 10)
#define MAX_AUTO_CHUNK (64ull << 20)

static uint64_t auto_chunk_bytes(uint64_t pool) {
  uint64_t c = (pool / 16) & ~((64ull << 10) - 1);
  if (c < MIN_AUTO_CHUNK) c = MIN_AUTO_CHUNK;
  if (c > MAX_AUTO_CHUNK) c = MAX_AUTO_CHUNK;
  if (c > pool) c = pool;
  return c;
}

oi_status oi__pool_init(oi_host *h) {
  h->chunk_bytes = h->opts.chunk_bytes ? h->opts.chunk_bytes : auto_chunk_bytes(h->capacity);
  if (h->chunk_bytes > h->capacity || h->chunk_bytes < OI_SLOT_ALIGN)
    return oi__fail(
        OI_ERR_INVALID_ARGUMENT, "host: chunk_bytes %llu must be between %d and pool_bytes %llu",
        (unsigned long long)h->chunk_bytes, OI_SLOT_ALIGN, (unsigned long long)h->capacity);
  h->nchunks = (uint32_t)(h->capacity / h->chunk_bytes);
  /* Record ids are (chunk << slot_bits) | slot in 31 bits (OI_NIL stays free).
   * Only a pool of more than 2^31 minimum slots caps a chunk's slots. */
  uint32_t cbits = 0, sbits = 0;
  while (cbits < 32 && (1ull << cbits) < h->nchunks)
    cbits++;
  while (sbits < 31 && (1ull << sbits) < h->chunk_bytes / OI_SLOT_ALIGN)
    sbits++;
  if (cbits > 31)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "host: too many chunks (raise chunk_bytes)");
  if (cbits + sbits > 31) sbits = 31 - cbits;
  h->slot_bits = sbits;
  h->chunks = oi__calloc(h->nchunks, sizeof *h->chunks);
  if (!h->chunks) return oi__fail(OI_ERR_OUT_OF_MEMORY, "host: out of memory for the chunk table");
  h->drain.chunk = OI_NIL;
  for (uint32_t i = 0; i < h->nchunks; i++)
    h->chunks[i].cls = -1;
  pthread_mutex_init(&h->chunk_lock, NULL);
  pthread_mutex_init(&h->class_lock, NULL);
  for (int i = 0; i < OI_MAX_SIZE_CLASSES; i++) {
    pthread_mutex_init(&h->classes[i].lock, NULL);
    h->classes[i].free_chunks = OI_NIL;
  }
  return OI_OK;
}

void oi__pool_fini(oi_host *h) {
  if (!h->chunks) return;
  for (uint32_t i = 0; i < h->nchunks; i++) {
    oi__free(h->chunks[i].records);
    oi__free(h->chunks[i].free_bits);
  }
  oi__free(h->chunks);
  h->chunks = NULL;
  for (int i = 0; i < OI_MAX_SIZE_CLASSES; i++)
    pthread_mutex_destroy(&h->classes[i].lock);
  pthread_mutex_destroy(&h->class_lock);
  pthread_mutex_destroy(&h->chunk_lock);
}

oi_status oi__pool_class_for(oi_host *h, uint64_t block_bytes, uint32_t *cls) {
  uint64_t slot = (block_bytes + OI_SLOT_ALIGN - 1) & ~(uint64_t)(OI_SLOT_ALIGN - 1);
  if (slot > h->chunk_bytes)
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "register: a block of %llu bytes does not fit the pool's %llu-byte chunks "
                    "(raise oi_host_options.chunk_bytes)",
                    (unsigned long long)block_bytes, (unsigned long long)h->chunk_bytes);
  pthread_mutex_lock(&h->class_lock);
  uint32_t n = atomic_load(&h->nclasses);
  for (uint32_t i = 0; i < n; i++)
    if (h->classes[i].block_bytes == block_bytes) {
      pthread_mutex_unlock(&h->class_lock);
      *cls = i;
      return OI_OK;
    }
  if (n == OI_MAX_SIZE_CLASSES) {
    pthread_mutex_unlock(&h->class_lock);
    return oi__fail(OI_ERR_UNSUPPORTED, "register: the host already serves %d block sizes",
                    OI_MAX_SIZE_CLASSES);
  }
  /* A tier doing O_DIRECT I/O asked for 4 KiB slots: given to blocks
   * of 64 KiB or more, where the rounding costs at most 1/16 of a slot. */
  if (h->sector_slots && block_bytes >= OI_SECTOR_SLOT_MIN)
    slot = (block_bytes + OI_SECTOR_BYTES - 1) & ~(uint64_t)(OI_SECTOR_BYTES - 1);
  if (slot > h->chunk_bytes)
    slot = (block_bytes + OI_SLOT_ALIGN - 1) & ~(uint64_t)(OI_SLOT_ALIGN - 1);
  h->classes[n].block_bytes = block_bytes;
  h->classes[n].slot_bytes = slot;
  atomic_store(&h->nclasses, n + 1);
  pthread_mutex_unlock(&h->class_lock);
  *cls = n;
  return OI_OK;
}

/* Marks slot `id` free (class lock held). A draining chunk's slot stays
 * out of the class's count and list. */
static inline void push_free_locked(oi_host *h, size_class *c, uint32_t id) {
  uint32_t ci = id >> h->slot_bits, slot = id & ((1u << h->slot_bits) - 1);
  pool_chunk *ch = &h->chunks[ci];
  ch->free_bits[slot / 64] |= 1ull << (slot % 64);
  if (slot / 64 < ch->word_hint) ch->word_hint = slot / 64;
  ch->nfree++;
  if (ch->draining) return;
  c->nfree++;
  if (!ch->on_free_list) {
    ch->on_free_list = true;
    ch->next_free = c->free_chunks;
    c->free_chunks = ci;
  }
}

/* Takes up to `want` free slots (class lock held), lowest addresses of the
 * first chunk with free slots first; reads no record. */
static size_t pop_free_locked(oi_host *h, size_class *c, size_t want, host_block **out,
                              uint64_t seq) {
  size_t got = 0;
  while (got < want && c->free_chunks != OI_NIL) {
    uint32_t ci = c->free_chunks;
    pool_chunk *ch = &h->chunks[ci];
    uint32_t words = (ch->nslots + 63) / 64;
    ch->filled_seq = seq;
    for (uint32_t w = ch->word_hint; w < words && got < want && ch->nfree; w++) {
      ch->word_hint = w;
      /* A word at a time, in locals: the counters and the bits are written
       * back once per word, not once per slot. */
      uint64_t bits = ch->free_bits[w];
      host_block *recs = ch->records + (size_t)w * 64;
      size_t took = got;
      for (; bits && got < want; bits &= bits - 1)
        out[got++] = recs + __builtin_ctzll(bits);
      ch->free_bits[w] = bits;
      ch->nfree -= (uint32_t)(got - took);
      c->nfree -= got - took;
    }
    if (ch->nfree == 0) { /* full: off the list until a slot is freed */
      c->free_chunks = ch->next_free;
      ch->on_free_list = false;
      ch->next_free = OI_NIL;
      ch->word_hint = words; /* a free lowers it to its word */
    }
  }
  return got;
}

/* Carves uncarved chunk `idx` for class `cls` (chunk lock held). */
static bool carve_at_locked(oi_host *h, uint32_t idx, uint32_t cls) {
  size_class *c = &h->classes[cls];
  pool_chunk *ch = &h->chunks[idx];
  uint64_t nslots64 = h->chunk_bytes / c->slot_bytes;
  if (nslots64 > (1ull << h->slot_bits)) nslots64 = 1ull << h->slot_bits;
  uint32_t nslots = (uint32_t)nslots64, words = (nslots + 63) / 64;
  host_block *recs = oi__calloc_table((size_t)nslots * sizeof *recs);
  uint64_t *bits = oi__calloc(words, sizeof *bits);
  if (!recs || !bits) {
    oi__free(recs);
    oi__free(bits);
    return false;
  }
  for (uint32_t i = 0; i < nslots; i++) {
    recs[i].id = (idx << h->slot_bits) | i;
    recs[i].lru_prev = recs[i].lru_next = OI_NIL;
  }
  ch->cls = (int)cls;
  ch->nslots = nslots;
  ch->records = recs;
  ch->free_bits = bits;
  ch->nfree = 0;
  ch->word_hint = 0;
  ch->on_free_list = false;
  ch->draining = false;
  ch->next_free = OI_NIL;
  pthread_mutex_lock(&c->lock);
  ch->filled_seq = atomic_load_explicit(&h->fill_seq, memory_order_relaxed); /* new: recent */
  for (uint32_t w = 0; w < words; w++)
    bits[w] = w + 1 < words || nslots % 64 == 0 ? UINT64_MAX : (1ull << (nslots % 64)) - 1;
  ch->nfree = nslots;
  c->nfree += nslots;
  ch->on_free_list = true;
  ch->next_free = c->free_chunks;
  c->free_chunks = idx;
  atomic_fetch_add(&c->slots, nslots);
  pthread_mutex_unlock(&c->lock);
  return true;
}

/* Carves one uncarved chunk for class `cls`. */
static bool carve_chunk(oi_host *h, uint32_t cls) {
  bool done = false;
  pthread_mutex_lock(&h->chunk_lock);
  for (uint32_t i = 0; i < h->nchunks; i++)
    if (h->chunks[i].cls < 0) {
      done = carve_at_locked(h, i, cls);
      break;
    }
  pthread_mutex_unlock(&h->chunk_lock);
  return done;
}

/* Takes wholly free chunk `ci` out of its class (chunk and class locks
 * held), counters included. */
static void unlink_free_chunk_locked(oi_host *h, size_class *c, uint32_t ci) {
  pool_chunk *ch = &h->chunks[ci];
  uint32_t *link = &c->free_chunks; /* on its class's list unless draining */
  while (*link != OI_NIL && *link != ci)
    link = &h->chunks[*link].next_free;
  if (*link == ci) *link = ch->next_free;
  if (!ch->draining) c->nfree -= ch->nfree;
  atomic_fetch_sub(&c->slots, ch->nslots);
}

/* Frees an unlinked chunk's tables: it is uncarved (chunk lock held). */
static void uncarve_locked(pool_chunk *ch) {
  oi__free(ch->records);
  oi__free(ch->free_bits);
  ch->records = NULL;
  ch->free_bits = NULL;
  ch->nslots = ch->nfree = 0;
  ch->on_free_list = false;
  ch->draining = false;
  ch->next_free = OI_NIL;
  ch->cls = -1;
}

/* Returns to the uncarved pool one chunk of another size class whose slots
 * are all free, so a block size that arrives later is not starved by chunks
 * an earlier size no longer uses. */
static bool reclaim_free_chunk(oi_host *h, uint32_t for_cls) {
  bool done = false;
  pthread_mutex_lock(&h->chunk_lock);
  for (uint32_t i = 0; i < h->nchunks && !done; i++) {
    pool_chunk *ch = &h->chunks[i];
    if (ch->cls < 0 || (uint32_t)ch->cls == for_cls) continue;
    size_class *c = &h->classes[ch->cls];
    pthread_mutex_lock(&c->lock);
    /* A draining chunk is the rebalancer's to hand over. */
    if (ch->nfree == ch->nslots && !ch->draining) {
      unlink_free_chunk_locked(h, c, i);
      done = true;
    }
    pthread_mutex_unlock(&c->lock);
    if (done) uncarve_locked(ch);
  }
  pthread_mutex_unlock(&h->chunk_lock);
  return done;
}

bool oi__pool_starved(oi_host *h, uint32_t cls) {
  size_class *c = &h->classes[cls];
  pthread_mutex_lock(&c->lock);
  bool dry = c->free_chunks == OI_NIL;
  pthread_mutex_unlock(&c->lock);
  if (!dry) return false;
  pthread_mutex_lock(&h->chunk_lock);
  for (uint32_t i = 0; i < h->nchunks && dry; i++)
    dry = h->chunks[i].cls >= 0;
  pthread_mutex_unlock(&h->chunk_lock);
  return dry;
}

size_t oi__pool_victims(oi_host *h, unsigned classes, uint32_t *chunks, uint32_t *from,
                        size_t max) {
  uint64_t seq[8];
  size_t n = 0;
  if (max > 8) max = 8;
  uint32_t ncls = atomic_load(&h->nclasses);
  pthread_mutex_lock(&h->chunk_lock); /* classes of carved chunks are stable under it */
  for (uint32_t k = 0; k < ncls; k++) {
    if (!(classes >> k & 1)) continue;
    size_class *c = &h->classes[k];
    pthread_mutex_lock(&c->lock);
    for (uint32_t i = 0; i < h->nchunks; i++) {
      pool_chunk *ch = &h->chunks[i];
      if (ch->cls != (int)k || ch->draining) continue;
      /* Insertion into the max oldest, by fill ordinal. */
      size_t at = n < max ? n++ : max;
      while (at > 0 && seq[at - 1] > ch->filled_seq) {
        if (at < max) {
          seq[at] = seq[at - 1];
          chunks[at] = chunks[at - 1];
          from[at] = from[at - 1];
        }
        at--;
      }
      if (at < max) {
        seq[at] = ch->filled_seq;
        chunks[at] = i;
        from[at] = k;
      }
    }
    pthread_mutex_unlock(&c->lock);
  }
  pthread_mutex_unlock(&h->chunk_lock);
  return n;
}

bool oi__pool_drain_begin(oi_host *h, uint32_t ci, uint32_t cls) {
  size_class *c = &h->classes[cls];
  pool_chunk *ch = &h->chunks[ci];
  bool ok = false;
  pthread_mutex_lock(&h->chunk_lock);
  pthread_mutex_lock(&c->lock);
  if (ch->cls == (int)cls && !ch->draining) {
    if (ch->on_free_list) {
      uint32_t *link = &c->free_chunks;
      while (*link != ci)
        link = &h->chunks[*link].next_free;
      *link = ch->next_free;
      ch->on_free_list = false;
      ch->next_free = OI_NIL;
    }
    c->nfree -= ch->nfree;
    ch->draining = true;
    ok = true;
  }
  pthread_mutex_unlock(&c->lock);
  pthread_mutex_unlock(&h->chunk_lock);
  return ok;
}

void oi__pool_drain_cancel(oi_host *h, uint32_t ci) {
  pool_chunk *ch = &h->chunks[ci];
  pthread_mutex_lock(&h->chunk_lock);
  if (ch->cls >= 0 && ch->draining) {
    size_class *c = &h->classes[ch->cls];
    pthread_mutex_lock(&c->lock);
    ch->draining = false;
    c->nfree += ch->nfree;
    ch->word_hint = 0;
    if (ch->nfree) {
      ch->on_free_list = true;
      ch->next_free = c->free_chunks;
      c->free_chunks = ci;
    }
    pthread_mutex_unlock(&c->lock);
  }
  pthread_mutex_unlock(&h->chunk_lock);
}

bool oi__pool_drain_finish(oi_host *h, uint32_t ci, uint32_t to) {
  pool_chunk *ch = &h->chunks[ci];
  bool moved = false;
  pthread_mutex_lock(&h->chunk_lock);
  if (ch->cls >= 0 && ch->draining) {
    size_class *c = &h->classes[ch->cls];
    pthread_mutex_lock(&c->lock);
    /* Every slot free: no block of it is indexed, leased or held by a
     * reserve (a slot is taken from its bit until its free sets it again). */
    bool empty = ch->nfree == ch->nslots;
    if (empty) unlink_free_chunk_locked(h, c, ci);
    pthread_mutex_unlock(&c->lock);
    if (empty) {
      uncarve_locked(ch);
      moved = carve_at_locked(h, ci, to);
    }
  }
  pthread_mutex_unlock(&h->chunk_lock);
  return moved;
}

size_t oi__pool_alloc_batch(oi_host *h, uint32_t cls, size_t want, host_block **out) {
  size_class *c = &h->classes[cls];
  size_t got = 0;
  if (OI_FAULT(OI_FAULT_HOST_ALLOC, NULL)) return 0;
  uint64_t seq = atomic_fetch_add_explicit(&h->fill_seq, 1, memory_order_relaxed) + 1;
  for (;;) {
    pthread_mutex_lock(&c->lock);
    got += pop_free_locked(h, c, want - got, out + got, seq);
    pthread_mutex_unlock(&c->lock);
    if (got == want) break;
    if (!carve_chunk(h, cls) && !(reclaim_free_chunk(h, cls) && carve_chunk(h, cls))) {
      oi__pool_rebalance_request(h, cls); /* for the next saves: this one evicts or drops */
      break;
    }
  }
  atomic_fetch_add(&c->resident, got);
  return got;
}

host_block *oi__pool_alloc(oi_host *h, uint32_t cls) {
  host_block *b = NULL;
  if (OI_FAULT(OI_FAULT_HOST_ALLOC, NULL)) return NULL;
  if (oi__pool_alloc_batch(h, cls, 1, &b) == 1) return b;
  /* An evicted slot stays counted as resident: it changes hands. */
  return oi__index_evict_one(h, (int)cls);
}

void oi__pool_free_batch(oi_host *h, host_block **blocks, size_t n) {
  for (size_t i = 0; i < n;) {
    size_class *c = &h->classes[oi__block_cls(h, blocks[i])];
    pthread_mutex_lock(&c->lock);
    size_t k = 0;
    for (; i < n && &h->classes[oi__block_cls(h, blocks[i])] == c; i++, k++) {
      host_block *b = blocks[i];
      b->state = BLOCK_FREE;
      b->pins = b->loading = 0;
      b->spilling = b->lower = 0;
      b->spill_fate = OI_SPILL_NONE;
      push_free_locked(h, c, b->id);
    }
    pthread_mutex_unlock(&c->lock);
    atomic_fetch_sub(&c->resident, k);
  }
}

void oi__pool_free(oi_host *h, host_block *b) { oi__pool_free_batch(h, &b, 1); }
