/* The sidecar engine's operations (save, load, query, release, flush,
 * stats) and its teardown. The invariants: remote_internal.h. */

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "remote_internal.h"

/* ---- operations ---------------------------------------------------------------------- */

static oi_status check_count(const char *what, size_t n) {
  if (n > OI_WIRE_MAX_BLOCKS)
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "%s: %zu blocks (a sidecar request carries at most %u)", what, n,
                    OI_WIRE_MAX_BLOCKS);
  return OI_OK;
}

/* Sends an asynchronous operation whose reply completes a ticket. */
static oi_status submit_async(remote_engine *e, pending_kind kind, oiwire_Envelope *env,
                              const oi_wire_out *out, uint32_t deadline_ms, oi_save_done_fn on_done,
                              void *on_done_ctx, counts_wait *counts, uint32_t arena_progress,
                              oi_ticket **ticket_out, const char *what) {
  pending *p = oi__calloc(1, sizeof *p);
  oi_ticket *t = ticket_out ? oi__ticket_new() : NULL;
  if (!p || (ticket_out && !t)) {
    oi__free(p);
    if (t) {
      oi__ticket_unref(t);
      oi__ticket_unref(t);
    }
    return oi__fail(OI_ERR_OUT_OF_MEMORY, "%s: out of memory", what);
  }
  /* A layered load: LoadProgress frames report its arenas (set before the
   * send: the reader may deliver one at once). */
  if (t && arena_progress) oi__ticket_arena_progress(t, arena_progress);
  p->kind = kind;
  p->ticket = t;
  p->on_done = on_done;
  p->on_done_ctx = on_done_ctx;
  p->counts = counts;
  p->n_blocks = (uint32_t)out->n_ids;
  p->deadline_ns = deadline_ms ? oi__deadline_ns(deadline_ms) : UINT64_MAX;
  bool taken;
  uint64_t id;
  oi_status st = oi__remote_send_pending(e, env, out, p, what, &taken, &id);
  if (st != OI_OK && !taken) { /* we took it back: the caller gets the error instead */
    oi__free(p);
    if (t) {
      oi__ticket_unref(t);
      oi__ticket_unref(t);
    }
    return st;
  }
  /* Sent, or the reader already failed it (connection lost): the ticket says so. */
  if (ticket_out) *ticket_out = t;
  return OI_OK;
}

/* Engine-owned and no server: the save is dropped as a full pool drops one
 * (OI_OK; nothing was accepted, so on_done and the ticket complete now). */
static oi_status drop_save(remote_engine *e, size_t n, const oi_save_options *opt,
                           oi_ticket **ticket_out) {
  oi_ticket *t = NULL;
  if (ticket_out && !(t = oi__ticket_new()))
    return oi__fail(OI_ERR_OUT_OF_MEMORY, "save: out of memory");
  atomic_fetch_add(&e->disconnected_saves, n);
  if (opt->result) { /* nothing reached a server: every block dropped */
    opt->result->accepted = opt->result->deduplicated = 0;
    opt->result->dropped = n;
  }
  oi_clear_error();
  if (opt->on_done) opt->on_done(opt->on_done_ctx, OI_OK);
  if (t) {
    oi__ticket_complete(t, OI_OK);
    *ticket_out = t;
  }
  return OI_OK;
}

