/* The cuda backend: device memory, pinned host memory, streams with
 * priorities, IPC export/import of arenas. Driver-API entry points come from
 * cudart (cudaGetDriverEntryPointByVersion) so the library loads on machines
 * without a driver and simply reports no devices there.
 *
 * Files (cuda_internal.h): this one opens the device and holds its memory
 * and the ops table; cuda_stream.c the streams, cuda_stage.c staged copies. */
#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "core/fault.h"
#include "cuda_internal.h"
#include "hostmem.h"

enum { PIN_CUDA_HOST_ALLOC = 1, PIN_REGISTERED = 2, PIN_PAGEABLE = 3 };

oi_status oi__cuda_fail(cudaError_t err, const char *what) {
  cudaGetLastError(); /* clear a non-sticky error so later calls are not poisoned */
  return oi__fail(OI_ERR_CUDA, "%s: %s (%s)", what, cudaGetErrorString(err), cudaGetErrorName(err));
}

static oi_status drv_fail(const cuda_dev *cd, CUresult r, const char *what) {
  const char *msg = NULL;
  if (cd->drv.error_string) cd->drv.error_string(r, &msg);
  return oi__fail(OI_ERR_CUDA, "%s: driver error %d (%s)", what, (int)r, msg ? msg : "?");
}

oi_status oi__cuda_use_device(const oi_dev *d) {
  cudaError_t err = cudaSetDevice(d->ordinal);
  if (err != cudaSuccess) return oi__cuda_fail(err, "cudaSetDevice");
  return OI_OK;
}

static oi_status load_driver_api(driver_api *api) {
  struct {
    const char *name;
    void **slot;
  } syms[] = {
      {"cuIpcOpenMemHandle", (void **)&api->ipc_open},
      {"cuIpcCloseMemHandle", (void **)&api->ipc_close},
      {"cuMemGetAddressRange", (void **)&api->addr_range},
      {"cuMemHostRegister", (void **)&api->host_register},
      {"cuMemHostUnregister", (void **)&api->host_unregister},
      {"cuGetErrorString", (void **)&api->error_string},
  };
  for (size_t i = 0; i < OI_ARRAY_LEN(syms); i++) {
    enum cudaDriverEntryPointQueryResult q;
    cudaError_t err =
        cudaGetDriverEntryPointByVersion(syms[i].name, syms[i].slot, 12000, cudaEnableDefault, &q);
    if (err != cudaSuccess || q != cudaDriverEntryPointSuccess || !*syms[i].slot) {
      cudaGetLastError();
      return oi__fail(OI_ERR_CUDA, "cuda: driver entry point %s not found", syms[i].name);
    }
  }
  return OI_OK;
}

int oi__cuda_device_count(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

/* ---- memory ------------------------------------------------------------ */

static oi_status cuda_mem_alloc(oi_dev *d, size_t bytes, uint32_t flags, void **out) {
  OI_UNUSED(flags); /* cudaMalloc memory is always IPC-exportable */
  if (!out || bytes == 0)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "cuda mem_alloc: %s",
                    out ? "bytes is 0" : "out is NULL");
  oi_status st = oi__cuda_use_device(d);
  if (st != OI_OK) return st;
  void *p = NULL;
  cudaError_t err = cudaMalloc(&p, bytes);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return oi__fail(OI_ERR_OUT_OF_MEMORY, "cuda mem_alloc: cudaMalloc(%zu) on device %d: %s", bytes,
                    d->ordinal, cudaGetErrorString(err));
  }
  err = cudaMemset(p, 0, bytes);
  if (err == cudaSuccess) err = cudaDeviceSynchronize();
  if (err != cudaSuccess) {
    cudaFree(p);
    return oi__cuda_fail(err, "cuda mem_alloc: zero-fill");
  }
  *out = p;
  return OI_OK;
}

static void cuda_mem_free(oi_dev *d, void *p) {
  if (!p || oi__cuda_use_device(d) != OI_OK) return;
  cudaError_t err = cudaFree(p);
  if (err != cudaSuccess)
    OI_LOG(OI_LOG_ERROR, "device", "cudaFree(%p) on device %d: %s", p, d->ordinal,
           cudaGetErrorString(err));
}

static oi_status cuda_mem_copy(oi_dev *d, void *dst, const void *src, size_t bytes) {
  if (bytes && (!dst || !src))
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "cuda mem_copy: NULL pointer");
  oi_status st = oi__cuda_use_device(d);
  if (st != OI_OK) return st;
  cudaError_t err = cudaMemcpy(dst, src, bytes, cudaMemcpyDefault);
  return err == cudaSuccess ? OI_OK : oi__cuda_fail(err, "cuda mem_copy");
}

