/* The copy pipeline (lib/transfer) where many jobs fail together: more jobs
 * past their deadlines at once than the completion thread reports in one
 * batch (with and without tickets), a layered load whose every copy fails
 * (each arena's report after the first failure keeps the first error), and
 * layer-by-layer saves with the staged copy policy (a layer's copies go by
 * DMA) in small groups, with layered loads of several groups. */
#include "fault_util.h"

enum { MANY = 80, XL_BLOCKS = 32 };

typedef struct done_rec {
  atomic_int calls, timeouts;
} done_rec;

static void count_done(void *ctx, oi_status st) {
  done_rec *d = ctx;
  atomic_fetch_add(&d->calls, 1);
  if (st == OI_ERR_TIMEOUT) atomic_fetch_add(&d->timeouts, 1);
}

/* 80 one-block saves queued behind a slowed copy, then the clock jumps a
 * minute past their 5 s deadlines and one more save wakes the completion
 * thread: all 80 are past due at once (more than one batch of reports).
 * Every one is told OI_ERR_TIMEOUT (its ticket, or its on_done alone for
 * the half without a ticket) and none is visible afterwards; the last save,
 * with a deadline after the jump, lands byte-exact; the pool is whole. */
static void test_many_jobs_miss_their_deadlines_at_once(void) {
  rig r;
  rig_open(&r, MANY + 1, 4096, 2 * MANY + 2, 0, 5000, 0, 0);
  REQUIRE(oi__fault_arm(OI_FAULT_COPY_SLOW, 0, 1, 1000) == OI_OK);
  done_rec d = {0};
  oi_ticket *t[MANY + 1];
  oi_save_options so;
  oi_save_options_init(&so);
  so.on_done = count_done;
  so.on_done_ctx = &d;
  for (int i = 0; i <= MANY; i++) {
    if (i == MANY) REQUIRE(oi__fault_arm(OI_FAULT_CLOCK_JUMP, 0, 1, 60000) == OI_OK);
    int64_t id = i;
    oi_block_hash h = fu_hash(5000 + (uint64_t)i);
    fu_fill(&r, i, 5000 + (uint64_t)i);
    t[i] = NULL;
    CHECK_OK(
        oi_engine_save(r.e, &id, &h, 1, i == MANY ? NULL : &so, i % 2 || i == MANY ? &t[i] : NULL));
  }
  for (int i = 1; i < MANY; i += 2) {
    CHECK_ST(oi_ticket_wait(t[i], 60000), OI_ERR_TIMEOUT);
    oi_ticket_release(t[i]);
  }
  for (int i = 0; i < 5000 && atomic_load(&d.calls) < MANY; i++)
    usleep(1000);
  CHECK(atomic_load(&d.calls) == MANY && atomic_load(&d.timeouts) == MANY);
  CHECK_OK(oi_ticket_wait(t[MANY], 60000));
  oi_ticket_release(t[MANY]);
  CHECK(oi__fault_fired(OI_FAULT_CLOCK_JUMP) == 1);
  CHECK_OK(oi_engine_flush(r.e, 60000));
  CHECK(rig_visible(&r, 5000, MANY) == 0); /* late saves are discarded */
  oi_lease l;
  REQUIRE(rig_query(&r, 5000 + MANY, 1, &l) == 1);
  memset(r.arena, 0, 4096);
  CHECK_OK(rig_load(&r, l, 0, 1));
  CHECK(fu_check(&r, 0, 5000 + MANY));
  rig_check_quiet(&r);
  rig_close(&r);
}

/* Three arenas (layers) of 32 blocks of 4 KiB; copy_mode and group bytes
 * as given. */
static void xl_open(layer_rig *r, uint32_t copy_mode, uint64_t group_bytes) {
  memset(r, 0, sizeof *r);
  oi_engine_options eo = fu_layer_rig_begin(r, "xfer-fault", XL_BLOCKS);
  eo.copy_mode = copy_mode;
  eo.submit_group_bytes = group_bytes;
  r->e = tr_engine_new(r->h, &eo);
}

static uint8_t xl_byte(uint32_t a, uint64_t logical, uint64_t i) {
  return (uint8_t)(fu_byte(logical, i) ^ (a * 53 + 7));
}

static void xl_fill(layer_rig *r, int64_t id, uint64_t logical) {
  for (uint32_t a = 0; a < FU_LAYERS; a++)
    for (uint64_t i = 0; i < FU_LAYER_BYTES; i++)
      ((uint8_t *)r->ad[a].base)[(uint64_t)id * FU_LAYER_BYTES + i] = xl_byte(a, logical, i);
}

static bool xl_check(layer_rig *r, int64_t id, uint64_t logical) {
  for (uint32_t a = 0; a < FU_LAYERS; a++)
    for (uint64_t i = 0; i < FU_LAYER_BYTES; i++)
      if (((uint8_t *)r->ad[a].base)[(uint64_t)id * FU_LAYER_BYTES + i] != xl_byte(a, logical, i))
        return false;
  return true;
}

