/* The embedded engine: save / query / load / release / flush over a host in
 * this process. The host tier owns the blocks (host/host.h: reserve, seal,
 * lease, load marks); the transfer pipeline owns the copies and their
 * completion (transfer/transfer.h: groups, copy modes, per-layer loads,
 * deadlines, the completion thread, so user callbacks never run on a driver
 * thread). The engine joins the two and keeps its own statistics and what a
 * flush waits for. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/query.h"
#include "engine_internal.h"
#include "host/host.h"
#include "transfer/transfer.h"

typedef struct engine_counters {
  atomic_uint_fast64_t saves_submitted, saves_completed, saves_deduplicated, saves_dropped,
      saves_failed, loads_completed, loads_failed, blocks_loaded, bytes_saved, bytes_loaded,
      query_hit_blocks, query_miss_blocks, loads_submitted, saves_not_encoded;
  oi_latency_hist save_latency, load_latency;
  /* The codec's warning about blocks not encoded: when it was last given,
   * and the count then (at most one every NOT_ENCODED_WARN_NS). */
  atomic_uint_fast64_t not_encoded_warned_ns, not_encoded_warned;
  atomic_bool no_bounce_warned; /* warn_no_bounce's first warning was given */
} engine_counters;

#define NOT_ENCODED_WARN_NS (10ull * 1000000000ull)

/* A block being saved layer by layer (oi_save_options.arena_count): its host
 * slot stays in flight until every arena arrived and landed. ACTIVE holds a
 * slot; SKIP (deduplicated or dropped at its first layer) and FAILED (a
 * layer failed or the deadline passed) only make later layers skip the
 * block. A record ends when every arena arrived (or its deadline passed) and
 * no copy into its slot is in flight: then the slot seals (every arena
 * landed) or aborts. Under the engine's lock.
 *
 * In a codec namespace the arenas land in a bounce of the pipeline's own
 * (oi__xfer_bounce), not in the slot: a frame covers the whole block. Only
 * a record that ends with every arena landed is encoded into its slot (and
 * sealed, or failed when its frame does not fit); every other end gives the
 * bounce back unencoded and aborts the slot. A block that gets no bounce
 * (their bound is taken) is dropped at its first layer, a failed save. */
enum { PARTIAL_ACTIVE, PARTIAL_SKIP, PARTIAL_FAILED };
#define PARTIAL_BUCKETS 1024

typedef struct partial {
  struct partial *next; /* bucket chain */
  oi_block_hash hash;
  int64_t id;
  int state;
  host_block *b;
  uint8_t *data;                      /* the slot */
  uint8_t *bounce;                    /* a codec namespace: where the arenas land; else NULL */
  uint32_t arrived, landed, inflight; /* arenas */
  uint64_t t0_ns, deadline_ns;
  uint8_t bits[]; /* arrived arenas, one bit each */
} partial;

typedef struct local_engine {
  oi_engine base;
  oi_host *host;
  oi_host_ns ns;
  oi_xfer *xfer;
  uint64_t layer_bounce_bytes; /* a codec namespace's layerwise bounces' bound */

  pthread_mutex_t lock;
  pthread_cond_t flush_cv; /* a save operation finished */
  /* Save operations: submitted counts up before the operation's job can
   * complete (an atomic: a save call takes no engine lock), done under lock. */
  atomic_uint_fast64_t save_ops_submitted;
  uint64_t save_ops_done;
  /* Hashes this engine's saves deduplicated against blocks another engine
   * still had in flight: a flush also waits for those to seal. */
  oi_block_hash *foreign;
  size_t nforeign, foreign_cap;
  /* Layerwise saves (under lock): blocks some of whose arenas arrived. */
  partial *partials[PARTIAL_BUCKETS];
  size_t npartials;
  size_t partials_ending; /* taken off the list by a sweep, not ended in the host yet */
  /* The sweeper ends records at their deadline even when the engine is not
   * used again (started at the first layerwise save; stopped at destroy). */
  pthread_t sweeper;
  bool sweeper_started, sweeper_stop;
  pthread_cond_t sweep_cv; /* a record was added, or stop */

  engine_counters c;
} local_engine;

static void partials_sweep(local_engine *e, bool all);

static const engine_ops local_ops;

/* ---- completion (the pipeline's done callback) -------------------------------- */

/* Moves the blocks whose failed[] mark is set to the end of blocks[0..n)
 * (order is not kept). @return how many were not marked. */
static size_t codec_failed_last(host_block **blocks, size_t n, const uint8_t *failed) {
  size_t lo = 0, hi = n;
  /* failed[] follows the original order: a copy is swapped with the blocks. */
  uint8_t stack[256], *mark = n <= sizeof stack ? stack : oi__malloc(n);
  if (!mark) return 0; /* no memory to sort them: none is kept */
  memcpy(mark, failed, n);
  while (lo < hi) {
    if (!mark[lo]) {
      lo++;
      continue;
    }
    hi--;
    host_block *b = blocks[lo];
    blocks[lo] = blocks[hi];
    blocks[hi] = b;
    uint8_t m = mark[lo];
    mark[lo] = mark[hi];
    mark[hi] = m;
  }
  if (mark != stack) oi__free(mark);
  return lo;
}

/* Blocks the codec did not encode are not stored (a later miss): the first
 * time, and then at most every NOT_ENCODED_WARN_NS with the count since, a
 * warning names the remedy (the rest, at DEBUG). */
