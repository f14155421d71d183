/* Tickets: polling, waiting, the eventfd, callbacks and reference counting. */
#include <errno.h>
#include <mimalloc.h>
#include <poll.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#include "core/core.h"
#include "testutil.h"

static void sleep_ms(unsigned ms) {
  struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

static uint64_t elapsed_ms(uint64_t since_ns) { return (oi__now_ns() - since_ns) / 1000000ull; }

/* Whether `t` is still an allocated block of the calling thread's mimalloc
 * heap (oi__ticket_new allocates with oi__calloc, on the test's main thread).
 * This observes the reference count directly: AddressSanitizer cannot see
 * use-after-free inside mimalloc's own pages, and libmimalloc does not
 * replace malloc, so nothing else reuses a freed ticket's block here. Only
 * the pointer value is compared; a freed ticket is never dereferenced. */
struct find_block {
  const void *p;
  bool found;
};

static bool find_visitor(const mi_heap_t *heap, const mi_heap_area_t *area, void *block,
                         size_t block_size, void *arg) {
  OI_UNUSED(heap);
  OI_UNUSED(area);
  OI_UNUSED(block_size);
  struct find_block *f = arg;
  if (block && block == f->p) {
    f->found = true;
    return false; /* stop visiting */
  }
  return true;
}

#if defined(OI_ALLOC_LIBC) && (defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__))
/* allocator=libc (sanitizer builds): the sanitizer's allocator knows which
 * chunks are live (a freed one sits in quarantine, not allocated). */
/* (sanitizer/allocator_interface.h; gcc does not ship the header) */
int __sanitizer_get_ownership(const volatile void *p);
size_t __sanitizer_get_allocated_size(const volatile void *p);
static bool ticket_is_allocated(const oi_ticket *t) {
  (void)find_visitor;
#ifdef __SANITIZE_THREAD__
  return __sanitizer_get_allocated_size(t) != 0; /* 0 once freed (its metadata is gone) */
#else
  return __sanitizer_get_ownership(t) != 0; /* ASan: a freed chunk is not owned */
#endif
}
#else
static bool ticket_is_allocated(const oi_ticket *t) {
  /* Frees from other threads sit on a deferred list until the owning heap
   * collects them; visiting alone would still report such a block in use. */
  mi_heap_collect(mi_heap_get_default(), false);
  struct find_block f = {.p = t, .found = false};
  mi_heap_visit_blocks(mi_heap_get_default(), true, find_visitor, &f);
  return f.found;
}
#endif

/* 0 when nothing to read, 1 with revents POLLIN when readable. */
static int fd_readable(int fd, int timeout_ms, short *revents) {
  struct pollfd p = {.fd = fd, .events = POLLIN};
  int r = poll(&p, 1, timeout_ms);
  if (revents) *revents = p.revents;
  return r;
}

/* A producer thread: sleeps, then completes the ticket. */
struct producer {
  oi_ticket *t;
  unsigned delay_ms;
  oi_status st;
};

static void *produce(void *arg) {
  struct producer *p = arg;
  if (p->delay_ms) sleep_ms(p->delay_ms);
  oi__ticket_complete(p->t, p->st);
  return NULL;
}

/* Callback recorder. */
struct cb_record {
  atomic_int calls;
  atomic_int status;
  oi_ticket *_Atomic ticket;
  atomic_int poll_in_callback; /* the ticket must still be alive inside the callback */
};

static void record_cb(void *ctx, oi_ticket *t, oi_status st) {
  struct cb_record *r = ctx;
  atomic_store(&r->status, st);
  atomic_store(&r->ticket, t);
  atomic_store(&r->poll_in_callback, oi_ticket_poll(t));
  atomic_fetch_add(&r->calls, 1);
}

static void never_called_cb(void *ctx, oi_ticket *t, oi_status st) {
  OI_UNUSED(t);
  OI_UNUSED(st);
  atomic_fetch_add((atomic_int *)ctx, 1);
}

/* (a) */
static void new_ticket_is_pending_and_wait_times_out(void) {
  oi_ticket *t = oi__ticket_new();
  REQUIRE(t != NULL);
  CHECK_ST(oi_ticket_poll(t), OI_PENDING);

  oi_clear_error();
  uint64_t t0 = oi__now_ns();
  CHECK_ST(oi_ticket_wait(t, 20), OI_ERR_TIMEOUT);
  CHECK(elapsed_ms(t0) >= 20);
  CHECK(oi_last_error()[0] != '\0');
  CHECK_ST(oi_ticket_wait(t, 0), OI_ERR_TIMEOUT);

  /* The timeout leaves the ticket pending and usable. */
  CHECK_ST(oi_ticket_poll(t), OI_PENDING);
  oi__ticket_complete(t, OI_OK);
  CHECK_ST(oi_ticket_poll(t), OI_OK);
  CHECK_ST(oi_ticket_wait(t, 0), OI_OK);
  CHECK_ST(oi_ticket_wait(t, UINT32_MAX), OI_OK);
  CHECK(ticket_is_allocated(t)); /* the observer still holds it */
  oi_ticket_release(t);
  CHECK(!ticket_is_allocated(t)); /* last reference gone: freed, not leaked */
  oi_clear_error();
}

/* (b) */
static void completion_from_another_thread_wakes_an_infinite_wait(void) {
  oi_ticket *t = oi__ticket_new();
  REQUIRE(t != NULL);
  struct producer p = {.t = t, .delay_ms = 50, .st = OI_ERR_IO};
  uint64_t t0 = oi__now_ns();
  pthread_t th;
  REQUIRE(pthread_create(&th, NULL, produce, &p) == 0);
  CHECK_ST(oi_ticket_wait(t, UINT32_MAX), OI_ERR_IO);
  CHECK(elapsed_ms(t0) >= 50);
  CHECK_ST(oi_ticket_poll(t), OI_ERR_IO);
  pthread_join(th, NULL);
  oi_ticket_release(t);
}

static void completion_wakes_a_finite_wait_early(void) {
  oi_ticket *t = oi__ticket_new();
  REQUIRE(t != NULL);
  struct producer p = {.t = t, .delay_ms = 30, .st = OI_ERR_PERMISSION};
  uint64_t t0 = oi__now_ns();
  pthread_t th;
  REQUIRE(pthread_create(&th, NULL, produce, &p) == 0);
  CHECK_ST(oi_ticket_wait(t, 10000), OI_ERR_PERMISSION);
  uint64_t ms = elapsed_ms(t0);
  CHECK(ms >= 30);
  CHECK(ms < 5000);
  pthread_join(th, NULL);
  oi_ticket_release(t);
}

struct waiter {
  oi_ticket *t;
  oi_status got;
  uint64_t woke_ns;
};

/* Waits with a long but finite timeout, so that a lost wake-up shows as a
 * late return instead of a hung test. */
static void *wait_long(void *arg) {
  struct waiter *w = arg;
  w->got = oi_ticket_wait(w->t, 10000);
  w->woke_ns = oi__now_ns();
  return NULL;
}

static void completion_wakes_every_waiter(void) {
  enum { N = 4 };
  oi_ticket *t = oi__ticket_new();
  REQUIRE(t != NULL);
  struct waiter w[N];
  pthread_t th[N];
  for (int i = 0; i < N; i++) {
    w[i] = (struct waiter){.t = t, .got = OI_PENDING};
    REQUIRE(pthread_create(&th[i], NULL, wait_long, &w[i]) == 0);
  }
  sleep_ms(20);
  uint64_t completed_ns = oi__now_ns();
  oi__ticket_complete(t, OI_ERR_CLOSED);
  for (int i = 0; i < N; i++) {
    pthread_join(th[i], NULL);
    CHECK_ST(w[i].got, OI_ERR_CLOSED);
    /* Woken by the completion, not by its own timeout. */
    CHECK(w[i].woke_ns - completed_ns < 5000ull * 1000000ull);
  }
  oi_ticket_release(t);
}

/* (c) */
static void fd_becomes_readable_on_completion(void) {
  oi_ticket *t = oi__ticket_new();
  REQUIRE(t != NULL);
  int fd = oi_ticket_fd(t);
  REQUIRE(fd >= 0);
  CHECK(oi_ticket_fd(t) == fd); /* one fd per ticket */
  short rev = 0;
  CHECK(fd_readable(fd, 0, &rev) == 0);

  oi__ticket_complete(t, OI_OK);
  CHECK(fd_readable(fd, 0, &rev) == 1);
  CHECK(rev & POLLIN);
  /* ... and stays readable. */
  CHECK(fd_readable(fd, 0, &rev) == 1);
  CHECK(oi_ticket_fd(t) == fd);
  oi_ticket_release(t);
}

static void fd_wakes_a_blocking_poll(void) {
  oi_ticket *t = oi__ticket_new();
  REQUIRE(t != NULL);
  int fd = oi_ticket_fd(t);
  REQUIRE(fd >= 0);
  struct producer p = {.t = t, .delay_ms = 30, .st = OI_OK};
  pthread_t th;
  REQUIRE(pthread_create(&th, NULL, produce, &p) == 0);
  short rev = 0;
  uint64_t t0 = oi__now_ns();
  CHECK(fd_readable(fd, 10000, &rev) == 1);
  CHECK(rev & POLLIN);
  CHECK(elapsed_ms(t0) < 5000);
  CHECK_ST(oi_ticket_poll(t), OI_OK);
  pthread_join(th, NULL);
  oi_ticket_release(t);
}

static void fd_requested_after_completion_is_readable_at_once(void) {
  oi_ticket *t = oi__ticket_new();
  REQUIRE(t != NULL);
  oi__ticket_complete(t, OI_ERR_IO);
  int fd = oi_ticket_fd(t);
  REQUIRE(fd >= 0);
  short rev = 0;
  CHECK(fd_readable(fd, 0, &rev) == 1);
  CHECK(rev & POLLIN);
  oi_ticket_release(t);
}

/* (d) */
static void callback_set_before_completion_fires_once(void) {
  oi_ticket *t = oi__ticket_new();
  REQUIRE(t != NULL);
  struct cb_record r = {0};
  atomic_int stray = 0;
  CHECK_OK(oi_ticket_set_callback(t, record_cb, &r));
  CHECK(atomic_load(&r.calls) == 0);
  CHECK_ST(oi_ticket_set_callback(t, never_called_cb, &stray), OI_ERR_STATE);

  oi__ticket_retain(t); /* a second producer reference for the second complete */
  oi__ticket_complete(t, OI_ERR_PROTOCOL);
  CHECK(atomic_load(&r.calls) == 1);
  CHECK(atomic_load(&r.status) == OI_ERR_PROTOCOL);
  CHECK(atomic_load(&r.ticket) == t);
  CHECK(atomic_load(&r.poll_in_callback) == OI_ERR_PROTOCOL);
  oi__ticket_complete(t, OI_OK);
  CHECK(atomic_load(&r.calls) == 1);
  CHECK(atomic_load(&stray) == 0);
  oi_ticket_release(t);
  oi_clear_error();
}

static void callback_set_after_completion_fires_once_immediately(void) {
  oi_ticket *t = oi__ticket_new();
  REQUIRE(t != NULL);
  oi__ticket_complete(t, OI_ERR_NOT_FOUND);
  struct cb_record r = {0};
  atomic_int stray = 0;
  CHECK_OK(oi_ticket_set_callback(t, record_cb, &r));
  CHECK(atomic_load(&r.calls) == 1);
  CHECK(atomic_load(&r.status) == OI_ERR_NOT_FOUND);
  CHECK(atomic_load(&r.ticket) == t);
  CHECK_ST(oi_ticket_set_callback(t, never_called_cb, &stray), OI_ERR_STATE);
  CHECK(atomic_load(&r.calls) == 1);
  CHECK(atomic_load(&stray) == 0);
  oi_ticket_release(t);
  oi_clear_error();
}

static void callback_racing_completion_fires_exactly_once(void) {
  for (int i = 0; i < 200; i++) {
    oi_ticket *t = oi__ticket_new();
    REQUIRE(t != NULL);
    struct producer p = {.t = t, .delay_ms = 0, .st = OI_ERR_BUSY};
    struct cb_record r = {0};
    pthread_t th;
    REQUIRE(pthread_create(&th, NULL, produce, &p) == 0);
    CHECK_OK(oi_ticket_set_callback(t, record_cb, &r));
    pthread_join(th, NULL);
    CHECK(atomic_load(&r.calls) == 1);
    CHECK(atomic_load(&r.status) == OI_ERR_BUSY);
    oi_ticket_release(t);
    if (oi_test_failures) break;
  }
}

/* (e) */
/* A callback that holds the producer thread inside it until main lets go,
 * so that main can check the ticket is still alive while the callback runs. */
struct gate {
  struct cb_record rec;
  sem_t entered;
  sem_t proceed;
};

static void gated_cb(void *ctx, oi_ticket *t, oi_status st) {
  struct gate *g = ctx;
  record_cb(&g->rec, t, st);
  sem_post(&g->entered);
  while (sem_wait(&g->proceed) != 0) {
  }
}

static int sem_wait_ms(sem_t *s, unsigned ms) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_sec += ms / 1000;
  ts.tv_nsec += (long)(ms % 1000) * 1000000L;
  if (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000L;
  }
  int r;
  do
    r = sem_timedwait(s, &ts);
  while (r != 0 && errno == EINTR);
  return r;
}

