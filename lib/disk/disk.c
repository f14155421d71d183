/* The disk tier's block store: see disk.h and docs/disk.md.
 *
 * Locks: `sq_lock` guards the ring's submission side and the request slots;
 * `lock` guards the index, the allocators, the logs and the counters. A
 * submitter takes sq_lock, then lock inside it; the completion thread takes
 * each alone, never both. */
#include "disk/disk.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "core/fault.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the disk formats are little-endian; this build writes them natively"
#endif

#define SECTOR ((uint64_t)OI_DISK_SECTOR)
#define ROUND_UP(x) (((x) + SECTOR - 1) & ~(SECTOR - 1))
#define STOP_TAG 1u /* user_data of the NOP that ends the completion thread */

enum { ST_WRITING = 1, ST_SEALED = 2 };
enum { REQ_WRITE = 1, REQ_READ = 2 };

typedef struct extent {
  uint64_t off, len;
} extent;

typedef struct dfile {
  char *dir, *data_path, *log_path, *ckpt_path, *ckpt_tmp;
  int data_fd, log_fd;
  bool direct;
  uint64_t cap; /* data file bytes */
  extent *free;
  size_t nfree, free_cap;
  uint64_t log_gen, log_size, log_records; /* records since the last checkpoint */
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
  oi_disk_stats st; /* counters (not the histogram) under lock */
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

static void put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static uint64_t get64(const uint8_t *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}
static void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static uint32_t get32(const uint8_t *p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}

static void key_put(uint8_t *p, const oi_tier_key *k) {
  put64(p, k->ns_fp);
  memcpy(p + 8, k->hash, 16);
  put64(p + 24, k->layout_fp);
}
static void key_get(const uint8_t *p, oi_tier_key *k) {
  k->ns_fp = get64(p);
  memcpy(k->hash, p + 8, 16);
  k->layout_fp = get64(p + 24);
}
static bool key_eq(const oi_tier_key *a, const oi_tier_key *b) {
  return a->ns_fp == b->ns_fp && a->layout_fp == b->layout_fp && !memcmp(a->hash, b->hash, 16);
}
static uint64_t key_hash(const oi_tier_key *k) {
  uint8_t b[32];
  key_put(b, k);
  return XXH3_64bits(b, sizeof b);
}

void oi__disk_record_encode(const oi_disk_record *r, uint8_t out[OI_DISK_RECORD_BYTES]) {
  memset(out, 0, OI_DISK_RECORD_BYTES);
  put32(out, OI_DISK_RECORD_MAGIC);
  out[4] = (uint8_t)r->type;
  key_put(out + 8, &r->key);
  put64(out + 40, r->seq);
  put64(out + 48, r->offset);
  put64(out + 56, r->length);
  put64(out + 64, r->payload_xxh);
  put64(out + 72, XXH3_64bits(out, 72));
}

bool oi__disk_record_decode(const uint8_t in[OI_DISK_RECORD_BYTES], oi_disk_record *r) {
  if (get32(in) != OI_DISK_RECORD_MAGIC) return false;
  if (in[5] || in[6] || in[7]) return false;
  if (in[4] < OI_DISK_REC_HEADER || in[4] > OI_DISK_REC_REMOVE) return false;
  if (get64(in + 72) != XXH3_64bits(in, 72)) return false;
  r->type = in[4];
  key_get(in + 8, &r->key);
  r->seq = get64(in + 40);
  r->offset = get64(in + 48);
  r->length = get64(in + 56);
  r->payload_xxh = get64(in + 64);
  return true;
}

/* The block header sector (docs/disk.md). */
static void header_encode(uint8_t *h, const entry *e) {
  memset(h, 0, SECTOR);
  put64(h, OI_DISK_BLOCK_MAGIC);
  put32(h + 8, OI_DISK_VERSION);
  key_put(h + 16, &e->key);
  put64(h + 48, e->len);
  put64(h + 56, e->payload_xxh);
  put64(h + 64, e->seq);
  put64(h + 72, XXH3_64bits(h, 72));
}

/* Does the sector read back describe exactly the block `e`? */
static bool header_matches(const uint8_t *h, const entry *e) {
  if (get64(h) != OI_DISK_BLOCK_MAGIC || get32(h + 8) != OI_DISK_VERSION) return false;
  if (get64(h + 72) != XXH3_64bits(h, 72)) return false;
  oi_tier_key k;
  key_get(h + 16, &k);
  return key_eq(&k, &e->key) && get64(h + 48) == e->len && get64(h + 56) == e->payload_xxh &&
         get64(h + 64) == e->seq;
}

/* ---- the free-extent allocator (first fit over a list sorted by offset) ---- */

static bool ext_alloc(dfile *f, uint64_t len, uint64_t *off) {
  for (size_t i = 0; i < f->nfree; i++) {
    if (f->free[i].len < len) continue;
    *off = f->free[i].off;
    f->free[i].off += len;
    f->free[i].len -= len;
    if (!f->free[i].len) {
      memmove(&f->free[i], &f->free[i + 1], (f->nfree - i - 1) * sizeof(extent));
      f->nfree--;
    }
    return true;
  }
  return false;
}

/* Returns [off, off+len) to the list, merging with its neighbours. */
static void ext_free(dfile *f, uint64_t off, uint64_t len) {
  size_t lo = 0, hi = f->nfree;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (f->free[mid].off < off)
      lo = mid + 1;
    else
      hi = mid;
  }
  bool left = lo > 0 && f->free[lo - 1].off + f->free[lo - 1].len == off;
  bool right = lo < f->nfree && off + len == f->free[lo].off;
  if (left && right) {
    f->free[lo - 1].len += len + f->free[lo].len;
    memmove(&f->free[lo], &f->free[lo + 1], (f->nfree - lo - 1) * sizeof(extent));
    f->nfree--;
  } else if (left) {
    f->free[lo - 1].len += len;
  } else if (right) {
    f->free[lo].off = off;
    f->free[lo].len += len;
  } else {
    if (!oi__grow((void **)&f->free, &f->free_cap, f->nfree + 1, sizeof(extent), SIZE_MAX / 64))
      oi__fatal("disk: out of memory for the free-extent list");
    memmove(&f->free[lo + 1], &f->free[lo], (f->nfree - lo) * sizeof(extent));
    f->free[lo] = (extent){off, len};
    f->nfree++;
  }
}

static uint64_t entry_bytes(const entry *e) { return SECTOR + ROUND_UP(e->len); }

/* ---- the index (under lock) ---- */

static entry *tab_find_h(oi_disk *d, const oi_tier_key *k, uint64_t h) {
  for (entry *e = d->tab[h & (d->tab_cap - 1)]; e; e = e->hnext)
    if (e->h == h && key_eq(&e->key, k)) return e;
  return NULL;
}

static entry *tab_find(oi_disk *d, const oi_tier_key *k) { return tab_find_h(d, k, key_hash(k)); }

/* Grows the table to the first power of two that holds `want` entries at
 * one per bucket (a no-op when it already does); false when there is no
 * memory for it (the table is unchanged). */
static bool tab_reserve(oi_disk *d, size_t want) {
  size_t ncap = d->tab_cap;
  while (ncap < want && ncap <= SIZE_MAX / 2 / sizeof(entry *))
    ncap *= 2;
  if (ncap == d->tab_cap) return true;
  entry **nt = oi__calloc(ncap, sizeof(entry *));
  if (!nt) return false;
  for (size_t i = 0; i < d->tab_cap; i++)
    for (entry *x = d->tab[i], *next; x; x = next) {
      next = x->hnext;
      x->hnext = nt[x->h & (ncap - 1)];
      nt[x->h & (ncap - 1)] = x;
    }
  oi__free(d->tab);
  d->tab = nt;
  d->tab_cap = ncap;
  return true;
}

static void tab_insert(oi_disk *d, entry *e) {
  if (d->count + 1 > d->tab_cap && !tab_reserve(d, d->count + 1))
    oi__fatal("disk: out of memory for the index");
  entry **b = &d->tab[e->h & (d->tab_cap - 1)];
  e->hnext = *b;
  *b = e;
  d->count++;
}

static void tab_unlink(oi_disk *d, entry *e) {
  for (entry **p = &d->tab[e->h & (d->tab_cap - 1)]; *p; p = &(*p)->hnext)
    if (*p == e) {
      *p = e->hnext;
      d->count--;
      return;
    }
}

