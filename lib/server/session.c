/* One client connection: reads frames, validates every field, runs the
 * request on the instance's local engine, replies. Save and load reply when
 * their ticket completes (from the engine's completion thread), flush and
 * unregister from the session's aux thread, everything else at once; replies
 * carry the request id, so they may come out of order.
 *
 * A request that is wrong (an unknown instance, a block id out of range, a
 * hash of 15 bytes, counts that differ) gets an error Result and the session
 * continues. Bytes that are not a frame or not an Envelope end the session
 * (after a Result with request id 0 saying why); other sessions are not
 * affected. When the session ends, its instances are destroyed: their
 * engines drain and go, their arenas are freed; the blocks they saved stay in
 * the host tier for everyone in the namespace. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/fault.h"
#include "engine/engine_internal.h" /* the engine's principal and layout */
#include "engine/query.h"
#include "server_internal.h"

#define CONTROL_SEND_TIMEOUT_S 30

/* ---- replies ------------------------------------------------------------------ */

static void session_send(srv_session *s, const oiwire_Envelope *env, const oi_wire_out *out) {
  uint8_t *frame;
  size_t len;
  oi_status st = oi__wire_encode(env, out, &frame, &len);
  if (st != OI_OK) {
    OI_LOG(OI_LOG_ERROR, "server", "session=%llu cannot encode a reply: %s",
           (unsigned long long)s->id, oi_last_error());
    shutdown(s->fd, SHUT_RDWR);
    return;
  }
  pthread_mutex_lock(&s->write_lock);
  if (!s->write_broken) {
    st = oi__wire_send(s->fd, frame, len);
    if (st != OI_OK) {
      /* A partial frame would desynchronize the stream: end the session. */
      s->write_broken = true;
      shutdown(s->fd, SHUT_RDWR);
      OI_LOG(OI_LOG_DEBUG, "server", "session=%llu reply not sent: %s", (unsigned long long)s->id,
             oi_last_error());
    }
  }
  pthread_mutex_unlock(&s->write_lock);
  oi__free(frame);
}

static void reply_result(srv_session *s, uint64_t req, oi_status st, const char *msg) {
  oiwire_Envelope env;
  oi__wire_set_result(&env, req, st, msg ? msg : "");
  session_send(s, &env, NULL);
}

/* Replies with `st` and the calling thread's last error message. */
static void reply_failure(srv_session *s, uint64_t req, oi_status st) {
  reply_result(s, req, st, oi_last_error());
}

