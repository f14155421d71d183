/* The disk tier's index recovery (lib/disk): arbitrary bytes as a
 * directory's log and checkpoint, over a data file that holds four real
 * blocks. Opening must never crash; every block the recovered index names
 * is read, and a read that succeeds must return exactly the bytes written
 * under that key (a block whose header or payload checksum does not match
 * is never served). A block written after the replay must not land on a
 * block the index still serves (the rebuilt free list is sound).
 *
 * Input: byte 0 flags (bit 0: recompute every record's checksum, bit 1:
 * the checkpoint header's, so the fuzzer reaches the replay rules past the
 * checksums), bytes 1-2 the checkpoint's length L (little-endian), then L
 * bytes of checkpoint and the rest as the log.
 *
 * With OI_FUZZ_DISK_SEEDS=<dir> in the environment, the first run writes
 * seed inputs made by the store itself into <dir>. */
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "disk/disk.h"
#include "fuzz_util.h"

#define CAP (16u * 4096u) /* eight blocks of one payload sector */
#define GOLDEN 4
#define LEN 3000u

static char dir[256], data_path[300], log_path[300], ckpt_path[300];
static uint8_t golden_data[CAP];
static uint8_t payload[GOLDEN + 1][4096] __attribute__((aligned(4096)));

static oi_tier_key key_of(uint32_t i) {
  oi_tier_key k = {.ns_fp = 7, .layout_fp = 9};
  memset(k.hash, (int)(0x30 + i), sizeof k.hash);
  return k;
}

typedef struct waiter {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int done;
  oi_status st;
} waiter;

static void on_done(void *ctx, oi_status st) {
  waiter *w = ctx;
  pthread_mutex_lock(&w->mu);
  w->st = st;
  w->done = 1;
  pthread_cond_signal(&w->cv);
  pthread_mutex_unlock(&w->mu);
}

static oi_status wait_op(oi_status submitted, waiter *w) {
  if (submitted != OI_OK) return submitted;
  pthread_mutex_lock(&w->mu);
  while (!w->done)
    pthread_cond_wait(&w->cv, &w->mu);
  pthread_mutex_unlock(&w->mu);
  return w->st;
}

#define WAITER                                                                                     \
  { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, OI_ERR_INTERNAL }

static oi_disk *open_store(void) {
  const char *dirs[] = {dir};
  oi_disk_options o = {.dirs = dirs, .num_dirs = 1, .capacity_bytes = CAP, .queue_depth = 4};
  oi_disk *d = NULL;
  oi_status st = oi__disk_open(&o, &d);
  FZ_ASSERT(st == OI_OK, "open: %s", oi_last_error());
  return d;
}

static size_t slurp(const char *path, uint8_t *buf, size_t cap) {
  int fd = open(path, O_RDONLY);
  if (fd < 0) return 0;
  ssize_t n = pread(fd, buf, cap, 0);
  close(fd);
  return n > 0 ? (size_t)n : 0;
}

static void spit(const char *path, const uint8_t *b, size_t n) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  FZ_ASSERT(fd >= 0, "create %s", path);
  FZ_ASSERT(n == 0 || write(fd, b, n) == (ssize_t)n, "write %s", path);
  close(fd);
}

static void write_seed(const char *seeds, const char *name, uint8_t flags, const uint8_t *ckpt,
                       size_t nc, const uint8_t *log, size_t nl) {
  char p[512];
  snprintf(p, sizeof p, "%s/seed-%s", seeds, name);
  uint8_t *b = malloc(3 + nc + nl);
  FZ_ASSERT(b, "oom");
  b[0] = flags;
  b[1] = (uint8_t)nc;
  b[2] = (uint8_t)(nc >> 8);
  memcpy(b + 3, ckpt, nc);
  memcpy(b + 3 + nc, log, nl);
  spit(p, b, 3 + nc + nl);
  free(b);
}

