/* Faults in a codec namespace's copy pipeline (docs/codecs.md), cpu
 * backend, lossless frames of compressible bf16 blocks:
 *  - the codec stage's pinned bounce cannot be made: the engine is refused
 *    (OI_ERR_OUT_OF_MEMORY), nothing is left behind, and a later create works;
 *  - a save whose copies fail before its encode step: the save fails, no
 *    block seals (nothing unencoded is ever kept), the same hashes save
 *    cleanly afterwards;
 *  - a load whose copies fail after its decode step: the load fails, the
 *    lease is consumed, the frames stay and load byte-exact afterwards;
 *  - saves and loads at once from two threads (the stage's workers taken by
 *    one direction, the other runs its blocks alone): every block loaded is
 *    byte-exact;
 *  - a layerwise save whose later arena's copies fail: that layer's save
 *    fails, no block seals (the first arena's bounces are never encoded),
 *    the slots come back, and the same hashes save layer by layer cleanly
 *    afterwards; a layered load whose copies fail reports no arena landed. */
#include <pthread.h>

#include "core/fault.h"
#include "rig.h"

#define BLOCK 16384u
#define NB 32

static uint16_t elem(uint64_t block, uint64_t i) {
  uint64_t x = (block * 7919 + i) * 2654435761u >> 7;
  float f = ((float)(x % 255) - 127.0f) / 64.0f;
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)(u >> 16);
}

typedef struct crig {
  oi_host *h;
  oi_engine *e;
  uint16_t *mem; /* 4 * NB blocks: saves from [0, NB), loads into [NB, 4 NB) */
} crig;

static oi_status crig_open(crig *r) {
  memset(r, 0, sizeof *r);
  r->h = tr_host(16u << 20);
  r->mem = calloc(4 * NB, BLOCK);
  REQUIRE(r->mem);
  for (uint64_t b = 0; b < NB; b++)
    for (uint64_t i = 0; i < BLOCK / 2; i++)
      r->mem[b * BLOCK / 2 + i] = elem(b, i);
  oi_arena_desc ad = tr_arena("kv", r->mem, 4 * NB, BLOCK);
  oi_engine_options o = tr_engine_options("codec-fault", &ad, 1);
  o.codec = "lossless";
  return oi_engine_create(r->h, &o, &r->e);
}

static void crig_close(crig *r) {
  oi_engine_destroy(r->e);
  oi_host_destroy(r->h);
  free(r->mem);
}

static void hashes(oi_block_hash *hs, int64_t *ids, uint64_t first, size_t n) {
  for (size_t i = 0; i < n; i++) {
    ids[i] = (int64_t)(first + i);
    hs[i] = tr_hash(first + i, 14, 0x6c);
  }
}

/* Loads blocks [first, first + n) (saved from the same ids) into `at`.. and
 * compares. @return the hits, or -1 when the load failed. */
static int load_check(crig *r, uint64_t first, size_t n, uint64_t at) {
  oi_block_hash hs[NB];
  int64_t ids[NB], dst[NB];
  hashes(hs, ids, first, n);
  oi_query_result q;
  CHECK_OK(tr_query(r->e, NULL, hs, n, 0, NULL, &q));
  if (!q.hit_blocks) return 0;
  for (size_t i = 0; i < n; i++)
    dst[i] = (int64_t)(at + i);
  if (tr_load(r->e, q.lease, dst, q.hit_blocks, 30000) != OI_OK) return -1;
  CHECK(memcmp(r->mem + at * BLOCK / 2, r->mem + first * BLOCK / 2, q.hit_blocks * BLOCK) == 0);
  return (int)q.hit_blocks;
}

static void test_bounce_cannot_be_made(void) {
  crig r;
  /* the pool's own pinning passes (the first hit), the bounce's fails */
  REQUIRE(oi__fault_arm(OI_FAULT_PIN_REGISTER, 1, 1, 0) == OI_OK);
  CHECK_ST(crig_open(&r), OI_ERR_OUT_OF_MEMORY);
  CHECK(r.e == NULL);
  oi__fault_disarm_all();
  oi_host_destroy(r.h);
  free(r.mem);
  CHECK_OK(crig_open(&r));
  crig_close(&r);
}

