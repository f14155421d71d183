/*
 * libopeninfer — the executor: the KV runtime an inference engine embeds.
 *
 * An oi_executor owns one worker thread per rank, each rank's KV arena
 * (allocated here, or imported from the sidecar), a block pool with a prefix
 * cache, the offload engines, and a scheduler (FCFS admission under a token
 * and block budget, chunked prefill, continuous batching of decode, greedy
 * sampling). The model is supplied as a vtable (oi_model_ops, model.h); the
 * library ships a reference model that implements it (oi_refmodel_create, in
 * the experimental API: experimental.h).
 *
 * Admission restores a prompt's prefix from the host tier when it fell out of
 * the GPU prefix cache; release saves a finished request's full blocks to the
 * host tier. Both degrade to recomputation on any failure: the host tier is a
 * cache, never a correctness dependency.
 *
 * Threading: an executor is driven from one thread (every oi_executor_*
 * function on one executor from the same thread, or serialized by the
 * caller). The model's forward runs on the rank worker threads, ranks in
 * parallel.
 */
#ifndef OPENINFER_EXECUTOR_H
#define OPENINFER_EXECUTOR_H

#include "openinfer/common.h"
#include "openinfer/host.h"
#include "openinfer/model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct oi_executor oi_executor;

/* ------------------------------------------------------------------------ */
/* The executor                                                              */
/* ------------------------------------------------------------------------ */

/* oi_executor_options.offload */
typedef enum oi_offload_mode {
  OI_OFFLOAD_NONE = 0,     /* GPU prefix cache only */
  OI_OFFLOAD_EMBEDDED = 1, /* one host tier in this process shared by every rank */
  OI_OFFLOAD_SIDECAR = 2,  /* `openinfer serve`: the server allocates the arenas */
} oi_offload_mode;

/* oi_executor_options.restore_overlap */
typedef enum oi_restore_overlap {
  /* Default: overlap on the device when the model declares
   * OI_MODEL_KV_EVENTS (CUDA ranks), otherwise not at all. */
  OI_RESTORE_OVERLAP_AUTO = 0,
  OI_RESTORE_OVERLAP_OFF = 1, /* the forward runs only after the restore committed */
  /* Any backend: the worker waits for the load before the forward (tests). */
  OI_RESTORE_OVERLAP_HOST = 2,
} oi_restore_overlap;

/* oi_executor_options.restore_plan */
typedef enum oi_restore_plan_mode {
  /* Default: each admission restore is planned (oi_plan_restore,
   * docs/planner.md): the held blocks are located, and the executor loads,
   * computes, or computes a head while loading the rest, whichever the
   * model says is first to the first token. Until the prefill cost is known
   * (given in the options or measured from a forward), every hit loads. */
  OI_RESTORE_PLAN_AUTO = 0,
  OI_RESTORE_PLAN_OFF = 1, /* load every hit (no plan) */
} oi_restore_plan_mode;

/* Called for every generated token (from the thread driving the executor,
 * inside oi_executor_step). index counts from 0; finished is 1 on the last. */
typedef void (*oi_token_fn)(void *ctx, uint64_t request_id, uint32_t token, uint32_t index,
                            int finished);

/* For tests: return nonzero to inject `fault` (an oi_executor_fault of the
 * experimental API, experimental.h) into the restore of `request_id` on
 * `rank`. */
typedef int (*oi_executor_fault_fn)(void *ctx, uint32_t rank, uint64_t request_id, uint32_t fault);

