/* 10^5 random operations (save, query, membership, load, release, flush,
 * evict_all, stats) from 4 threads, each with its own engine on one shared
 * host, same namespace, against a reference model: the bytes of hash H are a
 * function of H alone (every rank fills its source block from the hash before
 * saving it), so every completed load must produce exactly those bytes, every
 * live lease must load, and at the end nothing is pinned or leaked.
 *
 * OI_RANDOM_OPS (default 100000) sets the total; OI_SEED the seed. */
#include <stdatomic.h>

#include "engine_testutil.h"

#define THREADS 4
#define NB 48        /* device blocks per engine */
#define UNIVERSE 600 /* hashes */
#define MAX_LEASES 8 /* outstanding per thread */
#define MAX_RUN 8    /* blocks per save / query */
#define WORLD 2      /* lease shares */
#define SEED 0xA11CEull

static oi_host *host;
static etu_layout shape;
static oi_block_hash universe[UNIVERSE];
static uint64_t universe_key[UNIVERSE];
static uint64_t ops_per_thread;
static uint64_t base_seed;

typedef struct held_lease {
  oi_lease lease;
  int n;
  int hash_idx[MAX_RUN];
  int shares;
} held_lease;

/* An operation whose ticket the thread has not waited for yet. */
typedef struct pending_op {
  oi_ticket *t;
  bool is_load;
  int n;
  int64_t ids[MAX_RUN];
  int hash_idx[MAX_RUN];
} pending_op;

typedef struct worker {
  int id;
  etu_layout L;
  oi_engine *e;
  uint64_t rng;
  held_lease leases[MAX_LEASES];
  int nleases;
  pending_op pending[16];
  int npending;
  bool ff_dirty[NB]; /* source of a fire-and-forget save: flush before writing */
  /* tallies */
  uint64_t loads_ok, blocks_loaded, saves, queries, hits, releases, flushes, evicts, mismatches,
      failures, refused_loads;
} worker;

static uint64_t rnd(worker *w) {
  w->rng ^= w->rng >> 12;
  w->rng ^= w->rng << 25;
  w->rng ^= w->rng >> 27;
  return w->rng * 0x2545F4914F6CDD1Dull;
}
static int rnd_below(worker *w, int n) { return (int)(rnd(w) % (uint64_t)n); }

#define WCHECK(w, cond)                                                                            \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      fprintf(stderr, "thread %d: %s:%d: CHECK failed: %s (last error: %s)\n", (w)->id, __FILE__,  \
              __LINE__, #cond, oi_last_error());                                                   \
      (w)->failures++;                                                                             \
    }                                                                                              \
  } while (0)

static void finish_op(worker *w, int i) {
  pending_op *p = &w->pending[i];
  oi_status st = oi_ticket_wait(p->t, UINT32_MAX);
  oi_ticket_release(p->t);
  WCHECK(w, st == OI_OK);
  if (p->is_load && st == OI_OK) {
    for (int j = 0; j < p->n; j++)
      if (!etu_block_matches(&w->L, p->ids[j], universe_key[p->hash_idx[j]], SEED,
                             "deferred load")) {
        w->mismatches++;
        w->failures++;
      }
  }
  w->pending[i] = w->pending[--w->npending];
}

/* Makes block b safe to write: no pending op reads or writes it. */
static void claim_block(worker *w, int64_t b) {
  if (w->ff_dirty[b]) {
    WCHECK(w, oi_engine_flush(w->e, UINT32_MAX) == OI_OK);
    memset(w->ff_dirty, 0, sizeof w->ff_dirty);
  }
  for (int i = w->npending - 1; i >= 0; i--) {
    bool touches = false;
    for (int j = 0; j < w->pending[i].n; j++)
      touches |= w->pending[i].ids[j] == b;
    if (touches) finish_op(w, i);
  }
}

static void pick_distinct_blocks(worker *w, int n, int64_t *ids) {
  for (int j = 0; j < n; j++) {
    bool dup;
    do {
      ids[j] = rnd_below(w, NB);
      dup = false;
      for (int k = 0; k < j; k++)
        dup |= ids[k] == ids[j];
    } while (dup);
  }
}

static void drop_lease(worker *w, int i) { w->leases[i] = w->leases[--w->nleases]; }

