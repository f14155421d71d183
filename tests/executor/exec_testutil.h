/* Helpers of the executor tests: the tiny reference model, prompts, running
 * one request to completion, snapshots of a request's KV blocks, and (for
 * SIDECAR mode) a real `openinfer serve` on a socket in a private directory. */
#ifndef OI_EXEC_TESTUTIL_H
#define OI_EXEC_TESTUTIL_H

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <sys/wait.h>
#include <unistd.h>

#include "rig.h"
#include "testutil.h"

#define OI_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

#pragma GCC diagnostic ignored "-Wunused-function"

#define PAGE 4
#define GPU_BLOCKS 64
#define MAX_NEW 16

static oi_model_ops model_ops;
static void *model_ctx;

static void model_init(void) {
  oi_refmodel_options ro;
  oi_refmodel_options_init(&ro);
  ro.seed = 7;
  model_ops.struct_size = sizeof model_ops;
  REQUIRE(oi_refmodel_create(&ro, &model_ops, &model_ctx) == OI_OK);
}

/* Deterministic pseudo-random prompt tokens below the tiny model's vocab. */
static void make_prompt(uint32_t *out, uint32_t n, uint64_t seed) {
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (uint32_t i = 0; i < n; i++) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    out[i] = (uint32_t)(s % 512);
  }
}

static void exec_options(oi_executor_options *o, uint32_t mode) {
  oi_executor_options_init(o);
  o->model = &model_ops;
  o->model_ctx = model_ctx;
  o->page_size = PAGE;
  o->gpu_blocks = GPU_BLOCKS;
  o->offload = mode;
  o->max_batch_tokens = 64;
  o->restore_timeout_ms = 10000;
  o->flush_timeout_ms = 10000;
  /* OI_RESTORE_OVERLAP=host (the meson test's environment) onto the option. */
  const char *ov = getenv("OI_RESTORE_OVERLAP");
  if (ov && !strcmp(ov, "host"))
    o->restore_overlap = OI_RESTORE_OVERLAP_HOST;
  else if (ov && (!strcmp(ov, "0") || !strcmp(ov, "off")))
    o->restore_overlap = OI_RESTORE_OVERLAP_OFF;
}

typedef struct run_out {
  uint32_t tokens[MAX_NEW];
  uint32_t n_tokens;
  oi_request_result res;
  uint64_t id;
} run_out;

static uint64_t submit(oi_executor *x, const uint32_t *prompt, uint32_t n, int32_t rank) {
  return tr_submit(x, prompt, n, MAX_NEW, rank);
}

static void collect(oi_executor *x, uint64_t id, run_out *out) {
  memset(out, 0, sizeof *out);
  out->id = id;
  out->res.struct_size = sizeof out->res;
  CHECK_OK(oi_executor_get_result(x, id, &out->res));
  CHECK(out->res.state == OI_REQUEST_FINISHED);
  CHECK(out->res.n_tokens == MAX_NEW);
  out->n_tokens = out->res.n_tokens;
  if (out->n_tokens <= MAX_NEW)
    memcpy(out->tokens, out->res.tokens, out->n_tokens * sizeof(uint32_t));
}

/* Submits, runs until idle, collects. */
static void run_one(oi_executor *x, const uint32_t *prompt, uint32_t n, int32_t rank,
                    run_out *out) {
  uint64_t id = submit(x, prompt, n, rank);
  CHECK_OK(oi_executor_run_until_idle(x));
  collect(x, id, out);
}

static bool same_tokens(const run_out *a, const run_out *b) {
  return a->n_tokens == b->n_tokens &&
         !memcmp(a->tokens, b->tokens, a->n_tokens * sizeof(uint32_t));
}

/* The K and V bytes of the first n_blocks blocks of a finished request, all
 * layers, in table order. Caller frees. */
static uint8_t *kv_snapshot(oi_executor *x, uint32_t rank, uint64_t id, size_t n_blocks,
                            size_t *bytes) {
  oi_kv_layout kv = {.struct_size = sizeof kv};
  REQUIRE(oi_executor_get_kv_layout(x, rank, &kv) == OI_OK);
  int64_t ids[GPU_BLOCKS];
  size_t n = 0;
  REQUIRE(oi_executor_request_blocks(x, id, ids, GPU_BLOCKS, &n) == OI_OK);
  REQUIRE(n >= n_blocks);
  *bytes = n_blocks * kv.num_layers * kv.block_stride;
  uint8_t *snap = malloc(*bytes), *p = snap;
  REQUIRE(snap);
  for (size_t b = 0; b < n_blocks; b++)
    for (uint32_t l = 0; l < kv.num_layers; l++) {
      memcpy(p, (uint8_t *)kv.base + l * kv.layer_stride + (uint64_t)ids[b] * kv.block_stride,
             kv.block_stride); /* K page then V page */
      p += kv.block_stride;
    }
  return snap;
}

/* ---- a real sidecar server ---------------------------------------------------------- */

typedef struct test_server {
  pid_t pid;
  char dir[64], socket[128], log[128];
} test_server;

#define log_contains tr_file_contains

static void server_dump_log(const test_server *ts) {
  FILE *f = fopen(ts->log, "r");
  if (!f) return;
  char line[1024];
  fprintf(stderr, "---- server log ----\n");
  while (fgets(line, sizeof line, f))
    fputs(line, stderr);
  fclose(f);
}

/* Starts `openinfer serve` and waits for its ready line (10 s). */
static bool server_start(test_server *ts, const char *exe) {
  memset(ts, 0, sizeof *ts);
  snprintf(ts->dir, sizeof ts->dir, "/tmp/oi-exec-XXXXXX");
  if (!mkdtemp(ts->dir)) return false;
  snprintf(ts->socket, sizeof ts->socket, "%s/oi.sock", ts->dir);
  snprintf(ts->log, sizeof ts->log, "%s/server.log", ts->dir);
  pid_t pid = fork();
  if (pid < 0) return false;
  if (pid == 0) {
    int fd = open(ts->log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      close(fd);
    }
    execl(exe, exe, "serve", "--socket", ts->socket, "--pool", "64M", "--log-level", "info",
          (char *)NULL);
    _exit(127);
  }
  ts->pid = pid;
  for (int i = 0; i < 1000; i++) {
    if (log_contains(ts->log, "openinfer serve: listening on")) return true;
    int status;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      ts->pid = 0;
      server_dump_log(ts);
      return false;
    }
    usleep(10000);
  }
  server_dump_log(ts);
  return false;
}

static void server_stop(test_server *ts) {
  if (ts->pid) {
    kill(ts->pid, SIGTERM);
    int status = 0;
    for (int i = 0; i < 2000; i++) {
      if (waitpid(ts->pid, &status, WNOHANG) == ts->pid) {
        ts->pid = 0;
        break;
      }
      usleep(10000);
    }
    if (ts->pid) {
      kill(ts->pid, SIGKILL);
      waitpid(ts->pid, &status, 0);
      ts->pid = 0;
    }
  }
  tu_remove_dir(ts->dir);
}

#endif
