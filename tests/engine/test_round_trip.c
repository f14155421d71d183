/* Round trips through the host tier on the cpu backend: save -> flush -> query
 * (all hit) -> load into *different* block ids, byte-exact for every (block,
 * arena, segment), over the layouts real engines use; dedup; namespace
 * isolation; visibility of sealed blocks only. */
#include <stdatomic.h>

#include "engine_testutil.h"
#include "host/host.h"
#include "host/tier.h"
#include "rig.h"

#define SEED 0x0123456789ull

static uint64_t pool_for(const etu_layout *L) {
  uint64_t p = 32 * L->block_bytes;
  return p < (64ull << 20) ? (64ull << 20) : p;
}

/* Saves blocks 0..k-1 (content = logical block j) with k = num_blocks - 2,
 * loads them reversed into num_blocks-1 .. 2, checks every byte, checks
 * blocks 0 and 1 and every gap of the region stay zero. */
static void round_trip(etu_layout *L, const char *what, bool use_offsets) {
  REQUIRE(L->num_blocks >= 4 && L->num_blocks % 2 == 0);
  const uint64_t nb = L->num_blocks, k = nb - 2;
  const uint64_t space = etu_mix((uint64_t)(uintptr_t)what) ^ (use_offsets ? 1 : 0);
  const int failures_before = oi_test_failures;
  oi_host *h = etu_host_create(pool_for(L));
  oi_engine *e = etu_engine_create_mode(h, L, "rt", 1, use_offsets);

  oi_engine_stats es = etu_engine_stats(e);
  CHECK(es.block_bytes == L->block_bytes);
  CHECK(es.num_blocks == nb);

  int64_t src[64], dst[64];
  oi_block_hash hs[64];
  REQUIRE(k <= 64);
  for (uint64_t j = 0; j < k; j++) {
    src[j] = (int64_t)j;
    dst[j] = (int64_t)(nb - 1 - j);
    REQUIRE(dst[j] != src[j]);
    hs[j] = etu_hash(space, j);
    etu_fill_block(L, src[j], j, SEED);
  }
  oi_ticket *t = NULL;
  CHECK_OK(oi_engine_save(e, src, hs, k, NULL, &t));
  REQUIRE(t);
  CHECK_OK(oi_engine_flush(e, UINT32_MAX));
  CHECK_OK(etu_ticket_finish(t));

  oi_host_stats hst = etu_host_stats(h);
  CHECK(hst.blocks_sealed == k);
  CHECK(hst.blocks_in_flight == 0);
  CHECK(hst.saves_completed == k);
  CHECK(hst.bytes_saved == k * L->block_bytes);
  CHECK(hst.block_bytes_resident == k * L->block_bytes); /* host.h: "bytes of blocks" */
  CHECK(etu_accounting_ok(&hst));

  oi_query_result q;
  CHECK_OK(etu_query(e, "req", hs, k, &q));
  CHECK(q.state == OI_QUERY_READY);
  CHECK(q.hit_blocks == k);
  CHECK(!etu_lease_is_zero(q.lease));

  /* The device forgets everything; only the host tier has the data now. */
  memset(L->region, 0, (size_t)L->region_bytes + 64);
  CHECK_OK(etu_load_wait(e, q.lease, dst, k));

  bool all = true;
  for (uint64_t j = 0; j < k; j++)
    all &= etu_block_matches(L, dst[j], j, SEED, what);
  CHECK(all);
  CHECK(etu_block_is_zero(L, 0));
  CHECK(etu_block_is_zero(L, 1));
  /* Nothing was written outside the slices (segment gaps, stride padding). */
  for (uint64_t j = 0; j < k; j++)
    etu_zero_block(L, dst[j]);
  CHECK(etu_region_is_zero(L));

  hst = etu_host_stats(h);
  CHECK(hst.bytes_loaded == k * L->block_bytes);
  CHECK(hst.loads_completed == 1);
  CHECK(hst.query_hit_blocks == k);
  es = etu_engine_stats(e);
  CHECK(es.blocks_loaded == k);
  CHECK(es.loads_completed == 1);
  CHECK(es.bytes_loaded == k * L->block_bytes);
  CHECK(es.bytes_saved == k * L->block_bytes);
  CHECK(es.saves_completed == k);
  CHECK(es.saves_pending == 0);
  if (oi_test_failures != failures_before)
    fprintf(stderr, "  (layout: %s, %s)\n", what, use_offsets ? "offsets" : "bases");

  oi_engine_destroy(e);
  oi_host_destroy(h);
}

static void both_modes(etu_layout *L, const char *what) {
  round_trip(L, what, false);
  memset(L->region, 0, (size_t)L->region_bytes + 64);
  round_trip(L, what, true);
}

static void test_round_trip_four_arenas(void) {
  etu_layout L;
  etu_layout_simple(&L, 4, 8, 4096);
  both_modes(&L, "4 arenas x 4096 B");
  etu_layout_free(&L);
}

static void test_round_trip_99_arenas_of_two_sizes(void) {
  /* 78 arenas of 41,984 B and 21 of 8,448 B, interleaved (every 4th small). */
  etu_layout L;
  uint64_t bpb[99];
  int small = 0;
  for (int a = 0; a < 99; a++) {
    bool s = a % 4 == 3 && small < 21;
    small += s;
    bpb[a] = s ? 8448 : 41984;
  }
  REQUIRE(small == 21);
  etu_layout_packed(&L, 99, 8, bpb, 256);
  CHECK(L.block_bytes == 78ull * 41984 + 21ull * 8448);
  both_modes(&L, "99 arenas (78 x 41984 + 21 x 8448)");
  etu_layout_free(&L);
}

static void test_round_trip_page_first_36_arenas(void) {
  /* 36 arenas of 64 KiB at a 2.25 MiB stride: arenas interleaved in one region. */
  etu_layout L;
  etu_layout_page_first(&L, 36, 6, 64 << 10);
  CHECK(L.arenas[0].block_stride == 2359296);
  both_modes(&L, "36 arenas x 64 KiB page-first");
  etu_layout_free(&L);
}

static void test_round_trip_split_kv(void) {
  /* segments 2: K at +0, V at +segment_stride, gaps between and after. The
   * last arena's block_stride is the smallest legal one. */
  etu_layout L;
  etu_layout_begin(&L, 3, 8);
  uint64_t off = 0;
  const uint64_t bpb[3] = {1000, 512, 333};
  const uint64_t seg_stride[3] = {1536, 512 + 64, 400};
  const uint64_t stride[3] = {4096, 2048, 400 + 333};
  for (int a = 0; a < 3; a++) {
    L.arenas[a].bytes_per_block = bpb[a];
    L.arenas[a].segments = 2;
    L.arenas[a].segment_stride = seg_stride[a];
    L.arenas[a].block_stride = stride[a];
    L.offsets[a] = off;
    off += 8 * stride[a] + 128;
  }
  etu_layout_alloc(&L);
  CHECK(L.block_bytes == 2 * (1000 + 512 + 333));
  both_modes(&L, "split K/V");
  etu_layout_free(&L);
}

