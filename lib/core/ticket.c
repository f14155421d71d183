/* Tickets: completion objects shared by a producer (the I/O) and an observer
 * (the caller). Reference counted so that the observer may release a pending
 * ticket while the producer still completes it later. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "core/core.h"

struct oi_ticket {
  pthread_mutex_t lock;
  pthread_cond_t done_cv;
  atomic_int refs;
  bool done;
  bool fencing; /* past its deadline, copies may still land (oi__ticket_fence) */
  bool callback_set;
  oi_status status;
  int event_fd;
  oi_ticket_fn callback;
  void *callback_ctx;
  void *cuda_event;
  void (*cuda_event_destroy)(void *event);
  void **arena_events; /* a layered load's per-arena events (same destroy) */
  uint32_t n_arena_events;
  oi_status (*arena_query)(void *event); /* answers arena waits from the events (CUDA) */
  /* A layered load's per-arena progress (every backend): arenas land in the
   * layout's order; arenas_landed counts those that landed, arena_failed is
   * the first that failed (n_arenas when none) and arena_status its error. */
  uint32_t n_arenas;
  uint32_t arenas_landed;
  uint32_t arena_failed;
  oi_status arena_status;
  /* Why it failed, when the producer said (oi__ticket_complete_msg): the
   * waiter's oi_last_error() after a wait or poll that returns the error. */
  char *reason;
};

oi_ticket *oi__ticket_new(void) {
  oi_ticket *t = oi__calloc(1, sizeof *t);
  if (!t) return NULL;
  oi__cond_init_monotonic(&t->done_cv);
  pthread_mutex_init(&t->lock, NULL);
  atomic_init(&t->refs, 2);
  t->status = OI_PENDING;
  t->event_fd = -1;
  return t;
}

void oi__ticket_retain(oi_ticket *t) { atomic_fetch_add(&t->refs, 1); }

void oi__ticket_unref(oi_ticket *t) {
  if (!t || atomic_fetch_sub(&t->refs, 1) != 1) return;
  if (t->event_fd >= 0) close(t->event_fd);
  if (t->cuda_event && t->cuda_event_destroy) t->cuda_event_destroy(t->cuda_event);
  for (uint32_t i = 0; i < t->n_arena_events; i++)
    if (t->arena_events[i] && t->cuda_event_destroy) t->cuda_event_destroy(t->arena_events[i]);
  oi__free(t->arena_events);
  oi__free(t->reason);
  pthread_cond_destroy(&t->done_cv);
  pthread_mutex_destroy(&t->lock);
  oi__free(t);
}

static void signal_fd(int fd) {
  uint64_t one = 1;
  ssize_t w;
  do
    w = write(fd, &one, sizeof one);
  while (w < 0 && errno == EINTR);
}

void oi__ticket_complete(oi_ticket *t, oi_status st) { oi__ticket_complete_msg(t, st, NULL); }

void oi__ticket_complete_msg(oi_ticket *t, oi_status st, const char *reason) {
  if (st == OI_PENDING) st = OI_ERR_INTERNAL; /* a producer never completes "pending" */
  char *copy = reason && st < 0 ? oi__strdup(reason) : NULL; /* (none without memory) */
  pthread_mutex_lock(&t->lock);
  bool first = !t->done;
  if (first) {
    t->reason = copy;
    copy = NULL;
  }
  oi__free(copy);
  oi_ticket_fn cb = NULL;
  void *cb_ctx = NULL;
  if (first) {
    t->done = true;
    t->status = st;
    if (t->event_fd >= 0) signal_fd(t->event_fd);
    pthread_cond_broadcast(&t->done_cv);
    cb = t->callback;
    cb_ctx = t->callback_ctx;
  }
  pthread_mutex_unlock(&t->lock);
  if (cb) cb(cb_ctx, t, st);
  oi__ticket_unref(t);
}

void oi__ticket_fence(oi_ticket *t) {
  pthread_mutex_lock(&t->lock);
  if (!t->done) {
    t->fencing = true;
    pthread_cond_broadcast(&t->done_cv);
  }
  pthread_mutex_unlock(&t->lock);
}

oi_status oi__ticket_wait_final(oi_ticket *t) {
  pthread_mutex_lock(&t->lock);
  while (!t->done)
    pthread_cond_wait(&t->done_cv, &t->lock);
  oi_status st = t->status;
  pthread_mutex_unlock(&t->lock);
  return st;
}

/* What a wait that meets a fencing ticket returns, at once. */
static oi_status fencing_timeout(const char *what) {
  return oi__fail(OI_ERR_TIMEOUT,
                  "%s: the load missed its deadline and copies into its destination may still "
                  "land (OI_FENCING): its blocks stay the library's until the ticket completes",
                  what);
}

void oi__ticket_set_cuda_event(oi_ticket *t, void *event, void (*destroy)(void *event)) {
  t->cuda_event = event;
  t->cuda_event_destroy = destroy;
}

