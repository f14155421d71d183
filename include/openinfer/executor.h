/*
 * libopeninfer — the executor: the KV runtime an inference engine embeds.
 *
 * An oi_executor owns one worker thread per rank, each rank's KV arena
 * (allocated here, or imported from the sidecar), a block pool with a prefix
 * cache, the offload engines, and a scheduler (FCFS admission under a token
 * and block budget, chunked prefill, continuous batching of decode, greedy
 * sampling). The model is supplied as a vtable (oi_model_ops); the library
 * ships a reference model (oi_refmodel_create) that implements it.
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

#ifdef __cplusplus
extern "C" {
#endif

typedef struct oi_executor oi_executor;

/* ------------------------------------------------------------------------ */
/* The model interface                                                       */
/* ------------------------------------------------------------------------ */

/* What a model needs in the KV arena, per layer and token. Output struct of
 * oi_model_ops.describe (the executor sets struct_size). */
typedef struct oi_model_desc {
  uint32_t struct_size;
  uint32_t num_layers; /* one arena per layer */
  uint32_t num_kv_heads;
  uint32_t head_dim;
  uint32_t dtype_bytes; /* bytes of one K or V element (4: float32, 2: bf16/fp16) */
  uint32_t vocab_size;
  uint32_t max_positions; /* longest sequence the model accepts (prompt + generated) */
  /* Names the weights and KV format, e.g. "refmodel-v1 seed=1 L2 d64 ...":
   * the executor's default namespace is derived from it, so two models whose
   * KV bytes differ must never report the same id. Owned by the model; valid
   * while its ctx lives. */
  const char *model_id;
  uint32_t flags; /* OI_MODEL_* capabilities */
} oi_model_desc;

/* oi_model_desc.flags */
enum {
  /* forward honours oi_model_batch.kv_events: it makes its CUDA stream wait
   * for layer l's events before it reads layer l's KV. The executor then
   * queues the forward of a restored prompt's last tokens while the restore
   * is still loading (layer by layer), instead of after it. */
  OI_MODEL_KV_EVENTS = 1u << 0,
};

/* Where a rank's KV lives. One arena per layer; in each arena a block is its
 * K page followed by its V page (the [num_blocks, 2, page, kv_heads,
 * head_dim] shape; the offload engine sees it as 2 segments). The element (head h, dim d) of token
 * slot t of block b, layer l is K: base + l*layer_stride + b*block_stride + t*token_stride +
 * (h*head_dim + d)*dtype_bytes V: the same + segment_stride A token at position p of a sequence
 * lives in block block_table[p / page_size], slot p % page_size (the slot mapping is implied by the
 * block table). */
typedef struct oi_kv_layout {
  uint32_t struct_size;
  int32_t device; /* -1 cpu (base is host memory); else a CUDA device pointer */
  void *base;
  uint64_t bytes; /* of the whole region */
  uint32_t num_layers;
  uint32_t page_size;      /* tokens per block */
  uint64_t num_blocks;     /* blocks per arena */
  uint64_t layer_stride;   /* bytes between two layers' arenas */
  uint64_t block_stride;   /* bytes between two blocks of one arena (a K page + a V page) */
  uint64_t segment_stride; /* bytes from a block's K page to its V page */
  uint64_t token_stride;   /* bytes between two token slots of a page */
} oi_kv_layout;

/* One sequence of a forward batch. */
typedef struct oi_model_seq {
  uint64_t request_id;    /* for logs */
  const uint32_t *tokens; /* the n_tokens new tokens */
  uint32_t n_tokens;
  uint32_t position;          /* position of tokens[0]: KV of [0, position) is in the arena */
  const int64_t *block_table; /* n_blocks ids covering at least [0, position + n_tokens) */
  uint32_t n_blocks;
  uint32_t want_token; /* 1: sample after the last new token */
  uint32_t next_token; /* out (want_token): greedy argmax of the last row's logits */
  float *logits;       /* optional out (want_token): vocab_size floats of the last row */
} oi_model_seq;

