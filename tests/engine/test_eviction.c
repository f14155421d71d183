/* Eviction and memory: a full pool evicts least-recently-used blocks for new
 * saves; leased, in-flight and loading blocks survive; a save that cannot get
 * memory is dropped and counted and never blocks; used + free == capacity. */
#include <stdatomic.h>
#include <stddef.h>

#include "engine_testutil.h"

#define SEED 0xE71C7ull
#define NB 64        /* device blocks per engine */
#define SRC_SLOTS 48 /* blocks 0..47 are save sources, 48..63 load destinations */

/* 2 arenas x 32 KiB = 64 KiB blocks; 256 KiB chunks; 1 MiB pool: 16 blocks. */
#define BLOCK_BYTES (64u << 10)
#define CHUNK_BYTES (256u << 10)
#define POOL_BYTES (1u << 20)
#define K ((int)(POOL_BYTES / BLOCK_BYTES))

static etu_layout L;

/* Saves hash hs from source slot (i % SRC_SLOTS) with content key `key`, one
 * block, and waits (so the save order is the LRU order). */
static void save_one(oi_engine *e, oi_block_hash hs, uint64_t key, int64_t slot) {
  etu_fill_block(&L, slot, key, SEED);
  CHECK_OK(etu_save_wait(e, &slot, &hs, 1));
  CHECK_OK(oi_engine_flush(e, UINT32_MAX));
}

/* Queries one hash; when present, loads it into `dst` and checks its bytes. */
static bool load_and_check(oi_engine *e, oi_block_hash hs, uint64_t key, int64_t dst,
                           const char *what) {
  oi_query_result q;
  CHECK_OK(etu_query(e, NULL, &hs, 1, &q));
  if (q.hit_blocks != 1) return false;
  etu_zero_block(&L, dst);
  CHECK_OK(etu_load_wait(e, q.lease, &dst, 1));
  return etu_block_matches(&L, dst, key, SEED, what);
}

/* Background eviction off (high watermark 1.0): only saves evict, so which
 * blocks survive is exact. */
static oi_host *small_host(void) {
  oi_host *h = etu_host_create_wm(POOL_BYTES, CHUNK_BYTES, 0, 1.0f, 1.0f);
  oi_host_stats s = etu_host_stats(h);
  CHECK(s.capacity_bytes == POOL_BYTES);
  CHECK(s.used_bytes == 0);
  CHECK(s.free_bytes == POOL_BYTES);
  CHECK(s.blocks_sealed == 0);
  return h;
}

