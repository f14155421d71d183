/* `openinfer bench host`: the host tier on the cpu backend, in one run.
 *
 *  1. index scale: N resident 256-byte blocks saved through the public API,
 *     then lookups through the internal index, and its memory per block;
 *  2. in-process query of 64 hashes (hits, misses), p50 / p99;
 *  3. the cost of a fire-and-forget save call of 64 blocks, p50 / p99;
 *  4. save and load of a large batch against single-thread memcpy of the
 *     same bytes between the same buffers.
 *
 * Timed regions hold only what is measured: hashes are made, leases
 * released, saves flushed and pools emptied outside them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "host/host_private.h"
#include "openinfer/openinfer.h"

#define INDEX_BLOCK_BYTES 256ull
#define INDEX_CHUNK_BYTES (64ull << 20)
#define INDEX_ARENA_BLOCKS 4096
#define CALL_BLOCKS 64
#define LOOKUP_TABLE (1u << 20) /* random resident hashes cycled through by the lookup loop */
#define SAVE_BLOCK_BYTES (4ull << 10)
#define SAVE_POOL_BYTES (256ull << 20)
#define SAVE_ARENA_BLOCKS 4096
#define BATCH_BLOCKS 256
#define BATCH_ARENAS 4
#define REPS 3

/* Hash streams: every phase draws its hashes from its own stream. */
enum { STREAM_INDEX = 1, STREAM_MISS = 2, STREAM_SAVE = 3, STREAM_BATCH = 4 };

