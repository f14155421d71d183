/* The disk tier under a host's pool (tier.h): the spiller thread that
 * writes sealed blocks behind, promotion of stored blocks back into pool
 * slots, and the public attach and stats calls (openinfer/disk.h).
 *
 * Buffers: a pool slot whose address and block size are multiples of 4 KiB
 * is written from and read into directly (O_DIRECT, the ring's registered
 * buffers: no copy). Other blocks go through an aligned bounce buffer of
 * their own (a copy, counted nowhere but correct). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tier.h"

#define SPILL_BATCH 32
#define PROMOTE_WINDOW (16ull << 20) /* bytes of promotion reads in flight at most */

struct disk_tier {
  oi_host *host;
  oi_tier *link; /* in the host's chain */
  oi_disk *store;
  uint32_t queue_depth;
  uint32_t num_dirs;
  uint64_t share; /* data-file bytes per directory */

  pthread_t spiller;
  bool spiller_started;
  atomic_bool draining; /* destroy: write what is queued, then stop */
  atomic_bool stop;

  /* Spills in flight (at most queue_depth), under lock. */
  pthread_mutex_t lock;
  pthread_cond_t cv;
  uint32_t spills_in_flight;
  uint32_t promotions_in_flight;
  /* Promotion reads in prefix order: at most PROMOTE_WINDOW bytes are read
   * at once (the rest wait here, in order), so a restore's first blocks
   * arrive first and its loads overlap the reads still to come. */
  struct promote_op *pq_head, *pq_tail;
  uint64_t read_bytes_in_flight;

  atomic_uint_fast64_t spills, spills_failed, spills_skipped, promotions, promote_failed;
  atomic_bool warned_too_large; /* a block larger than a directory's share was logged */
};

static const oi_tier_ops disk_tier_ops;

disk_tier *oi__disk_tier_of(const oi_host *h) { return oi__host_tier_find(h, &disk_tier_ops); }

oi_disk *oi__disk_tier_store(disk_tier *t) { return t ? t->store : NULL; }

static uint64_t round_sector(uint64_t n) {
  return (n + OI_DISK_SECTOR - 1) / OI_DISK_SECTOR * OI_DISK_SECTOR;
}

/* Whether a pool slot at `p` of `slot` bytes can take O_DIRECT I/O of a
 * `len`-byte block itself: aligned, with room for the padding to a whole
 * sector (the host's sector slots, oi__host_sector_slots). */
static bool direct_ok(const void *p, uint64_t len, uint64_t slot) {
  return ((uintptr_t)p % OI_DISK_SECTOR) == 0 && slot >= round_sector(len);
}

static void in_flight_add(disk_tier *t, uint32_t *counter, int d) {
  pthread_mutex_lock(&t->lock);
  *counter = (uint32_t)((int)*counter + d);
  pthread_cond_broadcast(&t->cv);
  pthread_mutex_unlock(&t->lock);
}

/* ---- spills --------------------------------------------------------------------- */

typedef struct spill_op {
  disk_tier *t;
  oi_host_spill s;
  void *bounce;
} spill_op;

static void promote_pump(disk_tier *t);

static void spill_done(void *ctx, oi_status st) {
  spill_op *op = ctx;
  disk_tier *t = op->t;
  bool ok = st == OI_OK;
  if (ok)
    oi__host_spill_end(t->host, &op->s, 1, &ok);
  else /* an I/O error, or no room for its index record (the store is full) */
    oi__host_spill_end_unwritten(
        t->host, &op->s, st == OI_ERR_OUT_OF_MEMORY ? OI_SPILL_NO_ROOM : OI_SPILL_WRITE_FAILED);
  if (ok || st != OI_ERR_OUT_OF_MEMORY) /* (no room for its record: the store counts it) */
    atomic_fetch_add(ok ? &t->spills : &t->spills_failed, 1);
  oi__free(op->bounce);
  oi__free(op);
  in_flight_add(t, &t->spills_in_flight, -1);
  promote_pump(t); /* a slot of the store is free: a promotion refused BUSY may go */
}

