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
} oi_host_options;

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
} oi_host_stats;

/* Output struct of oi_host_get_namespace_stats: set struct_size first. */
typedef struct oi_host_namespace_stats {
  uint32_t struct_size;
  uint32_t index;           /* as asked */
  char name[256];           /* NUL-terminated; truncated past 255 bytes */
  uint64_t block_bytes;     /* bytes of one block of this namespace */
  uint64_t blocks_resident; /* blocks in flight or sealed in this namespace */
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

/* Evicts every block that no lease, load or save holds.
 * @param evicted_blocks optional: receives the count. */
OI_API oi_status oi_host_evict_all(oi_host *h, uint64_t *evicted_blocks);

#ifdef __cplusplus
}
#endif
#endif