static void test_round_trip_vllm_kv_halves(void) {
  /* vLLM's [2, num_blocks, ...] layer as ONE arena: segment 0 (K) and
   * segment 1 (V) are separate regions (segment_offsets), 2 layers. */
  etu_layout L;
  etu_layout_kv_halves(&L, 2, 8, 4096, false);
  CHECK(L.block_bytes == 2 * 2 * 4096);
  both_modes(&L, "vLLM K/V halves, 2 layers");
  etu_layout_free(&L);
  /* The V half below the K half: segment order is the host block's order,
   * whatever the addresses. */
  etu_layout_kv_halves(&L, 2, 8, 1000, true);
  both_modes(&L, "vLLM K/V halves, V first");
  etu_layout_free(&L);
}

/* Per-arena completion on the cpu backend (OI_LOAD_ARENA_EVENTS): when
 * oi_ticket_arena_wait(k) returns OI_OK, arena k's bytes of every loaded
 * block are in place; an arena past the layout is refused; a ticket without
 * per-arena progress (a save, a plain load) waits for the whole ticket. */
static void test_arena_waits_on_the_cpu_backend(void) {
  etu_layout L;
  etu_layout_kv_halves(&L, 4, 16, 8192, false);
  oi_host *h = etu_host_create(64 << 20);
  oi_engine *e = etu_engine_create(h, &L, "arena-wait", 1);
  enum { N = 8 };
  int64_t src[N], dst[N];
  oi_block_hash hs[N];
  for (int i = 0; i < N; i++) {
    src[i] = i;
    dst[i] = 15 - i;
    hs[i] = etu_hash(4242, (uint64_t)i);
    etu_fill_block(&L, src[i], (uint64_t)i, SEED);
  }
  oi_ticket *t = NULL;
  CHECK_OK(oi_engine_save(e, src, hs, N, NULL, &t));
  CHECK_OK(oi_ticket_arena_wait(t, 7, 10000)); /* no per-arena progress: the whole save */
  CHECK_OK(oi_ticket_poll(t));
  oi_ticket_release(t);
  for (int round = 0; round < 20; round++) {
    oi_query_result q;
    CHECK_OK(etu_query(e, NULL, hs, N, &q));
    REQUIRE(q.hit_blocks == N);
    for (int i = 0; i < N; i++)
      etu_zero_block(&L, dst[i]);
    oi_load_options lo;
    CHECK_OK(oi_load_options_init(&lo));
    lo.flags = OI_LOAD_ARENA_EVENTS;
    CHECK_OK(oi_engine_load(e, q.lease, dst, N, &lo, &t));
    REQUIRE(t);
    CHECK(oi_ticket_arena_event(t, 0) == NULL); /* cpu: no CUDA events */
    for (uint32_t a = 0; a < L.num_arenas; a++) {
      CHECK_OK(oi_ticket_arena_wait(t, a, 10000));
      CHECK_OK(oi_ticket_arena_poll(t, a));
      bool ok = true; /* arena a, both halves, every block: in place now */
      for (int i = 0; i < N; i++)
        for (uint32_t s = 0; s < 2; s++)
          ok &= etu_slice_mismatch(etu_slice_ptr(&L, a, dst[i], s), 8192,
                                   etu_slice_seed(SEED, (uint64_t)i, a, s)) < 0;
      CHECK(ok);
    }
    CHECK_ST(oi_ticket_arena_wait(t, L.num_arenas, 0), OI_ERR_INVALID_ARGUMENT);
    CHECK_ST(oi_ticket_arena_poll(t, 99), OI_ERR_INVALID_ARGUMENT);
    CHECK_OK(oi_ticket_wait(t, 10000));
    oi_ticket_release(t);
    for (int i = 0; i < N; i++)
      CHECK(etu_block_matches(&L, dst[i], (uint64_t)i, SEED, "arena waits"));
  }
  CHECK_ST(oi_ticket_arena_wait(NULL, 0, 0), OI_ERR_INVALID_ARGUMENT);
  CHECK_ST(oi_ticket_arena_poll(NULL, 0), OI_ERR_INVALID_ARGUMENT);
  oi_engine_destroy(e);
  oi_host_destroy(h);
  etu_layout_free(&L);
}

static uint64_t visible(oi_engine *e, const oi_block_hash *hs, size_t n) {
  uint8_t present[64];
  oi_query_result q = {.struct_size = sizeof q, .present = present};
  CHECK_OK(oi_engine_query(e, NULL, hs, n, OI_QUERY_MEMBERSHIP, &q));
  return q.hit_blocks;
}

/* Layerwise saves (oi_save_options.arena_first / arena_count): each layer's
 * call copies its arenas with its own ticket; nothing is visible until every
 * arena arrived; then the block is byte-exact. A repeated layer is skipped; a
 * block whose layers do not all arrive is aborted at the save deadline (a
 * flush waits for it) and its slot freed; bad ranges are refused. */
