/* The cuda backend's GPU encodes of codec frames (stream_encode,
 * cuda_internal.h's encode_ring): on the ring's aux stream the batch copy
 * kernel gathers a group's blocks from the arenas and the frame kernels
 * (kernels/codec_frame.cu, lossless; codec_lossy.cu, the lossy codecs)
 * make their frames in a device slot; on the main
 * stream the frames cross the link into their host slots and the statuses
 * come back, handed to the caller by a host call before its next
 * stream_call. The gather table and the statuses ride one descriptor table
 * (table_buf), as a decode's do. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"

_Static_assert((int)OI_ENCODE_PAST_SLOT == (int)OI_KENC_PAST_SLOT &&
                   (int)OI_ENCODE_REFUSED == (int)OI_KENC_REFUSED,
               "the encode statuses are the kernels'");
_Static_assert((int)OI_ENCODE_INT8 == (int)OI_KLOSSY_INT8 &&
                   (int)OI_ENCODE_INT8H == (int)OI_KLOSSY_INT8H &&
                   (int)OI_ENCODE_FP8 == (int)OI_KLOSSY_FP8 &&
                   OI_ENCODE_LOSSY_MAX_DIM == OI_KLOSSY_MAX_DIM,
               "the lossy kinds are the kernel's");
_Static_assert(sizeof(((oi_encode_plan *)0)->header) == sizeof(((oi_kframe_args *)0)->header),
               "the plan's header is the kernel's");

#define ALIGN 256u

static uint64_t up(uint64_t v) { return (v + ALIGN - 1) & ~(uint64_t)(ALIGN - 1); }

/* OI_ENCODE_TRACE: slot j's last group, from its events (waited for). */
static void trace_report(encode_ring *r, uint32_t j) {
  if (!r->traced[j]) return;
  cudaEventSynchronize(r->tev[j][3]);
  float t[4];
  for (int k = 0; k < 4; k++)
    cudaEventElapsedTime(&t[k], r->tbase, r->tev[j][k]);
  fprintf(stderr, "encode group %llu: aux %.0f..%.0f us (%.0f), main %.0f..%.0f us (%.0f)\n",
          (unsigned long long)r->tgroup++, t[0] * 1e3, t[1] * 1e3, (t[1] - t[0]) * 1e3, t[2] * 1e3,
          t[3] * 1e3, (t[3] - t[2]) * 1e3);
}

void oi__cuda_encode_free(encode_ring *r) {
  if (r->aux) cudaStreamSynchronize(r->aux);
  for (int j = 0; j < OI_ENCODE_SLOTS; j++) {
    if (r->frames[j]) cudaFree(r->frames[j]);
    if (r->full[j]) cudaEventDestroy(r->full[j]);
    if (r->free_[j]) cudaEventDestroy(r->free_[j]);
  }
  if (r->blocks) cudaFree(r->blocks);
  if (r->work) cudaFree(r->work);
  if (r->secret) cudaFree(r->secret);
  if (r->go) cudaEventDestroy(r->go);
  for (int j = 0; r->trace && j < OI_ENCODE_SLOTS; j++) {
    trace_report(r, j);
    for (int k = 0; k < 4; k++)
      if (r->tev[j][k]) cudaEventDestroy(r->tev[j][k]);
  }
  if (r->tbase) cudaEventDestroy(r->tbase);
  if (r->fork) cudaEventDestroy(r->fork);
  if (r->join) cudaEventDestroy(r->join);
  if (r->side) {
    cudaStreamSynchronize(r->side);
    cudaStreamDestroy(r->side);
  }
  if (r->aux) cudaStreamDestroy(r->aux);
  memset(r, 0, sizeof *r);
}

/* The kernels' scratch of a batch: where each buffer starts in `work`, and
 * its bytes in all. */
typedef struct work_layout {
  uint64_t hist, items, lens, segs, streams, scratch, sums, secrets, bytes;
} work_layout;