static void test_a_full_pool_evicts_least_recently_used_blocks(void) {
  oi_host *h = small_host();
  oi_engine *e = etu_engine_create(h, &L, "lru", 1);
  REQUIRE(L.block_bytes == BLOCK_BYTES);
  enum { NA = K, NBB = K / 2, TOTAL = NA + NBB };
  oi_block_hash A[NA], B[NBB];
  for (int i = 0; i < NA; i++) {
    A[i] = etu_hash(1, (uint64_t)i);
    save_one(e, A[i], 1000 + (uint64_t)i, i % SRC_SLOTS);
    oi_host_stats s = etu_host_stats(h);
    CHECK(etu_accounting_ok(&s));
  }
  oi_host_stats s = etu_host_stats(h);
  CHECK(s.blocks_sealed == K);
  CHECK(s.evictions == 0);
  CHECK(s.saves_dropped == 0);
  /* Touch A0: now the most recently used of the A blocks. */
  oi_query_result q;
  CHECK_OK(etu_query(e, NULL, &A[0], 1, &q));
  CHECK(q.hit_blocks == 1);
  CHECK_OK(oi_engine_release(e, q.lease));
  for (int i = 0; i < NBB; i++) {
    B[i] = etu_hash(2, (uint64_t)i);
    save_one(e, B[i], 2000 + (uint64_t)i, (NA + i) % SRC_SLOTS);
    oi_host_stats st = etu_host_stats(h);
    CHECK(etu_accounting_ok(&st));
  }
  /* Use order, oldest first: A1..A(K-1), A0, B0..B(K/2-1). What survives must
   * be a suffix of it (LRU), and contain every B and A0. */
  oi_block_hash order[TOTAL];
  uint64_t keys[TOTAL];
  int n = 0;
  for (int i = 1; i < NA; i++)
    order[n] = A[i], keys[n++] = 1000 + (uint64_t)i;
  order[n] = A[0], keys[n++] = 1000;
  for (int i = 0; i < NBB; i++)
    order[n] = B[i], keys[n++] = 2000 + (uint64_t)i;
  uint8_t present[TOTAL];
  int64_t count = etu_membership(e, order, TOTAL, present);
  int first = -1;
  bool suffix = true;
  for (int i = 0; i < TOTAL; i++) {
    if (present[i] && first < 0) first = i;
    if (first >= 0 && !present[i]) suffix = false;
  }
  if (!suffix) {
    fprintf(stderr, "  survivors (oldest use first): ");
    for (int i = 0; i < TOTAL; i++)
      fprintf(stderr, "%d", present[i]);
    fprintf(stderr, "\n");
  }
  CHECK(suffix);
  CHECK(count == K);           /* exactly the K most recently used */
  CHECK(present[NA - 1] == 1); /* A0 */
  s = etu_host_stats(h);
  CHECK(s.evictions == (uint64_t)(TOTAL - count));
  CHECK(s.blocks_sealed == (uint64_t)count);
  CHECK(s.saves_dropped == 0);
  CHECK(etu_accounting_ok(&s));
  /* Survivors, old and new, hold their own bytes (no slot was reused under them). */
  for (int i = 0; i < TOTAL; i++)
    if (present[i]) CHECK(load_and_check(e, order[i], keys[i], SRC_SLOTS + (i % 16), "survivor"));
  oi_engine_destroy(e);
  oi_host_destroy(h);
}

static void test_leased_blocks_survive_eviction_pressure(void) {
  oi_host *h = small_host();
  oi_engine *e = etu_engine_create(h, &L, "pressure", 1);
  oi_block_hash A[4];
  int64_t ids[4] = {0, 1, 2, 3};
  for (int i = 0; i < 4; i++) {
    A[i] = etu_hash(3, (uint64_t)i);
    etu_fill_block(&L, i, 3000 + (uint64_t)i, SEED);
  }
  CHECK_OK(etu_save_wait(e, ids, A, 4));
  CHECK_OK(oi_engine_flush(e, UINT32_MAX));
  oi_query_result lease;
  CHECK_OK(etu_query(e, NULL, A, 4, &lease));
  CHECK(lease.hit_blocks == 4);
  /* 2K new blocks in batches of 4 through a pool of K. */
  oi_block_hash C[2 * K];
  for (int b = 0; b < 2 * K / 4; b++) {
    int64_t src[4];
    for (int j = 0; j < 4; j++) {
      int i = 4 * b + j;
      C[i] = etu_hash(4, (uint64_t)i);
      src[j] = 4 + (i % (SRC_SLOTS - 4));
      etu_fill_block(&L, src[j], 4000 + (uint64_t)i, SEED);
    }
    CHECK_OK(etu_save_wait(e, src, &C[4 * b], 4));
    CHECK_OK(oi_engine_flush(e, UINT32_MAX));
    oi_host_stats s = etu_host_stats(h);
    CHECK(etu_accounting_ok(&s));
    CHECK(s.blocks_leased == 4);
  }
  oi_host_stats s = etu_host_stats(h);
  CHECK(s.evictions >= 2 * K + 4 - K);
  CHECK(s.saves_dropped == 0);
  uint8_t present[4];
  CHECK(etu_membership(e, A, 4, present) == 4);
  /* The newest batch is there too, and correct. */
  oi_query_result q;
  CHECK_OK(etu_query(e, NULL, &C[2 * K - 4], 4, &q));
  CHECK(q.hit_blocks == 4);
  int64_t dst[4] = {60, 61, 62, 63};
  CHECK_OK(etu_load_wait(e, q.lease, dst, 4));
  for (int j = 0; j < 4; j++)
    CHECK(etu_block_matches(&L, dst[j], 4000 + (uint64_t)(2 * K - 4 + j), SEED, "newest"));
  /* The leased blocks load byte-exact after all that pressure. */
  int64_t dst2[4] = {52, 53, 54, 55};
  CHECK_OK(etu_load_wait(e, lease.lease, dst2, 4));
  for (int j = 0; j < 4; j++)
    CHECK(etu_block_matches(&L, dst2[j], 3000 + (uint64_t)j, SEED, "leased"));
  oi_engine_destroy(e);
  oi_host_destroy(h);
}

