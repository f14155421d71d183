/* The executor's internals: ranks (arena, block pool, offload engine, worker
 * thread), requests, and the scheduler that steps them. executor.c holds
 * construction, teardown and the public queries; scheduler.c the step. */
#ifndef OI_EXECUTOR_INTERNAL_H
#define OI_EXECUTOR_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "core/core.h"
#include "device/device.h"
#include "executor/block_pool.h"
#include "openinfer/engine.h"
#include "openinfer/executor.h"
#include "openinfer/experimental.h"
#include "openinfer/hash.h"

typedef struct request {
  uint64_t id;
  uint32_t rank;
  uint32_t state; /* oi_request_state */
  oi_status status;
  uint32_t prompt_len, max_new;
  uint32_t *tokens; /* prompt, then generated: cap prompt_len + max_new */
  uint32_t n_gen;
  uint8_t *salt;
  uint32_t salt_len;

  oi_block_hash *hashes; /* chained hashes of the full blocks computed so far */
  uint32_t n_hashes, hash_cap;
  int64_t *blocks; /* block table */
  uint32_t n_blocks, blocks_cap;
  uint32_t kv_len;     /* tokens whose KV is in the arena */
  uint32_t registered; /* leading blocks offered to the prefix cache */

  uint32_t cached_tokens, restored_tokens, computed_tokens;
  uint64_t submit_ns, first_token_ns, last_token_ns;

  /* An admission restore in flight: blocks [restore_first, +restore_n). */
  oi_ticket *load_ticket;
  uint32_t restore_first, restore_n;
  uint64_t restore_deadline_ns;
  /* The restore overlaps this step's forward: kv_len already counts the
   * restored blocks, and the forward waits for them (on the device, or the
   * worker on the ticket); settled before the step's results apply. */
  bool overlap;
  /* The query found blocks a deeper tier (disk) is bringing into the pool
   * (OI_QUERY_LOADING): the request waits in RESTORING, without a ticket,
   * and poll_restores queries [restore_first, restore_limit) again each step
   * until nothing is pending or restore_deadline_ns passes. */
  bool tier_wait;
  /* A planned split (docs/planner.md): the restore of [restore_first, ...)
   * runs (a load, or a tier wait) while the request, RUNNING, computes its
   * head [kv_len, restore_first * page); prefill stops there until the
   * restore commits. */
  bool split;
  uint32_t restore_limit;
  uint64_t restore_query_start_ns;
  /* Restore timing (benchmarks): query call, load submit -> completion seen
   * at a step boundary, commit. */
  uint64_t restore_query_ns, restore_load_start_ns, restore_load_done_ns, restore_commit_ns;

  uint32_t sched_tokens; /* this step's share */
  struct request *next;  /* rank queue (waiting, then running) */
  struct request *hnext; /* id table */
} request;

/* Blocks a save reads: unpinned when its on_done arrives. */
typedef struct save_rec {
  struct save_rec *next;
  struct exec_rank *rank;
  oi_status status;
  uint32_t n;
  int64_t ids[];
} save_rec;

/* A load abandoned after restore_timeout_ms: its blocks stay out of the pool
 * until the copy finishes. */
typedef struct orphan_load {
  struct orphan_load *next;
  oi_ticket *ticket;
  uint32_t n;
  int64_t ids[];
} orphan_load;

typedef struct exec_rank {
  struct oi_executor *x;
  uint32_t index;
  int32_t device;
  oi_dev *dev;
  void *arena;               /* the KV region (owned, or the import's mapping) */
  oi_imported_arena *import; /* sidecar */
  oi_kv_layout kv;
  bool model_bound;
  bool save_lock_init;
  bool leak_arena; /* a copy may still touch it: never free */
  oi_engine *engine;
  block_pool pool;

  request *waiting_head, *waiting_tail;
  request *running_head, *running_tail; /* restoring and running, in admission order */
  uint32_t n_running;
  orphan_load *orphans;

  /* Save completions, pushed by the engine's completion thread. */
  pthread_mutex_t save_lock;
  pthread_cond_t save_cv;
  save_rec *saves_done;
  uint64_t saves_outstanding; /* under save_lock */

  /* The worker. */
  pthread_t thread;
  bool thread_started;
  pthread_mutex_t work_lock;
  pthread_cond_t work_cv;
  int work; /* 0 idle, 1 forward posted, 2 stop */
  bool work_done;
  oi_status work_status;
  char work_error[512];
  oi_model_batch batch;
  oi_model_seq *seqs;
  request **seq_req;
  /* Overlapped restores of this step's batch: their per-layer events
   * (batch.kv_events, n_kv_waits x num_layers) and, in host mode, their
   * tickets for the worker to wait on before the forward. */
  void **kv_events;
  oi_ticket **host_waits;
  uint32_t n_host_waits;
  uint64_t forward_ns; /* the last forward's time (the worker's) */
} exec_rank;

