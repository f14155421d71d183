/* Validation and bad input: each refusal returns a clear status with a
 * non-empty message and changes nothing (host stats identical, device memory
 * identical, saved data still loads byte-exact, a failed registration binds
 * no namespace). Also: documented defaults of the *_options_init functions. */
#include <stddef.h>
#include <time.h>

#include "engine_testutil.h"

#define SEED 0x7A11Dull
#define NB 16

static oi_host *host;
static oi_engine *eng;
static etu_layout L;
static oi_block_hash saved[4];
static oi_host_stats baseline;
static uint8_t *region_copy;

/* Scratch memory the hand-written layouts point into. */
#define MEM_BYTES (24u << 20)
static uint8_t *mem;

// clang-format off
#define FIELDS(X) \
  X(size_classes) \
  X(capacity_bytes) \
  X(used_bytes) \
  X(free_bytes) \
  X(block_bytes_resident) \
  X(blocks_free) \
  X(blocks_in_flight) \
  X(blocks_sealed) \
  X(blocks_leased) \
  X(blocks_loading) \
  X(saves_submitted) \
  X(saves_completed) \
  X(saves_deduplicated) \
  X(saves_dropped) \
  X(saves_failed) \
  X(bytes_saved) \
  X(bytes_loaded) \
  X(loads_completed) \
  X(loads_failed) \
  X(query_hit_blocks) \
  X(query_miss_blocks) \
  X(leases_active) \
  X(leases_expired) \
  X(leases_released) \
  X(evictions)
// clang-format on

static void take_baseline(void) {
  baseline = etu_host_stats(host);
  memcpy(region_copy, L.region, (size_t)L.region_bytes + 64);
}

/* Host stats and device bytes are what they were at the last baseline. */
static void expect_unchanged(int line) {
  oi_host_stats now = etu_host_stats(host);
  bool same = true;
#define CMP(f)                                                                                     \
  if (now.f != baseline.f) {                                                                       \
    fprintf(stderr, "  line %d: host stat " #f " changed: %" PRIu64 " -> %" PRIu64 "\n", line,     \
            (uint64_t)baseline.f, (uint64_t)now.f);                                                \
    same = false;                                                                                  \
  }
  FIELDS(CMP)
#undef CMP
  if (!same) oi_test_failures++;
  if (memcmp(region_copy, L.region, (size_t)L.region_bytes + 64) != 0) {
    fprintf(stderr, "  line %d: device memory changed\n", line);
    oi_test_failures++;
  }
}
#define UNCHANGED() expect_unchanged(__LINE__)

/* ---- options ------------------------------------------------------------- */

static void test_options_init_fills_documented_defaults(void) {
  oi_host_options ho;
  memset(&ho, 0x5A, sizeof ho);
  CHECK_OK(oi_host_options_init(&ho));
  CHECK(ho.struct_size == sizeof ho);
  CHECK(ho.lease_ttl_ms == 600000);
  CHECK(ho.index_shards == 64);
  CHECK(ho.high_watermark > 0.949f && ho.high_watermark < 0.951f);
  CHECK(ho.low_watermark > 0.899f && ho.low_watermark < 0.901f);
  CHECK(ho.chunk_bytes == 0);
  CHECK(ho.pool_bytes == 0);
  CHECK(ho.numa_node == -1);
  CHECK(ho.flags == 0);
  oi_engine_options eo;
  memset(&eo, 0x5A, sizeof eo);
  CHECK_OK(oi_engine_options_init(&eo));
  CHECK(eo.struct_size == sizeof eo);
  CHECK(eo.world_size == 1);
  CHECK(eo.save_deadline_ms == 120000);
  CHECK(eo.load_deadline_ms == 120000);
  CHECK(eo.copy_mode == OI_COPY_AUTO);
  CHECK(eo.namespace_id == NULL && eo.arenas == NULL && eo.arena_base == NULL);
  CHECK(eo.num_arenas == 0);
  CHECK(eo.submit_group_bytes == 0 && eo.staging_bytes == 0);
  oi_save_options so;
  memset(&so, 0x5A, sizeof so);
  CHECK_OK(oi_save_options_init(&so));
  CHECK(so.struct_size == sizeof so && so.flags == 0 && so.wait_event == NULL &&
        so.on_done == NULL);
  oi_load_options lo;
  memset(&lo, 0x5A, sizeof lo);
  CHECK_OK(oi_load_options_init(&lo));
  CHECK(lo.struct_size == sizeof lo && lo.flags == 0);
  CHECK_FAILS(oi_host_options_init(NULL), OI_ERR_INVALID_ARGUMENT);
  CHECK_FAILS(oi_engine_options_init(NULL), OI_ERR_INVALID_ARGUMENT);
  CHECK_FAILS(oi_save_options_init(NULL), OI_ERR_INVALID_ARGUMENT);
  CHECK_FAILS(oi_load_options_init(NULL), OI_ERR_INVALID_ARGUMENT);
}

