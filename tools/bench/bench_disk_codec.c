/* `openinfer bench disk --content corpus [--codec LIST]`: the spill and
 * restore phases through an engine of each codec (codec namespaces,
 * docs/codecs.md), beside codec none in the same run. The real-KV corpus is
 * tiled into the blocks (random bytes do not compress, and hold NaN and
 * infinity patterns the lossy codecs refuse); a block is a whole number of
 * corpus pages, and the lossy codecs' shape is the pages' [tokens][heads]
 * [head_dim] (each page K and V: two parts).
 *
 * Each codec gets its own cpu host and disk store (dir/codec, removed after):
 *  spill:   first save until the disk tier has written every block;
 *  restore: the pool emptied, query(wait) until every block is in the pool
 *           (frames read from disk), then one load into the arena (decoded);
 *  check:   every block loaded (none, lossless: byte-exact; int8, fp8: every
 *           element finite and within the format's bound);
 *  bytes:   logical (blocks x block), physical (the disk tier's bytes_used),
 *           and the blocks 1 GiB of disk holds at that many bytes a block.
 * Rates are in logical bytes. Timed regions hold only what is measured. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench.h"
#include "bench_disk.h"
#include "codec/codec.h"
#include "core/core.h"

static int fail(const char *what) {
  fprintf(stderr, "openinfer bench disk: %s\n", what);
  return -1;
}

static int fail_api(const char *codec, const char *what) {
  fprintf(stderr, "openinfer bench disk: codec %s: %s: %s\n", codec, what, oi_last_error());
  return -1;
}

static double ratio(double a, double b) { return b > 0 ? a / b : 0.0; }

/* ---- options --------------------------------------------------------------------- */

int bench_disk_codec_list(const char *list, bool want[BENCH_DISK_CODECS]) {
  memset(want, 0, BENCH_DISK_CODECS * sizeof *want);
  if (!list || !*list) return fail("--codec: an empty list (give none, lossless, int8, fp8)");
  const char *p = list;
  for (;;) {
    const char *end = strchr(p, ',');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    char name[32];
    if (len == 0) {
      fprintf(stderr, "openinfer bench disk: --codec '%s': an empty name in the list\n", list);
      return -1;
    }
    snprintf(name, sizeof name, "%.*s", (int)(len < sizeof name - 1 ? len : sizeof name - 1), p);
    int id = len < sizeof name ? oi__codec_from_name(name) : -1;
    if (id < 0 || id >= BENCH_DISK_CODECS) {
      fprintf(stderr,
              "openinfer bench disk: --codec: '%.*s' is not one of none, lossless, int8, fp8\n",
              (int)len, p);
      return -1;
    }
    if (want[id]) {
      fprintf(stderr, "openinfer bench disk: --codec '%s': %s is listed twice\n", list, name);
      return -1;
    }
    want[id] = true;
    if (!end) break;
    p = end + 1;
  }
  want[OI_CODEC_NONE] = true; /* the baseline of every ratio */
  return 0;
}

/* ---- the corpus ------------------------------------------------------------------ */

/* The number after `"key":` in a JSON text (keys of the manifest are
 * unique); -1 when absent. */
static long json_number(const char *json, const char *key) {
  char pat[64];
  snprintf(pat, sizeof pat, "\"%s\"", key);
  const char *k = strstr(json, pat);
  if (!k) return -1;
  k += strlen(pat);
  while (*k == ' ' || *k == '\t' || *k == '\n' || *k == '\r')
    k++;
  if (*k++ != ':') return -1;
  char *end;
  long v = strtol(k, &end, 10);
  return end == k ? -1 : v;
}

