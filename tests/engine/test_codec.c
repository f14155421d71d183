/* Namespaces with a codec (oi_engine_options.codec, docs/codecs.md), on the
 * cpu backend, over the committed real-KV corpus (argv[1]: kv.bin, 216
 * pages of 12,288 bytes, [K|V][16 tokens][3 heads][64] bf16):
 *  - every page saved and loaded through each codec comes back as the
 *    codec's own round trip of it: byte-exact for lossless, for int8 and
 *    fp8 the bytes oi__codec_decode makes of oi__codec_encode's frame;
 *  - the pool holds frames: per namespace, stats say the codec, the slot,
 *    logical and physical bytes; a pool that holds N raw blocks holds
 *    >= 1.35 N lossless frames and >= 1.9 N int8 or fp8 frames;
 *  - a lossless block that does not fit its slot (random bytes) is not
 *    stored: the save reports it failed, a query misses it;
 *  - a frame corrupted in the pool fails its load (never decoded into
 *    other bytes), and the loads after it still work;
 *  - through the disk tier: frames spilled, evicted, promoted back and
 *    loaded are the same bytes;
 *  - the codec is the namespace's identity: another codec, shape or slot
 *    in a bound namespace is refused; bad codec options are refused with a
 *    message naming the field; a layerwise save is OI_ERR_UNSUPPORTED. */
#include <time.h>

#include "../codec/codec_testutil.h"
#include "codec/codec.h"
#include "host/host_private.h"
#include "rig.h"

#define PAGE CORPUS_PAGE_BYTES
#define MiB (1024ull * 1024)

static uint8_t *corpus;
static size_t npages;

static const char *const CODECS[4] = {"none", "lossless", "int8", "fp8"};

static oi_engine_options codec_options(const char *ns, const oi_arena_desc *ad, const char *codec) {
  oi_engine_options o = tr_engine_options(ns, ad, 1);
  o.codec = codec;
  if (strcmp(codec, "int8") == 0 || strcmp(codec, "fp8") == 0) {
    o.codec_tokens = 16;
    o.codec_heads = 3;
    o.codec_head_dim = 64;
  }
  return o;
}

/* A host of 16 MiB with an engine of namespace `ns` and `codec` over
 * `blocks` pages at mem (*h gets the host). */
static oi_engine *small_engine(oi_host **h, const char *ns, const char *codec, uint8_t *mem,
                               size_t blocks) {
  oi_arena_desc ad = tr_arena("kv", mem, blocks, PAGE);
  *h = tr_host(16 * MiB);
  oi_engine_options o = codec_options(ns, &ad, codec);
  return tr_engine_new(*h, &o);
}

/* ids[i] = i, hs[i] the hash of i tagged `tag`. */
static void ids_hashes(int64_t *ids, oi_block_hash *hs, size_t n, uint8_t tag) {
  for (size_t i = 0; i < n; i++) {
    ids[i] = (int64_t)i;
    hs[i] = tr_hash(i, 13, tag);
  }
}

static oi_host_namespace_stats ns_stats(oi_host *h, uint32_t index) {
  oi_host_namespace_stats s = {.struct_size = sizeof s};
  REQUIRE(oi_host_get_namespace_stats(h, index, &s) == OI_OK);
  return s;
}

/* Saves every corpus page in blocks [0, npages), loads them into
 * [npages, 2 npages) in runs of 64 and compares each with its expected
 * bytes. @return the blocks that differ. */
static size_t round_trip(oi_engine *e, uint8_t *mem, int codec, uint8_t tag) {
  size_t n = npages, bad = 0;
  int64_t *ids = malloc(n * sizeof *ids);
  oi_block_hash *hs = malloc(n * sizeof *hs);
  REQUIRE(ids && hs);
  for (size_t i = 0; i < n; i++) {
    ids[i] = (int64_t)i;
    hs[i] = tr_hash(i, 15, tag);
  }
  memcpy(mem, corpus, n * PAGE);
  memset(mem + n * PAGE, 0xEE, n * PAGE);
  CHECK_OK(tr_save(e, ids, hs, n, 30000));
  uint8_t want[PAGE];
  for (size_t at = 0; at < n; at += 64) {
    size_t k = n - at < 64 ? n - at : 64;
    oi_query_result q;
    CHECK_OK(tr_query(e, NULL, hs + at, k, 0, NULL, &q));
    CHECK(q.hit_blocks == k);
    int64_t dst[64];
    for (size_t j = 0; j < k; j++)
      dst[j] = (int64_t)(n + at + j);
    CHECK_OK(tr_load(e, q.lease, dst, q.hit_blocks, 30000));
    for (size_t j = 0; j < q.hit_blocks; j++) {
      ct_expected_of(codec, corpus + (at + j) * PAGE, want);
      bad += memcmp(mem + (n + at + j) * PAGE, want, PAGE) != 0;
    }
  }
  free(ids);
  free(hs);
  return bad;
}