static oi_status remote_save(oi_engine *base, const int64_t *ids, const oi_block_hash *hashes,
                             size_t n, const oi_save_options *opt, oi_ticket **ticket_out) {
  remote_engine *e = (remote_engine *)base;
  oi_status st = check_count("save", n);
  if (st != OI_OK) return st;
  if (opt->wait_event)
    return oi__fail(OI_ERR_UNSUPPORTED,
                    "save: wait_event is not supported by a sidecar engine (the server cannot wait "
                    "on this process's event; synchronize it before saving)");
  if (opt->arena_count && !(e->server_caps & OI_WIRE_CAP_LAYERWISE))
    return oi__fail(OI_ERR_UNSUPPORTED,
                    "save: this server does not support layerwise saves (arena_count): save "
                    "whole blocks, or upgrade the server");
  oiwire_Envelope env;
  memset(&env, 0, sizeof env);
  env.which_body = oiwire_Envelope_save_tag;
  env.body.save.arena_first = opt->arena_first;
  env.body.save.arena_count = opt->arena_count;
  oi_wire_out out = {.ids = ids, .n_ids = n, .hashes = hashes, .n_hashes = n};
  if (oi__remote_breaker_open(e) || oi__remote_degraded(e)) return drop_save(e, n, opt, ticket_out);
  if (!opt->result) {
    st = submit_async(e, PEND_SAVE, &env, &out, base->opts.save_deadline_ms, opt->on_done,
                      opt->on_done_ctx, NULL, 0, ticket_out, "save");
    /* Engine-owned: a save that never reached a server is dropped, not an error. */
    if (st == OI_ERR_CLOSED && e->owned) return drop_save(e, n, opt, ticket_out);
    return st;
  }
  /* The server answers SaveCounts as soon as it reserved the blocks, then
   * the final Result; wait for the first (up to the control deadline). */
  env.body.save.want_counts = true;
  counts_wait w = {0};
  st = submit_async(e, PEND_SAVE, &env, &out, base->opts.save_deadline_ms, opt->on_done,
                    opt->on_done_ctx, &w, 0, ticket_out, "save");
  if (st == OI_ERR_CLOSED && e->owned) return drop_save(e, n, opt, ticket_out);
  if (st != OI_OK) return st; /* (the record never left our hands: w is unreferenced) */
  uint64_t deadline = oi__deadline_ns(e->control_ms);
  struct timespec ts = oi__remote_abs_timespec(deadline);
  bool late = false;
  pthread_mutex_lock(&e->lock);
  while (!w.done)
    if (pthread_cond_timedwait(&e->cv, &e->lock, &ts) == ETIMEDOUT && !w.done) {
      /* Unlink w from the record, if the record is still in the table. */
      for (pending *q = e->head; q; q = q->next)
        if (q->counts == &w) q->counts = NULL;
      late = true;
      break;
    }
  pthread_mutex_unlock(&e->lock);
  if (late) {
    char op[64], why[64];
    snprintf(op, sizeof op, "save of %zu blocks", n);
    snprintf(why, sizeof why, "no counts within %u ms", e->control_ms);
    oi__remote_trip(e, op, why);
  }
  if (w.received) {
    opt->result->accepted = w.accepted;
    opt->result->deduplicated = w.deduplicated;
    opt->result->dropped = w.dropped;
  } else { /* unknown: the save failed first, or the counts did not come in time */
    opt->result->accepted = opt->result->deduplicated = opt->result->dropped = UINT64_MAX;
  }
  return OI_OK;
}

static oi_status load_submit(remote_engine *e, oi_lease lease, const int64_t *ids, size_t n,
                             const oi_load_options *opt, oi_ticket **ticket_out) {
  oi_engine *base = &e->base;
  oi_status st = check_count("load", n);
  if (st != OI_OK) return st;
  oiwire_Envelope env;
  memset(&env, 0, sizeof env);
  env.which_body = oiwire_Envelope_load_tag;
  env.body.load.lease.size = OI_WIRE_LEASE_BYTES;
  memcpy(env.body.load.lease.bytes, lease.bytes, OI_WIRE_LEASE_BYTES);
  oi_wire_out out = {.ids = ids, .n_ids = n};
  if (oi__remote_breaker_open(e)) return oi__remote_unresponsive_error(e, "load");
  if (oi__remote_degraded(e))
    return oi__fail(OI_ERR_CLOSED,
                    "load: no openinfer server is connected (the one that issued the lease went "
                    "away; reconnecting in the background): nothing was loaded");
  /* Layered: the server reports each arena as it lands (a server without
   * the capability runs a plain load; arena waits then wait for all of it). */
  uint32_t progress = 0;
  if ((opt->flags & OI_LOAD_ARENA_EVENTS) && (e->server_caps & OI_WIRE_CAP_LOAD_PROGRESS)) {
    env.body.load.flags = OI_LOAD_ARENA_EVENTS;
    progress = base->layout.num_arenas;
  }
  return submit_async(e, PEND_LOAD, &env, &out, base->opts.load_deadline_ms, NULL, NULL, NULL,
                      progress, ticket_out, "load");
}

