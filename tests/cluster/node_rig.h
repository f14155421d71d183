/* A node of the cluster tier's tests, through the public API (cpu backend):
 * a host of 8 MiB (unpinned), joined to a cluster when asked, with an
 * engine over one arena of 2 * NB blocks of BLOCK bytes; blocks 0..NB are
 * where saves come from, NB..2*NB where loads land. Block `logical` is named
 * hash_of(logical) (its last byte HASH_TAG, so that two suites' names never
 * meet) and holds pattern(logical, i) at byte i.
 *
 * The including file defines NB, BLOCK and HASH_TAG first. */
#ifndef OI_TEST_NODE_RIG_H
#define OI_TEST_NODE_RIG_H

#include <stdlib.h>
#include <string.h>

#include "openinfer/openinfer.h"
#include "rig.h"
#include "testutil.h"

typedef struct node {
  oi_host *h;
  oi_engine *e;
  uint8_t *mem;
  oi_arena_desc arena;
} node;

static inline uint8_t pattern(uint64_t logical, uint64_t i) {
  uint64_t x = (logical + 11) * 0x9E3779B97F4A7C15ull ^ i * 0xBF58476D1CE4E5B9ull;
  return (uint8_t)(x ^ (x >> 29) ^ (x >> 41));
}

static inline oi_block_hash hash_of(uint64_t i) {
  oi_block_hash h;
  memset(&h, 0, sizeof h);
  memcpy(h.bytes, &i, sizeof i);
  h.bytes[15] = HASH_TAG;
  return h;
}

/* Opens a node whose engine serves namespace `ns`. With a `redis_url`, the
 * host first joins that cluster as node `id` (listening on 127.0.0.1, any
 * port) with the secret in `secret_file` and peer calls of `timeout_ms`;
 * NULL: no cluster. @return the attach's status (the node opens either
 * way). */
static inline oi_status rig_open(node *n, const char *ns, const char *redis_url, const char *id,
                                 const char *secret_file, uint32_t timeout_ms) {
  memset(n, 0, sizeof *n);
  oi_host_options ho = tr_host_options(8ull << 20);
  ho.flags = OI_HOST_NO_PIN;
  n->h = tr_host_new(&ho);
  oi_status st = OI_OK;
  if (redis_url) {
    oi_host_cluster_options co;
    oi_host_cluster_options_init(&co);
    co.redis_url = redis_url;
    co.node_id = id;
    co.listen_addr = "127.0.0.1:0";
    co.secret_file = secret_file;
    co.timeout_ms = timeout_ms;
    st = oi_host_attach_cluster(n->h, &co);
  }
  n->mem = calloc(2 * NB, BLOCK);
  REQUIRE(n->mem);
  n->arena = tr_arena("kv", n->mem, 2 * NB, BLOCK);
  oi_engine_options eo = tr_engine_options(ns, &n->arena, 1);
  n->e = tr_engine_new(n->h, &eo);
  return st;
}

static inline void node_close(node *n) {
  oi_engine_destroy(n->e);
  oi_host_destroy(n->h);
  free(n->mem);
  memset(n, 0, sizeof *n);
}

static inline oi_host_cluster_stats cstats(node *n) {
  oi_host_cluster_stats s = {.struct_size = sizeof s};
  CHECK_OK(oi_host_get_cluster_stats(n->h, &s));
  return s;
}

/* Saves blocks [first, first + count) (logical ids) from device blocks 0..
 * and waits for the save. */
static inline void save(node *n, uint64_t first, int count) {
  int64_t ids[NB];
  oi_block_hash hs[NB];
  for (int b = 0; b < count; b++) {
    ids[b] = b;
    hs[b] = hash_of(first + (uint64_t)b);
    for (uint64_t i = 0; i < BLOCK; i++)
      n->mem[(uint64_t)b * BLOCK + i] = pattern(first + (uint64_t)b, i);
  }
  CHECK_OK(tr_save(n->e, ids, hs, (size_t)count, 10000));
}

/* Queries [first, first + count) with a wait of wait_ms for fetches, loads
 * the hits into device blocks NB.. and checks every byte. @return the hits. */
static inline uint64_t fetch_check(node *n, uint64_t first, int count, uint32_t wait_ms) {
  oi_block_hash hs[NB];
  for (int b = 0; b < count; b++)
    hs[b] = hash_of(first + (uint64_t)b);
  oi_query_result q = {.struct_size = sizeof q, .wait_ms = wait_ms};
  CHECK_OK(oi_engine_query(n->e, NULL, hs, (size_t)count, OI_QUERY_WAIT_PENDING, &q));
  if (q.hit_blocks == 0) return 0;
  int64_t dst[NB];
  for (int b = 0; b < NB; b++)
    dst[b] = NB + b;
  memset(n->mem + NB * BLOCK, 0, NB * BLOCK);
  CHECK_OK(tr_load(n->e, q.lease, dst, q.hit_blocks, 10000));
  uint64_t bad = 0;
  for (uint64_t b = 0; b < q.hit_blocks; b++)
    for (uint64_t i = 0; i < BLOCK; i++)
      bad += n->mem[(NB + b) * BLOCK + i] != pattern(first + b, i);
  CHECK(bad == 0);
  return q.hit_blocks;
}

#endif