static void test_round_trips(void) {
  uint8_t *mem = malloc(2 * npages * PAGE);
  REQUIRE(mem);
  oi_arena_desc ad = tr_arena("kv", mem, 2 * npages, PAGE);
  oi_host *h = tr_host(64 * MiB);
  for (int c = 0; c < 4; c++) {
    char ns[32];
    snprintf(ns, sizeof ns, "rt-%s", CODECS[c]);
    oi_engine_options o = codec_options(ns, &ad, CODECS[c]);
    if (c == OI_CODEC_INT8) o.copy_mode = OI_COPY_STAGED; /* a codec's groups go by DMA */
    oi_engine *e = tr_engine_new(h, &o);
    size_t bad = round_trip(e, mem, c, (uint8_t)(0x40 + c));
    CHECK(bad == 0);
    oi_host_namespace_stats s = ns_stats(h, (uint32_t)c);
    CHECK(strcmp(s.name, ns) == 0);
    CHECK(strcmp(s.codec, CODECS[c]) == 0);
    CHECK(s.block_bytes == PAGE);
    CHECK(s.blocks_resident == npages);
    CHECK(s.logical_bytes == npages * PAGE);
    double ratio = (double)s.logical_bytes / (double)s.physical_bytes;
    printf("%-8s slot %6llu  resident %zu  logical %llu  physical %llu  ratio %.3f  (%zu differ)\n",
           CODECS[c], (unsigned long long)s.stored_bytes, (size_t)s.blocks_resident,
           (unsigned long long)s.logical_bytes, (unsigned long long)s.physical_bytes, ratio, bad);
    if (c == OI_CODEC_NONE) CHECK(s.stored_bytes == PAGE && ratio == 1.0);
    if (c == OI_CODEC_LOSSLESS) CHECK(ratio >= 1.35);
    if (c >= OI_CODEC_INT8) CHECK(ratio >= 1.9);
    oi_engine_stats es = tr_engine_stats(e);
    CHECK(es.saves_completed == npages && es.saves_failed == 0);
    CHECK(es.bytes_saved == npages * PAGE && es.bytes_loaded == npages * PAGE);
    oi_engine_destroy(e);
  }
  oi_host_destroy(h);
  free(mem);
}

/* The same pool, filled past its size in each codec's namespace (its own
 * host each time): blocks resident against the raw namespace's. */
static void test_capacity(void) {
  enum { REPS = 4 };
  size_t n = REPS * npages;
  uint8_t *mem = malloc(n * PAGE);
  REQUIRE(mem);
  for (size_t r = 0; r < REPS; r++)
    memcpy(mem + r * npages * PAGE, corpus, npages * PAGE);
  oi_arena_desc ad = tr_arena("kv", mem, n, PAGE);
  int64_t *ids = malloc(n * sizeof *ids);
  oi_block_hash *hs = malloc(n * sizeof *hs);
  REQUIRE(ids && hs);
  for (size_t i = 0; i < n; i++) {
    ids[i] = (int64_t)i;
    hs[i] = tr_hash(i, 14, 0x77);
  }
  uint64_t resident[4] = {0};
  for (int c = 0; c < 4; c++) {
    oi_host_options ho = tr_host_options(4 * MiB);
    ho.chunk_bytes = 256 << 10;
    ho.high_watermark = ho.low_watermark = 1.0f; /* no background eviction: full is full */
    oi_host *h = tr_host_new(&ho);
    oi_engine_options o = codec_options("cap", &ad, CODECS[c]);
    oi_engine *e = tr_engine_new(h, &o);
    for (size_t at = 0; at < n; at += 64)
      CHECK_OK(tr_save(e, ids + at, hs + at, n - at < 64 ? n - at : 64, 30000));
    resident[c] = ns_stats(h, 0).blocks_resident;
    oi_engine_destroy(e);
    oi_host_destroy(h);
  }
  for (int c = 0; c < 4; c++)
    printf("capacity of a 4 MiB pool: %-8s %4llu blocks (%.3fx none)\n", CODECS[c],
           (unsigned long long)resident[c], (double)resident[c] / (double)resident[0]);
  CHECK(resident[0] > 0 && resident[0] < n);
  CHECK(resident[OI_CODEC_LOSSLESS] * 100 >= resident[0] * 135);
  CHECK(resident[OI_CODEC_INT8] * 10 >= resident[0] * 19);
  CHECK(resident[OI_CODEC_FP8] * 10 >= resident[0] * 19);
  free(ids);
  free(hs);
  free(mem);
}

