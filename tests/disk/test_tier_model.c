/* A random-operation model test of the disk tier under a host's pool,
 * through the public API (cpu backend), against a reference model.
 *
 * A universe of UNIVERSE block hashes; a block's bytes are a pure function
 * of its hash, so any hit has exactly one right content. The pool is small
 * (it evicts all the time); the disk holds the whole universe (it never
 * evicts). Operations, drawn from a seeded generator (the seed is printed;
 * OI_MODEL_SEED replays it, OI_MODEL_OPS sets their number, 100000 by
 * default):
 *  - save a run of 1..8 keys;
 *  - query (waiting for promotions), load what hit, check every byte;
 *  - membership query;
 *  - query and hold the lease across later operations; load it later;
 *  - evict the whole pool;
 *  - settle: wait until the spill queue is quiet, then every key the store
 *    lists becomes DURABLE in the model;
 *  - clean restart (a new host on the same directory): every block the pool
 *    or the disk held before must be on the disk after (destroy drains the
 *    spill queue);
 *  - crash: a forked child opens the directory, saves and settles keys,
 *    reports those it saw on disk through a pipe, and is SIGKILLed at a
 *    random moment (perhaps mid-spill); the parent reopens: every key the
 *    child confirmed is on disk and hits;
 *  - corruption: a payload byte of one stored block is flipped in the data
 *    file; that key may miss from then on, and is never served wrong.
 *
 * Model states: NEVER (never saved: never a hit, never present), SAVED (may
 * hit or miss), DURABLE (on the disk: present, and a leading run of DURABLE
 * keys must all hit: promotion brings them back), CORRUPT (its stored copy
 * is damaged: may miss, never upgraded by the store listing it until the
 * store dropped it). Every hit is checked byte for byte. */
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#include "disk/tier.h"
#include "disk_util.h"
#include "openinfer/disk.h"
#include "openinfer/engine.h"

enum {
  UNIVERSE = 3000,
  POOL_BLOCKS = 256,
  MAX_RUN = 8,
  MAX_QUERY = 12,
  MAX_LEASES = 4,
  STAGE = 0,                  /* arena blocks [0, MAX_RUN): what a save copies from */
  LOADS = MAX_RUN,            /* [LOADS, LOADS + MAX_QUERY): where loads land */
  ARENA = MAX_RUN + MAX_QUERY /* arena blocks */
};
#define DISK_CAPACITY (48 * MiB)
#define WAIT_MS 30000u
#define NS_NAME "model"

enum { K_NEVER, K_SAVED, K_DURABLE, K_CORRUPT };

static uint64_t g_seed;
static uint64_t g_op;      /* the operation being run (in failure messages) */
static int g_failed;       /* a model check failed: stop after this operation */
static uint64_t rng_s;     /* the generator's state */
static uint64_t g_block;   /* bytes of one block */
static uint8_t *g_content; /* UNIVERSE blocks: key k's bytes */
static uint8_t g_state[UNIVERSE];

#define MFAIL(...)                                                                                 \
  do {                                                                                             \
    fprintf(stderr, "model: seed %llu, op %llu: ", (unsigned long long)g_seed,                     \
            (unsigned long long)g_op);                                                             \
    fprintf(stderr, __VA_ARGS__);                                                                  \
    fprintf(stderr, " (last error: %s)\n", oi_last_error());                                       \
    g_failed = 1;                                                                                  \
    oi_test_failures++;                                                                            \
  } while (0)
#define MCHECK(cond, ...)                                                                          \
  do {                                                                                             \
    if (!(cond)) MFAIL(__VA_ARGS__);                                                               \
  } while (0)

static uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
static uint64_t rnd(void) { return mix64(rng_s++); }
static uint64_t below(uint64_t n) { return rnd() % n; }

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Key k's hash: k in the first 4 bytes, the rest follows from k (so a hash
 * the store lists decodes back to its key, or is foreign). */