static work_layout layout_of(const oi_encode_batch *b) {
  const oi_encode_plan *p = b->plan;
  work_layout w = {0};
  if (p->kind != OI_ENCODE_LOSSLESS) { /* the checksums' items, then their scratch */
    w.scratch = up((uint64_t)b->n * sizeof(oi_khash_item)); /* (items at 0) */
    w.bytes = up(w.scratch + (uint64_t)b->n * oi_klossy_scratch_bytes(p->payload_bytes));
    return w;
  }
  uint64_t per = (uint64_t)b->n * p->max_segs;
  w.hist = 0;
  w.items = up(w.hist + (uint64_t)b->n * OI_MAX(p->parts, p->max_segs) * 256 * 4);
  w.lens = up(w.items + per * sizeof(oi_kenc_item));
  w.segs = up(w.lens + per * 4);
  w.streams = up(w.segs + (uint64_t)b->n * 4);
  w.scratch = up(w.streams + per * p->stream_cap);
  w.sums = up(w.scratch + per * p->stream_cap);
  w.secrets = up(w.sums + (uint64_t)b->n * oi_kframe_sums_bytes(b->block_bytes, b->frame_bytes));
  w.bytes = up(w.secrets + (uint64_t)b->n * 192);
  return w;
}

/* The kernels that make a batch's frames in slot j, on aux. */
static cudaError_t make_frames(oi_stream *s, const oi_encode_batch *b, const work_layout *w,
                               uint32_t j, int32_t *st_dev) {
  encode_ring *r = &s->enc;
  const oi_encode_plan *p = b->plan;
  uint64_t work = (uint64_t)(uintptr_t)r->work;
  if (p->kind != OI_ENCODE_LOSSLESS) {
    oi_klossy_args a = {.blocks = (uint64_t)(uintptr_t)r->blocks,
                        .frames = (uint64_t)(uintptr_t)r->frames[j],
                        .status = (uint64_t)(uintptr_t)st_dev,
                        .items = work + w->items,
                        .scratch = work + w->scratch,
                        .secret = (uint64_t)(uintptr_t)r->secret,
                        .block_bytes = b->block_bytes,
                        .frame_bytes = b->frame_bytes,
                        .seed = p->seed,
                        .n = (uint32_t)b->n,
                        .kind = p->kind,
                        .payload_bytes = p->payload_bytes,
                        .parts = p->parts,
                        .tokens = p->tokens,
                        .heads = p->heads,
                        .head_dim = p->head_dim,
                        .rot_block = p->rot_block,
                        .down = p->down};
    memcpy(a.header, p->header, sizeof a.header);
    return (cudaError_t)oi_kernel_lossy_frames(&a, r->aux);
  }
  oi_kframe_args a = {.blocks = (uint64_t)(uintptr_t)r->blocks,
                      .frames = (uint64_t)(uintptr_t)r->frames[j],
                      .hist = work + w->hist,
                      .items = work + w->items,
                      .lens = work + w->lens,
                      .segs = work + w->segs,
                      .streams = work + w->streams,
                      .scratch = work + w->scratch,
                      .sums = work + w->sums,
                      .secrets = work + w->secrets,
                      .status = (uint64_t)(uintptr_t)st_dev,
                      .secret = (uint64_t)(uintptr_t)r->secret,
                      .block_bytes = b->block_bytes,
                      .frame_bytes = b->frame_bytes,
                      .n = (uint32_t)b->n,
                      .parts = p->parts,
                      .segs_whole = p->segs_whole,
                      .segs_parts = p->segs_parts,
                      .max_segs = p->max_segs,
                      .stream_cap = p->stream_cap,
                      .planes = p->planes};
  memcpy(a.header, p->header, sizeof a.header);
  return (cudaError_t)oi_kernel_lossless_frames(&a, r->aux, r->side, r->fork, r->join);
}