static void lru_unlink(oi_disk *d, entry *e) {
  if (e->lprev)
    e->lprev->lnext = e->lnext;
  else if (d->lru_head == e)
    d->lru_head = e->lnext;
  if (e->lnext)
    e->lnext->lprev = e->lprev;
  else if (d->lru_tail == e)
    d->lru_tail = e->lprev;
  e->lprev = e->lnext = NULL;
}

static void lru_push(oi_disk *d, entry *e) { /* most recently used end */
  e->lnext = NULL;
  e->lprev = d->lru_tail;
  if (d->lru_tail)
    d->lru_tail->lnext = e;
  else
    d->lru_head = e;
  d->lru_tail = e;
}

/* ---- the logs (under lock) ---- */

static oi_status log_reset(dfile *f, uint64_t gen);

/* pwrite to a log; the disk_log_write fault writes `param` bytes of it
 * (0: none, EIO). */
static ssize_t log_pwrite(int fd, const void *b, size_t n, off_t off) {
  uint64_t cut = 0;
  if (OI_FAULT(OI_FAULT_DISK_LOG_WRITE, &cut)) {
    if (!cut) {
      errno = EIO;
      return -1;
    }
    n = OI_MIN((size_t)cut, n);
  }
  return pwrite(fd, b, n, off);
}

static void log_append(oi_disk *d, uint32_t file, const oi_disk_record *r) {
  dfile *f = &d->files[file];
  if (f->log_size == 0 && log_reset(f, f->log_gen) != OI_OK) { /* its header did not land */
    OI_LOG(OI_LOG_WARN, "disk", "%s", oi_last_error());
    d->ckpt_due = true;
    return;
  }
  uint8_t b[OI_DISK_RECORD_BYTES];
  oi__disk_record_encode(r, b);
  ssize_t n = log_pwrite(f->log_fd, b, sizeof b, (off_t)f->log_size);
  if (n != (ssize_t)sizeof b) {
    /* The block stays served until a restart; the next checkpoint records it. */
    OI_LOG(OI_LOG_WARN, "disk", "appending to %s failed: %s", f->log_path,
           n < 0 ? strerror(errno) : "short write");
    if (n > 0 && ftruncate(f->log_fd, (off_t)f->log_size) != 0) /* keep whole records */
      OI_LOG(OI_LOG_WARN, "disk", "truncating %s failed: %s", f->log_path, strerror(errno));
    d->ckpt_due = true;
    return;
  }
  f->log_size += sizeof b;
  if (++f->log_records >= d->o.checkpoint_every) d->ckpt_due = true;
}

static void log_remove(oi_disk *d, const entry *e) {
  oi_disk_record r = {.type = OI_DISK_REC_REMOVE, .key = e->key, .seq = d->next_seq++};
  log_append(d, e->file, &r);
}

/* Takes a sealed entry out of the index (table and LRU). Its extent is
 * freed now when no read holds it, else by the last reader. */
static void entry_drop(oi_disk *d, entry *e, bool log) {
  tab_unlink(d, e);
  if (e->state == ST_SEALED) {
    lru_unlink(d, e);
    d->st.blocks--;
    d->st.bytes_used -= entry_bytes(e);
    if (log) log_remove(d, e);
  }
  e->dead = true;
  if (!e->readers && e->state == ST_SEALED) {
    ext_free(&d->files[e->file], e->off, entry_bytes(e));
    oi__free(e);
  }
}

/* ---- checkpoints (under lock) ---- */

/* fdatasync (data_only) or fsync of one of the store's files; the
 * disk_sync fault fails it with its errno. */
static int sync_file(int fd, bool data_only) {
  uint64_t err = 0;
  if (OI_FAULT(OI_FAULT_DISK_SYNC, &err)) {
    errno = err ? (int)err : EIO;
    return -1;
  }
  return data_only ? fdatasync(fd) : fsync(fd);
}

static oi_status fsync_dir(const char *dir) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return oi__fail(OI_ERR_IO, "disk: open %s: %s", dir, strerror(errno));
  int rc = sync_file(fd, false);
  close(fd);
  return rc ? oi__fail(OI_ERR_IO, "disk: fsync %s: %s", dir, strerror(errno)) : OI_OK;
}

