#ifndef OI_DEVICE_HOSTMEM_H
#define OI_DEVICE_HOSTMEM_H

#include "device/device.h"

#define OI_HUGEPAGE_BYTES (2ull << 20)

/* Maps `bytes` of zeroed, pre-touched anonymous memory (OI_PIN_HUGEPAGES:
 * on 2 MiB pages, failing with the count needed and free), bound to
 * `numa_node` (-1: anywhere), touched by parallel threads. *mapped receives
 * the length to pass to oi__host_unmap. */
oi_status oi__host_map(size_t bytes, uint32_t flags, int numa_node, void **out, size_t *mapped);
void oi__host_unmap(void *p, size_t mapped);

/* Memory the machine can give now: MemAvailable, capped by the memory
 * cgroup's room; *why names the bound that decided. oi__host_map refuses a
 * larger (non-hugepage) request before touching a page. */
uint64_t oi__host_memory_available(const char **why);

/* Progress of the touch phase of oi__host_map on the calling thread (the
 * host's creation sets it around pinned_alloc): fn(ctx, done, total) about
 * every 100 ms while done < total. NULL: log at INFO every second instead. */
void oi__host_map_set_progress(void (*fn)(void *ctx, uint64_t done, uint64_t total), void *ctx);

#endif
