/*
 * libopeninfer — the offload engine: one per rank (GPU), registered with a
 * host (embedded). Saves sealed KV blocks from the rank's arenas into the
 * host tier, queries prefixes, loads leased blocks back.
 *
 * Thread-safety: every function may be called from any thread.
 */
#ifndef OPENINFER_ENGINE_H
#define OPENINFER_ENGINE_H

#include "openinfer/common.h"
#include "openinfer/device.h"
#include "openinfer/host.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct oi_engine oi_engine;

/* oi_engine_options.copy_mode (docs/api.md: how AUTO chooses) */
typedef enum oi_copy_mode {
  OI_COPY_AUTO = 0,
  OI_COPY_KERNEL = 1, /* a batch copy kernel reads/writes mapped host memory */
  OI_COPY_DMA = 2,    /* the copy engines, piece by piece (cudaMemcpyBatchAsync) */
  OI_COPY_STAGED = 3, /* the copy engines move whole host blocks to/from device staging
                         slots; a short device-side kernel gathers/scatters the pieces
                         (32 MiB of device memory per stream) */
} oi_copy_mode;

typedef struct oi_engine_options {
  uint32_t struct_size; /* oi_engine_options_init sets it (and every default below) */

  /* ---- every mode: embedded (oi_engine_create) and sidecar
   * (oi_engine_connect) ---- */
  int32_t device;            /* -1 (default): cpu; else the CUDA device of the arenas */
  const char *namespace_id;  /* content domain; required, at most 255 bytes */
  const char *instance_name; /* for logs; optional (default NULL) */
  uint32_t world_size;       /* lease consumers (loads of one lease); default 1 */
  /* The layout: num_arenas descriptors (default 0 and NULL; copied at create). */
  uint32_t num_arenas;
  const oi_arena_desc *arenas;
  /* Optional (default NULL, 0): where each arena's segments start, so a
   * segment may be a separate region (vLLM's [2, num_blocks, ...] layer: the
   * K half, then the V half). NULL: segment s at s * segment_stride (the
   * descriptor's rule). Otherwise num_segment_offsets entries, arena by arena
   * in the layout's order, each arena contributing `segments` entries: block
   * b, segment s of arena i lives at (arena i's base or offset) +
   * segment_offsets[k_i + s] + b * block_stride, where k_i is the sum of the
   * segments of the arenas before i. Then segment_stride is ignored and
   * block_stride need only be >= bytes_per_block; no two slices of any arenas
   * may overlap (docs/api.md "Layouts"). Copied at create. */
  const uint64_t *segment_offsets;
  uint32_t num_segment_offsets; /* must equal the sum of every arena's segments */
  /* Where the arenas are (default NULL, 0). Embedded: optional, arenas given
   * by offset into [arena_base, arena_base + arena_size) instead of by base.
   * Sidecar: NULL, the server allocates the arena (server-allocated memory);
   * set, the engine's own memory (below). arena_size 0: the largest end of
   * any arena. */
  void *arena_base;
  uint64_t arena_size;
  uint32_t save_deadline_ms; /* default 120000 */
  uint32_t load_deadline_ms; /* default 120000 */
  uint32_t copy_mode;        /* oi_copy_mode; default AUTO (the sidecar resolves AUTO to DMA) */
  uint32_t copy_cta_limit;   /* kernel copies: max CTAs; 0 (default) = backend default */

  /* ---- embedded only: copy tuning (a sidecar engine's copies run in the
   * server with its defaults; the fields are checked all the same) ---- */
  uint64_t submit_group_bytes; /* copies are queued in groups of about this many bytes;
                                  0 (default) = the copy mode's default (8 MiB DMA, 32 MiB
                                  others); otherwise at least 64 KiB; UINT64_MAX = one group
                                  per call */
  uint64_t staging_bytes;      /* OI_COPY_STAGED: device memory of each of the engine's two
                                  streams' staging slots; 0 (default) = 32 MiB; else 4 MiB ..
                                  4 GiB */

  /* ---- sidecar (oi_engine_connect), either memory ---- */
  uint32_t control_deadline_ms; /* register, query, release, stats, unregister; default 30000 */
  uint32_t lookup_deadline_ms;  /* membership queries (OI_QUERY_MEMBERSHIP), the scheduler's
                                   path; default 50; not 0 */
  uint32_t probe_interval_ms;   /* while the server is marked unresponsive, a probe is sent
                                   this often; default 100; not 0 (docs/api.md "The circuit
                                   breaker") */

  /* ---- sidecar with engine-owned memory (arena_base set) ---- */
  /* cpu backend: a memfd (memfd_create with MFD_ALLOW_SEALING, sealed with
   * F_SEAL_SHRINK) whose MAP_SHARED mapping from offset 0 is
   * [arena_base, arena_base + arena_size). Sent to the server over the
   * socket (SCM_RIGHTS); the library keeps its own duplicate, the caller
   * keeps arena_fd. -1 (the default) otherwise: a CUDA device (cudaMalloc
   * memory, exported by IPC handle), server-allocated memory, and every
   * embedded engine (oi_engine_create refuses any other value). */
  int32_t arena_fd;

  /* ---- every mode: the codec of the namespace's blocks (docs/codecs.md) ---- */
  /* NULL or "none" (the default): blocks are stored as they are.
   * "lossless" (bit-exact), "int8", "int8-hadamard" or "fp8" (lossy,
   * opt-in; int8-hadamard rotates each head's values before int8's
   * quantization: the same size, a third of int8's KL): the pool and
   * every tier under it hold each block as one frame of that codec (its own
   * checksums, verified before it is decoded) in a slot of
   * codec_slot_bytes; saves encode, loads decode. The codec is part of the
   * namespace's identity: an engine of another codec, shape or slot in a
   * namespace already bound is refused, and the disk and cluster tiers
   * never serve a block of one to the other. A layerwise save gathers a
   * block's arenas in a bounce of the engine's own (at most 1/16 of the
   * pool, at least 4 MiB: a block past it is dropped, a failed save) and
   * encodes it into its slot once every arena landed; a load with
   * OI_LOAD_ARENA_EVENTS reports each arena as it lands once the frames
   * are decoded (docs/codecs.md). */
  const char *codec;
  /* The lossy codecs: the shape of a host block's bf16 elements,
   * [parts][tokens][heads][head_dim] with parts = block_bytes / (tokens *
   * heads * head_dim * 2): the groups the scales cover (one per token and
   * head for int8 and int8-hadamard, one per part and head for fp8).
   * Required by them; must be 0 for none and lossless. */
  uint32_t codec_tokens;
  uint32_t codec_heads;
  uint32_t codec_head_dim;
  /* lossless: the bytes of a frame's slot; 0 (default) = 74 % of the block
   * (rounded down to 256 bytes), which real bf16 KV fits (docs/codecs.md: its
   * worst page is 71 %). A block whose frame does not fit is not saved
   * (its save fails: it is recomputed, never stored wrong). At most the
   * block's bytes plus the frame's header. The lossy codecs' frames have
   * one size: 0 or exactly that size. */
  uint64_t codec_slot_bytes;
} oi_engine_options;

