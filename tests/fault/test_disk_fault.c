/* The disk tier under injected faults (lib/core/fault.h): failed and
 * short writes and reads, no room at open, and slow reads that hold their
 * blocks against eviction and removal. Skips (77) without
 * -Dfault_injection=true. */
#include <time.h>

#include "core/fault.h"
#include "disk_util.h"

static oi_disk *open1(const char *dir, uint64_t cap, uint32_t qd) {
  const char *dirs[] = {dir};
  oi_disk_options o = {.dirs = dirs, .num_dirs = 1, .capacity_bytes = cap, .queue_depth = qd};
  oi_disk *d = NULL;
  REQUIRE(oi__disk_open(&o, &d) == OI_OK);
  return d;
}

/* A write that fails frees its room, is counted, and is never visible;
 * ENOSPC and a short write likewise, with their messages. */
static void test_write_errors(void) {
  char *a = dt_mkdtemp();
  oi_disk *d = open1(a, 10 * 8192, 0);
  CHECK_OK(dt_write_len(d, 0, 4096));
  REQUIRE(oi__fault_arm(OI_FAULT_DISK_WRITE, 0, 1, 0) == OI_OK);
  CHECK_ST(dt_write_len(d, 1, 4096), OI_ERR_IO);
  CHECK(oi__fault_fired(OI_FAULT_DISK_WRITE) == 1);
  CHECK(!dt_has(d, 1));
  oi_disk_stats s = dt_stats(d);
  CHECK(s.spills_failed == 1 && s.spills_ok == 1 && s.blocks == 1 && s.bytes_used == 8192);

  REQUIRE(oi__fault_arm(OI_FAULT_DISK_WRITE, 0, 1, ENOSPC) == OI_OK);
  uint8_t *p = dt_payload(2, 4096);
  oi_tier_key k2 = dt_key(2);
  dt_wait w;
  dt_wait_init(&w);
  CHECK_OK(oi__disk_write(d, &k2, p, 4096, dt_cb, &w));
  CHECK_ST(dt_wait_done(&w), OI_ERR_IO);
  CHECK(strstr(w.msg, "No space left"));
  free(p);
  REQUIRE(oi__fault_arm(OI_FAULT_DISK_SHORT_WRITE, 0, 1, 0) == OI_OK);
  p = dt_payload(3, 4096);
  oi_tier_key k3 = dt_key(3);
  dt_wait_init(&w);
  CHECK_OK(oi__disk_write(d, &k3, p, 4096, dt_cb, &w));
  CHECK_ST(dt_wait_done(&w), OI_ERR_IO);
  CHECK(strstr(w.msg, "short write"));
  CHECK(oi__fault_fired(OI_FAULT_DISK_SHORT_WRITE) == 1 && !dt_has(d, 3));
  free(p);

  /* Thirty failed writes into a store with room for nine more: none of them
   * keeps room, so nine good ones fit afterwards with no eviction. */
  REQUIRE(oi__fault_arm(OI_FAULT_DISK_WRITE, 0, 0, 0) == OI_OK);
  for (uint64_t i = 100; i < 130; i++)
    CHECK_ST(dt_write_len(d, i, 4096), OI_ERR_IO);
  oi__fault_disarm_all();
  s = dt_stats(d);
  CHECK(s.spills_failed == 33 && s.bytes_used == 8192 && s.evictions == 0);
  for (uint64_t i = 1; i < 10; i++)
    CHECK_OK(dt_write_len(d, i, 4096));
  s = dt_stats(d);
  CHECK(s.evictions == 0 && s.blocks == 10 && s.bytes_used == s.capacity_bytes);
  for (uint64_t i = 0; i < 10; i++)
    CHECK_OK(dt_read_len(d, i, 4096));
  oi__disk_close(d);
  dt_rmtree(a);
}

