/* `openinfer bench disk`: the disk tier under a cpu host, against fio on the
 * same directory in the same run.
 *
 *  0. fio baseline: sequential 1 MiB O_DIRECT writes, then reads, io_uring
 *     (libaio when io_uring is refused), iodepth 32, on a file of --bytes;
 *  1. spill: blocks saved through an embedded engine until --bytes are in
 *     the pool, timed from the first save until the disk tier has written
 *     every one (disk_stats.spills);
 *  2. restore: the pool emptied (evict_all), then a query that waits for
 *     its promotions (OI_QUERY_WAIT_PENDING) over every hash, timed until
 *     it returns with every block a hit; then 22 GLM5.2-shaped blocks
 *     restored from disk, pipelined (loads of sealed blocks overlap the
 *     reads of the rest), against 1.2 x (bytes / fio read) + 1 ms, and the
 *     waited way (one query with wait, one load) beside it;
 *  3. index replay: a store directory whose checkpoint and log name
 *     --replay-blocks blocks (records written directly, over a fallocated
 *     data file whose blocks were never written), timed through oi__disk_open;
 *  4. codecs (--content corpus [--codec LIST]): the spill and restore of 1
 *     and 2 through an engine of each codec beside none, over the real-KV
 *     corpus (bench_disk_codec.c).
 *
 * Timed regions hold only what is measured: arenas are filled, pools
 * emptied and bytes verified outside them. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysinfo.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "bench_disk.h"
#include "cli.h"
#include "codec/codec.h"
#include "core/core.h"
#include "disk/disk.h"
#include "openinfer/disk.h"
#include "openinfer/openinfer.h"

#define SAVE_CALL_BLOCKS 64
#define SPILL_RATIO_TARGET 0.9   /* spill GB/s vs fio write, at least (this bench's target) */
#define RESTORE_RATIO_TARGET 0.9 /* restore GB/s vs fio read, at least (this bench's target) */
#define REPLAY_TARGET_S 2.0      /* oi__disk_open of 1,000,000 index entries, at most */
#define REPLAY_TARGET_BLOCKS 1000000ull /* the target is judged from this many entries on */
#define GLM_BLOCKS 22
#define GLM_REPS 5
#define REPLAY_ENTRY_BYTES 8192ull /* a 1-byte block: header sector + one payload sector */
#define REPLAY_LOG_EVERY 65536ull  /* the store's default checkpoint interval */
#define WAIT_MS BENCH_DISK_WAIT_MS

typedef struct disk_cfg {
  const char *dir; /* NULL: a fresh temp dir */
  uint64_t bytes, block_bytes, replay_blocks;
  bool json;
  bool block_set;                 /* --block-bytes given */
  bool corpus;                    /* --content corpus: phase 4, the codec rows */
  bool codec_set;                 /* --codec given */
  bool codecs[BENCH_DISK_CODECS]; /* --codec (none always) */
  const char *corpus_path;        /* --corpus; NULL: the default place */
} disk_cfg;

typedef struct disk_result {
  char dir[512];
  /* fio */
  bool fio_ok;
  char fio_engine[16];
  char fio_note[256];
  double fio_write_gbps, fio_read_gbps;
  /* spill / restore */
  uint64_t blocks;
  double saved_s; /* every save call returned and completed (diagnostic) */
  double spill_s, spill_gbps;
  double restore_s, restore_gbps;
  uint32_t restore_queries;
  bool restore_verified;
  oi_host_disk_stats ds;
  /* GLM5.2 */
  uint64_t glm_block_bytes;
  double glm_us[GLM_REPS], glm_p50_us, glm_best_us, glm_bound_us;
  double glm_wait_us[GLM_REPS], glm_wait_p50_us; /* query(wait), then one load */
  /* replay */
  uint64_t replay_blocks;       /* entries actually written */
  uint64_t replay_wanted;       /* --replay-blocks */
  uint64_t replay_loaded;       /* blocks the store reported after open */
  double replay_open_s;         /* oi__disk_open, wall */
  double replay_ns_s;           /* the store's own replay_ns */
  double replay_extrapolated_s; /* scaled to replay_wanted when fewer were written */
  double replay_write_s;        /* writing the records (untimed phase, reported) */
} disk_result;

static int fail_api(const char *what) {
  fprintf(stderr, "openinfer bench disk: %s: %s\n", what, oi_last_error());
  return -1;
}

static int fail_msg(const char *what) {
  fprintf(stderr, "openinfer bench disk: %s\n", what);
  return -1;
}

static double secs(uint64_t ns) { return (double)ns / 1e9; }
static double ratio(double a, double b) { return b > 0 ? a / b : 0.0; }

static inline uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

oi_block_hash bench_disk_hash(uint64_t stream, uint64_t i) {
  uint64_t k = (stream << 56) ^ i, a = mix64(k), b = mix64(k ^ 0xD1B54A32D192ED03ull);
  oi_block_hash h;
  memcpy(h.bytes, &a, 8);
  memcpy(h.bytes + 8, &b, 8);
  return h;
}

/* Every 8 bytes of block b follow from (b, offset): a swapped block fails. */
static void fill_block(uint8_t *p, uint64_t bytes, uint64_t b) {
  for (uint64_t i = 0; i + 8 <= bytes; i += 8) {
    uint64_t v = mix64(b * 0x100000001B3ull + i);
    memcpy(p + i, &v, 8);
  }
}

static bool check_block(const uint8_t *p, uint64_t bytes, uint64_t b) {
  for (uint64_t i = 0; i + 8 <= bytes; i += 8) {
    uint64_t v = mix64(b * 0x100000001B3ull + i), got;
    memcpy(&got, p + i, 8);
    if (got != v) return false;
  }
  return true;
}

/* ---- files and directories ---------------------------------------------------- */

static void rm_files(const char *dir, const char *const *names, size_t n) {
  char p[1024];
  for (size_t i = 0; i < n; i++) {
    snprintf(p, sizeof p, "%s/%s", dir, names[i]);
    unlink(p);
  }
}

static const char *const store_files[] = {"openinfer-disk.data", "openinfer-disk.log",
                                          "openinfer-disk.ckpt", "openinfer-disk.ckpt.tmp",
                                          "openinfer-disk.lock"};

void bench_disk_remove_store(const char *dir) {
  rm_files(dir, store_files, sizeof store_files / sizeof store_files[0]);
}

