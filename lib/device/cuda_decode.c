/* The cuda backend's GPU decodes of codec frames (stream_decode,
 * cuda_internal.h's decode_ring): a group's frames cross the link on the
 * ring's aux stream into a device slot, then on the main stream the decode
 * kernel (kernels/codec.cu) writes the slot's decoded blocks, the blocks of
 * frames that failed are zeroed, and the batch copy kernel scatters the
 * decoded bytes to the arenas. The pieces table and the frames' statuses
 * ride one descriptor table (table_buf): pinned on the host, a device copy
 * that the kernels read and write, the statuses copied back and handed to
 * the caller by a host call before its next stream_call. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"

_Static_assert(
    (int)OI_DECODE_RANS == (int)OI_KDEC_RANS && (int)OI_DECODE_RAW_EXP == (int)OI_KDEC_RAW_EXP &&
        (int)OI_DECODE_BYTES == (int)OI_KDEC_BYTES && (int)OI_DECODE_INT8 == (int)OI_KDEC_INT8 &&
        (int)OI_DECODE_FP8 == (int)OI_KDEC_FP8 && (int)OI_DECODE_RANS32 == (int)OI_KDEC_RANS32 &&
        (int)OI_DECODE_INT8H == (int)OI_KDEC_INT8H && (int)OI_DECODE_PLANES == (int)OI_KDEC_PLANES,
    "the decode kinds are the kernel's");
_Static_assert((int)OI_DECODE_BAD_STREAM == (int)OI_KDEC_BAD_STREAM &&
                   (int)OI_DECODE_BAD_SCALE == (int)OI_KDEC_BAD_SCALE &&
                   (int)OI_DECODE_NAN_CODE == (int)OI_KDEC_NAN_CODE,
               "the decode statuses are the kernel's");

/* OI_DECODE_TRACE: slot j's last batch, from its events (waited for):
 * when the host queued it, its frames on aux, its decode and scatter on
 * main, in us from the first traced batch. */
static void trace_report(decode_ring *r, uint32_t j) {
  if (!r->traced[j]) return;
  r->traced[j] = false;
  cudaEventSynchronize(r->tev[j][3]);
  float t[4];
  for (int k = 0; k < 4; k++)
    cudaEventElapsedTime(&t[k], r->tbase, r->tev[j][k]);
  fprintf(stderr,
          "decode batch %llu: called %.0f us, queued %.0f us (tables made %u), frames %.0f..%.0f "
          "us (%.0f), decode %.0f..%.0f us (%.0f)\n",
          (unsigned long long)r->tgroup++, ((double)r->tcalled[j] - (double)r->tbase_ns) / 1e3,
          (double)(r->tqueued[j] - r->tbase_ns) / 1e3, r->ttables[j], t[0] * 1e3, t[1] * 1e3,
          (t[1] - t[0]) * 1e3, t[2] * 1e3, t[3] * 1e3, (t[3] - t[2]) * 1e3);
}

void oi__cuda_decode_free(decode_ring *r) {
  if (r->aux) cudaStreamSynchronize(r->aux);
  for (int j = 0; r->trace && j < OI_DECODE_SLOTS; j++) {
    trace_report(r, j);
    for (int k = 0; k < 4; k++)
      if (r->tev[j][k]) cudaEventDestroy(r->tev[j][k]);
  }
  if (r->tbase) cudaEventDestroy(r->tbase);
  for (int j = 0; j < OI_DECODE_SLOTS; j++) {
    if (r->frames[j]) cudaFree(r->frames[j]);
    if (r->blocks[j]) cudaFree(r->blocks[j]);
    if (r->full[j]) cudaEventDestroy(r->full[j]);
    if (r->free_[j]) cudaEventDestroy(r->free_[j]);
  }
  if (r->aux) cudaStreamDestroy(r->aux);
  memset(r, 0, sizeof *r);
}

/* Slots of at least these sizes (grown once the stream is idle: a
 * namespace's groups have one size, so this happens at the first decode). */
