/* The core services the reference model uses, as libopeninfer-refmodel.so
 * provides them: that library links libopeninfer.so, whose internals are
 * hidden, so its errors go to libopeninfer's thread-local last error through
 * the exported oi_set_last_error (oi_last_error() reads them as for any
 * call), its log lines follow libopeninfer's level (oi_get_log_level) and go
 * to stderr in the library's logfmt (not through a handler set with
 * oi_set_log_handler), and allocation and struct_size handling are
 * core/alloc.c and core/options.c compiled into it. Programs that link the
 * static archives (tests, openinfer-bench) take core's own instead. */
#include <stdio.h>

#include "core/core.h"
#include "openinfer/experimental.h"

/* Compiled into libopeninfer-refmodel.so only, which the coverage stage
 * (the static archives) does not run; the abi and bindings suites do. */
// GCOVR_EXCL_START

oi_status oi__vfail(oi_status st, const char *fmt, va_list ap) {
  char msg[1024];
  vsnprintf(msg, sizeof msg, fmt, ap);
  return oi_set_last_error(st, msg);
}

oi_status oi__fail(oi_status st, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  oi__vfail(st, fmt, ap);
  va_end(ap);
  return st;
}

bool oi__log_enabled(oi_log_level level) {
  return level >= oi_get_log_level() && level < OI_LOG_OFF;
}

void oi__log(oi_log_level level, const char *component, const char *fmt, ...) {
  static const char *const names[] = {"trace", "debug", "info", "warn", "error", "off"};
  char msg[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "openinfer: level=%s component=%s msg=\"%s\"\n",
          names[level <= OI_LOG_OFF ? level : OI_LOG_OFF], component, msg);
}
// GCOVR_EXCL_STOP
