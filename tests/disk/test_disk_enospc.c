/* The disk tier on a file system that is really full: a 4 MiB tmpfs mounted
 * in a private mount namespace (a forked child enters one: unshare with
 * CLONE_NEWNS, plus CLONE_NEWUSER when not root; skipped with exit 77 when
 * the kernel or the sandbox refuses).
 *  (a) a capacity larger than the file system: attach fails with
 *      OI_ERR_OUT_OF_MEMORY naming the directory, and attaches nothing;
 *  (b) a capacity that fits, then a filler file takes the rest of the file
 *      system, so the index log cannot grow: the store enters its full
 *      state (one warning), a block whose record did not land is not kept,
 *      the rest are refused (counted), no ckpt.tmp is left by the stop;
 *      every block stored is served in this process and after a restart
 *      that is still full; with room again, spills resume in the same
 *      process within a second (one line), and after a restart all 120 are
 *      durable and byte-exact. */
#include <sched.h>
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <time.h>

#include "disk_util.h"
#include "openinfer/disk.h"
#include "openinfer/engine.h"

#define BLOCK 4096u
#define NBLK 120 /* 120 blocks of 8 KiB on disk: 960 KiB of a 1 MiB data file */
#define ARENA 256
#define LOAD_AT (ARENA - 1)

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static uint8_t byte_of(uint64_t b, uint64_t i) {
  uint64_t x = (b + 11) * 0x9E3779B97F4A7C15ull ^ i * 0xBF58476D1CE4E5B9ull;
  return (uint8_t)(x ^ (x >> 31));
}

static oi_block_hash hash_of(uint64_t b) { return tr_hash(b, 15, 0xE5); }

typedef struct rig {
  oi_host *h;
  oi_engine *e;
  uint8_t *mem;
  oi_arena_desc arena;
} rig;

static oi_host *host_new(void) {
  oi_host_options ho = tr_host_options(1 * MiB);
  ho.flags = OI_HOST_NO_PIN;
  oi_host *h = tr_host_new(&ho);
  return h;
}

static oi_status attach(oi_host *h, const char *dir, uint64_t cap) {
  oi_host_disk_options d;
  oi_host_disk_options_init(&d);
  const char *dirs[1] = {dir};
  d.dirs = dirs;
  d.num_dirs = 1;
  d.capacity_bytes = cap;
  return oi_host_attach_disk(h, &d);
}

static void engine_new(rig *r) {
  r->arena = tr_arena("kv", r->mem, ARENA, BLOCK);
  oi_engine_options eo = tr_engine_options("enospc", &r->arena, 1);
  r->e = tr_engine_new(r->h, &eo);
}

static bool rig_open(rig *r, const char *dir) {
  r->h = host_new();
  oi_status st = attach(r->h, dir, 1 * MiB);
  if (st != OI_OK) {
    fprintf(stderr, "attach on the full file system: %s: %s\n", oi_status_str(st), oi_last_error());
    oi_host_destroy(r->h);
    return false;
  }
  engine_new(r);
  return true;
}

static void rig_close(rig *r) {
  oi_engine_destroy(r->e);
  oi_host_destroy(r->h);
}

static oi_host_disk_stats dstats(rig *r) {
  oi_host_disk_stats s = {.struct_size = sizeof s};
  REQUIRE(oi_host_get_disk_stats(r->h, &s) == OI_OK);
  return s;
}

/* Saves blocks [0, NBLK) and waits until the spiller is done with them. */
static void save_all(rig *r) {
  int64_t ids[NBLK];
  oi_block_hash hs[NBLK];
  for (uint64_t b = 0; b < NBLK; b++) {
    ids[b] = (int64_t)b;
    hs[b] = hash_of(b);
    for (uint64_t i = 0; i < BLOCK; i++)
      r->mem[b * BLOCK + i] = byte_of(b, i);
  }
  oi_host_disk_stats s0 = dstats(r);
  CHECK_OK(tr_save(r->e, ids, hs, NBLK, 10000));
  double t0 = now_s();
  for (;;) {
    oi_host_disk_stats s = dstats(r);
    uint64_t done = s.spills + s.spills_failed + s.spills_skipped + s.spills_refused_full -
                    (s0.spills + s0.spills_failed + s0.spills_skipped + s0.spills_refused_full);
    if (done >= NBLK || now_s() - t0 > 20) break;
    usleep(5000);
  }
}

/* Queries every block alone (waiting for its promotion) and checks the
 * bytes of each hit. @return the hits. */
