/* The disk store's files when something is wrong with them at open: a
 * checkpoint whose header does not verify, one cut short, one with more
 * bytes than its records, one with a damaged record; a data or log file
 * that is a symbolic link or a directory; a data file larger than its
 * share. Blocks that survive read back byte-exact; what was lost is counted
 * (torn_records_cut), never served. Also an explicit sync. */
#include <xxhash.h>

#include "disk_util.h"

#define NB 12u

static void write_blocks(oi_disk *d) {
  for (uint64_t i = 0; i < NB; i++)
    CHECK_OK(dt_write(d, i));
}

/* A store of NB blocks, closed: everything is in the checkpoint, the log
 * holds its header only. */
static char *store_with_checkpoint(void) {
  char *dir = dt_mkdtemp();
  const char *dirs[] = {dir};
  oi_disk *d = dt_open(dirs, 1, 4 * MiB, 0);
  write_blocks(d);
  CHECK_OK(oi__disk_sync(d));
  CHECK_OK(oi__disk_checkpoint(d));
  oi__disk_close(d);
  return dir;
}

/* Reopens dir: blocks in the index, records cut; every block the index
 * names reads back byte-exact, every other one is absent. */
static void reopen_check(const char *dir, uint64_t want_blocks, uint64_t want_cut) {
  const char *dirs[] = {dir};
  oi_disk *d = dt_open(dirs, 1, 4 * MiB, 0);
  oi_disk_stats s = dt_stats(d);
  if (s.blocks != want_blocks || s.torn_records_cut != want_cut) {
    fprintf(stderr, "blocks %llu (want %llu), cut %llu (want %llu)\n", (unsigned long long)s.blocks,
            (unsigned long long)want_blocks, (unsigned long long)s.torn_records_cut,
            (unsigned long long)want_cut);
    CHECK(false);
  }
  uint64_t present = 0;
  for (uint64_t i = 0; i < NB; i++) {
    if (dt_has(d, i)) {
      present++;
      CHECK_OK(dt_read(d, i));
    } else {
      CHECK_ST(dt_read(d, i), OI_ERR_NOT_FOUND);
    }
  }
  CHECK(present == want_blocks);
  oi__disk_close(d);
}

static void test_checkpoint_damage(void) {
  /* Intact: every block back, nothing cut. */
  char *dir = store_with_checkpoint();
  char *ckpt = dt_path(dir, "openinfer-disk.ckpt");
  size_t n = 0;
  uint8_t *orig = dt_slurp(ckpt, &n);
  REQUIRE(n == OI_DISK_CKPT_HEADER_BYTES + NB * OI_DISK_RECORD_BYTES);
  reopen_check(dir, NB, 0);

  /* The header's checksum fails: the checkpoint is ignored (one cut). */
  uint8_t *b = malloc(n);
  REQUIRE(b);
  memcpy(b, orig, n);
  b[20] ^= 0x40; /* inside the record count */
  dt_spit(ckpt, b, n);
  reopen_check(dir, 0, 1);

  /* A checkpoint of another format version, or with another magic: ignored
   * (not read as this version's), one cut. */
  memcpy(b, orig, n);
  b[8] ^= 0x02; /* the version */
  dt_spit(ckpt, b, n);
  reopen_check(dir, 0, 1);
  memcpy(b, orig, n);
  b[0] ^= 0x01; /* the magic */
  dt_spit(ckpt, b, n);
  reopen_check(dir, 0, 1);

  /* Cut inside the fourth record: three records present of NB announced. */
  dt_spit(ckpt, orig, OI_DISK_CKPT_HEADER_BYTES + 3 * OI_DISK_RECORD_BYTES + 17);
  reopen_check(dir, 3, NB - 3);

  /* Two records' worth of bytes past the last: NB read, the excess cut. */
  uint8_t *big = calloc(1, n + 2 * OI_DISK_RECORD_BYTES);
  REQUIRE(big);
  memcpy(big, orig, n);
  dt_spit(ckpt, big, n + 2 * OI_DISK_RECORD_BYTES);
  reopen_check(dir, NB, 2);

  /* One record's bytes damaged: that block is dropped, the others stay. */
  memcpy(b, orig, n);
  b[OI_DISK_CKPT_HEADER_BYTES + 5 * OI_DISK_RECORD_BYTES + 30] ^= 0x01;
  dt_spit(ckpt, b, n);
  reopen_check(dir, NB - 1, 1);

  free(big);
  free(b);
  free(orig);
  free(ckpt);
  dt_rmtree(dir);
}

