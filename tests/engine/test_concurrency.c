/* 8 engines (ranks) on one host, same namespace, saving / querying / loading
 * concurrently: every loaded block's bytes match, any rank restores what any
 * other rank saved, flush is a barrier, and loads are not stuck behind a long
 * queue of saves.
 *
 * OI_STRESS_SECONDS (default 3) sets the length of the mixed phase. */
#include <stdatomic.h>

#include "engine_testutil.h"

#define RANKS 8
#define NB 64
#define UNIVERSE 1024
#define SEED 0xC0C0ull

static oi_host *host;
static etu_layout shape;
static oi_engine *eng[RANKS];
static etu_layout mem[RANKS];
static pthread_barrier_t barrier;
static double stress_seconds = 3;
static oi_block_hash universe[UNIVERSE];

static uint64_t key_of(const oi_block_hash *h) { return etu_hash_key(h); }

/* ---- phase 1: rank i saves, rank j loads ---------------------------------- */

#define PER_RANK 16
static oi_block_hash private_set[RANKS][PER_RANK];
static atomic_int cross_failures;

static void *cross_rank_main(void *arg) {
  int r = (int)(intptr_t)arg;
  etu_layout *L = &mem[r];
  int64_t ids[PER_RANK];
  for (int i = 0; i < PER_RANK; i++) {
    private_set[r][i] = etu_hash(100 + (uint64_t)r, (uint64_t)i);
    ids[i] = i;
    etu_fill_block(L, i, key_of(&private_set[r][i]), SEED);
  }
  int fails = 0;
  if (etu_save_wait(eng[r], ids, private_set[r], PER_RANK) != OI_OK) fails++;
  if (oi_engine_flush(eng[r], UINT32_MAX) != OI_OK) fails++;
  pthread_barrier_wait(&barrier);
  /* Restore two other ranks' blocks. */
  const int others[2] = {(r + 1) % RANKS, (r + 3) % RANKS};
  for (int k = 0; k < 2; k++) {
    int o = others[k];
    oi_query_result q;
    if (etu_query(eng[r], NULL, private_set[o], PER_RANK, &q) != OI_OK ||
        q.hit_blocks != PER_RANK) {
      fprintf(stderr, "rank %d: rank %d's blocks: %" PRIu64 " of %d hit (%s)\n", r, o, q.hit_blocks,
              PER_RANK, oi_last_error());
      fails++;
      continue;
    }
    int64_t dst[PER_RANK];
    for (int i = 0; i < PER_RANK; i++)
      dst[i] = NB - 1 - i;
    for (int i = 0; i < PER_RANK; i++)
      etu_zero_block(L, dst[i]);
    if (etu_load_wait(eng[r], q.lease, dst, PER_RANK) != OI_OK) fails++;
    for (int i = 0; i < PER_RANK; i++)
      if (!etu_block_matches(L, dst[i], key_of(&private_set[o][i]), SEED, "cross-rank")) fails++;
  }
  atomic_fetch_add(&cross_failures, fails);
  return NULL;
}

static void test_any_rank_restores_what_another_rank_saved(void) {
  pthread_t th[RANKS];
  for (int r = 0; r < RANKS; r++)
    REQUIRE(pthread_create(&th[r], NULL, cross_rank_main, (void *)(intptr_t)r) == 0);
  for (int r = 0; r < RANKS; r++)
    pthread_join(th[r], NULL);
  CHECK(atomic_load(&cross_failures) == 0);
}

/* ---- phase 2: everything at once ---------------------------------------- */

typedef struct rank_stats {
  uint64_t saves, flush_checks, queries, hit_blocks, loads, blocks_verified, failures;
} rank_stats;
static rank_stats rstats[RANKS];
static atomic_bool stop;

static uint64_t rng_next(uint64_t *s) {
  *s ^= *s >> 12;
  *s ^= *s << 25;
  *s ^= *s >> 27;
  return *s * 0x2545F4914F6CDD1Dull;
}

#define RFAIL(r, ...)                                                                              \
  do {                                                                                             \
    fprintf(stderr, "rank %d: ", r);                                                               \
    fprintf(stderr, __VA_ARGS__);                                                                  \
    fprintf(stderr, " (last error: %s)\n", oi_last_error());                                       \
    rstats[r].failures++;                                                                          \
  } while (0)

