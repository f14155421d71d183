/* Two processes and a real `openinfer serve`: a client registers, imports the
 * arena the server allocated, writes patterns, saves, flushes, queries and
 * loads into different block ids, byte-exact; a second client process of the
 * same namespace restores what the first saved; teardown in both orders
 * (arena first; engine first, deferred until the arena closes) frees the
 * server's instance and arena. */
#include <stdatomic.h>

#include "sidecar_util.h"

static const char *NS = "round-trip-ns";
#define N_SAVED 8

static void on_save_done(void *ctx, oi_status st) {
  if (st == OI_OK) atomic_fetch_add((atomic_int *)ctx, 1);
}

/* The second process: restores logical blocks 0..N_SAVED-1 into ids 0.. */
static int second_client(const char *socket) {
  oi_set_fatal_handler(ts_fatal_is_a_failure, NULL);
  TL_CLIENT(a, o, e, arena);
  tl_options(&o, a, NS);
  o.instance_name = "second";
  CHECK_OK(oi_engine_connect(socket, &o, &e, &arena));
  if (oi_test_failures) return 1;
  uint8_t *base = oi_imported_arena_ptr(arena);
  oi_block_hash hashes[N_SAVED];
  for (int i = 0; i < N_SAVED; i++)
    hashes[i] = tl_hash(1, (uint64_t)i);
  oi_query_result qr = {.struct_size = sizeof qr};
  CHECK_OK(oi_engine_query(e, "second", hashes, N_SAVED, 0, &qr));
  CHECK(qr.hit_blocks == N_SAVED);
  int64_t dst[N_SAVED];
  for (int i = 0; i < N_SAVED; i++)
    dst[i] = N_SAVED - 1 - i; /* reversed */
  CHECK_OK(tr_load(e, qr.lease, dst, N_SAVED, 10000));
  for (int i = 0; i < N_SAVED; i++)
    CHECK(tl_check(base, a, dst[i], (uint64_t)i));
  CHECK(tl_is_zero(base, a, N_SAVED));
  oi_imported_arena_close(arena);
  oi_engine_destroy(e);
  return oi_test_failures ? 1 : 0;
}

static test_server ts;
static pid_t child;
static int go_pipe[2];

