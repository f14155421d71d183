/* Status names and the thread-local last-error message. */
#include <stdio.h>
#include <string.h>

#include "core/core.h"

static _Thread_local char last_error[1024];

OI_API const char *oi_status_str(oi_status st) {
  switch (st) {
  case OI_OK: return "OI_OK";
  case OI_PENDING: return "OI_PENDING";
  case OI_FENCING: return "OI_FENCING";
  case OI_ERR_INVALID_ARGUMENT: return "OI_ERR_INVALID_ARGUMENT";
  case OI_ERR_NOT_FOUND: return "OI_ERR_NOT_FOUND";
  case OI_ERR_OUT_OF_MEMORY: return "OI_ERR_OUT_OF_MEMORY";
  case OI_ERR_TIMEOUT: return "OI_ERR_TIMEOUT";
  case OI_ERR_CUDA: return "OI_ERR_CUDA";
  case OI_ERR_IO: return "OI_ERR_IO";
  case OI_ERR_PROTOCOL: return "OI_ERR_PROTOCOL";
  case OI_ERR_STATE: return "OI_ERR_STATE";
  case OI_ERR_LEASE_EXPIRED: return "OI_ERR_LEASE_EXPIRED";
  case OI_ERR_CLOSED: return "OI_ERR_CLOSED";
  case OI_ERR_UNSUPPORTED: return "OI_ERR_UNSUPPORTED";
  case OI_ERR_PERMISSION: return "OI_ERR_PERMISSION";
  case OI_ERR_VERSION: return "OI_ERR_VERSION";
  case OI_ERR_INTERNAL: return "OI_ERR_INTERNAL";
  case OI_ERR_NO_DEVICE: return "OI_ERR_NO_DEVICE";
  case OI_ERR_BUSY: return "OI_ERR_BUSY";
  case OI_ERR_DEADLINE: return "OI_ERR_DEADLINE";
  default: return "OI_ERR_UNKNOWN";
  }
}

OI_API const char *oi_last_error(void) { return last_error; }

OI_API void oi_clear_error(void) { last_error[0] = '\0'; }

oi_status oi__vfail(oi_status st, const char *fmt, va_list ap) {
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  OI_LOG(OI_LOG_DEBUG, "error", "%s: %s", oi_status_str(st), last_error);
  return st;
}

oi_status oi__fail(oi_status st, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  oi__vfail(st, fmt, ap);
  va_end(ap);
  return st;
}

OI_API oi_status oi_set_last_error(oi_status st, const char *msg) {
  return oi__fail(st, "%s", msg ? msg : "");
}
