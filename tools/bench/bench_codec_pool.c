/* `openinfer bench codec`'s pool phase: the codecs through an embedded cpu
 * engine and its host pool (codec namespaces, docs/codecs.md), beside the
 * same run's codec "none": save and load rates in logical bytes (the copy
 * pipeline's codec stage: gather, encode, slot; slot, verify, decode,
 * scatter), every loaded page compared with the codec's round trip of it,
 * and the blocks a pool of half the working set holds. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "codec/codec.h"
#include "core/core.h"
#include "openinfer/openinfer.h"

#define PAGE 12288u
#define RUN 256 /* blocks a call */

static int api_fail(const char *what) {
  fprintf(stderr, "openinfer bench codec: pool: %s: %s\n", what, oi_last_error());
  return -1;
}

static oi_status open_engine(int codec, uint64_t pool, uint8_t *mem, uint64_t blocks, oi_host **h,
                             oi_engine **e) {
  oi_host_options ho;
  oi_host_options_init(&ho);
  ho.pool_bytes = pool;
  ho.chunk_bytes = 1ull << 20;
  ho.flags |= OI_HOST_NO_PIN;
  ho.high_watermark = ho.low_watermark = 1.0f; /* no background eviction: full is full */
  oi_status st = oi_host_create(&ho, h);
  if (st != OI_OK) return st;
  oi_arena_desc ad = {.name = "kv",
                      .base = mem,
                      .num_blocks = blocks,
                      .bytes_per_block = PAGE,
                      .block_stride = PAGE,
                      .segments = 1};
  oi_engine_options eo;
  oi_engine_options_init(&eo);
  eo.namespace_id = "bench-codec";
  eo.arenas = &ad;
  eo.num_arenas = 1;
  eo.codec = oi__codec_name(codec);
  if (codec >= OI_CODEC_INT8) {
    eo.codec_tokens = 16;
    eo.codec_heads = 3;
    eo.codec_head_dim = 64;
  }
  st = oi_engine_create(*h, &eo, e);
  if (st != OI_OK) {
    oi_host_destroy(*h);
    *h = NULL;
  }
  return st;
}

static oi_status wait_call(oi_status st, oi_ticket *t) {
  if (st != OI_OK) return st;
  st = oi_ticket_wait(t, 120000);
  oi_ticket_release(t);
  return st;
}

/* Saves blocks [0, n) of their hashes RUN at a time. */
static oi_status save_all(oi_engine *e, const int64_t *ids, const oi_block_hash *hs, size_t n) {
  for (size_t at = 0; at < n; at += RUN) {
    size_t k = n - at < RUN ? n - at : RUN;
    oi_ticket *t = NULL;
    oi_status st = oi_engine_save(e, ids + at, hs + at, k, NULL, &t);
    st = wait_call(st, t);
    if (st != OI_OK) return st;
  }
  return OI_OK;
}

/* Loads blocks [0, n) into [n, 2n), RUN at a time; *hits counts them. */
static oi_status load_all(oi_engine *e, const oi_block_hash *hs, size_t n, size_t *hits) {
  *hits = 0;
  int64_t dst[RUN];
  for (size_t at = 0; at < n; at += RUN) {
    size_t k = n - at < RUN ? n - at : RUN;
    oi_query_result q = {.struct_size = sizeof q};
    oi_status st = oi_engine_query(e, NULL, hs + at, k, 0, &q);
    if (st != OI_OK) return st;
    if (!q.hit_blocks) continue;
    for (size_t j = 0; j < q.hit_blocks; j++)
      dst[j] = (int64_t)(n + at + j);
    oi_ticket *t = NULL;
    st = oi_engine_load(e, q.lease, dst, q.hit_blocks, NULL, &t);
    st = wait_call(st, t);
    if (st != OI_OK) return st;
    *hits += q.hit_blocks;
  }
  return OI_OK;
}

/* Pages of mem[n..2n) that are not the codec's round trip of mem[0..n). */
static size_t count_wrong(int codec, const uint8_t *mem, size_t n) {
  oi_codec_shape sh = {OI_CODEC_DTYPE_BF16, 2, 16, 3, 64};
  static uint8_t frame[2 * PAGE], want[PAGE];
  size_t bad = 0;
  for (size_t b = 0; b < n; b++) {
    const uint8_t *page = mem + b * PAGE;
    size_t fb = 0, ob = 0;
    if (codec <= OI_CODEC_LOSSLESS)
      memcpy(want, page, PAGE);
    else if (oi__codec_encode(codec, &sh, page, PAGE, frame, sizeof frame, &fb) != OI_OK ||
             oi__codec_decode(frame, fb, want, PAGE, &ob) != OI_OK)
      return n;
    bad += memcmp(mem + (n + b) * PAGE, want, PAGE) != 0;
  }
  return bad;
}