static void reply_fmt(srv_session *s, uint64_t req, oi_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void reply_fmt(srv_session *s, uint64_t req, oi_status st, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  reply_result(s, req, st, msg);
}

void oi__send_refusal(int fd, oi_status st, const char *msg) {
  oiwire_Envelope env;
  oi__wire_set_result(&env, 0, st, msg);
  uint8_t *frame;
  size_t len;
  if (oi__wire_encode(&env, NULL, &frame, &len) != OI_OK) return;
  oi__wire_send(fd, frame, len);
  oi__free(frame);
}

/* What a save's or load's status means once its ticket failed in the
 * server (the copy's own message is on the server's thread that ran it:
 * its log has it). */
static const char *async_cause(oi_status st) {
  switch (st) {
  case OI_ERR_IO: return "a copy between the arena and the host pool failed";
  case OI_ERR_TIMEOUT: return "its copies missed the server's deadline";
  case OI_ERR_DEADLINE:
    return "its copies missed the server's deadline (they ended before this answer)";
  default: return "";
  }
}

/* The Result of a failed save or load: what, how many blocks, which
 * instance, the status and its cause. */
static void reply_async_failure(srv_session *s, uint64_t req, oi_status st, const char *what,
                                size_t n, uint32_t instance) {
  const char *cause = async_cause(st);
  if (!strcmp(what, "load")) /* (the engine logs failed saves) */
    OI_LOG_I(OI_LOG_WARN, "server", instance, "session=%llu load of %zu blocks failed: %s",
             (unsigned long long)s->id, n, oi_status_str(st));
  reply_fmt(s, req, st, "%s of %zu blocks failed in the server (instance %u): %s%s%s%s", what, n,
            instance, oi_status_str(st), cause[0] ? " (" : "", cause,
            cause[0] ? "; the server's log has the details)" : "");
}

/* ---- instances ----------------------------------------------------------------- */

/* The principal (host/host.h) of a session's leases: its peer's uid, so that
 * a lease is redeemable by every session of the same user in its namespace
 * and by no other user's. */
static uint64_t session_principal(const srv_session *s) {
  return (1ull << 32) | (uint64_t)s->peer_uid;
}

static void instance_put(srv_instance *inst) {
  if (atomic_fetch_sub(&inst->refs, 1) != 1) return;
  oi_server *srv = inst->server;
  /* The engine drains its copies (they read and write the arena) before
   * the arena goes. */
  oi_offload_engine_destroy(inst->engine);
  if (!inst->owned)
    inst->dev->ops->mem_free(inst->dev, inst->arena);
  else if (inst->dev->ordinal == OI_DEVICE_CPU)
    oi__fd_arena_unmap(inst->map, inst->map_bytes);
  else
    inst->dev->ops->mem_close_import(inst->dev, inst->map, inst->map_bytes);
  oi__dev_close(inst->dev);
  atomic_fetch_sub(&srv->instances, 1);
  if (!inst->owned) atomic_fetch_sub(&srv->arena_bytes, inst->arena_bytes);
  if (inst->by_session_end) atomic_fetch_add(&srv->instances_cleaned_up, 1);
  OI_LOG_I(OI_LOG_INFO, "server", inst->id, "%s: %s its %llu-byte %s arena",
           inst->by_session_end ? "cleaned up (session ended)" : "unregistered",
           inst->owned ? "unmapped" : "freed", (unsigned long long)inst->arena_bytes,
           inst->owned ? "engine-owned" : "server-allocated");
  oi__free(inst);
}

bool oi__server_instance_elsewhere(oi_server *srv, const srv_session *self, uint32_t id) {
  bool found = false;
  pthread_mutex_lock(&srv->lock);
  for (srv_session *o = srv->sessions; o && !found; o = o->next) {
    if (o == self) continue;
    for (srv_instance *i = o->instances; i; i = i->next)
      if (i->id == id) {
        found = true;
        break;
      }
  }
  pthread_mutex_unlock(&srv->lock);
  return found;
}

/* The instance `id` of this session, or NULL after replying with why not. */
static srv_instance *lookup(srv_session *s, uint64_t req, uint32_t id, const char *what) {
  for (srv_instance *i = s->instances; i; i = i->next)
    if (i->id == id) return i;
  if (id && oi__server_instance_elsewhere(s->server, s, id))
    reply_fmt(s, req, OI_ERR_PERMISSION, "%s: instance %u belongs to another session", what, id);
  else
    reply_fmt(s, req, OI_ERR_NOT_FOUND, "%s: instance %u is not registered in this session", what,
              id);
  return NULL;
}

static void unlink_instance(srv_session *s, srv_instance *inst) {
  pthread_mutex_lock(&s->server->lock);
  for (srv_instance **l = &s->instances; *l; l = &(*l)->next)
    if (*l == inst) {
      *l = inst->next;
      break;
    }
  pthread_mutex_unlock(&s->server->lock);
  inst->next = NULL;
}

/* ---- worker threads (flush, unregister; layered loads) ------------------------------- */

static void send_load_progress(srv_session *s, uint64_t req, uint32_t arenas_done) {
  oiwire_Envelope env;
  memset(&env, 0, sizeof env);
  env.request_id = req;
  env.which_body = oiwire_Envelope_load_progress_tag;
  env.body.load_progress.arenas_done = arenas_done;
  session_send(s, &env, NULL);
}

/* A layered load: one LoadProgress per arena that landed (arenas that landed
 * together share one frame), then the final Result, all from this thread so
 * the Result comes last. A stopping session still waits for the load (the
 * ticket must complete before its reference goes) but sends nothing. */
static void run_load_progress(srv_session *s, aux_job *job, bool stopping) {
  oi_ticket *t = job->ticket;
  for (uint32_t a = 0; a < job->n_arenas && !stopping;) {
    if (oi_ticket_arena_wait(t, a, UINT32_MAX) != OI_OK) break; /* the Result says why */
    while (a + 1 < job->n_arenas && oi_ticket_arena_poll(t, a + 1) == OI_OK)
      a++;
    a++;
    if (a < job->n_arenas) send_load_progress(s, job->request_id, a);
  }
  oi_status st = oi__ticket_wait_final(t); /* past a deadline too: answered once fenced */
  if (!stopping) {
    if (st == OI_OK)
      reply_result(s, job->request_id, OI_OK, "");
    else
      reply_async_failure(s, job->request_id, st, "load", job->n_blocks, job->inst->id);
  }
  oi_ticket_release(t);
}

static void *worker_main(void *arg) {
  srv_worker *w = arg;
  srv_session *s = w->session;
  pthread_mutex_lock(&w->lock);
  for (;;) {
    while (!w->head && !w->stop)
      pthread_cond_wait(&w->cv, &w->lock);
    aux_job *job = w->head;
    if (!job) break;
    w->head = job->next;
    if (!w->head) w->tail = NULL;
    bool stopping = w->stop;
    pthread_mutex_unlock(&w->lock);
    if (job->kind == AUX_FLUSH) {
      if (!stopping) {
        oi_status st = oi_offload_engine_flush(job->inst->engine, job->timeout_ms);
        if (st == OI_OK)
          reply_result(s, job->request_id, OI_OK, "");
        else
          reply_failure(s, job->request_id, st);
      }
      instance_put(job->inst);
    } else if (job->kind == AUX_LOAD_PROGRESS) {
      run_load_progress(s, job, stopping);
      instance_put(job->inst);
    } else {
      instance_put(job->inst); /* the table's reference: the last one */
      if (!stopping) reply_result(s, job->request_id, OI_OK, "");
    }
    oi__free(job);
    pthread_mutex_lock(&w->lock);
  }
  pthread_mutex_unlock(&w->lock);
  return NULL;
}

static void worker_init(srv_worker *w, srv_session *s, const char *name) {
  w->session = s;
  w->name = name;
  pthread_mutex_init(&w->lock, NULL);
  pthread_cond_init(&w->cv, NULL);
}

/* Runs every queued job, then joins the thread. */
static void worker_stop(srv_worker *w) {
  if (!w->started) return;
  pthread_mutex_lock(&w->lock);
  w->stop = true;
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->lock);
  pthread_join(w->thread, NULL);
  w->started = false;
}

static void worker_destroy(srv_worker *w) {
  pthread_cond_destroy(&w->cv);
  pthread_mutex_destroy(&w->lock);
}

/* Queues `job` (filled by the caller; the worker frees it). On failure the
 * caller keeps the job and everything it names. */