static void warn_not_encoded(local_engine *e, size_t failed, size_t n, const char *why) {
  uint64_t now = oi__now_ns(), last = atomic_load(&e->c.not_encoded_warned_ns);
  uint64_t total = atomic_load(&e->c.saves_not_encoded);
  bool warn = (last == 0 || now - last >= NOT_ENCODED_WARN_NS) &&
              atomic_compare_exchange_strong(&e->c.not_encoded_warned_ns, &last, now ? now : 1);
  const char *codec = oi__codec_name(e->base.codec.id);
  if (!warn) {
    OI_LOG_I(OI_LOG_DEBUG, "engine", e->base.instance_id,
             "save: %zu of %zu blocks not stored: the %s codec did not encode them (%s)", failed, n,
             codec, why);
    return;
  }
  uint64_t since = total - atomic_exchange(&e->c.not_encoded_warned, total);
  bool lossless = e->base.codec.id == OI_CODEC_LOSSLESS,
       shapeless = lossless && !e->base.codec.shape.parts;
  OI_LOG_I(OI_LOG_WARN, "engine", e->base.instance_id,
           "save: %llu blocks not stored since the last warning (%llu in all), later misses: "
           "the %s codec did not encode them into the namespace's %llu-byte slots of %llu-byte "
           "blocks (the first: %s)%s%s",
           (unsigned long long)since, (unsigned long long)total, codec,
           (unsigned long long)e->base.codec.slot_bytes,
           (unsigned long long)e->base.layout.block_bytes, why,
           lossless ? "; this KV compresses less than the slot allows: raise codec_slot_bytes, "
                      "or use codec none"
                    : "; a lossy codec refuses values it cannot scale",
           shapeless ? " (or give the block's shape, codec_tokens, codec_heads and "
                       "codec_head_dim: each part then gets its own code)"
                     : "");
}

/* Layerwise saves under a codec: the bounces' bound, 1/16 of the pool
 * (within [4 MiB, 4 GiB]): the pipeline makes them as blocks need them and
 * keeps them for the next. */
static uint64_t layer_bounce_bytes(uint64_t pool_bytes) {
  return OI_MIN(OI_MAX(pool_bytes / 16, 4ull << 20), 4ull << 30);
}

/* A block saved layer by layer that got no bounce (their bound is taken):
 * dropped, a failed save; a warning the first time, then at DEBUG. */
static void warn_no_bounce(local_engine *e) {
  bool first = !atomic_exchange(&e->c.no_bounce_warned, true);
  OI_LOG_I(first ? OI_LOG_WARN : OI_LOG_DEBUG, "engine", e->base.instance_id,
           "layerwise save: a block dropped (a failed save, a later miss): the %s codec's "
           "per-block bounces (%llu bytes, 1/16 of the pool) are all taken by blocks whose "
           "layers have not all landed",
           oi__codec_name(e->base.codec.id), (unsigned long long)e->layer_bounce_bytes);
}

/* A job's user area holds the host blocks it moves. */
static void job_done(void *ctx, void *user, const oi_xfer_result *r) {
  local_engine *e = ctx;
  host_block **blocks = user;
  bool ok = r->status == OI_OK;
  bool load = r->dir == OI_COPY_H2D;
  if (r->n) oi__hist_record(load ? &e->c.load_latency : &e->c.save_latency, r->latency_ns);
  if (load) {
    oi__host_load_end(e->host, blocks, r->n, ok, r->bytes, r->latency_ns);
    if (ok) {
      atomic_fetch_add(&e->c.loads_completed, 1);
      atomic_fetch_add(&e->c.blocks_loaded, r->n);
      atomic_fetch_add(&e->c.bytes_loaded, r->bytes);
    } else {
      atomic_fetch_add(&e->c.loads_failed, 1);
    }
    return;
  }
  if (r->arena_count) { /* a layerwise save: the records decide */
    partial **ps = user;
    pthread_mutex_lock(&e->lock);
    for (size_t i = 0; i < r->n; i++) {
      ps[i]->inflight -= r->arena_count;
      if (ok)
        ps[i]->landed += r->arena_count;
      else if (ps[i]->state == PARTIAL_ACTIVE)
        ps[i]->state = PARTIAL_FAILED;
    }
    e->save_ops_done++;
    pthread_cond_broadcast(&e->flush_cv);
    pthread_mutex_unlock(&e->lock);
    if (!ok)
      OI_LOG_I(OI_LOG_WARN, "engine", e->base.instance_id,
               "layerwise save of %zu blocks failed: %s (the blocks are aborted)", r->n,
               oi_status_str(r->status));
    partials_sweep(e, false);
    return;
  }
  size_t n = r->n;
  uint64_t bytes = r->bytes;
  if (ok && r->failed) { /* the codec stage did not encode some: they go, the rest seal */
    n = codec_failed_last(blocks, r->n, r->failed);
    bytes = n * e->base.layout.block_bytes;
    oi__host_save_end(e->host, e->ns, blocks + n, r->n - n, false, 0, 0);
    atomic_fetch_add(&e->c.saves_failed, r->n - n);
    atomic_fetch_add(&e->c.saves_not_encoded, r->n - n);
    warn_not_encoded(e, r->n - n, r->n, r->failed_why ? r->failed_why : "no reason given");
  }
  oi__host_save_end(e->host, e->ns, blocks, n, ok, bytes, r->latency_ns);
  if (ok) {
    atomic_fetch_add(&e->c.saves_completed, n);
    atomic_fetch_add(&e->c.bytes_saved, bytes);
  } else {
    atomic_fetch_add(&e->c.saves_failed, r->n);
    OI_LOG_I(OI_LOG_WARN, "engine", e->base.instance_id, "save of %zu blocks failed: %s (dropped)",
             r->n, oi_status_str(r->status));
  }
  pthread_mutex_lock(&e->lock);
  e->save_ops_done++;
  pthread_cond_broadcast(&e->flush_cv);
  pthread_mutex_unlock(&e->lock);
}

