/* The copy pipeline (transfer.h): jobs, grouping, the copy-mode policy,
 * layered loads, deadlines and the completion thread. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "core/fault.h"
#include "transfer.h"
#include "transfer/codec_stage.h"

struct oi_xfer_job {
  struct oi_xfer_job *next;
  oi_xfer *x;
  oi_copy_dir dir;
  uint32_t flags;
  oi_status status;   /* the copy's result, set when it arrives */
  oi_status queue_st; /* the first failure to queue */
  size_t cap, n, queued;
  size_t group;      /* pieces pairs that make the next group */
  uint64_t t0_ns;    /* creation, for the latency histograms */
  oi_ticket *ticket; /* the producer's reference, or NULL */
  oi_xfer_notify_fn on_done;
  void *on_done_ctx;
  /* Deadline bookkeeping (the pipeline's lock): a job is outstanding from the
   * moment its completion is queued until its copies land. */
  uint64_t deadline_ns;
  /* Past its deadline; the copy may still run. A save's caller was told
   * OI_ERR_TIMEOUT then (its late copy only reads the device memory, and
   * what it read is discarded); a load's ticket is fencing and completes
   * with OI_ERR_DEADLINE only when its copies end (complete_job). */
  bool expired;
  struct oi_xfer_job *out_prev, *out_next;
  int64_t *ids;   /* cap entries */
  uint8_t **host; /* cap entries */
  void *user;
  /* A layered load: one stream callback per arena reports it to `progress`
   * (the job's own reference to its ticket, held until the job ends, so a
   * ticket completed early by a deadline stays valid for them). arena_st is
   * the first arena's error (the stream thread's only), which the job's end
   * inherits: a cpu stream reports each error to the next callback only. */
  struct arena_cb *arena_cbs;
  uint32_t arena_first, arena_count; /* oi__xfer_job_arenas; count 0: all */
  oi_ticket *progress;
  oi_status arena_st;
  /* The codec stage: a save's blocks that could not be encoded (cap
   * entries, NULL when the pipeline has no codec), and a load's first
   * frame that did not decode. Written on the stream only. */
  uint8_t *bad;
  size_t nbad;
  oi_status codec_st;
  char *codec_msg; /* codec_st's reason, for the ticket */
  char *bad_msg;   /* why the first of the bad blocks was not encoded */
};

typedef struct arena_cb {
  oi_xfer_job *job;
  uint32_t arena;
} arena_cb;

struct oi_xfer {
  oi_xfer_config cfg;
  oi_dev *dev;
  oi_stream *stream[2]; /* [OI_COPY_D2H] normal priority, [OI_COPY_H2D] high */
  uint32_t mode[2];     /* resolved copy modes */
  uint64_t group_blocks[2];

  pthread_t done_thread;
  bool done_started;
  pthread_mutex_t lock;
  pthread_cond_t cv; /* a job arrived, a deadline was armed, or stop */
  oi_xfer_job *head, *tail;
  /* Queued jobs whose copies have not landed, per direction, oldest first:
   * every job of a direction has the same deadline_ms and its deadline is
   * taken under the lock as it joins, so each list is in deadline order and
   * expiry looks only at its front. */
  oi_xfer_job *out_head[2], *out_tail[2];
  /* While the completion thread sleeps (asleep), when it wakes by itself:
   * a new job wakes it only when its deadline is earlier. */
  bool asleep;
  uint64_t asleep_until; /* UINT64_MAX: until signalled */
  bool stopping;
  /* Per direction, a plan buffer kept between calls (grown, never shrunk):
   * a large call's groups are planned into it rather than into memory
   * allocated and freed per group (which the allocator may hand back to
   * the system and fault in again each time). Held while the plan is
   * queued: two threads queuing one direction take turns, as they do on
   * the stream itself. */
  pthread_mutex_t plan_lock[2];
  oi_copy_desc *plan_buf[2];
  size_t plan_cap[2];
  oi_codec_stage *codec; /* cfg.codec (codec_stage.h); NULL without one */
  bool device_decode;    /* loads decode on the device (cfg.codec_host_decode unset) */
  /* Saves make their frames on the device (cfg.codec_host_encode unset, a
   * lossless namespace whose blocks qualify: oi__lossless_gpu_plan). */
  bool device_encode;
  oi_encode_plan encode_plan;
};

static uint32_t log_id(const oi_xfer *x) { return x->cfg.log_id ? *x->cfg.log_id : 0; }

/* ---- policy ------------------------------------------------------------------ */

/* The default policy (copy_mode AUTO), decided per direction from the
 * layout (transfer.h; docs/benchmarks.md has the measurements). */
uint32_t oi__xfer_resolve_mode(const oi_layout *l, uint32_t mode, oi_copy_dir dir) {
  if (mode != OI_XFER_AUTO) return mode;
  /* Pieces per block after merging: a page-first layout is one piece. */
  size_t pieces = 0;
  uint64_t end = 0;
  for (uint32_t a = 0; a < l->num_arenas; a++)
    for (uint32_t s = 0; s < l->arenas[a].segments; s++) {
      uint64_t start = l->arenas[a].base + l->arenas[a].seg_off[s];
      if (pieces == 0 || start != end) pieces++;
      end = start + l->arenas[a].bytes_per_block;
    }
  if (l->block_bytes / pieces >= OI_AUTO_DMA_PIECE_BYTES) return OI_XFER_DMA;
  if (l->block_bytes >= OI_AUTO_STAGE_BLOCK_BYTES ||
      l->block_bytes / pieces >= OI_AUTO_SMALL_PIECE_BYTES)
    return OI_XFER_STAGED;
  OI_UNUSED(dir); /* the same choice both ways today; the interface keeps the direction */
  return OI_XFER_KERNEL;
}

/* Blocks per queued group: about `bytes` of them, at least one. */
static uint64_t blocks_per_group(uint64_t bytes, uint64_t block_bytes) {
  uint64_t g = bytes / block_bytes;
  return g == UINT64_MAX ? g : g + 1;
}

/* ---- completion ------------------------------------------------------------- */

/* Runs on the stream (a driver or worker thread): only hands the job over. */
static void job_arrived(void *arg, oi_status st) {
  oi_xfer_job *job = arg;
  oi_xfer *x = job->x;
  if (st == OI_OK) st = job->arena_st;
  if (st == OI_OK) st = job->codec_st;
  job->status = st;
  job->next = NULL;
  pthread_mutex_lock(&x->lock);
  if (x->tail)
    x->tail->next = job;
  else
    x->head = job;
  x->tail = job;
  pthread_cond_signal(&x->cv);
  pthread_mutex_unlock(&x->lock);
}

/* Bytes of one block the job moves: its arenas' slices. */
static uint64_t job_block_bytes(const oi_xfer_job *job) {
  const oi_layout *l = job->x->cfg.layout;
  if (!job->arena_count) return l->block_bytes;
  uint64_t b = 0;
  for (uint32_t a = job->arena_first; a < job->arena_first + job->arena_count; a++)
    b += (uint64_t)l->arenas[a].segments * l->arenas[a].bytes_per_block;
  return b;
}

