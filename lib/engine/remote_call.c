/* The sidecar engine's pending table, the read side's hand-offs, sending,
 * the circuit breaker and a call waiting for its reply (it may lead: read
 * the socket itself). The invariants: remote_internal.h. */

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

/* ---- the pending table (lock held) ----------------------------------------------- */

void oi__remote_pending_insert_locked(remote_engine *e, pending *p) {
  p->id = ++e->next_id;
  if (p->kind != PEND_CALL) e->n_async++;
  pending **b = &e->buckets[p->id % PENDING_BUCKETS];
  p->hnext = *b;
  *b = p;
  p->next = NULL;
  p->prev = e->tail;
  if (e->tail)
    e->tail->next = p;
  else
    e->head = p;
  e->tail = p;
}

void oi__remote_pending_unlink_locked(remote_engine *e, pending *p) {
  for (pending **b = &e->buckets[p->id % PENDING_BUCKETS]; *b; b = &(*b)->hnext)
    if (*b == p) {
      *b = p->hnext;
      break;
    }
  if (p->prev)
    p->prev->next = p->next;
  else
    e->head = p->next;
  if (p->next)
    p->next->prev = p->prev;
  else
    e->tail = p->prev;
  p->prev = p->next = p->hnext = NULL;
  if (p->kind != PEND_CALL) e->n_async--;
}

/* Ends a save's wait for its counts (they will not come now). */
void oi__remote_counts_abandon_locked(remote_engine *e, pending *p) {
  if (!p->counts) return;
  p->counts->done = true;
  p->counts = NULL;
  pthread_cond_broadcast(&e->cv);
}

pending *oi__remote_pending_take_locked(remote_engine *e, uint64_t id) {
  for (pending *p = e->buckets[id % PENDING_BUCKETS]; p; p = p->hnext)
    if (p->id == id) {
      oi__remote_pending_unlink_locked(e, p);
      oi__remote_counts_abandon_locked(e, p);
      return p;
    }
  return NULL;
}

/* Completes an asynchronous operation (lock not held) and frees it. A
 * fenced load ends with OI_ERR_DEADLINE whatever the server answered. */
void oi__remote_finish_async(remote_engine *e, pending *p, oi_status st) {
  if (p->kind == PEND_LOAD) {
    if (p->late) st = OI_ERR_DEADLINE;
    atomic_fetch_add(st == OI_OK ? &e->loads_completed : &e->loads_failed, 1);
  }
  if (p->on_done) p->on_done(p->on_done_ctx, st);
  if (p->ticket) oi__ticket_complete(p->ticket, st);
  oi__free(p);
}

/* ---- the read side (see the header comment) ----------------------------------------- */

/* Wakes the reader out of its poll (lock held). */
void oi__remote_kick_locked(remote_engine *e) {
  if (e->kicked || e->kick_fd < 0) return;
  e->kicked = true;
  uint64_t one = 1;
  ssize_t w = write(e->kick_fd, &one, sizeof one);
  OI_UNUSED(w);
}

/* Releases the read side (lock held): the reader is woken if it has work
 * no caller will do (completions handed to it; asynchronous replies to
 * read while it only watches), and the threads waiting for the read side
 * are told. */
void oi__remote_release_read_side_locked(remote_engine *e) {
  e->reading = false;
  e->reading_caller = false;
  if (e->read_failed || e->handed || (e->n_async && e->watching)) oi__remote_kick_locked(e);
  if (e->waiting) pthread_cond_broadcast(&e->cv);
}

/* Completes the asynchronous operations a leader handed over (reader
 * thread, lock not held), in the order their replies arrived. */
void oi__remote_finish_handed(remote_engine *e) {
  pthread_mutex_lock(&e->lock);
  pending *list = e->handed;
  e->handed = NULL;
  e->handed_tail = &e->handed;
  pthread_mutex_unlock(&e->lock);
  for (pending *p = list, *next; p; p = next) {
    next = p->next;
    oi__remote_finish_async(e, p, p->result);
  }
}