/* Remembers a hash deduplicated against a block still in flight (another
 * engine's save, or an earlier one of ours) for the next flush. Best effort
 * under memory pressure: the flush then covers what was remembered. */
static void note_foreign(local_engine *e, const oi_block_hash *hash) {
  pthread_mutex_lock(&e->lock);
  if (e->nforeign == e->foreign_cap) {
    size_t cap = e->foreign_cap ? 2 * e->foreign_cap : 64;
    oi_block_hash *n = oi__realloc(e->foreign, cap * sizeof *n);
    if (!n) {
      pthread_mutex_unlock(&e->lock);
      OI_LOG_I(OI_LOG_WARN, "engine", e->base.instance_id,
               "out of memory tracking in-flight duplicates");
      return;
    }
    e->foreign = n;
    e->foreign_cap = cap;
  }
  e->foreign[e->nforeign++] = *hash;
  pthread_mutex_unlock(&e->lock);
}

/* ---- operations ------------------------------------------------------------- */

/* A save as the host reserves its slots: each accepted block joins the job
 * (whose groups start copying as they fill). */
typedef struct save_call {
  local_engine *e;
  oi_xfer_job *job;
  host_block **blocks;
  const int64_t *ids;
  const oi_block_hash *hashes;
  size_t k;
} save_call;

static void save_accepted(void *ctx, const size_t *idx, host_block *const *blocks,
                          uint8_t *const *data, size_t k) {
  save_call *c = ctx;
  int64_t ids[OI_BATCH];
  for (size_t j = 0; j < k; j++) {
    c->blocks[c->k + j] = blocks[j];
    ids[j] = c->ids[idx[j]];
  }
  c->k += k;
  oi__xfer_add_many(c->job, ids, data, k);
}

static void save_in_flight(void *ctx, size_t i) {
  save_call *c = ctx;
  note_foreign(c->e, &c->hashes[i]);
}

/* ---- layerwise saves ------------------------------------------------------ */

static size_t bucket_of(const oi_block_hash *h) {
  uint64_t x;
  memcpy(&x, h->bytes, sizeof x);
  return (size_t)((x ^ (x >> 29)) % PARTIAL_BUCKETS);
}

static partial *partial_find(local_engine *e, const oi_block_hash *h) {
  for (partial *p = e->partials[bucket_of(h)]; p; p = p->next)
    if (!memcmp(p->hash.bytes, h->bytes, sizeof h->bytes)) return p;
  return NULL;
}

static partial *partial_add(local_engine *e, const oi_block_hash *h, int64_t id, int state) {
  uint32_t na = e->base.layout.num_arenas;
  partial *p = oi__calloc(1, sizeof *p + (na + 7) / 8);
  if (!p) return NULL;
  p->hash = *h;
  p->id = id;
  p->state = state;
  p->t0_ns = oi__now_ns();
  uint32_t ms = e->base.opts.save_deadline_ms;
  p->deadline_ns = ms ? p->t0_ns + (uint64_t)ms * 1000000ull : UINT64_MAX;
  size_t k = bucket_of(h);
  p->next = e->partials[k];
  e->partials[k] = p;
  e->npartials++;
  pthread_cond_signal(&e->sweep_cv);
  return p;
}

/* Ends a record taken off the list (no copy into it in flight): seals its
 * slot when every arena landed (under a codec: and its frame was encoded),
 * else aborts it; gives its bounce back. */
static void partial_end(local_engine *e, partial *p, uint32_t na) {
  if ((p->state == PARTIAL_ACTIVE || p->state == PARTIAL_FAILED) && p->b) {
    bool ok = p->state == PARTIAL_ACTIVE && p->landed == na &&
              (e->base.codec.id == OI_CODEC_NONE || (p->bounce && e->xfer));
    uint64_t lat = oi__now_ns() - p->t0_ns;
    oi__host_save_end(e->host, e->ns, &p->b, 1, ok, ok ? e->base.layout.block_bytes : 0, lat);
    if (ok) {
      oi__hist_record(&e->c.save_latency, lat);
      atomic_fetch_add(&e->c.saves_completed, 1);
      atomic_fetch_add(&e->c.bytes_saved, e->base.layout.block_bytes);
    } else {
      atomic_fetch_add(&e->c.saves_failed, 1);
    }
  }
  /* After the pipeline is gone (destroy), its bounces went with it. */
  if (e->xfer) oi__xfer_bounce_free(e->xfer, p->bounce);
  oi__free(p);
  /* Counted out only now: a flush that saw the record gone returns once
   * its slot is sealed or given back, not before. */
  pthread_mutex_lock(&e->lock);
  e->partials_ending--;
  pthread_cond_broadcast(&e->flush_cv);
  pthread_mutex_unlock(&e->lock);
}

/* Ends the records that are done (every arena arrived, or `all`, or past
 * their deadline) and have no copy in flight: seals the complete ones,
 * aborts the rest. Takes the lock. */