static void complete_job(oi_xfer_job *job) {
  oi_xfer *x = job->x;
  /* A job whose deadline passed failed, whatever its copies did: what it
   * copied is not trusted. A save was reported then (its ticket and on_done
   * fired with OI_ERR_TIMEOUT); a load's ticket ends now that nothing more
   * can land in its destination. */
  if (job->expired) job->status = job->dir == OI_COPY_H2D ? OI_ERR_DEADLINE : OI_ERR_TIMEOUT;
  oi_xfer_result r = {.dir = job->dir,
                      .status = job->status,
                      .n = job->n,
                      .bytes = job->n * job_block_bytes(job),
                      .arena_count = job->arena_count,
                      .latency_ns = oi__now_ns() - job->t0_ns,
                      .failed = job->nbad ? job->bad : NULL,
                      .nfailed = job->nbad,
                      .failed_why = job->bad_msg};
  x->cfg.done(x->cfg.done_ctx, job->user, &r);
  if (job->on_done) job->on_done(job->on_done_ctx, job->status);
  if (job->ticket)
    oi__ticket_complete_msg(job->ticket, job->status,
                            job->status == job->codec_st ? job->codec_msg : NULL);
  if (job->progress) oi__ticket_unref(job->progress);
  oi__free(job->codec_msg);
  oi__free(job->bad_msg);
  oi__free(job->arena_cbs);
  oi__free(job);
}

static void outstanding_remove_locked(oi_xfer *x, oi_xfer_job *job) {
  int d = job->dir;
  if (job->out_prev)
    job->out_prev->out_next = job->out_next;
  else if (x->out_head[d] == job)
    x->out_head[d] = job->out_next;
  else
    return; /* not on the list */
  if (job->out_next)
    job->out_next->out_prev = job->out_prev;
  else
    x->out_tail[d] = job->out_prev;
  job->out_prev = job->out_next = NULL;
}

/* Deadlines: a job whose copies have not landed by its deadline has failed.
 * A save is reported to the caller as OI_ERR_TIMEOUT now; a load's ticket
 * turns fencing (oi__ticket_fence: its destination is not the caller's
 * until the copies end, when complete_job ends it with OI_ERR_DEADLINE).
 * Either way the job's memory stays held (the owner's slots, marks) until
 * the copy really ends. */
typedef struct expired_cb {
  oi_ticket *ticket;
  oi_xfer_notify_fn on_done;
  void *ctx;
} expired_cb;

static void expire_jobs_locked(oi_xfer *x, uint64_t now, uint64_t *next_deadline) {
  /* A job that joins later has a deadline at least now + its direction's
   * deadline_ms: sleeping no longer than that, the thread never needs a
   * wake-up to arm its timer for a new job (an idle pipeline wakes once
   * per deadline_ms). */
  uint64_t floor = UINT64_MAX; /* deadline_ms 0: that direction's jobs have none */
  for (int d = 0; d < 2; d++)
    if (x->cfg.deadline_ms[d])
      floor = OI_MIN(floor, now + (uint64_t)x->cfg.deadline_ms[d] * 1000000ull);
  for (;;) {
    expired_cb fire[32];
    size_t nfire = 0;
    *next_deadline = floor;
    for (int d = 0; d < 2; d++)
      for (oi_xfer_job *j = x->out_head[d]; j; j = j->out_next) {
        if (j->expired) continue; /* reported already; its copy has not landed yet */
        if (j->deadline_ns > now || nfire == OI_ARRAY_LEN(fire)) {
          /* In deadline order: the rest of this list is not due before it. */
          *next_deadline = OI_MIN(*next_deadline, j->deadline_ns);
          break;
        }
        j->expired = true;
        if (j->dir == OI_COPY_H2D) {
          if (j->ticket) oi__ticket_fence(j->ticket); /* (a ticket's own lock: cheap) */
        } else {
          fire[nfire++] = (expired_cb){j->ticket, j->on_done, j->on_done_ctx};
          j->ticket = NULL;
          j->on_done = NULL;
        }
        OI_LOG_I(OI_LOG_WARN, "engine", log_id(x), "%s of %zu blocks missed its %u ms deadline",
                 j->dir == OI_COPY_H2D ? "load" : "save", j->n, x->cfg.deadline_ms[j->dir]);
      }
    if (nfire == 0) return;
    pthread_mutex_unlock(&x->lock); /* callbacks run without the lock */
    for (size_t i = 0; i < nfire; i++) {
      if (fire[i].on_done) fire[i].on_done(fire[i].ctx, OI_ERR_TIMEOUT);
      if (fire[i].ticket) oi__ticket_complete(fire[i].ticket, OI_ERR_TIMEOUT);
    }
    pthread_mutex_lock(&x->lock);
  }
}

static void *done_main(void *arg) {
  oi_xfer *x = arg;
  pthread_mutex_lock(&x->lock);
  for (;;) {
    uint64_t next_deadline;
    expire_jobs_locked(x, oi__now_ns(), &next_deadline);
    if (!x->head && !x->stopping) {
      x->asleep = true;
      x->asleep_until = next_deadline;
      if (next_deadline == UINT64_MAX) {
        pthread_cond_wait(&x->cv, &x->lock);
      } else {
        struct timespec ts = oi__timespec(next_deadline);
        pthread_cond_timedwait(&x->cv, &x->lock, &ts);
      }
      x->asleep = false;
      continue;
    }
    oi_xfer_job *job = x->head;
    if (!job) break; /* stopping and drained */
    x->head = job->next;
    if (!x->head) x->tail = NULL;
    outstanding_remove_locked(x, job);
    pthread_mutex_unlock(&x->lock);
    complete_job(job);
    pthread_mutex_lock(&x->lock);
  }
  pthread_mutex_unlock(&x->lock);
  return NULL;
}

/* ---- queueing ---------------------------------------------------------------- */

#define PLAN_STACK 128

/* Queues the copies of n pairs (device ids[i] <-> host[i]) of the arenas of
 * `l` (the pipeline's layout, or a view of some of its arenas) on `s`. */