typedef struct oi_model_batch {
  uint32_t struct_size;
  uint32_t rank;
  uint32_t n_seqs;
  oi_model_seq *seqs;
  /* Restores still loading (models with OI_MODEL_KV_EVENTS; 0 otherwise).
   * kv_events[i * num_layers + l] is a CUDA event (cudaEvent_t) after which
   * restore i's blocks of layer l are in the arena; NULL: nothing to wait
   * for. Before the forward reads layer l's KV it makes its stream wait for
   * every restore's layer-l event. If a load then fails, the executor
   * discards what the forward computed for that sequence and recomputes it.
   * Valid during the call (the model reads these fields only when
   * struct_size covers them). */
  uint32_t n_kv_waits;
  void *const *kv_events;
} oi_model_batch;

/* The model vtable. The executor calls describe once, bind once per rank
 * (from the thread that creates the executor, after the rank's arena exists
 * and before any forward), forward from the rank's worker thread (ranks run
 * concurrently; calls for one rank never overlap), and unbind per rank before
 * that rank's arena goes away.
 *
 * forward must write the K and V of every new token into its slot and must
 * be batch-invariant for the executor's guarantees to hold: a row's result
 * (its KV bytes and logits) may not depend on the other rows of the batch,
 * nor on how a sequence's tokens were split into chunks. */
typedef struct oi_model_ops {
  uint32_t struct_size;
  oi_status (*describe)(void *ctx, oi_model_desc *out);
  oi_status (*bind)(void *ctx, uint32_t rank, const oi_kv_layout *layout);
  oi_status (*forward)(void *ctx, const oi_model_batch *batch);
  void (*unbind)(void *ctx, uint32_t rank); /* optional */
} oi_model_ops;

/* ------------------------------------------------------------------------ */
/* The reference model                                                       */
/* ------------------------------------------------------------------------ */

/* A small decoder-only transformer with deterministic pseudo-random weights:
 * token embedding, RMSNorm, Q/K/V projections, RoPE, grouped-query attention
 * over the paged KV arena, output projection, SwiGLU MLP, final RMSNorm, LM
 * head, greedy argmax. float32 math and float32 KV (dtype_bytes 4). Every
 * kernel is batch-invariant (one row at a time, fixed summation order), so
 * KV bytes and tokens do not depend on batching or chunking.
 * Devices: the cpu model (options.device -1) binds cpu ranks only (a CUDA
 * rank is refused with OI_ERR_UNSUPPORTED); the CUDA model (options.device
 * >= 0) binds ranks on its device only. */
typedef struct oi_refmodel_options {
  uint32_t struct_size;
  uint64_t seed;          /* weights; default 1 */
  uint32_t num_layers;    /* default 2 */
  uint32_t hidden;        /* default 64 */
  uint32_t num_q_heads;   /* default 4 */
  uint32_t num_kv_heads;  /* default 2; divides num_q_heads */
  uint32_t head_dim;      /* default 16; even */
  uint32_t intermediate;  /* SwiGLU width; default 128 */
  uint32_t vocab_size;    /* default 512 */
  uint32_t max_positions; /* default 4096 */
  float rope_theta;       /* default 10000 */
  float rms_eps;          /* default 1e-5 */
  /* -1 (default): the cpu model above (float32 weights and KV). >= 0: the
   * CUDA model on that device: the same architecture with bf16 weights
   * (generated on the GPU from `seed`), bf16 activations and KV (dtype_bytes
   * 2) and fp32 accumulation, on tensor cores; every kernel batch-invariant.
   * Its ranks must be on that device. Needs head_dim 64 or 128 and hidden,
   * num_q_heads * head_dim and intermediate multiples of 64; without the
   * CUDA backend or a GPU, create fails (OI_ERR_UNSUPPORTED / OI_ERR_NO_DEVICE). */
  int32_t device;
} oi_refmodel_options;

OI_API oi_status oi_refmodel_options_init(oi_refmodel_options *o);