static void test_files_that_are_not_files(void) {
  char *dir = dt_mkdtemp();
  const char *dirs[] = {dir};
  oi_disk_options o = {.dirs = dirs, .num_dirs = 1, .capacity_bytes = 1 * MiB};
  oi_disk *d = NULL;
  char *data = dt_path(dir, "openinfer-disk.data"), *log = dt_path(dir, "openinfer-disk.log");
  char *elsewhere = dt_path(dir, "elsewhere");
  int fd = open(elsewhere, O_CREAT | O_RDWR, 0600);
  REQUIRE(fd >= 0);
  close(fd);

  /* A symbolic link in place of the data file, then of the log. */
  REQUIRE(symlink(elsewhere, data) == 0);
  CHECK_ST(oi__disk_open(&o, &d), OI_ERR_PERMISSION);
  CHECK(d == NULL && strstr(oi_last_error(), "openinfer-disk.data"));
  unlink(data);
  REQUIRE(symlink(elsewhere, log) == 0);
  CHECK_ST(oi__disk_open(&o, &d), OI_ERR_PERMISSION);
  CHECK(d == NULL && strstr(oi_last_error(), "openinfer-disk.log"));
  unlink(log);
  struct stat sb;
  CHECK(stat(elsewhere, &sb) == 0 && sb.st_size == 0); /* never written through a link */

  /* A directory in place of the data file. */
  unlink(data);
  REQUIRE(mkdir(data, 0700) == 0);
  CHECK(oi__disk_open(&o, &d) != OI_OK);
  CHECK(d == NULL && strstr(oi_last_error(), "openinfer-disk.data"));
  rmdir(data);

  /* A data file larger than the directory's share: cut to the share at
   * open, and the store works. */
  fd = open(data, O_CREAT | O_RDWR, 0600);
  REQUIRE(fd >= 0 && ftruncate(fd, 8 * MiB) == 0);
  close(fd);
  CHECK_OK(oi__disk_open(&o, &d));
  REQUIRE(d);
  CHECK(stat(data, &sb) == 0 && (uint64_t)sb.st_size <= 1 * MiB);
  CHECK_OK(dt_write(d, 1));
  CHECK_OK(dt_read(d, 1));
  CHECK_OK(oi__disk_sync(d));
  oi__disk_close(d);

  unlink(elsewhere);
  free(elsewhere);
  free(data);
  free(log);
  dt_rmtree(dir);
}

/* Calls with what they need missing: refused, the store unchanged. */
/* The log and checkpoint record's fields, each checked before the record
 * is used: magic, type (1..3), the padding after it, the checksum. */
static void test_record_fields(void) {
  oi_disk_record r = {.type = OI_DISK_REC_ADD,
                      .key = dt_key(7),
                      .seq = 42,
                      .offset = 8192,
                      .length = 3000,
                      .payload_xxh = 0x1234},
                 out;
  uint8_t b[OI_DISK_RECORD_BYTES], c[OI_DISK_RECORD_BYTES];
  oi__disk_record_encode(&r, b);
  memset(&out, 0, sizeof out);
  REQUIRE(oi__disk_record_decode(b, &out));
  CHECK(out.type == OI_DISK_REC_ADD && out.seq == 42 && out.offset == 8192 && out.length == 3000 &&
        out.payload_xxh == 0x1234 && !memcmp(&out.key, &r.key, sizeof r.key));
  const struct {
    size_t at;
    uint8_t value;
    const char *what;
  } bad[] = {{0, 0x00, "magic"},     {4, 0, "type 0"},          {4, 4, "type 4"},
             {5, 1, "padding 5"},    {6, 1, "padding 6"},       {7, 0x80, "padding 7"},
             {72, 0x00, "checksum"}, {40, 43, "seq (checksum)"}};
  for (size_t i = 0; i < OI_ARRAY_LEN(bad); i++) {
    memcpy(c, b, sizeof b);
    if (c[bad[i].at] == bad[i].value)
      c[bad[i].at] ^= 0xff;
    else
      c[bad[i].at] = bad[i].value;
    memset(&out, 0x5a, sizeof out);
    if (oi__disk_record_decode(c, &out) || ((uint8_t *)&out)[0] != 0x5a) {
      fprintf(stderr, "record with a bad %s decoded\n", bad[i].what);
      CHECK(false);
    }
  }
}