static void release_while_pending_keeps_the_ticket_for_the_producer(void) {
  oi_ticket *t = oi__ticket_new();
  REQUIRE(t != NULL);
  struct gate g;
  memset(&g, 0, sizeof g);
  REQUIRE(sem_init(&g.entered, 0, 0) == 0);
  REQUIRE(sem_init(&g.proceed, 0, 0) == 0);
  CHECK_OK(oi_ticket_set_callback(t, gated_cb, &g));
  REQUIRE(oi_ticket_fd(t) >= 0); /* the fd is signalled after the observer left */
  oi_ticket_release(t);          /* the observer goes away first */
  CHECK(ticket_is_allocated(t)); /* the producer's reference keeps it */

  struct producer p = {.t = t, .delay_ms = 30, .st = OI_ERR_LEASE_EXPIRED};
  pthread_t th;
  REQUIRE(pthread_create(&th, NULL, produce, &p) == 0);
  int entered = sem_wait_ms(&g.entered, 10000) == 0;
  CHECK(entered);
  /* The producer is inside the callback: the ticket it was handed is alive. */
  if (entered) CHECK(ticket_is_allocated(t));
  sem_post(&g.proceed);
  pthread_join(th, NULL);

  CHECK(!ticket_is_allocated(t)); /* freed by the producer's completion */
  CHECK(atomic_load(&g.rec.calls) == 1);
  CHECK(atomic_load(&g.rec.status) == OI_ERR_LEASE_EXPIRED);
  CHECK(atomic_load(&g.rec.poll_in_callback) == OI_ERR_LEASE_EXPIRED);
  sem_destroy(&g.entered);
  sem_destroy(&g.proceed);
}