static oi_block_hash hash_of(uint32_t k) {
  oi_block_hash h;
  uint64_t a = mix64(k ^ 0x6d6f64656cull), b = mix64(a);
  memcpy(h.bytes, &k, 4);
  memcpy(h.bytes + 4, &a, 4);
  memcpy(h.bytes + 8, &b, 8);
  return h;
}

/* @return the key of a hash, or -1 for one that is no key of the universe. */
static int64_t key_of(const uint8_t *hash) {
  uint32_t k;
  memcpy(&k, hash, 4);
  if (k >= UNIVERSE) return -1;
  oi_block_hash h = hash_of(k);
  return memcmp(h.bytes, hash, 16) == 0 ? (int64_t)k : -1;
}

static const uint8_t *content(uint32_t k) { return g_content + (uint64_t)k * g_block; }

/* ---- the system under test --------------------------------------------------------- */

typedef struct held {
  oi_lease lease;
  uint32_t keys[MAX_QUERY];
  uint64_t hits;
} held;

typedef struct rig {
  char *dir;
  uint8_t *mem;
  oi_arena_desc arena;
  oi_host *h;
  oi_engine *e;
  held leases[MAX_LEASES];
  int nleases;
} rig;

/* Counters (the summary line). */
static struct {
  uint64_t saves, queries, memberships, holds, held_loads, evicts, settles, restarts, crashes,
      crashes_mid_run, corruptions, hits, hit_blocks, queried_blocks, promotions, checksum_failures,
      confirmed_by_child, durable_max, requeried;
} g_n;

static void rig_open(rig *r) {
  oi_host_options ho = tr_host_options(POOL_BLOCKS * g_block);
  ho.flags = OI_HOST_NO_PIN;
  r->h = tr_host_new(&ho);
  oi_host_disk_options d;
  oi_host_disk_options_init(&d);
  const char *dirs[1] = {r->dir};
  d.dirs = dirs;
  d.num_dirs = 1;
  d.capacity_bytes = DISK_CAPACITY;
  REQUIRE(oi_host_attach_disk(r->h, &d) == OI_OK);
  r->arena = tr_arena("kv", r->mem, ARENA, g_block);
  oi_engine_options eo = tr_engine_options(NS_NAME, &r->arena, 1);
  r->e = tr_engine_new(r->h, &eo);
  r->nleases = 0;
}

static oi_host_disk_stats dstats(rig *r) {
  oi_host_disk_stats s = {.struct_size = sizeof s};
  REQUIRE(oi_host_get_disk_stats(r->h, &s) == OI_OK);
  return s;
}

static oi_host_disk_stats g_closed; /* the disk stats of the host closed last */

static void rig_close(rig *r) {
  REQUIRE(r->nleases == 0);
  oi_host_disk_stats s = dstats(r);
  g_closed = s;
  g_n.promotions += s.promotions;
  g_n.checksum_failures += s.checksum_failures;
  oi_engine_destroy(r->e);
  oi_host_destroy(r->h);
  r->e = NULL;
  r->h = NULL;
}

static void on_disk_fn(void *ctx, const oi_tier_key *key, uint64_t len) {
  uint8_t *on = ctx;
  int64_t k = key_of(key->hash);
  if (k < 0 || len != g_block) {
    on[UNIVERSE] = 1; /* a foreign block */
    return;
  }
  on[k] = 1;
}

/* on[k] = whether the store lists key k (on[UNIVERSE]: a foreign block). */
static void list_disk(oi_host *h, uint8_t *on) {
  memset(on, 0, UNIVERSE + 1);
  oi_disk *d = oi__disk_tier_store(oi__disk_tier_of(h));
  REQUIRE(d);
  oi__disk_foreach(d, on_disk_fn, on);
}

/* The model learns what the store holds: listed keys become DURABLE (a
 * never-saved one is a failure), a DURABLE key must be listed (the disk
 * never evicts here), a CORRUPT key that is gone was caught. */
