/* The cuda backend: device memory, pinned host memory, streams with
 * priorities, IPC export/import of arenas. Driver-API entry points come from
 * cudart (cudaGetDriverEntryPointByVersion) so the library loads on machines
 * without a driver and simply reports no devices there. */
#include <ctype.h>
#include <cuda.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "core/fault.h"
#include "device.h"
#include "hostmem.h"
#include "kernels/kernels.h"

typedef CUresult (*pfn_ipc_open)(CUdeviceptr *, CUipcMemHandle, unsigned int);
typedef CUresult (*pfn_ipc_close)(CUdeviceptr);
typedef CUresult (*pfn_addr_range)(CUdeviceptr *, size_t *, CUdeviceptr);
typedef CUresult (*pfn_host_register)(void *, size_t, unsigned int);
typedef CUresult (*pfn_host_unregister)(void *);
typedef CUresult (*pfn_error_string)(CUresult, const char **);

typedef struct driver_api {
  pfn_ipc_open ipc_open;
  pfn_ipc_close ipc_close;
  pfn_addr_range addr_range;
  pfn_host_register host_register;
  pfn_host_unregister host_unregister;
  pfn_error_string error_string;
} driver_api;

typedef struct cuda_dev {
  oi_dev base;
  driver_api drv;
} cuda_dev;

enum { PIN_CUDA_HOST_ALLOC = 1, PIN_REGISTERED = 2, PIN_PAGEABLE = 3 };

static oi_status cuda_fail(cudaError_t err, const char *what) {
  cudaGetLastError(); /* clear a non-sticky error so later calls are not poisoned */
  return oi__fail(OI_ERR_CUDA, "%s: %s (%s)", what, cudaGetErrorString(err), cudaGetErrorName(err));
}

static oi_status drv_fail(const cuda_dev *cd, CUresult r, const char *what) {
  const char *msg = NULL;
  if (cd->drv.error_string) cd->drv.error_string(r, &msg);
  return oi__fail(OI_ERR_CUDA, "%s: driver error %d (%s)", what, (int)r, msg ? msg : "?");
}

static oi_status use_device(const oi_dev *d) {
  cudaError_t err = cudaSetDevice(d->ordinal);
  if (err != cudaSuccess) return cuda_fail(err, "cudaSetDevice");
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
  oi_status st = use_device(d);
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
    return cuda_fail(err, "cuda mem_alloc: zero-fill");
  }
  *out = p;
  return OI_OK;
}

static void cuda_mem_free(oi_dev *d, void *p) {
  if (!p || use_device(d) != OI_OK) return;
  cudaError_t err = cudaFree(p);
  if (err != cudaSuccess)
    OI_LOG(OI_LOG_ERROR, "device", "cudaFree(%p) on device %d: %s", p, d->ordinal,
           cudaGetErrorString(err));
}

static oi_status cuda_mem_copy(oi_dev *d, void *dst, const void *src, size_t bytes) {
  if (bytes && (!dst || !src))
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "cuda mem_copy: NULL pointer");
  oi_status st = use_device(d);
  if (st != OI_OK) return st;
  cudaError_t err = cudaMemcpy(dst, src, bytes, cudaMemcpyDefault);
  return err == cudaSuccess ? OI_OK : cuda_fail(err, "cuda mem_copy");
}

static oi_status cuda_mem_fill_pattern(oi_dev *d, void *dst, size_t bytes, uint64_t seed) {
  oi_status st = use_device(d);
  if (st != OI_OK) return st;
  cudaError_t err = (cudaError_t)oi_kernel_fill_pattern(dst, bytes, seed, NULL);
  if (err == cudaSuccess) err = cudaDeviceSynchronize();
  return err == cudaSuccess ? OI_OK : cuda_fail(err, "cuda fill_pattern");
}

static oi_status cuda_mem_export(oi_dev *d, void *p, oi_arena_handle *out) {
  oi_status st = use_device(d);
  if (st != OI_OK) return st;
  _Static_assert(sizeof(cudaIpcMemHandle_t) == sizeof(oi_arena_handle), "IPC handle is 64 bytes");
  cudaIpcMemHandle_t h;
  cudaError_t err = cudaIpcGetMemHandle(&h, p);
  if (err != cudaSuccess) return cuda_fail(err, "cuda mem_export: cudaIpcGetMemHandle");
  memcpy(out->bytes, &h, sizeof h);
  return OI_OK;
}

