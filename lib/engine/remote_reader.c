/* The sidecar engine's reader thread (the watchdog): it delivers replies,
 * sweeps deadlines, sends the breaker's probe, runs the load fence and
 * handles a lost connection (fatal handler, or degrade and reconnect).
 * The invariants: remote_internal.h. */

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

/* ---- the reader (and watchdog) ---------------------------------------------------- */

/* Delivers one reply. Lock not held. An asynchronous operation's final
 * reply is completed here on the reader thread; a leader (on_reader false)
 * hands it to the reader instead, so on_done runs where it always did. */
static void deliver(remote_engine *e, const oiwire_Envelope *env, bool on_reader) {
  bool is_result = env->which_body == oiwire_Envelope_result_tag;
  oi_status st = is_result ? env->body.result.status : OI_OK;
  if (is_result && st > 0) st = OI_ERR_PROTOCOL; /* a reply is final */
  pthread_mutex_lock(&e->lock);
  if (env->which_body == oiwire_Envelope_load_progress_tag) {
    /* Not final: a layered load's first arenas_done arenas are in place. */
    uint32_t k = env->body.load_progress.arenas_done;
    for (pending *q = e->buckets[env->request_id % PENDING_BUCKETS]; q; q = q->hnext)
      if (q->id == env->request_id && q->kind == PEND_LOAD && q->ticket) {
        if (k > 0 && !q->fenced)
          oi__ticket_arena_landed(q->ticket, k - 1, OI_OK); /* (beyond n: ignored) */
        break;
      }
    pthread_mutex_unlock(&e->lock);
    return;
  }
  if (env->which_body == oiwire_Envelope_save_counts_tag) {
    /* Not final: the save stays in the table for its Result. */
    for (pending *q = e->buckets[env->request_id % PENDING_BUCKETS]; q; q = q->hnext)
      if (q->id == env->request_id && q->kind == PEND_SAVE && q->counts) {
        q->counts->accepted = env->body.save_counts.accepted;
        q->counts->deduplicated = env->body.save_counts.deduplicated;
        q->counts->dropped = env->body.save_counts.dropped;
        q->counts->received = true;
        oi__remote_counts_abandon_locked(e, q);
        break;
      }
    pthread_mutex_unlock(&e->lock);
    return;
  }
  pending *p = oi__remote_pending_take_locked(e, env->request_id);
  if (!p) {
    pthread_mutex_unlock(&e->lock);
    OI_LOG_I(OI_LOG_DEBUG, "engine", e->base.instance_id,
             "reply to request %llu arrived late (dropped)", (unsigned long long)env->request_id);
    return;
  }
  if (p->kind == PEND_PROBE) { /* the server answers: the breaker closes */
    if (e->probe_id == p->id) e->probe_id = 0;
    bool was = atomic_exchange(&e->unresponsive, false);
    uint32_t instance = e->base.instance_id;
    pthread_mutex_unlock(&e->lock);
    oi__free(p);
    if (was)
      OI_LOG_I(OI_LOG_WARN, "engine", instance,
               "the openinfer server at %s answered a probe: it is used again", e->socket_path);
    return;
  }
  bool late = p->late;
  if (p->kind == PEND_CALL) {
    p->reply = *env;
    p->status = st;
    snprintf(p->message, sizeof p->message, "%s", is_result ? env->body.result.message : "");
    if (st != OI_OK && !p->message[0])
      snprintf(p->message, sizeof p->message, "%s", oi_status_str(st));
    if (p->present && env->which_body == oiwire_Envelope_query_reply_tag) {
      if (e->arrays.n_present != p->present_n) {
        p->status = OI_ERR_PROTOCOL;
        snprintf(p->message, sizeof p->message,
                 "query: the server answered %zu membership bytes for %zu hashes",
                 e->arrays.n_present, p->present_n);
      } else if (p->present_n) {
        memcpy(p->present, e->arrays.present, p->present_n);
      }
    }
    p->done = true;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->lock);
    return;
  }
  pthread_mutex_unlock(&e->lock);
  if (!is_result) {
    OI_LOG_I(OI_LOG_ERROR, "engine", e->base.instance_id,
             "%s: the server answered with message type %u", p->kind == PEND_SAVE ? "save" : "load",
             env->which_body);
    st = OI_ERR_PROTOCOL;
  } else if (late) {
    OI_LOG_I(OI_LOG_WARN, "engine", e->base.instance_id,
             "load request %llu of %u blocks: the server answered after its deadline (%s): no "
             "copy can land now; it ends with OI_ERR_DEADLINE",
             (unsigned long long)p->id, p->n_blocks, oi_status_str(st));
  } else if (st != OI_OK) {
    OI_LOG_I(OI_LOG_WARN, "engine", e->base.instance_id, "%s failed: %s",
             p->kind == PEND_SAVE ? "save" : "load", env->body.result.message);
  }
  if (on_reader) {
    oi__remote_finish_async(e, p, st);
    return;
  }
  p->result = st;
  p->next = NULL;
  pthread_mutex_lock(&e->lock);
  *e->handed_tail = p;
  e->handed_tail = &p->next;
  oi__remote_kick_locked(e);
  pthread_mutex_unlock(&e->lock);
}