static void partials_sweep(local_engine *e, bool all) {
  uint32_t na = e->base.layout.num_arenas;
  uint64_t now = oi__now_ns();
  partial *done = NULL;
  host_block *failed[64];
  size_t nfailed = 0;
  pthread_mutex_lock(&e->lock);
  for (size_t k = 0; k < PARTIAL_BUCKETS && e->npartials; k++)
    for (partial **pp = &e->partials[k]; *pp;) {
      partial *p = *pp;
      bool over = all || now >= p->deadline_ns;
      if (p->inflight || (p->arrived < na && !over)) {
        /* A failed block's slot goes at once (no copy into it runs); the
         * record stays so that its later layers skip. */
        if (!p->inflight && p->state == PARTIAL_FAILED && p->b && nfailed < 64) {
          failed[nfailed++] = p->b;
          p->b = NULL;
          if (e->xfer) oi__xfer_bounce_free(e->xfer, p->bounce); /* never encoded */
          p->bounce = NULL;
        }
        pp = &p->next;
        continue;
      }
      *pp = p->next;
      e->npartials--;
      e->partials_ending++;
      p->next = done;
      done = p;
    }
  pthread_mutex_unlock(&e->lock);
  for (size_t i = 0; i < nfailed; i++) {
    oi__host_save_end(e->host, e->ns, &failed[i], 1, false, 0, 0);
    atomic_fetch_add(&e->c.saves_failed, 1);
  }
  while (done) {
    /* Up to a batch of records at a time: the ones whose every arena landed
     * in a bounce are encoded together (the codec stage's workers). */
    partial *batch[64], *enc[64];
    uint8_t *src[64], *slots[64], bad[64]; /* oi__xfer_encode writes each of the ne */
    size_t nb = 0, ne = 0;
    while (done && nb < 64) {
      batch[nb++] = done;
      done = done->next;
    }
    for (size_t i = 0; i < nb; i++) {
      partial *p = batch[i];
      if (p->state == PARTIAL_ACTIVE && p->b && p->landed == na && p->bounce && e->xfer) {
        enc[ne] = p;
        src[ne] = p->bounce;
        slots[ne++] = p->data;
      }
    }
    size_t nbad = ne ? oi__xfer_encode(e->xfer, src, slots, ne, bad) : 0;
    const char *why = nbad ? oi_last_error() : NULL;
    for (size_t j = 0; j < ne; j++)
      if (bad[j]) enc[j]->state = PARTIAL_FAILED; /* its slot holds nothing to keep */
    if (nbad) {
      atomic_fetch_add(&e->c.saves_not_encoded, nbad);
      warn_not_encoded(e, nbad, ne, why);
    }
    for (size_t i = 0; i < nb; i++)
      partial_end(e, batch[i], na);
  }
}

/* The earliest deadline of a record still open (UINT64_MAX: none). Under
 * the lock. */
static uint64_t partials_next_deadline_locked(local_engine *e) {
  uint64_t d = UINT64_MAX;
  for (size_t k = 0; k < PARTIAL_BUCKETS && e->npartials; k++)
    for (partial *p = e->partials[k]; p; p = p->next)
      d = OI_MIN(d, p->deadline_ns);
  return d;
}

/* Sleeps until the earliest record deadline, then sweeps: a block whose
 * layers stopped arriving gives its slot back at its deadline, not at the
 * engine's next call. A record past its deadline with a copy still in flight
 * ends when that copy's job completes (its completion sweeps); until then
 * the sweeper looks again every 100 ms. */
static void *sweeper_main(void *arg) {
  local_engine *e = arg;
  pthread_mutex_lock(&e->lock);
  while (!e->sweeper_stop) {
    uint64_t now = oi__now_ns(), d = partials_next_deadline_locked(e);
    if (d <= now) {
      pthread_mutex_unlock(&e->lock);
      partials_sweep(e, false);
      pthread_mutex_lock(&e->lock);
      d = partials_next_deadline_locked(e);
      if (d <= now + 100000000ull) d = now + 100000000ull;
    }
    if (e->sweeper_stop) break;
    if (d == UINT64_MAX) {
      pthread_cond_wait(&e->sweep_cv, &e->lock);
    } else {
      struct timespec ts = oi__timespec(d);
      pthread_cond_timedwait(&e->sweep_cv, &e->lock, &ts);
    }
  }
  pthread_mutex_unlock(&e->lock);
  return NULL;
}

/* Starts the sweeper once (lock held). Without it (no thread could be
 * started) records still end at the engine's next save, flush or destroy. */
static void sweeper_start_locked(local_engine *e) {
  if (e->sweeper_started) return;
  int rc = pthread_create(&e->sweeper, NULL, sweeper_main, e);
  if (rc != 0) {
    OI_LOG_I(OI_LOG_WARN, "engine", e->base.instance_id,
             "cannot start the layerwise sweeper thread (%s): incomplete blocks end at the "
             "engine's next call",
             strerror(rc));
    return;
  }
  pthread_setname_np(e->sweeper, "oi-layer-sweep");
  e->sweeper_started = true;
}

typedef struct layer_call {
  local_engine *e;
  const oi_block_hash *hashes;
  const size_t *pos; /* reserve index -> position in the call */
  partial **made;    /* per reserve index: the record its outcome made */
  const int64_t *ids;
} layer_call;

