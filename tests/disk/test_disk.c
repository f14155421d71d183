/* The disk tier's block store (lib/disk): blocks written and read back
 * byte-exact, kept across a reopen, corruption caught at read, torn logs cut
 * at open, capacity and LRU eviction, directory permissions, one store per
 * directory. */
#include <signal.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>

#include "disk_util.h"

#define NBLOCKS 40

static void test_roundtrip(void) {
  char *a = dt_mkdtemp(), *b = dt_mkdtemp();
  const char *dirs[] = {a, b};
  oi_disk *d = dt_open(dirs, 2, 8 * MiB, 0);
  oi_disk_stats s = dt_stats(d);
  CHECK(s.capacity_bytes == 8 * MiB);
  CHECK(s.blocks == 0);
  uint64_t used = 0;
  for (uint64_t i = 0; i < NBLOCKS; i++) {
    CHECK_OK(dt_write(d, i));
    used += 4096 + ((dt_len(i) + 4095) & ~4095ull);
  }
  for (uint64_t i = 0; i < NBLOCKS; i++)
    CHECK_OK(dt_read(d, i));
  s = dt_stats(d);
  CHECK(s.blocks == NBLOCKS);
  CHECK(s.bytes_used == used);
  CHECK(s.spills_ok == NBLOCKS);
  CHECK(s.reads_ok == NBLOCKS);
  CHECK(s.reads_failed == 0 && s.checksum_failures == 0 && s.spills_failed == 0);
  uint64_t hist = 0;
  for (int i = 0; i < OI_LATENCY_BUCKETS; i++)
    hist += s.read_latency_us[i];
  CHECK(hist == NBLOCKS);

  /* contains, length, absent keys */
  oi_tier_key keys[3] = {dt_key(3), dt_key(1000), dt_key(NBLOCKS - 1)};
  uint8_t present[3] = {7, 7, 7};
  oi__disk_contains(d, keys, 3, present);
  CHECK(present[0] == 1 && present[1] == 0 && present[2] == 1);
  uint64_t len = 0;
  CHECK_OK(oi__disk_length(d, &keys[0], &len));
  CHECK(len == dt_len(3));
  CHECK_ST(oi__disk_length(d, &keys[1], &len), OI_ERR_NOT_FOUND);
  CHECK_ST(dt_read(d, 1000), OI_ERR_NOT_FOUND);

  /* Writing a stored key again stores nothing new. */
  CHECK_OK(dt_write(d, 5));
  CHECK(dt_stats(d).blocks == NBLOCKS && dt_stats(d).spills_ok == NBLOCKS);

  /* Arguments: a misaligned payload or destination, a destination too small. */
  uint8_t *buf = aligned_alloc(4096, 3 * 4096);
  REQUIRE(buf);
  oi_tier_key k8 = dt_key(8); /* 40000 bytes: 10 sectors */
  CHECK_ST(oi__disk_write(d, &k8, buf + 8, 100, dt_cb, NULL), OI_ERR_INVALID_ARGUMENT);
  CHECK_ST(oi__disk_read(d, &k8, buf + 8, 4096, dt_cb, NULL), OI_ERR_INVALID_ARGUMENT);
  CHECK_ST(oi__disk_read(d, &k8, buf, 3 * 4096, dt_cb, NULL), OI_ERR_INVALID_ARGUMENT);
  CHECK_ST(oi__disk_write(d, &k8, buf, 0, dt_cb, NULL), OI_ERR_INVALID_ARGUMENT);
  CHECK_ST(oi__disk_write(d, &k8, buf, 8 * MiB, dt_cb, NULL), OI_ERR_INVALID_ARGUMENT);
  free(buf);

  /* remove */
  CHECK_OK(oi__disk_remove(d, &keys[0]));
  CHECK(!dt_has(d, 3));
  CHECK_ST(oi__disk_remove(d, &keys[0]), OI_ERR_NOT_FOUND);
  CHECK(dt_stats(d).bytes_used == used - 4096 - ((dt_len(3) + 4095) & ~4095ull));
  CHECK_ST(dt_read(d, 3), OI_ERR_NOT_FOUND);

  /* Both directories hold blocks. */
  struct stat sa, sb;
  char *pa = dt_path(a, "openinfer-disk.data"), *pb = dt_path(b, "openinfer-disk.data");
  CHECK(stat(pa, &sa) == 0 && sa.st_size == 4 * MiB && (sa.st_mode & 0777) == 0600);
  CHECK(stat(pb, &sb) == 0 && sb.st_size == 4 * MiB && (sb.st_mode & 0777) == 0600);
  free(pa);
  free(pb);
  oi__disk_close(d);
  dt_rmtree(a);
  dt_rmtree(b);
}

