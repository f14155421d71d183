/* The executor's restore plan (docs/planner.md) with the reference model on
 * the cpu backend, embedded; argv[1] "embedded". Each test compares a warm
 * run against the cold run of the same prompt: the same generated tokens
 * and the same KV bytes, whatever the plan chose.
 *   - a fast pool (the seeded link rate): the plan loads every block;
 *   - a slow disk (a configured rate): the plan computes; the time to first
 *     token is no worse than cold (min of 3 runs, with a margin for a shared
 *     machine), while the same restore without a plan waits for the disk;
 *   - a link about as fast as prefill (configured rates and prefill cost):
 *     the head is computed while the rest loads (a split), from the pool
 *     and from the disk (its blocks promoted while the head runs);
 *   - OI_RESTORE_PLAN_OFF loads every hit; bad plan options are refused. */
#include "exec_testutil.h"
#include "executor/executor_internal.h"
#include "openinfer/disk.h"

#define PROMPT 26                                      /* 6 full blocks + 2 tokens */
#define RESTORABLE (((PROMPT - 1) / PAGE) * PAGE)      /* 24 */
#define KV_FULL_BLOCKS ((PROMPT + MAX_NEW - 1) / PAGE) /* 10 */

typedef struct rig {
  char dir[64];
  oi_host *host;
  oi_executor *x;
} rig;

static void rig_open(rig *g, bool disk, const oi_executor_options *extra, const char *ns) {
  memset(g, 0, sizeof *g);
  oi_host_options ho = tr_host_options(8ull << 20);
  ho.flags = OI_HOST_NO_PIN;
  g->host = tr_host_new(&ho);
  if (disk) {
    snprintf(g->dir, sizeof g->dir, "/tmp/oi-plan-XXXXXX");
    REQUIRE(mkdtemp(g->dir));
    oi_host_disk_options d;
    oi_host_disk_options_init(&d);
    const char *dirs[1] = {g->dir};
    d.dirs = dirs;
    d.num_dirs = 1;
    d.capacity_bytes = 64ull << 20;
    CHECK_OK(oi_host_attach_disk(g->host, &d));
  }
  oi_executor_options o = *extra;
  o.namespace_id = ns;
  o.host = g->host;
  REQUIRE(oi_executor_create(&o, &g->x) == OI_OK);
}

static void rig_close(rig *g) {
  oi_executor_destroy(g->x);
  oi_host_destroy(g->host);
  if (g->dir[0]) tu_remove_dir(g->dir);
}

static oi_executor_options plan_options(void) {
  oi_executor_options o;
  exec_options(&o, OI_OFFLOAD_EMBEDDED);
  return o;
}

static uint64_t spilled(oi_host *h) {
  oi_host_disk_stats d = {.struct_size = sizeof d};
  CHECK_OK(oi_host_get_disk_stats(h, &d));
  return d.spills + d.spills_skipped + d.spills_failed + d.spill_overflow;
}

/* Out of the GPU cache; with a disk, out of the pool too (every block the
 * pool sealed written first), so the blocks are on disk only. */
static void push_down(rig *g, bool to_disk) {
  CHECK_OK(oi_executor_flush(g->x, 10000));
  if (to_disk) {
    oi_host_stats hs = {.struct_size = sizeof hs};
    CHECK_OK(oi_host_get_stats(g->host, &hs));
    for (int i = 0; i < 2000 && spilled(g->host) < hs.blocks_sealed; i++)
      usleep(5000);
    CHECK_OK(oi_host_evict_all(g->host, NULL));
    CHECK_OK(oi_host_get_stats(g->host, &hs));
    CHECK(hs.blocks_sealed == 0);
  }
  CHECK_OK(oi_executor_evict_gpu_cache(g->x, NULL));
}

static oi_executor_stats stats_of(oi_executor *x) {
  oi_executor_stats s = {.struct_size = sizeof s};
  CHECK_OK(oi_executor_get_stats(x, &s));
  return s;
}

/* Same tokens and KV bytes as the cold run's. */
static void check_parity(oi_executor *x, const run_out *cold, const uint8_t *cold_kv, size_t bytes,
                         const run_out *warm) {
  CHECK(same_tokens(cold, warm));
  size_t b2 = 0;
  uint8_t *kv = kv_snapshot(x, 0, warm->id, KV_FULL_BLOCKS, &b2);
  CHECK(b2 == bytes && !memcmp(kv, cold_kv, bytes));
  free(kv);
}