static oi_status cuda_mem_import(oi_dev *d, const oi_arena_handle *h, uint64_t expected, void **ptr,
                                 uint64_t *size) {
  cuda_dev *cd = (cuda_dev *)d;
  oi_status st = use_device(d);
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
    if (aerr != cudaSuccess) return cuda_fail(aerr, "arena import: cudaPointerGetAttributes");
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
  oi_status st = use_device(d);
  if (st != OI_OK) return st;
  cudaFree(NULL); /* make the primary context current for the driver API */
  struct cudaPointerAttributes attr;
  cudaError_t err = cudaPointerGetAttributes(&attr, p);
  if (err != cudaSuccess) return cuda_fail(err, "arena export: cudaPointerGetAttributes");
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
    return cuda_fail(err,
                     "arena export: cudaIpcGetMemHandle (memory from cudaMalloc is needed; "
                     "stream-ordered pools and cuMemCreate memory cannot be exported this way)");
  memcpy(out->bytes, &h, sizeof h);
  *offset = off;
  return OI_OK;
}

static void cuda_mem_close_import(oi_dev *d, void *ptr, uint64_t size) {
  OI_UNUSED(size);
  cuda_dev *cd = (cuda_dev *)d;
  if (!ptr || use_device(d) != OI_OK) return;
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
  oi_status st = use_device(d);
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
  use_device(d);
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

/* ---- streams --------------------------------------------------------------- */

/* A mapped pinned buffer holding one batch's kernel descriptor table. It may
 * be reused once `done` (recorded after the kernel that reads it) completed:
 * an event, not a host callback, so the stream never stalls on the CPU
 * between batches. */
typedef struct table_buf {
  struct table_buf *next;
  cudaEvent_t done;
  oi_kcopy_entry *host;
  oi_kcopy_entry *device;   /* the same memory as the kernel addresses it */
  oi_kcopy_entry *resident; /* staged copies: a device-memory copy (cap entries), made
                               lazily; the kernels read it there, not across PCIe */
  size_t cap;               /* entries */
} table_buf;

/* Staged copies (OI_XFER_STAGED). A ring of device staging slots sits
 * between the host blocks and the arenas. The copy engines move host bytes
 * in large contiguous runs on `aux`; a gather/scatter kernel on the main
 * stream moves the scattered pieces between slots and arenas at device
 * memory speed. Events hand each slot back and forth, so the DMA of one slot
 * overlaps the kernel of another:
 *   load:  aux  [wait free[j]] DMA host -> slot j [record full[j]]
 *          main [wait full[j]] scatter slot j -> arenas [record free[j]]
 *   save:  main [wait free[j]] gather arenas -> slot j [record full[j]]
 *          aux  [wait full[j]] DMA slot j -> host [record free[j]]
 * A save's last DMA runs on aux, so everything that observes the main
 * stream (stream_call, record_event, sync) first joins aux into it. */
typedef struct stage_seg {
  uint64_t host, off, bytes;
} stage_seg;

typedef struct stage_slot { /* one slot's share of a batch */
  size_t first_entry, n_entries, first_seg, n_segs;
} stage_slot;

typedef struct stage_ring {
  uint8_t *mem; /* nslots * slot_bytes of device memory */
  uint64_t slot_bytes;
  uint32_t nslots, next;
  cudaStream_t aux;
  cudaEvent_t full[OI_STAGING_SLOTS], free_[OI_STAGING_SLOTS], join;
  bool ready, failed, join_needed;
  /* the plan of the batch being queued: host runs and slot shares */
  stage_seg *segs;
  size_t nsegs, segs_cap;
  stage_slot *slots;
  size_t nslots_used, slots_cap;
} stage_ring;

struct oi_stream {
  cudaStream_t stream;
  int ordinal;
  bool can_map; /* kernels may use host pointers of registered memory */
  uint32_t sms; /* multiprocessors: staged kernels use them all unless limited */
  pthread_mutex_t lock;
  pthread_mutex_t copy_lock; /* one stream_copy at a time: tables and DMA arrays are shared */
  oi_status pending;         /* first enqueue error since the last stream_call */
  table_buf *tables;         /* every table of this stream, least recently taken first */
  /* DMA argument arrays, reused (the batch API reads them during the call) */
  void **dma_dst;
  const void **dma_src;
  size_t *dma_size;
  size_t dma_cap;
  bool batch_api_broken; /* cudaMemcpyBatchAsync failed once: use the fallback */
  stage_ring stg;        /* staged copies; set up on first use */
};

typedef struct host_call {
  oi_stream_fn fn;
  void *arg;
  oi_status status;
} host_call;

static void CUDART_CB run_host_call(void *p) {
  host_call *c = p;
  c->fn(c->arg, c->status);
  oi__free(c);
}

static oi_status cuda_stream_create(oi_dev *d, int priority, oi_stream **out) {
  oi_status st = use_device(d);
  if (st != OI_OK) return st;
  int least = 0, greatest = 0;
  cudaDeviceGetStreamPriorityRange(&least, &greatest);
  oi_stream *s = oi__calloc(1, sizeof *s);
  if (!s) return oi__fail(OI_ERR_OUT_OF_MEMORY, "stream_create: out of memory");
  cudaError_t err = cudaStreamCreateWithPriority(&s->stream, cudaStreamNonBlocking,
                                                 priority > 0 ? greatest : least);
  if (err != cudaSuccess) {
    oi__free(s);
    return cuda_fail(err, "stream_create: cudaStreamCreateWithPriority");
  }
  int can = 0;
  cudaDeviceGetAttribute(&can, cudaDevAttrCanUseHostPointerForRegisteredMem, d->ordinal);
  s->can_map = can != 0;
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, d->ordinal);
  s->sms = sms > 0 ? (uint32_t)sms : OI_DEFAULT_CTA_LIMIT;
  s->ordinal = d->ordinal;
  pthread_mutex_init(&s->lock, NULL);
  pthread_mutex_init(&s->copy_lock, NULL);
  *out = s;
  return OI_OK;
}

