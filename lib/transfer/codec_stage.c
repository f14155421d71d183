/* The copy pipeline's codec stage (codec_stage.h). */
#include "transfer/codec_stage.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

enum { TASK_ENCODE = 1, TASK_DECODE = 2 };

/* One step's blocks: taken one at a time by whoever runs it. */
typedef struct codec_task {
  int kind;
  uint8_t *const *src; /* encode: the blocks */
  uint8_t *const *slots;
  uint8_t *bad; /* encode: the marks */
  size_t n;
  atomic_size_t next, nbad;
  pthread_mutex_t lock; /* failed, msg */
  bool failed;          /* a block failed: msg has the first reason */
  char msg[256];
} codec_task;

struct oi_codec_stage {
  oi_dev *dev;
  int codec;
  bool planes; /* lossless: the planes code (oi_codec_stage_config.planes) */
  oi_codec_shape shape;
  uint64_t bb, fb; /* block bytes, frame slot bytes */
  const uint32_t *log_id;
  oi_pinned bounce[2];
  uint8_t **bounce_at[2];
  pthread_mutex_t qlock[2];
  /* Per thread (0: the step's own), where a frame is made when a slot is
   * smaller than the codec's largest frame (lossless); NULL otherwise.
   * Only encodes use them, and one encode runs at a time (enc_lock: the
   * save stream's steps and the layerwise saves' encodes, which run on the
   * thread that ends a block): a decode's step thread never touches
   * scratch[0]. */
  size_t scratch_bytes;
  uint8_t *scratch[1 + OI_CODEC_MAX_WORKERS];
  pthread_mutex_t enc_lock;

  /* Per-block bounces (layerwise saves): chunks of pinned memory made as
   * blocks are taken, at most blk_max blocks in all; given back blocks form
   * a list through their first bytes. */
  pthread_mutex_t blk_lock;
  uint64_t blk_max, blk_made, blk_per_chunk;
  oi_pinned *chunks;
  size_t nchunks, chunks_cap;
  uint8_t *blk_free;

  /* The workers take one task at a time (run_lock; a step that finds it
   * taken, the other direction's, runs its blocks alone rather than wait). */
  pthread_mutex_t run_lock;
  pthread_mutex_t lock; /* task, gen, active, stop */
  pthread_cond_t cv, done_cv;
  pthread_t th[OI_CODEC_MAX_WORKERS];
  unsigned started;
  bool stop;
  uint64_t gen; /* bumped for each task */
  codec_task *task;
  unsigned active; /* workers still on the task */
};

static uint32_t log_id(const oi_codec_stage *s) { return s->log_id ? *s->log_id : 0; }

/* ---- one block -------------------------------------------------------------------- */

/* Keeps the first failure's reason (this thread's oi_last_error()). */
static void note_failure(codec_task *t) {
  pthread_mutex_lock(&t->lock);
  if (!t->failed) {
    t->failed = true;
    snprintf(t->msg, sizeof t->msg, "%s", oi_last_error());
  }
  pthread_mutex_unlock(&t->lock);
}

static void encode_one(oi_codec_stage *s, codec_task *t, unsigned w, size_t i) {
  uint8_t *slot = t->slots[i], *to = s->scratch[w] ? s->scratch[w] : slot;
  size_t cap = s->scratch[w] ? s->scratch_bytes : s->fb, out = 0;
  oi_status st = s->planes ? oi__codec_encode_planes(&s->shape, t->src[i], s->bb, to, cap, &out)
                           : oi__codec_encode(s->codec, &s->shape, t->src[i], s->bb, to, cap, &out);
  /* a planes frame past the slot: rANS codes some blocks shorter (every
   * decoder reads both) */
  if (s->planes && st == OI_OK && out > s->fb)
    st = oi__codec_encode(s->codec, &s->shape, t->src[i], s->bb, to, cap, &out);
  if (st == OI_OK && out > s->fb)
    st = oi__fail(OI_ERR_INVALID_ARGUMENT, "a frame of %zu bytes for a %llu-byte slot", out,
                  (unsigned long long)s->fb);
  if (st != OI_OK) {
    t->bad[i] = 1;
    atomic_fetch_add_explicit(&t->nbad, 1, memory_order_relaxed);
    OI_LOG_I(OI_LOG_DEBUG, "engine", log_id(s), "a block not encoded (%s): %s",
             oi__codec_name(s->codec), oi_last_error());
    note_failure(t);
    return;
  }
  if (to != slot) memcpy(slot, to, out);
  memset(slot + out, 0, s->fb - out); /* no byte of an earlier block stays behind a frame */
}

