/* The copy pipeline: moves pieces between device memory (the arenas of a
 * layout) and host memory on a device's streams, and completes each job on
 * its own thread. It owns the copy-mode policy (AUTO), the grouping of a
 * job's copies as they are added, the per-layer (arena by arena) queueing of
 * loads, deadlines, and the completion thread, so user callbacks never run on
 * a driver thread. It knows layouts, the device interface and tickets,
 * nothing of engines or host tiers: a job is a list of (device block id, host
 * address) pairs and a callback for its owner.
 *
 * Each pipeline has two streams: D2H jobs (saves) run on a normal-priority
 * one, H2D jobs (loads) on a high-priority one, so loads never wait behind
 * queued saves. */
#ifndef OI_TRANSFER_TRANSFER_H
#define OI_TRANSFER_TRANSFER_H

#include "codec/codec.h"
#include "transfer/plan.h"

/* ---- the copy policy (copy mode AUTO) ---- */

/* Blocks whose pieces (after merging) are at least this large go to the copy
 * engines in both directions: they run at full speed there and cost the
 * model's kernels nothing (a page-first layout: one piece per block). */
#define OI_AUTO_DMA_PIECE_BYTES (1ull << 20)
/* Otherwise, host blocks at least this large are staged: the copy engines
 * move whole host blocks at the bulk rate through device staging slots and a
 * short kernel gathers or scatters the pieces. Smaller blocks whose pieces
 * are at least OI_AUTO_SMALL_PIECE_BYTES are staged too, both ways
 * (pages-42k on the H200, six runs: saves 0.89-0.93 of bulk staged against
 * 0.79-0.87 piece by piece on the copy engines; loads 0.82-0.90 against
 * 0.77-0.85 by the copy kernel; staging's kernels cost the model a few
 * percent, as for the model shapes). Smaller pieces: the copy kernel both
 * ways (4 KiB pieces: 0.07 of bulk piece by piece, 0.34 by the kernel on
 * the H200; the kernel takes SMs from the model, but a save path that slow
 * backs up). */
#define OI_AUTO_STAGE_BLOCK_BYTES (256ull << 10)
#define OI_AUTO_SMALL_PIECE_BYTES (16ull << 10)

/* Copies are queued in groups of about this many bytes as pieces are added,
 * so the device starts moving the first blocks while the caller is still
 * preparing the rest of a large batch (oi_xfer_config.group_bytes). */
#define OI_DMA_GROUP_BYTES (8ull << 20)     /* many batch calls keep the copy engines fed */
#define OI_KERNEL_GROUP_BYTES (32ull << 20) /* each launch has a tail: fewer, larger ones */
/* Loads of the planes code decoded on the device: its decode is parallel
 * within a batch (a warp a chunk), so smaller batches start decoding
 * sooner behind the link; a rANS batch decodes in about the time of one
 * stream, whatever its size, and keeps OI_KERNEL_GROUP_BYTES. */
#define OI_PLANES_LOAD_GROUP_BYTES (16ull << 20)

/* The mode (OI_XFER_*) `copy_mode` (an oi_copy_mode) resolves to for
 * direction `dir` of layout `l`. */
uint32_t oi__xfer_resolve_mode(const oi_layout *l, uint32_t copy_mode, oi_copy_dir dir);

/* ---- pipelines ---- */

typedef struct oi_xfer oi_xfer;
typedef struct oi_xfer_job oi_xfer_job;

/* What a job's owner learns when it ends. */
typedef struct oi_xfer_result {
  oi_copy_dir dir;
  /* OI_OK, the copy's error, or OI_ERR_TIMEOUT when the job missed its
   * deadline (its ticket and on_done were told then; what it copied is not
   * to be trusted). */
  oi_status status;
  size_t n;             /* pieces pairs (blocks) the job moved */
  uint64_t bytes;       /* n x the layout's block bytes (of the job's arenas) */
  uint32_t arena_count; /* 0: whole blocks; else the job moved these arenas only */
  uint64_t latency_ns;  /* from oi__xfer_job_new to the end */
  /* A save through the codec stage: failed[i] != 0 when block i could not
   * be encoded into its slot (its frame did not fit, or a lossy codec met a
   * value it cannot scale); its slot holds nothing to keep. NULL: none
   * failed. Valid during the done callback only. */
  const uint8_t *failed;
  size_t nfailed;
  const char *failed_why; /* the first failed block's reason (NULL: not known) */
} oi_xfer_result;