/* The warnings logged (test_incompressible). */
static char warned[2048];
static int nwarned;
static void keep_warnings(void *ctx, oi_log_level level, const char *line) {
  (void)ctx;
  if (level != OI_LOG_WARN) return;
  nwarned++;
  snprintf(warned, sizeof warned, "%s", line);
}

/* Random bytes do not fit a lossless slot: not stored, counted, a miss; one
 * warning names the slot and the remedy (later saves within its period add
 * none). */
static void test_incompressible(void) {
  enum { N = 16 };
  uint8_t *mem = malloc(N * PAGE);
  REQUIRE(mem);
  uint64_t seed = 7;
  for (size_t i = 0; i < N * PAGE; i += 8) {
    uint64_t v = ct_rand(&seed);
    memcpy(mem + i, &v, 8);
  }
  memcpy(mem, corpus, PAGE); /* block 0 is real KV: it fits */
  oi_host *h;
  oi_engine *e = small_engine(&h, "random", "lossless", mem, N);
  int64_t ids[N];
  oi_block_hash hs[N];
  ids_hashes(ids, hs, N, 0x99);
  oi_set_log_handler(keep_warnings, NULL);
  CHECK_OK(tr_save(e, ids, hs, N, 10000));
  oi_engine_stats es = tr_engine_stats(e);
  CHECK(es.saves_completed == 1);
  CHECK(es.saves_failed == N - 1 && es.saves_not_encoded == N - 1);
  CHECK(nwarned == 1);
  CHECK(strstr(warned, "15 blocks not stored") && strstr(warned, "lossless") &&
        strstr(warned, "raise codec_slot_bytes") && strstr(warned, "-byte slot"));
  ids_hashes(ids, hs, N, 0x9a); /* 15 more within the warning's period: counted, not warned */
  CHECK_OK(tr_save(e, ids, hs, N, 10000));
  oi_set_log_handler(NULL, NULL);
  es = tr_engine_stats(e);
  CHECK(es.saves_not_encoded == 2 * (N - 1) && nwarned == 1);
  ids_hashes(ids, hs, N, 0x99);
  oi_query_result q;
  CHECK_OK(tr_query(e, NULL, hs, N, 0, NULL, &q));
  CHECK(q.hit_blocks == 1);
  CHECK_OK(oi_engine_release(e, q.lease));
  CHECK(ns_stats(h, 0).blocks_resident == 2); /* block 0 of each save */
  oi_engine_destroy(e);
  oi_host_destroy(h);
  free(mem);
}

/* The slot of block `i` of namespace "corrupt" (its shard locked while
 * looked up; the block is sealed and unpinned: nothing else writes it). */
static uint8_t *slot_of(oi_host *h, const oi_block_hash *hash) {
  oi_host_ns ns;
  REQUIRE(oi__host_find_namespace(h, "corrupt", &ns));
  index_shard *s = oi__index_shard(h, ns.id, hash);
  pthread_mutex_lock(&s->lock);
  host_block *b = oi__index_find_locked(s, ns.id, hash);
  REQUIRE(b);
  uint8_t *frame = oi__block_data(h, b);
  pthread_mutex_unlock(&s->lock);
  return frame;
}

/* A byte of a frame changed in the pool, a frame naming another codec, a
 * whole frame of another block size: each load fails; the blocks before
 * still load. */
