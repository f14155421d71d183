/* `openinfer demo`: the embedded default end to end. One host pool shared by
 * several rank engines; a synthetic multi-turn chat workload whose prompts
 * share a system prefix and grow turn by turn, spread over the ranks so a
 * rank often restores what another rank saved, with a pool smaller than the
 * working set so blocks are evicted. Every restored byte is verified. */
#include <getopt.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "openinfer/openinfer.h"

typedef struct demo_opts {
  long device; /* -2: auto */
  long ranks, conversations, turns, layers, page_tokens;
  long system_blocks, turn_blocks, arena_blocks;
  uint64_t block_bytes, pool_bytes;
  long seed;
} demo_opts;

typedef struct request {
  int conv, turn, rank;
} request;

typedef struct rank_ctx {
  int rank;
  const demo_opts *o;
  oi_engine *engine;
  oi_device_buffer *buf; /* the arena: device memory */
  uint8_t *arena;        /* its base: layers x arena_blocks x block_bytes */
  uint8_t *staging;      /* host copy of one block's slices */
  request *reqs;
  size_t nreqs;
  uint64_t *restore_ns; /* per request with a hit */
  size_t nrestores;
  uint64_t hit_blocks, prompt_blocks, verify_failures, load_bytes, load_ns, errors;
  char error[256];
} rank_ctx;

static atomic_size_t done_requests;

static void demo_usage(FILE *f) {
  fprintf(f,
          "usage: openinfer demo tier [options]\n"
          "\n"
          "Runs a multi-turn chat workload over several rank engines sharing one host pool:\n"
          "each request restores its prompt's cached prefix from the host tier, 'computes' the\n"
          "rest, and saves its blocks; every restored byte is verified.\n"
          "\n"
          "  --device N|cpu       CUDA device, or cpu (default: GPU 0 if present, else cpu)\n"
          "  --ranks N            engines sharing the host (default 4)\n"
          "  --conversations N    chats (default 24)\n"
          "  --turns N            turns per chat (default 6)\n"
          "  --system-blocks N    blocks of the shared system prompt (default 8)\n"
          "  --turn-blocks N      blocks each turn adds (default 4)\n"
          "  --layers N           arenas per rank, one per layer (default 8)\n"
          "  --block-bytes SIZE   bytes of one block in one layer (default 16K)\n"
          "  --page-tokens N      tokens per block (default 16)\n"
          "  --pool SIZE          host pool (default: 60%% of the working set, to force eviction)\n"
          "  --seed N             workload seed (default 1)\n");
}

/* Bytes a block holds are a function of its hash: any rank's save of the same
 * prefix carries the same bytes, and a restore can be checked exactly. */
static void fill_block(uint8_t *dst, size_t n, const oi_block_hash *h, uint32_t layer) {
  uint64_t seed;
  memcpy(&seed, h->bytes, 8);
  seed ^= (uint64_t)layer * 0x9E3779B97F4A7C15ull;
  for (size_t i = 0; i < n; i++)
    dst[i] = cli_pattern_byte(seed, i);
}

static uint64_t rng_next(uint64_t *s) {
  uint64_t x = *s;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return *s = x;
}