static void cleanup(void) {
  unlink(data_path);
  unlink(log_path);
  unlink(ckpt_path);
  char tmp[320];
  snprintf(tmp, sizeof tmp, "%s.tmp", ckpt_path);
  unlink(tmp);
  rmdir(dir);
}

/* Once: a scratch directory and a data file of four real blocks. */
static void init(void) {
  const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
  snprintf(dir, sizeof dir, "%s/oi-fuzz-disk-%d", base, (int)getpid());
  mkdir(dir, 0700);
  snprintf(data_path, sizeof data_path, "%s/openinfer-disk.data", dir);
  snprintf(log_path, sizeof log_path, "%s/openinfer-disk.log", dir);
  snprintf(ckpt_path, sizeof ckpt_path, "%s/openinfer-disk.ckpt", dir);
  atexit(cleanup);
  oi_set_log_level(OI_LOG_ERROR);
  for (uint32_t i = 0; i <= GOLDEN; i++)
    for (uint32_t j = 0; j < 4096; j++)
      payload[i][j] = j < LEN ? (uint8_t)(i * 77 + j * 13 + (j >> 8)) : 0;
  oi_disk *d = open_store();
  for (uint32_t i = 0; i < GOLDEN; i++) {
    waiter w = WAITER;
    oi_tier_key k = key_of(i);
    FZ_ASSERT(wait_op(oi__disk_write(d, &k, payload[i], LEN, on_done, &w), &w) == OI_OK,
              "golden write: %s", oi_last_error());
  }
  static uint8_t log1[4096], log2[4096], ckpt[4096];
  size_t n1 = slurp(log_path, log1, sizeof log1);
  oi_tier_key k1 = key_of(1);
  FZ_ASSERT(oi__disk_remove(d, &k1) == OI_OK, "remove");
  size_t n2 = slurp(log_path, log2, sizeof log2);
  oi__disk_close(d);
  size_t nc = slurp(ckpt_path, ckpt, sizeof ckpt);
  size_t nh = slurp(log_path, log1 + 2048, 1024); /* the header-only log after close */
  FZ_ASSERT(slurp(data_path, golden_data, CAP) == CAP, "data file");
  const char *seeds = getenv("OI_FUZZ_DISK_SEEDS");
  if (seeds && *seeds) {
    write_seed(seeds, "log-adds", 0, NULL, 0, log1, n1);
    write_seed(seeds, "log-remove", 0, NULL, 0, log2, n2);
    write_seed(seeds, "log-fixup", 1, NULL, 0, log2, n2);
    write_seed(seeds, "ckpt", 0, ckpt, nc, log1 + 2048, nh);
    write_seed(seeds, "ckpt-fixup", 3, ckpt, nc, log2, n2);
    write_seed(seeds, "empty", 0, NULL, 0, NULL, 0);
  }
}

static void fixup(uint8_t *b, size_t n, size_t start) {
  for (size_t off = start; off + OI_DISK_RECORD_BYTES <= n; off += OI_DISK_RECORD_BYTES) {
    uint64_t h = XXH3_64bits(b + off, 72);
    memcpy(b + off + 72, &h, 8);
  }
}

typedef struct listing {
  oi_tier_key keys[64];
  uint64_t lens[64];
  uint32_t n;
} listing;

static void list_one(void *ctx, const oi_tier_key *key, uint64_t len) {
  listing *l = ctx;
  if (l->n < 64) {
    l->keys[l->n] = *key;
    l->lens[l->n++] = len;
  }
}

static int golden_index(const oi_tier_key *k) {
  for (uint32_t i = 0; i <= GOLDEN; i++) {
    oi_tier_key g = key_of(i);
    if (!memcmp(&g, k, sizeof g)) return (int)i;
  }
  return -1;
}

static uint8_t dst[CAP] __attribute__((aligned(4096)));