static void stage_free(stage_ring *g);

static void cuda_stream_destroy(oi_stream *s) {
  if (!s) return;
  cudaSetDevice(s->ordinal);
  cudaStreamSynchronize(s->stream);
  stage_free(&s->stg);
  cudaStreamDestroy(s->stream);
  for (table_buf *t = s->tables, *next; t; t = next) {
    next = t->next;
    cudaEventDestroy(t->done);
    cudaFreeHost(t->host);
    if (t->resident) cudaFree(t->resident);
    oi__free(t);
  }
  oi__free(s->dma_dst);
  oi__free((void *)s->dma_src);
  oi__free(s->dma_size);
  pthread_mutex_destroy(&s->copy_lock);
  pthread_mutex_destroy(&s->lock);
  oi__free(s);
}

static void note_error(oi_stream *s, oi_status st) {
  pthread_mutex_lock(&s->lock);
  if (s->pending == OI_OK) s->pending = st;
  pthread_mutex_unlock(&s->lock);
}

/* Moves t (unlinked by the caller, or new) to the end of s's tables. */
static table_buf *table_to_end(oi_stream *s, table_buf *t) {
  table_buf **end = &s->tables;
  while (*end)
    end = &(*end)->next;
  t->next = NULL;
  *end = t;
  return t;
}

/* A table of at least `entries` that no queued kernel still reads, or a new
 * one (the stream's caller is its only user: no lock). Tables are taken in
 * order and their kernels run in the stream's order, so the search stops at
 * the first one still in use (one query per call when the oldest is free,
 * not one per table ever made). */
static table_buf *take_table(oi_stream *s, size_t entries) {
  for (table_buf **link = &s->tables, *t; (t = *link) != NULL; link = &t->next) {
    if (cudaEventQuery(t->done) != cudaSuccess) break;
    if (t->cap < entries) continue;
    *link = t->next;
    return table_to_end(s, t);
  }
  cudaGetLastError(); /* cudaErrorNotReady from the queries is not an error */
  table_buf *t = oi__calloc(1, sizeof *t);
  if (!t) return NULL;
  size_t cap = 1024;
  while (cap < entries)
    cap *= 2;
  if (cudaHostAlloc((void **)&t->host, cap * sizeof *t->host,
                    cudaHostAllocPortable | cudaHostAllocMapped) != cudaSuccess ||
      cudaHostGetDevicePointer((void **)&t->device, t->host, 0) != cudaSuccess ||
      cudaEventCreateWithFlags(&t->done, cudaEventDisableTiming) != cudaSuccess) {
    cudaGetLastError();
    if (t->host) cudaFreeHost(t->host);
    oi__free(t);
    return NULL;
  }
  t->cap = cap;
  return table_to_end(s, t);
}

/* Kernel path: split pieces into entries, write the table into mapped pinned
 * memory, launch one kernel for the batch; the kernel reads the table over
 * PCIe one entry ahead (no table copy, so consecutive batches do not
 * serialize on it), and an event after the kernel marks the table reusable. */