static void spill_one(disk_tier *t, const oi_host_spill *s) {
  oi_tier_key key;
  uint64_t bb;
  oi_spill_fate why = OI_SPILL_UNWRITTEN;
  spill_op *op = NULL;
  if (!oi__tier_make_keys(t->host, s->ns, &s->hash, 1, &key, &bb) ||
      !(op = oi__calloc(1, sizeof *op)))
    goto skip;
  op->t = t;
  op->s = *s;
  const void *src = s->data;
  uint64_t slot = oi__host_slot_bytes(t->host, s->ns);
  if (direct_ok(s->data, s->bytes, slot)) {
    /* The padding goes to disk from the slot's tail: zeros, not whatever an
     * earlier block left there (the slot is this block's; loads never read
     * past its bytes). */
    memset((uint8_t *)s->data + s->bytes, 0, round_sector(s->bytes) - s->bytes);
  } else {
    op->bounce = oi__aligned_alloc(OI_DISK_SECTOR, round_sector(s->bytes));
    if (!op->bounce) goto skip;
    memset((uint8_t *)op->bounce + s->bytes, 0, round_sector(s->bytes) - s->bytes);
    memcpy(op->bounce, s->data, s->bytes);
    src = op->bounce;
  }
  /* A slot in flight: wait for room in the queue (the spiller alone waits). */
  pthread_mutex_lock(&t->lock);
  while (t->spills_in_flight >= t->queue_depth && !atomic_load(&t->stop))
    pthread_cond_wait(&t->cv, &t->lock);
  t->spills_in_flight++;
  pthread_mutex_unlock(&t->lock);
  oi_status st = oi__disk_write(t->store, &key, src, s->bytes, spill_done, op);
  if (st == OI_OK) return; /* spill_done runs (perhaps already ran: a stored key) */
  in_flight_add(t, &t->spills_in_flight, -1);
  if (st == OI_ERR_OUT_OF_MEMORY || st == OI_ERR_INVALID_ARGUMENT) why = OI_SPILL_NO_ROOM;
  if (st == OI_ERR_INVALID_ARGUMENT && !atomic_exchange(&t->warned_too_large, true))
    OI_LOG(OI_LOG_WARN, "disk",
           "blocks of %llu bytes do not fit the disk tier (%llu bytes a directory): not "
           "written (once; counted in lost_no_room when the pool evicts them)",
           (unsigned long long)s->bytes, (unsigned long long)t->share);
  else if (st != OI_ERR_BUSY)
    OI_LOG(OI_LOG_DEBUG, "disk", "spill not written: %s", oi_last_error());
  if (st == OI_ERR_OUT_OF_MEMORY && oi__disk_full(t->store)) { /* counted by the store */
    oi__free(op->bounce);
    oi__free(op);
    oi__host_spill_end_unwritten(t->host, s, why);
    return;
  }
skip:
  atomic_fetch_add(&t->spills_skipped, 1);
  if (op) oi__free(op->bounce);
  oi__free(op);
  oi__host_spill_end_unwritten(t->host, s, why);
}

static void *spiller_main(void *arg) {
  disk_tier *t = arg;
  oi_host_spill batch[SPILL_BATCH];
  while (!atomic_load(&t->stop)) {
    bool draining = atomic_load(&t->draining);
    size_t n = oi__host_spill_take(t->host, batch, SPILL_BATCH, draining ? 0 : 100);
    if (n == 0 && draining) break; /* everything queued is written (or skipped) */
    for (size_t i = 0; i < n; i++) {
      if (atomic_load(&t->stop)) { /* give the rest back unwritten */
        bool no = false;
        for (; i < n; i++)
          oi__host_spill_end(t->host, &batch[i], 1, &no);
        break;
      }
      spill_one(t, &batch[i]);
    }
  }
  return NULL;
}

oi_status oi__disk_tier_settle(disk_tier *t, uint32_t timeout_ms) {
  uint64_t deadline = oi__deadline_ns(timeout_ms);
  size_t n;
  while ((n = oi__host_spill_backlog(t->host)) != 0) {
    if (oi__now_ns() >= deadline)
      return oi__fail(OI_ERR_TIMEOUT, "disk: %zu blocks still queued for the disk after %u ms", n,
                      timeout_ms);
    usleep(1000);
  }
  return OI_OK;
}

/* ---- promotions ---------------------------------------------------------------- */

typedef struct promote_op {
  disk_tier *t;
  oi_host_ns ns;
  host_block *b;
  uint8_t *slot;
  uint64_t bytes;
  void *bounce;
  uint64_t t0;
  oi_tier_key key;
  void *dst;
  struct promote_op *next; /* in t->pq */
} promote_op;