static oi_status queue_copies_in(oi_xfer *x, const oi_layout *l, uint32_t mode, oi_stream *s,
                                 oi_copy_dir dir, const int64_t *ids, uint8_t *const *host,
                                 size_t n) {
  if (n == 0) return OI_OK;
  /* A call's plan of up to PLAN_STACK pieces is built on the stack (the
   * stream copies the descriptors it keeps). */
  oi_copy_desc stack[PLAN_STACK], *descs = stack;
  size_t nd = 0;
  oi_status st = OI_OK;
  bool kept = false; /* descs is x->plan_buf[dir], plan_lock[dir] held */
  if (!oi__plan_build_into(l, ids, host, n, dir, stack, PLAN_STACK, &nd)) {
    size_t need = oi__plan_pieces(l, n);
    pthread_mutex_lock(&x->plan_lock[dir]);
    if (x->plan_cap[dir] < need) {
      oi_copy_desc *b = oi__malloc(need * sizeof *b);
      if (!b) {
        pthread_mutex_unlock(&x->plan_lock[dir]);
        return oi__fail(OI_ERR_OUT_OF_MEMORY, "copy plan: out of memory for %zu pieces", need);
      }
      oi__free(x->plan_buf[dir]);
      x->plan_buf[dir] = b;
      x->plan_cap[dir] = need;
    }
    oi__plan_build_into(l, ids, host, n, dir, x->plan_buf[dir], x->plan_cap[dir], &nd);
    descs = x->plan_buf[dir];
    kept = true;
  }
  oi_copy_params cp = {.mode = mode,
                       .cta_limit = x->cfg.cta_limit,
                       .host_mapped = x->cfg.host_mapped,
                       .staging_bytes = x->cfg.staging_bytes};
  if (OI_FAULT(OI_FAULT_COPY_SUBMIT, NULL))
    st = oi__fail(OI_ERR_IO, "queuing copies failed (injected fault)");
  else
    st = x->dev->ops->stream_copy(s, dir, descs, nd, &cp);
  if (kept) pthread_mutex_unlock(&x->plan_lock[dir]);
  return st;
}

/* ---- the codec stage ---------------------------------------------------------- */

/* One group's codec step: blocks [from, from + n) of its job, whose bounce
 * blocks are the codec stage's first n of the direction. */
typedef struct codec_step {
  oi_xfer_job *job;
  size_t from, n;
} codec_step;

/* On the save stream, after the group's pieces landed in the bounce blocks:
 * each block is encoded into its slot. A block that does not encode is
 * marked; its slot is not kept. */
static void encode_step(void *arg, oi_status st) {
  codec_step *c = arg;
  oi_xfer_job *job = c->job;
  if (st != OI_OK) { /* the copies failed: the job fails with them (the stream told us alone) */
    if (job->codec_st == OI_OK) job->codec_st = st;
    oi__free(c);
    return;
  }
  size_t nbad =
      oi__codec_stage_encode(job->x->codec, job->host + c->from, c->n, job->bad + c->from);
  if (nbad && !job->bad_msg) job->bad_msg = oi__strdup(oi_last_error());
  job->nbad += nbad;
  oi__free(c);
}

/* On the load stream, before the group's pieces leave the bounce blocks:
 * each slot's frame is verified and decoded; one that does not fails the
 * load. */
static void decode_step(void *arg, oi_status st) {
  codec_step *c = arg;
  oi_xfer_job *job = c->job;
  if (st == OI_OK) {
    st = oi__codec_stage_decode(job->x->codec, job->host + c->from, c->n);
    if (st != OI_OK && job->codec_st == OI_OK) job->codec_msg = oi__strdup(oi_last_error());
  }
  if (st != OI_OK && job->codec_st == OI_OK) job->codec_st = st;
  oi__free(c);
}

_Static_assert((int)OI_CODEC_PIECE_RANS == (int)OI_DECODE_RANS &&
                   (int)OI_CODEC_PIECE_RAW_EXP == (int)OI_DECODE_RAW_EXP &&
                   (int)OI_CODEC_PIECE_BYTES == (int)OI_DECODE_BYTES &&
                   (int)OI_CODEC_PIECE_INT8 == (int)OI_DECODE_INT8 &&
                   (int)OI_CODEC_PIECE_FP8 == (int)OI_DECODE_FP8 &&
                   (int)OI_CODEC_PIECE_RANS32 == (int)OI_DECODE_RANS32 &&
                   (int)OI_CODEC_PIECE_INT8H == (int)OI_DECODE_INT8H &&
                   (int)OI_CODEC_PIECE_PLANES == (int)OI_DECODE_PLANES,
               "a codec piece's kind is the device's");

/* A group decoded on the device: its statuses, written on the stream by
 * stream_decode before checked_on_device runs. */
typedef struct device_step {
  oi_xfer_job *job;
  size_t from, n; /* the job's blocks [from, from + n) */
  char *why;      /* the first frame the host refused, and why */
  int32_t status[];
} device_step;

/* On the load stream, after the device decoded and scattered a group: a
 * frame that did not decode (its block went out as zeros) fails the load. */
static void checked_on_device(void *arg, oi_status st) {
  device_step *c = arg;
  oi_xfer_job *job = c->job;
  size_t bad = SIZE_MAX;
  for (size_t i = 0; i < c->n && bad == SIZE_MAX; i++)
    if (c->status[i]) bad = i;
  if (st == OI_OK && bad != SIZE_MAX) {
    static const char *const why[] = {[OI_DECODE_BAD_STREAM] = "a rANS stream that does not decode",
                                      [OI_DECODE_BAD_SCALE] = "a scale that is not finite",
                                      [OI_DECODE_NAN_CODE] = "an fp8 NaN code"};
    int32_t code = c->status[bad];
    const char *what = c->why ? c->why
                       : code > 0 && code < (int32_t)OI_ARRAY_LEN(why) && why[code]
                           ? why[code]
                           : "an unknown failure";
    st = oi__fail(OI_ERR_PROTOCOL, "load: a frame did not decode on the device (block %zu: %s)",
                  c->from + bad, what);
    OI_LOG_I(OI_LOG_WARN, "engine", log_id(job->x), "%s", oi_last_error());
    if (job->codec_st == OI_OK) job->codec_msg = oi__strdup(oi_last_error());
  }
  if (st != OI_OK && job->codec_st == OI_OK) job->codec_st = st;
  oi__free(c->why);
  oi__free(c);
}

/* A codec group's load on a device that decodes: each slot's frame is read
 * (its header and its streams' lengths, not its checksum: the frame is in
 * this process's pool, and the device checks each stream's end states) and
 * cut into pieces, and the device moves the frames, decodes and scatters
 * them. A frame the host refuses goes out as zeros and fails the load. */