/* The connection's locks, its condition variable and its read side. */
void oi__remote_init_sync(remote_engine *e) {
  pthread_mutex_init(&e->lock, NULL);
  oi__cond_init_monotonic(&e->cv);
  pthread_mutex_init(&e->write_lock, NULL);
  pthread_mutex_init(&e->teardown_lock, NULL);
  oi__wire_reader_init(&e->rd);
  e->handed = NULL;
  e->handed_tail = &e->handed;
  e->kick_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
}

/* ---- sending ----------------------------------------------------------------------- */

/* Sends on the connection of generation `gen` (a request made for a
 * connection that has since been replaced is never sent on the new one). */
static oi_status send_envelope(remote_engine *e, const oiwire_Envelope *env, const oi_wire_out *out,
                               uint64_t gen) {
  uint8_t *frame;
  size_t len;
  oi_status st = oi__wire_encode(env, out, &frame, &len);
  if (st != OI_OK) return st;
  pthread_mutex_lock(&e->write_lock);
  if (e->gen != gen)
    st = oi__fail(OI_ERR_CLOSED, "the connection this request was made for has ended");
  else if (env->which_body == oiwire_Envelope_register_instance_tag && e->owned_fd >= 0)
    st = oi__wire_send_fd(e->fd, frame, len, e->owned_fd);
  else
    st = oi__wire_send(e->fd, frame, len);
  if (st != OI_OK && e->gen == gen)
    shutdown(e->fd, SHUT_RDWR); /* a partial frame: the stream is unusable */
  pthread_mutex_unlock(&e->write_lock);
  oi__free(frame);
  return st;
}

/* Every request body names the instance; set under e->lock, because a
 * reconnect changes it. */
static void set_instance_locked(remote_engine *e, oiwire_Envelope *env) {
  uint32_t id = e->base.instance_id;
  switch (env->which_body) {
  case oiwire_Envelope_save_tag: env->body.save.instance_id = id; break;
  case oiwire_Envelope_query_tag: env->body.query.instance_id = id; break;
  case oiwire_Envelope_load_tag: env->body.load.instance_id = id; break;
  case oiwire_Envelope_release_tag: env->body.release.instance_id = id; break;
  case oiwire_Envelope_flush_tag: env->body.flush.instance_id = id; break;
  case oiwire_Envelope_unregister_tag: env->body.unregister.instance_id = id; break;
  case oiwire_Envelope_stats_tag: env->body.stats.instance_id = id; break;
  default: break;
  }
}

uint32_t oi__remote_instance_of(remote_engine *e) {
  pthread_mutex_lock(&e->lock);
  uint32_t id = e->base.instance_id;
  pthread_mutex_unlock(&e->lock);
  return id;
}

/* Engine-owned and without a server now (the reader is reconnecting). */
bool oi__remote_degraded(remote_engine *e) {
  if (!e->owned) return false;
  pthread_mutex_lock(&e->lock);
  bool d = e->state == CONN_DEGRADED;
  pthread_mutex_unlock(&e->lock);
  return d;
}

oi_status oi__remote_closed_error(remote_engine *e, const char *what) {
  char why[sizeof e->conn_msg];
  pthread_mutex_lock(&e->lock);
  snprintf(why, sizeof why, "%s", e->conn_msg[0] ? e->conn_msg : "closed");
  bool reconnecting = e->state == CONN_DEGRADED;
  pthread_mutex_unlock(&e->lock);
  return oi__fail(OI_ERR_CLOSED, "%s: the connection to the openinfer server is closed (%s)%s",
                  what, why, reconnecting ? "; reconnecting in the background" : "");
}

struct timespec oi__remote_abs_timespec(uint64_t deadline_ns) {
  return (struct timespec){.tv_sec = (time_t)(deadline_ns / 1000000000ull),
                           .tv_nsec = (long)(deadline_ns % 1000000000ull)};
}

/* ---- the circuit breaker ------------------------------------------------------------
 * A deadline miss (a call without a reply in time, an asynchronous operation
 * past its deadline) opens it at once: queries miss, saves drop, loads are
 * refused, flush returns, all without a round trip, until the server answers
 * a probe (the reader sends one every probe_ms). A dead connection is the
 * watchdog's (fatal, or degrade and reconnect). */

bool oi__remote_breaker_open(remote_engine *e) {
  return atomic_load_explicit(&e->unresponsive, memory_order_acquire);
}