static void decode_one(oi_codec_stage *s, codec_task *t, size_t i) {
  const uint8_t *slot = t->slots[i];
  uint8_t *dst = s->bounce_at[OI_COPY_H2D][i];
  size_t out = 0;
  oi_status st = OI_OK;
  if (slot[5] != (uint8_t)s->codec)
    st = oi__fail(OI_ERR_PROTOCOL, "a frame of codec %u in a namespace of codec %s", slot[5],
                  oi__codec_name(s->codec));
  if (st == OI_OK) st = oi__codec_decode(slot, s->fb, dst, s->bb, &out);
  if (st == OI_OK && out != s->bb)
    st = oi__fail(OI_ERR_PROTOCOL, "a frame of %zu bytes for blocks of %llu", out,
                  (unsigned long long)s->bb);
  if (st == OI_OK) return;
  memset(dst, 0, s->bb); /* no other block's bytes go out in its place */
  note_failure(t);
}

/* Takes blocks of task t until none is left. */
static void drain(oi_codec_stage *s, codec_task *t, unsigned w) {
  for (;;) {
    size_t i = atomic_fetch_add_explicit(&t->next, 1, memory_order_relaxed);
    if (i >= t->n) return;
    if (t->kind == TASK_ENCODE)
      encode_one(s, t, w, i);
    else
      decode_one(s, t, i);
  }
}

/* ---- the workers ------------------------------------------------------------------ */

typedef struct worker_arg {
  oi_codec_stage *s;
  unsigned w;
} worker_arg;

static void *worker_main(void *arg) {
  worker_arg wa = *(worker_arg *)arg;
  oi__free(arg);
  oi_codec_stage *s = wa.s;
  uint64_t seen = 0;
  pthread_mutex_lock(&s->lock);
  for (;;) {
    while (!s->stop && s->gen == seen)
      pthread_cond_wait(&s->cv, &s->lock);
    if (s->stop) break;
    seen = s->gen;
    codec_task *t = s->task;
    pthread_mutex_unlock(&s->lock);
    drain(s, t, wa.w);
    pthread_mutex_lock(&s->lock);
    if (--s->active == 0) pthread_cond_signal(&s->done_cv);
  }
  pthread_mutex_unlock(&s->lock);
  return NULL;
}

/* Runs task t: on the workers and this thread when they are free, on this
 * thread alone otherwise. */
static void run(oi_codec_stage *s, codec_task *t) {
  pthread_mutex_init(&t->lock, NULL);
  atomic_init(&t->next, 0);
  atomic_init(&t->nbad, 0);
  t->failed = false;
  if (s->started && t->n > 1 && pthread_mutex_trylock(&s->run_lock) == 0) {
    pthread_mutex_lock(&s->lock);
    s->task = t;
    s->active = s->started;
    s->gen++;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->lock);
    drain(s, t, 0);
    pthread_mutex_lock(&s->lock);
    while (s->active)
      pthread_cond_wait(&s->done_cv, &s->lock);
    s->task = NULL;
    pthread_mutex_unlock(&s->lock);
    pthread_mutex_unlock(&s->run_lock);
  } else {
    drain(s, t, 0);
  }
  pthread_mutex_destroy(&t->lock);
}

size_t oi__codec_stage_encode_from(oi_codec_stage *s, uint8_t *const *src, uint8_t *const *slots,
                                   size_t n, uint8_t *bad) {
  codec_task t = {.kind = TASK_ENCODE, .src = src, .slots = slots, .bad = bad, .n = n};
  pthread_mutex_lock(&s->enc_lock);
  run(s, &t);
  pthread_mutex_unlock(&s->enc_lock);
  size_t nbad = atomic_load(&t.nbad);
  if (nbad) oi__fail(OI_ERR_INVALID_ARGUMENT, "%s", t.msg); /* on this thread: the first reason */
  return nbad;
}

