/* The executor's scheduler: one step over every rank.
 *
 * At the step boundary, per rank: save completions unpin their blocks,
 * finished restores are committed (or degrade to prefill), and waiting
 * requests are admitted in FCFS order under the sequence and block budgets
 * (admission probes the GPU prefix cache, queries the host tier for the
 * rest, reserves every block the request will need, and starts the load).
 * Then every rank with work runs one forward batch on its worker thread
 * (decodes first, then prefill chunks, under max_batch_tokens), the ranks in
 * parallel; then tokens are sampled, newly full blocks enter the prefix
 * cache, and finished requests save their blocks and release them. */
#include <stdio.h>
#include <string.h>

#include "executor/executor_internal.h"

/* ---- requests ---------------------------------------------------------------- */

oi_status oi__executor_restore_timing(const oi_executor *x, uint64_t request_id,
                                      oi_exec_restore_timing *out) {
  request *q = oi__exec_find(x, request_id);
  if (!q)
    return oi__fail(OI_ERR_NOT_FOUND, "restore_timing: no request %llu",
                    (unsigned long long)request_id);
  out->query_ns = q->restore_query_ns;
  out->load_ns = q->restore_load_done_ns > q->restore_load_start_ns && q->restore_load_start_ns
                     ? q->restore_load_done_ns - q->restore_load_start_ns
                     : 0;
  out->commit_ns = q->restore_commit_ns;
  return OI_OK;
}

request *oi__exec_find(const oi_executor *x, uint64_t id) {
  for (request *q = x->by_id[id & x->by_id_mask]; q; q = q->hnext)
    if (q->id == id) return q;
  return NULL;
}

static uint32_t kv_tokens_needed(const request *q) { return q->prompt_len + q->max_new - 1; }

static uint32_t blocks_needed(const exec_rank *r, const request *q) {
  uint32_t page = r->kv.page_size;
  return (kv_tokens_needed(q) + page - 1) / page;
}

/* Hashes of the full blocks of tokens [0, n_tokens) not hashed yet. */
static oi_status extend_hashes(const exec_rank *r, request *q, uint32_t n_tokens) {
  uint32_t page = r->kv.page_size;
  while (q->n_hashes < n_tokens / page) {
    uint32_t i = q->n_hashes;
    size_t n = 0;
    oi_status st = oi_hash_blocks(q->tokens + (size_t)i * page, page, page, q->salt, q->salt_len,
                                  i ? &q->hashes[i - 1] : NULL, &q->hashes[i], 1, &n);
    if (st != OI_OK) return st;
    q->n_hashes++;
  }
  return OI_OK;
}

static void queue_remove(request **head, request **tail, request *q) {
  request *prev = NULL;
  for (request *it = *head; it; prev = it, it = it->next)
    if (it == q) {
      if (prev)
        prev->next = q->next;
      else
        *head = q->next;
      if (*tail == q) *tail = prev;
      q->next = NULL;
      return;
    }
}

static void queue_push(request **head, request **tail, request *q) {
  q->next = NULL;
  if (*tail)
    (*tail)->next = q;
  else
    *head = q;
  *tail = q;
}

/* ---- saves --------------------------------------------------------------------- */

/* The engine's completion thread (or the save call itself): only hands over. */
static void save_done(void *ctx, oi_status st) {
  save_rec *rec = ctx;
  exec_rank *r = rec->rank;
  rec->status = st;
  pthread_mutex_lock(&r->save_lock);
  rec->next = r->saves_done;
  r->saves_done = rec;
  r->saves_outstanding--;
  pthread_cond_broadcast(&r->save_cv);
  pthread_mutex_unlock(&r->save_lock);
}

void oi__exec_collect_saves(exec_rank *r) {
  pthread_mutex_lock(&r->save_lock);
  save_rec *list = r->saves_done;
  r->saves_done = NULL;
  pthread_mutex_unlock(&r->save_lock);
  while (list) {
    save_rec *rec = list;
    list = rec->next;
    for (uint32_t i = 0; i < rec->n; i++) {
      if (rec->status != OI_OK) r->pool.blocks[rec->ids[i]].saved = 0; /* may try again later */
      oi__block_pool_unpin(&r->pool, (int32_t)rec->ids[i]);
    }
    oi__free(rec);
  }
}

/* Saves q's full, cached blocks the host tier does not have yet. Their pages
 * stay pinned (out of the free list and the LRU) until the copy lands. */
