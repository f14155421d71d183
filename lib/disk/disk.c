/* The disk tier's block store: see disk.h and docs/disk.md; its types and
 * locks: disk_internal.h; checkpoints and recovery: recovery.c. */
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "core/fault.h"
#include "disk_internal.h"

/* ---- formats ---- */

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
void oi__disk_ext_free(dfile *f, uint64_t off, uint64_t len) {
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

/* ---- the index (under lock) ---- */

entry *oi__disk_tab_find_h(oi_disk *d, const oi_tier_key *k, uint64_t h) {
  for (entry *e = d->tab[h & (d->tab_cap - 1)]; e; e = e->hnext)
    if (e->h == h && key_eq(&e->key, k)) return e;
  return NULL;
}

static entry *tab_find(oi_disk *d, const oi_tier_key *k) {
  return oi__disk_tab_find_h(d, k, key_hash(k));
}

/* Grows the table to the first power of two that holds `want` entries at
 * one per bucket (a no-op when it already does); false when there is no
 * memory for it (the table is unchanged). */
bool oi__disk_tab_reserve(oi_disk *d, size_t want) {
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

void oi__disk_tab_insert(oi_disk *d, entry *e) {
  if (d->count + 1 > d->tab_cap && !oi__disk_tab_reserve(d, d->count + 1))
    oi__fatal("disk: out of memory for the index");
  entry **b = &d->tab[e->h & (d->tab_cap - 1)];
  e->hnext = *b;
  *b = e;
  d->count++;
}

void oi__disk_tab_unlink(oi_disk *d, entry *e) {
  for (entry **p = &d->tab[e->h & (d->tab_cap - 1)]; *p; p = &(*p)->hnext)
    if (*p == e) {
      *p = e->hnext;
      d->count--;
      return;
    }
}

void oi__disk_lru_unlink(oi_disk *d, entry *e) {
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

void oi__disk_lru_push(oi_disk *d, entry *e) { /* most recently used end */
  e->lnext = NULL;
  e->lprev = d->lru_tail;
  if (d->lru_tail)
    d->lru_tail->lnext = e;
  else
    d->lru_head = e;
  d->lru_tail = e;
}

/* ---- the logs (under lock) ---- */

/* pwrite to a log; the disk_log_write fault writes `param` bytes of it
 * (0: none, EIO). */
ssize_t oi__disk_log_pwrite(int fd, const void *b, size_t n, off_t off) {
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

bool oi__disk_no_room(const char *dir, int err) {
  if (err == ENOSPC || err == EDQUOT) return true;
  if (err) return false;
  struct statvfs vfs;
  return statvfs(dir, &vfs) == 0 && vfs.f_bavail == 0;
}

void oi__disk_enter_full(oi_disk *d, const char *what, int err) {
  d->full_probe_ns = oi__now_ns() + FULL_PROBE_NS;
  d->ckpt_due = false; /* tried at the probe, not at every completion */
  if (d->full) return;
  d->full = true;
  d->st.full_events++;
  OI_LOG(OI_LOG_WARN, "disk",
         "%s: %s: the file system is full; spills stop (the pool keeps its copies) until a "
         "checkpoint fits again",
         what, err ? strerror(err) : "short write");
}

bool oi__disk_log_append(oi_disk *d, uint32_t file, const oi_disk_record *r) {
  dfile *f = &d->files[file];
  if (f->log_size == 0 &&
      oi__disk_log_reset(f, f->log_gen) != OI_OK) { /* its header did not land */
    int err = errno;
    if (oi__disk_no_room(f->dir, err)) {
      oi__disk_enter_full(d, f->log_path, err);
      return false;
    }
    OI_LOG(OI_LOG_WARN, "disk", "%s", oi_last_error());
    d->ckpt_due = true;
    return false;
  }
  uint8_t b[OI_DISK_RECORD_BYTES];
  oi__disk_record_encode(r, b);
  ssize_t n = oi__disk_log_pwrite(f->log_fd, b, sizeof b, (off_t)f->log_size);
  if (n != (ssize_t)sizeof b) {
    int err = n < 0 ? errno : 0;
    if (n > 0 && ftruncate(f->log_fd, (off_t)f->log_size) != 0) /* keep whole records */
      OI_LOG(OI_LOG_WARN, "disk", "truncating %s failed: %s", f->log_path, strerror(errno));
    if (oi__disk_no_room(f->dir, err)) {
      oi__disk_enter_full(d, f->log_path, err);
      return false;
    }
    /* The block stays served until a restart; the next checkpoint records it. */
    OI_LOG(OI_LOG_WARN, "disk", "appending to %s failed: %s", f->log_path,
           n < 0 ? strerror(err) : "short write");
    d->ckpt_due = true;
    return false;
  }
  f->log_size += sizeof b;
  if (++f->log_records >= d->o.checkpoint_every) d->ckpt_due = true;
  return true;
}

static void log_remove(oi_disk *d, const entry *e) {
  oi_disk_record r = {.type = OI_DISK_REC_REMOVE, .key = e->key, .seq = d->next_seq++};
  oi__disk_log_append(d, e->file, &r);
}

/* Takes a sealed entry out of the index (table and LRU). Its extent is
 * freed now when no read holds it, else by the last reader. */
static void entry_drop(oi_disk *d, entry *e, bool log) {
  oi__disk_tab_unlink(d, e);
  if (e->state == ST_SEALED) {
    oi__disk_lru_unlink(d, e);
    d->st.blocks--;
    d->st.bytes_used -= entry_bytes(e);
    if (log) log_remove(d, e);
  }
  e->dead = true;
  if (!e->readers && e->state == ST_SEALED) {
    oi__disk_ext_free(&d->files[e->file], e->off, entry_bytes(e));
    oi__free(e);
  }
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
  if (d->ckpt_due && !d->closing) oi__disk_checkpoint_all(d);
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
      oi__disk_ext_free(&d->files[e->file], e->off, entry_bytes(e));
      oi__free(e);
    } else {
      e->state = ST_SEALED;
      oi__disk_lru_push(d, e);
      d->st.blocks++;
      d->st.bytes_used += entry_bytes(e);
      oi_disk_record rec = {.type = OI_DISK_REC_ADD,
                            .key = e->key,
                            .seq = e->seq,
                            .offset = e->off,
                            .length = e->len,
                            .payload_xxh = e->payload_xxh};
      if (!oi__disk_log_append(d, e->file, &rec) && d->full) {
        /* Its record did not land for want of room: not durable, so not
         * kept (the index stays what the log and checkpoint say); the
         * pool keeps its copy. */
        d->st.spills_ok--;
        d->st.writes_refused_full++;
        const char *dir = d->files[e->file].dir; /* e is freed by the drop */
        entry_drop(d, e, false);
        st = oi__fail(OI_ERR_OUT_OF_MEMORY,
                      "disk: %s is full: the block's index record did not fit (not kept)", dir);
      }
    }
  } else {
    d->st.spills_failed++;
    if (!e->dead) oi__disk_tab_unlink(d, e);
    oi__disk_ext_free(&d->files[e->file], e->off, entry_bytes(e));
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
      oi__disk_lru_unlink(d, e);
      oi__disk_lru_push(d, e);
    }
  } else if (!e->readers) {
    oi__disk_ext_free(&d->files[e->file], e->off, entry_bytes(e));
    oi__free(e);
  }
  end_req(d, r, st);
}

static _Thread_local oi_disk *tl_completing;

/* The store whose completion thread this is (NULL on other threads). */
void *oi__disk_completion_main(void *arg) {
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
  if (d->full && oi__now_ns() >= d->full_probe_ns) {
    /* Room again? A checkpoint of the whole index must fit first: then
     * the index is durable and its logs start afresh. */
    if (oi__disk_checkpoint_all(d) == OI_OK) {
      d->full = false;
      OI_LOG(OI_LOG_WARN, "disk", "the file system has room again: spills resume");
    } else {
      d->full_probe_ns = oi__now_ns() + FULL_PROBE_NS;
    }
  }
  if (d->full) {
    d->st.writes_refused_full++;
    slot_give(d, r);
    pthread_mutex_unlock(&d->lock);
    pthread_mutex_unlock(&d->sq_lock);
    return oi__fail(OI_ERR_OUT_OF_MEMORY,
                    "disk_write: the file system is full: not written (spills resume when a "
                    "checkpoint fits)");
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
  oi__disk_tab_insert(d, e);
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
    if (oi__disk_sync_file(d->files[i].data_fd, true) != 0 ||
        oi__disk_sync_file(d->files[i].log_fd, true) != 0)
      st = oi__fail(OI_ERR_IO, "disk_sync: %s: %s", d->files[i].dir, strerror(errno));
  pthread_mutex_unlock(&d->lock);
  return st;
}

oi_status oi__disk_checkpoint(oi_disk *d) {
  pthread_mutex_lock(&d->lock);
  oi_status st = oi__disk_checkpoint_all(d);
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

bool oi__disk_full(oi_disk *d) {
  pthread_mutex_lock(&d->lock);
  bool full = d->full;
  pthread_mutex_unlock(&d->lock);
  return full;
}

void oi__disk_stats_get(oi_disk *d, oi_disk_stats *out) {
  pthread_mutex_lock(&d->lock);
  *out = d->st;
  out->full = d->full;
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
