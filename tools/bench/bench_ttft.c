/* `openinfer bench ttft`: time to first token of the CUDA reference model
 * (Qwen3-4B shape) through the executor, cold prefill vs warm host-tier
 * restore after the GPU prefix cache was evicted, in one run, beside the
 * figures that judge it: the GPU's dense bf16 matmul rate (the model's GEMM
 * and cuBLAS at a large square size), the bulk pinned H2D bandwidth, and the
 * decode step. See docs PERFORMANCE.md (TTFT row). */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "bench_cuda.h"
#include "cli.h"
#include "device/device.h"
#include "disk/tier.h"
#include "executor/executor_internal.h"
#include "openinfer/disk.h"
#include "openinfer/openinfer.h"
#include "refmodel/kernels/refmodel_gen.h"

#define MAX_SIZES 8
#define MAX_REPS 16
#define MAX_MIXED 64

typedef struct size_result {
  uint32_t tokens;
  double cold_ms[MAX_REPS], warm_ms[MAX_REPS], decode_ms[MAX_REPS];
  double q_ms[MAX_REPS], load_ms[MAX_REPS], commit_ms[MAX_REPS];
  uint32_t restored[MAX_REPS], computed_warm[MAX_REPS];
  bool same_tokens;
  /* Disk-warm: the same prompts after the pool was emptied too. */
  double disk_ms[MAX_REPS], disk_q_ms[MAX_REPS], disk_load_ms[MAX_REPS];
  uint32_t disk_restored[MAX_REPS];
  bool disk_same;
} size_result;

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}
static double median(const double *v, int n) {
  double t[MAX_REPS];
  memcpy(t, v, n * sizeof *t);
  qsort(t, n, sizeof *t, cmp_d);
  return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

/* The mixed-load section: `n` distinct prompts of `len` tokens submitted
 * together, cold, then again after flush + GPU-cache eviction (warm). */
typedef struct mixed_result {
  uint32_t n, len;
  double wall_ms[2], ttft_p50_ms[2], ttft_max_ms[2];
  uint32_t full_restores, restored_min, restored_max, errors, same;
  uint64_t restores_failed;
} mixed_result;

/* The offload-on miss path: per size, cold TTFT with the host tier on (every
 * query misses) vs an executor with offload NONE, the same prompts. */
typedef struct miss_result {
  uint32_t tokens;
  double on_ms[MAX_REPS], off_ms[MAX_REPS], query_us[MAX_REPS];
  uint32_t hits, same;
} miss_result;

/* Runs one request alone to completion; fills *rr. */
static bool run_one(oi_executor *x, const uint32_t *prompt, uint32_t len, uint64_t *id,
                    oi_request_result *rr) {
  oi_request r;
  oi_request_init(&r);
  r.prompt = prompt;
  r.prompt_len = len;
  r.max_new_tokens = 2;
  rr->struct_size = sizeof *rr;
  return oi_executor_submit(x, &r, id) == OI_OK && oi_executor_run_until_idle(x) == OI_OK &&
         oi_executor_get_result(x, *id, rr) == OI_OK && rr->state == OI_REQUEST_FINISHED;
}

static void gen_prompt(uint32_t *p, uint32_t len, uint64_t seed, uint32_t vocab) {
  for (uint32_t i = 0; i < len; i++)
    p[i] = (uint32_t)(oi_rm_mix64(seed * 0x9E3779B97F4A7C15ull + i + 1) % (uint64_t)vocab);
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: openinfer bench ttft [--device N] [--sizes A,B,...] [--reps N] [--chunk N]\n"
          "                            [--mixed N] [--mixed-tokens N] [--miss-reps N]\n"
          "                            [--disk DIR|none] [--layers N] [--vocab N] [--json]\n"
          "\n"
          "The CUDA reference model in the Qwen3-4B shape (36 layers, hidden 2560, 32 query\n"
          "heads, 8 KV heads, head dim 128, MLP 9728, bf16, page 16) behind the executor with\n"
          "an embedded pinned host tier. Per prompt size: cold prefill TTFT (distinct prompts),\n"
          "then, after flush + GPU-cache eviction, the same prompts again restored from the host\n"
          "tier: TTFT p50 each and the ratio, the restore broken out (query, load, commit), the\n"
          "cold prefill's achieved TFLOP/s beside the dense bf16 matmul rate measured in the same\n"
          "run (the model's GEMM and cuBLAS at 8192^3), bulk H2D, and the decode step.\n"
          "\n"
          "  --sizes    prompt lengths (default 1466,4096,16384)\n"
          "  --reps     prompts per size (default 3)\n"
          "  --chunk    max_batch_tokens: the prefill chunk (default 4096)\n"
          "  --mixed    mixed load: N distinct long prompts submitted together, cold, then again\n"
          "             after flush + eviction (full-prefix restores, errors, wall time warm vs\n"
          "             cold); default 16, 0 skips it\n"
          "  --mixed-tokens  their length (default 4096)\n"
          "  --miss-reps the offload-on miss path: per size, N new prompts through this executor\n"
          "             (host tier on, every query misses) and through one with offload NONE,\n"
          "             interleaved: TTFT p50 each and the overhead (default 4, 0 skips it)\n"
          "  --disk     a disk tier under the pool, in DIR (default: a scratch directory under\n"
          "             TMPDIR, removed after; 'none' skips it): per size, the same prompts again\n"
          "             after the pool was emptied too, restored from disk (disk-warm TTFT)\n"
          "  --layers, --vocab   model size (default 36, 32768)\n");
}

