/* The host's limits, each refused with a status and a message that names
 * it, leaving what exists working: a namespace re-registered with the same
 * block size but another shape; a block larger than the pool's chunks; a
 * block size past the size classes one host serves. And leases still held
 * (a host-level lookup's, which no engine owns) when the host is destroyed:
 * freed with it (the sanitizer builds check nothing leaks). And block sizes
 * sharing a pool that one of them filled: chunks move between their size
 * classes, never one with a leased block. */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "core/core.h"
#include "engine_testutil.h"
#include "testutil.h"

static uint8_t arena_mem[1 << 20];

static float host_high_watermark; /* 0: the default */

static oi_host *host_new(uint64_t pool, uint64_t chunk) {
  oi_host_options ho = tr_host_options(pool);
  ho.chunk_bytes = chunk;
  if (host_high_watermark > 0) ho.high_watermark = ho.low_watermark = host_high_watermark;
  oi_host *h = tr_host_new(&ho);
  return h;
}

/* An engine over `na` arenas of `bytes` per block (8 blocks each) in ns. */
static oi_status engine_new(oi_host *h, const char *ns, uint32_t na, uint64_t bytes,
                            oi_engine **e) {
  oi_arena_desc ad[4];
  static const char *names[4] = {"k", "v", "x", "y"};
  REQUIRE(na <= 4 && na * 8 * bytes <= sizeof arena_mem);
  for (uint32_t a = 0; a < na; a++)
    ad[a] = tr_arena(names[a], arena_mem + (uint64_t)a * 8 * bytes, 8, bytes);
  oi_engine_options eo = tr_engine_options(ns, ad, na);
  *e = NULL;
  return oi_engine_create(h, &eo, e);
}

static oi_block_hash hash_of(uint64_t k) { return tr_hash(k, 15, 0x11); }

/* Two layouts of one arena of 8 blocks: 4 KiB and 8 KiB blocks. */
static void two_block_sizes(etu_layout *La, etu_layout *Lb) {
  etu_layout_simple(La, 1, 8, 4096);
  etu_layout_simple(Lb, 1, 8, 8192);
}

/* Saves block 0 under hash k, waits, and says whether a query hits it. */
static bool save_and_hit(oi_engine *e, uint64_t k) {
  int64_t id = 0;
  oi_block_hash hs = hash_of(k);
  CHECK_OK(tr_save(e, &id, &hs, 1, 10000));
  oi_query_result q = {.struct_size = sizeof q};
  CHECK_OK(oi_engine_query(e, NULL, &hs, 1, 0, &q));
  if (q.hit_blocks) CHECK_OK(oi_engine_release(e, q.lease));
  return q.hit_blocks == 1;
}

static void test_same_block_size_another_shape_is_refused(void) {
  oi_host *h = host_new(4 << 20, 0);
  oi_engine *one, *other = (oi_engine *)h;
  CHECK_OK(engine_new(h, "shape", 1, 8192, &one)); /* one arena of 8 KiB */
  CHECK(save_and_hit(one, 1));
  /* two arenas of 4 KiB: 8 KiB blocks too, but another layout */
  CHECK_ST(engine_new(h, "shape", 2, 4096, &other), OI_ERR_INVALID_ARGUMENT);
  CHECK(other == NULL);
  CHECK(strstr(oi_last_error(), "another shape") && strstr(oi_last_error(), "'shape'"));
  /* another block size: refused, naming both sizes */
  CHECK_ST(engine_new(h, "shape", 1, 4096, &other), OI_ERR_INVALID_ARGUMENT);
  CHECK(strstr(oi_last_error(), "8192 bytes") && strstr(oi_last_error(), "4096 bytes"));
  /* the same shape joins; another namespace may have the other shape */
  CHECK_OK(engine_new(h, "shape", 1, 8192, &other));
  oi_block_hash hs = hash_of(1);
  oi_query_result q = {.struct_size = sizeof q};
  CHECK_OK(oi_engine_query(other, NULL, &hs, 1, 0, &q));
  CHECK(q.hit_blocks == 1); /* it sees the first engine's block */
  CHECK_OK(oi_engine_release(other, q.lease));
  oi_engine_destroy(other);
  CHECK_OK(engine_new(h, "shape-2", 2, 4096, &other));
  CHECK(save_and_hit(other, 2));
  oi_engine_destroy(other);
  oi_engine_destroy(one);
  oi_host_destroy(h);
}