static oi_status write_all(int fd, const void *buf, size_t n, off_t off) {
  const uint8_t *p = buf;
  while (n) {
    ssize_t w = pwrite(fd, p, n, off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return OI_ERR_IO;
    p += w;
    n -= (size_t)w;
    off += w;
  }
  return OI_OK;
}

/* Starts a fresh log of generation `gen` (a HEADER record only). */
static oi_status log_reset(dfile *f, uint64_t gen) {
  uint8_t b[OI_DISK_RECORD_BYTES];
  oi_disk_record r = {.type = OI_DISK_REC_HEADER, .seq = gen};
  oi__disk_record_encode(&r, b);
  if (ftruncate(f->log_fd, 0) != 0)
    return oi__fail(OI_ERR_IO, "disk: resetting %s: %s", f->log_path, strerror(errno));
  /* Emptied, the file is of generation `gen` whatever fails next: appends
   * follow what it holds (log_append writes a header that did not land). */
  f->log_gen = gen;
  f->log_size = 0;
  f->log_records = 0;
  ssize_t w = log_pwrite(f->log_fd, b, sizeof b, 0);
  if (w != (ssize_t)sizeof b)
    return oi__fail(OI_ERR_IO, "disk: resetting %s: %s", f->log_path,
                    w < 0 ? strerror(errno) : "short write");
  f->log_size = sizeof b;
  if (sync_file(f->log_fd, true) != 0)
    return oi__fail(OI_ERR_IO, "disk: resetting %s: %s", f->log_path, strerror(errno));
  return OI_OK;
}

static oi_status checkpoint_file(oi_disk *d, uint32_t fi) {
  dfile *f = &d->files[fi];
  /* The blocks the checkpoint names are durable before it is. */
  if (sync_file(f->data_fd, true) != 0)
    return oi__fail(OI_ERR_IO, "disk: fdatasync %s: %s", f->data_path, strerror(errno));
  size_t n = 0;
  for (entry *e = d->lru_head; e; e = e->lnext)
    if (e->file == fi) n++;
  size_t bytes = OI_DISK_CKPT_HEADER_BYTES + n * OI_DISK_RECORD_BYTES;
  uint8_t *buf = oi__calloc(1, bytes);
  if (!buf) return oi__fail(OI_ERR_OUT_OF_MEMORY, "disk: checkpoint of %zu blocks", n);
  uint64_t gen = f->log_gen + 1;
  put64(buf, OI_DISK_CKPT_MAGIC);
  put32(buf + 8, OI_DISK_VERSION);
  put64(buf + 16, n);
  put64(buf + 24, gen);
  put64(buf + 32, f->cap);
  put64(buf + 40, d->next_seq);
  put64(buf + 56, XXH3_64bits(buf, 56));
  size_t i = 0;
  for (entry *e = d->lru_head; e; e = e->lnext) /* LRU order, oldest first */
    if (e->file == fi) {
      oi_disk_record r = {.type = OI_DISK_REC_ADD,
                          .key = e->key,
                          .seq = e->seq,
                          .offset = e->off,
                          .length = e->len,
                          .payload_xxh = e->payload_xxh};
      oi__disk_record_encode(&r, buf + OI_DISK_CKPT_HEADER_BYTES + i++ * OI_DISK_RECORD_BYTES);
    }
  oi_status st = OI_OK;
  bool renamed = false;
  int fd = open(f->ckpt_tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    st = oi__fail(OI_ERR_IO, "disk: create %s: %s", f->ckpt_tmp, strerror(errno));
  } else {
    if (write_all(fd, buf, bytes, 0) != OI_OK || sync_file(fd, false) != 0)
      st = oi__fail(OI_ERR_IO, "disk: write %s: %s", f->ckpt_tmp, strerror(errno));
    close(fd);
    if (st == OI_OK && rename(f->ckpt_tmp, f->ckpt_path) != 0)
      st = oi__fail(OI_ERR_IO, "disk: rename to %s: %s", f->ckpt_path, strerror(errno));
    else if (st == OI_OK)
      renamed = true;
    if (st == OI_OK) st = fsync_dir(f->dir);
  }
  oi__free(buf);
  /* A crash from here until the reset leaves a log of the old generation,
   * which the next open skips: the checkpoint holds its records. Once
   * renamed, the checkpoint is the one the next open reads even when its
   * directory's fsync failed: the log starts its generation, or the records
   * appended from now on would be skipped as older than it. */
  if (renamed) {
    oi_status rs = log_reset(f, gen);
    if (st == OI_OK) st = rs;
  }
  return st;
}

static oi_status checkpoint_all(oi_disk *d) {
  oi_status st = OI_OK;
  for (uint32_t i = 0; i < d->nfiles; i++) {
    oi_status s = checkpoint_file(d, i);
    if (s != OI_OK) {
      OI_LOG(OI_LOG_WARN, "disk", "checkpoint of %s failed: %s", d->files[i].dir, oi_last_error());
      st = s;
    }
  }
  d->ckpt_due = false;
  d->st.checkpoints++;
  return st;
}

/* ---- the completion thread ---- */

static void req_release(oi_disk *d, req *r) {
  pthread_mutex_lock(&d->sq_lock);
  r->next_free = d->free_reqs;
  d->free_reqs = r;
  d->inflight--;
  pthread_cond_broadcast(&d->slot_cv);
  pthread_mutex_unlock(&d->sq_lock);
}

/* The end of a finished request (d->lock held, dropped here): a checkpoint
 * when one is due, then the request's slot back and its callback. */
static void end_req(oi_disk *d, req *r, oi_status st) {
  if (d->ckpt_due && !d->closing) checkpoint_all(d);
  pthread_mutex_unlock(&d->lock);
  oi_disk_cb cb = r->cb;
  void *ctx = r->ctx;
  req_release(d, r);
  if (cb) cb(ctx, st);
}

static bool transient(int err) { return err == EAGAIN || err == EINTR || err == ECANCELED; }

static void finish_write(oi_disk *d, req *r) {
  entry *e = r->e;
  oi_status st = OI_OK;
  if (r->err || r->short_io)
    st = oi__fail(OI_ERR_IO, "disk: writing a block to %s: %s", d->files[e->file].data_path,
                  r->err ? strerror(r->err) : "short write");
  pthread_mutex_lock(&d->lock);
  if (st == OI_OK) {
    d->st.spills_ok++;
    if (e->dead) { /* removed while it was written */
      ext_free(&d->files[e->file], e->off, entry_bytes(e));
      oi__free(e);
    } else {
      e->state = ST_SEALED;
      lru_push(d, e);
      d->st.blocks++;
      d->st.bytes_used += entry_bytes(e);
      oi_disk_record rec = {.type = OI_DISK_REC_ADD,
                            .key = e->key,
                            .seq = e->seq,
                            .offset = e->off,
                            .length = e->len,
                            .payload_xxh = e->payload_xxh};
      log_append(d, e->file, &rec);
    }
  } else {
    d->st.spills_failed++;
    if (!e->dead) tab_unlink(d, e);
    ext_free(&d->files[e->file], e->off, entry_bytes(e));
    oi__free(e);
  }
  end_req(d, r, st);
}

static void finish_read(oi_disk *d, req *r) {
  entry *e = r->e; /* alive: this read holds it */
  oi_status st = OI_OK;
  bool drop = false;
  bool corrupt = false;
  if (r->err || r->short_io) {
    st = oi__fail(OI_ERR_IO, "disk: reading a block from %s: %s", d->files[e->file].data_path,
                  r->err ? strerror(r->err) : "short read");
    drop = !(r->err && transient(r->err));
  } else if (!header_matches(r->hdr, e)) {
    corrupt = drop = true;
    st = oi__fail(OI_ERR_IO,
                  "disk: block header at %s+%llu does not verify (checksum, key or "
                  "length): the block is dropped",
                  d->files[e->file].data_path, (unsigned long long)e->off);
  } else if (XXH3_64bits(r->buf, e->len) != e->payload_xxh) {
    corrupt = drop = true;
    st = oi__fail(OI_ERR_IO,
                  "disk: block payload at %s+%llu fails its checksum: the block is "
                  "dropped",
                  d->files[e->file].data_path, (unsigned long long)e->off);
  }
  if (corrupt) OI_LOG(OI_LOG_WARN, "disk", "%s", oi_last_error());
  oi__hist_record(&d->read_hist, oi__now_ns() - r->t0);
  pthread_mutex_lock(&d->lock);
  if (st == OI_OK)
    d->st.reads_ok++;
  else
    d->st.reads_failed++;
  if (corrupt) d->st.checksum_failures++;
  e->readers--;
  if (!e->dead) {
    if (drop) {
      entry_drop(d, e, true);
    } else if (st == OI_OK) {
      lru_unlink(d, e);
      lru_push(d, e);
    }
  } else if (!e->readers) {
    ext_free(&d->files[e->file], e->off, entry_bytes(e));
    oi__free(e);
  }
  end_req(d, r, st);
}

static _Thread_local oi_disk *tl_completing;

/* The store whose completion thread this is (NULL on other threads). */
static void *completion_main(void *arg) {
  oi_disk *d = arg;
  tl_completing = d;
  for (;;) {
    struct io_uring_cqe *cqe;
    int rc = io_uring_wait_cqe(&d->ring, &cqe);
    if (rc == -EINTR) continue;
    if (rc < 0) oi__fatal("disk: io_uring_wait_cqe: %s", strerror(-rc));
    uint64_t tag = cqe->user_data;
    int res = cqe->res;
    io_uring_cqe_seen(&d->ring, cqe);
    if (tag == STOP_TAG) break;
    req *r = (req *)(uintptr_t)(tag & ~(uint64_t)1);
    (void)atomic_load_explicit(&r->handoff, memory_order_acquire);
    bool payload = tag & 1;
    uint64_t want = payload ? r->want : SECTOR;
    uint64_t param = 0;
    if (payload && r->kind == REQ_WRITE && OI_FAULT(OI_FAULT_DISK_WRITE, &param))
      res = -(param ? (int)param : EIO);
    if (payload && r->kind == REQ_READ && OI_FAULT(OI_FAULT_DISK_READ, &param))
      res = -(param ? (int)param : EIO);
    if (payload && r->kind == REQ_READ && res > 0 && OI_FAULT(OI_FAULT_DISK_SHORT_READ, NULL))
      res /= 2;
    if (payload && r->kind == REQ_WRITE && res > 0 && OI_FAULT(OI_FAULT_DISK_SHORT_WRITE, NULL))
      res /= 2;
    if (res < 0) {
      if (!r->err) r->err = -res;
    } else if ((uint64_t)res != want) {
      r->short_io = true;
    }
    if (--r->pending) continue;
    if ((r->kind == REQ_READ && OI_FAULT(OI_FAULT_DISK_READ_SLOW, &param)) ||
        (r->kind == REQ_WRITE && OI_FAULT(OI_FAULT_DISK_WRITE_SLOW, &param))) {
      struct timespec ts = {(time_t)(param / 1000), (long)(param % 1000) * 1000000L};
      nanosleep(&ts, NULL);
    }
    if (r->kind == REQ_WRITE)
      finish_write(d, r);
    else
      finish_read(d, r);
  }
  return NULL;
}

/* ---- submission ---- */

/* Fixed-buffer index of [p, p+len) when it lies inside a registered range,
 * else -1. (Under sq_lock.) */
static int fixed_index(oi_disk *d, const void *p, uint64_t len) {
  if (!d->reg_ok) return -1;
  uintptr_t a = (uintptr_t)p;
  for (uint32_t i = 0; i < d->nreg; i++) {
    uintptr_t b = (uintptr_t)d->reg[i].iov_base;
    if (a >= b && len <= d->reg[i].iov_len && a - b <= d->reg[i].iov_len - len) return (int)i;
  }
  return -1;
}

static void prep(oi_disk *d, bool write, int fd, void *buf, uint64_t len, uint64_t off,
                 uint64_t tag) {
  struct io_uring_sqe *sqe = io_uring_get_sqe(&d->ring);
  if (!sqe) oi__fatal("disk: submission queue full"); /* slots bound the SQEs */
  int idx = fixed_index(d, buf, len);
  if (idx >= 0 && write)
    io_uring_prep_write_fixed(sqe, fd, buf, (unsigned)len, off, idx);
  else if (idx >= 0)
    io_uring_prep_read_fixed(sqe, fd, buf, (unsigned)len, off, idx);
  else if (write)
    io_uring_prep_write(sqe, fd, buf, (unsigned)len, off);
  else
    io_uring_prep_read(sqe, fd, buf, (unsigned)len, off);
  io_uring_sqe_set_data64(sqe, tag);
}

static void submit_req(oi_disk *d, req *r) {
  entry *e = r->e;
  dfile *f = &d->files[e->file];
  bool w = r->kind == REQ_WRITE;
  r->err = 0;
  r->short_io = false;
  r->t0 = oi__now_ns();
  if (fixed_index(d, r->buf, r->len) >= 0) {
    /* a registered payload: two fixed-buffer operations */
    d->fixed_ops++;
    r->pending = 2;
    r->want = r->len;
    prep(d, w, f->data_fd, r->hdr, SECTOR, e->off, (uint64_t)(uintptr_t)r);
    prep(d, w, f->data_fd, r->buf, r->len, e->off + SECTOR, (uint64_t)(uintptr_t)r | 1);
  } else {
    /* otherwise one vectored operation moves the header and the payload */
    r->pending = 1;
    r->want = SECTOR + r->len;
    r->iov[0] = (struct iovec){r->hdr, SECTOR};
    r->iov[1] = (struct iovec){r->buf, r->len};
    struct io_uring_sqe *sqe = io_uring_get_sqe(&d->ring);
    if (!sqe) oi__fatal("disk: submission queue full");
    if (w)
      io_uring_prep_writev(sqe, f->data_fd, r->iov, 2, e->off);
    else
      io_uring_prep_readv(sqe, f->data_fd, r->iov, 2, e->off);
    io_uring_sqe_set_data64(sqe, (uint64_t)(uintptr_t)r | 1);
  }
  atomic_fetch_add_explicit(&r->handoff, 1, memory_order_release);
  int rc;
  while ((rc = io_uring_submit(&d->ring)) == -EINTR || rc == -EAGAIN) {
  }
  if (rc < 0) oi__fatal("disk: io_uring_submit: %s", strerror(-rc));
}

static bool is_completion_thread(oi_disk *d) { return tl_completing == d; }

/* Takes a request slot (under sq_lock); waits when `wait` and the caller is
 * not the completion thread. */
static req *slot_take(oi_disk *d, bool wait) {
  while ((!d->free_reqs || d->registering) && !d->closing) {
    if (!wait || is_completion_thread(d)) return NULL;
    pthread_cond_wait(&d->slot_cv, &d->sq_lock);
  }
  if (d->closing) return NULL;
  req *r = d->free_reqs;
  d->free_reqs = r->next_free;
  d->inflight++;
  return r;
}

static void slot_give(oi_disk *d, req *r) {
  r->next_free = d->free_reqs;
  d->free_reqs = r;
  d->inflight--;
  pthread_cond_broadcast(&d->slot_cv);
}

/* Room for `bytes` in some file, evicting as needed (under lock). */
static bool room_for(oi_disk *d, uint64_t bytes, uint32_t *file, uint64_t *off) {
  for (;;) {
    for (uint32_t k = 0; k < d->nfiles; k++) {
      uint32_t i = (d->rr + k) % d->nfiles;
      if (ext_alloc(&d->files[i], bytes, off)) {
        *file = i;
        d->rr = (i + 1) % d->nfiles;
        return true;
      }
    }
    entry *v = d->lru_head;
    while (v && (v->pins || v->readers))
      v = v->lnext;
    if (!v) return false;
    d->st.evictions++;
    entry_drop(d, v, true);
  }
}

static bool aligned(const void *p) { return ((uintptr_t)p & (SECTOR - 1)) == 0; }

oi_status oi__disk_write(oi_disk *d, const oi_tier_key *key, const void *payload, uint64_t len,
                         oi_disk_cb cb, void *ctx) {
  if (!d || !key || !payload || !len)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "disk_write: NULL argument or empty payload");
  if (!aligned(payload))
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "disk_write: payload %p is not 4 KiB aligned",
                    payload);
  uint64_t bytes = SECTOR + ROUND_UP(len);
  if (len > UINT32_MAX - SECTOR || bytes > d->files[0].cap)
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "disk_write: a block of %llu bytes does not fit a data file of %llu",
                    (unsigned long long)len, (unsigned long long)d->files[0].cap);
  uint64_t xxh = XXH3_64bits(payload, len);
  pthread_mutex_lock(&d->sq_lock);
  /* A slot first (waiting, as a read does: a spill dropped here would leave
   * the pool's copy its only one, lost at a clean restart), the index after. */
  req *r = slot_take(d, true);
  if (!r) {
    bool closing = d->closing;
    pthread_mutex_unlock(&d->sq_lock);
    if (closing) return oi__fail(OI_ERR_CLOSED, "disk_write: the store is closing");
    pthread_mutex_lock(&d->lock);
    d->st.spills_busy++;
    pthread_mutex_unlock(&d->lock);
    return oi__fail(OI_ERR_BUSY,
                    "disk_write: %u operations in flight (queue_depth), called from a "
                    "callback: spill dropped",
                    d->o.queue_depth);
  }
  pthread_mutex_lock(&d->lock);
  entry *old = tab_find(d, key);
  if (old) {
    bool sealed = old->state == ST_SEALED;
    slot_give(d, r);
    pthread_mutex_unlock(&d->lock);
    pthread_mutex_unlock(&d->sq_lock);
    if (!sealed) return oi__fail(OI_ERR_BUSY, "disk_write: the block is being written");
    if (cb) cb(ctx, OI_OK);
    return OI_OK;
  }
  entry *e = oi__calloc(1, sizeof *e);
  uint32_t file = 0;
  uint64_t off = 0;
  if (!e || !room_for(d, bytes, &file, &off)) {
    d->st.spills_failed++;
    slot_give(d, r);
    pthread_mutex_unlock(&d->lock);
    pthread_mutex_unlock(&d->sq_lock);
    oi__free(e);
    return oi__fail(OI_ERR_OUT_OF_MEMORY,
                    "disk_write: no room for %llu bytes: every block is pinned or being read",
                    (unsigned long long)bytes);
  }
  e->key = *key;
  e->h = key_hash(key);
  e->file = file;
  e->off = off;
  e->len = len;
  e->seq = d->next_seq++;
  e->payload_xxh = xxh;
  e->state = ST_WRITING;
  tab_insert(d, e);
  pthread_mutex_unlock(&d->lock);
  r->kind = REQ_WRITE;
  r->e = e;
  r->buf = (void *)payload;
  r->len = ROUND_UP(len);
  r->cb = cb;
  r->ctx = ctx;
  header_encode(r->hdr, e);
  submit_req(d, r);
  pthread_mutex_unlock(&d->sq_lock);
  return OI_OK;
}

