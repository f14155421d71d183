/* Codec namespaces on the cuda backend (docs/codecs.md): the committed
 * real-KV corpus (argv[1]: kv.bin, 12,288-byte pages) in a device arena,
 * saved and loaded through each codec in every copy mode (kernel, DMA,
 * staged, and a layered load, which a codec lands whole), copied back and
 * compared with the codec's own round trip of each page (lossless: the page
 * itself). Loads decode on the device (the frames cross the link,
 * kernels/codec.cu decodes) and, with OI_CODEC_DECODE=host, on the host (a
 * pinned bounce group decoded in the stream's host functions); the rates
 * printed (logical bytes, the same run's codec "none" beside them) say what
 * each costs. Frames damaged in the pool fail their load on the device
 * path, their blocks landing as zeros. Skips (77) without a GPU. */
#include <time.h>

#include "../codec/codec_testutil.h"
#include "codec/codec.h"
#include "device/device.h"
#include "host/host_private.h"
#include "rig.h"
#include "testutil.h"

#define PAGE CORPUS_PAGE_BYTES
static const char *const CODECS[OI_CODEC_COUNT] = {"none", "lossless", "int8", "fp8",
                                                   "int8-hadamard"};

static oi_dev *dev;
static uint8_t *corpus;
static size_t npages;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void run(int codec, uint32_t mode, bool layered, bool host_decode) {
  setenv("OI_CODEC_DECODE", host_decode ? "host" : "device", 1);
  size_t n = npages;
  uint64_t bytes = 2 * n * PAGE;
  uint8_t *region = NULL;
  REQUIRE(dev->ops->mem_alloc(dev, bytes, 0, (void **)&region) == OI_OK);
  uint8_t *host = calloc(1, bytes);
  REQUIRE(host);
  memcpy(host, corpus, n * PAGE);
  REQUIRE(dev->ops->mem_copy(dev, region, host, bytes) == OI_OK);
  oi_host_options ho = tr_host_options(64ull << 20);
  ho.device = 0;
  oi_host *h = tr_host_new(&ho);
  oi_arena_desc ad = tr_arena("kv", NULL, 2 * n, PAGE);
  oi_engine_options eo = tr_engine_options("codec", &ad, 1);
  eo.device = 0;
  eo.arena_base = region;
  eo.arena_size = bytes;
  eo.copy_mode = mode;
  eo.codec = CODECS[codec];
  if (codec >= OI_CODEC_INT8) {
    eo.codec_tokens = 16;
    eo.codec_heads = 3;
    eo.codec_head_dim = 64;
  }
  oi_engine *e = tr_engine_new(h, &eo);
  int64_t *ids = calloc(n, sizeof *ids), *dst = calloc(n, sizeof *dst);
  oi_block_hash *hs = calloc(n, sizeof *hs);
  REQUIRE(ids && dst && hs);
  for (size_t b = 0; b < n; b++) {
    ids[b] = (int64_t)b;
    dst[b] = (int64_t)(2 * n - 1 - b);
    hs[b] = tr_hash(b, 15, (uint8_t)(0x30 + codec));
  }
  double t0 = now_s();
  CHECK_OK(tr_save(e, ids, hs, n, 60000));
  double t_save = now_s() - t0;
  oi_query_result q;
  CHECK_OK(tr_query(e, "r", hs, n, 0, NULL, &q));
  CHECK(q.hit_blocks == n);
  oi_load_options lo;
  oi_load_options_init(&lo);
  if (layered) lo.flags = OI_LOAD_ARENA_EVENTS;
  oi_ticket *t = NULL;
  t0 = now_s();
  CHECK_OK(oi_engine_load(e, q.lease, dst, n, &lo, &t));
  if (layered && t) CHECK_OK(oi_ticket_arena_wait(t, 0, 60000));
  CHECK_OK(tr_wait(t, 60000));
  double t_load = now_s() - t0;
  REQUIRE(dev->ops->mem_copy(dev, host, region, bytes) == OI_OK);
  size_t bad = 0;
  uint8_t want[PAGE];
  for (size_t b = 0; b < n; b++) {
    ct_expected_of(codec, corpus + b * PAGE, want);
    bad += memcmp(host + (2 * n - 1 - b) * PAGE, want, PAGE) != 0;
  }
  CHECK(bad == 0);
  oi_host_namespace_stats s = {.struct_size = sizeof s};
  CHECK_OK(oi_host_get_namespace_stats(h, 0, &s));
  printf("%-8s mode %u%s, decode on the %s: %zu pages, %zu differ; save %.3f GB/s, load %.3f "
         "GB/s (logical), pool ratio %.3f\n",
         CODECS[codec], mode, layered ? " layered" : "", host_decode ? "host" : "device", n, bad,
         n * PAGE / t_save / 1e9, n * PAGE / t_load / 1e9,
         (double)s.logical_bytes / (double)s.physical_bytes);
  oi_engine_destroy(e);
  oi_host_destroy(h);
  dev->ops->mem_free(dev, region);
  free(host);
  free(ids);
  free(dst);
  free(hs);
}

/* The pool slot of a sealed block (its shard locked while looked up). */
static uint8_t *slot_of(oi_host *h, const char *nsname, const oi_block_hash *hash) {
  oi_host_ns ns;
  REQUIRE(oi__host_find_namespace(h, nsname, &ns));
  index_shard *sh = oi__index_shard(h, ns.id, hash);
  pthread_mutex_lock(&sh->lock);
  host_block *b = oi__index_find_locked(sh, ns.id, hash);
  REQUIRE(b);
  uint8_t *frame = oi__block_data(h, b);
  pthread_mutex_unlock(&sh->lock);
  return frame;
}

