/* Internal core services shared by every layer: errors, logging, fatal
 * conditions, allocation, clocks, options structs and the producer side of
 * tickets. Nothing here is exported. */
#ifndef OI_CORE_H
#define OI_CORE_H

#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "openinfer/common.h"

#define OI_UNUSED(x) ((void)(x))
#define OI_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define OI_MIN(a, b) ((a) < (b) ? (a) : (b))
#define OI_MAX(a, b) ((a) > (b) ? (a) : (b))

/* Records `st` and a formatted message as the calling thread's last error and
 * returns `st`, so error paths read `return oi__fail(OI_ERR_..., "...")`. */
oi_status oi__fail(oi_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
oi_status oi__vfail(oi_status st, const char *fmt, va_list ap);

/* Logging. `component` is a short word ("device", "host"). */
bool oi__log_enabled(oi_log_level level);
void oi__log(oi_log_level level, const char *component, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
#define OI_LOG(level, component, ...)                                                              \
  do {                                                                                             \
    if (oi__log_enabled(level)) oi__log(level, component, __VA_ARGS__);                            \
  } while (0)
/* The same with the instance (engine) the event concerns, as its own field:
 * "level=info component=engine instance=3 msg=...". */
void oi__log_instance(oi_log_level level, const char *component, uint32_t instance, const char *fmt,
                      ...) __attribute__((format(printf, 4, 5)));
#define OI_LOG_I(level, component, instance, ...)                                                  \
  do {                                                                                             \
    if (oi__log_enabled(level)) oi__log_instance(level, component, instance, __VA_ARGS__);         \
  } while (0)

/* Runs the fatal handler, then aborts. Never returns. */
void oi__fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

/* Allocation (mimalloc). oi__free accepts NULL. */
void *oi__malloc(size_t bytes);
void *oi__calloc(size_t count, size_t size);
void *oi__realloc(void *p, size_t bytes);
void *oi__aligned_alloc(size_t alignment, size_t bytes);
char *oi__strdup(const char *s);
void oi__free(void *p);
/* A zeroed array for tables read at random (index tables, block records):
 * from 2 MiB, aligned to 2 MiB and its whole 2 MiB pages advised for
 * transparent huge pages, so a lookup does not pay a page walk per line (a
 * partly filled last page stays small pages: no memory is resident beyond
 * the array). Smaller sizes: oi__calloc. Freed with oi__free. */
void *oi__calloc_table(size_t bytes);
/* Grows the array *buf (capacity *cap elements of `elem` bytes) to hold at
 * least `need` elements, doubling, but never past `max` elements (false when
 * `need` exceeds it). On failure *buf and *cap are unchanged. */
bool oi__grow(void **buf, size_t *cap, size_t need, size_t elem, size_t max);

/* Latency histograms: OI_LATENCY_BUCKETS fixed log-scale buckets (see
 * host.h), updated with relaxed atomics (one clock read per operation at
 * each end, three atomic adds). */
typedef struct oi_latency_hist {
  _Atomic uint64_t buckets[OI_LATENCY_BUCKETS];
  _Atomic uint64_t sum_us;
} oi_latency_hist;
/* Bucket index of a latency of `us` microseconds: the smallest i with
 * us <= 2^i, or the last bucket. */
static inline uint32_t oi__latency_bucket(uint64_t us) {
  if (us <= 1) return 0;
  uint32_t i = 64u - (uint32_t)__builtin_clzll(us - 1);
  return i < OI_LATENCY_BUCKETS - 1 ? i : OI_LATENCY_BUCKETS - 1;
}
void oi__hist_record(oi_latency_hist *h, uint64_t elapsed_ns);
/* Copies the buckets (non-cumulative) and the sum. */
void oi__hist_read(const oi_latency_hist *h, uint64_t buckets[OI_LATENCY_BUCKETS],
                   uint64_t *sum_us);

/* Monotonic clock. */
uint64_t oi__now_ns(void);
/* Deadline helper: absolute monotonic ns `timeout_ms` from now; UINT64_MAX for
 * UINT32_MAX (forever). */
uint64_t oi__deadline_ns(uint32_t timeout_ms);
/* Milliseconds from now until `deadline_ns` (0 once it passed), capped below
 * UINT32_MAX so that a wait on it is always finite: a timeout for
 * oi_ticket_wait. */
uint32_t oi__ms_until(uint64_t deadline_ns);
/* `deadline_ns` (monotonic) as the timespec of a pthread_cond_timedwait on
 * a condition variable that uses CLOCK_MONOTONIC. */
struct timespec oi__timespec(uint64_t deadline_ns);
/* Initialises `cv` to use CLOCK_MONOTONIC: its timed
 * waits take oi__timespec deadlines. */
void oi__cond_init_monotonic(pthread_cond_t *cv);

/* Options structs ("struct_size" pattern). Copies the caller's struct `src`
 * (whose first field is uint32_t struct_size) into `dst` of the library's
 * size `dst_size`, which the caller already filled with defaults: only the
 * bytes the caller's struct_size covers are read. A caller struct larger than
 * the library knows is accepted only when the unknown tail is all zero
 * (a newer caller asking for nothing new). `what` names the struct in errors. */
oi_status oi__struct_in(void *dst, size_t dst_size, const void *src, const char *what);
/* Output structs: writes `src` (library size `src_size`) into the caller's
 * `dst`, only up to the caller's struct_size. */
oi_status oi__struct_out(void *dst, const void *src, size_t src_size, const char *what);
/* Smallest struct_size any caller may pass: the struct_size field itself. */
#define OI_STRUCT_MIN_SIZE sizeof(uint32_t)
/* The same, for a struct whose floor is above OI_STRUCT_MIN_SIZE: a caller
 * struct_size below `min_size` is refused with OI_ERR_INVALID_ARGUMENT and
 * nothing is read or written (docs/api.md, "Options and output structs"). */
oi_status oi__struct_in_min(void *dst, size_t dst_size, const void *src, size_t min_size,
                            const char *what);
oi_status oi__struct_out_min(void *dst, const void *src, size_t src_size, size_t min_size,
                             const char *what);
/* The end of `field` in `type`: a struct's floor is the end of its last
 * field as of the release that fixed its layout. */
#define OI_STRUCT_END(type, field) (offsetof(type, field) + sizeof(((type *)0)->field))
/* The floors (docs/api.md): the structs whose fields were put in their
 * place (reordered) in 0.1 accept no struct_size smaller than their whole
 * 0.1 layout, because a smaller one never described a prefix of it (a
 * caller built against the headers before the reordering must be rebuilt).
 * Fields appended in a later minor go after the cut, which stays. The other
 * structs' floor is OI_STRUCT_MIN_SIZE. */
#define OI_FLOOR_ENGINE_OPTIONS OI_STRUCT_END(oi_engine_options, arena_fd)
#define OI_FLOOR_SAVE_OPTIONS OI_STRUCT_END(oi_save_options, result)
#define OI_FLOOR_QUERY_RESULT OI_STRUCT_END(oi_query_result, reserved)
#define OI_FLOOR_ENGINE_STATS OI_STRUCT_END(oi_engine_stats, load_latency_sum_us)
#define OI_FLOOR_LOOKUP_OPTIONS OI_STRUCT_END(oi_lookup_options, probe_interval_ms)
#define OI_FLOOR_HOST_STATS OI_STRUCT_END(oi_host_stats, load_latency_sum_us)
#define OI_FLOOR_SERVER_OPTIONS OI_STRUCT_END(oi_server_options, metrics_addr)
#define OI_FLOOR_EXECUTOR_OPTIONS OI_STRUCT_END(oi_executor_options, fault_ctx)

/* Tickets, producer side. A new ticket holds two references: the producer's
 * (dropped by oi__ticket_complete) and the observer's (given to the caller,
 * dropped by oi_ticket_release). */
oi_ticket *oi__ticket_new(void);
void oi__ticket_retain(oi_ticket *t);
void oi__ticket_unref(oi_ticket *t);
/* Completes the ticket with `st` (first call wins; later calls only drop the
 * reference), wakes waiters, signals the eventfd, runs the callback, and drops
 * one producer reference. */
void oi__ticket_complete(oi_ticket *t, oi_status st);
/* As oi__ticket_complete, with the reason of a failure (st < 0; copied):
 * a wait or poll that returns it sets it as the caller's oi_last_error(). */
void oi__ticket_complete_msg(oi_ticket *t, oi_status st, const char *reason);
/* The operation missed its deadline while copies into its destination may
 * still land: poll answers OI_FENCING and waits return OI_ERR_TIMEOUT at
 * once until the producer completes the ticket (with OI_ERR_DEADLINE) once
 * they are fenced. Wakes waiters; a no-op on a completed ticket. */
void oi__ticket_fence(oi_ticket *t);
/* Waits for the final status, through a fencing state too (the library's
 * own waits that must outlast a deadline: a server's answer, a copy that
 * must end before its memory goes). */
oi_status oi__ticket_wait_final(oi_ticket *t);
/* Attaches a backend event the ticket owns; `destroy` runs when the ticket is
 * freed. */
void oi__ticket_set_cuda_event(oi_ticket *t, void *event, void (*destroy)(void *event));
/* Attaches a layered load's per-arena events (an oi__malloc'd array of n, each
 * entry possibly NULL); the ticket owns both; `destroy` frees each event. */
void oi__ticket_set_arena_events(oi_ticket *t, void **events, uint32_t n,
                                 void (*destroy)(void *event));
/* With per-arena events and no landing callbacks (CUDA), oi_ticket_arena_wait
 * / _poll ask `query` (OI_OK: the arena's copies ended; OI_PENDING) instead:
 * no host callback interrupts the load stream between arenas. */
void oi__ticket_set_arena_query(oi_ticket *t, oi_status (*query)(void *event));
/* A layered load of n arenas: oi_ticket_arena_wait / _poll follow each
 * arena (set before the first oi__ticket_arena_landed). */
void oi__ticket_arena_progress(oi_ticket *t, uint32_t n);
/* Arena `arena`'s copies ended with `st` (in the layout's order). */
void oi__ticket_arena_landed(oi_ticket *t, uint32_t arena, oi_status st);

#endif