/* Every load the caller is told failed counts in loads_failed: refused
 * here, or (oi__remote_finish_async) completed with an error. */
static oi_status remote_load(oi_engine *base, oi_lease lease, const int64_t *ids, size_t n,
                             const oi_load_options *opt, oi_ticket **ticket_out) {
  remote_engine *e = (remote_engine *)base;
  oi_status st = load_submit(e, lease, ids, n, opt, ticket_out);
  if (st != OI_OK) atomic_fetch_add(&e->loads_failed, 1);
  return st;
}

/* Engine-owned and no server: everything misses. */
static oi_status query_miss(remote_engine *e, size_t n, uint32_t flags, uint8_t *present,
                            oi_query_result *out) {
  if ((flags & OI_QUERY_MEMBERSHIP) && n > 0) memset(present, 0, n);
  atomic_fetch_add(&e->disconnected_misses, n);
  oi_query_result r;
  memset(&r, 0, sizeof r);
  r.struct_size = sizeof r;
  r.state = OI_QUERY_READY;
  r.present = present;
  r.where = oi__query_where(out);
  if (r.where && n) memset(r.where, OI_WHERE_NONE, n);
  oi_clear_error();
  return oi__struct_out_min(out, &r, sizeof r, OI_FLOOR_QUERY_RESULT, "query");
}

/* A Query: of the engine's instance, or (instance 0) a lookup of
 * `namespace_id` with `world_size` consumers. */
