/* The sidecar engine: every operation is a request over the server's Unix
 * socket (lib/proto framing), executed by the server on memory it owns.
 *
 * One connection (session) per engine. Requests carry ids; replies may come
 * out of order and complete the waiting call or the operation's ticket.
 * The reader thread is the watchdog: if the connection breaks while the
 * engine is live, the server that owns the memory this process maps is
 * gone, and the fatal handler runs.
 *
 * The read side (who reads the socket). Frames are read through one
 * buffer (oi_wire_reader: one recv takes every frame the socket holds), by
 * exactly one thread at a time: the one that holds the read side
 * (`reading`, taken and released under e->lock; the buffer, e->env and
 * e->arrays are its). A call waiting for its reply takes the read side
 * itself when no one holds it (lead: poll, recv, deliver), so its reply
 * needs no other thread's wake-up; other replies it reads are delivered
 * as the reader would deliver them: a call's to its waiter (done under the
 * lock, cv broadcast), an asynchronous operation's final reply taken out of
 * the table and handed to the reader (`handed`, in arrival order; the
 * reader completes it, so on_done and tickets complete on the reader
 * thread as always), LoadProgress and SaveCounts in place. Calls that find
 * the read side taken wait on cv (`waiting`) and take it when it is
 * released, so a leader that gives up at its deadline leaves the reading to
 * the next waiter. The reader thread takes the read side only when the
 * socket has something and no one holds it; while a caller leads it polls
 * for the end of the stream only (POLLRDHUP, `watching`: replies wake only
 * the leader), and a leader that lets go while asynchronous operations are
 * outstanding, or hands one over, wakes it (`kick_fd`). Deadline sweeps run
 * on the reader every 250 ms, whoever reads. A leader that meets the end of
 * the stream, or bytes that are not a frame, does not handle it: it sets
 * `read_failed` (with why), lets go and wakes the reader, which takes the
 * read side and runs connection_lost (fatal handler, or degrade and
 * reconnect) exactly as when it met the end itself; no call leads while
 * `read_failed` is set or the connection is not usable. The reader keeps the
 * read side through connection_lost and the reconnect, and releases it
 * with an empty buffer for the new connection.
 *
 * Engine-owned memory (arena_base set at connect): the arena is ours and the
 * server only maps it, so a dead server costs only the cache. The reader
 * then degrades the engine (queries miss, saves drop, loads fail) and
 * reconnects: it registers the layout and the memory again on a new
 * connection (a new generation: requests of the old one are never sent on
 * the new one) and the engine is live again, with a new instance id and
 * epoch.
 *
 * Teardown needs two events, in either order: the caller destroys the engine
 * and the caller closes the imported arena (the hook in device.c tells us).
 * Whichever comes second runs it: retire the watchdog, flush, unregister,
 * close the socket. So the server frees the arena only after this process
 * unmapped it. */
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

#include "device/device.h"
#include "engine/query.h"
#include "engine_internal.h"
#include "proto/wire.h"

#define PENDING_BUCKETS 256

typedef enum conn_state {
  CONN_CONNECTING, /* connect in progress: failures are errors, not fatal */
  CONN_LIVE,       /* the watchdog is armed */
  CONN_RETIRED,    /* clean teardown: the connection may end */
  CONN_DEAD,       /* the connection ended */
  CONN_DEGRADED,   /* engine-owned: the connection ended while live; the reader reconnects */
} conn_state;

/* PEND_PROBE: the breaker's health probe (an Envelope with no body; every
 * server answers it at once, without touching the pool). */
typedef enum pending_kind { PEND_CALL, PEND_SAVE, PEND_LOAD, PEND_PROBE } pending_kind;

/* A save's counts (SaveCounts), awaited by the submitter on its stack. It is
 * touched only under e->lock, and only while the save's record names it:
 * whoever takes the record out of the table, or delivers the counts, marks
 * it done and unlinks it. */
typedef struct counts_wait {
  bool done, received;
  uint64_t accepted, deduplicated, dropped;
} counts_wait;

/* One request waiting for its reply. PEND_CALL lives on the calling thread's
 * stack; PEND_SAVE and PEND_LOAD are heap-allocated.
 *
 * Ownership (the rule every path below follows):
 *  - A record in the table (inserted under e->lock) belongs to the table.
 *    Exactly one thread takes it out, under e->lock: the holder of the read
 *    side (its reply arrived: deliver; a leader hands an asynchronous one to
 *    the reader, which owns it from then), the reader's deadline sweep
 *    (expire), the reader when the connection ends (connection_lost), or
 *    the submitter itself, looking it up BY ID (pending_take_locked), never
 *    by pointer, after a failed send or an expired call. Whoever takes it
 *    owns it from then on.
 *  - Once the submitter has released e->lock after inserting, it never reads
 *    an asynchronous record again: the reader (or a leader, for the
 *    reader) may already have taken it, and the reader freed it. It keeps
 *    the request id (copied under the lock) instead, and gets the record
 *    back only if pending_take_locked still finds that id.
 *  - An asynchronous record is completed and freed (finish_async) only by the
 *    reader thread, outside the lock: the one that took it out of the
 *    table, or the one a leader handed it to. Ids are never reused, so a
 *    late reply or a late lookup cannot reach another record.
 *  - A PEND_CALL's owner is always its waiter (the record is on its stack);
 *    the holder of the read side (the reader, or a leader: possibly the
 *    waiter itself) writes into it only under e->lock while it is in the
 *    table, and marks it done as it takes it out; the waiter reads it
 *    after seeing done, or after taking it back by id. */
typedef struct pending {
  struct pending *prev, *next; /* in submission order */
  struct pending *hnext;       /* hash chain */
  uint64_t id;
  pending_kind kind;
  /* PEND_CALL */
  bool done;
  oi_status status;
  char message[512];
  oiwire_Envelope reply;
  uint8_t *present; /* membership answers go here... */
  size_t present_n; /* ...exactly this many */
  /* PEND_SAVE / PEND_LOAD */
  uint64_t deadline_ns; /* UINT64_MAX: none */
  oi_ticket *ticket;    /* producer reference, or NULL */
  oi_save_done_fn on_done;
  void *on_done_ctx;
  counts_wait *counts; /* PEND_SAVE: the submitter's, while it waits (see counts_wait) */
  oi_status result;    /* handed to the reader (see `handed`): how it ends */
  uint32_t n_blocks;   /* for the logs */
  /* PEND_LOAD: its deadline passed (`late`) or its connection ended while
   * the server may still copy into its destination: the ticket is fencing
   * (OI_FENCING, `fenced`) and completes when the server answers or is gone
   * (the load fence), with OI_ERR_DEADLINE if it was late. */
  bool fenced, late;
  int server_pid; /* an orphan (its connection ended unanswered): the server it waits on */
} pending;