/* Close and reopen keep every block and its bytes (through checkpoints and
 * through the log); removals persist too. */
static void test_reopen(void) {
  char *a = dt_mkdtemp(), *b = dt_mkdtemp();
  const char *dirs[] = {a, b};
  oi_disk *d = dt_open(dirs, 2, 8 * MiB, 7); /* a checkpoint every 7 records */
  for (uint64_t i = 0; i < NBLOCKS; i++)
    CHECK_OK(dt_write(d, i));
  for (uint64_t i = 0; i < NBLOCKS; i += 4) {
    oi_tier_key k = dt_key(i);
    CHECK_OK(oi__disk_remove(d, &k));
  }
  CHECK(dt_stats(d).checkpoints > 0);
  oi__disk_close(d);

  d = dt_open(dirs, 2, 8 * MiB, 7);
  oi_disk_stats s = dt_stats(d);
  CHECK(s.blocks == NBLOCKS - NBLOCKS / 4);
  CHECK(s.torn_records_cut == 0 && s.bad_extents_dropped == 0);
  for (uint64_t i = 0; i < NBLOCKS; i++) {
    if (i % 4 == 0) {
      CHECK(!dt_has(d, i));
      CHECK_ST(dt_read(d, i), OI_ERR_NOT_FOUND);
    } else {
      CHECK(dt_has(d, i));
      CHECK_OK(dt_read(d, i));
    }
  }
  /* New blocks go into the room the removed ones left, and survive too. */
  for (uint64_t i = 100; i < 110; i++)
    CHECK_OK(dt_write(d, i));
  oi__disk_close(d);
  d = dt_open(dirs, 2, 8 * MiB, 0);
  for (uint64_t i = 100; i < 110; i++)
    CHECK_OK(dt_read(d, i));
  for (uint64_t i = 1; i < NBLOCKS; i += 4)
    CHECK_OK(dt_read(d, i));
  CHECK(dt_stats(d).blocks == NBLOCKS - NBLOCKS / 4 + 10);
  oi__disk_close(d);
  dt_rmtree(a);
  dt_rmtree(b);
}

static void flip_byte(const char *path, uint64_t off) {
  int fd = open(path, O_RDWR);
  REQUIRE(fd >= 0);
  uint8_t c = 0;
  REQUIRE(pread(fd, &c, 1, (off_t)off) == 1);
  c ^= 0x40;
  REQUIRE(pwrite(fd, &c, 1, (off_t)off) == 1);
  REQUIRE(fsync(fd) == 0);
  close(fd);
}

/* One directory, blocks of 8 KiB (one payload sector) written in order: block
 * i's header is at i * 8192, its payload at i * 8192 + 4096. */
static void test_flipped_byte(void) {
  char *a = dt_mkdtemp();
  const char *dirs[] = {a};
  oi_disk *d = dt_open(dirs, 1, 1 * MiB, 0);
  for (uint64_t i = 0; i < 4; i++)
    CHECK_OK(dt_write_len(d, i, 3000));
  oi__disk_close(d);
  char *data = dt_path(a, "openinfer-disk.data");
  flip_byte(data, 1 * 8192 + 4096 + 2999); /* block 1: its payload's last byte */
  flip_byte(data, 2 * 8192 + 20);          /* block 2: its header (the key) */
  flip_byte(data, 3 * 8192 + 4096 + 3500); /* block 3: padding, not payload */
  d = dt_open(dirs, 1, 1 * MiB, 0);
  CHECK(dt_stats(d).blocks == 4); /* blocks are not read at open */
  CHECK_OK(dt_read_len(d, 0, 3000));
  CHECK_ST(dt_read_len(d, 1, 3000), OI_ERR_IO);
  CHECK_ST(dt_read_len(d, 2, 3000), OI_ERR_IO);
  CHECK_OK(dt_read_len(d, 3, 3000));
  oi_disk_stats s = dt_stats(d);
  CHECK(s.checksum_failures == 2);
  CHECK(s.reads_failed == 2 && s.reads_ok == 2);
  CHECK(s.blocks == 2);
  CHECK(!dt_has(d, 1) && !dt_has(d, 2) && dt_has(d, 0) && dt_has(d, 3));
  CHECK_ST(dt_read_len(d, 1, 3000), OI_ERR_NOT_FOUND);
  oi__disk_close(d);
  /* The removal is durable. */
  d = dt_open(dirs, 1, 1 * MiB, 0);
  CHECK(dt_stats(d).blocks == 2 && !dt_has(d, 1) && !dt_has(d, 2));
  /* Their room is reused, and the new blocks verify. */
  for (uint64_t i = 10; i < 12; i++)
    CHECK_OK(dt_write_len(d, i, 3000));
  for (uint64_t i = 10; i < 12; i++)
    CHECK_OK(dt_read_len(d, i, 3000));
  oi__disk_close(d);
  free(data);
  dt_rmtree(a);
}