oi_status oi__disk_read(oi_disk *d, const oi_tier_key *key, void *dst, uint64_t cap, oi_disk_cb cb,
                        void *ctx) {
  if (!d || !key || !dst) return oi__fail(OI_ERR_INVALID_ARGUMENT, "disk_read: NULL argument");
  if (!aligned(dst))
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "disk_read: destination %p is not 4 KiB aligned", dst);
  pthread_mutex_lock(&d->sq_lock);
  req *r = slot_take(d, true);
  if (!r) {
    bool closing = d->closing;
    pthread_mutex_unlock(&d->sq_lock);
    return closing ? oi__fail(OI_ERR_CLOSED, "disk_read: the store is closing")
                   : oi__fail(OI_ERR_BUSY, "disk_read: queue full (called from a callback)");
  }
  pthread_mutex_lock(&d->lock);
  entry *e = tab_find(d, key);
  oi_status st = OI_OK;
  if (!e || e->state != ST_SEALED)
    st = oi__fail(OI_ERR_NOT_FOUND, "disk_read: no such block");
  else if (cap < ROUND_UP(e->len))
    st = oi__fail(OI_ERR_INVALID_ARGUMENT,
                  "disk_read: %llu bytes of room for a block of %llu (%llu rounded to 4 KiB)",
                  (unsigned long long)cap, (unsigned long long)e->len,
                  (unsigned long long)ROUND_UP(e->len));
  if (st != OI_OK) {
    slot_give(d, r);
    pthread_mutex_unlock(&d->lock);
    pthread_mutex_unlock(&d->sq_lock);
    return st;
  }
  e->readers++;
  pthread_mutex_unlock(&d->lock);
  r->kind = REQ_READ;
  r->e = e;
  r->buf = dst;
  r->len = ROUND_UP(e->len);
  r->cb = cb;
  r->ctx = ctx;
  submit_req(d, r);
  pthread_mutex_unlock(&d->sq_lock);
  return OI_OK;
}