typedef struct remote_engine {
  oi_offload_engine base;
  char *socket_path;
  int fd;
  uint64_t server_epoch;
  uint64_t server_caps; /* HelloReply.capabilities */
  uint32_t control_ms;

  pthread_mutex_t lock; /* pending table and connection state */
  pthread_cond_t cv;    /* a call completed, or the connection ended */
  pending *buckets[PENDING_BUCKETS];
  pending *head, *tail;
  uint64_t next_id;
  conn_state state;
  char conn_msg[640];    /* why the connection ended */
  oi_status conn_status; /* the server's reason, when it closed the session itself */

  pthread_mutex_t write_lock; /* one frame at a time */

  pthread_t reader;
  bool reader_started;
  uint8_t *frame; /* the reconnect's handshake (reader thread) */
  size_t frame_cap;
  /* The read side: whoever holds it (`reading`) reads and decodes frames
   * with these. Under `lock`: */
  bool reading;        /* the read side is held... */
  bool reading_caller; /* ...by a calling thread (the leader), not the reader */
  uint32_t waiting;    /* threads waiting on cv for the read side to be released */
  uint32_t n_async;    /* asynchronous records in the table */
  bool read_failed;    /* a leader met the connection's end: the reader takes over */
  char read_why[256];  /* ...and why */
  bool watching;       /* the reader polls for the end of the stream, not for data */
  bool kicked;         /* a wake of the reader (kick_fd) is pending */
  pending *handed;     /* asynchronous replies a leader read: the reader completes them */
  pending **handed_tail;
  int kick_fd;           /* eventfd in the reader's poll */
  oi_wire_reader rd;     /* the connection's buffered read side (its holder's) */
  oi_wire_arrays arrays; /* (the holder's, and the reconnect's) */
  oiwire_Envelope env;

  pthread_mutex_t teardown_lock;
  bool destroy_requested, arena_open;
  oi_imported_arena *arena;

  /* Engine-owned memory (set at connect, then read-only): */
  bool owned;
  int owned_fd;                 /* cpu: our duplicate of arena_fd; -1 otherwise */
  oi_arena_handle owned_handle; /* cuda: the allocation's IPC handle... */
  uint64_t owned_offset;        /* ...and the arena's offset in it */
  uint64_t arena_size;
  oi_arena_desc *reg_arenas;     /* the layout by offsets, to register again */
  uint64_t *reg_segment_offsets; /* and its segment offsets (NULL: none) */
  uint32_t n_reg_segment_offsets;
  char **reg_names;
  /* Under `lock` (and `write_lock` too where the connection changes): */
  uint64_t gen;      /* connection generation, bumped at each reconnect */
  bool stop;         /* teardown: the reader stops reconnecting */
  int connecting_fd; /* the reader's reconnect attempt (teardown shuts it) */
  uint32_t reconnects;
  atomic_uint_fast64_t disconnected_saves, disconnected_misses;
  /* The load fence. Under `lock`: */
  int server_pid;   /* the server of this connection (SO_PEERCRED; 0: unknown) */
  pending *orphans; /* loads whose connection ended unanswered: they complete when
                       their server is gone (a list through `next`) */
  /* The caller's view of its loads (oi_engine_stats): */
  atomic_uint_fast64_t loads_completed, loads_failed;
  /* The circuit breaker (docs/api.md): open while the server is marked
   * unresponsive. `unresponsive` is read without the lock by the calls'
   * fast path; set and cleared under `lock`. */
  uint32_t lookup_ms, probe_ms;
  atomic_bool unresponsive;
  uint64_t probe_id;      /* the probe in flight (0: none), under `lock` */
  bool unregistered;      /* teardown: the server answered the unregister (its copies ended) */
  uint64_t next_probe_ns; /* when the reader sends the next one */
} remote_engine;

static const engine_ops remote_ops;

/* ---- the pending table (lock held) ----------------------------------------------- */