static void test_host_create_refuses_bad_options(void) {
  oi_host_options o;
  CHECK_OK(oi_host_options_init(&o));
  o.device = OI_DEVICE_CPU;
  oi_host *h = NULL;
  CHECK_FAILS(oi_host_create(&o, &h), OI_ERR_INVALID_ARGUMENT); /* pool_bytes unset */
  CHECK(h == NULL);
  o.pool_bytes = 4 << 20;
  CHECK_FAILS(oi_host_create(NULL, &h), OI_ERR_INVALID_ARGUMENT);
  CHECK_FAILS(oi_host_create(&o, NULL), OI_ERR_INVALID_ARGUMENT);
  oi_host_options z = o;
  z.struct_size = 0;
  CHECK_FAILS(oi_host_create(&z, &h), OI_ERR_INVALID_ARGUMENT);
  CHECK(h == NULL);
  /* Each option past its bounds, with the field named. */
  const struct {
    float low, high;
    uint32_t flags, ttl, shards;
    uint64_t chunk;
    const char *why;
  } bad[] = {
      {0.9f, 0.5f, 0, 1000, 0, 0, "watermarks"},  /* low above high */
      {-0.1f, 0.5f, 0, 1000, 0, 0, "watermarks"}, /* negative */
      {0.5f, 1.5f, 0, 1000, 0, 0, "watermarks"},  /* above 1 */
      {0.5f, 0.9f, 1u << 7, 1000, 0, 0, "unknown flags"},
      {0.5f, 0.9f, 0, 0, 0, 0, "lease_ttl_ms is 0"},
      {0.5f, 0.9f, 0, 1000, 3, 0, "index_shards 3"},
      {0.5f, 0.9f, 0, 1000, 131072, 0, "index_shards 131072"}, /* a power of two past 65536 */
      {0.5f, 0.9f, 0, 1000, 0, 8ull << 20, "chunk_bytes"},     /* over the 4 MiB pool */
      {0.5f, 0.9f, 0, 1000, 0, 100, "chunk_bytes"},            /* under a slot */
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    z = o;
    z.low_watermark = bad[i].low;
    z.high_watermark = bad[i].high;
    z.flags = bad[i].flags;
    z.lease_ttl_ms = bad[i].ttl;
    if (bad[i].shards) z.index_shards = bad[i].shards;
    z.chunk_bytes = bad[i].chunk;
    h = NULL;
    oi_status st = oi_host_create(&z, &h);
    if (st != OI_ERR_INVALID_ARGUMENT || h != NULL || !strstr(oi_last_error(), bad[i].why)) {
      fprintf(stderr, "  host option case %zu: %s (%s)\n", i, oi_status_str(st), oi_last_error());
      oi_test_failures++;
    }
    oi_host_destroy(h);
  }
  h = NULL;
  /* A newer caller's bigger struct: fine when the unknown tail is zero,
   * OI_ERR_UNSUPPORTED when it asks for something this library lacks. */
  struct {
    oi_host_options o;
    uint64_t newer_field;
  } big;
  memset(&big, 0, sizeof big);
  big.o = o;
  big.o.struct_size = sizeof big;
  big.newer_field = 1;
  CHECK_FAILS(oi_host_create(&big.o, &h), OI_ERR_UNSUPPORTED);
  CHECK(h == NULL);
  big.newer_field = 0;
  CHECK_OK(oi_host_create(&big.o, &h));
  CHECK(h != NULL);
  oi_host_destroy(h);
  oi_host_destroy(NULL);
}

/* ---- layouts --------------------------------------------------------------- */

static int ns_counter;

static void opts_for(oi_engine_options *o, const oi_arena_desc *a, uint32_t n, const char *ns) {
  REQUIRE(oi_engine_options_init(o) == OI_OK);
  o->device = OI_DEVICE_CPU;
  o->namespace_id = ns;
  o->arenas = a;
  o->num_arenas = n;
}

static oi_arena_desc arena(const char *name, uint64_t off, uint64_t nb, uint64_t bpb,
                           uint64_t stride) {
  oi_arena_desc d;
  memset(&d, 0, sizeof d);
  d.name = name;
  d.base = mem + off;
  d.num_blocks = nb;
  d.bytes_per_block = bpb;
  d.block_stride = stride;
  d.segments = 1;
  return d;
}

static void refused(const oi_engine_options *o, oi_status want, const char *what, int line) {
  oi_engine *e = NULL;
  oi_clear_error();
  oi_status st = oi_engine_create(host, o, &e);
  if (st != want || e != NULL || strlen(oi_last_error()) == 0) {
    fprintf(stderr, "  line %d (%s): create returned %s (want %s), engine %p, message \"%s\"\n",
            line, what, oi_status_str(st), oi_status_str(want), (void *)e, oi_last_error());
    oi_test_failures++;
  }
  if (e) oi_engine_destroy(e);
  expect_unchanged(line);
}
#define REFUSED(o, what) refused(o, OI_ERR_INVALID_ARGUMENT, what, __LINE__)

static void accepted(oi_engine_options *o, const char *what, int line) {
  char ns[32];
  snprintf(ns, sizeof ns, "v-ok-%d", ns_counter++);
  o->namespace_id = ns;
  oi_engine *e = NULL;
  oi_status st = oi_engine_create(host, o, &e);
  if (st != OI_OK || !e) {
    fprintf(stderr, "  line %d (%s): valid layout refused: %s: %s\n", line, what, oi_status_str(st),
            oi_last_error());
    oi_test_failures++;
  }
  oi_engine_destroy(e);
}
#define ACCEPTED(o, what) accepted(o, what, __LINE__)

/* A pool larger than the machine can give is refused before a page is
 * touched (it would otherwise be touched until the process is killed), with
 * and without pinning, and the message says what is available. */
static void test_a_pool_larger_than_memory_is_refused_at_once(void) {
  for (int no_pin = 0; no_pin < 2; no_pin++) {
    oi_host_options o;
    CHECK_OK(oi_host_options_init(&o));
    o.device = OI_DEVICE_CPU;
    o.pool_bytes = 10240ull << 30; /* 10 TiB */
    if (no_pin) o.flags |= OI_HOST_NO_PIN;
    oi_host *h = NULL;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    CHECK_FAILS(oi_host_create(&o, &h), OI_ERR_OUT_OF_MEMORY);
    CHECK(h == NULL);
    CHECK(strstr(oi_last_error(), "10240.00 GiB asked for") != NULL);
    CHECK(strstr(oi_last_error(), "GiB of memory is available") != NULL);
    clock_gettime(CLOCK_MONOTONIC, &b);
    CHECK(b.tv_sec - a.tv_sec < 2); /* refused, not touched */
  }
}