static void release_racing_completion_is_clean(void) {
  for (int i = 0; i < 500; i++) {
    oi_ticket *t = oi__ticket_new();
    REQUIRE(t != NULL);
    struct cb_record r = {0};
    CHECK_OK(oi_ticket_set_callback(t, record_cb, &r));
    if (i % 2) REQUIRE(oi_ticket_fd(t) >= 0);
    struct producer p = {.t = t, .delay_ms = 0, .st = OI_OK};
    pthread_t th;
    REQUIRE(pthread_create(&th, NULL, produce, &p) == 0);
    oi_ticket_release(t);
    pthread_join(th, NULL);
    CHECK(atomic_load(&r.calls) == 1);
    CHECK(!ticket_is_allocated(t));
    if (oi_test_failures) break;
  }
}

/* (f) */
static void first_completion_wins(void) {
  oi_ticket *t = oi__ticket_new();
  REQUIRE(t != NULL);
  oi__ticket_retain(t); /* each oi__ticket_complete drops one producer reference */
  oi__ticket_complete(t, OI_ERR_IO);
  oi__ticket_complete(t, OI_OK);
  CHECK_ST(oi_ticket_poll(t), OI_ERR_IO);
  CHECK_ST(oi_ticket_wait(t, 0), OI_ERR_IO);
  CHECK(ticket_is_allocated(t)); /* the second completion dropped only its own reference */
  oi_ticket_release(t);
  CHECK(!ticket_is_allocated(t));
}