/* EIO and short reads drop the block (durably); EAGAIN keeps it. */
static void test_read_errors(void) {
  char *a = dt_mkdtemp();
  oi_disk *d = open1(a, 1 * MiB, 0);
  for (uint64_t i = 0; i < 4; i++)
    CHECK_OK(dt_write(d, i));
  REQUIRE(oi__fault_arm(OI_FAULT_DISK_READ, 0, 1, 0) == OI_OK);
  CHECK_ST(dt_read(d, 0), OI_ERR_IO);
  CHECK(!dt_has(d, 0));
  REQUIRE(oi__fault_arm(OI_FAULT_DISK_READ, 0, 1, EAGAIN) == OI_OK);
  CHECK_ST(dt_read(d, 1), OI_ERR_IO);
  CHECK(dt_has(d, 1));
  CHECK_OK(dt_read(d, 1));
  REQUIRE(oi__fault_arm(OI_FAULT_DISK_SHORT_READ, 0, 1, 0) == OI_OK);
  CHECK_ST(dt_read(d, 2), OI_ERR_IO);
  CHECK(oi__fault_fired(OI_FAULT_DISK_SHORT_READ) == 1);
  CHECK(!dt_has(d, 2));
  oi__fault_disarm_all();
  oi_disk_stats s = dt_stats(d);
  CHECK(s.reads_failed == 3 && s.reads_ok == 1 && s.checksum_failures == 0 && s.blocks == 2);
  oi__disk_close(d);
  d = open1(a, 1 * MiB, 0);
  CHECK(!dt_has(d, 0) && dt_has(d, 1) && !dt_has(d, 2) && dt_has(d, 3));
  CHECK_OK(dt_read(d, 3));
  oi__disk_close(d);
  dt_rmtree(a);
}

static void test_no_room_at_open(void) {
  char *a = dt_mkdtemp();
  const char *dirs[] = {a};
  oi_disk_options o = {.dirs = dirs, .num_dirs = 1, .capacity_bytes = 1 * MiB};
  oi_disk *d = NULL;
  REQUIRE(oi__fault_arm(OI_FAULT_DISK_FALLOCATE, 0, 1, 0) == OI_OK);
  CHECK_ST(oi__disk_open(&o, &d), OI_ERR_OUT_OF_MEMORY);
  CHECK(d == NULL);
  CHECK(strstr(oi_last_error(), "no room") && strstr(oi_last_error(), a));
  /* a data file the refused open created is not left behind */
  char *data = dt_path(a, "openinfer-disk.data");
  CHECK(dt_file_size(data) == -1);
  REQUIRE(oi__fault_arm(OI_FAULT_DISK_FALLOCATE, 0, 1, EIO) == OI_OK);
  CHECK_ST(oi__disk_open(&o, &d), OI_ERR_IO);
  CHECK(dt_file_size(data) == -1);
  oi__fault_disarm_all();
  CHECK_OK(oi__disk_open(&o, &d));
  oi__disk_close(d);
  /* an existing data file (1 MiB) refused a larger size: cut back to its own */
  o.capacity_bytes = 2 * MiB;
  REQUIRE(oi__fault_arm(OI_FAULT_DISK_FALLOCATE, 0, 1, 0) == OI_OK);
  CHECK_ST(oi__disk_open(&o, &d), OI_ERR_OUT_OF_MEMORY);
  CHECK(dt_file_size(data) == (off_t)(1 * MiB));
  oi__fault_disarm_all();
  free(data);
  dt_rmtree(a);
}

/* A block being read is not evicted, and a removed one keeps its room until
 * the read ends: the read still returns its own bytes. */