/* Completion callback of a save: the caller's signal that the device blocks
 * it named may be reused (their bytes were copied, or the save was dropped). */
typedef void (*oi_save_done_fn)(void *ctx, oi_status st);

/* What one save call did with its blocks, filled before save returns
 * (oi_save_options.result). accepted + deduplicated + dropped == n. */
typedef struct oi_save_result {
  uint32_t struct_size; /* set by the caller: sizeof(oi_save_result) */
  uint32_t reserved;
  uint64_t accepted;     /* blocks being copied into the tier (the ticket reports their end) */
  uint64_t deduplicated; /* blocks the namespace already held (sealed or in flight) */
  uint64_t dropped;      /* blocks that got no memory (the pool is full of pinned blocks) */
} oi_save_result;

typedef struct oi_save_options {
  uint32_t struct_size;
  uint32_t flags;
  /* Which arenas of each block this call copies. arena_count 0 (default):
   * whole blocks. Otherwise only arenas [arena_first, arena_first +
   * arena_count) (a layer's arenas, as soon as that layer is written, with
   * its own wait_event and ticket); the block's host copy seals when every
   * arena of the layout arrived and landed, and a failed arena aborts the
   * whole block (nothing partial is ever served). Sidecar engines need a
   * server with the layerwise capability (else OI_ERR_UNSUPPORTED).
   * docs/api.md. */
  uint32_t arena_first;
  uint32_t arena_count;
  void *wait_event;        /* cudaEvent_t recorded after the KV was written; NULL: none */
  oi_save_done_fn on_done; /* optional */
  void *on_done_ctx;
  oi_save_result *result; /* optional out: this call's counts, filled before save returns
                             (sidecar: one round trip to the server, within
                             control_deadline_ms); a layerwise save counts the
                             blocks it decided (the first layer naming a hash),
                             later layers of the same blocks count 0 */
} oi_save_options;

