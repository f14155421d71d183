/* The executor object: construction (arenas, model binding, offload engines,
 * workers), the public entry points, and teardown in the documented order:
 * workers -> drain in-flight loads -> close the arena mapping -> flush saves
 * -> unregister (engine destroy) -> free the arenas. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "executor/executor_internal.h"

#define DEFAULT_HOST_POOL_BYTES (64ull << 20)

/* ---- the worker ------------------------------------------------------------------ */

static void *worker_main(void *arg) {
  exec_rank *r = arg;
  oi_executor *x = r->x;
  pthread_mutex_lock(&r->work_lock);
  for (;;) {
    while (r->work == 0)
      pthread_cond_wait(&r->work_cv, &r->work_lock);
    if (r->work == 2) break;
    pthread_mutex_unlock(&r->work_lock);
    oi_clear_error();
    /* Host-mode overlapped restores: the forward reads their KV. A load that
     * fails or times out here is settled by the scheduler afterwards (that
     * sequence's results are discarded). */
    for (uint32_t i = 0; i < r->n_host_waits; i++)
      oi_ticket_wait(r->host_waits[i], x->o.restore_timeout_ms);
    uint64_t t0 = oi__now_ns();
    oi_status st = x->model.forward(x->model_ctx_for_worker, &r->batch);
    r->forward_ns = oi__now_ns() - t0;
    pthread_mutex_lock(&r->work_lock);
    r->work_status = st;
    if (st != OI_OK) snprintf(r->work_error, sizeof r->work_error, "%s", oi_last_error());
    r->work = 0;
    r->work_done = true;
    pthread_cond_broadcast(&r->work_cv);
  }
  pthread_mutex_unlock(&r->work_lock);
  return NULL;
}

static void stop_worker(exec_rank *r) {
  if (!r->thread_started) return;
  pthread_mutex_lock(&r->work_lock);
  r->work = 2;
  pthread_cond_broadcast(&r->work_cv);
  pthread_mutex_unlock(&r->work_lock);
  pthread_join(r->thread, NULL);
  r->thread_started = false;
}

/* ---- options ---------------------------------------------------------------------- */

OI_API oi_status oi_executor_options_init(oi_executor_options *o) {
  if (!o) return oi__fail(OI_ERR_INVALID_ARGUMENT, "executor_options_init: options is NULL");
  memset(o, 0, sizeof *o);
  o->struct_size = sizeof *o;
  o->ranks = 1;
  o->page_size = 16;
  o->gpu_blocks = 256;
  o->offload = OI_OFFLOAD_NONE;
  o->max_batch_tokens = 256;
  o->max_batch_seqs = 32;
  o->prefix_cache = 1;
  o->restore_timeout_ms = 30000;
  o->flush_timeout_ms = 30000;
  return OI_OK;
}

OI_API oi_status oi_request_init(oi_request *r) {
  if (!r) return oi__fail(OI_ERR_INVALID_ARGUMENT, "request_init: request is NULL");
  memset(r, 0, sizeof *r);
  r->struct_size = sizeof *r;
  r->max_new_tokens = 16;
  r->rank = -1;
  return OI_OK;
}

/* ---- teardown ----------------------------------------------------------------------- */

static void request_free(request *q) {
  if (!q) return;
  oi_ticket_release(q->load_ticket);
  oi__free(q->tokens);
  oi__free(q->salt);
  oi__free(q->hashes);
  oi__free(q->blocks);
  oi__free(q);
}

/* Waits for rank r's in-flight loads (restores and orphans). A load that does
 * not end by the deadline leaves its arena leaked. */
static void drain_loads(exec_rank *r, uint64_t deadline_ns) {
  for (request *q = r->running_head; q; q = q->next)
    if (q->load_ticket) {
      if (oi_ticket_wait(q->load_ticket, oi__ms_until(deadline_ns)) == OI_ERR_TIMEOUT)
        r->leak_arena = true;
      oi_ticket_release(q->load_ticket);
      q->load_ticket = NULL;
    }
  while (r->orphans) {
    orphan_load *o = r->orphans;
    r->orphans = o->next;
    if (oi_ticket_wait(o->ticket, oi__ms_until(deadline_ns)) == OI_ERR_TIMEOUT)
      r->leak_arena = true;
    oi_ticket_release(o->ticket);
    oi__free(o);
  }
}