static void test_reads_hold_their_blocks(void) {
  char *a = dt_mkdtemp();
  oi_disk *d = open1(a, 4 * 8192, 0);
  for (uint64_t i = 0; i < 4; i++)
    CHECK_OK(dt_write_len(d, i, 4096));
  uint8_t *buf = aligned_alloc(4096, 4096);
  REQUIRE(buf);
  oi_tier_key k0 = dt_key(0);

  /* 0 is the least recently used: being read, 1 goes instead. */
  REQUIRE(oi__fault_arm(OI_FAULT_DISK_READ_SLOW, 0, 1, 1000) == OI_OK);
  dt_wait r;
  dt_wait_init(&r);
  memset(buf, 0xEE, 4096);
  CHECK_OK(oi__disk_read(d, &k0, buf, 4096, dt_cb, &r));
  uint8_t *p4 = dt_payload(4, 4096);
  oi_tier_key k4 = dt_key(4);
  dt_wait w;
  dt_wait_init(&w);
  CHECK_OK(oi__disk_write(d, &k4, p4, 4096, dt_cb, &w));
  CHECK(!dt_wait_finished(&r));                          /* (the read was still in flight) */
  CHECK(dt_has(d, 0) && !dt_has(d, 1) && !dt_has(d, 4)); /* 4: being written */
  CHECK_OK(dt_wait_done(&r));
  CHECK(dt_check(buf, 0, 4096));
  CHECK_OK(dt_wait_done(&w));
  CHECK(dt_has(d, 4));
  free(p4);

  /* LRU now 2, 3, 0, 4. Remove 0 while it is read; a write needing room
   * then evicts 2 rather than reuse 0's place. */
  REQUIRE(oi__fault_arm(OI_FAULT_DISK_READ_SLOW, 0, 1, 1000) == OI_OK);
  dt_wait_init(&r);
  memset(buf, 0xEE, 4096);
  CHECK_OK(oi__disk_read(d, &k0, buf, 4096, dt_cb, &r));
  CHECK_OK(oi__disk_remove(d, &k0));
  CHECK(!dt_has(d, 0));
  uint8_t *p5 = dt_payload(5, 4096);
  oi_tier_key k5 = dt_key(5);
  dt_wait_init(&w);
  CHECK_OK(oi__disk_write(d, &k5, p5, 4096, dt_cb, &w));
  CHECK(!dt_wait_finished(&r));
  CHECK(!dt_has(d, 2) && dt_has(d, 3));
  CHECK_OK(dt_wait_done(&r));
  CHECK(dt_check(buf, 0, 4096)); /* its own bytes, not block 5's */
  CHECK_OK(dt_wait_done(&w));
  CHECK(dt_has(d, 5) && !dt_has(d, 0));
  free(p5);
  /* The read ended: 0's room is free, a new block needs no eviction. */
  uint64_t ev = dt_stats(d).evictions;
  CHECK(ev == 2);
  CHECK_OK(dt_write_len(d, 6, 4096));
  CHECK(dt_stats(d).evictions == ev);
  for (uint64_t i = 3; i < 7; i++)
    CHECK_OK(dt_read_len(d, i, 4096));
  CHECK(dt_stats(d).bytes_used == dt_stats(d).capacity_bytes);
  oi__disk_close(d);
  free(buf);
  dt_rmtree(a);
}

/* Writes from a read's callback (the completion thread, which may not wait
 * for a slot): the first takes the slot the read gave back, the second
 * finds the queue full. */
typedef struct cb_writes {
  oi_disk *d;
  uint8_t *p8, *p9;
  oi_status st8, st9;
  dt_wait w8;
  dt_wait read;
} cb_writes;

static void writes_from_callback(void *ctx, oi_status st) {
  cb_writes *c = ctx;
  oi_tier_key k8 = dt_key(8), k9 = dt_key(9);
  c->st8 = oi__disk_write(c->d, &k8, c->p8, dt_len(8), dt_cb, &c->w8);
  c->st9 = oi__disk_write(c->d, &k9, c->p9, dt_len(9), NULL, NULL);
  dt_cb(&c->read, st);
}

static double mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* A full queue: a write waits for a slot, as a read does, and is written
 * (dropping it would leave the pool's copy the only one, lost at a clean
 * restart); from a callback, which may not wait, it is refused and
 * counted. */
