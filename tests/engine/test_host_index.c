/* The host index's open-addressing tables under the hashes that stress
 * them: names crafted to land in one shard with one tag (a long run of equal
 * tags that must be told apart by their records), runs that wrap around the
 * table's end, names whose whole key is equal, growth in the middle of a
 * cluster, and removals (aborted saves, evictions) from inside runs. A
 * reference model says what every lookup must find, after every round. */
#include <stdlib.h>
#include <string.h>

#include "host/host_private.h"
#include "rig.h"
#include "testutil.h"

#define BLOCK_BYTES 256u
#define POOL_BYTES (64u << 20)
#define SHARD 5ull

/* The inverse of a multiplication by an odd constant mod 2^64. */
static uint64_t inv_mul(uint64_t a) {
  uint64_t x = a; /* Newton: each step doubles the correct low bits */
  for (int i = 0; i < 6; i++)
    x *= 2 - a * x;
  return x;
}

/* A name (in namespace ns) whose index key is `key`; `salt` picks one of the
 * many names with that key. oi__index_key run backwards: the second word
 * is chosen, the first follows. */
static oi_block_hash name_with_key(uint32_t ns, uint64_t key, uint64_t salt) {
  uint64_t x = key;
  x ^= x >> 33;
  x *= inv_mul(0xC4CEB9FE1A85EC53ull);
  uint64_t b = salt * 0x9E3779B97F4A7C15ull + 1;
  x ^= b;
  x ^= x >> 33;
  x *= inv_mul(0xFF51AFD7ED558CCDull);
  x ^= x >> 33;
  uint64_t a = x ^ ((uint64_t)ns * 0xC2B2AE3D27D4EB4Full);
  oi_block_hash h;
  memcpy(h.bytes, &a, 8);
  memcpy(h.bytes + 8, &b, 8);
  return h;
}

/* Names whose two words are related (a = b * c + 1) spread over distinct
 * keys: such a pattern once cancelled into a handful of keys. */
static int cmp_u64(const void *p, const void *q) {
  uint64_t x = *(const uint64_t *)p, y = *(const uint64_t *)q;
  return (x > y) - (x < y);
}

static void test_related_words_spread(void) {
  enum { N = 32768 };
  uint64_t *keys = malloc(N * sizeof *keys);
  REQUIRE(keys);
  for (uint64_t i = 0; i < N; i++) {
    oi_block_hash h;
    uint64_t a = i * 0x9E3779B97F4A7C15ull + 1;
    memcpy(h.bytes, &a, 8);
    memcpy(h.bytes + 8, &i, 8);
    keys[i] = oi__index_key(1, &h);
  }
  qsort(keys, N, sizeof *keys, cmp_u64);
  size_t distinct = 1;
  for (size_t i = 1; i < N; i++)
    distinct += keys[i] != keys[i - 1];
  CHECK(distinct == N);
  free(keys);
}