static void learn_disk(rig *r) {
  uint8_t on[UNIVERSE + 1];
  list_disk(r->h, on);
  MCHECK(!on[UNIVERSE], "the store lists a block that is no key of the universe");
  uint64_t durable = 0;
  for (uint32_t k = 0; k < UNIVERSE; k++) {
    if (on[k]) {
      MCHECK(g_state[k] != K_NEVER, "the store lists key %u, never saved", k);
      if (g_state[k] == K_SAVED) g_state[k] = K_DURABLE;
    } else {
      MCHECK(g_state[k] != K_DURABLE, "durable key %u is no longer on the disk", k);
      if (g_state[k] == K_CORRUPT) g_state[k] = K_SAVED;
    }
    durable += g_state[k] == K_DURABLE;
  }
  if (durable > g_n.durable_max) g_n.durable_max = durable;
}

/* Waits until the spiller's counters stop moving (the queue is quiet). */
static void wait_quiet(rig *r) {
  uint64_t last = UINT64_MAX;
  int stable = 0;
  double t0 = now_s();
  while (stable < 5 && now_s() - t0 < 20) {
    oi_host_disk_stats s = dstats(r);
    uint64_t cur = s.spills + s.spills_failed + s.spills_skipped;
    stable = cur == last ? stable + 1 : 0;
    last = cur;
    usleep(1000);
  }
}

static void save_keys(rig *r, const uint32_t *keys, int n) {
  int64_t ids[MAX_RUN];
  oi_block_hash hs[MAX_RUN];
  for (int i = 0; i < n; i++) {
    ids[i] = STAGE + i;
    hs[i] = hash_of(keys[i]);
    memcpy(r->mem + (uint64_t)(STAGE + i) * g_block, content(keys[i]), g_block);
  }
  oi_ticket *t = NULL;
  oi_status st = oi_engine_save(r->e, ids, hs, (size_t)n, NULL, &t);
  MCHECK(st == OI_OK, "save: %s", oi_status_str(st));
  if (st != OI_OK) return;
  st = oi_ticket_wait(t, WAIT_MS);
  MCHECK(st == OI_OK, "save ticket: %s", oi_status_str(st));
  oi_ticket_release(t);
  for (int i = 0; i < n; i++)
    if (g_state[keys[i]] == K_NEVER) g_state[keys[i]] = K_SAVED;
}

/* Loads the lease's `hits` blocks into the load area and checks every byte. */
static void load_check(rig *r, oi_lease lease, const uint32_t *keys, uint64_t hits) {
  int64_t dst[MAX_QUERY];
  for (uint64_t i = 0; i < hits; i++)
    dst[i] = LOADS + (int64_t)i;
  memset(r->mem + LOADS * g_block, 0xA5, MAX_QUERY * g_block);
  oi_ticket *t = NULL;
  oi_status st = oi_engine_load(r->e, lease, dst, hits, NULL, &t);
  MCHECK(st == OI_OK, "load of %llu blocks: %s", (unsigned long long)hits, oi_status_str(st));
  if (st != OI_OK) return;
  st = oi_ticket_wait(t, WAIT_MS);
  MCHECK(st == OI_OK, "load ticket: %s", oi_status_str(st));
  oi_ticket_release(t);
  for (uint64_t i = 0; i < hits; i++)
    MCHECK(memcmp(r->mem + (LOADS + i) * g_block, content(keys[i]), g_block) == 0,
           "key %u (position %llu) loaded wrong bytes", keys[i], (unsigned long long)i);
}

/* One query that waits for promotions, checked against the model for
 * safety (hits form a prefix of saved keys). @return the hits, *durable the
 * leading run of DURABLE keys. */