static void release_save(exec_rank *r, request *q) {
  oi_executor *x = r->x;
  uint32_t full = OI_MIN(q->registered, q->n_blocks);
  if (!r->engine || full == 0) return;
  save_rec *rec = oi__malloc(sizeof *rec + full * sizeof(int64_t));
  oi_block_hash *hashes = oi__malloc(full * sizeof *hashes);
  if (!rec || !hashes) {
    oi__free(rec);
    oi__free(hashes);
    OI_LOG(OI_LOG_WARN, "executor", "request %llu: out of memory for its release save (skipped)",
           (unsigned long long)q->id);
    return;
  }
  rec->rank = r;
  rec->n = 0;
  for (uint32_t i = 0; i < full; i++) {
    block_pool_block *b = &r->pool.blocks[q->blocks[i]];
    /* Only the copy the cache names under this hash (a duplicate computed
     * concurrently stays out), and only once. */
    if (!b->cached || b->saved || memcmp(b->hash.bytes, q->hashes[i].bytes, 16)) continue;
    b->saved = 1;
    oi__block_pool_pin(&r->pool, (int32_t)q->blocks[i]);
    hashes[rec->n] = q->hashes[i];
    rec->ids[rec->n++] = q->blocks[i];
  }
  if (rec->n == 0) {
    oi__free(rec);
    oi__free(hashes);
    return;
  }
  oi_save_options so;
  oi_save_options_init(&so);
  so.on_done = save_done;
  so.on_done_ctx = rec;
  uint32_t n = rec->n;
  pthread_mutex_lock(&r->save_lock);
  r->saves_outstanding++;
  pthread_mutex_unlock(&r->save_lock);
  /* On OI_OK, on_done runs exactly once (maybe inside this call); on an
   * error it never runs and the pins are ours to drop. */
  oi_status st = oi_engine_save(r->engine, rec->ids, hashes, n, &so, NULL);
  if (st != OI_OK) {
    OI_LOG(OI_LOG_WARN, "executor", "rank %u request %llu: save of %u blocks failed: %s", r->index,
           (unsigned long long)q->id, n, oi_last_error());
    pthread_mutex_lock(&r->save_lock);
    r->saves_outstanding--;
    pthread_mutex_unlock(&r->save_lock);
    for (uint32_t i = 0; i < n; i++) {
      r->pool.blocks[rec->ids[i]].saved = 0;
      oi__block_pool_unpin(&r->pool, (int32_t)rec->ids[i]);
    }
    oi__free(rec);
  } else {
    x->c.saves_submitted += n;
  }
  oi__free(hashes);
}

void oi__exec_release_request(exec_rank *r, request *q, bool save) {
  if (save) release_save(r, q);
  for (uint32_t i = 0; i < q->n_blocks; i++)
    oi__block_pool_unref(&r->pool, (int32_t)q->blocks[i]);
  /* q->blocks keeps the ids for oi_executor_request_blocks; they are no longer held. */
}

static void finish_request(exec_rank *r, request *q, uint32_t state, oi_status st) {
  oi_executor *x = r->x;
  queue_remove(&r->running_head, &r->running_tail, q);
  r->n_running--;
  q->state = state;
  q->status = st;
  oi__exec_release_request(r, q, state == OI_REQUEST_FINISHED);
  if (state == OI_REQUEST_FINISHED)
    x->c.finished++;
  else
    x->c.failed++;
}

/* ---- admission and restore --------------------------------------------------------- */

static bool fault(const oi_executor *x, const exec_rank *r, const request *q, uint32_t point) {
  return x->o.fault_hook && x->o.fault_hook(x->o.fault_ctx, r->index, q->id, point);
}

/* Registers q's full blocks [registered, kv_len / page) in the prefix cache.
 * A block whose hash some other block already holds stays out (a duplicate). */
static oi_status register_full_blocks(exec_rank *r, request *q) {
  if (!r->x->o.prefix_cache) return OI_OK;
  uint32_t full = q->kv_len / r->kv.page_size;
  oi_status st = extend_hashes(r, q, full * r->kv.page_size);
  if (st != OI_OK) return st;
  for (; q->registered < full; q->registered++)
    oi__block_pool_insert(&r->pool, (int32_t)q->blocks[q->registered], &q->hashes[q->registered]);
  return OI_OK;
}