/* A pin leaves its block on the LRU list (index.c): eviction unlinks the
 * pinned blocks it meets at the tail and evicts the least recently used
 * blocks behind them, exactly; the release that unpins them makes them the
 * most recently used. */
static void test_pinned_blocks_at_the_lru_tail_are_skipped_in_order(void) {
  oi_host *h = small_host();
  oi_engine *e = etu_engine_create(h, &L, "pinned-tail", 1);
  oi_block_hash A[K], B[4], C[4];
  for (int i = 0; i < K; i++) {
    A[i] = etu_hash(16, (uint64_t)i);
    save_one(e, A[i], 16000 + (uint64_t)i, i % SRC_SLOTS);
  }
  oi_query_result lease; /* the four oldest, pinned at the tail */
  CHECK_OK(etu_query(e, NULL, A, 4, &lease));
  CHECK(lease.hit_blocks == 4);
  int64_t src[4] = {0, 1, 2, 3};
  for (int j = 0; j < 4; j++) {
    B[j] = etu_hash(17, (uint64_t)j);
    C[j] = etu_hash(18, (uint64_t)j);
    etu_fill_block(&L, src[j], 17000 + (uint64_t)j, SEED);
  }
  CHECK_OK(etu_save_wait(e, src, B, 4));
  CHECK_OK(oi_engine_flush(e, UINT32_MAX));
  oi_host_stats s = etu_host_stats(h);
  CHECK(s.saves_dropped == 0);
  CHECK(s.evictions == 4);
  CHECK(etu_accounting_ok(&s));
  CHECK_OK(oi_engine_release(e, lease.lease)); /* A0..A3: now the most recent */
  for (int j = 0; j < 4; j++)
    etu_fill_block(&L, src[j], 18000 + (uint64_t)j, SEED);
  CHECK_OK(etu_save_wait(e, src, C, 4));
  CHECK_OK(oi_engine_flush(e, UINT32_MAX));
  uint8_t present[K];
  CHECK(etu_membership(e, A, K, present) == K - 8);
  for (int i = 0; i < K; i++) {
    bool want = i < 4 || i >= 12; /* A4..A7 went for B, A8..A11 for C */
    if (present[i] != want) {
      fprintf(stderr, "  A%d: present %d, expected %d\n", i, present[i], want);
      oi_test_failures++;
    }
  }
  uint8_t p4[4];
  CHECK(etu_membership(e, B, 4, p4) == 4);
  CHECK(etu_membership(e, C, 4, p4) == 4);
  for (int i = 0; i < 4; i++)
    CHECK(load_and_check(e, A[i], 16000 + (uint64_t)i, SRC_SLOTS + i, "pinned at the tail"));
  s = etu_host_stats(h);
  CHECK(s.evictions == 8);
  CHECK(s.saves_dropped == 0);
  CHECK(etu_accounting_ok(&s));
  oi_engine_destroy(e);
  oi_host_destroy(h);
}

typedef struct done_flag {
  atomic_int calls;
  atomic_int st;
} done_flag;

static void on_done(void *ctx, oi_status st) {
  done_flag *d = ctx;
  atomic_store(&d->st, st);
  atomic_fetch_add(&d->calls, 1);
}

