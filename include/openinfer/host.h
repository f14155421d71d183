/*
 * libopeninfer — the host tier: a pool of pinned host memory holding sealed
 * KV blocks, shared by every engine (rank) of the process.
 *
 * Thread-safety: every function may be called from any thread.
 * Lifetime: destroy every engine created on a host before the host.
 */
#ifndef OPENINFER_HOST_H
#define OPENINFER_HOST_H

#include "openinfer/common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct oi_host oi_host;

/* oi_host_options.flags */
enum {
  OI_HOST_HUGEPAGES = 1u << 0, /* back the pool with 2 MiB hugepages */
  OI_HOST_NO_PIN = 1u << 1,    /* pageable memory (tests, cpu-only hosts) */
};

typedef struct oi_host_options {
  uint32_t struct_size;
  uint32_t flags;        /* OI_HOST_* */
  uint64_t pool_bytes;   /* capacity of the pool (required, > 0) */
  int32_t device;        /* -1: cpu backend; else the CUDA device the pool is mapped for */
  int32_t numa_node;     /* -1: the device's node (or none) */
  uint32_t lease_ttl_ms; /* default 600000 (10 min) */
  uint32_t index_shards; /* power of two; default 64 */
  uint64_t chunk_bytes;  /* pool carving unit, one size class per chunk; 0 = auto */
  float high_watermark;  /* fraction of capacity that starts background eviction; default 0.95 */
  float low_watermark;   /* background eviction stops here; default 0.90 */
  /* Optional: pool setup progress, called on the thread that creates the
   * host: once with done == 0, about every 100 ms while the pool's pages are
   * touched (done = bytes touched so far), and once with done == total when
   * the pool is ready (touched and pinned). When set, the setup's INFO log
   * lines (start, progress, ready) are not written: the hook reports it. */
  void (*progress)(void *ctx, uint64_t done, uint64_t total);
  void *progress_ctx;
  /* Seeds of the host's read-rate estimates, in bytes per second (0: the
   * defaults, OI_RATE_DEFAULT_*): host -> device loads (the link), and the
   * disk tier's and the cluster tier's reads into the pool. Each estimate
   * then follows the transfers the host does (oi_host_stats.*_bytes_per_s;
   * docs/planner.md). */
  uint64_t link_bytes_per_s;
  uint64_t disk_bytes_per_s;
  uint64_t remote_bytes_per_s;
} oi_host_options;

/* The seeds oi_host_options_init leaves at 0 stand for (bytes per second). */
#define OI_RATE_DEFAULT_LINK 16000000000ull  /* PCIe Gen4 x16 to Gen5, pinned */
#define OI_RATE_DEFAULT_DISK 2000000000ull   /* one NVMe drive, O_DIRECT */
#define OI_RATE_DEFAULT_REMOTE 1000000000ull /* the cluster tier over TCP */

/* Output struct: set struct_size = sizeof(oi_host_stats) first. Block counts
 * are host blocks (one KV block across all arenas of its layout). */