/* Device memory of at least these sizes (grown once the streams are idle:
 * a namespace's groups have one size, so this happens at the first
 * encode). */
static cudaError_t ring_setup(oi_stream *s, uint64_t frames, uint64_t blocks, uint64_t work) {
  encode_ring *r = &s->enc;
  cudaError_t err = cudaSuccess;
  if (!r->ready) {
    int prio = 0;
    cudaStreamGetPriority(s->stream, &prio);
    err = cudaStreamCreateWithPriority(&r->aux, cudaStreamNonBlocking, prio);
    if (err == cudaSuccess)
      err = cudaStreamCreateWithPriority(&r->side, cudaStreamNonBlocking, prio);
    if (err == cudaSuccess) err = cudaEventCreateWithFlags(&r->fork, cudaEventDisableTiming);
    if (err == cudaSuccess) err = cudaEventCreateWithFlags(&r->join, cudaEventDisableTiming);
    for (int j = 0; err == cudaSuccess && j < OI_ENCODE_SLOTS; j++) {
      err = cudaEventCreateWithFlags(&r->full[j], cudaEventDisableTiming);
      if (err == cudaSuccess) err = cudaEventCreateWithFlags(&r->free_[j], cudaEventDisableTiming);
    }
    if (err == cudaSuccess) err = cudaEventCreateWithFlags(&r->go, cudaEventDisableTiming);
    r->trace = getenv("OI_ENCODE_TRACE") != NULL;
    for (int j = 0; r->trace && err == cudaSuccess && j < OI_ENCODE_SLOTS; j++)
      for (int k = 0; err == cudaSuccess && k < 4; k++)
        err = cudaEventCreate(&r->tev[j][k]);
    if (r->trace && err == cudaSuccess) err = cudaEventCreate(&r->tbase);
    if (r->trace && err == cudaSuccess) err = cudaEventRecord(r->tbase, s->stream);
    if (err == cudaSuccess) err = cudaMalloc((void **)&r->secret, 192);
    if (err != cudaSuccess) return err;
    r->ready = true;
  }
  if (r->frames_cap >= frames && r->blocks_cap >= blocks && r->work_cap >= work) return cudaSuccess;
  cudaStreamSynchronize(s->stream);
  cudaStreamSynchronize(r->aux);
  for (int j = 0; j < OI_ENCODE_SLOTS; j++) {
    if (r->frames[j]) cudaFree(r->frames[j]);
    r->frames[j] = NULL;
  }
  if (r->blocks) cudaFree(r->blocks);
  if (r->work) cudaFree(r->work);
  r->blocks = r->work = NULL;
  r->frames_cap = r->blocks_cap = r->work_cap = 0;
  for (int j = 0; err == cudaSuccess && j < OI_ENCODE_SLOTS; j++)
    err = cudaMalloc((void **)&r->frames[j], frames);
  if (err == cudaSuccess) err = cudaMalloc((void **)&r->blocks, blocks);
  if (err == cudaSuccess) err = cudaMalloc((void **)&r->work, work);
  if (err == cudaSuccess) {
    r->frames_cap = frames;
    r->blocks_cap = blocks;
    r->work_cap = work;
  }
  return err;
}

