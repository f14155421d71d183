/* The disk tier under a CUDA host: blocks saved from device memory through a
 * pinned pool are written behind to disk; after the pool is emptied
 * (evict_all) a query that waits (OI_QUERY_WAIT_PENDING) promotes them back
 * from disk, and a load into other device blocks is byte-exact. Then a new
 * host on the same directory (a restart) serves them again the same way.
 * Small on purpose (64 blocks of 256 KiB) so that it runs under
 * compute-sanitizer. Skips (77) without a GPU. */
#include <dirent.h>
#include <time.h>
#include <unistd.h>

#include "device/device.h"
#include "openinfer/disk.h"
#include "rig.h"
#include "testutil.h"

#define NB 64ull
#define BLOCK (256ull << 10)
#define REGION (2 * NB * BLOCK) /* blocks [0, NB) saved, [NB, 2 NB) loaded into */

static oi_dev *dev;

static uint8_t expected_byte(uint64_t block, uint64_t off) {
  return oi__pattern_byte(block * 1000003ull + 17, off);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static char *make_dir(void) {
  const char *base = getenv("TMPDIR");
  char tmpl[512];
  snprintf(tmpl, sizeof tmpl, "%s/oi-disk-cuda-XXXXXX", base && *base ? base : "/tmp");
  char *p = mkdtemp(tmpl);
  REQUIRE(p);
  return strdup(p);
}

static void remove_dir(char *dir) {
  DIR *dp = opendir(dir);
  if (dp) {
    struct dirent *de;
    while ((de = readdir(dp))) {
      if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
      char p[1024];
      snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
      unlink(p);
    }
    closedir(dp);
  }
  rmdir(dir);
  free(dir);
}

typedef struct rig {
  oi_host *h;
  oi_engine *e;
} rig;

static void rig_open(rig *r, const char *dir, uint8_t *region) {
  oi_host_options ho;
  oi_host_options_init(&ho);
  ho.device = 0; /* pinned pool */
  ho.pool_bytes = 64ull << 20;
  ho.chunk_bytes = 16ull << 20;
  r->h = tr_host_new(&ho);
  oi_host_disk_options d;
  oi_host_disk_options_init(&d);
  const char *dirs[1] = {dir};
  d.dirs = dirs;
  d.num_dirs = 1;
  d.capacity_bytes = 64ull << 20;
  REQUIRE(oi_host_attach_disk(r->h, &d) == OI_OK);
  oi_arena_desc ad = tr_arena("kv", NULL, 2 * NB, BLOCK);
  oi_engine_options eo;
  oi_engine_options_init(&eo);
  eo.device = 0;
  eo.namespace_id = "disk-cuda";
  eo.arenas = &ad;
  eo.num_arenas = 1;
  eo.arena_base = region;
  eo.arena_size = REGION;
  r->e = tr_engine_new(r->h, &eo);
}

static void rig_close(rig *r) {
  oi_engine_destroy(r->e);
  oi_host_destroy(r->h); /* writes what is still queued, closes the store */
  memset(r, 0, sizeof *r);
}

static oi_host_disk_stats disk_stats(rig *r) {
  oi_host_disk_stats s = {.struct_size = sizeof s};
  REQUIRE(oi_host_get_disk_stats(r->h, &s) == OI_OK);
  return s;
}

/* Zeroes the destination blocks on the device, queries with wait (every
 * block promoted from disk), loads them into [NB, 2 NB), copies the region
 * back and compares every byte. */
static void restore_and_check(rig *r, uint8_t *region, uint8_t *host, const oi_block_hash *hs,
                              const char *what) {
  memset(host + NB * BLOCK, 0, NB * BLOCK);
  REQUIRE(dev->ops->mem_copy(dev, region + NB * BLOCK, host + NB * BLOCK, NB * BLOCK) == OI_OK);
  oi_host_stats hst = {.struct_size = sizeof hst};
  CHECK_OK(oi_host_get_stats(r->h, &hst));
  CHECK(hst.blocks_sealed == 0); /* nothing in the pool: every hit comes from disk */
  uint64_t promoted0 = disk_stats(r).promotions;
  oi_query_result q = {.struct_size = sizeof q, .wait_ms = 60000};
  CHECK_OK(oi_engine_query(r->e, NULL, hs, NB, OI_QUERY_WAIT_PENDING, &q));
  CHECK(q.hit_blocks == NB);
  CHECK(disk_stats(r).promotions - promoted0 == NB);
  if (q.hit_blocks != NB) {
    if (q.hit_blocks) oi_engine_release(r->e, q.lease);
    return;
  }
  int64_t dst[NB];
  for (uint64_t b = 0; b < NB; b++)
    dst[b] = (int64_t)(2 * NB - 1 - b); /* reversed: a shifted or swapped block fails */
  oi_ticket *t = NULL;
  CHECK_OK(oi_engine_load(r->e, q.lease, dst, NB, NULL, &t));
  CHECK_OK(oi_ticket_wait(t, 60000));
  oi_ticket_release(t); /* (the load consumed the lease's only share) */
  CHECK_ST(oi_engine_release(r->e, q.lease), OI_ERR_LEASE_EXPIRED);
  REQUIRE(dev->ops->mem_copy(dev, host, region, REGION) == OI_OK);
  uint64_t bad = 0, src_bad = 0;
  for (uint64_t b = 0; b < NB; b++)
    for (uint64_t i = 0; i < BLOCK; i++) {
      bad += host[(uint64_t)dst[b] * BLOCK + i] != expected_byte(b, i);
      src_bad += host[b * BLOCK + i] != expected_byte(b, i);
    }
  CHECK(bad == 0);
  CHECK(src_bad == 0);
  oi_host_disk_stats s = disk_stats(r);
  CHECK(s.promote_failed == 0 && s.checksum_failures == 0);
  fprintf(stderr, "  %-34s %llu blocks from disk: %s\n", what, (unsigned long long)NB,
          bad || src_bad ? "MISMATCH" : "bytes match");
}

static void test_disk_round_trip_on_cuda(void) {
  uint8_t *region = NULL;
  REQUIRE(dev->ops->mem_alloc(dev, REGION, 0, (void **)&region) == OI_OK);
  uint8_t *host = calloc(1, REGION);
  REQUIRE(host);
  for (uint64_t b = 0; b < NB; b++)
    for (uint64_t i = 0; i < BLOCK; i++)
      host[b * BLOCK + i] = expected_byte(b, i);
  REQUIRE(dev->ops->mem_copy(dev, region, host, REGION) == OI_OK);
  oi_block_hash hs[NB];
  int64_t ids[NB];
  for (uint64_t b = 0; b < NB; b++) {
    hs[b] = tr_hash(b, 15, 0xD5);
    ids[b] = (int64_t)b;
  }
  char *dir = make_dir();
  rig r;
  rig_open(&r, dir, region);

  /* Save from device memory; the disk tier writes every block behind. */
  CHECK_OK(tr_save(r.e, ids, hs, NB, 60000));
  CHECK_OK(oi_engine_flush(r.e, 60000));
  double t0 = now_s();
  while (disk_stats(&r).spills < NB && now_s() - t0 < 60)
    usleep(2000);
  oi_host_disk_stats s = disk_stats(&r);
  CHECK(s.spills == NB && s.blocks == NB);
  CHECK(s.spills_failed == 0 && s.spills_skipped == 0 && s.spill_overflow == 0);

  /* Empty the pool: the blocks now live on disk only. */
  uint64_t evicted = 0;
  CHECK_OK(oi_host_evict_all(r.h, &evicted));
  CHECK(evicted == NB);
  restore_and_check(&r, region, host, hs, "promoted after evict_all");
  /* Promoted blocks are not written again. */
  CHECK(disk_stats(&r).spills == NB);
  rig_close(&r);

  /* A restart: a new host on the same directory finds the blocks. */
  rig_open(&r, dir, region);
  s = disk_stats(&r);
  CHECK(s.blocks == NB && s.torn_records_cut == 0);
  restore_and_check(&r, region, host, hs, "promoted after a restart");
  rig_close(&r);

  remove_dir(dir);
  dev->ops->mem_free(dev, region);
  free(host);
}

int main(void) {
  int n = 0;
  oi_device_count(&n);
  if (n == 0) TEST_SKIP("no CUDA device");
  REQUIRE(oi__dev_open(0, &dev) == OI_OK);
  RUN_TEST(test_disk_round_trip_on_cuda);
  oi__dev_close(dev);
  TEST_EXIT();
}