/* Takes blocks [from, to) of the table (fresh, uncached). */
static void take_blocks(exec_rank *r, request *q, uint32_t from, uint32_t to) {
  for (uint32_t i = from; i < to; i++)
    q->blocks[i] = oi__block_pool_alloc(&r->pool);
  if (to > q->n_blocks) q->n_blocks = to;
}

/* After a restore: the restored blocks enter the prefix cache, and the
 * prefix is matched again (the probe's blocks are still held, so nothing
 * restored or probed could be evicted in between). A block another request
 * cached meanwhile replaces ours (same bytes). */
static void commit_restore(exec_rank *r, request *q) {
  oi_executor *x = r->x;
  uint32_t page = r->kv.page_size, g = q->restore_first, h = q->restore_n;
  for (uint32_t i = g; i < g + h; i++) {
    int32_t mine = (int32_t)q->blocks[i];
    int32_t named = oi__block_pool_insert(&r->pool, mine, &q->hashes[i]);
    if (named != mine) {
      oi__block_pool_ref(&r->pool, named);
      oi__block_pool_unref(&r->pool, mine);
      q->blocks[i] = named;
    } else {
      r->pool.blocks[mine].saved = 1; /* it came from the host tier */
    }
  }
  /* Re-match past the restored run, unless the forward already computed
   * from there (an overlapped restore). */
  uint32_t matched = g + h, limit = q->overlap ? matched : (q->prompt_len - 1) / page;
  for (; matched < limit; matched++) {
    int32_t c = oi__block_pool_lookup(&r->pool, &q->hashes[matched]);
    if (c < 0) break;
    oi__block_pool_ref(&r->pool, c);
    oi__block_pool_unref(&r->pool, (int32_t)q->blocks[matched]);
    q->blocks[matched] = c;
    q->cached_tokens += page;
    x->c.cached_tokens += page;
  }
  q->registered = matched;
  q->kv_len = matched * page;
  q->restored_tokens = h * page;
  x->c.restored_tokens += h * page;
  x->c.restores_completed++;
}

/* The restore did not happen: blocks [g, g+h) stay the request's, to be
 * prefilled. */
static void degrade_restore(exec_rank *r, request *q, const char *why) {
  OI_LOG(OI_LOG_INFO, "executor", "rank %u request %llu: restore of %u blocks failed (%s): prefill",
         r->index, (unsigned long long)q->id, q->restore_n, why);
  /* A split whose head is still being computed keeps its place (the
   * blocks past the head are prefilled when it gets there). */
  if (!q->split || q->kv_len >= q->restore_first * r->kv.page_size) {
    q->kv_len = q->restore_first * r->kv.page_size;
    q->registered = q->restore_first;
  }
  q->split = false;
  q->restore_n = 0;
  r->x->c.restores_failed++;
}

/* The load of q's restore ended with `st`: commit it, or fall back to
 * prefilling the blocks. */
static void end_restore(exec_rank *r, request *q, oi_status st) {
  oi_ticket_release(q->load_ticket);
  q->load_ticket = NULL;
  q->state = OI_REQUEST_RUNNING;
  if (st == OI_OK && fault(r->x, r, q, OI_FAULT_LOAD_COMPLETE)) st = OI_ERR_IO;
  q->split = false; /* its head is computed (poll_restores waited for it) */
  q->restore_load_done_ns = oi__now_ns();
  if (st == OI_OK) {
    commit_restore(r, q);
    q->restore_commit_ns = oi__now_ns() - q->restore_load_done_ns;
  } else {
    degrade_restore(r, q, oi_status_str(st));
  }
  q->overlap = false;
}

/* Hands q's pending load and the ids of its restore blocks to the orphans
 * (polled until the copy ends, then the ids are unreferenced once). The
 * caller settles the references. @return NULL, nothing changed, when out of
 * memory. */
static orphan_load *orphan_restore(exec_rank *r, request *q) {
  orphan_load *o = oi__malloc(sizeof *o + q->restore_n * sizeof(int64_t));
  if (!o) return NULL;
  o->ticket = q->load_ticket;
  o->n = q->restore_n;
  memcpy(o->ids, q->blocks + q->restore_first, q->restore_n * sizeof(int64_t));
  o->next = r->orphans;
  r->orphans = o;
  q->load_ticket = NULL;
  return o;
}