static void test_save_copy_fails(void) {
  crig r;
  REQUIRE(crig_open(&r) == OI_OK);
  oi_block_hash hs[NB];
  int64_t ids[NB];
  hashes(hs, ids, 0, 8);
  REQUIRE(oi__fault_arm(OI_FAULT_COPY_FAIL, 0, 1, 0) == OI_OK);
  CHECK_ST(tr_save(r.e, ids, hs, 8, 30000), OI_ERR_IO);
  oi__fault_disarm_all();
  CHECK(load_check(&r, 0, 8, NB) == 0); /* nothing unencoded was kept */
  CHECK(tr_engine_stats(r.e).saves_failed == 8);
  CHECK_OK(tr_save(r.e, ids, hs, 8, 30000));
  CHECK(load_check(&r, 0, 8, NB) == 8);
  crig_close(&r);
}

static void test_load_copy_fails(void) {
  crig r;
  REQUIRE(crig_open(&r) == OI_OK);
  oi_block_hash hs[NB];
  int64_t ids[NB];
  hashes(hs, ids, 0, 8);
  CHECK_OK(tr_save(r.e, ids, hs, 8, 30000));
  REQUIRE(oi__fault_arm(OI_FAULT_COPY_FAIL, 0, 1, 0) == OI_OK);
  CHECK(load_check(&r, 0, 8, NB) == -1);
  oi__fault_disarm_all();
  CHECK(tr_engine_stats(r.e).loads_failed == 1);
  CHECK(load_check(&r, 0, 8, NB) == 8); /* the frames stayed */
  crig_close(&r);
}

typedef struct loader {
  crig *r;
  int rounds, bad;
} loader;

static void *load_loop(void *arg) {
  loader *l = arg;
  for (int i = 0; i < l->rounds; i++)
    if (load_check(l->r, 0, NB / 2, NB) != NB / 2) l->bad++;
  return NULL;
}

static void test_saves_and_loads_at_once(void) {
  crig r;
  REQUIRE(crig_open(&r) == OI_OK);
  oi_block_hash hs[NB];
  int64_t ids[NB];
  hashes(hs, ids, 0, NB / 2);
  CHECK_OK(tr_save(r.e, ids, hs, NB / 2, 30000));
  loader l = {.r = &r, .rounds = 20};
  pthread_t t;
  REQUIRE(pthread_create(&t, NULL, load_loop, &l) == 0);
  /* Saves of other hashes of the other half's blocks meanwhile. */
  for (int round = 0; round < 20; round++) {
    oi_block_hash more[NB / 2];
    int64_t mids[NB / 2];
    for (int i = 0; i < NB / 2; i++) {
      mids[i] = NB / 2 + i;
      more[i] = tr_hash(1000 + (uint64_t)(round * NB + i), 14, 0x6d);
    }
    CHECK_OK(tr_save(r.e, mids, more, NB / 2, 30000));
  }
  pthread_join(t, NULL);
  CHECK(l.bad == 0);
  CHECK(tr_engine_stats(r.e).saves_failed == 0);
  crig_close(&r);
}

/* Two arenas (K, V) of 4 NB blocks of BLOCK / 2: block b's arena a holds
 * elem(2 b + a, .). */
typedef struct lrig {
  oi_host *h;
  oi_engine *e;
  uint16_t *mem;
} lrig;

static void lrig_open(lrig *r) {
  r->h = tr_host(16u << 20);
  r->mem = calloc(2 * 4 * NB, BLOCK / 2);
  REQUIRE(r->mem);
  for (uint64_t a = 0; a < 2; a++)
    for (uint64_t b = 0; b < NB; b++)
      for (uint64_t i = 0; i < BLOCK / 4; i++)
        r->mem[(a * 4 * NB + b) * (BLOCK / 4) + i] = elem(2 * b + a, i);
  oi_arena_desc ad[2];
  tr_layers(ad, 2, tr_layer_names, (uint8_t *)r->mem, 4 * NB, BLOCK / 2);
  oi_engine_options o = tr_engine_options("codec-layers-fault", ad, 2);
  o.codec = "lossless";
  r->e = tr_engine_new(r->h, &o);
}

