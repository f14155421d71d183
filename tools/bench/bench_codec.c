/* `openinfer bench codec`: the KV block codecs (lib/codec) on the cpu, over
 * the committed real-KV corpus (tests/data/kvcorpus/kv.bin): each codec's
 * ratio per unit (aggregate, p10, worst) and its encode and decode rate in
 * logical bytes per second on one thread, beside memcpy of the same bytes
 * between the same buffers in the same run. The corpus is tiled into a
 * working set larger than the caches (--bytes), as a pool's blocks are. */
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "cli.h"
#include "codec/codec.h"
#include "core/core.h"

typedef struct codec_cfg {
  const char *corpus;
  uint64_t unit, bytes;
  int reps;
  bool json;
} codec_cfg;

typedef struct codec_row {
  int codec;
  bool planes; /* lossless frames of the planes code (docs/codecs.md) */
  double agg, p10, worst, enc_gbps, dec_gbps, enc_cpu_gbps, dec_cpu_gbps;
  size_t units;
  bool exact;
} codec_row;

static void usage(FILE *f) {
  fprintf(f,
          "usage: openinfer bench codec [--corpus FILE] [--unit SIZE] [--bytes SIZE] [--quick]\n"
          "                             [--json]\n"
          "\n"
          "The KV block codecs on the cpu over the real-KV corpus, one thread:\n"
          "  ratio of each codec per unit (aggregate, p10, worst over the corpus's units;\n"
          "  \"planes\": lossless frames of the planes code, docs/codecs.md),\n"
          "  encode and decode rates in logical GB/s over --bytes of the corpus tiled,\n"
          "  beside memcpy of the same bytes between the same buffers (best of 3 each).\n"
          "\n"
          "  --corpus FILE  pages of [K|V][16][3][64] bf16 (default: tests/data/kvcorpus/kv.bin\n"
          "                 under the current directory or the source tree of this build)\n"
          "  --unit SIZE    bytes per frame: 6144 (K or V of one layer and block), 12288\n"
          "                 (both: the default), or a multiple of 12288\n"
          "  --bytes SIZE   working set of the rate phase (default 64M)\n"
          "  --quick        a 8M working set, one repetition\n"
          "  --json         one JSON line on stdout instead of the table\n");
}

uint8_t *bench_read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *b = n > 0 ? malloc((size_t)n) : NULL;
  if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
    free(b);
    b = NULL;
  }
  fclose(f);
  *len = b ? (size_t)n : 0;
  return b;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static oi_codec_shape unit_shape(uint64_t unit) {
  if (unit == 6144) return (oi_codec_shape){OI_CODEC_DTYPE_BF16, 1, 16, 3, 64};
  return (oi_codec_shape){OI_CODEC_DTYPE_BF16, (uint16_t)(unit / 6144), 16, 3, 64};
}

static double secs_since(uint64_t t0) { return (double)(oi__now_ns() - t0) / 1e9; }

/* This thread's cpu time: on a shared machine the wall clock counts the
 * other programs' turns too, so rates are given per cpu second as well. */
static uint64_t cpu_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* A row's name: the codec's, or "planes" for lossless frames of the
 * planes code. */
static const char *row_name(const codec_row *row) {
  return row->planes ? "planes" : oi__codec_name(row->codec);
}

static oi_status encode_unit(const codec_row *row, const oi_codec_shape *sh, const void *src,
                             size_t unit, void *dst, size_t cap, size_t *fb) {
  return row->planes ? oi__codec_encode_planes(sh, src, unit, dst, cap, fb)
                     : oi__codec_encode(row->codec, sh, src, unit, dst, cap, fb);
}

/* One codec (row->codec, row->planes): ratios over the corpus, rates over
 * the tiled working set. */