static void completing_with_pending_becomes_internal_error(void) {
  oi_ticket *t = oi__ticket_new();
  REQUIRE(t != NULL);
  oi__ticket_complete(t, OI_PENDING);
  CHECK_ST(oi_ticket_poll(t), OI_ERR_INTERNAL);
  CHECK_ST(oi_ticket_wait(t, 0), OI_ERR_INTERNAL);
  oi_ticket_release(t);
}

/* (g) */
static void null_tickets_are_rejected(void) {
  atomic_int stray = 0;
  oi_clear_error();
  CHECK_ST(oi_ticket_poll(NULL), OI_ERR_INVALID_ARGUMENT);
  CHECK(oi_last_error()[0] != '\0');
  CHECK_ST(oi_ticket_wait(NULL, 0), OI_ERR_INVALID_ARGUMENT);
  CHECK_ST(oi_ticket_wait(NULL, UINT32_MAX), OI_ERR_INVALID_ARGUMENT);
  CHECK(oi_ticket_fd(NULL) == -1);
  CHECK(oi_ticket_cuda_event(NULL) == NULL);
  CHECK_ST(oi_ticket_set_callback(NULL, never_called_cb, &stray), OI_ERR_INVALID_ARGUMENT);
  oi_ticket_release(NULL);

  oi_ticket *t = oi__ticket_new();
  REQUIRE(t != NULL);
  CHECK_ST(oi_ticket_set_callback(t, NULL, NULL), OI_ERR_INVALID_ARGUMENT);
  /* A rejected NULL callback does not use up the ticket's one callback. */
  struct cb_record r = {0};
  CHECK_OK(oi_ticket_set_callback(t, record_cb, &r));
  oi__ticket_complete(t, OI_OK);
  CHECK(atomic_load(&r.calls) == 1);
  CHECK(atomic_load(&stray) == 0);
  oi_ticket_release(t);
  oi_clear_error();
}