static void test_a_block_larger_than_a_chunk_is_refused(void) {
  oi_host *h = host_new(4 << 20, 64 << 10); /* 64 KiB chunks */
  oi_engine *e = (oi_engine *)h;
  CHECK_ST(engine_new(h, "big", 1, (64 << 10) + 256, &e), OI_ERR_INVALID_ARGUMENT);
  CHECK(e == NULL);
  CHECK(strstr(oi_last_error(), "does not fit") && strstr(oi_last_error(), "chunk_bytes"));
  /* exactly a chunk fits */
  CHECK_OK(engine_new(h, "big", 1, 64 << 10, &e));
  CHECK(save_and_hit(e, 3));
  oi_engine_destroy(e);
  oi_host_destroy(h);
}

static void test_block_sizes_past_the_size_classes_are_refused(void) {
  oi_host *h = host_new(8 << 20, 0);
  oi_engine *e[8];
  char ns[16];
  for (int i = 0; i < 8; i++) { /* 8 sizes: 1 KiB .. 8 KiB */
    snprintf(ns, sizeof ns, "size-%d", i);
    CHECK_OK(engine_new(h, ns, 1, 1024u * (uint32_t)(i + 1), &e[i]));
  }
  oi_engine *ninth = (oi_engine *)h;
  CHECK_ST(engine_new(h, "size-8", 1, 9 * 1024, &ninth), OI_ERR_UNSUPPORTED);
  CHECK(ninth == NULL);
  CHECK(strstr(oi_last_error(), "already serves 8 block sizes"));
  oi_host_stats s = {.struct_size = sizeof s};
  CHECK_OK(oi_host_get_stats(h, &s));
  CHECK(s.size_classes == 8);
  /* a new namespace of a size already served is fine, and every class works */
  CHECK_OK(engine_new(h, "size-8", 1, 2048, &ninth));
  for (int i = 0; i < 8; i++)
    CHECK(save_and_hit(e[i], 100 + (uint64_t)i));
  CHECK(save_and_hit(ninth, 200));
  oi_engine_destroy(ninth);
  for (int i = 0; i < 8; i++)
    oi_engine_destroy(e[i]);
  oi_host_destroy(h);
}

static void test_leases_held_when_the_host_is_destroyed(void) {
  oi_host *h = host_new(4 << 20, 0);
  oi_engine *e;
  CHECK_OK(engine_new(h, "held", 1, 4096, &e));
  CHECK(save_and_hit(e, 7));
  oi_block_hash hs = hash_of(7);
  /* an engine's own lease: dropped when the engine goes */
  oi_query_result q = {.struct_size = sizeof q};
  CHECK_OK(oi_engine_query(e, NULL, &hs, 1, 0, &q));
  CHECK(q.hit_blocks == 1);
  /* a lookup's lease (no instance): outlives every engine */
  oi_lookup_options lo;
  REQUIRE(oi_lookup_options_init(&lo) == OI_OK);
  lo.namespace_id = "held";
  oi_query_result lq = {.struct_size = sizeof lq};
  CHECK_OK(oi_host_query(h, &lo, "req", &hs, 1, 0, &lq));
  CHECK(lq.hit_blocks == 1);
  oi_host_stats s = {.struct_size = sizeof s};
  CHECK_OK(oi_host_get_stats(h, &s));
  CHECK(s.leases_active == 2 && s.blocks_leased == 1);
  oi_engine_destroy(e);
  CHECK_OK(oi_host_get_stats(h, &s));
  CHECK(s.leases_active == 1 && s.blocks_leased == 1 && s.blocks_pinned == 1);
  /* the host goes with the lease still held: freed, no complaint */
  oi_host_destroy(h);
}

/* ---- block sizes sharing one pool: the size-class rebalancer ---- */

/* Saves content keys first.. first+n-1 of `space` from blocks 0..n-1 of L
 * (n <= 8) and returns how many the host accepted (the deduplicated ones
 * too with `dedup`). */
static uint64_t save_keys_as(oi_engine *e, const etu_layout *L, uint64_t space, uint64_t first,
                             size_t n, bool dedup) {
  int64_t ids[8];
  oi_block_hash hs[8];
  REQUIRE(n <= 8 && n <= L->num_blocks);
  for (size_t i = 0; i < n; i++) {
    ids[i] = (int64_t)i;
    etu_fill_block(L, (int64_t)i, first + i, space);
    hs[i] = etu_hash(space, first + i);
  }
  oi_save_result res = {.struct_size = sizeof res};
  oi_save_options so;
  oi_save_options_init(&so);
  so.result = &res;
  oi_ticket *t = NULL;
  CHECK_OK(oi_engine_save(e, ids, hs, n, &so, &t));
  CHECK_OK(etu_ticket_finish(t));
  CHECK(res.accepted + res.dropped + res.deduplicated == n);
  return res.accepted + (dedup ? res.deduplicated : 0);
}