/* A crash leaves the log (the checkpoint is written at close): the test
 * keeps the log as it was before the close and drops the checkpoint. */
static void test_torn_log(void) {
  char *a = dt_mkdtemp();
  const char *dirs[] = {a};
  char *log = dt_path(a, "openinfer-disk.log"), *ckpt = dt_path(a, "openinfer-disk.ckpt");
  oi_disk *d = dt_open(dirs, 1, 1 * MiB, 0);
  for (uint64_t i = 0; i < 10; i++)
    CHECK_OK(dt_write_len(d, i, 3000));
  size_t n = 0;
  uint8_t *saved = dt_slurp(log, &n);
  CHECK(n == 11 * OI_DISK_RECORD_BYTES); /* the header and ten ADDs */
  oi__disk_close(d);

  /* 1: half a record at the end */
  uint8_t *b = malloc(n + 200);
  REQUIRE(b);
  memcpy(b, saved, n);
  memset(b + n, 0x5a, 40);
  dt_spit(log, b, n + 40);
  unlink(ckpt);
  d = dt_open(dirs, 1, 1 * MiB, 0);
  oi_disk_stats s = dt_stats(d);
  CHECK(s.blocks == 10);
  CHECK(s.torn_records_cut == 1);
  CHECK(dt_file_size(log) == (off_t)n);
  for (uint64_t i = 0; i < 10; i++)
    CHECK_OK(dt_read_len(d, i, 3000));
  oi__disk_close(d);

  /* 2: the last record garbled, then a whole valid-looking record after it:
   * everything from the bad one on is cut. */
  memcpy(b, saved, n);
  b[n - 30] ^= 1;
  memcpy(b + n, saved + n - OI_DISK_RECORD_BYTES, OI_DISK_RECORD_BYTES);
  dt_spit(log, b, n + OI_DISK_RECORD_BYTES);
  unlink(ckpt);
  d = dt_open(dirs, 1, 1 * MiB, 0);
  s = dt_stats(d);
  CHECK(s.blocks == 9);
  CHECK(s.torn_records_cut == 2);
  CHECK(dt_file_size(log) == (off_t)(n - OI_DISK_RECORD_BYTES));
  CHECK(!dt_has(d, 9));
  for (uint64_t i = 0; i < 9; i++)
    CHECK_OK(dt_read_len(d, i, 3000));
  /* Block 9's room is free again: a new block takes it, and reads back. */
  CHECK_OK(dt_write_len(d, 20, 3000));
  CHECK_OK(dt_read_len(d, 20, 3000));
  oi__disk_close(d);

  /* 3: records pointing outside the file or over another block. */
  memcpy(b, saved, n);
  oi_disk_record r = {.type = OI_DISK_REC_ADD,
                      .key = dt_key(50),
                      .seq = 1000,
                      .offset = 1 * MiB - 4096,
                      .length = 3000,
                      .payload_xxh = 1};
  oi__disk_record_encode(&r, b + n); /* the payload would run past the end */
  dt_spit(log, b, n + OI_DISK_RECORD_BYTES);
  unlink(ckpt);
  d = dt_open(dirs, 1, 1 * MiB, 0);
  s = dt_stats(d);
  CHECK(s.bad_extents_dropped == 1 && s.torn_records_cut == 0);
  CHECK(s.blocks == 10 && !dt_has(d, 50));
  oi__disk_close(d);

  memcpy(b, saved, n);
  r.offset = 3 * 8192; /* over block 3, newer than it */
  r.key = dt_key(51);
  oi__disk_record_encode(&r, b + n);
  r.key = dt_key(52);
  r.offset = 6 * 8192; /* exactly block 6's place, but older than it */
  r.seq = 1;
  oi__disk_record_encode(&r, b + n + OI_DISK_RECORD_BYTES);
  dt_spit(log, b, n + 2 * OI_DISK_RECORD_BYTES);
  unlink(ckpt);
  d = dt_open(dirs, 1, 1 * MiB, 0);
  s = dt_stats(d);
  CHECK(s.bad_extents_dropped == 2); /* block 3 and key 51 overlap: the older (3) goes; 52 too */
  CHECK(!dt_has(d, 3) && dt_has(d, 51) && !dt_has(d, 52) && dt_has(d, 6));
  /* Key 51 names bytes that are not its block: never served. */
  CHECK_ST(dt_read_len(d, 51, 3000), OI_ERR_IO);
  CHECK(dt_stats(d).checksum_failures == 1);
  CHECK_OK(dt_read_len(d, 6, 3000));
  oi__disk_close(d);

  /* 4: a log with a garbled header is discarded entirely (its records
   * cannot be trusted to belong here); the checkpoint alone counts. */
  d = dt_open(dirs, 1, 1 * MiB, 0);
  uint64_t blocks_before = dt_stats(d).blocks;
  CHECK_OK(oi__disk_checkpoint(d));
  CHECK_OK(dt_write_len(d, 60, 3000));
  free(saved);
  saved = dt_slurp(log, &n);
  CHECK(n == 2 * OI_DISK_RECORD_BYTES); /* the header and the ADD of 60 */
  oi__disk_close(d);                    /* its checkpoint holds 60 */
  saved[3] ^= 0xff;
  dt_spit(log, saved, n);
  d = dt_open(dirs, 1, 1 * MiB, 0);
  CHECK(dt_stats(d).torn_records_cut == 2);
  CHECK(dt_stats(d).blocks == blocks_before + 1 && dt_has(d, 60));
  CHECK_OK(dt_read_len(d, 60, 3000));
  oi__disk_close(d);

  free(b);
  free(saved);
  free(log);
  free(ckpt);
  dt_rmtree(a);
}