/* Loads a lease over hashes[0..n) into blocks 48.. and checks the bytes. */
static void load_and_verify(int r, oi_lease lease, const oi_block_hash *hs, uint64_t n,
                            uint64_t *rng) {
  etu_layout *L = &mem[r];
  int64_t dst[16];
  int64_t base = 48 + (int64_t)(rng_next(rng) % 2) * 8; /* two windows of 8 */
  for (uint64_t i = 0; i < n; i++)
    dst[i] = base + (int64_t)((i * 5 + 3) % 8);
  oi_status st = etu_load_wait(eng[r], lease, dst, n);
  if (st != OI_OK) {
    RFAIL(r, "load of %" PRIu64 " leased blocks: %s", n, oi_status_str(st));
    return;
  }
  rstats[r].loads++;
  for (uint64_t i = 0; i < n; i++) {
    if (!etu_block_matches(L, dst[i], key_of(&hs[i]), SEED, "stress load"))
      RFAIL(r, "block %" PRIu64 " of a load has wrong bytes", i);
    else
      rstats[r].blocks_verified++;
  }
}

static void *stress_main(void *arg) {
  int r = (int)(intptr_t)arg;
  etu_layout *L = &mem[r];
  uint64_t rng = etu_mix(0xABCD + (uint64_t)r) | 1;
  uint64_t private_next = 0;
  while (!atomic_load(&stop) && rstats[r].failures < 10) {
    uint64_t pick = rng_next(&rng) % 100;
    if (pick < 40) {
      /* Save a run of the shared universe from blocks 0..7 (waited, so the
       * sources can be rewritten next time). */
      int n = 1 + (int)(rng_next(&rng) % 8), start = (int)(rng_next(&rng) % UNIVERSE);
      int64_t ids[8];
      oi_block_hash hs[8];
      for (int i = 0; i < n; i++) {
        ids[i] = i;
        hs[i] = universe[(start + i) % UNIVERSE];
        etu_fill_block(L, i, key_of(&hs[i]), SEED);
      }
      oi_status st = etu_save_wait(eng[r], ids, hs, (size_t)n);
      if (st != OI_OK) RFAIL(r, "save: %s", oi_status_str(st));
      rstats[r].saves++;
    } else if (pick < 55) {
      /* Flush barrier: blocks only this rank ever saves are all visible after
       * flush, and load back byte-exact. */
      int n = 1 + (int)(rng_next(&rng) % 8);
      int64_t ids[8];
      oi_block_hash hs[8];
      for (int i = 0; i < n; i++) {
        ids[i] = 8 + i;
        hs[i] = etu_hash(1000 + (uint64_t)r, private_next++ % 64); /* bounded: no eviction */
        etu_fill_block(L, 8 + i, key_of(&hs[i]), SEED);
      }
      oi_status st = oi_engine_save(eng[r], ids, hs, (size_t)n, NULL, NULL);
      if (st != OI_OK) RFAIL(r, "save: %s", oi_status_str(st));
      st = oi_engine_flush(eng[r], UINT32_MAX);
      if (st != OI_OK) RFAIL(r, "flush: %s", oi_status_str(st));
      oi_query_result q;
      st = etu_query(eng[r], NULL, hs, (size_t)n, &q);
      if (st != OI_OK || q.hit_blocks != (uint64_t)n) {
        RFAIL(r, "after flush %" PRIu64 " of %d just-saved blocks visible", q.hit_blocks, n);
        if (q.hit_blocks) oi_engine_release(eng[r], q.lease);
      } else {
        load_and_verify(r, q.lease, hs, q.hit_blocks, &rng);
      }
      rstats[r].flush_checks++;
    } else {
      /* Query a run of the shared universe (saved by anyone) and restore it. */
      int n = 1 + (int)(rng_next(&rng) % 8), start = (int)(rng_next(&rng) % UNIVERSE);
      oi_block_hash hs[8];
      for (int i = 0; i < n; i++)
        hs[i] = universe[(start + i) % UNIVERSE];
      oi_query_result q;
      oi_status st = etu_query(eng[r], "stress", hs, (size_t)n, &q);
      if (st != OI_OK) RFAIL(r, "query: %s", oi_status_str(st));
      rstats[r].queries++;
      if (st == OI_OK && q.hit_blocks) {
        rstats[r].hit_blocks += q.hit_blocks;
        if (rng_next(&rng) % 4) {
          load_and_verify(r, q.lease, hs, q.hit_blocks, &rng);
        } else {
          st = oi_engine_release(eng[r], q.lease);
          if (st != OI_OK) RFAIL(r, "release: %s", oi_status_str(st));
        }
      }
    }
  }
  return NULL;
}