static void op_save(worker *w) {
  int n = 1 + rnd_below(w, MAX_RUN), start = rnd_below(w, UNIVERSE);
  int64_t ids[MAX_RUN];
  oi_block_hash hs[MAX_RUN];
  int idx[MAX_RUN];
  pick_distinct_blocks(w, n, ids);
  for (int j = 0; j < n; j++) {
    idx[j] = (start + j) % UNIVERSE;
    hs[j] = universe[idx[j]];
    claim_block(w, ids[j]);
    etu_fill_block(&w->L, ids[j], universe_key[idx[j]], SEED);
  }
  int mode = rnd_below(w, 10);
  if (w->npending == 16) finish_op(w, 0);
  if (mode < 2) { /* fire and forget */
    WCHECK(w, oi_engine_save(w->e, ids, hs, (size_t)n, NULL, NULL) == OI_OK);
    for (int j = 0; j < n; j++)
      w->ff_dirty[ids[j]] = true;
  } else {
    oi_ticket *t = NULL;
    oi_status st = oi_engine_save(w->e, ids, hs, (size_t)n, NULL, &t);
    WCHECK(w, st == OI_OK && t);
    if (st != OI_OK) return;
    if (mode < 5) {
      WCHECK(w, etu_ticket_finish(t) == OI_OK);
    } else {
      pending_op *p = &w->pending[w->npending++];
      p->t = t;
      p->is_load = false;
      p->n = n;
      memcpy(p->ids, ids, sizeof(int64_t) * (size_t)n);
    }
  }
  w->saves++;
}

static void op_query(worker *w) {
  int n = 1 + rnd_below(w, MAX_RUN), start = rnd_below(w, UNIVERSE);
  oi_block_hash hs[MAX_RUN];
  int idx[MAX_RUN];
  for (int j = 0; j < n; j++)
    idx[j] = (start + j) % UNIVERSE, hs[j] = universe[idx[j]];
  w->queries++;
  if (rnd_below(w, 10) == 0) {
    uint8_t present[MAX_RUN];
    memset(present, 0xEE, sizeof present);
    int64_t c = etu_membership(w->e, hs, (size_t)n, present);
    int sum = 0;
    for (int j = 0; j < n; j++) {
      WCHECK(w, present[j] <= 1);
      sum += present[j] == 1;
    }
    WCHECK(w, c == sum);
    return;
  }
  if (w->nleases == MAX_LEASES) {
    WCHECK(w, oi_engine_release(w->e, w->leases[0].lease) == OI_OK);
    drop_lease(w, 0);
    w->releases++;
  }
  oi_query_result q;
  char req[32];
  snprintf(req, sizeof req, "t%d-%d", w->id, start);
  oi_status st = etu_query(w->e, rnd_below(w, 2) ? req : NULL, hs, (size_t)n, &q);
  WCHECK(w, st == OI_OK);
  WCHECK(w, q.state == OI_QUERY_READY);
  WCHECK(w, q.hit_blocks <= (uint64_t)n);
  WCHECK(w, etu_lease_is_zero(q.lease) == (q.hit_blocks == 0));
  if (st != OI_OK || q.hit_blocks == 0) return;
  w->hits += q.hit_blocks;
  held_lease *l = &w->leases[w->nleases++];
  l->lease = q.lease;
  l->n = (int)q.hit_blocks;
  l->shares = WORLD;
  memcpy(l->hash_idx, idx, sizeof(int) * (size_t)l->n);
}