/* Fences a load whose deadline passed (lock held): its ticket answers
 * OI_FENCING, its record stays until the fence (the server's answer, or the
 * server gone). */
static void fence_locked(remote_engine *e, pending *p) {
  p->fenced = p->late = true;
  if (p->ticket) oi__ticket_fence(p->ticket);
  OI_LOG_I(OI_LOG_WARN, "engine", e->base.instance_id,
           "load request %llu of %u blocks missed its deadline (%u ms): fencing; its destination "
           "blocks stay the library's until the server answers or is gone, then the ticket ends "
           "with OI_ERR_DEADLINE",
           (unsigned long long)p->id, p->n_blocks, e->base.opts.load_deadline_ms);
}

/* Every asynchronous operation whose deadline passed: a save completes with
 * OI_ERR_TIMEOUT (a late copy only reads the engine's memory), a load is
 * fenced. Either opens the breaker. */
static void expire(remote_engine *e, uint64_t now) {
  for (;;) {
    pthread_mutex_lock(&e->lock);
    pending *p = e->head;
    while (p && (p->kind == PEND_CALL || p->kind == PEND_PROBE || p->late || p->deadline_ns > now))
      p = p->next;
    if (!p) {
      pthread_mutex_unlock(&e->lock);
      return;
    }
    char op[64], why[64];
    snprintf(op, sizeof op, "%s of %u blocks", p->kind == PEND_SAVE ? "save" : "load", p->n_blocks);
    snprintf(why, sizeof why, "no reply within %u ms",
             p->kind == PEND_SAVE ? e->base.opts.save_deadline_ms : e->base.opts.load_deadline_ms);
    if (p->kind == PEND_LOAD) {
      fence_locked(e, p);
      pthread_mutex_unlock(&e->lock);
      oi__remote_trip(e, op, why);
      continue;
    }
    oi__remote_pending_unlink_locked(e, p);
    oi__remote_counts_abandon_locked(e, p);
    pthread_mutex_unlock(&e->lock);
    OI_LOG_I(OI_LOG_WARN, "engine", e->base.instance_id,
             "save request %llu: no reply before its deadline", (unsigned long long)p->id);
    oi__remote_trip(e, op, why);
    oi__remote_finish_async(e, p, OI_ERR_TIMEOUT);
  }
}

/* Loads whose connection ended unanswered: each is fenced at its deadline
 * and completes once its server is gone (no longer exists, or a zombie):
 * only then can no copy land. Reader thread. */
