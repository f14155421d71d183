/* `openinfer bench <benchmark>`: measurements against the targets of
 * docs PERFORMANCE.md, each beside a baseline measured in the same run. A
 * table for people; with --json one machine-readable line on stdout. */
#include <getopt.h>
#include <stdio.h>
#include <string.h>
#include <sys/sysinfo.h>

#include "bench.h"
#include "cli.h"
#include "device/hostmem.h"
#include "openinfer/openinfer.h"

static int cmd_bench_host(int argc, char **argv);

typedef struct benchmark {
  const char *name;
  const char *summary;
  int (*run)(int argc, char **argv);
} benchmark;

static const benchmark benchmarks[] = {
    {"host",
     "the host tier on the cpu backend: index scale, query and save-call latency, batch\n"
     "           save/load against memcpy",
     cmd_bench_host},
    {"transfer",
     "save/load of real KV layouts on a GPU against bulk and per-piece memcpy,\n"
     "           restore latency, compute interference",
     bench_transfer},
    {"rpc",
     "the sidecar's query and save round trips over its socket, beside an embedded\n"
     "           engine",
     bench_rpc},
    {"ttft",
     "time to first token of the CUDA reference model (Qwen3-4B shape): cold prefill\n"
     "           vs host-tier restore, beside the GPU's matmul rate and bulk H2D",
     bench_ttft},
    {"disk",
     "the disk tier under a cpu host: spill and restore bandwidth against fio on the\n"
     "           same directory, restore latency of 22 GLM5.2 blocks, index replay",
     bench_disk},
    {"codec",
     "the KV block codecs on the cpu over the real-KV corpus: ratios (aggregate, p10,\n"
     "           worst) and encode/decode rates against memcpy",
     bench_codec},
    {"remote",
     "the cluster tier between two nodes on this machine: cross-node restore against a\n"
     "           plain TCP stream, directory lookup latency, the cost per evicted block",
     bench_remote},
};

static void bench_usage(FILE *f) {
  fprintf(f, "usage: openinfer bench <benchmark> [<options>]\n\nbenchmarks:\n");
  for (size_t i = 0; i < sizeof benchmarks / sizeof benchmarks[0]; i++)
    fprintf(f, "  %-8s %s\n", benchmarks[i].name, benchmarks[i].summary);
  fprintf(f, "\nRun 'openinfer bench <benchmark> --help' for its options.\n");
}

static void host_usage(FILE *f) {
  fprintf(f,
          "usage: openinfer bench host [--index-blocks N] [--batch-bytes SIZE] [--quick] [--json]\n"
          "\n"
          "Measures the host tier on the cpu backend, in one run:\n"
          "  1. index scale: N resident blocks of 256 B saved through the engine API, then\n"
          "     lookups per second on one thread and index memory per resident block\n"
          "  2. in-process query of 64 hashes (hits and misses): p50 / p99\n"
          "  3. fire-and-forget save call of 64 blocks of 4 KiB: p50 / p99\n"
          "  4. save and load of a batch (256 blocks across 4 arenas), best of 3, against\n"
          "     single-thread memcpy of the same bytes between the same buffers\n"
          "\n"
          "  --index-blocks N    resident blocks for the index phase (default 10000000;\n"
          "                      K/M/G suffixes are binary: 10M = 10485760); takes about\n"
          "                      350 B of memory per block\n"
          "  --batch-bytes SIZE  bytes of the save/load batch (default 1G, at least 1M;\n"
          "                      the pool and the arena take this much each)\n"
          "  --quick             small sizes for tests: 200000 index blocks, a 64M batch,\n"
          "                      fewer samples (explicit sizes still win)\n"
          "  --json              print one JSON line on stdout instead of the table\n"
          "\n"
          "Progress goes to stderr. Exit status 0 when every phase ran, whether or not the\n"
          "targets were met (each row says PASS or MISS); 1 when a phase failed.\n");
}

/* 10000000 -> "10,000,000" */
static const char *grouped(uint64_t v, char *buf, size_t cap) {
  char raw[32];
  int n = snprintf(raw, sizeof raw, "%llu", (unsigned long long)v);
  size_t k = 0;
  for (int i = 0; i < n && k + 2 < cap; i++) {
    if (i > 0 && (n - i) % 3 == 0) buf[k++] = ',';
    buf[k++] = raw[i];
  }
  buf[k] = '\0';
  return buf;
}

