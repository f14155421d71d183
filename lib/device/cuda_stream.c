/* The cuda backend's streams (cuda_internal.h): a stream with a priority,
 * its copies by kernel (a descriptor table in mapped pinned memory) or by
 * the copy engines (one cudaMemcpyBatchAsync per batch), staged copies
 * handed to cuda_stage.c, host calls, events. */
#include <stdio.h>
#include <string.h>

#include "cuda_internal.h"

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

oi_status oi__cuda_stream_create(oi_dev *d, int priority, oi_stream **out) {
  oi_status st = oi__cuda_use_device(d);
  if (st != OI_OK) return st;
  int least = 0, greatest = 0;
  cudaDeviceGetStreamPriorityRange(&least, &greatest);
  oi_stream *s = oi__calloc(1, sizeof *s);
  if (!s) return oi__fail(OI_ERR_OUT_OF_MEMORY, "stream_create: out of memory");
  cudaError_t err = cudaStreamCreateWithPriority(&s->stream, cudaStreamNonBlocking,
                                                 priority > 0 ? greatest : least);
  if (err != cudaSuccess) {
    oi__free(s);
    return oi__cuda_fail(err, "stream_create: cudaStreamCreateWithPriority");
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

void oi__cuda_stream_destroy(oi_stream *s) {
  if (!s) return;
  cudaSetDevice(s->ordinal);
  cudaStreamSynchronize(s->stream);
  oi__cuda_stage_free(&s->stg);
  oi__cuda_decode_free(&s->dec);
  oi__cuda_encode_free(&s->enc);
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
table_buf *oi__cuda_take_table(oi_stream *s, size_t entries) {
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
  s->tables_made++;
  return table_to_end(s, t);
}

table_buf *oi__cuda_take_resident_table(oi_stream *s, size_t bytes, const char *what) {
  table_buf *t =
      oi__cuda_take_table(s, (bytes + sizeof(oi_kcopy_entry) - 1) / sizeof(oi_kcopy_entry));
  if (!t) {
    oi__fail(OI_ERR_OUT_OF_MEMORY, "%s: no pinned memory for a table", what);
    return NULL;
  }
  if (!t->resident &&
      cudaMalloc((void **)&t->resident, t->cap * sizeof *t->resident) != cudaSuccess) {
    cudaGetLastError();
    t->resident = NULL;
    oi__fail(OI_ERR_OUT_OF_MEMORY, "%s: no device memory for a table", what);
    return NULL;
  }
  return t;
}

void CUDART_CB oi__cuda_hand_over(void *p) {
  oi_status_handoff *h = p;
  memcpy(h->to, h->from, h->n * sizeof *h->to);
  oi__free(h);
}

size_t oi__cuda_kcopy_plan(const oi_copy_desc *descs, size_t n, bool *warps, oi_kcopy_entry *out) {
  uint64_t total = 0;
  for (size_t i = 0; i < n; i++)
    total += descs[i].bytes;
  /* Small pieces: one warp each (many in flight per CTA); large ones: the
   * CTA-wide copy over chunks that share the work evenly. */
  *warps = n && total / n < OI_KCOPY_WARP_BELOW;
  uint64_t chunk = *warps ? OI_KCOPY_WARP_CHUNK : OI_KCOPY_CHUNK;
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    for (uint64_t off = 0; off < descs[i].bytes; off += chunk) {
      uint64_t len = descs[i].bytes - off < chunk ? descs[i].bytes - off : chunk;
      if (out) out[k] = (oi_kcopy_entry){descs[i].src + off, descs[i].dst + off, len};
      k++;
    }
  return k;
}

cudaError_t oi__cuda_kcopy_launch(bool warps, const oi_kcopy_entry *table, size_t n, uint32_t ctas,
                                  cudaStream_t stream) {
  return warps ? (cudaError_t)oi_kernel_batch_copy_warps(table, (uint32_t)n, ctas, stream)
               : (cudaError_t)oi_kernel_batch_copy(table, (uint32_t)n, ctas, stream);
}

/* Kernel path: split pieces into entries, write the table into mapped pinned
 * memory, launch one kernel for the batch; the kernel reads the table over
 * PCIe one entry ahead (no table copy, so consecutive batches do not
 * serialize on it), and an event after the kernel marks the table reusable. */
static oi_status copy_by_kernel(oi_stream *s, const oi_copy_desc *descs, size_t n, uint32_t ctas) {
  bool warps = false;
  size_t entries = oi__cuda_kcopy_plan(descs, n, &warps, NULL);
  if (entries == 0) return OI_OK;
  if (entries > UINT32_MAX) return oi__fail(OI_ERR_INVALID_ARGUMENT, "copy: batch too large");
  table_buf *t = oi__cuda_take_table(s, entries);
  if (!t) return oi__fail(OI_ERR_OUT_OF_MEMORY, "copy: no pinned memory for a descriptor table");
  oi__cuda_kcopy_plan(descs, n, &warps, t->host);
  cudaError_t err = oi__cuda_kcopy_launch(warps, t->device, entries, ctas, s->stream);
  if (err == cudaSuccess) err = cudaEventRecord(t->done, s->stream);
  if (err != cudaSuccess) {
    cudaStreamSynchronize(s->stream); /* nothing may still read the table */
    return oi__cuda_fail(err, "copy: batch kernel");
  }
  return OI_OK;
}

bool oi__cuda_grow_dma_arrays(oi_stream *s, size_t n) {
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
bool oi__cuda_dma_batch(oi_stream *s, size_t n, cudaStream_t stream) {
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
  if (!s->batch_api_broken && oi__cuda_grow_dma_arrays(s, n)) {
    for (size_t i = 0; i < n; i++) {
      s->dma_dst[i] = (void *)descs[i].dst;
      s->dma_src[i] = (const void *)descs[i].src;
      s->dma_size[i] = descs[i].bytes;
    }
    if (oi__cuda_dma_batch(s, n, s->stream)) return OI_OK;
  }
  for (size_t i = 0; i < n; i++) {
    cudaError_t err = cudaMemcpyAsync((void *)descs[i].dst, (const void *)descs[i].src,
                                      descs[i].bytes, cudaMemcpyDefault, s->stream);
    if (err != cudaSuccess) return oi__cuda_fail(err, "copy: cudaMemcpyAsync");
  }
  return OI_OK;
}

/* oi__cuda_stage_join under the copy lock, for the points that observe the stream. */
static oi_status join_aux(oi_stream *s, const char *what) {
  pthread_mutex_lock(&s->copy_lock);
  cudaError_t err = oi__cuda_stage_join(s);
  pthread_mutex_unlock(&s->copy_lock);
  return err == cudaSuccess ? OI_OK : oi__cuda_fail(err, what);
}

/* AUTO for direct callers (lib/transfer resolves it itself, per layout):
 * saves by DMA, loads by the kernel while pieces are smaller than this. */
#define DIRECT_AUTO_DMA_PIECE_BYTES (1ull << 20)

oi_status oi__cuda_stream_copy(oi_stream *s, oi_copy_dir dir, const oi_copy_desc *descs, size_t n,
                               const oi_copy_params *p) {
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
  if (mode == OI_XFER_STAGED && !oi__cuda_stage_setup(s, p ? p->staging_bytes : 0))
    mode = OI_XFER_KERNEL;
  /* The default limit: staged kernels are bursts of a few microseconds at
   * device-memory speed, and every SM finishes them soonest (which is also
   * what disturbs the model least, docs/benchmarks.md); the host-memory
   * kernel runs as long as the transfer, so it gets a share. */
  uint32_t ctas = p && p->cta_limit        ? p->cta_limit
                  : mode == OI_XFER_STAGED ? s->sms
                                           : OI_DEFAULT_CTA_LIMIT;
  if (mode == OI_XFER_KERNEL && (!s->can_map || !p || !p->host_mapped)) mode = OI_XFER_DMA;
  if (mode == OI_XFER_STAGED) {
    st = oi__cuda_copy_staged(s, dir, descs, n, ctas);
  } else if (mode == OI_XFER_KERNEL) {
    st = copy_by_kernel(s, descs, n, ctas);
  } else {
    st = copy_by_dma(s, descs, n);
  }
  pthread_mutex_unlock(&s->copy_lock);
  if (st != OI_OK) note_error(s, st);
  return st;
}

oi_status oi__cuda_stream_call(oi_stream *s, oi_stream_fn fn, void *arg) {
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
    return oi__cuda_fail(err, "stream_call: cudaLaunchHostFunc");
  }
  return OI_OK;
}

oi_status oi__cuda_stream_wait_event(oi_stream *s, void *event) {
  if (!event) return OI_OK;
  cudaSetDevice(s->ordinal);
  atomic_fetch_add(&s->waits, 1); /* a GPU encode's gather waits for it too */
  cudaError_t err = cudaStreamWaitEvent(s->stream, (cudaEvent_t)event, 0);
  return err == cudaSuccess ? OI_OK : oi__cuda_fail(err, "stream_wait_event");
}

oi_status oi__cuda_stream_record_event(oi_stream *s, void **event) {
  cudaSetDevice(s->ordinal);
  oi_status st = join_aux(s, "record_event: joining staged copies");
  if (st != OI_OK) return st;
  cudaEvent_t ev;
  cudaError_t err = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  if (err != cudaSuccess) return oi__cuda_fail(err, "record_event: cudaEventCreate");
  err = cudaEventRecord(ev, s->stream);
  if (err != cudaSuccess) {
    cudaEventDestroy(ev);
    return oi__cuda_fail(err, "record_event: cudaEventRecord");
  }
  *event = ev;
  return OI_OK;
}

void oi__cuda_event_destroy(void *event) {
  if (event) cudaEventDestroy((cudaEvent_t)event);
}

oi_status oi__cuda_event_query(void *event) {
  if (!event) return OI_OK;
  cudaError_t err = cudaEventQuery((cudaEvent_t)event);
  if (err == cudaSuccess) return OI_OK;
  if (err == cudaErrorNotReady) return OI_PENDING;
  return oi__cuda_fail(err, "event_query: cudaEventQuery");
}

oi_status oi__cuda_stream_sync(oi_stream *s) {
  cudaSetDevice(s->ordinal);
  oi_status st = join_aux(s, "stream_sync: joining staged copies");
  if (st != OI_OK) return st;
  cudaError_t err = cudaStreamSynchronize(s->stream);
  return err == cudaSuccess ? OI_OK : oi__cuda_fail(err, "stream_sync");
}
