/* The embedded engine: save / query / load / release / flush over a host in
 * this process. Copies run on two device streams (loads on the high-priority
 * one, so they never wait behind queued saves); a completion thread seals
 * saved blocks, ends loads and fires tickets and callbacks, so user callbacks
 * never run on a driver thread. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine_internal.h"
#include "host/host_internal.h"

typedef struct xfer_job {
  struct xfer_job *next;
  struct local_engine *e;
  bool is_load;
  oi_status status;
  size_t n;
  uint64_t bytes;
  uint64_t t0_ns;    /* submission, for the latency histograms */
  oi_ticket *ticket; /* the producer's reference, or NULL */
  oi_save_done_fn on_done;
  void *on_done_ctx;
  /* Deadline bookkeeping (engine's done_lock): a job is outstanding from the
   * moment its completion is queued until its copies land. */
  uint64_t deadline_ns;
  bool expired; /* the caller was told OI_ERR_TIMEOUT; the copy may still run */
  struct xfer_job *out_prev, *out_next;
  host_block *blocks[];
} xfer_job;

typedef struct engine_counters {
  atomic_uint_fast64_t saves_submitted, saves_completed, saves_deduplicated, saves_dropped,
      saves_failed, loads_completed, loads_failed, blocks_loaded, bytes_saved, bytes_loaded,
      query_hit_blocks, query_miss_blocks, loads_submitted;
  oi_latency_hist save_latency, load_latency;
} engine_counters;

typedef struct local_engine {
  oi_offload_engine base;
  oi_offload_host *host;
  oi_dev *dev;
  oi_stream *save_stream, *load_stream;
  uint32_t ns, cls;
  uint32_t save_mode, load_mode; /* resolved copy modes (see resolve_mode) */
  uint64_t save_group, load_group; /* bytes per queued group (see submit_group_bytes) */

  pthread_t done_thread;
  bool done_started;
  pthread_mutex_t done_lock;
  pthread_cond_t done_cv;  /* a job arrived, or stop */
  pthread_cond_t flush_cv; /* a save operation finished */
  xfer_job *head, *tail;
  xfer_job *outstanding; /* queued jobs whose copies have not landed */
  bool stopping;
  uint64_t save_ops_submitted, save_ops_done;
  /* Hashes this engine's saves deduplicated against blocks another engine
   * still had in flight: a flush also waits for those to seal. */
  oi_block_hash *foreign;
  size_t nforeign, foreign_cap;

  engine_counters c;
} local_engine;

static const engine_ops local_ops;

/* ---- completion ---------------------------------------------------------- */

/* Runs on the stream (a driver or worker thread): only hands the job over. */
static void job_arrived(void *arg, oi_status st) {
  xfer_job *job = arg;
  local_engine *e = job->e;
  job->status = st;
  job->next = NULL;
  pthread_mutex_lock(&e->done_lock);
  if (e->tail)
    e->tail->next = job;
  else
    e->head = job;
  e->tail = job;
  pthread_cond_signal(&e->done_cv);
  pthread_mutex_unlock(&e->done_lock);
}

static void seal_or_discard(local_engine *e, xfer_job *job) {
  oi_offload_host *h = e->host;
  uint64_t now = oi__now_ns();
  for (size_t i = 0; i < job->n; i++) {
    host_block *b = job->blocks[i];
    index_shard *s = &h->shards[b->shard];
    pthread_mutex_lock(&s->lock);
    if (job->status == OI_OK) {
      b->state = BLOCK_SEALED;
      b->last_used = now;
      if (b->pins == 0 && b->loading == 0) oi__lru_push_locked(s, b);
      pthread_mutex_unlock(&s->lock);
    } else {
      oi__index_remove_locked(s, b); /* never visible: nothing partial is served */
      pthread_mutex_unlock(&s->lock);
      oi__pool_free(h, b);
    }
  }
  if (job->status != OI_OK) oi__ns_resident_add(h, e->ns, (uint64_t)0 - job->n);
  atomic_fetch_sub(&h->c.blocks_in_flight, job->n);
  if (job->status == OI_OK) {
    atomic_fetch_add(&h->c.blocks_sealed, job->n);
    atomic_fetch_add(&h->c.saves_completed, job->n);
    atomic_fetch_add(&h->c.bytes_saved, job->bytes);
    atomic_fetch_add(&e->c.saves_completed, job->n);
    atomic_fetch_add(&e->c.bytes_saved, job->bytes);
  } else {
    atomic_fetch_add(&h->c.saves_failed, job->n);
    atomic_fetch_add(&e->c.saves_failed, job->n);
    OI_LOG_I(OI_LOG_WARN, "engine", e->base.instance_id, "save of %zu blocks failed: %s (dropped)",
             job->n, oi_status_str(job->status));
  }
}