void oi__disk_contains(oi_disk *d, const oi_tier_key *keys, uint32_t n, uint8_t *present) {
  pthread_mutex_lock(&d->lock);
  for (uint32_t i = 0; i < n; i++) {
    entry *e = tab_find(d, &keys[i]);
    present[i] = e && e->state == ST_SEALED;
  }
  pthread_mutex_unlock(&d->lock);
}

static entry *find_sealed(oi_disk *d, const oi_tier_key *key) {
  entry *e = tab_find(d, key);
  return e && e->state == ST_SEALED ? e : NULL;
}

oi_status oi__disk_length(oi_disk *d, const oi_tier_key *key, uint64_t *len) {
  pthread_mutex_lock(&d->lock);
  entry *e = find_sealed(d, key);
  if (e) *len = e->len;
  pthread_mutex_unlock(&d->lock);
  return e ? OI_OK : oi__fail(OI_ERR_NOT_FOUND, "disk_length: no such block");
}

oi_status oi__disk_pin(oi_disk *d, const oi_tier_key *key) {
  pthread_mutex_lock(&d->lock);
  entry *e = find_sealed(d, key);
  if (e) e->pins++;
  pthread_mutex_unlock(&d->lock);
  return e ? OI_OK : oi__fail(OI_ERR_NOT_FOUND, "disk_pin: no such block");
}

oi_status oi__disk_unpin(oi_disk *d, const oi_tier_key *key) {
  pthread_mutex_lock(&d->lock);
  entry *e = find_sealed(d, key);
  oi_status st = OI_OK;
  if (!e)
    st = oi__fail(OI_ERR_NOT_FOUND, "disk_unpin: no such block");
  else if (!e->pins)
    st = oi__fail(OI_ERR_STATE, "disk_unpin: the block is not pinned");
  else
    e->pins--;
  pthread_mutex_unlock(&d->lock);
  return st;
}

oi_status oi__disk_remove(oi_disk *d, const oi_tier_key *key) {
  pthread_mutex_lock(&d->lock);
  entry *e = tab_find(d, key);
  if (e) entry_drop(d, e, true); /* a block being written: dropped at its completion */
  pthread_mutex_unlock(&d->lock);
  return e ? OI_OK : oi__fail(OI_ERR_NOT_FOUND, "disk_remove: no such block");
}

oi_status oi__disk_sync(oi_disk *d) {
  oi_status st = OI_OK;
  pthread_mutex_lock(&d->lock);
  for (uint32_t i = 0; i < d->nfiles; i++)
    if (sync_file(d->files[i].data_fd, true) != 0 || sync_file(d->files[i].log_fd, true) != 0)
      st = oi__fail(OI_ERR_IO, "disk_sync: %s: %s", d->files[i].dir, strerror(errno));
  pthread_mutex_unlock(&d->lock);
  return st;
}

oi_status oi__disk_checkpoint(oi_disk *d) {
  pthread_mutex_lock(&d->lock);
  oi_status st = checkpoint_all(d);
  pthread_mutex_unlock(&d->lock);
  return st;
}

void oi__disk_foreach(oi_disk *d, void (*fn)(void *ctx, const oi_tier_key *key, uint64_t len),
                      void *ctx) {
  pthread_mutex_lock(&d->lock);
  for (entry *e = d->lru_head; e; e = e->lnext)
    fn(ctx, &e->key, e->len);
  pthread_mutex_unlock(&d->lock);
}

void oi__disk_stats_get(oi_disk *d, oi_disk_stats *out) {
  pthread_mutex_lock(&d->lock);
  *out = d->st;
  pthread_mutex_unlock(&d->lock);
  pthread_mutex_lock(&d->sq_lock);
  out->fixed_ops = d->fixed_ops;
  pthread_mutex_unlock(&d->sq_lock);
  oi__hist_read(&d->read_hist, out->read_latency_us, &out->read_latency_sum_us);
}

oi_status oi__disk_register_buffers(oi_disk *d, const struct iovec *iov, uint32_t n) {
  if (!d || (n && !iov)) return oi__fail(OI_ERR_INVALID_ARGUMENT, "disk_register_buffers: NULL");
  struct iovec *nreg = oi__calloc((size_t)n + 1, sizeof *nreg);
  if (!nreg) return oi__fail(OI_ERR_OUT_OF_MEMORY, "disk_register_buffers");
  nreg[0] = (struct iovec){d->hdr_bufs, (size_t)d->o.queue_depth * SECTOR};
  if (n) memcpy(nreg + 1, iov, n * sizeof *iov);
  pthread_mutex_lock(&d->sq_lock);
  d->registering = true; /* no new operation starts meanwhile */
  while (d->inflight)
    pthread_cond_wait(&d->slot_cv, &d->sq_lock);
  if (d->reg_ok) io_uring_unregister_buffers(&d->ring);
  d->reg_ok = false;
  oi__free(d->reg);
  d->reg = nreg;
  d->nreg = n + 1;
  int rc = io_uring_register_buffers(&d->ring, nreg, n + 1);
  if (rc == 0)
    d->reg_ok = true;
  else
    OI_LOG(OI_LOG_INFO, "disk",
           "registering %u buffers with the ring failed (%s): plain reads "
           "and writes are used",
           n + 1, strerror(-rc));
  d->registering = false;
  pthread_cond_broadcast(&d->slot_cv);
  pthread_mutex_unlock(&d->sq_lock);
  return OI_OK;
}

/* ---- open: directories, files, replay ---- */

static oi_status check_dir(const char *dir) {
  struct stat sb;
  if (stat(dir, &sb) != 0) {
    if (errno != ENOENT) return oi__fail(OI_ERR_IO, "disk: stat %s: %s", dir, strerror(errno));
    if (mkdir(dir, 0700) != 0 && errno != EEXIST)
      return oi__fail(errno == EACCES ? OI_ERR_PERMISSION : OI_ERR_IO,
                      "disk: cannot create the directory %s: %s", dir, strerror(errno));
    if (stat(dir, &sb) != 0) return oi__fail(OI_ERR_IO, "disk: stat %s: %s", dir, strerror(errno));
  }
  if (!S_ISDIR(sb.st_mode))
    return oi__fail(OI_ERR_PERMISSION,
                    "disk: %s is not a directory (give a directory the "
                    "process owns, mode 0700)",
                    dir);
  if (sb.st_uid != geteuid())
    return oi__fail(OI_ERR_PERMISSION,
                    "disk: %s is owned by uid %u, not this process's uid %u (chown it or give "
                    "a directory this user owns, mode 0700)",
                    dir, (unsigned)sb.st_uid, (unsigned)geteuid());
  if (sb.st_mode & (S_IWGRP | S_IWOTH))
    return oi__fail(OI_ERR_PERMISSION,
                    "disk: %s is writable by group or others (mode %04o): run chmod 0700 %s", dir,
                    (unsigned)(sb.st_mode & 07777), dir);
  return OI_OK;
}

static char *path_join(const char *dir, const char *name) {
  size_t n = strlen(dir) + strlen(name) + 2;
  char *p = oi__malloc(n);
  if (p) snprintf(p, n, "%s/%s", dir, name);
  return p;
}