static uint64_t hits_checked(rig *r) {
  uint64_t hits = 0;
  for (uint64_t b = 0; b < NBLK; b++) {
    oi_block_hash h = hash_of(b);
    oi_query_result q = {.struct_size = sizeof q, .wait_ms = 10000};
    CHECK_OK(oi_engine_query(r->e, NULL, &h, 1, OI_QUERY_WAIT_PENDING, &q));
    if (!q.hit_blocks) continue;
    hits++;
    int64_t dst = LOAD_AT;
    memset(r->mem + (uint64_t)LOAD_AT * BLOCK, 0, BLOCK);
    CHECK_OK(tr_load(r->e, q.lease, &dst, 1, 10000));
    bool ok = true;
    for (uint64_t i = 0; i < BLOCK; i++)
      ok &= r->mem[(uint64_t)LOAD_AT * BLOCK + i] == byte_of(b, i);
    if (!ok) fprintf(stderr, "block %llu: wrong bytes served\n", (unsigned long long)b);
    CHECK(ok);
  }
  return hits;
}

static void evict_pool(rig *r) {
  uint64_t n = 0;
  CHECK_OK(oi_host_evict_all(r->h, &n));
}

/* Fills the file system with `path`. @return the bytes written. */
static uint64_t fill(const char *path) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  REQUIRE(fd >= 0);
  static uint8_t buf[64 * 1024];
  memset(buf, 0x77, sizeof buf);
  uint64_t total = 0;
  for (size_t chunk = sizeof buf; chunk >= 512; chunk /= 2)
    for (;;) {
      ssize_t w = write(fd, buf, chunk);
      if (w <= 0) break;
      total += (uint64_t)w;
    }
  REQUIRE(errno == ENOSPC);
  close(fd);
  return total;
}

/* Warnings about the full state (entering it, leaving it), counted. */
static int full_lines;
static void on_log(void *ctx, oi_log_level level, const char *line) {
  (void)ctx;
  if (strstr(line, "the file system is full") || strstr(line, "room again")) full_lines++;
  if (level >= OI_LOG_WARN) fprintf(stderr, "%s\n", line);
}

static void test_full_file_system(const char *mnt) {
  oi_set_log_handler(on_log, NULL);
  char *dir = dt_path(mnt, "disk");
  char *filler = dt_path(mnt, "filler");

  /* (a) more than the file system holds: refused, nothing attached */
  oi_host *h = host_new();
  CHECK_ST(attach(h, dir, 64 * MiB), OI_ERR_OUT_OF_MEMORY);
  CHECK(strstr(oi_last_error(), dir) != NULL);
  oi_host_disk_stats s = {.struct_size = sizeof s};
  CHECK_ST(oi_host_get_disk_stats(h, &s), OI_ERR_NOT_FOUND);
  oi_host_destroy(h);

  /* (b) a capacity that fits; then the rest of the file system is taken:
   * the log cannot grow. The full state: one warning, spills stop. */
  rig r = {.mem = calloc(ARENA, BLOCK)};
  REQUIRE(r.mem);
  REQUIRE(rig_open(&r, dir));
  uint64_t filled = fill(filler);
  struct statvfs vfs;
  REQUIRE(statvfs(mnt, &vfs) == 0);
  fprintf(stderr, "  filler: %llu KiB; %llu blocks free\n", (unsigned long long)(filled / 1024),
          (unsigned long long)vfs.f_bavail);
  int full_lines0 = full_lines;
  save_all(&r);
  s = dstats(&r);
  fprintf(stderr,
          "  full: %llu spilled, %llu refused while full, %llu failed, %llu skipped, "
          "%llu stored; %d log lines\n",
          (unsigned long long)s.spills, (unsigned long long)s.spills_refused_full,
          (unsigned long long)s.spills_failed, (unsigned long long)s.spills_skipped,
          (unsigned long long)s.blocks, full_lines - full_lines0);
  CHECK(s.disk_full == 1 && s.full_events == 1);
  CHECK(full_lines - full_lines0 == 1); /* one line for the state, not one per block */
  CHECK(s.spills + s.spills_refused_full == NBLK);
  CHECK(s.spills_failed == 0 && s.spills_skipped == 0);
  CHECK(s.blocks == s.spills); /* only blocks whose records landed are kept */
  CHECK(s.spills_refused_full > 0);
  uint64_t stored = s.blocks;
  evict_pool(&r);
  s = dstats(&r);
  CHECK(s.lost_no_room == NBLK - stored); /* each refused block counted when the pool lets it go */
  uint64_t hits = hits_checked(&r);       /* served from the disk in this process */
  fprintf(stderr, "  full: %llu of %d hit in the same process\n", (unsigned long long)hits, NBLK);
  CHECK(hits == stored); /* every block the store holds comes back */
  rig_close(&r);
  char *tmp = dt_path(dir, "openinfer-disk.ckpt.tmp");
  CHECK(dt_file_size(tmp) == -1); /* the failed checkpoint at the stop left nothing */

  /* A restart with the file system still full: every block stored hits. */
  REQUIRE(rig_open(&r, dir));
  hits = hits_checked(&r);
  s = dstats(&r);
  fprintf(stderr, "  restart, still full: %llu of %d hit (%llu stored, %llu records cut)\n",
          (unsigned long long)hits, NBLK, (unsigned long long)s.blocks,
          (unsigned long long)s.torn_records_cut);
  CHECK(hits == stored && s.blocks == stored);
  CHECK(s.checksum_failures == 0 && s.torn_records_cut == 0);
  /* Saved again: the stored ones are there, the others refused (full). */
  evict_pool(&r);
  save_all(&r);
  s = dstats(&r);
  CHECK(s.disk_full == 1 && s.blocks == stored);
  /* Room again, in the same process: within a second spills resume. */
  REQUIRE(unlink(filler) == 0);
  usleep(1100 * 1000);
  full_lines0 = full_lines;
  evict_pool(&r);
  save_all(&r);
  s = dstats(&r);
  fprintf(stderr, "  room again: %llu stored, full %llu, %d log lines\n",
          (unsigned long long)s.blocks, (unsigned long long)s.disk_full, full_lines - full_lines0);
  CHECK(s.disk_full == 0 && s.full_events == 1 && s.blocks == NBLK);
  CHECK(full_lines - full_lines0 == 1); /* "room again" */
  rig_close(&r);
  CHECK(dt_file_size(tmp) == -1);
  free(tmp);

  /* A restart: every block durable, byte-exact. */
  REQUIRE(rig_open(&r, dir));
  CHECK(hits_checked(&r) == NBLK);
  rig_close(&r);
  free(r.mem);
  free(dir);
  free(filler);
}

