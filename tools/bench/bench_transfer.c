/* `openinfer bench transfer`: save and load bandwidth of real KV layouts
 * through the public engine API, against the bulk pinned memcpy ceiling,
 * the naive per-piece cudaMemcpyAsync loop and the device layer's copy
 * paths alone, measured in the same run; restore latency of a 22-block
 * prefix; and the slowdown copies cause to a compute-bound kernel stream.
 * --codec runs the engines in a codec namespace (docs/codecs.md: rates in
 * logical bytes, against the same bulk copies) and --content corpus fills
 * the arenas with the real-KV corpus tiled (random-looking patterns do not
 * compress); every load is checked against the codec's own round trip. */
#include <getopt.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "bench_cuda.h"
#include "bench_disk.h"
#include "cli.h"
#include "codec/codec.h"
#include "device/device.h"
#include "openinfer/openinfer.h"
#include "transfer/transfer.h"

typedef struct shape {
  const char *name;
  uint32_t groups; /* arena groups: (count, bytes_per_block) */
  uint32_t count[2];
  uint64_t bpb[2];
  bool page_first; /* one region; a block's arenas are adjacent */
  uint64_t blocks;
  /* vLLM's [2, num_blocks, block_size, heads, dim] layer: one arena per layer
   * whose 2 segments (K, V) of bpb bytes are separate regions (the K half,
   * then the V half: oi_engine_options.segment_offsets). */
  bool kv_halves;
} shape;

static const shape shapes[] = {
    {"glm5.2", 2, {78, 21}, {41984, 8448}, false, 256, false},
    {"qwen3-4b", 1, {36, 0}, {64 << 10, 0}, true, 512, false},
    /* 16 tokens x 8 KV heads x 128 x bf16 = 32 KiB per K or V piece, 36 layers */
    {"vllm-qwen3-4b", 1, {36, 0}, {32 << 10, 0}, false, 512, true},
    {"pages-4k", 1, {1, 0}, {4 << 10, 0}, false, 65536, false},
    {"pages-42k", 1, {1, 0}, {42 << 10, 0}, false, 8192, false},
};
#define NSHAPES (sizeof shapes / sizeof shapes[0])

typedef struct bench_env {
  oi_dev *dev;
  int device;
  int reps;
  bool json;
  bool quick;
  bool bandwidth_only;
  int codec;                 /* oi_codec_id */
  bench_disk_corpus *corpus; /* --content corpus: the arenas hold it, tiled */
} bench_env;

typedef struct setup {
  const shape *sh;
  uint32_t narenas;
  uint64_t block_bytes, total;
  uint8_t *region; /* device memory holding every arena */
  uint64_t region_bytes;
  oi_arena_desc *arenas;
  uint64_t *seg_offsets; /* kv_halves: 2 per arena */
  char (*names)[16];
  int64_t *ids; /* scattered block ids (real KV pages are not contiguous) */
  oi_block_hash *hashes;
  uint64_t hash_epoch;
  oi_host *host;
  oi_engine *eng[5]; /* KERNEL (all SMs), KERNEL (default limit), DMA, AUTO, STAGED */
  /* What the region must hold after a load (--codec or --content corpus):
   * the content, or each block through the lossy codec and back. NULL: the
   * fill pattern (seed 3). content: what the region was filled with. */
  uint8_t *expect, *content;
} setup;

#define NMODES 5
static const char *mode_names[NMODES] = {"kernel-132", "kernel-default", "dma", "auto", "staged"};