static oi_status cuda_mem_fill_pattern(oi_dev *d, void *dst, size_t bytes, uint64_t seed) {
  oi_status st = oi__cuda_use_device(d);
  if (st != OI_OK) return st;
  cudaError_t err = (cudaError_t)oi_kernel_fill_pattern(dst, bytes, seed, NULL);
  if (err == cudaSuccess) err = cudaDeviceSynchronize();
  return err == cudaSuccess ? OI_OK : oi__cuda_fail(err, "cuda fill_pattern");
}

static oi_status cuda_mem_export(oi_dev *d, void *p, oi_arena_handle *out) {
  oi_status st = oi__cuda_use_device(d);
  if (st != OI_OK) return st;
  _Static_assert(sizeof(cudaIpcMemHandle_t) == sizeof(oi_arena_handle), "IPC handle is 64 bytes");
  cudaIpcMemHandle_t h;
  cudaError_t err = cudaIpcGetMemHandle(&h, p);
  if (err != cudaSuccess) return oi__cuda_fail(err, "cuda mem_export: cudaIpcGetMemHandle");
  memcpy(out->bytes, &h, sizeof h);
  return OI_OK;
}

static oi_status cuda_mem_import(oi_dev *d, const oi_arena_handle *h, uint64_t expected, void **ptr,
                                 uint64_t *size) {
  cuda_dev *cd = (cuda_dev *)d;
  oi_status st = oi__cuda_use_device(d);
  if (st != OI_OK) return st;
  cudaFree(NULL); /* make the primary context current for the driver API */
  CUipcMemHandle ch;
  memcpy(&ch, h->bytes, sizeof ch);
  CUdeviceptr dptr = 0;
  CUresult r = cd->drv.ipc_open(&dptr, ch, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  if (r != CUDA_SUCCESS) return drv_fail(cd, r, "arena import: cuIpcOpenMemHandle");
  CUdeviceptr base = 0;
  size_t real = 0;
  r = cd->drv.addr_range(&base, &real, dptr);
  if (r != CUDA_SUCCESS) {
    cd->drv.ipc_close(dptr);
    return drv_fail(cd, r, "arena import: cuMemGetAddressRange");
  }
  struct cudaPointerAttributes attr;
  cudaError_t aerr = cudaPointerGetAttributes(&attr, (void *)(uintptr_t)dptr);
  if (aerr != cudaSuccess || attr.device != d->ordinal) {
    cd->drv.ipc_close(dptr);
    if (aerr != cudaSuccess) return oi__cuda_fail(aerr, "arena import: cudaPointerGetAttributes");
    return oi__fail(OI_ERR_PROTOCOL,
                    "arena import: the allocation behind the handle lives on device %d, not %d",
                    attr.device, d->ordinal);
  }
  if (base != dptr || real < expected) {
    cd->drv.ipc_close(dptr);
    return oi__fail(OI_ERR_PROTOCOL,
                    "arena import: the allocation behind the handle holds %zu bytes from "
                    "its base, %llu expected",
                    real - (size_t)(dptr - base), (unsigned long long)expected);
  }
  *ptr = (void *)(uintptr_t)dptr;
  *size = real;
  return OI_OK;
}

static oi_status cuda_mem_export_range(oi_dev *d, void *p, uint64_t bytes, oi_arena_handle *out,
                                       uint64_t *offset) {
  cuda_dev *cd = (cuda_dev *)d;
  if (!p || !out || !offset || bytes == 0)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "arena export: NULL pointer or 0 bytes");
  oi_status st = oi__cuda_use_device(d);
  if (st != OI_OK) return st;
  cudaFree(NULL); /* make the primary context current for the driver API */
  struct cudaPointerAttributes attr;
  cudaError_t err = cudaPointerGetAttributes(&attr, p);
  if (err != cudaSuccess) return oi__cuda_fail(err, "arena export: cudaPointerGetAttributes");
  if (attr.type != cudaMemoryTypeDevice || attr.device != d->ordinal)
    return oi__fail(
        OI_ERR_INVALID_ARGUMENT,
        "arena export: %p is not device memory of device %d (memory type %d, device %d)", p,
        d->ordinal, (int)attr.type, attr.device);
  CUdeviceptr base = 0;
  size_t size = 0;
  CUresult r = cd->drv.addr_range(&base, &size, (CUdeviceptr)(uintptr_t)p);
  if (r != CUDA_SUCCESS) return drv_fail(cd, r, "arena export: cuMemGetAddressRange");
  uint64_t off = (uint64_t)((CUdeviceptr)(uintptr_t)p - base);
  if (off > size || bytes > size - off)
    return oi__fail(
        OI_ERR_INVALID_ARGUMENT,
        "arena export: [%p, +%llu) reaches past its allocation (%zu bytes, %p at offset "
        "%llu)",
        p, (unsigned long long)bytes, size, p, (unsigned long long)off);
  _Static_assert(sizeof(cudaIpcMemHandle_t) == sizeof(oi_arena_handle), "IPC handle is 64 bytes");
  cudaIpcMemHandle_t h;
  err = cudaIpcGetMemHandle(&h, (void *)(uintptr_t)base);
  if (err != cudaSuccess)
    return oi__cuda_fail(
        err, "arena export: cudaIpcGetMemHandle (memory from cudaMalloc is needed; "
             "stream-ordered pools and cuMemCreate memory cannot be exported this way)");
  memcpy(out->bytes, &h, sizeof h);
  *offset = off;
  return OI_OK;
}