/* Waits until every save of rank r reported (its on_done ran). */
static bool wait_saves(exec_rank *r, uint64_t deadline_ns) {
  struct timespec ts = {.tv_sec = (time_t)(deadline_ns / 1000000000ull),
                        .tv_nsec = (long)(deadline_ns % 1000000000ull)};
  pthread_mutex_lock(&r->save_lock);
  while (r->saves_outstanding > 0) {
    if (deadline_ns == UINT64_MAX)
      pthread_cond_wait(&r->save_cv, &r->save_lock);
    else if (pthread_cond_timedwait(&r->save_cv, &r->save_lock, &ts) != 0 &&
             oi__now_ns() >= deadline_ns)
      break;
  }
  bool drained = r->saves_outstanding == 0;
  pthread_mutex_unlock(&r->save_lock);
  return drained;
}

static void close_mapping(oi_executor *x, exec_rank *r) {
  if (r->model_bound) {
    if (x->model.unbind) x->model.unbind(x->model_ctx_for_worker, r->index);
    r->model_bound = false;
  }
  if (r->import) {
    oi_imported_arena_close(r->import);
    r->import = NULL;
    r->arena = NULL;
  }
}

OI_API void oi_executor_destroy(oi_executor *x) {
  if (!x) return;
  /* 1. workers */
  for (uint32_t i = 0; i < x->nranks; i++)
    stop_worker(&x->ranks[i]);
  /* 2. drain in-flight loads */
  uint64_t deadline = oi__deadline_ns(x->o.flush_timeout_ms);
  for (uint32_t i = 0; i < x->nranks; i++)
    drain_loads(&x->ranks[i], deadline);
  /* 3. close the arena mapping (the model stops using it first) */
  for (uint32_t i = 0; i < x->nranks; i++)
    close_mapping(x, &x->ranks[i]);
  /* 4. flush saves */
  for (uint32_t i = 0; i < x->nranks; i++) {
    exec_rank *r = &x->ranks[i];
    if (r->engine && !wait_saves(r, deadline)) {
      r->leak_arena = true;
      OI_LOG(OI_LOG_WARN, "executor",
             "rank %u: saves still in flight after %u ms at destroy: the arena (%llu bytes) is "
             "leaked rather than freed under a live copy",
             r->index, x->o.flush_timeout_ms, (unsigned long long)r->kv.bytes);
    }
  }
  /* 5. unregister */
  for (uint32_t i = 0; i < x->nranks; i++) {
    exec_rank *r = &x->ranks[i];
    oi_engine_destroy(r->engine);
    r->engine = NULL;
    oi__exec_collect_saves(r); /* records of saves that reported during the destroy */
  }
  /* 6. free what is ours */
  for (uint32_t i = 0; i < x->nranks; i++) {
    exec_rank *r = &x->ranks[i];
    if (r->arena && r->dev) {
      if (r->leak_arena)
        OI_LOG(OI_LOG_WARN, "executor", "rank %u: arena of %llu bytes leaked (copy not drained)",
               r->index, (unsigned long long)r->kv.bytes);
      else
        r->dev->ops->mem_free(r->dev, r->arena);
    }
    r->arena = NULL;
    oi__dev_close(r->dev);
    oi__block_pool_destroy(&r->pool);
    if (r->save_lock_init) {
      pthread_mutex_destroy(&r->save_lock);
      pthread_cond_destroy(&r->save_cv);
      pthread_mutex_destroy(&r->work_lock);
      pthread_cond_destroy(&r->work_cv);
    }
    oi__free(r->seqs);
    oi__free(r->seq_req);
    oi__free(r->kv_events);
    oi__free(r->host_waits);
  }
  if (x->owns_host) oi_host_destroy(x->host);
  if (x->by_id) {
    for (uint32_t b = 0; b <= x->by_id_mask; b++)
      for (request *q = x->by_id[b]; q;) {
        request *next = q->hnext;
        request_free(q);
        q = next;
      }
  }
  oi__free(x->by_id);
  oi__free(x->ranks);
  oi__free(x->namespace_id);
  oi__free(x->codec);
  oi__free(x);
}

