/* Log and fatal handlers: the only process-wide mutable state of the library. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/core.h"

static pthread_mutex_t handler_lock = PTHREAD_MUTEX_INITIALIZER;
static oi_log_fn log_fn;
static void *log_ctx;
static oi_fatal_fn fatal_fn;
static void *fatal_ctx;
static atomic_int log_level = -1; /* -1: not yet read from OI_LOG_LEVEL */

static const char *const level_names[] = {"trace", "debug", "info", "warn", "error", "off"};

static int level_from_env(void) {
  const char *env = getenv("OI_LOG_LEVEL");
  if (env) {
    for (int i = 0; i < (int)OI_ARRAY_LEN(level_names); i++)
      if (strcasecmp(env, level_names[i]) == 0) return i;
  }
  return OI_LOG_WARN;
}

static int current_level(void) {
  int lvl = atomic_load_explicit(&log_level, memory_order_relaxed);
  if (lvl < 0) {
    int expected = -1;
    lvl = level_from_env();
    if (!atomic_compare_exchange_strong(&log_level, &expected, lvl)) lvl = expected;
  }
  return lvl;
}

OI_API void oi_set_log_handler(oi_log_fn fn, void *ctx) {
  pthread_mutex_lock(&handler_lock);
  log_fn = fn;
  log_ctx = ctx;
  pthread_mutex_unlock(&handler_lock);
}

OI_API oi_status oi_set_log_level(oi_log_level level) {
  if ((int)level < OI_LOG_TRACE || level > OI_LOG_OFF)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "set_log_level: level %d is not an oi_log_level",
                    (int)level);
  atomic_store(&log_level, (int)level);
  return OI_OK;
}

OI_API oi_log_level oi_get_log_level(void) { return (oi_log_level)current_level(); }

bool oi__log_enabled(oi_log_level level) {
  return (int)level >= current_level() && level < OI_LOG_OFF;
}

/* One logfmt line: level, component, the instance when there is one (> 0),
 * and the message quoted (quotes and backslashes escaped, newlines folded). */
static void vlog(oi_log_level level, const char *component, uint32_t instance, const char *fmt,
                 va_list ap) {
  char msg[768], line[1024];
  vsnprintf(msg, sizeof msg, fmt, ap);
  char quoted[800];
  size_t q = 0;
  for (const char *p = msg; *p && q + 3 < sizeof quoted; p++) {
    if (*p == '"' || *p == '\\') quoted[q++] = '\\';
    quoted[q++] = (*p == '\n') ? ' ' : *p;
  }
  quoted[q] = '\0';
  if (instance)
    snprintf(line, sizeof line, "level=%s component=%s instance=%u msg=\"%s\"", level_names[level],
             component, instance, quoted);
  else
    snprintf(line, sizeof line, "level=%s component=%s msg=\"%s\"", level_names[level], component,
             quoted);
  pthread_mutex_lock(&handler_lock);
  oi_log_fn fn = log_fn;
  void *ctx = log_ctx;
  pthread_mutex_unlock(&handler_lock);
  if (fn)
    fn(ctx, level, line);
  else
    fprintf(stderr, "openinfer: %s\n", line);
}

void oi__log(oi_log_level level, const char *component, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vlog(level, component, 0, fmt, ap);
  va_end(ap);
}

void oi__log_instance(oi_log_level level, const char *component, uint32_t instance, const char *fmt,
                      ...) {
  va_list ap;
  va_start(ap, fmt);
  vlog(level, component, instance, fmt, ap);
  va_end(ap);
}

OI_API void oi_set_fatal_handler(oi_fatal_fn fn, void *ctx) {
  pthread_mutex_lock(&handler_lock);
  fatal_fn = fn;
  fatal_ctx = ctx;
  pthread_mutex_unlock(&handler_lock);
}

void oi__fatal(const char *fmt, ...) {
  char reason[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(reason, sizeof reason, fmt, ap);
  va_end(ap);
  oi__log(OI_LOG_ERROR, "fatal", "%s", reason);
  pthread_mutex_lock(&handler_lock);
  oi_fatal_fn fn = fatal_fn;
  void *ctx = fatal_ctx;
  pthread_mutex_unlock(&handler_lock);
  if (fn) fn(ctx, reason);
  abort();
}