/* Gives up on q's pending load: its blocks (and their references) go to the
 * orphans until the copy ends, and the request gets fresh ones. @return
 * false (nothing changed) when the fresh blocks are not there yet. */
static bool abandon_restore(exec_rank *r, request *q) {
  if (oi__block_pool_available(&r->pool) < q->restore_n || !orphan_restore(r, q)) return false;
  take_blocks(r, q, q->restore_first, q->restore_first + q->restore_n);
  q->state = OI_REQUEST_RUNNING;
  q->overlap = false;
  OI_LOG(OI_LOG_WARN, "executor", "rank %u request %llu: load still pending after %u ms", r->index,
         (unsigned long long)q->id, r->x->o.restore_timeout_ms);
  degrade_restore(r, q, "timeout");
  return true;
}

/* A split's head is computed and its load still runs: the rest of the
 * prompt may overlap the load as an unsplit restore's does. */
static void split_to_overlap(exec_rank *r, request *q) {
  oi_executor *x = r->x;
  if (x->overlap_mode == OVERLAP_OFF) return;
  if (x->overlap_mode == OVERLAP_DEVICE)
    for (uint32_t l = 0; l < r->kv.num_layers; l++)
      if (!oi_ticket_arena_event(q->load_ticket, l)) return;
  q->split = false;
  q->overlap = true;
  q->state = OI_REQUEST_RESTORING;
  q->kv_len = (q->restore_first + q->restore_n) * r->kv.page_size;
  x->c.restores_overlapped++;
}

/* Polls the restores in flight; each ends committed or degraded. A split
 * (RUNNING while it loads) commits once its head is computed too. */
static void poll_restores(exec_rank *r) {
  uint32_t page = r->kv.page_size;
  for (request *q = r->running_head; q; q = q->next) {
    if (q->state != OI_REQUEST_RESTORING && !q->split) continue;
    if (q->tier_wait) { /* ask again: the deeper tier may have brought the blocks */
      if (!q->split) q->state = OI_REQUEST_RUNNING;
      if (!oi__exec_start_restore(r, q, q->restore_first, q->restore_limit)) q->split = false;
      continue;
    }
    bool head_done = q->kv_len >= q->restore_first * page;
    oi_status st = oi_ticket_poll(q->load_ticket);
    if (st > 0) { /* OI_PENDING, or OI_FENCING: copies may still land */
      if (oi__now_ns() >= q->restore_deadline_ns)
        abandon_restore(r, q);
      else if (q->split && head_done)
        split_to_overlap(r, q);
      continue;
    }
    if (q->split && !head_done) continue; /* landed: commits when the head is computed */
    end_restore(r, q, st);
  }
  for (orphan_load **link = &r->orphans; *link;) {
    orphan_load *o = *link;
    if (oi_ticket_poll(o->ticket) > 0) { /* not final: copies may still land */
      link = &o->next;
      continue;
    }
    *link = o->next;
    oi_ticket_release(o->ticket);
    for (uint32_t i = 0; i < o->n; i++)
      oi__block_pool_unref(&r->pool, (int32_t)o->ids[i]);
    oi__free(o);
  }
}

/* Starts restoring prompt blocks [g, limit) of q from the host tier into its
 * reserved blocks. @return true when a load is in flight. Every failure
 * releases what it took (the lease first) and returns false. */