static void test_layerwise_save(void) {
  etu_layout L;
  etu_layout_kv_halves(&L, 4, 16, 2048, false);
  oi_host *h = etu_host_create(64 << 20);
  oi_engine_options o;
  static oi_arena_desc arenas[ETU_MAX_ARENAS];
  etu_engine_opts(&L, "layerwise", 1, false, &o, arenas);
  o.save_deadline_ms = 300;
  oi_engine *e = NULL;
  CHECK_OK(oi_engine_create(h, &o, &e));
  REQUIRE(e);
  enum { N = 6 };
  int64_t src[N], dst[N];
  oi_block_hash hs[N];
  for (int i = 0; i < N; i++) {
    src[i] = i;
    dst[i] = 15 - i;
    hs[i] = etu_hash(5151, (uint64_t)i);
    etu_fill_block(&L, src[i], (uint64_t)i, SEED);
  }
  /* Layer by layer (the last call covers two layers); layer 1 twice. */
  CHECK_OK(tr_save_arenas(e, src, hs, N, 0, 1, 10000));
  CHECK(visible(e, hs, N) == 0);
  CHECK_OK(tr_save_arenas(e, src, hs, N, 1, 1, 10000));
  CHECK_OK(tr_save_arenas(e, src, hs, N, 1, 1, 10000)); /* skipped: already arrived */
  CHECK(visible(e, hs, N) == 0);
  oi_host_stats hst = etu_host_stats(h);
  CHECK(hst.blocks_in_flight == N && hst.blocks_sealed == 0);
  CHECK_OK(tr_save_arenas(e, src, hs, N, 2, 2, 10000));
  CHECK(visible(e, hs, N) == N);
  hst = etu_host_stats(h);
  CHECK(hst.blocks_in_flight == 0 && hst.blocks_sealed == N);
  oi_engine_stats es = etu_engine_stats(e);
  CHECK(es.saves_submitted == N && es.saves_completed == N && es.saves_failed == 0);
  CHECK(es.bytes_saved == N * L.block_bytes);
  memset(L.region, 0, (size_t)L.region_bytes + 64);
  oi_query_result q;
  CHECK_OK(etu_query(e, NULL, hs, N, &q));
  REQUIRE(q.hit_blocks == N);
  CHECK_OK(etu_load_wait(e, q.lease, dst, N));
  for (int i = 0; i < N; i++)
    CHECK(etu_block_matches(&L, dst[i], (uint64_t)i, SEED, "layerwise"));
  /* Saving sealed blocks layer by layer again: deduplicated, nothing held. */
  CHECK_OK(tr_save_arenas(e, dst, hs, N, 0, 1, 10000));
  CHECK_OK(tr_save_arenas(e, dst, hs, N, 1, 3, 10000));
  CHECK(etu_host_stats(h).blocks_in_flight == 0);
  CHECK_OK(oi_engine_flush(e, 5000));

  /* Layers that never all arrive: aborted at the deadline; the flush waits. */
  oi_block_hash hs2[2] = {etu_hash(5152, 0), etu_hash(5152, 1)};
  CHECK_OK(tr_save_arenas(e, src, hs2, 2, 0, 2, 10000));
  CHECK(etu_host_stats(h).blocks_in_flight == 2);
  CHECK_ST(oi_engine_flush(e, 10), OI_ERR_TIMEOUT);
  CHECK_OK(oi_engine_flush(e, 5000));
  hst = etu_host_stats(h);
  CHECK(hst.blocks_in_flight == 0);
  CHECK(visible(e, hs2, 2) == 0);
  CHECK(etu_engine_stats(e).saves_failed == 2);
  /* ... and at the deadline even when the engine is not used again: the
   * sweeper gives the slots back (the host's own stats show it). */
  oi_block_hash hs3[2] = {etu_hash(5153, 0), etu_hash(5153, 1)};
  CHECK_OK(tr_save_arenas(e, src, hs3, 2, 0, 1, 10000));
  CHECK(etu_host_stats(h).blocks_in_flight == 2);
  double t0 = etu_now_s();
  while (etu_host_stats(h).blocks_in_flight != 0 && etu_now_s() - t0 < 5)
    usleep(10000);
  CHECK(etu_host_stats(h).blocks_in_flight == 0);
  CHECK(etu_now_s() - t0 >= 0.2); /* not before the 300 ms deadline (less slack) */
  CHECK(etu_engine_stats(e).saves_failed == 4);
  /* The hashes can be saved again, whole this time. */
  CHECK_OK(etu_save_wait(e, src, hs2, 2));
  CHECK(visible(e, hs2, 2) == 2);

  /* Refused: a range past the layout, arena_first alone, repeated ids. */
  oi_save_options so;
  CHECK_OK(oi_save_options_init(&so));
  so.arena_first = 3;
  so.arena_count = 2;
  CHECK_ST(oi_engine_save(e, src, hs, N, &so, NULL), OI_ERR_INVALID_ARGUMENT);
  so.arena_first = 4;
  so.arena_count = 1;
  CHECK_ST(oi_engine_save(e, src, hs, N, &so, NULL), OI_ERR_INVALID_ARGUMENT);
  so.arena_first = 1;
  so.arena_count = 0;
  CHECK_ST(oi_engine_save(e, src, hs, N, &so, NULL), OI_ERR_INVALID_ARGUMENT);
  int64_t twice[2] = {3, 3};
  so.arena_count = 1;
  CHECK_ST(oi_engine_save(e, twice, hs, 2, &so, NULL), OI_ERR_INVALID_ARGUMENT);
  oi_engine_destroy(e);
  oi_host_destroy(h);
  etu_layout_free(&L);
}

static void test_round_trip_uneven_arena_sizes(void) {
  etu_layout L;
  const uint64_t bpb[3] = {100, 4096 + 3, 17};
  etu_layout_packed(&L, 3, 8, bpb, 1); /* unaligned bases and strides */
  both_modes(&L, "uneven 100 / 4099 / 17");
  etu_layout_free(&L);
}

static void test_resaving_sealed_or_in_flight_hashes_is_deduplicated(void) {
  etu_layout L;
  etu_layout_simple(&L, 2, 16, 2048);
  oi_host *h = etu_host_create(64 << 20);
  oi_engine *e = etu_engine_create(h, &L, "dedup", 1);
  int64_t ids[4] = {0, 1, 2, 3}, other[4] = {4, 5, 6, 7}, dst[4] = {12, 13, 14, 15};
  oi_block_hash hs[4];
  for (int j = 0; j < 4; j++) {
    hs[j] = etu_hash(77, (uint64_t)j);
    etu_fill_block(&L, ids[j], (uint64_t)j, SEED);
    etu_fill_block(&L, other[j], 100 + (uint64_t)j, SEED); /* different bytes, same hashes */
  }
  CHECK_OK(etu_save_wait(e, ids, hs, 4));
  CHECK_OK(oi_engine_flush(e, UINT32_MAX));
  oi_host_stats before = etu_host_stats(h);
  oi_query_result q;
  CHECK_OK(etu_query(e, NULL, hs, 4, &q));
  CHECK(q.hit_blocks == 4);
  CHECK_OK(oi_engine_release(e, q.lease));

  /* Sealed: the second save is deduplicated; its ticket still completes OK. */
  CHECK_OK(etu_save_wait(e, other, hs, 4));
  CHECK_OK(oi_engine_flush(e, UINT32_MAX));
  oi_host_stats after = etu_host_stats(h);
  CHECK(after.saves_deduplicated == before.saves_deduplicated + 4);
  CHECK(after.saves_completed == before.saves_completed);
  CHECK(after.bytes_saved == before.bytes_saved);
  CHECK(after.blocks_sealed == before.blocks_sealed);
  CHECK(etu_engine_stats(e).saves_deduplicated == 4);
  CHECK_OK(etu_query(e, NULL, hs, 4, &q));
  CHECK(q.hit_blocks == 4);
  /* No second copy: the host still holds the first bytes. */
  CHECK_OK(etu_load_wait(e, q.lease, dst, 4));
  for (int j = 0; j < 4; j++)
    CHECK(etu_block_matches(&L, dst[j], (uint64_t)j, SEED, "dedup"));

  /* In flight: the same new hashes saved twice back to back (and twice within
   * one call) make exactly one copy each. */
  oi_block_hash fresh[4];
  int64_t ids2[4] = {8, 9, 10, 11};
  for (int j = 0; j < 4; j++) {
    fresh[j] = etu_hash(78, (uint64_t)j);
    etu_fill_block(&L, ids2[j], 200 + (uint64_t)j, SEED);
  }
  before = etu_host_stats(h);
  oi_ticket *t1 = NULL, *t2 = NULL;
  CHECK_OK(oi_engine_save(e, ids2, fresh, 4, NULL, &t1));
  CHECK_OK(oi_engine_save(e, ids2, fresh, 4, NULL, &t2));
  CHECK_OK(etu_ticket_finish(t1));
  CHECK_OK(etu_ticket_finish(t2));
  CHECK_OK(oi_engine_flush(e, UINT32_MAX));
  after = etu_host_stats(h);
  CHECK(after.saves_completed == before.saves_completed + 4);
  CHECK(after.saves_deduplicated == before.saves_deduplicated + 4);
  CHECK(after.blocks_sealed == before.blocks_sealed + 4);
  CHECK(after.bytes_saved == before.bytes_saved + 4 * L.block_bytes);

  oi_block_hash twice[2] = {etu_hash(79, 0), etu_hash(79, 0)};
  int64_t tw_ids[2] = {0, 1};
  before = etu_host_stats(h);
  CHECK_OK(etu_save_wait(e, tw_ids, twice, 2));
  CHECK_OK(oi_engine_flush(e, UINT32_MAX));
  after = etu_host_stats(h);
  CHECK(after.blocks_sealed == before.blocks_sealed + 1);
  CHECK(after.saves_completed == before.saves_completed + 1);
  CHECK(after.saves_deduplicated == before.saves_deduplicated + 1);
  CHECK(etu_accounting_ok(&after));

  oi_engine_destroy(e);
  oi_host_destroy(h);
  etu_layout_free(&L);
}