static void test_bad_layouts_are_refused_and_bind_nothing(void) {
  take_baseline();
  oi_arena_desc a[40];
  oi_engine_options o;
  const char *ns = "v-fresh"; /* no failed registration may bind its block shape */

  a[0] = arena("k", 0, 8, 4096, 4096);
  a[1] = arena("v", 64 << 10, 8, 4096, 4096);
  opts_for(&o, a, 2, ns);
  oi_engine *e = NULL;
  CHECK_FAILS(oi_engine_create(NULL, &o, &e), OI_ERR_INVALID_ARGUMENT);
  CHECK_FAILS(oi_engine_create(host, NULL, &e), OI_ERR_INVALID_ARGUMENT);
  CHECK_FAILS(oi_engine_create(host, &o, NULL), OI_ERR_INVALID_ARGUMENT);
  CHECK(e == NULL);

  oi_engine_options x = o;
  x.struct_size = 0;
  REFUSED(&x, "struct_size 0");
  x = o, x.num_arenas = 0;
  REFUSED(&x, "no arenas");
  x = o, x.arenas = NULL;
  REFUSED(&x, "arenas NULL");
  x = o, x.world_size = 0;
  REFUSED(&x, "world_size 0");
  x = o, x.namespace_id = NULL;
  REFUSED(&x, "namespace NULL");
  x = o, x.copy_mode = OI_COPY_STAGED + 1;
  REFUSED(&x, "copy_mode past the last oi_copy_mode");
  x = o, x.submit_group_bytes = (64 << 10) - 1;
  REFUSED(&x, "submit_group_bytes below 64 KiB");
  CHECK(strstr(oi_last_error(), "submit_group_bytes"));
  x = o, x.staging_bytes = (4 << 20) - 1;
  REFUSED(&x, "staging_bytes below 4 MiB");
  CHECK(strstr(oi_last_error(), "staging_bytes"));
  x = o, x.staging_bytes = (4ull << 30) + 1;
  REFUSED(&x, "staging_bytes above 4 GiB");
  char long_ns[258];
  memset(long_ns, 'n', sizeof long_ns - 1);
  long_ns[sizeof long_ns - 1] = '\0';
  x = o, x.namespace_id = long_ns;
  REFUSED(&x, "namespace_id of 257 bytes");
  CHECK(strstr(oi_last_error(), "longer than 255 bytes"));
  x = o, x.device = -2;
  REFUSED(&x, "device -2");
  CHECK(strstr(oi_last_error(), "not an ordinal"));
  x = o, x.num_arenas = 4097; /* the most is 4096 (lib/engine/layout.h) */
  REFUSED(&x, "4097 arenas");
  CHECK(strstr(oi_last_error(), "at most"));

  oi_arena_desc b[2];
#define VARIANT(stmt, what)                                                                        \
  do {                                                                                             \
    memcpy(b, a, sizeof b);                                                                        \
    stmt;                                                                                          \
    x = o;                                                                                         \
    x.arenas = b;                                                                                  \
    REFUSED(&x, what);                                                                             \
  } while (0)
  VARIANT((b[0].num_blocks = 0, b[1].num_blocks = 0), "zero blocks");
  VARIANT(b[1].num_blocks = 7, "differing num_blocks");
  VARIANT(b[1].name = NULL, "NULL name");
  VARIANT(b[1].name = "k", "duplicate names");
  VARIANT(b[0].bytes_per_block = 0, "bytes_per_block 0");
  VARIANT(b[0].block_stride = 4095, "stride below the copy unit");
  VARIANT(b[0].segments = 0, "segments 0");
  VARIANT((b[0].segments = 9, b[0].segment_stride = 4096, b[0].block_stride = 9 * 4096),
          "segments 9");
  VARIANT((b[0].segments = 2, b[0].segment_stride = 4095, b[0].block_stride = 16384),
          "segment_stride below bytes_per_block");
  VARIANT((b[0].segments = 2, b[0].segment_stride = 4096, b[0].block_stride = 8191),
          "stride below (segments-1)*segment_stride + bytes_per_block");
  VARIANT(b[1].base = mem + 100, "arenas overlap");
  VARIANT(b[1].base = mem + 8 * 4096 - 1, "arenas overlap by one byte");
  VARIANT(b[1].base = NULL, "NULL base without arena_base");
  VARIANT(b[0].base = mem + (64 << 10) + 4096, "arena 0 inside arena 1");
  VARIANT(b[1].name = "", "empty name");
  VARIANT((b[0].num_blocks = b[1].num_blocks = UINT64_MAX / 4096 + 2),
          "num_blocks x block_stride past the address space");
  VARIANT(b[1].base = (uint8_t *)(UINTPTR_MAX - 4096),
          "an arena whose end wraps the address space");
#undef VARIANT

  /* Interleaved layouts: a gap-interleave that is off by one byte overlaps. */
  a[0] = arena("kv", 0, 8, 1000, 4000);
  a[0].segments = 2;
  a[0].segment_stride = 2000;
  a[1] = arena("b", 1000, 8, 1000, 4000);
  a[2] = arena("c", 2999, 8, 1000, 4000);
  opts_for(&x, a, 3, ns);
  REFUSED(&x, "gap-interleaved arenas overlapping a segment by one byte");
  /* Different strides that collide only at a later block (b=3 vs a=4). */
  a[0] = arena("x", 0, 8, 1000, 4000);
  a[1] = arena("y", 1000, 8, 1000, 5000);
  opts_for(&x, a, 2, ns);
  REFUSED(&x, "arenas with different strides overlapping at block 3");
  /* Page-first, with one arena shifted onto its neighbour. */
  for (int i = 0; i < 36; i++) {
    static char names[36][8];
    snprintf(names[i], sizeof names[i], "L%d", i);
    a[i] = arena(names[i], (uint64_t)i * (64 << 10), 4, 64 << 10, 36 * (64 << 10));
  }
  a[20].base = (uint8_t *)a[20].base - 1;
  opts_for(&x, a, 36, ns);
  REFUSED(&x, "page-first with one arena shifted by -1");

  /* Offset mode: arenas must fit in [arena_base, arena_base + arena_size) and
   * carry no absolute base. */
  a[0] = arena("k", 0, 8, 4096, 4096);
  a[1] = arena("v", 0, 8, 4096, 4096);
  a[0].base = a[1].base = NULL;
  a[0].offset = 0;
  a[1].offset = 8 * 4096;
  opts_for(&x, a, 2, ns);
  x.arena_base = mem;
  x.arena_size = 16 * 4096 - 1;
  REFUSED(&x, "arena reaching one byte past arena_size");
  x.arena_size = 0;
  REFUSED(&x, "arena_size 0");
  a[1].offset = UINT64_MAX - 4096;
  x.arena_size = 16 * 4096;
  REFUSED(&x, "offset near UINT64_MAX (overflow)");
  a[1].offset = 8 * 4096;
  a[1].base = mem + 8 * 4096;
  REFUSED(&x, "both base and arena_base");
  a[1].base = NULL;
  a[1].offset = 4096;
  REFUSED(&x, "overlapping by offset");

  UNCHANGED();
  /* None of the refusals bound "v-fresh": a valid layout of another block
   * size registers there now. */
  a[0] = arena("only", 0, 8, 777, 777);
  opts_for(&x, a, 1, ns);
  e = NULL;
  CHECK_OK(oi_engine_create(host, &x, &e));
  oi_engine_destroy(e);
  /* The tuning fields' edges are accepted. */
  x.submit_group_bytes = 64 << 10;
  x.staging_bytes = 4ull << 30;
  e = NULL;
  CHECK_OK(oi_engine_create(host, &x, &e));
  oi_engine_destroy(e);
  x.submit_group_bytes = UINT64_MAX;
  x.staging_bytes = 4 << 20;
  e = NULL;
  CHECK_OK(oi_engine_create(host, &x, &e));
  oi_engine_destroy(e);
  x.submit_group_bytes = x.staging_bytes = 0;
  for (uint32_t m = OI_COPY_AUTO; m <= OI_COPY_STAGED;
       m++) { /* every mode is accepted (cpu: memcpy) */
    x.copy_mode = m;
    e = NULL;
    CHECK_OK(oi_engine_create(host, &x, &e));
    oi_engine_destroy(e);
  }
}