static void op_load(worker *w) {
  if (w->nleases == 0) return;
  int li = rnd_below(w, w->nleases);
  held_lease *l = &w->leases[li];
  int64_t dst[MAX_RUN];
  pick_distinct_blocks(w, l->n, dst);
  for (int j = 0; j < l->n; j++)
    claim_block(w, dst[j]);
  if (w->npending == 16) finish_op(w, 0);
  oi_ticket *t = NULL;
  oi_status st = oi_engine_load(w->e, l->lease, dst, (size_t)l->n, NULL, &t);
  WCHECK(w, st == OI_OK); /* a live lease always loads */
  if (st == OI_OK) {
    w->loads_ok++;
    w->blocks_loaded += (uint64_t)l->n;
    if (rnd_below(w, 10) < 7) {
      oi_status ts = etu_ticket_finish(t);
      WCHECK(w, ts == OI_OK);
      for (int j = 0; j < l->n; j++)
        if (!etu_block_matches(&w->L, dst[j], universe_key[l->hash_idx[j]], SEED, "load")) {
          w->mismatches++;
          w->failures++;
        }
    } else {
      pending_op *p = &w->pending[w->npending++];
      p->t = t;
      p->is_load = true;
      p->n = l->n;
      memcpy(p->ids, dst, sizeof(int64_t) * (size_t)l->n);
      memcpy(p->hash_idx, l->hash_idx, sizeof(int) * (size_t)l->n);
    }
  } else {
    oi_ticket_release(t);
  }
  if (--l->shares == 0) {
    oi_lease gone = l->lease;
    drop_lease(w, li); /* l is dead from here */
    if (rnd_below(w, 4) == 0) {
      /* Its last share is spent (wait for that load first). */
      for (int i = w->npending - 1; i >= 0; i--)
        if (w->pending[i].is_load) finish_op(w, i);
      WCHECK(w, oi_engine_release(w->e, gone) == OI_ERR_LEASE_EXPIRED);
      int64_t d = rnd_below(w, NB);
      claim_block(w, d);
      WCHECK(w, oi_engine_load(w->e, gone, &d, 1, NULL, NULL) == OI_ERR_LEASE_EXPIRED);
      w->refused_loads++; /* counted in loads_failed */
    }
  }
}

static void op_release(worker *w) {
  if (w->nleases == 0) return;
  int li = rnd_below(w, w->nleases);
  WCHECK(w, oi_engine_release(w->e, w->leases[li].lease) == OI_OK);
  drop_lease(w, li);
  w->releases++;
}

static void op_stats(worker *w) {
  oi_host_stats s = etu_host_stats(host);
  /* Other threads run meanwhile: only the invariant promised "always", and
   * no counter may wrap below zero. */
  WCHECK(w, s.used_bytes + s.free_bytes == s.capacity_bytes);
  WCHECK(w, s.blocks_sealed < (1ull << 62) && s.blocks_in_flight < (1ull << 62) &&
                s.blocks_leased < (1ull << 62) && s.blocks_loading < (1ull << 62) &&
                s.leases_active < (1ull << 62) && s.block_bytes_resident < (1ull << 62));
  oi_engine_stats es = etu_engine_stats(w->e);
  WCHECK(w, es.block_bytes == shape.block_bytes);
  WCHECK(w, es.saves_failed == 0 && es.loads_failed == w->refused_loads);
}

static void *worker_main(void *arg) {
  worker *w = arg;
  for (uint64_t i = 0; i < ops_per_thread && w->failures < 20; i++) {
    int r = rnd_below(w, 1000);
    if (r < 350)
      op_save(w);
    else if (r < 600)
      op_query(w);
    else if (r < 800)
      op_load(w);
    else if (r < 880)
      op_release(w);
    else if (r < 930) {
      WCHECK(w, oi_engine_flush(w->e, UINT32_MAX) == OI_OK);
      memset(w->ff_dirty, 0, sizeof w->ff_dirty);
      w->flushes++;
    } else if (r < 931 && rnd_below(w, 10) == 0) { /* evict_all: 1 op in 10^4 */
      uint64_t ev = 0;
      WCHECK(w, oi_host_evict_all(host, &ev) == OI_OK);
      w->evicts++;
    } else {
      op_stats(w);
    }
  }
  while (w->npending)
    finish_op(w, w->npending - 1);
  while (w->nleases) {
    WCHECK(w, oi_engine_release(w->e, w->leases[0].lease) == OI_OK);
    drop_lease(w, 0);
  }
  WCHECK(w, oi_engine_flush(w->e, UINT32_MAX) == OI_OK);
  return NULL;
}

/* How many blocks of `shape` the pool holds: from an empty pool, saves one
 * new block at a time and leases it (so it cannot be evicted) until a save
 * is dropped: every slot is then leased. A slot or chunk leaked by earlier operations shows up as a
 * smaller number than a fresh host with the same options gives. */
