/* Overlapped restores whose load is still copying when the forward runs
 * (restore_overlap HOST on the cpu backend; the copy_slow fault holds the
 * load for 300 ms, longer than restore_timeout_ms, so the worker runs the
 * forward before the load ends):
 *   - the forward fails: the request fails, and its restore blocks stay held
 *     by the executor's orphans until the copy ends, then go back to the pool;
 *   - the forward succeeds on KV that had not landed: its results are
 *     discarded and the prompt is prefilled, byte-identical to its cold run.
 * The same prompt then restores normally, byte-identical too.
 *
 * The executor's release saves (embedded, no overlap):
 *   - a save whose copies cannot be queued (copy_submit) fails inside the
 *     call: the request still finishes, its blocks are unpinned at once and
 *     nothing reaches the host tier; the next run of the prompt saves them,
 *     and after that it restores, byte-identical;
 *   - a flush shorter than a slow save (copy_slow) times out naming the
 *     rank, and the next flush returns once the save landed;
 *   - a restore whose host query fails (lease_alloc): prefilled;
 *   - a restore abandoned while its load copies: prefilled, and destroy
 *     waits for the copy before it frees the arena. */
#include "fault_util.h"
#include "openinfer/executor.h"

#define PAGE 4
#define PROMPT 26 /* 6 full blocks restorable, 2 tokens computed */
#define MAX_NEW 4

static oi_model_ops ref_ops;
static void *ref_ctx;
static atomic_int fail_forward;

static oi_status failing_forward(void *ctx, const oi_model_batch *b) {
  if (atomic_load(&fail_forward)) return oi__fail(OI_ERR_IO, "forward failed (injected)");
  return ref_ops.forward(ctx, b);
}

/* The reference model, default options, into ref_ops and ref_ctx. */
static void ref_model_create(void) {
  oi_refmodel_options ro;
  oi_refmodel_options_init(&ro);
  ref_ops.struct_size = sizeof ref_ops;
  REQUIRE(oi_refmodel_create(&ro, &ref_ops, &ref_ctx) == OI_OK);
}

/* Executor options over `ops` (context ref_ctx): PAGE, 32 GPU blocks, the
 * host tier embedded. */
static oi_executor_options embedded_options(const oi_model_ops *ops) {
  oi_executor_options o;
  oi_executor_options_init(&o);
  o.model = ops;
  o.model_ctx = ref_ctx;
  o.page_size = PAGE;
  o.gpu_blocks = 32;
  o.offload = OI_OFFLOAD_EMBEDDED;
  return o;
}

static oi_executor_stats stats(oi_executor *x) {
  oi_executor_stats s = {.struct_size = sizeof s};
  CHECK_OK(oi_executor_get_stats(x, &s));
  return s;
}

/* Steps until no block is active any more (2 s at the most). */
static void step_until_no_block_is_active(oi_executor *x) {
  for (int i = 0; i < 200 && stats(x).blocks_active; i++) {
    usleep(10000);
    CHECK_OK(oi_executor_step(x, NULL));
  }
}

static void run(oi_executor *x, const uint32_t *p, uint32_t *tokens) {
  uint64_t id = tr_submit(x, p, PROMPT, MAX_NEW, -1);
  CHECK_OK(oi_executor_run_until_idle(x));
  oi_request_result rr = {.struct_size = sizeof rr};
  CHECK_OK(oi_executor_get_result(x, id, &rr));
  CHECK(rr.state == OI_REQUEST_FINISHED && rr.n_tokens == MAX_NEW);
  if (rr.n_tokens == MAX_NEW) memcpy(tokens, rr.tokens, sizeof(uint32_t) * MAX_NEW);
}