/* A layered load whose every copy fails: each arena's wait and the ticket
 * report OI_ERR_IO (the first arena's error, kept by the later ones), the
 * lease is spent, and the blocks load byte-exact on a new lease. */
static void test_layered_load_every_copy_fails(void) {
  layer_rig r;
  xl_open(&r, OI_COPY_AUTO, 0);
  int64_t src[4] = {0, 1, 2, 3}, dst[4] = {4, 5, 6, 7};
  oi_block_hash hs[4];
  for (int b = 0; b < 4; b++) {
    hs[b] = fu_hash(800 + (uint64_t)b);
    xl_fill(&r, src[b], 800 + (uint64_t)b);
  }
  oi_ticket *t;
  CHECK_OK(tr_save(r.e, src, hs, 4, 60000));
  oi_load_options lo;
  oi_load_options_init(&lo);
  lo.flags = OI_LOAD_ARENA_EVENTS;
  oi_query_result q = {.struct_size = sizeof q};
  CHECK_OK(oi_engine_query(r.e, NULL, hs, 4, 0, &q));
  REQUIRE(q.hit_blocks == 4);
  REQUIRE(oi__fault_arm(OI_FAULT_COPY_FAIL, 0, 0, 0) == OI_OK);
  CHECK_OK(oi_engine_load(r.e, q.lease, dst, 4, &lo, &t));
  for (uint32_t a = 0; a < FU_LAYERS; a++)
    CHECK_ST(oi_ticket_arena_wait(t, a, 60000), OI_ERR_IO);
  CHECK_ST(oi_ticket_wait(t, 60000), OI_ERR_IO);
  oi_ticket_release(t);
  oi__fault_disarm_all();
  CHECK_ST(oi_engine_load(r.e, q.lease, dst, 4, &lo, &t), OI_ERR_LEASE_EXPIRED);
  CHECK_OK(oi_engine_query(r.e, NULL, hs, 4, 0, &q));
  REQUIRE(q.hit_blocks == 4);
  CHECK_OK(oi_engine_load(r.e, q.lease, dst, 4, &lo, &t));
  CHECK_OK(oi_ticket_wait(t, 60000));
  oi_ticket_release(t);
  for (int b = 0; b < 4; b++)
    CHECK(xl_check(&r, dst[b], 800 + (uint64_t)b));
  fu_layer_rig_close(&r);
}

/* The staged policy with groups of 64 KiB (about 6 blocks): saved layer by
 * layer (each layer's copies by DMA, a staged copy moving whole host
 * blocks), then loaded whole and layered, 16 blocks (several groups),
 * byte-exact. */
static void test_staged_layer_saves_in_small_groups(void) {
  layer_rig r;
  xl_open(&r, OI_COPY_STAGED, 64 << 10);
  enum { N = XL_BLOCKS / 2 };
  int64_t src[N], dst[N];
  oi_block_hash hs[N];
  for (int b = 0; b < N; b++) {
    src[b] = b;
    dst[b] = N + b;
    hs[b] = fu_hash(900 + (uint64_t)b);
    xl_fill(&r, src[b], 900 + (uint64_t)b);
  }
  oi_save_options so;
  oi_save_options_init(&so);
  so.arena_count = 1;
  for (uint32_t a = 0; a < FU_LAYERS; a++) {
    so.arena_first = a;
    oi_ticket *t;
    CHECK_OK(oi_engine_save(r.e, src, hs, N, &so, &t));
    CHECK_OK(oi_ticket_wait(t, 60000));
    oi_ticket_release(t);
  }
  CHECK_OK(oi_engine_flush(r.e, 60000));
  for (int layered = 0; layered < 2; layered++) {
    oi_load_options lo;
    oi_load_options_init(&lo);
    lo.flags = layered ? OI_LOAD_ARENA_EVENTS : 0;
    oi_query_result q = {.struct_size = sizeof q};
    CHECK_OK(oi_engine_query(r.e, NULL, hs, N, 0, &q));
    REQUIRE(q.hit_blocks == N);
    for (uint32_t a = 0; a < FU_LAYERS; a++)
      memset((uint8_t *)r.ad[a].base + (uint64_t)N * FU_LAYER_BYTES, 0, N * FU_LAYER_BYTES);
    oi_ticket *t;
    CHECK_OK(oi_engine_load(r.e, q.lease, dst, N, &lo, &t));
    if (layered)
      for (uint32_t a = 0; a < FU_LAYERS; a++)
        CHECK_OK(oi_ticket_arena_wait(t, a, 60000));
    CHECK_OK(oi_ticket_wait(t, 60000));
    oi_ticket_release(t);
    for (int b = 0; b < N; b++)
      CHECK(xl_check(&r, dst[b], 900 + (uint64_t)b));
  }
  fu_layer_rig_close(&r);
}

/* Jobs nobody holds a ticket for: a save whose copies fail to queue
 * (copy_submit) fails in the call with nothing visible; a load asking for
 * arena events without a ticket (none to report them on) runs as a plain
 * load and lands byte-exact. */