static oi_status worker_enqueue(srv_worker *w, aux_job *job) {
  if (!w->started) { /* only the session thread enqueues: no race on started */
    int rc = pthread_create(&w->thread, NULL, worker_main, w);
    if (rc != 0)
      return oi__fail(OI_ERR_INTERNAL, "cannot start a session thread: %s", strerror(rc));
    pthread_setname_np(w->thread, w->name);
    w->started = true;
  }
  job->next = NULL;
  pthread_mutex_lock(&w->lock);
  if (w->tail)
    w->tail->next = job;
  else
    w->head = job;
  w->tail = job;
  pthread_cond_signal(&w->cv);
  pthread_mutex_unlock(&w->lock);
  return OI_OK;
}

static oi_status aux_enqueue(srv_session *s, aux_kind kind, uint64_t req, srv_instance *inst,
                             uint32_t timeout_ms) {
  aux_job *job = oi__calloc(1, sizeof *job);
  if (!job) return oi__fail(OI_ERR_OUT_OF_MEMORY, "out of memory");
  job->kind = kind;
  job->request_id = req;
  job->inst = inst;
  job->timeout_ms = timeout_ms;
  oi_status st = worker_enqueue(&s->aux, job);
  if (st != OI_OK) oi__free(job);
  return st;
}

/* ---- requests ------------------------------------------------------------------- */

static void handle_hello(srv_session *s, uint64_t req, const oiwire_Hello *h) {
  char msg[512];
  oi_status st = oi__req_check_hello(h, msg, sizeof msg);
  if (st != OI_OK) return reply_result(s, req, st, msg);
  s->hello_done = true;
  oiwire_Envelope env;
  memset(&env, 0, sizeof env);
  env.request_id = req;
  env.which_body = oiwire_Envelope_hello_reply_tag;
  env.body.hello_reply.protocol_version = OI_WIRE_PROTOCOL_VERSION;
  env.body.hello_reply.capabilities = OI_WIRE_CAP_PIPELINED | OI_WIRE_CAP_MEMBERSHIP |
                                      OI_WIRE_CAP_LOOKUP | OI_WIRE_CAP_SAVE_COUNTS |
                                      OI_WIRE_CAP_LAYERWISE | OI_WIRE_CAP_OWNED_ARENA |
                                      OI_WIRE_CAP_LOAD_PROGRESS;
  env.body.hello_reply.server_epoch = s->server->epoch;
  snprintf(env.body.hello_reply.server_version, sizeof env.body.hello_reply.server_version, "%s",
           oi_version_string());
  OI_LOG(OI_LOG_INFO, "server", "session=%llu hello from '%s' (pid %d, uid %u)",
         (unsigned long long)s->id, h->client_name, (int)s->peer_pid, (unsigned)s->peer_uid);
  session_send(s, &env, NULL);
}

static bool device_served(const oi_server *srv, int32_t device) {
  if (srv->opts.num_devices == 0) return true;
  for (uint32_t i = 0; i < srv->opts.num_devices; i++)
    if (srv->devices[i] == device) return true;
  return false;
}

