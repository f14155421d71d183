/* `openinfer demo pd`: prefill/decode disaggregation across two nodes of a
 * cluster, on this machine. It starts a private redis-server (the block
 * directory) and two `openinfer serve` processes joined to it: a prefill
 * node and a decode node. A prefill executor runs each prompt on the first
 * (the KV blocks it computes are saved into that node's pool, which
 * publishes them); a decode executor on the second then runs the same
 * prompt and generates: its query finds the prefix in the directory and its
 * node fetches the blocks from the prefill node over the peer transport
 * (authenticated with a secret the demo writes), so the decode side restores
 * the prefix instead of recomputing it. A third executor without any tier
 * recomputes everything: the completions must match byte for byte. The cpu
 * reference model at a small size; everything is removed at the end. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "openinfer/openinfer.h"

typedef struct pd_state {
  char dir[256];
  pid_t redis, prefill, decode;
} pd_state;

static void sleep_ms(long ms) {
  struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

/* Runs argv with stdout and stderr into `log` (a file in the demo's directory). */
static pid_t spawn(char *const argv[], const char *log) {
  pid_t pid = fork();
  if (pid != 0) return pid;
  int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd >= 0) {
    dup2(fd, 1);
    dup2(fd, 2);
    close(fd);
  }
  execvp(argv[0], argv);
  _exit(127);
}

static void stop(pid_t *pid) {
  if (*pid <= 0) return;
  kill(*pid, SIGTERM);
  for (int i = 0; i < 200 && waitpid(*pid, NULL, WNOHANG) == 0; i++)
    sleep_ms(25);
  kill(*pid, SIGKILL);
  waitpid(*pid, NULL, 0);
  *pid = 0;
}

/* Whether a line containing `needle` is in `log` yet, waiting up to ms. */
static bool wait_log(const char *log, const char *needle, long ms) {
  for (long t = 0; t < ms; t += 20) {
    FILE *f = fopen(log, "r");
    char line[1024];
    bool found = false;
    while (f && !found && fgets(line, sizeof line, f))
      found = strstr(line, needle) != NULL;
    if (f) fclose(f);
    if (found) return true;
    sleep_ms(20);
  }
  return false;
}

static void print_log(const char *log) {
  FILE *f = fopen(log, "r");
  char line[1024];
  while (f && fgets(line, sizeof line, f))
    fprintf(stderr, "  | %s", line);
  if (f) fclose(f);
}

static void cleanup(pd_state *s) {
  stop(&s->decode);
  stop(&s->prefill);
  stop(&s->redis);
  static const char *const files[] = {"secret",     "redis.log",    "prefill.log",
                                      "decode.log", "prefill.sock", "decode.sock"};
  for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", s->dir, files[i]);
    unlink(p);
  }
  rmdir(s->dir);
}

static uint32_t token_of(uint64_t a, uint64_t b, uint32_t vocab) {
  uint64_t x = a * 0x9E3779B97F4A7C15ull + b * 0xBF58476D1CE4E5B9ull + 11;
  x ^= x >> 31;
  return (uint32_t)(x % (vocab - 1)) + 1;
}

static oi_status executor(oi_model_ops *ops, void *model, uint32_t offload, const char *sock,
                          oi_executor **out) {
  oi_executor_options eo;
  oi_executor_options_init(&eo);
  eo.model = ops;
  eo.model_ctx = model;
  eo.ranks = 1;
  eo.page_size = 16;
  eo.gpu_blocks = 512;
  eo.offload = offload;
  eo.socket_path = sock;
  eo.namespace_id = "demo-pd";
  eo.max_batch_tokens = 512;
  return oi_executor_create(&eo, out);
}