static oi_status open_meta(const char *path, int *fd) {
  *fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (*fd < 0)
    return oi__fail(errno == EACCES || errno == ELOOP ? OI_ERR_PERMISSION : OI_ERR_IO,
                    "disk: open %s: %s", path, strerror(errno));
  struct stat sb;
  if (fstat(*fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_uid != geteuid())
    return oi__fail(OI_ERR_PERMISSION, "disk: %s is not a regular file this user owns", path);
  return OI_OK;
}

static oi_status open_data(dfile *f, uint64_t cap) {
  f->data_fd = open(f->data_path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_DIRECT, 0600);
  f->direct = f->data_fd >= 0;
  if (f->data_fd < 0 && errno == EINVAL) {
    OI_LOG(OI_LOG_INFO, "disk", "%s: O_DIRECT refused by the file system; buffered I/O",
           f->data_path);
    f->data_fd = open(f->data_path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  }
  if (f->data_fd < 0)
    return oi__fail(errno == EACCES || errno == ELOOP ? OI_ERR_PERMISSION : OI_ERR_IO,
                    "disk: open %s: %s", f->data_path, strerror(errno));
  struct stat sb;
  if (fstat(f->data_fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_uid != geteuid())
    return oi__fail(OI_ERR_PERMISSION, "disk: %s is not a regular file this user owns",
                    f->data_path);
  if ((uint64_t)sb.st_size > cap && ftruncate(f->data_fd, (off_t)cap) != 0)
    return oi__fail(OI_ERR_IO, "disk: truncate %s: %s", f->data_path, strerror(errno));
  uint64_t param = 0;
  int rc = 0;
  if (OI_FAULT(OI_FAULT_DISK_FALLOCATE, &param))
    rc = param ? (int)param : ENOSPC;
  else if (fallocate(f->data_fd, 0, 0, (off_t)cap) != 0)
    rc = errno;
  if (rc == EOPNOTSUPP) {
    OI_LOG(OI_LOG_INFO, "disk", "%s: fallocate unsupported; the file is extended sparse",
           f->data_path);
    rc = ftruncate(f->data_fd, (off_t)cap) != 0 ? errno : 0;
  }
  if (rc == ENOSPC || rc == EDQUOT)
    return oi__fail(OI_ERR_OUT_OF_MEMORY,
                    "disk: no room for %llu bytes in %s (%s): free space there or lower "
                    "capacity_bytes",
                    (unsigned long long)cap, f->dir, strerror(rc));
  if (rc) return oi__fail(OI_ERR_IO, "disk: preallocating %s: %s", f->data_path, strerror(rc));
  f->cap = cap;
  return OI_OK;
}

/* Reads a checkpoint or log front to back through a buffer of CHUNK bytes
 * (replay holds one chunk, not the whole file). */
#define CHUNK ((size_t)1 << 20)

typedef struct chunk_reader {
  int fd;
  uint8_t *buf;
  uint64_t size;     /* the file's size; a read that fails or ends early lowers it */
  uint64_t at, have; /* buf holds the file's bytes [at, at + have) */
} chunk_reader;

static bool reader_open(chunk_reader *c, int fd) {
  struct stat sb;
  *c = (chunk_reader){.fd = fd};
  if (fstat(fd, &sb) != 0) return false;
  c->size = (uint64_t)sb.st_size;
  c->buf = oi__malloc(CHUNK);
  return c->buf != NULL;
}

/* The n (at most CHUNK) bytes at file offset `off`, or NULL when the file
 * ends (or cannot be read) before them. */
static const uint8_t *reader_get(chunk_reader *c, uint64_t off, size_t n) {
  if (off >= c->at && off - c->at + n <= c->have) return c->buf + (off - c->at);
  if (off > c->size || n > c->size - off) return NULL;
  uint64_t want = OI_MIN((uint64_t)CHUNK, c->size - off), got = 0;
  while (got < want) {
    ssize_t r = pread(c->fd, c->buf + got, want - got, (off_t)(off + got));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += (uint64_t)r;
  }
  c->at = off;
  c->have = got;
  if (got < want) c->size = off + got;
  return n <= got ? c->buf : NULL;
}

/* Applies one ADD (from a checkpoint or a log) to the index being built.
 * While the index is built, the LRU list holds its entries in the order
 * their records came (build_index puts it in sequence order). */
static void replay_add(oi_disk *d, uint32_t fi, const oi_disk_record *r, uint64_t h) {
  dfile *f = &d->files[fi];
  if (r->offset % SECTOR || !r->length || r->length > f->cap || r->offset > f->cap ||
      SECTOR + ROUND_UP(r->length) > f->cap - r->offset) {
    d->st.bad_extents_dropped++;
    return;
  }
  if (r->seq >= d->next_seq) d->next_seq = r->seq + 1;
  entry *old = tab_find_h(d, &r->key, h);
  if (old) {
    if (old->seq >= r->seq) return;
    tab_unlink(d, old);
    lru_unlink(d, old);
    oi__free(old);
  }
  entry *e = oi__calloc(1, sizeof *e);
  if (!e) oi__fatal("disk: out of memory replaying the index");
  e->key = r->key;
  e->h = h;
  e->file = fi;
  e->off = r->offset;
  e->len = r->length;
  e->seq = r->seq;
  e->payload_xxh = r->payload_xxh;
  e->state = ST_SEALED;
  tab_insert(d, e);
  lru_push(d, e);
}

static void replay_remove(oi_disk *d, uint32_t fi, const oi_disk_record *r, uint64_t h) {
  if (r->seq >= d->next_seq) d->next_seq = r->seq + 1;
  entry *e = tab_find_h(d, &r->key, h);
  if (e && e->file == fi && e->seq < r->seq) {
    tab_unlink(d, e);
    lru_unlink(d, e);
    oi__free(e);
  }
}

/* Records are applied a batch at a time: each probe of the table is a
 * cache miss (the table is sized for the whole replay), so a batch's
 * buckets and their first entries are fetched together before the records
 * are applied, in order. */
enum { BATCH = 16 };

typedef struct batch {
  oi_disk_record r[BATCH];
  uint64_t h[BATCH];
  size_t n;
} batch;

static void batch_apply(oi_disk *d, uint32_t fi, batch *b) {
  size_t mask = d->tab_cap - 1;
  for (size_t i = 0; i < b->n; i++) {
    b->h[i] = key_hash(&b->r[i].key);
    __builtin_prefetch(&d->tab[b->h[i] & mask]);
  }
  for (size_t i = 0; i < b->n; i++) {
    entry *e = d->tab[b->h[i] & mask];
    if (e) __builtin_prefetch(&e->h);
  }
  for (size_t i = 0; i < b->n; i++)
    if (b->r[i].type == OI_DISK_REC_ADD)
      replay_add(d, fi, &b->r[i], b->h[i]);
    else
      replay_remove(d, fi, &b->r[i], b->h[i]);
  b->n = 0;
}

static void load_checkpoint(oi_disk *d, uint32_t fi, uint64_t *gen) {
  dfile *f = &d->files[fi];
  *gen = 0;
  int fd = open(f->ckpt_path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return;
  chunk_reader c;
  if (!reader_open(&c, fd)) {
    oi__free(c.buf);
    close(fd);
    return;
  }
  const uint8_t *b = reader_get(&c, 0, OI_DISK_CKPT_HEADER_BYTES);
  if (!b || get64(b) != OI_DISK_CKPT_MAGIC || get32(b + 8) != OI_DISK_VERSION ||
      get64(b + 56) != XXH3_64bits(b, 56)) {
    if (c.size) {
      d->st.torn_records_cut++;
      OI_LOG(OI_LOG_WARN, "disk", "%s: checkpoint header does not verify; ignored", f->ckpt_path);
    }
    oi__free(c.buf);
    close(fd);
    return;
  }
  uint64_t n = get64(b + 16);
  *gen = get64(b + 24);
  if (get64(b + 40) > d->next_seq) d->next_seq = get64(b + 40);
  uint64_t room = (c.size - OI_DISK_CKPT_HEADER_BYTES) / OI_DISK_RECORD_BYTES;
  if (n != room) {
    d->st.torn_records_cut += n > room ? n - room : room - n;
    OI_LOG(OI_LOG_WARN, "disk", "%s: %llu records announced, %llu present", f->ckpt_path,
           (unsigned long long)n, (unsigned long long)room);
    n = OI_MIN(n, room);
  }
  /* Half full: short probes while replaying. Only a hint: without the
   * memory, the table grows as entries come. */
  (void)tab_reserve(d, 2 * (d->count + n));
  batch bt;
  bt.n = 0;
  for (uint64_t i = 0; i < n; i++) {
    const uint8_t *p =
        reader_get(&c, OI_DISK_CKPT_HEADER_BYTES + i * OI_DISK_RECORD_BYTES, OI_DISK_RECORD_BYTES);
    if (!p) { /* the file could not be read to its end: the rest is missing */
      d->st.torn_records_cut += n - i;
      OI_LOG(OI_LOG_WARN, "disk", "%s: read ended after %llu of %llu records", f->ckpt_path,
             (unsigned long long)i, (unsigned long long)n);
      break;
    }
    oi_disk_record *r = &bt.r[bt.n];
    if (!oi__disk_record_decode(p, r) || r->type != OI_DISK_REC_ADD) {
      d->st.torn_records_cut++;
      continue;
    }
    if (++bt.n == BATCH) batch_apply(d, fi, &bt);
  }
  batch_apply(d, fi, &bt);
  oi__free(c.buf);
  close(fd);
}

static oi_status replay_log(oi_disk *d, uint32_t fi, uint64_t ckpt_gen) {
  dfile *f = &d->files[fi];
  chunk_reader c;
  if (!reader_open(&c, f->log_fd)) {
    oi__free(c.buf);
    return oi__fail(OI_ERR_IO, "disk: reading %s: %s", f->log_path, strerror(errno));
  }
  oi_disk_record r;
  uint64_t gen = ckpt_gen;
  const uint8_t *b = reader_get(&c, 0, OI_DISK_RECORD_BYTES);
  if (!b || !oi__disk_record_decode(b, &r) || r.type != OI_DISK_REC_HEADER) {
    if (c.size) {
      d->st.torn_records_cut += (c.size + OI_DISK_RECORD_BYTES - 1) / OI_DISK_RECORD_BYTES;
      OI_LOG(OI_LOG_WARN, "disk", "%s: no valid log header; the log (%llu bytes) is discarded",
             f->log_path, (unsigned long long)c.size);
    }
    oi__free(c.buf);
    return log_reset(f, gen);
  }
  if (r.seq < ckpt_gen) { /* the checkpoint already holds these records */
    oi__free(c.buf);
    return log_reset(f, ckpt_gen);
  }
  gen = r.seq;
  (void)tab_reserve(d, 2 * (d->count + c.size / OI_DISK_RECORD_BYTES)); /* a hint, as above */
  uint64_t good = OI_DISK_RECORD_BYTES, records = 0;
  batch bt;
  bt.n = 0;
  while (good + OI_DISK_RECORD_BYTES <= c.size) {
    const uint8_t *p = reader_get(&c, good, OI_DISK_RECORD_BYTES);
    if (!p || !oi__disk_record_decode(p, &bt.r[bt.n]) || bt.r[bt.n].type == OI_DISK_REC_HEADER)
      break;
    if (++bt.n == BATCH) batch_apply(d, fi, &bt);
    good += OI_DISK_RECORD_BYTES;
    records++;
  }
  batch_apply(d, fi, &bt);
  oi__free(c.buf);
  uint64_t size = c.size;
  if (good < size) {
    uint64_t cut = (size - good + OI_DISK_RECORD_BYTES - 1) / OI_DISK_RECORD_BYTES;
    d->st.torn_records_cut += cut;
    OI_LOG(OI_LOG_WARN, "disk", "%s: torn or garbled tail cut (%llu bytes after record %llu)",
           f->log_path, (unsigned long long)(size - good), (unsigned long long)records);
    if (ftruncate(f->log_fd, (off_t)good) != 0 || sync_file(f->log_fd, true) != 0)
      return oi__fail(OI_ERR_IO, "disk: truncating %s: %s", f->log_path, strerror(errno));
  }
  f->log_gen = gen;
  f->log_size = good;
  f->log_records = records;
  return OI_OK;
}

/* A sort key and its entry (build_index sorts these, not the entries). */
typedef struct sortrec {
  uint64_t key;
  entry *e;
} sortrec;

/* Sorts a[0..n) by key, stably: least significant digit first, 11 bits a
 * pass, as many passes as `max` (the largest key) has digits; a pass whose
 * digit is the same in every key is skipped. tmp holds n. Returns the
 * array that holds the result (a or tmp). */
static sortrec *radix_sort(sortrec *a, sortrec *tmp, size_t n, uint64_t max) {
  enum { BITS = 11, RADIX = 1 << BITS };
  size_t *cnt = oi__malloc(RADIX * sizeof *cnt);
  if (!cnt) oi__fatal("disk: out of memory sorting the index");
  for (unsigned shift = 0; shift < 64 && (max >> shift); shift += BITS) {
    memset(cnt, 0, RADIX * sizeof *cnt);
    for (size_t i = 0; i < n; i++)
      cnt[(a[i].key >> shift) & (RADIX - 1)]++;
    if (cnt[(a[0].key >> shift) & (RADIX - 1)] == n) continue;
    for (size_t b = 0, sum = 0; b < RADIX; b++) {
      size_t c = cnt[b];
      cnt[b] = sum;
      sum += c;
    }
    for (size_t i = 0; i < n; i++)
      tmp[cnt[(a[i].key >> shift) & (RADIX - 1)]++] = a[i];
    sortrec *t = a;
    a = tmp;
    tmp = t;
  }
  oi__free(cnt);
  return a;
}

/* After replay: drops overlapping extents (the older block of each pair),
 * builds the free lists and puts the LRU (which holds the entries in the
 * order their records came) in sequence order, oldest first; records that
 * came in sequence order (a checkpoint is written oldest first, a log
 * appends newer records) need no sort. */
static oi_status build_index(oi_disk *d) {
  size_t n = d->count, k = 0;
  sortrec *buf = oi__malloc((n ? 2 * n : 1) * sizeof *buf);
  if (!buf) return oi__fail(OI_ERR_OUT_OF_MEMORY, "disk: index of %zu blocks", n);
  /* (file, offset) as one key: every offset is at most its file's size */
  uint64_t span = 0;
  for (uint32_t fi = 0; fi < d->nfiles; fi++)
    span = OI_MAX(span, (d->files[fi].cap >> 12) + 1);
  bool in_order = true;
  for (entry *e = d->lru_head; e; e = e->lnext) {
    if (k && e->seq < buf[k - 1].e->seq) in_order = false;
    buf[k++] = (sortrec){e->file * span + (e->off >> 12), e};
  }
  sortrec *all = n ? radix_sort(buf, buf + n, n, d->nfiles * span - 1) : buf;
  size_t kept = 0;
  for (size_t i = 0; i < n; i++) {
    entry *e = all[i].e;
    if (kept) {
      entry *p = all[kept - 1].e;
      if (p->file == e->file && e->off < p->off + entry_bytes(p)) {
        d->st.bad_extents_dropped++;
        entry *loser = e->seq > p->seq ? p : e;
        tab_unlink(d, loser);
        lru_unlink(d, loser);
        oi__free(loser);
        if (loser == p) all[kept - 1].e = e;
        continue;
      }
    }
    all[kept++].e = e;
  }
  for (uint32_t fi = 0; fi < d->nfiles; fi++)
    d->files[fi].nfree = 0;
  uint64_t cursor = 0;
  uint32_t cur_file = 0;
  for (size_t i = 0; i <= kept; i++) {
    uint32_t fi = i < kept ? all[i].e->file : d->nfiles;
    while (cur_file < fi) { /* close the files before this block's */
      if (cursor < d->files[cur_file].cap)
        ext_free(&d->files[cur_file], cursor, d->files[cur_file].cap - cursor);
      cur_file++;
      cursor = 0;
    }
    if (i == kept) break;
    if (all[i].e->off > cursor) ext_free(&d->files[fi], cursor, all[i].e->off - cursor);
    cursor = all[i].e->off + entry_bytes(all[i].e);
    d->st.bytes_used += entry_bytes(all[i].e);
  }
  d->st.blocks += kept;
  if (!in_order && kept) {
    uint64_t lo = UINT64_MAX, hi = 0;
    for (size_t i = 0; i < kept; i++) {
      lo = OI_MIN(lo, all[i].e->seq);
      hi = OI_MAX(hi, all[i].e->seq);
    }
    for (size_t i = 0; i < kept; i++)
      all[i].key = all[i].e->seq - lo;
    sortrec *other = all == buf ? buf + n : buf;
    all = radix_sort(all, other, kept, hi - lo);
    d->lru_head = d->lru_tail = NULL;
    for (size_t i = 0; i < kept; i++)
      lru_push(d, all[i].e);
  }
  oi__free(buf);
  return OI_OK;
}

static void files_close(oi_disk *d) {
  for (uint32_t i = 0; i < d->nfiles; i++) {
    dfile *f = &d->files[i];
    if (f->data_fd >= 0) close(f->data_fd);
    if (f->log_fd >= 0) close(f->log_fd);
    oi__free(f->dir);
    oi__free(f->data_path);
    oi__free(f->log_path);
    oi__free(f->ckpt_path);
    oi__free(f->ckpt_tmp);
    oi__free(f->free);
  }
  oi__free(d->files);
}

static void index_free(oi_disk *d) {
  for (size_t i = 0; i < d->tab_cap; i++)
    for (entry *e = d->tab[i], *next; e; e = next) {
      next = e->hnext;
      oi__free(e);
    }
  oi__free(d->tab);
}

static void destroy(oi_disk *d) {
  if (d->ring_ok) io_uring_queue_exit(&d->ring);
  files_close(d);
  index_free(d);
  oi__free(d->reqs);
  oi__free(d->hdr_bufs);
  oi__free(d->reg);
  pthread_mutex_destroy(&d->lock);
  pthread_mutex_destroy(&d->sq_lock);
  pthread_cond_destroy(&d->slot_cv);
  oi__free(d);
}

oi_status oi__disk_open(const oi_disk_options *opts, oi_disk **out) {
  if (!opts || !out || !opts->dirs || !opts->num_dirs)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "disk_open: no directories");
  *out = NULL;
  uint64_t share = (opts->capacity_bytes / opts->num_dirs) & ~(SECTOR - 1);
  if (share < 2 * SECTOR)
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "disk_open: capacity_bytes %llu over %u directories leaves less than 8 KiB "
                    "(one block) per directory",
                    (unsigned long long)opts->capacity_bytes, opts->num_dirs);
  for (uint32_t i = 0; i < opts->num_dirs; i++)
    for (uint32_t j = 0; j < i; j++)
      if (!opts->dirs[i] || !strcmp(opts->dirs[i], opts->dirs[j]))
        return oi__fail(OI_ERR_INVALID_ARGUMENT, "disk_open: directory %u missing or repeated", i);
  for (uint32_t i = 0; i < opts->num_dirs; i++) {
    if (!opts->dirs[i]) return oi__fail(OI_ERR_INVALID_ARGUMENT, "disk_open: NULL directory");
    oi_status st = check_dir(opts->dirs[i]);
    if (st != OI_OK) return st;
  }
  uint64_t t0 = oi__now_ns();
  oi_disk *d = oi__calloc(1, sizeof *d);
  if (!d) return oi__fail(OI_ERR_OUT_OF_MEMORY, "disk_open");
  d->o = *opts;
  d->o.dirs = NULL;
  if (!d->o.queue_depth) d->o.queue_depth = 32;
  if (d->o.queue_depth > 4096) d->o.queue_depth = 4096;
  if (!d->o.checkpoint_every) d->o.checkpoint_every = 65536;
  pthread_mutex_init(&d->lock, NULL);
  pthread_mutex_init(&d->sq_lock, NULL);
  pthread_cond_init(&d->slot_cv, NULL);
  d->next_seq = 1;
  d->tab_cap = 1024;
  d->tab = oi__calloc(d->tab_cap, sizeof(entry *));
  d->files = oi__calloc(opts->num_dirs, sizeof(dfile));
  if (!d->tab || !d->files) {
    destroy(d);
    return oi__fail(OI_ERR_OUT_OF_MEMORY, "disk_open");
  }
  d->nfiles = opts->num_dirs;
  oi_status st = OI_OK;
  for (uint32_t i = 0; i < d->nfiles; i++)
    d->files[i].data_fd = d->files[i].log_fd = -1;
  for (uint32_t i = 0; i < d->nfiles && st == OI_OK; i++) {
    dfile *f = &d->files[i];
    f->dir = oi__strdup(opts->dirs[i]);
    f->data_path = path_join(opts->dirs[i], "openinfer-disk.data");
    f->log_path = path_join(opts->dirs[i], "openinfer-disk.log");
    f->ckpt_path = path_join(opts->dirs[i], "openinfer-disk.ckpt");
    f->ckpt_tmp = path_join(opts->dirs[i], "openinfer-disk.ckpt.tmp");
    if (!f->dir || !f->data_path || !f->log_path || !f->ckpt_path || !f->ckpt_tmp)
      st = oi__fail(OI_ERR_OUT_OF_MEMORY, "disk_open");
    if (st == OI_OK) st = open_data(f, share);
    if (st == OI_OK) st = open_meta(f->log_path, &f->log_fd);
  }
  for (uint32_t i = 0; i < d->nfiles && st == OI_OK; i++) {
    uint64_t gen = 0;
    load_checkpoint(d, i, &gen);
    st = replay_log(d, i, gen);
  }
  if (st == OI_OK) st = build_index(d);
  d->st.capacity_bytes = share * d->nfiles;
  d->st.replay_ns = oi__now_ns() - t0;
  /* the ring and its slots */
  uint32_t qd = d->o.queue_depth;
  if (st == OI_OK) {
    d->reqs = oi__calloc(qd, sizeof(req));
    d->hdr_bufs = oi__aligned_alloc(SECTOR, (size_t)qd * SECTOR);
    if (!d->reqs || !d->hdr_bufs) st = oi__fail(OI_ERR_OUT_OF_MEMORY, "disk_open: %u slots", qd);
  }
  if (st == OI_OK) {
    memset(d->hdr_bufs, 0, (size_t)qd * SECTOR);
    for (uint32_t i = 0; i < qd; i++) {
      d->reqs[i].hdr = d->hdr_bufs + (size_t)i * SECTOR;
      d->reqs[i].next_free = d->free_reqs;
      d->free_reqs = &d->reqs[i];
    }
    int rc = io_uring_queue_init(2 * qd, &d->ring, 0);
    if (rc < 0)
      st = oi__fail(OI_ERR_UNSUPPORTED, "disk_open: io_uring_queue_init: %s", strerror(-rc));
    else
      d->ring_ok = true;
  }
  if (st == OI_OK) st = oi__disk_register_buffers(d, NULL, 0);
  if (st == OI_OK) {
    if (pthread_create(&d->thread, NULL, completion_main, d) != 0)
      st = oi__fail(OI_ERR_INTERNAL, "disk_open: cannot start the completion thread");
    else
      d->thread_ok = true;
  }
  if (st != OI_OK) {
    destroy(d);
    return st;
  }
  if (d->st.torn_records_cut || d->st.bad_extents_dropped)
    OI_LOG(OI_LOG_WARN, "disk", "opened with %llu torn records cut and %llu bad extents dropped",
           (unsigned long long)d->st.torn_records_cut,
           (unsigned long long)d->st.bad_extents_dropped);
  OI_LOG(OI_LOG_INFO, "disk",
         "opened %u directories: %llu blocks, %llu of %llu bytes, replay %.3f ms", d->nfiles,
         (unsigned long long)d->st.blocks, (unsigned long long)d->st.bytes_used,
         (unsigned long long)d->st.capacity_bytes, (double)d->st.replay_ns / 1e6);
  *out = d;
  return OI_OK;
}

void oi__disk_close(oi_disk *d) {
  if (!d) return;
  pthread_mutex_lock(&d->sq_lock);
  while (d->inflight)
    pthread_cond_wait(&d->slot_cv, &d->sq_lock);
  d->closing = true;
  pthread_cond_broadcast(&d->slot_cv);
  struct io_uring_sqe *sqe = io_uring_get_sqe(&d->ring);
  if (sqe) {
    io_uring_prep_nop(sqe);
    io_uring_sqe_set_data64(sqe, STOP_TAG);
    io_uring_submit(&d->ring);
  }
  pthread_mutex_unlock(&d->sq_lock);
  pthread_join(d->thread, NULL);
  d->thread_ok = false;
  pthread_mutex_lock(&d->lock);
  checkpoint_all(d);
  pthread_mutex_unlock(&d->lock);
  if (d->reg_ok) io_uring_unregister_buffers(&d->ring);
  destroy(d);
}