typedef struct oi_host_stats {
  uint32_t struct_size;
  uint32_t size_classes;         /* distinct block sizes in use */
  uint64_t capacity_bytes;       /* the pool */
  uint64_t used_bytes;           /* bytes in chunks carved for a size class... */
  uint64_t free_bytes;           /* ...and the rest; used + free == capacity */
  uint64_t block_bytes_resident; /* bytes of blocks in flight or sealed (what the pool holds) */
  uint64_t pool_setup_ns;        /* time to map, touch and pin the pool at create */
  uint64_t blocks_free;          /* carved slots holding nothing */
  uint64_t blocks_in_flight;     /* being saved, invisible to queries */
  uint64_t blocks_sealed;        /* visible to queries (includes leased and loading) */
  uint64_t blocks_leased;        /* sealed blocks a live lease pins */
  uint64_t blocks_loading;       /* sealed blocks a load is reading */
  uint64_t blocks_pinned;        /* sealed blocks a lease or a load holds (not evictable) */
  uint64_t saves_submitted;      /* blocks offered to save */
  uint64_t saves_completed;      /* blocks sealed */
  uint64_t saves_deduplicated;   /* blocks already sealed or in flight */
  uint64_t saves_dropped;        /* blocks that got no memory */
  uint64_t saves_failed;         /* blocks whose copy failed (never made visible) */
  uint64_t loads_submitted;      /* load operations accepted (consumed a lease share) */
  uint64_t loads_completed;      /* load operations */
  uint64_t loads_failed;
  uint64_t blocks_loaded;     /* blocks copied host -> device */
  uint64_t bytes_saved;       /* device -> host */
  uint64_t bytes_loaded;      /* host -> device */
  uint64_t query_hit_blocks;  /* blocks reported as hits */
  uint64_t query_miss_blocks; /* queried blocks past the hit prefix */
  uint64_t leases_active;
  uint64_t leases_expired;  /* by TTL */
  uint64_t leases_released; /* explicitly, or when their last share was consumed */
  uint64_t evictions;       /* blocks evicted */
  uint32_t namespaces;      /* namespaces bound (see oi_host_get_namespace_stats) */
  uint32_t latency_buckets; /* OI_LATENCY_BUCKETS */
  /* Save latency: from the save call to every accepted block sealed (or the
   * operation failed), per save operation that copied at least one block. */
  uint64_t save_latency_us[OI_LATENCY_BUCKETS];
  uint64_t save_latency_sum_us;
  /* Load latency: from the load call to the last block landed, per load
   * operation accepted. */
  uint64_t load_latency_us[OI_LATENCY_BUCKETS];
  uint64_t load_latency_sum_us;
  /* The read-rate estimates (bytes per second; docs/planner.md): the
   * link's, from the loads (host -> device), and the disk and cluster
   * tiers', from their promotions (bytes over the time any promotion of the
   * tier was in flight). Each starts at its seed (oi_host_options) and moves
   * by an EWMA (weight 1/4) per sample of 1 MiB or more (a smaller one
   * measures a transfer's fixed cost, not the rate); *_samples count the
   * samples taken. */
  uint64_t link_bytes_per_s;
  uint64_t disk_bytes_per_s;
  uint64_t remote_bytes_per_s;
  uint64_t link_samples;
  uint64_t disk_samples;
  uint64_t remote_samples;
} oi_host_stats;

/* Output struct of oi_host_get_namespace_stats: set struct_size first. */
typedef struct oi_host_namespace_stats {
  uint32_t struct_size;
  uint32_t index;           /* as asked */
  char name[256];           /* NUL-terminated; truncated past 255 bytes */
  uint64_t block_bytes;     /* bytes of one block of this namespace (decoded) */
  uint64_t blocks_resident; /* blocks in flight or sealed in this namespace */
  /* The namespace's codec (oi_engine_options.codec, docs/codecs.md): */
  char codec[16];          /* "none", "lossless", "int8", "int8-hadamard", "fp8" */
  uint64_t stored_bytes;   /* what the pool and the tiers keep per block: the
                              codec's frame slot (block_bytes without a codec) */
  uint64_t logical_bytes;  /* blocks_resident x block_bytes */
  uint64_t physical_bytes; /* blocks_resident x the pool slot each takes (stored_bytes
                              rounded up to the pool's slot alignment): the
                              namespace's ratio is logical / physical */
} oi_host_namespace_stats;

/* Fills defaults. @return OI_ERR_INVALID_ARGUMENT on NULL. */
OI_API oi_status oi_host_options_init(oi_host_options *o);

/* Maps and pins the pool (may take seconds for large pools; progress goes to
 * oi_host_options.progress, or is logged at INFO). */
OI_API oi_status oi_host_create(const oi_host_options *o, oi_host **out);

/* Frees the pool. Accepts NULL. Every engine must be destroyed first:
 * destroying a host with live engines is refused (logged, nothing freed). */
OI_API void oi_host_destroy(oi_host *h);

OI_API oi_status oi_host_get_stats(const oi_host *h, oi_host_stats *out);

/* The namespace number `index`, in [0, oi_host_stats.namespaces): namespaces
 * are numbered in the order they were first registered and never go away.
 * @return OI_ERR_NOT_FOUND past the last one. */
OI_API oi_status oi_host_get_namespace_stats(const oi_host *h, uint32_t index,
                                             oi_host_namespace_stats *out);

/* ------------------------------------------------------------------------ */
/* Restore or recompute: the plan (docs/planner.md)                          */
/* ------------------------------------------------------------------------ */

/* Where a block is (oi_query_result.where, oi_restore_plan_args.where). */
typedef enum oi_block_where {
  OI_WHERE_NONE = 0,    /* no tier has it */
  OI_WHERE_POOL = 1,    /* the host pool (sealed, or being saved into it) */
  OI_WHERE_DISK = 2,    /* the disk tier */
  OI_WHERE_REMOTE = 3,  /* another node (the cluster tier) */
  OI_WHERE_UNKNOWN = 4, /* held, but the answer does not say where (a sidecar) */
} oi_block_where;

