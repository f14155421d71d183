/* Ranks on GPUs sharing one host pool (the multi-GPU deployment, with as many
 * GPUs as this machine has: rank r runs on device r % count). Every rank
 * saves its own blocks concurrently, then every rank restores every other
 * rank's blocks, byte-exact, for all pairs. Prints the aggregate bandwidth.
 * Skips (77) without a GPU. OI_TEST_RANKS sets the rank count (default 8). */
#include <pthread.h>

#include "device/device.h"
#include "rig.h"
#include "testutil.h"

enum { BLOCKS_PER_RANK = 16, ARENAS = 4, BPB = 256 << 10 };

typedef struct rank {
  int id, device, nranks;
  oi_dev *dev;
  uint8_t *arena; /* ARENAS x (nranks*BLOCKS_PER_RANK + BLOCKS_PER_RANK) blocks */
  uint64_t nblocks;
  oi_engine *e;
  uint64_t bad;
  oi_status err;
  uint64_t bytes_loaded, load_ns;
} rank;

static oi_block_hash hash_of(int owner, int i) {
  oi_block_hash h;
  memset(&h, 0, sizeof h);
  h.bytes[0] = (uint8_t)owner;
  h.bytes[1] = (uint8_t)i;
  h.bytes[15] = 0x77;
  return h;
}

static uint64_t seed_of(int owner, int i, int a) {
  return (uint64_t)owner * 100003 + (uint64_t)i * 131 + (uint64_t)a + 1;
}

static void *save_main(void *arg) {
  rank *r = arg;
  int64_t ids[BLOCKS_PER_RANK];
  oi_block_hash hs[BLOCKS_PER_RANK];
  for (int i = 0; i < BLOCKS_PER_RANK; i++) {
    ids[i] = i;
    hs[i] = hash_of(r->id, i);
    for (int a = 0; a < ARENAS; a++)
      r->dev->ops->mem_fill_pattern(r->dev,
                                    r->arena + ((uint64_t)a * r->nblocks + (uint64_t)i) * BPB, BPB,
                                    seed_of(r->id, i, a));
  }
  oi_ticket *t = NULL;
  r->err = oi_engine_save(r->e, ids, hs, BLOCKS_PER_RANK, NULL, &t);
  if (r->err == OI_OK) r->err = oi_ticket_wait(t, 60000);
  oi_ticket_release(t);
  if (r->err == OI_OK) r->err = oi_engine_flush(r->e, 60000);
  return NULL;
}

static void *restore_main(void *arg) {
  rank *r = arg;
  uint8_t *host = malloc(BPB), *expect = malloc(BPB);
  for (int owner = 0; owner < r->nranks && r->err == OI_OK; owner++) {
    oi_block_hash hs[BLOCKS_PER_RANK];
    int64_t dst[BLOCKS_PER_RANK];
    for (int i = 0; i < BLOCKS_PER_RANK; i++) {
      hs[i] = hash_of(owner, i);
      dst[i] = (int64_t)(BLOCKS_PER_RANK + owner * BLOCKS_PER_RANK + (BLOCKS_PER_RANK - 1 - i));
    }
    oi_query_result q = {.struct_size = sizeof q};
    r->err = oi_engine_query(r->e, "pairs", hs, BLOCKS_PER_RANK, 0, &q);
    if (r->err != OI_OK || q.hit_blocks != BLOCKS_PER_RANK) {
      if (r->err == OI_OK) r->err = OI_ERR_NOT_FOUND;
      break;
    }
    oi_ticket *t = NULL;
    uint64_t t0 = oi__now_ns();
    r->err = oi_engine_load(r->e, q.lease, dst, BLOCKS_PER_RANK, NULL, &t);
    if (r->err == OI_OK) r->err = oi_ticket_wait(t, 60000);
    r->load_ns += oi__now_ns() - t0;
    r->bytes_loaded += (uint64_t)BLOCKS_PER_RANK * ARENAS * BPB;
    oi_ticket_release(t);
    for (int i = 0; i < BLOCKS_PER_RANK && r->err == OI_OK; i++)
      for (int a = 0; a < ARENAS; a++) {
        r->dev->ops->mem_copy(r->dev, host,
                              r->arena + ((uint64_t)a * r->nblocks + (uint64_t)dst[i]) * BPB, BPB);
        for (uint64_t k = 0; k < BPB; k++)
          expect[k] = oi__pattern_byte(seed_of(owner, i, a), k);
        r->bad += memcmp(host, expect, BPB) != 0;
      }
  }
  free(host);
  free(expect);
  return NULL;
}