/* (h) */
static int fake_event;
static atomic_int destroyed;
static void destroy_fake_event(void *ev) {
  if (ev == &fake_event) atomic_fetch_add(&destroyed, 1);
}

static void plain_ticket_has_no_cuda_event(void) {
  oi_ticket *t = oi__ticket_new();
  REQUIRE(t != NULL);
  CHECK(oi_ticket_cuda_event(t) == NULL);
  oi__ticket_complete(t, OI_OK);
  CHECK(oi_ticket_cuda_event(t) == NULL);
  oi_ticket_release(t);
}

static void attached_event_is_destroyed_with_the_last_reference(void) {
  oi_ticket *t = oi__ticket_new();
  REQUIRE(t != NULL);
  oi__ticket_set_cuda_event(t, &fake_event, destroy_fake_event);
  CHECK(oi_ticket_cuda_event(t) == &fake_event);
  oi_ticket_release(t); /* the producer still holds a reference */
  CHECK(atomic_load(&destroyed) == 0);
  CHECK(ticket_is_allocated(t));
  oi__ticket_complete(t, OI_OK);
  CHECK(atomic_load(&destroyed) == 1);
  CHECK(!ticket_is_allocated(t));
}

/* (i) A layered load whose arenas are followed by device events (CUDA's
 * way, here with fake events and a fake query): poll and wait ask the
 * event, an arena past the load is refused, a wait times out while the
 * event is pending, the ticket's failure is final for every arena, and the
 * ticket frees every event with itself. */