static void layer_accepted(void *ctx, const size_t *idx, host_block *const *blocks,
                           uint8_t *const *data, size_t k) {
  layer_call *c = ctx;
  local_engine *e = c->e;
  bool codec = e->base.codec.id != OI_CODEC_NONE;
  for (size_t j = 0; j < k; j++) {
    size_t at = c->pos[idx[j]];
    /* A codec namespace: the arenas gather in a bounce (none left: the
     * block is dropped, never waited for). */
    uint8_t *bounce = codec ? oi__xfer_bounce(e->xfer) : NULL;
    pthread_mutex_lock(&e->lock);
    partial *p = partial_add(e, &c->hashes[at], c->ids[at],
                             codec && !bounce ? PARTIAL_FAILED : PARTIAL_ACTIVE);
    if (p && p->state == PARTIAL_ACTIVE) {
      p->b = blocks[j];
      p->data = data[j];
      p->bounce = bounce;
    }
    pthread_mutex_unlock(&e->lock);
    if (!p ||
        p->state != PARTIAL_ACTIVE) { /* no record or no bounce: the slot is aborted at once */
      if (p) warn_no_bounce(e);
      if (!p) oi__xfer_bounce_free(e->xfer, bounce);
      oi__host_save_end(e->host, e->ns, &blocks[j], 1, false, 0, 0);
      atomic_fetch_add(&e->c.saves_failed, 1);
    }
    c->made[idx[j]] = p;
  }
}

static void layer_in_flight(void *ctx, size_t i) {
  layer_call *c = ctx;
  note_foreign(c->e, &c->hashes[c->pos[i]]);
}

static oi_status local_save_layers(local_engine *e, const int64_t *ids, const oi_block_hash *hashes,
                                   size_t n, const oi_save_options *opt, oi_ticket **ticket_out) {
  uint32_t first = opt->arena_first, count = opt->arena_count;
  partials_sweep(e, false); /* deadlines */
  pthread_mutex_lock(&e->lock);
  sweeper_start_locked(e);
  pthread_mutex_unlock(&e->lock);
  oi_xfer_job *job = oi__xfer_job_new(e->xfer, OI_COPY_D2H, n, ticket_out ? OI_XFER_JOB_TICKET : 0,
                                      n * sizeof(partial *));
  size_t *pos = oi__malloc(n * (sizeof *pos + sizeof(partial *) + sizeof(oi_block_hash)));
  if (!job || !pos) {
    oi__xfer_job_free(job);
    oi__free(pos);
    return oi__fail(OI_ERR_OUT_OF_MEMORY, "save: out of memory");
  }
  partial **made = (partial **)(pos + n);
  oi_block_hash *fresh = (oi_block_hash *)(made + n);
  oi__xfer_job_arenas(job, first, count);
  oi_ticket *t = oi__xfer_job_ticket(job);
  oi__xfer_job_on_done(job, opt->on_done, opt->on_done_ctx);
  oi__xfer_job_wait_event(job, opt->wait_event);
  /* The hashes no record knows yet get their slot (or their skip) now. */
  size_t nfresh = 0;
  pthread_mutex_lock(&e->lock);
  for (size_t i = 0; i < n; i++)
    if (!partial_find(e, &hashes[i])) pos[nfresh++] = i;
  atomic_fetch_add(&e->save_ops_submitted, 1);
  pthread_mutex_unlock(&e->lock);
  if (nfresh) {
    for (size_t k = 0; k < nfresh; k++) {
      fresh[k] = hashes[pos[k]];
      made[k] = NULL;
    }
    layer_call c = {.e = e, .hashes = hashes, .pos = pos, .made = made, .ids = ids};
    oi_host_reserve_sink sink = {
        .accepted = layer_accepted, .in_flight = layer_in_flight, .ctx = &c};
    oi_host_reserved r;
    oi__host_reserve(e->host, e->ns, fresh, nfresh, &sink, &r);
    if (opt->result) { /* the blocks this call decided; later layers of them count nothing */
      opt->result->accepted = r.accepted;
      opt->result->deduplicated = r.deduplicated;
      opt->result->dropped = r.dropped;
    }
    atomic_fetch_add(&e->c.saves_submitted, nfresh);
    atomic_fetch_add(&e->c.saves_deduplicated, r.deduplicated);
    atomic_fetch_add(&e->c.saves_dropped, r.dropped);
    /* Deduplicated and dropped hashes: a record that makes later layers skip
     * (best effort: without memory for it, a later layer reserves anew and
     * that block is aborted at its deadline). */
    pthread_mutex_lock(&e->lock);
    for (size_t k = 0; k < nfresh; k++)
      if (!made[k] && !partial_find(e, &hashes[pos[k]]))
        partial_add(e, &hashes[pos[k]], ids[pos[k]], PARTIAL_SKIP);
    pthread_mutex_unlock(&e->lock);
  }
  /* Each block whose record is this block id and has none of these arenas
   * yet: they arrive; where the record holds a slot the copies join the job
   * (a skipped or failed block only counts them, so its record ends). */
  partial **ps = oi__xfer_job_user(job);
  size_t k = 0;
  pthread_mutex_lock(&e->lock);
  for (size_t i = 0; i < n; i++) {
    partial *p = partial_find(e, &hashes[i]);
    if (!p || p->id != ids[i]) continue;
    bool fresh_range = true;
    for (uint32_t a = first; a < first + count; a++)
      fresh_range &= !(p->bits[a / 8] & (1u << (a % 8)));
    if (!fresh_range) continue;
    for (uint32_t a = first; a < first + count; a++)
      p->bits[a / 8] |= (uint8_t)(1u << (a % 8));
    p->arrived += count;
    if (p->state != PARTIAL_ACTIVE) continue;
    p->inflight += count;
    ps[k++] = p;
  }
  pthread_mutex_unlock(&e->lock);
  for (size_t i = 0; i < k; i++) /* under a codec, into the block's bounce */
    oi__xfer_add(job, ps[i]->id, ps[i]->bounce ? ps[i]->bounce : ps[i]->data);
  oi__free(pos);
  oi_status st = oi__xfer_submit(job, "save"); /* on failure its done callback ran */
  if (ticket_out) *ticket_out = st == OI_OK ? t : NULL;
  partials_sweep(e, false); /* records this call completed (or that skip) */
  return st;
}