/* How a restore may overlap the forward of the prompt's remaining tokens
 * (oi_executor_options.restore_overlap: OFF; HOST: the worker waits for the
 * load before the forward, on any backend, for tests; AUTO: DEVICE when the
 * model has OI_MODEL_KV_EVENTS, else OFF). */
enum { OVERLAP_OFF = 0, OVERLAP_DEVICE = 1, OVERLAP_HOST = 2 };

typedef struct exec_counters {
  uint64_t steps, submitted, finished, failed, prefill_tokens, decode_tokens, cached_tokens,
      restored_tokens, restores_started, restores_completed, restores_failed, saves_submitted;
  uint64_t leases_held, restores_overlapped, restores_waited;
  uint64_t plans, plans_compute, plans_split, plans_partial, plan_ns;
} exec_counters;

/* The prefill cost model (plan.c): t = a * tokens + b * sum of positions,
 * fitted by least squares over the forwards, each sample's weight decaying
 * by PREFILL_DECAY per later sample; or given in the options. */
typedef struct prefill_fit {
  double sxx, sxy, syy, st_x, st_y; /* sums of x*x, x*y, y*y, t*x, t*y */
  double a, b;
  uint64_t samples;
  bool given;
} prefill_fit;

struct oi_executor {
  oi_executor_options o;
  oi_model_ops model;
  void *model_ctx_for_worker; /* o.model_ctx */
  oi_model_desc desc;
  char *namespace_id;
  char *codec; /* NULL: none */
  oi_host *host;
  bool owns_host;
  exec_rank *ranks;
  uint32_t nranks;
  uint32_t next_rank; /* round robin */
  uint64_t next_id;
  request **by_id; /* hash table of every request */
  uint32_t by_id_mask;
  uint64_t n_requests;
  uint32_t page_tokens_max; /* KV tokens a request may need at most: gpu_blocks * page */
  uint32_t overlap_mode;    /* OVERLAP_*: device needs OI_MODEL_KV_EVENTS and CUDA ranks */
  uint64_t block_bytes;     /* one host block: every layer's K and V pages */
  prefill_fit fit;
  exec_counters c;
};

/* A request's restore timing (benchmarks): nanoseconds spent in the query,
 * from load submit to its completion seen at a step boundary, and in commit;
 * all 0 when it did not restore. */
typedef struct oi_exec_restore_timing {
  uint64_t query_ns, load_ns, commit_ns;
} oi_exec_restore_timing;
oi_status oi__executor_restore_timing(const oi_executor *x, uint64_t request_id,
                                      oi_exec_restore_timing *out);

/* plan.c: restore or recompute. The plan of q's restore of blocks [g,
 * limit) (g: the GPU prefix-cache hits): starts the restore it chooses, or
 * none (the blocks are computed). A forward's sample for the prefill fit
 * (tokens, the sum of their positions, ns). */
void oi__exec_plan_restore(exec_rank *r, request *q, uint32_t g, uint32_t limit);
/* Switches the plan (an oi_restore_plan_mode) of the admissions to come,
 * between runs (benchmarks: load-only and planned rows on one executor, the
 * same fitted prefill cost and rate estimates). */
oi_status oi__executor_set_restore_plan(oi_executor *x, uint32_t mode);
void oi__exec_prefill_sample(oi_executor *x, double tokens, double positions, double ns);
void oi__exec_prefill_init(oi_executor *x);

/* scheduler.c */
bool oi__exec_start_restore(exec_rank *r, request *q, uint32_t g, uint32_t limit);
oi_status oi__exec_step(oi_executor *x, uint32_t *finished);
void oi__exec_collect_saves(exec_rank *r);
void oi__exec_release_request(exec_rank *r, request *q, bool save);
request *oi__exec_find(const oi_executor *x, uint64_t id);

#endif
