/* The cuda backend: device memory, pinned host memory, streams with
 * priorities, IPC export/import of arenas. Driver-API entry points come from
 * cudart (cudaGetDriverEntryPointByVersion) so the library loads on machines
 * without a driver and simply reports no devices there. */
#include <cuda.h>
#include <cuda_runtime.h>
#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "device.h"
#include "core/fault.h"
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
    cudaError_t err = cudaGetDriverEntryPointByVersion(syms[i].name, syms[i].slot, 12000,
                                                       cudaEnableDefault, &q);
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
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "cuda mem_alloc: %s", out ? "bytes is 0" : "out is NULL");
  oi_status st = use_device(d);
  if (st != OI_OK) return st;
  void *p = NULL;
  cudaError_t err = cudaMalloc(&p, bytes);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return oi__fail(OI_ERR_OUT_OF_MEMORY, "cuda mem_alloc: cudaMalloc(%zu) on device %d: %s",
                    bytes, d->ordinal, cudaGetErrorString(err));
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
  if (bytes && (!dst || !src)) return oi__fail(OI_ERR_INVALID_ARGUMENT, "cuda mem_copy: NULL pointer");
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

static oi_status cuda_mem_import(oi_dev *d, const oi_arena_handle *h, uint64_t expected,
                                 void **ptr, uint64_t *size) {
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
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "pinned_alloc: %s", out ? "bytes is 0" : "out is NULL");
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
  if (OI_FAULT(OI_FAULT_PIN_REGISTER, NULL)) { oi__host_unmap(out->host, out->bytes); return oi__fail(OI_ERR_CUDA, "pinned_alloc: cuMemHostRegister failed (injected fault)"); }
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
  oi_kcopy_entry *device; /* the same memory as the kernel addresses it */
  size_t cap;             /* entries */
} table_buf;

struct oi_stream {
  cudaStream_t stream;
  int ordinal;
  bool can_map; /* kernels may use host pointers of registered memory */
  pthread_mutex_t lock;
  pthread_mutex_t copy_lock; /* one stream_copy at a time: tables and DMA arrays are shared */
  oi_status pending; /* first enqueue error since the last stream_call */
  table_buf *tables; /* every table of this stream, in use or not */
  /* DMA argument arrays, reused (the batch API reads them during the call) */
  void **dma_dst;
  const void **dma_src;
  size_t *dma_size;
  size_t dma_cap;
  bool batch_api_broken; /* cudaMemcpyBatchAsync failed once: use the fallback */
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
  cudaError_t err =
      cudaStreamCreateWithPriority(&s->stream, cudaStreamNonBlocking, priority > 0 ? greatest : least);
  if (err != cudaSuccess) {
    oi__free(s);
    return cuda_fail(err, "stream_create: cudaStreamCreateWithPriority");
  }
  int can = 0;
  cudaDeviceGetAttribute(&can, cudaDevAttrCanUseHostPointerForRegisteredMem, d->ordinal);
  s->can_map = can != 0;
  s->ordinal = d->ordinal;
  pthread_mutex_init(&s->lock, NULL);
  pthread_mutex_init(&s->copy_lock, NULL);
  *out = s;
  return OI_OK;
}