static void test_eight_ranks_save_query_and_load_concurrently(void) {
  pthread_t th[RANKS];
  atomic_store(&stop, false);
  for (int r = 0; r < RANKS; r++)
    REQUIRE(pthread_create(&th[r], NULL, stress_main, (void *)(intptr_t)r) == 0);
  double t0 = etu_now_s();
  while (etu_now_s() - t0 < stress_seconds) {
    etu_sleep_ms(50);
    oi_host_stats s = etu_host_stats(host);
    CHECK(etu_accounting_ok(&s));
  }
  atomic_store(&stop, true);
  for (int r = 0; r < RANKS; r++)
    pthread_join(th[r], NULL);
  uint64_t saves = 0, queries = 0, hits = 0, loads = 0, verified = 0, flushes = 0, fails = 0;
  for (int r = 0; r < RANKS; r++) {
    saves += rstats[r].saves;
    queries += rstats[r].queries;
    hits += rstats[r].hit_blocks;
    loads += rstats[r].loads;
    verified += rstats[r].blocks_verified;
    flushes += rstats[r].flush_checks;
    fails += rstats[r].failures;
    CHECK(rstats[r].loads > 0); /* no rank starved */
  }
  fprintf(stderr,
          "  %.1f s: %" PRIu64 " saves, %" PRIu64 " flush barriers, %" PRIu64 " queries (%" PRIu64
          " blocks hit), %" PRIu64 " loads, %" PRIu64 " blocks verified\n",
          stress_seconds, saves, flushes, queries, hits, loads, verified);
  CHECK(fails == 0);
  CHECK(verified > 0);
  for (int r = 0; r < RANKS; r++)
    CHECK_OK(oi_engine_flush(eng[r], UINT32_MAX));
  oi_host_stats s = etu_host_stats(host);
  CHECK(s.evictions == 0); /* precondition of the flush-visibility check */
  CHECK(s.saves_dropped == 0 && s.saves_failed == 0 && s.loads_failed == 0);
  CHECK(s.leases_active == 0);
  CHECK(s.blocks_in_flight == 0);
  CHECK(etu_accounting_ok(&s));
}

/* A rank's save of a hash another rank has in flight is deduplicated; the
 * rank's flush must still leave the hash visible when it returns. */
static void test_flush_covers_a_hash_another_rank_has_in_flight(void) {
  etu_layout big_a, big_b;
  etu_layout_simple(&big_a, 2, 32, 512 << 10); /* 1 MiB blocks */
  etu_layout_clone_shape(&big_b, &big_a);
  oi_host *h = etu_host_create(256 << 20);
  oi_engine *a = etu_engine_create(h, &big_a, "inflight", 1);
  oi_engine *b = etu_engine_create(h, &big_b, "inflight", 1);
  int misses = 0, dedup_in_flight = 0;
  for (int round = 0; round < 4; round++) {
    oi_block_hash hs[32];
    int64_t ids[32];
    for (int i = 0; i < 32; i++) {
      hs[i] = etu_hash(300 + (uint64_t)round, (uint64_t)i);
      ids[i] = i;
      etu_fill_block(&big_a, i, key_of(&hs[i]), SEED);
      etu_fill_block(&big_b, i, key_of(&hs[i]), SEED);
    }
    oi_ticket *ta = NULL;
    CHECK_OK(oi_engine_save(a, ids, hs, 32, NULL, &ta));
    /* b offers the last one while a's copy is (very likely) still running. */
    uint64_t dedup0 = etu_engine_stats(b).saves_deduplicated;
    CHECK_OK(oi_engine_save(b, &ids[31], &hs[31], 1, NULL, NULL));
    bool was_dedup = etu_engine_stats(b).saves_deduplicated > dedup0;
    bool a_pending = oi_ticket_poll(ta) == OI_PENDING;
    CHECK_OK(oi_engine_flush(b, UINT32_MAX));
    oi_query_result q;
    CHECK_OK(etu_query(b, NULL, &hs[31], 1, &q));
    if (was_dedup && a_pending) dedup_in_flight++;
    if (q.hit_blocks != 1)
      misses++;
    else {
      int64_t dst = 0;
      /* a's save still reads big_a; b's block 0 is free to overwrite */
      CHECK_OK(etu_load_wait(b, q.lease, &dst, 1));
      CHECK(etu_block_matches(&big_b, 0, key_of(&hs[31]), SEED, "after dedup flush"));
    }
    CHECK_OK(etu_ticket_finish(ta));
    CHECK_OK(oi_engine_flush(a, UINT32_MAX));
  }
  fprintf(stderr, "  (%d of 4 rounds deduplicated against an in-flight save)\n", dedup_in_flight);
  CHECK(misses == 0);
  oi_engine_destroy(a);
  oi_engine_destroy(b);
  oi_host_destroy(h);
  etu_layout_free(&big_a);
  etu_layout_free(&big_b);
}

/* ---- phase 3: loads overtake queued saves --------------------------------- */