/* A crash after removals: the log (kept as it was before the close, the
 * checkpoint dropped) holds ADDs, REMOVEs and an ADD of a removed key again.
 * Replayed, the removed block is gone, the re-added one is back with its
 * new bytes, the others read back; each block's room is right (a new block
 * fits). And a crash between a checkpoint and the reset of its log: the
 * older log (its generation below the checkpoint's) is not replayed over
 * the checkpoint, and is started afresh. */
static void test_log_replays_removals(void) {
  char *a = dt_mkdtemp();
  const char *dirs[] = {a};
  char *log = dt_path(a, "openinfer-disk.log"), *ckpt = dt_path(a, "openinfer-disk.ckpt");
  oi_disk *d = dt_open(dirs, 1, 1 * MiB, 0);
  for (uint64_t i = 0; i < 6; i++)
    CHECK_OK(dt_write_len(d, i, 3000));
  oi_tier_key k2 = dt_key(2), k4 = dt_key(4);
  CHECK_OK(oi__disk_remove(d, &k2));
  CHECK_OK(oi__disk_remove(d, &k4));
  CHECK_OK(dt_write_len(d, 2, 5000)); /* key 2 again, another length */
  size_t n = 0;
  uint8_t *saved = dt_slurp(log, &n);
  CHECK(n == 10 * OI_DISK_RECORD_BYTES); /* header, 6 ADDs, 2 REMOVEs, an ADD */
  oi__disk_close(d);
  dt_spit(log, saved, n);
  unlink(ckpt);
  d = dt_open(dirs, 1, 1 * MiB, 0);
  oi_disk_stats s = dt_stats(d);
  CHECK(s.blocks == 5 && s.torn_records_cut == 0 && s.bad_extents_dropped == 0);
  CHECK(!dt_has(d, 4) && dt_has(d, 2));
  CHECK_OK(dt_read_len(d, 2, 5000));
  for (uint64_t i = 0; i < 6; i++)
    if (i != 2 && i != 4) CHECK_OK(dt_read_len(d, i, 3000));
  CHECK_OK(dt_write_len(d, 7, 3000)); /* in the room key 4 left */
  CHECK_OK(dt_read_len(d, 7, 3000));
  oi__disk_close(d);

  /* The checkpoint written, the log not yet reset: the old log is put back. */
  d = dt_open(dirs, 1, 1 * MiB, 0);
  CHECK_OK(oi__disk_remove(d, &k2));
  free(saved);
  saved = dt_slurp(log, &n);
  CHECK(n > OI_DISK_RECORD_BYTES); /* it holds the REMOVE of key 2 */
  CHECK_OK(oi__disk_checkpoint(d));
  CHECK(dt_file_size(log) == (off_t)OI_DISK_RECORD_BYTES); /* reset: a header only */
  oi__disk_close(d);
  dt_spit(log, saved, n);
  d = dt_open(dirs, 1, 1 * MiB, 0);
  s = dt_stats(d);
  CHECK(s.blocks == 5 && !dt_has(d, 2) && dt_has(d, 7));
  CHECK(dt_file_size(log) == (off_t)OI_DISK_RECORD_BYTES);
  CHECK_OK(dt_read_len(d, 7, 3000));
  oi__disk_close(d);
  free(saved);
  free(log);
  free(ckpt);
  dt_rmtree(a);
}

