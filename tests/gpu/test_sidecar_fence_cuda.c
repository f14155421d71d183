/* The sidecar load fence over CUDA IPC (engine-owned cudaMalloc memory the
 * server maps): a load of 1 GiB with a 100 ms deadline, the server stopped
 * (SIGSTOP) the moment it is sent. Past the deadline the ticket is fencing
 * (OI_FENCING, waits return OI_ERR_TIMEOUT at once) and stays so while the
 * server is stopped; after SIGCONT the server answers and the ticket ends
 * with OI_ERR_DEADLINE; what the engine then writes into the destination
 * is still there later. Again with the stopped server SIGKILLed instead: the
 * ticket ends once the process is gone. Skips (77) without a GPU. */
#include "../sidecar/sidecar_util.h"
#include "device/device.h"

#define ARENAS 4
#define BLOCKS 512 /* save [0, 256), load into [256, 512) */
#define ARENA_BLOCK_BYTES (1ull << 20)
#define HALF (BLOCKS / 2)
#define ARENA_BYTES ((uint64_t)BLOCKS * ARENA_BLOCK_BYTES)
#define HALF_BYTES ((uint64_t)HALF * ARENA_BLOCK_BYTES)

static oi_dev *dev;
static uint8_t *region;
static uint8_t *want, *got;

static oi_status stats_of(oi_engine *e, oi_engine_stats *s) {
  memset(s, 0, sizeof *s);
  s->struct_size = sizeof *s;
  return oi_engine_get_stats(e, s);
}

/* The destination half of every arena now holds what `seed` filled, and
 * still does 300 ms later. */
static bool destination_stays(uint64_t seed) {
  for (uint32_t a = 0; a < ARENAS; a++)
    REQUIRE(dev->ops->mem_fill_pattern(dev, region + a * ARENA_BYTES + HALF_BYTES, HALF_BYTES,
                                       seed + a) == OI_OK);
  usleep(300000);
  bool same = true;
  for (uint32_t a = 0; a < ARENAS; a++) {
    uint8_t *dst = region + a * ARENA_BYTES + HALF_BYTES;
    REQUIRE(dev->ops->mem_copy(dev, got, dst, HALF_BYTES) == OI_OK);
    /* the expected bytes: the same fill, made again into the host's copy */
    REQUIRE(dev->ops->mem_fill_pattern(dev, dst, HALF_BYTES, seed + a) == OI_OK);
    REQUIRE(dev->ops->mem_copy(dev, want, dst, HALF_BYTES) == OI_OK);
    same &= memcmp(want, got, HALF_BYTES) == 0;
  }
  return same;
}

/* One late load: the server stopped as it is sent; `kill_it` SIGKILLs the
 * stopped server, else SIGCONT after a second. */
static void late_load(oi_engine *e, test_server *ts, const oi_block_hash *hs, bool kill_it) {
  oi_query_result q = {.struct_size = sizeof q};
  CHECK_OK(oi_engine_query(e, NULL, hs, HALF, 0, &q));
  REQUIRE(q.hit_blocks == HALF);
  int64_t dst[HALF];
  for (int64_t b = 0; b < HALF; b++)
    dst[b] = HALF + b;
  oi_ticket *t = NULL;
  uint64_t t0 = oi__now_ns();
  CHECK_OK(oi_engine_load(e, q.lease, dst, HALF, NULL, &t));
  kill(ts->pid, SIGSTOP);
  CHECK_ST(oi_ticket_wait(t, 60000), OI_ERR_TIMEOUT); /* at the deadline */
  double told_ms = (oi__now_ns() - t0) / 1e6;
  CHECK(oi_ticket_poll(t) == OI_FENCING);
  usleep(1000000);
  CHECK(oi_ticket_poll(t) == OI_FENCING); /* a stopped server holds the blocks */
  uint64_t t1 = oi__now_ns();
  if (kill_it)
    ts_kill(ts);
  else
    kill(ts->pid, SIGCONT);
  while (oi_ticket_poll(t) == OI_FENCING && oi__now_ns() - t1 < 10000000000ull)
    usleep(1000);
  double fenced_ms = (oi__now_ns() - t1) / 1e6;
  oi_status st = oi_ticket_poll(t);
  CHECK(st == OI_ERR_DEADLINE);
  oi_ticket_release(t);
  CHECK(destination_stays(kill_it ? 2000 : 1000));
  fprintf(stderr, "  %s: fencing %.0f ms after the load was sent, final %.1f ms after the %s\n",
          kill_it ? "SIGKILL" : "SIGCONT", told_ms, fenced_ms, kill_it ? "kill" : "SIGCONT");
}

int main(int argc, char **argv) {
  test_server ts;
  const char *extra[] = {"--device", "0", "--arena-devices", "0", "--pool", "1280M", NULL};
  if (!ts_gpu_open(&ts, argc, argv, extra)) TEST_SKIP("no CUDA device");
  REQUIRE(oi__dev_open(0, &dev) == OI_OK);
  REQUIRE(dev->ops->mem_alloc(dev, ARENAS * ARENA_BYTES, 0, (void **)&region) == OI_OK);
  want = malloc(HALF_BYTES);
  got = malloc(HALF_BYTES);
  REQUIRE(want && got);
  for (uint32_t a = 0; a < ARENAS; a++)
    REQUIRE(dev->ops->mem_fill_pattern(dev, region + a * ARENA_BYTES, HALF_BYTES, 7 + a) == OI_OK);

  oi_arena_desc ad[ARENAS];
  static const char *names[ARENAS] = {"l0", "l1", "l2", "l3"};
  for (uint32_t a = 0; a < ARENAS; a++)
    ad[a] = (oi_arena_desc){.name = names[a],
                            .offset = a * ARENA_BYTES,
                            .num_blocks = BLOCKS,
                            .bytes_per_block = ARENA_BLOCK_BYTES,
                            .block_stride = ARENA_BLOCK_BYTES,
                            .segments = 1};
  oi_engine_options o = tr_engine_options("gpu-fence", ad, ARENAS);
  o.device = 0;
  o.arena_base = region;
  o.arena_size = ARENAS * ARENA_BYTES;
  o.load_deadline_ms = 100;
  oi_engine *e = NULL;
  REQUIRE(oi_engine_connect(ts.socket, &o, &e, NULL) == OI_OK);

  int64_t ids[HALF];
  oi_block_hash hs[HALF];
  for (uint64_t b = 0; b < HALF; b++) {
    ids[b] = (int64_t)b;
    hs[b] = tr_hash(b, 15, 0x3c);
  }
  CHECK_OK(tr_save(e, ids, hs, HALF, 60000));
  CHECK_OK(oi_engine_flush(e, 60000));

  late_load(e, &ts, hs, false);
  oi_engine_stats s;
  for (int i = 0; i < 300 && (stats_of(e, &s) != OI_OK || s.connection != OI_CONNECTION_CONNECTED);
       i++)
    usleep(10000); /* the breaker closes once the server answers its probe */
  CHECK(s.connection == OI_CONNECTION_CONNECTED);
  CHECK(s.loads_failed == 1 && s.loads_completed == 0);
  late_load(e, &ts, hs, true);

  oi_engine_destroy(e);
  dev->ops->mem_free(dev, region);
  free(want);
  free(got);
  oi__dev_close(dev);
  ts_cleanup(&ts);
  fprintf(stderr, "%-60s %s\n", "test_sidecar_fence_cuda", oi_test_failures ? "FAILED" : "ok");
  TEST_EXIT();
}