/* ---- construction -------------------------------------------------------------------- */

static oi_status check_options(const oi_executor_options *o) {
  if (!o->model || !o->model->describe || !o->model->bind || !o->model->forward)
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "executor_create: model ops (describe, bind, forward) are required");
  if (o->ranks == 0 || o->ranks > 1024)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "executor_create: ranks %u (1..1024)", o->ranks);
  if (o->page_size == 0 || o->page_size > 65536)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "executor_create: page_size %u (1..65536)",
                    o->page_size);
  if (o->gpu_blocks < 2 || o->gpu_blocks > (1u << 30))
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "executor_create: gpu_blocks %u (at least 2)",
                    o->gpu_blocks);
  if (o->offload > OI_OFFLOAD_SIDECAR)
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "executor_create: offload %u is not an oi_offload_mode", o->offload);
  if (o->offload != OI_OFFLOAD_NONE && !o->prefix_cache)
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "executor_create: offload extends the prefix cache; it needs prefix_cache = 1");
  if (o->max_batch_tokens == 0 || o->max_batch_seqs == 0)
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "executor_create: max_batch_tokens and max_batch_seqs must be > 0");
  if (o->offload == OI_OFFLOAD_SIDECAR && o->host)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "executor_create: a host is for EMBEDDED offload");
  if (o->restore_overlap > OI_RESTORE_OVERLAP_HOST)
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "executor_create: restore_overlap %u is not an oi_restore_overlap",
                    o->restore_overlap);
  if (o->codec && o->codec[0] && strcmp(o->codec, "none") && o->offload == OI_OFFLOAD_NONE)
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "executor_create: codec \"%.32s\" needs offload (EMBEDDED or SIDECAR)",
                    o->codec);
  if (o->restore_plan > OI_RESTORE_PLAN_OFF)
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "executor_create: restore_plan %u is not an oi_restore_plan_mode",
                    o->restore_plan);
  if (!(o->prefill_ns_per_token >= 0) || !(o->prefill_ns_per_token_ctx >= 0) ||
      isinf(o->prefill_ns_per_token) || isinf(o->prefill_ns_per_token_ctx))
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "executor_create: prefill_ns_per_token %g and prefill_ns_per_token_ctx %g "
                    "must be finite and >= 0",
                    o->prefill_ns_per_token, o->prefill_ns_per_token_ctx);
  for (uint32_t i = 0; o->devices && i < o->ranks; i++)
    if (o->devices[i] < -1)
      return oi__fail(OI_ERR_INVALID_ARGUMENT, "executor_create: devices[%u] = %d", i,
                      o->devices[i]);
  return OI_OK;
}

/* Describes rank r's region: one arena per layer, each block a K page then a
 * V page. */
static void plan_layout(oi_executor *x, exec_rank *r) {
  const oi_model_desc *d = &x->desc;
  oi_kv_layout *kv = &r->kv;
  memset(kv, 0, sizeof *kv);
  kv->struct_size = sizeof *kv;
  kv->device = r->device;
  kv->num_layers = d->num_layers;
  kv->page_size = x->o.page_size;
  kv->num_blocks = x->o.gpu_blocks;
  kv->token_stride = (uint64_t)d->num_kv_heads * d->head_dim * d->dtype_bytes;
  kv->segment_stride = kv->token_stride * kv->page_size;
  kv->block_stride = 2 * kv->segment_stride;
  kv->layer_stride = kv->block_stride * kv->num_blocks;
  kv->bytes = kv->layer_stride * kv->num_layers;
}

/* The codecs that quantize bf16 elements and take the model's shape. */
static bool lossy_codec(const char *codec) {
  return codec &&
         (!strcmp(codec, "int8") || !strcmp(codec, "int8-hadamard") || !strcmp(codec, "fp8"));
}