static oi_status local_save(oi_engine *base, const int64_t *ids, const oi_block_hash *hashes,
                            size_t n, const oi_save_options *opt, oi_ticket **ticket_out) {
  local_engine *e = (local_engine *)base;
  if (opt->arena_count) return local_save_layers(e, ids, hashes, n, opt, ticket_out);
  oi_xfer_job *job = oi__xfer_job_new(e->xfer, OI_COPY_D2H, n, ticket_out ? OI_XFER_JOB_TICKET : 0,
                                      n * sizeof(host_block *));
  if (!job) return oi__fail(OI_ERR_OUT_OF_MEMORY, "save: out of memory");
  oi_ticket *t = oi__xfer_job_ticket(job);
  oi__xfer_job_on_done(job, opt->on_done, opt->on_done_ctx);
  atomic_fetch_add(&e->save_ops_submitted, 1);

  oi__xfer_job_wait_event(job, opt->wait_event);
  save_call c = {
      .e = e, .job = job, .blocks = oi__xfer_job_user(job), .ids = ids, .hashes = hashes};
  oi_host_reserve_sink sink = {.accepted = save_accepted, .in_flight = save_in_flight, .ctx = &c};
  oi_host_reserved r;
  oi__host_reserve(e->host, e->ns, hashes, n, &sink, &r);
  atomic_fetch_add(&e->c.saves_submitted, n);
  atomic_fetch_add(&e->c.saves_deduplicated, r.deduplicated);
  atomic_fetch_add(&e->c.saves_dropped, r.dropped);
  if (r.dropped)
    OI_LOG_I(OI_LOG_DEBUG, "engine", base->instance_id,
             "save dropped %llu of %zu blocks (pool full)", (unsigned long long)r.dropped, n);
  if (opt->result) {
    opt->result->accepted = r.accepted;
    opt->result->deduplicated = r.deduplicated;
    opt->result->dropped = r.dropped;
  }
  oi_status st = oi__xfer_submit(job, "save"); /* with no block accepted: done now */
  if (ticket_out) *ticket_out = st == OI_OK ? t : NULL;
  return st;
}

static oi_status local_query(oi_engine *base, const char *req_id, const oi_block_hash *hashes,
                             size_t n, uint32_t flags, uint8_t *present, uint32_t wait_ms,
                             oi_query_result *out) {
  OI_UNUSED(
      req_id); /* the answer depends on the hashes alone (a disk promotion is keyed by them) */
  local_engine *e = (local_engine *)base;
  oi_host_query_args a = {.instance = base->instance_id,
                          .principal = base->principal,
                          .shares = base->opts.world_size,
                          .membership = (flags & OI_QUERY_MEMBERSHIP) != 0,
                          .present = present,
                          .wait_ms = wait_ms,
                          .where = oi__query_where(out)};
  oi_host_answer ans;
  oi_status st = oi__host_query_ns(e->host, e->ns, &a, hashes, n, &ans);
  if (st != OI_OK) return st;
  atomic_fetch_add(&e->c.query_hit_blocks, ans.hit_blocks);
  atomic_fetch_add(&e->c.query_miss_blocks, n - ans.hit_blocks);
  return oi__query_result_out(&a, &ans, out, "query");
}

/* A load as the host marks its blocks: each run marked joins the job (whose
 * groups start copying as they fill). */
typedef struct load_call {
  oi_xfer_job *job;
  const int64_t *ids;
  uint8_t **data;
  size_t added;
} load_call;

static void load_ready(void *ctx, size_t done) {
  load_call *c = ctx;
  oi__xfer_add_many(c->job, c->ids + c->added, c->data + c->added, done - c->added);
  c->added = done;
}

static oi_status local_load(oi_engine *base, oi_lease lease, const int64_t *ids, size_t n,
                            const oi_load_options *opt, oi_ticket **ticket_out) {
  local_engine *e = (local_engine *)base;
  uint32_t flags = (ticket_out ? OI_XFER_JOB_TICKET : 0) |
                   ((opt->flags & OI_LOAD_ARENA_EVENTS) ? OI_XFER_JOB_LAYERED : 0);
  /* The job's user area: the blocks (for the load's end), then their bytes'
   * addresses (for the plan). */
  oi_xfer_job *job = oi__xfer_job_new(e->xfer, OI_COPY_H2D, n, flags,
                                      n * (sizeof(host_block *) + sizeof(uint8_t *)));
  if (!job) return oi__fail(OI_ERR_OUT_OF_MEMORY, "load: out of memory");
  host_block **blocks = oi__xfer_job_user(job);
  load_call c = {.job = job, .ids = ids, .data = (uint8_t **)(blocks + n)};
  oi_host_load_sink sink = {.data = c.data, .ready = load_ready, .ctx = &c};
  oi_status st = oi__host_load_begin(e->host, e->ns, base->principal, lease, n, blocks, &sink);
  if (st != OI_OK) {
    oi__xfer_job_free(job);
    if (st == OI_ERR_LEASE_EXPIRED || st == OI_ERR_PERMISSION)
      atomic_fetch_add(&e->c.loads_failed, 1);
    return st;
  }
  atomic_fetch_add(&e->c.loads_submitted, 1);
  oi_ticket *t = oi__xfer_job_ticket(job);
  st = oi__xfer_submit(job, "load"); /* a failure ends the loading marks, counts the failure */
  if (ticket_out) *ticket_out = st == OI_OK ? t : NULL;
  return st;
}