static void test_queue_full(void) {
  char *a = dt_mkdtemp();
  oi_disk *d = open1(a, 1 * MiB, 2);
  for (uint64_t i = 0; i < 2; i++)
    CHECK_OK(dt_write(d, i));
  REQUIRE(oi__fault_arm(OI_FAULT_DISK_READ_SLOW, 0, 2, 300) == OI_OK);
  uint8_t *b0 = aligned_alloc(4096, 8192), *b1 = aligned_alloc(4096, 8192);
  REQUIRE(b0 && b1);
  oi_tier_key k0 = dt_key(0), k1 = dt_key(1);
  dt_wait r0, r1;
  dt_wait_init(&r0);
  dt_wait_init(&r1);
  CHECK_OK(oi__disk_read(d, &k0, b0, 8192, dt_cb, &r0));
  CHECK_OK(oi__disk_read(d, &k1, b1, 8192, dt_cb, &r1));
  double t0 = mono_ms();
  CHECK_OK(dt_write(d, 7)); /* both slots held by slow reads: it waits for one */
  double waited = mono_ms() - t0;
  CHECK(waited >= 250);
  CHECK_OK(dt_wait_done(&r0));
  CHECK_OK(dt_wait_done(&r1));
  CHECK(dt_check(b0, 0, dt_len(0)) && dt_check(b1, 1, dt_len(1)));
  CHECK_OK(dt_read(d, 7));
  CHECK(dt_stats(d).spills_busy == 0);

  /* From a callback: one slot free (the other held by a slow read). */
  REQUIRE(oi__fault_arm(OI_FAULT_DISK_READ_SLOW, 0, 2, 300) == OI_OK);
  cb_writes c = {.d = d, .p8 = dt_payload(8, dt_len(8)), .p9 = dt_payload(9, dt_len(9))};
  dt_wait_init(&c.w8);
  dt_wait_init(&c.read);
  CHECK_OK(oi__disk_read(d, &k0, b0, 8192, writes_from_callback, &c));
  CHECK_OK(oi__disk_read(d, &k1, b1, 8192, dt_cb, &r1));
  CHECK_OK(dt_wait_done(&c.read));
  CHECK_OK(c.st8);
  CHECK_ST(c.st9, OI_ERR_BUSY);
  CHECK_OK(dt_wait_done(&c.w8));
  CHECK_OK(dt_wait_done(&r1));
  CHECK(dt_stats(d).spills_busy == 1);
  CHECK_OK(dt_read(d, 8));
  CHECK(!dt_has(d, 9));
  oi__fault_disarm_all();
  CHECK_OK(dt_write(d, 9));
  CHECK_OK(dt_read(d, 9));
  oi__disk_close(d);
  free(c.p8);
  free(c.p9);
  free(b0);
  free(b1);
  dt_rmtree(a);
}

static uint64_t file_size(const char *dir, const char *name) {
  char *p = dt_path(dir, name);
  off_t n = dt_file_size(p);
  REQUIRE(n >= 0);
  free(p);
  return (uint64_t)n;
}

/* Reopens dir: `want` blocks, nothing cut or dropped, keys [0, want) byte-exact. */
static void reopen_holds(const char *dir, uint64_t want) {
  const char *dirs[] = {dir};
  oi_disk *d = dt_open(dirs, 1, 4 * MiB, 0);
  oi_disk_stats s = dt_stats(d);
  CHECK(s.blocks == want && s.torn_records_cut == 0 && s.bad_extents_dropped == 0);
  for (uint64_t i = 0; i < want; i++)
    CHECK_OK(dt_read(d, i));
  oi__disk_close(d);
}

/* An append to the log that fails (EIO) or writes part of its record: the
 * block is still written and served, the torn record is cut off the log,
 * and a checkpoint is taken at once (the log no longer names every block):
 * after it the log is its header alone, and a reopen finds every block. */
