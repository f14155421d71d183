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
 * the host tier for everyone in the namespace.
 *
 * Files (session_internal.h): this one runs the session thread, its replies,
 * instances and worker threads; session_requests.c and session_stats.c
 * handle the requests. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/fault.h"
#include "session_internal.h"

#define CONTROL_SEND_TIMEOUT_S 30

/* ---- replies ------------------------------------------------------------------ */

void oi__session_send(srv_session *s, const oiwire_Envelope *env, const oi_wire_out *out) {
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

void oi__session_reply(srv_session *s, uint64_t req, oi_status st, const char *msg) {
  oiwire_Envelope env;
  oi__wire_set_result(&env, req, st, msg ? msg : "");
  oi__session_send(s, &env, NULL);
}

/* Replies with `st` and the calling thread's last error message. */
void oi__session_reply_failure(srv_session *s, uint64_t req, oi_status st) {
  oi__session_reply(s, req, st, oi_last_error());
}

void oi__session_reply_fmt(srv_session *s, uint64_t req, oi_status st, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  oi__session_reply(s, req, st, msg);
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
void oi__session_reply_async_failure(srv_session *s, uint64_t req, oi_status st, const char *what,
                                     size_t n, uint32_t instance) {
  const char *cause = async_cause(st);
  if (!strcmp(what, "load")) /* (the engine logs failed saves) */
    OI_LOG_I(OI_LOG_WARN, "server", instance, "session=%llu load of %zu blocks failed: %s",
             (unsigned long long)s->id, n, oi_status_str(st));
  oi__session_reply_fmt(s, req, st, "%s of %zu blocks failed in the server (instance %u): %s%s%s%s",
                        what, n, instance, oi_status_str(st), cause[0] ? " (" : "", cause,
                        cause[0] ? "; the server's log has the details)" : "");
}

/* ---- instances ----------------------------------------------------------------- */

void oi__session_instance_put(srv_instance *inst) {
  if (atomic_fetch_sub(&inst->refs, 1) != 1) return;
  oi_server *srv = inst->server;
  /* The engine drains its copies (they read and write the arena) before
   * the arena goes. */
  oi_engine_destroy(inst->engine);
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
srv_instance *oi__session_lookup(srv_session *s, uint64_t req, uint32_t id, const char *what) {
  for (srv_instance *i = s->instances; i; i = i->next)
    if (i->id == id) return i;
  if (id && oi__server_instance_elsewhere(s->server, s, id))
    oi__session_reply_fmt(s, req, OI_ERR_PERMISSION, "%s: instance %u belongs to another session",
                          what, id);
  else
    oi__session_reply_fmt(s, req, OI_ERR_NOT_FOUND,
                          "%s: instance %u is not registered in this session", what, id);
  return NULL;
}

void oi__session_unlink_instance(srv_session *s, srv_instance *inst) {
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
  oi__session_send(s, &env, NULL);
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
      oi__session_reply(s, job->request_id, OI_OK, "");
    else
      oi__session_reply_async_failure(s, job->request_id, st, "load", job->n_blocks, job->inst->id);
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
        oi_status st = oi_engine_flush(job->inst->engine, job->timeout_ms);
        if (st == OI_OK)
          oi__session_reply(s, job->request_id, OI_OK, "");
        else
          oi__session_reply_failure(s, job->request_id, st);
      }
      oi__session_instance_put(job->inst);
    } else if (job->kind == AUX_LOAD_PROGRESS) {
      run_load_progress(s, job, stopping);
      oi__session_instance_put(job->inst);
    } else {
      oi__session_instance_put(job->inst); /* the table's reference: the last one */
      if (!stopping) oi__session_reply(s, job->request_id, OI_OK, "");
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
oi_status oi__session_worker_enqueue(srv_worker *w, aux_job *job) {
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

oi_status oi__session_aux_enqueue(srv_session *s, aux_kind kind, uint64_t req, srv_instance *inst,
                                  uint32_t timeout_ms) {
  aux_job *job = oi__calloc(1, sizeof *job);
  if (!job) return oi__fail(OI_ERR_OUT_OF_MEMORY, "out of memory");
  job->kind = kind;
  job->request_id = req;
  job->inst = inst;
  job->timeout_ms = timeout_ms;
  oi_status st = oi__session_worker_enqueue(&s->aux, job);
  if (st != OI_OK) oi__free(job);
  return st;
}

static void dispatch(srv_session *s) {
  oiwire_Envelope *env = &s->env;
  uint64_t req = env->request_id;
  if (env->which_body == oiwire_Envelope_hello_tag)
    return oi__session_hello(s, req, &env->body.hello);
  if (!s->hello_done && env->which_body != 0)
    return oi__session_reply_fmt(s, req, OI_ERR_STATE,
                                 "the first request of a session must be Hello");
  switch (env->which_body) {
  case oiwire_Envelope_register_instance_tag:
    return oi__session_register(s, req, &env->body.register_instance);
  case oiwire_Envelope_save_tag: return oi__session_save(s, req, &env->body.save);
  case oiwire_Envelope_query_tag: return oi__session_query(s, req, &env->body.query);
  case oiwire_Envelope_load_tag: return oi__session_load(s, req, &env->body.load);
  case oiwire_Envelope_release_tag: return oi__session_release(s, req, &env->body.release);
  case oiwire_Envelope_flush_tag: return oi__session_flush(s, req, &env->body.flush);
  case oiwire_Envelope_unregister_tag: return oi__session_unregister(s, req, &env->body.unregister);
  case oiwire_Envelope_stats_tag: return oi__session_stats(s, req, &env->body.stats);
  case 0:
    return oi__session_reply_fmt(
        s, req, OI_ERR_UNSUPPORTED,
        "unknown message type (the envelope has no body this server knows)");
  default:
    return oi__session_reply_fmt(s, req, OI_ERR_UNSUPPORTED,
                                 "message type %u is a reply, not a request", env->which_body);
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
    oi__session_instance_put(inst);
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
      oi__session_reply_fmt(s, 0, OI_ERR_TIMEOUT, "session closed: no Hello within %u ms",
                            srv->opts.handshake_timeout_ms);
      break;
    }
    if (st == OI_ERR_CLOSED || st == OI_ERR_IO) break;
    if (st != OI_OK) {
      OI_LOG(OI_LOG_WARN, "server", "session=%llu dropped: %s", (unsigned long long)s->id,
             oi_last_error());
      oi__session_reply_fmt(s, 0, st, "session closed: %s", oi_last_error());
      break;
    }
    st = oi__wire_decode(frame, len, &s->env, &s->arrays);
    if (st != OI_OK) {
      OI_LOG(OI_LOG_WARN, "server", "session=%llu dropped: %s", (unsigned long long)s->id,
             oi_last_error());
      oi__session_reply_fmt(s, 0, st, "session closed: %s", oi_last_error());
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