/* Token ids of conversation `conv` up to the end of turn `turn`. */
static size_t prompt_tokens(const demo_opts *o, int conv, int turn, uint32_t *out) {
  size_t n = 0, pt = (size_t)o->page_tokens;
  for (size_t i = 0; i < (size_t)o->system_blocks * pt; i++)
    out[n++] = (uint32_t)(7 + i);
  for (int t = 0; t <= turn; t++)
    for (size_t i = 0; i < (size_t)o->turn_blocks * pt; i++)
      out[n++] = (uint32_t)(100000 + conv * 7919 + t * 104729 + i);
  return n;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

static uint64_t arena_off(const demo_opts *o, uint64_t layer, uint64_t block) {
  return (layer * (uint64_t)o->arena_blocks + block) * o->block_bytes;
}

static void *rank_main(void *arg) {
  rank_ctx *r = arg;
  const demo_opts *o = r->o;
  const size_t max_blocks = (size_t)(o->system_blocks + o->turns * o->turn_blocks);
  uint32_t *tokens = malloc(max_blocks * (size_t)o->page_tokens * sizeof *tokens);
  oi_block_hash *hashes = malloc(max_blocks * sizeof *hashes);
  int64_t *ids = malloc(max_blocks * sizeof *ids);
  if (!tokens || !hashes || !ids) {
    snprintf(r->error, sizeof r->error, "out of memory");
    r->errors++;
    goto out;
  }
  uint64_t next_block = 0; /* the rank's arena is used as a ring of blocks */
  for (size_t q = 0; q < r->nreqs; q++) {
    const request *rq = &r->reqs[q];
    size_t ntok = prompt_tokens(o, rq->conv, rq->turn, tokens), nh = 0;
    oi_hash_blocks(tokens, ntok, (uint32_t)o->page_tokens, "demo-model", 10, NULL, hashes,
                   max_blocks, &nh);
    for (size_t i = 0; i < nh; i++)
      ids[i] = (int64_t)((next_block + i) % (uint64_t)o->arena_blocks);
    next_block += nh;

    /* Admission: restore the cached prefix from the host tier. */
    uint64_t t0 = cli_now_ns();
    oi_query_result qr = {.struct_size = sizeof qr};
    oi_status st = oi_engine_query(r->engine, "demo", hashes, nh, 0, &qr);
    size_t hit = st == OI_OK ? (size_t)qr.hit_blocks : 0;
    if (hit > 0) {
      oi_ticket *t = NULL;
      st = oi_engine_load(r->engine, qr.lease, ids, hit, NULL, &t);
      if (st == OI_OK) st = oi_ticket_wait(t, 120000);
      oi_ticket_release(t);
      uint64_t dt = cli_now_ns() - t0;
      if (st != OI_OK) {
        snprintf(r->error, sizeof r->error, "restore failed: %s: %s", oi_status_str(st),
                 oi_last_error());
        r->errors++;
        hit = 0; /* degrade: recompute everything */
      } else {
        r->restore_ns[r->nrestores++] = dt;
        r->load_ns += dt;
        r->load_bytes += hit * (uint64_t)o->layers * o->block_bytes;
        /* Verify the restored blocks byte for byte. */
        for (size_t i = 0; i < hit; i++)
          for (uint32_t l = 0; l < (uint32_t)o->layers; l++) {
            uint8_t *expect = r->staging + o->block_bytes;
            fill_block(expect, o->block_bytes, &hashes[i], l);
            oi_device_buffer_copy(r->buf, r->staging, r->arena + arena_off(o, l, (uint64_t)ids[i]),
                                  o->block_bytes);
            if (memcmp(r->staging, expect, o->block_bytes) != 0) r->verify_failures++;
          }
      }
    }
    r->hit_blocks += hit;
    r->prompt_blocks += nh;
    /* "Prefill" the rest: write the bytes the model would have computed. */
    for (size_t i = hit; i < nh; i++)
      for (uint32_t l = 0; l < (uint32_t)o->layers; l++) {
        fill_block(r->staging, o->block_bytes, &hashes[i], l);
        oi_device_buffer_copy(r->buf, r->arena + arena_off(o, l, (uint64_t)ids[i]), r->staging,
                              o->block_bytes);
      }
    /* Release: save every full block (the host deduplicates what it has). */
    if (nh > 0) {
      oi_ticket *t = NULL;
      st = oi_engine_save(r->engine, ids, hashes, nh, NULL, &t);
      /* The arena is a ring reused by later requests: wait before reusing. */
      if (st == OI_OK) st = oi_ticket_wait(t, 120000);
      oi_ticket_release(t);
      if (st != OI_OK) {
        snprintf(r->error, sizeof r->error, "save failed: %s: %s", oi_status_str(st),
                 oi_last_error());
        r->errors++;
      }
    }
    atomic_fetch_add(&done_requests, 1);
  }
out:
  free(tokens);
  free(hashes);
  free(ids);
  return NULL;
}

static bool parse_demo_opts(int argc, char **argv, demo_opts *o, int *rc) {
  static const struct option longopts[] = {{"device", required_argument, 0, 'd'},
                                           {"ranks", required_argument, 0, 'r'},
                                           {"conversations", required_argument, 0, 'c'},
                                           {"turns", required_argument, 0, 't'},
                                           {"system-blocks", required_argument, 0, 's'},
                                           {"turn-blocks", required_argument, 0, 'T'},
                                           {"layers", required_argument, 0, 'l'},
                                           {"block-bytes", required_argument, 0, 'B'},
                                           {"page-tokens", required_argument, 0, 'p'},
                                           {"pool", required_argument, 0, 'P'},
                                           {"seed", required_argument, 0, 'S'},
                                           {"help", no_argument, 0, 'h'},
                                           {0, 0, 0, 0}};
  optind = 1;
  int c;
  while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
    bool ok = true;
    switch (c) {
    case 'd':
      if (!strcmp(optarg, "cpu"))
        o->device = -1;
      else
        ok = cli_parse_int(optarg, -1, 1023, &o->device);
      break;
    case 'r': ok = cli_parse_int(optarg, 1, 64, &o->ranks); break;
    case 'c': ok = cli_parse_int(optarg, 1, 100000, &o->conversations); break;
    case 't': ok = cli_parse_int(optarg, 1, 1000, &o->turns); break;
    case 's': ok = cli_parse_int(optarg, 0, 100000, &o->system_blocks); break;
    case 'T': ok = cli_parse_int(optarg, 1, 100000, &o->turn_blocks); break;
    case 'l': ok = cli_parse_int(optarg, 1, 4096, &o->layers); break;
    case 'B': ok = cli_parse_size(optarg, &o->block_bytes) && o->block_bytes > 0; break;
    case 'p': ok = cli_parse_int(optarg, 1, 1 << 16, &o->page_tokens); break;
    case 'P': ok = cli_parse_size(optarg, &o->pool_bytes) && o->pool_bytes > 0; break;
    case 'S': ok = cli_parse_int(optarg, 0, 1L << 62, &o->seed); break;
    case 'h':
      demo_usage(stdout);
      *rc = CLI_OK;
      return false;
    default:
      demo_usage(stderr);
      *rc = CLI_USAGE;
      return false;
    }
    if (!ok) {
      cli_bad_value("openinfer demo", longopts, c, optarg);
      *rc = CLI_USAGE;
      return false;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "openinfer demo: unexpected argument '%s'\n", argv[optind]);
    *rc = CLI_USAGE;
    return false;
  }
  return true;
}

