/* A rank's GPU block pool with a prefix cache.
 *
 * Every block is in exactly one of these states:
 *   free      refs 0, not cached, no save pin        (on the free list)
 *   cached    refs 0, cached, no save pin            (on the LRU list: evictable)
 *   active    refs > 0                               (held by requests)
 *   pinned    refs 0, save pins > 0                  (a save still reads it)
 * A cached block is named by its chained hash in the table; allocation takes
 * the free list first, then evicts the least recently used cached block.
 * Pinned blocks are in neither list, so whatever admission counts as
 * available already excludes pages that in-flight saves still read.
 *
 * Not thread-safe: only the thread driving the executor touches a pool. */
#ifndef OI_EXECUTOR_BLOCK_POOL_H
#define OI_EXECUTOR_BLOCK_POOL_H

#include <stdbool.h>
#include <stdint.h>

#include "openinfer/common.h"

typedef enum block_pool_list {
  BLOCK_POOL_NONE = 0,
  BLOCK_POOL_FREE = 1,
  BLOCK_POOL_LRU = 2
} block_pool_list;

typedef struct block_pool_block {
  oi_block_hash hash;
  uint32_t refs;
  uint32_t save_pins;
  int32_t hnext;      /* hash chain */
  int32_t prev, next; /* free or LRU list */
  uint8_t cached;
  uint8_t saved; /* its content is known to be in the host tier (saved or restored) */
  uint8_t list;  /* block_pool_list */
} block_pool_block;

typedef struct block_pool_dlist {
  int32_t head, tail; /* head: least recently used */
  uint32_t count;
} block_pool_dlist;

typedef struct block_pool {
  block_pool_block *blocks;
  uint32_t n;
  int32_t *buckets;
  uint32_t bucket_mask;
  block_pool_dlist free, lru;
  uint32_t cached; /* blocks in the table (any refs) */
  uint32_t pinned; /* blocks with save pins */
} block_pool;

oi_status oi__block_pool_create(block_pool *p, uint32_t n);
void oi__block_pool_destroy(block_pool *p);

/* Blocks an allocation can get now (free + evictable cached). */
uint32_t oi__block_pool_available(const block_pool *p);
/* Takes a block (refs 1, uncached): the free list first, else evicts the
 * least recently used cached block. -1 when none. */
int32_t oi__block_pool_alloc(block_pool *p);
void oi__block_pool_ref(block_pool *p, int32_t b);
void oi__block_pool_unref(block_pool *p, int32_t b);
void oi__block_pool_pin(block_pool *p, int32_t b);
void oi__block_pool_unpin(block_pool *p, int32_t b);

/* The cached block named `hash`, or -1. Does not take a reference. */
int32_t oi__block_pool_lookup(const block_pool *p, const oi_block_hash *hash);
/* Names block b by `hash` in the cache. @return b, or the block that already
 * holds the name (b is then left uncached). */
int32_t oi__block_pool_insert(block_pool *p, int32_t b, const oi_block_hash *hash);
/* Drops every cached block with no references from the cache (pinned ones
 * leave the pool when their save lands). @return how many. */
uint32_t oi__block_pool_evict_inactive(block_pool *p);

#endif