static cudaError_t ring_setup(oi_stream *s, uint64_t frames, uint64_t blocks) {
  decode_ring *r = &s->dec;
  cudaError_t err = cudaSuccess;
  if (!r->ready) {
    int prio = 0;
    cudaStreamGetPriority(s->stream, &prio);
    err = cudaStreamCreateWithPriority(&r->aux, cudaStreamNonBlocking, prio);
    for (int j = 0; err == cudaSuccess && j < OI_DECODE_SLOTS; j++) {
      err = cudaEventCreateWithFlags(&r->full[j], cudaEventDisableTiming);
      if (err == cudaSuccess) err = cudaEventCreateWithFlags(&r->free_[j], cudaEventDisableTiming);
    }
    r->trace = getenv("OI_DECODE_TRACE") != NULL;
    for (int j = 0; r->trace && err == cudaSuccess && j < OI_DECODE_SLOTS; j++)
      for (int k = 0; err == cudaSuccess && k < 4; k++)
        err = cudaEventCreate(&r->tev[j][k]);
    if (r->trace && err == cudaSuccess) err = cudaEventCreate(&r->tbase);
    if (err != cudaSuccess) return err;
    r->ready = true;
  }
  if (r->frames_cap >= frames && r->blocks_cap >= blocks) return cudaSuccess;
  cudaStreamSynchronize(s->stream);
  cudaStreamSynchronize(r->aux);
  for (int j = 0; j < OI_DECODE_SLOTS; j++) {
    if (r->frames[j]) cudaFree(r->frames[j]);
    if (r->blocks[j]) cudaFree(r->blocks[j]);
    r->frames[j] = r->blocks[j] = NULL;
  }
  r->frames_cap = r->blocks_cap = 0;
  for (int j = 0; err == cudaSuccess && j < OI_DECODE_SLOTS; j++) {
    err = cudaMalloc((void **)&r->frames[j], frames);
    if (err == cudaSuccess) err = cudaMalloc((void **)&r->blocks[j], blocks);
  }
  if (err == cudaSuccess) {
    r->frames_cap = frames;
    r->blocks_cap = blocks;
  }
  return err;
}

#define FRAME_ALIGN 256u

static uint64_t frame_room(uint32_t bytes) {
  return ((uint64_t)bytes + FRAME_ALIGN - 1) & ~(uint64_t)(FRAME_ALIGN - 1);
}

/* One table (table_buf, in units of its entries) holds the batch's scatter
 * entries, then the kernel items, then the statuses: copied to its device
 * copy in one go, marked reusable after the host call that reads the
 * statuses back. */