static void test_saves_without_memory_are_dropped_and_counted(void) {
  oi_host *h = small_host();
  oi_engine *e = etu_engine_create(h, &L, "dropped", 1);
  enum { MAXH = 8 * K };
  oi_block_hash hs[MAXH];
  uint64_t keys[MAXH];
  oi_lease leases[MAXH];
  bool leased[MAXH];
  int nh = 0, nleases = 0;
  memset(leased, 0, sizeof leased);
  uint64_t dropped0 = etu_host_stats(h).saves_dropped;
  /* Lease every sealed block, then offer K more; repeat until saves drop. */
  int round = 0;
  for (; round < 6; round++) {
    for (int i = 0; i < nh; i++) {
      if (leased[i]) continue;
      oi_query_result q;
      CHECK_OK(etu_query(e, NULL, &hs[i], 1, &q));
      if (q.hit_blocks == 1) {
        leases[i] = q.lease;
        leased[i] = true;
        nleases++;
      }
    }
    int64_t src[K];
    for (int j = 0; j < (int)K; j++) {
      REQUIRE(nh < MAXH);
      hs[nh] = etu_hash(5, (uint64_t)nh);
      keys[nh] = 5000 + (uint64_t)nh;
      src[j] = j % SRC_SLOTS;
      etu_fill_block(&L, src[j], keys[nh], SEED);
      nh++;
    }
    oi_ticket *t = NULL;
    CHECK_OK(oi_engine_save(e, src, &hs[nh - K], K, NULL, &t));
    CHECK(oi_ticket_wait(t, 10000) == OI_OK); /* never blocks forever */
    oi_ticket_release(t);
    CHECK_OK(oi_engine_flush(e, 10000));
    oi_host_stats s = etu_host_stats(h);
    CHECK(etu_accounting_ok(&s));
    if (s.saves_dropped > dropped0) break;
  }
  CHECK(etu_host_stats(h).saves_dropped > dropped0);
  fprintf(stderr, "  (drops began in round %d with %d leases)\n", round, nleases);

  /* Lease whatever else got in, so every sealed block is pinned. */
  for (int i = 0; i < nh; i++) {
    if (leased[i]) continue;
    oi_query_result q;
    CHECK_OK(etu_query(e, NULL, &hs[i], 1, &q));
    if (q.hit_blocks == 1) leases[i] = q.lease, leased[i] = true, nleases++;
  }
  oi_host_stats s = etu_host_stats(h);
  CHECK(s.blocks_sealed == (uint64_t)nleases);
  CHECK(s.blocks_leased == (uint64_t)nleases);
  CHECK(s.leases_active == (uint64_t)nleases);
  uint64_t evicted = 77;
  CHECK_OK(oi_host_evict_all(h, &evicted));
  CHECK(evicted == 0);

  /* Now a save gets no memory: dropped, counted, OK, fast, invisible. */
  if (s.blocks_free == 0 && s.free_bytes < CHUNK_BYTES) {
    oi_block_hash nh4[4];
    int64_t src[4] = {0, 1, 2, 3};
    for (int j = 0; j < 4; j++) {
      nh4[j] = etu_hash(6, (uint64_t)j);
      etu_fill_block(&L, src[j], 6000 + (uint64_t)j, SEED);
    }
    done_flag df = {0, 12345};
    oi_save_options so;
    CHECK_OK(oi_save_options_init(&so));
    so.on_done = on_done;
    so.on_done_ctx = &df;
    oi_ticket *t = NULL;
    double t0 = etu_now_s();
    CHECK_OK(oi_engine_save(e, src, nh4, 4, &so, &t));
    CHECK(oi_ticket_wait(t, 10000) == OI_OK);
    oi_ticket_release(t);
    CHECK(etu_now_s() - t0 < 5.0);
    CHECK_OK(oi_engine_flush(e, 10000));
    for (int i = 0; i < 500 && atomic_load(&df.calls) == 0; i++)
      etu_sleep_ms(10);
    CHECK(atomic_load(&df.calls) == 1 && atomic_load(&df.st) == OI_OK);
    oi_host_stats s2 = etu_host_stats(h);
    CHECK(s2.saves_dropped == s.saves_dropped + 4);
    CHECK(s2.saves_completed == s.saves_completed);
    CHECK(s2.blocks_sealed == s.blocks_sealed);
    CHECK(etu_engine_stats(e).saves_pending == 0);
    uint8_t present[4];
    CHECK(etu_membership(e, nh4, 4, present) == 0);
  } else {
    fprintf(stderr,
            "  note: %" PRIu64 " free slots / %" PRIu64 " free bytes left with everything "
            "leased; exact drop check skipped\n",
            s.blocks_free, s.free_bytes);
  }

  /* Every leased block is intact. */
  for (int i = 0; i < nh; i++) {
    if (!leased[i]) continue;
    int64_t dst = SRC_SLOTS + (i % 16);
    etu_zero_block(&L, dst);
    CHECK_OK(etu_load_wait(e, leases[i], &dst, 1));
    CHECK(etu_block_matches(&L, dst, keys[i], SEED, "leased while full"));
  }
  s = etu_host_stats(h);
  CHECK(s.leases_active == 0); /* each load consumed its lease's only share */
  CHECK(s.blocks_leased == 0);

  /* With the pins gone, saves get memory again by evicting. */
  oi_block_hash more[4];
  int64_t src[4] = {4, 5, 6, 7};
  for (int j = 0; j < 4; j++) {
    more[j] = etu_hash(7, (uint64_t)j);
    etu_fill_block(&L, src[j], 7000 + (uint64_t)j, SEED);
  }
  oi_host_stats before = etu_host_stats(h);
  CHECK_OK(etu_save_wait(e, src, more, 4));
  CHECK_OK(oi_engine_flush(e, UINT32_MAX));
  oi_host_stats after = etu_host_stats(h);
  CHECK(after.saves_completed == before.saves_completed + 4);
  CHECK(after.saves_dropped == before.saves_dropped);
  for (int j = 0; j < 4; j++)
    CHECK(load_and_check(e, more[j], 7000 + (uint64_t)j, 56 + j, "after unpin"));
  CHECK(etu_accounting_ok(&after));
  oi_engine_destroy(e);
  oi_host_destroy(h);
}