void oi__ticket_set_arena_events(oi_ticket *t, void **events, uint32_t n,
                                 void (*destroy)(void *event)) {
  t->arena_events = events;
  t->n_arena_events = n;
  t->cuda_event_destroy = destroy;
}

void oi__ticket_set_arena_query(oi_ticket *t, oi_status (*query)(void *event)) {
  pthread_mutex_lock(&t->lock);
  t->arena_query = query;
  pthread_mutex_unlock(&t->lock);
}

/* An arena of an event-backed load (lock not held): the ticket's failure is
 * final for every wait; else the arena's event says. */
static oi_status arena_by_event(oi_ticket *t, uint32_t arena) {
  pthread_mutex_lock(&t->lock);
  bool done = t->done, fencing = t->fencing;
  oi_status st = t->status;
  void *ev = t->arena_events[arena];
  oi_status (*query)(void *) = t->arena_query;
  pthread_mutex_unlock(&t->lock);
  if (done) return st;
  if (fencing) return OI_FENCING;
  return query(ev); /* OI_OK, OI_PENDING, or the device's error (its message set) */
}

static bool event_backed(oi_ticket *t, uint32_t *n) {
  pthread_mutex_lock(&t->lock);
  bool yes = t->n_arenas == 0 && t->arena_query && t->n_arena_events > 0;
  *n = t->n_arena_events;
  pthread_mutex_unlock(&t->lock);
  return yes;
}

void oi__ticket_arena_progress(oi_ticket *t, uint32_t n) {
  pthread_mutex_lock(&t->lock);
  t->n_arenas = n;
  t->arenas_landed = 0;
  t->arena_failed = n;
  t->arena_status = OI_OK;
  pthread_mutex_unlock(&t->lock);
}

void oi__ticket_arena_landed(oi_ticket *t, uint32_t arena, oi_status st) {
  pthread_mutex_lock(&t->lock);
  if (arena < t->n_arenas) {
    if (st != OI_OK && arena < t->arena_failed) {
      t->arena_failed = arena;
      t->arena_status = st;
    } else if (st == OI_OK && arena + 1 > t->arenas_landed) {
      t->arenas_landed = arena + 1;
    }
    pthread_cond_broadcast(&t->done_cv);
  }
  pthread_mutex_unlock(&t->lock);
}

/* Under the lock: arena's state (OI_PENDING while it is still moving). A
 * failure of the load (the ticket's error, or an arena at or before this
 * one) is final for every later wait. */
static oi_status arena_state_locked(const oi_ticket *t, uint32_t arena) {
  if (t->done && t->status != OI_OK) return t->status;
  if (!t->done && t->fencing) return OI_FENCING;
  if (t->arena_failed <= arena) return t->arena_status;
  if (t->arenas_landed > arena || t->done) return OI_OK;
  return OI_PENDING;
}

OI_API oi_status oi_ticket_arena_poll(oi_ticket *t, uint32_t arena) {
  if (!t) return oi__fail(OI_ERR_INVALID_ARGUMENT, "ticket_arena_poll: ticket is NULL");
  uint32_t ne;
  if (event_backed(t, &ne)) {
    if (arena >= ne)
      return oi__fail(OI_ERR_INVALID_ARGUMENT, "ticket_arena_poll: arena %u of a %u-arena load",
                      arena, ne);
    return arena_by_event(t, arena);
  }
  pthread_mutex_lock(&t->lock);
  oi_status st;
  if (t->n_arenas == 0) {
    st = t->done ? t->status : t->fencing ? OI_FENCING : OI_PENDING; /* the whole ticket */
  } else if (arena >= t->n_arenas) {
    st = oi__fail(OI_ERR_INVALID_ARGUMENT, "ticket_arena_poll: arena %u of a %u-arena load", arena,
                  t->n_arenas);
  } else {
    st = arena_state_locked(t, arena);
  }
  pthread_mutex_unlock(&t->lock);
  return st;
}