static oi_status local_release(oi_engine *base, oi_lease lease) {
  local_engine *e = (local_engine *)base;
  return oi__host_release(e->host, e->ns, base->principal, lease);
}

static oi_status local_flush(oi_engine *base, uint32_t timeout_ms) {
  local_engine *e = (local_engine *)base;
  uint64_t deadline = oi__deadline_ns(timeout_ms);
  struct timespec ts = oi__timespec(deadline);
  pthread_mutex_lock(&e->lock);
  uint64_t target = atomic_load(&e->save_ops_submitted);
  /* Take the in-flight duplicates noted so far; they are waited for below. */
  oi_block_hash *foreign = e->foreign;
  size_t nforeign = e->nforeign;
  e->foreign = NULL;
  e->nforeign = e->foreign_cap = 0;
  oi_status st = OI_OK;
  while (e->save_ops_done < target) {
    if (deadline == UINT64_MAX) {
      pthread_cond_wait(&e->flush_cv, &e->lock);
    } else if (pthread_cond_timedwait(&e->flush_cv, &e->lock, &ts) == ETIMEDOUT &&
               e->save_ops_done < target) {
      st = oi__fail(OI_ERR_TIMEOUT, "flush: %llu save(s) still in flight after %u ms",
                    (unsigned long long)(target - e->save_ops_done), timeout_ms);
      break;
    }
  }
  /* Blocks being saved layer by layer: until each sealed or aborted (its
   * last arena landed, or its deadline passed). */
  while (st == OI_OK && (e->npartials || e->partials_ending)) {
    uint64_t now = oi__now_ns(), pd = partials_next_deadline_locked(e);
    if (now >= deadline) {
      st = oi__fail(OI_ERR_TIMEOUT,
                    "flush: %zu block(s) saved layer by layer still incomplete after %u ms",
                    e->npartials + e->partials_ending, timeout_ms);
      break;
    }
    if (pd <= now) { /* expired records end once no copy into them is in flight */
      pthread_mutex_unlock(&e->lock);
      partials_sweep(e, false);
      pthread_mutex_lock(&e->lock);
      pd = now + 10000000ull; /* records with copies in flight: a job's end wakes us */
    }
    uint64_t until = OI_MIN(deadline, pd);
    if (until == UINT64_MAX) {
      pthread_cond_wait(&e->flush_cv, &e->lock);
    } else {
      struct timespec tw = oi__timespec(until);
      pthread_cond_timedwait(&e->flush_cv, &e->lock, &tw);
    }
  }
  pthread_mutex_unlock(&e->lock);
  size_t waited = 0;
  for (; st == OI_OK && waited < nforeign; waited++)
    if (!oi__host_wait_not_in_flight(e->host, e->ns, &foreign[waited], deadline)) {
      st = oi__fail(OI_ERR_TIMEOUT,
                    "flush: a block this engine deduplicated is still in flight (saved by another "
                    "engine) after %u ms",
                    timeout_ms);
      break; /* this one too stays noted */
    }
  /* Whatever was not waited for stays noted for the next flush. */
  for (size_t i = waited; i < nforeign; i++)
    note_foreign(e, &foreign[i]);
  oi__free(foreign);
  return st;
}

static oi_status local_stats(const oi_engine *base, oi_engine_stats *out) {
  local_engine *e = (local_engine *)base;
  oi_engine_stats s;
  memset(&s, 0, sizeof s);
  s.struct_size = sizeof s;
  s.instance_id = base->instance_id;
  s.block_bytes = base->layout.block_bytes;
  s.num_blocks = base->layout.num_blocks;
  s.saves_submitted = atomic_load(&e->c.saves_submitted);
  s.saves_completed = atomic_load(&e->c.saves_completed);
  s.saves_deduplicated = atomic_load(&e->c.saves_deduplicated);
  s.saves_dropped = atomic_load(&e->c.saves_dropped);
  s.saves_failed = atomic_load(&e->c.saves_failed);
  s.saves_not_encoded = atomic_load(&e->c.saves_not_encoded);
  s.loads_completed = atomic_load(&e->c.loads_completed);
  s.loads_failed = atomic_load(&e->c.loads_failed);
  s.blocks_loaded = atomic_load(&e->c.blocks_loaded);
  s.bytes_saved = atomic_load(&e->c.bytes_saved);
  s.bytes_loaded = atomic_load(&e->c.bytes_loaded);
  s.query_hit_blocks = atomic_load(&e->c.query_hit_blocks);
  s.query_miss_blocks = atomic_load(&e->c.query_miss_blocks);
  pthread_mutex_lock(&e->lock);
  s.saves_pending = atomic_load(&e->save_ops_submitted) - e->save_ops_done;
  pthread_mutex_unlock(&e->lock);
  s.loads_submitted = atomic_load(&e->c.loads_submitted);
  s.namespace_blocks_resident = oi__host_ns_resident(e->host, e->ns);
  s.latency_buckets = OI_LATENCY_BUCKETS;
  oi__hist_read(&e->c.save_latency, s.save_latency_us, &s.save_latency_sum_us);
  oi__hist_read(&e->c.load_latency, s.load_latency_us, &s.load_latency_sum_us);
  return oi__struct_out_min(out, &s, sizeof s, OI_FLOOR_ENGINE_STATS, "engine_stats");
}

