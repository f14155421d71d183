/* Four threads write, read, pin and remove blocks of a store far smaller
 * than what they write, so eviction runs all the time. Every successful read
 * is checked byte for byte (a block's bytes follow from its key); a read may
 * miss (evicted, removed) but never return other bytes or fail a checksum.
 * A reopen at the end serves every block left, byte-exact. */
#include "disk_util.h"

#define THREADS 4
#define OPS 1500
#define KEYS 200

typedef struct worker {
  oi_disk *d;
  uint64_t id;
  unsigned seed;
  uint64_t reads_ok, misses, writes_ok, busy, bad;
} worker;

static uint64_t rnd(unsigned *s) {
  *s = *s * 1103515245u + 12345u;
  return (*s >> 8) & 0xffffff;
}

static void *work(void *arg) {
  worker *w = arg;
  for (int op = 0; op < OPS; op++) {
    uint64_t i = rnd(&w->seed) % KEYS, what = rnd(&w->seed) % 10;
    /* Pins and removes only on this thread's own keys (i % THREADS == id),
     * so that no other thread removes a block it pinned: a pinned block
     * must then survive every eviction until it is unpinned. */
    if (what >= 8) i = i - i % THREADS + w->id;
    oi_tier_key k = dt_key(i);
    if (what < 4) {
      oi_status st = dt_write(w->d, i);
      if (st == OI_OK)
        w->writes_ok++;
      else if (st == OI_ERR_BUSY || st == OI_ERR_OUT_OF_MEMORY)
        w->busy++;
      else {
        fprintf(stderr, "write %llu: %s\n", (unsigned long long)i, oi_status_str(st));
        w->bad++;
      }
    } else if (what < 8) {
      oi_status st = dt_read(w->d, i);
      if (st == OI_OK)
        w->reads_ok++;
      else if (st == OI_ERR_NOT_FOUND)
        w->misses++;
      else {
        fprintf(stderr, "read %llu: %s\n", (unsigned long long)i, oi_status_str(st));
        w->bad++;
      }
    } else if (what == 8) {
      if (oi__disk_pin(w->d, &k) == OI_OK) {
        oi_status st = dt_read(w->d, i); /* pinned: stays through the read */
        if (st != OI_OK) {
          fprintf(stderr, "pinned read %llu: %s\n", (unsigned long long)i, oi_status_str(st));
          w->bad++;
        }
        st = oi__disk_unpin(w->d, &k);
        if (st != OI_OK) {
          fprintf(stderr, "unpin %llu: %s\n", (unsigned long long)i, oi_status_str(st));
          w->bad++;
        }
      }
    } else {
      oi_status st = oi__disk_remove(w->d, &k);
      if (st != OI_OK && st != OI_ERR_NOT_FOUND) {
        fprintf(stderr, "remove %llu: %s\n", (unsigned long long)i, oi_status_str(st));
        w->bad++;
      }
    }
  }
  return NULL;
}

static uint64_t g_checked;
static oi_disk *g_d;

static void check_one(void *ctx, const oi_tier_key *key, uint64_t len) {
  uint64_t *keys = ctx;
  for (uint64_t i = 0; i < KEYS; i++) {
    oi_tier_key k = dt_key(i);
    if (!memcmp(&k, key, sizeof k)) {
      keys[g_checked++] = i;
      if (len != dt_len(i)) keys[KEYS] = 1;
      return;
    }
  }
  keys[KEYS] = 1; /* a key nobody wrote */
}

static void test_concurrent(void) {
  char *a = dt_mkdtemp(), *b = dt_mkdtemp();
  const char *dirs[] = {a, b};
  /* About 60 of the 200 keys' blocks fit. */
  oi_disk_options o = {.dirs = dirs,
                       .num_dirs = 2,
                       .capacity_bytes = 1 * MiB,
                       .queue_depth = 8,
                       .checkpoint_every = 100};
  REQUIRE(oi__disk_open(&o, &g_d) == OI_OK);
  worker w[THREADS];
  pthread_t t[THREADS];
  for (int i = 0; i < THREADS; i++) {
    w[i] = (worker){.d = g_d, .id = (uint64_t)i, .seed = 17u + (unsigned)i * 7919u};
    REQUIRE(pthread_create(&t[i], NULL, work, &w[i]) == 0);
  }
  uint64_t reads = 0, writes = 0, bad = 0;
  for (int i = 0; i < THREADS; i++) {
    pthread_join(t[i], NULL);
    reads += w[i].reads_ok;
    writes += w[i].writes_ok;
    bad += w[i].bad;
  }
  oi_disk_stats s = dt_stats(g_d);
  fprintf(stderr, "  %llu reads served, %llu writes, %llu evictions, %llu checkpoints\n",
          (unsigned long long)reads, (unsigned long long)writes, (unsigned long long)s.evictions,
          (unsigned long long)s.checkpoints);
  CHECK(bad == 0);
  CHECK(reads > 100 && writes > 100);
  CHECK(s.evictions > 0);
  CHECK(s.checksum_failures == 0 && s.reads_failed == 0);
  CHECK(s.bytes_used <= s.capacity_bytes);
  uint64_t blocks = s.blocks;
  oi__disk_close(g_d);

  /* Reopen: every block left is served byte-exact. */
  REQUIRE(oi__disk_open(&o, &g_d) == OI_OK);
  s = dt_stats(g_d);
  CHECK(s.blocks == blocks);
  CHECK(s.torn_records_cut == 0 && s.bad_extents_dropped == 0);
  uint64_t keys[KEYS + 1] = {0};
  g_checked = 0;
  oi__disk_foreach(g_d, check_one, keys);
  CHECK(keys[KEYS] == 0);
  CHECK(g_checked == blocks);
  for (uint64_t j = 0; j < g_checked; j++)
    CHECK_OK(dt_read(g_d, keys[j]));
  oi__disk_close(g_d);
  dt_rmtree(a);
  dt_rmtree(b);
}

int main(void) {
  oi_set_log_level(OI_LOG_ERROR);
  RUN_TEST(test_concurrent);
  TEST_EXIT();
}