static void test_namespaces_are_isolated(void) {
  etu_layout LA, LB;
  etu_layout_simple(&LA, 2, 8, 4096);
  etu_layout_clone_shape(&LB, &LA);
  oi_host *h = etu_host_create(64 << 20);
  oi_engine *a = etu_engine_create(h, &LA, "ns-A", 1);
  oi_engine *b = etu_engine_create(h, &LB, "ns-B", 1);
  int64_t ids[3] = {0, 1, 2}, dst[3] = {5, 6, 7};
  oi_block_hash hs[3];
  for (int j = 0; j < 3; j++) {
    hs[j] = etu_hash(90, (uint64_t)j);
    etu_fill_block(&LA, ids[j], 10 + (uint64_t)j, SEED);
    etu_fill_block(&LB, ids[j], 20 + (uint64_t)j, SEED);
  }
  CHECK_OK(etu_save_wait(a, ids, hs, 3));
  CHECK_OK(oi_engine_flush(a, UINT32_MAX));

  oi_query_result q;
  CHECK_OK(etu_query(b, NULL, hs, 3, &q));
  CHECK(q.hit_blocks == 0);
  CHECK(etu_lease_is_zero(q.lease));
  uint8_t present[3] = {9, 9, 9};
  CHECK(etu_membership(b, hs, 3, present) == 0);
  CHECK(present[0] == 0 && present[1] == 0 && present[2] == 0);

  /* The same hashes under B are new blocks there (not deduplicated against A). */
  oi_host_stats before = etu_host_stats(h);
  CHECK_OK(etu_save_wait(b, ids, hs, 3));
  CHECK_OK(oi_engine_flush(b, UINT32_MAX));
  oi_host_stats after = etu_host_stats(h);
  CHECK(after.saves_completed == before.saves_completed + 3);
  CHECK(after.saves_deduplicated == before.saves_deduplicated);

  CHECK_OK(etu_query(b, NULL, hs, 3, &q));
  CHECK(q.hit_blocks == 3);
  CHECK_OK(etu_load_wait(b, q.lease, dst, 3));
  for (int j = 0; j < 3; j++)
    CHECK(etu_block_matches(&LB, dst[j], 20 + (uint64_t)j, SEED, "ns B"));
  CHECK_OK(etu_query(a, NULL, hs, 3, &q));
  CHECK(q.hit_blocks == 3);
  CHECK_OK(etu_load_wait(a, q.lease, dst, 3));
  for (int j = 0; j < 3; j++)
    CHECK(etu_block_matches(&LA, dst[j], 10 + (uint64_t)j, SEED, "ns A"));

  /* A layout with another block byte size is refused in A; nothing changes. */
  etu_layout LC;
  etu_layout_simple(&LC, 2, 8, 2048);
  static oi_arena_desc arenas[ETU_MAX_ARENAS];
  oi_engine_options o;
  etu_engine_opts(&LC, "ns-A", 1, false, &o, arenas);
  oi_engine *c = NULL;
  CHECK_FAILS(oi_engine_create(h, &o, &c), OI_ERR_INVALID_ARGUMENT);
  CHECK(c == NULL);
  CHECK_OK(etu_query(a, NULL, hs, 3, &q));
  CHECK(q.hit_blocks == 3);
  CHECK_OK(oi_engine_release(a, q.lease));
  /* ... while the same shape in a third namespace is fine. */
  o.namespace_id = "ns-C";
  CHECK_OK(oi_engine_create(h, &o, &c));
  CHECK(c != NULL);
  oi_engine_destroy(c);

  oi_engine_destroy(a);
  oi_engine_destroy(b);
  oi_host_destroy(h);
  etu_layout_free(&LA);
  etu_layout_free(&LB);
  etu_layout_free(&LC);
}

typedef struct done_counter {
  atomic_int calls;
  atomic_int last_status;
} done_counter;

static void count_done(void *ctx, oi_status st) {
  done_counter *c = ctx;
  atomic_store(&c->last_status, st);
  atomic_fetch_add(&c->calls, 1);
}

static void test_fire_and_forget_save_calls_on_done_once_and_flush_covers_it(void) {
  etu_layout L;
  etu_layout_simple(&L, 3, 8, 1024);
  oi_host *h = etu_host_create(64 << 20);
  oi_engine *e = etu_engine_create(h, &L, "fnf", 1);
  int64_t ids[4] = {0, 1, 2, 3}, dst[4] = {7, 6, 5, 4};
  oi_block_hash hs[4];
  for (int j = 0; j < 4; j++) {
    hs[j] = etu_hash(95, (uint64_t)j);
    etu_fill_block(&L, ids[j], (uint64_t)j, SEED);
  }
  done_counter dc = {0, 12345};
  oi_save_options so;
  CHECK_OK(oi_save_options_init(&so));
  so.on_done = count_done;
  so.on_done_ctx = &dc;
  CHECK_OK(oi_engine_save(e, ids, hs, 4, &so, NULL));
  CHECK_OK(oi_engine_flush(e, UINT32_MAX));
  for (int i = 0; i < 1000 && atomic_load(&dc.calls) == 0; i++)
    etu_sleep_ms(10);
  etu_sleep_ms(20);
  CHECK(atomic_load(&dc.calls) == 1);
  CHECK(atomic_load(&dc.last_status) == OI_OK);
  oi_query_result q;
  CHECK_OK(etu_query(e, NULL, hs, 4, &q));
  CHECK(q.hit_blocks == 4);
  memset(L.region, 0, (size_t)L.region_bytes);
  CHECK_OK(etu_load_wait(e, q.lease, dst, 4));
  for (int j = 0; j < 4; j++)
    CHECK(etu_block_matches(&L, dst[j], (uint64_t)j, SEED, "fnf"));

  /* A save that is entirely deduplicated still calls on_done, with OI_OK. */
  done_counter dc2 = {0, 12345};
  so.on_done_ctx = &dc2;
  CHECK_OK(oi_engine_save(e, ids, hs, 4, &so, NULL));
  CHECK_OK(oi_engine_flush(e, UINT32_MAX));
  for (int i = 0; i < 1000 && atomic_load(&dc2.calls) == 0; i++)
    etu_sleep_ms(10);
  etu_sleep_ms(20);
  CHECK(atomic_load(&dc2.calls) == 1);
  CHECK(atomic_load(&dc2.last_status) == OI_OK);

  oi_engine_destroy(e);
  oi_host_destroy(h);
  etu_layout_free(&L);
}

