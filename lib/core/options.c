/* The struct_size pattern: old callers pass smaller structs, new callers may
 * pass larger ones; the library reads and writes only the common prefix. */
#include <string.h>

#include "core/core.h"

oi_status oi__struct_in(void *dst, size_t dst_size, const void *src, const char *what) {
  return oi__struct_in_min(dst, dst_size, src, OI_STRUCT_MIN_SIZE, what);
}

oi_status oi__struct_out(void *dst, const void *src, size_t src_size, const char *what) {
  return oi__struct_out_min(dst, src, src_size, OI_STRUCT_MIN_SIZE, what);
}

oi_status oi__struct_in_min(void *dst, size_t dst_size, const void *src, size_t min_size,
                            const char *what) {
  if (!src) return oi__fail(OI_ERR_INVALID_ARGUMENT, "%s: options pointer is NULL", what);
  uint32_t caller_size;
  memcpy(&caller_size, src, sizeof caller_size);
  if (caller_size < OI_STRUCT_MIN_SIZE)
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "%s: struct_size %u is too small (call the *_init function first)", what,
                    caller_size);
  if (caller_size < min_size)
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "%s: struct_size %u is smaller than this struct's 0.1 layout (%zu bytes): "
                    "rebuild against the current headers",
                    what, caller_size, min_size);
  if (caller_size > dst_size) {
    const uint8_t *tail = (const uint8_t *)src + dst_size;
    for (size_t i = 0; i < caller_size - dst_size; i++)
      if (tail[i] != 0)
        return oi__fail(OI_ERR_UNSUPPORTED,
                        "%s: caller's struct (%u bytes) sets fields this library (%zu bytes) "
                        "does not know; upgrade libopeninfer",
                        what, caller_size, dst_size);
  }
  size_t n = OI_MIN((size_t)caller_size, dst_size);
  memcpy(dst, src, n);
  uint32_t own = (uint32_t)dst_size;
  memcpy(dst, &own, sizeof own);
  return OI_OK;
}

oi_status oi__struct_out_min(void *dst, const void *src, size_t src_size, size_t min_size,
                             const char *what) {
  if (!dst) return oi__fail(OI_ERR_INVALID_ARGUMENT, "%s: output pointer is NULL", what);
  uint32_t caller_size;
  memcpy(&caller_size, dst, sizeof caller_size);
  if (caller_size < OI_STRUCT_MIN_SIZE)
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "%s: struct_size %u is too small (set it to sizeof the struct)", what,
                    caller_size);
  if (caller_size < min_size)
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "%s: struct_size %u is smaller than this struct's 0.1 layout (%zu bytes): "
                    "rebuild against the current headers",
                    what, caller_size, min_size);
  size_t n = OI_MIN((size_t)caller_size, src_size);
  /* Keep the caller's struct_size: it describes the caller's struct. */
  memcpy((uint8_t *)dst + sizeof caller_size, (const uint8_t *)src + sizeof caller_size,
         n - sizeof caller_size);
  return OI_OK;
}