static oi_status queue_device_decode(oi_xfer_job *job, const oi_layout *l, size_t from, size_t n) {
  oi_xfer *x = job->x;
  uint64_t bb = l->block_bytes;
  device_step *c = oi__calloc(1, sizeof *c + n * sizeof c->status[0]);
  uint32_t *fbytes = oi__calloc(n, sizeof *fbytes);
  oi_decode_piece *pieces = NULL;
  oi_codec_piece *cut = NULL;
  size_t npieces = 0, pcap = 0, cut_cap = 0, nd = 0;
  oi_copy_desc *descs = oi__malloc(oi__plan_pieces(l, n) * sizeof *descs);
  oi_status st = OI_OK;
  if (!c || !fbytes || !descs) {
    st = oi__fail(OI_ERR_OUT_OF_MEMORY, "load: out of memory for a decode on the device");
    goto out;
  }
  *c = (device_step){.job = job, .from = from, .n = n};
  oi_decode_batch b = {.n = n,
                       .frames = (const uint8_t *const *)(job->host + from),
                       .frame_bytes = fbytes,
                       .block_bytes = bb,
                       .status = c->status};
  for (size_t i = 0; i < n; i++) {
    const uint8_t *slot = job->host[from + i];
    oi_codec_info in;
    size_t k = 0, need = 0;
    oi_status fst = oi__codec_header_of(slot, x->cfg.frame_bytes, &in);
    if (fst == OI_OK && (in.codec != x->cfg.codec || in.logical_bytes != bb))
      fst = oi__fail(OI_ERR_PROTOCOL, "a frame of codec %u and %u bytes for blocks of %llu",
                     in.codec, in.logical_bytes, (unsigned long long)bb);
    if (fst == OI_OK) need = oi__codec_pieces_max(&in, slot);
    if (fst == OI_OK &&
        (!oi__grow((void **)&cut, &cut_cap, need, sizeof *cut, SIZE_MAX) ||
         !oi__grow((void **)&pieces, &pcap, npieces + need, sizeof *pieces, SIZE_MAX))) {
      st = oi__fail(OI_ERR_OUT_OF_MEMORY, "load: out of memory for a frame's pieces");
      goto out;
    }
    if (fst == OI_OK) fst = oi__codec_pieces(slot, x->cfg.frame_bytes, false, &in, cut, need, &k);
    if (fst != OI_OK) {
      c->status[i] = -1; /* not decoded: its block goes out as zeros */
      if (!c->why) c->why = oi__strdup(oi_last_error());
      fbytes[i] = 0;
      continue;
    }
    fbytes[i] = in.frame_bytes;
    for (size_t j = 0; j < k; j++) {
      const oi_codec_piece *p = &cut[j];
      pieces[npieces++] = (oi_decode_piece){.frame = (uint32_t)i,
                                            .kind = p->kind,
                                            .src = p->src,
                                            .aux = p->aux,
                                            .dst = p->dst,
                                            .len = p->len,
                                            .count = p->count,
                                            .tokens = p->tokens,
                                            .heads = p->heads,
                                            .head_dim = p->head_dim};
      if (p->kind == OI_CODEC_PIECE_INT8 || p->kind == OI_CODEC_PIECE_INT8H)
        b.max_lossy_elems = OI_MAX(b.max_lossy_elems, (uint64_t)p->count * p->head_dim);
      else if (p->kind == OI_CODEC_PIECE_FP8)
        b.max_lossy_elems =
            OI_MAX(b.max_lossy_elems, (uint64_t)p->count * p->tokens * p->heads * p->head_dim);
    }
  }
  b.pieces = pieces;
  b.npieces = npieces;
  /* The arenas' pieces, planned from the bounce blocks (contiguous, one
   * group), then made offsets in the decoded blocks. */
  uint8_t *const *bounce = oi__codec_stage_bounce(x->codec, OI_COPY_H2D);
  oi__plan_build_into(l, job->ids + from, bounce, n, OI_COPY_H2D, descs, oi__plan_pieces(l, n),
                      &nd);
  for (size_t i = 0; i < nd; i++)
    descs[i].src -= (uintptr_t)bounce[0];
  b.descs = descs;
  b.ndescs = nd;
  oi_stream *s = x->stream[OI_COPY_H2D];
  if (OI_FAULT(OI_FAULT_COPY_SUBMIT, NULL))
    st = oi__fail(OI_ERR_IO, "queuing copies failed (injected fault)");
  else
    st = x->dev->ops->stream_decode(s, &b);
  if (st == OI_OK) st = x->dev->ops->stream_call(s, checked_on_device, c);
  if (st == OI_OK) c = NULL; /* the stream's */
out:
  if (c) oi__free(c->why);
  oi__free(c);
  oi__free(fbytes);
  oi__free(pieces);
  oi__free(cut);
  oi__free(descs);
  return st;
}

/* A group encoded on the device: its statuses, written on the stream by
 * stream_encode before encoded_on_device runs. */
typedef struct encode_step_dev {
  oi_xfer_job *job;
  size_t from, n;
  int32_t status[];
} encode_step_dev;

/* On the save stream, after the group's frames landed in their slots: a
 * block whose frame did not fit its slot, or that the codec refused, is
 * marked, as a host encode marks it (its slot is not kept). */
static void encoded_on_device(void *arg, oi_status st) {
  encode_step_dev *c = arg;
  oi_xfer_job *job = c->job;
  if (st != OI_OK) { /* the copies failed: the job fails with them */
    if (job->codec_st == OI_OK) job->codec_st = st;
    oi__free(c);
    return;
  }
  size_t nbad = 0, refused = 0;
  for (size_t i = 0; i < c->n; i++)
    if (c->status[i]) {
      job->bad[c->from + i] = 1;
      nbad++;
      refused += c->status[i] == OI_ENCODE_REFUSED;
    }
  if (nbad && !job->bad_msg) {
    if (refused)
      oi__fail(OI_ERR_INVALID_ARGUMENT,
               "codec %s: a block with a non-finite value or one past the scales' range "
               "(encoded on the device)",
               oi__codec_name(job->x->cfg.codec));
    else
      oi__fail(OI_ERR_INVALID_ARGUMENT, "a frame made on the device is past its %llu-byte slot",
               (unsigned long long)job->x->cfg.frame_bytes);
    job->bad_msg = oi__strdup(oi_last_error());
    OI_LOG_I(OI_LOG_DEBUG, "engine", log_id(job->x), "%zu blocks not encoded: %s", nbad,
             job->bad_msg);
  }
  job->nbad += nbad;
  oi__free(c);
}

/* A codec group's save on a device that makes frames: the device
 * gathers the blocks from the arenas, makes their frames and moves them
 * into the slots (no host encode, no bounce). The plan is the bounce's
 * (contiguous blocks of one group) made offsets in the device's blocks. */
static oi_status queue_device_encode(oi_xfer_job *job, const oi_layout *l, size_t from, size_t n) {
  oi_xfer *x = job->x;
  encode_step_dev *c = oi__calloc(1, sizeof *c + n * sizeof c->status[0]);
  oi_copy_desc *descs = oi__malloc(oi__plan_pieces(l, n) * sizeof *descs);
  size_t nd = 0;
  oi_status st = OI_OK;
  if (!c || !descs) {
    st = oi__fail(OI_ERR_OUT_OF_MEMORY, "save: out of memory for an encode on the device");
    goto out;
  }
  *c = (encode_step_dev){.job = job, .from = from, .n = n};
  uint8_t *const *bounce = oi__codec_stage_bounce(x->codec, OI_COPY_D2H);
  oi__plan_build_into(l, job->ids + from, bounce, n, OI_COPY_D2H, descs, oi__plan_pieces(l, n),
                      &nd);
  for (size_t i = 0; i < nd; i++)
    descs[i].dst -= (uintptr_t)bounce[0];
  oi_encode_batch b = {.n = n,
                       .slots = job->host + from,
                       .block_bytes = l->block_bytes,
                       .frame_bytes = x->cfg.frame_bytes,
                       .plan = &x->encode_plan,
                       .descs = descs,
                       .ndescs = nd,
                       .status = c->status};
  oi_stream *s = x->stream[OI_COPY_D2H];
  if (OI_FAULT(OI_FAULT_COPY_SUBMIT, NULL))
    st = oi__fail(OI_ERR_IO, "queuing copies failed (injected fault)");
  else
    st = x->dev->ops->stream_encode(s, &b);
  if (st == OI_OK) st = x->dev->ops->stream_call(s, encoded_on_device, c);
  if (st == OI_OK) c = NULL; /* the stream's */
out:
  oi__free(c);
  oi__free(descs);
  return st;
}