bool oi__exec_start_restore(exec_rank *r, request *q, uint32_t g, uint32_t limit) {
  oi_executor *x = r->x;
  if (fault(x, r, q, OI_FAULT_QUERY)) {
    OI_LOG(OI_LOG_INFO, "executor", "request %llu: query failed (injected)",
           (unsigned long long)q->id);
    return false;
  }
  char req_id[32];
  snprintf(req_id, sizeof req_id, "req-%llu", (unsigned long long)q->id);
  oi_query_result qr;
  memset(&qr, 0, sizeof qr);
  qr.struct_size = sizeof qr;
  bool again = q->tier_wait;
  if (!again) q->restore_query_start_ns = oi__now_ns();
  q->tier_wait = false;
  oi_status st = oi_engine_query(r->engine, req_id, q->hashes + g, limit - g, 0, &qr);
  uint64_t now = oi__now_ns();
  q->restore_query_ns = now - q->restore_query_start_ns;
  if (st != OI_OK) {
    OI_LOG(OI_LOG_INFO, "executor", "request %llu: query failed: %s", (unsigned long long)q->id,
           oi_last_error());
    return false;
  }
  /* A deeper tier (disk) is promoting blocks right after the hits: wait for
   * them without blocking the step (poll_restores asks again), up to
   * restore_timeout_ms from the first query; then what hits is restored.
   * (A later query answers LOADING only when it started promotions itself;
   * the ones already under way show as pending.) */
  if ((qr.state == OI_QUERY_LOADING || again) && qr.pending_blocks) {
    if (!again) q->restore_deadline_ns = oi__deadline_ns(x->o.restore_timeout_ms);
    if (now < q->restore_deadline_ns) {
      if (qr.hit_blocks) oi_engine_release(r->engine, qr.lease);
      if (!again) x->c.restores_waited++;
      q->tier_wait = true;
      q->restore_first = g;
      q->restore_limit = limit;
      q->restore_n = 0;
      q->state = q->split ? OI_REQUEST_RUNNING : OI_REQUEST_RESTORING;
      return true;
    }
  }
  if (qr.hit_blocks == 0) return false;
  uint32_t h = (uint32_t)qr.hit_blocks;
  x->c.leases_held++;
  x->c.restores_started++;
  q->restore_first = g;
  q->restore_n = h;
  const char *why = NULL;
  if (fault(x, r, q, OI_FAULT_LEASE_EXPIRED)) oi_engine_release(r->engine, qr.lease);
  if (fault(x, r, q, OI_FAULT_NO_FREE_BLOCKS)) why = "no free blocks (injected)";
  /* Every block of the request was reserved before the query. */
  oi_load_options lo;
  oi_load_options_init(&lo);
  bool events = x->overlap_mode == OVERLAP_DEVICE && r->device >= 0;
  if (events) lo.flags |= OI_LOAD_ARENA_EVENTS;
  if (!why && fault(x, r, q, OI_FAULT_LOAD_SUBMIT)) why = "load refused (injected)";
  if (!why) {
    q->restore_load_start_ns = oi__now_ns();
    st = oi_engine_load(r->engine, qr.lease, q->blocks + g, h, &lo, &q->load_ticket);
    if (st == OI_OK) {
      x->c.leases_held--; /* the load consumed our share */
      q->state = q->split ? OI_REQUEST_RUNNING : OI_REQUEST_RESTORING;
      q->restore_deadline_ns = oi__deadline_ns(x->o.restore_timeout_ms);
      if (q->split) return true; /* its head is computed first (poll_restores) */
      /* Overlap: the remaining tokens are computed in this step while the
       * load runs (every layer's event is needed; the remote engine has
       * none). */
      bool overlap = x->overlap_mode == OVERLAP_HOST;
      if (events) {
        overlap = true;
        for (uint32_t l = 0; l < r->kv.num_layers && overlap; l++)
          overlap = oi_ticket_arena_event(q->load_ticket, l) != NULL;
      }
      if (overlap) {
        x->c.restores_overlapped++;
        q->overlap = true;
        q->kv_len = (g + h) * r->kv.page_size;
      }
      return true;
    }
    why = oi_last_error();
  }
  /* The lease may still pin the blocks: release it (unknown is fine). */
  oi_engine_release(r->engine, qr.lease);
  x->c.leases_held--;
  degrade_restore(r, q, why);
  return false;
}

/* Admits waiting requests in FCFS order while the budgets allow. */
static void admit(exec_rank *r) {
  oi_executor *x = r->x;
  uint32_t page = r->kv.page_size;
  while (r->waiting_head && r->n_running < x->o.max_batch_seqs) {
    request *q = r->waiting_head;
    uint32_t need = blocks_needed(r, q);
    uint32_t limit = x->o.prefix_cache ? (q->prompt_len - 1) / page : 0;
    if (x->o.prefix_cache && extend_hashes(r, q, q->prompt_len) != OI_OK) limit = 0;
    /* Probe: hold the leading run of cached blocks. */
    uint32_t g = 0;
    for (; g < limit; g++) {
      int32_t b = oi__block_pool_lookup(&r->pool, &q->hashes[g]);
      if (b < 0) break;
      oi__block_pool_ref(&r->pool, b);
      q->blocks[g] = b;
    }
    if (need - g > oi__block_pool_available(&r->pool)) { /* wait for blocks (FCFS: nobody passes) */
      for (uint32_t i = 0; i < g; i++)
        oi__block_pool_unref(&r->pool, (int32_t)q->blocks[i]);
      break;
    }
    queue_remove(&r->waiting_head, &r->waiting_tail, q);
    queue_push(&r->running_head, &r->running_tail, q);
    r->n_running++;
    q->n_blocks = g;
    take_blocks(r, q, g, need);
    q->registered = g;
    q->kv_len = g * page;
    q->cached_tokens = g * page;
    x->c.cached_tokens += g * page;
    q->state = OI_REQUEST_RUNNING;
    if (r->engine && g < limit) oi__exec_plan_restore(r, q, g, limit);
  }
}