/* While a long save is being copied, any block a query reports must already
 * hold all its bytes: load every reported prefix and compare. */
static void test_queries_see_only_complete_blocks_while_saves_land(void) {
  enum { NB = 128, K = 48 };
  etu_layout L;
  const uint64_t bpb[4] = {64 << 10, 32 << 10, 4097, 64 << 10};
  etu_layout_packed(&L, 4, NB, bpb, 64);
  oi_host *h = etu_host_create(256ull << 20);
  oi_engine *e = etu_engine_create(h, &L, "vis", 1);
  int64_t src[K], dst[K];
  for (int j = 0; j < K; j++) {
    src[j] = j;
    dst[j] = NB - 1 - j;
    etu_fill_block(&L, src[j], (uint64_t)j, SEED);
  }
  int rounds = 0, loads = 0;
  uint64_t prev_hit = 0;
  bool ok = true;
  for (int round = 0; round < 4; round++) {
    /* One block per save call, so blocks seal one by one. */
    oi_block_hash rh[K];
    for (int j = 0; j < K; j++)
      rh[j] = etu_hash(97 + (uint64_t)round, (uint64_t)j);
    oi_ticket *last = NULL;
    for (int j = 0; j < K; j++) {
      oi_ticket *t = NULL;
      CHECK_OK(oi_engine_save(e, &src[j], &rh[j], 1, NULL, &t));
      if (j == K - 1)
        last = t;
      else
        oi_ticket_release(t);
    }
    prev_hit = 0;
    for (;;) {
      bool done = oi_ticket_poll(last) != OI_PENDING;
      oi_query_result q;
      CHECK_OK(etu_query(e, NULL, rh, K, &q));
      CHECK(q.hit_blocks >= prev_hit); /* nothing is evicted here: the prefix only grows */
      prev_hit = q.hit_blocks;
      if (q.hit_blocks > 0) {
        for (uint64_t j = 0; j < q.hit_blocks; j++)
          etu_zero_block(&L, dst[j]);
        CHECK_OK(etu_load_wait(e, q.lease, dst, q.hit_blocks));
        loads++;
        for (uint64_t j = 0; j < q.hit_blocks; j++)
          ok &= etu_block_matches(&L, dst[j], j, SEED, "visible while saving");
      }
      rounds++;
      if (done) break;
    }
    CHECK_OK(etu_ticket_finish(last));
    CHECK_OK(oi_engine_flush(e, UINT32_MAX));
    oi_query_result q;
    CHECK_OK(etu_query(e, NULL, rh, K, &q));
    CHECK(q.hit_blocks == K); /* after flush: all visible */
    CHECK_OK(oi_engine_release(e, q.lease));
  }
  CHECK(ok);
  fprintf(stderr, "  (%d queries, %d loads while saving)\n", rounds, loads);
  oi_engine_destroy(e);
  oi_host_destroy(h);
  etu_layout_free(&L);
}

/* engine_destroy flushes saves and finishes loads: nothing in flight is lost
 * or left half-copied, and the tickets stay valid for their holders. */
static void test_destroying_an_engine_finishes_its_saves_and_loads(void) {
  etu_layout L, L2;
  etu_layout_simple(&L, 2, 32, 512 << 10); /* 1 MiB blocks */
  etu_layout_clone_shape(&L2, &L);
  oi_host *h = etu_host_create(256ull << 20);
  oi_engine *e = etu_engine_create(h, &L, "teardown", 1);
  int64_t pids[8], pdst[8], sids[16];
  oi_block_hash ph[8], sh[16];
  for (int i = 0; i < 8; i++) {
    pids[i] = i;
    pdst[i] = 16 + i;
    ph[i] = etu_hash(600, (uint64_t)i);
    etu_fill_block(&L, i, 600 + (uint64_t)i, SEED);
  }
  CHECK_OK(etu_save_wait(e, pids, ph, 8));
  oi_query_result q;
  CHECK_OK(etu_query(e, NULL, ph, 8, &q));
  CHECK(q.hit_blocks == 8);
  for (int i = 0; i < 16; i++) {
    sids[i] = i;
    sh[i] = etu_hash(601, (uint64_t)i);
    etu_fill_block(&L, i, 700 + (uint64_t)i, SEED);
  }
  oi_ticket *ts = NULL, *tl = NULL;
  CHECK_OK(oi_engine_save(e, sids, sh, 16, NULL, &ts));
  CHECK_OK(oi_engine_load(e, q.lease, pdst, 8, NULL, &tl));
  oi_engine_destroy(e);
  /* Both finished before destroy returned. */
  CHECK(oi_ticket_poll(ts) == OI_OK);
  CHECK(oi_ticket_poll(tl) == OI_OK);
  CHECK_OK(etu_ticket_finish(ts));
  CHECK_OK(etu_ticket_finish(tl));
  for (int i = 0; i < 8; i++)
    CHECK(etu_block_matches(&L, pdst[i], 600 + (uint64_t)i, SEED, "load at teardown"));
  oi_host_stats s = etu_host_stats(h);
  CHECK(s.blocks_in_flight == 0 && s.blocks_loading == 0 && s.leases_active == 0);
  CHECK(s.blocks_sealed == 24);
  /* Another rank restores what the destroyed one saved on its way out. */
  oi_engine *e2 = etu_engine_create(h, &L2, "teardown", 1);
  CHECK_OK(etu_query(e2, NULL, sh, 16, &q));
  CHECK(q.hit_blocks == 16);
  int64_t dst[16];
  for (int i = 0; i < 16; i++)
    dst[i] = 31 - i;
  CHECK_OK(etu_load_wait(e2, q.lease, dst, 16));
  for (int i = 0; i < 16; i++)
    CHECK(etu_block_matches(&L2, dst[i], 700 + (uint64_t)i, SEED, "saved at teardown"));
  oi_engine_destroy(e2);
  oi_host_destroy(h);
  etu_layout_free(&L);
  etu_layout_free(&L2);
}

/* Loads of 1,100 blocks with the default 64 shards: each run of 1,024 is
 * marked 512 at a time under every shard's lock, the last 76 a batch at a
 * time. The lease has two shares (world size 2): the first load adds its
 * marks and leaves the pins, the second turns the pins into its marks.
 * Every byte comes back both times, and once both loads ended nothing is
 * leased or pinned and every block can be evicted. */