/* Per-arena progress of a layered load (oi_ticket_arena_wait, every
 * backend). Without a codec, on CUDA each arena's event answers (a host
 * callback per arena would stall the load stream between arenas); else a
 * stream callback after each arena reports it to the ticket: a codec's
 * decode step is a host function on the stream already, and a frame that
 * did not decode must fail the arenas after it, which an event cannot say. */
static bool arenas_by_event(const oi_xfer *x) {
  return x->dev->ordinal >= 0 && x->cfg.codec == OI_CODEC_NONE;
}

/* What a layered load's arenas landed with, once a stream step after their
 * copies ran with `st`: a failed step fails them, and so does a frame that
 * did not decode (the job's codec_st, set by an earlier step of the same
 * stream: the arenas' bytes are then a cleared bounce block's). */
static oi_status arena_status(oi_xfer_job *job, oi_status st) {
  if (st != OI_OK && job->arena_st == OI_OK) job->arena_st = st;
  return job->arena_st != OI_OK ? job->arena_st : job->codec_st;
}

/* Runs on the stream after one arena's copies of a layered load. */
static void arena_landed(void *arg, oi_status st) {
  arena_cb *cb = arg;
  oi__ticket_arena_landed(cb->job->progress, cb->arena, arena_status(cb->job, st));
}

/* Arena a's event of a layered load, where there are events (CUDA). */
static oi_status arena_event(oi_xfer_job *job, uint32_t a, void **evs) {
  oi_xfer *x = job->x;
  return evs ? x->dev->ops->stream_record_event(x->stream[OI_COPY_H2D], &evs[a]) : OI_OK;
}

/* After arena a's copies of a layered load: its event (CUDA) and, where
 * the progress is not the events', its report (arena_landed). */
static oi_status mark_arena(oi_xfer_job *job, uint32_t a, void **evs) {
  oi_xfer *x = job->x;
  oi_stream *s = x->stream[OI_COPY_H2D];
  oi_status st = arena_event(job, a, evs);
  job->arena_cbs[a] = (arena_cb){.job = job, .arena = a};
  if (st == OI_OK && job->progress)
    st = x->dev->ops->stream_call(s, arena_landed, &job->arena_cbs[a]);
  return st;
}

/* Runs on the stream after a layered load's last group was decoded and
 * scattered on the device: every arena landed at once, reported in order
 * (one host call, not one an arena: each holds the stream). */
static void arenas_landed(void *arg, oi_status st) {
  oi_xfer_job *job = arg;
  oi_status now = arena_status(job, st);
  for (uint32_t a = 0; a < job->x->cfg.layout->num_arenas; a++)
    oi__ticket_arena_landed(job->progress, a, now);
}

/* Queues, arena by arena, the copies of n pairs (device ids[i] <- host[i])
 * of a layered load, each followed by its arena's event (CUDA) and, where
 * the progress is not the events', its report (arena_landed). */
static oi_status queue_arenas(oi_xfer_job *job, const int64_t *ids, uint8_t *const *host, size_t n,
                              void **evs) {
  oi_xfer *x = job->x;
  const oi_layout *l = x->cfg.layout;
  oi_stream *s = x->stream[OI_COPY_H2D];
  uint32_t mode = x->mode[OI_COPY_H2D] == OI_XFER_STAGED ? OI_XFER_DMA : x->mode[OI_COPY_H2D];
  oi_layout one = *l;
  one.num_arenas = 1;
  oi_status st = OI_OK;
  for (uint32_t a = 0; a < l->num_arenas && st == OI_OK; a++) {
    one.arenas = &l->arenas[a];
    one.block_bytes = (uint64_t)one.arenas->segments * one.arenas->bytes_per_block;
    st = queue_copies_in(x, &one, mode, s, OI_COPY_H2D, ids, host, n);
    if (st == OI_OK) st = mark_arena(job, a, evs);
  }
  return st;
}

/* Queues blocks [from, from + n) of the job (at most a group) through the
 * bounce blocks: D2H copies then the encode step, or the decode step then
 * H2D copies (a layered load's: arena by arena, queue_arenas), as one unit
 * of the direction's stream. */
static oi_status queue_codec_blocks(oi_xfer_job *job, const oi_layout *l, uint32_t mode,
                                    size_t from, size_t n, bool arenas, void **evs) {
  oi_xfer *x = job->x;
  int d = job->dir;
  if (n == 0) return OI_OK;
  if (n > x->group_blocks[d])
    return oi__fail(OI_ERR_INTERNAL, "a codec group of %zu blocks past its bounce of %llu", n,
                    (unsigned long long)x->group_blocks[d]);
  /* Staged copies move whole host blocks on auxiliary streams that a host
   * function on the stream does not order (measured on the H200: a staged
   * load read bounce blocks its decode step had not written yet): the
   * bounce goes by DMA (or the copy kernel). */
  if (mode == OI_XFER_STAGED) mode = OI_XFER_DMA;
  if (d == OI_COPY_D2H && x->device_encode) {
    oi__codec_stage_lock(x->codec, d);
    oi_status st = queue_device_encode(job, l, from, n);
    oi__codec_stage_unlock(x->codec, d);
    return st;
  }
  if (d == OI_COPY_H2D && x->device_decode) {
    /* The device decodes and scatters the group at once: a layered load's
     * arenas land after it, all of them (their events, then one report of
     * them all where the progress is not the events'). */
    oi__codec_stage_lock(x->codec, d);
    oi_status st = queue_device_decode(job, l, from, n);
    oi__codec_stage_unlock(x->codec, d);
    for (uint32_t a = 0; arenas && st == OI_OK && a < x->cfg.layout->num_arenas; a++)
      st = arena_event(job, a, evs);
    /* (under a codec the progress is always the reports: arenas_by_event) */
    if (!arenas || st != OI_OK) return st;
    return x->dev->ops->stream_call(x->stream[OI_COPY_H2D], arenas_landed, job);
  }
  codec_step *c = oi__malloc(sizeof *c);
  if (!c) return oi__fail(OI_ERR_OUT_OF_MEMORY, "out of memory for a codec step");
  *c = (codec_step){.job = job, .from = from, .n = n};
  oi_stream *s = x->stream[d];
  oi_status st;
  uint8_t *const *bounce = oi__codec_stage_bounce(x->codec, d);
  oi__codec_stage_lock(x->codec, d);
  if (d == OI_COPY_D2H) {
    st = queue_copies_in(x, l, mode, s, OI_COPY_D2H, job->ids + from, bounce, n);
    if (st == OI_OK) st = x->dev->ops->stream_call(s, encode_step, c);
  } else {
    st = x->dev->ops->stream_call(s, decode_step, c);
    if (st == OI_OK) {
      c = NULL; /* the stream's now */
      st = arenas ? queue_arenas(job, job->ids + from, bounce, n, evs)
                  : queue_copies_in(x, l, mode, s, OI_COPY_H2D, job->ids + from, bounce, n);
    }
  }
  oi__codec_stage_unlock(x->codec, d);
  if (st != OI_OK) oi__free(c);
  return st;
}