static void test_jobs_without_tickets(void) {
  rig r;
  rig_open(&r, 16, 4096, 32, 0, 0, 0, 0);
  int64_t ids[4] = {0, 1, 2, 3};
  oi_block_hash hs[4];
  for (int i = 0; i < 4; i++) {
    hs[i] = fu_hash(6000 + (uint64_t)i);
    fu_fill(&r, i, 6000 + (uint64_t)i);
  }
  REQUIRE(oi__fault_arm(OI_FAULT_COPY_SUBMIT, 0, 1, 0) == OI_OK);
  CHECK_ST(oi_engine_save(r.e, ids, hs, 4, NULL, NULL), OI_ERR_IO);
  oi__fault_disarm_all();
  CHECK_OK(oi_engine_flush(r.e, 10000));
  CHECK(rig_visible(&r, 6000, 4) == 0);
  rig_check_quiet(&r);
  CHECK_OK(rig_save(&r, 6000, 4));
  oi_lease l;
  REQUIRE(rig_query(&r, 6000, 4, &l) == 4);
  memset(r.arena + 8 * 4096, 0, 4 * 4096);
  oi_load_options lo;
  oi_load_options_init(&lo);
  lo.flags = OI_LOAD_ARENA_EVENTS;
  int64_t dst[4] = {8, 9, 10, 11};
  CHECK_OK(oi_engine_load(r.e, l, dst, 4, &lo, NULL));
  for (int i = 0; i < 1000 && rig_stats(&r).blocks_loading; i++)
    usleep(1000);
  rig_check_quiet(&r);
  for (int i = 0; i < 4; i++)
    CHECK(fu_check(&r, dst[i], 6000 + (uint64_t)i));
  rig_close(&r);
}

/* A layer-by-layer save whose layers are all queued at once behind a slow
 * copy, every copy failing: each layer's ticket fails OI_ERR_IO, the
 * blocks (failed by the first layer, failed again by the later ones) are
 * never visible, a flush returns, and the same blocks then save and load
 * byte-exact. */
static void test_every_layer_of_a_layered_save_fails(void) {
  layer_rig r;
  xl_open(&r, OI_COPY_AUTO, 0);
  enum { N = 4 };
  int64_t src[N], dst[N];
  oi_block_hash hs[N];
  for (int b = 0; b < N; b++) {
    src[b] = b;
    dst[b] = N + b;
    hs[b] = fu_hash(700 + (uint64_t)b);
    xl_fill(&r, src[b], 700 + (uint64_t)b);
  }
  REQUIRE(oi__fault_arm(OI_FAULT_COPY_SLOW, 0, 1, 300) == OI_OK);
  REQUIRE(oi__fault_arm(OI_FAULT_COPY_FAIL, 0, 0, 0) == OI_OK);
  oi_save_options so;
  oi_save_options_init(&so);
  so.arena_count = 1;
  oi_ticket *t[FU_LAYERS];
  for (uint32_t a = 0; a < FU_LAYERS; a++) {
    so.arena_first = a;
    CHECK_OK(oi_engine_save(r.e, src, hs, N, &so, &t[a]));
  }
  for (uint32_t a = 0; a < FU_LAYERS; a++) {
    CHECK_ST(oi_ticket_wait(t[a], 60000), OI_ERR_IO);
    oi_ticket_release(t[a]);
  }
  CHECK_OK(oi_engine_flush(r.e, 60000));
  oi__fault_disarm_all();
  oi_query_result q = {.struct_size = sizeof q};
  CHECK_OK(oi_engine_query(r.e, NULL, hs, N, 0, &q));
  CHECK(q.hit_blocks == 0);
  oi_host_stats hs_ = {.struct_size = sizeof hs_};
  CHECK_OK(oi_host_get_stats(r.h, &hs_));
  CHECK(hs_.blocks_in_flight == 0 && hs_.blocks_sealed == 0);
  for (uint32_t a = 0; a < FU_LAYERS; a++) {
    so.arena_first = a;
    oi_ticket *tt;
    CHECK_OK(oi_engine_save(r.e, src, hs, N, &so, &tt));
    CHECK_OK(oi_ticket_wait(tt, 60000));
    oi_ticket_release(tt);
  }
  CHECK_OK(oi_engine_flush(r.e, 60000));
  CHECK_OK(oi_engine_query(r.e, NULL, hs, N, 0, &q));
  REQUIRE(q.hit_blocks == N);
  CHECK_OK(tr_load(r.e, q.lease, dst, N, 60000));
  for (int b = 0; b < N; b++)
    CHECK(xl_check(&r, dst[b], 700 + (uint64_t)b));
  fu_layer_rig_close(&r);
}

int main(void) {
  REQUIRE_FAULTS();
  RUN_TEST(test_many_jobs_miss_their_deadlines_at_once);
  RUN_TEST(test_layered_load_every_copy_fails);
  RUN_TEST(test_staged_layer_saves_in_small_groups);
  RUN_TEST(test_jobs_without_tickets);
  RUN_TEST(test_every_layer_of_a_layered_save_fails);
  TEST_EXIT();
}