size_t oi__codec_stage_encode(oi_codec_stage *s, uint8_t *const *slots, size_t n, uint8_t *bad) {
  return oi__codec_stage_encode_from(s, s->bounce_at[OI_COPY_D2H], slots, n, bad);
}

/* ---- per-block bounces ------------------------------------------------------------ */

uint8_t *oi__codec_stage_block_take(oi_codec_stage *s) {
  uint8_t *b = NULL;
  pthread_mutex_lock(&s->blk_lock);
  if (!s->blk_free && s->blk_made < s->blk_max) { /* a chunk more, within the bound */
    uint64_t k = OI_MIN(s->blk_per_chunk, s->blk_max - s->blk_made);
    oi_pinned p = {0};
    if (s->nchunks == s->chunks_cap) {
      size_t cap = s->chunks_cap ? 2 * s->chunks_cap : 8;
      oi_pinned *c = oi__realloc(s->chunks, cap * sizeof *c);
      if (c) {
        s->chunks = c;
        s->chunks_cap = cap;
      }
    }
    if (s->nchunks < s->chunks_cap &&
        s->dev->ops->pinned_alloc(s->dev, k * s->bb, 0, -1, &p) == OI_OK) {
      s->chunks[s->nchunks++] = p;
      s->blk_made += k;
      for (uint64_t i = 0; i < k; i++) { /* onto the free list */
        uint8_t *blk = (uint8_t *)p.host + i * s->bb;
        memcpy(blk, &s->blk_free, sizeof(uint8_t *)); /* the free list's link, in the block */
        s->blk_free = blk;
      }
    }
  }
  if (s->blk_free) {
    b = s->blk_free;
    memcpy(&s->blk_free, b, sizeof(uint8_t *));
  }
  pthread_mutex_unlock(&s->blk_lock);
  return b;
}

void oi__codec_stage_block_put(oi_codec_stage *s, uint8_t *block) {
  if (!block) return;
  pthread_mutex_lock(&s->blk_lock);
  memcpy(block, &s->blk_free, sizeof(uint8_t *));
  s->blk_free = block;
  pthread_mutex_unlock(&s->blk_lock);
}

oi_status oi__codec_stage_decode(oi_codec_stage *s, uint8_t *const *slots, size_t n) {
  codec_task t = {.kind = TASK_DECODE, .slots = slots, .n = n};
  run(s, &t);
  if (!t.failed) return OI_OK;
  OI_LOG_I(OI_LOG_WARN, "engine", log_id(s), "load: a frame did not decode: %s", t.msg);
  return oi__fail(OI_ERR_PROTOCOL, "load: a frame did not decode: %s", t.msg);
}

/* ---- set-up ------------------------------------------------------------------------ */

uint8_t *const *oi__codec_stage_bounce(const oi_codec_stage *s, int d) { return s->bounce_at[d]; }
void oi__codec_stage_lock(oi_codec_stage *s, int d) { pthread_mutex_lock(&s->qlock[d]); }
void oi__codec_stage_unlock(oi_codec_stage *s, int d) { pthread_mutex_unlock(&s->qlock[d]); }