typedef struct oi_load_options {
  uint32_t struct_size;
  uint32_t flags; /* OI_LOAD_* */
} oi_load_options;

/* oi_load_options.flags */
enum {
  /* Copy arena by arena, in the layout's order, reporting each arena as its
   * copies land (oi_ticket_arena_wait / oi_ticket_arena_poll; embedded
   * engines, cpu and CUDA) and, on a CUDA device, recording a CUDA event
   * after each arena's copies (oi_ticket_arena_event): a model can start on
   * its first layers while the later ones are still crossing PCIe. Sidecar
   * engines get the same per-arena progress from the server (LoadProgress
   * frames; a server without that capability runs a plain load, and arena
   * waits wait for all of it) but no arena events. Each arena
   * goes to the copy engines as one batch of pieces (a staged copy policy
   * becomes DMA here: staging moves whole host blocks, which span every
   * arena). */
  OI_LOAD_ARENA_EVENTS = 1u << 0,
};

/* oi_query_result.state */
typedef enum oi_query_state {
  OI_QUERY_READY = 0,   /* hit_blocks is final */
  OI_QUERY_LOADING = 1, /* a deeper tier is bringing more; query again with the same req_id */
} oi_query_state;

/* query flags */
enum {
  /* Report each position independently in `present` (no prefix rule, no
   * lease). */
  OI_QUERY_MEMBERSHIP = 1u << 0,
  /* Prefix queries: when blocks right after the sealed prefix are still
   * being saved (pending), wait up to oi_query_result.wait_ms for them to
   * seal and count those that did as hits. Without it, pending blocks are a
   * miss (reported in pending_blocks). Not with OI_QUERY_MEMBERSHIP. */
  OI_QUERY_WAIT_PENDING = 1u << 1,
};

typedef struct oi_query_result {
  uint32_t struct_size;
  uint32_t state; /* out: oi_query_state */
  /* out: the leading run of sealed blocks (membership: count present) */
  uint64_t hit_blocks;
  /* out: blocks right after the hit prefix whose save is in flight, or that
   * sealed behind one in flight (query again: they are about to hit;
   * membership: positions in flight); not leased */
  uint64_t pending_blocks;
  oi_lease lease;   /* out: pins the hit blocks; all-zero when hit_blocks == 0 */
  uint8_t *present; /* in: optional array of n bytes for OI_QUERY_MEMBERSHIP */
  uint32_t wait_ms; /* in: OI_QUERY_WAIT_PENDING's limit; 0 = do not wait */
  uint32_t reserved;
  /* in: optional array of n bytes (read when struct_size covers it). out:
   * where each queried block was found (oi_block_where, host.h): a prefix
   * query names the tier of each block of the hit and pending runs (the
   * pool, or the tier promoting it) and OI_WHERE_NONE past them; a
   * membership query names the pool or the first tier whose membership
   * holds it (the cluster tier answers no membership: its blocks read
   * NONE there). A sidecar engine or lookup reports OI_WHERE_POOL for
   * hits and OI_WHERE_UNKNOWN for pending blocks. */
  uint8_t *where;
} oi_query_result;