typedef struct oi_executor_options {
  uint32_t struct_size;
  const oi_model_ops *model; /* required; copied at create */
  void *model_ctx;
  uint32_t ranks;         /* default 1 */
  const int32_t *devices; /* `ranks` device ordinals; NULL: every rank on the cpu (-1) */
  uint32_t page_size;     /* tokens per KV block; default 16 */
  uint32_t gpu_blocks;    /* KV blocks per rank; default 256 */
  uint32_t offload;       /* oi_offload_mode; default NONE */
  /* EMBEDDED: the host tier to share (not owned; must outlive the executor),
   * or NULL to create one from host_options (NULL: a 64 MiB unpinned pool). */
  oi_host *host;
  const oi_host_options *host_options;
  const char *socket_path;   /* SIDECAR: the server's socket (NULL: its default path) */
  const char *namespace_id;  /* NULL: "oi-executor/" + the model's model_id */
  uint32_t max_batch_tokens; /* per rank and step (prefill chunks + decodes); default 256 */
  uint32_t max_batch_seqs;   /* running requests per rank; default 32 */
  uint32_t prefix_cache;     /* 1 (default): reuse cached full blocks; 0: never (and no offload) */
  oi_token_fn on_token;      /* optional */
  void *on_token_ctx;
  uint32_t restore_timeout_ms; /* a host-tier load that takes longer is abandoned; default 30000 */
  /* Whether a restore's load may overlap the forward of the prompt's
   * remaining tokens (oi_restore_overlap, default AUTO; docs/executor.md).
   * The `openinfer` command maps OI_RESTORE_OVERLAP=0|off|host onto it. */
  uint32_t restore_overlap;
  uint32_t flush_timeout_ms; /* destroy's deadline for in-flight saves; default 30000 */
  /* For tests: consulted at each fault point of an admission restore (the
   * points are experimental API: experimental.h). */
  oi_executor_fault_fn fault_hook;
  void *fault_ctx;
  /* Restore or recompute (oi_restore_plan_mode, default AUTO;
   * docs/planner.md). The `openinfer` command maps OI_RESTORE_PLAN=0|off
   * onto it. */
  uint32_t restore_plan;
  uint32_t reserved;
  /* The plan's prefill cost of a token at position p: a + b * p ns (both 0:
   * measured from the forwards, oi_executor_stats.prefill_ns_per_token*). */
  double prefill_ns_per_token;
  double prefill_ns_per_token_ctx;
  /* The plan's read rates, bytes per second (0: the host's estimates,
   * oi_host_stats.*_bytes_per_s; a sidecar executor: OI_RATE_DEFAULT_*). */
  uint64_t link_bytes_per_s;
  uint64_t disk_bytes_per_s;
  uint64_t remote_bytes_per_s;
  /* Appended: the codec of the executor's namespace (oi_engine_options.codec,
   * docs/codecs.md): NULL or "none" (default), "lossless", or the lossy
   * "int8", "int8-hadamard" and "fp8", whose shape is the model's (a block's parts are its
   * layers' K and V pages of page_size tokens, num_kv_heads heads of
   * head_dim) and which need bf16 KV (dtype_bytes 2). Needs offload. */
  const char *codec;
  uint64_t codec_slot_bytes; /* oi_engine_options.codec_slot_bytes; 0: the codec's default */
} oi_executor_options;

typedef struct oi_request {
  uint32_t struct_size;
  const uint32_t *prompt;  /* copied at submit */
  uint32_t prompt_len;     /* >= 1 */
  uint32_t max_new_tokens; /* >= 1 */
  int32_t rank;            /* -1: round robin */
  const void *salt;        /* optional bytes mixed into the block hashes (LoRA, tenant) */
  uint32_t salt_len;
} oi_request;

/* oi_request_result.state */
typedef enum oi_request_state {
  OI_REQUEST_WAITING = 0,   /* queued for admission */
  OI_REQUEST_RESTORING = 1, /* its prefix is loading from the host tier */
  OI_REQUEST_RUNNING = 2,   /* prefill or decode */
  OI_REQUEST_FINISHED = 3,
  OI_REQUEST_FAILED = 4, /* status says why */
} oi_request_state;

typedef struct oi_request_result {
  uint32_t struct_size;
  uint32_t state;   /* oi_request_state */
  oi_status status; /* OI_OK, or why the request failed */
  uint32_t rank;
  const uint32_t *tokens; /* generated so far; owned by the executor, valid until destroy
                             (and stable once FINISHED) */
  uint32_t n_tokens;
  uint32_t prompt_len;
  uint32_t cached_tokens;   /* prompt tokens found in the GPU prefix cache */
  uint32_t restored_tokens; /* prompt tokens restored from the host tier */
  uint32_t computed_tokens; /* prompt tokens prefilled */
  uint64_t ttft_ns;         /* submit -> first token */
  uint64_t latency_ns;      /* submit -> last token */
} oi_request_result;