static oi_status engine_options_for(oi_executor *x, exec_rank *r, oi_engine_options *eo,
                                    oi_arena_desc *arenas, char (*names)[16], char *instance) {
  oi_engine_options_init(eo);
  eo->device = r->device;
  eo->namespace_id = x->namespace_id;
  snprintf(instance, 32, "executor-rank%u", r->index);
  eo->instance_name = instance;
  eo->world_size = 1;
  eo->num_arenas = r->kv.num_layers;
  eo->arenas = arenas;
  eo->arena_size = r->kv.bytes;
  eo->codec = x->codec;
  eo->codec_slot_bytes = x->o.codec_slot_bytes;
  if (lossy_codec(x->codec)) {
    /* the lossy codecs' groups: a block is [layer][K, V][token][head][dim] */
    eo->codec_tokens = x->o.page_size;
    eo->codec_heads = x->desc.num_kv_heads;
    eo->codec_head_dim = x->desc.head_dim;
  }
  for (uint32_t l = 0; l < r->kv.num_layers; l++) {
    snprintf(names[l], 16, "L%u", l);
    memset(&arenas[l], 0, sizeof arenas[l]);
    arenas[l].name = names[l];
    arenas[l].offset = l * r->kv.layer_stride;
    arenas[l].num_blocks = r->kv.num_blocks;
    arenas[l].bytes_per_block = r->kv.segment_stride;
    arenas[l].block_stride = r->kv.block_stride;
    arenas[l].segments = 2;
    arenas[l].segment_stride = r->kv.segment_stride;
  }
  return OI_OK;
}

/* Arena (allocated or imported), engine, model binding, worker of rank r. */
static oi_status rank_init(oi_executor *x, exec_rank *r) {
  oi_status st;
  plan_layout(x, r);
  if ((st = oi__block_pool_create(&r->pool, x->o.gpu_blocks)) != OI_OK) return st;
  r->seqs = oi__calloc(x->o.max_batch_seqs, sizeof *r->seqs);
  r->seq_req = oi__calloc(x->o.max_batch_seqs, sizeof *r->seq_req);
  r->kv_events = oi__calloc((size_t)x->o.max_batch_seqs * x->desc.num_layers, sizeof *r->kv_events);
  r->host_waits = oi__calloc(x->o.max_batch_seqs, sizeof *r->host_waits);
  if (!r->seqs || !r->seq_req || !r->kv_events || !r->host_waits)
    return oi__fail(OI_ERR_OUT_OF_MEMORY, "executor_create: out of memory");
  if ((st = oi__dev_open(r->device, &r->dev)) != OI_OK) return st;

  uint32_t L = r->kv.num_layers;
  oi_arena_desc *arenas = oi__calloc(L, sizeof *arenas);
  char(*names)[16] = oi__calloc(L, sizeof *names);
  char instance[32];
  if (!arenas || !names) {
    oi__free(arenas);
    oi__free(names);
    return oi__fail(OI_ERR_OUT_OF_MEMORY, "executor_create: out of memory");
  }
  oi_engine_options eo;
  engine_options_for(x, r, &eo, arenas, names, instance);
  if (x->o.offload == OI_OFFLOAD_SIDECAR) {
    /* The server allocates the arena: register before any KV exists. */
    st = oi_engine_connect(x->o.socket_path, &eo, &r->engine, &r->import);
    if (st == OI_OK) r->arena = oi_imported_arena_ptr(r->import);
  } else {
    st = r->dev->ops->mem_alloc(r->dev, r->kv.bytes, 0, &r->arena);
    if (st == OI_OK && x->o.offload == OI_OFFLOAD_EMBEDDED) {
      eo.arena_base = r->arena;
      st = oi_engine_create(x->host, &eo, &r->engine);
    }
  }
  oi__free(arenas);
  oi__free(names);
  if (st != OI_OK) return st;
  r->kv.base = r->arena;

  if ((st = x->model.bind(x->model_ctx_for_worker, r->index, &r->kv)) != OI_OK) return st;
  r->model_bound = true;
  int rc = pthread_create(&r->thread, NULL, worker_main, r);
  if (rc != 0)
    return oi__fail(OI_ERR_INTERNAL, "executor_create: cannot start rank %u's worker: %s", r->index,
                    strerror(rc));
  char name[16];
  snprintf(name, sizeof name, "oi-rank%u", r->index);
  pthread_setname_np(r->thread, name);
  r->thread_started = true;
  return OI_OK;
}