static uint64_t splitmix(uint64_t *x) {
  uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static void fresh_hashes(setup *s) {
  uint64_t x = ++s->hash_epoch * 1000003ull;
  for (uint64_t b = 0; b < s->sh->blocks; b++) {
    uint64_t a = splitmix(&x), c = splitmix(&x);
    memcpy(s->hashes[b].bytes, &a, 8);
    memcpy(s->hashes[b].bytes + 8, &c, 8);
  }
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return v[n / 2];
}

static void setup_free(bench_env *env, setup *s) {
  for (int m = 0; m < NMODES; m++)
    oi_engine_destroy(s->eng[m]);
  oi_host_destroy(s->host);
  if (s->region) env->dev->ops->mem_free(env->dev, s->region);
  free(s->arenas);
  free(s->seg_offsets);
  free(s->names);
  free(s->ids);
  free(s->hashes);
  if (s->expect != s->content) free(s->expect);
  free(s->content);
  memset(s, 0, sizeof *s);
}

/* The tuning variables this command has always honoured, mapped onto the
 * engine options (docs/benchmarks.md): OI_STAGING_MB (4..4096; else the
 * default) and OI_SUBMIT_GROUP_MB (0: one group per call). */
static void env_tuning(oi_engine_options *eo) {
  const char *v = getenv("OI_STAGING_MB");
  unsigned long long mb = v && *v ? strtoull(v, NULL, 10) : 0;
  if (mb >= 4 && mb <= 4096) eo->staging_bytes = (uint64_t)mb << 20;
  v = getenv("OI_SUBMIT_GROUP_MB");
  if (v && *v) {
    mb = strtoull(v, NULL, 10);
    eo->submit_group_bytes = mb ? (uint64_t)mb << 20 : UINT64_MAX;
  }
}

/* The lossy codecs' shape: 16 tokens of 8 KV heads of 128 (the Qwen3-4B
 * shapes' pieces: [K|V] of a layer is 64 KiB); other shapes take lossless
 * only. */
#define LOSSY_TOKENS 16
#define LOSSY_HEADS 8
#define LOSSY_HEAD_DIM 128

static bool lossy_fits(const shape *sh) { return strstr(sh->name, "qwen3-4b") != NULL; }

static void codec_options(const bench_env *env, oi_engine_options *eo) {
  eo->codec = oi__codec_name(env->codec);
  if (env->codec >= OI_CODEC_INT8) {
    eo->codec_tokens = LOSSY_TOKENS;
    eo->codec_heads = LOSSY_HEADS;
    eo->codec_head_dim = LOSSY_HEAD_DIM;
  }
}

/* Block b's host block (its arenas' slices in order, as the engine's slots
 * hold them) from or into an image of the region. */
static void host_block(const setup *s, uint8_t *image, uint64_t b, uint8_t *blk, bool gather) {
  uint32_t segs = s->sh->kv_halves ? 2 : 1;
  uint64_t hoff = 0;
  for (uint32_t a = 0; a < s->narenas; a++)
    for (uint32_t g = 0; g < segs; g++) {
      uint64_t at = (uint64_t)((uint8_t *)s->arenas[a].base - s->region) +
                    (uint64_t)s->ids[b] * s->arenas[a].block_stride +
                    (s->sh->kv_halves ? s->seg_offsets[2 * a + g] : 0);
      uint64_t n = s->arenas[a].bytes_per_block;
      if (gather)
        memcpy(blk + hoff, image + at, n);
      else
        memcpy(image + at, blk + hoff, n);
      hoff += n;
    }
}

/* The region's content: the fill pattern, or (--content corpus) the corpus
 * tiled; with a codec or the corpus, what a load must give back. */
static bool fill_region(bench_env *env, setup *s) {
  if (!env->corpus && env->codec == OI_CODEC_NONE) {
    env->dev->ops->mem_fill_pattern(env->dev, s->region, s->region_bytes, 3);
    return true;
  }
  uint8_t *img = malloc(s->region_bytes);
  if (!img) return false;
  if (env->corpus) {
    for (uint64_t i = 0; i < s->region_bytes;) {
      uint64_t at = i % env->corpus->bytes,
               n = OI_MIN(s->region_bytes - i, (uint64_t)env->corpus->bytes - at);
      memcpy(img + i, env->corpus->data + at, n);
      i += n;
    }
  } else {
    for (uint64_t i = 0; i < s->region_bytes; i++)
      img[i] = oi__pattern_byte(3, i);
  }
  if (env->dev->ops->mem_copy(env->dev, s->region, img, s->region_bytes) != OI_OK) {
    free(img);
    return false;
  }
  s->content = s->expect = img;
  if (env->codec >= OI_CODEC_INT8) { /* each block through the codec and back */
    if (!(img = malloc(s->region_bytes))) return false;
    memcpy(img, s->content, s->region_bytes);
    s->expect = img;
    oi_codec_shape sh = {
        .dtype = OI_CODEC_DTYPE_BF16,
        .parts = (uint16_t)(s->block_bytes / (2ull * LOSSY_TOKENS * LOSSY_HEADS * LOSSY_HEAD_DIM)),
        .tokens = LOSSY_TOKENS,
        .heads = LOSSY_HEADS,
        .head_dim = LOSSY_HEAD_DIM};
    size_t cap = oi__codec_bound(env->codec, &sh, s->block_bytes), fb = 0, ob = 0;
    uint8_t *blk = malloc(s->block_bytes), *frame = malloc(cap ? cap : 1);
    bool ok = blk && frame && cap;
    for (uint64_t b = 0; ok && b < s->sh->blocks; b++) {
      host_block(s, img, b, blk, true);
      ok = oi__codec_encode(env->codec, &sh, blk, s->block_bytes, frame, cap, &fb) == OI_OK &&
           oi__codec_decode(frame, fb, blk, s->block_bytes, &ob) == OI_OK;
      host_block(s, img, b, blk, false);
    }
    free(blk);
    free(frame);
    if (!ok) {
      fprintf(stderr, "bench: %s round trip of a block: %s\n", oi__codec_name(env->codec),
              oi_last_error());
      return false;
    }
  }
  return true;
}

static bool setup_shape(bench_env *env, const shape *sh, setup *s) {
  memset(s, 0, sizeof *s);
  s->sh = sh;
  uint32_t segs = sh->kv_halves ? 2 : 1;
  for (uint32_t g = 0; g < sh->groups; g++) {
    s->narenas += sh->count[g];
    s->block_bytes += segs * sh->count[g] * sh->bpb[g];
  }
  s->total = s->block_bytes * sh->blocks;
  s->region_bytes = s->total;
  s->arenas = calloc(s->narenas, sizeof *s->arenas);
  s->names = calloc(s->narenas, sizeof *s->names);
  s->seg_offsets = calloc(2 * (size_t)s->narenas, sizeof *s->seg_offsets);
  s->ids = calloc(sh->blocks, sizeof *s->ids);
  s->hashes = calloc(sh->blocks, sizeof *s->hashes);
  if (!s->arenas || !s->names || !s->seg_offsets || !s->ids || !s->hashes) return false;
  if (env->dev->ops->mem_alloc(env->dev, s->region_bytes, 0, (void **)&s->region) != OI_OK)
    return false;
  uint64_t off = 0, in_page = 0;
  uint32_t a = 0;
  for (uint32_t g = 0; g < sh->groups; g++)
    for (uint32_t i = 0; i < sh->count[g]; i++, a++) {
      snprintf(s->names[a], sizeof s->names[a], "a%u", a);
      oi_arena_desc *d = &s->arenas[a];
      d->name = s->names[a];
      d->num_blocks = sh->blocks;
      d->bytes_per_block = sh->bpb[g];
      d->segments = segs;
      if (sh->kv_halves) { /* the layer's K half, then its V half */
        d->base = s->region + off;
        d->block_stride = sh->bpb[g];
        s->seg_offsets[2 * a] = 0;
        s->seg_offsets[2 * a + 1] = sh->bpb[g] * sh->blocks;
        off += 2 * sh->bpb[g] * sh->blocks;
      } else if (sh->page_first) {
        d->base = s->region + in_page;
        d->block_stride = s->block_bytes;
        in_page += sh->bpb[g];
      } else {
        d->base = s->region + off;
        d->block_stride = sh->bpb[g];
        off += sh->bpb[g] * sh->blocks;
      }
    }
  uint64_t x = 42;
  for (uint64_t b = 0; b < sh->blocks; b++)
    s->ids[b] = (int64_t)b;
  for (uint64_t b = sh->blocks - 1; b > 0; b--) { /* shuffle */
    uint64_t j = splitmix(&x) % (b + 1);
    int64_t t = s->ids[b];
    s->ids[b] = s->ids[j];
    s->ids[j] = t;
  }
  if (!fill_region(env, s)) return false;
  oi_host_options ho;
  oi_host_options_init(&ho);
  uint64_t slot = (s->block_bytes + 255) & ~255ull;
  ho.chunk_bytes = slot * 8 > (64ull << 20) ? slot * 8 : (64ull << 20) / slot * slot;
  ho.pool_bytes = ((sh->blocks + 8) * slot / ho.chunk_bytes + 2) * ho.chunk_bytes;
  ho.device = env->device;
  ho.high_watermark = 1.0f; /* no background eviction during measurements */
  ho.low_watermark = 1.0f;
  if (oi_host_create(&ho, &s->host) != OI_OK) return false;
  for (int m = 0; m < NMODES; m++) {
    oi_engine_options eo;
    oi_engine_options_init(&eo);
    eo.device = env->device;
    eo.namespace_id = "bench";
    eo.arenas = s->arenas;
    eo.num_arenas = s->narenas;
    if (sh->kv_halves) {
      eo.segment_offsets = s->seg_offsets;
      eo.num_segment_offsets = 2 * s->narenas;
    }
    eo.copy_mode = m < 2    ? OI_COPY_KERNEL
                   : m == 2 ? OI_COPY_DMA
                   : m == 3 ? OI_COPY_AUTO
                            : OI_COPY_STAGED;
    eo.copy_cta_limit = m == 0 ? 132 : 0;
    env_tuning(&eo);
    codec_options(env, &eo);
    if (oi_engine_create(s->host, &eo, &s->eng[m]) != OI_OK) return false;
  }
  return true;
}

/* The shape's pieces (block x arena x segment, in block order) between the
 * arenas and a host copy laid out as the engine's slots are: each block's
 * bytes contiguous, blocks one after another from `host`. n pieces. */
static bench_piece *shape_pieces(const setup *s, oi_copy_dir dir, uint8_t *host, size_t *n) {
  uint32_t segs = s->sh->kv_halves ? 2 : 1;
  *n = (size_t)s->sh->blocks * s->narenas * segs;
  bench_piece *d = calloc(*n, sizeof *d);
  if (!d) return NULL;
  size_t k = 0;
  for (uint64_t b = 0; b < s->sh->blocks; b++) {
    uint64_t hoff = b * s->block_bytes;
    for (uint32_t a = 0; a < s->narenas; a++)
      for (uint32_t g = 0; g < segs; g++) {
        uintptr_t dv = (uintptr_t)s->arenas[a].base +
                       (uint64_t)s->ids[b] * s->arenas[a].block_stride +
                       (s->sh->kv_halves ? s->seg_offsets[2 * a + g] : 0);
        uintptr_t hs = (uintptr_t)host + hoff;
        hoff += s->arenas[a].bytes_per_block;
        d[k++] = dir == OI_COPY_D2H ? (bench_piece){dv, hs, s->arenas[a].bytes_per_block}
                                    : (bench_piece){hs, dv, s->arenas[a].bytes_per_block};
      }
  }
  return d;
}

/* Raw device-layer copies: the bulk ceiling (one piece) and the naive loop
 * (one cudaMemcpyAsync per block x arena). Returns GB/s (median). */
static double raw_copy_gbps(bench_env *env, setup *s, oi_copy_dir dir, bool bulk, uint8_t *host) {
  void *st = NULL;
  if (bench_cuda_stream_create(env->device, &st) != 0) {
    bench_cuda_stream_destroy(st);
    return 0;
  }
  size_t n = 1;
  bench_piece *d = bulk ? calloc(1, sizeof *d) : shape_pieces(s, dir, host, &n);
  if (!d) {
    bench_cuda_stream_destroy(st);
    return 0;
  }
  if (bulk)
    d[0] = dir == OI_COPY_D2H ? (bench_piece){(uintptr_t)s->region, (uintptr_t)host, s->total}
                              : (bench_piece){(uintptr_t)host, (uintptr_t)s->region, s->total};
  double v[16];
  int reps = env->reps;
  for (int r = -1; r < reps; r++) { /* r = -1: warm-up */
    uint64_t t0 = oi__now_ns();
    bench_cuda_piecewise(st, d, n);
    if (r >= 0) v[r] = (double)s->total / (double)(oi__now_ns() - t0);
  }
  free(d);
  bench_cuda_stream_destroy(st);
  return median(v, reps);
}

/* The device layer alone (no engine, no host tier): the shape's pieces
 * handed to one of its streams in mode `mode`, in groups of about
 * OI_KERNEL_GROUP_BYTES as the engine's pipeline hands them, then a wait
 * for the stream. What the copy path can do with the bytes where they are,
 * against which the engine's figures show the cost of its CPU side.
 * Returns GB/s (median); 0 when it could not run. */
static double layer_copy_gbps(bench_env *env, setup *s, oi_copy_dir dir, uint32_t mode,
                              uint8_t *host) {
  size_t n = 0;
  bench_piece *d = shape_pieces(s, dir, host, &n);
  oi_stream *st = NULL;
  if (!d || env->dev->ops->stream_create(env->dev, dir == OI_COPY_H2D, &st) != OI_OK) {
    free(d);
    return 0;
  }
  oi_copy_desc *descs = calloc(n, sizeof *descs);
  if (!descs) {
    env->dev->ops->stream_destroy(st);
    free(d);
    return 0;
  }
  for (size_t i = 0; i < n; i++)
    descs[i] = (oi_copy_desc){.src = d[i].src, .dst = d[i].dst, .bytes = d[i].bytes};
  free(d);
  size_t group = (size_t)(OI_KERNEL_GROUP_BYTES / (s->total / n)) + 1;
  oi_copy_params p = {.mode = mode, .host_mapped = true};
  double v[16];
  int reps = env->reps;
  bool ok = true;
  for (int r = -1; r < reps && ok; r++) { /* r = -1: warm-up */
    uint64_t t0 = oi__now_ns();
    for (size_t at = 0; at < n && ok; at += group)
      ok = env->dev->ops->stream_copy(st, dir, descs + at, n - at < group ? n - at : group, &p) ==
           OI_OK;
    ok = env->dev->ops->stream_sync(st) == OI_OK && ok;
    if (r >= 0) v[r] = (double)s->total / (double)(oi__now_ns() - t0);
  }
  if (!ok) fprintf(stderr, "bench: device-layer copy failed: %s\n", oi_last_error());
  free(descs);
  env->dev->ops->stream_destroy(st);
  return ok ? median(v, reps) : 0;
}

/* Save of every block + wait; GB/s, and the median time of the save call
 * alone in us (the CPU's part: reserving, planning, queuing). */
static double engine_save_gbps(bench_env *env, setup *s, int m, double *call_us) {
  double v[16], call[16];
  for (int r = -1; r < env->reps; r++) {
    oi_host_evict_all(s->host, NULL);
    fresh_hashes(s);
    oi_ticket *t = NULL;
    uint64_t t0 = oi__now_ns();
    oi_status st = oi_engine_save(s->eng[m], s->ids, s->hashes, s->sh->blocks, NULL, &t);
    uint64_t t_call = oi__now_ns();
    if (st != OI_OK || oi_ticket_wait(t, 60000) != OI_OK) {
      fprintf(stderr, "bench: save failed: %s\n", oi_last_error());
      oi_ticket_release(t);
      return 0;
    }
    uint64_t dt = oi__now_ns() - t0;
    oi_ticket_release(t);
    if (r >= 0) {
      v[r] = (double)s->total / (double)dt;
      call[r] = (double)(t_call - t0) / 1e3;
    }
  }
  *call_us = median(call, env->reps);
  return median(v, env->reps);
}

/* Query + load of the first `nblocks` saved blocks; returns GB/s of the load
 * (load call to completion) and the median query+load+wait time in us. */
static double engine_load_gbps(bench_env *env, setup *s, int m, uint64_t nblocks,
                               double *restore_us, double *submit_us) {
  double v[64], lat[64], sub[64];
  int reps = restore_us ? (env->reps * 4 < 64 ? env->reps * 4 : 64) : env->reps;
  uint64_t bytes = nblocks * s->block_bytes;
  for (int r = -1; r < reps; r++) {
    oi_query_result q = {.struct_size = sizeof q};
    uint64_t t0 = oi__now_ns();
    if (oi_engine_query(s->eng[m], NULL, s->hashes, nblocks, 0, &q) != OI_OK ||
        q.hit_blocks != nblocks) {
      fprintf(stderr, "bench: query found %llu of %llu blocks: %s\n",
              (unsigned long long)q.hit_blocks, (unsigned long long)nblocks, oi_last_error());
      if (q.hit_blocks) oi_engine_release(s->eng[m], q.lease);
      return 0;
    }
    if (r == reps - 1 && !restore_us) {
      /* Last run: wipe the arenas first, so the verification that follows
       * proves this load put every byte back. */
      env->dev->ops->mem_fill_pattern(env->dev, s->region, s->region_bytes, 99);
    }
    uint64_t t1 = oi__now_ns();
    oi_ticket *t = NULL;
    oi_status lst = oi_engine_load(s->eng[m], q.lease, s->ids, nblocks, NULL, &t);
    uint64_t t_sub = oi__now_ns();
    if (lst != OI_OK || oi_ticket_wait(t, 60000) != OI_OK) {
      fprintf(stderr, "bench: load failed: %s\n", oi_last_error());
      oi_ticket_release(t);
      return 0;
    }
    uint64_t t2 = oi__now_ns();
    oi_ticket_release(t);
    if (r >= 0) {
      sub[r] = (double)(t_sub - t1) / 1e3;
      v[r] = (double)bytes / (double)(t2 - t1);
      lat[r] = (double)(t2 - t0) / 1e3;
    }
  }
  if (restore_us) *restore_us = median(lat, reps);
  if (submit_us) *submit_us = median(sub, reps);
  return median(v, reps);
}

/* Puts the content back (the raw copies overwrite the region). */
static void refill(bench_env *env, setup *s) {
  if (!env->corpus && env->codec == OI_CODEC_NONE) {
    env->dev->ops->mem_fill_pattern(env->dev, s->region, s->region_bytes, 3);
    return;
  }
  env->dev->ops->mem_copy(env->dev, s->region, s->content, s->region_bytes);
}

/* Verifies the last load: the saved blocks came back byte-exact. */
static bool verify_round_trip(bench_env *env, setup *s) {
  uint8_t *h = malloc(s->region_bytes);
  if (!h) return false;
  bool ok = env->dev->ops->mem_copy(env->dev, h, s->region, s->region_bytes) == OI_OK;
  if (s->expect) /* every byte: the codec's round trip of the content */
    ok = ok && memcmp(h, s->expect, s->region_bytes) == 0;
  for (uint64_t i = 0; ok && !s->expect && i < s->region_bytes; i += 4093)
    ok = h[i] == oi__pattern_byte(3, i);
  free(h);
  return ok;
}

typedef struct interference_job {
  setup *s;
  int mode;
  atomic_bool stop;
  atomic_uint_fast64_t bytes;
} interference_job;

static void *save_loop(void *arg) {
  interference_job *j = arg;
  while (!atomic_load(&j->stop)) {
    oi_host_evict_all(j->s->host, NULL);
    fresh_hashes(j->s);
    oi_ticket *t = NULL;
    if (oi_engine_save(j->s->eng[j->mode], j->s->ids, j->s->hashes, j->s->sh->blocks, NULL, &t) !=
        OI_OK)
      break;
    oi_ticket_wait(t, 60000);
    oi_ticket_release(t);
    atomic_fetch_add(&j->bytes, j->s->total);
  }
  return NULL;
}

static void usage(FILE *f) {
  fprintf(f, "usage: openinfer bench transfer [--device N] [--reps N] [--quick] [--shape NAME]...\n"
             "                                [--bandwidth-only] [--json] [--codec NAME]\n"
             "                                [--content pattern|corpus] [--corpus FILE]\n"
             "\n"
             "Measures save/load bandwidth of real KV layouts through the engine API against the\n"
             "bulk pinned memcpy ceiling, a per-piece cudaMemcpyAsync loop and the device layer's\n"
             "copy paths alone (no engine, no host tier), the restore latency\n"
             "of 22 GLM5.2-shaped blocks, and compute interference. Needs a GPU.\n"
             "\n"
             "  --quick           the three model shapes only\n"
             "  --shape NAME      this shape only (repeatable): glm5.2, qwen3-4b, vllm-qwen3-4b,\n"
             "                    pages-4k, pages-42k\n"
             "  --bandwidth-only  skip the restore-latency and interference sections\n"
             "  --codec NAME      the engines' namespace codec: none (default), lossless, int8,\n"
             "                    int8-hadamard, fp8 (lossy: the Qwen3-4B shapes); logical bytes\n"
             "  --content KIND    pattern (default) or corpus: the real-KV corpus tiled\n"
             "  --corpus FILE     the corpus (default tests/data/kvcorpus/kv.bin)\n"
             "  OI_CODEC_DECODE=host, OI_CODEC_ENCODE=host (environment): loads decode, saves\n"
             "                    encode on the host, not the GPU\n"
             "  OI_STAGING_MB, OI_SUBMIT_GROUP_MB (environment): staging size and submit groups\n"
             "                    (set as oi_engine_options.staging_bytes, submit_group_bytes)\n");
}

static bool env_is_host(const char *var) {
  const char *v = getenv(var);
  return v && strcmp(v, "host") == 0;
}

int bench_transfer(int argc, char **argv) {
  bench_env env = {.device = 0, .reps = 5};
  static const struct option longopts[] = {{"device", required_argument, 0, 'd'},
                                           {"reps", required_argument, 0, 'r'},
                                           {"quick", no_argument, 0, 'q'},
                                           {"bandwidth-only", no_argument, 0, 'b'},
                                           {"shape", required_argument, 0, 's'},
                                           {"json", no_argument, 0, 'j'},
                                           {"codec", required_argument, 0, 'c'},
                                           {"content", required_argument, 0, 'C'},
                                           {"corpus", required_argument, 0, 'K'},
                                           {"help", no_argument, 0, 'h'},
                                           {0, 0, 0, 0}};
  const char *content = "pattern", *corpus_path = NULL;
  bench_disk_corpus corpus = {0};
  optind = 1;
  int c;
  long v;
  bool only[NSHAPES] = {false}, any_only = false;
  while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
    switch (c) {
    case 'd':
      if (!cli_parse_int(optarg, 0, 1023, &v)) return CLI_USAGE;
      env.device = (int)v;
      break;
    case 'r':
      if (!cli_parse_int(optarg, 1, 15, &v)) return CLI_USAGE;
      env.reps = (int)v;
      break;
    case 'q': env.quick = true; break;
    case 's': {
      size_t i = 0;
      while (i < NSHAPES && strcmp(shapes[i].name, optarg) != 0)
        i++;
      if (i == NSHAPES) {
        fprintf(stderr, "openinfer bench transfer: no shape '%s' (--help lists them)\n", optarg);
        return CLI_USAGE;
      }
      only[i] = true;
      any_only = true;
      break;
    }
    case 'b': env.bandwidth_only = true; break;
    case 'j': env.json = true; break;
    case 'c':
      env.codec = oi__codec_from_name(optarg);
      if (env.codec < 0) {
        fprintf(stderr,
                "openinfer bench transfer: --codec %s: not a codec (none, lossless, int8, "
                "int8-hadamard, fp8)\n",
                optarg);
        return CLI_USAGE;
      }
      break;
    case 'C':
      if (strcmp(optarg, "pattern") != 0 && strcmp(optarg, "corpus") != 0) {
        fprintf(stderr, "openinfer bench transfer: --content %s: 'pattern' or 'corpus'\n", optarg);
        return CLI_USAGE;
      }
      content = optarg;
      break;
    case 'K': corpus_path = optarg; break;
    case 'h': usage(stdout); return CLI_OK;
    default: usage(stderr); return CLI_USAGE;
    }
  }
  int ndev = 0;
  oi_device_count(&ndev);
  if (env.device >= ndev) {
    fprintf(stderr, "openinfer bench transfer: needs a CUDA device (%d visible)\n", ndev);
    return CLI_FAILED;
  }
  if (strcmp(content, "corpus") == 0) {
    if (bench_disk_corpus_load(corpus_path, &corpus) != 0) return CLI_FAILED;
    env.corpus = &corpus;
  }
  if (oi__dev_open(env.device, &env.dev) != OI_OK) {
    fprintf(stderr, "openinfer bench transfer: %s\n", oi_last_error());
    bench_disk_corpus_free(&corpus);
    return CLI_FAILED;
  }
  oi_device_info info = {.struct_size = sizeof info};
  oi_device_get_info(env.device, &info);
  FILE *out = stdout;
  if (!env.json)
    fprintf(out,
            "bench transfer on %s (%u SMs); median of %d runs, GB/s; codec %s (loads decoded "
            "on the %s, lossless saves encoded on the %s), content %s\n\n",
            info.name, info.multiprocessors, env.reps, oi__codec_name(env.codec),
            env_is_host("OI_CODEC_DECODE") ? "host" : "device",
            env_is_host("OI_CODEC_ENCODE") ? "host" : "device",
            env.corpus ? env.corpus->path : "pattern");
  else
    fprintf(out, "{\"device\":\"%s\",\"codec\":\"%s\",\"content\":\"%s\",\"shapes\":[", info.name,
            oi__codec_name(env.codec), env.corpus ? "corpus" : "pattern");
  int rc = CLI_OK;
  double glm_bulk_h2d = 0;
  setup glm = {0}, other = {0};
  size_t nshapes = env.quick ? 3 : NSHAPES;
  bool first = true;
  for (size_t si = 0; si < nshapes; si++) {
    if (any_only && !only[si]) continue;
    if (env.codec >= OI_CODEC_INT8 && !lossy_fits(&shapes[si])) {
      if (!env.json)
        fprintf(out,
                "%s: skipped (codec %s takes the Qwen3-4B shapes: 16 tokens x 8 heads x 128)\n\n",
                shapes[si].name, oi__codec_name(env.codec));
      continue;
    }
    setup s;
    if (!setup_shape(&env, &shapes[si], &s)) {
      fprintf(stderr, "bench: setting up %s failed: %s\n", shapes[si].name, oi_last_error());
      setup_free(&env, &s);
      rc = CLI_FAILED;
      continue;
    }
    oi_pinned scratch;
    if (env.dev->ops->pinned_alloc(env.dev, s.total, 0, -1, &scratch) != OI_OK) {
      setup_free(&env, &s);
      rc = CLI_FAILED;
      continue;
    }
    double bulk_d2h = raw_copy_gbps(&env, &s, OI_COPY_D2H, true, scratch.host);
    double bulk_h2d = raw_copy_gbps(&env, &s, OI_COPY_H2D, true, scratch.host);
    refill(&env, &s); /* bulk H2D overwrote it */
    double piece_d2h = raw_copy_gbps(&env, &s, OI_COPY_D2H, false, scratch.host);
    double piece_h2d = raw_copy_gbps(&env, &s, OI_COPY_H2D, false, scratch.host);
    double layer_kernel_d2h = layer_copy_gbps(&env, &s, OI_COPY_D2H, OI_XFER_KERNEL, scratch.host);
    double layer_kernel_h2d = layer_copy_gbps(&env, &s, OI_COPY_H2D, OI_XFER_KERNEL, scratch.host);
    double layer_staged_d2h = layer_copy_gbps(&env, &s, OI_COPY_D2H, OI_XFER_STAGED, scratch.host);
    double layer_staged_h2d = layer_copy_gbps(&env, &s, OI_COPY_H2D, OI_XFER_STAGED, scratch.host);
    refill(&env, &s);
    env.dev->ops->pinned_free(env.dev, &scratch);
    double save[NMODES], load[NMODES], submit[NMODES], save_call[NMODES];
    bool verified = true;
    for (int m = 0; m < NMODES; m++) {
      /* Each mode saves the content itself, not the last mode's restore: a
       * lossy codec need not give its own round trip back when it encodes
       * it again (int8-hadamard does not; docs/codecs.md). */
      if (m) refill(&env, &s);
      save[m] = engine_save_gbps(&env, &s, m, &save_call[m]);
      load[m] = engine_load_gbps(&env, &s, m, s.sh->blocks, NULL, &submit[m]);
      verified = verified && verify_round_trip(&env, &s);
    }
    if (!verified) rc = CLI_FAILED;
    if (env.json) {
      fprintf(
          out,
          "%s{\"shape\":\"%s\",\"arenas\":%u,\"blocks\":%llu,\"block_bytes\":%llu,\"bytes\":%llu,"
          "\"bulk_d2h\":%.2f,\"bulk_h2d\":%.2f,\"piecewise_d2h\":%.2f,\"piecewise_h2d\":%.2f,"
          "\"layer_kernel_d2h\":%.2f,\"layer_kernel_h2d\":%.2f,\"layer_staged_d2h\":%.2f,"
          "\"layer_staged_h2d\":%.2f,",
          first ? "" : ",", s.sh->name, s.narenas, (unsigned long long)s.sh->blocks,
          (unsigned long long)s.block_bytes, (unsigned long long)s.total, bulk_d2h, bulk_h2d,
          piece_d2h, piece_h2d, layer_kernel_d2h, layer_kernel_h2d, layer_staged_d2h,
          layer_staged_h2d);
      for (int m = 0; m < NMODES; m++)
        fprintf(out,
                "\"save_%s\":%.2f,\"load_%s\":%.2f,\"save_submit_us_%s\":%.1f,"
                "\"load_submit_us_%s\":%.1f,",
                mode_names[m], save[m], mode_names[m], load[m], mode_names[m], save_call[m],
                mode_names[m], submit[m]);
      fprintf(out, "\"verified\":%s}", verified ? "true" : "false");
    } else {
      fprintf(out, "%s: %u arenas, %llu blocks of %llu B (%.0f MiB)%s\n", s.sh->name, s.narenas,
              (unsigned long long)s.sh->blocks, (unsigned long long)s.block_bytes,
              (double)s.total / (1 << 20), verified ? "" : "  ** RESTORED BYTES DIFFER **");
      fprintf(out, "  %-26s %8s %8s %10s %10s\n", "", "save", "load", "save/bulk", "load/bulk");
      fprintf(out, "  %-26s %8.2f %8.2f %10s %10s\n", "bulk cudaMemcpyAsync", bulk_d2h, bulk_h2d,
              "1.00", "1.00");
      fprintf(out, "  %-26s %8.2f %8.2f %10.2f %10.2f\n", "per-piece cudaMemcpyAsync", piece_d2h,
              piece_h2d, piece_d2h / bulk_d2h, piece_h2d / bulk_h2d);
      fprintf(out, "  %-26s %8.2f %8.2f %10.2f %10.2f\n", "device layer alone, kernel",
              layer_kernel_d2h, layer_kernel_h2d, layer_kernel_d2h / bulk_d2h,
              layer_kernel_h2d / bulk_h2d);
      fprintf(out, "  %-26s %8.2f %8.2f %10.2f %10.2f\n", "device layer alone, staged",
              layer_staged_d2h, layer_staged_h2d, layer_staged_d2h / bulk_d2h,
              layer_staged_h2d / bulk_h2d);
      for (int m = 0; m < NMODES; m++)
        fprintf(out,
                "  engine %-19s %8.2f %8.2f %10.2f %10.2f   (%.1fx / %.1fx per-piece; calls: "
                "save %.0f us, load %.0f us)\n",
                mode_names[m], save[m], load[m], save[m] / bulk_d2h, load[m] / bulk_h2d,
                save[m] / piece_d2h, load[m] / piece_h2d, save_call[m], submit[m]);
      fprintf(out, "\n");
    }
    first = false;
    if (si == 0) {
      glm = s;
      glm_bulk_h2d = bulk_h2d;
    } else if (!glm.sh && !other.sh && !env.bandwidth_only) {
      other = s; /* a lossy codec's shape: the interference section's */
    } else {
      setup_free(&env, &s);
    }
  }
  if (env.json) fprintf(out, "]");

  /* Restore latency: 22 GLM5.2-shaped blocks (76 MB). */
  if (glm.sh && !env.bandwidth_only) {
    oi_host_evict_all(glm.host, NULL);
    fresh_hashes(&glm);
    oi_ticket *t = NULL;
    oi_engine_save(glm.eng[3], glm.ids, glm.hashes, glm.sh->blocks, NULL, &t);
    oi_ticket_wait(t, 60000);
    oi_ticket_release(t);
    double lat_auto = 0, lat_kernel = 0;
    engine_load_gbps(&env, &glm, 3, 22, &lat_auto, NULL);
    engine_load_gbps(&env, &glm, 0, 22, &lat_kernel, NULL);
    double bytes = 22.0 * (double)glm.block_bytes;
    double target = 1.2 * bytes / (glm_bulk_h2d * 1e3) + 150.0;
    if (env.json)
      fprintf(out,
              ",\"restore_22_glm\":{\"bytes\":%.0f,\"auto_us\":%.1f,\"kernel132_us\":%.1f,\"bulk_"
              "us\":%.1f,\"target_us\":%.1f}",
              bytes, lat_auto, lat_kernel, bytes / (glm_bulk_h2d * 1e3), target);
    else
      fprintf(out,
              "restore latency, query+load+wait of 22 GLM5.2 blocks (%.1f MB): default %.0f us, "
              "kernel-132 %.0f us;"
              "\n  bulk H2D of the same bytes %.0f us (default: %.2fx bulk's rate); target <= "
              "%.0f us: %s\n\n",
              bytes / 1e6, lat_auto, lat_kernel, bytes / (glm_bulk_h2d * 1e3),
              bytes / (glm_bulk_h2d * 1e3) / lat_auto, target,
              (lat_auto <= target || lat_kernel <= target) ? "met" : "MISSED");
  }
  /* Interference: on the GLM5.2 shape, else (a lossy codec) the first shape run. */
  setup *is = glm.sh ? &glm : other.sh ? &other : NULL;
  if (is && !env.bandwidth_only) {
    /* a compute-bound kernel stream alone, then with saves running */
    uint32_t sms = info.multiprocessors, iters = 20000, count = 50;
    uint64_t t0 = oi__now_ns();
    bench_cuda_spin(env.device, sms * 4, iters, count);
    double per_kernel = (double)(oi__now_ns() - t0) / count;
    count = (uint32_t)(1.5e9 / per_kernel) + 1;
    t0 = oi__now_ns();
    bench_cuda_spin(env.device, sms * 4, iters, count);
    double alone = count / ((double)(oi__now_ns() - t0) / 1e9);
    if (!env.json)
      fprintf(out,
              "compute interference, saves of %s (compute-bound stream alone: %.0f kernels/s)\n",
              is->sh->name, alone);
    else
      fprintf(out, ",\"interference\":{\"shape\":\"%s\",\"alone_kps\":%.1f", is->sh->name, alone);
    /* modes: staged (the default for this layout), dma, kernel with several CTA limits */
    const struct {
      const char *name;
      uint32_t mode, ctas;
    } runs[] = {
        {"staged (default policy)", OI_COPY_STAGED, 0}, {"staged, 32 CTAs", OI_COPY_STAGED, 32},
        {"staged, 8 CTAs", OI_COPY_STAGED, 8},          {"dma", OI_COPY_DMA, 0},
        {"kernel, 132 CTAs", OI_COPY_KERNEL, 132},      {"kernel, 32 CTAs", OI_COPY_KERNEL, 32},
        {"kernel, 8 CTAs", OI_COPY_KERNEL, 8},          {"kernel, 4 CTAs", OI_COPY_KERNEL, 4}};
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
      oi_engine_options eo;
      oi_engine_options_init(&eo);
      eo.device = env.device;
      eo.namespace_id = "bench";
      eo.arenas = is->arenas;
      eo.num_arenas = is->narenas;
      eo.copy_mode = runs[i].mode;
      eo.copy_cta_limit = runs[i].ctas;
      env_tuning(&eo);
      codec_options(&env, &eo);
      oi_engine *e = NULL;
      if (oi_engine_create(is->host, &eo, &e) != OI_OK) continue;
      oi_engine *saved = is->eng[1];
      is->eng[1] = e;
      interference_job j = {.s = is, .mode = 1};
      pthread_t th;
      pthread_create(&th, NULL, save_loop, &j);
      usleep(100000);
      uint64_t b0 = atomic_load(&j.bytes);
      t0 = oi__now_ns();
      bench_cuda_spin(env.device, sms * 4, iters, count);
      double dt = (double)(oi__now_ns() - t0);
      uint64_t b1 = atomic_load(&j.bytes);
      atomic_store(&j.stop, true);
      pthread_join(th, NULL);
      is->eng[1] = saved;
      oi_engine_destroy(e);
      double with = count / (dt / 1e9), gbps = (double)(b1 - b0) / dt;
      if (env.json)
        fprintf(out, ",\"%s\":{\"kept\":%.4f,\"save_gbps\":%.2f}", runs[i].name, with / alone,
                gbps);
      else
        fprintf(out, "  saves by %-26s compute kept %5.1f%%  (slowdown %4.1f%%), saves %.1f GB/s\n",
                runs[i].name, 100.0 * with / alone, 100.0 * (1.0 - with / alone), gbps);
    }
    if (env.json) fprintf(out, "}");
  }
  if (glm.sh) setup_free(&env, &glm);
  if (other.sh) setup_free(&env, &other);
  if (env.json) fprintf(out, "}\n");
  oi__dev_close(env.dev);
  bench_disk_corpus_free(&corpus);
  return rc;
}