static oi_status encode_locked(oi_stream *s, const oi_encode_batch *b) {
  encode_ring *r = &s->enc;
  const oi_encode_plan *p = b->plan;
  work_layout w = layout_of(b);
  cudaError_t err = ring_setup(s, b->n * b->frame_bytes, b->n * b->block_bytes, w.bytes);
  if (err != cudaSuccess) return oi__cuda_fail(err, "encode: device memory for blocks and frames");
  if (!r->secret_set) { /* once: every plan carries XXH3's one default secret */
    err = cudaMemcpy(r->secret, p->secret, sizeof p->secret, cudaMemcpyHostToDevice);
    if (err != cudaSuccess) return oi__cuda_fail(err, "encode: the checksums' secret");
    r->secret_set = true;
  }
  uint32_t j = r->next;
  oi_copy_desc *descs = oi__malloc((b->ndescs ? b->ndescs : 1) * sizeof *descs);
  oi_status_handoff *h = oi__malloc(sizeof *h);
  oi_status st = OI_OK;
  if (!descs || !h || !oi__cuda_grow_dma_arrays(s, b->n)) {
    st = oi__fail(OI_ERR_OUT_OF_MEMORY, "encode: out of memory for a batch");
    goto out;
  }
  for (size_t i = 0; i < b->ndescs; i++)
    descs[i] = (oi_copy_desc){.src = b->descs[i].src,
                              .dst = (uintptr_t)r->blocks + b->descs[i].dst,
                              .bytes = b->descs[i].bytes};
  bool warps = false;
  size_t nent = oi__cuda_kcopy_plan(descs, b->ndescs, &warps, NULL);
  size_t status_off = nent * sizeof(oi_kcopy_entry), table_bytes = status_off + b->n * 4;
  table_buf *t = oi__cuda_take_resident_table(s, table_bytes, "encode");
  if (!t) {
    st = OI_ERR_OUT_OF_MEMORY;
    goto out;
  }
  uint8_t *th = (uint8_t *)t->host, *td = (uint8_t *)t->resident;
  oi__cuda_kcopy_plan(descs, b->ndescs, &warps, t->host);
  int32_t *st_host = (int32_t *)(void *)(th + status_off);
  int32_t *st_dev = (int32_t *)(void *)(td + status_off);
  uint64_t waits = atomic_load(&s->waits);
  /* aux: after what main waited on, once slot j's frames left: the table,
   * the gather, the frames */
  if (!r->go_set || waits != r->waits_seen) { /* (else aux would wait for main's last copies) */
    err = cudaEventRecord(r->go, s->stream);
    r->waits_seen = waits;
    r->go_set = true;
  }
  if (err == cudaSuccess) err = cudaStreamWaitEvent(r->aux, r->go, 0);
  if (err == cudaSuccess) err = cudaStreamWaitEvent(r->aux, r->free_[j], 0);
  if (r->trace) {
    trace_report(r, j);
    r->traced[j] = true;
    cudaEventRecord(r->tev[j][0], r->aux);
  }
  if (err == cudaSuccess)
    err = cudaMemcpyAsync(td, th, table_bytes, cudaMemcpyHostToDevice, r->aux);
  if (err == cudaSuccess && nent)
    err = oi__cuda_kcopy_launch(warps, t->resident, nent, s->sms, r->aux);
  if (err == cudaSuccess) err = make_frames(s, b, &w, j, st_dev);
  if (err == cudaSuccess) err = cudaEventRecord(r->full[j], r->aux);
  /* main: the frames to their slots, the statuses back */
  if (err == cudaSuccess) err = cudaStreamWaitEvent(s->stream, r->full[j], 0);
  if (r->trace) {
    cudaEventRecord(r->tev[j][1], r->aux);
    cudaEventRecord(r->tev[j][2], s->stream);
  }
  for (size_t i = 0; i < b->n; i++) {
    s->dma_dst[i] = b->slots[i];
    s->dma_src[i] = r->frames[j] + i * b->frame_bytes;
    s->dma_size[i] = b->frame_bytes;
  }
  if (err == cudaSuccess && b->n &&
      (s->batch_api_broken || !oi__cuda_dma_batch(s, b->n, s->stream)))
    for (size_t i = 0; err == cudaSuccess && i < b->n; i++)
      err = cudaMemcpyAsync(s->dma_dst[i], s->dma_src[i], s->dma_size[i], cudaMemcpyDeviceToHost,
                            s->stream);
  if (err == cudaSuccess)
    err =
        cudaMemcpyAsync(st_host, st_dev, b->n * sizeof *st_dev, cudaMemcpyDeviceToHost, s->stream);
  if (err == cudaSuccess) err = cudaEventRecord(r->free_[j], s->stream);
  if (r->trace) cudaEventRecord(r->tev[j][3], s->stream);
  if (err == cudaSuccess) {
    *h = (oi_status_handoff){.from = st_host, .to = b->status, .n = b->n};
    err = cudaLaunchHostFunc(s->stream, oi__cuda_hand_over, h);
    if (err == cudaSuccess) h = NULL; /* the host call's */
  }
  if (err == cudaSuccess) err = cudaEventRecord(t->done, s->stream);
  if (err != cudaSuccess) {
    /* nothing may still read the table, the arenas or a slot; the batch is
     * reported failed */
    cudaStreamSynchronize(r->aux);
    cudaStreamSynchronize(s->stream);
    st = oi__cuda_fail(err, "encode: queuing a batch");
  }
  r->next = (j + 1) % OI_ENCODE_SLOTS;
out:
  oi__free(descs);
  oi__free(h);
  return st;
}