static void queue_group(oi_xfer_job *job) {
  oi_xfer *x = job->x;
  const oi_layout *l = x->cfg.layout;
  uint32_t mode = x->mode[job->dir];
  oi_layout view;
  if (job->arena_count) { /* some arenas: a view of the layout */
    view = *l;
    view.arenas = &l->arenas[job->arena_first];
    view.num_arenas = job->arena_count;
    view.block_bytes = job_block_bytes(job);
    l = &view;
    if (mode == OI_XFER_STAGED) mode = OI_XFER_DMA;
  }
  /* A job of some arenas copies into whole host blocks as they are, under
   * a codec too: its host blocks are per-block bounces (oi__xfer_bounce),
   * encoded once every arena landed (oi__xfer_encode). */
  if (job->queue_st == OI_OK && x->cfg.codec != OI_CODEC_NONE && !job->arena_count)
    job->queue_st =
        queue_codec_blocks(job, l, mode, job->queued, job->n - job->queued, false, NULL);
  else if (job->queue_st == OI_OK)
    job->queue_st =
        queue_copies_in(x, l, mode, x->stream[job->dir], job->dir, job->ids + job->queued,
                        job->host + job->queued, job->n - job->queued);
  job->queued = job->n;
  job->group = x->group_blocks[job->dir];
}

/* A layered load: each arena's copies, then (CUDA) an event and, where the
 * events are not the progress (arenas_by_event), a stream callback that
 * reports the arena to the ticket (oi_ticket_arena_wait, every backend).
 * The events go to the ticket (which destroys them) once all are queued.
 * Under a codec, the frames of a group are decoded into the bounce first:
 * a load of more than one bounce group lands its first groups whole, and
 * its last group arena by arena (arena a of every block is in place once
 * the last group's copies of it landed). */
static oi_status queue_layered(oi_xfer_job *job) {
  oi_xfer *x = job->x;
  const oi_layout *l = x->cfg.layout;
  bool cuda = x->dev->ordinal >= 0;
  void **evs = cuda ? oi__calloc(l->num_arenas, sizeof *evs) : NULL;
  job->arena_cbs = oi__calloc(l->num_arenas, sizeof *job->arena_cbs);
  if ((cuda && !evs) || !job->arena_cbs) {
    oi__free(evs);
    return oi__fail(OI_ERR_OUT_OF_MEMORY, "load: out of memory for arena events");
  }
  if (!arenas_by_event(x)) {
    oi__ticket_retain(job->ticket);
    job->progress = job->ticket;
    oi__ticket_arena_progress(job->progress, l->num_arenas);
  }
  oi_status st = OI_OK;
  if (x->cfg.codec == OI_CODEC_NONE) {
    st = queue_arenas(job, job->ids, job->host, job->n, evs);
  } else {
    uint64_t g = x->group_blocks[OI_COPY_H2D];
    size_t last = job->n - (size_t)((job->n - 1) % g + 1); /* the last group's first block */
    uint32_t mode = x->mode[OI_COPY_H2D];
    for (size_t at = 0; at < last && st == OI_OK; at += g)
      st = queue_codec_blocks(job, l, mode, at, g, false, NULL);
    if (st == OI_OK) st = queue_codec_blocks(job, l, mode, last, job->n - last, true, evs);
  }
  job->queued = job->n;
  if (st == OI_OK) {
    if (cuda) {
      oi__ticket_set_arena_events(job->ticket, evs, l->num_arenas, x->dev->ops->event_destroy);
      if (arenas_by_event(x)) oi__ticket_set_arena_query(job->ticket, x->dev->ops->event_query);
    }
    return OI_OK;
  }
  for (uint32_t a = 0; cuda && a < l->num_arenas; a++)
    if (evs[a]) x->dev->ops->event_destroy(evs[a]);
  oi__free(evs);
  return st;
}

/* Queues the completion of `job` after its copies: an event for the ticket
 * (so a compute stream can wait on the device rather than the CPU waiting on
 * the ticket), then the hand-over to the completion thread. */
static oi_status queue_completion(oi_xfer_job *job) {
  oi_xfer *x = job->x;
  oi_stream *s = x->stream[job->dir];
  oi_status st = OI_OK;
  if (job->ticket) {
    void *ev = NULL;
    st = x->dev->ops->stream_record_event(s, &ev);
    if (st == OI_OK && ev) oi__ticket_set_cuda_event(job->ticket, ev, x->dev->ops->event_destroy);
  }
  if (st != OI_OK) return st;
  uint32_t ms = x->cfg.deadline_ms[job->dir];
  int d = job->dir;
  pthread_mutex_lock(&x->lock);
  job->deadline_ns = oi__deadline_ns(ms ? ms : UINT32_MAX); /* under the lock: in list order */
  job->out_prev = x->out_tail[d];
  job->out_next = NULL;
  if (x->out_tail[d])
    x->out_tail[d]->out_next = job;
  else
    x->out_head[d] = job;
  x->out_tail[d] = job;
  /* The done thread re-arms its timer, only when it sleeps past this
   * deadline (awake, it looks at the lists before sleeping again). */
  if (x->asleep && job->deadline_ns < x->asleep_until) pthread_cond_signal(&x->cv);
  pthread_mutex_unlock(&x->lock);
  if (OI_FAULT(OI_FAULT_COMPLETION_SUBMIT, NULL))
    st = oi__fail(OI_ERR_IO, "queuing a completion failed (injected fault)");
  else
    st = x->dev->ops->stream_call(s, job_arrived, job);
  if (st != OI_OK) {
    pthread_mutex_lock(&x->lock);
    outstanding_remove_locked(x, job);
    pthread_mutex_unlock(&x->lock);
  }
  return st;
}

/* After a failure to queue part of a job: let whatever was queued finish (a
 * host slot is never freed under a copy that may still run), then complete
 * the job with `st` instead of handing the ticket to the caller. */
