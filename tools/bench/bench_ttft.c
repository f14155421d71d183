/* `openinfer bench ttft`: time to first token of the reference model through
 * the executor (CUDA: the Qwen3-4B shape; or the cpu backend), cold prefill
 * vs warm restores after the GPU prefix cache was evicted, in one run: from
 * the host tier and from the disk tier, each with the restore plan off
 * (load every hit) and on (restore or recompute, docs/planner.md), as
 * ratios to cold; beside the figures that judge it on a GPU: the dense bf16
 * matmul rate (the model's GEMM and cuBLAS at a large square size), the bulk
 * pinned H2D bandwidth, and the decode step. See docs/benchmarks.md. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include "bench_cuda.h"
#include "bench_disk.h"
#include "cli.h"
#include "codec/codec.h"
#include "device/device.h"
#include "disk/tier.h"
#include "executor/executor_internal.h"
#include "openinfer/disk.h"
#include "openinfer/openinfer.h"
#include "refmodel/kernels/refmodel_gen.h"

#define MAX_SIZES 8
#define MAX_REPS 16
#define MAX_MIXED 64

/* The warm rows: the same prompts as cold, after flush + GPU-cache eviction
 * (host), or with the pool emptied too (disk: every block read back from the
 * disk tier); each with the plan off (load every hit) and on. */
enum { ROW_HOST_LOAD, ROW_HOST_PLAN, ROW_DISK_LOAD, ROW_DISK_PLAN, ROWS };
static const char *const row_name[ROWS] = {"host_load_only", "host_planned", "disk_load_only",
                                           "disk_planned"};

typedef struct row_result {
  double ms[MAX_REPS], q_ms[MAX_REPS], load_ms[MAX_REPS], commit_ms[MAX_REPS];
  uint32_t restored[MAX_REPS], computed[MAX_REPS];
  /* The plans of this row's requests (oi_executor_stats deltas). */
  uint64_t plans, plans_compute, plans_split, plans_partial;
  bool same; /* the first two tokens as cold, every rep */
} row_result;