static const char *size_str(uint64_t b, char *buf, size_t cap) {
  if (b >= (1ull << 30) && b % (1ull << 30) == 0)
    snprintf(buf, cap, "%llu GiB", (unsigned long long)(b >> 30));
  else if (b >= (1ull << 30))
    snprintf(buf, cap, "%.2f GiB", (double)b / (1ull << 30));
  else if (b >= (1ull << 20) && b % (1ull << 20) == 0)
    snprintf(buf, cap, "%llu MiB", (unsigned long long)(b >> 20));
  else if (b >= (1ull << 10) && b % (1ull << 10) == 0)
    snprintf(buf, cap, "%llu KiB", (unsigned long long)(b >> 10));
  else
    snprintf(buf, cap, "%llu B", (unsigned long long)b);
  return buf;
}

typedef struct verdicts {
  bool lookups, overhead, q_hit_run, q_hit_scattered, q_miss, q_membership, save_idle, save_burst,
      batch_save, batch_load;
} verdicts;

static double ratio(double a, double b) { return b > 0 ? a / b : 0.0; }

static verdicts judge(const bench_host_result *r) {
  return (verdicts){
      .lookups = r->lookups_per_s >= BENCH_LOOKUPS_TARGET,
      .overhead = r->overhead_per_block <= BENCH_OVERHEAD_TARGET,
      .q_hit_run = r->query_hit_run.p50_us <= BENCH_QUERY_P50_TARGET_US,
      .q_hit_scattered = r->query_hit_scattered.p50_us <= BENCH_QUERY_P50_TARGET_US,
      .q_miss = r->query_miss.p50_us <= BENCH_QUERY_P50_TARGET_US,
      .q_membership = r->query_membership_miss.p50_us <= BENCH_QUERY_P50_TARGET_US,
      .save_idle = r->save_idle.p50_us <= BENCH_SAVE_P50_TARGET_US,
      .save_burst = r->save_burst.p50_us <= BENCH_SAVE_P50_TARGET_US,
      .batch_save = ratio(r->save_gbps, r->memcpy_to_host_gbps) >= BENCH_BATCH_RATIO_TARGET,
      .batch_load = ratio(r->load_gbps, r->memcpy_from_host_gbps) >= BENCH_BATCH_RATIO_TARGET,
  };
}

static const char *pf(bool ok) { return ok ? "PASS" : "MISS"; }

static void lat_row(const char *label, bench_latency l, const char *target, bool ok) {
  printf("  %-44s %8.2f us %8.2f us   %-14s %s\n", label, l.p50_us, l.p99_us, target, pf(ok));
}