static uint64_t query_once(rig *r, const uint32_t *keys, int n, oi_query_result *q, int *durable) {
  oi_block_hash hs[MAX_QUERY];
  for (int i = 0; i < n; i++)
    hs[i] = hash_of(keys[i]);
  *q = (oi_query_result){.struct_size = sizeof *q, .wait_ms = WAIT_MS};
  oi_status st = oi_engine_query(r->e, NULL, hs, (size_t)n, OI_QUERY_WAIT_PENDING, q);
  MCHECK(st == OI_OK, "query: %s", oi_status_str(st));
  if (st != OI_OK) return 0;
  MCHECK(q->hit_blocks <= (uint64_t)n, "query: %llu hits of %d", (unsigned long long)q->hit_blocks,
         n);
  if (q->hit_blocks > (uint64_t)n) q->hit_blocks = (uint64_t)n;
  for (uint64_t i = 0; i < q->hit_blocks; i++)
    MCHECK(g_state[keys[i]] != K_NEVER, "query: a hit for key %u, never saved", keys[i]);
  *durable = 0;
  while (*durable < n && g_state[keys[*durable]] == K_DURABLE)
    ++*durable;
  return q->hit_blocks;
}

/* A query, checked against the model; liveness: the leading run of DURABLE
 * keys all hit. A promotion reserves pool slots and may evict, and the
 * pool's eviction is approximately LRU (runs from one index shard's tail):
 * it can take blocks this very query hit or promoted a moment before. Such
 * a shortfall is asked again (counted); three in a row fail.
 * @return the hits (the lease pins them when > 0). */
static uint64_t query_checked(rig *r, const uint32_t *keys, int n, oi_lease *lease) {
  oi_query_result q;
  int durable = 0;
  uint64_t hits = 0;
  for (int attempt = 0;; attempt++) {
    hits = query_once(r, keys, n, &q, &durable);
    if (hits >= (uint64_t)durable || g_failed) break;
    if (attempt == 2) {
      oi_host_disk_stats s = dstats(r);
      MFAIL("query: %llu hits (%llu pending, state %u), but the first %d keys are on the disk "
            "(first missed: key %u; disk: %llu blocks, %llu promotions, %llu failed, %llu "
            "checksum failures)",
            (unsigned long long)hits, (unsigned long long)q.pending_blocks, q.state, durable,
            keys[hits], (unsigned long long)s.blocks, (unsigned long long)s.promotions,
            (unsigned long long)s.promote_failed, (unsigned long long)s.checksum_failures);
      break;
    }
    g_n.requeried++;
    if (hits) load_check(r, q.lease, keys, hits); /* consumes the lease */
  }
  g_n.queries++;
  g_n.queried_blocks += (uint64_t)n;
  g_n.hit_blocks += hits;
  if (hits) g_n.hits++;
  *lease = q.lease;
  return hits;
}

/* Keys for a save or a query: a run of consecutive keys (mostly), or
 * distinct keys drawn at random. */
static int pick_keys(uint32_t *keys, int max) {
  int n = 1 + (int)below((uint64_t)max);
  if (below(4)) {
    uint32_t s = (uint32_t)below(UNIVERSE - (uint64_t)n + 1);
    for (int i = 0; i < n; i++)
      keys[i] = s + (uint32_t)i;
    return n;
  }
  for (int i = 0; i < n; i++) {
    uint32_t k;
    bool dup;
    do {
      k = (uint32_t)below(UNIVERSE);
      dup = false;
      for (int j = 0; j < i; j++)
        dup |= keys[j] == k;
    } while (dup);
    keys[i] = k;
  }
  return n;
}

static void op_query(rig *r) {
  uint32_t keys[MAX_QUERY];
  int n = pick_keys(keys, MAX_QUERY);
  oi_lease lease;
  uint64_t hits = query_checked(r, keys, n, &lease);
  if (hits) load_check(r, lease, keys, hits); /* the load consumes the lease */
}