static void finish_load(local_engine *e, xfer_job *job) {
  oi__host_load_end(e->host, job->blocks, job->n);
  oi_offload_host *h = e->host;
  if (job->status == OI_OK) {
    atomic_fetch_add(&h->c.loads_completed, 1);
    atomic_fetch_add(&h->c.blocks_loaded, job->n);
    atomic_fetch_add(&h->c.bytes_loaded, job->bytes);
    atomic_fetch_add(&e->c.loads_completed, 1);
    atomic_fetch_add(&e->c.blocks_loaded, job->n);
    atomic_fetch_add(&e->c.bytes_loaded, job->bytes);
  } else {
    atomic_fetch_add(&h->c.loads_failed, 1);
    atomic_fetch_add(&e->c.loads_failed, 1);
  }
}

static void complete_job(local_engine *e, xfer_job *job) {
  /* A job whose deadline passed was already reported as OI_ERR_TIMEOUT (its
   * ticket and on_done fired then): what it copied is not trusted, so a late
   * save is discarded rather than sealed. */
  if (job->expired) job->status = OI_ERR_TIMEOUT;
  if (job->n) { /* operations that copied something */
    uint64_t dt = oi__now_ns() - job->t0_ns;
    oi__hist_record(job->is_load ? &e->host->c.load_latency : &e->host->c.save_latency, dt);
    oi__hist_record(job->is_load ? &e->c.load_latency : &e->c.save_latency, dt);
  }
  if (job->is_load) {
    finish_load(e, job);
  } else {
    seal_or_discard(e, job);
    oi__host_notify_sealed(e->host);
    pthread_mutex_lock(&e->done_lock);
    e->save_ops_done++;
    pthread_cond_broadcast(&e->flush_cv);
    pthread_mutex_unlock(&e->done_lock);
  }
  if (job->on_done) job->on_done(job->on_done_ctx, job->status);
  if (job->ticket) oi__ticket_complete(job->ticket, job->status);
  oi__free(job);
}

static void outstanding_remove_locked(local_engine *e, xfer_job *job) {
  if (job->out_prev)
    job->out_prev->out_next = job->out_next;
  else if (e->outstanding == job)
    e->outstanding = job->out_next;
  else
    return; /* not on the list */
  if (job->out_next) job->out_next->out_prev = job->out_prev;
  job->out_prev = job->out_next = NULL;
}

/* Deadlines: a job whose copies have not landed by its deadline is reported
 * to the caller as OI_ERR_TIMEOUT now; its memory stays held (slots in
 * flight, blocks marked loading) until the copy really ends. */
typedef struct expired_cb {
  oi_ticket *ticket;
  oi_save_done_fn on_done;
  void *ctx;
} expired_cb;

static void expire_jobs_locked(local_engine *e, uint64_t now, uint64_t *next_deadline) {
  for (;;) {
    expired_cb fire[32];
    size_t nfire = 0;
    *next_deadline = UINT64_MAX;
    for (xfer_job *j = e->outstanding; j; j = j->out_next) {
      if (j->expired) continue;
      if (j->deadline_ns > now || nfire == OI_ARRAY_LEN(fire)) {
        *next_deadline = OI_MIN(*next_deadline, j->deadline_ns);
        continue;
      }
      j->expired = true;
      fire[nfire++] = (expired_cb){j->ticket, j->on_done, j->on_done_ctx};
      j->ticket = NULL;
      j->on_done = NULL;
      OI_LOG_I(OI_LOG_WARN, "engine", e->base.instance_id, "%s of %zu blocks missed its %u ms deadline",
             j->is_load ? "load" : "save", j->n,
             j->is_load ? e->base.opts.load_deadline_ms : e->base.opts.save_deadline_ms);
    }
    if (nfire == 0) return;
    pthread_mutex_unlock(&e->done_lock); /* callbacks run without the lock */
    for (size_t i = 0; i < nfire; i++) {
      if (fire[i].on_done) fire[i].on_done(fire[i].ctx, OI_ERR_TIMEOUT);
      if (fire[i].ticket) oi__ticket_complete(fire[i].ticket, OI_ERR_TIMEOUT);
    }
    pthread_mutex_lock(&e->done_lock);
  }
}