static void print_table(const bench_host_result *r, const verdicts *v, int cpus) {
  char a[32], b[32], c[32];
  printf("openinfer bench host — libopeninfer %s, cpu backend, %d cpu%s\n\n", oi_version_string(),
         cpus, cpus == 1 ? "" : "s");

  printf("1. index scale: %s resident blocks of %llu B (filled through the engine API in %.2f s, "
         "%.2f M blocks/s)\n",
         grouped(r->index_blocks, a, sizeof a), (unsigned long long)r->index_block_bytes, r->fill_s,
         r->fill_blocks_per_s / 1e6);
  printf("  %-44s %11s    %-14s\n", "", "measured", "target");
  printf("  %-44s %9.2f M    %-14s %s\n", "lookups / s, one thread, batches of 64",
         r->lookups_per_s / 1e6, ">= 10 M", pf(v->lookups));
  printf("  %-44s %9.2f M    (diagnostic)\n", "lookups / s, one thread, one at a time",
         r->lookups_single_per_s / 1e6);
  printf("  %-44s %9.1f B    %-14s %s\n", "index bytes / resident block", r->overhead_per_block,
         "<= 64 B", pf(v->overhead));
  printf(
      "    = (%zu B host_block + 1 bit x %s carved slots + %s table slots x %zu B) / %s blocks\n",
      r->record_bytes, grouped(r->slots_carved, a, sizeof a), grouped(r->buckets, b, sizeof b),
      r->bucket_bytes, grouped(r->index_blocks, c, sizeof c));
  printf("    (%u shards; a free slot is a bit of its chunk's free map)\n\n", r->shards);

  printf("2. query of %u hashes, in process, %s queries each\n", r->query_blocks,
         grouped(r->query_samples, a, sizeof a));
  printf("  %-44s %11s %11s   %-14s\n", "", "p50", "p99", "target");
  lat_row("hit: a run saved by one call", r->query_hit_run, "p50 <= 5 us", v->q_hit_run);
  lat_row("hit: 64 scattered resident blocks", r->query_hit_scattered, "p50 <= 5 us",
          v->q_hit_scattered);
  lat_row("miss (prefix rule: stops at the first hash)", r->query_miss, "p50 <= 5 us", v->q_miss);
  lat_row("miss, OI_QUERY_MEMBERSHIP (64 lookups)", r->query_membership_miss, "p50 <= 5 us",
          v->q_membership);
  printf("    (a hit's lease is released after each query, outside the timing)\n\n");

  printf("3. save call of %u blocks x %s, fire-and-forget, %s calls each (the call only)\n",
         r->save_call_blocks, size_str(r->save_block_bytes, a, sizeof a),
         grouped(r->save_samples, b, sizeof b));
  printf("  %-44s %11s %11s   %-14s\n", "", "p50", "p99", "target");
  lat_row("engine idle at each call (flush in between)", r->save_idle, "p50 <= 5 us", v->save_idle);
  lat_row("calls back to back", r->save_burst, "p50 <= 5 us", v->save_burst);
  printf("  %-44s %8.2f us %8.2f us   (diagnostic)\n", "the host tier's part (reserve 64 slots)",
         r->save_reserve.p50_us, r->save_reserve.p99_us);
  printf("\n");

  printf("4. batch of %s: %u blocks x %u arenas x %s, best of 3\n",
         size_str(r->batch_bytes, a, sizeof a), r->batch_blocks, r->batch_arenas,
         size_str(r->batch_arena_block_bytes, b, sizeof b));
  printf("  %-44s %11s %11s   %-14s\n", "", "GB/s", "vs memcpy", "target");
  printf("  %-44s %11.2f\n", "memcpy arena -> pool, one call (baseline)", r->memcpy_to_host_gbps);
  printf("  %-44s %11.2f %10.2fx   %-14s %s\n", "save + wait", r->save_gbps,
         ratio(r->save_gbps, r->memcpy_to_host_gbps), ">= 0.8x", pf(v->batch_save));
  printf("  %-44s %11.2f %10.2fx   (diagnostic)\n", "memcpy arena -> pool, in the plan's pieces",
         r->memcpy_pieces_to_host_gbps,
         ratio(r->memcpy_pieces_to_host_gbps, r->memcpy_to_host_gbps));
  printf("  %-44s %11.2f\n", "memcpy pool -> arena, one call (baseline)", r->memcpy_from_host_gbps);
  printf("  %-44s %11.2f %10.2fx   %-14s %s\n", "query + load + wait", r->load_gbps,
         ratio(r->load_gbps, r->memcpy_from_host_gbps), ">= 0.8x", pf(v->batch_load));
  printf("  %-44s %11.2f %10.2fx   (diagnostic)\n", "memcpy pool -> arena, in the plan's pieces",
         r->memcpy_pieces_from_host_gbps,
         ratio(r->memcpy_pieces_from_host_gbps, r->memcpy_from_host_gbps));
  printf("    (every memcpy runs on one thread, as the cpu backend's stream does; the plan copies\n"
         "     %u pieces of %s)\n\n",
         r->batch_blocks * r->batch_arenas, size_str(r->batch_arena_block_bytes, c, sizeof c));

  const bool all[] = {v->lookups,    v->overhead,     v->q_hit_run, v->q_hit_scattered,
                      v->q_miss,     v->q_membership, v->save_idle, v->save_burst,
                      v->batch_save, v->batch_load};
  int met = 0, n = (int)(sizeof all / sizeof all[0]);
  for (int i = 0; i < n; i++)
    met += all[i];
  printf("targets met: %d of %d\n", met, n);
}