typedef struct size_result {
  uint32_t tokens;
  double cold_ms[MAX_REPS], decode_ms[MAX_REPS];
  row_result row[ROWS];
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
  fprintf(
      f,
      "usage: openinfer bench ttft [--device N|cpu] [--sizes A,B,...] [--reps N] [--chunk N]\n"
      "                            [--mixed N] [--mixed-tokens N] [--miss-reps N]\n"
      "                            [--disk DIR|none] [--layers N] [--vocab N] [--hidden N]\n"
      "                            [--heads N] [--kv-heads N] [--head-dim N] [--mlp N]\n"
      "                            [--codec C] [--json]\n"
      "\n"
      "The reference model behind the executor with an embedded host tier. On a GPU\n"
      "(default: device 0 when one is visible) the CUDA model in the Qwen3-4B shape (36\n"
      "layers, hidden 2560, 32 query heads, 8 KV heads, head dim 128, MLP 9728, bf16, page\n"
      "16) over a pinned pool; with --device cpu (default without a GPU) the cpu model\n"
      "(float32; default 4 layers, hidden 128, 2 query and 2 KV heads of 64, MLP 512,\n"
      "vocab 2048) over a pageable pool. Per prompt size: cold prefill TTFT (distinct\n"
      "prompts); the same prompts restored from the host tier after flush + GPU-cache\n"
      "eviction, and from the disk tier after the pool was emptied too, each with the\n"
      "restore plan off (load-only: every hit loads) and on (planned: restore or\n"
      "recompute, docs/planner.md), interleaved per prompt: TTFT p50 and the ratio to\n"
      "cold of each, what the plans chose, the restore broken out (query, load, commit);\n"
      "on a GPU the cold prefill's achieved TFLOP/s beside the dense bf16 matmul rate\n"
      "measured in the same run (the model's GEMM and cuBLAS at 8192^3), bulk H2D, and\n"
      "the decode step.\n"
      "\n"
      "  --sizes    prompt lengths (default 1466,4096,16384; cpu 256,1024,2048)\n"
      "  --reps     prompts per size (default 3)\n"
      "  --chunk    max_batch_tokens: the prefill chunk (default 4096; cpu 1024)\n"
      "  --mixed    mixed load: N distinct long prompts submitted together, cold, then again\n"
      "             after flush + eviction (full-prefix restores, errors, wall time warm vs\n"
      "             cold); default 16 (cpu 0), 0 skips it\n"
      "  --mixed-tokens  their length (default 4096)\n"
      "  --miss-reps the offload-on miss path: per size, N new prompts through this executor\n"
      "             (host tier on, every query misses) and through one with offload NONE,\n"
      "             interleaved: TTFT p50 each and the overhead (default 4, cpu 0; 0 skips it)\n"
      "  --disk     a disk tier under the pool, in DIR (default: a scratch directory under\n"
      "             TMPDIR, removed after; 'none' skips it): per size, the same prompts again\n"
      "             after the pool was emptied too, restored from disk (the disk-warm rows)\n"
      "  --codec    none (default), lossless, int8, int8-hadamard, fp8: every row's blocks\n"
      "             are saved and restored as its frames (lossy codecs: the cuda model's bf16 KV)\n"
      "  --layers, --vocab   model size (default 36, 32768; cpu 4, 2048)\n"
      "  --hidden, --heads, --kv-heads, --head-dim, --mlp   the model's shape (defaults\n"
      "             above): fewer KV heads and a larger hidden size make fewer KV bytes per\n"
      "             prefill FLOP\n"
      "\n"
      "OI_RESTORE_OVERLAP=0|off|host as for the executor; OI_RESTORE_PLAN=0|off applies to\n"
      "the mixed-load and miss sections (the warm rows set the plan themselves).\n");
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
                                     {"hidden", required_argument, 0, 'H'},
                                     {"heads", required_argument, 0, 'q'},
                                     {"kv-heads", required_argument, 0, 'k'},
                                     {"head-dim", required_argument, 0, 'a'},
                                     {"mlp", required_argument, 0, 'f'},
                                     {"codec", required_argument, 0, 'C'},
                                     {"help", no_argument, 0, 'h'},
                                     {0, 0, 0, 0}};
  /* -1: not given (the device's default); device -2: auto, -1: cpu. */
  long device = -2, reps = 3, chunk = -1, layers = -1, vocab = -1;
  long hidden = -1, heads = -1, kv_heads = -1, head_dim = -1, mlp = -1;
  long mixed = -1, mixed_len = 4096, miss_reps = -1;
  uint32_t sizes[MAX_SIZES] = {0};
  int nsizes = 0;
  bool json = false;
  const char *disk_arg = NULL, *codec = "none";
  optind = 1;
  int c;
  while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
    bool ok = true;
    switch (c) {
    case 'd':
      if (!strcmp(optarg, "cpu"))
        device = -1;
      else
        ok = cli_parse_int(optarg, 0, 64, &device);
      break;
    case 'H': ok = cli_parse_int(optarg, 16, 16384, &hidden); break;
    case 'q': ok = cli_parse_int(optarg, 1, 256, &heads); break;
    case 'k': ok = cli_parse_int(optarg, 1, 256, &kv_heads); break;
    case 'a': ok = cli_parse_int(optarg, 2, 512, &head_dim) && head_dim % 2 == 0; break;
    case 'f': ok = cli_parse_int(optarg, 16, 65536, &mlp); break;
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
    case 'C':
      codec = optarg;
      ok = oi__codec_from_name(codec) >= 0;
      break;
    case 'h': usage(stdout); return CLI_OK;
    default: usage(stderr); return CLI_USAGE;
    }
    if (!ok) {
      fprintf(stderr, "openinfer bench ttft: bad value '%s'\n", optarg);
      return CLI_USAGE;
    }
  }
  int ndev = 0;
  if (oi_device_count(&ndev) != OI_OK) ndev = 0;
  oi_clear_error();
  if (device == -2) device = ndev > 0 ? 0 : -1;
  if (device >= ndev) {
    fprintf(stderr, "openinfer bench ttft: device %ld is not present (%d CUDA device%s visible)\n",
            device, ndev, ndev == 1 ? "" : "s");
    return CLI_FAILED;
  }
  const bool gpu = device >= 0;
  oi_device_info info = {.struct_size = sizeof info};
  if (gpu) oi_device_get_info((int)device, &info);
  /* The device's defaults: the Qwen3-4B shape on a GPU; on the cpu the
   * demo's small model (its prefill is scalar C: a few hundred tokens/s),
   * without the mixed-load and miss sections, so a run takes minutes. */
  if (!nsizes) {
    static const uint32_t gpu_sizes[3] = {1466, 4096, 16384}, cpu_sizes[3] = {256, 1024, 2048};
    memcpy(sizes, gpu ? gpu_sizes : cpu_sizes, sizeof gpu_sizes);
    nsizes = 3;
  }
#define DEF(v, g, c)                                                                               \
  if ((v) < 0) (v) = gpu ? (g) : (c)
  DEF(chunk, 4096, 1024);
  DEF(layers, 36, 4);
  DEF(vocab, 32768, 2048);
  DEF(hidden, 2560, 128);
  DEF(heads, 32, 2);
  DEF(kv_heads, 8, 2);
  DEF(head_dim, 128, 64);
  DEF(mlp, 9728, 512);
  DEF(mixed, 16, 0);
  DEF(miss_reps, 4, 0);