static void *done_main(void *arg) {
  local_engine *e = arg;
  pthread_mutex_lock(&e->done_lock);
  for (;;) {
    uint64_t next_deadline;
    expire_jobs_locked(e, oi__now_ns(), &next_deadline);
    if (!e->head && !e->stopping) {
      if (next_deadline == UINT64_MAX) {
        pthread_cond_wait(&e->done_cv, &e->done_lock);
      } else {
        struct timespec ts = {.tv_sec = (time_t)(next_deadline / 1000000000ull),
                              .tv_nsec = (long)(next_deadline % 1000000000ull)};
        pthread_cond_timedwait(&e->done_cv, &e->done_lock, &ts);
      }
      continue;
    }
    xfer_job *job = e->head;
    if (!job) break; /* stopping and drained */
    e->head = job->next;
    if (!e->head) e->tail = NULL;
    outstanding_remove_locked(e, job);
    pthread_mutex_unlock(&e->done_lock);
    complete_job(e, job);
    pthread_mutex_lock(&e->done_lock);
  }
  pthread_mutex_unlock(&e->done_lock);
  return NULL;
}

static xfer_job *job_new(local_engine *e, bool is_load, size_t n) {
  xfer_job *job = oi__calloc(1, sizeof *job + n * sizeof(host_block *));
  if (job) {
    job->e = e;
    job->is_load = is_load;
    job->t0_ns = oi__now_ns();
  }
  return job;
}

/* Copies are queued in groups of about this many bytes as blocks are
 * accepted, so the device starts moving the first blocks while the host is
 * still indexing the rest of a large batch. OI_SUBMIT_GROUP_MB overrides it
 * (a tuning knob for benchmarks; 0 = one group per operation). */
#define DMA_GROUP_BYTES (8ull << 20)     /* many batch calls keep the copy engines fed */
#define KERNEL_GROUP_BYTES (32ull << 20) /* each launch has a tail: fewer, larger ones */

static uint64_t submit_group_bytes(uint32_t mode) {
  const char *env = getenv("OI_SUBMIT_GROUP_MB");
  if (!env || !*env) return mode == OI_XFER_DMA ? DMA_GROUP_BYTES : KERNEL_GROUP_BYTES;
  unsigned long long mb = strtoull(env, NULL, 10);
  return mb ? (uint64_t)mb << 20 : UINT64_MAX / 2;
}

/* The default policy (copy_mode AUTO), decided per direction from the
 * layout. A layout whose pieces are large (a page-first layout: one piece per
 * block) goes to the copy engines directly: they run at full speed there and
 * cost the model's kernels nothing. Otherwise, when a host block is large
 * enough, copies are staged: the copy engines move whole host blocks at the
 * bulk rate through device staging slots and a short kernel gathers or
 * scatters the pieces (a few microseconds of SMs per slot, so the model
 * barely notices; docs/benchmarks.md). Small blocks: loads (on a request's
 * critical path) use the copy kernel with the CTA limit, saves the copy
 * engines piece by piece. */
static uint32_t resolve_mode(const oi_layout *l, uint32_t mode, oi_copy_dir dir) {
  if (mode != OI_COPY_AUTO) return mode;
  /* Pieces per block after merging: a page-first layout is one piece. */
  size_t pieces = 0;
  uint64_t end = 0;
  for (uint32_t a = 0; a < l->num_arenas; a++)
    for (uint32_t s = 0; s < l->arenas[a].segments; s++) {
      uint64_t start = l->arenas[a].base + s * l->arenas[a].segment_stride;
      if (pieces == 0 || start != end) pieces++;
      end = start + l->arenas[a].bytes_per_block;
    }
  if (l->block_bytes / pieces >= OI_AUTO_DMA_PIECE_BYTES) return OI_XFER_DMA;
  if (l->block_bytes >= OI_AUTO_STAGE_BLOCK_BYTES) return OI_XFER_STAGED;
  return dir == OI_COPY_D2H ? OI_XFER_DMA : OI_XFER_KERNEL;
}

/* Queues the copies of n blocks (device ids[i] <-> blocks[i]) of the arenas
 * of `l` (the engine's layout, or a view of some of its arenas) on `s`. */
static oi_status queue_copies_in(local_engine *e, const oi_layout *l, uint32_t mode, oi_stream *s,
                                 oi_copy_dir dir, const int64_t *ids, host_block *const *blocks,
                                 size_t n) {
  if (n == 0) return OI_OK;
  uint8_t *stack_data[64] = {0};
  uint8_t **datas = n <= 64 ? stack_data : oi__malloc(n * sizeof *datas);
  if (!datas) return oi__fail(OI_ERR_OUT_OF_MEMORY, "out of memory for a copy plan");
  for (size_t i = 0; i < n; i++) datas[i] = oi__block_data(e->host, blocks[i]);
  oi_copy_desc *descs = NULL;
  size_t nd = 0;
  oi_status st = oi__plan_build(l, ids, datas, n, dir, &descs, &nd);
  if (datas != stack_data) oi__free(datas);
  if (st != OI_OK) return st;
  oi_copy_params cp = {.mode = mode,
                       .cta_limit = e->base.opts.copy_cta_limit,
                       .host_mapped = e->host->pool.device != NULL && e->host->dev->ordinal >= 0};
  st = e->dev->ops->stream_copy(s, dir, descs, nd, &cp);
  oi__free(descs);
  return st;
}

