/* Fault injection (see fault.h). Always compiled so tests can ask whether it
 * is available; arming fails with OI_ERR_UNSUPPORTED without the option. */
#include "core/fault.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"

#ifdef OI_FAULT_INJECTION

static const char *const names[OI_FAULT_POINTS] = {
    [OI_FAULT_HOST_ALLOC] = "host_alloc",
    [OI_FAULT_PINNED_ALLOC] = "pinned_alloc",
    [OI_FAULT_PIN_REGISTER] = "pin_register",
    [OI_FAULT_COPY_FAIL] = "copy_fail",
    [OI_FAULT_COPY_PARTIAL] = "copy_partial",
    [OI_FAULT_COPY_SLOW] = "copy_slow",
    [OI_FAULT_SOCK_SHORT] = "sock_short",
    [OI_FAULT_SOCK_RESET] = "sock_reset",
    [OI_FAULT_CLOCK_JUMP] = "clock_jump",
    [OI_FAULT_DISK_WRITE] = "disk_write",
    [OI_FAULT_DISK_READ] = "disk_read",
    [OI_FAULT_DISK_SHORT_READ] = "disk_short_read",
    [OI_FAULT_DISK_FALLOCATE] = "disk_fallocate",
    [OI_FAULT_DISK_READ_SLOW] = "disk_read_slow",
    [OI_FAULT_DISK_SHORT_WRITE] = "disk_short_write",
    [OI_FAULT_DISK_WRITE_SLOW] = "disk_write_slow",
    [OI_FAULT_COPY_SUBMIT] = "copy_submit",
    [OI_FAULT_COMPLETION_SUBMIT] = "completion_submit",
    [OI_FAULT_SESSION_START] = "session_start",
    [OI_FAULT_LEASE_ALLOC] = "lease_alloc",
    [OI_FAULT_RESERVE_GAP] = "reserve_gap",
    [OI_FAULT_DISK_SYNC] = "disk_sync",
    [OI_FAULT_DISK_LOG_WRITE] = "disk_log_write",
    [OI_FAULT_LOAD_MARK_GAP] = "load_mark_gap",
};

static oi_status arm_spec(const char *spec,
                          oi_status (*arm)(oi_fault_point, uint64_t, uint64_t, uint64_t));

/* One point: hits counted since it was armed, and how many fired. */
typedef struct fault_state {
  atomic_bool armed;
  atomic_uint_fast64_t hits, fired;
  atomic_uint_fast64_t after, count, param;
} fault_state;

static fault_state points[OI_FAULT_POINTS];
static atomic_uint_fast64_t clock_offset_ns;
static pthread_once_t env_once = PTHREAD_ONCE_INIT;

static oi_status arm_now(oi_fault_point point, uint64_t after_n, uint64_t count, uint64_t param);

/* arm_spec's dry run: every item parses and names a point. */
static oi_status arm_check(oi_fault_point point, uint64_t after_n, uint64_t count, uint64_t param) {
  OI_UNUSED(point);
  OI_UNUSED(after_n);
  OI_UNUSED(count);
  OI_UNUSED(param);
  return OI_OK;
}

/* Runs once, at the first hit or arming. No logging here: the logger reads
 * the clock, and the clock is a fault point. */
static void read_env(void) {
  const char *spec = getenv("OI_FAULTS");
  if (!spec || !*spec) return;
  /* The whole spec is checked before any item is armed: one that is
   * ignored arms nothing. */
  if (arm_spec(spec, arm_check) != OI_OK) {
    fprintf(stderr, "openinfer: OI_FAULTS='%s' ignored: %s\n", spec, oi_last_error());
    return;
  }
  arm_spec(spec, arm_now);
  fprintf(stderr, "openinfer: fault injection armed from OI_FAULTS='%s'\n", spec);
}

bool oi__fault_available(void) { return true; }

oi_status oi__fault_arm(oi_fault_point point, uint64_t after_n, uint64_t count, uint64_t param) {
  pthread_once(&env_once, read_env); /* the environment first: an explicit arming wins */
  return arm_now(point, after_n, count, param);
}

static oi_status arm_now(oi_fault_point point, uint64_t after_n, uint64_t count, uint64_t param) {
  if ((unsigned)point >= OI_FAULT_POINTS)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "fault_arm: no fault point %d", (int)point);
  fault_state *f = &points[point];
  atomic_store(&f->armed, false);
  atomic_store(&f->after, after_n);
  atomic_store(&f->count, count);
  atomic_store(&f->param, param);
  atomic_store(&f->hits, 0);
  atomic_store(&f->fired, 0);
  atomic_store(&f->armed, true);
  return OI_OK;
}