static uint64_t save_keys(oi_engine *e, const etu_layout *L, uint64_t space, uint64_t first,
                          size_t n) {
  return save_keys_as(e, L, space, first, n, false);
}

/* Whether content key k of `space` hits; a hit is loaded into block 7 of L
 * and must be byte-exact (checked here). */
static bool hits_exact(oi_engine *e, const etu_layout *L, uint64_t space, uint64_t k) {
  oi_block_hash hs = etu_hash(space, k);
  oi_query_result q;
  CHECK_OK(etu_query(e, NULL, &hs, 1, &q));
  if (q.hit_blocks == 0) return false;
  int64_t dst = 7;
  etu_zero_block(L, dst);
  CHECK_OK(etu_load_wait(e, q.lease, &dst, 1));
  CHECK(etu_block_matches(L, dst, k, space, "reloaded"));
  return true;
}

/* Saves key k of `space` again and again (the first saves may be dropped
 * while the maintenance thread moves a chunk) until the host holds it, for
 * up to 5 s. Returns the saves that were dropped. */
static int save_until_accepted(oi_engine *e, const etu_layout *L, uint64_t space, uint64_t k) {
  int dropped = 0;
  for (double end = etu_now_s() + 5; etu_now_s() < end; dropped++) {
    if (save_keys_as(e, L, space, k, 1, true) == 1) return dropped;
    etu_sleep_ms(2);
  }
  CHECK(!"a save of the second block size was never accepted");
  return dropped;
}

/* One block size holds every chunk of the pool (background eviction off).
 * A save of another size finds no room: it is dropped and counted at once
 * and never waits, and asks the maintenance thread for a chunk; the thread
 * empties the chunk of the first size that was filled least recently
 * (evicting its 16 blocks) and carves it for the second size, whose next
 * save is accepted. The other 48 blocks of the first size stay, byte-exact.
 * (Before the rebalancer, the second size got nothing until evict_all.) */
static void test_another_block_size_while_one_fills_the_pool(void) {
  oi_host *h = etu_host_create_wm(256 << 10, 64 << 10, 0, 1.0f, 1.0f); /* 4 x 16 4-KiB */
  etu_layout La, Lb;
  two_block_sizes(&La, &Lb);
  oi_engine *a = etu_engine_create(h, &La, "fills", 1);
  for (uint64_t k = 0; k < 64; k += 8)
    CHECK(save_keys(a, &La, 1, k, 8) == 8);
  oi_host_stats s = etu_host_stats(h);
  CHECK(s.blocks_sealed == 64 && s.free_bytes == 0);
  oi_engine *b = etu_engine_create(h, &Lb, "other-size", 1);
  uint64_t t0 = oi__now_ns();
  uint64_t first = save_keys(b, &Lb, 2, 0, 1);
  CHECK(oi__now_ns() - t0 < 2000000000ull); /* never waits for room */
  s = etu_host_stats(h);
  CHECK(s.saves_dropped >= 1 - first); /* the first save is dropped unless a chunk moved already */
  save_until_accepted(b, &Lb, 2, 0);
  CHECK(hits_exact(b, &Lb, 2, 0));
  s = etu_host_stats(h);
  CHECK(s.evictions == 16 && s.blocks_sealed == 49 && etu_accounting_ok(&s));
  /* the chunk filled first went (keys 0..15); the rest of the first size stays */
  int kept = 0, gone = 0;
  for (uint64_t k = 0; k < 64; k++) {
    bool hit = hits_exact(a, &La, 1, k);
    kept += hit;
    gone += !hit && k < 16;
  }
  CHECK(kept == 48 && gone == 16);
  /* the second size fills the chunk it got: 8 blocks of 8 KiB */
  CHECK(save_keys(b, &Lb, 2, 1, 7) == 7);
  for (uint64_t k = 0; k < 8; k++)
    CHECK(hits_exact(b, &Lb, 2, k));
  oi_engine_destroy(b);
  oi_engine_destroy(a);
  oi_host_destroy(h);
  etu_layout_free(&La);
  etu_layout_free(&Lb);
}

/* Two namespaces of different block sizes (4 KiB and 8 KiB) alternate saves
 * of new blocks into one pool of 8 chunks that the first filled alone
 * (background eviction off): the chunks are shared out between them as they
 * go. Each keeps a share (neither drops everything, both hit at the end),
 * and every block that hits loads back byte-exact. */