static oi_status copy_by_kernel(oi_stream *s, const oi_copy_desc *descs, size_t n, uint32_t ctas) {
  uint64_t total = 0;
  for (size_t i = 0; i < n; i++)
    total += descs[i].bytes;
  /* Small pieces: one warp each (many in flight per CTA); large ones: the
   * CTA-wide copy over chunks that share the work evenly. */
  bool warps = total / n < OI_KCOPY_WARP_BELOW;
  uint64_t chunk = warps ? OI_KCOPY_WARP_CHUNK : OI_KCOPY_CHUNK;
  size_t entries = 0;
  for (size_t i = 0; i < n; i++)
    entries += (descs[i].bytes + chunk - 1) / chunk;
  if (entries == 0) return OI_OK;
  if (entries > UINT32_MAX) return oi__fail(OI_ERR_INVALID_ARGUMENT, "copy: batch too large");
  table_buf *t = take_table(s, entries);
  if (!t) return oi__fail(OI_ERR_OUT_OF_MEMORY, "copy: no pinned memory for a descriptor table");
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    for (uint64_t off = 0; off < descs[i].bytes; off += chunk) {
      uint64_t len = descs[i].bytes - off < chunk ? descs[i].bytes - off : chunk;
      t->host[k++] = (oi_kcopy_entry){descs[i].src + off, descs[i].dst + off, len};
    }
  cudaError_t err =
      warps ? (cudaError_t)oi_kernel_batch_copy_warps(t->device, (uint32_t)entries, ctas, s->stream)
            : (cudaError_t)oi_kernel_batch_copy(t->device, (uint32_t)entries, ctas, s->stream);
  if (err == cudaSuccess) err = cudaEventRecord(t->done, s->stream);
  if (err != cudaSuccess) {
    cudaStreamSynchronize(s->stream); /* nothing may still read the table */
    return cuda_fail(err, "copy: batch kernel");
  }
  return OI_OK;
}

static bool grow_dma_arrays(oi_stream *s, size_t n) {
  if (s->dma_cap >= n) return true;
  size_t cap = s->dma_cap ? s->dma_cap : 1024;
  while (cap < n)
    cap *= 2;
  void **d = oi__realloc(s->dma_dst, cap * sizeof *d);
  if (d) s->dma_dst = d;
  const void **sr = oi__realloc((void *)s->dma_src, cap * sizeof *sr);
  if (sr) s->dma_src = sr;
  size_t *sz = oi__realloc(s->dma_size, cap * sizeof *sz);
  if (sz) s->dma_size = sz;
  if (!d || !sr || !sz) return false;
  s->dma_cap = cap;
  return true;
}

/* One cudaMemcpyBatchAsync of the n copies in s->dma_* on `stream`. False
 * when the batch API refused it; it is not tried again on this stream and
 * the caller queues the copies one by one. */
static bool dma_batch(oi_stream *s, size_t n, cudaStream_t stream) {
  struct cudaMemcpyAttributes attr;
  memset(&attr, 0, sizeof attr);
  attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
  size_t idx = 0;
  cudaError_t err = cudaMemcpyBatchAsync((void *const *)s->dma_dst, (const void *const *)s->dma_src,
                                         s->dma_size, n, &attr, &idx, 1, stream);
  if (err == cudaSuccess) return true;
  cudaGetLastError();
  s->batch_api_broken = true;
  OI_LOG(OI_LOG_WARN, "device", "cudaMemcpyBatchAsync failed (%s); using cudaMemcpyAsync",
         cudaGetErrorString(err));
  return false;
}

/* DMA path: the copy engines, one batch call; per-piece cudaMemcpyAsync when
 * the batch API refused a batch. */
static oi_status copy_by_dma(oi_stream *s, const oi_copy_desc *descs, size_t n) {
  if (!s->batch_api_broken && grow_dma_arrays(s, n)) {
    for (size_t i = 0; i < n; i++) {
      s->dma_dst[i] = (void *)descs[i].dst;
      s->dma_src[i] = (const void *)descs[i].src;
      s->dma_size[i] = descs[i].bytes;
    }
    if (dma_batch(s, n, s->stream)) return OI_OK;
  }
  for (size_t i = 0; i < n; i++) {
    cudaError_t err = cudaMemcpyAsync((void *)descs[i].dst, (const void *)descs[i].src,
                                      descs[i].bytes, cudaMemcpyDefault, s->stream);
    if (err != cudaSuccess) return cuda_fail(err, "copy: cudaMemcpyAsync");
  }
  return OI_OK;
}

/* ---- staged copies ---- */