static void test_overlapped_restore_with_its_load_still_copying(void) {
  ref_model_create();
  oi_model_ops ops = ref_ops;
  ops.forward = failing_forward;
  oi_executor_options o = embedded_options(&ops);
  o.restore_timeout_ms = 50;
  o.restore_overlap = OI_RESTORE_OVERLAP_HOST;
  oi_executor *x = NULL;
  REQUIRE(oi_executor_create(&o, &x) == OI_OK);

  uint32_t p[PROMPT], cold[MAX_NEW], warm[MAX_NEW];
  for (uint32_t i = 0; i < PROMPT; i++)
    p[i] = (i * 37 + 11) % 512;
  run(x, p, cold);
  CHECK_OK(oi_executor_flush(x, 10000));
  CHECK_OK(oi_executor_evict_gpu_cache(x, NULL));
  oi_executor_stats before = stats(x);

  /* The next copy (the restore's load) sleeps 300 ms; the forward fails. */
  REQUIRE(oi__fault_arm(OI_FAULT_COPY_SLOW, 0, 1, 300) == OI_OK);
  atomic_store(&fail_forward, 1);
  uint64_t id = tr_submit(x, p, PROMPT, MAX_NEW, -1);
  CHECK(oi_executor_step(x, NULL) == OI_ERR_IO);
  atomic_store(&fail_forward, 0);
  oi_request_result rr = {.struct_size = sizeof rr};
  CHECK_OK(oi_executor_get_result(x, id, &rr));
  CHECK(rr.state == OI_REQUEST_FAILED);
  oi_executor_stats s = stats(x);
  CHECK(s.restores_overlapped == before.restores_overlapped + 1);
  CHECK(s.restores_failed == before.restores_failed + 1);
  /* The load is still copying into the 6 restore blocks: the failed request
   * let go of its blocks, but those 6 are still held. */
  CHECK(s.blocks_active == 6);

  /* Once the copy ends, a step's poll hands them back. */
  step_until_no_block_is_active(x);
  s = stats(x);
  CHECK(s.blocks_active == 0 && s.blocks_free + s.blocks_cached == s.blocks_total);
  CHECK(s.leases_held == 0);

  /* A forward that succeeds while the load is still copying (it read KV
   * that had not landed): its results are discarded, the load is abandoned
   * at restore_timeout_ms, and the prompt is prefilled -- same tokens. */
  CHECK_OK(oi_executor_evict_gpu_cache(x, NULL));
  before = stats(x);
  REQUIRE(oi__fault_arm(OI_FAULT_COPY_SLOW, 0, 1, 300) == OI_OK);
  uint32_t late[MAX_NEW];
  run(x, p, late);
  CHECK(!memcmp(cold, late, sizeof cold));
  s = stats(x);
  CHECK(s.restores_overlapped == before.restores_overlapped + 1);
  CHECK(s.restores_failed == before.restores_failed + 1);
  CHECK(s.restores_completed == before.restores_completed);
  CHECK(s.prefill_tokens == before.prefill_tokens + PROMPT);
  step_until_no_block_is_active(x);
  CHECK(stats(x).blocks_active == 0);

  oi__fault_disarm_all();
  CHECK_OK(oi_executor_flush(x, 10000));
  CHECK_OK(oi_executor_evict_gpu_cache(x, NULL));
  before = stats(x);
  run(x, p, warm);
  CHECK(!memcmp(cold, warm, sizeof cold));
  CHECK(stats(x).restores_completed == before.restores_completed + 1);
  oi_executor_destroy(x);
  oi_refmodel_destroy(ref_ctx);
}