/* oi_engine_options.segment_offsets: segments as separate regions (vLLM's
 * K half, then V half). */
static void test_segment_offsets_are_validated(void) {
  oi_arena_desc a[2];
  oi_engine_options o, x;
  a[0] = arena("L0", 0, 8, 4096, 4096);
  a[1] = arena("L1", 16 * 4096, 8, 4096, 4096);
  a[0].segments = a[1].segments = 2;
  uint64_t offs[4] = {0, 8 * 4096, 0, 8 * 4096};
  opts_for(&o, a, 2, "v-seg");
  o.segment_offsets = offs;
  o.num_segment_offsets = 4;
  ACCEPTED(&o, "K and V halves of 2 layers");
  take_baseline(); /* an accepted layout binds its namespace */
  o.namespace_id = "v-seg";
  x = o, x.num_segment_offsets = 3;
  REFUSED(&x, "one segment offset short");
  CHECK(strstr(oi_last_error(), "num_segment_offsets"));
  x = o, x.num_segment_offsets = 5;
  REFUSED(&x, "one segment offset too many");
  x = o, x.segment_offsets = NULL;
  REFUSED(&x, "a count without offsets");
  uint64_t bad[4] = {0, 8 * 4096 - 1, 0, 8 * 4096};
  x = o, x.segment_offsets = bad;
  REFUSED(&x, "V half overlapping the K half's last block by one byte");
  CHECK(strstr(oi_last_error(), "segments 0 and 1 overlap"));
  uint64_t into[4] = {0, 8 * 4096, 0, 24 * 4096 - 16 * 4096 - 4096}; /* L1's V over L0's V */
  into[3] = (uint64_t)-1;                                            /* overflow */
  x = o, x.segment_offsets = into;
  REFUSED(&x, "a segment offset past the address space");
  uint64_t cross[4] = {0, 16 * 4096 + 4096, 0, 8 * 4096}; /* L0's V inside L1's K */
  x = o, x.segment_offsets = cross;
  REFUSED(&x, "a layer's V half inside another layer's K half");
  CHECK(strstr(oi_last_error(), "arenas 'L0' and 'L1' overlap"));
  oi_arena_desc huge[2];
  memcpy(huge, a, sizeof huge);
  huge[0].num_blocks = huge[1].num_blocks = UINT64_MAX / 4096 + 2;
  x = o, x.arenas = huge;
  REFUSED(&x, "a segment run past the address space");
  CHECK(strstr(oi_last_error(), "spans more than the address space"));
  uint64_t same[4] = {0, 0, 0, 8 * 4096};
  x = o, x.segment_offsets = same;
  REFUSED(&x, "two segments at one offset");
  oi_arena_desc b[2];
  memcpy(b, a, sizeof b);
  b[0].block_stride = 4095;
  x = o, x.arenas = b;
  REFUSED(&x, "block_stride below bytes_per_block");
  /* Offset mode: every segment inside arena_size; exactly filling it. */
  b[0].block_stride = 4096;
  b[0].base = b[1].base = NULL;
  b[0].offset = 0;
  b[1].offset = 16 * 4096;
  x = o, x.arenas = b, x.arena_base = mem, x.arena_size = 32 * 4096;
  ACCEPTED(&x, "offset mode, exact fit");
  take_baseline(); /* an accepted layout binds its namespace */
  x.namespace_id = "v-seg";
  x.arena_size = 32 * 4096 - 1;
  REFUSED(&x, "the last V half one byte past arena_size");
  CHECK(strstr(oi_last_error(), "reaches past"));
  /* Interleaved halves: segment 1 of L0 sits in L1's gaps (stride 2 blocks). */
  a[0] = arena("L0", 0, 8, 4096, 8192);
  a[1] = arena("L1", 4096, 8, 4096, 8192);
  a[0].segments = a[1].segments = 2;
  uint64_t inter[4] = {0, 16 * 8192, 0, 16 * 8192};
  opts_for(&x, a, 2, NULL);
  x.segment_offsets = inter;
  x.num_segment_offsets = 4;
  ACCEPTED(&x, "two layers' halves interleaved block by block");
  take_baseline(); /* an accepted layout binds its namespace */
  x.namespace_id = "v-seg";
}