static oi_status decode_locked(oi_stream *s, const oi_decode_batch *b) {
  decode_ring *r = &s->dec;
  uint64_t frames = 0;
  for (size_t i = 0; i < b->n; i++)
    frames += frame_room(b->frame_bytes[i]);
  uint64_t blocks = b->n * b->block_bytes;
  cudaError_t err = ring_setup(s, frames ? frames : FRAME_ALIGN, blocks ? blocks : 1);
  if (err != cudaSuccess) return oi__cuda_fail(err, "decode: device memory for frames and blocks");
  uint32_t j = r->next;
  uint8_t *fdev = r->frames[j], *bdev = r->blocks[j];
  oi_copy_desc *descs = oi__malloc((b->ndescs ? b->ndescs : 1) * sizeof *descs);
  uint64_t *foff = oi__malloc((b->n ? b->n : 1) * sizeof *foff);
  oi_status_handoff *h = oi__malloc(sizeof *h);
  oi_status st = OI_OK;
  if (!descs || !foff || !h || !oi__cuda_grow_dma_arrays(s, b->n)) {
    st = oi__fail(OI_ERR_OUT_OF_MEMORY, "decode: out of memory for a batch");
    goto out;
  }
  uint64_t at = 0;
  for (size_t i = 0; i < b->n; i++) {
    foff[i] = at;
    at += frame_room(b->frame_bytes[i]);
  }
  for (size_t i = 0; i < b->ndescs; i++)
    descs[i] = (oi_copy_desc){.src = (uintptr_t)bdev + b->descs[i].src,
                              .dst = b->descs[i].dst,
                              .bytes = b->descs[i].bytes};
  bool warps = false;
  size_t nent = oi__cuda_kcopy_plan(descs, b->ndescs, &warps, NULL);
  size_t items_off = nent * sizeof(oi_kcopy_entry),
         status_off = items_off + b->npieces * sizeof(oi_kdec_item),
         table_bytes = status_off + b->n * sizeof(int32_t);
  table_buf *t = oi__cuda_take_resident_table(s, table_bytes, "decode");
  if (!t) {
    st = OI_ERR_OUT_OF_MEMORY;
    goto out;
  }
  uint8_t *th = (uint8_t *)t->host, *td = (uint8_t *)t->resident;
  oi__cuda_kcopy_plan(descs, b->ndescs, &warps, t->host);
  oi_kdec_item *items = (oi_kdec_item *)(void *)(th + items_off);
  unsigned lossless = 0; /* the lossless kernels the pieces need */
  for (size_t k = 0; k < b->npieces; k++) {
    const oi_decode_piece *p = &b->pieces[k];
    uint64_t f = (uint64_t)(uintptr_t)fdev + foff[p->frame],
             d = (uint64_t)(uintptr_t)bdev + (uint64_t)p->frame * b->block_bytes;
    items[k] = (oi_kdec_item){.src = f + p->src,
                              .aux = f + p->aux,
                              .dst = d + p->dst,
                              .len = p->len,
                              .count = p->count,
                              .frame = p->frame,
                              .kind = (uint16_t)p->kind,
                              .tokens = p->tokens,
                              .heads = p->heads,
                              .head_dim = p->head_dim};
    lossless |= oi_kdec_lossless_kernel(p->kind);
  }
  int32_t *st_host = (int32_t *)(void *)(th + status_off);
  int32_t *st_dev = (int32_t *)(void *)(td + status_off);
  memcpy(st_host, b->status, b->n * sizeof *st_host);
  /* aux: the table, then the frames over the link into slot j once its
   * last batch is done. The table goes on aux, not main: queued on main
   * after the previous batch's scatter, it waited behind the next batch's
   * frames in the copy engine, and each batch's decode waited for the
   * frames of the batch after it (a restore ran at the sum of link and
   * decode times, not the larger). */
  err = cudaStreamWaitEvent(r->aux, r->free_[j], 0);
  if (r->trace) {
    trace_report(r, j);
    if (!r->tbase_ns) { /* the first batch: the times' origin */
      r->tbase_ns = oi__now_ns();
      cudaEventRecord(r->tbase, r->aux);
    }
    r->tqueued[j] = oi__now_ns();
    r->tcalled[j] = r->tcall_ns;
    r->ttables[j] = s->tables_made;
    r->traced[j] = true;
    cudaEventRecord(r->tev[j][0], r->aux);
  }
  if (err == cudaSuccess)
    err = cudaMemcpyAsync(td, th, table_bytes, cudaMemcpyHostToDevice, r->aux);
  size_t ndma = 0; /* a frame the host refused (0 bytes) does not cross */
  for (size_t i = 0; i < b->n; i++)
    if (b->frame_bytes[i]) {
      s->dma_dst[ndma] = fdev + foff[i];
      s->dma_src[ndma] = b->frames[i];
      s->dma_size[ndma++] = b->frame_bytes[i];
    }
  if (err == cudaSuccess && ndma && (s->batch_api_broken || !oi__cuda_dma_batch(s, ndma, r->aux)))
    for (size_t i = 0; err == cudaSuccess && i < ndma; i++)
      err = cudaMemcpyAsync(s->dma_dst[i], s->dma_src[i], s->dma_size[i], cudaMemcpyHostToDevice,
                            r->aux);
  if (err == cudaSuccess) err = cudaEventRecord(r->full[j], r->aux);
  if (r->trace) cudaEventRecord(r->tev[j][1], r->aux);
  /* main: once the table and frames landed, decode, zero the blocks that
   * failed, scatter */
  if (err == cudaSuccess) err = cudaStreamWaitEvent(s->stream, r->full[j], 0);
  if (r->trace) cudaEventRecord(r->tev[j][2], s->stream);
  if (err == cudaSuccess)
    err = (cudaError_t)oi_kernel_codec_decode((const oi_kdec_item *)(void *)(td + items_off),
                                              (uint32_t)b->npieces, lossless, b->max_lossy_elems,
                                              st_dev, s->stream);
  if (err == cudaSuccess)
    err = (cudaError_t)oi_kernel_codec_zero_failed(st_dev, (uint32_t)b->n, bdev, b->block_bytes,
                                                   s->stream);
  if (err == cudaSuccess && nent)
    err = oi__cuda_kcopy_launch(warps, t->resident, nent, s->sms, s->stream);
  if (err == cudaSuccess) err = cudaEventRecord(r->free_[j], s->stream);
  if (r->trace) cudaEventRecord(r->tev[j][3], s->stream);
  /* the statuses back, handed to the caller before its next stream_call */
  if (err == cudaSuccess)
    err =
        cudaMemcpyAsync(st_host, st_dev, b->n * sizeof *st_dev, cudaMemcpyDeviceToHost, s->stream);
  if (err == cudaSuccess) {
    *h = (oi_status_handoff){.from = st_host, .to = b->status, .n = b->n};
    err = cudaLaunchHostFunc(s->stream, oi__cuda_hand_over, h);
    if (err == cudaSuccess) h = NULL; /* the host call's */
  }
  if (err == cudaSuccess) err = cudaEventRecord(t->done, s->stream);
  if (err != cudaSuccess) {
    /* nothing may still read the table or a slot; the batch is reported failed */
    cudaStreamSynchronize(r->aux);
    cudaStreamSynchronize(s->stream);
    st = oi__cuda_fail(err, "decode: queuing a batch");
  }
  r->next = (j + 1) % OI_DECODE_SLOTS;
out:
  oi__free(foff);
  oi__free(descs);
  oi__free(h);
  return st;
}