static void test_log_append_fails(void) {
  char *a = dt_mkdtemp();
  const char *dirs[] = {a};
  oi_disk *d = dt_open(dirs, 1, 4 * MiB, 0);
  for (uint64_t i = 0; i < 3; i++)
    CHECK_OK(dt_write(d, i));
  CHECK(file_size(a, "openinfer-disk.log") == 4 * OI_DISK_RECORD_BYTES);
  uint64_t ckpts = dt_stats(d).checkpoints;
  REQUIRE(oi__fault_arm(OI_FAULT_DISK_LOG_WRITE, 0, 1, 0) == OI_OK);
  CHECK_OK(dt_write(d, 3));
  CHECK(oi__fault_fired(OI_FAULT_DISK_LOG_WRITE) == 1);
  CHECK(dt_has(d, 3));
  CHECK(dt_stats(d).checkpoints == ckpts + 1);
  CHECK(file_size(a, "openinfer-disk.log") == OI_DISK_RECORD_BYTES);
  /* 30 bytes of the record land: cut back to whole records, then the
   * checkpoint. */
  REQUIRE(oi__fault_arm(OI_FAULT_DISK_LOG_WRITE, 0, 1, 30) == OI_OK);
  CHECK_OK(dt_write(d, 4));
  CHECK(oi__fault_fired(OI_FAULT_DISK_LOG_WRITE) == 1);
  CHECK(dt_stats(d).checkpoints == ckpts + 2);
  CHECK(file_size(a, "openinfer-disk.log") == OI_DISK_RECORD_BYTES);
  CHECK_OK(dt_write(d, 5)); /* appended as usual again */
  CHECK(file_size(a, "openinfer-disk.log") == 2 * OI_DISK_RECORD_BYTES);
  for (uint64_t i = 0; i < 6; i++)
    CHECK_OK(dt_read(d, i));
  oi__disk_close(d);
  oi__fault_disarm_all();
  reopen_holds(a, 6);
  dt_rmtree(a);
}

/* Each fsync and fdatasync of the store failing (disk_sync): an explicit
 * sync, and a checkpoint at each of its four steps (the data file, the new
 * checkpoint, the directory, the log's reset). Each call fails OI_ERR_IO
 * naming what failed; the store keeps serving, and after the fault a
 * checkpoint succeeds and a reopen finds every block byte-exact. */
static void test_sync_fails(void) {
  char *a = dt_mkdtemp();
  const char *dirs[] = {a};
  oi_disk *d = dt_open(dirs, 1, 4 * MiB, 0);
  for (uint64_t i = 0; i < 4; i++)
    CHECK_OK(dt_write(d, i));
  REQUIRE(oi__fault_arm(OI_FAULT_DISK_SYNC, 0, 1, 0) == OI_OK);
  CHECK_ST(oi__disk_sync(d), OI_ERR_IO);
  CHECK(strstr(oi_last_error(), "disk_sync") && strstr(oi_last_error(), a) &&
        strstr(oi_last_error(), "Input/output error"));
  REQUIRE(oi__fault_arm(OI_FAULT_DISK_SYNC, 1, 1, ENOSPC) == OI_OK); /* the log's */
  CHECK_ST(oi__disk_sync(d), OI_ERR_IO);
  CHECK(strstr(oi_last_error(), "No space left"));
  const char *step[] = {"fdatasync", "openinfer-disk.ckpt.tmp", "fsync", "resetting"};
  for (uint64_t k = 0; k < 4; k++) {
    REQUIRE(oi__fault_arm(OI_FAULT_DISK_SYNC, k, 1, 0) == OI_OK);
    CHECK_ST(oi__disk_checkpoint(d), OI_ERR_IO);
    CHECK(oi__fault_fired(OI_FAULT_DISK_SYNC) == 1);
    if (!strstr(oi_last_error(), step[k])) {
      fprintf(stderr, "step %llu: %s\n", (unsigned long long)k, oi_last_error());
      CHECK(false);
    }
    CHECK_OK(dt_read(d, k));
  }
  oi__fault_disarm_all();
  CHECK_OK(oi__disk_sync(d));
  CHECK_OK(oi__disk_checkpoint(d));
  CHECK(file_size(a, "openinfer-disk.log") == OI_DISK_RECORD_BYTES);
  CHECK_OK(dt_write(d, 4));
  oi__disk_close(d);
  reopen_holds(a, 5);
  dt_rmtree(a);
}

static uint8_t *slurp(const char *dir, const char *name, size_t *n) {
  char *p = dt_path(dir, name);
  uint8_t *b = dt_slurp(p, n);
  free(p);
  return b;
}

static void spit(const char *dir, const char *name, const uint8_t *b, size_t n) {
  char *p = dt_path(dir, name);
  dt_spit(p, b, n);
  free(p);
}