static void stage_free(stage_ring *g) {
  if (g->aux) cudaStreamSynchronize(g->aux);
  for (uint32_t j = 0; j < OI_STAGING_SLOTS; j++) {
    if (g->full[j]) cudaEventDestroy(g->full[j]);
    if (g->free_[j]) cudaEventDestroy(g->free_[j]);
  }
  if (g->join) cudaEventDestroy(g->join);
  if (g->aux) cudaStreamDestroy(g->aux);
  if (g->mem) cudaFree(g->mem);
  oi__free(g->segs);
  oi__free(g->slots);
  memset(g, 0, sizeof *g);
}

/* Allocates the slots, the aux stream (same priority as the main one) and
 * the events. On failure the stream stops asking (`failed`) and the caller
 * copies another way: staging is a speed-up, never a requirement. */
static bool stage_setup(oi_stream *s, uint64_t staging_bytes) {
  stage_ring *g = &s->stg;
  if (g->ready) return true;
  if (g->failed) return false;
  int prio = 0;
  cudaStreamGetPriority(s->stream, &prio);
  g->nslots = OI_STAGING_SLOTS;
  g->slot_bytes = (staging_bytes ? staging_bytes : OI_STAGING_BYTES) / g->nslots & ~(uint64_t)4095;
  cudaError_t err = cudaMalloc((void **)&g->mem, g->nslots * g->slot_bytes);
  if (err == cudaSuccess) err = cudaStreamCreateWithPriority(&g->aux, cudaStreamNonBlocking, prio);
  for (uint32_t j = 0; err == cudaSuccess && j < g->nslots; j++) {
    err = cudaEventCreateWithFlags(&g->full[j], cudaEventDisableTiming);
    if (err == cudaSuccess) err = cudaEventCreateWithFlags(&g->free_[j], cudaEventDisableTiming);
  }
  if (err == cudaSuccess) err = cudaEventCreateWithFlags(&g->join, cudaEventDisableTiming);
  if (err != cudaSuccess) {
    cudaGetLastError();
    OI_LOG(OI_LOG_WARN, "device",
           "staged copies unavailable (%s: %llu MiB of staging); "
           "copying by kernel or DMA instead",
           cudaGetErrorString(err), (unsigned long long)(g->nslots * g->slot_bytes >> 20));
    stage_free(g);
    g->failed = true;
    return false;
  }
  g->ready = true;
  return true;
}

/* Makes later work on the main stream wait for the staged DMA queued on aux. */
static cudaError_t stage_join(oi_stream *s) {
  stage_ring *g = &s->stg;
  if (!g->join_needed) return cudaSuccess;
  cudaError_t err = cudaEventRecord(g->join, g->aux);
  if (err == cudaSuccess) err = cudaStreamWaitEvent(s->stream, g->join, 0);
  if (err == cudaSuccess) g->join_needed = false;
  return err;
}

/* Appends a host run to the plan, merged with the previous one when it is
 * contiguous on both sides (within the same slot). */
static bool stage_add_seg(stage_ring *g, uint64_t host, uint64_t off, uint64_t bytes,
                          bool new_slot) {
  if (g->nsegs && !new_slot) {
    stage_seg *p = &g->segs[g->nsegs - 1];
    if (p->host + p->bytes == host && p->off + p->bytes == off) {
      p->bytes += bytes;
      return true;
    }
  }
  if (!oi__grow((void **)&g->segs, &g->segs_cap, g->nsegs + 1, sizeof *g->segs, SIZE_MAX))
    return false;
  g->segs[g->nsegs++] = (stage_seg){host, off, bytes};
  return true;
}

/* The host runs of one slot on aux, in one cudaMemcpyBatchAsync call: a
 * chain of cudaMemcpyAsync pays a gap per copy (5% at 2.25 MiB copies on
 * the H200, docs/benchmarks.md), a batch keeps the copy engines streaming. */
static cudaError_t stage_dma(oi_stream *s, oi_copy_dir dir, uint8_t *slot, const stage_seg *seg,
                             size_t n) {
  cudaStream_t aux = s->stg.aux;
  if (!s->batch_api_broken && grow_dma_arrays(s, n)) {
    for (size_t i = 0; i < n; i++) {
      s->dma_dst[i] = dir == OI_COPY_H2D ? (void *)(slot + seg[i].off) : (void *)seg[i].host;
      s->dma_src[i] =
          dir == OI_COPY_H2D ? (const void *)seg[i].host : (const void *)(slot + seg[i].off);
      s->dma_size[i] = seg[i].bytes;
    }
    if (dma_batch(s, n, aux)) return cudaSuccess;
  }
  cudaError_t err = cudaSuccess;
  for (size_t i = 0; err == cudaSuccess && i < n; i++)
    err = dir == OI_COPY_H2D ? cudaMemcpyAsync(slot + seg[i].off, (const void *)seg[i].host,
                                               seg[i].bytes, cudaMemcpyHostToDevice, aux)
                             : cudaMemcpyAsync((void *)seg[i].host, slot + seg[i].off, seg[i].bytes,
                                               cudaMemcpyDeviceToHost, aux);
  return err;
}