static oi_status queue_copies(local_engine *e, oi_stream *s, oi_copy_dir dir, const int64_t *ids,
                              host_block *const *blocks, size_t n) {
  return queue_copies_in(e, &e->base.layout, dir == OI_COPY_D2H ? e->save_mode : e->load_mode, s,
                         dir, ids, blocks, n);
}

/* A layered load (OI_LOAD_ARENA_EVENTS, job->ticket set): each arena's
 * copies, then an event. The events go to the ticket (which destroys them)
 * once all are queued. */
static oi_status queue_layered(local_engine *e, xfer_job *job, const int64_t *ids, size_t n) {
  const oi_layout *l = &e->base.layout;
  void **evs = oi__calloc(l->num_arenas, sizeof *evs);
  if (!evs) return oi__fail(OI_ERR_OUT_OF_MEMORY, "load: out of memory for arena events");
  uint32_t mode = e->load_mode == OI_XFER_STAGED ? OI_XFER_DMA : e->load_mode;
  oi_layout one = *l;
  one.num_arenas = 1;
  oi_status st = OI_OK;
  for (uint32_t a = 0; a < l->num_arenas && st == OI_OK; a++) {
    one.arenas = &l->arenas[a];
    one.block_bytes = (uint64_t)one.arenas->segments * one.arenas->bytes_per_block;
    st = queue_copies_in(e, &one, mode, e->load_stream, OI_COPY_H2D, ids, job->blocks, n);
    if (st == OI_OK) st = e->dev->ops->stream_record_event(e->load_stream, &evs[a]);
  }
  if (st == OI_OK) {
    oi__ticket_set_arena_events(job->ticket, evs, l->num_arenas, e->dev->ops->event_destroy);
    return OI_OK;
  }
  for (uint32_t a = 0; a < l->num_arenas; a++)
    if (evs[a]) e->dev->ops->event_destroy(evs[a]);
  oi__free(evs);
  return st;
}

/* Queues the completion of `job` after its copies: an event for the ticket
 * (so a compute stream can wait on the device rather than the CPU waiting on
 * the ticket), then the hand-over to the completion thread. */
static oi_status queue_completion(local_engine *e, oi_stream *s, xfer_job *job) {
  job->bytes = job->n * e->base.layout.block_bytes;
  oi_status st = OI_OK;
  if (job->ticket) {
    void *ev = NULL;
    st = e->dev->ops->stream_record_event(s, &ev);
    if (st == OI_OK && ev) oi__ticket_set_cuda_event(job->ticket, ev, e->dev->ops->event_destroy);
  }
  if (st != OI_OK) return st;
  uint32_t ms = job->is_load ? e->base.opts.load_deadline_ms : e->base.opts.save_deadline_ms;
  job->deadline_ns = oi__deadline_ns(ms ? ms : UINT32_MAX);
  pthread_mutex_lock(&e->done_lock);
  job->out_next = e->outstanding;
  if (e->outstanding) e->outstanding->out_prev = job;
  e->outstanding = job;
  pthread_cond_signal(&e->done_cv); /* the done thread re-arms its timer */
  pthread_mutex_unlock(&e->done_lock);
  st = e->dev->ops->stream_call(s, job_arrived, job);
  if (st != OI_OK) {
    pthread_mutex_lock(&e->done_lock);
    outstanding_remove_locked(e, job);
    pthread_mutex_unlock(&e->done_lock);
  }
  return st;
}

/* After a failure to queue part of a job: let whatever was queued finish (a
 * slot is never freed under a copy that may still run), then complete the job
 * with `st` instead of handing the ticket to the caller. */
static oi_status fail_job(local_engine *e, oi_stream *s, xfer_job *job, oi_ticket *t, oi_status st,
                          const char *what) {
  char msg[256];
  snprintf(msg, sizeof msg, "%s", oi_last_error());
  e->dev->ops->stream_sync(s);
  job->status = st;
  job->ticket = NULL;
  job->on_done = NULL;
  complete_job(e, job);
  if (t) {
    oi__ticket_unref(t); /* the producer's reference */
    oi__ticket_unref(t); /* the observer's: the caller gets the error, not a ticket */
  }
  return oi__fail(st, "%s: %s", what, msg);
}

/* Remembers a hash deduplicated against a block still in flight (another
 * engine's save, or an earlier one of ours) for the next flush. Best effort
 * under memory pressure: the flush then covers what was remembered. */