static void pending_insert_locked(remote_engine *e, pending *p) {
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

static void pending_unlink_locked(remote_engine *e, pending *p) {
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
static void counts_abandon_locked(remote_engine *e, pending *p) {
  if (!p->counts) return;
  p->counts->done = true;
  p->counts = NULL;
  pthread_cond_broadcast(&e->cv);
}

static pending *pending_take_locked(remote_engine *e, uint64_t id) {
  for (pending *p = e->buckets[id % PENDING_BUCKETS]; p; p = p->hnext)
    if (p->id == id) {
      pending_unlink_locked(e, p);
      counts_abandon_locked(e, p);
      return p;
    }
  return NULL;
}

/* Completes an asynchronous operation (lock not held) and frees it. A
 * fenced load ends with OI_ERR_DEADLINE whatever the server answered. */
static void finish_async(remote_engine *e, pending *p, oi_status st) {
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
static void kick_locked(remote_engine *e) {
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
static void release_read_side_locked(remote_engine *e) {
  e->reading = false;
  e->reading_caller = false;
  if (e->read_failed || e->handed || (e->n_async && e->watching)) kick_locked(e);
  if (e->waiting) pthread_cond_broadcast(&e->cv);
}

/* Completes the asynchronous operations a leader handed over (reader
 * thread, lock not held), in the order their replies arrived. */
static void finish_handed(remote_engine *e) {
  pthread_mutex_lock(&e->lock);
  pending *list = e->handed;
  e->handed = NULL;
  e->handed_tail = &e->handed;
  pthread_mutex_unlock(&e->lock);
  for (pending *p = list, *next; p; p = next) {
    next = p->next;
    finish_async(e, p, p->result);
  }
}

/* The connection's locks, its condition variable and its read side. */
static void init_sync(remote_engine *e) {
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

static uint32_t instance_of(remote_engine *e) {
  pthread_mutex_lock(&e->lock);
  uint32_t id = e->base.instance_id;
  pthread_mutex_unlock(&e->lock);
  return id;
}

/* Engine-owned and without a server now (the reader is reconnecting). */
static bool degraded(remote_engine *e) {
  if (!e->owned) return false;
  pthread_mutex_lock(&e->lock);
  bool d = e->state == CONN_DEGRADED;
  pthread_mutex_unlock(&e->lock);
  return d;
}

static oi_status closed_error(remote_engine *e, const char *what) {
  char why[sizeof e->conn_msg];
  pthread_mutex_lock(&e->lock);
  snprintf(why, sizeof why, "%s", e->conn_msg[0] ? e->conn_msg : "closed");
  bool reconnecting = e->state == CONN_DEGRADED;
  pthread_mutex_unlock(&e->lock);
  return oi__fail(OI_ERR_CLOSED, "%s: the connection to the openinfer server is closed (%s)%s",
                  what, why, reconnecting ? "; reconnecting in the background" : "");
}

static struct timespec abs_timespec(uint64_t deadline_ns) {
  return (struct timespec){.tv_sec = (time_t)(deadline_ns / 1000000000ull),
                           .tv_nsec = (long)(deadline_ns % 1000000000ull)};
}

/* ---- the circuit breaker ------------------------------------------------------------
 * A deadline miss (a call without a reply in time, an asynchronous operation
 * past its deadline) opens it at once: queries miss, saves drop, loads are
 * refused, flush returns, all without a round trip, until the server answers
 * a probe (the reader sends one every probe_ms). A dead connection is the
 * watchdog's (fatal, or degrade and reconnect). */

static bool breaker_open(remote_engine *e) {
  return atomic_load_explicit(&e->unresponsive, memory_order_acquire);
}

/* `op` (what failed, e.g. "query of 12 hashes") missed its deadline (`why`):
 * the server is marked unresponsive. Logged once per opening. */
static void trip(remote_engine *e, const char *op, const char *why) {
  pthread_mutex_lock(&e->lock);
  bool armed = (e->state == CONN_LIVE || e->state == CONN_RETIRED) && !e->stop;
  bool first = armed && !atomic_load(&e->unresponsive);
  if (first) {
    atomic_store(&e->unresponsive, true);
    e->next_probe_ns = 0; /* the first probe goes at once */
    kick_locked(e);
  }
  uint32_t instance = e->base.instance_id; /* (a reconnect changes it) */
  pthread_mutex_unlock(&e->lock);
  if (first)
    OI_LOG_I(OI_LOG_WARN, "engine", instance,
             "%s: %s: the openinfer server at %s is marked unresponsive; queries miss, saves "
             "drop and loads are refused until it answers a probe (every %u ms)",
             op, why, e->socket_path, e->probe_ms);
}

static oi_status unresponsive_error(remote_engine *e, const char *what) {
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
static oi_status send_pending(remote_engine *e, oiwire_Envelope *env, const oi_wire_out *out,
                              pending *p, const char *what, bool *taken, uint64_t *id_out) {
  *taken = false;
  pthread_mutex_lock(&e->lock);
  if (e->state == CONN_DEAD || e->state == CONN_DEGRADED) {
    pthread_mutex_unlock(&e->lock);
    return closed_error(e, what);
  }
  pending_insert_locked(e, p);
  /* A reader that only watches the stream must read this one's reply
   * (unless a leader holds the read side: it wakes the reader as it lets go). */
  if (p->kind != PEND_CALL && e->watching && !e->reading) kick_locked(e);
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
    *taken = pending_take_locked(e, id) == NULL;
    pthread_mutex_unlock(&e->lock);
    return oi__fail(st, "%s: %s", what, msg);
  }
  return OI_OK;
}

static oi_status serve_frames(remote_engine *e, bool on_reader);

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
    oi_status st = serve_frames(e, false);
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
  release_read_side_locked(e);
  return in_time;
}

/* Sends `env` and waits up to timeout_ms (UINT32_MAX: for as long as the
 * connection lives) for its reply, which lands in p->reply. A Result with an
 * error becomes this call's status and message. While no other thread
 * reads the connection, the caller reads its reply itself (lead). */
static oi_status call(remote_engine *e, oiwire_Envelope *env, const oi_wire_out *out, pending *p,
                      uint32_t timeout_ms, const char *what) {
  p->kind = PEND_CALL;
  p->done = false;
  bool taken;
  uint64_t id;
  oi_status st = send_pending(e, env, out, p, what, &taken, &id);
  if (st != OI_OK) return st;
  uint64_t deadline = oi__deadline_ns(timeout_ms);
  struct timespec ts = abs_timespec(deadline);
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
      pending_take_locked(e, id); /* still ours (not done): a late reply is dropped */
      pthread_mutex_unlock(&e->lock);
      char why[64];
      snprintf(why, sizeof why, "no reply within %u ms", timeout_ms);
      trip(e, what, why);
      return oi__fail(OI_ERR_TIMEOUT, "%s: no reply from the openinfer server within %u ms", what,
                      timeout_ms);
    }
  }
  pthread_mutex_unlock(&e->lock);
  if (p->status != OI_OK) return oi__fail(p->status, "%s", p->message);
  return OI_OK;
}

static oi_status unexpected_reply(const pending *p, const char *what) {
  return oi__fail(OI_ERR_PROTOCOL, "%s: the server answered with message type %u", what,
                  p->reply.which_body);
}

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
        counts_abandon_locked(e, q);
        break;
      }
    pthread_mutex_unlock(&e->lock);
    return;
  }
  pending *p = pending_take_locked(e, env->request_id);
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
    finish_async(e, p, st);
    return;
  }
  p->result = st;
  p->next = NULL;
  pthread_mutex_lock(&e->lock);
  *e->handed_tail = p;
  e->handed_tail = &p->next;
  kick_locked(e);
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
      trip(e, op, why);
      continue;
    }
    pending_unlink_locked(e, p);
    counts_abandon_locked(e, p);
    pthread_mutex_unlock(&e->lock);
    OI_LOG_I(OI_LOG_WARN, "engine", e->base.instance_id,
             "save request %llu: no reply before its deadline", (unsigned long long)p->id);
    trip(e, op, why);
    finish_async(e, p, OI_ERR_TIMEOUT);
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
    finish_async(e, p, OI_ERR_CLOSED);
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
  if (!breaker_open(e)) return;
  pthread_mutex_lock(&e->lock);
  bool due = atomic_load(&e->unresponsive) && now >= e->next_probe_ns && !e->stop &&
             (e->state == CONN_LIVE || e->state == CONN_RETIRED);
  pending *stale = NULL;
  if (due) {
    if (e->probe_id) stale = pending_take_locked(e, e->probe_id);
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
  pending_insert_locked(e, p);
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
    oi__free(pending_take_locked(e, id)); /* (NULL if the connection's end took it) */
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
    counts_abandon_locked(e, p);
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
    finish_async(e, p, OI_ERR_CLOSED);
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

static oi_status reconnect(remote_engine *e);

/* Serves every whole frame buffered on the read side (its holder only).
 * @return OI_OK when it needs more bytes; an error (with its message) when
 * the stream is not a frame or not an Envelope: the connection is unusable. */
static oi_status serve_frames(remote_engine *e, bool on_reader) {
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
    finish_handed(e);
    pthread_mutex_lock(&e->lock);
    e->kicked = false;
    if (e->read_failed) { /* a leader met the end: take over */
      reader_take_locked(e);
      e->read_failed = false;
      snprintf(why, cap, "%s", e->read_why);
      pthread_mutex_unlock(&e->lock);
      finish_handed(e);
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
    if (breaker_open(e)) { /* wake for the next probe */
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
      struct timespec ts = abs_timespec(until);
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
    if (st == OI_OK) st = serve_frames(e, true);
    if (st != OI_OK && st != OI_PENDING) {
      snprintf(why, cap, "%s", oi_last_error());
      return; /* (holding the read side) */
    }
    pthread_mutex_lock(&e->lock);
    release_read_side_locked(e);
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
      struct timespec ts = abs_timespec(OI_MIN(deadline, now + 250000000ull));
      pthread_mutex_lock(&e->lock);
      while (!e->stop && pthread_cond_timedwait(&e->cv, &e->lock, &ts) != ETIMEDOUT) {
      }
      stop = e->stop;
      pthread_mutex_unlock(&e->lock);
      sweep_orphans(e, oi__now_ns());
    }
    if (stop) return false;
    attempts++;
    oi_status st = reconnect(e);
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

static void *reader_main(void *arg) {
  remote_engine *e = arg;
  char why[256];
  for (;;) {
    why[0] = '\0';
    read_connection(e, why, sizeof why); /* (returns holding the read side) */
    pthread_mutex_lock(&e->lock);
    e->read_failed = false; /* (handled here, whoever met the end first) */
    pthread_mutex_unlock(&e->lock);
    finish_handed(e); /* replies that came before the end complete first */
    if (!connection_lost(e, why)) {
      /* No reconnect: the loads of the lost connection still wait for
       * their server's end (or teardown: free_engine settles them). */
      while (have_orphans(e)) {
        struct timespec ts = abs_timespec(oi__deadline_ns(250));
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
    release_read_side_locked(e);
    pthread_mutex_unlock(&e->lock);
  }
}

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
  oi_status st = send_pending(e, env, out, p, what, &taken, &id);
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

static oi_status remote_save(oi_offload_engine *base, const int64_t *ids,
                             const oi_block_hash *hashes, size_t n, const oi_save_options *opt,
                             oi_ticket **ticket_out) {
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
  if (breaker_open(e) || degraded(e)) return drop_save(e, n, opt, ticket_out);
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
  struct timespec ts = abs_timespec(deadline);
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
    trip(e, op, why);
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
  oi_offload_engine *base = &e->base;
  oi_status st = check_count("load", n);
  if (st != OI_OK) return st;
  oiwire_Envelope env;
  memset(&env, 0, sizeof env);
  env.which_body = oiwire_Envelope_load_tag;
  env.body.load.lease.size = OI_WIRE_LEASE_BYTES;
  memcpy(env.body.load.lease.bytes, lease.bytes, OI_WIRE_LEASE_BYTES);
  oi_wire_out out = {.ids = ids, .n_ids = n};
  if (breaker_open(e)) return unresponsive_error(e, "load");
  if (degraded(e))
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
 * here, or (finish_async) completed with an error. */
static oi_status remote_load(oi_offload_engine *base, oi_lease lease, const int64_t *ids, size_t n,
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
  oi_clear_error();
  return oi__struct_out(out, &r, sizeof r, "query");
}

/* A Query: of the engine's instance, or (instance 0) a lookup of
 * `namespace_id` with `world_size` consumers. */
static oi_status query_call(remote_engine *e, uint32_t instance, const char *namespace_id,
                            uint32_t world_size, const char *req_id, const oi_block_hash *hashes,
                            size_t n, uint32_t flags, uint8_t *present, uint32_t wait_ms,
                            oi_query_result *out) {
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
  if (breaker_open(e) || degraded(e)) return query_miss(e, n, flags, present, out);
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
  if ((st = call(e, &env, &wo, &p, limit >= UINT32_MAX ? UINT32_MAX - 1 : (uint32_t)limit, what)) !=
      OI_OK) {
    /* (No reply in time: this one says so; the breaker opened, the next miss.) */
    if (st == OI_ERR_CLOSED && e->owned) return query_miss(e, n, flags, present, out);
    return st;
  }
  if (p.reply.which_body != oiwire_Envelope_query_reply_tag) return unexpected_reply(&p, "query");
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
  return oi__struct_out(out, &r, sizeof r, "query");
}

static oi_status remote_query(oi_offload_engine *base, const char *req_id,
                              const oi_block_hash *hashes, size_t n, uint32_t flags,
                              uint8_t *present, uint32_t wait_ms, oi_query_result *out) {
  return query_call((remote_engine *)base, base->instance_id, NULL, 0, req_id, hashes, n, flags,
                    present, wait_ms, out);
}

static oi_status release_call(remote_engine *e, uint32_t instance, const char *namespace_id,
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
  if (breaker_open(e)) return unresponsive_error(e, "release");
  oi_status st = degraded(e) ? OI_ERR_CLOSED : call(e, &env, NULL, &p, e->control_ms, "release");
  if (st == OI_ERR_CLOSED && e->owned)
    return oi__fail(OI_ERR_LEASE_EXPIRED,
                    "release: the server that issued this lease went away (its leases went "
                    "with it)");
  return st;
}

static oi_status remote_release(oi_offload_engine *base, oi_lease lease) {
  return release_call((remote_engine *)base, base->instance_id, NULL, lease);
}

static oi_status remote_flush(oi_offload_engine *base, uint32_t timeout_ms) {
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
  if (degraded(e)) return OI_OK; /* every save was completed when the server went away */
  if (breaker_open(e))           /* at once: saves in flight end at their deadline */
    return oi__fail(OI_ERR_TIMEOUT,
                    "flush: the openinfer server at %s is unresponsive (probed every %u ms): saves "
                    "in flight end at their deadline",
                    e->socket_path, e->probe_ms);
  oi_status st = call(e, &env, NULL, &p, wait >= UINT32_MAX ? UINT32_MAX : (uint32_t)wait, "flush");
  if (st == OI_ERR_CLOSED && e->owned) {
    oi_clear_error();
    return OI_OK;
  }
  return st;
}

static oi_status remote_stats(const oi_offload_engine *cbase, oi_engine_stats *out) {
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
  bool unanswered = breaker_open(e);
  oi_status st = unanswered || degraded(e) ? OI_ERR_CLOSED
                                           : call(e, &env, NULL, &p, e->control_ms, "engine_stats");
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
    return oi__struct_out(out, &s, sizeof s, "engine_stats");
  }
  if (st != OI_OK) return st;
  if (p.reply.which_body != oiwire_Envelope_stats_reply_tag)
    return unexpected_reply(&p, "engine_stats");
  const oiwire_StatsReply *r = &p.reply.body.stats_reply;
  s.instance_id = r->instance_id;
  s.block_bytes = r->block_bytes;
  s.num_blocks = r->num_blocks;
  s.saves_submitted = r->saves_submitted;
  s.saves_completed = r->saves_completed;
  s.saves_deduplicated = r->saves_deduplicated;
  s.saves_dropped = r->saves_dropped;
  s.saves_failed = r->saves_failed;
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
  return oi__struct_out(out, &s, sizeof s, "engine_stats");
}

/* ---- lifecycle ------------------------------------------------------------------------- */

static oi_status send_unregister(remote_engine *e) {
  oiwire_Envelope env;
  memset(&env, 0, sizeof env);
  env.which_body = oiwire_Envelope_unregister_tag;
  pending p;
  memset(&p, 0, sizeof p);
  return call(e, &env, NULL, &p, e->control_ms, "unregister");
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
      finish_async(e, p, OI_ERR_CLOSED);
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
static void free_engine(remote_engine *e) {
  if (e->reader_started) {
    pthread_mutex_lock(&e->lock);
    bool dead = e->state == CONN_DEAD;
    e->stop = true; /* a degraded engine's reader stops reconnecting */
    if (e->connecting_fd >= 0) shutdown(e->connecting_fd, SHUT_RDWR);
    kick_locked(e);
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
    if (breaker_open(e))
      OI_LOG_I(OI_LOG_WARN, "engine", id,
               "destroy: the server is unresponsive: not unregistered (the server frees the arena "
               "when the session closes)");
    else if (send_unregister(e) != OI_OK)
      OI_LOG_I(OI_LOG_WARN, "engine", id,
               "destroy: %s (the server frees the arena when the "
               "session closes)",
               oi_last_error());
    else
      e->unregistered = true; /* (its engine drained its copies before the answer) */
  }
  OI_LOG_I(OI_LOG_INFO, "engine", id, "disconnected from %s", e->socket_path);
  free_engine(e);
}

static void on_arena_closed(void *ctx) {
  remote_engine *e = ctx;
  pthread_mutex_lock(&e->teardown_lock);
  e->arena_open = false;
  e->arena = NULL;
  bool go = e->destroy_requested;
  pthread_mutex_unlock(&e->teardown_lock);
  if (go) teardown(e);
}

static void remote_destroy(oi_offload_engine *base) {
  remote_engine *e = (remote_engine *)base;
  pthread_mutex_lock(&e->teardown_lock);
  e->destroy_requested = true;
  bool go = !e->arena_open;
  pthread_mutex_unlock(&e->teardown_lock);
  if (go) {
    teardown(e);
    return;
  }
  OI_LOG_I(OI_LOG_WARN, "engine", instance_of(e),
           "destroyed while its imported arena is still open: the engine is finished "
           "(flush, unregister) when oi_imported_arena_close closes the mapping");
}

static const engine_ops remote_ops = {
    .save = remote_save,
    .query = remote_query,
    .load = remote_load,
    .release = remote_release,
    .flush = remote_flush,
    .stats = remote_stats,
    .destroy = remote_destroy,
};

/* Bytes from offset 0 to the end of the farthest arena; false on overflow. */
static bool layout_extent(const oi_engine_options *o, uint64_t *out) {
  uint64_t end = 0, k = 0; /* k: the arena's first segment offset */
  for (uint32_t i = 0; i < o->num_arenas; i++) {
    const oi_arena_desc *a = &o->arenas[i];
    uint64_t span = 0, seg = 0, last = 0;
    if (o->segment_offsets && a->segments) {
      /* Separate regions: the farthest segment start (a count that does not
       * match is refused by the layout checks that follow). */
      for (uint32_t s = 0; s < a->segments && k + s < o->num_segment_offsets; s++)
        seg = OI_MAX(seg, o->segment_offsets[k + s]);
      k += a->segments;
    }
    if (a->num_blocks && a->segments) {
      if (__builtin_mul_overflow(a->num_blocks - 1, a->block_stride, &last) ||
          (!o->segment_offsets &&
           __builtin_mul_overflow((uint64_t)(a->segments - 1), a->segment_stride, &seg)) ||
          __builtin_add_overflow(last, seg, &span) ||
          __builtin_add_overflow(span, a->bytes_per_block, &span))
        return false;
    }
    uint64_t a_end;
    if (__builtin_add_overflow(a->offset, span, &a_end)) return false;
    if (a_end > end) end = a_end;
  }
  *out = end;
  return true;
}

static void fill_hello(remote_engine *e, oiwire_Envelope *env) {
  memset(env, 0, sizeof *env);
  env->which_body = oiwire_Envelope_hello_tag;
  env->body.hello.protocol_version = OI_WIRE_PROTOCOL_VERSION;
  env->body.hello.capabilities =
      OI_WIRE_CAP_PIPELINED | OI_WIRE_CAP_MEMBERSHIP | (e->owned ? OI_WIRE_CAP_OWNED_ARENA : 0);
  snprintf(env->body.hello.client_name, sizeof env->body.hello.client_name, "%s (pid %d)",
           e->base.instance_name[0] ? e->base.instance_name : "engine", (int)getpid());
}

static oi_status check_hello_reply(remote_engine *e, const oiwire_Envelope *r, const char *what) {
  if (r->which_body != oiwire_Envelope_hello_reply_tag)
    return oi__fail(OI_ERR_PROTOCOL, "%s: the server answered with message type %u", what,
                    r->which_body);
  if (r->body.hello_reply.protocol_version != OI_WIRE_PROTOCOL_VERSION)
    return oi__fail(OI_ERR_VERSION, "%s: the server speaks protocol %u, this library %u", what,
                    r->body.hello_reply.protocol_version, OI_WIRE_PROTOCOL_VERSION);
  if (e->owned && !(r->body.hello_reply.capabilities & OI_WIRE_CAP_OWNED_ARENA))
    return oi__fail(OI_ERR_UNSUPPORTED,
                    "%s: the server does not take engine-owned memory (an older version): "
                    "connect with arena_base NULL",
                    what);
  return OI_OK;
}

static oi_status hello(remote_engine *e) {
  oiwire_Envelope env;
  fill_hello(e, &env);
  pending p;
  memset(&p, 0, sizeof p);
  oi_status st = call(e, &env, NULL, &p, e->control_ms, "connect: hello");
  if (st != OI_OK) return st;
  if ((st = check_hello_reply(e, &p.reply, "connect: hello")) != OI_OK) return st;
  pthread_mutex_lock(&e->lock);
  e->server_epoch = p.reply.body.hello_reply.server_epoch;
  e->server_caps = p.reply.body.hello_reply.capabilities;
  pthread_mutex_unlock(&e->lock);
  return OI_OK;
}

/* The Register request (the same at connect and at every reconnect). */
static void fill_register(remote_engine *e, oiwire_Envelope *env, oi_wire_out *out) {
  memset(env, 0, sizeof *env);
  env->which_body = oiwire_Envelope_register_instance_tag;
  oiwire_Register *r = &env->body.register_instance;
  snprintf(r->namespace_id, sizeof r->namespace_id, "%s", e->base.namespace_id);
  snprintf(r->instance_name, sizeof r->instance_name, "%s", e->base.instance_name);
  r->device = e->base.opts.device;
  r->world_size = e->base.opts.world_size;
  r->arena_size = e->arena_size;
  r->copy_mode = e->base.opts.copy_mode;
  r->copy_cta_limit = e->base.opts.copy_cta_limit;
  if (e->owned) {
    r->client_owned = true;
    if (e->owned_fd < 0) { /* cuda: the IPC handle; cpu: the fd rides with the frame */
      r->client_handle.size = OI_WIRE_HANDLE_BYTES;
      memcpy(r->client_handle.bytes, e->owned_handle.bytes, OI_WIRE_HANDLE_BYTES);
      r->client_offset = e->owned_offset;
    }
  }
  memset(out, 0, sizeof *out);
  out->arenas = e->reg_arenas;
  out->n_arenas = e->base.opts.num_arenas;
  out->segment_offsets = e->reg_segment_offsets;
  out->n_segment_offsets = e->reg_segment_offsets ? e->n_reg_segment_offsets : 0;
}

static oi_status check_register_reply(remote_engine *e, const oiwire_RegisterReply *rr,
                                      const char *what) {
  uint32_t want = e->owned ? 0 : OI_WIRE_HANDLE_BYTES;
  if (rr->instance_id == 0 || rr->arena_handle.size != want)
    return oi__fail(OI_ERR_PROTOCOL, "%s: register reply has instance %u and a %u-byte handle",
                    what, rr->instance_id, (unsigned)rr->arena_handle.size);
  if (rr->arena_bytes < e->arena_size)
    return oi__fail(OI_ERR_PROTOCOL, "%s: the server %s %llu bytes, %llu asked for", what,
                    e->owned ? "mapped" : "allocated", (unsigned long long)rr->arena_bytes,
                    (unsigned long long)e->arena_size);
  return OI_OK;
}

static oi_status register_layout(remote_engine *e, oi_arena_handle *handle) {
  oiwire_Envelope env;
  oi_wire_out out;
  fill_register(e, &env, &out);
  pending p;
  memset(&p, 0, sizeof p);
  oi_status st = call(e, &env, &out, &p, e->control_ms, "connect: register");
  if (st != OI_OK) return st;
  if (p.reply.which_body != oiwire_Envelope_register_reply_tag)
    return unexpected_reply(&p, "connect: register");
  const oiwire_RegisterReply *rr = &p.reply.body.register_reply;
  if (rr->instance_id) {
    pthread_mutex_lock(&e->lock);
    e->base.instance_id = rr->instance_id;
    pthread_mutex_unlock(&e->lock);
  }
  if ((st = check_register_reply(e, rr, "connect")) != OI_OK) return st;
  if (!e->owned) memcpy(handle->bytes, rr->arena_handle.bytes, OI_WIRE_HANDLE_BYTES);
  return OI_OK;
}

/* ---- reconnecting (engine-owned memory) ---------------------------------------------- */

/* One request and its reply on a connection the reader has not installed
 * yet (reader thread only: it uses the reader's buffers). */
static oi_status sync_call(remote_engine *e, int fd, oiwire_Envelope *env, const oi_wire_out *out,
                           const char *what) {
  uint8_t *frame;
  size_t len;
  oi_status st = oi__wire_encode(env, out, &frame, &len);
  if (st != OI_OK) return st;
  if (env->which_body == oiwire_Envelope_register_instance_tag && e->owned_fd >= 0)
    st = oi__wire_send_fd(fd, frame, len, e->owned_fd);
  else
    st = oi__wire_send(fd, frame, len);
  oi__free(frame);
  if (st != OI_OK) return st;
  uint64_t deadline = oi__deadline_ns(e->control_ms);
  for (;;) {
    uint64_t now = oi__now_ns();
    if (now >= deadline)
      return oi__fail(OI_ERR_TIMEOUT, "%s: no reply within %u ms", what, e->control_ms);
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    int rc = poll(&pfd, 1, (int)OI_MIN((deadline - now) / 1000000u + 1, 1000u));
    if (rc < 0 && errno != EINTR) return oi__fail(OI_ERR_IO, "%s: poll: %s", what, strerror(errno));
    if (rc <= 0) continue;
    if ((st = oi__wire_recv(fd, OI_WIRE_MAX_FRAME, &e->frame, &e->frame_cap, &len)) != OI_OK ||
        (st = oi__wire_decode(e->frame, len, &e->env, &e->arrays)) != OI_OK) {
      char msg[256];
      snprintf(msg, sizeof msg, "%s", oi_last_error());
      return oi__fail(st, "%s: %s", what, msg);
    }
    bool mine = e->env.request_id == env->request_id;
    if (e->env.which_body == oiwire_Envelope_result_tag && (mine || e->env.request_id == 0)) {
      oi_status rs = e->env.body.result.status;
      if (rs != OI_OK)
        return oi__fail(rs < 0 ? rs : OI_ERR_PROTOCOL, "%s: %s", what, e->env.body.result.message);
    }
    if (mine) return OI_OK;
  }
}

/* Connects, says Hello and registers the layout and memory again; on
 * success installs the new connection (a new generation). Reader thread. */
static oi_status reconnect(remote_engine *e) {
  int fd = -1;
  oi_status st = oi__wire_connect(e->socket_path, &fd);
  if (st != OI_OK) return st;
  pthread_mutex_lock(&e->lock);
  bool stop = e->stop;
  if (!stop) e->connecting_fd = fd;
  pthread_mutex_unlock(&e->lock);
  if (stop) {
    close(fd);
    return oi__fail(OI_ERR_CLOSED, "reconnect: the engine is being destroyed");
  }
  oiwire_Envelope env;
  oi_wire_out out;
  uint64_t epoch = 0;
  uint32_t id = 0;
  fill_hello(e, &env);
  env.request_id = 1;
  if ((st = sync_call(e, fd, &env, NULL, "reconnect: hello")) != OI_OK) goto fail;
  if ((st = check_hello_reply(e, &e->env, "reconnect: hello")) != OI_OK) goto fail;
  epoch = e->env.body.hello_reply.server_epoch;
  uint64_t caps = e->env.body.hello_reply.capabilities;
  fill_register(e, &env, &out);
  env.request_id = 2;
  if ((st = sync_call(e, fd, &env, &out, "reconnect: register")) != OI_OK) goto fail;
  if (e->env.which_body != oiwire_Envelope_register_reply_tag) {
    st = oi__fail(OI_ERR_PROTOCOL, "reconnect: register: the server answered with message type %u",
                  e->env.which_body);
    goto fail;
  }
  if ((st = check_register_reply(e, &e->env.body.register_reply, "reconnect")) != OI_OK) goto fail;
  id = e->env.body.register_reply.instance_id;

  pthread_mutex_lock(&e->write_lock);
  pthread_mutex_lock(&e->lock);
  e->connecting_fd = -1;
  if (e->stop) {
    pthread_mutex_unlock(&e->lock);
    pthread_mutex_unlock(&e->write_lock);
    close(fd); /* the server cleans the instance up with the session */
    return oi__fail(OI_ERR_CLOSED, "reconnect: the engine is being destroyed");
  }
  int old_fd = e->fd;
  uint64_t old_epoch = e->server_epoch;
  uint32_t old_id = e->base.instance_id;
  e->fd = fd;
  e->gen++;
  e->base.instance_id = id;
  e->server_epoch = epoch;
  e->server_caps = caps;
  e->server_pid = oi__wire_peer_pid(fd);
  atomic_store(&e->unresponsive, false); /* a server that registered us answers */
  e->probe_id = 0;
  e->state = CONN_LIVE;
  e->conn_msg[0] = '\0';
  e->conn_status = 0;
  uint32_t n = ++e->reconnects;
  pthread_mutex_unlock(&e->lock);
  pthread_mutex_unlock(&e->write_lock);
  close(old_fd);
  OI_LOG_I(OI_LOG_WARN, "engine", id,
           "reconnected to %s: epoch %016llx (was %016llx), instance %u (was %u), reconnect %u; "
           "the layout and memory are registered again, leases of the old epoch are invalid",
           e->socket_path, (unsigned long long)epoch, (unsigned long long)old_epoch, id, old_id, n);
  return OI_OK;

fail:
  pthread_mutex_lock(&e->lock);
  e->connecting_fd = -1;
  pthread_mutex_unlock(&e->lock);
  close(fd);
  return st;
}

/* ---- connect ------------------------------------------------------------------------- */

/* Engine-owned memory: what travels to the server (cpu: a duplicate of the
 * memfd; cuda: the allocation's IPC handle and the arena's offset in it). */
static oi_status prepare_owned(remote_engine *e, const oi_engine_options *o) {
  if (o->device == OI_DEVICE_CPU) {
    if (o->arena_fd < 0)
      return oi__fail(OI_ERR_INVALID_ARGUMENT,
                      "connect: engine-owned cpu memory (arena_base set) needs arena_fd, a memfd "
                      "sealed with F_SEAL_SHRINK that arena_base maps");
    oi_status st = oi__fd_arena_check(o->arena_fd, e->arena_size, "connect");
    if (st == OI_OK)
      st = oi__fd_arena_check_mapping(o->arena_fd, o->arena_base, e->arena_size, "connect");
    if (st != OI_OK) return st;
    e->owned_fd = fcntl(o->arena_fd, F_DUPFD_CLOEXEC, 0);
    if (e->owned_fd < 0) return oi__fail(OI_ERR_IO, "connect: dup(arena_fd): %s", strerror(errno));
    return OI_OK;
  }
  if (o->arena_fd != -1)
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "connect: arena_fd is for cpu memory; device %d's memory is exported with "
                    "CUDA IPC (arena_fd must be -1)",
                    o->device);
  oi_dev *dev = NULL;
  oi_status st = oi__dev_open(o->device, &dev);
  if (st != OI_OK) return st;
  st = dev->ops->mem_export_range(dev, o->arena_base, e->arena_size, &e->owned_handle,
                                  &e->owned_offset);
  oi__dev_close(dev);
  if (st != OI_OK) {
    char msg[384];
    snprintf(msg, sizeof msg, "%s", oi_last_error());
    return oi__fail(st, "connect: %s", msg);
  }
  return OI_OK;
}

/* A copy of the layout by offsets, to register it again after a reconnect. */
static oi_status keep_layout(remote_engine *e, const oi_engine_options *o) {
  e->reg_arenas = oi__calloc(o->num_arenas ? o->num_arenas : 1, sizeof *e->reg_arenas);
  e->reg_names = oi__calloc(o->num_arenas ? o->num_arenas : 1, sizeof *e->reg_names);
  if (!e->reg_arenas || !e->reg_names)
    return oi__fail(OI_ERR_OUT_OF_MEMORY, "connect: out of memory");
  for (uint32_t i = 0; i < o->num_arenas; i++) {
    e->reg_arenas[i] = o->arenas[i];
    if (o->arenas[i].name && !(e->reg_names[i] = oi__strdup(o->arenas[i].name)))
      return oi__fail(OI_ERR_OUT_OF_MEMORY, "connect: out of memory");
    e->reg_arenas[i].name = e->reg_names[i];
  }
  if (o->segment_offsets && o->num_segment_offsets) {
    e->reg_segment_offsets = oi__calloc(o->num_segment_offsets, sizeof(uint64_t));
    if (!e->reg_segment_offsets) return oi__fail(OI_ERR_OUT_OF_MEMORY, "connect: out of memory");
    memcpy(e->reg_segment_offsets, o->segment_offsets, o->num_segment_offsets * sizeof(uint64_t));
    e->n_reg_segment_offsets = o->num_segment_offsets;
  }
  return OI_OK;
}

oi_status oi__remote_engine_connect(const char *socket_path, const oi_engine_options *o,
                                    oi_offload_engine **out, oi_imported_arena **arena_out) {
  oi_engine_options opts;
  oi_engine_options_init(&opts);
  oi_status st = oi__struct_in(&opts, sizeof opts, o, "connect");
  if (st != OI_OK) return st;
  bool owned = opts.arena_base != NULL;
  if (!owned && !arena_out)
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "connect: arena_out is NULL (the server allocates the arena; it is optional "
                    "only with engine-owned memory, arena_base set)");
  if (!owned && opts.arena_fd != -1)
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "connect: arena_fd %d without arena_base (engine-owned cpu memory is "
                    "arena_base, mapped from arena_fd)",
                    opts.arena_fd);
  if (opts.num_arenas && !opts.arenas)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "connect: layout has no arenas");
  if (opts.num_arenas > OI_WIRE_MAX_ARENAS)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "connect: %u arenas (at most %u)", opts.num_arenas,
                    OI_WIRE_MAX_ARENAS);
  for (uint32_t i = 0; i < opts.num_arenas; i++) {
    if (opts.arenas[i].base)
      return oi__fail(OI_ERR_INVALID_ARGUMENT,
                      "connect: arena %u sets base; a sidecar layout is given by offsets", i);
    if (opts.arenas[i].name && strlen(opts.arenas[i].name) > 255)
      return oi__fail(OI_ERR_INVALID_ARGUMENT, "connect: arena %u's name is longer than 255 bytes",
                      i);
  }
  if (opts.instance_name && strlen(opts.instance_name) > 255)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "connect: instance_name is longer than 255 bytes");
  if (opts.control_deadline_ms == 0)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "connect: control_deadline_ms is 0");
  uint64_t extent = 0;
  if (opts.num_arenas && opts.arenas && !layout_extent(&opts, &extent))
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "connect: the layout spans more than the address space");
  uint64_t arena_size = opts.arena_size ? opts.arena_size : extent;
  if (arena_size > UINT64_MAX - OI_ENGINE_STANDIN_BASE)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "connect: arena_size %llu is too large",
                    (unsigned long long)arena_size);
  if (owned && (uintptr_t)opts.arena_base > UINTPTR_MAX - arena_size)
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "connect: arena_base + arena_size wraps around the address space");
  char def[108];
  if (!socket_path) {
    if ((st = oi__wire_default_socket_path(def, sizeof def)) != OI_OK) return st;
    socket_path = def;
  }

  remote_engine *e = oi__calloc(1, sizeof *e);
  if (!e) return oi__fail(OI_ERR_OUT_OF_MEMORY, "connect: out of memory");
  e->base.ops = &remote_ops;
  e->fd = -1;
  e->owned_fd = -1;
  e->connecting_fd = -1;
  e->owned = owned;
  e->arena_size = arena_size;
  e->state = CONN_CONNECTING;
  init_sync(e);
  /* Validate the whole layout before talking to the server; the real base
   * is known after the import (or is the caller's, engine-owned). */
  void *owned_base = opts.arena_base;
  opts.arena_base = NULL;
  opts.arena_size = arena_size;
  if ((st = oi__engine_init_unmapped(&e->base, &opts, "connect")) != OI_OK) {
    if (e->kick_fd >= 0) close(e->kick_fd);
    pthread_mutex_destroy(&e->teardown_lock);
    pthread_mutex_destroy(&e->write_lock);
    pthread_cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->lock);
    oi__free(e);
    return st;
  }
  e->control_ms = opts.control_deadline_ms;
  e->lookup_ms = opts.lookup_deadline_ms;
  e->probe_ms = opts.probe_interval_ms;
  e->socket_path = oi__strdup(socket_path);
  if (!e->socket_path) {
    st = oi__fail(OI_ERR_OUT_OF_MEMORY, "connect: out of memory");
    goto fail;
  }
  if ((st = keep_layout(e, &opts)) != OI_OK) goto fail;
  if (owned) {
    opts.arena_base = owned_base;
    st = prepare_owned(e, &opts);
    opts.arena_base = NULL;
    if (st != OI_OK) goto fail;
  }
  if (e->kick_fd < 0) {
    st = oi__fail(OI_ERR_INTERNAL, "connect: eventfd: %s", strerror(errno));
    goto fail;
  }
  if ((st = oi__wire_connect(socket_path, &e->fd)) != OI_OK) goto fail;
  e->server_pid = oi__wire_peer_pid(e->fd);
  int rc = pthread_create(&e->reader, NULL, reader_main, e);
  if (rc != 0) {
    st = oi__fail(OI_ERR_INTERNAL, "connect: cannot start the reader thread: %s", strerror(rc));
    goto fail;
  }
  pthread_setname_np(e->reader, "oi-remote-read");
  e->reader_started = true;
  if ((st = hello(e)) != OI_OK) goto fail;
  oi_arena_handle handle;
  if ((st = register_layout(e, &handle)) != OI_OK) {
    if (instance_of(e)) goto fail_registered;
    goto fail;
  }
  oi_imported_arena *arena = NULL;
  if (owned) {
    oi__engine_rebase(&e->base, owned_base, arena_size);
  } else {
    if ((st = oi_imported_arena_open(&handle, arena_size, opts.device, &arena)) != OI_OK) {
      char msg[384];
      snprintf(msg, sizeof msg, "%s", oi_last_error());
      oi__fail(st, "connect: importing the server's arena: %s", msg);
      goto fail_registered;
    }
    oi__engine_rebase(&e->base, oi_imported_arena_ptr(arena), oi_imported_arena_size(arena));
    e->arena = arena;
    e->arena_open = true;
    oi__imported_arena_on_close(arena, on_arena_closed, e);
  }
  pthread_mutex_lock(&e->lock);
  bool alive = e->state == CONN_CONNECTING;
  if (alive) e->state = CONN_LIVE; /* the watchdog is armed */
  uint64_t epoch = e->server_epoch;
  pthread_mutex_unlock(&e->lock);
  if (!alive) {
    if (arena) {
      oi__imported_arena_on_close(arena, NULL, NULL);
      oi_imported_arena_close(arena);
    }
    st = closed_error(e, "connect");
    goto fail;
  }
  OI_LOG_I(OI_LOG_INFO, "engine", instance_of(e),
           "connected to %s (epoch %016llx): %u arenas, %llu blocks, %llu-byte %s arena",
           socket_path, (unsigned long long)epoch, e->base.layout.num_arenas,
           (unsigned long long)e->base.layout.num_blocks, (unsigned long long)arena_size,
           owned ? "engine-owned" : "server-allocated");
  *out = &e->base;
  if (arena_out) *arena_out = arena;
  return OI_OK;