/* A checkpoint that fails after its file was renamed into place (the
 * directory's fsync fails, the log's reset fails to sync, or to write its
 * header, and the next append's header write as well), then a block written
 * and synced, then a crash (the log and checkpoint as they were after the
 * sync, the close's checkpoint undone): the synced block is found after
 * the reopen, with the blocks before it. (Before the fix the log kept the
 * old generation, or its old length after a reset, and the block was lost:
 * the log was discarded as older than the checkpoint, or cut at a hole.) */
static void test_crash_after_a_failed_checkpoint(void) {
  for (uint64_t step = 2; step < 6; step++) {
    char *a = dt_mkdtemp();
    const char *dirs[] = {a};
    oi_disk *d = dt_open(dirs, 1, 4 * MiB, 0);
    for (uint64_t i = 0; i < 4; i++)
      CHECK_OK(dt_write(d, i));
    if (step < 4)
      REQUIRE(oi__fault_arm(OI_FAULT_DISK_SYNC, step, 1, 0) == OI_OK);
    else /* step 5: the next append's header write fails too (a checkpoint follows) */
      REQUIRE(oi__fault_arm(OI_FAULT_DISK_LOG_WRITE, 0, step == 4 ? 1 : 2, 0) == OI_OK);
    CHECK_ST(oi__disk_checkpoint(d), OI_ERR_IO);
    CHECK(strstr(oi_last_error(), step == 2 ? "fsync" : "resetting"));
    uint64_t ckpts = dt_stats(d).checkpoints;
    CHECK_OK(dt_write(d, 4));
    CHECK(dt_stats(d).checkpoints == ckpts + (step == 5));
    oi__fault_disarm_all();
    CHECK_OK(oi__disk_sync(d));
    size_t nlog, nckpt;
    uint8_t *log = slurp(a, "openinfer-disk.log", &nlog);
    uint8_t *ckpt = slurp(a, "openinfer-disk.ckpt", &nckpt);
    oi__disk_close(d);
    spit(a, "openinfer-disk.log", log, nlog);
    spit(a, "openinfer-disk.ckpt", ckpt, nckpt);
    d = dt_open(dirs, 1, 4 * MiB, 0);
    oi_disk_stats s = dt_stats(d);
    if (s.blocks != 5 || s.torn_records_cut != 0) {
      fprintf(stderr, "step %llu: %llu blocks, %llu cut after the crash\n",
              (unsigned long long)step, (unsigned long long)s.blocks,
              (unsigned long long)s.torn_records_cut);
      CHECK(false);
    }
    for (uint64_t i = 0; i < 5; i++)
      CHECK_OK(dt_read(d, i));
    oi__disk_close(d);
    free(log);
    free(ckpt);
    dt_rmtree(a);
  }
}

/* A file system without fallocate (disk_fallocate with EOPNOTSUPP): the data
 * file is extended sparse to its share and the store works. A log whose
 * torn tail cannot be cut durably at open (disk_sync): open refused
 * OI_ERR_IO naming the log; the next open finds the whole records. */