/* Creates the model. Fills *ops_out (set ops_out->struct_size =
 * sizeof(oi_model_ops) first) and *ctx_out, to pass to
 * oi_executor_options.model / model_ctx. The context must outlive every
 * executor that uses it. */
OI_API oi_status oi_refmodel_create(const oi_refmodel_options *o, oi_model_ops *ops_out,
                                    void **ctx_out);
/* Frees a model from oi_refmodel_create. Accepts NULL. */
OI_API void oi_refmodel_destroy(void *ctx);

/* ------------------------------------------------------------------------ */
/* The executor                                                              */
/* ------------------------------------------------------------------------ */

/* oi_executor_options.offload */
typedef enum oi_offload_mode {
  OI_OFFLOAD_NONE = 0,     /* GPU prefix cache only */
  OI_OFFLOAD_EMBEDDED = 1, /* one host tier in this process shared by every rank */
  OI_OFFLOAD_SIDECAR = 2,  /* `openinfer serve`: the server allocates the arenas */
} oi_offload_mode;

/* Called for every generated token (from the thread driving the executor,
 * inside oi_executor_step). index counts from 0; finished is 1 on the last. */
typedef void (*oi_token_fn)(void *ctx, uint64_t request_id, uint32_t token, uint32_t index,
                            int finished);

/* Fault points of the admission restore, for tests (oi_executor_options.fault_hook). */
typedef enum oi_executor_fault {
  OI_FAULT_QUERY = 1,          /* the host-tier query fails */
  OI_FAULT_LEASE_EXPIRED = 2,  /* the lease is gone before the load (released, as a TTL would) */
  OI_FAULT_NO_FREE_BLOCKS = 3, /* reserving GPU blocks for the restore finds none */
  OI_FAULT_LOAD_SUBMIT = 4,    /* the load is refused at submission (the lease is still held) */
  OI_FAULT_LOAD_COMPLETE = 5,  /* the load completes with an error (its blocks are garbage) */
} oi_executor_fault;

/* Return nonzero to inject `fault` into the restore of `request_id` on `rank`. */
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
  oi_offload_host *host;
  const oi_host_options *host_options;
  const char *socket_path;   /* SIDECAR: the server's socket (NULL: its default path) */
  const char *namespace_id;  /* NULL: "oi-executor/" + the model's model_id */
  uint32_t max_batch_tokens; /* per rank and step (prefill chunks + decodes); default 256 */
  uint32_t max_batch_seqs;   /* running requests per rank; default 32 */
  uint32_t prefix_cache;     /* 1 (default): reuse cached full blocks; 0: never (and no offload) */
  oi_token_fn on_token;      /* optional */
  void *on_token_ctx;
  uint32_t restore_timeout_ms; /* a host-tier load that takes longer is abandoned; default 30000 */
  uint32_t flush_timeout_ms;   /* destroy's deadline for in-flight saves; default 30000 */
  /* For tests: consulted at each fault point of an admission restore. */
  oi_executor_fault_fn fault_hook;
  void *fault_ctx;
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
typedef struct oi_exec_stats {
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
} oi_exec_stats;

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
OI_API oi_status oi_executor_result(oi_executor *x, uint64_t request_id, oi_request_result *out);

/* Waits (up to timeout_ms, UINT32_MAX forever) until every save submitted so
 * far landed in the host tier, and returns their GPU blocks to the pool. */
OI_API oi_status oi_executor_flush(oi_executor *x, uint32_t timeout_ms);

/* Drops every inactive block from the GPU prefix cache (blocks still pinned
 * by a save leave the cache now and the pool when the save lands), so later
 * requests must restore from the host tier or recompute.
 * @param evicted optional: receives the number of blocks dropped. */
OI_API oi_status oi_executor_evict_gpu_cache(oi_executor *x, uint64_t *evicted);

OI_API oi_status oi_executor_stats(const oi_executor *x, oi_exec_stats *out);

/* Rank `rank`'s KV arena layout (the same the model was bound with), for
 * inspection and tests. */
OI_API oi_status oi_executor_kv_layout(const oi_executor *x, uint32_t rank, oi_kv_layout *out);

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