static void promote_done(void *ctx, oi_status st);
static void promote_finish(promote_op *op, oi_status st);

/* Submits queued promotion reads, in order, while the window has room (one
 * read at least when none is in flight). A read the store cannot take now
 * (OI_ERR_BUSY from its completion thread) stays first in the queue: the
 * next completion, a spill's or a promotion's, pumps again. */
static void promote_pump(disk_tier *t) {
  for (;;) {
    pthread_mutex_lock(&t->lock);
    promote_op *op = t->pq_head;
    uint64_t len = op ? round_sector(op->bytes) : 0;
    if (!op || (t->read_bytes_in_flight && t->read_bytes_in_flight + len > PROMOTE_WINDOW)) {
      pthread_mutex_unlock(&t->lock);
      return;
    }
    t->pq_head = op->next;
    if (!t->pq_head) t->pq_tail = NULL;
    t->read_bytes_in_flight += len;
    pthread_mutex_unlock(&t->lock);
    oi_status st = oi__disk_read(t->store, &op->key, op->dst, len, promote_done, op);
    if (st == OI_OK) continue;
    pthread_mutex_lock(&t->lock);
    t->read_bytes_in_flight -= len;
    if (st == OI_ERR_BUSY) { /* back to the front; a completion pumps again */
      op->next = t->pq_head;
      t->pq_head = op;
      if (!t->pq_tail) t->pq_tail = op;
      pthread_mutex_unlock(&t->lock);
      return;
    }
    pthread_mutex_unlock(&t->lock);
    op->dst = NULL;         /* never read: its bytes were counted out above */
    promote_finish(op, st); /* not stored any more, or closed: a miss */
  }
}

/* Ends a promotion: the block seals (verified) or its slot goes (a miss). */
static void promote_finish(promote_op *op, oi_status st) {
  disk_tier *t = op->t;
  if (op->dst) { /* its read was in flight */
    pthread_mutex_lock(&t->lock);
    t->read_bytes_in_flight -= round_sector(op->bytes);
    pthread_mutex_unlock(&t->lock);
  }
  bool ok = st == OI_OK;
  if (ok && op->bounce) memcpy(op->slot, op->bounce, op->bytes);
  /* Counted before the block seals: a query that sees it sealed sees it counted. */
  atomic_fetch_add(ok ? &t->promotions : &t->promote_failed, 1);
  /* The disk holds it: not written back again. */
  oi__tier_promote_end(t->link, op->ns, op->b, ok, ok ? op->bytes : 0, oi__now_ns() - op->t0);
  oi__free(op->bounce);
  oi__free(op);
  in_flight_add(t, &t->promotions_in_flight, -1);
}

/* A promotion read ended (the store's completion thread). */
static void promote_done(void *ctx, oi_status st) {
  promote_op *op = ctx;
  disk_tier *t = op->t;
  promote_finish(op, st);
  promote_pump(t);
}

typedef struct promote_call {
  disk_tier *t;
  oi_host_ns ns;
  const oi_tier_key *keys;
  uint64_t bytes, slot_bytes;
  size_t started;
} promote_call;

static void promote_one(promote_call *c, size_t i, host_block *b, uint8_t *data) {
  disk_tier *t = c->t;
  promote_op *op = oi__calloc(1, sizeof *op);
  void *dst = data;
  if (op && !direct_ok(data, c->bytes, c->slot_bytes)) {
    op->bounce = oi__aligned_alloc(OI_DISK_SECTOR, round_sector(c->bytes));
    dst = op->bounce;
  }
  if (!op || !dst) {
    if (op) oi__free(op);
    oi__tier_promote_end(t->link, c->ns, b, false, 0, 0);
    atomic_fetch_add(&t->promote_failed, 1);
    return;
  }
  *op = (promote_op){.t = t,
                     .ns = c->ns,
                     .b = b,
                     .slot = data,
                     .bytes = c->bytes,
                     .bounce = op->bounce,
                     .t0 = oi__now_ns(),
                     .key = c->keys[i],
                     .dst = dst};
  in_flight_add(t, &t->promotions_in_flight, 1);
  pthread_mutex_lock(&t->lock);
  if (t->pq_tail)
    t->pq_tail->next = op;
  else
    t->pq_head = op;
  t->pq_tail = op;
  pthread_mutex_unlock(&t->lock);
  c->started++;
}