OI_API oi_status oi_executor_create(const oi_executor_options *opts, oi_executor **out) {
  if (!out) return oi__fail(OI_ERR_INVALID_ARGUMENT, "executor_create: out is NULL");
  *out = NULL;
  if (!opts) return oi__fail(OI_ERR_INVALID_ARGUMENT, "executor_create: options is NULL");
  oi_executor_options o;
  oi_executor_options_init(&o);
  oi_status st =
      oi__struct_in_min(&o, sizeof o, opts, OI_FLOOR_EXECUTOR_OPTIONS, "executor_create");
  if (st != OI_OK) return st;
  if ((st = check_options(&o)) != OI_OK) return st;

  oi_executor *x = oi__calloc(1, sizeof *x);
  if (!x) return oi__fail(OI_ERR_OUT_OF_MEMORY, "executor_create: out of memory");
  x->o = o;
  x->o.devices = NULL; /* copied into the ranks */
  memset(&x->model, 0, sizeof x->model);
  x->model.struct_size = sizeof x->model;
  if ((st = oi__struct_in(&x->model, sizeof x->model, o.model, "executor_create model")) != OI_OK)
    goto fail_early;
  x->model_ctx_for_worker = o.model_ctx;
  x->o.model = &x->model;

  memset(&x->desc, 0, sizeof x->desc);
  x->desc.struct_size = sizeof x->desc;
  if ((st = x->model.describe(o.model_ctx, &x->desc)) != OI_OK) goto fail_early;
  const oi_model_desc *d = &x->desc;
  if (!d->num_layers || !d->num_kv_heads || !d->head_dim || !d->dtype_bytes || !d->vocab_size ||
      d->num_layers > 4096) {
    st = oi__fail(OI_ERR_INVALID_ARGUMENT,
                  "executor_create: the model describes an empty KV layout");
    goto fail_early;
  }
  oi__exec_prefill_init(x);
  if (o.restore_overlap == OI_RESTORE_OVERLAP_OFF)
    x->overlap_mode = OVERLAP_OFF;
  else if (o.restore_overlap == OI_RESTORE_OVERLAP_HOST)
    x->overlap_mode = OVERLAP_HOST;
  else
    x->overlap_mode = d->flags & OI_MODEL_KV_EVENTS ? OVERLAP_DEVICE : OVERLAP_OFF;
  {
    uint64_t token_bytes = (uint64_t)d->num_kv_heads * d->head_dim * d->dtype_bytes;
    uint64_t total = token_bytes * o.page_size * 2 * o.gpu_blocks * d->num_layers;
    x->block_bytes = token_bytes * o.page_size * 2 * d->num_layers;
    if (token_bytes > (1ull << 24) ||
        total / o.gpu_blocks / d->num_layers != token_bytes * o.page_size * 2) {
      st = oi__fail(OI_ERR_INVALID_ARGUMENT, "executor_create: the KV arena size overflows");
      goto fail_early;
    }
  }
  if (o.namespace_id && o.namespace_id[0]) {
    x->namespace_id = oi__strdup(o.namespace_id);
  } else {
    char ns[256];
    snprintf(ns, sizeof ns, "oi-executor/%s", d->model_id ? d->model_id : "unnamed-model");
    x->namespace_id = oi__strdup(ns);
  }
  x->by_id_mask = 1023;
  x->by_id = oi__calloc(x->by_id_mask + 1, sizeof *x->by_id);
  x->ranks = oi__calloc(o.ranks, sizeof *x->ranks);
  if (!x->namespace_id || !x->by_id || !x->ranks) {
    st = oi__fail(OI_ERR_OUT_OF_MEMORY, "executor_create: out of memory");
    goto fail_early;
  }
  x->o.namespace_id = x->namespace_id;
  if (o.codec && o.codec[0] && strcmp(o.codec, "none")) {
    if (lossy_codec(o.codec) && d->dtype_bytes != 2) {
      st = oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "executor_create: codec \"%s\" quantizes bf16 KV; the model's KV elements "
                    "are %u bytes",
                    o.codec, d->dtype_bytes);
      goto fail_early;
    }
    if (!(x->codec = oi__strdup(o.codec))) {
      st = oi__fail(OI_ERR_OUT_OF_MEMORY, "executor_create: out of memory");
      goto fail_early;
    }
  }
  x->o.codec = x->codec;
  x->o.host_options = NULL; /* used only during create */

  if (o.offload == OI_OFFLOAD_EMBEDDED) {
    if (o.host) {
      x->host = o.host;
    } else {
      oi_host_options ho;
      oi_host_options_init(&ho);
      ho.pool_bytes = DEFAULT_HOST_POOL_BYTES;
      ho.flags = OI_HOST_NO_PIN;
      if (o.host_options &&
          (st = oi__struct_in(&ho, sizeof ho, o.host_options, "executor host")) != OI_OK)
        goto fail_early;
      if ((st = oi_host_create(&ho, &x->host)) != OI_OK) goto fail_early;
      x->owns_host = true;
    }
  }

  x->nranks = o.ranks;
  for (uint32_t i = 0; i < o.ranks; i++) {
    exec_rank *r = &x->ranks[i];
    r->x = x;
    r->index = i;
    r->device = o.devices ? o.devices[i] : OI_DEVICE_CPU;
    pthread_mutex_init(&r->save_lock, NULL);
    pthread_cond_init(&r->save_cv, NULL);
    pthread_mutex_init(&r->work_lock, NULL);
    pthread_cond_init(&r->work_cv, NULL);
    r->save_lock_init = true;
  }
  for (uint32_t i = 0; i < o.ranks; i++) {
    if ((st = rank_init(x, &x->ranks[i])) != OI_OK) {
      char msg[512];
      snprintf(msg, sizeof msg, "%s", oi_last_error());
      oi_executor_destroy(x);
      return oi__fail(st, "executor_create: rank %u: %s", i, msg);
    }
  }
  x->o.socket_path = NULL;
  OI_LOG(OI_LOG_INFO, "executor",
         "%u rank(s), %u blocks of %u tokens each (%llu bytes of KV per rank), offload %s, "
         "namespace '%s'",
         x->nranks, o.gpu_blocks, o.page_size, (unsigned long long)x->ranks[0].kv.bytes,
         o.offload == OI_OFFLOAD_NONE       ? "none"
         : o.offload == OI_OFFLOAD_EMBEDDED ? "embedded"
                                            : "sidecar",
         x->namespace_id);
  *out = x;
  return OI_OK;

