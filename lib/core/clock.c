#include <time.h>

#include "core.h"

uint64_t oi__now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t oi__deadline_ns(uint32_t timeout_ms) {
  if (timeout_ms == UINT32_MAX) return UINT64_MAX;
  return oi__now_ns() + (uint64_t)timeout_ms * 1000000ull;
}