/* Queues slot `sl` of the plan into ring slot g->next; `table` is the
 * device-resident entry table of the batch. */
static cudaError_t stage_emit(oi_stream *s, oi_copy_dir dir, const stage_slot *sl,
                              const oi_kcopy_entry *table, uint32_t ctas) {
  stage_ring *g = &s->stg;
  uint32_t j = g->next;
  uint8_t *slot = g->mem + (uint64_t)j * g->slot_bytes;
  const stage_seg *seg = g->segs + sl->first_seg;
  const oi_kcopy_entry *ent = table + sl->first_entry;
  uint32_t n_ent = (uint32_t)sl->n_entries;
  cudaError_t err;
  if (dir == OI_COPY_H2D) {
    err = cudaStreamWaitEvent(g->aux, g->free_[j], 0);
    if (err == cudaSuccess) err = stage_dma(s, dir, slot, seg, sl->n_segs);
    if (err == cudaSuccess) err = cudaEventRecord(g->full[j], g->aux);
    if (err == cudaSuccess) err = cudaStreamWaitEvent(s->stream, g->full[j], 0);
    if (err == cudaSuccess) err = (cudaError_t)oi_kernel_batch_copy(ent, n_ent, ctas, s->stream);
    if (err == cudaSuccess) err = cudaEventRecord(g->free_[j], s->stream);
  } else {
    err = cudaStreamWaitEvent(s->stream, g->free_[j], 0);
    if (err == cudaSuccess) err = (cudaError_t)oi_kernel_batch_copy(ent, n_ent, ctas, s->stream);
    if (err == cudaSuccess) err = cudaEventRecord(g->full[j], s->stream);
    if (err == cudaSuccess) err = cudaStreamWaitEvent(g->aux, g->full[j], 0);
    if (err == cudaSuccess) err = stage_dma(s, dir, slot, seg, sl->n_segs);
    if (err == cudaSuccess) err = cudaEventRecord(g->free_[j], g->aux);
    g->join_needed = true;
  }
  g->next = (j + 1) % g->nslots;
  return err;
}

/* Plans the batch: walks the pieces in order, filling slots (a piece may
 * span two); per slot, its kernel entries (into t->host) and host runs. */
static bool stage_plan(stage_ring *g, oi_copy_dir dir, const oi_copy_desc *descs, size_t n,
                       table_buf *t, size_t *n_entries) {
  size_t k = 0;
  uint64_t fill = 0;
  g->nsegs = g->nslots_used = 0;
  for (size_t i = 0; i < n; i++) {
    uint64_t dev = dir == OI_COPY_H2D ? descs[i].dst : descs[i].src;
    uint64_t host = dir == OI_COPY_H2D ? descs[i].src : descs[i].dst;
    for (uint64_t done = 0; done < descs[i].bytes;) {
      bool new_slot = fill == 0;
      if (new_slot) {
        if (!oi__grow((void **)&g->slots, &g->slots_cap, g->nslots_used + 1, sizeof *g->slots,
                      SIZE_MAX))
          return false;
        g->slots[g->nslots_used++] = (stage_slot){.first_entry = k, .first_seg = g->nsegs};
      }
      stage_slot *sl = &g->slots[g->nslots_used - 1];
      /* The slot side of an entry is an offset in its slot until
       * copy_staged binds the share to a ring slot. */
      uint64_t take = OI_MIN(descs[i].bytes - done, g->slot_bytes - fill);
      for (uint64_t off = 0; off < take; off += OI_KCOPY_CHUNK) {
        uint64_t len = OI_MIN(take - off, (uint64_t)OI_KCOPY_CHUNK);
        t->host[k++] = dir == OI_COPY_H2D ? (oi_kcopy_entry){fill + off, dev + done + off, len}
                                          : (oi_kcopy_entry){dev + done + off, fill + off, len};
      }
      if (!stage_add_seg(g, host + done, fill, take, new_slot)) return false;
      sl->n_entries = k - sl->first_entry;
      sl->n_segs = g->nsegs - sl->first_seg;
      fill += take;
      done += take;
      if (fill == g->slot_bytes) fill = 0;
    }
  }
  *n_entries = k;
  return true;
}

