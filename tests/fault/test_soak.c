/* Soak: many clients and ranks over one real `openinfer serve`, random
 * operations and random kills for N seconds, every loaded byte checked.
 *
 * CLIENTS processes, each with RANKS engines (ranks) in one namespace, loop
 * over random saves (device blocks filled with the pattern of a logical
 * block: the hash names the pattern, so any rank can verify what any rank
 * saved), prefix queries, loads into random distinct blocks (each loaded
 * block is checked byte for byte), releases and flushes. The parent SIGKILLs
 * a random client every few hundred ms and starts a new one; with fault
 * injection compiled in, some new clients also reset their own connection at
 * a random send. At the end the server must be clean (no instance, no arena,
 * no shared memory), still serving, and stop with status 0.
 *
 * Length: --seconds N, or OI_SOAK_SECONDS (default 10; CI runs 60). The
 * figures go to stderr and, with OI_SOAK_REPORT=path, to that file. */
#include "fault_util.h"
#include "sidecar_util.h"

#include <sys/mman.h>

enum { CLIENTS = 4, RANKS = 2, LOGICAL = 96 };

typedef struct shared {
  atomic_uint_fast64_t ops, saves, queries, hits, loads, blocks_verified, bytes_verified, errors;
  atomic_uint_fast64_t mismatches, fatal_runs;
  char first_mismatch[256];
} shared;

static test_server ts;
static shared *sh;

/* The client's fatal handler runs on its reader thread when the connection
 * is lost with the arena mapped. It does not exit at once: the main thread
 * may be inside a call that races the loss, and an early _exit would cut its
 * sanitizer report (or hide it). The main thread sees the flag after its
 * current operation (every call fails fast now) and exits 42 itself; 43 if it
 * never gets there (a hang), which the parent counts as a failure. */
static atomic_bool fatal_seen;

static void fatal_park(void *ctx, const char *reason) {
  (void)ctx;
  (void)reason;
  atomic_fetch_add(&sh->fatal_runs, 1);
  atomic_store(&fatal_seen, true);
  usleep(10000000);
  _exit(43);
}

/* OI_SOAK_CHILD_CRASH=1 (the test that the soak fails when a client dies
 * of a signal): every client aborts after a few operations. */
static bool child_crash;