static void note_foreign(local_engine *e, const oi_block_hash *hash) {
  pthread_mutex_lock(&e->done_lock);
  if (e->nforeign == e->foreign_cap) {
    size_t cap = e->foreign_cap ? 2 * e->foreign_cap : 64;
    oi_block_hash *n = oi__realloc(e->foreign, cap * sizeof *n);
    if (!n) {
      pthread_mutex_unlock(&e->done_lock);
      OI_LOG_I(OI_LOG_WARN, "engine", e->base.instance_id,
               "out of memory tracking in-flight duplicates");
      return;
    }
    e->foreign = n;
    e->foreign_cap = cap;
  }
  e->foreign[e->nforeign++] = *hash;
  pthread_mutex_unlock(&e->done_lock);
}

/* ---- operations ------------------------------------------------------------- */

static oi_status local_save(oi_offload_engine *base, const int64_t *ids, const oi_block_hash *hashes,
                            size_t n, const oi_save_options *opt, oi_ticket **ticket_out) {
  local_engine *e = (local_engine *)base;
  oi_offload_host *h = e->host;
  xfer_job *job = job_new(e, false, n);
  int64_t *acc_ids = oi__malloc(n * sizeof *acc_ids);
  host_block **spare = oi__malloc(n * sizeof *spare);
  oi_ticket *t = ticket_out ? oi__ticket_new() : NULL;
  if (!job || !acc_ids || !spare || (ticket_out && !t)) {
    oi__free(job);
    oi__free(acc_ids);
    oi__free(spare);
    if (t) {
      oi__ticket_unref(t);
      oi__ticket_unref(t);
    }
    return oi__fail(OI_ERR_OUT_OF_MEMORY, "save: out of memory");
  }
  job->ticket = t;
  job->on_done = opt->on_done;
  job->on_done_ctx = opt->on_done_ctx;
  pthread_mutex_lock(&e->done_lock);
  e->save_ops_submitted++;
  pthread_mutex_unlock(&e->done_lock);

  /* Free slots for the whole call in one lock acquisition; eviction only
   * when the free list runs dry. */
  size_t nspare = oi__pool_alloc_batch(h, e->cls, n, spare), used = 0;
  uint64_t dedup = 0, dropped = 0, group_blocks = e->save_group / base->layout.block_bytes + 1;
  size_t k = 0, queued = 0;
  oi_status st = OI_OK;
  oi__index_prefetch(h, e->ns, hashes, n);
  if (opt->wait_event) st = e->dev->ops->stream_wait_event(e->save_stream, opt->wait_event);
  for (size_t i = 0; i < n; i++) {
    uint64_t key = oi__index_key(e->ns, &hashes[i]);
    index_shard *s = oi__index_shard_of(h, key);
    pthread_mutex_lock(&s->lock);
    host_block *b = oi__index_find_key_locked(s, key, e->ns, &hashes[i]);
    if (b) {
      bool in_flight = b->state == BLOCK_IN_FLIGHT;
      if (b->state == BLOCK_SEALED && b->pins == 0 && b->loading == 0) {
        oi__lru_remove_locked(s, b); /* a re-save is a use: move to the recent end */
        b->last_used = oi__now_ns();
        oi__lru_push_locked(s, b);
      }
      pthread_mutex_unlock(&s->lock);
      dedup++;
      if (in_flight) note_foreign(e, &hashes[i]);
      continue;
    }
    if (used == nspare && nspare < n) {
      /* The free list ran dry: evict for the rest of the call at once (no
       * shard lock may be held while evicting). */
      pthread_mutex_unlock(&s->lock);
      nspare += oi__index_evict_batch(h, (int)e->cls, n - i, spare + nspare);
      pthread_mutex_lock(&s->lock);
      if (oi__index_find_locked(s, e->ns, &hashes[i])) { /* raced with another saver */
        pthread_mutex_unlock(&s->lock);
        dedup++;
        continue;
      }
    }
    host_block *nb = used < nspare ? spare[used++] : NULL;
    if (!nb) {
      pthread_mutex_unlock(&s->lock);
      nb = oi__pool_alloc(h, e->cls); /* may evict: no shard lock held */
      if (!nb) {
        dropped++;
        continue;
      }
      pthread_mutex_lock(&s->lock);
      if (oi__index_find_locked(s, e->ns, &hashes[i])) { /* raced with another saver */
        pthread_mutex_unlock(&s->lock);
        oi__pool_free(h, nb);
        dedup++;
        continue;
      }
    }
    nb->hash = hashes[i];
    nb->ns = e->ns;
    nb->state = BLOCK_IN_FLIGHT;
    oi__index_insert_locked(h, s, nb);
    pthread_mutex_unlock(&s->lock);
    job->blocks[k] = nb;
    acc_ids[k++] = ids[i];
    if (st == OI_OK && k - queued >= group_blocks) {
      st = queue_copies(e, e->save_stream, OI_COPY_D2H, acc_ids + queued, job->blocks + queued, k - queued);
      queued = k;
    }
  }
  if (used < nspare) oi__pool_free_batch(h, spare + used, nspare - used);
  oi__free(spare);
  job->n = k;
  atomic_fetch_add(&h->c.blocks_in_flight, k);
  oi__ns_resident_add(h, e->ns, k);
  atomic_fetch_add(&h->c.saves_submitted, n);
  atomic_fetch_add(&h->c.saves_deduplicated, dedup);
  atomic_fetch_add(&h->c.saves_dropped, dropped);
  atomic_fetch_add(&e->c.saves_submitted, n);
  atomic_fetch_add(&e->c.saves_deduplicated, dedup);
  atomic_fetch_add(&e->c.saves_dropped, dropped);
  if (dropped)
    OI_LOG_I(OI_LOG_DEBUG, "engine", base->instance_id, "save dropped %llu of %zu blocks (pool full)",
             (unsigned long long)dropped, n);

  if (k == 0 && st == OI_OK) { /* nothing to copy: done now */
    job->status = OI_OK;
    complete_job(e, job);
  } else {
    if (st == OI_OK)
      st = queue_copies(e, e->save_stream, OI_COPY_D2H, acc_ids + queued, job->blocks + queued, k - queued);
    if (st == OI_OK) st = queue_completion(e, e->save_stream, job);
    if (st != OI_OK) {
      fail_job(e, e->save_stream, job, t, st, "save");
      t = NULL;
    }
  }
  oi__free(acc_ids);
  if (ticket_out) *ticket_out = t;
  return st;
}