int demo_tier(int argc, char **argv) {
  demo_opts o = {.device = -2,
                 .ranks = 4,
                 .conversations = 24,
                 .turns = 6,
                 .layers = 8,
                 .page_tokens = 16,
                 .system_blocks = 8,
                 .turn_blocks = 4,
                 .block_bytes = 16 << 10,
                 .seed = 1};
  int rc = CLI_FAILED;
  if (!parse_demo_opts(argc, argv, &o, &rc)) return rc;
  if (o.device == -2) {
    int n = 0;
    oi_device_count(&n);
    o.device = n > 0 ? 0 : -1;
  }
  const uint64_t layer_block = o.block_bytes, host_block = layer_block * (uint64_t)o.layers;
  const long max_blocks = o.system_blocks + o.turns * o.turn_blocks;
  o.arena_blocks = 2 * max_blocks;
  const uint64_t unique_blocks =
      (uint64_t)o.system_blocks + (uint64_t)o.conversations * o.turns * o.turn_blocks;
  if (!o.pool_bytes) {
    o.pool_bytes = unique_blocks * host_block * 6 / 10;
    if (o.pool_bytes < 4 * host_block) o.pool_bytes = 4 * host_block;
  } else if (o.pool_bytes < 4 * host_block) {
    fprintf(stderr,
            "openinfer demo tier: --pool %llu B is too small: the pool must hold at least 4 "
            "blocks of %llu B (%llu B); try --pool %lluK or more\n",
            (unsigned long long)o.pool_bytes, (unsigned long long)host_block,
            (unsigned long long)(4 * host_block),
            (unsigned long long)((4 * host_block + 1023) / 1024));
    return CLI_USAGE;
  }

  oi_device_info info = {.struct_size = sizeof info};
  if (oi_device_get_info((int)o.device, &info) != OI_OK) {
    fprintf(stderr, "openinfer demo: %s\n", oi_last_error());
    return CLI_FAILED;
  }
  printf("openinfer demo — libopeninfer %s\n", oi_version_string());
  printf("device: %s (%s backend); %ld ranks share one host pool of %.1f MiB\n", info.name,
         o.device < 0 ? "cpu" : "cuda", o.ranks, (double)o.pool_bytes / (1 << 20));
  printf("workload: %ld chats x %ld turns, %ld-block shared system prompt, +%ld blocks per turn;\n"
         "          blocks of %ld tokens x %ld layers x %llu B = %llu B; working set %.1f MiB\n",
         o.conversations, o.turns, o.system_blocks, o.turn_blocks, o.page_tokens, o.layers,
         (unsigned long long)layer_block, (unsigned long long)host_block,
         (double)(unique_blocks * host_block) / (1 << 20));

  oi_host_options ho;
  oi_host_options_init(&ho);
  ho.pool_bytes = o.pool_bytes;
  ho.device = (int32_t)o.device;
  /* Chunks must hold a block; several per pool keep the carving fine-grained. */
  ho.chunk_bytes = host_block * 4 > o.pool_bytes ? o.pool_bytes : host_block * 4;
  oi_host *host = NULL;
  oi_status st = oi_host_create(&ho, &host);
  if (st != OI_OK) {
    fprintf(stderr, "openinfer demo: host: %s\n", oi_last_error());
    return CLI_FAILED;
  }

  size_t nreq = (size_t)(o.conversations * o.turns);
  rank_ctx *ranks = calloc((size_t)o.ranks, sizeof *ranks);
  request *all = calloc(nreq, sizeof *all);
  pthread_t *threads = calloc((size_t)o.ranks, sizeof *threads);
  oi_arena_desc *arenas = calloc((size_t)o.layers, sizeof *arenas);
  char(*names)[24] = calloc((size_t)o.layers, sizeof *names);
  if (!ranks || !all || !threads || !arenas || !names) {
    fprintf(stderr, "openinfer demo: out of memory\n");
    goto cleanup;
  }
  /* Turn t of every chat comes before turn t+1; the rank is random. */
  uint64_t rng = (uint64_t)o.seed * 0x9E3779B97F4A7C15ull + 1;
  size_t k = 0;
  for (int t = 0; t < o.turns; t++)
    for (int c = 0; c < o.conversations; c++)
      all[k++] = (request){.conv = c, .turn = t, .rank = (int)(rng_next(&rng) % (uint64_t)o.ranks)};

  for (long r = 0; r < o.ranks; r++) {
    rank_ctx *rc_ = &ranks[r];
    rc_->rank = (int)r;
    rc_->o = &o;
    rc_->reqs = calloc(nreq, sizeof *rc_->reqs);
    rc_->restore_ns = calloc(nreq, sizeof *rc_->restore_ns);
    rc_->staging = malloc(2 * layer_block);
    if (!rc_->reqs || !rc_->restore_ns || !rc_->staging) {
      fprintf(stderr, "openinfer demo: out of memory\n");
      goto cleanup;
    }
    for (size_t q = 0; q < nreq; q++)
      if (all[q].rank == r) rc_->reqs[rc_->nreqs++] = all[q];
    if (oi_device_buffer_alloc((int)o.device, (uint64_t)o.layers * o.arena_blocks * layer_block,
                               &rc_->buf) != OI_OK) {
      fprintf(stderr, "openinfer demo: rank %ld arena: %s\n", r, oi_last_error());
      goto cleanup;
    }
    rc_->arena = oi_device_buffer_ptr(rc_->buf);
    for (long l = 0; l < o.layers; l++) {
      snprintf(names[l], sizeof names[l], "layer%d", (int)l);
      arenas[l] = (oi_arena_desc){.name = names[l],
                                  .base = rc_->arena + arena_off(&o, (uint64_t)l, 0),
                                  .num_blocks = (uint64_t)o.arena_blocks,
                                  .bytes_per_block = layer_block,
                                  .block_stride = layer_block,
                                  .segments = 1};
    }
    oi_engine_options eo;
    oi_engine_options_init(&eo);
    eo.device = (int32_t)o.device;
    eo.namespace_id = "demo-model";
    char iname[32];
    snprintf(iname, sizeof iname, "rank%d", (int)r);
    eo.instance_name = iname;
    eo.arenas = arenas;
    eo.num_arenas = (uint32_t)o.layers;
    if (oi_engine_create(host, &eo, &rc_->engine) != OI_OK) {
      fprintf(stderr, "openinfer demo: rank %ld engine: %s\n", r, oi_last_error());
      goto cleanup;
    }
  }

  uint64_t t0 = cli_now_ns();
  atomic_store(&done_requests, 0);
  long started = 0;
  for (; started < o.ranks; started++)
    if (pthread_create(&threads[started], NULL, rank_main, &ranks[started]) != 0) break;
  if (started < o.ranks) fprintf(stderr, "openinfer demo: could not start every rank thread\n");
  size_t last_report = 0;
  while (started > 0) { /* progress every ~10% */
    size_t done = atomic_load(&done_requests);
    if (done >= nreq) break;
    if (done >= last_report + nreq / 10 && cli_now_ns() - t0 > 1000000000ull) { /* long runs only */
      fprintf(stderr, "  %3zu%% of %zu requests\n", done * 100 / nreq, nreq);
      last_report = done;
    }
    usleep(20000);
  }
  for (long r = 0; r < started; r++)
    pthread_join(threads[r], NULL);
  uint64_t wall = cli_now_ns() - t0;
  for (long r = 0; r < o.ranks; r++)
    oi_engine_flush(ranks[r].engine, 120000);

  /* Report. */
  oi_host_stats hs = {.struct_size = sizeof hs};
  oi_host_get_stats(host, &hs);
  uint64_t hit = 0, prompt = 0, bad = 0, errors = 0, lbytes = 0, lns = 0;
  size_t nrest = 0;
  uint64_t *lat = calloc(nreq + 1, sizeof *lat);
  for (long r = 0; r < o.ranks; r++) {
    rank_ctx *x = &ranks[r];
    hit += x->hit_blocks;
    prompt += x->prompt_blocks;
    bad += x->verify_failures;
    errors += x->errors;
    lbytes += x->load_bytes;
    lns += x->load_ns;
    for (size_t i = 0; i < x->nrestores && lat; i++)
      lat[nrest++] = x->restore_ns[i];
    if (x->errors) fprintf(stderr, "rank %ld: %s\n", r, x->error);
  }
  if (lat) qsort(lat, nrest, sizeof *lat, cmp_u64);
  double p50 = nrest ? (double)lat[nrest / 2] / 1e3 : 0,
         p99 = nrest ? (double)lat[(nrest * 99) / 100] / 1e3 : 0;
  free(lat);
  printf("\n%-34s %14s\n", "", "result");
  printf("%-34s %14zu\n", "requests", nreq);
  printf("%-34s %14.1f\n", "wall time (ms)", (double)wall / 1e6);
  printf("%-34s %14llu\n", "prompt blocks", (unsigned long long)prompt);
  printf("%-34s %14llu  (%.1f%% of prompt blocks)\n", "restored from the host tier",
         (unsigned long long)hit, prompt ? 100.0 * (double)hit / (double)prompt : 0.0);
  printf("%-34s %14llu\n", "blocks saved (sealed)", (unsigned long long)hs.saves_completed);
  printf("%-34s %14llu\n", "blocks deduplicated", (unsigned long long)hs.saves_deduplicated);
  printf("%-34s %14llu\n", "blocks dropped (no memory)", (unsigned long long)hs.saves_dropped);
  printf("%-34s %14llu\n", "blocks evicted", (unsigned long long)hs.evictions);
  printf("%-34s %14zu\n", "requests restoring a prefix", nrest);
  printf("%-34s %14.1f\n", "restore latency p50 (us)", p50);
  printf("%-34s %14.1f\n", "restore latency p99 (us)", p99);
  printf("%-34s %14.1f  (%.2f GB/s during restores)\n", "bytes restored (MiB)",
         (double)lbytes / (1 << 20), lns ? (double)lbytes / (double)lns : 0.0);
  printf("%-34s %14.1f\n", "bytes saved (MiB)", (double)hs.bytes_saved / (1 << 20));
  printf("%-34s %14.1f  of %.1f MiB (%.0f%%)\n", "pool holding blocks (MiB)",
         (double)hs.block_bytes_resident / (1 << 20), (double)hs.capacity_bytes / (1 << 20),
         100.0 * (double)hs.block_bytes_resident / (double)hs.capacity_bytes);
  printf("%-34s %14llu\n", "restored bytes that differ", (unsigned long long)bad);
  if (bad == 0 && errors == 0 && hit > 0) {
    printf("\ndemo OK: every restored block matched what was saved\n");
    rc = CLI_OK;
  } else {
    fprintf(stderr, "\nopeninfer demo: FAILED (%llu mismatching slices, %llu errors, %llu hits)\n",
            (unsigned long long)bad, (unsigned long long)errors, (unsigned long long)hit);
  }

cleanup:
  if (ranks)
    for (long r = 0; r < o.ranks; r++) {
      rank_ctx *x = &ranks[r];
      oi_engine_destroy(x->engine);
      oi_device_buffer_free(x->buf);
      free(x->reqs);
      free(x->restore_ns);
      free(x->staging);
    }
  oi_host_destroy(host);
  free(ranks);
  free(all);
  free(threads);
  free(arenas);
  free(names);
  return rc;
}