/* `op` (what failed, e.g. "query of 12 hashes") missed its deadline (`why`):
 * the server is marked unresponsive. Logged once per opening. */
void oi__remote_trip(remote_engine *e, const char *op, const char *why) {
  pthread_mutex_lock(&e->lock);
  bool armed = (e->state == CONN_LIVE || e->state == CONN_RETIRED) && !e->stop;
  bool first = armed && !atomic_load(&e->unresponsive);
  if (first) {
    atomic_store(&e->unresponsive, true);
    e->next_probe_ns = 0; /* the first probe goes at once */
    oi__remote_kick_locked(e);
  }
  uint32_t instance = e->base.instance_id; /* (a reconnect changes it) */
  pthread_mutex_unlock(&e->lock);
  if (first)
    OI_LOG_I(OI_LOG_WARN, "engine", instance,
             "%s: %s: the openinfer server at %s is marked unresponsive; queries miss, saves "
             "drop and loads are refused until it answers a probe (every %u ms)",
             op, why, e->socket_path, e->probe_ms);
}

oi_status oi__remote_unresponsive_error(remote_engine *e, const char *what) {
  return oi__fail(OI_ERR_CLOSED,
                  "%s: the openinfer server at %s is unresponsive (it missed a deadline; it is "
                  "probed every %u ms and used again once it answers): nothing was done",
                  what, e->socket_path, e->probe_ms);
}

/* Registers `p` as pending and sends `env` with p's request id (also
 * stored in *id_out). On failure *taken says whether another thread had
 * already taken p out of the table (the reader completes it: the connection
 * was lost, or its deadline passed); otherwise the submitter took it back and
 * p is referenced by nothing else. See the ownership rule above: after the
 * insert, p is found again only by its id. */
oi_status oi__remote_send_pending(remote_engine *e, oiwire_Envelope *env, const oi_wire_out *out,
                                  pending *p, const char *what, bool *taken, uint64_t *id_out) {
  *taken = false;
  pthread_mutex_lock(&e->lock);
  if (e->state == CONN_DEAD || e->state == CONN_DEGRADED) {
    pthread_mutex_unlock(&e->lock);
    return oi__remote_closed_error(e, what);
  }
  oi__remote_pending_insert_locked(e, p);
  /* A reader that only watches the stream must read this one's reply
   * (unless a leader holds the read side: it wakes the reader as it lets go). */
  if (p->kind != PEND_CALL && e->watching && !e->reading) oi__remote_kick_locked(e);
  uint64_t id = p->id; /* p may be freed by the reader once the lock is released */
  uint64_t gen = e->gen;
  if (env->which_body != oiwire_Envelope_register_instance_tag) set_instance_locked(e, env);
  pthread_mutex_unlock(&e->lock);
  *id_out = id;
  env->request_id = id;
  oi_status st = send_envelope(e, env, out, gen);
  if (st != OI_OK) {
    char msg[256];
    snprintf(msg, sizeof msg, "%s", oi_last_error());
    pthread_mutex_lock(&e->lock);
    *taken = oi__remote_pending_take_locked(e, id) == NULL;
    pthread_mutex_unlock(&e->lock);
    return oi__fail(st, "%s: %s", what, msg);
  }
  return OI_OK;
}

/* A leader polls the socket without sleeping for up to this long before it
 * sleeps in poll: a reply usually comes within tens of microseconds, and
 * waking from a sleep costs the caller a scheduling round trip (measured
 * on the H200 host in docs/benchmarks.md, "the sidecar round trip"). The
 * cost is the caller's own thread, busy for at most this long per wait. */
#define LEAD_SPIN_NS 20000u

/* Whether a waiting call may take the read side now (lock held). */
static bool may_lead_locked(const remote_engine *e) {
  return !e->reading && !e->read_failed &&
         (e->state == CONN_CONNECTING || e->state == CONN_LIVE || e->state == CONN_RETIRED);
}

/* The calling thread holds the read side (taken under the lock, which is
 * held on entry and on return) and reads until p's reply is delivered, the
 * deadline passes (false) or the connection fails (the reader is told and
 * takes over: it fails every waiter). Other replies it reads are delivered
 * as the reader would: calls' to their waiters, asynchronous completions
 * handed to the reader, which runs them. */