static void sweep_orphans(remote_engine *e, uint64_t now) {
  pthread_mutex_lock(&e->lock);
  pending *done = NULL;
  for (pending **l = &e->orphans; *l;) {
    pending *p = *l;
    if (!p->late && p->deadline_ns <= now) fence_locked(e, p);
    if (p->server_pid <= 0 || oi__wire_peer_gone(p->server_pid)) {
      *l = p->next;
      p->next = done;
      done = p;
    } else {
      l = &p->next;
    }
  }
  pthread_mutex_unlock(&e->lock);
  for (pending *p = done, *next; p; p = next) {
    next = p->next;
    if (p->server_pid > 0)
      OI_LOG_I(OI_LOG_WARN, "engine", e->base.instance_id,
               "load request %llu of %u blocks: its server (pid %d) is gone, no copy can land: it "
               "ends unanswered",
               (unsigned long long)p->id, p->n_blocks, p->server_pid);
    else
      OI_LOG_I(OI_LOG_WARN, "engine", e->base.instance_id,
               "load request %llu of %u blocks: its connection ended unanswered and the server's "
               "pid is unknown (another pid namespace): it ends now",
               (unsigned long long)p->id, p->n_blocks);
    oi__remote_finish_async(e, p, OI_ERR_CLOSED);
  }
}

static bool have_orphans(remote_engine *e) {
  pthread_mutex_lock(&e->lock);
  bool any = e->orphans != NULL;
  pthread_mutex_unlock(&e->lock);
  return any;
}

/* The breaker's probe (reader thread): while it is open, one every
 * probe_ms; an unanswered one is dropped when the next goes. */
static void probe_tick(remote_engine *e, uint64_t now) {
  if (!oi__remote_breaker_open(e)) return;
  pthread_mutex_lock(&e->lock);
  bool due = atomic_load(&e->unresponsive) && now >= e->next_probe_ns && !e->stop &&
             (e->state == CONN_LIVE || e->state == CONN_RETIRED);
  pending *stale = NULL;
  if (due) {
    if (e->probe_id) stale = oi__remote_pending_take_locked(e, e->probe_id);
    e->probe_id = 0;
    e->next_probe_ns = now + (uint64_t)e->probe_ms * 1000000u;
  }
  pthread_mutex_unlock(&e->lock);
  oi__free(stale);
  if (!due) return;
  pending *p = oi__calloc(1, sizeof *p);
  if (!p) return;
  p->kind = PEND_PROBE;
  p->deadline_ns = UINT64_MAX;
  pthread_mutex_lock(&e->lock);
  oi__remote_pending_insert_locked(e, p);
  uint64_t id = p->id, gen = e->gen;
  pthread_mutex_unlock(&e->lock);
  oiwire_Envelope env;
  memset(&env, 0, sizeof env); /* no body: every server answers at once */
  env.request_id = id;
  uint8_t *frame = NULL;
  size_t len = 0;
  /* The reader never blocks on an unresponsive server: a sender that holds
   * the write side, or a socket without room, skips this probe. */
  oi_status st = oi__wire_encode(&env, NULL, &frame, &len);
  if (st == OI_OK && pthread_mutex_trylock(&e->write_lock) == 0) {
    st = e->gen != gen ? OI_ERR_CLOSED : oi__wire_try_send(e->fd, frame, len);
    if (st == OI_ERR_IO) shutdown(e->fd, SHUT_RDWR); /* a partial frame */
    pthread_mutex_unlock(&e->write_lock);
  } else if (st == OI_OK) {
    st = OI_PENDING;
  }
  oi__free(frame);
  pthread_mutex_lock(&e->lock);
  if (st != OI_OK)
    oi__free(oi__remote_pending_take_locked(e, id)); /* (NULL if the connection's end took it) */
  else if (atomic_load(&e->unresponsive))
    e->probe_id = id; /* (else answered already) */
  pthread_mutex_unlock(&e->lock);
  oi_clear_error();
}

/* The connection ended: fail everything waiting; if the engine is live,
 * the memory its arena maps is gone: fatal, unless the memory is the
 * engine's own: then degrade. @return true when degraded (the reader
 * reconnects). */