/* Removes the store's files in dir (the directory stays). */
static void unlink_store(const char *dir) {
  static const char *names[] = {"openinfer-disk.data", "openinfer-disk.log", "openinfer-disk.ckpt",
                                "openinfer-disk.ckpt.tmp"};
  for (size_t i = 0; i < OI_ARRAY_LEN(names); i++) {
    char *p = dt_path(dir, names[i]);
    unlink(p);
    free(p);
  }
}

static void test_bad_arguments(void) {
  oi_disk *d = (oi_disk *)1;
  CHECK_ST(oi__disk_open(NULL, &d), OI_ERR_INVALID_ARGUMENT);
  char *dir = dt_mkdtemp();
  const char *dirs[] = {dir, NULL};
  oi_disk_options o = {.dirs = dirs, .num_dirs = 0, .capacity_bytes = 1 * MiB};
  CHECK_ST(oi__disk_open(&o, &d), OI_ERR_INVALID_ARGUMENT); /* no directories */
  CHECK_ST(oi__disk_open(&o, NULL), OI_ERR_INVALID_ARGUMENT);
  o.num_dirs = 2;
  CHECK_ST(oi__disk_open(&o, &d), OI_ERR_INVALID_ARGUMENT); /* a NULL directory */
  CHECK(d == NULL);
  o.dirs = NULL;
  o.num_dirs = 1;
  CHECK_ST(oi__disk_open(&o, &d), OI_ERR_INVALID_ARGUMENT); /* no directory array */
  /* A queue deeper than 4096 is cut to 4096: the store works. */
  o.dirs = dirs;
  o.queue_depth = 100000;
  REQUIRE(oi__disk_open(&o, &d) == OI_OK);
  CHECK_OK(dt_write(d, 3));
  CHECK_OK(dt_read(d, 3));
  oi__disk_close(d);
  unlink_store(dir);
  d = dt_open(dirs, 1, 1 * MiB, 0);
  CHECK_OK(dt_write(d, 1));
  oi_tier_key k = dt_key(1), absent = dt_key(99);
  uint8_t *buf = dt_payload(1, 8192);
  dt_wait w;
  CHECK_ST(oi__disk_write(NULL, &k, buf, 100, dt_cb, &w), OI_ERR_INVALID_ARGUMENT);
  CHECK_ST(oi__disk_write(d, NULL, buf, 100, dt_cb, &w), OI_ERR_INVALID_ARGUMENT);
  CHECK_ST(oi__disk_write(d, &absent, NULL, 100, dt_cb, &w), OI_ERR_INVALID_ARGUMENT);
  CHECK_ST(oi__disk_write(d, &absent, buf, 0, dt_cb, &w), OI_ERR_INVALID_ARGUMENT);
  CHECK_ST(oi__disk_write(d, &absent, buf + 1, 100, dt_cb, &w), OI_ERR_INVALID_ARGUMENT);
  CHECK(strstr(oi_last_error(), "not 4 KiB aligned"));
  CHECK_ST(oi__disk_write(d, &absent, buf, 2 * MiB, dt_cb, &w), OI_ERR_INVALID_ARGUMENT);
  CHECK(strstr(oi_last_error(), "does not fit"));
  /* A length whose block (with its header sector) passes 32 bits. */
  CHECK_ST(oi__disk_write(d, &absent, buf, UINT32_MAX, dt_cb, &w), OI_ERR_INVALID_ARGUMENT);
  CHECK(strstr(oi_last_error(), "does not fit"));
  CHECK_ST(oi__disk_read(NULL, &k, buf, 8192, dt_cb, &w), OI_ERR_INVALID_ARGUMENT);
  CHECK_ST(oi__disk_read(d, NULL, buf, 8192, dt_cb, &w), OI_ERR_INVALID_ARGUMENT);
  CHECK_ST(oi__disk_read(d, &k, NULL, 8192, dt_cb, &w), OI_ERR_INVALID_ARGUMENT);
  CHECK_ST(oi__disk_read(d, &k, buf + 8, 8192, dt_cb, &w), OI_ERR_INVALID_ARGUMENT);
  CHECK_ST(oi__disk_register_buffers(NULL, NULL, 0), OI_ERR_INVALID_ARGUMENT);
  CHECK_ST(oi__disk_register_buffers(d, NULL, 1), OI_ERR_INVALID_ARGUMENT);
  /* Blocks that are not there, and an unpin without a pin. */
  uint64_t len = 7;
  CHECK_ST(oi__disk_length(d, &absent, &len), OI_ERR_NOT_FOUND);
  CHECK(len == 7);
  CHECK_ST(oi__disk_pin(d, &absent), OI_ERR_NOT_FOUND);
  CHECK_ST(oi__disk_unpin(d, &absent), OI_ERR_NOT_FOUND);
  CHECK_ST(oi__disk_unpin(d, &k), OI_ERR_STATE);
  CHECK_ST(oi__disk_remove(d, &absent), OI_ERR_NOT_FOUND);
  /* Unchanged: the block reads back, nothing else was stored. */
  CHECK(dt_stats(d).blocks == 1);
  CHECK_OK(dt_read(d, 1));
  free(buf);
  oi__disk_close(d);
  oi__disk_close(NULL);
  dt_rmtree(dir);
}