static oi_status local_query(oi_offload_engine *base, const char *req_id,
                             const oi_block_hash *hashes, size_t n, uint32_t flags,
                             oi_query_result *out) {
  OI_UNUSED(req_id); /* no deeper tier yet: every answer is final (READY) */
  local_engine *e = (local_engine *)base;
  oi_offload_host *h = e->host;
  oi_query_result r;
  memset(&r, 0, sizeof r);
  r.struct_size = sizeof r;
  r.state = OI_QUERY_READY;
  bool has_present = out->struct_size >= offsetof(oi_query_result, present) + sizeof(uint8_t *);
  r.present = has_present ? out->present : NULL;

  oi__index_prefetch(h, e->ns, hashes, n);
  if (flags & OI_QUERY_MEMBERSHIP) {
    for (size_t i = 0; i < n; i++) {
      uint64_t key = oi__index_key(e->ns, &hashes[i]);
      index_shard *s = oi__index_shard_of(h, key);
      pthread_mutex_lock(&s->lock);
      host_block *b = oi__index_find_key_locked(s, key, e->ns, &hashes[i]);
      bool hit = b && b->state == BLOCK_SEALED;
      pthread_mutex_unlock(&s->lock);
      r.present[i] = hit;
      r.hit_blocks += hit;
    }
  } else if (n > 0) {
    host_block *stack[64], **pinned = n <= 64 ? stack : oi__malloc(n * sizeof *pinned);
    if (!pinned) return oi__fail(OI_ERR_OUT_OF_MEMORY, "query: out of memory");
    size_t hits = 0;
    pin_tally tally = {0, 0};
    for (; hits < n; hits++) {
      uint64_t key = oi__index_key(e->ns, &hashes[hits]);
      index_shard *s = oi__index_shard_of(h, key);
      pthread_mutex_lock(&s->lock);
      host_block *b = oi__index_find_key_locked(s, key, e->ns, &hashes[hits]);
      bool hit = b && b->state == BLOCK_SEALED;
      if (hit) oi__block_pin_locked(s, b, &tally);
      pthread_mutex_unlock(&s->lock);
      if (!hit) break;
      pinned[hits] = b;
    }
    oi__pin_tally_apply(h, &tally);
    if (hits > 0) {
      oi_status st = oi__lease_create(h, base->instance_id, base->opts.world_size, pinned, hits, &r.lease);
      if (st != OI_OK) {
        pin_tally undo = {0, 0};
        for (size_t i = 0; i < hits; i++) {
          index_shard *s = &h->shards[pinned[i]->shard];
          pthread_mutex_lock(&s->lock);
          oi__block_unpin_locked(s, pinned[i], &undo);
          pthread_mutex_unlock(&s->lock);
        }
        oi__pin_tally_apply(h, &undo);
        if (pinned != stack) oi__free(pinned);
        return st;
      }
    }
    if (pinned != stack) oi__free(pinned);
    r.hit_blocks = hits;
  }
  uint64_t misses = n - r.hit_blocks;
  atomic_fetch_add(&h->c.query_hit_blocks, r.hit_blocks);
  atomic_fetch_add(&h->c.query_miss_blocks, misses);
  atomic_fetch_add(&e->c.query_hit_blocks, r.hit_blocks);
  atomic_fetch_add(&e->c.query_miss_blocks, misses);
  return oi__struct_out(out, &r, sizeof r, "query");
}