typedef struct oi_engine_stats {
  uint32_t struct_size;
  uint32_t instance_id;
  uint64_t block_bytes; /* bytes of one host block of this layout */
  uint64_t num_blocks;
  uint64_t namespace_blocks_resident; /* blocks in flight or sealed in this engine's namespace
                                         (every engine of the namespace shares them) */
  uint64_t saves_submitted;           /* blocks */
  uint64_t saves_completed;
  uint64_t saves_deduplicated;
  uint64_t saves_dropped;
  uint64_t saves_failed;
  uint64_t saves_pending;   /* save operations not yet sealed or dropped */
  uint64_t loads_submitted; /* load operations accepted */
  uint64_t loads_completed; /* operations; sidecar: the caller's view (loads whose ticket
                               completed OI_OK), counted by this process, not the server */
  uint64_t loads_failed;    /* sidecar: the caller's view too: every load it was told failed,
                               refused at submit (degraded, unresponsive) or completed with an
                               error, a fenced late load (OI_ERR_DEADLINE) included */
  uint64_t blocks_loaded;
  uint64_t bytes_saved;
  uint64_t bytes_loaded;
  uint64_t query_hit_blocks;
  uint64_t query_miss_blocks;
  /* The sidecar connection (embedded: 0 and OI_CONNECTION_EMBEDDED). */
  uint64_t server_epoch;       /* the epoch of the server this engine is registered with (0:
                                  embedded, or no server now) */
  uint32_t connection;         /* oi_connection_state */
  uint32_t reconnects;         /* engine-owned sidecar engines: times it registered again with a
                                  server that came back */
  uint64_t disconnected_saves; /* blocks of saves dropped because no server was connected */
  uint64_t disconnected_query_misses; /* blocks reported missing because no server was
                                         connected */
  /* This engine's save and load latencies, as in oi_host_stats (sidecar:
   * measured by the server, from the request's arrival to its completion). */
  uint32_t latency_buckets; /* OI_LATENCY_BUCKETS */
  uint32_t reserved;
  uint64_t save_latency_us[OI_LATENCY_BUCKETS];
  uint64_t save_latency_sum_us;
  uint64_t load_latency_us[OI_LATENCY_BUCKETS];
  uint64_t load_latency_sum_us;
  /* Appended (codec namespaces, docs/codecs.md): blocks of saves not stored
   * because the codec made no frame that fits the namespace's slot (a
   * lossless frame of KV that compresses less than the slot allows, or a
   * block a lossy codec refuses); also counted in saves_failed. */
  uint64_t saves_not_encoded;
} oi_engine_stats;

/* oi_engine_stats.connection */
typedef enum oi_connection_state {
  OI_CONNECTION_EMBEDDED = 0,  /* an embedded engine (oi_engine_create) */
  OI_CONNECTION_CONNECTED = 1, /* a sidecar engine registered with a live server */
  OI_CONNECTION_DEGRADED = 2,  /* engine-owned sidecar engine whose server went away: queries
                                  miss, saves drop, loads fail with OI_ERR_CLOSED; it reconnects
                                  in the background. Also any sidecar engine whose server is
                                  marked unresponsive (the circuit breaker, docs/api.md) until
                                  it answers a probe */
} oi_connection_state;

OI_API oi_status oi_engine_options_init(oi_engine_options *o);
OI_API oi_status oi_save_options_init(oi_save_options *o);
OI_API oi_status oi_load_options_init(oi_load_options *o);

