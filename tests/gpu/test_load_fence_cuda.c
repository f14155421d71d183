/* The load fence on the cuda backend: a load of 1 GiB with a 2 ms deadline
 * (its copies take about 20 ms over PCIe) is fencing past the deadline, not
 * final (poll OI_FENCING, waits OI_ERR_TIMEOUT at once, each arena's too
 * for a layered load), and completes with OI_ERR_DEADLINE only once every
 * byte landed; what the caller writes into the destination afterwards is
 * still there later. Counted as failed, never completed. Whole and layered
 * (OI_LOAD_ARENA_EVENTS) loads, in the kernel and DMA copy modes. Skips
 * (77) without a GPU. */
#include "device/device.h"
#include "rig.h"
#include "testutil.h"

#define ARENAS 4
#define BLOCKS 512 /* save [0, 256), load into [256, 512) */
#define ARENA_BLOCK_BYTES (1ull << 20)

static oi_dev *dev;

static void run(uint32_t mode, bool layered) {
  const uint64_t half = BLOCKS / 2, arena_bytes = BLOCKS * ARENA_BLOCK_BYTES;
  const uint64_t region_bytes = ARENAS * arena_bytes;
  uint8_t *region = NULL;
  REQUIRE(dev->ops->mem_alloc(dev, region_bytes, 0, (void **)&region) == OI_OK);
  for (uint32_t a = 0; a < ARENAS; a++)
    REQUIRE(dev->ops->mem_fill_pattern(dev, region + a * arena_bytes, half * ARENA_BLOCK_BYTES,
                                       7 + a) == OI_OK);

  oi_host_options ho = tr_host_options((half * ARENAS * ARENA_BLOCK_BYTES) + (64ull << 20));
  ho.chunk_bytes = 64ull << 20;
  ho.device = 0;
  oi_host *h = tr_host_new(&ho);
  oi_arena_desc ad[ARENAS];
  static const char *names[ARENAS] = {"l0", "l1", "l2", "l3"};
  for (uint32_t a = 0; a < ARENAS; a++)
    ad[a] = (oi_arena_desc){.name = names[a],
                            .offset = a * arena_bytes,
                            .num_blocks = BLOCKS,
                            .bytes_per_block = ARENA_BLOCK_BYTES,
                            .block_stride = ARENA_BLOCK_BYTES,
                            .segments = 1};
  oi_engine_options eo;
  oi_engine_options_init(&eo);
  eo.device = 0;
  eo.namespace_id = "fence";
  eo.arenas = ad;
  eo.num_arenas = ARENAS;
  eo.arena_base = region;
  eo.arena_size = region_bytes;
  eo.copy_mode = mode;
  eo.load_deadline_ms = 2;
  oi_engine *e = tr_engine_new(h, &eo);

  int64_t ids[BLOCKS / 2], dst[BLOCKS / 2];
  oi_block_hash hs[BLOCKS / 2];
  for (uint64_t b = 0; b < half; b++) {
    ids[b] = (int64_t)b;
    dst[b] = (int64_t)(half + b);
    memset(&hs[b], 0, sizeof hs[b]);
    memcpy(hs[b].bytes, &b, sizeof b);
    hs[b].bytes[15] = (uint8_t)(mode * 2 + layered);
  }
  oi_ticket *t = NULL;
  CHECK_OK(tr_save(e, ids, hs, half, 60000));
  CHECK_OK(oi_engine_flush(e, 60000));
  oi_query_result q = {.struct_size = sizeof q};
  CHECK_OK(oi_engine_query(e, "r", hs, half, 0, &q));
  CHECK(q.hit_blocks == half);

  oi_load_options lo;
  oi_load_options_init(&lo);
  if (layered) lo.flags = OI_LOAD_ARENA_EVENTS;
  uint64_t t0 = oi__now_ns();
  t = NULL;
  CHECK_OK(oi_engine_load(e, q.lease, dst, half, &lo, &t));
  CHECK_ST(oi_ticket_wait(t, 60000), OI_ERR_TIMEOUT); /* at the deadline */
  uint64_t told_ns = oi__now_ns() - t0;
  oi_status polled = oi_ticket_poll(t);
  oi_status arena_polled = oi_ticket_arena_poll(t, ARENAS - 1);
  oi_status arena_waited = oi_ticket_arena_wait(t, ARENAS - 1, 60000);
  while (oi_ticket_poll(t) == OI_FENCING)
    ;
  uint64_t final_ns = oi__now_ns() - t0;
  CHECK_ST(oi_ticket_poll(t), OI_ERR_DEADLINE);
  CHECK(polled == OI_FENCING);
  CHECK(arena_polled == OI_FENCING || arena_polled == OI_ERR_DEADLINE);
  CHECK(arena_waited == OI_ERR_TIMEOUT || arena_waited == OI_ERR_DEADLINE);
  CHECK_ST(oi_ticket_wait(t, 0), OI_ERR_DEADLINE);
  CHECK_ST(oi_ticket_arena_wait(t, 0, 0), OI_ERR_DEADLINE);
  oi_ticket_release(t);

  /* Final: every byte already landed (the copies ended first)... */
  uint8_t *src = malloc(half * ARENA_BLOCK_BYTES), *got = malloc(half * ARENA_BLOCK_BYTES),
          *later = malloc(half * ARENA_BLOCK_BYTES);
  REQUIRE(src && got && later);
  uint64_t wrong = 0;
  for (uint32_t a = 0; a < ARENAS; a++) {
    uint8_t *arena = region + a * arena_bytes;
    REQUIRE(dev->ops->mem_copy(dev, src, arena, half * ARENA_BLOCK_BYTES) == OI_OK);
    REQUIRE(dev->ops->mem_copy(dev, got, arena + half * ARENA_BLOCK_BYTES,
                               half * ARENA_BLOCK_BYTES) == OI_OK);
    wrong += memcmp(src, got, half * ARENA_BLOCK_BYTES) != 0;
  }
  CHECK(wrong == 0);
  /* ...and what the caller writes now stays. */
  for (uint32_t a = 0; a < ARENAS; a++)
    REQUIRE(dev->ops->mem_fill_pattern(dev, region + a * arena_bytes + half * ARENA_BLOCK_BYTES,
                                       half * ARENA_BLOCK_BYTES, 1000 + a) == OI_OK);
  usleep(200000);
  for (uint32_t a = 0; a < ARENAS; a++) {
    uint8_t *arena = region + a * arena_bytes;
    REQUIRE(dev->ops->mem_fill_pattern(dev, region + a * arena_bytes, half * ARENA_BLOCK_BYTES,
                                       1000 + a) == OI_OK); /* the expected bytes, at the source */
    REQUIRE(dev->ops->mem_copy(dev, src, arena, half * ARENA_BLOCK_BYTES) == OI_OK);
    REQUIRE(dev->ops->mem_copy(dev, later, arena + half * ARENA_BLOCK_BYTES,
                               half * ARENA_BLOCK_BYTES) == OI_OK);
    CHECK(memcmp(src, later, half * ARENA_BLOCK_BYTES) == 0);
  }
  oi_engine_stats es;
  es.struct_size = sizeof es;
  CHECK_OK(oi_engine_get_stats(e, &es));
  CHECK(es.loads_failed == 1 && es.loads_completed == 0);
  fprintf(stderr, "  mode %u%s: told after %.2f ms, final after %.2f ms (1 GiB)\n", mode,
          layered ? " layered" : "", told_ns / 1e6, final_ns / 1e6);
  CHECK(told_ns < final_ns);
  free(src);
  free(got);
  free(later);
  oi_engine_destroy(e);
  oi_host_destroy(h);
  dev->ops->mem_free(dev, region);
}

int main(void) {
  int n = 0;
  oi_device_count(&n);
  if (n == 0) TEST_SKIP("no CUDA device");
  REQUIRE(oi__dev_open(0, &dev) == OI_OK);
  run(OI_COPY_KERNEL, false);
  run(OI_COPY_DMA, false);
  run(OI_COPY_KERNEL, true);
  run(OI_COPY_DMA, true);
  oi__dev_close(dev);
  fprintf(stderr, "%-60s %s\n", "test_a_late_cuda_load_is_fenced",
          oi_test_failures ? "FAILED" : "ok");
  TEST_EXIT();
}
