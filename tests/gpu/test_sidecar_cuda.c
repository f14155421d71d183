/* The sidecar on a GPU: `openinfer serve --device 0` owns the pool and
 * allocates the client's KV arena with cudaMalloc; the client imports it over
 * CUDA IPC (64-byte handle, size verified), writes patterns into it, and the
 * server's save and load (copies it runs on memory it owns) bring every byte
 * back into different block ids. Skips (77) without a GPU. */
#include "../sidecar/sidecar_util.h"
#include "device/device.h"

int main(int argc, char **argv) {
  test_server ts;
  const char *extra[] = {"--device", "0", "--arena-devices", "0", NULL};
  if (!ts_gpu_open(&ts, argc, argv, extra)) TEST_SKIP("no CUDA device");

  TL_CLIENT(a, o, e, arena);
  tl_options(&o, a, "gpu-sidecar");
  o.device = 0;
  e = NULL;
  arena = NULL;
  CHECK_OK(oi_engine_connect(ts.socket, &o, &e, &arena));
  REQUIRE(e && arena);
  uint64_t total = 0;
  tl_arenas(a, &total);
  CHECK(oi_imported_arena_size(arena) >= total);
  oi_dev *dev = NULL;
  REQUIRE(oi__dev_open(0, &dev) == OI_OK);
  uint8_t *mirror = calloc(1, total);
  REQUIRE(mirror);
  enum { SAVED = 8 };
  int64_t ids[SAVED], dst[SAVED];
  oi_block_hash hs[SAVED];
  for (int i = 0; i < SAVED; i++) {
    ids[i] = i;
    dst[i] = TL_BLOCKS - 1 - i;
    hs[i] = tl_hash(7, (uint64_t)i);
    tl_fill(mirror, a, ids[i], (uint64_t)i);
  }
  /* The arena is device memory the server allocated: write it from here. */
  CHECK_OK(dev->ops->mem_copy(dev, oi_imported_arena_ptr(arena), mirror, total));
  CHECK_OK(tr_save(e, ids, hs, SAVED, 30000));
  CHECK_OK(oi_engine_flush(e, 30000));
  oi_query_result q = {.struct_size = sizeof q};
  CHECK_OK(oi_engine_query(e, "gpu", hs, SAVED, 0, &q));
  CHECK(q.hit_blocks == SAVED);
  CHECK_OK(tr_load(e, q.lease, dst, SAVED, 30000));
  memset(mirror, 0, total);
  CHECK_OK(dev->ops->mem_copy(dev, mirror, oi_imported_arena_ptr(arena), total));
  int bad = 0;
  for (int i = 0; i < SAVED; i++) {
    bad += !tl_check(mirror, a, dst[i], (uint64_t)i); /* restored, reversed */
    bad += !tl_check(mirror, a, ids[i], (uint64_t)i); /* the source is untouched */
  }
  for (int64_t id = SAVED; id < TL_BLOCKS - SAVED; id++)
    bad += !tl_is_zero(mirror, a, id);
  CHECK(bad == 0);
  fprintf(stderr, "  sidecar over CUDA IPC: %d blocks restored, %s\n", SAVED,
          bad ? "MISMATCH" : "bytes match");
  /* Drop order: close the mapping, then the engine flushes and unregisters. */
  oi_imported_arena_close(arena);
  oi_engine_destroy(e);
  oi__dev_close(dev);
  free(mirror);
  CHECK(ts_stop(&ts));
  ts_cleanup(&ts);
  fprintf(stderr, "%-60s %s\n", "test_sidecar_round_trip_over_cuda_ipc",
          oi_test_failures ? "FAILED" : "ok");
  TEST_EXIT();
}