static void test_fast_pool_loads(void) {
  oi_executor_options o = plan_options();
  rig g;
  rig_open(&g, false, &o, "p-pool");
  uint32_t p[PROMPT];
  make_prompt(p, PROMPT, 21);
  run_out cold, warm;
  run_one(g.x, p, PROMPT, -1, &cold);
  size_t bytes = 0;
  uint8_t *cold_kv = kv_snapshot(g.x, 0, cold.id, KV_FULL_BLOCKS, &bytes);
  oi_executor_stats s = stats_of(g.x);
  CHECK(s.prefill_samples > 0 && s.prefill_ns_per_token + s.prefill_ns_per_token_ctx > 0);
  push_down(&g, false);
  run_one(g.x, p, PROMPT, -1, &warm);
  s = stats_of(g.x);
  CHECK(s.plans == 1 && s.plans_compute == 0 && s.plans_partial == 0 && s.plans_split == 0);
  CHECK(warm.res.restored_tokens == RESTORABLE && warm.res.computed_tokens == PROMPT - RESTORABLE);
  check_parity(g.x, &cold, cold_kv, bytes, &warm);
  free(cold_kv);
  rig_close(&g);
}

/* The plan switched between runs of one executor (what bench ttft does
 * for its load-only and planned rows): off, the next restore loads every
 * hit without a plan; back on, it is planned again; a mode that is not one
 * is refused and changes nothing. */
static void test_plan_switched_between_runs(void) {
  oi_executor_options o = plan_options();
  rig g;
  rig_open(&g, false, &o, "p-switch");
  uint32_t p[PROMPT];
  make_prompt(p, PROMPT, 23);
  run_out cold, warm;
  run_one(g.x, p, PROMPT, -1, &cold);
  CHECK_ST(oi__executor_set_restore_plan(g.x, 7), OI_ERR_INVALID_ARGUMENT);
  CHECK(strstr(oi_last_error(), "7 is not an oi_restore_plan_mode"));
  CHECK_ST(oi__executor_set_restore_plan(NULL, OI_RESTORE_PLAN_OFF), OI_ERR_INVALID_ARGUMENT);
  CHECK_OK(oi__executor_set_restore_plan(g.x, OI_RESTORE_PLAN_OFF));
  push_down(&g, false);
  run_one(g.x, p, PROMPT, -1, &warm);
  oi_executor_stats s = stats_of(g.x);
  CHECK(s.plans == 0 && warm.res.restored_tokens == RESTORABLE);
  CHECK(same_tokens(&cold, &warm));
  CHECK_OK(oi__executor_set_restore_plan(g.x, OI_RESTORE_PLAN_AUTO));
  push_down(&g, false);
  run_one(g.x, p, PROMPT, -1, &warm);
  s = stats_of(g.x);
  CHECK(s.plans == 1 && warm.res.restored_tokens == RESTORABLE);
  CHECK(same_tokens(&cold, &warm));
  rig_close(&g);
}

/* TTFT of the prompt run 3 times after push_down each time: the minimum. */
static uint64_t best_ttft(rig *g, const uint32_t *p, bool to_disk, run_out *last) {
  uint64_t best = UINT64_MAX;
  for (int i = 0; i < 3; i++) {
    push_down(g, to_disk);
    run_one(g->x, p, PROMPT, -1, last);
    if (last->res.ttft_ns < best) best = last->res.ttft_ns;
  }
  return best;
}

static void test_slow_disk_computes(void) {
  oi_executor_options o = plan_options();
  o.disk_bytes_per_s = 1000; /* a disk that gives 1 kB/s: 2 s a block */
  rig g;
  rig_open(&g, true, &o, "p-disk-slow");
  uint32_t p[PROMPT];
  make_prompt(p, PROMPT, 22);
  run_out cold, warm;
  run_one(g.x, p, PROMPT, -1, &cold);
  size_t bytes = 0;
  uint8_t *cold_kv = kv_snapshot(g.x, 0, cold.id, KV_FULL_BLOCKS, &bytes);
  /* Cold again for the timing: the GPU cache and the pool emptied, the
   * disk not attached to this namespace's blocks (another prompt). */
  uint32_t p2[PROMPT];
  make_prompt(p2, PROMPT, 23);
  run_out c2;
  uint64_t cold_ttft = UINT64_MAX;
  for (int i = 0; i < 3; i++) {
    p2[0] = (uint32_t)(100 + i); /* a new prompt each time: cold */
    run_one(g.x, p2, PROMPT, -1, &c2);
    CHECK(c2.res.computed_tokens == PROMPT);
    if (c2.res.ttft_ns < cold_ttft) cold_ttft = c2.res.ttft_ns;
  }
  uint64_t warm_ttft = best_ttft(&g, p, true, &warm);
  oi_executor_stats s = stats_of(g.x);
  CHECK(s.plans >= 3 && s.plans_compute >= 3);
  CHECK(warm.res.restored_tokens == 0 && warm.res.computed_tokens == PROMPT);
  CHECK(s.restores_started == 0);
  check_parity(g.x, &cold, cold_kv, bytes, &warm);
  fprintf(stderr, "  slow disk: planned (computed) ttft %.3f ms, cold %.3f ms\n", warm_ttft / 1e6,
          cold_ttft / 1e6);
  /* Computing costs what cold does (the same work: within this machine's
   * noise, which sanitizers and parallel builds make large); loading would
   * have cost 2 s a block at the configured rate. */
  CHECK(warm_ttft < 1000000000ull);
  free(cold_kv);
  rig_close(&g);

  /* The same blocks without a plan come back from the disk. */
  o.restore_plan = OI_RESTORE_PLAN_OFF;
  rig_open(&g, true, &o, "p-disk-noplan");
  run_one(g.x, p, PROMPT, -1, &cold);
  push_down(&g, true);
  run_one(g.x, p, PROMPT, -1, &warm);
  s = stats_of(g.x);
  CHECK(s.plans == 0 && warm.res.restored_tokens == RESTORABLE);
  CHECK(same_tokens(&cold, &warm));
  rig_close(&g);
}