static oi_status fail_job(oi_xfer_job *job, oi_ticket *job_ticket, oi_status st, const char *what) {
  char msg[256];
  snprintf(msg, sizeof msg, "%s", oi_last_error());
  oi_xfer *x = job->x;
  x->dev->ops->stream_sync(x->stream[job->dir]);
  oi_ticket *producer = job->ticket; /* NULL once a deadline completed it */
  job->status = st;
  job->ticket = NULL;
  job->on_done = NULL;
  complete_job(job);
  if (producer) oi__ticket_unref(producer);
  /* The observer's reference: the caller gets the error, not a ticket. */
  if (job_ticket) oi__ticket_unref(job_ticket);
  return oi__fail(st, "%s: %s", what, msg);
}

/* ---- jobs ------------------------------------------------------------------------ */

oi_xfer_job *oi__xfer_job_new(oi_xfer *x, oi_copy_dir dir, size_t cap, uint32_t flags,
                              size_t user_bytes) {
  size_t head = (sizeof(oi_xfer_job) + 15) & ~(size_t)15;
  size_t user_off = head + cap * (sizeof(int64_t) + sizeof(uint8_t *));
  size_t bad_off = user_off, bad_bytes = 0;
  if (x->cfg.codec != OI_CODEC_NONE && dir == OI_COPY_D2H)
    bad_bytes = cap; /* encode_step's marks */
  user_off = (user_off + bad_bytes + 15) & ~(size_t)15;
  /* Zeroed: the head only; the piece arrays and the owner's part are
   * written before they are read (clearing a large call's would cost a pass
   * of their own). */
  oi_xfer_job *job = oi__malloc(user_off + user_bytes);
  if (!job) return NULL;
  memset(job, 0, head);
  if (flags & OI_XFER_JOB_TICKET) {
    job->ticket = oi__ticket_new();
    if (!job->ticket) {
      oi__free(job);
      return NULL;
    }
  }
  job->x = x;
  job->dir = dir;
  job->flags = flags;
  job->cap = cap;
  job->t0_ns = oi__now_ns();
  job->ids = (int64_t *)((char *)job + head);
  job->host = (uint8_t **)(job->ids + cap);
  job->user = (char *)job + user_off;
  if (bad_bytes) {
    job->bad = (uint8_t *)job + bad_off;
    memset(job->bad, 0, bad_bytes);
  }
  /* Loads: the first group is small (a restore's latency starts with it). */
  uint64_t g = x->group_blocks[dir];
  job->group = dir == OI_COPY_H2D
                   ? OI_MIN(g, blocks_per_group(OI_DMA_GROUP_BYTES, x->cfg.layout->block_bytes))
                   : g;
  return job;
}

void *oi__xfer_job_user(oi_xfer_job *job) { return job->user; }

oi_ticket *oi__xfer_job_ticket(const oi_xfer_job *job) { return job->ticket; }

void oi__xfer_job_on_done(oi_xfer_job *job, oi_xfer_notify_fn fn, void *ctx) {
  job->on_done = fn;
  job->on_done_ctx = ctx;
}

void oi__xfer_job_free(oi_xfer_job *job) {
  if (!job) return;
  if (job->ticket) {
    oi__ticket_unref(job->ticket);
    oi__ticket_unref(job->ticket);
  }
  oi__free(job);
}

void oi__xfer_job_arenas(oi_xfer_job *job, uint32_t first, uint32_t count) {
  job->arena_first = first;
  job->arena_count = count;
}

void oi__xfer_job_wait_event(oi_xfer_job *job, void *event) {
  if (!event || job->queue_st != OI_OK) return;
  oi_xfer *x = job->x;
  job->queue_st = x->dev->ops->stream_wait_event(x->stream[job->dir], event);
}

static bool layered(const oi_xfer_job *job) {
  return (job->flags & OI_XFER_JOB_LAYERED) && job->dir == OI_COPY_H2D && job->ticket;
}

void oi__xfer_add_many(oi_xfer_job *job, const int64_t *ids, uint8_t *const *host, size_t n) {
  bool whole = layered(job); /* queued at submit, arena by arena */
  while (n) {
    size_t room = whole ? n : job->group - OI_MIN(job->group, job->n - job->queued);
    size_t k = OI_MIN(n, OI_MAX(room, (size_t)1));
    memcpy(job->ids + job->n, ids, k * sizeof *ids);
    memcpy(job->host + job->n, host, k * sizeof *host);
    job->n += k;
    ids += k;
    host += k;
    n -= k;
    if (!whole && job->n - job->queued >= job->group) queue_group(job);
  }
}

void oi__xfer_add(oi_xfer_job *job, int64_t id, uint8_t *host) {
  oi__xfer_add_many(job, &id, &host, 1);
}

oi_status oi__xfer_submit(oi_xfer_job *job, const char *what) {
  oi_ticket *t = job->ticket;
  oi_status st = job->queue_st;
  if (st == OI_OK && job->n == 0) { /* nothing to copy: done now */
    job->status = OI_OK;
    complete_job(job);
    return OI_OK;
  }
  if (st == OI_OK) {
    if (layered(job)) {
      st = queue_layered(job);
    } else {
      queue_group(job);
      st = job->queue_st;
    }
  }
  if (st == OI_OK) st = queue_completion(job);
  if (st != OI_OK) return fail_job(job, t, st, what);
  return OI_OK;
}

/* ---- layerwise saves under a codec ------------------------------------------------ */

uint8_t *oi__xfer_bounce(oi_xfer *x) {
  if (!x->codec) return NULL;
  return oi__codec_stage_block_take(x->codec);
}

void oi__xfer_bounce_free(oi_xfer *x, uint8_t *bounce) {
  if (x->codec) oi__codec_stage_block_put(x->codec, bounce);
}

size_t oi__xfer_encode(oi_xfer *x, uint8_t *const *src, uint8_t *const *slots, size_t n,
                       uint8_t *bad) {
  if (!x->codec) {
    memset(bad, 1, n);
    oi__fail(OI_ERR_INTERNAL, "encode: the pipeline has no codec");
    return n;
  }
  memset(bad, 0, n); /* the stage marks the blocks it failed, only them */
  return oi__codec_stage_encode_from(x->codec, src, slots, n, bad);
}

/* ---- pipelines --------------------------------------------------------------- */

/* The codec's frame header and XXH3 secret into the device's encode plan
 * (both plans, lossless and lossy, carry them); true. */
static bool take_header(oi_xfer *x, const uint8_t header[24], const uint8_t secret[192]) {
  _Static_assert(sizeof x->encode_plan.header == sizeof((oi_lossless_gpu_plan *)0)->header &&
                     sizeof x->encode_plan.secret == sizeof((oi_lossless_gpu_plan *)0)->secret &&
                     sizeof x->encode_plan.header == sizeof((oi_lossy_gpu_plan *)0)->header &&
                     sizeof x->encode_plan.secret == sizeof((oi_lossy_gpu_plan *)0)->secret,
                 "the device's encode plan is the codec's");
  memcpy(x->encode_plan.header, header, sizeof x->encode_plan.header);
  memcpy(x->encode_plan.secret, secret, sizeof x->encode_plan.secret);
  return true;
}

/* A lossy codec's plan of frames made on the device; false where its
 * encoder there does not take the shape (the host encodes). */