int bench_disk_corpus_load(const char *path, bench_disk_corpus *c) {
  memset(c, 0, sizeof *c);
  if (!path) path = bench_corpus_default(c->path, sizeof c->path);
  if (!path) {
    fprintf(stderr,
            "openinfer bench disk: --content corpus: no corpus at tests/data/kvcorpus/kv.bin "
            "(under the current directory or this build's source tree); give --corpus FILE\n");
    return -1;
  }
  if (path != c->path) snprintf(c->path, sizeof c->path, "%s", path);
  errno = 0;
  c->data = bench_read_file(c->path, &c->bytes);
  if (!c->data) {
    fprintf(stderr, "openinfer bench disk: --content corpus: cannot read the corpus %s: %s\n",
            c->path, errno ? strerror(errno) : "empty file");
    return -1;
  }
  /* The page shape, from manifest.json beside it (as tools/kvcorpus writes it). */
  const char *slash = strrchr(c->path, '/');
  snprintf(c->manifest, sizeof c->manifest, "%.*smanifest.json",
           slash ? (int)(slash - c->path + 1) : 0, c->path);
  size_t mlen = 0;
  char *m = (char *)bench_read_file(c->manifest, &mlen);
  char *mz = m ? realloc(m, mlen + 1) : NULL;
  if (!mz) {
    free(m);
    fprintf(stderr,
            "openinfer bench disk: --content corpus: cannot read %s (the corpus's page shape)\n",
            c->manifest);
    bench_disk_corpus_free(c);
    return -1;
  }
  mz[mlen] = '\0';
  long tokens = json_number(mz, "block_tokens"), heads = json_number(mz, "kv_heads");
  long head_dim = json_number(mz, "head_dim"), page = json_number(mz, "page_bytes");
  free(mz);
  if (tokens < 1 || heads < 1 || head_dim < 1 || tokens > 65535 || heads > 65535 ||
      head_dim > 65535 || page != 2 * tokens * heads * head_dim * 2) {
    fprintf(stderr,
            "openinfer bench disk: %s: block_tokens %ld, kv_heads %ld, head_dim %ld, page_bytes "
            "%ld are not pages of [K|V][tokens][heads][head_dim] bf16\n",
            c->manifest, tokens, heads, head_dim, page);
    bench_disk_corpus_free(c);
    return -1;
  }
  if (c->bytes % (size_t)page) {
    fprintf(stderr,
            "openinfer bench disk: %s: %zu bytes are not whole pages of %ld bytes (%s says)\n",
            c->path, c->bytes, page, c->manifest);
    bench_disk_corpus_free(c);
    return -1;
  }
  c->tokens = (uint32_t)tokens;
  c->heads = (uint32_t)heads;
  c->head_dim = (uint32_t)head_dim;
  c->page_bytes = (uint32_t)page;
  return 0;
}

void bench_disk_corpus_free(bench_disk_corpus *c) {
  free(c->data);
  c->data = NULL;
}

/* Byte `off` of the working set is corpus byte off mod its length. */
static void tile(const bench_disk_corpus *c, uint8_t *dst, uint64_t off, uint64_t len) {
  while (len) {
    uint64_t at = off % c->bytes, k = OI_MIN(len, (uint64_t)c->bytes - at);
    memcpy(dst, c->data + at, (size_t)k);
    dst += k;
    off += k;
    len -= k;
  }
}

/* ---- the check ------------------------------------------------------------------- */

