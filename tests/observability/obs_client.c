/* A sidecar client for the observability test: connects to SOCKET with
 * oi_engine_connect, saves N blocks under NAMESPACE, flushes, queries
 * those N plus M unknown hashes (N hits, M misses), loads the hits, queries
 * and releases once more, and checks its own engine stats (the appended
 * fields come over the wire). Prints one line "client ok instance=I" and
 * exits 0, or 1 on a failed check.
 *
 *   obs_client SOCKET NAMESPACE N M */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "rig.h"
#include "testutil.h"

#define BLOCKS 64
#define BLOCK_BYTES 4096

int main(int argc, char **argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: obs_client SOCKET NAMESPACE N M\n");
    return 2;
  }
  const char *socket = argv[1], *ns = argv[2];
  size_t n = strtoul(argv[3], NULL, 10), m = strtoul(argv[4], NULL, 10);
  REQUIRE(n > 0 && n + m <= BLOCKS);
  oi_arena_desc a = tr_arena("kv", NULL, BLOCKS, BLOCK_BYTES);
  oi_engine_options o;
  oi_engine_options_init(&o);
  o.namespace_id = ns;
  o.instance_name = "obs-client";
  o.device = OI_DEVICE_CPU;
  o.arenas = &a;
  o.num_arenas = 1;
  oi_engine *e;
  oi_imported_arena *arena;
  REQUIRE(oi_engine_connect(socket, &o, &e, &arena) == OI_OK);
  uint8_t *kv = oi_imported_arena_ptr(arena);
  for (size_t i = 0; i < BLOCKS * BLOCK_BYTES; i++)
    kv[i] = (uint8_t)(i * 7 + 3);

  int64_t ids[BLOCKS];
  oi_block_hash hashes[BLOCKS];
  for (size_t i = 0; i < BLOCKS; i++) {
    ids[i] = (int64_t)i;
    memset(&hashes[i], 0, sizeof hashes[i]);
    snprintf((char *)hashes[i].bytes, sizeof hashes[i].bytes, "%s%zu", ns, i);
    hashes[i].bytes[15] = (uint8_t)i;
  }
  CHECK_OK(tr_save(e, ids, hashes, n, 30000));
  CHECK_OK(oi_engine_flush(e, 30000));

  /* n hits, then m misses (hashes n..n+m-1 were never saved). */
  oi_query_result qr = {.struct_size = sizeof qr};
  CHECK_OK(oi_engine_query(e, "obs", hashes, n + m, 0, &qr));
  CHECK(qr.hit_blocks == n);
  int64_t dst[BLOCKS];
  for (size_t i = 0; i < n; i++)
    dst[i] = (int64_t)(BLOCKS - 1 - i);
  CHECK_OK(tr_load(e, qr.lease, dst, n, 30000));
  for (size_t i = 0; i < n; i++)
    CHECK(memcmp(kv + (size_t)dst[i] * BLOCK_BYTES, kv + i * BLOCK_BYTES, BLOCK_BYTES) == 0);

  /* A lease released explicitly. */
  oi_query_result q2 = {.struct_size = sizeof q2};
  CHECK_OK(oi_engine_query(e, "obs2", hashes, 1, 0, &q2));
  CHECK(q2.hit_blocks == 1);
  CHECK_OK(oi_engine_release(e, q2.lease));

  oi_engine_stats s;
  memset(&s, 0, sizeof s);
  s.struct_size = sizeof s;
  CHECK_OK(oi_engine_get_stats(e, &s));
  CHECK(s.saves_submitted == n && s.saves_completed == n);
  CHECK(s.loads_submitted == 1 && s.loads_completed == 1 && s.blocks_loaded == n);
  CHECK(s.query_hit_blocks == n + 1 && s.query_miss_blocks == m);
  CHECK(s.namespace_blocks_resident == n);
  CHECK(s.latency_buckets == OI_LATENCY_BUCKETS);
  uint64_t saves = 0, loads = 0;
  for (int i = 0; i < OI_LATENCY_BUCKETS; i++) {
    saves += s.save_latency_us[i];
    loads += s.load_latency_us[i];
  }
  CHECK(saves == 1 && loads == 1);
  uint32_t instance = s.instance_id;

  oi_imported_arena_close(arena);
  oi_engine_destroy(e);
  if (oi_test_failures) return 1;
  printf("client ok instance=%u\n", instance);
  return 0;
}