OI_API oi_status oi_ticket_arena_wait(oi_ticket *t, uint32_t arena, uint32_t timeout_ms) {
  if (!t) return oi__fail(OI_ERR_INVALID_ARGUMENT, "ticket_arena_wait: ticket is NULL");
  uint32_t ne;
  if (event_backed(t, &ne)) { /* CUDA: poll the arena's event (a short sleep between) */
    if (arena >= ne)
      return oi__fail(OI_ERR_INVALID_ARGUMENT, "ticket_arena_wait: arena %u of a %u-arena load",
                      arena, ne);
    uint64_t end = oi__deadline_ns(timeout_ms);
    for (;;) {
      oi_status st = arena_by_event(t, arena);
      if (st == OI_FENCING) return fencing_timeout("ticket_arena_wait");
      if (st != OI_PENDING) return st;
      if (oi__now_ns() >= end)
        return oi__fail(OI_ERR_TIMEOUT, "ticket_arena_wait: arena %u not in place after %u ms",
                        arena, timeout_ms);
      struct timespec nap = {.tv_sec = 0, .tv_nsec = 20000};
      nanosleep(&nap, NULL);
    }
  }
  pthread_mutex_lock(&t->lock);
  uint32_t n = t->n_arenas;
  pthread_mutex_unlock(&t->lock);
  if (n == 0) return oi_ticket_wait(t, timeout_ms); /* no per-arena progress */
  if (arena >= n)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "ticket_arena_wait: arena %u of a %u-arena load",
                    arena, n);
  uint64_t deadline = oi__deadline_ns(timeout_ms);
  struct timespec ts = {.tv_sec = (time_t)(deadline / 1000000000ull),
                        .tv_nsec = (long)(deadline % 1000000000ull)};
  pthread_mutex_lock(&t->lock);
  oi_status st;
  while ((st = arena_state_locked(t, arena)) == OI_PENDING) {
    if (deadline == UINT64_MAX) {
      pthread_cond_wait(&t->done_cv, &t->lock);
    } else if (pthread_cond_timedwait(&t->done_cv, &t->lock, &ts) == ETIMEDOUT &&
               (st = arena_state_locked(t, arena)) == OI_PENDING) {
      pthread_mutex_unlock(&t->lock);
      return oi__fail(OI_ERR_TIMEOUT, "ticket_arena_wait: arena %u not in place after %u ms", arena,
                      timeout_ms);
    }
  }
  pthread_mutex_unlock(&t->lock);
  if (st == OI_FENCING) return fencing_timeout("ticket_arena_wait");
  return st;
}

OI_API oi_status oi_ticket_poll(oi_ticket *t) {
  if (!t) return oi__fail(OI_ERR_INVALID_ARGUMENT, "ticket_poll: ticket is NULL");
  pthread_mutex_lock(&t->lock);
  oi_status st = t->done ? t->status : t->fencing ? OI_FENCING : OI_PENDING;
  if (t->done && t->reason) oi__fail(st, "%s", t->reason);
  pthread_mutex_unlock(&t->lock);
  return st;
}

OI_API oi_status oi_ticket_wait(oi_ticket *t, uint32_t timeout_ms) {
  if (!t) return oi__fail(OI_ERR_INVALID_ARGUMENT, "ticket_wait: ticket is NULL");
  uint64_t deadline = oi__deadline_ns(timeout_ms);
  struct timespec ts = {.tv_sec = (time_t)(deadline / 1000000000ull),
                        .tv_nsec = (long)(deadline % 1000000000ull)};
  pthread_mutex_lock(&t->lock);
  while (!t->done) {
    if (t->fencing) {
      pthread_mutex_unlock(&t->lock);
      return fencing_timeout("ticket_wait");
    }
    if (deadline == UINT64_MAX) {
      pthread_cond_wait(&t->done_cv, &t->lock);
    } else if (pthread_cond_timedwait(&t->done_cv, &t->lock, &ts) == ETIMEDOUT && !t->done) {
      pthread_mutex_unlock(&t->lock);
      return oi__fail(OI_ERR_TIMEOUT, "ticket_wait: not complete after %u ms", timeout_ms);
    }
  }
  oi_status st = t->status;
  if (t->reason) oi__fail(st, "%s", t->reason);
  pthread_mutex_unlock(&t->lock);
  return st;
}

OI_API int oi_ticket_fd(oi_ticket *t) {
  if (!t) {
    oi__fail(OI_ERR_INVALID_ARGUMENT, "ticket_fd: ticket is NULL");
    return -1;
  }
  pthread_mutex_lock(&t->lock);
  if (t->event_fd < 0) {
    t->event_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (t->event_fd < 0)
      oi__fail(OI_ERR_IO, "ticket_fd: eventfd failed (errno %d)", errno);
    else if (t->done)
      signal_fd(t->event_fd);
  }
  int fd = t->event_fd;
  pthread_mutex_unlock(&t->lock);
  return fd;
}

OI_API void *oi_ticket_cuda_event(oi_ticket *t) { return t ? t->cuda_event : NULL; }

OI_API void *oi_ticket_arena_event(oi_ticket *t, uint32_t arena) {
  return t && arena < t->n_arena_events ? t->arena_events[arena] : NULL;
}

OI_API oi_status oi_ticket_set_callback(oi_ticket *t, oi_ticket_fn fn, void *ctx) {
  if (!t || !fn)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "ticket_set_callback: %s is NULL",
                    t ? "callback" : "ticket");
  pthread_mutex_lock(&t->lock);
  if (t->callback_set) {
    pthread_mutex_unlock(&t->lock);
    return oi__fail(OI_ERR_STATE, "ticket_set_callback: a callback is already set");
  }
  t->callback_set = true;
  bool done = t->done;
  oi_status st = t->status;
  if (!done) {
    t->callback = fn;
    t->callback_ctx = ctx;
  }
  pthread_mutex_unlock(&t->lock);
  if (done) fn(ctx, t, st);
  return OI_OK;
}

OI_API void oi_ticket_release(oi_ticket *t) { oi__ticket_unref(t); }
