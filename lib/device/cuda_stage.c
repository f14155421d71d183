/* The cuda backend's staged copies (OI_XFER_STAGED, cuda_internal.h): a
 * ring of device staging slots between the host blocks and the arenas. */
#include <stdio.h>
#include <string.h>

#include "cuda_internal.h"

void oi__cuda_stage_free(stage_ring *g) {
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
bool oi__cuda_stage_setup(oi_stream *s, uint64_t staging_bytes) {
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
    oi__cuda_stage_free(g);
    g->failed = true;
    return false;
  }
  g->ready = true;
  return true;
}

/* Makes later work on the main stream wait for the staged DMA queued on aux. */
cudaError_t oi__cuda_stage_join(oi_stream *s) {
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
  if (!s->batch_api_broken && oi__cuda_grow_dma_arrays(s, n)) {
    for (size_t i = 0; i < n; i++) {
      s->dma_dst[i] = dir == OI_COPY_H2D ? (void *)(slot + seg[i].off) : (void *)seg[i].host;
      s->dma_src[i] =
          dir == OI_COPY_H2D ? (const void *)seg[i].host : (const void *)(slot + seg[i].off);
      s->dma_size[i] = seg[i].bytes;
    }
    if (oi__cuda_dma_batch(s, n, aux)) return cudaSuccess;
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
       * oi__cuda_copy_staged binds the share to a ring slot. */
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
oi_status oi__cuda_copy_staged(oi_stream *s, oi_copy_dir dir, const oi_copy_desc *descs, size_t n,
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
  table_buf *t = oi__cuda_take_table(s, bound);
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
    return oi__cuda_fail(err, "copy: staged batch");
  }
  return OI_OK;
}