static void test_legal_edge_layouts_are_accepted(void) {
  oi_arena_desc a[40];
  oi_engine_options o;
  /* segments 8. */
  a[0] = arena("s8", 0, 4, 100, 1024);
  a[0].segments = 8;
  a[0].segment_stride = 128;
  opts_for(&o, a, 1, NULL);
  ACCEPTED(&o, "segments 8");
  /* segments 2, segment_stride == bytes_per_block, smallest block_stride. */
  a[0] = arena("kv", 0, 4, 100, 200);
  a[0].segments = 2;
  a[0].segment_stride = 100;
  opts_for(&o, a, 1, NULL);
  ACCEPTED(&o, "segment_stride == bytes_per_block, minimal stride");
  /* 36 arenas of 64 KiB at a 2.25 MiB stride (page-first). */
  static char names[36][8];
  for (int i = 0; i < 36; i++) {
    snprintf(names[i], sizeof names[i], "L%d", i);
    a[i] = arena(names[i], (uint64_t)i * (64 << 10), 4, 64 << 10, 36 * (64 << 10));
  }
  opts_for(&o, a, 36, NULL);
  ACCEPTED(&o, "page-first 36 x 64 KiB at 2.25 MiB");
  /* One arena living in the segment gap of another. */
  a[0] = arena("kv", 0, 8, 1000, 4000);
  a[0].segments = 2;
  a[0].segment_stride = 2000;
  a[1] = arena("b", 1000, 8, 1000, 4000);
  a[2] = arena("c", 3000, 8, 1000, 4000);
  opts_for(&o, a, 3, NULL);
  ACCEPTED(&o, "gap-interleaved");
  /* Different strides whose spans intersect but whose bytes never do. The
   * rule is "real byte overlap", but refusing this exotic case is a
   * conservative choice, not a hazard: reported, not failed. */
  a[0] = arena("x", 0, 8, 1000, 4000);
  a[1] = arena("y", 1000, 8, 500, 2000);
  opts_for(&o, a, 2, "v-note");
  oi_engine *e = NULL;
  if (oi_engine_create(host, &o, &e) != OI_OK)
    fprintf(stderr, "  note: arenas with different strides and disjoint bytes are refused (%s)\n",
            oi_last_error());
  oi_engine_destroy(e);
  /* Offset mode, exactly filling arena_size; arenas adjacent. */
  a[0] = arena("k", 0, 8, 4096, 4096);
  a[1] = arena("v", 0, 8, 4096, 4096);
  a[0].base = a[1].base = NULL;
  a[1].offset = 8 * 4096;
  opts_for(&o, a, 2, NULL);
  o.arena_base = mem;
  o.arena_size = 16 * 4096;
  ACCEPTED(&o, "offset mode, exact fit");
}

/* ---- save / query / load --------------------------------------------------- */

static void test_bad_saves_are_refused_and_save_nothing(void) {
  take_baseline();
  oi_block_hash fresh[2] = {etu_hash(500, 0), etu_hash(500, 1)};
  int64_t ids[2] = {4, 5};
  oi_ticket *t = NULL;
  CHECK_FAILS(oi_engine_save(eng, ids, fresh, 0, NULL, &t), OI_ERR_INVALID_ARGUMENT);
  CHECK_FAILS(oi_engine_save(eng, NULL, fresh, 2, NULL, &t), OI_ERR_INVALID_ARGUMENT);
  CHECK_FAILS(oi_engine_save(eng, ids, NULL, 2, NULL, &t), OI_ERR_INVALID_ARGUMENT);
  CHECK_FAILS(oi_engine_save(NULL, ids, fresh, 2, NULL, &t), OI_ERR_INVALID_ARGUMENT);
  const int64_t bad_ids[] = {-1, NB, NB + 1000, INT64_MIN, INT64_MAX};
  for (size_t i = 0; i < sizeof bad_ids / sizeof bad_ids[0]; i++) {
    int64_t mixed[2] = {4, bad_ids[i]}; /* a valid id first: it must not be saved either */
    CHECK_FAILS(oi_engine_save(eng, mixed, fresh, 2, NULL, &t), OI_ERR_INVALID_ARGUMENT);
  }
  oi_save_options so;
  CHECK_OK(oi_save_options_init(&so));
  so.struct_size = 0;
  CHECK_FAILS(oi_engine_save(eng, ids, fresh, 2, &so, &t), OI_ERR_INVALID_ARGUMENT);
  CHECK(t == NULL);
  CHECK_OK(oi_engine_flush(eng, UINT32_MAX));
  CHECK(etu_engine_stats(eng).saves_submitted == 4);
  UNCHANGED();
  uint8_t present[2] = {7, 7};
  CHECK(etu_membership(eng, fresh, 2, present) == 0);
}

