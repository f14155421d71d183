/* Shared by the disk-tier tests: scratch directories, keys, payloads whose
 * bytes follow from their key, and synchronous waits on the store's
 * callbacks. */
#ifndef OI_TEST_DISK_UTIL_H
#define OI_TEST_DISK_UTIL_H

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "disk/disk.h"
#include "rig.h"
#include "testutil.h"

#define KiB 1024ull
#define MiB (1024ull * KiB)

/* A fresh 0700 directory under TMPDIR (or /tmp). */
static inline char *dt_mkdtemp(void) {
  const char *base = getenv("TMPDIR");
  char tmpl[512];
  snprintf(tmpl, sizeof tmpl, "%s/oi-disk-XXXXXX", base && *base ? base : "/tmp");
  char *p = mkdtemp(tmpl);
  REQUIRE(p);
  char *dir = strdup(p);
  REQUIRE(dir);
  return dir;
}

/* Removes a scratch directory and the files in it (one level). */
static inline void dt_rmtree(char *dir) {
  tu_remove_dir(dir);
  free(dir);
}

static inline oi_tier_key dt_key(uint64_t i) {
  oi_tier_key k = {.ns_fp = 0x5eed0000u + (i % 3), .layout_fp = 0xabcdef};
  for (int b = 0; b < 16; b++)
    k.hash[b] = (uint8_t)(i >> (8 * (b % 8))) ^ (uint8_t)(b * 29);
  return k;
}

/* The payload length of key i: varied, from 1 byte to about 40 KiB. */
static inline uint64_t dt_len(uint64_t i) {
  static const uint64_t sizes[] = {1, 100, 4095, 4096, 4097, 8192, 12345, 16384, 40000, 777};
  return sizes[i % 10];
}

static inline uint8_t dt_byte(uint64_t i, uint64_t j) {
  uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ (j * 0xBF58476D1CE4E5B9ull);
  return (uint8_t)(x >> 29);
}

/* A 4 KiB-aligned buffer of round_up(len) bytes: key i's payload, then zeros. */
static inline uint8_t *dt_payload(uint64_t i, uint64_t len) {
  uint64_t cap = (len + 4095) & ~4095ull;
  uint8_t *p = aligned_alloc(4096, cap);
  REQUIRE(p);
  memset(p, 0, cap);
  for (uint64_t j = 0; j < len; j++)
    p[j] = dt_byte(i, j);
  return p;
}

/* Does buf hold key i's payload of `len` bytes? */
static inline int dt_check(const uint8_t *buf, uint64_t i, uint64_t len) {
  for (uint64_t j = 0; j < len; j++)
    if (buf[j] != dt_byte(i, j)) return 0;
  return 1;
}

/* One operation's callback, waited for. */
typedef struct dt_wait {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int done;
  oi_status st;
  char msg[256]; /* the callback thread's last error, on failure */
} dt_wait;

static inline void dt_wait_init(dt_wait *w) {
  pthread_mutex_init(&w->mu, NULL);
  pthread_cond_init(&w->cv, NULL);
  w->done = 0;
  w->st = OI_ERR_INTERNAL;
  w->msg[0] = 0;
}

static inline void dt_cb(void *ctx, oi_status st) {
  dt_wait *w = ctx;
  pthread_mutex_lock(&w->mu);
  w->st = st;
  if (st != OI_OK) snprintf(w->msg, sizeof w->msg, "%s", oi_last_error());
  w->done++;
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
}

static inline int dt_wait_finished(dt_wait *w) {
  pthread_mutex_lock(&w->mu);
  int done = w->done;
  pthread_mutex_unlock(&w->mu);
  return done;
}

static inline oi_status dt_wait_done(dt_wait *w) {
  pthread_mutex_lock(&w->mu);
  while (!w->done)
    pthread_cond_wait(&w->cv, &w->mu);
  oi_status st = w->st;
  pthread_mutex_unlock(&w->mu);
  pthread_mutex_destroy(&w->mu);
  pthread_cond_destroy(&w->cv);
  return st;
}