static oi_status local_load(oi_offload_engine *base, oi_lease lease, const int64_t *ids, size_t n,
                            const oi_load_options *opt, oi_ticket **ticket_out) {
  local_engine *e = (local_engine *)base;
  xfer_job *job = job_new(e, true, n);
  oi_ticket *t = ticket_out ? oi__ticket_new() : NULL;
  if (!job || (ticket_out && !t)) {
    oi__free(job);
    if (t) {
      oi__ticket_unref(t);
      oi__ticket_unref(t);
    }
    return oi__fail(OI_ERR_OUT_OF_MEMORY, "load: out of memory");
  }
  oi_status st = oi__lease_consume(e->host, base->instance_id, lease, n, job->blocks);
  if (st != OI_OK) {
    oi__free(job);
    if (t) {
      oi__ticket_unref(t);
      oi__ticket_unref(t);
    }
    if (st == OI_ERR_LEASE_EXPIRED || st == OI_ERR_PERMISSION) {
      atomic_fetch_add(&e->host->c.loads_failed, 1);
      atomic_fetch_add(&e->c.loads_failed, 1);
    }
    return st;
  }
  job->n = n;
  job->ticket = t;
  atomic_fetch_add(&e->host->c.loads_submitted, 1);
  atomic_fetch_add(&e->c.loads_submitted, 1);
  /* Queue in groups so the first blocks move while the plan for the rest is
   * built; the first group is small (a restore's latency starts with it). */
  size_t group_blocks = e->load_group / base->layout.block_bytes + 1;
  size_t first_blocks = OI_MIN(group_blocks, DMA_GROUP_BYTES / base->layout.block_bytes + 1);
  if ((opt->flags & OI_LOAD_ARENA_EVENTS) && e->dev->ordinal >= 0 && t)
    st = queue_layered(e, job, ids, n);
  else
    for (size_t i = 0, g = first_blocks; i < n && st == OI_OK; i += g, g = group_blocks)
      st = queue_copies(e, e->load_stream, OI_COPY_H2D, ids + i, job->blocks + i,
                        OI_MIN(g, n - i));
  if (st == OI_OK) st = queue_completion(e, e->load_stream, job);
  if (st != OI_OK) {
    fail_job(e, e->load_stream, job, t, st, "load"); /* ends the loading marks, counts the failure */
    t = NULL;
  }
  if (ticket_out) *ticket_out = t;
  return st;
}

static oi_status local_release(oi_offload_engine *base, oi_lease lease) {
  local_engine *e = (local_engine *)base;
  return oi__lease_release(e->host, base->instance_id, lease);
}

static oi_status local_flush(oi_offload_engine *base, uint32_t timeout_ms) {
  local_engine *e = (local_engine *)base;
  uint64_t deadline = oi__deadline_ns(timeout_ms);
  struct timespec ts = {.tv_sec = (time_t)(deadline / 1000000000ull),
                        .tv_nsec = (long)(deadline % 1000000000ull)};
  pthread_mutex_lock(&e->done_lock);
  uint64_t target = e->save_ops_submitted;
  /* Take the in-flight duplicates noted so far; they are waited for below. */
  oi_block_hash *foreign = e->foreign;
  size_t nforeign = e->nforeign;
  e->foreign = NULL;
  e->nforeign = e->foreign_cap = 0;
  oi_status st = OI_OK;
  while (e->save_ops_done < target) {
    if (deadline == UINT64_MAX) {
      pthread_cond_wait(&e->flush_cv, &e->done_lock);
    } else if (pthread_cond_timedwait(&e->flush_cv, &e->done_lock, &ts) == ETIMEDOUT &&
               e->save_ops_done < target) {
      st = oi__fail(OI_ERR_TIMEOUT, "flush: %llu save(s) still in flight after %u ms",
                    (unsigned long long)(target - e->save_ops_done), timeout_ms);
      break;
    }
  }
  pthread_mutex_unlock(&e->done_lock);
  size_t waited = 0;
  for (; st == OI_OK && waited < nforeign; waited++)
    if (!oi__host_wait_not_in_flight(e->host, e->ns, &foreign[waited], deadline))
      st = oi__fail(OI_ERR_TIMEOUT,
                    "flush: a block this engine deduplicated is still in flight (saved by another "
                    "engine) after %u ms",
                    timeout_ms);
  /* Whatever was not waited for stays noted for the next flush. */
  for (size_t i = waited; i < nforeign; i++) note_foreign(e, &foreign[i]);
  oi__free(foreign);
  return st;
}