/* Runs once per job, when its copies ended and before its on_done and
 * ticket: on the completion thread, or on the submitting thread for a job
 * that copied nothing or failed to queue. `user` is the job's user area. */
typedef void (*oi_xfer_done_fn)(void *ctx, void *user, const oi_xfer_result *r);

/* Called with a job's final status (on_done of a job). */
typedef void (*oi_xfer_notify_fn)(void *ctx, oi_status st);

typedef struct oi_xfer_config {
  int device;              /* -1 cpu */
  oi_dev *dev;             /* a device already open, used instead of `device`, which
                              its owner closes after the pipeline (a test's backend of
                              its own); NULL: the pipeline opens `device` */
  const oi_layout *layout; /* the device side of every job; outlives the pipeline */
  uint32_t copy_mode;      /* oi_copy_mode (AUTO: oi__xfer_resolve_mode) */
  uint32_t cta_limit;      /* kernel copies: most CTAs; 0 = the backend's default */
  bool host_mapped;        /* host addresses are pinned memory kernels may address */
  uint64_t group_bytes;    /* bytes per queued group; 0 = the resolved mode's default */
  uint64_t staging_bytes;  /* staged copies: staging per stream; 0 = the backend's default */
  uint32_t deadline_ms[2]; /* per direction ([OI_COPY_D2H], [OI_COPY_H2D]); 0 = none */
  const uint32_t *log_id;  /* the owner's instance id, for log lines (may be NULL) */
  /* The codec stage (docs/codecs.md). OI_CODEC_NONE (0): host addresses
   * are host blocks, copied as they are. Otherwise every host address is
   * a slot of frame_bytes holding one frame: a save's pieces land in a
   * bounce block of the pipeline's own and are encoded into the slot (the
   * slot's bytes past the frame are zeroed); a load's frames are verified
   * and decoded into a bounce block and its pieces go from there. A queued
   * group's copies and its codec step are one unit on the stream, so one
   * bounce buffer of a group per direction serves every job. A layered
   * load decodes a group's frames into the bounce, then copies it arena by
   * arena (OI_XFER_JOB_LAYERED). A job of some arenas (oi__xfer_job_arenas,
   * a layerwise save) copies into whole host blocks as they are: under a
   * codec they are per-block bounces (oi__xfer_bounce), encoded into their
   * slots by oi__xfer_encode once every arena landed. */
  int codec; /* oi_codec_id */
  oi_codec_shape codec_shape;
  uint64_t frame_bytes;
  /* Loads: the frames cross the link and the device decodes them
   * (dev_ops.stream_decode, the cuda backend) unless this is set or the
   * backend has none; then the host decodes into the bounce. */
  bool codec_host_decode;
  /* Saves: the device gathers the blocks and makes their frames
   * (dev_ops.stream_encode, the cuda backend; lossless blocks whose streams
   * are all wide, oi__lossless_gpu_plan; lossy blocks of the shapes
   * oi__lossy_gpu_plan takes) unless codec_host_encode is set; else the
   * host encodes the bounce. */
  bool codec_host_encode;
  /* A lossless namespace's frames code their exponents by the planes code
   * (codec/planes.h; the engine's default, OI_LOSSLESS_CODE=rans unsets
   * it: frames of format 4, which builds before it refuse). Its saves and
   * loads code where they would under rANS; its loads decoded on the
   * device go in groups of OI_PLANES_LOAD_GROUP_BYTES. */
  bool codec_planes;
  /* The most bytes of per-block bounces (oi__xfer_bounce) at once; 0 =
   * OI_XFER_BLOCK_BOUNCE_BYTES. At least one block. */
  uint64_t block_bounce_bytes;
  oi_xfer_done_fn done;
  void *done_ctx;
} oi_xfer_config;

/* The per-block bounces' default bound (oi_xfer_config.block_bounce_bytes). */
#define OI_XFER_BLOCK_BOUNCE_BYTES (256ull << 20)

/* Opens the device, creates the two streams and starts the completion
 * thread. Messages start with "register". */
oi_status oi__xfer_create(const oi_xfer_config *c, oi_xfer **out);
/* Finishes every queued job (the streams drain, their completions run),
 * stops the completion thread, closes the device. Accepts NULL. */