void oi__fault_disarm(oi_fault_point point) {
  if ((unsigned)point < OI_FAULT_POINTS) atomic_store(&points[point].armed, false);
}

bool oi__fault_hit(oi_fault_point point, uint64_t *param) {
  pthread_once(&env_once, read_env);
  fault_state *f = &points[point];
  if (!atomic_load_explicit(&f->armed, memory_order_acquire)) return false;
  uint64_t n = atomic_fetch_add(&f->hits, 1);
  uint64_t after = atomic_load(&f->after), count = atomic_load(&f->count);
  if (n < after || (count && n - after >= count)) return false;
  atomic_fetch_add(&f->fired, 1);
  if (param) *param = atomic_load(&f->param);
  return true;
}

uint64_t oi__fault_fired(oi_fault_point point) {
  return (unsigned)point < OI_FAULT_POINTS ? atomic_load(&points[point].fired) : 0;
}

uint64_t oi__fault_clock_offset_ns(void) { return atomic_load(&clock_offset_ns); }

uint64_t oi__fault_clock(uint64_t ns) {
  uint64_t ms = 0;
  if (oi__fault_hit(OI_FAULT_CLOCK_JUMP, &ms))
    return ns + atomic_fetch_add(&clock_offset_ns, ms * 1000000ull) + ms * 1000000ull;
  return ns + atomic_load_explicit(&clock_offset_ns, memory_order_relaxed);
}

#else

bool oi__fault_available(void) { return false; }

oi_status oi__fault_arm(oi_fault_point point, uint64_t after_n, uint64_t count, uint64_t param) {
  OI_UNUSED(point);
  OI_UNUSED(after_n);
  OI_UNUSED(count);
  OI_UNUSED(param);
  return oi__fail(OI_ERR_UNSUPPORTED,
                  "fault injection is not compiled in (-Dfault_injection=true)");
}

void oi__fault_disarm(oi_fault_point point) { OI_UNUSED(point); }
uint64_t oi__fault_fired(oi_fault_point point) {
  OI_UNUSED(point);
  return 0;
}
uint64_t oi__fault_clock_offset_ns(void) { return 0; }
uint64_t oi__fault_clock(uint64_t ns) { return ns; }

#endif

void oi__fault_disarm_all(void) {
  for (int i = 0; i < OI_FAULT_POINTS; i++)
    oi__fault_disarm((oi_fault_point)i);
}

#ifdef OI_FAULT_INJECTION

/* "name[:after[:count[:param]]]" items separated by commas (OI_FAULTS). */
static oi_status arm_spec(const char *spec,
                          oi_status (*arm)(oi_fault_point, uint64_t, uint64_t, uint64_t)) {
  if (!spec) return oi__fail(OI_ERR_INVALID_ARGUMENT, "fault spec is NULL");
  const char *p = spec;
  while (*p) {
    const char *end = strchr(p, ',');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    char item[128];
    if (len == 0 || len >= sizeof item) {
      if (len == 0 && end) {
        p = end + 1;
        continue;
      }
      return oi__fail(OI_ERR_INVALID_ARGUMENT, "fault spec: bad item in '%s'", spec);
    }
    memcpy(item, p, len);
    item[len] = '\0';
    uint64_t v[3] = {0, 0, 0};
    char *colon = strchr(item, ':');
    if (colon) {
      *colon = '\0';
      char *q = colon + 1;
      for (int i = 0; i < 3 && *q; i++) {
        char *e;
        v[i] = strtoull(q, &e, 10);
        if (e == q || (*e && *e != ':'))
          return oi__fail(OI_ERR_INVALID_ARGUMENT, "fault spec: '%s' is not a number list",
                          colon + 1);
        q = *e ? e + 1 : e;
      }
    }
    int point = -1;
    for (int i = 0; i < OI_FAULT_POINTS; i++)
      if (!strcmp(item, names[i])) point = i;
    if (point < 0)
      return oi__fail(OI_ERR_INVALID_ARGUMENT, "fault spec: no fault point '%s'", item);
    oi_status st = arm((oi_fault_point)point, v[0], v[1], v[2]);
    if (st != OI_OK) return st;
    p = end ? end + 1 : p + len;
  }
  return OI_OK;
}

#endif