static void handle_register(srv_session *s, uint64_t req, const oiwire_Register *r) {
  oi_server *srv = s->server;
  oi_wire_arrays *a = &s->arrays;
  char msg[512];
  oi_status st = oi__req_check_arrays(a, "register", msg, sizeof msg);
  if (st != OI_OK) return reply_result(s, req, st, msg);
  if (!device_served(srv, r->device))
    return reply_fmt(s, req, OI_ERR_PERMISSION, "register: this server does not serve device %d",
                     (int)r->device);
  /* Validate everything before allocating anything (request.c). */
  oi_engine_options eo;
  oi_arena_desc *descs;
  if ((st = oi__req_register_options(r, a, &eo, &descs, msg, sizeof msg)) != OI_OK)
    return reply_result(s, req, st, msg);

  srv_instance *inst = NULL;
  oi_dev *dev = NULL;
  void *region = NULL, *map = NULL;
  uint64_t map_bytes = 0;
  oi_arena_handle handle;
  bool owned = r->client_owned;
  if (owned && r->device == OI_DEVICE_CPU && (s->recv_fd < 0 || s->recv_extra)) {
    st = oi__fail(OI_ERR_INVALID_ARGUMENT,
                  "register: an engine-owned cpu arena needs exactly one memfd sent with the "
                  "request (SCM_RIGHTS); %s",
                  s->recv_fd < 0 ? "none came" : "more came");
    goto fail;
  }
  if (owned && r->device != OI_DEVICE_CPU && s->recv_fd >= 0) {
    st = oi__fail(OI_ERR_INVALID_ARGUMENT,
                  "register: a device arena travels as an IPC handle, not a file descriptor");
    goto fail;
  }
  if ((st = oi__dev_open(r->device, &dev)) != OI_OK) goto fail;
  if (owned && r->device == OI_DEVICE_CPU) {
    /* The client's memfd: checked (sealed against shrinking, large enough,
     * writable) and mapped; the descriptor is closed after the dispatch. */
    if ((st = oi__fd_arena_map(s->recv_fd, r->arena_size, &map, &map_bytes, "register")) != OI_OK)
      goto fail;
    region = map;
  } else if (owned) {
    /* The client's cudaMalloc allocation: imported, its size checked. */
    memcpy(handle.bytes, r->client_handle.bytes, OI_WIRE_HANDLE_BYTES);
    uint64_t need = r->client_offset + r->arena_size;
    if ((st = dev->ops->mem_import(dev, &handle, need, &map, &map_bytes)) != OI_OK) {
      char m[384];
      snprintf(m, sizeof m, "%s", oi_last_error());
      st = oi__fail(st, "register: importing the client's arena: %s", m);
      goto fail;
    }
    region = (uint8_t *)map + r->client_offset;
  } else {
    if ((st = dev->ops->mem_alloc(dev, r->arena_size, OI_MEM_SHAREABLE, &region)) != OI_OK)
      goto fail;
    if ((st = dev->ops->mem_export(dev, region, &handle)) != OI_OK) goto fail;
  }
  inst = oi__calloc(1, sizeof *inst);
  if (!inst) {
    st = oi__fail(OI_ERR_OUT_OF_MEMORY, "register: out of memory");
    goto fail;
  }
  eo.arena_base = region;
  if ((st = oi_offload_engine_create(srv->host, &eo, &inst->engine)) != OI_OK) goto fail;
  inst->engine->principal = session_principal(s); /* before the client learns its id */
  oi__free(descs);
  descs = NULL;
  oi_engine_stats es = {.struct_size = sizeof es};
  oi_offload_engine_stats(inst->engine, &es); /* (cannot fail on a local engine) */
  atomic_init(&inst->refs, 1);
  inst->id = es.instance_id;
  inst->server = srv;
  inst->dev = dev;
  inst->arena = region;
  inst->arena_bytes = r->arena_size;
  inst->owned = owned;
  inst->map = map;
  inst->map_bytes = map_bytes;
  pthread_mutex_lock(&srv->lock);
  inst->next = s->instances;
  s->instances = inst;
  pthread_mutex_unlock(&srv->lock);
  atomic_fetch_add(&srv->instances, 1);
  if (!owned) atomic_fetch_add(&srv->arena_bytes, r->arena_size);
  OI_LOG_I(OI_LOG_INFO, "server", inst->id,
           "session=%llu registered '%s' namespace '%s' on device %d: %llu-byte %s arena",
           (unsigned long long)s->id, r->instance_name, r->namespace_id, (int)r->device,
           (unsigned long long)r->arena_size, owned ? "engine-owned" : "server-allocated");

  oiwire_Envelope env;
  memset(&env, 0, sizeof env);
  env.request_id = req;
  env.which_body = oiwire_Envelope_register_reply_tag;
  oiwire_RegisterReply *rr = &env.body.register_reply;
  rr->instance_id = inst->id;
  if (!owned) {
    rr->arena_handle.size = OI_WIRE_HANDLE_BYTES;
    memcpy(rr->arena_handle.bytes, handle.bytes, OI_WIRE_HANDLE_BYTES);
  }
  rr->arena_bytes = r->arena_size;
  rr->block_bytes = es.block_bytes;
  rr->num_blocks = es.num_blocks;
  session_send(s, &env, NULL);
  return;

fail:
  reply_failure(s, req, st);
  oi__free(inst);
  if (owned && map && r->device == OI_DEVICE_CPU)
    oi__fd_arena_unmap(map, map_bytes);
  else if (owned && map)
    dev->ops->mem_close_import(dev, map, map_bytes);
  else if (region)
    dev->ops->mem_free(dev, region);
  oi__dev_close(dev);
  oi__free(descs);
}

typedef struct ticket_reply {
  srv_session *s;
  uint64_t request_id;
  const char *what;
  size_t n;
  uint32_t instance;
} ticket_reply;

static void on_ticket_done(void *ctx, oi_ticket *t, oi_status st) {
  OI_UNUSED(t);
  ticket_reply *p = ctx;
  if (st == OI_OK)
    reply_result(p->s, p->request_id, OI_OK, "");
  else
    reply_async_failure(p->s, p->request_id, st, p->what, p->n, p->instance);
  oi__free(p);
}

/* Replies when `t` (a save or load of n blocks on `inst`) completes, then
 * drops the observer reference. */
static void reply_on_completion(srv_session *s, uint64_t req, oi_ticket *t, const char *what,
                                size_t n, const srv_instance *inst) {
  ticket_reply *p = oi__malloc(sizeof *p);
  if (p) {
    *p = (ticket_reply){.s = s, .request_id = req, .what = what, .n = n, .instance = inst->id};
    if (oi_ticket_set_callback(t, on_ticket_done, p) == OI_OK) {
      oi_ticket_release(t);
      return;
    }
    oi__free(p);
  }
  oi_status st = oi__ticket_wait_final(t);
  if (st == OI_OK)
    reply_result(s, req, OI_OK, "");
  else
    reply_async_failure(s, req, st, what, n, inst->id);
  oi_ticket_release(t);
}

static void handle_save(srv_session *s, uint64_t req, const oiwire_Save *m) {
  oi_wire_arrays *a = &s->arrays;
  srv_instance *inst = lookup(s, req, m->instance_id, "save");
  if (!inst) return;
  char msg[512];
  oi_status st = oi__req_check_save(a, msg, sizeof msg);
  if (st != OI_OK) return reply_result(s, req, st, msg);
  oi_ticket *t = NULL;
  oi_save_result counts = {.struct_size = sizeof counts};
  oi_save_options so;
  oi_save_options_init(&so);
  so.result = m->want_counts ? &counts : NULL;
  so.arena_first = m->arena_first; /* a layerwise save; validated by the engine */
  so.arena_count = m->arena_count;
  st = oi_offload_engine_save(inst->engine, a->ids, a->hashes, a->n_ids, &so, &t);
  if (st != OI_OK) return reply_failure(s, req, st);
  if (m->want_counts) { /* before the final Result, which the ticket's callback sends */
    oiwire_Envelope env;
    memset(&env, 0, sizeof env);
    env.request_id = req;
    env.which_body = oiwire_Envelope_save_counts_tag;
    env.body.save_counts.accepted = counts.accepted;
    env.body.save_counts.deduplicated = counts.deduplicated;
    env.body.save_counts.dropped = counts.dropped;
    session_send(s, &env, NULL);
  }
  reply_on_completion(s, req, t, "save", a->n_ids, inst);
}