oi_status oi__remote_query_call(remote_engine *e, uint32_t instance, const char *namespace_id,
                                uint32_t world_size, const char *req_id,
                                const oi_block_hash *hashes, size_t n, uint32_t flags,
                                uint8_t *present, uint32_t wait_ms, oi_query_result *out) {
  oi_status st = check_count("query", n);
  if (st != OI_OK) return st;
  if (req_id && strlen(req_id) >= sizeof(((oiwire_Query *)0)->req_id))
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "query: req_id is longer than 255 bytes");
  oiwire_Envelope env;
  memset(&env, 0, sizeof env);
  env.which_body = oiwire_Envelope_query_tag;
  env.body.query.instance_id = instance;
  env.body.query.flags = flags;
  env.body.query.wait_ms = wait_ms;
  if (namespace_id)
    snprintf(env.body.query.namespace_id, sizeof env.body.query.namespace_id, "%s", namespace_id);
  env.body.query.world_size = world_size;
  if (req_id) snprintf(env.body.query.req_id, sizeof env.body.query.req_id, "%s", req_id);
  oi_wire_out wo = {.hashes = hashes, .n_hashes = n};
  pending p;
  memset(&p, 0, sizeof p);
  if ((flags & OI_QUERY_MEMBERSHIP) && n > 0) {
    p.present = present;
    p.present_n = n;
  }
  if (oi__remote_breaker_open(e) || oi__remote_degraded(e))
    return query_miss(e, n, flags, present, out);
  /* The scheduler's path (a lookup, a membership query) has its own short
   * deadline. A waiting query is answered up to wait_ms later than another. */
  bool scheduler = instance == 0 || (flags & OI_QUERY_MEMBERSHIP);
  uint64_t limit = (uint64_t)(scheduler ? e->lookup_ms : e->control_ms) + wait_ms;
  char what[80];
  snprintf(what, sizeof what, "%s of %zu hashes",
           instance == 0                   ? "lookup"
           : (flags & OI_QUERY_MEMBERSHIP) ? "membership query"
                                           : "query",
           n);
  if ((st = oi__remote_call(e, &env, &wo, &p,
                            limit >= UINT32_MAX ? UINT32_MAX - 1 : (uint32_t)limit, what)) !=
      OI_OK) {
    /* (No reply in time: this one says so; the breaker opened, the next miss.) */
    if (st == OI_ERR_CLOSED && e->owned) return query_miss(e, n, flags, present, out);
    return st;
  }
  if (p.reply.which_body != oiwire_Envelope_query_reply_tag)
    return oi__remote_unexpected_reply(&p, "query");
  const oiwire_QueryReply *qr = &p.reply.body.query_reply;
  if (qr->lease.size != 0 && qr->lease.size != OI_WIRE_LEASE_BYTES)
    return oi__fail(OI_ERR_PROTOCOL, "query: the server sent a %u-byte lease",
                    (unsigned)qr->lease.size);
  if (qr->hit_blocks > n || qr->pending_blocks > n - qr->hit_blocks)
    return oi__fail(OI_ERR_PROTOCOL,
                    "query: the server reported %llu hits and %llu pending for %zu hashes",
                    (unsigned long long)qr->hit_blocks, (unsigned long long)qr->pending_blocks, n);
  oi_query_result r;
  memset(&r, 0, sizeof r);
  r.struct_size = sizeof r;
  r.state = qr->state;
  r.hit_blocks = qr->hit_blocks;
  r.pending_blocks = qr->pending_blocks;
  r.wait_ms = wait_ms;
  if (qr->lease.size) memcpy(r.lease.bytes, qr->lease.bytes, OI_WIRE_LEASE_BYTES);
  r.present = present;
  /* The wire carries no tiers: the server's hits are in its pool; what is
   * pending there (being saved, or promoted by a tier) is not said. */
  r.where = oi__query_where(out);
  for (size_t i = 0; r.where && i < n; i++)
    if (flags & OI_QUERY_MEMBERSHIP)
      r.where[i] = present[i] ? OI_WHERE_UNKNOWN : OI_WHERE_NONE;
    else
      r.where[i] = i < r.hit_blocks                      ? OI_WHERE_POOL
                   : i < r.hit_blocks + r.pending_blocks ? OI_WHERE_UNKNOWN
                                                         : OI_WHERE_NONE;
  return oi__struct_out_min(out, &r, sizeof r, OI_FLOOR_QUERY_RESULT, "query");
}

static oi_status remote_query(oi_engine *base, const char *req_id, const oi_block_hash *hashes,
                              size_t n, uint32_t flags, uint8_t *present, uint32_t wait_ms,
                              oi_query_result *out) {
  remote_engine *e = (remote_engine *)base;
  /* its instance, read under the lock: a reconnect changes it */
  return oi__remote_query_call(e, oi__remote_instance_of(e), NULL, 0, req_id, hashes, n, flags,
                               present, wait_ms, out);
}

oi_status oi__remote_release_call(remote_engine *e, uint32_t instance, const char *namespace_id,
                                  oi_lease lease) {
  oiwire_Envelope env;
  memset(&env, 0, sizeof env);
  env.which_body = oiwire_Envelope_release_tag;
  env.body.release.instance_id = instance;
  if (namespace_id)
    snprintf(env.body.release.namespace_id, sizeof env.body.release.namespace_id, "%s",
             namespace_id);
  env.body.release.lease.size = OI_WIRE_LEASE_BYTES;
  memcpy(env.body.release.lease.bytes, lease.bytes, OI_WIRE_LEASE_BYTES);
  pending p;
  memset(&p, 0, sizeof p);
  if (oi__remote_breaker_open(e)) return oi__remote_unresponsive_error(e, "release");
  oi_status st = oi__remote_degraded(e)
                     ? OI_ERR_CLOSED
                     : oi__remote_call(e, &env, NULL, &p, e->control_ms, "release");
  if (st == OI_ERR_CLOSED && e->owned)
    return oi__fail(OI_ERR_LEASE_EXPIRED,
                    "release: the server that issued this lease went away (its leases went "
                    "with it)");
  return st;
}