static oi_status local_stats(const oi_offload_engine *base, oi_engine_stats *out) {
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
  s.loads_completed = atomic_load(&e->c.loads_completed);
  s.loads_failed = atomic_load(&e->c.loads_failed);
  s.blocks_loaded = atomic_load(&e->c.blocks_loaded);
  s.bytes_saved = atomic_load(&e->c.bytes_saved);
  s.bytes_loaded = atomic_load(&e->c.bytes_loaded);
  s.query_hit_blocks = atomic_load(&e->c.query_hit_blocks);
  s.query_miss_blocks = atomic_load(&e->c.query_miss_blocks);
  pthread_mutex_lock((pthread_mutex_t *)&e->done_lock);
  s.saves_pending = e->save_ops_submitted - e->save_ops_done;
  pthread_mutex_unlock((pthread_mutex_t *)&e->done_lock);
  s.loads_submitted = atomic_load(&e->c.loads_submitted);
  s.namespace_blocks_resident = oi__ns_resident_get(e->host, e->ns);
  s.latency_buckets = OI_LATENCY_BUCKETS;
  oi__hist_read(&e->c.save_latency, s.save_latency_us, &s.save_latency_sum_us);
  oi__hist_read(&e->c.load_latency, s.load_latency_us, &s.load_latency_sum_us);
  return oi__struct_out(out, &s, sizeof s, "engine_stats");
}

/* Teardown: finish queued saves and loads (the streams drain, their
 * completions run), stop the completion thread, drop this instance's leases,
 * then unregister from the host. */
static void local_destroy(oi_offload_engine *base) {
  local_engine *e = (local_engine *)base;
  if (e->dev) {
    if (e->load_stream) e->dev->ops->stream_destroy(e->load_stream);
    if (e->save_stream) e->dev->ops->stream_destroy(e->save_stream);
  }
  if (e->done_started) {
    pthread_mutex_lock(&e->done_lock);
    e->stopping = true;
    pthread_cond_broadcast(&e->done_cv);
    pthread_mutex_unlock(&e->done_lock);
    pthread_join(e->done_thread, NULL);
  }
  if (e->host && base->instance_id) {
    oi__lease_drop_instance(e->host, base->instance_id);
    atomic_fetch_sub(&e->host->live_engines, 1);
  }
  oi__dev_close(e->dev);
  oi__free(e->foreign);
  pthread_cond_destroy(&e->flush_cv);
  pthread_cond_destroy(&e->done_cv);
  pthread_mutex_destroy(&e->done_lock);
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

oi_status oi__local_engine_create(oi_offload_host *h, const oi_engine_options *o,
                                  oi_offload_engine **out) {
  local_engine *e = oi__calloc(1, sizeof *e);
  if (!e) return oi__fail(OI_ERR_OUT_OF_MEMORY, "register: out of memory");
  e->base.ops = &local_ops;
  pthread_mutex_init(&e->done_lock, NULL);
  pthread_condattr_t ca; /* deadlines are CLOCK_MONOTONIC (oi__deadline_ns) */
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&e->done_cv, &ca);
  pthread_cond_init(&e->flush_cv, &ca);
  pthread_condattr_destroy(&ca);
  oi_status st = oi__engine_init_common(&e->base, o, "register");
  if (st != OI_OK) goto fail;
  if ((st = oi__host_bind_namespace(h, e->base.namespace_id, e->base.layout.block_bytes,
                                    e->base.layout.shape_hash, &e->ns, &e->cls)) != OI_OK)
    goto fail;
  e->save_mode = resolve_mode(&e->base.layout, e->base.opts.copy_mode, OI_COPY_D2H);
  e->load_mode = resolve_mode(&e->base.layout, e->base.opts.copy_mode, OI_COPY_H2D);
  e->save_group = submit_group_bytes(e->save_mode);
  e->load_group = submit_group_bytes(e->load_mode);
  if ((st = oi__dev_open(e->base.opts.device, &e->dev)) != OI_OK) goto fail;
  if ((st = e->dev->ops->stream_create(e->dev, 0, &e->save_stream)) != OI_OK) goto fail;
  if ((st = e->dev->ops->stream_create(e->dev, 1, &e->load_stream)) != OI_OK) goto fail;
  int rc = pthread_create(&e->done_thread, NULL, done_main, e);
  if (rc != 0) {
    st = oi__fail(OI_ERR_INTERNAL, "register: cannot start a completion thread: %s", strerror(rc));
    goto fail;
  }
  pthread_setname_np(e->done_thread, "oi-engine-done");
  e->done_started = true;
  e->host = h;
  e->base.instance_id = atomic_fetch_add(&h->next_instance, 1) + 1;
  atomic_fetch_add(&h->live_engines, 1);
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