/* A lookup (Query with instance 0 and a namespace): no instance, the lease
 * created by the session's lookup instance for the session's principal. */
static oi_status lookup_query(srv_session *s, const oiwire_Query *m, size_t n,
                              oi_query_result *qr) {
  if (!s->lookup_instance) s->lookup_instance = oi__host_instance_add(s->server->host);
  oi_host_query_args qa = {.instance = s->lookup_instance,
                           .principal = session_principal(s),
                           .shares = m->world_size ? m->world_size : 1,
                           .membership = (m->flags & OI_QUERY_MEMBERSHIP) != 0,
                           .present = qr->present,
                           .wait_ms = (m->flags & OI_QUERY_WAIT_PENDING) ? m->wait_ms : 0};
  oi_status st =
      oi__query_check("query", s->arrays.hashes, n, m->flags, qr, &qa.present, &qa.wait_ms);
  if (st != OI_OK) return st;
  oi_host_answer ans;
  if ((st = oi__host_query(s->server->host, m->namespace_id, &qa, s->arrays.hashes, n, &ans)) !=
      OI_OK)
    return st;
  return oi__query_result_out(&qa, &ans, qr, "query");
}

static void handle_query(srv_session *s, uint64_t req, const oiwire_Query *m) {
  oi_wire_arrays *a = &s->arrays;
  bool is_lookup = m->instance_id == 0 && m->namespace_id[0];
  srv_instance *inst = NULL;
  if (!is_lookup && !(inst = lookup(s, req, m->instance_id, "query"))) return;
  char msg[512];
  if (oi__req_check_arrays(a, "query", msg, sizeof msg) != OI_OK)
    return reply_result(s, req, a->bad, msg);
  size_t n = a->n_hashes;
  oi_query_result qr;
  memset(&qr, 0, sizeof qr);
  qr.struct_size = sizeof qr;
  qr.wait_ms = m->wait_ms;
  if ((m->flags & OI_QUERY_MEMBERSHIP) && n > 0) {
    if (!s->present && !(s->present = oi__malloc(OI_WIRE_MAX_BLOCKS)))
      return reply_fmt(s, req, OI_ERR_OUT_OF_MEMORY, "query: out of memory");
    qr.present = s->present;
  }
  /* (A WAIT_PENDING query holds this session's requests for up to wait_ms.) */
  oi_status st = is_lookup ? lookup_query(s, m, n, &qr)
                           : oi_offload_engine_query(inst->engine, m->req_id[0] ? m->req_id : NULL,
                                                     a->hashes, n, m->flags, &qr);
  if (st != OI_OK) return reply_failure(s, req, st);
  oiwire_Envelope env;
  memset(&env, 0, sizeof env);
  env.request_id = req;
  env.which_body = oiwire_Envelope_query_reply_tag;
  env.body.query_reply.state = qr.state;
  env.body.query_reply.hit_blocks = qr.hit_blocks;
  env.body.query_reply.pending_blocks = qr.pending_blocks;
  static const oi_lease no_lease;
  if (memcmp(&qr.lease, &no_lease, sizeof no_lease) != 0) {
    env.body.query_reply.lease.size = OI_WIRE_LEASE_BYTES;
    memcpy(env.body.query_reply.lease.bytes, qr.lease.bytes, OI_WIRE_LEASE_BYTES);
  }
  oi_wire_out out = {.present = qr.present, .n_present = qr.present ? n : 0};
  session_send(s, &env, &out);
}

static bool lease_from_wire(srv_session *s, uint64_t req, const char *what, const uint8_t *bytes,
                            size_t size, oi_lease *lease) {
  char msg[256];
  oi_status st = oi__req_lease(what, bytes, size, lease, msg, sizeof msg);
  if (st != OI_OK) reply_result(s, req, st, msg);
  return st == OI_OK;
}

static void handle_load(srv_session *s, uint64_t req, const oiwire_Load *m) {
  oi_wire_arrays *a = &s->arrays;
  srv_instance *inst = lookup(s, req, m->instance_id, "load");
  if (!inst) return;
  char msg[512];
  if (oi__req_check_arrays(a, "load", msg, sizeof msg) != OI_OK)
    return reply_result(s, req, a->bad, msg);
  oi_lease lease;
  if (!lease_from_wire(s, req, "load", m->lease.bytes, m->lease.size, &lease)) return;
  oi_load_options lo;
  oi_load_options_init(&lo);
  lo.flags = m->flags; /* validated by the engine */
  oi_ticket *t = NULL;
  oi_status st = oi_offload_engine_load(inst->engine, lease, a->ids, a->n_ids, &lo, &t);
  if (st != OI_OK) return reply_failure(s, req, st);
  if (!(m->flags & OI_LOAD_ARENA_EVENTS))
    return reply_on_completion(s, req, t, "load", a->n_ids, inst);
  /* Layered: the progress worker reports each arena, then the Result. */
  aux_job *job = oi__calloc(1, sizeof *job);
  if (job) {
    job->kind = AUX_LOAD_PROGRESS;
    job->request_id = req;
    job->inst = inst;
    job->ticket = t;
    job->n_arenas = inst->engine->layout.num_arenas;
    job->n_blocks = a->n_ids;
    atomic_fetch_add(&inst->refs, 1);
    if (worker_enqueue(&s->progress, job) == OI_OK) return;
    instance_put(inst);
    oi__free(job);
  }
  reply_on_completion(s, req, t, "load", a->n_ids, inst); /* no progress frames: the Result alone */
}