/* Blocks being saved or loaded are pinned: evict_all and a flood of new saves
 * racing with them neither hide nor overwrite them. A save whose ticket is
 * still pending after evict_all returned was in flight for all of it, so it
 * must be visible once sealed. */
static void test_in_flight_and_loading_blocks_survive_eviction(void) {
  enum { Q = 48 };
  etu_layout BL;
  etu_layout_simple(&BL, 2, 40, 512 << 10);                          /* 1 MiB blocks */
  oi_host *h = etu_host_create_wm(64 << 20, 4 << 20, 0, 1.0f, 1.0f); /* 64 slots */
  oi_engine *e = etu_engine_create(h, &BL, "pinned", 1);
  oi_block_hash flood[16];
  int64_t dst[8], fids[16];
  for (int i = 0; i < 8; i++) {
    dst[i] = 39 - i;
    etu_fill_block(&BL, i, 8000 + (uint64_t)i, SEED);
  }
  for (int i = 0; i < 16; i++) {
    fids[i] = 8 + i;
    etu_fill_block(&BL, fids[i], 9000 + (uint64_t)i, SEED);
  }
  int conclusive = 0;
  for (int round = 0; round < 5; round++) {
    /* In flight: a queue of single-block saves, evict_all right behind it. */
    oi_block_hash hs[Q];
    oi_ticket *t[Q];
    bool pending[Q];
    for (int i = 0; i < Q; i++) {
      int64_t src = i % 8;
      hs[i] = etu_hash(8 + (uint64_t)round, (uint64_t)i);
      CHECK_OK(oi_engine_save(e, &src, &hs[i], 1, NULL, &t[i]));
    }
    uint64_t ev = 0;
    CHECK_OK(oi_host_evict_all(h, &ev));
    for (int i = 0; i < Q; i++)
      pending[i] = oi_ticket_poll(t[i]) == OI_PENDING;
    for (int i = 0; i < Q; i++)
      CHECK_OK(etu_ticket_finish(t[i]));
    CHECK_OK(oi_engine_flush(e, UINT32_MAX));
    uint8_t present[Q];
    int64_t n_present = etu_membership(e, hs, Q, present);
    CHECK(n_present + (int64_t)ev == Q); /* evicted by evict_all (then sealed), or kept */
    for (int i = 0; i < Q; i++) {
      conclusive += pending[i];
      if (pending[i] && !present[i]) {
        fprintf(stderr, "  round %d: save %d was in flight during evict_all and is gone\n", round,
                i);
        oi_test_failures++;
      }
    }
    /* Loading: evict everything and flood the pool while a load copies. */
    oi_block_hash pick[8];
    uint64_t keys[8];
    int np = 0;
    for (int i = 0; i < Q && np < 8; i++)
      if (present[i]) pick[np] = hs[i], keys[np++] = 8000 + (uint64_t)(i % 8);
    oi_query_result q;
    CHECK_OK(etu_query(e, NULL, pick, (size_t)np, &q));
    CHECK(q.hit_blocks == (uint64_t)np);
    if (np > 0 && q.hit_blocks == (uint64_t)np) {
      oi_ticket *lt = NULL, *ft = NULL;
      CHECK_OK(oi_engine_load(e, q.lease, dst, (size_t)np, NULL, &lt));
      CHECK_OK(oi_host_evict_all(h, &ev));
      oi_block_hash fl[16];
      for (int i = 0; i < 16; i++)
        fl[i] = etu_hash(20 + (uint64_t)round, (uint64_t)i);
      memcpy(flood, fl, sizeof flood);
      CHECK_OK(oi_engine_save(e, fids, flood, 16, NULL, &ft));
      CHECK_OK(etu_ticket_finish(lt));
      CHECK_OK(etu_ticket_finish(ft));
      for (int i = 0; i < np; i++)
        CHECK(etu_block_matches(&BL, dst[i], keys[i], SEED, "loading"));
      for (int i = 0; i < np; i++)
        etu_zero_block(&BL, dst[i]);
    }
    CHECK_OK(oi_engine_flush(e, UINT32_MAX));
    CHECK_OK(oi_host_evict_all(h, &ev));
    oi_host_stats s = etu_host_stats(h);
    CHECK(s.blocks_sealed == 0);
    CHECK(etu_accounting_ok(&s));
  }
  fprintf(stderr, "  (%d of %d saves were still in flight when evict_all returned)\n", conclusive,
          5 * Q);
  CHECK(conclusive > 0);
  oi_engine_destroy(e);
  oi_host_destroy(h);
  etu_layout_free(&BL);
}