/* ---- the forward batch ------------------------------------------------------------- */

static void build_batch(exec_rank *r) {
  oi_executor *x = r->x;
  uint32_t budget = x->o.max_batch_tokens, n = 0, waits = 0, L = r->kv.num_layers;
  r->n_host_waits = 0;
  /* Decodes first (one token each), then prefill chunks in admission order. */
  for (int pass = 0; pass < 2; pass++)
    for (request *q = r->running_head; q && budget; q = q->next) {
      bool overlapped = q->state == OI_REQUEST_RESTORING && q->overlap;
      if (q->state != OI_REQUEST_RUNNING && !overlapped) continue;
      bool decoding = q->kv_len >= q->prompt_len;
      if (decoding != (pass == 0)) continue;
      /* A split computes its head only: up to the blocks it loads. */
      uint32_t end = q->split ? q->restore_first * r->kv.page_size : q->prompt_len;
      if (!decoding && end <= q->kv_len) continue;
      uint32_t want = decoding ? 1 : OI_MIN(end - q->kv_len, budget);
      oi_model_seq *s = &r->seqs[n];
      memset(s, 0, sizeof *s);
      s->request_id = q->id;
      s->tokens = q->tokens + q->kv_len;
      s->n_tokens = want;
      s->position = q->kv_len;
      s->block_table = q->blocks;
      s->n_blocks = q->n_blocks;
      s->want_token = decoding || q->kv_len + want == q->prompt_len;
      q->sched_tokens = want;
      r->seq_req[n++] = q;
      budget -= want;
      if (overlapped && x->overlap_mode == OVERLAP_HOST) {
        r->host_waits[r->n_host_waits++] = q->load_ticket;
      } else if (overlapped) {
        for (uint32_t l = 0; l < L; l++)
          r->kv_events[(size_t)waits * L + l] = oi_ticket_arena_event(q->load_ticket, l);
        waits++;
      }
    }
  r->batch.struct_size = sizeof r->batch;
  r->batch.rank = r->index;
  r->batch.n_seqs = n;
  r->batch.seqs = r->seqs;
  r->batch.n_kv_waits = waits;
  r->batch.kv_events = r->kv_events;
}

static void post_work(exec_rank *r) {
  pthread_mutex_lock(&r->work_lock);
  r->work = 1;
  r->work_done = false;
  pthread_cond_broadcast(&r->work_cv);
  pthread_mutex_unlock(&r->work_lock);
}

static oi_status wait_work(exec_rank *r) {
  pthread_mutex_lock(&r->work_lock);
  while (!r->work_done)
    pthread_cond_wait(&r->work_cv, &r->work_lock);
  oi_status st = r->work_status;
  pthread_mutex_unlock(&r->work_lock);
  return st;
}

/* Applies one sequence's results. @return true when the request finished. */
static bool apply_seq(exec_rank *r, request *q, const oi_model_seq *s) {
  oi_executor *x = r->x;
  bool prefill = q->kv_len < q->prompt_len;
  q->kv_len += s->n_tokens;
  if (prefill) {
    q->computed_tokens += s->n_tokens;
    x->c.prefill_tokens += s->n_tokens;
  } else {
    x->c.decode_tokens += s->n_tokens;
  }
  if (register_full_blocks(r, q) != OI_OK)
    OI_LOG(OI_LOG_WARN, "executor", "request %llu: hashing failed: %s", (unsigned long long)q->id,
           oi_last_error());
  if (!s->want_token) return false;
  uint64_t now = oi__now_ns();
  uint32_t index = q->n_gen;
  q->tokens[q->prompt_len + q->n_gen++] = s->next_token;
  if (index == 0) q->first_token_ns = now;
  q->last_token_ns = now;
  bool done = q->n_gen == q->max_new;
  if (x->o.on_token) x->o.on_token(x->o.on_token_ctx, q->id, s->next_token, index, done);
  if (done) finish_request(r, q, OI_REQUEST_FINISHED, OI_OK);
  return done;
}