static void json_lat(const char *name, bench_latency l) {
  printf(",\"%s_p50_us\":%.4f,\"%s_p99_us\":%.4f", name, l.p50_us, name, l.p99_us);
}

static void print_json(const bench_host_result *r, const verdicts *v, int cpus, bool quick) {
  printf("{\"bench\":\"host\",\"version\":\"%s\",\"backend\":\"cpu\",\"cpus\":%d,\"quick\":%s",
         oi_version_string(), cpus, quick ? "true" : "false");
  printf(",\"index_blocks\":%llu,\"index_block_bytes\":%llu,\"index_fill_s\":%.4f"
         ",\"index_fill_blocks_per_s\":%.1f,\"index_lookups\":%llu,\"index_lookups_per_s\":%.1f"
         ",\"index_lookups_single_per_s\":%.1f"
         ",\"index_lookup_threads\":1,\"index_overhead_bytes_per_block\":%.3f"
         ",\"index_record_bytes\":%zu,\"index_slots_carved\":%llu,\"index_buckets\":%llu"
         ",\"index_bucket_bytes\":%zu,\"index_shards\":%u",
         (unsigned long long)r->index_blocks, (unsigned long long)r->index_block_bytes, r->fill_s,
         r->fill_blocks_per_s, (unsigned long long)r->lookups, r->lookups_per_s,
         r->lookups_single_per_s, r->overhead_per_block, r->record_bytes,
         (unsigned long long)r->slots_carved, (unsigned long long)r->buckets, r->bucket_bytes,
         r->shards);
  printf(",\"query_blocks\":%u,\"query_samples\":%u", r->query_blocks, r->query_samples);
  json_lat("query_hit_run", r->query_hit_run);
  json_lat("query_hit_scattered", r->query_hit_scattered);
  json_lat("query_miss", r->query_miss);
  json_lat("query_membership_miss", r->query_membership_miss);
  printf(",\"save_call_blocks\":%u,\"save_block_bytes\":%llu,\"save_samples\":%u",
         r->save_call_blocks, (unsigned long long)r->save_block_bytes, r->save_samples);
  json_lat("save_enqueue_idle", r->save_idle);
  json_lat("save_enqueue_burst", r->save_burst);
  json_lat("save_host_reserve", r->save_reserve);
  printf(",\"batch_bytes\":%llu,\"batch_blocks\":%u,\"batch_arenas\":%u"
         ",\"batch_arena_block_bytes\":%llu,\"batch_save_gbps\":%.4f,\"batch_load_gbps\":%.4f"
         ",\"memcpy_to_host_gbps\":%.4f,\"memcpy_from_host_gbps\":%.4f"
         ",\"memcpy_pieces_to_host_gbps\":%.4f,\"memcpy_pieces_from_host_gbps\":%.4f"
         ",\"save_ratio\":%.4f,\"load_ratio\":%.4f",
         (unsigned long long)r->batch_bytes, r->batch_blocks, r->batch_arenas,
         (unsigned long long)r->batch_arena_block_bytes, r->save_gbps, r->load_gbps,
         r->memcpy_to_host_gbps, r->memcpy_from_host_gbps, r->memcpy_pieces_to_host_gbps,
         r->memcpy_pieces_from_host_gbps, ratio(r->save_gbps, r->memcpy_to_host_gbps),
         ratio(r->load_gbps, r->memcpy_from_host_gbps));
  printf(",\"targets\":{\"index_lookups_per_s\":%.0f,\"index_overhead_bytes_per_block\":%.0f"
         ",\"query_p50_us\":%.1f,\"save_enqueue_p50_us\":%.1f,\"batch_ratio\":%.2f}",
         BENCH_LOOKUPS_TARGET, BENCH_OVERHEAD_TARGET, BENCH_QUERY_P50_TARGET_US,
         BENCH_SAVE_P50_TARGET_US, BENCH_BATCH_RATIO_TARGET);
#define B(x) ((x) ? "true" : "false")
  printf(",\"pass\":{\"index_lookups\":%s,\"index_overhead\":%s,\"query_hit_run\":%s"
         ",\"query_hit_scattered\":%s,\"query_miss\":%s,\"query_membership_miss\":%s"
         ",\"save_enqueue_idle\":%s,\"save_enqueue_burst\":%s,\"batch_save\":%s"
         ",\"batch_load\":%s}}\n",
         B(v->lookups), B(v->overhead), B(v->q_hit_run), B(v->q_hit_scattered), B(v->q_miss),
         B(v->q_membership), B(v->save_idle), B(v->save_burst), B(v->batch_save), B(v->batch_load));
#undef B
}

