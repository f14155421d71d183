/*
 * libopeninfer — experimental API: the reference model, the executor's
 * test-only fault points, device memory for tools and tests, and the
 * cluster tier (still growing).
 *
 * Nothing here is part of the stable ABI. The declarations are visible only
 * when OI_EXPERIMENTAL is defined before this header is included (in the
 * manner of a "static linking only" section):
 *
 *   #define OI_EXPERIMENTAL
 *   #include <openinfer/openinfer.h>
 *
 * The functions are exported under their own version node,
 * OPENINFER_EXPERIMENTAL_0.1, which may change or disappear in any release
 * (docs/api.md, "Versions and the ABI").
 */
#ifndef OPENINFER_EXPERIMENTAL_H
#define OPENINFER_EXPERIMENTAL_H

#include "openinfer/common.h"
#include "openinfer/host.h"
#include "openinfer/model.h"

#if defined(OI_EXPERIMENTAL)

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Errors of companion libraries                                             */
/* ------------------------------------------------------------------------ */

/* Records `msg` (copied; NULL: empty) as the calling thread's last error,
 * what oi_last_error() returns, and returns `st`: for code outside
 * libopeninfer.so that implements its interfaces (a model's oi_model_ops,
 * libopeninfer-refmodel.so) and reports through its one error pattern. */
OI_API oi_status oi_set_last_error(oi_status st, const char *msg);

/* ------------------------------------------------------------------------ */
/* The reference model (libopeninfer-refmodel.so, not libopeninfer.so)      */
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
/* Executor fault points (tests)                                             */
/* ------------------------------------------------------------------------ */

/* Fault points of the admission restore, for tests (oi_executor_options.fault_hook,
 * the `fault` argument of oi_executor_fault_fn). */
typedef enum oi_executor_fault {
  OI_FAULT_QUERY = 1,          /* the host-tier query fails */
  OI_FAULT_LEASE_EXPIRED = 2,  /* the lease is gone before the load (released, as a TTL would) */
  OI_FAULT_NO_FREE_BLOCKS = 3, /* reserving GPU blocks for the restore finds none */
  OI_FAULT_LOAD_SUBMIT = 4,    /* the load is refused at submission (the lease is still held) */
  OI_FAULT_LOAD_COMPLETE = 5,  /* the load completes with an error (its blocks are garbage) */
} oi_executor_fault;

/* ------------------------------------------------------------------------ */
/* Device memory for tools and tests                                         */
/* ------------------------------------------------------------------------ */

/* A region of device memory (a CUDA allocation; host memory on the cpu
 * backend, device -1), for tools that stand in for an engine's KV arena
 * (`openinfer demo tier`). */
typedef struct oi_device_buffer oi_device_buffer;

/* Allocates `bytes` on `device`. @return OI_ERR_NO_DEVICE for an ordinal that
 * does not exist, OI_ERR_OUT_OF_MEMORY. */
OI_API oi_status oi_device_buffer_alloc(int device, uint64_t bytes, oi_device_buffer **out);
/* Base address (a device pointer on cuda). NULL for a NULL buffer. */
OI_API void *oi_device_buffer_ptr(const oi_device_buffer *b);
/* Copies `bytes` between host memory and the buffer (either direction, or
 * within it; synchronous). */
OI_API oi_status oi_device_buffer_copy(oi_device_buffer *b, void *dst, const void *src,
                                       uint64_t bytes);
/* Frees the buffer. Accepts NULL. */
OI_API void oi_device_buffer_free(oi_device_buffer *b);

/* ------------------------------------------------------------------------ */
/* The cluster tier (docs/cluster.md)                                        */
/* ------------------------------------------------------------------------ */

/* A host joins a cluster of nodes: every block it seals is published in a
 * Redis directory (namespace + hash + layout -> this node) and withdrawn
 * when evicted; a query whose prefix runs past the pool and the disk asks
 * the directory for the rest in one round trip and fetches what other
 * nodes hold into pool slots (pending, OI_QUERY_LOADING, as a disk
 * promotion), checking each block's checksum before it seals. Nodes
 * authenticate each other with a shared secret; a node exposes only its
 * pool. Without Redis a node serves its own blocks (local-only) and
 * reconnects in the background. */