static oi_status remote_release(oi_engine *base, oi_lease lease) {
  remote_engine *e = (remote_engine *)base;
  return oi__remote_release_call(e, oi__remote_instance_of(e), NULL, lease);
}

static oi_status remote_flush(oi_engine *base, uint32_t timeout_ms) {
  remote_engine *e = (remote_engine *)base;
  oiwire_Envelope env;
  memset(&env, 0, sizeof env);
  env.which_body = oiwire_Envelope_flush_tag;
  env.body.flush.timeout_ms = timeout_ms;
  /* The server answers TIMEOUT after timeout_ms; we wait that plus the
   * control deadline for the answer itself. */
  uint64_t wait = timeout_ms == UINT32_MAX ? UINT32_MAX : (uint64_t)timeout_ms + e->control_ms;
  pending p;
  memset(&p, 0, sizeof p);
  if (oi__remote_degraded(e)) return OI_OK; /* every save was completed when the server went away */
  if (oi__remote_breaker_open(e))           /* at once: saves in flight end at their deadline */
    return oi__fail(OI_ERR_TIMEOUT,
                    "flush: the openinfer server at %s is unresponsive (probed every %u ms): saves "
                    "in flight end at their deadline",
                    e->socket_path, e->probe_ms);
  oi_status st =
      oi__remote_call(e, &env, NULL, &p, wait >= UINT32_MAX ? UINT32_MAX : (uint32_t)wait, "flush");
  if (st == OI_ERR_CLOSED && e->owned) {
    oi_clear_error();
    return OI_OK;
  }
  return st;
}

static oi_status remote_stats(const oi_engine *cbase, oi_engine_stats *out) {
  remote_engine *e = (remote_engine *)cbase;
  oiwire_Envelope env;
  memset(&env, 0, sizeof env);
  env.which_body = oiwire_Envelope_stats_tag;
  pending p;
  memset(&p, 0, sizeof p);
  oi_engine_stats s;
  memset(&s, 0, sizeof s);
  s.struct_size = sizeof s;
  s.latency_buckets = OI_LATENCY_BUCKETS;
  s.disconnected_saves = atomic_load(&e->disconnected_saves);
  s.disconnected_query_misses = atomic_load(&e->disconnected_misses);
  s.loads_completed = atomic_load(&e->loads_completed); /* the caller's view, not the server's */
  s.loads_failed = atomic_load(&e->loads_failed);
  bool unanswered = oi__remote_breaker_open(e);
  oi_status st = unanswered || oi__remote_degraded(e)
                     ? OI_ERR_CLOSED
                     : oi__remote_call(e, &env, NULL, &p, e->control_ms, "engine_stats");
  if (st == OI_ERR_TIMEOUT) unanswered = true;
  pthread_mutex_lock(&e->lock);
  s.reconnects = e->reconnects;
  bool live = e->state == CONN_LIVE;
  s.server_epoch = live ? e->server_epoch : 0;
  s.connection = live ? OI_CONNECTION_CONNECTED : OI_CONNECTION_DEGRADED;
  s.instance_id = live ? e->base.instance_id : 0;
  pthread_mutex_unlock(&e->lock);
  if (unanswered || (st == OI_ERR_CLOSED && e->owned)) {
    /* No server, or it does not answer: this side's figures only. */
    oi_clear_error();
    s.connection = OI_CONNECTION_DEGRADED;
    s.server_epoch = 0;
    s.instance_id = 0;
    s.block_bytes = cbase->layout.block_bytes;
    s.num_blocks = cbase->layout.num_blocks;
    return oi__struct_out_min(out, &s, sizeof s, OI_FLOOR_ENGINE_STATS, "engine_stats");
  }
  if (st != OI_OK) return st;
  if (p.reply.which_body != oiwire_Envelope_stats_reply_tag)
    return oi__remote_unexpected_reply(&p, "engine_stats");
  const oiwire_StatsReply *r = &p.reply.body.stats_reply;
  s.instance_id = r->instance_id;
  s.block_bytes = r->block_bytes;
  s.num_blocks = r->num_blocks;
  s.saves_submitted = r->saves_submitted;
  s.saves_completed = r->saves_completed;
  s.saves_deduplicated = r->saves_deduplicated;
  s.saves_dropped = r->saves_dropped;
  s.saves_failed = r->saves_failed;
  s.saves_not_encoded = r->saves_not_encoded;
  s.blocks_loaded = r->blocks_loaded;
  s.bytes_saved = r->bytes_saved;
  s.bytes_loaded = r->bytes_loaded;
  s.query_hit_blocks = r->query_hit_blocks;
  s.query_miss_blocks = r->query_miss_blocks;
  s.saves_pending = r->saves_pending;
  s.loads_submitted = r->loads_submitted;
  s.namespace_blocks_resident = r->namespace_blocks_resident;
  for (pb_size_t i = 0; i < r->save_latency_us_count && i < OI_LATENCY_BUCKETS; i++)
    s.save_latency_us[i] = r->save_latency_us[i];
  s.save_latency_sum_us = r->save_latency_sum_us;
  for (pb_size_t i = 0; i < r->load_latency_us_count && i < OI_LATENCY_BUCKETS; i++)
    s.load_latency_us[i] = r->load_latency_us[i];
  s.load_latency_sum_us = r->load_latency_sum_us;
  return oi__struct_out_min(out, &s, sizeof s, OI_FLOOR_ENGINE_STATS, "engine_stats");
}