/* The tier's lookup: the leading run of keys the store holds. */
static size_t tier_lookup(void *self, const oi_tier_key *keys, size_t n, void **claim) {
  disk_tier *t = self;
  enum { MAX_RUN = 4096 };
  OI_UNUSED(claim);
  if (n == 0 || atomic_load(&t->stop)) return 0;
  n = OI_MIN(n, (size_t)MAX_RUN);
  uint8_t *present = oi__malloc(n);
  size_t run = 0;
  if (!present) return 0;
  oi__disk_contains(t->store, keys, (uint32_t)n, present);
  while (run < n && present[run])
    run++;
  oi__free(present);
  return run;
}

/* The tier's promote: each slot's read queued in prefix order, then read a
 * window at a time. */
static size_t tier_promote(void *self, void *claim, oi_host_ns ns, uint64_t block_bytes,
                           const oi_tier_key *keys, const oi_tier_slot *slots, size_t k) {
  disk_tier *t = self;
  OI_UNUSED(claim);
  promote_call c = {.t = t,
                    .ns = ns,
                    .keys = keys,
                    .bytes = block_bytes,
                    .slot_bytes = oi__host_slot_bytes(t->host, ns.id)};
  for (size_t j = 0; j < k; j++)
    promote_one(&c, slots[j].idx, slots[j].block, slots[j].data);
  promote_pump(t);
  return c.started;
}

/* The tier's membership: present[i] |= whether the store holds keys[i]. */
static uint64_t tier_contains(void *self, const oi_tier_key *keys, size_t n, uint8_t *present) {
  disk_tier *t = self;
  uint8_t *on_disk = n ? oi__malloc(n) : NULL;
  uint64_t added = 0;
  if (on_disk) {
    oi__disk_contains(t->store, keys, (uint32_t)n, on_disk);
    for (size_t i = 0; i < n; i++)
      if (on_disk[i] && !present[i]) {
        present[i] = 1;
        added++;
      }
  }
  oi__free(on_disk);
  return added;
}

/* ---- attach, destroy, stats -------------------------------------------------- */

/* A clean shutdown writes what is queued, for at most this long. */
#define DRAIN_LIMIT_NS (60ull * 1000000000ull)

/* The host's destroy calls this first: the spiller writes the blocks still
 * queued (a restart finds them), then stops; every operation is waited for
 * (their callbacks end their holds on pool slots); the store closes. */
static void tier_destroy(void *self) {
  disk_tier *t = self;
  atomic_store(&t->draining, true);
  oi__host_spill_wake(t->host);
  if (t->spiller_started) {
    uint64_t end = oi__now_ns() + DRAIN_LIMIT_NS;
    while (pthread_tryjoin_np(t->spiller, NULL) != 0) {
      if (oi__now_ns() >= end) {
        OI_LOG(OI_LOG_WARN, "disk",
               "shutdown: blocks still queued for the disk after %llu s: "
               "not written",
               (unsigned long long)(DRAIN_LIMIT_NS / 1000000000ull));
        atomic_store(&t->stop, true);
        pthread_mutex_lock(&t->lock);
        pthread_cond_broadcast(&t->cv);
        pthread_mutex_unlock(&t->lock);
        pthread_join(t->spiller, NULL);
        break;
      }
      struct timespec nap = {.tv_sec = 0, .tv_nsec = 2000000};
      nanosleep(&nap, NULL);
    }
  }
  atomic_store(&t->stop, true);
  oi__disk_close(t->store); /* waits for the operations in flight */
  /* Promotions still queued (never read): their slots go, misses. */
  while (t->pq_head) {
    promote_op *op = t->pq_head;
    t->pq_head = op->next;
    op->dst = NULL;
    promote_finish(op, OI_ERR_CLOSED);
  }
  t->pq_tail = NULL;
  pthread_cond_destroy(&t->cv);
  pthread_mutex_destroy(&t->lock);
  oi__free(t);
}

OI_API oi_status oi_host_disk_options_init(oi_host_disk_options *o) {
  if (!o) return oi__fail(OI_ERR_INVALID_ARGUMENT, "host_disk_options_init: options is NULL");
  memset(o, 0, sizeof *o);
  o->struct_size = sizeof *o;
  return OI_OK;
}

/* The least room a directory's share may have: a tier that cannot hold a
 * block of the usual sizes (64 KiB to a few MiB) is a mistake, refused at
 * start rather than found out as every spill is skipped. */
#define MIN_SHARE (1ull << 20)