static void test_large_loads_mark_under_every_shard_lock(void) {
  enum { K = 1100, NB = 3 * K };
  etu_layout L;
  etu_layout_simple(&L, 1, NB, 512);
  oi_host *h = etu_host_create(8 << 20);
  oi_engine *e = etu_engine_create(h, &L, "large", 2);
  static int64_t src[K], dst[2][K];
  static oi_block_hash hs[K];
  for (uint64_t j = 0; j < K; j++) {
    src[j] = (int64_t)j;
    dst[0][j] = (int64_t)(K + j);
    dst[1][j] = (int64_t)(2 * K + j);
    hs[j] = etu_hash(77, j);
    etu_fill_block(&L, src[j], j, SEED);
  }
  CHECK_OK(etu_save_wait(e, src, hs, K));
  oi_query_result q = {.struct_size = sizeof q};
  CHECK_OK(oi_engine_query(e, "req", hs, K, 0, &q));
  CHECK(q.hit_blocks == K);
  for (int share = 0; share < 2; share++) {
    CHECK_OK(etu_load_wait(e, q.lease, dst[share], K));
    bool all = true;
    for (uint64_t j = 0; j < K; j++)
      all &= etu_block_matches(&L, dst[share][j], j, SEED, "large load");
    CHECK(all);
    oi_host_stats st = etu_host_stats(h);
    CHECK(st.blocks_leased == (share == 0 ? K : 0));
  }
  oi_host_stats st = etu_host_stats(h);
  CHECK(st.blocks_pinned == 0);
  uint64_t evicted = 0;
  CHECK_OK(oi_host_evict_all(h, &evicted));
  CHECK(evicted == K);
  oi_engine_destroy(e);
  oi_host_destroy(h);
  etu_layout_free(&L);
}

/* Saves of 512 hashes or more reserve their slots under every shard's lock,
 * taken once per run of 512, and seal the same way. A 1 MiB pool of 512-byte
 * blocks (background eviction off): 1,100 new hashes; then 550 of them again
 * beside 600 new ones, 50 of those named twice in the call, more than 64
 * places apart (each count exact); then 1,000 more, which take the free
 * slots and evict the rest in runs of up to 512. Every count is exact and
 * every byte of the last call comes back. */
static void test_large_saves_reserve_under_every_shard_lock(void) {
  enum { NB = 4000 };
  etu_layout L;
  etu_layout_simple(&L, 1, NB, 512);
  oi_host *h = etu_host_create_wm(1 << 20, 0, 0, 1.0f, 1.0f);
  oi_engine *e = etu_engine_create(h, &L, "big", 1);
  for (int64_t j = 0; j < NB; j++)
    etu_fill_block(&L, j, (uint64_t)j, SEED);
  static int64_t ids[1200], dst[1200];
  static oi_block_hash hs[1200];
  static uint8_t present[1200];
  oi_save_result r = {.struct_size = sizeof r};
  oi_save_options so;
  oi_save_options_init(&so);
  so.result = &r;
  size_t n = 0;
#define PUT(j) (ids[n] = (int64_t)(j), hs[n++] = etu_hash(91, (uint64_t)(j)))
  for (int j = 0; j < 1100; j++)
    PUT(j);
  oi_ticket *t = NULL;
  CHECK_OK(oi_engine_save(e, ids, hs, n, &so, &t));
  CHECK_OK(etu_ticket_finish(t));
  CHECK(r.accepted == 1100 && r.deduplicated == 0 && r.dropped == 0);
  /* Again: 550 held, 550 new, 50 of the new named a second time. */
  n = 0;
  for (int j = 550; j < 1100; j++)
    PUT(j);
  for (int j = 2000; j < 2550; j++)
    PUT(j);
  for (int j = 2000; j < 2050; j++)
    PUT(j);
  CHECK_OK(oi_engine_save(e, ids, hs, n, &so, &t));
  CHECK_OK(etu_ticket_finish(t));
  CHECK(r.accepted == 550 && r.deduplicated == 600 && r.dropped == 0);
  oi_host_stats st = etu_host_stats(h);
  CHECK(st.blocks_sealed == 1650 && st.evictions == 0);
  uint64_t free_slots = st.capacity_bytes / 512 - st.blocks_sealed;
  CHECK(free_slots < 1000); /* the next call must evict */
  /* 1,000 more: the free slots, then the least recently used blocks. */
  n = 0;
  for (int j = 3000; j < 4000; j++)
    PUT(j);
  CHECK_OK(oi_engine_save(e, ids, hs, n, &so, &t));
  CHECK_OK(etu_ticket_finish(t));
  CHECK(r.accepted == 1000 && r.deduplicated == 0 && r.dropped == 0);
  st = etu_host_stats(h);
  uint64_t evicted = 1000 - free_slots;
  CHECK(st.evictions == evicted && st.blocks_sealed == 2650 - evicted);
  /* Eviction is least recently used per shard (approximately overall):
   * of the 1,650 older blocks, exactly the evicted number are gone. */
  n = 0;
  for (int j = 0; j < 1100; j++)
    PUT(j);
  int64_t held = etu_membership(e, hs, n, present);
  n = 0;
  for (int j = 2000; j < 2550; j++)
    PUT(j);
  held += etu_membership(e, hs, n, present);
  CHECK(held == (int64_t)(1650 - evicted));
  /* The last 1,000 come back byte for byte into blocks wiped first. */
  n = 0;
  for (int j = 3000; j < 4000; j++)
    PUT(j);
#undef PUT
  oi_query_result q;
  CHECK_OK(etu_query(e, "big", hs, n, &q));
  CHECK(q.hit_blocks == 1000);
  for (size_t i = 0; i < n; i++) {
    dst[i] = ids[i] - 3000; /* blocks 0..999, wiped */
    etu_zero_block(&L, dst[i]);
  }
  CHECK_OK(etu_load_wait(e, q.lease, dst, n));
  bool all = true;
  for (size_t i = 0; i < n; i++)
    all &= etu_block_matches(&L, dst[i], (uint64_t)ids[i], SEED, "large save");
  CHECK(all);
  st = etu_host_stats(h);
  CHECK(st.blocks_pinned == 0 && st.blocks_leased == 0 && st.blocks_in_flight == 0);
  CHECK(etu_accounting_ok(&st));
  oi_engine_destroy(e);
  oi_host_destroy(h);
  etu_layout_free(&L);
}

/* Shares of one lease marked at once, outside the lease lock, while a
 * release races them: three threads load the same 1,100-block lease (four
 * shares) into their own blocks as a fourth releases it. Each load either
 * finds the lease (every byte comes back) or does not (OI_ERR_LEASE_EXPIRED,
 * nothing written); the release always finds it (a share is left); after
 * all, nothing is leased, pinned or loading and every block can be evicted.
 * Twenty rounds. */
enum { RACE_K = 1100, RACE_LOADERS = 3 };
typedef struct race_ctx {
  oi_engine *e;
  etu_layout *L;
  oi_lease lease;
  pthread_barrier_t *go;
  int who; /* a loader's index, or RACE_LOADERS: the releaser */
  oi_status st;
} race_ctx;

static void *race_main(void *arg) {
  race_ctx *c = arg;
  static _Thread_local int64_t dst[RACE_K];
  pthread_barrier_wait(c->go);
  if (c->who == RACE_LOADERS) {
    c->st = oi_engine_release(c->e, c->lease);
    return NULL;
  }
  for (uint64_t j = 0; j < RACE_K; j++)
    dst[j] = (int64_t)((uint64_t)(c->who + 1) * RACE_K + j);
  c->st = etu_load_wait(c->e, c->lease, dst, RACE_K);
  if (c->st == OI_OK) {
    bool all = true;
    for (uint64_t j = 0; j < RACE_K; j++)
      all &= etu_block_matches(c->L, dst[j], j, SEED, "raced load");
    if (!all) c->st = OI_ERR_INTERNAL;
  }
  return NULL;
}