/* Staged path: plan the batch, bind each slot share to a ring slot (the
 * entries' slot side becomes an absolute address), copy the entry table into
 * device memory on the stream that runs first (aux for loads, the main
 * stream for saves), then queue the slots. */
static oi_status copy_staged(oi_stream *s, oi_copy_dir dir, const oi_copy_desc *descs, size_t n,
                             uint32_t ctas) {
  stage_ring *g = &s->stg;
  uint64_t total = 0;
  size_t bound = 2;
  for (size_t i = 0; i < n; i++) {
    total += descs[i].bytes;
    bound += descs[i].bytes / OI_KCOPY_CHUNK + 2;
  }
  if (total == 0) return OI_OK;
  bound += total / g->slot_bytes;
  if (bound > UINT32_MAX) return oi__fail(OI_ERR_INVALID_ARGUMENT, "copy: batch too large");
  table_buf *t = take_table(s, bound);
  if (!t) return oi__fail(OI_ERR_OUT_OF_MEMORY, "copy: no pinned memory for a descriptor table");
  if (!t->resident &&
      cudaMalloc((void **)&t->resident, t->cap * sizeof *t->resident) != cudaSuccess) {
    cudaGetLastError();
    t->resident = NULL;
    return oi__fail(OI_ERR_OUT_OF_MEMORY, "copy: no device memory for a descriptor table");
  }
  size_t k = 0;
  if (!stage_plan(g, dir, descs, n, t, &k))
    return oi__fail(OI_ERR_OUT_OF_MEMORY, "copy: out of memory for a staged plan");
  for (size_t i = 0; i < g->nslots_used; i++) {
    uint64_t base =
        (uint64_t)(uintptr_t)(g->mem + (uint64_t)((g->next + i) % g->nslots) * g->slot_bytes);
    for (size_t e = g->slots[i].first_entry; e < g->slots[i].first_entry + g->slots[i].n_entries;
         e++) {
      if (dir == OI_COPY_H2D)
        t->host[e].src += base;
      else
        t->host[e].dst += base;
    }
  }
  cudaError_t err =
      cudaMemcpyAsync(t->resident, t->host, k * sizeof *t->host, cudaMemcpyHostToDevice,
                      dir == OI_COPY_H2D ? g->aux : s->stream);
  for (size_t i = 0; err == cudaSuccess && i < g->nslots_used; i++)
    err = stage_emit(s, dir, &g->slots[i], t->resident, ctas);
  if (err == cudaSuccess) err = cudaEventRecord(t->done, s->stream);
  if (err != cudaSuccess) {
    /* Nothing may still read the table or a slot; the batch is reported failed. */
    cudaStreamSynchronize(g->aux);
    cudaStreamSynchronize(s->stream);
    g->join_needed = false;
    return cuda_fail(err, "copy: staged batch");
  }
  return OI_OK;
}

/* stage_join under the copy lock, for the points that observe the stream. */
static oi_status join_aux(oi_stream *s, const char *what) {
  pthread_mutex_lock(&s->copy_lock);
  cudaError_t err = stage_join(s);
  pthread_mutex_unlock(&s->copy_lock);
  return err == cudaSuccess ? OI_OK : cuda_fail(err, what);
}

/* AUTO for direct callers (lib/transfer resolves it itself, per layout):
 * saves by DMA, loads by the kernel while pieces are smaller than this. */
#define DIRECT_AUTO_DMA_PIECE_BYTES (1ull << 20)

