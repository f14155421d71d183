/* Backend selection by ordinal, and the public device/arena functions. */
#include <string.h>

#include "device/device.h"
#include "openinfer/experimental.h"

oi_status oi__dev_open(int ordinal, oi_dev **out) {
  if (!out) return oi__fail(OI_ERR_INVALID_ARGUMENT, "device_open: out is NULL");
  *out = NULL;
  if (ordinal == OI_DEVICE_CPU) return oi__cpu_dev_open(out);
  if (ordinal < -1)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "device %d is not an ordinal", ordinal);
  return oi__cuda_dev_open(ordinal, out);
}

void oi__dev_close(oi_dev *d) {
  if (d) d->ops->close(d);
}

OI_API oi_status oi_device_count(int *count) {
  if (!count) return oi__fail(OI_ERR_INVALID_ARGUMENT, "device_count: count is NULL");
  *count = oi__cuda_device_count();
  return OI_OK;
}

OI_API oi_status oi_device_get_info(int device, oi_device_info *info) {
  if (!info) return oi__fail(OI_ERR_INVALID_ARGUMENT, "device_get_info: info is NULL");
  oi_dev *d;
  oi_status st = oi__dev_open(device, &d);
  if (st != OI_OK) return st;
  oi_device_info full;
  memset(&full, 0, sizeof full);
  full.struct_size = sizeof full;
  full.device = device;
  st = d->ops->info(d, &full);
  oi__dev_close(d);
  if (st != OI_OK) return st;
  return oi__struct_out(info, &full, sizeof full, "device_get_info");
}

struct oi_imported_arena {
  oi_dev *dev;
  void *ptr;
  uint64_t size;
  void (*on_close)(void *ctx); /* see oi__imported_arena_on_close */
  void *on_close_ctx;
};

void oi__imported_arena_on_close(oi_imported_arena *a, void (*fn)(void *ctx), void *ctx) {
  a->on_close = fn;
  a->on_close_ctx = ctx;
}

OI_API oi_status oi_imported_arena_open(const oi_arena_handle *handle, uint64_t expected_bytes,
                                        int device, oi_imported_arena **out) {
  if (!out) return oi__fail(OI_ERR_INVALID_ARGUMENT, "imported_arena_open: out is NULL");
  *out = NULL;
  if (!handle) return oi__fail(OI_ERR_INVALID_ARGUMENT, "imported_arena_open: handle is NULL");
  if (expected_bytes == 0)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "imported_arena_open: expected_bytes is 0");
  oi_imported_arena *a = oi__calloc(1, sizeof *a);
  if (!a) return oi__fail(OI_ERR_OUT_OF_MEMORY, "imported_arena_open: out of memory");
  oi_status st = oi__dev_open(device, &a->dev);
  if (st != OI_OK) goto fail;
  st = a->dev->ops->mem_import(a->dev, handle, expected_bytes, &a->ptr, &a->size);
  if (st != OI_OK) goto fail;
  *out = a;
  return OI_OK;
fail:
  oi__dev_close(a->dev);
  oi__free(a);
  return st;
}

OI_API void *oi_imported_arena_ptr(const oi_imported_arena *a) { return a ? a->ptr : NULL; }

OI_API uint64_t oi_imported_arena_size(const oi_imported_arena *a) { return a ? a->size : 0; }

OI_API void oi_imported_arena_close(oi_imported_arena *a) {
  if (!a) return;
  a->dev->ops->mem_close_import(a->dev, a->ptr, a->size);
  if (a->on_close) a->on_close(a->on_close_ctx);
  oi__dev_close(a->dev);
  oi__free(a);
}

/* ---- experimental: device memory for tools and tests ------------------------- */

struct oi_device_buffer {
  oi_dev *dev;
  void *ptr;
};

OI_API oi_status oi_device_buffer_alloc(int device, uint64_t bytes, oi_device_buffer **out) {
  if (!out) return oi__fail(OI_ERR_INVALID_ARGUMENT, "device_buffer_alloc: out is NULL");
  *out = NULL;
  if (!bytes) return oi__fail(OI_ERR_INVALID_ARGUMENT, "device_buffer_alloc: 0 bytes");
  oi_device_buffer *b = oi__calloc(1, sizeof *b);
  if (!b) return oi__fail(OI_ERR_OUT_OF_MEMORY, "device_buffer_alloc: out of memory");
  oi_status st = oi__dev_open(device, &b->dev);
  if (st == OI_OK) st = b->dev->ops->mem_alloc(b->dev, (size_t)bytes, 0, &b->ptr);
  if (st != OI_OK) {
    oi__dev_close(b->dev);
    oi__free(b);
    return st;
  }
  *out = b;
  return OI_OK;
}

OI_API void *oi_device_buffer_ptr(const oi_device_buffer *b) { return b ? b->ptr : NULL; }

OI_API oi_status oi_device_buffer_copy(oi_device_buffer *b, void *dst, const void *src,
                                       uint64_t bytes) {
  if (!b || !dst || !src)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "device_buffer_copy: NULL argument");
  return b->dev->ops->mem_copy(b->dev, dst, src, (size_t)bytes);
}

OI_API void oi_device_buffer_free(oi_device_buffer *b) {
  if (!b) return;
  if (b->ptr) b->dev->ops->mem_free(b->dev, b->ptr);
  oi__dev_close(b->dev);
  oi__free(b);
}