static uint64_t rng_state = 0x1D3A5EEDull;
static uint64_t rnd(void) {
  uint64_t x = (rng_state += 0x9E3779B97F4A7C15ull);
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

typedef struct sink_ctx {
  host_block **blocks; /* by position in the call */
} sink_ctx;

static void on_accepted(void *ctx, const size_t *idx, host_block *const *blocks,
                        uint8_t *const *data, size_t k) {
  (void)data;
  for (size_t j = 0; j < k; j++)
    ((sink_ctx *)ctx)->blocks[idx[j]] = blocks[j];
}

enum { N_TAG_HI = 300, N_TAG_LO = 300, N_SAME_KEY = 50, N_RANDOM = 3000 };
#define N_NAMES (N_TAG_HI + N_TAG_LO + N_SAME_KEY + N_RANDOM)

static oi_block_hash names[N_NAMES];
static bool model[N_NAMES];

/* Every name is found exactly when the model says so. */
static void check_model(oi_host *h, oi_host_ns ns, const char *when) {
  static uint8_t present[N_NAMES];
  uint64_t hits = 0, want = 0;
  oi__host_membership(h, ns, names, N_NAMES, present, &hits, NULL);
  int wrong = 0;
  for (size_t i = 0; i < N_NAMES; i++) {
    want += model[i];
    if ((bool)present[i] != model[i] && wrong++ < 5)
      fprintf(stderr, "%s: name %zu is %s, the model says %s\n", when, i,
              present[i] ? "found" : "missing", model[i] ? "present" : "absent");
  }
  CHECK(wrong == 0);
  CHECK(hits == want);
}

/* Reserves the absent names of positions idx[0..n) and seals them, except
 * those `abort_pct` percent (chosen at random) which are aborted. */
static void save_some(oi_host *h, oi_host_ns ns, const size_t *idx, size_t n, int abort_pct) {
  oi_block_hash *hs = malloc(n * sizeof *hs);
  host_block **bs = calloc(n, sizeof *bs);
  host_block **ok = malloc(n * sizeof *ok), **bad = malloc(n * sizeof *bad);
  REQUIRE(hs && bs && ok && bad);
  for (size_t i = 0; i < n; i++)
    hs[i] = names[idx[i]];
  sink_ctx c = {.blocks = bs};
  oi_host_reserve_sink sink = {.accepted = on_accepted, .ctx = &c};
  oi_host_reserved r;
  oi__host_reserve(h, ns, hs, n, &sink, &r);
  CHECK(r.dropped == 0);
  size_t nok = 0, nbad = 0;
  for (size_t i = 0; i < n; i++) {
    if (!bs[i]) continue; /* held already (the model says so) */
    if ((int)(rnd() % 100) < abort_pct) {
      bad[nbad++] = bs[i];
    } else {
      ok[nok++] = bs[i];
      model[idx[i]] = true;
    }
  }
  oi__host_save_end(h, ns, bad, nbad, false, 0, 0);
  oi__host_save_end(h, ns, ok, nok, true, 0, 0);
  free(hs);
  free(bs);
  free(ok);
  free(bad);
}

static void test_crafted_runs(void) {
  oi_host_options o = tr_host_options(POOL_BYTES);
  o.high_watermark = o.low_watermark = 1.0f; /* evictions only when asked */
  oi_host *h = tr_host_new(&o);
  REQUIRE(h->nshards > SHARD);
  oi_host_ns ns;
  REQUIRE(oi__host_bind_namespace(h, "index", BLOCK_BYTES, 0, 0, 0, &ns) == OI_OK);
  size_t k = 0;
  /* One shard, one tag near the top (its home is the table's last slots:
   * the run wraps around), another near the bottom, one whole key shared
   * by many names, and random keys in the same shard (growth). */
  for (uint64_t i = 0; i < N_TAG_HI; i++)
    names[k++] = name_with_key(ns.id, SHARD << 48 | (i + 1) << 32 | 0xFFFFFFF0ull, 0);
  for (uint64_t i = 0; i < N_TAG_LO; i++)
    names[k++] = name_with_key(ns.id, SHARD << 48 | (i + 1) << 32 | 0x00000003ull, 0);
  for (uint64_t i = 0; i < N_SAME_KEY; i++)
    names[k++] = name_with_key(ns.id, SHARD << 48 | 7ull << 32 | 0x80000000ull, i + 1);
  for (uint64_t i = 0; i < N_RANDOM; i++)
    names[k++] =
        name_with_key(ns.id, SHARD << 48 | (rnd() & 0xFFFFull) << 32 | (rnd() & 0xFFFFFFFFull), 0);
  REQUIRE(k == N_NAMES);
  for (size_t i = 0; i < N_NAMES; i++) { /* the crafting is right */
    uint64_t key = oi__index_key(ns.id, &names[i]);
    CHECK(oi__index_shard_of(h, key) == &h->shards[SHARD]);
  }
  check_model(h, ns, "empty");

  static size_t idx[N_NAMES];
  for (int round = 0; round < 40; round++) {
    /* Saves of a random subset (some of them held already, some aborted:
     * removals from inside the runs), in random order. */
    size_t n = 0;
    for (size_t i = 0; i < N_NAMES; i++)
      if (rnd() % 4 == 0) idx[n++] = i;
    for (size_t i = n; i > 1; i--) {
      size_t j = rnd() % i, t = idx[i - 1];
      idx[i - 1] = idx[j];
      idx[j] = t;
    }
    save_some(h, ns, idx, n, 30);
    check_model(h, ns, "after saves");
    if (round % 5 == 4) { /* evictions from the LRU end: removals anywhere in the runs */
      host_block *out[256];
      size_t got = oi__index_evict_batch(h, -1, 1 + rnd() % 256, out);
      for (size_t i = 0; i < got; i++) {
        bool known = false;
        for (size_t j = 0; j < N_NAMES && !known; j++)
          if (model[j] && !memcmp(names[j].bytes, out[i]->hash.bytes, sizeof names[j].bytes)) {
            model[j] = false;
            known = true;
          }
        CHECK(known);
      }
      oi__pool_free_batch(h, out, got);
      check_model(h, ns, "after evictions");
    }
  }
  /* The table grew past its first size with the runs in it. */
  CHECK(h->shards[SHARD].nslots > 256);
  uint64_t n = 0;
  CHECK_OK(oi_host_evict_all(h, &n));
  memset(model, 0, sizeof model);
  check_model(h, ns, "after evict_all");
  CHECK(h->shards[SHARD].count == 0);
  oi_host_destroy(h);
}

int main(void) {
  RUN_TEST(test_related_words_spread);
  RUN_TEST(test_crafted_runs);
  TEST_EXIT();
}
