/* Deadlines: a save or load whose copy outlives its deadline is reported as
 * OI_ERR_TIMEOUT (ticket and on_done), never as success; the memory stays
 * held until the copy really ends; a late save is discarded (never visible),
 * and flush still waits for it. cpu backend: a large batch and a 1 ms
 * deadline make the copy outlive it. */
#include <stdatomic.h>

#include "rig.h"
#include "testutil.h"

enum { BLOCKS = 64, BLOCK_BYTES = 4 << 20 }; /* 256 MiB: tens of ms to copy */

static atomic_int done_status = 1;
static void on_done(void *ctx, oi_status st) {
  (void)ctx;
  atomic_store(&done_status, st);
}

static void test_a_copy_past_its_deadline_is_an_error_and_never_visible(void) {
  oi_host_options ho = tr_host_options((uint64_t)(BLOCKS + 8) * BLOCK_BYTES);
  ho.chunk_bytes = 4 * (uint64_t)BLOCK_BYTES;
  oi_host *h = tr_host_new(&ho);
  uint8_t *arena = malloc((size_t)BLOCKS * BLOCK_BYTES);
  REQUIRE(arena);
  memset(arena, 0x5a, (size_t)BLOCKS * BLOCK_BYTES);
  oi_arena_desc ad = tr_arena("kv", arena, BLOCKS, BLOCK_BYTES);
  oi_engine_options eo = tr_engine_options("deadlines", &ad, 1);
  eo.save_deadline_ms = 1;
  eo.load_deadline_ms = 1;
  oi_engine *e = tr_engine_new(h, &eo);
  int64_t ids[BLOCKS];
  oi_block_hash hs[BLOCKS];
  memset(hs, 0, sizeof hs);
  for (int i = 0; i < BLOCKS; i++) {
    ids[i] = i;
    hs[i].bytes[0] = (uint8_t)i;
    hs[i].bytes[1] = 0xd1;
  }
  oi_save_options so;
  oi_save_options_init(&so);
  so.on_done = on_done;
  oi_ticket *t = NULL;
  CHECK_OK(oi_engine_save(e, ids, hs, BLOCKS, &so, &t));
  CHECK_ST(oi_ticket_wait(t, 60000), OI_ERR_TIMEOUT);
  CHECK_ST(oi_ticket_poll(t), OI_ERR_TIMEOUT); /* completed, with the error */
  CHECK(atomic_load(&done_status) == OI_ERR_TIMEOUT);
  oi_ticket_release(t);
  /* flush waits for the late copy to land; it is then discarded. */
  CHECK_OK(oi_engine_flush(e, 60000));
  oi_query_result q = {.struct_size = sizeof q};
  CHECK_OK(oi_engine_query(e, NULL, hs, BLOCKS, 0, &q));
  CHECK(q.hit_blocks == 0);
  oi_host_stats s = {.struct_size = sizeof s};
  CHECK_OK(oi_host_get_stats(h, &s));
  CHECK(s.blocks_in_flight == 0 && s.blocks_sealed == 0 && s.saves_failed == BLOCKS);
  CHECK(s.block_bytes_resident == 0); /* the slots came back only after the copy ended */
  oi_engine_destroy(e);

  /* A load past its deadline: saved with a generous deadline, loaded with 1 ms. */
  eo.save_deadline_ms = 60000;
  e = tr_engine_new(h, &eo);
  CHECK_OK(tr_save(e, ids, hs, BLOCKS, 60000));
  CHECK_OK(oi_engine_query(e, NULL, hs, BLOCKS, 0, &q));
  CHECK(q.hit_blocks == BLOCKS);
  CHECK_OK(oi_engine_load(e, q.lease, ids, BLOCKS, NULL, &t));
  CHECK_ST(oi_ticket_wait(t, 60000), OI_ERR_TIMEOUT);
  oi_ticket_release(t);
  oi_engine_destroy(e); /* waits for the late load before letting go */
  CHECK_OK(oi_host_get_stats(h, &s));
  CHECK(s.blocks_loading == 0 && s.loads_failed >= 1 && s.blocks_sealed == BLOCKS);
  oi_host_destroy(h);
  free(arena);
}

int main(void) {
  RUN_TEST(test_a_copy_past_its_deadline_is_an_error_and_never_visible);
  TEST_EXIT();
}