static void test_shares_mark_at_once_while_a_release_races_them(void) {
  etu_layout L;
  etu_layout_simple(&L, 1, (RACE_LOADERS + 1) * RACE_K, 512);
  oi_host *h = etu_host_create(8 << 20);
  oi_engine *e = etu_engine_create(h, &L, "race", RACE_LOADERS + 1);
  static int64_t src[RACE_K];
  static oi_block_hash hs[RACE_K];
  for (uint64_t j = 0; j < RACE_K; j++) {
    src[j] = (int64_t)j;
    hs[j] = etu_hash(78, j);
    etu_fill_block(&L, src[j], j, SEED);
  }
  CHECK_OK(etu_save_wait(e, src, hs, RACE_K));
  int loaded = 0, refused = 0;
  for (int round = 0; round < 20; round++) {
    oi_query_result q = {.struct_size = sizeof q};
    CHECK_OK(oi_engine_query(e, "req", hs, RACE_K, 0, &q));
    REQUIRE(q.hit_blocks == RACE_K);
    pthread_barrier_t go;
    REQUIRE(pthread_barrier_init(&go, NULL, RACE_LOADERS + 1) == 0);
    race_ctx c[RACE_LOADERS + 1];
    pthread_t th[RACE_LOADERS + 1];
    for (int t = 0; t <= RACE_LOADERS; t++) {
      c[t] = (race_ctx){.e = e, .L = &L, .lease = q.lease, .go = &go, .who = t};
      REQUIRE(pthread_create(&th[t], NULL, race_main, &c[t]) == 0);
    }
    for (int t = 0; t <= RACE_LOADERS; t++)
      pthread_join(th[t], NULL);
    pthread_barrier_destroy(&go);
    CHECK_OK(c[RACE_LOADERS].st);
    for (int t = 0; t < RACE_LOADERS; t++) {
      CHECK(c[t].st == OI_OK || c[t].st == OI_ERR_LEASE_EXPIRED);
      loaded += c[t].st == OI_OK;
      refused += c[t].st == OI_ERR_LEASE_EXPIRED;
    }
    oi_host_stats st = etu_host_stats(h);
    CHECK(st.blocks_leased == 0 && st.blocks_pinned == 0 && st.blocks_loading == 0);
  }
  CHECK(loaded + refused == 20 * RACE_LOADERS);
  uint64_t evicted = 0;
  CHECK_OK(oi_host_evict_all(h, &evicted));
  CHECK(evicted == RACE_K);
  oi_engine_destroy(e);
  oi_host_destroy(h);
  etu_layout_free(&L);
}

/* A host index of 1024 shards (more than the 64 a bit mask sorts, so a
 * call's shards are sorted one by one, duplicates skipped; more than a load
 * of 512 blocks takes all at once, so its blocks are marked a batch at a
 * time): 600 blocks saved in one call with 8 hashes given twice, queried,
 * leased and loaded byte-exact in one call, evicted in one call. */
static void test_more_than_64_index_shards(void) {
  enum { K = 600, NB = 2 * K + 16 };
  etu_layout L;
  etu_layout_simple(&L, 2, NB, 1024);
  oi_host_options o = tr_host_options(16 << 20);
  o.device = OI_DEVICE_CPU;
  o.index_shards = 1024;
  oi_host *h = tr_host_new(&o);
  oi_engine *e = etu_engine_create(h, &L, "shards", 1);
  static int64_t src[K + 8], dst[K];
  static oi_block_hash hs[K + 8];
  for (uint64_t j = 0; j < K; j++) {
    src[j] = (int64_t)j;
    dst[j] = (int64_t)(K + j);
    hs[j] = etu_hash(1024, j);
    etu_fill_block(&L, src[j], j, SEED);
  }
  for (uint64_t j = 0; j < 8; j++) { /* the same hashes again, from the same blocks */
    src[K + j] = (int64_t)(j * 7);
    hs[K + j] = hs[j * 7];
  }
  CHECK_OK(etu_save_wait(e, src, hs, K + 8));
  CHECK_OK(oi_engine_flush(e, UINT32_MAX));
  oi_host_stats st = etu_host_stats(h);
  CHECK(st.blocks_sealed == K && st.saves_completed == K && st.saves_deduplicated == 8);
  oi_query_result q;
  CHECK_OK(etu_query(e, "req", hs, K, &q));
  CHECK(q.state == OI_QUERY_READY && q.hit_blocks == K);
  CHECK_OK(etu_load_wait(e, q.lease, dst, K));
  bool all = true;
  for (uint64_t j = 0; j < K; j++)
    all &= etu_block_matches(&L, dst[j], j, SEED, "1024 shards");
  CHECK(all);
  uint64_t evicted = 0;
  CHECK_OK(oi_host_evict_all(h, &evicted));
  CHECK(evicted == K);
  CHECK_OK(etu_query(e, "req", hs, K, &q));
  CHECK(q.hit_blocks == 0 && etu_lease_is_zero(q.lease));
  oi_engine_destroy(e);
  oi_host_destroy(h);
  etu_layout_free(&L);
}

/* A tier that listens (as the cluster tier does): told of every block
 * sealed and evicted, with its namespace and hash; a second tier of the same
 * ops refused while one is attached; one without an eviction hook hears
 * only seals; detached, it hears nothing; its destroy hook runs once, at the
 * host's destroy. */
typedef struct watch_log {
  int sealed, evicted, destroyed;
  uint32_t ns;
  bool hashes_ok;
  const oi_block_hash *want;
  size_t n_want;
} watch_log;

static bool known_hash(const watch_log *w, const oi_block_hash *h) {
  for (size_t i = 0; i < w->n_want; i++)
    if (!memcmp(w->want[i].bytes, h->bytes, sizeof h->bytes)) return true;
  return false;
}
static void watch_sealed(void *ctx, uint32_t ns, const oi_block_hash *h) {
  watch_log *w = ctx;
  w->sealed++;
  w->hashes_ok &= ns == w->ns && known_hash(w, h);
}
static void watch_evicted(void *ctx, uint32_t ns, const oi_block_hash *h) {
  watch_log *w = ctx;
  w->evicted++;
  w->hashes_ok &= ns == w->ns && known_hash(w, h);
}
static void watch_destroyed(void *ctx) { ((watch_log *)ctx)->destroyed++; }