static void test_two_block_sizes_alternate_in_one_pool(void) {
  oi_host *h = etu_host_create_wm(512 << 10, 64 << 10, 0, 1.0f, 1.0f); /* 8 chunks */
  etu_layout La, Lb;
  two_block_sizes(&La, &Lb);
  oi_engine *a = etu_engine_create(h, &La, "small", 1);
  oi_engine *b = etu_engine_create(h, &Lb, "large", 1);
  uint64_t ka = 0, kb = 0, acc_a = 0, acc_b = 0, late_a = 0, late_b = 0;
  for (; ka < 128; ka += 8) /* 128 blocks of 4 KiB: every chunk */
    CHECK(save_keys(a, &La, 1, ka, 8) == 8);
  CHECK(etu_host_stats(h).free_bytes == 0);
  enum { ROUNDS = 48 };
  for (int r = 0; r < ROUNDS; r++) {
    uint64_t na = save_keys(a, &La, 1, ka, 8), nb = save_keys(b, &Lb, 2, kb, 8);
    acc_a += na;
    acc_b += nb;
    if (r >= ROUNDS / 2) { /* the second half: after the shares settled */
      late_a += na;
      late_b += nb;
    }
    ka += 8;
    kb += 8;
    etu_sleep_ms(1);
  }
  fprintf(stderr,
          "  accepted of %d each: 4 KiB %" PRIu64 " (%" PRIu64 " late), 8 KiB %" PRIu64 " (%" PRIu64
          " late)\n",
          ROUNDS * 8, acc_a, late_a, acc_b, late_b);
  CHECK(late_a > 0 && late_b > 0); /* neither drops everything */
  etu_sleep_ms(100);               /* a move the last saves asked for is over */
  int hit_a = 0, hit_b = 0;
  for (uint64_t k = 0; k < ka; k++)
    hit_a += hits_exact(a, &La, 1, k);
  for (uint64_t k = 0; k < kb; k++)
    hit_b += hits_exact(b, &Lb, 2, k);
  oi_host_stats s = etu_host_stats(h);
  fprintf(stderr, "  resident: 4 KiB %d, 8 KiB %d; evictions %" PRIu64 "\n", hit_a, hit_b,
          s.evictions);
  CHECK(hit_a > 0 && hit_b > 0);
  CHECK(s.blocks_sealed == (uint64_t)(hit_a + hit_b) && etu_accounting_ok(&s));
  /* no chunk holds both sizes: the resident bytes fit the carved chunks */
  CHECK((uint64_t)hit_a * 4096 + (uint64_t)hit_b * 8192 <= s.used_bytes);
  oi_engine_destroy(b);
  oi_engine_destroy(a);
  oi_host_destroy(h);
  etu_layout_free(&La);
  etu_layout_free(&Lb);
}

/* One namespace's saver in test_two_block_sizes_save_at_once. */
typedef struct sizer {
  oi_host *h;
  const char *ns;
  uint64_t block_bytes, space, accepted, hits;
} sizer;

static void *sizer_main(void *arg) {
  sizer *z = arg;
  etu_layout L;
  etu_layout_simple(&L, 1, 8, z->block_bytes);
  oi_engine *e = etu_engine_create(z->h, &L, z->ns, 1);
  for (uint64_t k = 0; k < 8 * 150; k += 8) {
    z->accepted += save_keys(e, &L, z->space, k, 8);
    if (k >= 16) /* recent blocks, a chunk may be moving under them: byte-exact or a miss */
      for (uint64_t j = k - 16; j < k - 12; j++)
        z->hits += hits_exact(e, &L, z->space, j);
    etu_sleep_ms(1); /* a server's pace, not a loop's: the maintenance thread gets its turns */
  }
  oi_engine_destroy(e);
  etu_layout_free(&L);
  return NULL;
}

/* Two namespaces of 4 KiB and 8 KiB blocks save, query and load at once,
 * each on its own thread, into a pool of 8 chunks that the first filled
 * (background eviction off), while the maintenance thread moves chunks
 * between them: each gets
 * saves accepted and hits, every hit is byte-exact (ThreadSanitizer runs
 * this suite). */