static int write_proc(const char *path, const char *text) {
  int fd = open(path, O_WRONLY);
  if (fd < 0) return -1;
  ssize_t n = write(fd, text, strlen(text));
  close(fd);
  return n == (ssize_t)strlen(text) ? 0 : -1;
}

/* Enters a private mount namespace (and a user namespace when not root) and
 * mounts a 4 MiB tmpfs on `mnt`. @return 0, or 77 (skip) with a message. */
static int enter_small_fs(const char *mnt) {
  uid_t uid = geteuid();
  gid_t gid = getegid();
  if (unshare(CLONE_NEWNS | (uid ? CLONE_NEWUSER : 0)) != 0) {
    fprintf(stderr, "SKIP: unshare(CLONE_NEWNS%s): %s\n", uid ? "|CLONE_NEWUSER" : "",
            strerror(errno));
    return 77;
  }
  if (uid) {
    char map[64];
    snprintf(map, sizeof map, "0 %u 1\n", (unsigned)uid);
    bool ok = write_proc("/proc/self/setgroups", "deny") == 0 &&
              write_proc("/proc/self/uid_map", map) == 0;
    snprintf(map, sizeof map, "0 %u 1\n", (unsigned)gid);
    if (!ok || write_proc("/proc/self/gid_map", map) != 0) {
      fprintf(stderr, "SKIP: cannot map this user into a user namespace: %s\n", strerror(errno));
      return 77;
    }
  }
  if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) {
    fprintf(stderr, "SKIP: making the mounts private: %s\n", strerror(errno));
    return 77;
  }
  if (mount("tmpfs", mnt, "tmpfs", MS_NOSUID | MS_NODEV, "size=4m,mode=0700") != 0) {
    fprintf(stderr, "SKIP: mounting a tmpfs on %s: %s\n", mnt, strerror(errno));
    return 77;
  }
  return 0;
}

int main(void) {
  char *mnt = dt_mkdtemp();
  fflush(NULL);
  pid_t pid = fork(); /* the namespaces are the child's alone */
  REQUIRE(pid >= 0);
  if (pid == 0) {
    int rc = enter_small_fs(mnt);
    if (rc) _exit(rc);
    test_full_file_system(mnt);
    fprintf(stderr, "%-60s %s\n", "test_full_file_system", oi_test_failures ? "FAILED" : "ok");
    fflush(NULL);
    _exit(oi_test_failures ? 1 : 0);
  }
  int st;
  REQUIRE(waitpid(pid, &st, 0) == pid);
  rmdir(mnt); /* the tmpfs went with the child's namespace */
  free(mnt);
  if (WIFSIGNALED(st)) {
    fprintf(stderr, "the test's child died of signal %d\n", WTERMSIG(st));
    return 1;
  }
  return WEXITSTATUS(st);
}