fail_registered : {
  /* Nothing maps the arena here: the server may free it. */
  char msg[512];
  snprintf(msg, sizeof msg, "%s", oi_last_error());
  if (send_unregister(e) != OI_OK)
    OI_LOG(OI_LOG_WARN, "engine", "connect: unregister after a failed import: %s", oi_last_error());
  oi__fail(st, "%s", msg);
}
fail : {
  char msg[512];
  snprintf(msg, sizeof msg, "%s", oi_last_error());
  pthread_mutex_lock(&e->lock);
  if (e->state != CONN_DEAD) e->state = CONN_RETIRED;
  pthread_mutex_unlock(&e->lock);
  if (st == OI_ERR_CLOSED && e->reader_started) {
    /* The server closed the session (EPIPE on our send): its reason, if it
     * sent one, arrives before the end of stream. Wait for that end up to
     * the control deadline, not for good: OI_ERR_CLOSED may also be a
     * reply's status on a connection that stays open (free_engine cuts it). */
    struct timespec ts = abs_timespec(oi__deadline_ns(e->control_ms));
    pthread_mutex_lock(&e->lock);
    while (e->state != CONN_DEAD && pthread_cond_timedwait(&e->cv, &e->lock, &ts) != ETIMEDOUT) {
    }
    if (e->state == CONN_DEAD && e->conn_status) {
      st = e->conn_status;
      snprintf(msg, sizeof msg, "connect: the server refused the session: %.400s", e->conn_msg);
    }
    pthread_mutex_unlock(&e->lock);
  }
  free_engine(e);
  return oi__fail(st, "%s", msg);
}
}