static void cuda_mem_close_import(oi_dev *d, void *ptr, uint64_t size) {
  OI_UNUSED(size);
  cuda_dev *cd = (cuda_dev *)d;
  if (!ptr || oi__cuda_use_device(d) != OI_OK) return;
  CUresult r = cd->drv.ipc_close((CUdeviceptr)(uintptr_t)ptr);
  if (r != CUDA_SUCCESS)
    OI_LOG(OI_LOG_ERROR, "device", "cuIpcCloseMemHandle(%p) failed: %d", ptr, (int)r);
}

/* ---- pinned host memory -------------------------------------------------- */

static oi_status cuda_pinned_alloc(oi_dev *d, size_t bytes, uint32_t flags, int numa_node,
                                   oi_pinned *out) {
  cuda_dev *cd = (cuda_dev *)d;
  if (!out || bytes == 0)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "pinned_alloc: %s",
                    out ? "bytes is 0" : "out is NULL");
  oi_status st = oi__cuda_use_device(d);
  if (st != OI_OK) return st;
  memset(out, 0, sizeof *out);
  out->flags = flags;
  if (flags & OI_PIN_NO_PIN) {
    st = oi__host_map(bytes, flags, numa_node, &out->host, &out->bytes);
    if (st != OI_OK) return st;
    out->device = NULL; /* pageable: copy engines only */
    out->how = PIN_PAGEABLE;
    return OI_OK;
  }
  /* mmap + parallel NUMA-local touch + cuMemHostRegister: sets up large pools
   * at memory speed (cudaHostAlloc touches on one thread); the driver API
   * leaves no sticky runtime error when registration fails. */
  st = oi__host_map(bytes, flags, numa_node, &out->host, &out->bytes);
  if (st != OI_OK) return st;
  if (OI_FAULT(OI_FAULT_PIN_REGISTER, NULL)) {
    oi__host_unmap(out->host, out->bytes);
    return oi__fail(OI_ERR_CUDA, "pinned_alloc: cuMemHostRegister failed (injected fault)");
  }
  uint64_t t0 = oi__now_ns();
  CUresult r = cd->drv.host_register(out->host, out->bytes,
                                     CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP);
  if (r == CUDA_SUCCESS) {
    out->how = PIN_REGISTERED;
    OI_LOG(OI_LOG_INFO, "device", "registered %.2f GiB with the driver in %.3f s",
           (double)out->bytes / (1ull << 30), (double)(oi__now_ns() - t0) / 1e9);
  } else if (flags & OI_PIN_HUGEPAGES) {
    oi__host_unmap(out->host, out->bytes);
    return drv_fail(cd, r, "pinned_alloc: cuMemHostRegister");
  } else {
    const char *why = NULL;
    if (cd->drv.error_string) cd->drv.error_string(r, &why);
    OI_LOG(OI_LOG_WARN, "device", "cuMemHostRegister failed (%s); falling back to cudaHostAlloc",
           why ? why : "?");
    oi__host_unmap(out->host, out->bytes);
    cudaError_t err = cudaHostAlloc(&out->host, bytes, cudaHostAllocPortable | cudaHostAllocMapped);
    if (err != cudaSuccess) {
      cudaGetLastError();
      return oi__fail(OI_ERR_OUT_OF_MEMORY, "pinned_alloc: cudaHostAlloc(%zu): %s", bytes,
                      cudaGetErrorString(err));
    }
    out->bytes = bytes;
    out->how = PIN_CUDA_HOST_ALLOC;
  }
  cudaError_t err = cudaHostGetDevicePointer(&out->device, out->host, 0);
  if (err != cudaSuccess) {
    cudaGetLastError();
    out->device = out->host; /* unified addressing: the host pointer works in kernels */
  }
  return OI_OK;
}