static void test_release_saves_that_fail_or_lag(void) {
  ref_model_create();
  oi_executor_options o = embedded_options(&ref_ops);
  o.restore_overlap = OI_RESTORE_OVERLAP_OFF;
  o.namespace_id = "release-save-fault";
  oi_executor *x = NULL;
  REQUIRE(oi_executor_create(&o, &x) == OI_OK);
  uint32_t p[PROMPT], cold[MAX_NEW], again[MAX_NEW], warm[MAX_NEW];
  for (uint32_t i = 0; i < PROMPT; i++)
    p[i] = (i * 53 + 5) % 512;

  /* The release save's copies cannot be queued: the save call fails. */
  REQUIRE(oi__fault_arm(OI_FAULT_COPY_SUBMIT, 0, 1, 0) == OI_OK);
  run(x, p, cold);
  CHECK(oi__fault_fired(OI_FAULT_COPY_SUBMIT) == 1);
  oi__fault_disarm_all();
  oi_executor_stats s = stats(x);
  CHECK(s.saves_submitted == 0);
  CHECK(s.save_blocks_pending == 0 && s.blocks_active == 0); /* unpinned at once */
  CHECK(s.blocks_cached > 0 && s.blocks_free + s.blocks_cached == s.blocks_total);
  CHECK_OK(oi_executor_flush(x, 10000));

  /* Nothing reached the host tier: evicted from the GPU cache, the prompt
   * is computed again (and saved this time). */
  CHECK_OK(oi_executor_evict_gpu_cache(x, NULL));
  oi_executor_stats before = stats(x);
  run(x, p, again);
  CHECK(!memcmp(cold, again, sizeof cold));
  s = stats(x);
  CHECK(s.restores_started == before.restores_started);
  CHECK(s.prefill_tokens == before.prefill_tokens + PROMPT);
  CHECK(s.saves_submitted > 0);

  /* A flush shorter than the slow save times out, naming the rank. */
  CHECK_OK(oi_executor_flush(x, 10000));
  CHECK_OK(oi_executor_evict_gpu_cache(x, NULL));
  uint32_t q[PROMPT + 8];
  for (uint32_t i = 0; i < PROMPT + 8; i++)
    q[i] = (i * 29 + 3) % 512;
  REQUIRE(oi__fault_arm(OI_FAULT_COPY_SLOW, 0, 0, 400) == OI_OK);
  oi_request r;
  oi_request_init(&r);
  r.prompt = q;
  r.prompt_len = PROMPT + 8;
  r.max_new_tokens = MAX_NEW;
  uint64_t id = 0;
  CHECK_OK(oi_executor_submit(x, &r, &id));
  CHECK_OK(oi_executor_run_until_idle(x));
  CHECK(stats(x).save_blocks_pending > 0);
  CHECK_ST(oi_executor_flush(x, 20), OI_ERR_TIMEOUT);
  CHECK(strstr(oi_last_error(), "rank 0 still has saves in flight after 20 ms"));
  CHECK_OK(oi_executor_flush(x, UINT32_MAX)); /* no deadline: returns once they landed */
  oi__fault_disarm_all();
  CHECK(stats(x).save_blocks_pending == 0);

  /* The host query of a restore fails (its lease finds no memory): the
   * prompt is prefilled, nothing leased. */
  CHECK_OK(oi_executor_evict_gpu_cache(x, NULL));
  before = stats(x);
  REQUIRE(oi__fault_arm(OI_FAULT_LEASE_ALLOC, 0, 1, 0) == OI_OK);
  uint32_t refused[MAX_NEW];
  run(x, p, refused);
  CHECK(oi__fault_fired(OI_FAULT_LEASE_ALLOC) == 1);
  oi__fault_disarm_all();
  CHECK(!memcmp(cold, refused, sizeof cold));
  s = stats(x);
  CHECK(s.restores_started == before.restores_started && s.leases_held == 0);
  CHECK(s.prefill_tokens == before.prefill_tokens + PROMPT);
  CHECK_OK(oi_executor_flush(x, 10000));

  /* The saved prompt restores, byte-identical. */
  CHECK_OK(oi_executor_evict_gpu_cache(x, NULL));
  before = stats(x);
  run(x, p, warm);
  CHECK(!memcmp(cold, warm, sizeof cold));
  s = stats(x);
  CHECK(s.restores_completed == before.restores_completed + 1);
  CHECK(s.restored_tokens == before.restored_tokens + 24);
  oi_executor_destroy(x);

  /* A restore abandoned at restore_timeout_ms (its load sleeps 2 s): the
   * prompt is prefilled, and the executor destroyed while the load still
   * copies into its blocks waits for the copy before the arena goes (ASan
   * sees any write after the free). */
  o.restore_timeout_ms = 100;
  REQUIRE(oi_executor_create(&o, &x) == OI_OK); /* a new host: saved again first */
  run(x, p, again);
  CHECK(!memcmp(cold, again, sizeof cold));
  CHECK_OK(oi_executor_flush(x, 10000));
  CHECK_OK(oi_executor_evict_gpu_cache(x, NULL));
  before = stats(x);
  REQUIRE(oi__fault_arm(OI_FAULT_COPY_SLOW, 0, 1, 2000) == OI_OK);
  uint64_t t0 = oi__now_ns();
  run(x, p, warm);
  CHECK(!memcmp(cold, warm, sizeof cold));
  s = stats(x);
  CHECK(s.restores_failed == before.restores_failed + 1);
  CHECK(s.prefill_tokens == before.prefill_tokens + PROMPT);
  bool copying = oi__now_ns() - t0 < 1500000000ull;
  if (copying) CHECK(s.blocks_active == 6); /* the abandoned load's blocks */
  oi_executor_destroy(x);
  if (copying) CHECK(oi__now_ns() - t0 >= 2000000000ull); /* destroy waited for the copy */
  oi__fault_disarm_all();
  oi_refmodel_destroy(ref_ctx);
}

int main(void) {
  REQUIRE_FAULTS();
  RUN_TEST(test_overlapped_restore_with_its_load_still_copying);
  RUN_TEST(test_release_saves_that_fail_or_lag);
  TEST_EXIT();
}