static void handle_release(srv_session *s, uint64_t req, const oiwire_Release *m) {
  bool is_lookup = m->instance_id == 0 && m->namespace_id[0];
  srv_instance *inst = NULL;
  if (!is_lookup && !(inst = lookup(s, req, m->instance_id, "release"))) return;
  oi_lease lease;
  if (!lease_from_wire(s, req, "release", m->lease.bytes, m->lease.size, &lease)) return;
  oi_status st = is_lookup ? oi__host_lookup_release(s->server->host, m->namespace_id,
                                                     session_principal(s), lease)
                           : oi_offload_engine_release(inst->engine, lease);
  if (st != OI_OK) return reply_failure(s, req, st);
  reply_result(s, req, OI_OK, "");
}

static void handle_flush(srv_session *s, uint64_t req, const oiwire_Flush *m) {
  srv_instance *inst = lookup(s, req, m->instance_id, "flush");
  if (!inst) return;
  atomic_fetch_add(&inst->refs, 1);
  oi_status st = aux_enqueue(s, AUX_FLUSH, req, inst, m->timeout_ms);
  if (st != OI_OK) {
    instance_put(inst);
    reply_failure(s, req, st);
  }
}

static void handle_unregister(srv_session *s, uint64_t req, const oiwire_Unregister *m) {
  srv_instance *inst = NULL;
  for (srv_instance *i = s->instances; i; i = i->next)
    if (i->id == m->instance_id) inst = i;
  if (!inst) {
    if (m->instance_id && oi__server_instance_elsewhere(s->server, s, m->instance_id))
      return reply_fmt(s, req, OI_ERR_PERMISSION,
                       "unregister: instance %u belongs to another session", m->instance_id);
    /* Already cleaned up (or never was): what the caller wants is true. */
    return reply_result(s, req, OI_OK, "");
  }
  unlink_instance(s, inst); /* later requests naming it fail; queued flushes finish first */
  oi_status st = aux_enqueue(s, AUX_UNREGISTER, req, inst, 0);
  if (st != OI_OK) {
    instance_put(inst);
    reply_result(s, req, OI_OK, "");
  }
}

void oi__wire_host_stats(const oi_host_stats *hs, oiwire_HostStats *w) {
  w->size_classes = hs->size_classes;
  w->capacity_bytes = hs->capacity_bytes;
  w->used_bytes = hs->used_bytes;
  w->free_bytes = hs->free_bytes;
  w->block_bytes_resident = hs->block_bytes_resident;
  w->blocks_free = hs->blocks_free;
  w->blocks_in_flight = hs->blocks_in_flight;
  w->blocks_sealed = hs->blocks_sealed;
  w->blocks_leased = hs->blocks_leased;
  w->blocks_loading = hs->blocks_loading;
  w->saves_submitted = hs->saves_submitted;
  w->saves_completed = hs->saves_completed;
  w->saves_deduplicated = hs->saves_deduplicated;
  w->saves_dropped = hs->saves_dropped;
  w->saves_failed = hs->saves_failed;
  w->bytes_saved = hs->bytes_saved;
  w->bytes_loaded = hs->bytes_loaded;
  w->loads_completed = hs->loads_completed;
  w->loads_failed = hs->loads_failed;
  w->query_hit_blocks = hs->query_hit_blocks;
  w->query_miss_blocks = hs->query_miss_blocks;
  w->leases_active = hs->leases_active;
  w->leases_expired = hs->leases_expired;
  w->leases_released = hs->leases_released;
  w->evictions = hs->evictions;
  w->loads_submitted = hs->loads_submitted;
  w->blocks_loaded = hs->blocks_loaded;
  w->blocks_pinned = hs->blocks_pinned;
  w->pool_setup_ns = hs->pool_setup_ns;
  w->namespaces = hs->namespaces;
  w->save_latency_us_count = OI_LATENCY_BUCKETS;
  memcpy(w->save_latency_us, hs->save_latency_us, sizeof w->save_latency_us);
  w->save_latency_sum_us = hs->save_latency_sum_us;
  w->load_latency_us_count = OI_LATENCY_BUCKETS;
  memcpy(w->load_latency_us, hs->load_latency_us, sizeof w->load_latency_us);
  w->load_latency_sum_us = hs->load_latency_sum_us;
}