static void op_membership(rig *r) {
  uint32_t keys[MAX_QUERY];
  int n = pick_keys(keys, MAX_QUERY);
  oi_block_hash hs[MAX_QUERY];
  uint8_t present[MAX_QUERY];
  for (int i = 0; i < n; i++)
    hs[i] = hash_of(keys[i]);
  memset(present, 7, sizeof present);
  oi_query_result q = {.struct_size = sizeof q, .present = present};
  oi_status st = oi_engine_query(r->e, NULL, hs, (size_t)n, OI_QUERY_MEMBERSHIP, &q);
  MCHECK(st == OI_OK, "membership: %s", oi_status_str(st));
  uint64_t count = 0;
  for (int i = 0; i < n; i++) {
    MCHECK(present[i] <= 1, "membership: present[%d] = %u", i, present[i]);
    count += present[i] == 1;
    if (g_state[keys[i]] == K_DURABLE)
      MCHECK(present[i] == 1, "membership: durable key %u absent", keys[i]);
    if (g_state[keys[i]] == K_NEVER)
      MCHECK(present[i] == 0, "membership: key %u present, never saved", keys[i]);
  }
  MCHECK(q.hit_blocks == count, "membership: hit_blocks %llu, %llu present",
         (unsigned long long)q.hit_blocks, (unsigned long long)count);
  g_n.memberships++;
}

static void op_load_held(rig *r, int i) {
  held *l = &r->leases[i];
  load_check(r, l->lease, l->keys, l->hits);
  r->leases[i] = r->leases[--r->nleases];
  g_n.held_loads++;
}

static void op_hold(rig *r) {
  if (r->nleases == MAX_LEASES) {
    op_load_held(r, (int)below(MAX_LEASES));
    return;
  }
  held *l = &r->leases[r->nleases];
  int n = pick_keys(l->keys, MAX_QUERY);
  l->hits = query_checked(r, l->keys, n, &l->lease);
  if (l->hits) {
    r->nleases++;
    g_n.holds++;
  }
}

static void load_all_held(rig *r) {
  while (r->nleases)
    op_load_held(r, r->nleases - 1);
}

static void op_evict(rig *r) {
  uint64_t n = 0;
  oi_status st = oi_host_evict_all(r->h, &n);
  MCHECK(st == OI_OK, "evict_all: %s", oi_status_str(st));
  g_n.evicts++;
}

static void op_settle(rig *r) {
  wait_quiet(r);
  learn_disk(r);
  g_n.settles++;
}

/* Before a host goes down: which SAVED keys does the pool or the disk hold?
 * (Destroy drains the spill queue: they must all be on the disk after.) */
static void held_before_close(rig *r, uint8_t *had) {
  memset(had, 0, UNIVERSE);
  for (uint32_t s = 0; s < UNIVERSE; s += MAX_QUERY) {
    uint32_t n = OI_MIN((uint32_t)MAX_QUERY, UNIVERSE - s);
    oi_block_hash hs[MAX_QUERY];
    uint8_t present[MAX_QUERY];
    for (uint32_t i = 0; i < n; i++)
      hs[i] = hash_of(s + i);
    oi_query_result q = {.struct_size = sizeof q, .present = present};
    MCHECK(oi_engine_query(r->e, NULL, hs, n, OI_QUERY_MEMBERSHIP, &q) == OI_OK,
           "membership before close");
    for (uint32_t i = 0; i < n; i++)
      had[s + i] = present[i] && g_state[s + i] == K_SAVED;
  }
}

static void check_kept(rig *r, const uint8_t *had, const char *what) {
  uint8_t on[UNIVERSE + 1];
  list_disk(r->h, on);
  uint64_t lost = 0;
  uint32_t first = 0;
  for (uint32_t k = 0; k < UNIVERSE; k++)
    if (had[k] && !on[k] && !lost++) first = k;
  const oi_host_disk_stats *c = &g_closed;
  MCHECK(lost == 0,
         "%s: %llu blocks the pool held are not on the disk (first: key %u; the closed host's "
         "disk: %llu blocks, %llu spills, %llu failed, %llu skipped, %llu overflow, %llu "
         "evictions, %llu checksum failures)",
         what, (unsigned long long)lost, first, (unsigned long long)c->blocks,
         (unsigned long long)c->spills, (unsigned long long)c->spills_failed,
         (unsigned long long)c->spills_skipped, (unsigned long long)c->spill_overflow,
         (unsigned long long)c->evictions, (unsigned long long)c->checksum_failures);
}