static void cuda_pinned_free(oi_dev *d, oi_pinned *p) {
  cuda_dev *cd = (cuda_dev *)d;
  if (!p || !p->host) return;
  oi__cuda_use_device(d);
  switch (p->how) {
  case PIN_CUDA_HOST_ALLOC: cudaFreeHost(p->host); break;
  case PIN_REGISTERED:
    cd->drv.host_unregister(p->host);
    oi__host_unmap(p->host, p->bytes);
    break;
  default: oi__host_unmap(p->host, p->bytes); break;
  }
  memset(p, 0, sizeof *p);
}

/* ---- device -------------------------------------------------------------- */

static int numa_node_of(const char *pci_bus_id) {
  char path[128], lower[32];
  size_t i = 0;
  for (; pci_bus_id[i] && i < sizeof lower - 1; i++)
    lower[i] = (char)tolower((unsigned char)pci_bus_id[i]);
  lower[i] = '\0';
  snprintf(path, sizeof path, "/sys/bus/pci/devices/%s/numa_node", lower);
  int node = -1;
  FILE *f = fopen(path, "r");
  if (f) {
    if (fscanf(f, "%d", &node) != 1) node = -1;
    fclose(f);
  }
  return node;
}

static oi_status cuda_info(oi_dev *d, oi_device_info *out) {
  struct cudaDeviceProp prop;
  cudaError_t err = cudaGetDeviceProperties(&prop, d->ordinal);
  if (err != cudaSuccess) return oi__cuda_fail(err, "cudaGetDeviceProperties");
  out->backend = OI_BACKEND_CUDA;
  snprintf(out->name, sizeof out->name, "%.95s", prop.name);
  out->total_memory = prop.totalGlobalMem;
  out->compute_capability = (uint32_t)(prop.major * 10 + prop.minor);
  out->multiprocessors = (uint32_t)prop.multiProcessorCount;
  int can = 0;
  cudaDeviceGetAttribute(&can, cudaDevAttrCanUseHostPointerForRegisteredMem, d->ordinal);
  out->can_map_host_memory = (uint32_t)can;
  if (cudaDeviceGetPCIBusId(out->pci_bus_id, sizeof out->pci_bus_id, d->ordinal) != cudaSuccess) {
    cudaGetLastError();
    out->pci_bus_id[0] = '\0';
  }
  out->numa_node = out->pci_bus_id[0] ? numa_node_of(out->pci_bus_id) : -1;
  return OI_OK;
}

static void cuda_close(oi_dev *d) { oi__free(d); }

static const oi_dev_ops cuda_ops = {
    .name = "cuda",
    .close = cuda_close,
    .info = cuda_info,
    .mem_alloc = cuda_mem_alloc,
    .mem_free = cuda_mem_free,
    .mem_copy = cuda_mem_copy,
    .mem_fill_pattern = cuda_mem_fill_pattern,
    .mem_export = cuda_mem_export,
    .mem_import = cuda_mem_import,
    .mem_close_import = cuda_mem_close_import,
    .mem_export_range = cuda_mem_export_range,
    .pinned_alloc = cuda_pinned_alloc,
    .pinned_free = cuda_pinned_free,
    .stream_create = oi__cuda_stream_create,
    .stream_destroy = oi__cuda_stream_destroy,
    .stream_copy = oi__cuda_stream_copy,
    .stream_call = oi__cuda_stream_call,
    .stream_wait_event = oi__cuda_stream_wait_event,
    .stream_record_event = oi__cuda_stream_record_event,
    .event_destroy = oi__cuda_event_destroy,
    .event_query = oi__cuda_event_query,
    .stream_sync = oi__cuda_stream_sync,
    .stream_decode = oi__cuda_stream_decode,
    .stream_encode = oi__cuda_stream_encode,
};

oi_status oi__cuda_dev_open(int ordinal, oi_dev **out) {
  *out = NULL;
  int n = oi__cuda_device_count();
  if (ordinal < 0 || ordinal >= n)
    return oi__fail(OI_ERR_NO_DEVICE, "device %d: %d CUDA device(s) visible", ordinal, n);
  cuda_dev *cd = oi__calloc(1, sizeof *cd);
  if (!cd) return oi__fail(OI_ERR_OUT_OF_MEMORY, "cuda device: out of memory");
  cd->base.ops = &cuda_ops;
  cd->base.ordinal = ordinal;
  oi_status st = load_driver_api(&cd->drv);
  if (st != OI_OK) {
    oi__free(cd);
    return st;
  }
  *out = &cd->base;
  return OI_OK;
}