/* A piece's reads within its frame's bytes and writes within its block. */
static bool piece_fits(const oi_decode_piece *p, const oi_decode_batch *b) {
  uint64_t fb = b->frame_bytes[p->frame], bb = b->block_bytes;
  switch (p->kind) {
  case OI_KDEC_RANS:
  case OI_KDEC_RANS32:
  case OI_KDEC_PLANES:
    return (uint64_t)p->src + p->len <= fb && (uint64_t)p->aux + p->count <= fb &&
           (uint64_t)p->dst + 2ull * p->count <= bb;
  case OI_KDEC_RAW_EXP:
    return (uint64_t)p->src + p->count <= fb && (uint64_t)p->aux + p->count <= fb &&
           (uint64_t)p->dst + 2ull * p->count <= bb;
  case OI_KDEC_BYTES: return (uint64_t)p->src + p->count <= fb && (uint64_t)p->dst + p->count <= bb;
  case OI_KDEC_INT8:
  case OI_KDEC_INT8H: {
    uint64_t elems = (uint64_t)p->count * p->head_dim;
    return p->dst == 0 && (uint64_t)p->src + p->len <= fb && p->len == 2 * p->count + elems &&
           2 * elems <= bb;
  }
  case OI_KDEC_FP8: {
    uint64_t elems = (uint64_t)p->count * p->tokens * p->heads * p->head_dim;
    return p->dst == 0 && (uint64_t)p->src + p->len <= fb &&
           p->len == 4ull * p->count * p->heads + elems && 2 * elems <= bb;
  }
  default: return false;
  }
}

oi_status oi__cuda_stream_decode(oi_stream *s, const oi_decode_batch *b) {
  if (!b || (b->n && (!b->frames || !b->frame_bytes || !b->status)) || (b->npieces && !b->pieces) ||
      (b->ndescs && !b->descs))
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "stream_decode: a NULL array");
  if (b->npieces > UINT32_MAX || b->n > UINT32_MAX)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "stream_decode: batch too large");
  for (size_t k = 0; k < b->npieces; k++)
    if (b->pieces[k].frame >= b->n || !piece_fits(&b->pieces[k], b))
      return oi__fail(OI_ERR_INVALID_ARGUMENT,
                      "stream_decode: piece %zu (kind %u) outside its frame or block", k,
                      b->pieces[k].kind);
  for (size_t i = 0; i < b->ndescs; i++)
    if (b->descs[i].src + b->descs[i].bytes > b->n * b->block_bytes)
      return oi__fail(OI_ERR_INVALID_ARGUMENT, "stream_decode: copy %zu past the decoded blocks",
                      i);
  cudaSetDevice(s->ordinal);
  uint64_t called = oi__now_ns(); /* OI_DECODE_TRACE: the host's time before the queueing */
  pthread_mutex_lock(&s->copy_lock);
  s->dec.tcall_ns = called;
  oi_status st = decode_locked(s, b);
  pthread_mutex_unlock(&s->copy_lock);
  if (st != OI_OK) {
    pthread_mutex_lock(&s->lock);
    if (s->pending == OI_OK) s->pending = st;
    pthread_mutex_unlock(&s->lock);
  }
  return st;
}