static void op_restart(rig *r) {
  load_all_held(r);
  static uint8_t had[UNIVERSE];
  held_before_close(r, had);
  rig_close(r);
  rig_open(r);
  check_kept(r, had, "clean restart");
  learn_disk(r);
  g_n.restarts++;
}

/* The child of a crash: saves runs of its keys, and after every few runs
 * reports the keys the store lists (uint32 each; UINT32_MAX when done);
 * then waits for its SIGKILL. Never returns. */
static void crash_child(rig *r, const uint32_t *keys, int n, int wfd) {
  rig_open(r);
  static uint8_t told[UNIVERSE];
  memset(told, 0, sizeof told);
  for (int at = 0, runs = 0; at < n; runs++) {
    int len = 1 + (int)below(MAX_RUN); /* one draw: OI_MIN evaluates its arguments twice */
    len = OI_MIN(len, n - at);
    save_keys(r, keys + at, len);
    at += len;
    if (runs % 3 == 2 || at == n) {
      if (at == n) wait_quiet(r);
      uint8_t on[UNIVERSE + 1];
      list_disk(r->h, on);
      for (uint32_t k = 0; k < UNIVERSE; k++)
        if (on[k] && !told[k]) {
          told[k] = 1;
          if (write(wfd, &k, sizeof k) != (ssize_t)sizeof k) _exit(3);
        }
    }
  }
  uint32_t done = UINT32_MAX;
  if (write(wfd, &done, sizeof done) != (ssize_t)sizeof done) _exit(3);
  for (;;)
    pause();
}

static void op_crash(rig *r) {
  load_all_held(r);
  static uint8_t had[UNIVERSE];
  held_before_close(r, had);
  rig_close(r); /* no host open across the fork */
  /* The child's keys: runs of keys, saved in the model now (they may hit). */
  static uint32_t keys[512];
  int n = 0;
  int runs = 4 + (int)below(40);
  for (int i = 0; i < runs && n + MAX_RUN <= (int)OI_ARRAY_LEN(keys); i++) {
    uint32_t s = (uint32_t)below(UNIVERSE - MAX_RUN);
    int len = 1 + (int)below(MAX_RUN);
    for (int j = 0; j < len; j++) {
      bool dup = false;
      for (int x = 0; x < n; x++)
        dup |= keys[x] == s + (uint32_t)j;
      if (!dup) keys[n++] = s + (uint32_t)j;
    }
  }
  for (int i = 0; i < n; i++)
    if (g_state[keys[i]] == K_NEVER) g_state[keys[i]] = K_SAVED;
  uint64_t delay_us = below(2) ? below(20000) : below(100000);
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  fflush(NULL);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    close(fds[0]);
    crash_child(r, keys, n, fds[1]);
  }
  close(fds[1]);
  usleep((useconds_t)delay_us);
  REQUIRE(kill(pid, SIGKILL) == 0);
  int wst;
  REQUIRE(waitpid(pid, &wst, 0) == pid);
  MCHECK(WIFSIGNALED(wst) && WTERMSIG(wst) == SIGKILL, "crash child ended otherwise (%d)", wst);
  static uint32_t confirmed[UNIVERSE];
  int nconf = 0;
  bool done = false;
  uint32_t k;
  while (read(fds[0], &k, sizeof k) == (ssize_t)sizeof k) {
    if (k == UINT32_MAX) {
      done = true;
      continue;
    }
    MCHECK(k < UNIVERSE && g_state[k] != K_NEVER, "crash child saw key %u on disk, never saved", k);
    if (k < UNIVERSE && nconf < UNIVERSE) confirmed[nconf++] = k;
  }
  close(fds[0]);
  rig_open(r);
  check_kept(r, had, "crash restart (what the parent's clean close left)");
  uint8_t on[UNIVERSE + 1];
  list_disk(r->h, on);
  for (int i = 0; i < nconf; i++)
    MCHECK(on[confirmed[i]] || g_state[confirmed[i]] == K_CORRUPT,
           "crash restart: key %u, confirmed on disk by the child, is gone", confirmed[i]);
  learn_disk(r);
  /* The confirmed keys hit, byte-exact (checked by query_checked as DURABLE). */
  for (int i = 0; i < nconf; i += MAX_QUERY) {
    int m = OI_MIN(MAX_QUERY, nconf - i);
    oi_lease lease;
    uint64_t hits = query_checked(r, confirmed + i, m, &lease);
    if (hits) load_check(r, lease, confirmed + i, hits);
  }
  g_n.crashes++;
  g_n.crashes_mid_run += !done;
  g_n.confirmed_by_child += (uint64_t)nconf;
}