#undef DEF
  if (heads % kv_heads) {
    fprintf(stderr, "openinfer bench ttft: --kv-heads %ld does not divide --heads %ld\n", kv_heads,
            heads);
    return CLI_USAGE;
  }
  uint32_t max_size = 0;
  for (int i = 0; i < nsizes; i++)
    max_size = sizes[i] > max_size ? sizes[i] : max_size;
  uint32_t max_len = mixed && (uint32_t)mixed_len > max_size ? (uint32_t)mixed_len : max_size;

  /* 1. dense bf16 matmul rate, 8192^3: the model's GEMM and cuBLAS (a GPU). */
  bench_gemm_result g8 = {0}, gm = {0};
  if (gpu) fprintf(stderr, "bench ttft: matmul rate...\n");
  if (gpu && (bench_gemm((int)device, 8192, 8192, 8192, 10, &g8) != OI_OK ||
              bench_gemm((int)device, 4096, 2 * (int)mlp, (int)hidden, 10, &gm) != OI_OK)) {
    fprintf(stderr, "openinfer bench ttft: gemm: %s\n", oi_last_error());
    return CLI_FAILED;
  }
  double matmul_ref =
      g8.cublas_found && g8.cublas_tflops > g8.mine_tflops ? g8.cublas_tflops : g8.mine_tflops;

  /* 2. bulk pinned H2D, 1 GiB, best and median of 5 (a GPU). */
  oi_dev *dev = NULL;
  double bulk_gbps = 0;
  if (gpu) {
    fprintf(stderr, "bench ttft: bulk H2D...\n");
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
  ro.hidden = (uint32_t)hidden;
  ro.num_q_heads = (uint32_t)heads;
  ro.num_kv_heads = (uint32_t)kv_heads;
  ro.head_dim = (uint32_t)head_dim;
  ro.intermediate = (uint32_t)mlp;
  ro.vocab_size = (uint32_t)vocab;
  ro.max_positions = max_len + 64;
  ro.rope_theta = 1000000.0f;
  ro.rms_eps = 1e-6f;
  ro.device = gpu ? (int32_t)device : -1;
  oi_model_ops ops = {.struct_size = sizeof ops};
  void *model = NULL;
  uint64_t t0 = oi__now_ns();
  if (oi_refmodel_create(&ro, &ops, &model) != OI_OK) {
    fprintf(stderr, "openinfer bench ttft: model: %s\n", oi_last_error());
    return CLI_FAILED;
  }
  double gen_s = (double)(oi__now_ns() - t0) / 1e9;
  const double H = (double)hidden, Q = (double)(heads * head_dim),
               KVD = (double)(kv_heads * head_dim), F = (double)mlp, V = (double)vocab;
  const double lin_per_token = 2.0 * layers * (H * (Q + 2 * KVD) + Q * H + 2 * F * H + F * H);
  const uint64_t kv_dtype = gpu ? 2 : 4; /* bf16 on the GPU, float32 on the cpu */
  const uint64_t block_bytes_all_layers =
      (uint64_t)layers * 2 * 16 * (uint64_t)(kv_heads * head_dim) * kv_dtype;

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
  fprintf(stderr, "bench ttft: %s host pool of %.1f GiB...\n", gpu ? "pinned" : "pageable",
          (double)host_bytes / (1ull << 30));
  oi_host_options ho;
  oi_host_options_init(&ho);
  ho.pool_bytes = host_bytes;
  ho.device = gpu ? (int32_t)device : -1;
  if (!gpu) ho.flags = OI_HOST_NO_PIN;
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
  eo.devices = gpu ? devs : NULL;
  eo.gpu_blocks = 2 * (max_size / 16 + 8) + 64;
  if (mixed && (uint32_t)mixed * ((uint32_t)mixed_len / 16 + 2) + 64 > eo.gpu_blocks)
    eo.gpu_blocks = (uint32_t)mixed * ((uint32_t)mixed_len / 16 + 2) + 64;
  eo.max_batch_tokens = (uint32_t)chunk;
  eo.offload = OI_OFFLOAD_EMBEDDED;
  eo.host = host;
  eo.restore_overlap = cli_restore_overlap_env();
  eo.restore_plan = cli_restore_plan_env();
  eo.codec = codec;
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
  /* 3a. Cold: distinct prompts, each size in turn. */
  for (int si = 0; si < nsizes && !failed; si++) {
    size_result *sr = &res[si];
    sr->tokens = sizes[si];
    for (int k = 0; k < ROWS; k++)
      sr->row[k].same = true;
    for (int rep = 0; rep < reps; rep++) {
      gen_prompt(prompt, sizes[si], (uint64_t)sizes[si] * 1000 + rep, (uint32_t)vocab);
      uint64_t id = 0;
      oi_request_result rr;
      if (!run_one(x, prompt, sizes[si], &id, &rr)) {
        fprintf(stderr, "openinfer bench ttft: request of %u tokens: %s\n", sizes[si],
                oi_last_error());
        failed = true;
        break;
      }
      sr->cold_ms[rep] = rr.ttft_ns / 1e6;
      sr->decode_ms[rep] = (rr.latency_ns - rr.ttft_ns) / 1e6;
      memcpy(&first_cold[((size_t)si * MAX_REPS + rep) * 2], rr.tokens, 2 * sizeof *first_cold);
      fprintf(stderr, "  %u tokens, cold #%d: ttft %.2f ms\n", sizes[si], rep, rr.ttft_ns / 1e6);
    }
  }

  /* 3b. The warm rows, per size and prompt: host load-only and planned
   * (flush + GPU-cache eviction before each), then disk load-only and
   * planned (the pool emptied too, after every block had its turn at the
   * disk: the executor's query finds them on disk and, loading, waits for
   * their promotion). The two of a tier alternate which goes first. The plan
   * uses the prefill cost fitted to the cold forwards and the rates the host
   * measured so far. */
  for (int tier = 0; tier < 2 && !failed; tier++) {
    if (tier == 1 && disk_skip) break;
    for (int si = 0; si < nsizes && !failed; si++) {
      size_result *sr = &res[si];
      for (int rep = 0; rep < reps && !failed; rep++) {
        gen_prompt(prompt, sizes[si], (uint64_t)sizes[si] * 1000 + rep, (uint32_t)vocab);
        for (int j = 0; j < 2 && !failed; j++) {
          bool planned = (j == 0) == (rep % 2 == 1);
          int k = tier * 2 + planned; /* ROW_* */
          row_result *rw = &sr->row[k];
          uint64_t ev = 0;
          oi_status st = oi_executor_flush(x, 60000);
          if (st == OI_OK && tier == 1) st = oi__disk_tier_settle(oi__disk_tier_of(host), 600000);
          if (st == OI_OK && tier == 1) st = oi_host_evict_all(host, &ev);
          if (st == OI_OK) st = oi_executor_evict_gpu_cache(x, &ev);
          if (st == OI_OK)
            st = oi__executor_set_restore_plan(x, planned ? OI_RESTORE_PLAN_AUTO
                                                          : OI_RESTORE_PLAN_OFF);
          oi_executor_stats before = {.struct_size = sizeof before},
                            after = {.struct_size = sizeof after};
          oi_executor_get_stats(x, &before);
          uint64_t id = 0;
          oi_request_result rr;
          if (st != OI_OK || !run_one(x, prompt, sizes[si], &id, &rr)) {
            fprintf(stderr, "openinfer bench ttft: %s request of %u tokens: %s\n", row_name[k],
                    sizes[si], oi_last_error());
            failed = true;
            break;
          }
          oi_executor_get_stats(x, &after);
          oi_exec_restore_timing tm = {0};
          oi__executor_restore_timing(x, id, &tm);
          rw->ms[rep] = rr.ttft_ns / 1e6;
          rw->q_ms[rep] = tm.query_ns / 1e6;
          rw->load_ms[rep] = tm.load_ns / 1e6;
          rw->commit_ms[rep] = tm.commit_ns / 1e6;
          rw->restored[rep] = rr.restored_tokens;
          rw->computed[rep] = rr.computed_tokens;
          rw->plans += after.plans - before.plans;
          rw->plans_compute += after.plans_compute - before.plans_compute;
          rw->plans_split += after.plans_split - before.plans_split;
          rw->plans_partial += after.plans_partial - before.plans_partial;
          const uint32_t *ft = &first_cold[((size_t)si * MAX_REPS + rep) * 2];
          if (memcmp(ft, rr.tokens, 2 * sizeof *ft)) rw->same = false;
          fprintf(stderr, "  %u tokens, %s #%d: ttft %.2f ms (restored %u, computed %u)\n",
                  sizes[si], row_name[k], rep, rr.ttft_ns / 1e6, rr.restored_tokens,
                  rr.computed_tokens);
        }
      }
    }
  }
  /* The rest as the environment says. */
  oi__executor_set_restore_plan(x, eo.restore_plan);

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
    eo2.codec = NULL;
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
  oi_host_stats hst = {.struct_size = sizeof hst};
  oi_host_get_stats(host, &hst);
  oi_executor_destroy(x);
  oi_host_destroy(host);
  if (disk_scratch) { /* the store's files (its lock too), then the directory */
    bench_disk_remove_store(disk_dir);
    rmdir(disk_dir);
  }
  oi_refmodel_destroy(model);
  if (dev) oi__dev_close(dev);
  if (failed) return CLI_FAILED;

  int R = (int)reps;
  const char *dtype = gpu ? "bf16" : "float32";
  if (!json) {
    if (gpu)
      printf("openinfer bench ttft — libopeninfer %s, %s (%u SMs), device %ld\n",
             oi_version_string(), info.name, info.multiprocessors, device);
    else
      printf("openinfer bench ttft — libopeninfer %s, cpu backend, %d cpu%s\n", oi_version_string(),
             get_nprocs(), get_nprocs() == 1 ? "" : "s");
    printf("model: refmodel-%s, %ld layers, hidden %ld, %ld q / %ld kv heads x %ld, MLP %ld, "
           "vocab %ld, %s (weights generated in %.2f s; KV %.1f KiB per token); page 16; prefill "
           "chunk %ld; host pool %.1f GiB %s (%.2f s); codec %s\n\n",
           gpu ? "cuda" : "cpu", layers, hidden, heads, kv_heads, head_dim, mlp, vocab, dtype,
           gen_s, (double)block_bytes_all_layers / 16 / 1024, chunk,
           (double)host_bytes / (1ull << 30), gpu ? "pinned" : "pageable", pool_s, codec);
  }
  if (!json && gpu) {
    printf("dense bf16 matmul rate, this GPU, this run (median of 10):\n");
    printf("  model GEMM (batch-invariant; wgmma on sm_90)  8192^3: %7.1f TFLOP/s   M4096 N%ld "
           "K%ld: %7.1f\n",
           g8.mine_tflops, 2 * mlp, hidden, gm.mine_tflops);
    if (g8.cublas_found)
      printf("  cuBLAS cublasGemmEx (reference)        8192^3: %7.1f TFLOP/s   M4096 N%ld K%ld: "
             "%7.1f"
             "   (max |mine - cuBLAS| / max|C| = %.2g)\n",
             g8.cublas_tflops, 2 * mlp, hidden, gm.cublas_tflops, g8.max_rel_diff);
    else
      printf("  cuBLAS: not found (dlopen libcublas.so.13 failed)\n");
    printf("bulk pinned H2D (1 GiB cudaMemcpyAsync, median of 5): %.1f GB/s\n\n", bulk_gbps);
  }
  int met = 0, total = 0;
  if (json)
    printf(
        "{\"bench\":\"ttft\",\"backend\":\"%s\",\"gpu\":\"%s\",\"codec\":\"%s\",\"cpus\":%d,"
        "\"layers\":%ld,"
        "\"hidden\":%ld,\"heads\":%ld,\"kv_heads\":%ld,\"head_dim\":%ld,\"mlp\":%ld,\"vocab\":%ld,"
        "\"kv_bytes_per_token\":%llu,\"chunk\":%ld,\"reps\":%d,"
        "\"gemm_8192_tflops\":%.2f,\"gemm_model_tflops\":%.2f,\"cublas_8192_tflops\":%.2f,"
        "\"cublas_model_tflops\":%.2f,\"gemm_vs_cublas_max_rel_diff\":%.3g,\"bulk_h2d_gbps\":%.2f,"
        "\"sizes\":[",
        gpu ? "cuda" : "cpu", gpu ? info.name : "", codec, get_nprocs(), layers, hidden, heads,
        kv_heads, head_dim, mlp, vocab, (unsigned long long)(block_bytes_all_layers / 16), chunk, R,
        g8.mine_tflops, gm.mine_tflops, g8.cublas_tflops, gm.cublas_tflops, g8.max_rel_diff,
        bulk_gbps);
  else
    printf("time to first token, p50 of %d prompts per size, and its ratio to cold (under 1: "
           "faster than cold);\nload-only: the plan off (every hit loads); planned: restore or "
           "recompute (docs/planner.md):\n%7s %10s | %17s | %17s | %17s | %17s\n",
           R, "prompt", "cold p50", "host load-only", "host planned", "disk load-only",
           "disk planned");
  for (int si = 0; si < nsizes; si++) {
    size_result *sr = &res[si];
    double cold = median(sr->cold_ms, R);
    double p50[ROWS];
    bool have[ROWS];
    for (int k = 0; k < ROWS; k++) {
      have[k] = k < ROW_DISK_LOAD || !disk_skip;
      p50[k] = have[k] ? median(sr->row[k].ms, R) : 0;
    }
    /* The targets (same run): planned <= min(cold, load-only) + 5 %;
     * where load-only and cold are within 3x of each other, planned <= 0.8 x
     * their min. */
    bool ok_never[2] = {false, false}, ok_gain[2] = {false, false}, has_gain[2] = {false, false};
    for (int t = 0; t < 2; t++) {
      if (!have[2 * t]) continue;
      double lo = p50[2 * t], pl = p50[2 * t + 1], m = cold < lo ? cold : lo;
      double hi = cold > lo ? cold : lo;
      ok_never[t] = pl <= 1.05 * m;
      has_gain[t] = hi <= 3 * m;
      ok_gain[t] = pl <= 0.8 * m;
      total += 1 + has_gain[t];
      met += ok_never[t] + (has_gain[t] && ok_gain[t]);
    }
    if (json) {
      printf("%s{\"tokens\":%u,\"cold_ttft_p50_ms\":%.3f,\"decode_step_ms\":%.3f,\"rows\":{",
             si ? "," : "", sr->tokens, cold, median(sr->decode_ms, R));
      bool first = true;
      for (int k = 0; k < ROWS; k++) {
        if (!have[k]) continue;
        const row_result *rw = &sr->row[k];
        printf("%s\"%s\":{\"ttft_p50_ms\":%.3f,\"over_cold\":%.4f,\"restored_tokens\":%u,"
               "\"computed_tokens\":%u,\"query_ms\":%.4f,\"load_ms\":%.3f,\"commit_ms\":%.4f,"
               "\"plans\":%llu,\"plans_compute\":%llu,\"plans_split\":%llu,\"plans_partial\":%llu,"
               "\"tokens_identical\":%s}",
               first ? "" : ",", row_name[k], p50[k], cold > 0 ? p50[k] / cold : 0,
               rw->restored[R / 2], rw->computed[R / 2], median(rw->q_ms, R),
               median(rw->load_ms, R), median(rw->commit_ms, R), (unsigned long long)rw->plans,
               (unsigned long long)rw->plans_compute, (unsigned long long)rw->plans_split,
               (unsigned long long)rw->plans_partial, rw->same ? "true" : "false");
        first = false;
      }
      printf("},\"pass\":{");
      for (int t = 0; t < 2; t++) {
        if (!have[2 * t]) continue;
        printf("%s\"%s_planned_le_min_cold_load_only\":%s", t ? "," : "", t ? "disk" : "host",
               ok_never[t] ? "true" : "false");
        if (has_gain[t])
          printf(",\"%s_planned_le_0.8_min\":%s", t ? "disk" : "host",
                 ok_gain[t] ? "true" : "false");
      }
      printf("}}");
    } else {
      printf("%7u %8.2fms", sr->tokens, cold);
      for (int k = 0; k < ROWS; k++)
        if (have[k])
          printf(" | %8.2fms %6.2fx", p50[k], cold > 0 ? p50[k] / cold : 0);
        else
          printf(" | %17s", "-");
      printf("\n");
      for (int t = 0; t < 2; t++) {
        if (!have[2 * t]) continue;
        const row_result *rw = &sr->row[2 * t + 1];
        printf(
            "        %s planned: loaded %u, computed %u tokens (median prompt); %llu plans: %llu "
            "computed all, %llu split, %llu partial; tokens %s\n",
            t ? "disk" : "host", rw->restored[R / 2], rw->computed[R / 2],
            (unsigned long long)rw->plans, (unsigned long long)rw->plans_compute,
            (unsigned long long)rw->plans_split, (unsigned long long)rw->plans_partial,
            rw->same && sr->row[2 * t].same ? "same as cold" : "DIFFER");
        printf("        %s %s planned <= min(cold, load-only) + 5%%;  %s planned <= 0.8 x "
               "min(cold, load-only)%s\n",
               ok_never[t] ? "PASS" : "MISS", t ? "disk" : "host",
               has_gain[t] ? (ok_gain[t] ? "PASS" : "MISS") : "----",
               has_gain[t] ? "" : " (no target: load-only and cold are over 3x apart)");
      }
    }
  }
  if (json) printf("]");
  /* The host restore broken out (load-only), and on a GPU against the
   * matmul rate and the bulk H2D bandwidth. */
  if (json) {
    printf(",\"host\":[");
  } else if (gpu) {
    printf("\nrestored from the host tier, load-only (the restore path itself):\n");
    printf("%7s %10s %10s %7s %8s %8s %8s %9s %9s %9s %9s %8s %8s\n", "prompt", "cold p50",
           "warm p50", "ratio", "query", "load", "commit", "KV MB", "bound", "decode", "TFLOP/s",
           "%mm", "tokens");
  } else {
    printf("\nrestored from the host tier, load-only (the restore path itself):\n");
    printf("%7s %10s %10s %7s %8s %8s %8s %9s %12s %8s\n", "prompt", "cold p50", "warm p50",
           "ratio", "query", "load", "commit", "KV MB", "prefill t/s", "tokens");
  }
  for (int si = 0; si < nsizes; si++) {
    size_result *sr = &res[si];
    const row_result *hw = &sr->row[ROW_HOST_LOAD];
    double S = sr->tokens;
    double cold = median(sr->cold_ms, R), warm = median(hw->ms, R);
    double dec = median(sr->decode_ms, R);
    double flops = lin_per_token * S + 2.0 * H * V + layers * Q * 4 * S * (S + 1) / 2;
    double tflops = flops / (cold * 1e-3) / 1e12;
    uint32_t restored = hw->restored[R / 2];
    double kv_mb = (double)restored / 16 * block_bytes_all_layers / 1e6;
    double bound = gpu ? 1.3 * (kv_mb * 1e6 / bulk_gbps) / 1e6 + dec : 0; /* ms */
    double ratio = warm > 0 ? cold / warm : 0;
    double pct = matmul_ref > 0 ? tflops / matmul_ref : 0;
    bool ok_bound = warm <= bound, ok_pct = pct >= 0.35;
    bool ok_ratio = sr->tokens >= 16384 ? ratio >= 10 : sr->tokens >= 4096 ? ratio >= 5 : true;
    if (gpu) { /* the GPU targets (docs/benchmarks.md) */
      total += 3;
      met += ok_bound + ok_pct + ok_ratio;
    }
    if (json) {
      printf("%s{\"tokens\":%u,\"cold_ttft_p50_ms\":%.3f,\"warm_ttft_p50_ms\":%.3f,\"ratio\":%.3f,"
             "\"query_ms\":%.4f,\"load_ms\":%.3f,\"commit_ms\":%.4f,\"restored_tokens\":%u,"
             "\"restored_kv_bytes\":%.0f,\"warm_bound_ms\":%.3f,\"decode_step_ms\":%.3f,"
             "\"cold_tflops\":%.4f,\"cold_vs_matmul\":%.4f,\"tokens_identical\":%s",
             si ? "," : "", sr->tokens, cold, warm, ratio, median(hw->q_ms, R),
             median(hw->load_ms, R), median(hw->commit_ms, R), restored, kv_mb * 1e6, bound, dec,
             tflops, pct, hw->same ? "true" : "false");
      if (gpu)
        printf(",\"pass\":{\"warm_bound\":%s,\"cold_35pct\":%s,\"ratio\":%s}",
               ok_bound ? "true" : "false", ok_pct ? "true" : "false", ok_ratio ? "true" : "false");
      printf("}");
    } else if (gpu) {
      printf("%7u %8.2fms %8.2fms %6.1fx %6.3fms %6.2fms %6.3fms %9.1f %7.2fms %7.2fms %9.1f "
             "%7.1f%% %8s\n",
             sr->tokens, cold, warm, ratio, median(hw->q_ms, R), median(hw->load_ms, R),
             median(hw->commit_ms, R), kv_mb, bound, dec, tflops, 100 * pct,
             hw->same ? "same" : "DIFFER");
      printf(
          "        %s warm <= 1.3 x KV/bulk + decode;  %s cold >= 35%% of matmul;  %s ratio %s\n",
          ok_bound ? "PASS" : "MISS", ok_pct ? "PASS" : "MISS",
          sr->tokens >= 4096 ? (ok_ratio ? "PASS" : "MISS") : "----",
          sr->tokens >= 16384  ? ">= 10x"
          : sr->tokens >= 4096 ? ">= 5x"
                               : "(no target)");
    } else {
      printf("%7u %8.2fms %8.2fms %6.1fx %6.3fms %6.2fms %6.3fms %9.1f %12.0f %8s\n", sr->tokens,
             cold, warm, ratio, median(hw->q_ms, R), median(hw->load_ms, R),
             median(hw->commit_ms, R), kv_mb, cold > 0 ? S / (cold * 1e-3) : 0,
             hw->same ? "same" : "DIFFER");
    }
  }
  if (json) printf("]");
  /* The disk restore broken out (load-only). */
  if (!disk_skip) {
    if (json)
      printf(",\"disk\":{\"spills\":%llu,\"promotions\":%llu,\"promote_failed\":%llu,"
             "\"checksum_failures\":%llu,\"sizes\":[",
             (unsigned long long)ds.spills, (unsigned long long)ds.promotions,
             (unsigned long long)ds.promote_failed, (unsigned long long)ds.checksum_failures);
    else
      printf("\nrestored from disk, load-only (pool emptied too; one query that waits for the "
             "disk, then the load):\n%7s %10s %10s %10s %8s %8s %9s %9s %8s\n",
             "prompt", "cold p50", "host p50", "disk p50", "disk/cold", "query", "load",
             "read GB/s", "tokens");
    for (int si = 0; si < nsizes; si++) {
      size_result *sr = &res[si];
      const row_result *dw = &sr->row[ROW_DISK_LOAD], *dp = &sr->row[ROW_DISK_PLAN];
      double cold = median(sr->cold_ms, R), warm = median(sr->row[ROW_HOST_LOAD].ms, R);
      double disk = median(dw->ms, R), q = median(dw->q_ms, R);
      double ld = median(dw->load_ms, R);
      uint32_t restored = dw->restored[R / 2];
      double bytes = (double)restored / 16 * block_bytes_all_layers;
      double gbps = q > 0 ? bytes / (q * 1e6) : 0;
      if (json)
        printf("%s{\"tokens\":%u,\"cold_ttft_p50_ms\":%.3f,\"host_warm_ttft_p50_ms\":%.3f,"
               "\"disk_warm_ttft_p50_ms\":%.3f,\"cold_over_disk\":%.3f,\"query_wait_ms\":%.3f,"
               "\"load_ms\":%.3f,\"restored_tokens\":%u,\"read_gbps\":%.3f,"
               "\"disk_planned_ttft_p50_ms\":%.3f,\"tokens_identical\":%s}",
               si ? "," : "", sr->tokens, cold, warm, disk, disk > 0 ? cold / disk : 0, q, ld,
               restored, gbps, median(dp->ms, R), dw->same && dp->same ? "true" : "false");
      else
        printf("%7u %8.2fms %8.2fms %8.2fms %8.2fx %6.2fms %6.2fms %9.2f %8s\n", sr->tokens, cold,
               warm, disk, cold > 0 ? disk / cold : 0, q, ld, gbps, dw->same ? "same" : "DIFFER");
    }
    if (json)
      printf("]}");
    else
      printf("  (disk: %llu spills, %llu promotions, %llu failed, %llu checksum failures)\n",
             (unsigned long long)ds.spills, (unsigned long long)ds.promotions,
             (unsigned long long)ds.promote_failed, (unsigned long long)ds.checksum_failures);
  }
  /* What the plans were given: the fitted prefill cost and the rate estimates. */
  if (json)
    printf(",\"prefill_ns_per_token\":%.3f,\"prefill_ns_per_token_ctx\":%.6f,"
           "\"prefill_samples\":%llu,\"link_bytes_per_s\":%llu,\"link_samples\":%llu,"
           "\"disk_bytes_per_s\":%llu,\"disk_samples\":%llu,\"plans\":%llu,\"plan_ns\":%llu",
           xs.prefill_ns_per_token, xs.prefill_ns_per_token_ctx,
           (unsigned long long)xs.prefill_samples, (unsigned long long)hst.link_bytes_per_s,
           (unsigned long long)hst.link_samples, (unsigned long long)hst.disk_bytes_per_s,
           (unsigned long long)hst.disk_samples, (unsigned long long)xs.plans,
           (unsigned long long)xs.plan_ns);
  else
    printf("\nthe plans' inputs at the end: prefill %.1f ns/token + %.4f ns/token per position "
           "of context (fitted to %llu forwards); link %.2f GB/s (%llu samples), disk %.2f GB/s "
           "(%llu samples); %llu plans, %.1f us each (locating and planning)\n",
           xs.prefill_ns_per_token, xs.prefill_ns_per_token_ctx,
           (unsigned long long)xs.prefill_samples, hst.link_bytes_per_s / 1e9,
           (unsigned long long)hst.link_samples, hst.disk_bytes_per_s / 1e9,
           (unsigned long long)hst.disk_samples, (unsigned long long)xs.plans,
           xs.plans ? xs.plan_ns / 1e3 / xs.plans : 0.0);
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
  } else if (!gpu) {
    printf("\n(cold: distinct prompts, TTFT = submit -> first token through the executor; warm: "
           "the\n same prompts after flush + GPU-cache eviction (host), the pool emptied too "
           "(disk);\n tokens: the first two generated tokens, warm vs cold.)\n restores: %llu "
           "completed, %llu overlapped with the forward, %llu failed\n",
           (unsigned long long)xs.restores_completed, (unsigned long long)xs.restores_overlapped,
           (unsigned long long)xs.restores_failed);
    printf("targets met: %d of %d\n", met, total);
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