static int run_codec(const codec_cfg *cfg, const uint8_t *corpus, size_t clen, const uint8_t *work,
                     size_t units, uint8_t *frames, uint8_t *back, codec_row *row) {
  const int codec = row->codec;
  oi_codec_shape sh = unit_shape(cfg->unit);
  size_t unit = cfg->unit, cap = oi__codec_bound(codec, &sh, unit);
  size_t *fb = calloc(units, sizeof *fb);
  size_t cu = clen / unit;
  double *r = calloc(cu, sizeof *r);
  if (!fb || !r) return -1;
  row->units = cu;
  size_t sum = 0, out;
  for (size_t i = 0; i < cu; i++) {
    if (encode_unit(row, &sh, corpus + i * unit, unit, frames, cap, &fb[0]) != OI_OK) goto fail;
    r[i] = (double)unit / (double)fb[0];
    sum += fb[0];
  }
  qsort(r, cu, sizeof *r, cmp_double);
  row->agg = (double)(cu * unit) / (double)sum;
  row->p10 = r[cu / 10];
  row->worst = r[0];
  double best_enc = 1e30, best_dec = 1e30, best_enc_cpu = 1e30, best_dec_cpu = 1e30;
  for (int rep = 0; rep < cfg->reps; rep++) {
    uint64_t c0 = cpu_ns(), t0 = oi__now_ns();
    for (size_t i = 0; i < units; i++)
      if (encode_unit(row, &sh, work + i * unit, unit, frames + i * cap, cap, &fb[i]) != OI_OK)
        goto fail;
    double te = secs_since(t0), ce = (double)(cpu_ns() - c0) / 1e9;
    c0 = cpu_ns();
    t0 = oi__now_ns();
    for (size_t i = 0; i < units; i++)
      if (oi__codec_decode(frames + i * cap, fb[i], back + i * unit, unit, &out) != OI_OK)
        goto fail;
    double td = secs_since(t0), cd = (double)(cpu_ns() - c0) / 1e9;
    best_enc = te < best_enc ? te : best_enc;
    best_dec = td < best_dec ? td : best_dec;
    best_enc_cpu = ce < best_enc_cpu ? ce : best_enc_cpu;
    best_dec_cpu = cd < best_dec_cpu ? cd : best_dec_cpu;
  }
  row->exact = codec != OI_CODEC_LOSSLESS || !memcmp(back, work, units * unit);
  row->enc_gbps = (double)(units * unit) / best_enc / 1e9;
  row->dec_gbps = (double)(units * unit) / best_dec / 1e9;
  row->enc_cpu_gbps = (double)(units * unit) / best_enc_cpu / 1e9;
  row->dec_cpu_gbps = (double)(units * unit) / best_dec_cpu / 1e9;
  free(fb);
  free(r);
  return 0;
fail:
  fprintf(stderr, "openinfer bench codec: %s: %s\n", row_name(row), oi_last_error());
  free(fb);
  free(r);
  return -1;
}

const char *bench_corpus_default(char *buf, size_t cap) {
  static const char rel[] = "tests/data/kvcorpus/kv.bin";
  if (access(rel, R_OK) == 0) return rel;
  /* beside a build tree: <src>/<build>/tools/openinfer-bench */
  char exe[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) return NULL;
  exe[n] = 0;
  char *slash = strrchr(exe, '/');
  if (!slash) return NULL;
  *slash = 0;
  snprintf(buf, cap, "%s/../../%s", exe, rel);
  return access(buf, R_OK) == 0 ? buf : NULL;
}