int bench_ttft(int argc, char **argv) {
  static const struct option lo[] = {{"device", required_argument, 0, 'd'},
                                     {"sizes", required_argument, 0, 's'},
                                     {"reps", required_argument, 0, 'r'},
                                     {"chunk", required_argument, 0, 'c'},
                                     {"layers", required_argument, 0, 'l'},
                                     {"vocab", required_argument, 0, 'v'},
                                     {"mixed", required_argument, 0, 'm'},
                                     {"mixed-tokens", required_argument, 0, 'M'},
                                     {"miss-reps", required_argument, 0, 'x'},
                                     {"json", no_argument, 0, 'j'},
                                     {"disk", required_argument, 0, 'D'},
                                     {"help", no_argument, 0, 'h'},
                                     {0, 0, 0, 0}};
  long device = 0, reps = 3, chunk = 4096, layers = 36, vocab = 32768;
  long mixed = 16, mixed_len = 4096, miss_reps = 4;
  uint32_t sizes[MAX_SIZES] = {1466, 4096, 16384};
  int nsizes = 3;
  bool json = false;
  const char *disk_arg = NULL;
  optind = 1;
  int c;
  while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
    bool ok = true;
    switch (c) {
    case 'd': ok = cli_parse_int(optarg, 0, 64, &device); break;
    case 'r': ok = cli_parse_int(optarg, 1, MAX_REPS, &reps); break;
    case 'c': ok = cli_parse_int(optarg, 16, 65536, &chunk); break;
    case 'l': ok = cli_parse_int(optarg, 1, 128, &layers); break;
    case 'v': ok = cli_parse_int(optarg, 64, 262144, &vocab) && vocab % 2 == 0; break;
    case 's': {
      nsizes = 0;
      char *dup = strdup(optarg), *save = NULL;
      for (char *t = strtok_r(dup, ",", &save); t && ok; t = strtok_r(NULL, ",", &save)) {
        long v;
        ok = nsizes < MAX_SIZES && cli_parse_int(t, 17, 1 << 20, &v);
        if (ok) sizes[nsizes++] = (uint32_t)v;
      }
      free(dup);
      ok = ok && nsizes > 0;
      break;
    }
    case 'm': ok = cli_parse_int(optarg, 0, MAX_MIXED, &mixed); break;
    case 'M': ok = cli_parse_int(optarg, 17, 1 << 20, &mixed_len); break;
    case 'x': ok = cli_parse_int(optarg, 0, MAX_REPS, &miss_reps); break;
    case 'j': json = true; break;
    case 'D': disk_arg = optarg; break;
    case 'h': usage(stdout); return CLI_OK;
    default: usage(stderr); return CLI_USAGE;
    }
    if (!ok) {
      fprintf(stderr, "openinfer bench ttft: bad value '%s'\n", optarg);
      return CLI_USAGE;
    }
  }
  int ndev = 0;
  if (oi_device_count(&ndev) != OI_OK || ndev <= device) {
    fprintf(stderr, "openinfer bench ttft: needs a CUDA device (%d visible)\n", ndev);
    return CLI_FAILED;
  }
  oi_device_info info = {.struct_size = sizeof info};
  oi_device_get_info((int)device, &info);
  uint32_t max_size = 0;
  for (int i = 0; i < nsizes; i++)
    max_size = sizes[i] > max_size ? sizes[i] : max_size;
  uint32_t max_len = mixed && (uint32_t)mixed_len > max_size ? (uint32_t)mixed_len : max_size;

  /* 1. dense bf16 matmul rate, 8192^3: the model's GEMM and cuBLAS. */
  fprintf(stderr, "bench ttft: matmul rate...\n");
  bench_gemm_result g8 = {0}, gm = {0};
  if (bench_gemm((int)device, 8192, 8192, 8192, 10, &g8) != OI_OK ||
      bench_gemm((int)device, 4096, 2 * 9728, 2560, 10, &gm) != OI_OK) {
    fprintf(stderr, "openinfer bench ttft: gemm: %s\n", oi_last_error());
    return CLI_FAILED;
  }
  double matmul_ref =
      g8.cublas_found && g8.cublas_tflops > g8.mine_tflops ? g8.cublas_tflops : g8.mine_tflops;

  /* 2. bulk pinned H2D, 1 GiB, best and median of 5. */
  fprintf(stderr, "bench ttft: bulk H2D...\n");
  oi_dev *dev = NULL;
  double bulk_gbps = 0;
  {
    size_t bytes = 1ull << 30;
    oi_pinned pin;
    void *d = NULL;
    oi_stream *s = NULL;
    if (oi__dev_open((int)device, &dev) != OI_OK ||
        dev->ops->pinned_alloc(dev, bytes, 0, -1, &pin) != OI_OK ||
        dev->ops->mem_alloc(dev, bytes, 0, &d) != OI_OK ||
        dev->ops->stream_create(dev, 1, &s) != OI_OK) {
      fprintf(stderr, "openinfer bench ttft: bulk setup: %s\n", oi_last_error());
      return CLI_FAILED;
    }
    memset(pin.host, 1, bytes);
    double t[5];
    oi_copy_params cp = {.mode = OI_XFER_DMA};
    oi_copy_desc desc = {(uintptr_t)pin.host, (uintptr_t)d, bytes};
    for (int i = 0; i < 6; i++) {
      uint64_t t0 = oi__now_ns();
      dev->ops->stream_copy(s, OI_COPY_H2D, &desc, 1, &cp);
      dev->ops->stream_sync(s);
      if (i) t[i - 1] = (double)(oi__now_ns() - t0);
    }
    bulk_gbps = bytes / median(t, 5);
    dev->ops->stream_destroy(s);
    dev->ops->mem_free(dev, d);
    dev->ops->pinned_free(dev, &pin);
  }

  /* 3. the model */
  fprintf(stderr, "bench ttft: generating the weights...\n");
  oi_refmodel_options ro;
  oi_refmodel_options_init(&ro);
  ro.num_layers = (uint32_t)layers;
  ro.hidden = 2560;
  ro.num_q_heads = 32;
  ro.num_kv_heads = 8;
  ro.head_dim = 128;
  ro.intermediate = 9728;
  ro.vocab_size = (uint32_t)vocab;
  ro.max_positions = max_len + 64;
  ro.rope_theta = 1000000.0f;
  ro.rms_eps = 1e-6f;
  ro.device = (int32_t)device;
  oi_model_ops ops = {.struct_size = sizeof ops};
  void *model = NULL;
  uint64_t t0 = oi__now_ns();
  if (oi_refmodel_create(&ro, &ops, &model) != OI_OK) {
    fprintf(stderr, "openinfer bench ttft: model: %s\n", oi_last_error());
    return CLI_FAILED;
  }
  double gen_s = (double)(oi__now_ns() - t0) / 1e9;
  const double H = 2560, Q = 4096, KVD = 1024, F = 9728, V = (double)vocab;
  const double lin_per_token = 2.0 * layers * (H * (Q + 2 * KVD) + Q * H + 2 * F * H + F * H);
  const uint64_t block_bytes_all_layers = (uint64_t)layers * 2 * 16 * 1024 * 2;

  uint64_t host_bytes = 0;
  for (int i = 0; i < nsizes; i++)
    host_bytes += (uint64_t)reps * (sizes[i] / 16 + 1) * block_bytes_all_layers;
  /* + the mixed prompts; the miss section evicts the pool first and needs less. */
  host_bytes += (uint64_t)mixed * ((uint64_t)mixed_len / 16 + 1) * block_bytes_all_layers;
  uint64_t miss_bytes = 0;
  for (int i = 0; i < nsizes; i++)
    miss_bytes += (uint64_t)miss_reps * (sizes[i] / 16 + 1) * block_bytes_all_layers;
  if (miss_bytes > host_bytes) host_bytes = miss_bytes;
  host_bytes = host_bytes + host_bytes / 4 + (256ull << 20);
  fprintf(stderr, "bench ttft: pinned host pool of %.1f GiB...\n",
          (double)host_bytes / (1ull << 30));
  oi_host_options ho;
  oi_host_options_init(&ho);
  ho.pool_bytes = host_bytes;
  ho.device = (int32_t)device;
  oi_host *host = NULL;
  t0 = oi__now_ns();
  if (oi_host_create(&ho, &host) != OI_OK) {
    fprintf(stderr, "openinfer bench ttft: host: %s\n", oi_last_error());
    return CLI_FAILED;
  }
  double pool_s = (double)(oi__now_ns() - t0) / 1e9;
  /* The disk tier: room for every block the run saves (+ a header each). */
  char disk_dir[512] = "";
  bool disk_scratch = false;
  const char *disk_skip = NULL;
  uint64_t disk_bytes = host_bytes + host_bytes / 8;
  if (disk_arg && !strcmp(disk_arg, "none")) {
    disk_skip = "--disk none";
  } else {
    if (disk_arg) {
      snprintf(disk_dir, sizeof disk_dir, "%s", disk_arg);
    } else {
      const char *tmp = getenv("TMPDIR");
      snprintf(disk_dir, sizeof disk_dir, "%s/openinfer-bench-ttft-XXXXXX",
               tmp && *tmp ? tmp : "/tmp");
      disk_scratch = mkdtemp(disk_dir) != NULL;
      if (!disk_scratch) disk_skip = "could not create a scratch directory";
    }
    struct statvfs vfs;
    if (!disk_skip && statvfs(disk_dir, &vfs) == 0 &&
        (uint64_t)vfs.f_bavail * vfs.f_frsize < disk_bytes + (1ull << 30))
      disk_skip = "not enough free space there";
    if (!disk_skip) {
      oi_host_disk_options dopt;
      oi_host_disk_options_init(&dopt);
      const char *dirs[1] = {disk_dir};
      dopt.dirs = dirs;
      dopt.num_dirs = 1;
      dopt.capacity_bytes = disk_bytes;
      fprintf(stderr, "bench ttft: disk tier of %.1f GiB in %s...\n",
              (double)disk_bytes / (1ull << 30), disk_dir);
      if (oi_host_attach_disk(host, &dopt) != OI_OK) {
        fprintf(stderr, "openinfer bench ttft: disk tier: %s\n", oi_last_error());
        disk_skip = "attaching it failed";
      }
    }
    if (disk_skip) fprintf(stderr, "bench ttft: no disk-warm row (%s: %s)\n", disk_dir, disk_skip);
  }
  oi_executor_options eo;
  oi_executor_options_init(&eo);
  int32_t devs[1] = {(int32_t)device};
  eo.model = &ops;
  eo.model_ctx = model;
  eo.devices = devs;
  eo.gpu_blocks = 2 * (max_size / 16 + 8) + 64;
  if (mixed && (uint32_t)mixed * ((uint32_t)mixed_len / 16 + 2) + 64 > eo.gpu_blocks)
    eo.gpu_blocks = (uint32_t)mixed * ((uint32_t)mixed_len / 16 + 2) + 64;
  eo.max_batch_tokens = (uint32_t)chunk;
  eo.offload = OI_OFFLOAD_EMBEDDED;
  eo.host = host;
  eo.restore_overlap = cli_restore_overlap_env();
  eo.restore_plan = cli_restore_plan_env();
  oi_executor *x = NULL;
  if (oi_executor_create(&eo, &x) != OI_OK) {
    fprintf(stderr, "openinfer bench ttft: executor: %s\n", oi_last_error());
    return CLI_FAILED;
  }
  uint32_t *prompt = malloc((size_t)(max_len + 1) * sizeof *prompt);
  uint32_t *first_cold = calloc((size_t)nsizes * MAX_REPS * 2, sizeof *first_cold);
  size_result *res = calloc(nsizes, sizeof *res);
  if (!prompt || !res || !first_cold) return CLI_FAILED;
  /* Warm-up: scratch and kernels, outside the measurement. */
  for (uint32_t n = 0; n <= (uint32_t)chunk && n <= max_size; n += (uint32_t)chunk) {
    uint32_t len = n ? n : 300;
    for (uint32_t i = 0; i < len; i++)
      prompt[i] = (uint32_t)((i * 7919u + 13u + n) % (uint32_t)vocab);
    oi_request r;
    oi_request_init(&r);
    r.prompt = prompt;
    r.prompt_len = len;
    r.max_new_tokens = 2;
    uint64_t id;
    if (oi_executor_submit(x, &r, &id) != OI_OK || oi_executor_run_until_idle(x) != OI_OK) {
      fprintf(stderr, "openinfer bench ttft: warm-up: %s\n", oi_last_error());
      return CLI_FAILED;
    }
  }
  bool failed = false;
  for (int si = 0; si < nsizes && !failed; si++) {
    size_result *sr = &res[si];
    sr->tokens = sizes[si];
    sr->same_tokens = true;
    for (int pass = 0; pass < 2 && !failed; pass++) {
      if (pass == 1) {
        uint64_t ev = 0;
        oi_executor_flush(x, 60000);
        oi_executor_evict_gpu_cache(x, &ev);
      }
      for (int rep = 0; rep < reps; rep++) {
        uint64_t seed = (uint64_t)sizes[si] * 1000 + rep;
        for (uint32_t i = 0; i < sizes[si]; i++)
          prompt[i] =
              (uint32_t)(oi_rm_mix64(seed * 0x9E3779B97F4A7C15ull + i + 1) % (uint64_t)vocab);
        oi_request r;
        oi_request_init(&r);
        r.prompt = prompt;
        r.prompt_len = sizes[si];
        r.max_new_tokens = 2;
        uint64_t id = 0;
        oi_request_result rr = {.struct_size = sizeof rr};
        if (oi_executor_submit(x, &r, &id) != OI_OK || oi_executor_run_until_idle(x) != OI_OK ||
            oi_executor_get_result(x, id, &rr) != OI_OK || rr.state != OI_REQUEST_FINISHED) {
          fprintf(stderr, "openinfer bench ttft: request of %u tokens: %s\n", sizes[si],
                  oi_last_error());
          failed = true;
          break;
        }
        uint32_t *ft = &first_cold[((size_t)si * MAX_REPS + rep) * 2];
        if (pass == 0) {
          sr->cold_ms[rep] = rr.ttft_ns / 1e6;
          sr->decode_ms[rep] = (rr.latency_ns - rr.ttft_ns) / 1e6;
          memcpy(ft, rr.tokens, 2 * sizeof *ft);
        } else {
          oi_exec_restore_timing tm = {0};
          oi__executor_restore_timing(x, id, &tm);
          sr->warm_ms[rep] = rr.ttft_ns / 1e6;
          sr->q_ms[rep] = tm.query_ns / 1e6;
          sr->load_ms[rep] = tm.load_ns / 1e6;
          sr->commit_ms[rep] = tm.commit_ns / 1e6;
          sr->restored[rep] = rr.restored_tokens;
          sr->computed_warm[rep] = rr.computed_tokens;
          if (memcmp(ft, rr.tokens, 2 * sizeof *ft)) sr->same_tokens = false;
        }
        fprintf(stderr, "  %u tokens, %s #%d: ttft %.2f ms (restored %u, computed %u)\n", sizes[si],
                pass ? "warm" : "cold", rep, rr.ttft_ns / 1e6, rr.restored_tokens,
                rr.computed_tokens);
      }
    }
  }

  /* 3b. Disk-warm: per size, the pool emptied too (after every block had
   * its turn at the disk), then the same prompts: the executor's query finds
   * them on disk, waits for their promotion into the pool, and loads them. */
  for (int si = 0; si < nsizes && !failed && !disk_skip; si++) {
    size_result *sr = &res[si];
    sr->disk_same = true;
    oi_executor_flush(x, 60000);
    oi_status st = oi__disk_tier_settle(oi__disk_tier_of(host), 600000);
    uint64_t ev = 0;
    if (st != OI_OK || oi_host_evict_all(host, &ev) != OI_OK ||
        oi_executor_evict_gpu_cache(x, &ev) != OI_OK) {
      fprintf(stderr, "openinfer bench ttft: emptying the pool for the disk pass: %s\n",
              oi_last_error());
      failed = true;
      break;
    }
    for (int rep = 0; rep < reps; rep++) {
      gen_prompt(prompt, sizes[si], (uint64_t)sizes[si] * 1000 + rep, (uint32_t)vocab);
      uint64_t id = 0;
      oi_request_result rr;
      if (!run_one(x, prompt, sizes[si], &id, &rr)) {
        fprintf(stderr, "openinfer bench ttft: disk-warm request of %u tokens: %s\n", sizes[si],
                oi_last_error());
        failed = true;
        break;
      }
      oi_exec_restore_timing tm = {0};
      oi__executor_restore_timing(x, id, &tm);
      sr->disk_ms[rep] = rr.ttft_ns / 1e6;
      sr->disk_q_ms[rep] = tm.query_ns / 1e6;
      sr->disk_load_ms[rep] = tm.load_ns / 1e6;
      sr->disk_restored[rep] = rr.restored_tokens;
      uint32_t *ft = &first_cold[((size_t)si * MAX_REPS + rep) * 2];
      if (memcmp(ft, rr.tokens, 2 * sizeof *ft)) sr->disk_same = false;
      fprintf(stderr, "  %u tokens, disk #%d: ttft %.2f ms (restored %u, computed %u)\n", sizes[si],
              rep, rr.ttft_ns / 1e6, rr.restored_tokens, rr.computed_tokens);
    }
  }

  /* 4. Mixed load: `mixed` distinct long prompts submitted together and run
   * to idle, cold; then flush + evict and the same again, restored. Both
   * passes start from an emptied GPU cache. */
  mixed_result mx = {.n = (uint32_t)mixed, .len = (uint32_t)mixed_len};
  if (mixed && !failed) {
    fprintf(stderr, "bench ttft: mixed load, %ld x %ld tokens...\n", mixed, mixed_len);
    uint32_t L = (uint32_t)mixed_len, want = (L - 1) / 16 * 16;
    uint32_t *mp = malloc((size_t)mixed * L * sizeof *mp);
    uint32_t first[MAX_MIXED][2];
    uint64_t ids[MAX_MIXED];
    if (!mp) return CLI_FAILED;
    for (long k = 0; k < mixed; k++)
      gen_prompt(mp + (size_t)k * L, L, 7000000 + (uint64_t)k, (uint32_t)vocab);
    mx.same = (uint32_t)mixed;
    mx.restored_min = UINT32_MAX;
    for (int pass = 0; pass < 2 && !failed; pass++) {
      oi_executor_flush(x, 60000);
      oi_executor_evict_gpu_cache(x, NULL);
      oi_executor_stats before = {.struct_size = sizeof before},
                        after = {.struct_size = sizeof after};
      oi_executor_get_stats(x, &before);
      uint64_t tw = oi__now_ns();
      for (long k = 0; k < mixed; k++) {
        oi_request r;
        oi_request_init(&r);
        r.prompt = mp + (size_t)k * L;
        r.prompt_len = L;
        r.max_new_tokens = 2;
        if (oi_executor_submit(x, &r, &ids[k]) != OI_OK) {
          fprintf(stderr, "openinfer bench ttft: mixed submit: %s\n", oi_last_error());
          failed = true;
          break;
        }
      }
      if (!failed && oi_executor_run_until_idle(x) != OI_OK) {
        fprintf(stderr, "openinfer bench ttft: mixed run: %s\n", oi_last_error());
        failed = true;
      }
      mx.wall_ms[pass] = (double)(oi__now_ns() - tw) / 1e6;
      oi_executor_get_stats(x, &after);
      if (pass == 1) mx.restores_failed = after.restores_failed - before.restores_failed;
      double tt[MAX_MIXED];
      int ntt = 0;
      for (long k = 0; k < mixed && !failed; k++) {
        oi_request_result rr = {.struct_size = sizeof rr};
        if (oi_executor_get_result(x, ids[k], &rr) != OI_OK || rr.state != OI_REQUEST_FINISHED) {
          mx.errors++;
          continue;
        }
        tt[ntt++] = rr.ttft_ns / 1e6;
        if (pass == 0) {
          memcpy(first[k], rr.tokens, sizeof first[k]);
        } else {
          mx.full_restores += rr.restored_tokens == want;
          if (rr.restored_tokens < mx.restored_min) mx.restored_min = rr.restored_tokens;
          if (rr.restored_tokens > mx.restored_max) mx.restored_max = rr.restored_tokens;
          if (memcmp(first[k], rr.tokens, sizeof first[k])) mx.same--;
        }
      }
      if (ntt) {
        qsort(tt, ntt, sizeof *tt, cmp_d);
        mx.ttft_p50_ms[pass] = ntt % 2 ? tt[ntt / 2] : 0.5 * (tt[ntt / 2 - 1] + tt[ntt / 2]);
        mx.ttft_max_ms[pass] = tt[ntt - 1];
      }
      fprintf(stderr, "  mixed %s: wall %.1f ms, ttft p50 %.1f ms, max %.1f ms\n",
              pass ? "warm" : "cold", mx.wall_ms[pass], mx.ttft_p50_ms[pass], mx.ttft_max_ms[pass]);
    }
    if (mx.restored_min == UINT32_MAX) mx.restored_min = 0;
    free(mp);
  }

  /* 5. The offload-on miss path: new prompts through this executor (host
   * tier on; every query misses) and through a second one with offload NONE
   * (its own model instance, the same weights), interleaved and in
   * alternating order; saves are flushed between requests, outside the
   * timed region. */
  miss_result *ms = calloc(nsizes, sizeof *ms);
  if (!ms) return CLI_FAILED;
  if (miss_reps && !failed) {
    fprintf(stderr, "bench ttft: offload-on miss path vs offload off...\n");
    oi_executor_flush(x, 60000);
    oi_executor_evict_gpu_cache(x, NULL);
    oi_host_evict_all(host, NULL);
    oi_model_ops ops_off = {.struct_size = sizeof ops_off};
    void *model_off = NULL;
    oi_executor *xoff = NULL;
    oi_executor_options eo2 = eo;
    eo2.offload = OI_OFFLOAD_NONE;
    eo2.host = NULL;
    eo2.model = &ops_off;
    eo2.gpu_blocks = 2 * (max_size / 16 + 8) + 64;
    if (oi_refmodel_create(&ro, &ops_off, &model_off) != OI_OK ||
        (eo2.model_ctx = model_off, oi_executor_create(&eo2, &xoff)) != OI_OK) {
      fprintf(stderr, "openinfer bench ttft: offload-off executor: %s\n", oi_last_error());
      failed = true;
    }
    /* the same warm-up as above */
    for (uint32_t n = 0; !failed && n <= (uint32_t)chunk && n <= max_size; n += (uint32_t)chunk) {
      uint32_t len = n ? n : 300;
      for (uint32_t i = 0; i < len; i++)
        prompt[i] = (uint32_t)((i * 7919u + 13u + n) % (uint32_t)vocab);
      uint64_t id;
      oi_request_result rr;
      if (!run_one(xoff, prompt, len, &id, &rr)) {
        fprintf(stderr, "openinfer bench ttft: warm-up (offload off): %s\n", oi_last_error());
        failed = true;
      }
    }
    for (int rep = 0; rep < miss_reps && !failed; rep++)
      for (int si = 0; si < nsizes && !failed; si++) {
        miss_result *m = &ms[si];
        m->tokens = sizes[si];
        gen_prompt(prompt, sizes[si], 9000000 + (uint64_t)sizes[si] * 100 + rep, (uint32_t)vocab);
        uint32_t tok[2][2];
        for (int k = 0; k < 2 && !failed; k++) {
          bool on = (k == 0) == (rep % 2 == 0);
          oi_executor *e = on ? x : xoff;
          uint64_t id;
          oi_request_result rr;
          if (!run_one(e, prompt, sizes[si], &id, &rr)) {
            fprintf(stderr, "openinfer bench ttft: miss path, %u tokens: %s\n", sizes[si],
                    oi_last_error());
            failed = true;
            break;
          }
          memcpy(tok[on], rr.tokens, sizeof tok[on]);
          if (on) {
            oi_exec_restore_timing tm = {0};
            oi__executor_restore_timing(x, id, &tm);
            m->on_ms[rep] = rr.ttft_ns / 1e6;
            m->query_us[rep] = tm.query_ns / 1e3;
            m->hits += rr.restored_tokens + rr.cached_tokens > 0;
            oi_executor_flush(x, 60000);
          } else {
            m->off_ms[rep] = rr.ttft_ns / 1e6;
          }
        }
        if (!failed) m->same += !memcmp(tok[0], tok[1], sizeof tok[0]);
        if (!failed)
          fprintf(stderr, "  miss %u tokens #%d: on %.2f ms, off %.2f ms\n", sizes[si], rep,
                  m->on_ms[rep], m->off_ms[rep]);
      }
    oi_executor_destroy(xoff);
    oi_refmodel_destroy(model_off);
  }

  oi_executor_stats xs = {.struct_size = sizeof xs};
  oi_executor_get_stats(x, &xs);
  oi_host_disk_stats ds = {.struct_size = sizeof ds};
  if (!disk_skip) oi_host_get_disk_stats(host, &ds);
  oi_executor_destroy(x);
  oi_host_destroy(host);
  if (disk_scratch) { /* the store's three files, then the directory */
    static const char *const files[] = {"openinfer-disk.data", "openinfer-disk.log",
                                        "openinfer-disk.ckpt"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
      char f[600];
      snprintf(f, sizeof f, "%s/%s", disk_dir, files[i]);
      unlink(f);
    }
    rmdir(disk_dir);
  }
  oi_refmodel_destroy(model);
  oi__dev_close(dev);
  if (failed) return CLI_FAILED;

  int R = (int)reps;
  if (!json) {
    printf("openinfer bench ttft — libopeninfer %s, %s (%u SMs), device %ld\n", oi_version_string(),
           info.name, info.multiprocessors, device);
    printf("model: refmodel-cuda Qwen3-4B shape, %ld layers, hidden 2560, 32 q / 8 kv heads x 128, "
           "MLP 9728, vocab %ld, bf16 (weights generated on the GPU in %.2f s); page 16; prefill "
           "chunk %ld; host pool %.1f GiB pinned (%.2f s)\n\n",
           layers, vocab, gen_s, chunk, (double)host_bytes / (1ull << 30), pool_s);
    printf("dense bf16 matmul rate, this GPU, this run (median of 10):\n");
    printf("  model GEMM (batch-invariant; wgmma on sm_90)  8192^3: %7.1f TFLOP/s   M4096 N19456 "
           "K2560: %7.1f\n",
           g8.mine_tflops, gm.mine_tflops);
    if (g8.cublas_found)
      printf("  cuBLAS cublasGemmEx (reference)        8192^3: %7.1f TFLOP/s   M4096 N19456 K2560: "
             "%7.1f"
             "   (max |mine - cuBLAS| / max|C| = %.2g)\n",
             g8.cublas_tflops, gm.cublas_tflops, g8.max_rel_diff);
    else
      printf("  cuBLAS: not found (dlopen libcublas.so.13 failed)\n");
    printf("bulk pinned H2D (1 GiB cudaMemcpyAsync, median of 5): %.1f GB/s\n\n", bulk_gbps);
    printf("%7s %10s %10s %7s %8s %8s %8s %9s %9s %9s %9s %8s %8s\n", "prompt", "cold p50",
           "warm p50", "ratio", "query", "load", "commit", "KV MB", "bound", "decode", "TFLOP/s",
           "%mm", "tokens");
  }
  int met = 0, total = 0;
  if (json)
    printf(
        "{\"bench\":\"ttft\",\"gpu\":\"%s\",\"layers\":%ld,\"vocab\":%ld,\"chunk\":%ld,"
        "\"gemm_8192_tflops\":%.2f,\"gemm_model_tflops\":%.2f,\"cublas_8192_tflops\":%.2f,"
        "\"cublas_model_tflops\":%.2f,\"gemm_vs_cublas_max_rel_diff\":%.3g,\"bulk_h2d_gbps\":%.2f,"
        "\"sizes\":[",
        info.name, layers, vocab, chunk, g8.mine_tflops, gm.mine_tflops, g8.cublas_tflops,
        gm.cublas_tflops, g8.max_rel_diff, bulk_gbps);
  for (int si = 0; si < nsizes; si++) {
    size_result *sr = &res[si];
    double S = sr->tokens;
    double cold = median(sr->cold_ms, R), warm = median(sr->warm_ms, R);
    double dec = median(sr->decode_ms, R);
    double flops = lin_per_token * S + 2.0 * H * V + layers * 32.0 * 4 * 128 * S * (S + 1) / 2;
    double tflops = flops / (cold * 1e-3) / 1e12;
    uint32_t restored = sr->restored[R / 2];
    double kv_mb = (double)restored / 16 * block_bytes_all_layers / 1e6;
    double bound = 1.3 * (kv_mb * 1e6 / bulk_gbps) / 1e6 + dec; /* ms */
    double ratio = warm > 0 ? cold / warm : 0;
    double pct = tflops / matmul_ref;
    bool ok_bound = warm <= bound, ok_pct = pct >= 0.35;
    bool ok_ratio = sr->tokens >= 16384 ? ratio >= 10 : sr->tokens >= 4096 ? ratio >= 5 : true;
    total += 3;
    met += ok_bound + ok_pct + ok_ratio;
    if (json) {
      printf("%s{\"tokens\":%u,\"cold_ttft_p50_ms\":%.3f,\"warm_ttft_p50_ms\":%.3f,\"ratio\":%.3f,"
             "\"query_ms\":%.4f,\"load_ms\":%.3f,\"commit_ms\":%.4f,\"restored_tokens\":%u,"
             "\"restored_kv_bytes\":%.0f,\"warm_bound_ms\":%.3f,\"decode_step_ms\":%.3f,"
             "\"cold_tflops\":%.2f,\"cold_vs_matmul\":%.4f,\"tokens_identical\":%s,"
             "\"pass\":{\"warm_bound\":%s,\"cold_35pct\":%s,\"ratio\":%s}}",
             si ? "," : "", sr->tokens, cold, warm, ratio, median(sr->q_ms, R),
             median(sr->load_ms, R), median(sr->commit_ms, R), restored, kv_mb * 1e6, bound, dec,
             tflops, pct, sr->same_tokens ? "true" : "false", ok_bound ? "true" : "false",
             ok_pct ? "true" : "false", ok_ratio ? "true" : "false");
    } else {
      printf("%7u %8.2fms %8.2fms %6.1fx %6.3fms %6.2fms %6.3fms %9.1f %7.2fms %7.2fms %9.1f "
             "%7.1f%% %8s\n",
             sr->tokens, cold, warm, ratio, median(sr->q_ms, R), median(sr->load_ms, R),
             median(sr->commit_ms, R), kv_mb, bound, dec, tflops, 100 * pct,
             sr->same_tokens ? "same" : "DIFFER");
      printf(
          "        %s warm <= 1.3 x KV/bulk + decode;  %s cold >= 35%% of matmul;  %s ratio %s\n",
          ok_bound ? "PASS" : "MISS", ok_pct ? "PASS" : "MISS",
          sr->tokens >= 4096 ? (ok_ratio ? "PASS" : "MISS") : "----",
          sr->tokens >= 16384  ? ">= 10x"
          : sr->tokens >= 4096 ? ">= 5x"
                               : "(no target)");
    }
  }
  if (json) printf("]");
  /* disk-warm rows */
  if (!disk_skip) {
    if (json)
      printf(",\"disk\":{\"spills\":%llu,\"promotions\":%llu,\"promote_failed\":%llu,"
             "\"checksum_failures\":%llu,\"sizes\":[",
             (unsigned long long)ds.spills, (unsigned long long)ds.promotions,
             (unsigned long long)ds.promote_failed, (unsigned long long)ds.checksum_failures);
    else
      printf("\nrestored from disk (pool emptied too; one query that waits for the disk, then "
             "the load):\n%7s %10s %10s %10s %8s %8s %9s %9s %8s\n",
             "prompt", "cold p50", "host p50", "disk p50", "cold/disk", "query", "load",
             "read GB/s", "tokens");
    for (int si = 0; si < nsizes; si++) {
      size_result *sr = &res[si];
      double cold = median(sr->cold_ms, R), warm = median(sr->warm_ms, R);
      double disk = median(sr->disk_ms, R), q = median(sr->disk_q_ms, R);
      double ld = median(sr->disk_load_ms, R);
      uint32_t restored = sr->disk_restored[R / 2];
      double bytes = (double)restored / 16 * block_bytes_all_layers;
      double gbps = q > 0 ? bytes / (q * 1e6) : 0;
      if (json)
        printf("%s{\"tokens\":%u,\"cold_ttft_p50_ms\":%.3f,\"host_warm_ttft_p50_ms\":%.3f,"
               "\"disk_warm_ttft_p50_ms\":%.3f,\"cold_over_disk\":%.3f,\"query_wait_ms\":%.3f,"
               "\"load_ms\":%.3f,\"restored_tokens\":%u,\"read_gbps\":%.3f,"
               "\"tokens_identical\":%s}",
               si ? "," : "", sr->tokens, cold, warm, disk, disk > 0 ? cold / disk : 0, q, ld,
               restored, gbps, sr->disk_same ? "true" : "false");
      else
        printf("%7u %8.2fms %8.2fms %8.2fms %8.2fx %6.2fms %6.2fms %9.2f %8s\n", sr->tokens, cold,
               warm, disk, disk > 0 ? cold / disk : 0, q, ld, gbps,
               sr->disk_same ? "same" : "DIFFER");
    }
    if (json)
      printf("]}");
    else
      printf("  (disk: %llu spills, %llu promotions, %llu failed, %llu checksum failures)\n",
             (unsigned long long)ds.spills, (unsigned long long)ds.promotions,
             (unsigned long long)ds.promote_failed, (unsigned long long)ds.checksum_failures);
  }
  /* mixed load */
  if (mixed) {
    bool ok =
        mx.full_restores == mx.n && mx.errors == 0 && mx.restores_failed == 0 && mx.same == mx.n;
    double ratio = mx.wall_ms[1] > 0 ? mx.wall_ms[0] / mx.wall_ms[1] : 0;
    total++;
    met += ok;
    if (json)
      printf(",\"mixed\":{\"prompts\":%u,\"tokens\":%u,\"cold_wall_ms\":%.3f,\"warm_wall_ms\":%.3f,"
             "\"ratio\":%.3f,\"cold_ttft_p50_ms\":%.3f,\"warm_ttft_p50_ms\":%.3f,\"cold_ttft_max_"
             "ms\":%.3f,"
             "\"warm_ttft_max_ms\":%.3f,\"full_prefix_restores\":%u,\"restored_tokens_min\":%u,"
             "\"restored_tokens_max\":%u,\"errors\":%u,\"restores_failed\":%llu,\"tokens_"
             "identical\":%u,"
             "\"pass\":%s}",
             mx.n, mx.len, mx.wall_ms[0], mx.wall_ms[1], ratio, mx.ttft_p50_ms[0],
             mx.ttft_p50_ms[1], mx.ttft_max_ms[0], mx.ttft_max_ms[1], mx.full_restores,
             mx.restored_min, mx.restored_max, mx.errors, (unsigned long long)mx.restores_failed,
             mx.same, ok ? "true" : "false");
    else {
      printf("\nmixed load: %u distinct prompts of %u tokens submitted together, run to idle; "
             "cold, then\n"
             "again after flush + GPU-cache eviction (restored from the host tier):\n",
             mx.n, mx.len);
      printf("  wall time   cold %9.1f ms   warm %9.1f ms   ratio %.1fx\n", mx.wall_ms[0],
             mx.wall_ms[1], ratio);
      printf("  TTFT p50    cold %9.1f ms   warm %9.1f ms   (max %.1f / %.1f ms)\n",
             mx.ttft_p50_ms[0], mx.ttft_p50_ms[1], mx.ttft_max_ms[0], mx.ttft_max_ms[1]);
      printf("  full-prefix restores %u of %u (restored tokens %u..%u, want %u each); errors %u; "
             "restores "
             "failed %llu; first tokens identical %u of %u\n",
             mx.full_restores, mx.n, mx.restored_min, mx.restored_max, (mx.len - 1) / 16 * 16,
             mx.errors, (unsigned long long)mx.restores_failed, mx.same, mx.n);
      printf("        %s full-prefix restores, zero errors\n", ok ? "PASS" : "MISS");
    }
  }
  /* offload-on miss path */
  if (miss_reps) {
    int MR = (int)miss_reps;
    if (json)
      printf(",\"miss\":[");
    else
      printf("\noffload-on miss path: new prompts (every host-tier query misses) through this "
             "executor\n"
             "vs one with offload NONE, interleaved, %d each:\n%7s %10s %10s %9s %10s %6s %8s\n",
             MR, "prompt", "on p50", "off p50", "overhead", "query p50", "hits", "tokens");
    for (int si = 0; si < nsizes; si++) {
      miss_result *m = &ms[si];
      double on = median(m->on_ms, MR), off = median(m->off_ms, MR), q = median(m->query_us, MR);
      double pct = off > 0 ? 100.0 * (on - off) / off : 0;
      bool ok = pct <= 2.0 && m->hits == 0;
      total++;
      met += ok;
      if (json)
        printf("%s{\"tokens\":%u,\"on_ttft_p50_ms\":%.3f,\"off_ttft_p50_ms\":%.3f,\"overhead_pct\":"
               "%.3f,"
               "\"query_p50_us\":%.2f,\"hits\":%u,\"tokens_identical\":%u,\"pass\":%s}",
               si ? "," : "", sizes[si], on, off, pct, q, m->hits, m->same, ok ? "true" : "false");
      else
        printf("%7u %8.2fms %8.2fms %8.2f%% %8.1fus %6u %5u/%d  %s <= 2%%\n", sizes[si], on, off,
               pct, q, m->hits, m->same, MR, ok ? "PASS" : "MISS");
    }
    if (json) printf("]");
  }
  if (json) {
    printf(",\"matmul_reference_tflops\":%.2f,\"restores_failed\":%llu,"
           "\"restores_overlapped\":%llu,\"restores_completed\":%llu,\"targets_met\":%d,"
           "\"targets\":%d}\n",
           matmul_ref, (unsigned long long)xs.restores_failed,
           (unsigned long long)xs.restores_overlapped, (unsigned long long)xs.restores_completed,
           met, total);
  } else {
    printf(
        "\n(cold: distinct prompts, TTFT = submit -> first token through the executor; warm: the\n"
        " same prompts after flush + GPU-cache eviction, restored from the host tier; load =\n"
        " submit -> completion seen after the step whose forward overlapped it (layer by layer;\n"
        " OI_RESTORE_OVERLAP=0: at the next step boundary, then the forward); bound = 1.3 x\n"
        " restored KV / bulk H2D + one decode step at that context; TFLOP/s counts linear\n"
        " layers + causal attention;\n"
        " %%mm against %.1f TFLOP/s, the larger of the model GEMM and cuBLAS at 8192^3;\n"
        " tokens: the first two generated tokens, warm vs cold (miss path: on vs off).)\n"
        " restores: %llu completed, %llu overlapped with the forward, %llu failed\n",
        matmul_ref, (unsigned long long)xs.restores_completed,
        (unsigned long long)xs.restores_overlapped, (unsigned long long)xs.restores_failed);
    printf("targets met: %d of %d\n", met, total);
  }
  free(prompt);
  free(first_cold);
  free(res);
  free(ms);
  return CLI_OK;
}