/* Capacity: 10 blocks of 8 KiB. LRU eviction, pinned blocks skipped. */
static void test_capacity_lru(void) {
  char *a = dt_mkdtemp();
  const char *dirs[] = {a};
  oi_disk *d = dt_open(dirs, 1, 10 * 8192, 0);
  for (uint64_t i = 0; i < 10; i++)
    CHECK_OK(dt_write_len(d, i, 4096));
  CHECK(dt_stats(d).bytes_used == 10 * 8192);
  oi_tier_key k0 = dt_key(0), k5 = dt_key(5);
  CHECK_OK(oi__disk_pin(d, &k0));
  CHECK_OK(dt_read_len(d, 1, 4096));   /* 1 becomes the most recently used */
  CHECK_OK(dt_write_len(d, 10, 4096)); /* evicts 2 (0 pinned, 1 used) */
  CHECK(dt_has(d, 0) && dt_has(d, 1) && !dt_has(d, 2) && dt_has(d, 3) && dt_has(d, 10));
  CHECK_OK(dt_write_len(d, 11, 4096)); /* evicts 3 */
  CHECK(!dt_has(d, 3) && dt_has(d, 4));
  /* A block of two payload sectors needs 12 KiB: evicts 4 and 5 (adjacent
   * in the file: 4's place alone is too small), or more. */
  CHECK_OK(dt_write_len(d, 12, 8000));
  CHECK(!dt_has(d, 4) && dt_has(d, 12));
  oi_disk_stats s = dt_stats(d);
  CHECK(s.bytes_used <= s.capacity_bytes);
  CHECK(s.evictions >= 3);
  CHECK_OK(dt_read_len(d, 0, 4096));
  CHECK_OK(dt_read_len(d, 12, 8000));
  CHECK_OK(dt_read_len(d, 10, 4096));

  /* Everything pinned: no room, the write fails without I/O. */
  uint64_t live[16], nlive = 0;
  for (uint64_t i = 0; i < 13; i++)
    if (dt_has(d, i)) {
      oi_tier_key k = dt_key(i);
      CHECK_OK(oi__disk_pin(d, &k));
      live[nlive++] = i;
    }
  uint64_t failed = dt_stats(d).spills_failed;
  CHECK_ST(dt_write_len(d, 20, 4096), OI_ERR_OUT_OF_MEMORY);
  CHECK(dt_stats(d).spills_failed == failed + 1);
  CHECK(!dt_has(d, 20));
  for (uint64_t j = 0; j < nlive; j++) {
    oi_tier_key k = dt_key(live[j]);
    CHECK_OK(oi__disk_unpin(d, &k));
    CHECK_OK(dt_read_len(d, live[j], live[j] == 12 ? 8000 : 4096));
  }
  CHECK_ST(oi__disk_unpin(d, &k5), OI_ERR_NOT_FOUND); /* evicted */
  oi_tier_key k1 = dt_key(1);
  CHECK_ST(oi__disk_unpin(d, &k1), OI_ERR_STATE);
  /* 0 is still pinned once: many writes later it is still there. */
  for (uint64_t i = 30; i < 60; i++)
    CHECK_OK(dt_write_len(d, i, 4096));
  CHECK(dt_has(d, 0));
  CHECK_OK(dt_read_len(d, 0, 4096));
  for (uint64_t i = 51; i < 60; i++)
    CHECK_OK(dt_read_len(d, i, 4096));
  s = dt_stats(d);
  CHECK(s.blocks == 10 && s.bytes_used == s.capacity_bytes);
  oi__disk_close(d);
  dt_rmtree(a);
}