/* Teardown: finish queued saves and loads (the pipeline drains and runs
 * their completions), drop this instance's leases, then unregister from the
 * host. */
static void local_destroy(oi_engine *base) {
  local_engine *e = (local_engine *)base;
  pthread_mutex_lock(&e->lock);
  bool sweeper = e->sweeper_started;
  e->sweeper_stop = true;
  pthread_cond_signal(&e->sweep_cv);
  pthread_mutex_unlock(&e->lock);
  if (sweeper) pthread_join(e->sweeper, NULL);
  oi__xfer_destroy(e->xfer);
  e->xfer = NULL;          /* (the codec's bounces went with it) */
  partials_sweep(e, true); /* blocks whose layers did not all arrive: aborted */
  if (e->host && base->instance_id) oi__host_instance_remove(e->host, base->instance_id);
  oi__free(e->foreign);
  pthread_cond_destroy(&e->sweep_cv);
  pthread_cond_destroy(&e->flush_cv);
  pthread_mutex_destroy(&e->lock);
  oi__engine_fini_common(base);
  oi__free(e);
}

static const engine_ops local_ops = {
    .save = local_save,
    .query = local_query,
    .load = local_load,
    .release = local_release,
    .flush = local_flush,
    .stats = local_stats,
    .destroy = local_destroy,
};

/* An environment variable that names one of two choices: -1 the first, 1
 * the second, 0 unset (or anything else, warned about: the default). */
static int env_choice(const char *var, const char *first, const char *second, uint32_t log_id) {
  const char *v = getenv(var);
  if (!v || !*v) return 0;
  if (strcmp(v, first) == 0) return -1;
  if (strcmp(v, second) == 0) return 1;
  OI_LOG_I(OI_LOG_WARN, "engine", log_id, "%s=%s is neither '%s' nor '%s': the default", var, v,
           first, second);
  return 0;
}

/* OI_CODEC_DECODE (OI_CODEC_ENCODE): "host", a codec namespace's loads
 * decode (its saves encode) on the host even where the device could;
 * "device" or unset, on the device where it can (docs/codecs.md). */
static bool codec_on_host(const char *var, uint32_t log_id) {
  return env_choice(var, "host", "device", log_id) < 0;
}

/* OI_LOSSLESS_CODE: "rans", a lossless namespace's frames code their
 * exponents by rANS; "planes" or unset, by the planes code (the default:
 * docs/codecs.md "The planes code"). */
static bool lossless_planes(uint32_t log_id) {
  return env_choice("OI_LOSSLESS_CODE", "rans", "planes", log_id) >= 0;
}

oi_status oi__local_engine_create(oi_host *h, const oi_engine_options *o, oi_engine **out) {
  local_engine *e = oi__calloc(1, sizeof *e);
  if (!e) return oi__fail(OI_ERR_OUT_OF_MEMORY, "register: out of memory");
  e->base.ops = &local_ops;
  pthread_mutex_init(&e->lock, NULL);
  oi__cond_init_monotonic(&e->flush_cv);
  oi__cond_init_monotonic(&e->sweep_cv);
  oi_status st = oi__engine_init_common(&e->base, o, "register");
  if (st != OI_OK) goto fail;
  const engine_codec *codec = &e->base.codec;
  if ((st = oi__host_bind_namespace(h, e->base.namespace_id,
                                    oi__engine_codec_stored_bytes(codec, &e->base.layout),
                                    oi__engine_codec_shape_hash(codec, e->base.layout.shape_hash),
                                    e->base.layout.block_bytes, codec->id, &e->ns)) != OI_OK)
    goto fail;
  oi_host_pool_info pool;
  oi__host_pool_info(h, &pool);
  const oi_engine_options *eo = &e->base.opts;
  oi_xfer_config xc = {
      .device = eo->device,
      .layout = &e->base.layout,
      .copy_mode = eo->copy_mode,
      .cta_limit = eo->copy_cta_limit,
      .host_mapped = pool.device_mapped,
      .group_bytes = eo->submit_group_bytes,
      .staging_bytes = eo->staging_bytes,
      .deadline_ms = {[OI_COPY_D2H] = eo->save_deadline_ms, [OI_COPY_H2D] = eo->load_deadline_ms},
      .log_id = &e->base.instance_id,
      .codec = codec->id,
      .codec_shape = codec->shape,
      .frame_bytes = codec->slot_bytes,
      .codec_host_decode = codec_on_host("OI_CODEC_DECODE", e->base.instance_id),
      .codec_host_encode = codec_on_host("OI_CODEC_ENCODE", e->base.instance_id),
      .codec_planes = codec->id == OI_CODEC_LOSSLESS && lossless_planes(e->base.instance_id),
      .block_bounce_bytes = e->layer_bounce_bytes = layer_bounce_bytes(pool.capacity_bytes),
      .done = job_done,
      .done_ctx = e};
  if ((st = oi__xfer_create(&xc, &e->xfer)) != OI_OK) goto fail;
  e->host = h;
  e->base.instance_id = oi__host_instance_add(h);
  OI_LOG_I(OI_LOG_INFO, "engine", e->base.instance_id,
           "registered '%s' namespace '%s': %u arenas, %llu blocks of %llu bytes",
           e->base.instance_name, e->base.namespace_id, e->base.layout.num_arenas,
           (unsigned long long)e->base.layout.num_blocks,
           (unsigned long long)e->base.layout.block_bytes);
  *out = &e->base;
  return OI_OK;
fail:
  local_destroy(&e->base);
  return st;
}