static void test_round_trip_two_processes(void) {
  oi_arena_desc a[TL_ARENAS];
  oi_engine_options o;
  tl_options(&o, a, NS);
  uint64_t total;
  tl_arenas(a, &total);
  oi_engine *e;
  oi_imported_arena *arena;
  CHECK_OK(oi_engine_connect(ts.socket, &o, &e, &arena));
  REQUIRE(e && arena);
  CHECK(oi_imported_arena_size(arena) >= total);
  uint8_t *base = oi_imported_arena_ptr(arena);
  for (int64_t b = 0; b < TL_BLOCKS; b++)
    CHECK(tl_is_zero(base, a, b)); /* allocated zeroed */

  oi_engine_stats es = {.struct_size = sizeof es};
  CHECK_OK(oi_engine_get_stats(e, &es));
  CHECK(es.num_blocks == TL_BLOCKS && es.block_bytes == 2 * 256 + 384 + 96);

  int64_t ids[N_SAVED];
  oi_block_hash hashes[N_SAVED];
  tl_fill_n(base, a, 1, ids, hashes, N_SAVED);
  atomic_int done = 0;
  oi_save_options so;
  oi_save_options_init(&so);
  so.on_done = on_save_done;
  so.on_done_ctx = &done;
  oi_ticket *t = NULL;
  CHECK_OK(oi_engine_save(e, ids, hashes, N_SAVED / 2, &so, &t));
  CHECK_OK(oi_ticket_wait(t, 10000));
  CHECK(atomic_load(&done) == 1);
  oi_ticket_release(t);
  /* fire and forget, then the barrier */
  CHECK_OK(oi_engine_save(e, ids + N_SAVED / 2, hashes + N_SAVED / 2, N_SAVED / 2, NULL, NULL));
  CHECK_OK(oi_engine_flush(e, 10000));

  oi_query_result qr = {.struct_size = sizeof qr};
  CHECK_OK(oi_engine_query(e, "r1", hashes, N_SAVED, 0, &qr));
  CHECK(qr.state == OI_QUERY_READY && qr.hit_blocks == N_SAVED);
  int64_t dst[N_SAVED];
  for (int i = 0; i < N_SAVED; i++)
    dst[i] = 16 + i;
  CHECK_OK(tr_load(e, qr.lease, dst, N_SAVED, 10000));
  for (int i = 0; i < N_SAVED; i++)
    CHECK(tl_check(base, a, dst[i], (uint64_t)i));
  CHECK(tl_is_zero(base, a, 24)); /* not loaded: untouched */
  /* the lease served its one consumer; errors the server finds complete the
   * ticket (a sidecar load returns once the request is sent) */
  CHECK_OK(oi_engine_load(e, qr.lease, dst, N_SAVED, NULL, &t));
  CHECK_ST(oi_ticket_wait(t, 10000), OI_ERR_LEASE_EXPIRED);
  oi_ticket_release(t);

  /* membership: positions independently; a gap breaks the prefix */
  oi_block_hash mixed[4] = {hashes[0], tl_hash(9, 9), hashes[2], hashes[3]};
  uint8_t present[4] = {9, 9, 9, 9};
  oi_query_result mr = {.struct_size = sizeof mr, .present = present};
  CHECK_OK(oi_engine_query(e, NULL, mixed, 4, OI_QUERY_MEMBERSHIP, &mr));
  CHECK(mr.hit_blocks == 3 && present[0] == 1 && present[1] == 0 && present[2] == 1 &&
        present[3] == 1);
  oi_query_result pr = {.struct_size = sizeof pr};
  CHECK_OK(oi_engine_query(e, NULL, mixed, 4, 0, &pr));
  CHECK(pr.hit_blocks == 1);
  CHECK_OK(oi_engine_release(e, pr.lease));
  CHECK_ST(oi_engine_release(e, pr.lease), OI_ERR_LEASE_EXPIRED);
  CHECK(strstr(oi_last_error(), "lease") != NULL);
  /* errors come back with the server's message */
  int64_t bad = TL_BLOCKS;
  CHECK_ST(oi_engine_save(e, &bad, hashes, 1, NULL, NULL), OI_ERR_INVALID_ARGUMENT);
  CHECK_OK(oi_engine_query(e, NULL, hashes, 2, 0, &qr));
  CHECK_OK(oi_engine_load(e, qr.lease, dst, 3, NULL, &t)); /* 3 ids, lease of 2 */
  CHECK_ST(oi_ticket_wait(t, 10000), OI_ERR_INVALID_ARGUMENT);
  oi_ticket_release(t);
  CHECK_OK(oi_engine_release(e, qr.lease)); /* refused before use: still held */
  so.wait_event = (void *)1;
  CHECK_ST(oi_engine_save(e, ids, hashes, 1, &so, NULL), OI_ERR_UNSUPPORTED);

  CHECK_OK(oi_engine_get_stats(e, &es));
  CHECK(es.saves_completed == N_SAVED && es.loads_completed == 1 && es.blocks_loaded == N_SAVED);

  /* the second process restores what this one saved */
  REQUIRE(write(go_pipe[1], "g", 1) == 1);
  int status;
  REQUIRE(waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  child = 0;

  wire_client wc;
  REQUIRE(wc_connect(&wc, ts.socket) && wc_hello(&wc, NULL));
  oiwire_StatsReply sr;
  CHECK(wc_server_stats(&wc, &sr) && sr.instances == 1 && sr.arena_bytes >= total);

  /* clean teardown: arena first, then the engine */
  oi_imported_arena_close(arena);
  oi_engine_destroy(e);
  CHECK(WAIT_FOR_STATS(&wc, sr, sr.instances == 0 && sr.arena_bytes == 0));
  CHECK(sr.instances_cleaned_up == 0); /* unregistered, not cleaned up */
  wc_close(&wc);
}

static void test_engine_destroyed_before_its_arena(void) {
  TL_CLIENT(a, o, e, arena);
  tl_connect(ts.socket, NS, a, &o, &e, &arena);
  wire_client wc;
  REQUIRE(wc_connect(&wc, ts.socket) && wc_hello(&wc, NULL));
  oiwire_StatsReply sr;
  oi_engine_destroy(e);
  /* The server must not free memory this process still maps. */
  CHECK(wc_server_stats(&wc, &sr) && sr.instances == 1);
  uint8_t *base = oi_imported_arena_ptr(arena);
  tl_fill(base, a, 3, 3);
  CHECK(tl_check(base, a, 3, 3));
  oi_imported_arena_close(arena); /* finishes the engine: unregister */
  CHECK(WAIT_FOR_STATS(&wc, sr, sr.instances == 0 && sr.arena_bytes == 0));
  wc_close(&wc);
}

/* vLLM's [2, num_blocks, ...] layer as one arena over the sidecar: per layer
 * the K half then the V half (segment_offsets), 2 layers, 64 bytes of gap
 * after each half. Saved, dropped from the device, loaded into other ids:
 * byte-exact, and nothing outside the slices is written. */
#define KV_BLOCKS 16
#define KV_BPB 512
#define KV_HALF (KV_BLOCKS * KV_BPB + 64)

static uint8_t *kv_slice(uint8_t *base, uint32_t layer, uint32_t seg, int64_t id) {
  return base + (uint64_t)layer * 2 * KV_HALF + (uint64_t)seg * KV_HALF + (uint64_t)id * KV_BPB;
}

static void test_vllm_kv_halves_round_trip(void) {
  oi_arena_desc a[2];
  memset(a, 0, sizeof a);
  const char *names[2] = {"layer0", "layer1"};
  uint64_t offs[4];
  for (uint32_t l = 0; l < 2; l++) {
    a[l] = (oi_arena_desc){.name = names[l],
                           .offset = (uint64_t)l * 2 * KV_HALF,
                           .num_blocks = KV_BLOCKS,
                           .bytes_per_block = KV_BPB,
                           .block_stride = KV_BPB,
                           .segments = 2};
    offs[2 * l] = 0;
    offs[2 * l + 1] = KV_HALF;
  }
  oi_engine_options o;
  oi_engine_options_init(&o);
  o.namespace_id = "vllm-halves";
  o.device = OI_DEVICE_CPU;
  o.num_arenas = 2;
  o.arenas = a;
  o.segment_offsets = offs;
  o.num_segment_offsets = 4;
  oi_engine *e;
  oi_imported_arena *arena;
  CHECK_OK(oi_engine_connect(ts.socket, &o, &e, &arena));
  REQUIRE(e && arena);
  CHECK(oi_imported_arena_size(arena) >= 4 * KV_HALF - 64);
  oi_engine_stats es = {.struct_size = sizeof es};
  CHECK_OK(oi_engine_get_stats(e, &es));
  CHECK(es.block_bytes == 2 * 2 * KV_BPB);
  uint8_t *base = oi_imported_arena_ptr(arena);
  enum { N = 6 };
  int64_t src[N], dst[N];
  oi_block_hash hs[N];
  for (int i = 0; i < N; i++) {
    src[i] = i;
    dst[i] = KV_BLOCKS - 1 - i;
    hs[i] = tl_hash(77, (uint64_t)i);
    for (uint32_t l = 0; l < 2; l++)
      for (uint32_t s = 0; s < 2; s++)
        for (int k = 0; k < KV_BPB; k++)
          kv_slice(base, l, s, src[i])[k] = tl_byte((uint64_t)i, l, s, (uint64_t)k);
  }
  oi_ticket *t = NULL;
  /* Layer by layer (a layerwise save over the sidecar): nothing is visible
   * before the last layer arrived. */
  oi_query_result qr = {.struct_size = sizeof qr};
  for (uint32_t l = 0; l < 2; l++) {
    oi_save_options so;
    oi_save_options_init(&so);
    so.arena_first = l;
    so.arena_count = 1;
    CHECK_OK(oi_engine_save(e, src, hs, N, &so, &t));
    CHECK_OK(oi_ticket_wait(t, 10000));
    oi_ticket_release(t);
    if (l == 0) {
      CHECK_OK(oi_engine_query(e, "vllm", hs, N, 0, &qr));
      CHECK(qr.hit_blocks == 0);
    }
  }
  oi_save_options bad;
  oi_save_options_init(&bad);
  bad.arena_first = 2;
  bad.arena_count = 1; /* past the layout: refused (by the client) */
  CHECK_ST(oi_engine_save(e, src, hs, N, &bad, NULL), OI_ERR_INVALID_ARGUMENT);
  CHECK_OK(oi_engine_flush(e, 10000));
  memset(base, 0, 4 * KV_HALF);
  CHECK_OK(oi_engine_query(e, "vllm", hs, N, 0, &qr));
  CHECK(qr.hit_blocks == N);
  CHECK_OK(tr_load(e, qr.lease, dst, N, 10000));
  bool same = true;
  for (int i = 0; i < N; i++)
    for (uint32_t l = 0; l < 2; l++)
      for (uint32_t s = 0; s < 2; s++) {
        uint8_t *p = kv_slice(base, l, s, dst[i]);
        for (int k = 0; k < KV_BPB; k++)
          same &= p[k] == tl_byte((uint64_t)i, l, s, (uint64_t)k);
        memset(p, 0, KV_BPB);
      }
  CHECK(same);
  bool zero = true; /* every other byte, the gaps included */
  for (uint64_t i = 0; i < 4 * KV_HALF; i++)
    zero &= base[i] == 0;
  CHECK(zero);
  oi_imported_arena_close(arena);
  oi_engine_destroy(e);
}

static void test_connect_refuses_bad_options(void) {
  TL_CLIENT(a, o, e, arena);
  tl_options(&o, a, NS);
  CHECK_ST(oi_engine_connect(ts.socket, &o, NULL, &arena), OI_ERR_INVALID_ARGUMENT);
  CHECK_ST(oi_engine_connect(ts.socket, NULL, &e, &arena), OI_ERR_INVALID_ARGUMENT);
  o.arena_base = (void *)4096;
  CHECK_ST(oi_engine_connect(ts.socket, &o, &e, &arena), OI_ERR_INVALID_ARGUMENT);
  CHECK(strstr(oi_last_error(), "arena_base") != NULL);
  o.arena_base = NULL;
  a[1].offset = 100; /* overlaps arena 0 */
  CHECK_ST(oi_engine_connect(ts.socket, &o, &e, &arena), OI_ERR_INVALID_ARGUMENT);
  CHECK(strstr(oi_last_error(), "overlap") != NULL);
  tl_options(&o, a, NS);
  o.arena_size = 1000; /* too small for the layout */
  CHECK_ST(oi_engine_connect(ts.socket, &o, &e, &arena), OI_ERR_INVALID_ARGUMENT);
  tl_options(&o, a, NS);
  char path[200];
  snprintf(path, sizeof path, "%s/nobody.sock", ts.dir);
  CHECK_ST(oi_engine_connect(path, &o, &e, &arena), OI_ERR_NOT_FOUND);
  CHECK(e == NULL && arena == NULL);
  /* another layout shape in the same namespace: refused by the server */
  a[2].bytes_per_block = 64;
  CHECK_ST(oi_engine_connect(ts.socket, &o, &e, &arena), OI_ERR_INVALID_ARGUMENT);
  CHECK(e == NULL && arena == NULL);
}

int main(int argc, char **argv) {
  if (argc < 2) TEST_SKIP("usage: test_round_trip OPENINFER_EXE");
  oi_set_fatal_handler(ts_fatal_is_a_failure, NULL);
  ts_init(&ts, argv[1]);
  REQUIRE(pipe(go_pipe) == 0);
  /* Fork the second client before this process has threads. */
  child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    char c;
    close(go_pipe[1]);
    if (read(go_pipe[0], &c, 1) != 1) _exit(0); /* the parent gave up */
    _exit(second_client(ts.socket));
  }
  close(go_pipe[0]);
  if (!ts_start(&ts, NULL)) {
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    ts_cleanup(&ts);
    return 1;
  }
  RUN_TEST(test_round_trip_two_processes);
  if (child) {
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
  }
  RUN_TEST(test_engine_destroyed_before_its_arena);
  RUN_TEST(test_vllm_kv_halves_round_trip);
  RUN_TEST(test_connect_refuses_bad_options);
  pid_t server_pid = ts.pid;
  CHECK(ts_stop(&ts));
  CHECK(shm_objects_of(server_pid) == 0); /* every arena freed */
  if (oi_test_failures) ts_dump_log(&ts);
  ts_cleanup(&ts);
  TEST_EXIT();
}
