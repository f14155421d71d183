/* Codec namespaces on the cuda backend (docs/codecs.md): the committed
 * real-KV corpus (argv[1]: kv.bin, 12,288-byte pages) in a device arena,
 * saved and loaded through each codec in every copy mode (kernel, DMA,
 * staged, and a layered load, which a codec lands whole), copied back and
 * compared with the codec's own round trip of each page (lossless: the page
 * itself). A host codec on a GPU runs in the streams' host functions between
 * the copies and a pinned bounce group; the rates printed (logical bytes, the
 * same run's codec "none" beside them) say what that costs. Skips (77)
 * without a GPU. */
#include <time.h>

#include "../codec/codec_testutil.h"
#include "codec/codec.h"
#include "device/device.h"
#include "rig.h"
#include "testutil.h"

#define PAGE CORPUS_PAGE_BYTES
static const char *const CODECS[4] = {"none", "lossless", "int8", "fp8"};

static oi_dev *dev;
static uint8_t *corpus;
static size_t npages;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void run(int codec, uint32_t mode, bool layered) {
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
  printf("%-8s mode %u%s: %zu pages, %zu differ; save %.3f GB/s, load %.3f GB/s (logical), "
         "pool ratio %.3f\n",
         CODECS[codec], mode, layered ? " layered" : "", n, bad, n * PAGE / t_save / 1e9,
         n * PAGE / t_load / 1e9, (double)s.logical_bytes / (double)s.physical_bytes);
  oi_engine_destroy(e);
  oi_host_destroy(h);
  dev->ops->mem_free(dev, region);
  free(host);
  free(ids);
  free(dst);
  free(hs);
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
  for (int c = 0; c < 4; c++) {
    run(c, OI_COPY_KERNEL, false);
    run(c, OI_COPY_DMA, false);
    run(c, OI_COPY_STAGED, false);
    run(c, OI_COPY_AUTO, true);
  }
  oi__dev_close(dev);
  free(corpus);
  fprintf(stderr, "%-60s %s\n", "test_codec_namespaces_on_cuda",
          oi_test_failures ? "FAILED" : "ok");
  TEST_EXIT();
}