/* Writes key i (its own payload of dt_len(i) or `len` bytes) and waits. */
static inline oi_status dt_write_len(oi_disk *d, uint64_t i, uint64_t len) {
  uint8_t *p = dt_payload(i, len);
  oi_tier_key k = dt_key(i);
  dt_wait w;
  dt_wait_init(&w);
  oi_status st = oi__disk_write(d, &k, p, len, dt_cb, &w);
  if (st == OI_OK) st = dt_wait_done(&w);
  free(p);
  return st;
}
static inline oi_status dt_write(oi_disk *d, uint64_t i) { return dt_write_len(d, i, dt_len(i)); }

/* Reads key i back and checks every byte against its payload of `len`
 * (OI_ERR_INTERNAL when the bytes differ). */
static inline oi_status dt_read_len(oi_disk *d, uint64_t i, uint64_t len) {
  uint64_t cap = ((len + 4095) & ~4095ull) + 4096;
  uint8_t *p = aligned_alloc(4096, cap);
  REQUIRE(p);
  memset(p, 0xEE, cap);
  oi_tier_key k = dt_key(i);
  dt_wait w;
  dt_wait_init(&w);
  oi_status st = oi__disk_read(d, &k, p, cap, dt_cb, &w);
  if (st == OI_OK) st = dt_wait_done(&w);
  if (st == OI_OK && !dt_check(p, i, len)) {
    fprintf(stderr, "key %llu: bytes differ after a successful read\n", (unsigned long long)i);
    st = OI_ERR_INTERNAL;
  }
  free(p);
  return st;
}
static inline oi_status dt_read(oi_disk *d, uint64_t i) { return dt_read_len(d, i, dt_len(i)); }

static inline int dt_has(oi_disk *d, uint64_t i) {
  oi_tier_key k = dt_key(i);
  uint8_t present = 9;
  oi__disk_contains(d, &k, 1, &present);
  return present;
}

static inline oi_disk *dt_open(const char *const *dirs, uint32_t n, uint64_t cap,
                               uint32_t ckpt_every) {
  oi_disk_options o = {
      .dirs = dirs, .num_dirs = n, .capacity_bytes = cap, .checkpoint_every = ckpt_every};
  oi_disk *d = NULL;
  oi_status st = oi__disk_open(&o, &d);
  if (st != OI_OK) fprintf(stderr, "disk_open: %s: %s\n", oi_status_str(st), oi_last_error());
  REQUIRE(st == OI_OK && d);
  return d;
}

static inline oi_disk_stats dt_stats(oi_disk *d) {
  oi_disk_stats s;
  oi__disk_stats_get(d, &s);
  return s;
}

static inline char *dt_path(const char *dir, const char *name) {
  char *p = malloc(strlen(dir) + strlen(name) + 2);
  REQUIRE(p);
  sprintf(p, "%s/%s", dir, name);
  return p;
}

/* A whole file's bytes (malloc'ed, one spare byte after them) and their
 * count in *n. */
static inline uint8_t *dt_slurp(const char *path, size_t *n) {
  int fd = open(path, O_RDONLY);
  REQUIRE(fd >= 0);
  struct stat sb;
  REQUIRE(fstat(fd, &sb) == 0);
  *n = (size_t)sb.st_size;
  uint8_t *b = malloc(*n + 1);
  REQUIRE(b && pread(fd, b, *n, 0) == (ssize_t)*n);
  close(fd);
  return b;
}

/* Makes `path` hold exactly b[0..n). */
static inline void dt_spit(const char *path, const uint8_t *b, size_t n) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  REQUIRE(fd >= 0 && write(fd, b, n) == (ssize_t)n);
  close(fd);
}

/* The size of `path`, -1 when it is not there. */
static inline off_t dt_file_size(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0 ? sb.st_size : -1;
}

#endif