static void test_loads_are_not_stuck_behind_queued_saves(void) {
  enum { BLOCKS = 64 };
  etu_layout L;
  etu_layout_simple(&L, 2, BLOCKS, 512 << 10); /* 1 MiB blocks */
  oi_host *h = etu_host_create(320ull << 20);
  oi_engine *e = etu_engine_create(h, &L, "priority", 1);
  oi_block_hash p = etu_hash(400, 0);
  int64_t zero = 0;
  etu_fill_block(&L, 0, key_of(&p), SEED);
  CHECK_OK(etu_save_wait(e, &zero, &p, 1));
  for (int64_t b = 1; b < BLOCKS; b++)
    etu_fill_block(&L, b, (uint64_t)b, SEED);

  bool conclusive = false;
  for (int attempt = 0, n = 200; attempt < 3 && !conclusive; attempt++, n *= 2) {
    oi_query_result q;
    CHECK_OK(etu_query(e, NULL, &p, 1, &q)); /* leased before the saves are queued */
    CHECK(q.hit_blocks == 1);
    etu_zero_block(&L, 0);
    oi_ticket *last = NULL;
    for (int i = 0; i < n; i++) {
      int64_t src = 1 + i % (BLOCKS - 1);
      oi_block_hash hs = etu_hash(401 + (uint64_t)attempt, (uint64_t)i);
      oi_ticket *t = NULL;
      CHECK_OK(oi_engine_save(e, &src, &hs, 1, NULL, &t));
      oi_ticket_release(last);
      last = t;
    }
    uint64_t in_flight_before = etu_host_stats(h).blocks_in_flight;
    double t0 = etu_now_s();
    oi_ticket *lt = NULL;
    CHECK_OK(oi_engine_load(e, q.lease, &zero, 1, NULL, &lt));
    CHECK_OK(etu_ticket_finish(lt));
    double load_s = etu_now_s() - t0;
    oi_host_stats s = etu_host_stats(h);
    bool saves_pending = oi_ticket_poll(last) == OI_PENDING;
    CHECK(etu_block_matches(&L, 0, key_of(&p), SEED, "priority load"));
    CHECK_OK(etu_ticket_finish(last));
    double drain_s = etu_now_s() - t0;
    CHECK_OK(oi_engine_flush(e, UINT32_MAX));
    fprintf(stderr,
            "  %d saves queued (%" PRIu64 " blocks in flight at load): load took %.1f ms, "
            "still %" PRIu64 " in flight when it finished; queue drained after %.1f ms\n",
            n, in_flight_before, load_s * 1e3, s.blocks_in_flight, drain_s * 1e3);
    if (in_flight_before < 16) continue; /* the queue drained before the load: try more */
    conclusive = true;
    /* Had the load queued behind the saves, every save would have sealed first. */
    CHECK(s.blocks_in_flight > 0);
    if (s.saves_dropped == 0) CHECK(saves_pending);
  }
  if (!conclusive)
    fprintf(stderr, "  note: could not keep a save queue long enough; inconclusive\n");
  oi_engine_destroy(e);
  oi_host_destroy(h);
  etu_layout_free(&L);
}

int main(void) {
  const char *secs = getenv("OI_STRESS_SECONDS");
  if (secs) stress_seconds = atof(secs);
  for (int i = 0; i < UNIVERSE; i++)
    universe[i] = etu_hash(0x5EED, (uint64_t)i);
  /* Split K/V arena + an uneven one: 2 x 4096 + 5096 = 13288-byte blocks. The
   * 64 MiB pool holds the whole universe and every rank's private hashes:
   * nothing is evicted. */
  etu_layout_begin(&shape, 2, NB);
  shape.arenas[0].bytes_per_block = 4096;
  shape.arenas[0].segments = 2;
  shape.arenas[0].segment_stride = 4096;
  shape.arenas[0].block_stride = 8192;
  shape.arenas[1].bytes_per_block = 5096;
  shape.arenas[1].block_stride = 5120;
  shape.offsets[1] = NB * 8192;
  etu_layout_alloc(&shape);
  host = etu_host_create(64 << 20);
  REQUIRE(pthread_barrier_init(&barrier, NULL, RANKS) == 0);
  for (int r = 0; r < RANKS; r++) {
    etu_layout_clone_shape(&mem[r], &shape);
    eng[r] = etu_engine_create(host, &mem[r], "shared", 1);
  }
  RUN_TEST(test_any_rank_restores_what_another_rank_saved);
  RUN_TEST(test_eight_ranks_save_query_and_load_concurrently);
  for (int r = 0; r < RANKS; r++) {
    oi_engine_destroy(eng[r]);
    etu_layout_free(&mem[r]);
  }
  oi_host_destroy(host);
  etu_layout_free(&shape);
  pthread_barrier_destroy(&barrier);
  RUN_TEST(test_flush_covers_a_hash_another_rank_has_in_flight);
  RUN_TEST(test_loads_are_not_stuck_behind_queued_saves);
  TEST_EXIT();
}