/* A checkpoint that cannot be written: its temporary file's name taken by a
 * directory (the create fails), then its own name taken by a directory that
 * is not empty (the rename fails). Each checkpoint fails OI_ERR_IO naming the
 * file; the log, never reset, still holds every record, so after the close
 * (whose checkpoint fails as well) and a reopen all NB blocks read back
 * byte-exact. */
static void test_checkpoint_cannot_be_written(void) {
  char *dir = dt_mkdtemp();
  const char *dirs[] = {dir};
  char *tmp = dt_path(dir, "openinfer-disk.ckpt.tmp"), *ckpt = dt_path(dir, "openinfer-disk.ckpt");
  char *inside = dt_path(ckpt, "x");
  oi_disk *d = dt_open(dirs, 1, 4 * MiB, 0);
  write_blocks(d);

  REQUIRE(mkdir(tmp, 0700) == 0);
  CHECK_ST(oi__disk_checkpoint(d), OI_ERR_IO);
  CHECK(strstr(oi_last_error(), "create") && strstr(oi_last_error(), "openinfer-disk.ckpt.tmp"));
  REQUIRE(rmdir(tmp) == 0);

  unlink(ckpt);
  REQUIRE(mkdir(ckpt, 0700) == 0);
  int fd = open(inside, O_CREAT | O_RDWR, 0600);
  REQUIRE(fd >= 0);
  close(fd);
  CHECK_ST(oi__disk_checkpoint(d), OI_ERR_IO);
  CHECK(strstr(oi_last_error(), "rename to") && strstr(oi_last_error(), "openinfer-disk.ckpt"));
  /* The store still serves and takes blocks. */
  for (uint64_t i = 0; i < NB; i++)
    CHECK_OK(dt_read(d, i));
  oi__disk_close(d); /* its checkpoint fails too (logged) */
  unlink(inside);
  REQUIRE(rmdir(ckpt) == 0);
  unlink(tmp);
  reopen_check(dir, NB, 0);

  free(inside);
  free(tmp);
  free(ckpt);
  dt_rmtree(dir);
}

/* Directories that cannot be used: a path through a regular file (stat
 * fails with ENOTDIR) and one whose parent is missing (mkdir fails): open
 * refused OI_ERR_IO naming the directory, nothing created. */
static void test_directories_that_cannot_be_made(void) {
  char *dir = dt_mkdtemp();
  char *file = dt_path(dir, "plain");
  int fd = open(file, O_CREAT | O_RDWR, 0600);
  REQUIRE(fd >= 0);
  close(fd);
  char *through = dt_path(file, "sub");
  char *missing = dt_path(dir, "missing/sub");
  oi_disk *d = NULL;
  const char *dirs1[] = {through};
  oi_disk_options o = {.dirs = dirs1, .num_dirs = 1, .capacity_bytes = 1 * MiB};
  CHECK_ST(oi__disk_open(&o, &d), OI_ERR_IO);
  CHECK(d == NULL && strstr(oi_last_error(), "stat") && strstr(oi_last_error(), through) &&
        strstr(oi_last_error(), "Not a directory"));
  const char *dirs2[] = {missing};
  o.dirs = dirs2;
  CHECK_ST(oi__disk_open(&o, &d), OI_ERR_IO);
  CHECK(d == NULL && strstr(oi_last_error(), "cannot create the directory") &&
        strstr(oi_last_error(), missing));
  struct stat sb;
  CHECK(stat(missing, &sb) != 0 && errno == ENOENT);
  unlink(file);
  free(file);
  free(through);
  free(missing);
  dt_rmtree(dir);
}