typedef struct pass {
  double save_s, load_s;
  size_t hits;
  oi_host_namespace_stats ns;
} pass;

/* One engine over a pool of `pool` bytes: saves blocks [0, n) and, with
 * `load`, loads them into [n, 2n); the namespace's stats after. */
static int run_pass(int codec, uint64_t pool, uint8_t *mem, const int64_t *ids,
                    const oi_block_hash *hs, size_t n, bool load, pass *p) {
  oi_host *h = NULL;
  oi_engine *e = NULL;
  memset(p, 0, sizeof *p);
  p->ns.struct_size = sizeof p->ns;
  if (open_engine(codec, pool, mem, 2 * n, &h, &e) != OI_OK) return api_fail("engine");
  memset(mem + n * PAGE, 0, n * PAGE);
  uint64_t t0 = oi__now_ns();
  oi_status st = save_all(e, ids, hs, n);
  p->save_s = (double)(oi__now_ns() - t0) / 1e9;
  t0 = oi__now_ns();
  if (st == OI_OK && load) st = load_all(e, hs, n, &p->hits);
  p->load_s = (double)(oi__now_ns() - t0) / 1e9;
  if (st == OI_OK) st = oi_host_get_namespace_stats(h, 0, &p->ns);
  oi_engine_destroy(e);
  oi_host_destroy(h);
  return st == OI_OK ? 0 : api_fail(oi__codec_name(codec));
}

int bench_codec_pool(const uint8_t *corpus, size_t clen, uint64_t work_bytes, int reps,
                     bench_codec_pool_row rows[OI_CODEC_COUNT]) {
  size_t n = work_bytes / PAGE;
  uint8_t *mem = malloc(2 * n * PAGE);
  int64_t *ids = malloc(n * sizeof *ids);
  oi_block_hash *hs = malloc(n * sizeof *hs);
  int rc = -1;
  if (!mem || !ids || !hs) {
    fprintf(stderr, "openinfer bench codec: pool: out of memory\n");
    goto out;
  }
  for (size_t off = 0; off < n * PAGE; off += clen)
    memcpy(mem + off, corpus, n * PAGE - off < clen ? n * PAGE - off : clen);
  for (size_t i = 0; i < n; i++) {
    ids[i] = (int64_t)i;
    memset(&hs[i], 0, sizeof hs[i]);
    memcpy(hs[i].bytes, &i, sizeof i);
    hs[i].bytes[15] = 0xc0;
  }
  for (int c = 0; c < OI_CODEC_COUNT; c++) {
    bench_codec_pool_row *r = &rows[c];
    memset(r, 0, sizeof *r);
    r->codec = c;
    double best_save = 1e30, best_load = 1e30;
    for (int rep = 0; rep < reps; rep++) {
      pass p;
      /* room for every block: the rates */
      if (run_pass(c, n * PAGE + (64ull << 20), mem, ids, hs, n, true, &p) != 0) goto out;
      best_save = p.save_s < best_save ? p.save_s : best_save;
      best_load = p.load_s < best_load ? p.load_s : best_load;
      r->stored_bytes = p.ns.stored_bytes;
      r->ratio = p.ns.physical_bytes ? (double)p.ns.logical_bytes / (double)p.ns.physical_bytes : 0;
      r->loaded = p.hits;
      r->wrong = p.hits == n ? count_wrong(c, mem, n) : n;
    }
    r->save_gbps = (double)(n * PAGE) / best_save / 1e9;
    r->load_gbps = (double)(n * PAGE) / best_load / 1e9;
    /* capacity: a pool of half the working set, filled past it */
    pass p;
    if (run_pass(c, n * PAGE / 2, mem, ids, hs, n, false, &p) != 0) goto out;
    r->capacity_blocks = p.ns.blocks_resident;
  }
  rc = 0;
out:
  free(mem);
  free(ids);
  free(hs);
  return rc;
}