static bool device_lossy_plan(oi_xfer *x) {
  const oi_xfer_config *c = &x->cfg;
  oi_lossy_gpu_plan p;
  bool ok = oi__lossy_gpu_plan(c->codec, &c->codec_shape, c->layout->block_bytes, &p);
  if (ok && p.rot_block > 1 && p.head_dim > OI_ENCODE_LOSSY_MAX_DIM)
    ok = !oi__fail(OI_ERR_INVALID_ARGUMENT, "head_dim %u is past the device encoder's %u",
                   p.head_dim, OI_ENCODE_LOSSY_MAX_DIM);
  if (!ok) {
    OI_LOG_I(OI_LOG_INFO, "engine", log_id(x), "%s saves encode on the host: %s",
             oi__codec_name(c->codec), oi_last_error());
    return false;
  }
  x->encode_plan = (oi_encode_plan){.kind = c->codec == OI_CODEC_INT8  ? OI_ENCODE_INT8
                                            : c->codec == OI_CODEC_FP8 ? OI_ENCODE_FP8
                                                                       : OI_ENCODE_INT8H,
                                    .parts = p.parts,
                                    .payload_bytes = p.payload_bytes,
                                    .tokens = p.tokens,
                                    .heads = p.heads,
                                    .head_dim = p.head_dim,
                                    .rot_block = p.rot_block,
                                    .down = p.down,
                                    .seed = p.seed};
  return take_header(x, p.header, p.secret);
}

/* Whether saves make their frames on the device, and their plan. */
static bool device_encode_plan(oi_xfer *x) {
  const oi_xfer_config *c = &x->cfg;
  if (c->codec == OI_CODEC_NONE || c->codec_host_encode || !x->dev->ops->stream_encode ||
      c->frame_bytes % 8)
    return false;
  if (c->codec != OI_CODEC_LOSSLESS) return device_lossy_plan(x);
  oi_lossless_gpu_plan p;
  if (!oi__lossless_gpu_plan(&c->codec_shape, c->layout->block_bytes, &p)) {
    OI_LOG_I(OI_LOG_INFO, "engine", log_id(x), "lossless saves encode on the host: %s",
             oi_last_error());
    return false;
  }
  x->encode_plan = (oi_encode_plan){.kind = OI_ENCODE_LOSSLESS,
                                    .parts = p.parts,
                                    .segs_parts = p.segs_parts,
                                    .segs_whole = p.segs_whole,
                                    .max_segs = p.max_segs,
                                    .stream_cap = p.stream_cap,
                                    .planes = c->codec_planes};
  return take_header(x, p.header, p.secret);
}

oi_status oi__xfer_create(const oi_xfer_config *c, oi_xfer **out) {
  *out = NULL;
  oi_xfer *x = oi__calloc(1, sizeof *x);
  if (!x) return oi__fail(OI_ERR_OUT_OF_MEMORY, "register: out of memory");
  x->cfg = *c;
  pthread_mutex_init(&x->lock, NULL);
  for (int d = 0; d < 2; d++)
    pthread_mutex_init(&x->plan_lock[d], NULL);
  oi__cond_init_monotonic(&x->cv);
  oi_status st;
  if (c->dev)
    x->dev = c->dev; /* borrowed: its owner closes it */
  else if ((st = oi__dev_open(c->device, &x->dev)) != OI_OK)
    goto fail;
  x->device_decode =
      c->codec != OI_CODEC_NONE && !c->codec_host_decode && x->dev->ops->stream_decode;
  for (int d = 0; d < 2; d++) {
    x->mode[d] = oi__xfer_resolve_mode(c->layout, c->copy_mode, (oi_copy_dir)d);
    /* A codec's groups are its bounce's (and its codec steps'): 32 MiB in
     * every mode, but 16 MiB for loads of the planes code decoded on the
     * device (OI_PLANES_LOAD_GROUP_BYTES). Groups of 8 MiB in DMA mode
     * queued four times the codec steps, each of which holds the stream
     * while the host encodes. */
    uint64_t bytes = c->group_bytes                                           ? c->group_bytes
                     : x->mode[d] == OI_XFER_DMA && c->codec == OI_CODEC_NONE ? OI_DMA_GROUP_BYTES
                     : d == OI_COPY_H2D && c->codec_planes && x->device_decode
                         ? OI_PLANES_LOAD_GROUP_BYTES
                         : OI_KERNEL_GROUP_BYTES;
    x->group_blocks[d] = blocks_per_group(bytes, c->layout->block_bytes);
  }
  oi_codec_stage_config sc = {.codec = c->codec,
                              .shape = c->codec_shape,
                              .block_bytes = c->layout->block_bytes,
                              .frame_bytes = c->frame_bytes,
                              .block_bounce_bytes = c->block_bounce_bytes
                                                        ? c->block_bounce_bytes
                                                        : OI_XFER_BLOCK_BOUNCE_BYTES,
                              .planes = c->codec_planes,
                              .log_id = c->log_id};
  if (c->codec != OI_CODEC_NONE &&
      (st = oi__codec_stage_create(x->dev, &sc, x->group_blocks, &x->codec)) != OI_OK)
    goto fail;
  x->device_encode = device_encode_plan(x);
  if ((st = x->dev->ops->stream_create(x->dev, 0, &x->stream[OI_COPY_D2H])) != OI_OK) goto fail;
  if ((st = x->dev->ops->stream_create(x->dev, 1, &x->stream[OI_COPY_H2D])) != OI_OK) goto fail;
  int rc = pthread_create(&x->done_thread, NULL, done_main, x);
  if (rc != 0) {
    st = oi__fail(OI_ERR_INTERNAL, "register: cannot start a completion thread: %s", strerror(rc));
    goto fail;
  }
  pthread_setname_np(x->done_thread, "oi-engine-done");
  x->done_started = true;
  *out = x;
  return OI_OK;
fail:
  oi__xfer_destroy(x);
  return st;
}

void oi__xfer_destroy(oi_xfer *x) {
  if (!x) return;
  if (x->dev) {
    if (x->stream[OI_COPY_H2D]) x->dev->ops->stream_destroy(x->stream[OI_COPY_H2D]);
    if (x->stream[OI_COPY_D2H]) x->dev->ops->stream_destroy(x->stream[OI_COPY_D2H]);
  }
  if (x->done_started) {
    pthread_mutex_lock(&x->lock);
    x->stopping = true;
    pthread_cond_broadcast(&x->cv);
    pthread_mutex_unlock(&x->lock);
    pthread_join(x->done_thread, NULL);
  }
  oi__codec_stage_destroy(x->codec);
  if (x->dev != x->cfg.dev) oi__dev_close(x->dev);
  pthread_cond_destroy(&x->cv);
  pthread_mutex_destroy(&x->lock);
  for (int d = 0; d < 2; d++) {
    pthread_mutex_destroy(&x->plan_lock[d]);
    oi__free(x->plan_buf[d]);
  }
  oi__free(x);
}
