/* Engine-owned device memory in sidecar mode: the client allocates its KV
 * arena with cudaMalloc (inside a larger allocation, at an offset), connects
 * with arena_base set, and `openinfer serve --device 0` imports the
 * allocation over CUDA IPC (size checked) and copies into and out of it.
 * Then the server is SIGKILLed: the client degrades (queries miss, saves
 * drop, loads fail), never runs the fatal handler, reconnects to a server
 * restarted on the same socket (a new epoch) and round-trips byte-exact
 * again. Bad memory is refused at connect. Skips (77) without a GPU. */
#include "../sidecar/sidecar_util.h"
#include "device/device.h"

#define LEAD 4096 /* the arena starts this far into its allocation */

static oi_status stats_of(oi_engine *e, oi_engine_stats *s) {
  memset(s, 0, sizeof *s);
  s->struct_size = sizeof *s;
  return oi_engine_get_stats(e, s);
}

static bool wait_connection(oi_engine *e, uint32_t state, oi_engine_stats *s) {
  for (int i = 0; i < 3000; i++) {
    if (stats_of(e, s) == OI_OK && s->connection == state) return true;
    usleep(10000);
  }
  return false;
}

/* Writes 8 logical blocks from `first` into ids 0..7, saves, queries, loads
 * into ids 31..24 and compares every byte of the arena. */
static int round_trip(oi_engine *e, oi_dev *dev, uint8_t *arena, const oi_arena_desc *a,
                      uint64_t total, uint32_t salt, uint64_t first) {
  enum { SAVED = 8 };
  uint8_t *mirror = calloc(1, total);
  REQUIRE(mirror);
  int64_t ids[SAVED], dst[SAVED];
  oi_block_hash hs[SAVED];
  for (int i = 0; i < SAVED; i++) {
    ids[i] = i;
    dst[i] = TL_BLOCKS - 1 - i;
    hs[i] = tl_hash(salt, first + (uint64_t)i);
    tl_fill(mirror, a, ids[i], first + (uint64_t)i);
  }
  CHECK_OK(dev->ops->mem_copy(dev, arena, mirror, total));
  oi_ticket *t = NULL;
  CHECK_OK(tr_save(e, ids, hs, SAVED, 30000));
  CHECK_OK(oi_engine_flush(e, 30000));
  oi_query_result q = {.struct_size = sizeof q};
  CHECK_OK(oi_engine_query(e, NULL, hs, SAVED, 0, &q));
  CHECK(q.hit_blocks == SAVED);
  t = NULL;
  CHECK_OK(oi_engine_load(e, q.lease, dst, SAVED, NULL, &t));
  if (t) CHECK_OK(oi_ticket_wait(t, 30000));
  oi_ticket_release(t);
  memset(mirror, 0, total);
  CHECK_OK(dev->ops->mem_copy(dev, mirror, arena, total));
  int bad = 0;
  for (int i = 0; i < SAVED; i++) {
    bad += !tl_check(mirror, a, dst[i], first + (uint64_t)i);
    bad += !tl_check(mirror, a, ids[i], first + (uint64_t)i);
  }
  free(mirror);
  return bad;
}

int main(int argc, char **argv) {
  test_server ts;
  const char *extra[] = {"--device", "0", "--arena-devices", "0", NULL};
  if (!ts_gpu_open(&ts, argc, argv, extra)) TEST_SKIP("no CUDA device");

  oi_arena_desc a[TL_ARENAS];
  uint64_t total = 0;
  tl_arenas(a, &total);
  oi_dev *dev = NULL;
  REQUIRE(oi__dev_open(0, &dev) == OI_OK);
  void *alloc = NULL;
  REQUIRE(dev->ops->mem_alloc(dev, LEAD + total, 0, &alloc) == OI_OK); /* cudaMalloc */
  uint8_t *arena = (uint8_t *)alloc + LEAD;

  oi_engine_options o;
  tl_options(&o, a, "gpu-owned");
  o.device = 0;
  o.arena_base = arena;
  o.arena_size = total;
  oi_engine *e = NULL;
  /* Refused: a range past the allocation's end; an arena_fd on cuda. */
  o.arena_size = total + 1;
  CHECK_ST(oi_engine_connect(ts.socket, &o, &e, NULL), OI_ERR_INVALID_ARGUMENT);
  o.arena_size = total;
  o.arena_fd = 0;
  CHECK_ST(oi_engine_connect(ts.socket, &o, &e, NULL), OI_ERR_INVALID_ARGUMENT);
  o.arena_fd = -1;
  /* Host memory is not device memory. */
  static uint8_t host_arena[1 << 16];
  o.arena_base = host_arena;
  CHECK(oi_engine_connect(ts.socket, &o, &e, NULL) != OI_OK);
  o.arena_base = arena;

  oi_imported_arena *none = NULL;
  REQUIRE(oi_engine_connect(ts.socket, &o, &e, &none) == OI_OK);
  CHECK(none == NULL);
  int bad = round_trip(e, dev, arena, a, total, 7, 0);
  CHECK(bad == 0);
  oi_engine_stats s;
  CHECK_OK(stats_of(e, &s));
  uint64_t epoch1 = s.server_epoch;
  CHECK(s.connection == OI_CONNECTION_CONNECTED);

  ts_kill(&ts);
  CHECK(wait_connection(e, OI_CONNECTION_DEGRADED, &s));
  oi_block_hash h = tl_hash(7, 0);
  oi_query_result q = {.struct_size = sizeof q};
  CHECK_OK(oi_engine_query(e, NULL, &h, 1, 0, &q));
  CHECK(q.hit_blocks == 0);
  int64_t id = 0;
  oi_ticket *t = NULL;
  CHECK_OK(oi_engine_save(e, &id, &h, 1, NULL, &t));
  CHECK(t && oi_ticket_poll(t) == OI_OK);
  oi_ticket_release(t);

  REQUIRE(ts_start(&ts, extra));
  CHECK(wait_connection(e, OI_CONNECTION_CONNECTED, &s));
  CHECK(s.reconnects == 1 && s.server_epoch != epoch1);
  int bad2 = round_trip(e, dev, arena, a, total, 8, 100);
  CHECK(bad2 == 0);
  fprintf(stderr, "  engine-owned cudaMalloc arena over CUDA IPC: %s before and after a restart\n",
          bad || bad2 ? "MISMATCH" : "bytes match");
  oi_engine_destroy(e); /* the server unmaps, then the memory may go */
  CHECK(ts_stop(&ts));
  dev->ops->mem_free(dev, alloc);
  oi__dev_close(dev);
  ts_cleanup(&ts);
  fprintf(stderr, "%-60s %s\n", "test_sidecar_owned_cuda", oi_test_failures ? "FAILED" : "ok");
  TEST_EXIT();
}