/* Writes a log to dir: a HEADER of generation gen, then the records. */
static void put_log(const char *dir, uint64_t gen, const oi_disk_record *recs, size_t n) {
  uint8_t *b = calloc(n + 1, OI_DISK_RECORD_BYTES);
  REQUIRE(b);
  oi_disk_record h = {.type = OI_DISK_REC_HEADER, .seq = gen};
  oi__disk_record_encode(&h, b);
  for (size_t i = 0; i < n; i++)
    oi__disk_record_encode(&recs[i], b + (i + 1) * OI_DISK_RECORD_BYTES);
  char *log = dt_path(dir, "openinfer-disk.log");
  dt_spit(log, b, (n + 1) * OI_DISK_RECORD_BYTES);
  free(log);
  free(b);
}

static oi_disk_record add_rec(uint64_t key, uint64_t seq, uint64_t off, uint64_t len) {
  return (oi_disk_record){
      .type = OI_DISK_REC_ADD, .key = dt_key(key), .seq = seq, .offset = off, .length = len};
}

static oi_disk_record remove_rec(uint64_t key, uint64_t seq) {
  return (oi_disk_record){.type = OI_DISK_REC_REMOVE, .key = dt_key(key), .seq = seq};
}

/* A fresh store's files in dir, then its checkpoint removed. */
static char *empty_store(uint64_t cap) {
  char *dir = dt_mkdtemp();
  const char *dirs[] = {dir};
  oi__disk_close(dt_open(dirs, 1, cap, 0));
  char *ckpt = dt_path(dir, "openinfer-disk.ckpt");
  unlink(ckpt);
  free(ckpt);
  return dir;
}

/* Logs whose records cannot all be true, written by hand: extents that are
 * not sector aligned, empty, longer than the file, past its end, or whose
 * header and payload pass it (each dropped and counted); a key added twice
 * (the later sequence wins, whatever the order), a removal older than the
 * block it names and one of an absent key (no effect); a second HEADER
 * (replay stops there: it and the record after it are cut, and the log is
 * cut back to the records before it). Blocks whose records survive but
 * whose bytes were never written fail their header check when read:
 * OI_ERR_IO and dropped, never served. */
static void test_crafted_log(void) {
  const uint64_t cap = 1 * MiB;
  char *dir = empty_store(cap);
  const char *dirs[] = {dir};
  oi_disk_record recs[] = {
      add_rec(1, 1, 4097, 100),               /* not sector aligned */
      add_rec(2, 2, 0, 0),                    /* empty */
      add_rec(3, 3, 0, cap + 1),              /* longer than the file */
      add_rec(4, 4, cap + 4096, 100),         /* past the end */
      add_rec(5, 5, cap - 4096, 100),         /* its header fits, its payload not */
      add_rec(6, 10, 0, 100),                 /* kept */
      add_rec(6, 9, 8192, 100),               /* older than the one before: ignored */
      add_rec(7, 20, 16384, 100),             /* replaced by the next */
      add_rec(7, 21, 24576, 100),             /* kept */
      remove_rec(6, 8),                       /* older than key 6's block: no effect */
      remove_rec(99, 30),                     /* nothing to remove */
      {.type = OI_DISK_REC_HEADER, .seq = 7}, /* a header inside the log: the end */
      add_rec(8, 40, 32768, 100),
  };
  put_log(dir, 7, recs, OI_ARRAY_LEN(recs));
  oi_disk *d = dt_open(dirs, 1, cap, 0);
  oi_disk_stats s = dt_stats(d);
  CHECK(s.blocks == 2 && s.bad_extents_dropped == 5 && s.torn_records_cut == 2);
  CHECK(s.bytes_used == 2 * 8192);
  CHECK(dt_has(d, 6) && dt_has(d, 7) && !dt_has(d, 8) && !dt_has(d, 1) && !dt_has(d, 5));
  char *log = dt_path(dir, "openinfer-disk.log");
  struct stat sb;
  CHECK(stat(log, &sb) == 0 && sb.st_size == 12 * OI_DISK_RECORD_BYTES);
  uint64_t len = 0;
  oi_tier_key k6 = dt_key(6);
  CHECK_OK(oi__disk_length(d, &k6, &len));
  CHECK(len == 100);
  /* Never written: the reads fail their header check and drop the blocks. */
  CHECK_ST(dt_read_len(d, 6, 100), OI_ERR_IO);
  CHECK_ST(dt_read_len(d, 7, 100), OI_ERR_IO);
  s = dt_stats(d);
  CHECK(s.blocks == 0 && s.checksum_failures == 2 && !dt_has(d, 6) && !dt_has(d, 7));
  /* The store takes new blocks over them. */
  for (uint64_t i = 20; i < 24; i++)
    CHECK_OK(dt_write(d, i));
  for (uint64_t i = 20; i < 24; i++)
    CHECK_OK(dt_read(d, i));
  oi__disk_close(d);
  free(log);
  dt_rmtree(dir);
}