static void test_dir_permissions(void) {
  char *a = dt_mkdtemp();
  const char *dirs[] = {a};
  oi_disk_options o = {.dirs = dirs, .num_dirs = 1, .capacity_bytes = 1 * MiB};
  oi_disk *d = NULL;
  CHECK(chmod(a, 0770) == 0);
  CHECK_ST(oi__disk_open(&o, &d), OI_ERR_PERMISSION);
  CHECK(d == NULL);
  CHECK(strstr(oi_last_error(), a) && strstr(oi_last_error(), "chmod 0700"));
  CHECK(chmod(a, 0702) == 0);
  CHECK_ST(oi__disk_open(&o, &d), OI_ERR_PERMISSION);
  CHECK(chmod(a, 0755) == 0); /* readable by others is fine; the files are 0600 */
  CHECK_OK(oi__disk_open(&o, &d));
  oi__disk_close(d);
  d = NULL;
  char *data = dt_path(a, "openinfer-disk.data"), *log = dt_path(a, "openinfer-disk.log"),
       *ckpt = dt_path(a, "openinfer-disk.ckpt");
  struct stat sb;
  CHECK(stat(data, &sb) == 0 && (sb.st_mode & 0777) == 0600);
  CHECK(stat(log, &sb) == 0 && (sb.st_mode & 0777) == 0600);
  CHECK(stat(ckpt, &sb) == 0 && (sb.st_mode & 0777) == 0600);

  /* Not a directory. */
  const char *fdirs[] = {data};
  o.dirs = fdirs;
  CHECK_ST(oi__disk_open(&o, &d), OI_ERR_PERMISSION);
  /* Absent: created 0700. */
  char *sub = dt_path(a, "new");
  const char *sdirs[] = {sub};
  o.dirs = sdirs;
  CHECK_OK(oi__disk_open(&o, &d));
  CHECK(stat(sub, &sb) == 0 && S_ISDIR(sb.st_mode) && (sb.st_mode & 0777) == 0700);
  oi__disk_close(d);
  d = NULL;
  /* Owned by another user: only root can make one. */
  if (geteuid() == 0) {
    CHECK(chown(sub, 12345, 12345) == 0);
    CHECK_ST(oi__disk_open(&o, &d), OI_ERR_PERMISSION);
    CHECK(strstr(oi_last_error(), "owned by uid 12345"));
    CHECK(chown(sub, 0, 0) == 0);
  } else {
    fprintf(stderr, "(the other-owner check needs root: skipped)\n");
  }
  /* Options. */
  o.dirs = dirs;
  o.capacity_bytes = 4096;
  CHECK_ST(oi__disk_open(&o, &d), OI_ERR_INVALID_ARGUMENT);
  const char *twice[] = {a, a};
  o.dirs = twice;
  o.num_dirs = 2;
  o.capacity_bytes = 1 * MiB;
  CHECK_ST(oi__disk_open(&o, &d), OI_ERR_INVALID_ARGUMENT);
  char *subcopy = strdup(sub);
  dt_rmtree(subcopy);
  free(sub);
  free(data);
  free(log);
  free(ckpt);
  dt_rmtree(a);
}

/* One store per directory: a second open of the same directory (here, in
 * the same process: flock locks open file descriptions) is refused with the
 * holder's pid, touching nothing; once the first closes, the directory is
 * free again. A child killed while holding it never blocks the next. */