fail_early : {
  char msg[512];
  snprintf(msg, sizeof msg, "%s", oi_last_error());
  oi_executor_destroy(x);
  return oi__fail(st, "%s", msg);
}
}

/* ---- requests ------------------------------------------------------------------------ */

OI_API oi_status oi_executor_submit(oi_executor *x, const oi_request *req, uint64_t *request_id) {
  if (request_id) *request_id = 0;
  if (!x || !req || !request_id)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "submit: %s is NULL",
                    !x     ? "executor"
                    : !req ? "request"
                           : "request_id");
  oi_request r;
  oi_request_init(&r);
  oi_status st = oi__struct_in(&r, sizeof r, req, "submit");
  if (st != OI_OK) return st;
  if (r.prompt_len == 0 || !r.prompt)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "submit: the prompt is empty");
  if (r.max_new_tokens == 0)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "submit: max_new_tokens is 0");
  if (r.salt_len && !r.salt) return oi__fail(OI_ERR_INVALID_ARGUMENT, "submit: salt is NULL");
  if (r.rank < -1 || (r.rank >= 0 && (uint32_t)r.rank >= x->nranks))
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "submit: rank %d (the executor has %u)", r.rank,
                    x->nranks);
  uint64_t total = (uint64_t)r.prompt_len + r.max_new_tokens;
  if (x->desc.max_positions && total - 1 > x->desc.max_positions)
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "submit: prompt (%u) + max_new_tokens (%u) exceeds the model's %u positions",
                    r.prompt_len, r.max_new_tokens, x->desc.max_positions);
  uint64_t need = (total - 1 + x->o.page_size - 1) / x->o.page_size;
  if (need > x->o.gpu_blocks)
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "submit: the request needs %llu KV blocks; a rank has %u",
                    (unsigned long long)need, x->o.gpu_blocks);
  for (uint32_t i = 0; i < r.prompt_len; i++)
    if (r.prompt[i] >= x->desc.vocab_size)
      return oi__fail(OI_ERR_INVALID_ARGUMENT,
                      "submit: prompt token %u at %u is not below vocab_size %u", r.prompt[i], i,
                      x->desc.vocab_size);

  request *q = oi__calloc(1, sizeof *q);
  if (!q) return oi__fail(OI_ERR_OUT_OF_MEMORY, "submit: out of memory");
  q->prompt_len = r.prompt_len;
  q->max_new = r.max_new_tokens;
  q->tokens = oi__malloc(total * sizeof *q->tokens);
  q->hash_cap = (uint32_t)(total / x->o.page_size + 1);
  q->hashes = oi__calloc(q->hash_cap, sizeof *q->hashes);
  q->blocks_cap = (uint32_t)need;
  q->blocks = oi__calloc(need, sizeof *q->blocks);
  q->salt_len = r.salt_len;
  q->salt = r.salt_len ? oi__malloc(r.salt_len) : NULL;
  if (!q->tokens || !q->hashes || !q->blocks || (r.salt_len && !q->salt)) {
    request_free(q);
    return oi__fail(OI_ERR_OUT_OF_MEMORY, "submit: out of memory");
  }
  memcpy(q->tokens, r.prompt, r.prompt_len * sizeof *q->tokens);
  if (r.salt_len) memcpy(q->salt, r.salt, r.salt_len);
  q->id = ++x->next_id;
  q->rank = r.rank >= 0 ? (uint32_t)r.rank : x->next_rank++ % x->nranks;
  q->state = OI_REQUEST_WAITING;
  q->submit_ns = oi__now_ns();
  q->hnext = x->by_id[q->id & x->by_id_mask];
  x->by_id[q->id & x->by_id_mask] = q;
  x->n_requests++;
  exec_rank *rk = &x->ranks[q->rank];
  if (rk->waiting_tail)
    rk->waiting_tail->next = q;
  else
    rk->waiting_head = q;
  rk->waiting_tail = q;
  x->c.submitted++;
  *request_id = q->id;
  return OI_OK;
}