static uint64_t pool_capacity_in_blocks(oi_host *h, oi_engine *e, const etu_layout *L,
                                        uint64_t space) {
  static oi_lease leases[4096];
  uint64_t n = 0;
  for (uint64_t tries = 0;; tries++) {
    REQUIRE(n < 4096 && tries < 100000);
    oi_block_hash hs = etu_hash(space, tries);
    int64_t id = 0;
    etu_fill_block(L, 0, etu_hash_key(&hs), SEED);
    uint64_t dropped = etu_host_stats(h).saves_dropped;
    CHECK_OK(etu_save_wait(e, &id, &hs, 1));
    if (etu_host_stats(h).saves_dropped != dropped) break;
    oi_query_result q;
    CHECK_OK(etu_query(e, NULL, &hs, 1, &q));
    if (q.hit_blocks == 1) leases[n++] = q.lease; /* else: evicted in the background first */
  }
  for (uint64_t i = 0; i < n; i++)
    CHECK_OK(oi_engine_release(e, leases[i]));
  CHECK_OK(oi_host_evict_all(h, NULL));
  return n;
}

static oi_host *random_ops_host(void) { return etu_host_create_opts(512 << 10, 128 << 10, 0); }

static void test_random_operations_match_the_reference_model(void) {
  /* Block: 2 x 1024 (split K/V) + 700 + 300 = 3048 bytes (3072-byte slots);
   * the 512 KiB pool of 128 KiB chunks holds 168 of the 600 hashes, and the
   * threads may pin up to 4 x 8 x 8 blocks, so eviction and drops happen. */
  etu_layout_begin(&shape, 3, NB);
  shape.arenas[0].bytes_per_block = 1024;
  shape.arenas[0].segments = 2;
  shape.arenas[0].segment_stride = 1024 + 64;
  shape.arenas[0].block_stride = 2304;
  shape.arenas[1].bytes_per_block = 700;
  shape.arenas[1].block_stride = 700;
  shape.arenas[2].bytes_per_block = 300;
  shape.arenas[2].block_stride = 320;
  shape.offsets[1] = NB * 2304 + 8;
  shape.offsets[2] = shape.offsets[1] + NB * 700 + 3;
  etu_layout_alloc(&shape);
  REQUIRE(shape.block_bytes == 3048);
  host = random_ops_host();
  for (int i = 0; i < UNIVERSE; i++) {
    universe[i] = etu_hash(0xBEEF, (uint64_t)i);
    universe_key[i] = etu_hash_key(&universe[i]);
  }
  static worker ws[THREADS];
  pthread_t th[THREADS];
  for (int t = 0; t < THREADS; t++) {
    memset(&ws[t], 0, sizeof ws[t]);
    ws[t].id = t;
    ws[t].rng = etu_mix(base_seed + (uint64_t)t) | 1;
    etu_layout_clone_shape(&ws[t].L, &shape);
    ws[t].e = etu_engine_create(host, &ws[t].L, "random", WORLD);
  }
  double t0 = etu_now_s();
  for (int t = 0; t < THREADS; t++)
    REQUIRE(pthread_create(&th[t], NULL, worker_main, &ws[t]) == 0);
  for (int t = 0; t < THREADS; t++)
    pthread_join(th[t], NULL);
  double secs = etu_now_s() - t0;

  uint64_t loads = 0, blocks_loaded = 0, saves = 0, queries = 0, hits = 0, mism = 0, fails = 0,
           refused = 0;
  uint64_t e_saved = 0, e_completed = 0, e_dedup = 0, e_dropped = 0, e_submitted = 0;
  for (int t = 0; t < THREADS; t++) {
    loads += ws[t].loads_ok;
    blocks_loaded += ws[t].blocks_loaded;
    saves += ws[t].saves;
    queries += ws[t].queries;
    hits += ws[t].hits;
    mism += ws[t].mismatches;
    fails += ws[t].failures;
    refused += ws[t].refused_loads;
    oi_engine_stats es = etu_engine_stats(ws[t].e);
    CHECK(es.saves_pending == 0);
    CHECK(es.loads_completed == ws[t].loads_ok);
    CHECK(es.blocks_loaded == ws[t].blocks_loaded);
    CHECK(es.loads_failed == ws[t].refused_loads && es.saves_failed == 0);
    e_saved += es.bytes_saved;
    e_completed += es.saves_completed;
    e_dedup += es.saves_deduplicated;
    e_dropped += es.saves_dropped;
    e_submitted += es.saves_submitted;
  }
  oi_host_stats s = etu_host_stats(host);
  fprintf(stderr,
          "  %.1f s: %" PRIu64 " saves, %" PRIu64 " queries (%" PRIu64 " blocks hit), %" PRIu64
          " loads (%" PRIu64 " blocks); host: %" PRIu64 " sealed-by-save, %" PRIu64
          " dedup, %" PRIu64 " dropped, %" PRIu64 " evictions\n",
          secs, saves, queries, hits, loads, blocks_loaded, s.saves_completed, s.saves_deduplicated,
          s.saves_dropped, s.evictions);
  CHECK(fails == 0);
  CHECK(mism == 0);
  CHECK(loads > 0 && s.evictions > 0); /* the run exercised what it claims */
  CHECK(s.loads_completed == loads);
  CHECK(s.loads_failed == refused);
  CHECK(s.saves_failed == 0);
  CHECK(s.saves_completed == e_completed);
  CHECK(s.saves_deduplicated == e_dedup);
  CHECK(s.saves_dropped == e_dropped);
  CHECK(s.saves_submitted == e_submitted);
  CHECK(s.bytes_saved == e_saved);
  CHECK(s.bytes_saved == s.saves_completed * shape.block_bytes);
  CHECK(s.bytes_loaded == blocks_loaded * shape.block_bytes);
  CHECK(s.saves_submitted ==
        s.saves_completed + s.saves_deduplicated + s.saves_dropped + s.saves_failed);
  CHECK(s.blocks_in_flight == 0);
  CHECK(s.leases_active == 0);
  CHECK(s.blocks_leased == 0);
  CHECK(s.blocks_loading == 0);
  CHECK(etu_accounting_ok(&s));

  /* Nothing pinned or leaked: evict_all empties the pool. */
  uint64_t ev = 0;
  CHECK_OK(oi_host_evict_all(host, &ev));
  s = etu_host_stats(host);
  CHECK(s.blocks_sealed == 0);
  CHECK(s.block_bytes_resident == 0);
  CHECK(s.blocks_in_flight == 0);
  CHECK(s.leases_active == 0);
  CHECK(etu_accounting_ok(&s));

  /* No slot or chunk leaked: the pool holds as many blocks as a fresh one. */
  {
    oi_host *fresh = random_ops_host();
    etu_layout FL;
    etu_layout_clone_shape(&FL, &shape);
    oi_engine *fe = etu_engine_create(fresh, &FL, "random", WORLD);
    uint64_t want = pool_capacity_in_blocks(fresh, fe, &FL, 0xF00D);
    uint64_t got = pool_capacity_in_blocks(host, ws[0].e, &ws[0].L, 0xF00D);
    fprintf(stderr, "  pool capacity after the run: %" PRIu64 " blocks (fresh host: %" PRIu64 ")\n",
            got, want);
    CHECK(got == want && want > 100);
    oi_engine_destroy(fe);
    oi_host_destroy(fresh);
    etu_layout_free(&FL);
  }

  /* And the pool still works after all that. */
  oi_block_hash h = universe[0];
  int64_t src = 0, dst = 1;
  etu_fill_block(&ws[0].L, 0, universe_key[0], SEED);
  CHECK_OK(etu_save_wait(ws[0].e, &src, &h, 1));
  oi_query_result q;
  CHECK_OK(etu_query(ws[1].e, NULL, &h, 1, &q));
  CHECK(q.hit_blocks == 1);
  etu_zero_block(&ws[1].L, dst);
  CHECK_OK(etu_load_wait(ws[1].e, q.lease, &dst, 1));
  CHECK_OK(oi_engine_release(ws[1].e, q.lease)); /* world_size 2: one share left */
  CHECK(etu_block_matches(&ws[1].L, dst, universe_key[0], SEED, "after the run"));

  for (int t = 0; t < THREADS; t++) {
    oi_engine_destroy(ws[t].e);
    etu_layout_free(&ws[t].L);
  }
  oi_host_destroy(host);
  etu_layout_free(&shape);
}

int main(void) {
  const char *ops = getenv("OI_RANDOM_OPS");
  uint64_t total = ops ? strtoull(ops, NULL, 10) : 100000;
  ops_per_thread = total / THREADS;
  const char *seed = getenv("OI_SEED");
  base_seed = seed ? strtoull(seed, NULL, 0) : 20240601;
  fprintf(stderr, "random ops: %" PRIu64 " per thread x %d threads, OI_SEED=%" PRIu64 "\n",
          ops_per_thread, THREADS, base_seed);
  RUN_TEST(test_random_operations_match_the_reference_model);
  TEST_EXIT();
}