/* After the forward that overlapped q's restore: the load's outcome decides
 * whether the forward's results for q stand. The device finished the
 * forward, which waited for every layer's copies, so the ticket completes
 * at once unless the load failed or hangs. @return true when committed (the
 * results apply); false: they are discarded, and q prefills the blocks
 * (degraded) or, its load still pending, goes back to being polled. */
static bool settle_overlap(exec_rank *r, request *q) {
  oi_status st = oi_ticket_wait(q->load_ticket, oi__ms_until(q->restore_deadline_ns));
  if (st == OI_ERR_TIMEOUT) {
    q->overlap = false;
    q->kv_len = q->restore_first * r->kv.page_size; /* poll_restores decides */
    return false;
  }
  end_restore(r, q, st);
  return q->restore_n != 0;
}

/* A failed forward's request whose restore overlapped it: the load may still
 * write its blocks, which the request is about to release. The orphans take
 * a reference of their own on them until the copy ends. */
static void drop_overlap(exec_rank *r, request *q) {
  if (oi_ticket_poll(q->load_ticket) > 0) { /* not final */
    orphan_load *o = orphan_restore(r, q);
    if (o)
      for (uint32_t i = 0; i < o->n; i++)
        oi__block_pool_ref(&r->pool, (int32_t)o->ids[i]);
    else
      oi__ticket_wait_final(q->load_ticket); /* out of memory: the copy ends first */
  }
  oi_ticket_release(q->load_ticket);
  q->load_ticket = NULL;
  q->state = OI_REQUEST_RUNNING;
  q->overlap = false;
  r->x->c.restores_failed++;
}

oi_status oi__exec_step(oi_executor *x, uint32_t *finished) {
  uint32_t n_finished = 0;
  for (uint32_t i = 0; i < x->nranks; i++) {
    exec_rank *r = &x->ranks[i];
    oi__exec_collect_saves(r);
    poll_restores(r);
    admit(r);
    build_batch(r);
    if (r->batch.n_seqs) post_work(r);
  }
  oi_status result = OI_OK;
  char first_error[600] = "";
  for (uint32_t i = 0; i < x->nranks; i++) {
    exec_rank *r = &x->ranks[i];
    if (!r->batch.n_seqs) continue;
    oi_status st = wait_work(r);
    if (st != OI_OK) {
      /* The batch's requests fail; their partial blocks were never cached. */
      OI_LOG(OI_LOG_ERROR, "executor", "rank %u forward failed: %s", r->index, r->work_error);
      if (result == OI_OK) {
        result = st;
        snprintf(first_error, sizeof first_error, "rank %u forward: %s", r->index, r->work_error);
      }
      for (uint32_t k = 0; k < r->batch.n_seqs; k++) {
        request *q = r->seq_req[k];
        if (q->state == OI_REQUEST_RESTORING || (q->split && q->load_ticket)) drop_overlap(r, q);
        q->split = false;
        finish_request(r, q, OI_REQUEST_FAILED, st);
      }
      continue;
    }
    /* The forward's time feeds the prefill fit (not one that waited on a
     * load: its time is the load's). */
    if (r->batch.n_kv_waits == 0 && r->n_host_waits == 0) {
      double tokens = 0, positions = 0;
      for (uint32_t k = 0; k < r->batch.n_seqs; k++) {
        double n = r->seqs[k].n_tokens, p = r->seqs[k].position;
        tokens += n;
        positions += n * p + n * (n - 1) / 2;
      }
      oi__exec_prefill_sample(x, tokens, positions, (double)r->forward_ns);
    }
    for (uint32_t k = 0; k < r->batch.n_seqs; k++) {
      request *q = r->seq_req[k];
      if (q->state == OI_REQUEST_RESTORING && !settle_overlap(r, q)) continue;
      n_finished += apply_seq(r, q, &r->seqs[k]);
    }
    r->batch.n_seqs = 0;
  }
  x->c.steps++;
  if (finished) *finished = n_finished;
  if (result != OI_OK) return oi__fail(result, "%s", first_error);
  return OI_OK;
}