static void test_pool_accounting_and_evict_all(void) {
  oi_host *h = small_host();
  oi_engine *e = etu_engine_create(h, &L, "acct", 1);
  oi_block_hash hs[6];
  int64_t ids[6] = {0, 1, 2, 3, 4, 5};
  for (int i = 0; i < 6; i++) {
    hs[i] = etu_hash(10, (uint64_t)i);
    etu_fill_block(&L, i, 10000 + (uint64_t)i, SEED);
  }
  CHECK_OK(etu_save_wait(e, ids, hs, 6));
  CHECK_OK(oi_engine_flush(e, UINT32_MAX));
  oi_host_stats s = etu_host_stats(h);
  CHECK(etu_accounting_ok(&s));
  CHECK(s.size_classes == 1);
  CHECK(s.blocks_sealed == 6);
  CHECK(s.block_bytes_resident == 6ull * BLOCK_BYTES);
  CHECK(s.used_bytes >= 6ull * BLOCK_BYTES);
  /* host.h: used_bytes are "bytes in chunks carved for a size class". */
  CHECK(s.used_bytes % CHUNK_BYTES == 0);
  CHECK(s.blocks_free == s.used_bytes / BLOCK_BYTES - 6);
  CHECK(s.saves_submitted == 6 && s.saves_completed == 6);
  CHECK(s.bytes_saved == 6ull * BLOCK_BYTES);
  /* Lease two; evict_all takes the other four. */
  oi_query_result q;
  CHECK_OK(etu_query(e, NULL, hs, 2, &q));
  uint64_t ev = 0;
  CHECK_OK(oi_host_evict_all(h, &ev));
  CHECK(ev == 4);
  s = etu_host_stats(h);
  CHECK(s.blocks_sealed == 2 && s.blocks_leased == 2);
  CHECK(s.evictions == 4);
  CHECK(s.block_bytes_resident == 2ull * BLOCK_BYTES);
  CHECK(etu_accounting_ok(&s));
  CHECK_OK(oi_engine_release(e, q.lease));
  CHECK_OK(oi_host_evict_all(h, NULL)); /* count is optional */
  s = etu_host_stats(h);
  CHECK(s.blocks_sealed == 0 && s.blocks_leased == 0 && s.block_bytes_resident == 0);
  CHECK(s.evictions == 6);
  CHECK(etu_accounting_ok(&s));
  /* A newer caller's larger stats struct gets the fields this library has;
   * its tail stays untouched. A struct smaller than the 0.1 layout is
   * refused. */
  struct {
    oi_host_stats s;
    uint8_t guard[8];
  } big;
  memset(&big, 0xEE, sizeof big);
  big.s.struct_size = (uint32_t)sizeof big;
  CHECK_OK(oi_host_get_stats(h, &big.s));
  CHECK(big.s.capacity_bytes == POOL_BYTES);
  CHECK(big.s.struct_size == sizeof big);
  bool untouched = true;
  for (size_t i = 0; i < sizeof big.guard; i++)
    untouched &= big.guard[i] == 0xEE;
  CHECK(untouched);
  memset(&big, 0xEE, sizeof big);
  big.s.struct_size = (uint32_t)offsetof(oi_host_stats, used_bytes);
  CHECK_FAILS(oi_host_get_stats(h, &big.s), OI_ERR_INVALID_ARGUMENT);
  CHECK(big.s.capacity_bytes == 0xEEEEEEEEEEEEEEEEull);
  oi_engine_destroy(e);
  oi_host_destroy(h);
}

