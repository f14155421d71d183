/* `openinfer demo`: the main job. The executor runs the reference model on a
 * multi-turn chat workload: every conversation shares a system prompt and
 * grows turn by turn; between turns the GPU prefix cache is dropped (as
 * other traffic would push it out), so each turn's prefix comes back from the
 * host tier instead of being recomputed. The same turns run on a second
 * executor without a host tier (the cold baseline), and both must produce
 * byte-identical completions. With a GPU (default: device 0 when one is
 * present) the CUDA reference model runs in the Qwen3-4B shape with
 * prompts long enough for the TTFT difference to show; without one, the cpu
 * model at a small size. `openinfer demo tier` runs the host tier alone at a
 * larger scale. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "openinfer/openinfer.h"

typedef struct exec_demo_opts {
  long ranks, conversations, turns, system_tokens, turn_tokens, new_tokens;
  long layers, hidden, vocab, page;
  long device;         /* -2: auto (GPU 0 when present), -1: cpu */
  unsigned set;        /* options given on the command line (1 << option letter index) */
  const char *offload; /* embedded | sidecar */
  const char *socket;
} exec_demo_opts;

static void usage(FILE *f) {
  fprintf(
      f,
      "usage: openinfer demo [options]\n"
      "       openinfer demo tier [options]   (the host tier alone, at scale; see --help there)\n"
      "       openinfer demo pd [options]     (prefill/decode across two cluster nodes)\n"
      "\n"
      "Runs the executor with the reference model on multi-turn chats. Between turns the GPU\n"
      "prefix cache is dropped, so each turn restores its prefix from the host tier; a second\n"
      "executor without a host tier recomputes everything (cold). Completions must match.\n"
      "\n"
      "  --ranks N           ranks (engines) sharing the host tier (default 2)\n"
      "  --conversations N   chats (default 4)\n"
      "  --turns N           turns per chat (default 4)\n"
      "  --system-tokens N   shared system prompt (default 192)\n"
      "  --turn-tokens N     user tokens per turn (default 64)\n"
      "  --new-tokens N      tokens generated per turn (default 16)\n"
      "  --device N|cpu      CUDA device for the ranks and the CUDA reference model, or cpu\n"
      "                      (default: GPU 0 when present, else cpu)\n"
      "  --layers N, --hidden N, --vocab N   reference model size (cpu default 4, 128, 2048;\n"
      "                      GPU default: the Qwen3-4B shape, 36 layers, hidden 2560, 32 q / 8 kv\n"
      "                      heads x 128, MLP 9728, vocab 32768, bf16)\n"
      "  --page N            tokens per KV block (default 16)\n"
      "  --offload embedded|sidecar   host tier in this process (default) or a running\n"
      "                      `openinfer serve` (--socket PATH)\n"
      "On a GPU the workload defaults grow so that TTFT differences show: --system-tokens 2048,\n"
      "--turn-tokens 256 (the others as above); the host tier is a pinned pool.\n");
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

static uint32_t token_of(uint64_t a, uint64_t b, uint32_t vocab) {
  uint64_t x = a * 0x9E3779B97F4A7C15ull + b * 0xBF58476D1CE4E5B9ull + 7;
  x ^= x >> 29;
  return (uint32_t)(x % (vocab - 1)) + 1;
}

static oi_status make_executor(const exec_demo_opts *o, oi_model_ops *ops, void *model,
                               uint32_t offload, oi_host *host, oi_executor **out) {
  oi_executor_options eo;
  oi_executor_options_init(&eo);
  int32_t devs[64];
  if (o->device >= 0) {
    for (long i = 0; i < o->ranks; i++)
      devs[i] = (int32_t)o->device;
    eo.devices = devs;
  }
  eo.model = ops;
  eo.model_ctx = model;
  eo.ranks = (uint32_t)o->ranks;
  eo.page_size = (uint32_t)o->page;
  eo.gpu_blocks = 1024;
  eo.offload = offload;
  eo.host = offload == OI_OFFLOAD_EMBEDDED ? host : NULL;
  eo.socket_path = o->socket;
  eo.max_batch_tokens = o->device >= 0 ? 4096 : 512;
  eo.restore_overlap = cli_restore_overlap_env();
  eo.restore_plan = cli_restore_plan_env();
  return oi_executor_create(&eo, out);
}

int cmd_demo(int argc, char **argv) {
  if (argc >= 2 && !strcmp(argv[1], "tier")) return demo_tier(argc - 1, argv + 1);
  if (argc >= 2 && !strcmp(argv[1], "pd")) return demo_pd(argc - 1, argv + 1);
  exec_demo_opts o = {.ranks = 2,
                      .conversations = 4,
                      .turns = 4,
                      .system_tokens = 192,
                      .turn_tokens = 64,
                      .new_tokens = 16,
                      .layers = 4,
                      .hidden = 128,
                      .vocab = 2048,
                      .page = 16,
                      .device = -2,
                      .offload = "embedded"};
  static const struct option longopts[] = {{"ranks", required_argument, 0, 'r'},
                                           {"conversations", required_argument, 0, 'c'},
                                           {"turns", required_argument, 0, 't'},
                                           {"system-tokens", required_argument, 0, 's'},
                                           {"turn-tokens", required_argument, 0, 'u'},
                                           {"new-tokens", required_argument, 0, 'n'},
                                           {"layers", required_argument, 0, 'l'},
                                           {"hidden", required_argument, 0, 'H'},
                                           {"vocab", required_argument, 0, 'v'},
                                           {"page", required_argument, 0, 'p'},
                                           {"offload", required_argument, 0, 'o'},
                                           {"socket", required_argument, 0, 'S'},
                                           {"device", required_argument, 0, 'd'},
                                           {"help", no_argument, 0, 'h'},
                                           {0, 0, 0, 0}};
  optind = 1;
  int c;
  while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
    bool ok = true;
    switch (c) {
    case 'r': ok = cli_parse_int(optarg, 1, 64, &o.ranks); break;
    case 'c': ok = cli_parse_int(optarg, 1, 10000, &o.conversations); break;
    case 't': ok = cli_parse_int(optarg, 1, 1000, &o.turns); break;
    case 's': ok = cli_parse_int(optarg, 1, 100000, &o.system_tokens); break;
    case 'u': ok = cli_parse_int(optarg, 1, 100000, &o.turn_tokens); break;
    case 'n': ok = cli_parse_int(optarg, 1, 4096, &o.new_tokens); break;
    case 'l': ok = cli_parse_int(optarg, 1, 128, &o.layers); break;
    case 'H': ok = cli_parse_int(optarg, 8, 8192, &o.hidden) && o.hidden % 8 == 0; break;
    case 'v': ok = cli_parse_int(optarg, 16, 1 << 20, &o.vocab); break;
    case 'p': ok = cli_parse_int(optarg, 1, 1024, &o.page); break;
    case 'o':
      ok = !strcmp(optarg, "embedded") || !strcmp(optarg, "sidecar");
      o.offload = optarg;
      break;
    case 'S': o.socket = optarg; break;
    case 'd':
      if (!strcmp(optarg, "cpu"))
        o.device = -1;
      else
        ok = cli_parse_int(optarg, 0, 1023, &o.device);
      break;
    case 'h': usage(stdout); return CLI_OK;
    default: usage(stderr); return CLI_USAGE;
    }
    if (!ok) {
      cli_bad_value("openinfer demo", longopts, c, optarg);
      return CLI_USAGE;
    }
    if (c == 's') o.set |= 1u << 0;
    if (c == 'u') o.set |= 1u << 1;
    if (c == 'l') o.set |= 1u << 2;
    if (c == 'H') o.set |= 1u << 3;
    if (c == 'v') o.set |= 1u << 4;
  }
  if (optind < argc) {
    fprintf(stderr, "openinfer demo: unexpected argument '%s' (see --help)\n", argv[optind]);
    return CLI_USAGE;
  }
  bool sidecar = !strcmp(o.offload, "sidecar");
  int ndev = 0;
  oi_device_count(&ndev);
  bool auto_device = o.device == -2;
  /* Auto: GPU 0 when present (a sidecar keeps the cpu: its arenas live where
   * the server put them, so a GPU sidecar needs --device). */
  if (auto_device) o.device = ndev > 0 && !sidecar ? 0 : -1;
  if (o.device >= ndev) {
    fprintf(stderr, "openinfer demo: device %ld is not present (%d CUDA device%s visible)\n",
            o.device, ndev, ndev == 1 ? "" : "s");
    return CLI_FAILED;
  }
  bool gpu = o.device >= 0;
  if (gpu) {
    if (!(o.set & (1u << 0))) o.system_tokens = 2048;
    if (!(o.set & (1u << 1))) o.turn_tokens = 256;
    if (!(o.set & (1u << 2))) o.layers = 36;
    if (!(o.set & (1u << 3))) o.hidden = 2560;
    if (!(o.set & (1u << 4))) o.vocab = 32768;
    if (o.hidden % 64 || o.vocab % 2) {
      fprintf(stderr,
              "openinfer demo: on a GPU --hidden must be a multiple of 64 and --vocab even\n");
      return CLI_USAGE;
    }
  }

  oi_refmodel_options ro;
  oi_refmodel_options_init(&ro);
  ro.num_layers = (uint32_t)o.layers;
  ro.hidden = (uint32_t)o.hidden;
  ro.vocab_size = (uint32_t)o.vocab;
  if (!gpu) {
    ro.num_q_heads = (uint32_t)(o.hidden / 16 >= 2 ? o.hidden / 16 : 2);
    ro.num_kv_heads = ro.num_q_heads / 2;
    ro.head_dim = (uint32_t)o.hidden / ro.num_q_heads;
    ro.head_dim &= ~1u;
    ro.intermediate = (uint32_t)o.hidden * 2;
  } else if (o.hidden == 2560) {
    /* Qwen3-4B: 32 query heads x 128 (q_dim 4096 > hidden), 8 KV heads, MLP 9728. */
    ro.num_q_heads = 32;
    ro.num_kv_heads = 8;
    ro.head_dim = 128;
    ro.intermediate = 9728;
    ro.rope_theta = 1000000.0f;
    ro.rms_eps = 1e-6f;
  } else {
    ro.head_dim = o.hidden % 128 ? 64 : 128;
    ro.num_q_heads = (uint32_t)o.hidden / ro.head_dim;
    ro.num_kv_heads = ro.num_q_heads % 4 == 0   ? ro.num_q_heads / 4
                      : ro.num_q_heads % 2 == 0 ? ro.num_q_heads / 2
                                                : ro.num_q_heads;
    ro.intermediate = (uint32_t)o.hidden * 4;
    ro.rope_theta = 1000000.0f;
    ro.rms_eps = 1e-6f;
  }
  ro.device = gpu ? (int32_t)o.device : -1;
  uint64_t max_len =
      (uint64_t)o.system_tokens + (uint64_t)o.turns * (o.turn_tokens + o.new_tokens) + 16;
  ro.max_positions = (uint32_t)(max_len > 4096 ? max_len : 4096);
  oi_model_ops ops = {.struct_size = sizeof ops}, ops_cold = {.struct_size = sizeof ops_cold};
  void *model = NULL, *model_cold = NULL;
  oi_host *host = NULL;
  oi_executor *warm = NULL, *cold = NULL;
  uint32_t **conv = NULL;
  size_t *conv_len = NULL;
  uint64_t *ttft_cold = NULL, *ttft_warm = NULL;
  int rc = CLI_FAILED;
  uint64_t pool_bytes = 256ull << 20;
  uint64_t t_setup = cli_now_ns();
  if (oi_refmodel_create(&ro, &ops, &model) != OI_OK ||
      oi_refmodel_create(&ro, &ops_cold, &model_cold) != OI_OK)
    goto fail;
  if (!sidecar) {
    oi_host_options ho;
    oi_host_options_init(&ho);
    if (gpu) {
      /* Pinned, sized for every block the chats save (twice over). */
      uint64_t token_bytes = (uint64_t)ro.num_layers * 2 * ro.num_kv_heads * ro.head_dim * 2;
      uint64_t unique = (uint64_t)o.system_tokens +
                        (uint64_t)o.conversations * o.turns * (o.turn_tokens + o.new_tokens) + 16;
      pool_bytes = 2 * unique * token_bytes + (256ull << 20);
      ho.device = (int32_t)o.device;
    } else {
      ho.flags = OI_HOST_NO_PIN;
    }
    ho.pool_bytes = pool_bytes;
    if (oi_host_create(&ho, &host) != OI_OK) goto fail;
  }
  if (make_executor(&o, &ops, model, sidecar ? OI_OFFLOAD_SIDECAR : OI_OFFLOAD_EMBEDDED, host,
                    &warm) != OI_OK ||
      make_executor(&o, &ops_cold, model_cold, OI_OFFLOAD_NONE, NULL, &cold) != OI_OK)
    goto fail;

  printf("openinfer demo — libopeninfer %s\n", oi_version_string());
  if (!gpu) {
    printf("reference model: %ld layers, hidden %ld, vocab %ld (cpu, float32 KV); %ld ranks, host "
           "tier %s\n",
           o.layers, o.hidden, o.vocab, o.ranks,
           sidecar ? "in a sidecar server" : "embedded, shared by every rank");
  } else {
    oi_device_info info = {.struct_size = sizeof info};
    oi_device_get_info((int)o.device, &info);
    printf("reference model: CUDA, %s%ld layers, hidden %ld, %u q / %u kv heads x %u, MLP %u, "
           "vocab %ld, bf16 "
           "weights and KV\n",
           o.hidden == 2560 ? "Qwen3-4B shape: " : "", o.layers, o.hidden, ro.num_q_heads,
           ro.num_kv_heads, ro.head_dim, ro.intermediate, o.vocab);
    printf("device %ld (%s); %ld ranks on it, host tier %s", o.device, info.name, o.ranks,
           sidecar ? "in a sidecar server" : "embedded, shared by every rank");
    if (!sidecar) printf(", %.1f GiB pinned", (double)pool_bytes / (1ull << 30));
    printf(" (setup %.2f s)\n", (double)(cli_now_ns() - t_setup) / 1e9);
  }
  printf("%ld chats x %ld turns: %ld-token shared system prompt, +%ld user tokens and %ld "
         "generated per turn\n\n",
         o.conversations, o.turns, o.system_tokens, o.turn_tokens, o.new_tokens);

  size_t ncv = (size_t)o.conversations;
  conv = calloc(ncv, sizeof *conv);
  conv_len = calloc(ncv, sizeof *conv_len);
  ttft_cold = calloc(ncv, sizeof *ttft_cold);
  ttft_warm = calloc(ncv, sizeof *ttft_warm);
  if (!conv || !conv_len || !ttft_cold || !ttft_warm) goto oom;
  for (size_t i = 0; i < ncv; i++) {
    conv[i] = malloc(max_len * sizeof **conv);
    if (!conv[i]) goto oom;
    for (long t = 0; t < o.system_tokens; t++)
      conv[i][conv_len[i]++] = token_of(0, (uint64_t)t, (uint32_t)o.vocab);
  }
  printf("%5s %12s %12s %8s %10s %10s %10s %8s\n", "turn", "TTFT cold", "TTFT warm", "speedup",
         "gpu-cached", "restored", "computed", "output");
  uint64_t mismatches = 0;
  for (long turn = 0; turn < o.turns; turn++) {
    uint64_t cached = 0, restored = 0, computed = 0;
    bool same = true;
    for (size_t i = 0; i < ncv; i++) {
      for (long t = 0; t < o.turn_tokens; t++)
        conv[i][conv_len[i]++] =
            token_of(1000 + i, (uint64_t)(turn * 100000 + t), (uint32_t)o.vocab);
      oi_request r;
      oi_request_init(&r);
      r.prompt = conv[i];
      r.prompt_len = (uint32_t)conv_len[i];
      r.max_new_tokens = (uint32_t)o.new_tokens;
      uint64_t idw, idc;
      /* Cold: nothing cached anywhere. Warm: the GPU cache was dropped, the host tier has it. */
      if (oi_executor_evict_gpu_cache(cold, NULL) != OI_OK ||
          oi_executor_submit(cold, &r, &idc) != OI_OK || oi_executor_run_until_idle(cold) != OI_OK)
        goto fail;
      if (oi_executor_flush(warm, 30000) != OI_OK ||
          oi_executor_evict_gpu_cache(warm, NULL) != OI_OK ||
          oi_executor_submit(warm, &r, &idw) != OI_OK || oi_executor_run_until_idle(warm) != OI_OK)
        goto fail;
      oi_request_result rc_ = {.struct_size = sizeof rc_}, rw = {.struct_size = sizeof rw};
      if (oi_executor_get_result(cold, idc, &rc_) != OI_OK ||
          oi_executor_get_result(warm, idw, &rw) != OI_OK)
        goto fail;
      if (rw.state != OI_REQUEST_FINISHED || rc_.state != OI_REQUEST_FINISHED) {
        fprintf(stderr, "openinfer demo: a request failed: %s\n",
                oi_status_str(rw.status ? rw.status : rc_.status));
        goto done;
      }
      bool eq = rw.n_tokens == rc_.n_tokens &&
                !memcmp(rw.tokens, rc_.tokens, rw.n_tokens * sizeof *rw.tokens);
      same = same && eq;
      mismatches += !eq;
      ttft_cold[i] = rc_.ttft_ns;
      ttft_warm[i] = rw.ttft_ns;
      cached += rw.cached_tokens;
      restored += rw.restored_tokens;
      computed += rw.computed_tokens;
      for (uint32_t k = 0; k < rw.n_tokens && conv_len[i] < max_len; k++)
        conv[i][conv_len[i]++] = rw.tokens[k];
    }
    qsort(ttft_cold, ncv, sizeof *ttft_cold, cmp_u64);
    qsort(ttft_warm, ncv, sizeof *ttft_warm, cmp_u64);
    double tc = (double)ttft_cold[ncv / 2] / 1e6, tw = (double)ttft_warm[ncv / 2] / 1e6;
    printf("%5ld %10.2f ms %10.2f ms %7.1fx %10llu %10llu %10llu %8s\n", turn + 1, tc, tw,
           tw > 0 ? tc / tw : 0, (unsigned long long)cached, (unsigned long long)restored,
           (unsigned long long)computed, same ? "same" : "DIFFERS");
  }
  oi_executor_stats xs = {.struct_size = sizeof xs};
  oi_executor_get_stats(warm, &xs);
  printf("\n(TTFT p50 over the chats of each turn; 'output' compares the warm completion with the "
         "cold one)\n");
  printf("executor: %llu restores (%llu failed), %llu tokens restored, %llu prefilled, %llu blocks "
         "offered to the "
         "host tier\n",
         (unsigned long long)xs.restores_completed, (unsigned long long)xs.restores_failed,
         (unsigned long long)xs.restored_tokens, (unsigned long long)xs.prefill_tokens,
         (unsigned long long)xs.saves_submitted);
  if (host) {
    oi_host_stats hs = {.struct_size = sizeof hs};
    oi_host_get_stats(host, &hs);
    printf("host tier: %llu blocks saved, %llu deduplicated, %llu hits, %.1f MiB loaded, %.1f MiB "
           "of %.1f MiB "
           "holding blocks\n",
           (unsigned long long)hs.saves_completed, (unsigned long long)hs.saves_deduplicated,
           (unsigned long long)hs.query_hit_blocks, (double)hs.bytes_loaded / (1 << 20),
           (double)hs.block_bytes_resident / (1 << 20), (double)hs.capacity_bytes / (1 << 20));
  }
  if (mismatches == 0 && xs.restored_tokens > 0) {
    printf("\ndemo OK: every warm completion matched the cold one\n");
    rc = CLI_OK;
  } else {
    fprintf(stderr, "\nopeninfer demo: FAILED (%llu completions differ, %llu tokens restored)\n",
            (unsigned long long)mismatches, (unsigned long long)xs.restored_tokens);
  }
  goto done;
oom:
  fprintf(stderr, "openinfer demo: out of memory\n");
  goto done;
fail:
  fprintf(stderr, "openinfer demo: %s\n", oi_last_error());
done:
  oi_executor_destroy(warm);
  oi_executor_destroy(cold);
  oi_host_destroy(host);
  oi_refmodel_destroy(model);
  oi_refmodel_destroy(model_cold);
  if (conv)
    for (size_t i = 0; i < (size_t)o.conversations; i++)
      free(conv[i]);
  free(conv);
  free(conv_len);
  free(ttft_cold);
  free(ttft_warm);
  return rc;
}