static void handle_stats(srv_session *s, uint64_t req, const oiwire_Stats *m) {
  oi_server *srv = s->server;
  oiwire_Envelope env;
  memset(&env, 0, sizeof env);
  env.request_id = req;
  env.which_body = oiwire_Envelope_stats_reply_tag;
  oiwire_StatsReply *r = &env.body.stats_reply;
  if (m->instance_id) {
    srv_instance *inst = lookup(s, req, m->instance_id, "stats");
    if (!inst) return;
    oi_engine_stats es;
    memset(&es, 0, sizeof es);
    es.struct_size = sizeof es;
    oi_status st = oi_offload_engine_stats(inst->engine, &es);
    if (st != OI_OK) return reply_failure(s, req, st);
    r->instance_id = es.instance_id;
    r->block_bytes = es.block_bytes;
    r->num_blocks = es.num_blocks;
    r->saves_submitted = es.saves_submitted;
    r->saves_completed = es.saves_completed;
    r->saves_deduplicated = es.saves_deduplicated;
    r->saves_dropped = es.saves_dropped;
    r->saves_failed = es.saves_failed;
    r->loads_completed = es.loads_completed;
    r->loads_failed = es.loads_failed;
    r->blocks_loaded = es.blocks_loaded;
    r->bytes_saved = es.bytes_saved;
    r->bytes_loaded = es.bytes_loaded;
    r->query_hit_blocks = es.query_hit_blocks;
    r->query_miss_blocks = es.query_miss_blocks;
    r->saves_pending = es.saves_pending;
    r->loads_submitted = es.loads_submitted;
    r->namespace_blocks_resident = es.namespace_blocks_resident;
    r->save_latency_us_count = OI_LATENCY_BUCKETS;
    memcpy(r->save_latency_us, es.save_latency_us, sizeof r->save_latency_us);
    r->save_latency_sum_us = es.save_latency_sum_us;
    r->load_latency_us_count = OI_LATENCY_BUCKETS;
    memcpy(r->load_latency_us, es.load_latency_us, sizeof r->load_latency_us);
    r->load_latency_sum_us = es.load_latency_sum_us;
  }
  pthread_mutex_lock(&srv->lock);
  r->sessions = srv->num_sessions;
  pthread_mutex_unlock(&srv->lock);
  r->instances = atomic_load(&srv->instances);
  r->arena_bytes = atomic_load(&srv->arena_bytes);
  r->instances_cleaned_up = atomic_load(&srv->instances_cleaned_up);
  r->server_epoch = srv->epoch;
  r->uptime_ns = oi__now_ns() - srv->start_ns;
  oi_host_stats hs;
  memset(&hs, 0, sizeof hs);
  hs.struct_size = sizeof hs;
  oiwire_NamespaceStats *nss = NULL;
  oi_wire_out out = {0};
  oi_host_disk_stats ds;
  memset(&ds, 0, sizeof ds);
  ds.struct_size = sizeof ds;
  if (oi_offload_host_disk_stats(srv->host, &ds) == OI_OK) {
    oiwire_DiskStats *w = &r->disk;
    r->has_disk = true;
    w->blocks = ds.blocks;
    w->bytes_used = ds.bytes_used;
    w->capacity_bytes = ds.capacity_bytes;
    w->spills = ds.spills;
    w->spills_failed = ds.spills_failed;
    w->spills_skipped = ds.spills_skipped;
    w->spill_overflow = ds.spill_overflow;
    w->promotions = ds.promotions;
    w->promote_failed = ds.promote_failed;
    w->checksum_failures = ds.checksum_failures;
    w->evictions = ds.evictions;
    w->torn_records_cut = ds.torn_records_cut;
    w->replay_ns = ds.replay_ns;
    w->read_latency_us_count = OI_LATENCY_BUCKETS;
    memcpy(w->read_latency_us, ds.read_latency_us, sizeof w->read_latency_us);
    w->read_latency_sum_us = ds.read_latency_sum_us;
  }
  oi_clear_error();
  if (oi_offload_host_stats(srv->host, &hs) == OI_OK) {
    r->host_blocks_sealed = hs.blocks_sealed;
    r->host_capacity_bytes = hs.capacity_bytes;
    r->has_host = true;
    oi__wire_host_stats(&hs, &r->host);
    uint32_t n = OI_MIN(hs.namespaces, OI_WIRE_MAX_NAMESPACES);
    if (n && (nss = oi__calloc(n, sizeof *nss))) {
      size_t k = 0;
      for (uint32_t i = 0; i < n; i++) {
        oi_namespace_stats ns;
        memset(&ns, 0, sizeof ns);
        ns.struct_size = sizeof ns;
        if (oi_offload_host_namespace_stats(srv->host, i, &ns) != OI_OK) break;
        snprintf(nss[k].name, sizeof nss[k].name, "%s", ns.name);
        nss[k].block_bytes = ns.block_bytes;
        nss[k].blocks_resident = ns.blocks_resident;
        k++;
      }
      out.namespaces = nss;
      out.n_namespaces = k;
    }
  }
  oi_clear_error();
  session_send(s, &env, &out);
  oi__free(nss);
}

static void dispatch(srv_session *s) {
  oiwire_Envelope *env = &s->env;
  uint64_t req = env->request_id;
  if (env->which_body == oiwire_Envelope_hello_tag) return handle_hello(s, req, &env->body.hello);
  if (!s->hello_done && env->which_body != 0)
    return reply_fmt(s, req, OI_ERR_STATE, "the first request of a session must be Hello");
  switch (env->which_body) {
  case oiwire_Envelope_register_instance_tag:
    return handle_register(s, req, &env->body.register_instance);
  case oiwire_Envelope_save_tag: return handle_save(s, req, &env->body.save);
  case oiwire_Envelope_query_tag: return handle_query(s, req, &env->body.query);
  case oiwire_Envelope_load_tag: return handle_load(s, req, &env->body.load);
  case oiwire_Envelope_release_tag: return handle_release(s, req, &env->body.release);
  case oiwire_Envelope_flush_tag: return handle_flush(s, req, &env->body.flush);
  case oiwire_Envelope_unregister_tag: return handle_unregister(s, req, &env->body.unregister);
  case oiwire_Envelope_stats_tag: return handle_stats(s, req, &env->body.stats);
  case 0:
    return reply_fmt(s, req, OI_ERR_UNSUPPORTED,
                     "unknown message type (the envelope has no body this server knows)");
  default:
    return reply_fmt(s, req, OI_ERR_UNSUPPORTED, "message type %u is a reply, not a request",
                     env->which_body);
  }
}

/* ---- the session thread ---------------------------------------------------------- */