static void test_host_watcher(void) {
  etu_layout L;
  etu_layout_simple(&L, 2, 16, 2048);
  oi_host *h = etu_host_create(8 << 20);
  oi_engine *e = etu_engine_create(h, &L, "watched", 1);
  oi_host_ns ns;
  REQUIRE(oi__host_find_namespace(h, "watched", &ns));
  oi_block_hash hs[12];
  int64_t ids[12];
  for (int j = 0; j < 12; j++) {
    hs[j] = etu_hash(77, (uint64_t)j);
    ids[j] = j;
  }
  watch_log w = {.ns = ns.id, .hashes_ok = true, .want = hs, .n_want = 12};
  static const oi_tier_ops both = {
      .name = "watch", .sealed = watch_sealed, .evicted = watch_evicted};
  static const oi_tier_ops seals = {.name = "watch", .sealed = watch_sealed};
  static const oi_tier_ops with_destroy = {.name = "watch",
                                           .sealed = watch_sealed,
                                           .evicted = watch_evicted,
                                           .destroy = watch_destroyed};
  CHECK(oi__host_tier_find(h, &both) == NULL);
  oi_tier *link = NULL;
  CHECK_OK(oi__host_tier_attach(h, &both, &w, &link));
  CHECK(oi__host_tier_find(h, &both) == &w);
  CHECK_ST(oi__host_tier_attach(h, &both, &w, NULL), OI_ERR_STATE);
  CHECK(strstr(oi_last_error(), "a watch tier is attached to this host already"));
  CHECK_OK(etu_save_wait(e, ids, hs, 4));
  CHECK_OK(oi_engine_flush(e, UINT32_MAX));
  uint64_t evicted = 0;
  CHECK_OK(oi_host_evict_all(h, &evicted));
  CHECK(evicted == 4 && w.sealed == 4 && w.evicted == 4 && w.hashes_ok);
  /* Seals only. */
  oi__host_tier_detach(h, link);
  CHECK(oi__host_tier_find(h, &both) == NULL);
  CHECK_OK(oi__host_tier_attach(h, &seals, &w, &link));
  CHECK_OK(etu_save_wait(e, ids + 4, hs + 4, 4));
  CHECK_OK(oi_engine_flush(e, UINT32_MAX));
  CHECK_OK(oi_host_evict_all(h, &evicted));
  CHECK(evicted == 4 && w.sealed == 8 && w.evicted == 4 && w.hashes_ok);
  /* Detached: nothing heard. */
  oi__host_tier_detach(h, link);
  CHECK_OK(etu_save_wait(e, ids + 8, hs + 8, 4));
  CHECK_OK(oi_engine_flush(e, UINT32_MAX));
  CHECK(w.sealed == 8);
  /* The destroy hook: once, when the host goes (not at a clear). */
  CHECK_OK(oi__host_tier_attach(h, &with_destroy, &w, NULL));
  CHECK(w.destroyed == 0);
  oi_engine_destroy(e);
  oi_host_destroy(h);
  CHECK(w.destroyed == 1 && w.hashes_ok);
  etu_layout_free(&L);
}

/* A tier that takes spills (as the disk tier does) and takes them late: 5000
 * blocks sealed while it takes none queue past the queue's first 4096
 * entries and none is lost (nothing counted as overflow); taken 64 at a
 * time they are exactly the 5000 saved, each with its block size; ended,
 * they are held below and still evictable. A second tier that takes spills
 * is refused;
 * the first one's destroy hook runs once, at the host's destroy. */
static int lower_destroyed;
static void lower_destroy(void *ctx) {
  (void)ctx;
  lower_destroyed++;
}
static const oi_tier_ops lower_ops = {
    .name = "lower", .flags = OI_TIER_SPILLS, .destroy = lower_destroy};
static const oi_tier_ops lower_ops2 = {
    .name = "lower2", .flags = OI_TIER_SPILLS, .destroy = lower_destroy};

static void test_a_lower_tier_that_takes_its_spills_late(void) {
  enum { N = 5000, CALL = 500 };
  etu_layout L;
  etu_layout_simple(&L, 1, N, 1024);
  oi_host *h = etu_host_create_wm(16 << 20, 0, 0, 1.0f, 0.9f);
  int ctx = 0;
  lower_destroyed = 0;
  CHECK_OK(oi__host_tier_attach(h, &lower_ops, &ctx, NULL));
  CHECK_ST(oi__host_tier_attach(h, &lower_ops2, &ctx, NULL), OI_ERR_STATE);
  CHECK(
      strstr(oi_last_error(), "a tier that takes spills (lower) is attached to this host already"));
  CHECK(oi__host_tier_find(h, &lower_ops) == &ctx);
  oi_engine *e = etu_engine_create(h, &L, "below", 1);
  static oi_block_hash hs[N];
  static int64_t ids[N];
  static bool seen[N], ok[64];
  for (int j = 0; j < N; j++) {
    hs[j] = etu_hash(4242, (uint64_t)j);
    ids[j] = j;
    seen[j] = false;
  }
  for (int j = 0; j < N; j += CALL)
    CHECK_OK(etu_save_wait(e, ids + j, hs + j, CALL));
  CHECK_OK(oi_engine_flush(e, UINT32_MAX));
  CHECK(oi__host_spill_backlog(h) == N && oi__host_spill_overflow(h) == 0);
  oi_host_spill sp[64];
  size_t taken = 0, got;
  bool all_ok = true;
  while ((got = oi__host_spill_take(h, sp, 64, 0)) > 0) {
    for (size_t i = 0; i < got; i++) {
      int at = -1;
      for (int k = 0; k < N && at < 0; k++)
        if (!memcmp(hs[k].bytes, sp[i].hash.bytes, sizeof hs[k].bytes)) at = k;
      all_ok &= at >= 0 && !seen[at] && sp[i].bytes == L.block_bytes && sp[i].data != NULL;
      if (at >= 0) seen[at] = true;
      ok[i] = true;
    }
    oi__host_spill_end(h, sp, got, ok);
    taken += got;
  }
  CHECK(taken == N && all_ok);
  CHECK(oi__host_spill_backlog(h) == 0 && oi__host_spill_overflow(h) == 0);
  uint64_t evicted = 0;
  CHECK_OK(oi_host_evict_all(h, &evicted));
  CHECK(evicted == N);
  oi_engine_destroy(e);
  CHECK(lower_destroyed == 0);
  oi_host_destroy(h);
  CHECK(lower_destroyed == 1);
  etu_layout_free(&L);
}

int main(void) {
  RUN_TEST(test_round_trip_four_arenas);
  RUN_TEST(test_round_trip_99_arenas_of_two_sizes);
  RUN_TEST(test_round_trip_page_first_36_arenas);
  RUN_TEST(test_round_trip_split_kv);
  RUN_TEST(test_round_trip_vllm_kv_halves);
  RUN_TEST(test_round_trip_uneven_arena_sizes);
  RUN_TEST(test_arena_waits_on_the_cpu_backend);
  RUN_TEST(test_layerwise_save);
  RUN_TEST(test_resaving_sealed_or_in_flight_hashes_is_deduplicated);
  RUN_TEST(test_namespaces_are_isolated);
  RUN_TEST(test_fire_and_forget_save_calls_on_done_once_and_flush_covers_it);
  RUN_TEST(test_queries_see_only_complete_blocks_while_saves_land);
  RUN_TEST(test_destroying_an_engine_finishes_its_saves_and_loads);
  RUN_TEST(test_more_than_64_index_shards);
  RUN_TEST(test_large_loads_mark_under_every_shard_lock);
  RUN_TEST(test_large_saves_reserve_under_every_shard_lock);
  RUN_TEST(test_shares_mark_at_once_while_a_release_races_them);
  RUN_TEST(test_host_watcher);
  RUN_TEST(test_a_lower_tier_that_takes_its_spills_late);
  TEST_EXIT();
}