static bool lead(remote_engine *e, pending *p, uint64_t deadline) {
  e->reading = true;
  e->reading_caller = true;
  pthread_mutex_unlock(&e->lock);
  bool in_time = true;
  char why[256] = "";
  for (;;) {
    oi_status st = oi__remote_serve_frames(e, false);
    if (st != OI_OK) {
      snprintf(why, sizeof why, "%s", oi_last_error());
      break;
    }
    pthread_mutex_lock(&e->lock);
    bool done = p->done;
    pthread_mutex_unlock(&e->lock);
    if (done) break;
    int wait_ms = -1;
    if (deadline != UINT64_MAX) {
      uint64_t now = oi__now_ns();
      if (now >= deadline) {
        in_time = false;
        break;
      }
      wait_ms = (int)OI_MIN((deadline - now + 999999u) / 1000000u, 3600000u);
    }
    struct pollfd pfd = {.fd = e->fd, .events = POLLIN};
    uint64_t spin_until = oi__now_ns() + LEAD_SPIN_NS;
    int rc;
    while ((rc = poll(&pfd, 1, 0)) == 0 && oi__now_ns() < spin_until) {
    }
    if (rc == 0) rc = poll(&pfd, 1, wait_ms);
    if (rc < 0 && errno != EINTR) {
      snprintf(why, sizeof why, "poll: %s", strerror(errno));
      break;
    }
    if (rc <= 0) continue;
    st = oi__wire_reader_fill(&e->rd, e->fd, OI_WIRE_MAX_FRAME, false, true);
    if (st != OI_OK && st != OI_PENDING) {
      snprintf(why, sizeof why, "%s", oi_last_error());
      break;
    }
  }
  pthread_mutex_lock(&e->lock);
  if (why[0]) {
    e->read_failed = true;
    snprintf(e->read_why, sizeof e->read_why, "%s", why);
  }
  oi__remote_release_read_side_locked(e);
  return in_time;
}

/* Sends `env` and waits up to timeout_ms (UINT32_MAX: for as long as the
 * connection lives) for its reply, which lands in p->reply. A Result with an
 * error becomes this call's status and message. While no other thread
 * reads the connection, the caller reads its reply itself (lead). */
oi_status oi__remote_call(remote_engine *e, oiwire_Envelope *env, const oi_wire_out *out,
                          pending *p, uint32_t timeout_ms, const char *what) {
  p->kind = PEND_CALL;
  p->done = false;
  bool taken;
  uint64_t id;
  oi_status st = oi__remote_send_pending(e, env, out, p, what, &taken, &id);
  if (st != OI_OK) return st;
  uint64_t deadline = oi__deadline_ns(timeout_ms);
  struct timespec ts = oi__remote_abs_timespec(deadline);
  pthread_mutex_lock(&e->lock);
  while (!p->done) {
    bool in_time = true;
    if (may_lead_locked(e)) {
      in_time = lead(e, p, deadline);
    } else {
      e->waiting++;
      if (deadline == UINT64_MAX)
        pthread_cond_wait(&e->cv, &e->lock);
      else if (pthread_cond_timedwait(&e->cv, &e->lock, &ts) == ETIMEDOUT)
        in_time = false;
      e->waiting--;
    }
    if (!in_time && !p->done) {
      oi__remote_pending_take_locked(e, id); /* still ours (not done): a late reply is dropped */
      pthread_mutex_unlock(&e->lock);
      char why[64];
      snprintf(why, sizeof why, "no reply within %u ms", timeout_ms);
      oi__remote_trip(e, what, why);
      return oi__fail(OI_ERR_TIMEOUT, "%s: no reply from the openinfer server within %u ms", what,
                      timeout_ms);
    }
  }
  pthread_mutex_unlock(&e->lock);
  if (p->status != OI_OK) return oi__fail(p->status, "%s", p->message);
  return OI_OK;
}

oi_status oi__remote_unexpected_reply(const pending *p, const char *what) {
  return oi__fail(OI_ERR_PROTOCOL, "%s: the server answered with message type %u", what,
                  p->reply.which_body);
}