/* The options' own checks (no file touched), into opts. */
static oi_status options_in(const oi_host_disk_options *o, oi_host_disk_options *opts) {
  oi_host_disk_options_init(opts);
  oi_status st = oi__struct_in(opts, sizeof *opts, o, "host_attach_disk");
  if (st != OI_OK) return st;
  if (opts->num_dirs == 0 || !opts->dirs)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "host_attach_disk: no directories (dirs, num_dirs)");
  for (uint32_t i = 0; i < opts->num_dirs; i++)
    if (!opts->dirs[i] || !opts->dirs[i][0])
      return oi__fail(OI_ERR_INVALID_ARGUMENT, "host_attach_disk: dirs[%u] is empty", i);
  if (opts->capacity_bytes == 0)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "host_attach_disk: capacity_bytes is 0");
  if (opts->capacity_bytes / opts->num_dirs < MIN_SHARE)
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "host_attach_disk: capacity_bytes %llu over %u director%s leaves less than "
                    "1 MiB per directory: too small to hold a block",
                    (unsigned long long)opts->capacity_bytes, opts->num_dirs,
                    opts->num_dirs == 1 ? "y" : "ies");
  return OI_OK;
}

OI_API oi_status oi_host_disk_options_check(const oi_host_disk_options *o) {
  oi_host_disk_options opts;
  oi_status st = options_in(o, &opts);
  if (st != OI_OK) return st;
  oi_disk_options dopts = {
      .dirs = opts.dirs, .num_dirs = opts.num_dirs, .capacity_bytes = opts.capacity_bytes};
  return oi__disk_check(&dopts);
}

/* The tier in two steps (oi_host_attach_disk): tier_open checks `o` and
 * opens the store; tier_attach puts it under `h` and starts its spiller (it
 * takes `t`: closed when the attach fails); tier_close closes one never
 * attached (accepts NULL). */
static void tier_close(disk_tier *t);

static oi_status tier_open(const oi_host_disk_options *o, disk_tier **out) {
  *out = NULL;
  oi_host_disk_options opts;
  oi_status st = options_in(o, &opts);
  if (st != OI_OK) return st;
  disk_tier *t = oi__calloc(1, sizeof *t);
  if (!t) return oi__fail(OI_ERR_OUT_OF_MEMORY, "host_attach_disk: out of memory");
  t->queue_depth = opts.queue_depth ? opts.queue_depth : 32;
  pthread_mutex_init(&t->lock, NULL);
  pthread_cond_init(&t->cv, NULL);
  oi_disk_options dopts = {.dirs = opts.dirs,
                           .num_dirs = opts.num_dirs,
                           .capacity_bytes = opts.capacity_bytes,
                           .queue_depth = t->queue_depth * 2}; /* spills and promotions */
  t->share = (opts.capacity_bytes / opts.num_dirs) & ~(uint64_t)(OI_DISK_SECTOR - 1);
  t->num_dirs = opts.num_dirs;
  if ((st = oi__disk_open(&dopts, &t->store)) != OI_OK) {
    tier_close(t);
    return st;
  }
  *out = t;
  return OI_OK;
}

static void tier_close(disk_tier *t) {
  if (!t) return;
  if (t->store) oi__disk_close(t->store);
  pthread_cond_destroy(&t->cv);
  pthread_mutex_destroy(&t->lock);
  oi__free(t);
}

static oi_status tier_attach(oi_host *h, disk_tier *t) {
  oi_status st;
  if (oi__disk_tier_of(h)) {
    tier_close(t);
    return oi__fail(OI_ERR_STATE, "host_attach_disk: a disk tier is attached to this host already");
  }
  t->host = h;
  oi_host_pool_info pool;
  oi__host_pool_info(h, &pool);
  if (pool.base) { /* I/O straight from and into the pool (a refusal is logged, not fatal) */
    struct iovec iov = {.iov_base = pool.base, .iov_len = pool.bytes};
    oi__disk_register_buffers(t->store, &iov, 1);
  }
  if ((st = oi__host_tier_attach(h, &disk_tier_ops, t, &t->link)) != OI_OK) {
    tier_close(t);
    return st;
  }
  oi__host_sector_slots(h); /* block sizes registered from now on need no bounce copy */
  int rc = pthread_create(&t->spiller, NULL, spiller_main, t);
  if (rc != 0) {
    /* Attached without a spiller: stored blocks still promote; log it. */
    OI_LOG(OI_LOG_WARN, "disk", "cannot start the spiller thread (%s): nothing new is written",
           strerror(rc));
  } else {
    pthread_setname_np(t->spiller, "oi-disk-spill");
    t->spiller_started = true;
  }
  oi_disk_stats ds;
  oi__disk_stats_get(t->store, &ds);
  OI_LOG(OI_LOG_INFO, "disk",
         "disk tier attached: %u dir(s), %.2f GiB, %llu blocks from an earlier run (index replay "
         "%.3f s, %llu torn records cut)",
         t->num_dirs, (double)ds.capacity_bytes / (1ull << 30), (unsigned long long)ds.blocks,
         (double)ds.replay_ns / 1e9, (unsigned long long)ds.torn_records_cut);
  return OI_OK;
}