static void test_one_store_per_dir(void) {
  char *a = dt_mkdtemp();
  const char *dirs[] = {a};
  oi_disk *d = dt_open(dirs, 1, 1 * MiB, 0);
  CHECK_OK(dt_write(d, 1));
  char *data = dt_path(a, "openinfer-disk.data"), *lock = dt_path(a, "openinfer-disk.lock");
  struct stat before, sb;
  REQUIRE(stat(data, &before) == 0);
  oi_disk_options o = {.dirs = dirs, .num_dirs = 1, .capacity_bytes = 2 * MiB};
  oi_disk *d2 = NULL;
  CHECK_ST(oi__disk_open(&o, &d2), OI_ERR_BUSY);
  CHECK(d2 == NULL);
  char pid[64];
  snprintf(pid, sizeof pid, "pid %ld", (long)getpid());
  CHECK(strstr(oi_last_error(), pid) != NULL);
  CHECK(strstr(oi_last_error(), a) != NULL);
  /* the data file was not touched (not resized to the second's capacity) */
  CHECK(stat(data, &sb) == 0 && sb.st_size == before.st_size);
  CHECK(stat(lock, &sb) == 0 && (sb.st_mode & 0777) == 0600);
  CHECK_OK(dt_read(d, 1));
  oi__disk_close(d);
  d = dt_open(dirs, 1, 1 * MiB, 0);
  CHECK(dt_has(d, 1));
  oi__disk_close(d);

  /* A holder killed with SIGKILL: its lock goes with it. */
  int ready[2];
  REQUIRE(pipe(ready) == 0);
  pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    oi_disk *cd = NULL;
    char c = oi__disk_open(&o, &cd) == OI_OK ? 'y' : 'n';
    if (write(ready[1], &c, 1) != 1) _exit(1);
    pause();
    _exit(0);
  }
  char c = 0;
  CHECK(read(ready[0], &c, 1) == 1 && c == 'y');
  CHECK_ST(oi__disk_open(&o, &d2), OI_ERR_BUSY);
  snprintf(pid, sizeof pid, "pid %ld", (long)child);
  CHECK(strstr(oi_last_error(), pid) != NULL);
  kill(child, SIGKILL);
  int status;
  REQUIRE(waitpid(child, &status, 0) == child);
  close(ready[0]);
  close(ready[1]);
  d = dt_open(dirs, 1, 1 * MiB, 0);
  CHECK(dt_has(d, 1));
  oi__disk_close(d);
  free(data);
  free(lock);
  dt_rmtree(a);
}

/* Files of a store made wider than 0600 by hand are put back to 0600 at
 * open; a capacity larger than the file system is refused before anything
 * is created; a deleted data file drops the blocks its index named (they
 * are not announced, a checkpoint without them follows); a deleted
 * checkpoint is said (its blocks are gone). */
static void test_files_modes_room_and_loss(void) {
  char *a = dt_mkdtemp();
  const char *dirs[] = {a};
  oi_disk *d = dt_open(dirs, 1, 1 * MiB, 0);
  for (uint64_t i = 0; i < 4; i++)
    CHECK_OK(dt_write(d, i));
  oi__disk_close(d); /* a checkpoint of 4 blocks */
  char *data = dt_path(a, "openinfer-disk.data"), *log = dt_path(a, "openinfer-disk.log"),
       *ckpt = dt_path(a, "openinfer-disk.ckpt");
  CHECK(chmod(data, 0666) == 0 && chmod(log, 0644) == 0);
  d = dt_open(dirs, 1, 1 * MiB, 0);
  struct stat sb;
  CHECK(stat(data, &sb) == 0 && (sb.st_mode & 0777) == 0600);
  CHECK(stat(log, &sb) == 0 && (sb.st_mode & 0777) == 0600);
  CHECK(dt_stats(d).blocks == 4);
  CHECK_OK(dt_read(d, 3));
  CHECK_OK(dt_write(d, 4)); /* in the log only */
  oi__disk_close(d);

  /* Larger than the file system: refused, no data file grown. */
  struct statvfs vfs;
  REQUIRE(statvfs(a, &vfs) == 0);
  uint64_t fs_bytes = (uint64_t)vfs.f_blocks * vfs.f_frsize;
  oi_disk_options o = {.dirs = dirs, .num_dirs = 1, .capacity_bytes = 2 * fs_bytes};
  oi_disk *d2 = NULL;
  CHECK_ST(oi__disk_open(&o, &d2), OI_ERR_OUT_OF_MEMORY);
  CHECK(strstr(oi_last_error(), "no room") && strstr(oi_last_error(), a));
  CHECK(dt_file_size(data) == (off_t)(1 * MiB));
  char *b = dt_mkdtemp();
  const char *bdirs[] = {b};
  o.dirs = bdirs;
  CHECK_ST(oi__disk_open(&o, &d2), OI_ERR_OUT_OF_MEMORY);
  char *bdata = dt_path(b, "openinfer-disk.data");
  CHECK(dt_file_size(bdata) == -1); /* nothing created */
  free(bdata);
  dt_rmtree(b);

  /* The checkpoint deleted (a close writes one and empties the log): its
   * blocks are lost (said), the data file is reused. */
  REQUIRE(unlink(ckpt) == 0);
  d = dt_open(dirs, 1, 1 * MiB, 0);
  CHECK(dt_stats(d).blocks == 0 && !dt_has(d, 4));
  CHECK_OK(dt_write(d, 4));
  CHECK_OK(dt_read(d, 4));
  oi__disk_close(d);
  /* The data file deleted: nothing announced, nothing served. */
  REQUIRE(unlink(data) == 0);
  d = dt_open(dirs, 1, 1 * MiB, 0);
  CHECK(dt_stats(d).blocks == 0 && !dt_has(d, 4));
  CHECK_OK(dt_write(d, 5));
  oi__disk_close(d);
  d = dt_open(dirs, 1, 1 * MiB, 0); /* the dropped records are not replayed again */
  CHECK(dt_stats(d).blocks == 1 && dt_has(d, 5) && !dt_has(d, 4));
  CHECK(dt_stats(d).bad_extents_dropped == 0);
  CHECK_OK(dt_read(d, 5));
  oi__disk_close(d);
  free(data);
  free(log);
  free(ckpt);
  dt_rmtree(a);
}

