/* The GPU block pool and prefix cache of one rank (see block_pool.h). */
#include "executor/block_pool.h"

#include <string.h>

#include "core/core.h"

static uint32_t bucket_of(const block_pool *p, const oi_block_hash *h) {
  uint64_t k;
  memcpy(&k, h->bytes, sizeof k);
  k ^= k >> 29;
  k *= 0xBF58476D1CE4E5B9ull;
  return (uint32_t)(k >> 32) & p->bucket_mask;
}

static void list_remove(block_pool *p, int32_t i) {
  block_pool_block *b = &p->blocks[i];
  block_pool_dlist *l = b->list == BLOCK_POOL_FREE  ? &p->free
                        : b->list == BLOCK_POOL_LRU ? &p->lru
                                                    : NULL;
  if (!l) return;
  if (b->prev >= 0)
    p->blocks[b->prev].next = b->next;
  else
    l->head = b->next;
  if (b->next >= 0)
    p->blocks[b->next].prev = b->prev;
  else
    l->tail = b->prev;
  l->count--;
  b->prev = b->next = -1;
  b->list = BLOCK_POOL_NONE;
}

static void list_push_tail(block_pool *p, block_pool_list which, int32_t i) {
  block_pool_block *b = &p->blocks[i];
  block_pool_dlist *l = which == BLOCK_POOL_FREE ? &p->free : &p->lru;
  b->prev = l->tail;
  b->next = -1;
  if (l->tail >= 0)
    p->blocks[l->tail].next = i;
  else
    l->head = i;
  l->tail = i;
  l->count++;
  b->list = (uint8_t)which;
}

static void uncache(block_pool *p, int32_t i) {
  block_pool_block *b = &p->blocks[i];
  if (!b->cached) return;
  int32_t *link = &p->buckets[bucket_of(p, &b->hash)];
  while (*link != i)
    link = &p->blocks[*link].hnext;
  *link = b->hnext;
  b->hnext = -1;
  b->cached = 0;
  b->saved = 0;
  p->cached--;
}

/* Puts an unreferenced, unpinned block on the list its state calls for. */
static void settle(block_pool *p, int32_t i) {
  block_pool_block *b = &p->blocks[i];
  if (b->refs || b->save_pins || b->list != BLOCK_POOL_NONE) return;
  list_push_tail(p, b->cached ? BLOCK_POOL_LRU : BLOCK_POOL_FREE, i);
}

oi_status oi__block_pool_create(block_pool *p, uint32_t n) {
  memset(p, 0, sizeof *p);
  uint32_t nb = 16;
  while (nb < 2 * n)
    nb <<= 1;
  p->blocks = oi__calloc(n, sizeof *p->blocks);
  p->buckets = oi__malloc(nb * sizeof *p->buckets);
  if (!p->blocks || !p->buckets) {
    oi__block_pool_destroy(p);
    return oi__fail(OI_ERR_OUT_OF_MEMORY, "executor: out of memory for a pool of %u blocks", n);
  }
  p->n = n;
  p->bucket_mask = nb - 1;
  for (uint32_t i = 0; i < nb; i++)
    p->buckets[i] = -1;
  p->free.head = p->free.tail = p->lru.head = p->lru.tail = -1;
  for (uint32_t i = 0; i < n; i++) {
    p->blocks[i].hnext = p->blocks[i].prev = p->blocks[i].next = -1;
    list_push_tail(p, BLOCK_POOL_FREE, (int32_t)i);
  }
  return OI_OK;
}

void oi__block_pool_destroy(block_pool *p) {
  oi__free(p->blocks);
  oi__free(p->buckets);
  memset(p, 0, sizeof *p);
}

uint32_t oi__block_pool_available(const block_pool *p) { return p->free.count + p->lru.count; }

int32_t oi__block_pool_alloc(block_pool *p) {
  int32_t i = p->free.head;
  if (i < 0) {
    i = p->lru.head;
    if (i < 0) return -1;
    uncache(p, i);
  }
  list_remove(p, i);
  p->blocks[i].refs = 1;
  p->blocks[i].saved = 0;
  return i;
}

void oi__block_pool_ref(block_pool *p, int32_t i) {
  block_pool_block *b = &p->blocks[i];
  if (b->list == BLOCK_POOL_LRU) list_remove(p, i);
  b->refs++;
}

void oi__block_pool_unref(block_pool *p, int32_t i) {
  block_pool_block *b = &p->blocks[i];
  if (b->refs && --b->refs == 0) settle(p, i);
}

void oi__block_pool_pin(block_pool *p, int32_t i) {
  block_pool_block *b = &p->blocks[i];
  if (b->list != BLOCK_POOL_NONE) list_remove(p, i);
  if (b->save_pins++ == 0) p->pinned++;
}

void oi__block_pool_unpin(block_pool *p, int32_t i) {
  block_pool_block *b = &p->blocks[i];
  if (!b->save_pins) return;
  if (--b->save_pins == 0) {
    p->pinned--;
    settle(p, i);
  }
}

int32_t oi__block_pool_lookup(const block_pool *p, const oi_block_hash *hash) {
  for (int32_t i = p->buckets[bucket_of(p, hash)]; i >= 0; i = p->blocks[i].hnext)
    if (!memcmp(p->blocks[i].hash.bytes, hash->bytes, sizeof hash->bytes)) return i;
  return -1;
}

int32_t oi__block_pool_insert(block_pool *p, int32_t i, const oi_block_hash *hash) {
  int32_t have = oi__block_pool_lookup(p, hash);
  if (have >= 0) return have;
  block_pool_block *b = &p->blocks[i];
  if (b->cached) uncache(p, i);
  b->hash = *hash;
  uint32_t k = bucket_of(p, hash);
  b->hnext = p->buckets[k];
  p->buckets[k] = i;
  b->cached = 1;
  p->cached++;
  return i;
}

uint32_t oi__block_pool_evict_inactive(block_pool *p) {
  uint32_t n = 0;
  for (uint32_t i = 0; i < p->n; i++) {
    block_pool_block *b = &p->blocks[i];
    if (!b->cached || b->refs) continue;
    bool on_lru = b->list == BLOCK_POOL_LRU;
    if (on_lru) list_remove(p, (int32_t)i);
    uncache(p, (int32_t)i);
    settle(p, (int32_t)i);
    n++;
  }
  return n;
}