/* Two directories: a removal in the second directory's log of a key whose
 * block the first holds removes nothing. */
static void test_crafted_logs_of_two_directories(void) {
  char *a = empty_store(1 * MiB), *b = empty_store(1 * MiB);
  const char *dirs[] = {a, b};
  oi_disk_record ra[] = {add_rec(6, 10, 0, 100)}, rb[] = {remove_rec(6, 50)};
  put_log(a, 3, ra, 1);
  put_log(b, 3, rb, 1);
  oi_disk *d = dt_open(dirs, 2, 2 * MiB, 0);
  oi_disk_stats s = dt_stats(d);
  CHECK(s.blocks == 1 && s.bad_extents_dropped == 0 && s.torn_records_cut == 0 && dt_has(d, 6));
  oi__disk_close(d);
  dt_rmtree(a);
  dt_rmtree(b);
}

/* Checkpoints and logs too short for their header, empty, or with a record
 * a checkpoint cannot hold (a REMOVE). */
static void test_short_and_odd_files(void) {
  char *dir = store_with_checkpoint();
  char *ckpt = dt_path(dir, "openinfer-disk.ckpt"), *log = dt_path(dir, "openinfer-disk.log");
  size_t n = 0;
  uint8_t *orig = dt_slurp(ckpt, &n);
  /* 10 bytes: no header, ignored and counted. */
  dt_spit(ckpt, orig, 10);
  reopen_check(dir, 0, 1);
  /* Empty: nothing to count. */
  dt_spit(ckpt, orig, 0);
  reopen_check(dir, 0, 0);
  /* The third record a REMOVE: that record cut, the other NB - 1 kept. */
  uint8_t *b = malloc(n);
  REQUIRE(b);
  memcpy(b, orig, n);
  oi_disk_record r;
  REQUIRE(oi__disk_record_decode(b + OI_DISK_CKPT_HEADER_BYTES + 2 * OI_DISK_RECORD_BYTES, &r));
  r.type = OI_DISK_REC_REMOVE;
  oi__disk_record_encode(&r, b + OI_DISK_CKPT_HEADER_BYTES + 2 * OI_DISK_RECORD_BYTES);
  dt_spit(ckpt, b, n);
  reopen_check(dir, NB - 1, 1);
  /* The checkpoint intact, the log 10 bytes of garbage: discarded (one
   * record's worth cut), every block kept; the log is started afresh. */
  dt_spit(ckpt, orig, n);
  dt_spit(log, (const uint8_t *)"0123456789", 10);
  reopen_check(dir, NB, 1);
  struct stat sb;
  CHECK(stat(log, &sb) == 0 && sb.st_size == OI_DISK_RECORD_BYTES);
  free(b);
  free(orig);
  free(ckpt);
  free(log);
  dt_rmtree(dir);
}

/* The store's files replaced by a FIFO, or owned by another user (root
 * only): open refused OI_ERR_PERMISSION naming the file, each of the data
 * file and the log; a NULL first directory; a log whose first record is an
 * ADD (no header): discarded and counted, the store opens empty. */