static bool connection_lost(remote_engine *e, const char *why) {
  pthread_mutex_lock(&e->lock);
  conn_state was = e->state;
  bool degrade = was == CONN_LIVE && e->owned && !e->stop;
  e->state = degrade ? CONN_DEGRADED : CONN_DEAD;
  if (!e->conn_msg[0]) snprintf(e->conn_msg, sizeof e->conn_msg, "%s", why);
  pending *list = e->head;
  e->head = e->tail = NULL;
  memset(e->buckets, 0, sizeof e->buckets);
  e->n_async = 0;
  for (pending *p = list; p; p = p->next) {
    oi__remote_counts_abandon_locked(e, p);
    if (p->kind == PEND_CALL) {
      p->status = e->conn_status ? e->conn_status : OI_ERR_CLOSED;
      snprintf(p->message, sizeof p->message,
               "the connection to the openinfer server ended: %.400s", e->conn_msg);
      p->done = true;
    }
  }
  pthread_cond_broadcast(&e->cv);
  /* Calls belong to their waiters; detach the asynchronous ones. A load's
   * copies may still run in the server: it waits for the server's end. */
  pending *async = NULL, *probes = NULL;
  for (pending *p = list, *next; p; p = next) {
    next = p->next;
    if (p->kind == PEND_LOAD) {
      /* It can no longer be answered: fencing now (waits return at once),
       * final once the server is gone. */
      p->fenced = true;
      if (p->ticket) oi__ticket_fence(p->ticket);
      p->server_pid = e->server_pid;
      p->next = e->orphans;
      e->orphans = p;
    } else if (p->kind == PEND_PROBE) {
      p->next = probes;
      probes = p;
    } else if (p->kind != PEND_CALL) {
      p->next = async;
      async = p;
    }
  }
  e->probe_id = 0;
  pthread_mutex_unlock(&e->lock);
  for (pending *p = probes, *next; p; p = next) {
    next = p->next;
    oi__free(p);
  }
  for (pending *p = async, *next; p; p = next) {
    next = p->next;
    oi__remote_finish_async(e, p, OI_ERR_CLOSED);
  }
  sweep_orphans(e, oi__now_ns());
  if (degrade) {
    OI_LOG_I(OI_LOG_WARN, "engine", e->base.instance_id,
             "the openinfer server at %s went away (%s): the engine owns its memory, so it "
             "degrades (queries miss, saves drop, loads fail) and reconnects when a server is back",
             e->socket_path, e->conn_msg);
    return true;
  }
  if (was == CONN_LIVE) {
    /* A dying server closes its sockets a moment before it is a zombie:
     * give its loads up to 500 ms to see it gone, so the handler finds
     * them ended. */
    bool stop = false;
    for (int i = 0; i < 500 && !stop && have_orphans(e); i++) {
      usleep(1000);
      sweep_orphans(e, oi__now_ns());
      pthread_mutex_lock(&e->lock);
      stop = e->stop;
      pthread_mutex_unlock(&e->lock);
    }
    /* Teardown began meanwhile: it runs only once the caller closed the
     * arena's mapping, so nothing maps the lost memory now. */
    if (!stop)
      oi__fatal("openinfer: the sidecar server at %s died while this process maps the KV arena "
                "it owns (%s); the arena's memory is gone and there is no reconnect",
                e->socket_path, e->conn_msg);
  }
  return false;
}

/* Serves every whole frame buffered on the read side (its holder only).
 * @return OI_OK when it needs more bytes; an error (with its message) when
 * the stream is not a frame or not an Envelope: the connection is unusable. */
oi_status oi__remote_serve_frames(remote_engine *e, bool on_reader) {
  for (;;) {
    const uint8_t *frame = NULL;
    size_t len = 0;
    oi_status st = oi__wire_reader_next(&e->rd, OI_WIRE_MAX_FRAME, &frame, &len, NULL, NULL);
    if (st == OI_PENDING) return OI_OK;
    if (st == OI_OK) st = oi__wire_decode(frame, len, &e->env, &e->arrays);
    if (st != OI_OK) return st;
    if (e->env.request_id == 0 && e->env.which_body == oiwire_Envelope_result_tag) {
      /* The server ends the session and says why; the end of stream follows. */
      pthread_mutex_lock(&e->lock);
      snprintf(e->conn_msg, sizeof e->conn_msg, "%s: %s", oi_status_str(e->env.body.result.status),
               e->env.body.result.message);
      e->conn_status = e->env.body.result.status < 0 ? e->env.body.result.status : OI_ERR_PROTOCOL;
      pthread_mutex_unlock(&e->lock);
      OI_LOG(OI_LOG_WARN, "engine", "the openinfer server closes the session: %s",
             e->env.body.result.message);
      continue;
    }
    deliver(e, &e->env, on_reader);
  }
}