/* The cpu backend has no device events: a save that asks to wait for one
 * (whole blocks, or a layer's arenas) is refused at submit and leaves
 * nothing visible; the layerwise one's blocks are failed, so their later
 * layers skip them and a flush returns; the same blocks save afterwards.
 * (A host and engine of its own: the other tests count this engine's
 * saves.) */
static void test_save_wait_event_is_unsupported_on_cpu(void) {
  etu_layout L2;
  etu_layout_simple(&L2, 3, 8, 2048);
  oi_host *h2 = etu_host_create(16 << 20);
  oi_engine *e2 = etu_engine_create(h2, &L2, "valid-events", 1);
  oi_block_hash fresh[2] = {etu_hash(600, 0), etu_hash(600, 1)};
  int64_t ids[2] = {6, 7};
  etu_fill_block(&L2, 6, 600, SEED);
  etu_fill_block(&L2, 7, 601, SEED);
  int fake_event = 0;
  for (int layer = 0; layer < 2; layer++) {
    oi_save_options so;
    CHECK_OK(oi_save_options_init(&so));
    so.wait_event = &fake_event;
    if (layer) so.arena_count = 1; /* arena 0 only: a layerwise save */
    oi_ticket *t = (oi_ticket *)1;
    CHECK_FAILS(oi_engine_save(e2, ids, fresh, 2, &so, &t), OI_ERR_UNSUPPORTED);
    CHECK(t == NULL);
    CHECK(strstr(oi_last_error(), "no device events") != NULL);
    if (layer) { /* the other layers arrive: the failed blocks skip them */
      so.wait_event = NULL;
      so.arena_first = 1;
      so.arena_count = 2;
      CHECK_OK(oi_engine_save(e2, ids, fresh, 2, &so, NULL));
    }
    CHECK_OK(oi_engine_flush(e2, 5000));
    uint8_t present[2] = {7, 7};
    CHECK(etu_membership(e2, fresh, 2, present) == 0);
  }
  CHECK_OK(etu_save_wait(e2, ids, fresh, 2));
  uint8_t present[2] = {0, 0};
  CHECK(etu_membership(e2, fresh, 2, present) == 2);
  oi_engine_destroy(e2);
  oi_host_destroy(h2);
  etu_layout_free(&L2);
}

static void test_bad_queries_are_refused(void) {
  take_baseline();
  oi_query_result q;
  memset(&q, 0, sizeof q);
  q.struct_size = sizeof q;
  CHECK_FAILS(oi_engine_query(NULL, NULL, saved, 4, 0, &q), OI_ERR_INVALID_ARGUMENT);
  CHECK_FAILS(oi_engine_query(eng, NULL, saved, 4, 0, NULL), OI_ERR_INVALID_ARGUMENT);
  CHECK_FAILS(oi_engine_query(eng, NULL, NULL, 4, 0, &q), OI_ERR_INVALID_ARGUMENT);
  q.struct_size = 0;
  CHECK_FAILS(oi_engine_query(eng, NULL, saved, 4, 0, &q), OI_ERR_INVALID_ARGUMENT);
  q.struct_size = sizeof q;
  q.present = NULL;
  CHECK_FAILS(oi_engine_query(eng, NULL, saved, 4, OI_QUERY_MEMBERSHIP, &q),
              OI_ERR_INVALID_ARGUMENT);
  UNCHANGED();
}

static void test_bad_loads_are_refused_before_any_copy(void) {
  oi_query_result q;
  CHECK_OK(etu_query(eng, NULL, saved, 4, &q));
  CHECK(q.hit_blocks == 4);
  take_baseline();
  int64_t dst[4] = {12, 13, 14, 15};
  int64_t dup[4] = {12, 13, 12, 15};
  CHECK_FAILS(oi_engine_load(eng, q.lease, dup, 4, NULL, NULL), OI_ERR_INVALID_ARGUMENT);
  UNCHANGED();
  const int64_t bad_ids[] = {-1, NB, INT64_MIN, INT64_MAX};
  for (size_t i = 0; i < sizeof bad_ids / sizeof bad_ids[0]; i++) {
    int64_t d[4] = {12, 13, 14, bad_ids[i]};
    CHECK_FAILS(oi_engine_load(eng, q.lease, d, 4, NULL, NULL), OI_ERR_INVALID_ARGUMENT);
    UNCHANGED();
  }
  CHECK_FAILS(oi_engine_load(eng, q.lease, NULL, 4, NULL, NULL), OI_ERR_INVALID_ARGUMENT);
  CHECK_FAILS(oi_engine_load(eng, q.lease, dst, 0, NULL, NULL), OI_ERR_INVALID_ARGUMENT);
  CHECK_FAILS(oi_engine_load(eng, q.lease, dst, 3, NULL, NULL), OI_ERR_INVALID_ARGUMENT);
  int64_t five[5] = {12, 13, 14, 15, 11};
  CHECK_FAILS(oi_engine_load(eng, q.lease, five, 5, NULL, NULL), OI_ERR_INVALID_ARGUMENT);
  oi_load_options lo;
  CHECK_OK(oi_load_options_init(&lo));
  lo.struct_size = 0;
  CHECK_FAILS(oi_engine_load(eng, q.lease, dst, 4, &lo, NULL), OI_ERR_INVALID_ARGUMENT);
  CHECK_OK(oi_load_options_init(&lo));
  lo.flags = 1u << 7; /* not a load flag */
  CHECK_FAILS(oi_engine_load(eng, q.lease, dst, 4, &lo, NULL), OI_ERR_INVALID_ARGUMENT);
  CHECK(strstr(oi_last_error(), "unknown flags") != NULL);
  CHECK_FAILS(oi_engine_load(NULL, q.lease, dst, 4, NULL, NULL), OI_ERR_INVALID_ARGUMENT);
  CHECK_FAILS(oi_engine_release(NULL, q.lease), OI_ERR_INVALID_ARGUMENT);
  UNCHANGED();
  /* None of the refusals consumed the lease's only share. A layered load
   * on the cpu backend is a plain load: same bytes, no arena events. */
  CHECK_OK(oi_load_options_init(&lo));
  lo.flags = OI_LOAD_ARENA_EVENTS;
  oi_ticket *t = NULL;
  CHECK_OK(oi_engine_load(eng, q.lease, dst, 4, &lo, &t));
  CHECK(t && oi_ticket_arena_event(t, 0) == NULL);
  CHECK(oi_ticket_arena_event(NULL, 0) == NULL);
  CHECK_OK(oi_ticket_wait(t, 10000));
  oi_ticket_release(t);
  for (int i = 0; i < 4; i++)
    CHECK(etu_block_matches(&L, dst[i], (uint64_t)i, SEED, "after refusals"));
  for (int i = 0; i < 4; i++)
    etu_zero_block(&L, dst[i]);
}