static void test_two_block_sizes_share_one_pool(void) {
  oi_host *h = etu_host_create_opts(4 << 20, 256 << 10, 0);
  etu_layout S;
  etu_layout_simple(&S, 2, NB, 4096); /* 8 KiB blocks */
  oi_engine *big = etu_engine_create(h, &L, "size-64k", 1);
  oi_engine *small = etu_engine_create(h, &S, "size-8k", 1);
  oi_block_hash hb[4], hsm[4];
  int64_t ids[4] = {0, 1, 2, 3}, dst[4] = {60, 61, 62, 63};
  for (int i = 0; i < 4; i++) {
    hb[i] = etu_hash(11, (uint64_t)i);
    hsm[i] = etu_hash(11, (uint64_t)i); /* same hashes, other namespace */
    etu_fill_block(&L, i, 11000 + (uint64_t)i, SEED);
    etu_fill_block(&S, i, 12000 + (uint64_t)i, SEED);
  }
  CHECK_OK(etu_save_wait(big, ids, hb, 4));
  CHECK_OK(etu_save_wait(small, ids, hsm, 4));
  CHECK_OK(oi_engine_flush(big, UINT32_MAX));
  CHECK_OK(oi_engine_flush(small, UINT32_MAX));
  oi_host_stats s = etu_host_stats(h);
  CHECK(s.size_classes == 2);
  CHECK(s.blocks_sealed == 8);
  CHECK(s.block_bytes_resident == 4ull * BLOCK_BYTES + 4ull * 8192);
  CHECK(etu_accounting_ok(&s));
  oi_query_result q;
  CHECK_OK(etu_query(big, NULL, hb, 4, &q));
  CHECK(q.hit_blocks == 4);
  CHECK_OK(etu_load_wait(big, q.lease, dst, 4));
  CHECK_OK(etu_query(small, NULL, hsm, 4, &q));
  CHECK(q.hit_blocks == 4);
  CHECK_OK(etu_load_wait(small, q.lease, dst, 4));
  for (int i = 0; i < 4; i++) {
    CHECK(etu_block_matches(&L, dst[i], 11000 + (uint64_t)i, SEED, "64 KiB class"));
    CHECK(etu_block_matches(&S, dst[i], 12000 + (uint64_t)i, SEED, "8 KiB class"));
    etu_zero_block(&L, dst[i]);
  }
  oi_engine_destroy(big);
  oi_engine_destroy(small);
  oi_host_destroy(h);
  etu_layout_free(&S);
}

/* With the default watermarks, a pool filled past 95% is brought back to
 * 90% in the background, least recently used blocks first. */