/* Totals over every rank. */
typedef struct oi_executor_stats {
  uint32_t struct_size;
  uint32_t ranks;
  uint64_t steps;
  uint64_t requests_submitted;
  uint64_t requests_finished;
  uint64_t requests_failed;
  uint64_t prefill_tokens; /* computed prompt tokens */
  uint64_t decode_tokens;
  uint64_t cached_tokens;   /* GPU prefix-cache hits */
  uint64_t restored_tokens; /* host-tier restores */
  uint64_t restores_started;
  uint64_t restores_completed;
  uint64_t restores_failed;     /* degraded to prefill */
  uint64_t saves_submitted;     /* blocks offered to the host tier on release */
  uint64_t save_blocks_pending; /* GPU blocks still pinned by in-flight saves */
  uint64_t blocks_total;
  uint64_t blocks_free;
  uint64_t blocks_cached; /* inactive, in the prefix cache (evictable) */
  uint64_t blocks_active; /* held by requests */
  uint64_t leases_held;   /* host-tier leases the executor holds right now */
  /* Restores whose load overlapped the forward of the prompt's remaining
   * tokens (OI_MODEL_KV_EVENTS models on CUDA ranks; docs/executor.md). */
  uint64_t restores_overlapped;
  /* Restores that first waited for a deeper tier (the disk) to bring blocks
   * back into the host pool (the query answered OI_QUERY_LOADING). */
  uint64_t restores_waited;
  /* Restore or recompute (docs/planner.md): admissions planned; of them,
   * plans that loaded nothing (every held block computed), that computed a
   * head while the rest loaded, and that loaded fewer blocks than were
   * held; the time spent planning (locating the blocks and the plan). */
  uint64_t plans;
  uint64_t plans_compute;
  uint64_t plans_split;
  uint64_t plans_partial;
  uint64_t plan_ns;
  /* The prefill cost the plan uses (given, or fitted to the forwards: ns
   * per token = a + b * its position), and the forwards measured. */
  double prefill_ns_per_token;
  double prefill_ns_per_token_ctx;
  uint64_t prefill_samples;
} oi_executor_stats;

OI_API oi_status oi_executor_options_init(oi_executor_options *o);
OI_API oi_status oi_request_init(oi_request *r);

/* Creates the executor: per rank, the arena (allocated on the rank's device,
 * or imported from the sidecar, whose instance is registered before any KV
 * exists), the model binding, the offload engine and the worker thread. A
 * failure unwinds in the destroy order. */
OI_API oi_status oi_executor_create(const oi_executor_options *o, oi_executor **out);

/* Queues a request. @return OI_ERR_INVALID_ARGUMENT when it cannot ever run
 * (empty prompt, too long for the model, more blocks than a rank has). */
OI_API oi_status oi_executor_submit(oi_executor *x, const oi_request *r, uint64_t *request_id);

/* One scheduler step over every rank: completed saves unpin their blocks,
 * finished restores are committed, requests are admitted, one forward batch
 * per rank runs (ranks in parallel), tokens are sampled and finished requests
 * release their blocks (saving them to the host tier).
 * @param finished optional: receives the number of requests that finished. */
OI_API oi_status oi_executor_step(oi_executor *x, uint32_t *finished);

/* Steps until no request is waiting, restoring or running. */
OI_API oi_status oi_executor_run_until_idle(oi_executor *x);

/* The state and output of a request (see oi_request_result). */
OI_API oi_status oi_executor_get_result(oi_executor *x, uint64_t request_id,
                                        oi_request_result *out);

/* Waits (up to timeout_ms, UINT32_MAX forever) until every save submitted so
 * far landed in the host tier, and returns their GPU blocks to the pool. */
OI_API oi_status oi_executor_flush(oi_executor *x, uint32_t timeout_ms);

/* Drops every inactive block from the GPU prefix cache (blocks still pinned
 * by a save leave the cache now and the pool when the save lands), so later
 * requests must restore from the host tier or recompute.
 * @param evicted optional: receives the number of blocks dropped. */
OI_API oi_status oi_executor_evict_gpu_cache(oi_executor *x, uint64_t *evicted);

OI_API oi_status oi_executor_get_stats(const oi_executor *x, oi_executor_stats *out);

/* Rank `rank`'s KV arena layout (the same the model was bound with), for
 * inspection and tests. */
OI_API oi_status oi_executor_get_kv_layout(const oi_executor *x, uint32_t rank, oi_kv_layout *out);

/* The block table of a request (its blocks in position order, as of now or
 * of its finish). Writes min(count, cap) ids; *n receives the count. */
OI_API oi_status oi_executor_request_blocks(const oi_executor *x, uint64_t request_id, int64_t *out,
                                            size_t cap, size_t *n);

/* Stops the workers, drains in-flight loads, closes the arena mapping (the
 * sidecar's import), flushes saves (flush_timeout_ms), destroys the offload
 * engines (unregister), frees the arenas. An arena a copy may still touch
 * after the deadline is leaked, never freed, and the log says so.
 * Accepts NULL. */
OI_API void oi_executor_destroy(oi_executor *x);

#ifdef __cplusplus
}
#endif
#endif