/* Frames damaged in the pool after their save, decoded on the device: the
 * load fails (OI_ERR_PROTOCOL, saying which block and why), the damaged
 * blocks land as zeros, the others byte-exact. Lossless: a stream's first
 * state zeroed; int8: a scale made infinite. */
static void test_damaged_on_device(int codec) {
  setenv("OI_CODEC_DECODE", "device", 1);
  enum { N = 8 };
  uint64_t bytes = 2 * N * PAGE;
  uint8_t *region = NULL, *host = calloc(1, bytes);
  REQUIRE(host && dev->ops->mem_alloc(dev, bytes, 0, (void **)&region) == OI_OK);
  memcpy(host, corpus, N * PAGE);
  memset(host + N * PAGE, 0x77, N * PAGE);
  REQUIRE(dev->ops->mem_copy(dev, region, host, bytes) == OI_OK);
  oi_host_options ho = tr_host_options(16ull << 20);
  ho.device = 0;
  oi_host *h = tr_host_new(&ho);
  oi_arena_desc ad = tr_arena("kv", NULL, 2 * N, PAGE);
  oi_engine_options eo = tr_engine_options("damaged", &ad, 1);
  eo.device = 0;
  eo.arena_base = region;
  eo.arena_size = bytes;
  eo.codec = CODECS[codec];
  if (codec >= OI_CODEC_INT8) {
    eo.codec_tokens = 16;
    eo.codec_heads = 3;
    eo.codec_head_dim = 64;
  }
  oi_engine *e = tr_engine_new(h, &eo);
  int64_t ids[N], dst[N];
  oi_block_hash hs[N];
  for (int b = 0; b < N; b++) {
    ids[b] = b;
    dst[b] = N + b;
    hs[b] = tr_hash((uint64_t)b, 13, (uint8_t)(0x60 + codec));
  }
  CHECK_OK(tr_save(e, ids, hs, N, 60000));
  uint8_t *f = slot_of(h, "damaged", &hs[3]);
  oi_codec_info in;
  oi_codec_piece pc[8];
  size_t k = 0;
  REQUIRE(oi__codec_pieces(f, eo.codec_slot_bytes ? eo.codec_slot_bytes : 40 + 2 * PAGE, false, &in,
                           pc, 8, &k) == OI_OK);
  if (codec == OI_CODEC_LOSSLESS) {
    uint8_t *st = f + pc[0].src;
    size_t t = 2;
    for (int sym = st[0]; sym <= st[1]; sym++)
      while (st[t++] & 0x80) {
      }
    memset(st + t, 0, 4);
  } else {
    f[pc[0].src + 2 * 7] = 0x00, f[pc[0].src + 2 * 7 + 1] = 0x7c;
  }
  oi_query_result q;
  CHECK_OK(tr_query(e, "r", hs, N, 0, NULL, &q));
  CHECK(q.hit_blocks == N);
  oi_ticket *t = NULL;
  CHECK_OK(oi_engine_load(e, q.lease, dst, N, NULL, &t));
  oi_status st = tr_wait(t, 60000);
  CHECK(st == OI_ERR_PROTOCOL && strstr(oi_last_error(), "did not decode on the device") &&
        strstr(oi_last_error(), "block 3"));
  if (st != OI_ERR_PROTOCOL) fprintf(stderr, "damaged %s: %s\n", CODECS[codec], oi_last_error());
  REQUIRE(dev->ops->mem_copy(dev, host, region, bytes) == OI_OK);
  uint8_t want[PAGE], zeros[PAGE] = {0};
  size_t wrong = 0;
  for (int b = 0; b < N; b++) {
    if (b == 3) {
      wrong += memcmp(host + (N + b) * PAGE, zeros, PAGE) != 0;
      continue;
    }
    ct_expected_of(codec, corpus + b * PAGE, want);
    wrong += memcmp(host + (N + b) * PAGE, want, PAGE) != 0;
  }
  printf("%-8s a damaged frame decoded on the device: load %s, %zu of %d blocks wrong\n",
         CODECS[codec], oi_status_str(st), wrong, N);
  CHECK(wrong == 0);
  CHECK(tr_engine_stats(e).loads_failed == 1);
  oi_engine_destroy(e);
  oi_host_destroy(h);
  dev->ops->mem_free(dev, region);
  free(host);
}

int main(int argc, char **argv) {
  int ndev = 0;
  oi_device_count(&ndev);
  if (ndev == 0) TEST_SKIP("no CUDA device");
  REQUIRE(argc >= 2);
  size_t len = 0;
  corpus = ct_read_file(argv[1], &len);
  REQUIRE(corpus && len % PAGE == 0);
  npages = len / PAGE;
  REQUIRE(oi__dev_open(0, &dev) == OI_OK);
  for (int host_decode = 0; host_decode < 2; host_decode++)
    for (int c = 0; c < OI_CODEC_COUNT; c++) {
      if (c == OI_CODEC_NONE && host_decode) continue; /* no codec: nothing to decode */
      run(c, OI_COPY_KERNEL, false, host_decode);
      run(c, OI_COPY_DMA, false, host_decode);
      run(c, OI_COPY_STAGED, false, host_decode);
      run(c, OI_COPY_AUTO, true, host_decode);
    }
  test_damaged_on_device(OI_CODEC_LOSSLESS);
  test_damaged_on_device(OI_CODEC_INT8);
  test_damaged_on_device(OI_CODEC_INT8_HADAMARD);
  oi__dev_close(dev);
  free(corpus);
  fprintf(stderr, "%-60s %s\n", "test_codec_namespaces_on_cuda",
          oi_test_failures ? "FAILED" : "ok");
  TEST_EXIT();
}