static int write_all(int fd, const void *buf, size_t n, off_t off) {
  const uint8_t *p = buf;
  while (n) {
    ssize_t w = pwrite(fd, p, n, off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    p += w;
    n -= (size_t)w;
    off += w;
  }
  return 0;
}

/* ---- 0. fio --------------------------------------------------------------------- */

/* Runs fio with `args` (NULL-terminated), its JSON into `out_path`.
 * @return its exit status, 127 when it could not be started. */
static int run_fio(char *const *args, const char *out_path, const char *err_path) {
  pid_t pid = fork();
  if (pid < 0) return 127;
  if (pid == 0) {
    int o = open(out_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    int e = open(err_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (o < 0 || e < 0) _exit(126);
    dup2(o, 1);
    dup2(e, 2);
    execvp("fio", args);
    _exit(127);
  }
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *b = malloc(n > 0 ? (size_t)n + 1 : 1);
  if (b) {
    size_t got = n > 0 ? fread(b, 1, (size_t)n, f) : 0;
    b[got] = '\0';
  }
  fclose(f);
  return b;
}

/* The number after `"key" :` at or after p (fio's JSON layout); -1 when absent. */
static double json_number_after(const char *p, const char *key) {
  char pat[64];
  snprintf(pat, sizeof pat, "\"%s\"", key);
  const char *k = p ? strstr(p, pat) : NULL;
  if (!k) return -1;
  k += strlen(pat);
  while (*k == ' ' || *k == ':' || *k == '\t' || *k == '\n')
    k++;
  char *end;
  double v = strtod(k, &end);
  return end == k ? -1 : v;
}

/* fio's bandwidth in GB/s for `dir` ("write" or "read") of its first job;
 * -1 when the output does not parse or the job reported an error. */
static double fio_gbps(const char *json, const char *dir) {
  const char *jobs = json ? strstr(json, "\"jobs\"") : NULL;
  if (!jobs) return -1;
  if (json_number_after(jobs, "error") != 0) return -1;
  char pat[32];
  snprintf(pat, sizeof pat, "\"%s\" : {", dir);
  const char *sec = strstr(jobs, pat);
  if (!sec) {
    snprintf(pat, sizeof pat, "\"%s\":{", dir);
    sec = strstr(jobs, pat);
  }
  double bw = json_number_after(sec, "bw_bytes");
  return bw > 0 ? bw / 1e9 : -1;
}

static void fio_phase(const disk_cfg *cfg, const char *dir, disk_result *r) {
  char file[600], size[32], out[600], err[600], fname[640];
  snprintf(file, sizeof file, "%s/fio-baseline.dat", dir);
  snprintf(out, sizeof out, "%s/fio-out.json", dir);
  snprintf(err, sizeof err, "%s/fio-err.txt", dir);
  snprintf(size, sizeof size, "--size=%llu", (unsigned long long)cfg->bytes);
  snprintf(fname, sizeof fname, "--filename=%s", file);
  const char *engines[] = {"io_uring", "libaio"};
  for (int e = 0; e < 2 && !r->fio_ok; e++) {
    char eng[32];
    snprintf(eng, sizeof eng, "--ioengine=%s", engines[e]);
    double gb[2] = {-1, -1};
    const char *rw[2] = {"write", "read"};
    int rc = 0;
    for (int k = 0; k < 2; k++) {
      char rwarg[32], name[32];
      snprintf(rwarg, sizeof rwarg, "--rw=%s", rw[k]);
      snprintf(name, sizeof name, "--name=seq-%s", rw[k]);
      char *args[] = {"fio",
                      name,
                      fname,
                      size,
                      "--bs=1M",
                      rwarg,
                      "--direct=1",
                      eng,
                      "--iodepth=32",
                      "--numjobs=1",
                      "--output-format=json",
                      NULL};
      fprintf(stderr, "fio: sequential %s, %s, 1 MiB, iodepth 32, O_DIRECT\n", rw[k], engines[e]);
      rc = run_fio(args, out, err);
      if (rc == 127) break;
      char *json = slurp(out);
      gb[k] = rc == 0 ? fio_gbps(json, rw[k]) : -1;
      free(json);
      if (gb[k] <= 0) break;
    }
    if (rc == 127) {
      snprintf(r->fio_note, sizeof r->fio_note,
               "fio not found (Debian: apt-get install fio; ./dev deps installs it): "
               "absolute figures only");
      break;
    }
    if (gb[0] > 0 && gb[1] > 0) {
      r->fio_ok = true;
      r->fio_write_gbps = gb[0];
      r->fio_read_gbps = gb[1];
      snprintf(r->fio_engine, sizeof r->fio_engine, "%s", engines[e]);
    } else {
      char *msg = slurp(err);
      if (msg) { /* keep the first line */
        char *nl = strchr(msg, '\n');
        if (nl) *nl = '\0';
      }
      snprintf(r->fio_note, sizeof r->fio_note, "fio with %s failed (exit %d)%s%s", engines[e], rc,
               msg && *msg ? ": " : "", msg ? msg : "");
      fprintf(stderr, "openinfer bench disk: %s\n", r->fio_note);
      free(msg);
    }
  }
  unlink(file);
  unlink(out);
  unlink(err);
}

/* ---- 1 and 2: spill, restore ------------------------------------------------------ */

typedef struct rig {
  oi_host *host;
  oi_engine *eng, *glm;
  uint8_t *arena;
  uint8_t *glm_arena;
  oi_arena_desc glm_ad[99];
  char glm_names[99][8];
} rig;

int bench_disk_stats(oi_host *h, oi_host_disk_stats *s) {
  memset(s, 0, sizeof *s);
  s->struct_size = sizeof *s;
  return oi_host_get_disk_stats(h, s) == OI_OK ? 0 : fail_api("disk stats");
}

/* Waits until the disk tier has written `target` blocks; -1 when spills
 * failed or were skipped so that it never will. */
int bench_disk_wait_spilled(oi_host *h, uint64_t target, uint64_t *t_done) {
  uint64_t deadline = oi__now_ns() + 600ull * 1000000000ull;
  for (;;) {
    oi_host_disk_stats s;
    if (bench_disk_stats(h, &s) != 0) return -1;
    if (s.spills >= target) {
      *t_done = oi__now_ns();
      return 0;
    }
    if (s.spills_failed || s.spills_skipped || s.spill_overflow) {
      fprintf(stderr,
              "openinfer bench disk: spills: %llu written, %llu failed, %llu skipped, %llu "
              "overflowed (of %llu)\n",
              (unsigned long long)s.spills, (unsigned long long)s.spills_failed,
              (unsigned long long)s.spills_skipped, (unsigned long long)s.spill_overflow,
              (unsigned long long)target);
      return -1;
    }
    if (oi__now_ns() > deadline) return fail_msg("spills did not finish in 600 s");
    struct timespec nap = {.tv_sec = 0, .tv_nsec = 500000};
    nanosleep(&nap, NULL);
  }
}

int bench_disk_empty_pool(oi_host *h) {
  if (oi_host_evict_all(h, NULL) != OI_OK) return fail_api("evict_all");
  oi_host_stats hs = {.struct_size = sizeof hs};
  if (oi_host_get_stats(h, &hs) != OI_OK) return fail_api("host stats");
  if (hs.blocks_sealed) return fail_msg("the pool still holds blocks after evict_all");
  return 0;
}

static int rig_open(const disk_cfg *cfg, const char *dir, uint64_t glm_bytes, rig *g) {
  memset(g, 0, sizeof *g);
  uint64_t n = cfg->bytes / cfg->block_bytes;
  oi_host_options ho;
  oi_host_options_init(&ho);
  ho.device = OI_DEVICE_CPU;
  ho.flags = OI_HOST_NO_PIN;
  /* The whole run fits, and the GLM5.2 blocks beside it: nothing is evicted
   * before the spiller writes it. */
  ho.pool_bytes = cfg->bytes + OI_MAX(cfg->bytes / 8, 128ull << 20) + GLM_BLOCKS * glm_bytes;
  ho.high_watermark = 1.0f;
  ho.low_watermark = 1.0f;
  if (oi_host_create(&ho, &g->host) != OI_OK) return fail_api("host create");
  oi_host_disk_options d;
  oi_host_disk_options_init(&d);
  const char *dirs[1] = {dir};
  d.dirs = dirs;
  d.num_dirs = 1;
  d.capacity_bytes = 2 * (cfg->bytes + GLM_BLOCKS * glm_bytes) + (64ull << 20);
  if (oi_host_attach_disk(g->host, &d) != OI_OK) return fail_api("attach_disk");

  g->arena = oi__aligned_alloc(4096, (size_t)(n * cfg->block_bytes));
  if (!g->arena) return fail_msg("out of memory (arena)");
  oi_arena_desc ad = {.name = "kv",
                      .base = g->arena,
                      .num_blocks = n,
                      .bytes_per_block = cfg->block_bytes,
                      .block_stride = cfg->block_bytes,
                      .segments = 1};
  oi_engine_options eo;
  oi_engine_options_init(&eo);
  eo.namespace_id = "bench-disk";
  eo.arenas = &ad;
  eo.num_arenas = 1;
  if (oi_engine_create(g->host, &eo, &g->eng) != OI_OK) return fail_api("engine create");

  /* GLM5.2: 78 arenas of 41,984 B and 21 of 8,448 B per block (bench transfer's shape);
   * 2 x 22 blocks: saved from the first 22, loaded into the others. */
  g->glm_arena = oi__aligned_alloc(4096, (size_t)(2 * GLM_BLOCKS * glm_bytes));
  if (!g->glm_arena) return fail_msg("out of memory (GLM5.2 arena)");
  uint64_t off = 0;
  for (int a = 0; a < 99; a++) {
    uint64_t bpb = a < 78 ? 41984 : 8448;
    snprintf(g->glm_names[a], sizeof g->glm_names[a], "l%d", a);
    g->glm_ad[a] = (oi_arena_desc){.name = g->glm_names[a],
                                   .base = g->glm_arena + off,
                                   .num_blocks = 2 * GLM_BLOCKS,
                                   .bytes_per_block = bpb,
                                   .block_stride = bpb,
                                   .segments = 1};
    off += bpb * 2 * GLM_BLOCKS;
  }
  oi_engine_options_init(&eo);
  eo.namespace_id = "bench-disk-glm5.2";
  eo.arenas = g->glm_ad;
  eo.num_arenas = 99;
  if (oi_engine_create(g->host, &eo, &g->glm) != OI_OK) return fail_api("engine create (GLM5.2)");
  return 0;
}

static void rig_close(rig *g) {
  oi_engine_destroy(g->glm);
  oi_engine_destroy(g->eng);
  oi_host_destroy(g->host);
  oi__free(g->arena);
  oi__free(g->glm_arena);
}

/* Block b's slice of GLM5.2 arena a. */
static uint8_t *glm_slice(rig *g, int a, int b) {
  return (uint8_t *)g->glm_ad[a].base + (uint64_t)b * g->glm_ad[a].bytes_per_block;
}

int bench_disk_save_all(oi_engine *e, const oi_block_hash *hs, uint64_t n, uint64_t id0) {
  int64_t ids[SAVE_CALL_BLOCKS];
  for (uint64_t done = 0; done < n;) {
    size_t k = (size_t)OI_MIN((uint64_t)SAVE_CALL_BLOCKS, n - done);
    for (size_t j = 0; j < k; j++)
      ids[j] = (int64_t)(id0 + done + j);
    if (oi_engine_save(e, ids, hs + done, k, NULL, NULL) != OI_OK) return fail_api("save");
    done += k;
  }
  return 0;
}

/* Queries until every hash is a hit (one query promotes a run of at most
 * 4096 blocks); @return the number of queries, -1 on failure. */
int bench_disk_query_all(oi_engine *e, const oi_block_hash *hs, uint64_t n, oi_lease *lease) {
  uint64_t prev = 0;
  for (int q = 1;; q++) {
    oi_query_result qr = {.struct_size = sizeof qr, .wait_ms = WAIT_MS};
    if (oi_engine_query(e, NULL, hs, n, OI_QUERY_WAIT_PENDING, &qr) != OI_OK)
      return fail_api("query");
    if (qr.hit_blocks == n) {
      *lease = qr.lease;
      return q;
    }
    if (qr.hit_blocks) oi_engine_release(e, qr.lease);
    if (qr.hit_blocks <= prev) {
      fprintf(stderr, "openinfer bench disk: restore stopped at %llu of %llu blocks\n",
              (unsigned long long)qr.hit_blocks, (unsigned long long)n);
      return -1;
    }
    prev = qr.hit_blocks;
  }
}

/* The 22 GLM5.2 blocks from disk, the simple way: one query that waits for
 * every promotion, then one load of them all. */
static oi_status glm_restore_waited(rig *g, const oi_block_hash *hs, const int64_t *dst) {
  oi_query_result q = {.struct_size = sizeof q, .wait_ms = WAIT_MS};
  if (oi_engine_query(g->glm, NULL, hs, GLM_BLOCKS, OI_QUERY_WAIT_PENDING, &q) != OI_OK) {
    fail_api("query (GLM5.2)");
    return OI_ERR_IO;
  }
  if (q.hit_blocks != GLM_BLOCKS) {
    if (q.hit_blocks) oi_engine_release(g->glm, q.lease);
    fprintf(stderr, "openinfer bench disk: GLM5.2 restore: %llu of %d blocks hit\n",
            (unsigned long long)q.hit_blocks, GLM_BLOCKS);
    return OI_ERR_NOT_FOUND;
  }
  oi_ticket *t = NULL;
  oi_status st = oi_engine_load(g->glm, q.lease, dst, GLM_BLOCKS, NULL, &t);
  if (st == OI_OK) st = oi_ticket_wait(t, WAIT_MS);
  oi_ticket_release(t);
  oi_engine_release(g->glm, q.lease); /* (consumed by the load: unknown is fine) */
  if (st != OI_OK) fail_api("load (GLM5.2)");
  return st;
}

/* Pipelined, as an engine would do it with the public API: the first query
 * starts every block's read (LOADING); each later query leases the blocks
 * that sealed since and a load copies them while the disk reads the rest
 * (the tier reads in prefix order, a window at a time). */
static oi_status glm_restore_pipelined(rig *g, const oi_block_hash *hs, const int64_t *dst) {
  oi_ticket *tickets[GLM_BLOCKS];
  int nt = 0;
  size_t first = 0;
  oi_status st = OI_OK;
  uint64_t deadline = oi__deadline_ns(WAIT_MS);
  while (first < GLM_BLOCKS && st == OI_OK) {
    oi_query_result q = {.struct_size = sizeof q};
    st = oi_engine_query(g->glm, NULL, hs + first, GLM_BLOCKS - first, 0, &q);
    if (st != OI_OK) {
      fail_api("query (GLM5.2)");
      break;
    }
    if (q.hit_blocks) {
      st = oi_engine_load(g->glm, q.lease, dst + first, q.hit_blocks, NULL, &tickets[nt]);
      if (st != OI_OK) {
        oi_engine_release(g->glm, q.lease);
        fail_api("load (GLM5.2)");
        break;
      }
      nt++;
      first += q.hit_blocks;
    } else if (q.pending_blocks == 0 || oi__now_ns() >= deadline) {
      fprintf(stderr, "openinfer bench disk: GLM5.2 restore: %zu of %d blocks hit\n", first,
              GLM_BLOCKS);
      st = OI_ERR_NOT_FOUND;
    } else {
      struct timespec nap = {.tv_sec = 0, .tv_nsec = 50000}; /* an engine's step would go here */
      nanosleep(&nap, NULL);
    }
  }
  for (int i = 0; i < nt; i++) {
    oi_status w = oi_ticket_wait(tickets[i], WAIT_MS);
    if (w != OI_OK && st == OI_OK) {
      st = w;
      fail_api("load (GLM5.2)");
    }
    oi_ticket_release(tickets[i]);
  }
  return st;
}

static int spill_restore_phase(const disk_cfg *cfg, const char *dir, disk_result *r) {
  uint64_t n = cfg->bytes / cfg->block_bytes, glm_bytes = 78ull * 41984 + 21ull * 8448;
  r->blocks = n;
  r->glm_block_bytes = glm_bytes;
  rig g;
  oi_block_hash *hs = calloc(n, sizeof *hs);
  oi_block_hash glm_hs[GLM_BLOCKS];
  int rc = -1;
  if (!hs) return fail_msg("out of memory");
  if (rig_open(cfg, dir, glm_bytes, &g) != 0) goto out;
  for (uint64_t b = 0; b < n; b++) {
    hs[b] = bench_disk_hash(1, b);
    fill_block(g.arena + b * cfg->block_bytes, cfg->block_bytes, b);
  }

  /* 1. spill */
  fprintf(stderr, "spill: %llu blocks of %llu B through the pool to %s\n", (unsigned long long)n,
          (unsigned long long)cfg->block_bytes, dir);
  uint64_t t0 = oi__now_ns(), t_spilled;
  if (bench_disk_save_all(g.eng, hs, n, 0) != 0) goto out;
  if (oi_engine_flush(g.eng, WAIT_MS) != OI_OK) {
    fail_api("flush");
    goto out;
  }
  r->saved_s = secs(oi__now_ns() - t0);
  if (bench_disk_wait_spilled(g.host, n, &t_spilled) != 0) goto out;
  r->spill_s = secs(t_spilled - t0);
  r->spill_gbps = (double)(n * cfg->block_bytes) / (double)(t_spilled - t0);

  /* 2. restore */
  if (bench_disk_empty_pool(g.host) != 0) goto out;
  fprintf(stderr, "restore: one query with OI_QUERY_WAIT_PENDING over %llu hashes\n",
          (unsigned long long)n);
  oi_lease lease;
  t0 = oi__now_ns();
  int queries = bench_disk_query_all(g.eng, hs, n, &lease);
  uint64_t t1 = oi__now_ns();
  if (queries < 0) goto out;
  r->restore_queries = (uint32_t)queries;
  r->restore_s = secs(t1 - t0);
  r->restore_gbps = (double)(n * cfg->block_bytes) / (double)(t1 - t0);
  /* Verify (untimed): load every block back over a zeroed arena. */
  memset(g.arena, 0, (size_t)(n * cfg->block_bytes));
  int64_t *dst = calloc(n, sizeof *dst);
  oi_ticket *t = NULL;
  bool ok = dst != NULL;
  for (uint64_t b = 0; ok && b < n; b++)
    dst[b] = (int64_t)b;
  if (ok) ok = oi_engine_load(g.eng, lease, dst, n, NULL, &t) == OI_OK;
  if (ok) ok = oi_ticket_wait(t, WAIT_MS) == OI_OK;
  oi_ticket_release(t);
  free(dst);
  oi_engine_release(g.eng, lease);
  for (uint64_t b = 0; ok && b < n; b++)
    ok = check_block(g.arena + b * cfg->block_bytes, cfg->block_bytes, b);
  r->restore_verified = ok;
  if (!ok) {
    fail_msg("restored blocks do not match what was saved");
    goto out;
  }

  /* 2b. 22 GLM5.2-shaped blocks: saved, spilled, evicted, then restored
   * from disk GLM_REPS times each way, interleaved: pipelined (judged) and
   * one query that waits, then one load. */
  fprintf(stderr, "restore: %d GLM5.2-shaped blocks from disk, %d times each way\n", GLM_BLOCKS,
          GLM_REPS);
  for (int a = 0; a < 99; a++)
    for (int b = 0; b < GLM_BLOCKS; b++)
      fill_block(glm_slice(&g, a, b), g.glm_ad[a].bytes_per_block, (uint64_t)b * 99 + (uint64_t)a);
  for (int b = 0; b < GLM_BLOCKS; b++)
    glm_hs[b] = bench_disk_hash(2, (uint64_t)b);
  oi_host_disk_stats s0;
  if (bench_disk_stats(g.host, &s0) != 0) goto out;
  if (bench_disk_save_all(g.glm, glm_hs, GLM_BLOCKS, 0) != 0) goto out;
  if (oi_engine_flush(g.glm, WAIT_MS) != OI_OK) {
    fail_api("flush");
    goto out;
  }
  if (bench_disk_wait_spilled(g.host, s0.spills + GLM_BLOCKS, &t1) != 0) goto out;
  int64_t glm_dst[GLM_BLOCKS];
  for (int b = 0; b < GLM_BLOCKS; b++)
    glm_dst[b] = GLM_BLOCKS + b;
  for (int rep = 0; rep < 2 * GLM_REPS; rep++) {
    bool pipelined = rep % 2 == 0; /* the two ways, interleaved */
    if (bench_disk_empty_pool(g.host) != 0) goto out;
    for (int a = 0; a < 99; a++)
      memset(glm_slice(&g, a, GLM_BLOCKS), 0, GLM_BLOCKS * g.glm_ad[a].bytes_per_block);
    t0 = oi__now_ns();
    oi_status st = pipelined ? glm_restore_pipelined(&g, glm_hs, glm_dst)
                             : glm_restore_waited(&g, glm_hs, glm_dst);
    t1 = oi__now_ns();
    if (st != OI_OK) goto out;
    if (pipelined)
      r->glm_us[rep / 2] = (double)(t1 - t0) / 1e3;
    else
      r->glm_wait_us[rep / 2] = (double)(t1 - t0) / 1e3;
    for (int a = 0; a < 99; a++)
      for (int b = 0; b < GLM_BLOCKS; b++)
        if (!check_block(glm_slice(&g, a, GLM_BLOCKS + b), g.glm_ad[a].bytes_per_block,
                         (uint64_t)b * 99 + (uint64_t)a)) {
          fail_msg("GLM5.2 blocks restored from disk do not match what was saved");
          goto out;
        }
  }
  double sorted[GLM_REPS];
  memcpy(sorted, r->glm_us, sizeof sorted);
  for (int i = 1; i < GLM_REPS; i++)
    for (int j = i; j > 0 && sorted[j - 1] > sorted[j]; j--) {
      double x = sorted[j];
      sorted[j] = sorted[j - 1];
      sorted[j - 1] = x;
    }
  r->glm_p50_us = sorted[GLM_REPS / 2];
  r->glm_best_us = sorted[0];
  memcpy(sorted, r->glm_wait_us, sizeof sorted);
  for (int i = 1; i < GLM_REPS; i++)
    for (int j = i; j > 0 && sorted[j - 1] > sorted[j]; j--) {
      double x = sorted[j];
      sorted[j] = sorted[j - 1];
      sorted[j - 1] = x;
    }
  r->glm_wait_p50_us = sorted[GLM_REPS / 2];
  if (bench_disk_stats(g.host, &r->ds) != 0) goto out;
  rc = 0;
out:
  rig_close(&g);
  free(hs);
  rm_files(dir, store_files, sizeof store_files / sizeof store_files[0]);
  return rc;
}

/* ---- 3. index replay --------------------------------------------------------------- */

static void put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }

static oi_disk_record replay_record(uint64_t i) {
  oi_disk_record rec = {.type = OI_DISK_REC_ADD,
                        .seq = i + 1,
                        .offset = i * REPLAY_ENTRY_BYTES,
                        .length = 1,
                        .payload_xxh = mix64(i)};
  rec.key.ns_fp = 0xb3c4d5e6f7a80912ull;
  rec.key.layout_fp = 0x1122334455667788ull;
  oi_block_hash h = bench_disk_hash(3, i);
  memcpy(rec.key.hash, h.bytes, 16);
  return rec;
}

/* Writes a checkpoint of the first n - tail records and a log of the last
 * `tail` (what the store holds after n writes with its default checkpoint
 * interval), over a data file of n x 8 KiB (fallocated, so unwritten
 * extents: nothing is written to it). */
static int replay_write(const char *dir, uint64_t n, uint64_t cap) {
  char p[1024];
  const uint64_t gen = 2, tail = n % REPLAY_LOG_EVERY, nckpt = n - tail;
  snprintf(p, sizeof p, "%s/openinfer-disk.data", dir);
  int fd = open(p, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  /* Allocated now, as a store reopened after a run finds it (the open's own
   * fallocate then has nothing to do); sparse where fallocate is refused. */
  if (fd < 0 || (fallocate(fd, 0, 0, (off_t)cap) != 0 && ftruncate(fd, (off_t)cap) != 0)) {
    if (fd >= 0) close(fd);
    return fail_msg("creating the replay data file");
  }
  close(fd);
  /* checkpoint */
  size_t bytes = OI_DISK_CKPT_HEADER_BYTES + (size_t)nckpt * OI_DISK_RECORD_BYTES;
  uint8_t *buf = calloc(1, OI_MAX(bytes, (size_t)(tail + 1) * OI_DISK_RECORD_BYTES));
  if (!buf) return fail_msg("out of memory (replay records)");
  put64(buf, OI_DISK_CKPT_MAGIC);
  put32(buf + 8, OI_DISK_VERSION);
  put64(buf + 16, nckpt);
  put64(buf + 24, gen);
  put64(buf + 32, cap);
  put64(buf + 40, n + 1);
  put64(buf + 56, XXH3_64bits(buf, 56));
  for (uint64_t i = 0; i < nckpt; i++) {
    oi_disk_record rec = replay_record(i);
    oi__disk_record_encode(&rec, buf + OI_DISK_CKPT_HEADER_BYTES + i * OI_DISK_RECORD_BYTES);
  }
  snprintf(p, sizeof p, "%s/openinfer-disk.ckpt", dir);
  fd = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  int bad = fd < 0 || write_all(fd, buf, bytes, 0) != 0 || fdatasync(fd) != 0;
  if (fd >= 0) close(fd);
  /* log: HEADER of the checkpoint's generation, then the tail */
  oi_disk_record hdr = {.type = OI_DISK_REC_HEADER, .seq = gen};
  oi__disk_record_encode(&hdr, buf);
  for (uint64_t i = 0; i < tail; i++) {
    oi_disk_record rec = replay_record(nckpt + i);
    oi__disk_record_encode(&rec, buf + (i + 1) * OI_DISK_RECORD_BYTES);
  }
  snprintf(p, sizeof p, "%s/openinfer-disk.log", dir);
  fd = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  bad |= fd < 0 || write_all(fd, buf, (size_t)(tail + 1) * OI_DISK_RECORD_BYTES, 0) != 0 ||
         fdatasync(fd) != 0;
  if (fd >= 0) close(fd);
  free(buf);
  return bad ? fail_msg("writing the replay index files") : 0;
}

static int replay_phase(const disk_cfg *cfg, const char *dir, disk_result *r) {
  char sub[600];
  snprintf(sub, sizeof sub, "%s/replay", dir);
  if (mkdir(sub, 0700) != 0 && errno != EEXIST) return fail_msg("mkdir of the replay directory");
  r->replay_wanted = cfg->replay_blocks;
  uint64_t n = cfg->replay_blocks;
  /* The store preallocates its data file (fallocate): n x 8 KiB must fit. */
  struct statvfs sv;
  if (statvfs(dir, &sv) == 0) {
    uint64_t room = (uint64_t)sv.f_bavail * sv.f_frsize;
    uint64_t fit = room / 10 * 8 / REPLAY_ENTRY_BYTES; /* at most 80% of the free space */
    if (fit < n) {
      fprintf(stderr,
              "replay: %.1f GB free in %s holds %llu of the %llu blocks' extents; measuring "
              "%llu and scaling\n",
              (double)room / 1e9, dir, (unsigned long long)fit, (unsigned long long)n,
              (unsigned long long)fit);
      n = fit;
    }
  }
  if (n < 1000) return fail_msg("replay: no room for 1000 blocks' extents");
  uint64_t cap = n * REPLAY_ENTRY_BYTES;
  fprintf(stderr, "replay: writing %llu index records (data file %.1f GB, fallocated)\n",
          (unsigned long long)n, (double)cap / 1e9);
  uint64_t t0 = oi__now_ns();
  int rc = replay_write(sub, n, cap);
  r->replay_write_s = secs(oi__now_ns() - t0);
  if (rc == 0) {
    const char *dirs[1] = {sub};
    oi_disk_options o = {.dirs = dirs, .num_dirs = 1, .capacity_bytes = cap};
    oi_disk *d = NULL;
    fprintf(stderr, "replay: oi__disk_open\n");
    t0 = oi__now_ns();
    oi_status st = oi__disk_open(&o, &d);
    uint64_t t1 = oi__now_ns();
    if (st != OI_OK) {
      rc = fail_api("replay: disk open");
    } else {
      oi_disk_stats s;
      oi__disk_stats_get(d, &s);
      r->replay_blocks = n;
      r->replay_loaded = s.blocks;
      r->replay_open_s = secs(t1 - t0);
      r->replay_ns_s = secs(s.replay_ns);
      r->replay_extrapolated_s = r->replay_open_s * (double)r->replay_wanted / (double)n;
      if (s.blocks != n || s.torn_records_cut || s.bad_extents_dropped) {
        fprintf(stderr,
                "openinfer bench disk: replay: %llu of %llu blocks loaded (%llu torn, %llu bad "
                "extents)\n",
                (unsigned long long)s.blocks, (unsigned long long)n,
                (unsigned long long)s.torn_records_cut, (unsigned long long)s.bad_extents_dropped);
        rc = -1;
      }
      oi__disk_close(d); /* writes a checkpoint of n records (untimed) */
    }
  }
  rm_files(sub, store_files, sizeof store_files / sizeof store_files[0]);
  rmdir(sub);
  return rc;
}

/* ---- report ------------------------------------------------------------------- */

typedef struct disk_verdicts {
  bool spill, restore, glm, replay;
} disk_verdicts;

static double glm_bound_us(const disk_result *r) {
  double bytes = (double)GLM_BLOCKS * (double)r->glm_block_bytes;
  return r->fio_ok ? 1.2 * bytes / (r->fio_read_gbps * 1e3) + 1000.0 : 0.0;
}

static disk_verdicts judge(const disk_result *r) {
  return (disk_verdicts){
      .spill = r->fio_ok && ratio(r->spill_gbps, r->fio_write_gbps) >= SPILL_RATIO_TARGET,
      .restore = r->fio_ok && ratio(r->restore_gbps, r->fio_read_gbps) >= RESTORE_RATIO_TARGET,
      .glm = r->fio_ok && r->glm_p50_us <= r->glm_bound_us,
      .replay =
          r->replay_wanted >= REPLAY_TARGET_BLOCKS && r->replay_extrapolated_s <= REPLAY_TARGET_S,
  };
}

static const char *pf(bool measured, bool ok) { return !measured ? "n/a" : ok ? "PASS" : "MISS"; }

static const char *size_str(uint64_t b, char *buf, size_t cap) {
  if (b >= (1ull << 30) && b % (1ull << 30) == 0)
    snprintf(buf, cap, "%llu GiB", (unsigned long long)(b >> 30));
  else if (b >= (1ull << 20) && b % (1ull << 20) == 0)
    snprintf(buf, cap, "%llu MiB", (unsigned long long)(b >> 20));
  else if (b >= (1ull << 10) && b % (1ull << 10) == 0)
    snprintf(buf, cap, "%llu KiB", (unsigned long long)(b >> 10));
  else
    snprintf(buf, cap, "%llu B", (unsigned long long)b);
  return buf;
}

static void print_table(const disk_cfg *cfg, const disk_result *r, const disk_verdicts *v,
                        const bench_disk_corpus *corpus, const bench_disk_codec_row *rows,
                        int nrows) {
  char a[32], b[32];
  int cpus = get_nprocs();
  printf("openinfer bench disk — libopeninfer %s, cpu host (unpinned pool), %d cpu%s\n",
         oi_version_string(), cpus, cpus == 1 ? "" : "s");
  printf("directory %s, %s in %llu blocks of %s\n\n", r->dir, size_str(cfg->bytes, a, sizeof a),
         (unsigned long long)r->blocks, size_str(cfg->block_bytes, b, sizeof b));
  if (r->fio_ok)
    printf("0. fio baseline (%s, 1 MiB, iodepth 32, O_DIRECT, %s file): write %.3f GB/s, read "
           "%.3f GB/s\n\n",
           r->fio_engine, size_str(cfg->bytes, a, sizeof a), r->fio_write_gbps, r->fio_read_gbps);
  else
    printf("0. fio baseline: none (%s)\n\n", r->fio_note[0] ? r->fio_note : "fio failed");
  char rs[16] = "-", rr[16] = "-", bound[32] = "<= (fio read)";
  if (r->fio_ok) {
    snprintf(rs, sizeof rs, "%.2fx", ratio(r->spill_gbps, r->fio_write_gbps));
    snprintf(rr, sizeof rr, "%.2fx", ratio(r->restore_gbps, r->fio_read_gbps));
    snprintf(bound, sizeof bound, "<= %.0f us", r->glm_bound_us);
  }
  printf("  %-46s %11s %11s   %-18s\n", "", "measured", "vs fio", "target");
  printf("  %-46s %6.3f GB/s %11s   %-18s %s\n", "1. spill: first save -> all on disk",
         r->spill_gbps, rs, ">= 0.9x fio write", pf(r->fio_ok, v->spill));
  printf("     (%.2f s; the saves into the pool completed after %.2f s)\n", r->spill_s, r->saved_s);
  printf("  %-46s %6.3f GB/s %11s   %-18s %s\n", "2. restore: query(wait) of every block",
         r->restore_gbps, rr, ">= 0.9x fio read", pf(r->fio_ok, v->restore));
  printf("     (%.2f s, %u quer%s; every byte verified by a load afterwards)\n", r->restore_s,
         r->restore_queries, r->restore_queries == 1 ? "y" : "ies");
  printf("  %-46s %8.0f us %11s   %-18s %s\n", "   22 GLM5.2 blocks: pipelined restore, p50",
         r->glm_p50_us, "", bound, pf(r->fio_ok, v->glm));
  printf("     (%.1f MB, best of %d %.0f us; bound 1.2 x bytes / fio read + 1 ms; loads of the\n"
         "      blocks that sealed overlap the reads of the rest. One query that waits for\n"
         "      every block, then one load: p50 %.0f us)\n",
         (double)GLM_BLOCKS * (double)r->glm_block_bytes / 1e6, GLM_REPS, r->glm_best_us,
         r->glm_wait_p50_us);
  if (r->replay_blocks == r->replay_wanted)
    printf("  %-46s %9.3f s  %11s   %-18s %s\n", "3. index replay: oi__disk_open", r->replay_open_s,
           "", "<= 2 s", pf(r->replay_wanted >= REPLAY_TARGET_BLOCKS, v->replay));
  else
    printf("  %-46s %9.3f s  %11s   %-18s %s\n", "3. index replay, scaled (see below)",
           r->replay_extrapolated_s, "", "<= 2 s",
           pf(r->replay_wanted >= REPLAY_TARGET_BLOCKS, v->replay));
  printf("     (%llu index entries (%llu in the checkpoint, %llu in the log); store's replay_ns "
         "%.3f s;\n      records written in %.2f s%s)\n",
         (unsigned long long)r->replay_blocks,
         (unsigned long long)(r->replay_blocks - r->replay_blocks % REPLAY_LOG_EVERY),
         (unsigned long long)(r->replay_blocks % REPLAY_LOG_EVERY), r->replay_ns_s,
         r->replay_write_s,
         r->replay_blocks == r->replay_wanted
             ? ""
             : "; scaled linearly to --replay-blocks, which flatters it: replay grows faster "
               "than linearly");
  printf("\ndisk tier: %llu spills, %llu promotions, %llu promote failures, %llu checksum "
         "failures\n",
         (unsigned long long)r->ds.spills, (unsigned long long)r->ds.promotions,
         (unsigned long long)r->ds.promote_failed, (unsigned long long)r->ds.checksum_failures);
  int met = (int)v->spill + (int)v->restore + (int)v->glm + (int)v->replay;
  int judged = (r->fio_ok ? 3 : 0) + (r->replay_wanted >= REPLAY_TARGET_BLOCKS);
  printf("targets met: %d of %d%s%s\n", met, judged,
         r->fio_ok ? "" : " (no fio baseline: ratios not judged)",
         r->replay_wanted >= REPLAY_TARGET_BLOCKS ? "" : " (replay judged at 1,000,000 entries)");
  if (cfg->corpus) bench_disk_codec_print_table(corpus, cfg->block_bytes, rows, nrows);
}

static void json_str(const char *s) {
  putchar('"');
  for (; *s; s++)
    if (*s == '"' || *s == '\\')
      printf("\\%c", *s);
    else if ((unsigned char)*s < 0x20)
      printf("\\u%04x", (unsigned)(unsigned char)*s);
    else
      putchar(*s);
  putchar('"');
}

static void print_json(const disk_cfg *cfg, const disk_result *r, const disk_verdicts *v,
                       const bench_disk_corpus *corpus, const bench_disk_codec_row *rows,
                       int nrows) {
#define B(x) ((x) ? "true" : "false")
  printf("{\"bench\":\"disk\",\"version\":\"%s\",\"cpus\":%d,\"dir\":", oi_version_string(),
         get_nprocs());
  json_str(r->dir);
  printf(",\"bytes\":%llu,\"block_bytes\":%llu,\"blocks\":%llu", (unsigned long long)cfg->bytes,
         (unsigned long long)cfg->block_bytes, (unsigned long long)r->blocks);
  printf(",\"fio\":%s,\"fio_engine\":\"%s\",\"fio_write_gbps\":%.4f,\"fio_read_gbps\":%.4f",
         B(r->fio_ok), r->fio_ok ? r->fio_engine : "", r->fio_write_gbps, r->fio_read_gbps);
  printf(",\"spill_s\":%.4f,\"spill_gbps\":%.4f,\"spill_ratio\":%.4f,\"saved_s\":%.4f", r->spill_s,
         r->spill_gbps, ratio(r->spill_gbps, r->fio_write_gbps), r->saved_s);
  printf(",\"restore_s\":%.4f,\"restore_gbps\":%.4f,\"restore_ratio\":%.4f"
         ",\"restore_queries\":%u,\"restore_verified\":%s",
         r->restore_s, r->restore_gbps, ratio(r->restore_gbps, r->fio_read_gbps),
         r->restore_queries, B(r->restore_verified));
  printf(",\"restore_22_glm\":{\"block_bytes\":%llu,\"bytes\":%llu,\"p50_us\":%.1f,\"best_us\":%.1f"
         ",\"bound_us\":%.1f,\"reps\":%d,\"waited_p50_us\":%.1f}",
         (unsigned long long)r->glm_block_bytes,
         (unsigned long long)(GLM_BLOCKS * r->glm_block_bytes), r->glm_p50_us, r->glm_best_us,
         r->glm_bound_us, GLM_REPS, r->glm_wait_p50_us);
  printf(",\"replay\":{\"blocks_wanted\":%llu,\"blocks\":%llu,\"blocks_loaded\":%llu"
         ",\"checkpoint_records\":%llu,\"log_records\":%llu,\"open_s\":%.4f,\"replay_ns_s\":%.4f"
         ",\"scaled_s\":%.4f,\"scaled\":%s,\"write_s\":%.4f}",
         (unsigned long long)r->replay_wanted, (unsigned long long)r->replay_blocks,
         (unsigned long long)r->replay_loaded,
         (unsigned long long)(r->replay_blocks - r->replay_blocks % REPLAY_LOG_EVERY),
         (unsigned long long)(r->replay_blocks % REPLAY_LOG_EVERY), r->replay_open_s,
         r->replay_ns_s, r->replay_extrapolated_s, B(r->replay_blocks != r->replay_wanted),
         r->replay_write_s);
  printf(",\"disk_stats\":{\"spills\":%llu,\"spills_failed\":%llu,\"spills_skipped\":%llu"
         ",\"promotions\":%llu,\"promote_failed\":%llu,\"checksum_failures\":%llu}",
         (unsigned long long)r->ds.spills, (unsigned long long)r->ds.spills_failed,
         (unsigned long long)r->ds.spills_skipped, (unsigned long long)r->ds.promotions,
         (unsigned long long)r->ds.promote_failed, (unsigned long long)r->ds.checksum_failures);
  printf(",\"targets\":{\"spill_ratio\":%.2f,\"restore_ratio\":%.2f,\"glm_bound_us\":%.1f"
         ",\"replay_s\":%.1f,\"replay_blocks\":%llu}",
         SPILL_RATIO_TARGET, RESTORE_RATIO_TARGET, r->glm_bound_us, REPLAY_TARGET_S,
         REPLAY_TARGET_BLOCKS);
  bool rj = r->replay_wanted >= REPLAY_TARGET_BLOCKS;
  printf(",\"pass\":{\"spill\":%s,\"restore\":%s,\"restore_22_glm\":%s,\"replay\":%s}",
         r->fio_ok ? B(v->spill) : "null", r->fio_ok ? B(v->restore) : "null",
         r->fio_ok ? B(v->glm) : "null", rj ? B(v->replay) : "null");
  if (!r->fio_ok) {
    printf(",\"fio_note\":");
    json_str(r->fio_note);
  }
  if (cfg->corpus) bench_disk_codec_print_json(corpus, cfg->block_bytes, rows, nrows);
  printf("}\n");
#undef B
}

static void usage(FILE *f) {
  fprintf(f, "usage: openinfer bench disk [--dir DIR] [--bytes SIZE] [--block-bytes SIZE]\n"
             "                            [--replay-blocks N] [--content random|corpus]\n"
             "                            [--codec LIST] [--corpus FILE] [--json]\n"
             "\n"
             "Measures the disk tier under a cpu host, beside fio on the same directory:\n"
             "  0. fio: sequential 1 MiB O_DIRECT writes, then reads, io_uring (libaio when\n"
             "     io_uring is refused), iodepth 32, on a file of SIZE (no fio: absolute figures)\n"
             "  1. spill: SIZE of blocks saved through an engine, from the first save until the\n"
             "     disk tier has written every one; GB/s and the ratio to fio's write\n"
             "  2. restore: the pool emptied, then a query with OI_QUERY_WAIT_PENDING over every\n"
             "     hash, until every block is a hit; GB/s and the ratio to fio's read. Then 22\n"
             "     GLM5.2-shaped blocks (3.45 MB each) from disk, pipelined (the loads of the\n"
             "     blocks that sealed overlap the reads of the rest), against\n"
             "     1.2 x (bytes / fio read) + 1 ms; and query(wait) + load beside it\n"
             "  3. index replay: oi__disk_open of a store whose checkpoint and log name N blocks\n"
             "     (records written directly, over a fallocated data file of N x 8 KiB)\n"
             "  4. codecs (--content corpus): for none and each codec of LIST, its own host,\n"
             "     engine and store: SIZE of the real-KV corpus spilled and restored (query,\n"
             "     then the load that decodes); logical and physical (on disk) bytes, spill\n"
             "     and restore GB/s in logical bytes, blocks a GiB of disk holds, each beside\n"
             "     none; every block checked (lossless byte-exact, int8/fp8 within bound)\n"
             "\n"
             "  --dir DIR           where to measure (default: a fresh 0700 directory under\n"
             "                      $TMPDIR or /tmp, removed at the end); the bench's files\n"
             "                      in DIR are removed at the end\n"
             "  --bytes SIZE        bytes spilled and restored, and fio's file (default 1G)\n"
             "  --block-bytes SIZE  the engine's block (default 1M; a multiple of 4K)\n"
             "  --replay-blocks N   index entries of the replay phase (default 1000000)\n"
             "  --content KIND      random (default: phases 0-3 only) or corpus (adds phase 4:\n"
             "                      blocks of whole corpus pages; the default block becomes the\n"
             "                      most pages in 1M)\n"
             "  --codec LIST        codecs of phase 4, comma-separated: none, lossless, int8,\n"
             "                      fp8 (default none; none always runs, the baseline); a codec\n"
             "                      other than none needs --content corpus\n"
             "  --corpus FILE       the corpus (default: tests/data/kvcorpus/kv.bin under the\n"
             "                      current directory or this build's source tree); its page\n"
             "                      shape from manifest.json beside it\n"
             "  --json              one JSON line on stdout instead of the table\n"
             "\n"
             "Needs about 2 x SIZE of memory and 2 x SIZE free in DIR. Progress goes to stderr.\n"
             "Exit status 0 when every phase ran, whether or not the targets were met; 1 when\n"
             "a phase failed or a block of phase 4 was restored wrong.\n");
}

int bench_disk(int argc, char **argv) {
  static const struct option longopts[] = {{"dir", required_argument, 0, 'd'},
                                           {"bytes", required_argument, 0, 'b'},
                                           {"block-bytes", required_argument, 0, 'k'},
                                           {"replay-blocks", required_argument, 0, 'r'},
                                           {"content", required_argument, 0, 't'},
                                           {"codec", required_argument, 0, 'c'},
                                           {"corpus", required_argument, 0, 'C'},
                                           {"json", no_argument, 0, 'j'},
                                           {"help", no_argument, 0, 'h'},
                                           {0, 0, 0, 0}};
  disk_cfg cfg = {.bytes = 1ull << 30, .block_bytes = 1ull << 20, .replay_blocks = 1000000};
  optind = 1;
  int c;
  while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
    bool ok = true;
    long v = 0;
    switch (c) {
    case 'd': cfg.dir = optarg; break;
    case 'b': ok = cli_parse_size(optarg, &cfg.bytes) && cfg.bytes >= (16ull << 20); break;
    case 'k':
      ok = cli_parse_size(optarg, &cfg.block_bytes) && cfg.block_bytes >= 4096 &&
           cfg.block_bytes % 4096 == 0 && cfg.block_bytes <= (256ull << 20);
      cfg.block_set = true;
      break;
    case 't':
      if (strcmp(optarg, "random") && strcmp(optarg, "corpus")) {
        fprintf(stderr, "openinfer bench disk: --content '%s' is not random or corpus\n", optarg);
        return CLI_USAGE;
      }
      cfg.corpus = !strcmp(optarg, "corpus");
      break;
    case 'c':
      if (bench_disk_codec_list(optarg, cfg.codecs) != 0) return CLI_USAGE;
      cfg.codec_set = true;
      break;
    case 'C': cfg.corpus_path = optarg; break;
    case 'r':
      ok = cli_parse_int(optarg, 1000, 100000000, &v);
      cfg.replay_blocks = (uint64_t)v;
      break;
    case 'j': cfg.json = true; break;
    case 'h': usage(stdout); return CLI_OK;
    default: usage(stderr); return CLI_USAGE;
    }
    if (!ok) {
      cli_bad_value("openinfer bench disk", longopts, c, optarg);
      return CLI_USAGE;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "openinfer bench disk: unexpected argument '%s'\n", argv[optind]);
    return CLI_USAGE;
  }
  bench_disk_corpus corpus;
  memset(&corpus, 0, sizeof corpus);
  if (cfg.codec_set && !cfg.corpus)
    for (int k = OI_CODEC_NONE + 1; k < BENCH_DISK_CODECS; k++)
      if (cfg.codecs[k]) {
        fprintf(stderr,
                "openinfer bench disk: --codec %s needs --content corpus (random bytes do not "
                "compress, and hold NaN and infinity patterns that int8 and fp8 refuse)\n",
                oi__codec_name(k));
        return CLI_USAGE;
      }
  if (cfg.corpus_path && !cfg.corpus) {
    fprintf(stderr, "openinfer bench disk: --corpus is for --content corpus\n");
    return CLI_USAGE;
  }
  if (cfg.corpus) {
    if (!cfg.codec_set) cfg.codecs[OI_CODEC_NONE] = true;
    if (bench_disk_corpus_load(cfg.corpus_path, &corpus) != 0) return CLI_FAILED;
    uint64_t page = corpus.page_bytes;
    if (!cfg.block_set) {
      cfg.block_bytes = (1ull << 20) / page * page;
    } else if (cfg.block_bytes % page) {
      fprintf(stderr,
              "openinfer bench disk: --block-bytes %llu is not a whole number of corpus pages "
              "(%llu bytes each, %s); with --content corpus give a multiple of %llu\n",
              (unsigned long long)cfg.block_bytes, (unsigned long long)page, corpus.manifest,
              (unsigned long long)page);
      bench_disk_corpus_free(&corpus);
      return CLI_USAGE;
    }
    if (cfg.block_bytes % 4096 || cfg.block_bytes < page) {
      fprintf(stderr,
              "openinfer bench disk: corpus pages of %llu bytes (%s) make no block of whole "
              "pages that is a multiple of 4K up to 1M; give --block-bytes\n",
              (unsigned long long)page, corpus.manifest);
      bench_disk_corpus_free(&corpus);
      return CLI_USAGE;
    }
  }
  if (cfg.bytes < 4 * cfg.block_bytes) {
    bench_disk_corpus_free(&corpus);
    fprintf(stderr, "openinfer bench disk: --bytes must hold at least 4 blocks\n");
    return CLI_USAGE;
  }
  cfg.bytes = cfg.bytes / cfg.block_bytes * cfg.block_bytes;

  disk_result r;
  memset(&r, 0, sizeof r);
  bool temp = cfg.dir == NULL;
  if (temp) {
    const char *base = getenv("TMPDIR");
    snprintf(r.dir, sizeof r.dir, "%s/openinfer-bench-disk-XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(r.dir)) { /* mkdtemp makes it 0700 */
      perror("openinfer bench disk: mkdtemp");
      bench_disk_corpus_free(&corpus);
      return CLI_FAILED;
    }
  } else {
    snprintf(r.dir, sizeof r.dir, "%s", cfg.dir);
    if (mkdir(r.dir, 0700) != 0 && errno != EEXIST) {
      fprintf(stderr, "openinfer bench disk: mkdir %s: %s\n", r.dir, strerror(errno));
      bench_disk_corpus_free(&corpus);
      return CLI_FAILED;
    }
  }
  int rc = CLI_OK;
  fio_phase(&cfg, r.dir, &r);
  if (!r.fio_ok && !r.fio_note[0]) snprintf(r.fio_note, sizeof r.fio_note, "fio failed");
  bench_disk_codec_row rows[BENCH_DISK_CODECS];
  int nrows = 0;
  if (spill_restore_phase(&cfg, r.dir, &r) != 0 || replay_phase(&cfg, r.dir, &r) != 0 ||
      (cfg.corpus && bench_disk_codec_run(r.dir, cfg.bytes, cfg.block_bytes, &corpus, cfg.codecs,
                                          rows, &nrows) != 0))
    rc = CLI_FAILED;
  if (temp) rmdir(r.dir);
  if (rc == CLI_OK) {
    r.glm_bound_us = glm_bound_us(&r);
    disk_verdicts v = judge(&r);
    if (cfg.json)
      print_json(&cfg, &r, &v, &corpus, rows, nrows);
    else
      print_table(&cfg, &r, &v, &corpus, rows, nrows);
    /* A block restored wrong is a failed run (the rows above say which). */
    for (int i = 0; i < nrows; i++)
      if (rows[i].wrong_blocks) {
        fprintf(stderr, "openinfer bench disk: codec %s: %llu of %llu blocks restored wrong\n",
                oi__codec_name(rows[i].codec), (unsigned long long)rows[i].wrong_blocks,
                (unsigned long long)rows[i].checked_blocks);
        rc = CLI_FAILED;
      }
  }
  bench_disk_corpus_free(&corpus);
  return rc;
}