/* ---- the lookup client ----------------------------------------------------------------
 * A session that registers nothing: a remote_engine without a layout or an
 * arena, whose connection is never live in the watchdog's sense (nothing it
 * maps can go away), so a lost server fails its calls with OI_ERR_CLOSED. */

struct oi_offload_client {
  remote_engine *e;
  uint32_t world_size;
};

OI_API oi_status oi_offload_client_connect(const char *socket_path, const oi_lookup_options *o,
                                           oi_offload_client **out) {
  if (!out) return oi__fail(OI_ERR_INVALID_ARGUMENT, "client_connect: out is NULL");
  *out = NULL;
  oi_lookup_options lo;
  oi_status st = oi__lookup_options_check(o, "client_connect", &lo);
  if (st != OI_OK) return st;
  char def[108];
  if (!socket_path) {
    if ((st = oi__wire_default_socket_path(def, sizeof def)) != OI_OK) return st;
    socket_path = def;
  }
  oi_offload_client *c = oi__calloc(1, sizeof *c);
  remote_engine *e = oi__calloc(1, sizeof *e);
  if (!c || !e) {
    oi__free(c);
    oi__free(e);
    return oi__fail(OI_ERR_OUT_OF_MEMORY, "client_connect: out of memory");
  }
  c->e = e;
  c->world_size = lo.world_size;
  e->base.ops = &remote_ops; /* (only query and release are used) */
  e->fd = -1;
  e->owned_fd = -1;
  e->connecting_fd = -1;
  e->state = CONN_RETIRED; /* never armed: the connection may end without harm */
  init_sync(e);
  e->control_ms = lo.control_deadline_ms;
  e->lookup_ms = lo.lookup_deadline_ms;
  e->probe_ms = lo.probe_interval_ms;
  e->base.namespace_id = oi__strdup(lo.namespace_id);
  e->base.instance_name = oi__strdup(lo.client_name ? lo.client_name : "lookup client");
  e->socket_path = oi__strdup(socket_path);
  if (!e->base.namespace_id || !e->base.instance_name || !e->socket_path) {
    st = oi__fail(OI_ERR_OUT_OF_MEMORY, "client_connect: out of memory");
    goto fail;
  }
  if (e->kick_fd < 0) {
    st = oi__fail(OI_ERR_INTERNAL, "client_connect: eventfd: %s", strerror(errno));
    goto fail;
  }
  if ((st = oi__wire_connect(socket_path, &e->fd)) != OI_OK) goto fail;
  int rc = pthread_create(&e->reader, NULL, reader_main, e);
  if (rc != 0) {
    st = oi__fail(OI_ERR_INTERNAL, "client_connect: cannot start the reader thread: %s",
                  strerror(rc));
    goto fail;
  }
  pthread_setname_np(e->reader, "oi-client-read");
  e->reader_started = true;
  if ((st = hello(e)) != OI_OK) goto fail;
  OI_LOG(OI_LOG_INFO, "engine", "lookup client of namespace '%s' connected to %s (epoch %016llx)",
         lo.namespace_id, socket_path, (unsigned long long)e->server_epoch);
  *out = c;
  return OI_OK;
fail : {
  char msg[512];
  snprintf(msg, sizeof msg, "%s", oi_last_error());
  free_engine(e);
  oi__free(c);
  return oi__fail(st, "%s", msg);
}
}

OI_API oi_status oi_offload_client_query(oi_offload_client *c, const char *req_id,
                                         const oi_block_hash *hashes, size_t n, uint32_t flags,
                                         oi_query_result *out) {
  if (!c) return oi__fail(OI_ERR_INVALID_ARGUMENT, "client_query: client is NULL");
  uint8_t *present;
  uint32_t wait_ms;
  oi_status st = oi__query_check("client_query", hashes, n, flags, out, &present, &wait_ms);
  if (st != OI_OK) return st;
  return query_call(c->e, 0, c->e->base.namespace_id, c->world_size, req_id, hashes, n, flags,
                    present, wait_ms, out);
}

OI_API oi_status oi_offload_client_release(oi_offload_client *c, oi_lease lease) {
  if (!c) return oi__fail(OI_ERR_INVALID_ARGUMENT, "client_release: client is NULL");
  return release_call(c->e, 0, c->e->base.namespace_id, lease);
}

OI_API void oi_offload_client_destroy(oi_offload_client *c) {
  if (!c) return;
  free_engine(c->e);
  oi__free(c);
}