oi_status oi__cuda_stream_encode(oi_stream *s, const oi_encode_batch *b) {
  if (!b || !b->plan || (b->n && (!b->slots || !b->status)) || (b->ndescs && !b->descs))
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "stream_encode: a NULL array");
  if (b->n > 65535 || b->block_bytes % 8 || b->frame_bytes % 8 || !b->block_bytes ||
      b->frame_bytes <= OI_KFRAME_HEADER)
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "stream_encode: %zu blocks of %llu bytes into slots of %llu (at most 65535, "
                    "multiples of 8)",
                    b->n, (unsigned long long)b->block_bytes, (unsigned long long)b->frame_bytes);
  const oi_encode_plan *p = b->plan;
  if (p->kind == OI_ENCODE_LOSSLESS &&
      (!p->segs_whole || p->max_segs > OI_KFRAME_MAX_SEGS || p->parts > OI_KFRAME_MAX_PARTS ||
       p->segs_whole > p->max_segs || p->segs_parts > p->max_segs ||
       (p->parts > 1 && !p->segs_parts)))
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "stream_encode: a plan of %u or %u streams for %u parts (at most %u)",
                    p->segs_whole, p->segs_parts, p->parts, OI_KFRAME_MAX_SEGS);
  if (p->kind != OI_ENCODE_LOSSLESS &&
      (p->kind > OI_ENCODE_FP8 || !p->parts || !p->tokens || !p->heads || !p->head_dim ||
       (uint64_t)p->parts * p->tokens * p->heads * p->head_dim * 2 != b->block_bytes ||
       p->payload_bytes <= 240 || OI_KFRAME_HEADER + (uint64_t)p->payload_bytes > b->frame_bytes ||
       (p->kind == OI_ENCODE_INT8H &&
        (p->rot_block < 2 || p->head_dim % p->rot_block || p->head_dim > OI_ENCODE_LOSSY_MAX_DIM))))
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "stream_encode: a lossy plan (kind %u) of shape %ux%ux%ux%u, a %u-byte "
                    "payload, for blocks of %llu bytes in slots of %llu",
                    p->kind, p->parts, p->tokens, p->heads, p->head_dim, p->payload_bytes,
                    (unsigned long long)b->block_bytes, (unsigned long long)b->frame_bytes);
  for (size_t i = 0; i < b->ndescs; i++)
    if (b->descs[i].dst + b->descs[i].bytes > b->n * b->block_bytes)
      return oi__fail(OI_ERR_INVALID_ARGUMENT, "stream_encode: copy %zu past the blocks", i);
  cudaSetDevice(s->ordinal);
  pthread_mutex_lock(&s->copy_lock);
  oi_status st = encode_locked(s, b);
  pthread_mutex_unlock(&s->copy_lock);
  if (st != OI_OK) {
    pthread_mutex_lock(&s->lock);
    if (s->pending == OI_OK) s->pending = st;
    pthread_mutex_unlock(&s->lock);
  }
  return st;
}