int bench_codec(int argc, char **argv) {
  static const struct option longopts[] = {{"corpus", required_argument, 0, 'c'},
                                           {"unit", required_argument, 0, 'u'},
                                           {"bytes", required_argument, 0, 'b'},
                                           {"quick", no_argument, 0, 'q'},
                                           {"json", no_argument, 0, 'j'},
                                           {"help", no_argument, 0, 'h'},
                                           {0, 0, 0, 0}};
  codec_cfg cfg = {.unit = 12288, .bytes = 64ull << 20, .reps = 3};
  bool bytes_set = false;
  optind = 1;
  int c;
  while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
    bool ok = true;
    switch (c) {
    case 'c': cfg.corpus = optarg; break;
    case 'u':
      ok = cli_parse_size(optarg, &cfg.unit) &&
           (cfg.unit == 6144 || (cfg.unit % 12288 == 0 && cfg.unit <= (12288ull << 10)));
      break;
    case 'b':
      ok = cli_parse_size(optarg, &cfg.bytes) && cfg.bytes >= (1ull << 20) &&
           cfg.bytes <= (4ull << 30);
      bytes_set = true;
      break;
    case 'q': cfg.reps = 1; break;
    case 'j': cfg.json = true; break;
    case 'h': usage(stdout); return CLI_OK;
    default: usage(stderr); return CLI_USAGE;
    }
    if (!ok) {
      cli_bad_value("openinfer bench codec", longopts, c, optarg);
      return CLI_USAGE;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "openinfer bench codec: unexpected argument '%s'\n", argv[optind]);
    return CLI_USAGE;
  }
  if (cfg.reps == 1 && !bytes_set) cfg.bytes = 8ull << 20;
  char pathbuf[PATH_MAX + 64];
  if (!cfg.corpus) cfg.corpus = bench_corpus_default(pathbuf, sizeof pathbuf);
  size_t clen = 0;
  uint8_t *corpus = cfg.corpus ? bench_read_file(cfg.corpus, &clen) : NULL;
  if (!corpus || clen < cfg.unit || clen % 12288) {
    fprintf(stderr, "openinfer bench codec: no corpus of 12288-byte pages at %s (--corpus FILE)\n",
            cfg.corpus ? cfg.corpus : "tests/data/kvcorpus/kv.bin");
    free(corpus);
    return CLI_FAILED;
  }
  clen -= clen % cfg.unit;
  size_t units = cfg.bytes / cfg.unit;
  size_t work_bytes = units * cfg.unit;
  oi_codec_shape sh = unit_shape(cfg.unit);
  size_t cap = oi__codec_bound(OI_CODEC_LOSSLESS, &sh, cfg.unit);
  uint8_t *work = malloc(work_bytes), *back = malloc(work_bytes), *frames = malloc(units * cap);
  if (!work || !back || !frames) {
    fprintf(stderr, "openinfer bench codec: out of memory\n");
    free(corpus);
    free(work);
    free(back);
    free(frames);
    return CLI_FAILED;
  }
  for (size_t off = 0; off < work_bytes; off += clen)
    memcpy(work + off, corpus, work_bytes - off < clen ? work_bytes - off : clen);
  memset(back, 0, work_bytes);
  memset(frames, 0, units * cap);
  /* the baseline: memcpy of the same bytes, best of the same repetitions */
  double best = 1e30, best_cpu = 1e30;
  for (int rep = 0; rep < cfg.reps; rep++) {
    uint64_t c0 = cpu_ns(), t0 = oi__now_ns();
    memcpy(back, work, work_bytes);
    double t = secs_since(t0), ct = (double)(cpu_ns() - c0) / 1e9;
    best = t < best ? t : best;
    best_cpu = ct < best_cpu ? ct : best_cpu;
  }
  double memcpy_gbps = (double)work_bytes / best / 1e9;
  double memcpy_cpu_gbps = (double)work_bytes / best_cpu / 1e9;
  /* every codec that frames, then lossless frames of the planes code */
  enum { CODECS = OI_CODEC_COUNT };
  codec_row rows[CODECS];
  int rc = CLI_OK;
  for (int k = 0; k < CODECS; k++) {
    rows[k] = (codec_row){.codec = k < CODECS - 1 ? OI_CODEC_LOSSLESS + k : OI_CODEC_LOSSLESS,
                          .planes = k == CODECS - 1};
    fprintf(stderr, "codec %s...\n", row_name(&rows[k]));
    if (run_codec(&cfg, corpus, clen, work, units, frames, back, &rows[k]) != 0) {
      rc = CLI_FAILED;
      break;
    }
    if (!rows[k].exact) {
      fprintf(stderr, "openinfer bench codec: %s round trip not byte-exact\n", row_name(&rows[k]));
      rc = CLI_FAILED;
    }
  }
  bench_codec_pool_row pool[OI_CODEC_COUNT];
  if (rc == CLI_OK) {
    fprintf(stderr, "codec namespaces through an engine and its pool...\n");
    if (bench_codec_pool(corpus, clen - clen % 12288, work_bytes - work_bytes % 12288, cfg.reps,
                         pool) != 0)
      rc = CLI_FAILED;
    for (int k = 0; rc == CLI_OK && k < OI_CODEC_COUNT; k++)
      if (pool[k].wrong) {
        fprintf(stderr, "openinfer bench codec: %s: %zu pages loaded wrong\n", oi__codec_name(k),
                pool[k].wrong);
        rc = CLI_FAILED;
      }
  }
  if (rc == CLI_OK) {
    if (cfg.json) {
      printf("{\"corpus\":\"%s\",\"unit_bytes\":%llu,\"corpus_units\":%zu,\"work_bytes\":%zu,"
             "\"memcpy_gbps\":%.3f,\"memcpy_cpu_gbps\":%.3f",
             cfg.corpus, (unsigned long long)cfg.unit, rows[0].units, work_bytes, memcpy_gbps,
             memcpy_cpu_gbps);
      for (int k = 0; k < CODECS; k++) {
        const char *n = row_name(&rows[k]);
        printf(",\"%s_ratio\":%.4f,\"%s_ratio_p10\":%.4f,\"%s_ratio_worst\":%.4f,"
               "\"%s_encode_gbps\":%.3f,\"%s_decode_gbps\":%.3f,"
               "\"%s_encode_cpu_gbps\":%.3f,\"%s_decode_cpu_gbps\":%.3f",
               n, rows[k].agg, n, rows[k].p10, n, rows[k].worst, n, rows[k].enc_gbps, n,
               rows[k].dec_gbps, n, rows[k].enc_cpu_gbps, n, rows[k].dec_cpu_gbps);
      }
      for (int k = 0; k < OI_CODEC_COUNT; k++) {
        const char *n = oi__codec_name(k);
        printf(",\"pool_%s_save_gbps\":%.3f,\"pool_%s_load_gbps\":%.3f,\"pool_%s_ratio\":%.4f,"
               "\"pool_%s_capacity_blocks\":%llu",
               n, pool[k].save_gbps, n, pool[k].load_gbps, n, pool[k].ratio, n,
               (unsigned long long)pool[k].capacity_blocks);
      }
      printf(",\"lossless_exact\":%s,\"planes_exact\":%s}\n", rows[0].exact ? "true" : "false",
             rows[CODECS - 1].exact ? "true" : "false");
    } else {
      printf("codecs on %s: %zu units of %llu B; rates over %zu MiB, one thread, in logical\n"
             "GB/s per second of wall clock and per second of this thread's cpu time\n",
             cfg.corpus, rows[0].units, (unsigned long long)cfg.unit, work_bytes >> 20);
      printf("%-13s %7s %7s %7s %9s %9s %9s %9s %8s %8s\n", "codec", "ratio", "p10", "worst",
             "enc wall", "dec wall", "enc cpu", "dec cpu", "enc/cpy", "dec/cpy");
      for (int k = 0; k < CODECS; k++)
        printf("%-13s %7.4f %7.4f %7.4f %9.3f %9.3f %9.3f %9.3f %8.3f %8.3f\n", row_name(&rows[k]),
               rows[k].agg, rows[k].p10, rows[k].worst, rows[k].enc_gbps, rows[k].dec_gbps,
               rows[k].enc_cpu_gbps, rows[k].dec_cpu_gbps, rows[k].enc_cpu_gbps / memcpy_cpu_gbps,
               rows[k].dec_cpu_gbps / memcpy_cpu_gbps);
      printf("%-13s %7s %7s %7s %9.3f %9.3f %9.3f %9.3f   (the baseline: same bytes, buffers)\n",
             "memcpy", "1", "", "", memcpy_gbps, memcpy_gbps, memcpy_cpu_gbps, memcpy_cpu_gbps);
      printf("\ncodec namespaces: an embedded cpu engine saves and loads %zu MiB of pages\n"
             "(logical GB/s, wall clock; every page loaded is the codec's round trip), then a\n"
             "pool of half that is filled past it (blocks it holds)\n",
             work_bytes >> 20);
      printf("%-13s %9s %9s %8s %8s %9s %7s %9s %8s\n", "codec", "save", "load", "save/no",
             "load/no", "slot B", "ratio", "capacity", "cap/no");
      for (int k = 0; k < OI_CODEC_COUNT; k++)
        printf("%-13s %9.3f %9.3f %8.3f %8.3f %9llu %7.3f %9llu %8.3f\n", oi__codec_name(k),
               pool[k].save_gbps, pool[k].load_gbps, pool[k].save_gbps / pool[0].save_gbps,
               pool[k].load_gbps / pool[0].load_gbps, (unsigned long long)pool[k].stored_bytes,
               pool[k].ratio, (unsigned long long)pool[k].capacity_blocks,
               (double)pool[k].capacity_blocks / (double)pool[0].capacity_blocks);
    }
  }
  free(corpus);
  free(work);
  free(back);
  free(frames);
  return rc;
}