/* Registers a layout with an embedded host. Validates every arena (see
 * docs/api.md "Layouts"). The namespace is bound to its first layout's block
 * shape; a layout with another shape in the same namespace is refused. */
OI_API oi_status oi_engine_create(oi_host *h, const oi_engine_options *o, oi_engine **out);

/* Sidecar mode: connects to the `openinfer serve` server listening on
 * `socket_path` (NULL: $XDG_RUNTIME_DIR/openinfer.sock, or
 * /tmp/openinfer-$UID.sock) and registers the layout. Arenas are given by
 * offset (every arena's base NULL); arena_size 0 means the largest end of
 * any arena. Two modes (docs/server.md):
 *
 * Server-allocated (arena_base NULL): the server allocates the arena
 * (zeroed) on o->device; *arena_out maps it in this process, its size
 * verified (an under-sized allocation is refused with OI_ERR_PROTOCOL). The
 * engine's arenas live at oi_imported_arena_ptr(*arena_out) + offset. If the
 * connection to the server breaks while the engine is live, the fatal
 * handler runs (oi_set_fatal_handler; the default aborts), because the memory
 * the arena maps is gone. There is no reconnect. Teardown order: stop using
 * the arena, oi_imported_arena_close(*arena_out), then
 * oi_engine_destroy(engine). Destroying the engine first is allowed:
 * the engine is then finished (flush, unregister) inside the later
 * oi_imported_arena_close, so the server never frees memory this process
 * still maps.
 *
 * Engine-owned (arena_base set): the arena is the caller's memory,
 * [arena_base, arena_base + arena_size), which the server maps. cuda: device
 * memory from cudaMalloc on o->device (exported with cudaIpcGetMemHandle; it
 * may sit inside a larger allocation); cpu: a sealed memfd given as
 * o->arena_fd. arena_out may be NULL (*arena_out is set to NULL). If the
 * server goes away, the engine degrades instead of aborting: queries miss
 * (OI_OK, 0 hits), saves are dropped (OI_OK; on_done and the ticket complete
 * at once with OI_OK; saves in flight when it died complete with
 * OI_ERR_CLOSED), loads fail with OI_ERR_CLOSED, release reports
 * OI_ERR_LEASE_EXPIRED, flush succeeds; a background thread reconnects when a
 * server listens again on the socket, registers the layout and memory again
 * (a new epoch: oi_engine_stats.server_epoch; old leases are invalid) and
 * logs it. Free the memory only after oi_engine_destroy returns.
 *
 * save's wait_event is not supported (OI_ERR_UNSUPPORTED): synchronize the
 * event before saving. At most 65536 blocks per request. */
OI_API oi_status oi_engine_connect(const char *socket_path, const oi_engine_options *o,
                                   oi_engine **out, oi_imported_arena **arena_out);

/* Flushes saves, releases this instance's leases, unregisters. Accepts NULL. */
OI_API void oi_engine_destroy(oi_engine *e);

/* Saves blocks block_ids[i] under hashes[i], asynchronously. Hashes already
 * sealed or in flight are skipped (deduplicated); blocks that get no memory
 * are dropped and counted. The ticket (optional) and on_done complete when
 * every accepted block is sealed (OI_OK) or failed (its error). on_done runs
 * on the engine's completion thread, or on the calling thread before this
 * returns when nothing needed copying (every block deduplicated or dropped)
 * or the copies could not be queued; it must not block. */
OI_API oi_status oi_engine_save(oi_engine *e, const int64_t *block_ids, const oi_block_hash *hashes,
                                size_t n, const oi_save_options *opt, oi_ticket **ticket_out);

/* Counts the leading run of hashes sealed in this namespace and pins them
 * under a new lease (when the run is not empty). req_id may be NULL. */