static void test_background_eviction_restores_the_low_watermark(void) {
  oi_host *h = etu_host_create_opts(POOL_BYTES, CHUNK_BYTES, 0);
  oi_engine *e = etu_engine_create(h, &L, "background", 1);
  oi_block_hash hs[K];
  for (int i = 0; i < K; i++) {
    hs[i] = etu_hash(15, (uint64_t)i);
    save_one(e, hs[i], 15000 + (uint64_t)i, i % SRC_SLOTS);
  }
  oi_host_stats s = etu_host_stats(h);
  for (int i = 0; i < 200 && s.block_bytes_resident > POOL_BYTES * 90 / 100; i++) {
    etu_sleep_ms(10);
    s = etu_host_stats(h);
  }
  CHECK(s.block_bytes_resident <= POOL_BYTES * 90 / 100);
  CHECK(s.blocks_sealed == (uint64_t)(K * 9 / 10)); /* 14 of 16 */
  CHECK(s.evictions == (uint64_t)(K - K * 9 / 10));
  uint8_t present[K];
  CHECK(etu_membership(e, hs, K, present) == K * 9 / 10);
  CHECK(present[0] == 0 && present[1] == 0); /* the two oldest went */
  for (int i = 2; i < K; i++)
    CHECK(present[i] == 1);
  oi_engine_destroy(e);
  oi_host_destroy(h);
}

/* Chunks carved for one block size must not starve another forever: once the
 * first size's blocks are evicted (here: evict_all empties the pool), a save
 * of another block size gets memory. */
static void test_an_emptied_pool_serves_a_new_block_size(void) {
  oi_host *h = small_host();
  etu_layout S;
  etu_layout_simple(&S, 2, NB, 4096); /* 8 KiB blocks */
  oi_engine *big = etu_engine_create(h, &L, "first-size", 1);
  for (int i = 0; i < 2 * K; i++)
    save_one(big, etu_hash(13, (uint64_t)i), 13000 + (uint64_t)i, i % SRC_SLOTS);
  uint64_t ev = 0;
  CHECK_OK(oi_host_evict_all(h, &ev));
  oi_host_stats s = etu_host_stats(h);
  CHECK(s.blocks_sealed == 0);
  oi_engine *small = etu_engine_create(h, &S, "second-size", 1);
  oi_block_hash hs[4];
  int64_t ids[4] = {0, 1, 2, 3}, dst[4] = {60, 61, 62, 63};
  for (int i = 0; i < 4; i++) {
    hs[i] = etu_hash(14, (uint64_t)i);
    etu_fill_block(&S, i, 14000 + (uint64_t)i, SEED);
  }
  CHECK_OK(etu_save_wait(small, ids, hs, 4));
  CHECK_OK(oi_engine_flush(small, UINT32_MAX));
  oi_host_stats s2 = etu_host_stats(h);
  CHECK(s2.saves_dropped == s.saves_dropped);
  CHECK(s2.saves_completed == s.saves_completed + 4);
  oi_query_result q;
  CHECK_OK(etu_query(small, NULL, hs, 4, &q));
  CHECK(q.hit_blocks == 4);
  if (q.hit_blocks == 4) {
    CHECK_OK(etu_load_wait(small, q.lease, dst, 4));
    for (int i = 0; i < 4; i++)
      CHECK(etu_block_matches(&S, dst[i], 14000 + (uint64_t)i, SEED, "second size"));
  } else if (q.hit_blocks) {
    oi_engine_release(small, q.lease);
  }
  oi_engine_destroy(small);
  oi_engine_destroy(big);
  oi_host_destroy(h);
  etu_layout_free(&S);
}

int main(void) {
  etu_layout_simple(&L, 2, NB, BLOCK_BYTES / 2);
  RUN_TEST(test_a_full_pool_evicts_least_recently_used_blocks);
  RUN_TEST(test_leased_blocks_survive_eviction_pressure);
  RUN_TEST(test_pinned_blocks_at_the_lru_tail_are_skipped_in_order);
  RUN_TEST(test_saves_without_memory_are_dropped_and_counted);
  RUN_TEST(test_in_flight_and_loading_blocks_survive_eviction);
  RUN_TEST(test_pool_accounting_and_evict_all);
  RUN_TEST(test_background_eviction_restores_the_low_watermark);
  RUN_TEST(test_two_block_sizes_share_one_pool);
  RUN_TEST(test_an_emptied_pool_serves_a_new_block_size);
  etu_layout_free(&L);
  TEST_EXIT();
}