OI_API oi_status oi_host_attach_disk(oi_host *h, const oi_host_disk_options *o) {
  if (!h) return oi__fail(OI_ERR_INVALID_ARGUMENT, "host_attach_disk: host is NULL");
  /* Checked first: the store is not opened (nor its directory locked) for a
   * host that has a tier already. */
  if (oi__disk_tier_of(h))
    return oi__fail(OI_ERR_STATE, "host_attach_disk: a disk tier is attached to this host already");
  disk_tier *t;
  oi_status st = tier_open(o, &t);
  if (st != OI_OK) return st;
  return tier_attach(h, t);
}

/* The tier's stats: *out is an oi_host_disk_stats. */
static oi_status tier_stats(void *self, void *out) {
  disk_tier *t = self;
  oi_disk_stats ds;
  oi__disk_stats_get(t->store, &ds);
  oi_host_disk_stats *s = out;
  memset(s, 0, sizeof *s);
  s->struct_size = sizeof *s;
  s->latency_buckets = OI_LATENCY_BUCKETS;
  s->blocks = ds.blocks;
  s->bytes_used = ds.bytes_used;
  s->capacity_bytes = ds.capacity_bytes;
  s->spills = atomic_load(&t->spills);
  s->spills_failed = atomic_load(&t->spills_failed);
  s->spills_skipped = atomic_load(&t->spills_skipped);
  s->spill_overflow = oi__host_spill_overflow(t->host);
  s->promotions = atomic_load(&t->promotions);
  s->promote_failed = atomic_load(&t->promote_failed);
  s->checksum_failures = ds.checksum_failures;
  s->evictions = ds.evictions;
  s->torn_records_cut = ds.torn_records_cut + ds.bad_extents_dropped;
  s->replay_ns = ds.replay_ns;
  memcpy(s->read_latency_us, ds.read_latency_us, sizeof s->read_latency_us);
  s->read_latency_sum_us = ds.read_latency_sum_us;
  uint64_t lost[OI_SPILL_FATES];
  oi__host_spill_lost(t->host, lost);
  s->lost_queue_full = lost[OI_SPILL_QUEUE_FULL];
  s->lost_unwritten = lost[OI_SPILL_UNWRITTEN];
  s->lost_write_failed = lost[OI_SPILL_WRITE_FAILED];
  s->lost_no_room = lost[OI_SPILL_NO_ROOM];
  s->disk_full = ds.full;
  s->full_events = ds.full_events;
  s->spills_refused_full = ds.writes_refused_full;
  return OI_OK;
}

/* Nearest the pool; it takes the pool's spills. */
static const oi_tier_ops disk_tier_ops = {.name = "disk",
                                          .rank = 10,
                                          .where = OI_WHERE_DISK,
                                          .flags = OI_TIER_SPILLS,
                                          .contains = tier_contains,
                                          .lookup = tier_lookup,
                                          .promote = tier_promote,
                                          .stats = tier_stats,
                                          .destroy = tier_destroy};

OI_API oi_status oi_host_get_disk_stats(const oi_host *h, oi_host_disk_stats *out) {
  if (!h) return oi__fail(OI_ERR_INVALID_ARGUMENT, "host_disk_stats: host is NULL");
  if (!out) return oi__fail(OI_ERR_INVALID_ARGUMENT, "host_disk_stats: out is NULL");
  oi_host_disk_stats s;
  oi_status st = oi__host_tier_stats(h, &disk_tier_ops, &s, "host_disk_stats");
  if (st != OI_OK) return st;
  return oi__struct_out(out, &s, sizeof s, "host_disk_stats");
}