OI_API oi_status oi_engine_query(oi_engine *e, const char *req_id, const oi_block_hash *hashes,
                                 size_t n, uint32_t flags, oi_query_result *out);

/* Copies the i-th leased block into dst_block_ids[i] of every arena; n must
 * equal the lease's block count. Consumes one lease share whether the load
 * succeeds or fails. The lease may come from any engine or lookup of this
 * engine's namespace (sidecar: of the same user); another namespace's is
 * OI_ERR_PERMISSION. */
OI_API oi_status oi_engine_load(oi_engine *e, oi_lease lease, const int64_t *dst_block_ids,
                                size_t n, const oi_load_options *opt, oi_ticket **ticket_out);

/* Drops a lease and its pins (any lease of this engine's namespace).
 * @return OI_ERR_LEASE_EXPIRED when the lease is unknown (already released,
 * consumed or expired), OI_ERR_PERMISSION for another namespace's. */
OI_API oi_status oi_engine_release(oi_engine *e, oi_lease lease);

/* Waits until every save submitted before this call is sealed or dropped.
 * @return OI_ERR_TIMEOUT after timeout_ms (UINT32_MAX: forever). */
OI_API oi_status oi_engine_flush(oi_engine *e, uint32_t timeout_ms);

OI_API oi_status oi_engine_get_stats(const oi_engine *e, oi_engine_stats *out);

/* ---- lookups without a layout (a scheduler that holds no KV memory) ---- */

/* A lookup's namespace and lease consumers. */
typedef struct oi_lookup_options {
  uint32_t struct_size;
  /* ---- every mode: embedded (oi_host_query) and sidecar ---- */
  uint32_t world_size;      /* consumers of each lease (loads it takes); default 1 */
  const char *namespace_id; /* required; at most 255 bytes */
  /* ---- sidecar (oi_lookup_connect) ---- */
  const char *client_name;      /* for the server's logs; optional */
  uint32_t control_deadline_ms; /* connect, query, release; default 30000 */
  uint32_t lookup_deadline_ms;  /* each query's deadline; default 50; not 0 */
  uint32_t probe_interval_ms;   /* probe period while unresponsive; default 100; not 0 */
} oi_lookup_options;

OI_API oi_status oi_lookup_options_init(oi_lookup_options *o);

/* Embedded: queries namespace o->namespace_id of `h` as
 * oi_engine_query does, with no engine. A namespace no engine has
 * registered yet holds nothing: every block misses. The lease belongs to no
 * engine: any engine of the namespace may load (o->world_size shares) or
 * release it until it is consumed, released or expires. */
OI_API oi_status oi_host_query(oi_host *h, const oi_lookup_options *o, const char *req_id,
                               const oi_block_hash *hashes, size_t n, uint32_t flags,
                               oi_query_result *out);

/* Embedded: drops a lease of namespace `namespace_id` (as
 * oi_engine_release). */
OI_API oi_status oi_host_release(oi_host *h, const char *namespace_id, oi_lease lease);

/* Sidecar: a connection that only looks up (query, release): it registers
 * no layout and maps no arena, so a dying server is never fatal to it (its
 * calls fail with OI_ERR_CLOSED). Leases it gets may be loaded or released
 * by any engine of the namespace connected with the same user id, and are
 * dropped when the client is destroyed or disconnected. */
typedef struct oi_lookup oi_lookup;

OI_API oi_status oi_lookup_connect(const char *socket_path, const oi_lookup_options *o,
                                   oi_lookup **out);
OI_API oi_status oi_lookup_query(oi_lookup *c, const char *req_id, const oi_block_hash *hashes,
                                 size_t n, uint32_t flags, oi_query_result *out);
OI_API oi_status oi_lookup_release(oi_lookup *c, oi_lease lease);
/* Closes the connection (the server drops the client's leases). Accepts NULL. */
OI_API void oi_lookup_destroy(oi_lookup *c);

#ifdef __cplusplus
}
#endif
#endif
