#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "core/core.h"
#include "core/fault.h"

uint64_t oi__now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return OI_FAULT_CLOCK((uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec);
}

uint64_t oi__deadline_ns(uint32_t timeout_ms) {
  if (timeout_ms == UINT32_MAX) return UINT64_MAX;
  return oi__now_ns() + (uint64_t)timeout_ms * 1000000ull;
}

uint32_t oi__ms_until(uint64_t deadline_ns) {
  uint64_t now = oi__now_ns();
  return now >= deadline_ns ? 0 : (uint32_t)OI_MIN((deadline_ns - now) / 1000000, 0xFFFFFFFEull);
}

struct timespec oi__timespec(uint64_t deadline_ns) {
  return (struct timespec){.tv_sec = (time_t)(deadline_ns / 1000000000ull),
                           .tv_nsec = (long)(deadline_ns % 1000000000ull)};
}

void oi__hist_record(oi_latency_hist *h, uint64_t elapsed_ns) {
  uint64_t us = elapsed_ns / 1000u;
  atomic_fetch_add_explicit(&h->buckets[oi__latency_bucket(us)], 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&h->sum_us, us, memory_order_relaxed);
}

void oi__hist_read(const oi_latency_hist *h, uint64_t buckets[OI_LATENCY_BUCKETS],
                   uint64_t *sum_us) {
  for (uint32_t i = 0; i < OI_LATENCY_BUCKETS; i++)
    buckets[i] = atomic_load_explicit((_Atomic uint64_t *)&h->buckets[i], memory_order_relaxed);
  *sum_us = atomic_load_explicit((_Atomic uint64_t *)&h->sum_us, memory_order_relaxed);
}

void oi__cond_init_monotonic(pthread_cond_t *cv) {
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(cv, &ca);
  pthread_condattr_destroy(&ca);
}