/* Buffers registered with the ring: fixed-buffer reads and writes carry the
 * same bytes as plain ones. */
static void test_registered_buffers(void) {
  char *a = dt_mkdtemp();
  const char *dirs[] = {a};
  oi_disk *d = dt_open(dirs, 1, 4 * MiB, 0);
  CHECK(dt_stats(d).fixed_ops == 0);
  size_t pool_bytes = 256 * KiB;
  uint8_t *pool = aligned_alloc(4096, pool_bytes);
  REQUIRE(pool);
  struct iovec iov = {pool, pool_bytes};
  CHECK_OK(oi__disk_register_buffers(d, &iov, 1));
  for (uint64_t i = 0; i < 8; i++) {
    uint64_t len = dt_len(i);
    uint8_t *slot = pool + i * 32 * KiB; /* inside the registered range */
    memset(slot, 0, 32 * KiB);
    for (uint64_t j = 0; j < len; j++)
      slot[j] = dt_byte(i, j);
    oi_tier_key k = dt_key(i);
    dt_wait w;
    dt_wait_init(&w);
    CHECK_OK(oi__disk_write(d, &k, slot, len, dt_cb, &w));
    CHECK_OK(dt_wait_done(&w));
  }
  memset(pool, 0xEE, pool_bytes);
  for (uint64_t i = 0; i < 8; i++) {
    uint8_t *slot = pool + (7 - i) * 32 * KiB;
    oi_tier_key k = dt_key(i);
    dt_wait w;
    dt_wait_init(&w);
    CHECK_OK(oi__disk_read(d, &k, slot, 32 * KiB, dt_cb, &w));
    CHECK_OK(dt_wait_done(&w));
    CHECK(dt_check(slot, i, dt_len(i)));
    CHECK_OK(dt_read(d, i)); /* and into a plain buffer */
  }
  /* 8 writes and 8 reads used the registered range, the plain reads not. */
  CHECK(dt_stats(d).fixed_ops == 16);
  CHECK_OK(oi__disk_register_buffers(d, NULL, 0));
  CHECK_OK(dt_read(d, 0));
  CHECK(dt_stats(d).fixed_ops == 16);
  oi__disk_close(d);
  free(pool);
  dt_rmtree(a);
}

int main(void) {
  oi_set_log_level(OI_LOG_ERROR);
  RUN_TEST(test_roundtrip);
  RUN_TEST(test_reopen);
  RUN_TEST(test_flipped_byte);
  RUN_TEST(test_torn_log);
  RUN_TEST(test_log_replays_removals);
  RUN_TEST(test_capacity_lru);
  RUN_TEST(test_dir_permissions);
  RUN_TEST(test_one_store_per_dir);
  RUN_TEST(test_files_modes_room_and_loss);
  RUN_TEST(test_registered_buffers);
  TEST_EXIT();
}