/* Flips one payload byte of key k's block in the data file (every copy
 * whose header names k: stale copies too). @return the copies flipped. */
static int flip_stored(const char *dir, uint32_t k) {
  char *path = dt_path(dir, "openinfer-disk.data");
  int fd = open(path, O_RDWR);
  REQUIRE(fd >= 0);
  struct stat st;
  REQUIRE(fstat(fd, &st) == 0);
  oi_block_hash h = hash_of(k);
  enum { CHUNK = 1 << 20 };
  uint8_t *buf = malloc(CHUNK);
  REQUIRE(buf);
  int flipped = 0;
  for (off_t base = 0; base < st.st_size; base += CHUNK) {
    ssize_t got = pread(fd, buf, CHUNK, base);
    if (got <= 0) break;
    for (ssize_t o = 0; o + 4096 <= got; o += 4096) {
      uint64_t magic, len;
      memcpy(&magic, buf + o, 8);
      if (magic != OI_DISK_BLOCK_MAGIC || memcmp(buf + o + 24, h.bytes, 16) != 0) continue;
      memcpy(&len, buf + o + 48, 8);
      if (len == 0 || len > g_block) continue;
      off_t at = base + o + 4096 + (off_t)below(len);
      uint8_t b;
      REQUIRE(pread(fd, &b, 1, at) == 1);
      b ^= (uint8_t)(1u << below(8));
      REQUIRE(pwrite(fd, &b, 1, at) == 1);
      flipped++;
    }
  }
  REQUIRE(fdatasync(fd) == 0);
  close(fd);
  free(buf);
  free(path);
  return flipped;
}

static void op_corrupt(rig *r) {
  uint8_t on[UNIVERSE + 1];
  list_disk(r->h, on);
  uint32_t cand[UNIVERSE];
  int n = 0;
  for (uint32_t k = 0; k < UNIVERSE; k++)
    if (on[k] && g_state[k] != K_CORRUPT) cand[n++] = k;
  if (!n) return;
  uint32_t k = cand[below((uint64_t)n)];
  g_state[k] = K_CORRUPT; /* before the flip: from now on it may miss */
  MCHECK(flip_stored(r->dir, k) >= 1, "corrupt: key %u is listed but not in the data file", k);
  g_n.corruptions++;
}

/* Every key of the universe, queried in runs and loaded: hits are exact,
 * durable ones all hit. */
static void sweep(rig *r) {
  for (uint32_t s = 0; s < UNIVERSE && !g_failed; s += MAX_QUERY) {
    uint32_t keys[MAX_QUERY];
    int n = (int)OI_MIN((uint32_t)MAX_QUERY, UNIVERSE - s);
    for (int i = 0; i < n; i++)
      keys[i] = s + (uint32_t)i;
    oi_lease lease;
    uint64_t hits = query_checked(r, keys, n, &lease);
    if (hits) load_check(r, lease, keys, hits);
  }
}

static uint64_t env_u64(const char *name, uint64_t dflt) {
  const char *v = getenv(name);
  return v && *v ? strtoull(v, NULL, 0) : dflt;
}