/* A repeated destination is refused, and named, by both ways of looking for
 * it: a bitmap of the arena's blocks (a call large against the arena) and a
 * sort (a few ids in a large arena). Nothing is loaded either way. */
static void test_repeated_destinations_are_named(void) {
  enum { BIG = 1000000, MANY = 20000 };
  oi_arena_desc a = arena("big", 0, BIG, 16, 16);
  oi_engine_options o;
  opts_for(&o, &a, 1, "v-repeat");
  oi_host_options ho = tr_host_options(4u << 20);
  ho.flags = OI_HOST_NO_PIN;
  oi_host *h2 = tr_host_new(&ho);
  oi_engine *e = tr_engine_new(h2, &o);
  oi_host_stats before = etu_host_stats(h2);
  int64_t few[4] = {BIG - 1, 5, BIG - 1, 7}; /* a sort: 4 ids, 15,625 bitmap words */
  oi_lease none;
  memset(&none, 0, sizeof none);
  CHECK_FAILS(oi_engine_load(e, none, few, 4, NULL, NULL), OI_ERR_INVALID_ARGUMENT);
  CHECK(strstr(oi_last_error(), "block id 999999 appears twice") != NULL);
  int64_t *many = malloc(MANY * sizeof *many); /* a bitmap: more ids than words */
  REQUIRE(many);
  for (int64_t i = 0; i < MANY; i++)
    many[i] = (i * 7919) % BIG;
  many[MANY - 1] = many[MANY / 2];
  CHECK_FAILS(oi_engine_load(e, none, many, MANY, NULL, NULL), OI_ERR_INVALID_ARGUMENT);
  char want[64];
  snprintf(want, sizeof want, "block id %lld appears twice", (long long)many[MANY / 2]);
  CHECK(strstr(oi_last_error(), want) != NULL);
  free(many);
  oi_host_stats after = etu_host_stats(h2);
  CHECK(after.loads_completed == before.loads_completed &&
        after.loads_failed == before.loads_failed && after.bytes_loaded == before.bytes_loaded);
  oi_engine_destroy(e);
  oi_host_destroy(h2);
}

/* Host lookups (no layout): their options and arguments. */
static void test_bad_host_lookups_are_refused(void) {
  take_baseline();
  oi_lookup_options lo;
  CHECK_FAILS(oi_lookup_options_init(NULL), OI_ERR_INVALID_ARGUMENT);
  REQUIRE(oi_lookup_options_init(&lo) == OI_OK);
  oi_query_result q;
  memset(&q, 0, sizeof q);
  q.struct_size = sizeof q;
  char long_name[258];
  memset(long_name, 'c', sizeof long_name - 1);
  long_name[sizeof long_name - 1] = '\0';
  CHECK_FAILS(oi_host_query(host, &lo, "r", saved, 4, 0, &q), OI_ERR_INVALID_ARGUMENT);
  CHECK(strstr(oi_last_error(), "namespace_id is empty"));
  lo.namespace_id = long_name;
  CHECK_FAILS(oi_host_query(host, &lo, "r", saved, 4, 0, &q), OI_ERR_INVALID_ARGUMENT);
  CHECK(strstr(oi_last_error(), "longer than 255 bytes"));
  lo.namespace_id = "v";
  lo.world_size = 0;
  CHECK_FAILS(oi_host_query(host, &lo, "r", saved, 4, 0, &q), OI_ERR_INVALID_ARGUMENT);
  lo.world_size = 1;
  lo.control_deadline_ms = 0;
  CHECK_FAILS(oi_host_query(host, &lo, "r", saved, 4, 0, &q), OI_ERR_INVALID_ARGUMENT);
  CHECK(strstr(oi_last_error(), "control_deadline_ms is 0"));
  lo.control_deadline_ms = 1000;
  lo.client_name = long_name;
  CHECK_FAILS(oi_host_query(host, &lo, "r", saved, 4, 0, &q), OI_ERR_INVALID_ARGUMENT);
  CHECK(strstr(oi_last_error(), "client_name is longer than 255 bytes"));
  lo.client_name = NULL;
  CHECK_FAILS(oi_host_query(host, NULL, "r", saved, 4, 0, &q), OI_ERR_INVALID_ARGUMENT);
  CHECK_FAILS(oi_host_query(NULL, &lo, "r", saved, 4, 0, &q), OI_ERR_INVALID_ARGUMENT);
  CHECK_FAILS(oi_host_release(NULL, "v", q.lease), OI_ERR_INVALID_ARGUMENT);
  CHECK_FAILS(oi_host_release(host, "", q.lease), OI_ERR_INVALID_ARGUMENT);
  CHECK_FAILS(oi_host_release(host, NULL, q.lease), OI_ERR_INVALID_ARGUMENT);
  UNCHANGED();
}