static void cuda_stream_destroy(oi_stream *s) {
  if (!s) return;
  cudaSetDevice(s->ordinal);
  cudaStreamSynchronize(s->stream);
  cudaStreamDestroy(s->stream);
  for (table_buf *t = s->tables, *next; t; t = next) {
    next = t->next;
    cudaEventDestroy(t->done);
    cudaFreeHost(t->host);
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

/* A table of at least `entries` whose last kernel finished (the stream's
 * caller is its only user, so no lock is needed), or a new one. */
static table_buf *take_table(oi_stream *s, size_t entries) {
  for (table_buf *t = s->tables; t; t = t->next)
    if (t->cap >= entries && cudaEventQuery(t->done) == cudaSuccess) return t;
  cudaGetLastError(); /* cudaErrorNotReady from the queries is not an error */
  table_buf *t = oi__calloc(1, sizeof *t);
  if (!t) return NULL;
  size_t cap = 1024;
  while (cap < entries) cap *= 2;
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
  t->next = s->tables;
  s->tables = t;
  return t;
}

/* Kernel path: split pieces into entries, write the table into mapped pinned
 * memory, launch one kernel for the batch; the kernel reads the table over
 * PCIe one entry ahead (no table copy, so consecutive batches do not
 * serialize on it), and an event after the kernel marks the table reusable. */
static oi_status copy_by_kernel(oi_stream *s, const oi_copy_desc *descs, size_t n, uint32_t ctas) {
  size_t entries = 0;
  for (size_t i = 0; i < n; i++) entries += (descs[i].bytes + OI_KCOPY_CHUNK - 1) / OI_KCOPY_CHUNK;
  if (entries == 0) return OI_OK;
  if (entries > UINT32_MAX) return oi__fail(OI_ERR_INVALID_ARGUMENT, "copy: batch too large");
  table_buf *t = take_table(s, entries);
  if (!t) return oi__fail(OI_ERR_OUT_OF_MEMORY, "copy: no pinned memory for a descriptor table");
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    for (uint64_t off = 0; off < descs[i].bytes; off += OI_KCOPY_CHUNK) {
      uint64_t len = descs[i].bytes - off < OI_KCOPY_CHUNK ? descs[i].bytes - off : OI_KCOPY_CHUNK;
      t->host[k++] = (oi_kcopy_entry){descs[i].src + off, descs[i].dst + off, len};
    }
  cudaError_t err = (cudaError_t)oi_kernel_batch_copy(t->device, (uint32_t)entries, ctas, s->stream);
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
  while (cap < n) cap *= 2;
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

/* DMA path: the copy engines, one batch call; per-piece cudaMemcpyAsync when
 * `batch` is false (the naive baseline) or the batch API refused a batch. */
static oi_status copy_by_dma(oi_stream *s, const oi_copy_desc *descs, size_t n, bool batch) {
  if (batch && !s->batch_api_broken && grow_dma_arrays(s, n)) {
    for (size_t i = 0; i < n; i++) {
      s->dma_dst[i] = (void *)descs[i].dst;
      s->dma_src[i] = (const void *)descs[i].src;
      s->dma_size[i] = descs[i].bytes;
    }
    struct cudaMemcpyAttributes attr;
    memset(&attr, 0, sizeof attr);
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
    size_t idx = 0;
    cudaError_t err = cudaMemcpyBatchAsync((void *const *)s->dma_dst, (const void *const *)s->dma_src,
                                           s->dma_size, n, &attr, &idx, 1, s->stream);
    if (err == cudaSuccess) return OI_OK;
    cudaGetLastError();
    s->batch_api_broken = true;
    OI_LOG(OI_LOG_WARN, "device", "cudaMemcpyBatchAsync failed (%s); using cudaMemcpyAsync",
           cudaGetErrorString(err));
  }
  for (size_t i = 0; i < n; i++) {
    cudaError_t err = cudaMemcpyAsync((void *)descs[i].dst, (const void *)descs[i].src,
                                      descs[i].bytes, cudaMemcpyDefault, s->stream);
    if (err != cudaSuccess) return cuda_fail(err, "copy: cudaMemcpyAsync");
  }
  return OI_OK;
}

/* AUTO for direct callers (the engine resolves it itself, per layout):
 * saves by DMA, loads by the kernel while pieces are small. */
static oi_status cuda_stream_copy(oi_stream *s, oi_copy_dir dir, const oi_copy_desc *descs,
                                  size_t n, const oi_copy_params *p) {
  if (n && !descs) return oi__fail(OI_ERR_INVALID_ARGUMENT, "stream_copy: descs is NULL");
  if (n == 0) return OI_OK;
  cudaSetDevice(s->ordinal);
  uint32_t mode = p ? p->mode : OI_XFER_AUTO;
  if (mode == OI_XFER_AUTO) {
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) total += descs[i].bytes;
    mode = (dir == OI_COPY_D2H || total / n >= OI_AUTO_DMA_PIECE_BYTES) ? OI_XFER_DMA : OI_XFER_KERNEL;
  }
  if (mode == OI_XFER_KERNEL && (!s->can_map || !p || !p->host_mapped)) mode = OI_XFER_DMA;
  uint32_t ctas = p && p->cta_limit ? p->cta_limit : OI_DEFAULT_CTA_LIMIT;
  oi_status st;
  pthread_mutex_lock(&s->copy_lock);
  if (mode == OI_XFER_KERNEL) {
    st = copy_by_kernel(s, descs, n, ctas);
  } else if (mode == OI_XFER_PIECEWISE) {
    st = copy_by_dma(s, descs, n, false);
  } else {
    st = copy_by_dma(s, descs, n, true);
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

static oi_status cuda_stream_sync(oi_stream *s) {
  cudaSetDevice(s->ordinal);
  cudaError_t err = cudaStreamSynchronize(s->stream);
  return err == cudaSuccess ? OI_OK : cuda_fail(err, "stream_sync");
}

/* ---- device -------------------------------------------------------------- */

static oi_status cuda_bench_spin(oi_dev *d, uint32_t ctas, uint32_t iters, uint32_t count) {
  oi_status st = use_device(d);
  if (st != OI_OK) return st;
  cudaStream_t s;
  float *scratch = NULL;
  cudaError_t err = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (err != cudaSuccess) return cuda_fail(err, "bench_spin: stream");
  err = cudaMalloc((void **)&scratch, (size_t)ctas * sizeof(float));
  for (uint32_t i = 0; i < count && err == cudaSuccess; i++)
    err = (cudaError_t)oi_kernel_spin(scratch, ctas, iters, s);
  if (err == cudaSuccess) err = cudaStreamSynchronize(s);
  cudaFree(scratch);
  cudaStreamDestroy(s);
  return err == cudaSuccess ? OI_OK : cuda_fail(err, "bench_spin");
}

static int numa_node_of(const char *pci_bus_id) {
  char path[128], lower[32];
  size_t i = 0;
  for (; pci_bus_id[i] && i < sizeof lower - 1; i++) lower[i] = (char)tolower((unsigned char)pci_bus_id[i]);
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
    .pinned_alloc = cuda_pinned_alloc,
    .pinned_free = cuda_pinned_free,
    .stream_create = cuda_stream_create,
    .stream_destroy = cuda_stream_destroy,
    .stream_copy = cuda_stream_copy,
    .stream_call = cuda_stream_call,
    .stream_wait_event = cuda_stream_wait_event,
    .stream_record_event = cuda_stream_record_event,
    .event_destroy = cuda_event_destroy,
    .stream_sync = cuda_stream_sync,
    .bench_spin = cuda_bench_spin,
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