static oi_status save_arena(lrig *r, const int64_t *ids, const oi_block_hash *hs, size_t n,
                            uint32_t a) {
  oi_save_options so;
  REQUIRE(oi_save_options_init(&so) == OI_OK);
  so.arena_first = a;
  so.arena_count = 1;
  oi_ticket *t = NULL;
  oi_status st = oi_engine_save(r->e, ids, hs, n, &so, &t);
  if (st != OI_OK) return st;
  st = oi_ticket_wait(t, 30000);
  oi_ticket_release(t);
  return st;
}

/* Device block `at` holds block b's bytes (both arenas). */
static bool lrig_same(const lrig *r, uint64_t b, uint64_t at) {
  for (uint64_t a = 0; a < 2; a++)
    if (memcmp(r->mem + (a * 4 * NB + at) * (BLOCK / 4), r->mem + (a * 4 * NB + b) * (BLOCK / 4),
               BLOCK / 2) != 0)
      return false;
  return true;
}

static void test_layerwise_copy_fails(void) {
  lrig r;
  lrig_open(&r);
  oi_block_hash hs[NB];
  int64_t ids[NB], dst[NB];
  hashes(hs, ids, 0, 8);
  CHECK_OK(save_arena(&r, ids, hs, 8, 0));
  CHECK(tr_host_stats(r.h).blocks_in_flight == 8);
  REQUIRE(oi__fault_arm(OI_FAULT_COPY_FAIL, 0, 1, 0) == OI_OK);
  CHECK_ST(save_arena(&r, ids, hs, 8, 1), OI_ERR_IO);
  oi__fault_disarm_all();
  CHECK_OK(oi_engine_flush(r.e, 10000));
  oi_host_stats hst = tr_host_stats(r.h);
  CHECK(hst.blocks_in_flight == 0 && hst.blocks_sealed == 0);
  oi_engine_stats es = tr_engine_stats(r.e);
  CHECK(es.saves_failed == 8 && es.saves_completed == 0 && es.saves_not_encoded == 0);
  oi_query_result q;
  CHECK_OK(tr_query(r.e, NULL, hs, 8, 0, NULL, &q));
  CHECK(q.hit_blocks == 0);
  /* Again, cleanly: sealed, loaded byte-exact. */
  CHECK_OK(save_arena(&r, ids, hs, 8, 1));
  CHECK_OK(save_arena(&r, ids, hs, 8, 0));
  CHECK(tr_host_stats(r.h).blocks_sealed == 8);
  CHECK_OK(tr_query(r.e, NULL, hs, 8, 0, NULL, &q));
  REQUIRE(q.hit_blocks == 8);
  for (int i = 0; i < 8; i++)
    dst[i] = NB + i;
  CHECK_OK(tr_load(r.e, q.lease, dst, 8, 30000));
  for (int i = 0; i < 8; i++)
    CHECK(lrig_same(&r, (uint64_t)i, (uint64_t)dst[i]));
  /* A layered load whose first arena's copies fail: no arena is reported
   * landed, the load fails, the frames stay. */
  CHECK_OK(tr_query(r.e, NULL, hs, 8, 0, NULL, &q));
  REQUIRE(q.hit_blocks == 8);
  oi_load_options lo;
  CHECK_OK(oi_load_options_init(&lo));
  lo.flags = OI_LOAD_ARENA_EVENTS;
  oi_ticket *t = NULL;
  REQUIRE(oi__fault_arm(OI_FAULT_COPY_FAIL, 0, 1, 0) == OI_OK);
  CHECK_OK(oi_engine_load(r.e, q.lease, dst, 8, &lo, &t));
  CHECK_ST(oi_ticket_arena_wait(t, 0, 30000), OI_ERR_IO);
  CHECK_ST(oi_ticket_arena_wait(t, 1, 30000), OI_ERR_IO);
  CHECK_ST(oi_ticket_wait(t, 30000), OI_ERR_IO);
  oi_ticket_release(t);
  oi__fault_disarm_all();
  oi_engine_destroy(r.e);
  oi_host_destroy(r.h);
  free(r.mem);
}

int main(void) {
  if (!oi__fault_available()) TEST_SKIP("built without -Dfault_injection=true");
  RUN_TEST(test_bounce_cannot_be_made);
  RUN_TEST(test_save_copy_fails);
  RUN_TEST(test_load_copy_fails);
  RUN_TEST(test_saves_and_loads_at_once);
  RUN_TEST(test_layerwise_copy_fails);
  TEST_EXIT();
}