static void session_end(srv_session *s) {
  oi_server *srv = s->server;
  /* The peer sees the end; replies still in flight fail quietly. */
  shutdown(s->fd, SHUT_RDWR);
  worker_stop(&s->aux);
  worker_stop(&s->progress);
  for (;;) {
    pthread_mutex_lock(&srv->lock);
    srv_instance *inst = s->instances;
    if (inst) s->instances = inst->next;
    pthread_mutex_unlock(&srv->lock);
    if (!inst) break;
    inst->by_session_end = true;
    instance_put(inst);
  }
  /* The leases its lookups created go with the session. */
  if (s->lookup_instance) oi__host_instance_remove(srv->host, s->lookup_instance);
  OI_LOG(OI_LOG_INFO, "server", "session=%llu ended (pid %d)", (unsigned long long)s->id,
         (int)s->peer_pid);
}

static void *session_main(void *arg) {
  srv_session *s = arg;
  oi_server *srv = s->server;
  for (;;) {
    /* One recvmsg takes what the socket holds; frames already buffered
     * are served without one. */
    const uint8_t *frame = NULL;
    size_t len = 0;
    oi_status st;
    while ((st = oi__wire_reader_next(&s->rd, OI_WIRE_MAX_FRAME, &frame, &len, &s->recv_fd,
                                      &s->recv_extra)) == OI_PENDING)
      if ((st = oi__wire_reader_fill(&s->rd, s->fd, OI_WIRE_MAX_FRAME, true, false)) != OI_OK)
        break;
    if (s->recv_fd >= 0 && st != OI_OK) {
      close(s->recv_fd);
      s->recv_fd = -1;
    }
    if (atomic_load(&s->handshake_expired) && !atomic_load(&s->hello_done)) {
      /* The run loop shut our read side: no Hello in time. */
      OI_LOG(OI_LOG_WARN, "server", "session=%llu dropped: no Hello within %u ms (pid %d)",
             (unsigned long long)s->id, srv->opts.handshake_timeout_ms, (int)s->peer_pid);
      reply_fmt(s, 0, OI_ERR_TIMEOUT, "session closed: no Hello within %u ms",
                srv->opts.handshake_timeout_ms);
      break;
    }
    if (st == OI_ERR_CLOSED || st == OI_ERR_IO) break;
    if (st != OI_OK) {
      OI_LOG(OI_LOG_WARN, "server", "session=%llu dropped: %s", (unsigned long long)s->id,
             oi_last_error());
      reply_fmt(s, 0, st, "session closed: %s", oi_last_error());
      break;
    }
    st = oi__wire_decode(frame, len, &s->env, &s->arrays);
    if (st != OI_OK) {
      OI_LOG(OI_LOG_WARN, "server", "session=%llu dropped: %s", (unsigned long long)s->id,
             oi_last_error());
      reply_fmt(s, 0, st, "session closed: %s", oi_last_error());
      break;
    }
    dispatch(s);
    if (s->recv_fd >= 0) { /* the register that came with it mapped it, or none wanted it */
      close(s->recv_fd);
      s->recv_fd = -1;
    }
  }
  session_end(s);
  pthread_mutex_lock(&srv->lock);
  s->finished = true;
  pthread_cond_broadcast(&srv->sessions_cv);
  pthread_mutex_unlock(&srv->lock);
  ssize_t w = write(srv->wake_fds[1], "r", 1); /* the run loop reaps */
  OI_UNUSED(w);
  return NULL;
}

oi_status oi__session_start(oi_server *srv, int fd, pid_t pid, uid_t uid, gid_t gid,
                            srv_session **out) {
  srv_session *s = oi__calloc(1, sizeof *s);
  if (!s) return oi__fail(OI_ERR_OUT_OF_MEMORY, "out of memory for a session");
  s->server = srv;
  s->fd = fd;
  s->peer_pid = pid;
  s->peer_uid = uid;
  s->peer_gid = gid;
  s->recv_fd = -1;
  oi__wire_reader_init(&s->rd);
  s->start_ns = oi__now_ns();
  pthread_mutex_init(&s->write_lock, NULL);
  worker_init(&s->aux, s, "oi-session-aux");
  worker_init(&s->progress, s, "oi-session-load");
  /* A peer that stops reading cannot hold engine threads forever. */
  struct timeval tv = {.tv_sec = CONTROL_SEND_TIMEOUT_S};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  pthread_mutex_lock(&srv->lock);
  s->id = ++srv->next_session_id;
  s->next = srv->sessions;
  srv->sessions = s;
  srv->num_sessions++;
  int rc = OI_FAULT(OI_FAULT_SESSION_START, NULL)
               ? EAGAIN
               : pthread_create(&s->thread, NULL, session_main, s);
  if (rc != 0) {
    srv->sessions = s->next;
    srv->num_sessions--;
    pthread_mutex_unlock(&srv->lock);
    worker_destroy(&s->aux);
    worker_destroy(&s->progress);
    pthread_mutex_destroy(&s->write_lock);
    oi__free(s);
    return oi__fail(OI_ERR_INTERNAL, "cannot start a session thread: %s", strerror(rc));
  }
  pthread_mutex_unlock(&srv->lock);
  pthread_setname_np(s->thread, "oi-session");
  OI_LOG(OI_LOG_INFO, "server", "session=%llu connected (pid %d, uid %u, gid %u)",
         (unsigned long long)s->id, (int)pid, (unsigned)uid, (unsigned)gid);
  *out = s;
  return OI_OK;
}

void oi__session_reap(srv_session *s) {
  pthread_join(s->thread, NULL);
  close(s->fd);
  if (s->recv_fd >= 0) close(s->recv_fd);
  oi__wire_arrays_free(&s->arrays);
  oi__wire_reader_free(&s->rd);
  oi__free(s->present);
  worker_destroy(&s->aux);
  worker_destroy(&s->progress);
  pthread_mutex_destroy(&s->write_lock);
  oi__free(s);
}