static void test_other_entry_points_refuse_null(void) {
  take_baseline();
  CHECK_FAILS(oi_engine_flush(NULL, 0), OI_ERR_INVALID_ARGUMENT);
  CHECK_FAILS(oi_engine_get_stats(eng, NULL), OI_ERR_INVALID_ARGUMENT);
  CHECK_FAILS(oi_engine_get_stats(NULL, &(oi_engine_stats){.struct_size = sizeof(oi_engine_stats)}),
              OI_ERR_INVALID_ARGUMENT);
  oi_engine_stats es;
  memset(&es, 0, sizeof es);
  CHECK_FAILS(oi_engine_get_stats(eng, &es), OI_ERR_INVALID_ARGUMENT); /* struct_size 0 */
  oi_host_stats hs;
  memset(&hs, 0, sizeof hs);
  CHECK_FAILS(oi_host_get_stats(host, &hs), OI_ERR_INVALID_ARGUMENT);
  CHECK_FAILS(oi_host_get_stats(host, NULL), OI_ERR_INVALID_ARGUMENT);
  hs.struct_size = sizeof hs;
  CHECK_FAILS(oi_host_get_stats(NULL, &hs), OI_ERR_INVALID_ARGUMENT);
  uint64_t n = 0;
  CHECK_FAILS(oi_host_evict_all(NULL, &n), OI_ERR_INVALID_ARGUMENT);
  oi_engine_destroy(NULL);
  UNCHANGED();
}

static void test_destroying_a_host_with_live_engines_is_refused(void) {
  /* Refused (logged), nothing freed: the engine keeps working. */
  oi_set_log_level(OI_LOG_OFF);
  oi_host_destroy(host);
  oi_set_log_level(OI_LOG_WARN);
  oi_query_result q;
  CHECK_OK(etu_query(eng, NULL, saved, 4, &q));
  CHECK(q.hit_blocks == 4);
  int64_t dst[4] = {8, 9, 10, 11};
  CHECK_OK(etu_load_wait(eng, q.lease, dst, 4));
  for (int i = 0; i < 4; i++)
    CHECK(etu_block_matches(&L, dst[i], (uint64_t)i, SEED, "host kept"));
  for (int i = 0; i < 4; i++)
    etu_zero_block(&L, dst[i]);
}

static void test_saved_data_survives_all_refusals(void) {
  oi_host_stats s = etu_host_stats(host);
  CHECK(s.blocks_sealed == 4);
  CHECK(s.saves_submitted == 4 && s.saves_completed == 4);
  CHECK(etu_accounting_ok(&s));
  oi_query_result q;
  CHECK_OK(etu_query(eng, NULL, saved, 4, &q));
  CHECK(q.hit_blocks == 4);
  int64_t dst[4] = {15, 14, 13, 12};
  CHECK_OK(etu_load_wait(eng, q.lease, dst, 4));
  for (int i = 0; i < 4; i++)
    CHECK(etu_block_matches(&L, dst[i], (uint64_t)i, SEED, "final"));
}

int main(void) {
  mem = calloc(1, MEM_BYTES);
  REQUIRE(mem);
  etu_layout_simple(&L, 3, NB, 2048);
  region_copy = malloc((size_t)L.region_bytes + 64);
  REQUIRE(region_copy);
  host = etu_host_create(64 << 20); /* 4 MiB chunks: room for 2.25 MiB blocks */
  eng = etu_engine_create(host, &L, "valid", 1);
  int64_t ids[4] = {0, 1, 2, 3};
  for (int i = 0; i < 4; i++) {
    saved[i] = etu_hash(400, (uint64_t)i);
    etu_fill_block(&L, i, (uint64_t)i, SEED);
  }
  REQUIRE(etu_save_wait(eng, ids, saved, 4) == OI_OK);
  REQUIRE(oi_engine_flush(eng, UINT32_MAX) == OI_OK);

  RUN_TEST(test_options_init_fills_documented_defaults);
  RUN_TEST(test_host_create_refuses_bad_options);
  RUN_TEST(test_a_pool_larger_than_memory_is_refused_at_once);
  RUN_TEST(test_bad_layouts_are_refused_and_bind_nothing);
  RUN_TEST(test_legal_edge_layouts_are_accepted);
  RUN_TEST(test_segment_offsets_are_validated);
  RUN_TEST(test_bad_saves_are_refused_and_save_nothing);
  RUN_TEST(test_save_wait_event_is_unsupported_on_cpu);
  RUN_TEST(test_bad_queries_are_refused);
  RUN_TEST(test_bad_host_lookups_are_refused);
  RUN_TEST(test_bad_loads_are_refused_before_any_copy);
  RUN_TEST(test_repeated_destinations_are_named);
  RUN_TEST(test_other_entry_points_refuse_null);
  RUN_TEST(test_destroying_a_host_with_live_engines_is_refused);
  RUN_TEST(test_saved_data_survives_all_refusals);

  oi_engine_destroy(eng);
  oi_host_destroy(host);
  etu_layout_free(&L);
  free(region_copy);
  free(mem);
  TEST_EXIT();
}