static void test_model(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  g_seed = env_u64("OI_MODEL_SEED",
                   mix64((uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ (uint64_t)getpid()));
  uint64_t ops = env_u64("OI_MODEL_OPS", 100000);
  rng_s = g_seed;
  g_block = (g_seed >> 7) & 1 ? 5000 : 4096; /* 5000: the bounce-buffer path */
  fprintf(stderr, "model: seed %llu (OI_MODEL_SEED=%llu replays it), %llu ops, %llu-byte blocks\n",
          (unsigned long long)g_seed, (unsigned long long)g_seed, (unsigned long long)ops,
          (unsigned long long)g_block);
  g_content = malloc(UNIVERSE * g_block);
  REQUIRE(g_content);
  for (uint64_t k = 0; k < UNIVERSE; k++)
    for (uint64_t i = 0; i < g_block; i += 8) {
      uint64_t x = mix64(k * 0x100000001B3ull ^ i ^ 0xb10cull);
      memcpy(g_content + k * g_block + i, &x, OI_MIN(8, g_block - i));
    }
  rig r = {.dir = dt_mkdtemp()};
  r.mem = calloc(ARENA, g_block);
  REQUIRE(r.mem);
  rig_open(&r);
  double t0 = now_s();
  for (g_op = 0; g_op < ops && !g_failed; g_op++) {
    uint64_t x = below(10000);
    uint32_t keys[MAX_RUN];
    if (x < 3800) {
      int n = pick_keys(keys, MAX_RUN);
      save_keys(&r, keys, n);
      g_n.saves++;
    } else if (x < 6800) {
      op_query(&r);
    } else if (x < 7800) {
      op_membership(&r);
    } else if (x < 8400) {
      op_hold(&r);
    } else if (x < 8900) {
      if (r.nleases) op_load_held(&r, (int)below((uint64_t)r.nleases));
    } else if (x < 9400) {
      op_evict(&r);
    } else if (x < 9430) {
      op_settle(&r);
    } else if (x < 9433) {
      op_restart(&r);
    } else if (x < 9435) {
      op_crash(&r);
    } else if (x < 9440) {
      op_corrupt(&r);
    } else {
      op_query(&r);
    }
  }
  if (!g_failed) {
    load_all_held(&r);
    op_settle(&r);
    sweep(&r);
    op_restart(&r);
    sweep(&r);
  }
  load_all_held(&r);
  rig_close(&r);
  fprintf(stderr,
          "model: %llu ops in %.1f s: %llu saves, %llu queries (%llu with hits, %llu of %llu "
          "blocks hit), %llu memberships, %llu leases held (%llu loaded later), %llu evict_all, "
          "%llu settles, %llu restarts, %llu crashes (%llu mid-run, %llu keys confirmed by "
          "children), %llu corruptions (%llu caught by checksum), %llu promotions, %llu keys "
          "durable at most, %llu queries asked again\n",
          (unsigned long long)g_op, now_s() - t0, (unsigned long long)g_n.saves,
          (unsigned long long)g_n.queries, (unsigned long long)g_n.hits,
          (unsigned long long)g_n.hit_blocks, (unsigned long long)g_n.queried_blocks,
          (unsigned long long)g_n.memberships, (unsigned long long)g_n.holds,
          (unsigned long long)g_n.held_loads, (unsigned long long)g_n.evicts,
          (unsigned long long)g_n.settles, (unsigned long long)g_n.restarts,
          (unsigned long long)g_n.crashes, (unsigned long long)g_n.crashes_mid_run,
          (unsigned long long)g_n.confirmed_by_child, (unsigned long long)g_n.corruptions,
          (unsigned long long)g_n.checksum_failures, (unsigned long long)g_n.promotions,
          (unsigned long long)g_n.durable_max, (unsigned long long)g_n.requeried);
  free(r.mem);
  free(g_content);
  dt_rmtree(r.dir);
}

int main(void) {
  RUN_TEST(test_model);
  TEST_EXIT();
}