static void test_files_of_the_wrong_kind_or_owner(void) {
  char *dir = dt_mkdtemp();
  const char *dirs[] = {dir};
  oi_disk_options o = {.dirs = dirs, .num_dirs = 1, .capacity_bytes = 1 * MiB};
  oi_disk *d = NULL;
  static const char *const names[] = {"openinfer-disk.data", "openinfer-disk.log"};
  for (size_t k = 0; k < 2; k++) {
    char *p = dt_path(dir, names[k]);
    REQUIRE(mkfifo(p, 0600) == 0);
    CHECK_ST(oi__disk_open(&o, &d), OI_ERR_PERMISSION);
    CHECK(d == NULL && strstr(oi_last_error(), "is not a regular file this user owns") &&
          strstr(oi_last_error(), names[k]));
    unlink(p);
    if (geteuid() == 0) {
      int fd = open(p, O_CREAT | O_RDWR, 0600);
      REQUIRE(fd >= 0);
      close(fd);
      REQUIRE(chown(p, 12345, 12345) == 0);
      CHECK_ST(oi__disk_open(&o, &d), OI_ERR_PERMISSION);
      CHECK(d == NULL && strstr(oi_last_error(), names[k]));
      unlink(p);
    }
    free(p);
  }
  const char *null_first[] = {NULL};
  o.dirs = null_first;
  CHECK_ST(oi__disk_open(&o, &d), OI_ERR_INVALID_ARGUMENT);
  CHECK(d == NULL && strstr(oi_last_error(), "NULL directory"));
  o.dirs = dirs;
  /* A log that starts with an ADD. */
  oi__disk_close(dt_open(dirs, 1, 1 * MiB, 0));
  char *ckpt = dt_path(dir, "openinfer-disk.ckpt"), *log = dt_path(dir, "openinfer-disk.log");
  unlink(ckpt);
  oi_disk_record r = add_rec(1, 5, 0, 100);
  uint8_t b[2 * OI_DISK_RECORD_BYTES];
  oi__disk_record_encode(&r, b);
  r = add_rec(2, 6, 8192, 100);
  oi__disk_record_encode(&r, b + OI_DISK_RECORD_BYTES);
  dt_spit(log, b, sizeof b);
  d = dt_open(dirs, 1, 1 * MiB, 0);
  oi_disk_stats s = dt_stats(d);
  CHECK(s.blocks == 0 && s.torn_records_cut == 2 && !dt_has(d, 1) && !dt_has(d, 2));
  oi__disk_close(d);
  free(ckpt);
  free(log);
  dt_rmtree(dir);
}

/* Writes key i from buf (its payload of len bytes) and waits. */
static oi_status write_from(oi_disk *d, uint64_t i, uint8_t *buf, uint64_t len) {
  uint8_t *p = dt_payload(i, len);
  memcpy(buf, p, (len + 4095) & ~4095ull);
  free(p);
  oi_tier_key k = dt_key(i);
  dt_wait w;
  dt_wait_init(&w);
  oi_status st = oi__disk_write(d, &k, buf, len, dt_cb, &w);
  return st == OI_OK ? dt_wait_done(&w) : st;
}

/* Buffers the ring refuses to register (one of them has no address): the
 * registration is dropped as a whole, not an error, and I/O from the good
 * buffer goes by plain reads and writes (no fixed-buffer operation); once
 * the good buffer is registered alone, its writes use it. Every block reads
 * back byte-exact either way. */
static void test_buffers_the_ring_refuses(void) {
  char *dir = dt_mkdtemp();
  const char *dirs[] = {dir};
  oi_disk *d = dt_open(dirs, 1, 1 * MiB, 0);
  uint8_t *buf = aligned_alloc(4096, 16384);
  REQUIRE(buf);
  struct iovec bad[2] = {{buf, 16384}, {NULL, 4096}};
  CHECK_OK(oi__disk_register_buffers(d, bad, 2));
  CHECK_OK(write_from(d, 1, buf, 5000));
  CHECK(dt_stats(d).fixed_ops == 0);
  CHECK_OK(dt_read_len(d, 1, 5000));
  CHECK_OK(oi__disk_register_buffers(d, bad, 1));
  CHECK_OK(write_from(d, 2, buf, 9000));
  CHECK(dt_stats(d).fixed_ops > 0);
  CHECK_OK(dt_read_len(d, 2, 9000));
  CHECK_OK(dt_read_len(d, 1, 5000));
  oi__disk_close(d);
  free(buf);
  dt_rmtree(dir);
}

/* An index that names the wrong bytes (a log written by hand over real
 * blocks): a key pointed at another block's extent, a length, checksum or
 * sequence that is not its header's, an extent that starts inside a
 * payload (no header there), a header of another format version (its own
 * checksum good). Each read fails its header check: OI_ERR_IO, the block
 * dropped and counted (what landed in the destination is not a result). */
