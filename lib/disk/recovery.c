/* The disk tier's block store, its durable index: checkpoints (written
 * under the lock), and opening a store, which recovers the index from the
 * checkpoints and the logs (replay), and closing it. See disk_internal.h
 * and docs/disk.md. */
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "core/fault.h"
#include "disk_internal.h"

/* ---- checkpoints (under lock) ---- */

/* fdatasync (data_only) or fsync of one of the store's files; the
 * disk_sync fault fails it with its errno. */
int oi__disk_sync_file(int fd, bool data_only) {
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
  int rc = oi__disk_sync_file(fd, false);
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
oi_status oi__disk_log_reset(dfile *f, uint64_t gen) {
  uint8_t b[OI_DISK_RECORD_BYTES];
  oi_disk_record r = {.type = OI_DISK_REC_HEADER, .seq = gen};
  oi__disk_record_encode(&r, b);
  if (ftruncate(f->log_fd, 0) != 0)
    return oi__fail(OI_ERR_IO, "disk: resetting %s: %s", f->log_path, strerror(errno));
  /* Emptied, the file is of generation `gen` whatever fails next: appends
   * follow what it holds (oi__disk_log_append writes a header that did not land). */
  f->log_gen = gen;
  f->log_size = 0;
  f->log_records = 0;
  ssize_t w = oi__disk_log_pwrite(f->log_fd, b, sizeof b, 0);
  if (w != (ssize_t)sizeof b)
    return oi__fail(OI_ERR_IO, "disk: resetting %s: %s", f->log_path,
                    w < 0 ? strerror(errno) : "short write");
  f->log_size = sizeof b;
  if (oi__disk_sync_file(f->log_fd, true) != 0)
    return oi__fail(OI_ERR_IO, "disk: resetting %s: %s", f->log_path, strerror(errno));
  return OI_OK;
}

static oi_status checkpoint_file(oi_disk *d, uint32_t fi) {
  dfile *f = &d->files[fi];
  f->ckpt_err = 0;
  /* The blocks the checkpoint names are durable before it is. */
  if (oi__disk_sync_file(f->data_fd, true) != 0)
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
    f->ckpt_err = errno;
    st = oi__fail(OI_ERR_IO, "disk: create %s: %s", f->ckpt_tmp, strerror(errno));
  } else {
    errno = 0;
    if (write_all(fd, buf, bytes, 0) != OI_OK || oi__disk_sync_file(fd, false) != 0) {
      f->ckpt_err = errno ? errno : ENOSPC; /* (a write of 0 bytes: no room) */
      st = oi__fail(OI_ERR_IO, "disk: write %s: %s", f->ckpt_tmp, strerror(f->ckpt_err));
    }
    close(fd);
    if (st != OI_OK) unlink(f->ckpt_tmp); /* never left behind: the old checkpoint stands */
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
    oi_status rs = oi__disk_log_reset(f, gen);
    if (st == OI_OK) st = rs;
  }
  return st;
}