static uint64_t rng_next(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

static uint64_t layout_block_bytes(const oi_arena_desc *a) {
  uint64_t b = 0;
  for (int i = 0; i < TL_ARENAS; i++)
    b += a[i].segments * a[i].bytes_per_block;
  return b;
}

static void client_main(uint64_t seed) {
  signal(SIGPIPE, SIG_IGN);
  oi_set_fatal_handler(fatal_park, NULL);
  uint64_t rng = seed | 1;
  if (oi__fault_available() &&
      rng_next(&rng) % 4 == 0) /* a quarter reset themselves at some point */
    oi__fault_arm(OI_FAULT_SOCK_RESET, 20 + rng_next(&rng) % 400, 1, rng_next(&rng) % 16);
  oi_arena_desc a[RANKS][TL_ARENAS];
  oi_engine *e[RANKS];
  oi_imported_arena *ar[RANKS];
  uint8_t *base[RANKS];
  for (int r = 0; r < RANKS; r++) {
    oi_engine_options o;
    tl_options(&o, a[r], "soak");
    if (oi_engine_connect(ts.socket, &o, &e[r], &ar[r]) != OI_OK) _exit(2);
    base[r] = oi_imported_arena_ptr(ar[r]);
  }
  uint64_t bb = layout_block_bytes(a[0]);
  for (uint64_t n_ops = 0;; n_ops++) {
    if (atomic_load(&fatal_seen)) _exit(42);
    if (child_crash && n_ops == 20) abort();
    int r = (int)(rng_next(&rng) % RANKS);
    uint64_t op = rng_next(&rng) % 10;
    atomic_fetch_add(&sh->ops, 1);
    if (op < 4) { /* save 1..8 random logical blocks from random device blocks */
      size_t n = 1 + rng_next(&rng) % 8;
      int64_t ids[8];
      oi_block_hash hs[8];
      uint64_t start = rng_next(&rng) % TL_BLOCKS;
      for (size_t i = 0; i < n; i++) {
        uint64_t logical = rng_next(&rng) % LOGICAL;
        ids[i] = (int64_t)((start + i) % TL_BLOCKS);
        hs[i] = tl_hash(77, logical);
        tl_fill(base[r], a[r], ids[i], logical);
      }
      oi_ticket *t = NULL;
      if (oi_engine_save(e[r], ids, hs, n, NULL, &t) == OI_OK) {
        if (oi_ticket_wait(t, 30000) != OI_OK) atomic_fetch_add(&sh->errors, 1);
        oi_ticket_release(t);
      } else {
        atomic_fetch_add(&sh->errors, 1);
      }
      atomic_fetch_add(&sh->saves, 1);
    } else if (op < 8) { /* query a random run of logical blocks, load what hit */
      size_t n = 1 + rng_next(&rng) % 8;
      oi_block_hash hs[8];
      uint64_t logical[8], first = rng_next(&rng) % LOGICAL;
      for (size_t i = 0; i < n; i++) {
        logical[i] = (first + i) % LOGICAL;
        hs[i] = tl_hash(77, logical[i]);
      }
      oi_query_result q = {.struct_size = sizeof q};
      atomic_fetch_add(&sh->queries, 1);
      if (oi_engine_query(e[r], NULL, hs, n, 0, &q) != OI_OK) {
        atomic_fetch_add(&sh->errors, 1);
        continue;
      }
      if (q.hit_blocks == 0) continue;
      atomic_fetch_add(&sh->hits, q.hit_blocks);
      if (rng_next(&rng) % 8 == 0) { /* sometimes just let it go */
        oi_engine_release(e[r], q.lease);
        continue;
      }
      int64_t dst[8];
      uint64_t start = rng_next(&rng) % TL_BLOCKS;
      for (size_t i = 0; i < q.hit_blocks; i++)
        dst[i] = (int64_t)((start + i * 5) % TL_BLOCKS);
      oi_ticket *t = NULL;
      if (oi_engine_load(e[r], q.lease, dst, q.hit_blocks, NULL, &t) != OI_OK) {
        atomic_fetch_add(&sh->errors, 1);
        continue;
      }
      oi_status st = oi_ticket_wait(t, 30000);
      oi_ticket_release(t);
      if (st != OI_OK) {
        atomic_fetch_add(&sh->errors, 1);
        continue;
      }
      atomic_fetch_add(&sh->loads, 1);
      for (size_t i = 0; i < q.hit_blocks; i++) {
        if (!tl_check(base[r], a[r], dst[i], logical[i])) {
          if (atomic_fetch_add(&sh->mismatches, 1) == 0)
            snprintf(sh->first_mismatch, sizeof sh->first_mismatch,
                     "pid %d rank %d: device block %lld should hold logical %llu", (int)getpid(), r,
                     (long long)dst[i], (unsigned long long)logical[i]);
        } else {
          atomic_fetch_add(&sh->blocks_verified, 1);
          atomic_fetch_add(&sh->bytes_verified, bb);
        }
      }
    } else {
      if (oi_engine_flush(e[r], 30000) != OI_OK) atomic_fetch_add(&sh->errors, 1);
    }
  }
}

/* A client that ended on its own must have ended through its fatal handler
 * (exit 42, after resetting its own connection); any other status (a
 * signal such as ASan's abort, TSan's exit 66, a failed connect) fails. */
static uint64_t bad_exits;

static void check_own_end(pid_t pid, int status) {
  if (WIFEXITED(status) && WEXITSTATUS(status) == 42) return;
  bad_exits++;
  if (WIFSIGNALED(status))
    fprintf(stderr, "soak: client %d died of signal %d (%s)\n", (int)pid, WTERMSIG(status),
            strsignal(WTERMSIG(status)));
  else if (WIFEXITED(status))
    fprintf(stderr, "soak: client %d exited with %d (only 42, its fatal handler, is expected)\n",
            (int)pid, WEXITSTATUS(status));
  else
    fprintf(stderr, "soak: client %d ended with wait status 0x%x\n", (int)pid, status);
}

/* Ends a client: its own end if it already ended, else SIGKILL. @return
 * whether it had ended on its own. */
static bool end_client(pid_t pid) {
  int status;
  if (waitpid(pid, &status, WNOHANG) == pid) {
    check_own_end(pid, status);
    return true;
  }
  kill(pid, SIGKILL);
  REQUIRE(waitpid(pid, &status, 0) == pid);
  if (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) return false;
  check_own_end(pid, status); /* it ended just before the kill */
  return true;
}

static pid_t spawn(uint64_t seed) {
  pid_t p = fork();
  REQUIRE(p >= 0);
  if (p == 0) {
    client_main(seed);
    _exit(0);
  }
  return p;
}

int main(int argc, char **argv) {
  if (argc < 2) TEST_SKIP("usage: test_soak OPENINFER_EXE [--seconds N]");
  unsetenv("OI_FAULTS");
  if (oi__fault_available()) {
    oi__fault_arm(OI_FAULT_HOST_ALLOC, 0, 0, 0);
    oi__fault_disarm_all();
  }
  const char *crash = getenv("OI_SOAK_CHILD_CRASH");
  child_crash = crash && !strcmp(crash, "1");
  double seconds = 10;
  const char *env = getenv("OI_SOAK_SECONDS");
  if (env && *env) seconds = atof(env);
  for (int i = 2; i + 1 < argc; i++)
    if (!strcmp(argv[i], "--seconds")) seconds = atof(argv[i + 1]);
  sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  REQUIRE(sh != MAP_FAILED);
  memset(sh, 0, sizeof *sh);
  ts_init(&ts, argv[1]);
  const char *extra[] = {"--log-level", "warn", NULL};
  REQUIRE(ts_start(&ts, extra));

  uint64_t rng = 0x9E3779B97F4A7C15ull ^ (uint64_t)getpid();
  pid_t kids[CLIENTS];
  for (int i = 0; i < CLIENTS; i++)
    kids[i] = spawn(rng_next(&rng));
  uint64_t kills = 0, exits = 0, respawns = 0;
  uint64_t t0 = oi__now_ns(), end = t0 + (uint64_t)(seconds * 1e9);
  while (oi__now_ns() < end) {
    usleep((useconds_t)(100000 + rng_next(&rng) % 400000));
    int k = (int)(rng_next(&rng) % CLIENTS);
    if (end_client(kids[k]))
      exits++; /* it ended on its own (its own reset, then its fatal handler) */
    else
      kills++;
    kids[k] = spawn(rng_next(&rng));
    respawns++;
    CHECK(kill(ts.pid, 0) == 0); /* the server lives */
    if (atomic_load(&sh->mismatches)) break;
  }
  for (int i = 0; i < CLIENTS; i++)
    exits += end_client(kids[i]);
  CHECK(bad_exits == 0);
  double secs = (double)(oi__now_ns() - t0) / 1e9;

  /* The server is clean, serves, and stops cleanly. */
  check_server_clean(&ts);
  CHECK(atomic_load(&sh->mismatches) == 0);
  if (atomic_load(&sh->mismatches)) fprintf(stderr, "first mismatch: %s\n", sh->first_mismatch);
  CHECK(atomic_load(&sh->blocks_verified) > 0);
  CHECK(ts_stop(&ts));
  char line[512];
  snprintf(
      line, sizeof line,
      "soak: %.0f s, %d clients x %d ranks, %llu operations (%llu saves, %llu queries, %llu "
      "loads), %llu blocks / %llu bytes verified, %llu mismatches, %llu kills, %llu self-resets, "
      "%llu op errors (from kills and resets), %llu clients ended otherwise",
      secs, CLIENTS, RANKS, (unsigned long long)atomic_load(&sh->ops),
      (unsigned long long)atomic_load(&sh->saves), (unsigned long long)atomic_load(&sh->queries),
      (unsigned long long)atomic_load(&sh->loads),
      (unsigned long long)atomic_load(&sh->blocks_verified),
      (unsigned long long)atomic_load(&sh->bytes_verified),
      (unsigned long long)atomic_load(&sh->mismatches), (unsigned long long)kills,
      (unsigned long long)exits, (unsigned long long)atomic_load(&sh->errors),
      (unsigned long long)bad_exits);
  fprintf(stderr, "%s\n", line);
  const char *report = getenv("OI_SOAK_REPORT");
  if (report) {
    FILE *f = fopen(report, "w");
    if (f) {
      fprintf(f, "%s\n", line);
      fclose(f);
    }
  }
  if (oi_test_failures) ts_dump_log(&ts);
  ts_cleanup(&ts);
  TEST_EXIT();
}