/* ---- lifecycle ------------------------------------------------------------------------- */

oi_status oi__remote_send_unregister(remote_engine *e) {
  oiwire_Envelope env;
  memset(&env, 0, sizeof env);
  env.which_body = oiwire_Envelope_unregister_tag;
  pending p;
  memset(&p, 0, sizeof p);
  return oi__remote_call(e, &env, NULL, &p, e->control_ms, "unregister");
}

/* Teardown, the reader joined: loads whose connection ended unanswered.
 * One whose server is gone or answered the unregister (the server's engine
 * drained its copies first) completes; otherwise copies may still land
 * and nothing will tell: it stays fencing for good (its destination stays
 * the library's), and the error log says so. */
static void settle_orphans(remote_engine *e) {
  pending *list = e->orphans;
  e->orphans = NULL;
  for (pending *p = list, *next; p; p = next) {
    next = p->next;
    if ((e->unregistered && p->server_pid == e->server_pid) || p->server_pid <= 0 ||
        oi__wire_peer_gone(p->server_pid)) {
      oi__remote_finish_async(e, p, OI_ERR_CLOSED);
      continue;
    }
    OI_LOG_I(OI_LOG_ERROR, "engine", e->base.instance_id,
             "destroy: load request %llu of %u blocks is unanswered and its server (pid %d) still "
             "runs: it stays fencing (OI_FENCING) for good; do not reuse its destination blocks "
             "while that server lives",
             (unsigned long long)p->id, p->n_blocks, p->server_pid);
    atomic_fetch_add(&e->loads_failed, 1);
    if (p->ticket) {
      oi__ticket_fence(p->ticket);
      oi__ticket_unref(p->ticket); /* the producer's reference, never completed */
    }
    oi__free(p);
  }
}

/* Closes the connection and frees the engine. The watchdog must be retired
 * (or never armed). */
