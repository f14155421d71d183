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
 *    message naming the field;
 *  - layered loads (OI_LOAD_ARENA_EVENTS) of blocks of several arenas: each
 *    arena is reported as it lands (the first before the last), its bytes
 *    the codec's round trip of the block's; a frame that does not decode
 *    fails every arena, never reports one landed;
 *  - layerwise saves (arena_count > 0) in each codec: nothing visible until
 *    the last arena landed, then loaded back as the codec's round trip; a
 *    block whose layers stop (the engine destroyed, the save deadline) never
 *    seals and holds nothing; blocks past the per-block bounces' bound are
 *    dropped (failed saves), the rest seal. */
#include <time.h>

#include "../codec/codec_testutil.h"
#include "codec/codec.h"
#include "host/host_private.h"
#include "rig.h"

#define PAGE CORPUS_PAGE_BYTES
#define MiB (1024ull * 1024)

static uint8_t *corpus;
static size_t npages;

static const char *const CODECS[OI_CODEC_COUNT] = {"none", "lossless", "int8", "fp8",
                                                   "int8-hadamard"};

static oi_engine_options codec_options(const char *ns, const oi_arena_desc *ad, const char *codec) {
  oi_engine_options o = tr_engine_options(ns, ad, 1);
  o.codec = codec;
  if (strcmp(codec, "none") != 0 && strcmp(codec, "lossless") != 0) {
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
  for (int c = 0; c < OI_CODEC_COUNT; c++) {
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
    printf(
        "%-13s slot %6llu  resident %zu  logical %llu  physical %llu  ratio %.3f  (%zu differ)\n",
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
  uint64_t resident[OI_CODEC_COUNT] = {0};
  for (int c = 0; c < OI_CODEC_COUNT; c++) {
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
  for (int c = 0; c < OI_CODEC_COUNT; c++)
    printf("capacity of a 4 MiB pool: %-13s %4llu blocks (%.3fx none)\n", CODECS[c],
           (unsigned long long)resident[c], (double)resident[c] / (double)resident[0]);
  CHECK(resident[0] > 0 && resident[0] < n);
  CHECK(resident[OI_CODEC_LOSSLESS] * 100 >= resident[0] * 135);
  CHECK(resident[OI_CODEC_INT8] * 10 >= resident[0] * 19);
  CHECK(resident[OI_CODEC_FP8] * 10 >= resident[0] * 19);
  CHECK(resident[OI_CODEC_INT8_HADAMARD] == resident[OI_CODEC_INT8]); /* the same frames' size */
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
 * warning names the slot and the remedies, the block's shape among them
 * (this namespace gives none; later saves within its period add none). */
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
        strstr(warned, "raise codec_slot_bytes") && strstr(warned, "-byte slot") &&
        strstr(warned, "give the block's shape")); /* the namespace has none */
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
static uint8_t *slot_in(oi_host *h, const char *name, const oi_block_hash *hash) {
  oi_host_ns ns;
  REQUIRE(oi__host_find_namespace(h, name, &ns));
  index_shard *s = oi__index_shard(h, ns.id, hash);
  pthread_mutex_lock(&s->lock);
  host_block *b = oi__index_find_locked(s, ns.id, hash);
  REQUIRE(b);
  uint8_t *frame = oi__block_data(h, b);
  pthread_mutex_unlock(&s->lock);
  return frame;
}

static uint8_t *slot_of(oi_host *h, const oi_block_hash *hash) {
  return slot_in(h, "corrupt", hash);
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

/* OI_LOSSLESS_CODE: "rans" stores rANS's frames (format 2), "planes",
 * empty or a value it does not know (warned about) frames of the planes
 * code (format 4, the default); all load byte-exact. OI_CODEC_ENCODE and OI_CODEC_DECODE, each of
 * their values (the cpu backend encodes and decodes on the host whatever
 * they say), ride along. (Slots of a whole block: with one table for a page's K
 * and V, the planes code compresses these pages about 1.35x, past the
 * default slot.) */
static void test_lossless_code(void) {
  enum { N = 8 };
  static const char *const values[] = {"planes", "rans", "huffman", ""};
  static const char *const where[] = {"host", "device", "gpu", ""};
  for (size_t v = 0; v < 4; v++) {
    setenv("OI_LOSSLESS_CODE", values[v], 1);
    setenv("OI_CODEC_ENCODE", where[v], 1);
    setenv("OI_CODEC_DECODE", where[3 - v], 1);
    uint8_t *mem = malloc(2 * N * PAGE);
    REQUIRE(mem);
    memcpy(mem, corpus, N * PAGE);
    char ns[32];
    snprintf(ns, sizeof ns, "code-%s", values[v]);
    oi_arena_desc ad = tr_arena("kv", mem, 2 * N, PAGE);
    oi_host *h = tr_host(16 * MiB);
    oi_engine_options o = codec_options(ns, &ad, "lossless");
    o.codec_slot_bytes = PAGE;
    oi_engine *e = tr_engine_new(h, &o);
    int64_t ids[N], dst[N];
    oi_block_hash hs[N];
    ids_hashes(ids, hs, N, (uint8_t)(0x70 + v));
    CHECK_OK(tr_save(e, ids, hs, N, 10000));
    size_t format4 = 0;
    for (int i = 0; i < N; i++)
      format4 += slot_in(h, ns, &hs[i])[4] == OI_LOSSLESS_PLANES_VERSION;
    oi_query_result q;
    CHECK_OK(tr_query(e, NULL, hs, N, 0, NULL, &q));
    CHECK(q.hit_blocks == N);
    for (int i = 0; i < N; i++)
      dst[i] = N + i;
    CHECK_OK(tr_load(e, q.lease, dst, N, 10000));
    CHECK(memcmp(mem + N * PAGE, corpus, N * PAGE) == 0);
    printf("OI_LOSSLESS_CODE=%-7s: %zu of %d frames of format 4, loaded byte-exact\n", values[v],
           format4, N);
    CHECK(format4 == (v == 1 ? 0 : (size_t)N));
    oi_engine_destroy(e);
    oi_host_destroy(h);
    free(mem);
  }
  unsetenv("OI_LOSSLESS_CODE");
  unsetenv("OI_CODEC_ENCODE");
  unsetenv("OI_CODEC_DECODE");
}

/* A block whose planes frame is past the namespace's slot is coded by rANS
 * on the host (its frame of format 2 fits) and loads byte-exact; a block
 * whose planes frame fits keeps it. The slot: a page's rANS frame rounded
 * up to the pool's alignment, where that is short of its planes frame. */
static void test_planes_past_slot_takes_rans(void) {
  const oi_codec_shape none = {.dtype = OI_CODEC_DTYPE_BF16};
  static uint8_t frame[2 * PAGE];
  size_t pages = npages, over = SIZE_MAX, fits = SIZE_MAX, slot = 0;
  for (size_t i = 0; i < pages && over == SIZE_MAX; i++) {
    size_t lr = 0, lp = 0;
    REQUIRE(oi__codec_encode(OI_CODEC_LOSSLESS, &none, corpus + i * PAGE, PAGE, frame, sizeof frame,
                             &lr) == OI_OK);
    REQUIRE(oi__codec_encode_planes(&none, corpus + i * PAGE, PAGE, frame, sizeof frame, &lp) ==
            OI_OK);
    size_t s = (lr + OI_SLOT_ALIGN - 1) & ~(size_t)(OI_SLOT_ALIGN - 1);
    if (s < lp) over = i, slot = s;
  }
  REQUIRE(over != SIZE_MAX);
  for (size_t i = 0; i < pages && fits == SIZE_MAX; i++) {
    size_t lp = 0;
    REQUIRE(oi__codec_encode_planes(&none, corpus + i * PAGE, PAGE, frame, sizeof frame, &lp) ==
            OI_OK);
    if (lp <= slot) fits = i;
  }
  REQUIRE(fits != SIZE_MAX);
  uint8_t *mem = malloc(4 * PAGE);
  REQUIRE(mem);
  memcpy(mem, corpus + over * PAGE, PAGE);
  memcpy(mem + PAGE, corpus + fits * PAGE, PAGE);
  oi_arena_desc ad = tr_arena("kv", mem, 4, PAGE);
  oi_host *h = tr_host(16 * MiB);
  oi_engine_options o = codec_options("past-slot", &ad, "lossless");
  o.codec_slot_bytes = slot;
  oi_engine *e = tr_engine_new(h, &o);
  int64_t ids[2] = {0, 1}, dst[2] = {2, 3};
  oi_block_hash hs[2];
  ids_hashes(ids, hs, 2, 0xB0);
  CHECK_OK(tr_save(e, ids, hs, 2, 10000));
  oi_query_result q;
  CHECK_OK(tr_query(e, NULL, hs, 2, 0, NULL, &q));
  CHECK(q.hit_blocks == 2);
  uint8_t v_over = slot_in(h, "past-slot", &hs[0])[4], v_fits = slot_in(h, "past-slot", &hs[1])[4];
  printf("a %zu-byte slot: page %zu (planes frame past it) stored as format %u, page %zu as "
         "format %u\n",
         slot, over, v_over, fits, v_fits);
  CHECK(v_over != OI_LOSSLESS_PLANES_VERSION && v_fits == OI_LOSSLESS_PLANES_VERSION);
  CHECK_OK(tr_load(e, q.lease, dst, 2, 10000));
  CHECK(memcmp(mem + 2 * PAGE, mem, 2 * PAGE) == 0);
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

/* ---- blocks of several arenas (layers) ---------------------------------------- */

enum { LA = 4 }; /* arenas (layers) of a block: a corpus page each */
#define LBLOCK (LA * PAGE)

/* The codec's round trip of a block of LA pages (byte-exact for none and
 * lossless). */
static void expected_block(int codec, const uint8_t *blk, uint8_t *out) {
  if (codec == OI_CODEC_NONE) {
    memcpy(out, blk, LBLOCK);
    return;
  }
  oi_codec_shape sh = {OI_CODEC_DTYPE_BF16, 2 * LA, 16, 3, 64};
  size_t cap = oi__codec_bound(codec, &sh, LBLOCK), fb = 0, ob = 0;
  uint8_t *frame = malloc(cap);
  REQUIRE(frame);
  REQUIRE(oi__codec_encode(codec, &sh, blk, LBLOCK, frame, cap, &fb) == OI_OK);
  REQUIRE(oi__codec_decode(frame, fb, out, LBLOCK, &ob) == OI_OK && ob == LBLOCK);
  free(frame);
}

/* An engine over LA arenas of `blocks` pages each: block id's arena a is at
 * mem + (a * blocks + id) * PAGE; blocks [0, blocks / 2) hold corpus pages
 * (block i, arena a: page (i * LA + a) mod npages), the rest 0xEE. */
typedef struct lrig {
  oi_host *h;
  oi_engine *e;
  uint8_t *mem;
  size_t blocks;
  oi_arena_desc ad[LA];
  oi_engine_options o;
} lrig;

static void lrig_begin(lrig *r, const char *ns, const char *codec, size_t blocks,
                       uint64_t pool_bytes) {
  memset(r, 0, sizeof *r);
  r->blocks = blocks;
  r->mem = malloc(LA * blocks * PAGE);
  REQUIRE(r->mem);
  memset(r->mem, 0xEE, LA * blocks * PAGE);
  for (size_t i = 0; i < blocks / 2; i++)
    for (uint32_t a = 0; a < LA; a++)
      memcpy(r->mem + (a * blocks + i) * PAGE, corpus + ((i * LA + a) % npages) * PAGE, PAGE);
  tr_layers(r->ad, LA, tr_layer_names, r->mem, blocks, PAGE);
  r->h = tr_host(pool_bytes);
  r->o = codec_options(ns, r->ad, codec);
  r->o.num_arenas = LA;
}

static void lrig_open(lrig *r, const char *ns, const char *codec, size_t blocks,
                      uint64_t pool_bytes) {
  lrig_begin(r, ns, codec, blocks, pool_bytes);
  r->e = tr_engine_new(r->h, &r->o);
}

static void lrig_close(lrig *r) {
  if (r->e) oi_engine_destroy(r->e);
  oi_host_destroy(r->h);
  free(r->mem);
}

static uint8_t *lrig_piece(const lrig *r, int64_t id, uint32_t a) {
  return r->mem + (a * r->blocks + (size_t)id) * PAGE;
}

/* The host block of device block id (its arenas in order). */
static void lrig_gather(const lrig *r, int64_t id, uint8_t *out) {
  for (uint32_t a = 0; a < LA; a++)
    memcpy(out + a * PAGE, lrig_piece(r, id, a), PAGE);
}

/* Expected bytes of source blocks [0, n): n x LBLOCK. */
static uint8_t *lrig_expected(const lrig *r, int codec, size_t n) {
  uint8_t *want = malloc(n * LBLOCK), *blk = malloc(LBLOCK);
  REQUIRE(want && blk);
  for (size_t i = 0; i < n; i++) {
    lrig_gather(r, (int64_t)i, blk);
    expected_block(codec, blk, want + i * LBLOCK);
  }
  free(blk);
  return want;
}

/* Blocks [0, n) of the hashes loaded into [at, at + n): how many differ from
 * want; -1 when fewer hit or the load failed. */
static long lrig_load_check(lrig *r, const oi_block_hash *hs, size_t n, size_t at,
                            const uint8_t *want) {
  oi_query_result q;
  CHECK_OK(tr_query(r->e, NULL, hs, n, 0, NULL, &q));
  if (q.hit_blocks != n) {
    if (q.hit_blocks) oi_engine_release(r->e, q.lease);
    return -1;
  }
  int64_t *dst = malloc(n * sizeof *dst);
  uint8_t *blk = malloc(LBLOCK);
  REQUIRE(dst && blk);
  for (size_t i = 0; i < n; i++)
    dst[i] = (int64_t)(at + i);
  long bad = 0;
  if (tr_load(r->e, q.lease, dst, n, 30000) != OI_OK) {
    bad = -1;
  } else {
    for (size_t i = 0; i < n; i++) {
      lrig_gather(r, dst[i], blk);
      bad += memcmp(blk, want + i * LBLOCK, LBLOCK) != 0;
    }
  }
  free(dst);
  free(blk);
  return bad;
}

/* Queries hs[0..n) (every one a hit) and loads them into dst, arena by
 * arena (OI_LOAD_ARENA_EVENTS); the load's ticket. */
static oi_ticket *layered_load(oi_engine *e, const oi_block_hash *hs, const int64_t *dst,
                               size_t n) {
  oi_query_result q;
  CHECK_OK(tr_query(e, NULL, hs, n, 0, NULL, &q));
  REQUIRE(q.hit_blocks == n);
  oi_load_options lo;
  CHECK_OK(oi_load_options_init(&lo));
  lo.flags = OI_LOAD_ARENA_EVENTS;
  oi_ticket *t = NULL;
  CHECK_OK(oi_engine_load(e, q.lease, dst, n, &lo, &t));
  REQUIRE(t);
  return t;
}

/* Layered loads in codec namespaces: arena a's bytes of every block are in
 * place (the codec's round trip) when oi_ticket_arena_wait(a) returns; the
 * first arena is reported while the last is still pending (in some of the
 * rounds: the test thread may be descheduled); with small bounce groups the
 * first groups land whole and the last arena by arena; a frame that does
 * not decode fails every arena and the load. */
static void test_layered_loads(void) {
  static const int codecs[] = {OI_CODEC_LOSSLESS, OI_CODEC_INT8};
  size_t n = npages;
  for (size_t ci = 0; ci < 2; ci++)
    for (int small = 0; small < 2; small++) {
      int codec = codecs[ci];
      char ns[32];
      snprintf(ns, sizeof ns, "layered-%s-%d", CODECS[codec], small);
      lrig r;
      lrig_begin(&r, ns, CODECS[codec], 2 * n, 64 * MiB);
      if (small) r.o.submit_group_bytes = 119 * LBLOCK; /* bounce groups of 120 blocks */
      r.e = tr_engine_new(r.h, &r.o);
      int64_t *ids = malloc(n * sizeof *ids);
      oi_block_hash *hs = malloc(n * sizeof *hs);
      REQUIRE(ids && hs);
      ids_hashes(ids, hs, n, (uint8_t)(0x60 + codec * 2 + small));
      CHECK_OK(tr_save(r.e, ids, hs, n, 30000));
      uint8_t *want = lrig_expected(&r, codec, n);
      int64_t *dst = malloc(n * sizeof *dst);
      REQUIRE(dst);
      for (size_t i = 0; i < n; i++)
        dst[i] = (int64_t)(n + i);
      int early = 0, rounds = 0;
      size_t differ = 0;
      /* 8 rounds, up to 32 while none reported arena 0 early. */
      for (; rounds < 8 || (rounds < 32 && early == 0); rounds++) {
        for (uint32_t a = 0; a < LA; a++) /* the destination blocks cleared */
          memset(lrig_piece(&r, (int64_t)n, a), 0, n * PAGE);
        oi_ticket *t = layered_load(r.e, hs, dst, n);
        CHECK_OK(oi_ticket_arena_wait(t, 0, 30000));
        early += oi_ticket_arena_poll(t, LA - 1) == OI_PENDING;
        for (uint32_t a = 0; a < LA; a++) {
          CHECK_OK(oi_ticket_arena_wait(t, a, 30000));
          for (size_t i = 0; i < n; i++) /* arena a of every block, in place now */
            differ += memcmp(lrig_piece(&r, dst[i], a), want + i * LBLOCK + a * PAGE, PAGE) != 0;
        }
        CHECK_ST(oi_ticket_arena_wait(t, LA, 0), OI_ERR_INVALID_ARGUMENT);
        CHECK_OK(oi_ticket_wait(t, 30000));
        oi_ticket_release(t);
      }
      printf("layered loads, %-8s %s groups: %d of %d rounds reported arena 0 before arena %d "
             "landed; %zu pieces differ\n",
             CODECS[codec], small ? "120-block" : "whole", early, rounds, LA - 1, differ);
      CHECK(differ == 0);
      CHECK(early >= 1);

      /* A frame that does not decode (block 3: in the first group, loaded
       * whole, when the groups are small; the only one otherwise): every
       * arena fails. */
      slot_in(r.h, ns, &hs[3])[OI_CODEC_HEADER_BYTES + 64] ^= 0x08;
      oi_ticket *t = layered_load(r.e, hs, dst, n);
      for (uint32_t a = 0; a < LA; a++)
        CHECK_ST(oi_ticket_arena_wait(t, a, 30000), OI_ERR_PROTOCOL);
      CHECK_ST(oi_ticket_wait(t, 30000), OI_ERR_PROTOCOL);
      CHECK(strstr(oi_last_error(), "did not decode") != NULL);
      oi_ticket_release(t);
      for (uint32_t a = 0; a < LA; a++) /* the bad block's pieces: zeros, never other bytes */
        for (size_t b = 0; b < PAGE; b++)
          if (lrig_piece(&r, dst[3], a)[b]) {
            CHECK(!"a failed frame's piece is not cleared");
            break;
          }
      CHECK(tr_engine_stats(r.e).loads_failed == 1);
      free(dst);
      free(want);
      free(ids);
      free(hs);
      lrig_close(&r);
    }
}

static uint64_t hits(oi_engine *e, const oi_block_hash *hs, size_t n) {
  uint8_t present[256];
  REQUIRE(n <= sizeof present);
  oi_query_result q = {.struct_size = sizeof q, .present = present};
  CHECK_OK(oi_engine_query(e, NULL, hs, n, OI_QUERY_MEMBERSHIP, &q));
  return q.hit_blocks;
}

/* Layerwise saves in each codec: arenas out of order (2, 0, 3, 1), nothing
 * visible or sealed until the last landed, then every block the codec's
 * round trip; the frames take the codec's slots; saving the sealed blocks
 * layer by layer again deduplicates. */
static void test_layerwise_saves(void) {
  enum { N = 64 };
  static const uint32_t order[LA] = {2, 0, 3, 1};
  for (int c = 0; c < OI_CODEC_COUNT; c++) {
    char ns[32];
    snprintf(ns, sizeof ns, "lw-%s", CODECS[c]);
    lrig r;
    lrig_open(&r, ns, CODECS[c], 2 * N, 16 * MiB);
    int64_t ids[N];
    oi_block_hash hs[N];
    ids_hashes(ids, hs, N, (uint8_t)(0x70 + c));
    for (uint32_t k = 0; k < LA; k++) {
      CHECK(hits(r.e, hs, N) == 0);
      CHECK(tr_host_stats(r.h).blocks_sealed == 0);
      CHECK_OK(tr_save_arenas(r.e, ids, hs, N, order[k], 1, 30000));
    }
    CHECK(hits(r.e, hs, N) == N);
    oi_host_stats hst = tr_host_stats(r.h);
    CHECK(hst.blocks_in_flight == 0 && hst.blocks_sealed == N);
    oi_engine_stats es = tr_engine_stats(r.e);
    CHECK(es.saves_submitted == N && es.saves_completed == N && es.saves_failed == 0);
    CHECK(es.bytes_saved == N * LBLOCK);
    oi_host_namespace_stats s = ns_stats(r.h, 0);
    CHECK(strcmp(s.codec, CODECS[c]) == 0 && s.blocks_resident == N);
    CHECK(s.physical_bytes < s.logical_bytes || c == OI_CODEC_NONE);
    if (c != OI_CODEC_NONE) /* a frame, its bytes past it zeroed */
      CHECK(memcmp(slot_in(r.h, ns, &hs[5]), "OIKC", 4) == 0);
    uint8_t *want = lrig_expected(&r, c, N);
    long bad = lrig_load_check(&r, hs, N, N, want);
    printf("layerwise save, %-8s: %d blocks of %d arenas sealed, %ld differ, physical %llu of "
           "%llu logical bytes\n",
           CODECS[c], N, LA, bad, (unsigned long long)s.physical_bytes,
           (unsigned long long)s.logical_bytes);
    CHECK(bad == 0);
    /* Again, layer by layer: deduplicated, nothing held. */
    for (uint32_t a = 0; a < LA; a++)
      CHECK_OK(tr_save_arenas(r.e, ids, hs, N, a, 1, 30000));
    CHECK(tr_host_stats(r.h).blocks_in_flight == 0);
    CHECK(tr_engine_stats(r.e).saves_deduplicated == N);
    CHECK_OK(oi_engine_flush(r.e, 10000));
    free(want);
    lrig_close(&r);
  }
}

/* Layerwise lossless saves of blocks the codec does not store (random
 * bytes) between saves of blocks it does: each not-encoded block is counted
 * (saves_failed, saves_not_encoded), and every block after it that encodes
 * seals (the sweep's encode marks only the blocks it failed). */
static void test_layerwise_after_not_encoded(void) {
  enum { N = 16, ROUNDS = 4 };
  lrig r;
  lrig_open(&r, "lw-noise", "lossless", 4 * N, 16 * MiB);
  uint64_t seed = 11;
  for (uint32_t a = 0; a < LA; a++) /* blocks [2N, 4N): random bytes */
    for (size_t i = 0; i < 2 * N * PAGE; i += 8) {
      uint64_t v = ct_rand(&seed);
      memcpy(lrig_piece(&r, 2 * N, a) + i, &v, 8);
    }
  uint64_t sealed = 0;
  for (int k = 0; k < ROUNDS; k++) {
    int64_t ids[N];
    oi_block_hash hs[N];
    ids_hashes(ids, hs, N, (uint8_t)(0xA0 + 2 * k)); /* noise */
    for (size_t i = 0; i < N; i++)
      ids[i] = (int64_t)(2 * N + i);
    for (uint32_t a = 0; a < LA; a++)
      CHECK_OK(tr_save_arenas(r.e, ids, hs, N, a, 1, 30000));
    CHECK(hits(r.e, hs, N) == 0);
    ids_hashes(ids, hs, N, (uint8_t)(0xA1 + 2 * k)); /* corpus pages, blocks [0, N) */
    for (uint32_t a = 0; a < LA; a++)
      CHECK_OK(tr_save_arenas(r.e, ids, hs, N, a, 1, 30000));
    CHECK(hits(r.e, hs, N) == N);
    sealed += hits(r.e, hs, N);
  }
  oi_engine_stats es = tr_engine_stats(r.e);
  printf("layerwise lossless saves: %d rounds of %d random and %d corpus blocks: %llu not "
         "encoded, %llu failed, %llu completed\n",
         ROUNDS, N, N, (unsigned long long)es.saves_not_encoded,
         (unsigned long long)es.saves_failed, (unsigned long long)es.saves_completed);
  CHECK(sealed == ROUNDS * N);
  CHECK(es.saves_not_encoded == ROUNDS * N && es.saves_failed == ROUNDS * N);
  CHECK(es.saves_completed == ROUNDS * N);
  lrig_close(&r);
}

/* Layerwise saves that stop before their last arena: the engine destroyed
 * (a new engine of the namespace misses every block, the host holds none in
 * flight, and the same hashes then save whole layer by layer), and the save
 * deadline (aborted, counted failed, a flush waits). Under asan, nothing
 * leaks. */
static void test_layerwise_abandoned(void) {
  enum { N = 32 };
  for (int c = 1; c < OI_CODEC_COUNT; c++) {
    char ns[32];
    snprintf(ns, sizeof ns, "lw-gone-%s", CODECS[c]);
    lrig r;
    lrig_open(&r, ns, CODECS[c], 2 * N, 16 * MiB);
    int64_t ids[N];
    oi_block_hash hs[N];
    ids_hashes(ids, hs, N, (uint8_t)(0x80 + c));
    CHECK_OK(tr_save_arenas(r.e, ids, hs, N, 0, LA - 1, 30000)); /* every arena but the last */
    CHECK(tr_host_stats(r.h).blocks_in_flight == N);
    oi_engine_destroy(r.e);
    r.e = NULL;
    oi_host_stats hst = tr_host_stats(r.h);
    CHECK(hst.blocks_in_flight == 0 && hst.blocks_sealed == 0);
    r.e = tr_engine_new(r.h, &r.o);
    CHECK(hits(r.e, hs, N) == 0);
    CHECK(ns_stats(r.h, 0).blocks_resident == 0);
    for (uint32_t a = 0; a < LA; a++)
      CHECK_OK(tr_save_arenas(r.e, ids, hs, N, a, 1, 30000));
    uint8_t *want = lrig_expected(&r, c, N);
    CHECK(lrig_load_check(&r, hs, N, N, want) == 0);
    free(want);
    oi_engine_destroy(r.e);
    r.e = NULL;

    /* The save deadline: layers 0 and 1 only. */
    r.o.save_deadline_ms = 200;
    r.e = tr_engine_new(r.h, &r.o);
    oi_block_hash hs2[N];
    ids_hashes(ids, hs2, N, (uint8_t)(0x90 + c));
    CHECK_OK(tr_save_arenas(r.e, ids, hs2, N, 0, 2, 30000));
    CHECK(tr_host_stats(r.h).blocks_in_flight == N);
    CHECK_OK(oi_engine_flush(r.e, 10000));
    CHECK(tr_host_stats(r.h).blocks_in_flight == 0);
    CHECK(hits(r.e, hs2, N) == 0);
    oi_engine_stats es = tr_engine_stats(r.e);
    CHECK(es.saves_failed == N && es.saves_completed == 0);
    /* Its last layers after the deadline: skipped (the records ended), still a miss. */
    CHECK_OK(tr_save_arenas(r.e, ids, hs2, N, 2, 2, 30000));
    CHECK_OK(oi_engine_flush(r.e, 10000));
    CHECK(hits(r.e, hs2, N) == 0); /* new records of two arenas: aborted at the deadline too */
    es = tr_engine_stats(r.e);
    CHECK(es.saves_submitted == 2 * N && es.saves_failed == 2 * N && es.saves_completed == 0);
    lrig_close(&r);
  }
}

/* The per-block bounces are bounded (1/16 of the pool, at least 4 MiB): a
 * layerwise save of more blocks than they hold drops the rest at their
 * first layer (failed saves, misses) and seals the others; the bounces come
 * back for the next save. */
static void test_layerwise_bounce_bound(void) {
  enum { N = 120 };
  size_t hold = (4 * MiB) / LBLOCK; /* a 16 MiB pool: the 4 MiB floor */
  REQUIRE(hold < N);
  lrig r;
  lrig_open(&r, "lw-bound", "lossless", 2 * N, 16 * MiB);
  int64_t ids[N];
  oi_block_hash hs[N];
  ids_hashes(ids, hs, N, 0xA0);
  for (uint32_t a = 0; a < LA; a++)
    CHECK_OK(tr_save_arenas(r.e, ids, hs, N, a, 1, 30000));
  oi_engine_stats es = tr_engine_stats(r.e);
  printf("bounce bound: %llu of %d blocks sealed, %llu failed (bounces for %zu)\n",
         (unsigned long long)es.saves_completed, N, (unsigned long long)es.saves_failed, hold);
  CHECK(es.saves_completed == hold && es.saves_failed == N - hold);
  CHECK(hits(r.e, hs, hold) == hold);
  CHECK(hits(r.e, hs + hold, N - hold) == 0);
  CHECK(tr_host_stats(r.h).blocks_in_flight == 0);
  uint8_t *want = lrig_expected(&r, OI_CODEC_LOSSLESS, hold);
  CHECK(lrig_load_check(&r, hs, hold, N, want) == 0);
  free(want);
  /* The bounces came back: the rest now seal. */
  for (uint32_t a = 0; a < LA; a++)
    CHECK_OK(tr_save_arenas(r.e, ids + hold, hs + hold, N - hold, a, 1, 30000));
  CHECK(hits(r.e, hs + hold, N - hold) == N - hold);
  lrig_close(&r);
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
  RUN_TEST(test_lossless_code);
  RUN_TEST(test_planes_past_slot_takes_rans);
  RUN_TEST(test_disk);
  RUN_TEST(test_layered_loads);
  RUN_TEST(test_layerwise_saves);
  RUN_TEST(test_layerwise_after_not_encoded);
  RUN_TEST(test_layerwise_abandoned);
  RUN_TEST(test_layerwise_bounce_bound);
  free(corpus);
  TEST_EXIT();
}