/* Takes the read side for the reader (lock held), waiting for a leader to
 * let go of it. */
static void reader_take_locked(remote_engine *e) {
  while (e->reading) {
    e->waiting++;
    pthread_cond_wait(&e->cv, &e->lock);
    e->waiting--;
  }
  e->reading = true;
}

/* Reads replies until the connection ends; `why` says how. Returns holding
 * the read side (the caller handles the end, then reconnects or stops). */
static void read_connection(remote_engine *e, char *why, size_t cap) {
  uint64_t next_expiry = oi__now_ns() + 250000000ull;
  for (;;) {
    oi__remote_finish_handed(e);
    pthread_mutex_lock(&e->lock);
    e->kicked = false;
    if (e->read_failed) { /* a leader met the end: take over */
      reader_take_locked(e);
      e->read_failed = false;
      snprintf(why, cap, "%s", e->read_why);
      pthread_mutex_unlock(&e->lock);
      oi__remote_finish_handed(e);
      return;
    }
    /* While a caller leads, only watch for the end of the stream: its
     * replies wake no one but the leader. */
    bool watch = e->reading;
    e->watching = watch;
    bool handed = e->handed != NULL;
    pthread_mutex_unlock(&e->lock);
    if (handed) continue;
    struct pollfd pfd[2] = {{.fd = e->fd, .events = watch ? POLLRDHUP : POLLIN},
                            {.fd = e->kick_fd, .events = POLLIN}};
    int timeout_ms = 250;
    if (oi__remote_breaker_open(e)) { /* wake for the next probe */
      pthread_mutex_lock(&e->lock);
      uint64_t at = e->next_probe_ns, now = oi__now_ns();
      pthread_mutex_unlock(&e->lock);
      timeout_ms = at <= now ? 0 : (int)OI_MIN((at - now + 999999u) / 1000000u, 250u);
    }
    int rc = poll(pfd, 2, timeout_ms);
    int poll_errno = errno;
    pthread_mutex_lock(&e->lock);
    e->watching = false;
    pthread_mutex_unlock(&e->lock);
    if (rc < 0 && poll_errno != EINTR) {
      snprintf(why, cap, "poll: %s", strerror(poll_errno));
      pthread_mutex_lock(&e->lock);
      reader_take_locked(e);
      pthread_mutex_unlock(&e->lock);
      return;
    }
    if (rc > 0 && (pfd[1].revents & POLLIN)) {
      uint64_t v;
      ssize_t r = read(e->kick_fd, &v, sizeof v);
      OI_UNUSED(r);
    }
    uint64_t now = oi__now_ns();
    if (now >= next_expiry) {
      expire(e, now);
      sweep_orphans(e, now);
      next_expiry = now + 250000000ull;
    }
    probe_tick(e, now);
    if (rc <= 0 || !pfd[0].revents) continue;
    bool ended = pfd[0].revents & (POLLHUP | POLLRDHUP | POLLERR | POLLNVAL);
    pthread_mutex_lock(&e->lock);
    if (e->read_failed) { /* a leader met the end already: the loop's top takes over */
      pthread_mutex_unlock(&e->lock);
      continue;
    }
    if (e->reading && !ended) { /* a leader reads it */
      pthread_mutex_unlock(&e->lock);
      continue;
    }
    if (e->reading) { /* the stream ended under a leader: it will see it too */
      uint64_t until = oi__now_ns() + 250000000ull;
      struct timespec ts = oi__remote_abs_timespec(until);
      e->waiting++;
      while (e->reading && pthread_cond_timedwait(&e->cv, &e->lock, &ts) != ETIMEDOUT) {
      }
      e->waiting--;
      pthread_mutex_unlock(&e->lock);
      continue;
    }
    e->reading = true;
    pthread_mutex_unlock(&e->lock);
    oi_status st = oi__wire_reader_fill(&e->rd, e->fd, OI_WIRE_MAX_FRAME, false, true);
    if (st == OI_OK) st = oi__remote_serve_frames(e, true);
    if (st != OI_OK && st != OI_PENDING) {
      snprintf(why, cap, "%s", oi_last_error());
      return; /* (holding the read side) */
    }
    pthread_mutex_lock(&e->lock);
    oi__remote_release_read_side_locked(e);
    pthread_mutex_unlock(&e->lock);
  }
}