/* Configured so that a block's copy costs what its prefill does (1 ms a
 * token, 4 ms a block of 4): the best plan computes 3 blocks while the
 * other 3 load (14 ms in the model, against 26 cold and 26 loading all). */
static void test_split(bool disk) {
  oi_executor_options o = plan_options();
  o.prefill_ns_per_token = 1e6;
  oi_executor_stats s0;
  rig g;
  rig_open(&g, disk, &o, disk ? "p-split-disk" : "p-split-pool");
  oi_kv_layout kv = {.struct_size = sizeof kv};
  CHECK_OK(oi_executor_get_kv_layout(g.x, 0, &kv));
  uint64_t block_bytes = (uint64_t)kv.num_layers * 2 * PAGE * kv.token_stride;
  rig_close(&g);
  o.link_bytes_per_s = block_bytes * 1000 / 4;           /* 4 ms a block */
  o.disk_bytes_per_s = disk ? block_bytes * 1000000 : 0; /* the disk adds 1 us a block */
  rig_open(&g, disk, &o, disk ? "p-split-disk" : "p-split-pool");
  uint32_t p[PROMPT];
  make_prompt(p, PROMPT, disk ? 25 : 24);
  run_out cold, warm;
  run_one(g.x, p, PROMPT, -1, &cold);
  size_t bytes = 0;
  uint8_t *cold_kv = kv_snapshot(g.x, 0, cold.id, KV_FULL_BLOCKS, &bytes);
  push_down(&g, disk);
  s0 = stats_of(g.x);
  run_one(g.x, p, PROMPT, -1, &warm);
  oi_executor_stats s = stats_of(g.x);
  CHECK(s.plans - s0.plans == 1 && s.plans_split - s0.plans_split == 1);
  CHECK(s.prefill_ns_per_token == 1e6); /* given: not refitted */
  CHECK(warm.res.restored_tokens == 3 * PAGE);
  CHECK(warm.res.computed_tokens == PROMPT - 3 * PAGE);
  CHECK(s.restores_completed - s0.restores_completed == 1 && s.restores_failed == 0);
  check_parity(g.x, &cold, cold_kv, bytes, &warm);
  CHECK_OK(oi_executor_flush(g.x, 10000));
  s = stats_of(g.x);
  CHECK(s.leases_held == 0 && s.blocks_active == 0);
  free(cold_kv);
  rig_close(&g);
}

static void test_split_from_pool(void) { test_split(false); }
static void test_split_from_disk(void) { test_split(true); }

static void test_bad_plan_options_are_refused(void) {
  oi_executor_options o = plan_options();
  oi_executor *x = NULL;
  o.restore_plan = 7;
  CHECK_ST(oi_executor_create(&o, &x), OI_ERR_INVALID_ARGUMENT);
  CHECK(strstr(oi_last_error(), "restore_plan 7"));
  o = plan_options();
  o.prefill_ns_per_token = -1;
  CHECK_ST(oi_executor_create(&o, &x), OI_ERR_INVALID_ARGUMENT);
  CHECK(strstr(oi_last_error(), "prefill_ns_per_token"));
  CHECK(x == NULL);
}

int main(int argc, char **argv) {
  (void)argc;
  (void)argv;
  model_init();
  RUN_TEST(test_fast_pool_loads);
  RUN_TEST(test_slow_disk_computes);
  RUN_TEST(test_split_from_pool);
  RUN_TEST(test_split_from_disk);
  RUN_TEST(test_bad_plan_options_are_refused);
  RUN_TEST(test_plan_switched_between_runs);
  oi_refmodel_destroy(model_ctx);
  TEST_EXIT();
}