void oi__remote_free_engine(remote_engine *e) {
  if (e->reader_started) {
    pthread_mutex_lock(&e->lock);
    bool dead = e->state == CONN_DEAD;
    e->stop = true; /* a degraded engine's reader stops reconnecting */
    if (e->connecting_fd >= 0) shutdown(e->connecting_fd, SHUT_RDWR);
    oi__remote_kick_locked(e);
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->lock);
    /* A connection the server ended: let the reader read to its end (the
     * server's reason may still be queued) rather than cut it. */
    if (!dead) {
      pthread_mutex_lock(&e->write_lock);
      shutdown(e->fd, SHUT_RDWR);
      pthread_mutex_unlock(&e->write_lock);
    }
    pthread_join(e->reader, NULL);
  }
  settle_orphans(e);
  if (e->fd >= 0) close(e->fd);
  if (e->owned_fd >= 0) close(e->owned_fd);
  if (e->reg_names)
    for (uint32_t i = 0; i < e->base.opts.num_arenas; i++)
      oi__free(e->reg_names[i]);
  oi__free(e->reg_names);
  oi__free(e->reg_arenas);
  oi__free(e->reg_segment_offsets);
  oi__wire_arrays_free(&e->arrays);
  oi__wire_reader_free(&e->rd);
  if (e->kick_fd >= 0) close(e->kick_fd);
  oi__free(e->frame);
  oi__free(e->socket_path);
  pthread_mutex_destroy(&e->teardown_lock);
  pthread_mutex_destroy(&e->write_lock);
  pthread_cond_destroy(&e->cv);
  pthread_mutex_destroy(&e->lock);
  oi__engine_fini_common(&e->base);
  oi__free(e);
}

/* Watchdog retired -> flush -> unregister -> close. The mapping is closed.
 * A degraded engine has no server to tell: its reader stops reconnecting. */
static void teardown(remote_engine *e) {
  pthread_mutex_lock(&e->lock);
  bool connected = e->state == CONN_LIVE || e->state == CONN_CONNECTING;
  if (connected) e->state = CONN_RETIRED;
  e->stop = true;
  uint32_t id = e->base.instance_id;
  pthread_mutex_unlock(&e->lock);
  if (connected) {
    uint32_t flush_ms = e->base.opts.save_deadline_ms ? e->base.opts.save_deadline_ms : UINT32_MAX;
    if (remote_flush(&e->base, flush_ms) != OI_OK)
      OI_LOG_I(OI_LOG_WARN, "engine", id, "destroy: %s", oi_last_error());
    if (oi__remote_breaker_open(e))
      OI_LOG_I(OI_LOG_WARN, "engine", id,
               "destroy: the server is unresponsive: not unregistered (the server frees the arena "
               "when the session closes)");
    else if (oi__remote_send_unregister(e) != OI_OK)
      OI_LOG_I(OI_LOG_WARN, "engine", id,
               "destroy: %s (the server frees the arena when the "
               "session closes)",
               oi_last_error());
    else
      e->unregistered = true; /* (its engine drained its copies before the answer) */
  }
  OI_LOG_I(OI_LOG_INFO, "engine", id, "disconnected from %s", e->socket_path);
  oi__remote_free_engine(e);
}

void oi__remote_on_arena_closed(void *ctx) {
  remote_engine *e = ctx;
  pthread_mutex_lock(&e->teardown_lock);
  e->arena_open = false;
  e->arena = NULL;
  bool go = e->destroy_requested;
  pthread_mutex_unlock(&e->teardown_lock);
  if (go) teardown(e);
}

static void remote_destroy(oi_engine *base) {
  remote_engine *e = (remote_engine *)base;
  pthread_mutex_lock(&e->teardown_lock);
  e->destroy_requested = true;
  bool go = !e->arena_open;
  pthread_mutex_unlock(&e->teardown_lock);
  if (go) {
    teardown(e);
    return;
  }
  OI_LOG_I(OI_LOG_WARN, "engine", oi__remote_instance_of(e),
           "destroyed while its imported arena is still open: the engine is finished "
           "(flush, unregister) when oi_imported_arena_close closes the mapping");
}

const engine_ops oi__remote_ops = {
    .save = remote_save,
    .query = remote_query,
    .load = remote_load,
    .release = remote_release,
    .flush = remote_flush,
    .stats = remote_stats,
    .destroy = remote_destroy,
};

/* Bytes from offset 0 to the end of the farthest arena; false on overflow. */