/* Degraded: tries to reconnect, backing off from 100 ms to 2 s, until it
 * succeeds (true) or teardown stops it (false). */
static bool reconnect_loop(remote_engine *e) {
  uint32_t backoff_ms = 100;
  uint64_t attempts = 0;
  for (;;) {
    uint64_t deadline = oi__deadline_ns(backoff_ms);
    bool stop = false;
    for (uint64_t now = oi__now_ns(); !stop && now < deadline; now = oi__now_ns()) {
      /* (waking every 250 ms for the loads of the lost connection) */
      struct timespec ts = oi__remote_abs_timespec(OI_MIN(deadline, now + 250000000ull));
      pthread_mutex_lock(&e->lock);
      while (!e->stop && pthread_cond_timedwait(&e->cv, &e->lock, &ts) != ETIMEDOUT) {
      }
      stop = e->stop;
      pthread_mutex_unlock(&e->lock);
      sweep_orphans(e, oi__now_ns());
    }
    if (stop) return false;
    attempts++;
    oi_status st = oi__remote_reconnect(e);
    if (st == OI_OK) return true;
    if (st == OI_ERR_CLOSED) { /* (teardown) */
      pthread_mutex_lock(&e->lock);
      stop = e->stop;
      pthread_mutex_unlock(&e->lock);
      if (stop) return false;
    }
    OI_LOG(attempts == 1 || attempts % 100 == 0 ? OI_LOG_INFO : OI_LOG_DEBUG, "engine",
           "reconnect to %s (attempt %llu): %s", e->socket_path, (unsigned long long)attempts,
           oi_last_error());
    backoff_ms = backoff_ms >= 1000 ? 2000 : backoff_ms * 2;
  }
}

void *oi__remote_reader_main(void *arg) {
  remote_engine *e = arg;
  char why[256];
  for (;;) {
    why[0] = '\0';
    read_connection(e, why, sizeof why); /* (returns holding the read side) */
    pthread_mutex_lock(&e->lock);
    e->read_failed = false; /* (handled here, whoever met the end first) */
    pthread_mutex_unlock(&e->lock);
    oi__remote_finish_handed(e); /* replies that came before the end complete first */
    if (!connection_lost(e, why)) {
      /* No reconnect: the loads of the lost connection still wait for
       * their server's end (or teardown: oi__remote_free_engine settles them). */
      while (have_orphans(e)) {
        struct timespec ts = oi__remote_abs_timespec(oi__deadline_ns(250));
        pthread_mutex_lock(&e->lock);
        bool stop = e->stop;
        if (!stop) pthread_cond_timedwait(&e->cv, &e->lock, &ts);
        stop = e->stop;
        pthread_mutex_unlock(&e->lock);
        if (stop) break;
        sweep_orphans(e, oi__now_ns());
      }
      return NULL;
    }
    if (!reconnect_loop(e)) return NULL;
    oi__wire_reader_reset(&e->rd); /* the new connection's bytes start afresh */
    pthread_mutex_lock(&e->lock);
    oi__remote_release_read_side_locked(e);
    pthread_mutex_unlock(&e->lock);
  }
}