static int arena_ev[3];
static atomic_int arena_ev_state[3]; /* what the fake query answers per event */
static atomic_int arena_ev_destroyed;
static oi_status query_fake_arena_event(void *ev) {
  for (int i = 0; i < 3; i++)
    if (ev == &arena_ev[i]) return (oi_status)atomic_load(&arena_ev_state[i]);
  return OI_ERR_INTERNAL;
}
static void destroy_fake_arena_event(void *ev) {
  for (int i = 0; i < 3; i++)
    if (ev == &arena_ev[i]) atomic_fetch_add(&arena_ev_destroyed, 1);
}
static void *land_arena_1_later(void *arg) {
  OI_UNUSED(arg);
  sleep_ms(30);
  atomic_store(&arena_ev_state[1], OI_OK);
  return NULL;
}

static void event_backed_arenas_follow_their_events(void) {
  oi_ticket *t = oi__ticket_new();
  REQUIRE(t != NULL);
  void **evs = oi__calloc(3, sizeof *evs);
  REQUIRE(evs != NULL);
  for (int i = 0; i < 3; i++) {
    evs[i] = &arena_ev[i];
    atomic_store(&arena_ev_state[i], OI_PENDING);
  }
  atomic_store(&arena_ev_destroyed, 0);
  oi__ticket_set_arena_events(t, evs, 3, destroy_fake_arena_event);
  oi__ticket_set_arena_query(t, query_fake_arena_event);
  CHECK(oi_ticket_arena_event(t, 2) == &arena_ev[2]);
  CHECK(oi_ticket_arena_event(t, 3) == NULL);

  atomic_store(&arena_ev_state[0], OI_OK);
  CHECK_OK(oi_ticket_arena_poll(t, 0));
  CHECK_ST(oi_ticket_arena_poll(t, 1), OI_PENDING);
  CHECK_ST(oi_ticket_arena_poll(t, 3), OI_ERR_INVALID_ARGUMENT);
  CHECK_ST(oi_ticket_arena_wait(t, 3, 10), OI_ERR_INVALID_ARGUMENT);
  /* Pending past the deadline: a timeout after about the time asked. */
  uint64_t t0 = oi__now_ns();
  CHECK_ST(oi_ticket_arena_wait(t, 2, 20), OI_ERR_TIMEOUT);
  CHECK(elapsed_ms(t0) >= 19);
  /* Its event ends while waiting: the wait returns OK. */
  pthread_t th;
  REQUIRE(pthread_create(&th, NULL, land_arena_1_later, NULL) == 0);
  CHECK_OK(oi_ticket_arena_wait(t, 1, 5000));
  pthread_join(th, NULL);
  /* The device's error for an arena is that arena's answer. */
  atomic_store(&arena_ev_state[2], OI_ERR_CUDA);
  CHECK_ST(oi_ticket_arena_poll(t, 2), OI_ERR_CUDA);
  CHECK_ST(oi_ticket_arena_wait(t, 2, 10), OI_ERR_CUDA);
  /* The ticket failed: every arena reports it, whatever its event says. */
  oi__ticket_complete(t, OI_ERR_TIMEOUT);
  CHECK_ST(oi_ticket_arena_poll(t, 0), OI_ERR_TIMEOUT);
  CHECK_ST(oi_ticket_arena_wait(t, 1, 10), OI_ERR_TIMEOUT);
  CHECK(atomic_load(&arena_ev_destroyed) == 0);
  oi_ticket_release(t);
  CHECK(atomic_load(&arena_ev_destroyed) == 3);
}