int main(void) {
  int ndev = 0;
  oi_device_count(&ndev);
  if (ndev == 0) TEST_SKIP("no CUDA device");
  const char *env = getenv("OI_TEST_RANKS");
  int nranks = env ? atoi(env) : 8;
  if (nranks < 1 || nranks > 64) nranks = 8;
  oi_host_options ho;
  oi_host_options_init(&ho);
  ho.device = 0;
  ho.pool_bytes = (uint64_t)nranks * BLOCKS_PER_RANK * ARENAS * BPB * 2;
  ho.chunk_bytes = 16ull << 20;
  oi_host *h = tr_host_new(&ho);
  rank *ranks = calloc((size_t)nranks, sizeof *ranks);
  REQUIRE(ranks);
  for (int i = 0; i < nranks; i++) {
    rank *r = &ranks[i];
    r->id = i;
    r->nranks = nranks;
    r->device = i % ndev;
    r->nblocks = (uint64_t)BLOCKS_PER_RANK * (nranks + 1);
    REQUIRE(oi__dev_open(r->device, &r->dev) == OI_OK);
    REQUIRE(r->dev->ops->mem_alloc(r->dev, ARENAS * r->nblocks * BPB, 0, (void **)&r->arena) ==
            OI_OK);
    oi_arena_desc ad[ARENAS];
    char names[ARENAS][8];
    for (int a = 0; a < ARENAS; a++) {
      snprintf(names[a], sizeof names[a], "L%d", a);
      ad[a] = tr_arena(names[a], r->arena + (uint64_t)a * r->nblocks * BPB, r->nblocks, BPB);
    }
    oi_engine_options eo;
    oi_engine_options_init(&eo);
    eo.device = r->device;
    eo.namespace_id = "shared-model";
    eo.arenas = ad;
    eo.num_arenas = ARENAS;
    r->e = tr_engine_new(h, &eo);
  }
  pthread_t th[64];
  for (int i = 0; i < nranks; i++)
    pthread_create(&th[i], NULL, save_main, &ranks[i]);
  for (int i = 0; i < nranks; i++)
    pthread_join(th[i], NULL);
  uint64_t t0 = oi__now_ns();
  for (int i = 0; i < nranks; i++)
    pthread_create(&th[i], NULL, restore_main, &ranks[i]);
  for (int i = 0; i < nranks; i++)
    pthread_join(th[i], NULL);
  uint64_t wall = oi__now_ns() - t0, bytes = 0, bad = 0;
  for (int i = 0; i < nranks; i++) {
    CHECK_OK(ranks[i].err);
    bad += ranks[i].bad;
    bytes += ranks[i].bytes_loaded;
  }
  CHECK(bad == 0);
  fprintf(stderr,
          "  %d ranks on %d GPU(s): %d x %d pairs restored, %llu slices differ; %.1f GB/s "
          "aggregate restores\n",
          nranks, ndev, nranks, nranks, (unsigned long long)bad, (double)bytes / (double)wall);
  for (int i = 0; i < nranks; i++) {
    oi_engine_destroy(ranks[i].e);
    ranks[i].dev->ops->mem_free(ranks[i].dev, ranks[i].arena);
    oi__dev_close(ranks[i].dev);
  }
  oi_host_destroy(h);
  free(ranks);
  fprintf(stderr, "%-60s %s\n", "test_any_rank_restores_what_any_rank_saved",
          oi_test_failures ? "FAILED" : "ok");
  TEST_EXIT();
}