oi_status oi__disk_checkpoint_all(oi_disk *d) {
  oi_status st = OI_OK;
  for (uint32_t i = 0; i < d->nfiles; i++) {
    oi_status s = checkpoint_file(d, i);
    if (s != OI_OK) {
      if (d->files[i].ckpt_err && oi__disk_no_room(d->files[i].dir, d->files[i].ckpt_err))
        oi__disk_enter_full(d, d->files[i].ckpt_tmp, d->files[i].ckpt_err); /* one line */
      else
        OI_LOG(OI_LOG_WARN, "disk", "checkpoint of %s failed: %s", d->files[i].dir,
               oi_last_error());
      st = s;
    }
  }
  d->ckpt_due = false;
  d->st.checkpoints++;
  return st;
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

/* One store per directory: an exclusive flock on openinfer-disk.lock, taken
 * before any other file there is read or written, held (by the open file
 * description) until the store closes or the process dies, so a killed
 * server never leaves a lock behind. The file holds the holder's pid, for
 * the message that refuses a second store. */
static oi_status lock_dir(dfile *f) {
  char *path = path_join(f->dir, "openinfer-disk.lock");
  if (!path) return oi__fail(OI_ERR_OUT_OF_MEMORY, "disk_open");
  oi_status st = OI_OK;
  f->lock_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  struct stat sb;
  if (f->lock_fd < 0) {
    st = oi__fail(errno == EACCES || errno == ELOOP ? OI_ERR_PERMISSION : OI_ERR_IO,
                  "disk: open %s: %s", path, strerror(errno));
  } else if (fstat(f->lock_fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_uid != geteuid()) {
    st = oi__fail(OI_ERR_PERMISSION, "disk: %s is not a regular file this user owns", path);
  } else if (flock(f->lock_fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) {
      char pid[32] = "";
      ssize_t n = pread(f->lock_fd, pid, sizeof pid - 1, 0);
      pid[n > 0 ? n : 0] = 0;
      pid[strcspn(pid, "\n")] = 0;
      st = oi__fail(OI_ERR_BUSY,
                    "disk: %s is in use by another disk tier (pid %s holds %s): one server per "
                    "disk directory",
                    f->dir, pid[0] ? pid : "unknown", path);
    } else {
      st = oi__fail(OI_ERR_IO, "disk: flock %s: %s", path, strerror(errno));
    }
  } else {
    char pid[32];
    int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
    if (ftruncate(f->lock_fd, 0) != 0 || write_all(f->lock_fd, pid, (size_t)n, 0) != OI_OK)
      OI_LOG(OI_LOG_WARN, "disk", "%s: cannot write this process's pid there: %s", path,
             strerror(errno));
  }
  oi__free(path);
  return st;
}

/* A file of the store that group or others may read or write (made so by
 * hand, or by an older version): put back to 0600, with a log line. */
static oi_status fix_mode(int fd, const char *path, const struct stat *sb) {
  if (!(sb->st_mode & 077)) return OI_OK;
  if (fchmod(fd, 0600) != 0)
    return oi__fail(OI_ERR_PERMISSION, "disk: %s has mode %04o and cannot be made 0600: %s", path,
                    (unsigned)(sb->st_mode & 07777), strerror(errno));
  OI_LOG(OI_LOG_WARN, "disk", "%s had mode %04o: made 0600", path, (unsigned)(sb->st_mode & 07777));
  return OI_OK;
}

static oi_status open_meta(const char *path, int *fd) {
  *fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (*fd < 0)
    return oi__fail(errno == EACCES || errno == ELOOP ? OI_ERR_PERMISSION : OI_ERR_IO,
                    "disk: open %s: %s", path, strerror(errno));
  struct stat sb;
  if (fstat(*fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_uid != geteuid())
    return oi__fail(OI_ERR_PERMISSION, "disk: %s is not a regular file this user owns", path);
  return fix_mode(*fd, path, &sb);
}

/* Refuses a data file the file system has no room for before anything is
 * allocated: the bytes still to allocate (cap less what the file holds
 * already) against what the file system has free for this user. */
static oi_status room_check(dfile *f, uint64_t cap) {
  struct statvfs vfs;
  if (statvfs(f->dir, &vfs) != 0) return OI_OK; /* fallocate will tell */
  uint64_t held = 0;
  struct stat sb;
  if (lstat(f->data_path, &sb) == 0 && S_ISREG(sb.st_mode)) held = (uint64_t)sb.st_blocks * 512;
  uint64_t need = cap > held ? cap - held : 0;
  uint64_t avail = (uint64_t)vfs.f_bavail * (uint64_t)vfs.f_frsize;
  if (need > avail)
    return oi__fail(OI_ERR_OUT_OF_MEMORY,
                    "disk: no room for %llu bytes in %s (%llu bytes free there): free space "
                    "there or lower capacity_bytes",
                    (unsigned long long)cap, f->dir, (unsigned long long)avail);
  return OI_OK;
}

static oi_status open_data(dfile *f, uint64_t cap) {
  struct stat sb;
  f->data_created = lstat(f->data_path, &sb) != 0 && errno == ENOENT;
  oi_status st = room_check(f, cap);
  if (st != OI_OK) return st;
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
  if (fstat(f->data_fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_uid != geteuid())
    return oi__fail(OI_ERR_PERMISSION, "disk: %s is not a regular file this user owns",
                    f->data_path);
  if ((st = fix_mode(f->data_fd, f->data_path, &sb)) != OI_OK) return st;
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
  if (rc && f->data_created) {
    /* Refused: a file this open created goes (a partly preallocated one
     * would keep the file system full); an older one is left to its size. */
    close(f->data_fd);
    f->data_fd = -1;
    unlink(f->data_path);
  } else if (rc && (uint64_t)sb.st_size < cap && ftruncate(f->data_fd, sb.st_size) != 0) {
    OI_LOG(OI_LOG_WARN, "disk", "%s: cannot cut back to %lld bytes: %s", f->data_path,
           (long long)sb.st_size, strerror(errno));
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
  entry *old = oi__disk_tab_find_h(d, &r->key, h);
  if (old) {
    if (old->seq >= r->seq) return;
    oi__disk_tab_unlink(d, old);
    oi__disk_lru_unlink(d, old);
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
  oi__disk_tab_insert(d, e);
  oi__disk_lru_push(d, e);
}

static void replay_remove(oi_disk *d, uint32_t fi, const oi_disk_record *r, uint64_t h) {
  if (r->seq >= d->next_seq) d->next_seq = r->seq + 1;
  entry *e = oi__disk_tab_find_h(d, &r->key, h);
  if (e && e->file == fi && e->seq < r->seq) {
    oi__disk_tab_unlink(d, e);
    oi__disk_lru_unlink(d, e);
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
  (void)oi__disk_tab_reserve(d, 2 * (d->count + n));
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
    return oi__disk_log_reset(f, gen);
  }
  if (r.seq < ckpt_gen) { /* the checkpoint already holds these records */
    oi__free(c.buf);
    return oi__disk_log_reset(f, ckpt_gen);
  }
  gen = r.seq;
  (void)oi__disk_tab_reserve(d,
                             2 * (d->count + c.size / OI_DISK_RECORD_BYTES)); /* a hint, as above */
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
    if (ftruncate(f->log_fd, (off_t)good) != 0 || oi__disk_sync_file(f->log_fd, true) != 0)
      return oi__fail(OI_ERR_IO, "disk: truncating %s: %s", f->log_path, strerror(errno));
  }
  f->log_gen = gen;
  f->log_size = good;
  f->log_records = records;
  return OI_OK;
}

/* A data file created afresh at this open holds none of the blocks its
 * directory's index names (it was deleted): they are dropped, with one
 * warning. */
static size_t drop_file_entries(oi_disk *d, uint32_t fi) {
  size_t n = 0;
  for (entry *e = d->lru_head, *next; e; e = next) {
    next = e->lnext;
    if (e->file != fi) continue;
    oi__disk_tab_unlink(d, e);
    oi__disk_lru_unlink(d, e);
    oi__free(e);
    n++;
  }
  if (n)
    OI_LOG(OI_LOG_WARN, "disk",
           "%s was missing (created afresh): the %zu blocks its index names are lost",
           d->files[fi].data_path, n);
  return n;
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
        oi__disk_tab_unlink(d, loser);
        oi__disk_lru_unlink(d, loser);
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
        oi__disk_ext_free(&d->files[cur_file], cursor, d->files[cur_file].cap - cursor);
      cur_file++;
      cursor = 0;
    }
    if (i == kept) break;
    if (all[i].e->off > cursor) oi__disk_ext_free(&d->files[fi], cursor, all[i].e->off - cursor);
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
      oi__disk_lru_push(d, all[i].e);
  }
  oi__free(buf);
  return OI_OK;
}

static void files_close(oi_disk *d) {
  for (uint32_t i = 0; i < d->nfiles; i++) {
    dfile *f = &d->files[i];
    if (f->data_fd >= 0) close(f->data_fd);
    if (f->log_fd >= 0) close(f->log_fd);
    if (f->lock_fd >= 0) close(f->lock_fd); /* the last: releases the directory */
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

/* The checks of the options and directories oi__disk_open makes first. */
static oi_status check_options(const oi_disk_options *opts, uint64_t *share_out) {
  if (!opts || !opts->dirs || !opts->num_dirs)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "disk_open: no directories");
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
  *share_out = share;
  return OI_OK;
}

oi_status oi__disk_check(const oi_disk_options *opts) {
  uint64_t share = 0;
  oi_status st = check_options(opts, &share);
  for (uint32_t i = 0; st == OI_OK && i < opts->num_dirs; i++) {
    dfile f = {.lock_fd = -1, .data_fd = -1, .log_fd = -1};
    f.dir = oi__strdup(opts->dirs[i]);
    f.data_path = path_join(opts->dirs[i], "openinfer-disk.data");
    if (!f.dir || !f.data_path) st = oi__fail(OI_ERR_OUT_OF_MEMORY, "disk_check");
    if (st == OI_OK) st = lock_dir(&f);
    if (f.lock_fd >= 0) close(f.lock_fd); /* probed, not kept */
    if (st == OI_OK) st = room_check(&f, share);
    oi__free(f.dir);
    oi__free(f.data_path);
  }
  return st;
}

oi_status oi__disk_open(const oi_disk_options *opts, oi_disk **out) {
  if (!out) return oi__fail(OI_ERR_INVALID_ARGUMENT, "disk_open: out is NULL");
  *out = NULL;
  uint64_t share = 0;
  oi_status cst = check_options(opts, &share);
  if (cst != OI_OK) return cst;
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
    d->files[i].data_fd = d->files[i].log_fd = d->files[i].lock_fd = -1;
  for (uint32_t i = 0; i < d->nfiles && st == OI_OK; i++) {
    dfile *f = &d->files[i];
    f->dir = oi__strdup(opts->dirs[i]);
    f->data_path = path_join(opts->dirs[i], "openinfer-disk.data");
    f->log_path = path_join(opts->dirs[i], "openinfer-disk.log");
    f->ckpt_path = path_join(opts->dirs[i], "openinfer-disk.ckpt");
    f->ckpt_tmp = path_join(opts->dirs[i], "openinfer-disk.ckpt.tmp");
    if (!f->dir || !f->data_path || !f->log_path || !f->ckpt_path || !f->ckpt_tmp)
      st = oi__fail(OI_ERR_OUT_OF_MEMORY, "disk_open");
    if (st == OI_OK) st = lock_dir(f);
  }
  for (uint32_t i = 0; i < d->nfiles && st == OI_OK; i++) {
    dfile *f = &d->files[i];
    if (st == OI_OK) st = open_data(f, share);
    if (st == OI_OK) st = open_meta(f->log_path, &f->log_fd);
  }
  size_t dropped = 0;
  for (uint32_t i = 0; i < d->nfiles && st == OI_OK; i++) {
    uint64_t gen = 0;
    struct stat sb;
    bool no_ckpt = lstat(d->files[i].ckpt_path, &sb) != 0 && errno == ENOENT;
    load_checkpoint(d, i, &gen);
    st = replay_log(d, i, gen);
    /* A log past generation 0 follows a checkpoint: one that is gone took
     * its blocks with it (the log names only those saved since). */
    if (st == OI_OK && no_ckpt && d->files[i].log_gen > 0)
      OI_LOG(OI_LOG_WARN, "disk",
             "%s is missing (the log follows checkpoint %llu): the blocks it listed are lost",
             d->files[i].ckpt_path, (unsigned long long)d->files[i].log_gen);
    if (st == OI_OK && d->files[i].data_created) dropped += drop_file_entries(d, i);
  }
  if (st == OI_OK) st = build_index(d);
  /* A checkpoint without them now: a crash before the next must not replay
   * their records over the new file. */
  if (st == OI_OK && dropped) st = oi__disk_checkpoint_all(d);
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
    if (pthread_create(&d->thread, NULL, oi__disk_completion_main, d) != 0)
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
  oi__disk_checkpoint_all(d);
  pthread_mutex_unlock(&d->lock);
  if (d->reg_ok) io_uring_unregister_buffers(&d->ring);
  destroy(d);
}