static float bf16(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* One page loaded through a lossy codec against its original: the elements
 * not finite or past the format's bound (int8: half a step of the scale per
 * token and head; fp8: half a unit in the last of 3 mantissa bits, or half
 * the smallest subnormal step of the scale per part and head; plus the
 * bf16 rounding of the decoded value: tests/codec/test_corpus.c's bound). */
static uint64_t lossy_page(int codec, const bench_disk_corpus *c, const uint16_t *x,
                           const uint16_t *got, double *err2, double *ref2) {
  uint64_t bad = 0;
  const uint32_t T = c->tokens, H = c->heads, D = c->head_dim;
  for (uint32_t part = 0; part < 2; part++)
    for (uint32_t h = 0; h < H; h++) {
      float amax_ph = 0;
      for (uint32_t t = 0; t < T; t++)
        for (uint32_t d = 0; d < D; d++)
          amax_ph = fmaxf(amax_ph, fabsf(bf16(x[(((size_t)part * T + t) * H + h) * D + d])));
      for (uint32_t t = 0; t < T; t++) {
        size_t off = (((size_t)part * T + t) * H + h) * D;
        float amax_th = 0;
        for (uint32_t d = 0; d < D; d++)
          amax_th = fmaxf(amax_th, fabsf(bf16(x[off + d])));
        for (uint32_t d = 0; d < D; d++) {
          double v = bf16(x[off + d]), g = bf16(got[off + d]), e = fabs(g - v), bound;
          if (codec == OI_CODEC_INT8)
            bound = 0.5 * amax_th / 127.0 * 1.001 + fabs(g) / 256.0;
          else
            bound = fmax(fabs(v) / 16.0, amax_ph / 448.0 / 1024.0) * 1.001 + fabs(g) / 256.0;
          if (!isfinite(g) || !(e <= bound)) bad++;
          if (isfinite(g)) {
            *err2 += e * e;
            *ref2 += v * v;
          }
        }
      }
    }
  return bad;
}

/* Every block of the arena against the corpus tiled: wrong blocks counted. */
static void check_blocks(int codec, const bench_disk_corpus *c, const uint8_t *arena, uint64_t n,
                         uint64_t block_bytes, uint8_t *want, bench_disk_codec_row *r) {
  double err2 = 0, ref2 = 0;
  for (uint64_t b = 0; b < n; b++) {
    const uint8_t *got = arena + b * block_bytes;
    tile(c, want, b * block_bytes, block_bytes);
    bool wrong;
    if (codec <= OI_CODEC_LOSSLESS) {
      wrong = memcmp(got, want, (size_t)block_bytes) != 0;
    } else {
      uint64_t bad = 0;
      for (uint64_t p = 0; p < block_bytes; p += c->page_bytes)
        bad += lossy_page(codec, c, (const uint16_t *)(want + p), (const uint16_t *)(got + p),
                          &err2, &ref2);
      r->elements_past_bound += bad;
      wrong = bad != 0;
    }
    r->wrong_blocks += wrong;
    r->checked_blocks++;
  }
  r->rel_rms = ref2 > 0 ? sqrt(err2 / ref2) : 0.0;
}

/* ---- one codec ------------------------------------------------------------------- */

static int one_codec(int codec, const char *dir, uint64_t n, uint64_t block_bytes,
                     const bench_disk_corpus *c, uint8_t *arena, const oi_block_hash *hs,
                     uint8_t *want, bench_disk_codec_row *r) {
  const char *name = oi__codec_name(codec);
  memset(r, 0, sizeof *r);
  r->codec = codec;
  r->blocks = n;
  r->logical_bytes = n * block_bytes;
  oi_host *host = NULL;
  oi_engine *eng = NULL;
  int64_t *dst = NULL;
  int rc = -1;
  oi_host_options ho;
  oi_host_options_init(&ho);
  ho.device = OI_DEVICE_CPU;
  ho.flags = OI_HOST_NO_PIN;
  ho.pool_bytes = r->logical_bytes + OI_MAX(r->logical_bytes / 8, 64ull << 20);
  ho.high_watermark = ho.low_watermark = 1.0f; /* nothing evicted before it is on disk */
  if (oi_host_create(&ho, &host) != OI_OK) return fail_api(name, "host create");
  oi_host_disk_options d;
  oi_host_disk_options_init(&d);
  const char *dirs[1] = {dir};
  d.dirs = dirs;
  d.num_dirs = 1;
  d.capacity_bytes = 2 * r->logical_bytes + (64ull << 20);
  if (oi_host_attach_disk(host, &d) != OI_OK) {
    fail_api(name, "attach_disk");
    goto out;
  }
  oi_arena_desc ad = {.name = "kv",
                      .base = arena,
                      .num_blocks = n,
                      .bytes_per_block = block_bytes,
                      .block_stride = block_bytes,
                      .segments = 1};
  oi_engine_options eo;
  oi_engine_options_init(&eo);
  eo.namespace_id = "bench-disk-codec";
  eo.arenas = &ad;
  eo.num_arenas = 1;
  eo.codec = name;
  if (codec != OI_CODEC_NONE) { /* lossless: the shape lets it code a table per part */
    eo.codec_tokens = c->tokens;
    eo.codec_heads = c->heads;
    eo.codec_head_dim = c->head_dim;
  }
  if (oi_engine_create(host, &eo, &eng) != OI_OK) {
    fail_api(name, "engine create");
    goto out;
  }
  tile(c, arena, 0, r->logical_bytes);

  /* spill */
  fprintf(stderr, "codec %s: spill of %llu blocks through the pool to %s\n", name,
          (unsigned long long)n, dir);
  uint64_t t0 = oi__now_ns(), t1, t2;
  if (bench_disk_save_all(eng, hs, n, 0) != 0) goto out;
  if (oi_engine_flush(eng, BENCH_DISK_WAIT_MS) != OI_OK) {
    fail_api(name, "flush");
    goto out;
  }
  oi_engine_stats es = {.struct_size = sizeof es};
  if (oi_engine_get_stats(eng, &es) != OI_OK) {
    fail_api(name, "engine stats");
    goto out;
  }
  if (es.saves_failed || es.saves_dropped) {
    fprintf(stderr,
            "openinfer bench disk: codec %s: %llu of %llu saves failed and %llu were dropped "
            "(a lossless frame larger than its slot is not stored: is the content compressible?)\n",
            name, (unsigned long long)es.saves_failed, (unsigned long long)n,
            (unsigned long long)es.saves_dropped);
    goto out;
  }
  if (bench_disk_wait_spilled(host, n, &t1) != 0) goto out;
  r->spill_s = (double)(t1 - t0) / 1e9;
  r->spill_gbps = (double)r->logical_bytes / (double)(t1 - t0);
  oi_host_namespace_stats ns = {.struct_size = sizeof ns};
  oi_host_disk_stats ds;
  if (oi_host_get_namespace_stats(host, 0, &ns) != OI_OK) {
    fail_api(name, "namespace stats");
    goto out;
  }
  if (bench_disk_stats(host, &ds) != 0) goto out;
  if (ds.blocks != n) {
    fprintf(stderr, "openinfer bench disk: codec %s: the disk holds %llu of %llu blocks\n", name,
            (unsigned long long)ds.blocks, (unsigned long long)n);
    goto out;
  }
  r->stored_bytes = ns.stored_bytes;
  r->physical_bytes = ds.bytes_used;
  r->blocks_per_gib =
      ds.bytes_used ? (uint64_t)((double)(1ull << 30) * (double)n / (double)ds.bytes_used) : 0;

  /* restore: frames from disk into the pool, then one load decodes them */
  if (bench_disk_empty_pool(host) != 0) goto out;
  memset(arena, 0, (size_t)r->logical_bytes);
  dst = calloc(n, sizeof *dst);
  if (!dst) {
    fail("out of memory");
    goto out;
  }
  for (uint64_t b = 0; b < n; b++)
    dst[b] = (int64_t)b;
  fprintf(stderr, "codec %s: restore of %llu blocks (query with OI_QUERY_WAIT_PENDING, load)\n",
          name, (unsigned long long)n);
  oi_lease lease;
  oi_ticket *t = NULL;
  t0 = oi__now_ns();
  if (bench_disk_query_all(eng, hs, n, &lease) < 0) goto out;
  t1 = oi__now_ns();
  oi_status st = oi_engine_load(eng, lease, dst, n, NULL, &t);
  if (st == OI_OK) st = oi_ticket_wait(t, BENCH_DISK_WAIT_MS);
  t2 = oi__now_ns();
  oi_ticket_release(t);
  oi_engine_release(eng, lease); /* (consumed by the load: unknown is fine) */
  if (st != OI_OK) {
    fail_api(name, "load");
    goto out;
  }
  r->restore_s = (double)(t1 - t0) / 1e9;
  r->load_s = (double)(t2 - t1) / 1e9;
  r->restore_gbps = (double)r->logical_bytes / (double)(t1 - t0);
  r->restore_load_gbps = (double)r->logical_bytes / (double)(t2 - t0);
  if (bench_disk_stats(host, &ds) != 0) goto out;
  r->promote_failed = ds.promote_failed;
  r->checksum_failures = ds.checksum_failures;
  check_blocks(codec, c, arena, n, block_bytes, want, r); /* untimed */
  rc = 0;
out:
  free(dst);
  oi_engine_destroy(eng);
  oi_host_destroy(host);
  bench_disk_remove_store(dir);
  return rc;
}

int bench_disk_codec_run(const char *dir, uint64_t bytes, uint64_t block_bytes,
                         const bench_disk_corpus *c, const bool want[BENCH_DISK_CODECS],
                         bench_disk_codec_row rows[BENCH_DISK_CODECS], int *nrows) {
  *nrows = 0;
  if (!c->page_bytes || block_bytes % c->page_bytes || block_bytes % 4096)
    return fail("codec rows: the block is not a whole number of corpus pages and 4 KiB");
  char sub[600];
  snprintf(sub, sizeof sub, "%s/codec", dir);
  if (mkdir(sub, 0700) != 0 && errno != EEXIST) {
    fprintf(stderr, "openinfer bench disk: mkdir %s: %s\n", sub, strerror(errno));
    return -1;
  }
  uint64_t n = bytes / block_bytes;
  uint8_t *arena = oi__aligned_alloc(4096, (size_t)(n * block_bytes));
  uint8_t *scratch = malloc((size_t)block_bytes);
  oi_block_hash *hs = calloc(n, sizeof *hs);
  int rc = 0;
  if (!arena || !scratch || !hs) {
    rc = fail("out of memory (codec rows)");
  } else {
    for (uint64_t b = 0; b < n; b++)
      hs[b] = bench_disk_hash(4, b);
    for (int k = 0; k < BENCH_DISK_CODECS && rc == 0; k++)
      if (want[k]) {
        rc = one_codec(k, sub, n, block_bytes, c, arena, hs, scratch, &rows[*nrows]);
        if (rc == 0) (*nrows)++;
      }
  }
  oi__free(arena);
  free(scratch);
  free(hs);
  rmdir(sub);
  return rc;
}

/* ---- report ---------------------------------------------------------------------- */

void bench_disk_codec_print_table(const bench_disk_corpus *c, uint64_t block_bytes,
                                  const bench_disk_codec_row *rows, int n) {
  if (n == 0) return;
  const bench_disk_codec_row *z = &rows[0]; /* none */
  printf("\n4. codecs: %.1f MB of the real-KV corpus tiled into %llu blocks of %llu pages\n"
         "   (%llu B; a page [K|V][%u][%u][%u] bf16), each codec its own host and store,\n"
         "   beside none; GB/s in logical bytes; phys/log: the disk tier's bytes (extents,\n"
         "   headers, padding) over the blocks' bytes\n   corpus %s\n",
         (double)z->logical_bytes / 1e6, (unsigned long long)z->blocks,
         (unsigned long long)(block_bytes / c->page_bytes), (unsigned long long)block_bytes,
         c->tokens, c->heads, c->head_dim, c->path);
  printf("  %-9s %9s %8s %7s %6s %7s %6s %7s %6s %8s %6s %10s\n", "codec", "slot B", "phys/log",
         "spill", "/none", "restore", "/none", "+load", "/none", "GiB hold", "/none", "wrong");
  for (int i = 0; i < n; i++) {
    const bench_disk_codec_row *r = &rows[i];
    printf("  %-9s %9llu %8.3f %7.3f %6.3f %7.3f %6.3f %7.3f %6.3f %8llu %6.3f %4llu of %llu\n",
           oi__codec_name(r->codec), (unsigned long long)r->stored_bytes,
           ratio((double)r->physical_bytes, (double)r->logical_bytes), r->spill_gbps,
           ratio(r->spill_gbps, z->spill_gbps), r->restore_gbps,
           ratio(r->restore_gbps, z->restore_gbps), r->restore_load_gbps,
           ratio(r->restore_load_gbps, z->restore_load_gbps), (unsigned long long)r->blocks_per_gib,
           ratio((double)r->blocks_per_gib, (double)z->blocks_per_gib),
           (unsigned long long)r->wrong_blocks, (unsigned long long)r->checked_blocks);
  }
  printf("   (restore: query(wait) until every block is in the pool; +load: and the load that\n"
         "    decodes them into the arena. GiB hold: blocks 1 GiB of disk holds at the measured\n"
         "    bytes a block. wrong: none, lossless not byte-exact; int8, fp8 an element past\n"
         "    the format's bound or not finite");
  printf(")\n");
  for (int i = 0; i < n; i++)
    if (rows[i].codec >= OI_CODEC_INT8)
      printf("   %s: %llu elements past the bound, relative RMS error %.4f\n",
             oi__codec_name(rows[i].codec), (unsigned long long)rows[i].elements_past_bound,
             rows[i].rel_rms);
}

void bench_disk_codec_print_json(const bench_disk_corpus *c, uint64_t block_bytes,
                                 const bench_disk_codec_row *rows, int n) {
  printf(",\"content\":\"corpus\",\"corpus\":{\"path\":\"");
  for (const char *s = c->path; *s; s++)
    if (*s == '"' || *s == '\\')
      printf("\\%c", *s);
    else if ((unsigned char)*s >= 0x20)
      putchar(*s);
  printf("\",\"page_bytes\":%u,\"tokens\":%u,\"heads\":%u,\"head_dim\":%u"
         ",\"block_pages\":%llu}",
         c->page_bytes, c->tokens, c->heads, c->head_dim,
         (unsigned long long)(block_bytes / c->page_bytes));
  const bench_disk_codec_row *z = &rows[0];
  printf(",\"codecs\":[");
  for (int i = 0; i < n; i++) {
    const bench_disk_codec_row *r = &rows[i];
    printf("%s{\"codec\":\"%s\",\"blocks\":%llu,\"block_bytes\":%llu,\"logical_bytes\":%llu"
           ",\"stored_bytes\":%llu,\"physical_bytes\":%llu,\"physical_ratio\":%.4f",
           i ? "," : "", oi__codec_name(r->codec), (unsigned long long)r->blocks,
           (unsigned long long)block_bytes, (unsigned long long)r->logical_bytes,
           (unsigned long long)r->stored_bytes, (unsigned long long)r->physical_bytes,
           ratio((double)r->physical_bytes, (double)r->logical_bytes));
    printf(",\"spill_s\":%.4f,\"spill_gbps\":%.4f,\"spill_vs_none\":%.4f"
           ",\"restore_s\":%.4f,\"restore_gbps\":%.4f,\"restore_vs_none\":%.4f"
           ",\"load_s\":%.4f,\"restore_load_gbps\":%.4f,\"restore_load_vs_none\":%.4f",
           r->spill_s, r->spill_gbps, ratio(r->spill_gbps, z->spill_gbps), r->restore_s,
           r->restore_gbps, ratio(r->restore_gbps, z->restore_gbps), r->load_s,
           r->restore_load_gbps, ratio(r->restore_load_gbps, z->restore_load_gbps));
    printf(",\"blocks_per_gib\":%llu,\"capacity_vs_none\":%.4f,\"checked_blocks\":%llu"
           ",\"wrong_blocks\":%llu,\"elements_past_bound\":%llu,\"rel_rms\":%.5f"
           ",\"promote_failed\":%llu,\"checksum_failures\":%llu}",
           (unsigned long long)r->blocks_per_gib,
           ratio((double)r->blocks_per_gib, (double)z->blocks_per_gib),
           (unsigned long long)r->checked_blocks, (unsigned long long)r->wrong_blocks,
           (unsigned long long)r->elements_past_bound, r->rel_rms,
           (unsigned long long)r->promote_failed, (unsigned long long)r->checksum_failures);
  }
  printf("]");
}