/* oi_restore_plan_args.flags */
enum {
  /* The load runs layer by layer under the forward of the tokens after it
   * (the executor's overlapped restore on CUDA ranks): a forward's layer l
   * waits only for layer l's copies. */
  OI_PLAN_LAYERWISE = 1u << 0,
  /* Plan no computed head: load [0, k) and compute the rest. */
  OI_PLAN_NO_SPLIT = 1u << 1,
  /* A tier's reads land in the pool before the link copy starts (the
   * executor waits for a promotion, then loads); without it the two
   * overlap block by block. */
  OI_PLAN_STAGED = 1u << 2,
};

/* What oi_plan_restore plans from: a prompt of prompt_tokens tokens whose
 * KV of [0, start_tokens) is already on the device, followed by n_blocks
 * blocks (block_tokens tokens, block_bytes bytes each) that the host tier
 * holds where `where` says; the rest is computed. Rates in bytes per
 * second (the host's estimates: oi_host_stats.*_bytes_per_s); the prefill
 * cost of a token at position p (its context) is a + b * p nanoseconds. */
typedef struct oi_restore_plan_args {
  uint32_t struct_size;
  uint32_t flags;         /* OI_PLAN_* */
  uint64_t prompt_tokens; /* > start_tokens + n_blocks * block_tokens (one token is computed) */
  uint64_t start_tokens;  /* KV already on the device (a GPU prefix-cache hit) */
  uint64_t n_blocks;      /* the held blocks right after start_tokens */
  const uint8_t *where;   /* n_blocks oi_block_where (NULL: every block in the pool); the
                             plan loads none past the first OI_WHERE_NONE */
  uint64_t block_tokens;  /* > 0 */
  uint64_t block_bytes;   /* > 0: one block's KV, every layer */
  uint32_t num_layers;    /* for OI_PLAN_LAYERWISE (0 or 1: no layer overlap) */
  uint32_t reserved;
  uint64_t link_bytes_per_s;       /* > 0: host -> device */
  uint64_t disk_bytes_per_s;       /* > 0 when a block is on disk */
  uint64_t remote_bytes_per_s;     /* > 0 when a block is remote */
  double prefill_ns_per_token;     /* a (> 0, or b > 0) */
  double prefill_ns_per_token_ctx; /* b: attention's share, per token of context */
  uint64_t load_overhead_ns;       /* a fixed cost of any load (query, lease, submit) */
} oi_restore_plan_args;

/* The plan: compute blocks [0, compute_head_blocks) (from start_tokens),
 * while blocks [compute_head_blocks, compute_head_blocks + load_blocks) load,
 * then compute the rest of the prompt. load_blocks 0: compute everything. */
typedef struct oi_restore_plan {
  uint32_t struct_size;
  uint32_t reserved;
  uint64_t compute_head_blocks;
  uint64_t load_blocks;
  uint64_t load_tokens;     /* load_blocks * block_tokens */
  uint64_t compute_tokens;  /* prompt tokens past start_tokens not loaded */
  uint64_t est_ns;          /* the plan's time to first token (the model's estimate) */
  uint64_t est_cold_ns;     /* compute everything past start_tokens */
  uint64_t est_load_all_ns; /* load the leading run of held blocks, compute the rest */
} oi_restore_plan;

/* Fills defaults: no flags, every other field 0. */
OI_API oi_status oi_restore_plan_args_init(oi_restore_plan_args *a);

/* Plans how many leading blocks to compute, load and compute after, so that
 * the estimated time to first token is lowest: never above computing
 * everything (est_ns <= est_cold_ns) nor loading every leading held block
 * (est_ns <= est_load_all_ns). A pure function of its arguments (the
 * model: docs/planner.md). @return OI_ERR_INVALID_ARGUMENT naming the
 * field. */
OI_API oi_status oi_plan_restore(const oi_restore_plan_args *a, oi_restore_plan *out);

/* Evicts every block that no lease, load or save holds.
 * @param evicted_blocks optional: receives the count. */
OI_API oi_status oi_host_evict_all(oi_host *h, uint64_t *evicted_blocks);

#ifdef __cplusplus
}
#endif
#endif