OI_API oi_status oi_executor_step(oi_executor *x, uint32_t *finished) {
  if (finished) *finished = 0;
  if (!x) return oi__fail(OI_ERR_INVALID_ARGUMENT, "step: executor is NULL");
  return oi__exec_step(x, finished);
}

static bool busy(const oi_executor *x) {
  for (uint32_t i = 0; i < x->nranks; i++)
    if (x->ranks[i].waiting_head || x->ranks[i].running_head) return true;
  return false;
}

OI_API oi_status oi_executor_run_until_idle(oi_executor *x) {
  if (!x) return oi__fail(OI_ERR_INVALID_ARGUMENT, "run_until_idle: executor is NULL");
  while (busy(x)) {
    oi_status st = oi__exec_step(x, NULL);
    if (st != OI_OK) return st;
  }
  return OI_OK;
}

OI_API oi_status oi_executor_get_result(oi_executor *x, uint64_t request_id,
                                        oi_request_result *out) {
  if (!x || !out)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "result: %s is NULL", x ? "out" : "executor");
  request *q = oi__exec_find(x, request_id);
  if (!q)
    return oi__fail(OI_ERR_NOT_FOUND, "result: no request %llu", (unsigned long long)request_id);
  oi_request_result r;
  memset(&r, 0, sizeof r);
  r.struct_size = sizeof r;
  r.state = q->state;
  r.status = q->status;
  r.rank = q->rank;
  r.tokens = q->tokens + q->prompt_len;
  r.n_tokens = q->n_gen;
  r.prompt_len = q->prompt_len;
  r.cached_tokens = q->cached_tokens;
  r.restored_tokens = q->restored_tokens;
  r.computed_tokens = q->computed_tokens;
  r.ttft_ns = q->first_token_ns ? q->first_token_ns - q->submit_ns : 0;
  r.latency_ns = q->last_token_ns ? q->last_token_ns - q->submit_ns : 0;
  return oi__struct_out(out, &r, sizeof r, "result");
}