/* (j) A layered load followed by callbacks (the cpu way): an arena's wait
 * times out while it is still moving, returns once it landed (also when a
 * later arena landed first), an arena's failure is final for it and every
 * later one, and a ticket without per-arena progress answers for the whole
 * load. */
static void callback_arenas_time_out_land_and_fail_in_order(void) {
  oi_ticket *t = oi__ticket_new();
  REQUIRE(t != NULL);
  CHECK_ST(oi_ticket_arena_poll(t, 0), OI_PENDING); /* no progress yet: the whole ticket */
  oi__ticket_arena_progress(t, 4);
  uint64_t t0 = oi__now_ns();
  CHECK_ST(oi_ticket_arena_wait(t, 1, 20), OI_ERR_TIMEOUT);
  CHECK(elapsed_ms(t0) >= 19);
  CHECK_ST(oi_ticket_arena_wait(t, 4, 20), OI_ERR_INVALID_ARGUMENT);
  oi__ticket_arena_landed(t, 1, OI_OK); /* out of order: arena 0 still moving */
  oi__ticket_arena_landed(t, 0, OI_OK);
  CHECK_OK(oi_ticket_arena_wait(t, 0, 20));
  CHECK_OK(oi_ticket_arena_poll(t, 1));
  oi__ticket_arena_landed(t, 9, OI_OK); /* past the load: ignored */
  oi__ticket_arena_landed(t, 2, OI_ERR_IO);
  oi__ticket_arena_landed(t, 3, OI_OK); /* after a failure: still failed */
  CHECK_OK(oi_ticket_arena_poll(t, 1));
  CHECK_ST(oi_ticket_arena_wait(t, 2, 20), OI_ERR_IO);
  CHECK_ST(oi_ticket_arena_poll(t, 3), OI_ERR_IO);
  oi__ticket_complete(t, OI_ERR_IO);
  CHECK_ST(oi_ticket_arena_wait(t, 0, 20), OI_ERR_IO); /* the load failed: final for all */
  oi_ticket_release(t);

  /* Without per-arena progress: the ticket's own state, done or not. */
  t = oi__ticket_new();
  REQUIRE(t != NULL);
  CHECK_ST(oi_ticket_arena_wait(t, 7, 10), OI_ERR_TIMEOUT);
  oi__ticket_complete(t, OI_OK);
  CHECK_OK(oi_ticket_arena_poll(t, 7));
  CHECK_OK(oi_ticket_arena_wait(t, 7, 10));
  oi_ticket_release(t);
}

int main(void) {
#if defined(OI_ALLOC_LIBC) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  TEST_SKIP("allocator=libc without a sanitizer: no way to see whether a ticket was freed");
#endif
  RUN_TEST(new_ticket_is_pending_and_wait_times_out);
  RUN_TEST(completion_from_another_thread_wakes_an_infinite_wait);
  RUN_TEST(completion_wakes_a_finite_wait_early);
  RUN_TEST(completion_wakes_every_waiter);
  RUN_TEST(fd_becomes_readable_on_completion);
  RUN_TEST(fd_wakes_a_blocking_poll);
  RUN_TEST(fd_requested_after_completion_is_readable_at_once);
  RUN_TEST(callback_set_before_completion_fires_once);
  RUN_TEST(callback_set_after_completion_fires_once_immediately);
  RUN_TEST(callback_racing_completion_fires_exactly_once);
  RUN_TEST(release_while_pending_keeps_the_ticket_for_the_producer);
  RUN_TEST(release_racing_completion_is_clean);
  RUN_TEST(first_completion_wins);
  RUN_TEST(completing_with_pending_becomes_internal_error);
  RUN_TEST(null_tickets_are_rejected);
  RUN_TEST(plain_ticket_has_no_cuda_event);
  RUN_TEST(attached_event_is_destroyed_with_the_last_reference);
  RUN_TEST(event_backed_arenas_follow_their_events);
  RUN_TEST(callback_arenas_time_out_land_and_fail_in_order);
  TEST_EXIT();
}