static void test_no_fallocate_and_an_unsyncable_log(void) {
  char *a = dt_mkdtemp();
  const char *dirs[] = {a};
  REQUIRE(oi__fault_arm(OI_FAULT_DISK_FALLOCATE, 0, 1, EOPNOTSUPP) == OI_OK);
  oi_disk *d = dt_open(dirs, 1, 1 * MiB, 0);
  CHECK(oi__fault_fired(OI_FAULT_DISK_FALLOCATE) == 1);
  CHECK(file_size(a, "openinfer-disk.data") == 1 * MiB);
  for (uint64_t i = 0; i < 3; i++)
    CHECK_OK(dt_write(d, i));
  for (uint64_t i = 0; i < 3; i++)
    CHECK_OK(dt_read(d, i));
  /* A crash's log: the three records, and half a fourth. */
  size_t nlog;
  uint8_t *log = slurp(a, "openinfer-disk.log", &nlog);
  REQUIRE(nlog == 4 * OI_DISK_RECORD_BYTES);
  oi__disk_close(d);
  char *ckpt = dt_path(a, "openinfer-disk.ckpt");
  unlink(ckpt);
  free(ckpt);
  uint8_t *torn = calloc(1, nlog + OI_DISK_RECORD_BYTES / 2);
  REQUIRE(torn);
  memcpy(torn, log, nlog);
  memset(torn + nlog, 0x77, OI_DISK_RECORD_BYTES / 2);
  spit(a, "openinfer-disk.log", torn, nlog + OI_DISK_RECORD_BYTES / 2);
  oi_disk_options o = {.dirs = dirs, .num_dirs = 1, .capacity_bytes = 1 * MiB};
  d = NULL;
  REQUIRE(oi__fault_arm(OI_FAULT_DISK_SYNC, 0, 1, 0) == OI_OK);
  CHECK_ST(oi__disk_open(&o, &d), OI_ERR_IO);
  CHECK(d == NULL && strstr(oi_last_error(), "truncating") &&
        strstr(oi_last_error(), "openinfer-disk.log"));
  oi__fault_disarm_all();
  /* (The failed open had cut the tail already, only its sync failed.) */
  d = dt_open(dirs, 1, 1 * MiB, 0);
  oi_disk_stats s = dt_stats(d);
  CHECK(s.blocks == 3 && s.torn_records_cut == 0);
  CHECK(file_size(a, "openinfer-disk.log") == 4 * OI_DISK_RECORD_BYTES);
  for (uint64_t i = 0; i < 3; i++)
    CHECK_OK(dt_read(d, i));
  oi__disk_close(d);
  free(torn);
  free(log);
  dt_rmtree(a);
}

/* Buffers registered while a read is in flight (disk_read_slow 300 ms):
 * the registration waits for the read to end (no new operation starts
 * meanwhile), then reads and writes go on, byte-exact. */
static void test_register_while_a_read_is_in_flight(void) {
  char *a = dt_mkdtemp();
  const char *dirs[] = {a};
  oi_disk *d = dt_open(dirs, 1, 1 * MiB, 0);
  CHECK_OK(dt_write_len(d, 0, 5000));
  uint8_t *buf = aligned_alloc(4096, 8192);
  REQUIRE(buf);
  REQUIRE(oi__fault_arm(OI_FAULT_DISK_READ_SLOW, 0, 1, 300) == OI_OK);
  oi_tier_key k = dt_key(0);
  dt_wait w;
  dt_wait_init(&w);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  CHECK_OK(oi__disk_read(d, &k, buf, 8192, dt_cb, &w));
  CHECK_OK(oi__disk_register_buffers(d, NULL, 0));
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
  CHECK(ms >= 290);
  CHECK_OK(dt_wait_done(&w));
  CHECK(dt_check(buf, 0, 5000));
  CHECK(oi__fault_fired(OI_FAULT_DISK_READ_SLOW) == 1);
  oi__fault_disarm_all();
  CHECK_OK(dt_write_len(d, 1, 7000));
  CHECK_OK(dt_read_len(d, 1, 7000));
  CHECK_OK(dt_read_len(d, 0, 5000));
  free(buf);
  oi__disk_close(d);
  dt_rmtree(a);
}

int main(void) {
  if (!oi__fault_available()) TEST_SKIP("built without -Dfault_injection=true");
  unsetenv("OI_FAULTS");
  oi__fault_disarm_all();
  oi_set_log_level(OI_LOG_ERROR);
  RUN_TEST(test_write_errors);
  RUN_TEST(test_read_errors);
  RUN_TEST(test_no_room_at_open);
  RUN_TEST(test_reads_hold_their_blocks);
  RUN_TEST(test_queue_full);
  RUN_TEST(test_log_append_fails);
  RUN_TEST(test_sync_fails);
  RUN_TEST(test_crash_after_a_failed_checkpoint);
  RUN_TEST(test_no_fallocate_and_an_unsyncable_log);
  RUN_TEST(test_register_while_a_read_is_in_flight);
  TEST_EXIT();
}