void oi__xfer_destroy(oi_xfer *x);

/* ---- jobs ---- */

enum {
  OI_XFER_JOB_TICKET = 1u << 0, /* the job completes a ticket (oi__xfer_job_ticket) */
  /* H2D, with a ticket: queue arena by arena after the last oi__xfer_add,
   * each followed by a stream callback reporting the arena to the ticket
   * (oi_ticket_arena_wait / _poll, every backend) and, on a CUDA device, an
   * event the ticket exposes (oi_ticket_arena_event); a staged mode becomes
   * DMA. Ignored elsewhere. */
  OI_XFER_JOB_LAYERED = 1u << 1,
};

/* A job of at most `cap` pieces pairs in direction `dir`, with `user_bytes`
 * of space for its owner (oi__xfer_job_user), not zeroed: the owner writes
 * what it reads back (a load of 65,536 blocks would clear 1 MiB for
 * nothing). NULL when out of memory. */
oi_xfer_job *oi__xfer_job_new(oi_xfer *x, oi_copy_dir dir, size_t cap, uint32_t flags,
                              size_t user_bytes);
void *oi__xfer_job_user(oi_xfer_job *job);
/* The caller's reference to the job's ticket (NULL without
 * OI_XFER_JOB_TICKET): read it before submitting; valid to hand out once
 * oi__xfer_submit returned OI_OK. */
oi_ticket *oi__xfer_job_ticket(const oi_xfer_job *job);
void oi__xfer_job_on_done(oi_xfer_job *job, oi_xfer_notify_fn fn, void *ctx);
/* Frees a job that was never submitted and nothing was added to (its ticket
 * too). */
void oi__xfer_job_free(oi_xfer_job *job);
/* Restricts the job to arenas [first, first + count) of the layout (a
 * layerwise save); call before adding pieces. The host address of a block
 * is still its whole host block: each arena goes to its place in it. A
 * staged mode becomes DMA (staging moves whole host blocks). */
void oi__xfer_job_arenas(oi_xfer_job *job, uint32_t first, uint32_t count);
/* Makes the job's copies wait for an external event (a cudaEvent_t); call
 * before adding pieces. A failure fails the job at submit. */
void oi__xfer_job_wait_event(oi_xfer_job *job, void *event);
/* Adds block `id` of the layout <-> host address `host` to the job; a group
 * is queued whenever enough have gathered. After a failure to queue, pieces
 * are still recorded but not queued: the job fails at submit. */
void oi__xfer_add(oi_xfer_job *job, int64_t id, uint8_t *host);
/* oi__xfer_add of ids[i] <-> host[i] for i in [0, n), a group at a time. */
void oi__xfer_add_many(oi_xfer_job *job, const int64_t *ids, uint8_t *const *host, size_t n);
/* Queues what remains and the job's completion; a job with no pieces
 * completes now. On failure the queued copies are waited for, the job
 * completes with the error (done runs; on_done does not), its ticket is
 * dropped, and the error is returned as "<what>: <message>". The job
 * belongs to the pipeline either way. */
oi_status oi__xfer_submit(oi_xfer_job *job, const char *what);

/* ---- layerwise saves under a codec ---- */

/* A host block of the pipeline's own (pinned, the layout's block bytes) that
 * gathers the arenas of a block saved layer by layer until its last arena
 * landed: the host address of that block in jobs of some arenas. NULL when
 * the pipeline has no codec or its block_bounce_bytes are all taken (the
 * caller drops that block's save: never waits). Thread-safe. */
uint8_t *oi__xfer_bounce(oi_xfer *x);
/* Gives a bounce back (no copy into it may still run). Accepts NULL. */
void oi__xfer_bounce_free(oi_xfer *x, uint8_t *bounce);
/* Encodes blocks src[0..n) (bounces whose every arena landed) into the
 * frame slots slots[0..n), zeroing each slot past its frame, on the calling
 * thread and the codec stage's workers (one encode of the pipeline at a
 * time). bad[i] = 1 for a block that was not encoded (its slot holds
 * nothing to keep), 0 for the others (every entry is written). @return how many were not; when any,
 * oi_last_error() says why the first was not. */
size_t oi__xfer_encode(oi_xfer *x, uint8_t *const *src, uint8_t *const *slots, size_t n,
                       uint8_t *bad);

#endif