OI_API oi_status oi_executor_flush(oi_executor *x, uint32_t timeout_ms) {
  if (!x) return oi__fail(OI_ERR_INVALID_ARGUMENT, "flush: executor is NULL");
  uint64_t deadline = oi__deadline_ns(timeout_ms);
  oi_status st = OI_OK;
  for (uint32_t i = 0; i < x->nranks; i++) {
    exec_rank *r = &x->ranks[i];
    if (!wait_saves(r, deadline) && st == OI_OK)
      st = oi__fail(OI_ERR_TIMEOUT, "flush: rank %u still has saves in flight after %u ms", i,
                    timeout_ms);
    oi__exec_collect_saves(r);
  }
  return st;
}

OI_API oi_status oi_executor_evict_gpu_cache(oi_executor *x, uint64_t *evicted) {
  if (evicted) *evicted = 0;
  if (!x) return oi__fail(OI_ERR_INVALID_ARGUMENT, "evict_gpu_cache: executor is NULL");
  uint64_t n = 0;
  for (uint32_t i = 0; i < x->nranks; i++) {
    oi__exec_collect_saves(&x->ranks[i]);
    n += oi__block_pool_evict_inactive(&x->ranks[i].pool);
  }
  if (evicted) *evicted = n;
  return OI_OK;
}

OI_API oi_status oi_executor_get_stats(const oi_executor *x, oi_executor_stats *out) {
  if (!x || !out)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "executor_stats: %s is NULL", x ? "out" : "executor");
  oi_executor_stats s;
  memset(&s, 0, sizeof s);
  s.struct_size = sizeof s;
  s.ranks = x->nranks;
  s.steps = x->c.steps;
  s.requests_submitted = x->c.submitted;
  s.requests_finished = x->c.finished;
  s.requests_failed = x->c.failed;
  s.prefill_tokens = x->c.prefill_tokens;
  s.decode_tokens = x->c.decode_tokens;
  s.cached_tokens = x->c.cached_tokens;
  s.restored_tokens = x->c.restored_tokens;
  s.restores_started = x->c.restores_started;
  s.restores_completed = x->c.restores_completed;
  s.restores_failed = x->c.restores_failed;
  s.saves_submitted = x->c.saves_submitted;
  s.leases_held = x->c.leases_held;
  s.restores_overlapped = x->c.restores_overlapped;
  s.restores_waited = x->c.restores_waited;
  s.plans = x->c.plans;
  s.plans_compute = x->c.plans_compute;
  s.plans_split = x->c.plans_split;
  s.plans_partial = x->c.plans_partial;
  s.plan_ns = x->c.plan_ns;
  s.prefill_ns_per_token = x->fit.a;
  s.prefill_ns_per_token_ctx = x->fit.b;
  s.prefill_samples = x->fit.samples;
  for (uint32_t i = 0; i < x->nranks; i++) {
    const block_pool *p = &x->ranks[i].pool;
    s.blocks_total += p->n;
    s.blocks_free += p->free.count;
    s.blocks_cached += p->lru.count;
    s.save_blocks_pending += p->pinned;
    for (uint32_t b = 0; b < p->n; b++)
      s.blocks_active += p->blocks[b].refs > 0;
  }
  return oi__struct_out(out, &s, sizeof s, "executor_stats");
}

OI_API oi_status oi_executor_get_kv_layout(const oi_executor *x, uint32_t rank, oi_kv_layout *out) {
  if (!x || !out)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "kv_layout: %s is NULL", x ? "out" : "executor");
  if (rank >= x->nranks)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "kv_layout: rank %u (the executor has %u)", rank,
                    x->nranks);
  return oi__struct_out(out, &x->ranks[rank].kv, sizeof x->ranks[rank].kv, "kv_layout");
}

OI_API oi_status oi_executor_request_blocks(const oi_executor *x, uint64_t request_id, int64_t *out,
                                            size_t cap, size_t *n) {
  if (!x || !n || (cap && !out))
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "request_blocks: a pointer is NULL");
  request *q = oi__exec_find(x, request_id);
  if (!q)
    return oi__fail(OI_ERR_NOT_FOUND, "request_blocks: no request %llu",
                    (unsigned long long)request_id);
  *n = q->n_blocks;
  if (cap && q->n_blocks) memcpy(out, q->blocks, OI_MIN(cap, (size_t)q->n_blocks) * sizeof *out);
  return OI_OK;
}