static int cmd_bench_host(int argc, char **argv) {
  static const struct option longopts[] = {{"index-blocks", required_argument, 0, 'n'},
                                           {"batch-bytes", required_argument, 0, 'b'},
                                           {"quick", no_argument, 0, 'q'},
                                           {"json", no_argument, 0, 'j'},
                                           {"help", no_argument, 0, 'h'},
                                           {0, 0, 0, 0}};
  bench_host_config cfg = {.index_blocks = 0, .batch_bytes = 0};
  bool json = false;
  optind = 1;
  int c;
  while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
    bool ok = true;
    switch (c) {
    case 'n':
      ok = cli_parse_size(optarg, &cfg.index_blocks) && cfg.index_blocks >= 4096 &&
           cfg.index_blocks <= (1ull << 32);
      break;
    case 'b':
      ok = cli_parse_size(optarg, &cfg.batch_bytes) && cfg.batch_bytes >= (1ull << 20);
      break;
    case 'q': cfg.quick = true; break;
    case 'j': json = true; break;
    case 'h': host_usage(stdout); return CLI_OK;
    default: host_usage(stderr); return CLI_USAGE;
    }
    if (!ok) {
      const char *name = "?", *why = "";
      for (const struct option *lo = longopts; lo->name; lo++)
        if (lo->val == c) name = lo->name;
      if (c == 'n') why = " (a count from 4096 to 4G)";
      if (c == 'b') why = " (a size of at least 1M)";
      fprintf(stderr, "openinfer bench host: bad value '%s' for --%s%s\n", optarg, name, why);
      return CLI_USAGE;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "openinfer bench host: unexpected argument '%s'\n", argv[optind]);
    return CLI_USAGE;
  }
  if (!cfg.index_blocks) cfg.index_blocks = cfg.quick ? 200000 : 10000000;
  if (!cfg.batch_bytes) cfg.batch_bytes = cfg.quick ? (64ull << 20) : (1ull << 30);
  /* The batch phase holds the arena and a pool of the same size: refuse what
   * the machine cannot give before the minutes of the index phase. */
  const char *why;
  uint64_t avail = oi__host_memory_available(&why);
  if (cfg.batch_bytes > avail / 2) {
    fprintf(stderr,
            "openinfer bench host: --batch-bytes %.2f GiB needs about twice that (arena and "
            "pool), but only %.2f GiB of memory is available (%s)\n",
            (double)cfg.batch_bytes / (1ull << 30), (double)avail / (1ull << 30), why);
    return CLI_USAGE;
  }

  bench_host_result r;
  if (bench_host_run(&cfg, &r) != 0) return CLI_FAILED;
  verdicts v = judge(&r);
  int cpus = get_nprocs();
  if (json)
    print_json(&r, &v, cpus, cfg.quick);
  else
    print_table(&r, &v, cpus);
  return CLI_OK;
}

int cmd_bench(int argc, char **argv) {
  if (argc < 2) {
    bench_usage(stderr);
    return CLI_USAGE;
  }
  const char *sub = argv[1];
  if (!strcmp(sub, "--help") || !strcmp(sub, "-h") || !strcmp(sub, "help")) {
    bench_usage(stdout);
    return CLI_OK;
  }
  for (size_t i = 0; i < sizeof benchmarks / sizeof benchmarks[0]; i++)
    if (!strcmp(sub, benchmarks[i].name)) return benchmarks[i].run(argc - 1, argv + 1);
  fprintf(stderr, "openinfer bench: '%s' is not a benchmark\n\n", sub);
  bench_usage(stderr);
  return CLI_USAGE;
}
