/* The disk tier's block store, internal to lib/disk: its types and the
 * functions its files share (disk.c: the formats, the allocator, the index,
 * the logs, the completion thread and the operations; recovery.c:
 * checkpoints, and opening a store: the replay of its checkpoints and logs).
 *
 * Locks: `sq_lock` guards the ring's submission side and the request slots;
 * `lock` guards the index, the allocators, the logs and the counters. A
 * submitter takes sq_lock, then lock inside it; the completion thread takes
 * each alone, never both. */
#ifndef OI_DISK_DISK_INTERNAL_H
#define OI_DISK_DISK_INTERNAL_H

#include <liburing.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>
#include <xxhash.h>

#include "disk/disk.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the disk formats are little-endian; this build writes them natively"
#endif

#define SECTOR ((uint64_t)OI_DISK_SECTOR)
#define ROUND_UP(x) (((x) + SECTOR - 1) & ~(SECTOR - 1))
#define STOP_TAG 1u                 /* user_data of the NOP that ends the completion thread */
#define FULL_PROBE_NS 1000000000ull /* while full: a checkpoint tried at most this often */

enum { ST_WRITING = 1, ST_SEALED = 2 };
enum { REQ_WRITE = 1, REQ_READ = 2 };

typedef struct extent {
  uint64_t off, len;
} extent;

typedef struct dfile {
  char *dir, *data_path, *log_path, *ckpt_path, *ckpt_tmp;
  int lock_fd; /* openinfer-disk.lock, flock()ed while the store is open */
  int data_fd, log_fd;
  bool direct;
  bool data_created; /* the data file was not there at open */
  uint64_t cap;      /* data file bytes */
  extent *free;
  size_t nfree, free_cap;
  uint64_t log_gen, log_size, log_records; /* records since the last checkpoint */
  int ckpt_err; /* errno of the last checkpoint's failed write (0: none) */
} dfile;

typedef struct entry {
  oi_tier_key key;
  uint64_t h;
  uint32_t file;
  uint8_t state;
  bool dead; /* out of the table; freed when the last user ends */
  uint32_t pins, readers;
  uint64_t off, len, seq, payload_xxh;
  struct entry *hnext, *lprev, *lnext;
} entry;

typedef struct req {
  int kind;
  entry *e;
  void *buf;
  uint64_t len; /* bytes of the payload part (rounded) */
  oi_disk_cb cb;
  void *ctx;
  uint8_t *hdr;        /* this slot's 4 KiB header sector */
  struct iovec iov[2]; /* header and payload of a vectored operation */
  uint64_t want;       /* bytes the payload-tagged operation moves */
  int pending, err;
  bool short_io;
  uint64_t t0;
  /* Bumped (release) after the request is filled in, read (acquire) by the
   * completion thread at each completion: the kernel's ring orders the two,
   * but a race detector cannot see through it. */
  _Atomic uint64_t handoff;
  struct req *next_free;
} req;

struct oi_disk {
  oi_disk_options o;
  dfile *files;
  uint32_t nfiles;

  pthread_mutex_t lock;
  entry **tab;
  size_t tab_cap, count;
  entry *lru_head, *lru_tail; /* head: least recently used */
  uint64_t next_seq;
  uint32_t rr;
  bool ckpt_due;
  bool full;              /* the file system is full: writes refused (disk.c, enter_full) */
  uint64_t full_probe_ns; /* while full: the next write after this tries a checkpoint */
  oi_disk_stats st;       /* counters (not the histogram) under lock */
  oi_latency_hist read_hist;

  pthread_mutex_t sq_lock;
  pthread_cond_t slot_cv;
  struct io_uring ring;
  bool ring_ok;
  req *reqs, *free_reqs;
  uint32_t inflight;
  uint8_t *hdr_bufs;
  struct iovec *reg; /* registered ranges: [0] is hdr_bufs */
  uint32_t nreg;
  bool reg_ok, closing;
  bool registering;   /* new operations wait (callbacks: refused) */
  uint64_t fixed_ops; /* operations whose payload was in a registered range */
  pthread_t thread;
  bool thread_ok;
};

/* ---- formats ---- */

static inline void put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static inline uint64_t get64(const uint8_t *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}
static inline void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static inline uint32_t get32(const uint8_t *p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}

static inline void key_put(uint8_t *p, const oi_tier_key *k) {
  put64(p, k->ns_fp);
  memcpy(p + 8, k->hash, 16);
  put64(p + 24, k->layout_fp);
}
static inline void key_get(const uint8_t *p, oi_tier_key *k) {
  k->ns_fp = get64(p);
  memcpy(k->hash, p + 8, 16);
  k->layout_fp = get64(p + 24);
}
static inline bool key_eq(const oi_tier_key *a, const oi_tier_key *b) {
  return a->ns_fp == b->ns_fp && a->layout_fp == b->layout_fp && !memcmp(a->hash, b->hash, 16);
}
static inline uint64_t key_hash(const oi_tier_key *k) {
  uint8_t b[32];
  key_put(b, k);
  return XXH3_64bits(b, sizeof b);
}

static inline uint64_t entry_bytes(const entry *e) { return SECTOR + ROUND_UP(e->len); }

/* ---- disk.c: the allocator, the index, the logs, the completion thread */
void oi__disk_ext_free(dfile *f, uint64_t off, uint64_t len);
entry *oi__disk_tab_find_h(oi_disk *d, const oi_tier_key *k, uint64_t h);
bool oi__disk_tab_reserve(oi_disk *d, size_t want);
void oi__disk_tab_insert(oi_disk *d, entry *e);
void oi__disk_tab_unlink(oi_disk *d, entry *e);
void oi__disk_lru_unlink(oi_disk *d, entry *e);
void oi__disk_lru_push(oi_disk *d, entry *e);
ssize_t oi__disk_log_pwrite(int fd, const void *b, size_t n, off_t off);
/* Appends a record; false when it did not land (logged; the full state
 * entered when the file system has no room). */
bool oi__disk_log_append(oi_disk *d, uint32_t file, const oi_disk_record *r);
/* Enters the full state (under lock): one log line, counted. */
void oi__disk_enter_full(oi_disk *d, const char *what, int err);
/* Whether a failed write to dir's file system was for want of room:
 * ENOSPC/EDQUOT, or a short write (err 0) with no block free there. */
bool oi__disk_no_room(const char *dir, int err);
void *oi__disk_completion_main(void *arg);

/* ---- recovery.c: checkpoints */
int oi__disk_sync_file(int fd, bool data_only);
oi_status oi__disk_log_reset(dfile *f, uint64_t gen);
oi_status oi__disk_checkpoint_all(oi_disk *d);

#endif /* OI_DISK_DISK_INTERNAL_H */