static void test_an_index_that_names_the_wrong_bytes(void) {
  char *dir = dt_mkdtemp();
  const char *dirs[] = {dir};
  oi_disk *d = dt_open(dirs, 1, 1 * MiB, 0);
  for (uint64_t i = 0; i < 7; i++)
    CHECK_OK(dt_write_len(d, i, 3000));
  char *log = dt_path(dir, "openinfer-disk.log"), *data = dt_path(dir, "openinfer-disk.data");
  size_t n = 0;
  uint8_t *lb = dt_slurp(log, &n);
  REQUIRE(n == 8 * OI_DISK_RECORD_BYTES);
  oi_disk_record rec[7];
  for (int i = 0; i < 7; i++) {
    REQUIRE(oi__disk_record_decode(lb + (size_t)(i + 1) * OI_DISK_RECORD_BYTES, &rec[i]));
    REQUIRE(rec[i].offset == (uint64_t)i * 8192 && rec[i].length == 3000);
  }
  oi__disk_close(d);
  char *ckpt = dt_path(dir, "openinfer-disk.ckpt");
  unlink(ckpt);
  /* Block 6's header: format version 2, its checksum made good again. */
  int fd = open(data, O_RDWR);
  REQUIRE(fd >= 0);
  uint8_t h[80];
  REQUIRE(pread(fd, h, sizeof h, 6 * 8192) == (ssize_t)sizeof h);
  h[8] = 2;
  uint64_t sum = XXH3_64bits(h, 72);
  memcpy(h + 72, &sum, 8); /* little-endian, as the store writes it */
  REQUIRE(pwrite(fd, h, sizeof h, 6 * 8192) == (ssize_t)sizeof h);
  close(fd);
  oi_disk_record bad[6] = {rec[0], rec[1], rec[2], rec[3], rec[4], rec[6]};
  bad[0].key = dt_key(10); /* key 10 at block 0's extent */
  bad[1].length = 2999;    /* a length its header does not say */
  bad[2].payload_xxh ^= 1; /* nor its checksum */
  bad[3].seq += 1000;      /* nor its sequence */
  bad[4].offset += 4096;   /* inside block 4's payload: no header */
  put_log(dir, 9, bad, 6); /* (block 5 left out: block 4's extent overlaps it now) */
  d = dt_open(dirs, 1, 1 * MiB, 0);
  oi_disk_stats s = dt_stats(d);
  CHECK(s.blocks == 6 && s.bad_extents_dropped == 0 && s.torn_records_cut == 0);
  static const uint64_t keys[6] = {10, 1, 2, 3, 4, 6};
  uint8_t *buf = aligned_alloc(4096, 8192);
  REQUIRE(buf);
  for (int i = 0; i < 6; i++) {
    memset(buf, 0xEE, 8192);
    oi_tier_key k = dt_key(keys[i]);
    dt_wait w;
    dt_wait_init(&w);
    CHECK_OK(oi__disk_read(d, &k, buf, 8192, dt_cb, &w));
    CHECK_ST(dt_wait_done(&w), OI_ERR_IO);
    CHECK(strstr(w.msg, "does not verify") && strstr(w.msg, "the block is dropped"));
    CHECK(!dt_has(d, keys[i]));
  }
  free(buf);
  s = dt_stats(d);
  CHECK(s.blocks == 0 && s.checksum_failures == 6 && s.reads_failed == 6 && s.reads_ok == 0);
  oi__disk_close(d);
  free(lb);
  free(ckpt);
  free(log);
  free(data);
  dt_rmtree(dir);
}

int main(void) {
  RUN_TEST(test_checkpoint_damage);
  RUN_TEST(test_files_that_are_not_files);
  RUN_TEST(test_record_fields);
  RUN_TEST(test_bad_arguments);
  RUN_TEST(test_checkpoint_cannot_be_written);
  RUN_TEST(test_directories_that_cannot_be_made);
  RUN_TEST(test_crafted_log);
  RUN_TEST(test_crafted_logs_of_two_directories);
  RUN_TEST(test_short_and_odd_files);
  RUN_TEST(test_files_of_the_wrong_kind_or_owner);
  RUN_TEST(test_buffers_the_ring_refuses);
  RUN_TEST(test_an_index_that_names_the_wrong_bytes);
  TEST_EXIT();
}