static void test_two_block_sizes_save_at_once(void) {
  oi_host *h = etu_host_create_wm(512 << 10, 64 << 10, 0, 1.0f, 1.0f);
  etu_layout L;
  etu_layout_simple(&L, 1, 8, 4096);
  oi_engine *fill = etu_engine_create(h, &L, "small", 1);
  for (uint64_t k = 0; k < 128; k += 8) /* the small size holds every chunk first */
    CHECK(save_keys(fill, &L, 3, k, 8) == 8);
  oi_engine_destroy(fill);
  etu_layout_free(&L);
  sizer z[2] = {{h, "small", 4096, 1, 0, 0}, {h, "large", 8192, 2, 0, 0}};
  pthread_t t[2];
  for (int i = 0; i < 2; i++)
    REQUIRE(pthread_create(&t[i], NULL, sizer_main, &z[i]) == 0);
  for (int i = 0; i < 2; i++)
    pthread_join(t[i], NULL);
  fprintf(stderr,
          "  accepted 4 KiB %" PRIu64 ", 8 KiB %" PRIu64 "; hits %" PRIu64 ", %" PRIu64 "\n",
          z[0].accepted, z[1].accepted, z[0].hits, z[1].hits);
  CHECK(z[0].accepted > 0 && z[1].accepted > 0 && z[0].hits > 0 && z[1].hits > 0);
  oi_host_stats s = etu_host_stats(h);
  CHECK(s.blocks_in_flight == 0 && s.blocks_leased == 0 && etu_accounting_ok(&s));
  oi_host_destroy(h);
}

/* A chunk with a leased block is never taken. Two chunks of 16 blocks of
 * 4 KiB, a lease on a block of each: a save of 8 KiB is dropped and no
 * chunk moves (nothing is evicted, the leased blocks still load). With the
 * second chunk's lease released, the second chunk moves; the first, whose
 * block is still leased, stays whole, and that lease still loads its block
 * byte-exact. */
static void test_a_chunk_with_a_leased_block_is_not_taken(void) {
  oi_host *h = etu_host_create_wm(128 << 10, 64 << 10, 0, 1.0f, 1.0f); /* 2 chunks */
  etu_layout La, Lb;
  two_block_sizes(&La, &Lb);
  oi_engine *a = etu_engine_create(h, &La, "leased", 1);
  for (uint64_t k = 0; k < 32; k += 8) /* keys 0..15 in one chunk, 16..31 in the other */
    CHECK(save_keys(a, &La, 1, k, 8) == 8);
  oi_block_hash h0 = etu_hash(1, 0), h16 = etu_hash(1, 16);
  oi_query_result q0, q16;
  CHECK_OK(etu_query(a, NULL, &h0, 1, &q0));
  CHECK_OK(etu_query(a, NULL, &h16, 1, &q16));
  CHECK(q0.hit_blocks == 1 && q16.hit_blocks == 1);
  oi_engine *b = etu_engine_create(h, &Lb, "wants-room", 1);
  CHECK(save_keys(b, &Lb, 2, 0, 1) == 0);
  etu_sleep_ms(200); /* ten passes of the maintenance thread */
  CHECK(save_keys(b, &Lb, 2, 0, 1) == 0);
  etu_sleep_ms(100);
  oi_host_stats s = etu_host_stats(h);
  CHECK(s.evictions == 0 && s.blocks_sealed == 32 && s.blocks_leased == 2);
  for (uint64_t k = 1; k < 32; k++)
    if (k != 16) CHECK(hits_exact(a, &La, 1, k));
  CHECK_OK(oi_engine_release(a, q16.lease));
  save_until_accepted(b, &Lb, 2, 0);
  CHECK(hits_exact(b, &Lb, 2, 0));
  s = etu_host_stats(h);
  CHECK(s.evictions == 16 && s.blocks_leased == 1);
  for (uint64_t k = 1; k < 32; k++)
    CHECK(hits_exact(a, &La, 1, k) == (k < 16));
  int64_t dst = 7; /* the lease held throughout loads its block */
  etu_zero_block(&La, dst);
  CHECK_OK(etu_load_wait(a, q0.lease, &dst, 1));
  CHECK(etu_block_matches(&La, dst, 0, 1, "held lease"));
  oi_engine_destroy(b);
  oi_engine_destroy(a);
  oi_host_destroy(h);
  etu_layout_free(&La);
  etu_layout_free(&Lb);
}

int main(void) {
  RUN_TEST(test_same_block_size_another_shape_is_refused);
  RUN_TEST(test_a_block_larger_than_a_chunk_is_refused);
  RUN_TEST(test_block_sizes_past_the_size_classes_are_refused);
  RUN_TEST(test_leases_held_when_the_host_is_destroyed);
  RUN_TEST(test_another_block_size_while_one_fills_the_pool);
  RUN_TEST(test_two_block_sizes_alternate_in_one_pool);
  RUN_TEST(test_a_chunk_with_a_leased_block_is_not_taken);
  RUN_TEST(test_two_block_sizes_save_at_once);
  TEST_EXIT();
}