static void test_corrupt_frame(void) {
  enum { N = 8 };
  uint8_t *mem = malloc(2 * N * PAGE);
  REQUIRE(mem);
  memcpy(mem, corpus, N * PAGE);
  oi_host *h;
  oi_engine *e = small_engine(&h, "corrupt", "lossless", mem, 2 * N);
  int64_t ids[N];
  oi_block_hash hs[N];
  ids_hashes(ids, hs, N, 0x55);
  CHECK_OK(tr_save(e, ids, hs, N, 10000));
  /* Block 3's frame, a byte in its payload. */
  uint8_t *frame = slot_of(h, &hs[3]);
  CHECK(memcmp(frame, "OIKC", 4) == 0);
  frame[OI_CODEC_HEADER_BYTES + 100] ^= 0x10;
  /* Block 4's frame says int8; block 5's is a whole lossless frame of half
   * a page (its checksums hold: its size does not). */
  slot_of(h, &hs[4])[5] = OI_CODEC_INT8;
  uint8_t *f5 = slot_of(h, &hs[5]);
  size_t fb = 0;
  CHECK_OK(oi__codec_encode(OI_CODEC_LOSSLESS, NULL, corpus, PAGE / 2, f5, 8960, &fb));
  oi_query_result q;
  CHECK_OK(tr_query(e, NULL, hs, N, 0, NULL, &q));
  CHECK(q.hit_blocks == N);
  int64_t dst[N];
  for (int i = 0; i < N; i++)
    dst[i] = N + i;
  CHECK(tr_load(e, q.lease, dst, N, 10000) == OI_ERR_PROTOCOL);
  CHECK(tr_engine_stats(e).loads_failed == 1);
  for (int k = 4; k < 6; k++) { /* each alone fails too */
    CHECK_OK(tr_query(e, NULL, &hs[k], 1, 0, NULL, &q));
    CHECK(q.hit_blocks == 1);
    oi_ticket *t = NULL;
    CHECK_OK(oi_engine_load(e, q.lease, dst, 1, NULL, &t));
    CHECK(oi_ticket_wait(t, 10000) == OI_ERR_PROTOCOL);
    const char *why = k == 4 ? "codec 2" : "for blocks of";
    CHECK(strstr(oi_last_error(), why) != NULL);
    oi_clear_error();
    CHECK(oi_ticket_poll(t) == OI_ERR_PROTOCOL && strstr(oi_last_error(), why) != NULL);
    oi_ticket_release(t);
  }
  /* The blocks before it load byte-exact. */
  CHECK_OK(tr_query(e, NULL, hs, 3, 0, NULL, &q));
  CHECK(q.hit_blocks == 3);
  CHECK_OK(tr_load(e, q.lease, dst, 3, 10000));
  CHECK(memcmp(mem + N * PAGE, corpus, 3 * PAGE) == 0);
  oi_engine_destroy(e);
  oi_host_destroy(h);
  free(mem);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Frames spilled to disk, evicted by later saves, promoted and loaded. */
static void test_disk(void) {
  size_t n = npages;
  uint8_t *mem = malloc(3 * n * PAGE);
  REQUIRE(mem);
  memcpy(mem, corpus, n * PAGE);
  for (size_t i = 0; i < n * PAGE; i++) /* more real-looking blocks, to evict with */
    mem[n * PAGE + i] = corpus[(i + PAGE / 2) % (n * PAGE)];
  oi_arena_desc ad = tr_arena("kv", mem, 3 * n, PAGE);
  char dir[] = "/tmp/oi-codec-disk-XXXXXX";
  REQUIRE(mkdtemp(dir));
  oi_host_options ho = tr_host_options(1 * MiB);
  ho.chunk_bytes = 256 << 10;
  ho.flags |= OI_HOST_NO_PIN;
  /* No background eviction: the saves evict on demand, and a block promoted
   * for a query is not taken by the maintenance thread before its lease (a
   * pool of 116 slots is 95 % full at every step of this test). */
  ho.high_watermark = 1.0f;
  ho.low_watermark = 1.0f;
  oi_host *h = tr_host_new(&ho);
  CHECK_OK(tr_attach_disk(h, dir, 64 * MiB));
  oi_engine_options o = codec_options("disk", &ad, "lossless");
  oi_engine *e = tr_engine_new(h, &o);
  int64_t *ids = malloc(2 * n * sizeof *ids);
  oi_block_hash *hs = malloc(2 * n * sizeof *hs);
  REQUIRE(ids && hs);
  for (size_t i = 0; i < 2 * n; i++) {
    ids[i] = (int64_t)i;
    hs[i] = tr_hash(i, 11, 0x33);
  }
  /* A batch at a time, each written behind before the next evicts. */
  oi_host_disk_stats ds = {.struct_size = sizeof ds};
  for (size_t at = 0; at < 2 * n; at += 24) {
    size_t k = 2 * n - at < 24 ? 2 * n - at : 24;
    CHECK_OK(tr_save(e, ids + at, hs + at, k, 30000));
    double t0 = now_s();
    do {
      CHECK_OK(oi_host_get_disk_stats(h, &ds));
    } while (ds.spills < tr_engine_stats(e).saves_completed && now_s() - t0 < 30 &&
             usleep(2000) == 0);
  }
  /* (a few of the evicting blocks, half of one page and half of the next,
   * may not fit their slot: not saved, not spilled) */
  oi_engine_stats es = tr_engine_stats(e);
  if (ds.spills != es.saves_completed || ds.spills < 2 * n - 8)
    fprintf(stderr, "disk: %llu spills for %llu saves (%llu failed); lost %llu unwritten\n",
            (unsigned long long)ds.spills, (unsigned long long)es.saves_completed,
            (unsigned long long)es.saves_failed, (unsigned long long)ds.lost_unwritten);
  CHECK(ds.spills == es.saves_completed && ds.spills >= 2 * n - 8);
  CHECK(ns_stats(h, 0).blocks_resident < n); /* the first pages left the pool */
  size_t loaded = 0, bad = 0;
  for (size_t at = 0; at < n; at += 16) {
    size_t k = n - at < 16 ? n - at : 16;
    oi_query_result q = {.struct_size = sizeof q, .wait_ms = 10000};
    CHECK_OK(oi_engine_query(e, NULL, hs + at, k, OI_QUERY_WAIT_PENDING, &q));
    if (q.hit_blocks != k) {
      oi_host_disk_stats d2 = {.struct_size = sizeof d2};
      CHECK_OK(oi_host_get_disk_stats(h, &d2));
      fprintf(stderr,
              "disk: blocks %zu..: %llu of %zu hit, %llu pending; disk: %llu blocks, %llu "
              "promoted, %llu failed, %llu checksum, %llu evicted, %llu skipped\n",
              at, (unsigned long long)q.hit_blocks, k, (unsigned long long)q.pending_blocks,
              (unsigned long long)d2.blocks, (unsigned long long)d2.promotions,
              (unsigned long long)d2.promote_failed, (unsigned long long)d2.checksum_failures,
              (unsigned long long)d2.evictions, (unsigned long long)d2.spills_skipped);
    }
    CHECK(q.hit_blocks == k);
    int64_t dst[16];
    for (size_t j = 0; j < k; j++)
      dst[j] = (int64_t)(2 * n + j);
    CHECK_OK(tr_load(e, q.lease, dst, q.hit_blocks, 30000));
    for (size_t j = 0; j < q.hit_blocks; j++)
      bad += memcmp(mem + (2 * n + j) * PAGE, corpus + (at + j) * PAGE, PAGE) != 0;
    loaded += q.hit_blocks;
  }
  CHECK_OK(oi_host_get_disk_stats(h, &ds));
  printf("disk: %zu frames loaded (%llu promoted from disk), %zu differ\n", loaded,
         (unsigned long long)ds.promotions, bad);
  CHECK(loaded == n && bad == 0 && ds.promotions > 0);
  oi_engine_destroy(e);
  oi_host_destroy(h);
  tu_remove_dir(dir);
  free(ids);
  free(hs);
  free(mem);
}

static void expect_refused(oi_host *h, const oi_engine_options *o, oi_status want,
                           const char *needle) {
  oi_engine *e = NULL;
  oi_status st = oi_engine_create(h, o, &e);
  CHECK(st == want && e == NULL);
  if (st != want || !strstr(oi_last_error(), needle))
    fprintf(stderr, "expected %s with '%s', got %s: %s\n", oi_status_str(want), needle,
            oi_status_str(st), oi_last_error());
  CHECK(strstr(oi_last_error(), needle) != NULL);
  if (e) oi_engine_destroy(e);
}

static void test_identity_and_options(void) {
  uint8_t *mem = calloc(8, PAGE);
  REQUIRE(mem);
  oi_arena_desc ad = tr_arena("kv", mem, 8, PAGE);
  oi_host *h = tr_host(16 * MiB);
  oi_engine_options o = codec_options("id", &ad, "lossless");
  oi_engine *e = tr_engine_new(h, &o);
  /* Another codec, a lossless slot of another size, another lossy shape. */
  oi_engine_options other = codec_options("id", &ad, "none");
  expect_refused(h, &other, OI_ERR_INVALID_ARGUMENT, "namespace 'id'");
  other = codec_options("id", &ad, "lossless");
  other.codec_slot_bytes = 10240;
  expect_refused(h, &other, OI_ERR_INVALID_ARGUMENT, "namespace 'id'");
  oi_engine_options i8 = codec_options("id8", &ad, "int8");
  oi_engine *e8 = tr_engine_new(h, &i8);
  other = i8;
  other.codec_tokens = 8;
  other.codec_heads = 6;
  expect_refused(h, &other, OI_ERR_INVALID_ARGUMENT, "namespace 'id8'");
  other = i8;
  other.codec = "fp8";
  expect_refused(h, &other, OI_ERR_INVALID_ARGUMENT, "namespace 'id8'");
  /* The same options again: a second engine of the namespace. */
  oi_engine *e2 = tr_engine_new(h, &o);
  oi_engine_destroy(e2);

  /* Bad options, each named. */
  other = codec_options("bad", &ad, "zstd");
  expect_refused(h, &other, OI_ERR_INVALID_ARGUMENT, "codec 'zstd'");
  other = codec_options("bad", &ad, "int8");
  other.codec_tokens = other.codec_heads = other.codec_head_dim = 0;
  expect_refused(h, &other, OI_ERR_INVALID_ARGUMENT, "needs the block's shape");
  other = codec_options("bad", &ad, "int8");
  other.codec_head_dim = 100;
  expect_refused(h, &other, OI_ERR_INVALID_ARGUMENT, "not whole parts");
  other = codec_options("bad", &ad, "int8");
  other.codec_heads = 70000;
  expect_refused(h, &other, OI_ERR_INVALID_ARGUMENT, "each must be 1..65535");
  other = codec_options("bad", &ad, "none");
  other.codec_tokens = 16;
  expect_refused(h, &other, OI_ERR_INVALID_ARGUMENT, "codec is none");
  other = codec_options("bad", &ad, "lossless");
  other.codec_slot_bytes = 2 * PAGE;
  expect_refused(h, &other, OI_ERR_INVALID_ARGUMENT, "codec_slot_bytes");
  other = codec_options("bad", &ad, "lossless");
  other.codec_slot_bytes = 16;
  expect_refused(h, &other, OI_ERR_INVALID_ARGUMENT, "codec_slot_bytes");
  other = codec_options("bad", &ad, "fp8");
  other.codec_slot_bytes = 4096;
  expect_refused(h, &other, OI_ERR_INVALID_ARGUMENT, "codec_slot_bytes");

  /* A layerwise save names the codec. */
  oi_save_options so;
  oi_save_options_init(&so);
  so.arena_first = 0;
  so.arena_count = 1;
  int64_t id = 0;
  oi_block_hash hh = tr_hash(1, 0, 1);
  oi_ticket *t = NULL;
  CHECK(oi_engine_save(e, &id, &hh, 1, &so, &t) == OI_ERR_UNSUPPORTED && t == NULL);
  CHECK(strstr(oi_last_error(), "codec lossless") != NULL);
  oi_engine_destroy(e8);
  oi_engine_destroy(e);
  oi_host_destroy(h);
  free(mem);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s tests/data/kvcorpus/kv.bin\n", argv[0]);
    return 2;
  }
  size_t len = 0;
  corpus = ct_read_file(argv[1], &len);
  REQUIRE(corpus && len % PAGE == 0 && len >= 64 * PAGE);
  npages = len / PAGE;
  RUN_TEST(test_identity_and_options);
  RUN_TEST(test_round_trips);
  RUN_TEST(test_capacity);
  RUN_TEST(test_incompressible);
  RUN_TEST(test_corrupt_frame);
  RUN_TEST(test_disk);
  free(corpus);
  TEST_EXIT();
}