/* Reads every listed block; checks what is served. Marks served[i]. */
static void read_all(oi_disk *d, const listing *l, int *served) {
  for (uint32_t i = 0; i < l->n; i++) {
    served[i] = 0;
    waiter w = WAITER;
    memset(dst, 0xEE, sizeof dst);
    oi_status st = wait_op(oi__disk_read(d, &l->keys[i], dst, sizeof dst, on_done, &w), &w);
    if (st != OI_OK) continue;
    int g = golden_index(&l->keys[i]);
    FZ_ASSERT(g >= 0, "a block under a key never written was served");
    FZ_ASSERT(l->lens[i] == LEN && !memcmp(dst, payload[g], LEN),
              "block %d was served with bytes that are not its own", g);
    served[i] = 1;
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, init);
  fz f = {data, size, 0};
  uint8_t flags = fz_u8(&f);
  size_t lc = fz_u16(&f);
  size_t rest = size - OI_MIN(size, (size_t)3);
  if (lc > rest) lc = rest;
  uint8_t *ckpt = malloc(lc + 1), *log = malloc(rest - lc + 1);
  FZ_ASSERT(ckpt && log, "oom");
  memcpy(ckpt, data + (size - rest), lc);
  memcpy(log, data + (size - rest) + lc, rest - lc);
  if (flags & 1) {
    fixup(log, rest - lc, 0);
    fixup(ckpt, lc, OI_DISK_CKPT_HEADER_BYTES);
  }
  if ((flags & 2) && lc >= OI_DISK_CKPT_HEADER_BYTES) {
    uint64_t h = XXH3_64bits(ckpt, 56);
    memcpy(ckpt + 56, &h, 8);
  }
  spit(data_path, golden_data, CAP);
  spit(log_path, log, rest - lc);
  if (lc)
    spit(ckpt_path, ckpt, lc);
  else
    unlink(ckpt_path);
  free(ckpt);
  free(log);

  oi_disk *d = open_store();
  oi_disk_stats s;
  oi__disk_stats_get(d, &s);
  FZ_ASSERT(s.bytes_used <= s.capacity_bytes && s.blocks <= CAP / 8192, "%llu bytes in %llu blocks",
            (unsigned long long)s.bytes_used, (unsigned long long)s.blocks);
  listing l = {.n = 0};
  oi__disk_foreach(d, list_one, &l);
  FZ_ASSERT(l.n == s.blocks, "the index lists %u blocks, its stats %llu", l.n,
            (unsigned long long)s.blocks);
  int served[64];
  read_all(d, &l, served);
  /* A new block goes into free room only: everything served before still is. */
  waiter w = WAITER;
  oi_tier_key k = key_of(GOLDEN);
  oi_status st = wait_op(oi__disk_write(d, &k, payload[GOLDEN], LEN, on_done, &w), &w);
  FZ_ASSERT(st == OI_OK, "a write after replay failed: %s", oi_last_error());
  for (uint32_t i = 0; i < l.n; i++) {
    if (!served[i]) continue;
    uint8_t present = 0;
    oi__disk_contains(d, &l.keys[i], 1, &present);
    if (!present) continue; /* evicted for the new block */
    waiter r = WAITER;
    memset(dst, 0xEE, sizeof dst);
    st = wait_op(oi__disk_read(d, &l.keys[i], dst, sizeof dst, on_done, &r), &r);
    FZ_ASSERT(st == OI_OK, "a block served before a write fails after it: %s", oi_last_error());
    FZ_ASSERT(!memcmp(dst, payload[golden_index(&l.keys[i])], LEN), "bytes changed");
  }
  waiter r = WAITER;
  st = wait_op(oi__disk_read(d, &k, dst, sizeof dst, on_done, &r), &r);
  FZ_ASSERT(st == OI_OK && !memcmp(dst, payload[GOLDEN], LEN), "the new block reads back wrong");
  oi__disk_close(d);
  return 0;
}