static inline uint64_t mix64(uint64_t x) { /* splitmix64: a bijection */
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/* Distinct (stream, i) give distinct hashes: the first 8 bytes already are. */
static inline oi_block_hash make_hash(uint64_t stream, uint64_t i) {
  uint64_t key = (stream << 56) ^ i, a = mix64(key), b = mix64(key ^ 0xD1B54A32D192ED03ull);
  oi_block_hash h;
  memcpy(h.bytes, &a, 8);
  memcpy(h.bytes + 8, &b, 8);
  return h;
}

typedef struct rng {
  uint64_t s;
} rng;

static inline uint64_t rng_next(rng *r) { return mix64(r->s++); }
static inline uint64_t rng_below(rng *r, uint64_t n) { return rng_next(r) % n; }

static int fail_api(const char *what) {
  fprintf(stderr, "openinfer bench host: %s: %s\n", what, oi_last_error());
  return -1;
}

static int fail_msg(const char *what) {
  fprintf(stderr, "openinfer bench host: %s\n", what);
  return -1;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

static bench_latency latency_of(uint64_t *ns, size_t n) {
  qsort(ns, n, sizeof *ns, cmp_u64);
  return (bench_latency){.p50_us = (double)ns[n / 2] / 1e3,
                         .p99_us = (double)ns[n * 99 / 100] / 1e3};
}

static double gbps(uint64_t bytes, uint64_t ns) { return ns ? (double)bytes / (double)ns : 0.0; }

static void host_opts(oi_host_options *ho, uint64_t pool, uint64_t chunk) {
  oi_host_options_init(ho);
  ho->device = OI_DEVICE_CPU;
  ho->pool_bytes = pool;
  ho->chunk_bytes = chunk;
  /* No background eviction: each phase fills its pool on purpose. */
  ho->high_watermark = 1.0f;
  ho->low_watermark = 1.0f;
}

static int namespace_id(oi_host *h, const char *name, uint32_t *ns) {
  int rc = -1;
  pthread_mutex_lock(&h->ns_lock);
  for (uint32_t i = 0; i < h->nns; i++)
    if (!strcmp(h->ns[i].name, name)) {
      *ns = i + 1;
      rc = 0;
    }
  pthread_mutex_unlock(&h->ns_lock);
  return rc;
}

/* ---- 1 and 2: index scale and queries ------------------------------------ */

static int index_fill(oi_host *h, oi_engine *e, uint64_t n, bench_host_result *r) {
  int64_t ids[CALL_BLOCKS];
  oi_block_hash hashes[CALL_BLOCKS];
  uint64_t step = (n + 9) / 10, next_report = step, done = 0, t0 = oi__now_ns();
  while (done < n) {
    size_t k = (size_t)OI_MIN((uint64_t)CALL_BLOCKS, n - done);
    for (size_t j = 0; j < k; j++) {
      ids[j] = (int64_t)((done + j) % INDEX_ARENA_BLOCKS);
      hashes[j] = make_hash(STREAM_INDEX, done + j);
    }
    if (oi_engine_save(e, ids, hashes, k, NULL, NULL) != OI_OK) return fail_api("index fill: save");
    done += k;
    if (done >= next_report || done == n) {
      if (oi_engine_flush(e, UINT32_MAX) != OI_OK) return fail_api("index fill: flush");
      double s = (double)(oi__now_ns() - t0) / 1e9;
      fprintf(stderr, "filling index: %3.0f%% (%.1f M blocks, %.1f M blocks/s)\n",
              100.0 * (double)done / (double)n, (double)done / 1e6, (double)done / s / 1e6);
      next_report += step;
    }
  }
  uint64_t dt = oi__now_ns() - t0;
  r->fill_s = (double)dt / 1e9;
  r->fill_blocks_per_s = (double)n / r->fill_s;
  oi_host_stats hs = {.struct_size = sizeof hs};
  if (oi_host_get_stats(h, &hs) != OI_OK) return fail_api("host stats");
  if (hs.blocks_sealed != n || hs.saves_dropped || hs.saves_deduplicated || hs.saves_failed) {
    fprintf(stderr,
            "openinfer bench host: index fill: %llu of %llu blocks sealed (%llu dropped, %llu "
            "deduplicated, %llu failed)\n",
            (unsigned long long)hs.blocks_sealed, (unsigned long long)n,
            (unsigned long long)hs.saves_dropped, (unsigned long long)hs.saves_deduplicated,
            (unsigned long long)hs.saves_failed);
    return -1;
  }
  return 0;
}

static int index_lookups(oi_host *h, uint32_t ns, uint64_t n, uint64_t duration_ns,
                         bench_host_result *r) {
  oi_block_hash *tab = oi__malloc(LOOKUP_TABLE * sizeof *tab);
  if (!tab) return fail_msg("out of memory");
  rng g = {.s = 12345};
  for (uint32_t i = 0; i < LOOKUP_TABLE; i++)
    tab[i] = make_hash(STREAM_INDEX, rng_below(&g, n));
  /* As queries look up: batches of CALL_BLOCKS hashes, each shard locked
   * once per batch, the misses of a batch overlapped. */
  uint64_t found = 0, done = 0, t0 = oi__now_ns(), t;
  do {
    for (uint32_t k = 0; k < 4096; k += CALL_BLOCKS) {
      index_batch q;
      oi__index_batch_lock(h, &q, ns, &tab[(done + k) & (LOOKUP_TABLE - 1)], CALL_BLOCKS);
      for (uint32_t j = 0; j < CALL_BLOCKS; j++)
        found += q.found[j] != NULL;
      oi__index_batch_unlock(h, &q);
    }
    done += 4096;
    t = oi__now_ns();
  } while (t - t0 < duration_ns);
  if (found != done) {
    oi__free(tab);
    fprintf(stderr, "openinfer bench host: index lookups: %llu of %llu resident hashes not found\n",
            (unsigned long long)(done - found), (unsigned long long)done);
    return -1;
  }
  r->lookups = done;
  r->lookups_per_s = (double)done / ((double)(t - t0) / 1e9);
  /* One hash at a time, a lock each (a diagnostic: the misses do not overlap). */
  found = done = 0;
  t0 = oi__now_ns();
  do {
    for (uint32_t k = 0; k < 4096; k++) {
      const oi_block_hash *hh = &tab[(done + k) & (LOOKUP_TABLE - 1)];
      index_shard *s = oi__index_shard(h, ns, hh);
      pthread_mutex_lock(&s->lock);
      found += oi__index_find_locked(s, ns, hh) != NULL;
      pthread_mutex_unlock(&s->lock);
    }
    done += 4096;
    t = oi__now_ns();
  } while (t - t0 < duration_ns / 2);
  oi__free(tab);
  if (found != done) {
    fprintf(stderr, "openinfer bench host: index lookups: %llu of %llu resident hashes not found\n",
            (unsigned long long)(done - found), (unsigned long long)done);
    return -1;
  }
  r->lookups_single_per_s = (double)done / ((double)(t - t0) / 1e9);
  return 0;
}

/* Memory the index costs: one host_block record and one free-slot bit per
 * carved slot, plus the open-addressing tables of every shard. */
static void index_overhead(oi_host *h, uint64_t resident, bench_host_result *r) {
  uint64_t slots = 0, buckets = 0;
  uint32_t ncls = atomic_load(&h->nclasses);
  for (uint32_t c = 0; c < ncls; c++) {
    pthread_mutex_lock(&h->classes[c].lock);
    slots += atomic_load(&h->classes[c].slots);
    pthread_mutex_unlock(&h->classes[c].lock);
  }
  for (uint32_t i = 0; i < h->nshards; i++) {
    pthread_mutex_lock(&h->shards[i].lock);
    buckets += h->shards[i].nslots;
    pthread_mutex_unlock(&h->shards[i].lock);
  }
  r->slots_carved = slots;
  r->buckets = buckets;
  r->shards = h->nshards;
  r->record_bytes = sizeof(host_block);
  r->bucket_bytes = sizeof *h->shards[0].slots;
  r->overhead_per_block = (double)(slots * sizeof(host_block) + (slots + 7) / 8 +
                                   buckets * sizeof *h->shards[0].slots) /
                          (double)resident;
}

typedef enum { Q_HIT_RUN, Q_HIT_SCATTERED, Q_MISS, Q_MEMBERSHIP_MISS } query_kind;

static int query_latency(oi_engine *e, uint64_t n, query_kind kind, uint32_t samples, uint64_t *ns,
                         bench_latency *out) {
  oi_block_hash hashes[CALL_BLOCKS];
  uint8_t present[CALL_BLOCKS];
  rng g = {.s = 777 + (uint64_t)kind};
  uint64_t calls = n / CALL_BLOCKS, miss_next = (uint64_t)kind << 40;
  uint32_t warmup = samples / 10;
  for (uint32_t i = 0; i < warmup + samples; i++) {
    uint64_t base = rng_below(&g, calls) * CALL_BLOCKS;
    for (uint32_t j = 0; j < CALL_BLOCKS; j++) {
      switch (kind) {
      case Q_HIT_RUN: hashes[j] = make_hash(STREAM_INDEX, base + j); break;
      case Q_HIT_SCATTERED: hashes[j] = make_hash(STREAM_INDEX, rng_below(&g, n)); break;
      default: hashes[j] = make_hash(STREAM_MISS, miss_next++); break;
      }
    }
    uint32_t flags = kind == Q_MEMBERSHIP_MISS ? OI_QUERY_MEMBERSHIP : 0;
    oi_query_result qr = {.struct_size = sizeof qr, .present = present};
    uint64_t t0 = oi__now_ns();
    oi_status st = oi_engine_query(e, NULL, hashes, CALL_BLOCKS, flags, &qr);
    uint64_t dt = oi__now_ns() - t0;
    if (st != OI_OK) return fail_api("query");
    uint64_t want = kind == Q_HIT_RUN || kind == Q_HIT_SCATTERED ? CALL_BLOCKS : 0;
    if (qr.hit_blocks != want) {
      fprintf(stderr, "openinfer bench host: query: %llu hits, %llu expected\n",
              (unsigned long long)qr.hit_blocks, (unsigned long long)want);
      return -1;
    }
    if (qr.hit_blocks && !(flags & OI_QUERY_MEMBERSHIP) && oi_engine_release(e, qr.lease) != OI_OK)
      return fail_api("release");
    if (i >= warmup) ns[i - warmup] = dt;
  }
  *out = latency_of(ns, samples);
  return 0;
}

#define INDEX_NAMESPACE "bench-index"

/* A host and one cpu engine over a single arena of `blocks` blocks at `base`
 * (the index and save phases). On failure *h / *e hold what was created. */
static int open_one_arena(const oi_host_options *ho, uint8_t *base, uint64_t blocks,
                          uint64_t block_bytes, const char *ns, oi_host **h, oi_engine **e) {
  if (oi_host_create(ho, h) != OI_OK) return fail_api("host create");
  oi_arena_desc ad = {.name = "kv",
                      .base = base,
                      .num_blocks = blocks,
                      .bytes_per_block = block_bytes,
                      .block_stride = block_bytes,
                      .segments = 1};
  oi_engine_options eo;
  oi_engine_options_init(&eo);
  eo.device = OI_DEVICE_CPU;
  eo.namespace_id = ns;
  eo.instance_name = "bench";
  eo.num_arenas = 1;
  eo.arenas = &ad;
  if (oi_engine_create(*h, &eo, e) != OI_OK) return fail_api("engine create");
  return 0;
}

static int phase_index(const bench_host_config *cfg, bench_host_result *r) {
  uint64_t n = cfg->index_blocks;
  r->index_blocks = n;
  r->index_block_bytes = INDEX_BLOCK_BYTES;
  uint64_t chunks = (n * INDEX_BLOCK_BYTES + INDEX_CHUNK_BYTES - 1) / INDEX_CHUNK_BYTES;
  oi_host_options ho;
  host_opts(&ho, chunks * INDEX_CHUNK_BYTES, INDEX_CHUNK_BYTES);
  uint8_t *arena = oi__aligned_alloc(4096, INDEX_ARENA_BLOCKS * INDEX_BLOCK_BYTES);
  uint64_t *ns = NULL;
  oi_host *h = NULL;
  oi_engine *e = NULL;
  int rc = -1;
  if (!arena) {
    fail_msg("out of memory");
    goto out;
  }
  memset(arena, 0x5a, INDEX_ARENA_BLOCKS * INDEX_BLOCK_BYTES);
  fprintf(stderr, "index: mapping a %.2f GiB pool for %llu blocks of %llu B\n",
          (double)ho.pool_bytes / (1ull << 30), (unsigned long long)n,
          (unsigned long long)INDEX_BLOCK_BYTES);
  if (open_one_arena(&ho, arena, INDEX_ARENA_BLOCKS, INDEX_BLOCK_BYTES, INDEX_NAMESPACE, &h, &e) !=
      0)
    goto out;
  if (index_fill(h, e, n, r) != 0) goto out;

  uint32_t nsid;
  if (namespace_id(h, INDEX_NAMESPACE, &nsid) != 0) {
    fail_msg("index: the namespace is not registered (bug)");
    goto out;
  }
  if (index_lookups(h, nsid, n, cfg->quick ? 300000000ull : 1000000000ull, r) != 0) goto out;
  index_overhead(h, n, r);

  fprintf(stderr, "bench host: 2/4 query latency\n");
  r->query_blocks = CALL_BLOCKS;
  r->query_samples = cfg->quick ? 2000 : 20000;
  ns = oi__malloc(r->query_samples * sizeof *ns);
  if (!ns) {
    fail_msg("out of memory");
    goto out;
  }
  if (query_latency(e, n, Q_HIT_RUN, r->query_samples, ns, &r->query_hit_run) ||
      query_latency(e, n, Q_HIT_SCATTERED, r->query_samples, ns, &r->query_hit_scattered) ||
      query_latency(e, n, Q_MISS, r->query_samples, ns, &r->query_miss) ||
      query_latency(e, n, Q_MEMBERSHIP_MISS, r->query_samples, ns, &r->query_membership_miss))
    goto out;
  rc = 0;
out:
  oi__free(ns);
  oi_engine_destroy(e);
  oi_host_destroy(h);
  oi__free(arena);
  return rc;
}

/* ---- 3: save enqueue ------------------------------------------------------ */

typedef struct reserve_sink_ctx {
  host_block *blocks[CALL_BLOCKS];
  size_t n;
} reserve_sink_ctx;

static void reserve_accepted(void *ctx, const size_t *idx, host_block *const *blocks,
                             uint8_t *const *data, size_t k) {
  (void)idx;
  (void)data;
  reserve_sink_ctx *c = ctx;
  for (size_t j = 0; j < k; j++)
    c->blocks[c->n++] = blocks[j];
}

/* The host tier's part of a save call alone: oi__host_reserve of 64 fresh
 * hashes, timed; the slots are sealed (untimed) and the pool emptied as the
 * engine phase does. */
static int save_reserve(oi_host *h, oi_engine *e, uint32_t samples, uint64_t *next, uint64_t *ns,
                        bench_latency *out) {
  (void)e;
  oi_host_ns hns;
  if (!oi__host_find_namespace(h, "bench-save", &hns)) return fail_msg("save: no namespace (bug)");
  const uint32_t per_round = (uint32_t)(SAVE_POOL_BYTES / SAVE_BLOCK_BYTES / CALL_BLOCKS);
  oi_block_hash hashes[CALL_BLOCKS];
  for (uint32_t i = 0; i < samples; i++) {
    for (uint32_t j = 0; j < CALL_BLOCKS; j++)
      hashes[j] = make_hash(STREAM_SAVE, (*next)++);
    reserve_sink_ctx c = {.n = 0};
    oi_host_reserve_sink sink = {.accepted = reserve_accepted, .ctx = &c};
    oi_host_reserved res;
    uint64_t t0 = oi__now_ns();
    oi__host_reserve(h, hns, hashes, CALL_BLOCKS, &sink, &res);
    ns[i] = oi__now_ns() - t0;
    if (res.accepted != CALL_BLOCKS) return fail_msg("save: reserve dropped blocks");
    oi__host_save_end(h, hns, c.blocks, c.n, true, 0, 0);
    if ((i + 1) % per_round == 0 && oi_host_evict_all(h, NULL) != OI_OK) return fail_api("evict");
  }
  *out = latency_of(ns, samples);
  return 0;
}

static int phase_save(const bench_host_config *cfg, bench_host_result *r) {
  const uint32_t per_round = (uint32_t)(SAVE_POOL_BYTES / SAVE_BLOCK_BYTES / CALL_BLOCKS);
  const uint32_t rounds = cfg->quick ? 2 : 10;
  r->save_call_blocks = CALL_BLOCKS;
  r->save_block_bytes = SAVE_BLOCK_BYTES;
  r->save_samples = per_round * rounds;
  oi_host_options ho;
  host_opts(&ho, SAVE_POOL_BYTES, 0);
  uint8_t *arena = oi__aligned_alloc(4096, SAVE_ARENA_BLOCKS * SAVE_BLOCK_BYTES);
  uint64_t *ns = oi__malloc(r->save_samples * sizeof *ns);
  oi_host *h = NULL;
  oi_engine *e = NULL;
  int rc = -1;
  if (!arena || !ns) {
    fail_msg("out of memory");
    goto out;
  }
  memset(arena, 0xa5, SAVE_ARENA_BLOCKS * SAVE_BLOCK_BYTES);
  if (open_one_arena(&ho, arena, SAVE_ARENA_BLOCKS, SAVE_BLOCK_BYTES, "bench-save", &h, &e) != 0)
    goto out;
  int64_t ids[CALL_BLOCKS];
  oi_block_hash hashes[CALL_BLOCKS];
  uint64_t next = 0, calls = 0;
  for (int burst = 0; burst < 2; burst++) {
    uint32_t k = 0;
    for (uint32_t round = 0; round < rounds; round++) {
      for (uint32_t c = 0; c < per_round; c++, calls++) {
        for (uint32_t j = 0; j < CALL_BLOCKS; j++) {
          ids[j] = (int64_t)((calls * CALL_BLOCKS + j) % SAVE_ARENA_BLOCKS);
          hashes[j] = make_hash(STREAM_SAVE, next++);
        }
        uint64_t t0 = oi__now_ns();
        oi_status st = oi_engine_save(e, ids, hashes, CALL_BLOCKS, NULL, NULL);
        uint64_t dt = oi__now_ns() - t0;
        if (st != OI_OK) {
          fail_api("save");
          goto out;
        }
        ns[k++] = dt;
        if (!burst && oi_engine_flush(e, UINT32_MAX) != OI_OK) {
          fail_api("flush");
          goto out;
        }
      }
      if (oi_engine_flush(e, UINT32_MAX) != OI_OK) {
        fail_api("flush");
        goto out;
      }
      if (oi_host_evict_all(h, NULL) != OI_OK) {
        fail_api("evict");
        goto out;
      }
    }
    if (burst)
      r->save_burst = latency_of(ns, k);
    else
      r->save_idle = latency_of(ns, k);
  }
  oi_host_stats hs = {.struct_size = sizeof hs};
  if (oi_host_get_stats(h, &hs) != OI_OK) {
    fail_api("host stats");
    goto out;
  }
  uint64_t engine_saves = next;
  if (save_reserve(h, e, rounds * per_round, &next, ns, &r->save_reserve) != 0) goto out;
  if (hs.saves_completed != engine_saves || hs.saves_dropped || hs.saves_deduplicated ||
      hs.saves_failed) {
    /* A dropped block costs less than a saved one: the figures would flatter. */
    fprintf(stderr,
            "openinfer bench host: save enqueue: %llu of %llu blocks sealed (%llu dropped, %llu "
            "deduplicated, %llu failed)\n",
            (unsigned long long)hs.saves_completed, (unsigned long long)next,
            (unsigned long long)hs.saves_dropped, (unsigned long long)hs.saves_deduplicated,
            (unsigned long long)hs.saves_failed);
    goto out;
  }
  rc = 0;
out:
  oi_engine_destroy(e);
  oi_host_destroy(h);
  oi__free(ns);
  oi__free(arena);
  return rc;
}

/* ---- 4: batch save / load vs memcpy ------------------------------------ */

static uint8_t slice_byte(uint32_t arena, uint32_t block) {
  return (uint8_t)(arena * 61u + block * 7u + 1u);
}

static int phase_batch(const bench_host_config *cfg, bench_host_result *r) {
  const uint64_t abpb = (cfg->batch_bytes / (BATCH_BLOCKS * BATCH_ARENAS)) & ~(uint64_t)255;
  const uint64_t arena_bytes = abpb * BATCH_BLOCKS, total = arena_bytes * BATCH_ARENAS;
  const uint64_t slot = abpb * BATCH_ARENAS; /* a multiple of the 256-byte slot alignment */
  r->batch_blocks = BATCH_BLOCKS;
  r->batch_arenas = BATCH_ARENAS;
  r->batch_arena_block_bytes = abpb;
  r->batch_bytes = total;
  oi_host_options ho;
  host_opts(&ho, slot * BATCH_BLOCKS, slot * 16);
  uint8_t *buf = oi__aligned_alloc(4096, total);
  oi_host *h = NULL;
  oi_engine *e = NULL;
  oi_ticket *t = NULL;
  int rc = -1;
  if (!buf) {
    fail_msg("out of memory for the batch arena");
    goto out;
  }
  for (uint32_t a = 0; a < BATCH_ARENAS; a++) /* touches every page, and marks every slice */
    for (uint32_t b = 0; b < BATCH_BLOCKS; b++)
      memset(buf + a * arena_bytes + b * abpb, slice_byte(a, b), abpb);
  fprintf(stderr, "batch: mapping a %.2f GiB pool\n", (double)ho.pool_bytes / (1ull << 30));
  if (oi_host_create(&ho, &h) != OI_OK) {
    fail_api("host create");
    goto out;
  }
  oi_arena_desc ad[BATCH_ARENAS];
  static const char *names[BATCH_ARENAS] = {"layer0", "layer1", "layer2", "layer3"};
  for (uint32_t a = 0; a < BATCH_ARENAS; a++)
    ad[a] = (oi_arena_desc){.name = names[a],
                            .offset = a * arena_bytes,
                            .num_blocks = BATCH_BLOCKS,
                            .bytes_per_block = abpb,
                            .block_stride = abpb,
                            .segments = 1};
  oi_engine_options eo;
  oi_engine_options_init(&eo);
  eo.device = OI_DEVICE_CPU;
  eo.namespace_id = "bench-batch";
  eo.instance_name = "bench";
  eo.num_arenas = BATCH_ARENAS;
  eo.arenas = ad;
  eo.arena_base = buf;
  eo.arena_size = total;
  if (oi_engine_create(h, &eo, &e) != OI_OK) {
    fail_api("engine create");
    goto out;
  }
  uint8_t *pool = h->pool.host;

  /* Baseline: arena -> pool, the bytes a save moves. */
  uint64_t best = UINT64_MAX;
  for (int rep = 0; rep < REPS; rep++) {
    uint64_t t0 = oi__now_ns();
    memcpy(pool, buf, total);
    best = OI_MIN(best, oi__now_ns() - t0);
  }
  r->memcpy_to_host_gbps = gbps(total, best);
  best = UINT64_MAX;
  for (int rep = 0; rep < REPS; rep++) { /* the same, in the copy plan's pieces and order */
    uint64_t t0 = oi__now_ns();
    for (uint32_t b = 0; b < BATCH_BLOCKS; b++)
      for (uint32_t a = 0; a < BATCH_ARENAS; a++)
        memcpy(pool + b * slot + a * abpb, buf + a * arena_bytes + b * abpb, abpb);
    best = OI_MIN(best, oi__now_ns() - t0);
  }
  r->memcpy_pieces_to_host_gbps = gbps(total, best);

  int64_t ids[BATCH_BLOCKS];
  oi_block_hash hashes[BATCH_BLOCKS];
  for (uint32_t i = 0; i < BATCH_BLOCKS; i++)
    ids[i] = i;
  best = UINT64_MAX;
  for (int rep = 0; rep < REPS; rep++) {
    if (rep > 0 && oi_host_evict_all(h, NULL) != OI_OK) {
      fail_api("evict");
      goto out;
    }
    for (uint32_t i = 0; i < BATCH_BLOCKS; i++)
      hashes[i] = make_hash(STREAM_BATCH, (uint64_t)rep << 32 | i);
    uint64_t t0 = oi__now_ns();
    oi_status st = oi_engine_save(e, ids, hashes, BATCH_BLOCKS, NULL, &t);
    if (st == OI_OK) st = oi_ticket_wait(t, UINT32_MAX);
    uint64_t dt = oi__now_ns() - t0;
    oi_ticket_release(t);
    t = NULL;
    if (st != OI_OK) {
      fail_api("batch save");
      goto out;
    }
    best = OI_MIN(best, dt);
  }
  r->save_gbps = gbps(total, best);
  oi_host_stats hs = {.struct_size = sizeof hs};
  if (oi_host_get_stats(h, &hs) != OI_OK) {
    fail_api("host stats");
    goto out;
  }
  if (hs.blocks_sealed != BATCH_BLOCKS || hs.saves_completed != REPS * BATCH_BLOCKS) {
    fprintf(stderr, "openinfer bench host: batch save: %llu of %d blocks sealed\n",
            (unsigned long long)hs.blocks_sealed, BATCH_BLOCKS);
    goto out;
  }

  /* Restore the last saved batch over a wiped arena, three times. */
  memset(buf, 0, total);
  best = UINT64_MAX;
  for (int rep = 0; rep < REPS; rep++) {
    oi_query_result qr = {.struct_size = sizeof qr};
    uint64_t t0 = oi__now_ns();
    oi_status st = oi_engine_query(e, NULL, hashes, BATCH_BLOCKS, 0, &qr);
    if (st == OI_OK && qr.hit_blocks != BATCH_BLOCKS) {
      fprintf(stderr, "openinfer bench host: batch query: %llu of %d blocks hit\n",
              (unsigned long long)qr.hit_blocks, BATCH_BLOCKS);
      goto out;
    }
    if (st == OI_OK) st = oi_engine_load(e, qr.lease, ids, BATCH_BLOCKS, NULL, &t);
    if (st == OI_OK) st = oi_ticket_wait(t, UINT32_MAX);
    uint64_t dt = oi__now_ns() - t0;
    oi_ticket_release(t);
    t = NULL;
    if (st != OI_OK) {
      fail_api("batch load");
      goto out;
    }
    best = OI_MIN(best, dt);
  }
  r->load_gbps = gbps(total, best);
  for (uint32_t a = 0; a < BATCH_ARENAS; a++)
    for (uint32_t b = 0; b < BATCH_BLOCKS; b++) {
      const uint8_t *p = buf + a * arena_bytes + b * abpb;
      uint8_t v = slice_byte(a, b);
      if (p[0] != v || p[abpb / 2] != v || p[abpb - 1] != v) {
        fprintf(stderr,
                "openinfer bench host: batch load: arena %u block %u differs from what was saved\n",
                a, b);
        goto out;
      }
    }

  /* Baseline: pool -> arena, the bytes a load moves. */
  best = UINT64_MAX;
  for (int rep = 0; rep < REPS; rep++) {
    uint64_t t0 = oi__now_ns();
    memcpy(buf, pool, total);
    best = OI_MIN(best, oi__now_ns() - t0);
  }
  r->memcpy_from_host_gbps = gbps(total, best);
  best = UINT64_MAX;
  for (int rep = 0; rep < REPS; rep++) {
    uint64_t t0 = oi__now_ns();
    for (uint32_t b = 0; b < BATCH_BLOCKS; b++)
      for (uint32_t a = 0; a < BATCH_ARENAS; a++)
        memcpy(buf + a * arena_bytes + b * abpb, pool + b * slot + a * abpb, abpb);
    best = OI_MIN(best, oi__now_ns() - t0);
  }
  r->memcpy_pieces_from_host_gbps = gbps(total, best);
  rc = 0;
out:
  oi_ticket_release(t);
  oi_engine_destroy(e);
  oi_host_destroy(h);
  oi__free(buf);
  return rc;
}

int bench_host_run(const bench_host_config *cfg, bench_host_result *out) {
  memset(out, 0, sizeof *out);
  fprintf(stderr, "bench host: 1/4 index scale\n");
  if (phase_index(cfg, out) != 0) return -1;
  fprintf(stderr, "bench host: 3/4 save enqueue\n");
  if (phase_save(cfg, out) != 0) return -1;
  fprintf(stderr, "bench host: 4/4 batch save and load\n");
  if (phase_batch(cfg, out) != 0) return -1;
  return 0;
}