oi_status oi__codec_stage_create(oi_dev *dev, const oi_codec_stage_config *c,
                                 uint64_t group_blocks[2], oi_codec_stage **out) {
  *out = NULL;
  const uint64_t block_bytes = c->block_bytes, frame_bytes = c->frame_bytes;
  if (frame_bytes < OI_CODEC_HEADER_BYTES)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "register: frame slots of %llu bytes",
                    (unsigned long long)frame_bytes);
  oi_codec_stage *s = oi__calloc(1, sizeof *s);
  if (!s) return oi__fail(OI_ERR_OUT_OF_MEMORY, "register: out of memory for the codec stage");
  *s = (oi_codec_stage){.dev = dev,
                        .codec = c->codec,
                        .shape = c->shape,
                        .bb = block_bytes,
                        .fb = frame_bytes,
                        .planes = c->planes && c->codec == OI_CODEC_LOSSLESS,
                        .log_id = c->log_id,
                        .blk_max = block_bytes < sizeof(uint8_t *) /* the free list's links */
                                       ? 0
                                       : OI_MAX(c->block_bounce_bytes / block_bytes, 1),
                        .blk_per_chunk = OI_MAX(OI_CODEC_BLOCK_CHUNK_BYTES / block_bytes, 1)};
  for (int d = 0; d < 2; d++)
    pthread_mutex_init(&s->qlock[d], NULL);
  pthread_mutex_init(&s->enc_lock, NULL);
  pthread_mutex_init(&s->blk_lock, NULL);
  pthread_mutex_init(&s->run_lock, NULL);
  pthread_mutex_init(&s->lock, NULL);
  pthread_cond_init(&s->cv, NULL);
  pthread_cond_init(&s->done_cv, NULL);
  oi_status st = OI_OK;
  for (int d = 0; d < 2 && st == OI_OK; d++) {
    uint64_t g = group_blocks[d];
    if (g > OI_CODEC_BOUNCE_BYTES / block_bytes) g = OI_CODEC_BOUNCE_BYTES / block_bytes;
    if (g == 0) g = 1;
    group_blocks[d] = g;
    st = dev->ops->pinned_alloc(dev, g * block_bytes, 0, -1, &s->bounce[d]);
    if (st == OI_OK && !(s->bounce_at[d] = oi__malloc(g * sizeof *s->bounce_at[d])))
      st = oi__fail(OI_ERR_OUT_OF_MEMORY, "register: out of memory for the codec's buffers");
    for (uint64_t i = 0; st == OI_OK && i < g; i++)
      s->bounce_at[d][i] = (uint8_t *)s->bounce[d].host + i * block_bytes;
  }
  /* Workers: half the cpus (the other half are the engine's), 1 at least. */
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  unsigned want = cpus > 2 ? (unsigned)(cpus / 2) : 1;
  if (want > OI_CODEC_MAX_WORKERS) want = OI_CODEC_MAX_WORKERS;
  size_t bound = oi__codec_bound(c->codec, &c->shape, block_bytes);
  if (st == OI_OK && bound > frame_bytes) { /* frames are made aside, then copied if they fit */
    s->scratch_bytes = bound;
    for (unsigned w = 0; w <= want && st == OI_OK; w++)
      if (!(s->scratch[w] = oi__malloc(bound)))
        st = oi__fail(OI_ERR_OUT_OF_MEMORY, "register: out of memory for the codec's buffers");
  }
  for (unsigned w = 1; w <= want && st == OI_OK; w++) { /* worker ids 1..: 0 is the step's */
    worker_arg *wa = oi__malloc(sizeof *wa);
    if (!wa) break; /* fewer workers: slower, not wrong */
    *wa = (worker_arg){.s = s, .w = w};
    if (pthread_create(&s->th[s->started], NULL, worker_main, wa) != 0) {
      oi__free(wa);
      break;
    }
    pthread_setname_np(s->th[s->started], "oi-codec");
    s->started++;
  }
  if (st != OI_OK) {
    oi__codec_stage_destroy(s);
    return st;
  }
  *out = s;
  return OI_OK;
}

void oi__codec_stage_destroy(oi_codec_stage *s) {
  if (!s) return;
  pthread_mutex_lock(&s->lock);
  s->stop = true;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->lock);
  for (unsigned i = 0; i < s->started; i++)
    pthread_join(s->th[i], NULL);
  for (int d = 0; d < 2; d++) {
    if (s->bounce[d].host) s->dev->ops->pinned_free(s->dev, &s->bounce[d]);
    oi__free(s->bounce_at[d]);
    pthread_mutex_destroy(&s->qlock[d]);
  }
  for (unsigned w = 0; w <= OI_CODEC_MAX_WORKERS; w++)
    oi__free(s->scratch[w]);
  for (size_t i = 0; i < s->nchunks; i++)
    s->dev->ops->pinned_free(s->dev, &s->chunks[i]);
  oi__free(s->chunks);
  pthread_mutex_destroy(&s->enc_lock);
  pthread_mutex_destroy(&s->blk_lock);
  pthread_cond_destroy(&s->cv);
  pthread_cond_destroy(&s->done_cv);
  pthread_mutex_destroy(&s->lock);
  pthread_mutex_destroy(&s->run_lock);
  oi__free(s);
}
