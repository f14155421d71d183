/*
 * libopeninfer — devices and imported arenas.
 *
 * Device ordinal -1 is the cpu backend ("device" memory is host memory,
 * copies are memcpy on worker threads); 0..n-1 are CUDA devices when the
 * library was built with the cuda backend.
 */
#ifndef OPENINFER_DEVICE_H
#define OPENINFER_DEVICE_H

#include "openinfer/common.h"

#ifdef __cplusplus
extern "C" {
#endif

#define OI_DEVICE_CPU (-1)

typedef enum oi_backend_kind {
  OI_BACKEND_CPU = 0,
  OI_BACKEND_CUDA = 1,
} oi_backend_kind;

/* Output struct: set struct_size = sizeof(oi_device_info) before the call;
 * the library writes only the fields the caller's struct_size covers. */
typedef struct oi_device_info {
  uint32_t struct_size;
  int32_t device;               /* the ordinal asked for */
  uint32_t backend;             /* oi_backend_kind */
  char name[96];                /* "cpu" or the GPU's name */
  uint64_t total_memory;        /* bytes of device memory (host RAM for cpu) */
  int32_t numa_node;            /* host NUMA node closest to the device, -1 unknown */
  uint32_t compute_capability;  /* major * 10 + minor; 0 for cpu */
  uint32_t can_map_host_memory; /* kernels may use registered host pointers */
  uint32_t multiprocessors;     /* SMs (cuda) or online cpus */
  char pci_bus_id[16];          /* "0000:3b:00.0", empty for cpu */
} oi_device_info;

/* Number of CUDA devices visible to this process; 0 without a GPU, without a
 * driver, or when the library was built without the cuda backend. */
OI_API oi_status oi_device_count(int *count);

/* Describes device `device` (-1: the cpu backend).
 * @return OI_ERR_NO_DEVICE for an ordinal that does not exist. */
OI_API oi_status oi_device_get_info(int device, oi_device_info *info);

/* An arena exported by another process (the sidecar server) and mapped into
 * this one. Must stay open for as long as anything uses its memory, and be
 * closed before the owner frees it (see docs/api.md, drop order). */
typedef struct oi_imported_arena oi_imported_arena;

/* Maps the arena named by `handle` on `device` (-1: a cpu shared-memory
 * arena). Verifies that the real allocation is at least `expected_bytes`;
 * an under-sized allocation is refused with OI_ERR_PROTOCOL and nothing stays
 * mapped. */
OI_API oi_status oi_imported_arena_open(const oi_arena_handle *handle, uint64_t expected_bytes,
                                        int device, oi_imported_arena **out);
/* Base address (a device pointer on cuda). NULL for a NULL arena. */
OI_API void *oi_imported_arena_ptr(const oi_imported_arena *a);
/* The verified size in bytes (the real allocation's, >= expected_bytes). */
OI_API uint64_t oi_imported_arena_size(const oi_imported_arena *a);
/* Unmaps. Accepts NULL. */
OI_API void oi_imported_arena_close(oi_imported_arena *a);

#ifdef __cplusplus
}
#endif
#endif