static oi_status cuda_stream_copy(oi_stream *s, oi_copy_dir dir, const oi_copy_desc *descs,
                                  size_t n, const oi_copy_params *p) {
  if (n && !descs) return oi__fail(OI_ERR_INVALID_ARGUMENT, "stream_copy: descs is NULL");
  if (n == 0) return OI_OK;
  cudaSetDevice(s->ordinal);
  uint32_t mode = p ? p->mode : OI_XFER_AUTO;
  if (mode == OI_XFER_AUTO) {
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++)
      total += descs[i].bytes;
    mode = (dir == OI_COPY_D2H || total / n >= DIRECT_AUTO_DMA_PIECE_BYTES) ? OI_XFER_DMA
                                                                            : OI_XFER_KERNEL;
  }
  oi_status st;
  pthread_mutex_lock(&s->copy_lock);
  if (mode == OI_XFER_STAGED && !stage_setup(s, p ? p->staging_bytes : 0)) mode = OI_XFER_KERNEL;
  /* The default limit: staged kernels are bursts of a few microseconds at
   * device-memory speed, and every SM finishes them soonest (which is also
   * what disturbs the model least, docs/benchmarks.md); the host-memory
   * kernel runs as long as the transfer, so it gets a share. */
  uint32_t ctas = p && p->cta_limit        ? p->cta_limit
                  : mode == OI_XFER_STAGED ? s->sms
                                           : OI_DEFAULT_CTA_LIMIT;
  if (mode == OI_XFER_KERNEL && (!s->can_map || !p || !p->host_mapped)) mode = OI_XFER_DMA;
  if (mode == OI_XFER_STAGED) {
    st = copy_staged(s, dir, descs, n, ctas);
  } else if (mode == OI_XFER_KERNEL) {
    st = copy_by_kernel(s, descs, n, ctas);
  } else {
    st = copy_by_dma(s, descs, n);
  }
  pthread_mutex_unlock(&s->copy_lock);
  if (st != OI_OK) note_error(s, st);
  return st;
}

static oi_status cuda_stream_call(oi_stream *s, oi_stream_fn fn, void *arg) {
  if (!fn) return oi__fail(OI_ERR_INVALID_ARGUMENT, "stream_call: fn is NULL");
  host_call *c = oi__malloc(sizeof *c);
  if (!c) return oi__fail(OI_ERR_OUT_OF_MEMORY, "stream_call: out of memory");
  c->fn = fn;
  c->arg = arg;
  pthread_mutex_lock(&s->lock);
  c->status = s->pending;
  s->pending = OI_OK;
  pthread_mutex_unlock(&s->lock);
  cudaSetDevice(s->ordinal);
  oi_status jst = join_aux(s, "stream_call: joining staged copies");
  if (jst != OI_OK) {
    oi__free(c);
    return jst;
  }
  cudaError_t err = cudaLaunchHostFunc(s->stream, run_host_call, c);
  if (err != cudaSuccess) {
    oi__free(c);
    return cuda_fail(err, "stream_call: cudaLaunchHostFunc");
  }
  return OI_OK;
}

static oi_status cuda_stream_wait_event(oi_stream *s, void *event) {
  if (!event) return OI_OK;
  cudaSetDevice(s->ordinal);
  cudaError_t err = cudaStreamWaitEvent(s->stream, (cudaEvent_t)event, 0);
  return err == cudaSuccess ? OI_OK : cuda_fail(err, "stream_wait_event");
}

static oi_status cuda_stream_record_event(oi_stream *s, void **event) {
  cudaSetDevice(s->ordinal);
  oi_status st = join_aux(s, "record_event: joining staged copies");
  if (st != OI_OK) return st;
  cudaEvent_t ev;
  cudaError_t err = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  if (err != cudaSuccess) return cuda_fail(err, "record_event: cudaEventCreate");
  err = cudaEventRecord(ev, s->stream);
  if (err != cudaSuccess) {
    cudaEventDestroy(ev);
    return cuda_fail(err, "record_event: cudaEventRecord");
  }
  *event = ev;
  return OI_OK;
}

static void cuda_event_destroy(void *event) {
  if (event) cudaEventDestroy((cudaEvent_t)event);
}

static oi_status cuda_event_query(void *event) {
  if (!event) return OI_OK;
  cudaError_t err = cudaEventQuery((cudaEvent_t)event);
  if (err == cudaSuccess) return OI_OK;
  if (err == cudaErrorNotReady) return OI_PENDING;
  return cuda_fail(err, "event_query: cudaEventQuery");
}

static oi_status cuda_stream_sync(oi_stream *s) {
  cudaSetDevice(s->ordinal);
  oi_status st = join_aux(s, "stream_sync: joining staged copies");
  if (st != OI_OK) return st;
  cudaError_t err = cudaStreamSynchronize(s->stream);
  return err == cudaSuccess ? OI_OK : cuda_fail(err, "stream_sync");
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
  if (err != cudaSuccess) return cuda_fail(err, "cudaGetDeviceProperties");
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
    .stream_create = cuda_stream_create,
    .stream_destroy = cuda_stream_destroy,
    .stream_copy = cuda_stream_copy,
    .stream_call = cuda_stream_call,
    .stream_wait_event = cuda_stream_wait_event,
    .stream_record_event = cuda_stream_record_event,
    .event_destroy = cuda_event_destroy,
    .event_query = cuda_event_query,
    .stream_sync = cuda_stream_sync,
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