typedef struct oi_host_cluster_options {
  uint32_t struct_size;
  uint32_t timeout_ms;         /* a remote fetch (connect, lease, read): 0 = 2000 */
  const char *redis_url;       /* redis://HOST:PORT[/DB], unix:/PATH or a Redis Cluster,
                                  redis+cluster://HOST:PORT[,HOST:PORT...] (required) */
  const char *node_id;         /* this node, unique in the cluster: [A-Za-z0-9._-]{1,64} */
  const char *listen_addr;     /* "IP:PORT" for peers (IPv4; port 0: a free one) */
  const char *advertise_addr;  /* "IP:PORT" peers dial (NULL: listen_addr's IP, bound port) */
  const char *secret_file;     /* the cluster's shared secret, 16..1024 bytes; owned by this
                                  user, not readable by group or others */
  const char *cluster_name;    /* [A-Za-z0-9._-]{1,32}: directory keys start "oi:<name>:"
                                  (NULL: "oi:"); clusters sharing a Redis need different ones */
  const char *redis_auth_file; /* Redis AUTH: a file (owned by this user, mode 0600) of lines
                                  user=NAME (optional) and password=SECRET; NULL: the
                                  environment's OI_REDIS_USER and OI_REDIS_PASSWORD, if set */
  /* ---- appended: TLS to Redis, for a rediss:// or rediss+cluster:// url
   * (files given with another url are refused) ---- */
  const char *redis_tls_ca_file;   /* PEM: the CA that signs Redis's certificate (NULL: the
                                      system's trusted CAs); the certificate must name the
                                      host or IP the node dials */
  const char *redis_tls_cert_file; /* PEM: this node's certificate, for a Redis that asks
                                      clients for one (tls-auth-clients); with its key */
  const char *redis_tls_key_file;  /* PEM: its key (owned by this user, mode 0600) */
} oi_host_cluster_options;

typedef struct oi_host_cluster_stats {
  uint32_t struct_size;
  uint32_t directory_connected; /* Redis answers now */
  uint64_t published;           /* directory entries written (sealed blocks) */
  uint64_t unpublished;         /* entries withdrawn (evictions) */
  uint64_t lookups;             /* directory lookups (queries past the pool and disk) */
  uint64_t remote_blocks;       /* blocks fetched from peers, verified, sealed here */
  uint64_t remote_failed;       /* fetches that failed (peer gone, refused, timeout, checksum) */
  uint64_t stale_removed;       /* directory entries a holder no longer had: removed */
  uint64_t served_blocks;       /* blocks leased to peers */
  uint64_t peers_refused;       /* peers that failed authentication */
  uint64_t bytes_fetched;
  uint64_t bytes_served;
  uint16_t port; /* the peer listener's port */
  uint16_t reserved[3];
  /* ---- appended (operators: docs/cluster.md, "Figures"); an older caller's
   * struct_size stops before these ---- */
  uint64_t fetches;             /* fetch operations (a LEASE and its reads, one holder each) */
  uint64_t fetch_ns;            /* time with a fetch in flight: bytes_fetched / fetch_ns, GB/s */
  uint32_t holders_up;          /* holders this node has a connection to now */
  uint32_t holders_down;        /* holders down now: they did not answer, probed until they do */
  uint64_t holders_marked_down; /* times a holder went down */
  uint64_t directory_errors;    /* failed connects, round trips and replies to Redis */
  uint64_t directory_dropped;   /* publishes and withdrawals lost (queue full, connection lost) */
  uint64_t directory_rejected;  /* directory values not believed (malformed, failed MAC, expired) */
  uint64_t handshakes_failed;   /* connections to peers that did not authenticate */
} oi_host_cluster_stats;

OI_API oi_status oi_host_cluster_options_init(oi_host_cluster_options *o);
/* Checks every option as oi_host_attach_cluster would, before there
 * is a host: the required ones given (listen_addr included: the IP:PORT
 * other nodes reach this one at), the node id, the directory URL, the
 * listen and advertise addresses (a loopback address is advertised only by
 * a node that listens on one; 0.0.0.0 needs advertise_addr) and the secret
 * file (its owner, mode and length). Connects to nothing. A sidecar server
 * calls it before pinning its pool.
 * @return OI_ERR_INVALID_ARGUMENT, OI_ERR_NOT_FOUND or OI_ERR_PERMISSION,
 *         with oi_last_error() naming the option. */
OI_API oi_status oi_host_cluster_options_check(const oi_host_cluster_options *o);
/* One per host; after oi_host_create. Namespaces match across
 * nodes by name and layout. UCX is loaded here (dlopen of libucp.so.0), not
 * when the library loads: OI_ERR_UNSUPPORTED, with oi_last_error() naming
 * the library and the loader's message, when it cannot be. */
OI_API oi_status oi_host_attach_cluster(oi_host *h, const oi_host_cluster_options *o);
OI_API oi_status oi_host_get_cluster_stats(const oi_host *h, oi_host_cluster_stats *out);
/* The same for a sidecar server's host (`openinfer serve --cluster`):
 * after oi_server_create, before oi_server_run. */
struct oi_server;
OI_API oi_status oi_server_attach_cluster(struct oi_server *s, const oi_host_cluster_options *o);
/* A running server's cluster figures (client side), as
 * oi_host_get_cluster_stats reports them there, over a connection of
 * its own as oi_server_fetch_stats (same socket_path and timeout_ms).
 * @return OI_ERR_NOT_FOUND when nothing listens at the path or the server
 * has no cluster tier (oi_last_error() says which), and the errors of
 * oi_server_fetch_stats. */
OI_API oi_status oi_server_fetch_cluster_stats(const char *socket_path, uint32_t timeout_ms,
                                               oi_host_cluster_stats *out);

#ifdef __cplusplus
}
#endif

#endif /* OI_EXPERIMENTAL */
#endif /* OPENINFER_EXPERIMENTAL_H */