static void pd_usage(FILE *f) {
  fprintf(f, "usage: openinfer demo pd [--prompts N] [--prompt-tokens N] [--new-tokens N]\n"
             "\n"
             "Prefill/decode disaggregation on this machine: a private redis-server (the block\n"
             "directory) and two `openinfer serve` nodes joined to it. A prefill executor on the\n"
             "first node computes each prompt; a decode executor on the second restores the\n"
             "prefix from the first node (found in the directory, fetched over the peer\n"
             "transport) and generates. A third executor recomputes everything: the completions\n"
             "must match. Needs redis-server on PATH (Debian: redis-server).\n"
             "\n"
             "  --prompts N         prompts (default 4)\n"
             "  --prompt-tokens N   tokens per prompt (default 400)\n"
             "  --new-tokens N      tokens the decode node generates (default 16)\n");
}

int demo_pd(int argc, char **argv) {
  static const struct option lo[] = {{"prompts", required_argument, 0, 'p'},
                                     {"prompt-tokens", required_argument, 0, 't'},
                                     {"new-tokens", required_argument, 0, 'n'},
                                     {"help", no_argument, 0, 'h'},
                                     {0, 0, 0, 0}};
  long prompts = 4, ptokens = 400, ntokens = 16;
  optind = 1;
  int c;
  while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
    bool ok = true;
    switch (c) {
    case 'p': ok = cli_parse_int(optarg, 1, 64, &prompts); break;
    case 't': ok = cli_parse_int(optarg, 33, 4000, &ptokens); break;
    case 'n': ok = cli_parse_int(optarg, 1, 256, &ntokens); break;
    case 'h': pd_usage(stdout); return CLI_OK;
    default: pd_usage(stderr); return CLI_USAGE;
    }
    if (!ok) {
      cli_bad_value("openinfer demo pd", lo, c, optarg);
      return CLI_USAGE;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "openinfer demo pd: unexpected argument '%s'\n", argv[optind]);
    return CLI_USAGE;
  }
  if (!cli_on_path("redis-server")) {
    fprintf(stderr, "openinfer demo pd: needs redis-server on PATH (Debian: apt-get install "
                    "redis-server)\n");
    return CLI_FAILED;
  }
  char self[1024];
  ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
  if (sl <= 0) {
    fprintf(stderr, "openinfer demo pd: cannot find this executable: %s\n", strerror(errno));
    return CLI_FAILED;
  }
  self[sl] = 0;

  pd_state s = {0};
  const char *tmp = getenv("TMPDIR");
  snprintf(s.dir, sizeof s.dir, "%s/openinfer-demo-pd-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(s.dir)) {
    fprintf(stderr, "openinfer demo pd: mkdtemp: %s\n", strerror(errno));
    return CLI_FAILED;
  }
  char p_secret[512], p_rlog[512], p_plog[512], p_dlog[512], p_psock[512], p_dsock[512];
  snprintf(p_secret, sizeof p_secret, "%s/secret", s.dir);
  snprintf(p_rlog, sizeof p_rlog, "%s/redis.log", s.dir);
  snprintf(p_plog, sizeof p_plog, "%s/prefill.log", s.dir);
  snprintf(p_dlog, sizeof p_dlog, "%s/decode.log", s.dir);
  snprintf(p_psock, sizeof p_psock, "%s/prefill.sock", s.dir);
  snprintf(p_dsock, sizeof p_dsock, "%s/decode.sock", s.dir);
  int rc = CLI_FAILED;
  oi_model_ops ops_p = {.struct_size = sizeof ops_p}, ops_d = {.struct_size = sizeof ops_d},
               ops_c = {.struct_size = sizeof ops_c};
  void *mp = NULL, *md = NULL, *mc = NULL;
  oi_executor *xp = NULL, *xd = NULL, *xc = NULL;
  uint32_t *prompt = NULL;

  /* The secret: 32 random bytes as hex, private to this user. */
  int fd = open(p_secret, O_WRONLY | O_CREAT | O_EXCL, 0600);
  FILE *ur = fopen("/dev/urandom", "r");
  unsigned char rnd[32];
  if (fd < 0 || !ur || fread(rnd, 1, sizeof rnd, ur) != sizeof rnd) {
    fprintf(stderr, "openinfer demo pd: writing the secret: %s\n", strerror(errno));
    if (ur) fclose(ur);
    if (fd >= 0) close(fd);
    goto out;
  }
  fclose(ur);
  char hex[65];
  for (int i = 0; i < 32; i++)
    snprintf(hex + 2 * i, 3, "%02x", rnd[i]);
  bool wrote = write(fd, hex, 64) == 64;
  close(fd);
  if (!wrote) goto out;

  int port = cli_free_port();
  char port_s[16], url[64];
  snprintf(port_s, sizeof port_s, "%d", port);
  snprintf(url, sizeof url, "redis://127.0.0.1:%d", port);
  char *redis_argv[] = {"redis-server", "--port", port_s,         "--bind", "127.0.0.1",
                        "--save",       "",       "--appendonly", "no",     NULL};
  s.redis = spawn(redis_argv, p_rlog);
  if (!wait_log(p_rlog, "Ready to accept connections", 5000)) {
    fprintf(stderr, "openinfer demo pd: redis-server did not start:\n");
    print_log(p_rlog);
    goto out;
  }
  char *prefill_argv[] = {self,          "serve",    "--socket",         p_psock,     "--pool",
                          "256M",        "--no-pin", "--no-metrics",     "--cluster", url,
                          "--node-id",   "prefill",  "--cluster-secret", p_secret,    "--listen",
                          "127.0.0.1:0", NULL};
  char *decode_argv[] = {self,          "serve",    "--socket",         p_dsock,     "--pool",
                         "256M",        "--no-pin", "--no-metrics",     "--cluster", url,
                         "--node-id",   "decode",   "--cluster-secret", p_secret,    "--listen",
                         "127.0.0.1:0", NULL};
  s.prefill = spawn(prefill_argv, p_plog);
  s.decode = spawn(decode_argv, p_dlog);
  if (!wait_log(p_plog, "listening on", 10000) || !wait_log(p_dlog, "listening on", 10000)) {
    fprintf(stderr, "openinfer demo pd: a node did not start:\n");
    print_log(p_plog);
    print_log(p_dlog);
    goto out;
  }

  oi_refmodel_options ro;
  oi_refmodel_options_init(&ro);
  ro.num_layers = 4;
  ro.hidden = 128;
  ro.vocab_size = 2048;
  ro.num_q_heads = 8;
  ro.num_kv_heads = 4;
  ro.head_dim = 16;
  ro.intermediate = 256;
  ro.max_positions = 4096 + 512;
  ro.device = -1;
  if (oi_refmodel_create(&ro, &ops_p, &mp) != OI_OK ||
      oi_refmodel_create(&ro, &ops_d, &md) != OI_OK ||
      oi_refmodel_create(&ro, &ops_c, &mc) != OI_OK ||
      executor(&ops_p, mp, OI_OFFLOAD_SIDECAR, p_psock, &xp) != OI_OK ||
      executor(&ops_d, md, OI_OFFLOAD_SIDECAR, p_dsock, &xd) != OI_OK ||
      executor(&ops_c, mc, OI_OFFLOAD_NONE, NULL, &xc) != OI_OK) {
    fprintf(stderr, "openinfer demo pd: %s\n", oi_last_error());
    goto out;
  }
  printf("openinfer demo pd — libopeninfer %s\n", oi_version_string());
  printf("a redis-server on port %d (the directory); nodes 'prefill' and 'decode' (openinfer "
         "serve, cpu pools of 256 MiB), joined with a shared secret\n",
         port);
  printf("%ld prompts of %ld tokens: prefill on node 'prefill', then decode of %ld tokens on "
         "node 'decode'\n\n",
         prompts, ptokens, ntokens);
  printf("%6s %14s %14s %9s %10s %9s\n", "prompt", "decode TTFT", "recomputed", "speedup",
         "restored", "output");
  prompt = malloc((size_t)ptokens * sizeof *prompt);
  if (!prompt) goto out;
  long same = 0, restored_all = 0;
  for (long i = 0; i < prompts; i++) {
    for (long t = 0; t < ptokens; t++)
      prompt[t] = token_of((uint64_t)i + 1, (uint64_t)t, ro.vocab_size);
    oi_request r;
    oi_request_init(&r);
    r.prompt = prompt;
    r.prompt_len = (uint32_t)ptokens;
    uint64_t idp, idd, idc;
    /* Prefill: compute the prompt, save its blocks on node 'prefill'. */
    r.max_new_tokens = 1;
    if (oi_executor_submit(xp, &r, &idp) != OI_OK || oi_executor_run_until_idle(xp) != OI_OK ||
        oi_executor_flush(xp, 30000) != OI_OK)
      goto fail;
    sleep_ms(100); /* its blocks reach the directory (published in batches) */
    /* Decode on the other node, and the same from scratch. */
    r.max_new_tokens = (uint32_t)ntokens;
    if (oi_executor_submit(xd, &r, &idd) != OI_OK || oi_executor_run_until_idle(xd) != OI_OK ||
        oi_executor_submit(xc, &r, &idc) != OI_OK || oi_executor_run_until_idle(xc) != OI_OK)
      goto fail;
    oi_request_result rd = {.struct_size = sizeof rd}, rcold = {.struct_size = sizeof rcold};
    if (oi_executor_get_result(xd, idd, &rd) != OI_OK ||
        oi_executor_get_result(xc, idc, &rcold) != OI_OK)
      goto fail;
    bool eq = rd.state == OI_REQUEST_FINISHED && rcold.state == OI_REQUEST_FINISHED &&
              rd.n_tokens == rcold.n_tokens &&
              !memcmp(rd.tokens, rcold.tokens, rd.n_tokens * sizeof *rd.tokens);
    same += eq;
    uint32_t want = (uint32_t)((ptokens - 1) / 16 * 16);
    restored_all += rd.restored_tokens == want;
    double t_d = rd.ttft_ns / 1e6, t_c = rcold.ttft_ns / 1e6;
    printf("%6ld %11.2f ms %11.2f ms %8.1fx %5u/%-4u %9s\n", i, t_d, t_c, t_d > 0 ? t_c / t_d : 0,
           rd.restored_tokens, want, eq ? "same" : "DIFFERS");
  }
  oi_executor_stats st = {.struct_size = sizeof st};
  oi_executor_get_stats(xd, &st);
  printf("\ndecode node: %llu restores, %llu waited for blocks fetched from the prefill node, "
         "%llu failed\n",
         (unsigned long long)st.restores_completed, (unsigned long long)st.restores_waited,
         (unsigned long long)st.restores_failed);
  if (same == prompts && restored_all == prompts) {
    printf("demo OK: every prefix restored across nodes, completions identical\n");
    rc = CLI_OK;
  } else {
    printf("demo FAILED: %ld of %ld outputs identical, %ld of %ld prefixes restored\n", same,
           prompts, restored_all, prompts);
  }
  goto out;
fail:
  fprintf(stderr, "openinfer demo pd: %s\n", oi_last_error());
out:
  oi_executor_destroy(xd);
  oi_executor_destroy(xp);
  oi_executor_destroy(xc);
  if (mp) oi_refmodel_destroy(mp);
  if (md) oi_refmodel_destroy(md);
  if (mc) oi_refmodel_destroy(mc);
  free(prompt);
  if (rc != CLI_OK && (s.prefill || s.decode)) {
    fprintf(stderr, "prefill node log:\n");
    print_log(p_plog);
    fprintf(stderr, "decode node log:\n");
    print_log(p_dlog);
  }
  cleanup(&s);
  return rc;
}
